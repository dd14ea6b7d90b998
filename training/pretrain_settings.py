"""Config section `pretrain`: the base policy built from scratch before any SFT (training/pretrain.py).

A recipe is a list of stages, each a mix of row kinds trained through the SFT loop from the previous stage's
weights. The defaults are the best recipe measured so far (docs/pretraining.md), not yet one that reaches
every target: pure copying of random tokens of varied lengths first, at a constant rate (an induction circuit
forms after about 1,200-1,900 steps; the run stops if it has not), then quoting lines of short files (files
shown with numbered lines, as the episode shows them; the run stops if the loss stays high), then the same on
respelled files with induction rows mixed in (held-out greedy quote_line 0.81, one run), then every kind on
longer files.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.tasks.settings import TaskSourceSpec, TasksSettings
from training.settings import Schedule
from training.sft_settings import check_betas, check_device, check_mix

# Row kinds (training/pretrain.py `copy_task`, `induction_row`); the first two need no file.
PRETRAIN_KINDS = ("induction", "induction_repeats", "code", "quote_line", "quote_twin", "quote_many", "error_name",
                  "edit_line", "apply_edit", "fix_line", "fix_name", "edit_span")


class PretrainStage(BaseModel):
    """One stage: rows drawn from `mix`, trained for `steps` optimizer steps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="label in reports and folder names")
    mix: dict[str, float] = Field(description=f"relative weight of each row kind ({', '.join(PRETRAIN_KINDS)})")
    steps: int = Field(ge=1, description="optimizer steps")
    lr: float = Field(2e-3, gt=0.0, lt=1.0, description="peak learning rate (AdamW)")
    schedule: Schedule = Field("cosine", description="after warmup: 'cosine' decay to 0.1 x lr, or 'constant' (a "
                          "circuit that forms late in the stage still gets the full rate)")
    adam_betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW (beta1, beta2)")
    warmup_steps: int = Field(20, ge=0, description="linear warmup, in optimizer steps")
    max_tokens_per_batch: int = Field(2048, gt=0, description="token budget of one batch, padding included")
    max_file_lines: int | None = Field(
        None, ge=1, description="files longer than this are left out of this stage (short files first)")
    mosaic_files: int = Field(
        0, ge=0, description="extra files of random lines of the stage's files (training/pretrain.py "
        "`mosaic_files`): nothing in them to learn by heart, so copying from them needs looking")
    respell: bool = Field(
        False, description="show each row's file with fresh names and numbers (training/pretrain.py `respelled`): "
        "the structure is real, the content new, so quoting it needs looking, however often the file comes up")
    system_share: float = Field(
        0.0, ge=0.0, le=1.0, description="share of the file rows shown after the episode's system message (the "
        "role and the action grammar): a base never shown it does not copy after it (docs/pretraining.md)")
    library_files: int = Field(
        0, ge=0, description="extra files: functions of the Python standard library's own source of at most "
        "max_file_lines lines (training/pretrain.py `library_files`), varied real code that ships offline")
    max_final_loss: float | None = Field(
        None, gt=0.0, description="the stage must end below this loss (the median of its last 50 steps, "
        "training/pretrain.py `end_loss`), or the run "
        "stops there with one line, before any later stage trains on top of it: the induction circuit forms late, "
        "and tends to form later in larger models, and a file stage can end without having learnt to look up a "
        "line (docs/pretraining.md); a stage that ends without what it teaches wastes the rest")

    @field_validator("mix")
    @classmethod
    def _known_kinds(cls, mix: dict[str, float]) -> dict[str, float]:
        return check_mix(mix, PRETRAIN_KINDS, "pretraining")

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        return check_betas(value)

    @model_validator(mode="after")
    def _warmup_fits(self) -> PretrainStage:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        return self


