"""Demonstrations for the cold-start SFT: every training task's reference solution becomes a short successful
repair episode in the action grammar, played through the real `Episode` (so each prompt is exactly the text
the pipeline shows at that turn). Kinds, drawn per task from a seeded mix:
  write   one turn, <write> of the whole solution
  edit    one turn, search/replace blocks, one per hunk of the stub -> solution diff
  append  one turn, <append> of the body (only where the solution extends the stub at its end)
  repair  turn 1 writes the solution with one mutated line, the tests fail, turn 2 fixes that line
and a solved episode may go on with a <finish/> turn. Only correct turns become training examples (the
mutated first turn of a repair is context, never a target).

Outcomes are replayed, not executed (`ReplayExecutor`): the reference passes, anything else fails. Pass the
real `Judge` as `executor` to show real test output instead. Optionally each response is repeated with only
the assistant header as prompt (`unconditioned_examples`): cheap extra signal on the grammar.

Training on these rows is `training.sft.train_sft` (the one loop of training/loop.py).
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.agent.episode import Episode
from pipeline.agent.grammar import Action, Edit, render_action
from pipeline.agent.settings import EpisodeSettings
from pipeline.sandbox.judge import CaseResult, ExecResult
from pipeline.tasks.base import Task
from training.sft_settings import DEFAULT_MIX, EPISODE_KINDS

# ---- demonstrations ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SftExample:
    """One supervised row: a prompt as the pipeline renders it and the demonstrated response."""

    task_id: str
    kind: str  # episode kind (write / edit / append / repair) or "finish" for a closing <finish/> turn
    turn: int  # 0-based turn of the episode this response answers
    prompt_ids: tuple[int, ...]  # tokenizer(render_prompt(...), add_special_tokens=False)
    response_ids: tuple[int, ...]  # tokens of response_text followed by the eos id
    response_text: str  # the rendered action (canonical grammar), without eos
    previous: tuple[str, ...] = ()  # responses of the earlier turns (context only), to replay the episode


def solution_files(task: Task) -> dict[str, str]:
    """The workspace the demonstrations reach: the start files overlaid with the reference, each file ending
    in a newline (so closing tags sit on their own line; tests pass the same)."""
    files = dict(task.workspace)
    for path, text in task.reference.items():
        files[path] = text if text.endswith("\n") or not text else text + "\n"
    return files


class ReplayExecutor:
    """Known outcomes without running code: a workspace equal to `solution_files(task)` passes every case,
    any other fails its first case (an AssertionError, as the check harness reports it)."""

    def run(self, task: Task, files: Mapping[str, str], *, hidden: bool = False) -> ExecResult:
        suite = task.hidden_tests if hidden else task.visible_tests
        total = suite.n_cases
        names = _case_names(suite.files) or [f"case {i}" for i in range(total)]
        names = (names + [f"case {i}" for i in range(len(names), total)])[:total]
        if dict(files) == solution_files(task):
            cases = tuple(CaseResult(n, True) for n in names)
            return ExecResult("passed", total, total, 0.0, "replay", cases)
        cases = tuple(CaseResult(n, i != 0, "" if i else "AssertionError") for i, n in enumerate(names))
        return ExecResult("failed", total - 1, total, 0.0, "replay", cases)


def _case_names(test_files: Mapping[str, str]) -> list[str]:
    """'check_00.py:8: assert candidate(13,9) == True' per assert line, as the sandbox names check cases."""
    names = []
    for path in sorted(test_files):
        for n, line in enumerate(test_files[path].splitlines(), 1):
            if line.strip().startswith("assert "):
                names.append(f"{path}:{n}: {line.strip()}")
    return names


def search_replace_edits(path: str, old: str, new: str) -> list[Edit]:
    """Search/replace blocks turning `old` into `new`, one per diff hunk, applied in order.

    Each block's search text is the hunk's old lines plus the fewest surrounding lines that make it occur
    exactly once in the file as it is when the block applies (a pure insertion needs at least one).
    """
    edits: list[Edit] = []
    current = old
    while current != new:
        a, b = current.splitlines(keepends=True), new.splitlines(keepends=True)
        tag, i1, i2, j1, j2 = next(op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
                                   if op[0] != "equal")
        lo, hi = i1, i2
        grow_up = True
        while not (hi > lo and _occurs_once("".join(a[lo:hi]), current)):
            if (grow_up and lo > 0) or hi >= len(a):
                lo -= 1
            else:
                hi += 1
            grow_up = not grow_up
            if lo < 0:  # the whole file is not unique in itself: impossible, but never loop
                raise ValueError(f"{path}: no unique search text for the hunk at line {i1 + 1}")
        search = "".join(a[lo:hi])
        replace = "".join(a[lo:i1] + b[j1:j2] + a[i2:hi])
        edits.append(Edit("replace", path, search, replace, None, (0, 0)))
        current = current.replace(search, replace, 1)
    return edits


def _occurs_once(needle: str, text: str) -> bool:
    """Exactly one occurrence, overlapping ones included (str.count skips overlaps: "aa" in "aaa" is 1)."""
    first = text.find(needle)
    return first >= 0 and text.find(needle, first + 1) < 0


def mutate_line(text: str, candidates: Sequence[int], rng: random.Random,
                families: Sequence[str] | None = None) -> tuple[str, int] | None:
    """`text` with one bug of the repair catalogue (`pipeline.tasks.repair`, `families` or every family that
    keeps the line) on one of the candidate lines (0-based), the family drawn uniformly first; (mutated text,
    line) or None."""
    from pipeline.tasks.repair import FAMILIES, apply_bugs, bug_candidates

    wanted = {i + 1 for i in candidates}
    by_family: dict[str, list] = {}
    for bug in bug_candidates(text, tuple(families or (f for f in FAMILIES if f != "delete_line"))):
        if bug.line in wanted:
            by_family.setdefault(bug.family, []).append(bug)
    if not by_family:
        return None
    bug = rng.choice(by_family[rng.choice(sorted(by_family))])
    return apply_bugs(text, [bug]), bug.line - 1


_THINK = {
    "write": ("I write the whole of {path} with a complete `{name}`.",
              "`{name}` has no body yet. I will write the full file.",
              "Write {path} again, now with the implementation of `{name}`."),
    "edit": ("I add the body of `{name}` with a search/replace edit.",
             "`{name}` only has its signature and docstring. I replace the end of the docstring with it plus "
             "the body.",
             "Edit {path}: put the implementation of `{name}` below its docstring."),
    "append": ("{path} ends with the docstring of `{name}`. I append the body.",
               "Append the implementation of `{name}` to {path}.",
               "The body of `{name}` is missing; it goes at the end of {path}."),
    "bug": ("Line {line} of {path} is wrong; I fix it.",
            "The bug in `{name}` is on line {line}.",
            "Fix line {line} of {path}."),
    "fix": ("The visible test fails. Line {line} of {path} is wrong; I fix it.",
            "A test failed, so `{name}` has a bug. The mistake is on line {line}.",
            "Fix line {line} of {path}: it makes the test fail."),
    "finish": ("All visible tests pass. I finish.", "The tests pass; `{name}` is done.",
               "Visible tests: all passed. Finish."),
}


def _think(key: str, rng: random.Random, **values: Any) -> str:
    return rng.choice(_THINK[key]).format(**values) + "\n"


def bug_think(rng: random.Random, *, path: str, name: str, line: int) -> str:
    """A repair demonstration's think: which line (1-based) of `path` it fixes, in one of its wordings."""
    return _think("bug", rng, path=path, name=name, line=line)


