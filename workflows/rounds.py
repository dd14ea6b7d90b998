"""`didpo round`: the loop that makes it RL. Policy k -> pipeline -> update -> policy k+1 -> ...

1. Start from the configured checkpoint (built offline when missing); SFT it once on successful episodes
   of the training tasks when `sft.enabled` (a cold start that teaches the action grammar).
2. For each round k: the Beam pipeline with policy k writes runs/<run_id>/round=<k>/ tables.
3. The trainer updates policy k on that round's advantages into round=<k>/policy (= policy k+1). A round with
   nothing to train (no row with a non-zero advantage) writes no policy: policy k carries over as policy k+1,
   and the manifest's train stage records why (`nothing_to_train`), which `round_policy` follows.
4. A quick held-out evaluation of policy k+1 (same episodes and sandbox, greedy).
5. Every stage is recorded in the round's manifest with the inputs it read (pipeline/run.py `ROUND_STAGES`):
   a rerun resumes where it stopped, and refuses a completed stage whose inputs changed; eval, which nothing
   downstream reads, is measured again instead.
The estimator and lambda come from the config, so the same command runs GRPO, GiGPO or DiDPO arms.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
from rich.console import Console
from rich.table import Table

from pipeline import schema
from pipeline.storage import Location, local_copy, location, output_folder, work_dir, write_file
from training.config import DidpoConfig


@dataclass
class RoundRow:
    """One line of the per-round table."""

    round: int
    estimator: str
    lam: float
    mean_return: float  # mean episode return of the round's finished rollouts
    rollout_pass_rate: float  # hidden tests, rollouts of training tasks (lost rollouts count as not passing)
    rollouts: int  # rollouts started, lost ones included
    lost_to_sandbox: int  # rollouts dead-lettered at the sandbox retry cap
    invalid_rate: float  # invalid actions among the round's steps
    anchors: int
    coverage: float  # changed-code tokens that received a diff-level advantage
    mixed_groups: float  # task groups with differing outcomes
    loss: float  # mean training loss of the update
    approx_kl: float  # mean approx KL(old || new) over the update
    heldout_pass_rate: float  # policy k+1 on held-out tasks
    heldout_invalid_rate: float
    pipeline_s: float
    train_s: float
    eval_s: float
    no_update: str = ""  # "nothing to train: <reason>; policy unchanged (<path>)"; "" when the update trained


def run_rounds(cfg: DidpoConfig, rounds: int | None = None, console: Console | None = None) -> list[RoundRow]:
    from pipeline.config import config_hash
    from pipeline.evaluation import quick_eval
    from pipeline.run import (
        STAGES,
        changed_inputs,
        check_stage,
        complete_stage,
        policy_version,
        resolve_policy,
        run_round,
        stage_inputs,
    )
    from pipeline.tasks.settings import resolve_tasks
    from training.trainer import train_round
    from workflows.summary import round_summary, unchanged_policy_text

    console = console or Console()
    rounds = rounds or cfg.run.rounds
    run_dir = location(cfg.run.root) / cfg.run.run_id
    train_tasks, eval_tasks = resolve_tasks(cfg.tasks)
    policy = resolve_policy(cfg.policy)
    policy_at = cold_start(cfg, policy, eval_tasks, run_dir, console)  # where policy k is (shown, recorded)
    policy = local_copy(policy_at)  # one download per policy
    # train.kl_coef's frozen reference is the rounds' starting policy for the whole run, as OpenRLHF's and
    # verl's reference is the initial actor: a reference that moved with every round would let the drift add up
    reference = policy
    baseline = sft_baseline(cfg, policy, train_tasks, eval_tasks, run_dir) if cfg.sft.enabled else None
    rows = []
    for k in range(rounds):
        console.rule(f"round {k}")
        result = run_round(cfg, k, policy, train_tasks)
        manifest, round_dir = result.manifest, result.round_dir
        inputs, chash = stage_inputs(cfg, version=policy_version(policy), tasks=result.tasks,
                                     eval_tasks=eval_tasks), config_hash(cfg)
        check_stage(manifest, round_dir, "train", inputs["train"], chash)
        summary = round_summary(round_dir)
        out = round_dir / "policy"
        nothing = manifest.stages.get("train", {}).get("nothing_to_train")
        steps = []
        if nothing is None:  # a recorded "nothing to train" is not decided again (the manifest is the record)
            start = time.perf_counter()
            report = train_round(round_dir, policy, out, cfg.train, reference_checkpoint=reference)
            nothing, steps = report.nothing_to_train, report.steps
            if not manifest.stage_done("train"):
                carried = {"nothing_to_train": nothing, "policy": str(policy_at)} if nothing else {}
                complete_stage(manifest, round_dir, "train", time.perf_counter() - start, inputs["train"],
                               steps=report.steps_done, counts=report.counts, **carried)
        no_update = unchanged_policy_text(nothing, str(policy_at)) if nothing else ""
        if nothing:
            console.print(f"round {k}: {no_update}")
        else:  # policy k+1 is this round's update; else policy k carries over, not copied
            policy_at = round_policy(cfg, k + 1)  # = out
            policy = local_copy(policy_at)  # its local copy under an object-store root
        # eval is a leaf (nothing downstream reads its metrics): changed eval inputs measure again, not refuse
        if not manifest.stage_done("eval") or changed_inputs(manifest, "eval", inputs["eval"], chash):
            start = time.perf_counter()
            metrics = quick_eval(policy, eval_tasks, cfg)
            complete_stage(manifest, round_dir, "eval", time.perf_counter() - start, inputs["eval"],
                           metrics=metrics)
        evaluation = manifest.stages["eval"]["metrics"]
        stage_s = {name: float(v.get("seconds", 0.0)) for name, v in manifest.stages.items()}
        losses = [s.loss for s in steps]
        kls = [s.approx_kl for s in steps]
        rows.append(RoundRow(
            round=k, estimator=cfg.credit.estimator, lam=cfg.credit.lam, mean_return=summary.mean_return,
            rollout_pass_rate=summary.pass_rate, rollouts=summary.rollouts, lost_to_sandbox=summary.lost_to_sandbox,
            invalid_rate=summary.invalid_rate, anchors=summary.anchors,
            coverage=summary.coverage, mixed_groups=summary.mixed_groups,
            loss=statistics.fmean(losses) if losses else float("nan"),
            approx_kl=statistics.fmean(kls) if kls else float("nan"),
            heldout_pass_rate=evaluation["pass_rate"], heldout_invalid_rate=evaluation["invalid_rate"],
            pipeline_s=sum(stage_s.get(s, 0.0) for s in STAGES),
            train_s=stage_s.get("train", 0.0), eval_s=stage_s.get("eval", 0.0), no_update=no_update,
        ))
    write_rounds_table(rows, run_dir)
    print_rounds_table(rows, console, baseline, held_out=describe_held_out(eval_tasks[: cfg.eval.max_tasks]))
    return rows


SFT_HELDOUT = "sft_heldout.json"  # <run>/sft_heldout.json: the cold start's held-out metrics and their inputs


def sft_baseline(cfg: DidpoConfig, policy: Path, train_tasks, eval_tasks, run_dir: Location) -> dict[str, float]:
    """The SFT policy's held-out metrics (the rounds' own quick evaluation, what the rounds must beat),
    measured once for the same eval inputs and kept in `run_dir` beside the rounds (not in the policy folder,
    whose files are its version). `didpo round` and `didpo compare` both read it from here."""
    from pipeline.evaluation import quick_eval
    from pipeline.run import policy_version, stage_inputs

    inputs = stage_inputs(cfg, version=policy_version(policy), tasks=train_tasks, eval_tasks=eval_tasks)["eval"]
    path = run_dir / SFT_HELDOUT
    if path.exists():
        record = json.loads(path.read_text())
        if record.get("inputs") == inputs:
            return record["metrics"]
    start = time.perf_counter()
    metrics = quick_eval(policy, eval_tasks, cfg) | {"seconds": time.perf_counter() - start}
    text = json.dumps({"inputs": inputs, "metrics": metrics}, indent=2, sort_keys=True) + "\n"
    write_file(path, lambda tmp: Path(tmp).write_text(text))
    return metrics


def describe_held_out(tasks) -> str:
    """What the held-out pass rate measures, for every table that shows it: count, sources and, for minted
    repair tasks, which split (unseen programs, or unseen bugs of training programs)."""
    sources = sorted({t.source for t in tasks})
    splits = sorted({t.meta.get("split_by") for t in tasks if t.meta.get("split_by")})
    kind = {"program": "unseen programs", "instance": "unseen bugs of training programs (in-distribution)"}
    where = f"; {', '.join(kind.get(s, s) for s in splits)}" if splits else ""
    return f"{len(tasks)} {'/'.join(sources)} tasks{where}"


SFT_DIR = "sft"  # <run>/sft: the cold-started policy 0


def round_policy(cfg: DidpoConfig, k: int) -> Location | None:
    """The policy round k samples with, the one rule `didpo round`, `didpo compare` and the Airflow DAG follow:
    round k-1's update (round=<k-1>/policy), or round k-1's own policy when its manifest records that it had
    nothing to train; for k = 0 the SFT cold start (<run>/sft) when sft.enabled, else
    None: the configured `policy.checkpoint` (`pipeline.run.resolve_policy`). Raises ValueError naming what to
    run first when that policy does not exist yet."""
    run_dir = location(cfg.run.root) / cfg.run.run_id
    if k > 0:
        if trained_nothing(run_dir / f"round={k - 1}"):
            return round_policy(cfg, k - 1)  # carried over unchanged: no policy folder was written
        policy = run_dir / f"round={k - 1}" / "policy"
        if not policy.is_dir():
            raise ValueError(f"round {k} samples with {policy}, which does not exist: run round {k - 1} first")
        return policy
    if not cfg.sft.enabled:
        return None
    policy = run_dir / SFT_DIR
    if not policy.is_dir():
        raise ValueError(f"sft.enabled: cold-start the policy first (`didpo sft --out {policy}`), "
                         "or set sft.enabled=false")
    return policy


def trained_nothing(round_dir: Location) -> str | None:
    """Why `round_dir`'s update trained nothing, as its manifest's train stage records it; None when it trained
    (or has not run)."""
    if not (round_dir / schema.MANIFEST_NAME).exists():
        return None
    return schema.read_manifest(round_dir).stages.get("train", {}).get("nothing_to_train")


def cold_start(cfg: DidpoConfig, policy: Path, eval_tasks, run_dir: Location, console: Console) -> Location:
    """The SFT'd policy when `sft.enabled`, else `policy` unchanged (idempotent: a finished SFT is reused)."""
    if not cfg.sft.enabled:
        return policy
    from training.sft import REPORT_NAME, run_cold_start

    out = run_dir / SFT_DIR
    staged = work_dir(out)
    if not isinstance(out, Path) and (out / REPORT_NAME).exists() and not (staged / REPORT_NAME).exists():
        shutil.copytree(local_copy(out), staged, dirs_exist_ok=True)  # finished in the bucket: checked, not redone
    with output_folder(out, last=(REPORT_NAME,)) as local:  # an object-store run: SFT locally, then upload
        report = run_cold_start(cfg, policy, local, eval_tasks)
    valid = report.evaluation["valid_rate"] if report.evaluation else float("nan")
    console.print(f"[bold]SFT[/] {out}: {report.n_examples} demonstrations, {report.total_steps} steps, loss "
                  f"{report.first_loss:.2f} -> {report.final_loss:.2f}; held-out valid-action rate {valid:.2f}")
    return out


