"""The installable wheel: built from this checkout, installed into a fresh virtual environment (its
dependencies borrowed from the project's, the package itself only from the wheel), and used from another
folder: the SQL queries, configs and bundled data ship inside it (pipeline/assets.py)."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and runs a pipeline round from it

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(python of a fresh venv with only the wheel of didpo, its environment, a folder outside the checkout)."""
    work = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT), "-w",
          str(work / "dist")], cwd=work)
    wheel, = (work / "dist").glob("didpo-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], cwd=work)
    packages = next((work / "venv" / "lib").glob("python*/site-packages"))
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(packages), str(wheel)], cwd=work)
    # the dependencies, not the checkout: a plain path line adds the project's site-packages without running
    # its .pth files, so its editable install of didpo stays off
    (packages / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return work / "venv" / "bin" / "python", env, elsewhere


def test_the_wheel_carries_its_queries_configs_and_data(installed):
    python, env, elsewhere = installed
    where = _run([str(python), "-c", "import pipeline, pipeline.assets as a; print(pipeline.__file__); "
                  "print(*(a.asset_dir(n) for n in a.ASSETS))"], cwd=elsewhere, env=env)
    assert str(ROOT) not in where  # the installed package, not this checkout
    didpo = [str(python), "-m", "workflows.cli"]
    assert "HumanEval/0" in _run([*didpo, "tasks", "list", "--source", "humaneval"], cwd=elsewhere, env=env)
    assert "runner: FnApiRunner" in _run([*didpo, "config", "show"], cwd=elsewhere, env=env)
    listed = _run([*didpo, "sql", "--list"], cwd=elsewhere, env=env)
    assert "round_metrics" in listed and "reward_by_turn" in listed


def test_a_pipeline_round_runs_from_the_wheel(installed):
    python, env, elsewhere = installed
    didpo = [str(python), "-m", "workflows.cli"]
    _run([*didpo, "model", "init", "--out", str(elsewhere / "policy"), "--size", "tiny"], cwd=elsewhere, env=env)
    assert json.loads((elsewhere / "policy" / "config.json").read_text())["model_type"] == "qwen2"
    overrides = ["run.root=runs", "run.run_id=w", f"policy.checkpoint={elsewhere / 'policy'}",
                 "tasks.train=[{source: mbpp, split: train, limit: 1}]", "pipeline.samples_per_task=2",
                 "episode.max_turns=1", "policy.max_new_tokens=16", "episode.max_response_tokens=16",
                 "sandbox.pool_size=1"]
    _run([*didpo, "pipeline", "run", *(a for o in overrides for a in ("--set", o))], cwd=elsewhere, env=env)
    round_dir = elsewhere / "runs" / "w" / "round=0"
    assert (round_dir / "manifest.json").is_file()
    assert list((round_dir / "steps").glob("part-*.parquet")) and list((round_dir / "advantages").glob("part-*"))
