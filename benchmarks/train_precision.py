"""Training speed in float32 and under bfloat16 autocast (`sft.compute_dtype`, `pretrain.compute_dtype`).

One optimizer step of the SFT loop's own loss (`training.sft.sft_loss`: forward, float32 loss on the response
tokens, backward, AdamW) on a pretraining-sized batch (8 rows of 512 tokens, the 4,096-token budget) for each
size preset that trains on CPU. Reported per preset: the median seconds per step over `--repeats` timed steps
after two warm-up steps, tokens/s, the speedup of bfloat16 over float32, and how far the first batch's loss
moves (same weights, same batch). The speedup needs a CPU with AVX512-BF16 or AMX (`lscpu`); without them
bfloat16 can be slower. Target: bfloat16 >= 1.3x float32 for `small` on such a CPU.

Run: `.venv/bin/python benchmarks/train_precision.py [--threads 1] [--repeats 5] [--sizes base,small,small_wide]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def batch_of(rows: int, length: int, vocab: int, seed: int = 0):
    """A right-padded batch of random ordinary tokens: the first quarter of each row is prompt, the rest trained."""
    from training.data import TrainRow, collate

    rng = np.random.default_rng(seed)
    prompt = length // 4
    out = []
    for i in range(rows):
        ids = rng.integers(16, vocab, size=length)
        r = length - prompt
        out.append(TrainRow(f"r{i}", "t", "t", ids[:prompt], ids[prompt:], np.ones(r, np.float32),
                            np.ones(r, np.float32), np.zeros(r, np.float32)))
    return collate(out, list(range(rows)), pad_id=0)


def time_steps(size: str, compute_dtype: str, batch, repeats: int) -> tuple[float, float]:
    """(median seconds per optimizer step, loss of the first step) for one preset and precision."""
    import torch
    from transformers import Qwen2ForCausalLM

    from pipeline.policy.tiny import SIZES, SPECIAL_TOKENS, qwen2_config
    from training.sft import sft_loss

    torch.manual_seed(0)
    preset = SIZES[size]
    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}  # our tokenizers train them first
    model = Qwen2ForCausalLM(qwen2_config(preset, preset.vocab_size, ids))
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    loss_fn = sft_loss(model, compute_dtype)
    times, first = [], None
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        loss, _ = loss_fn(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        first = float(loss.detach()) if first is None else first
    return statistics.median(times[2:]), first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="base,small,small_wide")
    args = ap.parse_args()
    import torch

    from pipeline.policy.tiny import SIZES

    torch.set_num_threads(args.threads)
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"train_precision: unknown size {unknown[0]!r}: choose from {', '.join(SIZES)}")
    rows, length = 8, 512
    print(f"train_precision: {args.threads} thread(s), batch {rows} x {length} tokens, median of {args.repeats}")
    print("| preset | float32 s/step | bfloat16 s/step | float32 tok/s | bfloat16 tok/s | speedup | first loss "
          "float32 / bfloat16 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        batch = batch_of(rows, length, SIZES[size].vocab_size)
        full, loss_full = time_steps(size, "float32", batch, args.repeats)
        half, loss_half = time_steps(size, "bfloat16", batch, args.repeats)
        tokens = rows * length
        print(f"| {size} | {full:.3f} | {half:.3f} | {tokens / full:,.0f} | {tokens / half:,.0f} | "
              f"{full / half:.2f}x | {loss_full:.4f} / {loss_half:.4f} |", flush=True)


if __name__ == "__main__":
    main()
