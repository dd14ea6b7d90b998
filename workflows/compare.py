"""`didpo compare`: a policy-learning comparison of credit estimators over seeds, on the demo's rounds.

1. One SFT cold start shared by every arm, so the arms differ only in how credit is assigned.
2. One arm per estimator and seed: `didpo round` with `credit.estimator`, `run.seed` and `train.seed` set,
   under <root>/<compare_id>/<estimator>-seed<s>/. Arms resume like any run (the round manifests), and
   `--jobs N` runs N arms at once in separate processes.
3. The per-round table of every arm (compare.csv / compare.parquet, one line per arm and round), a summary
   per estimator and round (mean and standard deviation over seeds; compare_summary.csv), a figure
   (report/compare.png) and the HTML report of the seed-0 arms with the comparison on top, with the resolved
   config the arms shared (config.yaml) beside the table.
Whatever the numbers show is what is reported: the summary never drops a seed or a round.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from pipeline import schema
from pipeline.config import to_yaml
from pipeline.storage import is_url
from training.config import load_config

# What the comparison reports per round, with its label and format: the three plus context.
METRICS = (
    ("heldout_pass_rate", "held-out pass", "{:.2f}"),
    ("heldout_invalid_rate", "held-out invalid", "{:.2f}"),
    ("invalid_rate", "invalid (rollouts)", "{:.2f}"),
    ("mean_return", "reward (rollouts)", "{:+.3f}"),
    ("rollout_pass_rate", "pass (rollouts)", "{:.2f}"),
    ("coverage", "coverage", "{:.2f}"),
    ("mixed_groups", "mixed groups", "{:.2f}"),
)
PLOTTED = ("heldout_pass_rate", "invalid_rate", "mean_return")


@dataclass(frozen=True)
class ArmSpec:
    estimator: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.estimator}-seed{self.seed}"


def arm_overrides(arm: ArmSpec, compare_dir: Path, start: Path) -> list[str]:
    """Config overrides of one arm: its estimator and seeds, its own run folder, the shared starting policy."""
    return [f"credit.estimator={arm.estimator}", f"run.seed={arm.seed}", f"train.seed={arm.seed}",
            f"run.root={compare_dir}", f"run.run_id={arm.name}", "sft.enabled=false", f"policy.checkpoint={start}"]


def _run_arm(config: str | None, overrides: Sequence[str], rounds: int) -> list[dict]:
    """One arm in its own process (torch threads and Beam state stay per arm)."""
    import torch

    from workflows.rounds import run_rounds

    torch.set_num_threads(1)
    cfg = load_config(config, list(overrides))
    return [r.__dict__ for r in run_rounds(cfg, rounds, Console(quiet=True))]


_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def _run_arm_alone(config: str | None, overrides: Sequence[str], rounds: int) -> list[dict]:
    """`_run_arm` in a spawned process that is its own world of one: a rendezvous port inherited from the
    parent (set there by an earlier update) would be bound by two arms at once."""
    import os

    for name in _RENDEZVOUS:
        os.environ.pop(name, None)
    return _run_arm(config, overrides, rounds)


def arm_pool(jobs: int) -> ProcessPoolExecutor:
    """`jobs` arms at a time, each in a fresh spawned process: a worker reused for a second arm would keep the
    first arm's process group (its world of one) while `_run_arm_alone` drops the rendezvous it was built
    from, and the second arm's update could not start."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), max_tasks_per_child=1)


