"""Credit fidelity: does an estimator put credit on the edits that caused the outcome?

1. Tasks: HumanEval references with several single-line statements. Per task, execution in the sandbox picks
   k=2 bug lines (a mutation that fails hidden tests), a menu of harmful mutations of 3 other lines (verified
   harmful alone), preferring partial damage, and neutral rewrites (an expression wrapped in parentheses,
   verified harmless).
2. Rollouts: G per task from the buggy start, T turns each, every action a search/replace action bundling 2-4
   edit blocks: a fix (restores a reference line), a harmful mutation, or a neutral rewrite, sampled so
   outcomes vary within a task group. The real Episode runs them: visible tests graded in the sandbox,
   step reward = reward_coef * visible pass fraction, + outcome (hidden tests) on the last turn.
3. Counterfactual effect of an edit = hidden pass fraction of the final workspace minus that of the final
   workspace replayed without this edit, the rest of the trajectory held fixed. Executions are cached by
   workspace hash (many repeat). Helpful: effect > 0; harmful: effect < 0.
4. Every estimator and setting scores each edit by the mean token advantage over the code of the line it
   wrote. Metrics: Spearman(score, effect) over all edits; AUC separating helpful from harmful edits; sign
   accuracy (sign(score) = sign(effect); zero counts one half) over edits with an effect in task groups with
   mixed outcomes; pair accuracy within an action and within a trajectory (P(score of a helpful edit >
   score of a harmful edit in the same action / trajectory), ties one half); coverage (changed tokens under
   an anchor). 95% intervals: percentile bootstrap over task groups (tasks resampled with replacement).

Last lines: `credit_fidelity: didpo_spearman=.. grpo_spearman=.. gigpo_spearman=.. didpo_coverage=..` and
`credit_fidelity_did: did_pair_action=.. didpo_pair_action=.. did_spearman=.. didpo_spearman=..`.
Run: `.venv/bin/python benchmarks/credit_fidelity.py [--tasks 20 --rollouts 10 --turns 3 --boot 500]`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib.util
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

N_BUGS = 2
LAMBDAS = (0.0, 0.6, 1.0, 1.2, 2.0)
FILE = "solution.py"


def _credit_speed():
    """The credit-speed benchmark's helpers (mutation operators, regex tokenizer with exact offsets)."""
    path = Path(__file__).with_name("credit_speed.py")
    spec = importlib.util.spec_from_file_location("credit_speed_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SPEED = _credit_speed()
mutations: Callable[[str], list[str]] = _SPEED._mutations
token_offsets: Callable[[str], tuple[np.ndarray, np.ndarray]] = _SPEED._offsets


# ------------------------------------------------------------------------------------------ execution
class CachedJudge:
    """`Judge.run` with results cached by (task, hidden, workspace hash); thread-safe."""

    def __init__(self, judge) -> None:
        self.judge = judge
        self.cache: dict[tuple[str, bool, str], object] = {}
        self.calls = 0
        self._lock = threading.Lock()

    def run(self, task, files: Mapping[str, str], *, hidden: bool = False):
        key = (task.task_id, hidden, _files_hash(files))
        with self._lock:
            self.calls += 1
            if key in self.cache:
                return self.cache[key]
        result = self.judge.run(task, files, hidden=hidden)
        with self._lock:
            self.cache[key] = result
        return result

    def hidden_fraction(self, task, lines: Sequence[str]) -> float:
        return self.run(task, {FILE: "".join(lines)}, hidden=True).pass_fraction


def _files_hash(files: Mapping[str, str]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(files):
        digest.update(f"{path}\x00{files[path]}\x00".encode())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------- task designs
@dataclass
class TaskDesign:
    """A task with a buggy start and menus of edits whose effect alone was verified by execution."""

    task: object  # pipeline.tasks.Task, its workspace replaced by the buggy start
    reference: list[str]  # reference lines (keepends)
    start: list[str]  # buggy start lines
    bugs: list[int]  # line indices mutated in the start
    harms: list[tuple[int, str]]  # (line, harmful text) menu
    neutrals: list[tuple[int, str]]  # (line, equivalent text) menu


def statement_lines(source: str) -> dict[int, tuple[int, int] | None]:
    """0-based line -> (start, end) column span of the statement's expression (None: no single expression)
    for every single-line statement of the code except docstrings and definitions."""
    out: dict[int, tuple[int, int] | None] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt) or node.lineno != node.end_lineno:
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom):
            continue
        value = getattr(node, "value", None)
        span = None
        if isinstance(value, ast.expr) and value.lineno == value.end_lineno:
            span = (value.col_offset, value.end_col_offset)
        out[node.lineno - 1] = span
    return out


