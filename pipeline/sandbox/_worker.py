"""The program that runs inside each sandbox slot (stdlib only; also imported by the host for the codec).

One worker process per pool slot stays warm inside bubblewrap. For every job it:

1. wipes and refills the private workspace (/ws) and tmp, as root *inside* the sandbox;
2. forks the processes that run untrusted code, each of which, before touching it, starts a new session,
   sets rlimits, sets no-new-privs, closes every inherited descriptor, and drops to a per-slot non-root uid;
3. watches them against a wall-clock deadline, caps their output, and finally kills every process left
   under those uids (``kill(-1)`` from a process that has the uid), so nothing outlives the job.

Who decides a test outcome (the "honest judge"):

- ``check`` suites: the candidate module is imported in process U (uid B); the test code runs in process T
  (uid A != B) which never executes a line of candidate code. T calls candidate functions over a pipe;
  arguments and return values cross as *plain data* (this codec), so an object with a forged ``__eq__``,
  a patched builtin or test framework in U cannot reach T. T records every case and reports to this worker
  on a pipe U does not hold. U cannot signal or ptrace T (different uid, no capabilities).
- ``io`` suites: U calls the entry point on each input and streams the plain-data outputs; they are compared
  with the reference's outputs *outside* the sandbox. U can only make claims about its own outputs.
- ``pytest`` suites: pytest runs inside U (tests and code share a process); outcomes travel on a private
  descriptor with a per-run nonce; a run that does not finish the harness scores nothing. This defends the
  common reward hacks but not code that deliberately reads its own process memory (docs/sandbox.md).

Framing on every pipe: 4-byte big-endian length + UTF-8 JSON.
"""

from __future__ import annotations

import ast
import builtins
import collections
import json
import math
import os
import resource
import secrets
import select
import shutil
import signal
import struct
import sys
import time
import traceback
import types

MAX_MSG_BYTES = 64 * 1024 * 1024
# stdlib dict subclasses with honest equality (Counter == dict compares items): sent as the plain dict
_DICT_LIKE = (collections.Counter, collections.OrderedDict, collections.defaultdict)
_HDR = struct.Struct(">I")


# ------------------------------------------------------------------------------------------ plain-data codec
class NotPlain(TypeError):
    """A value that is not plain data (None, bool, int, float, complex, str, bytes, list, tuple, set, dict)."""


def encode(value, _depth: int = 0):
    """Plain Python data -> JSON-able tagged tree. Exact types only: subclasses (and their __eq__) are refused."""
    if _depth > 200:
        raise NotPlain("nesting deeper than 200")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if -(2**62) < value < 2**62 else {"I": hex(value)}  # hex: no int->str digit limit
    if t is float:
        return {"f": value} if math.isfinite(value) else {"f": repr(value)}
    if t is list:
        return [encode(v, _depth + 1) for v in value]
    if t is tuple:
        return {"t": [encode(v, _depth + 1) for v in value]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(v, _depth + 1) for v in value]}
    if t is dict or t in _DICT_LIKE:
        return {"d": [[encode(k, _depth + 1), encode(v, _depth + 1)] for k, v in dict.items(value)]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [encode(value.real), encode(value.imag)]}
    item = getattr(value, "item", None)  # numpy scalars: a common, honest return type
    if t.__module__ == "numpy" and callable(item) and getattr(value, "ndim", 1) == 0:
        return encode(item(), _depth + 1)
    raise NotPlain(f"value of type {t.__name__} is not plain data")


def decode(tree):
    """Inverse of `encode`; builds fresh builtin objects only. Raises ValueError on malformed input."""
    if tree is None or type(tree) in (bool, int, str):
        return tree
    if type(tree) is list:
        return [decode(v) for v in tree]
    if type(tree) is dict and len(tree) == 1:
        (tag, v), = tree.items()
        if tag == "I" and type(v) is str:
            return int(v, 16)
        if tag == "f":
            return float(v) if type(v) in (int, float, str) else _bad(tree)
        if tag == "t" and type(v) is list:
            return tuple(decode(x) for x in v)
        if tag == "s" and type(v) is list:
            return {decode(x) for x in v}
        if tag == "fs" and type(v) is list:
            return frozenset(decode(x) for x in v)
        if tag == "d" and type(v) is list:
            return {decode(k): decode(x) for k, x in v}
        if tag == "b" and type(v) is str:
            return bytes.fromhex(v)
        if tag == "c" and type(v) is list and len(v) == 2:
            return complex(decode(v[0]), decode(v[1]))
    return _bad(tree)


