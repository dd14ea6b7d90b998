"""Task sources -> `Task` (workspace files, visible tests, hidden tests, instructions, reference).

1. `SOURCES` maps a source name to its loader: `loader(path) -> list[Task]`, in file order.
2. `load_source(name)` reads the source's bundled file in `data/` (or any file of that format) and filters
   by split, ids and limit; `load_bundled()` reads every source's bundled file.
3. `check_disjoint(train, evaluation)` refuses a training pool that shares a problem with the evaluation
   set, across sources: tasks carry `meta["problem"]` ("humaneval:0" for humaneval, humanevalplus and
   humanevalfix task 0; "mbpp:123" for mbpp and mbppplus 123; "exercism:<slug>").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from pipeline.assets import asset_dir
from pipeline.tasks.base import Split, Task, TestSuite
from pipeline.tasks.cases import count_cases
from pipeline.tasks.evalplus import load_humanevalplus, load_mbppplus
from pipeline.tasks.exercism import load_exercism
from pipeline.tasks.humaneval import load_humaneval, load_humanevalfix
from pipeline.tasks.mbpp import load_mbpp
from pipeline.tasks.records import TaskFormatError
from pipeline.tasks.repair import load_repair
from pipeline.tasks.taskfile import load_task_file

__all__ = [
    "BUNDLED_DIR",
    "BUNDLED_FILES",
    "MINTED_FILES",
    "SOURCES",
    "Task",
    "TaskFormatError",
    "TestSuite",
    "check_disjoint",
    "content_key",
    "count_cases",
    "load_bundled",
    "load_source",
    "native_id",
    "overlap_keys",
    "problem_key",
]

Loader = Callable[[Path], list[Task]]

SOURCES: Mapping[str, Loader] = MappingProxyType(
    {
        "humaneval": load_humaneval,
        "humanevalplus": load_humanevalplus,
        "mbpp": load_mbpp,
        "mbppplus": load_mbppplus,
        "humanevalfix": load_humanevalfix,
        "exercism": load_exercism,
        # minted by `didpo tasks make-repair` from the others (a curriculum ships, `MINTED_FILES`); rebuilt
        # through this registry
        "repair": lambda path: load_repair(path, load_source),
        # DiDPO's own format (docs/tasks.md): a user's tasks under the user's source names
        "file": load_task_file,
    }
)

# Bundled with the repository (see data/README.md). EvalPlus sources default to their NoExtreme files
# (same tasks, without the inputs that need minutes or gigabytes); the full files sit beside them.
BUNDLED_DIR = asset_dir("data")
BUNDLED_FILES: Mapping[str, str] = MappingProxyType(
    {
        "humaneval": "HumanEval.jsonl.gz",
        "humanevalplus": "HumanEvalPlus-NoExtreme.jsonl.gz",
        "mbpp": "mbpp_release_v1.jsonl",
        "mbppplus": "MbppPlus-NoExtreme.jsonl.gz",
        "humanevalfix": "humanevalpack_python.jsonl",
        "exercism": "exercism_python.jsonl",
    }
)
# Task files minted from the bundled sets and shipped as their source's default file (data/README.md says
# how each was made). Not benchmarks of their own, so outside BUNDLED_FILES (`load_bundled`, `didpo eval`).
MINTED_FILES: Mapping[str, str] = MappingProxyType({"repair": "repair_mbpp.jsonl"})
SPLITS: tuple[Split, ...] = ("train", "validation", "test")


def _unknown_source(source: str) -> ValueError:
    return ValueError(f"unknown task source {source!r}; allowed: {', '.join(SOURCES)}")


def load_source(
    source: str,
    path: str | Path | None = None,
    *,
    split: Split | None = None,
    limit: int | None = None,
    ids: Iterable[str] | None = None,
    skip: int = 0,
) -> list[Task]:
    """Tasks of one source, in file order: its bundled file (path None) or a file of its format.

    split: keep one split. ids: keep these tasks, each given as task_id ("mbpp/MBPP/12") or native id
    ("MBPP/12"); an id that matches nothing is an error. skip: then drop the first `skip` (the tasks another
    spec took with `limit`). limit: then keep the first `limit`.
    Raises ValueError (unknown source, split or id, bad limit), FileNotFoundError, TaskFormatError.
    """
    if source not in SOURCES:
        raise _unknown_source(source)
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    if isinstance(ids, str):
        raise ValueError(f"ids must be a list of task ids, not the string {ids!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (or None for all), got {limit}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    default = BUNDLED_FILES.get(source) or MINTED_FILES.get(source)
    if path is None and default is None:
        raise ValueError(f"source {source!r} has no bundled file: give the path of one "
                         "(`didpo tasks make-repair` writes repair task files, docs/tasks.md explains task files)")
    file = BUNDLED_DIR / default if path is None else Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"task file for source {source!r} not found: {file}")
    tasks = SOURCES[source](file)
    if split is not None:
        tasks = [t for t in tasks if t.split == split]
    if ids is not None:
        by_id = {name: t.task_id for t in tasks for name in (t.task_id, native_id(t))}
        missing = [i for i in ids if i not in by_id]
        if missing:
            where = f" with split {split!r}" if split else ""
            if source == "file":
                raise ValueError(f"{file}: no task{where} with id {', '.join(sorted(missing))}")
            named = sorted(i if i.startswith(f"{source}/") else f"{source}/{i}" for i in missing)
            raise ValueError(f"{file}: no {source} task{where} with id {', '.join(named)}")
        wanted = {by_id[i] for i in ids}
        tasks = [t for t in tasks if t.task_id in wanted]
    tasks = tasks[skip:]
    return tasks[:limit] if limit is not None else tasks


def load_bundled() -> list[Task]:
    """Every bundled file (one per source, `BUNDLED_FILES`), sources in `SOURCES` order."""
    return [task for source in SOURCES if source in BUNDLED_FILES for task in load_source(source)]


def native_id(task: Task) -> str:
    """The task's id within its source ("MBPP/12" of "mbpp/MBPP/12")."""
    prefix = f"{task.source}/"
    return task.task_id[len(prefix):] if task.task_id.startswith(prefix) else task.task_id


