"""Cold-start SFT: teach a fresh policy to write valid actions before RL.

1. Demonstrations: training/demonstrations.py (every training task's reference solution played as a short
   successful repair episode through the real `Episode`).
2. Training: causal-LM cross-entropy on response tokens only (each response ends with eos so generation
   stops), length-bucketed batches under a token budget (training/data.py), AdamW with warmup then
   cosine/constant LR, gradient clipping, seeded: the one loop of training/loop.py, shared with the policy
   update, with this loss plugged in. Saves a plain HF checkpoint and `sft_report.json` (last, atomically: it
   marks completion); a rerun on a completed out_dir returns the stored report, a killed one resumes from
   `out_dir/train_state` (every `save_every` steps and the end).
3. Check: `evaluate_actions` samples first-turn responses on held-out tasks and reports the share that
   parse as actions (and apply to the workspace).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.agent.episode import Episode
from pipeline.agent.grammar import InvalidAction, apply_action, parse_response
from pipeline.agent.settings import EpisodeSettings
from pipeline.tasks.base import Task
from training.demonstrations import (
    ReplayExecutor,
    SftExample,
    generation_header,
    sft_examples,
    unconditioned_examples,
)
from training.sft_settings import SftSettings

if TYPE_CHECKING:
    from training.config import DidpoConfig

REPORT_NAME = "sft_report.json"


# ---- training ----------------------------------------------------------------------------------------------


@dataclass
class SftStepMetrics:
    step: int  # optimizer step, 1-based
    epoch: int
    loss: float  # mean cross-entropy per response token, nats
    grad_norm: float  # global gradient norm before clipping
    lr: float
    response_tokens: int  # tokens trained on (loss tokens)
    tokens: int  # real tokens processed (prompt + response)
    tokens_per_s: float  # tokens / compute seconds of this step


@dataclass
class SftReport:
    out_dir: str
    checkpoint_in: str
    plan_id: str  # content hash of the examples and settings: a rerun with other inputs is refused
    n_examples: int
    examples_by_kind: dict[str, int]
    response_tokens: int  # loss tokens of one epoch
    total_steps: int
    first_loss: float
    final_loss: float  # mean over the last min(5, steps) steps
    steps: list[SftStepMetrics] = field(default_factory=list)  # every step, those before a kill included
    wall: dict[str, float] = field(default_factory=dict)  # train_s, save_s, total_s (this call)
    settings: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] | None = None  # filled by callers that evaluate (workflows/sft_cmd.py)
    completed: bool = True  # False: stopped by train_sft's max_steps, resumable (no report file written)
    resumed_from_step: int | None = None  # step this call resumed a killed run from, or None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SftReport:
        raw = json.loads(text)
        raw["steps"] = [SftStepMetrics(**s) for s in raw["steps"]]
        return cls(**raw)


def response_token_loss(logits: Any, input_ids: Any, loss_mask: Any) -> tuple[Any, Any]:
    """Summed cross-entropy over response tokens and their count.

    logits (B, T, V); input_ids (B, T); loss_mask (B, T-1) on the next-token grid (column j scores token j+1).
    Returns (sum of -log p over masked positions, number of masked positions), both 0-dim tensors.
    """
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, input_ids[:, 1:, None])[..., 0]
    return (nll * loss_mask).sum(), loss_mask.sum()


def sft_loss(model: Any, compute_dtype: str = "float32") -> Any:
    """The SFT loss plugged into the one loop: `loss_fn(batch) -> (mean response-token NLL, metrics)`.

    `compute_dtype` "bfloat16" runs the forward under autocast (the loss itself is taken in float32)."""
    import torch

    def loss_fn(batch: Any) -> tuple[Any, dict[str, float]]:
        with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16,
                            enabled=compute_dtype == "bfloat16"):
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss_sum, n = response_token_loss(logits, batch.input_ids, batch.loss_mask)
        loss = loss_sum / n
        return loss, {"loss": float(loss.detach()), "response_tokens": float(n)}

    return loss_fn


def _plan_id(examples: Sequence[SftExample], settings: SftSettings, checkpoint: Path) -> str:
    from pipeline.schema import content_id

    # save_every changes when the state is saved and device where, not what is trained: not part of the plan
    return content_id([(e.prompt_ids, e.response_ids) for e in examples],
                      settings.model_dump(mode="json", exclude={"tasks", "save_every", "device"}), checkpoint.name)


def train_sft(checkpoint_in: str | os.PathLike[str], out_dir: str | os.PathLike[str],
              examples: Sequence[SftExample], settings: SftSettings, *, max_steps: int | None = None) -> SftReport:
    """Fine-tune `checkpoint_in` on `examples` into a plain HF checkpoint at `out_dir` (see module docstring).

    The completion protocol of training/loop.py: a completed SFT of the same examples and settings in out_dir
    is returned as stored (another is refused); a killed one resumes from `out_dir/train_state`; any other
    non-empty out_dir is refused. `max_steps` caps the optimizer steps of this call (the state is saved and
    the report says completed=False). The caller sets torch's thread count.
    """
    import numpy as np
    import torch

    from pipeline.policy.loading import check_checkpoint, load_policy
    from pipeline.telemetry import MetricsLog
    from training.data import TrainRow, collate, epoch_plan, pack_by_length
    from training.loop import (
        STATE_DIR,
        Run,
        TorchOptimization,
        TorchState,
        check_out_dir,
        lr_scheduler,
        run_steps,
        stored_report,
        write_report,
    )
    from training.trainer import copy_tokenizer

    t_start = time.perf_counter()
    init = check_checkpoint(checkpoint_in)
    if not examples:
        raise ValueError("no SFT examples: nothing to train on")
    bad = [e.task_id for e in examples if not e.prompt_ids or not e.response_ids]
    if bad:
        raise ValueError(f"SFT examples with an empty prompt or response: {bad[:5]}")
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"max_steps must be >= 0 or None, got {max_steps}")
    if settings.device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"sft device {settings.device!r}: no CUDA device on this machine (use device cpu)")
    out = Path(out_dir)
    plan_id = _plan_id(examples, settings, init)
    text = stored_report(out, REPORT_NAME)
    if text is not None:
        stored = SftReport.from_json(text)
        if stored.plan_id != plan_id:
            raise FileExistsError(f"{out} holds an SFT of other examples or settings (plan {stored.plan_id}); "
                                  "choose another out_dir")
        return stored
    check_out_dir(out)

    rows = [TrainRow(row_id=f"{i:08d}", task_id=e.task_id, traj_id=e.task_id,
                     prompt_ids=np.asarray(e.prompt_ids, dtype=np.int64),
                     response_ids=np.asarray(e.response_ids, dtype=np.int64),
                     advantages=np.ones(len(e.response_ids), np.float32),
                     loss_mask=np.ones(len(e.response_ids), np.float32),
                     behavior_logprobs=np.zeros(len(e.response_ids), np.float32))
            for i, e in enumerate(examples)]
    buckets = pack_by_length([r.length for r in rows], settings.max_tokens_per_batch, [r.row_id for r in rows])
    per_epoch = len(buckets)
    total = per_epoch * settings.epochs
    if settings.max_steps is not None:
        total = min(total, settings.max_steps)
    plans: dict[int, list[list[int]]] = {}

    def fetch(epoch: int, k: int) -> Any:
        if epoch not in plans:
            plans[epoch] = epoch_plan(buckets, settings.seed, epoch)
        idx = plans[epoch][k]
        return collate([rows[i] for i in idx], idx, pad_id=0).to(settings.device)

    (out / STATE_DIR).mkdir(parents=True, exist_ok=True)  # a resumable run from here on (training/loop.py)
    metrics_log = MetricsLog(out)

    def log(r: Any) -> None:
        metrics_log.log("sft", r.step, loss=r.metrics["loss"], grad_norm=r.grad_norm, lr=r.lr,
                        tokens_per_s=r.tokens / r.compute_s if r.compute_s > 0 else 0.0)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        model = load_policy(init, dtype="float32", device=settings.device)
        model.config.use_cache = False
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=settings.adam_betas,
                                      weight_decay=settings.weight_decay)
        scheduler = lr_scheduler(optimizer, settings, total)
        run = Run(label="sft", total_steps=total, steps_per_epoch=per_epoch, batches_per_epoch=per_epoch,
                  micro_batches_per_step=1, fetch=fetch, tokens=lambda b: b.n_tokens, state_dir=out / STATE_DIR,
                  plan_id=plan_id, save_every=settings.save_every, metric_names=("loss", "response_tokens"))
        t_train = time.perf_counter()
        result = run_steps(run, sft_loss(model, settings.compute_dtype), TorchOptimization(model, optimizer, scheduler, settings.grad_clip),
                           TorchState(model, optimizer, scheduler), max_steps=max_steps, on_step=log)
        train_s = time.perf_counter() - t_train - result.wall["save_s"]
    save_s = result.wall["save_s"]
    if result.completed:
        t0 = time.perf_counter()
        model.save_pretrained(out)
        copy_tokenizer(init, out)
        save_s += time.perf_counter() - t0
    steps = [SftStepMetrics(step=r.step, epoch=r.epoch, loss=r.metrics["loss"], grad_norm=r.grad_norm, lr=r.lr,
                            response_tokens=int(r.metrics["response_tokens"]), tokens=r.tokens,
                            tokens_per_s=r.tokens / r.compute_s if r.compute_s > 0 else 0.0)
             for r in result.history]
    tail = steps[-5:]
    report = SftReport(
        out_dir=str(out), checkpoint_in=str(init), plan_id=plan_id, n_examples=len(examples),
        examples_by_kind=dict(sorted(Counter(e.kind for e in examples).items())),
        response_tokens=sum(len(e.response_ids) for e in examples), total_steps=total,
        first_loss=steps[0].loss if steps else float("nan"),
        final_loss=sum(s.loss for s in tail) / len(tail) if tail else float("nan"), steps=steps,
        wall={"train_s": train_s, "save_s": save_s, "total_s": time.perf_counter() - t_start},
        settings=settings.model_dump(mode="json"), completed=result.completed,
        resumed_from_step=result.resumed_from,
    )
    if result.completed:
        write_report(out, REPORT_NAME, report.to_json() + "\n")  # last: marks a complete SFT
    return report


# ---- evaluation --------------------------------------------------------------------------------------------


def evaluate_actions(checkpoint: str | os.PathLike[str], tasks: Sequence[Task], episode_settings: EpisodeSettings,
                     policy_settings: Any, *, seed: int = 0, batch_size: int = 8) -> dict[str, Any]:
    """Sample one first-turn response per held-out task and check it against the grammar.

    Returns {"n", "valid", "valid_rate", "applies", "applies_rate", "truncated", "by_kind": {kind: n},
    "invalid_reasons": {reason: n}, "mean_response_tokens", "seconds", "responses": [text per task]}. `applies` counts valid actions whose
    edits also apply to the workspace (run_tests and finish count as applying).
    """
    import torch

    from pipeline.policy.generation import GenerationRequest, load_generator
    from pipeline.policy.loading import load_tokenizer

    if not tasks:
        raise ValueError("evaluate_actions needs at least one task")
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(checkpoint)
    generator = load_generator(policy_settings.model_copy(update={"checkpoint": str(checkpoint)}),
                               batch_invariant=False)
    requests = []
    for i, task in enumerate(tasks):
        text = Episode(task, ReplayExecutor(), episode_settings, tokenizer).render_prompt(tokenizer)
        requests.append(GenerationRequest(task.task_id, tokenizer(text, add_special_tokens=False)["input_ids"],
                                          seed + i))
    with torch.random.fork_rng(devices=[]):
        results = [r for lo in range(0, len(requests), batch_size)
                   for r in generator.generate(requests[lo:lo + batch_size])]
    kinds: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    applies = truncated = 0
    for task, result in zip(tasks, results, strict=True):
        truncated += result.truncated
        action = parse_response(result.response_text, truncated=result.truncated)
        kinds[action.kind] += 1
        if not action.ok:
            reasons[action.reason] += 1  # type: ignore[union-attr]
            continue
        files = apply_action(action, task.workspace, max_file_bytes=episode_settings.max_file_bytes) \
            if action.kind not in ("run_tests", "finish") else None
        if not isinstance(files, InvalidAction):
            applies += 1
    n = len(tasks)
    valid = n - sum(reasons.values())
    return {
        "n": n, "valid": valid, "valid_rate": valid / n, "applies": applies, "applies_rate": applies / n,
        "truncated": truncated, "by_kind": dict(sorted(kinds.items())), "invalid_reasons": dict(sorted(reasons.items())),
        "mean_response_tokens": sum(len(r.response_token_ids) for r in results) / n,
        "seconds": time.perf_counter() - t0, "responses": [r.response_text for r in results],
    }


def run_cold_start(cfg: DidpoConfig, checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                   evaluation_tasks: Sequence[Task], *, evaluate: bool = True) -> SftReport:
    """The cold start of `didpo sft` and `didpo round`: demonstrations from `cfg.sft.tasks.train`, plus
    `sft.rl_task_episodes` more per task of `cfg.tasks.train` (all refused if they overlap `evaluation_tasks`),
    SFT into `out`, then the valid-action rate on `cfg.sft.tasks.eval`, stored in the report. Idempotent: a
    finished cold start is returned as stored."""
    from pipeline.policy.loading import load_tokenizer
    from pipeline.schema import atomic_write
    from pipeline.tasks import check_disjoint
    from pipeline.tasks.settings import resolve_tasks

    settings: SftSettings = cfg.sft
    train, held_out = resolve_tasks(settings.tasks)
    rl_tasks = resolve_tasks(cfg.tasks)[0] if settings.rl_task_episodes else []
    check_disjoint([*train, *rl_tasks], evaluation_tasks)  # no evaluation problem leaks into the demonstrations
    tokenizer = load_tokenizer(checkpoint)
    examples = sft_examples(train, tokenizer, cfg.episode, seed=settings.seed, mix=settings.mix,
                            finish_rate=settings.finish_rate, episodes_per_task=settings.episodes_per_task)
    if rl_tasks:  # the tasks the rounds train on, again: RL starts from solutions the policy partly knows
        examples += sft_examples(rl_tasks, tokenizer, cfg.episode, seed=settings.seed + 1, mix=settings.mix,
                                 finish_rate=settings.finish_rate, episodes_per_task=settings.rl_task_episodes)
    if settings.unconditioned_copies:
        examples += unconditioned_examples(examples, settings.unconditioned_copies, generation_header(tokenizer))
    report = train_sft(checkpoint, out, examples, settings)
    if evaluate and held_out and report.evaluation is None:
        report.evaluation = evaluate_actions(out, held_out, cfg.episode, cfg.policy, seed=settings.seed)
        text = report.to_json() + "\n"
        atomic_write(Path(out) / REPORT_NAME, lambda tmp: Path(tmp).write_text(text))  # the report stays whole
    return report

