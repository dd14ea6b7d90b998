#!/usr/bin/env bash
# Run ON a lent GPU machine, in the checkout's copy (docs/pretraining.md, "On a GPU"): pretrains the `medium`
# base (27M parameters) with the default recipe on the GPU in bfloat16 and measures its held-out copying, the
# same `didpo model pretrain` as on CPU, then leaves pretrain_report.json (settings, each stage's losses, the
# held-out abilities) and the log in $OUT (or runs/device/ without one), and the base itself in 15 MB parts
# where it fits what a call hands back (`small_deep`, 29 MB, does; `medium`, 108 MB, stays there). Extra
# arguments go to the command: a `--set` of them wins over the script's (`--set pretrain.size=small_deep`);
# a `--config` file's values sit under every `--set`.
# First, here: scripts/device_wheels.sh; the call carries .whl.
#   run(command="bash scripts/device_pretrain.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-runs/device}"
BUDGET_S="${BUDGET_S:-560}"  # under the call's 600 s, so that what finished still comes back
WHEELS="${WHEELS:-.whl}"
mkdir -p "$OUT_DIR"
if [ -d "$WHEELS" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || { echo "device_pretrain: the carried wheels did not install" >&2; exit 1; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
WORK="${WORK:-/tmp/device-base}"
"$PY" -c "import torch; print('device_pretrain: torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
start=$(date +%s)
timeout "$BUDGET_S" "$PY" -m workflows.cli model pretrain --out "$WORK" --set pretrain.device=cuda \
  --set pretrain.size=medium --set pretrain.compute_dtype=bfloat16 "$@" 2>&1 | tee "$OUT_DIR/pretrain.log"
rc=${PIPESTATUS[0]}
echo "device_pretrain: exit $rc after $(( $(date +%s) - start )) s"
if [ -f "$WORK/final/pretrain_report.json" ]; then
  cp "$WORK/final/pretrain_report.json" "$OUT_DIR/"
  # the base itself where it fits what a call hands back (files of at most 16 MiB, 64 MiB in all): a
  # `small_deep` (29 MB) does, `medium` (108 MB) does not. Here: cat final.tar.part-* | tar -xf -
  size=$(du -sm "$WORK/final" | cut -f1)
  if [ "$size" -le "${HAND_BACK_MB:-56}" ]; then
    tar -C "$WORK" -cf - final | split -b 15M - "$OUT_DIR/final.tar.part-"
    echo "device_pretrain: the base ($size MB) is in $OUT_DIR/final.tar.part-*"
  else
    echo "device_pretrain: the base ($size MB) stays on this machine: more than a call hands back"
  fi
else  # cut short: each finished stage's report says how far it got
  for report in "$WORK"/stages/*/sft_report.json; do
    [ -f "$report" ] && cp "$report" "$OUT_DIR/$(basename "$(dirname "$report")")_sft_report.json"
  done
fi
exit "$rc"