def run_compare(config: str | None, overrides: Sequence[str], estimators: Sequence[str], seeds: Sequence[int],
                rounds: int, compare_id: str, jobs: int = 1, console: Console | None = None) -> list[dict]:
    """Every arm (estimator x seed) from one shared cold start; returns one dict per arm and round."""
    from pipeline.credit import ESTIMATORS
    from pipeline.run import resolve_policy
    from pipeline.tasks.settings import resolve_tasks
    from workflows.rounds import cold_start, describe_held_out, sft_baseline

    console = console or Console()
    if not estimators or not seeds:
        raise ValueError("compare needs at least one estimator and one seed")
    base = load_config(config, list(overrides))
    unknown = sorted(set(estimators) - set(ESTIMATORS))
    if unknown:
        raise ValueError(f"unknown estimator(s) {unknown}; registered: {', '.join(sorted(ESTIMATORS))}")
    if is_url(base.run.root):  # its arms' processes and its page are written with local paths
        raise ValueError(f"run.root {base.run.root}: compare needs a local folder; run the arms with `didpo round "
                         "--set run.root=<url>` instead")
    compare_dir = Path(base.run.root) / compare_id
    train_tasks, eval_tasks = resolve_tasks(base.tasks)
    policy = resolve_policy(base.policy)
    start = cold_start(base, policy, eval_tasks, compare_dir, console)  # the policy itself when SFT is off
    if base.sft.enabled:  # what every arm starts from, measured as each round is (compare_dir/sft_heldout.json)
        baseline = sft_baseline(base, Path(start), train_tasks, eval_tasks, compare_dir)
        console.print(f"[bold]SFT start[/]: held-out pass rate {baseline['pass_rate']:.2f} "
                      f"({describe_held_out(eval_tasks[: base.eval.max_tasks])})")
    arms = [ArmSpec(e, s) for e in estimators for s in seeds]
    for arm in arms:  # refuse a bad arm config before any arm spends time
        load_config(config, [*overrides, *arm_overrides(arm, compare_dir, start)])
    console.print(f"[bold]compare[/] {len(arms)} arms ({', '.join(estimators)} x seeds {list(seeds)}), "
                  f"{rounds} round(s) each, {jobs} at a time -> {compare_dir}")
    jobs_args = [(config, [*overrides, *arm_overrides(a, compare_dir, start)], rounds) for a in arms]
    if jobs > 1:
        with arm_pool(jobs) as pool:
            futures = [pool.submit(_run_arm_alone, *a) for a in jobs_args]
            try:
                results = [f.result() for f in futures]
            except BaseException:  # fail fast: arms not yet started never start (a rerun resumes the rest)
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    else:
        results = []
        for arm, args in zip(arms, jobs_args, strict=True):
            console.rule(arm.name)
            results.append(_run_arm(*args))
    rows = [{"arm": arm.name, "seed": arm.seed, **r} for arm, arm_rows in zip(arms, results, strict=True)
            for r in arm_rows]
    write_compare(rows, compare_dir, base)
    print_summary(summarize(rows), console)
    return rows


def summarize(rows: Sequence[dict]) -> list[dict]:
    """Mean and standard deviation over seeds of every metric, per estimator and round (NaN-free means:
    a metric that is NaN in a seed, e.g. a round without update steps, is averaged over the others)."""
    out = []
    keys = sorted({(r["estimator"], r["round"]) for r in rows})
    for est, k in keys:
        group = [r for r in rows if r["estimator"] == est and r["round"] == k]
        line = {"estimator": est, "round": k, "seeds": len(group)}
        for name, _, _ in METRICS:
            values = [float(r[name]) for r in group if r[name] == r[name]]
            line[f"{name}_mean"] = statistics.fmean(values) if values else float("nan")
            line[f"{name}_sd"] = statistics.stdev(values) if len(values) > 1 else float("nan")
        out.append(line)
    return out


CONFIG = "config.yaml"  # the comparison's resolved config, written with its table


def write_compare(rows: Sequence[dict], compare_dir: Path, cfg: BaseModel) -> None:
    """compare.parquet / compare.csv (one line per arm and round), compare_summary.csv / .json, and config.yaml:
    the resolved config the arms shared (before each arm's estimator and seed), so that the table is read
    later (`benchmarks/learning.py --report`) with the settings that made it, not with today's defaults."""
    if not rows:
        return
    text = to_yaml(cfg)
    schema.atomic_write(compare_dir / CONFIG, lambda tmp: Path(tmp).write_text(text))
    table = pa.Table.from_pylist(list(rows))
    schema.atomic_write(compare_dir / "compare.parquet", lambda tmp: pq.write_table(table, tmp))
    schema.atomic_write(compare_dir / "compare.csv", lambda tmp: pacsv.write_csv(table, tmp))
    summary = summarize(rows)
    schema.atomic_write(compare_dir / "compare_summary.csv",
                        lambda tmp: pacsv.write_csv(pa.Table.from_pylist(summary), tmp))
    text = json.dumps(summary, indent=2) + "\n"
    schema.atomic_write(compare_dir / "compare_summary.json", lambda tmp: Path(tmp).write_text(text))


