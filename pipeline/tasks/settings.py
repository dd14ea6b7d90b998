"""The `tasks` config section: which task sources make the training pool and the evaluation set.

    tasks:
      train:
        - {source: mbpp, split: train}
        - {source: exercism}
      eval:
        - {source: humanevalfix}
        - {source: mbppplus, split: test, path: /data/MbppPlus.jsonl.gz}
        - {file: my_tasks.jsonl, split: test}      # a task file of our own format (docs/tasks.md)

`resolve_tasks(settings)` loads both sides and refuses a training pool that shares a problem with the
evaluation set (`check_disjoint`), so evaluation ids never leak into training.

`per_round: N` makes the training side a pool that the rounds walk through as a data loader walks a dataset:
round k rolls out the k-th batch of N tasks of a seeded shuffle, a new shuffle each epoch (`round_tasks`).
Without it, or with N at least the training side, every round rolls out the whole training side.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.tasks import SOURCES, Task, check_disjoint, load_source
from pipeline.tasks.base import Split


class TaskSourceSpec(BaseModel):
    """One source's contribution: a file (None = the bundled one), filtered by split, ids, skip, then limit.
    `{file: F}` is short for `{source: file, path: F}`, a task file of our own format."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _file_shorthand(cls, data: object) -> object:
        if isinstance(data, dict) and "file" in data:
            if "source" in data or "path" in data:
                raise ValueError("give `file: F` alone, or `source` with `path`, not both")
            data = {k: v for k, v in data.items() if k != "file"} | {"source": "file", "path": data["file"]}
        return data

    source: str  # a name in pipeline.tasks.SOURCES
    path: Path | None = None  # a file of the source's format (relative: to the working dir); None = bundled
    split: Split | None = None  # keep one split; None = all
    skip: int = Field(default=0, ge=0)  # drop the first `skip` tasks (after split and ids): the ones another
    #                                      spec took with `limit`, e.g. the rounds' tasks kept out of the SFT
    limit: int | None = Field(default=None, ge=1)  # keep the first `limit` tasks (after split, ids and skip)
    ids: tuple[str, ...] | None = None  # keep these task ids ("mbpp/MBPP/12" or native "MBPP/12")

    @field_validator("source")
    @classmethod
    def _known_source(cls, source: str) -> str:
        if source not in SOURCES:
            raise ValueError(f"unknown task source {source!r}; allowed: {', '.join(SOURCES)}")
        return source

    @field_validator("ids")
    @classmethod
    def _distinct_ids(cls, ids: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if ids is None:
            return None
        if not ids:
            raise ValueError("ids must list at least one task id (or be omitted for all tasks)")
        repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
        if repeated:
            raise ValueError(f"ids lists {', '.join(repeated)} more than once")
        return ids

    @model_validator(mode="after")
    def _file_needs_path(self) -> TaskSourceSpec:
        if self.source == "file" and self.path is None:
            raise ValueError("source file needs path (a task file, docs/tasks.md)")
        return self

    def load(self) -> list[Task]:
        """The selected tasks; ValueError when a split selects none (a side that would silently be empty)."""
        tasks = load_source(self.source, self.path, split=self.split, limit=self.limit, ids=self.ids,
                            skip=self.skip)
        if not tasks:
            left = f" left after skipping {self.skip}" if self.skip else ""
            raise ValueError(f"{self.path or self.source}: no task with split {self.split!r}{left}")
        return tasks


def _default_train() -> tuple[TaskSourceSpec, ...]:
    return (TaskSourceSpec(source="mbpp", split="train"), TaskSourceSpec(source="exercism"))


def _default_eval() -> tuple[TaskSourceSpec, ...]:
    return (TaskSourceSpec(source="humanevalfix"),)


class TasksSettings(BaseModel):
    """Training pool and evaluation set. Defaults: MBPP train ids + Exercism for training, HumanEvalFix for
    evaluation (the data README's suggestion, bundled, disjoint by construction)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    train: tuple[TaskSourceSpec, ...] = Field(default_factory=_default_train, min_length=1)
    eval: tuple[TaskSourceSpec, ...] = Field(default_factory=_default_eval)
    per_round: int | None = Field(default=None, ge=1)  # tasks a round rolls out, drawn from the training side
    #                                                     (round_tasks); None: the whole training side each round

    @model_validator(mode="after")
    def _no_spec_on_both_sides(self) -> TasksSettings:
        # The cheap, early case of overlap; `resolve_tasks` checks the problems themselves.
        same = [spec for spec in self.train if spec in self.eval]
        if same:
            named = ", ".join(spec.model_dump_json(exclude_defaults=True) for spec in same)
            raise ValueError(f"train and eval both select {named}: training and evaluation tasks must differ")
        return self


def resolve_tasks(settings: TasksSettings) -> tuple[list[Task], list[Task]]:
    """(train, eval) tasks, each side in spec order; ValueError naming the shared problems if they overlap,
    or naming a task id that two specs of one side both select."""
    sides = []
    for name, specs in (("train", settings.train), ("eval", settings.eval)):
        tasks = [task for spec in specs for task in spec.load()]
        repeated = sorted(t for t, n in Counter(task.task_id for task in tasks).items() if n > 1)
        if repeated:
            shown = ", ".join(repeated[:10]) + (" ..." if len(repeated) > 10 else "")
            raise ValueError(f"tasks.{name} selects {len(repeated)} task(s) twice: {shown}")
        sides.append(tasks)
    train, evaluation = sides
    check_disjoint(train, evaluation)
    return train, evaluation


def round_tasks(pool: Sequence[Task], round_k: int, per_round: int | None, seed: int) -> list[Task]:
    """Round k's tasks: the whole pool when per_round is None; else batch k of per_round tasks, where each
    epoch is a fresh seeded permutation of the pool cut into len(pool) // per_round batches (the remainder
    waits for a later epoch, as a data loader's drop_last), so no task repeats within an epoch and every task
    comes round once per epoch, in a new company. A per_round of the whole pool or more is the whole pool, as a
    data loader's batch at least its dataset is the dataset (so the default's per_round suits a small task file
    too). Pure: the same (pool, k, per_round, seed), the same tasks."""
    if per_round is not None and per_round < 1:
        raise ValueError(f"tasks.per_round {per_round} must be at least 1")
    if per_round is None or per_round >= len(pool):
        return list(pool)
    batches = len(pool) // per_round
    epoch, batch = divmod(round_k, batches)
    order = list(range(len(pool)))
    random.Random(f"round-tasks:{seed}:{epoch}").shuffle(order)  # a str seed: stable across processes
    return [pool[i] for i in order[batch * per_round:(batch + 1) * per_round]]
