"""Advantage estimators with one signature (step 9 of `pipeline/credit/batch.py`).

Every estimator maps an `EstimatorBatch` (N rows of G trajectories of several tasks) to an
`EstimatorOutput`: one episode-level advantage per row and per-token advantages per row (before the loss
mask). The built-ins are registered in one place, `pipeline/credit/__init__.py`; register a new one with
`@register_estimator("name")` (a name can be registered once). Each declares
whether it reads the diff-level units (`needs_anchors`: only then are sub-diffs and anchors computed for it;
`needs_lines`: the line units of `lines.py`, likewise)
and its scope: "task" when a row's advantages depend only on rows of its own task group (so the batch can be
split by task, as the Beam credit stage does), "batch" when its task-relative advantages are then whitened
over the batch (`assign_advantages` does it; the Beam stage with a combine of one value per trajectory).

Notation: R_i episode return of trajectory i; G_task its task group; R_t return-to-go of a row;
norm(.) the group-relative advantage of `advantages.group_center` (mean_norm or mean_std_norm).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from pipeline.credit.advantages import group_center, trajectory_table

if TYPE_CHECKING:
    from pipeline.credit.lines import LineUnits
    from pipeline.credit.settings import CreditSettings


@dataclass(frozen=True)
class EstimatorBatch:
    """Inputs of an estimator; N rows, G trajectories."""

    task_index: np.ndarray  # [N] int: task group of the row
    traj_index: np.ndarray  # [N] int in 0..G-1: trajectory of the row
    state_index: np.ndarray  # [N] int: identical-workspace group (same task, same workspace_hash_before)
    episode_return: np.ndarray  # [N] float: R_i of the row's trajectory
    return_to_go: np.ndarray  # [N] float: R_t of the row
    n_tokens: np.ndarray  # [N] int: response tokens T_n of each row
    diff_advantage: list[np.ndarray]  # N arrays [T_n]: projected A^D per token (0 where not covered)
    # For estimators that model the step's outcome themselves (didpo_did); empty defaults keep other callers
    # unchanged.
    turn: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [N] int: 0-based turn
    visible_pass_fraction: np.ndarray = field(
        default_factory=lambda: np.zeros(0)
    )  # [N] float in [0, 1] after the step; NaN = unknown
    line_units: LineUnits | None = None  # for estimators that model line units (didpo_did): lines.LineUnits


@dataclass(frozen=True)
class EstimatorOutput:
    episode_advantage: np.ndarray  # [N] float
    token_advantages: list[np.ndarray]  # N arrays [T_n] float, before the loss mask


Estimator = Callable[[EstimatorBatch, "CreditSettings"], EstimatorOutput]


Scope = Literal["task", "batch"]


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    fn: Estimator
    needs_anchors: bool  # reads the diff-level units (diff_advantage, anchors); none are computed otherwise
    scope: Scope  # "task": a row's advantages depend on its task group only; "batch": then whitened over the batch
    needs_lines: bool = False  # reads the line units (line_units); computed only for such an estimator


ESTIMATORS: dict[str, EstimatorSpec] = {}


def register_estimator(name: str, needs_anchors: bool = False, scope: Scope = "task", needs_lines: bool = False
                       ) -> Callable[[Estimator], Estimator]:
    """Decorator adding an estimator to ESTIMATORS; a duplicate name is refused."""

    def add(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(
                f"estimator {name!r} is already registered (by {ESTIMATORS[name].fn.__qualname__})"
            )
        ESTIMATORS[name] = EstimatorSpec(name, fn, needs_anchors, scope, needs_lines)
        return fn

    return add


def get_estimator(name: str) -> EstimatorSpec:
    if name not in ESTIMATORS:
        raise KeyError(f"unknown estimator {name!r}; registered: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def episode_advantage(batch: EstimatorBatch, mode: str, eps: float) -> np.ndarray:
    """[N] A^E per row: norm(R_i) over the trajectories of the task (each trajectory counted once)."""
    traj_task, traj_return = trajectory_table(batch.traj_index, batch.task_index, batch.episode_return)
    return group_center(traj_return, traj_task, mode, eps)[batch.traj_index]


def _broadcast(batch: EstimatorBatch, per_row: np.ndarray) -> EstimatorOutput:
    tokens = [np.full(int(t), float(v)) for t, v in zip(batch.n_tokens, per_row, strict=True)]
    return EstimatorOutput(np.asarray(per_row, np.float64), tokens)


def grpo(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """GRPO: A_i = (R_i - mean_{G_task} R) / (std_{G_task} R + eps) on every token of trajectory i. [N] -> N x [T_n]."""
    return _broadcast(batch, episode_advantage(batch, "mean_std_norm", settings.std_eps))


def dr_grpo(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """Dr. GRPO: A_i = R_i - mean_{G_task} R (no std division) on every token of trajectory i."""
    return _broadcast(batch, episode_advantage(batch, "mean_norm", settings.std_eps))


def rloo(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """RLOO: A_i = R_i - mean_{j in G_task, j != i} R_j = |G|/(|G|-1) * (R_i - mean_G R); 0 when |G| = 1."""
    traj_task, traj_return = trajectory_table(batch.traj_index, batch.task_index, batch.episode_return)
    size = np.bincount(traj_task)[traj_task].astype(np.float64)
    centered = group_center(traj_return, traj_task, "mean_norm")
    scale = np.where(size > 1, size / np.maximum(size - 1, 1), 0.0)
    return _broadcast(batch, (centered * scale)[batch.traj_index])


def reinforce_pp_baseline(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """REINFORCE++ with baseline: a_i = R_i - mean_{G_task} R here; its batch scope then whitens it over all
    trajectories of the batch: A_i = (a_i - mean_batch a) / (std_batch a + eps)."""
    traj_task, traj_return = trajectory_table(batch.traj_index, batch.task_index, batch.episode_return)
    return _broadcast(batch, group_center(traj_return, traj_task, "mean_norm")[batch.traj_index])


def gigpo(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """GiGPO: A_t = A^E_i + omega * A^S_t, with A^E_i = norm(R_i) over G_task and
    A^S_t = norm(R_t) over the rows of the task whose workspace before the step is identical (anchor states);
    a state seen once gets A^S = 0. norm = settings.adv_norm."""
    a_e = episode_advantage(batch, settings.adv_norm, settings.std_eps)
    a_s = group_center(batch.return_to_go, batch.state_index, settings.adv_norm, settings.std_eps)
    return _broadcast(batch, a_e + settings.gigpo_omega * a_s)


def didpo(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """DiDPO: token_adv = A^E_i + lambda * A^D(token), A^E_i = norm(R_i) over G_task, A^D(token) = the
    projected diff advantage of the covering anchor occurrence with the highest GS (0 outside anchors).
    With lambda = 0 this is the episode-level estimator (dr_grpo for mean_norm, grpo for mean_std_norm)."""
    a_e = episode_advantage(batch, settings.adv_norm, settings.std_eps)
    tokens = [float(a) + settings.lam * d for a, d in zip(a_e, batch.diff_advantage, strict=True)]
    return EstimatorOutput(a_e, [np.asarray(t, np.float64) for t in tokens])


def didpo_flipped(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """A control whose diff-level credit is deliberately wrong: A^E_i - lambda * A^D(token), DiDPO with the
    sign of every anchor's advantage reversed, so a change that helped is pushed down inside its action and
    one that hurt is pushed up. A comparison of estimators must rank it below didpo; if it cannot, the
    testbed cannot tell diff-level credit from noise."""
    return didpo(batch, settings.model_copy(update={"lam": -settings.lam}))
