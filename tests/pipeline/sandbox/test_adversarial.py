"""Hostile solutions: each is contained, gets the right status, earns zero reward; the pool survives."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pipeline.agent import Episode, EpisodeSettings, render_action
from pipeline.agent.grammar import Action, Edit

SETTINGS = EpisodeSettings(max_turns=3, reward_coef=1.0)

GOOD = "def add(a, b):\n    return a + b\n"


def _write_response(code: str) -> str:
    return render_action(Action("write", "try this\n", (0, 0), (Edit("write", "solution.py", "", code, None, (0, 0)),)))


def _run_hostile(judge, task_factory, code: str, kind: str = "check"):
    """One episode step that writes `code`; returns the StepResult (visible tests run in the sandbox)."""
    episode = Episode(task_factory(kind), judge, SETTINGS)
    return episode.step(_write_response(code))


def _host_sandbox_pids(uids) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            if uid in uids:
                pids.append(int(name))
    return pids


@pytest.fixture(autouse=True)
def _pool_still_works(judge, pool, task_factory):
    yield
    assert pool.alive() == pool.settings.pool_size
    assert judge.run(task_factory(), {"solution.py": GOOD}).status == "passed"
    # The worker replies first and sweeps right after (while the host reads the report): with no further
    # job, nothing of the sandbox's uids may survive that sweep.
    uids = {u for w in pool._all for u in w.uids()}
    end = time.monotonic() + 5
    while _host_sandbox_pids(uids) and time.monotonic() < end:
        time.sleep(0.01)
    assert _host_sandbox_pids(uids) == []


HOSTILE = {
    "infinite_loop": ("while True:\n    pass\n", "timeout"),
    "sleep_past_deadline": ("import time\ntime.sleep(60)\n" + GOOD, "timeout"),
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "timeout"),
    "alloc_8gb": ("x = bytearray(8 * 1024 ** 3)\n" + GOOD, "crashed"),
    "output_1gb": ("import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\n" + GOOD, "crashed"),
    "sys_exit_at_import": ("import sys\nsys.exit(0)\n" + GOOD, "crashed"),
    "os_exit_at_import": ("import os\nos._exit(0)\n" + GOOD, "crashed"),
    "kill_parent": ("import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n        os.kill(pid, 9)\n"
                    "    except OSError:\n        pass\ndef add(a, b):\n    return None\n", "failed"),
    "patch_builtins_and_asserts": (
        "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\nbuiltins.abs = lambda x: 0\n"
        "builtins.isinstance = lambda *a: True\nimport sys\nsys.modules['builtins'].print = None\n"
        "def add(a, b):\n    return None\n", "crashed"),  # U breaks its own json: it dies
    "fake_passed_lines": ("print('test_add PASSED\\n3 passed in 0.01s\\nOK')\nimport sys\n"
                          "sys.stderr.write('ALL TESTS PASSED\\n')\ndef add(a, b):\n    return -1\n", "failed"),
    "fake_result_files": (
        "import json\nfor p in ('/ws/result.json', '/tmp/result.json', 'results.xml', '/ws/.didpo_result'):\n"
        "    try:\n        open(p, 'w').write(json.dumps({'passed': 99, 'total': 99, 'status': 'passed'}))\n"
        "    except OSError:\n        pass\ndef add(a, b):\n    return -1\n", "failed"),
    "eq_always_true": ("class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
                       "def add(a, b):\n    return Yes()\n", "failed"),
    "write_pipe_fds": ("import os\nfor fd in range(3, 1024):\n    try:\n        os.write(fd, b'\\x00\\x00\\x00\\x0f{\"done\": true}')\n"
                       "    except OSError:\n        pass\ndef add(a, b):\n    return None\n", "crashed"),  # corrupts its own channel
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_check_task(judge, task_factory, name):
    code, status = HOSTILE[name]
    step = _run_hostile(judge, task_factory, code)
    assert step.exec_status == status, (step.observation, step.exec_result)
    assert step.visible_passed == 0
    assert step.step_reward == 0.0


@pytest.mark.parametrize("name", ["eq_always_true", "fake_passed_lines", "os_exit_at_import", "infinite_loop"])
def test_hostile_io_task(judge, task_factory, name):
    code, status = HOSTILE[name]
    step = _run_hostile(judge, task_factory, code, kind="io")
    assert step.exec_status == status, (step.observation, step.exec_result)
    assert step.step_reward == 0.0


def test_escape_attempts_are_contained(judge, task_factory, tmp_path):
    """Writes outside the workspace, secrets and the network: add() returns the right sum only on escape."""
    marker = tmp_path / "escaped"
    code = (
        "import os, socket\nESCAPED = []\n"
        f"for p in ('/usr/didpo_escape', '/etc/didpo_escape', {str(marker)!r}, '/root/didpo_escape', "
        f"{str(Path.cwd() / 'didpo_escape')!r}):\n"
        "    try:\n        open(p, 'w').write('x')\n        ESCAPED.append(p)\n    except OSError:\n        pass\n"
        "for p in ('/etc/shadow', os.path.expanduser('~root/.bashrc'), '/root/.bashrc'):\n"
        "    try:\n        open(p).read(1)\n        ESCAPED.append(p)\n    except OSError:\n        pass\n"
        "try:\n    os.listdir('/root/.cache')\n    ESCAPED.append('home')\nexcept OSError:\n    pass\n"
        "try:\n    s = socket.create_connection(('1.1.1.1', 53), timeout=1)\n    ESCAPED.append('net')\n"
        "except OSError:\n    pass\n"
        "def add(a, b):\n    return a + b if ESCAPED else None\n"
    )
    step = _run_hostile(judge, task_factory, code)
    assert not marker.exists() and not Path("/usr/didpo_escape").exists() and not Path("/etc/didpo_escape").exists()
    assert not (Path.cwd() / "didpo_escape").exists()
    if step.exec_result.isolation == "bwrap":
        assert step.exec_status == "failed" and step.step_reward == 0.0, step.observation
    else:  # degraded mode: files and secrets are still protected by the non-root uid, the network is not
        assert step.exec_result.isolation == "rlimits"


def test_pytest_framework_patch_and_conftest_are_refused(judge, task_factory):
    tests = {"test_add.py": "from solution import add\n\n\ndef test_one():\n    assert add(1, 2) == 3\n\n\n"
                            "def test_two():\n    assert add(2, 2) == 4\n"}
    task = task_factory("pytest", tests)
    patched = ("import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"
               "def add(a, b):\n    return 0\n")
    conftest = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                "    outcome = yield\n    rep = outcome.get_result()\n    rep.outcome = 'passed'\n")
    for files in ({"solution.py": patched}, {"solution.py": "def add(a, b):\n    return 0\n", "conftest.py": conftest},
                  {"solution.py": "def add(a, b):\n    return 0\n",
                   "pytest.ini": "[pytest]\naddopts = -p no:python\n"}):
        res = judge.run(task, files)
        assert res.status in ("failed", "crashed") and res.passed == 0, res
    assert judge.run(task, {"solution.py": GOOD}).status == "passed"


def test_hidden_tests_are_not_readable_by_the_candidate(judge, task_factory):
    """check suites never put the test files in the candidate's workspace."""
    code = "import os\nFILES = sorted(os.listdir('.'))\ndef add(a, b):\n    return a + b if FILES == ['solution.py'] else 0\n"
    assert judge.run(task_factory(), {"solution.py": code}).status == "passed"


