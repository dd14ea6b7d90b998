"""The data contract: every table the pipeline writes and the trainer reads, in one place.

Each table is a frozen row dataclass whose fields carry their Arrow type and a one-line meaning; the Arrow
schema is derived from it, so there is exactly one definition per column. Tables live as

    runs/<run_id>/round=<k>/<table>/part-*.parquet      + runs/<run_id>/round=<k>/manifest.json

`<root>` is a local folder or an object-store URL (`pipeline.storage`). `write_table` writes each part whole
or not at all (temp file + rename locally, one upload to an object store) and stamps the schema version into the Parquet metadata;
`read_table` refuses a missing column, a wrong type or a newer schema version, naming the file and the column.

Span convention everywhere: half-open [start, end) character offsets into `response_text`.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage import Location, location, open_input, write_file

SCHEMA_VERSION = 2  # 2: steps.failing_cases (a version-1 table reads with it empty)
_VERSION_KEY = b"didpo.schema_version"
_TABLE_KEY = b"didpo.table"

EXEC_STATUSES = ("passed", "failed", "timeout", "crashed", "invalid_action", "infra_error")
ACTION_KINDS = ("edit", "insert", "write", "run_tests", "finish", "invalid")

FILE_STRUCT = pa.struct([("path", pa.string()), ("text", pa.string())])
CASE_STRUCT = pa.struct([("case", pa.string()), ("detail", pa.string())])


class SchemaError(ValueError):
    """A table or manifest does not honour the data contract; the message names the file and the column."""


class RoundConflict(RuntimeError):
    """A completed stage of the round folder read other inputs than this run would: refuse, don't overwrite."""


def col(arrow_type: pa.DataType, doc: str, default: Any = dataclasses.MISSING, since: int = 1) -> Any:
    """A dataclass field that knows its Arrow type and meaning. `since`: the schema version that added it (an
    older file lacks it and reads with the default)."""
    meta = {"arrow": arrow_type, "doc": doc, "since": since}
    if default is dataclasses.MISSING:
        return field(metadata=meta)
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


_STR, _I32, _I64, _F32, _BOOL = pa.string(), pa.int32(), pa.int64(), pa.float32(), pa.bool_()


@dataclass(frozen=True)
class TrajectoryRow:
    traj_id: str = col(_STR, "content hash of (run_id, round, task_id, sample_index)")
    run_id: str = col(_STR, "run this trajectory belongs to")
    task_id: str = col(_STR, "task id, '<source>/<native id>'")
    round: int = col(_I32, "policy round k (0-based)")
    policy_version: str = col(_STR, "checkpoint identity of the behaviour policy")
    sample_index: int = col(_I32, "index of this rollout among the task's G samples")
    seed: int = col(_I64, "generation seed derived from (run, round, task, sample)")
    n_turns: int = col(_I32, "number of steps taken")
    episode_return: float = col(_F32, "discounted return from the first turn, R_0")
    outcome: float = col(_F32, "hidden tests: 1.0 if all pass, else 0.0")
    status: str = col(_STR, "finished / max_turns / truncated / infra_error")


@dataclass(frozen=True)
class StepRow:
    row_id: str = col(_STR, "content hash of (traj_id, turn); one training row")
    traj_id: str = col(_STR, "trajectory id")
    task_id: str = col(_STR, "task id")
    round: int = col(_I32, "policy round k")
    turn: int = col(_I32, "0-based turn index within the trajectory")
    prompt_token_ids: list = col(pa.list_(_I32), "tokenized prompt (chat template applied)")
    response_token_ids: list = col(pa.list_(_I32), "generated tokens, no padding")
    response_text: str = col(_STR, "decoded response")
    token_char_starts: list = col(pa.list_(_I32), "per response token: start of its character span")
    token_char_ends: list = col(pa.list_(_I32), "per response token: end of its character span (exclusive)")
    behavior_logprobs: list = col(pa.list_(_F32), "per response token: log-prob under the behaviour policy")
    action_kind: str = col(_STR, "edit / insert / write / run_tests / finish / invalid")
    action_status: str = col(_STR, "'ok' or the invalid-action reason")
    action_json: str = col(_STR, "the parsed action with the character span of every payload, as JSON")
    files_before: list = col(pa.list_(FILE_STRUCT), "workspace files the action touched, before it")
    files_after: list = col(pa.list_(FILE_STRUCT), "the same files after it (a deleted file is absent)")
    workspace_hash_before: str = col(_STR, "content hash of the whole workspace before the action")
    workspace_hash_after: str = col(_STR, "content hash of the whole workspace after the action")
    exec_status: str = col(_STR, "passed / failed / timeout / crashed / invalid_action / infra_error")
    visible_passed: int = col(_I32, "visible test cases passed after the action")
    visible_total: int = col(_I32, "visible test cases run")
    step_reward: float = col(_F32, "graded visible-test reward (+ terminal outcome on the last turn)")
    return_to_go: float = col(_F32, "R_t = sum_k gamma^(k-t) r_k")
    done: bool = col(_BOOL, "whether the episode ended with this step")
    failing_cases: list = col(pa.list_(CASE_STRUCT), "the test cases this step's run failed, each with why (the "
                              "expected and actual value or the error; first 10, 300 characters each)", default=[],
                              since=2)


