"""Cold-start SFT: teach a fresh policy to write valid actions before RL.

1. Demonstrations: every training task's reference solution becomes a short successful repair episode in
   the action grammar, played through the real `Episode` (so each prompt is exactly the text the pipeline
   shows at that turn). Kinds, drawn per task from a seeded mix:
     write   one turn, <write> of the whole solution
     edit    one turn, search/replace blocks, one per hunk of the stub -> solution diff
     append  one turn, <append> of the body (only where the solution extends the stub at its end)
     repair  turn 1 writes the solution with one mutated line, the tests fail, turn 2 fixes that line
   and a solved episode may go on with a <finish/> turn. Only correct turns become training examples (the
   mutated first turn of a repair is context, never a target).
   Outcomes are replayed, not executed (`ReplayExecutor`): the reference passes, anything else fails. Pass
   the real `Judge` as `executor` to show real test output instead. Optionally each response is repeated
   with only the assistant header as prompt (`unconditioned_copies`): cheap extra signal on the grammar.
2. Training: causal-LM cross-entropy on response tokens only (each response ends with eos so generation
   stops), length-bucketed batches under a token budget (training/data.py), AdamW with warmup then
   cosine/constant LR, gradient clipping, seeded. Saves a plain HF checkpoint and `sft_report.json` (last,
   it marks completion); a rerun on a completed out_dir returns the stored report.
3. Check: `evaluate_actions` samples first-turn responses on held-out tasks and reports the share that
   parse as actions (and apply to the workspace).
"""

from __future__ import annotations

import difflib
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.agent.episode import Episode
from pipeline.agent.grammar import Action, Edit, InvalidAction, apply_action, parse_response, render_action
from pipeline.agent.settings import EpisodeSettings
from pipeline.sandbox.judge import CaseResult, ExecResult
from pipeline.tasks.base import Task
from training.sft_settings import DEFAULT_MIX, EPISODE_KINDS, SftSettings

if TYPE_CHECKING:
    from training.config import DidpoConfig

REPORT_NAME = "sft_report.json"


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


def mutate_line(text: str, candidates: Sequence[int], rng: random.Random) -> tuple[str, int] | None:
    """`text` with one bug of the repair catalogue (`pipeline.tasks.repair`, every family that keeps the line)
    on one of the candidate lines (0-based), the family drawn uniformly first; (mutated text, line) or None."""
    from pipeline.tasks.repair import FAMILIES, apply_bugs, bug_candidates

    wanted = {i + 1 for i in candidates}
    by_family: dict[str, list] = {}
    for bug in bug_candidates(text, tuple(f for f in FAMILIES if f != "delete_line")):
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
            think = _think("bug", rng, **{**values, "line": _first_line(before, edits[0])})
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


# ---- training ----------------------------------------------------------------------------------------------


@dataclass
class SftStepMetrics:
    step: int  # optimizer step, 1-based
    epoch: int
    loss: float  # mean cross-entropy per response token, nats
    grad_norm: float  # global gradient norm before clipping
    lr: float
    response_tokens: int  # tokens trained on (loss tokens)
    tokens: int  # real tokens processed (prompt + response)
    tokens_per_s: float  # tokens / seconds of this step


@dataclass
class SftReport:
    out_dir: str
    checkpoint_in: str
    plan_id: str  # content hash of the examples and settings: a rerun with other inputs is refused
    n_examples: int
    examples_by_kind: dict[str, int]
    response_tokens: int  # loss tokens of one epoch
    total_steps: int
    first_loss: float
    final_loss: float  # mean over the last min(5, steps) steps
    steps: list[SftStepMetrics] = field(default_factory=list)
    wall: dict[str, float] = field(default_factory=dict)  # train_s, save_s, total_s
    settings: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] | None = None  # filled by callers that evaluate (workflows/sft_cmd.py)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SftReport:
        raw = json.loads(text)
        raw["steps"] = [SftStepMetrics(**s) for s in raw["steps"]]
        return cls(**raw)


def response_token_loss(logits: Any, input_ids: Any, loss_mask: Any) -> tuple[Any, Any]:
    """Summed cross-entropy over response tokens and their count.

    logits (B, T, V); input_ids (B, T); loss_mask (B, T-1) on the next-token grid (column j scores token j+1).
    Returns (sum of -log p over masked positions, number of masked positions), both 0-dim tensors.
    """
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, input_ids[:, 1:, None])[..., 0]
    return (nll * loss_mask).sum(), loss_mask.sum()


def _plan_id(examples: Sequence[SftExample], settings: SftSettings, checkpoint: Path) -> str:
    from pipeline.schema import content_id

    return content_id([(e.prompt_ids, e.response_ids) for e in examples],
                      settings.model_dump(mode="json", exclude={"tasks"}), checkpoint.name)


