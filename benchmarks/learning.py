"""Learning: do the rounds raise the held-out pass rate over the SFT start, and can a comparison of estimators
tell a deliberately broken one from the real ones?

`didpo compare` on the demo's config (the bundled base, the bundled repair curriculum split by program, held
out: unseen programs) with the arms grpo, gigpo, didpo, didpo_did and the control `didpo_flipped` (DiDPO
with every anchor's advantage reversed), several seeds, several rounds, one shared SFT start. It prints, per
arm, the last round's held-out pass rate (mean over seeds with a 95% t interval over seeds) and its
difference from the SFT start, then the line

    learning: sft=<rate> final_didpo=<rate> final_grpo=<rate> final_did=<rate> control=<rate> seeds=<n>

Resumable: the arms are `didpo round` runs under runs/<--id>/ (a killed run picks up where it stopped);
`--quick` is 2 seeds x 2 rounds, a first look. `--set` passes config overrides through.
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
    out: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: (r["estimator"], r["seed"])):
        if r["round"] == last:
            out.setdefault(r["estimator"], []).append(float(r["heldout_pass_rate"]))
    return out


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
    args = ap.parse_args()
    seeds = [0, 1] if args.quick else [int(s) for s in args.seeds.split(",")]
    rounds = 2 if args.quick else args.rounds
    compare_id = f"{args.id}-quick" if args.quick else args.id

    import torch
    from rich.console import Console

    from training.config import load_config
    from workflows.compare import run_compare
    from workflows.rounds import SFT_HELDOUT, describe_held_out

    torch.set_num_threads(1)
    rows = run_compare(args.config, args.overrides, args.estimators.split(","), seeds, rounds, compare_id,
                       jobs=args.jobs, console=Console())
    cfg = load_config(args.config, args.overrides)
    from pipeline.tasks.settings import resolve_tasks

    held = describe_held_out(resolve_tasks(cfg.tasks)[1][: cfg.eval.max_tasks])
    sft = json.loads((Path(cfg.run.root) / compare_id / SFT_HELDOUT).read_text())["metrics"]["pass_rate"]
    finals = final_rates(rows)
    print(f"held out: {held}; SFT start {sft:.3f}; after round {rounds - 1}, mean over {len(seeds)} seeds "
          "[95% t interval over seeds]:")
    for name, values in finals.items():
        mean, lo, hi = seed_interval(values)
        lo, hi = max(lo, 0.0), min(hi, 1.0)  # a rate's interval stays a rate
        d_mean, d_lo, d_hi = seed_interval([v - sft for v in values])
        tag = "  (control: credit reversed)" if name == CONTROL else ""
        print(f"  {name:<14} {mean:.3f} [{lo:.3f}, {hi:.3f}]   vs SFT {d_mean:+.3f} [{d_lo:+.3f}, {d_hi:+.3f}]{tag}")
    print(summary_line(sft, finals, len(seeds)))


if __name__ == "__main__":
    main()
