"""`didpo tasks list|show` through typer's CliRunner (the `didpo` app, so its one error mapping)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from workflows.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["tasks", *args], env={"COLUMNS": "160"})  # the real app: its error mapping


def test_list_humanevalfix_shows_164_tasks():
    result = invoke("list", "--source", "humanevalfix")
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().splitlines()[-1] == "164 tasks"
    assert "humanevalfix/Python/0 " in result.output
    assert "humanevalfix/Python/163 " in result.output
    # Python/0: 2 docstring examples visible, 7 asserts hidden.
    row = next(line for line in result.output.splitlines() if "humanevalfix/Python/0 " in line)
    assert re.search(r"test\s*│\s*2\s*│\s*7\s*│", row), row


def test_list_filters_by_split_and_limit():
    result = invoke("list", "--source", "mbpp", "--split", "validation", "--limit", "4")
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().splitlines()[-1] == "4 tasks"
    assert result.output.count("│ validation │") == 4


def test_list_reads_a_file_by_path(tmp_path, jsonl, he_row):
    path = jsonl(tmp_path / "he.jsonl", [he_row(0), he_row(7)])
    result = invoke("list", "--source", "humaneval", "--path", str(path))
    assert result.exit_code == 0, result.output
    assert "humaneval/HumanEval/7" in result.output
    assert result.output.rstrip().splitlines()[-1] == "2 tasks"


def test_list_refuses_bad_input_with_a_message():
    assert "unknown task source 'apps'" in invoke("list", "--source", "apps").output
    assert invoke("list", "--source", "apps").exit_code == 2
    assert "--path needs --source" in invoke("list", "--path", "x.jsonl").output
    assert "unknown split 'dev'" in invoke("list", "--source", "mbpp", "--split", "dev").output


def test_list_names_the_line_of_a_malformed_file(tmp_path, jsonl, he_row):
    path = jsonl(tmp_path / "bad.jsonl", [he_row(0), "{oops"])
    result = invoke("list", "--source", "humaneval", "--path", str(path))
    assert result.exit_code == 2
    assert f"{path}:2: bad JSON" in result.output


def test_show_prints_instructions_workspace_and_test_summary():
    result = invoke("show", "humanevalfix/Python/0")
    assert result.exit_code == 0, result.output
    assert "has a bug" in result.output
    assert "workspace: solution.py" in result.output
    assert "distance = elem - elem2" in result.output  # the buggy line
    assert "visible: check, 2 case(s)" in result.output
    assert "hidden: check, 7 case(s)" in result.output
    assert "problem=humaneval:0" in result.output


def test_show_summarises_io_and_pytest_suites():
    io = invoke("show", "mbppplus/Mbpp/2")
    assert io.exit_code == 0, io.output
    assert re.search(r"visible: io, 3 case\(s\), entry point 'similar_elements'", io.output)
    pytest_suite = invoke("show", "exercism/accumulate")
    assert pytest_suite.exit_code == 0, pytest_suite.output
    assert "hidden: pytest, 6 case(s)" in pytest_suite.output
    assert "files: accumulate_test.py" in pytest_suite.output


def test_show_refuses_unknown_ids():
    assert (
        "no humaneval task with id humaneval/HumanEval/999"
        in invoke("show", "humaneval/HumanEval/999").output
    )
    assert "must start with a source name" in invoke("show", "apps/1").output


@pytest.mark.slow
def test_make_repair_mints_tasks_the_sandbox_confirms(tmp_path):
    from pipeline.agent.episode import summarize
    from pipeline.sandbox import Judge, SandboxPool, SandboxSettings
    from pipeline.tasks import load_source
    from pipeline.tasks.repair import FAILURE_CHARS

    out = tmp_path / "repair.jsonl"
    result = invoke("make-repair", "--from", "mbpp", "--split", "train", "--limit", "12", "--n", "5",
                    "--bugs", "1-2", "--seed", "4", "--out", str(out), "--pool-size", "1")
    assert result.exit_code == 0, result.output
    assert "wrote 5 repair tasks" in result.output and "split by program" in result.output
    tasks = load_source("repair", out)
    assert len(tasks) == 5
    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        judge = Judge(pool)
        for task in tasks:  # the buggy workspace fails its visible tests, the reference passes them
            ran = judge.run(task, task.workspace)
            assert ran.status in ("failed", "crashed", "timeout"), task.task_id
            # and the task shows that failing run as the observation of `<run_tests/>` would
            assert f"The visible tests on it:\n{summarize(ran, FAILURE_CHARS)}" in task.instructions
            assert judge.run(task, task.reference).status == "passed", task.task_id
            assert judge.run(task, task.reference, hidden=True).status == "passed", task.task_id


def test_make_repair_refuses_bad_options_in_one_line(tmp_path):
    out = tmp_path / "never.jsonl"
    for args, message in ((("--families", "typo"), "unknown typo"), (("--bugs", "3-1"), "1 <= low <= high"),
                          (("--bugs", "x"), "a count or a range"), (("--split-by", "file"), "program or instance"),
                          (("--from", "repair"), "not from another repair file")):
        base = {"--from": "mbpp", "--n": "1"}
        base.update(dict(zip(args[::2], args[1::2], strict=True)))
        result = invoke("make-repair", *[x for kv in base.items() for x in kv], "--out", str(out))
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert "Traceback" not in result.output and not out.exists()
