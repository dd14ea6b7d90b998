"""Online mode's advantage hook on CPU: real OpenRLHF `Experience` batches, the same `didpo_advantages` that
`DidpoExperienceMaker.compute_advantages_and_returns` calls, compared with the offline credit core."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.credit import CreditSettings, compute_credit
from pipeline.credit_io import step_input
from training.cpu_shims import install_cpu_shims
from training.online import (
    STEP_KEY,
    OnlineBatchError,
    didpo_advantages,
    load_online_config,
    openrlhf_argv,
    step_experience,
    step_record,
)

REPO = Path(__file__).resolve().parents[2]
PAD = 0
BUGGY = "def total(xs):\n    s = 0\n    for x in xs:\n        s = x\n    return s\n"
FIXES = {  # a shared fix (anchors form across rollouts) and two idiosyncratic ones
    "shared": "        s = s + x\n        count = count + 1\n        seen.append(x)\n",
    "other": "        s += x * 1\n",
    "wrong": "        s = x - 1\n        print(x)\n",
}


@pytest.fixture(scope="module")
def experience_cls():
    torch.set_num_threads(1)
    install_cpu_shims()
    from openrlhf.trainer.ppo_utils.experience import Experience

    return Experience


def _tokens(text: str) -> tuple[list[int], list[int]]:
    spans = [m.span() for m in re.finditer(r"\S+|\s+", text)]
    return [s for s, _ in spans], [e for _, e in spans]


def _record(task: str, sample: int, turn: int, fix: str | None, reward: float, prompt_len: int) -> dict:
    """A steps-table row of one agent turn: a search/replace edit (or run_tests) with exact spans."""
    traj = f"{task}/traj{sample}"
    path = f"{task}.py"
    search = "        s = x\n"
    if fix is None:
        text, action = "<think>run the tests</think>\nRUN_TESTS\n", {"kind": "run_tests", "edits": []}
        before, after = [], []
    else:
        replace = FIXES[fix]
        head = f"<think>accumulate ({fix})</think>\nEDIT {path}\n<<<SEARCH\n"
        mid = "=======\n"
        text = head + search + mid + replace + ">>>REPLACE\n"
        s0, r0 = len(head), len(head) + len(search) + len(mid)
        action = {"kind": "edit", "edits": [{"op": "replace", "path": path, "search": search, "replace": replace,
                                             "search_span": [s0, s0 + len(search)],
                                             "replace_span": [r0, r0 + len(replace)]}]}
        before = [{"path": path, "text": BUGGY}]
        after = [{"path": path, "text": BUGGY.replace(search, replace)}]
    starts, ends = _tokens(text)
    rng = np.random.default_rng(zlib.crc32(f"{task}|{sample}|{turn}".encode()))
    return {
        "row_id": f"{traj}/t{turn}", "traj_id": traj, "task_id": task, "turn": turn, "step_reward": reward,
        "return_to_go": 0.0, "response_text": text, "token_char_starts": starts, "token_char_ends": ends,
        "action_json": json.dumps(action), "files_before": before, "files_after": after,
        "workspace_hash_before": f"{task}/h{turn}" if turn == 0 else f"{traj}/h{turn}",
        "visible_passed": round(4 * reward), "visible_total": 4,  # didpo_did's outcome after the step
        "prompt_token_ids": rng.integers(1, 1000, prompt_len).tolist(),
        "response_token_ids": rng.integers(1, 1000, len(starts)).tolist(),
        "behavior_logprobs": [-0.5] * len(starts),
    }


@pytest.fixture(scope="module")
def records() -> list[dict]:
    """2 tasks x 4 rollouts x 2 turns; the shared fix appears in 3 rollouts of each task, returns differ."""
    plan = [("shared", 0.2, 1.0), ("shared", 0.2, 0.0), ("shared", 0.2, 1.0), ("other", 0.1, 0.0)]
    rows = []
    for t, task in enumerate(("taskA", "taskB")):
        for sample, (fix, r0, outcome) in enumerate(plan if t == 0 else plan[::-1]):
            rows.append(_record(task, sample, 0, fix, r0, prompt_len=5 + sample + t))
            rows.append(_record(task, sample, 1, None if sample % 2 else "wrong", outcome, prompt_len=9 + sample))
    gamma = CreditSettings().gamma
    for i in range(0, len(rows), 2):  # return_to_go as pipeline.rollout.finish writes it
        rows[i + 1]["return_to_go"] = rows[i + 1]["step_reward"]
        rows[i]["return_to_go"] = rows[i]["step_reward"] + gamma * rows[i + 1]["step_reward"]
    return rows


def _right_padded(records, experience_cls, micro: int, max_len: int = 4096):
    """Per-turn rows concatenated into micro-batches exactly as OpenRLHF's split_rollout_samples does."""
    singles = [step_experience(r, max_len=max_len, experience_cls=experience_cls) for r in records]
    return [experience_cls.concat_experiences(singles[i: i + micro], PAD) for i in range(0, len(singles), micro)]


