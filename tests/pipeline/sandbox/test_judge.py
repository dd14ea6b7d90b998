from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import subprocess
import sys

import pytest

from pipeline.sandbox import InfraError, Judge, SandboxPool, SandboxSettings, _worker
from pipeline.sandbox._worker import NotPlain, decode, encode
from pipeline.tasks import load_source
from pipeline.tasks.base import Task, TestSuite
from pipeline.tasks.checks import OUTPUT_CHECKS, output_matches, outputs_equal

GOOD = "def add(a, b):\n    return a + b\n"


@pytest.mark.parametrize("value", [None, True, 0, -(2**70), 1.5, float("inf"), "x", b"\x00", 1 + 2j,
                                   [1, (2, {3})], {"a": [frozenset({1})], 2: None}, ()])
def test_codec_round_trip(value):
    back = decode(encode(value))
    assert back == value and type(back) is type(value)
    assert math.isnan(decode(encode(float("nan"))))


def test_codec_sends_subclasses_as_their_builtin_value_and_refuses_objects():
    class Liar(int):
        def __eq__(self, other):
            return True

    class Word(str):
        def __eq__(self, other):
            return True

    for liar, plain in ((Liar(3), 3), (Word("ab"), "ab"), ([Liar(1)], [1])):
        back = decode(encode(liar))
        assert back == plain and type(back) is type(plain) and back != Liar(4)  # the lie stays behind
    assert decode(encode(Word("ab"))) != "zz"
    for v in (object(), [1, object()], lambda: 1):
        with pytest.raises(NotPlain):
            encode(v)
    with pytest.raises(ValueError):
        decode({"zz": 1})


def _case_details(source: str, candidate) -> list[str | None]:
    """Each case's outcome text (None: passed) when `source`'s check runs against `candidate` in process."""
    code, _ = _worker.instrument_check(source, "check_0.py")
    seen = []
    ns = {"__didpo_case__": lambda i, exc: seen.append(None if exc is None else _worker._exc_text(exc)),
          "__didpo_shown__": _worker._shown}
    exec(code, ns)
    ns["check"](candidate)
    return seen


def test_a_failing_assert_shows_the_values_it_compared():
    source = ("def check(candidate):\n"
              "    assert candidate(2) == 4\n"
              "    assert candidate(3) in (9, 10)\n"
              "    assert candidate(0)\n"
              "    assert 0 < candidate(1) < 1\n"
              "    assert candidate(5) == 25, 'the test says why'\n"
              "    assert candidate(2) == 5\n")
    calls = []

    def square_ish(x):
        calls.append(x)
        return x * x if x != 3 else 8

    assert _case_details(source, square_ish) == [
        None, "AssertionError: assert 8 in (9, 10)", "AssertionError: assert 0", "AssertionError: assert False",
        None, "AssertionError: assert 4 == 5"]
    assert calls == [2, 3, 0, 1, 5, 2]  # every side evaluated once, in the original order


def test_shown_values_are_bounded_and_never_fail_open():
    source = "def check(candidate):\n    assert candidate(1) == [0]\n    assert candidate(2) == 1\n"
    huge = {1: list(range(10**6)), 2: 10**5000}
    first, second = _case_details(source, huge.get)
    assert first.startswith("AssertionError: assert [0, 1, 2,") and len(first) < 120
    assert second == "AssertionError: assert <int> == 1"  # past Python's digit limit: named, still failed
    assert _case_details("def check(candidate):\n    assert candidate(1) == 1\n", {1: 1}.get) == [None]


def test_codec_sends_stdlib_dict_subclasses_as_plain_dicts():
    # e.g. Mbpp/88's reference returns a Counter; a plain dict with the same items is the same answer
    for value in (collections.Counter("abca"), collections.OrderedDict(b=1, a=2), collections.defaultdict(int, a=2)):
        back = decode(encode(value))
        assert type(back) is dict and back == dict(value)


