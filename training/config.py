"""The root config of a run: the pipeline's sections (`pipeline.config.PipelineConfig`) and the trainer's.

The trainer reads the pipeline's tables, so it may import the pipeline; the pipeline never imports it. What
drives a whole round (`didpo round`, compare, the demo, online training) is this model; `python -m
pipeline.run` validates only the pipeline's sections of the same file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline.config import PipelineConfig, load_sections
from training.pretrain_settings import PretrainSettings
from training.settings import OnlineSettings, TrainSettings
from training.sft_settings import SftSettings


class DidpoConfig(PipelineConfig):
    """The resolved configuration of a run; every stage reads its own section."""

    pretrain: PretrainSettings = PretrainSettings()
    sft: SftSettings = SftSettings()
    train: TrainSettings = TrainSettings()
    online: OnlineSettings = OnlineSettings()


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DidpoConfig:
    """Read a YAML config (default: configs/local.yaml), apply overrides, validate every section."""
    return load_sections(path, overrides, DidpoConfig)
