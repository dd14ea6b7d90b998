"""The `tasks` config section: validation messages and resolution with the disjointness guard."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.tasks.settings import TaskSourceSpec, TasksSettings, resolve_tasks, round_tasks


def test_defaults_train_on_mbpp_and_exercism_and_evaluate_on_humanevalfix():
    settings = TasksSettings()
    assert [(s.source, s.split) for s in settings.train] == [("mbpp", "train"), ("exercism", None)]
    assert [s.source for s in settings.eval] == ["humanevalfix"]


def test_specs_parse_from_plain_config_data():
    settings = TasksSettings.model_validate(
        {
            "train": [{"source": "mbpp", "split": "validation", "limit": 5}],
            "eval": [{"source": "humaneval", "ids": ["HumanEval/1"]}],
        }
    )
    assert settings.train[0] == TaskSourceSpec(source="mbpp", split="validation", limit=5)
    assert settings.eval[0].ids == ("HumanEval/1",)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"source": "apps"},
            "unknown task source 'apps'; allowed: humaneval, humanevalplus, mbpp, mbppplus, humanevalfix, exercism",
        ),
        ({"source": "mbpp", "split": "dev"}, "Input should be 'train', 'validation' or 'test'"),
        ({"source": "mbpp", "limit": 0}, "Input should be greater than or equal to 1"),
        ({"source": "mbpp", "ids": []}, "ids must list at least one task id"),
        ({"source": "mbpp", "ids": ["MBPP/12", "MBPP/12"]}, "ids lists MBPP/12 more than once"),
        ({"source": "mbpp", "splits": "train"}, "Extra inputs are not permitted"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValidationError, match=message):
        TaskSourceSpec.model_validate(spec)


def test_specs_are_frozen():
    spec = TaskSourceSpec(source="mbpp")
    with pytest.raises(ValidationError, match="frozen"):
        spec.limit = 3


def test_an_empty_training_pool_is_refused():
    with pytest.raises(ValidationError, match="at least 1 item"):
        TasksSettings(train=[])


def test_the_same_selection_on_both_sides_is_refused_early():
    spec = {"source": "humaneval", "limit": 3}
    with pytest.raises(
        ValidationError, match=r'train and eval both select \{"source":"humaneval","limit":3\}'
    ):
        TasksSettings.model_validate({"train": [spec], "eval": [spec]})


def test_resolve_tasks_loads_both_sides(tmp_path, jsonl, he_row):
    path = jsonl(tmp_path / "he.jsonl", [he_row(n) for n in range(4)])
    settings = TasksSettings(
        train=[TaskSourceSpec(source="humaneval", path=path, ids=("HumanEval/0", "HumanEval/1"))],
        eval=[TaskSourceSpec(source="humaneval", path=path, ids=("HumanEval/2",))],
    )
    train, evaluation = resolve_tasks(settings)
    assert [t.task_id for t in train] == ["humaneval/HumanEval/0", "humaneval/HumanEval/1"]
    assert [t.task_id for t in evaluation] == ["humaneval/HumanEval/2"]
    assert isinstance(settings.train[0].path, Path)


def test_resolve_tasks_refuses_overlapping_problems_across_sources(tmp_path, jsonl, he_row):
    he = jsonl(tmp_path / "he.jsonl", [he_row(n) for n in range(3)])
    fix_row = {
        **he_row(1),
        "task_id": "Python/1",
        "buggy_solution": "    return a - b\n",
        "example_test": "def check(add):\n    assert add(1, 2) == 3\ncheck(add)\n",
        "bug_type": "operator misuse",
        "failure_symptoms": "incorrect output",
    }
    fix = jsonl(tmp_path / "fix.jsonl", [fix_row])
    settings = TasksSettings(
        train=[TaskSourceSpec(source="humanevalfix", path=fix)],
        eval=[TaskSourceSpec(source="humaneval", path=he)],
    )
    with pytest.raises(
        ValueError, match="humaneval:1: train humanevalfix/Python/1 / eval humaneval/HumanEval/1"
    ):
        resolve_tasks(settings)


def test_resolve_tasks_refuses_a_task_selected_twice_on_one_side(tmp_path, jsonl, he_row):
    path = jsonl(tmp_path / "he.jsonl", [he_row(n) for n in range(3)])
    settings = TasksSettings(
        train=[
            TaskSourceSpec(source="humaneval", path=path, limit=2),
            TaskSourceSpec(source="humaneval", path=path, ids=("HumanEval/1",)),
        ],
        eval=[],
    )
    with pytest.raises(ValueError, match="tasks.train selects 1 task\\(s\\) twice: humaneval/HumanEval/1"):
        resolve_tasks(settings)


def test_round_tasks_walk_the_pool_like_a_data_loader():
    pool = [f"t{i}" for i in range(10)]
    assert round_tasks(pool, 3, None, 0) == pool  # no per_round: the whole pool, every round
    epoch0 = [round_tasks(pool, k, 3, seed=0) for k in range(3)]  # 10 // 3 = 3 batches an epoch
    assert all(len(b) == 3 for b in epoch0)
    assert len({t for b in epoch0 for t in b}) == 9  # no task twice within an epoch
    assert epoch0 == [round_tasks(pool, k, 3, seed=0) for k in range(3)]  # pure
    epoch1 = [round_tasks(pool, k, 3, seed=0) for k in range(3, 6)]
    assert len({t for b in epoch1 for t in b}) == 9 and epoch1 != epoch0  # a new shuffle each epoch
    assert [round_tasks(pool, k, 3, seed=1) for k in range(3)] != epoch0  # the seed decides the order


def test_per_round_at_least_the_training_side_rolls_out_the_whole_side_every_round(tmp_path, jsonl, he_row):
    # as a data loader whose batch is at least its dataset: the default config's per_round suits a small file
    path = jsonl(tmp_path / "he.jsonl", [he_row(n) for n in range(3)])
    settings = TasksSettings(train=[TaskSourceSpec(source="humaneval", path=path)], eval=[], per_round=4)
    train, _ = resolve_tasks(settings)
    assert len(train) == 3
    assert all(round_tasks(train, k, 4, seed=0) == train for k in range(3))
    assert round_tasks(train, 1, 3, seed=0) == train
    assert len(round_tasks(train, 1, 2, seed=0)) == 2  # below the pool: a batch
    with pytest.raises(ValueError, match="tasks.per_round 0 must be at least 1"):
        round_tasks(train, 0, 0, seed=0)
    with pytest.raises(ValidationError, match="per_round"):
        TasksSettings(per_round=0)