def _bad(tree):
    raise ValueError(f"malformed plain-data tree: {str(tree)[:80]}")


# ------------------------------------------------------------------------------------------------ framing
def write_msg(fd: int, obj) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    buf = memoryview(_HDR.pack(len(data)) + data)
    while buf:
        buf = buf[os.write(fd, buf):]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no message before the deadline")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_msg(fd: int, deadline: float | None = None, limit: int = MAX_MSG_BYTES):
    """One framed message, or None at end of stream. Oversized or malformed frames raise ValueError."""
    hdr = _read_exact(fd, _HDR.size, deadline)
    if hdr is None:
        return None
    (n,) = _HDR.unpack(hdr)
    if n > limit:
        raise ValueError(f"message of {n} bytes exceeds the {limit}-byte limit")
    data = _read_exact(fd, n, deadline)
    if data is None:
        raise ValueError("stream ended inside a message")
    return json.loads(data)


# --------------------------------------------------------------------------------------- confinement
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36


_LIBC: list = []  # loaded once in the worker, so forked children do not pay for importing ctypes


def _prctl(option: int, arg: int) -> None:
    try:
        if not _LIBC:
            import ctypes

            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        _LIBC[0].prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # best effort; bwrap already sets no-new-privs


def confine(uid: int | None, limits: dict, keep: dict[int, int], cwd: str) -> None:
    """In a freshly forked child: new session, rlimits, no-new-privs, only `keep` fds, then drop to `uid`.

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


def sweep(uid: int | None, pgids: list[int]) -> None:
    """Kill everything a job left behind: its process groups, then (as root) every process of its uid."""
    for pg in pgids:
        try:
            os.killpg(pg, signal.SIGKILL)
        except OSError:
            pass
    if uid is None or os.getuid() != 0:
        return
    for _ in range(50):  # a fork bomb races the first rounds; NPROC bounds it, so this converges
        if not _uid_pids(uid):
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)  # every process this uid may signal, except ourselves
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        _reap()


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
def instrument_check(source: str, filename: str = "<tests>") -> tuple[types.CodeType, list[dict]]:
    """Compile a HumanEval-style test file so each top-level statement of `check` that asserts is one case.

    Returns (code, cases); the code defines `check`, whose cases call `__didpo_case__(i, exc_or_None)`.
    Module-level calls `check(...)` are dropped: the harness calls check itself.
    """
    tree = ast.parse(source, filename)
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
                    i = len(cases)
                    text = ast.get_source_segment(source, stmt) or ""
                    cases.append({"line": stmt.lineno, "source": text.splitlines()[0][:200] if text else ""})
                    new_body.append(_wrap_case(stmt, i))
                else:
                    new_body.append(stmt)
            node.body = new_body or [ast.Pass()]
        body.append(node)
    tree.body = body
    ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec"), cases


def _wrap_case(stmt: ast.stmt, i: int) -> ast.stmt:
    call = lambda arg: ast.Expr(  # noqa: E731
        ast.Call(ast.Name("__didpo_case__", ast.Load()), [ast.Constant(i), arg], [])
    )
    handler = ast.ExceptHandler(ast.Name("BaseException", ast.Load()), "__didpo_e__",
                                [call(ast.Name("__didpo_e__", ast.Load()))])
    wrapped = ast.Try([stmt], [handler], [call(ast.Constant(None))], [])
    return ast.copy_location(wrapped, stmt)


def _exc_text(exc: BaseException) -> str:
    msg = str(exc)
    return f"{type(exc).__name__}: {msg}"[:300] if msg else type(exc).__name__


def _raise_remote(name: str, msg: str):
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        raise cls(msg)
    raise RuntimeError(f"{name}: {msg}")


def run_tester(job: dict, req_w: int, resp_r: int, result_w: int) -> None:
    """Process T: runs the test code; candidate code only ever answers over the pipe, as plain data.

    job["tests"]: [[path, source], ...]; each file defines check(candidate); its asserting statements
    are the cases (a file without any is one case).
    """

    def call_remote(name, args, kwargs):
        try:
            payload = {"call": name, "args": encode(list(args)), "kwargs": encode(dict(kwargs))}
        except NotPlain as exc:
            raise TypeError(f"test passed a non-plain argument to {name}: {exc}") from None
        write_msg(req_w, payload)
        reply = read_msg(resp_r)
        if reply is None:
            raise RuntimeError("candidate process ended")
        if "exc" in reply:
            _raise_remote(str(reply["exc"]), str(reply.get("msg", "")))
        return decode(reply["ok"])

    def remote(name):
        def proxy(*args, **kwargs):
            return call_remote(name, args, kwargs)

        proxy.__name__ = proxy.__qualname__ = name
        return proxy

    import_error = None
    exports: dict = {}
    try:
        hello = read_msg(resp_r)
        if hello is None:
            import_error = "candidate process ended before importing the module"
        elif "import_error" in hello:
            import_error = str(hello["import_error"])
        else:
            for name, kind in hello["exports"].items():
                exports[str(name)] = remote(str(name)) if kind == "callable" else decode(kind["value"])
            exports.setdefault(job["entry_point"], remote(job["entry_point"]))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        import_error = f"candidate sent a malformed reply ({type(exc).__name__})"
        exports = {}
    module = types.ModuleType(job["module"])
    module.__dict__.update(exports)
    sys.modules[job["module"]] = module  # `from solution import *` inside the tests gets the proxies
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
            ns = {"__name__": "__didpo_tests__", "__builtins__": builtins, "__didpo_case__": record}
            try:
                exec(code, ns)
                check = ns.get("check")
                if check is None:
                    raise NameError("the test file defines no check(candidate)")
                check(exports[job["entry_point"]])
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


def _import_candidate(module: str):
    import importlib

    sys.path.insert(0, os.getcwd())
    importlib.invalidate_caches()
    sys.modules.pop(module, None)
    return importlib.import_module(module)


def run_candidate_server(job: dict, req_r: int, resp_w: int) -> None:
    """Process U: imports the candidate and answers T's calls (plain data in, plain data out)."""
    try:
        mod = _import_candidate(job["module"])
    except BaseException as exc:  # noqa: BLE001
        write_msg(resp_w, {"import_error": _exc_text(exc)})
        return
    exports = {}
    for name, value in vars(mod).items():
        if name.startswith("__"):
            continue
        if callable(value) and getattr(value, "__module__", None) == mod.__name__:
            exports[name] = "callable"
        else:
            try:
                exports[name] = {"value": encode(value)}
            except NotPlain:
                continue
    write_msg(resp_w, {"exports": exports})
    while True:
        req = read_msg(req_r)
        if req is None:
            return
        try:
            fn = getattr(mod, req["call"])
            value = fn(*decode(req["args"]), **decode(req["kwargs"]))
            reply = {"ok": encode(value)}
        except BaseException as exc:  # noqa: BLE001
            reply = {"exc": type(exc).__name__, "msg": str(exc)[:300]}
        write_msg(resp_w, reply)


