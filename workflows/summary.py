"""A short, readable summary of one pipeline round, computed from its tables."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline import schema


@dataclass
class RoundSummary:
    round_dir: str
    tasks: int
    rollouts: int
    pass_rate: float  # share of rollouts whose hidden tests all pass
    mean_return: float  # mean episode return R_0
    steps: int
    steps_by_status: dict[str, int]
    invalid_rate: float  # share of steps with an invalid action
    subdiffs: int
    anchors: int
    mean_anchor_rows: float
    coverage: float  # share of changed-code tokens that received a diff-level advantage
    mixed_groups: float  # share of task groups whose rollouts' outcomes differ (A^E != 0 somewhere)
    mean_adv_by_outcome: dict[str, float]  # mean token advantage on passing / failing rollouts
    stage_seconds: dict[str, float] = field(default_factory=dict)
    dead_letters: int = 0


def round_summary(round_dir: str | Path) -> RoundSummary:
    from pipeline.sqlrun import run_query

    rd = Path(round_dir)

    def read(name: str) -> list[dict]:
        return schema.read_table(schema.table_dir(rd, name), name).to_pylist()

    trajs, steps, anchors, adv = read("trajectories"), read("steps"), read("anchors"), read("advantages")
    status: dict[str, int] = {}
    for s in steps:
        status[s["exec_status"]] = status.get(s["exec_status"], 0) + 1
    outcomes: dict[str, set] = {}
    for t in trajs:
        outcomes.setdefault(t["task_id"], set()).add(t["outcome"])
    coverage_rows = run_query(rd, "coverage_per_task").to_pylist() if steps else []
    changed = sum(r["changed_tokens"] for r in coverage_rows)
    anchored = sum(r["anchored_tokens"] for r in coverage_rows)
    outcome_of = {t["traj_id"]: t["outcome"] for t in trajs}
    sums: dict[str, list[float]] = {"passing": [0.0, 0], "failing": [0.0, 0]}
    for a in adv:
        key = "passing" if outcome_of.get(a["traj_id"], 0.0) == 1.0 else "failing"
        sums[key][0] += sum(a["token_advantages"])
        sums[key][1] += len(a["token_advantages"])
    manifest = schema.read_manifest(rd)
    n_steps = max(len(steps), 1)
    return RoundSummary(
        round_dir=str(rd), tasks=len(outcomes), rollouts=len(trajs),
        pass_rate=sum(t["outcome"] for t in trajs) / max(len(trajs), 1),
        mean_return=sum(t["episode_return"] for t in trajs) / max(len(trajs), 1),
        steps=len(steps), steps_by_status=dict(sorted(status.items())),
        invalid_rate=status.get("invalid_action", 0) / n_steps,
        subdiffs=manifest.row_counts.get("subdiffs", 0), anchors=len(anchors),
        mean_anchor_rows=sum(a["n_rows"] for a in anchors) / max(len(anchors), 1),
        coverage=anchored / changed if changed else 0.0,
        mixed_groups=sum(len(v) > 1 for v in outcomes.values()) / max(len(outcomes), 1),
        mean_adv_by_outcome={k: (v[0] / v[1] if v[1] else 0.0) for k, v in sums.items()},
        stage_seconds={k: v.get("seconds", 0.0) for k, v in manifest.stages.items()},
        dead_letters=manifest.row_counts.get("dead_letter", 0),
    )


def print_round_summary(round_dir: str | Path, console: Console | None = None) -> RoundSummary:
    s = round_summary(round_dir)
    console = console or Console()
    table = Table(title=f"pipeline round: {s.round_dir}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("tasks x rollouts", f"{s.tasks} tasks, {s.rollouts} rollouts, pass rate {s.pass_rate:.2f}")
    table.add_row("steps by status", ", ".join(f"{k} {v}" for k, v in s.steps_by_status.items()) or "none")
    table.add_row("invalid actions", f"{s.invalid_rate:.2%} of {s.steps} steps")
    table.add_row("credit units", f"{s.subdiffs} sub-diffs, {s.anchors} anchors "
                                  f"(mean {s.mean_anchor_rows:.1f} rows each)")
    table.add_row("coverage", f"{s.coverage:.2%} of changed-code tokens got a diff-level advantage")
    table.add_row("mixed-outcome groups", f"{s.mixed_groups:.2%} of task groups")
    table.add_row("mean token advantage", ", ".join(f"{k} {v:+.3f}" for k, v in s.mean_adv_by_outcome.items()))
    table.add_row("wall time by stage", ", ".join(f"{k} {v:.1f}s" for k, v in s.stage_seconds.items()))
    if s.dead_letters:
        table.add_row("dead letters", f"{s.dead_letters} (see dead_letter table)")
    console.print(table)
    return s


def summary_dict(s: RoundSummary) -> dict:
    return asdict(s)
