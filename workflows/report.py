"""`didpo report --run DIR [--run DIR2 ...]`: a self-contained HTML page (plus PNGs) about one or more runs.

1. Every `--run` is one estimator arm; its rounds are the `round=<k>` folders (the data contract's tables).
2. Per round and arm, the `round_metrics` mart (sql/marts/round_metrics.sql, what every round report reads):
   mean episode return, rollout pass rate (rollouts lost to sandbox failures count as not passing), rollouts
   lost to sandbox failures, invalid-action rate, anchors and coverage (changed tokens whose stored advantage
   has a diff-level term); the held-out pass rate from the round's manifest (`eval` stage of `didpo round`)
   and the benchmark table of `didpo eval` (round=<k>/eval/) when there.
3. Figures (matplotlib, Agg): reward and pass-rate curves per round and arm, advantage distributions
   (per row A^E and per token), anchor group sizes and GS histograms, coverage per round.
4. A credit-unit explorer: for chosen steps (the ones with the most diff-level credit, or `--step ROW_ID`),
   the response with every token coloured by its advantage and the anchors covering the step, with their
   members' outcomes.
The page embeds every PNG as base64 and its CSS inline, so it opens offline from anywhere; the PNGs are
also written beside it.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import typer

from pipeline import schema
from pipeline.sqlrun import round_metrics
from pipeline.storage import Location, location
from workflows.errors import Refused

_ROUND_DIR = re.compile(r"^round=(\d+)$")
REQUIRED = ("trajectories", "steps")  # a round without these has nothing to report
# absent until credit has run (dead_letter: absent from rounds written by hand)
OPTIONAL = ("advantages", "anchors", "anchor_members", "subdiffs", "dead_letter")


class ReportError(ValueError):
    """A run folder that cannot be reported on; the message names the folder and what is missing."""


# ---- data --------------------------------------------------------------------------------------------------


@dataclass
class RoundData:
    """One round of one arm: its tables (lists of row dicts) for the figures, its mart row for the figures
    of the round table and the curves."""

    k: int
    path: Location
    tables: dict[str, list[dict[str, Any]]]
    metrics: dict[str, Any]  # the round's `round_metrics` row (pipeline.sqlrun.round_metrics)
    heldout_pass_rate: float | None  # the `eval` stage of `didpo round`, when recorded
    benchmarks: list[dict[str, Any]] = field(default_factory=list)  # round=<k>/eval/eval_summary.parquet rows

    def rows(self, name: str) -> list[dict[str, Any]]:
        return self.tables.get(name, [])

    def _figure(self, name: str) -> float:
        value = self.metrics[name]
        return math.nan if value is None else value

    @property
    def mean_return(self) -> float:
        return self._figure("mean_return")

    @property
    def rollouts(self) -> int:
        """Rollouts started, those lost to sandbox failures included."""
        return self.metrics["rollouts"]

    @property
    def lost_to_sandbox(self) -> int:
        return self.metrics["lost_to_sandbox"]

    @property
    def pass_rate(self) -> float:
        """Share of started rollouts that pass: a rollout lost to the sandbox counts as not passing."""
        return self._figure("pass_rate")

    @property
    def invalid_rate(self) -> float:
        return self._figure("invalid_rate")

    @property
    def coverage(self) -> float | None:
        """Changed tokens whose stored advantage has a diff-level term (None: no change, or no credit yet)."""
        return self.metrics["coverage"]


@dataclass
class Arm:
    """One run folder: an estimator arm."""

    name: str  # label in legends: "<run> (<estimator>, lambda=<lam>)"
    path: Location
    rounds: list[RoundData] = field(default_factory=list)


def _read_round(path: Location, k: int) -> RoundData:
    tables = {}
    for name in (*REQUIRED, *OPTIONAL):
        folder = schema.table_dir(path, name)
        if not folder.is_dir():
            if name in REQUIRED:
                raise ReportError(f"{path}: round has no {name} table ({folder} is missing)")
            continue
        tables[name] = schema.read_table(folder, name).to_pylist()
    heldout = None
    try:
        stages = schema.read_manifest(path).stages
        heldout = stages.get("eval", {}).get("metrics", {}).get("pass_rate")
    except (FileNotFoundError, ValueError):
        pass  # a round folder written by hand (no manifest) still reports its tables
    summary = path / "eval" / "eval_summary.parquet"  # `didpo eval --out round=<k>/eval` (the Airflow DAG)
    benchmarks = pq.read_table(pa.BufferReader(summary.read_bytes())).to_pylist() if summary.is_file() else []
    return RoundData(k, path, tables, round_metrics(path), heldout, benchmarks)


def load_arm(run_dir: str | Path) -> Arm:
    """Every round=<k> folder of a run, in round order; ReportError when there is none."""
    run = location(run_dir)
    if not run.is_dir():
        raise ReportError(f"run folder {run} does not exist")
    found = sorted((int(m.group(1)), p) for p in run.iterdir() if p.is_dir() and (m := _ROUND_DIR.match(p.name)))
    if not found:
        raise ReportError(f"{run}: no round=<k> folders (is it runs/<run_id>?)")
    rounds = [_read_round(p, k) for k, p in found]
    adv = next((r.rows("advantages")[0] for r in rounds if r.rows("advantages")), None)
    label = f"{run.name} ({adv['estimator']}, lambda={adv['lam']:g})" if adv else run.name
    return Arm(label, run, rounds)


# ---- figures -----------------------------------------------------------------------------------------------


@dataclass
class Figure:
    name: str  # file stem of the PNG
    title: str
    caption: str
    png: bytes


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=96)
    plt.close(fig)
    return buf.getvalue()


def _subplots(ncols: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(5.2 * ncols, 3.4), squeeze=False)


def curve_figure(arms: Sequence[Arm]) -> Figure:
    """Mean episode return and pass rates per round, one line per arm."""
    fig, axes = _subplots(2)
    ret, rate = axes[0]
    for i, arm in enumerate(arms):
        ks = [r.k for r in arm.rounds]
        color = f"C{i}"
        ret.plot(ks, [r.mean_return for r in arm.rounds], "o-", color=color, label=arm.name)
        rate.plot(ks, [r.pass_rate for r in arm.rounds], "o-", color=color, label=f"{arm.name}: rollouts")
        held = [(r.k, r.heldout_pass_rate) for r in arm.rounds if r.heldout_pass_rate is not None]
        if held:
            rate.plot(*zip(*held, strict=True), "s--", color=color, label=f"{arm.name}: held-out")
    ret.set(title="mean episode return R_0", xlabel="round")
    rate.set(title="pass rate (hidden tests)", xlabel="round", ylim=(-0.02, 1.02))
    for ax in (ret, rate):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    return Figure("curves", "Reward and pass rate per round",
                  "Per round and estimator arm: mean episode return of the round's rollouts; share of rollouts "
                  "whose hidden tests all pass (solid) and the held-out pass rate of the updated policy "
                  "(dashed, when `didpo round` recorded it).", _png(fig))


def advantage_figure(arms: Sequence[Arm]) -> Figure | None:
    """Histograms of the episode-level advantage per row and of the token advantages (last round per arm)."""
    fig, axes = _subplots(2)
    per_row, per_token = axes[0]
    drawn = False
    for i, arm in enumerate(arms):
        last = arm.rounds[-1]
        adv = last.rows("advantages")
        if not adv:
            continue
        drawn = True
        episode = [a["episode_advantage"] for a in adv]
        tokens = [v for a in adv for v, m in zip(a["token_advantages"], a["loss_mask"], strict=True) if m]
        kw = {"bins": 30, "alpha": 0.55, "color": f"C{i}", "label": f"{arm.name}, round {last.k}"}
        per_row.hist(episode, **kw)
        per_token.hist(tokens, **kw)
    if not drawn:
        return None
    per_row.set(title="A^E per step row", xlabel="advantage", ylabel="rows")
    per_token.set(title="token advantage (A^E + lambda A^D), trained tokens", xlabel="advantage",
                  ylabel="tokens", yscale="log")
    for ax in (per_row, per_token):
        ax.legend(fontsize=7)
    return Figure("advantages", "Advantage distributions",
                  "Last round of each arm: the episode-level advantage of every step row, and the advantage of "
                  "every trained response token (the diff-level term spreads the token values).", _png(fig))


def anchor_figure(arms: Sequence[Arm]) -> Figure | None:
    """Histograms of anchor group size (distinct rows n) and groupability score GS (last round per arm)."""
    fig, axes = _subplots(2)
    sizes, scores = axes[0]
    drawn = False
    for i, arm in enumerate(arms):
        last = arm.rounds[-1]
        anchors = last.rows("anchors")
        if not anchors:
            continue
        drawn = True
        n = [a["n_rows"] for a in anchors]
        sizes.hist(n, bins=[b - 0.5 for b in range(2, max(n) + 2)], alpha=0.55, color=f"C{i}", rwidth=0.8,
                   label=f"{arm.name}, round {last.k}")
        sizes.set_xticks(range(2, max(n) + 1))
        scores.hist([a["gs"] for a in anchors], bins=[j / 20 for j in range(21)], alpha=0.55, color=f"C{i}",
                    label=f"{arm.name}, round {last.k}")
    if not drawn:
        return None
    sizes.set(title="anchor size (distinct rows n)", xlabel="n", ylabel="anchors")
    scores.set(title="groupability score GS", xlabel="GS", ylabel="anchors", xlim=(0, 1))
    for ax in (sizes, scores):
        ax.legend(fontsize=7)
    return Figure("anchors", "Anchor sizes and groupability",
                  "Last round of each arm: how many distinct step rows each selected anchor groups, and its "
                  "groupability score GS = (1 - exp(-L/s0)) (1 - exp(-(n-1)/g0)).", _png(fig))


def coverage_figure(arms: Sequence[Arm]) -> Figure | None:
    """Share of changed-code tokens that received a diff-level advantage, per round and arm."""
    fig, axes = _subplots(1)
    ax = axes[0][0]
    drawn = False
    for i, arm in enumerate(arms):
        points = [(r.k, r.coverage) for r in arm.rounds if r.coverage is not None]
        if points:
            drawn = True
            ax.plot(*zip(*points, strict=True), "o-", color=f"C{i}", label=arm.name)
    if not drawn:
        return None
    ax.set(title="coverage of changed code by diff-level credit", xlabel="round", ylabel="share of tokens",
           ylim=(0, 1.02))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return Figure("coverage", "Coverage",
                  "Response tokens that wrote a change and whose stored advantage has a diff-level term (A^E + "
                  "lambda x a diff term instead of A^E alone): the paper's anchors for didpo, line units for "
                  "didpo_did, none for grpo.",
                  _png(fig))


def figures(arms: Sequence[Arm]) -> tuple[list[Figure], list[str]]:
    """The page's figures and, for each one that had no data, a sentence saying why it is missing."""
    out, missing = [curve_figure(arms)], []
    for make, why in ((advantage_figure, "no advantages table: credit has not run"),
                      (anchor_figure, "no anchors were selected in the last round of any arm"),
                      (coverage_figure, "no response token wrote a change in any round")):
        fig = make(arms)
        (out.append(fig) if fig else missing.append(why))
    return out, missing


