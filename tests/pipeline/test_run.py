"""One pipeline round end to end with the tiny policy on CPU, and the kill-and-rerun guarantee."""

from __future__ import annotations

import hashlib
import shutil
from collections import defaultdict

import numpy as np
import pytest

from pipeline import schema
from pipeline.config import load_config
from pipeline.run import ROUND_STAGES, STAGES, RoundConflict, run_round, stage_inputs
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
    assert resumed.skipped == ["rollouts"] and list(resumed.stage_seconds) == ["credit"]
    assert _checksums(resumed.round_dir) == _checksums(res.round_dir)


def test_round_written_with_another_config_is_refused(full_round, tiny_policy, tasks):
    cfg, res = full_round
    other = cfg.model_copy(update={"credit": cfg.credit.model_copy(update={"lam": 0.5})})
    with pytest.raises(RoundConflict, match="nothing was overwritten"):
        run_round(other, 0, tiny_policy, tasks)


def _copy(cfg, tmp_path, *overrides):
    """A copy of the round's run folder and the same config pointed at it, with `overrides`."""
    shutil.copytree(cfg.run.root, tmp_path / "runs")
    return _config(tmp_path / "runs", **dict(o.split("=", 1) for o in overrides))


def test_settings_no_stage_reads_do_not_block_a_resume(full_round, tmp_path, tiny_policy, tasks):
    cfg, res = full_round
    other = _copy(cfg, tmp_path, "logging.level=DEBUG", "logging.jsonl=false", "eval.max_tasks=3",
                  "train.lr=0.5", "pipeline.num_shards=2", "pipeline.runner=DirectRunner")
    again = run_round(other, 0, tiny_policy, tasks)
    assert again.stage_seconds == {} and again.skipped == list(STAGES)


def test_a_key_rollouts_read_is_refused_naming_stage_and_key(full_round, tmp_path, tiny_policy, tasks):
    cfg, res = full_round
    before = _checksums(res.round_dir)
    for key, old, new in (("episode.max_turns", 3, 4), ("credit.gamma", 0.95, 0.9)):
        other = _config(cfg.run.root, **{key: new})
        with pytest.raises(RoundConflict) as e:
            run_round(other, 0, tiny_policy, tasks)
        assert f"stage rollouts was completed with other inputs: {key} {old} -> {new}." in str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(RoundConflict, match="stage rollouts .*: tasks "):  # other training tasks
        run_round(cfg, 0, tiny_policy, tasks[:2])
    other_policy = shutil.copytree(tiny_policy, tmp_path / "policy")
    (other_policy / "config.json").write_text((other_policy / "config.json").read_text() + "\n")
    with pytest.raises(RoundConflict, match="stage rollouts .*: policy_version "):
        run_round(cfg, 0, other_policy, tasks)
    assert _checksums(res.round_dir) == before


def test_a_credit_key_refuses_credit_but_keeps_rollouts(full_round, tmp_path, tiny_policy, tasks):
    cfg, res = full_round
    other = _copy(cfg, tmp_path, "credit.lam=0.5")
    with pytest.raises(RoundConflict, match=r"stage credit .*: credit\.lam 1\.0 -> 0\.5\."):
        run_round(other, 0, tiny_policy, tasks)
    # the same change after a run stopped behind rollouts: rollouts is kept, credit runs with the new key
    rd = schema.round_dir(other.run.root, other.run.run_id, 0)
    manifest = schema.read_manifest(rd)
    del manifest.stages["credit"]
    schema.write_manifest(manifest, rd)
    rollout_tables = {k: v for k, v in _checksums(rd).items() if k.split("/")[0] in ("trajectories", "steps")}
    resumed = run_round(other, 0, tiny_policy, tasks)
    assert resumed.skipped == ["rollouts"] and list(resumed.stage_seconds) == ["credit"]
    assert {k: v for k, v in _checksums(rd).items() if k in rollout_tables} == rollout_tables
    assert schema.read_manifest(rd).stages["credit"]["inputs"]["credit.lam"] == 0.5


