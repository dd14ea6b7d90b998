"""The one entry of the credit stage: `compute_credit(steps, settings) -> CreditResult`.

1. Validate rows; order them canonically (task, trajectory, turn) so nothing depends on input order.
2. Returns R_t per row (discount gamma) and R_episode = R_t of the trajectory's lowest-turn row. Rewards and
   R_t are taken at float32, the precision the steps table stores, so the SQL over the tables starts from
   the same numbers.
3. Whole diffs per step; drop exact repeats of a change made earlier in the same trajectory.
4. Multi-scale sub-diff candidates (hunk, windows, AST blocks) of added and deleted lines.
5. Near-duplicate clusters per (task, edit type): MinHash + LSH, exact Jaccard >= eta to a representative.
6. GS per cluster; greedy facility location (<= K per task); per-diff non-overlap cut; drop n <= 1; GS again.
7. A^D per anchor occurrence = R_t(row) - mean over the anchor's distinct rows (adv_norm mode).
8. Project A^D onto the tokens of each occurrence's characters. A token touched by several occurrences
   takes the first in priority order: higher GS (as stored, float32), then more covered characters, then
   the smaller subdiff_id, then the smaller anchor_id (the same total order as sql/advantages_rows.sql).
9. The chosen estimator turns returns and projected A^D into token advantages; the loss mask applies.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, partial

import numpy as np
from threadpoolctl import ThreadpoolController

from pipeline.credit.advantages import group_center, moments_stats, whiten
from pipeline.credit.anchors import Cluster, cut_overlaps, facility_location, groupability
from pipeline.credit.diagnostics import Diagnostics, PhaseTimer
from pipeline.credit.diffs import whole_diff
from pipeline.credit.estimators import EstimatorBatch, EstimatorOutput, get_estimator
from pipeline.credit.inputs import CreditInputError, StepInput, offsets_valid, validate_step
from pipeline.credit.lines import line_units
from pipeline.credit.normalize import comparison_tokens
from pipeline.credit.projection import merge_intervals, token_max, token_runs
from pipeline.credit.returns import episode_returns, returns_to_go
from pipeline.credit.settings import CreditSettings
from pipeline.credit.similarity import ShingleSets, cluster_texts, minhash_signatures
from pipeline.credit.subdiffs import Candidate, ast_blocks, hunk_candidates
from pipeline.schema import columns, content_id

_SCALE_RANK = {"hunk": 0, "ast": 1}  # kept first when a row exceeds max_candidates_per_row


@dataclass
class Anchor:
    """A kept anchor: near-duplicate occurrences of one change in >= 2 rows of one task."""

    anchor_id: str
    task_id: str
    edit_type: str
    members: list[int]  # candidate indices (occurrences), sorted
    gs: float  # GS recomputed after the cut
    n_rows: int  # distinct rows among the members
    mean_lines: float
    text: str  # normalized text of the representative
    representative: int  # candidate index of the representative occurrence
    diff_advantage: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [len(members)] A^D


@dataclass
class CreditResult:
    """Tables (column name -> list, as in the data contract) and diagnostics of one batch."""

    subdiffs: dict[str, list]
    anchors: dict[str, list]
    anchor_members: dict[str, list]
    advantages: dict[str, list]  # one row per input step, in input order
    diagnostics: Diagnostics

    def token_advantages(self, row_id: str) -> np.ndarray:
        i = self.advantages["row_id"].index(row_id)
        return np.asarray(self.advantages["token_advantages"][i], np.float64)


@dataclass
class CreditUnits:
    """Steps 1-8 of one batch: what every estimator reads (`batch`), and the units behind it."""

    steps: Sequence[StepInput]  # as given: the advantages table keeps this order
    rows: list[StepInput]  # canonical order (task, trajectory, turn); `batch` is indexed by it
    batch: EstimatorBatch
    candidates: list[Candidate]
    subdiffs: dict[str, list]
    anchors: list[Anchor]
    diff_covered: list[np.ndarray]  # per row [T]: tokens under an anchor occurrence
    diagnostics: Diagnostics


def reads_units(settings: CreditSettings) -> bool:
    """Whether the estimator reads sub-diffs and anchors: a diff-level estimator with lambda != 0."""
    return get_estimator(settings.estimator).needs_anchors and settings.lam != 0


def reads_lines(settings: CreditSettings) -> bool:
    """Whether the estimator reads line units (`lines.py`): a line-level estimator with lambda != 0."""
    return get_estimator(settings.estimator).needs_lines and settings.lam != 0


def compute_credit(steps: Sequence[StepInput], settings: CreditSettings | None = None) -> CreditResult:
    """Credit assignment of one batch of steps (any number of tasks and trajectories), steps 1-9.

    Sub-diffs and anchors (steps 3-8) are computed only when the estimator reads them (`reads_units`), so a
    grpo batch costs what GRPO costs; `credit_units(steps, settings)` then `assign_advantages` always
    computes them (the credit stage writes them whatever the estimator, for analysis)."""
    settings = settings or CreditSettings()
    return assign_advantages(credit_units(steps, settings, units=reads_units(settings)), settings)


def credit_units(steps: Sequence[StepInput], settings: CreditSettings | None = None, *, units: bool = True
                 ) -> CreditUnits:
    """Steps 1-8 of one batch. With units=False only steps 1-2 run: no sub-diffs, anchors or A^D (every
    token's projected A^D is 0 and nothing is covered). Line units (`lines.py`) are computed when the
    estimator reads them (`reads_lines`), whatever `units` says."""
    settings = settings or CreditSettings()
    diag = Diagnostics()
    timer = PhaseTimer(diag.seconds)
    stats: Counter = Counter()

    with timer.phase("validate"):
        rows = _canonical_rows(steps)
        n = len(rows)
        task_ids = sorted({s.task_id for s in rows})
        traj_ids = sorted({s.traj_id for s in rows})
        task_of = {t: i for i, t in enumerate(task_ids)}
        traj_of = {t: i for i, t in enumerate(traj_ids)}
        task_index = np.array([task_of[s.task_id] for s in rows], np.int64)
        traj_index = np.array([traj_of[s.traj_id] for s in rows], np.int64)
        turn = np.array([s.turn for s in rows], np.int64)
        rewards = np.array([float(s.step_reward) for s in rows], np.float32).astype(np.float64)
        states: dict[tuple[str, str], int] = {}
        state_index = np.array(
            [
                states.setdefault((s.task_id, s.workspace_hash_before or f"\x00{s.row_id}"), len(states))
                for s in rows
            ],
            np.int64,
        )
        diag.n_rows, diag.n_tasks, diag.n_trajectories = n, len(task_ids), len(traj_ids)

    with timer.phase("returns"):
        rtg = returns_to_go(rewards, traj_index, turn, settings.gamma).astype(np.float32).astype(np.float64)
        episode_return = episode_returns(rtg, traj_index, turn) if n else rtg

    candidates: list[Candidate] = []
    anchors: list[Anchor] = []
    if units:
        with timer.phase("diffs"):
            candidates, changed_spans, n_units = _candidates(rows, settings, stats, diag)
            diag.n_candidates = len(candidates)

        with timer.phase("similarity"):
            clusters, cluster_task = _clusters(candidates, rows, settings, diag)

        with timer.phase("anchors"):
            anchors = _select_anchors(clusters, cluster_task, candidates, rows, n_units, settings, task_ids)
            diag.n_anchors = len(anchors)
            diag.mean_group_size = float(np.mean([a.n_rows for a in anchors])) if anchors else 0.0
            for a in anchors:
                # A^D = R_t(row) - mean over the anchor's distinct rows; every occurrence in a row shares it.
                member_rows = np.array([candidates[m].row for m in a.members], np.int64)
                distinct, which = np.unique(member_rows, return_inverse=True)
                per_row = group_center(
                    rtg[distinct], np.zeros(len(distinct), np.int64), settings.adv_norm, settings.std_eps
                )
                a.diff_advantage = per_row[which]

        with timer.phase("projection"):
            subdiffs = _subdiff_table(rows, candidates)
            diff_tokens, diff_covered = _project(
                rows, candidates, anchors, changed_spans, subdiffs, diag
            )
    else:
        subdiffs = _subdiff_table(rows, [])
        diff_tokens = [np.zeros(s.n_tokens) for s in rows]
        diff_covered = [np.zeros(s.n_tokens, bool) for s in rows]

    lines = None
    if reads_lines(settings):
        with timer.phase("lines"):
            lines = line_units(rows, task_index, traj_index, max_file_lines=settings.max_file_lines,
                               max_diff_lines=settings.max_diff_lines, stats=stats)
            diag.line_coverage = lines.n_covered_tokens / lines.n_changed_tokens if lines.n_changed_tokens else 0.0

    batch = EstimatorBatch(
        task_index=task_index,
        traj_index=traj_index,
        state_index=state_index,
        episode_return=episode_return,
        return_to_go=rtg,
        n_tokens=np.array([s.n_tokens for s in rows], np.int64),
        diff_advantage=diff_tokens,
        turn=turn,
        visible_pass_fraction=np.array(
            [np.nan if s.visible_pass_fraction is None else s.visible_pass_fraction for s in rows], np.float64
        ),
        line_units=lines,
    )
    diag.caps = dict(stats)
    return CreditUnits(steps, rows, batch, candidates, subdiffs, anchors, diff_covered, diag)


def assign_advantages(units: CreditUnits, settings: CreditSettings | None = None, *, whiten: bool = True
                      ) -> CreditResult:
    """Step 9: the estimator turns the units into token advantages; the loss mask applies. A batch-scoped
    estimator's advantages are whitened over the trajectories of `units` (whiten=False leaves that to a
    caller that holds only part of the batch: the Beam credit stage). One BLAS thread: the estimators'
    solves are many and small, where more threads only cost (37-303 ms per batch with the default threads
    here, 15-17 ms with one)."""
    settings = settings or CreditSettings()
    diag = units.diagnostics
    timer = PhaseTimer(diag.seconds)
    spec = get_estimator(settings.estimator)
    with timer.phase("estimator"), _blas().limit(limits=1, user_api="blas"):
        output = spec.fn(units.batch, settings)
        if spec.scope == "batch" and whiten:
            output = _whitened(output, units.batch.traj_index, settings.std_eps)
    diff_covered = units.diff_covered
    if units.batch.line_units is not None:  # the line units' changes, not the anchors, carry the diff term
        diff_covered = [owner >= 0 for owner in units.batch.line_units.token_change]
    elif not reads_units(settings):
        diff_covered = [np.zeros(s.n_tokens, bool) for s in units.rows]  # no diff-level term reached a token
    with timer.phase("tables"):
        result = _tables(units.steps, units.rows, units.candidates, units.subdiffs, units.anchors, output,
                         diff_covered, settings)
    result.diagnostics = diag
    diag.seconds.pop("total", None)
    diag.seconds["total"] = sum(diag.seconds.values())
    return result


def _whitened(output: EstimatorOutput, traj_index: np.ndarray, eps: float) -> EstimatorOutput:
    """The output whitened with the mean and std of one episode advantage per trajectory."""
    first = np.unique(traj_index, return_index=True)[1]
    values = output.episode_advantage[first]
    mean, std = moments_stats(len(values), float(values.sum()), float((values**2).sum()))
    return EstimatorOutput(whiten(output.episode_advantage, mean, std, eps),
                           [whiten(t, mean, std, eps) for t in output.token_advantages])


@cache
def _blas() -> ThreadpoolController:
    """The process's thread pools, found once (finding them scans the loaded libraries)."""
    return ThreadpoolController()


