"""Online mode: OpenRLHF's Ray PPO trainer with vLLM generation, our multi-turn coding environment, and the
DiDPO estimator in place of OpenRLHF's advantage computation.

1. Prompts are task ids. For each, vLLM engines run G episodes through `DidpoAgentExecutor` (OpenRLHF's
   `agent_func_path` interface): per turn the Episode renders the prompt, vLLM samples a response, the
   sandbox executes the action (`pipeline.rollout.advance`, the same per-turn logic as the offline pipeline).
2. Each turn becomes ONE OpenRLHF sample row (prompt_t + response_t), exactly like one row of the offline
   steps table: our prompt is re-rendered every turn (workspace, last H turns), so a trajectory is not one
   append-only token sequence. The row carries its step record in `Experience.info[STEP_KEY]`.
3. OpenRLHF computes log-probs (actor, reference) of every row as usual.
4. `DidpoExperienceMaker.compute_advantages_and_returns` (OpenRLHF's advantage extension point) calls
   `didpo_advantages`: step records -> StepInputs -> `compute_credit` (the offline credit core) -> per-token
   advantages written onto the rows' action positions; returns = R_t of the row on the same positions.
5. OpenRLHF's PPO actor update (clipped policy loss, KL as a loss term) consumes them unchanged.

Heavy packages (torch, ray, vllm, openrlhf) are imported lazily: this module imports on any machine, and
`didpo_advantages` runs on CPU (tests/training/test_online.py) through the very function the trainer calls.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.credit_io import STEP_COLUMNS
from training.settings import OnlineSettings

if TYPE_CHECKING:
    from training.config import DidpoConfig

STEP_KEY = "didpo_step"  # Experience.info key: per row, the step record (see STEP_FIELDS)
STEP_FIELDS = (*STEP_COLUMNS, "return_to_go")  # the steps columns the credit core reads, + R_t
CONFIG_ENV = "DIDPO_ONLINE_CONFIG_JSON"  # resolved config handed to every Ray worker (trainer, vLLM engines)


# ---- settings ------------------------------------------------------------------------------------------


def load_online_config(path: str | Path, overrides: Sequence[str] = ()) -> tuple[Any, OnlineSettings]:
    """(DidpoConfig, its `online` section) of one YAML file; errors are `pipeline.config.ConfigError`."""
    from training.config import load_config

    cfg = load_config(path, overrides)
    return cfg, cfg.online


# ---- the advantage hook (pure; CPU-testable) -------------------------------------------------------------


class OnlineBatchError(ValueError):
    """A rollout batch the hook cannot credit; the message names the experience and row."""


def step_record(row: Mapping[str, Any] | Any) -> dict[str, Any]:
    """The fields of a steps-table row (a StepRow or its dict) that travel with an OpenRLHF row."""
    get = row.get if isinstance(row, Mapping) else lambda k: getattr(row, k)
    return {k: get(k) for k in STEP_FIELDS}


def didpo_advantages(experiences: Sequence[Any], settings: Any) -> Any:
    """Write DiDPO (or any registered estimator's) advantages into OpenRLHF Experiences; returns the
    CreditResult.

    experiences: OpenRLHF `Experience` batches as `RemoteExperienceMaker.compute_advantages_and_returns`
      receives them: `action_mask` [B, A] (1 on response tokens, any padding side), `info[STEP_KEY]` a list of
      B step records (one agent turn each; all G rollouts of a task must be in this call).
    settings: `CreditSettings` (estimator, lambda, gamma, ...).
    Effect per experience: `advantages` and `returns` [B, A] float32 (rows' dtype promoted to >= float32):
      the k-th 1 of row b's action mask gets the credit core's token advantage k of that step (a row cut by
      max_len keeps its first tokens), returns get R_t of the step; 0 on prompt and padding positions.
      `info[STEP_KEY]` is removed (it must not travel to the training actors); `info["return"]` = R_t [B],
      `info["didpo_episode_advantage"]` = A^E [B]; `kl` is cleared as OpenRLHF does after shaping.
    """
    import torch

    from pipeline.credit import CreditInputError, compute_credit
    from pipeline.credit_io import step_input

    steps = []
    for e, exp in enumerate(experiences):
        records = exp.info.get(STEP_KEY) if isinstance(exp.info, dict) else None
        rows = int(exp.action_mask.shape[0])
        if records is None or len(records) != rows:
            got = "none" if records is None else len(records)
            raise OnlineBatchError(
                f"experience {e}: info[{STEP_KEY!r}] must hold one step record per row ({rows}), got {got}"
            )
        for b, record in enumerate(records):
            missing = [k for k in STEP_FIELDS if k not in record]
            if missing:
                raise OnlineBatchError(f"experience {e} row {b}: step record lacks {missing}")
            try:
                steps.append(step_input(record, source=f"experience {e} row {b}"))
            except (CreditInputError, KeyError, TypeError, ValueError) as err:
                raise OnlineBatchError(f"experience {e} row {b}: {err}") from err
    result = compute_credit(steps, settings)
    token_adv = [row.token_advantages for row in result.advantages]  # input order = `where` order
    episode_adv = [row.episode_advantage for row in result.advantages]
    position = itertools.count()  # the rows again, in the order `steps` was built
    for e, exp in enumerate(experiences):
        mask = exp.action_mask.bool()
        advantages = torch.zeros(mask.shape, dtype=torch.float32)
        returns = torch.zeros(mask.shape, dtype=torch.float32)
        exp.info["return"] = torch.zeros(mask.shape[0], dtype=torch.float32)
        exp.info["didpo_episode_advantage"] = torch.zeros(mask.shape[0], dtype=torch.float32)
        for b, record in enumerate(exp.info[STEP_KEY]):
            k = next(position)
            positions = mask[b].nonzero(as_tuple=True)[0]
            values = torch.as_tensor(token_adv[k], dtype=torch.float32)
            if positions.numel() > values.numel():
                raise OnlineBatchError(
                    f"experience {e} row {b} (row_id {record['row_id']!r}): {positions.numel()} action positions "
                    f"but the step has {values.numel()} response tokens"
                )
            advantages[b, positions] = values[: positions.numel()]
            returns[b, positions] = float(record["return_to_go"])
            exp.info["return"][b] = float(record["return_to_go"])
            exp.info["didpo_episode_advantage"][b] = float(episode_adv[k])
        exp.advantages = advantages.to(exp.action_mask.device)
        exp.returns = returns.to(exp.action_mask.device)
        exp.kl = None
        del exp.info[STEP_KEY]
    return result


def step_experience(record: Mapping[str, Any], *, max_len: int, with_logprobs: bool = False,
                    experience_cls: Any = None) -> Any:
    """One agent turn (a steps-table row dict incl. prompt/response ids) as a single-row OpenRLHF Experience,
    laid out as OpenRLHF's `SamplesGenerator._process_response_into_experience` lays out a sample:
    sequences = prompt + response cut to max_len, action_mask = response positions shifted by one ([T-1]).
    `rewards` is the step reward (so OpenRLHF runs no reward model); the step record rides in info[STEP_KEY]."""
    import torch

    if experience_cls is None:
        from openrlhf.trainer.ppo_utils.experience import Experience as experience_cls

    prompt, response = list(record["prompt_token_ids"]), list(record["response_token_ids"])
    if not response:
        raise OnlineBatchError(f"row {record['row_id']!r}: empty response (nothing to train)")
    ids = (prompt + response)[:max_len]
    action = torch.zeros(len(prompt) + len(response), dtype=torch.long)
    action[len(prompt):] = 1
    action = action[1:max_len]
    logprobs = None
    if with_logprobs:
        logprobs = torch.tensor(([0.0] * len(prompt) + list(record["behavior_logprobs"]))[1:max_len])[None]
    reward = float(record["step_reward"])
    return experience_cls(
        sequences=torch.tensor(ids, dtype=torch.long)[None],
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        action_mask=action[None],
        rollout_log_probs=logprobs,
        rewards=torch.tensor([reward]),
        scores=torch.tensor([reward]),
        response_length=torch.tensor([int(action.sum())]),
        truncated=torch.tensor([len(prompt) + len(response) > max_len]),
        total_length=torch.tensor([float(len(ids))]),
        prompts=[record["task_id"]],
        labels=[record["task_id"]],
        images=[None],
        mm_train_inputs=[None],
        info={"reward": torch.tensor([reward]), "response_clip_ratio": torch.tensor([len(ids) >= max_len]),
              STEP_KEY: [step_record(record)]},
    )


# ---- the OpenRLHF glue (GPU; built lazily) ---------------------------------------------------------------


def _resolved_config() -> tuple[Any, OnlineSettings]:
    """The run's config inside a Ray worker (the driver puts it in CONFIG_ENV)."""
    from training.config import DidpoConfig

    blob = os.environ.get(CONFIG_ENV)
    if not blob:
        raise RuntimeError(f"{CONFIG_ENV} is not set: start online mode with `python -m training.online`")
    data = json.loads(blob)
    return DidpoConfig.model_validate(data["config"]), OnlineSettings.model_validate(data["online"])


def _openrlhf_classes() -> dict[str, type]:
    """Our subclasses of OpenRLHF 0.11.2's trainer pieces (ray, vllm, deepspeed imported here only)."""
    import ray
    import torch
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    class DidpoExperienceMaker(RemoteExperienceMaker):
        """OpenRLHF's extension point for advantages: the whole rollout batch (all task groups) arrives
        here after the log-prob forwards; DiDPO replaces the group baselines / GAE."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.credit_settings = _resolved_config()[0].credit

        @torch.no_grad()
        def compute_advantages_and_returns(self, experiences):
            didpo_advantages(experiences, self.credit_settings)
            return experiences

    class DidpoSamplesGenerator(SamplesGenerator):
        """Turns each finished episode into one single-row Experience per turn, after OpenRLHF has cut the
        buffer into training chunks of rollout_batch_size x n_samples_per_prompt EPISODES (so every task's
        G rollouts land in one batch, which the estimator needs)."""

        def _process_response_into_experience(self, response, **generate_kwargs):
            max_len = generate_kwargs.get("max_len", 2048)
            with_lp = self.args.algo.advantage.is_correction_level != "off"
            return [step_experience(r, max_len=max_len, with_logprobs=with_lp) for r in response[STEPS_KEY]]

        def generate_samples(self, **generate_kwargs):
            episodes, pass_rate, consumed, exhausted = super().generate_samples(**generate_kwargs)
            rows = list(itertools.chain.from_iterable(episodes))
            return rows, pass_rate, consumed, exhausted

    @ray.remote
    class DidpoPPOTrainer(PPOTrainer.__ray_actor_class__):
        """OpenRLHF's PPOTrainer with our sample generator and experience maker (same arguments)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.samples_generator = DidpoSamplesGenerator(
                strategy=self.strategy, prompts_dataloader=self.prompts_dataloader,
                eval_dataloader=self.eval_dataloader, tokenizer=self.tokenizer, vllm_engines=self.vllm_engines,
            )
            self.experience_maker = DidpoExperienceMaker(
                self.actor_model_group, self.critic_model_group, self.reward_model_group,
                self.reference_model_group, self.kl_ctl, self.strategy, self.tokenizer,
            )

    return {"experience_maker": DidpoExperienceMaker, "samples_generator": DidpoSamplesGenerator,
            "trainer": DidpoPPOTrainer}


STEPS_KEY = "didpo_steps"  # agent response dict key: the episode's step records (incl. token ids)


@functools.cache
def _agent_executor_class() -> type:
    """OpenRLHF's multi-turn agent interface (`--train.agent_func_path`, class `AgentExecutor`), running our
    Episode with the sandbox; built on first access so that importing this module stays light."""
    import asyncio
    from copy import deepcopy

    from openrlhf.utils.agent import AgentExecutorBase

    from pipeline.policy.generation import result_from_vllm
    from pipeline.rollout import InfraFailure, advance, finish, prompt_request, start_rollouts
    from pipeline.sandbox import Judge, SandboxPool
    from pipeline.tasks.settings import resolve_tasks

    class DidpoAgentExecutor(AgentExecutorBase):
        """One execute() = one episode of the task named by the prompt's label."""

        def __init__(self):
            self.cfg, self.online = _resolved_config()
            self.tasks = {t.task_id: t for t in resolve_tasks(self.cfg.tasks)[0]}
            self.judge = Judge(SandboxPool(self.cfg.sandbox))
            self.samples = itertools.count()  # per-engine sample counter: distinct traj ids within a batch
            self.tag = f"{os.uname().nodename}:{os.getpid()}"

        async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine,
                          images=None):
            if label not in self.tasks:
                raise KeyError(f"prompt label {label!r} is not a task of tasks.train")
            index = next(self.samples)
            run_id = f"{self.cfg.run.run_id}/online/{self.tag}/{index}"  # distinct trajectory ids and seeds
            (rollout,) = start_rollouts(self.tasks[label], run_id=run_id, round_k=0, samples=1,
                                        root_seed=self.cfg.run.seed,
                                        policy_version="online")
            stop_ids = frozenset({hf_tokenizer.eos_token_id} - {None})
            truncated = False
            try:
                while not rollout.done:
                    request = prompt_request(rollout, hf_tokenizer, self.cfg.episode)
                    params = deepcopy(sampling_params)
                    params.max_tokens = min(self.cfg.episode.max_response_tokens,
                                            max_length - len(request.prompt_token_ids))
                    if params.max_tokens <= 0:
                        truncated = True  # the prompt alone fills the context: end the episode here
                        break
                    params.logprobs, params.seed = 1, request.seed
                    output = await llm_engine.generate(request.prompt_token_ids, params)
                    result = result_from_vllm(request, output, hf_tokenizer, stop_ids)
                    # The sandbox blocks: run it in a thread so the engine's other episodes keep generating.
                    rollout = await asyncio.to_thread(advance, rollout, result, self.judge, self.cfg.episode)
            except InfraFailure as failure:
                return _episode_response(prompt, label, [], 0.0, False, {"infra_failure": 1.0}, failure.reason)
            if not rollout.steps:
                return _episode_response(prompt, label, [], 0.0, truncated, {}, "no turn fitted in max_len")
            traj, steps = finish(rollout, self.cfg.credit.gamma)
            rows = [{**step_record(s), "prompt_token_ids": s.prompt_token_ids,
                     "response_token_ids": s.response_token_ids, "behavior_logprobs": s.behavior_logprobs}
                    for s in steps]
            return _episode_response(prompt, label, rows, traj.episode_return, truncated,
                                     {"outcome": traj.outcome, "turns": float(traj.n_turns)}, "")

    return DidpoAgentExecutor


