"""Policy generation without Beam: token-id prompts in, exactly attributed responses out.

What one request goes through (both backends):

1. Validate the request (non-empty prompt, ids inside the vocabulary, a seed that fits int64).
2. Sample up to `max_new_tokens` tokens, stopping right after the first stop token (the generation config's
   eos ids plus the tokenizer's eos). The request's own `seed` drives its sampling.
3. Record each sampled token's behaviour log-prob under the distribution it was actually drawn from:
   softmax(logits / temperature) restricted to the top-p nucleus and renormalised. Greedy decoding
   (temperature 0) draws from nothing, so it records the raw distribution log_softmax(logits).
4. Decode the response and give every token its exact character span in the text (`decode_with_spans`).
   The final stop token stays in `response_token_ids` (the policy must learn to stop) but its text is left
   out of `response_text`, so the action parser never sees `<|im_end|>`; it gets the empty span at the end.

Batch-composition independence (the same (prompt, seed) gives the same result whatever else is batched with
it) matters because Beam's batching varies between reruns. Per-request torch.Generators make the *random
draws* independent of the batch, but the *logits* are not: measured on CPU (fp32, one thread), one request's
logits differ by up to 4e-7 between batch sizes 1 and 8 (BLAS picks gemv vs gemm kernels, padding changes
attention reductions). A draw flips only when it lands within that distance of a CDF boundary (no flip in
64 sequences x 64 tokens measured), which is rare but not never. `TransformersGenerator` therefore runs each
request on its own by default (`batch_invariant=True`: exact by construction, on the same hardware and
torch thread count); `batch_invariant=False` runs one left-padded batch and is deterministic for a fixed
batch composition only. Measured on the tiny model, one thread, 8 requests x 64 new tokens: about 610
tokens/s per request vs 2,700 tokens/s batched.
"""

from __future__ import annotations

import codecs
import functools
import math
import operator
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # torch/transformers stay out of imports that only need the dataclasses
    import torch
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

    from pipeline.policy.settings import PolicySettings

_MAX_SEED = 2**63  # seeds are stored as int64 (trajectories.seed) and fed to torch/vLLM generators
_REPLACEMENT = "\ufffd"  # what a decoder prints for bytes that are not (yet) a whole UTF-8 character


# ---- requests and results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete."""

    key: str  # caller's id of the request (e.g. the step's row id); copied to the result
    prompt_token_ids: list[int]  # the rendered prompt, already tokenized (chat template applied)
    seed: int  # seed of this request's sampling, in [0, 2**63); same (prompt, seed) -> same response

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"generation request key must be a non-empty string, got {self.key!r}")
        try:  # Python and numpy integers pass; floats and strings are refused
            ids = [operator.index(t) for t in self.prompt_token_ids]
            seed = operator.index(self.seed)
        except TypeError as e:
            raise ValueError(
                f"generation request {self.key!r}: prompt ids and seed must be integers ({e})"
            ) from e
        if not ids:
            raise ValueError(f"generation request {self.key!r}: prompt_token_ids is empty")
        if isinstance(self.seed, bool) or not 0 <= seed < _MAX_SEED:
            raise ValueError(
                f"generation request {self.key!r}: seed {self.seed!r} is not an int in [0, 2**63)"
            )
        object.__setattr__(self, "prompt_token_ids", ids)
        object.__setattr__(self, "seed", seed)


@dataclass(frozen=True)
class GenerationResult:
    """One sampled response, every per-token list aligned with `response_token_ids`."""

    key: str  # the request's key
    prompt_token_ids: list[int]  # the request's prompt, unchanged
    response_token_ids: list[int]  # sampled ids, no padding; ends with the stop token unless truncated
    response_text: str  # decode of the response ids (special tokens kept) minus a final stop token's text
    token_char_starts: list[int]  # per token: start of its character span in response_text
    token_char_ends: list[int]  # per token: end (exclusive); start == end for a token covering no characters
    behavior_logprobs: list[float]  # per token: log-prob under the sampling distribution actually used (<= 0)
    truncated: bool  # max_new_tokens (or the context length) was reached without a stop token

    def __post_init__(self) -> None:
        n = len(self.response_token_ids)
        lengths = (len(self.token_char_starts), len(self.token_char_ends), len(self.behavior_logprobs))
        if lengths != (n, n, n):
            raise ValueError(
                f"generation result {self.key!r}: {n} response tokens but (starts, ends, logprobs) "
                f"have lengths {lengths}"
            )


