"""Token projection from exact offsets, and placement into padded batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from pipeline.credit import CreditSettings, compute_credit, pad_token_batch
from pipeline.credit.projection import merge_intervals, token_max, token_runs

# Reference painters: the projection rule written the slow, obvious way (a value per character, then per
# token through `token_max`); no production code uses them.


def project_occurrences(
    starts: np.ndarray,
    ends: np.ndarray,
    n_chars: int,
    spans: Sequence[Sequence[tuple[int, int]]],
    values: Sequence[float],
    priorities: Sequence[float],
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token diff-level values of one response.

    starts, ends: [T] token char offsets; spans[k]: char spans of occurrence k; values[k]: its A^D;
    priorities[k]: its GS. Each token takes the value of the covering occurrence with the highest priority
    (ties: the later one in the given order).
    Returns (values [T] float64, 0 where uncovered; covered [T] bool).
    """
    rank = np.full(n_chars + 1, -1, np.int64)
    order = sorted(range(len(values)), key=lambda k: priorities[k])
    for r, k in enumerate(order):
        for s, e in spans[k]:
            rank[s:e] = r  # painted in ascending priority: a char keeps its highest-priority occurrence
    token_rank = token_max(rank, starts, ends, -1)
    covered = token_rank >= 0
    ordered_values = np.asarray([values[k] for k in order], np.float64)
    out = np.zeros(starts.shape[0], np.float64)
    out[covered] = ordered_values[token_rank[covered]]
    return out, covered


def tokens_touching(
    starts: np.ndarray, ends: np.ndarray, n_chars: int, spans: Sequence[tuple[int, int]]
) -> np.ndarray:
    """[T] bool: tokens sharing at least one character with any of the spans."""
    painted = np.zeros(n_chars + 1, np.int8)
    for s, e in spans:
        painted[s:e] = 1
    return token_max(painted, starts, ends, 0).astype(bool)


