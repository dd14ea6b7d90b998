"""Config section `policy`: which checkpoint generates rollouts, and how it samples."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.assets import resolve_checkpoint
from pipeline.policy.tiny import SIZES

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


class PolicySettings(BaseModel):
    """Policy checkpoint and generation parameters (frozen; unknown keys are refused)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint: str = Field(
        default="out/models/tiny",
        min_length=1,
        description="local Hugging Face checkpoint directory (built by `didpo model init --out DIR` if missing), "
        "or `bundled:NAME` for a checkpoint shipped in models/ (`bundled:base`, the pretrained CPU base)",
    )
    size: str = Field(default="tiny", description="size preset used when the checkpoint must be built")
    seed: int = Field(default=0, ge=0, description="seed of the built checkpoint's weights and of sampling")
    dtype: Literal["float32", "bfloat16"] = Field(default="float32", description="weight dtype")
    backend: Literal["transformers", "vllm"] = Field(
        default="transformers", description="generation backend: transformers (CPU) or vllm (GPU)"
    )
    device: str = Field(
        default="cpu", description="torch device of the transformers backend: cpu, cuda, cuda:N"
    )
    temperature: float = Field(
        default=1.0, ge=0.0, allow_inf_nan=False, description="sampling temperature; 0 means greedy decoding"
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling mass, in (0, 1]")
    max_new_tokens: int = Field(default=512, gt=0, description="most tokens generated per turn")

    @field_validator("checkpoint")
    @classmethod
    def _shipped(cls, value: str) -> str:
        return resolve_checkpoint(value)  # bundled:NAME -> its folder, hash checked; a path stays as written

    @field_validator("size")
    @classmethod
    def _known_size(cls, value: str) -> str:
        if value not in SIZES:
            raise ValueError(f"size {value!r} is not a preset: use one of {', '.join(SIZES)}")
        return value

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not _DEVICE.fullmatch(value):
            raise ValueError(f"device {value!r} is not supported: use cpu, cuda or cuda:N")
        return value

    @property
    def greedy(self) -> bool:
        """Temperature 0 means argmax decoding (no sampling)."""
        return self.temperature == 0.0
