"""Cutting `check(candidate)` tests into separately scored case files, statically."""

from __future__ import annotations

import ast

import pytest

from pipeline.tasks import TestSuite, count_cases
from pipeline.tasks.cases import case_files, split_check, visible_case_count


def check_body(case: str) -> list[str]:
    """The statements of the `check` function of a case file, unparsed."""
    tree = ast.parse(case)
    (check,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    return [ast.unparse(stmt) for stmt in check.body]


def test_flat_asserts_become_one_case_each_in_order():
    test = (
        "METADATA = {}\n\ndef check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2) == 4\n"
    )
    cases = split_check(test, module="solution")
    assert [check_body(c) for c in cases] == [["assert candidate(1) == 1"], ["assert candidate(2) == 4"]]
    for case in cases:
        assert case.startswith("from solution import *")
        assert "METADATA = {}" in case


def test_multi_line_asserts_keep_their_original_text():
    test = (
        "def check(candidate):\n    assert candidate([\n        1, 2,\n    ]) == 3  # sum\n    assert True\n"
    )
    (case,) = split_check(test, module="solution")
    assert "    assert candidate([\n        1, 2,\n    ]) == 3  # sum" in case


def test_setup_statements_are_repeated_before_every_later_case():
    test = (
        "def check(candidate):\n"
        "    import math\n"
        "    assert candidate(1) == 1\n"
        "    lst = list(range(3))\n"
        "    assert candidate(lst) == 3\n"
    )
    first, second = split_check(test, module="solution")
    assert check_body(first) == ["import math", "assert candidate(1) == 1"]
    assert check_body(second) == ["import math", "lst = list(range(3))", "assert candidate(lst) == 3"]


def test_a_block_of_asserts_is_one_case():
    test = (
        "def check(candidate):\n"
        "    assert candidate(0) == 0\n"
        "    for x in range(5):\n"
        "        assert candidate(x) == x\n"
    )
    cases = split_check(test, module="solution")
    assert len(cases) == 2
    assert check_body(cases[1])[0].startswith("for x in range(5):")


def test_asserts_that_cannot_fail_are_dropped():
    test = "def check(candidate):\n    assert candidate(1)\n    assert True\n    assert True, 'always'\n"
    assert [check_body(c) for c in split_check(test, module="solution")] == [["assert candidate(1)"]]


def test_a_check_without_asserts_is_one_case_with_its_whole_body():
    test = "def check(candidate):\n    candidate(1)\n    print('done')\n"
    (case,) = split_check(test, module="solution")
    assert check_body(case) == ["candidate(1)", "print('done')"]


def test_definitions_are_setup_even_when_they_contain_asserts():
    test = (
        "def check(candidate):\n"
        "    def same(a, b):\n"
        "        assert a == b\n"
        "    same(candidate(1), 1)\n"
        "    assert candidate(2) == 2\n"
    )
    (case,) = split_check(test, module="solution")
    assert [line.split("\n")[0] for line in check_body(case)] == [
        "def same(a, b):",
        "same(candidate(1), 1)",
        "assert candidate(2) == 2",
    ]


def test_trailing_check_calls_are_removed_and_the_parameter_name_kept():
    test = "def check(has_close):\n    assert has_close([1.0], 0.5) == False\ncheck(has_close)\n"
    (case,) = split_check(test, module="solution")
    assert "check(has_close)\n" not in case.split("def check(has_close):")[1]
    assert "def check(has_close):" in case


def test_statements_sharing_a_line_fall_back_to_unparsed_source():
    test = "def check(candidate): assert candidate(1) == 1; assert candidate(2) == 2\n"
    cases = split_check(test, module="sol")
    assert [check_body(c) for c in cases] == [["assert candidate(1) == 1"], ["assert candidate(2) == 2"]]
    assert cases[0].startswith("from sol import *")


@pytest.mark.parametrize(
    ("test", "message"),
    [
        ("def check(candidate):\n    assert (\n", "test does not parse"),
        ("def other(candidate):\n    assert candidate\n", "exactly one top-level `check` function, found 0"),
        ("def check(a, b):\n    assert a == b\n", "exactly one argument"),
        ("def check(c):\n    assert c\ndef check(c):\n    assert c\n", "found 2"),
    ],
)
def test_tests_that_are_not_check_functions_are_refused(test, message):
    with pytest.raises(ValueError, match=message):
        split_check(test, module="solution")


def test_case_files_are_named_in_sorting_order():
    names = list(case_files([f"# {i}\n" for i in range(12)], "check"))
    assert names[:2] == ["check_00.py", "check_01.py"]
    assert names == sorted(names)
    assert len(list(case_files([""] * 150, "x"))[-1]) == len("x_149.py")


@pytest.mark.parametrize(("n", "visible"), [(1, 1), (2, 1), (3, 1), (4, 2), (6, 3), (7, 3), (40, 3)])
def test_visible_case_count_is_half_clamped_to_one_to_three(n, visible):
    assert visible_case_count(n) == visible


def test_count_cases_counts_pytest_functions_in_modules_and_classes():
    suite = TestSuite(
        kind="pytest",
        files={
            "a_test.py": "import unittest\nclass T(unittest.TestCase):\n    def test_a(self): pass\n"
            "    def test_b(self): pass\n    def helper(self): pass\n",
            "b_test.py": "def test_c():\n    pass\n\n\nasync def test_d():\n    pass\n",
            "utils.py": "def make():\n    return 1\n",
        },
    )
    assert count_cases(suite) == 4
    assert suite.n_cases == 3  # the base property counts files
    io = TestSuite(kind="io", entry_point="f", module="solution", inputs=[(1,), (2,)])
    assert count_cases(io) == 2


def test_line_numbers_follow_python_not_str_splitlines():
    # A form feed inside a string is one line for Python but two for str.splitlines().
    test = 'def check(candidate):\n    assert candidate("a\x0cb") == 1\n    assert candidate("c") == 2\n'
    cases = split_check(test, module="solution")
    assert [check_body(c) for c in cases] == [
        ["assert candidate('a\\x0cb') == 1"],
        ["assert candidate('c') == 2"],
    ]
