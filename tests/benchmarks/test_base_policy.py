"""benchmarks/base_policy.py's scoring: the demonstrated fixes of held-out repair tasks name their line, are
found and fix every task in the sandbox; a response that edits nothing real finds and fixes none; the Wilson
interval by hand."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from builders import load_benchmark

from pipeline.agent import EpisodeSettings
from pipeline.agent.grammar import parse_response
from pipeline.policy.loading import load_tokenizer
from pipeline.sandbox import Judge, SandboxPool, SandboxSettings
from pipeline.tasks import load_source
from pipeline.tasks.repair import make_repair_tasks, write_recipes
from training.demonstrations import sft_examples


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("base_policy", "base_policy_under_test")


def test_wilson_interval_by_hand(bench):
    lo, hi = bench.wilson(8, 10)
    assert (round(lo, 3), round(hi, 3)) == (0.49, 0.943)
    assert bench.wilson(0, 0) == (0.0, 1.0)


def _edit(search: str) -> str:
    return (f'<think>\nLine 3 of solution.py is wrong; I fix it.\n</think>\n<edit path="solution.py">\n<search>\n'
            f'{search}\n</search>\n<replace>\n    return total\n</replace>\n</edit>\n')


def test_search_outcomes_sort_where_a_search_text_fails(bench):
    workspace = {"solution.py": "def count(xs):\n    total = sum(x * x for x in xs)\n    total\n"}
    cases = {
        "found": _edit("    total"),
        "indentation": _edit("      total = sum(x * x for x in xs)"),  # two blanks too many
        "near copy": _edit("    total = sum(x * x for x in x)"),
        "drift": _edit("    total = sum(x', (x',1) : "),
        "invalid": "<think>\nx\n</think>\n<edit>",
        "no edit": "<think>\nx\n</think>\n<run_tests/>",
    }
    outcomes = {k: bench.search_outcome(workspace, parse_response(text)) for k, text in cases.items()}
    assert outcomes == {k: k for k in cases}
    assert set(cases) == set(bench.SEARCH_OUTCOMES)


def test_found_where_tells_the_bugs_line_and_its_fix_from_another_line(bench):
    def edit(search, replace):
        return parse_response(f'<think>\nLine 2 is wrong.\n</think>\n<edit path="solution.py">\n<search>\n{search}\n'
                              f'</search>\n<replace>\n{replace}\n</replace>\n</edit>\n')

    dropped = [{"line": 3, "family": "drop_return", "original": "    return total", "buggy": "    total"}]
    assert bench.found_where(dropped, edit("    total", "    return total")) == "restored"
    assert bench.found_where(dropped, edit("    total", "    return (res)")) == "bug's line, not restored"
    assert bench.found_where(dropped, edit("    total = 0", "    return total")) == "another line"
    deleted = [{"line": 2, "family": "delete_line", "original": "    total = 0", "buggy": None}]
    assert bench.found_where(deleted, edit("def f(xs):", "def f(xs):\n    total = 0")) == "restored"
    assert bench.found_where(deleted, edit("def f(xs):", "def f(ys):")) == "another line"
    assert set(bench.FOUND_WHERE) == {"restored", "bug's line, not restored", "another line"}


def test_first_change_is_where_a_fix_leaves_the_copy(bench):
    assert bench.first_change([1, 2, 3, 9], [1, 2, 4, 9]) == 2
    assert bench.first_change([1, 2, 3, 4], [1, 2]) == 2  # the fix writes on where the copy ends
    assert bench.first_change([1, 2], [1, 2]) is None


def test_changes_nothing_tells_a_line_written_back_from_an_edit(bench):
    def edit(*pairs):
        blocks = "".join(f'<edit path="solution.py">\n<search>\n{a}\n</search>\n<replace>\n{b}\n</replace>\n</edit>\n'
                         for a, b in pairs)
        return parse_response(f"<think>\nLine 2 is wrong.\n</think>\n{blocks}")

    assert bench.changes_nothing(edit(("    total", "    total")))
    assert bench.changes_nothing(edit(("    total", "    total  ")))  # trailing blanks change nothing
    assert not bench.changes_nothing(edit(("    total", "    return total")))
    assert not bench.changes_nothing(edit(("    total", "  total")))  # indentation is a change
    assert not bench.changes_nothing(edit(("    total", "    total"), ("x = 1", "x = 2")))  # one edit changes
    assert not bench.changes_nothing(parse_response("<think>\nrun\n</think>\n<run_tests/>\n"))  # no edit at all


def test_named_line_reads_the_thinks_line_number(bench):
    def think(text):
        return parse_response(f"<think>\n{text}\n</think>\n<run_tests/>\n")

    assert bench.named_line(think("The bug in `f` is on line 12.")) == 12
    assert bench.named_line(think("The test fails with NameError: name 'x' is not defined (solution.py, line 9)\n"
                                  "Line 3 of solution.py is wrong; I fix it.")) == 3
    assert bench.named_line(think("The tests fail; I look again.")) is None
    assert bench.named_line(parse_response("no action at all")) is None


def test_by_family_counts_each_stage_of_a_repair(bench):
    records = [
        {"family": "drop_return", "outcome": "found", "where": "restored", "line_chosen": True, "fixed": True},
        {"family": "drop_return", "outcome": "found", "where": "another line", "line_chosen": False, "fixed": False},
        {"family": "misspell", "outcome": "drift", "where": "", "line_chosen": True, "fixed": False},
    ]
    assert bench.by_family(records) == {
        "drop_return": {"tasks": 2, "line_chosen": 1, "found": 2, "restored": 1, "fixed": 1},
        "misspell": {"tasks": 1, "line_chosen": 1, "found": 0, "restored": 0, "fixed": 0},
    }


def test_fix_line_files_hold_no_held_out_program(bench):
    from training.pretrain import pretrain_files

    files = bench.fix_line_files(seed=0)
    held_out = {text for _, text in pretrain_files(load_source("mbpp", split="test"))}
    library = [path for path, _ in files if path.startswith("lib_")]
    assert files and len(library) == len(files) - len(library)  # as many library functions as programs
    assert not held_out & {text for _, text in files}


@pytest.mark.slow
def test_demonstrated_fixes_score_full_and_a_wrong_edit_scores_nothing(bench, tmp_path, tiny_policy,
                                                                      monkeypatch):
    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        judge = Judge(pool)

        def fails(task, workspace):
            return judge.run(task, workspace).status != "passed"

        recipes = make_repair_tasks(load_source("mbpp", split="test", limit=8), fails, n=4, bugs=(1, 2), seed=0)
        write_recipes(recipes, tmp_path / "r.jsonl")
        tasks = load_source("repair", tmp_path / "r.jsonl")
        rows = sft_examples(tasks, load_tokenizer(tiny_policy), EpisodeSettings(action_spec="brief"), seed=0,
                            mix={"edit": 1.0}, finish_rate=0.0)
        edits = {r.task_id: r for r in rows if r.kind == "edit" and r.turn == 0}
        assert set(edits) == {t.task_id for t in tasks}
        first = {task_id: r.response_text for task_id, r in edits.items()}
        for task in tasks:  # the forced head names the line; the search text is the demonstration's, in the file
            head, want = bench.forced_search(edits[task.task_id])
            assert head.endswith("<search>\n") and re.search(r"line \d+", head.split("</think>")[0], re.I)
            assert edits[task.task_id].response_text.startswith(f"{head}{want}\n</search>")
            assert want and want in task.workspace["solution.py"]
        named, asked = bench.named_line_quoted(tiny_policy, tasks, load_tokenizer(tiny_policy),
                                               EpisodeSettings(action_spec="brief"), 0)
        assert asked == len(tasks) and 0 <= named <= asked
        records = bench.judged(tasks, [first[t.task_id] for t in tasks], judge, 256 * 1024)
        # a demonstration names its own line, and its first edit quotes and restores a bug's line
        assert all(r["outcome"] == "found" and r["where"] == "restored" and r["line_chosen"] and r["fixed"]
                   and not r["unchanged"] for r in records)
        table = bench.by_family(records)
        assert sum(row["tasks"] for row in table.values()) == len(tasks)
        assert all(row["tasks"] == row["line_chosen"] == row["found"] == row["restored"] == row["fixed"]
                   for row in table.values())
        wrong = "<think>x</think>\n<edit>\n<file>solution.py</file>\n<search>no such text</search>\n" \
                "<replace>y</replace>\n</edit>\n"
        records = bench.judged(tasks, [wrong] * len(tasks), judge, 256 * 1024)
        assert not any(r["outcome"] == "found" or r["line_chosen"] or r["fixed"] or r["unchanged"] for r in records)

        def written_back(task):  # the demonstration's line found, and written back as it stands
            edit = next(e for e in parse_response(first[task.task_id]).edits if e.op == "replace")
            search = edit.search.rstrip("\n")
            return (f'<think>\nLine 2 is wrong.\n</think>\n<edit path="{edit.path}">\n<search>\n{search}\n'
                    f'</search>\n<replace>\n{search}\n</replace>\n</edit>\n')

        records = bench.judged(tasks, [written_back(t) for t in tasks], judge, 256 * 1024)
        assert all(r["outcome"] == "found" and r["unchanged"] and not r["fixed"] for r in records)

        # change known: the real (untrained) policy, then a stand-in that always writes the demonstrated token
        episode = EpisodeSettings(action_spec="brief")
        tokenizer = load_tokenizer(tiny_policy)
        known = bench.change_known(tiny_policy, tasks, tokenizer, episode, 0)
        every = known["all"]
        assert every["asked"] == len(tasks) == sum(row["asked"] for f, row in known.items() if f != "all")
        assert every["likeliest"] <= every["top3"] <= every["asked"] and every["over_copy"] <= every["asked"]
        assert every["completed"] <= every["asked"]
        demo_rows = [r for r in sft_examples(tasks, tokenizer, episode, seed=0, mix={"edit": 1.0}, finish_rate=0.0,
                                             episodes_per_task=1) if r.kind == "edit" and r.turn == 0]
        next_token = {(*r.prompt_ids, *r.response_ids[:j]): r.response_ids[j]
                      for r in demo_rows for j in range(len(r.response_ids))}

        class Demonstrator(torch.nn.Module):
            def forward(self, ids):
                logits = torch.zeros(1, ids.shape[1], len(tokenizer))
                logits[0, -1, next_token[tuple(ids[0].tolist())]] = 1.0
                return SimpleNamespace(logits=logits)

        def demonstrate(_checkpoint, prompts, **_):  # greedy generation by the same stand-in
            texts = []
            for prompt in prompts:
                ids = list(prompt)
                while tuple(ids) in next_token:
                    ids.append(next_token[tuple(ids)])
                texts.append(tokenizer.decode(ids[len(prompt):]))
            return texts

        monkeypatch.setattr("pipeline.policy.loading.load_policy", lambda *_, **__: Demonstrator())
        monkeypatch.setattr("training.pretrain.greedy_responses", demonstrate)
        every = bench.change_known(tiny_policy, tasks, tokenizer, episode, 0)["all"]
        n = len(tasks)
        assert every == {"asked": n, "likeliest": n, "top3": n, "over_copy": n, "completed": n}
        # a policy that writes a stray word after the changed token writes no fix out
        monkeypatch.setattr("training.pretrain.greedy_responses",
                            lambda _c, prompts, **_: [" # stray</replace>"] * len(prompts))
        assert bench.change_known(tiny_policy, tasks, tokenizer, episode, 0)["all"]["completed"] == 0


@pytest.mark.slow
def test_extra_tasks_join_the_training_side_from_programs_never_held_out(bench, tmp_path):
    import argparse
    import json

    from pipeline.tasks.mbpp import mbpp_original_split
    from pipeline.tasks.repair import FAMILIES

    args = argparse.Namespace(seed=0, tasks=6, max_bugs=1, split_by="program", bare_tasks=False, test_fraction=0.5,
                              extra_tasks=0)
    with SandboxPool(SandboxSettings(pool_size=1)) as pool:
        judge = Judge(pool)
        train, held, n_extra = bench._repair_tasks(args, tmp_path, judge, FAMILIES)
        args.extra_tasks = 3
        more, held_again, n_more = bench._repair_tasks(args, tmp_path, judge, FAMILIES)
    assert n_extra == 0 and n_more == 3 and len(more) == len(train) + 3
    assert [t.task_id for t in held_again] == [t.task_id for t in held]  # the held-out side does not move
    assert [t.task_id for t in more[:len(train)]] == [t.task_id for t in train]
    extras = [json.loads(line) for line in next(tmp_path.glob("repair_extra_*.jsonl")).read_text().splitlines()]
    assert len(extras) == 3 and all(r["split"] == "train" for r in extras)
    # every extra program is MBPP train or validation: never a test program, so never a held-out one
    numbers = [int(r["source_task"].rsplit("/", 1)[1]) for r in extras]
    assert all(mbpp_original_split(n) in ("train", "validation", "prompt") for n in numbers)
    assert {t.split for t in more} == {"train"}


def _answers(fixed, found=None):
    found = found or fixed
    return [{"task_id": f"t{i}", "fixed": f, "outcome": "found" if g else "drift", "line_chosen": False,
             "where": "restored" if f else ""} for i, (f, g) in enumerate(zip(fixed, found, strict=True))]


def _cells(got):
    return tuple(got[k] for k in ("a_ahead", "b_ahead", "level", "neither"))


def test_paired_counts_tasks_and_gives_the_exact_mcnemar_p(bench):
    a = _answers([1, 1, 1, 1, 1, 1, 0, 0, 0, 0])
    b = list(reversed(_answers([0, 0, 0, 0, 1, 1, 0, 0, 0, 0])))  # order does not matter: paired by task id
    got = bench.paired([a], [b], "fixed")
    assert _cells(got) == (4, 0, 2, 4)
    assert got["p"] == pytest.approx(2 * 0.5 ** 4)  # 4 of 4 discordant tasks one way: two-sided binomial
    assert bench.paired([a], [a], "fixed")["p"] == 1.0  # no task differs
    even = bench.paired([_answers([1, 0])], [_answers([0, 1])], "fixed")
    assert (even["a_ahead"], even["b_ahead"], even["p"]) == (1, 1, 1.0)
    found = bench.paired([_answers([0, 0], found=[1, 0])], [_answers([0, 0])], "found")
    assert (found["a_ahead"], found["b_ahead"]) == (1, 0)


def test_paired_over_sft_seeds_compares_how_often_each_side_fixes_a_task(bench):
    # A's two runs fix task 0 twice, task 1 once, task 2 never, task 3 twice; B's one run fixes 1, 2 and 3
    a = [_answers([1, 1, 0, 1]), _answers([1, 0, 0, 1])]
    b = [_answers([0, 1, 1, 1])]
    got = bench.paired(a, b, "fixed")
    # task 0: A 1.0 > B 0; task 1: A 0.5 < B 1; task 2: A 0 < B 1; task 3: level at 1.0
    assert _cells(got) == (1, 2, 1, 0)
    assert got["p"] == pytest.approx(1.0)  # 1 of 3 differing tasks: a coin's worth
    assert _cells(bench.paired(a, a, "fixed")) == (0, 0, 3, 1)  # a side against itself is level everywhere


def test_paired_refuses_runs_on_different_tasks(bench):
    a = _answers([1, 0, 0])
    with pytest.raises(ValueError, match="different held-out tasks"):
        bench.paired([a], [a[:2]], "fixed")
    with pytest.raises(ValueError, match="different held-out tasks"):
        bench.paired([a + a[:1]], [a + a[1:2]], "fixed")  # a task answered twice
    with pytest.raises(ValueError, match="runs of one side answered different"):
        bench.paired([a, a[:2]], [a], "fixed")


def test_compare_prints_paired_lines_and_names_a_bad_file(bench, tmp_path, capsys):
    import json

    a, a2, b = tmp_path / "a.json", tmp_path / "a2.json", tmp_path / "b.json"
    a.write_text(json.dumps({"held_out_answers": _answers([1, 1, 0])}))
    a2.write_text(json.dumps({"held_out_answers": _answers([1, 0, 0])}))
    b.write_text(json.dumps({"held_out_answers": _answers([0, 1, 0])}))
    bench.compare(str(a), str(b))
    out = capsys.readouterr().out
    assert "paired over 3 held-out tasks" in out
    assert re.search(r"fixed\s+2\s+1\s+1\s+0\s+1\s+1\s+1\.000\s+-\s+-", out)
    bench.compare(f"{a},{a2}", str(b))  # one recipe over two SFT seeds: each run's count, then the tasks
    out = capsys.readouterr().out
    # A's two runs differ on one task (p 1.0 within A); B has one run, so nothing within it
    assert "A (2 runs)" in out and re.search(r"fixed\s+2,1\s+1\s+1\s+1\s+0\s+1\s+1\.000\s+1\.000\s+-", out)
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"held_out_answers": [{"task_id": "t0"}]}')
    with pytest.raises(SystemExit, match="corrupt.json: not a base_policy.json"):
        bench.compare(f"{a},{corrupt}", str(b))
    with pytest.raises(SystemExit, match="names no file"):
        bench.compare(",", str(b))
    with pytest.raises(SystemExit, match="different held-out tasks"):
        b.write_text(json.dumps({"held_out_answers": _answers([0, 1])}))
        bench.compare(str(a), str(b))


def test_copy_abilities_are_asked_once_per_base_and_kept(bench, tmp_path, monkeypatch):
    import json

    import training.pretrain as pretrain

    asked = []

    def abilities(base, files, *, n, seed, device):
        asked.append((base, n, seed, device))
        return {"quote_line": {"accuracy": 0.5, "n": n, "samples": [("a", "b")]}}

    monkeypatch.setattr(pretrain, "held_out_abilities", abilities)
    cache = tmp_path / "copy.json"
    first = bench._copy_abilities(tmp_path, cache, n=4, seed=1)
    again = bench._copy_abilities(tmp_path, cache, n=4, seed=1)
    assert asked == [(tmp_path, 4, 1, "cpu")] and again == first == json.loads(cache.read_text())
    cache.write_text('{"quote_line": ')  # a run killed while writing: asked again, not a traceback
    bench._copy_abilities(tmp_path, cache, n=4, seed=1)
    assert len(asked) == 2 and json.loads(cache.read_text())["quote_line"]["n"] == 4


def test_fix_mix_weighs_the_repair_turn_kinds_and_names_a_bad_one(bench, monkeypatch):
    assert bench.parse_fix_mix("fix_line=2, edit_span=1") == {"fix_line": 2.0, "edit_span": 1.0}
    for bad, culprit in (("fix_line=two", "'fix_line=two' is not KIND=WEIGHT"), ("induction=1", "induction"),
                         ("fix_line=0", "positive weight"), ("fix_name=-1", "-1")):
        with pytest.raises(ValueError, match=re.escape(culprit)):
            bench.parse_fix_mix(bad)
    monkeypatch.setattr("sys.argv", ["base_policy.py", "--fix-mix", "fix_lines=1"])
    with pytest.raises(SystemExit, match=r"--fix-mix 'fix_lines=1': unknown fix row kind\(s\) \['fix_lines'\]"):
        bench.main()


def test_device_is_the_cpu_or_a_cuda_device_this_machine_has(bench, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    for device, culprit in (("gpu", "--device: device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
                            ("cuda:1", "--device cuda:1: no CUDA device on this machine")):
        monkeypatch.setattr("sys.argv", ["base_policy.py", "--device", device])
        with pytest.raises(SystemExit, match=re.escape(culprit)):
            bench.main()
