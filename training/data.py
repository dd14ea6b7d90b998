"""A round's Parquet tables -> length-bucketed token batches for the policy update.

1. Read `steps` and `advantages` with the contract's `read_table` (a wrong schema is a SchemaError).
2. Join advantages to steps on row_id; a dangling row_id or a per-token list whose length differs from the
   response is refused with a DataError naming the row.
3. Drop rows with no trainable signal, counting them: all-zero masked advantages, and (dynamic filtering)
   rows of task groups whose trajectory rewards are all equal.
4. Plan micro-batches: sort by total length (ties by content, never by id), pack greedily under a padded-token
   budget, shuffle the batches with a seeded generator per epoch. The plan is a pure function of (rows'
   content, budget, seed, epoch): a cursor (epoch, batch index) pins the exact next batch after a restart,
   and two runs that differ only in their name make the same update from the same rollouts.
5. Collate: right-pad prompt+response; masks and per-token values live on the (B, T-1) grid of next-token
   predictions, where column j scores token j+1, so prompt and padding columns are zero by construction.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.schema import SchemaError, read_table, table_dir

REWARD_TOL = 1e-6  # rewards closer than this count as equal for dynamic filtering


class DataError(SchemaError):
    """Advantage and step tables that do not fit together; the message names the table folder and the row."""


@dataclass(frozen=True)
class TrainRow:
    """One training row: a step's tokens joined with its advantages (all per-token arrays have length R)."""

    row_id: str  # step row id
    task_id: str  # task group
    traj_id: str  # trajectory
    prompt_ids: np.ndarray  # int64 (P,)
    response_ids: np.ndarray  # int64 (R,)
    advantages: np.ndarray  # float32 (R,), A per response token
    loss_mask: np.ndarray  # float32 (R,), 1 where the token is trained on
    behavior_logprobs: np.ndarray  # float32 (R,), log-prob under the behaviour policy

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @functools.cached_property
    def content_key(self) -> str:
        """What the row trains on, hashed (task, tokens, advantages, mask, behaviour log-probs), never its ids.
        The update orders rows by it: row and trajectory ids hash the run's name, so ordering by them made two
        runs with the same seed and the same rollouts (a compare arm and the demo) make different updates."""
        h = hashlib.sha256(self.task_id.encode())
        for values in (self.prompt_ids, self.response_ids, self.advantages, self.loss_mask, self.behavior_logprobs):
            h.update(len(values).to_bytes(8, "little") + np.ascontiguousarray(values).tobytes())
        return h.hexdigest()


@dataclass
class DataCounts:
    """What the loader kept and dropped, and why."""

    advantage_rows: int = 0  # rows in the advantages table
    step_rows: int = 0  # rows in the steps table
    task_groups: int = 0  # task ids among the advantage rows (the groups a group-relative estimator compares)
    steps_without_advantage: int = 0  # steps no advantage row refers to (not trained)
    dropped_uniform_group: int = 0  # rows of task groups whose rewards were all equal (dynamic filtering)
    uniform_groups: int = 0  # such task groups
    dropped_zero_advantage: int = 0  # rows whose masked advantages are all zero
    dropped_empty_response: int = 0  # rows with no response token
    kept: int = 0  # rows that train

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RoundData:
    rows: tuple[TrainRow, ...]  # kept rows, in row_id order (the plan orders them by content)
    counts: DataCounts = field(default_factory=DataCounts)


def _episode_rewards(steps: dict[str, dict]) -> dict[str, float]:
    """traj_id -> reward of the trajectory: return_to_go of its first step (R_0, the episode return)."""
    first: dict[str, tuple[int, float]] = {}
    for s in steps.values():
        turn, ret = s["turn"], s["return_to_go"]
        if s["traj_id"] not in first or turn < first[s["traj_id"]][0]:
            first[s["traj_id"]] = (turn, ret)
    return {traj: ret for traj, (_, ret) in first.items()}


def uniform_reward_tasks(rewards_by_task: dict[str, list[float]], tol: float = REWARD_TOL) -> set[str]:
    """Task ids whose trajectory rewards are all equal (within tol): no contrast, no gradient signal (DAPO)."""
    return {task for task, rs in rewards_by_task.items() if max(rs) - min(rs) <= tol}


