"""Exercism Python practice exercises (`exercism`), packed one exercise a line (`exercism_python.jsonl`).

task_id    "exercism/<slug>" (the file's own id is already "exercism/<slug>"), split "train"
workspace  the stub files (plus any extra files the exercise ships)
reference  the example solution: the same paths as the stub files
visible    "pytest": the exercise's test files (Exercism shows its tests: they define the interface)
hidden     "pytest": the same test files; the reward is the pass fraction of their test functions
meta       problem "exercism:<slug>"
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.tasks.base import Task, TestSuite
from pipeline.tasks.cases import parse_python
from pipeline.tasks.records import RowModel, load_rows

_SLUG = re.compile(r"exercism/([a-z0-9][a-z0-9-]*)")


class ExercismRow(RowModel):
    task_id: str
    instructions: str
    introduction: str
    stub_files: dict[str, str]
    test_files: dict[str, str]
    reference_files: dict[str, str]
    extra_files: dict[str, str]


def _require_python(files: dict[str, str], field: str) -> None:
    for name, text in files.items():
        if name.endswith(".py"):
            try:
                parse_python(text)
            except SyntaxError as exc:
                raise ValueError(f"{field}[{name!r}] does not parse: {exc.msg} (line {exc.lineno})") from None


def _exercism_task(row: ExercismRow) -> Task:
    match = _SLUG.fullmatch(row.task_id)
    if match is None:
        raise ValueError(f"task_id {row.task_id!r} does not look like 'exercism/<slug>'")
    slug = match.group(1)
    for field in ("stub_files", "test_files", "reference_files"):
        if not getattr(row, field):
            raise ValueError(f"field '{field}' is empty")
    if set(row.reference_files) != set(row.stub_files):
        raise ValueError(
            f"reference_files {sorted(row.reference_files)} must have the paths of stub_files {sorted(row.stub_files)}"
        )
    if clash := set(row.test_files) & (set(row.stub_files) | set(row.extra_files)):
        raise ValueError(f"test_files and the workspace share paths {sorted(clash)}")
    _require_python(row.reference_files, "reference_files")
    _require_python(row.test_files, "test_files")
    tests = TestSuite(kind="pytest", files=row.test_files)
    statement = "\n\n".join(part.strip() for part in (row.introduction, row.instructions) if part.strip())
    stubs = ", ".join(f"`{name}`" for name in sorted(row.stub_files))
    test_names = ", ".join(f"`{name}`" for name in sorted(row.test_files))
    return Task(
        task_id=f"exercism/{slug}",
        source="exercism",
        split="train",
        instructions=f"{statement}\n\nWrite your solution in {stubs}; the tests in {test_names} must pass.",
        workspace={**row.extra_files, **row.stub_files},
        visible_tests=tests,
        hidden_tests=tests,
        reference={**row.extra_files, **row.reference_files},
        meta={"problem": f"exercism:{slug}", "native_id": row.task_id},
    )


def load_exercism(path: Path) -> list[Task]:
    """Exercism tasks from a packed JSONL file, in file order."""
    return load_rows(path, ExercismRow, _exercism_task)
