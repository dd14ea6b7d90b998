"""The DuckDB layers, analysis queries, token projection and `didpo sql` on a small hand-made round."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from builders import step_row
from typer.testing import CliRunner

from pipeline import schema
from pipeline.sqlrun import (
    MissingTableError,
    SqlError,
    analysis_queries,
    connect_round,
    layered_queries,
    mart_queries,
    project_tokens,
    query_table,
    resolve_round,
    round_metrics,
    run_layers,
    run_query,
    sql_advantages,
)

N_TOK = 12  # response tokens per row; token i covers characters [4i, 4i + 4)
EPS = 1e-6

# (traj_id, task_id, return_to_go per turn, hidden-test outcome); task B has a single rollout.
TRAJECTORIES = [
    ("a1", "A", [1.5, 1.0], 1.0),
    ("a2", "A", [0.3, 0.2], 0.0),
    ("a3", "A", [0.8], 0.0),
    ("b1", "B", [0.6, 0.1], 0.0),
]
ANCHORS = {"g1": 0.5, "g2": 0.7, "g3": 0.5, "g4": 0.5, "g5": 0.3}  # anchor -> GS
# (subdiff_id, anchor_id, row "<traj>t<turn>", token span, a list of disjoint token spans (lines written by two
# edits), or None for "not written by the response")
MEMBERS = [
    ("sd01", "g1", "a1t0", (2, 6)),
    ("sd02", "g1", "a1t0", (8, 10)),  # the same anchor twice in one row: the row counts once in g1's group
    ("sd03", "g1", "a2t0", (1, 5)),
    ("sd04", "g1", "a3t0", (0, 3)),
    ("sd05", "g1", "a2t1", None),  # a deletion without response span: in the group, covers no token
    ("sd06", "g2", "a1t0", (4, 8)),  # higher GS than sd01: wins tokens 4, 5
    ("sd07", "g2", "a2t1", (0, 4)),
    ("sd08", "g3", "a2t0", (3, 9)),  # same GS as sd03, longer span: wins tokens 3, 4
    ("sd09", "g3", "a1t1", (0, 2)),
    ("sd10", "g4", "a3t0", (0, 3)),  # same GS and span as sd04: the smaller subdiff_id (sd04) wins
    ("sd11", "g4", "a1t1", [(5, 6), (8, 9)]),  # two spans: token 6 and 7 between them are not its tokens
    ("sd12", "g5", "b1t0", (0, 12)),
    ("sd13", "g5", "b1t1", (6, 12)),
]
UNANCHORED_SUBDIFFS = [("sd14", "a3t0", (6, 10))]  # changed code that no anchor covers
INVALID_ROWS = {"a2t1": "no action block"}


def _task_of(traj: str) -> str:
    return next(task for t, task, _, _ in TRAJECTORIES if t == traj)


def _step(traj: str, task: str, turn: int, rtg: float, n_turns: int) -> dict:
    row = f"{traj}t{turn}"
    invalid = INVALID_ROWS.get(row)
    return step_row(
        row, traj, task, turn=turn, response_token_ids=range(100, 100 + N_TOK), response_text="abcd" * N_TOK,
        token_char_starts=[4 * i for i in range(N_TOK)], token_char_ends=[4 * i + 4 for i in range(N_TOK)],
        behavior_logprobs=[-0.5] * N_TOK, action_kind="invalid" if invalid else "edit",
        action_status=invalid or "ok", workspace_hash_before="w0", workspace_hash_after="w1",
        exec_status="invalid_action" if invalid else ("passed" if rtg > 0.9 else "failed"),
        visible_total=2, step_reward=rtg / 2, return_to_go=rtg, done=turn == n_turns - 1,
    )


def _spans(span: tuple[int, int] | list[tuple[int, int]] | None) -> list[tuple[int, int]]:
    return [] if span is None else [span] if isinstance(span, tuple) else span


def _subdiff(sid: str, row: str, span: tuple[int, int] | list[tuple[int, int]] | None) -> dict:
    traj = row.split("t")[0]
    tokens = _spans(span)
    bounds = (tokens[0][0], tokens[-1][1]) if tokens else (-1, -1)
    return {
        "subdiff_id": sid, "row_id": row, "traj_id": traj, "task_id": _task_of(traj), "file": "f.py",
        "edit_type": "add" if span else "del", "scale": "hunk", "line_start": 0, "line_end": 2,
        "char_start": 4 * bounds[0] if tokens else -1, "char_end": 4 * bounds[1] if tokens else -1,
        "token_start": bounds[0], "token_end": bounds[1],
        "char_spans": [{"start": 4 * s, "end": 4 * e} for s, e in tokens],
        "token_spans": [{"start": s, "end": e} for s, e in tokens],
        "n_lines": 2, "normalized_text": f"x = {sid}",
    }


def build_round(root: Path) -> Path:
    """A round folder written with the contract's own writer."""
    rnd = schema.round_dir(root, "run", 0)
    steps = [_step(t, task, k, rtg, len(rtgs)) for t, task, rtgs, _ in TRAJECTORIES for k, rtg in enumerate(rtgs)]
    trajs = [
        {"traj_id": t, "run_id": "run", "task_id": task, "round": 0, "policy_version": "p0", "sample_index": i,
         "seed": i, "n_turns": len(rtgs), "episode_return": rtgs[0], "outcome": outcome, "status": "finished"}
        for i, (t, task, rtgs, outcome) in enumerate(TRAJECTORIES)
    ]
    subdiffs = [_subdiff(s, row, span) for s, _, row, span in MEMBERS]
    subdiffs += [_subdiff(s, row, span) for s, row, span in UNANCHORED_SUBDIFFS]
    anchors = []
    for anchor, gs in ANCHORS.items():
        members = [m for m in MEMBERS if m[1] == anchor]
        anchors.append({
            "anchor_id": anchor, "task_id": _task_of(members[0][2].split("t")[0]), "edit_type": "add",
            "n_rows": len({m[2] for m in members}), "n_members": len(members), "mean_lines": 2.0, "gs": gs,
            "representative_subdiff_id": members[0][0], "text": f"text of {anchor}\nline 2",
        })
    members = [
        {"anchor_id": a, "subdiff_id": s, "row_id": row, "task_id": _task_of(row.split("t")[0]),
         "diff_advantage": 0.0}
        for s, a, row, _ in MEMBERS
    ]
    schema.write_table(steps[:5], schema.table_dir(rnd, "steps"), "steps", part=0)  # two parts: read as one
    schema.write_table(steps[5:], schema.table_dir(rnd, "steps"), "steps", part=1)
    schema.write_table(trajs, schema.table_dir(rnd, "trajectories"), "trajectories")
    schema.write_table(subdiffs, schema.table_dir(rnd, "subdiffs"), "subdiffs")
    schema.write_table(anchors, schema.table_dir(rnd, "anchors"), "anchors")
    schema.write_table(members, schema.table_dir(rnd, "anchor_members"), "anchor_members")
    write_advantages(rnd, "grpo")
    return rnd