def _action(kind: str, think: str, edits: Sequence[Edit]) -> str:
    return render_action(Action(kind, think, (0, 0), tuple(edits)))  # type: ignore[arg-type]


def _write_edits(before: Mapping[str, str], after: Mapping[str, str]) -> list[Edit]:
    return [Edit("write", p, "", after[p], None, (0, 0)) for p in sorted(after) if before.get(p) != after[p]]


def _edit_edits(before: Mapping[str, str], after: Mapping[str, str]) -> list[Edit]:
    edits: list[Edit] = []
    for p in sorted(after):
        if p not in before:
            edits.append(Edit("write", p, "", after[p], None, (0, 0)))
        elif before[p] != after[p]:
            edits += search_replace_edits(p, before[p], after[p])
    return edits


def _first_line(files: Mapping[str, str], edit: Edit) -> int:
    """The line (1-based) of `files` where `edit` starts: its search text's, or 1 for a whole-file write."""
    text = files.get(edit.path, "")
    at = text.find(edit.search) if edit.op == "replace" else -1
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def repair_line(before: Mapping[str, str], target: Mapping[str, str]) -> int:
    """The line (1-based) a repair demonstration's think names: where its first edit from `before` to
    `target` starts (for a deleted line, the line its search text starts on, next to the gap)."""
    return _first_line(before, _edit_edits(before, target)[0])


