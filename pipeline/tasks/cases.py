"""Splitting HumanEval-style `check(candidate)` tests into separately scored cases, statically (no execution).

A HumanEval test is module code that defines `check(candidate)`, whose body is mostly a flat list of asserts.
One pass/fail for the whole function would make the graded step reward binary, so we cut it into cases:

1. Every top-level statement of `check`'s body that contains an `assert` is one case (a flat assert, or a
   loop/with/if block of asserts: such a block is one case, e.g. HumanEval/32's 100 random polynomials).
2. Every other statement (imports, assignments, definitions, prints) is setup: it is repeated, in order, in
   front of each case that follows it, so a case sees the same state it saw in the original function.
   Definitions (def/class/import) are setup even when they contain asserts.
3. Asserts that cannot fail (`assert True`, `assert 1, "msg"`) are dropped: they would inflate the pass
   fraction. If nothing is left, the whole body is a single case.
4. Module-level statements of the test (METADATA, imports, helpers) are kept in every case file; top-level
   `check(...)` calls (HumanEvalPack ends its tests with one) are removed: the harness calls `check`.
5. Each case file starts with `from <module> import *`: HumanEval runs solution and test in one namespace,
   and some tests use the solution's helpers (HumanEval/32 `poly`, /38 `encode_cyclic`, /50 `encode_shift`).

Case files reuse the original source lines (comments inside a statement included); if two statements share
a line, the file is rebuilt with `ast.unparse` instead (same semantics, normalised formatting).
"""

from __future__ import annotations

import ast
import copy
import threading
import warnings
from collections.abc import Sequence

from pipeline.tasks.base import TestSuite

CHECK_FUNCTION = "check"


_PARSE_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """ast.parse without the invalid-escape warnings that benchmark code (e.g. "\\d" in plain strings) raises.

    One parse at a time per process: on CPython 3.11.7, parses in two threads at once can raise
    "SystemError: AST constructor recursion depth mismatch" (seen with the judge's pool threads), and
    `warnings.catch_warnings` is not thread-safe either."""
    with _PARSE_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        return ast.parse(source)


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _is_check_call(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == CHECK_FUNCTION
    )


def _is_trivial_assert(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant) and bool(node.test.value)


def _is_definition(node: ast.stmt) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))


def _contains_assert(node: ast.stmt) -> bool:
    return any(isinstance(sub, ast.Assert) for sub in ast.walk(node))


def _lines_overlap(spans: list[tuple[int, int]]) -> bool:
    ordered = sorted(spans)
    return any(prev_end >= start for (_, prev_end), (start, _) in zip(ordered, ordered[1:], strict=False))


def _find_check(tree: ast.Module) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == CHECK_FUNCTION]
    if len(found) != 1:
        raise ValueError(
            f"test must define exactly one top-level `{CHECK_FUNCTION}` function, found {len(found)}"
        )
    check = found[0]
    args = check.args
    if len(args.posonlyargs) + len(args.args) != 1 or args.vararg or args.kwonlyargs or args.kwarg:
        raise ValueError(f"`{CHECK_FUNCTION}` must take exactly one argument (the function under test)")
    return check


def split_check(test_source: str, *, module: str) -> list[str]:
    """Cut a `check(candidate)` test into self-contained case files (rules in the module docstring).

    Returns one Python source text per case, each defining `check(<same parameter>)`, in original order.
    Raises ValueError when the test does not parse or has no single one-argument `check`.
    """
    try:
        tree = parse_python(test_source)
    except SyntaxError as exc:
        raise ValueError(f"test does not parse: {exc.msg} (test line {exc.lineno})") from None
    check = _find_check(tree)
    param = (check.args.posonlyargs + check.args.args)[0].arg
    module_stmts = [n for n in tree.body if n is not check and not _is_check_call(n)]

    groups: list[list[ast.stmt]] = []  # each: setup statements so far + one case statement
    setup: list[ast.stmt] = []
    for stmt in check.body:
        if _is_trivial_assert(stmt):
            continue
        if _is_definition(stmt) or not _contains_assert(stmt):
            setup.append(stmt)
        else:
            groups.append([*setup, stmt])
    if not groups:
        groups = [list(check.body)]

    header = f"from {module} import *  # noqa: F403 (tests may use the solution's helpers)"
    others = [n for n in tree.body if n is not check]
    spans = [(_first_line(n), n.end_lineno or n.lineno) for n in [*others, *check.body]]
    spans.append((_first_line(check), max(check.lineno, check.body[0].lineno - 1)))  # `def check(...):`
    if _lines_overlap(spans):
        return [_render_unparsed(header, module_stmts, check, body) for body in groups]
    lines = test_source.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as Python counts lines

    def text(node: ast.stmt) -> str:
        return "\n".join(lines[_first_line(node) - 1 : node.end_lineno])

    prelude = "\n".join(text(n) for n in module_stmts)
    cases = []
    for body in groups:
        parts = [header, prelude, f"def {CHECK_FUNCTION}({param}):\n" + "\n".join(text(n) for n in body)]
        cases.append("\n\n\n".join(p for p in parts if p) + "\n")
    return cases


def _render_unparsed(
    header: str, module_stmts: list[ast.stmt], check: ast.FunctionDef, body: list[ast.stmt]
) -> str:
    func = copy.copy(check)
    func.body, func.decorator_list = body, []
    tree = ast.Module(body=[*module_stmts, func], type_ignores=[])
    return f"{header}\n\n{ast.unparse(ast.fix_missing_locations(tree))}\n"


def case_files(cases: Sequence[str], prefix: str) -> dict[str, str]:
    """Name case texts `<prefix>_00.py`, `<prefix>_01.py`, ... (zero-padded so names sort in case order)."""
    width = max(2, len(str(len(cases) - 1)))
    return {f"{prefix}_{i:0{width}d}.py": text for i, text in enumerate(cases)}


def visible_case_count(n_cases: int) -> int:
    """How many leading cases of a check test are shown to the agent: half, at least 1, at most 3.

    n=1 -> 1 (the only case is both visible and hidden), 3 -> 1 (MBPP), 7 -> 3 (typical HumanEval).
    """
    return max(1, min(3, n_cases // 2))


def _pytest_functions(source: str) -> int:
    tree = parse_python(source)
    count = 0
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        count += sum(
            isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")
            for m in members
        )
    return count


def count_cases(suite: TestSuite) -> int:
    """Number of separately scored cases, statically: io inputs, check files, or pytest test functions.

    `TestSuite.n_cases` counts pytest *files*; this counts the `test*` functions in them (module level and
    class methods), which is what a pytest run scores. At least 1.
    """
    if suite.kind == "pytest":
        return max(1, sum(_pytest_functions(text) for text in suite.files.values()))
    return suite.n_cases