def test_check_cases_are_labelled_with_their_first_line():
    """Case labels: each asserting statement's own first line, with lines counted as the parser counts them
    (\r\n and \r line ends; a form feed inside a string literal is no line end), non-ASCII text included."""
    source = (
        "def check(candidate):\r\n"
        "    x = 1\r"
        "    assert candidate('\x0c') == 'ü'  # why\n"
        "    for i in range(2):\n"
        "        assert candidate(i) == i\n"
        "    é = 2; assert candidate(é) == é\n"
        "check(None)\n"
    )
    code, cases = _worker.instrument_check(source, "check_0.py")
    assert [(c["line"], c["source"]) for c in cases] == [
        (3, "assert candidate('\x0c') == 'ü'"),
        (4, "for i in range(2):"),
        (6, "assert candidate(é) == é"),
    ]
    seen = []
    ns = {"__didpo_case__": lambda i, exc: seen.append((i, type(exc).__name__ if exc else None)),
          "__didpo_shown__": _worker._shown}
    exec(code, ns)  # the module-level check(None) was dropped: the harness calls check itself
    ns["check"](lambda v: {"\x0c": "ü", 1: 0}.get(v, v))
    assert seen == [(0, None), (1, "AssertionError"), (2, None)]


def test_outputs_equal_tolerance_and_types():
    assert outputs_equal([1.0, (2,)], [1.0 + 1e-9, (2,)], 0.0)
    assert not outputs_equal([1, 2], (1, 2), 0.0)
    assert outputs_equal(float("nan"), float("nan"), 0.0) and not outputs_equal(1.0, 1.1, 0.05)


HUGE = 10**400  # beyond float range: float(HUGE) raises OverflowError


@pytest.mark.parametrize("actual", [float("nan"), float("inf"), -float("inf"), 1e308, 0.0, 2.5, HUGE + 1])
@pytest.mark.parametrize("check", OUTPUT_CHECKS)
def test_checks_are_total_on_ints_beyond_float_range(check, actual):
    """A task whose answer is a huge int (HumanEval/83's 10**n counts) met with a float: the comparison says
    no pass (the candidate's failure) instead of raising out of the judge (the liar_float attack found it)."""
    args = [(HUGE, 3)] if check in ("surface_area", "digit_distance") else [(HUGE,)]
    for expected, got in ((HUGE, actual), (actual, HUGE)):
        passed = output_matches(check, expected, got, *args, 0.0)
        assert passed in (True, False)
        assert passed is False or check == "any" or (check == "equal_or_zero" and got == 0)
    assert outputs_equal(HUGE, HUGE, 0.0) and outputs_equal(2**60, float(2**60), 0.0)
    assert not outputs_equal(HUGE, float("inf"), 0.0)


# (check, expected, actual, args, atol, passes): hand-made cases on both sides of each EvalPlus oracle
ORACLE_CASES = [
    ("equal", [1.0, 2], [1.0 + 1e-9, 2], (), 0.0, True),
    ("equal", [1, 2], [2, 1], (), 0.0, False),
    ("set", [1, 2, 3], [3, 1, 2], (), 0.0, True),
    ("set", [1, 2, 3], (2, 1, 3, 3), (), 0.0, True),
    ("set", [1, 2, 3], [1, 2], (), 0.0, False),
    ("set", [1, 2], [[1], [2]], (), 0.0, False),  # unhashable items: no set, no pass
    ("set", [1, 2], None, (), 0.0, False),
    ("not_none", True, True, (), 0.0, True),
    ("not_none", False, False, (), 0.0, True),
    ("not_none", True, False, (), 0.0, False),
    ("not_none", True, 1, (), 0.0, False),
    ("any", [1, 2], "whatever", (), 0.0, True),
    ("equal_or_zero", 12, 12, (), 0.0, True),
    ("equal_or_zero", 12, 0, (), 0.0, True),
    ("equal_or_zero", 12, 11, (), 0.0, False),
    ("equal_or_zero", 12, False, (), 0.0, False),
    ("surface_area", 33, 33, (3, 4), 0.0, True),  # the reference's own answer
    ("surface_area", 33, 35, (3, 4), 0.0, True),  # round(9 + 6 * sqrt(2.25 + 16)) = round(34.63) = 35
    ("surface_area", 33, 34, (3, 4), 0.0, False),
    ("surface_area", 33, "35", (3, 4), 0.0, False),
    ("surface_area", 33, 36.0, (3, 4), 1.5, True),
    ("digit_distance", 6, 6, (123, 256), 0.0, True),
    ("digit_distance", 8, 9, (9, 123), 0.0, True),  # 009 vs 123: 1 + 2 + 6 (the reference zips "9", "1")
    ("digit_distance", 8, 10, (9, 123), 0.0, False),
    ("digit_distance", 3, 4, (-1, 5), 0.0, False),  # a negative number has no digit distance: equality only
    ("poly_root", 0.5, -0.5, ([1, 2],), 1e-4, True),  # 1 + 2x: the root, whatever the reference said
    ("poly_root", -0.5, 0.5, ([1, 2],), 1e-4, False),
    ("poly_root", 1.0, -1.0, ([-1, 0, 1],), 1e-4, True),  # x^2 - 1: either root
    ("poly_root", 1.0, 1.001, ([-1, 0, 1],), 1e-4, False),
    ("poly_root", 1.0, "1.0", ([-1, 0, 1],), 1e-4, False),
    ("poly_root", 1.0, 1e300, ([-1, 0, 1],), 1e-4, False),  # overflow fails, never raises
    ("poly_root", 1.0, float("nan"), ([-1, 0, 1],), 1e-4, False),
]


