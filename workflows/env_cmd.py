"""`didpo exec` and `didpo episode`: run solutions and replay episodes through the sandbox.

Mounted by workflows/cli.py: `app.command("exec")(exec_cmd)`, `app.command("episode")(episode_cmd)`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

from pipeline.agent import Episode, EpisodeSettings
from pipeline.sandbox import Judge, SandboxPool, SandboxSettings
from pipeline.tasks import SOURCES, Task, load_source
from pipeline.telemetry import progress
from workflows.errors import UserError, read_json, read_text


def _load_tasks(source: str, **filters) -> list[Task]:
    """load_source, with its refusals (unknown source or id, a bad task file) as the user's mistake."""
    try:
        return load_source(source, **filters)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None


def _load_task(task_id: str, task_file: Path | None) -> Task:
    """The task `task_id` of `task_file` (its full or its native id), or of the bundled source its prefix
    names; never a bundled task when a file is given."""
    if task_file is not None:
        return _load_tasks("file", path=task_file, ids=[task_id])[0]
    source = task_id.split("/", 1)[0]
    if source not in SOURCES or "/" not in task_id:
        raise UserError(f"task id {task_id!r}: unknown source {source!r} (known: {', '.join(SOURCES)}; "
                        "a task of a task file needs --tasks FILE)")
    return _load_tasks(source, ids=[task_id])[0]


def _main_path(task: Task) -> str | None:
    """The workspace file a one-file solution replaces: the tests' module, else the one Python file the
    reference changes, else the only Python file (None when that is ambiguous)."""
    module = task.hidden_tests.module or task.visible_tests.module
    if module:
        return f"{module}.py"
    py = sorted(p for p in task.workspace if p.endswith(".py"))
    changed = [p for p in py if task.reference.get(p) != task.workspace[p]]
    return changed[0] if len(changed) == 1 else py[0] if len(py) == 1 else None


def _solution_files(task: Task, path: Path) -> dict[str, str]:
    """A JSON object {path: text} is a whole workspace; any other file replaces the task's main module."""
    if path.suffix == ".json":
        data = read_json(path, "solution")
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise UserError(f"solution {path}: a JSON solution must be an object mapping paths to file texts")
        return {**task.workspace, **data}
    target = _main_path(task)
    if target is None:
        raise UserError(f"task {task.task_id} has several files ({', '.join(sorted(task.workspace))}): give the "
                        "solution as a JSON object mapping paths to texts")
    return {**task.workspace, target: read_text(path, "solution")}


_SHOWN_FAILURES = 10  # failing cases `exec` prints, each with why it failed


def exec_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. humanevalfix/Python/0"),
    tasks_file: Path = typer.Option(None, "--tasks", help="a task file (docs/tasks.md): --task is one of its "  # noqa: B008
                                    "ids, --all runs all of it"),
    solution: Path = typer.Option(None, "--solution", exists=True, dir_okay=False, help="solution file"),  # noqa: B008
    hidden: bool = typer.Option(False, "--hidden", help="run the hidden tests (default: visible)"),
    all_tasks: bool = typer.Option(False, "--all", help="run every task of --source or --tasks (its reference, "
                                   "or --buggy)"),
    source: str = typer.Option(None, "--source", help="with --all: the task source"),
    buggy: bool = typer.Option(False, "--buggy", help="with --all: run the starting (buggy) workspaces"),
    pool_size: int = typer.Option(2, "--pool", min=1, help="sandbox workers"),
) -> None:
    """Run one solution (or, with --all, every reference/buggy workspace) through the sandbox; print JSON."""
    logging.basicConfig(level=logging.WARNING)
    # every input is checked before the sandbox starts
    if source and tasks_file:
        raise UserError("give --source or --tasks, not both")
    if all_tasks:
        if not (source or tasks_file):
            raise UserError("--all needs --source or --tasks")
        tasks = _load_tasks(source, path=None) if source else _load_tasks("file", path=tasks_file)
    else:
        if not task or solution is None:
            raise UserError("give --task and --solution (or --all --source)")
        t = _load_task(task, tasks_file)
        files = _solution_files(t, solution)
    with SandboxPool(SandboxSettings(pool_size=pool_size)) as pool:
        judge = Judge(pool)
        if all_tasks:
            counts: dict[str, int] = {}
            not_passed: list[str] = []
            for t in progress(tasks, "tasks", total=len(tasks)):
                res = judge.run(t, t.workspace if buggy else t.reference, hidden=True)
                counts[res.status] = counts.get(res.status, 0) + 1
                if res.status != "passed":
                    not_passed.append(f"{t.task_id}: {res.status}")
            typer.echo(json.dumps({"source": source or str(tasks_file), "workspaces": "buggy" if buggy else "reference",
                                   "isolation": pool.isolation, "counts": counts,
                                   "not_passed": not_passed[:_SHOWN_FAILURES]}))
            return
        res = judge.run(t, files, hidden=hidden)
        typer.echo(json.dumps({"task": task, "hidden": hidden, "status": res.status, "passed": res.passed,
                               "total": res.total, "pass_fraction": res.pass_fraction,
                               "duration_s": round(res.duration_s, 4), "isolation": res.isolation,
                               "detail": res.detail,
                               "failing_cases": [{"case": c.name, "detail": c.detail}
                                                 for c in res.cases if not c.passed][:_SHOWN_FAILURES]},
                              indent=2))


def episode_cmd(
    task: str = typer.Option(..., "--task", help="task id"),
    tasks_file: Path = typer.Option(None, "--tasks", help="a task file (docs/tasks.md) holding --task"),  # noqa: B008
    responses: Path = typer.Option(..., "--responses", exists=True, dir_okay=False,  # noqa: B008
                                   help="JSON list of response strings"),
    max_turns: int = typer.Option(8, "--max-turns", min=1),
) -> None:
    """Replay a list of responses as one episode; print each turn's parse result, diff, observation, reward."""
    logging.basicConfig(level=logging.WARNING)
    items = read_json(responses, "responses")
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise UserError(f"responses {responses}: expected a JSON list of strings")
    t = _load_task(task, tasks_file)
    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        ep = Episode(t, Judge(pool), EpisodeSettings(max_turns=max_turns, min_turns_before_finish=0))
        for i, text in enumerate(items):
            if ep.state.done:
                typer.echo(f"(episode finished; {len(items) - i} response(s) left unused)")
                break
            r = ep.step(text)
            typer.echo(json.dumps({"turn": r.turn, "action": r.action_json, "exec_status": r.exec_status,
                                   "visible": f"{r.visible_passed}/{r.visible_total}", "reward": r.step_reward,
                                   "outcome": r.outcome, "done": r.done}))
            if r.diff:
                typer.echo(r.diff.rstrip())
            typer.echo("observation: " + r.observation.replace("\n", "\n  "))
        typer.echo(json.dumps({"total_reward": ep.state.total_reward, "outcome": ep.state.outcome,
                               "turns": ep.state.turn, "infra_error": ep.state.infra_error}))