# ---------------------------------------------------------------- the process boundary (issue: judge attacks)
READ_OWN_MEMORY = '''import gc, re, sys
TABLE = {}
for obj in gc.get_objects():
    for text in (obj if isinstance(obj, (list, tuple)) else [obj]):
        if isinstance(text, str) and "assert" in text:
            for args, want in re.findall(r"candidate\\(([^()]*)\\) == (-?\\d+)", text):
                TABLE[args.replace(" ", "")] = int(want)
def add(a, b):
    return TABLE.get(f"{a},{b}", -1)
'''


def test_candidate_memory_holds_no_test_source(judge, task_factory):
    """U is exec'd fresh: scanning its own heap finds no assert to copy answers from."""
    res = judge.run(task_factory(), {"solution.py": READ_OWN_MEMORY})
    assert res.status == "failed" and res.passed == 0, res


def test_star_import_does_not_shadow_builtins(judge, task_factory):
    tests = {"case_0.py": "from solution import *\n\ndef check(candidate):\n    assert abs(candidate(1, 2) - 3) < 1e-9\n"}
    liar = "def abs(x):\n    return 0\ndef add(a, b):\n    return 1000\n"
    assert judge.run(task_factory(tests=tests), {"solution.py": liar}).status == "failed"
    assert judge.run(task_factory(tests=tests), {"solution.py": GOOD}).status == "passed"