def write_advantages(rnd: Path, estimator: str) -> dict[str, list[float]]:
    """The stored advantages table of an arm, as the trainer reads it: `grpo` (A^E with mean_std_norm on every
    token) or `didpo` (lambda 1, mean_norm: the reference projection). Returns row_id -> token advantages."""
    rows, out = [], {}
    for t, task, rtgs, _ in TRAJECTORIES:
        for k in range(len(rtgs)):
            row = f"{t}t{k}"
            if estimator == "grpo":
                a_e = reference_episode("mean_std_norm")[row]
                tokens, n_diff = [a_e] * N_TOK, 0
            else:
                a_e = reference_episode("mean_norm")[row]
                tokens, n_diff = reference_tokens(row, 1.0, "mean_norm")
            tokens = [float(np.float32(x)) for x in tokens]
            out[row] = tokens
            rows.append({"row_id": row, "traj_id": t, "task_id": task, "estimator": estimator, "lam": 1.0,
                         "episode_advantage": a_e, "token_advantages": tokens, "loss_mask": [1] * N_TOK,
                         "n_diff_tokens": n_diff})
    folder = schema.table_dir(rnd, "advantages")
    if folder.exists():
        shutil.rmtree(folder)
    schema.write_table(rows, folder, "advantages")
    return out


@pytest.fixture(scope="module")
def round_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_round(tmp_path_factory.mktemp("runs"))


# ---- independent reference ----------------------------------------------------------------------------------


def _normalise(values: np.ndarray, mode: str) -> np.ndarray:
    centered = values - values.mean()
    return centered / (values.std(ddof=0) + EPS) if mode == "mean_std_norm" else centered


def reference_episode(mode: str) -> dict[str, float]:
    """row_id -> A^E."""
    out = {}
    for task in {t[1] for t in TRAJECTORIES}:
        group = [t for t in TRAJECTORIES if t[1] == task]
        adv = _normalise(np.array([rtgs[0] for _, _, rtgs, _ in group]), mode)
        for (traj, _, rtgs, _), a in zip(group, adv, strict=True):
            out.update({f"{traj}t{k}": float(a) for k in range(len(rtgs))})
    return out


