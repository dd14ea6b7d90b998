"""Repair tasks: each bug family makes the change it names; bug sets are seeded, at distinct lines, kept only
when the verdict says each bug and the set fail; splits are disjoint by program; the bugs never reach a
prompt; a task file rebuilds its tasks and refuses a stale recipe. The CLI case runs the real sandbox."""

from __future__ import annotations

import ast
import json
import re

import pytest

from pipeline.agent import Episode, EpisodeSettings
from pipeline.tasks import TaskFormatError, check_disjoint, load_source
from pipeline.tasks.repair import (
    FAMILIES,
    Bug,
    apply_bugs,
    bug_candidates,
    make_repair_tasks,
    problem_split,
    write_recipes,
)

CODE = (
    "def total_above(values, limit):\n"
    "    count = 0\n"
    "    for value in values:\n"
    "        if value > limit:\n"
    "            count += value\n"
    "    print(count)\n"
    "    return max(count, 0)\n"
)


def _by_family(text=CODE):
    out = {}
    for bug in bug_candidates(text):
        out.setdefault(bug.family, []).append(bug)
    return out


def test_each_family_makes_the_change_it_names():
    bugs = _by_family()
    assert set(bugs) == set(FAMILIES)
    assert Bug(4, "operator", "        if value > limit:", "        if value >= limit:") in bugs["operator"]
    assert Bug(5, "operator", "            count += value", "            count -= value") in bugs["operator"]
    assert Bug(2, "off_by_one", "    count = 0", "    count = 1") in bugs["off_by_one"]
    assert bugs["drop_return"] == [Bug(7, "drop_return", "    return max(count, 0)", "    max(count, 0)")]
    assert Bug(7, "swap_args", "    return max(count, 0)", "    return max(0, count)") in bugs["swap_args"]
    assert Bug(6, "delete_line", "    print(count)", None) in bugs["delete_line"]
    names = set(re.findall(r"[A-Za-z_]\w*", CODE))
    for bug in bugs["misspell"]:  # one name used elsewhere, misspelt into a name the file does not have
        before, after = re.findall(r"[A-Za-z_]\w*", bug.original), re.findall(r"[A-Za-z_]\w*", bug.buggy)
        changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
        assert len(changed) == 1 and CODE.count(changed[0][0]) >= 2 and changed[0][1] not in names
    for family in bugs.values():
        for bug in family:  # every candidate changes one line and still parses
            ast.parse(apply_bugs(CODE, [bug]))
            assert apply_bugs(CODE, [bug]) != CODE


def test_no_candidate_touches_strings_comments_or_keywords():
    text = 'def f(x):\n    # x < 1 here\n    s = "a < b + 1"\n    return s if x is None else x\n'
    for bug in bug_candidates(text):
        assert bug.line != 2  # the comment line offers nothing
        if bug.line == 3 and bug.buggy is not None:
            assert '"a < b + 1"' in bug.buggy  # the string's text is never mutated
        if bug.line == 4 and bug.buggy is not None:  # keywords stay: only names, operators, calls change
            assert " if " in bug.buggy and " is None else " in bug.buggy
    with pytest.raises(ValueError, match="unknown bug families"):
        bug_candidates(text, ("typo",))
    assert bug_candidates("def broken(:\n") == []


def test_apply_bugs_refuses_a_line_that_is_not_the_original():
    with pytest.raises(ValueError, match="line 2"):
        apply_bugs(CODE, [Bug(2, "off_by_one", "    count = 5", "    count = 6")])
    two = [Bug(6, "delete_line", "    print(count)", None), Bug(2, "off_by_one", "    count = 0", "    count = 1")]
    assert apply_bugs(CODE, two).splitlines()[1:6] == ["    count = 1", "    for value in values:",
                                                       "        if value > limit:", "            count += value",
                                                       "    return max(count, 0)"]


@pytest.fixture(scope="module")
def mbpp_tasks():
    return load_source("mbpp", split="train", limit=40)


def _recorder(refuse=()):
    """A verdict without the sandbox: every workspace fails, except those whose main file holds a line in
    `refuse` (a bug the tests would not catch); calls are recorded."""
    calls = []

    def fails(task, workspace):
        calls.append((task.task_id, workspace["solution.py"]))
        if workspace == dict(task.reference):
            return False
        return not any(line in workspace["solution.py"].splitlines() for line in refuse)

    return fails, calls


def test_bug_sets_are_seeded_distinct_and_within_the_range(mbpp_tasks):
    fails, _ = _recorder()
    one = make_repair_tasks(mbpp_tasks, fails, n=30, bugs=(2, 3), seed=5)
    again = make_repair_tasks(mbpp_tasks, _recorder()[0], n=30, bugs=(2, 3), seed=5)
    other = make_repair_tasks(mbpp_tasks, _recorder()[0], n=30, bugs=(2, 3), seed=6)
    assert [r.as_json() for r in one] == [r.as_json() for r in again] != [r.as_json() for r in other]
    assert len(one) == 30 and len({r.task_id for r in one}) == 30
    for recipe in one:
        lines = [b.line for b in recipe.bugs]
        assert 2 <= len(lines) <= 3 and len(set(lines)) == len(lines)
    families = {b.family for r in one for b in r.bugs}
    assert families == set(FAMILIES)  # uniform family draws: the rare families appear too
    only = make_repair_tasks(mbpp_tasks, _recorder()[0], n=10, bugs=(1, 1), families=("operator",), seed=0)
    assert {b.family for r in only for b in r.bugs} == {"operator"} and all(len(r.bugs) == 1 for r in only)


