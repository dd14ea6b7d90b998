"""Stage 1 of DiDPO: one policy round of the Beam pipeline.

1. ReadTasks -> Rollouts(turn 1..T: Prompt -> Generate (RunInference) -> Execute (sandbox)) -> WriteSteps
2. ReadSteps -> Credit(ByTask -> GroupByTask -> CreditPerTask) -> WriteTables: sub-diffs,
   anchors and the advantages table the trainer reads, all from the one credit path (`pipeline.credit`);
   the DuckDB SQL over the tables (`pipeline.sqlrun`) recomputes didpo's as a parity check and for analysis
3. manifest.json records each completed stage with the inputs it read (`ROUND_STAGES`); a rerun skips
   completed stages and redoes an interrupted one from scratch (its parts are deterministic), so a killed run
   finishes with exactly the same tables. A rerun whose inputs differ for a completed stage is refused.

    python -m pipeline.run --config configs/local.yaml [--round 0] [--runner FnApiRunner] [beam options...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import schema, storage
from pipeline.config import PipelineConfig, config_hash, load_config
from pipeline.credit_io import STEP_COLUMNS
from pipeline.policy.handlers import make_handler
from pipeline.policy.settings import PolicySettings
from pipeline.schema import RoundConflict
from pipeline.storage import Location
from pipeline.tasks.base import Task
from pipeline.tasks.settings import round_tasks
from pipeline.telemetry import get_logger
from pipeline.transforms.credit import DEAD, OUTPUTS, Credit
from pipeline.transforms.rollouts import Rollouts
from pipeline.transforms.settings import PipelineSettings
from pipeline.transforms.tables import ReadTable, WriteTable

log = get_logger(__name__)

@dataclass(frozen=True)
class Stage:
    """One stage of a round, declared once: what it reads (the inputs a resume compares) and what it writes.

    A stage's dead letters are its own parts of the shared `dead_letter` table (`part-<name>-*.parquet`), so
    a stage that restarts clears its own and no other stage's.
    """

    name: str
    reads: tuple[str, ...]  # config sections ("credit") or single keys ("credit.gamma") the stage reads
    after: tuple[str, ...] = ()  # stages whose outputs it reads: their fingerprints are its inputs
    tables: tuple[str, ...] = ()  # contract tables it writes whole (train writes round=<k>/policy instead)
    dead_letters: bool = False  # whether it writes dead letters

    @property
    def dead_letter_prefix(self) -> str:
        return f"{self.name}-"

    @property
    def outputs(self) -> tuple[str, ...]:
        return (*self.tables, "dead_letter") if self.dead_letters else self.tables

    def clear(self, round_path: Location) -> None:
        """Remove what an interrupted run of this stage may have left (its parts are deterministic)."""
        for table in self.tables:
            storage.remove_tree(schema.table_dir(round_path, table))
        dead = schema.table_dir(round_path, "dead_letter")
        if self.dead_letters and dead.exists():
            for f in dead.glob(f"part-{self.dead_letter_prefix}*.parquet"):
                f.unlink()

    def seal(self, round_path: Location) -> None:
        """Give each table this stage wrote no rows to one zero-row part: an empty table then exists on every
        filesystem (object stores have no empty folders) and reads as the contract's columns."""
        for table in self.outputs:
            prefix = self.dead_letter_prefix if table == "dead_letter" else ""
            folder = schema.table_dir(round_path, table)
            if not (folder.exists() and any(folder.glob(f"part-{prefix}*.parquet"))):
                schema.write_table(schema.arrow_schema(table).empty_table(), folder, table, part=f"{prefix}00000")


# Every stage of a round, in order: the one place resume compares. Nothing else in the config (logging,
# report, runner and Beam options, shard counts, other stages' sections) can block a resume. The pipeline
# runs the first two (`STAGES`); `didpo round` adds train and eval (workflows/rounds.py). The rollouts
# stage also reads the policy's identity and the training tasks, eval the held-out tasks (`stage_inputs`).
ROUND_STAGES: tuple[Stage, ...] = (
    Stage("rollouts", ("run.run_id", "run.seed", "policy", "episode", "sandbox", "pipeline.samples_per_task",
                       "pipeline.min_batch_size", "pipeline.max_batch_size", "credit.gamma"),
          tables=("trajectories", "steps"), dead_letters=True),
    Stage("credit", ("credit",), ("rollouts",), tables=OUTPUTS, dead_letters=True),
    Stage("train", ("train",), ("credit",)),
    Stage("eval", ("eval", "run.seed", "policy", "episode", "sandbox", "pipeline.max_batch_size", "credit.gamma"),
          ("train",)),
)
STAGE = {s.name: s for s in ROUND_STAGES}
STAGES = ("rollouts", "credit")  # the pipeline's stages (`run_round`)


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


