"""Build a small Qwen2-architecture policy checkpoint from scratch: random weights, in-process tokenizer.

The result is an ordinary Hugging Face checkpoint directory, so every later stage loads it exactly as it
would load Qwen2.5-Coder (`from_pretrained`, hub disabled):

1. Train a byte-level BPE (`tokenizers`) on instruction and code texts (by default the bundled tasks).
2. Wrap it as a `Qwen2Tokenizer` with the ChatML special tokens and chat template.
3. Build `Qwen2ForCausalLM` with a size preset and seeded random weights.
4. Save both into a temporary sibling folder and rename it into place (a reader never sees half a checkpoint).

Why the tokenizer pipeline is Qwen's own: transformers 5 rebuilds the normalizer and pre-tokenizer of any
`model_type: qwen2` checkpoint from the `Qwen2Tokenizer` class, whatever tokenizer.json says. We therefore
save exactly that pipeline, so AutoTokenizer, vLLM and the raw tokenizer.json all produce the same ids.
Training adds one extra rule: every non-ASCII character is its own pre-token, so no learned token ever
spans a character boundary; a token is either whole characters or bytes of a single character, which makes
character offsets exact. The Qwen pipeline NFC-normalizes input (as Qwen2.5 does): text already in NFC form,
which includes all ASCII source, round-trips exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from pipeline.policy.loading import CheckpointError, check_checkpoint

if TYPE_CHECKING:  # heavy imports (torch, transformers) stay out of config loading and `didpo --help`
    from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from pipeline.tasks.base import Task

ENDOFTEXT = "<|endoftext|>"  # document separator; padding token
IM_START = "<|im_start|>"  # opens a ChatML turn
IM_END = "<|im_end|>"  # closes a ChatML turn; end of a chat response (eos)
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # trained first, so their ids are 0, 1, 2

# ChatML as Qwen2.5 writes it, without Qwen's default system prompt and tool blocks.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# One pre-token per non-ASCII character during training: keeps learned tokens inside character boundaries.
_NON_ASCII_CHAR = r"[^\x00-\x7f]"


@dataclass(frozen=True)
class SizePreset:
    """Architecture of one model size (Qwen2 decoder: GQA attention with q/k/v biases, SwiGLU MLP, RMSNorm)."""

    vocab_size: int  # BPE vocabulary target incl. special tokens (a small corpus may yield fewer)
    hidden_size: int  # H, width of the residual stream
    intermediate_size: int  # I, width of the SwiGLU MLP
    num_hidden_layers: int  # L, decoder blocks
    num_attention_heads: int  # query heads (head_dim = H / heads)
    num_key_value_heads: int  # grouped-query attention: key/value heads, divides num_attention_heads
    max_position_embeddings: int  # longest sequence (RoPE, costs no parameters)


SIZES: dict[str, SizePreset] = {
    # For tests: builds in seconds, well under 1M parameters.
    "tiny": SizePreset(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    ),
    # For the demo: a few million parameters, still fast on CPU.
    "small": SizePreset(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    ),
    # small's depth at 1.5x its width, about 8.7M parameters: the next size up, whose default recipe trains in
    # about 90 minutes on two CPU cores with bfloat16 autocast (docs/pretraining.md, sixteenth series)
    "small_wide": SizePreset(
        vocab_size=4096,
        hidden_size=384,
        intermediate_size=1152,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=3,
        max_position_embeddings=8192,
    ),
    # small's width at twice its depth, about 7.3M parameters: a longer match (the tokens before a copy
    # position) needs more attention layers to compose (docs/pretraining.md, seventeenth series)
    "small_deep": SizePreset(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    ),
    # For pretraining from scratch (docs/pretraining.md): small's depth at half its width, so it trains 2.6x
    # faster on CPU; about 1.3M parameters, 40% of them the embedding.
    "base": SizePreset(
        vocab_size=4096,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    ),
    # For pretraining on a GPU (docs/pretraining.md, "On a GPU"): about 27M parameters; too slow for CPU.
    "medium": SizePreset(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=8192,
    ),
}


@dataclass(frozen=True)
class CheckpointInfo:
    """What `build_checkpoint` wrote."""

    path: Path  # the checkpoint directory
    size: str  # preset name
    seed: int  # weight initialisation seed
    n_parameters: int  # unique trainable parameters (tied embeddings counted once)
    vocab_size: int  # tokens the tokenizer knows, incl. special tokens (= the model's embedding rows)
    special_token_ids: dict[str, int]  # token text -> id
    files: tuple[str, ...]  # file names in the directory, sorted


def task_texts(task: Task) -> Iterator[str]:
    """Every text of a task a coding policy reads or writes: instructions, starting and reference files, tests."""
    yield task.instructions
    for files in (task.workspace, task.reference, task.visible_tests.files, task.hidden_tests.files):
        yield from files.values()


def scaffold_texts() -> Iterator[str]:
    """The fixed text of every prompt: both statements of the action grammar (their tags are in every
    response too)."""
    from pipeline.agent.grammar import ACTION_SPECS

    yield from ACTION_SPECS.values()


def default_corpus() -> Iterator[str]:
    """Distinct instruction and code texts of the bundled tasks, in their loading order, then the prompt
    scaffold once per task.

    Sources share many texts (HumanEval, HumanEval+ and HumanEvalFix pose the same problems); each distinct
    text counts once, so no source weighs more for being bundled twice. The scaffold is in every prompt and
    its tags in every response, so it weighs as one copy per task: the grammar's tags become few tokens.
    """
    from pipeline.tasks import load_bundled  # task loaders only when no explicit corpus is given

    seen: set[str] = set()
    tasks = load_bundled()
    for task in tasks:
        for text in task_texts(task):
            if text not in seen:
                seen.add(text)
                yield text
    for _ in tasks:
        yield from scaffold_texts()


def train_tokenizer(
    corpus: Iterable[str], vocab_size: int, model_max_length: int = 8192
) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE on `corpus` and wrap it as a Qwen2 tokenizer with the ChatML chat template.

    Deterministic for a given corpus and vocab_size. The vocabulary has the 256 byte symbols and the
    special tokens whatever the corpus, and at most `vocab_size` entries.
    """
    from transformers import Qwen2Tokenizer

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size {vocab_size} is below {256 + len(SPECIAL_TOKENS)} (bytes + special tokens)"
        )
    qwen_pipeline = Qwen2Tokenizer().backend_tokenizer  # the pipeline transformers rebuilds at load time
    trainee = Tokenizer(BPE())
    trainee.normalizer = qwen_pipeline.normalizer
    trainee.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(_NON_ASCII_CHAR), behavior="isolated"), qwen_pipeline.pre_tokenizer]
    )
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trainee.train_from_iterator(corpus, trainer)
    learned = json.loads(trainee.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=learned["vocab"],
        merges=merges,
        unk_token=None,  # byte-level: every input has a spelling, nothing is unknown
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,  # any "clean up" would break decode(encode(text)) == text
        model_max_length=model_max_length,
    )
    # Untrimmed offsets: a token's span includes its leading space, so spans tile the text exactly.
    tokenizer.backend_tokenizer.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    tokenizer.backend_tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def qwen2_config(preset: SizePreset, vocab_size: int, special_token_ids: dict[str, int]) -> PreTrainedConfig:
    """The `Qwen2Config` of a preset: tied embeddings, float32, ChatML token ids."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=special_token_ids[ENDOFTEXT],
        eos_token_id=special_token_ids[IM_END],
        pad_token_id=special_token_ids[ENDOFTEXT],
        dtype="float32",
    )


def build_model(preset: SizePreset, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> PreTrainedModel:
    """A `Qwen2ForCausalLM` with one embedding row per tokenizer entry and seeded random weights."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config = qwen2_config(preset, len(tokenizer), ids)
    with torch.random.fork_rng(devices=[]):  # seed the weights without touching the caller's RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    # A chat turn ends at <|im_end|>, a document at <|endoftext|>: generation stops at either.
    model.generation_config = GenerationConfig(
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=[ids[IM_END], ids[ENDOFTEXT]],
        pad_token_id=ids[ENDOFTEXT],
    )
    return model.eval()


