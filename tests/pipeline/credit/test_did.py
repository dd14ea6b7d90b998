"""didpo_did: known-answer effects, the closed-form solution, options, and what it leaves unchanged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.credit import CreditSettings, compute_credit, fit_effects
from pipeline.credit.inputs import CreditInputError

# A file with a bug on line 2 and a good line far below it (unchanged lines between keep hunks apart).
BUGGY = "def f(xs):\n    total = 1\n    a = 0\n    b = 0\n    c = 0\n    return total + len(xs) * 2\n"
FIX = ("    total = 1\n", "    total = 0\n")
MUT = ("    return total + len(xs) * 2\n", "    return total - len(xs) * 2\n")
EFFECT = {"F": 0.4, "M": -0.3}  # true change in visible pass fraction each edit causes
START = 0.3  # visible pass fraction of BUGGY: unknown to the estimator, common to every rollout
# Per trajectory, per turn: which of F, M the action applies ("N<k>": a unique comment edit, no anchor).
PLAN = {
    "a": [("F", "M"), ("N1",)],
    "b": [("F",), ("M",)],
    "c": [("M",), ("F",)],
    "d": [("N2",), ("F", "M")],
    "e": [("M",), ("N3",)],
    "f": [("N4",), ("F",)],
}


def _edit(name: str, files: dict[str, str]) -> tuple[str, str, str, str]:
    if name == "F":
        return ("replace", "solution.py", *FIX)
    if name == "M":
        return ("replace", "solution.py", *MUT)
    return ("replace", "solution.py", "    a = 0\n", f"    a = len('{name}' * {name[1:]})  # note\n")


def _known_batch(make_step, coef: float = 0.2):
    """Steps of one task whose step improvements are exactly the sum of the applied edits' effects."""
    steps = []
    for traj, turns in PLAN.items():
        files = {"solution.py": BUGGY}
        level = START
        for turn, names in enumerate(turns):
            edits = [_edit(n, files) for n in names]
            level += sum(EFFECT.get(n, 0.0) for n in names)
            reward = coef * level + (1.0 if turn == len(turns) - 1 and level > 0.6 else 0.0)
            step, files = make_step(f"{traj}{turn}", traj, "demo/did", turn, reward, files, edits)
            steps.append(dataclasses.replace(step, visible_pass_fraction=level))
    return steps


def _mean_on(result, step, text: str) -> float:
    """Mean token advantage over the tokens of `text`'s first occurrence in the replace payload (the line's
    code only: its indentation and newline are not part of any anchor)."""
    text = text.strip()
    start = step.response_text.index(text, step.response_text.index("<replace>"))
    end = start + len(text)
    tokens = (step.token_char_starts < end) & (step.token_char_ends > start)
    return float(result.token_advantages(step.row_id)[tokens].mean())


def _effects(make_step, **options):
    """(effect of F, effect of M, episode advantage per row) read back from the token advantages, lam = 1."""
    steps = _known_batch(make_step)
    settings = CreditSettings(estimator="didpo_did", lam=1.0, **options)
    result = compute_credit(steps, settings)
    a_e = dict(zip(result.advantages["row_id"], result.advantages["episode_advantage"], strict=True))
    fx = [_mean_on(result, s, FIX[1]) - a_e[s.row_id] for s in steps if FIX[1] in s.response_text]
    mx = [_mean_on(result, s, MUT[1]) - a_e[s.row_id] for s in steps if MUT[1] in s.response_text]
    return fx, mx, steps, result


def _design(steps):
    """Independent closed form: rows' y, anchor indicators [F, M, N] and turn dummies, in input order.
    N: the deletion of "a = 0" that every note edit makes (4 rows: an anchor of its own)."""
    y, d, turn = [], [], []
    prev: dict[str, float] = {}
    for s in steps:
        y.append(s.visible_pass_fraction - prev.get(s.traj_id, 0.0))
        prev[s.traj_id] = s.visible_pass_fraction
        d.append([FIX[1] in s.response_text, MUT[1] in s.response_text, "a = len(" in s.response_text])
        turn.append([s.turn == 0, s.turn == 1])
    return np.array(y), np.array(d, float), np.array(turn, float)


def test_known_effects_recovered_exactly_without_ridge(make_step):
    fx, mx, _, _ = _effects(make_step, did_ridge=0.0)
    np.testing.assert_allclose(fx, EFFECT["F"], atol=1e-9)
    np.testing.assert_allclose(mx, EFFECT["M"], atol=1e-9)


