"""`didpo credit --steps STEPS --out DIR`: re-run credit assignment on a steps table.

Reads a steps table (a Parquet file or a folder of parts; the data contract), runs `pipeline.credit`
(`credit_units`, then `assign_advantages`) with the config's `credit` section and writes the subdiffs, anchors,
anchor_members and advantages tables under DIR (DIR/<table>/part-00000.parquet) plus DIR/credit_diagnostics.json. Users
re-run credit assignment with other settings without regenerating rollouts. DIR is written in a temp folder
next to it and moved into place when complete, replacing an earlier credit output there; a failure leaves no
half-written DIR.

    didpo credit --steps runs/local/round=0/steps --out /tmp/credit --set credit.estimator=didpo_did \
        --set credit.lam=1.2
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipeline.credit import CreditResult, assign_advantages, credit_units
from pipeline.credit_io import CREDIT_TABLES as OUTPUT_TABLES
from pipeline.credit_io import result_tables, steps_from_table
from pipeline.schema import atomic_folder, atomic_write, read_table, write_table
from pipeline.storage import location, output_folder
from workflows.errors import UserError
from workflows.options import ConfigOpt, SetOpt, load_or_exit

__all__ = ["OUTPUT_TABLES", "credit", "result_tables", "steps_from_table", "write_credit"]


def write_credit(result: CreditResult, out: Path) -> None:
    """Write the four tables and the diagnostics JSON under `out` (each file atomically)."""
    for name, table in result_tables(result).items():
        write_table(table, out / name, name)
    text = json.dumps(result.diagnostics.to_dict(), indent=2, sort_keys=True)
    atomic_write(out / "credit_diagnostics.json", lambda tmp: Path(tmp).write_text(text))


def credit(
    steps: Annotated[str, typer.Option("--steps", help="steps table: a Parquet file or a folder of parts (local "
                                       "or an object-store URL)")],
    out: Annotated[str, typer.Option("--out", help="output folder for the four tables and diagnostics (local or "
                                     "an object-store URL)")],
    config: Path | None = ConfigOpt,
    overrides: list[str] = SetOpt,
) -> None:
    """Re-run credit assignment on a steps table; write subdiffs, anchors, anchor_members, advantages."""
    settings = load_or_exit(config, overrides).credit
    out = location(out)
    # `out` is replaced whole: never a file or a folder that holds anything but an earlier credit output
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "credit_diagnostics.json").is_file():
        raise UserError(f"--out {out}: a folder with other content (not an earlier credit output); "
                        "give a new or empty folder")
    # a SchemaError or CreditInputError (a bad steps table) leaves no `out` and exits 1 (workflows/errors.py)
    table = read_table(steps, "steps")
    if table.num_rows == 0:
        raise UserError(f"--steps {steps}: the steps table has no rows, so there is nothing to assign credit to")
    # every table, whatever the estimator reads: they are written for analysis
    result = assign_advantages(credit_units(steps_from_table(table, str(steps)), settings), settings)
    with output_folder(out) as local, atomic_folder(local) as staging:  # a URL: filled locally, then uploaded
        write_credit(result, staging)
    d = result.diagnostics
    typer.echo(
        f"credit: {d.n_rows} rows, {d.n_candidates} candidates, {d.n_anchors} anchors, "
        f"coverage {d.coverage:.3f}, {d.seconds.get('total', 0.0):.3f} s -> {out}"
    )
