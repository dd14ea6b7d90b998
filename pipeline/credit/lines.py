"""Line units of the state model (`didpo_did`, docs/didpo_did.md): what a workspace contains, line by line.

A unit is one line of code of one file at one place, compared as its tokens (`normalize.comparison_tokens`:
comments and spacing do not matter; names do, unlike for anchors: inside one line, renaming bound names
would make a misspelt binding the same line as the correct one), relative to the trajectory's starting
workspace: `del` (line i of the start is missing) or `add` (a line the start does not have there is present;
its place is the start line it stands in for, or the start line it was inserted before and its rank among
the insertions). Places come from aligning each file with its start (`diffs.changed_regions` over the
lines' tokens). The state after a step is the set of units present in its whole workspace; so a fix
written in any turn, by any rollout, is the same unit (same line, same place), undoing a harmful change
removes the harm's unit, and a line the program holds twice is two units: a fix at one copy and a harm at
the other do not cancel.

A step's *changes* are the pairs of its diff (`diffs.whole_diff`): within a hunk, deleted line j with added
line j (a rewritten line), and the unpaired rest. A change's *terms* are the units its lines switched on (+1)
or off (-1) between the state before and after the step; its tokens are those of both lines (the written
line, and the search text that quoted the deleted one). The estimator fits an effect per unit and gives each
change the signed sum of its terms' effects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pipeline.credit.diffs import changed_regions, whole_diff
from pipeline.credit.inputs import StepInput
from pipeline.credit.normalize import comparison_tokens, normalize_line


@dataclass(frozen=True)
class LineUnits:
    """The line units of one batch (rows in canonical order)."""

    present: np.ndarray  # [M, 2] int: (row, unit) pairs, the unit present in the workspace after the row's step
    unit_task: np.ndarray  # [U] int: task index of each unit
    term_change: np.ndarray  # [K] int: the change (index over the batch's changes) each term belongs to
    term_unit: np.ndarray  # [K] int: the unit the term switches
    term_sign: np.ndarray  # [K] float: +1 switched on, -1 switched off
    n_changes: int
    token_change: list[np.ndarray]  # per row [T] int: change whose lines cover the token, -1 none
    n_changed_tokens: int  # tokens of changed lines (written lines and quoted deleted lines)
    n_covered_tokens: int  # of those, tokens of a change with at least one term


Unit = tuple[str, str, tuple[int, int], tuple[str, ...]]  # (kind, path, place, tokens)


@lru_cache(maxsize=8192)
def _code_keys(text: str) -> tuple[tuple[str, ...] | None, ...]:
    """Per line of `text`: its comparison tokens (None for a blank or comment-only line)."""
    return tuple(comparison_tokens(norm, False) if (norm := normalize_line(line)) else None
                 for line in text.splitlines())


@lru_cache(maxsize=8192)
def _placed(path: str, start: str, text: str) -> tuple[frozenset, tuple]:
    """One file: its units relative to its start, and per line of `text` the unit that line stands for (its
    `add` unit, or the `del` unit of the start line it still is; None for a blank or comment line)."""
    s, w = _code_keys(start), _code_keys(text)
    units: set = set()
    line_unit: list = [None] * len(w)
    i = j = 0
    for i1, i2, j1, j2 in (*changed_regions(s, w), (len(s), len(s), len(w), len(w))):
        for k in range(i1 - i):  # the equal run before the region: each line is still its start line
            if s[i + k] is not None:
                line_unit[j + k] = ("del", path, (i + k, 0), s[i + k])
        units.update(("del", path, (x, 0), s[x]) for x in range(i1, i2) if s[x] is not None)
        for k, y in enumerate(range(j1, j2)):
            if w[y] is not None:  # in place of start line i1 + k, else the (k - n + 1)-th line inserted before i2
                place = (i1 + k, 0) if k < i2 - i1 else (i2, k - (i2 - i1) + 1)
                line_unit[y] = ("add", path, place, w[y])
                units.add(line_unit[y])
        i, j = i2, j2
    return frozenset(units), tuple(line_unit)


def _workspace_units(start: Mapping[str, str], files: Mapping[str, str], max_file_lines: int
                     ) -> tuple[frozenset, dict[str, tuple]]:
    """The units of a workspace (every file the trajectory has touched) and each file's line -> unit map; a
    file longer than max_file_lines has none (as `whole_diff` skips it)."""
    units: set = set()
    lines: dict[str, tuple] = {}
    for path in sorted(start):
        text = files.get(path, "")
        if max(start[path].count("\n"), text.count("\n")) > max_file_lines:
            continue
        found, lines[path] = _placed(path, start[path], text)
        units |= found
    return frozenset(units), lines


def line_units(rows: Sequence[StepInput], task_index: np.ndarray, traj_index: np.ndarray, *,
               max_file_lines: int, max_diff_lines: int, stats: Counter) -> LineUnits:
    """Units present after each row, and each row's changes with their terms and tokens (see the module
    docstring). `rows` are in canonical order (task, trajectory, turn)."""
    unit_of: dict[tuple[int, Unit], int] = {}
    unit_task: list[int] = []
    present: list[tuple[int, int]] = []
    term_change: list[int] = []
    term_unit: list[int] = []
    term_sign: list[float] = []
    token_change: list[np.ndarray] = []
    n_changes = changed_tokens = covered_tokens = 0
    start: dict[str, str] = {}  # path -> its text when the trajectory first touched it ("" if it made it)
    workspace: dict[str, str] = {}  # path -> its text now, for every path the trajectory has touched

    def unit(task: int, key: Unit) -> int:
        u = unit_of.setdefault((task, key), len(unit_task))
        if u == len(unit_task):
            unit_task.append(task)
        return u

    for r, step in enumerate(rows):
        task = int(task_index[r])
        if r == 0 or traj_index[r] != traj_index[r - 1]:
            start, workspace = {}, {}
        for path, text in step.files_before.items():
            start.setdefault(path, text)
        for path in step.files_after:
            start.setdefault(path, "")
        before_files = {**workspace, **step.files_before}
        # the workspace after the step: what it had, less the files the step deleted, plus what it wrote
        workspace = {p: t for p, t in before_files.items() if p in step.files_after or p not in step.files_before}
        workspace.update(step.files_after)
        before, before_lines = _workspace_units(start, before_files, max_file_lines)
        after, after_lines = _workspace_units(start, workspace, max_file_lines)
        # sorted: unit ids (the regression's column order) must not follow the process's string hash seed,
        # or two processes (two Dask workers, a rerun) solve in another order and write other bytes
        present.extend((r, unit(task, k)) for k in sorted(after))
        switched = {k: (unit(task, k), 1.0 if k in after else -1.0) for k in sorted(before ^ after)}
        owner = np.full(step.n_tokens, -1, np.int64)
        for hunk in whole_diff(step, max_file_lines, max_diff_lines, stats):
            for j in range(max(len(hunk.deleted), len(hunk.added))):
                pairs = [(side[j], line_map.get(hunk.file, ())) for side, line_map in
                         ((hunk.deleted, before_lines), (hunk.added, after_lines)) if j < len(side)]
                keys = {m[d.line_no] for d, m in pairs if d.line_no < len(m) and m[d.line_no] is not None}
                terms = [switched[k] for k in sorted(keys) if k in switched]
                spans = [d.span for d, _ in pairs if d.span is not None]
                if not spans:
                    continue
                tokens = np.zeros(step.n_tokens, bool)
                for s, e in spans:
                    tokens |= (step.token_char_starts < e) & (step.token_char_ends > s)
                changed_tokens += int(tokens.sum())
                if not terms:
                    continue
                covered_tokens += int((tokens & (owner < 0)).sum())
                owner[tokens & (owner < 0)] = n_changes
                for u, sign in terms:
                    term_change.append(n_changes)
                    term_unit.append(u)
                    term_sign.append(sign)
                n_changes += 1
        token_change.append(owner)
    return LineUnits(
        present=np.array(present, np.int64).reshape(-1, 2),
        unit_task=np.array(unit_task, np.int64),
        term_change=np.array(term_change, np.int64),
        term_unit=np.array(term_unit, np.int64),
        term_sign=np.array(term_sign, np.float64),
        n_changes=n_changes,
        token_change=token_change,
        n_changed_tokens=changed_tokens,
        n_covered_tokens=covered_tokens,
    )
