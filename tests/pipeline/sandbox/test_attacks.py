"""The generic attack catalogue (benchmarks/judge_attacks.py) on real bundled tasks of each suite kind.

No attack may earn a pass (the judge was fooled) or an `infra_error` (the candidate escaped its reward), and
the judge must not raise on what a candidate submits. After the infra attacks the slots still judge honest
code correctly. The full sets run in the benchmark; here a few small tasks a kind keep this under a minute.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from builders import load_benchmark

from pipeline.tasks import load_source

pytestmark = pytest.mark.slow  # every case runs attacks through the sandbox: over a minute in all

attacks = load_benchmark("judge_attacks", "judge_attacks_under_test")

SHAPED = ("shadow", "liar", "rpc")  # mechanisms whose outcome depends on how the tests use the values
TASKS = {  # suite kind -> (source, native id, mechanisms run on it): small, fast, each there for a reason
    "check": [("humaneval", "HumanEval/0", attacks.MECHANISMS),  # `candidate(...) == True`
              ("humaneval", "HumanEval/4", SHAPED)],  # `abs(candidate(...) - x) < 1e-6`: shadowed abs, a liar's abs()
    "io": [("humanevalplus", "HumanEval/55", attacks.MECHANISMS),  # 31 inputs
           ("mbppplus", "Mbpp/793", SHAPED)],  # 3 inputs
    # Exercism shows its tests to the policy, so reading them is no leak: that mechanism has no pytest case
    "pytest": [("exercism", "accumulate", tuple(m for m in attacks.MECHANISMS if m != "leak")),  # lambdas passed in
               ("exercism", "clock", SHAPED)],  # a class with dunders; candidate objects compared with each other
}
ALLOWED = ("failed", "crashed", "timeout", "invalid_action", "skipped")  # skipped: the attack does not apply


@pytest.fixture(scope="module")
def tasks():
    return {kind: [(load_source(src, ids=[native])[0], mechanisms) for src, native, mechanisms in entries]
            for kind, entries in TASKS.items()}


CASES = [(m, k) for k in sorted(TASKS) for m in attacks.MECHANISMS if any(m in ms for *_, ms in TASKS[k])]


@pytest.mark.parametrize(("mechanism", "kind"), CASES)
def test_generic_attacks_neither_pass_nor_escape(judge, pool, tasks, mechanism, kind):
    targets = [task for task, mechanisms in tasks[kind] if mechanism in mechanisms]
    jobs = [(a, t) for a in attacks.ATTACKS if a.mechanism == mechanism for t in targets]
    with ThreadPoolExecutor(pool.settings.pool_size) as ex:
        outcomes = list(ex.map(lambda job: attacks.attack_once(judge, *job, pool.isolation), jobs))
    assert any(o.status != "skipped" for o in outcomes), f"no {mechanism} attack ran on {kind} tasks"
    bad = [f"{o.attack.name} on {o.task.task_id}: {o.status} {o.detail}" for o in outcomes if o.status not in ALLOWED]
    if mechanism == "infra":  # whatever the attacks left behind, the next honest job is judged right
        for task in targets:
            res = judge.run(task, task.reference, hidden=True)
            if res.status != "passed":
                bad.append(f"afterwards the reference of {task.task_id}: {res.status} {res.detail[:200]}")
    assert not bad, "\n".join(bad)


def test_catalogue_covers_every_mechanism_with_unique_names():
    names = [a.name for a in attacks.ATTACKS]
    assert len(names) == len(set(names))
    assert {a.mechanism for a in attacks.ATTACKS} == set(attacks.MECHANISMS)
    assert attacks.select_attacks("leak,liar_str") == [a for a in attacks.ATTACKS
                                                       if a.mechanism == "leak" or a.name == "liar_str"]
    with pytest.raises(ValueError, match="unknown attack"):
        attacks.select_attacks("nope")


@pytest.mark.parametrize("source, native", [entry[:2] for entries in TASKS.values() for entry in entries])
def test_attacks_keep_the_workspace_and_define_what_the_tests_import(source, native):
    """Generic attacks replace only the candidate module and define every name the tests import from it."""
    task = load_source(source, ids=[native])[0]
    files = next(a for a in attacks.ATTACKS if a.name == "liar_universal").build(task)
    for path in attacks.candidate_paths(task):
        code = compile(files[path], path, "exec")
        ns: dict = {"__name__": path[:-3]}
        exec(code, ns)
        wanted = set(attacks.imports_of_tests(task).get(path[:-3], ())) | {task.hidden_tests.entry_point}
        assert {n for n in wanted if n and n != "*"} <= set(ns), path
    assert set(task.workspace) <= set(files)


def test_a_record_file_resumes_only_runs_made_under_the_same_timeout(tmp_path):
    import json

    task = load_source("humaneval", limit=1)[0]
    liar, shadow, other = attacks.ATTACKS[:3]
    jobs = [(liar, task), (shadow, task), (other, task)]
    record = tmp_path / "runs.jsonl"
    record.write_text("\n".join([
        json.dumps({"attack": liar.name, "task": task.task_id, "status": "failed", "detail": "d", "seconds": 0.5,
                    "timeout": 5.0}),
        json.dumps({"attack": shadow.name, "task": task.task_id, "status": "failed", "detail": "", "seconds": 0.1,
                    "timeout": 2.0}),  # another timeout: run again
        "{not json",
        json.dumps({"attack": "gone", "task": task.task_id, "status": "passed", "detail": "", "seconds": 0.1,
                    "timeout": 5.0}),  # no longer in the catalogue
    ]) + "\n")
    done = attacks._recorded(str(record), 5.0, jobs)
    assert list(done) == [(liar.name, task.task_id)]
    assert done[liar.name, task.task_id].status == "failed" and done[liar.name, task.task_id].attack is liar
    assert attacks._recorded(str(tmp_path / "none.jsonl"), 5.0, jobs) == {}
    assert attacks._recorded(None, 5.0, jobs) == {}


def test_a_task_whose_tests_accept_a_constant_is_degenerate_not_forged(judge):
    """MBPP/816 (`clear_tuple`) always expects (): a liar tuple passes it, but so does `return ()`, so the pass
    is the tests' weakness, not the judge's; a task with real tests accepts no constant."""
    degenerate = load_source("mbpp", ids=["MBPP/816"])[0]
    assert attacks.accepted_constant(judge, degenerate) == "()"
    assert attacks.accepted_constant(judge, load_source("humaneval", ids=["HumanEval/0"])[0]) is None
