"""scripts/gpu_check.sh --cpu: the GPU acceptance check's commands on the CPU backends (the way CI can run
it): every stage but online succeeds, the update trains real steps, and one table says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from builders import load_benchmark

from pipeline import schema

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_runs_its_commands_on_the_cpu_backends(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OPENBLAS_NUM_THREADS": "1"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    done = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--work", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    status = dict(re.findall(r"^(\w+)\s+(ok|failed|skipped)\s", done.stdout, re.M))
    assert status == {"checkpoint": "ok", "round": "ok", "update": "ok", "update_dp": "ok", "online": "skipped"}
    assert re.search(r"^update\s+ok .*train: (\d+)/\1 steps, done", done.stdout, re.M), done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("gpu_check: ok in ")
    assert (tmp_path / "policy_1" / "model.safetensors").is_file() and (tmp_path / "policy_dp").is_dir()


def test_the_update_input_has_a_signal_on_every_row(tmp_path):
    from builders import step_row

    bench = load_benchmark("gpu_check", "gpu_check_under_test")
    rows = [step_row(f"r{i}", f"t{i // 2}", "task", response_token_ids=[5] * (i + 1)) for i in range(6)]
    schema.write_table(rows, schema.table_dir(tmp_path / "round", "steps"), "steps")
    assert bench.signal_round(tmp_path / "round", tmp_path / "out") == "6 rows of 3 rollouts"
    adv = schema.read_table(schema.table_dir(tmp_path / "out", "advantages"), "advantages").to_pylist()
    assert [a["episode_advantage"] for a in adv] == [-1.0, -1.0, 1.0, 1.0, -1.0, -1.0]
    assert all(len(a["token_advantages"]) == i + 1 for i, a in enumerate(adv))
