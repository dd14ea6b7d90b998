"""The data contract refuses what does not honour it, names the place, and writes atomically."""

from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from builders import step_row

from pipeline import schema
from pipeline.schema import SchemaError


def _step(**over):
    base = dict(
        row_id="r0", traj_id="t0", task_id="humaneval/0", response_token_ids=[4, 5], response_text="ab",
        behavior_logprobs=[-0.5, -0.25],
        files_before=[{"path": "solution.py", "text": "x = 1\n"}],
        files_after=[{"path": "solution.py", "text": "x = 2\n"}],
        workspace_hash_before="h0", workspace_hash_after="h1", exec_status="failed",
        visible_total=3, step_reward=0.125, return_to_go=0.375,
    )
    base.update(over)
    return schema.StepRow(**step_row(**base))


def test_every_table_has_a_schema_with_docs_and_version():
    for name in schema.TABLES:
        s = schema.arrow_schema(name)
        assert s.metadata[b"didpo.schema_version"] == str(schema.SCHEMA_VERSION).encode()
        assert all(f.metadata[b"doc"] for f in s), name
        assert s.names == [f.name for f in dataclasses.fields(schema.ROW_TYPES[name])]


def test_roundtrip_rows(tmp_path):
    rows = [_step(), _step(row_id="r1", turn=1, done=True)]
    written = schema.write_table(rows, tmp_path / "steps", "steps")
    assert written.name == "part-00000.parquet"
    assert schema.read_rows(tmp_path / "steps", "steps") == rows


def test_missing_column_names_file_and_column(tmp_path):
    table = schema.to_arrow("steps", [_step()]).drop_columns(["exec_status"])
    bad = tmp_path / "steps" / "part-00000.parquet"
    bad.parent.mkdir()
    pq.write_table(table.replace_schema_metadata(schema.arrow_schema("steps").metadata), bad)
    with pytest.raises(SchemaError) as err:
        schema.read_table(tmp_path / "steps", "steps")
    assert str(bad) in str(err.value) and "'exec_status'" in str(err.value)


def test_wrong_type_names_file_and_column(tmp_path):
    table = schema.to_arrow("advantages", [schema.AdvantageRow("r", "t", "k", "grpo", 0.0, 0.5, [0.5], [1], 0)])
    idx = table.schema.get_field_index("lam")
    table = table.set_column(idx, "lam", pa.array(["one"]))
    bad = tmp_path / "adv.parquet"
    pq.write_table(table.replace_schema_metadata(schema.arrow_schema("advantages").metadata), bad)
    with pytest.raises(SchemaError, match=r"adv\.parquet.*'lam'.*string.*expected float"):
        schema.read_table(bad, "advantages")


def test_newer_schema_version_refused(tmp_path):
    table = schema.to_arrow("steps", [_step()])
    meta = dict(table.schema.metadata)
    meta[b"didpo.schema_version"] = str(schema.SCHEMA_VERSION + 1).encode()
    path = tmp_path / "steps.parquet"
    pq.write_table(table.replace_schema_metadata(meta), path)
    with pytest.raises(SchemaError, match="newer"):
        schema.read_table(path, "steps")


