"""The credit core of one batch: `credit_units` (steps 1-8) then `assign_advantages` (step 9).

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

The results are plain values (dataclasses and numpy arrays): `pipeline.credit_io` makes the contract tables
of a `CreditResult`, so no column name appears here. The code below runs in the order of the steps.
"""

from __future__ import annotations

import gc
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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
from pipeline.credit.similarity import ShingleSets, band_buckets, cluster_texts, minhash_signatures
from pipeline.credit.subdiffs import Candidate, ast_blocks, hunk_candidates
from pipeline.schema import content_id  # the project's one id function: ids in the tables are these

Span = tuple[int, int]  # half-open [start, end)
_SCALE_RANK = {"hunk": 0, "ast": 1}  # kept first when a row exceeds max_candidates_per_row

# ---- what the steps produce --------------------------------------------------------------------------------


@dataclass(slots=True)
class SubDiff:
    """A sub-diff candidate (step 4) placed in its row's response."""

    subdiff_id: str  # content id of (row_id, file, edit type, scale, line span)
    candidate: Candidate  # its row (canonical index), file, edit type, scale, lines and normalized text
    char_spans: list[Span]  # response characters that wrote it, merged and sorted
    token_spans: list[Span]  # response tokens sharing a character with char_spans, merged and sorted


@dataclass
class Anchor:
    """A kept anchor (step 6): near-duplicate occurrences of one change in >= 2 rows of one task."""

    anchor_id: str
    task_id: str
    edit_type: str
    members: list[int]  # sub-diff indices (occurrences), sorted
    gs: float  # GS recomputed after the cut
    n_rows: int  # distinct rows among the members
    mean_lines: float
    text: str  # normalized text of the representative
    representative: int  # sub-diff index of the representative occurrence
    diff_advantage: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [len(members)] A^D (step 7)


@dataclass
class RowAdvantages:
    """Step 9 for one input step: A^E and the token advantages, the loss mask applied."""

    step: StepInput
    episode_advantage: float
    token_advantages: np.ndarray  # [T] float64 (the tables store float32), 0 where the loss mask is 0
    loss_mask: np.ndarray  # [T] int8, 1 where the token is trained on
    n_diff_tokens: int  # tokens in the loss that a diff-level term reached


@dataclass
class CreditUnits:
    """Steps 1-8 of one batch: what every estimator reads (`batch`), and the units behind it."""

    steps: Sequence[StepInput]  # as given: the advantages keep this order
    rows: list[StepInput]  # canonical order (task, trajectory, turn); `batch` and `SubDiff` rows index it
    batch: EstimatorBatch
    subdiffs: list[SubDiff]
    anchors: list[Anchor]
    diff_covered: list[np.ndarray]  # per row [T]: tokens under an anchor occurrence
    diagnostics: Diagnostics


@dataclass
class CreditResult:
    """One batch's credit: the units and one `RowAdvantages` per input step (`pipeline.credit_io` makes the
    subdiffs, anchors, anchor_members and advantages tables of it)."""

    rows: list[StepInput]  # canonical order
    subdiffs: list[SubDiff]
    anchors: list[Anchor]  # in selection order
    advantages: list[RowAdvantages]  # one per input step, in input order
    settings: CreditSettings  # the estimator and lambda that made them
    diagnostics: Diagnostics

    def token_advantages(self, row_id: str) -> np.ndarray:
        i = [a.step.row_id for a in self.advantages].index(row_id)
        return np.asarray(self.advantages[i].token_advantages, np.float64)


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


# ---- steps 1-8 ---------------------------------------------------------------------------------------------


def credit_units(steps: Sequence[StepInput], settings: CreditSettings | None = None, *, units: bool = True
                 ) -> CreditUnits:
    """Steps 1-8 of one batch. With units=False only steps 1-2 run: no sub-diffs, anchors or A^D (every
    token's projected A^D is 0 and nothing is covered). Line units (`lines.py`) are computed when the
    estimator reads them (`reads_lines`), whatever `units` says."""
    with cyclic_gc_paused():
        return _credit_units(steps, settings, units)


