"""`didpo sql NAME|FILE --run DIR`: run one DuckDB query against a round's tables and show the result.

    didpo sql --list                                        queries and the question each answers
    didpo sql reward_by_turn --run runs/local               print (latest round of the run)
    didpo sql advantages_diff --run runs/local/round=0 --set credit.adv_norm=mean_std_norm --out adv_diff.parquet
    didpo sql my_query.sql --run runs/local --out result.csv
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import typer
from rich.console import Console
from rich.table import Table

from pipeline import schema
from pipeline.sqlrun import (
    MARTS_DIR,
    SQL_PARAMS,
    Query,
    SqlError,
    available_queries,
    dependencies,
    find_query,
    resolve_round,
    run_query,
)
from pipeline.storage import Location
from workflows.errors import UserError
from workflows.options import ConfigOpt, SetOpt, load_or_exit

OUT_FORMATS = (".csv", ".parquet")


def _cell(value: object) -> str:
    if value is None:
        return "∅"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = json.dumps(value, default=str) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _print_table(console: Console, result: pa.Table, title: str, limit: int) -> None:
    """Columns side by side when they fit the terminal; else one record per block, each column on its own
    line (as psql's expanded display), so a wide result stays readable at 80 columns and in a pipe."""
    rows = result.slice(0, limit).to_pylist()
    widths = [max([len(name), *(len(_cell(r[name])) for r in rows)]) for name in result.column_names]
    if sum(w + 3 for w in widths) + 1 > console.width:
        _print_records(console, result, rows, title)
    else:
        _print_columns(console, result, rows, title)
    if result.num_rows > limit:
        console.print(f"showing {limit} of {result.num_rows} rows (--limit N, or --out FILE for all)")


def _print_records(console: Console, result: pa.Table, rows: list[dict], title: str) -> None:
    console.print(title, highlight=False)
    for i, row in enumerate(rows, 1):
        table = Table(title=f"record {i}", title_justify="left", show_header=False, box=None, padding=(0, 1))
        table.add_column("column", style="bold", no_wrap=True)
        table.add_column("value", overflow="fold")
        for name in result.column_names:
            table.add_row(name, _cell(row[name]))
        console.print(table)


def _print_columns(console: Console, result: pa.Table, rows: list[dict], title: str) -> None:
    table = Table(title=title, title_justify="left")
    for name in result.column_names:
        numeric = pa.types.is_integer(result.schema.field(name).type) or pa.types.is_floating(
            result.schema.field(name).type)
        table.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row.values()))
    console.print(table)


def _flat_for_csv(result: pa.Table) -> pa.Table:
    """CSV has no nested values: lists and structs become JSON text."""
    columns = []
    for name in result.column_names:
        column = result[name]
        if pa.types.is_nested(column.type):
            column = pa.array([None if v is None else json.dumps(v, default=str) for v in column.to_pylist()],
                              pa.string())
        columns.append(column)
    return pa.table(columns, names=result.column_names)


def write_result(result: pa.Table, out: Path) -> None:
    """Write a query result to .csv or .parquet atomically (temp file + rename)."""
    if out.suffix == ".csv":
        schema.atomic_write(out, lambda tmp: pacsv.write_csv(_flat_for_csv(result), tmp))
    else:
        schema.atomic_write(out, lambda tmp: pq.write_table(result, tmp, compression="zstd"))


def _refuse_empty_inputs(query: Query, round_dir: Location) -> None:
    """A query over tables without a single row answers nothing: refuse it rather than print an empty table."""
    tables = sorted(dependencies(query)[1])
    folders = [schema.table_dir(round_dir, t) for t in tables]
    if not tables or not all(f.is_dir() for f in folders):
        return  # nothing to check, or a missing table, which run_query refuses by name
    rows = sum(schema.check_parquet_schema(part, table).num_rows
               for table, folder in zip(tables, folders, strict=True) for part in schema.part_files(folder))
    if rows == 0:
        raise SqlError(f"{round_dir}: table(s) {', '.join(tables)} have no rows; query {query.name!r} has "
                       "nothing to read (is the round complete?)")


def _list_queries(console: Console) -> None:
    table = Table(title="queries (didpo sql NAME --run DIR)", title_justify="left")
    table.add_column("name")
    table.add_column("kind")
    table.add_column("what it answers", overflow="fold")
    for q in available_queries():
        kind = f"view ({q.layer})" if q.layer else "mart" if q.path.parent == MARTS_DIR else "analysis"
        table.add_row(q.name, kind, q.summary if q.layer else q.header)
    console.print(table)


def sql(
    name_or_file: Annotated[str | None, typer.Argument(help="query name (see --list) or a .sql file")] = None,
    run: Annotated[str | None, typer.Option(
        "--run", "-r", help="round folder runs/<id>/round=<k>, or a run folder (latest round); a local path "
        "or an object-store URL")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="write every row to FILE.csv or FILE.parquet")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, help="rows to print")] = 50,
    list_queries: Annotated[bool, typer.Option("--list", help="list the available queries and exit")] = False,
    config: Path | None = ConfigOpt,
    overrides: list[str] = SetOpt,
) -> None:
    """Run a DuckDB query (sql/ or a file) against a round's Parquet tables and print or save the result."""
    console = Console()
    if list_queries:
        _list_queries(console)
        return
    if name_or_file is None or run is None:
        raise UserError("usage: didpo sql NAME|FILE --run DIR  (didpo sql --list shows the queries)")
    credit = load_or_exit(config, overrides).credit  # the `params` table: adv_norm, std_eps, lam
    if out is not None and out.suffix not in OUT_FORMATS:
        raise UserError(f"--out {out}: unknown format {out.suffix!r}; use one of {', '.join(OUT_FORMATS)}")
    # an SqlError or SchemaError (a missing table, a contract break) exits 1, one line (workflows/errors.py)
    query = find_query(name_or_file)
    round_dir = resolve_round(run)
    _refuse_empty_inputs(query, round_dir)
    result = run_query(round_dir, name_or_file, {k: getattr(credit, k) for k in SQL_PARAMS})
    if out is not None:
        write_result(result, out)
        typer.echo(f"wrote {result.num_rows} rows to {out}")
        return
    _print_table(console, result, f"{query.name} on {round_dir} ({result.num_rows} rows)", limit)
