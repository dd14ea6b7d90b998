"""Pretraining rows for a policy built from scratch: code, and synthetic tasks that teach copying from context.

Why: a small policy trained from random weights for minutes learns the action format but never quotes its
prompt back, and a repair needs exactly that (the `<search>` text is a line of the file; the misspelled name
is in the test's error). These rows come before the cold-start demonstrations (training/sft.py) and train
through the same loop (`train_sft`): each row is a prompt (context, not trained) and a response (trained).

Kinds, drawn per row from a seeded mix; all but the first on one code file shown the way the episode prompt
shows files:

  induction   random token ids, eos                     -> the same ids, eos (no file, no chat; the copying
                                                           circuit forms here because nothing but copying
                                                           lowers the loss: docs/pretraining.md)
  induction_repeats  the same, the ids drawn from 4-16 distinct tokens of the row: the token before (or the
                     two before) also stands elsewhere, followed by another, so the copy needs a longer match;
                     a file's line fails where it is ambiguous so (docs/pretraining.md, fourteenth series)
  code        the file itself, after the assistant header only (plain language modelling on code)
  quote_line  "Quote line N of PATH."                   -> that line, verbatim
  quote_many  "Quote lines N, M, ... of PATH"           -> each of them after its number ("N| line")
  quote_twin  "Quote line N", the file holding 1-3 near twins of line N (its start with another line's end,
              or one bug of the repair catalogue in it)  -> line N, verbatim: where a twin leaves the line the
                                                           token or two before recur, so the copy needs a
                                                           longer match, on code (fifteenth series)
  error_name  a NameError naming one of its identifiers -> that name
  edit_line   "Change line N to: NEW"                   -> an action whose <search> quotes line N (the grammar)
  edit_span   the file with one bug of the catalogue, "On line N, change `OLD` to `NEW`" (the bug's span and
              its fix)                                  -> that edit: line N quoted, then written again with the
                                                           span changed and the rest copied on after it
  apply_edit  an <edit> block                           -> the whole file after the edit
  fix_line    a repair episode's first turn on the file with one bug of the catalogue -> the repair action
  fix_name    the same with a misspelt name, and the NameError the file raises shown as the visible tests'
              failure                                    -> the repair action (the right spelling is the
                                                           file's name nearest the wrong one: a fuzzy lookup)

Files come from task texts (`pretrain_files`): starting files and reference solutions, never those of the
tasks a caller holds out for evaluation.
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import keyword
import random
import re
import symtable
import tokenize
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from pipeline.agent.episode import render_file, summarize, system_prompt, user_message
from pipeline.agent.grammar import ACTION_SPECS, Action, parse_response, render_action
from pipeline.agent.settings import EpisodeSettings
from pipeline.assets import PRETRAIN_REPORT
from pipeline.sandbox.judge import CaseResult, ExecResult
from pipeline.tasks.base import Task
from pipeline.tasks.repair import FAILURE_CHARS, bugs_note
from training.demonstrations import (
    SftExample,
    bug_think,
    generation_header,
    mutate_line,
    search_replace_edits,
)
from training.pretrain_settings import PRETRAIN_KINDS, REHEARSAL_MIX

FILE_KINDS = tuple(k for k in PRETRAIN_KINDS if not k.startswith("induction"))  # the kinds asked about a file
QUOTE_KINDS = ("quote_line", "quote_twin")  # the answer is one line of the prompt, verbatim
REPEATS_ALPHABET = (4, 16)  # distinct ids of an `induction_repeats` row: 16-64 ids make most of them recur

DEFAULT_PRETRAIN_MIX = MappingProxyType(
    {"code": 0.2, "quote_line": 0.3, "error_name": 0.1, "edit_line": 0.3, "apply_edit": 0.1}
)
_COMMON_NAMES = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins)) | {"self"}


def pretrain_files(tasks: Iterable[Task], held_out: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Distinct (path, text) Python files of the tasks' starting files and reference solutions, in task order;
    tasks whose id is in `held_out` contribute nothing."""
    skip = set(held_out)
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for task in tasks:
        if task.task_id in skip:
            continue
        for files in (task.workspace, task.reference):
            for path, text in sorted(files.items()):
                if path.endswith(".py") and text.strip() and text not in seen:
                    seen.add(text)
                    out.append((path, text if text.endswith("\n") else text + "\n"))
    return out


def _code_names(text: str) -> set[str]:
    """Names the code uses (not words of its strings or comments); none for text that does not tokenize."""
    try:
        return {t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.NAME}
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return set()


_PIECE = re.compile(r"\w+|\S")  # a word, a number or one other character: where a twin may leave its line


