"""Fixtures of the credit tests over the shared builders (tests/lib/builders.py): a tiny action markup and a
regex tokenizer with offsets."""

from __future__ import annotations

import builders
import pytest


@pytest.fixture
def same_function_batch():
    """Four single-step rollouts of one task, episode rewards [1, 1, 0, 0], all writing FUNCTION."""
    return builders.same_function_batch()


@pytest.fixture
def fast_tokenizer():
    return builders.line_offsets


@pytest.fixture
def make_step():
    """The `build_step` builder."""
    return builders.build_step


@pytest.fixture
def function_src():
    return builders.FUNCTION


@pytest.fixture
def tokenize_offsets():
    return builders.offsets
