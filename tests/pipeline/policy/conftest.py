"""Shared fixtures of the policy tests: a tiny checkpoint built once per session, offline."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from pipeline.policy.loading import load_policy, load_tokenizer
from pipeline.policy.tiny import CheckpointInfo, build_checkpoint

# Code the project does not edit: with the repository's own sources, every source edit changed the tiny
# model, and numerical tolerances held for some of those models and not for others.
_STDLIB_MODULES = (
    "argparse.py", "bisect.py", "csv.py", "dataclasses.py", "difflib.py", "fractions.py", "functools.py",
    "heapq.py", "json/__init__.py", "json/decoder.py", "json/encoder.py", "shlex.py", "string.py",
    "textwrap.py",
)

# Fixed texts with the cases a tokenizer for code must not mangle, added to the repo's own sources.
_EDGE_TEXTS = (
    "def f(x):\n\treturn x  \n\n\n",
    "class A:\r\n    pass\r\n",
    "# héllo wörld, naïve café, 日本語のコメント, emoji 😀🎉\n",
    "s = 'tab\\there'  # trailing spaces   \n",
)


@pytest.fixture(scope="session")
def policy_corpus() -> tuple[str, ...]:
    """Fixed Python sources from the interpreter's standard library plus edge-case texts."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return tuple((stdlib / name).read_text(encoding="utf-8") for name in _STDLIB_MODULES) + _EDGE_TEXTS


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


@pytest.fixture(scope="module")
def tok(tiny_checkpoint):
    """The tiny checkpoint's tokenizer, loaded once per test module."""
    return load_tokenizer(tiny_checkpoint.path)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    """The tiny checkpoint's model, loaded once per test module (a module may change it)."""
    return load_policy(tiny_checkpoint.path)
