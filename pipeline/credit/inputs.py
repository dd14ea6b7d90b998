"""Input row types of the credit stage, independent of the agent, schema and Beam code.

Span convention: half-open [start, end) character offsets into `response_text` (Python str indices).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

EDIT_OPS = ("replace", "insert", "write")


class CreditInputError(ValueError):
    """A step row the credit stage refuses; the message names the row and the field."""


@dataclass(frozen=True)
class Edit:
    """One edit of a parsed action: where its text sits in the response."""

    op: str  # "replace" (search/replace), "insert", "write" (whole file)
    path: str  # workspace file the edit touches
    search: str = ""  # text replaced ("replace" only)
    replace: str = ""  # payload: replacement / inserted text / whole new file
    search_span: tuple[int, int] | None = None  # [s, e) of `search` in response_text, None if unknown
    replace_span: tuple[int, int] | None = None  # [s, e) of the payload in response_text, None if unknown


@dataclass(frozen=True)
class StepInput:
    """One step (= one training row) as the credit stage sees it."""

    row_id: str  # content hash of (traj_id, turn)
    traj_id: str  # trajectory (rollout) the step belongs to
    task_id: str  # task group: all rollouts of one task are compared with each other
    turn: int  # 0-based position in the trajectory
    step_reward: float  # r_t: graded pass fraction times a coefficient, plus the terminal outcome
    response_text: str = ""  # decoded response
    token_char_starts: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.int64)
    )  # [T] token char start
    token_char_ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [T] token char end
    edits: tuple[Edit, ...] = ()  # parsed edits of the action (empty for run_tests / finish / invalid)
    files_before: Mapping[str, str] = field(default_factory=dict)  # touched files before the action
    files_after: Mapping[str, str] = field(default_factory=dict)  # the same files after it (absent: deleted)
    workspace_hash_before: str = ""  # identical hashes = identical states (GiGPO groups); "" = unknown
    loss_mask: np.ndarray | None = None  # [T] 0/1 per response token; None = all ones
    visible_pass_fraction: float | None = None  # visible tests passed / total after the step; None = unknown

    def __post_init__(self) -> None:
        starts = np.asarray(self.token_char_starts, dtype=np.int64).reshape(-1)
        ends = np.asarray(self.token_char_ends, dtype=np.int64).reshape(-1)
        object.__setattr__(self, "token_char_starts", starts)
        object.__setattr__(self, "token_char_ends", ends)
        object.__setattr__(self, "edits", tuple(self.edits))
        object.__setattr__(self, "files_before", dict(self.files_before))  # plain dicts: picklable (Beam)
        object.__setattr__(self, "files_after", dict(self.files_after))
        if self.loss_mask is not None:
            object.__setattr__(self, "loss_mask", np.asarray(self.loss_mask, dtype=np.float64).reshape(-1))

    @property
    def n_tokens(self) -> int:
        return int(self.token_char_starts.shape[0])


def offsets_valid(starts: np.ndarray, ends: np.ndarray, n_chars: int | np.ndarray) -> bool:
    """0 <= start <= end <= n_chars for every token (n_chars: scalar or [T] per token)."""
    return bool(starts.size == 0 or ((starts >= 0) & (ends >= starts) & (ends <= n_chars)).all())


def validate_step(step: StepInput, check_offsets: bool = True) -> None:
    """Refuse a row the math cannot use, naming the row and the field (never a silent NaN).

    check_offsets=False skips the token offset range check (a batch checks all rows at once).
    """
    where = f"row {step.row_id!r} (traj {step.traj_id!r}, turn {step.turn})"
    reward = step.step_reward
    if reward is None or not isinstance(reward, int | float) or not math.isfinite(float(reward)):
        raise CreditInputError(f"{where}: step_reward is {reward!r}; a finite number is required")
    vpf = step.visible_pass_fraction
    if vpf is not None and not (isinstance(vpf, int | float) and 0.0 <= float(vpf) <= 1.0):
        raise CreditInputError(f"{where}: visible_pass_fraction is {vpf!r}; a number in [0, 1] or None")
    if not step.row_id or not step.traj_id or not step.task_id:
        raise CreditInputError(f"{where}: row_id, traj_id and task_id must be non-empty")
    starts, ends = step.token_char_starts, step.token_char_ends
    if starts.shape != ends.shape:
        raise CreditInputError(
            f"{where}: token_char_starts has {starts.shape[0]} entries, token_char_ends {ends.shape[0]}"
        )
    n_chars = len(step.response_text)
    if check_offsets and not offsets_valid(starts, ends, n_chars):
        raise CreditInputError(
            f"{where}: token offsets must satisfy 0 <= start <= end <= len(response_text)={n_chars}"
        )
    if step.loss_mask is not None and step.loss_mask.shape != starts.shape:
        raise CreditInputError(
            f"{where}: loss_mask has {step.loss_mask.shape[0]} entries, tokens {starts.shape[0]}"
        )
    for k, edit in enumerate(step.edits):
        if edit.op not in EDIT_OPS:
            raise CreditInputError(f"{where}: edit {k} has op {edit.op!r}; allowed: {EDIT_OPS}")
        for name in ("search_span", "replace_span"):
            span = getattr(edit, name)
            if span is not None and not (0 <= span[0] <= span[1] <= n_chars):
                raise CreditInputError(f"{where}: edit {k} {name}={span} is outside [0, {n_chars}]")


def _span(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    start, end = value
    return int(start), int(end)


def edits_from_action(action: str | Mapping[str, Any] | None) -> tuple[Edit, ...]:
    """Edits of an `action_json` record (see the steps table): {"kind":..., "edits":[{op, path, ...}]}.

    Accepts the JSON text or the decoded dict; unknown keys are ignored, a missing "edits" list means none.
    """
    if action is None or action == "":
        return ()
    record = json.loads(action) if isinstance(action, str) else action
    edits = record.get("edits") or ()
    return tuple(
        Edit(
            op=str(e.get("op", "")),
            path=str(e.get("path", "")),
            search=str(e.get("search") or ""),
            replace=str(e.get("replace") or e.get("text") or e.get("content") or ""),
            search_span=_span(e.get("search_span")),
            replace_span=_span(e.get("replace_span")),
        )
        for e in edits
    )


def files_map(files: Iterable[Mapping[str, str]] | Mapping[str, str] | None) -> dict[str, str]:
    """`list<struct<path, text>>` (the table form) or a plain path -> text mapping, as a dict."""
    if files is None:
        return {}
    if isinstance(files, Mapping):
        return dict(files)
    return {str(f["path"]): str(f["text"]) for f in files}