def _canonical_rows(steps: Sequence[StepInput]) -> list[StepInput]:
    seen_rows: dict[str, int] = {}
    seen_turns: dict[tuple[str, int], str] = {}
    traj_task: dict[str, str] = {}
    for step in steps:
        validate_step(step, check_offsets=False)
        if step.row_id in seen_rows:
            raise CreditInputError(f"row {step.row_id!r} appears twice in the batch")
        seen_rows[step.row_id] = 1
        other = seen_turns.setdefault((step.traj_id, step.turn), step.row_id)
        if other != step.row_id:
            raise CreditInputError(
                f"rows {other!r} and {step.row_id!r} are both turn {step.turn} of traj {step.traj_id!r}"
            )
        task = traj_task.setdefault(step.traj_id, step.task_id)
        if task != step.task_id:
            raise CreditInputError(
                f"row {step.row_id!r}: traj {step.traj_id!r} belongs to tasks {task!r} and {step.task_id!r}"
            )
    if steps:  # offsets of all rows in one vectorized check; the slow per-row check names the culprit
        lengths = np.array([s.n_tokens for s in steps])
        n_chars = np.repeat(np.array([len(s.response_text) for s in steps]), lengths)
        starts = np.concatenate([s.token_char_starts for s in steps])
        ends = np.concatenate([s.token_char_ends for s in steps])
        if not offsets_valid(starts, ends, n_chars):
            for step in steps:
                validate_step(step)
    return sorted(steps, key=lambda s: (s.task_id, s.traj_id, s.turn))