def _default_tasks() -> TasksSettings:
    return TasksSettings(
        # every bundled file that no evaluation uses: humanevalfix (the demo's eval set) and its HumanEval
        # kin stay out; more distinct files taught looking rather than remembering (docs/pretraining.md)
        train=(TaskSourceSpec(source="mbpp", split="train"), TaskSourceSpec(source="mbpp", split="validation"),
               TaskSourceSpec(source="exercism")),
        eval=(TaskSourceSpec(source="mbpp", split="test"),),
    )


# quoting on respelled files with pure copies mixed in: the `files2` stage's rows, also rehearsed during a later
# SFT so that it keeps the base's copying (training/pretrain.py `rehearsal_examples`)
REHEARSAL_MIX = MappingProxyType({"quote_line": 0.4, "quote_many": 0.4, "induction": 0.2})

DEFAULT_STAGES = (
    # the circuit drops the loss from about 5 to below 0.1 within ~200 steps (at step 1,235-1,856 of the runs
    # measured); below 1.0 means it formed
    PretrainStage(name="induction", mix={"induction": 1.0}, steps=2000, lr=1e-3, schedule="constant",
                  warmup_steps=20, max_final_loss=1.0),
    # every run that went on to copy ended this stage at 0.10-0.17 (mean of the last 5 steps), small_deep seed 3
    # at a median of 0.31 (quote_line 0.52 after it); four that never learnt to look a line up (small_deep seed 2
    # and three reruns from its induction stage) at medians of 0.46-0.55, and the two stages after one of them
    # could not mend it (quote_line 0.23; twentieth and twenty-first series)
    PretrainStage(name="files", mix={"quote_line": 0.5, "quote_many": 0.5}, steps=3000, lr=1e-3, warmup_steps=100,
                  max_file_lines=20, max_final_loss=0.4),
    # respelled files cannot be learnt by heart, and induction rows keep pure copying sharp: held-out quoting
    # 0.59 -> 0.81 (docs/pretraining.md, ninth series; one run)
    PretrainStage(name="files2", mix=dict(REHEARSAL_MIX), steps=2000, lr=5e-4,
                  warmup_steps=50, max_file_lines=20, respell=True),
    PretrainStage(name="full", mix={"quote_line": 0.25, "quote_many": 0.25, "error_name": 0.15, "edit_line": 0.2,
                                    "code": 0.05, "induction": 0.1}, steps=1000, lr=5e-4, warmup_steps=50,
                  max_file_lines=40, respell=True),
)


class PretrainSettings(BaseModel):
    """Frozen, validated settings of `training.pretrain.pretrain`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: str = Field("base", description="size preset of the model built from scratch (unused with `init`)")
    init: str | None = Field(
        None, description="continue from this checkpoint (a folder, or bundled:NAME) instead of building one "
        "from scratch: its weights and tokenizer, then the stages; the report records its sha256")
    seed: int = Field(0, ge=0, description="seed of the weights, the rows and the batch order")
    tasks: TasksSettings = Field(
        default_factory=_default_tasks,
        description="train: tasks whose starting files and reference solutions are pretrained on; eval: held "
        "out (never trained on, also when they appear in train), their files measure copying",
    )
    stages: tuple[PretrainStage, ...] = Field(DEFAULT_STAGES, min_length=1, description="trained in order")
    eval_questions: int = Field(200, ge=1, description="held-out questions per ability measured at the end")
    save_every: int = Field(
        200, ge=0, description="save a stage's train state every N steps, so a killed run resumes inside the stage "
        "it was in (finished stages are always reused); 0 = at each stage's end only")
    device: str = Field("cpu", description="where the stages train: cpu, or cuda / cuda:N (docs/pretraining.md, "
                        "'On a GPU'); the rows, batches and steps are the same")
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of every stage's forward (torch.autocast; weights and AdamW stay float32): "
        "bfloat16 steps are 1.3-1.8x faster on a CPU with AVX512-BF16 (benchmarks/train_precision.py)")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return check_device(value)