def check_request(request: GenerationRequest, vocab_size: int, context_length: int | None = None) -> None:
    """Refuse a prompt the model cannot read, naming the request: ids outside [0, vocab_size), or a prompt
    that leaves no room for one new token inside `context_length` (None: no limit)."""
    bad = [t for t in request.prompt_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"generation request {request.key!r}: prompt token ids {bad[:5]} are outside the vocabulary "
            f"[0, {vocab_size})"
        )
    if context_length is not None and len(request.prompt_token_ids) >= context_length:
        raise ValueError(
            f"generation request {request.key!r}: prompt of {len(request.prompt_token_ids)} tokens leaves no "
            f"room to generate in the model's context of {context_length} tokens"
        )


def stop_token_ids(
    generation_config: GenerationConfig | None, tokenizer: PreTrainedTokenizerBase
) -> frozenset[int]:
    """Ids that end a response: the generation config's eos id(s) and the tokenizer's eos token."""
    ids: set[int] = set()
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is not None:
        ids.update([eos] if isinstance(eos, int) else eos)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise ValueError(
            "the policy has no eos token (neither its generation config nor its tokenizer names one): "
            "responses could only end at max_new_tokens"
        )
    return frozenset(int(i) for i in ids)


# ---- exact character spans of tokens ------------------------------------------------------------------


class TokenSpans(NamedTuple):
    """Decoded text and, per token, its half-open character span [start, end) in that text.

    The spans tile the text: starts[0] == 0, starts[i + 1] == ends[i], ends[-1] == len(text). A character
    whose UTF-8 bytes are split over several tokens belongs to the token that completes it; the earlier
    tokens get empty spans.
    """

    text: str
    starts: list[int]
    ends: list[int]


def _decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    # No "clean up" of spaces: it would make the text differ from the concatenation of the tokens.
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


@functools.cache
def _byte_of_symbol() -> dict[str, int]:
    """Byte-level BPE alphabet: printable stand-in character -> the byte it spells (GPT-2's table)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {symbol: byte for byte, symbol in bytes_to_unicode().items()}


def _token_bytes(token: str | None, table: dict[str, int]) -> bytes:
    if token is None:  # an id the tokenizer does not know (padding rows of the embedding): decodes to nothing
        return b""
    try:
        return bytes(table[c] for c in token)
    except KeyError:  # an added token outside the byte alphabet is decoded as its own text
        return token.encode("utf-8")


def _byte_level_spans(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> TokenSpans | None:
    """O(n) spans for byte-level BPE: feed each token's bytes to an incremental UTF-8 decoder, so each
    character is emitted by the token holding its last byte. None if the tokenizer is not byte-level or the
    result is not exactly `tokenizer.decode(ids)` (then the caller falls back to prefix decoding)."""
    from tokenizers import decoders

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    table = _byte_of_symbol()
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tokens = tokenizer.convert_ids_to_tokens(list(ids))
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    for i, token in enumerate(tokens):
        piece = utf8.decode(_token_bytes(token, table), final=i == len(tokens) - 1)
        starts.append(pos)
        pos += len(piece)
        ends.append(pos)
        pieces.append(piece)
    text = "".join(pieces)
    return TokenSpans(text, starts, ends) if text == _decode(tokenizer, ids) else None


def _prefix_spans(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> TokenSpans:
    """O(n^2) spans for any tokenizer: token i ends where decode(ids[:i+1]) stops agreeing with the full text.

    A prefix that ends inside a multi-byte character decodes to trailing U+FFFD; those are dropped before
    comparing, so the character goes to the token that completes it. (Cost of that rule: a literal U+FFFD
    character in the text is credited to the token after the one that wrote it. The byte-level path, used
    for Qwen2 and the tiny tokenizer, has no such exception.)
    """
    text = _decode(tokenizer, ids)
    ends: list[int] = []
    end = 0
    for i in range(1, len(ids)):
        prefix = _decode(tokenizer, ids[:i]).rstrip(_REPLACEMENT)
        end = max(end, len(os.path.commonprefix([prefix, text])))
        ends.append(end)
    if not ids:
        return TokenSpans(text, [], [])
    ends.append(len(text))
    return TokenSpans(text, [0, *ends[:-1]], ends)


def decode_with_spans(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> TokenSpans:
    """`tokenizer.decode(ids)` (special tokens kept) with each token's exact character span in it."""
    return _byte_level_spans(tokenizer, ids) or _prefix_spans(tokenizer, ids)


