"""Benchmark evaluation: multi-turn self-repair episodes on held-out benchmarks, scored as pass@k.

The one evaluation module: `didpo eval` (benchmarks, pass@k) and the quick held-out check after each round
(`quick_eval`) run the same episodes through the same agent runtime.

0. `agent_runtime` builds what an episode needs outside Beam, once, from config sections: the policy's
   generator (its backend's handler, as the pipeline's RunInference loads it), its tokenizer, a sandbox judge.
1. `select_benchmark_tasks` loads each benchmark's tasks, leaves out (or refuses) every task that poses a
   problem of the training pool, then proves the result disjoint with `check_disjoint`.
2. `run_benchmark_episodes` runs n episodes per task through the same episode, generator and sandbox code as
   the pipeline's rollouts (`pipeline.rollout.run_rollouts`).
3. `score` counts, per task, the episodes whose hidden tests all pass (c of n) and averages the unbiased
   pass@k estimator over the tasks of each benchmark and of each subset (a task-meta field, `SUBSET_KEYS`).
4. `write_results` writes the summary, per-task and dead-letter tables as Parquet (atomic temp + rename).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.schema import DeadLetterRow, StepRow, TrajectoryRow, atomic_write, write_table
from pipeline.tasks import BUNDLED_FILES, Task, check_disjoint, load_source, overlap_keys

if TYPE_CHECKING:
    from pipeline.agent.settings import EpisodeSettings
    from pipeline.config import PipelineConfig
    from pipeline.policy.settings import PolicySettings
    from pipeline.sandbox.settings import SandboxSettings

# The task-meta field that splits a benchmark into subsets (what the loaders record); others report "all".
SUBSET_KEYS: Mapping[str, str] = {
    "humanevalfix": "bug_type",  # missing logic, excess logic, value misuse, operator misuse, ...
    "mbppplus": "mbpp_split",  # the original MBPP split the problem came from (prompt/train/validation/test)
    "humanevalplus": "output_check",  # EvalPlus output oracle: equal, float, set, ...
    "mbpp": "split",
}
ALL = "all"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1..n} (1 - k/i), which never forms the (huge) binomials; exact 1.0 when
    fewer than k samples fail (every k-subset then holds a pass). Requires 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def default_ks(samples: int) -> tuple[int, ...]:
    """The usual k values that n samples can estimate: 1, 5, 10, 100 up to n (and n itself when n > 1)."""
    ks = {k for k in (1, 5, 10, 100) if k <= samples}
    return tuple(sorted(ks | ({samples} if samples > 1 else set())))


def subset_of(task: Task) -> str:
    key = SUBSET_KEYS.get(task.source)
    value = task.meta.get(key) if key else None
    return str(value) if value not in (None, "") else ALL


def parse_benchmarks(spec: str | Sequence[str]) -> list[str]:
    """'humaneval,mbppplus' -> ['humaneval', 'mbppplus']; ValueError naming an unknown or repeated name."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not names:
        raise ValueError(f"--benchmarks names no benchmark; allowed: {', '.join(BUNDLED_FILES)}")
    unknown = [n for n in names if n not in BUNDLED_FILES]
    if unknown:
        raise ValueError(f"unknown benchmark {', '.join(unknown)}; allowed: {', '.join(BUNDLED_FILES)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"benchmark {', '.join(repeated)} listed more than once")
    return names


@dataclass
class Selection:
    """Evaluation tasks per benchmark, and what was left out because the training pool poses it."""

    tasks: dict[str, list[Task]]  # benchmark -> tasks, in file order
    excluded: dict[str, int] = field(default_factory=dict)  # benchmark -> tasks left out for overlap

    @property
    def all_tasks(self) -> list[Task]:
        return [t for ts in self.tasks.values() for t in ts]


def file_benchmarks(task_file: str | Path) -> dict[str, list[Task]]:
    """The tasks of a task file (docs/tasks.md) as benchmarks: one per source name, in file order."""
    groups: dict[str, list[Task]] = {}
    for task in load_source("file", task_file):
        groups.setdefault(task.source, []).append(task)
    return groups


def select_benchmark_tasks(benchmarks: Sequence[str] | Mapping[str, Sequence[Task]], train: Iterable[Task], *,
                           limit: int | None = None, on_overlap: str = "exclude",
                           paths: Mapping[str, str | Path] | None = None) -> Selection:
    """Each benchmark's tasks minus those that share a problem with `train`, first `limit` of each.

    benchmarks: bundled source names (loaded from `paths` where given), or benchmark name -> tasks
    (`file_benchmarks`). on_overlap: "exclude" leaves shared problems out (counted in `Selection.excluded`);
    "error" refuses them with `check_disjoint`'s message. Either way the result is checked disjoint from `train`.
    """
    if on_overlap not in ("exclude", "error"):
        raise ValueError(f"on_overlap must be 'exclude' or 'error', got {on_overlap!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    train = list(train)
    train_keys = {key for t in train for key in overlap_keys(t)}
    if not isinstance(benchmarks, Mapping):
        benchmarks = {name: load_source(name, (paths or {}).get(name)) for name in benchmarks}
    selection = Selection(tasks={})
    for name, tasks in benchmarks.items():
        if on_overlap == "error":
            check_disjoint(train, tasks)
        kept = [t for t in tasks if not train_keys.intersection(overlap_keys(t))]
        selection.excluded[name] = len(tasks) - len(kept)
        selection.tasks[name] = kept[:limit] if limit is not None else kept
        if not selection.tasks[name]:
            raise ValueError(f"benchmark {name}: all {len(tasks)} tasks pose training problems; nothing is left "
                             "to evaluate (change tasks.train or pick another benchmark)")
    check_disjoint(train, selection.all_tasks)  # the guarantee, whatever the filtering above did
    return selection


@dataclass(frozen=True)
class AgentRuntime:
    """What an episode needs outside Beam: the policy's `generate(requests)`, its tokenizer, a judge."""

    generate: Callable[..., Any]
    tokenizer: Any
    judge: Any


@contextmanager
def agent_runtime(policy: PolicySettings, sandbox: SandboxSettings) -> Iterator[AgentRuntime]:
    """The runtime of `policy.checkpoint` on its configured backend, with a sandbox pool closed on exit."""
    from pipeline.policy.generation import load_generator
    from pipeline.policy.loading import load_tokenizer
    from pipeline.sandbox import Judge, SandboxPool

    generator = load_generator(policy)
    tokenizer = load_tokenizer(policy.checkpoint)
    with SandboxPool(sandbox) as pool:
        yield AgentRuntime(generator.generate, tokenizer, Judge(pool))


def run_benchmark_episodes(tasks: Sequence[Task], runtime: AgentRuntime, episode: EpisodeSettings, *, samples: int,
                           seed: int, gamma: float, batch_size: int, label: str = "eval"
                           ) -> tuple[list[TrajectoryRow], list[StepRow], list[Any]]:
    """n = `samples` episodes of every task with the pipeline's rollout loop (same prompts, parser, sandbox)."""
    from pipeline.rollout import run_rollouts, start_rollouts

    rollouts = [r for t in tasks for r in start_rollouts(t, run_id=label, round_k=0, samples=samples,
                                                         root_seed=seed, policy_version=label)]
    return run_rollouts(rollouts, runtime.generate, runtime.tokenizer, runtime.judge, episode, gamma=gamma,
                        batch_size=batch_size)


def quick_eval(checkpoint: str | Path, tasks: Sequence[Task], cfg: PipelineConfig) -> dict[str, float]:
    """The held-out check after each round: pass rate (hidden tests; lost episodes count as not passing, as
    in the round metrics), invalid-action rate, mean turns and mean return (finished episodes) and episodes
    lost to the sandbox (`infra_failures`) of `checkpoint` on the first `cfg.eval.max_tasks` held-out tasks."""
    tasks = list(tasks)[: cfg.eval.max_tasks]
    if not tasks:
        raise ValueError("quick evaluation needs held-out tasks: tasks.eval selects none")
    policy = cfg.policy.model_copy(update={"checkpoint": str(checkpoint), "temperature": cfg.eval.temperature})
    with agent_runtime(policy, cfg.sandbox) as runtime:
        trajs, steps, dead = run_benchmark_episodes(tasks, runtime, cfg.episode, samples=cfg.eval.samples,
                                                    seed=cfg.run.seed, gamma=cfg.credit.gamma,
                                                    batch_size=cfg.pipeline.max_batch_size)
    n, m = max(len(trajs), 1), max(len(steps), 1)
    return {
        "tasks": float(len(tasks)),
        "pass_rate": sum(t.outcome for t in trajs) / max(len(trajs) + len(dead), 1),
        "invalid_rate": sum(s.exec_status == "invalid_action" for s in steps) / m,
        "mean_turns": sum(t.n_turns for t in trajs) / n,
        "mean_return": sum(t.episode_return for t in trajs) / n,
        "infra_failures": float(len(dead)),
    }


@dataclass
class TaskResult:
    """One task's episodes: n finished, c passing."""

    benchmark: str
    subset: str
    task_id: str
    n: int  # finished episodes (episodes lost to sandbox failures are not counted)
    c: int  # episodes whose hidden tests all pass
    steps: int
    invalid_steps: int
    mean_turns: float


@dataclass
class SummaryRow:
    """One line of the results table: a benchmark (subset 'all') or one of its subsets."""

    benchmark: str
    subset: str
    tasks: int
    samples: int  # n requested per task
    pass_at: dict[int, float]  # k -> mean pass@k over the tasks with >= k finished episodes (NaN if none)
    invalid_rate: float  # invalid actions / steps
    mean_turns: float  # turns per episode
    lost_episodes: int  # episodes the sandbox could not finish (dead letters)

    def flat(self, ks: Sequence[int]) -> dict[str, Any]:
        row = {k: v for k, v in asdict(self).items() if k != "pass_at"}
        return {**row, **{f"pass_at_{k}": self.pass_at.get(k, math.nan) for k in ks}}


def task_results(tasks: Mapping[str, Sequence[Task]], trajs: Iterable[TrajectoryRow],
                 steps: Iterable[StepRow]) -> list[TaskResult]:
    """Per task: finished episodes, passes, steps and invalid steps (tasks in benchmark, file order)."""
    by_task: dict[str, list[TrajectoryRow]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t)
    step_counts: dict[str, list[int]] = {}
    for s in steps:
        counts = step_counts.setdefault(s.task_id, [0, 0])
        counts[0] += 1
        counts[1] += s.exec_status == "invalid_action"
    out = []
    for bench, ts in tasks.items():
        for task in ts:
            done = by_task.get(task.task_id, [])
            n_steps, n_invalid = step_counts.get(task.task_id, [0, 0])
            out.append(TaskResult(
                benchmark=bench, subset=subset_of(task), task_id=task.task_id, n=len(done),
                c=sum(t.outcome == 1.0 for t in done), steps=n_steps, invalid_steps=n_invalid,
                mean_turns=sum(t.n_turns for t in done) / len(done) if done else math.nan))
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(results: Sequence[TaskResult], *, samples: int, ks: Sequence[int]) -> list[SummaryRow]:
    """Benchmark rows (subset 'all') each followed by its subset rows (sorted), pass@k averaged over tasks.

    A task whose episodes the sandbox lost (n < k) is left out of pass@k, and counted in `lost_episodes`.
    """
    groups: dict[tuple[str, str], list[TaskResult]] = {}
    for r in results:
        groups.setdefault((r.benchmark, ALL), []).append(r)
        if r.subset != ALL:
            groups.setdefault((r.benchmark, r.subset), []).append(r)
    benches = list(dict.fromkeys(r.benchmark for r in results))
    order = [(b, s) for b in benches for s in [ALL, *sorted(s for bb, s in groups if bb == b and s != ALL)]]
    rows = []
    for key in order:
        rs = groups[key]
        pass_at = {k: _mean([pass_at_k(r.n, r.c, k) for r in rs if r.n >= k]) for k in ks}
        n_steps = sum(r.steps for r in rs)
        episodes = sum(r.n for r in rs)
        rows.append(SummaryRow(
            benchmark=key[0], subset=key[1], tasks=len(rs), samples=samples, pass_at=pass_at,
            invalid_rate=sum(r.invalid_steps for r in rs) / n_steps if n_steps else math.nan,
            mean_turns=sum(r.mean_turns * r.n for r in rs if r.n) / episodes if episodes else math.nan,
            lost_episodes=sum(samples - r.n for r in rs)))
    return rows


def summary_table(rows: Sequence[SummaryRow], ks: Sequence[int]) -> pa.Table:
    return pa.Table.from_pylist([r.flat(ks) for r in rows])


def write_results(out_dir: str | Path, rows: Sequence[SummaryRow], results: Sequence[TaskResult],
                  ks: Sequence[int], dead: Sequence[DeadLetterRow] = ()) -> dict[str, Path]:
    """<out>/eval_summary.parquet (one row per benchmark and subset), <out>/eval_tasks.parquet (per task) and
    <out>/dead_letter/ (episodes the sandbox lost, as the contract's dead_letter table)."""
    out = Path(out_dir)
    tables = {"eval_summary": summary_table(rows, ks),
              "eval_tasks": pa.Table.from_pylist([asdict(r) for r in results])}
    written = {"dead_letter": write_table(list(dead), out / "dead_letter", "dead_letter")}
    for name, table in tables.items():
        dest = out / f"{name}.parquet"
        atomic_write(dest, lambda tmp, table=table: pq.write_table(table, tmp))
        written[name] = dest
    return written
