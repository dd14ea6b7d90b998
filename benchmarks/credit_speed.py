"""Speed of the credit stage alone (pipeline.credit.compute_credit) on realistic batches.

Batches are built from the bundled tasks' reference solutions: each task starts from its reference with a
few injected bugs; every rollout runs 8 turns; every action bundles several search/replace edits (fixes that
restore a reference line, sometimes written slightly differently; neutral rewrites; harmful mutations), and
one action in ten rewrites the whole file. Bugs and harmful mutations come from the project's one mutation
path, `pipeline.tasks.repair.bug_candidates` (`line_mutations`, shared with credit_fidelity.py). Rollouts of
a task share many fixes (near duplicates across rollouts), as sampled trajectories of one policy do.

Measured on one core (the child process is pinned to one CPU): the paper-scale batch (6 tasks x 32 rollouts
x 8 turns = 1536 rows) and 8, 16, 32, 64, 128 rollouts per task; median of 3 runs per size; peak RSS of the
credit call. Beside it, a naive baseline: all pairs of the same candidates per (task, edit type) compared
with difflib's ratio. The naive baseline is run in full only up to NAIVE_PAIR_CAP pairs; above that it
times a fixed random sample of pairs and the table marks the figure "est" (pairs x measured time per pair).
The credit stage's per-text caches are cleared before every timed run (each run is a cold batch).

Beside didpo (the paper's estimator; the default is didpo_did), the same batches are timed with didpo_did (columns did_sec,
did/didpo; target: within 1.2x of didpo on the paper batch) and with grpo (grpo_ms: `compute_credit`
computes no sub-diffs or anchors for an estimator that does not read them, so this is what GRPO costs).

Targets: paper batch < 1 s; growth exponent (log-log slope of seconds vs rows, 8 -> 128 rollouts) <= 1.15.
Last line: `credit_speed: paper_batch_s=<float> exponent=<float> coverage=<float> naive_ratio=<float>`.
Run: `.venv/bin/python benchmarks/credit_speed.py [--quick]`.
"""

from __future__ import annotations

import argparse
import difflib
import json
import multiprocessing as mp
import os
import random
import re
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

N_TASKS, N_TURNS, PAPER_ROLLOUTS = 6, 8, 32
ROLLOUTS = (8, 16, 32, 64, 128)
NAIVE_PAIR_CAP = 400_000
NAIVE_SAMPLE = 20_000
_TOKENS = re.compile(r"\w+|\s+|[^\w\s]")