def train_sft(checkpoint_in: str | os.PathLike[str], out_dir: str | os.PathLike[str],
              examples: Sequence[SftExample], settings: SftSettings) -> SftReport:
    """Fine-tune `checkpoint_in` on `examples` into a plain HF checkpoint at `out_dir` (see module docstring).

    Refuses a non-empty out_dir unless it holds a completed SFT of the same examples and settings, whose
    stored report is then returned unchanged. Writes into a temporary sibling and renames it into place.
    The caller sets torch's thread count.
    """
    import numpy as np
    import torch

    from pipeline.policy.loading import check_checkpoint, load_policy
    from pipeline.telemetry import MetricsLog, progress
    from training.data import TrainRow, collate, epoch_plan, pack_by_length
    from training.trainer import copy_tokenizer, lr_factor

    t_start = time.perf_counter()
    init = check_checkpoint(checkpoint_in)
    if not examples:
        raise ValueError("no SFT examples: nothing to train on")
    bad = [e.task_id for e in examples if not e.prompt_ids or not e.response_ids]
    if bad:
        raise ValueError(f"SFT examples with an empty prompt or response: {bad[:5]}")
    out = Path(out_dir)
    plan_id = _plan_id(examples, settings, init)
    if (out / REPORT_NAME).is_file():
        stored = SftReport.from_json((out / REPORT_NAME).read_text())
        if stored.plan_id != plan_id:
            raise FileExistsError(f"{out} holds an SFT of other examples or settings (plan {stored.plan_id}); "
                                  "choose another out_dir")
        return stored
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory; choose another out_dir")

    rows = [TrainRow(row_id=f"{i:08d}", task_id=e.task_id, traj_id=e.task_id,
                     prompt_ids=np.asarray(e.prompt_ids, dtype=np.int64),
                     response_ids=np.asarray(e.response_ids, dtype=np.int64),
                     advantages=np.ones(len(e.response_ids), np.float32),
                     loss_mask=np.ones(len(e.response_ids), np.float32),
                     behavior_logprobs=np.zeros(len(e.response_ids), np.float32))
            for i, e in enumerate(examples)]
    buckets = pack_by_length([r.length for r in rows], settings.max_tokens_per_batch, [r.row_id for r in rows])
    per_epoch = len(buckets)
    total = per_epoch * settings.epochs
    if settings.max_steps is not None:
        total = min(total, settings.max_steps)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        metrics_log = MetricsLog(staging)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            model = load_policy(init, dtype="float32", device="cpu")
            model.config.use_cache = False
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=settings.adam_betas,
                                          weight_decay=settings.weight_decay)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(
                s, warmup=settings.warmup_steps, total=total, schedule=settings.schedule,
                min_ratio=settings.min_lr_ratio))
            steps: list[SftStepMetrics] = []
            plans = {}
            t_train = time.perf_counter()
            for step in progress(range(total), "sft", total=total):
                epoch, k = divmod(step, per_epoch)
                if epoch not in plans:
                    plans[epoch] = epoch_plan(buckets, settings.seed, epoch)
                idx = plans[epoch][k]
                t0 = time.perf_counter()
                batch = collate([rows[i] for i in idx], idx, pad_id=0)
                out_logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                loss_sum, n = response_token_loss(out_logits, batch.input_ids, batch.loss_mask)
                loss = loss_sum / n
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                clip = settings.grad_clip if settings.grad_clip > 0 else float("inf")
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
                lr = scheduler.get_last_lr()[0]
                optimizer.step()
                scheduler.step()
                dt = time.perf_counter() - t0
                m = SftStepMetrics(step=step + 1, epoch=epoch, loss=float(loss.detach()), grad_norm=grad_norm,
                                   lr=lr, response_tokens=int(n), tokens=batch.n_tokens,
                                   tokens_per_s=batch.n_tokens / dt if dt > 0 else 0.0)
                steps.append(m)
                metrics_log.log("sft", step + 1, loss=m.loss, grad_norm=m.grad_norm, lr=m.lr,
                                tokens_per_s=m.tokens_per_s)
            train_s = time.perf_counter() - t_train
        t0 = time.perf_counter()
        model.save_pretrained(staging)
        copy_tokenizer(init, staging)
        save_s = time.perf_counter() - t0
        tail = steps[-5:]
        report = SftReport(
            out_dir=str(out), checkpoint_in=str(init), plan_id=plan_id, n_examples=len(examples),
            examples_by_kind=dict(sorted(Counter(e.kind for e in examples).items())),
            response_tokens=sum(len(e.response_ids) for e in examples), total_steps=total,
            first_loss=steps[0].loss, final_loss=sum(s.loss for s in tail) / len(tail), steps=steps,
            wall={"train_s": train_s, "save_s": save_s, "total_s": time.perf_counter() - t_start},
            settings=settings.model_dump(mode="json"),
        )
        (staging / REPORT_NAME).write_text(report.to_json() + "\n")  # last: marks a complete SFT
        staging.chmod(0o755)
        if out.exists():
            out.rmdir()  # empty (checked above)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


