#!/usr/bin/env bash
# Build the DiDPO image and run one pipeline round on Dataflow (docs/runners.md).
#
#   workflows/dataflow/launch.sh image      build and push the worker/launcher image
#   workflows/dataflow/launch.sh template   build the flex template spec (gs://) from the image + metadata.json
#   workflows/dataflow/launch.sh run        launch a job from the flex template
#   workflows/dataflow/launch.sh direct     submit from this machine: python -m pipeline.run --runner=DataflowRunner
#
# Required (every command):
#   PROJECT          Google Cloud project id
#   REGION           Dataflow region, e.g. us-central1
#   BUCKET           gs://bucket for staging, temp files and the template spec
#   IMAGE            image reference, e.g. us-central1-docker.pkg.dev/PROJECT/REPO/didpo:2026-01
# Optional (defaults in brackets):
#   CONFIG           config file, relative to the repository root [configs/dataflow_gpu.yaml]
#   ROUND            policy round k [0]
#   CHECKPOINT       policy checkpoint directory, as seen by the launcher and the workers [policy.checkpoint]
#   RUN_ROOT         run.root: where the round's tables and manifest are written [BUCKET/runs]
#   ACCELERATOR      worker GPU [type:nvidia-l4;count:1;install-nvidia-driver]
#   MACHINE_TYPE     worker machine type (must fit the accelerator) [g2-standard-8]
#   NUM_WORKERS      initial workers [1]
#   MAX_NUM_WORKERS  autoscaling ceiling [4]
#   JOB_NAME         Dataflow job name [didpo-round-ROUND-<utc time>]
#   TEMPLATE_PATH    flex template spec [BUCKET/templates/didpo.json]
#   BUILDER          docker (local docker build + push) or cloudbuild [docker]
#   TORCH_INDEX_URL  torch wheel index; the CUDA build for GPU workers [https://download.pytorch.org/whl/cu128]
#   EXTRAS           project extras installed in the image [gpu]
#   MODEL_DIR        local checkpoint baked into the image at /models/policy (docker builder only) [none]
#   PYTHON           interpreter for `direct` (needs apache-beam[gcp]) [python3]
set -euo pipefail

usage() {
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
  echo "variables: see the header of $0" >&2
}

die() {
  echo "launch.sh: $*" >&2
  exit 2
}

cmd="${1:-}"
case "$cmd" in
  image | template | run | direct) ;;
  *)
    usage
    die "unknown or missing command '${cmd}' (expected image, template, run or direct)"
    ;;
esac

missing=()
for var in PROJECT REGION BUCKET IMAGE; do
  [[ -n "${!var:-}" ]] || missing+=("$var")
