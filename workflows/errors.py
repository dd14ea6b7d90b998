"""Bad input on the command line: one line on stderr naming the culprit, a non-zero exit, never a traceback.

Commands raise `UserError` (exit 2) for a mistake in what the user gave (a file, an id, a key, a value) and
`Refused` (exit 1) when the work refuses it under way; the library's own refusals (`USER_ERRORS`, exit 1) and
OS errors on a named path (exit 1) count as such too. `DidpoGroup`, the class of the `didpo` app, turns all
of them into `error: <message>` once, at the top: the one mapping from error to exit code and message (no
command prints and exits on its own). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from pipeline.config import ConfigError
from pipeline.credit import CreditInputError
from pipeline.policy.loading import CheckpointError
from pipeline.schema import RoundConflict, SchemaError
from pipeline.sqlrun import SqlError
from pipeline.tasks.records import TaskFormatError


class UserError(typer.TyperException):
    """A mistake in the user's input; the message names the file, id, key or option (exit 2)."""

    exit_code = 2


class Refused(typer.TyperException):
    """The work refused what it was given once under way (a run folder, a checkpoint's content): exit 1, like
    the library's own refusals (`USER_ERRORS`)."""

    exit_code = 1


# the library's refusals of bad input; each message already names the file, the id or the key
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, CheckpointError, CreditInputError, SchemaError, SqlError,
                                            TaskFormatError, RoundConflict)


def read_text(path: Path, what: str) -> str:
    """The text of a file the user named, or a UserError saying why not (missing, a folder, not UTF-8)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UserError(f"{what} {path}: {e.strerror}") from None


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as e:
        raise UserError(f"{what} {path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


class DidpoGroup(TyperGroup):
    """Runs the command non-standalone so that every refusal, click's usage errors included, ends here."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:  # UserError, and click's: bad option value, missing option, ...
            self._refuse(e.format_message(), e.exit_code)
        except USER_ERRORS as e:
            self._refuse(str(e), 1)
        except OSError as e:
            if e.filename is None:  # not about a path the user gave: a bug or the host, keep the traceback
                raise
            where = f"{e.filename} -> {e.filename2}" if e.filename2 else e.filename
            self._refuse(f"{where}: {e.strerror}", 1)
        except typer.Abort:
            self._refuse("aborted", 1)
        sys.exit(rv if isinstance(rv, int) else 0)

    @staticmethod
    def _refuse(message: str, code: int) -> None:
        if message:  # empty: click already printed the help (a group called without a command)
            typer.echo(f"error: {_one_line(message)}", err=True)
        sys.exit(code)
