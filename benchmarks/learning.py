"""Learning: do the rounds raise the held-out pass rate over the SFT start, and can a comparison of estimators
tell a deliberately broken one from the real ones?

`didpo compare` on the demo's config (the bundled base, the bundled repair curriculum split by program, held
out: unseen programs) with the arms grpo, gigpo, didpo, didpo_did and the control `didpo_flipped` (DiDPO
with every anchor's advantage reversed), several seeds, several rounds, one shared SFT start. It prints, per
arm, the held-out pass rate after every round (mean over seeds with a 95% t interval over seeds), the last
round's difference from the SFT start and from the control seed by seed, the same for the average over every
round (so that one round's luck cannot decide), the same for the rollout pass rate
on the rounds' own tasks (trained on: in-distribution, labelled so), the real arms ranked on both (the first
"leads" only when its seed-paired interval against every other real arm is above zero), then the line

    learning: sft=<rate> final_didpo=<rate> final_grpo=<rate> final_did=<rate> control=<rate> seeds=<n>

Resumable: the arms are `didpo round` runs under runs/<--id>/ (a killed run picks up where it stopped);
`--quick` is 2 seeds x 2 rounds, a first look. `--set` passes config overrides through; `--report`
prints the report of a comparison already run (its compare.parquet, described by the config.yaml recorded
beside it, whatever the defaults are today) without running anything.
Run: `.venv/bin/python benchmarks/learning.py [--quick] [--seeds 0,1,2,3,4 --rounds 4 --jobs 2]`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = ("grpo", "gigpo", "didpo", "didpo_did", "didpo_flipped")
CONTROL = "didpo_flipped"


def seed_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t interval of the mean over seeds (the mean itself for one seed)."""
    from scipy.stats import t

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def final_rates(rows: list[dict]) -> dict[str, list[float]]:
    """Each estimator's held-out pass rate after its last round, one value per seed (seed order)."""
    last = max(r["round"] for r in rows)
    return {est: [v for _, v in sorted(c[last].items())]
            for est, c in by_round(rows, "heldout_pass_rate").items() if last in c}


def by_round(rows: list[dict], metric: str) -> dict[str, dict[int, dict[int, float]]]:
    """metric per estimator, round and seed."""
    out: dict[str, dict[int, dict[int, float]]] = {}
    for r in rows:
        out.setdefault(r["estimator"], {}).setdefault(r["round"], {})[r["seed"]] = float(r[metric])
    return dict(sorted(out.items()))


def own_task_gains(rows: list[dict]) -> dict[str, dict[int, float]]:
    """Per estimator and seed: the rollout pass rate of the last round minus round 0's. Both are fresh samples
    on the rounds' own tasks, so the difference is what the updates before the last round did to the tasks
    they trained on (in-distribution, not held out)."""
    last = max(r["round"] for r in rows)
    curves = by_round(rows, "rollout_pass_rate")
    return {est: {s: c[last][s] - c[0][s] for s in sorted(c.get(0, {}).keys() & c.get(last, {}).keys())}
            for est, c in curves.items()}


def curve_means(rows: list[dict], metric: str, first: int = 0) -> dict[str, dict[int, float]]:
    """Per estimator and seed: metric averaged over rounds `first`..last, for the seeds that have every one of
    them. Every round's measurement counts, so one lucky or unlucky last round cannot decide a comparison."""
    last = max(r["round"] for r in rows)
    if first > last:
        raise ValueError(f"curve_means: first round {first} is past the last round {last}")
    out = {}
    for est, curve in by_round(rows, metric).items():
        seeds = set.intersection(*(set(curve.get(k, {})) for k in range(first, last + 1)))
        out[est] = {s: statistics.fmean(curve[k][s] for k in range(first, last + 1)) for s in sorted(seeds)}
    return out


def paired_with(values: dict[str, dict[int, float]], control: str) -> dict[str, list[float]]:
    """Each estimator's values minus the control's, seed by seed, over the seeds both have (the arms share
    seeds and the SFT start)."""
    if control not in values:
        return {}
    ctl = values[control]
    return {est: [v[s] - ctl[s] for s in sorted(v.keys() & ctl.keys())]
            for est, v in values.items() if est != control}


def fmt_interval(values: list[float], signed: bool = False) -> str:
    mean, lo, hi = seed_interval(values)
    if not signed:  # a rate's interval stays a rate
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(mean)} [{f.format(lo)}, {f.format(hi)}]"


