"""Exercism Python practice exercises (`exercism`), packed one exercise a line (`exercism_python.jsonl`).

task_id    "exercism/<slug>" (the file's own id is already "exercism/<slug>"), split "train"
workspace  the stub files (plus any extra files the exercise ships)
reference  the example solution: the same paths as the stub files
visible    "pytest": the exercise's test files (Exercism shows its tests: they define the interface), with the
           helper modules they import (paasio's and error-handling's `test_utils.py`)
hidden     "pytest": the same test files; the reward is the pass fraction of their test functions
meta       problem "exercism:<slug>"; "timeout_s" (a wall-clock floor the judge honours) where the example
           solution is slow: `SLOW_EXERCISES`

Every module a test file imports must be the exercise's own (stub, test or extra file), the standard
library's or pytest; the loader refuses a row whose tests import anything else, naming the module. One helper
is missing from the packed file: upstream's `error-handling/test_utils.py` (its exercise config lists no
files, so the packer skipped it). `MISSING_TEST_HELPERS` supplies our own implementation of what the tests
use (`FileLike`), added to the test suite's files, not to the agent's workspace.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from pipeline.tasks.base import Task, TestSuite
from pipeline.tasks.cases import parse_python
from pipeline.tasks.records import RowModel, load_rows

_SLUG = re.compile(r"exercism/([a-z0-9][a-z0-9-]*)")

_FILE_LIKE = '''"""Test helper for error_handling_test.py (written for this project; upstream's file is not in the data)."""


class FileLike:
    """A resource that records its life: opened by `with`, closed on leaving it, however it is left.

    do_something() marks the work as done and, when fail_something is true, then raises.
    """

    def __init__(self, fail_something=True):
        self.fail_something = fail_something
        self.is_open = False
        self.was_open = False
        self.did_something = False

    def __enter__(self):
        self.is_open = True
        return self

    def __exit__(self, *exc_info):
        self.is_open = False
        self.was_open = True
        return False  # never swallows the exception

    def do_something(self):
        self.did_something = True
        if self.fail_something:
            raise RuntimeError("FileLike failed while doing something")
'''

# slug -> test helper files the packed data lacks (path -> source), added to the exercise's test files
MISSING_TEST_HELPERS: dict[str, dict[str, str]] = {"error-handling": {"test_utils.py": _FILE_LIKE}}
# slug -> wall-clock seconds the judge allows at least. killer-sudoku-helper's example solution tries every
# subset of 24 numbers for one test (2**24 sets): about 5-7 s of CPU alone, which the default 10 s deadline
# (and even 20 s) misses on a loaded machine. Its CPU need stays under the pool's CPU rlimit (10 s by
# default); only the wall deadline, which grows with load, gets room.
SLOW_EXERCISES: dict[str, float] = {"killer-sudoku-helper": 60.0}
ALLOWED_TEST_IMPORTS = frozenset(sys.stdlib_module_names) | {"pytest"}


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


def _module_names(paths) -> set[str]:
    """Top-level importable names the files provide: `a.py` -> "a", `pkg/x.py` -> "pkg"."""
    return {path.split("/", 1)[0].removesuffix(".py") for path in paths if path.endswith(".py")}


def _require_importable(test_files: dict[str, str], provided: set[str]) -> None:
    for name, text in test_files.items():
        if not name.endswith(".py"):
            continue
        for node in ast.walk(parse_python(text)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".", 1)[0]
                if top not in provided and top not in ALLOWED_TEST_IMPORTS:
                    raise ValueError(
                        f"test_files[{name!r}] line {node.lineno} imports {module!r}, which is neither a file of "
                        "the exercise (stub, test or extra file), the standard library nor pytest"
                    )


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
    test_files = {**MISSING_TEST_HELPERS.get(slug, {}), **row.test_files}  # the data's own files win
    _require_importable(test_files, _module_names([*test_files, *row.stub_files, *row.extra_files]))
    tests = TestSuite(kind="pytest", files=test_files)
    statement = "\n\n".join(part.strip() for part in (row.introduction, row.instructions) if part.strip())
    stubs = ", ".join(f"`{name}`" for name in sorted(row.stub_files))
    test_names = ", ".join(f"`{name}`" for name in sorted(row.test_files) if name.endswith("_test.py"))
    test_names = test_names or ", ".join(f"`{name}`" for name in sorted(row.test_files))
    return Task(
        task_id=f"exercism/{slug}",
        source="exercism",
        split="train",
        instructions=f"{statement}\n\nWrite your solution in {stubs}; the tests in {test_names} must pass.",
        workspace={**row.extra_files, **row.stub_files},
        visible_tests=tests,
        hidden_tests=tests,
        reference={**row.extra_files, **row.reference_files},
        meta={
            "problem": f"exercism:{slug}",
            "native_id": row.task_id,
            **({"timeout_s": SLOW_EXERCISES[slug]} if slug in SLOW_EXERCISES else {}),
        },
    )


def load_exercism(path: Path) -> list[Task]:
    """Exercism tasks from a packed JSONL file, in file order."""
    return load_rows(path, ExercismRow, _exercism_task)
