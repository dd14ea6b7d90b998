"""Cold-start SFT on the tiny policy: demonstrations are the pipeline's own prompts and valid actions that
reach the reference, the loss sees only response tokens and falls, the checkpoint loads, reruns are no-ops."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

from pipeline.agent.episode import Episode  # noqa: E402
from pipeline.agent.grammar import Action, apply_action, parse_response  # noqa: E402
from pipeline.agent.settings import EpisodeSettings  # noqa: E402
from pipeline.policy.loading import load_tokenizer  # noqa: E402
from pipeline.policy.settings import PolicySettings  # noqa: E402
from pipeline.tasks import load_source  # noqa: E402
from training.data import TrainRow, collate  # noqa: E402
from training.demonstrations import (  # noqa: E402
    ReplayExecutor,
    generation_header,
    search_replace_edits,
    sft_examples,
    solution_files,
    unconditioned_examples,
)
from training.sft import REPORT_NAME, evaluate_actions, response_token_loss, sft_loss, train_sft  # noqa: E402
from training.sft_settings import SftSettings  # noqa: E402

EPISODE = EpisodeSettings(max_turns=3, max_response_tokens=512, history_turns=2)


@pytest.fixture(scope="module")
def tasks():
    return load_source("mbpp", split="train", limit=8)


@pytest.fixture(scope="module")
def tokenizer(tiny_policy):
    return load_tokenizer(tiny_policy)


@pytest.fixture(scope="module")
def examples(tasks, tokenizer):
    return sft_examples(tasks, tokenizer, EPISODE, seed=0)


def replay_prompt(task, example, tokenizer) -> list[int]:
    """The prompt the pipeline shows at the example's turn, after its earlier responses."""
    episode = Episode(task, ReplayExecutor(), EPISODE, tokenizer)
    for text in example.previous:
        episode.step(text)
    return tokenizer(episode.render_prompt(tokenizer), add_special_tokens=False)["input_ids"]


def test_prompts_are_the_pipelines(tasks, tokenizer, examples):
    by_id = {t.task_id: t for t in tasks}
    assert {e.task_id for e in examples} == set(by_id)
    assert any(e.turn > 0 for e in examples)
    for e in examples:
        assert len(e.previous) == e.turn
        assert list(e.prompt_ids) == replay_prompt(by_id[e.task_id], e, tokenizer)


def test_responses_are_valid_actions_ending_in_eos(tasks, tokenizer, examples):
    by_id = {t.task_id: t for t in tasks}
    for e in examples:
        assert e.response_ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(list(e.response_ids[:-1])) == e.response_text
        action = parse_response(e.response_text)
        assert isinstance(action, Action), (e.task_id, e.kind, action)
        if e.turn == 0:  # one-turn kinds reach the solution directly
            task = by_id[e.task_id]
            assert apply_action(action, task.workspace, max_file_bytes=EPISODE.max_file_bytes) == \
                solution_files(task)


@pytest.mark.parametrize("kind,action_kind", [("write", "write"), ("edit", "edit"), ("append", "insert")])
def test_each_one_turn_kind(tasks, tokenizer, kind, action_kind):
    ex = sft_examples(tasks[:4], tokenizer, EPISODE, seed=1, mix={kind: 1.0}, finish_rate=0.0)
    assert [e.kind for e in ex] == [kind] * 4
    assert {parse_response(e.response_text).kind for e in ex} == {action_kind}


def test_repair_fixes_a_failing_first_turn(tasks, tokenizer):
    ex = sft_examples(tasks, tokenizer, EPISODE, seed=2, mix={"repair": 1.0}, finish_rate=1.0)
    repairs = [e for e in ex if e.kind == "repair"]
    assert len(repairs) >= len(tasks) - 2  # a task without a mutable line falls back to another kind
    for e in repairs:
        assert e.turn == 1 and len(e.previous) == 1  # the mutated first turn is context, never a target
        prompt = tokenizer.decode(list(e.prompt_ids))
        assert "status: failed" in prompt and "FAILED " in prompt
        task = next(t for t in tasks if t.task_id == e.task_id)
        first = parse_response(e.previous[0])
        wrong = apply_action(first, task.workspace, max_file_bytes=EPISODE.max_file_bytes)
        assert wrong != solution_files(task)
        fix = parse_response(e.response_text)
        assert fix.kind == "edit"
        assert apply_action(fix, wrong, max_file_bytes=EPISODE.max_file_bytes) == solution_files(task)
    finishes = [e for e in ex if e.kind == "finish"]
    assert finishes and all(parse_response(e.response_text).kind == "finish" for e in finishes)