# ---- credit-unit explorer -------------------------------------------------------------------------------


_NEGATIVE, _POSITIVE = (226, 74, 74), (58, 170, 80)  # full-scale red and green backgrounds


def _colour(value: float, scale: float) -> str:
    """Diverging background: white at 0, blending to red (negative) or green (positive) at |value| = scale."""
    x = max(-1.0, min(1.0, value / scale)) if scale > 0 else 0.0
    target = _NEGATIVE if x < 0 else _POSITIVE
    r, g, b = (round(255 + abs(x) * (c - 255)) for c in target)
    return f"rgb({r},{g},{b})"


def coloured_response(text: str, starts: Sequence[int], ends: Sequence[int], values: Sequence[float],
                      scale: float) -> str:
    """HTML of `text` with token i's character span [starts[i], ends[i]) on a background coloured by
    values[i]; the text is escaped, characters outside every token are shown plain."""
    out, cursor = [], 0
    for s, e, v in sorted(zip(starts, ends, values, strict=True)):
        s = max(s, cursor)  # byte-level tokens may share a character: show it once
        if e <= s:
            continue
        if s > cursor:
            out.append(html.escape(text[cursor:s]))
        out.append(f'<span class="tok" style="background:{_colour(v, scale)}" title="{v:+.4f}">'
                   f"{html.escape(text[s:e])}</span>")
        cursor = e
    out.append(html.escape(text[cursor:]))
    return "".join(out)


