"""`didpo explore`: the records, filters and anchor view are pure functions over a run's real tables (the
report tests' scripted episodes -> credit); the page is one offline file whose URL-hash state a real headless
Chromium applies (the DOM it dumps lists exactly the rows the Python filter selects)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image as mpimg
import pytest
from scripted_run import two_round_run
from typer.testing import CliRunner

from pipeline.tasks import load_source
from workflows.errors import UserError
from workflows.explore import (
    _script_json,
    anchor_records,
    assemble,
    matches,
    merge_anchors,
    parse_filters,
    render_page,
    select,
    serve,
    side_by_side,
    step_records,
)
from workflows.report import load_arm


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "arm_didpo"
    tasks = load_source("humaneval", limit=2)
    two_round_run(run, tasks)
    return run


@pytest.fixture(scope="module")
def arm(run_dir):
    return load_arm(run_dir)


@pytest.fixture(scope="module")
def data(arm):
    return assemble([arm])


@pytest.fixture(scope="module")
def page(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("explore") / "explore.html"
    path.write_text(render_page(data), encoding="utf-8")
    return path


# ---- records and filters -------------------------------------------------------------------------------


def test_every_step_of_every_round_is_a_record_joined_to_its_trajectory_and_advantage(arm, data):
    # 2 rounds x 2 tasks x 4 samples x 2 turns, all under the default cap
    assert data.total == len(data.steps) == sum(len(r.rows("steps")) for r in arm.rounds) == 32
    for rnd in arm.rounds:
        trajs = {t["traj_id"]: t for t in rnd.rows("trajectories")}
        adv = {a["row_id"]: a for a in rnd.rows("advantages")}
        for rec in step_records(arm.name, rnd):
            t, a = trajs[rec["traj_id"]], adv[rec["row_id"]]
            assert rec["round"] == rnd.k and rec["sample_index"] == t["sample_index"]
            assert rec["outcome"] == t["outcome"]
            assert rec["episode_return"] == pytest.approx(t["episode_return"], abs=1e-4)
            assert rec["estimator"] == "didpo"
            assert rec["episode_advantage"] == pytest.approx(a["episode_advantage"], abs=1e-4)
    json.dumps(data.to_json(), allow_nan=False)  # embeddable: no NaN anywhere


def test_filters_give_the_right_rows(data):
    steps, anchors = data.steps, data.anchors
    ids = lambda rows: {r["row_id"] for r in rows}  # noqa: E731
    assert ids(select(steps, anchors, {})) == ids(steps)
    round0_pass = select(steps, anchors, parse_filters("#round=0&outcome=pass"))
    assert round0_pass and all(r["round"] == 0 and r["outcome"] == 1.0 for r in round0_pass)
    assert len(round0_pass) == 2 * 2 * 2  # round 0: samples 0 and 1 of each task pass, two turns each
    fail = select(steps, anchors, {"outcome": "fail"})
    assert len(fail) == 2 * 2 * (2 + 1) and ids(fail).isdisjoint(ids(round0_pass))
    task = steps[0]["task_id"]
    assert {r["task_id"] for r in select(steps, anchors, {"task": task})} == {task}
    assert select(steps, anchors, {"estimator": "grpo"}) == []
    # search: task id, response text, anchor text; case-insensitive
    assert len(select(steps, anchors, {"q": "WRITE IT <ALL>"})) == 16  # every first turn says it
    assert len(select(steps, anchors, {"q": "looks right"})) == 16
    assert select(steps, anchors, {"q": "no such text anywhere"}) == []
    anchor_id, anchor = next(iter(anchors.items()))
    covered = select(steps, anchors, {"anchor": anchor_id})
    assert ids(covered) == {m["row_id"] for m in anchor["members"]}
    words = [w for w in anchor["text"].split() if w not in steps[0]["task_id"]]
    assert covered[0] in select(steps, anchors, {"q": words[0]})
    # min GS: only steps that an anchor of at least that GS (in the step's round) covers
    top = max(r["gs"] for a in anchors.values() for r in a["rounds"])
    assert select(steps, anchors, {"gs": top + 0.01}) == []
    best = select(steps, anchors, {"gs": top})
    assert best and all(any(r["gs"] >= top and r["round"] == s["round"] for a in s["anchors"]
                            for r in anchors[a]["rounds"]) for s in best)
    assert len(select(steps, anchors, {"gs": 0.0})) == sum(bool(s["anchors"]) for s in steps) > 0
    # the A^E range is inclusive and drops rows without advantages
    lo, hi = sorted({r["episode_advantage"] for r in steps})[1], 0.5
    ranged = select(steps, anchors, {"amin": lo, "amax": hi})
    assert ranged and all(lo <= r["episode_advantage"] <= hi for r in ranged)
    assert ids(ranged) == {r["row_id"] for r in steps if lo <= r["episode_advantage"] <= hi}
    assert not matches({**steps[0], "episode_advantage": None}, anchors, {"amin": -9.0})


def test_filter_syntax_is_checked_by_name():
    assert parse_filters("round=1&outcome=fail&gs=0.5&q=a+b&step=abc") == {"round": 1, "outcome": "fail", "gs": 0.5,
                                                                            "q": "a b"}
    for bad, message in (("colour=red", "unknown"), ("round=x", "expected a number"), ("gs=nan", "expected a number"),
                         ("outcome=maybe", "pass or fail")):
        with pytest.raises(UserError, match=message):
            parse_filters(bad)


def test_anchor_view_lists_members_across_rollouts_with_their_returns(arm):
    rnd = arm.rounds[0]
    anchors = anchor_records(arm.name, rnd)
    assert anchors and [a["anchor_id"] for a in anchors] == [a["anchor_id"] for a in rnd.rows("anchors")]
    steps = {s["row_id"]: s for s in rnd.rows("steps")}
    trajs = {t["traj_id"]: t for t in rnd.rows("trajectories")}
    for a in anchors:
        expected = sorted((m["row_id"], m["subdiff_id"]) for m in rnd.rows("anchor_members")
                          if m["anchor_id"] == a["anchor_id"])
        assert [(m["row_id"], m["subdiff_id"]) for m in a["members"]] == expected
        for m in a["members"]:
            assert (m["run"], m["round"]) == (arm.name, 0)
            t = trajs[steps[m["row_id"]]["traj_id"]]
            assert (m["traj_id"], m["sample_index"], m["outcome"]) == (t["traj_id"], t["sample_index"], t["outcome"])
            assert m["episode_return"] == pytest.approx(t["episode_return"], abs=1e-4)
            assert m["return_to_go"] == pytest.approx(steps[m["row_id"]]["return_to_go"], abs=1e-4)
        assert len({m["sample_index"] for m in a["members"]}) == a["n_rows"] > 1  # one anchor, several rollouts
        assert {m["outcome"] for m in a["members"]} == {0.0, 1.0}  # passing and failing members: A^D != 0


def test_an_anchor_recurring_in_later_rounds_is_one_anchor_with_every_occurrence(arm):
    # an anchor id names a unit of code of a task (its cluster key), so the same code anchors again next round
    per_round = [a for rnd in arm.rounds for a in anchor_records(arm.name, rnd)]
    merged = merge_anchors(per_round)
    assert set(merged) == {a["anchor_id"] for a in per_round}
    recurring = [a for a in merged.values() if len(a["rounds"]) > 1]
    assert recurring  # the reference solution is written in both rounds
    for a in recurring:
        assert [r["round"] for r in a["rounds"]] == [0, 1]
        assert len(a["members"]) == sum(r["n_members"] for r in a["rounds"])
        assert {m["round"] for m in a["members"]} == {0, 1}


def test_the_cap_keeps_the_steps_with_the_most_diff_credit(arm):
    capped = assemble([arm], max_steps=5)
    assert (len(capped.steps), capped.matched, capped.total) == (5, 32, 32)
    assert all(s["n_diff_tokens"] > 0 for s in capped.steps)  # the writing turns, not the `finish` ones
    assert set(capped.anchors) == {a for s in capped.steps for a in s["anchors"]}
    narrowed = assemble([arm], where="round=1&outcome=fail")
    assert (narrowed.matched, len(narrowed.steps)) == (4, 4) and {s["round"] for s in narrowed.steps} == {1}
    assert "5 of 32 steps" in render_page(capped) and "--max-steps" in render_page(capped)


def test_a_run_before_credit_lists_plain_responses_and_no_anchors(run_dir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(run_dir, bare)
    for k in (0, 1):
        for name in ("advantages", "anchors", "anchor_members", "subdiffs"):
            shutil.rmtree(bare / f"round={k}" / name)
    data = assemble([load_arm(bare)], max_steps=4)
    assert len(data.steps) == 4 and data.anchors == {} and data.scale == 0
    assert all(s["estimator"] is None and s["episode_advantage"] is None and 'class="tok"' not in s["html"]
               for s in data.steps)
    assert select(data.steps, data.anchors, {"amin": -1.0}) == []  # no advantage: outside every range


def test_the_embedded_json_cannot_close_its_script_element():
    nasty = {"text": "</script><!--<script>x</SCRIPT>\\</b>"}
    out = _script_json(nasty)
    assert "</" not in out and "<!--" not in out and json.loads(out) == nasty


def test_side_by_side_diff():
    out = side_by_side([{"path": "a.py", "text": "x = 1\ny = 2\n"}, {"path": "gone.py", "text": "z\n"}],
                       [{"path": "a.py", "text": "x = 1\ny = 3\n"}, {"path": "new.py", "text": "<b>\n"}])
    assert "a.py <span class=\"muted\">(modified)</span>" in out and "(deleted)" in out and "(created)" in out
    assert '<td class="d del">y = 2</td>' in out and '<td class="d add">y = 3</td>' in out
    assert '<td class="d add">&lt;b&gt;</td>' in out and "<b>" not in out
    assert "changed no file" in side_by_side([], [])


# ---- the page in a real browser ------------------------------------------------------------------------


class _Dom(HTMLParser):
    """Start tags with their attributes, in document order, and the id of the section each one is in."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict, str | None]] = []
        self._sections: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self._sections.append(attrs.get("id"))
        self.tags.append((tag, attrs, self._sections[-1] if self._sections else None))

    def handle_endtag(self, tag):
        if tag == "section" and self._sections:
            self._sections.pop()