def count_parameters(model: PreTrainedModel) -> int:
    """Unique parameters (a tied embedding/output matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


def build_checkpoint(
    out_dir: str | os.PathLike[str],
    size: str = "tiny",
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> CheckpointInfo:
    """Train the tokenizer, build the model and save both as one Hugging Face checkpoint in `out_dir`.

    corpus=None means `default_corpus()`. Same corpus + size + seed -> byte-identical files. Refuses an
    existing non-empty `out_dir` unless overwrite=True.
    """
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}: choose one of {', '.join(SIZES)}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{out} already exists and is not empty (pass overwrite=True / --force to replace it)"
        )
    preset = SIZES[size]
    tokenizer = train_tokenizer(
        default_corpus() if corpus is None else corpus, preset.vocab_size, preset.max_position_embeddings
    )
    model = build_model(preset, tokenizer, seed)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(staging)
        # The chat template goes inside tokenizer_config.json, where every transformers version looks.
        tokenizer.save_pretrained(staging, save_jinja_files=False)
        staging.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary shared folder
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return CheckpointInfo(
        path=out,
        size=size,
        seed=seed,
        n_parameters=count_parameters(model),
        vocab_size=len(tokenizer),
        special_token_ids={token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS},
        files=tuple(sorted(p.name for p in out.iterdir())),
    )


def ensure_checkpoint(
    path: str | os.PathLike[str], size: str = "tiny", seed: int = 0, corpus: Iterable[str] | None = None
) -> Path:
    """`path` if it already holds a checkpoint (of any size or origin); else build one there.

    A non-empty directory that is not a complete checkpoint is refused, never overwritten.
    """
    out = Path(path)
    try:
        return check_checkpoint(out)
    except CheckpointError:
        if out.is_dir() and any(out.iterdir()):
            raise
    return build_checkpoint(out, size=size, corpus=corpus, seed=seed).path
