"""Per-batch diagnostics of the credit stage and a small phase timer."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field


@dataclass
class Diagnostics:
    """What one `compute_credit` call saw and did."""

    n_rows: int = 0  # steps in the batch
    n_tasks: int = 0  # task groups
    n_trajectories: int = 0
    n_hunks: int = 0  # hunks of whole diffs (after dropping exact repeats)
    n_repeated_hunks: int = 0  # hunks dropped as exact repeats of an earlier change in the trajectory
    n_candidates: int = 0  # sub-diff candidates, all scales
    n_unique_texts: int = 0  # distinct normalized candidate texts per (task, edit type)
    n_clusters: int = 0  # candidate anchors (near-duplicate clusters)
    n_anchors: int = 0  # anchors kept after selection, the cut and the n >= 2 rule
    mean_group_size: float = 0.0  # mean distinct rows per kept anchor
    singleton_rate: float = 0.0  # share of clusters made by a single row
    n_changed_tokens: int = 0  # response tokens that wrote an added line or the search text of a deleted one
    n_diff_tokens: int = 0  # of those, tokens that received a diff-level advantage
    coverage: float = 0.0  # n_diff_tokens / n_changed_tokens (0 when nothing changed)
    line_coverage: float = 0.0  # line-unit estimators: changed tokens whose change switched a unit
    caps: dict[str, int] = field(default_factory=dict)  # what the documented caps cut off, by cap name
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase

    def to_dict(self) -> dict:
        return asdict(self)


class PhaseTimer:
    """Accumulates wall time per named phase into a dict."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.into[name] = self.into.get(name, 0.0) + time.perf_counter() - start
