"""The honest judge: turns a Task's test suite + a workspace into an `ExecResult`, never trusting the code.

Exit codes and stdout of the code under test are ignored. Outcomes come from the trusted test process T,
which never runs candidate code (it calls into a separate, freshly exec'd candidate process over an RPC
boundary that only lets plain data through; see `_rpc`), on a result channel the candidate does not hold:
  check  - T runs the `check` functions;
  pytest - T runs pytest over the test files;
  io     - T streams the candidate's plain-data outputs, compared here, outside the sandbox, with the
           reference's outputs (cached), by the task's `meta["output_check"]` (EvalPlus's oracles).
A run that does not complete the harness scores 0 passed. Whatever the candidate's files, names or output
can cause is scored as its own outcome (crashed, failed, timeout), never as `infra_error`.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import signal
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from pipeline.sandbox import _worker
from pipeline.sandbox.pool import SandboxPool
from pipeline.tasks.base import Task, TestSuite
from pipeline.tasks.cases import parse_python
from pipeline.tasks.checks import OUTPUT_CHECKS, output_matches

ExecStatus = Literal["passed", "failed", "timeout", "crashed", "invalid_action", "infra_error"]
EXEC_STATUSES: tuple[str, ...] = ("passed", "failed", "timeout", "crashed", "invalid_action", "infra_error")


@dataclass(frozen=True)
class CaseResult:
    name: str  # "line 12: assert candidate(...) == ..." / io "input 3" / pytest node id
    passed: bool
    detail: str = ""  # why it failed (exception, wrong output), short


@dataclass(frozen=True)
class ExecResult:
    status: ExecStatus
    passed: int  # verified passing cases
    total: int  # cases in the suite
    duration_s: float  # wall time inside the sandbox
    isolation: str  # "bwrap" or "rlimits" (degraded fallback)
    cases: tuple[CaseResult, ...] = ()
    stdout: str = ""  # capped; never used for scoring
    stderr: str = ""
    detail: str = ""  # run-level explanation (import error, timeout, infra error)
    extra: dict = field(default_factory=dict)

    @property
    def pass_fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["pass_fraction"] = self.pass_fraction
        return d


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=4096)  # runs on every check execution: a task's texts are parsed once
def _top_level_names(source: str) -> frozenset[str]:
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return frozenset()
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))


def _given_helpers(start: Mapping[str, str] | None, reference: Mapping[str, str] | None,
                   suite: TestSuite) -> dict | None:
    """The helpers a task gives in its own starting code (HumanEval/32's `poly`, /38's `encode_cyclic`), as
    the reference defines them: {"source": reference module, "names": [...]}, or None. Tests that call a
    helper then call the task's, never one the candidate rewrote to make any answer pass."""
    if not start or not reference or suite.kind != "check":
        return None
    try:
        module = _module_of(suite, start)
    except ValueError:
        return None
    path = f"{module}.py"
    if path not in reference or path not in start:
        return None
    names = (_top_level_names(start[path]) & _top_level_names(reference[path])) - {suite.entry_point or "candidate"}
    return {"source": reference[path], "names": sorted(names)} if names else None


def _module_of(suite: TestSuite, files: Mapping[str, str]) -> str:
    if suite.module:
        return suite.module
    py = [p for p in files if p.endswith(".py") and "/" not in p and not p.startswith("test")]
    if len(py) == 1:
        return py[0][:-3]
    raise ValueError(f"test suite names no module and the workspace has {len(py)} candidate modules: {py}")


# checks whose raw outputs may not be plain data (re.Match): the sandbox sends a reduced value instead
_OUTPUT_REDUCTIONS = {"not_none": "not_none"}


