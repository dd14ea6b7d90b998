"""Invariants of compute_credit on random batches of multi-edit, multi-turn rollouts (hypothesis)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.credit import CreditSettings, assign_advantages, compute_credit, credit_units
from pipeline.credit_io import result_columns

SNIPPETS = [
    (
        "    total = 0\n    for x in items:\n        total += x\n    return total\n",
        [
            "    total = 0\n    for item in items:\n        total += item\n    return total\n",
            "    total = 0\n    for x in items:\n        total -= x\n    return total\n",
            "    return sum(items)\n",
            "    total = 0  # running sum\n    for x in items:\n        total += x\n\n    return total\n",
        ],
    ),
    (
        "    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        [
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
            "    if n <= 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return b\n",
            "    if n < 2:\n        return 1\n    return fib(n - 1) + fib(n - 2)\n",
        ],
    ),
    (
        "    words = text.split()\n    return ' '.join(reversed(words))\n",
        [
            "    words = text.split(' ')\n    return ' '.join(words[::-1])\n",
            "    return ' '.join(text.split()[::-1])\n",
            "    words = text.split()\n    return ' # '.join(reversed(words))\n",
            "    parts = text.split()\n    return ' '.join(reversed(parts))\n",
        ],
    ),
]
BASE = (
    "def total(items):\n"
    + SNIPPETS[0][0]
    + "\n\ndef fib(n):\n"
    + SNIPPETS[1][0]
    + "\n\ndef flip(text):\n"
    + SNIPPETS[2][0]
)


@st.composite
def batches(draw):
    plan = []
    for task in range(draw(st.integers(1, 2))):
        for g in range(draw(st.integers(1, 4))):
            for turn in range(draw(st.integers(1, 3))):
                edits = draw(
                    st.lists(
                        st.tuples(st.integers(0, 2), st.integers(0, 3)), max_size=3, unique_by=lambda e: e[0]
                    )
                )
                reward = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
                plan.append((f"task/{task}", f"traj{task}-{g}", turn, reward, edits))
    return plan


def build(plan, make_step):
    steps = []
    for task, traj, turn, reward, edits in plan:
        path = f"f{turn}.py"
        ops = [("replace", path, SNIPPETS[s][0], SNIPPETS[s][1][v]) for s, v in edits]
        steps.append(make_step(f"{traj}/{turn}", traj, task, turn, reward, {path: BASE}, ops, think=traj)[0])
    return steps


def _span_mask(step, spans):
    painted = np.zeros(len(step.response_text) + 1, bool)
    for s, e in spans:
        painted[s:e] = True
    return np.array(
        [painted[s:e].any() for s, e in zip(step.token_char_starts, step.token_char_ends, strict=True)], bool
    )


COMMON = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@COMMON
@given(plan=batches())
def test_invariants(plan, make_step):
    steps = build(plan, make_step)
    result = compute_credit(steps, CreditSettings(estimator="didpo", gamma=0.9))
    adv = result_columns(result, "advantages")
    # A^E sums to zero over the trajectories of each task group (one value per trajectory).
    per_traj = {}
    for traj, task, value in zip(adv["traj_id"], adv["task_id"], adv["episode_advantage"], strict=True):
        per_traj[traj] = (task, value)
    sums = defaultdict(float)
    for task, value in per_traj.values():
        sums[task] += value
    assert all(abs(s) < 1e-9 for s in sums.values())
    # A^D sums to zero over each anchor's rows (an occurrence per row, or several sharing the row's value);
    # every anchor has n >= 2 distinct rows.
    members = result_columns(result, "anchor_members")
    by_anchor = defaultdict(list)
    for anchor_id, row_id, value in zip(
        members["anchor_id"], members["row_id"], members["diff_advantage"], strict=True
    ):
        by_anchor[anchor_id].append((row_id, value))
    for occurrences in by_anchor.values():
        per_row = dict(occurrences)
        assert len(per_row) == len(set(occurrences)) >= 2  # one value per row
        assert abs(sum(per_row.values())) < 1e-9
    assert all(n >= 2 for n in result_columns(result, "anchors")["n_rows"])
    # Anchors never overlap within one diff (same row, file and edit type).
    sub = result_columns(result, "subdiffs")
    index = {sid: i for i, sid in enumerate(sub.get("subdiff_id", []))}
    lines = defaultdict(list)
    for sid in members.get("subdiff_id", []):
        i = index[sid]
        lines[(sub["row_id"][i], sub["file"][i], sub["edit_type"][i])].append(
            (sub["line_start"][i], sub["line_end"][i])
        )
    for spans in lines.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    # No token outside the characters of the row's anchor occurrences gets a diff-level term.
    member_spans = defaultdict(list)
    for sid in members.get("subdiff_id", []):
        i = index[sid]
        member_spans[sub["row_id"][i]].append((sub["char_start"][i], sub["char_end"][i]))
    for step in steps:
        i = adv["row_id"].index(step.row_id)
        diff_term = np.asarray(adv["token_advantages"][i]) - adv["episode_advantage"][i]
        outside = ~_span_mask(step, member_spans.get(step.row_id, []))
        assert np.all(diff_term[outside] == 0.0)


@pytest.mark.parametrize("estimator", ["didpo", "didpo_did"])
@COMMON
@given(plan=batches(), seed=st.randoms(use_true_random=False))
def test_rollout_order_does_not_matter(plan, seed, make_step, estimator):
    steps = build(plan, make_step)
    shuffled = list(steps)
    seed.shuffle(shuffled)
    settings = CreditSettings(estimator=estimator)
    a, b = compute_credit(steps, settings), compute_credit(shuffled, settings)
    for table in ("anchors", "anchor_members"):
        assert result_columns(a, table) == result_columns(b, table)
    for row in a.advantages:
        np.testing.assert_array_equal(a.token_advantages(row.step.row_id), b.token_advantages(row.step.row_id))


@COMMON
@given(plan=batches(), norm=st.sampled_from(["mean_norm", "mean_std_norm"]))
def test_lambda_zero_is_the_episode_estimator(plan, norm, make_step):
    steps = build(plan, make_step)
    didpo = compute_credit(steps, CreditSettings(lam=0.0, adv_norm=norm))
    episode = compute_credit(steps, CreditSettings(estimator="dr_grpo" if norm == "mean_norm" else "grpo"))
    for a, b in zip(didpo.advantages, episode.advantages, strict=True):
        np.testing.assert_array_equal(a.token_advantages, b.token_advantages)
        assert a.episode_advantage == b.episode_advantage


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo", "reinforce_pp_baseline"])
def test_non_diff_estimators_report_no_diff_tokens(estimator, make_step):
    plan = [("task/0", f"t{g}", 0, float(g % 2), [(0, 0), (1, 0)]) for g in range(4)]
    settings = CreditSettings(estimator=estimator)
    result = assign_advantages(credit_units(build(plan, make_step), settings), settings)  # anchors computed
    assert result.diagnostics.n_anchors >= 1
    assert [a.n_diff_tokens for a in result.advantages] == [0, 0, 0, 0]