def build_result(
    request: GenerationRequest,
    response_token_ids: Sequence[int],
    behavior_logprobs: Sequence[float],
    truncated: bool,
    tokenizer: PreTrainedTokenizerBase,
    stop_ids: frozenset[int],
) -> GenerationResult:
    """Assemble a result from sampled ids and their log-probs: text, spans, and the stop-token rule
    (a final stop token keeps its id and log-prob but adds no text; its span is the empty one at the end)."""
    ids = [int(t) for t in response_token_ids]
    logprobs = [float(lp) for lp in behavior_logprobs]
    if len(logprobs) != len(ids):
        raise ValueError(
            f"generation result {request.key!r}: {len(ids)} tokens but {len(logprobs)} log-probs"
        )
    ends_with_stop = bool(ids) and ids[-1] in stop_ids
    spans = decode_with_spans(tokenizer, ids[:-1] if ends_with_stop else ids)
    starts, ends = spans.starts, spans.ends
    if ends_with_stop:
        starts, ends = [*starts, len(spans.text)], [*ends, len(spans.text)]
    return GenerationResult(
        key=request.key,
        prompt_token_ids=list(request.prompt_token_ids),
        response_token_ids=ids,
        response_text=spans.text,
        token_char_starts=starts,
        token_char_ends=ends,
        behavior_logprobs=logprobs,
        truncated=truncated,
    )


