"""`didpo explore --run DIR`: one self-contained, interactive HTML page over a run's credit units.

1. Every round=<k> folder of every `--run` is read with the report's readers (`workflows.report.load_arm`).
2. Each step row becomes a record: its trajectory's outcome and return, its advantages, the anchors whose
   members it wrote; its response coloured by token advantage (`report.coloured_response`, the report's
   colours) and its file changes as a side-by-side diff (difflib), both pre-rendered here. An anchor id
   hashes a task's unit of code, so one id recurs across rounds: the page merges them, with every member.
3. The page embeds the records as JSON with its CSS and JS inline (no network): search and filters (round,
   task, estimator, anchor, outcome, min GS, A^E range), the matching steps, a step view, an anchor view
   listing the anchor's members across rollouts with their returns. The filters live in the URL hash
   (`#round=0&outcome=pass&anchor=<id>&step=<row_id>`), so a view can be linked or bookmarked.
4. The page stays bounded: at most `--max-steps` steps (those with the most diff-level credit), and `--where`
   (the hash syntax) narrows them before the cap. `--serve` serves the page on 127.0.0.1 until Ctrl-C.
"""

from __future__ import annotations

import difflib
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import zip_longest
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import typer

from pipeline import schema
from pipeline.storage import location
from workflows.errors import Refused, UserError
from workflows.report import (
    Arm,
    ReportError,
    RoundData,
    anchor_members,
    colour_scale,
    coloured_response,
    load_arm,
)

DEFAULT_MAX_STEPS = 300  # a coloured response is ~80 bytes per token: ~15 MB at 500 tokens a step
MAX_DIFF_ROWS = 400  # per file: a step that writes a huge file still renders a bounded diff
FILTER_KEYS = ("q", "round", "task", "estimator", "anchor", "outcome", "gs", "amin", "amax")
_NUMERIC = ("gs", "amin", "amax")


# ---- records -----------------------------------------------------------------------------------------------


def _num(x: Any) -> float | None:
    """A JSON-safe number: float32 noise rounded off, NaN (no trajectory, no advantage) as None."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 4)


def step_records(run: str, rnd: RoundData) -> list[dict[str, Any]]:
    """One record per step row of the round (no HTML yet): what the filters and the list need."""
    trajs = {t["traj_id"]: t for t in rnd.rows("trajectories")}
    adv = {a["row_id"]: a for a in rnd.rows("advantages")}
    anchors = {a["anchor_id"]: a["gs"] for a in rnd.rows("anchors")}
    of_row: dict[str, set[str]] = {}
    for m in rnd.rows("anchor_members"):
        of_row.setdefault(m["row_id"], set()).add(m["anchor_id"])
    out = []
    for s in rnd.rows("steps"):
        t, a = trajs.get(s["traj_id"], {}), adv.get(s["row_id"], {})
        out.append({
            "row_id": s["row_id"], "run": run, "round": rnd.k, "task_id": s["task_id"], "traj_id": s["traj_id"],
            "sample_index": t.get("sample_index"), "turn": s["turn"], "action_kind": s["action_kind"],
            "exec_status": s["exec_status"], "outcome": _num(t.get("outcome")),
            "episode_return": _num(t.get("episode_return")), "return_to_go": _num(s["return_to_go"]),
            "estimator": a.get("estimator"), "lam": _num(a.get("lam")),
            "episode_advantage": _num(a.get("episode_advantage")), "n_diff_tokens": a.get("n_diff_tokens", 0),
            # highest GS first: the step view lists its strongest anchors on top
            "anchors": sorted(of_row.get(s["row_id"], ()), key=lambda i: (-anchors.get(i, 0.0), i)),
            # the best GS among them in this round (the min-GS filter), None when no anchor covers the step
            "gs": _num(max((anchors.get(i, 0.0) for i in of_row.get(s["row_id"], ())), default=None)),
            "text": s["response_text"],
        })
    return out


def anchor_records(run: str, rnd: RoundData) -> list[dict[str, Any]]:
    """The round's anchors: their anchors-table fields and their members joined to steps and trajectories,
    each stamped with its run and round."""
    members = anchor_members(rnd)
    out = []
    for a in rnd.rows("anchors"):
        listed = [{**m, "run": run, "round": rnd.k,
                   **{k: _num(m[k]) for k in ("outcome", "episode_return", "return_to_go", "diff_advantage")}}
                  for m in members.get(a["anchor_id"], [])]
        out.append({**a, "run": run, "round": rnd.k, "gs": _num(a["gs"]), "mean_lines": _num(a["mean_lines"]),
                    "members": listed})
    return out


def merge_anchors(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per anchor id, what the page shows: task, edit type and text (of its first round), its statistics per
    run and round ("rounds": n_rows, n_members, mean_lines, gs) and every member occurrence of every round."""
    out: dict[str, dict[str, Any]] = {}
    for a in records:
        merged = out.setdefault(a["anchor_id"], {k: a[k] for k in ("anchor_id", "task_id", "edit_type", "text")}
                                | {"rounds": [], "members": []})
        merged["rounds"].append({k: a[k] for k in ("run", "round", "n_rows", "n_members", "mean_lines", "gs")})
        merged["members"] += a["members"]
    return out