def _rtg(row: str) -> float:
    traj, turn = row.split("t")
    return next(rtgs for t, _, rtgs, _ in TRAJECTORIES if t == traj)[int(turn)]


def reference_diff(mode: str) -> dict[tuple[str, str], float]:
    """(anchor_id, row_id) -> A^D, over each anchor's distinct rows."""
    out = {}
    for anchor in ANCHORS:
        rows = sorted({m[2] for m in MEMBERS if m[1] == anchor})
        adv = _normalise(np.array([_rtg(r) for r in rows]), mode)
        out.update({(anchor, r): float(a) for r, a in zip(rows, adv, strict=True)})
    return out


def reference_tokens(row: str, lam: float, mode: str) -> tuple[list[float], int]:
    """Per-token loop: the covering occurrence with the highest GS, then more covered characters, then smaller
    subdiff_id. n_diff counts tokens that received a diff-level term (none when lam = 0)."""
    a_e, a_d = reference_episode(mode)[row], reference_diff(mode)
    values, n_diff = [], 0
    for tok in range(N_TOK):
        covering = [(-ANCHORS[a], -sum(e - b for b, e in _spans(span)), s, a) for s, a, r, span in MEMBERS
                    if r == row and any(b <= tok < e for b, e in _spans(span))]
        if covering:
            _, _, _, anchor = min(covering)
            values.append(a_e + lam * a_d[(anchor, row)])
            n_diff += lam != 0
        else:
            values.append(a_e)
    return values, n_diff


# ---- layers and queries -------------------------------------------------------------------------------------


def test_every_layer_and_analysis_query_runs(round_path: Path) -> None:
    con = connect_round(round_path)
    try:
        created = run_layers(con)
        assert created == [q.name for q in layered_queries()]
        assert created.index("staging_steps") < created.index("anchors_occurrences") < created.index("advantages_rows")
        counts = {name: con.execute(f"SELECT count(*) FROM {name}").fetchone()[0] for name in created}
        results = {q.name: query_table(con, q.name, round_path) for q in analysis_queries()}
    finally:
        con.close()
    assert counts["staging_steps"] == counts["advantages_episode"] == counts["advantages_rows"] == 7
    assert counts["advantages_diff"] == counts["staging_anchor_members"] == len(MEMBERS)
    assert set(results) == {
        "anchors_by_abs_diff_adv", "anchor_size_distribution", "gs_distribution", "coverage_per_task",
        "credit_pass_vs_fail", "invalid_action_reasons", "reward_by_turn",
    }
    assert all(q.header and q.summary for q in analysis_queries() + layered_queries())
    assert results["reward_by_turn"]["n_rows"].to_pylist() == [4, 3]
    invalid = results["invalid_action_reasons"].to_pylist()
    assert [(r["reason"], r["n_rows"]) for r in invalid] == [("no action block", 1)]
    sizes = {r["n_rows"]: r["n_anchors"] for r in results["anchor_size_distribution"].to_pylist()}
    assert sizes == {2: 4, 4: 1}  # g1 has 5 members in 4 distinct rows
    ranked = results["anchors_by_abs_diff_adv"]["mean_abs_diff_adv"].to_pylist()
    assert ranked == sorted(ranked, reverse=True) and len(ranked) == len(ANCHORS)
    assert sum(results["gs_distribution"]["n_anchors"].to_pylist()) == len(ANCHORS)
    by_outcome = {r["outcome"]: r for r in results["credit_pass_vs_fail"].to_pylist()}
    assert by_outcome[1.0]["n_trajectories"] == 1 and by_outcome[0.0]["n_trajectories"] == 3
    assert by_outcome[1.0]["mean_episode_adv_per_trajectory"] > 0 > by_outcome[0.0]["mean_episode_adv_per_trajectory"]


def _pass_vs_fail(rnd: Path) -> dict[float, dict]:
    con = connect_round(rnd)
    try:
        return {r["outcome"]: r for r in query_table(con, "credit_pass_vs_fail", rnd).to_pylist()}
    finally:
        con.close()


def test_credit_pass_vs_fail_reports_what_a_grpo_arm_trained_on(round_path: Path) -> None:
    """The analysis reads the stored table: for a grpo arm, its A^E (mean_std_norm), not the SQL layer's
    recomputation of didpo's (mean_norm), which differs here."""
    stored = schema.read_table(schema.table_dir(round_path, "advantages"), "advantages").to_pylist()
    outcome = {t: o for t, _, _, o in TRAJECTORIES}
    per_traj = {r["traj_id"]: r["episode_advantage"] for r in stored}
    report = _pass_vs_fail(round_path)
    recomputed = reference_episode("mean_norm")
    for o in (0.0, 1.0):
        trajs = [t for t in per_traj if outcome[t] == o]
        expected = float(np.mean([per_traj[t] for t in trajs]))
        assert report[o]["mean_episode_adv_per_trajectory"] == pytest.approx(expected, abs=1e-6)
        assert report[o]["mean_episode_adv_per_trajectory"] != pytest.approx(
            float(np.mean([recomputed[f"{t}t0"] for t in trajs])), abs=1e-3)
        assert report[o]["n_rows_with_diff_term"] == 0  # grpo: one advantage per row