def _credit_units(steps: Sequence[StepInput], settings: CreditSettings | None, units: bool) -> CreditUnits:
    settings = settings or CreditSettings()
    diag = Diagnostics()
    timer = PhaseTimer(diag.seconds)
    stats: Counter = Counter()

    with timer.phase("validate"):  # 1. refuse what the math cannot use; one canonical order
        rows = _canonical_rows(steps)
        task_index, traj_index, state_index = _group_indices(rows, diag)
        turn = np.array([s.turn for s in rows], np.int64)

    with timer.phase("returns"):  # 2. R_t and R_episode, from float32 rewards as the steps table holds them
        rewards = np.array([float(s.step_reward) for s in rows], np.float32).astype(np.float64)
        rtg = returns_to_go(rewards, traj_index, turn, settings.gamma).astype(np.float32).astype(np.float64)
        episode_return = episode_returns(rtg, traj_index, turn) if rows else rtg

    subdiffs: list[SubDiff] = []
    anchors: list[Anchor] = []
    diff_tokens = [np.zeros(s.n_tokens) for s in rows]
    diff_covered = [np.zeros(s.n_tokens, bool) for s in rows]
    if units:
        with timer.phase("diffs"):  # 3. whole diffs, repeats dropped; 4. multi-scale sub-diffs, placed
            candidates, changed_spans, n_units = _candidates(rows, settings, stats, diag)
            flat = FlatTokens(rows) if rows else None
            subdiffs = _place_subdiffs(rows, candidates, flat)
            diag.n_candidates = len(candidates)

        with timer.phase("similarity"):  # 5. near-duplicate clusters per (task, edit type)
            clusters, cluster_task = _clusters(candidates, rows, settings, diag)

        with timer.phase("anchors"):  # 6. GS, selection and the cut; 7. A^D per occurrence
            _score_clusters(clusters, candidates, settings, diag)
            anchors = _select_anchors(clusters, cluster_task, candidates, n_units, settings)
            diag.n_anchors = len(anchors)
            diag.mean_group_size = float(np.mean([a.n_rows for a in anchors])) if anchors else 0.0
            _diff_advantages(anchors, candidates, rtg, settings)

        if rows:
            with timer.phase("projection"):  # 8. A^D onto the tokens that wrote each occurrence
                diff_tokens, diff_covered = _project(flat, subdiffs, anchors, changed_spans, diag)

    lines = None
    if reads_lines(settings):  # didpo_did's units: lines a workspace holds, not anchors
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
    return CreditUnits(steps, rows, batch, subdiffs, anchors, diff_covered, diag)


# 1. Validate and order --------------------------------------------------------------------------------------


def _canonical_rows(steps: Sequence[StepInput]) -> list[StepInput]:
    """The steps validated, sorted by (task, trajectory, turn); a row, a turn or a trajectory's task given
    twice is refused, naming the rows."""
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


