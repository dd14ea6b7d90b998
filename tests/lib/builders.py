"""Synthetic inputs shared by the tests and the benchmarks: steps-table rows, advantage rows, credit-stage
`StepInput`s with exact token offsets, a chat tokenizer stub, and a benchmark script loaded as a module.

pytest puts this folder on `sys.path` (`pythonpath` in pyproject.toml), so a test writes
`from builders import step_row`; a benchmark script inserts the folder itself. (Never `import tests...`:
OpenRLHF's wheel installs a top-level `tests` package.)
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- steps and advantages tables


def step_row(
    row_id: str,
    traj_id: str,
    task_id: str,
    *,
    turn: int = 0,
    prompt_token_ids: Sequence[int] = (1, 2, 3),
    response_token_ids: Sequence[int],
    response_text: str | None = None,
    token_char_starts: Sequence[int] | None = None,
    token_char_ends: Sequence[int] | None = None,
    behavior_logprobs: Sequence[float] | None = None,
    **fields,
) -> dict:
    """One row of the `steps` table (a dict in the contract's column order).

    By default every response token spells one character of `response_text` ("x" per token), the behaviour
    log-probabilities are -1.0, and the step is a successful edit with no files, reward 0, not done; `fields`
    replace any other column (round, action_kind, action_status, action_json, files_before, files_after,
    workspace_hash_before, workspace_hash_after, exec_status, visible_passed, visible_total, step_reward,
    return_to_go, done, failing_cases).
    """
    n = len(response_token_ids)
    row = dict(
        row_id=row_id,
        traj_id=traj_id,
        task_id=task_id,
        round=0,
        turn=turn,
        prompt_token_ids=list(prompt_token_ids),
        response_token_ids=list(response_token_ids),
        response_text="x" * n if response_text is None else response_text,
        token_char_starts=list(range(n)) if token_char_starts is None else list(token_char_starts),
        token_char_ends=list(range(1, n + 1)) if token_char_ends is None else list(token_char_ends),
        behavior_logprobs=[-1.0] * n if behavior_logprobs is None else list(behavior_logprobs),
        action_kind="edit",
        action_status="ok",
        action_json="{}",
        files_before=[],
        files_after=[],
        workspace_hash_before="a",
        workspace_hash_after="b",
        exec_status="passed",
        visible_passed=1,
        visible_total=1,
        step_reward=0.0,
        return_to_go=0.0,
        done=False,
        failing_cases=[],
    )
    unknown = set(fields) - set(row)
    if unknown:
        raise TypeError(f"step_row: no such column(s) {sorted(unknown)}")
    row.update(fields)
    return row


def advantage_row(
    row_id: str,
    traj_id: str,
    task_id: str,
    token_advantages: Sequence[float],
    *,
    estimator: str = "grpo",
    lam: float = 0.0,
    episode_advantage: float = 0.0,
    n_diff_tokens: int = 0,
) -> dict:
    """One row of the `advantages` table; every response token is in the loss."""
    return dict(
        row_id=row_id,
        traj_id=traj_id,
        task_id=task_id,
        estimator=estimator,
        lam=lam,
        episode_advantage=episode_advantage,
        token_advantages=list(token_advantages),
        loss_mask=[1] * len(token_advantages),
        n_diff_tokens=n_diff_tokens,
    )


def write_steps_and_advantages(root: Path, steps: list[dict], advantages: list[dict]) -> Path:
    """Write a round's `steps` and `advantages` tables under `root` (what the trainer reads)."""
    from pipeline.schema import table_dir, write_table

    write_table(steps, table_dir(root, "steps"), "steps")
    write_table(advantages, table_dir(root, "advantages"), "advantages")
    return root


# ---------------------------------------------------------------- credit-stage inputs

_TOKENS = re.compile(r"\w+|\s+|[^\w\s]")


def offsets(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-token char offsets of a simple tokenizer (words, whitespace runs, punctuation)."""
    spans = [(m.start(), m.end()) for m in _TOKENS.finditer(text)]
    return np.array([s for s, _ in spans], np.int64), np.array([e for _, e in spans], np.int64)


def line_offsets(text: str) -> tuple[np.ndarray, np.ndarray]:
    """One token per line (newline included): a fast tokenizer for huge responses."""
    ends = np.flatnonzero(np.frombuffer(text.encode("utf-32-le"), np.uint32) == 10) + 1
    ends = np.append(ends, len(text)) if len(ends) == 0 or ends[-1] != len(text) else ends
    return np.concatenate([[0], ends[:-1]]).astype(np.int64), ends.astype(np.int64)


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
):
    """A `StepInput` applying `edits` = [(op, path, search, replace)] to `files`; returns it and the files
    after.

    op "replace": first occurrence of search -> replace; "insert": append replace; "write": whole file.
    The response is a tiny action markup; token offsets come from `tokenizer` (default `offsets`).
    """
    from pipeline.credit import Edit, StepInput

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


def same_function_batch() -> list:
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


# ---------------------------------------------------------------- steps-table rows that rewrite a file

STUB = "def add(a, b):\n    pass\n"
FIX = "def add(a, b):\n    total = a + b\n    return total\n"
OTHER = "def add(a, b):\n    return b - a\n"


def rewrite_step(task_id: str, sample: int, code: str, reward: float, turn: int = 0):
    """A steps-table row whose response rewrites solution.py with `code` (parsed and applied by the real
    grammar), as a `schema.StepRow`."""
    from pipeline import schema
    from pipeline.agent.episode import workspace_hash
    from pipeline.agent.grammar import apply_action, parse_response
    from pipeline.rollout import row_id

    response = f"<think>rewrite it</think>\n<write path=\"solution.py\">\n{code}</write>"
    action = parse_response(response)
    before = {"solution.py": STUB}
    after = apply_action(action, before, max_file_bytes=1 << 20)
    traj = f"traj-{task_id}-{sample}"
    # one character per token (step_row's default offsets) keeps the offsets trivially exact
    return schema.StepRow(**step_row(
        row_id(traj, turn), traj, task_id, turn=turn, prompt_token_ids=[1], response_token_ids=[5] * len(response),
        response_text=response, action_kind="write", action_json=_schema_json(action),
        files_before=[{"path": "solution.py", "text": STUB}],
        files_after=[{"path": "solution.py", "text": after["solution.py"]}],
        workspace_hash_before=workspace_hash(before), workspace_hash_after=workspace_hash(after),
        exec_status="passed" if reward else "failed", visible_passed=int(reward),
        step_reward=reward, return_to_go=reward, done=True,
    ))


def _schema_json(action) -> str:
    from pipeline.agent.grammar import action_json

    return action_json(action)


# ---------------------------------------------------------------- test doubles and benchmark scripts


class ChatTokenizerStub:
    """A tokenizer's two calls an episode makes: one id per character (first 64), the chat turns joined."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + (ord(ch) % 50) for ch in text[:64]] or [1]}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        return "\n".join(m["content"] for m in messages)


def load_benchmark(name: str, module_name: str) -> ModuleType:
    """benchmarks/<name>.py imported as the module `module_name` (registered in sys.modules first:
    dataclasses look their module up while the class is built)."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def random_round(
    root: Path,
    vocab: int,
    *,
    n_rows: int = 6,
    seed: int = 0,
    lam: float = 0.0,
    estimator: str = "grpo",
    diff_adv: float = 0.0,
) -> Path:
    """A round the trainer can read: steps + advantages with random token ids (two turns per trajectory, four
    rows per task), token_adv = A^E + lam * A^D, A^E per trajectory, A^D on every other token."""
    from pipeline.schema import content_id

    rng = np.random.default_rng(seed)
    steps, advs = [], []
    for i in range(n_rows):
        traj, task = content_id("traj", i // 2), f"t/{i // 4}"
        p, r = int(rng.integers(4, 10)), int(rng.integers(4, 10))
        row_id = content_id(traj, i)
        a_e = float(rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5))
        a_d = np.where(np.arange(r) % 2 == 0, diff_adv, 0.0)
        token_adv = (np.float32(a_e) + np.float32(lam) * a_d.astype(np.float32)).astype(np.float32)
        steps.append(
            step_row(
                row_id,
                traj,
                task,
                turn=i % 2,
                prompt_token_ids=rng.integers(3, vocab, p).tolist(),
                response_token_ids=rng.integers(3, vocab, r).tolist(),
                behavior_logprobs=[-5.0] * r,
                return_to_go=float(i),
            )
        )
        advs.append(
            advantage_row(
                row_id,
                traj,
                task,
                token_adv.tolist(),
                estimator=estimator,
                lam=lam,
                episode_advantage=a_e,
                n_diff_tokens=int((a_d != 0).sum()),
            )
        )
    return write_steps_and_advantages(root, steps, advs)