def problem_key(task: Task) -> str:
    """The cross-source problem a task poses (`meta["problem"]`; the task_id for tasks without one)."""
    return str(task.meta.get("problem", task.task_id))


def content_key(task: Task) -> str:
    """A hash of what a task is: its reference and its hidden tests, whitespace at line ends ignored. Two
    tasks with one content pose one problem whatever their ids and sources say (a copied task set)."""
    def norm(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip().splitlines())

    suite = task.hidden_tests
    body = [sorted((p, norm(t)) for p, t in task.reference.items()), suite.kind,
            sorted((p, norm(t)) for p, t in suite.files.items()), suite.entry_point, suite.inputs]
    return hashlib.sha256(json.dumps(body, default=repr).encode()).hexdigest()[:16]


def overlap_keys(task: Task) -> tuple[str, str]:
    """The keys under which two tasks count as one problem: the named problem, and the content."""
    return problem_key(task), f"content {content_key(task)}"


def check_disjoint(train: Iterable[Task], evaluation: Iterable[Task], *, show: int = 10) -> None:
    """Raise ValueError naming the shared problems if a training task poses an evaluation problem: the same
    `problem_key`, or the same content (`content_key`) under different names."""
    train_by_problem: dict[str, list[str]] = {}
    for task in train:
        for key in overlap_keys(task):
            train_by_problem.setdefault(key, []).append(task.task_id)
    shared: dict[str, list[str]] = {}
    for task in evaluation:
        key = next((k for k in overlap_keys(task) if k in train_by_problem), None)
        if key is not None:
            shared.setdefault(key, []).append(task.task_id)
    if not shared:
        return
    lines = [
        f"  {key}: train {', '.join(train_by_problem[key])} / eval {', '.join(shared[key])}"
        for key in sorted(shared)[:show]
    ]
    more = f"\n  ... and {len(shared) - show} more" if len(shared) > show else ""
    raise ValueError(
        f"training and evaluation tasks share {len(shared)} problem(s); remove them from one side:\n"
        + "\n".join(lines)
        + more
    )