def design_task(task, judge: CachedJudge, rng: random.Random) -> TaskDesign | None:
    """Pick bugs, harms and neutral rewrites for one task by executing them alone on the reference."""
    source = task.reference.get(FILE)
    if source is None:
        return None
    ref = source.splitlines(keepends=True)
    try:
        stmts = statement_lines(source)
    except SyntaxError:
        return None
    if judge.hidden_fraction(task, ref) < 1.0:
        return None
    harmful: dict[int, tuple[float, str]] = {}  # line -> (hidden pass fraction, its least damaging mutation)
    neutral: list[tuple[int, str]] = []
    for i, span in sorted(stmts.items()):
        line = ref[i]
        options = [m for m in mutations(line) if m != line]
        scored = [(judge.hidden_fraction(task, ref[:i] + [m] + ref[i + 1 :]), m) for m in options]
        bad = [(pf, m) for pf, m in scored if pf < 1.0]
        if bad:
            harmful[i] = max(bad)
        if span is not None and span[1] - span[0] > 1 and line.isascii():
            s, e = span
            text = line[:s] + "(" + line[s:e] + ")" + line[e:]  # column offsets are utf-8; ASCII code here
            if judge.hidden_fraction(task, ref[:i] + [text] + ref[i + 1 :]) == 1.0:
                neutral.append((i, text))
    if len(harmful) < N_BUGS + 2 or not neutral:
        return None
    # Prefer partial damage (mutations that fail some hidden tests, not all): with all-or-nothing faults an
    # edit's effect vanishes whenever any other fault remains, and few edits would have a measurable effect.
    lines = sorted(harmful, key=lambda i: (-harmful[i][0], rng.random()))
    bugs = sorted(lines[:N_BUGS])
    start = list(ref)
    for i in bugs:
        start[i] = harmful[i][1]
    harms = [(i, harmful[i][1]) for i in lines[N_BUGS : N_BUGS + 3]]
    taken = set(bugs) | {i for i, _ in harms}
    neutral = [(i, t) for i, t in neutral if i not in taken]  # a rewrite of a bug line would also fix it
    if not neutral:
        return None
    workspace = dict(task.workspace)
    workspace[FILE] = "".join(start)
    task = dataclasses.replace(task, workspace=workspace)
    return TaskDesign(task, ref, start, bugs, harms, neutral[:3])


# ------------------------------------------------------------------------------------------- rollouts
@dataclass
class EditRecord:
    """One edit block of an action, with its measured counterfactual effect."""

    task_id: str
    traj_id: str
    row_id: str
    kind: str  # fix / harm / neutral (what the generator meant; the effect is what counts)
    line: int  # 0-based line it rewrites
    text: str  # the line it writes
    span: tuple[int, int]  # [s, e) of the line's code (no indentation, no newline) in the response
    effect: float = 0.0  # hidden pass fraction with the edit minus without it


@dataclass
class Rollout:
    steps: list  # StepInput rows
    edits: list[EditRecord]
    assignments: list[tuple[int, int, str]] = field(default_factory=list)  # (edit index, line, text)
    final: list[str] = field(default_factory=list)


def _choose_edits(
    design: TaskDesign, lines: list[str], harmed: set[int], rng: random.Random
) -> list[tuple[str, int, str]]:
    """2-4 edits: fixes restore the start's bugs (a harm done earlier only rarely, once no bug is left),
    harms hit lines not harmed before in the trajectory, neutral rewrites fill the rest."""
    chosen: list[tuple[str, int, str]] = []
    used: set[int] = set()
    wanted = rng.choice((2, 3, 4))
    undo = rng.random() < 0.2  # this action may undo an earlier harm (once the start's bugs are fixed)
    for _ in range(50):  # an action has at least one edit; some draws find nothing left to do
        if len(chosen) >= wanted:
            break
        roll = rng.random()
        # Fixes go to the start's bugs; a harm done earlier in the trajectory is undone only now and then.
        broken = [i for i in design.bugs if lines[i] != design.reference[i] and i not in used]
        if not broken and undo:
            broken = [i for i, t in design.harms if lines[i] == t and i not in used]
        harms = [(i, t) for i, t in design.harms if i not in used and i not in harmed]
        neutrals = [(i, t) for i, t in design.neutrals if i not in used and lines[i] != t]
        if roll < 0.45 and broken:
            i = rng.choice(broken)
            chosen.append(("fix", i, design.reference[i]))
        elif roll < 0.75 and harms:
            i, t = rng.choice(harms)
            chosen.append(("harm", i, t))
        elif neutrals:
            i, t = rng.choice(neutrals)
            chosen.append(("neutral", i, t))
        else:
            continue
        used.add(chosen[-1][1])
    if not chosen:  # nothing left on the menus: undo an earlier harm, else an earlier neutral rewrite
        undo_harm = [("fix", i, design.reference[i]) for i, t in design.harms if lines[i] == t]
        undo_neutral = [("neutral", i, design.reference[i]) for i, t in design.neutrals if lines[i] == t]
        chosen = [rng.choice(undo_harm or undo_neutral)]
    return chosen


