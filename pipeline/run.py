"""Stage 1 of DiDPO: one policy round of the Beam pipeline.

1. ReadTasks -> Rollouts(turn 1..T: Prompt -> Generate (RunInference) -> Execute (sandbox)) -> WriteSteps
2. ReadSteps -> CreditUnits(ToCreditInputs -> ShardByTask -> GroupAnchors) -> WriteTables
3. Advantages: DuckDB SQL over the round's Parquet tables (the didpo estimator; the Python credit core for the
   other estimators) -> advantages table
4. manifest.json records each completed stage; a rerun skips completed stages and redoes an interrupted one
   from scratch (its parts are deterministic), so a killed run finishes with exactly the same tables.

    python -m pipeline.run --config configs/local.yaml [--round 0] [--runner FnApiRunner] [beam options...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import schema
from pipeline.config import DidpoConfig, config_hash, load_config
from pipeline.policy.handlers import make_handler
from pipeline.tasks.base import Task
from pipeline.telemetry import get_logger
from pipeline.transforms.credit import DEAD, OUTPUTS, CreditUnits
from pipeline.transforms.rollouts import Rollouts
from pipeline.transforms.tables import ReadTable, WriteTable

log = get_logger(__name__)

STAGES = ("rollouts", "credit_units", "advantages")
STAGE_TABLES = {
    "rollouts": ("trajectories", "steps", "dead_letter"),
    "credit_units": ("subdiffs", "anchors", "anchor_members"),
    "advantages": ("advantages",),
}


class RoundConflict(RuntimeError):
    """The round folder was written with another config or policy: refuse rather than overwrite."""


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def policy_version(checkpoint: str | Path) -> str:
    """Identity of a checkpoint: hash of its config and weight files' names, sizes and first/last bytes."""
    h = hashlib.sha256()
    for f in sorted(Path(checkpoint).glob("*")):
        if f.suffix in (".json", ".safetensors") and f.is_file():
            size = f.stat().st_size
            with f.open("rb") as fh:
                head = fh.read(1 << 16)
                fh.seek(max(0, size - (1 << 16)))
                tail = fh.read()
            h.update(f"{f.name}:{size}".encode() + head + tail)
    return h.hexdigest()[:20]


def resolve_policy(cfg: DidpoConfig) -> Path:
    """The configured policy checkpoint. A missing one is built offline only for the CPU transformers backend
    (the demo and tests); for vLLM/GPU configs a missing checkpoint is an error naming the path."""
    from pipeline.policy.loading import check_checkpoint
    from pipeline.policy.tiny import ensure_checkpoint

    if cfg.policy.backend == "transformers" and cfg.policy.device == "cpu":
        return ensure_checkpoint(cfg.policy.checkpoint, cfg.policy.size, cfg.policy.seed)
    return check_checkpoint(cfg.policy.checkpoint)


def beam_options(cfg: DidpoConfig, extra_args: Sequence[str] = ()) -> PipelineOptions:
    """Beam options: the config's runner and pass-through arguments, then the command line's."""
    args = [f"--runner={cfg.pipeline.runner}", *cfg.pipeline.beam_args, *extra_args]
    return PipelineOptions(args)


def build_rollout_pipeline(options: PipelineOptions, cfg: DidpoConfig, tasks: Sequence[Task], round_path: Path,
                           round_k: int, checkpoint: str, version: str) -> beam.Pipeline:
    """ReadTasks -> Rollouts -> WriteSteps / WriteTrajectories / WriteDeadLetters."""
    p = beam.Pipeline(options=options)
    policy = cfg.policy.model_copy(update={"checkpoint": str(checkpoint)})
    handler = make_handler(policy, min_batch_size=cfg.pipeline.min_batch_size,
                           max_batch_size=cfg.pipeline.max_batch_size)
    out = (
        p
        | "ReadTasks" >> beam.Create(list(tasks))
        | "Rollouts" >> Rollouts(
            handler=handler, checkpoint=str(checkpoint), policy_version=version, run_id=cfg.run.run_id,
            round_k=round_k, samples=cfg.pipeline.samples_per_task, root_seed=cfg.run.seed,
            gamma=cfg.credit.gamma, episode=cfg.episode, sandbox=cfg.sandbox)
    )
    n = cfg.pipeline.num_shards
    out["steps"] | "WriteSteps" >> WriteTable(round_path, "steps", key_fn=lambda r: r.task_id,
                                              sort_key=lambda r: (r.task_id, r.traj_id, r.turn), num_shards=n)
    out["trajectories"] | "WriteTrajectories" >> WriteTable(round_path, "trajectories", key_fn=lambda r: r.task_id,
                                                            sort_key=lambda r: r.traj_id, num_shards=n)
    out["dead_letter"] | "WriteDeadLetters" >> WriteTable(round_path, "dead_letter", key_fn=lambda r: r.key,
                                                          num_shards=1, prefix="rollouts-")
    return p


