"""Contract tables in and out of Beam: validated reads, deterministic atomic sharded writes.

Elements are Arrow tables (a part, a task's rows), not rows: Beam then moves and encodes a few large
elements instead of thousands of small ones, and a part is written by concatenating them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from pipeline import schema


def shard_of(key: str, num_shards: int) -> int:
    """A stable shard for a key (Python's hash() is salted per process: never use it for placement)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big") % num_shards


def as_table(element: Any, table: str) -> pa.Table:
    """A row (dataclass or contract dict) or an Arrow table of rows -> an Arrow table of the contract."""
    return element if isinstance(element, pa.Table) else schema.to_arrow(table, [element])


def by_key(data: pa.Table, key: str) -> Iterator[tuple[str, pa.Table]]:
    """(value, its rows) per distinct value of column `key`, by value; rows keep their order within each."""
    keys = np.asarray(data.column(key).to_pylist(), dtype=object)
    if len(keys) and (keys == keys[0]).all():  # the common case: one task's rows
        yield keys[0], data
        return
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(keys[order][1:] != keys[order][:-1]) + 1
    for rows in np.split(order, cuts) if len(order) else ():
        yield keys[rows[0]], data.take(rows)


def _by_shard(element: Any, table: str, key: str, num_shards: int) -> Iterator[tuple[int, pa.Table]]:
    shards: dict[int, list[pa.Table]] = {}
    for value, rows in by_key(as_table(element, table), key):
        shards.setdefault(shard_of(value, num_shards), []).append(rows)
    for shard, parts in shards.items():
        yield shard, pa.concat_tables(parts)


def _write_part(item: tuple[int, Iterable[pa.Table]], folder: str, table: str, sort_by: Sequence[str],
                prefix: str) -> tuple[str, str, int]:
    shard, batches = item
    data = pa.concat_tables(list(batches))
    # same rows -> byte-identical part, whatever order and batches Beam delivered them in: a stable sort,
    # then one chunk per column (Parquet's pages follow the chunks)
    data = data.take(pc.sort_indices(data, [(k, "ascending") for k in sort_by])).combine_chunks()
    path = schema.write_table(data, folder, table, part=f"{prefix}{shard:05d}")
    Metrics.counter("didpo_tables", f"{table}_rows").inc(data.num_rows)
    return table, str(path), data.num_rows


class WriteTable(beam.PTransform):
    """Arrow tables of a contract table's rows (or single rows) -> `<round_dir>/<table>/part-<shard>.parquet`.

    Rows are placed by a stable hash of their `key` column and sorted by the `sort_by` columns inside each
    part, so a rerun writes the same bytes to the same files; each part is written atomically (temp +
    rename). `prefix` keeps the parts of two stages that write the same table apart (dead letters). Emits
    (table, path, n_rows).
    """

    def __init__(self, round_dir: str | Path, table: str, key: str, sort_by: Sequence[str] = (),
                 num_shards: int = 4, prefix: str = "") -> None:
        super().__init__()
        schema.contract_columns(table, (key, *sort_by))  # unknown table or column: refused here, not on a worker
        self.folder = str(schema.table_dir(round_dir, table))
        self.table, self.key, self.num_shards = table, key, num_shards
        self.sort_by = tuple(sort_by) or (key,)
        self.prefix = prefix

    def expand(self, tables: beam.PCollection) -> beam.PCollection:
        return (
            tables
            | "KeyByShard" >> beam.FlatMap(_by_shard, self.table, self.key, self.num_shards)
            | "GroupShards" >> beam.GroupByKey()
            | "WriteParts" >> beam.Map(_write_part, self.folder, self.table, self.sort_by, self.prefix)
        )


class ReadTable(beam.PTransform):
    """A contract table's parts -> one Arrow table per part, each validated against the schema on the
    worker; `columns`: only those columns (a stage that reads a few columns of a wide table moves only them)."""

    def __init__(self, round_dir: str | Path, table: str, columns: Sequence[str] | None = None) -> None:
        super().__init__()
        schema.contract_columns(table, columns)  # an unknown column: refused at graph construction
        self.table, self.columns = table, None if columns is None else tuple(columns)
        self.parts = [str(p) for p in schema.part_files(schema.table_dir(round_dir, table))]

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "ListParts" >> beam.Create(self.parts)
            | "ReadParts" >> beam.Map(schema.read_table, self.table, self.columns)
        )
