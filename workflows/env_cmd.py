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


def _load_task(task_id: str) -> Task:
    source = task_id.split("/", 1)[0]
    if source not in SOURCES:
        raise typer.BadParameter(f"task id {task_id!r}: unknown source {source!r} (known: {sorted(SOURCES)})")
    tasks = load_source(source, ids=[task_id])
    if not tasks:
        raise typer.BadParameter(f"task {task_id!r} not found in the bundled {source} file")
    return tasks[0]


def _solution_files(task: Task, path: Path) -> dict[str, str]:
    """A JSON object {path: text} is a whole workspace; any other file replaces the task's main module."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise typer.BadParameter(f"{path}: a JSON solution must be an object mapping paths to file texts")
        return {**task.workspace, **data}
    module = task.hidden_tests.module or task.visible_tests.module
    target = f"{module}.py" if module else next(iter(sorted(task.workspace)))
    return {**task.workspace, target: text}


def exec_cmd(
    task: str = typer.Option(None, "--task", help="task id, e.g. humanevalfix/Python/0"),
    solution: Path = typer.Option(None, "--solution", exists=True, dir_okay=False, help="solution file"),  # noqa: B008
    hidden: bool = typer.Option(False, "--hidden", help="run the hidden tests (default: visible)"),
    all_tasks: bool = typer.Option(False, "--all", help="run every task of --source (its reference, or --buggy)"),
    source: str = typer.Option(None, "--source", help="with --all: the task source"),
    buggy: bool = typer.Option(False, "--buggy", help="with --all: run the starting (buggy) workspaces"),
    pool_size: int = typer.Option(2, "--pool", help="sandbox workers"),
) -> None:
    """Run one solution (or, with --all, every reference/buggy workspace) through the sandbox; print JSON."""
    logging.basicConfig(level=logging.WARNING)
    with SandboxPool(SandboxSettings(pool_size=pool_size)) as pool:
        judge = Judge(pool)
        if all_tasks:
            if not source:
                raise typer.BadParameter("--all needs --source")
            counts: dict[str, int] = {}
            for t in load_source(source):
                res = judge.run(t, t.workspace if buggy else t.reference, hidden=True)
                counts[res.status] = counts.get(res.status, 0) + 1
            typer.echo(json.dumps({"source": source, "workspaces": "buggy" if buggy else "reference",
                                   "isolation": pool.isolation, "counts": counts}))
            return
        if not task or solution is None:
            raise typer.BadParameter("give --task and --solution (or --all --source)")
        t = _load_task(task)
        res = judge.run(t, _solution_files(t, solution), hidden=hidden)
        typer.echo(json.dumps({"task": task, "hidden": hidden, "status": res.status, "passed": res.passed,
                               "total": res.total, "pass_fraction": res.pass_fraction,
                               "duration_s": round(res.duration_s, 4), "isolation": res.isolation,
                               "detail": res.detail}, indent=2))


def episode_cmd(
    task: str = typer.Option(..., "--task", help="task id"),
    responses: Path = typer.Option(..., "--responses", exists=True, dir_okay=False,  # noqa: B008
                                   help="JSON list of response strings"),
    max_turns: int = typer.Option(8, "--max-turns"),
) -> None:
    """Replay a list of responses as one episode; print each turn's parse result, diff, observation, reward."""
    logging.basicConfig(level=logging.WARNING)
    items = json.loads(responses.read_text(encoding="utf-8"))
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise typer.BadParameter(f"{responses}: expected a JSON list of strings")
    t = _load_task(task)
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
