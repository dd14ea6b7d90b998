"""Adapters between the data contract and the credit core (`pipeline.credit`, which writes no table and
names no column: its results are plain values).

    steps table rows -> StepInput                 (step_records, step_input, step_inputs, steps_from_table)
    CreditResult     -> the four credit tables: their columns as computed (result_columns), Arrow tables
                        with the contract schemas (result_tables)

Table assembly is here and only here: which value goes in which column (checked against
`pipeline.schema.columns`, the one list of them), the tables' row order (anchors by id, members in an
anchor's order, advantages in input order) and the Arrow arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.credit import CreditInputError, CreditResult, StepInput
from pipeline.credit.inputs import edits_from_action, files_map
from pipeline.schema import SchemaError, arrow_schema, columns

CREDIT_TABLES = ("subdiffs", "anchors", "anchor_members", "advantages")
# the steps columns `step_input` reads (and a dead letter's payload names)
STEP_COLUMNS = ("row_id", "traj_id", "task_id", "turn", "step_reward", "response_text", "token_char_starts",
                "token_char_ends", "action_json", "files_before", "files_after", "workspace_hash_before",
                "visible_passed", "visible_total")
_TOKEN_COLUMNS = ("token_char_starts", "token_char_ends")


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


def step_records(table: pa.Table) -> list[dict[str, Any]]:
    """The credit columns of a steps table as records for `step_input`, each token offset list a numpy
    array: one conversion per column (turning every offset into a Python int cost more than the math)."""
    records = table.select([c for c in STEP_COLUMNS if c not in _TOKEN_COLUMNS]).to_pylist()
    for name in _TOKEN_COLUMNS:
        for record, values in zip(records, _list_values(table.column(name)), strict=True):
            record[name] = values
    return records


def _list_values(column: pa.ChunkedArray) -> list[np.ndarray]:
    """A list<int> column as one int64 array per row."""
    lists = column.combine_chunks()
    if not len(lists):
        return []
    offsets = lists.offsets.to_numpy()
    return np.split(lists.flatten().to_numpy().astype(np.int64), offsets[1:-1] - offsets[0])


def steps_from_table(table: pa.Table, source: str = "<steps>") -> list[StepInput]:
    """Rows of a steps table -> the credit stage's pure inputs."""
    return step_inputs(step_records(table), source)


def _subdiff_columns(result: CreditResult) -> dict[str, list]:
    """One row per sub-diff, in the core's order (rows canonical, then candidates as found); char/token_start
    and _end are the outer bounds of the spans (-1: none); the spans are (start, end) pairs (Arrow makes
    them structs, and makes them fastest from tuples)."""
    subs = result.subdiffs
    cands = [s.candidate for s in subs]
    steps = [result.rows[c.row] for c in cands]
    return dict(
        subdiff_id=[s.subdiff_id for s in subs],
        row_id=[step.row_id for step in steps],
        traj_id=[step.traj_id for step in steps],
        task_id=[step.task_id for step in steps],
        file=[c.file for c in cands],
        edit_type=[c.edit_type for c in cands],
        scale=[c.scale for c in cands],
        line_start=[c.line_start for c in cands],
        line_end=[c.line_end for c in cands],
        char_start=[s.char_spans[0][0] if s.char_spans else -1 for s in subs],
        char_end=[s.char_spans[-1][1] if s.char_spans else -1 for s in subs],
        token_start=[s.token_spans[0][0] if s.token_spans else -1 for s in subs],
        token_end=[s.token_spans[-1][1] if s.token_spans else -1 for s in subs],
        char_spans=[s.char_spans for s in subs],
        token_spans=[s.token_spans for s in subs],
        n_lines=[c.n_lines for c in cands],
        normalized_text=[c.text for c in cands],
    )