@dataclass
class Explored:
    """One step shown in the explorer."""

    row_id: str
    task_id: str
    turn: int
    outcome: float
    episode_advantage: float
    html: str  # the coloured response
    anchors: list[dict[str, Any]]  # anchor fields + "members": its `anchor_members` rows


def choose_steps(rnd: RoundData, wanted: Sequence[str], count: int) -> list[str]:
    """`wanted` row ids (ReportError naming one the round lacks), else the `count` rows with the most
    diff-level tokens (then largest |A^E|)."""
    adv = {a["row_id"]: a for a in rnd.rows("advantages")}
    if wanted:
        missing = [w for w in wanted if w not in adv]
        if missing:
            raise ReportError(f"{rnd.path}: no advantages row with row_id {', '.join(missing)}")
        return list(wanted)
    ranked = sorted(adv.values(), key=lambda a: (-a["n_diff_tokens"], -abs(a["episode_advantage"]), a["row_id"]))
    return [a["row_id"] for a in ranked[:count]]


def anchor_members(rnd: RoundData) -> dict[str, list[dict[str, Any]]]:
    """Per anchor id, its member occurrences joined to their step and trajectory, sorted by row_id: row_id,
    subdiff_id, traj_id, sample_index, turn, outcome, episode_return, return_to_go, diff_advantage (NaN
    where the step or trajectory is absent). The one join of anchor_members the report and `didpo explore`
    share."""
    steps = {s["row_id"]: s for s in rnd.rows("steps")}
    trajs = {t["traj_id"]: t for t in rnd.rows("trajectories")}
    out: dict[str, list[dict[str, Any]]] = {}
    for m in sorted(rnd.rows("anchor_members"), key=lambda m: (m["row_id"], m["subdiff_id"])):
        step = steps.get(m["row_id"], {})
        traj = trajs.get(step.get("traj_id"), {})
        out.setdefault(m["anchor_id"], []).append({
            "row_id": m["row_id"], "subdiff_id": m["subdiff_id"], "traj_id": step.get("traj_id"),
            "sample_index": traj.get("sample_index"), "turn": step.get("turn"),
            "outcome": traj.get("outcome", math.nan), "episode_return": traj.get("episode_return", math.nan),
            "return_to_go": step.get("return_to_go", math.nan), "diff_advantage": m["diff_advantage"]})
    return out