def test_a_repair_task_is_demonstrated_as_one_edit_naming_its_line(tasks, tokenizer):
    from pipeline.tasks.repair import RepairRecipe, bug_candidates, build_task

    repairs = []
    for task in tasks:
        # the first candidate bug that changes a line (not the docstring) of the reference
        bug = next(b for b in bug_candidates(task.reference["solution.py"]) if b.buggy is not None and b.line > 12)
        recipe = RepairRecipe(f"repair/{task.task_id}", "train", "mbpp", None, task.task_id, "solution.py",
                              (bug,), "program", 0)
        repairs.append((build_task(task, recipe), bug))
    rows = sft_examples([t for t, _ in repairs], tokenizer, EPISODE, seed=0, mix={"edit": 1.0}, finish_rate=0.0)
    assert len(rows) == len(repairs)
    for row, (task, bug) in zip(rows, repairs, strict=True):
        action = parse_response(row.response_text)
        # one edit: references without a final newline no longer add a second edit that only appends one
        assert action.kind == "edit" and len(action.edits) == 1, row.response_text
        edit = action.edits[0]
        assert bug.buggy in edit.search and bug.original in edit.replace
        first = task.workspace["solution.py"][:task.workspace["solution.py"].find(edit.search)].count("\n") + 1
        assert f"line {first}" in action.think.lower() and "signature" not in action.think


def test_examples_are_deterministic_and_seeded(tasks, tokenizer, examples):
    assert sft_examples(tasks, tokenizer, EPISODE, seed=0) == examples
    other = sft_examples(tasks, tokenizer, EPISODE, seed=5)
    assert [e.response_text for e in other] != [e.response_text for e in examples]


def test_responses_the_pipeline_would_truncate_are_not_taught(tasks, tokenizer):
    short = EPISODE.model_copy(update={"max_response_tokens": 60})
    ex = sft_examples(tasks, tokenizer, short, seed=0, mix={"write": 1.0})
    assert all(len(e.response_ids) - 1 < 60 for e in ex)
    assert all(e.kind != "write" for e in ex if e.turn == 0)  # whole files do not fit: other kinds instead


_LINES = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "x = 1\n", "    return x\n", "\n"]), max_size=12)


@settings(max_examples=150, deadline=None)
@given(_LINES, _LINES)
def test_search_replace_edits_reach_the_target(old_lines, new_lines):
    old, new = "".join(old_lines), "".join(new_lines)
    files = {"f.py": old}
    edits = search_replace_edits("f.py", old, new) if old else []
    if not old:
        return
    action = Action("edit", "", (0, 0), tuple(edits))
    assert apply_action(action, files, max_file_bytes=1 << 20) == {"f.py": new}


def test_several_hunks_give_several_blocks():
    old = "def f():\n    a = 1\n    return a\n\n\ndef g():\n    b = 2\n    return b\n"
    new = old.replace("a = 1", "a = 10").replace("b = 2", "b = 20")
    edits = search_replace_edits("m.py", old, new)
    assert len(edits) == 2
    assert apply_action(Action("edit", "", (0, 0), tuple(edits)), {"m.py": old}, max_file_bytes=1 << 20) == \
        {"m.py": new}


def _row(prompt, response):
    import numpy as np

    n = len(response)
    return TrainRow("r", "t", "t", np.asarray(prompt), np.asarray(response), np.ones(n, np.float32),
                    np.ones(n, np.float32), np.zeros(n, np.float32))


def test_unconditioned_rows_keep_the_response_after_the_assistant_header(tokenizer, examples):
    header = generation_header(tokenizer)
    assert tokenizer.decode(header) == "<|im_start|>assistant\n"
    assert all(tuple(e.prompt_ids[-len(header):]) == header for e in examples)  # every real prompt ends so
    rows = unconditioned_examples(examples[:3], 2, header)
    assert len(rows) == 6 and {r.kind for r in rows} == {"unconditioned"}
    assert [r.response_ids for r in rows] == [e.response_ids for e in examples[:3] for _ in range(2)]
    assert all(r.prompt_ids == header for r in rows)
    assert unconditioned_examples(examples, 0, header) == []
    with pytest.raises(ValueError, match="empty"):
        unconditioned_examples(examples, 1, ())


