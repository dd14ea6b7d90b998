"""Group-relative advantages (steps 7 and 9 of `pipeline/credit/batch.py`)."""

from __future__ import annotations

import numpy as np

NORM_MODES = ("mean_norm", "mean_std_norm")


def group_center(values: np.ndarray, groups: np.ndarray, mode: str, eps: float = 1e-6) -> np.ndarray:
    """Advantage of each value within its group.

    values: [M] float; groups: [M] int group index (0..G-1, gaps allowed).
    mean_norm:      a_i = v_i - mean_{g(i)} v
    mean_std_norm:  a_i = (v_i - mean_{g(i)} v) / (std_{g(i)} v + eps), population std (ddof = 0)
    Returns [M] float64; a group of one gets 0.
    """
    if mode not in NORM_MODES:
        raise ValueError(f"unknown advantage normalization {mode!r}; allowed: {NORM_MODES}")
    values = np.asarray(values, np.float64)
    if values.size == 0:
        return values.copy()
    counts = np.bincount(groups).astype(np.float64)
    safe = np.maximum(counts, 1.0)
    mean = np.bincount(groups, weights=values) / safe
    centered = values - mean[groups]
    if mode == "mean_norm":
        return centered
    std = np.sqrt(np.bincount(groups, weights=centered * centered) / safe)
    return centered / (std[groups] + eps)


def trajectory_table(traj: np.ndarray, task: np.ndarray, episode_return: np.ndarray):
    """Per-trajectory (task index [G], episode return [G]) from per-row arrays ([N] each; traj in 0..G-1)."""
    n_traj = int(traj.max()) + 1 if len(traj) else 0
    traj_task = np.zeros(n_traj, np.int64)
    traj_return = np.zeros(n_traj, np.float64)
    traj_task[traj] = task
    traj_return[traj] = episode_return
    return traj_task, traj_return


def whiten(values: np.ndarray, mean: float, std: float, eps: float) -> np.ndarray:
    """(values - mean) / (std + eps): a batch-scoped estimator's last step, with the batch's statistics of one
    value per trajectory (`trajectory_moments`), however the batch was split to compute them."""
    return (np.asarray(values, np.float64) - mean) / (std + eps)


def moments_stats(count: float, total: float, squares: float) -> tuple[float, float]:
    """(mean, population std) from (count, sum, sum of squares); (0, 0) for nothing."""
    if count <= 0:
        return 0.0, 0.0
    mean = total / count
    return mean, float(np.sqrt(max(squares / count - mean * mean, 0.0)))
