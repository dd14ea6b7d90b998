"""DuckDB SQL over a round's Parquet tables: views, layered queries, analysis queries, token projection.

How a query runs (the convention of sql/README.md):

1. `connect_round` registers every contract table folder the round has as a view named after the table
   (`steps`, `trajectories`, `subdiffs`, `anchors`, `anchor_members`, `advantages`, `dead_letter`), read in
   place with `read_parquet`, after checking each part's footer against the contract; and a one-row table
   `params` (adv_norm, std_eps, lam) that the advantage queries read.
2. `run_layers` creates one view per layered file `sql/<layer>_<name>.sql`, named after the file stem, in
   dependency order: staging_* (typed views over the tables) -> anchors_* -> advantages_*. A view whose
   tables the round lacks is skipped; a query that needs it is refused by `run_query`, naming the table.
3. `run_query` runs a layered view, an analysis query (`sql/analysis/*.sql`), a mart (`sql/marts/*.sql`) or
   any .sql file. `round_metrics` reads the one mart every round report shows.
4. `sql_advantages` projects the SQL advantages (`advantages_rows`) onto tokens with numpy and returns the
   `advantages` table of the contract, sorted by row_id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from pipeline import schema
from pipeline.assets import asset_dir
from pipeline.credit.settings import CreditSettings
from pipeline.storage import Location, location

# DuckDB loads with the first query, so the CLI's other commands (pretraining on a GPU box) run without it
if TYPE_CHECKING:
    import duckdb

SQL_DIR = asset_dir("sql")
ANALYSIS_DIR = SQL_DIR / "analysis"
MARTS_DIR = SQL_DIR / "marts"
LAYERS = ("staging", "anchors", "advantages")  # creation order; a layer reads only earlier layers or its own
SQL_PARAMS = ("adv_norm", "std_eps", "lam")  # columns of the one-row `params` table
ESTIMATOR = "didpo"  # the estimator the SQL computes


class SqlError(ValueError):
    """A query that cannot run: unknown name, bad parameter, a failing query; the message says which."""


class MissingTableError(SqlError):
    """A query needs a table the round folder does not have; the message names the table and the folder."""


# ---- queries ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One .sql file: a layered view (layer set) or a standalone query (layer None)."""

    name: str  # view name (file stem) or the analysis query's name
    path: Path  # the file
    layer: str | None  # 'staging' / 'anchors' / 'advantages', or None for analysis and ad-hoc files
    text: str  # the SQL, trailing semicolons stripped

    @property
    def header(self) -> str:
        """The file's leading comment block as one line: the question it answers (analysis queries)."""
        lines = []
        for line in self.text.splitlines():
            stripped = line.strip()
            if not stripped.startswith("--"):
                break
            lines.append(" ".join(stripped.lstrip("-").split()))
        return " ".join(line for line in lines if line)

    @property
    def summary(self) -> str:
        """The first line of the header, without a leading '<name>:'."""
        first = next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")
        first = " ".join(first.lstrip("-").split()) if first.startswith("--") else ""
        return first.removeprefix(f"{self.name}:").strip()


_COMMENT_OR_STRING = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", re.S)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def references(text: str, names: set[str] | frozenset[str]) -> set[str]:
    """The names among `names` that a query mentions as bare identifiers (comments and strings ignored)."""
    code = _COMMENT_OR_STRING.sub(" ", text)
    return {m.group(0) for m in _IDENTIFIER.finditer(code)} & set(names)


def _load(path: Path, layer: str | None) -> Query:
    try:
        text = path.read_text(encoding="utf-8").rstrip().rstrip(";").rstrip()
    except UnicodeDecodeError as e:
        raise SqlError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return Query(name=path.stem, path=path, layer=layer, text=text)