def _left_padded(records, experience_cls, micro: int):
    """The same rows left-padded (the layout of older OpenRLHF and of HF generate batches)."""
    from openrlhf.utils.utils import zero_pad_sequences

    out = []
    for i in range(0, len(records), micro):
        singles = [step_experience(r, max_len=4096, experience_cls=experience_cls) for r in records[i: i + micro]]
        batch = experience_cls.concat_experiences(singles, PAD)
        for name in ("sequences", "attention_mask", "action_mask"):
            setattr(batch, name, zero_pad_sequences([getattr(s, name) for s in singles], side="left"))
        out.append(batch)
    return out


def _expected(records, settings):
    result = compute_credit([step_input(r) for r in records], settings)
    return {a.step.row_id: a.token_advantages for a in result.advantages}, result


def _check_aligned(experiences, records, expected):
    k = 0
    for exp in experiences:
        mask = exp.action_mask.bool()
        assert exp.advantages.shape == mask.shape and exp.returns.shape == mask.shape
        assert torch.all(exp.advantages[~mask] == 0) and torch.all(exp.returns[~mask] == 0)
        for b in range(mask.shape[0]):
            record = records[k]
            got = exp.advantages[b, mask[b]].double().numpy()
            np.testing.assert_allclose(got, expected[record["row_id"]], rtol=0, atol=1e-6)
            assert torch.allclose(exp.returns[b, mask[b]], torch.tensor(record["return_to_go"], dtype=torch.float32))
            k += 1
        assert STEP_KEY not in exp.info
    assert k == len(records)


@pytest.mark.parametrize("layout", ["right", "left"])
def test_advantages_equal_offline_core_token_for_token(records, experience_cls, layout):
    settings = CreditSettings(estimator="didpo")
    expected, offline = _expected(records, settings)
    assert offline.diagnostics.n_anchors > 0 and max(a.n_diff_tokens for a in offline.advantages) > 0  # anchors formed
    make = _right_padded if layout == "right" else _left_padded
    experiences = make(records, experience_cls, micro=3)
    result = didpo_advantages(experiences, settings)
    _check_aligned(experiences, records, expected)
    assert [a.step.row_id for a in result.advantages] == [r["row_id"] for r in records]
    # the diff-level term reaches the tokens: some row's tokens are not all its episode advantage
    assert any(not np.allclose(expected[r["row_id"]], expected[r["row_id"]][0]) for r in records)


def test_order_of_experiences_does_not_change_credit(records, experience_cls):
    settings = CreditSettings()
    expected, _ = _expected(records, settings)
    shuffled = records[::-1]
    experiences = _right_padded(shuffled, experience_cls, micro=4)
    didpo_advantages(experiences, settings)
    _check_aligned(experiences, shuffled, expected)


@pytest.mark.parametrize(("adv_norm", "episode_level"), [("mean_norm", "dr_grpo"), ("mean_std_norm", "grpo")])
def test_lambda_zero_is_the_episode_level_estimator(records, experience_cls, adv_norm, episode_level):
    with_lam0 = _right_padded(records, experience_cls, micro=5)
    baseline = _right_padded(records, experience_cls, micro=5)
    full = _right_padded(records, experience_cls, micro=5)
    didpo_advantages(with_lam0, CreditSettings(estimator="didpo", lam=0.0, adv_norm=adv_norm))
    didpo_advantages(baseline, CreditSettings(estimator=episode_level))
    didpo_advantages(full, CreditSettings(estimator="didpo", lam=1.0, adv_norm=adv_norm))
    for a, b in zip(with_lam0, baseline, strict=True):
        assert torch.equal(a.advantages, b.advantages)
    assert any(not torch.equal(a.advantages, f.advantages) for a, f in zip(baseline, full, strict=True))


