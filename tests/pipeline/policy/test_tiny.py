"""The tiny policy checkpoint: built offline, loaded like any Hugging Face checkpoint, exact tokenizer."""

from __future__ import annotations

import json
import shutil
import unicodedata

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode
from typer.testing import CliRunner

import pipeline.policy.tiny as tiny
from pipeline.agent.grammar import ACTION_SPECS
from pipeline.policy.loading import (
    CheckpointError,
    check_checkpoint,
    checkpoint_parameters,
    load_policy,
    load_tokenizer,
)
from pipeline.policy.settings import PolicySettings
from pipeline.policy.tiny import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    SIZES,
    build_checkpoint,
    count_parameters,
    ensure_checkpoint,
    qwen2_config,
    task_texts,
)
from pipeline.tasks.base import Task, TestSuite
from workflows.cli import app  # the real `didpo` app: its one error mapping

# ---------------------------------------------------------------- checkpoint files and loading


def test_checkpoint_is_a_plain_hf_directory(tiny_checkpoint):
    root = tiny_checkpoint.path
    assert set(tiny_checkpoint.files) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    config = json.loads((root / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] == tiny_checkpoint.vocab_size <= SIZES["tiny"].vocab_size
    tok_config = json.loads((root / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == CHAT_TEMPLATE
    assert tok_config["eos_token"] == IM_END and tok_config["pad_token"] == ENDOFTEXT
    generation = json.loads((root / "generation_config.json").read_text())
    ids = tiny_checkpoint.special_token_ids
    assert generation["eos_token_id"] == [ids[IM_END], ids[ENDOFTEXT]]
    assert ids == {ENDOFTEXT: 0, IM_START: 1, IM_END: 2}


def test_auto_classes_load_it_offline(tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tiny_checkpoint.path
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert isinstance(model, Qwen2ForCausalLM)
    assert tokenizer.is_fast and len(tokenizer) == model.config.vocab_size
    assert tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_START, IM_END]) == [0, 1, 2]
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == ENDOFTEXT
    # The loaded backend is exactly the saved tokenizer.json (transformers rebuilds Qwen2 pipelines).
    assert json.loads(tokenizer.backend_tokenizer.to_str()) == json.loads(
        (path / "tokenizer.json").read_text()
    )


def test_parameter_counts(tiny_checkpoint, model):
    n = tiny_checkpoint.n_parameters
    assert n == count_parameters(model) == checkpoint_parameters(tiny_checkpoint.path)
    assert 100_000 < n < 1_000_000
    ids = tiny_checkpoint.special_token_ids
    with torch.device("meta"):  # size the demo preset without allocating or training anything
        small = Qwen2ForCausalLM(qwen2_config(SIZES["small"], SIZES["small"].vocab_size, ids))
        wide = Qwen2ForCausalLM(qwen2_config(SIZES["small_wide"], SIZES["small_wide"].vocab_size, ids))
        deep = Qwen2ForCausalLM(qwen2_config(SIZES["small_deep"], SIZES["small_deep"].vocab_size, ids))
    assert 1_000_000 < count_parameters(small) < count_parameters(deep) < count_parameters(wide) < 10_000_000
    assert deep.config.num_hidden_layers == 2 * small.config.num_hidden_layers  # small's width, twice its depth


def test_load_tokenizer_pads_left(tok):
    assert tok.padding_side == "left" and tok.pad_token == ENDOFTEXT
    batch = tok(["x = 1", "def long_function_name(a, b):\n    return a"], padding=True, return_tensors="pt")
    short = batch["attention_mask"][0]
    assert short[0] == 0 and short[-1] == 1  # padding in front, text flush right
    assert (batch["input_ids"][0][short == 0] == tok.pad_token_id).all()


def test_load_policy_dtype_and_mode(tiny_checkpoint):
    model = load_policy(tiny_checkpoint.path, dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and not model.training
    with pytest.raises(ValueError, match="float32"):
        load_policy(tiny_checkpoint.path, dtype="int8")


def test_forward_and_generate(tok, model, tiny_checkpoint):
    batch = tok(["print('hi')", "for i in range(3):\n\tpass"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (*batch["input_ids"].shape, tiny_checkpoint.vocab_size)
    assert torch.isfinite(logits).all()

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write add(a, b)."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    runs = [model.generate(**prompt, max_new_tokens=5, do_sample=False, min_new_tokens=5) for _ in range(2)]
    prompt_len = prompt["input_ids"].shape[1]
    assert runs[0].shape == (1, prompt_len + 5)
    assert torch.equal(runs[0], runs[1])  # greedy is deterministic
    assert int(runs[0][:, prompt_len:].max()) < tiny_checkpoint.vocab_size


# ---------------------------------------------------------------- chat template


def test_chat_template_renders_chatml(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix\tit"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nFix\tit<|im_end|>\n<|im_start|>assistant\n"
    )
    closed = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert closed == rendered.removesuffix("<|im_start|>assistant\n")
    ids = tok(rendered)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids(IM_START)) == 3  # markers are single special tokens
    assert ids.count(tok.convert_tokens_to_ids(IM_END)) == 2
    assert tok.decode(ids) == rendered


# ---------------------------------------------------------------- exact round trip and offsets


def _assert_exact_spans(tokenizer, text: str) -> None:
    """Spans tile the text: runs of tokens sharing one span (bytes of one character) decode to that span."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids, spans = enc["input_ids"], enc["offset_mapping"]
    assert tokenizer.decode(ids) == text
    groups: list[tuple[tuple[int, int], list[int]]] = []
    for token_id, span in zip(ids, spans, strict=True):
        if groups and groups[-1][0] == span:
            groups[-1][1].append(token_id)
        else:
            groups.append((span, [token_id]))
    cursor = 0
    for (start, end), group in groups:
        assert start == cursor and end > start, (
            f"span {(start, end)} does not continue at {cursor} in {text!r}"
        )
        assert tokenizer.decode(group) == text[start:end]
        cursor = end
    assert cursor == len(text)


code_text = st.text(
    alphabet=st.sampled_from(
        list("abcXYZ_019 \t\n\r():=+-*/#'\"\\{}[].,<>|") + ["é", "日", "😀", "\u0301", "ß"]
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=60), code_text))
@example("def f(x):\n\treturn x  \n\n\n")
@example("a\r\nb\r\n\r\n  \t ")
@example("x = 'naïve 日本 😀'\n")
@example("<|im_end|> is text here")
def test_round_trip_and_offsets_are_exact(tok, text):
    nfc = unicodedata.normalize("NFC", text)
    _assert_exact_spans(tok, nfc)
    # Like Qwen2.5, input is NFC-normalized: other text decodes to its NFC form, spans stay in bounds and ordered.
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    assert tok.decode(enc["input_ids"]) == nfc
    spans = enc["offset_mapping"]
    assert all(0 <= s < e <= len(text) for s, e in spans)
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(spans, spans[1:], strict=False))


def test_no_token_straddles_a_character(tok):
    """Every vocabulary entry is whole characters or bytes inside one character (never parts of two)."""
    byte_of = {spelling: byte for byte, spelling in bytes_to_unicode().items()}
    partial = 0
    for token, token_id in tok.get_vocab().items():
        if token_id in tok.all_special_ids:
            continue
        raw = bytes(byte_of[ch] for ch in token)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            partial += 1  # then: a lead or continuation byte, followed by continuation bytes only
            assert raw[0] >= 0x80 and all(0x80 <= b < 0xC0 for b in raw[1:]) and len(raw) < 4, token
    assert partial >= 128  # the byte alphabet itself has 128 non-ASCII single bytes


# ---------------------------------------------------------------- determinism and building


def test_same_seed_and_corpus_give_identical_files(tmp_path, tiny_checkpoint, policy_corpus):
    again = build_checkpoint(tmp_path / "again", corpus=policy_corpus, seed=0)
    other_seed = build_checkpoint(tmp_path / "seed1", corpus=policy_corpus, seed=1)
    for name in tiny_checkpoint.files:
        assert (again.path / name).read_bytes() == (tiny_checkpoint.path / name).read_bytes(), name
    assert (other_seed.path / "tokenizer.json").read_bytes() == (
        tiny_checkpoint.path / "tokenizer.json"
    ).read_bytes()
    assert (other_seed.path / "model.safetensors").read_bytes() != (
        tiny_checkpoint.path / "model.safetensors"
    ).read_bytes()


def test_build_refuses_to_overwrite(tmp_path, policy_corpus):
    out = tmp_path / "ck"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        build_checkpoint(out, corpus=policy_corpus[:3])
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="tiny, small"):
        build_checkpoint(tmp_path / "x", size="huge", corpus=policy_corpus[:3])
    info = build_checkpoint(out, corpus=policy_corpus[:3], overwrite=True)
    assert not (out / "keep.txt").exists() and check_checkpoint(info.path) == out
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no staging folder left behind


def test_ensure_checkpoint(tmp_path, tiny_checkpoint, policy_corpus):
    before = (tiny_checkpoint.path / "model.safetensors").stat().st_mtime_ns
    assert ensure_checkpoint(tiny_checkpoint.path, size="small") == tiny_checkpoint.path  # used as is
    assert (tiny_checkpoint.path / "model.safetensors").stat().st_mtime_ns == before
    built = ensure_checkpoint(tmp_path / "new", corpus=policy_corpus[:3])
    assert check_checkpoint(built) == tmp_path / "new"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        ensure_checkpoint(broken, corpus=policy_corpus[:3])


# ---------------------------------------------------------------- bad paths


@pytest.mark.parametrize(
    "missing", ["config.json", "model.safetensors", "tokenizer_config.json", "tokenizer.json"]
)
def test_incomplete_checkpoint_names_the_missing_file(tmp_path, tiny_checkpoint, missing):
    partial = tmp_path / "partial"
    shutil.copytree(tiny_checkpoint.path, partial)
    (partial / missing).unlink()
    with pytest.raises(CheckpointError, match=missing.replace(".", r"\.")):
        check_checkpoint(partial)
    loader = load_tokenizer if missing.startswith("tokenizer") else load_policy
    with pytest.raises(CheckpointError, match=str(partial)):
        loader(partial)


def test_non_directories_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_policy("Qwen/Qwen2.5-Coder-7B-Instruct")  # a hub id is not a local directory
    a_file = tmp_path / "model.safetensors"
    a_file.write_text("")
    with pytest.raises(CheckpointError, match="not a directory"):
        load_tokenizer(a_file)


# ---------------------------------------------------------------- corpus


def _task() -> Task:
    return Task(
        task_id="demo/1",
        source="demo",
        split="train",
        instructions="Implement add.",
        workspace={"solution.py": "def add(a, b):\n    pass\n"},
        visible_tests=TestSuite(kind="pytest", files={"test_v.py": "assert add(1, 2) == 3\n"}),
        hidden_tests=TestSuite(kind="pytest", files={"test_h.py": "assert add(2, 2) == 4\n"}),
        reference={"solution.py": "def add(a, b):\n    return a + b\n"},
    )


def test_task_texts_and_default_corpus(monkeypatch):
    expected = [
        "Implement add.",
        "def add(a, b):\n    pass\n",
        "def add(a, b):\n    return a + b\n",
        "assert add(1, 2) == 3\n",
        "assert add(2, 2) == 4\n",
    ]
    assert list(task_texts(_task())) == expected
    import pipeline.tasks

    monkeypatch.setattr(pipeline.tasks, "load_bundled", lambda: [_task(), _task()])
    scaffold = list(tiny.scaffold_texts())
    assert scaffold == list(ACTION_SPECS.values())
    # each distinct task text once, in loading order; then the prompt scaffold once per task
    assert list(tiny.default_corpus()) == expected + scaffold + scaffold


# ---------------------------------------------------------------- settings


def test_policy_settings_defaults_and_refusals():
    s = PolicySettings()
    assert (s.size, s.dtype, s.backend, s.greedy) == ("tiny", "float32", "transformers", False)
    assert PolicySettings(temperature=0).greedy
    with pytest.raises(ValidationError):
        s.seed = 3  # frozen
    bad = {
        "temperature": -0.1,
        "top_p": 0.0,
        "max_new_tokens": 0,
        "dtype": "float16",
        "backend": "tgi",
        "size": "huge",
        "device": "tpu",
        "seed": -1,
        "checkpoint": "",
        "unknown_key": 1,
    }
    for key, value in bad.items():
        with pytest.raises(ValidationError) as err:
            PolicySettings(**{key: value})
        assert key in str(err.value)
    assert "tiny, small" in _error(size="huge") and "(0, 1]" not in _error(top_p=2.0)
    assert "less than or equal to 1" in _error(top_p=2.0)
    assert "'float32' or 'bfloat16'" in _error(dtype="fp8")


def _error(**kwargs) -> str:
    with pytest.raises(ValidationError) as err:
        PolicySettings(**kwargs)
    return str(err.value)


# ---------------------------------------------------------------- CLI


def test_cli_init_and_info(tmp_path, monkeypatch, policy_corpus):
    monkeypatch.setattr(tiny, "default_corpus", lambda: iter(policy_corpus))
    runner = CliRunner()
    out = tmp_path / "cli"
    result = runner.invoke(app, ["model", "init", "--out", str(out), "--size", "tiny", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "parameters:" in result.output and "model.safetensors" in result.output
    assert f"{IM_END}=2" in result.output
    assert check_checkpoint(out) == out

    info = runner.invoke(app, ["model", "info", str(out)])
    assert info.exit_code == 0, info.output
    assert f"{checkpoint_parameters(out):,}" in info.output and "Qwen2ForCausalLM" in info.output

    again = runner.invoke(app, ["model", "init", "--out", str(out)])
    assert again.exit_code == 2 and "not empty" in again.output
    assert runner.invoke(app, ["model", "init", "--out", str(tmp_path / "y"), "--size", "huge"]).exit_code == 2
    missing = runner.invoke(app, ["model", "info", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
