"""`didpo_did`: each anchor's own effect, regression-adjusted for what co-occurs with it (docs/didpo_did.md).

The paper's A^D compares the return of the rows that contain an anchor with the mean over those rows; every
change bundled into the same action gets the same credit. Here, per task group:

1. Outcome per row y_i (settings.did_outcome): the step's change in visible pass fraction v_i - v_{i-1}
   (v_{-1} = 0: the task's unknown starting fraction is common to its rollouts and falls into the turn-0
   fixed effect), or R_t, or the trajectory's final step reward.
2. Design: D [n, p] indicators of which anchors (or units: anchors present in exactly the same rows) the row
   contains, and fixed effects F [n, q] (turn dummies; optionally trajectory dummies; or one intercept).
3. Ridge least squares, fixed effects unpenalized:
       min_{b, c} ||y - D b - F c||^2 + ridge * ||b||^2,
   solved in closed form (augmented least squares) per task: cost O(n (p + q)^2), linear in rows.
4. Standard errors from the ridge sandwich sigma^2 H^+ A'A H^+ with H = A'A + diag(penalty), A = [D F].
5. Token advantage = A^E + lambda * effect(anchor) on the tokens the anchor's occurrence covers (optionally
   shrunk by effect^2 / (effect^2 + se^2)); changed tokens outside anchors get A^E, or A^E + lambda * the
   row's residual / (1 + ridge) (a singleton estimate); other tokens get A^E.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.credit.estimators import EstimatorBatch, EstimatorOutput, episode_advantage, register_estimator

if TYPE_CHECKING:
    from pipeline.credit.settings import CreditSettings


@dataclass(frozen=True)
class DidFit:
    """Ridge fit of one task group."""

    effect: np.ndarray  # [p] per design column, in units of the outcome
    se: np.ndarray  # [p] standard error of each effect (ridge sandwich; 0 where nothing is left to estimate)
    residual: np.ndarray  # [n] y - fitted


def fit_effects(y: np.ndarray, design: np.ndarray, controls: np.ndarray, ridge: float) -> DidFit:
    """Ridge least squares with unpenalized controls: y [n], design D [n, p], controls F [n, q].

    Minimizes ||y - D b - F c||^2 + ridge ||b||^2 (minimum-norm solution where not identified, e.g. ridge 0
    with collinear columns) and returns b with its standard errors and the residuals.
    """
    n, p = design.shape
    a = np.hstack([design, controls])
    penalty = np.concatenate([np.full(p, float(ridge)), np.zeros(controls.shape[1])])
    augmented = np.vstack([a, np.diag(np.sqrt(penalty))])
    target = np.concatenate([y, np.zeros(len(penalty))])
    coef = np.linalg.lstsq(augmented, target, rcond=None)[0]
    residual = y - a @ coef
    gram = a.T @ a
    h_inv = np.linalg.pinv(gram + np.diag(penalty))
    dof = float(np.sum(h_inv * gram))  # tr(A H^+ A') = tr(H^+ A'A): effective parameters, no [n, n] matrix
    sigma2 = float(residual @ residual) / max(n - dof, 1.0)
    cov = sigma2 * (h_inv @ gram @ h_inv)
    se = np.sqrt(np.clip(np.diag(cov)[:p], 0.0, None))
    return DidFit(coef[:p], se, residual)


def _step_rewards(batch: EstimatorBatch, gamma: float) -> np.ndarray:
    """[N] r_t = R_t - gamma R_{t+1} within each trajectory (rows are in (task, traj, turn) order)."""
    rtg = batch.return_to_go
    nxt = np.zeros_like(rtg)
    same = batch.traj_index[1:] == batch.traj_index[:-1]
    nxt[:-1][same] = rtg[1:][same]
    return rtg - gamma * nxt


def row_outcomes(batch: EstimatorBatch, outcome: str, gamma: float) -> np.ndarray:
    """[N] y_i of `settings.did_outcome`. delta_visible falls back to step rewards where the visible pass
    fraction is unknown (then y_i = r_i - r_{i-1}; the terminal outcome lands in the last turn's effect)."""
    if outcome == "return_to_go":
        return batch.return_to_go.astype(np.float64)
    if outcome == "terminal":
        last = np.ones(len(batch.traj_index), bool)
        last[:-1] = batch.traj_index[1:] != batch.traj_index[:-1]
        final = np.zeros(int(batch.traj_index.max()) + 1 if len(batch.traj_index) else 0)
        final[batch.traj_index[last]] = batch.return_to_go[last]  # R_t of the last row = its step reward
        return final[batch.traj_index]
    level = np.asarray(batch.visible_pass_fraction, np.float64)
    if level.shape != batch.traj_index.shape or np.isnan(level).any():
        level = _step_rewards(batch, gamma)
    prev = np.zeros_like(level)
    same = batch.traj_index[1:] == batch.traj_index[:-1]
    prev[1:][same] = level[:-1][same]
    return level - prev


def _controls(turn: np.ndarray, traj: np.ndarray, kind: str) -> np.ndarray:
    """[n, q] fixed-effect dummies of one task's rows."""
    if kind == "none":
        return np.ones((len(turn), 1))
    blocks = [_dummies(turn)]
    if kind == "turn_trajectory":
        blocks.append(_dummies(traj)[:, 1:])  # one level dropped: the turn dummies already span the intercept
    return np.hstack(blocks)


def _dummies(codes: np.ndarray) -> np.ndarray:
    _, inverse = np.unique(codes, return_inverse=True)
    out = np.zeros((len(codes), int(inverse.max()) + 1 if len(codes) else 0))
    out[np.arange(len(codes)), inverse] = 1.0
    return out


def anchor_effects(batch: EstimatorBatch, settings: CreditSettings) -> tuple[np.ndarray, np.ndarray]:
    """Per anchor of the batch [A] effect (as used on its tokens, shrunk if asked) and [N] per-row singleton
    estimate (residual / (1 + ridge); 0 unless did_unanchored == "singleton")."""
    n_anchors = len(batch.anchor_task)
    effect = np.zeros(n_anchors)
    singleton = np.zeros(len(batch.traj_index))
    y_all = row_outcomes(batch, settings.did_outcome, settings.gamma)
    pairs = batch.anchor_rows
    for task in np.unique(batch.task_index):
        rows = np.flatnonzero(batch.task_index == task)
        anchors = np.flatnonzero(batch.anchor_task == task)
        local_row = np.full(len(batch.traj_index), -1, np.int64)
        local_row[rows] = np.arange(len(rows))
        mine = pairs[np.isin(pairs[:, 1], anchors)] if len(anchors) else pairs[:0]
        column_of_anchor, n_cols = _columns(mine, anchors, local_row, settings.did_granularity)
        design = np.zeros((len(rows), n_cols))
        if len(mine):
            design[local_row[mine[:, 0]], column_of_anchor[mine[:, 1]]] = 1.0
        controls = _controls(batch.turn[rows], batch.traj_index[rows], settings.did_controls)
        fit = fit_effects(y_all[rows], design, controls, settings.did_ridge)
        b = fit.effect
        if settings.did_shrink:
            b = b * b**2 / np.maximum(b**2 + fit.se**2, 1e-300)
        if len(anchors):
            effect[anchors] = b[column_of_anchor[anchors]]
        if settings.did_unanchored == "singleton":
            singleton[rows] = fit.residual / (1.0 + settings.did_ridge)
    return effect, singleton


def _columns(
    pairs: np.ndarray, anchors: np.ndarray, local_row: np.ndarray, granularity: str
) -> tuple[np.ndarray, int]:
    """Design column of each anchor (indexed by global anchor id) and the number of columns."""
    column = np.full(int(anchors.max()) + 1 if len(anchors) else 0, -1, np.int64)
    if granularity == "anchor":
        column[anchors] = np.arange(len(anchors))
        return column, len(anchors)
    patterns: dict[tuple[int, ...], int] = {}
    rows_of: dict[int, list[int]] = {int(a): [] for a in anchors}
    for row, a in pairs.tolist():
        rows_of[a].append(int(local_row[row]))
    for a in anchors.tolist():
        column[a] = patterns.setdefault(tuple(sorted(rows_of[a])), len(patterns))
    return column, len(patterns)


@register_estimator("didpo_did", needs_anchors=True)
def didpo_did(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """token_adv = A^E_i + lambda * effect(anchor covering the token); see the module docstring.
    [N] episode advantages, N x [T_n] token advantages. lambda = 0 gives the episode-level estimator."""
    a_e = episode_advantage(batch, settings.adv_norm, settings.std_eps)
    effect, singleton = anchor_effects(batch, settings)
    tokens = []
    for r, n_tok in enumerate(batch.n_tokens.tolist()):
        owner = batch.token_anchor[r] if batch.token_anchor else np.full(n_tok, -1, np.int64)
        diff = np.where(owner >= 0, effect[np.maximum(owner, 0)] if len(effect) else 0.0, 0.0)
        if settings.did_unanchored == "singleton" and batch.changed_tokens:
            diff = np.where((owner < 0) & batch.changed_tokens[r], singleton[r], diff)
        tokens.append(float(a_e[r]) + settings.lam * diff)
    return EstimatorOutput(a_e, [np.asarray(t, np.float64) for t in tokens])
