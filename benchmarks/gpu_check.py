"""GPU acceptance check: the GPU paths end to end, in a few minutes, with one command (`scripts/gpu_check.sh`).

Each stage is the command a user runs, in its own process (a crash or a CUDA error in one does not hide the
others), timed, and reported in one table:

1. `checkpoint`  `didpo model init`: the tiny Qwen2 policy with its own tokenizer (offline).
2. `round`       `didpo pipeline run` with `policy.backend=vllm`: rollouts generated through the vLLM
                 RunInference handler, executed in the sandbox, credit assigned: a round's tables.
3. `update`      `didpo train` on that round: one DeepSpeed ZeRO-2 policy update on one GPU.
4. `update_dp`   the same update data parallel under `torchrun --nproc_per_node <GPUs>` (ZeRO-2 across GPUs);
                 skipped on a one-GPU machine.
5. `online`      two steps of online mode (`python -m training.online`: OpenRLHF's Ray PPO trainer, vLLM
                 engines, the DiDPO estimator) on the tiny policy.

`--cpu` runs stages 1-4 through the same commands with the CPU backends (transformers generation, DeepSpeed
on its CPU accelerator under gloo, two processes for `update_dp`) and skips `online`, which needs CUDA, Ray
and vLLM: that is how CI checks this script. Needs `make setup` (with the `gpu` extra for vLLM) first.
Exit status 0 only when no stage failed.

    scripts/gpu_check.sh [--cpu] [--work DIR] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Stage:
    name: str
    status: str  # ok / failed / skipped
    seconds: float
    what: str


def _run(cmd: list[str], timeout: float, env: dict[str, str]) -> tuple[bool, str]:
    """(succeeded, the last line that says why when it did not)."""
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    if done.returncode == 0:
        return True, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    tail = [ln for ln in (done.stderr + done.stdout).strip().splitlines() if ln.strip()]
    return False, f"exit {done.returncode}: {tail[-1][:200] if tail else 'no output'}"


def signal_round(round_dir: Path, out: Path) -> str:
    """A copy of the round's steps with advantages of +-1 per rollout (alternating), so the update has rows to
    train on whatever the tiny untrained policy scored (its rollouts usually all fail alike: zero advantage)."""
    from pipeline import schema

    steps = schema.read_table(schema.table_dir(round_dir, "steps"), "steps")
    schema.write_table(steps, schema.table_dir(out, "steps"), "steps")
    trajs = sorted(set(steps["traj_id"].to_pylist()))
    sign = {t: 1.0 if i % 2 else -1.0 for i, t in enumerate(trajs)}
    rows = [{"row_id": r["row_id"], "traj_id": r["traj_id"], "task_id": r["task_id"], "estimator": "gpu_check",
             "lam": 0.0, "episode_advantage": sign[r["traj_id"]],
             "token_advantages": [sign[r["traj_id"]]] * len(r["response_token_ids"]),
             "loss_mask": [1] * len(r["response_token_ids"]), "n_diff_tokens": 0}
            for r in steps.select(["row_id", "traj_id", "task_id", "response_token_ids"]).to_pylist()]
    schema.write_table(schema.to_arrow("advantages", rows), schema.table_dir(out, "advantages"), "advantages")
    return f"{len(rows)} rows of {len(trajs)} rollouts"


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="CPU backends; skips online mode (how CI runs this)")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a new temp folder)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per stage")
    args = ap.parse_args(argv)

    gpus = 0 if args.cpu else _gpus()
    if not args.cpu and gpus == 0:
        print("gpu_check: no CUDA GPU visible (torch.cuda.device_count() == 0); use --cpu for the CPU paths",
              file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DIDPO_PROGRESS": "0", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    python, cli = sys.executable, [sys.executable, "-m", "workflows.cli"]
    ckpt, round_dir = work / "tiny", work / "runs" / "gpu_check" / "round=0"
    backend = (["--set", "policy.backend=transformers", "--set", "policy.device=cpu"] if args.cpu else
               ["--set", "policy.backend=vllm", "--set", "policy.device=cuda", "--set", "policy.dtype=bfloat16"])
    common = ["--set", f"run.root={work / 'runs'}", "--set", "run.run_id=gpu_check",
              "--set", f"policy.checkpoint={ckpt}", "--set", "policy.max_new_tokens=64",
              "--set", "episode.max_turns=2", "--set", "episode.max_response_tokens=64",
              "--set", "pipeline.samples_per_task=4", "--set", "sandbox.pool_size=2"]
    train_config = work / "train.yaml"  # an update that has rows to train on even when every reward is equal
    train_config.write_text(json.dumps({"train": {"epochs": 1, "max_tokens_per_batch": 256,
                                                  "micro_batches_per_step": 2, "lr": 1e-5, "zero_stage": 2,
                                                  "cpu_zero_stage": 0, "dynamic_filtering": False}}))
    tasks_config = work / "tasks.yaml"
    tasks_config.write_text(json.dumps({"tasks": {"train": [{"source": "mbpp", "split": "train", "limit": 2}],
                                                  "eval": [{"source": "humanevalfix", "limit": 2}]}}))
    stages: list[Stage] = []

    def stage(name: str, what: str, cmd: list[str] | None, *, needs: tuple[str, ...] = (), skip: str = "") -> None:
        failed_before = [s.name for s in stages if s.name in needs and s.status != "ok"]
        if skip or failed_before:
            stages.append(Stage(name, "skipped", 0.0, skip or f"needs {', '.join(failed_before)}"))
            return
        start = time.perf_counter()
        ok, said = _run(cmd, args.timeout, env)
        said = "" if said[:1] in "└┘─│" else said  # a table's last border says nothing
        shown = f"{what}; {said}" if ok and said else what if ok else said  # the command's own summary line
        stages.append(Stage(name, "ok" if ok else "failed", time.perf_counter() - start, shown))

    stage("checkpoint", "tiny Qwen2 + tokenizer", [*cli, "model", "init", "--out", str(ckpt), "--size", "tiny",
                                                    "--force"])
    generator = "transformers (CPU)" if args.cpu else "vLLM RunInference handler"
    stage("round", f"2 MBPP tasks x 4 rollouts x 2 turns via {generator}",
          [*cli, "pipeline", "run", "--config", str(tasks_config), *common, *backend], needs=("checkpoint",))
    update_round = work / "update_round"
    if stages[-1].status == "ok":
        from pipeline.schema import read_manifest

        counts = read_manifest(round_dir).row_counts
        stages[-1].what += (f"; {counts['trajectories']} rollouts, {counts['steps']} steps; update input: "
                            f"{signal_round(round_dir, update_round)} with advantages +-1")
    zero = "ZeRO-0 on DeepSpeed's CPU accelerator" if args.cpu else "DeepSpeed ZeRO-2, 1 GPU"
    stage("update", f"one policy update, {zero}",
          [*cli, "train", "--round", str(update_round), "--policy", str(ckpt), "--out", str(work / "policy_1"),
           "--config", str(train_config)], needs=("round",))
    nproc = 2 if args.cpu else gpus
    stage("update_dp", f"the same update, data parallel over {nproc} {'processes' if args.cpu else 'GPUs'}",
          [python, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", "-m", "workflows.cli",
           "train", "--round", str(update_round), "--policy", str(ckpt), "--out", str(work / "policy_dp"),
           "--config", str(train_config)],
          needs=("round",), skip="" if nproc > 1 else "one GPU: nothing to run data parallel")
    online = ["--set", f"online.pretrain={ckpt}", "--set", f"online.save_path={work / 'online' / 'final'}",
              "--set", f"online.ckpt_path={work / 'online' / 'ckpt'}", "--set", f"online.work_dir={work / 'online'}",
              "--set", "online.actor_num_gpus_per_node=1", "--set", "online.ref_num_gpus_per_node=1",
              "--set", "online.vllm_num_engines=1", "--set", "online.vllm_gpu_memory_utilization=0.3",
              "--set", "online.rollout_batch_size=1", "--set", "online.micro_rollout_batch_size=2",
              "--set", "online.train_batch_size=4", "--set", "online.micro_train_batch_size=2",
              "--set", "online.max_len=512", "--set", "online.attn_implementation=sdpa",
              "--set", "online.save_steps=-1", "--set", "pipeline.samples_per_task=2",
              "--set", "episode.max_turns=2", "--set", "episode.max_response_tokens=64",
              "--set", "policy.max_new_tokens=64"]
    online_config = work / "online.yaml"  # the GPU preset with two training tasks
    preset = yaml.safe_load((ROOT / "configs" / "gpu_online.yaml").read_text())
    preset["tasks"] = json.loads(tasks_config.read_text())["tasks"]
    online_config.write_text(yaml.safe_dump(preset, sort_keys=False))
    stage("online", "2 steps of online mode: OpenRLHF Ray PPO + vLLM + the DiDPO estimator",
          [python, "-m", "training.online", "--config", str(online_config), "--set", f"run.root={work / 'runs'}",
           *online], needs=("checkpoint",), skip="needs CUDA GPUs, Ray and vLLM" if args.cpu else "")

    print(f"gpu_check ({'CPU backends' if args.cpu else f'{gpus} GPU(s)'}; work folder {work})")
    print(f"{'stage':<12}{'status':<9}{'seconds':>8}  what")
    for s in stages:
        print(f"{s.name:<12}{s.status:<9}{s.seconds:>8.1f}  {s.what[:200]}")
    failed = [s.name for s in stages if s.status == "failed"]
    total = sum(s.seconds for s in stages)
    print(f"gpu_check: {'FAILED ' + ', '.join(failed) if failed else 'ok'} in {total:.0f} s")
    if not args.work and not failed:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
