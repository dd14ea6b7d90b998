"""Line units of the state model (`didpo_did`, docs/didpo_did.md): what a workspace contains, line by line.

A unit is one line of code of one file, compared as its tokens (`normalize.comparison_tokens`: comments and
spacing do not matter; names do, unlike for anchors: inside one line, renaming bound names would make a
misspelt binding the same line as the correct one), relative to the trajectory's starting workspace:
`add` (a line the start lacks is present) or `del` (a line of the start is missing). The state after a step is
the set of units present in it; so a fix written in any turn, by any rollout, is the same unit wherever it
lands, and undoing a harmful change removes the harm's unit.

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

from pipeline.credit.diffs import whole_diff
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


@lru_cache(maxsize=8192)
def _file_lines(path: str, text: str) -> frozenset[tuple[str, tuple[str, ...]]]:
    return frozenset((path, comparison_tokens(norm, False))
                     for line in text.splitlines() if (norm := normalize_line(line)))


def _state(files: Mapping[str, str]) -> frozenset[tuple[str, tuple[str, ...]]]:
    out: set = set()
    for path, text in files.items():
        out |= _file_lines(path, text)
    return frozenset(out)


def line_units(rows: Sequence[StepInput], task_index: np.ndarray, traj_index: np.ndarray, *,
               max_file_lines: int, max_diff_lines: int, stats: Counter) -> LineUnits:
    """Units present after each row, and each row's changes with their terms and tokens (see the module
    docstring). `rows` are in canonical order (task, trajectory, turn)."""
    unit_of: dict[tuple[int, str, str, tuple[str, ...]], int] = {}
    unit_task: list[int] = []
    present: list[tuple[int, int]] = []
    term_change: list[int] = []
    term_unit: list[int] = []
    term_sign: list[float] = []
    token_change: list[np.ndarray] = []
    n_changes = changed_tokens = covered_tokens = 0
    start: frozenset = frozenset()

    def unit(task: int, kind: str, key: tuple[str, tuple[str, ...]]) -> int:
        u = unit_of.setdefault((task, kind, *key), len(unit_task))
        if u == len(unit_task):
            unit_task.append(task)
        return u

    for r, step in enumerate(rows):
        task = int(task_index[r])
        before = _state(step.files_before)
        if r == 0 or traj_index[r] != traj_index[r - 1]:
            start = before  # the trajectory's starting workspace: units are relative to it
        after = _state(step.files_after)
        # sorted: unit ids (the regression's column order) must not follow the process's string hash seed,
        # or two processes (two Dask workers, a rerun) solve in another order and write other bytes
        present.extend((r, unit(task, "add", k)) for k in sorted(after - start))
        present.extend((r, unit(task, "del", k)) for k in sorted(start - after))
        switched: dict[tuple[str, tuple[str, ...]], tuple[int, float]] = {}
        for k in sorted(before ^ after):
            # a start line coming back switches its `del` unit off; any other line switches its `add` unit
            on = k in after
            switched[k] = (unit(task, "del", k), -1.0 if on else 1.0) if k in start else (unit(task, "add", k),
                                                                                          1.0 if on else -1.0)
        owner = np.full(step.n_tokens, -1, np.int64)
        for hunk in whole_diff(step, max_file_lines, max_diff_lines, stats):
            for j in range(max(len(hunk.deleted), len(hunk.added))):
                lines = [side[j] for side in (hunk.deleted, hunk.added) if j < len(side)]
                keys = {(hunk.file, comparison_tokens(norm, False))
                        for d in lines if (norm := normalize_line(d.text))}
                terms = [switched[k] for k in sorted(keys) if k in switched]
                spans = [d.span for d in lines if d.span is not None]
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
