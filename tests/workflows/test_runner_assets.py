"""The runner assets (workflows/dataflow/, configs/dataflow_gpu.yaml) agree with the code that runs them.

Building the image and launching jobs needs the network, so these checks are structural: the flex template
names only parameters the entry point or Beam accepts, the Dockerfile is pinned to our Beam version and
installs torch before the project, launch.sh refuses to run unconfigured, and the GPU preset loads.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import (
    DebugOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    WorkerOptions,
)

from pipeline.run import beam_options, main
from training.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DATAFLOW = ROOT / "workflows" / "dataflow"
PRESET = ROOT / "configs" / "dataflow_gpu.yaml"


def _run_py_arguments() -> set[str]:
    """The options `python -m pipeline.run` itself parses (from its --help)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    return set(re.findall(r"--([a-z_]+)", out.getvalue())) - {"help"}


def _beam_option_names() -> set[str]:
    return set(PipelineOptions([]).get_all_options(retain_unknown_options=False))


def _pinned_beam_version() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if re.match(r"apache-beam(\[.*\])?==", d)]
    return pin.split("==")[1].strip()


def _dockerfile_instructions() -> list[str]:
    """Instructions with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DATAFLOW / "Dockerfile").read_text())
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


# ---- flex template metadata ------------------------------------------------------------------------------


def test_metadata_is_a_flex_template_spec_whose_parameters_the_entry_point_accepts():
    meta = json.loads((DATAFLOW / "metadata.json").read_text())
    assert meta["name"] and meta["description"] and meta["sdkInfo"]["language"] == "PYTHON"
    params = meta["parameters"]
    names = [p["name"] for p in params]
    assert len(names) == len(set(names)), "duplicate parameter"
    for p in params:
        assert set(p) <= {"name", "label", "helpText", "isOptional", "regexes", "paramType"}, p
        assert p["label"] and p["helpText"], p["name"]
        for rx in p.get("regexes", []):
            re.compile(rx)
    ours, beams = _run_py_arguments(), _beam_option_names()
    assert {"config", "round", "checkpoint"} <= ours
    unknown = [n for n in names if n not in ours and n not in beams]
    assert not unknown, f"parameters neither pipeline.run nor Beam accepts: {unknown}"
    required = {p["name"] for p in params if not p.get("isOptional", False)}
    assert required == {"config"}
    for wanted in ("num_workers", "machine_type", "dataflow_service_options", "sdk_container_image"):
        assert wanted in names and wanted in beams


def test_metadata_regexes_accept_the_values_launch_sh_sends():
    params = {p["name"]: p for p in json.loads((DATAFLOW / "metadata.json").read_text())["parameters"]}

    def ok(name: str, value: str) -> bool:
        return all(re.fullmatch(rx, value) for rx in params[name].get("regexes", []))

    assert ok("config", "/template/configs/dataflow_gpu.yaml") and not ok("config", "configs/x.txt")
    assert ok("round", "3") and not ok("round", "-1")
    assert ok("set", "run.run_id=r7") and not ok("set", "no-equals-sign")


# ---- Dockerfile ------------------------------------------------------------------------------------------


def test_dockerfile_base_image_matches_the_beam_pin():
    froms = [ln.split()[1] for ln in _dockerfile_instructions() if ln.upper().startswith("FROM ")]
    final = froms[-1]
    assert final == f"apache/beam_python3.11_sdk:{_pinned_beam_version()}"
    assert any(f.startswith("gcr.io/dataflow-templates-base/python311-template-launcher-base") for f in froms)


def test_dockerfile_installs_torch_before_the_project_and_sets_the_flex_template_file():
    lines = _dockerfile_instructions()
    runs = [i for i, ln in enumerate(lines) if ln.startswith("RUN ")]
    torch_at = next(i for i in runs if re.search(r"pip install .*torch==", lines[i]))
    flash_at = next(i for i in runs if "FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE" in lines[i])
    project_at = next(i for i in runs if re.search(r"pip install -e \S*\.", lines[i]))
    assert torch_at < flash_at < project_at
    assert "--index-url" in lines[torch_at] and "TORCH_INDEX_URL" in lines[torch_at]
    assert any("apt-get install" in lines[i] and "bubblewrap" in lines[i] for i in runs)
    env = " ".join(ln for ln in lines if ln.startswith("ENV "))
    py_file = re.search(r"FLEX_TEMPLATE_PYTHON_PY_FILE=(\S+)", env).group(1)
    assert py_file.startswith("/template/")
    assert (ROOT / py_file.removeprefix("/template/")).is_file(), py_file
    assert any("COPY --from=launcher /opt/google/dataflow/python_template_launcher" in ln for ln in lines)
    assert lines[-1] == 'ENTRYPOINT ["/opt/apache/beam/boot"]'


def test_dockerfile_copies_everything_the_installed_project_reads():
    copied = {ln.split()[1].rstrip("/") for ln in _dockerfile_instructions()
              if ln.startswith("COPY ") and "--from" not in ln}
    for needed in ("pyproject.toml", "pipeline", "training", "workflows", "sql", "configs", "data"):
        assert needed in copied, needed
        assert (ROOT / needed).exists(), needed


# ---- launch.sh -------------------------------------------------------------------------------------------


def _launch(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run launch.sh with fake gcloud/docker/python on PATH that record any call."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("gcloud", "docker", "python3"):
        fake = bin_dir / tool
        fake.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n')
        fake.chmod(0o755)
    proc = subprocess.run(["/bin/bash", str(DATAFLOW / "launch.sh"), *args], capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env}, timeout=30)
    return proc, calls


def test_launch_sh_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(DATAFLOW / "launch.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert os.access(DATAFLOW / "launch.sh", os.X_OK)


@pytest.mark.parametrize("command", ["image", "template", "run", "direct"])
def test_launch_sh_refuses_to_run_without_its_required_variables(command, tmp_path):
    proc, calls = _launch([command], {}, tmp_path)
    assert proc.returncode == 2
    assert "missing required variable(s): PROJECT REGION BUCKET IMAGE" in proc.stderr
    assert not calls.exists(), calls.read_text()


def test_launch_sh_names_only_the_missing_variable_and_checks_the_bucket(tmp_path):
    env = {"PROJECT": "p", "REGION": "r", "BUCKET": "gs://b"}
    proc, calls = _launch(["direct"], env, tmp_path)
    assert proc.returncode == 2 and "missing required variable(s): IMAGE (" in proc.stderr
    proc, calls = _launch(["direct"], {**env, "IMAGE": "img", "BUCKET": "/local"}, tmp_path)
    assert proc.returncode == 2 and "BUCKET must be a gs:// URL" in proc.stderr
    assert not calls.exists()


def test_launch_sh_refuses_an_unknown_command(tmp_path):
    proc, calls = _launch(["deploy"], {"PROJECT": "p", "REGION": "r", "BUCKET": "gs://b", "IMAGE": "i"}, tmp_path)
    assert proc.returncode == 2 and "unknown or missing command 'deploy'" in proc.stderr
    assert not calls.exists()


def test_launch_sh_direct_passes_the_dataflow_options_to_pipeline_run(tmp_path):
    env = {"PROJECT": "proj", "REGION": "us-central1", "BUCKET": "gs://bkt/", "IMAGE": "reg/didpo:1",
           "ROUND": "2", "JOB_NAME": "job"}
    proc, calls = _launch(["direct"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    (call,) = calls.read_text().splitlines()
    args = call.split(" ")
    assert args[:3] == ["python3", "-m", "pipeline.run"]
    for expected in ("--runner=DataflowRunner", "--project=proj", "--region=us-central1", "--job_name=job",
                     "--temp_location=gs://bkt/tmp", "--sdk_container_image=reg/didpo:1",
                     "--experiments=use_runner_v2",
                     "--dataflow_service_options=worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"):
        assert expected in args, expected
    assert args[args.index("--round") + 1] == "2"
    assert args[args.index("--config") + 1] == "configs/dataflow_gpu.yaml"
    assert args[args.index("--set") + 1] == "run.root=gs://bkt/runs"  # tables in the bucket (pipeline.storage)


# ---- the GPU preset ---------------------------------------------------------------------------------------


def test_dataflow_preset_loads_and_builds_dataflow_options():
    cfg = load_config(PRESET)
    assert cfg.pipeline.runner == "DataflowRunner" and cfg.policy.backend == "vllm"
    assert cfg.pipeline.samples_per_task == 32
    assert load_config(PRESET, ["run.root=gs://bkt/runs"]).run.root == "gs://bkt/runs"  # launch.sh sets it
    options = beam_options(cfg.pipeline, ["--project=proj", "--sdk_container_image=reg/didpo:1"])
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    assert "use_runner_v2" in options.view_as(DebugOptions).experiments
    assert options.view_as(GoogleCloudOptions).dataflow_service_options == [
        "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"]
    assert options.view_as(GoogleCloudOptions).project == "proj"
    assert options.view_as(WorkerOptions).sdk_container_image == "reg/didpo:1"
    assert options.view_as(WorkerOptions).machine_type == "g2-standard-8"


def test_dataflow_preset_tasks_come_from_files_bundled_in_the_image():
    cfg = load_config(PRESET)
    for spec in (*cfg.tasks.train, *cfg.tasks.eval):
        assert spec.path is None, f"{spec.source}: a path outside the image would not exist on the launcher"


def test_command_line_runner_overrides_the_preset():
    cfg = load_config(PRESET, ["pipeline.runner=DirectRunner"])
    assert beam_options(cfg.pipeline).view_as(StandardOptions).runner == "DirectRunner"
