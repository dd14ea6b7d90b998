#!/usr/bin/env bash
# Run HERE, before a lent GPU machine's call (docs/pretraining.md, "On a GPU"): downloads into .whl/ (ignored by
# git; name it in the call's `carry`) the Python 3.12 x86-64 wheels of what `didpo model pretrain` needs and
# that machine's image lacks or holds at another version, each at the version this checkout's .venv pins.
# The image holds torch, numpy, pyarrow, typer, PyYAML, safetensors, huggingface_hub, fsspec; nothing can be
# fetched there. scripts/device_pretrain.sh installs them there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-.venv/bin/python}"
NEEDED=(pydantic pydantic_core annotated_types typing_inspection universal_pathlib pathlib_abc zstandard
        transformers tokenizers typer click)
pins=()
for name in "${NEEDED[@]}"; do
  version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") \
    || { echo "device_wheels: $name is not installed in $PY's environment (run make setup)" >&2; exit 1; }
  pins+=("$name==$version")
done
rm -rf .whl && mkdir .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${pins[@]}"
echo "device_wheels: $(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl: ${pins[*]}"
