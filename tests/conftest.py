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
