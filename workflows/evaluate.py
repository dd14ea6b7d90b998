"""Quick held-out evaluation: the same multi-turn episodes and sandbox as the pipeline, greedy by default."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.tasks.base import Task


def quick_eval(checkpoint: str | Path, tasks: Sequence[Task], cfg: PipelineConfig) -> dict[str, float]:
    """Pass rate (hidden tests; lost episodes count as not passing), invalid-action rate, mean turns and mean
    return (finished episodes) and episodes lost to the sandbox (`infra_failures`) of `checkpoint` on the first
    `cfg.eval.max_tasks` held-out tasks."""
    from pipeline.policy.generation import TransformersGenerator
    from pipeline.policy.loading import load_policy, load_tokenizer
    from pipeline.rollout import run_rollouts, start_rollouts
    from pipeline.sandbox import Judge, SandboxPool

    tasks = list(tasks)[: cfg.eval.max_tasks]
    if not tasks:
        raise ValueError("quick evaluation needs held-out tasks: tasks.eval selects none")
    settings = cfg.policy.model_copy(update={"checkpoint": str(checkpoint), "temperature": cfg.eval.temperature})
    tokenizer = load_tokenizer(checkpoint)
    generator = TransformersGenerator(load_policy(checkpoint, dtype=settings.dtype, device=settings.device),
                                      tokenizer, settings)
    rollouts = [r for t in tasks for r in start_rollouts(t, run_id="eval", round_k=0, samples=cfg.eval.samples,
                                                         root_seed=cfg.run.seed, policy_version="eval")]
    with SandboxPool(cfg.sandbox) as pool:
        trajs, steps, dead = run_rollouts(rollouts, generator.generate, tokenizer, Judge(pool), cfg.episode,
                                          gamma=cfg.credit.gamma, batch_size=cfg.pipeline.max_batch_size)
    n, m = max(len(trajs), 1), max(len(steps), 1)
    return {
        "tasks": float(len(tasks)),
        # an episode lost to sandbox failures counts as not passing, as in the round summary (workflows/summary.py)
        "pass_rate": sum(t.outcome for t in trajs) / max(len(trajs) + len(dead), 1),
        "invalid_rate": sum(s.exec_status == "invalid_action" for s in steps) / m,
        "mean_turns": sum(t.n_turns for t in trajs) / n,
        "mean_return": sum(t.episode_return for t in trajs) / n,
        "infra_failures": float(len(dead)),
    }