done
if ((${#missing[@]})); then
  die "missing required variable(s): ${missing[*]} (set them in the environment; see the header of $0)"
fi
[[ "$BUCKET" == gs://* ]] || die "BUCKET must be a gs:// URL, got '$BUCKET'"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONFIG="${CONFIG:-configs/dataflow_gpu.yaml}"
ROUND="${ROUND:-0}"
CHECKPOINT="${CHECKPOINT:-}"
RUN_ROOT="${RUN_ROOT:-${BUCKET%/}/runs}"
ACCELERATOR="${ACCELERATOR:-type:nvidia-l4;count:1;install-nvidia-driver}"
MACHINE_TYPE="${MACHINE_TYPE:-g2-standard-8}"
NUM_WORKERS="${NUM_WORKERS:-1}"
MAX_NUM_WORKERS="${MAX_NUM_WORKERS:-4}"
JOB_NAME="${JOB_NAME:-didpo-round-${ROUND}-$(date -u +%Y%m%d-%H%M%S)}"
TEMPLATE_PATH="${TEMPLATE_PATH:-${BUCKET%/}/templates/didpo.json}"
BUILDER="${BUILDER:-docker}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}"
EXTRAS="${EXTRAS:-gpu}"
MODEL_DIR="${MODEL_DIR:-}"
PYTHON="${PYTHON:-python3}"
[[ "$ROUND" =~ ^[0-9]+$ ]] || die "ROUND must be a non-negative integer, got '$ROUND'"

build_image() {
  local dockerfile="workflows/dataflow/Dockerfile"
  local args=(--build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL}" --build-arg "EXTRAS=${EXTRAS}")
  case "$BUILDER" in
    docker)
      if [[ -n "$MODEL_DIR" ]]; then
        [[ -d "$MODEL_DIR" ]] || die "MODEL_DIR '$MODEL_DIR' is not a directory"
        args+=(--build-context "model=${MODEL_DIR}")
      fi
      (cd "$REPO_ROOT" && DOCKER_BUILDKIT=1 docker build -f "$dockerfile" -t "$IMAGE" "${args[@]}" .)
      docker push "$IMAGE"
      ;;
    cloudbuild)
      [[ -z "$MODEL_DIR" ]] || die "MODEL_DIR needs BUILDER=docker (Cloud Build only sees the uploaded source)"
      spec="$(mktemp)"
      trap 'rm -f "$spec"' EXIT
      # Cloud Build's docker step with BuildKit, so that Dockerfile.dockerignore and named stages apply.
      cat >"$spec" <<YAML
steps:
  - name: gcr.io/cloud-builders/docker
    env: ["DOCKER_BUILDKIT=1"]
    args: ["build", "-f", "${dockerfile}", "-t", "${IMAGE}",
           "--build-arg", "TORCH_INDEX_URL=${TORCH_INDEX_URL}", "--build-arg", "EXTRAS=${EXTRAS}", "."]
images: ["${IMAGE}"]
options:
  machineType: E2_HIGHCPU_32
timeout: 7200s
YAML
      gcloud builds submit "$REPO_ROOT" --project "$PROJECT" --region "$REGION" --config "$spec"
      ;;
    *) die "BUILDER must be docker or cloudbuild, got '$BUILDER'" ;;
  esac
}

build_template() {
  gcloud dataflow flex-template build "$TEMPLATE_PATH" \
    --project "$PROJECT" \
    --image "$IMAGE" \
    --sdk-language PYTHON \
    --metadata-file "$REPO_ROOT/workflows/dataflow/metadata.json"
}

run_template() {
  # '^~^' makes '~' the separator between parameters: values may hold ',', ';' and '='.
  local params="^~^config=/template/${CONFIG}~round=${ROUND}~sdk_container_image=${IMAGE}~set=run.root=${RUN_ROOT}"
  params+="~dataflow_service_options=worker_accelerator=${ACCELERATOR}~machine_type=${MACHINE_TYPE}"
  [[ -z "$CHECKPOINT" ]] || params+="~checkpoint=${CHECKPOINT}"
  gcloud dataflow flex-template run "$JOB_NAME" \
    --project "$PROJECT" \
    --region "$REGION" \
    --template-file-gcs-location "$TEMPLATE_PATH" \
    --staging-location "${BUCKET%/}/staging" \
    --temp-location "${BUCKET%/}/tmp" \
    --num-workers "$NUM_WORKERS" \
    --max-workers "$MAX_NUM_WORKERS" \
    --additional-experiments use_runner_v2 \
    --parameters "$params"
}

run_direct() {
  local args=(
    --config "$CONFIG" --round "$ROUND" --set "run.root=${RUN_ROOT}"
    --runner=DataflowRunner
    "--project=${PROJECT}" "--region=${REGION}" "--job_name=${JOB_NAME}"
    "--temp_location=${BUCKET%/}/tmp" "--staging_location=${BUCKET%/}/staging"
    "--sdk_container_image=${IMAGE}" --experiments=use_runner_v2
    "--dataflow_service_options=worker_accelerator=${ACCELERATOR}"
    "--machine_type=${MACHINE_TYPE}" "--num_workers=${NUM_WORKERS}" "--max_num_workers=${MAX_NUM_WORKERS}"
  )
  [[ -z "$CHECKPOINT" ]] || args+=(--checkpoint "$CHECKPOINT")
  (cd "$REPO_ROOT" && "$PYTHON" -m pipeline.run "${args[@]}")
}

case "$cmd" in
  image) build_image ;;
  template) build_template ;;
  run) run_template ;;
  direct) run_direct ;;
esac
