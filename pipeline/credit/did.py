"""`didpo_did`: each change's own effect on what the workspace achieves (docs/didpo_did.md).

The paper's A^D compares the return of the rows that contain an anchor with the mean over those rows; every
change bundled into the same action gets the same credit. Here, per task group, a state model:

1. Units (`lines.line_units`): the lines a workspace has at a place where its trajectory's start lacks them
   (`add`) and the start's lines it lacks (`del`), each line compared by its tokens at its place (a line
   the program holds twice is two units).
2. Observations (settings.did_outcome): `visible` (default) the visible pass fraction of the workspace after
   every step; `return` one per trajectory, its final workspace with the episode return. `visible` falls
   back to `return` in a task group where a row has no visible pass fraction (outcome-only rewards).
3. Ridge least squares of the outcome on the units present, with an unpenalized intercept (or turn dummies,
   settings.did_controls):  min_{b, c} ||y - D b - F c||^2 + ridge * ||b||^2, closed form per task group;
   standard errors from the ridge sandwich (settings.did_shrink multiplies each effect by
   b^2 / (b^2 + se^2)). Under mean_std_norm the effects are divided by the std of y in the group, so they
   are in the units A^E is in.
4. A change of a step (a rewritten line, an added or a deleted one) gets the signed sum of the effects of the
   units it switched on or off; its tokens (the written line and the quoted deleted line) get
   A^E + lambda * that credit; every other token gets A^E.

Additive in the units and evaluated on states, not steps: a fix made in turn 1 is credited with what the
workspace gains by containing it, whichever turn the tests first show it, and with outcome-only rewards the
final workspaces alone identify the units' effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.credit.estimators import EstimatorBatch, EstimatorOutput, episode_advantage

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


def observations(batch: EstimatorBatch, rows: np.ndarray, outcome: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows observed, y) of one task group: every row with its visible pass fraction, or (`return`, or a
    group where one is unknown) each trajectory's last row with the episode return."""
    visible = np.asarray(batch.visible_pass_fraction, np.float64)
    if outcome == "visible" and visible.shape == batch.traj_index.shape and not np.isnan(visible[rows]).any():
        return rows, visible[rows]
    traj = batch.traj_index[rows]
    last = rows[np.append(traj[1:] != traj[:-1], True)]  # rows are in (task, traj, turn) order
    return last, batch.episode_return[last].astype(np.float64)


def _controls(turn: np.ndarray, kind: str) -> np.ndarray:
    """[n, q] unpenalized columns: one intercept, or one dummy per turn index."""
    if kind == "none":
        return np.ones((len(turn), 1))
    _, inverse = np.unique(turn, return_inverse=True)
    out = np.zeros((len(turn), int(inverse.max()) + 1 if len(turn) else 0))
    out[np.arange(len(turn)), inverse] = 1.0
    return out


def _return_spread(batch: EstimatorBatch, rows: np.ndarray) -> float:
    """Std of the episode return over the trajectories of one task group (each counted once)."""
    traj = batch.traj_index[rows]
    first = np.append(True, traj[1:] != traj[:-1])
    return float(batch.episode_return[rows][first].std())


def unit_effects(batch: EstimatorBatch, settings: CreditSettings) -> np.ndarray:
    """[U] effect of each line unit of the batch (shrunk if asked, standardized under mean_std_norm)."""
    units = batch.line_units
    effect = np.zeros(len(units.unit_task)) if units is not None else np.zeros(0)
    if units is None or not len(units.unit_task):
        return effect
    present = units.present
    for task in np.unique(units.unit_task):
        rows = np.flatnonzero(batch.task_index == task)
        mine = np.flatnonzero(units.unit_task == task)
        observed, y = observations(batch, rows, settings.did_outcome)
        slot = np.full(len(batch.traj_index), -1, np.int64)
        slot[observed] = np.arange(len(observed))
        column = np.full(len(units.unit_task), -1, np.int64)
        column[mine] = np.arange(len(mine))
        pairs = present[(slot[present[:, 0]] >= 0) & (column[present[:, 1]] >= 0)]
        design = np.zeros((len(observed), len(mine)))
        design[slot[pairs[:, 0]], column[pairs[:, 1]]] = 1.0
        fit = fit_effects(y, design, _controls(batch.turn[observed], settings.did_controls), settings.did_ridge)
        b = fit.effect
        if settings.did_shrink:
            b = b * b**2 / np.maximum(b**2 + fit.se**2, 1e-300)
        # In A^E's units: y's spread maps onto the return's (mean_norm) or onto 1 (mean_std_norm)
        spread = 1.0 if settings.adv_norm == "mean_std_norm" else _return_spread(batch, rows)
        effect[mine] = b * spread / (float(y.std()) + settings.std_eps)
    return effect


def didpo_did(batch: EstimatorBatch, settings: CreditSettings) -> EstimatorOutput:
    """token_adv = A^E_i + lambda * credit(change covering the token); see the module docstring.
    [N] episode advantages, N x [T_n] token advantages. lambda = 0 gives the episode-level estimator."""
    a_e = episode_advantage(batch, settings.adv_norm, settings.std_eps)
    units = batch.line_units
    credit = np.zeros(0)
    if units is not None and units.n_changes:
        effect = unit_effects(batch, settings)
        credit = np.bincount(units.term_change, units.term_sign * effect[units.term_unit], units.n_changes)
    tokens = []
    for r, n_tok in enumerate(batch.n_tokens.tolist()):
        owner = units.token_change[r] if units is not None and units.n_changes else np.full(n_tok, -1)
        diff = np.where(owner >= 0, credit[np.maximum(owner, 0)] if len(credit) else 0.0, 0.0)
        tokens.append(float(a_e[r]) + settings.lam * diff)
    return EstimatorOutput(a_e, [np.asarray(t, np.float64) for t in tokens])