def colour_scale(token_advantages: Sequence[Sequence[float]]) -> float:
    """Full colour at the largest |token advantage| among the shown rows: one scale, comparable colours."""
    return max((abs(v) for values in token_advantages for v in values), default=0.0)


def explore(rnd: RoundData, row_ids: Sequence[str]) -> list[Explored]:
    steps = {s["row_id"]: s for s in rnd.rows("steps")}
    adv = {a["row_id"]: a for a in rnd.rows("advantages")}
    outcome = {t["traj_id"]: t["outcome"] for t in rnd.rows("trajectories")}
    anchors = {a["anchor_id"]: a for a in rnd.rows("anchors")}
    members = anchor_members(rnd)
    of_row: dict[str, list[str]] = {}
    for anchor_id, ms in members.items():
        for m in ms:
            of_row.setdefault(m["row_id"], []).append(anchor_id)
    scale = colour_scale([adv[r]["token_advantages"] for r in row_ids])
    out = []
    for r in row_ids:
        s, a = steps[r], adv[r]
        listed = [{**anchors[anchor_id], "members": members[anchor_id]}
                  for anchor_id in sorted(set(of_row.get(r, [])), key=lambda i: -anchors[i]["gs"])]
        out.append(Explored(r, s["task_id"], s["turn"], outcome.get(s["traj_id"], math.nan),
                            a["episode_advantage"], coloured_response(
                                s["response_text"], s["token_char_starts"], s["token_char_ends"],
                                a["token_advantages"], scale), listed))
    return out


