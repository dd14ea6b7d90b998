"""Credit fidelity: does an estimator put credit on the edits that caused the outcome, inside one action?

The question that decides diff-level credit: one action bundles a fix and a harmful change; do they get
different credit? The benchmark builds rollouts whose every edit has a measured effect and asks each
estimator (through `pipeline.credit.compute_credit` only) to rank them.

1. Tasks: the bundled sets with references (HumanEval, HumanEval+, MBPP+, MBPP: the repair curriculum's
   programs), each shuffled by seed, interleaved round-robin, tried in that order until `--tasks` qualify.
   Mutations come from the one mutation path, `pipeline.tasks.repair.bug_candidates` (misspell, operator,
   off_by_one, drop_return, swap_args; not delete_line, which writes no tokens to credit). A task
   qualifies when its hidden tests have at most MAX_HIDDEN_CASES cases (every step and replay runs them),
   its reference passes them, and probing finds N_BUGS + 2 `separable` harmful mutations: run alone on the reference, each
   fails some hidden case that the less damaging ones kept so far do not, and together they leave a case
   passing. Without that, counterfactual effects vanish whenever another fault remains (most mutations
   are total damage; HumanEval/MBPP programs have a handful of mutable lines; MBPP's 3 asserts rarely
   allow it), and an action's fix and harm would rarely both have an effect. Probing runs up to
   MAX_PROBES mutations (one per line, then a second family per line) and stops early once the menu is
   full or out of reach. The first N_BUGS make the buggy start; the next are the harm menu. Neutral
   rewrites wrap a statement's expression in parentheses (the same AST, so harmless without a run).
2. Plans: G rollouts per task, T turns; every action bundles 2-4 edits drawn from fixes (restore the bug
   line, or undo an earlier harm), harms (from the first HARM_MENU of the menu) and neutral rewrites. A
   plan depends on (seed, task, rollout) only, so the variants that share it differ in nothing else.
3. Variants (a separate credit batch each):
     mixed         every action's shape drawn from the three below (the headline variant)
     blocks, hunk, write   the same plans in one shape: a search/replace block per edit / one block
                   covering every edit of a file / a whole-file rewrite
     respell       hardened: each edit written, with probability 0.8, as one of its near-duplicate
                   spellings (spacing, parentheses, quotes, a flipped comparison), drawn per edit, as
                   independent samples of one fix differ
     outcome_only  hardened: no per-step reward and no visible pass fraction; only the hidden outcome (0/1)
                   at the last turn
     varied_harms  hardened: harms drawn from every partial-damage mutation probing found (a second
                   family on a line, too), not from a short menu, so a harm repeats less across rollouts
     multi_file    hardened: two qualifying programs in one workspace (a/solution.py, b/solution.py, each
                   its own program with its own tests, as two packages of one repository), paired in the
                   order they qualified; bugs, harms and neutral rewrites of both, so an action edits both
                   files. Each program's tests run on its own file (`CachedJudge.pair`); the pair's result
                   sums their cases, and its hidden outcome is 1 only if both pass.
   The real Episode runs every step (visible tests in the sandbox, step reward, hidden outcome at the end).
4. Measured effect of an edit = hidden pass fraction of the final workspace minus that of the final
   workspace replayed without this edit, the rest of the trajectory held fixed (counterfactual by replay).
   Helpful: effect > 0; harmful: effect < 0. Executions are cached by workspace hash (Python files by
   their AST); the variants that share plans (mixed, the shapes, outcome_only) cost no new runs.
5. Score of an edit = mean token advantage over the code of the line it wrote. Per estimator and variant:
   pair accuracy within an action and within a trajectory (P(score of a helpful edit > score of a harmful
   one) over helpful x harmful pairs in one action / trajectory; ties one half), Spearman(score, effect)
   over all edits, AUC helpful vs harmful, coverage (the credit diagnostics' changed tokens under an
   anchor; anchor estimators only) and ms per compute_credit call on the variant's batch (caches cleared
   before each). 95% intervals: percentile bootstrap over problems (HumanEval and HumanEval+ pose the same
   problems, so their task groups are resampled together).

Last line: `credit_fidelity: did_pair_action=.. did_pair_action_hard=.. did_spearman=.. did_coverage=..
didpo_pair_action=.. gigpo_pair_action=.. pairs=..` (the `mixed` variant; did = didpo_did; _hard = its
worst hardened variant, among those with pairs; pairs = helpful x harmful pairs inside one action of
`mixed`). Run: `.venv/bin/python benchmarks/credit_fidelity.py [--tasks 16 --rollouts 80 --turns 3
--sources humaneval,... --variants mixed,... --boot 500 --ids humaneval/HumanEval/132,...]`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib.util
import io
import random
import sys
import threading
import time
import tokenize
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

SOURCES = ("humaneval", "humanevalplus", "mbppplus", "mbpp")
N_BUGS = 1  # with 2, few programs (a handful of mutable lines, most mutations total damage) qualify
HARM_MENU = 3  # harms a standard plan draws from: each repeats across rollouts, as a policy's habits do
MAX_PROBES = 16  # mutated lines executed per task while designing it
MAX_HIDDEN_CASES = 200  # more (most HumanEval+ tasks: ~1000 inputs) costs seconds per run; every step and
# replay runs the hidden tests. A case count, not a measured time: the selection must not depend on load.
PAIR_DIRS = ("a/", "b/")  # multi_file: where each program of a pair lives
SHAPES = ("blocks", "hunk", "write")
HARDENED = ("respell", "outcome_only", "varied_harms", "multi_file")
VARIANTS = ("mixed", *SHAPES, *HARDENED)
ESTIMATORS = ("grpo", "rloo", "gigpo", "didpo", "didpo_did")

Loc = tuple[str, int]  # (file path, 0-based line)
Files = dict[str, list[str]]  # path -> lines (keepends)
PlannedEdit = tuple[str, Loc, str]  # (kind: fix / harm / neutral, where, the line it writes)


def _credit_speed():
    """The credit-speed benchmark's helpers (the line-mutation wrapper, regex tokenizer with exact offsets)."""
    path = Path(__file__).with_name("credit_speed.py")
    spec = importlib.util.spec_from_file_location("credit_speed_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SPEED = _credit_speed()
line_mutations: Callable[[str], dict[int, list[str]]] = _SPEED.line_mutations
token_offsets: Callable[[str], tuple[np.ndarray, np.ndarray]] = _SPEED._offsets


# ------------------------------------------------------------------------------------------ execution
class CachedJudge:
    """`Judge.run` with results cached by (task, hidden, workspace hash); thread-safe. Python files are
    hashed by their AST, so spellings of one program (spacing, parentheses, quotes: the respell variant,
    the neutral rewrites) share one run; the tests see values, never the layout of the source."""

    def __init__(self, judge) -> None:
        self.judge = judge
        self.cache: dict[tuple[str, bool, str], object] = {}
        self.calls = 0
        self._lock = threading.Lock()
        self.pairs: dict[str, tuple[tuple[str, object], ...]] = {}  # pair task id -> (folder, task) per program

    def pair(self, task_id: str, parts: Sequence[tuple[str, object]]) -> None:
        """Runs of `task_id` run each part's task on the files under its folder (the folder stripped)."""
        self.pairs[task_id] = tuple(parts)

    def run(self, task, files: Mapping[str, str], *, hidden: bool = False):
        if task.task_id in self.pairs:
            return _combined([
                (folder, self.run(part, {p[len(folder):]: t for p, t in files.items() if p.startswith(folder)},
                                  hidden=hidden))
                for folder, part in self.pairs[task.task_id]
            ])
        key = (task.task_id, hidden, _files_hash(files))
        with self._lock:
            self.calls += 1
            if key in self.cache:
                return self.cache[key]
        result = self.judge.run(task, files, hidden=hidden)
        with self._lock:
            self.cache[key] = result
        return result

    def hidden(self, task, files: Files):
        return self.run(task, joined(files), hidden=True)


def _combined(results: Sequence[tuple[str, object]]):
    """One result of a pair's runs: the cases of both (named by folder), passed only if both passed."""
    from pipeline.sandbox.judge import CaseResult, ExecResult

    failed = [r.status for _, r in results if r.status != "passed"]
    return ExecResult(
        status="infra_error" if "infra_error" in failed else (failed[0] if failed else "passed"),
        passed=sum(r.passed for _, r in results), total=sum(r.total for _, r in results),
        duration_s=sum(r.duration_s for _, r in results), isolation=results[0][1].isolation,
        cases=tuple(CaseResult(folder + c.name, c.passed, c.detail) for folder, r in results for c in r.cases),
        stdout="".join(r.stdout for _, r in results), stderr="".join(r.stderr for _, r in results),
        detail="\n".join(f"{folder} {r.detail}" for folder, r in results if r.detail),
    )  # fmt: skip


def _files_hash(files: Mapping[str, str]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(files):
        digest.update(f"{path}\x00{_layout_free(path, files[path])}\x00".encode())
    return digest.hexdigest()


def _layout_free(path: str, text: str) -> str:
    """A Python file's AST dump (its text when it does not parse); other files as they are."""
    if path.endswith(".py"):
        try:
            return ast.dump(ast.parse(text))
        except SyntaxError:
            pass
    return text


def joined(files: Files) -> dict[str, str]:
    return {path: "".join(lines) for path, lines in files.items()}


def split_lines(files: Mapping[str, str]) -> Files:
    return {path: text.splitlines(keepends=True) for path, text in files.items()}


# ------------------------------------------------------------------------------------- line rewrites
def _same_ast(text: str, other: str) -> bool:
    try:
        return ast.dump(ast.parse(text)) == ast.dump(ast.parse(other))
    except SyntaxError:
        return False


def _with_line(lines: list[str], i: int, text: str) -> str:
    return "".join(lines[:i] + [text] + lines[i + 1 :])


def parenthesized(lines: list[str], i: int) -> str | None:
    """Line i with its statement's expression wrapped in parentheses (same AST), or None."""
    line = lines[i]
    if not line.isascii():
        return None  # ast column offsets are utf-8 bytes
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return None
    if len(tree.body) != 1:
        return None
    value = getattr(tree.body[0], "value", None)
    if (
        not isinstance(value, ast.expr)
        or isinstance(tree.body[0], ast.Expr)
        and isinstance(value, ast.Constant)
    ):
        return None  # no expression, or a docstring
    indent = len(line) - len(line.lstrip())
    s, e = indent + value.col_offset, indent + value.end_col_offset
    if e - s < 2:
        return None
    text = line[:s] + "(" + line[s:e] + ")" + line[e:]
    return text if _same_ast("".join(lines), _with_line(lines, i, text)) else None


_WORDLIKE = (tokenize.NAME, tokenize.NUMBER, tokenize.STRING)
_SPACED_OPS = {"=", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "//", "%", "+=", "-=", "*=", "**"}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def _respaced(code: str, loose: bool) -> str | None:
    """`code` (one line, no indentation) re-joined from its tokens: tight (no optional spaces) or loose
    (spaces around operators and after commas)."""
    try:
        tokens = [
            t
            for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type
            not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT)
        ]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    if any(t.type == tokenize.COMMENT or t.start[0] != 1 for t in tokens) or not tokens:
        return None
    out = tokens[0].string
    for prev, tok in zip(tokens, tokens[1:], strict=False):
        if prev.type in _WORDLIKE and tok.type in _WORDLIKE:
            sep = " "  # `return x`, `1 if`: a space is required
        elif loose and (tok.string in _SPACED_OPS or prev.string in _SPACED_OPS or prev.string == ","):
            sep = " "
        else:
            sep = ""
        out += sep + tok.string
    return out


def _flipped_comparison(code: str) -> str | None:
    """`a < b` -> `b > a` where the line holds one comparison of two call-free operands (same value)."""
    try:  # a block header (`if a < b:`) parses with a body; the offsets stay those of `code`
        tree = ast.parse(code + " pass" if code.endswith(":") else code)
    except SyntaxError:
        return None
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    if len(compares) != 1 or len(compares[0].ops) != 1 or not code.isascii():
        return None
    node = compares[0]
    left, right = node.left, node.comparators[0]
    symbol = code[left.end_col_offset : right.col_offset].strip()
    if symbol not in _FLIP or any(isinstance(n, ast.Call) for side in (left, right) for n in ast.walk(side)):
        return None
    a = code[left.col_offset : left.end_col_offset]
    b = code[right.col_offset : right.end_col_offset]
    return code[: left.col_offset] + f"{b} {_FLIP[symbol]} {a}" + code[right.end_col_offset :]


def respellings(lines: list[str], i: int, text: str) -> list[str]:
    """Near-duplicate spellings of writing `text` at line i of `lines`: the variation independent samples of
    one change show. Spacing, parentheses and quotes keep the file's AST; a flipped comparison keeps the
    value. The effect of whichever is written is measured anyway, so a spelling that changed behaviour
    would be scored by what it does."""
    indent = text[: len(text) - len(text.lstrip())]
    code = text.strip()
    end = text[len(text.rstrip("\n")) :] or "\n"
    candidates = [_respaced(code, loose=False), _respaced(code, loose=True)]
    wrapped = parenthesized(lines[:i] + [text] + lines[i + 1 :], i)
    candidates.append(wrapped.strip() if wrapped else None)
    if "'" in code and '"' not in code and "\\" not in code:
        candidates.append(code.replace("'", '"'))
    flipped = _flipped_comparison(code)
    out = []
    base = _with_line(lines, i, text)
    for c in dict.fromkeys(candidates):
        if c is None or c == code:
            continue
        new = indent + c + end
        if c == flipped or _same_ast(base, _with_line(lines, i, new)):
            out.append(new)
    if flipped and flipped not in candidates:
        new = indent + flipped + end
        try:
            ast.parse(_with_line(lines, i, new))
            out.append(new)
        except SyntaxError:
            pass
    return out


# ---------------------------------------------------------------------------------------- task designs
@dataclass
class TaskDesign:
    """A task with a buggy start and menus of edits whose effect alone was verified by execution."""

    task: object  # pipeline.tasks.Task, its workspace replaced by the buggy start
    problem: str  # the cross-source problem: the bootstrap's cluster
    reference: Files
    start: Files
    bugs: list[Loc]
    harms: list[tuple[Loc, str]]  # verified harmful alone, preferred (least damage) first
    neutrals: list[tuple[Loc, str]]


@dataclass(frozen=True)
class Harm:
    """A mutation run alone on the reference: what it does to the hidden tests."""

    pass_fraction: float
    tiebreak: float
    loc: Loc
    text: str
    failing: frozenset[str]  # names of the hidden test cases it fails
    total: int  # hidden test cases


def separable(harmful: Sequence[Harm]) -> list[Harm]:
    """Mutations whose damage stays visible beside each other's, least damaging first: each fails some
    case none of the earlier picks fails, and together they leave some case passing. With all-or-nothing
    or overlapping damage an edit's effect vanishes whenever another fault remains (counterfactual effects
    are not additive), and few edits would have a measurable effect."""
    picked: list[Harm] = []
    union: frozenset[str] = frozenset()
    for h in sorted(harmful, key=lambda h: (-h.pass_fraction, h.tiebreak)):
        fresh_line = all(p.loc != h.loc for p in picked)
        if fresh_line and h.pass_fraction > 0 and h.failing - union and len(union | h.failing) < h.total:
            picked.append(h)
            union |= h.failing
    return picked


def design_task(task, judge: CachedJudge, rng: random.Random) -> TaskDesign | None:
    """Pick bugs, harms and neutral rewrites for one task by executing mutations alone on the reference."""
    from pipeline.tasks import count_cases

    path = f"{task.hidden_tests.module}.py"
    source = task.reference.get(path)
    if source is None or not task.hidden_tests.module:
        return None
    firsts: list[tuple[Loc, str]] = []  # one mutation per line first, then a second family where there is one
    seconds: list[tuple[Loc, str]] = []
    for i, options in line_mutations(source).items():
        options = rng.sample(options, min(2, len(options)))
        firsts.append(((path, i), options[0]))
        seconds += [((path, i), o) for o in options[1:]]
    if len(firsts) < N_BUGS + 2 or count_cases(task.hidden_tests) > MAX_HIDDEN_CASES:
        return None  # too few mutable lines or too costly tests: no run needed to know
    rng.shuffle(firsts)
    rng.shuffle(seconds)
    probes = firsts + seconds
    ref = split_lines(task.reference)
    base = judge.hidden(task, ref)
    if base.pass_fraction < 1.0:
        return None
    harmful: list[Harm] = []
    for k, ((name, i), text) in enumerate(probes[:MAX_PROBES]):
        files = {**ref, name: ref[name][:i] + [text] + ref[name][i + 1 :]}
        result = judge.hidden(task, files)
        if result.status != "timeout" and result.pass_fraction < 1.0:
            failing = frozenset(c.name for c in result.cases if not c.passed)
            harmful.append(Harm(result.pass_fraction, rng.random(), (name, i), text, failing, result.total))
        # Stop early (probes cost most of the design time): enough separable harms for a full menu, or too
        # few so far to reach the minimum.
        found = len(separable(harmful))
        if found >= N_BUGS + HARM_MENU or found + (min(MAX_PROBES, len(probes)) - k - 1) // 2 < N_BUGS + 2:
            break
    chosen = separable(harmful)
    if len(chosen) < N_BUGS + 2:
        return None
    # The varied menu goes on with every other partial-damage mutation (another family on a menu line, too).
    # Total damage stays out: it would hide every other edit's effect, leaving nothing to measure.
    rest = [
        h
        for h in harmful
        if h not in chosen and h.pass_fraction > 0 and h.loc not in {c.loc for c in chosen[:N_BUGS]}
    ]
    chosen = chosen + sorted(rest, key=lambda h: (-h.pass_fraction, h.tiebreak))
    bugs = sorted(h.loc for h in chosen[:N_BUGS])
    harms = [(h.loc, h.text) for h in chosen[N_BUGS:]]
    start = {name: list(lines) for name, lines in ref.items()}
    for h in chosen[:N_BUGS]:
        start[h.loc[0]][h.loc[1]] = h.text
    taken = {h.loc for h in harmful}
    neutrals = []
    for i in range(len(ref[path])):
        text = parenthesized(ref[path], i) if (path, i) not in taken else None
        if text is not None:
            neutrals.append(((path, i), text))
    rng.shuffle(neutrals)
    if not neutrals:
        return None
    workspace = {**task.workspace, **joined(start)}
    task = dataclasses.replace(task, workspace=workspace)
    problem = str(task.meta.get("problem", task.task_id))
    return TaskDesign(task, problem, ref, start, bugs, harms, neutrals[:3])


def pair_designs(designs: Sequence[TaskDesign], judge: CachedJudge) -> list[TaskDesign]:
    """The multi_file designs: designs two by two (in order; a design whose problem its partner shares
    waits for the next), each pair one workspace with one program under each of PAIR_DIRS. Bugs, harms and
    neutral rewrites of both, interleaved so that the short menus hold both files; the judge runs each
    program's own tests on its own folder (`CachedJudge.pair`)."""
    from pipeline.tasks.base import Task

    def moved(folder: str, items):
        return [((folder + name, i), text) for (name, i), text in items]

    def interleaved(a, b):
        return [x for pair in zip_longest(a, b) for x in pair if x is not None]

    out, waiting = [], list(designs)
    while len(waiting) >= 2:
        first = waiting.pop(0)
        partner = next((d for d in waiting if d.problem != first.problem), None)
        if partner is None:
            break
        waiting.remove(partner)
        parts = list(zip(PAIR_DIRS, (first, partner), strict=True))
        task_id = f"pairs/{first.task.task_id}+{partner.task.task_id}"
        task = Task(
            task_id=task_id, source="pairs", split=first.task.split,
            instructions="\n\n".join(f"In {folder}: {d.task.instructions}" for folder, d in parts),
            workspace={folder + p: t for folder, d in parts for p, t in d.task.workspace.items()},
            visible_tests=first.task.visible_tests, hidden_tests=first.task.hidden_tests,  # the judge composes
            reference={folder + p: t for folder, d in parts for p, t in d.task.reference.items()},
            meta={"problem": f"{first.problem}+{partner.problem}"},
        )  # fmt: skip
        judge.pair(task_id, [(folder, d.task) for folder, d in parts])
        out.append(TaskDesign(
            task=task, problem=f"{first.problem}+{partner.problem}",
            reference={folder + p: lines for folder, d in parts for p, lines in d.reference.items()},
            start={folder + p: lines for folder, d in parts for p, lines in d.start.items()},
            bugs=sorted((folder + name, i) for folder, d in parts for name, i in d.bugs),
            harms=interleaved(*(moved(folder, d.harms) for folder, d in parts)),
            neutrals=interleaved(*(moved(folder, d.neutrals) for folder, d in parts)),
        ))  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------- plans
def plan_trajectory(
    design: TaskDesign, n_turns: int, rng: random.Random, harm_menu: int
) -> list[list[PlannedEdit]]:
    """Per turn 2-4 edits: fixes restore the start's bugs (a harm done earlier only rarely, once no bug is
    left), harms hit lines not harmed before in the trajectory, neutral rewrites fill the rest."""
    lines = {name: list(v) for name, v in design.start.items()}
    harmed: set[Loc] = set()
    menu = design.harms[:harm_menu]
    plan = []
    for _ in range(n_turns):
        chosen: list[PlannedEdit] = []
        used: set[Loc] = set()
        wanted = rng.choice((2, 3, 4))
        undo = rng.random() < 0.4  # this action may undo an earlier harm (once the start's bugs are fixed)

        def at(loc: Loc) -> str:
            return lines[loc[0]][loc[1]]

        for _ in range(50):  # some draws find nothing left to do
            if len(chosen) >= wanted:
                break
            roll = rng.random()
            broken = [b for b in design.bugs if at(b) != design.reference[b[0]][b[1]] and b not in used]
            if not broken and undo:
                broken = [loc for loc, t in menu if at(loc) == t and loc not in used]
            harms = [(loc, t) for loc, t in menu if loc not in used and loc not in harmed]
            neutrals = [(loc, t) for loc, t in design.neutrals if loc not in used and at(loc) != t]
            if roll < 0.45 and broken:
                loc = rng.choice(broken)
                chosen.append(("fix", loc, design.reference[loc[0]][loc[1]]))
            elif roll < 0.75 and harms:
                loc, t = rng.choice(harms)
                chosen.append(("harm", loc, t))
            elif neutrals:
                loc, t = rng.choice(neutrals)
                chosen.append(("neutral", loc, t))
            else:
                continue
            used.add(chosen[-1][1])
        if not chosen:  # nothing left on the menus: undo an earlier harm, else an earlier neutral rewrite
            undo_harm = [("fix", loc, design.reference[loc[0]][loc[1]]) for loc, t in menu if at(loc) == t]
            undo_neutral = [
                ("neutral", loc, design.reference[loc[0]][loc[1]])
                for loc, t in design.neutrals
                if at(loc) == t
            ]
            chosen = [rng.choice(undo_harm or undo_neutral)]
        for kind, loc, text in chosen:
            lines[loc[0]][loc[1]] = text
            if kind == "harm":
                harmed.add(loc)
        plan.append(chosen)
    return plan


def respell_plan(
    design: TaskDesign, plan: list[list[PlannedEdit]], rng: random.Random
) -> list[list[PlannedEdit]]:
    """Each edit written, with probability 0.8, as one of its near-duplicate spellings."""
    out = []
    for action in plan:
        new_action = []
        for kind, (name, i), text in action:
            options = respellings(design.reference[name], i, text)
            if options and rng.random() < 0.8:
                text = rng.choice(options)
            new_action.append((kind, (name, i), text))
        out.append(new_action)
    return out


# ----------------------------------------------------------------------------------------- rendering
def _code_span(offset: int, line: str) -> tuple[int, int]:
    """[s, e) of a line's code (no indentation, no newline) when the line starts at `offset`."""
    code = line.rstrip("\n")
    return offset + len(code) - len(code.lstrip()), offset + len(code)


def _unique_from(current: list[str], lo: int, hi: int) -> int:
    """The first line of a search text ending at line hi that occurs once in the file (widened upward)."""
    text = "".join(current)
    while lo > 0 and text.count("".join(current[lo : hi + 1])) != 1:
        lo -= 1
    return lo


def render(
    turn: int, files: Files, edits: Sequence[PlannedEdit], shape: str
) -> tuple[str, list[tuple[int, int]]]:
    """Response text of one action in `shape` (the grammar's markup), and per edit the span of its code."""
    paths = list(dict.fromkeys(loc[0] for _, loc, _ in edits))
    response = f"<think>\nTurn {turn}: {len(edits)} changes to {', '.join(paths)}.\n</think>\n"
    current = {name: list(lines) for name, lines in files.items()}
    spans: dict[int, tuple[int, int]] = {}
    if shape == "blocks":
        for k, (_, (name, i), new) in enumerate(edits):
            lines = current[name]
            lo = _unique_from(lines, i, i)
            search = "".join(lines[lo : i + 1])
            lines[i] = new
            response += f'<edit path="{name}">\n<search>\n{search}</search>\n<replace>\n'
            spans[k] = _code_span(len(response) + len("".join(lines[lo:i])), new)
            response += "".join(lines[lo : i + 1]) + "</replace>\n</edit>\n"
    elif shape in ("hunk", "write"):
        for name in paths:
            mine = [(k, i, new) for k, (_, (p, i), new) in enumerate(edits) if p == name]
            lines = current[name]
            lo_i, hi = min(i for _, i, _ in mine), max(i for _, i, _ in mine)
            lo = 0 if shape == "write" else _unique_from(lines, lo_i, hi)
            hi = len(lines) - 1 if shape == "write" else hi
            search = "".join(lines[lo : hi + 1])
            for _, i, new in mine:
                lines[i] = new
            if shape == "write":
                response += f'<write path="{name}">\n'
            else:
                response += f'<edit path="{name}">\n<search>\n{search}</search>\n<replace>\n'
            for k, i, new in mine:
                spans[k] = _code_span(len(response) + len("".join(lines[lo:i])), new)
            response += "".join(lines[lo : hi + 1])
            response += "</write>\n" if shape == "write" else "</replace>\n</edit>\n"
    else:
        raise ValueError(f"unknown action shape {shape!r}; allowed: {', '.join(SHAPES)}")
    return response, [spans[k] for k in range(len(edits))]


# ------------------------------------------------------------------------------------------- rollouts
@dataclass
class EditRecord:
    """One edit of an action, with its measured counterfactual effect."""

    task_id: str
    problem: str
    traj_id: str
    row_id: str
    kind: str  # fix / harm / neutral (what the generator meant; the effect is what counts)
    loc: Loc
    text: str  # the line it writes
    span: tuple[int, int]  # [s, e) of the line's code in the response
    effect: float = 0.0  # hidden pass fraction with the edit minus without it


@dataclass
class Rollout:
    steps: list  # StepInput rows
    edits: list[EditRecord]
    assignments: list[tuple[int, Loc, str]] = field(default_factory=list)  # (edit index, where, text)
    final: Files = field(default_factory=dict)


def run_trajectory(
    design: TaskDesign,
    judge: CachedJudge,
    traj_id: str,
    plan: list[list[PlannedEdit]],
    shapes: list[str],
    outcome_only: bool = False,
) -> Rollout:
    """One trajectory through the real Episode (sandboxed visible tests, rewards, hidden outcome).
    outcome_only: no step reward (reward_coef 0) and no visible pass fraction in the steps."""
    from pipeline.agent.episode import Episode
    from pipeline.agent.settings import EpisodeSettings
    from pipeline.credit_io import step_input

    settings = EpisodeSettings(max_turns=len(plan), reward_coef=0.0 if outcome_only else 0.2)
    episode = Episode(design.task, judge, settings)
    files = {name: list(lines) for name, lines in design.start.items()}
    out = Rollout([], [])
    for turn, (action, shape) in enumerate(zip(plan, shapes, strict=True)):
        response, spans = render(turn, files, action, shape)
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
            visible_passed=None if outcome_only else step.visible_passed,
            visible_total=None if outcome_only else step.visible_total,
        )  # fmt: skip
        out.steps.append(step_input(record, "credit_fidelity"))
        for (kind, loc, text), span in zip(action, spans, strict=True):
            out.assignments.append((len(out.edits), loc, text))
            out.edits.append(
                EditRecord(design.task.task_id, design.problem, traj_id, row_id, kind, loc, text, span)
            )
            files[loc[0]][loc[1]] = text
    out.final = files
    if any("".join(lines) != episode.state.files[name] for name, lines in files.items()):
        raise RuntimeError(f"{traj_id}: the replayed workspace differs from the episode's")
    return out


