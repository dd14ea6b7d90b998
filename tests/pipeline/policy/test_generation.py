"""Generation layer: exact token spans, sampling math, the KV-cached loop, the vLLM output conversion."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers.convert_slow_tokenizer import bytes_to_unicode

from pipeline.policy.generation import (
    GenerationRequest,
    GenerationResult,
    TransformersGenerator,
    _byte_level_spans,
    _prefix_spans,
    build_result,
    check_request,
    choose_tokens,
    decode_with_spans,
    result_from_vllm,
    sampling_logprobs,
    stop_token_ids,
    vllm_sampling_kwargs,
)
from pipeline.policy.settings import PolicySettings
from pipeline.policy.tiny import ENDOFTEXT, IM_END, IM_START, SPECIAL_TOKENS

torch.set_num_threads(1)

BYTE_SYMBOL = bytes_to_unicode()  # byte -> the character that spells it in a byte-level vocabulary


@pytest.fixture(scope="module")
def prompts(tok):
    """Chat prompts of different lengths (so batches need padding)."""
    texts = ["Fix the bug.", "Write add(a, b) returning a + b.", "héllo wörld 日本語 😀", "x" * 40]
    return [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)["input_ids"]
        for t in texts
    ]


def policy(tiny_checkpoint, **overrides) -> PolicySettings:
    return PolicySettings(checkpoint=str(tiny_checkpoint.path), **overrides)


def assert_spans_tile(text: str, starts: list[int], ends: list[int]) -> None:
    assert len(starts) == len(ends)
    if not starts:
        assert text == ""
        return
    assert starts[0] == 0 and ends[-1] == len(text)
    assert all(s <= e for s, e in zip(starts, ends, strict=True))
    assert all(starts[i + 1] == ends[i] for i in range(len(starts) - 1))
    assert "".join(text[s:e] for s, e in zip(starts, ends, strict=True)) == text


def assert_well_formed(result: GenerationResult, tok, max_new_tokens: int) -> None:
    n = len(result.response_token_ids)
    assert 1 <= n <= max_new_tokens
    assert_spans_tile(result.response_text, result.token_char_starts, result.token_char_ends)
    assert len(result.behavior_logprobs) == n
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in result.behavior_logprobs)
    stopped = result.response_token_ids[-1] in {tok.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT)}
    assert result.truncated == (not stopped)
    assert stopped or n == max_new_tokens  # nothing but a stop token or the budget ends a response


# ---- exact spans ----------------------------------------------------------------------------------------


def spell(tok, items: list[str], split: list[bool]) -> tuple[list[int], list[int], list[int], str]:
    """Token ids for `items` (single characters or special tokens) with the spans they must get.

    A character is one whole-character token when the vocabulary has one and `split` is False, else one
    token per UTF-8 byte; only its last token covers it (earlier byte tokens cover nothing).
    """
    vocab = tok.get_vocab()
    ids, starts, ends, text = [], [], [], ""
    for item, cut in zip(items, split, strict=True):
        if item in SPECIAL_TOKENS:
            group = [vocab[item]]
        else:
            raw = item.encode("utf-8")
            whole = vocab.get("".join(BYTE_SYMBOL[b] for b in raw))
            group = [whole] if whole is not None and not cut else [vocab[BYTE_SYMBOL[b]] for b in raw]
        for j, token in enumerate(group):
            ids.append(token)
            starts.append(len(text))
            if j == len(group) - 1:
                text += item
            ends.append(len(text))
    return ids, starts, ends, text


_items = st.lists(st.one_of(st.characters(codec="utf-8"), st.sampled_from(SPECIAL_TOKENS)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(items=_items, data=st.data())
@example(items=["a", "日", "😀", "\ufffd", "é"], data=None)
def test_each_character_belongs_to_the_token_that_completes_it(tok, items, data):
    split = (
        [True] * len(items)
        if data is None
        else data.draw(st.lists(st.booleans(), min_size=len(items), max_size=len(items)))
    )
    ids, starts, ends, text = spell(tok, items, split)
    assert decode_with_spans(tok, ids) == (text, starts, ends)
    assert tok.decode(ids, skip_special_tokens=False) == text
    if "\ufffd" not in text:  # the prefix fallback's documented exception: literal U+FFFD characters
        assert _prefix_spans(tok, ids) == (text, starts, ends)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_spans_tile_the_decoded_text_for_any_id_sequence(tok, data):
    """Random ids include byte tokens that form invalid UTF-8 (decoded as U+FFFD) and special tokens."""
    ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=60))
    # The O(n) byte-level path agrees with the tokenizer's own decoding even on invalid UTF-8 (no fallback).
    assert _byte_level_spans(tok, ids) is not None
    for spans in (decode_with_spans(tok, ids), _prefix_spans(tok, ids)):
        assert spans.text == tok.decode(ids, skip_special_tokens=False)
        assert len(spans.starts) == len(ids)
        assert_spans_tile(*spans)


def test_invalid_and_unfinished_bytes_go_to_the_token_that_ends_them(tok):
    byte = {b: tok.get_vocab()[BYTE_SYMBOL[b]] for b in range(256)}
    a = byte[ord("A")]
    # e4 bd is an unfinished 3-byte character: the replacement character appears when 'A' proves it invalid.
    assert decode_with_spans(tok, [byte[0xE4], byte[0xBD], a]) == ("\ufffdA", [0, 0, 0], [0, 0, 2])
    # Unfinished at the very end: the final token flushes it.
    assert decode_with_spans(tok, [a, byte[0xE4]]) == ("A\ufffd", [0, 1], [1, 2])
    # A byte that can never start a character is replaced at once.
    assert decode_with_spans(tok, [byte[0xFF], a]) == ("\ufffdA", [0, 1], [1, 2])


def test_ids_the_tokenizer_does_not_know_decode_to_nothing(tok):
    a = tok.get_vocab()["A"]
    assert decode_with_spans(tok, [a, len(tok) + 7, a]) == ("AA", [0, 1, 1], [1, 1, 2])


def test_final_stop_token_keeps_its_id_but_adds_no_text(tok):
    vocab = tok.get_vocab()
    ids = [vocab["A"], vocab[IM_START], vocab["B"], vocab[IM_END]]
    stop = frozenset({vocab[IM_END], vocab[ENDOFTEXT]})
    request = GenerationRequest("k", [vocab["A"]], seed=1)
    result = build_result(request, ids, [-0.5, -1.0, -1.5, -2.0], False, tok, stop)
    assert result.response_text == f"A{IM_START}B"  # special tokens inside the response stay visible
    assert result.token_char_starts == [0, 1, 1 + len(IM_START), 2 + len(IM_START)]
    assert result.token_char_ends == [1, 1 + len(IM_START), 2 + len(IM_START), 2 + len(IM_START)]
    # Without a final stop token every token's text is kept.
    cut = build_result(request, ids[:3], [-0.5, -1.0, -1.5], True, tok, stop)
    assert cut.response_text == result.response_text and cut.truncated
    with pytest.raises(ValueError, match="'k'.*3 tokens but 2 log-probs"):
        build_result(request, ids[:3], [-0.5, -1.0], True, tok, stop)


def test_stop_token_ids_come_from_generation_config_and_tokenizer(tok, model):
    vocab = tok.get_vocab()
    assert stop_token_ids(model.generation_config, tok) == {vocab[IM_END], vocab[ENDOFTEXT]}
    assert stop_token_ids(None, tok) == {vocab[IM_END]}


# ---- requests -------------------------------------------------------------------------------------------


def test_bad_requests_are_refused_with_their_key():
    with pytest.raises(ValueError, match="'r1'.*prompt_token_ids is empty"):
        GenerationRequest("r1", [], seed=0)
    with pytest.raises(ValueError, match="'r2'.*seed -1"):
        GenerationRequest("r2", [1], seed=-1)
    with pytest.raises(ValueError, match="'r3'.*seed"):
        GenerationRequest("r3", [1], seed=2**63)
    with pytest.raises(ValueError, match="'r5'.*must be integers"):
        GenerationRequest("r5", [1.5], seed=0)
    with pytest.raises(ValueError, match="'r6'.*must be integers"):
        GenerationRequest("r6", [1], seed="7")
    with pytest.raises(ValueError, match="non-empty string"):
        GenerationRequest("", [1], seed=0)
    request = GenerationRequest("r4", [5, 999, 3], seed=0)
    with pytest.raises(ValueError, match=r"'r4'.*\[999\].*\[0, 100\)"):
        check_request(request, vocab_size=100)
    with pytest.raises(ValueError, match="'r4'.*3 tokens.*context of 3"):
        check_request(request, vocab_size=1000, context_length=3)
    check_request(request, vocab_size=1000, context_length=4)


def test_request_normalises_integer_types():
    import numpy as np

    request = GenerationRequest("k", np.array([3, 4], dtype=np.int32), seed=np.int64(7))
    assert request.prompt_token_ids == [3, 4] and type(request.prompt_token_ids[0]) is int
    assert request.seed == 7 and type(request.seed) is int


# ---- sampling math --------------------------------------------------------------------------------------


def test_sampling_logprobs_temperature_and_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log() + 3.0  # a shift changes nothing
    assert torch.allclose(sampling_logprobs(logits, 1.0, 1.0), probs.log())
    assert torch.allclose(sampling_logprobs(logits, 2.0, 1.0), torch.log_softmax(logits / 2.0, -1))
    # top_p 0.8: 0.5 + 0.3 reaches it, the rest is cut, the nucleus renormalised.
    nucleus = sampling_logprobs(logits, 1.0, 0.8).exp()
    assert torch.allclose(nucleus, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(
        sampling_logprobs(logits, 1.0, 0.81).exp(), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95
    )
    # The top token always stays, however small top_p.
    assert torch.allclose(sampling_logprobs(logits, 1.0, 0.01).exp(), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    # Greedy reports the raw distribution, whatever top_p.
    assert torch.allclose(sampling_logprobs(logits, 0.0, 0.5), probs.log())


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31), temperature=st.floats(0.1, 3.0), top_p=st.floats(0.05, 1.0))
def test_nucleus_is_the_smallest_top_set_reaching_top_p(seed, temperature, top_p):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(seed)) * 3
    logp = sampling_logprobs(logits, temperature, top_p)
    full = torch.softmax(logits / temperature, -1)
    for row in range(3):
        kept = torch.isfinite(logp[row])
        assert torch.allclose(logp[row].exp().sum(), torch.tensor(1.0), atol=1e-5)
        order = full[row].argsort(descending=True, stable=True)
        k = int(kept.sum())
        assert kept[order[:k]].all()  # kept tokens are the k most likely
        assert full[row][order[: k - 1]].sum() < top_p + 1e-5  # without the k-th token the mass falls short
        assert k == 50 or full[row][order[:k]].sum() >= top_p - 1e-5


def test_each_row_draws_only_from_its_own_generator():
    logp = torch.log_softmax(torch.randn(4, 30, generator=torch.Generator().manual_seed(0)), -1)
    batch = choose_tokens(logp, [torch.Generator().manual_seed(s) for s in (1, 2, 3, 4)], greedy=False)
    for row, s in enumerate((1, 2, 3, 4)):
        alone = choose_tokens(logp[row : row + 1], [torch.Generator().manual_seed(s)], greedy=False)
        assert alone.tolist() == [batch[row].item()]
    assert choose_tokens(logp, [], greedy=True).tolist() == logp.argmax(-1).tolist()


# ---- the transformers loop ------------------------------------------------------------------------------


def requests_for(prompts, seeds) -> list[GenerationRequest]:
    return [
        GenerationRequest(f"r{i}", p, seed=s) for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
    ]


def test_greedy_matches_transformers_generate(tiny_checkpoint, tok, model, prompts):
    settings_ = policy(tiny_checkpoint, temperature=0.0, max_new_tokens=12)
    ours = TransformersGenerator(model, tok, settings_).generate(requests_for(prompts[:2], [5, 6]))
    for result, prompt in zip(ours, prompts[:2], strict=True):
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=12,
            output_logits=True,
            return_dict_in_generate=True,
        )
        expected = out.sequences[0, len(prompt) :].tolist()
        assert result.response_token_ids == expected
        raw = torch.log_softmax(torch.cat(out.logits).float(), -1)
        assert torch.allclose(
            torch.tensor(result.behavior_logprobs), raw[range(len(expected)), expected], atol=1e-5
        )
        assert_well_formed(result, tok, 12)


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_logprobs_are_those_of_the_sampling_distribution(
    tiny_checkpoint, tok, model, prompts, batch_invariant
):
    """Teacher-forced recomputation on each unpadded sequence alone: padded batches leak nothing."""
    settings_ = policy(tiny_checkpoint, temperature=0.7, top_p=0.95, max_new_tokens=10)
    gen = TransformersGenerator(model, tok, settings_, batch_invariant=batch_invariant)
    results = gen.generate(requests_for(prompts, [11, 12, 13, 14]))
    assert [r.key for r in results] == ["r0", "r1", "r2", "r3"]
    for result, prompt in zip(results, prompts, strict=True):
        assert result.prompt_token_ids == prompt
        assert_well_formed(result, tok, 10)
        ids = torch.tensor([prompt + result.response_token_ids])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        got = torch.tensor(result.behavior_logprobs)
        # The cached decode and this full forward pass differ in the last float32 bits, so a token whose
        # cumulative mass sits within a hair of top_p may be inside one nucleus and outside the other; that
        # shifts the renormaliser by the token's own (tiny) probability. Either membership is exact.
        at = range(len(result.response_token_ids)), result.response_token_ids
        candidates = [sampling_logprobs(logits, 0.7, top_p)[at] for top_p in (0.95, 0.95 - 1e-5, 0.95 + 1e-5)]
        close = torch.stack([(got - c).abs() <= 1e-5 for c in candidates]).any(dim=0)
        assert close.all(), (got, candidates[0])


def test_results_do_not_depend_on_the_rest_of_the_batch(tiny_checkpoint, tok, model, prompts):
    gen = TransformersGenerator(model, tok, policy(tiny_checkpoint, temperature=1.0, max_new_tokens=12))
    requests = requests_for(prompts, [21, 22, 23, 24])
    together = gen.generate(requests)
    alone = [gen.generate([r])[0] for r in requests]
    shuffled = gen.generate([requests[2], requests[0], requests[3]])
    assert together == alone
    assert shuffled == [together[2], together[0], together[3]]
    # The seed is what decides: the same prompt with another seed samples something else.
    reseeded = gen.generate([replace(requests[0], seed=99)])[0]
    assert reseeded.response_token_ids != together[0].response_token_ids


def test_stops_after_the_first_stop_token(tiny_checkpoint, tok, model, prompts):
    settings_ = policy(tiny_checkpoint, temperature=0.0, max_new_tokens=10)
    request = GenerationRequest("k", prompts[1], seed=0)
    free = TransformersGenerator(model, tok, settings_).generate([request])[0]
    assert_well_formed(free, tok, 10)
    stop_at = len(free.response_token_ids) // 2
    stopper = free.response_token_ids[stop_at]
    first = free.response_token_ids.index(stopper)  # generation stops at the token's first occurrence
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, stopper]
    try:
        stopped = TransformersGenerator(model, tok, settings_).generate([request])[0]
    finally:
        model.generation_config.eos_token_id = saved
    assert stopped.response_token_ids == free.response_token_ids[: first + 1]
    assert stopped.behavior_logprobs == free.behavior_logprobs[: first + 1]
    assert not stopped.truncated
    assert stopped.response_text == tok.decode(free.response_token_ids[:first], skip_special_tokens=False)
    assert stopped.token_char_starts[-1] == stopped.token_char_ends[-1] == len(stopped.response_text)


def test_budget_is_cut_to_the_model_context(tiny_checkpoint, tok, model, prompts):
    settings_ = policy(tiny_checkpoint, temperature=1.0, max_new_tokens=50)
    saved = model.config.max_position_embeddings
    model.config.max_position_embeddings = len(prompts[0]) + 3
    try:
        gen = TransformersGenerator(model, tok, settings_)
        result = gen.generate([GenerationRequest("short", prompts[0], seed=1)])[0]
        with pytest.raises(ValueError, match="'long'.*no room"):
            gen.generate([GenerationRequest("long", prompts[3], seed=1)])
    finally:
        model.config.max_position_embeddings = saved
    assert_well_formed(result, tok, 3)  # at most 3 new tokens, although max_new_tokens is 50


def test_empty_request_list(tiny_checkpoint, tok, model):
    assert (
        TransformersGenerator(model, tok, policy(tiny_checkpoint), batch_invariant=False).generate([]) == []
    )


# ---- vLLM output conversion (fake engine *outputs*, real conversion code) -------------------------------


@dataclass
class FakeLogprob:  # vllm.sequence.Logprob's fields
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FakeCompletion:  # vllm.outputs.CompletionOutput's fields we read
    token_ids: list[int]
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str | None
    index: int = 0
    text: str = ""


@dataclass
class FakeRequestOutput:  # vllm.outputs.RequestOutput's fields we read
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[FakeCompletion]


def fake_output(prompt, ids, logprobs, finish_reason):
    per_position = [
        {t: FakeLogprob(lp, rank=1), t + 1: FakeLogprob(-9.0, rank=2)}
        for t, lp in zip(ids, logprobs, strict=True)
    ]
    return FakeRequestOutput("0", list(prompt), [FakeCompletion(list(ids), per_position, finish_reason)])


def test_vllm_output_becomes_a_result(tok):
    vocab = tok.get_vocab()
    stop = frozenset({vocab[IM_END], vocab[ENDOFTEXT]})
    request = GenerationRequest("v1", [vocab["A"], vocab["B"]], seed=3)
    ids = tok("héllo wörld", add_special_tokens=False)["input_ids"] + [vocab[IM_END]]
    lps = [-0.1 * (i + 1) for i in range(len(ids))]
    result = result_from_vllm(request, fake_output(request.prompt_token_ids, ids, lps, "stop"), tok, stop)
    assert result == build_result(request, ids, lps, False, tok, stop)
    assert result.response_text == "héllo wörld" and not result.truncated
    assert result.behavior_logprobs == pytest.approx(lps)
    cut = result_from_vllm(
        request, fake_output(request.prompt_token_ids, ids[:-1], lps[:-1], "length"), tok, stop
    )
    assert cut.truncated and cut.response_text == "héllo wörld"


def test_vllm_output_problems_name_the_request(tok):
    request = GenerationRequest("v2", [5, 6], seed=0)
    stop = frozenset({tok.eos_token_id})
    good = fake_output([5, 6], [7, 8], [-1.0, -2.0], "length")
    with pytest.raises(ValueError, match="'v2'.*prompt token ids differ"):
        result_from_vllm(request, replace(good, prompt_token_ids=[5]), tok, stop)
    with pytest.raises(ValueError, match="'v2'.*did not finish.*abort"):
        result_from_vllm(
            request, replace(good, outputs=[replace(good.outputs[0], finish_reason="abort")]), tok, stop
        )
    with pytest.raises(ValueError, match="'v2'.*no log-probs"):
        result_from_vllm(request, replace(good, outputs=[replace(good.outputs[0], logprobs=None)]), tok, stop)
    missing = replace(good.outputs[0], logprobs=[good.outputs[0].logprobs[0], {99: FakeLogprob(-0.5)}])
    with pytest.raises(ValueError, match="'v2'.*position 1.*sampled token 8"):
        result_from_vllm(request, replace(good, outputs=[missing]), tok, stop)
    with pytest.raises(ValueError, match="'v2'.*no completion"):
        result_from_vllm(request, replace(good, outputs=[]), tok, stop)


def test_vllm_sampling_kwargs_follow_settings(tiny_checkpoint):
    kwargs = vllm_sampling_kwargs(
        policy(tiny_checkpoint, temperature=0.7, top_p=0.9, max_new_tokens=33), 42, {2, 0}
    )
    assert kwargs == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 33,
        "seed": 42,
        "stop_token_ids": [0, 2],
        "logprobs": 1,
        "detokenize": False,
    }
    assert vllm_sampling_kwargs(policy(tiny_checkpoint, temperature=0.0, top_p=0.5), 1, {2})["top_p"] == 1.0
