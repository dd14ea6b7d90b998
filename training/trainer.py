"""Offline policy update of one round, on OpenRLHF's Actor and PolicyLoss and a DeepSpeed engine.

1. Rows: join the round's `advantages` to its `steps`, drop rows without signal, bucket by length
   (training/data.py). The micro-batch plan of every epoch is fixed by the seed. No row left (every
   advantage zero, or every row filtered out): nothing to train; the report says why and no checkpoint is
   written (the caller keeps the starting policy).
2. Old log-probs: recomputed once with the starting policy (or the table's behaviour log-probs);
   reference log-probs for the k3 KL: once, with the frozen reference (default: the starting policy).
3. Engine: the policy wrapped in `openrlhf.models.Actor`, AdamW with linear warmup then cosine/constant LR,
   gradient clipping, `deepspeed.initialize` (ZeRO-0 with gloo on CPU, the configured stage on GPU).
4. Step (the one loop of training/loop.py, shared with SFT, with this loss plugged in): for each of
   `micro_batches_per_step` micro-batches,
       loss = PolicyLoss(logp, old_logp, A) + kl_coef * k3(logp, ref_logp) - entropy_coef * H(pi)
   backward, then one optimizer step; metrics: loss, clip fraction, approx KL, entropy, grad norm, tokens/s.
5. State (training/loop.py's protocol, as SFT's: a DeepSpeed checkpoint of weights, optimizer, LR schedule
   + step, plan id, cursor and RNG under `train_state`) every `save_every` steps and at the end; a killed
   update resumes at the same batch. At the end: a plain HF checkpoint (save_pretrained + the starting
   policy's tokenizer files) and `train_report.json`, written last and atomically (it marks completion),
   after which the train state is removed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from pipeline import storage
from training.data import Batch, BatchPlan, Cursor, DataCounts, RoundData, load_round
from training.loop import (  # noqa: F401  (lr_factor, step_shard: re-exported, they were defined here)
    STATE_DIR,
    DeepSpeedOptimization,
    DeepSpeedState,
    Run,
    check_out_dir,
    lr_factor,
    lr_scheduler,
    rank_and_world,
    run_steps,
    step_shard,
    stored_report,
    write_report,
)
from training.settings import TrainSettings

REPORT_NAME = "train_report.json"
_TOKENIZER_PREFIXES = ("tokenizer", "vocab", "merges", "special_tokens", "added_tokens", "chat_template")


# ---- pure math ---------------------------------------------------------------------------------------------


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution, (..., V) logits -> (...) nats.

    H = logsumexp(z) - sum softmax(z) * z. (OpenRLHF's `compute_entropy` is the same formula under
    `torch.compile`, which costs about a minute of Inductor compilation per new shape on CPU.)
    """
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)



# ---- report ------------------------------------------------------------------------------------------------


@dataclass
class StepMetrics:
    step: int  # optimizer step, 1-based, counted over the whole update
    epoch: int  # PPO epoch of its micro-batches
    loss: float  # total loss (mean over micro-batches)
    policy_loss: float  # PolicyLoss term
    clip_frac: float  # fraction of loss tokens whose ratio was clipped
    approx_kl: float  # mean(old_logp - logp) over loss tokens (policy drift this update)
    ref_kl: float  # k3 KL to the reference over loss tokens (0 when kl_coef = 0)
    entropy: float  # mean next-token entropy over loss tokens, nats
    grad_norm: float  # global gradient norm before clipping
    lr: float  # learning rate used by this step
    tokens: int  # real tokens (prompt + response) processed
    tokens_per_s: float  # tokens / compute seconds of this step
    data_s: float  # seconds spent building the batches
    compute_s: float  # seconds of forward, backward and optimizer step


@dataclass
class TrainReport:
    out_dir: str  # where the round's policy is: the starting policy's (local) folder when nothing_to_train
    completed: bool  # the whole plan was trained and the HF checkpoint written (or there was nothing to train)
    total_steps: int  # optimizer steps of the full plan
    steps_done: int  # optimizer steps trained so far (over all resumed runs)
    resumed_from_step: int | None  # step this call resumed from, or None
    counts: dict[str, int]  # training.data.DataCounts
    steps: list[StepMetrics] = field(default_factory=list)  # this call's steps
    # seconds: load_s (tables), prepare_s (old/ref log-probs), data_s, compute_s, save_s, total_s
    wall: dict[str, float] = field(default_factory=dict)
    # why the round had no trainable row (`why_nothing_to_train`); None when it trained. Then no checkpoint
    # and no report file are written: the starting policy stays the policy
    nothing_to_train: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainReport:
        raw = json.loads(text)
        raw["steps"] = [StepMetrics(**s) for s in raw["steps"]]
        return cls(**raw)