def _append_edits(before: Mapping[str, str], after: Mapping[str, str]) -> list[Edit] | None:
    changed = [p for p in sorted(after) if before.get(p) != after[p]]
    if not all(p in before and before[p].endswith("\n") and after[p].startswith(before[p]) for p in changed):
        return None
    return [Edit("insert", p, "", after[p][len(before[p]):], None, (0, 0)) for p in changed]


def _first_turn(kind: str, task: Task, target: dict[str, str], rng: random.Random,
                values: dict[str, Any]) -> tuple[str, str, int | None] | None:
    """(response, episode kind, mutated line or None) of turn 1, or None when `kind` does not fit the task."""
    before = dict(task.workspace)
    if kind == "write":
        return _action("write", _think("write", rng, **values), _write_edits(before, target)), "write", None
    if kind == "edit":
        edits = _edit_edits(before, target)
        if "bugs" in task.meta:  # a repair task: say where the bug is, not that a body is missing
            # repair_line's line, from the edits already made
            think = bug_think(rng, path=values["path"], name=values["name"], line=_first_line(before, edits[0]))
        else:
            think = _think("edit", rng, **values)
        return _action("edit", think, edits), "edit", None
    if kind == "append":
        edits = _append_edits(before, target)
        return None if edits is None else (_action("insert", _think("append", rng, **values), edits), "append", None)
    # repair: the first action reaches the solution but for one mutated line of the main file
    path = values["path"]
    old, new = before.get(path, ""), target[path]
    added = [j for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(),
                                                               autojunk=False).get_opcodes()
             if tag in ("replace", "insert") for j in range(j1, j2)]
    mutated = mutate_line(new, added, rng) if added else None
    if mutated is None:
        return None
    wrong = {**target, path: mutated[0]}
    edits = _write_edits(before, wrong) if rng.random() < 0.5 else _edit_edits(before, wrong)
    kind_first = "write" if all(e.op == "write" for e in edits) else "edit"
    return _action(kind_first, _think(rng.choice(("write", "edit")), rng, **values), edits), "repair", mutated[1]


def _main_path(task: Task, target: Mapping[str, str]) -> str:
    changed = [p for p in sorted(target) if task.workspace.get(p) != target[p]]
    if not changed:
        raise ValueError(f"task {task.task_id}: the reference equals the workspace, nothing to demonstrate")
    module = task.visible_tests.module
    return f"{module}.py" if module and f"{module}.py" in changed else changed[0]


def sft_examples(
    tasks: Sequence[Task],
    tokenizer: Any,
    episode_settings: EpisodeSettings,
    *,
    seed: int,
    mix: Mapping[str, float] = DEFAULT_MIX,
    finish_rate: float = 0.3,
    episodes_per_task: int = 1,
    executor: Any = None,
) -> list[SftExample]:
    """Demonstration rows of successful episodes on `tasks` (see the module docstring), in task order.

    Deterministic for given inputs and seed. A kind that does not fit a task (append onto a file the
    solution rewrites, repair without a line to mutate, a response the episode would count as truncated)
    falls back to the next kind in the order write, edit, append, repair that fits. `executor` defaults to
    `ReplayExecutor()`; the real `Judge` shows real test output (a mutation that still passes is then
    demonstrated as a solved first turn).
    """
    unknown = sorted(set(mix) - set(EPISODE_KINDS))
    if unknown or sum(mix.values()) <= 0 or any(w < 0 for w in mix.values()):
        raise ValueError(f"mix {dict(mix)} must weigh the kinds {EPISODE_KINDS} with weights >= 0, one > 0")
    if not 0.0 <= finish_rate <= 1.0:
        raise ValueError(f"finish_rate must be in [0, 1], got {finish_rate}")
    executor = executor if executor is not None else ReplayExecutor()
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token: responses could never stop")
    kinds = [k for k in EPISODE_KINDS if mix.get(k, 0) > 0]
    weights = [mix[k] for k in kinds]
    out: list[SftExample] = []
    for task in tasks:
        target = solution_files(task)
        path = _main_path(task, target)
        values = {"path": path, "name": task.meta.get("entry_point") or path}
        for e in range(episodes_per_task):
            rng = random.Random(f"{seed}|{task.task_id}|{e}")
            wanted = rng.choices(kinds, weights)[0]
            order = [wanted] + [k for k in EPISODE_KINDS if k != wanted]
            for kind in order:
                rows = _episode_rows(kind, task, target, rng, values, tokenizer, episode_settings, executor,
                                     finish_rate, eos)
                if rows is not None:
                    out += rows
                    break
    return out