# ------------------------------------------------------------------------------------------- io suites
def _reduce_not_none(value):
    # EvalPlus's "not_none" oracle looks only at this; the raw value (a re.Match) need not be plain data
    return value if type(value) is bool else value is not None


_REDUCTIONS = {None: lambda value: value, "not_none": _reduce_not_none}


def run_io(job: dict, result_w: int) -> None:
    """Process U for io suites: stream one plain-data output (or exception name) per input, reduced first
    when job["reduce"] names a reduction (see `_REDUCTIONS`)."""
    reduce = _REDUCTIONS[job.get("reduce")]
    try:
        mod = _import_candidate(job["module"])
        fn = getattr(mod, job["entry_point"])
    except BaseException as exc:  # noqa: BLE001
        write_msg(result_w, {"import_error": _exc_text(exc)})
        return
    for i, args in enumerate(job["inputs"]):
        try:
            out = {"ok": encode(reduce(fn(*decode(args))))}
        except BaseException as exc:  # noqa: BLE001
            out = {"exc": type(exc).__name__, "msg": str(exc)[:200]}
        write_msg(result_w, {"case": i, **out})
    write_msg(result_w, {"done": True})


# --------------------------------------------------------------------------------------- pytest suites
_PYTEST_CRITICAL = (  # (module, dotted attribute): what a test-framework monkeypatch would replace
    ("_pytest.python", "Function.runtest"), ("_pytest.python", "pytest_pyfunc_call"),
    ("_pytest.runner", "call_and_report"), ("_pytest.runner", "CallInfo.from_call"),
    ("_pytest.runner", "runtestprotocol"), ("_pytest.reports", "TestReport.from_item_and_call"),
    ("_pytest.reports", "TestReport.__init__"), ("_pytest.unittest", "TestCaseFunction.runtest"),
    ("unittest.case", "TestCase.run"), ("unittest.case", "TestCase.__call__"),
    ("unittest.case", "TestCase.fail"), ("_pytest.outcomes", "fail"), ("_pytest.outcomes", "skip"),
    ("builtins", "AssertionError"), ("builtins", "isinstance"), ("builtins", "len"), ("builtins", "abs"),
)