def _group_indices(rows: list[StepInput], diag: Diagnostics) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N] task, trajectory and state index of each row. Tasks and trajectories are numbered in sorted order;
    a state is (task, workspace before the step), a row with an unknown workspace a state of its own."""
    task_ids = sorted({s.task_id for s in rows})
    traj_ids = sorted({s.traj_id for s in rows})
    task_of = {t: i for i, t in enumerate(task_ids)}
    traj_of = {t: i for i, t in enumerate(traj_ids)}
    task_index = np.array([task_of[s.task_id] for s in rows], np.int64)
    traj_index = np.array([traj_of[s.traj_id] for s in rows], np.int64)
    states: dict[tuple[str, str], int] = {}
    state_index = np.array(
        [states.setdefault((s.task_id, s.workspace_hash_before or f"\x00{s.row_id}"), len(states))
         for s in rows],
        np.int64,
    )
    diag.n_rows, diag.n_tasks, diag.n_trajectories = len(rows), len(task_ids), len(traj_ids)
    return task_index, traj_index, state_index


# 3-4. Whole diffs and sub-diff candidates -------------------------------------------------------------------


def _candidates(
    rows: list[StepInput], settings: CreditSettings, stats: Counter, diag: Diagnostics
) -> tuple[list[Candidate], list[list[Span]], int]:
    """All candidates (rows in canonical order), per-row changed-code spans, and the number of line units."""
    candidates: list[Candidate] = []
    changed: list[list[Span]] = [[] for _ in rows]
    units = 0
    seen: set = set()
    current_traj = None
    for r, step in enumerate(rows):
        if step.traj_id != current_traj:
            seen, current_traj = set(), step.traj_id
        row_cands: list[Candidate] = []
        for hunk in whole_diff(step, settings.max_file_lines, settings.max_diff_lines, stats):
            # 3. a change the trajectory already made is not a new decision: it gets no second occurrence
            signature = hunk.signature()
            if signature in seen:
                diag.n_repeated_hunks += 1
                continue
            seen.add(signature)
            diag.n_hunks += 1
            # 4. each side, at every scale: which unit another rollout repeats is not known in advance
            for edit_type, lines, source in (
                ("del", hunk.deleted, step.files_before.get(hunk.file, "")),
                ("add", hunk.added, step.files_after.get(hunk.file, "")),
            ):
                if not lines:
                    continue
                changed[r].extend(d.span for d in lines if d.span is not None)
                blocks = partial(ast_blocks, source, settings.max_ast_lines) if settings.ast_blocks else None
                found, used = hunk_candidates(r, hunk.file, edit_type, lines, units, settings.window_sizes,
                                              blocks, settings.max_hunk_lines, stats)
                units += used
                row_cands.extend(found)
        if len(row_cands) > settings.max_candidates_per_row:
            stats["candidates_over_cap"] += len(row_cands) - settings.max_candidates_per_row
            row_cands.sort(key=lambda c: (_SCALE_RANK.get(c.scale, 2), -c.n_lines, c.unit_start))
            row_cands = row_cands[: settings.max_candidates_per_row]
        candidates.extend(row_cands)
    return candidates, changed, units


def _place_subdiffs(rows: list[StepInput], candidates: list[Candidate], flat: FlatTokens | None
                    ) -> list[SubDiff]:
    """Each candidate with its content id and where it sits in its response.

    char_spans: the candidate's line spans, merged and sorted; token_spans: exactly the tokens sharing a
    character with them (`token_runs`), merged and sorted, found for all candidates at once in the flat
    space of `FlatTokens`.
    """
    n = len(candidates)
    owner = np.fromiter((k for k, c in enumerate(candidates) for _ in c.spans), np.int64)
    char_lo = np.fromiter((s for c in candidates for s, _ in c.spans), np.int64, count=owner.size)
    char_hi = np.fromiter((e for c in candidates for _, e in c.spans), np.int64, count=owner.size)
    owner, char_lo, char_hi = merge_intervals(owner, char_lo, char_hi)
    token_owner, token_lo, token_hi = owner, char_lo, char_hi
    if n:
        row_of = np.array([c.row for c in candidates], np.int64)
        base = flat.char_base[row_of[owner]]
        token_owner, token_lo, token_hi = token_runs(
            flat.starts, flat.ends, owner, char_lo + base, char_hi + base
        )
        shift = flat.token_base[row_of[token_owner]]
        token_lo, token_hi = token_lo - shift, token_hi - shift
    char_spans = _spans_by_owner(owner, char_lo, char_hi, n)
    token_spans = _spans_by_owner(token_owner, token_lo, token_hi, n)
    return [
        SubDiff(
            content_id("subdiff", rows[c.row].row_id, c.file, c.edit_type, c.scale, c.line_start, c.line_end),
            c,
            chars,
            tokens,
        )
        for c, chars, tokens in zip(candidates, char_spans, token_spans, strict=True)
    ]


def _spans_by_owner(owner: np.ndarray, lo: np.ndarray, hi: np.ndarray, n: int) -> list[list[Span]]:
    """Per owner 0..n-1, its [lo, hi) ranges in order."""
    out: list[list[Span]] = [[] for _ in range(n)]
    for k, start, end in zip(owner.tolist(), lo.tolist(), hi.tolist(), strict=True):
        out[k].append((start, end))
    return out


# 5. Near-duplicate clusters ---------------------------------------------------------------------------------


def _clusters(
    candidates: list[Candidate], rows: list[StepInput], settings: CreditSettings, diag: Diagnostics
) -> tuple[list[Cluster], list[int]]:
    """Near-duplicate clusters of candidates, per (task, edit type); returns clusters and their task index."""
    if not candidates:
        return [], []
    # identical comparison texts are one unique text: MinHash and the exact check run once per text
    canon = settings.canonicalize_identifiers
    text_of: dict[tuple[str, str, tuple[str, ...]], list[int]] = defaultdict(list)
    for i, c in enumerate(candidates):
        text_of[(rows[c.row].task_id, c.edit_type, comparison_tokens(c.text, canon))].append(i)
    keys = sorted(text_of)  # content order: unique index i is the same whatever the input order
    diag.n_unique_texts = len(keys)
    shingles = ShingleSets([k[2] for k in keys], settings.shingle_size)
    signatures = minhash_signatures(shingles, settings.num_perm, settings.seed)
    buckets = band_buckets(signatures, settings.effective_lsh_threshold)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for u, key in enumerate(keys):
        groups[key[:2]].append(u)
    task_order = sorted({rows[c.row].task_id for c in candidates})
    task_of = {t: i for i, t in enumerate(task_order)}
    clusters: list[Cluster] = []
    cluster_task: list[int] = []
    for (task_id, edit_type), uniques in sorted(groups.items()):

        def priority(u: int) -> tuple:
            # representatives are tried widest first: most distinct rows, then most lines
            members = text_of[keys[u]]
            return (-len({candidates[m].row for m in members}), -candidates[members[0]].n_lines, u)

        order = sorted(uniques, key=priority)
        rep_of = cluster_texts(order, buckets, shingles, settings.eta)
        by_rep: dict[int, list[int]] = defaultdict(list)
        for u in order:
            by_rep[rep_of[u]].extend(text_of[keys[u]])
        for rep, members in by_rep.items():
            clusters.append(
                Cluster(key=f"{task_id}\x1f{edit_type}\x1f{' '.join(keys[rep][2])}", members=sorted(members))
            )
            cluster_task.append(task_of[task_id])
    return clusters, cluster_task


# 6. Anchors: GS, selection, the cut, GS again ---------------------------------------------------------------


def _score_clusters(clusters: list[Cluster], candidates: list[Candidate], settings: CreditSettings,
                    diag: Diagnostics) -> None:
    """Sets each cluster's GS, from its mean size in lines and its distinct rows (0 for a single row)."""
    singletons = 0
    for cluster in clusters:
        n_rows = len({candidates[m].row for m in cluster.members})
        singletons += n_rows == 1
        mean_lines = float(np.mean([candidates[m].n_lines for m in cluster.members]))
        cluster.gs = groupability(mean_lines, n_rows, settings.s0, settings.g0, settings.gs_form)
    diag.n_clusters = len(clusters)
    diag.singleton_rate = singletons / len(clusters) if clusters else 0.0


