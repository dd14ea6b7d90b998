"""Repair tasks minted from tasks with a reference solution: inject 1..k bugs, keep those the tests catch.

In the spirit of SWE-smith (mutate working code to mint repair tasks), but at function level and offline:

1. `bug_candidates(text, families)` lists every single-line bug of the catalogue `FAMILIES` that the file
   admits (pure; each candidate keeps the file parseable and changes it):

     misspell      one use of a name that occurs elsewhere in the file, misspelt (a NameError the test
                   feedback points at; the right spelling is in the file)
     operator      a comparison, arithmetic or boolean operator swapped for a near one (< for <=, + for -)
     off_by_one    an integer literal one more or one less
     drop_return   `return x` becomes the bare expression `x`
     swap_args     the first two positional arguments of a call swapped
     delete_line   a simple statement deleted

2. `make_repair_tasks(tasks, judge, ...)` draws bug sets (distinct lines, seeded) and keeps one only when the
   sandbox says each of its bugs alone fails the visible tests and so does the whole set; infrastructure
   errors stop the run instead of deciding anything. The sandbox's report of the whole set's failing run
   (what `<run_tests/>` would show) is kept in the recipe and shown in the task, as a bug report shows the
   failing test: the policy starts from the symptom, not only from the code.
3. The result is a list of `RepairRecipe`s: a task file stores recipes (source task, file, bugs), not copies
   of tests, and `load_repair(path, load_source)` rebuilds each task from its source, refusing a recipe whose original
   lines are not in the source any more. The bugs live in `meta["bugs"]`, which no prompt renders.

Splits are by source program (`problem_split`: a hash of the problem key, so every bug set of one program
falls on one side, in every file) or, as an option, by instance (unseen bug sets of the same programs).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import json
import keyword
import random
import tokenize
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from pipeline.tasks.base import Split, Task
from pipeline.tasks.cases import parse_python
from pipeline.tasks.records import RowModel, load_rows

FAMILIES = ("misspell", "operator", "off_by_one", "drop_return", "swap_args", "delete_line")
SplitBy = Literal["program", "instance"]

# near operators: each swap keeps the line valid Python and usually changes a result
_OPERATOR_SWAPS = {
    "<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==",
    "+": "-", "-": "+", "*": "+", "//": "/", "/": "//", "%": "//",
    "+=": "-=", "-=": "+=", "and": "or", "or": "and",
}
_BUILTIN_NAMES = frozenset(dir(builtins))
_KEEP = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {"self", "cls"}


@dataclass(frozen=True)
class Bug:
    """One injected bug: 1-based `line` of `path` in the source's reference, its original text, and the
    buggy text (None: the line is deleted)."""

    line: int
    family: str
    original: str
    buggy: str | None

    def as_json(self) -> dict:
        return {"line": self.line, "family": self.family, "original": self.original, "buggy": self.buggy}


def _parses(text: str) -> bool:
    try:
        parse_python(text)
    except (SyntaxError, ValueError):
        return False
    return True


def _line_tokens(text: str) -> list[tokenize.TokenInfo]:
    try:
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return []


def _replace(line: str, start: int, end: int, new: str) -> str:
    return line[:start] + new + line[end:]


def _misspellings(name: str) -> list[str]:
    """Spellings one typo away: a dropped letter, two neighbours swapped, a doubled letter."""
    out = []
    for i in range(1, len(name)):
        out.append(name[:i] + name[i + 1:])
        if name[i - 1] != name[i]:
            out.append(name[:i - 1] + name[i] + name[i - 1] + name[i + 1:])
    out.append(name + name[-1])
    return [m for m in dict.fromkeys(out) if m.isidentifier() and not keyword.iskeyword(m) and m != name]


def parse_families(text: str) -> tuple[str, ...]:
    """Bug families from a comma-separated list ("misspell,operator"); ValueError naming what is wrong."""
    chosen = tuple(f.strip() for f in text.split(",") if f.strip())
    unknown = sorted(set(chosen) - set(FAMILIES))
    if unknown or not chosen:
        raise ValueError(f"{'unknown ' + ', '.join(unknown) if unknown else 'none given'}; "
                         f"allowed: {', '.join(FAMILIES)}")
    return chosen


def bug_candidates(text: str, families: Sequence[str] = FAMILIES) -> list[Bug]:
    """Every single-line bug of `families` that `text` admits; each leaves the file parseable and changed.
    Deterministic order (line, then family, then column)."""
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown bug families {unknown}; allowed: {', '.join(FAMILIES)}")
    lines = text.splitlines()
    tokens = _line_tokens(text)
    if not tokens or not _parses(text):
        return []
    names = [t for t in tokens if t.type == tokenize.NAME and t.string not in _KEEP]
    uses: dict[str, int] = {}
    for t in names:
        uses[t.string] = uses.get(t.string, 0) + 1
    all_names = set(uses) | _BUILTIN_NAMES
    found: list[Bug] = []

    def add(row: int, family: str, new_line: str | None) -> None:
        original = lines[row - 1]
        if new_line == original:
            return
        new_lines = lines[:row - 1] + ([] if new_line is None else [new_line]) + lines[row:]
        if _parses("\n".join(new_lines) + "\n"):
            found.append(Bug(row, family, original, new_line))

    for t in tokens:
        (row, col), (end_row, end_col) = t.start, t.end
        if row != end_row or row > len(lines):
            continue
        line = lines[row - 1]
        if "misspell" in families and t.type == tokenize.NAME and uses.get(t.string, 0) >= 2:
            for wrong in _misspellings(t.string):
                if wrong not in all_names:
                    add(row, "misspell", _replace(line, col, end_col, wrong))
                    break
        if "operator" in families and t.string in _OPERATOR_SWAPS and t.type in (tokenize.OP, tokenize.NAME):
            add(row, "operator", _replace(line, col, end_col, _OPERATOR_SWAPS[t.string]))
        if "off_by_one" in families and t.type == tokenize.NUMBER and t.string.isdigit():
            value = int(t.string)
            add(row, "off_by_one", _replace(line, col, end_col, str(value + 1 if value == 0 else value - 1)))
    tree = parse_python(text)
    for node in ast.walk(tree):
        row = getattr(node, "lineno", None)
        if row is None or getattr(node, "end_lineno", row) != row:
            continue
        line = lines[row - 1]
        if "drop_return" in families and isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            add(row, "drop_return", line[:node.col_offset] + line[value.col_offset:value.end_col_offset]
                + line[node.end_col_offset:])
        if "swap_args" in families and isinstance(node, ast.Call) and len(node.args) >= 2:
            a, b = node.args[0], node.args[1]
            if a.lineno == b.end_lineno == row and not isinstance(a, ast.Starred) and not isinstance(b, ast.Starred):
                left, right = line[a.col_offset:a.end_col_offset], line[b.col_offset:b.end_col_offset]
                if left != right:
                    add(row, "swap_args", line[:a.col_offset] + right + line[a.end_col_offset:b.col_offset] + left
                        + line[b.end_col_offset:])
        if "delete_line" in families and isinstance(node, ast.stmt) and not isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom
                | ast.If | ast.For | ast.While | ast.With | ast.Try | ast.Pass) \
                and line.strip() and len(line) - len(line.lstrip()) == node.col_offset:
            add(row, "delete_line", None)
    unique = {(b.line, b.family, b.buggy): b for b in found}
    return [unique[k] for k in sorted(unique, key=lambda k: (k[0], FAMILIES.index(k[1]), k[2] or ""))]


def apply_bugs(text: str, bugs: Iterable[Bug]) -> str:
    """`text` with each bug applied at its original line (lines must be distinct and hold `original`)."""
    lines = text.splitlines()
    for bug in sorted(bugs, key=lambda b: -b.line):
        if not 1 <= bug.line <= len(lines) or lines[bug.line - 1] != bug.original:
            raise ValueError(f"line {bug.line} is not {bug.original!r} in this file")
        lines[bug.line - 1:bug.line] = [] if bug.buggy is None else [bug.buggy]
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def problem_split(key: str, test_fraction: float) -> Split:
    """The side of a key (a program's problem key, or a task id): a hash, the same for every seed and file,
    so the bug sets of one program never fall on both sides of two files minted with different seeds."""
    digest = hashlib.sha256(f"repair-split:{key}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"


@dataclass(frozen=True)
class RepairRecipe:
    """How to rebuild one repair task from its source task: where the source is, which file, which bugs."""

    task_id: str
    split: Split
    source: str
    source_path: str | None
    source_task: str
    path: str
    bugs: tuple[Bug, ...]
    split_by: SplitBy
    seed: int
    failure: str = ""  # the visible tests' report on the buggy files, recorded when minted ("" if none)

    def as_json(self) -> dict:
        return {"task_id": self.task_id, "split": self.split, "source": self.source,
                "source_path": self.source_path, "source_task": self.source_task, "path": self.path,
                "bugs": [b.as_json() for b in self.bugs], "split_by": self.split_by, "seed": self.seed,
                **({"failure": self.failure} if self.failure else {})}


def _main_file(task: Task) -> str | None:
    """The reference's one Python file the tests import (None when there is no single such file)."""
    py = sorted(p for p in task.reference if p.endswith(".py") and not p.startswith("test"))
    module = task.hidden_tests.module
    if module and f"{module}.py" in task.reference:
        return f"{module}.py"
    return py[0] if len(py) == 1 else None


def bugs_note(path: str, count: int, failure: str = "") -> str:
    """What a repair task says about its bugs (never where they are), and the visible tests' failing run."""
    note = f"The code in {path} has {count} bug{'s' if count > 1 else ''}: fix {'them' if count > 1 else 'it'}."
    return note + (f"\n\nThe visible tests on it:\n{failure}" if failure else "")


def build_task(source_task: Task, recipe: RepairRecipe) -> Task:
    """The repair task of `recipe`: the source's reference with the bugs, its tests, its instructions with a
    note that the code has bugs; the bugs go to `meta` (never rendered into a prompt)."""
    # Files end in a newline, as every demonstration's target does (`training.sft.solution_files`): a
    # reference without one would otherwise teach a second, spurious edit that only adds it.
    workspace = {p: t if t.endswith("\n") or not t else t + "\n" for p, t in source_task.reference.items()}
    text = workspace[recipe.path]
    workspace[recipe.path] = apply_bugs(text, recipe.bugs)
    note = bugs_note(recipe.path, len(recipe.bugs), recipe.failure)
    meta = dict(source_task.meta)
    meta.update({"source_task": source_task.task_id, "bugs": [b.as_json() for b in recipe.bugs],
                 "split_by": recipe.split_by})
    return Task(task_id=recipe.task_id, source="repair", split=recipe.split,
                instructions=f"{source_task.instructions.rstrip()}\n\n{note}", workspace=workspace,
                visible_tests=source_task.visible_tests, hidden_tests=source_task.hidden_tests,
                reference=source_task.reference, meta=meta)


class _BugRow(RowModel):
    line: int = Field(ge=1)
    family: Literal[FAMILIES]  # type: ignore[valid-type]
    original: str
    buggy: str | None


class _RecipeRow(RowModel):
    task_id: str
    split: Literal["train", "validation", "test"]
    source: str
    source_path: str | None
    source_task: str
    path: str
    bugs: list[_BugRow] = Field(min_length=1)
    split_by: Literal["program", "instance"]
    seed: int
    failure: str = ""


def load_repair(path: Path, load_source: Callable[[str, str | None], list[Task]]) -> list[Task]:
    """Tasks of a repair task file (`make_repair_tasks` recipes, one JSON object per line), each rebuilt
    from its source task (`load_source(source, path)`: the task registry, passed in because the registry
    holds this loader too); a recipe whose source task or original lines are gone is refused with its line."""
    cache: dict[tuple[str, str | None], dict[str, Task]] = {}

    def convert(row: _RecipeRow) -> Task:
        key = (row.source, row.source_path)
        if key not in cache:
            if row.source == "repair":
                raise ValueError("a repair task cannot be minted from another repair file")
            cache[key] = {t.task_id: t for t in load_source(row.source, row.source_path)}
        source_task = cache[key].get(row.source_task)
        if source_task is None:
            raise ValueError(f"source task {row.source_task!r} is not in {row.source} ({row.source_path or 'bundled'})")
        if row.path not in source_task.reference:
            raise ValueError(f"{row.source_task} has no reference file {row.path!r}")
        bugs = tuple(Bug(b.line, b.family, b.original, b.buggy) for b in row.bugs)
        recipe = RepairRecipe(row.task_id, row.split, row.source, row.source_path, row.source_task, row.path, bugs,
                              row.split_by, row.seed, row.failure)
        return build_task(source_task, recipe)

    return load_rows(Path(path), _RecipeRow, convert)


def write_recipes(recipes: Sequence[RepairRecipe], out: Path) -> None:
    """Write a repair task file atomically (a killed run leaves no half file)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("".join(json.dumps(r.as_json(), sort_keys=True) + "\n" for r in recipes))
    tmp.replace(out)


def _task_id(source_task: str, bugs: Sequence[Bug]) -> str:
    digest = hashlib.sha256(json.dumps([b.as_json() for b in bugs], sort_keys=True).encode()).hexdigest()[:10]
    return f"repair/{source_task}~{digest}"


def _pick(by_family: dict[str, dict[int, list[Bug]]], k: int, rng: random.Random) -> tuple[Bug, ...]:
    """Up to k bugs at distinct lines, each of a family drawn uniformly among those with a free line (so the
    many misspellable names do not crowd out the rarer families), ordered by line."""
    picked: list[Bug] = []
    used: set[int] = set()
    while len(picked) < k:
        open_families = sorted(f for f, lines in by_family.items() if set(lines) - used)
        if not open_families:
            break
        lines = by_family[rng.choice(open_families)]
        row = rng.choice(sorted(set(lines) - used))
        picked.append(rng.choice(lines[row]))
        used.add(row)
    return tuple(sorted(picked, key=lambda b: b.line))


# (task, workspace) -> do the visible tests fail? Falsy: they pass; True, or the run's report (a non-empty str,
# kept in the recipe and shown in the task): they fail
Verdict = Callable[[Task, dict], bool | str]


FAILURE_CHARS = 600  # a bug report's length, not a log


def judge_verdict(judge: Any, *, report: bool = True) -> Verdict:
    """The sandbox's verdict for `make_repair_tasks`: the visible tests' report (what `<run_tests/>` shows)
    when they fail (True without `report`: the task then shows only the code), "" when they pass; an
    infrastructure error stops minting instead of deciding anything."""
    from pipeline.agent.episode import summarize

    def fails(task: Task, workspace: dict) -> bool | str:
        result = judge.run(task, workspace)
        if result.status == "infra_error":
            raise RuntimeError(f"sandbox infrastructure error on {task.task_id}: {result.detail[:200]}")
        if result.status == "passed":
            return ""
        return summarize(result, FAILURE_CHARS) if report else True

    return fails


def make_repair_tasks(tasks: Sequence[Task], fails: Verdict, *, n: int, bugs: tuple[int, int] = (1, 3),
                      families: Sequence[str] = FAMILIES, seed: int = 0, split_by: SplitBy = "program",
                      test_fraction: float = 0.2, source_path: str | None = None, loader: str | None = None,
                      max_attempts: int | None = None, on_progress: Callable[[int, int], None] | None = None
                      ) -> list[RepairRecipe]:
    """Up to `n` verified repair recipes from `tasks` (each needs a reference with one main Python file),
    deterministic for a given seed and verdict. `fails(task, workspace)` runs the visible tests (the CLI: in
    the sandbox) and says whether they fail; a bug set is kept when each bug alone fails and so does the set.
    `loader` and `source_path` say how to load the tasks again (default: each task's own source, bundled).
    Fewer than `n` come back when `max_attempts` (default 50 n) draws cannot find more."""
    lo, hi = bugs
    if not 1 <= lo <= hi:
        raise ValueError(f"bugs must be a range 1 <= lo <= hi, got {lo}-{hi}")
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be within [0, 1], got {test_fraction}")
    rng = random.Random(seed)
    pool = []
    for task in tasks:
        path = _main_file(task)
        if path is not None:
            by_family: dict[str, dict[int, list[Bug]]] = {}
            for bug in bug_candidates(task.reference[path], families):
                by_family.setdefault(bug.family, {}).setdefault(bug.line, []).append(bug)
            if len({row for lines in by_family.values() for row in lines}) >= lo:
                pool.append((task, path, by_family))
    if not pool:
        raise ValueError(f"no task offers {lo} line(s) with bugs of the families {list(families)}")
    single: dict[tuple[str, Bug], bool | str] = {}
    reference_fails: dict[str, bool] = {}
    seen: set[str] = set()
    out: list[RepairRecipe] = []
    for attempts in range(1, (max_attempts or 50 * n) + 1):
        if len(out) >= n:
            break
        task, path, by_family = pool[rng.randrange(len(pool))]
        if task.task_id not in reference_fails:  # a source whose reference fails its own tests mints nothing
            reference_fails[task.task_id] = fails(task, dict(task.reference))
        if reference_fails[task.task_id]:
            continue
        picked = _pick(by_family, rng.randint(lo, hi), rng)
        if len(picked) < lo:
            continue
        task_id = _task_id(task.task_id, picked)
        if task_id in seen:
            continue
        seen.add(task_id)
        ok: bool | str = True
        for bug in picked:
            if (task.task_id, bug) not in single:
                workspace = dict(task.reference)
                workspace[path] = apply_bugs(task.reference[path], [bug])
                single[(task.task_id, bug)] = fails(task, workspace)
            ok = ok and single[(task.task_id, bug)]
        if ok and len(picked) > 1:
            workspace = dict(task.reference)
            workspace[path] = apply_bugs(task.reference[path], picked)
            ok = fails(task, workspace)
        if ok:
            problem = str(task.meta.get("problem", task.task_id))
            split = problem_split(problem if split_by == "program" else task_id, test_fraction)
            out.append(RepairRecipe(task_id, split, loader or task.source, source_path, task.task_id, path, picked,
                                    split_by, seed, ok if isinstance(ok, str) else ""))
            if on_progress is not None:
                on_progress(len(out), attempts)
    return out