@pytest.mark.parametrize("estimator", ["grpo", "gigpo", "rloo", "didpo"])
def test_estimator_switch(records, experience_cls, estimator):
    settings = CreditSettings(estimator=estimator)
    expected, _ = _expected(records, settings)
    default_expected, _ = _expected(records, CreditSettings())
    experiences = _right_padded(records, experience_cls, micro=4)
    didpo_advantages(experiences, settings)
    _check_aligned(experiences, records, expected)
    assert any(not np.allclose(expected[r], default_expected[r]) for r in expected)


def test_default_estimator_reads_each_steps_visible_outcome_online(records, experience_cls):
    """didpo_did (the default) models the visible pass fraction after every step; the step records that travel
    with OpenRLHF rows carry it, so online credit is the offline one, not the final-return fallback."""
    settings = CreditSettings()
    assert settings.estimator == "didpo_did"
    expected, _ = _expected(records, settings)
    fallback, _ = _expected(records, settings.model_copy(update={"did_outcome": "return"}))
    assert any(not np.allclose(expected[r], fallback[r]) for r in expected)
    # what an online episode hands over: its steps row's STEP_FIELDS, plus the sequence the trainer needs
    sequence = ("prompt_token_ids", "response_token_ids", "behavior_logprobs")
    travelled = [{**step_record(r), **{k: r[k] for k in sequence}} for r in records]
    experiences = _right_padded(travelled, experience_cls, micro=4)
    didpo_advantages(experiences, settings)
    _check_aligned(experiences, records, expected)


def test_row_cut_by_max_len_keeps_its_first_tokens(records, experience_cls):
    settings = CreditSettings()
    expected, _ = _expected(records, settings)
    row = records[0]
    max_len = len(row["prompt_token_ids"]) + 4
    experiences = [step_experience(r, max_len=max_len if r is row else 4096, experience_cls=experience_cls)
                   for r in records]
    didpo_advantages(experiences, settings)
    first = experiences[0]
    assert int(first.action_mask.sum()) == 4
    np.testing.assert_allclose(first.advantages[0, first.action_mask[0].bool()].numpy(),
                               expected[row["row_id"]][:4], atol=1e-6)


def test_bad_batches_are_refused_with_the_place(records, experience_cls):
    experiences = _right_padded(records, experience_cls, micro=4)
    del experiences[1].info[STEP_KEY]
    with pytest.raises(OnlineBatchError, match=r"experience 1: info\['didpo_step'\]"):
        didpo_advantages(experiences, CreditSettings())
    experiences = _right_padded(records, experience_cls, micro=4)
    del experiences[0].info[STEP_KEY][2]["action_json"]
    with pytest.raises(OnlineBatchError, match=r"experience 0 row 2: step record lacks \['action_json'\]"):
        didpo_advantages(experiences, CreditSettings())
    experiences = _right_padded(records, experience_cls, micro=4)
    experiences[0].action_mask[1, :] = 1  # more action positions than the step's response tokens
    with pytest.raises(OnlineBatchError, match="experience 0 row 1 .* action positions"):
        didpo_advantages(experiences, CreditSettings())


def test_gpu_preset_loads_and_maps_to_openrlhf_flags(tmp_path):
    cfg, online = load_online_config(REPO / "configs" / "gpu_online.yaml")
    argv = openrlhf_argv(cfg, online, tmp_path / "prompts.jsonl")
    flags = dict(zip(argv[::2], argv[1::2], strict=False))
    assert flags["--ds.zero_stage"] == "2"
    assert flags["--rollout.n_samples_per_prompt"] == str(cfg.pipeline.samples_per_task)
    assert flags["--train.agent_func_path"].endswith("training/online.py")
    assert "--algo.kl.use_loss" in argv
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "configs" / "gpu_online.yaml").read_text() + "\n  not_a_knob: 1\n")
    with pytest.raises(ValueError, match="not_a_knob"):
        load_online_config(bad)


def test_agent_file_loads_the_way_openrlhf_loads_it(experience_cls):
    """OpenRLHF's vLLM engine execs `--train.agent_func_path` as a fresh module and needs `AgentExecutor`."""
    import importlib.util

    from openrlhf.utils.agent import AgentExecutorBase

    spec = importlib.util.spec_from_file_location("agent_module", REPO / "training" / "online.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.AgentExecutor, AgentExecutorBase)
    with pytest.raises(AttributeError, match="no attribute 'NotThere'"):
        module.NotThere  # noqa: B018