@pytest.mark.parametrize(("check", "expected", "actual", "args", "atol", "passes"), ORACLE_CASES)
def test_output_checks_follow_evalplus_oracles(check, expected, actual, args, atol, passes):
    assert output_matches(check, expected, actual, args, atol) is passes


def test_every_output_check_has_cases_both_ways_and_unknown_checks_are_refused():
    assert {(c[0], c[-1]) for c in ORACLE_CASES} >= {(c, v) for c in OUTPUT_CHECKS for v in (True, False)
                                                     if (c, v) != ("any", False)}
    with pytest.raises(ValueError, match="unknown output check 'fuzzy'; allowed: equal, set"):
        output_matches("fuzzy", 1, 1, (), 0.0)


def _io_task(reference: str, inputs: tuple, output_check: str, entry_point: str = "f", **meta) -> Task:
    suite = TestSuite(kind="io", entry_point=entry_point, module="solution", inputs=inputs, atol=1e-4)
    return Task(task_id="handmade/io", source="handmade", split="test", instructions="f", workspace=
                {"solution.py": "def f(x):\n    pass\n"}, visible_tests=suite, hidden_tests=suite,
                reference={"solution.py": reference}, meta={"output_check": output_check, **meta})


@pytest.mark.slow
def test_humaneval_32_accepts_any_root_and_refuses_a_wrong_one(judge):
    (task,) = [t for t in load_source("humanevalplus") if t.task_id == "humanevalplus/HumanEval/32"]
    assert task.meta["output_check"] == "poly_root"
    reference = task.reference["solution.py"]
    assert judge.run(task, task.reference, hidden=True).status == "passed"
    # a different root than the reference's Newton iteration finds, on a polynomial with two of them
    # (x + 2)(x - 1) and (x + 3)(x - 2): Newton from 0 finds 1 and 2; the candidate returns the other root
    two_roots = _io_task(reference, (([-2, 1, 1],), ([-6, 1, 1],)), "poly_root", entry_point="find_zero")
    smaller = "    c, b, a = xs\n    return (-b - math.sqrt(b * b - 4 * a * c)) / (2 * a)\n"
    negative = reference + "\n\ndef find_zero(xs):\n" + smaller
    assert judge.run(two_roots, {"solution.py": negative}).status == "passed"
    wrong = judge.run(task, {"solution.py": reference.replace("    return x\n", "    return x + 0.5\n")})
    assert wrong.status == "failed" and wrong.passed < wrong.total / 2, wrong.passed


def test_not_none_compares_what_a_match_object_reduces_to(judge):
    reference = "import re\n\ndef f(x):\n    return re.search('^a', x)\n"
    task = _io_task(reference, (("apple",), ("pear",), ("avocado",)), "not_none")
    assert judge.run(task, {"solution.py": "def f(x):\n    return x.startswith('a')\n"}).status == "passed"
    assert judge.run(task, {"solution.py": "def f(x):\n    return x or None\n"}).passed == 2
    assert judge.run(task, {"solution.py": "def f(x):\n    return None\n"}).passed == 1
    # the same reference under plain equality has no plain output to compare with: refused, never "passed"
    opaque = judge.run(_io_task(reference, (("apple",),), "equal"), {"solution.py": reference})
    assert opaque.status == "infra_error" and "no plain data" in opaque.detail