def _episode_response(prompt, label, rows, episode_return, truncated, logs, failure) -> dict[str, Any]:
    """The agent's reply in OpenRLHF's response-dict shape, plus our step rows under STEPS_KEY."""
    if failure:
        print(f"[didpo online] episode of {label!r} dropped: {failure}", file=sys.stderr)
    return {"prompt": prompt, "label": label, "images": None, "mm_train_inputs": None,
            "reward": episode_return, "scores": episode_return, "observation_tokens": [], "action_ranges": [],
            "rollout_log_probs": None, "truncated": truncated, "extra_logs": logs, STEPS_KEY: rows}


def __getattr__(name: str) -> Any:
    # OpenRLHF loads `--train.agent_func_path` (this file) as a fresh module named "agent_module" and reads its
    # `AgentExecutor`; the class comes from the installed `training.online`, so pydantic models resolve there.
    if name == "AgentExecutor":
        from training import online

        return online._agent_executor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- launch ----------------------------------------------------------------------------------------------


def openrlhf_argv(cfg: DidpoConfig, online: OnlineSettings, prompt_file: Path) -> list[str]:
    """OpenRLHF `train_ppo_ray` flags for our config. OpenRLHF's own estimator flag is set to `group_norm`
    only to pass its validation (critic-free, n_samples > 1); our experience maker ignores it."""
    pretrain = online.pretrain or cfg.policy.checkpoint
    gpus = online.actor_num_nodes * online.actor_num_gpus_per_node
    argv = [
        "--actor.model_name_or_path", pretrain,
        "--actor.num_nodes", online.actor_num_nodes, "--actor.num_gpus_per_node", online.actor_num_gpus_per_node,
        "--ref.num_nodes", online.ref_num_nodes, "--ref.num_gpus_per_node", online.ref_num_gpus_per_node,
        "--vllm.num_engines", online.vllm_num_engines,
        "--vllm.tensor_parallel_size", online.vllm_tensor_parallel_size,
        "--vllm.gpu_memory_utilization", online.vllm_gpu_memory_utilization,
        "--ds.zero_stage", online.zero_stage, "--ds.param_dtype", online.param_dtype,
        "--ds.attn_implementation", online.attn_implementation,
        "--train.agent_func_path", str(Path(__file__).resolve()),
        "--data.prompt_dataset", str(prompt_file), "--data.input_key", "input", "--data.label_key", "label",
        "--data.max_len", online.max_len, "--rollout.max_new_tokens", cfg.episode.max_response_tokens,
        "--rollout.n_samples_per_prompt", cfg.pipeline.samples_per_task,
        "--rollout.batch_size", online.rollout_batch_size,
        "--rollout.micro_batch_size", online.micro_rollout_batch_size,
        "--rollout.temperature", cfg.policy.temperature, "--rollout.top_p", cfg.policy.top_p,
        "--train.batch_size", online.train_batch_size, "--train.micro_batch_size", online.micro_train_batch_size,
        "--train.num_episodes", online.num_episodes, "--train.max_epochs", online.max_epochs,
        "--train.seed", online.seed,
        "--actor.adam.lr", online.actor_lr, "--actor.lr_warmup_ratio", online.lr_warmup_ratio,
        "--actor.eps_clip", online.eps_clip, "--actor.entropy_coef", online.entropy_coef,
        "--actor.loss_agg_mode", online.loss_agg_mode,
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", online.kl_coef,
        "--ckpt.output_dir", online.save_path, "--ckpt.path", online.ckpt_path,
        "--ckpt.save_steps", online.save_steps, "--logger.logging_steps", online.logging_steps,
    ]
    if online.kl_coef > 0:  # KL as a loss term: rewards stay the environment's, advantages stay DiDPO's
        argv += ["--algo.kl.use_loss", "--algo.kl.estimator", "k3"]
    if online.colocate_all:
        argv += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
        if gpus != online.vllm_num_engines * online.vllm_tensor_parallel_size:
            raise ValueError(
                f"online.colocate_all needs actor GPUs ({gpus}) = vllm_num_engines x vllm_tensor_parallel_size "
                f"({online.vllm_num_engines} x {online.vllm_tensor_parallel_size})"
            )
    if online.gradient_checkpointing:
        argv.append("--actor.gradient_checkpointing_enable")
    if online.adam_offload:
        argv.append("--ds.adam_offload")
    if online.tensorboard_dir:
        argv += ["--logger.tensorboard_dir", online.tensorboard_dir]
    return [str(a) for a in argv] + list(online.extra_args)


