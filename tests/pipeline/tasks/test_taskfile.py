"""Our own task file format: loading, refusing bad lines, the round trip from every source, overlap by content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.evaluation import file_benchmarks, select_benchmark_tasks
from pipeline.tasks import TaskFormatError, check_disjoint, content_key, load_source
from pipeline.tasks.settings import TaskSourceSpec, TasksSettings, resolve_tasks
from pipeline.tasks.taskfile import json_schema, task_row, write_task_file

FIXTURE = Path(__file__).parents[2] / "fixtures" / "classics.jsonl"


def _line(**changes) -> dict:
    row = {"version": 1, "source": "mine", "id": "add", "split": "test", "instructions": "Fix add.",
           "workspace": {"solution.py": "def add(a, b):\n    return a - b\n"},
           "reference": {"solution.py": "def add(a, b):\n    return a + b\n"},
           "hidden_tests": {"kind": "check", "entry_point": "add", "module": "solution",
                            "files": {"tests.py": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}}}
    row.update(changes)
    return row


def _write(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_line_becomes_a_task_under_its_own_source_name(tmp_path):
    (task,) = load_source("file", _write(tmp_path, _line(meta={"problem": "adder"})))
    assert task.task_id == "mine/add" and task.source == "mine" and task.split == "test"
    assert task.visible_tests == task.hidden_tests  # visible defaults to hidden
    assert task.meta["problem"] == "adder"
    assert load_source("file", tmp_path / "tasks.jsonl", ids=["add"]) == [task]  # native id or full id


@pytest.mark.parametrize(("change", "message"), [
    ({"version": 2}, "field 'version'"),
    ({"colour": "red"}, "field 'colour': Extra inputs are not permitted"),
    ({"source": "My Set"}, "lower-case letters"),
    ({"workspace": {"../escape.py": "x = 1\n"}}, "must be relative"),
    ({"hidden_tests": {"kind": "check", "files": {"t.py": "def check(c): pass\n"}}}, "needs entry_point"),
    ({"hidden_tests": {"kind": "io", "entry_point": "add"}}, "needs inputs"),
    ({"hidden_tests": {"kind": "pytest", "files": {"solution.py": "x = 1\n"}}}, "is also a workspace file"),
    ({"split": "dev"}, "field 'split'"),
])
def test_a_bad_line_is_refused_with_its_line_number(tmp_path, change, message):
    path = _write(tmp_path, _line(id="fine"), _line(**change))
    with pytest.raises(TaskFormatError) as err:
        load_source("file", path)
    assert f"{path}:2:" in str(err.value) and message in str(err.value)


def test_an_unknown_id_is_an_error_not_a_bundled_task(tmp_path):
    path = _write(tmp_path, _line())
    with pytest.raises(ValueError, match="no task with id humanevalfix/Python/0"):
        load_source("file", path, ids=["humanevalfix/Python/0"])


@pytest.mark.parametrize("source", ["humanevalfix", "mbpp", "exercism", "humanevalplus"])
def test_every_source_round_trips_through_the_format(tmp_path, source):
    tasks = load_source(source, limit=15)
    out = tmp_path / f"{source}.jsonl"
    assert write_task_file(tasks, out) == len(tasks)
    again = load_source("file", out)
    assert [task_row(t) for t in again] == [json.loads(json.dumps(task_row(t))) for t in tasks]
    assert [content_key(t) for t in again] == [content_key(t) for t in tasks]


def test_content_overlap_is_refused_whatever_the_names(tmp_path):
    original = load_source("humanevalfix", limit=1)[0]
    row = task_row(original) | {"source": "renamed", "id": "copy", "meta": {}}
    copied = load_source("file", _write(tmp_path, row))
    with pytest.raises(ValueError, match="share 1 problem"):
        check_disjoint(copied, [original])
    # the benchmark selection leaves the copy out rather than evaluating on a training problem
    selection = select_benchmark_tasks(["humanevalfix"], copied, limit=3)
    assert selection.excluded == {"humanevalfix": 1}
    assert original.task_id not in {t.task_id for t in selection.all_tasks}
    # distinct content under a colliding-looking id is no overlap
    check_disjoint(load_source("file", FIXTURE), load_source("humanevalfix"))


def test_config_names_a_file_with_the_short_form_and_refuses_empty_sides(tmp_path):
    spec = TaskSourceSpec.model_validate({"file": str(FIXTURE), "split": "train"})
    assert spec.source == "file" and spec.path == FIXTURE
    assert {t.task_id for t in spec.load()} == {"classics/reverse_linked_list", "classics/subsequences"}
    with pytest.raises(ValueError, match="source file needs path"):
        TaskSourceSpec(source="file")
    with pytest.raises(ValueError, match="not both"):
        TaskSourceSpec.model_validate({"file": str(FIXTURE), "source": "mbpp"})
    only_test = _write(tmp_path, _line())
    settings = TasksSettings(train=(TaskSourceSpec(source="file", path=only_test, split="train"),), eval=())
    with pytest.raises(ValueError, match="no task with split 'train'"):
        resolve_tasks(settings)


def test_a_file_is_evaluated_as_one_benchmark_per_source_name(tmp_path):
    path = _write(tmp_path, _line(), _line(source="theirs"), _line(id="sub"))
    groups = file_benchmarks(path)
    assert {name: [t.task_id for t in ts] for name, ts in groups.items()} == {
        "mine": ["mine/add", "mine/sub"], "theirs": ["theirs/add"]}


def test_the_json_schema_documents_every_field():
    schema = json_schema()
    assert set(schema["required"]) == {"version", "source", "id", "split", "instructions", "workspace",
                                       "reference", "hidden_tests"}
    assert all(p.get("description") for p in schema["properties"].values())