def test_stage_inputs_hold_only_what_each_stage_reads(tasks):
    base = _config("runs")
    inputs = stage_inputs(base, version="v", tasks=tasks)
    assert list(inputs) == [s.name for s in ROUND_STAGES] and inputs["credit"]["rollouts stage"]
    same = stage_inputs(_config("elsewhere", **{"logging.level": "ERROR", "eval.samples": 3, "run.rounds": 5}),
                        version="v", tasks=tasks)
    assert {s: same[s] for s in STAGES} == {s: inputs[s] for s in STAGES}
    lam = stage_inputs(_config("runs", **{"credit.lam": 0.5}), version="v", tasks=tasks)
    assert lam["rollouts"] == inputs["rollouts"] and lam["credit"] != inputs["credit"]
    assert lam["train"]["credit stage"] != inputs["train"]["credit stage"]  # upstream fingerprints
    assert stage_inputs(base, version="v", tasks=tasks[:2])["rollouts"]["tasks"] != inputs["rollouts"]["tasks"]


def test_the_stored_advantages_are_the_credit_paths_and_sql_recomputes_them(full_round):
    """The table the trainer reads is the credit core's (through Beam, per task); the DuckDB recomputation
    over the round's tables agrees with it (the parity check that is all the SQL path is for now)."""
    from pipeline.credit import compute_credit
    from pipeline.credit_io import result_columns, steps_from_table
    from pipeline.sqlrun import sql_advantages

    cfg, res = full_round
    steps = schema.read_table(schema.table_dir(res.round_dir, "steps"), "steps")
    python = result_columns(compute_credit(steps_from_table(steps), cfg.credit), "advantages")
    stored = schema.read_table(schema.table_dir(res.round_dir, "advantages"), "advantages").to_pylist()
    sql = {r["row_id"]: r for r in sql_advantages(res.round_dir, lam=cfg.credit.lam,
                                                  adv_norm=cfg.credit.adv_norm).to_pylist()}
    assert len(stored) == len(python["row_id"]) == len(sql)
    by_row = {r["row_id"]: r for r in stored}
    for rid, a_e, tokens in zip(python["row_id"], python["episode_advantage"], python["token_advantages"],
                                strict=True):
        assert by_row[rid]["episode_advantage"] == pytest.approx(a_e, abs=1e-6)
        np.testing.assert_allclose(by_row[rid]["token_advantages"], tokens, atol=1e-6)
        np.testing.assert_allclose(sql[rid]["token_advantages"], by_row[rid]["token_advantages"], atol=1e-5)


def test_a_restarted_stage_clears_its_own_outputs_and_dead_letters_only(tmp_path):
    """Dead letters are a declared output: the credit stage's parts of the shared table go with its tables,
    the rollouts stage's stay, and so do the rollouts' tables."""
    from pipeline import schema
    from pipeline.run import STAGE

    lost = {"key": "k", "stage": "execute", "reason": "r", "payload_json": "{}"}
    folder = schema.table_dir(tmp_path, "dead_letter")
    for stage in ("rollouts", "credit"):
        schema.write_table([lost], folder, "dead_letter", part=f"{STAGE[stage].dead_letter_prefix}00000")
    for table in ("steps", "advantages"):
        schema.table_dir(tmp_path, table).mkdir(parents=True)
    STAGE["credit"].clear(tmp_path)
    assert [p.name for p in schema.part_files(folder)] == ["part-rollouts-00000.parquet"]
    assert schema.table_dir(tmp_path, "steps").is_dir() and not schema.table_dir(tmp_path, "advantages").exists()
    assert STAGE["credit"].outputs[-1] == "dead_letter" and STAGE["train"].outputs == ()


def test_a_round_rolls_out_its_per_round_batch_of_the_pool(tmp_path, tiny_policy, tasks):
    from pipeline.tasks.settings import round_tasks

    cfg = _config(tmp_path, **{"tasks.per_round": 1, "pipeline.samples_per_task": 2})
    ids = []
    for k in (0, 1):
        res = run_round(cfg, k, tiny_policy, tasks, stop_after="rollouts")
        trajs = schema.read_table(schema.table_dir(res.round_dir, "trajectories"), "trajectories").to_pylist()
        ids.append({t["task_id"] for t in trajs})
        assert [t.task_id for t in res.tasks] == [t.task_id for t in round_tasks(tasks, k, 1, cfg.run.seed)]
        assert ids[-1] == {res.tasks[0].task_id}
    assert ids[0] != ids[1]  # the next round, the next batch
    assert run_round(cfg, 1, tiny_policy, tasks, stop_after="rollouts").skipped == ["rollouts"]  # resumes
