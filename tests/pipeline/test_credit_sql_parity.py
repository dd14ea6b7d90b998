"""The Python credit core and the DuckDB SQL layers give the same advantages (DESIGN.md: "a test holds them equal").

Realistic rounds: HumanEval reference solutions with injected bugs; every rollout writes the whole file
(mutated), then fixes bugs with several search/replace edits in one action (one of them inserting a line
next to a fix, so one hunk holds lines written by two edit blocks: several disjoint spans), then runs the
tests or finishes. Fixes recur across rollouts, so anchors form. A tokenizer with trailing-whitespace tokens
(a token can straddle two lines) and zero-width tokens exercises the exact token spans. One trajectory has
lost its turn-0 row (R_episode = R_t of its lowest turn).

The Python side writes its tables with the contract's writers; the SQL side reads the round folder. Float
tolerance: the tables store float32 (return_to_go, A^E, A^D, token advantages) and step rewards are fractions
that float32 cannot hold exactly, so values are compared with 1e-5 relative + 1e-5 absolute tolerance.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from builders import step_row
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import schema
from pipeline.agent.grammar import Action, Edit, action_json, apply_action, parse_response, render_action
from pipeline.credit import CreditSettings, compute_credit
from pipeline.credit.returns import returns_to_go
from pipeline.credit_io import result_columns
from pipeline.sqlrun import run_query, sql_advantages
from pipeline.tasks import load_source
from workflows.credit_cmd import steps_from_table, write_credit

RTOL = ATOL = 1e-5
GAMMA = 0.95
FILE = "solution.py"
TASKS = ("HumanEval/0", "HumanEval/1", "HumanEval/3", "HumanEval/6")  # >= 3 lines a bug fits
ROLLOUTS = 5
# Bugs a rollout may inject into a line of the reference: the first pattern that applies.
BUGS = ((" < ", " <= "), (" > ", " >= "), (" == ", " != "), (" += ", " -= "), (" + ", " - "),
        ("return True", "return False"), ("return False", "return True"), ("(0)", "(1)"), (" 0", " 1"))
_TOKEN = re.compile(r"\w+[ \t]*|[^\w\s]+\s*|\s+")  # punctuation takes the newline and indent after it


def tokenize(text: str) -> tuple[list[int], list[int]]:
    """Token char offsets: a zero-width BOS, regex tokens, and a zero-width token after every 17th."""
    starts, ends = [0], [0]
    for k, m in enumerate(_TOKEN.finditer(text)):
        starts.append(m.start())
        ends.append(m.end())
        if k % 17 == 16:
            starts.append(m.end())
            ends.append(m.end())
    return starts, ends


def _bug(line: str) -> str | None:
    for old, new in BUGS:
        if old in line:
            return line.replace(old, new, 1)
    return None


def _search_replace(text: str, old: str, new: str) -> Edit:
    """A search/replace edit of one line, with the previous lines as context until the search is unique."""
    lines = text.splitlines(keepends=True)
    at = lines.index(old + "\n")
    lo = at
    while lo > 0 and text.count("".join(lines[lo : at + 1])) > 1:
        lo -= 1
    context = "".join(lines[lo:at])
    return Edit("replace", FILE, context + old + "\n", context + new + "\n", None, (0, 0))


def _step(traj: str, task: str, turn: int, before: str, edits: list[Edit], kind: str, reward: float) -> dict:
    think = f"turn {turn}: let me {'fix the bugs' if edits else 'check'}"
    response = render_action(Action(kind, think, (0, 0), tuple(edits)))
    action = parse_response(response)
    assert action.ok, action
    applied = apply_action(action, {FILE: before}, max_file_bytes=1 << 20) if edits else {FILE: before}
    assert isinstance(applied, dict), applied
    after = applied[FILE]
    starts, ends = tokenize(response)
    return step_row(
        schema.content_id(traj, turn), traj, task, turn=turn,
        response_token_ids=[k % 997 for k in range(len(starts))], response_text=response,
        token_char_starts=starts, token_char_ends=ends, action_kind=kind, action_json=action_json(action),
        files_before=[{"path": FILE, "text": before}] if edits else [],
        files_after=[{"path": FILE, "text": after}] if edits else [],
        workspace_hash_before=schema.content_id(before), workspace_hash_after=schema.content_id(after),
        exec_status="passed" if reward >= 1.0 else "failed", visible_passed=0, visible_total=3,
        step_reward=reward,
    ), after


def rollout(task, g: int, rng: random.Random) -> list[dict]:
    """One trajectory: write the buggy file, fix some bugs (several edits in one action), test or finish."""
    start = task.workspace[FILE]
    ref_lines = task.reference[FILE].splitlines()
    body = range(len(start.splitlines()), len(ref_lines))
    buggable = [i for i in body if _bug(ref_lines[i])][:3]  # a small pool: rollouts share their bugs
    bugs = sorted(rng.sample(buggable, k=min(2, len(buggable))))
    written = [(_bug(line) if i in bugs else line) for i, line in enumerate(ref_lines)]
    traj = schema.content_id(task.task_id, g)
    fixes = bugs if g % 2 == 0 else bugs[:1]  # odd rollouts leave a bug in

    def score(n_left: int) -> float:  # graded visible-test reward: a fraction float32 cannot hold exactly
        return 0.5 * (len(buggable) - n_left) / len(buggable)

    rows = []
    row, text = _step(traj, task.task_id, 0, start, [Edit("write", FILE, "", "\n".join(written) + "\n", None,
                                                          (0, 0))], "write", score(len(bugs)))
    rows.append(row)
    edits = [_search_replace(text, written[i], ref_lines[i]) for i in fixes]
    nxt = fixes[0] + 1
    if g % 3 != 1 and nxt < len(ref_lines) and nxt not in bugs and ref_lines[nxt].strip():
        # insert a line right after the first fix: its hunk's lines come from two edit blocks
        indent = ref_lines[nxt][: len(ref_lines[nxt]) - len(ref_lines[nxt].lstrip())]
        edits.append(_search_replace(text, ref_lines[nxt], f"{indent}checked = True\n{ref_lines[nxt]}"))
    outcome = float(len(fixes) == len(bugs))
    row, text = _step(traj, task.task_id, 1, text, edits, "edit", score(len(bugs) - len(fixes)))
    rows.append(row)
    last, _ = _step(traj, task.task_id, 2, text, [], "finish" if g % 2 else "run_tests",
                    score(len(bugs) - len(fixes)) + outcome)
    rows.append(last)
    rewards = np.array([r["step_reward"] for r in rows], np.float64)  # as pipeline.rollout.finish does
    for r, rtg in zip(rows, returns_to_go(rewards, np.zeros(3, np.int64), np.arange(3), GAMMA), strict=True):
        r["return_to_go"] = float(rtg)
    rows[-1]["done"] = True
    return rows


@pytest.fixture(scope="module")
def steps_table() -> pa.Table:
    rng = random.Random(7)
    tasks = load_source("humaneval", ids=TASKS)
    rows = [row for task in tasks for g in range(ROLLOUTS) for row in rollout(task, g, rng)]
    rows = rows[1:]  # the first trajectory lost its turn-0 row: its episode return is R_1
    return schema.to_arrow("steps", rows)


def write_round(folder: Path, steps: pa.Table, settings: CreditSettings):
    """Run the Python core on a steps table and write the round as the pipeline does; returns the result."""
    schema.write_table(steps, folder / "steps", "steps")
    stored = schema.read_table(folder / "steps", "steps")
    result = compute_credit(steps_from_table(stored, str(folder / "steps")), settings)
    write_credit(result, folder)
    return result


def assert_same_advantages(folder: Path, result, lam: float, mode: str) -> None:
    """Every number of the advantages table and every A^D agree between the Python core and SQL."""
    sql = {r["row_id"]: r for r in sql_advantages(folder, lam=lam, adv_norm=mode).to_pylist()}
    adv = result_columns(result, "advantages")
    py = {row_id: {name: adv[name][i] for name in adv} for i, row_id in enumerate(adv["row_id"])}
    assert sql.keys() == py.keys() and len(py) == len(adv["row_id"])
    for row_id, p in py.items():
        s = sql[row_id]
        assert (s["traj_id"], s["task_id"], s["estimator"]) == (p["traj_id"], p["task_id"], p["estimator"])
        np.testing.assert_allclose(s["episode_advantage"], p["episode_advantage"], RTOL, ATOL, err_msg=row_id)
        np.testing.assert_allclose(s["token_advantages"], p["token_advantages"], RTOL, ATOL, err_msg=row_id)
        assert s["loss_mask"] == list(p["loss_mask"]), row_id
        assert s["n_diff_tokens"] == p["n_diff_tokens"], row_id
    sql_diff = {(r["anchor_id"], r["subdiff_id"]): r["diff_advantage"]
                for r in run_query(folder, "advantages_diff", {"adv_norm": mode}).to_pylist()}
    members = result_columns(result, "anchor_members")
    py_diff = dict(zip(zip(members["anchor_id"], members["subdiff_id"], strict=True), members["diff_advantage"],
                       strict=True))
    assert sql_diff.keys() == py_diff.keys()
    for key, value in py_diff.items():
        np.testing.assert_allclose(sql_diff[key], value, RTOL, ATOL, err_msg=str(key))


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("lam", [0.0, 1.0, 1.2])
def test_python_and_sql_agree_on_a_realistic_round(steps_table, tmp_path, lam, mode) -> None:
    result = write_round(tmp_path, steps_table, CreditSettings(estimator="didpo", lam=lam, adv_norm=mode))
    assert_same_advantages(tmp_path, result, lam, mode)
    n_diff = sum(a.n_diff_tokens for a in result.advantages)
    assert n_diff > 100 if lam else n_diff == 0  # lam = 0: no token receives a diff-level term


def test_the_round_exercises_every_rule(steps_table, tmp_path) -> None:
    """The realistic round holds the cases the rules settle, so the parity above is not vacuous."""
    result = write_round(tmp_path, steps_table, CreditSettings(estimator="didpo"))
    sub, members, anchors = (result_columns(result, t) for t in ("subdiffs", "anchor_members", "anchors"))
    index = {sid: i for i, sid in enumerate(sub["subdiff_id"])}
    anchored = [index[s] for s in members["subdiff_id"]]
    assert len(anchors["anchor_id"]) >= 6 and len(set(anchors["task_id"])) == len(TASKS)
    # 1. anchored occurrences whose token spans have a gap: the gap tokens are not theirs
    gaps = [i for i in anchored if len(sub["token_spans"][i]) > 1]
    assert gaps
    i = gaps[0]
    inside = {t for start, end in sub["token_spans"][i] for t in range(start, end)}
    assert len(inside) < sub["token_end"][i] - sub["token_start"][i]
    # 2. anchors with equal GS (their order on a shared token is decided by the tie rule, below)
    gs = anchors["gs"]
    assert len(set(gs)) < len(gs)
    # 3. the trajectory without its turn-0 row still has its rows, with an episode advantage
    turns = Counter(steps_table["traj_id"].to_pylist())
    assert sorted(turns.values())[0] == 2


def _shared_tokens(result) -> dict[tuple[str, int], set[str]]:
    """(row_id, token) -> the anchors whose occurrences in that row hold the token."""
    sub, members = result_columns(result, "subdiffs"), result_columns(result, "anchor_members")
    index = {sid: i for i, sid in enumerate(sub["subdiff_id"])}
    holders: dict[tuple[str, int], set[str]] = {}
    for anchor_id, sid in zip(members["anchor_id"], members["subdiff_id"], strict=True):
        i = index[sid]
        for start, end in sub["token_spans"][i]:
            for t in range(start, end):
                holders.setdefault((sub["row_id"][i], t), set()).add(anchor_id)
    return {key: anchors for key, anchors in holders.items() if len(anchors) > 1}


@pytest.mark.parametrize("d", ["    nn += 1", "    n += 1", "    nnnn += 1"], ids=["same-length", "shorter", "longer"])
def test_ties_on_a_shared_token_are_broken_the_same_way(tmp_path, d) -> None:
    """Two anchors of equal GS meet on a token that straddles their lines (':' plus the next line's newline
    and indent). With d = "    nn += 1" both cover 25 characters and only subdiff_id decides; otherwise
    the one covering more characters wins, in both implementations."""
    a, b = "total = 0", "for v in values:"  # window "a b" recurs in rows 0 and 1
    c = "    total += v"  # window "c d" recurs in rows 0 and 2
    files = {0: [a, b, c, d], 1: [a, b, "    print(v)", "    del v"], 2: ["x = []", "while x:", c, d],
             3: ["y = 2", "z = y"]}
    rows = []
    for g, lines in files.items():
        write = Edit("write", FILE, "", "\n".join(lines) + "\n", None, (0, 0))
        row, _ = _step(f"t{g}", "task", 0, "", [write], "write", [1.0, 0.5, 0.25, 0.0][g])
        row["return_to_go"] = row["step_reward"]
        rows.append(row)
    for lam, mode in ((1.0, "mean_norm"), (1.2, "mean_std_norm")):
        folder = tmp_path / mode
        result = write_round(folder, schema.to_arrow("steps", rows), CreditSettings(estimator="didpo", lam=lam, adv_norm=mode))
        shared = _shared_tokens(result)
        assert shared, "the round must hold a token that two anchors share"
        gs = {a.anchor_id: a.gs for a in result.anchors}
        assert all(len({gs[x] for x in anchors}) == 1 for anchors in shared.values())
        assert_same_advantages(folder, result, lam, mode)


# ---- random small batches ----------------------------------------------------------------------------------

LINES = ("x = 1", "y = x + 2", "return y", "if x > 0:", "    x -= 1", "print(x)", "z = [x, y]")


@st.composite
def small_rounds(draw) -> list[dict]:
    """Tasks x rollouts x turns; each step appends 1-3 lines from a small pool (so anchors form) with one or
    two edit blocks; rewards on a float32-exact grid."""
    rows = []
    for task in range(draw(st.integers(1, 2))):
        for g in range(draw(st.integers(1, 4))):
            text, traj = "", f"t{task}-{g}"
            n_turns = draw(st.integers(1, 3))
            rewards = [draw(st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0])) for _ in range(n_turns)]
            rtg = returns_to_go(np.array(rewards), np.zeros(n_turns, np.int64), np.arange(n_turns), GAMMA)
            for turn in range(n_turns):
                blocks = draw(st.lists(st.lists(st.sampled_from(LINES), min_size=1, max_size=2), min_size=1,
                                       max_size=2))
                edits = [Edit("insert", FILE, "", "\n".join(b) + "\n", None, (0, 0), None) for b in blocks]
                if not text:
                    edits[0] = Edit("write", FILE, "", edits[0].replace, None, (0, 0))
                row, text = _step(traj, f"task{task}", turn, text, edits, "edit", rewards[turn])
                row["return_to_go"] = float(rtg[turn])
                rows.append(row)
    return rows


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=small_rounds(), lam=st.sampled_from([0.0, 1.0, 1.2]),
       mode=st.sampled_from(["mean_norm", "mean_std_norm"]))
def test_python_and_sql_agree_on_random_small_rounds(tmp_path_factory, rows, lam, mode) -> None:
    folder = tmp_path_factory.mktemp("round")
    result = write_round(folder, schema.to_arrow("steps", rows), CreditSettings(estimator="didpo", lam=lam, adv_norm=mode))
    assert_same_advantages(folder, result, lam, mode)
