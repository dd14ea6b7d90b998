"""`didpo tasks`: look at the task sources.

didpo tasks list [--source S] [--path P] [--split X] [--limit N]   one row per task, then the count
didpo tasks show TASK_ID [--path P]                                instructions, workspace, tests
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from pipeline.tasks import SOURCES, Task, TestSuite, count_cases, load_source

tasks_app = typer.Typer(
    no_args_is_help=True, help="List and inspect task sources (bundled files by default)."
)

SourceOpt = typer.Option(None, "--source", "-s", help=f"one of: {', '.join(SOURCES)} (default: all)")
PathOpt = typer.Option(None, "--path", "-p", help="a task file of that source's format (default: bundled)")


def _console() -> Console:
    return Console(soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(2)


def _load(source: str, path: Path | None, **filters) -> list[Task]:
    """load_source, with every refusal (bad name, missing or malformed file, unknown id) as a usage error."""
    try:
        return load_source(source, path, **filters)
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from None


@tasks_app.command("list")
def list_tasks(
    source: str | None = SourceOpt,
    path: Path | None = PathOpt,
    split: str | None = typer.Option(None, "--split", help="train, validation or test"),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="first N tasks of each source"),
) -> None:
    """One row per task: id, source, split, visible / hidden cases; then the number of tasks."""
    if path is not None and source is None:
        raise _fail("--path needs --source (which format the file is in)")
    sources = [source] if source is not None else list(SOURCES)
    tasks = [t for s in sources for t in _load(s, path, split=split, limit=limit)]
    table = Table("task_id", "source", "split", "visible", "hidden", title="tasks")
    for task in tasks:
        visible, hidden = count_cases(task.visible_tests), count_cases(task.hidden_tests)
        table.add_row(task.task_id, task.source, task.split, str(visible), str(hidden))
    console = _console()
    console.print(table)
    console.print(f"{len(tasks)} tasks")


def _suite_summary(name: str, suite: TestSuite) -> str:
    head = f"{name}: {suite.kind}, {count_cases(suite)} case(s)"
    if suite.kind == "io":
        return f"{head}, entry point {suite.entry_point!r} in module {suite.module!r}, atol {suite.atol:g}"
    where = f", entry point {suite.entry_point!r} in module {suite.module!r}" if suite.entry_point else ""
    return f"{head}{where}; files: {', '.join(suite.files)}"


@tasks_app.command("show")
def show_task(
    task_id: str = typer.Argument(..., help="e.g. humanevalfix/Python/0"), path: Path | None = PathOpt
) -> None:
    """Instructions, workspace files and a summary of the visible and hidden tests of one task."""
    source = task_id.split("/", 1)[0]
    if source not in SOURCES or "/" not in task_id:
        raise _fail(f"task id {task_id!r} must start with a source name and '/': {', '.join(SOURCES)}")
    (task,) = _load(source, path, ids=[task_id])
    console = _console()
    console.rule(f"{task.task_id}  ({task.source}, {task.split})")
    console.print(task.instructions, markup=False, highlight=False)
    for name, text in task.workspace.items():
        console.rule(f"workspace: {name}")
        console.print(Syntax(text, "python" if name.endswith(".py") else "text", word_wrap=True))
    console.rule("tests")
    console.print(_suite_summary("visible", task.visible_tests), markup=False, highlight=False)
    console.print(_suite_summary("hidden", task.hidden_tests), markup=False, highlight=False)
    extras = {k: v for k, v in task.meta.items() if k != "native_id"}
    console.print("meta: " + ", ".join(f"{k}={v}" for k, v in extras.items()), markup=False, highlight=False)
