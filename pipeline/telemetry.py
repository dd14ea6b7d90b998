"""One logging facade for every stage: console (rich), a JSONL metrics file, optional TensorBoard, progress bars.

    log = get_logger(__name__)                      # console messages
    metrics = MetricsLog(run_dir, tensorboard=True)  # numbers over steps, one JSON object per line
    metrics.log("train", step=3, loss=0.12)
    for x in progress(items, "rollouts"): ...       # a progress bar on every long loop
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.logging import RichHandler
from tqdm.auto import tqdm

T = TypeVar("T")
_CONFIGURED = False


# Messages third-party libraries print on import or load that say nothing about the user's run.
_NOISE = ("The pynvml package is deprecated", "Failed to import GCSFileSystem", "apitools not found")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_NOISE)


class _DropPrefetchTasks(logging.Filter):
    """fsspec's read-ahead prefetcher (gcsfs's default for reads) leaves a finished producer task behind each
    closed remote file, which asyncio reports at garbage collection as an error; nothing was lost."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "PrefetchProducer" not in record.getMessage()


class _ErrorsOnly(logging.Filter):
    """For a library that resets its logger's level when imported (DeepSpeed): a filter stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def quiet_third_parties() -> None:
    """Third-party import and load noise off (the CLI's default; `didpo --verbose` keeps it): the pynvml
    deprecation warning torch prints, Beam's notes that the GCS filesystem or apitools is missing, DeepSpeed's
    accelerator guess, and the weight-loading progress bars of transformers. Our own bars and logs stay."""
    import warnings

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' bars follow huggingface_hub's
    warnings.filterwarnings("ignore", message=_NOISE[0])
    logging.getLogger().addFilter(_DropNoise())  # Beam logs through the root logger at import
    logging.getLogger("DeepSpeed").addFilter(_ErrorsOnly())  # its accelerator guess, at import
    logging.getLogger("asyncio").addFilter(_DropPrefetchTasks())


def configure(level: str = "INFO") -> None:
    """Route the root logger through rich, on stderr, once (idempotent); quiet noisy third-party loggers.
    stderr: a command's stdout is its output (`didpo exec` prints JSON, `config show` YAML), never logs."""
    global _CONFIGURED
    root = logging.getLogger()
    root.setLevel(level.upper())
    if not _CONFIGURED:
        handler = RichHandler(console=Console(stderr=True), rich_tracebacks=False, show_path=False, markup=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(handler)
        for noisy in ("apache_beam", "urllib3", "filelock", "datasets", "torch.distributed", "DeepSpeed", "fsspec",
                      "gcsfs"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        _CONFIGURED = True


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


def progress(items: Iterable[T], desc: str, total: int | None = None, **kwargs: Any) -> Iterator[T]:
    """A progress bar (stderr) over `items`; silent when DIDPO_PROGRESS=0 (tests, CI logs)."""
    return iter(progress_bar(desc, total, iterable=items, **kwargs))


def progress_bar(desc: str, total: int | None, *, disable: bool = False, **kwargs: Any) -> tqdm:
    """A progress bar (stderr) advanced by hand (`bar.update(n)`, closed by `with`): for loops whose units of
    work finish out of step with the loop (rollouts ending at different turns). Silent when DIDPO_PROGRESS=0
    or `disable`."""
    disable = disable or os.environ.get("DIDPO_PROGRESS", "1") == "0"
    return tqdm(desc=desc, total=total, disable=disable, dynamic_ncols=True, file=sys.stderr, mininterval=0.5,
                **kwargs)


class MetricsLog:
    """Append-only metrics: `<dir>/metrics.jsonl` (always) and TensorBoard event files (optional).

    Each record is {"ts": unix time, "scope": ..., "step": ..., <metric>: <number>}; non-finite values are
    written as null so the file stays valid JSON.
    """

    def __init__(self, directory: str | Path, *, tensorboard: bool = False) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # optional, heavy import

            self._tb = SummaryWriter(str(self.dir / "tensorboard"))

    def log(self, scope: str, step: int, **metrics: float) -> None:
        clean = {k: (float(v) if v is not None and math.isfinite(float(v)) else None) for k, v in metrics.items()}
        record = {"ts": round(time.time(), 3), "scope": scope, "step": step, **clean}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._tb.add_scalar(f"{scope}/{k}", v, step)

    def read(self, scope: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [r for r in rows if scope is None or r["scope"] == scope]

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
