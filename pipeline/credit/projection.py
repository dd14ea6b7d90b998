"""Token projection from exact character offsets (step 8 of `pipeline/credit/batch.py`), and placement into
padded batches.

Every token carries the character span [start, end) of the response it decodes to (the tokenizer's offset
mapping). A diff-level value lands on a token iff the token's span shares at least one character with a
span of the occurrence; a token covering no character (start == end: special and padding tokens) never
receives one. Nothing is stretched proportionally and nothing depends on how a batch is later padded:
padding happens after projection, in `pad_token_batch`, with a mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def token_max(char_values: np.ndarray, starts: np.ndarray, ends: np.ndarray, fill: int) -> np.ndarray:
    """[T] max of char_values over each token's [start, end) (fill for empty tokens).

    char_values: [n_chars + 1] (one trailing slot so every end index is valid for reduceat).
    """
    out = np.full(starts.shape[0], fill, dtype=char_values.dtype)
    nonempty = ends > starts
    if not nonempty.any():
        return out
    bounds = np.empty(2 * int(nonempty.sum()), np.int64)
    bounds[0::2], bounds[1::2] = starts[nonempty], ends[nonempty]
    out[nonempty] = np.maximum.reduceat(char_values, bounds)[0::2]
    return out


def merge_intervals(
    owner: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Union of half-open intervals per owner: overlapping or abutting [lo, hi) of one owner become one.

    owner, lo, hi: [K] int (empty intervals, hi <= lo, are dropped). Returns (owner, lo, hi) of the merged
    intervals, sorted by (owner, lo), without a Python loop.
    """
    owner, lo, hi = (np.asarray(a, np.int64) for a in (owner, lo, hi))
    keep = hi > lo
    owner, lo, hi = owner[keep], lo[keep], hi[keep]
    if owner.size == 0:
        return owner, lo, hi
    order = np.lexsort((lo, owner))
    owner, lo, hi = owner[order], lo[order], hi[order]
    # Running max of hi within each owner: shifting owner k by k * span keeps owners apart in one accumulate.
    span = int(hi.max()) - int(lo.min()) + 1
    shift = (owner - owner[0]) * span - int(lo.min())
    reach = np.maximum.accumulate(hi + shift) - shift
    new = np.ones(owner.size, bool)
    new[1:] = (owner[1:] != owner[:-1]) | (lo[1:] > reach[:-1])
    starts = np.flatnonzero(new)
    return owner[starts], lo[starts], np.maximum.reduceat(hi, starts)


def token_runs(
    starts: np.ndarray,
    ends: np.ndarray,
    owner: np.ndarray,
    char_start: np.ndarray,
    char_end: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact token index ranges of character spans: the tokens that share a character with an owner's spans.

    starts, ends: [T] token char offsets (several rows may share one flat space); owner, char_start,
    char_end: [K] spans, each tagged with its owner (an occurrence). A token covering no character
    (start == end) is never included, so a range stops before it. Returns (owner, first, end) of the merged
    half-open token ranges, sorted by (owner, first).
    """
    owner, cs, ce = (np.asarray(a, np.int64) for a in (owner, char_start, char_end))
    nonempty = np.flatnonzero(ends > starts)
    s, e = starts[nonempty], ends[nonempty]
    if len(nonempty) and np.all(s[1:] >= s[:-1]) and np.all(e[1:] >= e[:-1]):
        lo = np.searchsorted(e, cs, side="right")  # first non-empty token ending after the span starts
        hi = np.searchsorted(s, ce, side="left")  # non-empty tokens starting before the span ends
        hi = np.where(ce > cs, hi, lo)
    else:  # offsets out of order (rare): each touching token is its own range, merged below
        hits = [(k, j) for k in range(cs.size) for j in np.flatnonzero((s < ce[k]) & (e > cs[k]))]
        owner = np.array([owner[k] for k, _ in hits], np.int64)
        lo = np.array([j for _, j in hits], np.int64)
        hi = lo + 1
    run_owner, run_lo, run_hi = merge_intervals(owner, lo, hi)  # in non-empty-token index space
    if run_lo.size == 0:
        return run_owner, run_lo, run_hi
    first, last = nonempty[run_lo], nonempty[run_hi - 1]
    gappy = np.flatnonzero(last - first != run_hi - 1 - run_lo)  # an empty token sits inside the range
    if gappy.size == 0:
        return run_owner, first, last + 1
    pieces = []
    for k in range(run_lo.size):  # split only where an empty token interrupts a range
        index = nonempty[run_lo[k] : run_hi[k]]
        cut = np.flatnonzero(np.diff(index) > 1) + 1
        for part in np.split(index, cut):
            pieces.append((run_owner[k], part[0], part[-1] + 1))
    out = np.array(pieces, np.int64).reshape(-1, 3)
    return out[:, 0], out[:, 1], out[:, 2]


def pad_token_batch(
    rows: Sequence[np.ndarray], side: str = "right", length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Place per-row token values into a padded batch.

    rows: B arrays [T_i] (one value per response token, already masked); side: "right" (values first, then
    padding) or "left" (padding first); length: T >= max T_i (default max T_i).
    Returns (values [B, T] float32 with 0 on padding, mask [B, T] int8 with 1 exactly on real tokens).
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    longest = max((len(r) for r in rows), default=0)
    width = longest if length is None else length
    if width < longest:
        raise ValueError(f"length={length} is shorter than the longest row ({longest} tokens)")
    values = np.zeros((len(rows), width), np.float32)
    mask = np.zeros((len(rows), width), np.int8)
    for b, row in enumerate(rows):
        n = len(row)
        lo = 0 if side == "right" else width - n
        values[b, lo : lo + n] = row
        mask[b, lo : lo + n] = 1
    return values, mask
