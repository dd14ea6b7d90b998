"""Airflow DAG `didpo_round`: one DiDPO policy round, triggered with the round number as a parameter.

    resolve_run -> choose_runner -> pipeline_beam | pipeline_dataflow_flex -> train -> evaluate -> report

1. `resolve_run` validates the config (plus `overrides`) and publishes the run folder <run.root>/<run.run_id>;
   run.root must be absolute (shared by the tasks). Every task gets the same config and overrides, so they
   all hash to the same config and `didpo round` accepts the tables the pipeline task wrote.
2. Stage 1, the Beam pipeline of round k with policy k (round k-1's `policy/`; for k = 0 the SFT cold start
   <run>/sft when sft.enabled, made beforehand with `didpo sft`, else `policy.checkpoint`):
   - `pipeline_beam`: Airflow's Beam operator runs workflows/dataflow/main.py (= `python -m pipeline.run`) on
     the chosen runner (FnApiRunner, DirectRunner, FlinkRunner, SparkRunner, DataflowRunner) with `beam_args`;
   - `pipeline_dataflow_flex`: the flex template (workflows/dataflow/launch.sh run), then waits for the job.
3. `train`: `didpo round --rounds k+1` resumes from the round manifests: the pipeline stages are recorded as
   done, so it runs only the update of round k (OpenRLHF Actor + PolicyLoss on DeepSpeed) and the quick
   held-out check, writing round=<k>/policy (= policy k+1).
4. `evaluate`: `didpo eval` of policy k+1 on the benchmarks (pass@k, per subset) into round=<k>/eval (policy k+1:
   round=<k>/policy, or policy k itself when round k had nothing to train; `didpo eval --after-round k`).
5. `report`: `didpo report` refreshes the run's HTML page.

Deployment: the repository with its environment at $DIDPO_HOME (default /opt/didpo, `make setup` done) on
the workers; for the flex path, Airflow Variables didpo_gcp_project, didpo_gcp_region, didpo_gcs_bucket and
didpo_image (launch.sh's PROJECT, REGION, BUCKET, IMAGE) and gcloud on the worker. Airflow 2.9+ with
apache-airflow-providers-apache-beam. The flex template reads one config file baked into the image (no
overrides; its run.root a mounted path). Trigger: `airflow dags trigger didpo_round --conf '{"round": 3}'`.
"""

from __future__ import annotations

import json
import os
import shlex
from datetime import UTC, datetime, timedelta

from airflow import DAG
from airflow.exceptions import AirflowFailException
from airflow.models.param import Param
from airflow.operators.bash import BashOperator
from airflow.operators.python import BranchPythonOperator
from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator

DIDPO_HOME = os.environ.get("DIDPO_HOME", "/opt/didpo")
PYTHON = f"{DIDPO_HOME}/.venv/bin/python"
DIDPO = f"{DIDPO_HOME}/.venv/bin/didpo"
# as shell words: the checkout may live under a path with spaces
HOME_SH, PYTHON_SH, DIDPO_SH = shlex.quote(DIDPO_HOME), shlex.quote(PYTHON), shlex.quote(DIDPO)
BEAM_RUNNERS = ("FnApiRunner", "DirectRunner", "FlinkRunner", "SparkRunner", "DataflowRunner")
FLEX = "DataflowFlexTemplate"


# ---- pure helpers (Jinja macros); they import nothing and are tested without Airflow --------------------


def in_home(path: str) -> str:
    """A path relative to DIDPO_HOME as an absolute one (the Beam operator does not run in DIDPO_HOME)."""
    return path if os.path.isabs(path) else f"{DIDPO_HOME}/{path}"


def config_argv(params: dict) -> list[str]:
    """`-c CONFIG --set ...`, the same for every task, so that all of them hash to the same config."""
    args = ["-c", in_home(params["config"])]
    for item in params.get("overrides") or []:
        args += ["--set", item]
    return args


def config_args(params: dict) -> str:
    """`config_argv`, shell-quoted, for the didpo commands."""
    return " ".join(shlex.quote(a) for a in config_argv(params))


def resolved(ti) -> dict:
    """What `resolve_run` published: {"run_dir": ..., "policy": checkpoint of this round or null}."""
    return json.loads(ti.xcom_pull(task_ids="resolve_run"))