def test_credit_pass_vs_fail_diff_term_is_the_stored_tables(round_path: Path, tmp_path: Path) -> None:
    rnd = tmp_path / "round"
    shutil.copytree(round_path, rnd)
    tokens = write_advantages(rnd, "didpo")
    outcome = {t: o for t, _, _, o in TRAJECTORIES}
    report = _pass_vs_fail(rnd)
    for o in (0.0, 1.0):
        terms = []
        for row, values in tokens.items():
            _, n_diff = reference_tokens(row, 1.0, "mean_norm")
            if outcome[row.split("t")[0]] == o and n_diff:
                a_e = float(np.float32(reference_episode("mean_norm")[row]))
                terms.append(sum(v - a_e for v in values) / n_diff)
        assert report[o]["n_rows_with_diff_term"] == len(terms) > 0
        assert report[o]["mean_diff_term"] == pytest.approx(float(np.mean(terms)), abs=1e-5)


def test_credit_coverage_is_what_the_stored_advantages_cover(round_path: Path, tmp_path: Path) -> None:
    """The mart's coverage (what the summary, the rounds table and the report show): changed tokens whose
    stored advantage has a diff-level term, so 0 for a grpo arm whatever its anchors, and the projection's
    count for a didpo one."""
    changed = {(row, t) for _, _, row, span in MEMBERS for s, e in _spans(span) for t in range(s, e)}
    changed |= {(row, t) for _, row, span in UNANCHORED_SUBDIFFS for s, e in _spans(span) for t in range(s, e)}
    assert round_metrics(round_path)["coverage"] == 0.0
    rnd = tmp_path / "round"
    shutil.copytree(round_path, rnd)
    write_advantages(rnd, "didpo")
    didpo = schema.read_table(schema.table_dir(rnd, "advantages"), "advantages").to_pylist()
    covered = sum(reference_tokens(r["row_id"], 1.0, "mean_norm")[1] for r in didpo)
    assert round_metrics(rnd)["coverage"] == pytest.approx(covered / len(changed)) and 0 < covered < len(changed)


def test_round_metrics_are_the_rounds_figures_with_lost_rollouts_counted(round_path: Path, tmp_path: Path) -> None:
    """The mart every round report reads, against the tables computed by hand; a rollout the sandbox lost
    (dead-lettered at the retry cap) counts as started and not passing, in a task of its own here."""
    rnd = tmp_path / "round"
    shutil.copytree(round_path, rnd)
    adv = write_advantages(rnd, "didpo")
    lost = {"key": "c1", "stage": schema.SANDBOX_LOST, "reason": "sandbox failed 3 times",
            "payload_json": '{"task_id": "C", "sample_index": 0}'}
    other = {"key": "a1t0", "stage": "credit", "reason": "bad row", "payload_json": "{}"}
    schema.write_table([lost, lost, other], schema.table_dir(rnd, "dead_letter"), "dead_letter")
    m = round_metrics(rnd)
    steps = [(f"{t}t{k}", rtg) for t, _, rtgs, _ in TRAJECTORIES for k, rtg in enumerate(rtgs)]
    invalid = len(INVALID_ROWS)
    outcome = {t: o for t, _, _, o in TRAJECTORIES}
    passing = [v for row, values in adv.items() if outcome[row.split("t")[0]] == 1.0 for v in values]
    failing = [v for row, values in adv.items() if outcome[row.split("t")[0]] != 1.0 for v in values]
    assert (m["tasks"], m["rollouts"], m["passed"], m["lost_to_sandbox"]) == (3, 5, 1, 1)
    assert m["pass_rate"] == pytest.approx(1 / 5)
    assert m["mean_return"] == pytest.approx(np.mean([rtgs[0] for _, _, rtgs, _ in TRAJECTORIES]))
    assert m["steps"] == len(steps) and m["invalid_rate"] == pytest.approx(invalid / len(steps))
    assert {s["status"]: s["n"] for s in m["steps_by_status"]} == {"invalid_action": 1, "passed": 2, "failed": 4}
    assert (m["subdiffs"], m["anchors"]) == (len(MEMBERS) + len(UNANCHORED_SUBDIFFS), len(ANCHORS))
    assert m["mean_anchor_rows"] == pytest.approx(np.mean([len({r for _, a, r, _ in MEMBERS if a == g}) for g in ANCHORS]))
    assert m["mixed_groups"] == pytest.approx(1 / 2)  # task A has a pass and fails, task B one outcome
    assert m["mean_adv_passing"] == pytest.approx(np.mean(passing), abs=1e-6)
    assert m["mean_adv_failing"] == pytest.approx(np.mean(failing), abs=1e-6)
    assert m["dead_letters"] == 3
    assert {q.name for q in mart_queries()} == {"round_metrics"}
    assert run_query(rnd, "marts/round_metrics").to_pylist() == [m]  # `didpo sql round_metrics` too


