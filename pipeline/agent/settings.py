"""Episode configuration: turn limits, reward shaping and what the prompt shows."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class EpisodeSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(8, description="turns before the episode is closed and the hidden tests decide")
    min_turns_before_finish: int = Field(1, description="a finish earlier than this turn (1-based) is invalid")
    max_response_tokens: int = Field(1024, description="a response this long (tokens) counts as truncated")
    history_turns: int = Field(3, description="H: past turns (action + observation) shown in the prompt")
    reward_coef: float = Field(0.2, description="step reward = reward_coef * visible pass fraction (edits)")
    invalid_penalty: float = Field(0.1, description="subtracted for an invalid action (>= 0)")
    elide_lines: int = Field(120, description="files longer than this are shown as a window of this many lines")
    max_file_bytes: int = Field(256 * 1024, description="an action may not make a file larger than this")
    observation_chars: int = Field(2000, description="cap on one observation's text")
    history_action_chars: int = Field(1500, description="cap on one past action's text in the prompt")
    action_spec: Literal["full", "brief"] = Field(
        "full", description="how the system prompt states the action grammar: 'full' (docs/action_grammar.md) "
        "or 'brief' (a few lines, for small policies on a short token budget)"
    )

    @field_validator("max_turns", "max_response_tokens", "elide_lines", "max_file_bytes", "observation_chars",
                     "history_action_chars")
    @classmethod
    def _positive(cls, v: int, info) -> int:
        if v < 1:
            raise ValueError(f"{info.field_name} must be >= 1, got {v}")
        return v

    @field_validator("history_turns", "min_turns_before_finish")
    @classmethod
    def _non_negative(cls, v: int, info) -> int:
        if v < 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {v}")
        return v

    @field_validator("reward_coef", "invalid_penalty")
    @classmethod
    def _finite_non_negative(cls, v: float, info) -> float:
        if not 0.0 <= v < 1e6:
            raise ValueError(f"{info.field_name} must be a finite number >= 0, got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> EpisodeSettings:
        if self.min_turns_before_finish > self.max_turns:
            raise ValueError(
                f"min_turns_before_finish ({self.min_turns_before_finish}) cannot exceed max_turns "
                f"({self.max_turns}): the agent could never finish"
            )
        return self
