"""A pool of warm sandbox workers: bubblewrap isolation, or (only when the config says so) rlimits alone.

Each slot is one long-lived worker (`_worker.py`) inside its own bubblewrap instance: new pid/net/ipc/uts
namespaces, an empty root with the system directories and the Python installation bound read-only, no /etc
secrets, no home, a private size-capped /tmp, /dev/shm, workspace (/ws) and test directory (/tests) and
nothing else writable. Per execution the worker forks the trusted tester and execs one fresh interpreter
for the candidate. Each slot claims its own pair of uids, unique across every pool on the host.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipeline.sandbox import _worker
from pipeline.sandbox.settings import SandboxSettings

log = logging.getLogger("didpo.sandbox")

BWRAP = "bwrap"
FALLBACK = "rlimits"
WORKER_IN_SANDBOX = "/opt/didpo/_worker.py"
RPC_IN_SANDBOX = "/opt/didpo/_rpc.py"
# flock files, one per uid pair: concurrent pools (didpo compare --jobs N) never share a slot uid
UID_LOCK_DIR = "/tmp/.didpo-sandbox-uids"
MAX_UID_PAIRS = 4096
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf")
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",  # the reference and the candidate see the same set/dict orders
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


class InfraError(RuntimeError):
    """The sandbox itself failed (worker died, protocol broke, could not start): never the policy's fault."""


class SlotDirty(InfraError):
    """A slot that an earlier job left unclean refused a job: replace the slot and run the job there."""


def _in_keeper_thread(fn):
    """Run `fn` on one thread that lives as long as the process. bubblewrap's --die-with-parent fires when
    the *thread* that started it exits, so a slot restarted from a short-lived thread (a rollout worker's
    executor) would die under the next job."""
    with _KEEPER_LOCK:
        if not _KEEPER:
            jobs: queue.Queue = queue.Queue()

            def serve():
                while True:
                    task, box, done = jobs.get()
                    try:
                        box.append((True, task()))
                    except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                        box.append((False, exc))
                    done.set()

            threading.Thread(target=serve, name="didpo-sandbox-keeper", daemon=True).start()
            _KEEPER.append(jobs)
    box: list = []
    done = threading.Event()
    _KEEPER[0].put((fn, box, done))
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


_KEEPER: list = []
_KEEPER_LOCK = threading.Lock()


def _python_roots() -> list[str]:
    """Directories the interpreter needs: the venv (sys.prefix) and the base installation, deduplicated."""
    roots = []
    for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        p = os.path.realpath(p) if p != sys.prefix else p
        if p.startswith("/usr/") or p == "/usr":
            continue  # already bound with /usr
        if not any(p == r or p.startswith(r + "/") for r in roots):
            roots = [r for r in roots if not r.startswith(p + "/")] + [p]
    return roots


