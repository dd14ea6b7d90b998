"""Hand-computed answers of the credit stage and of every registered estimator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.credit import ESTIMATORS, CreditSettings, compute_credit, groupability
from pipeline.credit_io import result_columns


def _function_token_mask(step, FUNCTION) -> np.ndarray:
    """Tokens sharing a character with a non-blank line of FUNCTION as written in the response."""
    base = step.response_text.index(FUNCTION)
    painted = np.zeros(len(step.response_text), bool)
    pos = base
    for line in FUNCTION.splitlines(keepends=True):
        if line.strip():
            painted[pos : pos + len(line.rstrip("\n"))] = True
        pos += len(line)
    return np.array(
        [painted[s:e].any() for s, e in zip(step.token_char_starts, step.token_char_ends, strict=True)]
    )


def test_same_function_four_rollouts(same_function_batch, function_src):
    result = compute_credit(same_function_batch, CreditSettings(estimator="didpo", lam=1.0, adv_norm="mean_norm"))
    assert result.diagnostics.n_anchors == 1
    for step, sign in zip(same_function_batch, [1, 1, -1, -1], strict=True):
        adv = result.token_advantages(step.row_id)
        in_function = _function_token_mask(step, function_src)
        assert in_function.sum() > 50 and (~in_function).sum() > 20
        np.testing.assert_allclose(adv[in_function], sign * 1.0)
        np.testing.assert_allclose(adv[~in_function], sign * 0.5)


def test_lambda_scales_only_the_diff_term(same_function_batch, function_src):
    result = compute_credit(same_function_batch, CreditSettings(estimator="didpo", lam=0.5))
    adv = result.token_advantages("r2")
    in_function = _function_token_mask(same_function_batch[2], function_src)
    np.testing.assert_allclose(adv[in_function], -0.75)
    np.testing.assert_allclose(adv[~in_function], -0.5)


def test_groupability_known_values():
    assert round(groupability(8, 8), 4) == 0.3686
    assert groupability(8, 1) == 0.0
    assert groupability(100, 0) == 0.0
    for form in ("product", "log", "linear", "additive"):
        assert groupability(5, 1, form=form) == 0.0
        assert groupability(16, 9, form=form) > groupability(4, 9, form=form) > 0.0
    assert groupability(8, 9, form="linear") == 1.0
    assert groupability(8, 9, form="additive") == pytest.approx(1 - math.exp(-1))


def _single_step_batch(build_step, rewards_by_task: dict[str, list[float]]):
    steps = []
    for task, rewards in rewards_by_task.items():
        for k, reward in enumerate(rewards):
            step, _ = build_step(f"{task}-r{k}", f"{task}-t{k}", task, 0, reward, {"a.py": "x = 1\n"}, [])
            steps.append(step)
    return steps


# Task A returns [3, 1, 2] (mean 2, population std sqrt(2/3)); task B returns [4, 0] (mean 2, std 2).
_EPISODE = {"demo/A": [3.0, 1.0, 2.0], "demo/B": [4.0, 0.0]}
_S = math.sqrt(2 / 3)
_EXPECTED = {
    "dr_grpo": [1.0, -1.0, 0.0, 2.0, -2.0],
    "grpo": [1 / (_S + 1e-6), -1 / (_S + 1e-6), 0.0, 2 / (2 + 1e-6), -2 / (2 + 1e-6)],
    "rloo": [1.5, -1.5, 0.0, 4.0, -4.0],  # |G|/(|G|-1) * (R - mean)
    # centred [1, -1, 0, 2, -2] whitened over the batch: std sqrt(2)
    "reinforce_pp_baseline": [x / (math.sqrt(2) + 1e-6) for x in (1.0, -1.0, 0.0, 2.0, -2.0)],
    "didpo": [1.0, -1.0, 0.0, 2.0, -2.0],  # no edits, no anchors: the episode term only
    "didpo_did": [1.0, -1.0, 0.0, 2.0, -2.0],  # no anchors, no changed tokens: the episode term only
    "gigpo": [1.0, -1.0, 0.0, 2.0, -2.0],  # every state seen once: A^S = 0
    "didpo_flipped": [1.0, -1.0, 0.0, 2.0, -2.0],  # no anchors: nothing to flip
}


@pytest.mark.parametrize("name", sorted(_EXPECTED))
def test_episode_level_estimators_by_hand(name, make_step):
    steps = _single_step_batch(make_step, _EPISODE)
    result = compute_credit(steps, CreditSettings(estimator=name, gamma=1.0))
    for step, expected in zip(steps, _EXPECTED[name], strict=True):
        adv = result.token_advantages(step.row_id)
        assert adv.shape == (step.n_tokens,)
        np.testing.assert_allclose(adv, expected, rtol=1e-9, atol=1e-12)


def test_every_registered_estimator_has_a_hand_computed_case():
    assert set(ESTIMATORS) <= set(_EXPECTED)


def test_gigpo_identical_workspace_groups(make_step):
    build_step = make_step
    # Two 2-turn trajectories; gamma 0.5. c0 rewards [0, 1] -> R_t [0.5, 1]; c1 rewards [0, 0] -> [0, 0].
    # A^E (mean_norm) = [+0.25, -0.25]. Turn 0 shares workspace "h0": A^S = [+0.25, -0.25];
    # turn 1 states differ ("h1", "h2"): A^S = 0.
    spec = [("c0", [0.0, 1.0], ["h0", "h1"]), ("c1", [0.0, 0.0], ["h0", "h2"])]
    steps = []
    for traj, rewards, hashes in spec:
        for turn, (reward, h) in enumerate(zip(rewards, hashes, strict=True)):
            step, _ = build_step(f"{traj}-{turn}", traj, "demo/C", turn, reward, {}, [], workspace_hash=h)
            steps.append(step)
    result = compute_credit(steps, CreditSettings(estimator="gigpo", gamma=0.5))
    expected = {"c0-0": 0.5, "c0-1": 0.25, "c1-0": -0.5, "c1-1": -0.25}
    for row_id, value in expected.items():
        np.testing.assert_allclose(result.token_advantages(row_id), value)


def test_returns_are_discounted_per_trajectory(make_step):
    build_step = make_step
    # rewards [1, 0, 2], gamma 0.5: R = [1 + 0.5 * (0 + 0.5 * 2), 0 + 0.5 * 2, 2] = [1.5, 1, 2]
    # the other trajectory returns 0.5, so A^E (mean_norm) of the first is (1.5 - 0.5) / 2 = 0.5
    steps = [build_step(f"a{t}", "a", "demo/D", t, r, {}, [])[0] for t, r in enumerate([1.0, 0.0, 2.0])]
    steps.append(build_step("b0", "b", "demo/D", 0, 0.5, {}, [])[0])
    result = compute_credit(steps, CreditSettings(estimator="dr_grpo", gamma=0.5))
    episode = {a.step.row_id: a.episode_advantage for a in result.advantages}
    assert episode["a0"] == pytest.approx(0.5) and episode["a2"] == pytest.approx(0.5)
    assert episode["b0"] == pytest.approx(-0.5)


def test_diff_advantage_uses_return_to_go_of_the_row(make_step):
    build_step = make_step
    # Two trajectories make the same fix at turn 1; their R_1 differ: 1.0 vs 0.0 (gamma 1).
    fix_old, fix_new = "    return a - b\n", "    return a + b\n"
    base = {"m.py": "def add(a, b):\n" + fix_old + "\n\ndef other():\n    return 0\n"}
    steps = []
    for traj, final in (("p", 1.0), ("q", 0.0)):
        steps.append(build_step(f"{traj}0", traj, "demo/E", 0, 0.0, base, [])[0])
        steps.append(
            build_step(f"{traj}1", traj, "demo/E", 1, final, base, [("replace", "m.py", fix_old, fix_new)])[0]
        )
    result = compute_credit(steps, CreditSettings(estimator="didpo", gamma=1.0, window_sizes=()))
    members = result_columns(result, "anchor_members")
    values = dict(zip(members["row_id"], members["diff_advantage"], strict=True))
    assert values == {"p1": pytest.approx(0.5), "q1": pytest.approx(-0.5)}
    assert len(set(members["anchor_id"])) == 2  # the deleted line and the added line


def test_the_control_reverses_exactly_the_diff_level_term(make_step):
    # the batch above: one shared fix, R_1 1.0 vs 0.0, so the fix's tokens get A^D = +0.5 in p and -0.5 in q
    fix_old, fix_new = "    return a - b\n", "    return a + b\n"
    base = {"m.py": "def add(a, b):\n" + fix_old + "\n\ndef other():\n    return 0\n"}
    steps = []
    for traj, final in (("p", 1.0), ("q", 0.0)):
        steps.append(make_step(f"{traj}0", traj, "demo/E", 0, 0.0, base, [])[0])
        steps.append(make_step(f"{traj}1", traj, "demo/E", 1, final, base, [("replace", "m.py", fix_old, fix_new)])[0])
    run = {name: compute_credit(steps, CreditSettings(estimator=name, gamma=1.0, window_sizes=()))
           for name in ("didpo", "didpo_flipped")}
    for step in steps:
        episode = {a.step.row_id: a.episode_advantage for a in run["didpo"].advantages}[step.row_id]
        paper, control = (run[name].token_advantages(step.row_id) for name in ("didpo", "didpo_flipped"))
        np.testing.assert_allclose(control - episode, -(paper - episode), atol=1e-12)  # A^D negated, A^E kept
    fixed = run["didpo"].token_advantages("p1") - run["didpo_flipped"].token_advantages("p1")
    assert fixed.max() == pytest.approx(2 * 0.5)  # the fix's tokens in p: +0.5 under didpo, -0.5 under the control
