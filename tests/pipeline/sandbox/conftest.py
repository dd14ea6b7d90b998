from __future__ import annotations

import pytest

from pipeline.sandbox import Judge, SandboxPool, SandboxSettings
from pipeline.tasks.base import Task, TestSuite

ADD_TESTS = {
    "case_0.py": "from solution import *\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n",
    "case_1.py": "from solution import *\n\ndef check(candidate):\n    assert candidate(-4, 4) == 0\n"
                 "    assert candidate(10, 5) == 15\n",
}
TEST_UID_BASE = 62400  # distinct from the default, so leftovers are attributable to these tests
GOOD = "def add(a, b):\n    return a + b\n"


def make_task(kind: str = "check", tests: dict | None = None, workspace: str = "def add(a, b):\n    return 0\n",
              task_id: str = "handmade/add") -> Task:
    if kind == "io":
        suite = TestSuite(kind="io", entry_point="add", module="solution",
                          inputs=([1, 2], [-4, 4], [10, 5], [0.5, 0.25]))
    elif kind == "pytest":
        suite = TestSuite(kind="pytest", files=tests or {
            "test_add.py": "from solution import add\n\n\ndef test_small():\n    assert add(1, 2) == 3\n\n\n"
                           "def test_neg():\n    assert add(-4, 4) == 0\n\n\ndef test_big():\n    assert add(10, 5) == 15\n"})
    else:
        suite = TestSuite(kind="check", files=tests or ADD_TESTS, entry_point="add", module="solution")
    return Task(task_id=task_id, source="handmade", split="test", instructions="Implement add(a, b).",
                workspace={"solution.py": workspace}, visible_tests=suite, hidden_tests=suite,
                reference={"solution.py": GOOD})


@pytest.fixture(scope="session")
def task_factory():
    """make_task(kind="check"|"io"|"pytest", tests=None, workspace=...) -> a hand-built add(a, b) Task."""
    return make_task


@pytest.fixture(scope="session")
def pool():
    settings = SandboxSettings(pool_size=2, timeout_s=2.0, cpu_s=2, memory_bytes=768 * 1024 * 1024,
                               max_processes=16, output_kill_bytes=4 * 1024 * 1024, file_size_bytes=1024 * 1024,
                               uid_base=TEST_UID_BASE)
    with SandboxPool(settings) as p:
        yield p


@pytest.fixture(scope="session")
def judge(pool):
    return Judge(pool)
