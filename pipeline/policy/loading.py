"""Load a policy checkpoint from a local directory, never from the hub.

The same code loads a checkpoint built by `didpo model init` and a downloaded Qwen2.5-Coder directory:
both are plain Hugging Face checkpoints read with `from_pretrained(..., local_files_only=True)`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch/transformers load lazily: importing this module stays cheap
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = ("float32", "bfloat16", "float16")

# Each entry is satisfied by any one of its alternatives (single-file or sharded weights, fast tokenizer
# file or the vocab/merges pair that transformers converts).
_MODEL_FILES = (("config.json",), ("model.safetensors", "model.safetensors.index.json"))
_TOKENIZER_FILES = (("tokenizer_config.json",), ("tokenizer.json", "vocab.json"))


class CheckpointError(FileNotFoundError):
    """A path that is not a usable local checkpoint directory."""


def _check_dir(path: str | os.PathLike[str], required: tuple[tuple[str, ...], ...], what: str) -> Path:
    root = Path(path)
    hint = f"build one with `didpo model init --out {root}` or point the config at a local {what} directory"
    if not root.exists():
        raise CheckpointError(f"{what} directory {root} does not exist ({hint})")
    if not root.is_dir():
        raise CheckpointError(f"{what} path {root} is not a directory ({hint})")
    for alternatives in required:
        if not any((root / name).is_file() for name in alternatives):
            raise CheckpointError(f"{what} directory {root} lacks {' or '.join(alternatives)} ({hint})")
    return root


def check_checkpoint(path: str | os.PathLike[str]) -> Path:
    """Return `path` as a Path if it holds a model and its tokenizer; else raise CheckpointError naming the file."""
    root = _check_dir(path, _MODEL_FILES, "checkpoint")
    return _check_dir(root, _TOKENIZER_FILES, "checkpoint")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A dtype name ("float32", "bfloat16", "float16") or a torch.dtype -> torch.dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported: use one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def load_policy(
    path: str | os.PathLike[str], *, dtype: str | torch.dtype = "float32", device: str = "cpu"
) -> PreTrainedModel:
    """The causal LM in `path`, in eval mode, with weights in `dtype` on `device`."""
    from transformers import AutoModelForCausalLM

    root = _check_dir(path, _MODEL_FILES, "checkpoint")
    model = AutoModelForCausalLM.from_pretrained(root, local_files_only=True, dtype=resolve_dtype(dtype))
    return model.to(device).eval()


def load_tokenizer(path: str | os.PathLike[str], *, padding_side: str = "left") -> PreTrainedTokenizerBase:
    """The fast tokenizer in `path`, padding on the left by default (prompts end where generation starts).

    A tokenizer without a pad token pads with its eos token (attention masks keep padding out of the model).
    """
    from transformers import AutoTokenizer

    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side {padding_side!r}: use 'left' (generation) or 'right' (training)")
    root = _check_dir(path, _TOKENIZER_FILES, "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(root, local_files_only=True)
    if not tokenizer.is_fast:
        raise CheckpointError(
            f"tokenizer in {root} has no fast backend: character offsets need tokenizer.json"
        )
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise CheckpointError(f"tokenizer in {root} has neither a pad nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def checkpoint_parameters(path: str | os.PathLike[str]) -> int:
    """Number of parameters stored in a checkpoint's safetensors files, read from their headers only.

    Tied matrices are stored once, so this equals the model's unique parameter count.
    """
    import json

    from safetensors import safe_open

    root = _check_dir(path, _MODEL_FILES, "checkpoint")
    index = root / "model.safetensors.index.json"
    shards = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else ["model.safetensors"]
    )
    total = 0
    for shard in shards:
        with safe_open(root / shard, framework="np") as f:
            for name in f.keys():
                n = 1
                for dim in f.get_slice(name).get_shape():
                    n *= dim
                total += n
    return total
