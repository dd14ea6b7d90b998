"""Multi-scale sub-diff candidates of a hunk side (its added lines, or its deleted lines).

Scales: the whole hunk side ("hunk"), contiguous windows of w normalized lines ("win<w>", stride w//2),
and AST-aligned blocks ("ast": the changed lines inside one compound statement or function) when the
file parses. Blank and comment-only lines are not part of any candidate.
"""

from __future__ import annotations

import ast
import bisect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from pipeline.credit.diffs import DiffLine
from pipeline.credit.normalize import normalize_line
from pipeline.tasks.cases import parse_python

_COMPOUND = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.If,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.Match,
)


@dataclass(slots=True)
class Candidate:
    """One sub-diff candidate: a contiguous run of normalized changed lines of one hunk side."""

    row: int  # index of the step in the batch
    file: str
    edit_type: str  # "add" or "del"
    scale: str  # "hunk", "win<w>", "ast"
    unit_start: int  # first covered line unit (global id of a normalized changed line)
    unit_end: int  # one past the last covered unit
    line_start: int  # first file line (0-based) of the candidate
    line_end: int  # one past its last file line
    text: str  # normalized lines joined by "\n"
    spans: tuple[tuple[int, int], ...]  # response char spans of its lines (located ones only)

    @property
    def n_lines(self) -> int:
        return self.unit_end - self.unit_start


@lru_cache(maxsize=2048)
def ast_blocks(source: str, max_lines: int) -> tuple[tuple[int, int], ...]:
    """0-based line ranges [start, end) of compound statements and function bodies; () if it does not parse."""
    if source.count("\n") > max_lines:
        return ()
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    blocks: set[tuple[int, int]] = set()
    pending = list(tree.body)
    while pending:  # statements only: compound statements nest statements, never inside expressions
        node = pending.pop()
        if not isinstance(node, _COMPOUND) or node.end_lineno is None:
            continue
        blocks.add((node.lineno - 1, node.end_lineno))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            blocks.add((node.body[0].lineno - 1, node.end_lineno))
        for name in ("body", "orelse", "finalbody"):
            pending.extend(getattr(node, name, ()))
        for part in [*getattr(node, "handlers", ()), *getattr(node, "cases", ())]:
            pending.extend(part.body)
    return tuple(sorted(blocks))


def hunk_candidates(
    row: int,
    file: str,
    edit_type: str,
    lines: tuple[DiffLine, ...],
    unit_base: int,
    window_sizes: tuple[int, ...],
    blocks: Callable[[], tuple[tuple[int, int], ...]] | None,
    max_hunk_lines: int,
    stats: Counter,
) -> tuple[list[Candidate], int]:
    """Candidates of one hunk side; returns them and the number of line units they use (ids from unit_base).

    blocks: returns the file's AST block line ranges; called only when a block could add a candidate (the side
    has >= 2 lines), because parsing is the most expensive part of candidate generation.
    """
    kept = [(d, norm) for d in lines if (norm := normalize_line(d.text))]
    n = len(kept)
    if n == 0:
        return [], 0
    if n > max_hunk_lines:
        stats["hunks_over_cap"] += 1
        return [], 0
    ranges: dict[tuple[int, int], str] = {(0, n): "hunk"}
    for w in window_sizes:
        if w >= n:
            continue
        stride = max(1, w // 2)
        for i in list(range(0, n - w + 1, stride)) + [n - w]:
            ranges.setdefault((i, i + w), f"win{w}")
    if blocks is not None and n >= 2:
        line_nos = [d.line_no for d, _ in kept]
        for lo, hi in blocks():
            i, j = bisect.bisect_left(line_nos, lo), bisect.bisect_left(line_nos, hi)
            if j > i:
                ranges.setdefault((i, j), "ast")
    out = []
    for (i, j), scale in ranges.items():
        part = kept[i:j]
        out.append(
            Candidate(
                row=row,
                file=file,
                edit_type=edit_type,
                scale=scale,
                unit_start=unit_base + i,
                unit_end=unit_base + j,
                line_start=part[0][0].line_no,
                line_end=part[-1][0].line_no + 1,
                text="\n".join(norm for _, norm in part),
                spans=tuple(d.span for d, _ in part if d.span is not None),
            )
        )
    return out, n
