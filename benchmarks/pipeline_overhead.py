"""Beam overhead: one demo-scale round through the Beam pipeline vs the same stages as a plain Python loop.

Same config, same tasks, same policy, same seeds, same run (so the two produce the same rows). Per-stage wall
times of each, and the ratio of the totals (target: Beam <= 1.25x the loop).

    python benchmarks/pipeline_overhead.py [--tasks 6] [--samples 4] [--turns 3] [--size small]

Last line: `pipeline_overhead: beam_s=<float> loop_s=<float> ratio=<float> steps=<int>`
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DIDPO_PROGRESS", "0")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from rich.console import Console
    from rich.table import Table

    from pipeline import schema
    from pipeline.config import load_config
    from pipeline.credit import assign_advantages, credit_units
    from pipeline.credit_io import CREDIT_TABLES, result_tables, steps_from_table
    from pipeline.evaluation import agent_runtime
    from pipeline.policy.tiny import ensure_checkpoint
    from pipeline.rollout import run_rollouts, start_rollouts
    from pipeline.run import STAGES, policy_version, run_round
    from pipeline.tasks.settings import resolve_tasks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--size", default="small")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="didpo-overhead-"))
    cfg = load_config(None, [
        f"run.root={work / 'runs'}", f"policy.checkpoint={work / 'policy'}", f"policy.size={args.size}",
        f"tasks.train=[{{source: mbpp, split: train, limit: {args.tasks}}}]",
        f"pipeline.samples_per_task={args.samples}", f"episode.max_turns={args.turns}",
        f"policy.max_new_tokens={args.max_new_tokens}", f"episode.max_response_tokens={args.max_new_tokens}",
    ])
    checkpoint = ensure_checkpoint(cfg.policy.checkpoint, cfg.policy.size, cfg.policy.seed)
    tasks, _ = resolve_tasks(cfg.tasks)

    # --- Beam ------------------------------------------------------------------------------------------
    start = time.perf_counter()
    beam_result = run_round(cfg, 0, checkpoint, tasks)
    beam_total = time.perf_counter() - start
    beam_stages = dict(beam_result.stage_seconds)

    # --- the same stages as a plain loop ---------------------------------------------------------------
    loop_stages: dict[str, float] = {}
    start = time.perf_counter()
    rollouts = [r for t in tasks for r in start_rollouts(
        t, run_id=cfg.run.run_id, round_k=0, samples=cfg.pipeline.samples_per_task, root_seed=cfg.run.seed,
        policy_version=policy_version(checkpoint))]
    policy = cfg.policy.model_copy(update={"checkpoint": str(checkpoint)})
    with agent_runtime(policy, cfg.sandbox) as runtime:
        trajs, steps, _ = run_rollouts(rollouts, runtime.generate, runtime.tokenizer, runtime.judge, cfg.episode,
                                       gamma=cfg.credit.gamma, batch_size=cfg.pipeline.max_batch_size)
    loop_dir = work / "loop"
    schema.write_table(steps, loop_dir / "steps", "steps")
    schema.write_table(trajs, loop_dir / "trajectories", "trajectories")
    loop_stages["rollouts"] = time.perf_counter() - start
    t = time.perf_counter()
    table = schema.read_table(loop_dir / "steps", "steps")
    by_task: dict[str, list] = {}
    for s in steps_from_table(table):
        by_task.setdefault(s.task_id, []).append(s)
    for name in CREDIT_TABLES:
        (loop_dir / name).mkdir(parents=True, exist_ok=True)
    for i, group in enumerate(by_task.values()):  # the default estimator is task-scoped: per task, as Beam
        for name, tab in result_tables(assign_advantages(credit_units(group, cfg.credit), cfg.credit)).items():
            schema.write_table(tab, loop_dir / name, name, part=i)
    loop_stages["credit"] = time.perf_counter() - t
    loop_total = time.perf_counter() - start

    beam_steps = schema.read_table(schema.table_dir(beam_result.round_dir, "steps"), "steps")
    same = sorted(beam_steps.column("row_id").to_pylist()) == sorted(s.row_id for s in steps)

    table_out = Table(title=f"pipeline overhead ({len(tasks)} tasks x {args.samples} samples x {args.turns} turns, "
                            f"{args.size} policy, one thread)")
    for col in ("stage", "beam s", "loop s", "ratio"):
        table_out.add_column(col, justify="right")
    for stage in STAGES:
        b, lp = beam_stages.get(stage, float("nan")), loop_stages[stage]
        table_out.add_row(stage, f"{b:.2f}", f"{lp:.2f}", f"{b / lp:.2f}")
    table_out.add_row("total", f"{beam_total:.2f}", f"{loop_total:.2f}", f"{beam_total / loop_total:.2f}")
    Console().print(table_out)
    print(f"same rows in both: {same}; steps: {len(steps)}; work dir: {work}")
    print(f"pipeline_overhead: beam_s={beam_total:.3f} loop_s={loop_total:.3f} "
          f"ratio={beam_total / loop_total:.3f} steps={len(steps)}")


if __name__ == "__main__":
    main()