def test_an_output_too_large_to_print_is_scored_not_raised(judge):
    """10**5000 is plain data but beyond the digit limit of repr(); a list nested past the recursion limit
    likewise: the judge describes them in the failing case instead of raising (found by a harmful mutation
    in benchmarks/credit_fidelity.py)."""
    task = _io_task("def f(x):\n    return x\n", ((1,), (2,)), "equal")
    huge = judge.run(task, {"solution.py": "def f(x):\n    return 10 ** 5000 if x == 2 else x\n"})
    assert huge.status == "failed" and huge.passed == 1
    assert "too large to show" in next(c.detail for c in huge.cases if not c.passed)
    deep = judge.run(task, {"solution.py": "def f(x):\n    out = []\n    for _ in range(5000):\n"
                                           "        out = [out]\n    return out if x == 2 else x\n"})
    assert deep.status in ("failed", "crashed") and deep.passed == 1


def test_set_check_through_the_sandbox(judge):
    task = _io_task("def f(x):\n    return sorted(set(x))\n", (([3, 1, 3],), ([2, 2],)), "set")
    assert judge.run(task, {"solution.py": "def f(x):\n    return list(set(x))[::-1]\n"}).status == "passed"
    assert judge.run(task, {"solution.py": "def f(x):\n    return x\n"}).status == "passed"  # duplicates
    assert judge.run(task, {"solution.py": "def f(x):\n    return x[:1]\n"}).passed == 1


def test_task_timeout_is_a_floor_on_the_wall_deadline(pool, task_factory):
    slow = {"test_slow.py": "import time\n\n\ndef test_sleepy():\n    time.sleep(1.0)\n"}
    base = task_factory("pytest", tests=slow)
    judge = Judge(pool, timeout_s=0.5)  # sleeping costs no CPU: only the wall deadline can end it
    assert judge.run(base, {"solution.py": GOOD}).status == "timeout"
    roomy = dataclasses.replace(base, meta={"timeout_s": 8.0})
    assert judge.run(roomy, {"solution.py": GOOD}).status == "passed"
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        judge.run(dataclasses.replace(base, meta={"timeout_s": -1}), {"solution.py": GOOD})


def test_a_slow_reference_gets_its_own_deadline_and_the_candidate_keeps_its_own(pool, monkeypatch):
    """The reference's run (an io suite's expected outputs) is ours: cut off at the candidates' deadline, as on
    a loaded box, every run of the task was an infra_error. The candidate is still held to the judge's."""
    sleepy = "import time\n\n\ndef f(x):\n    time.sleep(0.4)\n    return x\n"  # sleeping: wall time, no CPU
    task = _io_task(sleepy, ([1], [2]), "equal")  # 0.8 s of reference against a 0.5 s deadline
    judge = Judge(pool, timeout_s=0.5)
    assert judge.run(task, {"solution.py": "def f(x):\n    return x\n"}).status == "passed"
    assert judge.run(task, {"solution.py": sleepy}).status == "timeout"
    assert judge.run(task, {"solution.py": "def f(x):\n    return -x\n"}).status == "failed"
    monkeypatch.setattr(pool, "settings", pool.settings.model_copy(update={"reference_timeout_s": 0.5}))
    cut = Judge(pool, timeout_s=0.5)
    runs = []
    monkeypatch.setattr(cut, "_execute", lambda job, timeout: runs.append(timeout) or Judge._execute(cut, job, timeout))
    for _ in range(2):  # the reference's failure is the task's: cached, not paid again by each candidate
        result = cut.run(task, {"solution.py": "def f(x):\n    return x\n"})
        assert result.status == "infra_error" and "did not complete its io harness" in result.detail, result
    assert runs == [0.5]
    with pytest.raises(ValueError, match="reference_timeout_s must be > 0 seconds"):
        SandboxSettings(reference_timeout_s=0)


