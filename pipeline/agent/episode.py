"""A Task as a multi-turn self-repair episode: a small state machine with no generation inside.

Per turn (the same code serves rollouts, evaluation and the online trainer):
  1. `prompt_messages()` -> chat messages: instructions, current files (long files elided around the last
     edit, with explicit markers), the last H turns' actions and observations, the action spec.
  2. The caller generates a response and calls `step(response_text)`.
  3. The response is parsed; an invalid action costs `invalid_penalty` and changes nothing.
     Edits are applied and the visible tests run: reward = reward_coef * visible pass fraction (graded).
     run_tests shows the visible results (reward 0). finish (allowed from turn min_turns_before_finish)
     or the last turn runs the hidden tests: + outcome (1 if all pass, else 0).
  4. An infra_error (sandbox failure) is never scored: reward 0, `state.infra_error` set for a retry.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from pipeline.agent.grammar import (
    ACTION_SPECS,
    Action,
    InvalidAction,
    apply_action,
    parse_response,
    render_action,
)
from pipeline.agent.settings import EpisodeSettings
from pipeline.sandbox.judge import ExecResult
from pipeline.tasks.base import FrozenMap, Task


class Executor(Protocol):
    """Runs a task's tests against a workspace (`pipeline.sandbox.Judge` is the real one)."""

    def run(self, task: Task, files: Mapping[str, str], *, hidden: bool = False) -> ExecResult: ...


def workspace_hash(files: Mapping[str, str]) -> str:
    """Content hash of a workspace (paths and texts, order-independent), hex sha256."""
    h = hashlib.sha256()
    for path in sorted(files):
        for part in (path, files[path]):
            b = part.encode("utf-8", "surrogatepass")
            h.update(len(b).to_bytes(8, "big"))
            h.update(b)
    return h.hexdigest()


