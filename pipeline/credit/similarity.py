"""Near-duplicate discovery: MinHash signatures of token shingles, LSH banding, exact verification.

Signatures are computed for all texts of a batch at once with numpy (multiply-shift permutation hashing of
64-bit shingle hashes, min-reduced per text), then cut into LSH bands (`band_buckets`: b bands of r values,
a text's bucket in a band is its values there); texts that share a bucket in any band are candidates of
each other. Clustering is leader-based, without transitive chaining, per (task, edit type) group: texts are
visited in a content-defined order; each joins the most similar existing representative among its
candidates whose exact shingle Jaccard similarity is >= eta, or becomes a representative itself. Every
member is thus within eta of its representative; the cost is one bucket look-up per band and text
(near-linear in candidates).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from pipeline.credit.normalize import token_hashes

_SENTINEL = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_CHUNK_SHINGLES = 1 << 15


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


def band_buckets(signatures: np.ndarray, lsh_threshold: float) -> np.ndarray:
    """[U, b] LSH bucket of each text in each band: the [U, num_perm] signatures cut into b bands of r values
    ((b, r) = `lsh_params` at the threshold); two texts share a band's bucket iff their values there are equal
    (the candidates a banded MinHash LSH index, such as datasketch's, returns)."""
    n, num_perm = signatures.shape
    bands, rows = lsh_params(round(lsh_threshold, 3), num_perm)
    out = np.empty((n, bands), np.int64)
    for j in range(bands):
        inverse = np.unique(signatures[:, j * rows : (j + 1) * rows], axis=0, return_inverse=True)[1]
        out[:, j] = inverse.reshape(-1)
    return out


def cluster_texts(
    order: Sequence[int], buckets: np.ndarray, shingles: ShingleSets, eta: float
) -> dict[int, int]:
    """Leader clustering of the texts `order` (visited in that order): text index -> representative index.

    A text is compared (exact Jaccard) with the representatives that share an LSH bucket with it (`buckets`,
    from `band_buckets`)."""
    rep_of: dict[int, int] = {}
    reps_in: dict[tuple[int, int], list[int]] = defaultdict(list)  # (band, bucket) -> representatives
    for i in order:
        keys = list(enumerate(buckets[i].tolist()))
        best, best_sim = -1, -1.0
        for rep in {r for key in keys for r in reps_in.get(key, ())}:
            sim = shingles.jaccard(i, rep)
            if sim >= eta and (sim > best_sim or (sim == best_sim and rep < best)):
                best, best_sim = rep, sim
        if best < 0:
            rep_of[i] = i
            for key in keys:
                reps_in[key].append(i)
        else:
            rep_of[i] = best
    return rep_of
