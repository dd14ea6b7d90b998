"""Base policy: can it copy from its context, and does repair SFT on top of it fix programs it never saw?

1. Copying (the base, before any SFT), greedy, on held-out files (MBPP test solutions, never pretrained on):
   `quote_line` (quote line N of the shown file), `error_name` (repeat the name a NameError names),
   `edit_line` (asked to change line N, an action whose search text is line N verbatim), `quote_twin` (quote
   line N of a file that holds 1-3 near twins of it: the copy must match more than the last token or two),
   `quote_line_forced`: the quote_line questions teacher-forced, the line located (its first token that is not
   blank right) and then copied (positions right, where the two tokens before are ambiguous and elsewhere),
   `quote_line_in_episode`: the quote_line questions after the episode's system message, as repairs are asked,
   and `induction_repeats`: random ids of a few distinct tokens copied whole, where the token or two before a
   position do not say what comes next (no file: the copy a drifting line lacks).
2. Repair SFT: repair tasks minted from MBPP *test* programs (`pipeline.tasks.repair`, bugs the sandbox
   confirms, so pretraining saw none of these programs), split by program; one-action demonstrations on the
   train side (search/replace edits from the buggy file to the reference: `sft_examples` kind `edit`).
3. Held-out programs, greedy first action: `search_found` = share of tasks whose action is valid and whose
   every `<search>` text occurs in the file; `fix_unseen` = share whose hidden tests pass after the action
   (the sandbox judges); `fix_baseline` = the same for the most frequent training response applied to every
   held-out task, so that a frequent guess never passes for repair. 95% Wilson intervals over tasks. Where
   search texts fail, sorted (`search_outcome`): invalid action, indentation, near copy, drift; where found ones
   stand (`found_where`): on the bug's line and restoring it, on it and not, or on another line, and how many
   change nothing (`unchanged`: the replacement repeats the search text); and
   `named line quoted`: with each task's demonstrated think (which names line K) and edit header forced,
   the share whose search text the policy then writes is line K verbatim (`named_line_quoted`); `change
   known`: forced on to the token where the demonstrated fix leaves the line, whether that token is the
   policy's likeliest (in its top 3, likelier than copying the line on), and `change written`: forced
   through it, whether greedy writes the rest of the replacement as demonstrated, per family. Per bug
   family (`by_family`): tasks, `line chosen` (the think names the line the demonstration names), found,
   restored, fixed: where the choice of the line, its copy and its fix each stand.

The repair tasks show the visible tests' failing run, as `didpo tasks make-repair` makes them
(`--bare-tasks`: the code only). `--split-by instance` holds out unseen bugs of the training programs instead
(in-distribution); `--rehearse S` makes a share S of the SFT rows pretraining's copying rows, so that the
SFT keeps the base's copying; `--extra-tasks N` adds N repair tasks minted from MBPP's train and validation
programs (never a test program, so never one held out) to the training side; `--fix-rows N` adds N rows of
pretraining's `fix_line` kind (a repair turn without a test run on a respelled MBPP train or validation
program or standard-library function: name the bug's line, quote it, restore it; `--fix-mix` draws them
from other kinds of pretraining's rows too, `fix_name` and `edit_span` say); `--lr` and `--sft-steps` set
the SFT. `named line quoted` is also asked on the training side's programs: far above the held-out figure, the
SFT has learnt those programs' lines rather than copying.

Last line: `base_policy: params=<n> copy_acc=<x> search_found=<x> fix_unseen=<x> fix_baseline=<x>`; the
SFT's folder keeps base_policy.json: every figure, and each held-out task's answer as judged;
`--compare A B` pairs two recipes task by task, each side one such file or several comma-separated (the
same recipe over `--sft-seed`s): each run's count, the tasks where A's runs succeed more often, B's, as often
or never, and the exact sign test over the tasks that differ (McNemar's exact test for one run a side), for
fixed, found, line chosen and restored, beside the same test between a side's first two runs (one recipe's
own SFT seeds apart); runs on one work folder and `--seed` answer the same tasks.
Run: `.venv/bin/python benchmarks/base_policy.py [--base runs/base/final] [--tasks 300 --sft-steps 600]`;
without a base checkpoint it pretrains one with the default recipe first (`didpo model pretrain`, about an
hour on two cores; resumable). `--threads 2` uses both cores of a 2-core box (a `small` base: about 20
minutes). `--device cuda` pretrains a missing base, trains the SFT and generates and scores every answer on a
GPU; the sandbox judges on the CPU either way. One run per call: repeat with --seed for intervals over seeds,
with --sft-seed to repeat a recipe's SFT on the same held-out tasks (the base's copying answers are kept in
the work folder and asked once).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.tasks.repair import FAMILIES, parse_families  # noqa: E402


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _share(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k / n:.2f} [{lo:.2f}, {hi:.2f}] ({k}/{n})"


def _base(args, work: Path) -> Path:
    from training.pretrain import pretrain
    from training.pretrain_settings import PretrainSettings

    base = Path(args.base) if args.base else ROOT / "runs" / "base" / "final"
    if (base / "model.safetensors").is_file():
        return base
    if args.base:
        raise SystemExit(f"base_policy: no checkpoint at {base}")
    print(f"no base at {base}: pretraining one with the default recipe (resumable)", flush=True)
    pretrain(PretrainSettings(seed=args.seed, device=args.device), base.parent, command="benchmarks/base_policy.py")
    return base


def _copy_abilities(base: Path, cache: Path, *, n: int, seed: int, device: str = "cpu") -> dict:
    """`held_out_abilities` of `base` (greedy, so the same for the same weights, questions and seed): kept in
    the work folder, so that repeated SFTs on one base ask them once (delete the file after changing how
    they are asked: it is keyed by the weights, not by this code)."""
    from pipeline.tasks import load_source
    from training.pretrain import held_out_abilities, pretrain_files

    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):  # not asked yet, or a half-written file: ask again
        pass
    copy = held_out_abilities(base, pretrain_files(load_source("mbpp", split="test")), n=n, seed=seed,
                              device=device)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(copy))
    tmp.replace(cache)
    return json.loads(cache.read_text())  # as a later run reads it (JSON lists for tuples): one shape


def _repair_tasks(args, work: Path, judge, families: tuple[str, ...]):
    """(training tasks, held-out tasks, how many of the training tasks are `--extra-tasks`), minted once per
    work folder and settings, then read back."""
    from pipeline.tasks import load_source
    from pipeline.tasks.repair import judge_verdict, make_repair_tasks, write_recipes

    def minted(path: Path, splits: tuple[str, ...], n: int, test_fraction: float):
        if not path.is_file():
            sources = [task for split in splits for task in load_source("mbpp", split=split)]
            recipes = make_repair_tasks(sources, judge_verdict(judge, report=not args.bare_tasks), n=n,
                                        bugs=(1, args.max_bugs), seed=args.seed, families=families,
                                        test_fraction=test_fraction, split_by=args.split_by)
            write_recipes(recipes, path)
        return load_source("repair", path)

    by = "" if args.split_by == "program" else f"_by_{args.split_by}"
    bare = "_bare" if args.bare_tasks else ""
    fam = "" if families == FAMILIES else "_" + "-".join(families)
    tasks = minted(work / f"repair_seed{args.seed}_n{args.tasks}{by}{bare}{fam}.jsonl", ("test",), args.tasks,
                   args.test_fraction)
    train, held = [t for t in tasks if t.split == "train"], [t for t in tasks if t.split == "test"]
    # other programs than the benchmark's (MBPP test), all on the training side: the held-out side stays unseen
    extras = minted(work / f"repair_extra_seed{args.seed}_n{args.extra_tasks}{bare}{fam}.jsonl",
                    ("train", "validation"), args.extra_tasks, 0.0) if args.extra_tasks else []
    return train + extras, held, len(extras)


def parse_fix_mix(text: str) -> dict[str, float]:
    """`--fix-mix` ("fix_line=2,fix_name=1") as a mix of pretraining's file kinds; ValueError naming what is
    wrong."""
    from training.pretrain import FILE_KINDS
    from training.sft_settings import check_mix

    mix = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, weight = part.partition("=")
        try:
            mix[kind.strip()] = float(weight)
        except ValueError:
            raise ValueError(f"{part!r} is not KIND=WEIGHT") from None
    return check_mix(mix, FILE_KINDS, "fix row")


def fix_line_files(seed: int) -> list[tuple[str, str]]:
    """The files `--fix-rows` mutates: MBPP's train and validation programs (never a test program, so never
    one held out) and as many standard-library functions (too plentiful to learn by heart)."""
    from pipeline.tasks import load_source
    from training.pretrain import library_files, pretrain_files

    programs = pretrain_files([*load_source("mbpp", split="train"), *load_source("mbpp", split="validation")])
    return programs + library_files(len(programs), seed)


SEARCH_OUTCOMES = ("found", "invalid", "no edit", "indentation", "near copy", "drift")
FOUND_WHERE = ("restored", "bug's line, not restored", "another line")


def found_where(bugs, action) -> str:
    """Where a found edit (its first search/replace) stands against the task's bugs (`meta["bugs"]`): it quotes
    a bug's line (or, for a deleted line, brings it back) and `restored` it, quotes a bug's line and leaves it
    wrong, or quotes `another line`: choosing the line and writing its fix, told apart from copying."""
    edit = next(e for e in action.edits if e.op == "replace")
    replaced = {line.strip() for line in edit.replace.splitlines()}
    quoted = {line.strip() for line in edit.search.splitlines()}
    for bug in bugs:
        if bug["buggy"] is None:  # a deleted line: no text to quote, the fix brings the original back
            if bug["original"].strip() in replaced:
                return "restored"
        elif bug["buggy"].strip() in quoted:
            return "restored" if bug["original"].strip() in replaced else "bug's line, not restored"
    return "another line"


def changes_nothing(action) -> bool:
    """Whether every edit of an action is a search/replace whose replacement repeats its search text (line by
    line, trailing blanks aside): a found line written back as it was, the answer of a policy that located a
    line and did not know what to change in it."""
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.splitlines()]

    return bool(action.edits) and all(e.op == "replace" and lines(e.search) == lines(e.replace)
                                      for e in action.edits)


def search_outcome(workspace, action) -> str:
    """Where one parsed response's search text stands against its file: `found` (a valid edit whose every
    search text occurs, none for a whole-file write), `invalid` (no valid action), `no edit` (run_tests or
    finish), else the first search text not found is `indentation` (each of its lines is a line of the file
    but for the blanks around it), a `near copy` (its first line at difflib ratio >= 0.8 to a line of the
    file: a character or two lost) or a `drift` (a copy that wanders off every line of the file)."""
    import difflib

    if not action.ok:
        return "invalid"
    if action.kind in ("run_tests", "finish"):
        return "no edit"
    searches = [e for e in action.edits if e.op == "replace"]
    missing = next((e for e in searches if e.search not in workspace.get(e.path, "")), None)
    if missing is None:
        return "found"
    lines = {line.strip() for line in workspace.get(missing.path, "").splitlines() if line.strip()}
    wanted = [line.strip() for line in missing.search.splitlines() if line.strip()]
    if wanted and all(line in lines for line in wanted):
        return "indentation"
    first = wanted[0] if wanted else ""
    close = max((difflib.SequenceMatcher(None, line, first).ratio() for line in lines), default=0.0)
    return "near copy" if close >= 0.8 else "drift"


SEARCH_OPEN = "<search>\n"
REPLACE_CLOSE = "</replace>"


def forced_search(row) -> tuple[str, str]:
    """(the demonstration up to its first search text: the think naming the line and the edit header, that
    search text): forcing the first and asking for the second separates quoting the line one named from
    choosing it."""
    text = row.response_text
    start = text.index(SEARCH_OPEN) + len(SEARCH_OPEN)
    return text[:start], text[start:text.index("\n</search>", start)]


def first_edits(tasks, tokenizer, episode, seed: int) -> list:
    """Each task's demonstration as its first turn's one edit row (`sft_examples` kind `edit`, turn 0)."""
    from training.demonstrations import sft_examples

    return [r for r in sft_examples(tasks, tokenizer, episode, seed=seed, mix={"edit": 1.0}, finish_rate=0.0,
                                    episodes_per_task=1) if r.kind == "edit" and r.turn == 0]


def named_line_quoted(checkpoint, tasks, tokenizer, episode, seed: int, device: str = "cpu") -> tuple[int, int]:
    """(held-out tasks whose named line the policy quotes verbatim, tasks asked): each task's demonstration is
    forced up to its search text (`forced_search`), then the policy writes on greedily."""
    from training.pretrain import greedy_responses

    rows = first_edits(tasks, tokenizer, episode, seed)
    forced = [forced_search(r) for r in rows]
    prompts = [[*row.prompt_ids, *tokenizer(head, add_special_tokens=False)["input_ids"]]
               for row, (head, _) in zip(rows, forced, strict=True)]
    longest = max(len(tokenizer(want, add_special_tokens=False)["input_ids"]) for _, want in forced)
    texts = greedy_responses(checkpoint, prompts, max_new_tokens=longest + 8, seed=seed, device=device)
    hits = sum(text.split("\n</search>")[0] == want for text, (_, want) in zip(texts, forced, strict=True))
    return hits, len(rows)


def first_change(demonstrated: list[int], written_back: list[int]) -> int | None:
    """The first position where a demonstration's tokens leave those of the same response with its first
    replacement written back as the search text: where the fix starts to differ from the copy (None: the
    two are one)."""
    return next((i for i, (a, b) in enumerate(zip(demonstrated, written_back, strict=False)) if a != b),
                None if len(demonstrated) == len(written_back) else min(len(demonstrated), len(written_back)))


def change_known(checkpoint, tasks, tokenizer, episode, seed: int, device: str = "cpu") -> dict[str, dict[str, int]]:
    """Per bug family (and `all`): with each task's demonstration forced up to the token where its fix leaves
    the line it quotes (`first_change`), is the demonstrated token the policy's likeliest (`likeliest`), among
    its three likeliest (`top3`), and likelier than the token that copies the line on (`over_copy`)? And
    forced through that token, does greedy write the rest of the replacement as demonstrated (`completed`)?
    Line chosen and quoted are given here: what is left is knowing the change, then writing it out."""
    import torch

    from pipeline.agent.grammar import parse_response
    from pipeline.policy.loading import load_policy
    from training.pretrain import greedy_responses

    model = load_policy(checkpoint, device=device)
    family = {t.task_id: bug_family(t) for t in tasks}
    table: dict[str, Counter] = {}
    through, rests, keys = [], [], []
    for row in first_edits(tasks, tokenizer, episode, seed):
        edit = next(e for e in parse_response(row.response_text).edits if e.op == "replace")
        text = row.response_text
        back = tokenizer(text[:edit.replace_span[0]] + edit.search + text[edit.replace_span[1]:],
                         add_special_tokens=False)["input_ids"]
        k = first_change(list(row.response_ids), back)
        if k is None or k >= len(back):
            continue
        with torch.no_grad():
            ids = torch.tensor([[*row.prompt_ids, *row.response_ids[:k]]], device=device)
            logits = model(ids).logits[0, -1].float().cpu()
        want = row.response_ids[k]
        above = int((logits > logits[want]).sum())
        keys.append((family[row.task_id], "all"))
        for key in keys[-1]:
            table.setdefault(key, Counter()).update(asked=1, likeliest=above == 0, top3=above < 3,
                                                    over_copy=bool(logits[want] > logits[back[k]]))
        through.append([*row.prompt_ids, *row.response_ids[:k + 1]])
        rests.append(tokenizer.decode(row.response_ids[k + 1:]).split(REPLACE_CLOSE)[0])
    longest = max((len(tokenizer(rest, add_special_tokens=False)["input_ids"]) for rest in rests), default=0)
    written = (greedy_responses(checkpoint, through, max_new_tokens=longest + 8, seed=seed, device=device)
               if through else [])
    for text, rest, key in zip(written, rests, keys, strict=True):
        for name in key:
            table[name].update(completed=text.split(REPLACE_CLOSE)[0] == rest)
    return {key: {k: int(row[k]) for k in ("asked", "likeliest", "top3", "over_copy", "completed")}
            for key, row in sorted(table.items())}


def named_line(action) -> int | None:
    """The line number a parsed action's think names ("line K", the demonstrations' wordings; the last one
    where it names several: its conclusion), or None."""
    import re

    found = re.findall(r"\bline (\d+)", action.think or "", flags=re.IGNORECASE) if action.ok else []
    return int(found[-1]) if found else None


def bug_family(task) -> str:
    bugs = task.meta["bugs"]
    return bugs[0]["family"] if len(bugs) == 1 else "several bugs"


def judged(tasks, responses, judge, max_file_bytes: int) -> list[dict]:
    """Per task, its one response judged: `outcome` (`search_outcome`), `where` (`found_where` of a found edit,
    else ""), `line_chosen` (the think names the line the task's demonstration names: `repair_line`) and
    `unchanged` (a found edit that `changes_nothing`) and `fixed` (the hidden tests pass after it, in the
    sandbox)."""
    from pipeline.agent.grammar import InvalidAction, apply_action, parse_response
    from training.demonstrations import repair_line, solution_files

    out = []
    for task, text in zip(tasks, responses, strict=True):
        action = parse_response(text)
        outcome = search_outcome(task.workspace, action)
        found_edit = outcome == "found" and any(e.op == "replace" for e in action.edits)
        fixed = False
        if outcome not in ("invalid", "no edit"):
            files = apply_action(action, task.workspace, max_file_bytes=max_file_bytes)
            fixed = not isinstance(files, InvalidAction) and judge.run(task, files, hidden=True).status == "passed"
        out.append({"family": bug_family(task), "outcome": outcome,
                    "where": found_where(task.meta["bugs"], action) if found_edit else "",
                    "line_chosen": named_line(action) == repair_line(task.workspace, solution_files(task)),
                    "unchanged": found_edit and changes_nothing(action), "fixed": fixed})
    return out


BY_FAMILY = ("tasks", "line_chosen", "found", "restored", "fixed")


def by_family(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per bug family: tasks, thinks naming the demonstrated line, search texts found, found edits that
    restore the bug's line, fixes: where the line choice, the copy and the fix each stand."""
    table: dict[str, Counter] = {}
    for r in records:
        row = table.setdefault(r["family"], Counter())
        row.update(tasks=1, line_chosen=r["line_chosen"], found=r["outcome"] == "found",
                   restored=r["where"] == "restored", fixed=r["fixed"])
    return {family: {k: int(table[family][k]) for k in BY_FAMILY} for family in sorted(table)}


JUDGED = ("task_id", "fixed", "outcome", "line_chosen", "where")  # what `judged` records, and its id
PAIRED = {"fixed": lambda r: r["fixed"], "found": lambda r: r["outcome"] == "found",
          "line_chosen": lambda r: r["line_chosen"], "restored": lambda r: r["where"] == "restored"}


def paired(a: list[list[dict]], b: list[list[dict]], measure: str) -> dict[str, int | float]:
    """Two recipes' judged answers on the same held-out tasks (`held_out_answers`), each recipe one run or
    several (SFT seeds), compared task by task on `measure` (a key of PAIRED): the tasks where `a`'s runs
    succeed more often than `b`'s (`a_ahead`), less often (`b_ahead`), as often and at least once (`level`),
    or never (`neither`), and the exact two-sided sign test over the tasks where they differ (for one run a
    side, McNemar's exact test). Paired, it sees a difference that two overlapping Wilson intervals hide,
    and it says when one is a coin's worth of tasks. The test is over tasks given these runs: it sizes a
    difference between trained policies, and two SFT seeds of one recipe can differ by as much
    (docs/pretraining.md, twenty-seventh series), which `compare` shows beside it."""
    from scipy.stats import binomtest

    def rates(runs: list[list[dict]]) -> dict[str, float]:
        by_run = [{r["task_id"]: bool(PAIRED[measure](r)) for r in run} for run in runs]
        if any(len(got) != len(run) or got.keys() != by_run[0].keys()
               for got, run in zip(by_run, runs, strict=True)):
            raise ValueError("the runs of one side answered different held-out tasks (or one task twice): "
                             "compare runs of one work folder, seed and split")
        return {t: sum(got[t] for got in by_run) / len(runs) for t in by_run[0]}

    rate_a, rate_b = rates(a), rates(b)
    if sorted(rate_a) != sorted(rate_b):
        raise ValueError(f"the runs answered different held-out tasks ({len(rate_a)} and {len(rate_b)}): "
                         "compare runs of one work folder, seed and split")
    cells = Counter("a_ahead" if ra > rate_b[t] else "b_ahead" if ra < rate_b[t] else "level" if ra else "neither"
                    for t, ra in rate_a.items())
    ahead = cells["a_ahead"] + cells["b_ahead"]
    p = binomtest(cells["a_ahead"], ahead, 0.5).pvalue if ahead else 1.0
    return {key: cells[key] for key in ("a_ahead", "b_ahead", "level", "neither")} | {"p": float(p)}


def _judged_runs(paths: str) -> list[list[dict]]:
    """`--compare`'s side: one base_policy.json or several, comma-separated (one recipe over SFT seeds)."""
    runs = []
    for path in filter(None, (p.strip() for p in paths.split(","))):
        try:
            answers = json.loads(Path(path).read_text())["held_out_answers"]
            lacking = next((key for r in answers for key in JUDGED if key not in r), None)
            if lacking:  # a file of another kind, or written before the benchmark judged that
                raise KeyError(lacking)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"base_policy: --compare {path}: not a base_policy.json with judged held-out "
                             f"answers ({type(exc).__name__}: {exc})") from None
        runs.append(answers)
    if not runs:
        raise SystemExit(f"base_policy: --compare {paths!r}: names no file")
    return runs