def arm_line(name: str, values: list[float], sft: float, vs_control: list[float]) -> str:
    """One arm's row: its rate over seeds, its gain over the SFT start and, when paired, its gain over the
    control seed by seed."""
    ctl = f"   vs control {fmt_interval(vs_control, True)}" if vs_control else ""
    tag = "  (control: credit reversed)" if name == CONTROL else ""
    return (f"  {name:<14} {fmt_interval(values)}   vs SFT {fmt_interval([v - sft for v in values], True)}"
            f"{ctl}{tag}")


def ranking(values: dict[str, dict[int, float]], control: str = CONTROL) -> str:
    """The real arms (not the control) ordered by their mean over seeds, and whether the first is told apart:
    it leads only when its difference from every other real arm, paired by seed, has a 95% t interval above
    zero; otherwise the order is an order of means only. '' with fewer than two real arms."""
    real = {e: v for e, v in values.items() if e != control and v}
    if len(real) < 2:
        return ""
    order = sorted(real, key=lambda e: -statistics.fmean(real[e].values()))
    top = order[0]
    behind = paired_with(real, top)  # each other arm minus the first, seed by seed
    gaps = {e: [-d for d in behind[e]] for e in order[1:]}
    leads = all(len(g) >= 2 and seed_interval(g)[1] > 0 for g in gaps.values())
    means = " > ".join(f"{e} {statistics.fmean(real[e].values()):.3f}" for e in order)
    verdict = f"{top} leads" if leads else "not separated (an order of means only)"
    pairs = "   ".join(f"{top} - {e} {fmt_interval(g, True)}" for e, g in gaps.items() if g)
    return f"{means}: {verdict}; {pairs}"


def summary_line(sft: float, finals: dict[str, list[float]], seeds: int) -> str:
    def rate(name: str) -> str:
        return f"{statistics.fmean(finals[name]):.3f}" if name in finals else "nan"

    return (f"learning: sft={sft:.3f} final_didpo={rate('didpo')} final_grpo={rate('grpo')} "
            f"final_did={rate('didpo_did')} control={rate(CONTROL)} seeds={seeds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--estimators", default=",".join(ARMS))
    ap.add_argument("--jobs", type=int, default=2, help="arms at once, one process each")
    ap.add_argument("--quick", action="store_true", help="2 seeds x 2 rounds")
    ap.add_argument("--id", default="learning", help="folder under run.root")
    ap.add_argument("--config", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--report", action="store_true", help="print the report of the comparison already under "
                    "runs/<--id>/ (compare.parquet), run nothing")
    args = ap.parse_args()
    seeds = [0, 1] if args.quick else [int(s) for s in args.seeds.split(",")]
    rounds = 2 if args.quick else args.rounds
    compare_id = f"{args.id}-quick" if args.quick else args.id

    import pyarrow.parquet as pq
    import torch
    from rich.console import Console

    from pipeline.tasks.settings import resolve_tasks, round_tasks
    from training.config import load_config
    from workflows.compare import CONFIG, run_compare
    from workflows.rounds import SFT_HELDOUT, describe_held_out

    cfg = load_config(args.config, args.overrides)
    compare_dir = Path(cfg.run.root) / compare_id
    if args.report:  # a finished comparison's table, nothing run
        table = compare_dir / "compare.parquet"
        if not table.is_file():
            sys.exit(f"no comparison at {compare_dir}: run it first (without --report)")
        rows = pq.read_table(table).to_pylist()
        if (compare_dir / CONFIG).is_file():  # labelled by the settings that made the table, not today's
            cfg = load_config(compare_dir / CONFIG)
            if args.overrides or args.config:
                print(f"note: described by {compare_dir / CONFIG}, the settings it ran with; --config and --set "
                      "only located it")
        else:
            print(f"note: {compare_dir} records no {CONFIG} (written before comparisons kept theirs): labelled "
                  "by the config given here")
    else:
        torch.set_num_threads(1)
        rows = run_compare(args.config, args.overrides, args.estimators.split(","), seeds, rounds, compare_id,
                           jobs=args.jobs, console=Console())
    train, held_out = resolve_tasks(cfg.tasks)
    held = describe_held_out(held_out[: cfg.eval.max_tasks])
    start = json.loads((compare_dir / SFT_HELDOUT).read_text())["metrics"]
    batch = len(round_tasks(train, 0, cfg.tasks.per_round, cfg.run.seed))  # the rounds' one rule for a batch
    rounds_see = (f"the rounds' own tasks (the same {len(train)} every round: trained on, in-distribution)"
                  if batch == len(train) else
                  f"each round's own batch ({batch} tasks drawn afresh each round from {len(train)} "
                  "training tasks: new to the updates until an epoch ends, seen by the SFT; in-distribution; "
                  "rounds differ in tasks, arms of a seed share them)")
    report(rows, start["pass_rate"], held, sft_invalid=start.get("invalid_rate", float("nan")), rounds_see=rounds_see)


