"""`didpo round`: SFT cold start, then pipeline -> update -> held-out evaluation per round, resumable."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from pipeline import schema
from pipeline.run import RoundConflict
from training.config import load_config
from workflows.rounds import round_policy, run_rounds

pytestmark = pytest.mark.slow


_OVERRIDES = [
    "policy.size=tiny", "policy.max_new_tokens=24", "episode.max_turns=2", "episode.max_response_tokens=512",
    "pipeline.samples_per_task=2", "tasks.train=[{source: mbpp, split: train, limit: 2}]",
    "tasks.eval=[{source: humanevalfix, limit: 2}]", "sandbox.pool_size=1", "eval.max_tasks=2",
    "train.max_tokens_per_batch=8192",
]


def _config(root, checkpoint):
    return load_config(None, [
        f"run.root={root}", f"policy.checkpoint={checkpoint}", *_OVERRIDES,
        "sft.tasks={train: [{source: mbpp, split: train, limit: 4}], eval: [{source: mbpp, split: validation, limit: 2}]}",
        "sft.max_steps=2", "sft.warmup_steps=0", "sft.rl_task_episodes=1",
    ])


def test_one_round_runs_every_stage_and_resumes(tmp_path, tiny_policy):
    cfg = _config(tmp_path / "runs", tiny_policy)
    console = Console(record=True, width=200)
    rows = run_rounds(cfg, 1, console=console)
    assert len(rows) == 1 and rows[0].round == 0 and rows[0].estimator == "didpo_did"
    run_dir = tmp_path / "runs" / "local"
    # the SFT start's held-out check sits beside the rounds' in the closing table, which says what is held out
    baseline = json.loads((run_dir / "sft_heldout.json").read_text())
    assert baseline["metrics"]["tasks"] == 2 and 0.0 <= baseline["metrics"]["pass_rate"] <= 1.0
    text = console.export_text()
    assert "SFT start" in text and "held out: 2 humanevalfix tasks" in text
    manifest = schema.read_manifest(run_dir / "round=0")
    assert set(manifest.stages) == {"rollouts", "credit", "train", "eval"}
    assert 0.0 <= manifest.stages["eval"]["metrics"]["pass_rate"] <= 1.0
    sft_report = json.loads((run_dir / "sft" / "sft_report.json").read_text())
    assert sft_report["total_steps"] == 2 and sft_report["evaluation"]["n"] == 2
    # a normal HF checkpoint per round; none when the round had nothing to train (often, at the tiny policy)
    policy = run_dir / "round=0" / "policy"
    if "nothing_to_train" in manifest.stages["train"]:
        assert not policy.exists() and rows[0].no_update.startswith("nothing to train: ")
    else:
        assert (policy / "config.json").is_file() and not rows[0].no_update
    table = json.loads((run_dir / "rounds.json").read_text())
    assert table[0]["anchors"] == rows[0].anchors

    stamps = {k: v["completed_at"] for k, v in manifest.stages.items()}
    measured = (run_dir / "sft_heldout.json").stat().st_mtime_ns
    again = run_rounds(cfg, 1, console=Console(quiet=True))  # a rerun resumes: nothing is redone
    assert (run_dir / "sft_heldout.json").stat().st_mtime_ns == measured
    assert again[0].heldout_pass_rate == rows[0].heldout_pass_rate
    assert {k: v["completed_at"] for k, v in schema.read_manifest(run_dir / "round=0").stages.items()} == stamps

    # what no completed stage reads resumes; eval (a leaf nothing reads) measures again; a train key is refused
    relaxed = cfg.model_copy(update={"logging": cfg.logging.model_copy(update={"level": "DEBUG"}),
                                     "eval": cfg.eval.model_copy(update={"samples": 2})})
    run_rounds(relaxed, 1, console=Console(quiet=True))
    stages = schema.read_manifest(run_dir / "round=0").stages
    assert stages["eval"]["inputs"]["eval.samples"] == 2
    assert {k: v["completed_at"] for k, v in stages.items() if k != "eval"} == {
        k: v for k, v in stamps.items() if k != "eval"}
    faster = cfg.model_copy(update={"train": cfg.train.model_copy(update={"lr": 1e-3})})
    with pytest.raises(RoundConflict, match=r"stage train was completed with other inputs: train\.lr \S+ -> 0\.001\."):
        run_rounds(faster, 1, console=Console(quiet=True))


def _set_advantages(round_dir, value):
    """Rewrite a round's advantages table: every token of row i, of n tokens, gets value(i, n). Returns the table
    as it was."""
    import pyarrow as pa

    adv_dir = schema.table_dir(round_dir, "advantages")
    table = schema.read_table(adv_dir, "advantages")
    tokens = [[value(i, len(a))] * len(a) for i, a in enumerate(table.column("token_advantages").to_pylist())]
    for part in adv_dir.glob("part-*.parquet"):
        part.unlink()
    idx = table.schema.get_field_index("token_advantages")
    column = pa.array(tokens, pa.list_(pa.float32()))
    schema.write_table(table.set_column(idx, table.schema.field(idx), column), adv_dir, "advantages")
    return table


def test_the_kl_reference_is_the_runs_starting_policy_in_every_round(tmp_path, tiny_policy, monkeypatch):
    """As in OpenRLHF and verl, `train.kl_coef` pulls towards the policy the run started from; a reference that
    moved to each round's start would let the drift add up over rounds."""
    import pipeline.run
    import training.trainer

    cfg = load_config(None, [f"run.root={tmp_path / 'runs'}", f"policy.checkpoint={tiny_policy}", "sft.enabled=false",
                             "train.kl_coef=0.5", *_OVERRIDES])
    real_run_round, real_train_round = pipeline.run.run_round, training.trainer.train_round

    def run_round(*args, **kwargs):  # the real round, then advantages of both signs so that every round trains
        result = real_run_round(*args, **kwargs)
        _set_advantages(result.round_dir, lambda row, n: 1.0 if row % 2 else -1.0)
        return result

    calls = []

    def train_round(round_dir, init, out, settings, reference_checkpoint=None, **kwargs):
        report = real_train_round(round_dir, init, out, settings, reference_checkpoint=reference_checkpoint, **kwargs)
        calls.append((str(init), str(reference_checkpoint), report.steps[0].ref_kl))
        return report

    monkeypatch.setattr(pipeline.run, "run_round", run_round)
    monkeypatch.setattr(training.trainer, "train_round", train_round)
    rows = run_rounds(cfg, 2, console=Console(quiet=True))
    assert not any(r.no_update for r in rows)
    run_dir = tmp_path / "runs" / "local"
    (init0, ref0, kl0), (init1, ref1, kl1) = calls
    assert init0 == ref0 == ref1 == str(tiny_policy) and init1 == str(run_dir / "round=0" / "policy")
    # round 0's first step starts at its reference; round 1 starts where round 0's update left it, away from it
    assert kl0 == pytest.approx(0.0, abs=1e-6) and kl1 > 1e-5


