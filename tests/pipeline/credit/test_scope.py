"""What each estimator declares is true: it reads sub-diffs and anchors only if `needs_anchors` (they are not
computed otherwise), its advantages depend on its task group only if its scope is "task", and it runs with
one BLAS thread."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.credit import (
    ESTIMATORS,
    CreditSettings,
    EstimatorOutput,
    assign_advantages,
    compute_credit,
    credit_units,
    reads_units,
)

BASE = "def total(items):\n    total = 0\n    for x in items:\n        total += x\n    return total\n"
CHANGES = [  # (search, replace) edits of BASE: a fix-like change, a harmful one, a near duplicate, a rewrite
    ("        total += x\n", "        total += x * 1\n"),
    ("    total = 0\n", "    total = 1\n"),
    ("        total += x\n", "        total += (x * 1)\n"),
    ("    return total\n", "    return int(total)\n"),
]


def _batch(make_step, tasks=("task/a", "task/b", "task/c")):
    """Three task groups of 4 trajectories x 2 turns; rewards and edits vary by task, trajectory and turn."""
    steps = []
    for t, task in enumerate(tasks):
        for g in range(4):
            for turn in range(2):
                first, second = CHANGES[(g + turn) % 4], CHANGES[(g + t + 2 * turn + 1) % 4]
                ops = [("replace", f"f{turn}.py", *first)]
                if first[0] != second[0]:
                    ops.append(("replace", f"f{turn}.py", *second))
                reward = float((g * (t + 1) + turn) % 3) / 2
                steps.append(make_step(f"{task}/{g}/{turn}", f"{task}/{g}", task, turn, reward,
                                       {f"f{turn}.py": BASE}, ops, think=f"{task} {g} {turn}")[0])
    return steps


def _rows(result) -> dict[str, tuple[float, np.ndarray]]:
    return {a.step.row_id: (a.episode_advantage, np.asarray(a.token_advantages)) for a in result.advantages}


def _assert_same(left, right):
    assert left.keys() == right.keys()
    for row in left:
        assert left[row][0] == pytest.approx(right[row][0], abs=1e-12), row
        np.testing.assert_allclose(left[row][1], right[row][1], atol=1e-12, err_msg=row)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_skipping_units_changes_no_advantage(estimator, make_step):
    """compute_credit computes sub-diffs and anchors only when the estimator reads them; the advantages are
    those of the full computation either way."""
    steps = _batch(make_step)
    settings = CreditSettings(estimator=estimator)
    lean = compute_credit(steps, settings)
    full = assign_advantages(credit_units(steps, settings), settings)
    _assert_same(_rows(lean), _rows(full))
    assert full.diagnostics.n_anchors >= 1 and len(full.subdiffs) >= 1  # the stage's units
    skipped = not reads_units(settings)
    assert skipped == (not ESTIMATORS[estimator].needs_anchors)
    assert ("similarity" in lean.diagnostics.seconds) == (not skipped)
    assert (lean.diagnostics.n_anchors == 0) == skipped


def test_lambda_zero_skips_the_units(make_step):
    settings = CreditSettings(estimator="didpo", lam=0.0)
    assert not reads_units(settings)
    result = compute_credit(_batch(make_step), settings)
    assert result.diagnostics.n_candidates == 0 and result.subdiffs == []
    assert {a.n_diff_tokens for a in result.advantages} == {0}


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_scope_is_what_the_estimator_declares(estimator, make_step):
    """A task-scoped estimator gives each task group, computed alone, exactly its advantages in the whole batch
    (so a runner may split the batch by task); a batch-scoped one does not on this batch."""
    steps = _batch(make_step)
    settings = CreditSettings(estimator=estimator)
    whole = _rows(compute_credit(steps, settings))
    apart: dict = {}
    for task in sorted({s.task_id for s in steps}):
        apart |= _rows(compute_credit([s for s in steps if s.task_id == task], settings))
    if ESTIMATORS[estimator].scope == "task":
        _assert_same(whole, apart)
    else:
        with pytest.raises(AssertionError):
            _assert_same(whole, apart)


def test_estimators_run_with_one_blas_thread(make_step, monkeypatch):
    from threadpoolctl import threadpool_info, threadpool_limits

    seen = []
    spec = ESTIMATORS["grpo"]

    def probe(batch, settings):
        seen.extend(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")
        return spec.fn(batch, settings)

    monkeypatch.setitem(ESTIMATORS, "grpo", type(spec)(spec.name, probe, spec.needs_anchors, spec.scope))
    with threadpool_limits(limits=2, user_api="blas"):  # the caller's setting, whatever the environment's
        compute_credit(_batch(make_step, tasks=("task/a",)), CreditSettings(estimator="grpo"))
        outside = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    assert seen and set(seen) == {1}
    assert set(outside) == {2}  # restored after the estimator


def test_an_estimator_registers_with_its_scope():
    from pipeline.credit.estimators import register_estimator

    name = "test_scope_probe"
    try:
        register_estimator(name, scope="batch")(lambda batch, settings: EstimatorOutput(np.zeros(0), []))
        assert ESTIMATORS[name].scope == "batch" and not ESTIMATORS[name].needs_anchors
    finally:
        ESTIMATORS.pop(name, None)
