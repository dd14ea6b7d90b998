"""`didpo model`: build and inspect policy checkpoints.

didpo model init --out DIR [--size tiny|small] [--seed N] [--force]   random-weight Qwen2 checkpoint
didpo model info DIR                                                  what a checkpoint directory holds
didpo model pretrain --out DIR [--config F --set pretrain.x=y]        the base policy, from scratch (CPU)
"""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pipeline.policy.loading import CheckpointError, check_checkpoint, checkpoint_parameters, load_tokenizer
from pipeline.policy.tiny import SIZES, build_checkpoint
from workflows.errors import UserError
from workflows.options import ConfigOpt, SetOpt, load_or_exit

SizeName = Enum("SizeName", {name: name for name in SIZES}, type=str)  # --size choices, from the presets

model_app = typer.Typer(no_args_is_help=True, help="Build and inspect policy checkpoints.")


@model_app.command("init")
def init(
    out: Annotated[Path, typer.Option("--out", help="checkpoint directory to create")],
    size: Annotated[SizeName, typer.Option("--size", help="size preset")] = SizeName["tiny"],
    seed: Annotated[int, typer.Option("--seed", min=0, help="weight initialisation seed")] = 0,
    force: Annotated[bool, typer.Option("--force", help="replace an existing non-empty directory")] = False,
) -> None:
    """Train a tokenizer on the bundled tasks and save a random-weight Qwen2 model with it."""
    start = time.perf_counter()
    try:
        info = build_checkpoint(out, size=size.value, seed=seed, overwrite=force)
    except FileExistsError as e:
        raise UserError(str(e)) from None
    typer.echo(
        f"built {info.size} checkpoint in {info.path} ({time.perf_counter() - start:.1f} s, seed {info.seed})"
    )
    typer.echo(f"parameters: {info.n_parameters:,}")
    typer.echo(
        f"vocab: {info.vocab_size} tokens; special: "
        + ", ".join(f"{tok}={i}" for tok, i in info.special_token_ids.items())
    )
    typer.echo("files: " + ", ".join(info.files))


@model_app.command("info")
def info(path: Annotated[Path, typer.Argument(help="checkpoint directory")]) -> None:
    """Architecture, parameter count, vocabulary and special tokens of a checkpoint directory."""
    try:
        root = check_checkpoint(path)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    config = json.loads((root / "config.json").read_text())
    tokenizer = load_tokenizer(root)
    special = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in tokenizer.all_special_tokens}
    rows = [
        ("path", str(root)),
        ("architecture", ", ".join(config.get("architectures") or [config.get("model_type", "?")])),
        ("layers x hidden", f"{config.get('num_hidden_layers')} x {config.get('hidden_size')}"),
        ("heads (kv)", f"{config.get('num_attention_heads')} ({config.get('num_key_value_heads')})"),
        ("dtype", str(config.get("dtype") or config.get("torch_dtype"))),
        ("parameters", f"{checkpoint_parameters(root):,}"),
        ("vocab", f"{len(tokenizer)} tokens (model rows {config.get('vocab_size')})"),
        ("special", ", ".join(f"{tok}={i}" for tok, i in special.items())),
        ("eos / pad", f"{tokenizer.eos_token} / {tokenizer.pad_token}"),
        ("chat template", "yes" if tokenizer.chat_template else "no"),
        ("files", ", ".join(sorted(p.name for p in root.iterdir()))),
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")


@model_app.command("pretrain")
def pretrain(
    out: Annotated[Path, typer.Option("--out", help="work folder: stages/ (resumable) and final/ (the base)")],
    config: Path | None = ConfigOpt,
    overrides: list[str] = SetOpt,
    threads: Annotated[int, typer.Option("--threads", min=1, help="torch CPU threads")] = 1,
) -> None:
    """Build a model from scratch and pretrain it to copy from its context (docs/pretraining.md)."""
    import os
    import shlex
    import sys

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from pipeline.policy.loading import CheckpointError
    from pipeline.telemetry import configure
    from training.pretrain import pretrain as run_pretrain

    cfg = load_or_exit(config, overrides)
    configure(cfg.logging.level)
    torch.set_num_threads(threads)
    command = "didpo " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        report = run_pretrain(cfg.pretrain, out, command=command)
    except (ValueError, FileExistsError, CheckpointError) as e:
        raise UserError(str(e)) from None
    for stage in report["stages"]:
        typer.echo(f"stage {stage['name']}: {stage['steps']} steps on {stage['files']} files, "
                   f"loss {stage['first_loss']:.3f} -> {stage['end_loss']:.3f} (median of its last steps)")

    def ability(name: str, res: dict) -> str:  # a teacher-forced quote: the line found, then copied
        rest = f" located, {res['copy']:.2f} of the rest copied" if "copy" in res else ""
        return f"{name} {res['accuracy']:.2f}{rest}"

    held = ", ".join(ability(k, v) for k, v in report["held_out"].items())
    typer.echo(f"base policy: {report['parameters']:,} parameters in {out / 'final'}; held-out copying: {held}")