_SPAN = pa.struct([("start", _I32), ("end", _I32)])  # a half-open [start, end) range


@dataclass(frozen=True)
class SubdiffRow:
    subdiff_id: str = col(_STR, "content hash of (row_id, file, edit_type, scale, line span)")
    row_id: str = col(_STR, "step that wrote it")
    traj_id: str = col(_STR, "trajectory id")
    task_id: str = col(_STR, "task id (the grouping key for anchors)")
    file: str = col(_STR, "workspace path")
    edit_type: str = col(_STR, "'add' or 'del'")
    scale: str = col(_STR, "candidate scale: 'hunk', 'win<k>', 'ast'")
    line_start: int = col(_I32, "first line in the after (add) or before (del) file, 0-based")
    line_end: int = col(_I32, "one past the last line")
    char_start: int = col(_I32, "bound: start of the first char span that wrote it (-1 if none)")
    char_end: int = col(_I32, "bound: end of the last char span (-1 if none); gaps may lie between")
    token_start: int = col(_I32, "bound: first token of token_spans (-1 if none)")
    token_end: int = col(_I32, "bound: one past the last token of token_spans (-1 if none)")
    char_spans: list = col(pa.list_(_SPAN), "response char ranges that wrote it, merged and sorted")
    token_spans: list = col(
        pa.list_(_SPAN), "response token index ranges sharing a char with char_spans, merged and sorted"
    )
    n_lines: int = col(_I32, "number of lines")
    normalized_text: str = col(_STR, "text after normalization (what is compared)")


@dataclass(frozen=True)
class AnchorRow:
    anchor_id: str = col(_STR, "content hash of the anchor's task, edit type and representative text (the same "
                                 "anchor in another round keeps its id)")
    task_id: str = col(_STR, "task group")
    edit_type: str = col(_STR, "'add' or 'del'")
    n_rows: int = col(_I32, "distinct step rows among the members")
    n_members: int = col(_I32, "member sub-diff occurrences")
    mean_lines: float = col(_F32, "mean size L in lines")
    gs: float = col(_F32, "groupability score")
    representative_subdiff_id: str = col(_STR, "member every other member is close to")
    text: str = col(_STR, "the representative's normalized text")


@dataclass(frozen=True)
class AnchorMemberRow:
    anchor_id: str = col(_STR, "anchor")
    subdiff_id: str = col(_STR, "member occurrence")
    row_id: str = col(_STR, "its step row")
    task_id: str = col(_STR, "task group")
    diff_advantage: float = col(_F32, "A^D of this occurrence")


@dataclass(frozen=True)
class AdvantageRow:
    row_id: str = col(_STR, "step row")
    traj_id: str = col(_STR, "trajectory id")
    task_id: str = col(_STR, "task id")
    estimator: str = col(_STR, "registered estimator name")
    lam: float = col(_F32, "lambda, weight of the diff-level term")
    episode_advantage: float = col(_F32, "A^E of the row")
    token_advantages: list = col(pa.list_(_F32), "one value per response token")
    loss_mask: list = col(pa.list_(pa.int8()), "1 where the token is trained on")
    n_diff_tokens: int = col(_I32, "tokens that received a diff-level term")


@dataclass(frozen=True)
class DeadLetterRow:
    key: str = col(_STR, "id of the record that failed (task, trajectory or row)")
    stage: str = col(_STR, "pipeline stage that gave up on it")
    reason: str = col(_STR, "why, with the last error")
    payload_json: str = col(_STR, "the record, as JSON, so nothing is lost")