def write_rounds_table(rows: list[RoundRow], run_dir: Location) -> None:
    """runs/<run_id>/rounds.parquet and rounds.csv: one line per round."""
    if not rows:
        return
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([r.__dict__ for r in rows])
    text = json.dumps([r.__dict__ for r in rows], indent=2) + "\n"
    schema.atomic_write(run_dir / "rounds.parquet", lambda tmp: pq.write_table(table, tmp))
    schema.atomic_write(run_dir / "rounds.csv", lambda tmp: pacsv.write_csv(table, tmp))
    schema.atomic_write(run_dir / "rounds.json", lambda tmp: Path(tmp).write_text(text))


def print_rounds_table(rows: list[RoundRow], console: Console, baseline: dict[str, float] | None = None,
                       held_out: str = "") -> None:
    """One column per round, one line per metric: readable at any terminal width. `baseline` (the SFT
    policy's held-out metrics) adds a first column, so each round's held-out pass rate sits beside it."""
    lines = [("mean return (rollouts)", "mean_return", "{:+.3f}"),
             ("pass rate (rollouts, lost = not passed)", "rollout_pass_rate", "{:.2f}"),
             ("rollouts", "rollouts", "{}"), ("lost to sandbox failures", "lost_to_sandbox", "{}"),
             ("invalid-action rate", "invalid_rate", "{:.2f}"), ("anchors", "anchors", "{}"),
             ("coverage of changed code", "coverage", "{:.2f}"), ("mixed-outcome groups", "mixed_groups", "{:.2f}"),
             ("update loss", "loss", "{:+.4f}"), ("approx KL", "approx_kl", "{:.2e}"),
             ("held-out pass rate", "heldout_pass_rate", "{:.2f}"),
             ("held-out invalid rate", "heldout_invalid_rate", "{:.2f}"), ("pipeline s", "pipeline_s", "{:.0f}"),
             ("train s", "train_s", "{:.0f}"), ("eval s", "eval_s", "{:.0f}")]
    est = rows[0] if rows else None
    title = f"policy rounds ({est.estimator}, lambda {est.lam})" if est else "policy rounds"
    table = Table(title=title, caption=f"held out: {held_out}" if held_out else None)
    table.add_column("metric")
    if baseline is not None:
        table.add_column("SFT start", justify="right")
    for r in rows:
        table.add_column(f"round {r.round}", justify="right")
    from_baseline = {"heldout_pass_rate": "pass_rate", "heldout_invalid_rate": "invalid_rate", "eval_s": "seconds"}
    for label, name, fmt in lines:
        cells = ["-" if v != v else fmt.format(v) for v in (getattr(r, name) for r in rows)]  # NaN: no steps
        if name == "loss":  # a round that trained nothing says why instead of "-"
            cells = [r.no_update or c for r, c in zip(rows, cells, strict=True)]
        if baseline is not None:
            cells = [fmt.format(baseline[from_baseline[name]]) if name in from_baseline else "", *cells]
        table.add_row(label, *cells)
    console.print(table)
