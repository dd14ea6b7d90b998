"""What every command that reads settings shares: `--config F`, `--set a.b=c` and `--tasks FILE`, and loading them.

Settings reach a command only this way (one spelling per key: `--set credit.lam=0.6`, never a flag of its
own), and a bad config is refused with the explanation as a `UserError` (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from pipeline.config import ConfigError
from training.config import DidpoConfig, load_config
from workflows.errors import UserError

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config (default: configs/local.yaml)")
SetOpt = typer.Option([], "--set", help="override a key: --set credit.lam=0.6 (repeatable)")
TasksOpt = typer.Option(None, "--tasks", help="a task file (docs/tasks.md): its train split trains, its test "
                        "split evaluates (sets tasks.train and tasks.eval)")


def tasks_overrides(tasks: Path | None) -> list[str]:
    """`--tasks FILE` as the two overrides it stands for (so runs record it like any other setting)."""
    if tasks is None:
        return []
    if not tasks.is_file():
        raise UserError(f"--tasks {tasks}: no such file")
    path = json.dumps(str(tasks.resolve()))  # a YAML-safe quoted string
    return [f"tasks.train=[{{file: {path}, split: train}}]", f"tasks.eval=[{{file: {path}, split: test}}]"]


def load_or_exit(config: Path | None, overrides: list[str] | None, tasks: Path | None = None) -> DidpoConfig:
    """Load the config (`tasks`: a `--tasks` file), or refuse it with the explanation (a UserError: exit 2)."""
    try:
        return load_config(config, [*(overrides or []), *tasks_overrides(tasks)])
    except ConfigError as e:
        raise UserError(str(e)) from None
    except UnicodeDecodeError:
        raise UserError(f"config file {config}: not UTF-8 text") from None
    except OSError as e:  # a folder, an unreadable file
        raise UserError(f"config file {e.filename}: {e.strerror}") from None