def _episode_rows(kind, task, target, rng, values, tokenizer, settings, executor, finish_rate, eos):
    first = _first_turn(kind, task, target, rng, values)
    if first is None:
        return None
    response, episode_kind, mutated_line = first
    episode = Episode(task, executor, settings, tokenizer)
    rows: list[SftExample] = []
    played: list[str] = []

    def play(text: str, row_kind: str, train: bool) -> bool:
        prompt = episode.render_prompt(tokenizer)
        response_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(response_ids) >= settings.max_response_tokens:
            return False  # the pipeline would cut this response: never demonstrate it
        turn = episode.state.turn
        step = episode.step(text)
        if step.action_status != "ok":
            raise ValueError(f"task {task.task_id}: demonstration turn {turn} is invalid ({step.action_status}): "
                             f"{step.observation}")
        if train:
            rows.append(SftExample(task.task_id, row_kind, turn,
                                   tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"]),
                                   (*response_ids, eos), text, tuple(played)))
        played.append(text)
        return True

    if not play(response, episode_kind, train=mutated_line is None):
        return None
    state = episode.state
    if mutated_line is not None and not state.done and state.visible_passed < state.visible_total:
        fix = _edit_edits(state.files, target)
        text = _action("edit", _think("fix", rng, line=mutated_line + 1, **values), fix)
        if not play(text, "repair", train=True):
            return None
    state = episode.state
    if not rows:
        return None
    solved = state.visible_total > 0 and state.visible_passed == state.visible_total
    if (solved and not state.done and state.turn + 1 >= settings.min_turns_before_finish
            and rng.random() < finish_rate):
        play(_action("finish", _think("finish", rng, **values), ()), "finish", train=True)
    return rows


def generation_header(tokenizer: Any) -> tuple[int, ...]:
    """Token ids the chat template adds to open the assistant's turn (e.g. "<|im_start|>assistant\n"): the
    difference between a conversation rendered with and without the generation prompt."""
    chat = [{"role": "user", "content": "x"}]
    with_prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    without = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
    if not with_prompt.startswith(without) or with_prompt == without:
        raise ValueError("the chat template's generation prompt is not a suffix of the conversation")
    return tuple(tokenizer(with_prompt[len(without):], add_special_tokens=False)["input_ids"])


def unconditioned_examples(examples: Sequence[SftExample], copies: int, header: Sequence[int]) -> list[SftExample]:
    """Every response `copies` more times with only the assistant header as its prompt (kind "unconditioned").

    Why: for a small policy trained from scratch on a CPU budget the prompt is most of every sequence, so
    the grammar is learnt from few loss tokens. Prompt-free rows are short and pack many to a batch: the same
    compute gives several times the signal on how a response is laid out, and the response still starts
    right after the header as it does after a full prompt (`generation_header`).
    """
    if copies < 0:
        raise ValueError(f"copies must be >= 0, got {copies}")
    if not header:
        raise ValueError("the assistant header is empty: the first response token would have no context")
    return [SftExample(e.task_id, "unconditioned", e.turn, tuple(header), e.response_ids, e.response_text)
            for e in examples for _ in range(copies)]