def test_a_round_with_nothing_to_train_keeps_the_policy_and_resumes(tmp_path, tiny_policy, monkeypatch):
    import training.trainer
    from pipeline.run import policy_version, resolve_policy, run_round
    from pipeline.tasks.settings import resolve_tasks

    cfg = load_config(None, [f"run.root={tmp_path / 'runs'}", f"policy.checkpoint={tiny_policy}", "sft.enabled=false",
                             *_OVERRIDES])
    run_dir = tmp_path / "runs" / "local"
    # round 0's pipeline stages as `didpo round` runs them, then every advantage set to zero
    round0 = run_round(cfg, 0, resolve_policy(cfg.policy), resolve_tasks(cfg.tasks)[0]).round_dir
    table = _set_advantages(round0, lambda row, n: 0.0)

    trained = []  # the rounds the trainer is called on
    real_train_round = training.trainer.train_round

    def train_round(round_dir, *args, **kwargs):
        trained.append(str(round_dir))
        return real_train_round(round_dir, *args, **kwargs)

    monkeypatch.setattr(training.trainer, "train_round", train_round)
    console = Console(record=True, width=300)
    rows = run_rounds(cfg, 2, console=console)
    assert trained == [str(round0), str(run_dir / "round=1")]
    reason = f"all {table.num_rows} rows ("
    assert rows[0].no_update.startswith(f"nothing to train: {reason}") and rows[0].no_update.endswith(
        f"have zero advantage; policy unchanged ({tiny_policy})")
    assert rows[0].loss != rows[0].loss  # NaN: no update steps
    assert not (round0 / "policy").exists()  # no new policy folder, no copied weights
    train = schema.read_manifest(round0).stages["train"]
    assert train["nothing_to_train"].startswith(reason) and train["policy"] == str(tiny_policy)
    assert train["steps"] == 0 and train["counts"]["kept"] == 0
    # the next round samples with the unchanged policy: the one rule, and what round 1 recorded
    assert round_policy(cfg, 1) is None  # = policy.checkpoint
    assert schema.read_manifest(run_dir / "round=1").policy_checkpoint == policy_version(tiny_policy)
    assert "nothing to train: " + reason in console.export_text()  # the printed table says why, not "-"
    assert json.loads((run_dir / "rounds.json").read_text())[0]["no_update"] == rows[0].no_update

    stamps = {k: v["completed_at"] for k, v in schema.read_manifest(round0).stages.items()}
    trained.clear()
    again = run_rounds(cfg, 2, console=Console(quiet=True))  # a rerun: round 0's decision is read, not redone
    assert str(round0) not in trained and again[0].no_update == rows[0].no_update
    assert {k: v["completed_at"] for k, v in schema.read_manifest(round0).stages.items()} == stamps
    assert not (round0 / "policy").exists()