def test_loss_covers_response_tokens_only():
    batch = collate([_row([5, 6, 7, 8], [9, 10]), _row([5, 6], [11, 12, 13])], [0, 1], pad_id=0)
    targets = batch.input_ids[:, 1:][batch.loss_mask > 0].tolist()
    assert targets == [9, 10, 11, 12, 13]
    torch.manual_seed(0)
    logits = torch.randn(2, batch.input_ids.shape[1], 20)
    base, n = response_token_loss(logits, batch.input_ids, batch.loss_mask)
    assert int(n) == 5
    prompt_changed = logits.clone()
    prompt_changed[0, :3] += torch.randn(3, 20)  # positions 0-2 predict prompt tokens 1-3
    assert torch.equal(response_token_loss(prompt_changed, batch.input_ids, batch.loss_mask)[0], base)
    pad_changed = logits.clone()
    pad_changed[1, 4:] += 3.0  # row 1 ends at position 4: what it predicts there is padding
    assert torch.equal(response_token_loss(pad_changed, batch.input_ids, batch.loss_mask)[0], base)
    response_changed = logits.clone()
    response_changed[0, 3, 9] += 5.0
    assert not torch.equal(response_token_loss(response_changed, batch.input_ids, batch.loss_mask)[0], base)


FAST = SftSettings(lr=3e-3, warmup_steps=1, max_steps=8, epochs=20, max_tokens_per_batch=16384, seed=0)