def bwrap_argv(settings: SandboxSettings, worker_cfg: dict) -> list[str]:
    """The bubblewrap command line of one slot (see module docstring for what it isolates)."""
    argv = [
        settings.bwrap_path,
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--clearenv",
    ]
    for key, value in _ENV.items():
        argv += ["--setenv", key, value]
    argv += ["--setenv", "HOME", "/ws", "--setenv", "TMPDIR", "/tmp"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for f in _ETC_FILES:
        argv += ["--ro-bind-try", f, f]
    argv += [
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(settings.tmp_bytes), "--tmpfs", "/dev/shm",
        "--size", str(settings.tmp_bytes), "--tmpfs", "/tmp",
        "--size", str(settings.workspace_bytes), "--perms", "0755", "--tmpfs", "/ws",
        "--size", str(settings.tmp_bytes), "--perms", "0700", "--tmpfs", "/tests",
    ]
    # The interpreter is bound after the tmpfs mounts: a checkout or venv under /tmp stays visible.
    made = {"/", "/etc", "/usr", "/tmp", "/dev", "/proc", "/ws", "/tests"}
    roots = _python_roots()
    for root in roots:
        parts = Path(root).parts
        for i in range(2, len(parts)):
            anc = str(Path(*parts[:i]))
            if anc not in made:
                argv += ["--perms", "0755", "--dir", anc]
                made.add(anc)
        argv += ["--ro-bind", root, root]
    # Installed from a wheel, this project sits in the bound site-packages with its bundled data (hidden
    # tests): an empty tmpfs over each of its packages keeps the candidate from reading them.
    for package in own_packages():
        if any(package == r or package.startswith(r + "/") for r in roots):
            argv += ["--tmpfs", package]
    argv += [
        "--perms", "0755", "--dir", "/opt/didpo",
        "--ro-bind", _worker.__file__, WORKER_IN_SANDBOX,
        "--ro-bind", _worker.RPC_FILE, RPC_IN_SANDBOX,
        "--chdir", "/ws",
        sys.executable, "-s", "-B", WORKER_IN_SANDBOX, json.dumps(worker_cfg),
    ]
    return argv


def own_packages() -> list[str]:
    """The folders of this project's packages (pipeline, training, workflows), resolved."""
    import importlib.util

    found = []
    for name in ("pipeline", "training", "workflows"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found += [os.path.realpath(p) for p in spec.submodule_search_locations]
    return found


def _claim_uid_pair(base: int) -> tuple[int, int]:
    """Lock the lowest free uid pair (base+2j, base+2j+1) for this process: (j, lock fd). The lock lives as
    long as the descriptor, so a killed pool frees its pairs by itself."""
    os.makedirs(UID_LOCK_DIR, mode=0o1777, exist_ok=True)
    for j in range(MAX_UID_PAIRS):
        fd = os.open(os.path.join(UID_LOCK_DIR, f"{base + 2 * j}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return j, fd
        except OSError:
            os.close(fd)
    raise InfraError(f"no free sandbox uid pair from uid {base} ({MAX_UID_PAIRS} pairs in use)")


class _Worker:
    """One slot: a running worker process and its framed request/response pipes, and its own uid pair."""

    def __init__(self, settings: SandboxSettings, index: int, isolation: str):
        self.settings, self.index, self.isolation = settings, index, isolation
        self.proc: subprocess.Popen | None = None
        self._dirs: list[str] = []
        self.pair, self._lock_fd = _claim_uid_pair(settings.uid_base)

    def uids(self) -> tuple[int, int]:
        """(tests uid, candidate uid) of this slot."""
        base = self.settings.uid_base + 2 * self.pair
        return base, base + 1

    def _cfg(self) -> dict:
        s = self.settings
        uid_test, uid_code = self.uids()
        cfg = {
            "limits": s.limits(),
            "uid_test": uid_test,
            "uid_code": uid_code,
            "output_keep_bytes": s.output_keep_bytes,
            "output_kill_bytes": s.output_kill_bytes,
            "preload": list(s.preload),
        }
        if self.isolation == BWRAP:
            # a venv under /tmp is bound inside the private /tmp: its top folder stays (root's, read-only)
            in_tmp = sorted({Path(r).parts[2] for r in _python_roots() if Path(r).parts[1:2] == ("tmp",)
                             and len(Path(r).parts) > 2})
            return {**cfg, "workspace_dir": "/ws", "tmp_dir": "/tmp", "tests_dir": "/tests",
                    "extra_tmp": ["/dev/shm"], "keep": {"/tmp": in_tmp}}
        base = tempfile.mkdtemp(prefix=f"didpo-slot{self.index}-")
        os.chmod(base, 0o755)
        dirs = {name: os.path.join(base, name) for name in ("ws", "tmp", "tests")}
        for d in dirs.values():
            os.mkdir(d)
        self._dirs = [base]
        return {**cfg, "workspace_dir": dirs["ws"], "tmp_dir": dirs["tmp"], "tests_dir": dirs["tests"]}

    def release(self) -> None:
        """Give the uid pair back (after the worker is killed)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def start(self, deadline_s: float = 60.0) -> None:
        cfg = self._cfg()
        if self.isolation == BWRAP:
            argv, env, cwd = bwrap_argv(self.settings, cfg), None, "/"
        else:
            argv = [sys.executable, "-s", "-B", _worker.__file__, json.dumps(cfg)]
            env = {**_ENV, "HOME": cfg["workspace_dir"], "TMPDIR": cfg["tmp_dir"]}
            cwd = cfg["workspace_dir"]
        self.proc = _in_keeper_thread(lambda: subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
            start_new_session=True, close_fds=True,
        ))
        threading.Thread(target=self._drain_stderr, args=(self.proc,), daemon=True).start()
        hello = self._read(time.monotonic() + deadline_s)
        if not hello or not hello.get("ready"):
            self.kill()
            raise InfraError(f"sandbox slot {self.index} ({self.isolation}) did not start: {hello!r}")

    def _drain_stderr(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:  # the worker itself never writes here unless the interpreter fails
            log.debug("sandbox slot %d stderr: %s", self.index, line.decode(errors="replace").rstrip())

    def _read(self, deadline: float):
        assert self.proc is not None and self.proc.stdout is not None
        try:
            return _worker.read_msg(self.proc.stdout.fileno(), deadline)
        except (TimeoutError, ValueError, OSError) as exc:
            raise InfraError(f"sandbox slot {self.index}: {exc}") from exc

    def request(self, msg: dict, timeout_s: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            raise InfraError(f"sandbox slot {self.index} is not running")
        try:
            _worker.write_msg(self.proc.stdin.fileno(), msg)
        except OSError as exc:
            raise InfraError(f"sandbox slot {self.index}: cannot send job: {exc}") from exc
        reply = self._read(time.monotonic() + timeout_s)
        if reply is None:
            raise InfraError(f"sandbox slot {self.index}: worker exited (status {self.proc.wait()})")
        if not reply.get("ok"):
            kind = SlotDirty if reply.get("dirty") else InfraError
            raise kind(f"sandbox slot {self.index}: {reply.get('error', 'unknown worker error')}")
        return reply

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                pass
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                if f is not None:
                    f.close()
            self.proc = None
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)
        self._dirs = []


def _isolation_problems(probe: dict) -> list[str]:
    """Empty when the probe shows full isolation and the same interpreter as the host."""
    child = probe.get("child", {})
    problems = []
    if probe.get("executable") != sys.executable or probe.get("version") != sys.version:
        problems.append(f"interpreter differs: {probe.get('executable')} {probe.get('version')!r}")
    if child.get("uid", 0) == 0 or child.get("euid", 0) == 0:
        problems.append("untrusted code runs as root")
    if child.get("readable", True):
        problems.append(f"untrusted code can read {child.get('readable')}")
    for key in ("write_usr", "network"):
        if child.get(key, True):
            problems.append(f"untrusted code can {key.replace('_', ' ')}")
    return problems


def secret_paths() -> list[str]:
    """Host paths that must stay invisible inside the sandbox: shadow file, home contents, this repository."""
    from pipeline.assets import asset_dir

    # this file, and a bundled benchmark file (hidden tests), wherever the project is installed
    paths = ["/etc/shadow", str(Path(__file__).resolve()), str(asset_dir("data") / "HumanEval.jsonl.gz")]
    roots = _python_roots()
    home = Path.home()
    try:
        entries = sorted(home.iterdir())[:20]
    except OSError:
        entries = []
    for entry in entries:  # the home's own files, minus the ones that hold the bound interpreter
        if not any(r == str(entry) or r.startswith(str(entry) + "/") for r in roots):
            paths.append(str(entry))
    return paths


def _check_unprivileged_interpreter(uid: int) -> None:
    """Without namespaces the candidate's interpreter starts from the host's files as a non-root uid: refuse
    clearly when that uid cannot (e.g. the interpreter lives under a root-only home)."""
    if os.getuid() != 0:
        return  # not root: the code runs as this user, who can start the interpreter
    try:
        proc = subprocess.run([sys.executable, "-S", "-s", "-c", "import os"], user=uid, group=uid, cwd="/",
                              capture_output=True, timeout=60, env=_ENV)
        problem = proc.returncode != 0 and (proc.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
    except (OSError, subprocess.SubprocessError) as exc:
        problem = str(exc)
    if problem:
        raise InfraError(f"sandbox.isolation: rlimits runs candidate code as uid {uid}, which cannot start "
                         f"{sys.executable} ({problem[:200]}); use isolation: bwrap or a world-readable Python")


class SandboxPool:
    """Thread-safe pool of warm workers. `execute(job)` returns the worker's raw report (see `judge`)."""

    def __init__(self, settings: SandboxSettings | None = None):
        self.settings = settings or SandboxSettings()
        self.isolation = self._choose_isolation()
        self._slots: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        for i in range(self.settings.pool_size):
            w = _Worker(self.settings, i, self.isolation)
            w.start()
            self._all.append(w)
            self._slots.put(w)

    def _choose_isolation(self) -> str:
        """bwrap, verified from inside a probe slot; else refuse, unless the config asks for rlimits."""
        if self.settings.isolation == FALLBACK:
            _check_unprivileged_interpreter(self.settings.uid_base)
            log.warning("sandbox: isolation=rlimits from the config: untrusted code runs with rlimits and a "
                        "separate uid only, NO filesystem or network isolation; every result says so")
            return FALLBACK
        reason = None
        if shutil.which(self.settings.bwrap_path) is None:
            reason = f"bubblewrap executable {self.settings.bwrap_path!r} not found"
        else:
            w = _Worker(self.settings, 0, BWRAP)
            try:
                w.start(deadline_s=30.0)
                probe = w.request({"op": "probe", "secret_paths": secret_paths()}, 30.0)["probe"]
                problems = _isolation_problems(probe)
                reason = "; ".join(problems) or None
            except InfraError as exc:
                reason = str(exc)
            finally:
                w.kill()
                w.release()
        if reason is None:
            log.info("sandbox: bubblewrap isolation verified (pid/net/ipc/uts namespaces, non-root uid)")
            return BWRAP
        raise InfraError(f"sandbox refuses to run untrusted code: bubblewrap isolation unusable ({reason}); "
                         f"install bubblewrap, or set sandbox.isolation: rlimits to run without it")

    def execute(self, job: dict, timeout_s: float | None = None) -> dict:
        """Run one job; retries on sandbox failure, then returns {"infra_error": message}."""
        timeout = float(timeout_s if timeout_s is not None else self.settings.timeout_s)
        job = {**job, "timeout_s": timeout}
        last, attempts, replaced = "", self.settings.infra_retries + 1, 0
        while attempts > 0:
            worker = self._slots.get()
            try:
                return self._run_on(worker, job, timeout)
            except SlotDirty as exc:  # the earlier job's wreckage, not this job's: a fresh slot, no attempt spent
                last = str(exc)
                replaced += 1
                attempts -= replaced > 2
                log.warning("sandbox slot %d left unclean by an earlier job; replacing it: %s", worker.index, last)
                self._restart(worker)
            except InfraError as exc:
                last = str(exc)
                attempts -= 1
                log.warning("sandbox infra error (will restart slot %d): %s", worker.index, last)
                self._restart(worker)
            finally:
                self._slots.put(worker)
        return {"infra_error": last}

    def _run_on(self, worker: _Worker, job: dict, timeout: float) -> dict:
        # grace for workspace setup, the sweep and transport; the worker enforces the deadline itself
        return worker.request({"op": "run", "job": job}, timeout + 15.0)["report"]

    def _restart(self, worker: _Worker) -> None:
        worker.kill()
        try:
            worker.start()
        except InfraError as exc:
            log.error("sandbox slot %d failed to restart: %s", worker.index, exc)

    def probe(self) -> dict:
        """The isolation probe of one live slot (what untrusted code can and cannot do)."""
        worker = self._slots.get()
        try:
            return worker.request({"op": "probe", "secret_paths": secret_paths()}, 30.0)["probe"]
        finally:
            self._slots.put(worker)

    def alive(self) -> int:
        return sum(1 for w in self._all if w.proc is not None and w.proc.poll() is None)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for w in self._all:
            w.kill()
            w.release()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter shutdown
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
