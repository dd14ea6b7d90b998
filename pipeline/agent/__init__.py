"""Action grammar (parse/render), prompt rendering and the multi-turn episode state machine."""

from __future__ import annotations

from pipeline.agent.episode import Episode, EpisodeState, Executor, StepResult, Turn, workspace_hash
from pipeline.agent.grammar import (
    ACTION_SPEC,
    ACTION_SPEC_BRIEF,
    INVALID_REASONS,
    Action,
    Edit,
    InvalidAction,
    action_json,
    apply_action,
    parse_action,
    parse_response,
    render_action,
)
from pipeline.agent.settings import EpisodeSettings

__all__ = ["ACTION_SPEC", "ACTION_SPEC_BRIEF", "INVALID_REASONS", "Action", "Edit", "Episode", "EpisodeSettings", "EpisodeState",
           "Executor", "InvalidAction", "StepResult", "Turn", "action_json", "apply_action", "parse_action",
           "parse_response", "render_action", "workspace_hash"]