@pytest.fixture(scope="module")
def trained(tiny_policy, examples, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "policy"
    return out, train_sft(tiny_policy, out, examples[:6], FAST)


@pytest.mark.slow
def test_loss_falls_and_checkpoint_loads(tiny_policy, trained):
    from transformers import AutoModelForCausalLM

    out, report = trained
    assert report.total_steps == 8 and len(report.steps) == 8
    losses = [s.loss for s in report.steps]
    assert sum(losses[-2:]) / 2 < 0.9 * losses[0]
    assert all(s.response_tokens > 0 and s.tokens > s.response_tokens for s in report.steps)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    before = AutoModelForCausalLM.from_pretrained(tiny_policy, local_files_only=True)
    assert not torch.equal(model.model.embed_tokens.weight, before.model.embed_tokens.weight)
    assert load_tokenizer(out).get_vocab() == load_tokenizer(tiny_policy).get_vocab()
    assert (out / REPORT_NAME).is_file() and (out / "metrics.jsonl").is_file()


@pytest.mark.slow
def test_rerun_is_a_noop_and_other_inputs_are_refused(tiny_policy, trained, examples, tmp_path):
    out, report = trained
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = train_sft(tiny_policy, out, examples[:6], FAST)
    assert again.plan_id == report.plan_id and again.steps == report.steps
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp
    with pytest.raises(FileExistsError, match="other examples or settings"):
        train_sft(tiny_policy, out, examples[:6], FAST.model_copy(update={"lr": 1e-3}))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        train_sft(tiny_policy, busy, examples[:6], FAST)
    assert (busy / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_training_is_deterministic(tiny_policy, trained, examples, tmp_path):
    _, report = trained
    again = train_sft(tiny_policy, tmp_path / "again", examples[:6], FAST)
    assert [s.loss for s in again.steps] == [s.loss for s in report.steps]


@pytest.mark.slow
def test_evaluate_actions_counts(trained, tasks):
    out, _ = trained
    policy = PolicySettings(temperature=1.0, top_p=0.95, max_new_tokens=12)
    ev = evaluate_actions(out, tasks[:3], EPISODE, policy, seed=0)
    assert ev["n"] == 3
    assert ev["valid"] + sum(ev["invalid_reasons"].values()) == 3
    assert sum(ev["by_kind"].values()) == 3
    assert 0 <= ev["applies"] <= ev["valid"]
    assert ev["mean_response_tokens"] <= 12


@pytest.mark.parametrize("bad", [
    {"mix": {"bogus": 1.0}}, {"mix": {"write": 0.0}}, {"mix": {"write": -1.0}}, {"lr": 0.0},
    {"schedule": "linear"}, {"max_steps": 0}, {"warmup_steps": 10, "max_steps": 10}, {"unknown_key": 1},
    {"finish_rate": 1.5}, {"device": "tpu"}, {"device": "cuda:x"}, {"device": "cpu:0"},
    {"compute_dtype": "float16"},
])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        SftSettings(**bad)


def test_bfloat16_autocast_changes_the_arithmetic_not_the_loss(tiny_policy, examples):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_policy, local_files_only=True)
    batch = collate([_row(e.prompt_ids, e.response_ids) for e in examples[:3]], [0, 1, 2], pad_id=0)
    full, _ = sft_loss(model, "float32")(batch)
    half, _ = sft_loss(model, "bfloat16")(batch)
    assert full.dtype == half.dtype == torch.float32  # the loss is taken in float32 either way
    assert not torch.equal(full, half)  # autocast ran the products in bfloat16 ...
    assert abs(float(half.detach()) - float(full.detach())) < 0.02 * float(full.detach())  # ... barely moving it
    half.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_a_bfloat16_run_learns_and_saves_float32_weights(tiny_policy, trained, examples, tmp_path):
    from safetensors import safe_open

    _, report = trained
    half = FAST.model_copy(update={"compute_dtype": "bfloat16"})
    out = tmp_path / "bf16"
    again = train_sft(tiny_policy, out, examples[:6], half)
    assert again.plan_id != report.plan_id  # another precision is another run: never resumed as this one
    losses = [s.loss for s in again.steps]
    assert sum(losses[-2:]) / 2 < 0.9 * losses[0]
    assert abs(losses[0] - report.steps[0].loss) < 0.02 * report.steps[0].loss  # the same first batch
    with safe_open(out / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}


def test_the_device_says_where_not_what(tiny_policy, examples, tmp_path):
    from training.sft import _plan_id

    assert SftSettings(device="cuda:1").device == "cuda:1"
    on_gpu = FAST.model_copy(update={"device": "cuda"})
    assert _plan_id(examples, on_gpu, tiny_policy) == _plan_id(examples, FAST, tiny_policy)  # a resume may move
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device on this machine"):
            train_sft(tiny_policy, tmp_path / "gpu", examples[:2], on_gpu)
        assert not (tmp_path / "gpu").exists()


def test_bad_inputs_are_refused(tiny_policy, tasks, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="no SFT examples"):
        train_sft(tiny_policy, tmp_path / "x", [], FAST)
    with pytest.raises(ValueError, match="mix"):
        sft_examples(tasks, tokenizer, EPISODE, seed=0, mix={"nope": 1.0})
    with pytest.raises(FileNotFoundError):
        train_sft(Path(tmp_path / "missing"), tmp_path / "y", [], FAST)


@pytest.mark.slow
def test_cold_start_adds_episodes_of_the_rl_tasks_and_prompt_free_copies(tiny_policy, tmp_path):
    from pipeline.tasks.settings import resolve_tasks
    from training.config import load_config
    from training.sft import run_cold_start

    cfg = load_config(None, [
        f"policy.checkpoint={tiny_policy}", "policy.size=tiny", "episode.max_response_tokens=512",
        "tasks.train=[{source: mbpp, split: train, limit: 2}]", "tasks.eval=[{source: humanevalfix, limit: 1}]",
        "sft.tasks={train: [{source: mbpp, split: test, limit: 3}], eval: []}", "sft.mix={append: 1.0}",
        "sft.finish_rate=0", "sft.rl_task_episodes=2", "sft.unconditioned_copies=1", "sft.max_steps=1",
        "sft.warmup_steps=0", "sft.episodes_per_task=1",
    ])
    report = run_cold_start(cfg, tiny_policy, tmp_path / "sft", [], evaluate=False)
    assert report.n_examples == (3 + 2 * 2) * 2  # one turn per episode; each response once more prompt-free
    assert report.examples_by_kind["unconditioned"] == 3 + 2 * 2
    rl_tasks = resolve_tasks(cfg.tasks)[0]
    with pytest.raises(ValueError, match="(?i)evaluat"):  # an RL task may not be an evaluation problem either
        run_cold_start(cfg, tiny_policy, tmp_path / "other", rl_tasks[:1], evaluate=False)