def layered_queries(sql_dir: Path = SQL_DIR) -> list[Query]:
    """The layered view files `<layer>_<name>.sql` of `sql_dir`, in creation (dependency) order.

    Order: a view comes after every view it reads; ties by layer, then name. Refuses a file outside the
    layers, a view that reads a later layer, and a cycle, naming the files.
    """
    queries: dict[str, Query] = {}
    for path in sorted(sql_dir.glob("*.sql")):
        layer = path.stem.split("_", 1)[0]
        if layer not in LAYERS or "_" not in path.stem:
            raise SqlError(f"{path}: layered files are named <layer>_<name>.sql with layer in {LAYERS}")
        queries[path.stem] = _load(path, layer)
    rank = {name: LAYERS.index(q.layer or "") for name, q in queries.items()}
    deps = {name: references(q.text, frozenset(queries)) - {name} for name, q in queries.items()}
    for name, needed in deps.items():
        for dep in sorted(needed):
            if rank[dep] > rank[name]:
                raise SqlError(f"{queries[name].path}: reads {dep}, a later layer ({LAYERS[rank[dep]]}); "
                               f"a layer may read only earlier layers or its own")
    ordered: list[Query] = []
    done: set[str] = set()
    while len(done) < len(queries):
        ready = sorted((rank[n], n) for n in queries if n not in done and deps[n] <= done)
        if not ready:
            stuck = sorted(set(queries) - done)
            raise SqlError(f"{sql_dir}: views that read each other in a cycle: {', '.join(stuck)}")
        _, name = ready[0]
        ordered.append(queries[name])
        done.add(name)
    return ordered


def analysis_queries(analysis_dir: Path = ANALYSIS_DIR) -> list[Query]:
    """The analysis queries `sql/analysis/*.sql`, by name."""
    return [_load(path, None) for path in sorted(analysis_dir.glob("*.sql"))]


def mart_queries(marts_dir: Path = MARTS_DIR) -> list[Query]:
    """The marts `sql/marts/*.sql`: the figures reports and commands read, by name."""
    return [_load(path, None) for path in sorted(marts_dir.glob("*.sql"))]


def available_queries() -> list[Query]:
    """Every named query: layered views first (in creation order), then analysis queries, then marts."""
    queries = layered_queries() + analysis_queries() + mart_queries()
    seen: dict[str, Path] = {}
    for q in queries:
        if q.name in seen:
            raise SqlError(f"two queries are named {q.name!r}: {seen[q.name]} and {q.path}")
        seen[q.name] = q.path
    return queries


def find_query(name_or_file: str | Path) -> Query:
    """A query by name (`reward_by_turn`, `analysis/reward_by_turn`, `advantages_episode`) or .sql path."""
    queries = available_queries()
    path = Path(name_or_file)
    if path.suffix == ".sql" and path.is_file():
        for q in queries:
            if q.path.resolve() == path.resolve():
                return q
        return _load(path, None)
    name = str(name_or_file).removeprefix("analysis/").removeprefix("marts/").removesuffix(".sql")
    for q in queries:
        if q.name == name:
            return q
    raise SqlError(f"no query named {str(name_or_file)!r} and no such .sql file; "
                   f"known queries: {', '.join(q.name for q in queries)}")


def dependencies(query: Query, layered: list[Query] | None = None) -> tuple[set[str], set[str]]:
    """(layered views, contract tables) that a query reads, directly or through the views it reads.

    A layered query's own view is part of the first set.
    """
    layered = layered_queries() if layered is None else layered
    by_name = {q.name: q for q in layered}
    views = {query.name} if query.layer else set()
    tables: set[str] = set()
    todo = [query]
    while todo:
        q = todo.pop()
        tables |= references(q.text, frozenset(schema.TABLES))
        for name in sorted(references(q.text, frozenset(by_name)) - views):
            views.add(name)
            todo.append(by_name[name])
    return views, tables


# ---- parameters and connections ---------------------------------------------------------------------------


