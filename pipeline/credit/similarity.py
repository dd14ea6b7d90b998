"""Near-duplicate discovery: MinHash signatures of token shingles, datasketch LSH, exact verification.

Signatures are computed for all texts of a batch at once with numpy (multiply-shift permutation hashing of
64-bit shingle hashes, min-reduced per text), then wrapped as datasketch `LeanMinHash` and indexed in a
`datasketch.MinHashLSH` per (task, edit type) group. Clustering is leader-based, without transitive
chaining: texts are visited in a content-defined order; each joins the most similar existing representative
whose exact shingle Jaccard similarity is >= eta, or becomes a representative itself. Every member is thus
within eta of its representative; the cost is one LSH query per text (near-linear in candidates).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from datasketch import LeanMinHash, MinHashLSH

from pipeline.credit.normalize import token_hashes

_SENTINEL = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_CHUNK_SHINGLES = 1 << 15
_SCHEME = "affine64"  # datasketch label for 64-bit affine permutation values; ours are of that family


class ShingleSets:
    """64-bit shingle hashes of many token sequences, stored flat: text i owns flat[offsets[i]:offsets[i+1]]."""

    def __init__(self, token_seqs: Sequence[tuple[str, ...]], shingle_size: int) -> None:
        k = shingle_size
        pad = [_SENTINEL] * (k - 1)
        chunks, starts, lengths = [], [], []
        position = 0
        for tokens in token_seqs:
            hashes = token_hashes(tokens) if tokens else np.array([_SENTINEL], np.uint64)
            chunks.append(hashes)
            chunks.append(np.array(pad, np.uint64))
            starts.append(position)
            lengths.append(max(1, len(hashes) - k + 1))  # a text shorter than k still has one shingle
            position += len(hashes) + k - 1
        flat = np.concatenate(chunks) if chunks else np.zeros(0, np.uint64)
        lengths_arr = np.asarray(lengths, np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths_arr)]).astype(np.int64)
        first = np.repeat(np.asarray(starts, np.int64), lengths_arr)
        local = np.arange(self.offsets[-1], dtype=np.int64) - np.repeat(self.offsets[:-1], lengths_arr)
        index = first + local  # flat position of each shingle's first token
        h = flat[index] if index.size else np.zeros(0, np.uint64)
        for j in range(1, k):
            h = h * _MIX + flat[index + j]
        h ^= h >> np.uint64(31)
        h *= _MIX2
        h ^= h >> np.uint64(29)
        self.flat = h
        self._sets: dict[int, frozenset[int]] = {}

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def set_of(self, i: int) -> frozenset[int]:
        cached = self._sets.get(i)
        if cached is None:
            cached = frozenset(self.flat[self.offsets[i] : self.offsets[i + 1]].tolist())
            self._sets[i] = cached
        return cached

    def jaccard(self, i: int, j: int) -> float:
        a, b = self.set_of(i), self.set_of(j)
        inter = len(a & b)
        return inter / (len(a) + len(b) - inter)


def minhash_signatures(shingles: ShingleSets, num_perm: int, seed: int) -> np.ndarray:
    """[U, num_perm] uint64 MinHash signatures: min over a text's shingles x of (a_p * x + b_p mod 2^64) >> 32."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 2**63, num_perm, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**63, num_perm, dtype=np.uint64)
    n = len(shingles)
    out = np.empty((n, num_perm), np.uint64)
    offsets = shingles.offsets
    lo = 0
    while lo < n:
        hi = int(np.searchsorted(offsets, offsets[lo] + _CHUNK_SHINGLES, side="right")) - 1
        hi = min(max(hi, lo + 1), n)
        x = shingles.flat[offsets[lo] : offsets[hi]]
        permuted = (x[:, None] * a[None, :] + b[None, :]) >> np.uint64(32)
        out[lo:hi] = np.minimum.reduceat(permuted, offsets[lo:hi] - offsets[lo], axis=0)
        lo = hi
    return out


def _false_rates(threshold: float, b: int, r: int) -> tuple[float, float]:
    s = np.linspace(0.0, 1.0, 401)
    p = 1.0 - (1.0 - s**r) ** b  # probability that a pair of similarity s becomes an LSH candidate
    below, above = s <= threshold, s >= threshold
    return float(np.trapezoid(p[below], s[below])), float(np.trapezoid(1.0 - p[above], s[above]))


@lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) with bands * rows <= num_perm minimizing false positives + false negatives at threshold."""
    best, best_err = (2, max(1, num_perm // 2)), float("inf")
    for b in range(2, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp, fn = _false_rates(threshold, b, r)
            if fp + fn < best_err:
                best, best_err = (b, r), fp + fn
    return best


def cluster_texts(
    order: Sequence[int],
    signatures: np.ndarray,
    shingles: ShingleSets,
    eta: float,
    lsh_threshold: float,
    seed: int,
) -> dict[int, int]:
    """Leader clustering of the texts `order` (visited in that order): text index -> representative index."""
    rep_of: dict[int, int] = {}
    if len(order) == 1:
        return {order[0]: order[0]}
    num_perm = signatures.shape[1]
    lsh = MinHashLSH(num_perm=num_perm, params=lsh_params(round(lsh_threshold, 3), num_perm))
    for i in order:
        sketch = LeanMinHash(seed=seed, hashvalues=signatures[i], scheme=_SCHEME)
        best, best_sim = -1, -1.0
        for rep in lsh.query(sketch):
            sim = shingles.jaccard(i, rep)
            if sim >= eta and (sim > best_sim or (sim == best_sim and rep < best)):
                best, best_sim = rep, sim
        if best < 0:
            rep_of[i] = i
            lsh.insert(i, sketch, check_duplication=False)
        else:
            rep_of[i] = best
    return rep_of
