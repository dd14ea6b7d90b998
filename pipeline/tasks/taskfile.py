"""DiDPO's own task file format (version 1): a user's tasks, under the user's source name.

JSON Lines (plain or gzip), one task per line; docs/tasks.md is the user's guide and `didpo schema task`
prints the JSON Schema of a line. A line:

    {"version": 1, "source": "quixbugs", "id": "bitcount", "split": "test",
     "instructions": "Fix bitcount ...",
     "workspace": {"solution.py": "<buggy code>", "node.py": "<a helper module the tests import>"},
     "reference": {"solution.py": "<correct code>", "node.py": "..."},
     "hidden_tests": {"kind": "pytest", "files": {"test_bitcount.py": "..."}},
     "visible_tests": {...},                      # optional: the hidden tests when left out
     "meta": {"problem": "bitcount"}}             # optional, any JSON; "problem" groups tasks for overlap checks

The task id is `<source>/<id>`. Test kinds are the `TestSuite` kinds: "check" (a `check(candidate)`
function per file; `"objects": true` lets the candidate's function return objects, such as a generator or a
node of a helper module, used through handles as pytest tests use them), "io" (argument lists whose outputs
are compared with the reference's, `atol` for floats) and "pytest" (test modules that import the workspace).

`task_row(task)` is the inverse of the loader: `write_task_file(tasks, out)` converts tasks of any source
into this format (`didpo tasks export`), and loading the file gives the same tasks back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.tasks.base import Split, Task, TestSuite
from pipeline.tasks.records import load_rows

VERSION = 1
_SOURCE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def _check_paths(files: dict[str, str], what: str) -> dict[str, str]:
    for path in files:
        parts = PurePosixPath(path).parts
        if not path or path.startswith("/") or "\\" in path or ".." in parts or path != str(PurePosixPath(path)):
            raise ValueError(f"{what} path {path!r} must be relative, in / form, without '..'")
    return files


class SuiteRow(BaseModel):
    """A test suite of a task line (`TestSuite`)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    kind: Literal["check", "io", "pytest"] = Field(description="how the tests run (see the module docstring)")
    files: dict[str, str] = Field(default_factory=dict, description="test file path -> source text")
    entry_point: str | None = Field(None, description="check and io: the function under test")
    module: str | None = Field(None, description="check and io: the workspace module defining entry_point "
                               "(default: the workspace's only Python file)")
    inputs: list[list[Any]] = Field(default_factory=list, description="io: one argument list per case (JSON)")
    atol: float = Field(0.0, ge=0.0, description="io: absolute tolerance when outputs are floats")
    objects: bool = Field(False, description="check: the candidate may return objects (generators, instances "
                          "of a helper module); default: plain data only")

    @field_validator("files")
    @classmethod
    def _paths(cls, files: dict[str, str]) -> dict[str, str]:
        return _check_paths(files, "test file")

    @model_validator(mode="after")
    def _complete(self) -> SuiteRow:
        if self.kind in ("check", "io") and not self.entry_point:
            raise ValueError(f"a {self.kind} suite needs entry_point (the function under test)")
        if self.kind in ("check", "pytest") and not self.files:
            raise ValueError(f"a {self.kind} suite needs files (test path -> source)")
        if self.kind == "io" and not self.inputs:
            raise ValueError("an io suite needs inputs (one argument list per case)")
        if self.kind != "io" and (self.inputs or self.atol):
            raise ValueError("inputs and atol belong to io suites only")
        if self.kind != "check" and self.objects:
            raise ValueError("objects belongs to check suites (pytest suites always allow objects)")
        return self

    def suite(self) -> TestSuite:
        return TestSuite(self.kind, self.files, self.entry_point, self.module, tuple(self.inputs), self.atol,
                         self.objects)


class TaskRow(BaseModel):
    """One line of a task file."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    version: Literal[1] = Field(description="format version of this line")
    source: str = Field(description="your name for the task set, lower case (labels results: quixbugs, ...)")
    id: str = Field(min_length=1, description="unique within the source; the task id is <source>/<id>")
    split: Split = Field(description="train, validation or test")
    instructions: str = Field(min_length=1, description="what the agent is asked to do")
    workspace: dict[str, str] = Field(min_length=1, description="the files the agent starts from")
    reference: dict[str, str] = Field(min_length=1, description="a correct workspace: never shown to the agent "
                                      "(demonstrations, checks, the expected outputs of io suites)")
    hidden_tests: SuiteRow = Field(description="decide the task's outcome; never shown")
    visible_tests: SuiteRow | None = Field(None, description="the agent may run these (default: hidden_tests)")
    meta: dict[str, Any] = Field(default_factory=dict, description="free JSON; 'problem' names the problem "
                                 "for overlap checks across task sets (default: the task id)")

    @field_validator("source")
    @classmethod
    def _source_name(cls, source: str) -> str:
        if not _SOURCE_NAME.match(source):
            raise ValueError(f"source {source!r}: lower-case letters, digits, '_', '.', '-', starting with a "
                             "letter or digit")
        return source

    @field_validator("workspace", "reference")
    @classmethod
    def _paths(cls, files: dict[str, str]) -> dict[str, str]:
        return _check_paths(files, "workspace")

    @model_validator(mode="after")
    def _tests_beside_workspace(self) -> TaskRow:
        for name, suite in (("hidden_tests", self.hidden_tests), ("visible_tests", self.visible_tests)):
            clash = sorted(set(suite.files) & set(self.workspace)) if suite else []
            if clash:
                raise ValueError(f"{name} file {clash[0]!r} is also a workspace file")
        return self

    def task(self) -> Task:
        hidden = self.hidden_tests.suite()
        visible = self.visible_tests.suite() if self.visible_tests else hidden
        return Task(f"{self.source}/{self.id}", self.source, self.split, self.instructions, self.workspace,
                    visible, hidden, self.reference, self.meta)


def load_task_file(path: Path) -> list[Task]:
    """Every task of a task file, in file order; TaskFormatError naming the line of any bad one."""
    return load_rows(Path(path), TaskRow, TaskRow.task)


def _plain(value: Any) -> Any:
    """FrozenMaps and tuples of a Task as JSON's dicts and lists."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _suite_row(suite: TestSuite) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": suite.kind, "files": dict(suite.files)}
    if suite.entry_point:
        row["entry_point"] = suite.entry_point
    if suite.module:
        row["module"] = suite.module
    if suite.kind == "io":
        row["inputs"] = _plain(suite.inputs)
        row["atol"] = suite.atol
    if suite.objects:
        row["objects"] = True
    return row


def task_row(task: Task) -> dict[str, Any]:
    """The task file line of any task (the id after its source's prefix)."""
    prefix = f"{task.source}/"
    native = task.task_id[len(prefix):] if task.task_id.startswith(prefix) else task.task_id
    row = {"version": VERSION, "source": task.source, "id": native, "split": task.split,
           "instructions": task.instructions, "workspace": dict(task.workspace), "reference": dict(task.reference),
           "hidden_tests": _suite_row(task.hidden_tests)}
    if task.visible_tests != task.hidden_tests:
        row["visible_tests"] = _suite_row(task.visible_tests)
    if task.meta:
        row["meta"] = _plain(task.meta)
    return row


def write_task_file(tasks: Iterable[Task], out: Path) -> int:
    """Write tasks in this format, atomically (a killed run leaves no half file); the number written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task_row(task), ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(out)
    return n


def json_schema() -> dict[str, Any]:
    """The JSON Schema of one line (`didpo schema task`)."""
    return TaskRow.model_json_schema()
