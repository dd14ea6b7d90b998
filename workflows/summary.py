"""A short, readable summary of one pipeline round, computed from its tables.

Rollouts lost to sandbox failures (dead-lettered at the retry cap: no trajectory or step rows) stay in the
count: `rollouts` includes them and `pass_rate` counts them as not passing. A policy can make the sandbox fail
on purpose, so leaving them out of the denominator would reward exactly the trajectories that escaped scoring.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline import schema


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


def rollout_counts(trajs: list[dict], dead: list[dict]) -> tuple[int, int, int]:
    """(passed, started, lost): lost = distinct trajectories dead-lettered by the sandbox; started includes them."""
    lost = len({d["key"] for d in dead if d["stage"] == schema.SANDBOX_LOST})
    return sum(t["outcome"] == 1.0 for t in trajs), len(trajs) + lost, lost


def credit_coverage(round_dir: str | Path, advantages: list[dict]) -> float | None:
    """Share of the response tokens that wrote a change (the sub-diffs' tokens) whose stored advantage has a
    diff-level term (`n_diff_tokens`): what the trainer's credit covered, whichever estimator wrote it (the
    paper's anchors, didpo_did's lines, none for grpo). None when no token wrote a change."""
    from pipeline.sqlrun import run_query

    changed = sum(r["changed_tokens"] for r in run_query(round_dir, "coverage_per_task").to_pylist())
    return sum(a["n_diff_tokens"] for a in advantages) / changed if changed else None


def round_summary(round_dir: str | Path) -> RoundSummary:
    rd = Path(round_dir)

    def read(name: str) -> list[dict]:
        return schema.read_table(schema.table_dir(rd, name), name).to_pylist()

    trajs, steps, anchors, adv = read("trajectories"), read("steps"), read("anchors"), read("advantages")
    dead = read("dead_letter") if schema.table_dir(rd, "dead_letter").is_dir() else []  # none written: no rows
    passed, started, lost = rollout_counts(trajs, dead)
    status: dict[str, int] = {}
    for s in steps:
        status[s["exec_status"]] = status.get(s["exec_status"], 0) + 1
    outcomes: dict[str, set] = {}
    for t in trajs:
        outcomes.setdefault(t["task_id"], set()).add(t["outcome"])
    lost_tasks = {json.loads(d["payload_json"])["task_id"] for d in dead if d["stage"] == schema.SANDBOX_LOST}
    coverage = credit_coverage(rd, adv) if steps else None
    outcome_of = {t["traj_id"]: t["outcome"] for t in trajs}
    sums: dict[str, list[float]] = {"passing": [0.0, 0], "failing": [0.0, 0]}
    for a in adv:
        key = "passing" if outcome_of.get(a["traj_id"], 0.0) == 1.0 else "failing"
        sums[key][0] += sum(a["token_advantages"])
        sums[key][1] += len(a["token_advantages"])
    manifest = schema.read_manifest(rd)
    n_steps = max(len(steps), 1)
    return RoundSummary(
        round_dir=str(rd), tasks=len(set(outcomes) | lost_tasks), rollouts=started,
        pass_rate=passed / max(started, 1),
        mean_return=sum(t["episode_return"] for t in trajs) / max(len(trajs), 1),
        steps=len(steps), steps_by_status=dict(sorted(status.items())),
        invalid_rate=status.get("invalid_action", 0) / n_steps,
        subdiffs=manifest.row_counts.get("subdiffs", 0), anchors=len(anchors),
        mean_anchor_rows=sum(a["n_rows"] for a in anchors) / max(len(anchors), 1),
        coverage=coverage or 0.0,
        mixed_groups=sum(len(v) > 1 for v in outcomes.values()) / max(len(outcomes), 1),
        mean_adv_by_outcome={k: (v[0] / v[1] if v[1] else 0.0) for k, v in sums.items()},
        stage_seconds={k: v.get("seconds", 0.0) for k, v in manifest.stages.items()},
        dead_letters=len(dead), lost_to_sandbox=lost,
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
    table.add_row("wall time by stage", ", ".join(f"{k} {v:.1f}s" for k, v in s.stage_seconds.items()))
    if s.dead_letters > s.lost_to_sandbox:
        table.add_row("other dead letters", f"{s.dead_letters - s.lost_to_sandbox} (credit stage; see the "
                                            "dead_letter table)")
    console.print(table)
    return s
