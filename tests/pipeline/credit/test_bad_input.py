"""Bad input gets a clear error or a defined result, never a crash or a hang."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from pydantic import ValidationError

from pipeline.credit import CreditInputError, CreditSettings, compute_credit, register_estimator
from pipeline.credit_io import result_columns

DIDPO = CreditSettings(estimator="didpo")  # the anchor path (sub-diffs, anchors, A^D); didpo_did: ESTIMATORS
ESTIMATORS = [DIDPO, CreditSettings(estimator="didpo_did")]


def _task(make_step, files_after_by_rollout, rewards, files_before=None, tokenizer=None):
    files_before = files_before or {"a.py": "x = 1\n"}
    steps = []
    for k, (after, reward) in enumerate(zip(files_after_by_rollout, rewards, strict=True)):
        edits = [("write", "a.py", "", after)]
        step, _ = make_step(f"r{k}", f"t{k}", "demo/0", 0, reward, files_before, edits, tokenizer=tokenizer)
        steps.append(step)
    return steps


@pytest.mark.parametrize("settings", ESTIMATORS, ids=lambda s: s.estimator)
def test_empty_and_whitespace_only_diffs_get_episode_credit_only(make_step, settings):
    steps = _task(
        make_step, ["x = 1\n", "x = 1\n\n\n   \n", "x = 1   \n", "x = 1\n# note\n"], [1.0, 0.0, 1.0, 0.0]
    )
    result = compute_credit(steps, settings)
    assert result.diagnostics.n_candidates == 0 and result.diagnostics.n_anchors == 0
    for step, row in zip(steps, result.advantages, strict=True):
        np.testing.assert_array_equal(result.token_advantages(step.row_id), row.episode_advantage)
    assert result.diagnostics.coverage == 0.0 and result.diagnostics.line_coverage == 0.0


def test_no_steps_at_all():
    result = compute_credit([])
    assert result.advantages == [] and result.diagnostics.n_rows == 0


@pytest.mark.parametrize("settings", ESTIMATORS, ids=lambda s: s.estimator)
def test_surrogates_from_non_utf8_bytes(make_step, settings):
    broken = b"def f():\n    return '\xff\xfe'\n".decode("utf-8", "surrogateescape")
    steps = _task(make_step, [broken, broken, "def f():\n    return 1\n", broken], [1.0, 0.0, 1.0, 0.5])
    steps = [replace(s, response_text=s.response_text + "\udcff") for s in steps]
    result = compute_credit(steps, settings)
    if settings.estimator == "didpo":
        assert result.diagnostics.n_anchors >= 1
    else:
        assert result.diagnostics.line_coverage > 0
    assert all(math.isfinite(v) for row in result.advantages for v in row.token_advantages)


@pytest.mark.parametrize("settings", ESTIMATORS, ids=lambda s: s.estimator)
def test_huge_rewrite_is_capped_with_a_defined_result(make_step, settings, fast_tokenizer):
    big_before = "".join(f"value_{i} = {i}\n" for i in range(100_000))
    big_after = "".join(f"value_{i} = {i + 1}\n" for i in range(100_000))
    steps = _task(make_step, [big_after, big_after], [1.0, 0.0], {"a.py": big_before}, fast_tokenizer)
    result = compute_credit(steps, settings)
    assert result.diagnostics.caps == {"regions_over_cap": 2}
    assert result.diagnostics.n_candidates == 0
    np.testing.assert_array_equal(result.token_advantages("r0"), 0.5)


def test_two_line_change_in_a_huge_rewrite_is_a_two_line_diff(make_step, fast_tokenizer):
    lines = [f"value_{i} = {i}\n" for i in range(100_000)]
    after = list(lines)
    after[50_000], after[50_002] = "value_50000 = -1\n", "value_50002 = -1\n"
    steps = _task(make_step, ["".join(after)] * 3, [1.0, 0.0, 0.0], {"a.py": "".join(lines)}, fast_tokenizer)
    result = compute_credit(steps, CreditSettings(estimator="didpo", window_sizes=()))
    sub = result_columns(result, "subdiffs")
    rows0 = [i for i, r in enumerate(sub["row_id"]) if r == "r0"]
    # Two replaced lines: each is one deleted and one added line; the 99,998 unchanged lines are no diff.
    expected = {(kind, line) for kind in ("add", "del") for line in (50_000, 50_002)}
    assert {(sub["edit_type"][i], sub["line_start"][i]) for i in rows0} == expected
    # Both new lines canonicalize to "v0 = - 1": one anchor with two occurrences per row; the deleted
    # lines differ ("... = 50000" / "... = 50002"): two anchors. All 12 occurrences are members.
    assert result.diagnostics.n_anchors == 3 and result.diagnostics.caps == {}
    assert len(result_columns(result, "anchor_members")["subdiff_id"]) == 12
    # Only the tokens (here: lines) that wrote the two new lines carry the diff-level term.
    step = steps[0]
    diff_term = result.token_advantages("r0") - result.advantages[0].episode_advantage
    written = {
        step.response_text[s:e]
        for s, e, d in zip(step.token_char_starts, step.token_char_ends, diff_term, strict=True)
        if d
    }
    assert written == {"value_50000 = -1\n", "value_50002 = -1\n"}


def test_one_rollout_task_has_no_anchors(make_step):
    steps = _task(make_step, ["def f():\n    return 2\n"], [1.0])
    result = compute_credit(steps, DIDPO)
    assert result.diagnostics.n_anchors == 0
    assert result.diagnostics.n_candidates > 0 and result.diagnostics.singleton_rate == 1.0
    np.testing.assert_array_equal(result.token_advantages("r0"), 0.0)


@pytest.mark.parametrize("reward", [float("nan"), None, float("inf")])
def test_missing_or_nan_reward_is_refused_naming_the_row(make_step, reward):
    steps = _task(make_step, ["y = 2\n", "y = 3\n"], [1.0, 0.0])
    steps[1] = replace(steps[1], step_reward=reward)
    with pytest.raises(CreditInputError, match=r"row 'r1'.*step_reward"):
        compute_credit(steps)


def test_inconsistent_rows_are_refused(make_step):
    steps = _task(make_step, ["y = 2\n", "y = 3\n"], [1.0, 0.0])
    with pytest.raises(CreditInputError, match="row 'r0'.*token_char_starts"):
        compute_credit([replace(steps[0], token_char_ends=steps[0].token_char_ends[:-1]), steps[1]])
    with pytest.raises(CreditInputError, match="r0.*0 <= start"):
        compute_credit([replace(steps[0], token_char_ends=steps[0].token_char_ends + 10_000), steps[1]])
    with pytest.raises(CreditInputError, match="appears twice"):
        compute_credit([steps[0], steps[0]])
    with pytest.raises(CreditInputError, match="both turn 0"):
        compute_credit([steps[0], replace(steps[1], traj_id="t0")])
    with pytest.raises(CreditInputError, match="edit 0 has op 'delete'"):
        compute_credit([replace(steps[0], edits=(replace(steps[0].edits[0], op="delete"),))])


def test_settings_refuse_impossible_values():
    with pytest.raises(ValidationError, match="unknown estimator 'ppo'"):
        CreditSettings(estimator="ppo")
    with pytest.raises(ValidationError, match="Extra inputs"):
        CreditSettings(lambda_=1.0)
    with pytest.raises(ValidationError, match="eta"):
        CreditSettings(eta=1.5)
    with pytest.raises(ValidationError, match="gamma"):
        CreditSettings(gamma=-0.1)
    with pytest.raises(ValidationError):
        CreditSettings(gs_form="cubic")
    with pytest.raises(ValidationError, match="window sizes"):
        CreditSettings(window_sizes=(0, 2))
    assert CreditSettings().estimator == "didpo_did" and CreditSettings().eta == 0.8


def test_registry_refuses_duplicate_names():
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_estimator("grpo")(lambda batch, settings: None)
