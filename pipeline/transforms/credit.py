"""Credit on Beam: steps -> sub-diffs, per-task LSH anchors and the advantages the trainer reads.

    steps | Credit(settings) -> {"subdiffs", "anchors", "anchor_members", "advantages", "dead_letter"}

    ToCreditInputs  steps-table rows -> the credit core's pure inputs (bad action records -> dead letter)
    ShardByTask     key by task_id (anchors and task-relative advantages never cross tasks)
    CreditPerTask   per task: `credit_units` (whole diffs, multi-scale sub-diffs, MinHash LSH, anchors, A^D)
                    then `assign_advantages` (the estimator), the one credit path of `pipeline.credit`
    Whiten          a batch-scoped estimator only: the mean and std of one episode advantage per trajectory
                    (a global combine of three numbers), then each row whitened with them; no step holds
                    the round's rows together
"""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from pipeline.credit import CreditInputError, assign_advantages, credit_units
from pipeline.credit.advantages import moments_stats, whiten
from pipeline.credit.estimators import get_estimator
from pipeline.credit.settings import CreditSettings
from pipeline.credit_io import CREDIT_TABLES, result_tables, step_input
from pipeline.schema import DeadLetterRow, StepRow, record_of

_NS = "didpo_credit"
OUTPUTS = CREDIT_TABLES
DEAD = "dead_letter"


class ToCreditInputsFn(beam.DoFn):
    def process(self, row: StepRow):
        record = record_of(row)
        try:
            yield step_input(record, source="steps")
        except CreditInputError as e:
            Metrics.counter(_NS, "bad_steps").inc()
            payload = {k: record[k] for k in ("row_id", "traj_id", "task_id", "turn", "action_json")}
            yield beam.pvalue.TaggedOutput(DEAD, DeadLetterRow(row.row_id, "credit_inputs", str(e),
                                                               json.dumps(payload)))


class CreditPerTaskFn(beam.DoFn):
    """One task group at a time through the pure credit core (a batch-scoped estimator's whitening is left
    to `Whiten`)."""

    def __init__(self, settings: CreditSettings) -> None:
        self.settings = settings

    def process(self, item):
        task_id, steps = item
        try:
            # every estimator's units, not only those it reads: the tables are for analysis too
            result = assign_advantages(credit_units(list(steps), self.settings), self.settings, whiten=False)
        except CreditInputError as e:
            Metrics.counter(_NS, "bad_task_groups").inc()
            yield beam.pvalue.TaggedOutput(DEAD, DeadLetterRow(task_id, "credit", str(e),
                                                               json.dumps({"task_id": task_id})))
            return
        d = result.diagnostics
        Metrics.counter(_NS, "candidates").inc(d.n_candidates)
        Metrics.counter(_NS, "anchors").inc(d.n_anchors)
        for name, table in result_tables(result, OUTPUTS).items():
            for row in table.to_pylist():
                yield beam.pvalue.TaggedOutput(name, row)


class _Moments(beam.CombineFn):
    """(count, sum, sum of squares) of floats."""

    def create_accumulator(self):
        return 0, 0.0, 0.0

    def add_input(self, acc, value):
        return acc[0] + 1, acc[1] + value, acc[2] + value * value

    def merge_accumulators(self, accs):
        accs = list(accs)
        return sum(a[0] for a in accs), sum(a[1] for a in accs), sum(a[2] for a in accs)

    def extract_output(self, acc):
        return acc


def _whiten_row(row: dict, moments: tuple[int, float, float], eps: float) -> dict:
    mean, std = moments_stats(*moments)
    mask = np.asarray(row["loss_mask"], np.float64)
    return {**row, "episode_advantage": float(whiten(row["episode_advantage"], mean, std, eps)),
            "token_advantages": (whiten(row["token_advantages"], mean, std, eps) * mask).tolist()}


class Whiten(beam.PTransform):
    """Advantages rows of a batch-scoped estimator, whitened over the batch's trajectories."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def expand(self, rows: beam.PCollection):
        moments = (
            rows
            | "OnePerTrajectory" >> beam.Map(lambda r: (r["traj_id"], r["episode_advantage"]))
            | "FirstOfTrajectory" >> beam.CombinePerKey(lambda values: next(iter(values)))
            | "Values" >> beam.Values()
            | "BatchMoments" >> beam.CombineGlobally(_Moments())
        )
        return rows | "WhitenRows" >> beam.Map(_whiten_row, beam.pvalue.AsSingleton(moments), self.eps)


class Credit(beam.PTransform):
    def __init__(self, settings: CreditSettings) -> None:
        super().__init__()
        self.settings = settings

    def expand(self, steps: beam.PCollection):
        inputs = steps | "ToCreditInputs" >> beam.ParDo(ToCreditInputsFn()).with_outputs(DEAD, main="inputs")
        groups = (
            inputs["inputs"]
            | "ShardByTask" >> beam.Map(lambda s: (s.task_id, s))
            | "GroupByTask" >> beam.GroupByKey()
            | "CreditPerTask" >> beam.ParDo(CreditPerTaskFn(self.settings)).with_outputs(*OUTPUTS, DEAD)
        )
        out = {name: groups[name] for name in OUTPUTS}
        if get_estimator(self.settings.estimator).scope == "batch":
            out["advantages"] = out["advantages"] | "Whiten" >> Whiten(self.settings.std_eps)
        out[DEAD] = (inputs[DEAD], groups[DEAD]) | "CollectDeadLetters" >> beam.Flatten()
        return out