# ---- filters (the page's JS `matches` mirrors this rule) -------------------------------------------------


def parse_filters(query: str) -> dict[str, Any]:
    """`round=0&outcome=pass&anchor=<id>` (a leading '#' allowed) -> typed filters; UserError names a bad
    key or value."""
    filters: dict[str, Any] = {}
    for key, value in parse_qsl(query.lstrip("#"), keep_blank_values=False):
        if key == "step":
            continue  # opens a step on the page, filters nothing
        if key not in FILTER_KEYS:
            raise UserError(f"filter {key!r}: unknown (known: {', '.join(FILTER_KEYS)}, step)")
        try:
            if key == "round":
                filters[key] = int(value)
            elif key in _NUMERIC:
                filters[key] = float(value)
                if not math.isfinite(filters[key]):
                    raise ValueError
            else:
                filters[key] = value
        except ValueError:
            raise UserError(f"filter {key}={value!r}: expected a number") from None
        if key == "outcome" and value not in ("pass", "fail"):
            raise UserError(f"filter outcome={value!r}: expected pass or fail")
    return filters


def matches(step: Mapping[str, Any], anchors: Mapping[str, Mapping[str, Any]], f: Mapping[str, Any]) -> bool:
    """Whether a step record passes every filter: `q` is a case-insensitive substring of the task id, the
    response or a covering anchor's text; `gs` a minimum GS of a covering anchor (in the step's round);
    `amin`/`amax` bound A^E."""
    if "q" in f:
        covering = (anchors[a]["text"] for a in step["anchors"] if a in anchors)
        hay = "\n".join([step["task_id"], step["text"], *covering]).lower()
        if f["q"].lower() not in hay:
            return False
    if "round" in f and step["round"] != f["round"]:
        return False
    if "task" in f and step["task_id"] != f["task"]:
        return False
    if "estimator" in f and step["estimator"] != f["estimator"]:
        return False
    if "anchor" in f and f["anchor"] not in step["anchors"]:
        return False
    outcome = step["outcome"]
    if "outcome" in f and (outcome is None or (outcome >= 1) != (f["outcome"] == "pass")):
        return False
    if "gs" in f and (step["gs"] is None or step["gs"] < f["gs"]):
        return False
    adv = step["episode_advantage"]
    if "amin" in f and (adv is None or adv < f["amin"]):
        return False
    return not ("amax" in f and (adv is None or adv > f["amax"]))


def select(steps: Sequence[Mapping[str, Any]], anchors: Mapping[str, Mapping[str, Any]],
           filters: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in steps if matches(s, anchors, filters)]


# ---- diffs -------------------------------------------------------------------------------------------------