def resolve_policy(policy: PolicySettings) -> Path:
    """The configured policy checkpoint. A missing one is built offline only for the CPU transformers backend
    (the demo and tests); for vLLM/GPU configs a missing checkpoint is an error naming the path."""
    from pipeline.policy.loading import check_checkpoint
    from pipeline.policy.tiny import ensure_checkpoint

    if policy.backend == "transformers" and policy.device == "cpu":
        return ensure_checkpoint(policy.checkpoint, policy.size, policy.seed)
    return check_checkpoint(policy.checkpoint)


def beam_options(settings: PipelineSettings, extra_args: Sequence[str] = ()) -> PipelineOptions:
    """Beam options: the config's runner and pass-through arguments, then the command line's."""
    args = [f"--runner={settings.runner}", *settings.beam_args, *extra_args]
    return PipelineOptions(args)


def build_rollout_pipeline(options: PipelineOptions, cfg: PipelineConfig, tasks: Sequence[Task], round_path: Location,
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
            gamma=cfg.credit.gamma, episode=cfg.episode, sandbox=cfg.sandbox,
            trajectories=len(tasks) * cfg.pipeline.samples_per_task)
    )
    n = cfg.pipeline.num_shards
    written = (
        out["steps"] | "WriteSteps" >> WriteTable(round_path, "steps", "task_id", ("task_id", "traj_id", "turn"),
                                                  num_shards=n),
        out["trajectories"] | "WriteTrajectories" >> WriteTable(round_path, "trajectories", "task_id",
                                                                ("traj_id",), num_shards=n),
        out["dead_letter"] | "WriteDeadLetters" >> WriteTable(round_path, "dead_letter", "key", num_shards=1,
                                                              prefix=STAGE["rollouts"].dead_letter_prefix),
    )
    _one_sink(written)
    return p


def _one_sink(written: Sequence[beam.PCollection]) -> None:
    """Join every table write into one final step. Runners that compute only the graph's last node (Beam's
    Dask runner) then still write every table; the others are unaffected."""
    written | "Written" >> beam.Flatten() | "CountParts" >> beam.combiners.Count.Globally()


def build_credit_pipeline(options: PipelineOptions, cfg: PipelineConfig, round_path: Location) -> beam.Pipeline:
    """ReadSteps -> Credit -> WriteSubdiffs / WriteAnchors / WriteAnchorMembers / WriteAdvantages /
    WriteDeadLetters."""
    p = beam.Pipeline(options=options)
    units = p | "ReadSteps" >> ReadTable(round_path, "steps", STEP_COLUMNS) | "Credit" >> Credit(cfg.credit)
    n = cfg.pipeline.num_shards
    sort = {"subdiffs": ("subdiff_id",), "anchors": ("anchor_id",), "anchor_members": ("subdiff_id", "anchor_id"),
            "advantages": ("row_id",)}
    written = []
    for name in OUTPUTS:
        label = "Write" + "".join(w.title() for w in name.split("_"))
        written.append(units[name] | label >> WriteTable(round_path, name, "task_id", sort[name], num_shards=n))
    written.append(units[DEAD] | "WriteDeadLetters" >> WriteTable(round_path, "dead_letter", "key", num_shards=1,
                                                                  prefix=STAGE["credit"].dead_letter_prefix))
    _one_sink(written)
    return p


@dataclass
class RoundResult:
    round_dir: Location
    manifest: schema.Manifest
    tasks: list[Task]  # the tasks this round rolled out (tasks.per_round's batch of the pool, or all of it)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # stages run by this call
    skipped: list[str] = field(default_factory=list)  # stages already complete


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def tasks_fingerprint(tasks: Sequence[Task]) -> str:
    """Content hash of a task list (ids, workspaces, tests): the same ids loaded from another file differ."""
    return schema.content_id([repr(t) for t in tasks])


def stage_inputs(cfg: PipelineConfig, *, version: str, tasks: Sequence[Task], eval_tasks: Sequence[Task] = ()
                 ) -> dict[str, dict[str, Any]]:
    """Every stage's inputs, in stage order: the config keys its `Stage.reads` names with their values, the
    fingerprints of the stages it reads after, and the policy and tasks where the stage reads them."""
    config = _flat(cfg.model_dump(mode="json"))
    extra = {"rollouts": {"policy_version": version, "tasks": tasks_fingerprint(tasks)},
             "eval": {"tasks": tasks_fingerprint(list(eval_tasks)[: cfg.eval.max_tasks])}}
    out: dict[str, dict[str, Any]] = {}
    for stage in ROUND_STAGES:
        inputs = {k: v for k, v in config.items() if any(k == r or k.startswith(r + ".") for r in stage.reads)}
        inputs |= {f"{up} stage": schema.content_id(out[up]) for up in stage.after}
        out[stage.name] = inputs | extra.get(stage.name, {})
    return out