def test_round_metrics_of_a_round_before_credit(round_path: Path, tmp_path: Path) -> None:
    """Rollouts only (no sub-diffs, anchors or advantages yet, no dead letters): counts 0, credit figures None."""
    rnd = tmp_path / "round"
    for table in ("steps", "trajectories"):
        shutil.copytree(schema.table_dir(round_path, table), schema.table_dir(rnd, table))
    m = round_metrics(rnd)
    assert (m["rollouts"], m["anchors"], m["subdiffs"], m["dead_letters"]) == (len(TRAJECTORIES), 0, 0, 0)
    assert m["coverage"] is None and m["mean_anchor_rows"] is None and m["mean_adv_passing"] is None


def test_coverage_counts_changed_and_anchored_tokens(round_path: Path) -> None:
    by_task = {r["task_id"]: r for r in run_query(round_path, "coverage_per_task").to_pylist()}
    # task A anchored tokens per row: a1t0 {2..9}=8, a2t0 {1..8}=8, a3t0 {0,1,2}=3, a2t1 {0..3}=4, a1t1 {0,1,5,6}=4
    assert by_task["A"]["anchored_tokens"] == 27
    assert by_task["A"]["changed_tokens"] == 27 + 4  # sd14 adds tokens 6..9 of a3t0
    assert by_task["B"]["coverage_of_changed"] == pytest.approx(1.0)


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_episode_advantage_matches_reference(round_path: Path, mode: str) -> None:
    got = run_query(round_path, "advantages_episode", {"adv_norm": mode}).to_pylist()
    expected = reference_episode(mode)
    assert len(got) == len(expected)
    for r in got:
        assert r["episode_advantage"] == pytest.approx(expected[r["row_id"]], abs=1e-6), r["row_id"]
    per_traj = {(r["task_id"], r["traj_id"]): r["episode_advantage"] for r in got}
    for task in ("A", "B"):
        assert sum(v for (t, _), v in per_traj.items() if t == task) == pytest.approx(0.0, abs=1e-9)
    assert all(r["episode_advantage"] == 0.0 for r in got if r["task_id"] == "B")  # single rollout


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_diff_advantage_matches_reference(round_path: Path, mode: str) -> None:
    got = run_query(round_path, "advantages_diff", {"adv_norm": mode}).to_pylist()
    expected = reference_diff(mode)
    assert sorted(r["subdiff_id"] for r in got) == sorted(m[0] for m in MEMBERS)
    for r in got:
        assert r["diff_advantage"] == pytest.approx(expected[(r["anchor_id"], r["row_id"])], abs=1e-6)
    by_id = {r["subdiff_id"]: r for r in got}
    assert by_id["sd01"]["diff_advantage"] == by_id["sd02"]["diff_advantage"]
    assert by_id["sd01"]["group_rows"] == 4  # 5 members, 4 distinct rows
    for anchor in ANCHORS:
        distinct = {r["row_id"]: r["diff_advantage"] for r in got if r["anchor_id"] == anchor}
        assert sum(distinct.values()) == pytest.approx(0.0, abs=1e-9)


def test_advantages_rows_lists_occurrences_in_priority_order(round_path: Path) -> None:
    rows = {r["row_id"]: r for r in run_query(round_path, "advantages_rows").to_pylist()}
    assert [o["subdiff_id"] for o in rows["a1t0"]["occurrences"]] == ["sd06", "sd01", "sd02"]
    assert [o["subdiff_id"] for o in rows["a3t0"]["occurrences"]] == ["sd04", "sd10"]
    assert [o["subdiff_id"] for o in rows["a2t1"]["occurrences"]] == ["sd07"]  # sd05 has no tokens
    assert rows["b1t1"]["n_occurrences"] == 1


