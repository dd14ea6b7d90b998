"""What every command that reads settings shares: `--config F` and `--set a.b=c`, and loading them.

Settings reach a command only this way (one spelling per key: `--set credit.lam=0.6`, never a flag of its
own), and a bad config is refused with the explanation as a `UserError` (exit 2).
"""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.config import ConfigError
from training.config import DidpoConfig, load_config
from workflows.errors import UserError

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config (default: configs/local.yaml)")
SetOpt = typer.Option([], "--set", help="override a key: --set credit.lam=0.6 (repeatable)")


def load_or_exit(config: Path | None, overrides: list[str] | None) -> DidpoConfig:
    """Load the config, or refuse it with the explanation (a UserError: exit 2)."""
    try:
        return load_config(config, list(overrides or []))
    except ConfigError as e:
        raise UserError(str(e)) from None
    except UnicodeDecodeError:
        raise UserError(f"config file {config}: not UTF-8 text") from None
    except OSError as e:  # a folder, an unreadable file
        raise UserError(f"config file {e.filename}: {e.strerror}") from None
