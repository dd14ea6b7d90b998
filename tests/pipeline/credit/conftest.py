"""Builders of credit-stage inputs for tests: a tiny action markup and a regex tokenizer with offsets."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pipeline.credit import Edit, StepInput

_TOKENS = re.compile(r"\w+|\s+|[^\w\s]")


def offsets(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-token char offsets of a simple tokenizer (words, whitespace runs, punctuation)."""
    spans = [(m.start(), m.end()) for m in _TOKENS.finditer(text)]
    return np.array([s for s, _ in spans], np.int64), np.array([e for _, e in spans], np.int64)


def build_step(
    row_id: str,
    traj_id: str,
    task_id: str,
    turn: int,
    reward: float,
    files: dict[str, str],
    edits: list[tuple[str, str, str, str]],
    think: str = "let me fix it",
    workspace_hash: str = "",
    tokenizer=None,
) -> tuple[StepInput, dict[str, str]]:
    """A step applying `edits` = [(op, path, search, replace)] to `files`; returns it and the files after.

    op "replace": first occurrence of search -> replace; "insert": append replace; "write": whole file.
    """
    response = f"<think>{think}</think>\n"
    after = dict(files)
    parsed = []
    for op, path, search, replace in edits:
        response += f'<edit op="{op}" path="{path}">\n'
        search_span = None
        if op == "replace":
            response += "<search>\n"
            search_span = (len(response), len(response) + len(search))
            response += search + "</search>\n"
        response += "<replace>\n"
        replace_span = (len(response), len(response) + len(replace))
        response += replace + "</replace>\n</edit>\n"
        old = after.get(path, "")
        if op == "replace":
            assert search in old, (search, old)
            after[path] = old.replace(search, replace, 1)
        elif op == "insert":
            after[path] = old + replace
        else:
            after[path] = replace
        parsed.append(Edit(op, path, search, replace, search_span, replace_span))
    starts, ends = (tokenizer or offsets)(response)
    touched = {e[1] for e in edits}
    step = StepInput(
        row_id=row_id,
        traj_id=traj_id,
        task_id=task_id,
        turn=turn,
        step_reward=reward,
        response_text=response,
        token_char_starts=starts,
        token_char_ends=ends,
        edits=tuple(parsed),
        files_before={p: files[p] for p in touched if p in files},
        files_after={p: after[p] for p in touched if p in after},
        workspace_hash_before=workspace_hash,
    )
    return step, after


FUNCTION = '''def running_max(values):
    """Largest value seen so far, for each position."""
    result = []
    best = None
    for value in values:
        if best is None or value > best:
            best = value
        result.append(best)
    return result
'''


@pytest.fixture
def same_function_batch():
    """Four single-step rollouts of one task, episode rewards [1, 1, 0, 0], all writing FUNCTION."""
    steps = []
    for k, reward in enumerate([1.0, 1.0, 0.0, 0.0]):
        step, _ = build_step(
            f"r{k}",
            f"t{k}",
            "demo/0",
            0,
            reward,
            {"solution.py": "# stub\n"},
            [("write", "solution.py", "", FUNCTION)],
            think=f"attempt {k}: write the function",
        )
        steps.append(step)
    return steps


def line_offsets(text: str) -> tuple[np.ndarray, np.ndarray]:
    """One token per line (newline included): a fast tokenizer for huge responses."""
    ends = np.flatnonzero(np.frombuffer(text.encode("utf-32-le"), np.uint32) == 10) + 1
    ends = np.append(ends, len(text)) if len(ends) == 0 or ends[-1] != len(text) else ends
    return np.concatenate([[0], ends[:-1]]).astype(np.int64), ends.astype(np.int64)


@pytest.fixture
def fast_tokenizer():
    return line_offsets


@pytest.fixture
def make_step():
    """The `build_step` builder (test modules cannot import conftest under --import-mode=importlib)."""
    return build_step


@pytest.fixture
def function_src():
    return FUNCTION


@pytest.fixture
def tokenize_offsets():
    return offsets
