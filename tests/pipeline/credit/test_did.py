"""didpo_did: known-answer effects of line units, the closed-form solution, undoing a change, options, the
outcome-only case, and what it leaves unchanged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.credit import CreditSettings, compute_credit, credit_units, fit_effects
from pipeline.credit.inputs import CreditInputError
from pipeline.credit.normalize import comparison_tokens, normalize_line

# A file with a bug on line 2 and a good line far below it (unchanged lines between keep hunks apart).
BUGGY = "def f(xs):\n    total = 1\n    a = 0\n    b = 0\n    c = 0\n    return total + len(xs) * 2\n"
FIX = ("    total = 1\n", "    total = 0\n")
MUT = ("    return total + len(xs) * 2\n", "    return total - len(xs) * 2\n")
EFFECT = {"F": 0.4, "M": -0.3, "U": 0.3}  # what each edit adds to the visible pass fraction (U undoes M)
START = 0.3  # visible pass fraction of BUGGY: unknown to the estimator, common to every rollout
# Per trajectory, per turn: which edits the action applies ("N<k>": a harmless rewrite of "a = 0", unique to
# its trajectory; "U": writes M's line back as it was).
PLAN = {
    "a": [("F", "M"), ("N1",)],
    "b": [("F",), ("M",)],
    "c": [("M",), ("F",)],
    "d": [("N2",), ("F", "M")],
    "e": [("M",), ("N3",)],
    "f": [("N4",), ("F",)],
    "g": [("M",), ("U",)],
}


def _edit(name: str, files: dict[str, str]) -> tuple[str, str, str, str]:
    if name == "F":
        return ("replace", "solution.py", *FIX)
    if name == "M":
        return ("replace", "solution.py", *MUT)
    if name == "U":
        return ("replace", "solution.py", MUT[1], MUT[0])
    return ("replace", "solution.py", "    a = 0\n", f"    a = len('{name}' * {name[1:]})  # note\n")


def _known_batch(make_step, coef: float = 0.2):
    """Steps of one task whose visible pass fraction is exactly START plus the effects of the edits the
    workspace holds (additive in its lines)."""
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
    code only: its indentation and newline are not part of the change's tokens)."""
    text = text.strip()
    start = step.response_text.index(text, step.response_text.index("<replace>"))
    end = start + len(text)
    tokens = (step.token_char_starts < end) & (step.token_char_ends > start)
    return float(result.token_advantages(step.row_id)[tokens].mean())


def _scale(result, y: np.ndarray, settings) -> float:
    """What turns an effect on y into A^E's units: std of the returns (mean_norm) over the std of y."""
    # A^E = R - mean R under mean_norm, one value per trajectory: its spread is the returns'
    a_e = {a.step.traj_id: a.episode_advantage for a in result.advantages}
    spread = 1.0 if settings.adv_norm == "mean_std_norm" else float(np.std(list(a_e.values())))
    return spread / (float(y.std()) + settings.std_eps)


def _effects(make_step, **options):
    """(credit on F's line, on M's line, on U's line, steps, result, scale) with lam = 1, the credit read back
    from the token advantages (minus A^E)."""
    steps = _known_batch(make_step)
    settings = CreditSettings(estimator="didpo_did", lam=1.0, **options)
    result = compute_credit(steps, settings)
    y = np.array([s.visible_pass_fraction for s in steps])
    a_e = {a.step.row_id: a.episode_advantage for a in result.advantages}

    def credit(text, name):
        return [_mean_on(result, s, text) - a_e[s.row_id] for s, names in _applied(steps) if name in names]

    return credit(FIX[1], "F"), credit(MUT[1], "M"), credit(MUT[0], "U"), steps, result, _scale(result, y, settings)


def _applied(steps):
    plan = [names for turns in PLAN.values() for names in turns]
    return list(zip(steps, plan, strict=True))


def _units(files: dict[str, str]) -> set[tuple[str, str]]:
    """Independent reading of the state: (kind, line) of every line added to or missing from BUGGY."""
    def lines(text):
        return {" ".join(comparison_tokens(n, False)) for line in text.splitlines() if (n := normalize_line(line))}
    start, now = lines(BUGGY), lines(files["solution.py"])
    return {("add", x) for x in now - start} | {("del", x) for x in start - now}


