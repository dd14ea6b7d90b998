"""Credit on Beam: steps -> sub-diffs, per-task LSH anchors and the advantages the trainer reads.

    steps tables | Credit(settings) -> {"subdiffs", "anchors", "anchor_members", "advantages", "dead_letter"}

    ByTask          each steps table (a part) split by task_id, the columns credit reads only
    GroupByTask     a task's rows together (anchors and task-relative advantages never cross tasks)
    CreditPerTask   per task: its rows -> the credit core's pure inputs (bad action records -> dead letter),
                    `credit_units` (whole diffs, multi-scale sub-diffs, MinHash LSH, anchors, A^D) then
                    `assign_advantages` (the estimator), the one credit path of `pipeline.credit`; emits one
                    Arrow table per credit table and task
    Whiten          a batch-scoped estimator only: the mean and std of one episode advantage per trajectory
                    (a global combine of one value per trajectory), then each task's table whitened with
                    them; no step holds the round's rows together

Every element is an Arrow table (a part, or a task's rows of one table), not a row: Beam encodes a few
large elements instead of one per row, and the writer concatenates them.
"""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from pipeline.credit import CreditInputError, assign_advantages, credit_units
from pipeline.credit.advantages import moments_stats, whiten
from pipeline.credit.batch import cyclic_gc_paused
from pipeline.credit.estimators import get_estimator
from pipeline.credit.settings import CreditSettings
from pipeline.credit_io import CREDIT_TABLES, STEP_COLUMNS, result_tables, step_input, step_records
from pipeline.schema import DeadLetterRow
from pipeline.transforms.tables import by_key

_NS = "didpo_credit"
OUTPUTS = CREDIT_TABLES
DEAD = "dead_letter"


def _by_task(steps: pa.Table):
    """A steps table -> (task_id, its rows), with only the columns credit reads."""
    yield from by_key(steps.select(STEP_COLUMNS), "task_id")


class CreditPerTaskFn(beam.DoFn):
    """One task group at a time through the pure credit core (a batch-scoped estimator's whitening is left
    to `Whiten`)."""

    def __init__(self, settings: CreditSettings) -> None:
        self.settings = settings

    def process(self, item):
        with cyclic_gc_paused():  # the records, the credit and the tables: outputs made whole, then emitted
            outputs = list(self._credit(*item))
        yield from outputs

    def _credit(self, task_id, tables):
        steps = []
        for record in step_records(pa.concat_tables(list(tables))):
            try:
                steps.append(step_input(record, source="steps"))
            except CreditInputError as e:
                Metrics.counter(_NS, "bad_steps").inc()
                payload = {k: record[k] for k in ("row_id", "traj_id", "task_id", "turn", "action_json")}
                yield beam.pvalue.TaggedOutput(DEAD, DeadLetterRow(record["row_id"], "credit_inputs", str(e),
                                                                   json.dumps(payload)))
        if not steps:
            return
        try:
            # every estimator's units, not only those it reads: the tables are for analysis too
            result = assign_advantages(credit_units(steps, self.settings), self.settings, whiten=False)
        except CreditInputError as e:
            Metrics.counter(_NS, "bad_task_groups").inc()
            yield beam.pvalue.TaggedOutput(DEAD, DeadLetterRow(task_id, "credit", str(e),
                                                               json.dumps({"task_id": task_id})))
            return
        d = result.diagnostics
        Metrics.counter(_NS, "candidates").inc(d.n_candidates)
        Metrics.counter(_NS, "anchors").inc(d.n_anchors)
        for name, table in result_tables(result, OUTPUTS).items():
            if table.num_rows:
                yield beam.pvalue.TaggedOutput(name, table)


def _trajectory_values(advantages: pa.Table):
    """(traj_id, episode advantage) once per trajectory of a task's advantages table (every row of a
    trajectory holds its trajectory's value, and a trajectory's rows are all in its task's table)."""
    traj = advantages.column("traj_id").to_pylist()
    values = advantages.column("episode_advantage").to_pylist()
    yield from dict(zip(traj, values, strict=True)).items()


def _batch_moments(pairs: list[tuple[str, float]]) -> tuple[int, float, float]:
    """(count, sum, sum of squares) of one value per trajectory, summed in traj_id order: the same numbers
    whatever order the runner delivered them in."""
    values = np.array([v for _, v in sorted(pairs)], np.float64)
    return len(values), float(values.sum()), float((values**2).sum())


def _whiten_table(table: pa.Table, moments: tuple[int, float, float], eps: float) -> pa.Table:
    """A task's advantages table whitened with the batch's moments; masked tokens stay 0."""
    mean, std = moments_stats(*moments)
    episode = whiten(table.column("episode_advantage").to_numpy(), mean, std, eps)
    tokens = table.column("token_advantages").combine_chunks()
    mask = table.column("loss_mask").combine_chunks().flatten().to_numpy().astype(np.float64)
    values = whiten(tokens.flatten().to_numpy(), mean, std, eps) * mask
    lengths = tokens.value_lengths().to_numpy()
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32())
    token_type = table.schema.field("token_advantages").type
    whitened = pa.ListArray.from_arrays(offsets, pa.array(values.astype(np.float32)), type=token_type)
    table = table.set_column(table.schema.get_field_index("token_advantages"),
                             table.schema.field("token_advantages"), whitened)
    return table.set_column(table.schema.get_field_index("episode_advantage"),
                            table.schema.field("episode_advantage"), pa.array(episode.astype(np.float32)))


class Whiten(beam.PTransform):
    """Advantages tables of a batch-scoped estimator, whitened over the batch's trajectories."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def expand(self, tables: beam.PCollection):
        moments = (
            tables
            | "OnePerTrajectory" >> beam.FlatMap(_trajectory_values)
            | "AllTrajectories" >> beam.combiners.ToList()
            | "BatchMoments" >> beam.Map(_batch_moments)
        )
        return tables | "WhitenTables" >> beam.Map(_whiten_table, beam.pvalue.AsSingleton(moments), self.eps)


class Credit(beam.PTransform):
    def __init__(self, settings: CreditSettings) -> None:
        super().__init__()
        self.settings = settings

    def expand(self, steps: beam.PCollection):
        groups = (
            steps
            | "ByTask" >> beam.FlatMap(_by_task)
            | "GroupByTask" >> beam.GroupByKey()
            | "CreditPerTask" >> beam.ParDo(CreditPerTaskFn(self.settings)).with_outputs(*OUTPUTS, DEAD)
        )
        out = {name: groups[name] for name in OUTPUTS}
        if get_estimator(self.settings.estimator).scope == "batch":
            out["advantages"] = out["advantages"] | "Whiten" >> Whiten(self.settings.std_eps)
        out[DEAD] = groups[DEAD]
        return out