def _chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        pytest.skip("NO BROWSER: the Debian package `chromium` is not installed (`make setup` installs it); "
                    "the page's JS is untested here")
    return binary


def _browse(page: Path, hash_: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
           "--virtual-time-budget=5000", *flags, f"{page.as_uri()}#{hash_}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)


def test_the_page_is_offline(page):
    dom = _Dom()
    dom.feed(page.read_text(encoding="utf-8"))
    assert not any(t == "link" or (t == "script" and "src" in a) or "src" in a for t, a, _ in dom.tags)
    assert not re.search(r"https?://", page.read_text(encoding="utf-8"))  # nothing to fetch


def _listed(dump: str) -> tuple[list[str], _Dom]:
    dom = _Dom()
    dom.feed(dump)
    return [a["data-row"] for t, a, _ in dom.tags if t == "tr" and a.get("class", "").startswith("step")], dom


def test_the_browser_applies_the_url_hash_and_opens_the_anchor(page, data, tmp_path):
    anchor_id, anchor = max(data.anchors.items(), key=lambda kv: (len(kv[1]["rounds"]), kv[1]["rounds"][0]["gs"]))
    state = f"round=0&outcome=pass&anchor={anchor_id}"
    dump = _browse(page, state, tmp_path, "--dump-dom").stdout
    listed, dom = _listed(dump)
    expected = select(data.steps, data.anchors, parse_filters(state))
    assert expected and listed == [s["row_id"] for s in expected]  # the JS filter is the Python one
    assert all(s["outcome"] == 1.0 and s["round"] == 0 and anchor_id in s["anchors"] for s in expected)
    assert f">{len(expected)} of {len(data.steps)} steps on this page match." in dump
    members = [(a["data-row"], sec) for t, a, sec in dom.tags if t == "tr" and a.get("class") == "member"]
    assert members == [(m["row_id"], "anchor-view") for m in anchor["members"]]  # every round's occurrences
    assert len(anchor["rounds"]) == 2 and len(members) > len(expected)


@pytest.mark.parametrize("state", ["q=LOOKS+RIGHT&round=1", "gs=0.1&amin=-0.7&amax=0.3", "outcome=fail&task={task}",
                                   "amin=oops&estimator=didpo"])
def test_the_browser_filters_like_the_python_rule(page, data, tmp_path, state):
    state = state.format(task=data.steps[-1]["task_id"])
    listed, _ = _listed(_browse(page, state, tmp_path, "--dump-dom").stdout)
    f = parse_filters(state.replace("amin=oops&", ""))  # the page ignores a value it cannot read
    assert listed == [s["row_id"] for s in select(data.steps, data.anchors, f)]
    assert 0 < len(listed) < len(data.steps) or state.startswith("amin=oops")


def test_the_browser_opens_a_step_with_its_coloured_response_and_diff(page, data, tmp_path):
    step = next(s for s in data.steps if s["anchors"] and s["action_kind"] == "write")
    dom = _Dom()
    dom.feed(_browse(page, f"step={step['row_id']}", tmp_path, "--dump-dom").stdout)
    in_view = [(t, a) for t, a, sec in dom.tags if sec == "step-view"]
    tokens = [a for t, a in in_view if t == "span" and a.get("class") == "tok"]
    assert len(tokens) == step["html"].count('class="tok"') > 0
    assert any(t == "table" and a.get("class") == "diff" for t, a in in_view)
    assert {a.get("data-anchor") for t, a in in_view if t == "a"} >= set(step["anchors"])
    assert sum(t == "tr" and a.get("class") == "step sel" for t, a, _ in dom.tags) == 1  # highlighted in the list


def test_the_browser_draws_the_page(page, data, tmp_path):
    shot = tmp_path / "explore.png"
    step = data.steps[0]["row_id"]
    _browse(page, f"anchor={next(iter(data.anchors))}&step={step}", tmp_path, f"--screenshot={shot}",
            "--window-size=1200,900")
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and shot.stat().st_size > 20_000
    pixels = mpimg.imread(shot)
    assert pixels.shape[:2] == (900, 1200) and pixels.std() > 0.05  # drawn, not one colour
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).round().astype(int).reshape(-1, 3)}
    assert len(colours) > 50  # text, coloured tokens, diff backgrounds