def _critical_objects() -> list:
    out = []
    for mod, dotted in _PYTEST_CRITICAL:
        obj = sys.modules.get(mod)
        for part in dotted.split("."):
            # raw class attributes: getattr would build a fresh bound method for each classmethod
            obj = vars(obj).get(part) if isinstance(obj, type) else getattr(obj, part, None)
        out.append(obj)
    return out


def run_pytest(job: dict, chan_fd: int, nonce: str) -> None:
    """Process U for pytest suites. Tests and candidate share this process, so: conftest, ini files and
    plugin autoload are off, the framework's critical functions are checked for tampering around every test,
    and the record is written only after the session ends (see docs/sandbox.md for what remains)."""
    import _pytest.python  # noqa: F401 - make sure every module in _PYTEST_CRITICAL is loaded
    import _pytest.unittest  # noqa: F401
    import pytest

    original = _critical_objects()
    outcomes: dict[str, str] = {}
    tampered: list[str] = []
    ident = id

    def intact() -> bool:
        now = _critical_objects()
        bad = [f"{m}.{a}" for (m, a), x, y in zip(_PYTEST_CRITICAL, original, now, strict=True) if ident(x) != ident(y)]
        tampered.extend(b for b in bad if b not in tampered)
        return not bad

    class Recorder:
        def pytest_runtest_logreport(self, report):
            prev = outcomes.get(report.nodeid, "passed")
            if report.failed or not intact():
                outcomes[report.nodeid] = "failed"
            elif report.when == "call" and prev != "failed":
                outcomes[report.nodeid] = "skipped" if report.skipped else "passed"

        def pytest_collectreport(self, report):
            if report.failed:
                outcomes[report.nodeid or "<collection>"] = "failed"

    sys.path.insert(0, os.getcwd())
    args = [*sorted(job["test_paths"]), "-q", "-p", "no:cacheprovider", "--noconftest", "-c", "/dev/null",
            "--rootdir", os.getcwd(), "-o", "addopts=", "-W", "ignore", "--tb=line", "-p", "no:stepwise"]
    code = pytest.main(args, plugins=[Recorder()])
    if not intact():
        outcomes = {k: "failed" for k in outcomes} or {"<session>": "failed"}
        print(f"test framework tampered with: {tampered}", file=sys.stderr)
    write_msg(chan_fd, {"nonce": nonce, "done": True, "outcomes": outcomes, "code": int(code),
                        "tampered": tampered})


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
        self.ws, self.tmp = cfg["workspace_dir"], cfg["tmp_dir"]
        self.uid_test, self.uid_code = cfg.get("uid_test"), cfg.get("uid_code")
        if os.getuid() != 0:
            self.uid_test = self.uid_code = None

    # -- workspace
    def _reset_dirs(self) -> None:
        for d in (self.ws, self.tmp, *self.cfg.get("extra_tmp", [])):
            if not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                p = os.path.join(d, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
            if self.uid_code is not None:
                os.chown(d, self.uid_code, self.uid_code)
            os.chmod(d, 0o1777 if d != self.ws else 0o755)

    def _write_files(self, files: dict[str, str]) -> None:
        for rel, text in files.items():
            parts = rel.split("/")
            if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"refusing workspace path {rel!r}")
            d = self.ws
            for p in parts[:-1]:
                d = os.path.join(d, p)
                if not os.path.isdir(d):
                    os.mkdir(d)
                    if self.uid_code is not None:
                        os.chown(d, self.uid_code, self.uid_code)
            path = os.path.join(self.ws, rel)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            if self.uid_code is not None:
                os.chown(path, self.uid_code, self.uid_code)

    # -- one job
    def run(self, job: dict) -> dict:
        t0 = time.monotonic()
        self._reset_dirs()
        self._write_files({**job["files"], **job.get("test_files", {})})  # task tests win over agent files
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        kind = job["kind"]
        children: dict[int, str] = {}
        nonce = secrets.token_hex(16)
        to_close = [out_w, err_w, res_w]
        if kind == "check":
            req_r, req_w = os.pipe()
            resp_r, resp_w = os.pipe()
            children[self._spawn(self.uid_code, self.ws, {1: out_w, 2: err_w, 3: req_r, 4: resp_w},
                                 lambda: run_candidate_server(job, 3, 4))] = "code"
            children[self._spawn(self.uid_test, "/", {1: out_w, 2: err_w, 3: req_w, 4: resp_r, 5: res_w},
                                 lambda: run_tester(job, 3, 4, 5))] = "test"
            to_close += [req_r, req_w, resp_r, resp_w]
        elif kind == "io":
            children[self._spawn(self.uid_code, self.ws, {1: out_w, 2: err_w, 3: res_w},
                                 lambda: run_io(job, 3))] = "code"
        elif kind == "pytest":
            chan = 100 + secrets.randbelow(800)  # unguessable-ish descriptor number, plus the nonce
            children[self._spawn(self.uid_code, self.ws, {1: out_w, 2: err_w, chan: res_w},
                                 lambda: run_pytest(job, chan, nonce))] = "code"
        else:
            raise ValueError(f"unknown suite kind {kind!r}")
        for fd in to_close:
            os.close(fd)
        report = self._watch(job, children, out_r, err_r, res_r, t0)
        if kind == "pytest":
            report["nonce"] = nonce
        self._reset_dirs()
        return report

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
            for pid, status in _reap():
                if pid in pending:
                    exits[pending.pop(pid)] = status
            fds = [fd for fd, c in caps.items() if not c.eof] + ([] if res_eof else [res_r])
            if not pending and not fds:
                break
            if not pending:  # children done; drain what is already written, then stop
                ready = select.select(fds, [], [], 0)[0]
                if not ready:
                    break
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                ready = select.select([*fds, self._wake_r], [], [], min(left, 0.5))[0]
            for fd in ready:
                if fd == self._wake_r:
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
        for pid in list(pending):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        sweep(self.uid_code, list(children))
        sweep(self.uid_test, [])
        for pid, status in _reap():
            if pid in pending:
                exits[pending.pop(pid)] = status
        for fd in (out_r, err_r, res_r):
            os.close(fd)
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
            out.append(json.loads(body))
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
        except Exception as exc:  # noqa: BLE001 - reported to the host as an infrastructure error
            reply = {"ok": False, "error": traceback.format_exc(limit=5)[-2000:] or repr(exc)}
        write_msg(stdout, reply)


if __name__ == "__main__":
    main()