def side_by_side(before: Sequence[Mapping[str, str]], after: Sequence[Mapping[str, str]]) -> str:
    """HTML tables, one per file the step touched: before on the left, after on the right, changed lines
    with 3 lines of context (difflib), at most MAX_DIFF_ROWS rows per file."""
    old = {f["path"]: f["text"] for f in before}
    new = {f["path"]: f["text"] for f in after}
    if not old and not new:
        return '<p class="muted">This step changed no file.</p>'
    parts = []
    for path in sorted(old.keys() | new.keys()):
        a, b = old.get(path), new.get(path)
        state = "created" if a is None else "deleted" if b is None else "unchanged" if a == b else "modified"
        parts.append(f'<h4 class="file">{html.escape(path)} <span class="muted">({state})</span></h4>')
        if a == b:
            continue
        a_lines, b_lines = (a or "").splitlines(), (b or "").splitlines()
        rows: list[str] = []
        for g, group in enumerate(difflib.SequenceMatcher(None, a_lines, b_lines, autojunk=False)
                                  .get_grouped_opcodes(3)):
            if g:
                rows.append('<tr class="gap"><td colspan="4">&hellip;</td></tr>')
            for tag, i1, i2, j1, j2 in group:
                left = [(i + 1, a_lines[i]) for i in range(i1, i2)]
                right = [(j + 1, b_lines[j]) for j in range(j1, j2)]
                for lft, rgt in zip_longest(left, right):
                    rows.append("<tr>" + _cell(lft, "" if tag == "equal" else "del")
                                + _cell(rgt, "" if tag == "equal" else "add") + "</tr>")
        if len(rows) > MAX_DIFF_ROWS:
            rows = [*rows[:MAX_DIFF_ROWS], f'<tr class="gap"><td colspan="4">{len(rows) - MAX_DIFF_ROWS} more '
                                           "rows not shown</td></tr>"]
        parts.append('<table class="diff"><colgroup><col class="n"><col><col class="n"><col></colgroup>'
                     '<tr><th colspan="2">before</th><th colspan="2">after</th></tr>'
                     + "".join(rows) + "</table>")
    return "".join(parts)


def _cell(line: tuple[int, str] | None, cls: str) -> str:
    if line is None:
        return '<td class="n"></td><td class="d empty"></td>'
    return f'<td class="n">{line[0]}</td><td class="d {cls}">{html.escape(line[1])}</td>'


# ---- assembly ----------------------------------------------------------------------------------------------


@dataclass
class ExploreData:
    """What the page embeds."""

    runs: list[str]
    steps: list[dict[str, Any]]  # the embedded step records, with "html" and "diff", in display order
    anchors: dict[str, dict[str, Any]]  # every anchor covering an embedded step
    matched: int  # steps that pass --where, before the cap
    total: int  # steps in the runs
    scale: float  # |token advantage| at full colour
    where: str

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "steps": self.steps, "anchors": self.anchors, "matched": self.matched,
                "total": self.total, "scale": self.scale, "where": self.where}


def assemble(arms: Sequence[Arm], *, max_steps: int = DEFAULT_MAX_STEPS, where: str = "") -> ExploreData:
    """The records of every round of every arm; `where` (hash syntax) narrows them, then the `max_steps`
    with the most diff-level credit (then largest |A^E|) are kept and rendered."""
    filters = parse_filters(where)
    records, per_round, raw = [], [], {}
    for arm in arms:
        for rnd in arm.rounds:
            records += step_records(arm.name, rnd)
            per_round += anchor_records(arm.name, rnd)
            adv = {a["row_id"]: a for a in rnd.rows("advantages")}
            raw.update({(arm.name, s["row_id"]): (s, adv.get(s["row_id"])) for s in rnd.rows("steps")})
    anchors = merge_anchors(per_round)
    chosen = select(records, anchors, filters)
    kept = sorted(chosen, key=lambda r: (-r["n_diff_tokens"], -abs(r["episode_advantage"] or 0.0),
                                         r["round"], r["row_id"]))[:max_steps]
    kept.sort(key=lambda r: (r["run"], r["round"], r["task_id"], r["sample_index"] or 0, r["turn"]))
    scale = colour_scale([adv["token_advantages"] for r in kept if (adv := raw[r["run"], r["row_id"]][1])])
    steps = []
    for r in kept:
        s, adv = raw[r["run"], r["row_id"]]
        coloured = (coloured_response(s["response_text"], s["token_char_starts"], s["token_char_ends"],
                                      adv["token_advantages"], scale) if adv else html.escape(s["response_text"]))
        steps.append({**r, "html": coloured, "diff": side_by_side(s["files_before"], s["files_after"])})
    shown = {a for r in kept for a in r["anchors"]}
    return ExploreData([arm.name for arm in arms], steps, {k: v for k, v in anchors.items() if k in shown},
                       len(chosen), len(records), round(scale, 4), where.lstrip("#"))