def replay(start: Files, assignments: Sequence[tuple[int, Loc, str]], skip: int) -> Files:
    """The final files with every assignment applied in order except edit `skip`."""
    files = {name: list(lines) for name, lines in start.items()}
    for k, (name, i), text in assignments:
        if k != skip:
            files[name][i] = text
    return files


def measure_effects(design: TaskDesign, judge: CachedJudge, rollout: Rollout) -> None:
    with_all = judge.hidden(design.task, rollout.final).pass_fraction
    for e, record in enumerate(rollout.edits):
        without = judge.hidden(design.task, replay(design.start, rollout.assignments, e)).pass_fraction
        record.effect = with_all - without


# -------------------------------------------------------------------------------------------- building
@dataclass
class VariantData:
    steps: list  # StepInput rows of every task of the variant
    edits: list[EditRecord]
    n_tasks: int


@dataclass
class Benchmark:
    variants: dict[str, VariantData]
    executions: int  # sandbox runs actually made (cache misses)
    lookups: int  # execution requests (hits and misses)
    seconds: float


def candidate_tasks(sources: Sequence[str], seed: int, ids: Sequence[str] | None = None) -> list:
    """Tasks of every source, each source shuffled by seed, interleaved round-robin (every source early);
    ids: only these task ids, in this order."""
    from pipeline.tasks import load_source

    rng = random.Random(seed)
    lists = []
    for source in sources:
        tasks = load_source(source)
        rng.shuffle(tasks)
        lists.append(tasks)
    tasks = [lst[k] for k in range(max(map(len, lists), default=0)) for lst in lists if k < len(lst)]
    if ids is not None:
        by_id = {t.task_id: t for t in tasks}
        tasks = [by_id[i] for i in ids]
    return tasks