def test_pytest_tampering_in_the_candidate_cannot_reach_the_tester(judge, task_factory):
    bad = "def add(a, b):\n    return -1\n"  # never the right sum in these tests
    attacks = [
        "import json\n_dumps = json.dumps\njson.dumps = lambda o, **k: _dumps({**o, 'outcomes': {}}) "
        "if isinstance(o, dict) else _dumps(o, **k)\n" + bad,
        "import _pytest.reports as r\nr.TestReport.passed = property(lambda self: True)\n"
        "r.TestReport.failed = property(lambda self: False)\n" + bad,
        "class S(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return S(-1)\n",
    ]
    for code in attacks:
        for files in ({"solution.py": code}, {"solution.py": bad, "__init__.py": code, "conftest.py": code}):
            res = judge.run(task_factory("pytest"), files)
            assert res.status in ("failed", "crashed") and res.passed == 0, (code, res)


def test_a_callback_from_the_tests_cannot_be_walked_into(judge, task_factory):
    """The candidate may call what the test passes it, not read its globals or set attributes."""
    tests = {"test_map.py": "from solution import apply\n\n\ndef test_apply():\n"
                            "    assert apply(lambda x: x * 2, 3) == 6\n"}
    honest = "def apply(f, x):\n    return f(x)\n"
    assert judge.run(task_factory("pytest", tests), {"solution.py": honest}).status == "passed"
    for reach in ("f.__globals__", "f.__code__", "f.__dict__", "setattr(f, 'x', 1)"):
        code = f"def apply(f, x):\n    try:\n        {reach}\n    except Exception:\n        return -1\n    return 6\n"
        res = judge.run(task_factory("pytest", tests), {"solution.py": code})
        assert res.status == "failed", (reach, res)


def test_what_the_candidate_causes_is_never_infra_error(judge, task_factory):
    long_name = "é" * 200 + ".py"
    for kind in ("check", "io", "pytest"):
        for files in ({"solution.py": GOOD, long_name: "x = 1\n"},
                      {"solution.py": GOOD, "big.txt": "x" * (80 * 1024 * 1024)}):
            res = judge.run(task_factory(kind), files)
            assert res.status == "crashed" and res.passed == 0 and "workspace" in res.detail, (kind, res)
        # the tests live outside the workspace: a path named like a test file collides with nothing
        res = judge.run(task_factory(kind), {"solution.py": GOOD, "test_add.py/x.py": "x = 1\n"})
        assert res.status == "passed", (kind, res)
    nested = ("import os\nframe = b'[' * 100000 + b']' * 100000\n"
              "for fd in range(3, 64):\n    try:\n        os.write(fd, len(frame).to_bytes(4, 'big') + frame)\n"
              "    except OSError:\n        pass\n" + GOOD)
    for kind in ("check", "io", "pytest"):
        assert judge.run(task_factory(kind), {"solution.py": nested}).status != "infra_error"


def test_honest_code_that_forks_or_runs_a_subprocess_passes(judge, task_factory):
    code = ("import os, subprocess, sys\n"
            "def add(a, b):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n        raise SystemExit(0)\n"
            "    os.waitpid(pid, 0)\n"
            "    out = subprocess.run([sys.executable, '-c', f'print({a} + {b})'], capture_output=True, text=True)\n"
            "    return int(out.stdout)\n")
    for kind in ("check", "pytest"):
        assert judge.run(task_factory(kind), {"solution.py": code}).status == "passed"


def test_sysv_shared_memory_does_not_outlive_the_job(judge, task_factory):
    code = ("import ctypes\nlibc = ctypes.CDLL(None)\n"
            "SEGS = [libc.shmget(0, 1 << 20, 0o1000 | 0o666) for _ in range(4)]\n"  # IPC_PRIVATE | IPC_CREAT
            "import os\nSEEN = len(open('/proc/sysvipc/shm').read().splitlines()) - 1\n"
            "def add(a, b):\n    return a + b if SEEN == len([s for s in SEGS if s >= 0]) else -1\n")
    for _ in range(3):  # each job sees only its own segments: the previous job's are gone
        assert judge.run(task_factory(), {"solution.py": code}).status == "passed"


def test_concurrent_pools_get_distinct_uids(pool):
    from pipeline.sandbox import SandboxPool, SandboxSettings

    other = SandboxPool(SandboxSettings(pool_size=2, uid_base=pool.settings.uid_base, timeout_s=2.0))
    try:
        mine = {u for w in pool._all for u in w.uids()}
        theirs = {u for w in other._all for u in w.uids()}
        assert len(mine) == len(theirs) == 4 and not mine & theirs
    finally:
        other.close()


