"""The one task type every source loads into.

A `Task` is everything an episode needs and nothing a loader format leaks: the files the agent starts from,
the tests it may see, the tests that decide its reward, and a reference solution kept for SFT and checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

Split = Literal["train", "validation", "test"]
SuiteKind = Literal["check", "pytest", "io"]


def _frozen(mapping: dict[str, str] | MappingProxyType) -> MappingProxyType:
    return mapping if isinstance(mapping, MappingProxyType) else MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class TestSuite:
    """A set of tests and how to run them against a workspace.

    kind:
      - "check":  `files` hold Python that defines `check(candidate)` (HumanEval style asserts); the harness
                  imports `module`, takes `entry_point` from it and calls `check(entry_point)` per assert.
      - "pytest": `files` are pytest test modules placed beside the workspace (Exercism).
      - "io":     `inputs` are argument lists (plain JSON data); the harness calls `entry_point(*args)` in the
                  sandbox and the outputs are compared outside it with the reference's outputs (tolerance `atol`).
    """

    __test__ = False  # not a pytest class, despite the name

    kind: SuiteKind
    files: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # path -> source text
    entry_point: str | None = None  # function under test ("check" and "io")
    module: str | None = None  # workspace module that defines entry_point, e.g. "solution"
    inputs: tuple[Any, ...] = ()  # "io": one argument list per case
    atol: float = 0.0  # "io": absolute tolerance for float outputs

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", _frozen(self.files))
        object.__setattr__(self, "inputs", tuple(self.inputs))

    @property
    def n_cases(self) -> int:
        """Number of separately scored cases (io inputs, or test files/asserts as the loader counted them)."""
        return len(self.inputs) if self.kind == "io" else max(1, len(self.files))


@dataclass(frozen=True)
class Task:
    """One coding task, whatever its source format."""

    task_id: str  # globally unique, "<source>/<native id>", e.g. "humanevalfix/Python/0"
    source: str  # loader name: humaneval, humanevalplus, mbpp, mbppplus, humanevalfix, exercism
    split: Split  # train / validation / test; training and evaluation ids never mix
    instructions: str  # natural-language statement shown to the agent
    workspace: MappingProxyType  # path -> text: the files the agent starts from (stub or buggy code)
    visible_tests: TestSuite  # shown to the agent; their pass fraction is the graded step reward
    hidden_tests: TestSuite  # never shown; they decide the final outcome
    reference: MappingProxyType  # path -> text: a correct workspace (SFT and checks only, never shown)
    meta: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # source-specific extras

    def __post_init__(self) -> None:
        for name in ("workspace", "reference", "meta"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        if not self.task_id or "/" not in self.task_id:
            raise ValueError(f"task_id {self.task_id!r} must look like '<source>/<native id>'")
        if not self.workspace:
            raise ValueError(f"task {self.task_id}: empty workspace")
