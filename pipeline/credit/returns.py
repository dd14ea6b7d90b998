"""Discounted returns of trajectories (step 2 of `pipeline/credit/batch.py`)."""

from __future__ import annotations

import numpy as np


def returns_to_go(rewards: np.ndarray, traj: np.ndarray, turn: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = sum_{k >= t} gamma^(k-t) r_k within each trajectory.

    rewards: [N] float step rewards r_t; traj: [N] int trajectory index; turn: [N] int turn (unique per traj).
    Returns [N] float64 in the input order.
    """
    order = np.lexsort((turn, traj))
    out = np.empty(len(rewards), np.float64)
    running, previous = 0.0, None
    for i in order[::-1]:
        if traj[i] != previous:
            running, previous = 0.0, traj[i]
        running = float(rewards[i]) + gamma * running
        out[i] = running
    return out


def episode_returns(rtg: np.ndarray, traj: np.ndarray, turn: np.ndarray) -> np.ndarray:
    """[N] R_episode of each row's trajectory = R_t at the trajectory's first turn."""
    order = np.lexsort((turn, traj))
    first = np.ones(len(order), bool)
    first[1:] = traj[order][1:] != traj[order][:-1]
    start_value = np.zeros(int(traj.max()) + 1 if len(traj) else 0, np.float64)
    start_value[traj[order][first]] = rtg[order][first]
    return start_value[traj]
