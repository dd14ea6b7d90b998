"""Runs under an object-store root, against the real fake-gcs-server on loopback (`gcs_emulator`): table parts,
manifests and checkpoints go through `pipeline.storage`; DuckDB reads the parts through the fsspec filesystem."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from builders import FIX, OTHER, advantage_row, rewrite_step, step_row, write_steps_and_advantages

from pipeline import schema, storage
from pipeline.config import ConfigError, load_config
from pipeline.sqlrun import connect_round, resolve_round
from workflows.cli import main


def _run_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    out, err = capsys.readouterr()
    return stop.value.code, out, err


def test_location_keeps_local_paths_and_makes_urls_remote(tmp_path):
    assert storage.location(tmp_path) == tmp_path and isinstance(storage.location(str(tmp_path)), Path)
    assert storage.location(f"file://{tmp_path}") == tmp_path
    remote = storage.location("gs://bucket/runs") / "x" / "round=0"
    assert not isinstance(remote, Path) and str(remote) == "gs://bucket/runs/x/round=0"
    assert str(schema.round_dir("gs://bucket/runs", "x", 2)) == "gs://bucket/runs/x/round=2"


def test_a_root_without_a_filesystem_is_refused_naming_the_scheme():
    with pytest.raises(ConfigError, match=r"run.root: .*no filesystem for nosuch://"):
        load_config(None, ["run.root=nosuch://bucket/runs"])
    assert load_config(None, ["run.root=gs://bucket/runs"]).run.root == "gs://bucket/runs"


def test_tables_and_manifest_round_trip_through_the_emulator(gcs_bucket):
    round_dir = schema.round_dir(f"{gcs_bucket}/runs", "r", 0)
    rows = [rewrite_step(f"t/{t}", i, FIX if i % 2 else OTHER, float(i % 2)) for t in range(2) for i in range(3)]
    written = schema.write_table(rows, schema.table_dir(round_dir, "steps"), "steps", part=1)
    assert str(written) == f"{round_dir}/steps/part-00001.parquet"
    again = schema.read_table(schema.table_dir(round_dir, "steps"), "steps")
    assert again.equals(schema.to_arrow("steps", rows))
    manifest = schema.Manifest(run_id="r", round=0, config_hash="c", git_sha="g", policy_checkpoint="p",
                               row_counts={"steps": len(rows)})
    schema.write_manifest(manifest, round_dir)
    assert schema.read_manifest(round_dir) == manifest
    assert str(resolve_round(f"{gcs_bucket}/runs/r")) == str(round_dir)  # the latest round of a run


def test_a_corrupt_object_is_refused_naming_its_url(gcs_bucket):
    folder = storage.location(f"{gcs_bucket}/runs/r/round=0/steps")
    folder.fs.pipe(f"{folder.path}/part-00000.parquet", b"torn upload")
    with pytest.raises(schema.SchemaError, match=rf"{gcs_bucket}/runs/r/round=0/steps/part-00000.parquet: not a "):
        schema.read_table(folder, "steps")
    with pytest.raises(schema.SchemaError, match="no manifest"):
        schema.read_manifest(folder.parent)


def test_duckdb_reads_a_round_in_place_through_fsspec(gcs_bucket):
    round_dir = storage.location(f"{gcs_bucket}/runs/r/round=0")
    steps = [step_row(f"s{i}", f"t{i}", "task", response_token_ids=[5, 6], step_reward=float(i)) for i in range(4)]
    write_steps_and_advantages(round_dir, steps, [advantage_row(s["row_id"], s["traj_id"], "task", [0.5, 0.5])
                                                  for s in steps])
    con = connect_round(round_dir, absent_as_empty=True)
    try:
        assert con.execute("SELECT count(*), sum(step_reward) FROM steps").fetchone() == (4, 6.0)
        assert con.execute("SELECT count(*) FROM anchors").fetchone() == (0,)  # absent: empty
    finally:
        con.close()


def test_a_remote_checkpoint_is_copied_once_and_again_when_it_changes(gcs_bucket, tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text('{"a": 1}')
    (src / "weights.bin").write_bytes(b"0" * 100)
    remote = storage.location(f"{gcs_bucket}/ckpt")
    storage.put_folder(src, remote)
    first = storage.local_copy(remote)
    assert first.is_dir() and (first / "config.json").read_text() == '{"a": 1}'
    assert storage.local_copy(str(remote)) == first  # unchanged objects: the same copy
    remote.joinpath("config.json").write_text('{"a": 2}')
    second = storage.local_copy(remote)
    assert second != first and (second / "config.json").read_text() == '{"a": 2}'
    with pytest.raises(FileNotFoundError, match="no objects under it"):
        storage.local_copy(f"{gcs_bucket}/nothing")


# ---- a whole round under gs:// --------------------------------------------------------------------------------


def _config(root, *extra: str):
    return load_config(None, [f"run.root={root}", "policy.size=tiny", "policy.max_new_tokens=32",
                              "episode.max_turns=2", "episode.max_response_tokens=32", "pipeline.samples_per_task=2",
                              "pipeline.num_shards=2", "sandbox.pool_size=1", *extra])


def _checksums(round_dir) -> dict[str, str]:
    return {f"{table}/{part.name}": hashlib.sha256(part.read_bytes()).hexdigest()
            for table in schema.TABLES if schema.table_dir(round_dir, table).exists()
            for part in schema.part_files(schema.table_dir(round_dir, table))}


@pytest.mark.slow
def test_a_round_under_gs_writes_the_objects_of_a_local_root_and_everything_reads_them(
        gcs_bucket, tiny_policy, tmp_path, capsys):
    from pipeline.run import run_round
    from pipeline.tasks import load_source

    tasks = load_source("mbpp", split="train", limit=2)
    local = run_round(_config(tmp_path / "runs"), 0, tiny_policy, tasks)
    root = f"{gcs_bucket}/runs"
    # killed after the rollouts stage, with a torn object of the next stage left behind ...
    partial = run_round(_config(root), 0, tiny_policy, tasks, stop_after="rollouts")
    assert list(partial.stage_seconds) == ["rollouts"] and str(partial.round_dir).startswith("gs://")
    torn = schema.table_dir(partial.round_dir, "subdiffs") / "part-00007.parquet"
    torn.fs.pipe(torn.path, b"torn")
    # ... a rerun finishes with exactly the objects a local root holds as files
    remote = run_round(_config(root), 0, tiny_policy, tasks)
    assert remote.skipped == ["rollouts"] and list(remote.stage_seconds) == ["credit"]
    expected = _checksums(local.round_dir)
    assert {"steps/part-00000.parquet", "advantages/part-00001.parquet"} <= set(expected)
    assert _checksums(remote.round_dir) == expected
    assert schema.read_manifest(remote.round_dir).row_counts == local.manifest.row_counts

    # didpo sql reads the round in place (DuckDB through fsspec), the same answer as the local folder
    answers = []
    for run in (str(local.round_dir), str(remote.round_dir)):
        out = tmp_path / f"q{len(answers)}.parquet"
        code, stdout, err = _run_cli(capsys, "sql", "reward_by_turn", "--run", run, "--out", str(out))
        assert code in (0, None), err
        answers.append(pq.read_table(out))
    assert answers[0].equals(answers[1]) and answers[0].num_rows > 0

    # didpo report reads the run and writes its page next to it, in the bucket
    code, stdout, err = _run_cli(capsys, "report", "--run", f"{root}/local")
    assert code in (0, None), err
    page = storage.location(f"{root}/local/report/index.html")
    assert page.exists() and "<html" in page.read_text().lower()

    # didpo train reads the round's tables and the policy from the bucket and writes the next policy there;
    # the tiny policy's rollouts have equal outcomes: nothing to train, nothing written
    train = ("train", "--round", str(remote.round_dir), "--policy", str(tiny_policy), "--out",
             f"{root}/local/round=0/policy", "--set", "train.epochs=1", "--set", "train.max_tokens_per_batch=256")
    code, stdout, err = _run_cli(capsys, *train)
    assert code in (0, None), err
    policy = storage.location(f"{root}/local/round=0/policy")
    assert "nothing to train: " in stdout and not policy.exists()
    advantages = schema.table_dir(remote.round_dir, "advantages")  # every token an advantage of 1 to learn from
    table = schema.read_table(advantages, "advantages")
    ones = pa.array([[1.0] * len(a) for a in table.column("token_advantages").to_pylist()], pa.list_(pa.float32()))
    storage.remove_tree(advantages)
    idx = table.schema.get_field_index("token_advantages")
    schema.write_table(table.set_column(idx, table.schema.field(idx), ones), advantages, "advantages")
    code, stdout, err = _run_cli(capsys, *train)
    assert code in (0, None), err
    report = json.loads((policy / "train_report.json").read_text())
    assert report["completed"] and report["out_dir"] == str(policy)
    names = {p.name for p in policy.iterdir()}
    assert {"config.json", "model.safetensors", "train_report.json"} <= names and "train_state" not in names
    assert storage.local_copy(policy).joinpath("model.safetensors").is_file()  # the next round's policy


@pytest.mark.slow
def test_a_cold_start_finished_in_the_bucket_is_reused_not_redone(gcs_bucket, tiny_policy, tmp_path, monkeypatch):
    """Another machine (no local staging folder) resuming an object-store run checks the bucket's SFT against
    its inputs and reuses it."""
    import yaml
    from rich.console import Console

    from pipeline.policy import loading
    from pipeline.tasks.settings import resolve_tasks
    from training import sft
    from training.config import load_config as load_didpo
    from workflows.rounds import cold_start

    small = {"tasks": {"train": [{"source": "mbpp", "split": "train", "limit": 2}],
                       "eval": [{"source": "humanevalfix", "limit": 1}]},
             "sft": {"max_steps": 2, "warmup_steps": 1, "rl_task_episodes": 1,
                     "tasks": {"train": [{"source": "mbpp", "split": "train", "limit": 2}],
                               "eval": [{"source": "humaneval", "limit": 1}]}}}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    cfg = load_didpo(tmp_path / "small.yaml", [f"run.root={gcs_bucket}/runs"])
    _, eval_tasks = resolve_tasks(cfg.tasks)
    run_dir = storage.location(cfg.run.root) / cfg.run.run_id
    first = cold_start(cfg, tiny_policy, eval_tasks, run_dir, Console(quiet=True))
    report = json.loads((first / sft.REPORT_NAME).read_text())
    assert str(first).startswith("gs://") and report["total_steps"] == 2
    storage.remove_tree(storage.work_dir(first))  # the staging folder of the machine that trained it
    monkeypatch.setattr(loading, "load_policy", lambda *a, **k: pytest.fail("the finished SFT was trained again"))
    again = cold_start(cfg, tiny_policy, eval_tasks, run_dir, Console(quiet=True))
    assert str(again) == str(first) and json.loads((again / sft.REPORT_NAME).read_text()) == report