def changed_inputs(manifest: schema.Manifest, stage: str, inputs: dict[str, Any], chash: str) -> list[str]:
    """'key old -> new' for each input of a completed stage that differs from `inputs` ([] when the stage is
    not complete or nothing changed). A stage recorded before per-stage inputs compares the whole config."""
    if not manifest.stage_done(stage):
        return []
    recorded = manifest.stages[stage].get("inputs")
    if recorded is None:
        return [] if manifest.config_hash == chash else [f"config {manifest.config_hash} -> {chash}"]
    return [f"{k} {recorded.get(k, '<unset>')} -> {inputs.get(k, '<unset>')}"
            for k in sorted(set(recorded) | set(inputs)) if recorded.get(k) != inputs.get(k)]


def check_stage(manifest: schema.Manifest, round_path: Location, stage: str, inputs: dict[str, Any], chash: str
                ) -> None:
    """RoundConflict (one line naming the stage and the changed keys) when a completed stage read other inputs.

    Refused, never recomputed: a completed stage's tables may already be consumed (by the next stages, the
    update, later rounds), so rewriting them would leave a run whose records disagree. Upstream fingerprints
    are inputs too, so a stage after a changed one is refused the same way.
    """
    if changes := changed_inputs(manifest, stage, inputs, chash):
        raise RoundConflict(f"{round_path}: stage {stage} was completed with other inputs: {'; '.join(changes)}. "
                            "Use another run_id or round; nothing was overwritten.")


def complete_stage(manifest: schema.Manifest, round_path: Location, stage: str, seconds: float,
                   inputs: dict[str, Any], **details: Any) -> None:
    """Record a completed stage with the inputs it read (what a resume compares) and write the manifest."""
    manifest.stages[stage] = {"completed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                              "seconds": round(seconds, 3), "inputs": inputs, **details}
    schema.write_manifest(manifest, round_path)


def _open_manifest(cfg: PipelineConfig, round_path: Location, round_k: int, version: str) -> schema.Manifest:
    if (round_path / schema.MANIFEST_NAME).exists():
        return schema.read_manifest(round_path)
    m = schema.Manifest(run_id=cfg.run.run_id, round=round_k, config_hash=config_hash(cfg), git_sha=git_sha(),
                        policy_checkpoint=version, seeds={"root": cfg.run.seed})
    schema.write_manifest(m, round_path)
    return m


def _count(round_path: Location, table: str) -> int:
    return sum(schema.check_parquet_schema(f, table).num_rows
               for f in schema.part_files(schema.table_dir(round_path, table)))


def run_round(cfg: PipelineConfig, round_k: int, checkpoint: str | Path, tasks: Sequence[Task], *,
              beam_args: Sequence[str] = (), stop_after: str | None = None) -> RoundResult:
    """Run (or resume) one round's pipeline stages on its share of the training pool `tasks` (round_tasks);
    `stop_after` ends early after a stage (tests, debugging)."""
    tasks = round_tasks(tasks, round_k, cfg.tasks.per_round, cfg.run.seed)
    round_path = schema.round_dir(cfg.run.root, cfg.run.run_id, round_k)
    storage.makedirs(round_path)
    checkpoint = storage.local_copy(checkpoint)  # a policy under an object-store root: loaders read local files
    version = policy_version(checkpoint)
    manifest = _open_manifest(cfg, round_path, round_k, version)
    inputs, chash = stage_inputs(cfg, version=version, tasks=tasks), config_hash(cfg)
    for stage in STAGES:  # all before any work: a refused resume touches nothing
        check_stage(manifest, round_path, stage, inputs[stage], chash)
    result = RoundResult(round_path, manifest, tasks)
    options = beam_options(cfg.pipeline, beam_args)
    for stage in STAGES:
        if manifest.stage_done(stage):
            result.skipped.append(stage)
        else:
            STAGE[stage].clear(round_path)  # an interrupted stage restarts clean
            start = time.perf_counter()
            log.info("round %d: stage %s", round_k, stage)
            if stage == "rollouts":
                manifest.policy_checkpoint, manifest.seeds = version, {"root": cfg.run.seed}
                build_rollout_pipeline(options, cfg, tasks, round_path, round_k, str(checkpoint), version).run(
                ).wait_until_finish()
            else:
                build_credit_pipeline(options, cfg, round_path).run().wait_until_finish()
            STAGE[stage].seal(round_path)
            for table in STAGE[stage].outputs:
                manifest.row_counts[table] = _count(round_path, table)
            seconds = time.perf_counter() - start
            complete_stage(manifest, round_path, stage, seconds, inputs[stage])
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
    checkpoint = args.checkpoint or str(resolve_policy(cfg.policy))
    train, _ = resolve_tasks(cfg.tasks)
    res = run_round(cfg, args.round, checkpoint, train, beam_args=beam_args)
    print(f"round {args.round}: {res.round_dir} stages run {list(res.stage_seconds)} skipped {res.skipped}")


if __name__ == "__main__":
    main(sys.argv[1:])
