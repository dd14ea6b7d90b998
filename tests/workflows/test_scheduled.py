"""Scheduled workflows: the Airflow DAG, the nightly CI template and the Ray cluster config are valid for their
tools and agree with the code they run.

Airflow is not part of the project's environment, so the DAG file is executed against a minimal stand-in of
the Airflow API it imports (recording tasks, parameters and dependencies), and its templates are rendered with
Jinja's native environment, as Airflow does with `render_template_as_native_obj`.
"""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
import types
from pathlib import Path

import jinja2.nativetypes
import pytest
import typer
import yaml

from training.config import load_config
from workflows.eval_cmd import eval_cmd
from workflows.report import report_cmd

ROOT = Path(__file__).resolve().parents[2]
DAG_FILE = ROOT / "workflows" / "airflow" / "didpo_round_dag.py"
NIGHTLY = ROOT / "workflows" / "ci" / "nightly-demo.yml"
RAY = ROOT / "workflows" / "ray" / "cluster.yaml"
AIRFLOW_IMPORTS = {
    "airflow": "DAG", "airflow.exceptions": "AirflowFailException", "airflow.models.param": "Param",
    "airflow.operators.bash": "BashOperator", "airflow.operators.python": "BranchPythonOperator",
    "airflow.providers.apache.beam.operators.beam": "BeamRunPythonPipelineOperator",
}


# ---- a minimal Airflow stand-in ------------------------------------------------------------------------


class _Dag:
    current: _Dag | None = None

    def __init__(self, dag_id, **kwargs):
        self.dag_id, self.kwargs, self.tasks, self.edges = dag_id, kwargs, {}, set()

    def __enter__(self):
        _Dag.current = self
        return self

    def __exit__(self, *exc):
        _Dag.current = None


class _Operator:
    def __init__(self, task_id, **kwargs):
        self.task_id, self.kwargs = task_id, kwargs
        self.dag = _Dag.current
        assert task_id not in self.dag.tasks, f"task id {task_id} used twice"
        self.dag.tasks[task_id] = self

    def _link(self, downstream):
        for d in downstream if isinstance(downstream, list) else [downstream]:
            self.dag.edges.add((self.task_id, d.task_id))
        return downstream

    def __rshift__(self, other):
        return self._link(other)

    def __rrshift__(self, other):  # [a, b] >> self
        for upstream in other if isinstance(other, list) else [other]:
            upstream._link(self)
        return self


class _Param:
    def __init__(self, default=None, **schema):
        self.default, self.schema = default, schema


def _stub_airflow(monkeypatch) -> None:
    kinds = {"BashOperator": type("BashOperator", (_Operator,), {}),
             "BranchPythonOperator": type("BranchPythonOperator", (_Operator,), {}),
             "BeamRunPythonPipelineOperator": type("BeamRunPythonPipelineOperator", (_Operator,), {}),
             "DAG": _Dag, "Param": _Param, "AirflowFailException": type("AirflowFailException", (Exception,), {})}
    for module, attr in AIRFLOW_IMPORTS.items():
        parts = module.split(".")
        for i in range(1, len(parts) + 1):  # the module and its parent packages
            name = ".".join(parts[:i])
            if not isinstance(sys.modules.get(name), _StubModule):
                monkeypatch.setitem(sys.modules, name, _StubModule(name))
        setattr(sys.modules[module], attr, kinds[attr])


class _StubModule(types.ModuleType):
    pass


@pytest.fixture
def dag_module(monkeypatch):
    monkeypatch.setenv("DIDPO_HOME", str(ROOT))
    _stub_airflow(monkeypatch)
    namespace: dict = {"__name__": "didpo_round_dag", "__file__": str(DAG_FILE)}
    exec(compile(DAG_FILE.read_text(), str(DAG_FILE), "exec"), namespace)  # noqa: S102 - the file under test
    return types.SimpleNamespace(**namespace)


