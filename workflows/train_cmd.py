"""`didpo train --round DIR --policy P --out Q`: one round's policy update as a command of its own.

The same function as `didpo round`'s update (`training.trainer.train_round`), with the config's `train`
section: reads the round's tables, writes the next policy and `train_report.json` into Q, resumes from Q's
train state when killed. A round with nothing to train writes nothing: the command says why, and P stays the
policy. DIR, P and Q may be object-store URLs (gs://, s3://; `pipeline.storage`). Data parallel under a launcher, each rank training on its share of every step:

    torchrun --nproc_per_node 8 -m workflows.cli train --round runs/x/round=3 --policy P --out Q
    deepspeed --num_gpus 8 --module workflows.cli train ...           (docs/training.md)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workflows.errors import UserError
from workflows.options import ConfigOpt, SetOpt, load_or_exit


def train_cmd(
    round_dir: Annotated[str, typer.Option("--round", help="round folder with steps and advantages tables")],
    policy: Annotated[str, typer.Option("--policy", help="the policy that sampled the round (updated)")],
    out: Annotated[str, typer.Option("--out", help="folder of the next policy (new, empty, or resumable)")],
    config: Path | None = ConfigOpt,
    overrides: list[str] = SetOpt,
    reference: Annotated[str | None, typer.Option(
        "--reference", help="frozen KL reference (default: --policy; `didpo round` passes the run's starting policy)")] = None,
    max_steps: Annotated[int | None, typer.Option(
        "--max-steps", min=0, help="stop after this many optimizer steps of this call (resumable)")] = None,
    threads: Annotated[int, typer.Option("--threads", min=1, help="torch CPU threads per process")] = 1,
) -> None:
    """Update POLICY on ROUND's advantages into OUT (data parallel under torchrun/deepspeed launchers)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from pipeline.policy.loading import CheckpointError
    from pipeline.schema import SchemaError
    from pipeline.storage import location
    from pipeline.telemetry import configure
    from training.trainer import train_round

    cfg = load_or_exit(config, overrides)
    configure(cfg.logging.level)
    torch.set_num_threads(threads)
    if not location(round_dir).is_dir():
        raise UserError(f"--round {round_dir}: no such round folder")
    try:
        report = train_round(round_dir, policy, out, cfg.train, reference_checkpoint=reference or policy,
                             max_steps=max_steps)
    except (ValueError, FileExistsError, FileNotFoundError, CheckpointError, SchemaError) as e:
        raise UserError(str(e)) from None
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return  # one rank speaks
    if report.nothing_to_train is not None:
        from workflows.summary import unchanged_policy_text

        typer.echo(f"train: {unchanged_policy_text(report.nothing_to_train, policy)}; nothing written to {out}")
        return
    done = "done" if report.completed else f"stopped at step {report.steps_done} (rerun to resume)"
    losses = [s.loss for s in report.steps]
    typer.echo(f"train: {report.steps_done}/{report.total_steps} steps, {done}; rows {report.counts}; "
               + (f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; " if losses else "")
               + f"policy {out}")