def write_prompts(cfg: DidpoConfig, online: OnlineSettings) -> Path:
    """One JSONL line per training task: {"input": task_id, "label": task_id} (the agent renders prompts)."""
    from pipeline.tasks.settings import resolve_tasks

    tasks = resolve_tasks(cfg.tasks)[0]
    if not tasks:
        raise ValueError("tasks.train selects no task: nothing to train on")
    out = Path(online.work_dir) / "prompts.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"input": t.task_id, "label": t.task_id}) + "\n" for t in tasks))
    tmp.replace(out)
    return out.resolve()


def launch(config_path: str | Path, overrides: Sequence[str] = (), *, ray_address: str | None = None) -> None:
    """Start online training on a Ray cluster (or a local one): config -> OpenRLHF flags -> its train_ppo_ray
    entry, with our PPOTrainer subclass swapped in where that entry looks it up."""
    import runpy

    import ray

    cfg, online = load_online_config(config_path, overrides)
    prompts = write_prompts(cfg, online)
    argv = openrlhf_argv(cfg, online, prompts)
    blob = json.dumps({"config": cfg.model_dump(mode="json"), "online": online.model_dump(mode="json")})
    env = {
        CONFIG_ENV: blob,
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
    }
    os.environ[CONFIG_ENV] = blob
    ray.init(address=ray_address, runtime_env={"env_vars": env})  # before OpenRLHF's own (skipped) init
    # The one patch, and why: OpenRLHF's `train()` imports `PPOTrainer` from this module at call time and has
    # no hook for the trainer class; ours is its subclass with the DiDPO experience maker / sample generator.
    import openrlhf.trainer.ppo_trainer as ppo_trainer

    ppo_trainer.PPOTrainer = _openrlhf_classes()["trainer"]
    sys.argv = ["openrlhf.cli.train_ppo_ray", *argv]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m training.online --config configs/gpu_online.yaml [--set a.b=c ...] [--ray-address ADDR]`"""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m training.online", description=main.__doc__)
    parser.add_argument("--config", required=True, help="YAML config with an `online` section")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--ray-address", default=None, help="existing Ray cluster (default: start a local one)")
    parser.add_argument("--print-args", action="store_true", help="print the OpenRLHF flags and exit")
    args = parser.parse_args(argv)
    if args.print_args:
        cfg, online = load_online_config(args.config, args.set)
        print(" ".join(openrlhf_argv(cfg, online, Path(online.work_dir).resolve() / "prompts.jsonl")))
        return
    launch(args.config, args.set, ray_address=args.ray_address)


if __name__ == "__main__":
    main()