def _candidates(
    rows: list[StepInput], settings: CreditSettings, stats: Counter, diag: Diagnostics
) -> tuple[list[Candidate], list[list[tuple[int, int]]], int]:
    """All candidates (rows in canonical order), per-row changed-code spans, and the number of line units."""
    candidates: list[Candidate] = []
    changed: list[list[tuple[int, int]]] = [[] for _ in rows]
    units = 0
    seen: set = set()
    current_traj = None
    for r, step in enumerate(rows):
        if step.traj_id != current_traj:
            seen, current_traj = set(), step.traj_id
        row_cands: list[Candidate] = []
        for hunk in whole_diff(step, settings.max_file_lines, settings.max_diff_lines, stats):
            signature = hunk.signature()
            if signature in seen:
                diag.n_repeated_hunks += 1
                continue
            seen.add(signature)
            diag.n_hunks += 1
            for edit_type, lines, source in (
                ("del", hunk.deleted, step.files_before.get(hunk.file, "")),
                ("add", hunk.added, step.files_after.get(hunk.file, "")),
            ):
                if not lines:
                    continue
                changed[r].extend(d.span for d in lines if d.span is not None)
                blocks = partial(ast_blocks, source, settings.max_ast_lines) if settings.ast_blocks else None
                found, used = hunk_candidates(
                    r,
                    hunk.file,
                    edit_type,
                    lines,
                    units,
                    settings.window_sizes,
                    blocks,
                    settings.max_hunk_lines,
                    stats,
                )
                units += used
                row_cands.extend(found)
        if len(row_cands) > settings.max_candidates_per_row:
            stats["candidates_over_cap"] += len(row_cands) - settings.max_candidates_per_row
            row_cands.sort(key=lambda c: (_SCALE_RANK.get(c.scale, 2), -c.n_lines, c.unit_start))
            row_cands = row_cands[: settings.max_candidates_per_row]
        candidates.extend(row_cands)
    return candidates, changed, units


