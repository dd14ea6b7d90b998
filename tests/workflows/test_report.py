"""`didpo report`: the page is built from a run's real tables (scripted episodes -> credit), opens offline, and
its figures are PNGs; the explorer colours every token of a step and lists the anchors covering it."""

from __future__ import annotations

import base64
import dataclasses
import html
from html.parser import HTMLParser

import matplotlib.image as mpimg
import numpy as np
import pytest
from scripted_run import two_round_run, write_round
from typer.testing import CliRunner

from pipeline import schema
from pipeline.evaluation import TaskResult, summarize, write_results
from pipeline.tasks import load_source
from workflows.report import ReportError, build_report, coloured_response, load_arm

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "arm_didpo"
    tasks = load_source("humaneval", limit=2)
    two_round_run(run, tasks)
    results = [TaskResult("humanevalfix", "value misuse", "humanevalfix/Python/0", 2, 1, 4, 1, 2.0)]
    write_results(run / "round=1" / "eval", summarize(results, samples=2, ks=(1, 2)), results, (1, 2))
    return run


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parse(path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def report(run_dir, tmp_path_factory):
    return build_report([run_dir], tmp_path_factory.mktemp("report"), explore_count=3)


def test_round_metrics_come_from_the_tables(report, run_dir):
    arm = report.arms[0]
    assert [r.k for r in arm.rounds] == [0, 1]
    for rnd in arm.rounds:
        trajs = schema.read_table(schema.table_dir(rnd.path, "trajectories"), "trajectories").to_pylist()
        assert rnd.pass_rate == pytest.approx(np.mean([t["outcome"] for t in trajs]))
        assert rnd.mean_return == pytest.approx(np.mean([t["episode_return"] for t in trajs]))
    assert [r.pass_rate for r in arm.rounds] == [0.5, 0.75]  # 2 then 1 of 4 samples buggy
    assert [r.heldout_pass_rate for r in arm.rounds] == [0.25, 0.5]
    assert all(len(r.rows("anchors")) > 0 and 0 < r.coverage <= 1 for r in arm.rounds)
    assert arm.name == "arm_didpo (didpo, lambda=1)"


def test_page_is_offline_and_its_images_are_real_pngs(report):
    page = _parse(report.page)
    tags = [t for t, _ in page.tags]
    assert "script" not in tags and "link" not in tags  # nothing to fetch: inline CSS, no JS, no CDN
    images = [a["src"] for t, a in page.tags if t == "img"]
    assert len(images) == 4 == len(report.pngs)  # curves, advantages, anchors, coverage
    for src, file in zip(images, report.pngs, strict=True):
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1])
        assert data.startswith(PNG_MAGIC) and data == file.read_bytes()
        pixels = mpimg.imread(file)
        assert pixels.shape[0] > 100 and pixels.shape[1] > 300 and pixels.std() > 0.01  # a drawn figure
    text = " ".join(page.text)
    assert "pass@2" in text and "value misuse" in text  # round 1's `didpo eval` table
    for heading in ("Benchmark evaluation", "Reward and pass rate per round", "Advantage distributions", "Anchor sizes and groupability",
                    "Coverage", "Credit-unit explorer"):
        assert heading in text


def test_explorer_colours_every_token_and_lists_anchor_members(report):
    page = _parse(report.page)
    explored = report.explored
    assert len(explored) == 3 and all(e.anchors for e in explored)  # the steps that wrote anchored code
    rnd = report.arms[0].rounds[-1]
    steps = {s["row_id"]: s for s in rnd.rows("steps")}
    adv = {a["row_id"]: a for a in rnd.rows("advantages")}
    spans = [a for t, a in page.tags if t == "span" and a.get("class") == "tok"]
    n_tokens = sum(len(steps[e.row_id]["token_char_starts"]) for e in explored)
    assert len(spans) == n_tokens
    shown = [float(a["title"]) for a in spans]
    expected = [v for e in explored for v in adv[e.row_id]["token_advantages"]]
    assert shown == pytest.approx(expected, abs=1e-4)
    assert len(set(np.round(shown, 4))) > 1  # the diff-level term makes token values differ within a step
    # the response is escaped text, never markup: no <write>/<think> elements, and its characters survive
    assert not {t for t, _ in page.tags} & {"write", "think", "all", "finish"}
    assert "write it <all> & done" in "".join(page.text)
    # every listed member is a real anchor member with its trajectory's outcome
    members = {(m["anchor_id"], m["row_id"]) for m in rnd.rows("anchor_members")}
    outcome = {t["traj_id"]: t["outcome"] for t in rnd.rows("trajectories")}
    for e in explored:
        for a in e.anchors:
            assert {(a["anchor_id"], m["row_id"]) for m in a["members"]} == {x for x in members if x[0] == a["anchor_id"]}
            assert {m["outcome"] for m in a["members"]} <= {outcome[steps[m["row_id"]]["traj_id"]] for m in a["members"]}
            assert {m["outcome"] for m in a["members"]} == {0.0, 1.0}  # a passing and a failing member: A^D != 0
    assert sum(t == "details" for t, _ in page.tags) == sum(len(e.anchors) for e in explored)


