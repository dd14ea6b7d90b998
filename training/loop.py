"""The one training loop of SFT (training/sft.py) and the policy update (training/trainer.py).

Both trainers describe their run and hand it here; what differs is passed in:
- the loss: `loss_fn(item) -> (loss, metrics)` of one micro-batch (SFT: token cross-entropy on the response,
  `training.sft.response_token_loss`; update: OpenRLHF's PolicyLoss + k3 KL - entropy bonus,
  `training.trainer.batch_loss`),
- the optimizer: `Optimization`, a plain torch AdamW + LambdaLR (`TorchOptimization`, SFT) or a DeepSpeed
  engine (`DeepSpeedOptimization`, update: ZeRO, data parallel),
- where the resumable state goes: `TorchState` (one torch.save file per tag) or `DeepSpeedState`
  (engine.save_checkpoint), both under `<out>/train_state/<step%06d>` with `latest` written after the tag.

Shared: the LR schedule (`lr_factor`: linear warmup, then cosine or constant), the step loop (`run_steps`:
`micro_batches_per_step` micro-batches per optimizer step, each loss scaled by world / micro-batches of the
step, a rank's share `step_shard`, zero-weighted fillers in lockstep under ZeRO, lr read before the step,
grad norm before clipping, progress bar, per-step metrics reduced over ranks, state every `save_every` steps
and at the end), and the completion protocol:
- a finished run is recognised by its report file in `out`, written last and atomically (`write_report`);
  a rerun returns it (the caller checks it belongs to the same inputs);
- a killed run resumes from `out/train_state`: its latest tag holds the weights, optimizer, LR schedule,
  the step, the plan id (content hash of data and settings: another plan is refused), the torch RNG and the
  metrics of every step so far. The folder is created before the first step, so a run killed before its
  first save restarts from step 0; an `out` that is neither empty nor holds `train_state` is refused;
- once the report is written the state is removed: a finished folder is the checkpoint and its report.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from pipeline.telemetry import progress_bar

STATE_DIR = "train_state"

# ---- schedule ----------------------------------------------------------------------------------------------


def lr_factor(step: int, *, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based): linear warmup, then cosine or constant."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_scheduler(optimizer: torch.optim.Optimizer, settings: Any, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """`lr_factor` over `total` steps as a LambdaLR; `settings` names warmup_steps, schedule, min_lr_ratio."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(
            s, warmup=settings.warmup_steps, total=total, schedule=settings.schedule, min_ratio=settings.min_lr_ratio
        ),
    )


# ---- completion protocol -----------------------------------------------------------------------------------


def rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def stored_report(out: Path, name: str) -> str | None:
    """The text of a finished run's report, or None when `out` holds no finished run."""
    path = out / name
    return path.read_text() if path.is_file() else None


