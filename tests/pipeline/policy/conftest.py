"""Shared fixtures of the policy tests: a tiny checkpoint built once per session, offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.policy.tiny import CheckpointInfo, build_checkpoint

REPO = Path(__file__).resolve().parents[3]

# Fixed texts with the cases a tokenizer for code must not mangle, added to the repo's own sources.
_EDGE_TEXTS = (
    "def f(x):\n\treturn x  \n\n\n",
    "class A:\r\n    pass\r\n",
    "# héllo wörld, naïve café, 日本語のコメント, emoji 😀🎉\n",
    "s = 'tab\\there'  # trailing spaces   \n",
)


@pytest.fixture(scope="session")
def policy_corpus() -> tuple[str, ...]:
    """The repository's own Python sources (sorted, so the corpus is stable) plus edge-case texts."""
    sources = sorted(p for d in ("pipeline", "training", "workflows") for p in (REPO / d).rglob("*.py"))
    return tuple(p.read_text(encoding="utf-8") for p in sources) + _EDGE_TEXTS


@pytest.fixture(scope="session", autouse=True)
def _offline_one_thread():
    """No hub access and one torch thread (the test machine is shared)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, policy_corpus) -> CheckpointInfo:
    """A "tiny" checkpoint (seed 0) built from `policy_corpus`; read-only for the tests."""
    return build_checkpoint(
        tmp_path_factory.mktemp("policy") / "tiny", size="tiny", corpus=policy_corpus, seed=0
    )