def _clusters(
    candidates: list[Candidate], rows: list[StepInput], settings: CreditSettings, diag: Diagnostics
) -> tuple[list[Cluster], list[int]]:
    """Near-duplicate clusters of candidates, per (task, edit type); returns clusters and their task index."""
    if not candidates:
        return [], []
    canon = settings.canonicalize_identifiers
    text_of: dict[tuple[str, str, tuple[str, ...]], list[int]] = defaultdict(list)
    for i, c in enumerate(candidates):
        text_of[(rows[c.row].task_id, c.edit_type, comparison_tokens(c.text, canon))].append(i)
    keys = sorted(text_of)  # content order: unique index i is the same whatever the input order
    diag.n_unique_texts = len(keys)
    shingles = ShingleSets([k[2] for k in keys], settings.shingle_size)
    signatures = minhash_signatures(shingles, settings.num_perm, settings.seed)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for u, key in enumerate(keys):
        groups[key[:2]].append(u)
    task_order = sorted({rows[c.row].task_id for c in candidates})
    task_of = {t: i for i, t in enumerate(task_order)}
    clusters: list[Cluster] = []
    cluster_task: list[int] = []
    for (task_id, edit_type), uniques in sorted(groups.items()):

        def priority(u: int) -> tuple:
            members = text_of[keys[u]]
            return (-len({candidates[m].row for m in members}), -candidates[members[0]].n_lines, u)

        order = sorted(uniques, key=priority)
        rep_of = cluster_texts(
            order, signatures, shingles, settings.eta, settings.effective_lsh_threshold, settings.seed
        )
        by_rep: dict[int, list[int]] = defaultdict(list)
        for u in order:
            by_rep[rep_of[u]].extend(text_of[keys[u]])
        for rep, members in by_rep.items():
            clusters.append(
                Cluster(key=f"{task_id}\x1f{edit_type}\x1f{' '.join(keys[rep][2])}", members=sorted(members))
            )
            cluster_task.append(task_of[task_id])
    singletons = 0
    for cluster in clusters:
        n_rows = len({candidates[m].row for m in cluster.members})
        singletons += n_rows == 1
        mean_lines = float(np.mean([candidates[m].n_lines for m in cluster.members]))
        cluster.gs = groupability(mean_lines, n_rows, settings.s0, settings.g0, settings.gs_form)
    diag.n_clusters = len(clusters)
    diag.singleton_rate = singletons / len(clusters) if clusters else 0.0
    return clusters, cluster_task


