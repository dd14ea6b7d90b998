"""Multi-turn rollouts on Beam: each turn is a batched generation stage followed by an execution stage.

    tasks | Rollouts(...) -> {"trajectories", "steps", "dead_letter"}

    Start            task -> its G rollouts (seeded by run, round, task, sample)
    Turn<k>/Prompt     render + tokenize the prompt            (tokenizer loaded in DoFn.setup)
    Turn<k>/Generate   RunInference(KeyedModelHandler(policy)) (model loaded by the handler)
    Turn<k>/Execute    parse, apply, run tests in the sandbox   (worker pool started in DoFn.setup)
                       -> finished rollouts leave early; sandbox failures go to the dead-letter output
    Finish           returns-to-go, trajectory rows
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
from apache_beam.utils import shared

from pipeline.agent.settings import EpisodeSettings
from pipeline.rollout import (
    InfraFailure,
    Rollout,
    advance,
    dead_letter,
    finish,
    prompt_request,
    start_rollouts,
)
from pipeline.sandbox.settings import SandboxSettings

ACTIVE, DONE, DEAD = "active", "done", "dead_letter"
_NS = "didpo_rollouts"


class _Judge:
    """A per-process sandbox pool + judge, shared by every turn's Execute DoFn (weak-referenceable holder)."""

    def __init__(self, settings: SandboxSettings) -> None:
        from pipeline.sandbox import Judge, SandboxPool

        self.pool = SandboxPool(settings)
        self.judge = Judge(self.pool)


class _Progress:
    """A per-process bar of finished trajectories, shared by every turn's Execute DoFn. In a local runner it is
    the run's bar; a distributed worker's counts only its own share (its logs, not the console)."""

    def __init__(self, total: int | None) -> None:
        from pipeline.telemetry import progress_bar

        self.bar = progress_bar("trajectories", total, unit="traj")

    def done(self) -> None:
        self.bar.update(1)
        if self.bar.total is not None and self.bar.n >= self.bar.total:
            self.bar.close()


class PromptFn(beam.DoFn):
    def __init__(self, checkpoint: str, settings: EpisodeSettings) -> None:
        self.checkpoint, self.settings = checkpoint, settings

    def setup(self) -> None:
        from pipeline.policy.loading import load_tokenizer

        self.tokenizer = load_tokenizer(self.checkpoint)

    def process(self, rollout: Rollout):
        yield rollout, prompt_request(rollout, self.tokenizer, self.settings)


class ExecuteFn(beam.DoFn):
    def __init__(self, sandbox: SandboxSettings, settings: EpisodeSettings, judge_handle: shared.Shared,
                 progress_handle: shared.Shared | None = None, total: int | None = None) -> None:
        self.sandbox, self.settings, self.judge_handle = sandbox, settings, judge_handle
        self.progress_handle, self.total = progress_handle, total
        self.steps = Metrics.counter(_NS, "steps")
        self.dead = Metrics.counter(_NS, "dead_letter")

    def setup(self) -> None:
        self._holder = self.judge_handle.acquire(lambda: _Judge(self.sandbox), tag=self.sandbox.model_dump_json())
        self._progress = (self.progress_handle.acquire(lambda: _Progress(self.total), tag=f"trajectories/{self.total}")
                          if self.progress_handle is not None else None)

    def _finished(self) -> None:
        if self._progress is not None:
            self._progress.done()

    def process(self, element: tuple[Rollout, Any]):
        rollout, result = element
        try:
            rollout = advance(rollout, result, self._holder.judge, self.settings)
        except InfraFailure as failure:
            self.dead.inc()
            self._finished()
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(failure))
            return
        last = rollout.steps[-1]
        self.steps.inc()
        Metrics.counter(_NS, f"exec_{last.exec_status}").inc()
        Metrics.counter(_NS, f"action_{last.action_kind}").inc()
        if rollout.done:
            self._finished()
            yield beam.pvalue.TaggedOutput(DONE, rollout)
        else:
            yield rollout


class RolloutTurn(beam.PTransform):
    """One turn for every active rollout: Prompt -> Generate -> Execute; outputs active, done, dead_letter."""

    def __init__(self, handler: Any, checkpoint: str, episode: EpisodeSettings, sandbox: SandboxSettings,
                 judge_handle: shared.Shared, progress_handle: shared.Shared | None = None,
                 total: int | None = None) -> None:
        super().__init__()
        self.handler, self.checkpoint = handler, checkpoint
        self.episode, self.sandbox, self.judge_handle = episode, sandbox, judge_handle
        self.progress_handle, self.total = progress_handle, total

    def expand(self, active: beam.PCollection):
        return (
            active
            | "Prompt" >> beam.ParDo(PromptFn(self.checkpoint, self.episode))
            | "Generate" >> RunInference(KeyedModelHandler(self.handler))
            | "Execute" >> beam.ParDo(ExecuteFn(self.sandbox, self.episode, self.judge_handle,
                                                self.progress_handle, self.total)).with_outputs(
                DONE, DEAD, main=ACTIVE)
        )


class Rollouts(beam.PTransform):
    """tasks -> {"trajectories": TrajectoryRow, "steps": StepRow, "dead_letter": DeadLetterRow}."""

    def __init__(self, *, handler: Any, checkpoint: str, policy_version: str, run_id: str, round_k: int,
                 samples: int, root_seed: int, gamma: float, episode: EpisodeSettings,
                 sandbox: SandboxSettings, trajectories: int | None = None) -> None:
        super().__init__()
        self.trajectories = trajectories  # expected count, for the progress bar (None: a bar without a total)
        self.handler, self.checkpoint, self.policy_version = handler, checkpoint, policy_version
        self.run_id, self.round_k, self.samples, self.root_seed = run_id, round_k, samples, root_seed
        self.gamma, self.episode, self.sandbox = gamma, episode, sandbox

    def expand(self, tasks: beam.PCollection):
        judge_handle, progress_handle = shared.Shared(), shared.Shared()
        active = tasks | "Start" >> beam.FlatMap(
            start_rollouts, run_id=self.run_id, round_k=self.round_k, samples=self.samples,
            root_seed=self.root_seed, policy_version=self.policy_version)
        finished, dead = [], []
        for k in range(self.episode.max_turns):  # every episode ends by max_turns: nothing is left active
            out = active | f"Turn{k + 1}" >> RolloutTurn(self.handler, self.checkpoint, self.episode, self.sandbox,
                                                         judge_handle, progress_handle, self.trajectories)
            finished.append(out[DONE])
            dead.append(out[DEAD])
            active = out[ACTIVE]
        closed = (
            tuple(finished) | "CollectFinished" >> beam.Flatten()
            | "Finish" >> beam.Map(finish, self.gamma)
        )
        return {
            "trajectories": closed | "TrajectoryRows" >> beam.Map(lambda t: t[0]),
            "steps": closed | "StepRows" >> beam.FlatMap(lambda t: t[1]),
            "dead_letter": tuple(dead) | "CollectDeadLetters" >> beam.Flatten(),
        }
