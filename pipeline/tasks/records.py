"""Reading task files: JSON Lines, plain or gzip, one task per line, refused loudly when malformed.

Every loader goes through `load_rows`: it reads the file line by line, validates each line against the
loader's row model (pydantic, strict types) and converts it to a `Task`; any problem becomes a
`TaskFormatError` naming the file and the line, so a bad row is never skipped or half-loaded.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.tasks.base import Task

_GZIP_MAGIC = b"\x1f\x8b"

Row = TypeVar("Row", bound=BaseModel)


class TaskFormatError(ValueError):
    """A task file that does not match its format. `path` and `line` (1-based, None for the whole file)."""

    def __init__(self, path: Path | str, line: int | None, message: str):
        self.path = Path(path)
        self.line = line
        self.reason = message
        where = f"{self.path}:{line}" if line is not None else f"{self.path}"
        super().__init__(f"{where}: {message}")


class RowModel(BaseModel):
    """Base of the per-format row models: strict types (no silent coercion), unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


def _open_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as probe:
        compressed = probe.read(2) == _GZIP_MAGIC
    opener = gzip.open if compressed else open
    with opener(path, "rb") as stream:
        yield from stream


def read_jsonl(path: Path) -> Iterator[tuple[int, object]]:
    """Yield (line number, decoded JSON value) for every non-blank line of a plain or gzip JSONL file."""
    line_no = 0
    try:
        for line_no, raw in enumerate(_open_lines(path), start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TaskFormatError(
                    path, line_no, f"not UTF-8 text ({exc.reason} at byte {exc.start})"
                ) from exc
            try:
                yield line_no, json.loads(text)
            except json.JSONDecodeError as exc:
                raise TaskFormatError(path, line_no, f"bad JSON: {exc.msg} at column {exc.colno}") from exc
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TaskFormatError(path, line_no + 1, f"corrupt gzip stream ({exc})") from exc


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem, e.g. "field 'prompt': Input should be a valid string (got int)"."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "<row>"
        got = "" if error["type"] == "missing" else f" (got {type(error['input']).__name__})"
        parts.append(f"field '{field}': {error['msg']}{got}")
    return "; ".join(parts)


def load_rows(path: Path, model: type[Row], convert: Callable[[Row], Task | None]) -> list[Task]:
    """Parse every line of `path` as `model`, convert it to a Task (None = deliberately dropped).

    Raises TaskFormatError (file and line) on bad JSON, a non-object line, a missing or mistyped field,
    content the converter refuses (it raises ValueError), a task id seen twice in the file, or no line at all.
    """
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    n_rows = 0
    for line_no, value in read_jsonl(path):
        n_rows += 1
        if not isinstance(value, dict):
            raise TaskFormatError(path, line_no, f"expected a JSON object, got {type(value).__name__}")
        try:
            row = model.model_validate(value)
        except ValidationError as exc:
            raise TaskFormatError(path, line_no, describe_validation_error(exc)) from exc
        try:
            task = convert(row)
        except ValueError as exc:
            raise TaskFormatError(path, line_no, str(exc)) from exc
        if task is None:
            continue
        if task.task_id in first_line:
            raise TaskFormatError(
                path, line_no, f"duplicate task {task.task_id!r} (first on line {first_line[task.task_id]})"
            )
        first_line[task.task_id] = line_no
        tasks.append(task)
    if n_rows == 0:
        raise TaskFormatError(path, None, "no tasks: the file is empty")
    return tasks