def _render(turn: int, lines: list[str], chosen: list[tuple[str, int, str]]):
    """Response text of a search/replace action (the grammar's markup), and per edit its code span."""
    response = f"<think>\nTurn {turn}: {len(chosen)} changes to {FILE}.\n</think>\n"
    current = list(lines)
    spans = []
    for _, i, new in chosen:
        text = "".join(current)
        lo = i
        while text.count("".join(current[lo : i + 1])) != 1 and lo > 0:
            lo -= 1  # widen the search with preceding lines until it is unique
        search = "".join(current[lo : i + 1])
        current[i] = new
        replace = "".join(current[lo : i + 1])
        response += f'<edit path="{FILE}">\n<search>\n{search}</search>\n<replace>\n'
        code = new.rstrip("\n")
        end = len(response) + len(replace) - (len(new) - len(code))  # the new line ends the payload
        start = end - len(code) + (len(code) - len(code.lstrip()))
        spans.append((start, end))
        response += f"{replace}</replace>\n</edit>\n"
    return response, spans


def rollout(design: TaskDesign, judge: CachedJudge, g: int, n_turns: int, seed: int) -> Rollout:
    """One trajectory through the real Episode (sandboxed visible tests, rewards, hidden outcome)."""
    from pipeline.agent.episode import Episode
    from pipeline.agent.settings import EpisodeSettings
    from pipeline.credit_io import step_input

    rng = random.Random(f"{seed}/{design.task.task_id}/{g}")
    episode = Episode(design.task, judge, EpisodeSettings(max_turns=n_turns))
    traj_id = f"{design.task.task_id}#{g}"
    lines = list(design.start)
    harmed: set[int] = set()
    out = Rollout([], [])
    for turn in range(n_turns):
        chosen = _choose_edits(design, lines, harmed, rng)
        harmed |= {i for kind, i, _ in chosen if kind == "harm"}
        response, spans = _render(turn, lines, chosen)
        step = episode.step(response, truncated=False)
        if step.action_status != "ok":
            raise RuntimeError(f"{traj_id} turn {turn}: generated an invalid action ({step.action_status})")
        row_id = f"{traj_id}@{turn}"
        starts, ends = token_offsets(response)
        record = dict(
            row_id=row_id, traj_id=traj_id, task_id=design.task.task_id, turn=turn,
            step_reward=step.step_reward, response_text=response, token_char_starts=starts,
            token_char_ends=ends, action_json=step.action_json, files_before=dict(step.files_before),
            files_after=dict(step.files_after), workspace_hash_before=step.workspace_hash_before,
            visible_passed=step.visible_passed, visible_total=step.visible_total,
        )  # fmt: skip
        out.steps.append(step_input(record, "credit_fidelity"))
        for (kind, i, new), span in zip(chosen, spans, strict=True):
            out.assignments.append((len(out.edits), i, new))
            out.edits.append(EditRecord(design.task.task_id, traj_id, row_id, kind, i, new, span))
            lines[i] = new
    out.final = lines
    if "".join(lines) != episode.state.files[FILE]:
        raise RuntimeError(f"{traj_id}: the replayed workspace differs from the episode's")
    return out


def replay(start: list[str], assignments: list[tuple[int, int, str]], skip: int) -> list[str]:
    """The final lines with every assignment applied in order except edit `skip`."""
    lines = list(start)
    for k, i, text in assignments:
        if k != skip:
            lines[i] = text
    return lines