def test_highest_gs_occurrence_wins_and_nothing_leaks():
    #          tokens: [0,3) [3,6) [6,9) [9,12) [12,12) (empty, e.g. a special token)
    starts = np.array([0, 3, 6, 9, 12])
    ends = np.array([3, 6, 9, 12, 12])
    values, covered = project_occurrences(
        starts, ends, 12, spans=[[(2, 7)], [(5, 6)]], values=[1.0, -2.0], priorities=[0.1, 0.5]
    )
    # token 0 touches char 2 (occ 0); token 1 touches chars 3..5 (occ 0) and 5 (occ 1, higher GS);
    # token 2 touches char 6 (occ 0); tokens 3 and 4 touch nothing.
    np.testing.assert_array_equal(values, [1.0, -2.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(covered, [True, True, True, False, False])


def test_empty_tokens_never_receive_diff_credit():
    starts, ends = np.array([0, 0, 4, 4]), np.array([0, 4, 4, 8])
    values, covered = project_occurrences(starts, ends, 8, [[(0, 8)]], [3.0], [0.2])
    np.testing.assert_array_equal(covered, [False, True, False, True])
    np.testing.assert_array_equal(tokens_touching(starts, ends, 8, [(0, 8)]), [False, True, False, True])


@pytest.mark.parametrize("side", ["left", "right"])
def test_pad_token_batch_puts_values_on_real_tokens_only(side):
    rows = [np.array([1.0, 2.0, 3.0]), np.array([-1.0]), np.array([])]
    values, mask = pad_token_batch(rows, side=side, length=5)
    assert values.shape == mask.shape == (3, 5)
    for b, row in enumerate(rows):
        real = mask[b].astype(bool)
        assert real.sum() == len(row)
        np.testing.assert_array_equal(values[b][real], row)
        assert np.all(values[b][~real] == 0.0)
        positions = np.flatnonzero(real)
        if len(row):
            assert (positions[0] == 0) if side == "right" else (positions[-1] == 4)
    with pytest.raises(ValueError, match="shorter"):
        pad_token_batch(rows, length=2)
    with pytest.raises(ValueError, match="side"):
        pad_token_batch(rows, side="middle")


def _with_offsets(step, starts, ends, mask=None):
    from dataclasses import replace

    return replace(step, token_char_starts=starts, token_char_ends=ends, loss_mask=mask)


@pytest.mark.parametrize("estimator", ["didpo", "didpo_did"])
@pytest.mark.parametrize("pad_left,pad_right", [(0, 0), (5, 0), (0, 7), (3, 4)])
def test_padded_offsets_give_the_same_token_values(same_function_batch, pad_left, pad_right, estimator):
    """Offsets of a padded encoding (pad tokens cover no character, mask 0) change nothing but add zeros."""
    settings = CreditSettings(estimator=estimator)
    plain = compute_credit(same_function_batch, settings)
    padded_steps = []
    for step in same_function_batch:
        n = step.n_tokens
        starts = np.concatenate([np.zeros(pad_left), step.token_char_starts, np.zeros(pad_right)]).astype(int)
        ends = np.concatenate([np.zeros(pad_left), step.token_char_ends, np.zeros(pad_right)]).astype(int)
        mask = np.concatenate([np.zeros(pad_left), np.ones(n), np.zeros(pad_right)])
        padded_steps.append(_with_offsets(step, starts, ends, mask))
    padded = compute_credit(padded_steps, settings)
    for step in same_function_batch:
        got = padded.token_advantages(step.row_id)
        assert np.all(got[:pad_left] == 0.0) and np.all(got[len(got) - pad_right :] == 0.0)
        np.testing.assert_array_equal(
            got[pad_left : len(got) - pad_right], plain.token_advantages(step.row_id)
        )


@pytest.mark.parametrize("estimator", ["didpo", "didpo_did"])
def test_truncated_response_keeps_exact_tokens(same_function_batch, estimator):
    """A response cut after k tokens: the first k token values are those of the full response."""
    settings = CreditSettings(estimator=estimator)
    full = compute_credit(same_function_batch, settings)
    k = 60
    cut = [_with_offsets(s, s.token_char_starts[:k], s.token_char_ends[:k]) for s in same_function_batch]
    truncated = compute_credit(cut, settings)
    for step in same_function_batch:
        np.testing.assert_array_equal(
            truncated.token_advantages(step.row_id), full.token_advantages(step.row_id)[:k]
        )


@pytest.mark.parametrize("side", ["left", "right"])
def test_batch_padding_keeps_diff_credit_on_the_changed_tokens(same_function_batch, side, function_src):
    """The diff-level term sits on the function's tokens in a padded [B, T] batch, never on padding."""
    result = compute_credit(same_function_batch, CreditSettings(estimator="didpo"))
    rows = [result.token_advantages(s.row_id) for s in same_function_batch]
    episode = [a.episode_advantage for a in result.advantages]
    values, mask = pad_token_batch(rows, side=side, length=max(len(r) for r in rows) + 9)
    for b, step in enumerate(same_function_batch):
        real = np.flatnonzero(mask[b])
        assert np.all(values[b][mask[b] == 0] == 0.0)
        diff_term = values[b][real] - episode[b]
        lo = step.response_text.index(function_src)
        hi = lo + len(function_src)
        touched = (step.token_char_starts < hi) & (step.token_char_ends > lo)
        assert np.all(diff_term[~touched] == 0.0)
        assert np.all(
            np.abs(diff_term[touched & (step.token_char_ends > step.token_char_starts)]) <= 0.5 + 1e-6
        )
        assert np.count_nonzero(diff_term) > 50


def test_lambda_zero_puts_no_diff_term_anywhere(same_function_batch):
    result = compute_credit(same_function_batch, CreditSettings(lam=0.0))
    for step, row in zip(same_function_batch, result.advantages, strict=True):
        np.testing.assert_array_equal(result.token_advantages(step.row_id), row.episode_advantage)
    assert [a.n_diff_tokens for a in result.advantages] == [0, 0, 0, 0]


def test_token_runs_are_exactly_the_tokens_touching_the_spans():
    # tokens: [0,3) [3,3) [3,6) [6,8) [8,8) [8,12) [12,13); owners 0 and 1, a gap between owner 0's spans
    starts = np.array([0, 3, 3, 6, 8, 8, 12])
    ends = np.array([3, 3, 6, 8, 8, 12, 13])
    owner, first, end = token_runs(
        starts, ends, np.array([0, 0, 1, 1]), np.array([1, 9, 2, 7]), np.array([2, 10, 4, 9])
    )
    # owner 0: tokens {0} and {5}; owner 1: [2,4) and [6,9) touch tokens 0, 2 (not the empty 1), 3, 5
    assert list(zip(owner.tolist(), first.tolist(), end.tolist(), strict=True)) == [
        (0, 0, 1), (0, 5, 6), (1, 0, 1), (1, 2, 4), (1, 5, 6)
    ]
    n_chars = 13
    for k, spans in enumerate([[(1, 2), (9, 10)], [(2, 4), (7, 9)]]):
        touching = tokens_touching(starts, ends, n_chars, spans)
        mine = np.zeros(len(starts), bool)
        for o, s, e in zip(owner, first, end, strict=True):
            mine[s:e] |= o == k
        np.testing.assert_array_equal(mine, touching)
    swapped = [1, 0, 2, 3, 4, 6, 5]  # offsets out of order take the slow path, same answer
    owner, first, end = token_runs(starts[swapped], ends[swapped], np.array([1, 1]), np.array([2, 7]),
                                   np.array([4, 9]))
    assert list(zip(first.tolist(), end.tolist(), strict=True)) == [(1, 4), (6, 7)]


def test_merge_intervals_joins_overlapping_and_abutting_ranges_per_owner():
    owner, lo, hi = merge_intervals(
        np.array([1, 0, 0, 0, 1, 0]), np.array([5, 4, 0, 2, 0, 9]), np.array([6, 6, 2, 3, 5, 9])
    )
    assert list(zip(owner.tolist(), lo.tolist(), hi.tolist(), strict=True)) == [(0, 0, 3), (0, 4, 6), (1, 0, 6)]
