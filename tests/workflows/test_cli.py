"""The `didpo` command line: config, schema and the mounted sub-commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workflows.cli import app

runner = CliRunner()


def test_config_show_applies_overrides():
    result = runner.invoke(app, ["config", "show", "--set", "credit.lam=0.6"])
    assert result.exit_code == 0, result.output
    assert "lam: 0.6" in result.output and "runner: FnApiRunner" in result.output


def test_config_check_refuses_a_typo_with_exit_2():
    result = runner.invoke(app, ["config", "check", "--set", "credit.lamda=1"])
    assert result.exit_code == 2
    assert "credit.lamda: unknown key" in result.output


def test_schema_lists_columns_and_refuses_unknown_tables():
    result = runner.invoke(app, ["schema", "advantages"])
    assert result.exit_code == 0 and "token_advantages" in result.output
    bad = runner.invoke(app, ["schema", "nope"])
    assert bad.exit_code == 2 and "unknown table 'nope'" in bad.output


def test_every_command_is_mounted():
    result = runner.invoke(app, ["--help"])
    for command in ("config", "schema", "tasks", "model", "sql", "exec", "episode", "credit", "pipeline", "demo", "round", "sft", "train", "eval", "report", "online"):
        assert command in result.output, command


def test_tasks_list_humanevalfix_has_164():
    result = runner.invoke(app, ["tasks", "list", "--source", "humanevalfix"])
    assert result.exit_code == 0, result.output
    assert "164" in result.output.splitlines()[-1]


@pytest.mark.slow
def test_exec_says_which_cases_failed_and_why(tmp_path):
    from pipeline.tasks import load_source

    task = load_source("humanevalfix", limit=1)[0]
    (path, buggy), = ((p, t) for p, t in task.workspace.items() if p.endswith(".py"))
    solution = tmp_path / path
    solution.write_text(buggy)
    result = runner.invoke(app, ["exec", "--task", task.task_id, "--solution", str(solution), "--pool", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # stdout is the report alone: logs go to stderr (pipeline.telemetry)
    assert report["status"] == "failed" and report["failing_cases"]
    assert len(report["failing_cases"]) == min(10, report["total"] - report["passed"])
    assert all(c["case"] and c["detail"] for c in report["failing_cases"])
    fixed = runner.invoke(app, ["exec", "--task", task.task_id, "--solution", str(_write(tmp_path, task)), "--pool", "1"])
    assert json.loads(fixed.stdout)["failing_cases"] == []


def _write(tmp_path, task):
    (path, text), = task.reference.items()
    out = tmp_path / "fixed" / path
    out.parent.mkdir()
    out.write_text(text)
    return out


@pytest.mark.slow
def test_model_pretrain_builds_a_base_and_stops_on_an_unknown_kind_or_a_missed_loss_bar(tmp_path):
    config = tmp_path / "pretrain.yaml"
    config.write_text(
        "pretrain:\n"
        "  size: tiny\n"
        "  eval_questions: 2\n"
        "  tasks:\n"
        "    train: [{source: mbpp, split: train, limit: 4}]\n"
        "    eval: [{source: mbpp, split: test, limit: 2}]\n"
        "  stages:\n"
        "    - {name: copy, mix: {induction: 1.0, quote_line: 1.0}, steps: 2, warmup_steps: 1,"
        " max_tokens_per_batch: 1024}\n"
    )
    result = runner.invoke(app, ["model", "pretrain", "--out", str(tmp_path / "base"), "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "stage copy: 2 steps" in result.output and "held-out copying: quote_line" in result.output \
        and re.search(r"quote_line_forced [01]\.\d\d located, [01]\.\d\d of the rest copied", result.output)
    assert (tmp_path / "base" / "final" / "pretrain_report.json").is_file()
    config.write_text(config.read_text().replace("quote_line: 1.0", "gossip: 1.0"))
    bad = runner.invoke(app, ["model", "pretrain", "--out", str(tmp_path / "b2"), "--config", str(config)])
    assert bad.exit_code == 2 and "unknown pretraining kind(s) ['gossip']" in bad.output
    assert "Traceback" not in bad.output and not (tmp_path / "b2").exists()
    # a stage that ends above its loss bar stops the run before the next stage, and keeps what it trained
    config.write_text(config.read_text().replace("gossip: 1.0", "quote_line: 1.0").replace(
        "max_tokens_per_batch: 1024}", "max_tokens_per_batch: 1024, max_final_loss: 0.5}\n"
        "    - {name: later, mix: {quote_line: 1.0}, steps: 1, warmup_steps: 0}"))
    stopped = runner.invoke(app, ["model", "pretrain", "--out", str(tmp_path / "b3"), "--config", str(config)])
    assert stopped.exit_code == 2 and "Traceback" not in stopped.output, stopped.output
    assert "stage 1-copy ended at loss" in stopped.output and "not below its max_final_loss 0.5" in stopped.output
    assert (tmp_path / "b3" / "stages" / "1-copy" / "model.safetensors").is_file()
    assert not (tmp_path / "b3" / "stages" / "2-later").exists() and not (tmp_path / "b3" / "final").exists()


@pytest.mark.slow
def test_model_pretrain_runs_where_beam_and_duckdb_are_not_installed(tmp_path):
    """A GPU box that holds torch and transformers but not the pipeline's Beam, DuckDB, Ray or DeepSpeed (the
    lent device machines: docs/pretraining.md, "On a GPU") pretrains and measures a base with the same
    command: nothing on that path imports them."""
    import subprocess
    import sys

    config = tmp_path / "pretrain.yaml"
    config.write_text(
        "pretrain:\n  size: tiny\n  eval_questions: 2\n"
        "  tasks:\n    train: [{source: mbpp, split: train, limit: 4}]\n"
        "    eval: [{source: mbpp, split: test, limit: 2}]\n"
        "  stages:\n    - {name: copy, mix: {quote_line: 1.0, fix_line: 1.0}, steps: 2, warmup_steps: 1,"
        " max_tokens_per_batch: 1024}\n")
    absent = ("apache_beam", "duckdb", "ray", "deepspeed", "openrlhf", "vllm")
    code = (f"import runpy, sys\nfor name in {absent!r}:\n    sys.modules[name] = None  # its import fails\n"
            f"sys.argv = ['didpo', 'model', 'pretrain', '--out', {str(tmp_path / 'base')!r}, '--config', "
            f"{str(config)!r}]\nrunpy.run_module('workflows.cli', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "held-out copying: quote_line" in done.stdout
    assert (tmp_path / "base" / "final" / "pretrain_report.json").is_file()


@pytest.mark.slow
def test_the_device_script_pretrains_and_hands_back_the_report_or_how_far_it_got(tmp_path):
    """scripts/device_pretrain.sh, the lent GPU machine's check, through the same command on the CPU: the base
    is pretrained and its report lands in $OUT; cut short by its budget, it exits non-zero and says so."""
    import hashlib
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    config = tmp_path / "pretrain.yaml"
    config.write_text(
        "pretrain:\n  size: tiny\n  eval_questions: 2\n"
        "  tasks:\n    train: [{source: mbpp, split: train, limit: 4}]\n"
        "    eval: [{source: mbpp, split: test, limit: 2}]\n"
        "  stages:\n    - {name: copy, mix: {quote_line: 1.0}, steps: 2, warmup_steps: 1,"
        " max_tokens_per_batch: 1024}\n")

    def device_pretrain(name: str, budget: int, work: str = "", hand_back_mb: int = 56) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / name),
               "WORK": str(tmp_path / f"w{work or name}"), "WHEELS": str(tmp_path / "no-wheels"),
               "BUDGET_S": str(budget), "HAND_BACK_MB": str(hand_back_mb)}
        return subprocess.run(["bash", str(root / "scripts" / "device_pretrain.sh"), "--config", str(config),
                               "--set", "pretrain.device=cpu", "--set", "pretrain.size=tiny",
                               "--set", "pretrain.compute_dtype=float32"],
                              capture_output=True, text=True, timeout=600, env=env)

    done = device_pretrain("out", 500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "pretrain_report.json").read_text())
    assert report["settings"]["size"] == "tiny" and report["stages"][0]["steps"] == 2  # the arguments won
    assert "device_pretrain: exit 0" in done.stdout
    assert "held-out copying" in (tmp_path / "out" / "pretrain.log").read_text()
    # the base comes back in parts that rejoin into the checkpoint the report hashes
    parts = sorted((tmp_path / "out").glob("final.tar.part-*"))
    assert parts and all(p.stat().st_size <= 15 * 2**20 for p in parts)
    subprocess.run(["tar", "-xf", "-", "-C", str(tmp_path)], input=b"".join(p.read_bytes() for p in parts),
                   check=True)
    weights = (tmp_path / "final" / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() == report["sha256"]["model.safetensors"]
    kept = device_pretrain("kept", 500, work="out", hand_back_mb=0)  # the same folder again: nothing to train
    assert kept.returncode == 0 and "stays on this machine" in kept.stdout
    assert not list((tmp_path / "kept").glob("final.tar.part-*"))
    cut = device_pretrain("cut", 1)
    assert cut.returncode == 124 and "device_pretrain: exit 124" in cut.stdout
    assert not (tmp_path / "cut" / "pretrain_report.json").exists()


@pytest.mark.slow
def test_third_party_noise_is_off_unless_verbose(tmp_path):
    """Building a model imports torch and transformers: their deprecation warning and loading bars are not
    shown by default, and are with --verbose (a fresh process each: warnings filters are process-wide)."""
    import os
    import subprocess
    import sys

    def stderr(*flags: str) -> str:
        out = tmp_path / f"m{len(flags)}"
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}  # set by in-process runs
        done = subprocess.run([sys.executable, "-m", "workflows.cli", *flags, "model", "init", "--out", str(out),
                               "--size", "tiny"], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stderr

    quiet, loud = stderr(), stderr("--verbose")
    assert "pynvml" not in quiet and "Writing model shards" not in quiet
    assert "pynvml" in loud and "Writing model shards" in loud