# -------------------------------------------------------------------------------------------- building
@dataclass
class Benchmark:
    steps: list  # StepInput rows of every task
    edits: list[EditRecord]
    n_tasks: int
    executions: int  # sandbox runs actually made (cache misses)
    lookups: int  # execution requests (hits and misses)
    seconds: float


def build(n_tasks: int, n_rollouts: int, n_turns: int, seed: int = 0, pool_size: int = 2) -> Benchmark:
    from pipeline.sandbox import Judge, SandboxPool
    from pipeline.sandbox.settings import SandboxSettings
    from pipeline.tasks import load_source

    t0 = time.perf_counter()
    rng = random.Random(seed)
    tasks = load_source("humaneval")
    order = list(range(len(tasks)))
    rng.shuffle(order)
    # Short deadlines: some harmful mutations loop forever, and a timeout scores like any failure.
    with SandboxPool(SandboxSettings(pool_size=pool_size, timeout_s=3.0, cpu_s=3)) as pool:
        judge = CachedJudge(Judge(pool))
        designs: list[TaskDesign] = []
        with ThreadPoolExecutor(pool_size) as workers:
            for k in range(0, len(order), pool_size):
                if len(designs) >= n_tasks:
                    break
                batch = [tasks[j] for j in order[k : k + pool_size]]
                rngs = [random.Random(f"{seed}/{t.task_id}") for t in batch]
                for d in workers.map(design_task, batch, [judge] * len(batch), rngs):
                    if d is not None and len(designs) < n_tasks:
                        designs.append(d)
            jobs = [(d, g) for d in designs for g in range(n_rollouts)]
            rollouts = list(workers.map(lambda job: rollout(job[0], judge, job[1], n_turns, seed), jobs))

            def effects(job) -> None:
                (design, _), ro = job
                with_all = judge.hidden_fraction(design.task, ro.final)
                for e, record in enumerate(ro.edits):
                    without = judge.hidden_fraction(design.task, replay(design.start, ro.assignments, e))
                    record.effect = with_all - without

            list(workers.map(effects, zip(jobs, rollouts, strict=True)))
    steps = [s for ro in rollouts for s in ro.steps]
    edits = [e for ro in rollouts for e in ro.edits]
    seconds = time.perf_counter() - t0
    return Benchmark(steps, edits, len(designs), len(judge.cache), judge.calls, seconds)


