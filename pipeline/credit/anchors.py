"""Groupability score and anchor selection (step 6 of `pipeline/credit/batch.py`).

A candidate anchor is a cluster of near-duplicate sub-diff occurrences of one task and edit type. It is
worth grouping when its change is large enough to mean something (L, mean lines) and when enough distinct
rows (n) made it for a comparison of their returns.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def groupability(
    mean_lines: float, n_rows: int, s0: float = 8.0, g0: float = 8.0, form: str = "product"
) -> float:
    """GS of an anchor with n distinct rows and mean size L lines.

    product (DESIGN.md):  GS = (1 - exp(-L/s0)) * (1 - exp(-(n-1)/g0))
    log (ablation):       GS = log1p(L/s0) * log1p((n-1)/g0) / (1 + log1p(L/s0) * log1p((n-1)/g0))
    linear (ablation):    GS = min(1, L/s0) * min(1, (n-1)/g0)
    additive (ablation):  GS = ((1 - exp(-L/s0)) + (1 - exp(-(n-1)/g0))) / 2, 0 when n <= 1
    Every form is 0 for a singleton (n <= 1): nothing to compare against.
    """
    if n_rows <= 1 or mean_lines <= 0:
        return 0.0
    scope, mass = mean_lines / s0, (n_rows - 1) / g0
    if form == "product":
        return (1.0 - math.exp(-scope)) * (1.0 - math.exp(-mass))
    if form == "log":
        value = math.log1p(scope) * math.log1p(mass)
        return value / (1.0 + value)
    if form == "linear":
        return min(1.0, scope) * min(1.0, mass)
    if form == "additive":
        return ((1.0 - math.exp(-scope)) + (1.0 - math.exp(-mass))) / 2.0
    raise ValueError(f"unknown GS form {form!r}; allowed: product, log, linear, additive")


@dataclass
class Cluster:
    """A candidate anchor: occurrences (candidate indices) of near-duplicate texts of one task and edit type."""

    key: str  # content-defined tie-breaker (task, edit type, representative text)
    members: list[int]  # candidate indices, in canonical order
    gs: float = 0.0


def facility_location(
    clusters: Sequence[Cluster],
    unit_start: np.ndarray,
    unit_end: np.ndarray,
    n_units: int,
    max_anchors: int,
) -> list[int]:
    """Greedy facility location over the clusters of one task; returns the chosen cluster indices in order.

    Coverage is kept per changed line (unit) u: cov[u] = the largest GS of a chosen anchor covering u. The
    gain of cluster c is sum over its occurrences o of mean_{u in o} (max(cov[u], GS_c) - cov[u]), i.e.
    DESIGN.md's sum of max(cov, GS) - cov with an occurrence's coverage measured line by line. Gains only
    shrink as anchors are chosen (submodular), so a lazy heap finds the same picks as a full rescan.
    unit_start/unit_end: [C] per candidate, the half-open unit range it covers.
    """
    cov = np.zeros(n_units, np.float64)
    units, weights = [], []
    for cluster in clusters:
        lengths = unit_end[cluster.members] - unit_start[cluster.members]
        idx = np.concatenate([np.arange(unit_start[m], unit_end[m]) for m in cluster.members])
        units.append(idx)
        weights.append(np.repeat(1.0 / lengths, lengths))

    def gain(c: int) -> float:
        current = cov[units[c]]
        return float(np.dot(np.maximum(current, clusters[c].gs) - current, weights[c]))

    heap = [(-gain(c), clusters[c].key, c) for c in range(len(clusters)) if clusters[c].gs > 0]
    heapq.heapify(heap)
    chosen: list[int] = []
    while heap and len(chosen) < max_anchors:
        _, key, c = heapq.heappop(heap)
        fresh = gain(c)
        if fresh <= 1e-12:
            continue
        if heap and fresh < -heap[0][0] - 1e-15:
            heapq.heappush(heap, (-fresh, key, c))  # stale: another cluster may now gain more
            continue
        chosen.append(c)
        np.maximum.at(cov, units[c], clusters[c].gs)
    return chosen


def cut_overlaps(
    chosen: Sequence[Cluster],
    unit_start: np.ndarray,
    unit_end: np.ndarray,
    n_units: int,
) -> list[list[int]]:
    """Per-diff non-overlap cut: the kept occurrences (candidate indices) of each chosen cluster.

    Occurrences are visited by higher GS first, then longer span, then content key; one is kept when none of
    its changed lines is already taken. Units are global per hunk side, so "no shared unit" is "no overlap
    within one diff". An anchor may keep several occurrences in one row (the same change made in two places).
    """
    order = sorted(
        ((ci, m) for ci, cluster in enumerate(chosen) for m in cluster.members),
        key=lambda cm: (-chosen[cm[0]].gs, -(unit_end[cm[1]] - unit_start[cm[1]]), chosen[cm[0]].key, cm[1]),
    )
    taken = np.zeros(n_units, bool)
    kept: list[list[int]] = [[] for _ in chosen]
    for ci, m in order:
        s, e = unit_start[m], unit_end[m]
        if taken[s:e].any():
            continue
        taken[s:e] = True
        kept[ci].append(m)
    return kept