def near_twins(text: str, n: int, rng: random.Random) -> list[str]:
    """1-3 lines that start like line `n` (0-based) of `text` and then leave it: its first pieces followed by
    the end of another line, or the line with one bug of the repair catalogue (its start and often its end
    kept). Fewer (none) where the line is too short or no twin differs from it."""
    lines = text.splitlines()
    line = lines[n]
    pieces = list(_PIECE.finditer(line))
    others = [other for i, other in enumerate(lines) if i != n and len(_PIECE.findall(other)) >= 2]
    twins: list[str] = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.5:
            mutated = mutate_line(text, [n], rng)
            twin = mutated[0].splitlines()[n] if mutated and len(mutated[0].splitlines()) == len(lines) else None
        elif len(pieces) >= 3 and others:
            other = list(_PIECE.finditer(rng.choice(others)))
            head = pieces[rng.randint(2, len(pieces) - 1) - 1].end()
            tail = other[rng.randint(1, len(other) - 1) - 1].end()
            twin = line[:head] + other[0].string[tail:]
        else:
            twin = None
        if twin is not None and twin.strip() != line.strip():
            twins.append(twin)
    return twins


def _shown(path: str, text: str) -> str:
    return render_file(path, text, len(text.splitlines()) + 1, None)  # the whole file, as the episode shows it


_RUN = re.compile(r"\w+|\s+|[^\w\s]+")  # a line split without loss: words, blanks, runs of other characters


def changed_span(before: str, after: str) -> tuple[str, str]:
    """(old, new): the shortest run of whole pieces (`_RUN`) of `before` that `after` writes otherwise, and
    what it writes; an insertion takes the piece after it along (the one before at the line's end), so old
    is never blank."""
    a, b = _RUN.findall(before), _RUN.findall(after)
    lo = 0
    while lo < min(len(a), len(b)) and a[lo] == b[lo]:
        lo += 1
    hi = 0
    while hi < min(len(a), len(b)) - lo and a[-1 - hi] == b[-1 - hi]:
        hi += 1
    while not "".join(a[lo:len(a) - hi]).strip() and (hi or lo):
        if hi:
            hi -= 1
        else:
            lo -= 1
    return "".join(a[lo:len(a) - hi]), "".join(b[lo:len(b) - hi])


def undefined_name(text: str) -> tuple[str, int] | None:
    """(name, line) of the first name `text` reads but never binds and Python does not provide: what running
    it raises a NameError about (when the first read in the file is the first one run); None when every name
    read is bound, or the text does not parse. Static, from the compiler's own symbol tables."""
    try:
        tree, top = ast.parse(text), symtable.symtable(text, "<file>", "exec")
    except (SyntaxError, ValueError):
        return None
    tables, free = [top], set()
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()} | set(dir(builtins))
    while tables:
        table = tables.pop()
        tables += table.get_children()
        for s in table.get_symbols():
            if s.is_declared_global() and s.is_assigned():
                bound.add(s.get_name())
            if s.is_referenced() and (s.is_global() if table is not top else not s.is_assigned()):
                free.add(s.get_name())
    reads = [(node.lineno, node.id) for node in ast.walk(tree)
             if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in free - bound]
    return (min(reads)[1], min(reads)[0]) if reads else None


def copy_task(kind: str, path: str, text: str, rng: random.Random) -> tuple[str, str] | None:
    """(user message, response) of one synthetic task of `kind` on one file ("" message for `code`), or None
    when the file offers nothing for that kind (no non-blank line, no name, no line a mutation applies to)."""
    if kind not in FILE_KINDS:
        raise ValueError(f"unknown pretraining kind {kind!r} for a file; allowed: {', '.join(FILE_KINDS)}")
    lines = text.splitlines()
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if kind == "code":
        return "", text
    if not filled:
        return None
    if kind == "quote_line":
        n = rng.choice(filled)
        return f"{_shown(path, text)}\n\nQuote line {n + 1} of {path}.", lines[n]
    if kind == "quote_twin":
        n = rng.choice(filled)
        shown: list[tuple[str, bool]] = [(line, i == n) for i, line in enumerate(lines)]
        for twin in near_twins(text, n, rng):
            shown.insert(rng.randint(0, len(shown)), (twin, False))
        asked = next(i for i, (_, target) in enumerate(shown) if target)
        twinned = "\n".join(line for line, _ in shown) + "\n"
        return f"{_shown(path, twinned)}\n\nQuote line {asked + 1} of {path}.", lines[n]
    if kind == "quote_many":
        picked = [rng.choice(filled) for _ in range(rng.randint(2, 6))]
        asked = ", ".join(str(n + 1) for n in picked)
        return (f"{_shown(path, text)}\n\nQuote lines {asked} of {path}, each after its number.",
                "\n".join(f"{n + 1}| {lines[n]}" for n in picked))
    if kind == "error_name":
        names = sorted(_code_names(text) - _COMMON_NAMES)
        if not names:
            return None
        name = rng.choice(names)
        return (f"{_shown(path, text)}\n\nThe tests fail with:\nNameError: name '{name}' is not defined\n"
                "Which name does the error name?", name)
    mutated = mutate_line(text, filled, rng, families=("misspell",) if kind == "fix_name" else None)
    if mutated is None:
        return None
    new_text, n = mutated
    if kind in ("fix_line", "fix_name"):  # a repair turn: one bug, fixed by naming and quoting its line
        first_def = re.search(r"^\s*def (\w+)", text, flags=re.M)
        name = first_def.group(1) if first_def else path
        failure = ""
        if kind == "fix_name":
            undefined = undefined_name(new_text)
            if undefined is None or undefined_name(text) is not None:  # no NameError of the misspelling's own
                return None
            wrong, at = undefined
            # the report the visible tests' run gives, in the words `summarize` gives every run
            case = CaseResult(f"check_00.py: {name}(...)", False,
                              f"NameError: name '{wrong}' is not defined ({path}, line {at})")
            failure = summarize(ExecResult("failed", 0, 1, 0.0, "none", (case,)), FAILURE_CHARS)
        note = bugs_note(path, 1, failure)
        fix = tuple(search_replace_edits(path, new_text, text))
        action = Action("edit", bug_think(rng, path=path, name=name, line=n + 1), (0, 0), fix)
        return user_message(note, {path: new_text}, EpisodeSettings(), visible_total=1), render_action(action)
    if kind == "edit_span":  # the change named, not the line: copy the line, change it there, copy on
        old, new = changed_span(new_text.splitlines()[n], lines[n])
        action = Action("edit", f"Line {n + 1} of {path} changes.\n", (0, 0),
                        tuple(search_replace_edits(path, new_text, text)))
        message = f"{_shown(path, new_text)}\n\nOn line {n + 1} of {path}, change `{old}` to `{new}`."
        return message, render_action(action)
    edits = search_replace_edits(path, text, new_text)
    if kind == "edit_line":
        new_line = new_text.splitlines()[n]
        action = Action("edit", f"Line {n + 1} of {path} changes.\n", (0, 0), tuple(edits))
        return f"{_shown(path, text)}\n\nChange line {n + 1} to:\n{new_line}", render_action(action)
    if kind == "apply_edit":
        block = render_action(Action("edit", "apply\n", (0, 0), tuple(edits))).split("</think>\n", 1)[1]
    return f"{_shown(path, text)}\n\nApply this edit and write the whole file:\n{block}", new_text


