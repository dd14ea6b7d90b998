"""Adapters between the data contract and the pure credit core (which imports nothing from the project).

    steps table rows -> StepInput          (step_inputs)
    CreditResult     -> contract rows/tables (result_rows, result_tables)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from pipeline.credit import CreditInputError, CreditResult, StepInput
from pipeline.credit.inputs import edits_from_action, files_map
from pipeline.schema import arrow_schema

CREDIT_TABLES = ("subdiffs", "anchors", "anchor_members", "advantages")


def step_input(record: Mapping[str, Any], source: str = "<steps>") -> StepInput:
    """One steps-table record (a dict or StepRow's fields) -> the credit core's input; a bad action_json is
    refused with the file and row named."""
    try:
        edits = edits_from_action(record.get("action_json"))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CreditInputError(f"{source}: row {record['row_id']!r}: unreadable action_json: {e}") from e
    return StepInput(
        row_id=record["row_id"], traj_id=record["traj_id"], task_id=record["task_id"], turn=int(record["turn"]),
        step_reward=record["step_reward"], response_text=record["response_text"],
        token_char_starts=record["token_char_starts"], token_char_ends=record["token_char_ends"], edits=edits,
        files_before=files_map(record["files_before"]), files_after=files_map(record["files_after"]),
        workspace_hash_before=record["workspace_hash_before"],
        visible_pass_fraction=_pass_fraction(record.get("visible_passed"), record.get("visible_total")),
    )


def _pass_fraction(passed: Any, total: Any) -> float | None:
    """visible_passed / visible_total of a steps row; None when the row has no visible tests recorded."""
    if passed is None or not total:
        return None
    return min(1.0, max(0.0, float(passed) / float(total)))


def step_inputs(records: Iterable[Mapping[str, Any]], source: str = "<steps>") -> list[StepInput]:
    return [step_input(r, source) for r in records]


def steps_from_table(table: pa.Table, source: str = "<steps>") -> list[StepInput]:
    """Rows of a steps table -> the credit stage's pure inputs."""
    return step_inputs(table.to_pylist(), source)


def result_tables(result: CreditResult, tables: Iterable[str] = CREDIT_TABLES) -> dict[str, pa.Table]:
    """The result's column dicts as Arrow tables with exactly the contract schemas."""
    out = {}
    for name in tables:
        columns: dict[str, Any] = getattr(result, name)
        schema = arrow_schema(name)
        out[name] = pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in schema}, schema=schema)
    return out


def result_rows(result: CreditResult, table: str) -> list[dict[str, Any]]:
    """One of the result's tables as contract rows (dicts), e.g. for a Beam PCollection."""
    return result_tables(result, (table,))[table].to_pylist()
