"""MBPP loader (`mbpp`): the full 974-problem MBPP in HumanEval format (mxeval `mbpp_release_v1.jsonl`).

  workspace  solution.py = the prompt (signature and a docstring with the statement and the test examples)
  reference  solution.py = prompt + canonical_solution
  hidden     "check": the three asserts of `check(candidate)`, one file each (see `cases.py`)
  visible    "check": the first assert
  split      by MBPP's standard id ranges: 11-510 test, 511-600 validation, 601-974 train; 1-10 are MBPP's
             few-shot "prompt" examples and are treated as train (meta["mbpp_split"] keeps "prompt").

Problems whose reference solution does not pass its own test are dropped (`BROKEN_REFERENCES`).
meta["problem"] = "mbpp:<n>", shared with mbppplus (MBPP+ keeps MBPP's numbering).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.tasks.base import Split, Task
from pipeline.tasks.common import SOLUTION_FILE, check_suites, native_number, require_function
from pipeline.tasks.records import RowModel, load_rows

# The 15 of 974 mxeval conversions whose canonical solution fails its own test. Found by running, for every
# row, `prompt + canonical_solution + test + "check(<entry_point>)"` as one script in a fresh subprocess
# (Python 3.11, 20 s timeout) and keeping the non-zero exits; the other 959 all exit 0. Causes: broken
# indentation (64, 966); an entry point named `check` that the test's own `check` replaces (56, 349, 899,
# 967); helper classes the test needs but the reference defines inside the function (367, 601, 927); and
# wrong or platform-dependent expectations: a test rewritten by the conversion (160), set order (341, 642),
# sys.getsizeof (596), solutions that ignore their arguments (607, 631).
BROKEN_REFERENCES = frozenset({56, 64, 160, 341, 349, 367, 596, 601, 607, 631, 642, 899, 927, 966, 967})


def mbpp_problem(number: int) -> str:
    return f"mbpp:{number}"


def mbpp_original_split(number: int) -> str:
    """MBPP's own split of a problem id: prompt (1-10), test (11-510), validation (511-600), train (601+)."""
    if number < 1:
        raise ValueError(f"MBPP problem numbers start at 1, got {number}")
    if number <= 10:
        return "prompt"
    if number <= 510:
        return "test"
    if number <= 600:
        return "validation"
    return "train"


def mbpp_split(number: int) -> Split:
    """Our split of an MBPP problem: MBPP's own, with the few-shot "prompt" ids counted as train."""
    original = mbpp_original_split(number)
    return "train" if original == "prompt" else original  # type: ignore[return-value]


class MbppRow(RowModel):
    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str
    description: str


def _mbpp_task(row: MbppRow) -> Task | None:
    number = native_number(row.task_id, "MBPP")
    if number in BROKEN_REFERENCES:
        return None
    reference = row.prompt + row.canonical_solution
    require_function(reference, row.entry_point, "prompt + canonical_solution")
    visible, hidden = check_suites(row.test, row.entry_point)
    return Task(
        task_id=f"mbpp/{row.task_id}",
        source="mbpp",
        split=mbpp_split(number),
        instructions=(
            f"{row.description.strip()}\n\nWrite it as the function `{row.entry_point}` in `{SOLUTION_FILE}`, "
            "which holds its signature and examples. Keep the signature."
        ),
        workspace={SOLUTION_FILE: row.prompt},
        visible_tests=visible,
        hidden_tests=hidden,
        reference={SOLUTION_FILE: reference},
        meta={
            "problem": mbpp_problem(number),
            "native_id": row.task_id,
            "entry_point": row.entry_point,
            "mbpp_split": mbpp_original_split(number),
        },
    )


def load_mbpp(path: Path) -> list[Task]:
    """MBPP tasks from an mxeval-format JSONL file, in file order, without `BROKEN_REFERENCES`."""
    return load_rows(path, MbppRow, _mbpp_task)
