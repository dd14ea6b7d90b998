"""`didpo sft --checkpoint IN --out DIR`: cold-start SFT of a policy on reference-solution demonstrations.

Reads the config's `sft` section (training/sft_settings.py; defaults when the config has none): its
`tasks.train` become demonstrations, its `tasks.eval` are the held-out prompts on which the fine-tuned
policy's valid-action rate is measured with the config's `policy` sampling. Episode settings come from the
config's `episode` section, so demonstrations look exactly like the pipeline's prompts.

    didpo sft --checkpoint runs/models/small --out runs/models/small-sft --set sft.max_steps=40
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from workflows.errors import UserError
from workflows.options import ConfigOpt, SetOpt, TasksOpt, load_or_exit


def sft(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="policy checkpoint to fine-tune")],
    out: Annotated[Path, typer.Option("--out", help="folder of the fine-tuned checkpoint (new or empty)")],
    config: Path | None = ConfigOpt,
    overrides: list[str] = SetOpt,
    tasks: Path | None = TasksOpt,
    threads: Annotated[int, typer.Option("--threads", min=1, help="torch CPU threads")] = 1,
    evaluate: Annotated[bool, typer.Option("--eval/--no-eval", help="measure the valid-action rate")] = True,
) -> None:
    """Fine-tune CHECKPOINT on successful demonstrations into OUT; print the report and valid-action rate."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from pipeline.policy.loading import CheckpointError, check_checkpoint
    from pipeline.telemetry import configure
    from training.sft import run_cold_start

    cfg = load_or_exit(config, overrides, tasks)
    configure(cfg.logging.level)
    torch.set_num_threads(threads)
    try:
        check_checkpoint(checkpoint)  # before the demonstrations are built
        report = run_cold_start(cfg, checkpoint, out, [t for spec in cfg.tasks.eval for t in spec.load()],
                                evaluate=evaluate)
    except (ValueError, FileExistsError, CheckpointError) as e:
        raise UserError(str(e)) from None
    typer.echo(f"sft: {report.n_examples} examples, {report.total_steps} steps in {report.wall['train_s']:.0f}s, "
               f"loss {report.first_loss:.3f} -> {report.final_loss:.3f}; checkpoint {out}")
    if report.evaluation:
        ev = report.evaluation
        typer.echo(f"held-out: {ev['valid']}/{ev['n']} valid actions (rate {ev['valid_rate']:.2f}), "
                   f"{ev['applies']} apply to the workspace; by kind {json.dumps(ev['by_kind'])}")