@pytest.mark.parametrize("ridge", [0.0, 0.5, 3.0])
def test_effects_equal_the_closed_form_ridge_solution(make_step, ridge):
    fx, mx, steps, _ = _effects(make_step, did_ridge=ridge)
    y, d, turn = _design(steps)
    # Frisch-Waugh: project the turn fixed effects out, then ridge on the residualized indicators.
    annihilator = np.eye(len(y)) - turn @ np.linalg.pinv(turn)
    dt, yt = annihilator @ d, annihilator @ y
    expected = np.linalg.pinv(dt.T @ dt + ridge * np.eye(3)) @ dt.T @ yt
    assert expected[0] > 0 > expected[1]
    np.testing.assert_allclose(fx, expected[0], atol=1e-9)
    np.testing.assert_allclose(mx, expected[1], atol=1e-9)


def test_fix_outranks_mutation_in_the_same_action(make_step):
    """Rows a0 and d1 apply F and M together; with the default ridge F's tokens still get more credit."""
    steps = _known_batch(make_step)
    did = compute_credit(steps, CreditSettings(estimator="didpo_did"))
    both = [s for s in steps if FIX[1] in s.response_text and MUT[1] in s.response_text]
    assert len(both) == 2
    for s in both:
        assert _mean_on(did, s, FIX[1]) > _mean_on(did, s, MUT[1])


def test_lambda_zero_is_the_episode_estimator(make_step):
    steps = _known_batch(make_step)
    did = compute_credit(steps, CreditSettings(estimator="didpo_did", lam=0.0))
    episode = compute_credit(steps, CreditSettings(estimator="dr_grpo"))
    for a, b in zip(did.advantages["token_advantages"], episode.advantages["token_advantages"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_unanchored_changes_episode_or_singleton(make_step):
    steps = _known_batch(make_step)
    note = [s for s in steps if "# note" in s.response_text]
    plain = compute_credit(steps, CreditSettings(estimator="didpo_did", did_unanchored="episode"))
    single = compute_credit(steps, CreditSettings(estimator="didpo_did", did_unanchored="singleton"))
    a_e = dict(zip(plain.advantages["row_id"], plain.advantages["episode_advantage"], strict=True))
    moved = 0
    for s in note:
        text = s.response_text[s.response_text.index("a = len(") : s.response_text.index("  # note")]
        assert _mean_on(plain, s, text) == pytest.approx(a_e[s.row_id])
        moved += abs(_mean_on(single, s, text) - a_e[s.row_id]) > 1e-9
    assert moved >= 1  # a note row whose step change the anchors and turn effects do not explain


def test_options_change_the_answer_but_keep_signs(make_step):
    for options in (
        {"did_granularity": "anchor"},
        {"did_controls": "turn_trajectory"},
        {"did_controls": "none"},
        {"did_shrink": True},
    ):
        fx, mx, _, _ = _effects(make_step, **options)
        assert min(fx) > 0 > max(mx), options


def test_falls_back_to_step_rewards_without_visible_fractions(make_step):
    steps = [dataclasses.replace(s, visible_pass_fraction=None) for s in _known_batch(make_step)]
    result = compute_credit(steps, CreditSettings(estimator="didpo_did", did_ridge=0.0))
    f_adv = [_mean_on(result, s, FIX[1]) for s in steps if FIX[1] in s.response_text]
    assert np.isfinite(f_adv).all()


def test_fit_effects_standard_errors_shrink_with_data():
    rng = np.random.default_rng(0)
    ses = []
    for n in (40, 400):
        design = rng.integers(0, 2, size=(n, 3)).astype(float)
        y = design @ np.array([0.5, -0.5, 0.0]) + 0.1 * rng.standard_normal(n)
        fit = fit_effects(y, design, np.ones((n, 1)), ridge=0.1)
        assert np.all(np.abs(fit.effect - [0.5, -0.5, 0.0]) < 5 * fit.se + 0.02)
        ses.append(fit.se)
    assert np.all(ses[1] < ses[0])


def test_bad_settings_and_inputs_are_refused(make_step):
    with pytest.raises(ValueError, match="did_ridge"):
        CreditSettings(estimator="didpo_did", did_ridge=-1.0)
    with pytest.raises(ValueError, match="did_outcome"):
        CreditSettings(estimator="didpo_did", did_outcome="bogus")
    step = _known_batch(make_step)[0]
    with pytest.raises(CreditInputError, match="visible_pass_fraction"):
        compute_credit([dataclasses.replace(step, visible_pass_fraction=1.5)])