# `stage` of a trajectory the sandbox failed on more than the retry cap allows (key = traj_id): it has no
# trajectory or step rows, and round summaries count it as a rollout that did not pass.
SANDBOX_LOST = "execute"


ROW_TYPES: dict[str, type] = {
    "trajectories": TrajectoryRow,
    "steps": StepRow,
    "subdiffs": SubdiffRow,
    "anchors": AnchorRow,
    "anchor_members": AnchorMemberRow,
    "advantages": AdvantageRow,
    "dead_letter": DeadLetterRow,
}
TABLES = tuple(ROW_TYPES)


def columns(table: str) -> tuple[str, ...]:
    """Column names of a contract table, in schema order (the one list of them)."""
    return tuple(f.name for f in dataclasses.fields(_row_type(table)))


def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of a contract table, with each field's meaning as field metadata."""
    row_type = _row_type(table)
    fields = [
        pa.field(f.name, f.metadata["arrow"], nullable=False, metadata={"doc": f.metadata["doc"]})
        for f in dataclasses.fields(row_type)
    ]
    return pa.schema(fields, metadata={_VERSION_KEY: str(SCHEMA_VERSION).encode(), _TABLE_KEY: table.encode()})


def _row_type(table: str) -> type:
    try:
        return ROW_TYPES[table]
    except KeyError:
        raise SchemaError(f"unknown table {table!r}; the contract has {', '.join(TABLES)}") from None


def record_of(row: Any) -> dict[str, Any]:
    """A row's fields as a dict, shallow: its values are plain data already, and `dataclasses.asdict` would
    deep-copy every token list (it was three quarters of the credit stage's time)."""
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}


def to_arrow(table: str, rows: Iterable[Any]) -> pa.Table:
    """Rows (dataclass instances or mappings) -> an Arrow table with exactly the contract schema."""
    schema = arrow_schema(table)
    names = schema.names
    columns: dict[str, list] = {n: [] for n in names}
    for i, row in enumerate(rows):
        record = record_of(row) if dataclasses.is_dataclass(row) else row
        missing = [n for n in names if n not in record]
        if missing:
            raise SchemaError(f"{table}: row {i} lacks column(s) {', '.join(missing)}")
        for n in names:
            columns[n].append(record[n])
    try:
        return pa.table([pa.array(columns[n], type=schema.field(n).type) for n in names], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise SchemaError(f"{table}: values do not fit the contract: {e}") from e


def _added_after(table: str, version: int) -> dict[str, Any]:
    """Columns a file of schema `version` predates -> the value they read with."""
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in dataclasses.fields(_row_type(table)) if f.metadata["since"] > version}


def _check_columns(table: str, got: pa.Schema, source: str, version: int = SCHEMA_VERSION,
                   schema: pa.Schema | None = None) -> None:
    """schema: the contract's columns to check (default: all of them)."""
    later = _added_after(table, version)
    for f in schema or arrow_schema(table):
        if f.name not in got.names:
            if f.name in later:
                continue
            raise SchemaError(f"{source}: table {table!r} is missing column {f.name!r} ({f.type})")
        got_type = got.field(f.name).type
        if got_type != f.type:
            raise SchemaError(f"{source}: column {f.name!r} of table {table!r} has type {got_type}, expected {f.type}")


def conform(table: str, data: pa.Table, *, source: str = "<memory>", version: int = SCHEMA_VERSION,
            columns: Sequence[str] | None = None) -> pa.Table:
    """Check `data` against the contract and return it with the exact schema (column order, types, metadata).

    Extra columns are dropped; a missing column or a type that differs is refused, naming `source` and the column,
    except a column added after `version` (the data's schema version), which is filled with its default.
    columns: only these columns of the contract (checked and returned in contract order).
    """
    schema = contract_columns(table, columns)
    _check_columns(table, data.schema, source, version, schema)
    for name, value in _added_after(table, version).items():
        if name in schema.names and name not in data.schema.names:
            data = data.append_column(schema.field(name), pa.array([value] * data.num_rows, schema.field(name).type))
    for f in schema:
        if data.column(f.name).null_count:
            raise SchemaError(f"{source}: column {f.name!r} of table {table!r} has null values")
    return pa.Table.from_arrays([data.column(n) for n in schema.names], schema=schema)


