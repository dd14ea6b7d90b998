"""Every reference solution passes and every starting workspace (stub or buggy code) fails, through the sandbox.

Usage: python benchmarks/check_references.py [--source NAME ...] [--path FILE] [--limit N] [--pool N]
                                             [--timeout S]
Prints one line per source: tasks, references passed (hidden tests), starting workspaces failed (every
source's workspace is a stub or, for humanevalfix, buggy code), then the tasks that disagree. --path reads
one source from another file of its format (e.g. the full HumanEvalPlus.jsonl.gz instead of NoExtreme).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from pipeline.sandbox import Judge, SandboxPool, SandboxSettings
from pipeline.tasks import SOURCES, load_source


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", action="append", choices=sorted(SOURCES), help="default: all bundled sources")
    ap.add_argument("--path", default=None, help="a file of the (single) --source's format")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--pool", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args(argv)
    if args.path and len(args.source or []) != 1:
        ap.error("--path needs exactly one --source")
    logging.basicConfig(level=logging.WARNING)
    settings = SandboxSettings(pool_size=args.pool, timeout_s=args.timeout, cpu_s=int(args.timeout))
    bad = 0
    with SandboxPool(settings) as pool, ThreadPoolExecutor(args.pool) as ex:
        judge = Judge(pool)
        print(f"isolation: {pool.isolation}")
        for source in args.source or sorted(SOURCES):
            tasks = load_source(source, args.path, limit=args.limit)
            t0 = time.perf_counter()
            refs = list(ex.map(lambda t: judge.run(t, t.reference, hidden=True), tasks))
            starts = list(ex.map(lambda t: judge.run(t, t.workspace, hidden=True), tasks))
            ref_fail = [
                (t.task_id, r.status, r.detail or next((c.detail for c in r.cases if not c.passed), ""))
                for t, r in zip(tasks, refs, strict=True)
                if r.status != "passed"
            ]
            bug_pass = [t.task_id for t, r in zip(tasks, starts, strict=True) if r.status == "passed"]
            print(
                f"{source}: tasks={len(tasks)} reference_passed={len(tasks) - len(ref_fail)} "
                f"start_failed={len(tasks) - len(bug_pass)} ({time.perf_counter() - t0:.1f}s)"
            )
            for tid, status, why in ref_fail:
                print(f"  reference {status}: {tid}: {str(why)[:160]}")
            for tid in bug_pass:
                print(f"  start passed: {tid}")
            bad += len(ref_fail) + len(bug_pass)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