def comparison_png(rows: Sequence[dict]) -> bytes:
    """Held-out pass rate, invalid-action rate and mean reward per round: one colour per estimator, a thin
    line per seed and a thick line for the mean over seeds."""
    from workflows.report import _png, _subplots

    fig, axes = _subplots(len(PLOTTED))
    labels = dict((m, label) for m, label, _ in METRICS)
    estimators = sorted({r["estimator"] for r in rows})
    summary = summarize(rows)
    for ax, metric in zip(axes[0], PLOTTED, strict=True):
        for i, est in enumerate(estimators):
            color = f"C{i}"
            for arm in sorted({r["arm"] for r in rows if r["estimator"] == est}):
                pts = sorted((r["round"], r[metric]) for r in rows if r["arm"] == arm)
                ax.plot(*zip(*pts, strict=True), "-", color=color, alpha=0.3, linewidth=0.8)
            mean = sorted((s["round"], s[f"{metric}_mean"]) for s in summary if s["estimator"] == est)
            ax.plot(*zip(*mean, strict=True), "o-", color=color, linewidth=2, label=est)
        ax.set(title=labels[metric], xlabel="round")
        if metric.endswith("pass_rate"):  # a rate: keep 0 visible even when every value is 0
            top = max([r[metric] for r in rows if r[metric] == r[metric]] + [0.0])
            ax.set_ylim(-0.02, max(0.2, top + 0.05))
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
    return _png(fig)


def _cell(line: dict, metric: str, fmt: str) -> str:
    """'mean ± sd' of one summary line ('-' when no seed had a value; no ± with a single seed)."""
    mean, sd = line[f"{metric}_mean"], line[f"{metric}_sd"]
    return "-" if mean != mean else fmt.format(mean) + ("" if sd != sd else " ± " + fmt.replace("+", "").format(sd))


def print_summary(summary: Sequence[dict], console: Console) -> None:
    """One table per round, one column per estimator: readable at 80 columns."""
    for k in sorted({s["round"] for s in summary}):
        lines = [s for s in summary if s["round"] == k]
        seeds = "/".join(str(n) for n in sorted({s["seeds"] for s in lines}))
        table = Table(title=f"round {k}: mean ± sd over {seeds} seeds")
        table.add_column("metric")
        for s in lines:
            table.add_column(s["estimator"], justify="right")
        for name, label, fmt in METRICS:
            table.add_row(label, *(_cell(s, name, fmt) for s in lines))
        console.print(table)


def summary_html(summary: Sequence[dict]) -> str:
    """The summary as an HTML table: one column per estimator and round, mean ± sd over seeds."""
    import html

    head = "".join(f"<th>{html.escape(s['estimator'])}<br>round {s['round']}</th>" for s in summary)
    body = []
    for name, label, fmt in METRICS:
        cells = [_cell(s, name, fmt) for s in summary]
        body.append(f"<tr><td class=l>{html.escape(label)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    seeds = sorted({s["seeds"] for s in summary})
    return ("<h2>Estimator comparison</h2><p>Mean ± standard deviation over seeds "
            f"({'/'.join(map(str, seeds))} per estimator and round), every arm from the same SFT start. Round k's "
            "rollout metrics are policy k's; held-out metrics are policy k+1's, after the round's update. "
            "Per-arm rows: compare.csv.</p>"
            f"<table><tr><th class=l>metric</th>{head}</tr>{''.join(body)}</table>")


def write_report(rows: Sequence[dict], compare_dir: Path) -> Path:
    """<compare_dir>/report/index.html: the comparison, then the usual report of each estimator's first seed."""
    from workflows.report import Figure, build_report

    first = {}
    for r in rows:
        first.setdefault(r["estimator"], compare_dir / r["arm"])
    figure = Figure("compare", "Estimator comparison over seeds",
                    "Per round: held-out pass rate of the updated policy, invalid-action rate and mean reward of the "
                    "round's rollouts. Thin lines: one seed; thick: the mean over seeds.", comparison_png(rows))
    report = build_report(list(first.values()), compare_dir / "report", explore_count=3,
                          preface=summary_html(summarize(rows)), extra_figures=[figure])
    return report.page