class Judge:
    """Runs suites through a `SandboxPool`. Thread-safe; the reference-output cache is per judge."""

    def __init__(self, pool: SandboxPool, timeout_s: float | None = None):
        self.pool = pool
        self.timeout_s = timeout_s
        self._expected: dict[str, list | ExecResult] = {}
        self._lock = threading.Lock()

    # -- public
    def run(self, task: Task, files: Mapping[str, str], *, hidden: bool = False) -> ExecResult:
        """Execute the task's hidden (or visible) tests against `files` (path -> text).

        Task meta the judge honours: "output_check" (io comparison, default "equal"; see `output_matches`) and
        "timeout_s" (a wall-clock floor for this task's runs, for suites whose reference is slow: the deadline
        is the larger of it and the judge's; the CPU rlimit stays the pool's).
        """
        suite = task.hidden_tests if hidden else task.visible_tests
        return self.run_suite(suite, files, reference=task.reference, given=task.workspace,
                              cache_key=f"{task.task_id}|{hidden}",
                              output_check=task.meta.get("output_check", "equal"),
                              timeout_s=task.meta.get("timeout_s"))

    def run_suite(self, suite: TestSuite, files: Mapping[str, str], *, reference: Mapping[str, str] | None = None,
                  given: Mapping[str, str] | None = None, cache_key: str = "", output_check: str = "equal",
                  timeout_s: float | None = None) -> ExecResult:
        """Run `suite` against `files`; `timeout_s` raises the wall deadline of these runs (never lowers it).
        `given`: the task's starting files, whose helpers check tests take from `reference` (`_given_helpers`)."""
        files = dict(files)
        if output_check not in OUTPUT_CHECKS:
            raise ValueError(f"unknown output check {output_check!r}; allowed: {', '.join(OUTPUT_CHECKS)}")
        if timeout_s is not None and not (isinstance(timeout_s, int | float) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        default = self.timeout_s if self.timeout_s is not None else self.pool.settings.timeout_s
        timeout = max(default, timeout_s or 0.0)
        size = sum(len(p.encode("utf-8", "surrogatepass")) + len(t.encode("utf-8", "surrogatepass"))
                   for p, t in files.items())
        if size > self.pool.settings.workspace_bytes:  # the candidate's doing: never sent, never infra_error
            return ExecResult(status="crashed", passed=0, total=_suite_size(suite), duration_s=0.0,
                              isolation=self.pool.isolation,
                              detail=f"workspace: the files take {size} bytes, over the workspace's "
                                     f"{self.pool.settings.workspace_bytes}")
        if suite.kind == "check":
            return self._run_check(suite, files, _given_helpers(given, reference, suite), timeout)
        if suite.kind == "io":
            if reference is None:
                raise ValueError("io suites need the reference workspace to compute expected outputs")
            expected = self._expected_outputs(suite, dict(reference), cache_key, output_check, timeout)
            if isinstance(expected, ExecResult):
                return expected
            return self._run_io(suite, files, expected, output_check, timeout)
        if suite.kind == "pytest":
            return self._run_pytest(suite, files, timeout)
        raise ValueError(f"unknown test suite kind {suite.kind!r}")

    # -- kinds
    def _execute(self, job: dict, timeout: float) -> dict:
        return self.pool.execute(job, timeout)

    def _run_check(self, suite: TestSuite, files: dict, given: dict | None, timeout: float) -> ExecResult:
        if not suite.files:
            raise ValueError("check suite without a test file")
        total = 0
        for path, source in suite.files.items():
            try:
                total += max(1, len(_worker.instrument_check(source, path)[1]))
            except SyntaxError as exc:
                raise ValueError(f"test file {path}: cannot parse: {exc}") from exc
        module, entry_point = _module_of(suite, files), suite.entry_point or "candidate"
        job = {"kind": "check", "files": files, "tests": [[p, s] for p, s in suite.files.items()],
               "module": module, "entry_point": entry_point, "objects": suite.objects}
        if given:
            job["given"] = given
        return self._interpret_check(self._execute(job, timeout), total)

    def _candidate_fault(self, report: dict, total: int) -> ExecResult | None:
        """The candidate's files could not be laid out (a path too long, no space): its outcome, scored 0."""
        if "workspace_error" not in report:
            return None
        return ExecResult(status="crashed", passed=0, detail=f"workspace: {report['workspace_error']}"[:500],
                          **self._base(report, total))

    def _interpret_check(self, report: dict, total: int) -> ExecResult:
        if "infra_error" in report:
            return self._infra(report["infra_error"], total)
        if (fault := self._candidate_fault(report, total)) is not None:
            return fault
        done = next((r for r in report["records"] if isinstance(r, dict) and r.get("done")), None)
        code_exit = report["exits"].get("code", {})
        base = self._base(report, total)
        if report["output_exceeded"]:
            return ExecResult(status="crashed", passed=0, detail="output limit exceeded", **base)
        if report["timed_out"] or _cpu_killed(report):
            return ExecResult(status="timeout", passed=0, detail="deadline or CPU limit exceeded", **base)
        if done is None:
            return ExecResult(status="crashed", passed=0, detail="the test harness did not complete", **base)
        cases = tuple(CaseResult(f"{c['path']}:{c['line']}: {c['source']}", bool(c["passed"]), str(c["detail"]))
                      for c in done["cases"])
        passed = sum(c.passed for c in cases)
        if done.get("import_error"):
            return ExecResult(status="crashed", passed=0, cases=cases,
                              detail=f"import failed: {done['import_error']}", **base)
        if passed == len(cases):
            status = "passed"
        elif code_exit.get("signal") is not None or code_exit.get("code") not in (0, None):
            status = "crashed"
        else:
            status = "failed"
        return ExecResult(status=status, passed=passed, cases=cases, **base)

    def _run_io_raw(self, suite: TestSuite, files: dict, output_check: str,
                    timeout: float) -> tuple[dict, list | None]:
        """Run the io harness; returns (report, outputs) where outputs is None if the harness did not finish."""
        job = {"kind": "io", "files": files, "module": _module_of(suite, files),
               "entry_point": suite.entry_point, "inputs": [_worker.encode(list(a)) for a in suite.inputs],
               "reduce": _OUTPUT_REDUCTIONS.get(output_check)}
        report = self._execute(job, timeout)
        if "infra_error" in report or "workspace_error" in report:
            return report, None
        recs = [r for r in report["records"] if isinstance(r, dict)]
        if not any(r.get("done") for r in recs) or report["timed_out"] or report["output_exceeded"]:
            return report, None
        outputs: list = [None] * len(suite.inputs)
        for r in recs:
            i = r.get("case")
            if isinstance(i, int) and 0 <= i < len(outputs):
                outputs[i] = r
        return report, outputs

    def _expected_outputs(self, suite: TestSuite, reference: dict, key: str, output_check: str,
                          timeout: float) -> list | ExecResult:
        """The reference's outputs, or the infra_error every candidate of the task gets instead. Cached per
        judge, a reference that fails too (it fails the same way each time), except a failure of the pool."""
        reduce = _OUTPUT_REDUCTIONS.get(output_check)
        key = f"{key}|{_hash([reference, list(suite.inputs), suite.entry_point, suite.module, reduce])}"
        with self._lock:
            if key in self._expected:
                return self._expected[key]
        # the reference is ours, not the candidate's: its deadline is the roomier one (what the candidate is
        # held to stays `timeout`), so a loaded box does not make a slow reference an infra_error
        deadline = max(timeout, self.pool.settings.reference_timeout_s)
        report, outputs = self._run_io_raw(suite, reference, output_check, deadline)
        if outputs is None and "infra_error" in report:  # the sandbox's failure: the next run tries again
            return self._infra(f"cannot compute expected outputs: {report['infra_error']}", len(suite.inputs))
        result = self._expected_from(suite, outputs, report)
        with self._lock:
            self._expected[key] = result
        return result

    def _expected_from(self, suite: TestSuite, outputs: list | None, report: dict) -> list | ExecResult:
        if outputs is None:
            why = report.get("workspace_error") or "the reference solution did not complete its io harness"
            return self._infra(f"cannot compute expected outputs: {why}", len(suite.inputs))
        expected = [_decode_output(o) if o is not None else ("missing", None) for o in outputs]
        opaque = [i for i, (kind, value) in enumerate(expected)
                  if kind in ("missing", "malformed") or (kind, value) == ("exc", _worker.NotPlain.__name__)]
        if opaque:  # nothing to compare with: any candidate output of the same shape would "pass"
            return self._infra(f"cannot compute expected outputs: the reference returned no plain data for "
                               f"input {opaque[0]} ({len(opaque)} inputs in all)", len(suite.inputs))
        return expected

    def _run_io(self, suite: TestSuite, files: dict, expected: list, output_check: str,
                timeout: float) -> ExecResult:
        total = len(suite.inputs)
        report, outputs = self._run_io_raw(suite, files, output_check, timeout)
        if "infra_error" in report:
            return self._infra(report["infra_error"], total)
        if (fault := self._candidate_fault(report, total)) is not None:
            return fault
        base = self._base(report, total)
        if report["timed_out"] or _cpu_killed(report):
            return ExecResult(status="timeout", passed=0, detail="deadline or CPU limit exceeded", **base)
        if outputs is None:
            recs = [r for r in report["records"] if isinstance(r, dict) and "import_error" in r]
            why = f"import failed: {recs[0]['import_error']}" if recs else "the io harness did not complete"
            if report["output_exceeded"]:
                why = "output limit exceeded"
            return ExecResult(status="crashed", passed=0, detail=why, **base)
        cases = []
        for i, (exp, out) in enumerate(zip(expected, outputs, strict=True)):
            got = _decode_output(out) if out is not None else ("missing", None)
            ok = exp[0] == got[0] and (
                output_matches(output_check, exp[1], got[1], suite.inputs[i], suite.atol) if exp[0] == "ok"
                else exp[1] == got[1])
            cases.append(CaseResult(f"input {i}", ok, "" if ok else _io_detail(suite.inputs[i], exp, got)))
        passed = sum(c.passed for c in cases)
        return ExecResult(status="passed" if passed == total else "failed", passed=passed, cases=tuple(cases),
                          **base)

    def _run_pytest(self, suite: TestSuite, files: dict, timeout: float) -> ExecResult:
        report = self._execute({"kind": "pytest", "files": files, "test_files": dict(suite.files),
                                "test_paths": list(suite.files)}, timeout)
        total = suite.n_cases
        if "infra_error" in report:
            return self._infra(report["infra_error"], total)
        if (fault := self._candidate_fault(report, total)) is not None:
            return fault
        base = self._base(report, total)
        if report["timed_out"] or _cpu_killed(report):
            return ExecResult(status="timeout", passed=0, detail="deadline or CPU limit exceeded", **base)
        done = [r for r in report["records"] if isinstance(r, dict) and r.get("done")]
        if len(done) != 1 or report["output_exceeded"]:
            why = "output limit exceeded" if report["output_exceeded"] else "the pytest harness did not complete"
            return ExecResult(status="crashed", passed=0, detail=why, **base)
        outcomes = {k: v for k, v in (done[0].get("outcomes") or {}).items() if v != "skipped"}  # skips: no case
        cases = tuple(CaseResult(str(k), v == "passed", "" if v == "passed" else str(v).removeprefix("failed: "))
                      for k, v in sorted(outcomes.items()))
        n = max(len(cases), 1)
        passed = sum(c.passed for c in cases)
        base["total"] = n
        status = "passed" if cases and passed == n and done[0].get("code") == 0 else "failed"
        return ExecResult(status=status, passed=passed if cases else 0, cases=cases, **base)

    # -- helpers
    def _base(self, report: dict, total: int) -> dict:
        return {"total": total, "duration_s": float(report.get("duration_s", 0.0)),
                "isolation": self.pool.isolation, "stdout": report.get("stdout", ""),
                "stderr": report.get("stderr", "")}

    def _infra(self, message: str, total: int) -> ExecResult:
        return ExecResult(status="infra_error", passed=0, total=total, duration_s=0.0,
                          isolation=self.pool.isolation, detail=str(message)[:2000])


def _suite_size(suite: TestSuite) -> int:
    if suite.kind == "io":
        return len(suite.inputs)
    if suite.kind == "pytest":
        return suite.n_cases
    return max(1, len(suite.files))


def _cpu_killed(report: dict) -> bool:
    return any(e.get("signal") == signal.SIGXCPU for e in report["exits"].values())


def _decode_output(rec: dict) -> tuple[str, object]:
    try:
        if "ok" in rec:
            return "ok", _worker.decode(rec["ok"])
        return "exc", str(rec.get("exc"))
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return "malformed", None


def _shown(value, limit: int = 120) -> str:
    """repr cut to `limit` characters, never raising: a candidate can return an int Python refuses to print
    (10**5000 passes the digit limit of str()) or a list nested beyond the recursion limit, and what the
    candidate causes is its score, never an exception in the judge."""
    try:
        return repr(value)[:limit]
    except (ValueError, RecursionError):
        return f"<{type(value).__name__} too large to show>"


def _io_detail(args, exp, got) -> str:
    shown = _shown(tuple(args))
    if got[0] == "exc":
        return f"f{shown} raised {got[1]}"
    if exp[0] == "exc":
        return f"f{shown} should raise {exp[1]}"
    return f"f{shown} returned {_shown(got[1])}"  # the expected value is not revealed (hidden tests)