# ---- token projection -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "lam"), [("mean_norm", 1.0), ("mean_std_norm", 1.2), ("mean_norm", 0.0)])
def test_sql_advantages_match_token_reference(round_path: Path, mode: str, lam: float) -> None:
    table = sql_advantages(round_path, lam=lam, adv_norm=mode)
    assert schema.conform("advantages", table).num_rows == table.num_rows
    rows = table.to_pylist()
    assert [r["row_id"] for r in rows] == sorted(r["row_id"] for r in rows)
    for r in rows:
        values, n_diff = reference_tokens(r["row_id"], lam, mode)
        assert len(r["token_advantages"]) == len(r["loss_mask"]) == N_TOK
        assert r["token_advantages"] == pytest.approx(values, abs=1e-5), r["row_id"]
        assert r["loss_mask"] == [1] * N_TOK
        assert r["n_diff_tokens"] == n_diff
        assert r["estimator"] == "didpo" and r["lam"] == pytest.approx(lam)
        assert r["episode_advantage"] == pytest.approx(reference_episode(mode)[r["row_id"]], abs=1e-6)


def test_highest_gs_wins_and_uncovered_tokens_get_episode_advantage_exactly(round_path: Path) -> None:
    rows = {r["row_id"]: r for r in sql_advantages(round_path, lam=1.0).to_pylist()}
    a_d = reference_diff("mean_norm")
    a1t0 = rows["a1t0"]
    a_e = np.float32(a1t0["episode_advantage"])
    tokens = np.array(a1t0["token_advantages"], np.float32)
    assert tokens[4] == tokens[5] == pytest.approx(a_e + a_d[("g2", "a1t0")], abs=1e-6)  # g2 (GS 0.7) over g1
    assert tokens[2] == pytest.approx(a_e + a_d[("g1", "a1t0")], abs=1e-6)
    for tok in (0, 1, 10, 11):  # outside every anchor
        assert tokens[tok] == a_e
    a2t0 = np.array(rows["a2t0"]["token_advantages"], np.float32)
    assert a2t0[3] == a2t0[4] == pytest.approx(rows["a2t0"]["episode_advantage"] + a_d[("g3", "a2t0")], abs=1e-6)
    a1t1 = rows["a1t1"]  # sd11 covers tokens 5 and 8 only: the tokens between its spans keep A^E
    assert a1t1["token_advantages"][6:8] == [a1t1["episode_advantage"]] * 2
    assert a1t1["token_advantages"][5] == a1t1["token_advantages"][8] != a1t1["episode_advantage"]
    a3t0 = rows["a3t0"]
    assert a3t0["token_advantages"][0] == pytest.approx(a3t0["episode_advantage"] + a_d[("g1", "a3t0")])
    assert a3t0["token_advantages"][6:10] == [a3t0["episode_advantage"]] * 4  # sd14 is not anchored


def _rewrite_steps(rnd: Path, change) -> None:
    rows = [r for r in (change(r) for r in schema.read_table(rnd / "steps", "steps").to_pylist()) if r]
    shutil.rmtree(rnd / "steps")
    schema.write_table(rows, rnd / "steps", "steps")


def test_episode_return_is_the_lowest_turn_rows_return(round_path: Path, tmp_path: Path) -> None:
    rnd = tmp_path / "round=0"
    shutil.copytree(round_path, rnd)
    _rewrite_steps(rnd, lambda r: None if r["row_id"] == "a1t0" else r)  # a1 now starts at turn 1
    got = {r["traj_id"]: r["episode_return"] for r in run_query(rnd, "advantages_episode").to_pylist()}
    assert got == pytest.approx({"a1": 1.0, "a2": 0.3, "a3": 0.8, "b1": 0.6})
    _rewrite_steps(rnd, lambda r: dict(r, turn=0) if r["row_id"] == "b1t1" else r)
    with pytest.raises(SqlError, match=r"trajectory b1 has 2 rows at turn 0"):
        run_query(rnd, "advantages_episode")


def test_round_without_anchors_gives_episode_advantage_everywhere(round_path: Path, tmp_path: Path) -> None:
    bare = tmp_path / "round=0"
    shutil.copytree(round_path, bare)
    shutil.rmtree(bare / "anchor_members")
    (bare / "anchor_members").mkdir()  # a table folder without parts: an empty table
    schema.write_table([], bare / "anchors", "anchors")  # a part with no rows
    for r in sql_advantages(bare, adv_norm="mean_std_norm").to_pylist():
        assert r["token_advantages"] == [r["episode_advantage"]] * N_TOK
        assert r["n_diff_tokens"] == 0


