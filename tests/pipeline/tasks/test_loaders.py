"""Every bundled source loads into sane Tasks, with the documented visible/hidden rules and splits."""

from __future__ import annotations

import ast
import gzip
import json
import pickle
import re

import pytest

from pipeline.tasks import BUNDLED_DIR, BUNDLED_FILES, TaskFormatError, load_bundled, load_source
from pipeline.tasks.exercism import MISSING_TEST_HELPERS, SLOW_EXERCISES
from pipeline.tasks.mbpp import BROKEN_REFERENCES, mbpp_original_split

EXPECTED_COUNTS = {  # data/README.md
    "humaneval": 164,
    "humanevalplus": 164,
    "mbpp": 974 - len(BROKEN_REFERENCES),
    "mbppplus": 378,
    "humanevalfix": 164,
    "exercism": 140,
}
PROBLEM = re.compile(r"(humaneval|mbpp):\d+|exercism:[a-z0-9-]+")


def raw_rows(source: str) -> dict[str, dict]:
    """The bundled file's rows by native task id, read independently of the loaders."""
    path = BUNDLED_DIR / BUNDLED_FILES[source]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as stream:
        rows = [json.loads(line) for line in stream if line.strip()]
    return {row["task_id"]: row for row in rows}


def by_id(tasks):
    return {t.task_id: t for t in tasks}


def test_broken_mbpp_references_are_fifteen():
    assert len(BROKEN_REFERENCES) == 15


@pytest.mark.parametrize("source", list(BUNDLED_FILES))
def test_bundled_counts_match_the_data_readme(bundled, source):
    assert len(bundled[source]) == EXPECTED_COUNTS[source]


@pytest.mark.parametrize("source", list(BUNDLED_FILES))
def test_every_task_is_well_formed(bundled, source):
    for task in bundled[source]:
        assert task.source == source
        assert task.task_id.startswith(f"{source}/")
        assert task.split in ("train", "validation", "test")
        assert task.instructions.strip()
        assert task.workspace and all(text.strip() for text in task.workspace.values())
        assert set(task.reference) == set(task.workspace), task.task_id
        assert dict(task.reference) != dict(task.workspace), task.task_id
        assert PROBLEM.fullmatch(task.meta["problem"]), task.meta["problem"]
        for suite in (task.visible_tests, task.hidden_tests):
            assert suite.n_cases >= 1
            if suite.kind in ("check", "io"):
                assert suite.module == "solution" and suite.entry_point == task.meta["entry_point"]
    assert len({t.task_id for t in bundled[source]}) == len(bundled[source])


@pytest.mark.parametrize("source", ["humaneval", "mbpp", "humanevalfix"])
def test_check_cases_are_standalone_check_modules(bundled, source):
    for task in bundled[source]:
        for suite in (task.visible_tests, task.hidden_tests):
            assert suite.kind == "check"
            for name, text in suite.files.items():
                assert re.fullmatch(r"(check|example)_\d{2,}\.py", name)
                assert text.startswith("from solution import *")
                tree = ast.parse(text)
                checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
                assert len(checks) == 1 and len(checks[0].args.args) == 1, (task.task_id, name)
                assert not any(isinstance(n, ast.Expr) and "check(" in ast.unparse(n) for n in tree.body)