# ---- page --------------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;line-height:1.4}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.25em .5em;text-align:right}th{background:#f4f4f4}
td.l,th.l{text-align:left}figure{margin:1em 0}figure img{max-width:100%}
figcaption{font-size:.85em;color:#555}.note{color:#a33;font-size:.9em}
pre.resp{white-space:pre-wrap;font-size:.8em;background:#fafafa;border:1px solid #ddd;padding:.6em}
.tok{border-radius:2px}details{margin:.3em 0 1em}code{font-size:.85em}
"""


def _num(x: Any, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _round_table(arms: Sequence[Arm]) -> str:
    head = ("arm", "round", "rollouts", "lost to sandbox", "steps", "mean return", "pass rate", "held-out pass",
            "invalid rate", "anchors", "coverage")
    rows = []
    for arm in arms:
        for r in arm.rounds:
            cells = (html.escape(arm.name), r.k, r.rollouts, r.lost_to_sandbox, r.metrics["steps"],
                     _num(r.mean_return, "+.3f"), _num(r.pass_rate, ".2f"), _num(r.heldout_pass_rate, ".2f"),
                     _num(r.invalid_rate, ".2f"), r.metrics["anchors"], _num(r.coverage, ".2f"))
            rows.append("<tr>" + "".join(f'<td{" class=l" if i == 0 else ""}>{c}</td>'
                                         for i, c in enumerate(cells)) + "</tr>")
    header = "".join(f'<th{" class=l" if i == 0 else ""}>{h}</th>' for i, h in enumerate(head))
    return (f"<table><tr>{header}</tr>{''.join(rows)}</table><p>Rollouts include those lost to sandbox failures "
            "(dead-lettered at the retry cap); the pass rate counts them as not passing, the mean return leaves "
            "them out (they have none).</p>")


def _benchmark_table(arms: Sequence[Arm]) -> str:
    """The `didpo eval` summaries found in the rounds (pass@k per benchmark and subset)."""
    found = [(arm, r, row) for arm in arms for r in arm.rounds for row in r.benchmarks]
    if not found:
        return ""
    ks = sorted({c for _, _, row in found for c in row if c.startswith("pass_at_")}, key=lambda c: int(c[8:]))
    head = ["arm", "round", "benchmark", "subset", "tasks", *(c.replace("pass_at_", "pass@") for c in ks),
            "invalid rate", "mean turns"]
    rows = []
    for arm, r, row in found:
        cells = [html.escape(arm.name), r.k, html.escape(row["benchmark"]), html.escape(row["subset"]), row["tasks"],
                 *(_num(row.get(c), ".3f") for c in ks), _num(row["invalid_rate"], ".2f"),
                 _num(row["mean_turns"], ".2f")]
        rows.append("<tr>" + "".join(f'<td{" class=l" if i in (0, 2, 3) else ""}>{c}</td>'
                                     for i, c in enumerate(cells)) + "</tr>")
    header = "".join(f'<th{" class=l" if i in (0, 2, 3) else ""}>{h}</th>' for i, h in enumerate(head))
    return f"<h2>Benchmark evaluation</h2><table><tr>{header}</tr>{''.join(rows)}</table>"


def _explorer_html(explored: Sequence[Explored], arm: Arm, rnd: RoundData) -> str:
    parts = [f"<p>{html.escape(arm.name)}, round {rnd.k}. Each token's background is its advantage "
             "(red negative, green positive, white zero; hover for the value).</p>"]
    for e in explored:
        parts.append(f'<h3 id="row-{html.escape(e.row_id)}">step <code>{html.escape(e.row_id)}</code>: '
                     f"{html.escape(e.task_id)}, turn {e.turn}, outcome {_num(e.outcome, '.0f')}, "
                     f"A^E {_num(e.episode_advantage, '+.3f')}</h3>")
        parts.append(f'<pre class="resp">{e.html}</pre>')
        if not e.anchors:
            parts.append("<p>No anchor covers this step: every token carries A^E.</p>")
        for a in e.anchors:
            members = "".join(
                f"<tr><td class=l><code>{html.escape(m['row_id'])}</code></td><td>{_num(m['outcome'], '.0f')}"
                f"</td><td>{_num(m['return_to_go'], '+.3f')}</td><td>{_num(m['diff_advantage'], '+.3f')}</td></tr>"
                for m in a["members"])
            parts.append(
                f'<details class="anchor"><summary>anchor <code>{html.escape(a["anchor_id"])}</code> '
                f"({html.escape(a['edit_type'])}): n={a['n_rows']}, GS {a['gs']:.3f}, "
                f"{a['mean_lines']:.1f} lines</summary><pre>{html.escape(a['text'])}</pre>"
                "<table><tr><th class=l>member row</th><th>outcome</th><th>R_t</th><th>A^D</th></tr>"
                f"{members}</table></details>")
    return "\n".join(parts)


def _figure_html(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (f'<figure id="fig-{f.name}"><img alt="{html.escape(f.title)}" '
            f'src="data:image/png;base64,{data}"><figcaption><b>{html.escape(f.title)}.</b> '
            f"{html.escape(f.caption)}</figcaption></figure>")


def render_page(arms: Sequence[Arm], figs: Sequence[Figure], missing: Sequence[str],
                explored: Sequence[Explored], preface: str = "") -> str:
    """The page; `preface` is trusted HTML placed before the rounds (e.g. `didpo compare`'s summary)."""
    names = ", ".join(arm.name for arm in arms)
    body = [f"<h1>DiDPO report</h1><p>Runs: {html.escape(names)}</p>", preface, "<h2>Rounds</h2>",
            _round_table(arms), _benchmark_table(arms)]
    body.append("<h2>Figures</h2>")
    body += [_figure_html(f) for f in figs]
    body += [f'<p class="note">Not shown: {html.escape(m)}.</p>' for m in missing]
    body.append("<h2>Credit-unit explorer</h2>")
    last_arm = arms[0]
    body.append(_explorer_html(explored, last_arm, last_arm.rounds[-1]) if explored
                else "<p>No advantages table in the last round: nothing to explore.</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>DiDPO report: "
            f"{html.escape(names)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


@dataclass
class Report:
    page: Path
    pngs: list[Path]
    arms: list[Arm]
    explored: list[Explored]


def build_report(runs: Sequence[str | Path], out: str | Path, *, steps: Sequence[str] = (),
                 explore_count: int = 5, preface: str = "", extra_figures: Sequence[Figure] = ()) -> Report:
    """Write <out>/index.html and <out>/<figure>.png for the runs (arms); the explorer shows the last round
    of the first run. `preface` (HTML) and `extra_figures` come first on the page."""
    if not runs:
        raise ReportError("report needs at least one --run folder")
    arms = [load_arm(r) for r in runs]
    figs, missing = figures(arms)
    preface += "".join(_figure_html(f) for f in extra_figures)
    last = arms[0].rounds[-1]
    explored = explore(last, choose_steps(last, steps, explore_count)) if last.rows("advantages") else []
    out = location(out)
    pngs = []
    for f in [*extra_figures, *figs]:
        dest = out / f"{f.name}.png"
        schema.atomic_write(dest, lambda tmp, f=f: Path(tmp).write_bytes(f.png))
        _readable(dest)
        pngs.append(dest)
    page = out / "index.html"
    text = render_page(arms, figs, missing, explored, preface)
    schema.atomic_write(page, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    _readable(page)
    return Report(page, pngs, arms, explored)


def _readable(file: Location) -> None:
    if isinstance(file, Path):
        file.chmod(0o644)  # readable by the web server or colleague that opens the page (objects have ACLs)


def report_cmd(
    run: list[str] = typer.Option(..., "--run", help="run folder runs/<run_id>, local or an object-store URL "
                                  "(repeat: one per estimator arm)"),
    out: str | None = typer.Option(None, help="output folder (default: <first run>/report)"),
    step: list[str] = typer.Option([], "--step", help="row_id to show in the credit-unit explorer (repeatable)"),
    explore_count: int = typer.Option(5, "--explore", min=0, help="steps in the explorer when no --step is given"),
) -> None:
    """Write an offline HTML report (and PNGs): curves, advantage and anchor distributions, a credit explorer."""
    try:
        report = build_report(run, out or location(run[0]) / "report", steps=step, explore_count=explore_count)
    except ReportError as e:
        raise Refused(str(e)) from None
    typer.echo(f"report: {report.page} ({len(report.pngs)} figures, {len(report.explored)} explored steps)")
