"""Smoke test of benchmarks/credit_fidelity.py: its metrics on hand-made cases and one tiny real build."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "credit_fidelity.py"


@pytest.fixture(scope="module")
def fidelity():
    spec = importlib.util.spec_from_file_location("credit_fidelity_under_test", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_auc_and_pairs_by_hand(fidelity):
    effect = np.array([0.5, -0.5, 0.2, -0.1, 0.0])
    score = np.array([1.0, 0.0, 0.0, 0.0, 3.0])  # helpful > harmful: 1 vs 0 and 1 vs 0 win; 0 vs 0 ties
    # helpful {1.0, 0.0} vs harmful {0.0, 0.0}: wins 2, ties 2 -> (2 + 1) / 4
    assert fidelity.auc(score, effect) == pytest.approx(0.75)
    wins, pairs = fidelity.pair_counts(score, effect, np.array([0, 0, 1, 1, 1]))
    assert (wins, pairs) == (1.5, 2)  # group 0: 1 > 0 wins; group 1: 0 == 0 ties
    correct, n = fidelity.sign_counts(score, effect)
    assert (correct, n) == (1.0 + 3 * 0.5, 4)  # right on edit 0; edits 1..3 score 0: one half each


def test_spearman_matches_ranks(fidelity):
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert fidelity.spearman(x, x**3) == pytest.approx(1.0)
    assert fidelity.spearman(x, -x) == pytest.approx(-1.0)
    assert np.isnan(fidelity.spearman(x, np.zeros(4)))


def test_replay_skips_exactly_one_edit(fidelity):
    start = ["a\n", "b\n", "c\n"]
    assignments = [(0, 0, "A\n"), (1, 1, "B\n"), (2, 0, "AA\n")]
    assert fidelity.replay(start, assignments, skip=-1) == ["AA\n", "B\n", "c\n"]
    assert fidelity.replay(start, assignments, skip=1) == ["AA\n", "b\n", "c\n"]
    assert fidelity.replay(start, assignments, skip=2) == ["A\n", "B\n", "c\n"]


def test_tiny_build_scores_every_estimator(fidelity):
    """One task, 3 rollouts, 2 turns through the real Episode and sandbox; every configuration scores."""
    bench = fidelity.build(n_tasks=1, n_rollouts=3, n_turns=2, seed=0, pool_size=1)
    assert bench.n_tasks == 1 and len(bench.steps) == 6
    assert bench.executions <= bench.lookups
    for edit in bench.edits:  # each edit's span is the code of the line it writes
        step = next(s for s in bench.steps if s.row_id == edit.row_id)
        assert step.response_text[edit.span[0] : edit.span[1]] == edit.text.strip()
        assert -1.0 <= edit.effect <= 1.0
    assert all(s.visible_pass_fraction is not None for s in bench.steps)
    configs = [c for c in fidelity.configurations() if c[0] in ("grpo", "didpo lam=1.0", "didpo_did lam=1.0")]
    scored = fidelity.score_all(bench, configs)
    table = fidelity.metrics_table(scored, bench, n_boot=20)
    assert set(table) == {"grpo", "didpo lam=1.0", "didpo_did lam=1.0"}
    for s in scored:
        assert s.score.shape == (len(bench.edits),) and np.isfinite(s.score).all()
        value, lo, hi = table[s.name]["auc"]
        assert np.isnan(value) or 0.0 <= value <= 1.0
    assert table["didpo lam=1.0"]["coverage"][0] >= 0.0 and np.isnan(table["grpo"]["coverage"][0])