def contract_columns(table: str, columns: Sequence[str] | None = None) -> pa.Schema:
    """The contract's schema of `table`, or of only `columns` of it (in contract order); an unknown column is
    refused, naming it."""
    schema = arrow_schema(table)
    if columns is None:
        return schema
    if unknown := [c for c in columns if c not in schema.names]:
        raise SchemaError(f"table {table!r} has no column(s) {unknown}")
    return pa.schema([f for f in schema if f.name in columns], metadata=schema.metadata)


def _check_version(meta: Mapping[bytes, bytes] | None, table: str, source: str) -> int:
    meta = meta or {}
    if _VERSION_KEY not in meta:
        raise SchemaError(f"{source}: no didpo schema version in the file metadata (not written by write_table?)")
    version = int(meta[_VERSION_KEY])
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{source}: schema version {version} is newer than this code's {SCHEMA_VERSION}; upgrade didpo"
        )
    stored = meta.get(_TABLE_KEY, table.encode()).decode()
    if stored != table:
        raise SchemaError(f"{source}: holds table {stored!r}, not {table!r}")
    return version


def check_parquet_schema(file: str | Path, table: str) -> pq.FileMetaData:
    """Validate a Parquet file's footer (schema version, table name, columns and types) without reading data;
    returns the footer (`num_rows`, row groups).

    For readers that query files in place (DuckDB). Raises SchemaError naming the file and the column.
    """
    with _parquet_file(file, table) as (pf, _):
        return pf.metadata


@contextmanager
def _parquet_file(file: str | Path, table: str) -> Iterator[tuple[pq.ParquetFile, int]]:
    """A validated ParquetFile and its schema version, its handle closed on exit (an object store's open reads
    hold connections)."""
    source = open_input(location(file))
    try:
        try:
            pf = pq.ParquetFile(source)
        except (OSError, pa.ArrowException) as e:
            raise SchemaError(f"{file}: not a readable Parquet file of table {table!r}: {e}") from e
        version = _check_version(pf.schema_arrow.metadata, table, str(file))
        _check_columns(table, pf.schema_arrow, str(file), version)
        yield pf, version
    finally:
        if not isinstance(source, str):
            source.close()


