"""`make demo`: the main job on embedded defaults (bundled tasks, small CPU policy), end to end.

1. Build the demo policy offline (`didpo model init`) unless it exists.
2. Load the bundled training tasks from the config.
3. Run a pipeline round: rollouts in the sandbox -> sub-diffs -> LSH anchors -> DuckDB advantages -> Parquet.
4. Print what happened and where the tables are.
"""

from __future__ import annotations

import time

from rich.console import Console

from pipeline.config import DidpoConfig
from pipeline.telemetry import configure


def run_demo(cfg: DidpoConfig) -> None:
    from pipeline.run import resolve_policy, run_round
    from pipeline.tasks.settings import resolve_tasks
    from workflows.summary import print_round_summary

    configure(cfg.logging.level)
    console = Console()
    start = time.perf_counter()
    checkpoint = resolve_policy(cfg)
    console.print(f"[bold]policy[/] {checkpoint} ({cfg.policy.size}, built offline, loaded with from_pretrained)")
    train, evaluation = resolve_tasks(cfg.tasks)
    console.print(f"[bold]tasks[/] {len(train)} training, {len(evaluation)} held-out (disjoint)")
    result = run_round(cfg, 0, checkpoint, train)
    summary = print_round_summary(result.round_dir, console)
    console.print(f"tables: {result.round_dir}/<table>/part-*.parquet  (query them: didpo sql NAME --run "
                  f"{result.round_dir}); {summary.steps} training rows in "
                  f"{time.perf_counter() - start:.0f}s")
