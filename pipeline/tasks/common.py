"""Pieces shared by the single-function sources (HumanEval, HumanEval+, HumanEvalFix, MBPP, MBPP+)."""

from __future__ import annotations

import ast
import re

from pipeline.tasks.base import TestSuite
from pipeline.tasks.cases import case_files, parse_python, split_check, visible_case_count

SOLUTION_FILE = "solution.py"  # the one workspace file of the single-function sources
SOLUTION_MODULE = "solution"  # what test files import


def native_number(native_id: str, prefix: str) -> int:
    """The number in a native id such as "HumanEval/12" (prefix "HumanEval"); ValueError if it has another form."""
    match = re.fullmatch(rf"{re.escape(prefix)}/(\d+)", native_id)
    if match is None:
        raise ValueError(f"task_id {native_id!r} does not look like '{prefix}/<number>'")
    return int(match.group(1))


def require_function(source: str, entry_point: str, what: str) -> None:
    """ValueError unless `source` parses and defines `entry_point` at module level."""
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        raise ValueError(f"{what} does not parse: {exc.msg} (line {exc.lineno})") from None
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if entry_point not in names:
        raise ValueError(f"{what} does not define entry_point {entry_point!r}")


def check_suite(files: dict[str, str], entry_point: str) -> TestSuite:
    return TestSuite(kind="check", files=files, entry_point=entry_point, module=SOLUTION_MODULE)


def check_suites(test: str, entry_point: str) -> tuple[TestSuite, TestSuite]:
    """(visible, hidden) from one HumanEval-style test: hidden = every case, visible = the leading few.

    The number of visible cases is `cases.visible_case_count` (half, at least 1, at most 3); the visible
    files are the same files (same names) as the first hidden ones.
    """
    hidden = case_files(split_check(test, module=SOLUTION_MODULE), "check")
    visible = dict(list(hidden.items())[: visible_case_count(len(hidden))])
    return check_suite(visible, entry_point), check_suite(hidden, entry_point)