def sql_params(params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validated values of the `params` table; what is not given takes CreditSettings' default."""
    given = dict(params or {})
    if unknown := sorted(set(given) - set(SQL_PARAMS)):
        raise SqlError(f"unknown SQL parameter(s) {unknown}; allowed: {list(SQL_PARAMS)}")
    try:
        settings = CreditSettings(**given)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise SqlError(f"invalid SQL parameter(s): {problems}") from None
    return {name: getattr(settings, name) for name in SQL_PARAMS}


def set_params(con: duckdb.DuckDBPyConnection, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """(Re)create the one-row `params` table the advantage views read; returns the values used."""
    values = sql_params(params)
    con.execute(
        "CREATE OR REPLACE TABLE params AS SELECT ?::VARCHAR AS adv_norm, ?::DOUBLE AS std_eps, ?::DOUBLE AS lam",
        [values["adv_norm"], values["std_eps"], values["lam"]],
    )
    return values


def resolve_round(path: str | Path) -> Location:
    """A round folder as given, or the latest `round=<k>` folder of a run folder (local or object-store URL)."""
    path = location(path)
    if not path.is_dir():
        raise SqlError(f"{path}: no such folder (expected runs/<run_id>/round=<k> or runs/<run_id>)")
    if re.fullmatch(r"round=\d+", path.name) or (path / schema.MANIFEST_NAME).is_file() or any(
        (path / t).is_dir() for t in schema.TABLES
    ):
        return path
    rounds = [(int(p.name.split("=", 1)[1]), p) for p in path.iterdir()
              if p.is_dir() and re.fullmatch(r"round=\d+", p.name)]
    if not rounds:
        raise SqlError(f"{path}: neither a round folder (table folders) nor a run folder with round=<k> folders")
    return max(rounds)[1]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect_round(round_dir: str | Path, params: Mapping[str, Any] | None = None, *,
                  absent_as_empty: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per contract table the round has, plus `params`.

    Tables are read in place (no copy). A table folder with no parts is an empty view with the contract
    columns; a table without a folder has no view, unless `absent_as_empty` (a round whose later stages have
    not run yet: no anchors, no advantages). Raises SchemaError for a part that breaks the contract.
    """
    import duckdb

    round_dir = location(round_dir)
    if not round_dir.is_dir():
        raise SqlError(f"{round_dir}: no such round folder")
    con = duckdb.connect()
    try:
        if not isinstance(round_dir, Path):
            con.register_filesystem(round_dir.fs)  # DuckDB reads the URL's parts through fsspec (no httpfs)
        for table in schema.TABLES:
            folder = schema.table_dir(round_dir, table)
            if not folder.is_dir():
                if absent_as_empty:
                    con.register(table, schema.arrow_schema(table).empty_table())
                continue
            parts = schema.part_files(folder)
            for part in parts:
                schema.check_parquet_schema(part, table)
            if parts:
                files = ", ".join(_quote(str(p)) for p in parts)
                con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{files}])")
            else:
                con.register(table, schema.arrow_schema(table).empty_table())
        set_params(con, params)
    except BaseException:
        con.close()
        raise
    return con


def present_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The contract tables registered on a connection."""
    names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    return names & set(schema.TABLES)


def _existing_views(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


def run_layers(con: duckdb.DuckDBPyConnection, only: Iterable[str] | None = None) -> list[str]:
    """Create the layered views (staging -> anchors -> advantages) whose tables are present.

    only: create just these views (a query's `dependencies`); None = every layered view. A view the
    connection already has is kept. Returns the layered views the connection has afterwards, in order.
    """
    import duckdb

    layered = layered_queries()
    present, existing = present_tables(con), _existing_views(con)
    wanted = None if only is None else set(only)
    available: list[str] = []
    for q in layered:
        if (wanted is not None and q.name not in wanted) or not dependencies(q, layered)[1] <= present:
            continue
        if q.name not in existing:
            try:
                con.execute(f"CREATE VIEW {q.name} AS\n{q.text}")
            except duckdb.Error as e:
                raise SqlError(f"{q.path}: cannot create view {q.name}: {e}") from e
        available.append(q.name)
    return available


def query_table(
    con: duckdb.DuckDBPyConnection, name_or_file: str | Path, round_dir: str | Path | None = None
) -> pa.Table:
    """Run one query on a `connect_round` connection, creating the layered views it needs.

    Raises MissingTableError naming the table (and its folder, given `round_dir`) when the connection lacks
    one the query needs, and SqlError (with DuckDB's message) when the query fails, e.g. on a contract check
    inside the SQL.
    """
    import duckdb

    query = find_query(name_or_file)
    views, tables = dependencies(query)
    where = "the connection" if round_dir is None else str(round_dir)
    if missing := sorted(tables - present_tables(con)):
        folders = "" if round_dir is None else " (no folder " + ", ".join(
            str(schema.table_dir(round_dir, t)) for t in missing) + ")"
        raise MissingTableError(
            f"query {query.name!r} needs table(s) {', '.join(missing)}, which {where} does not have{folders}"
        )
    run_layers(con, only=views)
    sql = f"SELECT * FROM {query.name}" if query.layer else query.text
    try:
        result = con.sql(sql)
        return result.to_arrow_table() if result is not None else pa.table({})
    except duckdb.Error as e:
        raise SqlError(f"query {query.name!r} on {where} failed: {e}") from e


def run_query(
    round_dir: str | Path, name_or_file: str | Path, params: Mapping[str, Any] | None = None
) -> pa.Table:
    """Run one query (layered view, analysis query or .sql file) against a round's tables.

    params: values of the `params` table (adv_norm, std_eps, lam); CreditSettings' defaults otherwise.
    Errors as `query_table`.
    """
    round_dir = location(round_dir)
    find_query(name_or_file)  # an unknown name is refused before the tables are opened
    con = connect_round(round_dir, params)
    try:
        return query_table(con, name_or_file, round_dir)
    finally:
        con.close()


ROUND_METRICS = "round_metrics"  # sql/marts/round_metrics.sql


def round_metrics(round_dir: str | Path) -> dict[str, Any]:
    """The `round_metrics` mart of one round as a dict (tables its stages have not written yet count as
    empty). Every report of a round reads its figures from here."""
    con = connect_round(round_dir, absent_as_empty=True)
    try:
        rows = query_table(con, ROUND_METRICS, round_dir).to_pylist()
    finally:
        con.close()
    return rows[0]


# ---- token projection -------------------------------------------------------------------------------------


def project_tokens(
    n_tokens: np.ndarray,
    episode_adv: np.ndarray,
    occ_row: np.ndarray,
    occ_token_start: np.ndarray,
    occ_token_end: np.ndarray,
    occ_diff_adv: np.ndarray,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Token projection (DESIGN.md step 10) over a whole table at once, without a per-token loop.

    n_tokens: [R] response tokens per row; episode_adv: [R] A^E per row.
    occ_row, occ_token_start, occ_token_end, occ_diff_adv: [O] per token range of an anchored occurrence:
      its row index, the half-open range (0 <= start < end <= n_tokens[row]) and the occurrence's A^D; an
      occurrence with several ranges (its `token_spans`) gives several entries. Where ranges of a row
      overlap, the one that comes first in the arrays wins (callers pass occurrences in priority order).
    Returns (token_adv, covered), both [sum(n_tokens)], row r's tokens at [offsets[r], offsets[r+1]) with
      offsets = [0, cumsum(n_tokens)]: token_adv = A^E + lam * A^D(winning occurrence), exactly A^E on a
      token no occurrence covers; covered marks the tokens that received a diff-level term.
    """
    n_tokens = np.asarray(n_tokens, np.int64)
    start, end = np.asarray(occ_token_start, np.int64), np.asarray(occ_token_end, np.int64)
    occ_row = np.asarray(occ_row, np.int64)
    bad = np.flatnonzero((start < 0) | (end <= start) | (end > n_tokens[occ_row]))
    if bad.size:
        i = int(bad[0])
        raise SqlError(f"occurrence {i}: token span [{start[i]}, {end[i]}) is not inside the "
                       f"{n_tokens[occ_row[i]]} tokens of row index {occ_row[i]}")
    offsets = np.concatenate([[0], np.cumsum(n_tokens)])
    lengths = end - start
    pair_occ = np.repeat(np.arange(start.size), lengths)  # one (token, occurrence) pair per covered token
    pair_first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    pair_tok = (offsets[occ_row] + start)[pair_occ] + (np.arange(pair_occ.size) - pair_first)
    order = np.argsort(pair_tok, kind="stable")  # stable: per token, the earliest occurrence comes first
    sorted_tok = pair_tok[order]
    first = np.ones(sorted_tok.size, bool)
    first[1:] = sorted_tok[1:] != sorted_tok[:-1]
    tokens, winners = sorted_tok[first], pair_occ[order][first]

    token_adv = np.repeat(np.asarray(episode_adv, np.float64), n_tokens)
    token_adv[tokens] += lam * np.asarray(occ_diff_adv, np.float64)[winners]
    covered = np.zeros(token_adv.size, bool)
    covered[tokens] = True
    return token_adv, covered


def sql_advantages(
    round_dir: str | Path,
    *,
    lam: float = CreditSettings.model_fields["lam"].default,
    adv_norm: str = CreditSettings.model_fields["adv_norm"].default,
    std_eps: float = CreditSettings.model_fields["std_eps"].default,
) -> pa.Table:
    """The `advantages` table computed by the SQL layers, one row per step row, sorted by row_id.

    token_advantages[i] = (A^E + lam * A^D) * loss_mask[i], where A^D is that of the first occurrence, in the
    order of `advantages_rows` (higher GS, more covered chars, smaller subdiff_id, smaller anchor_id), whose
    token_spans hold token i; A^E alone outside every anchor. loss_mask is 1 on every response token;
    n_diff_tokens counts the tokens that received a diff-level term (0 everywhere when lam = 0), as
    `pipeline.credit` does.
    """
    params = sql_params({"lam": lam, "adv_norm": adv_norm, "std_eps": std_eps})
    rows = run_query(round_dir, "advantages_rows", params).sort_by("row_id").combine_chunks()
    n_tokens = rows["n_tokens"].to_numpy().astype(np.int64)
    episode_adv = rows["episode_advantage"].to_numpy().astype(np.float64)
    occurrences = rows["occurrences"].chunk(0) if rows.num_rows else pa.array([], rows.schema.field("occurrences").type)
    flat = pc.list_flatten(occurrences)  # [O] occurrences, row by row, each row's in priority order
    occ_row = pc.list_parent_indices(occurrences).to_numpy()
    spans = pc.struct_field(flat, "token_spans")
    span_occ = pc.list_parent_indices(spans).to_numpy()  # [S] occurrence of each token range, in order
    span_flat = pc.list_flatten(spans)
    token_adv, covered = project_tokens(
        n_tokens,
        episode_adv,
        occ_row=occ_row[span_occ],
        occ_token_start=pc.struct_field(span_flat, "start").to_numpy(),
        occ_token_end=pc.struct_field(span_flat, "end").to_numpy(),
        occ_diff_adv=pc.struct_field(flat, "diff_advantage").to_numpy()[span_occ],
        lam=params["lam"],
    )
    if not params["lam"]:
        covered[:] = False  # no token received a diff-level term
    mask = np.ones(token_adv.size, np.int8)
    offsets = pa.array(np.concatenate([[0], np.cumsum(n_tokens)]), pa.int32())
    row_of_token = np.repeat(np.arange(rows.num_rows), n_tokens)
    n_diff = np.bincount(row_of_token[covered], minlength=rows.num_rows)
    result = pa.table({
        "row_id": rows["row_id"],
        "traj_id": rows["traj_id"],
        "task_id": rows["task_id"],
        "estimator": pa.array([ESTIMATOR] * rows.num_rows, pa.string()),
        "lam": pa.array(np.full(rows.num_rows, params["lam"], np.float32)),
        "episode_advantage": pa.array(episode_adv.astype(np.float32)),
        "token_advantages": pa.ListArray.from_arrays(offsets, pa.array((token_adv * mask).astype(np.float32))),
        "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(mask)),
        "n_diff_tokens": pa.array(n_diff.astype(np.int32)),
    })
    return schema.conform("advantages", result, source=f"sql_advantages({round_dir})")
