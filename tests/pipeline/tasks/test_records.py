"""Malformed task files are refused with the file and line named; well-formed ones load, gzip or plain."""

from __future__ import annotations

import gzip
import json

import pytest

from pipeline.tasks import TaskFormatError, load_source


def test_plain_and_gzip_files_load_the_same_tasks(tmp_path, jsonl, he_row):
    rows = [he_row(0), he_row(1)]
    plain = load_source("humaneval", jsonl(tmp_path / "he.jsonl", rows))
    packed = load_source("humaneval", jsonl(tmp_path / "he.jsonl.gz", rows, compress=True))
    assert [t.task_id for t in plain] == ["humaneval/HumanEval/0", "humaneval/HumanEval/1"]
    assert plain == packed


def test_gzip_is_detected_by_content_not_by_name(tmp_path, jsonl, he_row):
    path = jsonl(tmp_path / "no_suffix", [he_row(3)], compress=True)
    assert [t.task_id for t in load_source("humaneval", path)] == ["humaneval/HumanEval/3"]


def test_blank_lines_are_skipped_and_line_numbers_still_count_them(tmp_path, jsonl, he_row):
    path = jsonl(tmp_path / "he.jsonl", [he_row(0), "", "   ", "{not json"])
    with pytest.raises(TaskFormatError) as info:
        load_source("humaneval", path)
    assert info.value.line == 4
    assert str(info.value).startswith(f"{path}:4: bad JSON")


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ("{not json", "bad JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ("{}", "field 'task_id': Field required"),
    ],
)
def test_bad_lines_name_the_file_and_line(tmp_path, jsonl, he_row, bad_line, expected):
    path = jsonl(tmp_path / "he.jsonl", [he_row(0), he_row(1), bad_line])
    with pytest.raises(TaskFormatError, match=expected) as info:
        load_source("humaneval", path)
    assert (info.value.path, info.value.line) == (path, 3)
    assert f"{path}:3:" in str(info.value)


def test_a_missing_field_is_named(tmp_path, jsonl, he_row):
    row = he_row(0)
    del row["entry_point"]
    with pytest.raises(TaskFormatError, match=r":1: field 'entry_point': Field required"):
        load_source("humaneval", jsonl(tmp_path / "he.jsonl", [row]))


def test_a_wrong_type_is_named_with_the_type_received(tmp_path, jsonl, he_row):
    path = jsonl(tmp_path / "he.jsonl", [he_row(0), he_row(1, prompt=42)])
    with pytest.raises(
        TaskFormatError, match=r":2: field 'prompt': Input should be a valid string \(got int\)"
    ):
        load_source("humaneval", path)


def test_numbers_are_not_coerced_to_strings_or_back(tmp_path, jsonl):
    row = {
        "task_id": "exercism/two-fer",
        "instructions": "Say hi.",
        "introduction": "",
        "stub_files": {"two_fer.py": 1},
        "test_files": {"two_fer_test.py": "def test_x():\n    pass\n"},
        "reference_files": {"two_fer.py": "def two_fer():\n    return 1\n"},
        "extra_files": {},
    }
    with pytest.raises(
        TaskFormatError, match=r":1: field 'stub_files.two_fer.py': Input should be a valid string"
    ):
        load_source("exercism", jsonl(tmp_path / "ex.jsonl", [row]))


def test_content_the_loader_refuses_names_the_line(tmp_path, jsonl, he_row):
    rows = [he_row(0), he_row(1, test="def helper(x):\n    assert x\n")]
    with pytest.raises(TaskFormatError, match=r":2: test must define exactly one top-level `check` function"):
        load_source("humaneval", jsonl(tmp_path / "he.jsonl", rows))


def test_a_test_that_does_not_parse_is_refused(tmp_path, jsonl, he_row):
    rows = [he_row(0, test="def check(candidate):\n    assert candidate(1, 2) ==\n")]
    with pytest.raises(TaskFormatError, match=r":1: test does not parse: invalid syntax \(test line 2\)"):
        load_source("humaneval", jsonl(tmp_path / "he.jsonl", rows))


def test_a_reference_without_the_entry_point_is_refused(tmp_path, jsonl, he_row):
    rows = [he_row(0, entry_point="subtract")]
    with pytest.raises(TaskFormatError, match="does not define entry_point 'subtract'"):
        load_source("humaneval", jsonl(tmp_path / "he.jsonl", rows))


def test_a_native_id_of_another_form_is_refused(tmp_path, jsonl, he_row):
    rows = [he_row(0, task_id="MBPP/1")]
    with pytest.raises(TaskFormatError, match=r"'MBPP/1' does not look like 'HumanEval/<number>'"):
        load_source("humaneval", jsonl(tmp_path / "he.jsonl", rows))


def test_a_duplicate_task_names_both_lines(tmp_path, jsonl, he_row):
    path = jsonl(tmp_path / "he.jsonl", [he_row(0), he_row(1), he_row(0)])
    with pytest.raises(
        TaskFormatError, match=r":3: duplicate task 'humaneval/HumanEval/0' \(first on line 1\)"
    ):
        load_source("humaneval", path)


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(TaskFormatError, match="no tasks"):
        load_source("humaneval", path)


def test_non_utf8_bytes_name_the_line(tmp_path, he_row):
    path = tmp_path / "he.jsonl"
    path.write_bytes(json.dumps(he_row(0)).encode() + b"\n" + b'{"task_id": "\xff"}\n')
    with pytest.raises(TaskFormatError, match=r":2: not UTF-8 text"):
        load_source("humaneval", path)


def test_a_truncated_gzip_file_is_refused(tmp_path, he_row):
    packed = gzip.compress((json.dumps(he_row(0)) + "\n").encode() * 3)
    path = tmp_path / "he.jsonl.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(TaskFormatError, match="corrupt gzip stream") as info:
        load_source("humaneval", path)
    assert info.value.path == path


def test_task_format_error_is_a_value_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("nope\n")
    with pytest.raises(ValueError):
        load_source("mbpp", path)
