"""The one task type every source loads into.

A `Task` is everything an episode needs and nothing a loader format leaks: the files the agent starts from,
the tests it may see, the tests that decide its reward, and a reference solution kept for SFT and checks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "validation", "test"]
SuiteKind = Literal["check", "pytest", "io"]


class FrozenMap(Mapping):
    """An immutable, hashable, picklable mapping (types.MappingProxyType cannot be pickled; Beam pickles tasks)."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(
                self, "_hash", hash(frozenset((k, _hashable(v)) for k, v in self._data.items()))
            )
        return self._hash

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is immutable")

    def __reduce__(self) -> tuple:
        return (FrozenMap, (self._data,))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


def _hashable(value: Any) -> Any:
    if isinstance(value, dict | FrozenMap):
        return frozenset((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


def frozen(mapping: Mapping | None) -> FrozenMap:
    """`mapping` as a FrozenMap (no copy if it already is one)."""
    return mapping if isinstance(mapping, FrozenMap) else FrozenMap(mapping)


@dataclass(frozen=True)
class TestSuite:
    """A set of tests and how to run them against a workspace.

    kind:
      - "check":  `files` hold Python that defines `check(candidate)` (HumanEval style asserts); the harness
                  imports `module`, takes `entry_point` from it and calls `check(entry_point)` per assert.
                  What the candidate returns must be plain data unless `objects` (a generator, a node).
      - "pytest": `files` are pytest test modules placed beside the workspace (Exercism).
      - "io":     `inputs` are argument lists (plain JSON data); the harness calls `entry_point(*args)` in the
                  sandbox and the outputs are compared outside it with the reference's outputs (tolerance `atol`).
    """

    __test__ = False  # not a pytest class, despite the name

    kind: SuiteKind
    files: FrozenMap = field(default_factory=FrozenMap)  # path -> source text
    entry_point: str | None = None  # function under test ("check" and "io")
    module: str | None = None  # workspace module that defines entry_point, e.g. "solution"
    inputs: tuple[Any, ...] = ()  # "io": one argument list per case
    atol: float = 0.0  # "io": absolute tolerance for float outputs
    objects: bool = False  # "check": the candidate may return objects (used through handles, as pytest does)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", frozen(self.files))
        object.__setattr__(self, "inputs", tuple(self.inputs))

    @property
    def n_cases(self) -> int:
        """Number of separately scored cases (io inputs, or test files/asserts as the loader counted them)."""
        return len(self.inputs) if self.kind == "io" else max(1, len(self.files))


@dataclass(frozen=True)
class Task:
    """One coding task, whatever its source format."""

    task_id: str  # globally unique, "<source>/<native id>", e.g. "humanevalfix/Python/0"
    source: str  # the task set's name: a bundled source (humaneval, mbpp, ...) or a task file's own
    split: Split  # train / validation / test; training and evaluation ids never mix
    instructions: str  # natural-language statement shown to the agent
    workspace: FrozenMap  # path -> text: the files the agent starts from (stub or buggy code)
    visible_tests: TestSuite  # shown to the agent; their pass fraction is the graded step reward
    hidden_tests: TestSuite  # never shown; they decide the final outcome
    reference: FrozenMap  # path -> text: a correct workspace (SFT and checks only, never shown)
    meta: FrozenMap = field(default_factory=FrozenMap)  # source-specific extras

    def __post_init__(self) -> None:
        for name in ("workspace", "reference", "meta"):
            object.__setattr__(self, name, frozen(getattr(self, name)))
        if not self.task_id or "/" not in self.task_id:
            raise ValueError(f"task_id {self.task_id!r} must look like '<source>/<native id>'")
        if not self.workspace:
            raise ValueError(f"task {self.task_id}: empty workspace")
