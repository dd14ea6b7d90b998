"""A run from scripted episodes: each rollout writes the reference (or the reference with a bug), then
finishes; executed without the sandbox, credited with the real credit core, written as contract tables. The
report and explorer tests read it as they would a real run."""

from __future__ import annotations

import dataclasses

from builders import ChatTokenizerStub

from pipeline import schema
from pipeline.agent.settings import EpisodeSettings
from pipeline.credit import CreditSettings, compute_credit
from pipeline.credit_io import result_tables, step_inputs
from pipeline.policy.generation import GenerationResult
from pipeline.rollout import row_id, run_rollouts, start_rollouts
from pipeline.sandbox.judge import ExecResult

BUG = "    return None  # gave up\n"
LOST = "# the sandbox dies on this one\n"


class _Executor:
    """Passes a workspace unless a file holds the bug line (the sandbox's verdict, without the sandbox)."""

    def run(self, task, files, *, hidden=False):
        ok = not any(BUG in text for text in files.values())
        total = task.hidden_tests.n_cases if hidden else task.visible_tests.n_cases
        if any(LOST in text for text in files.values()):  # every retry fails: the rollout reaches the cap
            return ExecResult("infra_error", 0, total, 0.0, "test", detail="worker died")
        return ExecResult("passed" if ok else "failed", total if ok else 0, total, 0.0, "test")


def _result(request, text: str) -> GenerationResult:
    """`text` as 3-character tokens."""
    starts = list(range(0, len(text), 3))
    ends = [min(s + 3, len(text)) for s in starts]
    return GenerationResult(request.key, request.prompt_token_ids, [7] * len(starts), text, starts, ends,
                            [-0.5] * len(starts), False)


def write_round(run_dir, k: int, tasks, buggy_samples: set[int], heldout: float,
                lost_samples: frozenset[int] = frozenset()) -> None:
    """One round of a run: G=4 scripted episodes per task (write the reference, or the reference with a bug
    appended, then finish), executed, credited with the real credit core, written as contract tables.
    `lost_samples` write a file the sandbox always fails on: they end in the dead_letter table."""
    rollouts = [r for t in tasks for r in start_rollouts(t, run_id=run_dir.name, round_k=k, samples=4, root_seed=0,
                                                         policy_version=f"v{k}")]
    script = {}
    for r in rollouts:
        (path, text), = r.task.reference.items()
        body = text + (BUG if r.sample_index in buggy_samples else "") + (LOST if r.sample_index in lost_samples
                                                                            else "")
        script[row_id(r.traj_id, 0)] = f"<think>\nwrite it <all> & done\n</think>\n<write path=\"{path}\">\n{body}</write>"
        script[row_id(r.traj_id, 1)] = "<think>\nlooks right\n</think>\n<finish/>"
    trajs, steps, dead = run_rollouts(
        rollouts, lambda reqs: [_result(q, script[q.key]) for q in reqs], ChatTokenizerStub(), _Executor(),
        EpisodeSettings(max_turns=2), gamma=0.95)
    assert len(dead) == len(tasks) * len(lost_samples)
    rd = schema.round_dir(run_dir.parent, run_dir.name, k)
    schema.write_table(dead, schema.table_dir(rd, "dead_letter"), "dead_letter")
    schema.write_table(trajs, schema.table_dir(rd, "trajectories"), "trajectories")
    schema.write_table(steps, schema.table_dir(rd, "steps"), "steps")
    credit = compute_credit(step_inputs([dataclasses.asdict(s) for s in steps]), CreditSettings(estimator="didpo"))
    for name, table in result_tables(credit).items():
        schema.write_table(table, schema.table_dir(rd, name), name)
    schema.write_manifest(schema.Manifest(run_dir.name, k, "cfg", "sha", f"v{k}",
                                          stages={"eval": {"metrics": {"pass_rate": heldout}}}), rd)


def two_round_run(run_dir, tasks) -> None:
    """The report and explorer tests' run: round 0 with two of four samples buggy (held-out 0.25), round 1 with
    one (held-out 0.5)."""
    write_round(run_dir, 0, tasks, buggy_samples={2, 3}, heldout=0.25)
    write_round(run_dir, 1, tasks, buggy_samples={3}, heldout=0.5)