# ---- sampling math --------------------------------------------------------------------------------------


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs of the distribution the next token is drawn from.

    logits: [B, V] raw next-token logits (any float dtype). Returns [B, V] float32 log-probs:
    log_softmax(logits / temperature) with the tokens outside the top-p nucleus (the most likely tokens
    whose mass first reaches top_p; the top token always stays) set to -inf and the rest renormalised.
    temperature == 0 (greedy): log_softmax(logits), the raw distribution; top_p does not apply.
    """
    import torch

    logits = logits.float()
    if temperature == 0.0:
        return torch.log_softmax(logits, dim=-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True, stable=True)
    sorted_p = sorted_logp.exp()
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # probability of the tokens ranked above each token
    outside_sorted = mass_before >= top_p
    outside = torch.zeros_like(outside_sorted).scatter(-1, order, outside_sorted)
    nucleus = logp.masked_fill(outside, -math.inf)
    return nucleus - torch.logsumexp(nucleus, dim=-1, keepdim=True)


def choose_tokens(
    logprobs: torch.Tensor, generators: Sequence[torch.Generator], greedy: bool
) -> torch.Tensor:
    """Next token per row: argmax when greedy, else one draw from exp(logprobs[i]) with generators[i].

    logprobs: [B, V] from `sampling_logprobs`. Returns [B] int64. Each row consumes randomness only from
    its own generator, so a row's draws do not depend on the other rows.
    """
    import torch

    if greedy:
        return logprobs.argmax(dim=-1)
    probs = logprobs.exp()
    return torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)])


# ---- transformers backend -------------------------------------------------------------------------------


class TransformersGenerator:
    """KV-cached sampling loop over a Hugging Face causal LM (`model(...)` forward calls, no `generate`),
    one torch.Generator per request.

    Each step feeds only the newest token with the cache of the earlier ones. In a padded batch, prompts
    are left-padded, the attention mask hides the padding and position ids count real tokens only, so a
    request sees the same positions as it would alone; padding never reaches a result.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        settings: PolicySettings,
        *,
        batch_invariant: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.batch_invariant = batch_invariant  # True: one request per forward pass (see module docstring)
        self.stop_ids = stop_token_ids(model.generation_config, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.context_length = getattr(model.config, "max_position_embeddings", None)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request; results in request order."""
        for request in requests:
            check_request(request, self.vocab_size, self.context_length)
        groups = [[r] for r in requests] if self.batch_invariant else [list(requests)] if requests else []
        return [result for group in groups for result in self._generate_batch(group)]

    def _budget(self, request: GenerationRequest) -> int:
        """New tokens allowed: max_new_tokens, cut to what is left of the model's context."""
        budget = self.settings.max_new_tokens
        if self.context_length is not None:
            budget = min(budget, self.context_length - len(request.prompt_token_ids))
        return budget

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        import torch

        device = self.model.device
        temperature, top_p = self.settings.temperature, self.settings.top_p
        greedy = temperature == 0.0
        width = max(len(r.prompt_token_ids) for r in requests)
        input_ids = torch.tensor(
            [[self.pad_id] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids for r in requests],
            device=device,
        )
        mask = torch.tensor(
            [[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids) for r in requests],
            device=device,
        )
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        generators = [torch.Generator(device=device).manual_seed(r.seed) for r in requests]
        budgets = [self._budget(r) for r in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        open_rows = set(range(len(requests)))
        cache = None
        with torch.inference_mode():
            while True:
                out = self.model(
                    input_ids=input_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                cache = out.past_key_values
                step_logp = sampling_logprobs(out.logits[:, -1, :], temperature, top_p)
                chosen = choose_tokens(step_logp, generators, greedy)
                chosen_logp = step_logp.gather(-1, chosen[:, None])[:, 0].tolist()
                for row, token in enumerate(chosen.tolist()):
                    if row not in open_rows:  # finished rows keep stepping with the batch; ignored
                        continue
                    tokens[row].append(token)
                    logprobs[row].append(chosen_logp[row])
                    if token in self.stop_ids or len(tokens[row]) >= budgets[row]:
                        open_rows.discard(row)
                if not open_rows:
                    break
                input_ids = chosen[:, None]
                mask = torch.cat([mask, torch.ones_like(input_ids)], dim=-1)
                positions = positions[:, -1:] + 1
        return [
            build_result(
                r,
                tokens[i],
                logprobs[i],
                not tokens[i] or tokens[i][-1] not in self.stop_ids,
                self.tokenizer,
                self.stop_ids,
            )
            for i, r in enumerate(requests)
        ]


# ---- vLLM backend ---------------------------------------------------------------------------------------


def vllm_sampling_kwargs(settings: PolicySettings, seed: int, stop_ids: Iterable[int]) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one request, matching `TransformersGenerator`:
    same temperature/top-p/max tokens, the request's own seed, stop on our stop ids, the sampled token's
    log-prob returned (the engine must run with logprobs_mode="processed_logprobs", see `VllmGenerator`),
    no detokenization (we decode ourselves, with spans)."""
    return {
        "n": 1,
        "temperature": settings.temperature,
        "top_p": 1.0 if settings.temperature == 0.0 else settings.top_p,
        "max_tokens": settings.max_new_tokens,
        "seed": seed,
        "stop_token_ids": sorted(stop_ids),
        "logprobs": 1,
        "detokenize": False,
    }


def result_from_vllm(
    request: GenerationRequest,
    output: Any,
    tokenizer: PreTrainedTokenizerBase,
    stop_ids: frozenset[int],
) -> GenerationResult:
    """Convert one `vllm.RequestOutput` (one completion) into a GenerationResult.

    Reads `output.prompt_token_ids` (checked against the request), `output.outputs[0].token_ids`,
    `.logprobs` (per position: {token id: Logprob(logprob=...)}) and `.finish_reason` ("stop"/"length").
    """
    where = f"vLLM output for request {request.key!r}"
    if output.prompt_token_ids is not None and list(output.prompt_token_ids) != request.prompt_token_ids:
        raise ValueError(f"{where}: its prompt token ids differ from the request's (outputs out of order?)")
    if not output.outputs:
        raise ValueError(f"{where}: no completion")
    completion = output.outputs[0]
    ids = [int(t) for t in completion.token_ids]
    if completion.finish_reason not in ("stop", "length"):
        raise ValueError(f"{where}: generation did not finish (finish_reason={completion.finish_reason!r})")
    if completion.logprobs is None:
        raise ValueError(f"{where}: no log-probs (SamplingParams.logprobs was not set)")
    if len(completion.logprobs) != len(ids):
        raise ValueError(f"{where}: {len(ids)} tokens but log-probs for {len(completion.logprobs)} positions")
    logprobs = []
    for position, (token, candidates) in enumerate(zip(ids, completion.logprobs, strict=True)):
        if token not in candidates:
            raise ValueError(f"{where}: position {position} has no log-prob for its sampled token {token}")
        logprobs.append(float(candidates[token].logprob))
    truncated = completion.finish_reason == "length" and not (ids and ids[-1] in stop_ids)
    return build_result(request, ids, logprobs, truncated, tokenizer, stop_ids)


class VllmGenerator:
    """The same `generate` as TransformersGenerator, on a `vllm.LLM` engine (GPU).

    The engine must be built with logprobs_mode="processed_logprobs" so that the returned log-probs are
    those of the temperature/top-p distribution, as in the transformers backend. vLLM gives each seeded
    request its own generator, but its logits depend on the batch like ours do; exact rerun determinism
    on GPU additionally needs vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1, where supported).
    """

    def __init__(
        self, llm: Any, tokenizer: PreTrainedTokenizerBase, settings: PolicySettings, stop_ids: frozenset[int]
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.settings = settings
        self.stop_ids = stop_ids
        self.vocab_size = len(tokenizer)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request in one engine call; results in request order."""
        from vllm import SamplingParams

        if not requests:
            return []
        for request in requests:
            check_request(request, self.vocab_size)
        params = [
            SamplingParams(**vllm_sampling_kwargs(self.settings, r.seed, self.stop_ids)) for r in requests
        ]
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise ValueError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
        return [
            result_from_vllm(r, o, self.tokenizer, self.stop_ids)
            for r, o in zip(requests, outputs, strict=True)
        ]


# ---- loading a generator ------------------------------------------------------------------------------


class BackendUnavailable(ImportError):
    """The selected generation backend's packages are not installed."""


def load_generator(
    settings: PolicySettings,
    *,
    batch_invariant: bool = True,
    engine_kwargs: dict[str, Any] | None = None,
) -> TransformersGenerator | VllmGenerator:
    """The generator of `settings.backend` for `settings.checkpoint`: the one object an episode calls, whether
    Beam's RunInference loads it (pipeline.policy.handlers) or a script does. No Beam here, so pretraining and
    SFT run where only torch and transformers are installed (a GPU box). `batch_invariant` (transformers:
    False generates a batch in one padded pass, faster and still deterministic for a fixed batch);
    `engine_kwargs` go to `vllm.LLM` (gpu_memory_utilization, tensor_parallel_size, max_model_len)."""
    from pipeline.policy.loading import check_checkpoint, load_policy, load_tokenizer

    if settings.backend == "transformers":
        model = load_policy(settings.checkpoint, dtype=settings.dtype, device=settings.device)
        return TransformersGenerator(model, load_tokenizer(settings.checkpoint), settings,
                                     batch_invariant=batch_invariant)
    try:
        import vllm
    except ImportError as e:
        raise BackendUnavailable(
            "vllm backend selected but the `gpu` extra is not installed "
            "(pip install 'didpo[gpu]' on a CUDA machine, or set policy.backend=transformers)"
        ) from e
    from transformers import GenerationConfig

    checkpoint = str(check_checkpoint(settings.checkpoint))
    tokenizer = load_tokenizer(checkpoint)
    try:
        generation_config = GenerationConfig.from_pretrained(checkpoint, local_files_only=True)
    except OSError:  # no generation_config.json: the tokenizer's eos alone ends a response
        generation_config = None
    llm = vllm.LLM(
        model=checkpoint,
        tokenizer=checkpoint,
        dtype=settings.dtype,
        seed=settings.seed,
        # log-probs of the temperature/top-p distribution actually sampled, as the transformers backend
        logprobs_mode="processed_logprobs",
        # our SamplingParams are complete: ignore the checkpoint's sampling defaults
        generation_config="vllm",
        **(engine_kwargs or {}),
    )
    return VllmGenerator(llm, tokenizer, settings, stop_token_ids(generation_config, tokenizer))