def report(rows: list[dict], sft: float, held: str, sft_invalid: float = float("nan"),
           rounds_see: str = "the rounds' own tasks (trained on, in-distribution)") -> None:
    """The comparison's tables; rounds and seeds are read from the rows (a partial comparison included)."""
    seeds, rounds = sorted({r["seed"] for r in rows}), max(r["round"] for r in rows) + 1
    finals = final_rates(rows)
    held_curve = by_round(rows, "heldout_pass_rate")
    print(f"held out: {held}; SFT start {sft:.3f}. Held-out pass rate after each round's update, mean over "
          f"{len(seeds)} seeds [95% t interval over seeds]:")
    for name, curve in held_curve.items():
        print(f"  {name:<14} " + "   ".join(f"r{k} {fmt_interval(list(v.values()))}" for k, v in sorted(curve.items())))
    has_control = CONTROL in held_curve  # without a control arm the rows carry no vs-control column
    vs = f", and vs the control ({CONTROL}) seed by seed" if has_control else ""
    print(f"after round {rounds - 1}: vs the SFT start{vs}:")
    last = rounds - 1  # an arm not there yet (a partial comparison) is not paired
    vs_control = paired_with({e: c.get(last, {}) for e, c in held_curve.items()}, CONTROL)
    for name, values in finals.items():
        print(arm_line(name, values, sft, vs_control.get(name, [])))
    means = curve_means(rows, "heldout_pass_rate")
    means_vs_control = paired_with(means, CONTROL)
    print(f"averaged over rounds 0-{rounds - 1} (every held-out evaluation of a seed, not only the last), vs the SFT "
          f"start{vs}:")
    for name, values in means.items():
        if values:
            print(arm_line(name, list(values.values()), sft, means_vs_control.get(name, [])))
    if order := ranking(means):
        print(f"  ranking of the real arms, held out averaged over rounds 0-{rounds - 1}: {order}")
    invalid = by_round(rows, "heldout_invalid_rate")
    print(f"held-out invalid-action rate (malformed or truncated, or a search text not found once in the file) after round {rounds - 1}; "
          f"SFT start {sft_invalid:.3f}:")
    print("  " + "   ".join(f"{name} {fmt_interval(list(c[max(c)].values()))}" for name, c in invalid.items()))
    gains = own_task_gains(rows)
    own = by_round(rows, "rollout_pass_rate")
    gains_vs_control = paired_with(gains, CONTROL)
    print(f"{rounds_see}: rollout pass rate in round 0 and round "
          f"{rounds - 1} (after {rounds - 1} update(s)), the gain{' and the gain vs the control seed by seed' if has_control else ''}:")
    for name, values in gains.items():
        if not values:
            continue
        curve = own[name]
        ctl = f"   vs control {fmt_interval(gains_vs_control[name], True)}" if gains_vs_control.get(name) else ""
        print(f"  {name:<14} {statistics.fmean(curve[0].values()):.3f} -> "
              f"{statistics.fmean(curve[max(curve)].values()):.3f}   gain {fmt_interval(list(values.values()), True)}{ctl}")
    # round 0's rollouts precede every update, so the updated rounds are 1..last
    updated = curve_means(rows, "rollout_pass_rate", first=1) if rounds > 1 else {}
    updated_vs_control = paired_with(updated, CONTROL)
    if any(updated_vs_control.values()):
        print(f"  rollout pass rate averaged over rounds 1-{rounds - 1}, vs the control seed by seed: "
              + "   ".join(f"{name} {fmt_interval(v, True)}" for name, v in updated_vs_control.items() if v))
    if order := ranking(updated):
        print(f"  ranking of the real arms, rollout pass rate averaged over rounds 1-{rounds - 1}: {order}")
    print(summary_line(sft, finals, len(seeds)))


if __name__ == "__main__":
    main()
