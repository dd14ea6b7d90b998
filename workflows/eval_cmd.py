"""`didpo eval`: benchmark pass@k of a policy with multi-turn self-repair episodes (pipeline/evaluation.py).

    didpo eval --policy CKPT --benchmarks humaneval,humanevalplus,mbppplus,humanevalfix --turns 4 --samples 5
    didpo eval --policy CKPT --tasks my_tasks.jsonl        # a task file, one benchmark per source name in it

1. The training pool (config `tasks.train`) is loaded; every benchmark task that poses one of its problems is
   left out (`--on-overlap error` refuses instead) and the rest is checked disjoint from it.
2. Each task gets `--samples` episodes of at most `--turns` turns, through the pipeline's rollout loop and the
   sandbox. One sample: greedy (`eval.temperature`); several: sampled at `policy.temperature` unless
   `--temperature` says otherwise (n identical greedy samples would make pass@k meaningless).
3. pass@1 and pass@k (unbiased, from n samples) per benchmark and subset, invalid-action rate and mean turns:
   printed, and written to <out>/eval_summary.parquet and <out>/eval_tasks.parquet (lost episodes:
   <out>/dead_letter/).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from pipeline.config import PipelineConfig
from pipeline.evaluation import SummaryRow
from pipeline.storage import is_url
from pipeline.tasks import Task
from workflows.errors import Refused, UserError
from workflows.options import ConfigOpt, SetOpt, load_or_exit

DEFAULT_BENCHMARKS = "humaneval,humanevalplus,mbppplus,humanevalfix"


def _fmt(x: float, spec: str) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else format(x, spec)


def render_table(rows: Sequence[SummaryRow], ks: Sequence[int], title: str) -> Table:
    table = Table(title=title)
    for name in ("benchmark", "subset", "tasks", *(f"pass@{k}" for k in ks), "invalid rate", "mean turns",
                 "lost"):
        table.add_column(name, justify="left" if name in ("benchmark", "subset") else "right")
    for r in rows:
        table.add_row(r.benchmark if r.subset == "all" else "", r.subset, str(r.tasks),
                      *(_fmt(r.pass_at[k], ".3f") for k in ks), _fmt(r.invalid_rate, ".2f"),
                      _fmt(r.mean_turns, ".2f"), str(r.lost_episodes))
    return table


def evaluate(cfg: PipelineConfig, policy: Path, benchmarks: Sequence[str] | Mapping[str, Sequence[Task]], *,
             turns: int, samples: int,
             temperature: float, ks: Sequence[int], limit: int | None, on_overlap: str, out: Path,
             console: Console) -> list[SummaryRow]:
    """Run the evaluation and write/print its tables; returns the summary rows."""
    from pipeline.evaluation import (
        agent_runtime,
        run_benchmark_episodes,
        select_benchmark_tasks,
        summarize,
        task_results,
        write_results,
    )

    train = [t for spec in cfg.tasks.train for t in spec.load()]
    selection = select_benchmark_tasks(benchmarks, train, limit=limit, on_overlap=on_overlap)
    for name, n in selection.excluded.items():
        if n:
            console.print(f"{name}: {n} task(s) pose a training problem (tasks.train) and are left out")
    tasks = selection.all_tasks
    console.print(f"evaluating {policy} on {len(tasks)} tasks x {samples} sample(s), <= {turns} turns, "
                  f"temperature {temperature:g}")
    settings = cfg.policy.model_copy(update={"checkpoint": str(policy), "temperature": temperature})
    episode = cfg.episode.model_copy(update={"max_turns": turns,
                                             "min_turns_before_finish": min(cfg.episode.min_turns_before_finish,
                                                                            turns)})
    start = time.perf_counter()
    with agent_runtime(settings, cfg.sandbox) as runtime:
        trajs, steps, dead = run_benchmark_episodes(
            tasks, runtime, episode, samples=samples, seed=cfg.run.seed, gamma=cfg.credit.gamma,
            batch_size=cfg.pipeline.max_batch_size)
    wall = time.perf_counter() - start
    results = task_results(selection.tasks, trajs, steps)
    rows = summarize(results, samples=samples, ks=ks)
    written = write_results(out, rows, results, ks, dead)
    console.print(render_table(rows, ks, f"benchmark evaluation of {policy}"))
    console.print(f"{len(trajs)} episodes, {len(steps)} steps, {len(dead)} lost to the sandbox, "
                  f"{wall:.1f} s; tables: {', '.join(str(p) for p in written.values())}")
    for d in dead:
        console.print(f"lost: {d.key}: {d.reason}")
    return rows


def eval_cmd(
    policy: Path = typer.Option(None, "--policy", help="policy checkpoint directory"),  # noqa: B008
    after_round: int | None = typer.Option(None, "--after-round", min=0, help="instead of --policy: the policy "
                                           "round K left behind (its update, or its own policy when it had "
                                           "nothing to train), as `didpo round` resolves it"),
    benchmarks: str = typer.Option(None, help=f"comma-separated task sources (default: {DEFAULT_BENCHMARKS})"),
    tasks: Path | None = typer.Option(None, "--tasks", help="a task file (docs/tasks.md) to evaluate whole, "
                                      "one benchmark per source name"),
    turns: int | None = typer.Option(None, min=1, help="turns per episode (default: episode.max_turns)"),
    samples: int = typer.Option(1, min=1, help="episodes per task (n of pass@k)"),
    k: str | None = typer.Option(None, help="comma-separated k values (default: 1, 5, 10, 100 up to n)"),
    temperature: float | None = typer.Option(None, min=0.0, help="sampling temperature (default: see above)"),
    limit: int | None = typer.Option(None, min=1, help="first N tasks of each benchmark"),
    on_overlap: str = typer.Option("exclude", help="tasks posing a training problem: exclude | error"),
    out: Path | None = typer.Option(None, help="results folder (default: <run.root>/<run.run_id>/eval)"),
    config: Path | None = ConfigOpt,
    overrides: list[str] = SetOpt,
) -> None:
    """Benchmark pass@1 / pass@k with multi-turn self-repair episodes in the sandbox."""
    from pipeline.evaluation import default_ks, file_benchmarks, parse_benchmarks
    from pipeline.policy.loading import check_checkpoint

    if benchmarks and tasks:
        raise UserError("give --benchmarks or --tasks, not both")
    if (policy is None) == (after_round is None):
        raise UserError("give --policy or --after-round (one of them)")
    cfg = load_or_exit(config, overrides)  # tasks.train stays the config's: the pool the policy trained on
    if after_round is not None:
        from workflows.rounds import round_policy

        try:
            policy = Path(str(round_policy(cfg, after_round + 1) or cfg.policy.checkpoint))
        except ValueError as e:
            raise UserError(str(e)) from None
    try:
        # a task file is evaluated whole, one benchmark per source name it holds
        names = file_benchmarks(tasks) if tasks else parse_benchmarks(benchmarks or DEFAULT_BENCHMARKS)
        ks = sorted({int(x) for x in k.split(",") if x.strip()}) if k else list(default_ks(samples))
    except ValueError as e:
        raise UserError(str(e)) from None
    bad = [x for x in ks if not 1 <= x <= samples]
    if not ks or bad:
        raise UserError(f"--k values must lie in 1..{samples} (--samples), got {k!r}")
    if on_overlap not in ("exclude", "error"):
        raise UserError(f"--on-overlap must be 'exclude' or 'error', got {on_overlap!r}")
    if temperature is None:
        temperature = cfg.eval.temperature if samples == 1 else cfg.policy.temperature
    if samples > 1 and temperature == 0.0:
        raise UserError("several samples at temperature 0 are identical; pass --temperature > 0")
    if out is None and is_url(cfg.run.root):  # the results are written with local paths
        raise UserError(f"run.root {cfg.run.root} is an object-store URL: pass --out with a local folder")
    out = out or Path(cfg.run.root) / cfg.run.run_id / "eval"
    try:
        check_checkpoint(policy)  # before the benchmarks are loaded
        evaluate(cfg, policy, names, turns=turns or cfg.episode.max_turns, samples=samples,
                 temperature=temperature, ks=ks, limit=limit, on_overlap=on_overlap, out=out, console=Console())
    except (ValueError, FileNotFoundError) as e:
        raise Refused(str(e)) from None