def prompt_ids(tokenizer: Any, message: str, system: str | None = None) -> tuple[int, ...]:
    """Token ids of a one-message chat ending in the assistant header (the header alone for ""), after a
    `system` message when one is given."""
    if not message:
        return generation_header(tokenizer)
    chat = [{"role": "system", "content": system}] if system else []
    chat.append({"role": "user", "content": message})
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def ordinary_ids(tokenizer: Any) -> range:
    """Ids of the tokenizer's ordinary tokens (special tokens come first in our vocabularies)."""
    return range(max(tokenizer.all_special_ids) + 1, len(tokenizer))


def induction_row(ordinary: range, eos: int, rng: random.Random, lo: int = 16, hi: int = 64,
                  alphabet: tuple[int, int] | None = None) -> SftExample:
    """Random `ordinary` ids then `eos` as the prompt, of a random length in [lo, hi] (so the copy sits at no
    fixed distance), the same ids and `eos` as the response. The eos closes the prompt too, so the end of the
    copy is itself a copy (what followed the last id before): without it the response's eos is the one token
    copying cannot predict, and the only run whose circuit carried over to files had such a separator.

    With `alphabet` (a, b), the row's ids are drawn from between a and b distinct ids (kind
    `induction_repeats`): most ids recur, followed by different ones, so matching the last token or two does
    not say what comes next; on whole-vocabulary rows it always does."""
    pool = rng.sample(ordinary, rng.randint(*alphabet)) if alphabet else ordinary
    ids = tuple(rng.choices(pool, k=rng.randint(lo, hi)))
    kind = "induction_repeats" if alphabet else "induction"
    return SftExample(kind, kind, 0, (*ids, eos), (*ids, eos), "")


def mosaic_files(files: Sequence[tuple[str, str]], n: int, seed: int, max_lines: int = 12) -> list[tuple[str, str]]:
    """`n` files, each 2..`max_lines` lines drawn at random from all of `files` (paths mosaic_<i>.py). Their
    lines are code the model knows but their order is new, so a quote can only be answered by looking at the
    prompt: 376 real files are learnt by heart long before the model learns to look (docs/pretraining.md)."""
    pool = [line for _, text in files for line in text.splitlines() if line.strip()]
    if not pool and n:
        raise ValueError("mosaic files need files with non-blank lines")
    rng = random.Random(seed)
    return [(f"mosaic_{i}.py", "\n".join(rng.choices(pool, k=rng.randint(2, max(2, max_lines)))) + "\n")
            for i in range(n)]


