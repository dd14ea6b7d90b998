"""Shared fixtures for the task-source tests: each bundled source is parsed once per session."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pipeline.tasks import BUNDLED_FILES, Task, load_source

REPO = Path(__file__).resolve().parents[3]
# The team's full data folder, beside the repository on development and CI machines (optional).
SHARED_DATA = REPO.parent / "shared" / "data"

_cache: dict[str, list[Task]] = {}


def bundled_tasks(source: str) -> list[Task]:
    """The tasks of one source's bundled file, parsed once per test session."""
    if source not in _cache:
        _cache[source] = load_source(source)
    return _cache[source]


@pytest.fixture(scope="session")
def bundled() -> dict[str, list[Task]]:
    return {source: bundled_tasks(source) for source in BUNDLED_FILES}


def write_jsonl(path: Path, rows: list, *, compress: bool = False) -> Path:
    """Write rows (dicts, or raw strings written as they are) one per line."""
    text = "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
    if compress:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def humaneval_row(number: int = 0, **changes) -> dict:
    """A small, well-formed HumanEval row (like HumanEval/0), with fields replaced by `changes`."""
    row = {
        "task_id": f"HumanEval/{number}",
        "prompt": 'def add(a, b):\n    """Return a + b.\n    >>> add(1, 2)\n    3\n    """\n',
        "canonical_solution": f"    return a + b  # solution {number}\n",  # distinct content per problem
        "test": (
            "\n\nMETADATA = {}\n\n\ndef check(candidate):\n"
            "    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
            "    assert candidate(-1, 1) == 0\n    assert candidate(2, 2) == 4\n"
        ),
        "entry_point": "add",
    }
    row.update(changes)
    return row


@pytest.fixture
def jsonl():
    """`jsonl(path, rows, compress=False)`: write a task file (helpers are fixtures: tests never import tests)."""
    return write_jsonl


@pytest.fixture
def he_row():
    """`he_row(number=0, **changes)`: a well-formed HumanEval row."""
    return humaneval_row


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The team's shared data folder (../shared/data beside the repo); tests that need it skip without it."""
    if not (SHARED_DATA / "README.md").is_file():
        pytest.skip(f"no shared data folder at {SHARED_DATA}")
    return SHARED_DATA
