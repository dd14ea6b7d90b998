"""Advantage tables -> token batches: join, refusals, filtering, bucketing, masks, cursor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from builders import advantage_row, step_row, write_steps_and_advantages
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.schema import SchemaError, arrow_schema, content_id, table_dir, write_table
from training.data import BatchPlan, Cursor, DataError, collate, load_round, pack_by_length

torch.set_num_threads(1)
VOCAB = 200


def make_round(
    root: Path,
    *,
    rewards: dict[str, list[float]],
    turns: int = 2,
    seed: int = 0,
    advantage=lambda rng, n, reward: rng.normal(size=n).astype(np.float32),
    run: str = "run",
) -> tuple[list[dict], list[dict]]:
    """Write steps + advantages for tasks -> per-trajectory rewards; returns the rows written. Ids hash `run`, as
    a round's trajectory and row ids hash the run's name."""
    rng = np.random.default_rng(seed)
    steps, advs = [], []
    for task, traj_rewards in rewards.items():
        for k, reward in enumerate(traj_rewards):
            traj = content_id(run, task, k)
            for turn in range(turns):
                p, r = int(rng.integers(2, 12)), int(rng.integers(1, 10))
                row_id = content_id(traj, turn)
                steps.append(
                    step_row(
                        row_id,
                        traj,
                        task,
                        turn=turn,
                        prompt_token_ids=rng.integers(3, VOCAB, p).tolist(),
                        response_token_ids=rng.integers(3, VOCAB, r).tolist(),
                        behavior_logprobs=(-rng.random(r)).astype(np.float32).tolist(),
                        return_to_go=float(reward) * 0.95 ** (turn),
                        done=turn == turns - 1,
                    )
                )
                advs.append(advantage_row(row_id, traj, task, advantage(rng, r, reward).tolist()))
    write_steps_and_advantages(root, steps, advs)
    return steps, advs


def test_join_and_collate_put_values_on_response_tokens_only(tmp_path):
    steps, advs = make_round(tmp_path, rewards={"t/a": [0.0, 1.0], "t/b": [1.0, 0.5]})
    data = load_round(tmp_path)
    assert data.counts.kept == len(advs) == len(data.rows)
    by_id = {s["row_id"]: s for s in steps}
    adv_by_id = {a["row_id"]: a for a in advs}
    batch = collate(data.rows, range(len(data.rows)), pad_id=0)
    b, t = batch.input_ids.shape
    assert batch.action_mask.shape == (b, t - 1)
    for i, row in enumerate(data.rows):
        s = by_id[row.row_id]
        p, r = len(s["prompt_token_ids"]), len(s["response_token_ids"])
        # Column j predicts token j+1: the response occupies columns p-1 .. p+r-2.
        cols = torch.nonzero(batch.action_mask[i]).flatten().tolist()
        assert cols == list(range(p - 1, p - 1 + r))
        assert batch.input_ids[i, p : p + r].tolist() == s["response_token_ids"]
        assert batch.attention_mask[i].sum() == p + r
        assert batch.input_ids[i, p + r :].eq(0).all()
        np.testing.assert_allclose(
            batch.advantages[i, p - 1 : p - 1 + r], adv_by_id[row.row_id]["token_advantages"]
        )
        assert batch.advantages[i][batch.action_mask[i] == 0].eq(0).all()  # prompt and padding carry nothing
        np.testing.assert_allclose(
            batch.gather(batch.behavior_logprobs)[i], s["behavior_logprobs"], rtol=1e-6
        )


def test_advantage_without_step_is_refused_naming_the_row(tmp_path):
    steps, advs = make_round(tmp_path, rewards={"t/a": [0.0, 1.0]})
    orphan = dict(advs[0], row_id="no-such-row")
    write_table(advs + [orphan], table_dir(tmp_path, "advantages"), "advantages")
    with pytest.raises(DataError, match="no-such-row.*has no step"):
        load_round(tmp_path)


def test_length_mismatch_is_refused_naming_row_and_column(tmp_path):
    steps, advs = make_round(tmp_path, rewards={"t/a": [0.0, 1.0]})
    advs[1] = dict(advs[1], token_advantages=advs[1]["token_advantages"] + [0.5])
    write_table(advs, table_dir(tmp_path, "advantages"), "advantages")
    with pytest.raises(DataError, match=f"{advs[1]['row_id']}.*token_advantages has"):
        load_round(tmp_path)


def test_wrong_schema_is_refused_naming_file_and_column(tmp_path):
    make_round(tmp_path, rewards={"t/a": [0.0, 1.0]})
    folder = table_dir(tmp_path, "advantages")
    good = pq.read_table(folder / "part-00000.parquet")
    as_double = pa.array(good.column("token_advantages").to_pylist(), type=pa.list_(pa.float64()))
    bad = good.set_column(good.schema.get_field_index("token_advantages"), "token_advantages", as_double)
    pq.write_table(
        bad.replace_schema_metadata(arrow_schema("advantages").metadata), folder / "part-00000.parquet"
    )
    with pytest.raises(SchemaError, match=r"part-00000\.parquet.*token_advantages"):
        load_round(tmp_path)


def test_rows_without_signal_are_dropped_and_counted(tmp_path):
    # Task t/flat: every trajectory earns 1.0; its advantages are non-zero noise, so only dynamic filtering
    # drops it. Task t/zero has a reward contrast but all-zero advantages.
    def advantage(rng, n, reward):
        return np.zeros(n, np.float32) if reward in (0.25, 0.75) else rng.normal(size=n).astype(np.float32)

    make_round(
        tmp_path,
        rewards={"t/flat": [1.0, 1.0, 1.0], "t/zero": [0.25, 0.75], "t/ok": [0.0, 1.0]},
        advantage=advantage,
    )
    plain = load_round(tmp_path)
    assert plain.counts.dropped_zero_advantage == 4 and plain.counts.kept == 10
    filtered = load_round(tmp_path, dynamic_filtering=True)
    assert filtered.counts.uniform_groups == 1
    assert filtered.counts.dropped_uniform_group == 6
    assert filtered.counts.kept == 4
    assert {r.task_id for r in filtered.rows} == {"t/ok"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(50, 1000))
def test_packing_respects_budget_and_keeps_every_row_once(lengths, budget):
    buckets = pack_by_length(lengths, budget)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        padded = len(b) * max(lengths[i] for i in b)
        assert padded <= budget or len(b) == 1  # an over-budget row travels alone


def test_plan_is_deterministic_shuffled_and_resumable(tmp_path):
    make_round(tmp_path, rewards={f"t/{k}": [0.0, 1.0, 0.5] for k in range(6)}, turns=3)
    data = load_round(tmp_path)
    plan = BatchPlan(data, max_tokens_per_batch=40, seed=7, epochs=3, pad_id=0)
    again = BatchPlan(data, max_tokens_per_batch=40, seed=7, epochs=3, pad_id=0)
    other = BatchPlan(data, max_tokens_per_batch=40, seed=8, epochs=3, pad_id=0)
    assert plan.batches_per_epoch > 5
    assert [plan.epoch(e) for e in range(3)] == [again.epoch(e) for e in range(3)]
    assert plan.epoch(0) != plan.epoch(1)  # buckets are reshuffled every epoch
    assert plan.epoch(0) != other.epoch(0)
    full = [(c, b.input_ids) for c, b in plan.iter_from(Cursor())]
    tail = [(c, b.input_ids) for c, b in plan.iter_from(Cursor(1, 2))]
    start = full.index(next(x for x in full if x[0] == Cursor(1, 2)))
    assert [c for c, _ in tail] == [c for c, _ in full[start:]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(tail, full[start:], strict=True))


def test_two_runs_that_differ_only_in_name_plan_the_same_update(tmp_path):
    """Row and trajectory ids hash the run's name; the plan must not: the demo and a compare arm of the same
    seed roll out the same tasks and must then make the same update (they did not while ties in length were
    broken by row id)."""
    rewards = {f"t/{i}": [0.0, 1.0, 0.5, 1.0] for i in range(8)}  # 64 rows, lengths 3..21: many ties
    plans = []
    for run in ("local", "didpo_did-seed0"):
        make_round(tmp_path / run, rewards=rewards, run=run)
        data = load_round(tmp_path / run)
        plan = BatchPlan(data, 48, seed=0, epochs=2, pad_id=0)
        plans.append([[tuple(data.rows[i].response_ids) for i in b] for e in range(2) for b in plan.epoch(e)])
    assert len({len(b) for b in plans[0]}) > 1  # several rows to a batch: the order within a length matters
    assert plans[0] == plans[1]
