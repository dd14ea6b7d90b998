"""Every user mistake on the `didpo` command line: one line on stderr naming the culprit, a non-zero exit, no
traceback (workflows/errors.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflows.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    out, err = capsys.readouterr()
    return stop.value.code, out, err


def assert_refused(capsys: pytest.CaptureFixture[str], args: list[str], culprit: str) -> str:
    code, out, err = run_cli(capsys, *args)
    assert code not in (0, None), (out, err)
    assert "Traceback" not in out + err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert culprit in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Bad inputs on disk, by name."""
    (tmp_path / "solution.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "latin1.py").write_bytes(b"\xff\xfe not UTF-8")
    (tmp_path / "broken.json").write_text('["<think>t</think><finish/>", ')
    (tmp_path / "object.json").write_text('{"a": 1}')
    (tmp_path / "responses.json").write_text(json.dumps(["<think>t</think><finish/>"]))
    (tmp_path / "bad.yaml").write_bytes(b"run:\n  seed: \xff\n")
    (tmp_path / "latin1.sql").write_bytes(b"SELECT 1; -- \xff\n")
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "empty_steps").mkdir()
    (tmp_path / "empty_run" / "round=0" / "steps").mkdir(parents=True)
    (tmp_path / "not_credit").mkdir()
    (tmp_path / "not_credit" / "notes.txt").write_text("keep me")
    return {p.name: str(p) for p in tmp_path.iterdir()} | {"missing": str(tmp_path / "missing")}