def compare(paths_a: str, paths_b: str) -> None:
    """`--compare A B`: two recipes' base_policy.json files (each one, or several comma-separated: SFT seeds),
    each run's count and the tasks paired, one line per measure."""
    a, b = _judged_runs(paths_a), _judged_runs(paths_b)
    print(f"paired over {len(a[0])} held-out tasks\n  A ({len(a)} run{'s' * (len(a) > 1)}) {paths_a}\n"
          f"  B ({len(b)} run{'s' * (len(b) > 1)}) {paths_b}")
    print(f"  {'measure':<12} {'A runs':>12} {'B runs':>12} {'A ahead':>8} {'B ahead':>8} {'level':>6} "
          f"{'neither':>8}  {'sign test p':>11}  {'within A':>8}  {'within B':>8}")
    for measure in PAIRED:
        try:
            got = paired(a, b, measure)
            # a side's first two runs against each other: how far one recipe's own SFT seeds stand apart
            within = [f"{paired(side[:1], side[1:2], measure)['p']:.3f}" if len(side) > 1 else "-"
                      for side in (a, b)]
        except ValueError as exc:
            raise SystemExit(f"base_policy: --compare: {exc}") from None
        counts = [",".join(str(sum(bool(PAIRED[measure](r)) for r in run)) for run in side) for side in (a, b)]
        print(f"  {measure:<12} {counts[0]:>12} {counts[1]:>12} {got['a_ahead']:>8} {got['b_ahead']:>8} "
              f"{got['level']:>6} {got['neither']:>8}  {got['p']:>11.3f}  {within[0]:>8}  {within[1]:>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a pretrained checkpoint (default: runs/base/final, pretrained if missing)")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench" / "base_policy"))
    ap.add_argument("--seed", type=int, default=0, help="draws the repair tasks and the held-out split")
    ap.add_argument("--sft-seed", type=int,
                    help="draws the SFT's demonstrations, fix rows and order (default: --seed): another "
                         "SFT seed repeats a recipe on the same held-out tasks")
    ap.add_argument("--copy-questions", type=int, default=200)
    ap.add_argument("--tasks", type=int, default=300, help="repair tasks minted (train and held out)")
    ap.add_argument("--max-bugs", type=int, default=1, help="bugs per repair task: 1..this")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help="bug families of the repair tasks, comma-separated (pipeline/tasks/repair.py)")
    ap.add_argument("--test-fraction", type=float, default=0.3)
    ap.add_argument("--bare-tasks", action="store_true",
                    help="tasks show only the code, not the visible tests' failing run (docs/repair_tasks.md)")
    ap.add_argument("--split-by", choices=("program", "instance"), default="program",
                    help="held-out side: unseen programs, or unseen bugs of the training programs (in-distribution)")
    ap.add_argument("--extra-tasks", type=int, default=0,
                    help="repair tasks minted from MBPP's train and validation programs, added to the training side")
    ap.add_argument("--episodes", type=int, default=4, help="demonstrations per training task")
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rehearse", type=float, default=0.0,
                    help="share of SFT rows that are pretraining copy rows (training/pretrain.py `rehearsal_examples`)")
    ap.add_argument("--fix-rows", type=int, default=0,
                    help="SFT rows of pretraining's fix_line kind (a repair turn on a respelled file: name the bug's "
                    "line, quote it, restore it; other kinds by --fix-mix) on MBPP train and validation programs and "
                    "standard-library functions")
    ap.add_argument("--fix-mix", default="fix_line=1",
                    help="kinds of the --fix-rows and their weights, KIND=W comma-separated: fix_line, or any of "
                    "pretraining's file kinds (fix_name: a misspelt name, its NameError shown; edit_span: a "
                    "named change on a named line)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: what the figures in docs/pretraining.md used, unless they say)")
    ap.add_argument("--device", default="cpu",
                    help="where the base is pretrained (when missing), the SFT trains and every answer is generated "
                         "or scored: cpu, cuda or cuda:N; the sandbox judges on the CPU either way")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"),
                    help="only compare two recipes' base_policy.json files task by task and exit: each side one "
                         "file or several comma-separated (SFT seeds); paired counts, exact sign test p")
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    try:
        families = parse_families(args.families)
    except ValueError as exc:
        raise SystemExit(f"base_policy: --families {args.families!r}: {exc}") from None
    try:
        fix_mix = parse_fix_mix(args.fix_mix)
    except ValueError as exc:
        raise SystemExit(f"base_policy: --fix-mix {args.fix_mix!r}: {exc}") from None
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import torch

    for option, value in (("--extra-tasks", args.extra_tasks), ("--fix-rows", args.fix_rows)):
        if value < 0:
            raise SystemExit(f"base_policy: {option} {value}: must be at least 0")
    if args.threads < 1:
        raise SystemExit(f"base_policy: --threads {args.threads}: must be at least 1")
    torch.set_num_threads(args.threads)
    from training.sft_settings import check_device

    try:
        check_device(args.device)
    except ValueError as exc:
        raise SystemExit(f"base_policy: --device: {exc}") from None
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit(f"base_policy: --device {args.device}: no CUDA device on this machine (use --device cpu)")
    from pipeline.agent import EpisodeSettings
    from pipeline.policy.loading import checkpoint_parameters, load_tokenizer
    from pipeline.policy.settings import PolicySettings
    from pipeline.sandbox import Judge, SandboxPool, SandboxSettings
    from pipeline.tasks import load_source
    from training.demonstrations import sft_examples
    from training.pretrain import pretrain_examples, pretrain_files, rehearsal_examples
    from training.sft import evaluate_actions, train_sft
    from training.sft_settings import SftSettings

    sft_seed = args.seed if args.sft_seed is None else args.sft_seed
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base = _base(args, work)
    params = checkpoint_parameters(base)
    weights = hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest()[:12]
    copy = _copy_abilities(base, work / f"copy_{weights}_n{args.copy_questions}_seed{args.seed}.json",
                           n=args.copy_questions, seed=args.seed, device=args.device)
    print(f"base {base}: {params:,} parameters", flush=True)
    for kind, res in copy.items():
        where = "random  " if kind.startswith("induction") else "held-out"  # random ids: nothing was held out
        print(f"  {where} {kind:<21} {_share(round(res['accuracy'] * res['n']), res['n'])}", flush=True)
    forced = copy["quote_line_forced"]
    print(f"  quote_line teacher-forced: line located {forced['accuracy']:.2f}, then copied {forced['copy']:.3f} "
          f"of positions ({forced['copy_ambiguous']:.3f} where the two tokens before are ambiguous, "
          f"{forced['copy_other']:.3f} elsewhere)", flush=True)
    leaves = {kind: res["where_copies_leave"] for kind, res in copy.items() if "where_copies_leave" in res}
    for kind, leave in leaves.items():
        print(f"  {kind} copies that leave the line: {leave['left']}, {leave['left_ambiguous']} where the two "
              f"tokens before also stand in the prompt followed by another ({leave['copied_ambiguous']} of "
              f"{leave['copied']} positions copied right)", flush=True)
        ends = copy[kind]["outcomes"]
        print(f"  {kind} answers: {ends['verbatim']} verbatim, {ends['another_line']} another line of the file, "
              f"{ends['drifts']} right start then drift, {ends['wrong_start']} wrong start", flush=True)

    episode = EpisodeSettings(action_spec="brief", max_response_tokens=384)
    with SandboxPool(SandboxSettings(pool_size=2)) as pool:
        judge = Judge(pool)
        train, held, n_extra = _repair_tasks(args, work, judge, families)
        extra = f" + {n_extra} from MBPP train and validation programs" if n_extra else ""
        print(f"repair tasks (MBPP test programs, split by {args.split_by}): {len(train) - n_extra} train{extra}, "
              f"{len(held)} held out", flush=True)
        tokenizer = load_tokenizer(base)
        rows = sft_examples(train, tokenizer, episode, seed=sft_seed, mix={"edit": 1.0}, finish_rate=0.0,
                            episodes_per_task=args.episodes)
        rows = [r for r in rows if r.kind == "edit"]
        demonstrations = len(rows)
        copy_rows = rehearsal_examples(pretrain_files(load_source("mbpp", split="train")), tokenizer,
                                       n=round(args.rehearse / (1 - args.rehearse) * demonstrations),
                                       seed=sft_seed) if args.rehearse else []
        fix_rows = pretrain_examples(fix_line_files(sft_seed), tokenizer, n=args.fix_rows, seed=sft_seed,
                                     mix=fix_mix, respell=True) if args.fix_rows else []
        rows += copy_rows + fix_rows
        demos = hashlib.sha256(json.dumps([(r.prompt_ids, r.response_ids) for r in rows]).encode()).hexdigest()[:8]
        # per base and demonstrations: a finished SFT is reused only for the same inputs
        sft_dir = work / (f"sft_{weights}_{demos}_lr{args.lr:g}_steps{args.sft_steps}_seed{args.seed}"
                          + (f"_sft{sft_seed}" if sft_seed != args.seed else ""))
        train_sft(base, sft_dir, rows, SftSettings(lr=args.lr, max_steps=args.sft_steps, epochs=100,
                                                   warmup_steps=min(20, args.sft_steps // 10),
                                                   max_tokens_per_batch=4096,
                                                   seed=sft_seed, device=args.device))
        policy = PolicySettings(checkpoint=str(sft_dir), temperature=0.0, max_new_tokens=384, device=args.device)
        ev = evaluate_actions(sft_dir, held, episode, policy, seed=args.seed)
        records = judged(held, ev["responses"], judge, episode.max_file_bytes)
        outcomes = Counter(r["outcome"] for r in records) + Counter(r["where"] for r in records if r["where"])
        found, fixed = outcomes["found"], sum(r["fixed"] for r in records)
        frequent, count = Counter(r.response_text for r in rows[:demonstrations]).most_common(1)[0]
        baseline = sum(r["fixed"] for r in judged(held, [frequent] * len(held), judge, episode.max_file_bytes))
        named, asked = named_line_quoted(sft_dir, held, tokenizer, episode, args.seed, args.device)
        seen = train[:len(held)]  # as many as held out: the same cost and interval width
        named_seen, asked_seen = named_line_quoted(sft_dir, seen, tokenizer, episode, args.seed, args.device)
        known = change_known(sft_dir, held, tokenizer, episode, args.seed, args.device)
    n = len(held)
    print(f"after repair SFT ({demonstrations} demonstrations, {len(copy_rows)} copy rows, "
          f"{len(fix_rows)} fix rows, {args.sft_steps} steps at lr {args.lr}), greedy on {n} held-out tasks "
          f"({'unseen programs' if args.split_by == 'program' else 'unseen bugs of training programs'}):")
    print(f"  valid action   {_share(ev['valid'], n)}")
    print(f"  search found   {_share(found, n)}")
    print(f"  fixed          {_share(fixed, n)}")
    print(f"  baseline fixed {_share(baseline, n)} (the most frequent training response, {count} times)")
    print("  search texts   " + ", ".join(f"{k} {outcomes[k]}" for k in SEARCH_OUTCOMES))
    unchanged = sum(r["unchanged"] for r in records)
    print("  found texts    " + ", ".join(f"{k} {outcomes[k]}" for k in FOUND_WHERE)
          + f"; {unchanged} of them unchanged (the replacement repeats the search text)")
    per_family = by_family(records)
    print("  by bug family  " + "".join(f"{k.replace('_', ' '):>12}" for k in BY_FAMILY))
    for family, row in per_family.items():
        print(f"    {family:<13}" + "".join(f"{row[k]:>12}" for k in BY_FAMILY))
    print(f"  named line quoted {_share(named, asked)} (the demonstration's think and edit header forced)")
    print(f"  ... on training programs {_share(named_seen, asked_seen)} (the first {asked_seen} training tasks)")
    every = known.get("all", {"asked": 0, "likeliest": 0, "top3": 0, "over_copy": 0, "completed": 0})
    print(f"  change known   {_share(every['likeliest'], max(every['asked'], 1))} (forced to where the fix leaves "
          f"the line: its token the likeliest; among the top 3: {every['top3']}, over the copy: {every['over_copy']})")
    print("    by family    " + ", ".join(f"{f} {row['likeliest']}/{row['asked']}" for f, row in known.items()
                                          if f != "all"))
    print(f"  change written {_share(every['completed'], max(every['asked'], 1))} (forced through that token: "
          "greedy writes the rest of the replacement as demonstrated)")
    print("    by family    " + ", ".join(f"{f} {row['completed']}/{row['asked']}" for f, row in known.items()
                                          if f != "all"))
    result = {"params": params, "copy_acc": copy["quote_line"]["accuracy"],
              "error_name": copy["error_name"]["accuracy"],
              "edit_line": copy["edit_line"]["accuracy"],
              "quote_line_in_episode": copy["quote_line_in_episode"]["accuracy"],
              "induction_repeats": copy["induction_repeats"]["accuracy"],
              "quote_twin": copy["quote_twin"]["accuracy"],
              "quote_line_leaves": leaves["quote_line"], "quote_twin_leaves": leaves["quote_twin"],
              "search_found": found / n, "fix_unseen": fixed / n,
              "search_outcomes": {k: outcomes[k] for k in SEARCH_OUTCOMES},
              "found_where": {k: outcomes[k] for k in FOUND_WHERE}, "unchanged": unchanged,
              "by_family": per_family,
              "named_line_quoted": named / asked, "named_line_quoted_train": named_seen / asked_seen,
              "change_known": known,
              "fix_baseline": baseline / n, "held_out": n, "split_by": args.split_by,
              "failure_shown": not args.bare_tasks, "seed": args.seed,
              "families": list(families),
              "base": str(base),
              "sft": {"steps": args.sft_steps, "lr": args.lr, "demonstrations": demonstrations,
                      "copy_rows": len(copy_rows), "fix_rows": len(fix_rows), "fix_mix": fix_mix,
                      "training_tasks": len(train), "seed": sft_seed,
                      "extra_tasks": n_extra},
              "seconds": round(time.perf_counter() - t0),
              # each held-out task's greedy answer as judged, to read without generating again
              "held_out_answers": [{"task_id": t.task_id, "response": text, **r}
                                   for t, text, r in zip(held, ev["responses"], records, strict=True)]}
    (sft_dir / "base_policy.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"base_policy: params={params} copy_acc={result['copy_acc']:.2f} search_found={found / n:.2f} "
          f"fix_unseen={fixed / n:.2f} fix_baseline={baseline / n:.2f}")


if __name__ == "__main__":
    main()