def name_pool(files: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The names `files`' code defines or uses, common ones (keywords, builtins, self) left out, sorted."""
    return tuple(sorted(set().union(*(_code_names(text) for _, text in files)) - _COMMON_NAMES))


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


def respelled(text: str, rng: random.Random, names: Sequence[str]) -> str:
    """`text` with fresh spellings: each name of its own (not a keyword, builtin, `self` or an attribute after
    a dot) renamed to a random name of `names`, the same everywhere in the file, its docstrings and strings
    included; each run of digits in a number or a string redrawn at the same length. The structure is kept,
    the content is new, so a quote can only be answered by looking: on real files, repeated for thousands of
    steps, the model answers from memory and the copy gets no gradient (docs/pretraining.md). Text that
    does not tokenize comes back unchanged."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return text
    mapping: dict[str, str] = {}
    taken = set(_code_names(text))

    def name(old: str) -> str:
        if old not in mapping:
            fresh = [n for n in rng.sample(names, min(8, len(names))) if n not in taken]
            mapping[old] = fresh[0] if fresh else old
            taken.add(mapping[old])
        return mapping[old]

    def digits(run: str) -> str:
        first = rng.choice("123456789") if len(run) > 1 else rng.choice("0123456789")
        return first + "".join(rng.choice("0123456789") for _ in run[1:])

    own = {t.string for i, t in enumerate(tokens)
           if t.type == tokenize.NAME and t.string not in _COMMON_NAMES and (i == 0 or tokens[i - 1].string != ".")}

    def words(m: re.Match[str]) -> str:
        w = m.group(0)
        return digits(w) if w.isdigit() else name(w) if w in own else w

    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    out, at = [], 0
    for i, t in enumerate(tokens):
        begin, end = starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1]
        if t.type == tokenize.NAME and t.string in own and tokens[i - 1].string != ".":
            new = name(t.string)
        elif t.type in (tokenize.NUMBER, tokenize.STRING):
            new = _WORD.sub(words, t.string) if t.type == tokenize.STRING else re.sub(r"[0-9]+", lambda m: digits(m.group(0)), t.string)
        else:
            continue
        out += [text[at:begin], new]
        at = end
    return "".join(out) + text[at:]


def library_files(n: int, seed: int, max_lines: int = 20) -> list[tuple[str, str]]:
    """`n` functions of the Python standard library's own source (at most `max_lines` lines each, top-level
    functions and methods, dedented; paths lib_<i>.py), drawn by seed from every one there is. Real code of
    every kind, shipped with the interpreter (so offline), and far too much to learn by heart: quoting from
    it needs looking. Deterministic for a given interpreter and seed."""
    if n <= 0:
        return []
    texts = _library_functions(max_lines)
    picked = random.Random(seed).sample(texts, min(n, len(texts)))
    return [(f"lib_{i}.py", text) for i, text in enumerate(picked)]


@functools.lru_cache(maxsize=4)
def _library_functions(max_lines: int) -> list[str]:
    """Every distinct function of at most `max_lines` lines in the standard library's source, in path order
    (site-packages, tests, idlelib and lib2to3 left out)."""
    import ast
    import sysconfig
    import textwrap
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    found: dict[str, None] = {}
    for path in sorted(root.rglob("*.py")):
        if {"site-packages", "test", "tests", "idlelib", "lib2to3"} & set(path.relative_to(root).parts):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - start + 1 <= max_lines:
                    found.setdefault(textwrap.dedent("\n".join(lines[start - 1:node.end_lineno])) + "\n")
    return list(found)


def pretrain_examples(files: Sequence[tuple[str, str]], tokenizer: Any, *, n: int, seed: int,
                      mix: Mapping[str, float] = DEFAULT_PRETRAIN_MIX, max_tokens: int = 1024,
                      respell: bool = False, system_share: float = 0.0) -> list[SftExample]:
    """`n` rows (fewer if files cannot supply them), each a seeded kind on a seeded file; deterministic for
    given inputs. A row whose prompt plus response exceeds `max_tokens` is drawn again (at most 4n draws).
    With `respell`, each row shows its file `respelled` afresh (names drawn from all of `files`). A share
    `system_share` of the file rows comes after the episode's system message (either grammar's wording, at
    random), so that copying is learnt in the context where the policy uses it."""
    if not 0.0 <= system_share <= 1.0:
        raise ValueError(f"system_share {system_share} must be within [0, 1]")
    unknown = sorted(set(mix) - set(PRETRAIN_KINDS))
    if unknown or sum(mix.values()) <= 0 or any(w < 0 for w in mix.values()):
        raise ValueError(f"mix {dict(mix)} must weigh the kinds {PRETRAIN_KINDS} with weights >= 0, one > 0")
    if not files:
        raise ValueError("no files to pretrain on")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token: responses could never stop")
    kinds = [k for k in PRETRAIN_KINDS if mix.get(k, 0) > 0]
    weights = [mix[k] for k in kinds]
    rng = random.Random(seed)
    ordinary = ordinary_ids(tokenizer)  # once: len(tokenizer) walks the vocabulary
    names = name_pool(files) if respell else ()
    out: list[SftExample] = []
    for _ in range(4 * n):
        if len(out) == n:
            break
        kind = rng.choices(kinds, weights)[0]
        if kind not in FILE_KINDS:
            out.append(induction_row(ordinary, eos, rng, alphabet=REPEATS_ALPHABET if kind == "induction_repeats"
                                     else None))
            continue
        path, text = files[rng.randrange(len(files))]
        if names:
            text = respelled(text, rng, names)
        task = copy_task(kind, path, text, rng)
        if task is None:
            continue
        message, response = task
        # drawn only when asked for, so that rows without system messages stay those of earlier recipes
        # a fix_line or fix_name row is an episode's first turn: always after its system message
        system = (system_prompt(rng.choice(sorted(ACTION_SPECS)))
                  if kind in ("fix_line", "fix_name") or (system_share and rng.random() < system_share) else None)
        prompt = prompt_ids(tokenizer, message, system)
        response_ids = (*tokenizer(response, add_special_tokens=False)["input_ids"], eos)
        if len(prompt) + len(response_ids) <= max_tokens:
            out.append(SftExample(path, kind, 0, prompt, response_ids, response))
    return out


def rehearsal_examples(files: Sequence[tuple[str, str]], tokenizer: Any, *, n: int, seed: int,
                       max_tokens: int = 1024) -> list[SftExample]:
    """`n` rows of the pretraining stage that taught copying (REHEARSAL_MIX on respelled files), to mix into a
    later SFT: without them, fine-tuning on one task's demonstrations wears the base's copying away."""
    return pretrain_examples(files, tokenizer, n=n, seed=seed, mix=REHEARSAL_MIX, max_tokens=max_tokens,
                             respell=True)


def answered(kind: str, got: str, want: str) -> bool:
    """Whether `got` answers a question of `kind` whose answer is `want`: verbatim, whitespace at the ends
    ignored; for `edit_line`, the action's search text is line N verbatim (the copy a repair needs: the think
    and the replacement are given by the question)."""
    if kind != "edit_line":
        return got.strip() == want.strip()
    action, wanted = parse_response(got.strip()), parse_response(want)
    return (action.ok and bool(action.edits) and action.edits[0].op == "replace"
            and action.edits[0].search == wanted.edits[0].search)


QUOTE_OUTCOMES = ("verbatim", "another_line", "drifts", "wrong_start")


def quote_outcome(prompt_text: str, want: str, got: str, same_first_token: bool) -> str:
    """Where a greedy quote of `want` stands: `verbatim`; `another_line`, a line of the shown (numbered) file
    verbatim but not the one asked, a lookup that went wrong; `drifts`, right first token, then off the line;
    `wrong_start`, neither. Whitespace at the ends is ignored, as `answered` does."""
    if answered("quote_line", got, want):
        return "verbatim"
    shown = {line.split("| ", 1)[1].strip() for line in prompt_text.splitlines() if re.match(r"\d+\| ", line)}
    if got.strip() and got.strip() in shown:
        return "another_line"
    return "drifts" if same_first_token else "wrong_start"


def greedy_responses(checkpoint: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, seed: int,
                     batch_size: int = 8, device: str = "cpu") -> list[str]:
    """The checkpoint's greedy response text to each tokenized prompt (request i seeded `seed + i`), in batches,
    leaving torch's global random state as it was."""
    import torch

    from pipeline.policy.generation import GenerationRequest, load_generator
    from pipeline.policy.settings import PolicySettings

    settings = PolicySettings(checkpoint=str(checkpoint), temperature=0.0, max_new_tokens=max_new_tokens,
                              device=device)
    generator = load_generator(settings, batch_invariant=False)
    requests = [GenerationRequest(str(i), list(ids), seed + i) for i, ids in enumerate(prompts)]
    with torch.random.fork_rng(devices=[]):
        return [r.response_text for lo in range(0, len(requests), batch_size)
                for r in generator.generate(requests[lo:lo + batch_size])]


