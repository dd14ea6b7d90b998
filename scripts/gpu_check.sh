#!/usr/bin/env bash
# GPU acceptance check (benchmarks/gpu_check.py): the tiny policy through vLLM generation, a ZeRO-2 update on one
# GPU and data parallel over all of them, and two steps of online mode; one table. After `make setup` with the
# gpu extra. `--cpu` runs the same commands on the CPU backends (how CI checks it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-.venv/bin/python}"
exec "$PY" benchmarks/gpu_check.py "$@"