def test_project_tokens_first_occurrence_wins_and_refuses_bad_spans() -> None:
    adv, covered = project_tokens(
        n_tokens=np.array([3, 0, 4]), episode_adv=np.array([1.0, 5.0, -1.0]),
        occ_row=np.array([0, 2, 2]), occ_token_start=np.array([1, 0, 1]), occ_token_end=np.array([3, 2, 4]),
        occ_diff_adv=np.array([0.5, 10.0, 20.0]), lam=2.0,
    )
    assert adv.tolist() == [1.0, 2.0, 2.0, 19.0, 19.0, 39.0, 39.0]
    assert covered.tolist() == [False, True, True, True, True, True, True]
    with pytest.raises(SqlError, match=r"token span \[2, 5\) is not inside the 4 tokens"):
        project_tokens(np.array([4]), np.array([0.0]), np.array([0]), np.array([2]), np.array([5]),
                       np.array([1.0]), lam=1.0)


# ---- bad input ------------------------------------------------------------------------------------------------


def test_missing_table_is_named(round_path: Path, tmp_path: Path) -> None:
    partial = tmp_path / "round=0"
    shutil.copytree(round_path, partial)
    shutil.rmtree(partial / "subdiffs")
    assert run_query(partial, "reward_by_turn").num_rows == 2  # queries that do not need it still run
    with pytest.raises(MissingTableError, match=r"needs table\(s\) subdiffs.*subdiffs"):
        run_query(partial, "coverage_per_task")
    with pytest.raises(MissingTableError, match="subdiffs"):
        sql_advantages(partial)