def _select_anchors(
    clusters: list[Cluster],
    cluster_task: list[int],
    candidates: list[Candidate],
    n_units: int,
    settings: CreditSettings,
) -> list[Anchor]:
    """Per task, at most K clusters by greedy facility location; then no line unit in two kept occurrences
    (the cut); an anchor made by a single row compares nothing and is dropped; GS is recomputed on what is
    left."""
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
    """The cluster's most frequent text (the smallest among equals)."""
    counts = Counter(candidates[m].text for m in cluster.members)
    return min(counts, key=lambda t: (-counts[t], t))


# 7. A^D per occurrence --------------------------------------------------------------------------------------


def _diff_advantages(anchors: list[Anchor], candidates: list[Candidate], rtg: np.ndarray,
                     settings: CreditSettings) -> None:
    """Sets each anchor's A^D = R_t(row) - mean over the anchor's distinct rows (adv_norm): each row counts
    once, however many occurrences it holds, and every occurrence in a row shares its value."""
    for a in anchors:
        member_rows = np.array([candidates[m].row for m in a.members], np.int64)
        distinct, which = np.unique(member_rows, return_inverse=True)
        per_row = group_center(
            rtg[distinct], np.zeros(len(distinct), np.int64), settings.adv_norm, settings.std_eps
        )
        a.diff_advantage = per_row[which]