def why_nothing_to_train(counts: DataCounts) -> str:
    """Why the loader kept no row (the trainer's one test for "nothing to train"), in the loader's figures."""
    c = counts
    if c.advantage_rows == 0:
        return f"the advantages table has no rows ({c.step_rows} steps)"
    rows = f"{c.advantage_rows} rows ({c.task_groups} task group{'s' if c.task_groups != 1 else ''})"
    if c.dropped_zero_advantage == c.advantage_rows:
        return f"all {rows} have zero advantage"
    why = ((c.dropped_zero_advantage, "have zero advantage"),
           (c.dropped_uniform_group,
            f"are in the {c.uniform_groups} task groups with equal rewards (dynamic filtering)"),
           (c.dropped_empty_response, "have an empty response"))
    return f"none of {rows} trains: " + ", ".join(f"{n} {what}" for n, what in why if n)


# ---- environment -------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_distributed() -> torch.device:
    """Initialise a world-size-1 process group when none exists (gloo on CPU, nccl on GPU); the device to use.

    Under a launcher (torchrun, deepspeed, Ray) the environment already names rank and world: we reuse it.
    """
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed picks its accelerator
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        dist.init_process_group(
            "nccl" if cuda else "gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])
        )
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def deepspeed_config(settings: TrainSettings, *, cuda: bool) -> dict[str, Any]:
    """DeepSpeed config: the configured ZeRO stage (`zero_stage` on GPU with bf16 mixed precision,
    `cpu_zero_stage` on CPU, 0 by default).

    Gradient accumulation is driven by the trainer (explicit boundaries), so DeepSpeed sees one micro-batch
    per step and never rescales the loss.
    """
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": settings.grad_clip,
        "zero_optimization": {"stage": settings.zero_stage if cuda else settings.cpu_zero_stage},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if cuda and settings.bf16_on_gpu:
        cfg["bf16"] = {"enabled": True}
    return cfg


@contextlib.contextmanager
def _determinism(enabled: bool, seed: int):
    """Seed torch and (optionally) force deterministic kernels for the duration; restores the global flag."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.manual_seed(seed)
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


# ---- model pieces ------------------------------------------------------------------------------------------


def make_actor(model: torch.nn.Module) -> torch.nn.Module:
    """Wrap a loaded causal LM in OpenRLHF's Actor.

    Actor's constructor sets `packing_samples` only when it loads from a path (and then only in bf16/fp16),
    so for a model instance we set the attributes its forward reads.
    """
    from training.cpu_shims import import_openrlhf_models

    actor = import_openrlhf_models().Actor(model)
    actor.packing_samples = False
    actor.is_vlm = False
    model.config.use_cache = False
    return actor


def make_policy_loss(settings: TrainSettings) -> torch.nn.Module:
    from training.cpu_shims import import_openrlhf_models

    return import_openrlhf_models().PolicyLoss(
        clip_eps_low=settings.clip_low,
        clip_eps_high=settings.clip_high,
        dual_clip=settings.dual_clip,
        token_level_loss=settings.loss_aggregation == "token_mean",
        policy_loss_type=settings.policy_loss,
    )


def batch_loss(
    actor: torch.nn.Module,
    batch: Batch,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    policy_loss: torch.nn.Module,
    settings: TrainSettings,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro-batch (already on the model's device) and its metrics.

    All per-token tensors are (B, T-1) on the next-token grid; only `batch.loss_mask` positions contribute.
    """
    from openrlhf.models.loss import aggregate_loss
    from openrlhf.models.utils import compute_approx_kl

    mask = batch.loss_mask
    token_level = settings.loss_aggregation == "token_mean"
    # Actor returns log-probs of the last action_mask.shape[1] columns: we pass the full grid.
    logp, output = actor(
        batch.input_ids, action_mask=mask, attention_mask=batch.attention_mask, return_output=True
    )
    advantages = batch.advantages * mask  # padding and prompt columns carry no advantage, whatever they hold
    pg_loss, clip_frac, approx_kl, _, _ = policy_loss(logp, old_logprobs, advantages, action_mask=mask)
    loss = pg_loss
    ref_kl = torch.zeros(())
    if ref_logprobs is not None and settings.kl_coef > 0:
        kl = compute_approx_kl(logp, ref_logprobs, kl_estimator="k3")
        ref_kl = aggregate_loss(kl, mask, token_level_loss=token_level)
        loss = loss + settings.kl_coef * ref_kl
    with torch.set_grad_enabled(settings.entropy_coef > 0 and torch.is_grad_enabled()):
        # Only loss positions: a (B, T, V) softmax over prompt and padding would cost as much as a layer.
        token_logits = output["logits"][:, :-1][mask > 0]
        entropy = token_entropy(token_logits).mean() if len(token_logits) else torch.zeros(())
    if settings.entropy_coef > 0:
        loss = loss - settings.entropy_coef * entropy
    metrics = {
        "loss": float(loss.detach()),
        "policy_loss": float(pg_loss.detach()),
        "clip_frac": float(clip_frac),
        "approx_kl": float(approx_kl),
        "ref_kl": float(ref_kl.detach()),
        "entropy": float(entropy.detach()),
    }
    return loss, metrics