def test_dag_imports_only_airflow_and_the_beam_provider():
    tree = ast.parse(DAG_FILE.read_text())
    imported = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)} | {
        a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    third_party = {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names and m != "__future__"}
    assert third_party == set(AIRFLOW_IMPORTS)


def test_dag_tasks_dependencies_and_parameters(dag_module):
    dag = dag_module.dag
    assert dag.dag_id == "didpo_round" and dag.kwargs["schedule"] is None and dag.kwargs["max_active_runs"] == 1
    assert set(dag.tasks) == {"resolve_run", "choose_runner", "pipeline_beam", "pipeline_dataflow_flex", "train",
                              "evaluate", "report"}
    assert dag.edges == {("resolve_run", "choose_runner"), ("choose_runner", "pipeline_beam"),
                         ("choose_runner", "pipeline_dataflow_flex"), ("pipeline_beam", "train"),
                         ("pipeline_dataflow_flex", "train"), ("train", "evaluate"), ("evaluate", "report")}
    assert type(dag.tasks["pipeline_beam"]).__name__ == "BeamRunPythonPipelineOperator"
    assert Path(dag.tasks["pipeline_beam"].kwargs["py_file"]) == ROOT / "workflows" / "dataflow" / "main.py"
    assert dag.tasks["train"].kwargs["trigger_rule"] == "none_failed_min_one_success"  # after either branch
    round_param = dag.kwargs["params"]["round"]
    assert round_param.default == 0 and round_param.schema == {
        "type": "integer", "minimum": 0, "description": "policy round k (0-based)"}
    assert set(dag.kwargs["params"]["runner"].schema["enum"]) >= {"FnApiRunner", "DataflowFlexTemplate"}


RUN = {"run_dir": "/data/runs/exp1", "policy": "/data/runs/exp1/round=2/policy"}  # resolve_run's XCom


def _render(dag_module, template: str, params: dict, run: dict | None = None):
    dag = dag_module.dag
    env = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)
    env.globals.update(dag.kwargs["user_defined_macros"])
    env.filters.update(dag.kwargs["user_defined_filters"])
    defaults = {k: p.default for k, p in dag.kwargs["params"].items()}
    xcom = json.dumps(run or RUN)
    ti = types.SimpleNamespace(xcom_pull=lambda task_ids: xcom if task_ids == "resolve_run" else None)
    var = types.SimpleNamespace(value=types.SimpleNamespace(didpo_gcp_project="proj", didpo_gcp_region="us-c1",
                                                            didpo_gcs_bucket="gs://b", didpo_image="img:1"))
    return env.from_string(template).render(params={**defaults, **params}, ti=ti, var=var, ts_nodash="20260101T0")


def test_pipeline_task_runs_round_k_with_the_resolved_policy(dag_module):
    beam = dag_module.dag.tasks["pipeline_beam"].kwargs
    opts = _render(dag_module, beam["pipeline_options"], {"round": 3, "beam_args": ["--flink_master=fm:8081"]})
    assert opts["round"] == 3 and opts["checkpoint"] == RUN["policy"]
    assert opts["flink_master"] == "fm:8081"
    cfg = load_config(opts["config"], opts["set"])  # what pipeline.run.main will load
    assert cfg.run.root == f"{ROOT}/runs"
    first = _render(dag_module, beam["pipeline_options"], {"round": 0}, {"run_dir": "/r", "policy": None})
    assert "checkpoint" not in first  # the config's policy.checkpoint
    assert _render(dag_module, beam["runner"], {"runner": "FlinkRunner"}) == "FlinkRunner"
    with pytest.raises(ValueError, match="beam_args entry 'round=4'"):
        dag_module.pipeline_options({"config": "c.yaml", "round": 1, "beam_args": ["round=4"]}, {})


def test_branch_follows_the_runner_parameter(dag_module):
    choose = dag_module.pipeline_branch
    assert choose({"runner": "DirectRunner"}) == "pipeline_beam"
    assert choose({"runner": "DataflowFlexTemplate", "overrides": []}) == "pipeline_dataflow_flex"
    with pytest.raises(ValueError, match="put the overrides into it"):
        choose({"runner": "DataflowFlexTemplate", "overrides": ["a.b=1"]})
    with pytest.raises(ValueError, match="PrismRunner"):
        choose({"runner": "PrismRunner"})


def _cli_parses(command, args: list[str]) -> None:
    """The args are accepted by the command's options (parsed and type-checked, not run)."""
    app = typer.Typer()
    app.command()(command)
    click_cmd = typer.main.get_command(app)
    click_cmd.make_context("didpo", list(args))


def test_train_eval_report_commands_render_to_valid_command_lines(dag_module):
    tasks = dag_module.dag.tasks
    params = {"round": 2, "eval_limit": 20, "overrides": ["run.root=/data/runs", "credit.lam=1.2"]}
    train = shlex.split(_render(dag_module, tasks["train"].kwargs["bash_command"], params))
    assert train[train.index("round") - 1].endswith("/.venv/bin/didpo") and train[-2:] == ["--rounds", "3"]
    assert train[train.index("-c") + 1] == f"{ROOT}/configs/local.yaml"
    assert [train[i + 1] for i, a in enumerate(train) if a == "--set"] == params["overrides"]
    evaluate = shlex.split(_render(dag_module, tasks["evaluate"].kwargs["bash_command"], params))
    eval_args = evaluate[evaluate.index("eval") + 1:]
    assert eval_args[eval_args.index("--after-round") + 1] == "2"  # policy k+1, resolved as `didpo round` does
    assert eval_args[eval_args.index("--limit") + 1] == "20"
    _cli_parses(eval_cmd, eval_args)
    no_limit = _render(dag_module, tasks["evaluate"].kwargs["bash_command"], {"round": 2})
    assert "--limit" not in no_limit
    report = shlex.split(_render(dag_module, tasks["report"].kwargs["bash_command"], params))
    _cli_parses(report_cmd, report[report.index("report") + 1:])