# --------------------------------------------------------------------------------------------- scoring
def edit_scores(result, steps, edits: list[EditRecord]) -> np.ndarray:
    """[E] mean token advantage over each edit's code span."""
    by_row = {s.row_id: s for s in steps}
    adv_of = dict(zip(result.advantages["row_id"], result.advantages["token_advantages"], strict=True))
    out = np.empty(len(edits))
    for k, e in enumerate(edits):
        step = by_row[e.row_id]
        tokens = (step.token_char_starts < e.span[1]) & (step.token_char_ends > e.span[0])
        out[k] = float(np.asarray(adv_of[e.row_id])[tokens].mean())
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); nan if either side is constant."""
    if len(x) < 2:
        return float("nan")
    rx, ry = rankdata(x), rankdata(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def auc(score: np.ndarray, effect: np.ndarray) -> float:
    """P(score of a helpful edit > score of a harmful one), ties one half (Mann-Whitney U / n1 n0)."""
    pos, neg = effect > 0, effect < 0
    n1, n0 = int(pos.sum()), int(neg.sum())
    if not n1 or not n0:
        return float("nan")
    ranks = rankdata(score[pos | neg])
    return float((ranks[pos[pos | neg]].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def pair_counts(score: np.ndarray, effect: np.ndarray, group: np.ndarray) -> tuple[float, int]:
    """(wins, pairs) over helpful x harmful edit pairs sharing a group id; a tie wins one half."""
    wins, pairs = 0.0, 0
    for g in np.unique(group):
        idx = group == g
        good, bad = score[idx & (effect > 0)], score[idx & (effect < 0)]
        if len(good) and len(bad):
            diff = good[:, None] - bad[None, :]
            wins += float((diff > 0).sum() + 0.5 * (diff == 0).sum())
            pairs += diff.size
    return wins, pairs


def sign_counts(score: np.ndarray, effect: np.ndarray) -> tuple[float, int]:
    """(correct, n) over edits with a nonzero effect: sign(score) = sign(effect), score 0 counts one half."""
    idx = effect != 0
    s, e = np.sign(score[idx]), np.sign(effect[idx])
    return float((s == e).sum() + 0.5 * (s == 0).sum()), int(idx.sum())


@dataclass
class Scored:
    name: str
    score: np.ndarray  # [E]
    coverage: float | None


def metrics_table(
    scored: list[Scored], bench: Benchmark, n_boot: int, seed: int = 0
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """name -> metric -> (point, lo, hi) with percentile bootstrap over task groups (95%)."""
    edits = bench.edits
    effect = np.array([e.effect for e in edits])
    tasks = sorted({e.task_id for e in edits})
    task_of = np.array([tasks.index(e.task_id) for e in edits])
    rows = sorted({e.row_id for e in edits})
    action = np.array([rows.index(e.row_id) for e in edits])
    trajs = sorted({e.traj_id for e in edits})
    traj = np.array([trajs.index(e.traj_id) for e in edits])
    final = _final_outcomes(bench)
    mixed = np.array([len({final[e2.traj_id] for e2 in edits if e2.task_id == t}) > 1 for t in tasks])
    members = [np.flatnonzero(task_of == t) for t in range(len(tasks))]
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, len(tasks), len(tasks)) for _ in range(n_boot)]
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for s in scored:
        per_task = {
            "pair_action": np.array([pair_counts(s.score[m], effect[m], action[m]) for m in members]),
            "pair_traj": np.array([pair_counts(s.score[m], effect[m], traj[m]) for m in members]),
            "sign_acc": np.array(
                [sign_counts(s.score[m], effect[m]) if mixed[t] else (0.0, 0) for t, m in enumerate(members)]
            ),
        }

        def evaluate(sample: np.ndarray, score=s.score, counts=per_task) -> dict[str, float]:
            return _evaluate(score, effect, members, counts, sample)

        point = evaluate(np.arange(len(tasks)))
        boots = [evaluate(d) for d in draws]
        out[s.name] = {}
        for name, value in point.items():
            vals = np.array([b[name] for b in boots])
            vals = vals[np.isfinite(vals)]
            lo, hi = np.percentile(vals, [2.5, 97.5]) if len(vals) else (np.nan, np.nan)
            out[s.name][name] = (value, float(lo), float(hi))
        cov = s.coverage
        out[s.name]["coverage"] = (cov if cov is not None else float("nan"), float("nan"), float("nan"))
    return out


def _evaluate(
    score: np.ndarray,
    effect: np.ndarray,
    members: list[np.ndarray],
    per_task: dict[str, np.ndarray],
    sample: np.ndarray,
) -> dict[str, float]:
    """Metrics over the task groups `sample` (with repeats): pooled edits for Spearman and AUC, pooled
    (numerator, denominator) counts [tasks, 2] for the pair and sign accuracies."""
    idx = np.concatenate([members[t] for t in sample])
    values = {"spearman": spearman(score[idx], effect[idx]), "auc": auc(score[idx], effect[idx])}
    for name, counts in per_task.items():
        num, den = counts[sample].sum(axis=0)
        values[name] = float(num / den) if den else float("nan")
    return values


def _final_outcomes(bench: Benchmark) -> dict[str, float]:
    """traj_id -> episode return (sum of its step rewards): the outcome the group compares."""
    total: dict[str, float] = {}
    for s in bench.steps:
        total[s.traj_id] = total.get(s.traj_id, 0.0) + float(s.step_reward)
    return total


def configurations() -> list[tuple[str, dict]]:
    """(label, CreditSettings fields) of every estimator and setting measured."""
    configs: list[tuple[str, dict]] = [
        (name, {"estimator": name}) for name in ("grpo", "dr_grpo", "rloo", "gigpo")
    ]
    configs += [(f"didpo lam={lam}", {"estimator": "didpo", "lam": lam}) for lam in LAMBDAS]
    configs += [
        (f"didpo gs={form}", {"estimator": "didpo", "gs_form": form})
        for form in ("log", "linear", "additive")
    ]
    configs += [(f"didpo_did lam={lam}", {"estimator": "didpo_did", "lam": lam}) for lam in LAMBDAS if lam]
    did = {"estimator": "didpo_did"}
    for key, values in (
        ("did_outcome", ("return_to_go", "terminal")),
        ("did_ridge", (0.1, 10.0)),
        ("did_controls", ("turn_trajectory", "none")),
        ("did_unanchored", ("singleton",)),
        ("did_granularity", ("anchor",)),
        ("did_shrink", (True,)),
    ):
        configs += [(f"didpo_did {key[4:]}={v}", {**did, key: v}) for v in values]
    return configs


def score_all(bench: Benchmark, configs: list[tuple[str, dict]]) -> list[Scored]:
    from pipeline.credit import CreditSettings, compute_credit

    scored = []
    for label, fields in configs:
        settings = CreditSettings(**fields)
        result = compute_credit(bench.steps, settings)
        uses_anchors = fields["estimator"] in ("didpo", "didpo_did")
        coverage = result.diagnostics.coverage if uses_anchors else None
        scored.append(Scored(label, edit_scores(result, bench.steps, bench.edits), coverage))
    return scored


def _fmt(m: tuple[float, float, float]) -> str:
    value, lo, hi = m
    if not np.isfinite(value):
        return f"{'-':>22}"
    if not np.isfinite(lo):
        return f"{value:>7.3f}{'':>15}"
    return f"{value:>7.3f} [{lo:>5.2f},{hi:>5.2f}]"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--rollouts", type=int, default=10)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--boot", type=int, default=500, help="bootstrap resamples of task groups")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool-size", type=int, default=2)
    args = parser.parse_args(argv)

    bench = build(args.tasks, args.rollouts, args.turns, args.seed, args.pool_size)
    effect = np.array([e.effect for e in bench.edits])
    kinds = {k: [e.effect for e in bench.edits if e.kind == k] for k in ("fix", "harm", "neutral")}
    print(
        f"{bench.n_tasks} tasks x {args.rollouts} rollouts x {args.turns} turns: {len(bench.steps)} steps, "
        f"{len(bench.edits)} edits ({int((effect > 0).sum())} helpful, {int((effect < 0).sum())} harmful, "
        f"{int((effect == 0).sum())} no effect); {bench.executions} sandbox runs for {bench.lookups} requests; "
        f"{bench.seconds:.1f} s"
    )
    zero = np.zeros(len(bench.edits))
    ids = {
        name: np.unique([getattr(e, name) for e in bench.edits], return_inverse=True)[1]
        for name in ("row_id", "traj_id")
    }
    n_action = pair_counts(zero, effect, ids["row_id"])[1]
    n_traj = pair_counts(zero, effect, ids["traj_id"])[1]
    print(f"  helpful x harmful pairs: {n_action} within an action, {n_traj} within a trajectory")
    for k, v in kinds.items():
        print(f"  generated as {k:<8} n={len(v):>4}  mean effect {np.mean(v) if v else float('nan'):+.3f}")
    t0 = time.perf_counter()
    scored = score_all(bench, configurations())
    table = metrics_table(scored, bench, args.boot, args.seed)
    columns = ("spearman", "auc", "sign_acc", "pair_action", "pair_traj", "coverage")
    print(f"\n{'estimator':<34}" + "".join(f"{c:>23}" for c in columns))
    for name, row in table.items():
        print(f"{name:<34}" + "".join(f" {_fmt(row[c])}" for c in columns))
    print(
        f"(point [95% bootstrap interval over {bench.n_tasks} task groups, {args.boot} resamples]; "
        f"scoring {time.perf_counter() - t0:.1f} s)"
    )
    didpo, grpo, gigpo = table["didpo lam=1.0"], table["grpo"], table["gigpo"]
    did = table["didpo_did lam=1.0"]
    for metric in ("spearman", "auc"):
        for other, row in (("grpo", grpo), ("gigpo", gigpo)):
            for label, mine in (("didpo", didpo), ("didpo_did", did)):
                apart = mine[metric][1] > row[metric][2]
                print(f"{label} {metric} interval above {other}'s (non-overlapping): {apart}")
    print(
        f"credit_fidelity: didpo_spearman={didpo['spearman'][0]:.4f} grpo_spearman={grpo['spearman'][0]:.4f} "
        f"gigpo_spearman={gigpo['spearman'][0]:.4f} didpo_coverage={didpo['coverage'][0]:.4f}"
    )
    print(
        f"credit_fidelity_did: did_pair_action={did['pair_action'][0]:.4f} "
        f"didpo_pair_action={didpo['pair_action'][0]:.4f} did_spearman={did['spearman'][0]:.4f} "
        f"didpo_spearman={didpo['spearman'][0]:.4f}"
    )


if __name__ == "__main__":
    sys.exit(main())
