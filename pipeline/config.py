"""One config file drives every stage; each stage validates the sections it reads.

A config file is a mapping of sections, each a stage's own settings model (in a leaf `settings` module beside
its stage that imports nothing but pydantic: frozen, `extra="forbid"`, validated). `PipelineConfig` composes
the sections of the pipeline's stages (rollouts, credit, eval); the trainer's root config
(`training.config.DidpoConfig`) adds its own on top, so `pipeline` never imports `training`, and the
pipeline's own entry point (`python -m pipeline.run`) validates its sections and leaves the trainer's
(`TRAINER_SECTIONS`) to the trainer. `load_config` reads YAML, applies `--set a.b=c` overrides, and turns any
validation failure into a `ConfigError` that names the key path and says what is allowed.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline.agent.settings import EpisodeSettings
from pipeline.assets import asset_dir
from pipeline.credit.settings import CreditSettings
from pipeline.policy.settings import PolicySettings
from pipeline.sandbox.settings import SandboxSettings
from pipeline.schema import content_id
from pipeline.storage import is_url
from pipeline.tasks.settings import TasksSettings
from pipeline.transforms.settings import PipelineSettings

DEFAULT_CONFIG = asset_dir("configs") / "local.yaml"


class ConfigError(ValueError):
    """A config that cannot be used; the message names every offending key path."""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RunSettings(_Section):
    run_id: str = Field("local", description="name of the run folder under `root`")
    root: str = Field("runs", description="where runs/<run_id>/round=<k>/ tables are written: a local folder or an "
                      "object-store URL (gs://bucket/runs, s3://bucket/runs; docs/runners.md)")
    seed: int = Field(0, ge=0, description="root seed; every other seed derives from it")
    rounds: int = Field(1, ge=1, description="policy rounds for `didpo round`")

    @field_validator("root")
    @classmethod
    def _known_root(cls, v: str) -> str:
        """A local path, or a URL whose scheme has an fsspec filesystem installed (gs: gcsfs, s3: s3fs)."""
        if is_url(v):
            import fsspec

            scheme = v.split("://", 1)[0]
            try:
                fsspec.get_filesystem_class(scheme)
            except (ValueError, ImportError) as e:
                raise ValueError(f"no filesystem for {scheme}:// ({e})") from None
        return v

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, v: str) -> str:
        if not v or "/" in v or v.startswith("."):
            raise ValueError("must be a plain folder name (no '/', not starting with '.')")
        return v


class EvalSettings(_Section):
    """Quick held-out evaluation after each round (the same episodes and sandbox as rollouts)."""

    max_tasks: int = Field(10, ge=1, description="held-out tasks evaluated per round (first N of tasks.eval)")
    samples: int = Field(1, ge=1, description="episodes per task")
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy decoding, the usual pass@1 protocol")


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    jsonl: bool = Field(True, description="write metrics.jsonl in the run folder")
    tensorboard: bool = Field(False, description="also write TensorBoard event files")
    progress: bool = Field(True, description="progress bars on long loops")


class PipelineConfig(_Section):
    """The sections the pipeline's stages read: rollouts, credit and the held-out evaluation."""

    run: RunSettings = RunSettings()
    tasks: TasksSettings = TasksSettings()
    policy: PolicySettings = PolicySettings()
    episode: EpisodeSettings = EpisodeSettings()
    sandbox: SandboxSettings = SandboxSettings()
    pipeline: PipelineSettings = PipelineSettings()
    credit: CreditSettings = CreditSettings()
    eval: EvalSettings = EvalSettings()
    logging: LoggingSettings = LoggingSettings()


# The sections `training.config.DidpoConfig` adds (a test holds the two lists equal). The pipeline's entry
# point accepts them unread, so one file drives both stages; the trainer validates them.
TRAINER_SECTIONS = ("pretrain", "sft", "train", "online")

Config = TypeVar("Config", bound=BaseModel)


# ---- loading --------------------------------------------------------------------------------------------


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for i, key in enumerate(keys[:-1]):
        nxt = node.setdefault(key, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}: {'.'.join(keys[: i + 1])} is not a section")
        node = nxt
    node[keys[-1]] = value


def apply_overrides(tree: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `a.b=c` overrides; the value is parsed as YAML (`3` -> int, `[a, b]` -> list, `x` -> str)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: value is not valid YAML ({e})") from e
        _set_path(tree, key.strip(), value)
    return tree


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside an annotation like `X`, `X | None`, `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if found := _submodel(arg):
            return found
    return None


def _allowed_keys(root: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        f = model.model_fields.get(part)
        model = _submodel(f.annotation) if f else None
    return sorted(model.model_fields) if model else []


def explain(error: ValidationError, source: str, root: type[BaseModel] = PipelineConfig) -> str:
    lines = [f"invalid config {source}:"]
    for err in error.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown key; allowed here: {', '.join(_allowed_keys(root, err['loc']))}"
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif "input" in err and err["type"] not in ("model_type",):
            msg = f"{msg} (got {err['input']!r})"
        lines.append(f"  {path}: {msg}")
    return "\n".join(lines)


def load_sections(path: str | Path | None, overrides: Sequence[str], model: type[Config],
                  unread: Sequence[str] = ()) -> Config:
    """Read a YAML config (default: configs/local.yaml), apply overrides, validate the sections of `model`;
    top-level sections named in `unread` (another stage's) are accepted and not read."""
    src = Path(path) if path else DEFAULT_CONFIG
    try:
        tree = yaml.safe_load(src.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {src} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{src}: not valid YAML: {e}") from e
    if not isinstance(tree, dict):
        raise ConfigError(f"{src}: the top level must be a mapping of sections")
    apply_overrides(tree, overrides)
    try:
        return model.model_validate({k: v for k, v in tree.items() if k not in unread})
    except ValidationError as e:
        raise ConfigError(explain(e, str(src), model)) from None


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> PipelineConfig:
    """The pipeline's sections of a config file (the trainer's are left to `training.config.load_config`)."""
    return load_sections(path, overrides, PipelineConfig, unread=TRAINER_SECTIONS)


def to_yaml(config: BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def config_hash(config: BaseModel) -> str:
    """Content hash of the resolved config (recorded in every manifest)."""
    return content_id(config.model_dump(mode="json"))
