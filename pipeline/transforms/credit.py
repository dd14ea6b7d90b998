"""Credit on Beam: steps -> sub-diffs, per-task LSH anchors and the advantages the trainer reads.

    steps | Credit(settings) -> {"subdiffs", "anchors", "anchor_members", "advantages", "dead_letter"}

    ToCreditInputs  steps-table rows -> the credit core's pure inputs (bad action records -> dead letter)
    ShardByScope    key by task_id for a task-scoped estimator (anchors and advantages never cross tasks);
                    one key for a batch-scoped one (its advantages read the whole batch)
    CreditPerGroup  per key: `credit_units` (whole diffs, multi-scale sub-diffs, MinHash LSH, anchors, A^D)
                    then `assign_advantages` (the estimator), the one credit path of `pipeline.credit`
"""

from __future__ import annotations

import dataclasses
import json

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline.credit import CreditInputError, assign_advantages, credit_units
from pipeline.credit.estimators import get_estimator
from pipeline.credit.settings import CreditSettings
from pipeline.credit_io import CREDIT_TABLES, result_tables, step_input
from pipeline.schema import DeadLetterRow, StepRow

_NS = "didpo_credit"
OUTPUTS = CREDIT_TABLES
DEAD = "dead_letter"
BATCH_KEY = "*"  # the one group of a batch-scoped estimator


class ToCreditInputsFn(beam.DoFn):
    def process(self, row: StepRow):
        record = dataclasses.asdict(row)
        try:
            yield step_input(record, source="steps")
        except CreditInputError as e:
            Metrics.counter(_NS, "bad_steps").inc()
            payload = {k: record[k] for k in ("row_id", "traj_id", "task_id", "turn", "action_json")}
            yield beam.pvalue.TaggedOutput(DEAD, DeadLetterRow(row.row_id, "credit_inputs", str(e),
                                                               json.dumps(payload)))


class CreditPerGroupFn(beam.DoFn):
    """One group (a task, or the whole batch) at a time through the pure credit core."""

    def __init__(self, settings: CreditSettings) -> None:
        self.settings = settings

    def process(self, item):
        key, steps = item
        try:
            # every estimator's units, not only those it reads: the tables are for analysis too
            result = assign_advantages(credit_units(list(steps), self.settings), self.settings)
        except CreditInputError as e:
            Metrics.counter(_NS, "bad_task_groups").inc()
            yield beam.pvalue.TaggedOutput(DEAD, DeadLetterRow(key, "credit", str(e), json.dumps({"group": key})))
            return
        d = result.diagnostics
        Metrics.counter(_NS, "candidates").inc(d.n_candidates)
        Metrics.counter(_NS, "anchors").inc(d.n_anchors)
        for name, table in result_tables(result, OUTPUTS).items():
            for row in table.to_pylist():
                yield beam.pvalue.TaggedOutput(name, row)


class Credit(beam.PTransform):
    def __init__(self, settings: CreditSettings) -> None:
        super().__init__()
        self.settings = settings

    def expand(self, steps: beam.PCollection):
        batch_wide = get_estimator(self.settings.estimator).scope == "batch"
        inputs = steps | "ToCreditInputs" >> beam.ParDo(ToCreditInputsFn()).with_outputs(DEAD, main="inputs")
        groups = (
            inputs["inputs"]
            | "ShardByScope" >> beam.Map(lambda s: (BATCH_KEY if batch_wide else s.task_id, s))
            | "GroupByScope" >> beam.GroupByKey()
            | "CreditPerGroup" >> beam.ParDo(CreditPerGroupFn(self.settings)).with_outputs(*OUTPUTS, DEAD)
        )
        out = {name: groups[name] for name in OUTPUTS}
        out[DEAD] = (inputs[DEAD], groups[DEAD]) | "CollectDeadLetters" >> beam.Flatten()
        return out
