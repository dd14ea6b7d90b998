"""The offline policy update on the tiny Qwen2 policy: direction of learning, estimator equivalence at
lambda = 0, bitwise resume after a kill, schema refusal, no loss on padding, and data parallel training for
real: `didpo train` under torchrun with 2 CPU processes (gloo) trains like one process on the same global
batch, and a round killed at 2 processes resumes at 1 to the same weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml
from builders import random_round

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

from pipeline.policy.loading import load_policy  # noqa: E402
from pipeline.policy.tiny import build_checkpoint  # noqa: E402
from pipeline.schema import SchemaError, read_table, table_dir, write_table  # noqa: E402
from training.data import BatchPlan, Cursor, DataCounts, load_round  # noqa: E402
from training.settings import TrainSettings  # noqa: E402
from training.trainer import (  # noqa: E402
    REPORT_NAME,
    TrainReport,
    batch_loss,
    make_actor,
    make_policy_loss,
    response_logprobs,
    step_shard,
    train_round,
    why_nothing_to_train,
)

CORPUS = ["def add(a, b):\n    return a + b\n" * 20, "for i in range(10):\n    print(i)\n" * 20]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", size="tiny", corpus=CORPUS, seed=0).path


def vocab_size(ckpt: Path) -> int:
    import json

    return json.loads((ckpt / "config.json").read_text())["vocab_size"]




def weights(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in load_policy(path).state_dict().items()}


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


FAST = dict(lr=3e-3, max_tokens_per_batch=64, grad_clip=1.0, seed=0)


@pytest.fixture(scope="module")
def one_step(ckpt, tmp_path_factory):
    """One optimizer step over every row (a single micro-batch), and the round it trained on."""
    root = random_round(tmp_path_factory.mktemp("round"), vocab_size(ckpt), n_rows=6)
    settings = TrainSettings(**dict(FAST, max_tokens_per_batch=4096))
    out = tmp_path_factory.mktemp("out") / "r1"
    report = train_round(root, ckpt, out, settings)
    return root, out, settings, report


@pytest.mark.slow
def test_one_update_lowers_the_loss_on_its_batch(ckpt, one_step):
    root, out, settings, report = one_step
    assert report.completed and report.total_steps == 1 and report.counts["kept"] == 6
    plan = BatchPlan(load_round(root), 4096, settings.seed, 1, pad_id=0)
    before = make_actor(load_policy(ckpt))
    old = response_logprobs(before, plan, torch.device("cpu"))
    batch = plan.batch(Cursor(0, 0))
    old_grid = batch.scatter([old[i] for i in batch.row_index])
    loss_fn = make_policy_loss(settings)
    with torch.no_grad():
        loss_before, _ = batch_loss(before, batch, old_grid, None, loss_fn, settings)
        loss_after, _ = batch_loss(make_actor(load_policy(out)), batch, old_grid, None, loss_fn, settings)
    assert float(loss_after) < float(loss_before)
    assert report.steps[0].tokens == batch.n_tokens and report.steps[0].grad_norm > 0


@pytest.mark.slow
def test_positive_advantage_tokens_gain_probability_negative_lose(ckpt, one_step):
    root, out, settings, _ = one_step
    plan = BatchPlan(load_round(root), 4096, settings.seed, 1, pad_id=0)
    before = response_logprobs(make_actor(load_policy(ckpt)), plan, torch.device("cpu"))
    after = response_logprobs(make_actor(load_policy(out)), plan, torch.device("cpu"))
    gain = {+1: [], -1: []}
    for i, row in enumerate(plan.rows):
        gain[int(np.sign(row.advantages[0]))].append(float((after[i] - before[i]).mean()))
    assert gain[+1] and gain[-1]
    assert min(gain[+1]) > 0 > max(gain[-1])


@pytest.mark.slow
def test_lambda_zero_trains_exactly_like_the_episode_estimator(ckpt, tmp_path):
    vocab = vocab_size(ckpt)
    episode = random_round(tmp_path / "grpo", vocab, estimator="grpo", lam=0.0)
    didpo = random_round(tmp_path / "didpo", vocab, estimator="didpo", lam=0.0, diff_adv=0.7)
    settings = TrainSettings(**FAST, epochs=2)
    a = train_round(episode, ckpt, tmp_path / "out_grpo", settings)
    b = train_round(didpo, ckpt, tmp_path / "out_didpo", settings)
    assert a.total_steps == b.total_steps >= 2
    assert_same_weights(tmp_path / "out_grpo", tmp_path / "out_didpo")


@pytest.mark.slow
def test_killed_update_resumes_to_the_same_weights(ckpt, tmp_path):
    root = random_round(tmp_path / "round", vocab_size(ckpt), n_rows=8)
    settings = TrainSettings(
        **dict(FAST, max_tokens_per_batch=32),
        epochs=2,
        micro_batches_per_step=2,
        warmup_steps=1,
        schedule="cosine",
        kl_coef=0.1,
        entropy_coef=0.01,
        save_every=1,
    )
    full = train_round(root, ckpt, tmp_path / "full", settings)
    assert full.completed and full.total_steps >= 3
    k = full.total_steps // 2
    part = train_round(root, ckpt, tmp_path / "killed", settings, max_steps=k)  # the "kill" after step k
    assert not part.completed and part.steps_done == k
    assert not (tmp_path / "killed" / "config.json").exists()
    rest = train_round(root, ckpt, tmp_path / "killed", settings)
    assert rest.completed and rest.resumed_from_step == k
    assert [s.step for s in rest.steps] == list(range(k + 1, full.total_steps + 1))
    assert [s.loss for s in rest.steps] == [s.loss for s in full.steps[k:]]
    assert_same_weights(tmp_path / "full", tmp_path / "killed")
    # A finished round is not trained again: the stored report comes back.
    again = train_round(root, ckpt, tmp_path / "killed", settings)
    assert again.steps_done == full.total_steps and again.resumed_from_step == k


@pytest.mark.slow
def test_wrong_schema_table_is_refused(ckpt, tmp_path):
    import pyarrow.parquet as pq

    root = random_round(tmp_path / "round", vocab_size(ckpt))
    part = table_dir(root, "steps") / "part-00000.parquet"
    table = pq.read_table(part)
    pq.write_table(
        table.drop_columns(["response_token_ids"]).replace_schema_metadata(table.schema.metadata), part
    )
    with pytest.raises(SchemaError, match=r"part-00000\.parquet.*response_token_ids"):
        train_round(root, ckpt, tmp_path / "out", TrainSettings(**FAST))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_padding_and_prompt_positions_never_receive_loss(ckpt, tmp_path):
    root = random_round(tmp_path / "round", vocab_size(ckpt), n_rows=6)
    settings = TrainSettings(**dict(FAST, max_tokens_per_batch=4096), kl_coef=0.1, entropy_coef=0.01)
    plan = BatchPlan(load_round(root), 4096, 0, 1, pad_id=0)
    actor = make_actor(load_policy(ckpt))
    old = response_logprobs(actor, plan, torch.device("cpu"))
    loss_fn = make_policy_loss(settings)

    def grads(perturb: bool) -> list[torch.Tensor]:
        batch = plan.batch(Cursor(0, 0))
        assert (batch.attention_mask == 0).any()  # rows of different lengths: there is padding
        old_grid = batch.scatter([old[i] for i in batch.row_index])
        if perturb:
            off = batch.loss_mask == 0
            batch.advantages[off] = torch.randn(int(off.sum())) * 100.0
        actor.zero_grad()
        loss, _ = batch_loss(actor, batch, old_grid, old_grid, loss_fn, settings)
        loss.backward()
        return [p.grad.clone() for p in actor.parameters()]

    for a, b in zip(grads(False), grads(True), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(dual_clip=0.9), "dual_clip must be > 1"),
        (dict(eps_low=1.5), "must be below 1"),
        (dict(zero_stage=4), "a ZeRO stage is 0, 1, 2 or 3"),
        (dict(cpu_zero_stage=-1), "a ZeRO stage is 0, 1, 2 or 3"),
        (dict(policy_loss="gspo"), "set loss_aggregation to 'seq_mean'"),
        (dict(learning_rate=0.1), "Extra inputs are not permitted"),
    ],
)
def test_settings_refuse_impossible_values_with_a_message(bad, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        TrainSettings(**bad)
    ok = TrainSettings(eps_low=0.2, eps_high=0.28, policy_loss="gspo", loss_aggregation="seq_mean")
    assert (ok.clip_low, ok.clip_high) == (0.2, 0.28)


def zero_advantages(root: Path, keep: int = 0) -> None:
    """Set the token advantages of every row of `root`'s advantages table to zero but the first `keep`'s."""
    adv_dir = table_dir(root, "advantages")
    table = read_table(adv_dir, "advantages")
    values = [a if i < keep else [0.0] * len(a) for i, a in enumerate(table.column("token_advantages").to_pylist())]
    idx = table.schema.get_field_index("token_advantages")
    for part in adv_dir.glob("part-*.parquet"):
        part.unlink()
    write_table(table.set_column(idx, table.schema.field(idx), pa.array(values, pa.list_(pa.float32()))), adv_dir,
                "advantages")


def test_a_round_without_trainable_rows_writes_no_policy_and_says_why(ckpt, tmp_path):
    root = random_round(tmp_path / "round", vocab_size(ckpt), n_rows=8)  # 8 rows in 2 task groups
    zero_advantages(root)
    report = train_round(root, ckpt, tmp_path / "out", TrainSettings(**FAST))
    assert report.nothing_to_train == "all 8 rows (2 task groups) have zero advantage"
    assert report.completed and report.total_steps == 0 and report.counts["kept"] == 0
    assert report.out_dir == str(ckpt)  # the policy stays the starting one
    assert not (tmp_path / "out").exists()  # no copy of unchanged weights, no report file
    assert TrainReport.from_json(report.to_json()) == report
    again = train_round(root, ckpt, tmp_path / "out", TrainSettings(**FAST))
    assert again.nothing_to_train == report.nothing_to_train and not (tmp_path / "out").exists()


def test_the_nothing_to_train_reason_names_the_filters():
    assert why_nothing_to_train(DataCounts(step_rows=3)) == "the advantages table has no rows (3 steps)"
    counts = DataCounts(advantage_rows=24, step_rows=24, task_groups=6, dropped_zero_advantage=8,
                        dropped_uniform_group=15, uniform_groups=4, dropped_empty_response=1)
    assert why_nothing_to_train(counts) == (
        "none of 24 rows (6 task groups) trains: 8 have zero advantage, 15 are in the 4 task groups with equal "
        "rewards (dynamic filtering), 1 have an empty response")


@pytest.mark.slow
def test_one_row_with_advantage_still_trains(ckpt, tmp_path):
    root = random_round(tmp_path / "round", vocab_size(ckpt), n_rows=4)
    zero_advantages(root, keep=1)
    report = train_round(root, ckpt, tmp_path / "out", TrainSettings(**FAST))
    assert report.nothing_to_train is None and report.counts["kept"] == 1
    assert report.completed and report.total_steps == 1 and len(report.steps) == 1
    assert (tmp_path / "out" / "config.json").is_file() and (tmp_path / "out" / REPORT_NAME).is_file()


def test_didpo_train_says_why_it_trained_nothing(ckpt, tmp_path):
    from typer.testing import CliRunner

    from workflows.cli import app

    root = random_round(tmp_path / "round", vocab_size(ckpt), n_rows=4)
    zero_advantages(root)
    done = CliRunner().invoke(app, ["train", "--round", str(root), "--policy", str(ckpt), "--out",
                                    str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    assert (f"nothing to train: all 4 rows (1 task group) have zero advantage; policy unchanged ({ckpt})"
            in " ".join(done.output.split()))
    assert not (tmp_path / "out").exists()


# ---- data parallel ------------------------------------------------------------------------------------------

# 8 rows of <= 32 tokens: several micro-batches per step, so each rank gets its own share
DP_SETTINGS = TrainSettings(lr=3e-3, max_tokens_per_batch=32, grad_clip=1.0, seed=0, epochs=2, micro_batches_per_step=4,
                         warmup_steps=1, schedule="cosine", kl_coef=0.1, entropy_coef=0.01, save_every=1)
TOLERANCE = 1e-5  # float32, the reduction order differs


def torchrun(tmp_path: Path, ckpt: Path, root: Path, out: Path, *extra: str, nproc: int = 2,
             settings: TrainSettings = DP_SETTINGS) -> subprocess.CompletedProcess:
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"train": settings.model_dump(mode="json")}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # this process's group
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           "-m", "workflows.cli", "train", "--round", str(root), "--policy", str(ckpt), "--out", str(out),
           "--config", str(config), *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def test_each_rank_trains_its_own_share_of_a_step():
    shards = [step_shard(4, 9, r, 2) for r in range(2)]
    assert shards == [[4, 6, 8], [5, 7]]  # disjoint, together the whole step, sizes within one
    assert step_shard(0, 1, 1, 2) == []  # a step shorter than the world: rank 1 joins with a zero-weighted batch


@pytest.mark.slow
def test_two_processes_train_like_one(ckpt, tmp_path):
    root = random_round(tmp_path / "round", vocab_size(ckpt), n_rows=8)
    one = train_round(root, ckpt, tmp_path / "one", DP_SETTINGS, reference_checkpoint=ckpt)
    assert one.completed and one.total_steps >= 2
    done = torchrun(tmp_path, ckpt, root, tmp_path / "two")
    assert done.stdout.count("train:") == 1  # one rank speaks
    two = TrainReport.from_json((tmp_path / "two" / REPORT_NAME).read_text())
    assert two.completed and two.total_steps == one.total_steps and two.counts == one.counts
    for a, b in zip(one.steps, two.steps, strict=True):
        assert a.tokens == b.tokens  # metrics are reduced over ranks: the step's tokens, not one rank's
        for name in ("loss", "policy_loss", "approx_kl", "ref_kl", "entropy", "grad_norm"):
            assert getattr(b, name) == pytest.approx(getattr(a, name), abs=TOLERANCE, rel=TOLERANCE), name
    assert max_weight_diff(tmp_path / "one", tmp_path / "two") <= TOLERANCE
    files = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert "model.safetensors" in files and REPORT_NAME in files  # written once, by rank 0


@pytest.mark.slow
def test_a_round_killed_at_two_processes_resumes_at_one(ckpt, tmp_path):
    root = random_round(tmp_path / "round", vocab_size(ckpt), n_rows=8)
    one = train_round(root, ckpt, tmp_path / "one", DP_SETTINGS, reference_checkpoint=ckpt)
    torchrun(tmp_path, ckpt, root, tmp_path / "resumed", "--max-steps", "1")
    assert not (tmp_path / "resumed" / REPORT_NAME).exists()
    rest = train_round(root, ckpt, tmp_path / "resumed", DP_SETTINGS, reference_checkpoint=ckpt)
    assert rest.completed and rest.resumed_from_step == 1
    assert [s.loss for s in rest.steps] == pytest.approx([s.loss for s in one.steps[1:]], abs=TOLERANCE)
    assert max_weight_diff(tmp_path / "one", tmp_path / "resumed") <= TOLERANCE
    assert json.loads((tmp_path / "resumed" / REPORT_NAME).read_text())["steps_done"] == one.total_steps


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_sharded_training_on_two_processes_matches_one(ckpt, tmp_path, stage):
    """The GPU's sharded path through the same code on CPU (gloo): ZeRO-2 partitions the optimizer state and
    gradients, ZeRO-3 the weights too (each rank runs as many forwards as the busiest, and the weights are
    gathered to save a whole checkpoint); the result is one process's within float tolerance."""
    root = random_round(tmp_path / "round", vocab_size(ckpt), n_rows=6)  # 3 micro-batches a step: uneven shares
    settings = DP_SETTINGS.model_copy(update={"epochs": 1, "micro_batches_per_step": 3})
    one = train_round(root, ckpt, tmp_path / "one", settings, reference_checkpoint=ckpt)
    sharded = settings.model_copy(update={"cpu_zero_stage": stage})
    torchrun(tmp_path, ckpt, root, tmp_path / "two", settings=sharded)
    two = TrainReport.from_json((tmp_path / "two" / REPORT_NAME).read_text())
    assert [s.loss for s in two.steps] == pytest.approx([s.loss for s in one.steps], abs=TOLERANCE)
    assert max_weight_diff(tmp_path / "one", tmp_path / "two") <= TOLERANCE