# ---- command -------------------------------------------------------------------------------------------


def test_explore_command_writes_one_page_and_refuses_bad_input_in_one_line(run_dir, tmp_path):
    from workflows.cli import app  # the real app: its one error mapping

    out = tmp_path / "e.html"
    res = CliRunner().invoke(app, ["explore", "--run", str(run_dir), "--out", str(out), "--max-steps", "6"])
    assert res.exit_code == 0, res.output
    assert "6 of 32 steps" in res.output and out.stat().st_size > 10_000
    for args, code, message in (
            (["--run", str(tmp_path / "missing")], 1, "does not exist"),
            (["--run", str(tmp_path)], 1, "no round=<k> folders"),
            (["--run", str(run_dir), "--where", "colour=red"], 2, "filter 'colour': unknown"),
            (["--run", str(run_dir), "--max-steps", "0"], 2, "--max-steps")):
        res = CliRunner().invoke(app, ["explore", *args, "--out", str(tmp_path / "x.html")])
        assert res.exit_code == code and message in res.output, res.output
        assert "Traceback" not in res.output
    # a corrupt table: named, one line
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    part = next((broken / "round=1" / "steps").glob("*.parquet"))
    part.write_bytes(b"not parquet")
    res = CliRunner().invoke(app, ["explore", "--run", str(broken), "--out", str(tmp_path / "x.html")])
    assert res.exit_code == 1 and "error:" in res.output and str(part) in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_serve_answers_the_page_on_loopback(data, run_dir):
    body = render_page(data).encode("utf-8")
    server = serve(body, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host, port = server.server_address
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.read() == body and r.headers["Content-Type"].startswith("text/html")
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
        from workflows.cli import app

        res = CliRunner().invoke(app, ["explore", "--run", str(run_dir), "--serve", "--port", str(port)])
        assert res.exit_code == 2 and f"--port {port}: Address already in use" in res.output, res.output
    finally:
        server.shutdown()
        server.server_close()
