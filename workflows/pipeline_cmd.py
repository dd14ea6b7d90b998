"""`didpo pipeline run`: one policy round of the Beam pipeline (stage 1), resumable."""

from __future__ import annotations

from pathlib import Path

import typer

from workflows.errors import UserError
from workflows.options import ConfigOpt, SetOpt, TasksOpt, load_or_exit

pipeline_app = typer.Typer(no_args_is_help=True, help="Run the Beam pipeline (rollouts -> credit).")


@pipeline_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_cmd(
    ctx: typer.Context,
    config: Path | None = ConfigOpt,
    overrides: list[str] = SetOpt,
    tasks: Path | None = TasksOpt,
    round_k: int = typer.Option(0, "--round", min=0, help="policy round k"),
    checkpoint: str | None = typer.Option(None, help="policy checkpoint, local or an object-store URL (default: "
                                          "policy.checkpoint)"),
    runner: str | None = typer.Option(None, help="Beam runner: FnApiRunner, DirectRunner, dask, DataflowRunner, ..."),
) -> None:
    """Run or resume a round; unknown options (--project=..., --region=...) pass through to Beam."""
    from pipeline.policy.loading import check_checkpoint
    from pipeline.run import resolve_policy, run_round
    from pipeline.storage import local_copy
    from pipeline.tasks.settings import resolve_tasks
    from workflows.summary import print_round_summary

    if runner:
        overrides = [*overrides, f"pipeline.runner={runner}"]
    cfg = load_or_exit(config, overrides, tasks)
    ckpt = check_checkpoint(local_copy(checkpoint)) if checkpoint else resolve_policy(cfg.policy)  # before any worker starts
    try:
        train, _ = resolve_tasks(cfg.tasks)
    except ValueError as e:  # an empty split, an unknown id, an overlap: the config's tasks are the culprit
        raise UserError(str(e)) from None
    result = run_round(cfg, round_k, ckpt, train, beam_args=list(ctx.args))  # a RoundConflict exits 1, one line
    print_round_summary(result.round_dir)