def unified_diff(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    out = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a != b:
            out += difflib.unified_diff((a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
                                        f"a/{path}" if a is not None else "/dev/null", f"b/{path}")
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


@dataclass(frozen=True)
class Turn:
    """One past turn as the prompt history shows it."""

    index: int
    action_text: str  # the action part of the response (canonical rendering), or the raw text if invalid
    observation: str
    reward: float


@dataclass(frozen=True)
class EpisodeState:
    task: Task
    files: Mapping[str, str]  # the current workspace, path -> text
    turn: int = 0  # turns taken so far
    history: tuple[Turn, ...] = ()
    done: bool = False
    visible_passed: int = 0
    visible_total: int = 0
    outcome: float | None = None  # hidden tests, once run: 1.0 all pass else 0.0
    infra_error: bool = False  # a sandbox failure happened: the episode should be retried, not scored
    focus: Mapping[str, int] = field(default_factory=FrozenMap)  # path -> line of the last change (for elision)
    total_reward: float = 0.0


@dataclass(frozen=True)
class StepResult:
    turn: int  # 0-based
    action: Action | InvalidAction
    action_kind: str  # edit / insert / write / run_tests / finish / invalid
    action_status: str  # "ok" or the invalid-action reason
    action_json: dict[str, Any]
    files_before: tuple[tuple[str, str], ...]  # (path, text) of touched files before (absent: not listed)
    files_after: tuple[tuple[str, str], ...]
    workspace_hash_before: str
    workspace_hash_after: str
    exec_status: str  # passed / failed / timeout / crashed / invalid_action / infra_error ("" if nothing ran)
    visible_passed: int
    visible_total: int
    step_reward: float
    outcome: float | None  # set on the step that ran the hidden tests
    observation: str
    diff: str
    done: bool
    exec_result: ExecResult | None = None


def system_prompt(action_spec: str) -> str:
    """The episode's system message: the role, then the action grammar in the `action_spec` wording."""
    return ("You are a careful software engineer fixing code in a small workspace, one action per turn. "
            "After each change the visible tests run and you see their result.\n\n" + ACTION_SPECS[action_spec])


def user_message(instructions: str, files: Mapping[str, str], cfg: EpisodeSettings, *,
                 focus: Mapping[str, int] | None = None, history: Sequence[Turn] = (), turn: int = 0,
                 visible_passed: int = 0, visible_total: int = 0) -> str:
    """The user message of a turn: the task, the workspace's files, the last turns and the status."""
    focus = focus or {}
    parts = [f"# Task\n{instructions.strip()}\n", "# Workspace"]
    for path in sorted(files):
        parts.append(render_file(path, files[path], cfg.elide_lines, focus.get(path)))
    if history:
        parts.append(f"# Last {len(history[-cfg.history_turns:])} turn(s)" if cfg.history_turns else "")
        for t in history[-cfg.history_turns:] if cfg.history_turns else ():
            parts.append(f"## Turn {t.index + 1}\nAction:\n{t.action_text}\nObservation:\n{t.observation}")
    parts.append(
        f"# Status\nTurn {turn + 1} of {cfg.max_turns}. Visible tests: {visible_passed}/{visible_total} "
        f"passed so far." + (f" finish is allowed from turn {cfg.min_turns_before_finish}."
                             if cfg.min_turns_before_finish > 1 else "")
    )
    return "\n\n".join(p for p in parts if p)


class Episode:
    def __init__(self, task: Task, executor: Executor, settings: EpisodeSettings | None = None,
                 tokenizer: Any = None):
        self.settings = settings or EpisodeSettings()
        self.executor = executor
        self.tokenizer = tokenizer
        self.state = EpisodeState(task=task, files=FrozenMap(task.workspace),
                                  visible_total=task.visible_tests.n_cases)

    @classmethod
    def resume(cls, state: EpisodeState, executor: Executor, settings: EpisodeSettings | None = None,
               tokenizer: Any = None) -> Episode:
        """Continue an episode from a saved state (the pipeline carries states between turn stages)."""
        episode = cls(state.task, executor, settings, tokenizer)
        episode.state = state
        return episode

    # ----------------------------------------------------------------------------------------- prompt
    def prompt_messages(self) -> list[dict[str, str]]:
        s = self.state
        user = user_message(s.task.instructions, s.files, self.settings, focus=s.focus, history=s.history,
                            turn=s.turn, visible_passed=s.visible_passed, visible_total=s.visible_total)
        return [{"role": "system", "content": system_prompt(self.settings.action_spec)},
                {"role": "user", "content": user}]

    def render_prompt(self, tokenizer: Any = None) -> str:
        """The prompt text through the tokenizer's chat template (ChatML if it has none)."""
        tok = tokenizer or self.tokenizer
        messages = self.prompt_messages()
        if tok is not None and getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + "<|im_start|>assistant\n"

    # ------------------------------------------------------------------------------------------- step
    def _is_truncated(self, text: str) -> bool:
        if self.tokenizer is None:
            return False
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return len(ids) >= self.settings.max_response_tokens

    def step(self, response_text: str, *, truncated: bool | None = None) -> StepResult:
        s, cfg = self.state, self.settings
        if s.done:
            raise RuntimeError(f"episode of {s.task.task_id} is finished; no step after turn {s.turn}")
        if truncated is None:
            truncated = self._is_truncated(response_text)
        before = dict(s.files)
        action: Action | InvalidAction = parse_response(response_text, truncated=truncated)
        after = before
        result: ExecResult | None = None
        outcome: float | None = None
        reward, done, observation = 0.0, False, ""
        visible = (s.visible_passed, s.visible_total)
        infra = s.infra_error
        if action.ok and action.kind == "finish" and s.turn + 1 < cfg.min_turns_before_finish:
            action = InvalidAction("finish_too_early",
                                   f"finish is allowed from turn {cfg.min_turns_before_finish}, this is turn "
                                   f"{s.turn + 1}")
        if action.ok and action.kind not in ("run_tests", "finish"):
            applied = apply_action(action, before, max_file_bytes=cfg.max_file_bytes)  # type: ignore[arg-type]
            if isinstance(applied, InvalidAction):
                action = applied
            else:
                after = applied
        if not action.ok:
            reward = -cfg.invalid_penalty
            exec_status = "invalid_action"
            observation = f"Invalid action ({action.reason}): {action.detail}. Nothing was changed."
        elif action.kind == "finish":
            result = self.executor.run(s.task, after, hidden=True)
            exec_status = result.status
            outcome, infra = self._outcome(result, infra)
            reward = outcome or 0.0
            done = True
            observation = "Finished. The hidden tests decide the outcome."
        else:
            result = self.executor.run(s.task, after, hidden=False)
            exec_status = result.status
            if result.status == "infra_error":
                infra = True
            else:
                visible = (result.passed, result.total)
                if action.kind != "run_tests":
                    reward = cfg.reward_coef * result.pass_fraction
            observation = summarize(result, cfg.observation_chars)
        turn = s.turn + 1
        if not done and turn >= cfg.max_turns:
            final = self.executor.run(s.task, after, hidden=True)
            outcome, infra = self._outcome(final, infra)
            reward += outcome or 0.0
            done = True
            observation += "\nTurn limit reached; the hidden tests decide the outcome."
        touched = sorted({e.path for e in action.edits}) if action.ok and isinstance(action, Action) else []
        focus = dict(s.focus)
        for path in touched:
            if path in after:
                focus[path] = _first_changed_line(before.get(path, ""), after[path])
        step_result = StepResult(
            turn=s.turn, action=action, action_kind=action.kind,
            action_status="ok" if action.ok else action.reason,  # type: ignore[union-attr]
            action_json=action.to_json(),
            files_before=tuple((p, before[p]) for p in touched if p in before),
            files_after=tuple((p, after[p]) for p in touched if p in after),
            workspace_hash_before=workspace_hash(before), workspace_hash_after=workspace_hash(after),
            exec_status=exec_status, visible_passed=visible[0], visible_total=visible[1],
            step_reward=float(reward), outcome=outcome, observation=observation[: cfg.observation_chars + 200],
            diff=unified_diff(before, after), done=done, exec_result=result,
        )
        action_text = render_action(action) if isinstance(action, Action) else response_text
        action_text = action_text.split("</think>", 1)[-1].strip() or action_text
        self.state = replace(
            s, files=FrozenMap(after), turn=turn, done=done, visible_passed=visible[0],
            visible_total=visible[1], outcome=outcome if outcome is not None else s.outcome, infra_error=infra,
            focus=FrozenMap(focus), total_reward=s.total_reward + float(reward),
            history=(*s.history, Turn(s.turn, action_text[: cfg.history_action_chars], step_result.observation,
                                      float(reward))),
        )
        return step_result

    @staticmethod
    def _outcome(result: ExecResult, infra: bool) -> tuple[float | None, bool]:
        if result.status == "infra_error":
            return None, True  # not the policy's failure: no score, flag for retry
        return (1.0 if result.status == "passed" else 0.0), infra


def _first_changed_line(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines(), strict=False)):
        if x != y:
            return i + 1
    return min(len(a.splitlines()), len(b.splitlines())) + 1


def numbered(lines: list[str], first: int = 1) -> list[str]:
    """Each line after its number (`12| x = 1`): finding line N becomes a lookup, not a count, which a small
    policy trained from scratch does far better (docs/pretraining.md, eighth and ninth series). A `<search>`
    text quotes the line without its number."""
    return [f"{i}| {line}" for i, line in enumerate(lines, first)]


def render_file(path: str, text: str, window: int, focus: int | None) -> str:
    """A file for the prompt, every line numbered; longer than `window` lines -> a window around `focus`,
    elisions marked."""
    lines = text.splitlines()
    n = len(lines)
    head = f"## {path} ({n} lines)"
    if n <= window:
        return f"{head}\n```\n" + "".join(f"{line}\n" for line in numbered(lines)) + "```"
    center = focus or 1
    start = max(1, min(center - window // 2, n - window + 1))
    end = start + window - 1
    shown = []
    if start > 1:
        shown.append(f"[... lines 1-{start - 1} elided ...]")
    shown += numbered(lines[start - 1: end], start)
    if end < n:
        shown.append(f"[... lines {end + 1}-{n} elided ...]")
    return f"{head}, showing lines {start}-{end}\n```\n" + "\n".join(shown) + "\n```"


def summarize(result: ExecResult, limit: int) -> str:
    """The observation the model sees after a test run (bounded)."""
    lines = [f"Visible tests: {result.passed}/{result.total} passed (status: {result.status})."]
    if result.detail:
        lines.append(result.detail[:400])
    failing = [c for c in result.cases if not c.passed]
    for c in failing[:5]:
        lines.append(f"FAILED {c.name[:160]}" + (f" -> {c.detail[:200]}" if c.detail else ""))
    if len(failing) > 5:
        lines.append(f"... and {len(failing) - 5} more failing case(s)")
    out = (result.stdout + result.stderr).strip()
    if out:
        lines.append("Output (last lines):\n" + out[-600:])
    return "\n".join(lines)[:limit]
