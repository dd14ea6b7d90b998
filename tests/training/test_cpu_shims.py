"""OpenRLHF's model classes import on a CPU machine through the one documented shim."""

from __future__ import annotations

import sys

import pytest
import torch

from training.cpu_shims import import_openrlhf_models, install_cpu_shims


def test_openrlhf_models_import_on_cpu():
    torch.set_num_threads(1)
    models = import_openrlhf_models()
    assert models.Actor.__name__ == "Actor"
    assert models.PolicyLoss.__name__ == "PolicyLoss"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the shim only applies without CUDA")
def test_shim_is_empty_and_idempotent():
    install_cpu_shims()
    shim = sys.modules["flash_attn_2_cuda"]
    assert install_cpu_shims() is False  # second call changes nothing
    with pytest.raises(AttributeError):
        _ = shim.fwd  # a real CUDA kernel call fails loudly instead of computing something else


def test_deepspeed_skips_its_cpu_shm_op_so_a_stale_build_lock_cannot_hang_an_update(tmp_path, monkeypatch):
    from deepspeed.comm.torch import build_shm_op

    from training.cpu_shims import skip_cpu_shm_comm

    # A run killed mid-compile leaves this lock: torch would wait on it forever if DeepSpeed tried the build.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "lock").touch()

    def waits_forever(self):
        raise AssertionError("DeepSpeed waited on the shm op's build lock")

    monkeypatch.setattr("torch.utils.file_baton.FileBaton.wait", waits_forever)
    assert skip_cpu_shm_comm()
    assert build_shm_op() is None