def check_out_dir(out: Path, *, resume: bool = True) -> None:
    """Refuse an `out` that is neither new, nor empty, nor (with resume) the folder of a killed run."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not (resume and (out / STATE_DIR).is_dir()):
        raise FileExistsError(
            f"{out} is not an empty directory and holds no resumable train state ({STATE_DIR}); "
            "choose another out_dir"
        )


def write_report(out: Path, name: str, text: str, *, rank: int = 0, world: int = 1) -> None:
    """Mark the run finished: the report, atomically and last (rank 0), then the train state goes. Every rank
    waits, so none returns before the report is in place."""
    if rank == 0:
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)  # atomic: the report appears whole, after the checkpoint
        shutil.rmtree(out / STATE_DIR, ignore_errors=True)
    _barrier(world)


# ---- state -------------------------------------------------------------------------------------------------


class StateStore(Protocol):
    def save(self, state_dir: Path, tag: str, client: dict[str, Any]) -> None: ...

    def load(self, state_dir: Path, tag: str) -> dict[str, Any]: ...


class TorchState:
    """Weights, optimizer and LR schedule of a plain torch run in `<state_dir>/<tag>/state.pt` (one process)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler

    def save(self, state_dir: Path, tag: str, client: dict[str, Any]) -> None:
        (state_dir / tag).mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(), "client": client}, state_dir / tag / "state.pt")
        tmp = state_dir / ".latest.tmp"
        tmp.write_text(tag)
        os.replace(tmp, state_dir / "latest")  # after the tag, as DeepSpeed does

    def load(self, state_dir: Path, tag: str) -> dict[str, Any]:
        state = torch.load(state_dir / tag / "state.pt", map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        return state["client"]


class DeepSpeedState:
    """A DeepSpeed engine's own checkpoint (every rank writes its part; `latest` after the tag)."""

    def __init__(self, engine: Any):
        self.engine = engine

    def save(self, state_dir: Path, tag: str, client: dict[str, Any]) -> None:
        self.engine.save_checkpoint(str(state_dir), tag=tag, client_state=client)

    def load(self, state_dir: Path, tag: str) -> dict[str, Any]:
        _, client = self.engine.load_checkpoint(str(state_dir), tag=tag)
        return client


def latest_tag(state_dir: Path) -> str | None:
    latest = state_dir / "latest"
    return latest.read_text().strip() if latest.is_file() else None


def save_state(store: StateStore, state_dir: Path, step: int, plan_id: str, history: list[dict[str, Any]],
               extra: dict[str, Any] | None = None) -> None:
    """The state after `step` steps under tag `step%06d`; older tags go once every rank has written its part."""
    tag = f"step{step:06d}"
    client = {"didpo_step": step, "didpo_plan": plan_id, "didpo_rng": torch.get_rng_state(),
              "didpo_history": history, **(extra or {})}
    store.save(state_dir, tag, client)
    rank, world = rank_and_world()
    _barrier(world)  # every rank has written its part of the tag before older tags go
    if rank == 0:
        for old in state_dir.glob("step*"):
            if old.name != tag:
                shutil.rmtree(old, ignore_errors=True)


# ---- optimizers --------------------------------------------------------------------------------------------


class Optimization(Protocol):
    def lr(self) -> float: ...

    def begin(self, boundary: bool) -> None: ...  # before a micro-batch's forward

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float: ...  # the optimizer step at the boundary; the grad norm before clipping

    def sync(self) -> None: ...  # after a micro-batch (device timing)


class TorchOptimization:
    """A plain torch optimizer and LambdaLR on one process: backward accumulates, `step` clips, steps, zeroes."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, grad_clip: float):
        self.model, self.optimizer, self.scheduler, self.grad_clip = model, optimizer, scheduler, grad_clip
        optimizer.zero_grad(set_to_none=True)

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def begin(self, boundary: bool) -> None:
        pass

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        clip = self.grad_clip if self.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def sync(self) -> None:
        pass


class DeepSpeedOptimization:
    """A DeepSpeed engine with explicit accumulation boundaries (it clips and steps the LR schedule itself)."""

    def __init__(self, engine: Any, scheduler: Any, device: torch.device):
        self.engine, self.scheduler, self.device = engine, scheduler, device

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def begin(self, boundary: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(boundary)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> float:
        grad_norm = _whole_grad_norm(self.engine.module)
        self.engine.step()
        if grad_norm != grad_norm:  # ZeRO partitions the grads: the engine measured the norm
            grad_norm = float(self.engine.get_global_grad_norm() or float("nan"))
        return grad_norm

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _whole_grad_norm(module: torch.nn.Module) -> float:
    """Global L2 norm of the accumulated gradients when they are whole on this rank (ZeRO-0); else NaN."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return float("nan")
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


# ---- the loop ----------------------------------------------------------------------------------------------


def step_shard(lo: int, hi: int, rank: int, world: int) -> list[int]:
    """The micro-batches of one optimizer step, [lo, hi), that `rank` of `world` trains on: every world-th,
    so the split depends only on the plan (never on timing), and ranks differ by at most one micro-batch."""
    return list(range(lo + rank, hi, world))


def reduce_step(parts: list[dict[str, float]], tokens: int, t_compute: float, world: int,
                names: Sequence[str]) -> tuple[dict[str, float], int, float]:
    """One step's metrics over every rank's micro-batches: means of each metric, total tokens, the slowest
    rank's compute seconds. With one process the local values."""
    if world == 1:
        return {key: sum(p[key] for p in parts) / len(parts) for key in parts[0]}, tokens, t_compute
    import torch.distributed as dist

    # `names`: the same on every rank, also on one without a micro-batch this step
    sums = torch.tensor([len(parts), tokens, *(sum(p[k] for p in parts) for k in names)], dtype=torch.float64)
    dist.all_reduce(sums)
    slowest = torch.tensor([t_compute], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    count = float(sums[0])
    return ({k: float(v) / count for k, v in zip(names, sums[2:], strict=True)}, int(sums[1]), float(slowest[0]))


@dataclass
class StepRecord:
    """One optimizer step as the loop measured it; `metrics` are loss_fn's, averaged over the step's
    micro-batches (and ranks)."""

    step: int  # 1-based, counted over the whole run (resumed calls included)
    epoch: int
    lr: float  # learning rate used by this step
    grad_norm: float  # global gradient norm before clipping
    tokens: int  # real tokens processed
    data_s: float  # seconds building the micro-batches
    compute_s: float  # seconds of forward, backward and optimizer step
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class LoopResult:
    step: int  # steps done over every call
    resumed_from: int | None  # step this call resumed from, or None
    records: list[StepRecord]  # this call's steps
    history: list[StepRecord]  # every step of the run, those before a kill included (from the state)
    wall: dict[str, float]  # data_s, compute_s, save_s of this call
    total_steps: int  # of the whole plan

    @property
    def completed(self) -> bool:
        return self.step >= self.total_steps


@dataclass(frozen=True)
class Run:
    """What the loop trains: the plan's shape, how to get a micro-batch, and where the state goes."""

    label: str  # progress bar
    total_steps: int  # optimizer steps of the whole plan
    steps_per_epoch: int
    batches_per_epoch: int  # micro-batches of one epoch
    micro_batches_per_step: int
    fetch: Callable[[int, int], Any]  # (epoch, micro-batch index) -> item for loss_fn
    tokens: Callable[[Any], int]  # real tokens of an item
    state_dir: Path
    plan_id: str
    save_every: int = 0  # state every N steps; 0 = at the end only
    extra_state: Callable[[int], dict[str, Any]] | None = None  # more client state after step N
    metric_names: Sequence[str] = ()  # loss_fn's metrics, reduced over ranks under data parallel
    lockstep: bool = False  # every rank runs as many micro-batches per step as the busiest (ZeRO >= 1)


def run_steps(run: Run, loss_fn: Callable[[Any], tuple[torch.Tensor, dict[str, float]]], opt: Optimization,
              store: StateStore, *, resume: bool = True, max_steps: int | None = None,
              on_step: Callable[[StepRecord], None] | None = None) -> LoopResult:
    """Train `run` from its latest state (resume) up to its end or `max_steps` steps of this call, saving the
    state every `run.save_every` steps and at the end; see the module docstring."""
    rank, world = rank_and_world()
    if rank == 0:
        run.state_dir.mkdir(parents=True, exist_ok=True)  # from here on `out` is a resumable run
    _barrier(world)
    step, resumed_from, history = 0, None, []
    tag = latest_tag(run.state_dir) if resume else None
    if tag is not None:
        client = store.load(run.state_dir, tag)
        if client.get("didpo_plan") != run.plan_id:
            raise ValueError(f"{run.state_dir}/{tag}: train state belongs to other data or settings; "
                             "use a fresh out_dir")
        step = resumed_from = int(client["didpo_step"])
        torch.set_rng_state(client["didpo_rng"])
        history = [StepRecord(**r) for r in client.get("didpo_history", [])]

    def save(at: int) -> None:
        extra = run.extra_state(at) if run.extra_state else None
        save_state(store, run.state_dir, at, run.plan_id, [asdict(r) for r in history], extra)

    wall = {"data_s": 0.0, "compute_s": 0.0, "save_s": 0.0}
    records: list[StepRecord] = []
    last_saved = step
    gas = run.micro_batches_per_step
    bar = progress_bar(run.label, run.total_steps, initial=step, unit="step", disable=rank != 0)
    while step < run.total_steps and (max_steps is None or len(records) < max_steps):
        epoch, k = divmod(step, run.steps_per_epoch)
        lo, hi = k * gas, min((k + 1) * gas, run.batches_per_epoch)
        lr = opt.lr()
        t_data = t_compute = 0.0
        tokens = 0
        parts: list[dict[str, float]] = []
        grad_norm = float("nan")
        # Data parallel: this rank's share of the step's micro-batches. The gradients are averaged over ranks,
        # so each loss is scaled by world / (hi - lo): the step's gradient is the mean over all its
        # micro-batches, as in one process. A rank without a micro-batch (a step shorter than the world) still
        # takes part in the reduction with a zero-weighted one. Under ZeRO stages >= 1 a backward (and, at
        # stage 3, a forward) is a collective: every rank runs as many micro-batches as the busiest one.
        mine = step_shard(lo, hi, rank, world)
        turns = -(-(hi - lo) // world) if run.lockstep else max(len(mine), 1)
        for n_mine in range(turns):
            real = n_mine < len(mine)
            j = mine[n_mine] if real else lo
            t0 = time.perf_counter()
            item = run.fetch(epoch, j)
            t1 = time.perf_counter()
            boundary = n_mine == turns - 1
            opt.begin(boundary)
            loss, m = loss_fn(item)
            opt.backward(loss * world / (hi - lo) if real else loss * 0.0)
            if boundary:
                grad_norm = opt.step()
            opt.sync()
            t_data += t1 - t0
            t_compute += time.perf_counter() - t1
            if real:
                tokens += run.tokens(item)
                parts.append(m)
        step += 1
        bar.update(1)
        mean, tokens, t_compute = reduce_step(parts, tokens, t_compute, world, run.metric_names)
        record = StepRecord(step=step, epoch=epoch, lr=lr, grad_norm=grad_norm, tokens=tokens, data_s=t_data,
                            compute_s=t_compute, metrics=mean)
        records.append(record)
        history.append(record)
        if on_step is not None:
            on_step(record)
        wall["data_s"] += t_data
        wall["compute_s"] += t_compute
        if run.save_every and step % run.save_every == 0 and step < run.total_steps:
            t0 = time.perf_counter()
            save(step)
            last_saved = step
            wall["save_s"] += time.perf_counter() - t0
    bar.close()
    t0 = time.perf_counter()
    if step != last_saved or step == run.total_steps:
        save(step)
    wall["save_s"] += time.perf_counter() - t0
    return LoopResult(step=step, resumed_from=resumed_from, records=records, history=history, wall=wall,
                      total_steps=run.total_steps)
