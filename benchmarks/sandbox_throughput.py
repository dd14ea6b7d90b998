"""Sandbox throughput: executions per second per core, sandboxed vs an unsandboxed subprocess.

Workload: the bundled HumanEval tasks, reference solution against the hidden check tests, every task once
per round. Sandboxed = `Judge` over a warm `SandboxPool` (bubblewrap when available) with one worker per
core; plain = one fresh `python` subprocess per execution running the same tests in-process (the usual
unsandboxed harness), with the same concurrency. Target: ratio >= 0.7.
Last line: `sandbox_throughput: sandboxed_per_s=<float> plain_per_s=<float> ratio=<float>` (per core).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.sandbox import Judge, SandboxPool, SandboxSettings
from pipeline.tasks import load_source

_PLAIN_RUNNER = """
import sys, importlib
sys.path.insert(0, '.')
mod = importlib.import_module('solution')
ok = True
for path in sys.argv[2:]:
    ns = {}
    exec(compile(open(path).read(), path, 'exec'), ns)
    try:
        ns['check'](getattr(mod, sys.argv[1]))
    except Exception:
        ok = False
sys.exit(0 if ok else 1)
"""


def _plain_run(task, root: Path) -> bool:
    d = Path(tempfile.mkdtemp(dir=root))
    for rel, text in {**task.reference, **task.hidden_tests.files}.items():
        (d / rel).write_text(text)
    proc = subprocess.run(
        [sys.executable, "-c", _PLAIN_RUNNER, task.hidden_tests.entry_point, *task.hidden_tests.files],
        cwd=d,
        capture_output=True,
        timeout=60,
    )
    return proc.returncode == 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="tasks (default: all 164)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="concurrency = cores used")
    args = ap.parse_args(argv)
    tasks = load_source("humaneval", limit=args.limit)
    n, w = len(tasks), args.workers
    with SandboxPool(SandboxSettings(pool_size=w)) as pool, ThreadPoolExecutor(w) as ex:
        judge = Judge(pool)
        list(ex.map(lambda t: judge.run(t, t.reference, hidden=True), tasks[:w]))  # warm-up
        t0 = time.perf_counter()
        sandboxed = list(ex.map(lambda t: judge.run(t, t.reference, hidden=True), tasks))
        sb_s = time.perf_counter() - t0
        isolation = pool.isolation
    with tempfile.TemporaryDirectory() as root, ThreadPoolExecutor(w) as ex:
        t0 = time.perf_counter()
        plain = list(ex.map(lambda t: _plain_run(t, Path(root)), tasks))
        pl_s = time.perf_counter() - t0
    sb_rate, pl_rate = n / sb_s / w, n / pl_s / w
    print(f"{'mode':<12}{'executions':>11}{'passed':>8}{'seconds':>9}{'per_s/core':>12}")
    print(
        f"{'sandboxed':<12}{n:>11}{sum(r.status == 'passed' for r in sandboxed):>8}{sb_s:>9.2f}{sb_rate:>12.2f}"
        f"   ({isolation}, {w} workers)"
    )
    print(f"{'plain':<12}{n:>11}{sum(plain):>8}{pl_s:>9.2f}{pl_rate:>12.2f}")
    print(
        f"sandbox_throughput: sandboxed_per_s={sb_rate:.3f} plain_per_s={pl_rate:.3f} ratio={sb_rate / pl_rate:.3f}"
    )


if __name__ == "__main__":
    main()