@torch.no_grad()
def response_logprobs(
    actor: torch.nn.Module, plan: BatchPlan, device: torch.device
) -> dict[int, torch.Tensor]:
    """Log-probs of every row's response tokens under `actor` (eval mode): row index -> float32 (R,) on CPU.

    Uses the same micro-batches as training, so a first step on unchanged weights sees a ratio of exactly 1.
    Under data parallelism each rank scores every world-th micro-batch and the ranks exchange the results
    (every rank trains on rows of any micro-batch over the epochs).
    """
    rank, world = _rank_and_world()
    was_training = actor.training
    actor.eval()
    out: dict[int, torch.Tensor] = {}
    mine = list(range(rank, plan.batches_per_epoch, world))
    # ZeRO-3 gathers the weights inside every forward, a collective: each rank runs as many forwards as the
    # busiest one (the extra ones on batch 0, their results dropped)
    rounds = -(-plan.batches_per_epoch // world) if _zero3(actor) else len(mine)
    for n in range(rounds):
        k = mine[n] if n < len(mine) else 0
        batch = plan.batch(Cursor(0, k)).to(device)
        logp = actor(batch.input_ids, action_mask=batch.action_mask, attention_mask=batch.attention_mask)
        if n < len(mine):
            for i, values in zip(batch.row_index, batch.gather(logp.float().cpu()), strict=True):
                out[i] = values
    actor.train(was_training)
    if world > 1:
        import torch.distributed as dist

        parts: list[dict[int, torch.Tensor]] = [{} for _ in range(world)]
        dist.all_gather_object(parts, out)
        out = {i: v for part in parts for i, v in part.items()}
    return out


STEP_LOSS_METRICS = ("approx_kl", "clip_frac", "entropy", "loss", "policy_loss", "ref_kl")  # `batch_loss`'s


def _zero3(module: torch.nn.Module) -> bool:
    """Whether `module`'s weights are partitioned by ZeRO-3 (each forward gathers them across ranks)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


_rank_and_world = rank_and_world


def _grid(batch: Batch, per_row: dict[int, torch.Tensor]) -> torch.Tensor:
    return batch.scatter([per_row[i] for i in batch.row_index])


# ---- state -------------------------------------------------------------------------------------------------


def copy_tokenizer(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.is_file() and f.name.startswith(_TOKENIZER_PREFIXES):
            shutil.copy2(f, dst / f.name)


def _plan_id(data: RoundData, settings: TrainSettings) -> str:
    from pipeline.schema import content_id

    return content_id([r.row_id for r in data.rows], settings.model_dump(mode="json"))


# ---- entry -------------------------------------------------------------------------------------------------


def train_round(
    round_dir: str | os.PathLike[str],
    init_checkpoint: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    settings: TrainSettings,
    *,
    reference_checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = True,
    max_steps: int | None = None,
) -> TrainReport:
    """Train one round's policy update from `init_checkpoint` on `round_dir`'s tables into `out_dir`.

    resume=True continues from `out_dir/train_state` when present (and returns the stored report when the
    round is already complete); resume=False refuses a non-empty out_dir. max_steps caps the optimizer steps
    of this call: the state is saved and the report says completed=False until the plan is done.

    Any of the locations may be object-store URLs (`pipeline.storage`): checkpoints are read from a local
    copy; a URL `out_dir` is trained in a local staging folder (where a killed update resumes) and the
    finished policy is uploaded without its train state, the report last.
    """
    init = storage.local_copy(init_checkpoint)
    reference = storage.local_copy(reference_checkpoint) if reference_checkpoint is not None else None
    dest = storage.location(out_dir)
    if isinstance(dest, Path):
        return _train_round(round_dir, init, dest, settings, reference_checkpoint=reference, resume=resume,
                            max_steps=max_steps)
    if (dest / REPORT_NAME).exists():
        if not resume:
            raise FileExistsError(f"{dest} already holds a trained round ({REPORT_NAME}); pass resume=True")
        return TrainReport.from_json((dest / REPORT_NAME).read_text())
    local = storage.work_dir(dest)
    report = _train_round(round_dir, init, local, settings, reference_checkpoint=reference, resume=resume,
                          max_steps=max_steps)
    if report.nothing_to_train is not None:
        return report  # nothing written, nothing to upload
    report = replace(report, out_dir=str(dest))
    rank, world = _rank_and_world()
    if report.completed and rank == 0:
        (local / REPORT_NAME).write_text(report.to_json() + "\n")  # names where the policy is, not the staging
        storage.put_folder(local, dest, exclude=(STATE_DIR,), last=(REPORT_NAME,))
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # no rank returns before the policy is uploaded
    return report


def _train_round(
    round_dir: str | os.PathLike[str],
    init_checkpoint: Path,
    out_dir: Path,
    settings: TrainSettings,
    *,
    reference_checkpoint: Path | None,
    resume: bool,
    max_steps: int | None,
) -> TrainReport:
    import deepspeed

    from pipeline.policy.loading import check_checkpoint, load_policy, load_tokenizer
    from training.cpu_shims import skip_cpu_shm_comm

    t_start = time.perf_counter()
    out = Path(out_dir)
    init = check_checkpoint(init_checkpoint)
    text = stored_report(out, REPORT_NAME)  # the completion protocol of training/loop.py
    if text is not None:
        if not resume:
            raise FileExistsError(
                f"{out} already holds a trained round ({REPORT_NAME}); pass resume=True to reuse it"
            )
        return TrainReport.from_json(text)
    check_out_dir(out, resume=resume)
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"max_steps must be >= 0 or None, got {max_steps}")

    device = ensure_distributed()
    rank, world = _rank_and_world()
    cuda = device.type == "cuda"
    wall = {"load_s": 0.0, "prepare_s": 0.0, "data_s": 0.0, "compute_s": 0.0, "save_s": 0.0}

    t0 = time.perf_counter()
    data = load_round(round_dir, dynamic_filtering=settings.dynamic_filtering)
    if not data.rows:
        # The one decision: no row with a non-zero advantage after the loader's filtering. Every rank reads the
        # same tables, so every rank returns here; nothing is written (no copy of unchanged weights).
        wall["load_s"], wall["total_s"] = time.perf_counter() - t0, time.perf_counter() - t_start
        return TrainReport(out_dir=str(init), completed=True, total_steps=0, steps_done=0, resumed_from_step=None,
                           counts=data.counts.as_dict(), wall=wall,
                           nothing_to_train=why_nothing_to_train(data.counts))
    tokenizer = load_tokenizer(init)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    plan = BatchPlan(data, settings.max_tokens_per_batch, settings.seed, settings.epochs, pad_id)
    gas = settings.micro_batches_per_step
    steps_per_epoch = math.ceil(plan.batches_per_epoch / gas)
    total_steps = steps_per_epoch * settings.epochs
    plan_id = _plan_id(data, settings)
    wall["load_s"] = time.perf_counter() - t0

    with _determinism(settings.deterministic, settings.seed):
        model = load_policy(init, dtype="float32", device=str(device))
        actor = make_actor(model)
        optimizer = torch.optim.AdamW(actor.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
        scheduler = lr_scheduler(optimizer, settings, total_steps)
        if not cuda:
            skip_cpu_shm_comm()  # never used by the update; its JIT build can hang on a killed run's lock
        engine, _, _, _ = deepspeed.initialize(
            model=actor,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=deepspeed_config(settings, cuda=cuda),
        )
        policy_loss = make_policy_loss(settings)

        # Old and reference log-probs come from the starting weights (before any resumed state is loaded),
        # through the engine's module so they share its dtype with the training forward.
        t0 = time.perf_counter()
        start_logprobs = None
        if settings.recompute_old_logprobs or (settings.kl_coef > 0 and reference_checkpoint is None):
            start_logprobs = response_logprobs(engine.module, plan, device)
        if settings.recompute_old_logprobs:
            old = start_logprobs
        else:
            old = {i: torch.from_numpy(r.behavior_logprobs) for i, r in enumerate(data.rows)}
        ref = None
        if settings.kl_coef > 0:
            if reference_checkpoint is None:
                ref = start_logprobs
            else:
                ref_model = load_policy(check_checkpoint(reference_checkpoint), device=str(device))
                if cuda and settings.bf16_on_gpu:
                    ref_model = ref_model.to(torch.bfloat16)
                ref = response_logprobs(make_actor(ref_model), plan, device)
                del ref_model
        wall["prepare_s"] = time.perf_counter() - t0

        def fetch(epoch: int, j: int) -> tuple[Batch, torch.Tensor, torch.Tensor | None]:
            batch = plan.batch(Cursor(epoch, j))
            old_grid = _grid(batch, old).to(device)
            ref_grid = _grid(batch, ref).to(device) if ref is not None else None
            return batch.to(device), old_grid, ref_grid

        def loss_fn(item: tuple[Batch, torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, dict[str, float]]:
            batch, old_grid, ref_grid = item
            return batch_loss(engine, batch, old_grid, ref_grid, policy_loss, settings)

        run = Run(
            label="update",
            total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
            batches_per_epoch=plan.batches_per_epoch,
            micro_batches_per_step=gas,
            fetch=fetch,
            tokens=lambda item: item[0].n_tokens,
            state_dir=out / STATE_DIR,
            plan_id=plan_id,
            save_every=settings.save_every,
            extra_state=lambda at: {"didpo_cursor": _cursor_list(_cursor_of(at, steps_per_epoch, gas))},
            metric_names=STEP_LOSS_METRICS,
            lockstep=engine.zero_optimization_stage() > 0,
        )
        engine.train()
        result = run_steps(run, loss_fn, DeepSpeedOptimization(engine, scheduler, device), DeepSpeedState(engine),
                           resume=resume, max_steps=max_steps)
        step, completed = result.step, result.completed
        metrics = [
            StepMetrics(step=r.step, epoch=r.epoch, grad_norm=r.grad_norm, lr=r.lr, tokens=r.tokens,
                        tokens_per_s=r.tokens / r.compute_s if r.compute_s > 0 else 0.0, data_s=r.data_s,
                        compute_s=r.compute_s, **r.metrics)
            for r in result.records
        ]
        for key, value in result.wall.items():
            wall[key] += value
        t0 = time.perf_counter()
        if completed:
            _save_policy(engine, init, out, rank)
        wall["save_s"] += time.perf_counter() - t0

    wall["total_s"] = time.perf_counter() - t_start
    report = TrainReport(
        out_dir=str(out),
        completed=completed,
        total_steps=total_steps,
        steps_done=step,
        resumed_from_step=result.resumed_from,
        counts=data.counts.as_dict(),
        steps=metrics,
        wall=wall,
    )
    if completed:
        write_report(out, REPORT_NAME, report.to_json() + "\n", rank=rank, world=world)  # last, then state goes
    elif world > 1:
        import torch.distributed as dist

        dist.barrier()  # no rank returns before the train state is in place
    return report


def _save_policy(engine: Any, init: Path, out: Path, rank: int) -> None:
    """The trained weights as a plain HF checkpoint, written once (rank 0). Under ZeRO-3 every rank takes
    part in gathering the whole weights first; under the other stages every rank already holds them."""
    gather = contextlib.nullcontext()
    if _zero3(engine.module):
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)
    with gather:
        if rank == 0:
            engine.module.model.save_pretrained(out)
            copy_tokenizer(init, out)


def _cursor_list(cursor: Cursor) -> list[int]:
    return [cursor.epoch, cursor.batch]


def _cursor_of(step: int, steps_per_epoch: int, gas: int) -> Cursor:
    epoch, k = divmod(step, steps_per_epoch)
    return Cursor(epoch, k * gas)