@pytest.mark.slow
def test_exercism_helpers_import_and_skips_are_no_cases(judge):
    tasks = {t.task_id: t for t in load_source("exercism", ids=["exercism/error-handling", "exercism/alphametics"])}
    handling = tasks["exercism/error-handling"]
    ref = judge.run(handling, handling.reference, hidden=True)
    assert ref.status == "passed" and ref.total == 5, ref
    assert judge.run(handling, handling.workspace, hidden=True).status == "failed"
    alphametics = tasks["exercism/alphametics"]
    ref = judge.run(alphametics, alphametics.reference, hidden=True)
    tests = alphametics.hidden_tests.files["alphametics_test.py"]
    assert tests.count("@unittest.skip(") == 1
    assert ref.status == "passed" and ref.total == tests.count("    def test_") - 1, ref


@pytest.mark.parametrize("kind", ["check", "io", "pytest"])
def test_kinds_pass_good_and_fail_bad(judge, task_factory, kind):
    task = task_factory(kind)
    good = judge.run(task, {"solution.py": GOOD})
    assert good.status == "passed" and good.passed == good.total > 0, good
    bad = judge.run(task, {"solution.py": "def add(a, b):\n    return a + b if a < 5 else 0\n"})
    assert bad.status == "failed" and 0 < bad.passed < bad.total, bad
    assert bad.isolation == judge.pool.isolation
    broken = judge.run(task, {"solution.py": "def add(a, b)\n    return a + b\n"})
    assert broken.status in ("crashed", "failed") and broken.passed == 0


def test_a_float_against_an_answer_beyond_float_range_is_the_candidates_failure(judge, task_factory):
    """The liar_float attack on HumanEval/83 (answers like 18 * 10**(n-2)) once raised OverflowError out of
    the judge; through the whole path, every float answer now simply fails."""
    task = task_factory("io")
    task = dataclasses.replace(task, hidden_tests=dataclasses.replace(task.hidden_tests, inputs=([HUGE, 1], [1, 2])))
    for answer in ("float('nan')", "float('inf')", "1e308", "float(a % 7)"):
        res = judge.run(task, {"solution.py": f"def add(a, b):\n    return {answer}\n"}, hidden=True)
        assert res.status == "failed" and res.passed <= 1, (answer, res)
    assert judge.run(task, task.reference, hidden=True).status == "passed"


@pytest.mark.slow
def test_bundled_references_pass_and_buggy_fail(judge):
    for task in load_source("humanevalfix", limit=6):
        assert judge.run(task, task.reference, hidden=True).status == "passed", task.task_id
        assert judge.run(task, task.workspace, hidden=True).status != "passed", task.task_id
    for task in load_source("mbppplus", limit=3):
        assert judge.run(task, task.reference, hidden=True).status == "passed", task.task_id
        assert judge.run(task, task.workspace, hidden=True).status != "passed", task.task_id


@pytest.mark.slow
def test_dead_worker_is_an_infra_error_then_recovers(pool, judge, task_factory):
    worker = pool._slots.queue[0]
    worker.proc.kill()  # the sandbox dies under us: retried on a restarted slot
    assert judge.run(task_factory(), {"solution.py": GOOD}).status == "passed"
    no_retry = SandboxPool(SandboxSettings(pool_size=1, infra_retries=0, uid_base=62600))
    try:
        no_retry._all[0].proc.kill()
        res = Judge(no_retry).run(task_factory(), {"solution.py": GOOD})
        assert res.status == "infra_error" and res.passed == 0 and res.detail
        assert Judge(no_retry).run(task_factory(), {"solution.py": GOOD}).status == "passed"
        io_judge = Judge(no_retry)  # the pool failing on the reference's run is not cached as the task's fault
        no_retry._all[0].proc.kill()
        assert io_judge.run(task_factory("io"), {"solution.py": GOOD}).status == "infra_error"
        assert io_judge.run(task_factory("io"), {"solution.py": GOOD}).status == "passed"
    finally:
        no_retry.close()


def _startable_as(uid: int) -> bool:
    try:
        return subprocess.run([sys.executable, "-S", "-c", "pass"], user=uid, group=uid, cwd="/",
                              capture_output=True).returncode == 0
    except OSError:  # PermissionError: the interpreter's path is closed to that uid
        return False