def test_coloured_response_escapes_and_covers_each_span_once():
    text = "a<b>&c"
    # a byte-level token sharing a character with the next, and an empty (stop-token) span at the end
    out = coloured_response(text, [0, 1, 1, 4, 6], [1, 2, 4, 6, 6], [1.0, 0.5, -1.0, 0.0, 9.0], scale=1.0)
    page = _Page()
    page.feed(out)
    assert "".join(page.text) == text  # every character once, in order, whatever the overlap
    assert [a["title"] for _, a in page.tags] == ["+1.0000", "+0.5000", "-1.0000", "+0.0000"]
    assert page.text == ["a", "<", "b>", "&c"]
    assert "rgb(58,170,80)" in out and "rgb(226,74,74)" in out and "rgb(255,255,255)" in out
    assert html.escape("<") in out and "<b>" not in out


@pytest.mark.slow
def test_two_runs_are_two_arms_on_the_curves(run_dir, tmp_path):
    other = tmp_path / "runs" / "arm_b"
    write_round(other, 0, load_source("humaneval", limit=1), buggy_samples={0, 1, 2}, heldout=0.0)
    rep = build_report([run_dir, other], tmp_path / "out", explore_count=1)
    assert [a.name for a in rep.arms] == ["arm_didpo (didpo, lambda=1)", "arm_b (didpo, lambda=1)"]
    assert rep.arms[1].rounds[0].pass_rate == 0.25
    assert "arm_b" in rep.page.read_text()


@pytest.mark.slow
def test_bad_run_folders_are_refused_by_name(tmp_path, run_dir):
    with pytest.raises(ReportError, match="does not exist"):
        build_report([tmp_path / "nope"], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no round=<k> folders"):
        build_report([tmp_path / "empty"], tmp_path / "out")
    (tmp_path / "half" / "round=0").mkdir(parents=True)
    with pytest.raises(ReportError, match="round has no trajectories table"):
        build_report([tmp_path / "half"], tmp_path / "out")
    with pytest.raises(ReportError, match="no advantages row with row_id deadbeef"):
        build_report([run_dir], tmp_path / "out", steps=["deadbeef"])


@pytest.mark.slow
def test_report_command(run_dir, tmp_path):
    from workflows.cli import app  # the real app: its one error mapping

    res = CliRunner().invoke(app, ["report", "--run", str(run_dir), "--out", str(tmp_path / "r"), "--explore", "2"])
    assert res.exit_code == 0, res.output
    assert "4 figures, 2 explored steps" in res.output and (tmp_path / "r" / "index.html").is_file()
    res = CliRunner().invoke(app, ["report", "--run", str(tmp_path / "missing")])
    assert res.exit_code == 1 and "does not exist" in res.output


def test_rollouts_lost_to_the_sandbox_stay_in_the_counts(tmp_path):
    from rich.console import Console

    from workflows.summary import print_round_summary

    run = tmp_path / "arm_lost"
    # per task: samples 0, 1 pass, 2 reaches the sandbox retry cap (dead-lettered), 3 is buggy
    write_round(run, 0, load_source("humaneval", limit=2), buggy_samples={3}, heldout=0.0, lost_samples={2})
    console = Console(record=True, width=200)
    s = print_round_summary(run / "round=0", console)
    assert (s.rollouts, s.lost_to_sandbox, s.dead_letters, s.tasks) == (8, 2, 2, 2)
    assert s.pass_rate == 0.5  # 4 passes of 8 started rollouts: the lost ones count as not passing
    assert dataclasses.asdict(s)["lost_to_sandbox"] == 2
    assert "lost to sandbox failures 2 of 8 rollouts" in " ".join(console.export_text().replace("│", " ").split())
    rnd = load_arm(run).rounds[0]
    assert (rnd.rollouts, rnd.lost_to_sandbox, rnd.pass_rate) == (8, 2, 0.5)