def pipeline_options(params: dict, run: dict) -> dict:
    """Options of workflows/dataflow/main.py (pipeline.run.main) for round `params["round"]`; the runner's own
    options (`beam_args`, `--key=value`) pass through to Beam."""
    argv = config_argv(params)
    options: dict = {"config": argv[1], "round": int(params["round"]), "set": argv[3::2]}  # a list option
    if run.get("policy"):  # is repeated per item by the Beam operator
        options["checkpoint"] = run["policy"]
    for arg in params.get("beam_args") or []:
        key, sep, value = arg.removeprefix("--").partition("=")
        if not key or not sep or key in options or key == "runner":
            raise ValueError(f"beam_args entry {arg!r} must be --key=value for a Beam option (not config, round, "
                             "set, checkpoint or runner)")
        options[key] = value
    return options


def pipeline_branch(params: dict) -> str:
    """The pipeline task for `params["runner"]`; the flex template takes one config file and no overrides."""
    runner = params["runner"]
    if runner == FLEX:
        if params.get("overrides"):
            raise ValueError("the Dataflow flex template reads one config file: put the overrides into it")
        return "pipeline_dataflow_flex"
    if runner not in BEAM_RUNNERS:
        raise ValueError(f"runner {runner!r} is not one of {', '.join((*BEAM_RUNNERS, FLEX))}")
    return "pipeline_beam"


def _choose(params: dict, **_) -> str:
    try:
        return pipeline_branch(params)
    except ValueError as e:
        raise AirflowFailException(str(e)) from None  # a wrong parameter: fail at once, no retries


# ---- the DAG ------------------------------------------------------------------------------------------------

RUN_DIR = "{{ resolved(ti).run_dir | q }}"  # a shell word
ROUND = "{{ params.round }}"

# Validates the config and publishes, as JSON on the last stdout line (the XCom), the run folder and the
# policy round k samples with (`workflows.rounds.round_policy`, the rule `didpo round` follows, so that it
# accepts the pipeline's tables later; null = policy.checkpoint). run.root must be
# absolute: the tasks run in different working directories (the Beam operator's is not DIDPO_HOME).
RESOLVE_SCRIPT = """
import json, os, sys
from training.config import load_config
from workflows.rounds import round_policy
k, c = int(sys.argv[1]), load_config(sys.argv[2], sys.argv[3:])
if not os.path.isabs(c.run.root):
    sys.exit(f"run.root {c.run.root!r} is relative: scheduled tasks need an absolute (shared) path")
try:
    policy = round_policy(c, k)
except ValueError as e:
    sys.exit(str(e))
run = os.path.join(c.run.root, c.run.run_id)
print(json.dumps({"run_dir": run, "policy": None if policy is None else str(policy)}))
"""
RESOLVE_COMMAND = (f"cd {HOME_SH} && {PYTHON_SH} -c {shlex.quote(RESOLVE_SCRIPT)} {{{{ params.round }}}} "
                   "{{ in_home(params.config) | q }} {{ params.overrides | map('q') | join(' ') }}")
ARGS = "{{ config_args(params) }}"

# Launches the flex template (launch.sh run) and waits for the job: gcloud returns once it is submitted.
# Values go through the command (shell-quoted), not `env`: native rendering would turn "3" into an int.
FLEX_COMMAND = """
set -euo pipefail
export PROJECT={{ var.value.didpo_gcp_project | q }} REGION={{ var.value.didpo_gcp_region | q }}
export BUCKET={{ var.value.didpo_gcs_bucket | q }} IMAGE={{ var.value.didpo_image | q }}
export CONFIG={{ params.config | q }} ROUND={{ params.round }}
export CHECKPOINT={{ (resolved(ti).policy or '') | q }}
export JOB_NAME=didpo-round-{{ params.round }}-{{ ts_nodash | lower }}
cd "$DIDPO_HOME"
workflows/dataflow/launch.sh run
job_id=$(gcloud dataflow jobs list --project "$PROJECT" --region "$REGION" --filter "name=$JOB_NAME" \
  --format "value(id)" --limit 1)
[[ -n "$job_id" ]] || { echo "no Dataflow job named $JOB_NAME"; exit 1; }
while true; do
  state=$(gcloud dataflow jobs describe "$job_id" --project "$PROJECT" --region "$REGION" \
    --format "value(currentState)")
  case "$state" in
    JOB_STATE_DONE) echo "Dataflow job $job_id done"; exit 0 ;;
    JOB_STATE_FAILED | JOB_STATE_CANCELLED | JOB_STATE_DRAINED) echo "Dataflow job $job_id: $state"; exit 1 ;;
  esac
  sleep 60
done
"""

