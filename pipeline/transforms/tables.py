"""Contract tables in and out of Beam: validated reads, deterministic atomic sharded writes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline import schema


def shard_of(key: str, num_shards: int) -> int:
    """A stable shard for a key (Python's hash() is salted per process: never use it for placement)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big") % num_shards


def _write_part(item: tuple[int, Iterable[Any]], folder: str, table: str, sort_key: Callable[[Any], Any],
                prefix: str) -> tuple[str, str, int]:
    shard, rows = item
    rows = sorted(rows, key=sort_key)  # same rows -> byte-identical part, whatever order Beam delivered
    path = schema.write_table(rows, folder, table, part=f"{prefix}{shard:05d}")
    Metrics.counter("didpo_tables", f"{table}_rows").inc(len(rows))
    return table, str(path), len(rows)


class WriteTable(beam.PTransform):
    """rows -> `<round_dir>/<table>/part-<shard>.parquet`.

    Rows are placed by a stable hash of `key_fn(row)` and sorted inside each part, so a rerun writes the same
    bytes to the same files; each part is written atomically (temp + rename). `prefix` keeps the parts of two
    stages that write the same table apart (dead letters). Emits (table, path, n_rows).
    """

    def __init__(self, round_dir: str | Path, table: str, key_fn: Callable[[Any], str],
                 sort_key: Callable[[Any], Any] | None = None, num_shards: int = 4, prefix: str = "") -> None:
        super().__init__()
        schema.arrow_schema(table)  # unknown table: fail at graph construction, not on a worker
        self.folder = str(schema.table_dir(round_dir, table))
        self.table, self.key_fn, self.num_shards = table, key_fn, num_shards
        self.sort_key = sort_key or key_fn
        self.prefix = prefix

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        key_fn, n = self.key_fn, self.num_shards
        return (
            rows
            | "KeyByShard" >> beam.Map(lambda r: (shard_of(key_fn(r), n), r))
            | "GroupShards" >> beam.GroupByKey()
            | "WriteParts" >> beam.Map(_write_part, self.folder, self.table, self.sort_key, self.prefix)
        )


def _read_part(path: str, table: str) -> Iterable[Any]:
    yield from schema.read_rows(path, table)


class ReadTable(beam.PTransform):
    """A contract table's parts -> row dataclasses, each part validated against the schema on the worker."""

    def __init__(self, round_dir: str | Path, table: str) -> None:
        super().__init__()
        self.table = table
        self.parts = [str(p) for p in schema.part_files(schema.table_dir(round_dir, table))]

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "ListParts" >> beam.Create(self.parts)
            | "ReadParts" >> beam.FlatMap(_read_part, self.table)
        )