def _designs(
    tasks, judge, workers, n_tasks: int, pool_size: int, seed: int
) -> tuple[list[TaskDesign], int]:
    """(designs of the first n_tasks qualifying tasks (0: all), tasks tried)."""
    designs: list[TaskDesign] = []
    tried = 0
    for k in range(0, len(tasks), pool_size):
        if n_tasks and len(designs) >= n_tasks:
            break
        tried = min(len(tasks), k + pool_size)
        batch = tasks[k : k + pool_size]
        rngs = [random.Random(f"{seed}/{t.task_id}/False") for t in batch]  # the published runs' seeds
        for d in workers.map(lambda t, r: design_task(t, judge, r), batch, rngs):
            if d is not None and (not n_tasks or len(designs) < n_tasks):
                designs.append(d)
    return designs, tried


def build(
    sources: Sequence[str] = SOURCES,
    n_tasks: int = 16,
    n_rollouts: int = 80,
    n_turns: int = 3,
    variants: Sequence[str] = VARIANTS,
    seed: int = 0,
    pool_size: int = 2,
    log: Callable[[str], None] = lambda _: None,
    ids: Sequence[str] | None = None,
) -> Benchmark:
    """Designs, plans, rollouts and measured effects of every variant (n_tasks 0: every qualifying task)."""
    from pipeline.sandbox import Judge, SandboxPool
    from pipeline.sandbox.settings import SandboxSettings

    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; allowed: {', '.join(VARIANTS)}")
    t0 = time.perf_counter()
    tasks = candidate_tasks(sources, seed, ids)
    out: dict[str, VariantData] = {}
    # Short deadlines: some harmful mutations loop forever, and a timeout scores like any failure.
    with SandboxPool(SandboxSettings(pool_size=pool_size, timeout_s=3.0, cpu_s=3)) as pool:
        judge = CachedJudge(Judge(pool))
        with ThreadPoolExecutor(pool_size) as workers:
            designs, tried = _designs(tasks, judge, workers, n_tasks, pool_size, seed)
            sources_of = sorted({d.task.source for d in designs})
            log(f"{len(designs)} of {tried} tasks tried qualify "
                f"({', '.join(f'{s}: {sum(d.task.source == s for d in designs)}' for s in sources_of)}); "
                f"{len(judge.cache)} runs ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
            for variant in ("mixed", *(v for v in variants if v != "mixed")):  # mixed always: the headline
                chosen = designs
                if variant == "multi_file":  # the qualified programs two by two, each pair one workspace
                    chosen = pair_designs(designs, judge)
                    log(f"multi_file: {len(chosen)} workspaces of two programs each")
                jobs = [(d, g) for d in chosen for g in range(n_rollouts)]

                def one(job, variant=variant):
                    design, g = job
                    rng = random.Random(f"{seed}/{design.task.task_id}/{g}")  # shared by the variants
                    menu = MAX_PROBES if variant == "varied_harms" else HARM_MENU
                    plan = plan_trajectory(design, n_turns, rng, menu)
                    style = random.Random(f"{seed}/{design.task.task_id}/{g}/{variant}")
                    if variant == "respell":
                        plan = respell_plan(design, plan, style)
                    shapes = [variant if variant in SHAPES else style.choice(SHAPES) for _ in plan]
                    traj_id = f"{design.task.task_id}#{g}"
                    ro = run_trajectory(design, judge, traj_id, plan, shapes, variant == "outcome_only")
                    measure_effects(design, judge, ro)
                    return ro

                rollouts = list(workers.map(one, jobs))
                out[variant] = VariantData(
                    [s for ro in rollouts for s in ro.steps],
                    [e for ro in rollouts for e in ro.edits],
                    len(chosen),
                )
                log(f"variant {variant}: {len(chosen)} tasks, {judge.calls} requests, "
                    f"{len(judge.cache)} runs ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return Benchmark(out, len(judge.cache), judge.calls, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------- metrics
def edit_scores(result, steps, edits: list[EditRecord]) -> np.ndarray:
    """[E] mean token advantage over each edit's code span."""
    by_row = {s.row_id: s for s in steps}
    adv_of = {a.step.row_id: a.token_advantages for a in result.advantages}
    out = np.empty(len(edits))
    for k, e in enumerate(edits):
        step = by_row[e.row_id]
        tokens = (step.token_char_starts < e.span[1]) & (step.token_char_ends > e.span[0])
        # Rounded: the float noise of averaging equal values (a row-level advantage over spans of different
        # lengths) must not break the ties that the pair accuracy counts one half.
        out[k] = round(float(np.asarray(adv_of[e.row_id], np.float64)[tokens].mean()), 9)
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


def pooled_ratio(counts: np.ndarray, sample: np.ndarray) -> float:
    """sum of numerators / sum of denominators over the clusters `sample` (with repeats); counts [C, 2]."""
    num, den = counts[sample].sum(axis=0)
    return float(num / den) if den else float("nan")


def percentile_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile interval of the finite bootstrap values (nan, nan when none)."""
    vals = np.asarray(values, float)
    vals = vals[np.isfinite(vals)]
    if not len(vals):
        return float("nan"), float("nan")
    lo, hi = np.percentile(vals, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def cluster_draws(n_clusters: int, n_boot: int, seed: int) -> list[np.ndarray]:
    """Bootstrap resamples of cluster indices (with replacement), the same for every estimator."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_clusters, n_clusters) for _ in range(n_boot)]


Metric = tuple[float, float, float]  # (point, lo, hi)


def variant_metrics(score: np.ndarray, edits: list[EditRecord], draws: list[np.ndarray]) -> dict[str, Metric]:
    """pair_action, pair_traj, spearman, auc with percentile bootstrap intervals over problems."""
    effect = np.array([e.effect for e in edits])
    problems = sorted({e.problem for e in edits})
    cluster = np.array([problems.index(e.problem) for e in edits])
    members = [np.flatnonzero(cluster == c) for c in range(len(problems))]
    action = np.unique([e.row_id for e in edits], return_inverse=True)[1]
    traj = np.unique([e.traj_id for e in edits], return_inverse=True)[1]
    counts = {
        "pair_action": np.array([pair_counts(score[m], effect[m], action[m]) for m in members]).reshape(
            -1, 2
        ),
        "pair_traj": np.array([pair_counts(score[m], effect[m], traj[m]) for m in members]).reshape(-1, 2),
    }

    def evaluate(sample: np.ndarray) -> dict[str, float]:
        idx = np.concatenate([members[c] for c in sample]) if len(sample) else np.zeros(0, int)
        values = {name: pooled_ratio(c, sample) for name, c in counts.items()}
        values["spearman"] = spearman(score[idx], effect[idx])
        values["auc"] = auc(score[idx], effect[idx])
        return values

    point = evaluate(np.arange(len(problems)))
    boots = [evaluate(d) for d in draws if len(problems)]
    return {name: (value, *percentile_interval([b[name] for b in boots])) for name, value in point.items()}


@dataclass
class Row:
    variant: str
    estimator: str
    metrics: dict[str, Metric]
    coverage: float  # nan for estimators without diff-level units
    ms: float  # compute_credit wall time on the variant's batch


def score_variant(
    name: str, data: VariantData, estimators: Sequence[str], n_boot: int, seed: int
) -> list[Row]:
    from pipeline.credit import CreditSettings, clear_caches, compute_credit

    problems = sorted({e.problem for e in data.edits})
    draws = cluster_draws(len(problems), n_boot, seed)
    rows = []
    for estimator in estimators:
        clear_caches()  # every timed batch is cold: the first estimator must not warm the others' caches
        t0 = time.perf_counter()
        result = compute_credit(data.steps, CreditSettings(estimator=estimator))
        ms = 1000 * (time.perf_counter() - t0)
        coverage = _coverage(result.diagnostics, estimator)
        score = edit_scores(result, data.steps, data.edits)
        rows.append(Row(name, estimator, variant_metrics(score, data.edits, draws), coverage, ms))
    return rows


def _coverage(diagnostics, estimator: str) -> float:
    """Share of changed tokens under the estimator's diff-level units (anchors or line units); nan for an
    estimator without any."""
    from pipeline.credit.estimators import get_estimator

    spec = get_estimator(estimator)
    return (diagnostics.line_coverage if spec.needs_lines else
            diagnostics.coverage if spec.needs_anchors else float("nan"))


def within_pairs(edits: list[EditRecord], by: str) -> int:
    """Helpful x harmful pairs sharing an action (by="row_id") or a trajectory (by="traj_id")."""
    effect = np.array([e.effect for e in edits])
    group = np.unique([getattr(e, by) for e in edits], return_inverse=True)[1] if edits else np.zeros(0, int)
    return pair_counts(np.zeros(len(edits)), effect, group)[1]


def _fmt(m: Metric) -> str:
    value, lo, hi = m
    if not np.isfinite(value):
        return f"{'-':>20}"
    if not np.isfinite(lo):
        return f"{value:>6.3f}{'':>14}"
    return f"{value:>6.3f} [{lo:>5.2f},{hi:>5.2f}]"


def summary_line(rows: list[Row], pairs: int) -> str:
    """The benchmark's last line (see the module docstring)."""
    get = {(r.variant, r.estimator): r for r in rows}
    nan = (float("nan"),) * 3

    def metric(variant: str, estimator: str, name: str) -> float:
        row = get.get((variant, estimator))
        return (row.metrics.get(name, nan) if row else nan)[0]

    hard = [metric(v, "didpo_did", "pair_action") for v in HARDENED if (v, "didpo_did") in get]
    hard = [h for h in hard if np.isfinite(h)]
    did = get.get(("mixed", "didpo_did"))
    return (
        f"credit_fidelity: did_pair_action={metric('mixed', 'didpo_did', 'pair_action'):.4f} "
        f"did_pair_action_hard={min(hard) if hard else float('nan'):.4f} "
        f"did_spearman={metric('mixed', 'didpo_did', 'spearman'):.4f} "
        f"did_coverage={did.coverage if did else float('nan'):.4f} "
        f"didpo_pair_action={metric('mixed', 'didpo', 'pair_action'):.4f} "
        f"gigpo_pair_action={metric('mixed', 'gigpo', 'pair_action'):.4f} pairs={pairs}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default=",".join(SOURCES), help="task sources, comma separated")
    parser.add_argument("--tasks", type=int, default=16, help="qualifying tasks (0: every qualifying task)")
    parser.add_argument("--rollouts", type=int, default=80, help="rollouts per task (G)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma separated; mixed always runs")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS), help="comma separated")
    parser.add_argument("--boot", type=int, default=500, help="bootstrap resamples of problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--ids", default="", help="only these task ids (comma separated), in this order")
    args = parser.parse_args(argv)
    estimators = [e for e in args.estimators.split(",") if e]
    for needed in ("didpo_did", "didpo", "gigpo"):  # the last line reports them
        if needed not in estimators:
            estimators.append(needed)

    bench = build(
        [s for s in args.sources.split(",") if s], args.tasks, args.rollouts, args.turns,
        [v for v in args.variants.split(",") if v], args.seed, args.pool_size,
        log=lambda m: print(m, flush=True), ids=[i for i in args.ids.split(",") if i] or None,
    )  # fmt: skip
    print(
        f"built in {bench.seconds:.0f} s: {bench.executions} sandbox runs for {bench.lookups} requests "
        f"({args.rollouts} rollouts x {args.turns} turns per task)"
    )
    print(f"\n{'variant':<13}{'tasks':>6}{'steps':>7}{'edits':>7}{'helpful':>8}{'harmful':>8}{'none':>6}"
          f"{'pairs_action':>13}{'pairs_traj':>11}")  # fmt: skip
    for name, data in bench.variants.items():
        effect = np.array([e.effect for e in data.edits])
        print(
            f"{name:<13}{data.n_tasks:>6}{len(data.steps):>7}{len(data.edits):>7}{int((effect > 0).sum()):>8}"
            f"{int((effect < 0).sum()):>8}{int((effect == 0).sum()):>6}{within_pairs(data.edits, 'row_id'):>13}"
            f"{within_pairs(data.edits, 'traj_id'):>11}"
        )
    t0 = time.perf_counter()
    rows = [
        r
        for name, data in bench.variants.items()
        if data.edits  # a variant no task qualified for has nothing to score
        for r in score_variant(name, data, estimators, args.boot, args.seed)
    ]
    columns = ("pair_action", "pair_traj", "spearman", "auc")
    print(
        f"\n{'variant':<13}{'estimator':<11}"
        + "".join(f"{c:>21}" for c in columns)
        + f"{'coverage':>9}{'ms':>8}"
    )
    for r in rows:
        cov = f"{r.coverage:>9.3f}" if np.isfinite(r.coverage) else f"{'-':>9}"
        print(
            f"{r.variant:<13}{r.estimator:<11}"
            + "".join(f" {_fmt(r.metrics[c])}" for c in columns)
            + f"{cov}{r.ms:>8.0f}"
        )
    n_problems = len({e.problem for e in bench.variants["mixed"].edits})
    print(
        f"(point [95% percentile bootstrap over problems, {args.boot} resamples; mixed: {n_problems} problems]; "
        f"scoring {time.perf_counter() - t0:.0f} s; total {time.perf_counter() - t0 + bench.seconds:.0f} s)"
    )
    print(summary_line(rows, within_pairs(bench.variants["mixed"].edits, "row_id")))


if __name__ == "__main__":
    sys.exit(main())