# ---- evaluation --------------------------------------------------------------------------------------------


def evaluate_actions(checkpoint: str | os.PathLike[str], tasks: Sequence[Task], episode_settings: EpisodeSettings,
                     policy_settings: Any, *, seed: int = 0, batch_size: int = 8) -> dict[str, Any]:
    """Sample one first-turn response per held-out task and check it against the grammar.

    Returns {"n", "valid", "valid_rate", "applies", "applies_rate", "truncated", "by_kind": {kind: n},
    "invalid_reasons": {reason: n}, "mean_response_tokens", "seconds", "responses": [text per task]}. `applies` counts valid actions whose
    edits also apply to the workspace (run_tests and finish count as applying).
    """
    import torch

    from pipeline.policy.generation import GenerationRequest
    from pipeline.policy.handlers import load_generator
    from pipeline.policy.loading import load_tokenizer

    if not tasks:
        raise ValueError("evaluate_actions needs at least one task")
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(checkpoint)
    generator = load_generator(policy_settings.model_copy(update={"checkpoint": str(checkpoint)}),
                               batch_invariant=False)
    requests = []
    for i, task in enumerate(tasks):
        text = Episode(task, ReplayExecutor(), episode_settings, tokenizer).render_prompt(tokenizer)
        requests.append(GenerationRequest(task.task_id, tokenizer(text, add_special_tokens=False)["input_ids"],
                                          seed + i))
    with torch.random.fork_rng(devices=[]):
        results = [r for lo in range(0, len(requests), batch_size)
                   for r in generator.generate(requests[lo:lo + batch_size])]
    kinds: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    applies = truncated = 0
    for task, result in zip(tasks, results, strict=True):
        truncated += result.truncated
        action = parse_response(result.response_text, truncated=result.truncated)
        kinds[action.kind] += 1
        if not action.ok:
            reasons[action.reason] += 1  # type: ignore[union-attr]
            continue
        files = apply_action(action, task.workspace, max_file_bytes=episode_settings.max_file_bytes) \
            if action.kind not in ("run_tests", "finish") else None
        if not isinstance(files, InvalidAction):
            applies += 1
    n = len(tasks)
    valid = n - sum(reasons.values())
    return {
        "n": n, "valid": valid, "valid_rate": valid / n, "applies": applies, "applies_rate": applies / n,
        "truncated": truncated, "by_kind": dict(sorted(kinds.items())), "invalid_reasons": dict(sorted(reasons.items())),
        "mean_response_tokens": sum(len(r.response_token_ids) for r in results) / n,
        "seconds": time.perf_counter() - t0, "responses": [r.response_text for r in results],
    }


def run_cold_start(cfg: DidpoConfig, checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                   evaluation_tasks: Sequence[Task], *, evaluate: bool = True) -> SftReport:
    """The cold start of `didpo sft` and `didpo round`: demonstrations from `cfg.sft.tasks.train`, plus
    `sft.rl_task_episodes` more per task of `cfg.tasks.train` (all refused if they overlap `evaluation_tasks`),
    SFT into `out`, then the valid-action rate on `cfg.sft.tasks.eval`, stored in the report. Idempotent: a
    finished cold start is returned as stored."""
    from pipeline.policy.loading import load_tokenizer
    from pipeline.schema import atomic_write
    from pipeline.tasks import check_disjoint
    from pipeline.tasks.settings import resolve_tasks

    settings: SftSettings = cfg.sft
    train, held_out = resolve_tasks(settings.tasks)
    rl_tasks = resolve_tasks(cfg.tasks)[0] if settings.rl_task_episodes else []
    check_disjoint([*train, *rl_tasks], evaluation_tasks)  # no evaluation problem leaks into the demonstrations
    tokenizer = load_tokenizer(checkpoint)
    examples = sft_examples(train, tokenizer, cfg.episode, seed=settings.seed, mix=settings.mix,
                            finish_rate=settings.finish_rate, episodes_per_task=settings.episodes_per_task)
    if rl_tasks:  # the tasks the rounds train on, again: RL starts from solutions the policy partly knows
        examples += sft_examples(rl_tasks, tokenizer, cfg.episode, seed=settings.seed + 1, mix=settings.mix,
                                 finish_rate=settings.finish_rate, episodes_per_task=settings.rl_task_episodes)
    if settings.unconditioned_copies:
        examples += unconditioned_examples(examples, settings.unconditioned_copies, generation_header(tokenizer))
    report = train_sft(checkpoint, out, examples, settings)
    if evaluate and held_out and report.evaluation is None:
        report.evaluation = evaluate_actions(out, held_out, cfg.episode, cfg.policy, seed=settings.seed)
        text = report.to_json() + "\n"
        atomic_write(Path(out) / REPORT_NAME, lambda tmp: Path(tmp).write_text(text))  # the report stays whole
    return report

