"""The files the project ships beside its code: SQL queries, configs and the bundled benchmark data.

They live at the top of a checkout (`sql/`, `configs/`, `data/`, where people read and edit them) and are
reached through `pipeline/_assets/`, links to those folders. Building the wheel follows the links, so an
installed package carries the files under the same names and this one lookup works in both.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

ASSETS = ("sql", "configs", "data")


def asset_dir(name: str) -> Path:
    """The folder of one shipped asset (`sql`, `configs` or `data`), in a checkout or an installed wheel."""
    if name not in ASSETS:
        raise ValueError(f"unknown asset folder {name!r}; shipped: {', '.join(ASSETS)}")
    return Path(str(files("pipeline") / "_assets" / name)).resolve()  # a checkout: the top-level folder