def _anchor_columns(result: CreditResult) -> dict[str, list]:
    """One row per anchor, by anchor_id."""
    anchors = sorted(result.anchors, key=lambda a: a.anchor_id)
    return dict(
        anchor_id=[a.anchor_id for a in anchors],
        task_id=[a.task_id for a in anchors],
        edit_type=[a.edit_type for a in anchors],
        n_rows=[a.n_rows for a in anchors],
        n_members=[len(a.members) for a in anchors],
        mean_lines=[a.mean_lines for a in anchors],
        gs=[a.gs for a in anchors],
        representative_subdiff_id=[result.subdiffs[a.representative].subdiff_id for a in anchors],
        text=[a.text for a in anchors],
    )


def _member_columns(result: CreditResult) -> dict[str, list]:
    """One row per anchor occurrence with its A^D: anchors by anchor_id, members in the anchor's order."""
    pairs = [(a, m, float(value)) for a in sorted(result.anchors, key=lambda a: a.anchor_id)
             for m, value in zip(a.members, a.diff_advantage, strict=True)]
    return dict(
        anchor_id=[a.anchor_id for a, _, _ in pairs],
        subdiff_id=[result.subdiffs[m].subdiff_id for _, m, _ in pairs],
        row_id=[result.rows[result.subdiffs[m].candidate.row].row_id for _, m, _ in pairs],
        task_id=[a.task_id for a, _, _ in pairs],
        diff_advantage=[value for _, _, value in pairs],
    )


def _advantage_columns(result: CreditResult) -> dict[str, list]:
    """One row per input step, in input order (token advantages float64 here; the table stores float32)."""
    rows, settings = result.advantages, result.settings
    return dict(
        row_id=[a.step.row_id for a in rows],
        traj_id=[a.step.traj_id for a in rows],
        task_id=[a.step.task_id for a in rows],
        estimator=[settings.estimator] * len(rows),
        lam=[settings.lam] * len(rows),
        episode_advantage=[a.episode_advantage for a in rows],
        token_advantages=[a.token_advantages for a in rows],
        loss_mask=[a.loss_mask for a in rows],
        n_diff_tokens=[a.n_diff_tokens for a in rows],
    )


_COLUMNS: dict[str, Callable[[CreditResult], dict[str, list]]] = {
    "subdiffs": _subdiff_columns,
    "anchors": _anchor_columns,
    "anchor_members": _member_columns,
    "advantages": _advantage_columns,
}


def result_columns(result: CreditResult, table: str) -> dict[str, list]:
    """One of the credit tables as column name -> values, in the schema's column order, with the values as
    computed (float64 numbers, numpy token arrays): what the table holds before Arrow's types apply."""
    if table not in _COLUMNS:
        raise KeyError(f"{table!r} is not a credit table; they are {', '.join(CREDIT_TABLES)}")
    built = _COLUMNS[table](result)
    names = columns(table)
    if set(built) != set(names):  # the contract changed: this adapter must follow it
        raise SchemaError(f"credit_io builds {sorted(built)} for table {table!r}; its columns: {list(names)}")
    return {name: built[name] for name in names}


def result_tables(result: CreditResult, tables: Iterable[str] = CREDIT_TABLES) -> dict[str, pa.Table]:
    """The result's credit tables as Arrow tables with exactly the contract schemas."""
    out = {}
    for name in tables:
        cols, schema = result_columns(result, name), arrow_schema(name)
        out[name] = pa.table({f.name: _arrow(cols[f.name], f.type) for f in schema}, schema=schema)
    return out


def _arrow(values: list, type: pa.DataType) -> pa.Array:
    """A column's values as an Arrow array; a list column of numpy arrays (token values) is made from one
    concatenation instead of value by value (numpy's float32 cast rounds as Arrow's does)."""
    if not (pa.types.is_list(type) and values and isinstance(values[0], np.ndarray)):
        return pa.array(values, type=type)
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    flat = np.concatenate(values).astype(type.value_type.to_pandas_dtype())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), type=type)