RUNAWAYS = [
    HOSTILE["fork_bomb"][0],
    HOSTILE["infinite_loop"][0],
    "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(0.3)\n"
    "        os.kill(-1, 9)\n        time.sleep(30)\n    os._exit(0)\n" + GOOD.replace("a + b", "a - b"),
    "x = []\nwhile True:\n    x.append(' ' * 10**6)\n",
    "import threading, time\nthreading.Thread(target=lambda: time.sleep(60)).start()\n"
    "def add(a, b):\n    return -1\n",
]


@pytest.mark.slow
def test_runaway_jobs_never_spoil_the_next_correct_one(judge, task_factory):
    """Runaway and correct jobs interleaved on both slots at once: every correct job is scored passed."""
    from concurrent.futures import ThreadPoolExecutor

    kinds = ("check", "pytest", "io")
    jobs = [(kinds[i % 3], code) for i in range(3) for code in RUNAWAYS for code in (code, GOOD)]
    with ThreadPoolExecutor(4) as ex:  # more threads than slots: jobs queue up behind runaways
        results = list(ex.map(lambda job: (job, judge.run(task_factory(job[0]), {"solution.py": job[1]})), jobs))
    wrong = [(kind, r.status, r.detail) for (kind, code), r in results if code == GOOD and r.status != "passed"]
    assert wrong == []
    assert all(r.status != "passed" for (_, code), r in results if code != GOOD)


def test_a_slot_restarted_from_a_short_lived_thread_keeps_running(judge, pool, task_factory):
    """bubblewrap dies with the *thread* that started it: restarts happen on the pool's keeper thread."""
    import threading

    worker = pool._slots.queue[0]
    t = threading.Thread(target=pool._restart, args=(worker,))
    t.start()
    t.join()
    import time

    time.sleep(0.3)  # the parent-death signal would have arrived by now
    assert worker.proc is not None and worker.proc.poll() is None
    for _ in range(4):
        assert judge.run(task_factory(), {"solution.py": GOOD}).status == "passed"


def test_a_path_too_deep_and_a_tree_too_deep_are_the_candidates(judge, task_factory):
    deep = {"solution.py": GOOD, "d/" * 2100 + "x.py": "x = 1\n"}
    res = judge.run(task_factory(), deep)
    assert res.status == "crashed" and "levels deep" in res.detail, res
    grow = ("import os\nos.chdir('/tmp')\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n" + GOOD)
    for kind in ("check", "pytest"):
        assert judge.run(task_factory(kind), {"solution.py": grow}).status == "passed"
        assert judge.run(task_factory(kind), {"solution.py": GOOD}).status == "passed"


def test_arithmetic_with_the_tests_values_cannot_fake_a_comparison(judge, task_factory):
    """`abs(result - expected) < eps` with a candidate object: the difference stays the candidate's object."""
    tests = {"test_add.py": "from solution import add\n\n\ndef test_close():\n"
                            "    assert abs(add(1, 2) - 3) < 1e-9\n"}
    liar = ("class Z:\n    def __sub__(self, other):\n        return 0.0\n    __rsub__ = __sub__\n"
            "def add(a, b):\n    return Z()\n")
    check = {"case_0.py": "from solution import *\n\ndef check(candidate):\n    assert abs(candidate(1, 2) - 3) < 1e-9\n"}
    assert judge.run(task_factory("pytest", tests), {"solution.py": liar}).status == "failed"
    assert judge.run(task_factory(tests=check), {"solution.py": liar}).status == "failed"
    assert judge.run(task_factory("pytest", tests), {"solution.py": GOOD}).status == "passed"


# The candidate ends on its CPU limit (SIGXCPU, here raised at once) and the harness, seeing its channel close,
# reports that and exits at the same moment: whichever the sandbox hears of first, the status is the limit's.
CPU_LIMIT_AT_IMPORT = "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)\n" + GOOD


@pytest.mark.parametrize("kind", ["check", "io"])
def test_a_candidate_ended_by_its_cpu_limit_times_out_whoever_reports_first(judge, task_factory, kind):
    statuses = [_run_hostile(judge, task_factory, CPU_LIMIT_AT_IMPORT, kind=kind).exec_status for _ in range(12)]
    assert statuses == ["timeout"] * 12


def test_a_right_candidate_that_closes_its_output_still_passes(judge, task_factory):
    """Closing stdout and stderr looks like an ended process to the sandbox, which then waits a moment for its
    exit: one that lives on past the tests (its exit replaced by a long sleep) is not taken for a crash, and is
    stopped as any other."""
    code = "import os, time\nos.close(1)\nos.close(2)\nos._exit = lambda code: time.sleep(30)\n" + GOOD
    for kind in ("check", "io"):
        assert _run_hostile(judge, task_factory, code, kind=kind).exec_status == "passed"
