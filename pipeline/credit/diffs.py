"""Whole diff of a step: the real change between the touched files before and after the action.

Per file, the line-level change is computed with difflib after trimming the common prefix and suffix, so a
whole-file rewrite that changes two lines is a two-line diff and its unchanged lines get no diff credit.
Each added line is located inside the response text that wrote it (the payload span of an edit on that
file); each deleted line inside the search text of a search/replace edit on that file.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from pipeline.credit.inputs import StepInput
from pipeline.credit.normalize import normalize_line


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One added or deleted line."""

    line_no: int  # 0-based line index: in the file after the action (added) or before it (deleted)
    text: str  # the line without its newline
    span: (
        tuple[int, int] | None
    )  # [s, e) of the response text that wrote it (added) / its search text (deleted)


@dataclass(frozen=True, slots=True)
class Hunk:
    """A contiguous change of one file: the lines it deleted and the lines it added."""

    file: str
    deleted: tuple[DiffLine, ...]
    added: tuple[DiffLine, ...]

    def signature(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """What the change is, independent of where it sits: repeats of it carry no new credit."""
        return self.file, tuple(d.text for d in self.deleted), tuple(a.text for a in self.added)


Region = tuple[int, int, int, int]  # (i1, i2, j1, j2): a[i1:i2] became b[j1:j2]


def changed_regions(a: Sequence, b: Sequence, max_lines: int | None = None) -> tuple[Region, ...]:
    """Changed regions of the line sequence a -> b, in order; the lines between them are equal one for one.

    Common prefix and suffix lines are trimmed first (linear); difflib only sees the changed middle. Where the
    middle is as long on both sides, lines rewritten in place are preferred to difflib's moves when they
    change no more lines (a line the file holds twice, rewritten at one copy while its other copy is
    rewritten into it, is two rewrites, not a line moved). A middle longer than `max_lines` on either side is
    reported as one region without running difflib.
    """
    lo = 0
    while lo < len(a) and lo < len(b) and a[lo] == b[lo]:
        lo += 1
    hi_a, hi_b = len(a), len(b)
    while hi_a > lo and hi_b > lo and a[hi_a - 1] == b[hi_b - 1]:
        hi_a -= 1
        hi_b -= 1
    n_a, n_b = hi_a - lo, hi_b - lo
    if n_a == n_b == 0:
        return ()
    if (max_lines is not None and max(n_a, n_b) > max_lines) or min(n_a, n_b) == 0 or n_a == n_b == 1:
        # too long, a pure insertion or deletion, or one line for one (trimmed ends differ): one region, as
        # difflib would find it
        return ((lo, hi_a, lo, hi_b),)
    matcher = difflib.SequenceMatcher(None, a[lo:hi_a], b[lo:hi_b])
    moved = tuple((i1 + lo, i2 + lo, j1 + lo, j2 + lo) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
                  if tag != "equal")
    if n_a == n_b:
        differ = [k for k in range(lo, hi_a) if a[k] != b[k]]
        if 2 * len(differ) <= sum(i2 - i1 + j2 - j1 for i1, i2, j1, j2 in moved):
            runs = [[differ[0], differ[0] + 1]]
            for k in differ[1:]:
                if k == runs[-1][1]:
                    runs[-1][1] = k + 1
                else:
                    runs.append([k, k + 1])
            return tuple((i, j, i, j) for i, j in runs)
    return moved


@lru_cache(maxsize=4096)
def line_opcodes(before: str, after: str, max_diff_lines: int) -> tuple[Region, ...]:
    """Changed regions (i1, i2, j1, j2) of two texts' lines: before-lines [i1, i2) became after-lines
    [j1, j2) (`changed_regions`)."""
    return changed_regions(before.splitlines(), after.splitlines(), max_diff_lines)


class _Locator:
    """Finds the response line that wrote a file line: inside the response regions (edit payloads) of the
    file, whole lines only (a line `    count` is not the start of `    count = 0`), in reading order."""

    def __init__(self, response: str, spans: list[tuple[int, int]], after: list[str] | None = None) -> None:
        # per region: (start, end, text) of each of its lines, split the way the file's lines are split
        self.regions: list[list[tuple[int, int, str]]] = []
        for s, e in spans:
            lines, at = [], s
            for piece in response[s:e].splitlines(keepends=True):
                text = piece.splitlines()[0]
                lines.append((at, at + len(text), text))
                at += len(piece)
            self.regions.append(lines)
        self.cursors = [0] * len(self.regions)
        # (p, region): the region's lines sit as one block at line p of the file after the action (a whole-file
        # write at 0, a search/replace payload where it landed), so its line i wrote the file's line p + i,
        # even where the same text also occurs elsewhere in the payload
        self.blocks = [(p, lines) for lines in self.regions for p in _block_positions([t for *_, t in lines], after)]

    def find(self, line: str, line_no: int | None = None) -> tuple[int, int] | None:
        """The span that wrote `line` (the file's line `line_no` after the action, when known), or None."""
        needle = line.strip()
        if not needle or not self.regions:
            return None
        for p, lines in self.blocks:
            if line_no is not None and p <= line_no < p + len(lines):
                start, end, _ = lines[line_no - p]
                return start, end
        # Reading order first: every region from its cursor, so a line written by a later edit block is not
        # pinned on an earlier block's copy of the same text; only then the first occurrence anywhere. An
        # exact line first, then one equal up to surrounding spaces (the span then covers the code only).
        for exact in (True, False):
            for from_cursor in (True, False):
                for k, lines in enumerate(self.regions):
                    for i in range(self.cursors[k] if from_cursor else 0, len(lines)):
                        start, end, text = lines[i]
                        if (text == line) if exact else (text.strip() == needle):
                            self.cursors[k] = i + 1
                            if not exact:
                                start += len(text) - len(text.lstrip())
                                end = start + len(needle)
                            return start, end
        return None


def _block_positions(block: list[str], lines: list[str] | None) -> list[int]:
    """Every p where lines[p : p + len(block)] == block."""
    if not block or lines is None:
        return []
    n = len(block)
    return [p for p in range(len(lines) - n + 1) if lines[p] == block[0] and lines[p : p + n] == block]


def _code(lines: list[str]) -> list[str]:
    return [norm for line in lines if (norm := normalize_line(line))]


def whole_diff(step: StepInput, max_file_lines: int, max_diff_lines: int, stats: Counter) -> list[Hunk]:
    """Hunks of added and deleted lines of one step, files in sorted order.

    A region whose lines differ only in blank lines, comments or spacing is no change. Files longer than
    `max_file_lines` are skipped (counted in stats["files_over_cap"]), and so are changed regions longer
    than `max_diff_lines` (stats["regions_over_cap"]).
    """
    hunks: list[Hunk] = []
    for path in sorted(set(step.files_before) | set(step.files_after)):
        before, after = step.files_before.get(path, ""), step.files_after.get(path, "")
        if before == after:
            continue
        if max(before.count("\n"), after.count("\n")) > max_file_lines:
            stats["files_over_cap"] += 1
            continue
        opcodes = line_opcodes(before, after, max_diff_lines)
        if not opcodes:
            continue
        edits = [e for e in step.edits if e.path == path]
        a_lines, b_lines = before.splitlines(), after.splitlines()
        adds = dels = None  # made on first use: a side without lines never needs its locator
        for i1, i2, j1, j2 in opcodes:
            if i2 - i1 > max_diff_lines or j2 - j1 > max_diff_lines:
                stats["regions_over_cap"] += 1  # too big to locate line by line: episode credit only
                continue
            if _code(a_lines[i1:i2]) == _code(b_lines[j1:j2]):
                continue  # only blank lines, comments or spacing changed: no code change to credit
            if i2 > i1 and dels is None:
                dels = _Locator(step.response_text,
                                [e.search_span for e in edits if e.op == "replace" and e.search_span is not None])
            if j2 > j1 and adds is None:
                adds = _Locator(step.response_text, [e.replace_span for e in edits if e.replace_span is not None],
                                b_lines)
            deleted = tuple(DiffLine(i, a_lines[i], dels.find(a_lines[i])) for i in range(i1, i2))
            added = tuple(DiffLine(j, b_lines[j], adds.find(b_lines[j], j)) for j in range(j1, j2))
            hunks.append(Hunk(path, deleted, added))
    return hunks
