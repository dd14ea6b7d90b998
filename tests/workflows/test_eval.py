"""Benchmark evaluation: the pass@k estimator, task selection (disjoint from training), scoring, end to end."""

from __future__ import annotations

import math
from fractions import Fraction
from math import comb

import pyarrow.parquet as pq
import pytest
from builders import ChatTokenizerStub
from typer.testing import CliRunner

from pipeline.agent.settings import EpisodeSettings
from pipeline.evaluation import (
    AgentRuntime,
    TaskResult,
    default_ks,
    parse_benchmarks,
    pass_at_k,
    run_benchmark_episodes,
    select_benchmark_tasks,
    subset_of,
    summarize,
    task_results,
    write_results,
)
from pipeline.policy.generation import GenerationResult
from pipeline.tasks import load_source, problem_key

# ---- pass@k -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (1, 1, 1, 1.0), (1, 0, 1, 0.0), (4, 1, 1, 0.25), (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (5, 4, 2, 1.0),  # only one failure: every pair holds a pass
    (20, 0, 10, 0.0),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_formula_and_stays_stable_for_large_n():
    for n in range(1, 25):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(comb(n - c, k), comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
    # C(1000, 100) overflows a float; the product form does not
    exact = 1 - Fraction(comb(997, 100), comb(1000, 100))
    assert pass_at_k(1000, 3, 100) == pytest.approx(float(exact), rel=1e-12)
    assert 0.0 < pass_at_k(1000, 1, 1) == pytest.approx(0.001)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_default_ks_only_what_n_samples_can_estimate():
    assert default_ks(1) == (1,)
    assert default_ks(5) == (1, 5)
    assert default_ks(12) == (1, 5, 10, 12)


def test_parse_benchmarks_names_the_bad_entry():
    assert parse_benchmarks("humaneval, mbppplus") == ["humaneval", "mbppplus"]
    with pytest.raises(ValueError, match="unknown benchmark humanevil"):
        parse_benchmarks("humaneval,humanevil")
    with pytest.raises(ValueError, match="more than once"):
        parse_benchmarks("humaneval,humaneval")
    with pytest.raises(ValueError, match="names no benchmark"):
        parse_benchmarks(" , ")


# ---- selection: evaluation never meets training -----------------------------------------------------------


@pytest.fixture(scope="module")
def mbpp_train():
    return load_source("mbpp", split="train")


def test_selection_leaves_out_training_problems_and_is_disjoint(mbpp_train):
    sel = select_benchmark_tasks(["mbppplus", "humanevalfix"], mbpp_train, limit=20)
    train_problems = {problem_key(t) for t in mbpp_train}
    assert sel.excluded["mbppplus"] > 0 and sel.excluded["humanevalfix"] == 0
    assert [len(v) for v in sel.tasks.values()] == [20, 20]
    assert not {problem_key(t) for t in sel.all_tasks} & train_problems


def test_selection_refuses_overlap_when_asked(mbpp_train):
    with pytest.raises(ValueError, match="share .* problem"):
        select_benchmark_tasks(["mbppplus"], mbpp_train, on_overlap="error")


def test_selection_with_nothing_left_is_an_error():
    with pytest.raises(ValueError, match="humanevalfix: all 164 tasks pose training problems"):
        select_benchmark_tasks(["humanevalfix"], load_source("humaneval"))


def test_subsets_come_from_task_meta():
    fix = load_source("humanevalfix", limit=30)
    assert {subset_of(t) for t in fix} == {t.meta["bug_type"] for t in fix}
    assert {subset_of(t) for t in load_source("humaneval", limit=3)} == {"all"}


# ---- scoring ----------------------------------------------------------------------------------------------


def _result(task_id, subset, n, c, steps=4, invalid=1, turns=2.0, bench="humanevalfix"):
    return TaskResult(bench, subset, task_id, n, c, steps, invalid, turns)


def test_summarize_averages_pass_at_k_per_benchmark_and_subset():
    results = [_result("a", "x", 5, 2, turns=1.0), _result("b", "x", 5, 0, invalid=0, turns=3.0),
               _result("c", "y", 5, 5, steps=2, invalid=2, turns=2.0)]
    rows = summarize(results, samples=5, ks=(1, 5))
    assert [(r.benchmark, r.subset, r.tasks) for r in rows] == [
        ("humanevalfix", "all", 3), ("humanevalfix", "x", 2), ("humanevalfix", "y", 1)]
    everything, x, y = rows
    assert everything.pass_at[1] == pytest.approx((0.4 + 0.0 + 1.0) / 3)
    assert everything.pass_at[5] == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    assert x.pass_at[1] == pytest.approx(0.2) and y.pass_at[5] == 1.0
    assert everything.invalid_rate == pytest.approx(3 / 10)
    assert everything.mean_turns == pytest.approx((5 * 1.0 + 5 * 3.0 + 5 * 2.0) / 15)
    assert everything.lost_episodes == 0


def test_summarize_leaves_tasks_with_lost_episodes_out_of_pass_at_k():
    rows = summarize([_result("a", "all", 5, 1), _result("b", "all", 3, 3)], samples=5, ks=(1, 5))
    assert rows[0].pass_at[1] == pytest.approx((0.2 + 1.0) / 2)
    assert rows[0].pass_at[5] == pytest.approx(1.0)  # only task a has 5 finished episodes: 1 - C(4,5)/C(5,5)
    assert rows[0].lost_episodes == 2
    assert math.isnan(summarize([_result("a", "all", 0, 0)], samples=1, ks=(1,))[0].pass_at[1])


# ---- end to end through episodes and the sandbox ---------------------------------------------------------


class ScriptedPolicy:
    """Answers every prompt with one fixed response (one 'token' per character)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, requests):
        n = len(self.text)
        return [GenerationResult(r.key, r.prompt_token_ids, [0] * n, self.text, list(range(n)),
                                 list(range(1, n + 1)), [0.0] * n, False) for r in requests]


def test_episodes_in_the_sandbox_score_a_correct_and_a_broken_policy():
    from pipeline.sandbox import Judge, SandboxPool
    from pipeline.sandbox.settings import SandboxSettings

    task = load_source("humaneval", limit=1)[0]
    (path, text), = task.reference.items()
    good = ScriptedPolicy(f"<think>\nreference\n</think>\n<write path=\"{path}\">\n{text}</write>")
    bad = ScriptedPolicy("no action here")
    episode = EpisodeSettings(max_turns=1, min_turns_before_finish=0)
    tasks = {"humaneval": [task]}
    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        runs = {name: run_benchmark_episodes([task], AgentRuntime(policy, ChatTokenizerStub(), Judge(pool)), episode,
                                             samples=2, seed=0, gamma=0.95, batch_size=4)
                for name, policy in (("good", good), ("bad", bad))}
    good_rows = summarize(task_results(tasks, *runs["good"][:2]), samples=2, ks=(1, 2))
    bad_rows = summarize(task_results(tasks, *runs["bad"][:2]), samples=2, ks=(1, 2))
    assert good_rows[0].pass_at == {1: 1.0, 2: 1.0} and good_rows[0].invalid_rate == 0.0
    assert bad_rows[0].pass_at == {1: 0.0, 2: 0.0} and bad_rows[0].invalid_rate == 1.0
    assert good_rows[0].mean_turns == 1.0


def test_results_are_written_as_parquet(tmp_path):
    results = [_result("a", "x", 2, 1), _result("b", "y", 2, 2)]
    rows = summarize(results, samples=2, ks=(1, 2))
    written = write_results(tmp_path, rows, results, (1, 2))
    assert written["dead_letter"].is_file()
    summary = pq.read_table(written["eval_summary"]).to_pylist()
    assert [(r["subset"], r["pass_at_1"], r["pass_at_2"]) for r in summary] == [
        ("all", 0.75, 1.0), ("x", 0.5, 1.0), ("y", 1.0, 1.0)]
    assert pq.read_table(written["eval_tasks"]).num_rows == 2


# ---- the command -------------------------------------------------------------------------------------------


def _app():
    """The real `didpo` app (its one error mapping); args start with "eval"."""
    from workflows.cli import app

    return app


@pytest.mark.slow
def test_eval_command_prints_and_writes_the_table(tiny_policy, tmp_path):
    out = tmp_path / "eval"
    res = CliRunner().invoke(_app(), [
        "eval", "--policy", str(tiny_policy), "--benchmarks", "humaneval,humanevalfix", "--limit", "1", "--turns", "1",
        "--out", str(out), "--set", "policy.max_new_tokens=8", "--set", "sandbox.pool_size=1"],
        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "pass@1" in res.output and "humanevalfix" in res.output and "invalid rate" in res.output
    table = pq.read_table(out / "eval_summary.parquet").to_pylist()
    assert {(r["benchmark"], r["subset"]) for r in table} >= {("humaneval", "all"), ("humanevalfix", "all")}
    assert all(r["tasks"] == 1 and 0.0 <= r["pass_at_1"] <= 1.0 for r in table)


@pytest.mark.parametrize(("args", "message"), [
    (["--benchmarks", "nope"], "unknown benchmark nope"),
    (["--samples", "2", "--k", "3"], "--k values must lie in 1..2"),
    (["--samples", "3", "--temperature", "0"], "identical"),
    (["--on-overlap", "maybe"], "--on-overlap"),
    (["--set", "run.root=gs://b/runs"], "pass --out with a local folder"),  # results are written locally
])
def test_eval_command_refuses_bad_options(tmp_path, args, message):
    res = CliRunner().invoke(_app(), ["eval", "--policy", str(tmp_path), *args])
    assert res.exit_code == 2 and message in res.output


def test_eval_after_a_round_resolves_the_policy_as_rounds_do(tmp_path, tiny_policy):
    """`--after-round k` is policy k+1 by `workflows.rounds.round_policy`: round k's update, or (a round with
    nothing to train) the policy round k sampled with; the DAG's evaluate task relies on it."""
    from pipeline import schema

    root = ["--set", f"run.root={tmp_path}", "--set", "run.run_id=r", "--set", "sft.enabled=false",
            "--set", f"policy.checkpoint={tiny_policy}", "--benchmarks", "nope"]  # stops after resolving
    missing = CliRunner().invoke(_app(), ["eval", "--after-round", "1", *root])
    assert missing.exit_code == 2 and "run round 1 first" in missing.output
    rd = tmp_path / "r" / "round=0"
    rd.mkdir(parents=True)
    schema.write_manifest(schema.Manifest("r", 0, "cfg", "sha", "v0", stages={
        "train": {"nothing_to_train": "all 8 rows have zero advantage"}}), rd)
    carried = CliRunner().invoke(_app(), ["eval", "--after-round", "0", *root])
    assert carried.exit_code == 2 and "unknown benchmark nope" in carried.output  # resolved: policy.checkpoint
    both = CliRunner().invoke(_app(), ["eval", "--after-round", "0", "--policy", str(tiny_policy)])
    assert both.exit_code == 2 and "give --policy or --after-round" in both.output