def test_a_round_runs_on_repair_tasks_split_by_program(tmp_path, tiny_policy):
    from pipeline.sandbox import Judge, SandboxPool, SandboxSettings
    from pipeline.tasks import load_source
    from pipeline.tasks.repair import make_repair_tasks, write_recipes

    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        judge = Judge(pool)
        recipes = make_repair_tasks(load_source("mbpp", split="train", limit=16),
                                    lambda task, files: judge.run(task, files).status != "passed",
                                    n=8, bugs=(1, 2), seed=0, test_fraction=0.5)
    path = tmp_path / "repair.jsonl"
    write_recipes(recipes, path)
    assert {r.split for r in recipes} == {"train", "test"}
    cfg = load_config(None, [
        f"run.root={tmp_path / 'runs'}", f"policy.checkpoint={tiny_policy}", "policy.size=tiny",
        "policy.max_new_tokens=24", "episode.max_turns=2", "episode.max_response_tokens=512",
        "pipeline.samples_per_task=2", "sandbox.pool_size=1", "eval.max_tasks=2", "train.max_tokens_per_batch=8192",
        f"tasks.train=[{{source: repair, path: {path}, split: train, limit: 2}}]",
        f"tasks.eval=[{{source: repair, path: {path}, split: test, limit: 2}}]",
        "sft.tasks={train: [{source: mbpp, split: validation, limit: 4}], eval: [{source: humanevalfix, limit: 2}]}", "sft.max_steps=2", "sft.warmup_steps=0", "sft.rl_task_episodes=1",
    ])
    console = Console(record=True, width=200)
    rows = run_rounds(cfg, 1, console=console)
    assert len(rows) == 1 and 0.0 <= rows[0].heldout_pass_rate <= 1.0
    assert "held out: 2 repair tasks; unseen programs" in console.export_text()  # the table names its split
    trajectories = schema.read_table(tmp_path / "runs" / "local" / "round=0" / "trajectories", "trajectories").to_pylist()
    train_ids = {r.task_id for r in recipes if r.split == "train"}
    assert trajectories and {t["task_id"] for t in trajectories} <= train_ids  # rollouts on train programs only


def test_two_runs_that_differ_only_in_name_make_the_same_update(tmp_path, tiny_policy, monkeypatch):
    """The demo and a compare arm of the same seed and start: the sampling seeds leave out the run's name, so
    the rollouts and advantages agree; the update's plan orders rows by content, not by the row ids that hash
    the name, so the updated policies agree to the byte."""
    import pipeline.run

    real_run_round = pipeline.run.run_round

    def run_round(*args, **kwargs):  # advantages of both signs set by content (the response's length), so that
        result = real_run_round(*args, **kwargs)  # the tiny policy's round trains whatever it sampled
        _set_advantages(result.round_dir, lambda row, n: 1.0 if n % 2 else -1.0)
        return result

    monkeypatch.setattr(pipeline.run, "run_round", run_round)
    weights = []
    for name in ("local", "didpo_did-seed0"):
        cfg = load_config(None, [f"run.root={tmp_path / 'runs'}", f"run.run_id={name}", f"policy.checkpoint={tiny_policy}",
                                 "sft.enabled=false", *_OVERRIDES, "pipeline.samples_per_task=4",
                                 "train.max_tokens_per_batch=1"])  # a row per micro-batch: the order tells
        (row,) = run_rounds(cfg, 1, console=Console(quiet=True))
        assert not row.no_update
        weights.append((tmp_path / "runs" / name / "round=0" / "policy" / "model.safetensors").read_bytes())
    ids = [set(schema.read_table(schema.table_dir(tmp_path / "runs" / n / "round=0", "steps"), "steps")
               .column("row_id").to_pylist()) for n in ("local", "didpo_did-seed0")]
    assert not ids[0] & ids[1]  # every row id differs between the runs
    assert weights[0] == weights[1]
