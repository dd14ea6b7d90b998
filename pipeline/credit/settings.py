"""Settings of the credit stage (the steps of `pipeline/credit/batch.py`).

Defaults are DESIGN.md's. Caps bound the work a single pathological step can cause (a 100,000-line
rewrite, a file that does not parse): beyond a cap the affected change keeps its episode-level credit only,
and the batch diagnostics count what was capped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

GsForm = Literal["product", "log", "linear", "additive"]
AdvNorm = Literal["mean_norm", "mean_std_norm"]
DidOutcome = Literal["visible", "return"]
DidControls = Literal["none", "turn"]


class CreditSettings(BaseModel):
    """Frozen, validated settings of `pipeline.credit.compute_credit`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    estimator: str = "didpo_did"  # a name in pipeline.credit.estimators.ESTIMATORS (docs/didpo_did.md: why this one)
    lam: float = 1.0  # lambda: weight of the diff-level term A^D in (A^E + lambda * A^D)
    gamma: float = 0.95  # discount of the return R_t = sum_k gamma^(k-t) r_k
    eta: float = 0.8  # exact Jaccard similarity (token shingles) a cluster member needs to its representative
    s0: float = 8.0  # GS semantic-scope scale, in lines
    g0: float = 8.0  # GS group-mass scale, in rows
    gs_form: GsForm = "product"  # product (DESIGN.md); log, linear, additive for ablations
    max_anchors_per_task: int = 32  # K: greedy facility location picks at most K anchors per task
    window_sizes: tuple[int, ...] = (2, 4, 8)  # contiguous line windows (lines) besides whole hunks
    ast_blocks: bool = (
        True  # add AST-aligned blocks (compound statements, function bodies) when the file parses
    )
    num_perm: int = 64  # MinHash permutations
    shingle_size: int = 3  # tokens per shingle
    lsh_threshold: float | None = None  # LSH recall threshold; None = eta - 0.15 (verification enforces eta)
    adv_norm: AdvNorm = "mean_norm"  # subtract the group mean; mean_std_norm also divides by the group std
    std_eps: float = 1e-6  # added to the std in mean_std_norm
    canonicalize_identifiers: bool = True  # rename locally bound identifiers to v0, v1, ... before comparing
    gigpo_omega: float = 1.0  # weight of GiGPO's step-level term
    # didpo_did (pipeline/credit/did.py, docs/didpo_did.md): effects of line units on the workspace's outcome
    did_outcome: DidOutcome = "visible"  # visible pass fraction after every step, or final workspace + return
    did_controls: DidControls = "none"  # unpenalized columns: one intercept, or one dummy per turn
    did_ridge: float = 1.0  # ridge strength on the unit effects (the controls are not penalized), >= 0
    did_shrink: bool = False  # multiply each effect by b^2 / (b^2 + se^2) (shrink what the data barely backs)
    seed: int = 1  # MinHash permutation seed (results are deterministic for a given seed)
    # Caps (documented bounds; what exceeds them gets episode-level credit only and is counted):
    max_file_lines: int = 200_000  # a file (before or after) longer than this is not diffed
    max_diff_lines: int = (
        20_000  # a changed region (after trimming common prefix/suffix) above this skips difflib
    )
    max_hunk_lines: int = 400  # a hunk side longer than this yields no sub-diff candidates
    max_ast_lines: int = 5_000  # files longer than this are not parsed for AST blocks
    max_candidates_per_row: int = 256  # candidates beyond this in one row are dropped (largest scales kept)

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, value: str) -> str:
        from pipeline.credit.estimators import ESTIMATORS  # late: estimators import nothing from here

        if value not in ESTIMATORS:
            raise ValueError(f"unknown estimator {value!r}; registered: {sorted(ESTIMATORS)}")
        return value

    @field_validator("gamma")
    @classmethod
    def _gamma_range(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {value}")
        return value

    @field_validator("eta")
    @classmethod
    def _eta_range(cls, value: float) -> float:
        if not 0.0 < value <= 1.0:
            raise ValueError(f"eta must be in (0, 1], got {value}")
        return value

    @field_validator("s0", "g0", "std_eps")
    @classmethod
    def _positive(cls, value: float) -> float:
        if not value > 0.0:
            raise ValueError(f"must be > 0, got {value}")
        return value

    @field_validator("lam", "gigpo_omega", "did_ridge")
    @classmethod
    def _finite_nonneg(cls, value: float) -> float:
        if not (value >= 0.0 and value < float("inf")):
            raise ValueError(f"must be a finite number >= 0, got {value}")
        return value

    @field_validator("window_sizes")
    @classmethod
    def _windows(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(w < 1 for w in value):
            raise ValueError(f"window sizes must be >= 1 line, got {value}")
        return tuple(sorted(set(value)))

    @field_validator(
        "max_anchors_per_task",
        "num_perm",
        "shingle_size",
        "max_file_lines",
        "max_diff_lines",
        "max_hunk_lines",
        "max_ast_lines",
        "max_candidates_per_row",
    )
    @classmethod
    def _positive_int(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"must be >= 1, got {value}")
        return value

    @model_validator(mode="after")
    def _lsh(self) -> CreditSettings:
        if self.num_perm < 4:
            raise ValueError(f"num_perm must be >= 4 (LSH needs at least 2 bands), got {self.num_perm}")
        if self.lsh_threshold is not None and not 0.0 < self.lsh_threshold <= self.eta:
            raise ValueError(f"lsh_threshold must be in (0, eta={self.eta}], got {self.lsh_threshold}")
        return self

    @property
    def effective_lsh_threshold(self) -> float:
        """The LSH threshold used: below eta so that LSH misses few pairs the exact check would accept."""
        return self.lsh_threshold if self.lsh_threshold is not None else max(0.05, self.eta - 0.15)
