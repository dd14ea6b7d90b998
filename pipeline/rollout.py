"""Multi-turn rollouts as pure steps, shared by the Beam pipeline and the plain loop.

A rollout is one trajectory in flight: its episode state plus the step rows written so far. Per turn:

1. `prompt_request(rollout, tokenizer)`   -> GenerationRequest (chat-templated prompt ids, per-turn seed)
2. the generator samples a response        (RunInference in Beam, a direct call in the loop)
3. `advance(rollout, result, executor)`   -> the rollout with one more step row (parse, apply, run tests)
4. once done, `finish(rollout, gamma)`    -> one trajectory row and its step rows with returns-to-go

Seeds derive from (run, round, task, sample, turn), so a rerun regenerates the same rollouts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pipeline.agent.episode import Episode, EpisodeState, Executor, StepResult
from pipeline.agent.settings import EpisodeSettings
from pipeline.credit.returns import returns_to_go
from pipeline.policy.generation import GenerationRequest, GenerationResult
from pipeline.schema import SANDBOX_LOST, DeadLetterRow, StepRow, TrajectoryRow, content_id
from pipeline.tasks.base import Task
from pipeline.telemetry import progress_bar

_MAX_SEED = 2**63


def derive_seed(*parts: Any) -> int:
    """A seed in [0, 2**63) from a content hash of `parts` (stable across processes and machines)."""
    return int(content_id(*parts), 16) % _MAX_SEED


@dataclass(frozen=True)
class Rollout:
    """One trajectory in flight (picklable: Beam carries it between turn stages)."""

    traj_id: str  # content hash of (run_id, round, task_id, sample_index)
    run_id: str
    round: int
    sample_index: int  # which of the task's G samples
    seed: int  # trajectory seed; each turn's generation seed derives from it
    policy_version: str  # behaviour policy identity
    state: EpisodeState  # the episode's state after the steps taken so far
    steps: tuple[StepRow, ...] = ()  # rows written so far (return_to_go filled by `finish`)
    infra_failures: int = 0  # steps re-run because the sandbox itself failed

    @property
    def task(self) -> Task:
        return self.state.task

    @property
    def turn(self) -> int:
        return self.state.turn

    @property
    def done(self) -> bool:
        return self.state.done


def start_rollouts(task: Task, *, run_id: str, round_k: int, samples: int, root_seed: int,
                   policy_version: str) -> list[Rollout]:
    """The G fresh rollouts of one task. The sampling seed leaves out the run id: runs with the same seed and
    policy sample the same rollouts, so estimator arms compare on common random numbers."""
    out = []
    for i in range(samples):
        traj_id = content_id("traj", run_id, round_k, task.task_id, i)
        seed = derive_seed(root_seed, round_k, task.task_id, i)
        state = Episode(task, executor=_NO_EXECUTOR).state
        out.append(Rollout(traj_id, run_id, round_k, i, seed, policy_version, state))
    return out


class _NoExecutor:
    def run(self, task: Task, files: Any, *, hidden: bool = False) -> Any:
        raise RuntimeError("rendering a prompt never executes code")


_NO_EXECUTOR = _NoExecutor()


def prompt_request(rollout: Rollout, tokenizer: Any, settings: EpisodeSettings) -> GenerationRequest:
    """The next turn's generation request: the chat-templated prompt, tokenized, and its seed."""
    episode = Episode.resume(rollout.state, _NO_EXECUTOR, settings, tokenizer)
    text = episode.render_prompt(tokenizer)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return GenerationRequest(key=row_id(rollout.traj_id, rollout.turn), prompt_token_ids=list(ids),
                             seed=derive_seed(rollout.seed, rollout.turn))


def row_id(traj_id: str, turn: int) -> str:
    return content_id("row", traj_id, turn)


def _files(pairs: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"path": p, "text": t} for p, t in pairs]


_CASES_KEPT, _CASE_CHARS = 10, 300  # per step: the steps table is for analysis, not a log of every case


def failing_cases(step: StepResult) -> list[dict[str, str]]:
    """The cases the step's test run failed, each with why (bounded), for the steps table."""
    cases = step.exec_result.cases if step.exec_result is not None else ()
    return [{"case": c.name[:_CASE_CHARS], "detail": c.detail[:_CASE_CHARS]} for c in cases if not c.passed][:_CASES_KEPT]


def step_row(rollout: Rollout, result: GenerationResult, step: StepResult) -> StepRow:
    """The steps-table row of one turn (return_to_go is filled when the trajectory ends)."""
    return StepRow(
        row_id=result.key, traj_id=rollout.traj_id, task_id=rollout.task.task_id, round=rollout.round,
        turn=step.turn, prompt_token_ids=list(result.prompt_token_ids),
        response_token_ids=list(result.response_token_ids), response_text=result.response_text,
        token_char_starts=list(result.token_char_starts), token_char_ends=list(result.token_char_ends),
        behavior_logprobs=[float(x) for x in result.behavior_logprobs], action_kind=step.action_kind,
        action_status=step.action_status, action_json=json.dumps(step.action_json, sort_keys=True),
        files_before=_files(step.files_before), files_after=_files(step.files_after),
        workspace_hash_before=step.workspace_hash_before, workspace_hash_after=step.workspace_hash_after,
        exec_status=step.exec_status, visible_passed=step.visible_passed,
        visible_total=step.visible_total, step_reward=float(step.step_reward), return_to_go=0.0, done=step.done,
        failing_cases=failing_cases(step),
    )