def test_known_effects_recovered_exactly_without_ridge(make_step):
    fx, mx, ux, _, _, scale = _effects(make_step, did_ridge=0.0)
    np.testing.assert_allclose(fx, EFFECT["F"] * scale, atol=1e-9)
    np.testing.assert_allclose(mx, EFFECT["M"] * scale, atol=1e-9)
    # Undoing M switches M's units off: the undo is credited with what removing the harm gained
    np.testing.assert_allclose(ux, EFFECT["U"] * scale, atol=1e-9)


@pytest.mark.parametrize("ridge", [0.0, 0.5, 3.0])
def test_effects_equal_the_closed_form_ridge_solution(make_step, ridge):
    fx, mx, _, steps, result, scale = _effects(make_step, did_ridge=ridge)
    states = [_units(s.files_after) for s in steps]
    units = sorted(set().union(*states))
    d = np.array([[u in state for u in units] for state in states], float)
    y = np.array([s.visible_pass_fraction for s in steps])
    # Frisch-Waugh: project the intercept out, then ridge on the centred indicators.
    dt, yt = d - d.mean(axis=0), y - y.mean()
    b = dict(zip(units, np.linalg.pinv(dt.T @ dt + ridge * np.eye(len(units))) @ dt.T @ yt, strict=True))
    fix = b[("add", "total = 0")] + b[("del", "total = 1")]  # the rewritten line switches both
    mut = b[("add", "return total - len ( xs ) * 2")] + b[("del", "return total + len ( xs ) * 2")]
    assert fix > 0 > mut
    np.testing.assert_allclose(fx, fix * scale, atol=1e-9)
    np.testing.assert_allclose(mx, mut * scale, atol=1e-9)


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
    for a, b in zip(did.advantages, episode.advantages, strict=True):
        np.testing.assert_allclose(a.token_advantages, b.token_advantages, atol=1e-12)


def test_a_change_that_switches_no_unit_keeps_the_episode_advantage(make_step):
    """Writing a line the workspace already has (here: a spacing-only rewrite is no change at all) moves no
    unit, so its tokens get A^E alone, and the table counts no diff-level token for it."""
    steps = _known_batch(make_step)
    step, _ = make_step("z0", "z", "demo/did", 0, 0.0, {"solution.py": BUGGY},
                        [("replace", "solution.py", "    c = 0\n", "    c  =  0\n")])
    steps.append(dataclasses.replace(step, visible_pass_fraction=START))
    result = compute_credit(steps, CreditSettings(estimator="didpo_did"))
    row = next(a for a in result.advantages if a.step.row_id == "z0")
    np.testing.assert_allclose(row.token_advantages, row.episode_advantage)
    assert row.n_diff_tokens == 0


def test_line_units_are_relative_to_the_start_and_cover_written_and_quoted_lines(make_step):
    steps = _known_batch(make_step)
    units = credit_units(steps, CreditSettings(estimator="didpo_did"))
    lines, row_of = units.batch.line_units, {s.row_id: r for r, s in enumerate(units.rows)}
    # 2 + 2 units for F and M, del "a = 0", one add per note; U brings back a start line: no unit of its own
    assert len(lines.unit_task) == 4 + 1 + 4
    assert not any(row == row_of["g1"] for row, _ in lines.present.tolist())  # back to the start: none present
    step = next(s for s in steps if s.row_id == "b0")
    covered = lines.token_change[row_of["b0"]] >= 0
    for text in ("total = 1", "total = 0"):  # the quoted (search) line and the written (replace) line
        at = step.response_text.index(text)
        tokens = (step.token_char_starts < at + len(text)) & (step.token_char_ends > at)
        assert covered[tokens].all(), text


def test_options_change_the_answer_but_keep_signs(make_step):
    for options in (
        {"did_controls": "turn"},
        {"did_shrink": True},
        {"did_outcome": "return"},
        {"adv_norm": "mean_std_norm"},
    ):
        fx, mx, ux, _, _, _ = _effects(make_step, **options)
        assert min(fx) > 0 > max(mx) and min(ux) > 0, options


def test_outcome_only_reads_the_final_workspaces(make_step):
    """Without visible pass fractions, each trajectory's final workspace is one observation of its return:
    the same as asking for did_outcome: return, and still F above M inside one action."""
    steps = [dataclasses.replace(s, visible_pass_fraction=None) for s in _known_batch(make_step)]
    blind = compute_credit(steps, CreditSettings(estimator="didpo_did"))
    asked = compute_credit(_known_batch(make_step), CreditSettings(estimator="didpo_did", did_outcome="return"))
    for a, b in zip(blind.advantages, asked.advantages, strict=True):
        np.testing.assert_allclose(a.token_advantages, b.token_advantages, atol=1e-12)
    for s in steps:
        if FIX[1] in s.response_text and MUT[1] in s.response_text:
            assert _mean_on(blind, s, FIX[1]) > _mean_on(blind, s, MUT[1])


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


