"""benchmarks/learning.py's arithmetic: the t interval over seeds by hand, the last round's rates per estimator in
seed order, and the closing line naming the control."""

from __future__ import annotations

import pytest
from builders import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("learning", "learning_under_test")


def test_seed_interval_by_hand(bench):
    # mean 0.2, sd 0.1, n 3: t(0.975, 2) = 4.3027, half = 4.3027 * 0.1 / sqrt(3) = 0.2484
    mean, lo, hi = bench.seed_interval([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and lo == pytest.approx(0.2 - 0.24841, abs=1e-4)
    assert hi == pytest.approx(0.2 + 0.24841, abs=1e-4)
    assert bench.seed_interval([0.4]) == (0.4, 0.4, 0.4)


def test_final_rates_take_the_last_round_in_seed_order(bench):
    rows = [{"estimator": e, "seed": s, "round": k, "heldout_pass_rate": 10 * k + s + (100 if e == "grpo" else 0)}
            for e in ("didpo", "grpo") for s in (1, 0) for k in (0, 1)]
    assert bench.final_rates(rows) == {"didpo": [10.0, 11.0], "grpo": [110.0, 111.0]}


def test_the_closing_line_names_every_arm_and_the_control(bench):
    finals = {"didpo": [0.1, 0.3], "grpo": [0.2, 0.2], "didpo_did": [0.0, 0.1], "didpo_flipped": [0.0, 0.0]}
    assert bench.summary_line(0.05, finals, 2) == (
        "learning: sft=0.050 final_didpo=0.200 final_grpo=0.200 final_did=0.050 control=0.000 seeds=2")
    assert "final_did=nan" in bench.summary_line(0.0, {"didpo": [0.0]}, 1)


def test_own_task_gains_are_last_round_minus_round_zero_paired_with_the_control_by_seed(bench):
    rows = [{"estimator": e, "seed": s, "round": k,
             "rollout_pass_rate": 0.4 + k * (0.1 if e == "didpo_did" else -0.05) + 0.01 * s}
            for e in ("didpo_did", "didpo_flipped") for s in (1, 0) for k in (0, 1, 2)]
    rows.append({"estimator": "didpo_did", "seed": 7, "round": 0, "rollout_pass_rate": 0.9})  # unfinished seed
    gains = bench.own_task_gains(rows)
    assert gains["didpo_did"] == {0: pytest.approx(0.2), 1: pytest.approx(0.2)}  # seed 7 has no last round
    assert gains["didpo_flipped"] == {0: pytest.approx(-0.1), 1: pytest.approx(-0.1)}
    assert bench.paired_with(gains, "didpo_flipped") == {"didpo_did": pytest.approx([0.3, 0.3])}
    assert bench.paired_with({"a": {0: 1.0, 3: 5.0}, "c": {0: 0.5, 1: 9.0}}, "c") == {"a": [0.5]}  # common seeds
    assert bench.paired_with(gains, "absent") == {}
    assert bench.by_round(rows, "rollout_pass_rate")["didpo_did"][0] == {
        1: pytest.approx(0.41), 0: pytest.approx(0.4), 7: pytest.approx(0.9)}


def test_a_signed_interval_is_not_clipped_to_a_rate(bench):
    assert bench.fmt_interval([-0.2, -0.1], signed=True).startswith("-0.150 [")
    assert bench.fmt_interval([0.0, 0.1]).startswith("0.050 [0.000,")


def test_curve_means_average_every_round_of_a_seed_that_has_them_all(bench):
    rows = [{"estimator": e, "seed": s, "round": k, "heldout_pass_rate": k / 10 + s / 100 + (0.5 if e == "c" else 0)}
            for e in ("a", "c") for s in (0, 1) for k in (0, 1, 2, 3)]
    rows.append({"estimator": "a", "seed": 9, "round": 0, "heldout_pass_rate": 1.0})  # unfinished: left out
    means = bench.curve_means(rows, "heldout_pass_rate")
    assert means["a"] == {0: pytest.approx(0.15), 1: pytest.approx(0.16)}  # mean of 0, .1, .2, .3 (+ seed/100)
    assert bench.curve_means(rows, "heldout_pass_rate", first=2)["a"] == {0: pytest.approx(0.25), 1: pytest.approx(0.26)}
    # a lucky last round moves the last-round figure by its whole size, the curve's mean by a quarter of it
    lucky = [dict(r, heldout_pass_rate=r["heldout_pass_rate"] + (0.4 if r["round"] == 3 else 0)) for r in rows]
    assert bench.curve_means(lucky, "heldout_pass_rate")["a"][0] == pytest.approx(0.25)
    assert bench.paired_with(means, "c") == {"a": [pytest.approx(-0.5), pytest.approx(-0.5)]}
    with pytest.raises(ValueError, match="first round 4 is past the last round 3"):
        bench.curve_means(rows, "heldout_pass_rate", first=4)


def test_an_arm_line_pairs_with_the_control_only_when_it_has_paired_seeds(bench):
    line = bench.arm_line("didpo_did", [0.5, 0.6], 0.4, [0.1, 0.1])
    assert line.startswith("  didpo_did      0.550 [") and "vs SFT +0.150 [" in line
    assert "vs control +0.100 [+0.100, +0.100]" in line and "control:" not in line
    assert "vs control" not in bench.arm_line("grpo", [0.5], 0.4, [])
    assert bench.arm_line("didpo_flipped", [0.4], 0.4, []).endswith("(control: credit reversed)")


def _finished_comparison(root, recorded: str | None):
    """runs/cmp as `didpo compare` leaves it: the table, the SFT start's check and (when given) config.yaml."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.config import to_yaml
    from training.config import load_config

    cmp = root / "cmp"
    cmp.mkdir(parents=True)
    rows = [{"arm": f"{e}-seed{s}", "estimator": e, "seed": s, "round": k, "heldout_pass_rate": 0.1 * s,
             "heldout_invalid_rate": 0.0, "rollout_pass_rate": 0.2} for e in ("didpo_did", "didpo_flipped")
            for s in (0, 1) for k in (0, 1)]
    pq.write_table(pa.Table.from_pylist(rows), cmp / "compare.parquet")
    (cmp / "sft_heldout.json").write_text(json.dumps({"metrics": {"pass_rate": 0.05, "invalid_rate": 0.1}}))
    if recorded:
        (cmp / "config.yaml").write_text(to_yaml(load_config(None, [f"run.root={root}", recorded])))
    return cmp


@pytest.mark.parametrize("recorded", [None, "tasks.train=[{source: mbpp, split: train, limit: 3}]"])
def test_report_describes_a_comparison_by_the_config_it_recorded(bench, tmp_path, monkeypatch, capsys, recorded):
    """`--report` labels the rounds' tasks by the settings the comparison ran with (its config.yaml), not by the
    defaults of the day; a comparison from before configs were recorded is labelled by the config given, and
    says so."""
    _finished_comparison(tmp_path, recorded)
    monkeypatch.setattr("sys.argv", ["learning.py", "--report", "--id", "cmp", "--set", f"run.root={tmp_path}"])
    bench.main()
    out = capsys.readouterr().out
    assert "learning: sft=0.050" in out and "seeds=2" in out
    if recorded:  # the --set that located it does not relabel it, and the report says so
        assert "the same 3 every round" in out and "only located it" in out
    else:  # today's default: a batch of each round drawn from the training side
        assert "drawn afresh each round" in out and "records no config.yaml" in out


def test_ranking_names_a_leader_only_when_it_is_told_apart_from_every_other_real_arm(bench):
    """The control never ranks; the first arm leads only when each seed-paired gap has an interval above zero."""
    apart = {"didpo_did": {0: 0.50, 1: 0.52, 2: 0.51}, "grpo": {0: 0.40, 1: 0.41, 2: 0.41},
             "didpo_flipped": {0: 0.90, 1: 0.90, 2: 0.90}}
    line = bench.ranking(apart)
    assert line.startswith("didpo_did 0.510 > grpo 0.407: didpo_did leads;") and "didpo_flipped" not in line
    assert "didpo_did - grpo +0.103 [" in line
    close = {"didpo_did": {0: 0.50, 1: 0.40, 2: 0.52}, "grpo": {0: 0.45, 1: 0.46, 2: 0.44}}
    assert "not separated (an order of means only)" in bench.ranking(close)
    assert bench.ranking({"grpo": {0: 0.4}, "didpo_flipped": {0: 0.3}}) == ""


def test_a_report_without_a_control_arm_promises_no_comparison_with_it(bench, capsys):
    rows = [{"estimator": e, "seed": s, "round": k, "heldout_pass_rate": 0.3 + 0.1 * k + (0.05 if e == "grpo" else 0),
             "heldout_invalid_rate": 0.0, "rollout_pass_rate": 0.2 + 0.01 * s} for e in ("didpo_did", "grpo")
            for s in (0, 1) for k in (0, 1)]
    bench.report(rows, 0.25, "2 unseen programs")
    out = capsys.readouterr().out
    assert "control" not in out.replace("control=nan", "")
    assert "ranking of the real arms, held out averaged over rounds 0-1: grpo 0.400 > didpo_did 0.350: grpo leads" in out