def _select_anchors(
    clusters: list[Cluster],
    cluster_task: list[int],
    candidates: list[Candidate],
    rows: list[StepInput],
    n_units: int,
    settings: CreditSettings,
    task_ids: list[str],
) -> list[Anchor]:
    if not clusters:
        return []
    unit_start = np.array([c.unit_start for c in candidates], np.int64)
    unit_end = np.array([c.unit_end for c in candidates], np.int64)
    candidate_row = np.array([c.row for c in candidates], np.int64)
    chosen: list[Cluster] = []
    by_task: dict[int, list[Cluster]] = defaultdict(list)
    for cluster, task in zip(clusters, cluster_task, strict=True):
        if cluster.gs > 0:
            by_task[task].append(cluster)
    for task in sorted(by_task):
        group = by_task[task]
        picks = facility_location(group, unit_start, unit_end, n_units, settings.max_anchors_per_task)
        chosen.extend(group[p] for p in picks)
    kept = cut_overlaps(chosen, unit_start, unit_end, n_units)
    anchors = []
    for cluster, members in zip(chosen, kept, strict=True):
        n_rows = len({int(candidate_row[m]) for m in members})
        if n_rows <= 1:
            continue
        members = sorted(members)
        mean_lines = float(np.mean([candidates[m].n_lines for m in members]))
        gs = groupability(mean_lines, n_rows, settings.s0, settings.g0, settings.gs_form)
        task_id, edit_type, _ = cluster.key.split("\x1f", 2)
        rep_text = _rep_text(cluster, candidates)
        representative = min(members, key=lambda m: (candidates[m].text != rep_text, m))
        anchors.append(
            Anchor(
                anchor_id=content_id("anchor", cluster.key),
                task_id=task_id,
                edit_type=edit_type,
                members=members,
                gs=gs,
                n_rows=n_rows,
                mean_lines=mean_lines,
                text=candidates[representative].text,
                representative=representative,
            )
        )
    return anchors


def _rep_text(cluster: Cluster, candidates: list[Candidate]) -> str:
    counts = Counter(candidates[m].text for m in cluster.members)
    return min(counts, key=lambda t: (-counts[t], t))


class FlatTokens:
    """Token offsets of all rows in one flat character space.

    Row r's characters sit at char_base[r] + [0, len(text_r)] (one spare slot per row, so rows never touch);
    its tokens are flat indices token_base[r] + [0, T_r).
    """

    def __init__(self, rows: list[StepInput]) -> None:
        lengths = np.array([len(s.response_text) + 1 for s in rows], np.int64)
        self.char_base = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.n_tokens = np.array([s.n_tokens for s in rows], np.int64)
        self.token_base = np.concatenate([[0], np.cumsum(self.n_tokens)[:-1]])
        shift = np.repeat(self.char_base, self.n_tokens)
        self.starts = np.concatenate([s.token_char_starts for s in rows]) + shift
        self.ends = np.concatenate([s.token_char_ends for s in rows]) + shift
        self.n_chars = int(lengths.sum()) + 1

    def split(self, values: np.ndarray) -> list[np.ndarray]:
        return np.split(values, self.token_base[1:])


