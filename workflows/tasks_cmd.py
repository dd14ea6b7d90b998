"""`didpo tasks`: look at the task sources.

didpo tasks list [--source S [--path P] | --tasks F] [--split X] [--limit N]   one row per task, then the count
didpo tasks show TASK_ID [--path P | --tasks F]                    instructions, workspace, tests
didpo tasks export --source S [--split X] --out F                  any source as a task file (docs/tasks.md)
didpo tasks make-repair --from S --out F [--bugs 1-3 --families .. --n N --seed S]   mint repair tasks
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from pipeline.tasks import BUNDLED_FILES, SOURCES, Task, TestSuite, count_cases, load_source
from pipeline.tasks.repair import FAMILIES, judge_verdict, make_repair_tasks, parse_families, write_recipes
from workflows.errors import UserError

tasks_app = typer.Typer(
    no_args_is_help=True, help="List and inspect task sources (bundled files by default)."
)

SourceOpt = typer.Option(None, "--source", "-s", help=f"one of: {', '.join(SOURCES)} (default: all)")
PathOpt = typer.Option(None, "--path", "-p", help="a task file of that source's format (default: bundled)")
TaskFileOpt = typer.Option(None, "--tasks", help="a task file of our own format (docs/tasks.md)")


def _console() -> Console:
    return Console(soft_wrap=True)


def _fail(message: str) -> UserError:
    return UserError(message)


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
    task_file: Path | None = TaskFileOpt,
    split: str | None = typer.Option(None, "--split", help="train, validation or test"),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="first N tasks of each source"),
) -> None:
    """One row per task: id, source, split, visible / hidden cases; then the number of tasks."""
    if path is not None and source is None:
        raise _fail("--path needs --source (which format the file is in)")
    if task_file is not None and (source or path):
        raise _fail("give --tasks, or --source with --path, not both")
    if task_file is not None:
        source, path = "file", task_file
    sources = [source] if source is not None else list(BUNDLED_FILES)
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
    task_id: str = typer.Argument(..., help="e.g. humanevalfix/Python/0"), path: Path | None = PathOpt,
    task_file: Path | None = TaskFileOpt,
) -> None:
    """Instructions, workspace files and a summary of the visible and hidden tests of one task."""
    if task_file is not None:
        if path is not None:
            raise _fail("give --tasks or --path, not both")
        (task,) = _load("file", task_file, ids=[task_id])
    else:
        source = task_id.split("/", 1)[0]
        if source not in SOURCES or "/" not in task_id:
            raise _fail(f"task id {task_id!r} must start with a source name and '/': {', '.join(SOURCES)} "
                        "(a task of a task file: --tasks FILE)")
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


@tasks_app.command("export")
def export(
    source: str = typer.Option(..., "--source", "-s", help=f"one of: {', '.join(SOURCES)}"),
    out: Path = typer.Option(..., "--out", "-o", help="the task file to write (JSON Lines, docs/tasks.md)"),
    path: Path | None = PathOpt,
    split: str | None = typer.Option(None, "--split", help="train, validation or test"),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="first N tasks"),
) -> None:
    """Write tasks of any source in our own task file format (a starting point for a task set of your own)."""
    from pipeline.tasks.taskfile import write_task_file

    n = write_task_file(_load(source, path, split=split, limit=limit), out)
    typer.echo(f"wrote {n} tasks to {out}")


def _bug_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise _fail(f"--bugs {text!r}: expected a count or a range like 1-3") from None


@tasks_app.command("make-repair")
def make_repair(
    source: str = typer.Option(..., "--from", help=f"the source to mint from: {', '.join(BUNDLED_FILES)}, or file (--path: a task file)"),
    out: Path = typer.Option(..., "--out", "-o", help="the repair task file to write (JSON Lines)"),
    path: Path | None = PathOpt,
    split: str | None = typer.Option(None, "--split", help="draw only from this split of the source"),
    limit: int | None = typer.Option(None, "--limit", min=1, help="draw only from the first N source tasks"),
    bugs: str = typer.Option("1-3", "--bugs", help="bugs per task: a count or a range, e.g. 1-3"),
    families: str = typer.Option(",".join(FAMILIES), "--families", help="bug families, comma-separated"),
    n: int = typer.Option(100, "--n", min=1, help="repair tasks to mint"),
    seed: int = typer.Option(0, "--seed", min=0, help="seed of the draws and of the program split"),
    split_by: str = typer.Option("program", "--split-by", help="program: held-out programs never seen in "
                                 "train; instance: held-out bug sets of the same programs"),
    test_fraction: float = typer.Option(0.2, "--test-fraction", help="share of programs (or instances) held out"),
    pool_size: int = typer.Option(2, "--pool-size", min=1, help="sandbox workers"),
    report: bool = typer.Option(True, "--report/--no-report", help="show each task the visible tests' failing "
                                "run on its buggy code, as a bug report does (--no-report: only the code)"),
) -> None:
    """Inject bugs into reference solutions; keep a bug set only if each bug alone, and the set, fails the
    visible tests in the sandbox. Writes one recipe per line; load it as source `repair` with that path."""
    from pipeline.sandbox import Judge, SandboxPool, SandboxSettings

    if source == "repair":
        raise _fail("--from repair: mint from a benchmark source, not from another repair file")
    try:
        chosen = parse_families(families)
    except ValueError as exc:
        raise _fail(f"--families {families!r}: {exc}") from None
    if split_by not in ("program", "instance"):
        raise _fail(f"--split-by {split_by!r}: expected program or instance")
    if not 0.0 <= test_fraction <= 1.0:
        raise _fail(f"--test-fraction {test_fraction}: expected a share within [0, 1]")
    lo, hi = _bug_range(bugs)
    if not 1 <= lo <= hi:
        raise _fail(f"--bugs {bugs!r}: expected 1 <= low <= high")
    tasks = _load(source, path, split=split, limit=limit)

    with SandboxPool(SandboxSettings(pool_size=pool_size)) as pool:
        judge = Judge(pool)

        def progress(made: int, attempts: int) -> None:
            if made % 10 == 0 or made == n:
                typer.echo(f"  {made}/{n} repair tasks after {attempts} draws", err=True)

        try:
            recipes = make_repair_tasks(tasks, judge_verdict(judge, report=report), n=n, bugs=(lo, hi), families=chosen, seed=seed,
                                        split_by=split_by, test_fraction=test_fraction,
                                        source_path=str(path) if path else None, loader=source,
                                        on_progress=progress)
        except (ValueError, RuntimeError) as exc:
            raise _fail(str(exc)) from None
    write_recipes(recipes, out)
    splits = {s: sum(r.split == s for r in recipes) for s in ("train", "test")}
    per_family = {f: sum(b.family == f for r in recipes for b in r.bugs) for f in FAMILIES}
    typer.echo(f"wrote {len(recipes)} repair tasks to {out} (split by {split_by}: {splits['train']} train, "
               f"{splits['test']} test; bugs per family: "
               + ", ".join(f"{f} {c}" for f, c in per_family.items() if c) + ")")
