"""Config section `train`: the offline policy update of one round (training/trainer.py).

Loss options map one to one onto OpenRLHF's `PolicyLoss` (PPO clip with eps_low/eps_high, dual clip,
token- or sequence-mean aggregation, GSPO's sequence-level ratio); the rest are the update loop's knobs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Schedule = Literal["cosine", "constant"]
Aggregation = Literal["token_mean", "seq_mean"]
PolicyLossType = Literal["ppo", "gspo"]


class TrainSettings(BaseModel):
    """Frozen, validated settings of `training.trainer.train_round`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = Field(1e-6, gt=0.0, description="peak learning rate (AdamW)")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    warmup_steps: int = Field(0, ge=0, description="linear warmup from 0 to lr, in optimizer steps")
    schedule: Schedule = Field(
        "constant", description="after warmup: 'cosine' decay to min_lr_ratio*lr, or 'constant'"
    )
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine floor as a fraction of lr")
    epochs: int = Field(1, ge=1, description="PPO epochs: passes over the round's table")
    max_tokens_per_batch: int = Field(
        8192, gt=0, description="token budget of one micro-batch, counting padding (rows x longest row)"
    )
    micro_batches_per_step: int = Field(
        1, ge=1, description="micro-batches accumulated into one optimizer step (the global batch: under data "
        "parallelism each rank trains every world-th of them, so set it to a multiple of the world size)"
    )
    eps_clip: float = Field(
        0.2, gt=0.0, lt=1.0, description="PPO clip range, used when eps_low/eps_high are unset"
    )
    eps_low: float | None = Field(None, description="lower clip range (DAPO clip-higher); None = eps_clip")
    eps_high: float | None = Field(None, description="upper clip range (DAPO clip-higher); None = eps_clip")
    dual_clip: float | None = Field(
        None, description="dual-clip bound c > 1 for negative advantages; None = off"
    )
    loss_aggregation: Aggregation = Field(
        "token_mean", description="'token_mean' or 'seq_mean' (per-row mean)"
    )
    policy_loss: PolicyLossType = Field("ppo", description="'ppo' (token ratio) or 'gspo' (sequence ratio)")
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the k3 KL to the frozen reference policy")
    entropy_coef: float = Field(0.0, ge=0.0, description="weight of the entropy bonus")
    grad_clip: float = Field(1.0, ge=0.0, description="global gradient-norm clip; 0 = off")
    recompute_old_logprobs: bool = Field(
        True,
        description="recompute old log-probs with the starting policy (else the table's behavior log-probs)",
    )
    dynamic_filtering: bool = Field(
        False, description="drop task groups whose trajectory rewards are all equal"
    )
    zero_stage: int = Field(2, description="DeepSpeed ZeRO stage on GPU (0-3; 3 also partitions the weights)")
    cpu_zero_stage: int = Field(
        0, description="DeepSpeed ZeRO stage on CPU (0-3): 0, as one process needs none; 2 or 3 run the GPU's "
        "sharded path under gloo across processes (docs/training.md)")
    save_every: int = Field(
        0, ge=0, description="save a resumable train state every N optimizer steps; 0 = end only"
    )
    seed: int = Field(0, ge=0, description="seed of batch order, dropout and every other random choice")
    deterministic: bool = Field(
        True, description="torch.use_deterministic_algorithms (bitwise resume on CPU)"
    )
    bf16_on_gpu: bool = Field(
        True, description="bf16 mixed precision on GPU (fp32 master weights); CPU is fp32"
    )

    @field_validator("eps_low", "eps_high")
    @classmethod
    def _clip_range(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 < value < 10.0:
            raise ValueError(f"must be in (0, 10) or null, got {value}")
        return value

    @field_validator("eps_low")
    @classmethod
    def _low_below_one(cls, value: float | None) -> float | None:
        if value is not None and value >= 1.0:
            raise ValueError(f"must be below 1 (the ratio's lower bound is 1 - eps_low), got {value}")
        return value

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_above_one(cls, value: float | None) -> float | None:
        if value is not None and value <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (a bound c * A below the PPO clip) or null, got {value}")
        return value

    @field_validator("zero_stage", "cpu_zero_stage")
    @classmethod
    def _zero_stage(cls, value: int) -> int:
        if value not in (0, 1, 2, 3):
            raise ValueError(f"a ZeRO stage is 0, 1, 2 or 3, got {value}")
        return value

    @model_validator(mode="after")
    def _gspo_aggregates_per_sequence(self) -> TrainSettings:
        if self.policy_loss == "gspo" and self.loss_aggregation != "seq_mean":
            raise ValueError(
                "policy_loss 'gspo' uses a sequence-level ratio: set loss_aggregation to 'seq_mean'"
            )
        return self

    @property
    def clip_low(self) -> float:
        return self.eps_clip if self.eps_low is None else self.eps_low

    @property
    def clip_high(self) -> float:
        return self.eps_clip if self.eps_high is None else self.eps_high


class OnlineSettings(BaseModel):
    """Config section `online`: OpenRLHF Ray PPO knobs (the policy, episode, sandbox and credit sections of
    the same file drive the environment and the estimator)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pretrain: str = Field("", description="local HF checkpoint dir of the initial policy (empty: policy.checkpoint)")
    save_path: str = Field("runs/online/final", description="where the trained policy is saved (HF format)")
    ckpt_path: str = Field("runs/online/ckpt", description="DeepSpeed checkpoints (resume from here)")
    work_dir: str = Field("runs/online", description="the prompt file (task ids) is written here")
    # Placement
    actor_num_nodes: int = Field(1, ge=1)
    actor_num_gpus_per_node: int = Field(8, ge=1)
    ref_num_nodes: int = Field(1, ge=1)
    ref_num_gpus_per_node: int = Field(8, ge=1)
    vllm_num_engines: int = Field(8, ge=1, description="vLLM engines generating the episodes")
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)
    colocate_all: bool = Field(True, description="actor, reference and vLLM share the GPUs (hybrid engine)")
    # DeepSpeed
    zero_stage: Literal[0, 1, 2, 3] = 2
    param_dtype: Literal["bf16", "fp16"] = "bf16"
    attn_implementation: str = "flash_attention_2"
    gradient_checkpointing: bool = True
    adam_offload: bool = False
    # Rollout and PPO
    rollout_batch_size: int = Field(6, ge=1, description="tasks per training step (DESIGN.md: 6)")
    micro_rollout_batch_size: int = Field(8, ge=1, description="rows per log-prob forward")
    train_batch_size: int = Field(192, ge=1, description="rows per optimizer step")
    micro_train_batch_size: int = Field(4, ge=1, description="rows per forward/backward")
    max_len: int = Field(8192, ge=64, description="prompt + response tokens of one turn")
    num_episodes: int = Field(1, ge=1, description="passes over the task prompts")
    max_epochs: int = Field(1, ge=1, description="PPO epochs per rollout batch")
    actor_lr: float = Field(1e-6, gt=0.0)
    lr_warmup_ratio: float = Field(0.03, ge=0.0, le=1.0)
    eps_clip: float = Field(0.2, gt=0.0, lt=1.0)
    kl_coef: float = Field(1e-3, ge=0.0, description="KL(pi || ref) as a loss term (k3); 0 = no reference model")
    entropy_coef: float = Field(0.0, ge=0.0)
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    seed: int = Field(42, ge=0)
    save_steps: int = Field(20, description="-1 = only at the end")
    logging_steps: int = Field(1, ge=1)
    tensorboard_dir: str = Field("", description="empty: no TensorBoard")
    extra_args: tuple[str, ...] = Field((), description="more train_ppo_ray flags, passed through verbatim")

    @model_validator(mode="after")
    def _consistent(self) -> OnlineSettings:
        if self.train_batch_size % self.micro_train_batch_size:
            raise ValueError(
                f"train_batch_size ({self.train_batch_size}) must be a multiple of micro_train_batch_size "
                f"({self.micro_train_batch_size})"
            )
        for flag in ("--algo.dynamic_filtering_enable", "--train.async_enable", "--eval.dataset",
                     "--algo.advantage.estimator", "--train.agent_func_path", "--ds.packing_samples"):
            if any(a.split("=", 1)[0] == flag for a in self.extra_args):
                raise ValueError(f"extra_args may not set {flag}: online mode sets or does not support it")
        return self