def build_credit_pipeline(options: PipelineOptions, cfg: DidpoConfig, round_path: Path) -> beam.Pipeline:
    """ReadSteps -> CreditUnits -> WriteSubdiffs / WriteAnchors / WriteAnchorMembers / WriteDeadLetters."""
    p = beam.Pipeline(options=options)
    units = p | "ReadSteps" >> ReadTable(round_path, "steps") | "CreditUnits" >> CreditUnits(cfg.credit)
    n = cfg.pipeline.num_shards
    sort = {"subdiffs": "subdiff_id", "anchors": "anchor_id", "anchor_members": "subdiff_id"}
    for name in OUTPUTS:
        label = "Write" + "".join(w.title() for w in name.split("_"))
        units[name] | label >> WriteTable(round_path, name, key_fn=lambda r: r["task_id"],
                                          sort_key=lambda r, k=sort[name]: (r[k], r.get("anchor_id", "")),
                                          num_shards=n)
    units[DEAD] | "WriteDeadLetters" >> WriteTable(round_path, "dead_letter", key_fn=lambda r: r.key,
                                                   num_shards=1, prefix="credit-")
    return p


def compute_advantages(cfg: DidpoConfig, round_path: Path) -> int:
    """The advantages table: DuckDB SQL for didpo (parity with the Python core is tested), else Python."""
    if cfg.credit.estimator == "didpo":
        from pipeline.sqlrun import sql_advantages

        table = sql_advantages(round_path, lam=cfg.credit.lam, adv_norm=cfg.credit.adv_norm)
    else:
        from pipeline.credit import compute_credit
        from pipeline.credit_io import result_tables, steps_from_table

        steps = schema.read_table(schema.table_dir(round_path, "steps"), "steps")
        table = result_tables(compute_credit(steps_from_table(steps, "steps"), cfg.credit), ("advantages",))[
            "advantages"]
    schema.write_table(table, schema.table_dir(round_path, "advantages"), "advantages")
    return table.num_rows


@dataclass
class RoundResult:
    round_dir: Path
    manifest: schema.Manifest
    stage_seconds: dict[str, float] = field(default_factory=dict)  # stages run by this call
    skipped: list[str] = field(default_factory=list)  # stages already complete


def _open_manifest(cfg: DidpoConfig, round_path: Path, round_k: int, checkpoint: str, version: str
                   ) -> schema.Manifest:
    chash = config_hash(cfg)
    if (round_path / schema.MANIFEST_NAME).exists():
        m = schema.read_manifest(round_path)
        if m.config_hash != chash or m.policy_checkpoint != version:
            raise RoundConflict(
                f"{round_path} was written with config {m.config_hash} and policy {m.policy_checkpoint}; this run "
                f"has config {chash} and policy {version}. Use another run_id or round; nothing was overwritten.")
        return m
    m = schema.Manifest(run_id=cfg.run.run_id, round=round_k, config_hash=chash, git_sha=git_sha(),
                        policy_checkpoint=version, seeds={"root": cfg.run.seed})
    schema.write_manifest(m, round_path)
    return m


def _count(round_path: Path, table: str) -> int:
    return sum(schema.check_parquet_schema(f, table).metadata.num_rows
               for f in schema.part_files(schema.table_dir(round_path, table)))


def run_round(cfg: DidpoConfig, round_k: int, checkpoint: str | Path, tasks: Sequence[Task], *,
              beam_args: Sequence[str] = (), stop_after: str | None = None) -> RoundResult:
    """Run (or resume) one round's pipeline stages; `stop_after` ends early after a stage (tests, debugging)."""
    round_path = schema.round_dir(cfg.run.root, cfg.run.run_id, round_k)
    round_path.mkdir(parents=True, exist_ok=True)
    version = policy_version(checkpoint)
    manifest = _open_manifest(cfg, round_path, round_k, str(checkpoint), version)
    result = RoundResult(round_path, manifest)
    options = beam_options(cfg, beam_args)
    for stage in STAGES:
        if manifest.stage_done(stage):
            result.skipped.append(stage)
        else:
            for table in STAGE_TABLES[stage]:  # an interrupted stage restarts clean: its parts are deterministic
                folder = schema.table_dir(round_path, table)
                if table == "dead_letter":
                    for f in folder.glob(f"part-{stage.split('_')[0]}-*.parquet"):
                        f.unlink()
                elif folder.exists():
                    shutil.rmtree(folder)
            start = time.perf_counter()
            log.info("round %d: stage %s", round_k, stage)
            if stage == "rollouts":
                build_rollout_pipeline(options, cfg, tasks, round_path, round_k, str(checkpoint), version).run(
                ).wait_until_finish()
            elif stage == "credit_units":
                build_credit_pipeline(options, cfg, round_path).run().wait_until_finish()
            else:
                compute_advantages(cfg, round_path)
            for table in STAGE_TABLES[stage]:
                schema.table_dir(round_path, table).mkdir(parents=True, exist_ok=True)  # empty = no rows
                manifest.row_counts[table] = _count(round_path, table)
            seconds = time.perf_counter() - start
            manifest.stages[stage] = {"completed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                                      "seconds": round(seconds, 3)}
            schema.write_manifest(manifest, round_path)
            result.stage_seconds[stage] = seconds
        if stage == stop_after:
            break
    return result


def main(argv: Sequence[str] | None = None) -> None:
    from pipeline.tasks.settings import resolve_tasks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--checkpoint", default=None, help="policy checkpoint (default: policy.checkpoint)")
    args, beam_args = parser.parse_known_args(argv)
    cfg = load_config(args.config, args.overrides)
    checkpoint = args.checkpoint or str(resolve_policy(cfg))
    train, _ = resolve_tasks(cfg.tasks)
    res = run_round(cfg, args.round, checkpoint, train, beam_args=beam_args)
    print(f"round {args.round}: {res.round_dir} stages run {list(res.stage_seconds)} skipped {res.skipped}")


if __name__ == "__main__":
    main(sys.argv[1:])
