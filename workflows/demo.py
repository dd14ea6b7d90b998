"""`make demo`: the main job on embedded defaults (the bundled base policy and repair curriculum), end to end.

1. Start from the configured checkpoint: the bundled base (`bundled:base`, hash-checked), or one built
   offline (`didpo model init`) when a configured path is missing.
2. Cold-start it with SFT on demonstrations in the action grammar, and check it on the held-out tasks.
3. Policy rounds: the Beam pipeline (rollouts in the sandbox -> sub-diffs -> LSH anchors -> advantages ->
   Parquet), the OpenRLHF-based update, a held-out evaluation.
4. Print the last round's pipeline summary and the per-round table; write the HTML report.
"""

from __future__ import annotations

import time

from rich.console import Console

from pipeline.storage import location
from pipeline.telemetry import configure
from training.config import DidpoConfig


def run_demo(cfg: DidpoConfig) -> None:
    from pipeline import schema
    from workflows.report import build_report
    from workflows.rounds import run_rounds
    from workflows.summary import print_round_summary

    configure(cfg.logging.level)
    console = Console()
    start = time.perf_counter()
    rows = run_rounds(cfg, cfg.run.rounds, console)
    run_dir = location(cfg.run.root) / cfg.run.run_id
    last = schema.round_dir(cfg.run.root, cfg.run.run_id, rows[-1].round)
    print_round_summary(last, console)
    report = build_report([run_dir], run_dir / "report", steps=[], explore_count=5)
    console.print(f"[bold]done in {time.perf_counter() - start:.0f}s[/]")
    console.print(f"tables:  {run_dir}/round=<k>/<table>/part-*.parquet   (didpo sql NAME --run {last})")
    console.print(f"rounds:  {run_dir}/rounds.csv")
    console.print(f"report:  {report.page}")
