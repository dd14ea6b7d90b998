from __future__ import annotations

import logging
import math

import pytest

from pipeline.sandbox import InfraError, Judge, SandboxPool, SandboxSettings, outputs_equal
from pipeline.sandbox._worker import NotPlain, decode, encode
from pipeline.tasks import load_source

GOOD = "def add(a, b):\n    return a + b\n"


@pytest.mark.parametrize("value", [None, True, 0, -(2**70), 1.5, float("inf"), "x", b"\x00", 1 + 2j,
                                   [1, (2, {3})], {"a": [frozenset({1})], 2: None}, ()])
def test_codec_round_trip(value):
    back = decode(encode(value))
    assert back == value and type(back) is type(value)
    assert math.isnan(decode(encode(float("nan"))))


def test_codec_refuses_subclasses_and_objects():
    class Liar(int):
        def __eq__(self, other):
            return True

    for v in (Liar(3), object(), [1, object()], lambda: 1):
        with pytest.raises(NotPlain):
            encode(v)
    with pytest.raises(ValueError):
        decode({"zz": 1})


def test_outputs_equal_tolerance_and_types():
    assert outputs_equal([1.0, (2,)], [1.0 + 1e-9, (2,)], 0.0)
    assert not outputs_equal([1, 2], (1, 2), 0.0)
    assert outputs_equal(float("nan"), float("nan"), 0.0) and not outputs_equal(1.0, 1.1, 0.05)


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


def test_bundled_references_pass_and_buggy_fail(judge):
    for task in load_source("humanevalfix", limit=6):
        assert judge.run(task, task.reference, hidden=True).status == "passed", task.task_id
        assert judge.run(task, task.workspace, hidden=True).status != "passed", task.task_id
    for task in load_source("mbppplus", limit=3):
        assert judge.run(task, task.reference, hidden=True).status == "passed", task.task_id
        assert judge.run(task, task.workspace, hidden=True).status != "passed", task.task_id


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
    finally:
        no_retry.close()


def test_fallback_is_loud_and_labelled(caplog, task_factory):
    with caplog.at_level(logging.ERROR, logger="didpo.sandbox"):
        pool = SandboxPool(SandboxSettings(pool_size=1, bwrap_path="/nonexistent/bwrap", uid_base=62700))
    try:
        assert pool.isolation == "rlimits" and "SANDBOX DEGRADED" in caplog.text
        res = Judge(pool).run(task_factory(), {"solution.py": GOOD})
        assert res.status == "passed" and res.isolation == "rlimits"
    finally:
        pool.close()
    with pytest.raises(InfraError, match="allow_fallback"):
        SandboxPool(SandboxSettings(pool_size=1, bwrap_path="/nonexistent/bwrap", allow_fallback=False))


def test_settings_refuse_impossible_values():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxSettings(timeout_s=0)
    with pytest.raises(ValueError, match="output_kill_bytes"):
        SandboxSettings(output_keep_bytes=10**6, output_kill_bytes=10**5)
    with pytest.raises(ValueError):
        SandboxSettings(pool_sizes=3)
