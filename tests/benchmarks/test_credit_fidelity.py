"""benchmarks/credit_fidelity.py: its metrics and generators on hand-made cases, and one tiny real build."""

from __future__ import annotations

import ast
import importlib.util
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "credit_fidelity.py"

SOURCE = '''import math


def helper(x):
    return x + 1


def f(a, b):
    """doc"""
    if a < b:
        return helper(a)
    total = a * 2 + b  # note
    y = 'q'
    return total
'''


@pytest.fixture(scope="module")
def fidelity():
    spec = importlib.util.spec_from_file_location("credit_fidelity_under_test", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _edit(fidelity, problem, row, traj, effect):
    return fidelity.EditRecord(problem, problem, traj, row, "fix", ("solution.py", 0), "x\n", (0, 1), effect)


# ------------------------------------------------------------------------------------------- metrics
def test_auc_and_pairs_by_hand(fidelity):
    effect = np.array([0.5, -0.5, 0.2, -0.1, 0.0])
    score = np.array([1.0, 0.0, 0.0, 0.0, 3.0])
    # helpful {1.0, 0.0} vs harmful {0.0, 0.0}: wins 2, ties 2 -> (2 + 1) / 4; the no-effect edit is ignored
    assert fidelity.auc(score, effect) == pytest.approx(0.75)
    wins, pairs = fidelity.pair_counts(score, effect, np.array([0, 0, 1, 1, 1]))
    assert (wins, pairs) == (1.5, 2)  # group 0: 1 > 0 wins; group 1: 0 == 0 ties
    assert np.isnan(fidelity.auc(score, np.abs(effect)))  # no harmful edit: undefined


def test_edit_scores_keep_row_level_ties(fidelity):
    """A row-level advantage averaged over spans of different lengths is one score: a tie, not float noise."""
    from types import SimpleNamespace

    starts, ends = np.arange(0, 14, 2), np.arange(2, 16, 2)  # 7 tokens of 2 characters
    step = SimpleNamespace(row_id="r", token_char_starts=starts, token_char_ends=ends)
    result = SimpleNamespace(advantages=[SimpleNamespace(step=step, token_advantages=np.full(7, 0.1))])
    edits = [
        fidelity.EditRecord("t", "p", "t#0", "r", "fix", ("s.py", 0), "x\n", (0, 2), 0.5),
        fidelity.EditRecord("t", "p", "t#0", "r", "harm", ("s.py", 1), "y\n", (2, 8), -0.5),
        fidelity.EditRecord("t", "p", "t#0", "r", "harm", ("s.py", 2), "z\n", (8, 14), -0.5),
    ]
    score = fidelity.edit_scores(result, [step], edits)
    assert score[0] == score[1] == score[2]
    assert fidelity.pair_counts(score, np.array([0.5, -0.5, -0.5]), np.zeros(3, int)) == (1.0, 2)


def test_spearman_matches_ranks(fidelity):
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert fidelity.spearman(x, x**3) == pytest.approx(1.0)
    assert fidelity.spearman(x, -x) == pytest.approx(-1.0)
    assert fidelity.spearman(x, np.array([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)  # 1 - 6*2/(4*15)
    assert np.isnan(fidelity.spearman(x, np.zeros(4)))


def test_pooled_ratio_and_percentile_interval(fidelity):
    counts = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert fidelity.pooled_ratio(counts, np.array([0, 0, 1])) == pytest.approx(5 / 8)  # repeats count twice
    assert np.isnan(fidelity.pooled_ratio(np.zeros((2, 2)), np.array([0, 1])))
    lo, hi = fidelity.percentile_interval(list(range(1, 102)) + [float("nan")])
    assert (lo, hi) == pytest.approx((3.5, 98.5))  # nan dropped; linear interpolation over 1..101
    assert all(np.isnan(fidelity.percentile_interval([float("nan")])))


def test_variant_metrics_bootstrap_over_problems(fidelity):
    """Problem A ranks its pair right, problem B wrong: the point is 1/2, and the resamples AA, BB, AB give
    1, 0, 1/2 (percentile interval of those three values)."""
    edits = [
        _edit(fidelity, "A", "a@0", "a", 0.5), _edit(fidelity, "A", "a@0", "a", -0.5),
        _edit(fidelity, "B", "b@0", "b", 0.5), _edit(fidelity, "B", "b@0", "b", -0.5),
    ]  # fmt: skip
    score = np.array([1.0, 0.0, 0.0, 1.0])
    draws = [np.array([0, 0]), np.array([1, 1]), np.array([0, 1])]
    metrics = fidelity.variant_metrics(score, edits, draws)
    value, lo, hi = metrics["pair_action"]
    assert value == pytest.approx(0.5)
    assert (lo, hi) == pytest.approx((0.025, 0.975))
    assert metrics["pair_traj"][0] == pytest.approx(0.5)
    assert metrics["auc"][0] == pytest.approx(0.5)
    assert metrics["spearman"][0] == pytest.approx(0.0)
    assert fidelity.within_pairs(edits, "row_id") == 2


def test_summary_line_reports_the_worst_hardened_variant(fidelity):
    def row(variant, estimator, pair):
        nan = (float("nan"),) * 3
        metrics = {"pair_action": (pair, 0.0, 1.0), "pair_traj": nan, "spearman": (0.25, 0, 1), "auc": nan}
        return fidelity.Row(variant, estimator, metrics, 0.9, 1.0)

    rows = [
        row("mixed", "didpo_did", 0.75), row("mixed", "didpo", 0.5), row("mixed", "gigpo", 0.625),
        row("respell", "didpo_did", 0.7), row("outcome_only", "didpo_did", 0.6), row("hunk", "didpo_did", 0.1),
    ]  # fmt: skip
    line = fidelity.summary_line(rows, 301)
    assert line == (
        "credit_fidelity: did_pair_action=0.7500 did_pair_action_hard=0.6000 did_spearman=0.2500 "
        "did_coverage=0.9000 didpo_pair_action=0.5000 gigpo_pair_action=0.6250 pairs=301"
    )  # hunk is a shape, not a hardened variant: its 0.1 is not the worst hardened figure


# ---------------------------------------------------------------------------------------- generators
def test_replay_skips_exactly_one_edit(fidelity):
    start = {"a.py": ["a\n", "b\n"], "b.py": ["c\n"]}
    assignments = [(0, ("a.py", 0), "A\n"), (1, ("b.py", 0), "C\n"), (2, ("a.py", 0), "AA\n")]
    assert fidelity.replay(start, assignments, skip=-1) == {"a.py": ["AA\n", "b\n"], "b.py": ["C\n"]}
    assert fidelity.replay(start, assignments, skip=1) == {"a.py": ["AA\n", "b\n"], "b.py": ["c\n"]}
    assert fidelity.replay(start, assignments, skip=2) == {"a.py": ["A\n", "b\n"], "b.py": ["C\n"]}
    assert start["a.py"] == ["a\n", "b\n"]  # the start is not modified


def test_separable_keeps_damage_that_stays_visible(fidelity):
    def harm(pf, line, failing, total=4):
        return fidelity.Harm(pf, 0.0, ("s.py", line), f"bug{line}\n", frozenset(failing), total)

    harms = [  # least damage is considered first: lines 1, 2, 5, then 3 and the second mutation of 1
        harm(0.75, 1, {"t1"}),
        harm(0.75, 2, {"t1"}),  # fails nothing new: its effect hides behind line 1's
        harm(0.5, 3, {"t2", "t3"}),  # with lines 1 and 5, every case would fail: nothing left to see
        harm(0.0, 4, {"t1", "t2", "t3", "t4"}),  # total damage
        harm(0.5, 1, {"t2"}),  # a second mutation of line 1: one per line
        harm(0.75, 5, {"t4"}),
    ]
    assert [h.loc[1] for h in fidelity.separable(harms)] == [1, 5]
    assert [h.loc[1] for h in fidelity.separable(harms[:5])] == [1, 3]  # without line 5, line 3 fits


def test_respellings_keep_the_meaning(fidelity):
    lines = SOURCE.splitlines(keepends=True)
    cond = lines.index("    if a < b:\n")
    options = fidelity.respellings(lines, cond, lines[cond])
    assert "    if b > a:\n" in options and "    if a<b:\n" in options
    ret = lines.index("        return helper(a)\n")
    for text in fidelity.respellings(lines, ret, lines[ret]):
        assert text != lines[ret]
        new = "".join(lines[:ret] + [text] + lines[ret + 1 :])
        assert ast.dump(ast.parse(new)) == ast.dump(ast.parse(SOURCE))
    quoted = lines.index("    y = 'q'\n")
    assert '    y = "q"\n' in fidelity.respellings(lines, quoted, lines[quoted])
    commented = lines.index("    total = a * 2 + b  # note\n")
    assert all("#" in t for t in fidelity.respellings(lines, commented, lines[commented]))  # kept the comment
    assert fidelity.parenthesized(lines, lines.index("def f(a, b):\n")) is None


def test_render_every_shape_parses_to_the_planned_files(fidelity):
    from pipeline.agent.grammar import apply_action, parse_response

    files = {"solution.py": SOURCE.splitlines(keepends=True), "helpers.py": ["K = 1\n", "L = 2\n"]}
    edits = [
        ("fix", ("solution.py", 9), "    if a <= b:\n"),
        ("harm", ("helpers.py", 1), "L = 3\n"),
        ("neutral", ("solution.py", 4), "    return (x + 1)\n"),
    ]
    expected = {name: list(lines) for name, lines in files.items()}
    for _, (name, i), text in edits:
        expected[name][i] = text
    for shape in fidelity.SHAPES:
        response, spans = fidelity.render(0, files, edits, shape)
        action = parse_response(response)
        assert action.ok, (shape, action)
        assert len(action.edits) == {"blocks": 3, "hunk": 2, "write": 2}[shape]
        after = apply_action(action, fidelity.joined(files), max_file_bytes=1 << 20)
        assert after == fidelity.joined(expected), shape
        assert [response[s:e] for s, e in spans] == [t.strip() for _, _, t in edits], shape
    with pytest.raises(ValueError):
        fidelity.render(0, files, edits, "diff")


def _task(task_id, files):
    from pipeline.tasks.base import Task, TestSuite

    suite = TestSuite(kind="check", files={"t.py": "def check(c): pass"}, entry_point="f", module="solution")
    return Task(task_id=task_id, source="s", split="test", instructions=f"fix {task_id}", workspace=files,
                visible_tests=suite, hidden_tests=suite, reference=files)


class _CountingJudge:
    """Passes a case per line that says `ok`; records which task saw which files."""

    def __init__(self):
        self.seen = []

    def run(self, task, files, *, hidden=False):
        from pipeline.sandbox.judge import CaseResult, ExecResult

        self.seen.append((task.task_id, dict(files)))
        lines = files["solution.py"].splitlines()
        cases = tuple(CaseResult(f"line {i}", line == "ok") for i, line in enumerate(lines))
        passed = sum(c.passed for c in cases)
        return ExecResult("passed" if passed == len(cases) else "failed", passed, len(cases), 0.1, "bwrap", cases)


def test_multi_file_pairs_two_programs_in_one_workspace(fidelity):
    """multi_file: two programs under a/ and b/, each judged by its own tests on its own folder."""
    designs = []
    for name, problem in (("s/1", "p1"), ("s/1plus", "p1"), ("s/2", "p2"), ("s/3", "p3")):
        ref = {"solution.py": ["ok\n", "ok\n"]}
        designs.append(fidelity.TaskDesign(
            task=_task(name, {"solution.py": "bad\nok\n"}), problem=problem, reference=ref,
            start={"solution.py": ["bad\n", "ok\n"]}, bugs=[("solution.py", 0)],
            harms=[(("solution.py", 1), f"h{k}\n") for k in range(2)], neutrals=[(("solution.py", 1), "ok \n")],
        ))  # fmt: skip
    inner = _CountingJudge()
    judge = fidelity.CachedJudge(inner)
    pairs = fidelity.pair_designs(designs, judge)
    # a program never shares a workspace with another spelling of its own problem; the odd one out waits
    assert [d.problem for d in pairs] == ["p1+p2", "p1+p3"]
    first = pairs[0]
    assert sorted(first.task.workspace) == ["a/solution.py", "b/solution.py"]
    assert first.bugs == [("a/solution.py", 0), ("b/solution.py", 0)]
    assert [loc[0] for loc, _ in first.harms[:2]] == ["a/solution.py", "b/solution.py"]  # both in the menu
    result = judge.run(first.task, {"a/solution.py": "ok\nok\n", "b/solution.py": "bad\nok\n"}, hidden=True)
    assert inner.seen == [("s/1", {"solution.py": "ok\nok\n"}), ("s/2", {"solution.py": "bad\nok\n"})]
    assert (result.status, result.passed, result.total) == ("failed", 3, 4)  # passed only if both pass
    assert [c.name for c in result.cases if not c.passed] == ["b/line 0"]
    both = judge.run(first.task, {"a/solution.py": "ok\nok\n", "b/solution.py": "ok\nok\n"}, hidden=True)
    assert (both.status, both.pass_fraction) == ("passed", 1.0)
    assert len(inner.seen) == 3  # the a/ program's run was cached


def test_plan_is_a_function_of_its_seed(fidelity):
    ref = {"solution.py": SOURCE.splitlines(keepends=True)}
    start = {"solution.py": list(ref["solution.py"])}
    start["solution.py"][9] = "    if a > b:\n"
    design = fidelity.TaskDesign(
        task=None, problem="p", reference=ref, start=start, bugs=[("solution.py", 9)],
        harms=[(("solution.py", 12), "    total = a * 3 + b  # note\n"), (("solution.py", 13), "    y = 'r'\n")],
        neutrals=[(("solution.py", 4), "    return (x + 1)\n")],
    )  # fmt: skip
    plan = fidelity.plan_trajectory(design, 3, random.Random(7), fidelity.HARM_MENU)
    assert plan == fidelity.plan_trajectory(design, 3, random.Random(7), fidelity.HARM_MENU)
    assert len(plan) == 3
    for action in plan:
        locs = [loc for _, loc, _ in action]
        assert len(locs) == len(set(locs)) >= 1  # one edit per line per action
        for kind, (_, i), text in action:
            if kind == "fix":
                assert text == ref["solution.py"][i]
    fixes = [i for action in plan for kind, (_, i), _ in action if kind == "fix"]
    assert 9 in fixes or all(kind != "fix" for action in plan for kind, _, _ in action)


# ----------------------------------------------------------------------------------------- real build
@pytest.mark.slow
def test_tiny_build_scores_every_estimator(fidelity):
    """Two HumanEval tasks, 3 rollouts x 2 turns through the real Episode and sandbox, four variants."""
    bench = fidelity.build(
        ("humaneval",), n_tasks=2, n_rollouts=3, n_turns=2,
        variants=("mixed", "hunk", "outcome_only", "multi_file"), pool_size=1,
        ids=["humaneval/HumanEval/132", "humaneval/HumanEval/74"],
    )  # fmt: skip
    assert set(bench.variants) == {"mixed", "hunk", "outcome_only", "multi_file"}
    assert bench.executions <= bench.lookups
    mixed = bench.variants["mixed"]
    assert mixed.n_tasks == 2 and len(mixed.steps) == 12
    pair = bench.variants["multi_file"]  # both programs in one workspace, each judged by its own tests
    assert pair.n_tasks == 1 and len(pair.steps) == 6
    assert {e.loc[0] for e in pair.edits} == {"a/solution.py", "b/solution.py"}
    for data in bench.variants.values():
        by_row = {s.row_id: s for s in data.steps}
        for edit in data.edits:  # each edit's span is the code of the line it writes
            assert by_row[edit.row_id].response_text[edit.span[0] : edit.span[1]] == edit.text.strip()
            assert -1.0 <= edit.effect <= 1.0
    # the variants share plans: the same edits with the same measured effects, only rendered differently
    for name in ("hunk", "outcome_only"):
        assert [(e.loc, e.text, e.effect) for e in bench.variants[name].edits] == [
            (e.loc, e.text, e.effect) for e in mixed.edits
        ]
    assert all(s.visible_pass_fraction is not None for s in mixed.steps)
    outcome_only = bench.variants["outcome_only"].steps
    assert all(s.visible_pass_fraction is None for s in outcome_only)
    assert all(s.step_reward == 0.0 for s in outcome_only if s.turn == 0)  # reward only at the last turn
    rows = fidelity.score_variant("mixed", mixed, fidelity.ESTIMATORS, n_boot=20, seed=0)
    assert [r.estimator for r in rows] == list(fidelity.ESTIMATORS)
    for r in rows:
        value = r.metrics["auc"][0]
        assert np.isnan(value) or 0.0 <= value <= 1.0
        assert r.ms > 0
        # a coverage figure for the estimators with diff-level units (didpo's anchors, didpo_did's lines)
        assert (r.estimator in ("didpo", "didpo_did")) == np.isfinite(r.coverage)
    line = fidelity.summary_line(rows, fidelity.within_pairs(mixed.edits, "row_id"))
    assert re.fullmatch(
        r"credit_fidelity: did_pair_action=\S+ did_pair_action_hard=\S+ did_spearman=\S+ did_coverage=\S+ "
        r"didpo_pair_action=\S+ gigpo_pair_action=\S+ pairs=\d+",
        line,
    )
