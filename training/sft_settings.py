"""Config section `sft`: the cold-start supervised fine-tuning before RL (training/sft.py).

The defaults are a short run with the full demonstration mix. The CPU demo (configs/local.yaml) trains the
bundled pretrained base on repair demonstrations for about five minutes; what was tried, and what to change
for a real checkpoint on a GPU (more steps, a lower rate), are in docs/cold_start.md.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.tasks.settings import TaskSourceSpec, TasksSettings

# Kinds of demonstration episodes (see training/sft.py `sft_examples`).
EPISODE_KINDS = ("write", "edit", "append", "repair")
DEFAULT_MIX = MappingProxyType({"write": 0.2, "edit": 0.35, "append": 0.15, "repair": 0.3})


def check_mix(mix: dict[str, float], kinds: tuple[str, ...], what: str) -> dict[str, float]:
    """`mix` if it weighs only known `kinds` with finite weights >= 0, one of them > 0; else ValueError."""
    unknown = sorted(set(mix) - set(kinds))
    if unknown:
        raise ValueError(f"unknown {what} kind(s) {unknown}; allowed: {', '.join(kinds)}")
    bad = {k: v for k, v in mix.items() if not 0.0 <= v < float("inf")}
    if bad:
        raise ValueError(f"mix weights must be finite and >= 0, got {bad}")
    if sum(mix.values()) <= 0:
        raise ValueError("mix needs at least one kind with a positive weight")
    return mix


def _default_tasks() -> TasksSettings:
    return TasksSettings(
        train=(TaskSourceSpec(source="mbpp", split="train"),),
        eval=(TaskSourceSpec(source="mbpp", split="validation", limit=20),),
    )


def check_device(device: str) -> str:
    """`device` if it names the CPU or a CUDA device (`cuda`, `cuda:1`); else ValueError."""
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return device


def check_betas(betas: tuple[float, float]) -> tuple[float, float]:
    """AdamW's (beta1, beta2), each in [0, 1): shared by SFT and pretraining stages."""
    if not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"adam_betas must each be in [0, 1), got {list(betas)}")
    return betas


class SftSettings(BaseModel):
    """Frozen, validated settings of `training.sft` (examples, optimisation, held-out check)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="`didpo round` cold-starts the policy with SFT before round 0")
    tasks: TasksSettings = Field(
        default_factory=_default_tasks,
        description="train: tasks whose reference solutions become demonstrations; eval: held-out prompts",
    )
    mix: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_MIX),
        description=f"relative weight of each demonstration kind ({', '.join(EPISODE_KINDS)})",
    )
    finish_rate: float = Field(
        0.3, ge=0.0, le=1.0, description="share of solved episodes that go on with a <finish/> turn"
    )
    episodes_per_task: int = Field(1, ge=1, description="demonstration episodes drawn per training task")
    rl_task_episodes: int = Field(
        0, ge=0, description="extra demonstration episodes for each task of `tasks.train` (the tasks the rounds "
        "train on), so RL starts from solutions the policy partly knows: groups get mixed outcomes and shared "
        "changes even when the policy cannot yet solve new problems",
    )
    unconditioned_copies: int = Field(
        0, ge=0, description="train each demonstration response this many more times with only the assistant "
        "header as prompt: short rows pack many to a batch, cheap extra signal on the grammar for small policies",
    )
    lr: float = Field(3e-3, gt=0.0, lt=1.0, description="peak learning rate (AdamW)")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    adam_betas: tuple[float, float] = Field(
        (0.9, 0.999), description="AdamW (beta1, beta2); pretraining from scratch uses beta2 0.95, as LM "
        "pretraining (and OpenRLHF's default) does")
    warmup_steps: int = Field(5, ge=0, description="linear warmup from 0 to lr, in optimizer steps")
    schedule: str = Field("cosine", description="after warmup: 'cosine' decay to min_lr_ratio*lr, or 'constant'")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine floor as a fraction of lr")
    epochs: int = Field(1, ge=1, description="passes over the examples (cut short by max_steps)")
    max_steps: int | None = Field(60, description="cap on optimizer steps; null = every epoch in full")
    max_tokens_per_batch: int = Field(
        4096, gt=0, description="token budget of one batch, counting padding (rows x longest row)"
    )
    grad_clip: float = Field(1.0, ge=0.0, description="global gradient-norm clip; 0 = off")
    save_every: int = Field(
        0, ge=0, description="save a resumable train state every N optimizer steps; 0 = end only (a killed SFT "
        "then restarts from step 0)"
    )
    seed: int = Field(0, ge=0, description="seed of the example mix, batch order and weights' updates")
    device: str = Field("cpu", description="where the weights train: cpu, or cuda / cuda:N on a GPU machine (the "
                        "same loop, batches moved there; what is trained does not depend on it)")
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the forward's matrix products (torch.autocast); the weights, gradients "
        "and AdamW stay float32. bfloat16 steps are 1.3-1.8x faster on a CPU with AVX512-BF16 "
        "(benchmarks/train_precision.py) and is the usual choice on a GPU")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return check_device(value)

    @field_validator("mix")
    @classmethod
    def _known_kinds(cls, mix: dict[str, float]) -> dict[str, float]:
        return check_mix(mix, EPISODE_KINDS, "demonstration")

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        return check_betas(value)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        if value not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {value!r}")
        return value

    @field_validator("max_steps")
    @classmethod
    def _max_steps(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"max_steps must be >= 1 or null (no cap), got {value}")
        return value

    @model_validator(mode="after")
    def _warmup_fits(self) -> SftSettings:
        if self.max_steps is not None and self.warmup_steps >= self.max_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be below max_steps ({self.max_steps}): "
                "the learning rate would never reach its peak"
            )
        return self