def _reference_sources(n: int) -> list[tuple[str, str]]:
    """(task_id, reference file text) of n bundled tasks with 15..60 code lines."""
    try:
        from pipeline.tasks import load_bundled

        tasks = [(t.task_id, next(iter(t.reference.values()))) for t in load_bundled() if t.reference]
    except Exception as error:  # the fallback is for a checkout without pipeline.tasks (see module docstring)
        import gzip

        print(f"pipeline.tasks unavailable ({error}); reading HumanEval.jsonl.gz directly", file=sys.stderr)
        with gzip.open("/work/shared/data/HumanEval.jsonl.gz", "rt") as f:
            records = [json.loads(line) for line in f]
        tasks = [(r["task_id"], r["prompt"] + r["canonical_solution"]) for r in records]
    sized = []
    for task_id, text in tasks:
        code = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if 15 <= len(code) <= 60:
            sized.append((task_id, text))
    # Evenly spaced over the sources; the mutation check (a parse per candidate bug) runs only on the
    # spaced picks, in order, until n have at least 6 mutable lines.
    step = max(1, len(sized) // n)
    chosen = []
    for task_id, text in sized[::step] + [t for k, t in enumerate(sized) if k % step]:
        if len(line_mutations(text)) >= 6:
            chosen.append((task_id, text))
            if len(chosen) == n:
                break
    return chosen


def line_mutations(text: str) -> dict[int, list[str]]:
    """0-based line -> its harmful rewrites (newline kept), from the project's one mutation path,
    `pipeline.tasks.repair.bug_candidates`. delete_line is left out: it removes a line instead of writing
    one, and both benchmarks rewrite lines in place."""
    from pipeline.tasks.repair import FAMILIES, bug_candidates

    lines = text.splitlines(keepends=True)
    out: dict[int, list[str]] = {}
    for bug in bug_candidates(text, [f for f in FAMILIES if f != "delete_line"]):
        original = lines[bug.line - 1]
        ending = original[len(original.rstrip("\r\n")) :]
        out.setdefault(bug.line - 1, []).append(bug.buggy + ending)
    return out


def _offsets(text: str) -> tuple[np.ndarray, np.ndarray]:
    spans = [(m.start(), m.end()) for m in _TOKENS.finditer(text)]
    return np.array([s for s, _ in spans], np.int64), np.array([e for _, e in spans], np.int64)


def build_batch(n_rollouts: int, seed: int = 0):
    from pipeline.credit import Edit, StepInput

    rng = random.Random(seed)
    steps = []
    for task_id, reference in _reference_sources(N_TASKS):
        ref = reference.splitlines(keepends=True)
        mutations = line_mutations(reference)
        mutable = sorted(mutations)
        bugs = rng.sample(mutable, 3)
        start = list(ref)
        for i in bugs:
            start[i] = rng.choice(mutations[i])
        for g in range(n_rollouts):
            lines = list(start)
            total = 0.0
            style = rng.random() < 0.3  # this rollout writes its fixes slightly differently
            for turn in range(N_TURNS):
                before = "".join(lines)
                targets = set()
                n_edits = rng.randint(2, 4)
                for _ in range(n_edits):
                    roll = rng.random()
                    open_bugs = [i for i in bugs if lines[i] != ref[i] and i not in targets]
                    if roll < 0.5 and open_bugs:
                        i = rng.choice(open_bugs)
                        new = ref[i].rstrip("\n") + ("  # fixed\n" if style else "\n")
                    elif roll < 0.75:
                        i = rng.choice(mutable)
                        if i in targets:
                            continue
                        new = lines[i].rstrip("\n").rstrip() + "  # keep\n" if "#" not in lines[i] else ref[i]
                    else:
                        i = rng.choice(mutable)
                        options = mutations[i]  # harmful rewrites of the reference line
                        if i in targets or not options:
                            continue
                        new = rng.choice(options)
                    targets.add(i)
                    lines[i] = new
                after = "".join(lines)
                response = (
                    f"<think>Turn {turn}: I will change {len(targets)} places in solution.py.</think>\n"
                )
                edits = []
                if rng.random() < 0.1:  # whole-file rewrite
                    response += '<write path="solution.py">\n'
                    span = (len(response), len(response) + len(after))
                    response += after + "</write>\n"
                    edits.append(Edit("write", "solution.py", "", after, None, span))
                else:
                    old = before.splitlines(keepends=True)
                    for i in sorted(targets):
                        lo, hi = max(0, i - 1), min(len(lines), i + 2)  # one line of context each side
                        search, replace = "".join(old[lo:hi]), "".join(lines[lo:hi])
                        response += '<edit path="solution.py">\n<search>\n'
                        s_span = (len(response), len(response) + len(search))
                        response += search + "</search>\n<replace>\n"
                        r_span = (len(response), len(response) + len(replace))
                        response += replace + "</replace>\n</edit>\n"
                        edits.append(Edit("replace", "solution.py", search, replace, s_span, r_span))
                fixed = sum(
                    lines[i] == ref[i] or lines[i].split("#")[0].rstrip() == ref[i].rstrip() for i in bugs
                )
                reward = 0.1 * fixed / len(bugs) + (
                    1.0 if turn == N_TURNS - 1 and fixed == len(bugs) else 0.0
                )
                total += reward
                starts, ends = _offsets(response)
                steps.append(
                    StepInput(
                        row_id=f"{task_id}/{g}/{turn}",
                        traj_id=f"{task_id}/{g}",
                        task_id=task_id,
                        turn=turn,
                        step_reward=reward,
                        response_text=response,
                        token_char_starts=starts,
                        token_char_ends=ends,
                        edits=tuple(edits),
                        files_before={"solution.py": before},
                        files_after={"solution.py": after},
                        workspace_hash_before=str(hash(before) & 0xFFFFFFFF),
                    )
                )
    return steps


def _peak_rss_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (peak RSS) to the current RSS
        return True
    except OSError:
        return False


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _naive(steps, result, settings) -> tuple[float, int, bool]:
    """All-pairs difflib ratio over the same candidates per (task, edit type); (seconds, pairs, estimated)."""
    groups = defaultdict(list)
    for sub in result.subdiffs:
        c = sub.candidate
        groups[(result.rows[c.row].task_id, c.edit_type)].append(c.text)
    pairs = sum(len(v) * (len(v) - 1) // 2 for v in groups.values())

    def compare(a: str, b: str) -> bool:
        return difflib.SequenceMatcher(None, a, b).ratio() >= settings.eta

    if pairs <= NAIVE_PAIR_CAP:
        start = time.perf_counter()
        for texts in groups.values():
            for i in range(len(texts)):
                for j in range(i + 1, len(texts)):
                    compare(texts[i], texts[j])
        return time.perf_counter() - start, pairs, False
    rng = random.Random(1)
    flat = [(k, len(v)) for k, v in groups.items() if len(v) > 1]
    weights = [n * (n - 1) / 2 for _, n in flat]
    sample = []
    for key, n in rng.choices(flat, weights=weights, k=NAIVE_SAMPLE):
        i, j = rng.sample(range(n), 2)
        sample.append((groups[key][i], groups[key][j]))
    start = time.perf_counter()
    for a, b in sample:
        compare(a, b)
    return (time.perf_counter() - start) / NAIVE_SAMPLE * pairs, pairs, True


def _measure(n_rollouts: int, queue) -> None:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    except (AttributeError, OSError):
        pass
    from pipeline.credit import CreditSettings, clear_caches, compute_credit

    settings = CreditSettings(estimator="didpo")  # the paper's: its sub-diffs and anchors are what the naive baseline redoes
    steps = build_batch(n_rollouts)
    compute_credit(steps[: len(steps) // 8], settings)  # warm imports and caches of unrelated rows
    times = []
    reset = _peak_rss_reset()
    base = _rss_kib("VmRSS")
    for _ in range(3):
        clear_caches()  # every run is a cold batch: nothing carried over from the previous run
        start = time.perf_counter()
        result = compute_credit(steps, settings)
        times.append(time.perf_counter() - start)
    peak = _rss_kib("VmHWM") if reset else 0
    did_settings = settings.model_copy(update={"estimator": "didpo_did"})
    did_times = []
    for _ in range(3):  # the didpo_did estimator on the same cold batch (it shares every phase but the last)
        clear_caches()
        start = time.perf_counter()
        compute_credit(steps, did_settings)
        did_times.append(time.perf_counter() - start)
    grpo_settings = settings.model_copy(update={"estimator": "grpo"})
    grpo_times = []
    for _ in range(3):
        clear_caches()
        start = time.perf_counter()
        compute_credit(steps, grpo_settings)
        grpo_times.append(time.perf_counter() - start)
    naive_s, pairs, estimated = _naive(steps, result, settings)
    d = result.diagnostics
    queue.put(
        dict(
            rollouts=n_rollouts,
            rows=d.n_rows,
            candidates=d.n_candidates,
            unique=d.n_unique_texts,
            anchors=d.n_anchors,
            coverage=d.coverage,
            seconds=statistics.median(times),
            did_seconds=statistics.median(did_times),
            grpo_seconds=statistics.median(grpo_times),
            peak_mib=max(0, peak - base) / 1024,
            naive_s=naive_s,
            naive_pairs=pairs,
            naive_est=estimated,
            phases={k: round(v, 4) for k, v in d.seconds.items()},
        )
    )


def run(sizes) -> list[dict]:
    ctx = mp.get_context("spawn")
    out = []
    for n in sizes:
        queue = ctx.Queue()
        proc = ctx.Process(target=_measure, args=(n, queue))
        proc.start()
        out.append(queue.get())
        proc.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8, 16, 32 rollouts only")
    parser.add_argument("--phases", action="store_true", help="print seconds per phase")
    args = parser.parse_args()
    sizes = ROLLOUTS[:3] if args.quick else ROLLOUTS
    results = run(sizes)
    header = (
        f"{'rollouts':>8} {'rows':>6} {'cands':>7} {'uniq':>6} {'anchors':>7} {'cover':>6} {'sec':>7} "
        f"{'did_sec':>7} {'did/didpo':>9} {'grpo_ms':>7} {'peakMiB':>8} {'naive_s':>9} {'pairs':>11} {'naive/ours':>10}"
    )
    print(header)
    for r in results:
        tag = " est" if r["naive_est"] else ""
        print(
            f"{r['rollouts']:>8} {r['rows']:>6} {r['candidates']:>7} {r['unique']:>6} {r['anchors']:>7} "
            f"{r['coverage']:>6.3f} {r['seconds']:>7.3f} {r['did_seconds']:>7.3f} "
            f"{r['did_seconds'] / r['seconds']:>9.2f} {r['grpo_seconds'] * 1000:>7.1f} {r['peak_mib']:>8.1f} {r['naive_s']:>9.2f}{tag} "
            f"{r['naive_pairs']:>11} {r['naive_s'] / r['seconds']:>10.1f}"
        )
        if args.phases:
            print("         phases:", r["phases"])
    capped = [r["rollouts"] for r in results if r["naive_est"]]
    if capped:
        print(
            f"naive baseline capped at {NAIVE_PAIR_CAP} pairs: for rollouts {capped} it timed {NAIVE_SAMPLE} "
            "sampled pairs and multiplied by the pair count ('est')."
        )
    rows = np.array([r["rows"] for r in results], float)
    secs = np.array([r["seconds"] for r in results], float)
    exponent = float(np.polyfit(np.log(rows), np.log(secs), 1)[0]) if len(rows) > 1 else float("nan")
    mem = np.array([r["peak_mib"] for r in results], float)
    mem_exp = (
        float(np.polyfit(np.log(rows), np.log(np.maximum(mem, 1e-3)), 1)[0])
        if len(rows) > 1
        else float("nan")
    )
    paper = next(r for r in results if r["rollouts"] == PAPER_ROLLOUTS)
    print(
        f"growth exponent (seconds vs rows, log-log fit): {exponent:.3f}; peak-memory exponent: {mem_exp:.3f}"
    )
    print(
        f"didpo_did on the paper batch: {paper['did_seconds']:.4f} s = "
        f"{paper['did_seconds'] / paper['seconds']:.2f}x didpo's {paper['seconds']:.4f} s (target <= 1.2x); grpo {paper['grpo_seconds'] * 1000:.1f} ms"
    )
    print(
        f"credit_speed: paper_batch_s={paper['seconds']:.4f} exponent={exponent:.4f} "
        f"coverage={paper['coverage']:.4f} naive_ratio={paper['naive_s'] / paper['seconds']:.2f}"
    )


if __name__ == "__main__":
    main()
