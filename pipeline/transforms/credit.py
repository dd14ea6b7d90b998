"""Credit units on Beam: steps -> sub-diffs -> per-task LSH anchors.

    steps | CreditUnits(settings) -> {"subdiffs", "anchors", "anchor_members", "dead_letter"}

    ToCreditInputs  steps-table rows -> the credit core's pure inputs (bad action records -> dead letter)
    ShardByTask     key by task_id (anchors never cross tasks), deterministic grouping
    GroupAnchors    per task: whole diffs, multi-scale sub-diffs, MinHash LSH, anchor selection, A^D
"""

from __future__ import annotations

import dataclasses
import json

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline.credit import CreditInputError, assign_advantages, credit_units
from pipeline.credit.settings import CreditSettings
from pipeline.credit_io import result_tables, step_input
from pipeline.schema import DeadLetterRow, StepRow

_NS = "didpo_credit"
OUTPUTS = ("subdiffs", "anchors", "anchor_members")
DEAD = "dead_letter"


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


class GroupAnchorsFn(beam.DoFn):
    """One task group at a time through the pure credit core."""

    def __init__(self, settings: CreditSettings) -> None:
        self.settings = settings

    def process(self, item):
        task_id, steps = item
        try:
            # every estimator's units, not only those it reads: the tables are for analysis too
            result = assign_advantages(credit_units(list(steps), self.settings), self.settings)
        except CreditInputError as e:
            Metrics.counter(_NS, "bad_task_groups").inc()
            yield beam.pvalue.TaggedOutput(DEAD, DeadLetterRow(task_id, "group_anchors", str(e),
                                                               json.dumps({"task_id": task_id})))
            return
        d = result.diagnostics
        Metrics.counter(_NS, "candidates").inc(d.n_candidates)
        Metrics.counter(_NS, "anchors").inc(d.n_anchors)
        for name, table in result_tables(result, OUTPUTS).items():
            for row in table.to_pylist():
                yield beam.pvalue.TaggedOutput(name, row)


class CreditUnits(beam.PTransform):
    def __init__(self, settings: CreditSettings) -> None:
        super().__init__()
        self.settings = settings

    def expand(self, steps: beam.PCollection):
        inputs = steps | "ToCreditInputs" >> beam.ParDo(ToCreditInputsFn()).with_outputs(DEAD, main="inputs")
        units = (
            inputs["inputs"]
            | "ShardByTask" >> beam.Map(lambda s: (s.task_id, s))
            | "GroupByTask" >> beam.GroupByKey()
            | "GroupAnchors" >> beam.ParDo(GroupAnchorsFn(self.settings)).with_outputs(*OUTPUTS, DEAD)
        )
        out = {name: units[name] for name in OUTPUTS}
        out[DEAD] = (inputs[DEAD], units[DEAD]) | "CollectDeadLetters" >> beam.Flatten()
        return out