@pytest.mark.slow
def test_resolve_task_publishes_the_run_folder_and_the_policy_of_the_round(dag_module, tmp_path):
    template = dag_module.dag.tasks["resolve_run"].kwargs["bash_command"]

    def resolve(round_k: int, *overrides: str):
        params = {"round": round_k, "overrides": [f"run.root={tmp_path}", "run.run_id=exp 1", *overrides]}
        out = subprocess.run(["bash", "-c", _render(dag_module, template, params)], capture_output=True, text=True,
                             timeout=120)
        return (json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None), out.stderr

    run = tmp_path / "exp 1"
    assert resolve(0, "sft.enabled=false")[0] == {"run_dir": str(run), "policy": None}
    got, err = resolve(0)
    assert got is None and "cold-start the policy first" in err  # sft.enabled is the default
    (run / "sft").mkdir(parents=True)
    assert resolve(0)[0]["policy"] == str(run / "sft")  # what `didpo round` samples round 0 with
    got, err = resolve(2)
    assert got is None and "run round 1 first" in err
    (run / "round=1" / "policy").mkdir(parents=True)
    assert resolve(2)[0] == {"run_dir": str(run), "policy": str(run / "round=1" / "policy")}
    relative = subprocess.run(["bash", "-c", _render(dag_module, template, {"overrides": []})],
                              capture_output=True, text=True, timeout=120)
    assert relative.returncode != 0 and "run.root 'runs' is relative" in relative.stderr


def test_flex_task_wires_the_dataflow_template(dag_module):
    task = dag_module.dag.tasks["pipeline_dataflow_flex"].kwargs
    script = _render(dag_module, task["bash_command"], {"round": 4, "overrides": [],
                                                        "config": "configs/dataflow_gpu.yaml"})
    assert "workflows/dataflow/launch.sh run" in script
    assert "ROUND=4" in script and f"CHECKPOINT={RUN['policy']}" in script
    assert "PROJECT=proj" in script and "CONFIG=configs/dataflow_gpu.yaml" in script
    assert (ROOT / "workflows" / "dataflow" / "launch.sh").is_file()
    assert (ROOT / "configs" / "dataflow_gpu.yaml").is_file()
    syntax = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr


# ---- YAML --------------------------------------------------------------------------------------------------


def test_nightly_ci_template_runs_the_cpu_demo_on_a_schedule():
    wf = yaml.safe_load(NIGHTLY.read_text())
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads the bare key `on` as true
    cron = triggers["schedule"][0]["cron"]
    assert len(cron.split()) == 5 and "workflow_dispatch" in triggers
    steps = wf["jobs"]["demo"]["steps"]
    runs = [s["run"] for s in steps if "run" in s]
    assert "make demo" in runs
    assert any("didpo eval" in r and "--limit 20" in r for r in runs)
    assert any("didpo report" in r for r in runs)
    assert all("uses" in s or "run" in s for s in steps)
    assert wf["jobs"]["demo"]["timeout-minutes"] > 0


def test_ray_cluster_config_is_complete_and_consistent():
    c = yaml.safe_load(RAY.read_text())
    for key in ("cluster_name", "max_workers", "provider", "auth", "available_node_types", "head_node_type",
                "head_start_ray_commands", "worker_start_ray_commands"):
        assert key in c, key
    nodes = c["available_node_types"]
    assert c["head_node_type"] in nodes
    workers = [n for name, n in nodes.items() if name != c["head_node_type"]]
    assert sum(n["max_workers"] for n in workers) <= c["max_workers"]
    assert all(0 <= n["min_workers"] <= n["max_workers"] for n in nodes.values())
    gpus = {n["resources"]["GPU"] for n in workers}
    online = load_config(ROOT / "configs" / "gpu_online.yaml").online
    assert gpus == {online.actor_num_gpus_per_node}  # one worker node = one OpenRLHF placement group
    assert any("ray start --head" in cmd for cmd in c["head_start_ray_commands"])
    assert any("--address=$RAY_HEAD_IP:6379" in cmd for cmd in c["worker_start_ray_commands"])