def _project(
    rows: list[StepInput],
    candidates: list[Candidate],
    anchors: list[Anchor],
    changed_spans: list[list[tuple[int, int]]],
    subdiffs: dict[str, list],
    diag: Diagnostics,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per row [T] projected A^D (0 where no anchor occurrence covers the token) and [T] covered flags;
    the coverage of changed code goes to `diag`.

    All rows are projected at once, in the flat character space of `FlatTokens`. Occurrences are painted
    worst first, so each character, and then each token (max over its characters), keeps the occurrence
    that comes first in priority order: (-GS as float32, -covered chars, subdiff_id, anchor_id).
    """
    if not rows:
        return [], []
    flat = FlatTokens(rows)
    char_base, starts, ends, total = flat.char_base, flat.starts, flat.ends, flat.n_chars

    char_spans, subdiff_ids = subdiffs["char_spans"], subdiffs["subdiff_id"]
    occurrences = []
    for anchor in anchors:
        gs = float(np.float32(anchor.gs))  # the tables store GS as float32; ties are judged on that value
        for m, value in zip(anchor.members, anchor.diff_advantage, strict=True):
            spans = [(span["start"], span["end"]) for span in char_spans[m]]
            n_chars = sum(e - s for s, e in spans)
            priority = (-gs, -n_chars, subdiff_ids[m], anchor.anchor_id)
            occurrences.append((priority, candidates[m].row, spans, float(value)))
    occurrences.sort(key=lambda o: o[0], reverse=True)  # worst first: painting leaves the best on top
    rank = np.full(total, -1, np.int64)
    for r, (_, row, spans, _) in enumerate(occurrences):
        base = char_base[row]
        for s, e in spans:
            rank[base + s : base + e] = r
    values_by_rank = np.array([o[3] for o in occurrences], np.float64)
    token_rank = token_max(rank, starts, ends, -1)
    covered = token_rank >= 0
    values = np.zeros(len(starts), np.float64)
    values[covered] = values_by_rank[token_rank[covered]]

    painted = np.zeros(total, np.int8)
    for r, spans in enumerate(changed_spans):
        base = char_base[r]
        for s, e in spans:
            painted[base + s : base + e] = 1
    changed = token_max(painted, starts, ends, 0).astype(bool)
    diag.n_changed_tokens = int(changed.sum())
    diag.n_diff_tokens = int((changed & covered).sum())
    diag.coverage = diag.n_diff_tokens / diag.n_changed_tokens if diag.n_changed_tokens else 0.0
    return flat.split(values), flat.split(covered)


def _subdiff_table(rows: list[StepInput], candidates: list[Candidate]) -> dict[str, list]:
    """Columns of the subdiffs table.

    char_spans: a candidate's line spans, merged and sorted; token_spans: exactly the tokens sharing a
    character with them (`token_runs`), merged and sorted, found for all candidates at once in the flat
    space of `FlatTokens`. char_start/char_end and token_start/token_end are the outer bounds (-1: none).
    """
    n = len(candidates)
    owner = np.fromiter((k for k, c in enumerate(candidates) for _ in c.spans), np.int64)
    char_lo = np.fromiter((s for c in candidates for s, _ in c.spans), np.int64, count=owner.size)
    char_hi = np.fromiter((e for c in candidates for _, e in c.spans), np.int64, count=owner.size)
    owner, char_lo, char_hi = merge_intervals(owner, char_lo, char_hi)
    token_owner, token_lo, token_hi = owner, char_lo, char_hi
    if n:
        flat = FlatTokens(rows)
        row_of = np.array([c.row for c in candidates], np.int64)
        base = flat.char_base[row_of[owner]]
        token_owner, token_lo, token_hi = token_runs(
            flat.starts, flat.ends, owner, char_lo + base, char_hi + base
        )
        shift = flat.token_base[row_of[token_owner]]
        token_lo, token_hi = token_lo - shift, token_hi - shift
    char_spans = _span_lists(owner, char_lo, char_hi, n)
    token_spans = _span_lists(token_owner, token_lo, token_hi, n)
    return {
        "subdiff_id": [
            content_id("subdiff", rows[c.row].row_id, c.file, c.edit_type, c.scale, c.line_start, c.line_end)
            for c in candidates
        ],
        "row_id": [rows[c.row].row_id for c in candidates],
        "traj_id": [rows[c.row].traj_id for c in candidates],
        "task_id": [rows[c.row].task_id for c in candidates],
        "file": [c.file for c in candidates],
        "edit_type": [c.edit_type for c in candidates],
        "scale": [c.scale for c in candidates],
        "line_start": [c.line_start for c in candidates],
        "line_end": [c.line_end for c in candidates],
        "char_start": [spans[0]["start"] if spans else -1 for spans in char_spans],
        "char_end": [spans[-1]["end"] if spans else -1 for spans in char_spans],
        "token_start": [spans[0]["start"] if spans else -1 for spans in token_spans],
        "token_end": [spans[-1]["end"] if spans else -1 for spans in token_spans],
        "char_spans": char_spans,
        "token_spans": token_spans,
        "n_lines": [c.n_lines for c in candidates],
        "normalized_text": [c.text for c in candidates],
    }


def _span_lists(owner: np.ndarray, lo: np.ndarray, hi: np.ndarray, n: int) -> list[list[dict[str, int]]]:
    """Per owner 0..n-1, its [lo, hi) ranges as the table's list<struct<start, end>> values."""
    out: list[list[dict[str, int]]] = [[] for _ in range(n)]
    for k, start, end in zip(owner.tolist(), lo.tolist(), hi.tolist(), strict=True):
        out[k].append({"start": start, "end": end})
    return out


def _tables(
    steps: Sequence[StepInput],
    rows: list[StepInput],
    candidates: list[Candidate],
    subdiffs: dict[str, list],
    anchors: list[Anchor],
    output: EstimatorOutput,
    diff_covered: list[np.ndarray],
    settings: CreditSettings,
) -> CreditResult:
    subdiff_ids = subdiffs["subdiff_id"]
    anchor_cols: dict[str, list] = {name: [] for name in columns("anchors")}
    member_cols: dict[str, list] = {name: [] for name in columns("anchor_members")}
    for a in sorted(anchors, key=lambda a: a.anchor_id):
        for name, value in (
            ("anchor_id", a.anchor_id),
            ("task_id", a.task_id),
            ("edit_type", a.edit_type),
            ("n_rows", a.n_rows),
            ("n_members", len(a.members)),
            ("mean_lines", a.mean_lines),
            ("gs", a.gs),
            ("representative_subdiff_id", subdiff_ids[a.representative]),
            ("text", a.text),
        ):
            anchor_cols[name].append(value)
        for m, value in zip(a.members, a.diff_advantage, strict=True):
            member_cols["anchor_id"].append(a.anchor_id)
            member_cols["subdiff_id"].append(subdiff_ids[m])
            member_cols["row_id"].append(rows[candidates[m].row].row_id)
            member_cols["task_id"].append(a.task_id)
            member_cols["diff_advantage"].append(float(value))
    position = {step.row_id: r for r, step in enumerate(rows)}
    advantages: dict[str, list] = {name: [] for name in columns("advantages")}
    for step in steps:
        r = position[step.row_id]
        mask = np.ones(step.n_tokens) if step.loss_mask is None else step.loss_mask
        tokens = np.asarray(output.token_advantages[r], np.float64) * mask  # float64; tables store float32
        n_diff = int(np.count_nonzero(diff_covered[r] & (mask != 0)))
        for name, value in (
            ("row_id", step.row_id),
            ("traj_id", step.traj_id),
            ("task_id", step.task_id),
            ("estimator", settings.estimator),
            ("lam", settings.lam),
            ("episode_advantage", float(output.episode_advantage[r])),
            ("token_advantages", tokens),
            ("loss_mask", mask.astype(np.int8)),
            ("n_diff_tokens", n_diff),
        ):
            advantages[name].append(value)
    return CreditResult(subdiffs, anchor_cols, member_cols, advantages, Diagnostics())
