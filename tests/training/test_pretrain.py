"""Pretraining rows: each synthetic task's answer is what its question asks for, in the file it shows; rows are
seeded, bounded and never drawn from held-out tasks; the copy check scores a verbatim answer only."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re

import pytest

from pipeline.agent.grammar import apply_action, parse_response
from pipeline.policy.loading import load_policy, load_tokenizer
from pipeline.tasks import load_source
from training.pretrain import (
    DEFAULT_PRETRAIN_MIX,
    FILE_KINDS,
    REPORT_NAME,
    changed_span,
    copy_accuracy,
    copy_task,
    forced_quote,
    induction_accuracy,
    induction_row,
    library_files,
    lookback_ambiguous,
    mosaic_files,
    near_twins,
    ordinary_ids,
    pretrain,
    pretrain_examples,
    pretrain_files,
    quote_line_forced,
    quote_outcome,
    rehearsal_examples,
    respelled,
    undefined_name,
    where_copies_leave,
)
from training.pretrain_settings import DEFAULT_STAGES, REHEARSAL_MIX, PretrainSettings, PretrainStage

FILE = (
    "def count_even(xs):\n"
    '    """How many even numbers: a docstring word like Total is no name."""\n'
    "    total = 0\n"
    "\n"
    "    for x in xs:\n"
    "        if x % 2 == 0:\n"
    "            total += 1\n"
    "    return total\n"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_policy):
    return load_tokenizer(tiny_policy)


def _draws(kind, n=40):
    rng = random.Random(0)
    return [copy_task(kind, "solution.py", FILE, rng) for _ in range(n)]


def test_quote_line_answers_the_numbered_line_of_the_shown_file():
    lines = FILE.splitlines()
    asked = set()
    for message, answer in _draws("quote_line"):
        n = int(re.search(r"Quote line (\d+) of solution\.py\.$", message).group(1))
        assert answer == lines[n - 1] and answer.strip()
        assert "## solution.py (8 lines)" in message  # the whole file, as episodes show it: lines numbered
        assert f"\n{n}| {answer}\n" in message and all(f"{i}| {line}" in message for i, line in enumerate(lines, 1))
        asked.add(n)
    assert len(asked) > 3 and 4 not in asked  # several lines, never the blank one


def test_error_name_answers_a_name_of_the_code_named_in_the_error():
    for message, answer in _draws("error_name"):
        assert f"NameError: name '{answer}' is not defined" in message
        assert answer in {"count_even", "xs", "total", "x"}  # not `Total` of the docstring, not builtins


def test_edit_line_answers_with_an_action_that_makes_line_n_the_new_line():
    for message, answer in _draws("edit_line"):
        n, new_line = re.search(r"Change line (\d+) to:\n(.*)$", message, re.S).groups()
        action = parse_response(answer)
        assert action.ok and action.kind == "edit"
        (edit,) = action.edits
        assert FILE.count(edit.search) == 1 and FILE.splitlines()[int(n) - 1] + "\n" in edit.search
        after = apply_action(action, {"solution.py": FILE}, max_file_bytes=1 << 20)["solution.py"]
        assert after.splitlines()[int(n) - 1] == new_line != FILE.splitlines()[int(n) - 1]


def test_an_edit_line_answer_counts_when_its_search_text_is_line_n():
    from training.pretrain import answered

    want = next(a for _, a in _draws("edit_line") if "total" in parse_response(a).edits[0].search)
    assert answered("edit_line", want, want)
    search = parse_response(want).edits[0].search
    other = want.replace(f"<search>\n{search}", "<search>\n" + search.replace("total", "totl", 1))
    assert other != want and not answered("edit_line", other, want)  # a copy that drifts
    think_only = want.split("</think>")[0] + "</think>\n<run_tests/>"
    assert not answered("edit_line", think_only, want) and not answered("edit_line", "", want)
    # quoting kinds stay verbatim, ends ignored
    assert answered("quote_line", "  total = 0 \n", "    total = 0") and not answered("quote_line", "total", "total = 0")


def test_fix_line_is_a_repair_turn_that_names_the_changed_line_and_quotes_it(tokenizer):
    from pipeline.agent import EpisodeSettings
    from pipeline.agent.episode import Episode
    from pipeline.tasks.repair import bugs_note

    named = set()
    source = next(t for t in load_source("mbpp", split="train", limit=1))  # read once: only its tests are used
    for message, answer in _draws("fix_line"):
        shown = re.search(r"```\n(.*)```", message, re.S).group(1)
        buggy = "".join(line.split("| ", 1)[1] + "\n" for line in shown.splitlines())
        diff = [i for i, (a, b) in enumerate(zip(buggy.splitlines(), FILE.splitlines(), strict=True)) if a != b]
        assert len(diff) == 1  # the shown file is FILE with one line changed
        action = parse_response(answer)
        line = int(re.search(r"line (\d+)", action.think, re.I).group(1))
        assert line == diff[0] + 1  # the think names the changed line
        assert action.edits[0].search.splitlines()[0] == buggy.splitlines()[line - 1]  # and quotes it
        assert apply_action(action, {"solution.py": buggy}, max_file_bytes=1 << 20)["solution.py"] == FILE
        named.add(line)
        # the user message of a repair episode's first turn on that file
        task = dataclasses.replace(source, instructions=bugs_note("solution.py", 1), workspace={"solution.py": buggy})
        episode = Episode(task, executor=None, settings=EpisodeSettings())
        episode.state = dataclasses.replace(episode.state, visible_total=1)
        assert message == episode.prompt_messages()[1]["content"]
    assert len(named) > 2
    # always after the episode's system message, whatever the share
    rows = pretrain_examples([("solution.py", FILE)], tokenizer, n=5, seed=0, mix={"fix_line": 1.0}, max_tokens=2048)
    assert rows and all("careful software engineer" in tokenizer.decode(r.prompt_ids) for r in rows)


def _name_error(text: str, call: str) -> tuple[str, int] | None:
    """What Python itself raises running `text` then `call`: (the NameError's name, its line in `text`) or None."""
    import traceback

    try:
        exec(compile(text + call, "<file>", "exec"), {})
    except NameError as exc:
        return exc.name, traceback.extract_tb(exc.__traceback__)[-1].lineno
    return None


UNDEFINED_CASES = [  # (file, the call that runs it)
    ("def f(x):\n    return y + x\n", "f(1)"),  # a read of a name bound nowhere
    ("def f(rdian):\n    import math\n    return radian * math.pi\n", "f(1)"),  # the parameter misspelt
    ("def f(xs):\n    return lenn(xs)\n", "f([])"),  # a builtin misspelt
    ("class A:\n    z = 1\n    def g(self):\n        return z\n", "A().g()"),  # class names are no closure
    ("def f(n):\n    return [q * m for q in range(n)]\n", "f(2)"),  # inside a comprehension
    ("import math\ndef f():\n    return math.pi + len([])\n", "f()"),  # imports and builtins are bound
    ("def f():\n    global G\n    G = 1\n    return G\n", "f()"),  # bound by a global statement
    ("def f(a):\n    def g():\n        return a\n    return g()\n", "f(1)"),  # a closure's free name
]


@pytest.mark.parametrize("text, call", UNDEFINED_CASES)
def test_undefined_name_is_the_name_error_python_raises(text, call):
    raised = _name_error(text, "\n" + call + "\n")
    assert undefined_name(text) == raised  # (name, line) or None both
    assert undefined_name("def f(:\n") is None  # no parse, nothing named


def test_fix_name_shows_the_name_error_its_misspelling_raises_and_restores_the_spelling():
    rows = [row for row in _draws("fix_name") if row]
    assert len(rows) > 10
    for message, answer in rows:
        shown = re.search(r"```\n(.*)```", message, re.S).group(1)
        buggy = "".join(line.split("| ", 1)[1] + "\n" for line in shown.splitlines())
        named = re.search(r"NameError: name '(\w+)' is not defined \(solution.py, line (\d+)\)", message)
        assert named and _name_error(buggy, "\ncount_even([1, 2])\n") == (named.group(1), int(named.group(2)))
        action = parse_response(answer)
        assert apply_action(action, {"solution.py": buggy}, max_file_bytes=1 << 20)["solution.py"] == FILE
        changed = [(a, b) for a, b in zip(buggy.splitlines(), FILE.splitlines(), strict=True) if a != b]
        assert len(changed) == 1 and set(re.findall(r"\w+", changed[0][0])) - set(re.findall(r"\w+", FILE))
    # no name to misspell
    assert copy_task("fix_name", "solution.py", "def f():\n    return 1\n", random.Random(0)) is None


@pytest.mark.parametrize("before, after, span", [
    ("    (res)", "    return (res)", ("(", "return (")),  # an insertion takes the piece after it along
    ("def f(rdian):", "def f(radian):", ("rdian", "radian")),  # whole words
    ("  if a != b:", "  if a == b:", ("!=", "==")),  # whole operators
    ("  x = f(b, a)", "  x = f(a, b)", ("b, a", "a, b")),
    ("  foo", "  foo()", ("foo", "foo()")),  # at the line's end: the piece before
])
def test_changed_span_is_the_shortest_run_of_whole_pieces_that_differs(before, after, span):
    old, new = changed_span(before, after)
    assert (old, new) == span and before.replace(old, new, 1) == after


def test_edit_span_names_the_change_and_answers_with_the_line_changed_there():
    spans = set()
    for message, answer in _draws("edit_span"):
        shown = re.search(r"```\n(.*)```", message, re.S).group(1)
        buggy = "".join(line.split("| ", 1)[1] + "\n" for line in shown.splitlines())
        n, old, new = re.search(r"On line (\d+) of solution\.py, change `(.+)` to `(.+)`\.$", message).groups()
        action = parse_response(answer)
        assert action.edits[0].search.splitlines()[0] == buggy.splitlines()[int(n) - 1]  # line N quoted
        assert action.edits[0].replace.splitlines()[0] == buggy.splitlines()[int(n) - 1].replace(old, new, 1)
        assert apply_action(action, {"solution.py": buggy}, max_file_bytes=1 << 20)["solution.py"] == FILE
        spans.add((old, new))
    assert len(spans) > 3


def test_apply_edit_answers_with_the_whole_file_after_the_shown_edit():
    for message, answer in _draws("apply_edit"):
        block = message.split("Apply this edit and write the whole file:\n", 1)[1]
        action = parse_response("<think>\nx\n</think>\n" + block)
        assert action.ok
        assert apply_action(action, {"solution.py": FILE}, max_file_bytes=1 << 20)["solution.py"] == answer != FILE


def test_quote_many_answers_each_asked_line_after_its_number():
    lines = FILE.splitlines()
    for message, answer in _draws("quote_many"):
        asked = re.search(r"Quote lines ([\d, ]+) of solution\.py, each after its number\.$", message).group(1)
        numbers = [int(n) for n in asked.split(", ")]
        got = answer.split("\n")
        assert 2 <= len(numbers) == len(got)
        for n, line in zip(numbers, got, strict=True):
            assert line == f"{n}| {lines[n - 1]}" and lines[n - 1].strip()


def test_quote_twin_asks_for_a_line_among_near_twins_of_it(tokenizer):
    lines = FILE.splitlines()
    twinned = 0
    for message, answer in _draws("quote_twin", n=60):
        n = int(re.search(r"Quote line (\d+) of solution\.py\.$", message).group(1))
        shown = re.findall(r"^\d+\| (.*)$", message, flags=re.M)
        assert shown[n - 1] == answer and answer in lines and answer.strip()
        # the file's own lines in their order, with twins in between: none of them the asked line
        rest = iter(shown)
        assert all(any(line == other for other in rest) for line in lines)  # a subsequence, in order
        extra = list(shown)
        for line in lines:
            extra.remove(line)
        assert all(twin.strip() != answer.strip() for twin in extra) and len(extra) <= 3
        twinned += bool(extra)
    assert twinned >= 50  # most asked lines get twins: only a line too short for one goes without

    # the point of a twin: positions of the answer where the two tokens before also stand in the prompt
    # followed by another token, so that matching only them goes astray
    def ambiguous_share(kind):
        hits = total = 0
        for message, answer in _draws(kind, n=60):
            prompt = tokenizer(message, add_special_tokens=False)["input_ids"]
            copy = tokenizer(answer, add_special_tokens=False)["input_ids"]
            hits += sum(lookback_ambiguous(prompt, copy, j) for j in range(2, len(copy)))
            total += max(0, len(copy) - 2)
        return hits / total

    assert ambiguous_share("quote_twin") > 1.5 * ambiguous_share("quote_line")


def test_near_twins_start_like_the_line_and_leave_it():
    rng = random.Random(0)
    line = FILE.splitlines()[5]  # "        if x % 2 == 0:"
    twins = [t for _ in range(30) for t in near_twins(FILE, 5, rng)]
    assert len(twins) >= 30 and all(t != line for t in twins)
    # a twin keeps the line's first characters: its start with another line's end, or one catalogue bug
    assert all(t.startswith("        if x") for t in twins)
    assert any(t.endswith(":") for t in twins) and any(not t.endswith(":") for t in twins)
    assert near_twins("x\ny = 1\n", 0, rng) == []  # a one-piece line has no start to share


def test_copy_checks_score_verbatim_answers_only(tokenizer, tiny_policy, monkeypatch):
    # the scoring, with a stand-in for the model that answers the even-numbered questions right
    import training.pretrain as pretrain_module

    def half_right(checkpoint, prompts, **_):
        text = [tokenizer.decode(list(p)) for p in prompts]
        return [right(t) if i % 2 == 0 else "no" for i, t in enumerate(text)]

    def quoted(prompt_text):  # the numbered line the question asks for, read off the shown file
        n = re.search(r"Quote line (\d+) of", prompt_text).group(1)
        return re.search(rf"^{n}\| (.*)$", prompt_text, flags=re.M).group(1) + "  "  # trailing space ignored

    monkeypatch.setattr(pretrain_module, "greedy_responses", half_right)
    files = [("solution.py", FILE)]
    right = quoted
    for kind in ("quote_line", "quote_twin"):
        got = copy_accuracy(tiny_policy, files, n=10, seed=0, kind=kind)
        assert got["accuracy"] == 0.5 and got["where_copies_leave"]["left"] == 0  # "no" copies nothing
        assert got["outcomes"] == {"verbatim": 5, "another_line": 0, "drifts": 0, "wrong_start": 5}
    right = lambda text: text.split("<|im_start|>assistant")[-1].strip()  # noqa: E731 (never the answer)
    assert "where_copies_leave" not in copy_accuracy(tiny_policy, files, n=4, seed=0, kind="error_name")

    def eos_cut(prompt_text):  # an induction prompt's ids, less the closing eos: the copy itself
        return prompt_text.removesuffix(tokenizer.eos_token)

    right = eos_cut
    assert induction_accuracy(tiny_policy, n=10, seed=0)["accuracy"] == 0.5
    right = lambda text: eos_cut(text) + " "  # noqa: E731 (an extra space is not a whole copy)
    assert induction_accuracy(tiny_policy, n=10, seed=0, alphabet=(4, 16))["accuracy"] == 0.0


def test_induction_rows_repeat_random_ordinary_tokens(tokenizer):
    rng = random.Random(0)
    rows = [induction_row(ordinary_ids(tokenizer), tokenizer.eos_token_id, rng) for _ in range(20)]
    special = set(tokenizer.all_special_ids)
    for row in rows:
        assert row.response_ids == row.prompt_ids and row.prompt_ids[-1] == tokenizer.eos_token_id
        ids = row.prompt_ids[:-1]  # the end of the copy is itself copied: eos closes both
        assert 16 <= len(ids) <= 64 and not special & set(ids)
    assert len({r.prompt_ids for r in rows}) == 20


def test_induction_repeats_rows_make_short_lookback_ambiguous(tokenizer):
    # the copy of a code line fails where the token before also stands elsewhere followed by another: these rows
    # are made of such positions, where whole-vocabulary rows have almost none
    def ambiguous_share(rows):  # positions whose token before also stands in the row followed by another
        hits = total = 0
        for row in rows:
            ids = row.prompt_ids[:-1]
            hits += sum(lookback_ambiguous(ids, ids, j, width=1) for j in range(1, len(ids)))
            total += len(ids) - 1
        return hits / total

    ordinary, eos = ordinary_ids(tokenizer), tokenizer.eos_token_id
    rng = random.Random(0)
    repeats = [induction_row(ordinary, eos, rng, alphabet=(4, 16)) for _ in range(50)]
    plain = [induction_row(ordinary, eos, rng) for _ in range(50)]
    for row in repeats:
        ids = row.prompt_ids[:-1]
        assert row.response_ids == row.prompt_ids and row.prompt_ids[-1] == eos and row.kind == "induction_repeats"
        assert 16 <= len(ids) <= 64 and len(set(ids)) <= 16 and set(ids) <= set(ordinary)
    assert ambiguous_share(repeats) > 0.5 > 0.05 > ambiguous_share(plain)
    # drawn by the mix like any kind, and a mix without it draws the rows it always drew
    files = [("a.py", FILE)]
    mixed = pretrain_examples(files, tokenizer, n=40, seed=1, mix={"induction_repeats": 1.0, "quote_line": 1.0})
    assert {r.kind for r in mixed} == {"induction_repeats", "quote_line"}
    assert all(len(set(r.prompt_ids)) <= 17 for r in mixed if r.kind == "induction_repeats")  # + eos


def test_quote_outcome_tells_a_wrong_lookup_from_a_drifting_copy():
    prompt = "## a.py (3 lines)\n```\n1| x = 1\n2|     return x\n3| y = x\n```\n\nQuote line 2 of a.py."
    assert quote_outcome(prompt, "    return x", "return x ", True) == "verbatim"  # ends' whitespace ignored
    assert quote_outcome(prompt, "    return x", "y = x", False) == "another_line"  # line 3: looked up wrong
    assert quote_outcome(prompt, "    return x", "return y", True) == "drifts"
    assert quote_outcome(prompt, "    return x", "Quote line 2 of a.py.", False) == "wrong_start"  # not a file line
    assert quote_outcome(prompt, "    return x", "", False) == "wrong_start"


def test_where_copies_leave_counts_misses_at_ambiguous_lookback():
    # prompt: 1 2 3 ... 1 2 4; copying "1 2 3" is ambiguous at 3 (the two before, 1 2, are followed by 4 too)
    prompt = (1, 2, 3, 9, 1, 2, 4, 8)
    assert lookback_ambiguous(prompt, (1, 2, 3), 2) and not lookback_ambiguous(prompt, (1, 2, 4, 8), 3)
    assert not lookback_ambiguous(prompt, (1, 2, 3), 1)  # fewer than two tokens before: never counted
    answers = [
        (prompt, (1, 2, 3, 9), (1, 2, 4, 8)),  # leaves at the ambiguous position
        (prompt, (2, 4, 8, 5), (2, 4, 7)),  # leaves where the two before (2 4) only ever precede 8
        (prompt, (1, 2, 3, 9), (1, 2, 3, 9)),  # verbatim: positions 2 and 3 copied right, position 2 ambiguous
        (prompt, (1, 2, 3, 9), (1, 2)),  # stopped early: not a copy that left the text
        (prompt, (5, 6, 7), (6, 6, 7)),  # wrong from the first token: nothing copied
    ]
    # positions before the one where a copy leaves count as copied right from the third token on: only the
    # verbatim answer has any
    assert where_copies_leave(answers) == {"left": 2, "left_ambiguous": 1, "copied": 2, "copied_ambiguous": 1}


def test_forced_quote_tells_a_lost_line_from_a_lost_copy():
    prompt = (1, 2, 3, 9, 1, 2, 4, 8)
    want = (7, 1, 2, 3, 9)  # a blank token first (7: the indentation), then the line
    # the line found, copied right except at the ambiguous position (after 1 2 the prompt has 3 and 4)
    assert forced_quote(prompt, want, (7, 1, 2, 4, 9), first=1) == {
        "located": 1, "copied": 2, "positions": 3, "copied_ambiguous": 0, "ambiguous": 1}
    # another line's first token: not located, however well the rest is copied under teacher forcing
    assert forced_quote(prompt, want, (7, 5, 2, 3, 9), first=1)["located"] == 0
    assert forced_quote(prompt, want, (7, 5, 2, 3, 9), first=1)["copied"] == 3


def test_quote_line_forced_asks_copy_accuracys_questions(tiny_policy, monkeypatch):
    import torch

    import training.pretrain as pretrain_module

    files = [("solution.py", FILE)]
    seen = []

    def scored(prompt, want, predicted, first, width=2):  # the real scoring, recording what it was given
        seen.append((tuple(prompt), tuple(want), tuple(predicted), first))
        return forced_quote(prompt, want, predicted, first, width)

    monkeypatch.setattr(pretrain_module, "forced_quote", scored)
    got = quote_line_forced(tiny_policy, files, n=6, seed=3)
    tokenizer = load_tokenizer(tiny_policy)
    asks, answers = pretrain_module._questions(tokenizer, files, n=6, seed=3, kind="quote_line")
    assert [s[0] for s in seen] == asks  # the greedy measure's questions, in order
    for (_, want, predicted, first), answer in zip(seen, answers, strict=True):
        assert tokenizer.decode(want) == answer and len(predicted) == len(want)  # one prediction per answer token
        # the first token that is not blank: what the line number alone must choose
        assert not tokenizer.decode(want[:first]).strip() and tokenizer.decode(want[:first + 1]).strip()
    assert got["n"] == 6 and got["counts"]["positions"] == sum(len(w) - f - 1 for _, w, _, f in seen)
    assert 0.0 <= got["accuracy"] <= 1.0 and 0.0 <= got["copy_ambiguous"] <= 1.0
    # predicted[j] is the next token after the prompt and want[:j], as decoding one step at a time finds it
    model = load_policy(tiny_policy)
    prompt, want, predicted, _ = seen[0]
    with torch.no_grad():
        for j, token in enumerate(predicted):
            logits = model(torch.tensor([[*prompt, *want[:j]]])).logits[0, -1]
            assert float(logits.max() - logits[token]) < 1e-4  # the argmax, up to a float tie


def test_a_file_without_code_offers_only_plain_modelling():
    rng = random.Random(0)
    assert copy_task("code", "a.py", "\n\n", rng) == ("", "\n\n")
    assert all(copy_task(k, "a.py", "\n\n", rng) is None for k in FILE_KINDS if k != "code")
    for kind in ("summarise", "induction", "induction_repeats"):  # induction rows have no file
        with pytest.raises(ValueError, match="unknown pretraining kind"):
            copy_task(kind, "a.py", FILE, rng)


def test_files_skip_held_out_tasks_and_repeats():
    tasks = load_source("humaneval", limit=6)
    files = pretrain_files(tasks + tasks, held_out=[tasks[0].task_id])
    texts = [t for _, t in files]

    def texts_of(task_list):
        return {t if t.endswith("\n") else t + "\n" for task in task_list
                for f in (task.workspace, task.reference) for t in f.values()}

    only_held = texts_of(tasks[:1]) - texts_of(tasks[1:])
    assert only_held and not only_held & set(texts)  # the held-out task's own files never appear
    assert len(texts) == len(set(texts)) and set(texts) <= texts_of(tasks[1:])
    assert all(p.endswith(".py") for p, _ in files)


def test_examples_are_seeded_bounded_and_follow_the_mix(tokenizer):
    files = pretrain_files(load_source("mbpp", split="train", limit=30))
    rows = pretrain_examples(files, tokenizer, n=60, seed=3, max_tokens=400)
    assert rows == pretrain_examples(files, tokenizer, n=60, seed=3, max_tokens=400)
    assert rows != pretrain_examples(files, tokenizer, n=60, seed=4, max_tokens=400)
    assert len(rows) == 60 and all(len(r.prompt_ids) + len(r.response_ids) <= 400 for r in rows)
    assert all(r.response_ids[-1] == tokenizer.eos_token_id for r in rows)
    assert {r.kind for r in rows} == set(DEFAULT_PRETRAIN_MIX)
    only = pretrain_examples(files, tokenizer, n=20, seed=3, mix={"quote_line": 1.0})
    assert {r.kind for r in only} == {"quote_line"}
    for bad in ({"quote_line": 0.0}, {"gossip": 1.0}, {"quote_line": -1.0}):
        with pytest.raises(ValueError, match="mix"):
            pretrain_examples(files, tokenizer, n=5, seed=0, mix=bad)


def test_a_share_of_file_rows_comes_after_the_episode_system_message(tokenizer):
    from pipeline.agent.episode import system_prompt
    from pipeline.agent.grammar import ACTION_SPECS

    files = pretrain_files(load_source("mbpp", split="train", limit=30))
    mix = {"quote_line": 1.0, "edit_line": 1.0, "induction": 1.0}
    plain = pretrain_examples(files, tokenizer, n=60, seed=3, mix=mix, max_tokens=1200)
    # without a share the rows are those of recipes written before it existed
    assert plain == pretrain_examples(files, tokenizer, n=60, seed=3, mix=mix, max_tokens=1200, system_share=0.0)
    framed = pretrain_examples(files, tokenizer, n=60, seed=3, mix=mix, max_tokens=1200, system_share=1.0)
    shown = {r.kind: [] for r in framed}
    for r in framed:
        shown[r.kind].append(tokenizer.decode(r.prompt_ids))
    wordings = {spec: system_prompt(spec) for spec in ACTION_SPECS}
    for kind in ("quote_line", "edit_line"):
        assert all(any(w in text for w in wordings.values()) for text in shown[kind])
    assert all(any(w in text for text in shown["quote_line"] + shown["edit_line"]) for w in wordings.values())
    assert not any("careful software engineer" in text for text in shown["induction"])
    assert not any("careful software engineer" in tokenizer.decode(r.prompt_ids) for r in plain)
    half = pretrain_examples(files, tokenizer, n=200, seed=3, mix={"quote_line": 1.0}, max_tokens=1200,
                             system_share=0.5)
    share = sum("careful software engineer" in tokenizer.decode(r.prompt_ids) for r in half) / len(half)
    assert 0.35 < share < 0.65
    with pytest.raises(ValueError, match="system_share"):
        pretrain_examples(files, tokenizer, n=5, seed=0, system_share=1.5)


def test_mosaic_files_are_seeded_new_orders_of_known_lines():
    files = [("a.py", FILE), ("b.py", "x = 1\ny = 2\n\nprint(x + y)\n")]
    known = {line for _, text in files for line in text.splitlines() if line.strip()}
    made = mosaic_files(files, 50, seed=3, max_lines=6)
    assert made == mosaic_files(files, 50, seed=3, max_lines=6) != mosaic_files(files, 50, seed=4, max_lines=6)
    assert [p for p, _ in made] == [f"mosaic_{i}.py" for i in range(50)]
    lines = [text.splitlines() for _, text in made]
    assert all(2 <= len(ls) <= 6 and set(ls) <= known for ls in lines)
    assert {len(ls) for ls in lines} == set(range(2, 7))  # varied lengths
    assert not {text for _, text in made} & {text for _, text in files}  # new files, not copies
    with pytest.raises(ValueError, match="non-blank"):
        mosaic_files([("e.py", "\n")], 1, seed=0)


def test_respelled_files_keep_their_structure_with_fresh_names_and_digits():
    import ast
    import io
    import tokenize

    names = ("alpha", "beta", "gamma", "delta", "total")  # "total" is taken by the file: never drawn for another
    text = FILE + "print(count_even([12, 7]), xs.count(3), 'count_even of 12')\n"
    new = respelled(text, random.Random(5), names)
    assert new == respelled(text, random.Random(5), names) and new != text
    ast.parse(new)  # still code
    kinds = [t.type for t in tokenize.generate_tokens(io.StringIO(new).readline)]
    assert kinds == [t.type for t in tokenize.generate_tokens(io.StringIO(text).readline)]
    assert len(new.splitlines()) == len(text.splitlines())
    mapping = {}
    for old_tok, new_tok in zip(tokenize.generate_tokens(io.StringIO(text).readline),
                                tokenize.generate_tokens(io.StringIO(new).readline), strict=True):
        if old_tok.type == tokenize.NAME and old_tok.string != new_tok.string:
            assert mapping.setdefault(old_tok.string, new_tok.string) == new_tok.string  # one spelling per name
    # every name of its own renamed, each to a distinct pool name the file did not already use
    assert set(mapping) == {"count_even", "xs", "x", "total"}
    assert set(mapping.values()) == {"alpha", "beta", "gamma", "delta"}
    assert "def " in new and "return " in new and "print(" in new and ".count(" in new  # keywords, builtins, attributes
    renamed = mapping["count_even"]
    assert f"'{renamed} of " in new  # the same name inside a string follows the code
    runs = re.findall(r"[0-9]+", text)  # digits redrawn, each run at its length
    redrawn = [re.findall(r"[0-9]+", respelled(text, random.Random(s), names)) for s in range(5)]
    assert all([len(r) for r in rs] == [len(r) for r in runs] for rs in redrawn)
    assert any(rs != runs for rs in redrawn)
    assert respelled("def broken(:\n", random.Random(0), names) == "def broken(:\n"  # does not tokenize: kept


def test_respelled_rows_answer_from_the_respelled_file(tokenizer):
    files = pretrain_files(load_source("mbpp", split="train", limit=30))
    plain = pretrain_examples(files, tokenizer, n=30, seed=3, mix={"quote_line": 1.0})
    fresh = pretrain_examples(files, tokenizer, n=30, seed=3, mix={"quote_line": 1.0}, respell=True)
    originals = {line.strip() for _, text in files for line in text.splitlines()}
    assert all(r.response_text.strip() in originals for r in plain)
    assert sum(r.response_text.strip() not in originals for r in fresh) >= 15  # most quotes are of new text
    for row in fresh:  # and each is a line of the file its own prompt shows
        prompt = tokenizer.decode(row.prompt_ids)
        assert row.response_text in prompt


def test_rehearsal_rows_are_the_copying_stage_rows_on_respelled_files(tokenizer):
    files = pretrain_files(load_source("mbpp", split="train", limit=30))
    rows = rehearsal_examples(files, tokenizer, n=40, seed=5)
    assert rows == pretrain_examples(files, tokenizer, n=40, seed=5, mix=REHEARSAL_MIX, respell=True)
    assert {r.kind for r in rows} == set(REHEARSAL_MIX) == set(next(s for s in DEFAULT_STAGES if s.respell).mix)
    originals = {line.strip() for _, text in files for line in text.splitlines()}
    quotes = [r for r in rows if r.kind == "quote_line"]
    assert quotes and sum(r.response_text.strip() not in originals for r in quotes) >= len(quotes) // 2


def test_library_files_are_seeded_short_parsable_functions_of_the_standard_library():
    import ast
    import inspect
    import textwrap

    made = library_files(40, seed=2, max_lines=12)
    assert made == library_files(40, seed=2, max_lines=12) != library_files(40, seed=3, max_lines=12)
    assert [p for p, _ in made] == [f"lib_{i}.py" for i in range(40)]
    for _, text in made:
        assert len(text.splitlines()) <= 12
        tree = ast.parse(text)  # a whole function, dedented
        assert isinstance(tree.body[0], ast.FunctionDef | ast.AsyncFunctionDef)
    # real standard-library code: a short stdlib function is among everything there is to draw from
    every = {text for _, text in library_files(100_000, seed=0, max_lines=12)}
    assert textwrap.dedent(inspect.getsource(inspect.isgeneratorfunction)) in every
    assert library_files(0, seed=0) == []


@pytest.mark.slow
def test_stages_train_in_order_resume_and_measure_on_held_out_files(tmp_path):
    import hashlib

    from pipeline.policy.loading import check_checkpoint
    from pipeline.tasks.settings import TaskSourceSpec, TasksSettings

    settings = PretrainSettings(
        size="tiny", seed=1, eval_questions=4, compute_dtype="bfloat16",
        tasks=TasksSettings(train=(TaskSourceSpec(source="mbpp", split="train", limit=8),),
                            eval=(TaskSourceSpec(source="mbpp", split="test", limit=3),)),
        stages=(PretrainStage(name="induction", mix={"induction": 1.0}, steps=3, warmup_steps=1,
                              max_tokens_per_batch=512),
                PretrainStage(name="short", mix={"quote_line": 1.0, "quote_many": 1.0}, steps=2, warmup_steps=1,
                              max_tokens_per_batch=1024, max_file_lines=12, mosaic_files=30, library_files=20,
                              schedule="constant", adam_betas=(0.8, 0.9))))
    report = pretrain(settings, tmp_path, command="test")
    assert [s["name"] for s in report["stages"]] == ["induction", "short"]
    assert [(s["mosaic_files"], s["library_files"]) for s in report["stages"]] == [(0, 0), (30, 20)]
    sft = json.loads((tmp_path / "stages" / "2-short" / "sft_report.json").read_text())["settings"]
    assert (sft["schedule"], sft["adam_betas"], sft["lr"]) == ("constant", [0.8, 0.9], 2e-3)
    assert sft["compute_dtype"] == "bfloat16"  # every stage's forward under the run's autocast
    assert all(s["steps"] == n for s, n in zip(report["stages"], (3, 2), strict=True))
    final = check_checkpoint(tmp_path / "final")
    digest = hashlib.sha256((final / "model.safetensors").read_bytes()).hexdigest()
    assert report["sha256"]["model.safetensors"] == digest
    assert json.loads((final / REPORT_NAME).read_text())["command"] == "test"
    assert set(report["held_out"]) == {"quote_line", "quote_twin", "error_name", "edit_line", "quote_line_forced",
                                       "quote_line_in_episode", "induction_repeats"}
    assert all(a["n"] == 4 and 0.0 <= a["accuracy"] <= 1.0 for a in report["held_out"].values())
    assert report["held_out"]["quote_line_in_episode"]["action_spec"] == "brief"
    assert report["init"]["checkpoint"] == "scratch"
    assert report["files"]["held_out"] > 0
    # a rerun finds every stage done: the same weights, no training
    stamp = (tmp_path / "stages" / "2-short" / "model.safetensors").stat().st_mtime_ns
    again = pretrain(settings, tmp_path, command="test")
    assert again["sha256"] == report["sha256"]
    assert (tmp_path / "stages" / "2-short" / "model.safetensors").stat().st_mtime_ns == stamp

    # continued pretraining: the stages start from `init`'s weights and tokenizer, not from a new model
    more = settings.model_copy(update={"init": str(final), "size": "small", "stages": (PretrainStage(
        name="framed", mix={"quote_line": 1.0}, steps=1, warmup_steps=0, max_tokens_per_batch=2048,
        system_share=1.0),)})
    cont = pretrain(more, tmp_path / "more", command="test")
    assert cont["init"] == {"checkpoint": str(final), "sha256": digest}
    assert cont["parameters"] == report["parameters"]  # the init's model, not the `small` preset
    assert not (tmp_path / "more" / "stages" / "0-init").exists()
    assert (tmp_path / "more" / "final" / "tokenizer.json").read_bytes() == (final / "tokenizer.json").read_bytes()
    assert cont["sha256"] != report["sha256"]
    # the same folder resumed from other weights is refused: its finished stages were trained from the first
    with pytest.raises(ValueError, match="holds stages trained from .*choose another --out"):
        pretrain(more.model_copy(update={"init": str(tmp_path / "stages" / "1-induction")}), tmp_path / "more",
                 command="test")
    for bad, error in (("bundled:nowhere", "no bundled checkpoint 'nowhere'"), (str(tmp_path / "none"), "none")):
        with pytest.raises((ValueError, OSError), match=error):
            pretrain(more.model_copy(update={"init": bad}), tmp_path / "bad", command="test")


@pytest.mark.slow
def test_a_run_killed_inside_a_stage_resumes_there_and_trains_the_same_steps(tmp_path, monkeypatch):
    import training.loop as loop
    from pipeline.tasks.settings import TaskSourceSpec, TasksSettings

    settings = PretrainSettings(
        size="tiny", seed=2, eval_questions=2, save_every=2,
        tasks=TasksSettings(train=(TaskSourceSpec(source="mbpp", split="train", limit=6),),
                            eval=(TaskSourceSpec(source="mbpp", split="test", limit=2),)),
        stages=(PretrainStage(name="short", mix={"quote_line": 1.0}, steps=5, warmup_steps=1,
                              max_tokens_per_batch=512, max_file_lines=12),))
    whole = pretrain(settings, tmp_path / "whole", command="test")
    real = loop.save_state

    def killed_at_step_four(store, state_dir, step, *args, **kwargs):
        if step >= 4:  # the process dies after step 4, before anything of it is saved
            raise KeyboardInterrupt
        real(store, state_dir, step, *args, **kwargs)

    def stage_report(out):
        return json.loads((out / "stages" / "1-short" / "sft_report.json").read_text())

    for every, resumed_from in ((2, 2), (0, None)):  # without saves inside the stage, it starts over
        out = tmp_path / f"killed{every}"
        monkeypatch.setattr(loop, "save_state", killed_at_step_four)
        with pytest.raises(KeyboardInterrupt):
            pretrain(settings.model_copy(update={"save_every": every}), out, command="test")
        monkeypatch.setattr(loop, "save_state", real)
        again = pretrain(settings.model_copy(update={"save_every": every}), out, command="test")
        assert stage_report(out)["resumed_from_step"] == resumed_from and again["stages"][0]["steps"] == 5
        assert again["stages"][0]["final_loss"] == pytest.approx(whole["stages"][0]["final_loss"], rel=1e-4)


@pytest.mark.slow
def test_a_short_default_recipe_builds_a_base_a_pipeline_round_starts_from(tmp_path):
    """The shipped base's recipe (every default stage, a few steps each, the tiny size, few files), then a
    pipeline round whose policy is that base: the path `make demo` takes from models/base."""
    from typer.testing import CliRunner

    from pipeline import schema
    from pipeline.tasks.settings import TaskSourceSpec, TasksSettings
    from workflows.cli import app

    # two steps form no circuit: the induction stage's loss bar is the stop test's (tests/workflows/test_cli.py)
    short = tuple(s.model_copy(update={"steps": 2, "warmup_steps": 1, "max_tokens_per_batch": 512,
                                       "max_final_loss": None}) for s in DEFAULT_STAGES)
    settings = PretrainSettings(size="tiny", eval_questions=2, stages=short,
                                tasks=TasksSettings(train=(TaskSourceSpec(source="mbpp", split="train", limit=10),),
                                                    eval=(TaskSourceSpec(source="mbpp", split="test", limit=2),)))
    report = pretrain(settings, tmp_path / "base", command="test")
    assert [s["name"] for s in report["stages"]] == [s.name for s in DEFAULT_STAGES]
    result = CliRunner().invoke(app, [
        "pipeline", "run", "--checkpoint", str(tmp_path / "base" / "final"), "--set", f"run.root={tmp_path / 'runs'}",
        "--set", "tasks.train=[{source: mbpp, split: train, limit: 1}]", "--set", "pipeline.samples_per_task=2",
        "--set", "episode.max_turns=1", "--set", "policy.max_new_tokens=16"])
    assert result.exit_code == 0, result.output
    steps = schema.read_table(tmp_path / "runs" / "local" / "round=0" / "steps", "steps").to_pylist()
    assert len(steps) == 2 and {s["turn"] for s in steps} == {0}


def test_the_default_stages_loss_bars_pass_the_shipped_base_recipe_run():
    """A bar stops runs that did not learn the stage; the run the shipped base came from learnt every stage, so
    a bar it would not pass is set too strict (models/base/pretrain_report.json records each stage's loss)."""
    from pipeline.assets import PRETRAIN_REPORT, asset_dir

    report = json.loads((asset_dir("models") / "base" / PRETRAIN_REPORT).read_text())
    # that run's report predates `end_loss` (the median of the last 50 steps): its five-step mean stands in
    ended = {stage["name"]: stage.get("end_loss", stage["final_loss"]) for stage in report["stages"]}
    barred = [s for s in DEFAULT_STAGES if s.max_final_loss is not None]
    assert {s.name for s in barred} >= {"induction", "files"}
    for stage in barred:
        assert ended[stage.name] < stage.max_final_loss, stage.name


def test_a_stages_end_loss_is_the_median_of_its_last_steps_blind_to_spikes():
    from training.pretrain import end_loss

    flat = [0.5] * 45 + [0.1, 3.0, 0.1, 4.0, 0.2]  # a stage that never dropped, spiking either way at its end
    assert end_loss(flat) == 0.5
    dropped = [5.0] * 100 + [0.1] * 49 + [2.5]
    assert end_loss(dropped) == 0.1
    assert end_loss(dropped, window=150) == 5.0  # a window reaching back before the drop sees the plateau
    assert math.isnan(end_loss([])) and math.isnan(end_loss([0.1, float("nan"), 0.1]))