def part_files(path: str | Path) -> list[Location]:
    """The Parquet parts of a table folder (sorted), or the file itself; local or object-store."""
    path = location(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise SchemaError(f"{path}: no such table (file or folder)")
    return sorted((p for p in path.glob("part-*.parquet")), key=str)


def read_table(path: str | Path, table: str, columns: Sequence[str] | None = None) -> pa.Table:
    """Read a contract table from a Parquet file or a folder of `part-*.parquet`, validated.

    columns: read only these (Parquet reads no other column's pages; a stage that needs a few columns of a
    wide table moves and holds only those). Raises SchemaError naming the file and the column for a missing
    column, a wrong type, a newer schema version, a file of another table, an unknown column asked for, or a
    file that is not readable Parquet.
    """
    schema = contract_columns(table, columns)
    parts = []
    for file in part_files(path):
        with _parquet_file(file, table) as (pf, version):
            stored = [n for n in schema.names if n in pf.schema_arrow.names]  # a column added later: its default
            try:
                parts.append(conform(table, pf.read(columns=stored), source=str(file), version=version,
                                     columns=schema.names))
            except SchemaError:
                raise
            except (OSError, pa.ArrowException) as e:
                raise SchemaError(f"{file}: not a readable Parquet file of table {table!r}: {e}") from e
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


def read_rows(path: str | Path, table: str) -> list[Any]:
    """Read a table as row dataclasses (small tables, tests and tools)."""
    row_type = _row_type(table)
    return [row_type(**r) for r in read_table(path, table).to_pylist()]


def atomic_write(dest: str | Path, write: Any) -> None:
    """Write `dest` whole or not at all (`storage.write_file`): temp file + rename locally, one upload to an
    object store."""
    write_file(location(dest), write)


@contextmanager
def atomic_folder(dest: Path) -> Iterator[Path]:
    """`atomic_write` for a folder: fill the yielded temp folder (next to `dest`); when the block completes it
    replaces `dest` whole, when it fails it is removed. Readers see the old folder or the new one, never half."""
    dest = Path(os.path.abspath(dest))
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a folder", str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes it private; an output folder is an ordinary shared one
        if not dest.exists():
            staging.rename(dest)
            return
        old = staging.with_name(staging.name + ".old")
        dest.rename(old)
        try:
            staging.rename(dest)
        except OSError:
            old.rename(dest)
            raise
        shutil.rmtree(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_table(data: pa.Table | Iterable[Any], folder: str | Path, table: str, *, part: int | str = 0) -> Path:
    """Write one part of a contract table atomically: `<folder>/part-<part>.parquet`.

    `data` is an Arrow table (validated with `conform`) or rows. Rewriting the same part replaces it whole, so
    a rerun is idempotent. Returns the file written.
    """
    arrow = conform(table, data) if isinstance(data, pa.Table) else to_arrow(table, data)
    name = f"part-{part:05d}.parquet" if isinstance(part, int) else f"part-{part}.parquet"
    dest = location(folder) / name
    write_file(dest, lambda tmp: pq.write_table(arrow, tmp, compression="zstd"))
    return dest


# ---- ids and layout -------------------------------------------------------------------------------------


# json.dumps with these options, made once: dumps builds an encoder per call (a third of an id's cost)
_ID_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_id(*parts: Any) -> str:
    """A deterministic id: the first 20 hex chars of sha256 over the parts' JSON (never a random UUID)."""
    blob = _ID_JSON.encode(parts)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def round_dir(root: str | Path, run_id: str, round_k: int) -> Location:
    """runs/<run_id>/round=<k> (a local folder or an object-store URL)"""
    return location(root) / run_id / f"round={round_k}"


def table_dir(round_path: str | Path, table: str) -> Location:
    _row_type(table)
    return location(round_path) / table


# ---- manifest -------------------------------------------------------------------------------------------


@dataclass
class Manifest:
    """What a round folder holds and how it was made; the resume logic reads `stages`."""

    run_id: str  # run name
    round: int  # policy round k
    config_hash: str  # content hash of the config that started the round (resume compares stages' `inputs`)
    git_sha: str  # code version that wrote the round ("unknown" outside a git checkout)
    policy_checkpoint: str  # behaviour policy of this round
    seeds: dict[str, int] = field(default_factory=dict)  # named seeds (generation, sampling, training)
    row_counts: dict[str, int] = field(default_factory=dict)  # table -> rows written
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> {completed_at, inputs, ...details}
    schema_version: int = SCHEMA_VERSION  # contract version of every table in the round

    def stage_done(self, stage: str) -> bool:
        return stage in self.stages


MANIFEST_NAME = "manifest.json"


def write_manifest(manifest: Manifest, round_path: str | Path) -> Location:
    dest = location(round_path) / MANIFEST_NAME
    text = json.dumps(dataclasses.asdict(manifest), indent=2, sort_keys=True)
    atomic_write(dest, lambda tmp: Path(tmp).write_text(text + "\n"))
    return dest


def read_manifest(round_path: str | Path) -> Manifest:
    """Read and validate a round's manifest; refuses unknown or missing keys and newer schema versions."""
    src = location(round_path) / MANIFEST_NAME
    try:
        raw = json.loads(src.read_text())
    except FileNotFoundError:
        raise SchemaError(f"{src}: no manifest") from None
    except json.JSONDecodeError as e:
        raise SchemaError(f"{src}: not valid JSON ({e})") from e
    names = {f.name for f in dataclasses.fields(Manifest)}
    required = {f.name for f in dataclasses.fields(Manifest) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    if not isinstance(raw, dict):
        raise SchemaError(f"{src}: expected a JSON object")
    if unknown := sorted(set(raw) - names):
        raise SchemaError(f"{src}: unknown manifest key(s) {unknown}; allowed: {sorted(names)}")
    if missing := sorted(required - set(raw)):
        raise SchemaError(f"{src}: manifest lacks key(s) {missing}")
    if int(raw.get("schema_version", SCHEMA_VERSION)) > SCHEMA_VERSION:
        raise SchemaError(f"{src}: schema version {raw['schema_version']} is newer than {SCHEMA_VERSION}")
    return Manifest(**raw)


def describe(tables: Sequence[str] = TABLES) -> str:
    """Human-readable listing of the contract (for docs and `didpo schema`)."""
    lines = [f"schema version {SCHEMA_VERSION}"]
    for t in tables:
        lines.append(f"\n{t}")
        for f in arrow_schema(t):
            lines.append(f"  {f.name:<24} {str(f.type):<40} {f.metadata[b'doc'].decode()}")
    return "\n".join(lines)