# ---- page --------------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;margin:1em;color:#222;line-height:1.35;font-size:14px}
h1{font-size:1.4em;margin:.2em 0}h3{margin:.3em 0}h4.file{margin:.8em 0 .2em;font-size:.95em}
#filters{display:flex;flex-wrap:wrap;gap:.4em 1em;padding:.5em;background:#f4f4f4;border:1px solid #ddd}
#filters label{white-space:nowrap}#filters input[type=number]{width:5em}#f-anchor,#f-task{max-width:16em}
#main{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:1em;margin-top:.6em}
#list{max-height:85vh;overflow:auto}#steps{font-size:.8em}#steps td{white-space:nowrap}table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:.15em .4em;text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}
tr.step{cursor:pointer}tr.step:hover{background:#eef}tr.step.sel{background:#dde6ff}
pre.resp,pre.atext{white-space:pre-wrap;font-size:.8em;background:#fafafa;border:1px solid #ddd;padding:.5em}
.tok{border-radius:2px}.muted{color:#777}.note{color:#a33}section{margin-bottom:1em}
table.diff{font-family:monospace;font-size:.78em;width:100%;table-layout:fixed}
table.diff col.n{width:3.5em}table.diff td.n{color:#999}table.diff td.d{text-align:left;white-space:pre-wrap;word-break:break-all}
td.del{background:#fbe3e3}td.add{background:#e3f6e6}td.empty{background:#f6f6f6}tr.gap td{text-align:center;color:#999}
a.anchor-link,a.row-link{cursor:pointer;color:#1a4fd6}
"""

# The page's logic. `matches` mirrors workflows/explore.py `matches`: change both together.
JS = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("didpo-data").textContent);
const KEYS = ["q", "round", "task", "estimator", "anchor", "outcome", "gs", "amin", "amax"];
const NUMERIC = ["round", "gs", "amin", "amax"];
const byRow = new Map(DATA.steps.map(s => [s.row_id, s]));
const several = DATA.runs.length > 1;  // show the run column only when there is a choice
const el = id => document.getElementById(id);
const esc = s => String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const fmt = (x, d, sign) => x === null || x === undefined ? "-" : (sign && x >= 0 ? "+" : "") + x.toFixed(d);
const passFail = o => o === null ? "-" : (o >= 1 ? "pass" : "fail");
let state = {f: {}, step: null};

function matches(s, f) {
  if ("q" in f) {
    const covering = s.anchors.filter(a => a in DATA.anchors).map(a => DATA.anchors[a].text);
    const hay = [s.task_id, s.text, ...covering].join("\n").toLowerCase();
    if (!hay.includes(f.q.toLowerCase())) return false;
  }
  if ("round" in f && s.round !== Number(f.round)) return false;
  if ("task" in f && s.task_id !== f.task) return false;
  if ("estimator" in f && s.estimator !== f.estimator) return false;
  if ("anchor" in f && !s.anchors.includes(f.anchor)) return false;
  if ("outcome" in f && (s.outcome === null || (s.outcome >= 1) !== (f.outcome === "pass"))) return false;
  if ("gs" in f && (s.gs === null || s.gs < Number(f.gs))) return false;
  const adv = s.episode_advantage;
  if ("amin" in f && (adv === null || adv < Number(f.amin))) return false;
  if ("amax" in f && (adv === null || adv > Number(f.amax))) return false;
  return true;
}

function valid(k, v) {
  if (v === "") return false;
  if (NUMERIC.includes(k)) return Number.isFinite(Number(v));
  if (k === "outcome") return v === "pass" || v === "fail";
  return true;
}

function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  const f = {};
  for (const k of KEYS) { const v = p.get(k); if (v !== null && valid(k, v)) f[k] = v; }
  return {f, step: p.get("step") || null};
}

function writeHash() {
  const p = new URLSearchParams();
  for (const k of KEYS) if (k in state.f) p.set(k, state.f[k]);
  if (state.step) p.set("step", state.step);
  try { history.replaceState(null, "", "#" + p.toString()); } catch (e) { /* file:// in some browsers */ }
}

function option(sel, value, label) {
  const o = document.createElement("option");
  o.value = value; o.textContent = label; sel.appendChild(o);
}

function fillSelects() {
  const uniq = xs => [...new Set(xs.filter(x => x !== null && x !== undefined))].sort((a, b) => a < b ? -1 : a > b ? 1 : 0);
  for (const r of uniq(DATA.steps.map(s => s.round))) option(el("f-round"), String(r), String(r));
  for (const t of uniq(DATA.steps.map(s => s.task_id))) option(el("f-task"), t, t);
  for (const e of uniq(DATA.steps.map(s => s.estimator))) option(el("f-estimator"), e, e);
  const best = a => Math.max(...a.rounds.map(r => r.gs ?? 0));
  const anchors = Object.values(DATA.anchors).sort((a, b) => best(b) - best(a) || (a.anchor_id < b.anchor_id ? -1 : 1));
  for (const a of anchors) option(el("f-anchor"), a.anchor_id, `GS ${fmt(best(a), 2)} ${a.task_id} ${a.anchor_id.slice(0, 10)}`);
}

// the anchor's statistics in the step's own run and round
const inRound = (a, s) => a.rounds.find(r => r.run === s.run && r.round === s.round) || {};

function setForm() {
  for (const k of KEYS) {
    const input = el("f-" + k), v = state.f[k] ?? "";
    if (input.tagName === "SELECT" && v !== "" && ![...input.options].some(o => o.value === v)) option(input, v, v + " (not on this page)");
    input.value = v;
  }
}

function readForm() {
  state.f = {};
  for (const k of KEYS) { const v = el("f-" + k).value.trim(); if (valid(k, v)) state.f[k] = v; }
}

function rowHtml(s) {
  const sel = s.row_id === state.step ? " sel" : "";
  return `<tr class="step${sel}" data-row="${esc(s.row_id)}"><td>${s.round}</td><td class="l">${esc(s.task_id)}</td>` +
    `<td>${s.sample_index ?? "-"}</td><td>${s.turn}</td><td class="l">${esc(s.action_kind)}</td>` +
    `<td class="l">${passFail(s.outcome)}</td><td>${fmt(s.return_to_go, 3, true)}</td>` +
    `<td>${fmt(s.episode_advantage, 3, true)}</td><td>${s.n_diff_tokens}</td><td>${s.anchors.length}</td></tr>`;
}

function renderList() {
  const rows = DATA.steps.filter(s => matches(s, state.f));
  el("count").textContent = `${rows.length} of ${DATA.steps.length} steps on this page match.`;
  el("rows").innerHTML = rows.map(rowHtml).join("");
}

function renderAnchor() {
  const view = el("anchor-view"), id = state.f.anchor;
  if (!id) { view.innerHTML = ""; return; }
  const a = DATA.anchors[id];
  if (!a) { view.innerHTML = `<p class="note">Anchor <code>${esc(id)}</code> covers no step on this page.</p>`; return; }
  const members = a.members.map(m => {
    const row = byRow.has(m.row_id) ? `<a class="row-link" data-open="${esc(m.row_id)}">${esc(m.row_id.slice(0, 12))}</a>`
                                    : `<span class="muted" title="not on this page">${esc(m.row_id.slice(0, 12))}</span>`;
    return `<tr class="member" data-row="${esc(m.row_id)}"><td class="l">${row}</td>${several ? `<td class="l">${esc(m.run)}</td>` : ""}` +
      `<td>${m.round}</td><td>${m.sample_index ?? "-"}</td><td>${m.turn ?? "-"}</td><td class="l">${passFail(m.outcome)}</td>` +
      `<td>${fmt(m.episode_return, 3, true)}</td><td>${fmt(m.return_to_go, 3, true)}</td><td>${fmt(m.diff_advantage, 3, true)}</td></tr>`;
  }).join("");
  const rounds = a.rounds.map(r => `<tr>${several ? `<td class="l">${esc(r.run)}</td>` : ""}<td>${r.round}</td><td>${r.n_rows}</td>` +
    `<td>${r.n_members}</td><td>${fmt(r.mean_lines, 1)}</td><td>${fmt(r.gs, 3)}</td></tr>`).join("");
  const run = several ? '<th class="l">run</th>' : "";
  view.innerHTML = `<h3>Anchor <code>${esc(a.anchor_id.slice(0, 16))}</code> <button type="button" id="close-anchor">close</button></h3>` +
    `<p>${esc(a.task_id)}, ${esc(a.edit_type)}; ${a.members.length} member occurrences in ${a.rounds.length} round(s).</p>` +
    `<pre class="atext">${esc(a.text)}</pre><table id="anchor-rounds"><tr>${run}<th>round</th><th>rows n</th><th>members</th>` +
    `<th>lines</th><th>GS</th></tr>${rounds}</table><table id="members"><tr><th class="l">member row</th>${run}<th>round</th>` +
    `<th>sample</th><th>turn</th><th class="l">outcome</th><th>R_0</th><th>R_t</th><th>A^D</th></tr>${members}</table>`;
}

function renderStep() {
  const view = el("step-view"), id = state.step;
  if (!id) { view.innerHTML = '<p class="muted">Click a step to see its coloured response and its diff.</p>'; return; }
  const s = byRow.get(id);
  if (!s) { view.innerHTML = `<p class="note">Step <code>${esc(id)}</code> is not on this page.</p>`; return; }
  const anchors = s.anchors.filter(a => a in DATA.anchors).map(a => DATA.anchors[a]).map(a =>
    `<li><a class="anchor-link" data-anchor="${esc(a.anchor_id)}">${esc(a.anchor_id.slice(0, 16))}</a> ` +
    `(${esc(a.edit_type)}, n=${inRound(a, s).n_rows ?? "-"}, GS ${fmt(inRound(a, s).gs, 3)})</li>`).join("");
  view.innerHTML = `<h3>Step <code>${esc(s.row_id.slice(0, 16))}</code></h3>` +
    `<p>${esc(s.run)}, round ${s.round}, ${esc(s.task_id)}, sample ${s.sample_index ?? "-"}, turn ${s.turn}: ` +
    `${esc(s.action_kind)} (${esc(s.exec_status)}); outcome ${passFail(s.outcome)}, R_0 ${fmt(s.episode_return, 3, true)}, ` +
    `R_t ${fmt(s.return_to_go, 3, true)}; ${esc(s.estimator ?? "no advantages")}: A^E ${fmt(s.episode_advantage, 3, true)}, ` +
    `${s.n_diff_tokens} tokens with diff-level credit</p><pre class="resp">${s.html}</pre>` +
    (anchors ? `<p>Anchors covering this step:</p><ul id="step-anchors">${anchors}</ul>` : "<p>No anchor covers this step.</p>") +
    `<div id="diff">${s.diff}</div>`;
}

function render() { renderList(); renderAnchor(); renderStep(); }

function fromHash() { state = readHash(); setForm(); render(); }

document.addEventListener("click", ev => {
  const t = ev.target.closest("[data-anchor],[data-open],tr.step,#close-anchor,#reset");
  if (!t) return;
  if (t.id === "reset") { state = {f: {}, step: null}; setForm(); }
  else if (t.id === "close-anchor") { delete state.f.anchor; setForm(); }
  else if (t.dataset.anchor) { state.f.anchor = t.dataset.anchor; setForm(); }
  else state.step = t.dataset.open || t.dataset.row;
  writeHash(); render();
});
for (const k of KEYS) el("f-" + k).addEventListener(k === "q" || NUMERIC.includes(k) ? "input" : "change",
                                                     () => { readForm(); writeHash(); render(); });
window.addEventListener("hashchange", fromHash);
fillSelects();
fromHash();
"""


def _page_note(data: ExploreData) -> str:
    note = (f"{len(data.steps)} of {data.total} steps are on this page"
            + (f" ({data.matched} pass --where {html.escape(data.where)})" if data.where else ""))
    if len(data.steps) < data.matched:
        note += ("; the cap (--max-steps) kept those with the most diff-level credit (tokens with a diff-level "
                 "term, then largest |A^E|)")
    return note + "."


def _script_json(value: Any) -> str:
    """JSON that cannot end the <script> element it sits in: no '</' (written '<\\/', the same JSON string)
    and no '<!--' (which would let a '<script' in a response swallow the closing tag)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def render_page(data: ExploreData) -> str:
    names = html.escape(", ".join(data.runs))

    def dropdown(key: str) -> str:  # its options come from the data (the page's JS), outcome's are fixed
        fixed = "<option>pass</option><option>fail</option>" if key == "outcome" else ""
        return f'<label>{key} <select id="f-{key}"><option value="">all</option>{fixed}</select></label>'

    filters = "".join([
        '<label>search <input id="f-q" type="search" size="24" placeholder="task, response or anchor text"></label>',
        *(dropdown(k) for k in ("round", "task", "estimator", "anchor", "outcome")),
        '<label>min GS <input id="f-gs" type="number" step="0.05" min="0" max="1"></label>',
        '<label>A^E from <input id="f-amin" type="number" step="0.1"></label>',
        '<label>to <input id="f-amax" type="number" step="0.1"></label>',
        '<button type="button" id="reset">reset</button>'])
    head = "".join(f'<th{" class=l" if h in ("task", "action", "outcome") else ""}>{h}</th>'
                   for h in ("round", "task", "sample", "turn", "action", "outcome", "R_t", "A^E", "diff tok",
                             "anchors"))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>DiDPO explore: {names}</title><style>{CSS}</style></head><body>\n"
        f"<h1>DiDPO credit-unit explorer</h1><p>Runs: {names}. {_page_note(data)} Token backgrounds are "
        f"advantages: red negative, green positive, full colour at |A| = {data.scale:g} (hover for the value). "
        "The view is in the URL: <code>#round=0&amp;outcome=pass&amp;anchor=&lt;id&gt;&amp;step=&lt;row_id&gt;"
        "</code>.</p>\n"
        f'<form id="filters" onsubmit="return false">{filters}</form>\n'
        '<div id="main"><div id="list"><p id="count"></p><table id="steps"><thead><tr>'
        f'{head}</tr></thead><tbody id="rows"></tbody></table></div>'
        '<div id="detail"><section id="anchor-view"></section><section id="step-view"></section></div></div>\n'
        f'<script type="application/json" id="didpo-data">{_script_json(data.to_json())}</script>\n'
        f"<script>{JS}</script>\n</body></html>\n")


# ---- command -----------------------------------------------------------------------------------------------


def serve(page: bytes, port: int) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:`port` (0: any free port) answering every GET of / with the page."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] not in ("/", "/index.html"):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass  # one line per request would drown the URL line

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def explore_cmd(
    run: list[str] = typer.Option(..., "--run", help="run folder runs/<run_id>, local or an object-store URL "
                                  "(repeat: one per estimator arm)"),
    out: str | None = typer.Option(None, help="HTML file to write (default: <first run>/explore.html; with "
                                   "--serve, only when given)"),
    max_steps: int = typer.Option(DEFAULT_MAX_STEPS, min=1, help="steps embedded in the page at most (those "
                                  "with the most diff-level credit)"),
    where: str = typer.Option("", help="keep only matching steps, in the page's hash syntax, e.g. "
                              "'round=1&outcome=fail'"),
    serve_page: bool = typer.Option(False, "--serve", help="serve the page on 127.0.0.1 until Ctrl-C"),
    port: int = typer.Option(8000, min=0, max=65535, help="port for --serve"),
) -> None:
    """Write (or --serve) an offline interactive page of a run's steps, coloured responses, diffs and anchors."""
    try:
        arms = [load_arm(r) for r in run]
    except ReportError as e:
        raise Refused(str(e)) from None
    data = assemble(arms, max_steps=max_steps, where=where)
    text = render_page(data)
    summary = f"{len(data.steps)} of {data.total} steps, {len(data.anchors)} anchors"
    if out or not serve_page:
        dest = location(out) if out else location(run[0]) / "explore.html"
        schema.atomic_write(dest, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        if isinstance(dest, Path):
            dest.chmod(0o644)  # a page to open or share, like the report's
        typer.echo(f"explore: {dest} ({summary})")
    if serve_page:
        try:
            server = serve(text.encode("utf-8"), port)
        except OSError as e:
            raise UserError(f"--port {port}: {e.strerror}") from None
        typer.echo(f"explore: serving http://127.0.0.1:{server.server_address[1]}/ ({summary}); Ctrl-C stops")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
