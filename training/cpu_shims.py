"""The one place where the CPU build of the environment is patched, and why.

OpenRLHF 0.11.2 imports `flash_attn` at module level (ring attention, packing helpers). On a CPU machine
flash-attn is installed without its CUDA extension (`FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE`, see Makefile), so
`import flash_attn` fails on `import flash_attn_2_cuda`. When CUDA is absent we register an empty module under
that name: the Python side of flash-attn then imports, and any real call into a CUDA kernel still fails loudly
(`AttributeError` on the empty module) instead of silently computing something else. On a GPU machine with a
real flash-attn build this function does nothing.

DeepSpeed's CPU accelerator also JIT-compiles a shared-memory all-reduce op (C++ through ninja) inside every
`deepspeed.initialize`. Our updates never call it (one process, or torch.distributed's gloo for several), the
compile costs a fresh machine a minute, and a run killed while it compiles leaves torch's lock file behind, on
which every later update then waits forever. `skip_cpu_shm_comm` marks the op unavailable, so DeepSpeed skips it.
"""

from __future__ import annotations

import importlib.util
import sys
import types

_SHIM_NAME = "flash_attn_2_cuda"


def install_cpu_shims() -> bool:
    """Register the empty `flash_attn_2_cuda` module when no CUDA build is importable. Returns True if it did."""
    if _SHIM_NAME in sys.modules or importlib.util.find_spec(_SHIM_NAME) is not None:
        return False
    import torch

    if torch.cuda.is_available():
        return False  # a GPU without the compiled extension is a broken install: let the import error show
    shim = types.ModuleType(_SHIM_NAME)
    shim.__doc__ = "empty stand-in registered by training.cpu_shims on a machine without CUDA"
    sys.modules[_SHIM_NAME] = shim
    return True


def skip_cpu_shm_comm() -> bool:
    """Mark DeepSpeed's CPU shared-memory comm op unavailable (CPU accelerator only). Returns True if it did."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return False
    builder = accelerator.create_op_builder("ShareMemCommBuilder")
    if builder is None:
        return False
    deepspeed.ops.__compatible_ops__[builder.NAME] = False
    return True


def import_openrlhf_models() -> types.ModuleType:
    """`openrlhf.models`, importable on CPU and GPU alike."""
    install_cpu_shims()
    import openrlhf.models

    return openrlhf.models
