"""Isolated test execution: bubblewrap + rlimits, warm worker pool, and a judge the code cannot fool."""

from __future__ import annotations

from pipeline.sandbox.judge import EXEC_STATUSES, CaseResult, ExecResult, Judge
from pipeline.sandbox.pool import BWRAP, FALLBACK, InfraError, SandboxPool
from pipeline.sandbox.settings import SandboxSettings

__all__ = ["BWRAP", "EXEC_STATUSES", "FALLBACK", "CaseResult", "ExecResult", "InfraError", "Judge",
           "SandboxPool", "SandboxSettings"]