def test_line_units_and_advantages_do_not_depend_on_the_string_hash_seed(make_step, tmp_path):
    """Two processes (two Dask workers, a rerun) hash strings with different seeds: the unit ids, and so the
    regression's column order and the advantages' bytes, must not follow set iteration order."""
    import hashlib
    import os
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    batch = tmp_path / "steps.pkl"
    batch.write_bytes(pickle.dumps(_known_batch(make_step)))
    script = (
        "import hashlib, pickle, sys\n"
        "from pipeline.credit import CreditSettings, compute_credit\n"
        "steps = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "result = compute_credit(steps, CreditSettings(estimator='didpo_did'))\n"
        "h = hashlib.sha256()\n"
        "for a in result.advantages:\n"
        "    h.update(a.token_advantages.tobytes()); h.update(repr(a.episode_advantage).encode())\n"
        "print(h.hexdigest())\n"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        run = subprocess.run([sys.executable, "-c", script, str(batch)], env=env, capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[3], check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        outputs.add(run.stdout.strip())
    assert len(outputs) == 1, outputs
    assert len(next(iter(outputs))) == len(hashlib.sha256().hexdigest())


# A program that holds one line twice: the start lost the assignment of the second copy (a bug), and a harm
# drops the assignment of the first. A fix and the harm in one action leave the file's *set* of lines as it
# was; only the lines' places tell them apart.
TWICE = "def g(x):\n    r = 0\n    r = r + x\n    q = 5\n    r + x\n    return r + q\n"
TWICE_FIX = ("    q = 5\n    r + x\n", "    q = 5\n    r = r + x\n")
TWICE_HARM = ("    r = 0\n    r = r + x\n", "    r = 0\n    r + x\n")


def _twice_batch(make_step):
    effect = {"F": 0.4, "H": -0.3}
    plan = {"a": [("F", "H")], "b": [("F",)], "c": [("H",)], "d": [("H", "F")], "e": [("F",), ("H",)],
            "f": [("H",), ("F",)], "g": [("N",)]}
    steps = []
    for traj, turns in plan.items():
        files, level = {"solution.py": TWICE}, 0.3
        for turn, names in enumerate(turns):
            edits = [("replace", "solution.py", *(TWICE_FIX if n == "F" else TWICE_HARM if n == "H" else
                                                  ("    q = 5\n", "    q = (5)\n"))) for n in names]
            level += sum(effect.get(n, 0.0) for n in names)
            step, files = make_step(f"{traj}{turn}", traj, "demo/twice", turn, 0.2 * level, files, edits)
            steps.append(dataclasses.replace(step, visible_pass_fraction=level))
    return steps


def _mean_on_block(result, step, k: int, text: str) -> float:
    """Mean token advantage over `text` inside the k-th <replace> payload of the step's response."""
    at = -1
    for _ in range(k + 1):
        at = step.response_text.index("<replace>", at + 1)
    start = step.response_text.index(text, at)
    tokens = (step.token_char_starts < start + len(text)) & (step.token_char_ends > start)
    return float(result.token_advantages(step.row_id)[tokens].mean())


def test_a_line_held_twice_is_two_units(make_step):
    """The fix of one copy and the harm of the other, written in one action, get opposite credit: a unit is
    a line at its place (as sets of lines, the state after both equals the start and neither is credited)."""
    steps = _twice_batch(make_step)
    result = compute_credit(steps, CreditSettings(estimator="didpo_did"))
    a_e = {a.step.row_id: a.episode_advantage for a in result.advantages}
    both = {"a0": (0, 1), "d0": (1, 0)}  # row -> (fix's block, harm's block)
    for row, (fix, harm) in both.items():
        step = next(s for s in steps if s.row_id == row)
        fix_credit = _mean_on_block(result, step, fix, "r = r + x") - a_e[row]
        harm_credit = _mean_on_block(result, step, harm, "r + x") - a_e[row]
        assert fix_credit > 0 > harm_credit, (row, fix_credit, harm_credit)
    units = credit_units(steps, CreditSettings(estimator="didpo_did")).batch.line_units
    row_of = {s.row_id: r for r, s in enumerate(steps)}
    assert any(row == row_of["a0"] for row, _ in units.present.tolist())  # the state after a0 is not the start