# 8. Projection onto tokens ----------------------------------------------------------------------------------


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
    flat: FlatTokens,
    subdiffs: list[SubDiff],
    anchors: list[Anchor],
    changed_spans: list[list[Span]],
    diag: Diagnostics,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per row [T] projected A^D (0 where no anchor occurrence covers the token) and [T] covered flags;
    the coverage of changed code goes to `diag`.

    All rows are projected at once, in the flat character space of `FlatTokens`. Occurrences are painted
    worst first, so each character, and then each token (max over its characters), keeps the occurrence
    that comes first in priority order: (-GS as float32, -covered chars, subdiff_id, anchor_id).
    """
    char_base, starts, ends, total = flat.char_base, flat.starts, flat.ends, flat.n_chars
    occurrences = []
    for anchor in anchors:
        gs = float(np.float32(anchor.gs))  # the tables store GS as float32; ties are judged on that value
        for m, value in zip(anchor.members, anchor.diff_advantage, strict=True):
            sub = subdiffs[m]
            n_chars = sum(e - s for s, e in sub.char_spans)
            priority = (-gs, -n_chars, sub.subdiff_id, anchor.anchor_id)
            occurrences.append((priority, sub.candidate.row, sub.char_spans, float(value)))
    occurrences.sort(key=lambda o: o[0], reverse=True)  # worst first: painting leaves the best on top
    rank = np.full(total, -1, np.int64)
    for r, (_, row, spans, _) in enumerate(occurrences):
        base = char_base[row]
        for s, e in spans:
            rank[base + s : base + e] = r
    values_by_rank = np.array([o[3] for o in occurrences], np.float64)
    token_rank = token_max(rank, starts, ends, -1)  # a token shares a character with its occurrence
    covered = token_rank >= 0
    values = np.zeros(len(starts), np.float64)
    values[covered] = values_by_rank[token_rank[covered]]

    # coverage: of the tokens that wrote changed code, the share a diff-level value reached
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


# ---- step 9 ------------------------------------------------------------------------------------------------


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
    with timer.phase("estimator"), _blas().limit(limits=1, user_api="blas"), cyclic_gc_paused():
        output = spec.fn(units.batch, settings)
        if spec.scope == "batch" and whiten:
            output = _whitened(output, units.batch.traj_index, settings.std_eps)
    with timer.phase("loss_mask"), cyclic_gc_paused():
        advantages = _row_advantages(units, output, _diff_reach(units, settings))
    diag.seconds.pop("total", None)
    diag.seconds["total"] = sum(diag.seconds.values())
    return CreditResult(units.rows, units.subdiffs, units.anchors, advantages, settings, diag)


def _whitened(output: EstimatorOutput, traj_index: np.ndarray, eps: float) -> EstimatorOutput:
    """The output whitened with the mean and std of one episode advantage per trajectory."""
    first = np.unique(traj_index, return_index=True)[1]
    values = output.episode_advantage[first]
    mean, std = moments_stats(len(values), float(values.sum()), float((values**2).sum()))
    return EstimatorOutput(whiten(output.episode_advantage, mean, std, eps),
                           [whiten(t, mean, std, eps) for t in output.token_advantages])


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside, back on after (unless it was off already).

    Why: credit allocates millions of small acyclic objects (lines, spans, candidates, records) that reference
    counting frees on its own; the collector's passes over them, and over everything else the process holds,
    cost 10-15% of a task group's credit (measured, benchmarks/scale_out.py). A cycle made inside waits for
    the next collection after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@cache
def _blas() -> ThreadpoolController:
    """The process's thread pools, found once (finding them scans the loaded libraries)."""
    return ThreadpoolController()


def _diff_reach(units: CreditUnits, settings: CreditSettings) -> list[np.ndarray]:
    """Per row [T]: the tokens a diff-level term reached (what n_diff_tokens counts)."""
    if units.batch.line_units is not None:  # the line units' changes, not the anchors, carry the diff term
        return [owner >= 0 for owner in units.batch.line_units.token_change]
    if not reads_units(settings):  # units computed for analysis only: no diff-level term reached a token
        return [np.zeros(s.n_tokens, bool) for s in units.rows]
    return units.diff_covered


def _row_advantages(units: CreditUnits, output: EstimatorOutput, reach: list[np.ndarray]
                    ) -> list[RowAdvantages]:
    """One `RowAdvantages` per input step, in input order, the loss mask applied (None: every token)."""
    position = {step.row_id: r for r, step in enumerate(units.rows)}
    out = []
    for step in units.steps:
        r = position[step.row_id]
        mask = np.ones(step.n_tokens) if step.loss_mask is None else step.loss_mask
        tokens = np.asarray(output.token_advantages[r], np.float64) * mask
        n_diff = int(np.count_nonzero(reach[r] & (mask != 0)))
        episode = float(output.episode_advantage[r])
        out.append(RowAdvantages(step, episode, tokens, mask.astype(np.int8), n_diff))
    return out
