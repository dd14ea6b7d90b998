# The README's commands. Each one sets itself up from nothing on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-stamp
TORCH := torch==2.13.0
FLASH_ATTN := flash-attn==2.8.3
# Nothing is ever fetched from a model or data hub at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONHASHSEED := 0
# One torch thread: on a 2-core box the sandbox workers need the other core; two threads run 5-25x slower.
export OMP_NUM_THREADS := 1

.PHONY: setup demo test bench lint clean

setup: $(STAMP)

# Re-runs only when the pinned requirements change; a second `make setup` is a no-op.
$(STAMP): pyproject.toml
	@command -v bwrap >/dev/null || { echo "installing bubblewrap (sandbox)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
	# headless Chromium runs the `didpo explore` page's JS in its tests; without it they skip, setup goes on
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { echo "installing chromium (explore page tests)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "WARNING: chromium could not be installed: the browser tests of tests/workflows/test_explore.py will SKIP"; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and on its own: the CPU wheel; a plain requirement would pull a CUDA build
	$(PIP) install -q $(TORCH)
	# flash-attn's Python side only (no CUDA build) so openrlhf imports on CPU; see DEVELOPERS.md
	$(PY) -c "import importlib.metadata as m; m.version('flash-attn')" 2>/dev/null || FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE \
	  $(PIP) install -q --no-build-isolation --no-deps $(FLASH_ATTN)
	$(PIP) install -q -e ".[train,dev]"
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/didpo demo --config configs/local.yaml

test: setup
	$(PY) -m pytest -q

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: setup
	$(VENV)/bin/ruff check pipeline training workflows tests benchmarks

clean:
	rm -rf $(VENV) runs build *.egg-info