def _questions(tokenizer: Any, files: Sequence[tuple[str, str]], *, n: int, seed: int, kind: str,
               action_spec: str | None = None) -> tuple[list[tuple[int, ...]], list[str]]:
    """`n` seeded questions of `kind` on `files`: (prompt ids, wanted answer) pairs, the same for a seed."""
    rng = random.Random(seed)
    asks, answers = [], []
    while len(asks) < n:
        path, text = files[rng.randrange(len(files))]
        task = copy_task(kind, path, text, rng)
        if task is not None:
            asks.append(prompt_ids(tokenizer, task[0], action_spec and system_prompt(action_spec)))
            answers.append(task[1])
    return asks, answers


def copy_accuracy(checkpoint: Any, files: Sequence[tuple[str, str]], *, n: int, seed: int,
                  kind: str = "quote_line", batch_size: int = 8, device: str = "cpu",
                  action_spec: str | None = None) -> dict[str, Any]:
    """Greedy answers to `n` seeded questions of `kind` on `files`: the share `answered`, with a few
    (expected, got) samples, and for a quote `where_copies_leave` and how many answers had each
    `quote_outcome` (`outcomes`). With `action_spec`, each question comes after the episode's system message
    in that wording, as repairs do."""
    from pipeline.policy.loading import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    asks, answers = _questions(tokenizer, files, n=n, seed=seed, kind=kind, action_spec=action_spec)
    longest = max(len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers)
    got = [text.strip() for text in greedy_responses(checkpoint, asks, max_new_tokens=longest + 8, seed=seed,
                                                     batch_size=batch_size, device=device)]
    hits = [answered(kind, g, a) for g, a in zip(got, answers, strict=True)]
    out = {"n": n, "kind": kind, "action_spec": action_spec, "accuracy": sum(hits) / n,
           "samples": list(zip(answers, got, strict=True))[:5]}
    if kind in QUOTE_KINDS:  # the answer is a copy of the prompt's text: where does it leave it?

        def ids(text: str) -> list[int]:
            return tokenizer(text.strip(), add_special_tokens=False)["input_ids"]

        quotes = [(prompt, a, g, ids(a), ids(g)) for prompt, a, g in zip(asks, answers, got, strict=True)]
        out["where_copies_leave"] = where_copies_leave([(prompt, ia, ig) for prompt, _, _, ia, ig in quotes])
        outcomes = [quote_outcome(tokenizer.decode(list(prompt)), a, g, ia[:1] == ig[:1])
                    for prompt, a, g, ia, ig in quotes]
        out["outcomes"] = {name: outcomes.count(name) for name in QUOTE_OUTCOMES}
    return out


