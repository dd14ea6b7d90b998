"""The program that runs inside each sandbox slot (stdlib only; also imported by the host for the codec).

One worker process per pool slot stays warm inside bubblewrap. For every job it:

1. checks the slot is clean (no process of its uids left), wipes and refills the private workspace (/ws),
   /tmp, /dev/shm and the test directory (/tests), as root *inside* the sandbox;
2. starts two confined processes: U, a freshly exec'd interpreter that imports the candidate's modules and
   never sees a test, and T, the trusted tester (forked from this worker, so it has the job);
3. watches them against a wall-clock deadline, caps their output, and finally kills every process left
   under the slot's uids (``kill(-1)`` from a process that has the uid), so nothing outlives the job.

Confinement of both: new session, rlimits, no-new-privs, only the descriptors it needs, then a per-slot
non-root uid (T: uid A, U: uid B). After the job, SysV IPC objects of those uids are removed.

Who decides a test outcome (the "honest judge", see `_rpc` for the boundary):

- ``check`` suites: T runs the HumanEval-style `check` functions; the candidate's functions are proxies
  that call into U. ``from solution import *`` binds the candidate's names except builtins.
- ``pytest`` suites: T runs pytest over the test files in /tests (readable by uid A only); the test's
  ``import solution`` gets a proxy module. Lying objects, patched modules or builtins in U cannot reach T.
- ``io`` suites: T calls the entry point in U on each input and streams the plain-data outputs; they are
  compared with the reference's outputs *outside* the sandbox.

Only T holds the result channel. Framing on every pipe: 4-byte big-endian length + UTF-8 JSON.
"""

from __future__ import annotations

import ast
import builtins
import functools
import gc
import json
import os
import reprlib
import resource
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
import types

try:  # on the host this is a package module; inside the sandbox both files sit side by side
    from pipeline.sandbox import _rpc
except ImportError:  # pragma: no cover - exercised inside the sandbox
    import _rpc

MAX_MSG_BYTES = _rpc.MAX_MSG_BYTES
NotPlain, encode, decode = _rpc.NotPlain, _rpc.encode, _rpc.decode
write_msg, read_msg, _HDR = _rpc.write_msg, _rpc.read_msg, _rpc._HDR
MAX_PATH_DEPTH = 32  # directory levels of one workspace path
# how long the worker waits for the zygote's report of a U that closed its output as T decided; only a U that
# closed it and lives on costs the whole wait (it is killed after it, as any U left over)
CODE_EXIT_GRACE_S = 1.0
RPC_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_rpc.py")


# --------------------------------------------------------------------------------------- confinement
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36


_LIBC: list = []  # loaded once in the worker, so forked children do not pay for importing ctypes


def _libc():
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _prctl(option: int, arg: int) -> None:
    try:
        _libc().prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # best effort; bwrap already sets no-new-privs


_IPC_RMID = 0
# /proc/sysvipc table -> (libc control call, column of the id, column of the owner uid, extra leading args)
_SYSV_TABLES = {"shm": ("shmctl", 1, 7, ()), "sem": ("semctl", 1, 4, (0,)), "msg": ("msgctl", 1, 7, ())}


