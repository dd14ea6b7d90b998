"""load_source filters and refusals, and the train/eval disjointness guard."""

from __future__ import annotations

import pytest

from pipeline.tasks import BUNDLED_FILES, SOURCES, Task, TestSuite, check_disjoint, load_source, problem_key


def make_task(task_id: str, problem: str | None, split: str = "train") -> Task:
    suite = TestSuite(kind="pytest", files={"t_test.py": "def test_x():\n    pass\n"})
    meta = {} if problem is None else {"problem": problem}
    return Task(
        task_id=task_id,
        source=task_id.split("/")[0],
        split=split,
        instructions="do it",
        workspace={"a.py": "x = 1\n"},
        visible_tests=suite,
        hidden_tests=suite,
        reference={"a.py": f"x = 2  # {problem or task_id}\n"},  # one content per problem
        meta=meta,
    )


@pytest.fixture
def five(tmp_path, jsonl, he_row):
    return jsonl(tmp_path / "he.jsonl", [he_row(n) for n in range(5)])


def test_sources_are_the_documented_names_and_all_but_repair_and_file_are_bundled():
    assert list(SOURCES) == ["humaneval", "humanevalplus", "mbpp", "mbppplus", "humanevalfix", "exercism", "repair",
                             "file"]
    assert list(BUNDLED_FILES) == list(SOURCES)[:-2]


def test_limit_keeps_the_first_tasks_in_file_order(five):
    assert [t.task_id for t in load_source("humaneval", five, limit=2)] == [
        "humaneval/HumanEval/0",
        "humaneval/HumanEval/1",
    ]


def test_skip_drops_what_a_limit_took_so_two_specs_partition_a_split(five):
    from pipeline.tasks.settings import TaskSourceSpec

    first = TaskSourceSpec(source="humaneval", path=five, limit=2).load()
    rest = TaskSourceSpec(source="humaneval", path=five, skip=2).load()
    assert [t.task_id for t in first + rest] == [t.task_id for t in load_source("humaneval", five)]
    assert [t.task_id for t in load_source("humaneval", five, skip=1, limit=2)] == [
        "humaneval/HumanEval/1", "humaneval/HumanEval/2"]
    with pytest.raises(ValueError, match="no task with split None left after skipping 5"):
        TaskSourceSpec(source="humaneval", path=five, skip=5).load()
    with pytest.raises(ValueError, match="skip must be >= 0"):
        load_source("humaneval", five, skip=-1)


def test_ids_accept_task_ids_and_native_ids_and_keep_file_order(five):
    tasks = load_source("humaneval", five, ids=["HumanEval/3", "humaneval/HumanEval/1"])
    assert [t.task_id for t in tasks] == ["humaneval/HumanEval/1", "humaneval/HumanEval/3"]


def test_unknown_ids_are_named(five):
    with pytest.raises(ValueError, match=r"no humaneval task with id humaneval/HumanEval/9$"):
        load_source("humaneval", five, ids=["HumanEval/9", "HumanEval/0"])


def test_split_then_ids_then_limit(bundled):
    from_bundle = load_source("mbpp", split="validation", limit=3)
    assert [t.split for t in from_bundle] == ["validation"] * 3
    assert from_bundle == [t for t in bundled["mbpp"] if t.split == "validation"][:3]
    with pytest.raises(ValueError, match="no mbpp task with split 'validation' with id mbpp/MBPP/700"):
        load_source("mbpp", split="validation", ids=["MBPP/700"])


def test_a_dropped_mbpp_problem_cannot_be_selected():
    with pytest.raises(ValueError, match="mbpp/MBPP/64"):
        load_source("mbpp", ids=["MBPP/64"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source": "apps"}, "unknown task source 'apps'; allowed: humaneval, humanevalplus, mbpp, mbppplus"),
        ({"source": "mbpp", "split": "dev"}, "unknown split 'dev'; allowed: train, validation, test"),
        ({"source": "mbpp", "limit": 0}, "limit must be >= 1"),
        ({"source": "mbpp", "ids": "MBPP/12"}, "ids must be a list of task ids, not the string 'MBPP/12'"),
    ],
)
def test_bad_arguments_are_refused_with_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_source(**kwargs)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"task file for source 'exercism' not found: .*nope\.jsonl"):
        load_source("exercism", tmp_path / "nope.jsonl")


def test_problem_key_falls_back_to_the_task_id():
    assert problem_key(make_task("x/1", "mbpp:1")) == "mbpp:1"
    assert problem_key(make_task("x/2", None)) == "x/2"


def test_disjoint_sets_pass():
    check_disjoint(
        [make_task("mbpp/MBPP/601", "mbpp:601")], [make_task("mbppplus/Mbpp/11", "mbpp:11", "test")]
    )


def test_overlap_across_sources_names_the_problem_and_both_tasks():
    train = [make_task("mbpp/MBPP/601", "mbpp:601"), make_task("exercism/bob", "exercism:bob")]
    evaluation = [
        make_task("mbppplus/Mbpp/601", "mbpp:601", "test"),
        make_task("humaneval/HumanEval/0", "humaneval:0"),
    ]
    with pytest.raises(ValueError, match="share 1 problem") as info:
        check_disjoint(train, evaluation)
    assert "mbpp:601: train mbpp/MBPP/601 / eval mbppplus/Mbpp/601" in str(info.value)
    assert "exercism" not in str(info.value)


def test_long_overlaps_are_summarised():
    tasks = [make_task(f"mbpp/MBPP/{n}", f"mbpp:{n}") for n in range(20)]
    with pytest.raises(ValueError, match=r"share 20 problem\(s\)") as info:
        check_disjoint(tasks, tasks, show=4)
    assert str(info.value).count("\n  mbpp:") == 4
    assert info.value.args[0].endswith("... and 16 more")


def test_bundled_humaneval_family_overlaps_with_itself(bundled):
    with pytest.raises(
        ValueError, match="humaneval:0: train humanevalfix/Python/0 / eval humaneval/HumanEval/0"
    ):
        check_disjoint(bundled["humanevalfix"][:1], bundled["humaneval"])
    check_disjoint(
        [t for t in bundled["mbpp"] if t.split == "train"],
        [t for t in bundled["mbppplus"] if t.split == "test"],
    )