def test_without_bwrap_the_pool_refuses_unless_rlimits_is_asked_for(caplog, task_factory):
    with pytest.raises(InfraError, match="refuses to run untrusted code.*sandbox.isolation: rlimits"):
        SandboxPool(SandboxSettings(pool_size=1, bwrap_path="/nonexistent/bwrap", uid_base=62700))
    rlimits = SandboxSettings(pool_size=1, bwrap_path="/nonexistent/bwrap", uid_base=62700, isolation="rlimits")
    if os.getuid() == 0 and not _startable_as(62700):
        # the interpreter is not startable by an unprivileged uid here (a root-only home): refused, by name
        with pytest.raises(InfraError, match="cannot start"):
            SandboxPool(rlimits)
        return
    with caplog.at_level(logging.WARNING, logger="didpo.sandbox"):
        pool = SandboxPool(rlimits)
    try:
        assert pool.isolation == "rlimits" and "NO filesystem or network isolation" in caplog.text
        for kind in ("check", "io", "pytest"):
            res = Judge(pool).run(task_factory(kind), {"solution.py": GOOD})
            assert res.status == "passed" and res.isolation == "rlimits", res
    finally:
        pool.close()


def test_settings_refuse_impossible_values():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxSettings(timeout_s=0)
    with pytest.raises(ValueError, match="output_kill_bytes"):
        SandboxSettings(output_keep_bytes=10**6, output_kill_bytes=10**5)
    with pytest.raises(ValueError):
        SandboxSettings(pool_sizes=3)


def test_tests_call_the_helpers_the_task_gives_not_the_candidates(judge):
    """HumanEval/32 checks `abs(poly(xs, candidate(xs))) < 1e-4` with the prompt's `poly`: a candidate that
    redefines `poly` to return 0 must not pass by it (found over the full set by benchmarks/judge_attacks.py)."""
    (task,) = load_source("humaneval", ids=["HumanEval/32"])
    cheat = "def poly(xs, x):\n    return 0.0\n\n\ndef find_zero(xs):\n    return 0.0\n"
    assert judge.run(task, {"solution.py": cheat}, hidden=True).status == "failed"
    assert judge.run(task, task.reference, hidden=True).status == "passed"
    honest_helper = task.reference["solution.py"].replace("def find_zero", "def _unused():\n    pass\n\n\ndef find_zero")
    assert judge.run(task, {"solution.py": honest_helper}, hidden=True).status == "passed"


def test_a_failing_case_says_where_the_candidate_raised(judge, task_factory):
    """As a traceback shows it: the candidate's file and line of the innermost frame in the workspace, also
    through a helper module and at import; an assertion the test makes (no candidate frame) names none, and
    the exception's own message is what a test comparing it sees."""
    helper = "def twice(x):\n    return 2 * y\n"
    res = judge.run(task_factory(), {"solution.py": "from helper import twice\n\ndef add(a, b):\n"
                                                    "    return twice(a) + b\n", "helper.py": helper})
    details = [c.detail for c in res.cases]
    assert details and all(d.startswith("NameError: name 'y' is not defined") and d.endswith("(helper.py, line 2)")
                           for d in details), details
    at_import = judge.run(task_factory(), {"solution.py": "X = 1\nY = undefined_name\n\ndef add(a, b):\n"
                                                          "    return a + b\n"})
    assert all("(solution.py, line 2)" in c.detail for c in at_import.cases), [c.detail for c in at_import.cases]
    wrong = judge.run(task_factory(), {"solution.py": "def add(a, b):\n    return a - b\n"})
    assert [c.detail for c in wrong.cases if not c.passed] and all(
        "line" not in c.detail for c in wrong.cases if not c.passed)
    long_message = "x" * 400
    cut = judge.run(task_factory(), {"solution.py": f"def add(a, b):\n    raise ValueError('{long_message}')\n"})
    assert all(len(c.detail) <= 300 and c.detail.endswith("(solution.py, line 2)") for c in cut.cases)
    caught = task_factory(tests={"case_0.py": "def check(candidate):\n    try:\n        candidate(1, 2)\n"
                                              "    except ValueError as e:\n        assert str(e) == 'no'\n"})
    assert judge.run(caught, {"solution.py": "def add(a, b):\n    raise ValueError('no')\n"}).status == "passed"