def test_a_version_1_steps_table_reads_with_its_later_column_empty(tmp_path):
    cases = [{"case": "tests.py:3: assert f(2) == 4", "detail": "AssertionError: assert 5 == 4"}]
    table = schema.to_arrow("steps", [_step(failing_cases=cases)])
    assert schema.conform("steps", table).column("failing_cases").to_pylist() == [cases]
    old = table.drop_columns(["failing_cases"])
    meta = dict(table.schema.metadata) | {b"didpo.schema_version": b"1"}
    path = tmp_path / "steps.parquet"
    pq.write_table(old.replace_schema_metadata(meta), path)
    assert schema.read_table(path, "steps").column("failing_cases").to_pylist() == [[]]
    # a current-version file without the column is broken, not old
    pq.write_table(old.replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(SchemaError, match="missing column 'failing_cases'"):
        schema.read_table(path, "steps")


def test_reading_some_columns_returns_them_in_contract_order_and_refuses_an_unknown_one(tmp_path):
    table = schema.to_arrow("steps", [_step(), _step(row_id="r1", turn=1)])
    path = tmp_path / "steps.parquet"
    pq.write_table(table, path)
    some = schema.read_table(path, "steps", columns=["step_reward", "row_id", "failing_cases"])
    assert some.schema.names == ["row_id", "step_reward", "failing_cases"]
    assert some.column("row_id").to_pylist() == ["r0", "r1"]
    assert some.schema.metadata == table.schema.metadata
    with pytest.raises(SchemaError, match=r"table 'steps' has no column\(s\) \['reward'\]"):
        schema.read_table(path, "steps", columns=["row_id", "reward"])
    # a version-1 file lacks the later column: asked for, it comes back with its default
    meta = dict(table.schema.metadata) | {b"didpo.schema_version": b"1"}
    pq.write_table(table.drop_columns(["failing_cases"]).replace_schema_metadata(meta), path)
    old = schema.read_table(path, "steps", columns=["row_id", "failing_cases"])
    assert old.column("failing_cases").to_pylist() == [[], []]
    # a column asked for still has its type checked
    bad = table.set_column(table.schema.get_field_index("turn"), "turn", pa.array(["0", "1"]))
    pq.write_table(bad.replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(SchemaError, match="column 'turn' of table 'steps' has type string"):
        schema.read_table(path, "steps", columns=["turn"])


def test_table_of_another_kind_refused(tmp_path):
    schema.write_table([_step()], tmp_path / "x", "steps")
    with pytest.raises(SchemaError, match="holds table 'steps'"):
        schema.read_table(tmp_path / "x", "advantages")


def test_corrupt_file_refused_with_name(tmp_path):
    bad = tmp_path / "steps" / "part-00000.parquet"
    bad.parent.mkdir()
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(SchemaError, match="part-00000.parquet"):
        schema.read_table(tmp_path / "steps", "steps")


def test_rows_that_do_not_fit_are_refused():
    with pytest.raises(SchemaError, match="lacks column"):
        schema.to_arrow("steps", [{"row_id": "x"}])
    with pytest.raises(SchemaError, match="do not fit"):
        schema.to_arrow("steps", [dataclasses.replace(_step(), turn="zero")])


def test_write_is_atomic_and_leaves_no_temp_on_failure(tmp_path, monkeypatch):
    folder = tmp_path / "steps"
    schema.write_table([_step()], folder, "steps")
    before = (folder / "part-00000.parquet").read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(OSError):
        schema.write_table([_step(row_id="other")], folder, "steps")
    assert (folder / "part-00000.parquet").read_bytes() == before  # old content intact
    assert sorted(os.listdir(folder)) == ["part-00000.parquet"]  # no temp left behind


def test_rewrite_same_part_is_idempotent(tmp_path):
    folder = tmp_path / "steps"
    schema.write_table([_step()], folder, "steps")
    schema.write_table([_step()], folder, "steps")
    assert len(schema.read_table(folder, "steps")) == 1


def test_empty_folder_reads_as_empty_table(tmp_path):
    (tmp_path / "anchors").mkdir()
    t = schema.read_table(tmp_path / "anchors", "anchors")
    assert t.num_rows == 0 and t.schema.names == schema.arrow_schema("anchors").names


def test_unknown_table_and_missing_path():
    with pytest.raises(SchemaError, match="unknown table 'stepz'"):
        schema.arrow_schema("stepz")
    with pytest.raises(SchemaError, match="no such table"):
        schema.read_table("/nonexistent/steps", "steps")


def test_content_id_is_deterministic_and_distinct():
    assert schema.content_id("t", 1) == schema.content_id("t", 1)
    assert schema.content_id("t", 1) != schema.content_id("t", 2)
    assert len(schema.content_id("x")) == 20


def test_manifest_roundtrip_and_refusals(tmp_path):
    m = schema.Manifest(run_id="r", round=0, config_hash="c", git_sha="g", policy_checkpoint="p",
                        seeds={"generation": 1}, row_counts={"steps": 3})
    m.stages["rollouts"] = {"completed_at": "now"}
    schema.write_manifest(m, tmp_path)
    back = schema.read_manifest(tmp_path)
    assert back == m and back.stage_done("rollouts") and not back.stage_done("credit")

    (tmp_path / "manifest.json").write_text('{"run_id": "r", "bogus": 1}')
    with pytest.raises(SchemaError, match="unknown manifest key.*bogus"):
        schema.read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(SchemaError, match="not valid JSON"):
        schema.read_manifest(tmp_path)
    raw = dict(run_id="r", round=0, config_hash="c", git_sha="g", policy_checkpoint="p", schema_version=99)
    (tmp_path / "manifest.json").write_text(__import__("json").dumps(raw))
    with pytest.raises(SchemaError, match="newer"):
        schema.read_manifest(tmp_path)
