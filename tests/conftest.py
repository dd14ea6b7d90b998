"""Suite-wide settings and the shared tiny policy (built once per session, offline, from the bundled tasks)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["DIDPO_PROGRESS"] = "0"
torch.set_num_threads(1)  # two threads on a 2-core box run 5-25x slower


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    """A "tiny" Qwen2 checkpoint with a tokenizer trained on the bundled tasks (the one `didpo model init`
    builds); read-only for the tests."""
    from pipeline.policy.tiny import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("tiny_policy") / "tiny", size="tiny", seed=0).path


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """The real fake-gcs-server on loopback, as `STORAGE_EMULATOR_HOST` (tests/lib/gcs_emulator.py); remote
    checkpoints and staging go to a session cache folder."""
    from gcs_emulator import fake_gcs_server

    os.environ["DIDPO_CACHE"] = str(tmp_path_factory.mktemp("didpo_cache"))
    with fake_gcs_server(tmp_path_factory.mktemp("gcs")) as url:
        yield url
    os.environ.pop("DIDPO_CACHE", None)


@pytest.fixture
def gcs_bucket(gcs_emulator, request):
    """A fresh, empty bucket on the emulator: `gs://<name>`."""
    import uuid

    from pipeline.storage import location

    name = f"didpo-{uuid.uuid4().hex[:12]}"
    bucket = location(f"gs://{name}")
    bucket.fs.mkdir(name)
    return f"gs://{name}"
