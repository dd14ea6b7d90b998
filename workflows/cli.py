"""`didpo`: the command line of the whole system.

    didpo config show [--config F] [--set a.b=c]   the resolved config
    didpo schema [task]                            the data contract (the task file format)
    didpo tasks list|show|export|make-repair       task sources and task files
    didpo model init|info                          tiny offline policy checkpoints
    didpo exec / didpo episode                     the sandboxed coding environment
    didpo credit                                   re-run credit assignment on a steps table
    didpo sql                                      DuckDB queries over a run's tables
    didpo pipeline run                             one policy round of the Beam pipeline
    didpo sft                                      cold-start SFT on successful demonstrations
    didpo round                                    policy rounds: pipeline -> update -> evaluation
    didpo compare                                  estimator arms x seeds on the demo's rounds
    didpo eval                                     pass@k on benchmarks, multi-turn, in the sandbox
    didpo report                                   an offline HTML report of a run
    didpo explore                                  an interactive credit-unit explorer page of a run
    didpo online                                   online RL on GPUs (OpenRLHF Ray PPO + vLLM)
    didpo demo                                     the main job on embedded defaults
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from pipeline.config import to_yaml
from workflows.credit_cmd import credit
from workflows.env_cmd import episode_cmd, exec_cmd
from workflows.errors import DidpoGroup, UserError
from workflows.eval_cmd import eval_cmd
from workflows.explore import explore_cmd
from workflows.model_cmd import model_app
from workflows.options import ConfigOpt, SetOpt, TasksOpt, load_or_exit, tasks_overrides
from workflows.pipeline_cmd import pipeline_app
from workflows.report import report_cmd
from workflows.sft_cmd import sft
from workflows.sql_cmd import sql
from workflows.tasks_cmd import tasks_app
from workflows.train_cmd import train_cmd

app = typer.Typer(cls=DidpoGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="DiDPO: diff-level credit assignment for RL on multi-turn coding agents.")
config_app = typer.Typer(no_args_is_help=True, help="Show and check configuration.")
app.add_typer(config_app, name="config")
app.add_typer(tasks_app, name="tasks", help="Task sources: list and show tasks.")
app.add_typer(model_app, name="model", help="Build and inspect offline policy checkpoints.")
app.command("sql")(sql)
app.command("exec")(exec_cmd)
app.command("episode")(episode_cmd)
app.command("credit")(credit)
app.command("sft")(sft)
app.command("train")(train_cmd)
app.command("eval")(eval_cmd)
app.command("report")(report_cmd)
app.command("explore")(explore_cmd)
app.add_typer(pipeline_app, name="pipeline")


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", help="also show third-party warnings and the "
                                       "progress bars of model loading")) -> None:
    from pipeline.telemetry import quiet_third_parties

    if not verbose:
        quiet_third_parties()



@config_app.command("show")
def config_show(config: Path | None = ConfigOpt, overrides: list[str] = SetOpt, tasks: Path | None = TasksOpt) -> None:
    """Print the resolved config (defaults filled in, overrides applied) as YAML."""
    typer.echo(to_yaml(load_or_exit(config, overrides, tasks)), nl=False)


@config_app.command("check")
def config_check(config: Path | None = ConfigOpt, overrides: list[str] = SetOpt) -> None:
    """Validate a config; exit 2 with every offending key if it is wrong."""
    from pipeline.config import config_hash

    cfg = load_or_exit(config, overrides)
    typer.echo(f"ok: config hash {config_hash(cfg)}")


@app.command("schema")
def schema_cmd(table: list[str] = typer.Argument(None, help="tables to show (default: all); `task`: the JSON "
                                                 "Schema of a task file line")) -> None:
    """Print the data contract: every table's columns, types and meaning (or the task file format)."""
    from pipeline import schema

    if table == ["task"]:
        import json

        from pipeline.tasks.taskfile import json_schema

        typer.echo(json.dumps(json_schema(), indent=2))
        return
    try:
        typer.echo(schema.describe(table or schema.TABLES))
    except schema.SchemaError as e:
        raise UserError(str(e)) from None


@app.command("demo")
def demo_cmd(config: Path | None = ConfigOpt, overrides: list[str] = SetOpt) -> None:
    """The main job on embedded defaults: SFT the bundled base policy, run policy rounds, report."""
    from workflows.demo import run_demo

    run_demo(load_or_exit(config, overrides))


@app.command("round")
def round_cmd(config: Path | None = ConfigOpt, overrides: list[str] = SetOpt, tasks: Path | None = TasksOpt,
              rounds: int | None = typer.Option(None, min=1, help="policy rounds (default: run.rounds)")) -> None:
    """Policy rounds: SFT once, then per round the pipeline, the update and a held-out evaluation (resumable)."""
    from pipeline.telemetry import configure
    from workflows.rounds import run_rounds

    cfg = load_or_exit(config, overrides, tasks)
    configure(cfg.logging.level)
    run_rounds(cfg, rounds)


@app.command("compare")
def compare_cmd(config: Path | None = ConfigOpt, overrides: list[str] = SetOpt, tasks: Path | None = TasksOpt,
                estimators: str = typer.Option("didpo,didpo_did,grpo", help="comma-separated estimator arms"),
                seeds: str = typer.Option("0,1,2", help="comma-separated seeds (run.seed and train.seed)"),
                rounds: int | None = typer.Option(None, min=1, help="policy rounds per arm (default: run.rounds)"),
                compare_id: str = typer.Option("compare", "--id", help="folder under run.root for every arm"),
                jobs: int = typer.Option(1, min=1, help="arms run at once, one process each")) -> None:
    """Estimator arms x seeds from one shared SFT start: per-round table, summary over seeds, figure, report."""
    from pipeline.telemetry import configure
    from workflows.compare import run_compare, write_report

    overrides = [*overrides, *tasks_overrides(tasks)]  # the arms' processes get the file as settings
    cfg = load_or_exit(config, overrides)
    configure(cfg.logging.level)
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds {seeds!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if any(s < 0 for s in seed_list):
        raise UserError(f"--seeds {seeds!r}: seeds must be >= 0")
    try:
        est_list = [e.strip() for e in estimators.split(",") if e.strip()]
        rows = run_compare(str(config) if config else None, overrides, est_list, seed_list,
                           rounds or cfg.run.rounds, compare_id, jobs)
    except ValueError as e:
        raise UserError(str(e)) from None
    page = write_report(rows, Path(cfg.run.root) / compare_id)
    typer.echo(f"report: {page}")


@app.command("online")
def online_cmd(config: Path = typer.Option(..., "--config", "-c", help="YAML config with an `online` section"),
               overrides: list[str] = SetOpt,
               ray_address: str | None = typer.Option(None, help="existing Ray cluster (default: a local one)"),
               print_args: bool = typer.Option(False, help="print the OpenRLHF flags and exit")) -> None:
    """Online RL on GPUs: OpenRLHF's Ray PPO trainer + vLLM with the DiDPO estimator (see docs/online.md)."""
    from training.online import main as online_main

    argv = ["--config", str(config), *(a for o in overrides for a in ("--set", o))]
    argv += ["--ray-address", ray_address] if ray_address else []
    online_main(argv + (["--print-args"] if print_args else []))


def main(argv: list[str] | None = None) -> None:
    """The `didpo` console script (argv: the arguments, default sys.argv[1:]); always ends in SystemExit."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    app(args=argv, prog_name="didpo")


if __name__ == "__main__":
    main()