def lookback_ambiguous(prompt: Sequence[int], copy: Sequence[int], j: int, width: int = 2) -> bool:
    """Whether the `width` tokens before position `j` of `copy` also stand in `prompt` followed by a token
    other than copy[j]: there, a copy that matches only the last `width` tokens can go astray."""
    if j < width:
        return False
    before, after = tuple(copy[j - width:j]), copy[j]
    return any(tuple(prompt[p:p + width]) == before and prompt[p + width] != after
               for p in range(len(prompt) - width))


def where_copies_leave(answers: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]],
                       width: int = 2) -> dict[str, int]:
    """Over (prompt, wanted, got) token ids: how many answers leave the wanted text after copying some of it
    (`left`), how many of those leave it where the `width` tokens before are `lookback_ambiguous`, and the
    same count over every position copied right (`copied`, `copied_ambiguous`), its base rate."""
    out = dict.fromkeys(("left", "left_ambiguous", "copied", "copied_ambiguous"), 0)
    for prompt, want, got in answers:
        k = next((i for i, (w, g) in enumerate(zip(want, got, strict=False)) if w != g), min(len(want), len(got)))
        counted = range(width, k)
        out["copied"] += len(counted)
        out["copied_ambiguous"] += sum(lookback_ambiguous(prompt, want, j, width) for j in counted)
        if width <= k < len(want) and k < len(got):  # left the text after `width` tokens or more of it
            out["left"] += 1
            out["left_ambiguous"] += lookback_ambiguous(prompt, want, k, width)
    return out


def forced_quote(prompt: Sequence[int], want: Sequence[int], predicted: Sequence[int], first: int,
                 width: int = 2) -> dict[str, int]:
    """Teacher-forced scores of one quote, `predicted[j]` being the model's likeliest token for want[j] given
    the prompt and want[:j]: whether it finds the line (`located`: right at `first`, the answer's first token
    that is not blank, chosen by the line number alone), and how it copies on from there, every later position
    counted as `lookback_ambiguous` or not. A wrong copy of the right line and a copy of the wrong line look
    alike in a greedy answer; here they come apart."""
    out = {"located": int(predicted[first] == want[first]), "copied": 0, "positions": 0,
           "copied_ambiguous": 0, "ambiguous": 0}
    for j in range(first + 1, len(want)):
        right = int(predicted[j] == want[j])
        out["copied"] += right
        out["positions"] += 1
        if lookback_ambiguous(prompt, want, j, width):
            out["copied_ambiguous"] += right
            out["ambiguous"] += 1
    return out


def quote_line_forced(checkpoint: Any, files: Sequence[tuple[str, str]], *, n: int, seed: int,
                      device: str = "cpu") -> dict[str, Any]:
    """`forced_quote` over `copy_accuracy`'s `quote_line` questions (the same ones for a seed): `accuracy` is
    the share of questions whose line is located, `copy` the share of later positions copied right, with
    `copy_ambiguous` and `copy_other` apart (docs/pretraining.md, twenty-second series)."""
    import torch

    from pipeline.policy.loading import load_policy, load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    model = load_policy(checkpoint, device=device)
    asks, answers = _questions(tokenizer, files, n=n, seed=seed, kind="quote_line")
    total = dict.fromkeys(("located", "copied", "positions", "copied_ambiguous", "ambiguous"), 0)
    for prompt, answer in zip(asks, answers, strict=True):
        want = tokenizer(answer, add_special_tokens=False)["input_ids"]  # as the rows train it
        first = next((j for j in range(len(want)) if tokenizer.decode(want[:j + 1]).strip()), 0)
        with torch.no_grad():
            logits = model(torch.tensor([[*prompt, *want]], device=device)).logits[0, len(prompt) - 1:-1]
        for key, value in forced_quote(prompt, want, logits.argmax(-1).tolist(), first).items():
            total[key] += value
    other = total["positions"] - total["ambiguous"]
    return {"n": n, "kind": "quote_line_forced", "accuracy": total["located"] / n, "counts": total,
            "copy": total["copied"] / max(total["positions"], 1),
            "copy_ambiguous": total["copied_ambiguous"] / max(total["ambiguous"], 1),
            "copy_other": (total["copied"] - total["copied_ambiguous"]) / max(other, 1)}