def load_round(round_dir: str | Path, *, dynamic_filtering: bool = False) -> RoundData:
    """Read and join `<round_dir>/steps` and `<round_dir>/advantages`, drop rows without signal, count."""
    steps_path, adv_path = table_dir(round_dir, "steps"), table_dir(round_dir, "advantages")
    steps_tbl = read_table(steps_path, "steps").select(
        [
            "row_id",
            "traj_id",
            "task_id",
            "turn",
            "prompt_token_ids",
            "response_token_ids",
            "behavior_logprobs",
            "return_to_go",
        ]
    )
    adv_tbl = read_table(adv_path, "advantages").select(
        ["row_id", "traj_id", "task_id", "token_advantages", "loss_mask"]
    )
    steps: dict[str, dict] = {}
    for s in steps_tbl.to_pylist():
        if s["row_id"] in steps:
            raise DataError(f"{steps_path}: row_id {s['row_id']!r} appears twice in the steps table")
        steps[s["row_id"]] = s
    counts = DataCounts(advantage_rows=adv_tbl.num_rows, step_rows=len(steps))

    joined: list[tuple[dict, dict]] = []
    seen: set[str] = set()
    for a in adv_tbl.to_pylist():
        rid = a["row_id"]
        if rid in seen:
            raise DataError(f"{adv_path}: row_id {rid!r} appears twice in the advantages table")
        seen.add(rid)
        s = steps.get(rid)
        if s is None:
            raise DataError(f"{adv_path}: row_id {rid!r} has no step in {steps_path}")
        n = len(s["response_token_ids"])
        for name, values, where in (
            ("token_advantages", a["token_advantages"], adv_path),
            ("loss_mask", a["loss_mask"], adv_path),
            ("behavior_logprobs", s["behavior_logprobs"], steps_path),
        ):
            if len(values) != n:
                raise DataError(
                    f"{where}: row_id {rid!r}: {name} has {len(values)} values but the response has {n} tokens"
                )
        joined.append((a, s))
    counts.steps_without_advantage = len(steps) - len(joined)
    counts.task_groups = len({s["task_id"] for _, s in joined})

    uniform: set[str] = set()
    if dynamic_filtering:
        rewards = _episode_rewards(steps)
        by_task: dict[str, list[float]] = {}
        for traj, task in {s["traj_id"]: s["task_id"] for s in steps.values()}.items():
            by_task.setdefault(task, []).append(rewards[traj])
        uniform = uniform_reward_tasks(by_task) & {s["task_id"] for _, s in joined}
        counts.uniform_groups = len(uniform)

    rows: list[TrainRow] = []
    for a, s in sorted(joined, key=lambda pair: pair[0]["row_id"]):
        if s["task_id"] in uniform:
            counts.dropped_uniform_group += 1
            continue
        if not s["response_token_ids"]:
            counts.dropped_empty_response += 1
            continue
        adv = np.asarray(a["token_advantages"], dtype=np.float32)
        mask = np.asarray(a["loss_mask"], dtype=np.float32)
        if not np.any(adv * mask):
            counts.dropped_zero_advantage += 1
            continue
        rows.append(
            TrainRow(
                row_id=s["row_id"],
                task_id=s["task_id"],
                traj_id=s["traj_id"],
                prompt_ids=np.asarray(s["prompt_token_ids"], dtype=np.int64),
                response_ids=np.asarray(s["response_token_ids"], dtype=np.int64),
                advantages=adv,
                loss_mask=mask,
                behavior_logprobs=np.asarray(s["behavior_logprobs"], dtype=np.float32),
            )
        )
    counts.kept = len(rows)
    return RoundData(rows=tuple(rows), counts=counts)


# ---- planning ---------------------------------------------------------------------------------------------


def pack_by_length(
    lengths: Sequence[int], max_tokens: int, keys: Sequence[str] | None = None
) -> list[list[int]]:
    """Greedy length-bucketing: indices sorted by (length, key), cut into buckets with rows x longest <= max_tokens.

    A row longer than the budget forms a bucket of its own (it cannot be split). Returns row indices per
    bucket; deterministic for given inputs.
    """
    keys = keys if keys is not None else [""] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], keys[i], i))
    buckets: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted ascending, so the row being added is the bucket's longest.
        if current and (len(current) + 1) * lengths[i] > max_tokens:
            buckets.append(current)
            current = []
        current.append(i)
    if current:
        buckets.append(current)
    return buckets


def epoch_plan(buckets: Sequence[Sequence[int]], seed: int, epoch: int) -> list[list[int]]:
    """The buckets in this epoch's order: a permutation drawn from a generator seeded by (seed, epoch)."""
    perm = np.random.default_rng([seed, epoch]).permutation(len(buckets))
    return [list(buckets[i]) for i in perm]


@dataclass(frozen=True)
class Cursor:
    """Position of the next micro-batch: epoch and index into that epoch's plan."""

    epoch: int = 0
    batch: int = 0