def test_the_agent_runtime_loads_the_configured_backend(tiny_policy):
    """Evaluation builds its policy through the backend's handler, as the pipeline's rollouts do: a vLLM
    config is never evaluated with transformers behind the user's back (here vLLM is not installed)."""
    from pipeline.evaluation import agent_runtime
    from pipeline.policy.generation import BackendUnavailable
    from pipeline.policy.settings import PolicySettings
    from pipeline.sandbox.settings import SandboxSettings

    with pytest.raises(BackendUnavailable, match="vllm"), \
            agent_runtime(PolicySettings(checkpoint=str(tiny_policy), backend="vllm"), SandboxSettings(pool_size=1)):
        pass
    task = load_source("humaneval", limit=1)[0]
    policy = PolicySettings(checkpoint=str(tiny_policy), temperature=0.0, max_new_tokens=8)
    with agent_runtime(policy, SandboxSettings(pool_size=1)) as runtime:
        trajs, steps, dead = run_benchmark_episodes([task], runtime, EpisodeSettings(max_turns=1), samples=1,
                                                    seed=0, gamma=1.0, batch_size=1)
    assert len(trajs) == 1 and len(steps) == 1 and not dead
    assert steps[0].response_token_ids and len(steps[0].response_token_ids) <= 8  # the tiny policy generated
