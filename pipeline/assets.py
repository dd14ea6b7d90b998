"""The files the project ships beside its code: SQL queries, configs, the bundled benchmark data and the
pretrained base policy.

They live at the top of a checkout (`sql/`, `configs/`, `data/`, `models/`, where people read and edit them)
and are reached through `pipeline/_assets/`, links to those folders. Building the wheel follows the links, so
an installed package carries the files under the same names and this one lookup works in both.

A config names a shipped checkpoint as `bundled:NAME` (`models/NAME/`, docs/pretraining.md); it resolves to
the folder, loaded through `from_pretrained` like any checkpoint, once its weights match the sha256 its
`pretrain_report.json` records (a corrupt copy or a Git LFS pointer is refused, never loaded).
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib.resources import files
from pathlib import Path

ASSETS = ("sql", "configs", "data", "models")
BUNDLED = "bundled:"
PRETRAIN_REPORT = "pretrain_report.json"  # written by training/pretrain.py beside the weights it made


def asset_dir(name: str) -> Path:
    """The folder of one shipped asset (`sql`, `configs`, `data` or `models`), in a checkout or an installed wheel."""
    if name not in ASSETS:
        raise ValueError(f"unknown asset folder {name!r}; shipped: {', '.join(ASSETS)}")
    return Path(str(files("pipeline") / "_assets" / name)).resolve()  # a checkout: the top-level folder


def resolve_checkpoint(ref: str) -> str:
    """`bundled:NAME` -> the path of the shipped checkpoint `models/NAME` (its hash checked); other values as is."""
    if not ref.startswith(BUNDLED):
        return ref
    name = ref[len(BUNDLED):]
    root = asset_dir("models")
    shipped = sorted(p.name for p in root.iterdir() if (p / "model.safetensors").is_file()) if root.is_dir() else []
    if name not in shipped:
        raise ValueError(f"no bundled checkpoint {name!r} (in {root}); shipped: {', '.join(shipped) or 'none'}")
    return str(_verified(root / name))


@functools.cache
def _verified(folder: Path) -> Path:
    weights = folder / "model.safetensors"
    try:
        recorded = json.loads((folder / PRETRAIN_REPORT).read_text())["sha256"][weights.name]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"bundled checkpoint {folder}: no sha256 of {weights.name} in its {PRETRAIN_REPORT} ({exc})") from None
    actual = hashlib.sha256(weights.read_bytes()).hexdigest()
    if actual != recorded:
        raise ValueError(f"bundled checkpoint {weights} has sha256 {actual[:12]}..., its {PRETRAIN_REPORT} records "
                         f"{recorded[:12]}...: a corrupt copy or a Git LFS pointer, refused")
    return folder
