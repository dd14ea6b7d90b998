"""Sandbox configuration: limits of one execution, the pool, and whether a weaker fallback is acceptable."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MiB = 1024 * 1024


class SandboxSettings(BaseModel):
    """Limits apply to every process that runs untrusted code (rlimits are per process; NPROC per uid)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(10.0, description="wall-clock deadline of one execution, seconds")
    reference_timeout_s: float = Field(
        60.0, description="wall-clock deadline of a task's own reference run (an io suite's expected outputs; "
        "trusted code, once per judge and task), seconds, never below timeout_s: a box under load slows the "
        "reference too, and a reference cut off at the candidates' deadline makes every run of the task infra_error")
    cpu_s: int = Field(10, description="RLIMIT_CPU per process, seconds")
    memory_bytes: int = Field(1024 * MiB, description="RLIMIT_AS per process, bytes")
    max_processes: int = Field(32, description="RLIMIT_NPROC per sandbox uid")
    file_size_bytes: int = Field(16 * MiB, description="RLIMIT_FSIZE, bytes")
    open_files: int = Field(256, description="RLIMIT_NOFILE")
    workspace_bytes: int = Field(64 * MiB, description="size of the private workspace tmpfs, bytes")
    tmp_bytes: int = Field(64 * MiB, description="size of the private /tmp (and /dev/shm) tmpfs, bytes")
    output_keep_bytes: int = Field(64 * 1024, description="stdout/stderr kept per stream, bytes")
    output_kill_bytes: int = Field(16 * MiB, description="total output after which the run is killed, bytes")
    pool_size: int = Field(2, description="warm sandbox workers (one execution at a time each)")
    isolation: Literal["bwrap", "rlimits"] = Field(
        "bwrap", description="bwrap: namespace isolation, refuse to run untrusted code without it; rlimits: a "
        "separate process with rlimits only, no filesystem or network isolation (development machines only; "
        "named in every result)")
    bwrap_path: str = Field("bwrap", description="bubblewrap executable")
    uid_base: int = Field(61000, description="first uid of the range slots claim pairs from (tests uid_base+2j, "
                          "code uid_base+2j+1; a pair is held by one slot of one process at a time)")
    infra_retries: int = Field(1, description="re-runs of an execution whose sandbox failed (infra_error)")
    preload: tuple[str, ...] = Field(
        ("collections", "itertools", "functools", "math", "re", "string", "heapq", "bisect", "random", "copy",
         "typing", "fractions", "decimal", "statistics", "datetime", "hashlib", "json", "pytest"),
        description="modules imported once per worker so each execution forks with them warm",
    )

    @field_validator("timeout_s", "reference_timeout_s")
    @classmethod
    def _positive_float(cls, v: float, info) -> float:
        if not v > 0:
            raise ValueError(f"{info.field_name} must be > 0 seconds, got {v}")
        return v

    @field_validator("cpu_s", "max_processes", "open_files", "pool_size")
    @classmethod
    def _positive_int(cls, v: int, info) -> int:
        if v < 1:
            raise ValueError(f"{info.field_name} must be >= 1, got {v}")
        return v

    @field_validator("memory_bytes", "file_size_bytes", "workspace_bytes", "tmp_bytes", "output_keep_bytes")
    @classmethod
    def _at_least_64k(cls, v: int, info) -> int:
        if v < 64 * 1024:
            raise ValueError(f"{info.field_name} must be >= 65536 bytes, got {v}")
        return v

    @field_validator("uid_base")
    @classmethod
    def _uid_range(cls, v: int) -> int:
        if not 1000 <= v <= 2**31 - 2**16:
            raise ValueError(f"uid_base must be a non-system uid in [1000, 2^31 - 65536], got {v}")
        return v

    @field_validator("infra_retries")
    @classmethod
    def _retries(cls, v: int) -> int:
        if not 0 <= v <= 5:
            raise ValueError(f"infra_retries must be in [0, 5], got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SandboxSettings:
        if self.output_kill_bytes < self.output_keep_bytes:
            raise ValueError(
                f"output_kill_bytes ({self.output_kill_bytes}) must be >= output_keep_bytes "
                f"({self.output_keep_bytes})"
            )
        return self

    def limits(self) -> dict[str, int]:
        """The rlimits the worker applies, as the worker's config expects them."""
        return {
            "cpu_s": self.cpu_s,
            "memory_bytes": self.memory_bytes,
            "max_processes": self.max_processes,
            "file_size_bytes": self.file_size_bytes,
            "open_files": self.open_files,
        }