def remove_ipc(uids: list[int]) -> int:
    """Remove every SysV shared memory segment, semaphore set and message queue owned by `uids`, so nothing a
    job left there is visible to the next one (a fresh IPC namespace per job costs ~7 ms; this ~0.1 ms)."""
    removed = 0
    if not uids:
        return removed
    libc = _libc()
    for table, (call, id_col, uid_col, extra) in _SYSV_TABLES.items():
        try:
            with open(f"/proc/sysvipc/{table}") as fh:
                rows = [line.split() for line in fh.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if len(row) > uid_col and int(row[uid_col]) in uids:
                getattr(libc, call)(int(row[id_col]), *extra, _IPC_RMID, None)
                removed += 1
    return removed


def confine(uid: int | None, limits: dict, keep: dict[int, int], cwd: str) -> None:
    """In a freshly forked child: new session and IPC namespace, rlimits, no-new-privs, only `keep` fds, then
    drop to `uid`.

    keep: {target_fd: source_fd}; everything else is closed, stdin is /dev/null.
    """
    os.setsid()
    # Move kept descriptors to their targets (go through high numbers so sources are not clobbered).
    import fcntl

    staged = {target: fcntl.fcntl(src, fcntl.F_DUPFD, 1000) for target, src in keep.items()}
    for target, src in staged.items():
        os.dup2(src, target)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    keep_set = set(keep) | {0}
    for fd in _open_fds():
        if fd not in keep_set:
            try:
                os.close(fd)
            except OSError:
                pass
    for name, value in (
        ("RLIMIT_CPU", (limits["cpu_s"], limits["cpu_s"] + 1)),
        ("RLIMIT_AS", (limits["memory_bytes"],) * 2),
        ("RLIMIT_NPROC", (limits["max_processes"],) * 2),
        ("RLIMIT_FSIZE", (limits["file_size_bytes"],) * 2),
        ("RLIMIT_NOFILE", (limits["open_files"],) * 2),
        ("RLIMIT_CORE", (0, 0)),
    ):
        resource.setrlimit(getattr(resource, name), value)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    os.chdir(cwd)
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # drops every capability: RLIMIT_NPROC now applies, root-owned files are off limits


def _open_fds() -> list[int]:
    try:
        return [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def _uid_pids(uid: int) -> list[int]:
    """Processes whose real uid is `uid` (read from status: /proc/<pid> itself is root's once a process changed
    its uid, since that makes it non-dumpable)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as fh:
                    for line in fh:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) == uid:
                                pids.append(int(name))
                            break
            except OSError:
                continue
    return pids


def _live_pids(uid: int) -> list[int]:
    """Processes of `uid` that still run (zombies excluded: they are only waiting to be reaped)."""
    live = []
    for pid in _uid_pids(uid):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    live.append(pid)
        except (OSError, IndexError):
            continue
    return live


def sweep(uid: int | None, pgids: list[int]) -> bool:
    """Kill everything a job left behind: its process groups, then (as root) every process of its uid.
    False when processes of the uid still survive (the slot must then be replaced)."""
    for pg in pgids:
        try:
            os.killpg(pg, signal.SIGKILL)
        except OSError:
            pass
    if uid is None or os.getuid() != 0:
        return True
    for _ in range(50):  # a fork bomb races the first rounds; NPROC bounds it, so this converges
        if not _uid_pids(uid):
            return True
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)  # every process this uid may signal, except ourselves
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        _reap()
    return not _live_pids(uid)


def _wait_killed(pids: list[int], within_s: float = 0.2) -> None:
    """Reap SIGKILLed children (they die at once unless stuck in the kernel), so the uid sweep finds none."""
    end = time.monotonic() + within_s
    for pid in pids:
        while time.monotonic() < end:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.0005)


def _reap() -> list[tuple[int, int]]:
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


# ---------------------------------------------------------------------------------------- check suites
@functools.lru_cache(maxsize=512)
def instrument_check(source: str, filename: str = "<tests>") -> tuple[types.CodeType, tuple[dict, ...]]:
    """Compile a HumanEval-style test file so each top-level statement of `check` that asserts is one case.

    Returns (code, cases); the code defines `check`, whose cases call `__didpo_case__(i, exc_or_None)` and
    whose failing asserts say what they compared through `__didpo_shown__` (`_shown`; `_ShowValues`).
    Module-level calls `check(...)` are dropped: the harness calls check itself. Cached: the worker compiles
    a task's tests once, before it forks the tester, and each later job of the task (a rollout group) forks
    with the result.
    """
    tree = ast.parse(source, filename)
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as the parser counts lines
    body, cases = [], []
    for node in tree.body:
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "check"
        ):
            continue
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            new_body = []
            for stmt in node.body:
                if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
                    # the statement's first line (offsets count UTF-8 bytes)
                    end = stmt.end_col_offset if stmt.end_lineno == stmt.lineno else None
                    first = lines[stmt.lineno - 1].encode()[stmt.col_offset:end].decode("utf-8", "replace")
                    cases.append({"line": stmt.lineno, "source": first[:200]})
                    new_body.append(_wrap_case(_ShowValues().visit(stmt), len(cases) - 1))
                else:
                    new_body.append(stmt)
            node.body = new_body or [_located(ast.Pass(), node)]
        body.append(node)
    tree.body = body
    return compile(tree, filename, "exec"), tuple(cases)


_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Is: "is",
        ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}


class _ShowValues(ast.NodeTransformer):
    """`assert L op R` -> `assert (l := L) op (r := R), __didpo_shown__(l, "op", r)` (and `assert X` ->
    `assert (v := X), __didpo_shown__(v)`): a failing case then says which values it compared, as pytest
    does. Each side is evaluated once, in the original order; the message is built only when the assert
    fails, so it can never turn a failure into a pass."""

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        if node.msg is not None:
            return node
        test, load = node.test, ast.Load()
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPS:
            left = ast.NamedExpr(ast.Name("__didpo_left__", ast.Store()), test.left)
            right = ast.NamedExpr(ast.Name("__didpo_right__", ast.Store()), test.comparators[0])
            shown = [ast.Name("__didpo_left__", load), ast.Constant(_OPS[type(test.ops[0])]),
                     ast.Name("__didpo_right__", load)]
            new_test: ast.expr = ast.Compare(left, test.ops, [right])
        else:
            new_test = ast.NamedExpr(ast.Name("__didpo_value__", ast.Store()), test)
            shown = [ast.Name("__didpo_value__", load)]
        msg = ast.Call(ast.Name("__didpo_shown__", load), shown, [])
        return _located(ast.Assert(new_test, msg), node)


_SHOW = reprlib.Repr()  # bounded: a million-element list or a 190-deep one prints in microseconds
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong = 3, 80, 80, 40
_SHOW.maxlist = _SHOW.maxtuple = _SHOW.maxset = _SHOW.maxfrozenset = _SHOW.maxdict = 8


def _shown_value(value) -> str:
    try:
        return _SHOW.repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int past Python's digit limit: say what it is instead
        return f"<{type(value).__name__}>"


def _shown(*parts) -> str:
    """The message of a failing rewritten assert: `assert <left> <op> <right>` with the values compared."""
    if len(parts) == 1:
        return f"assert {_shown_value(parts[0])}"
    left, op, right = parts
    return f"assert {_shown_value(left)} {op} {_shown_value(right)}"


def _located(node: ast.AST, at: ast.AST) -> ast.AST:
    """`node` and every node under it that has no position take `at`'s (only new nodes lack one, so this
    does not walk the test's own statements the way ast.fix_missing_locations walks the whole tree)."""
    for n in ast.walk(node):
        if "lineno" in n._attributes and not hasattr(n, "lineno"):
            ast.copy_location(n, at)
    return node


def _wrap_case(stmt: ast.stmt, i: int) -> ast.stmt:
    """try: <stmt> except BaseException as e: __didpo_case__(i, e) else: __didpo_case__(i, None)"""
    call = lambda arg: ast.Expr(  # noqa: E731
        ast.Call(ast.Name("__didpo_case__", ast.Load()), [ast.Constant(i), arg], [])
    )
    handler = ast.ExceptHandler(ast.Name("BaseException", ast.Load()), "__didpo_e__",
                                [call(ast.Name("__didpo_e__", ast.Load()))])
    otherwise = call(ast.Constant(None))
    return _located(ast.Try([stmt], [_located(handler, stmt)], [_located(otherwise, stmt)], []), stmt)


def _exc_text(exc: BaseException) -> str:
    """`Type: message`, and where in the candidate's files it was raised when U said so (as a traceback
    would show it: the line to look at), kept whole when a long message is cut."""
    msg = str(exc)
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    where = getattr(exc, "raised_at", None)
    if type(where) is not str:
        return text[:300]
    path, line = where.rsplit(":", 1)
    suffix = f" ({path}, line {line})"
    return text[:300 - len(suffix)] + suffix


def candidate_modules(files) -> list[str]:
    """Importable names the candidate's workspace defines: top-level modules and packages."""
    names = set()
    for rel in files:
        head = rel.split("/")[0]
        stem = head[:-3] if head.endswith(".py") and "/" not in rel else head if "/" in rel else None
        if stem and stem.isidentifier():
            names.add(stem)
    return sorted(names)


def _remote_import(module: str):
    """Import the candidate's `module` through the RPC boundary: (module proxy, None) or (None, error text)."""
    import importlib

    try:
        return importlib.import_module(module), None
    except BaseException as exc:  # noqa: BLE001 - the candidate's import failing is its own outcome
        return None, _exc_text(exc)


def _entry_point(job: dict, peer: _rpc.Peer):
    """The proxy of the candidate's entry point: (function, None) or (None, why not).

    The task's given helpers (job["given"]: the reference module's source and the names the task's own
    starting code defines, e.g. HumanEval/32's `poly`) are bound on the module from a run of that trusted
    source here: tests that call them check the candidate with the task's helpers, not the candidate's."""
    _rpc.install_remote_modules(peer, candidate_modules(job["files"]))
    module, error = _remote_import(job["module"])
    if module is None:
        return None, error
    given = job.get("given")
    if given:
        trusted: dict = {"__name__": f"__didpo_given_{job['module']}__"}
        try:
            exec(compile(given["source"], f"<given {job['module']}>", "exec"), trusted)
        except BaseException:  # noqa: BLE001 - a task whose reference cannot run: its tests use the candidate's
            trusted = {}
        names = [n for n in given["names"] if n in trusted]
        for name in names:
            module.__dict__[name] = trusted[name]  # the dict itself: setattr would forward to the candidate
        module.__dict__["__all__"] = [*module.__dict__.get("__all__", []),
                                      *(n for n in names if n not in module.__dict__.get("__all__", []))]
    try:
        return getattr(module, job["entry_point"]), None
    except BaseException as exc:  # noqa: BLE001
        return None, f"the module defines no {job['entry_point']}: {_exc_text(exc)}"


def run_tester(job: dict, peer: _rpc.Peer, result_w: int) -> None:
    """T for check suites: each test file defines check(candidate); its asserting statements are the cases
    (a file without any is one case). The candidate's functions are proxies into U."""
    # HumanEval-style functions return plain data, a candidate object is a failure; unless the suite says
    # its function returns objects (a generator, a node), which the test then uses through handles as pytest does
    peer.plain_results = not job.get("objects", False)
    entry, import_error = _entry_point(job, peer)
    results = []
    for path, source in job["tests"]:
        code, cases = instrument_check(source, path)
        outcomes: dict[int, str | None] = {}

        def record(i, exc, outcomes=outcomes):
            outcomes[i] = None if exc is None else _exc_text(exc)

        aborted = None
        if import_error is not None:
            aborted = f"candidate module failed to import: {import_error}"
        else:
            ns = {"__name__": "__didpo_tests__", "__builtins__": builtins, "__didpo_case__": record,
                  "__didpo_shown__": _shown}
            try:
                exec(code, ns)
                check = ns.get("check")
                if check is None:
                    raise NameError("the test file defines no check(candidate)")
                check(entry)
            except BaseException as exc:  # noqa: BLE001 - any failure of the test code is a recorded failure
                aborted = _exc_text(exc)
        for i, case in enumerate(cases):
            if i in outcomes:
                results.append({**case, "path": path, "passed": outcomes[i] is None, "detail": outcomes[i] or ""})
            else:
                results.append({**case, "path": path, "passed": False, "detail": f"not reached: {aborted}"})
        if not cases:  # a check without asserts: the whole call is the one case
            results.append({"line": 0, "source": "check(candidate)", "path": path, "passed": aborted is None,
                            "detail": aborted or ""})
    write_msg(result_w, {"done": True, "cases": results, "import_error": import_error})


# ------------------------------------------------------------------------------------------- io suites
def _reduce_not_none(value):
    # EvalPlus's "not_none" oracle looks only at this; the raw value (a re.Match) need not be plain data.
    # `is not None` on a proxy runs no candidate code.
    return value if type(value) is bool else value is not None


_REDUCTIONS = {None: lambda value: value, "not_none": _reduce_not_none}


def run_io(job: dict, peer: _rpc.Peer, result_w: int) -> None:
    """T for io suites: stream one plain-data output (or exception name) per input, reduced first when
    job["reduce"] names a reduction (see `_REDUCTIONS`)."""
    reduce = _REDUCTIONS[job.get("reduce")]
    fn, error = _entry_point(job, peer)  # its outputs: plain data, or NotPlain below
    if fn is None:
        write_msg(result_w, {"import_error": error})
        return
    for i, args in enumerate(job["inputs"]):
        try:
            out = {"ok": encode(reduce(fn(*decode(args))))}  # a proxy (non-plain output) raises NotPlain
        except BaseException as exc:  # noqa: BLE001
            out = {"exc": type(exc).__name__, "msg": str(exc)[:200]}
        write_msg(result_w, {"case": i, **out})
    write_msg(result_w, {"done": True})


# --------------------------------------------------------------------------------------- pytest suites
def run_pytest(job: dict, peer: _rpc.Peer, result_w: int) -> None:
    """T for pytest suites: pytest runs here over /tests; the candidate's modules are proxies into U, so
    nothing the candidate does can touch the framework, the assertions or the record. conftest, ini files
    and plugin autoload stay off all the same (the test directory holds only the task's files)."""
    import pytest

    test_modules = set(candidate_modules(job["test_paths"]))
    _rpc.install_remote_modules(peer, [m for m in candidate_modules(job["files"]) if m not in test_modules])
    outcomes: dict[str, str] = {}

    def failure(report) -> str:
        # the line pytest's summary shows ("AssertionError: assert '110' == '011'"): the case's feedback
        crash = getattr(report.longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(report.longrepr or "").strip().splitlines()[-1:]
        text = text if isinstance(text, str) else "".join(text)
        where = "" if report.when in ("call", None) else f"in {report.when}: "
        return f"failed: {where}{text}"[:400]

    class Recorder:
        def pytest_runtest_logreport(self, report):
            prev = outcomes.get(report.nodeid, "passed")
            if report.failed:
                outcomes[report.nodeid] = failure(report)
            elif report.when == "call" and not prev.startswith("failed"):
                outcomes[report.nodeid] = "skipped" if report.skipped else "passed"

        def pytest_collectreport(self, report):
            if report.failed:
                outcomes[report.nodeid or "<collection>"] = failure(report)

    sys.path.insert(0, os.getcwd())
    args = [*sorted(job["test_paths"]), "-q", "-p", "no:cacheprovider", "--noconftest", "-c", "/dev/null",
            "--rootdir", os.getcwd(), "-o", "addopts=", "-W", "ignore", "--tb=line", "-p", "no:stepwise"]
    code = pytest.main(args, plugins=[Recorder()])
    write_msg(result_w, {"done": True, "outcomes": outcomes, "code": int(code)})


HARNESSES = {"check": run_tester, "io": run_io, "pytest": run_pytest}


# ------------------------------------------------------------------------------------------ job driver
class Capture:
    """Bounded capture of a child's output: keeps the first `keep` bytes, counts the rest."""

    def __init__(self, fd: int, keep: int):
        self.fd, self.keep, self.buf, self.total, self.eof = fd, keep, bytearray(), 0, False

    def pump(self) -> None:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.eof = True
            return
        self.total += len(chunk)
        room = self.keep - len(self.buf)
        if room > 0:
            self.buf += chunk[:room]

    def text(self) -> str:
        s = self.buf.decode("utf-8", "replace")
        return s + (f"\n[... {self.total - len(self.buf)} more bytes dropped]" if self.total > len(self.buf) else "")


class Zygote:
    """Where each job's candidate process U comes from: a fresh interpreter, exec'd once per slot before any
    job, that only ever receives "fork" requests, never a job. So U starts with nothing but the preloaded
    modules in its memory, for the cost of a fork instead of an interpreter start.

    The zygote forks each U one job ahead: the U waits (as root, doing nothing) on its own channel until the
    worker hands it the job's descriptors, confinement and directory, so the fork is off the critical path.
    U stays the zygote's child; the zygote reaps it and reports its exit status on the same socket
    (`{"exited": pid, "status": st}`), after the fork reply that named it.
    """

    def __init__(self, preload: list[str]):
        import socket
        import subprocess

        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-s", "-B", os.path.abspath(__file__), "--zygote", str(theirs.fileno()),
             *(m for m in preload if m not in _TESTER_ONLY)],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        theirs.close()
        self.waiting = None  # (pid, channel) of the U forked ahead, once its reply has been read
        self.exits: dict[int, int] = {}  # pid -> wait status, as reported and not yet taken
        self.sock.send(b"fork")

    def pump(self, block: bool) -> bool:
        """Read one message from the zygote (waiting for it when `block`); False when none was there."""
        import socket

        try:
            msg, fds, _flags, _addr = socket.recv_fds(self.sock, 4096, 1, 0 if block else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        reply = json.loads(msg) if msg else {}
        if type(reply.get("exited")) is int and type(reply.get("status")) is int and not fds:
            self.exits[reply["exited"]] = reply["status"]
            return True
        pid = reply.get("pid")
        if type(pid) is not int or len(fds) != 1 or self.waiting is not None:
            for fd in fds:
                os.close(fd)
            raise RuntimeError(f"the zygote could not start a candidate process: {msg[:200]!r}")
        self.waiting = pid, socket.socket(fileno=fds[0])
        return True

    def wait_exit(self, pid: int, within_s: float) -> None:
        """Block until the zygote reports `pid` gone (it was just killed), for at most `within_s`."""
        end = time.monotonic() + within_s
        while pid not in self.exits and (left := end - time.monotonic()) > 0:
            if select.select([self.sock], [], [], left)[0]:
                self.pump(block=False)

    def spawn(self, uid: int | None, limits: dict, cwd: str, fds: list[int]) -> int:
        """Hand the waiting U its job: confined to `uid` in `cwd`, with `fds` as its 1, 2, 3, 4. Returns its pid."""
        import socket

        while self.waiting is None:
            self.pump(block=True)
        (pid, chan), self.waiting = self.waiting, None
        spec = {"uid": uid, "limits": limits, "cwd": cwd,
                "paths": [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]}
        try:
            socket.send_fds(chan, [json.dumps(spec).encode()], fds)
        finally:
            chan.close()
        self.sock.send(b"fork")  # the next job's U forks while this job runs
        return pid


_TESTER_ONLY = frozenset({"pytest"})  # preloaded by the worker for T; U's zygote stays small without them


def zygote_main(sock_fd: int, preload: list[str]) -> None:
    """The zygote's loop (see `Zygote`): preload, then fork a U per request and report each U's exit."""
    import socket

    for name in preload:
        try:
            __import__(name)
        except ImportError:
            pass
    _libc()  # confine's prctl, loaded once rather than per job
    gc.freeze()  # the candidate's collector never walks (and copies) the preloaded modules' objects
    sock = socket.socket(fileno=sock_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        while True:
            ready = select.select([sock, wake_r], [], [])[0]
            if wake_r in ready:
                os.read(wake_r, 4096)  # only wakes us: _reap below collects every exit so far
                for pid, status in _reap():
                    sock.send(json.dumps({"exited": pid, "status": status}).encode())
            if sock in ready:
                if not sock.recv(16):
                    return
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    sock.close()
                    theirs.close()
                    _candidate_main(ours)
                try:
                    socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [theirs.fileno()])
                finally:
                    ours.close()
                    theirs.close()
    except OSError:  # the worker went away, or a fork failed: the worker then reads EOF and the host restarts
        return       # the slot


def _candidate_main(chan) -> None:
    """U: wait for the job's descriptors and confinement, confine, then serve the tester. Never returns."""
    import socket

    code = 0
    try:
        msg, fds, _flags, _addr = socket.recv_fds(chan, 1 << 16, 4)
        if not msg:
            os._exit(0)  # the worker went away before this U got a job
        req = json.loads(msg)
        chan.close()
        confine(req["uid"], req["limits"], dict(zip((1, 2, 3, 4), fds, strict=True)), req["cwd"])
        _rpc.serve_candidate({"paths": req["paths"]})
    except BaseException:  # noqa: BLE001
        code = 70
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


class CandidateFileError(ValueError):
    """A file the candidate asked for cannot be written (bad path, name too long, no space): its outcome."""


class SlotDirty(RuntimeError):
    """The slot could not be restored to a clean state: the host replaces it (an infrastructure error)."""


class Slot:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        # SIGCHLD wakes the select loop at once instead of on its next poll tick
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.limits = cfg["limits"]
        self.ws, self.tmp, self.tests = cfg["workspace_dir"], cfg["tmp_dir"], cfg["tests_dir"]
        self.uid_test, self.uid_code = cfg.get("uid_test"), cfg.get("uid_code")
        if os.getuid() != 0:
            self.uid_test = self.uid_code = None
        self.zygote = Zygote(cfg.get("preload", []))
        self.dirty = True  # checked before the first job
        self._leftover = None  # what `finish` cleans up after the current job's report

    # -- directories
    def _dirs(self) -> list[tuple[str, int | None, int]]:
        """(path, owner uid, mode) of every directory a job may fill; all are emptied before and after."""
        code, test = self.uid_code, self.uid_test
        dirs = [(self.ws, code, 0o755), (self.tmp, code, 0o1777), (self.tests, test, 0o700)]
        return dirs + [(d, code, 0o1777) for d in self.cfg.get("extra_tmp", [])]

    def _reset_dirs(self) -> None:
        for d, owner, mode in self._dirs():
            if not os.path.isdir(d):
                continue
            keep = set(self.cfg.get("keep", {}).get(d, ()))
            for name in os.listdir(d):
                if name in keep:
                    continue
                p = os.path.join(d, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    try:
                        shutil.rmtree(p, ignore_errors=True)
                    except RecursionError:  # a tree deeper than the stack (the code made it): rm has no limit
                        subprocess.run(["rm", "-rf", "--one-file-system", p], check=False)
                else:
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
            if set(os.listdir(d)) - keep:
                self.dirty = True  # something could not be removed: the slot is replaced before the next job
            if owner is not None:
                os.chown(d, owner, owner)
            os.chmod(d, mode)

    def _write_files(self, root: str, files: dict[str, str], owner: int | None) -> None:
        """Write `files` under `root`; raises CandidateFileError naming the first path that cannot be written."""
        for rel, text in files.items():
            parts = rel.split("/")
            if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise CandidateFileError(f"refusing workspace path {rel[:200]!r}")
            if len(parts) > MAX_PATH_DEPTH:
                raise CandidateFileError(f"path {rel[:80]!r}... is {len(parts)} levels deep (at most {MAX_PATH_DEPTH})")
            try:
                d = root
                for p in parts[:-1]:
                    d = os.path.join(d, p)
                    if not os.path.isdir(d):
                        os.mkdir(d)
                        if owner is not None:
                            os.chown(d, owner, owner)
                path = os.path.join(root, rel)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as fh:
                    fh.write(text)
                if owner is not None:
                    os.chown(path, owner, owner)
            except (OSError, ValueError, UnicodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise CandidateFileError(f"cannot write {rel[:200]!r}: {why}") from None

    def _ensure_clean(self) -> None:
        """Nothing of an earlier job may run when this one starts: a survivor could signal or starve it.
        Each job ends with a sweep that knows whether it left the uids empty; only then is this a re-check."""
        if not self.dirty:
            return
        uids = [u for u in (self.uid_code, self.uid_test) if u is not None]
        left = [uid for uid in uids if not sweep(uid, [])]
        if left:
            raise SlotDirty(f"processes of uid {left} survive from an earlier job")
        self.dirty = False
        self._reset_dirs()
        if self.dirty:
            raise SlotDirty("files of an earlier job could not be removed")

    # -- one job
    def run(self, job: dict) -> dict:
        t0 = time.monotonic()
        self._ensure_clean()
        self._reset_dirs()
        kind = job["kind"]
        if kind not in HARNESSES:
            raise ValueError(f"unknown suite kind {kind!r}")
        # task files first: a failure there is the host's; a failure on the candidate's files is the candidate's
        self._write_files(self.tests, job.get("test_files", {}), self.uid_test)
        try:
            self._write_files(self.ws, job["files"], self.uid_code)
        except CandidateFileError as exc:
            self._reset_dirs()
            return {"workspace_error": str(exc), "records": [], "exits": {}, "timed_out": False,
                    "output_exceeded": False, "stdout": "", "stderr": "", "duration_s": time.monotonic() - t0}
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        t_in, u_out = os.pipe()  # U -> T
        u_in, t_out = os.pipe()  # T -> U
        children: dict[int, str] = {}
        self.dirty = True  # until `finish` has swept this job's processes
        # U comes from the zygote, a fresh interpreter that never received a job: nothing of this one (tests,
        # expected values) is in its memory
        children[self.zygote.spawn(self.uid_code, self.limits, self.ws, [out_w, err_w, u_in, u_out])] = "code"
        harness = HARNESSES[kind]
        if kind == "check":
            for path, source in job["tests"]:
                try:
                    instrument_check(source, path)  # into the cache the tester forks with
                except Exception:  # noqa: BLE001 - the tester meets it again and reports it
                    pass
        children[self._spawn(self.uid_test, self.tests, {1: out_w, 2: err_w, 3: t_in, 4: t_out, 5: res_w},
                             lambda: harness(job, _rpc.Peer(3, 4, trusted=True), 5))] = "test"
        for fd in (out_w, err_w, res_w, t_in, u_out, u_in, t_out):
            os.close(fd)
        return self._watch(job, children, out_r, err_r, res_r, t0)

    def finish(self) -> None:
        """After the report is sent: kill what is left of the job, sweep its uids, wipe its files. Until this
        has run the slot counts as dirty, so a job that failed midway is swept before the next one."""
        if self._leftover is None:
            return
        (pending, children), self._leftover = self._leftover, None
        for pid in pending:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _wait_killed([pid for pid, role in pending.items() if role != "code"])
        for pid in (pid for pid, role in pending.items() if role == "code"):
            self.zygote.wait_exit(pid, 0.2)
        self._exited()
        clean = sweep(self.uid_code, children)
        clean = sweep(self.uid_test, []) and clean
        remove_ipc([u for u in (self.uid_code, self.uid_test) if u is not None])
        _reap()  # orphans of the job, reparented to us and killed by the sweep
        self.dirty = not clean
        self._reset_dirs()

    def _exited(self) -> list[tuple[int, int]]:
        """(pid, wait status) of the job's processes that ended: T (our child), U (the zygote's, reported;
        ours if the zygote died and U was reparented to us, the subreaper)."""
        done = [*_reap(), *self.zygote.exits.items()]
        self.zygote.exits.clear()
        return done

    def _spawn(self, uid, cwd, keep, body) -> int:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                confine(uid, self.limits, keep, cwd)
                body()
            except BaseException:  # noqa: BLE001
                try:
                    traceback.print_exc()
                    sys.stderr.flush()
                except BaseException:  # noqa: BLE001
                    pass
                code = 70
            finally:
                try:
                    sys.stdout.flush()
                except BaseException:  # noqa: BLE001
                    pass
                os._exit(code)
        return pid

    def _watch(self, job, children, out_r, err_r, res_r, t0) -> dict:
        deadline = t0 + float(job["timeout_s"])
        keep, kill_at = self.cfg["output_keep_bytes"], self.cfg["output_kill_bytes"]
        caps = {out_r: Capture(out_r, keep), err_r: Capture(err_r, keep)}
        for fd in (out_r, err_r, res_r):
            os.set_blocking(fd, False)
        res_buf, res_eof = bytearray(), False
        exits: dict[str, int] = {}
        timed_out = output_exceeded = False
        pending = dict(children)
        while True:
            for pid, status in self._exited():
                if pid in pending:
                    exits[pending.pop(pid)] = status
            fds = [fd for fd, c in caps.items() if not c.eof] + ([] if res_eof else [res_r])
            if not pending and not fds:
                break
            if "test" not in pending.values():  # T decided: drain what is already written, then stop U
                ready = select.select(fds, [], [], 0)[0]
                if not ready:
                    code = [pid for pid, role in pending.items() if role == "code"]
                    if code and all(c.eof for c in caps.values()):
                        # U let go of its output: it most likely ended on its own (a CPU limit, a crash) and T
                        # reported that at once; U's exit, which the zygote reports a moment later, names why
                        self.zygote.wait_exit(code[0], CODE_EXIT_GRACE_S)
                        exits.update((pending.pop(pid), st) for pid, st in self._exited() if pid in pending)
                    break
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                ready = select.select([*fds, self._wake_r, self.zygote.sock], [], [], min(left, 0.5))[0]
            for fd in ready:
                if fd is self.zygote.sock:
                    self.zygote.pump(block=False)
                elif fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                elif fd == res_r:
                    try:
                        chunk = os.read(res_r, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        res_eof = True
                    elif len(res_buf) + len(chunk) > MAX_MSG_BYTES:
                        output_exceeded = True
                    else:
                        res_buf += chunk
                else:
                    caps[fd].pump()
            if sum(c.total for c in caps.values()) > kill_at:
                output_exceeded = True
            if output_exceeded:
                break
        for fd in (out_r, err_r, res_r):
            os.close(fd)
        self._leftover = pending, list(children)  # exits from here on are caused by us, not by the code
        return {
            "records": _split_frames(bytes(res_buf)),
            "exits": {role: _describe_exit(st) for role, st in exits.items()},
            "timed_out": timed_out,
            "output_exceeded": output_exceeded,
            "stdout": caps[out_r].text(),
            "stderr": caps[err_r].text(),
            "duration_s": time.monotonic() - t0,
        }


def _split_frames(data: bytes) -> list:
    out, i = [], 0
    while i + _HDR.size <= len(data):
        (n,) = _HDR.unpack_from(data, i)
        body = data[i + _HDR.size: i + _HDR.size + n]
        if len(body) < n:
            break
        try:
            out.append(_rpc.parse_json(body))
        except ValueError:
            out.append({"malformed": True})
        i += _HDR.size + n
    return out


def _describe_exit(status: int) -> dict:
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status), "code": None}
    return {"signal": None, "code": os.WEXITSTATUS(status)}


# ---------------------------------------------------------------------------------------------- probe
def probe(slot: Slot, secret_paths: list[str]) -> dict:
    """Facts the host checks before trusting this slot: interpreter identity and what untrusted code sees.

    secret_paths: host paths (shadow file, home contents, the repository) untrusted code must not read.
    """
    r, w = os.pipe()

    def body():
        facts = {"uid": os.getuid(), "euid": os.geteuid(), "readable": []}
        for path in secret_paths:
            try:
                if os.path.isdir(path):
                    os.listdir(path)
                else:
                    open(path, "rb").close()
                facts["readable"].append(path)
            except OSError:
                pass
        for key, fn in (("write_usr", lambda: open("/usr/.didpo_probe", "w").close()), ("network", _probe_network)):
            try:
                fn()
                facts[key] = True
            except OSError:
                facts[key] = False
        write_msg(3, facts)

    slot._reset_dirs()
    pid = slot._spawn(slot.uid_code, slot.ws, {3: w}, body)
    os.close(w)
    facts = read_msg(r, time.monotonic() + 10) or {}
    os.close(r)
    os.waitpid(pid, 0)
    sweep(slot.uid_code, [])
    return {
        "executable": sys.executable,
        "version": sys.version,
        "prefix": sys.prefix,
        "worker_uid": os.getuid(),
        "child": facts,
    }


def _probe_network() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        s.connect(("1.1.1.1", 53))


def main() -> None:
    if sys.argv[1:2] == ["--zygote"]:
        zygote_main(int(sys.argv[2]), sys.argv[3:])
        return
    cfg = json.loads(sys.argv[1])
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of a job come back to us and get reaped
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for name in cfg.get("preload", []):  # warm modules: children fork with them already imported
        try:
            __import__(name)
        except ImportError:
            pass
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != os.path.dirname(os.path.abspath(__file__))]
    slot = Slot(cfg)
    gc.freeze()  # a forked tester's collector then never walks (and copies) the worker's preloaded objects
    stdin, stdout = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # stray prints can never corrupt the protocol
    write_msg(stdout, {"ready": True})
    while True:
        msg = read_msg(stdin)
        if msg is None:
            return
        try:
            if msg["op"] == "probe":
                reply = {"ok": True, "probe": probe(slot, list(msg.get("secret_paths", [])))}
            elif msg["op"] == "run":
                reply = {"ok": True, "report": slot.run(msg["job"])}
            else:
                reply = {"ok": False, "error": f"unknown op {msg['op']!r}"}
        except SlotDirty as exc:  # the host replaces this slot and runs the job on a clean one
            reply = {"ok": False, "error": str(exc), "dirty": True}
        except Exception as exc:  # noqa: BLE001 - reported to the host as an infrastructure error
            reply = {"ok": False, "error": traceback.format_exc(limit=5)[-2000:] or repr(exc)}
        write_msg(stdout, reply)
        try:
            slot.finish()  # while the host reads the report
        except Exception:  # noqa: BLE001 - the slot stays dirty: the next job sweeps it or replaces the slot
            traceback.print_exc()


if __name__ == "__main__":
    main()
