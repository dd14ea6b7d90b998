"""A user's own task file through the commands (`--tasks FILE`): the fixture set tests/fixtures/classics.jsonl
holds what plain-data tests cannot express (a helper module, linked-list and graph objects, a generator, floats
within a tolerance); each reference passes, each buggy workspace fails, in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.tasks import load_source
from workflows.cli import app

runner = CliRunner()
FIXTURE = Path(__file__).parents[1] / "fixtures" / "classics.jsonl"


def _exec_all(*extra: str) -> dict:
    result = runner.invoke(app, ["exec", "--all", "--tasks", str(FIXTURE), "--pool", "1", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_fixture_set_covers_what_plain_data_cannot():
    tasks = {t.task_id.split("/", 1)[1]: t for t in load_source("file", FIXTURE)}
    assert any(len([p for p in t.workspace if p.endswith(".py")]) > 1 for t in tasks.values())  # helper modules
    assert tasks["reverse_linked_list"].hidden_tests.objects and tasks["subsequences"].hidden_tests.objects
    assert tasks["sqrt"].hidden_tests.kind == "io" and tasks["sqrt"].hidden_tests.atol > 0
    assert tasks["breadth_first_search"].hidden_tests.kind == "pytest"


def test_every_reference_passes_and_every_buggy_workspace_fails():
    assert _exec_all() == {"source": str(FIXTURE), "workspaces": "reference", "isolation": _exec_all()["isolation"],
                           "counts": {"passed": 5}, "not_passed": []}
    buggy = _exec_all("--buggy")
    assert buggy["counts"] == {"failed": 5}


def test_one_task_of_the_file_says_which_case_failed_and_why(tmp_path):
    solution = tmp_path / "convert.py"
    solution.write_text(load_source("file", FIXTURE, ids=["to_base"])[0].workspace["convert.py"])
    result = runner.invoke(app, ["exec", "--tasks", str(FIXTURE), "--task", "classics/to_base", "--solution",
                                 str(solution), "--hidden", "--pool", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["status"] == "failed"
    cases = {c["case"]: c["detail"] for c in report["failing_cases"]}  # pytest's line: expected and actual
    assert "assert '011' == '110'" in cases["test_convert.py::test_binary"]
    assert "assert 'A1' == '1A'" in cases["test_convert.py::test_helper_and_solution_agree"]


def test_an_id_outside_the_file_is_an_error_not_a_bundled_task(tmp_path):
    solution = tmp_path / "s.py"
    solution.write_text("x = 1\n")
    result = runner.invoke(app, ["exec", "--tasks", str(FIXTURE), "--task", "humanevalfix/Python/0",
                                 "--solution", str(solution)])
    assert result.exit_code == 2 and "no task with id humanevalfix/Python/0" in result.output
    bundled_id = runner.invoke(app, ["exec", "--task", "to_base", "--solution", str(solution)])
    assert bundled_id.exit_code == 2 and "needs --tasks FILE" in bundled_id.output


def test_tasks_list_show_and_export(tmp_path):
    listed = runner.invoke(app, ["tasks", "list", "--tasks", str(FIXTURE), "--split", "test"])
    assert listed.exit_code == 0 and listed.output.strip().endswith("3 tasks")
    shown = runner.invoke(app, ["tasks", "show", "sqrt", "--tasks", str(FIXTURE)])
    assert shown.exit_code == 0 and "hidden: io, 4 case(s)" in shown.output
    out = tmp_path / "mbpp.jsonl"
    exported = runner.invoke(app, ["tasks", "export", "--source", "mbpp", "--split", "test", "--limit", "3",
                                   "--out", str(out)])
    assert exported.exit_code == 0 and len(load_source("file", out)) == 3
    schema = runner.invoke(app, ["schema", "task"])
    assert schema.exit_code == 0 and "hidden_tests" in json.loads(schema.output)["properties"]


def test_config_commands_take_the_file_as_both_sides():
    result = runner.invoke(app, ["config", "show", "--tasks", str(FIXTURE)])
    assert result.exit_code == 0, result.output
    assert result.output.count(str(FIXTURE.resolve())) == 2 and "split: train" in result.output
    missing = runner.invoke(app, ["round", "--tasks", "no/such.jsonl"])
    assert missing.exit_code == 2 and "--tasks no/such.jsonl: no such file" in missing.output


@pytest.mark.slow
def test_eval_runs_on_the_file_one_benchmark_per_source(tmp_path):
    from pipeline.policy.tiny import build_checkpoint

    policy = build_checkpoint(tmp_path / "tiny", size="tiny").path
    out = tmp_path / "eval"
    result = runner.invoke(app, ["eval", "--policy", str(policy), "--tasks", str(FIXTURE), "--turns", "1",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq

    summary = pq.read_table(out / "eval_summary.parquet").to_pylist()
    assert [(r["benchmark"], r["tasks"]) for r in summary] == [("classics", 5)]
    both = runner.invoke(app, ["eval", "--policy", str(policy), "--tasks", str(FIXTURE), "--benchmarks", "mbpp"])
    assert both.exit_code == 2 and "not both" in both.output


@pytest.mark.slow
def test_a_pipeline_round_on_the_file_counts_trajectories_as_they_finish(tmp_path, monkeypatch):
    from pipeline import schema
    from pipeline.policy.tiny import build_checkpoint

    monkeypatch.setenv("DIDPO_PROGRESS", "1")  # tests run with bars off
    policy = build_checkpoint(tmp_path / "tiny", size="tiny").path
    result = runner.invoke(app, ["pipeline", "run", "--tasks", str(FIXTURE), "--checkpoint", str(policy),
                                 "--set", f"run.root={tmp_path / 'runs'}", "--set", "episode.max_turns=2",
                                 "--set", "pipeline.samples_per_task=2", "--set", "policy.max_new_tokens=16"])
    assert result.exit_code == 0, result.output
    assert "trajectories: 100%" in result.stderr and "4/4" in result.stderr  # 2 train tasks x 2 samples
    steps = schema.read_table(tmp_path / "runs" / "local" / "round=0" / "steps", "steps").to_pylist()
    assert {s["task_id"] for s in steps} == {"classics/reverse_linked_list", "classics/subsequences"}