def held_out_abilities(checkpoint: Any, files: Sequence[tuple[str, str]], *, n: int, seed: int,
                       device: str = "cpu") -> dict[str, dict[str, Any]]:
    """The base's copying on held-out `files`: `quote_line`, `quote_twin` (line N among near twins of it),
    `error_name` and `edit_line` (its search text quotes line N) as pretraining asks them,
    `quote_line_forced`, the `quote_line` questions teacher-forced (is the line located, then copied?),
    `quote_line_in_episode`, the `quote_line` questions after the episode's system message (brief grammar),
    and `induction_repeats`, copies where the last tokens are ambiguous (`induction_accuracy`)."""
    out = {kind: copy_accuracy(checkpoint, files, n=n, seed=seed, kind=kind, device=device)
           for kind in ("quote_line", "quote_twin", "error_name", "edit_line")}
    out["quote_line_forced"] = quote_line_forced(checkpoint, files, n=n, seed=seed, device=device)
    out["quote_line_in_episode"] = copy_accuracy(checkpoint, files, n=n, seed=seed, device=device,
                                                 action_spec="brief")
    out["induction_repeats"] = induction_accuracy(checkpoint, n=n, seed=seed, alphabet=REPEATS_ALPHABET,
                                                  device=device)
    return out


def induction_accuracy(checkpoint: Any, *, n: int, seed: int, alphabet: tuple[int, int] | None = None,
                       batch_size: int = 8, device: str = "cpu") -> dict[str, Any]:
    """Greedy answers to `n` seeded `induction` rows (`induction_repeats` rows with `alphabet`): the share
    copied whole, with a few (expected, got) samples. The ids are random, so no row was trained on. A line of
    a file is lost where the token or two before a position recur in the prompt followed by another
    (docs/pretraining.md, fourteenth series): these rows ask for exactly that copy, without a file."""
    from pipeline.policy.loading import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    rng = random.Random(seed)
    ordinary = ordinary_ids(tokenizer)
    rows = [induction_row(ordinary, tokenizer.eos_token_id, rng, alphabet=alphabet) for _ in range(n)]
    answers = [tokenizer.decode(row.response_ids[:-1]) for row in rows]
    got = greedy_responses(checkpoint, [row.prompt_ids for row in rows],
                           max_new_tokens=max(len(row.response_ids) for row in rows) + 8, seed=seed,
                           batch_size=batch_size, device=device)
    hits = [g == a for g, a in zip(got, answers, strict=True)]
    return {"n": n, "kind": rows[0].kind, "accuracy": sum(hits) / n,
            "samples": list(zip(answers, got, strict=True))[:5]}


# ---- the staged recipe -------------------------------------------------------------------------------------

REPORT_NAME = PRETRAIN_REPORT
END_LOSS_STEPS = 50  # the window of a stage's end loss


def end_loss(losses: Sequence[float], window: int = END_LOSS_STEPS) -> float:
    """The median loss of the last `window` steps: where a stage ended, blind to single-step spikes (a file stage
    that never learnt to look a line up had five-step means of 0.33 and 0.71 with the median at 0.47 and 0.55);
    NaN if there is none or any of them is NaN."""
    import math
    import statistics

    tail = list(losses)[-window:]
    if not tail or any(math.isnan(x) for x in tail):
        return float("nan")
    return float(statistics.median(tail))


def _rows_for(stage: Any, files: Sequence[tuple[str, str]], tokenizer: Any, seed: int) -> list[SftExample]:
    """Rows enough to fill `stage.steps` batches once (the SFT loop packs them by length)."""
    budget = stage.steps * stage.max_tokens_per_batch
    rows: list[SftExample] = []
    used, draw = 0, 0
    while used < budget:
        more = pretrain_examples(files, tokenizer, n=512, seed=seed * 1_000_003 + draw, mix=stage.mix,
                                 max_tokens=stage.max_tokens_per_batch, respell=stage.respell,
                                 system_share=stage.system_share)
        if not more:
            raise ValueError(f"stage {stage.name!r}: its files offer no rows of the kinds {sorted(stage.mix)}")
        rows += more
        used += sum(len(r.prompt_ids) + len(r.response_ids) for r in more)
        draw += 1
    return rows