HUMANEVALFIX_0 = "humanevalfix/Python/0"
# (args with {name} placeholders for `files`, what the message must name)
BAD_INPUTS = {
    "exec: unknown task source": (["exec", "--task", "nosuch/0", "--solution", "{solution.py}"], "nosuch/0"),
    "exec: unknown task id": (["exec", "--task", "humanevalfix/Python/99999", "--solution", "{solution.py}"],
                              "humanevalfix/Python/99999"),
    "exec: solution not UTF-8": (["exec", "--task", HUMANEVALFIX_0, "--solution", "{latin1.py}"], "latin1.py"),
    "exec: solution malformed JSON": (["exec", "--task", HUMANEVALFIX_0, "--solution", "{broken.json}"],
                                      "broken.json"),
    "exec: solution JSON not a workspace": (["exec", "--task", HUMANEVALFIX_0, "--solution", "{object.json}"],
                                            "object.json"),
    "exec: missing solution": (["exec", "--task", HUMANEVALFIX_0, "--solution", "{missing}"], "missing"),
    "exec: solution is a folder": (["exec", "--task", HUMANEVALFIX_0, "--solution", "{a_folder}"], "a_folder"),
    "exec: --pool 0": (["exec", "--task", HUMANEVALFIX_0, "--solution", "{solution.py}", "--pool", "0"], "--pool"),
    "exec: --pool not a number": (["exec", "--task", HUMANEVALFIX_0, "--solution", "{solution.py}", "--pool", "x"],
                                  "--pool"),
    "exec: --all with an unknown source": (["exec", "--all", "--source", "nosuch"], "nosuch"),
    "episode: malformed JSON responses": (["episode", "--task", HUMANEVALFIX_0, "--responses", "{broken.json}"],
                                          "broken.json"),
    "episode: responses not UTF-8": (["episode", "--task", HUMANEVALFIX_0, "--responses", "{latin1.py}"],
                                     "latin1.py"),
    "episode: responses not a list": (["episode", "--task", HUMANEVALFIX_0, "--responses", "{object.json}"],
                                      "object.json"),
    "episode: --max-turns 0": (["episode", "--task", HUMANEVALFIX_0, "--responses", "{responses.json}",
                                "--max-turns", "0"], "--max-turns"),
    "episode: unknown task": (["episode", "--task", "nosuch/0", "--responses", "{responses.json}"], "nosuch/0"),
    "credit: empty steps folder": (["credit", "--steps", "{empty_steps}", "--out", "{missing}"], "empty_steps"),
    "credit: missing steps": (["credit", "--steps", "{missing}", "--out", "{a_folder}"], "missing"),
    "credit: steps not Parquet": (["credit", "--steps", "{solution.py}", "--out", "{a_folder}"], "solution.py"),
    "credit: unknown estimator": (["credit", "--steps", "{empty_steps}", "--out", "{a_folder}", "--set",
                                   "credit.estimator=ppo"], "ppo"),
    "credit: unknown settings key": (["credit", "--steps", "{empty_steps}", "--out", "{a_folder}",
                                      "--set", "credit.lamda=1"], "lamda"),
    "credit: --out is a file": (["credit", "--steps", "{empty_steps}", "--out", "{solution.py}"], "solution.py"),
    "credit: --out holds other files": (["credit", "--steps", "{empty_steps}", "--out", "{not_credit}"],
                                        "not_credit"),
    "sql: empty round": (["sql", "reward_by_turn", "--run", "{empty_run}"], "round=0"),
    "sql: missing run": (["sql", "reward_by_turn", "--run", "{missing}"], "missing"),
    "sql: query file not UTF-8": (["sql", "{latin1.sql}", "--run", "{empty_run}"], "latin1.sql"),
    "sql: unknown query": (["sql", "nosuch", "--run", "{empty_run}"], "nosuch"),
    "config: unknown key": (["config", "show", "--set", "credit.lamda=1"], "credit.lamda"),
    "config: file not UTF-8": (["config", "show", "--config", "{bad.yaml}"], "bad.yaml"),
    "config: a folder": (["config", "show", "--config", "{a_folder}"], "a_folder"),
    "config: missing file": (["config", "check", "--config", "{missing}"], "missing"),
    "tasks: unknown id": (["tasks", "show", "humanevalfix/Python/99999"], "humanevalfix/Python/99999"),
    "model: missing checkpoint": (["model", "info", "{missing}"], "missing"),
    "schema: unknown table": (["schema", "nope"], "nope"),
    "pipeline: negative round": (["pipeline", "run", "--round", "-1"], "--round"),
    "pipeline: missing checkpoint": (["pipeline", "run", "--checkpoint", "{missing}"], "missing"),
    "round: --rounds 0": (["round", "--rounds", "0"], "--rounds"),
    "compare: seeds not numbers": (["compare", "--seeds", "a,b"], "--seeds"),
    "compare: --jobs 0": (["compare", "--jobs", "0"], "--jobs"),
    "compare: an object-store root": (["compare", "--set", "run.root=gs://b/runs"], "compare needs a local folder"),
    "eval: missing policy": (["eval", "--policy", "{missing}"], "missing"),
    "unknown command": (["nosuch"], "nosuch"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_naming_the_culprit(case, files, capsys):
    args, culprit = BAD_INPUTS[case]
    assert_refused(capsys, [files.get(a[1:-1], a) if a.startswith("{") else a for a in args], culprit)


def test_credit_refuses_empty_steps_and_writes_nothing(files, capsys, tmp_path):
    line = assert_refused(capsys, ["credit", "--steps", files["empty_steps"], "--out", str(tmp_path / "out")],
                          "empty_steps")
    assert "no rows" in line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_good_input_still_exits_0(capsys):
    code, out, err = run_cli(capsys, "config", "show", "--set", "credit.lam=0.6")
    assert code == 0 and "lam: 0.6" in out and not err
    code, out, _ = run_cli(capsys, "schema", "anchors")
    assert code == 0 and "anchor_id" in out


def test_episode_survives_line_numbers_the_parser_used_to_raise_on(tmp_path, capsys):
    """'²' passes str.isdigit() but not int(); 4,301 digits pass neither int() nor str(): both are parse errors."""
    responses = tmp_path / "responses.json"
    responses.write_text(json.dumps([f'<think>t</think><insert path="solution.py" line="{n}">x</insert>'
                                     for n in ("²", "1" * 4301)]))
    code, out, err = run_cli(capsys, "episode", "--task", HUMANEVALFIX_0, "--responses", str(responses),
                             "--max-turns", "4")
    assert code == 0, err
    turns = [json.loads(line) for line in out.splitlines() if line.startswith('{"turn"')]
    assert [t["action"]["reason"] for t in turns] == ["malformed_tag", "malformed_tag"]


def test_a_refused_resume_is_one_line(capsys, monkeypatch):
    """`didpo round` over a round whose completed stage read other inputs: the conflict, not a traceback."""
    import workflows.rounds
    from pipeline.schema import RoundConflict

    def conflict(cfg, rounds):
        raise RoundConflict("runs/x/round=0: stage train was completed with other inputs: train.lr 0.01 -> 0.001.")

    monkeypatch.setattr(workflows.rounds, "run_rounds", conflict)
    assert_refused(capsys, ["round", "--rounds", "1"], "stage train")
