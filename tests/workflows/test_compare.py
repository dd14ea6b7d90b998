"""`didpo compare`: estimator arms x seeds from one shared SFT start, summarized over seeds."""

from __future__ import annotations

import json
import math
import os

import pyarrow.csv as pacsv
import pytest
from rich.console import Console

from pipeline.run import policy_version
from pipeline.schema import read_table
from training.config import load_config
from workflows.compare import METRICS, arm_pool, run_compare, summarize, summary_html, write_report


def _row(est, seed, k, **values):
    base = {name: 0.0 for name, _, _ in METRICS}
    return {"arm": f"{est}-seed{seed}", "seed": seed, "estimator": est, "round": k, **base, **values}


def test_summary_is_mean_and_sd_over_seeds_per_estimator_and_round():
    rows = [_row("didpo", 0, 0, heldout_pass_rate=0.2), _row("didpo", 1, 0, heldout_pass_rate=0.4),
            _row("didpo", 2, 0, heldout_pass_rate=float("nan")), _row("grpo", 0, 0, heldout_pass_rate=0.5),
            _row("didpo", 0, 1, mean_return=-0.1)]
    summary = {(s["estimator"], s["round"]): s for s in summarize(rows)}
    assert set(summary) == {("didpo", 0), ("didpo", 1), ("grpo", 0)}
    d0 = summary[("didpo", 0)]
    assert d0["seeds"] == 3
    assert d0["heldout_pass_rate_mean"] == pytest.approx(0.3)  # the NaN seed is left out of the mean
    assert d0["heldout_pass_rate_sd"] == pytest.approx(math.sqrt(0.02))
    assert math.isnan(summary[("grpo", 0)]["heldout_pass_rate_sd"])  # one seed: no spread
    assert summary[("didpo", 1)]["mean_return_mean"] == pytest.approx(-0.1)
    page = summary_html(summarize(rows))
    assert "0.30 ± 0.14" in page and "Estimator comparison" in page


def test_unknown_estimator_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="unknown estimator"):
        run_compare(None, [f"run.root={tmp_path}"], ["didpo", "nope"], [0], 1, "cmp", console=Console(quiet=True))
    assert not (tmp_path / "cmp").exists()


def test_each_arm_runs_in_a_process_of_its_own():
    """Three arms, two at a time: no worker is reused (a reused one kept the previous arm's process group, and
    the third arm's update failed for want of a rendezvous)."""
    with arm_pool(2) as pool:
        pids = [f.result() for f in [pool.submit(os.getpid) for _ in range(3)]]
    assert len(set(pids)) == 3 and os.getpid() not in pids


@pytest.mark.slow
def test_arms_share_one_cold_start_and_write_table_summary_and_report(tmp_path, tiny_policy):
    overrides = [
        f"run.root={tmp_path}", f"policy.checkpoint={tiny_policy}", "policy.size=tiny", "policy.max_new_tokens=16",
        "episode.max_turns=1", "episode.max_response_tokens=512", "pipeline.samples_per_task=2",
        "tasks.train=[{source: mbpp, split: train, limit: 2}]", "tasks.eval=[{source: humanevalfix, limit: 1}]",
        "sandbox.pool_size=1", "eval.max_tasks=1", "train.max_tokens_per_batch=8192",
        "sft.tasks={train: [{source: mbpp, split: train, limit: 3}], eval: [{source: mbpp, split: validation, limit: 1}]}",
        "sft.max_steps=1", "sft.warmup_steps=0", "sft.rl_task_episodes=1",
    ]
    # two arms at a time, in spawned processes (`didpo compare --jobs 2`, benchmarks/learning.py)
    rows = run_compare(None, overrides, ["didpo", "grpo"], [0, 1], 1, "cmp", jobs=2, console=Console(quiet=True))
    cmp = tmp_path / "cmp"
    assert sorted(r["arm"] for r in rows) == ["didpo-seed0", "didpo-seed1", "grpo-seed0", "grpo-seed1"]
    assert {r["estimator"] for r in rows if r["arm"].startswith("grpo")} == {"grpo"}
    assert len(list(cmp.glob("*/sft"))) == 0 and (cmp / "sft" / "sft_report.json").is_file()  # one shared SFT
    start = json.loads((cmp / "sft_heldout.json").read_text())["metrics"]  # measured once, as each round is
    assert start["tasks"] == 1 and 0.0 <= start["pass_rate"] <= 1.0
    assert not list(cmp.glob("*-seed*/sft_heldout.json"))  # the arms do not measure it again
    starts = {json.loads((cmp / r["arm"] / "round=0" / "manifest.json").read_text())["policy_checkpoint"]
              for r in rows}
    assert starts == {policy_version(cmp / "sft")}  # every arm starts from the shared cold start
    seeds = {r["arm"]: json.loads((cmp / r["arm"] / "round=0" / "manifest.json").read_text())["seeds"]["root"]
             for r in rows}
    assert seeds == {"didpo-seed0": 0, "didpo-seed1": 1, "grpo-seed0": 0, "grpo-seed1": 1}
    def responses(arm):
        steps = read_table(cmp / arm / "round=0" / "steps", "steps")
        return sorted(zip(steps["task_id"].to_pylist(), steps["turn"].to_pylist(),
                          steps["response_text"].to_pylist(), strict=True))

    # common random numbers: same seed and starting policy -> the same round-0 rollouts whatever the estimator
    assert responses("didpo-seed0") == responses("grpo-seed0")
    assert responses("didpo-seed0") != responses("didpo-seed1")
    table = pacsv.read_csv(cmp / "compare.csv").to_pylist()
    assert len(table) == 4
    # the settings the arms shared, beside their table: a later reader need not guess them
    assert load_config(cmp / "config.yaml") == load_config(None, overrides)
    summary = json.loads((cmp / "compare_summary.json").read_text())
    assert {(s["estimator"], s["seeds"]) for s in summary} == {("didpo", 2), ("grpo", 2)}
    page = write_report(rows, cmp)
    text = page.read_text()
    assert "Estimator comparison" in text and (cmp / "report" / "compare.png").stat().st_size > 1000
