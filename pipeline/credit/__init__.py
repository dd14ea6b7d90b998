"""Credit assignment of DiDPO as pure, fast functions (no Beam, torch or DuckDB).

Entry point: `compute_credit(steps, settings) -> CreditResult`, or its two halves `credit_units` (steps 1-8:
returns, sub-diffs, anchors, A^D and its projection) and `assign_advantages` (step 9: the estimator). See
`pipeline.credit.batch` for the algorithm in numbered steps and docs/design.md. Results are plain values
(sub-diffs, anchors, per-row advantages); `pipeline.credit_io` makes the contract tables of them.
"""

from pipeline.credit import did, estimators
from pipeline.credit.anchors import groupability
from pipeline.credit.batch import (
    Anchor,
    CreditResult,
    CreditUnits,
    RowAdvantages,
    SubDiff,
    assign_advantages,
    compute_credit,
    credit_units,
    reads_units,
)
from pipeline.credit.did import fit_effects
from pipeline.credit.estimators import ESTIMATORS, EstimatorBatch, EstimatorOutput, register_estimator
from pipeline.credit.inputs import CreditInputError, Edit, StepInput, edits_from_action
from pipeline.credit.projection import pad_token_batch
from pipeline.credit.settings import CreditSettings

# Every built-in estimator, registered here and only here (a user's own: `register_estimator`).
for _name, _fn, _declares in (
    ("grpo", estimators.grpo, {}),
    ("dr_grpo", estimators.dr_grpo, {}),
    ("rloo", estimators.rloo, {}),
    ("reinforce_pp_baseline", estimators.reinforce_pp_baseline, {"scope": "batch"}),
    ("gigpo", estimators.gigpo, {}),
    ("didpo", estimators.didpo, {"needs_anchors": True}),
    ("didpo_did", did.didpo_did, {"needs_lines": True}),
    ("didpo_flipped", estimators.didpo_flipped, {"needs_anchors": True}),  # the broken control of comparisons
):
    register_estimator(_name, **_declares)(_fn)


def clear_caches() -> None:
    """Empty the per-text caches (diffs, AST blocks, normalization) so a benchmark measures a cold batch."""
    from pipeline.credit import diffs, normalize, subdiffs

    diffs.line_opcodes.cache_clear()
    subdiffs.ast_blocks.cache_clear()
    normalize.normalize_line.cache_clear()
    normalize.comparison_tokens.cache_clear()
    normalize._TOKEN_HASHES.clear()


__all__ = [
    "clear_caches",
    "Anchor",
    "ESTIMATORS",
    "CreditInputError",
    "CreditResult",
    "CreditUnits",
    "CreditSettings",
    "Edit",
    "EstimatorBatch",
    "EstimatorOutput",
    "RowAdvantages",
    "StepInput",
    "SubDiff",
    "assign_advantages",
    "compute_credit",
    "credit_units",
    "edits_from_action",
    "fit_effects",
    "groupability",
    "pad_token_batch",
    "reads_units",
    "register_estimator",
]
