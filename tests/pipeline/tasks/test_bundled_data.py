"""The bundled data files are intact and documented; the shared originals load to the documented counts."""

from __future__ import annotations

import hashlib

import pytest

from pipeline.tasks import BUNDLED_DIR, BUNDLED_FILES, MINTED_FILES, load_source
from pipeline.tasks.mbpp import BROKEN_REFERENCES


def sha256sums() -> dict[str, str]:
    lines = (BUNDLED_DIR / "SHA256SUMS").read_text().splitlines()
    return {
        name.strip(): digest for digest, name in (line.split(maxsplit=1) for line in lines if line.strip())
    }


def data_files() -> list[str]:
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if p.name not in ("README.md", "SHA256SUMS"))


def test_every_bundled_file_is_listed_in_sha256sums_and_nothing_else():
    assert sorted(sha256sums()) == data_files()
    assert set(BUNDLED_FILES.values()) <= set(data_files())


@pytest.mark.parametrize("name", data_files())
def test_bundled_file_matches_its_hash(name):
    digest = hashlib.sha256((BUNDLED_DIR / name).read_bytes()).hexdigest()
    assert digest == sha256sums()[name]


@pytest.mark.parametrize("name", data_files())
def test_readme_documents_each_file_with_its_hash_and_license(name):
    readme = (BUNDLED_DIR / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 2, name  # one row in the provenance table, one in the hash table
    assert any(sha256sums()[name] in row for row in rows)
    assert any(lic in rows[0] for lic in ("MIT", "Apache-2.0", "CC-BY-4.0"))


# The shared data README's task counts; MBPP is 974 rows of which the 15 broken references are dropped.
SHARED_COUNTS = {
    "HumanEval.jsonl.gz": ("humaneval", 164),
    "HumanEvalPlus.jsonl.gz": ("humanevalplus", 164),
    "HumanEvalPlus-NoExtreme.jsonl.gz": ("humanevalplus", 164),
    "MbppPlus.jsonl.gz": ("mbppplus", 378),
    "MbppPlus-NoExtreme.jsonl.gz": ("mbppplus", 378),
    "mbpp_release_v1.jsonl": ("mbpp", 974 - len(BROKEN_REFERENCES)),
    "humanevalpack_python.jsonl": ("humanevalfix", 164),
    "exercism_python.jsonl": ("exercism", 140),
}


def test_shared_counts_cover_every_bundled_file():
    assert sorted(SHARED_COUNTS) == sorted(set(data_files()) - set(MINTED_FILES.values()))


def test_the_minted_curriculum_is_the_repair_default_split_by_program():
    tasks = load_source("repair")
    train, test = ([t for t in tasks if t.split == s] for s in ("train", "test"))
    assert (len(train), len(test)) == (206, 94)
    assert {b["family"] for t in tasks for b in t.meta["bugs"]} == {"drop_return"}
    programs = {s: {t.meta["problem"] for t in group} for s, group in (("train", train), ("test", test))}
    assert not programs["train"] & programs["test"]
    assert all(t.meta["problem"].startswith("mbpp:") for t in tasks)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHARED_COUNTS))
def test_shared_data_files_load_to_the_documented_counts(shared_data, name):
    source, count = SHARED_COUNTS[name]
    tasks = load_source(source, shared_data / name)
    assert len(tasks) == count
    assert all(t.source == source for t in tasks)
