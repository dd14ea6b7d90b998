"""One pipeline round end to end with the tiny policy on CPU, and the kill-and-rerun guarantee."""

from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np
import pytest

from pipeline import schema
from pipeline.config import load_config
from pipeline.run import STAGES, RoundConflict, run_round
from pipeline.tasks import load_source

pytestmark = pytest.mark.slow


def _config(root, **extra):
    overrides = [f"run.root={root}", "policy.size=tiny", "policy.max_new_tokens=32", "episode.max_turns=3",
                 "episode.max_response_tokens=32", "pipeline.samples_per_task=4", "sandbox.pool_size=1"]
    return load_config(None, overrides + [f"{k}={v}" for k, v in extra.items()])


@pytest.fixture(scope="module")
def tasks():
    return load_source("mbpp", split="train", limit=3)


def _checksums(round_dir) -> dict[str, str]:
    out = {}
    for table in schema.TABLES:
        for part in schema.part_files(schema.table_dir(round_dir, table)) if (round_dir / table).exists() else []:
            out[f"{table}/{part.name}"] = hashlib.sha256(part.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def full_round(tmp_path_factory, tiny_policy, tasks):
    cfg = _config(tmp_path_factory.mktemp("full"))
    return cfg, run_round(cfg, 0, tiny_policy, tasks)


def test_round_writes_valid_tables(full_round, tasks):
    cfg, res = full_round
    assert list(res.stage_seconds) == list(STAGES)
    tables = {t: schema.read_table(schema.table_dir(res.round_dir, t), t) for t in schema.TABLES}
    steps, trajs, adv = tables["steps"].to_pylist(), tables["trajectories"].to_pylist(), tables["advantages"]
    assert len(trajs) == 3 * 4 and {t["task_id"] for t in trajs} == {t.task_id for t in tasks}
    assert {s["row_id"] for s in steps} == set(adv.column("row_id").to_pylist())
    assert all(s["exec_status"] in schema.EXEC_STATUSES for s in steps)
    assert res.manifest.row_counts["steps"] == len(steps)

    n_tokens = {s["row_id"]: len(s["response_token_ids"]) for s in steps}
    for row in adv.to_pylist():
        assert len(row["token_advantages"]) == n_tokens[row["row_id"]]  # one value per response token

    # A^E sums to ~0 over each task's trajectories (mean_norm)
    first_turn = {s["traj_id"]: s["row_id"] for s in steps if s["turn"] == 0}
    a_e = dict(zip(adv.column("row_id").to_pylist(), adv.column("episode_advantage").to_pylist(), strict=True))
    per_task = defaultdict(list)
    for t in trajs:
        per_task[t["task_id"]].append(a_e[first_turn[t["traj_id"]]])
    assert all(abs(sum(v)) < 1e-4 for v in per_task.values())


def test_rerun_of_a_completed_round_does_nothing(full_round, tiny_policy, tasks):
    cfg, res = full_round
    before = _checksums(res.round_dir)
    again = run_round(cfg, 0, tiny_policy, tasks)
    assert again.stage_seconds == {} and again.skipped == list(STAGES)
    assert _checksums(res.round_dir) == before


def test_killed_run_reruns_to_identical_tables(full_round, tmp_path, tiny_policy, tasks):
    _, res = full_round
    cfg = _config(tmp_path)
    # killed right after the execution stage ...
    partial = run_round(cfg, 0, tiny_policy, tasks, stop_after="rollouts")
    assert list(partial.stage_seconds) == ["rollouts"]
    # ... and while writing the next one: a stray part and a torn temp file are left behind
    (partial.round_dir / "subdiffs").mkdir()
    (partial.round_dir / "subdiffs" / "part-00007.parquet").write_bytes(b"torn")
    resumed = run_round(cfg, 0, tiny_policy, tasks)
    assert resumed.skipped == ["rollouts"] and list(resumed.stage_seconds) == ["credit_units", "advantages"]
    assert _checksums(resumed.round_dir) == _checksums(res.round_dir)


def test_round_written_with_another_config_is_refused(full_round, tiny_policy, tasks):
    cfg, res = full_round
    other = cfg.model_copy(update={"credit": cfg.credit.model_copy(update={"lam": 0.5})})
    with pytest.raises(RoundConflict, match="nothing was overwritten"):
        run_round(other, 0, tiny_policy, tasks)


def test_sql_advantages_match_the_python_core(full_round):
    from pipeline.credit import compute_credit
    from pipeline.credit_io import steps_from_table

    cfg, res = full_round
    steps = schema.read_table(schema.table_dir(res.round_dir, "steps"), "steps")
    python = compute_credit(steps_from_table(steps), cfg.credit).advantages
    sql = schema.read_table(schema.table_dir(res.round_dir, "advantages"), "advantages").to_pylist()
    by_row = {r["row_id"]: r for r in sql}
    for rid, a_e, tokens in zip(python["row_id"], python["episode_advantage"], python["token_advantages"],
                                strict=True):
        assert by_row[rid]["episode_advantage"] == pytest.approx(a_e, abs=1e-5)
        np.testing.assert_allclose(by_row[rid]["token_advantages"], tokens, atol=1e-5)
