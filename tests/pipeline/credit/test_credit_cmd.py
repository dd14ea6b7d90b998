"""`didpo credit`: steps table in, four contract tables and diagnostics out."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from builders import step_row
from typer.testing import CliRunner

from pipeline.credit import CreditSettings, compute_credit
from pipeline.schema import read_table, to_arrow, write_table
from workflows.credit_cmd import steps_from_table


def _step_row(step) -> dict:
    action = {
        "kind": "edit",
        "edits": [
            {
                "op": e.op,
                "path": e.path,
                "search": e.search,
                "replace": e.replace,
                "search_span": e.search_span,
                "replace_span": e.replace_span,
            }
            for e in step.edits
        ],
    }
    return step_row(
        step.row_id,
        step.traj_id,
        step.task_id,
        turn=step.turn,
        prompt_token_ids=[1, 2],
        response_token_ids=range(step.n_tokens),
        response_text=step.response_text,
        token_char_starts=step.token_char_starts.tolist(),
        token_char_ends=step.token_char_ends.tolist(),
        behavior_logprobs=[0.0] * step.n_tokens,
        action_json=json.dumps(action),
        files_before=[{"path": p, "text": t} for p, t in step.files_before.items()],
        files_after=[{"path": p, "text": t} for p, t in step.files_after.items()],
        workspace_hash_before="h",
        workspace_hash_after="h2",
        step_reward=step.step_reward,
        return_to_go=step.step_reward,
        done=True,
    )


@pytest.fixture
def steps_dir(tmp_path, same_function_batch):
    folder = tmp_path / "steps"
    write_table(to_arrow("steps", [_step_row(s) for s in same_function_batch]), folder, "steps")
    return folder


def _app():
    """The real `didpo` app (its error mapping: a UserError exits 2 with its message); args start "credit"."""
    from workflows.cli import app

    return app


def test_command_writes_the_four_tables_matching_the_library(tmp_path, steps_dir, same_function_batch):
    out = tmp_path / "credit"
    run = CliRunner().invoke(_app(), ["credit", "--steps", str(steps_dir), "--out", str(out), "--set", "credit.lam=0.5",
                                      "--set", "credit.estimator=didpo"])
    assert run.exit_code == 0, run.output
    advantages = read_table(out / "advantages", "advantages").to_pylist()
    expected = compute_credit(same_function_batch, CreditSettings(estimator="didpo", lam=0.5))
    assert [a["row_id"] for a in advantages] == [a.step.row_id for a in expected.advantages]
    for got, want in zip(advantages, expected.advantages, strict=True):
        np.testing.assert_allclose(got["token_advantages"], want.token_advantages, rtol=1e-6)
        assert math.isclose(got["lam"], 0.5)
    anchors = read_table(out / "anchors", "anchors")
    assert anchors.num_rows == 1 and anchors.column("n_rows").to_pylist() == [4]
    assert read_table(out / "anchor_members", "anchor_members").num_rows == 4
    assert read_table(out / "subdiffs", "subdiffs").num_rows == expected.diagnostics.n_candidates
    diagnostics = json.loads((out / "credit_diagnostics.json").read_text())
    assert diagnostics["n_anchors"] == 1 and diagnostics["coverage"] == 1.0


def test_steps_from_table_round_trips_the_pure_inputs(steps_dir, same_function_batch):
    back = steps_from_table(read_table(steps_dir, "steps"))
    for a, b in zip(back, same_function_batch, strict=True):
        assert a.edits == b.edits and a.files_after == b.files_after
        np.testing.assert_array_equal(a.token_char_starts, b.token_char_starts)


def test_command_refuses_bad_settings_and_bad_rows(tmp_path, steps_dir, same_function_batch):
    run = CliRunner().invoke(_app(), ["credit", "--steps", str(steps_dir), "--out", str(tmp_path / "o"), "--set", "credit.estimator=ppo"]
    )
    assert run.exit_code == 2 and "unknown estimator 'ppo'" in run.output
    rows = [_step_row(s) for s in same_function_batch]
    rows[2]["step_reward"] = float("nan")
    bad = tmp_path / "bad"
    write_table(to_arrow("steps", rows), bad, "steps")
    run = CliRunner().invoke(_app(), ["credit", "--steps", str(bad), "--out", str(tmp_path / "o")])
    assert run.exit_code == 1 and "row 'r2'" in run.output and "step_reward" in run.output
    assert not (tmp_path / "o").exists()


def test_a_failure_midway_leaves_no_half_written_output(tmp_path, steps_dir, monkeypatch):
    """The tables are written to a temp folder next to --out and moved into place only when all are there."""
    import workflows.credit_cmd as credit_cmd

    out = tmp_path / "credit"
    assert CliRunner().invoke(_app(), ["credit", "--steps", str(steps_dir), "--out", str(out)]).exit_code == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    written = []

    def write_then_fail(table, folder, name):
        if written:
            raise OSError(28, "No space left on device", str(folder))
        written.append(name)
        return write_table(table, folder, name)

    monkeypatch.setattr(credit_cmd, "write_table", write_then_fail)
    run = CliRunner().invoke(_app(), ["credit", "--steps", str(steps_dir), "--out", str(out), "--set", "credit.lam=0.5"])
    assert run.exit_code != 0 and written
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["credit", "steps"]  # no temp folder left behind


def test_a_rerun_replaces_an_earlier_output_and_an_unwritable_out_is_one_line(tmp_path, steps_dir, capsys):
    from workflows.cli import main

    out = tmp_path / "credit"
    assert CliRunner().invoke(_app(), ["credit", "--steps", str(steps_dir), "--out", str(out), "--set", "credit.lam=0.5"]).exit_code == 0
    (out / "advantages" / "part-00009.parquet").write_bytes(b"stale")  # a leftover the rerun must not keep
    assert CliRunner().invoke(_app(), ["credit", "--steps", str(steps_dir), "--out", str(out)]).exit_code == 0
    assert not (out / "advantages" / "part-00009.parquet").exists()
    assert math.isclose(read_table(out / "advantages", "advantages").column("lam")[0].as_py(), 1.0)

    blocked = tmp_path / "steps" / "part-00000.parquet" / "out"  # a path under a file
    with pytest.raises(SystemExit) as stop:
        main(["credit", "--steps", str(steps_dir), "--out", str(blocked)])
    err = capsys.readouterr().err
    assert stop.value.code != 0 and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("error: ") and "part-00000.parquet" in err