# ---- collation --------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """A right-padded micro-batch. T = longest prompt+response; per-token tensors are on the (B, T-1) grid."""

    row_index: list[int]  # indices into RoundData.rows
    input_ids: torch.Tensor  # int64 (B, T), prompt + response + padding
    attention_mask: torch.Tensor  # int64 (B, T), 1 on real tokens
    action_mask: torch.Tensor  # float32 (B, T-1), 1 where column j predicts a response token j+1
    loss_mask: torch.Tensor  # float32 (B, T-1), action_mask x the table's loss_mask
    advantages: torch.Tensor  # float32 (B, T-1), token advantages, 0 off the action mask
    behavior_logprobs: torch.Tensor  # float32 (B, T-1), 0 off the action mask
    response_start: list[int]  # per row: grid column of its first response token (= prompt length - 1)
    response_len: list[int]  # per row: R

    @property
    def n_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return int(self.attention_mask.sum())

    def scatter(self, per_row: Sequence[np.ndarray | torch.Tensor]) -> torch.Tensor:
        """Place per-row response values (length R each) onto the (B, T-1) grid, zeros elsewhere."""
        out = torch.zeros(self.action_mask.shape, dtype=torch.float32)
        for b, values in enumerate(per_row):
            start = self.response_start[b]
            out[b, start : start + self.response_len[b]] = torch.as_tensor(values, dtype=torch.float32)
        return out

    def gather(self, grid: torch.Tensor) -> list[torch.Tensor]:
        """Inverse of scatter: each row's response values (length R) from a (B, T-1) grid."""
        spans = zip(self.response_start, self.response_len, strict=True)
        return [grid[b, s : s + n].detach().clone() for b, (s, n) in enumerate(spans)]

    def to(self, device: torch.device | str) -> Batch:
        for name in (
            "input_ids",
            "attention_mask",
            "action_mask",
            "loss_mask",
            "advantages",
            "behavior_logprobs",
        ):
            setattr(self, name, getattr(self, name).to(device, non_blocking=True))
        return self


def collate(rows: Sequence[TrainRow], row_index: Sequence[int], pad_id: int) -> Batch:
    """Right-pad rows into a Batch; a response token at sequence position p is scored in grid column p-1."""
    lengths = [r.length for r in rows]
    t = max(lengths)
    b = len(rows)
    ids = np.full((b, t), pad_id, dtype=np.int64)
    attn = np.zeros((b, t), dtype=np.int64)
    grid = (b, t - 1)
    action, loss, adv, blp = (np.zeros(grid, dtype=np.float32) for _ in range(4))
    starts, rlens = [], []
    for i, r in enumerate(rows):
        p, n = len(r.prompt_ids), len(r.response_ids)
        ids[i, :p] = r.prompt_ids
        ids[i, p : p + n] = r.response_ids
        attn[i, : p + n] = 1
        s = p - 1  # an empty prompt cannot predict its first response token: such rows need a prompt
        if s < 0:
            raise DataError(f"row_id {r.row_id!r}: empty prompt (the first response token has no context)")
        action[i, s : s + n] = 1.0
        loss[i, s : s + n] = r.loss_mask
        adv[i, s : s + n] = r.advantages * r.loss_mask
        blp[i, s : s + n] = r.behavior_logprobs
        starts.append(s)
        rlens.append(n)
    return Batch(
        row_index=list(row_index),
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        action_mask=torch.from_numpy(action),
        loss_mask=torch.from_numpy(loss),
        advantages=torch.from_numpy(adv),
        behavior_logprobs=torch.from_numpy(blp),
        response_start=starts,
        response_len=rlens,
    )


class BatchPlan:
    """Every epoch's micro-batches of a round, addressable by Cursor (the plan never depends on progress)."""

    def __init__(self, data: RoundData, max_tokens_per_batch: int, seed: int, epochs: int, pad_id: int):
        self.rows = data.rows
        self.pad_id = pad_id
        self.epochs = epochs
        self.seed = seed
        self.buckets = pack_by_length(
            [r.length for r in self.rows], max_tokens_per_batch, [r.content_key for r in self.rows]
        )
        self._plans = {e: epoch_plan(self.buckets, seed, e) for e in range(epochs)}

    @property
    def batches_per_epoch(self) -> int:
        return len(self.buckets)

    def epoch(self, e: int) -> list[list[int]]:
        return self._plans[e]

    def batch(self, cursor: Cursor) -> Batch:
        idx = self._plans[cursor.epoch][cursor.batch]
        return collate([self.rows[i] for i in idx], idx, self.pad_id)

    def iter_from(self, cursor: Cursor) -> Iterator[tuple[Cursor, Batch]]:
        """(cursor of the batch, batch) from `cursor` to the end of the last epoch."""
        for e in range(cursor.epoch, self.epochs):
            for k in range(cursor.batch if e == cursor.epoch else 0, self.batches_per_epoch):
                c = Cursor(e, k)
                yield c, self.batch(c)
