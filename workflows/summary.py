"""A short, readable summary of one pipeline round: the `round_metrics` mart (sql/marts/round_metrics.sql),
which the rounds table, `didpo compare` and the HTML report read too, plus the manifest's stage timings.

Rollouts lost to sandbox failures (dead-lettered at the retry cap: no trajectory or step rows) stay in the
count: `rollouts` includes them and `pass_rate` counts them as not passing. A policy can make the sandbox fail
on purpose, so leaving them out of the denominator would reward exactly the trajectories that escaped scoring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline import schema
from pipeline.storage import location


@dataclass
class RoundSummary:
    round_dir: str
    tasks: int
    rollouts: int  # rollouts started: the trajectories table plus those lost to sandbox failures
    pass_rate: float  # share of `rollouts` whose hidden tests all pass (a lost rollout did not pass)
    mean_return: float  # mean episode return R_0 of the finished trajectories (a lost one has none)
    steps: int
    steps_by_status: dict[str, int]
    invalid_rate: float  # share of steps with an invalid action
    subdiffs: int
    anchors: int
    mean_anchor_rows: float
    coverage: float  # share of changed-code tokens whose stored advantage has a diff-level term (any estimator)
    mixed_groups: float  # share of task groups whose rollouts' outcomes differ (A^E != 0 somewhere)
    mean_adv_by_outcome: dict[str, float]  # mean token advantage on passing / failing rollouts
    stage_seconds: dict[str, float] = field(default_factory=dict)
    dead_letters: int = 0  # every dead_letter row (rollouts and credit stages)
    lost_to_sandbox: int = 0  # rollouts dead-lettered at the sandbox retry cap (included in `rollouts`)
    no_update: str = ""  # `unchanged_policy_text` when the round's update trained nothing (its manifest says)


def unchanged_policy_text(reason: str, policy: str) -> str:
    """How every command words an update that trained nothing (`training.trainer` decides and says why)."""
    return f"nothing to train: {reason}; policy unchanged ({policy})"


def round_summary(round_dir: str | Path) -> RoundSummary:
    """The round's mart row; a figure with nothing to average (no anchors, no passing rollout) reads 0."""
    from pipeline.sqlrun import round_metrics

    rd = location(round_dir)
    m = round_metrics(rd)
    manifest = schema.read_manifest(rd)
    train = manifest.stages.get("train", {})
    return RoundSummary(
        round_dir=str(rd), tasks=m["tasks"], rollouts=m["rollouts"], pass_rate=m["pass_rate"] or 0.0,
        mean_return=m["mean_return"] or 0.0, steps=m["steps"],
        steps_by_status={s["status"]: s["n"] for s in m["steps_by_status"]}, invalid_rate=m["invalid_rate"] or 0.0,
        subdiffs=m["subdiffs"], anchors=m["anchors"], mean_anchor_rows=m["mean_anchor_rows"] or 0.0,
        coverage=m["coverage"] or 0.0, mixed_groups=m["mixed_groups"] or 0.0,
        mean_adv_by_outcome={"passing": m["mean_adv_passing"] or 0.0, "failing": m["mean_adv_failing"] or 0.0},
        stage_seconds={k: v.get("seconds", 0.0) for k, v in manifest.stages.items()},
        dead_letters=m["dead_letters"], lost_to_sandbox=m["lost_to_sandbox"],
        no_update=unchanged_policy_text(train["nothing_to_train"], train["policy"])
        if train.get("nothing_to_train") else "",
    )


def print_round_summary(round_dir: str | Path, console: Console | None = None) -> RoundSummary:
    s = round_summary(round_dir)
    console = console or Console()
    table = Table(title=f"pipeline round: {s.round_dir}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("tasks x rollouts", f"{s.tasks} tasks, {s.rollouts} rollouts, pass rate {s.pass_rate:.2f} "
                                      "(lost rollouts count as not passing)")
    table.add_row("lost to sandbox failures", f"{s.lost_to_sandbox} of {s.rollouts} rollouts"
                  + (" (see the dead_letter table)" if s.lost_to_sandbox else ""),
                  style="bold red" if s.lost_to_sandbox else None)
    table.add_row("steps by status", ", ".join(f"{k} {v}" for k, v in s.steps_by_status.items()) or "none")
    table.add_row("invalid actions", f"{s.invalid_rate:.2%} of {s.steps} steps")
    table.add_row("credit units", f"{s.subdiffs} sub-diffs, {s.anchors} anchors "
                                  f"(mean {s.mean_anchor_rows:.1f} rows each)")
    table.add_row("coverage", f"{s.coverage:.2%} of changed-code tokens got a diff-level term")
    table.add_row("mixed-outcome groups", f"{s.mixed_groups:.2%} of task groups")
    table.add_row("mean token advantage", ", ".join(f"{k} {v:+.3f}" for k, v in s.mean_adv_by_outcome.items()))
    if s.no_update:
        table.add_row("policy update", s.no_update)
    table.add_row("wall time by stage", ", ".join(f"{k} {v:.1f}s" for k, v in s.stage_seconds.items()))
    if s.dead_letters > s.lost_to_sandbox:
        table.add_row("other dead letters", f"{s.dead_letters - s.lost_to_sandbox} (credit stage; see the "
                                            "dead_letter table)")
    console.print(table)
    return s