@pytest.mark.parametrize("source", ["humaneval", "mbpp"])
def test_visible_checks_are_the_leading_hidden_cases(bundled, source):
    for task in bundled[source]:
        hidden = list(task.hidden_tests.files.items())
        visible = list(task.visible_tests.files.items())
        assert visible == hidden[: len(visible)]
        assert len(visible) == max(1, min(3, len(hidden) // 2))


def test_humaneval_tests_are_cut_per_assert(bundled):
    tasks = by_id(bundled["humaneval"])
    raw = raw_rows("humaneval")
    # HumanEval/0's check is a flat list of 7 asserts.
    assert raw["HumanEval/0"]["test"].count("    assert ") == 7
    assert tasks["humaneval/HumanEval/0"].hidden_tests.n_cases == 7
    assert tasks["humaneval/HumanEval/0"].visible_tests.n_cases == 3
    # HumanEval/32 is one loop over random polynomials that uses the prompt's `poly`: one case.
    (case,) = tasks["humaneval/HumanEval/32"].hidden_tests.files.values()
    assert "poly(coeffs, solution)" in case and case.startswith("from solution import *")
    assert tasks["humaneval/HumanEval/0"].workspace["solution.py"] == raw["HumanEval/0"]["prompt"]


def test_humanevalfix_workspace_is_the_buggy_solution(bundled):
    raw = raw_rows("humanevalfix")
    for task in bundled["humanevalfix"]:
        row = raw[task.meta["native_id"]]
        assert task.workspace["solution.py"] == row["prompt"] + row["buggy_solution"]
        assert task.reference["solution.py"] == row["prompt"] + row["canonical_solution"]
        assert task.workspace["solution.py"] != task.reference["solution.py"]
        assert task.meta["bug_type"] == row["bug_type"]


def test_humanevalfix_shows_the_example_test_where_it_has_one(bundled):
    raw = raw_rows("humanevalfix")
    for task in bundled["humanevalfix"]:
        names = list(task.visible_tests.files)
        if task.meta["visible_from"] == "example_test":
            assert all(name.startswith("example_") for name in names)
        else:
            hidden = list(task.hidden_tests.files)
            assert names == hidden[: len(names)]
    fix0 = next(t for t in bundled["humanevalfix"] if t.task_id == "humanevalfix/Python/0")
    assert raw["Python/0"]["example_test"].count("assert ") == fix0.visible_tests.n_cases == 2
    empty = [
        t.task_id for t in bundled["humanevalfix"] if not raw[t.meta["native_id"]]["example_test"].strip()
    ]
    assert empty and all(by_id(bundled["humanevalfix"])[t].meta["visible_from"] == "test" for t in empty)


def test_humaneval_sources_share_problem_keys(bundled):
    keys = {
        s: {t.meta["problem"] for t in bundled[s]} for s in ("humaneval", "humanevalplus", "humanevalfix")
    }
    assert keys["humaneval"] == keys["humanevalplus"] == keys["humanevalfix"]
    assert "humaneval:0" in keys["humaneval"] and len(keys["humaneval"]) == 164


def test_mbpp_splits_follow_the_standard_id_ranges(bundled):
    for task in bundled["mbpp"]:
        number = int(task.meta["native_id"].split("/")[1])
        assert number not in BROKEN_REFERENCES
        assert task.meta["problem"] == f"mbpp:{number}"
        expected = {"prompt": "train"}.get(mbpp_original_split(number), mbpp_original_split(number))
        assert task.split == expected
        assert task.meta["mbpp_split"] == ("prompt" if number <= 10 else expected)
    splits = [t.split for t in bundled["mbpp"]]
    assert splits.count("test") + splits.count("validation") + splits.count("train") == 959
    assert {t.meta["mbpp_split"] for t in bundled["mbpp"]} == {"prompt", "test", "validation", "train"}


@pytest.mark.parametrize(
    ("number", "split"),
    [
        (1, "prompt"),
        (10, "prompt"),
        (11, "test"),
        (510, "test"),
        (511, "validation"),
        (600, "validation"),
        (601, "train"),
    ],
)
def test_mbpp_original_split_boundaries(number, split):
    assert mbpp_original_split(number) == split


def test_mbppplus_split_is_the_split_of_the_same_mbpp_problem(bundled):
    mbpp_split = {t.meta["problem"]: t.split for t in bundled["mbpp"]}
    checked = 0
    for task in bundled["mbppplus"]:
        if task.meta["problem"] in mbpp_split:
            assert task.split == mbpp_split[task.meta["problem"]]
            checked += 1
    assert checked > 300


@pytest.mark.parametrize("source", ["humanevalplus", "mbppplus"])
def test_io_suites_hidden_starts_with_the_visible_base_inputs(bundled, source):
    raw = raw_rows(source)
    for task in bundled[source]:
        row = raw[task.meta["native_id"]]
        visible, hidden = task.visible_tests, task.hidden_tests
        assert visible.kind == hidden.kind == "io"
        assert len(visible.inputs) == len(row["base_input"])
        assert len(hidden.inputs) == len(row["base_input"]) + len(row["plus_input"])
        assert hidden.inputs[: len(visible.inputs)] == visible.inputs
        assert hidden.atol == visible.atol == float(row["atol"])
        assert all(isinstance(args, tuple) for args in hidden.inputs)


def test_mbppplus_inputs_get_back_their_python_types(bundled):
    tasks = by_id(bundled["mbppplus"])
    assert tasks["mbppplus/Mbpp/2"].visible_tests.inputs[0] == ((3, 4, 5, 6), (5, 7, 4, 10))
    assert all(
        isinstance(a, complex) for args in tasks["mbppplus/Mbpp/252"].hidden_tests.inputs for a in args
    )
    angle = tasks["mbppplus/Mbpp/124"].visible_tests.inputs[0]
    assert isinstance(angle[0], float) and isinstance(angle[1], complex)
    assert isinstance(tasks["mbppplus/Mbpp/106"].visible_tests.inputs[0][1], tuple)
    assert tasks["mbppplus/Mbpp/793"].hidden_tests.inputs == tasks["mbppplus/Mbpp/793"].visible_tests.inputs


def test_output_checks_mark_evalplus_special_oracles(bundled):
    checks = {t.task_id: t.meta["output_check"] for s in ("humanevalplus", "mbppplus") for t in bundled[s]}
    assert checks["humanevalplus/HumanEval/32"] == "poly_root"
    assert checks["mbppplus/Mbpp/2"] == "set"
    assert checks["mbppplus/Mbpp/737"] == "not_none"
    assert checks["mbppplus/Mbpp/581"] == "surface_area"
    assert sum(v != "equal" for v in checks.values()) == 1 + 7 + 3 + 2  # find_zero; set; not_none; oracles
    assert set(checks.values()) <= {
        "equal",
        "set",
        "not_none",
        "any",
        "equal_or_zero",
        "surface_area",
        "digit_distance",
        "poly_root",
    }


def test_mbppplus_workspace_is_the_prompt_and_the_signature(bundled):
    raw = raw_rows("mbppplus")
    for task in bundled["mbppplus"]:
        row = raw[task.meta["native_id"]]
        stub = task.workspace["solution.py"]
        assert stub.startswith(row["prompt"].rstrip())
        (func,) = [n for n in ast.parse(stub).body if isinstance(n, ast.FunctionDef)]
        assert func.name == row["entry_point"]
        assert [type(s) for s in func.body] == [ast.Pass]
        assert row["canonical_solution"].strip() in task.reference["solution.py"]
        assert row["entry_point"] in task.instructions


def test_exercism_tasks_show_their_test_files(bundled):
    raw = raw_rows("exercism")
    for task in bundled["exercism"]:
        row = raw[task.meta["native_id"]]
        assert task.split == "train"
        assert task.visible_tests == task.hidden_tests
        assert task.visible_tests.kind == "pytest"
        slug = task.task_id.removeprefix("exercism/")
        assert dict(task.visible_tests.files) == {**MISSING_TEST_HELPERS.get(slug, {}), **row["test_files"]}
        assert task.meta.get("timeout_s") == SLOW_EXERCISES.get(slug)
        assert dict(task.workspace) == row["stub_files"]
        assert dict(task.reference) == row["reference_files"]
        assert row["instructions"].strip() in task.instructions
        if row["introduction"].strip():
            assert task.instructions.index(row["introduction"].strip()) < task.instructions.index(
                row["instructions"].strip()
            )
    paasio = by_id(bundled["exercism"])["exercism/paasio"]
    assert set(paasio.hidden_tests.files) == {"paasio_test.py", "test_utils.py"}


def test_error_handling_gets_its_missing_test_helper_beside_the_tests(bundled):
    raw = raw_rows("exercism")["exercism/error-handling"]
    assert "from test_utils import FileLike" in raw["test_files"]["error_handling_test.py"]
    assert "test_utils.py" not in raw["test_files"] and not raw["extra_files"]  # the packed data lacks it
    task = by_id(bundled["exercism"])["exercism/error-handling"]
    assert set(task.hidden_tests.files) == {"error_handling_test.py", "test_utils.py"}
    assert "test_utils.py" not in task.workspace and "test_utils.py" not in task.reference
    assert "`test_utils.py`" not in task.instructions  # a helper, not a test the agent must pass


def test_file_like_helper_behaves_as_the_tests_expect():
    namespace: dict = {}
    exec(MISSING_TEST_HELPERS["error-handling"]["test_utils.py"], namespace)
    calm, failing = namespace["FileLike"](fail_something=False), namespace["FileLike"](fail_something=True)
    assert (calm.is_open, calm.was_open, calm.did_something) == (False, False, False)
    with calm as handle:
        assert handle is calm and calm.is_open
        handle.do_something()
    assert (calm.is_open, calm.was_open, calm.did_something) == (False, True, True)
    with pytest.raises(Exception, match=".+"), failing as handle:
        handle.do_something()
    assert (failing.is_open, failing.was_open, failing.did_something) == (False, True, True)


def _exercism_row(test: str) -> dict:
    return {
        "task_id": "exercism/two-fer",
        "instructions": "Say hi.",
        "introduction": "",
        "stub_files": {"two_fer.py": "def two_fer():\n    pass\n"},
        "test_files": {"two_fer_test.py": test},
        "reference_files": {"two_fer.py": "def two_fer():\n    return 'hi'\n"},
        "extra_files": {},
    }


def test_exercism_tests_importing_a_file_nobody_ships_are_refused(tmp_path, jsonl):
    fine = (
        "import unittest\nimport pytest\nfrom two_fer import two_fer\n\ndef test_x():\n    assert two_fer()\n"
    )
    (task,) = load_source("exercism", jsonl(tmp_path / "ok.jsonl", [_exercism_row(fine)]))
    assert set(task.hidden_tests.files) == {"two_fer_test.py"}
    missing = "import unittest\nfrom two_fer import two_fer\nfrom helpers import Mock\n"
    with pytest.raises(
        TaskFormatError, match=r":1: test_files\['two_fer_test.py'\] line 3 imports 'helpers'"
    ):
        load_source("exercism", jsonl(tmp_path / "bad.jsonl", [_exercism_row(missing)]))


@pytest.mark.parametrize("source", list(BUNDLED_FILES))
def test_tasks_survive_pickling(bundled, source):
    # Beam pickles tasks between stages.
    sample = bundled[source][:5] + bundled[source][-5:]
    assert pickle.loads(pickle.dumps(sample)) == sample


def test_load_bundled_holds_every_source_once(bundled, monkeypatch):
    import pipeline.tasks as tasks_api

    calls = []

    def cached(source, path=None, **filters):  # the real loaders already ran for the `bundled` fixture
        calls.append((source, path, filters))
        return bundled[source]

    monkeypatch.setattr(tasks_api, "load_source", cached)
    everything = load_bundled()
    assert calls == [(source, None, {}) for source in BUNDLED_FILES]
    assert len(everything) == sum(EXPECTED_COUNTS.values())
    assert len({t.task_id for t in everything}) == len(everything)