def pretrain(settings: Any, work_dir: Any, *, command: str = "") -> dict[str, Any]:
    """Build the `settings.size` model from scratch, train its stages in order, measure it on held-out files.

    Layout under `work_dir`: `stages/<i>-<name>/` one checkpoint per stage (a finished stage is kept, so a
    killed run resumes at the next one), `final/` the last stage's weights with `pretrain_report.json`
    (settings, per-stage losses, held-out abilities, the weights' sha256, `command`). Returns the report.
    The caller sets torch's thread count.
    """
    import hashlib
    import json
    import shutil
    from pathlib import Path

    from pipeline.assets import resolve_checkpoint
    from pipeline.policy.loading import check_checkpoint, checkpoint_parameters, load_tokenizer
    from pipeline.policy.tiny import ensure_checkpoint
    from pipeline.schema import atomic_write
    from pipeline.tasks.settings import resolve_tasks
    from training.sft import REPORT_NAME as SFT_REPORT
    from training.sft import train_sft
    from training.sft_settings import SftSettings

    root = Path(work_dir)
    train_tasks, eval_tasks = resolve_tasks(settings.tasks)
    held_out = pretrain_files(eval_tasks)
    held_texts = {text for _, text in held_out}
    files = [(p, t) for p, t in pretrain_files(train_tasks) if t not in held_texts]
    if not files or not held_out:
        raise ValueError("pretraining needs training files and held-out files: check pretrain.tasks")
    if settings.init:
        previous = check_checkpoint(resolve_checkpoint(settings.init))
    else:
        previous = ensure_checkpoint(root / "stages" / "0-init", size=settings.size, seed=settings.seed)
    start = {"checkpoint": settings.init or "scratch",
             "sha256": hashlib.sha256((previous / "model.safetensors").read_bytes()).hexdigest()}
    # finished stages are reused by their rows and settings; this keeps them from being reused on other weights
    started = root / "stages" / "init.json"
    if started.is_file():
        recorded = json.loads(started.read_text())
        if recorded.get("sha256") != start["sha256"]:
            raise ValueError(f"{root} holds stages trained from {recorded.get('checkpoint')} (sha256 "
                             f"{str(recorded.get('sha256'))[:12]}...), not from {start['checkpoint']} (sha256 "
                             f"{start['sha256'][:12]}...): choose another --out")
    else:
        started.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(started, lambda tmp: Path(tmp).write_text(json.dumps(start) + "\n"))
    tokenizer = load_tokenizer(previous)
    stages = []
    for i, stage in enumerate(settings.stages, start=1):
        short = [(p, t) for p, t in files if stage.max_file_lines is None or len(t.splitlines()) <= stage.max_file_lines]
        mosaic = mosaic_files(short, stage.mosaic_files, settings.seed + i, stage.max_file_lines or 40)
        library = library_files(stage.library_files, settings.seed + i, stage.max_file_lines or 40)
        rows = _rows_for(stage, short + mosaic + library, tokenizer, settings.seed + i)
        sft = SftSettings(lr=stage.lr, schedule=stage.schedule, adam_betas=stage.adam_betas,
                          warmup_steps=stage.warmup_steps, max_steps=stage.steps, epochs=100,
                          max_tokens_per_batch=stage.max_tokens_per_batch, seed=settings.seed + i,
                          save_every=settings.save_every, device=settings.device,
                          compute_dtype=settings.compute_dtype)
        report = train_sft(previous, root / "stages" / f"{i}-{stage.name}", rows, sft)
        ended = end_loss([step.loss for step in report.steps])
        if stage.max_final_loss is not None and not ended < stage.max_final_loss:  # NaN stops too
            raise ValueError(
                f"stage {i}-{stage.name} ended at loss {ended:.3f} (the median of its last {END_LOSS_STEPS} "
                f"steps), not below its max_final_loss "
                f"{stage.max_final_loss}: what it should teach has not been learnt (kept in {report.out_dir}); "
                f"give the stage more steps (pretrain.stages) or start from another seed (pretrain.seed), "
                f"with another --out")
        previous = Path(report.out_dir)
        stages.append({"name": stage.name, "steps": report.total_steps, "files": len(short),
                       "mosaic_files": len(mosaic), "library_files": len(library), "rows": len(rows), "first_loss": report.first_loss,
                       "final_loss": report.final_loss, "end_loss": ended, "train_s": report.wall.get("train_s")})
    n = settings.eval_questions
    abilities = held_out_abilities(previous, held_out, n=n, seed=settings.seed, device=settings.device)
    final = root / "final"
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(previous, final, ignore=shutil.ignore_patterns(SFT_REPORT, "metrics.jsonl", "*.tfevents*"))
    weights = final / "model.safetensors"
    report = {
        "command": command,
        "settings": settings.model_dump(mode="json"),
        "parameters": checkpoint_parameters(final),  # from the safetensors header, no model load
        "init": start,
        "files": {"train": len(files), "held_out": len(held_out)},
        "stages": stages,
        "held_out": abilities,
        "sha256": {"model.safetensors": hashlib.sha256(weights.read_bytes()).hexdigest()},
    }
    (final / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
    return report