def test_a_bug_the_tests_miss_is_never_kept_nor_a_source_whose_reference_fails(mbpp_tasks):
    # every bug that deletes a line is "missed" by these tests
    deleted_lines = {b.original for t in mbpp_tasks for b in bug_candidates(t.reference["solution.py"])
                     if b.family == "delete_line"}
    fails, calls = _recorder()

    def misses_deletions(task, workspace):
        text = workspace["solution.py"]
        if workspace == dict(task.reference):
            return task.task_id == mbpp_tasks[0].task_id  # this source's reference fails its own tests
        reference_lines = task.reference["solution.py"].splitlines()
        missing = [line for line in reference_lines if line in deleted_lines and line not in text.splitlines()]
        return not missing and fails(task, workspace)

    made = make_repair_tasks(mbpp_tasks, misses_deletions, n=25, bugs=(1, 3), seed=1)
    assert made and all(b.family != "delete_line" for r in made for b in r.bugs)
    assert all(r.source_task != mbpp_tasks[0].task_id for r in made)
    with pytest.raises(ValueError, match="bugs must be a range"):
        make_repair_tasks(mbpp_tasks, fails, n=1, bugs=(2, 1))


def test_splits_are_disjoint_by_program_or_mixed_by_instance(mbpp_tasks):
    fails, _ = _recorder()
    by_program = make_repair_tasks(mbpp_tasks, fails, n=60, bugs=(1, 2), seed=2, test_fraction=0.3)
    sides = {}
    for recipe in by_program:
        sides.setdefault(recipe.source_task, set()).add(recipe.split)
    assert all(len(s) == 1 for s in sides.values())
    assert {r.split for r in by_program} == {"train", "test"}
    # the same program falls on the same side for every seed
    assert problem_split("mbpp:601", 0.3) == problem_split("mbpp:601", 0.3)
    by_instance = make_repair_tasks(mbpp_tasks, _recorder()[0], n=60, bugs=(1, 2), seed=2, test_fraction=0.5,
                                    split_by="instance")
    mixed = {}
    for recipe in by_instance:
        mixed.setdefault(recipe.source_task, set()).add(recipe.split)
    assert any(len(s) == 2 for s in mixed.values())


def test_a_task_file_rebuilds_the_tasks_and_the_bugs_never_reach_a_prompt(tmp_path, mbpp_tasks):
    fails, _ = _recorder()
    recipes = make_repair_tasks(mbpp_tasks, fails, n=12, bugs=(1, 3), seed=3, families=("delete_line", "misspell"))
    path = tmp_path / "repair.jsonl"
    write_recipes(recipes, path)
    tasks = load_source("repair", path)
    assert [t.task_id for t in tasks] == [r.task_id for r in recipes]
    sources = {t.task_id: t for t in mbpp_tasks}
    for task, recipe in zip(tasks, recipes, strict=True):
        source = sources[recipe.source_task]
        assert task.source == "repair" and task.split == recipe.split
        reference = source.reference["solution.py"]
        # the buggy file ends in a newline whether or not the reference does (no spurious demonstrated edit)
        assert task.workspace["solution.py"] == apply_bugs(reference.rstrip("\n") + "\n", recipe.bugs)
        assert task.reference == source.reference and task.hidden_tests == source.hidden_tests
        assert task.meta["problem"] == source.meta["problem"]  # so check_disjoint sees the program
        prompt = Episode(task, None, EpisodeSettings()).render_prompt()
        assert "misspell" not in prompt and "delete_line" not in prompt and "family" not in prompt
        for bug in recipe.bugs:
            if bug.family == "delete_line" and bug.original not in task.workspace["solution.py"]:
                assert bug.original not in prompt  # the deleted line is nowhere to be seen
    with pytest.raises(ValueError, match="share"):
        check_disjoint(tasks, [sources[recipes[0].source_task]])
    # a recipe whose original line is not in the source any more is refused with its line number
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["bugs"][0]["original"] = "    something else entirely"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskFormatError, match=r"repair.jsonl:2: line \d+ is not"):
        load_source("repair", path)
    assert {t.source for t in load_source("repair", split="test", limit=3)} == {"repair"}  # the bundled curriculum
    with pytest.raises(ValueError, match="no bundled file"):
        load_source("file")


def test_the_failing_run_of_the_whole_bug_set_is_kept_and_shown_as_a_bug_report(tmp_path, mbpp_tasks):
    def reports(task, workspace):  # names the file it ran on, so the test sees which run's report is kept
        if workspace == dict(task.reference):
            return ""
        return f"FAILED check_00.py:8 -> ran on {len(workspace['solution.py'])} chars"

    recipes = make_repair_tasks(mbpp_tasks, reports, n=10, bugs=(1, 3), seed=4)
    assert any(len(r.bugs) > 1 for r in recipes)
    write_recipes(recipes, tmp_path / "repair.jsonl")
    for task, recipe in zip(load_source("repair", tmp_path / "repair.jsonl"), recipes, strict=True):
        all_bugs = apply_bugs(task.reference["solution.py"], recipe.bugs)  # every bug at once, not one alone
        assert recipe.failure == f"FAILED check_00.py:8 -> ran on {len(all_bugs)} chars"
        prompt = Episode(task, None, EpisodeSettings()).render_prompt()
        assert f"The visible tests on it:\n{recipe.failure}" in prompt
    # a verdict without reports draws the same tasks, shown with the code only, written as before
    bare = make_repair_tasks(mbpp_tasks, _recorder()[0], n=10, bugs=(1, 3), seed=4)
    assert [r.task_id for r in bare] == [r.task_id for r in recipes]
    write_recipes(bare, tmp_path / "bare.jsonl")
    assert "failure" not in (tmp_path / "bare.jsonl").read_text()
    assert all("visible tests on it" not in t.instructions for t in load_source("repair", tmp_path / "bare.jsonl"))