with DAG(
    dag_id="didpo_round",
    description="One DiDPO policy round: Beam pipeline -> trainer -> benchmark evaluation -> report",
    schedule=None,  # triggered per round, with the round number in the run's conf
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # rounds build on each other: one at a time
    render_template_as_native_obj=True,  # pipeline_options renders to a dict, not its repr
    user_defined_macros={"config_args": config_args, "pipeline_options": pipeline_options,
                         "resolved": resolved, "in_home": in_home},
    user_defined_filters={"q": shlex.quote},
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
    params={
        "round": Param(0, type="integer", minimum=0, description="policy round k (0-based)"),
        "config": Param("configs/local.yaml", type="string", description="config file, relative to DIDPO_HOME"),
        "overrides": Param([f"run.root={DIDPO_HOME}/runs"], type="array", items={"type": "string"},
                           description="config overrides a.b=c (run.root must end up absolute)"),
        "runner": Param("FnApiRunner", enum=[*BEAM_RUNNERS, FLEX], description="where stage 1 runs"),
        "beam_args": Param([], type="array", items={"type": "string"},
                           description="runner options, e.g. --flink_master=host:8081"),
        "benchmarks": Param("humanevalfix,mbppplus", type="string", description="didpo eval --benchmarks"),
        "eval_samples": Param(1, type="integer", minimum=1, description="episodes per task (n of pass@k)"),
        "eval_limit": Param(None, type=["null", "integer"], minimum=1, description="tasks per benchmark"),
    },
    tags=["didpo"],
) as dag:
    resolve_run = BashOperator(task_id="resolve_run", bash_command=RESOLVE_COMMAND, do_xcom_push=True)
    choose_runner = BranchPythonOperator(task_id="choose_runner", python_callable=_choose)
    pipeline_beam = BeamRunPythonPipelineOperator(
        task_id="pipeline_beam",
        py_file=f"{DIDPO_HOME}/workflows/dataflow/main.py",
        runner="{{ params.runner }}",
        pipeline_options="{{ pipeline_options(params, resolved(ti)) }}",
        py_interpreter=PYTHON,
        py_requirements=None,  # the project's own environment, never a fresh virtualenv
        execution_timeout=timedelta(hours=12),
    )
    pipeline_flex = BashOperator(
        task_id="pipeline_dataflow_flex",
        bash_command=FLEX_COMMAND,
        env={"DIDPO_HOME": DIDPO_HOME},
        append_env=True,
        execution_timeout=timedelta(hours=12),
    )
    train = BashOperator(
        task_id="train",
        trigger_rule="none_failed_min_one_success",  # after whichever pipeline branch ran
        bash_command=f"cd {HOME_SH} && {DIDPO_SH} round {ARGS} --rounds {{{{ params.round + 1 }}}}",
        execution_timeout=timedelta(hours=24),
    )
    evaluate = BashOperator(
        task_id="evaluate",
        bash_command=(f"cd {HOME_SH} && {DIDPO_SH} eval --after-round {ROUND} "  # policy k+1, as rounds resolve it
                      "--benchmarks {{ params.benchmarks }} --samples {{ params.eval_samples }} "
                      "{% if params.eval_limit %}--limit {{ params.eval_limit }} {% endif %}"
                      f"--out {RUN_DIR}/round={ROUND}/eval {ARGS}"),
        execution_timeout=timedelta(hours=12),
    )
    report = BashOperator(
        task_id="report",
        bash_command=f"cd {HOME_SH} && {DIDPO_SH} report --run {RUN_DIR} --out {RUN_DIR}/report",
    )

    resolve_run >> choose_runner >> [pipeline_beam, pipeline_flex]
    [pipeline_beam, pipeline_flex] >> train >> evaluate >> report