class InfraFailure(RuntimeError):
    """The sandbox failed on this step more often than allowed: the rollout goes to the dead-letter table."""

    def __init__(self, rollout: Rollout, reason: str) -> None:
        super().__init__(reason)
        self.rollout, self.reason = rollout, reason


def advance(rollout: Rollout, result: GenerationResult, executor: Executor, settings: EpisodeSettings,
            *, max_infra_retries: int = 2) -> Rollout:
    """Parse and execute one response; returns the rollout one step further.

    A sandbox failure (infra_error) is never scored as the policy's: the step is re-run from the same state,
    and after `max_infra_retries` failures `InfraFailure` is raised with the reason.
    """
    for _attempt in range(max_infra_retries + 1):
        episode = Episode.resume(rollout.state, executor, settings)
        step = episode.step(result.response_text, truncated=result.truncated)
        if step.exec_status != "infra_error" and not episode.state.infra_error:
            break
        rollout = replace(rollout, infra_failures=rollout.infra_failures + 1)
    else:
        detail = step.exec_result.detail if step.exec_result is not None else ""
        raise InfraFailure(rollout, f"sandbox failed {max_infra_retries + 1} times on turn {step.turn}: {detail}")
    return replace(rollout, state=episode.state, steps=(*rollout.steps, step_row(rollout, result, step)))


def finish(rollout: Rollout, gamma: float) -> tuple[TrajectoryRow, list[StepRow]]:
    """Close a finished trajectory: returns-to-go on its steps, and its trajectory row."""
    # rewards as the table stores them (float32), so the stored R_t equals what credit recomputes from them
    rewards = np.array([s.step_reward for s in rollout.steps], np.float32).astype(np.float64)
    n = len(rewards)
    rtg = returns_to_go(rewards, np.zeros(n, np.int64), np.arange(n), gamma) if n else rewards
    steps = [replace(s, return_to_go=float(r)) for s, r in zip(rollout.steps, rtg, strict=True)]
    state = rollout.state
    status = "finished" if state.done and (steps and steps[-1].action_kind == "finish") else "max_turns"
    traj = TrajectoryRow(
        traj_id=rollout.traj_id, run_id=rollout.run_id, task_id=rollout.task.task_id, round=rollout.round,
        policy_version=rollout.policy_version, sample_index=rollout.sample_index, seed=rollout.seed,
        n_turns=n, episode_return=float(rtg[0]) if n else 0.0, outcome=float(state.outcome or 0.0), status=status,
    )
    return traj, steps


def dead_letter(failure: InfraFailure) -> DeadLetterRow:
    r = failure.rollout
    payload = {"traj_id": r.traj_id, "task_id": r.task.task_id, "turn": r.turn, "sample_index": r.sample_index,
               "steps_so_far": len(r.steps)}
    return DeadLetterRow(key=r.traj_id, stage=SANDBOX_LOST, reason=failure.reason, payload_json=json.dumps(payload))


def run_rollouts(rollouts: Sequence[Rollout], generate: Any, tokenizer: Any, executor: Executor,
                 settings: EpisodeSettings, *, gamma: float, batch_size: int = 8
                 ) -> tuple[list[TrajectoryRow], list[StepRow], list[DeadLetterRow]]:
    """The plain-loop driver: turn by turn, batch the active rollouts' generations, then execute each.

    `generate(requests) -> results` is any generator (`TransformersGenerator.generate`). Returns the
    trajectory rows, step rows and dead letters, in a canonical order. A progress bar counts finished episodes.
    """
    active = list(rollouts)
    done: list[Rollout] = []
    dead: list[DeadLetterRow] = []
    with progress_bar("episodes", len(active), unit="ep") as bar:
        while active:
            requests = [prompt_request(r, tokenizer, settings) for r in active]
            results: list[GenerationResult] = []
            for i in range(0, len(requests), batch_size):
                results += generate(requests[i: i + batch_size])
            nxt = []
            for r, res in zip(active, results, strict=True):
                try:
                    r = advance(r, res, executor, settings)
                except InfraFailure as failure:
                    dead.append(dead_letter(failure))
                    continue
                (done if r.done else nxt).append(r)
            bar.update(len(active) - len(nxt))  # finished or dead-lettered this turn
            active = nxt
    trajs, steps = [], []
    for r in sorted(done, key=lambda r: r.traj_id):
        t, s = finish(r, gamma)
        trajs.append(t)
        steps += s
    return trajs, steps, dead