def test_contract_breaks_are_refused_naming_the_place(round_path: Path, tmp_path: Path) -> None:
    broken = tmp_path / "round=0"
    shutil.copytree(round_path, broken)
    rows = pq.read_table(broken / "subdiffs").to_pylist()
    beyond = [{"start": 0, "end": N_TOK + 3}]
    bad = [dict(r, token_end=N_TOK + 3, token_spans=beyond) if r["subdiff_id"] == "sd12" else r for r in rows]
    schema.write_table(bad, broken / "subdiffs", "subdiffs")
    with pytest.raises(SqlError, match=r"sd12 has token span \[0, 15\) beyond the 12 response tokens of row b1t0"):
        sql_advantages(broken)
    mismatched = [dict(r, token_end=7) if r["subdiff_id"] == "sd12" else r for r in rows]
    schema.write_table(mismatched, broken / "subdiffs", "subdiffs")
    with pytest.raises(SqlError, match=r"sd12 has token bounds \[0, 7\) but token_spans \[\{'start': 0, 'end': 12\}\]"):
        sql_advantages(broken)
    (broken / "anchors" / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(schema.SchemaError, match=r"anchors/part-00000.parquet"):
        run_query(broken, "gs_distribution")


def test_bad_parameters_and_unknown_names_are_refused(round_path: Path) -> None:
    with pytest.raises(SqlError, match="adv_norm"):
        run_query(round_path, "advantages_episode", {"adv_norm": "zscore"})
    with pytest.raises(SqlError, match=r"unknown SQL parameter\(s\) \['gamma'\]"):
        run_query(round_path, "advantages_episode", {"gamma": 0.9})
    with pytest.raises(SqlError, match="no query named 'nope'.*reward_by_turn"):
        run_query(round_path, "nope")


def test_layer_order_follows_references_and_refuses_reading_a_later_layer(tmp_path: Path) -> None:
    (tmp_path / "staging_b.sql").write_text("SELECT * FROM staging_c -- not staging_a\n")
    (tmp_path / "staging_c.sql").write_text("SELECT 'anchors_x' AS s FROM steps\n")
    (tmp_path / "anchors_x.sql").write_text("SELECT * FROM staging_b;\n")
    assert [q.name for q in layered_queries(tmp_path)] == ["staging_c", "staging_b", "anchors_x"]
    (tmp_path / "staging_a.sql").write_text("SELECT * FROM anchors_x\n")
    with pytest.raises(SqlError, match="staging_a.sql: reads anchors_x, a later layer"):
        layered_queries(tmp_path)
    (tmp_path / "staging_a.sql").write_text("SELECT * FROM staging_d\n")
    (tmp_path / "staging_d.sql").write_text("SELECT * FROM staging_a\n")
    with pytest.raises(SqlError, match="cycle: .*staging_a, .*staging_d"):
        layered_queries(tmp_path)


def test_resolve_round_picks_the_latest_round(round_path: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for k in (2, 10):
        shutil.copytree(round_path, run_dir / f"round={k}")
    assert resolve_round(run_dir) == run_dir / "round=10"
    assert resolve_round(round_path) == round_path
    with pytest.raises(SqlError, match="neither a round folder"):
        resolve_round(tmp_path / "run" / "round=2" / "steps")


# ---- CLI ------------------------------------------------------------------------------------------------------


def _app():
    """The real `didpo` app (its one error mapping: UserError exits 2, the library's refusals 1)."""
    from workflows.cli import app

    return app


def test_cli_prints_lists_and_writes(round_path: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    app = _app()
    shown = runner.invoke(app, ["sql", "reward_by_turn", "--run", str(round_path.parent)], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "mean_return_to_go" in shown.output and "(2 rows)" in shown.output

    listed = runner.invoke(app, ["sql", "--list"], env={"COLUMNS": "250"})
    assert listed.exit_code == 0 and "coverage_per_task" in listed.output and "advantages_diff" in listed.output

    csv_out = tmp_path / "rows.csv"
    wrote = runner.invoke(app, ["sql", "advantages_rows", "--run", str(round_path), "--out", str(csv_out)])
    assert wrote.exit_code == 0, wrote.output
    csv_rows = pacsv.read_csv(csv_out).to_pylist()
    assert len(csv_rows) == 7 and "sd06" in next(r for r in csv_rows if r["row_id"] == "a1t0")["occurrences"]

    pq_out = tmp_path / "diff.parquet"
    wrote = runner.invoke(app, ["sql", "advantages_diff", "--run", str(round_path), "--out", str(pq_out),
                                "--set", "credit.adv_norm=mean_std_norm"])
    assert wrote.exit_code == 0, wrote.output
    got = {(r["anchor_id"], r["row_id"]): r["diff_advantage"] for r in pq.read_table(pq_out).to_pylist()}
    assert got == pytest.approx(reference_diff("mean_std_norm"), abs=1e-6)

    query_file = tmp_path / "q.sql"
    query_file.write_text("-- rows per task\nSELECT task_id, count(*) AS n FROM staging_steps GROUP BY 1 ORDER BY 1;\n")
    adhoc = runner.invoke(app, ["sql", str(query_file), "--run", str(round_path), "--limit", "1"],
                          env={"COLUMNS": "250"})
    assert adhoc.exit_code == 0, adhoc.output
    assert "showing 1 of 2 rows" in adhoc.output


def test_a_wide_result_prints_one_record_per_block_at_80_columns(round_path: Path) -> None:
    """Columns that do not fit the terminal (or a pipe's 80) print as records, each column on its own line,
    never squeezed to a few characters; a narrow result keeps its columns."""
    runner = CliRunner()
    wide = runner.invoke(_app(), ["sql", "anchors_by_abs_diff_adv", "--run", str(round_path), "-n", "2"],
                         env={"COLUMNS": "80"})
    assert wide.exit_code == 0, wide.output
    lines = wide.output.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines)
    assert "record 1" in wide.output and "record 2" in wide.output and "showing 2 of 5 rows" in wide.output
    for column in ("anchor_id", "mean_abs_diff_adv", "return_spread"):  # whole names, one per line
        assert sum(line.split()[:1] == [column] for line in lines) == 2
    narrow = runner.invoke(_app(), ["sql", "gs_distribution",
                                    "--run", str(round_path)], env={"COLUMNS": "200"})
    assert narrow.exit_code == 0 and "record 1" not in narrow.output


def test_cli_errors_exit_nonzero_with_the_reason(round_path: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    app = _app()
    bad_out = runner.invoke(app, ["sql", "reward_by_turn", "--run", str(round_path), "--out", str(tmp_path / "x.txt")])
    assert bad_out.exit_code == 2 and "unknown format '.txt'" in bad_out.output
    unknown = runner.invoke(app, ["sql", "nope", "--run", str(round_path)])
    assert unknown.exit_code == 1 and "no query named 'nope'" in unknown.output
    no_run = runner.invoke(app, ["sql", "reward_by_turn"])
    assert no_run.exit_code == 2


def test_cli_refuses_tables_without_rows_and_unwritable_out(round_path: Path, tmp_path: Path, capsys) -> None:
    from workflows.cli import main

    empty = tmp_path / "round=0"
    for table in ("steps", "trajectories"):
        (empty / table).mkdir(parents=True)
    bad = {"no rows": (["sql", "reward_by_turn", "--run", str(empty)], "have no rows"),
           "unwritable out": (["sql", "reward_by_turn", "--run", str(round_path), "--out",
                               str(round_path / "steps" / "part-00000.parquet" / "x.csv")], "part-00000.parquet")}
    for args, culprit in bad.values():
        with pytest.raises(SystemExit) as stop:
            main(args)
        err = capsys.readouterr().err
        assert stop.value.code != 0 and "Traceback" not in err
        assert err.count("\n") == 1 and culprit in err, err
