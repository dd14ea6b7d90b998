"""EvalPlus loaders: HumanEval+ (`humanevalplus`) and MBPP+ (`mbppplus`), tested on inputs ("io" suites).

The files hold inputs but no expected outputs: the harness computes those by running the reference in the
sandbox and compares the candidate's outputs with them (tolerance `atol`).

humanevalplus (`HumanEvalPlus[-NoExtreme].jsonl.gz`), split "test", problem "humaneval:<n>":
  workspace  solution.py = the prompt (as HumanEval);  reference = prompt + canonical_solution
mbppplus (`MbppPlus[-NoExtreme].jsonl.gz`), problem "mbpp:<n>", split = MBPP's split of the same id
  (as the `mbpp` source: the split belongs to the problem, so `split="test"` selects MBPP+'s test ids):
  workspace  solution.py = the prompt (a module docstring: statement + one example assert), then the
             signature of `entry_point` taken from the reference with the body `pass`
  reference  solution.py = the prompt docstring, then canonical_solution (its imports and helpers)
both:
  visible    "io": base_input (the original benchmark's test inputs)
  hidden     "io": base_input + plus_input
  atol       the file's `atol` (0 = exact; EvalPlus itself allows 1e-6 when outputs are floats)

Inputs are Python values, one argument tuple per case. MBPP+ stores tuples, sets and complex numbers as
JSON lists and strings; they are converted back here per task (as EvalPlus does when it loads the data),
so inputs may hold tuple, set, dict, complex, inf: move them with pickle or repr/eval, not JSON.

meta["output_check"] names how one output is compared with the reference's (EvalPlus's special oracles):
  "equal"           output == expected, or within atol for floats (the default)
  "set"             set(output) == set(expected)                       (MBPP+ order-free results)
  "not_none"        expected is reduced to `output is not None`; a bool output is compared as is
  "any"             every returned value passes                          (MBPP are_equivalent)
  "equal_or_zero"   equal, or the output is 0                            (MBPP sum_div)
  "surface_area"    equal, or within atol of round(b**2 + 2*b*sqrt((b/2)**2 + h**2))   (MBPP surface_Area)
  "digit_distance"  equal, or the digit distance of the two numbers zero-padded to one length
  "poly_root"       abs(poly(xs, output)) <= atol: any root is right      (HumanEval/32 find_zero)
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.tasks.base import Task, TestSuite
from pipeline.tasks.cases import parse_python
from pipeline.tasks.common import SOLUTION_FILE, SOLUTION_MODULE, native_number, require_function
from pipeline.tasks.humaneval import humaneval_problem
from pipeline.tasks.mbpp import mbpp_original_split, mbpp_problem, mbpp_split
from pipeline.tasks.records import RowModel, load_rows

OUTPUT_CHECKS_HUMANEVAL = {"find_zero": "poly_root"}
OUTPUT_CHECKS_MBPP = {
    **dict.fromkeys(
        (
            "similar_elements",
            "find_char_long",
            "common_in_nested_lists",
            "extract_singly",
            "larg_nnum",
            "intersection_array",
            "find_dissimilar",
            "Diff",
        ),
        "set",
    ),
    **dict.fromkeys(("check_str", "text_match_three", "text_starta_endb"), "not_none"),
    "are_equivalent": "any",
    "sum_div": "equal_or_zero",
    "surface_Area": "surface_area",
    "digit_distance_nums": "digit_distance",
}

Args = list[Any]


def _each(convert: Callable[[Any], Any]) -> Callable[[Args], Args]:
    return lambda args: [convert(arg) for arg in args]


def _first(convert: Callable[[Any], Any]) -> Callable[[Args], Args]:
    return lambda args: [convert(args[0]), *args[1:]]


def _second(convert: Callable[[Any], Any]) -> Callable[[Args], Args]:
    return lambda args: [args[0], convert(args[1]), *args[2:]]


def _items_as_tuples(items: list) -> list:
    return [tuple(item) for item in items]


def _tuple_of_tuples(items: list) -> tuple:
    return tuple(tuple(item) for item in items)


def _tuple_with_inner_tuples(items: list) -> tuple:
    return tuple(tuple(item) if isinstance(item, list) else item for item in items)


def _deep_tuple(value: Any) -> Any:
    return tuple(_deep_tuple(item) for item in value) if isinstance(value, list) else value


def _nonempty_sets(items: list) -> list:
    # EvalPlus turns an empty (or non-list) item into `{}`, an empty dict; the reference only tests emptiness.
    return [set(item) if isinstance(item, list) and item else {} for item in items]


# MBPP+ task number -> how its JSON argument list becomes the Python arguments (EvalPlus's deserialization).
# fmt: off
MBPP_ARGUMENTS: dict[int, Callable[[Args], Args]] = {
    **dict.fromkeys((2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630,
                     726, 740, 744, 809), _each(tuple)),
    **dict.fromkeys((63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780),
                    _each(_items_as_tuples)),
    **dict.fromkeys((75, 413, 444, 753), _first(_items_as_tuples)),
    **dict.fromkeys((106, 750), _second(tuple)),
    **dict.fromkeys((250, 307, 405, 446, 617, 720, 763, 808), _first(tuple)),
    **dict.fromkeys((259, 401, 445), _each(_tuple_of_tuples)),
    **dict.fromkeys((580, 615, 791), _deep_tuple),
    115: _first(_nonempty_sets),
    124: lambda args: [float(args[0]), complex(args[1])],
    252: lambda args: [complex(args[0])],
    278: _each(_tuple_with_inner_tuples),
    722: _first(lambda table: {key: tuple(value) for key, value in table.items()}),
}
# fmt: on


class EvalPlusRow(RowModel):
    task_id: str
    prompt: str
    canonical_solution: str
    entry_point: str
    base_input: list[list[Any]]
    plus_input: list[list[Any]] | dict[str, Any]  # MBPP/793 stores "no plus inputs" as {}
    atol: float


def _plus_inputs(row: EvalPlusRow) -> list[list[Any]]:
    if isinstance(row.plus_input, dict):
        if row.plus_input:
            raise ValueError(
                "field 'plus_input' must be a list of argument lists (an object only when empty)"
            )
        return []
    return row.plus_input


def _arguments(
    inputs: list[list[Any]], convert: Callable[[Args], Args] | None, what: str
) -> tuple[tuple, ...]:
    cases = []
    for index, args in enumerate(inputs):
        try:
            cases.append(tuple(convert(copy.deepcopy(args)) if convert else args))
        except (TypeError, ValueError, IndexError, AttributeError) as exc:
            raise ValueError(
                f"{what}[{index}] does not have the argument shape this task expects ({exc})"
            ) from None
    return tuple(cases)


def _io_suites(row: EvalPlusRow, convert: Callable[[Args], Args] | None) -> tuple[TestSuite, TestSuite]:
    if row.atol < 0:
        raise ValueError(f"field 'atol' must be >= 0, got {row.atol}")
    if not row.base_input:
        raise ValueError("field 'base_input' is empty: no visible test inputs")
    base = _arguments(row.base_input, convert, "base_input")
    plus = _arguments(_plus_inputs(row), convert, "plus_input")

    def suite(inputs: tuple[tuple, ...]) -> TestSuite:
        return TestSuite(
            kind="io",
            entry_point=row.entry_point,
            module=SOLUTION_MODULE,
            inputs=inputs,
            atol=float(row.atol),
        )

    return suite(base), suite(base + plus)


def _signature_stub(reference: str, entry_point: str) -> str:
    """`def entry_point(<the reference's parameters>):` with the body `pass`."""
    tree = parse_python(reference)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry_point)
    stub = copy.copy(func)
    stub.body = [ast.Pass()]
    return ast.unparse(stub)


def _humanevalplus_task(row: EvalPlusRow) -> Task:
    number = native_number(row.task_id, "HumanEval")
    reference = row.prompt + row.canonical_solution
    require_function(reference, row.entry_point, "prompt + canonical_solution")
    visible, hidden = _io_suites(row, None)
    return Task(
        task_id=f"humanevalplus/{row.task_id}",
        source="humanevalplus",
        split="test",
        instructions=(
            f"Complete the function `{row.entry_point}` in `{SOLUTION_FILE}`: its signature and docstring say "
            "what it must do. Keep the signature; you may add imports and helper functions."
        ),
        workspace={SOLUTION_FILE: row.prompt},
        visible_tests=visible,
        hidden_tests=hidden,
        reference={SOLUTION_FILE: reference},
        meta={
            "problem": humaneval_problem(number),
            "native_id": row.task_id,
            "entry_point": row.entry_point,
            "output_check": OUTPUT_CHECKS_HUMANEVAL.get(row.entry_point, "equal"),
        },
    )


def _mbppplus_task(row: EvalPlusRow) -> Task:
    number = native_number(row.task_id, "Mbpp")
    require_function(row.canonical_solution, row.entry_point, "canonical_solution")
    try:
        statement = ast.get_docstring(parse_python(row.prompt))
    except SyntaxError:
        statement = None
    if not statement:
        raise ValueError("prompt must be a module docstring holding the problem statement")
    prompt = row.prompt.rstrip() + "\n"
    workspace = f"{prompt}\n\n{_signature_stub(row.canonical_solution, row.entry_point)}\n"
    reference = f"{prompt}\n\n{row.canonical_solution.strip()}\n"
    visible, hidden = _io_suites(row, MBPP_ARGUMENTS.get(number))
    return Task(
        task_id=f"mbppplus/{row.task_id}",
        source="mbppplus",
        split=mbpp_split(number),
        instructions=(
            f"{statement}\n\nWrite it as the function `{row.entry_point}` in `{SOLUTION_FILE}`, which holds "
            "its signature. Keep the signature; you may add imports and helper functions."
        ),
        workspace={SOLUTION_FILE: workspace},
        visible_tests=visible,
        hidden_tests=hidden,
        reference={SOLUTION_FILE: reference},
        meta={
            "problem": mbpp_problem(number),
            "native_id": row.task_id,
            "entry_point": row.entry_point,
            "mbpp_split": mbpp_original_split(number),
            "output_check": OUTPUT_CHECKS_MBPP.get(row.entry_point, "equal"),
        },
    )


def load_humanevalplus(path: Path) -> list[Task]:
    """HumanEval+ tasks from an EvalPlus HumanEval+ JSONL file (full or NoExtreme), in file order."""
    return load_rows(path, EvalPlusRow, _humanevalplus_task)


def load_mbppplus(path: Path) -> list[Task]:
    """MBPP+ tasks from an EvalPlus MBPP+ JSONL file (full or NoExtreme), in file order."""
    return load_rows(path, EvalPlusRow, _mbppplus_task)
