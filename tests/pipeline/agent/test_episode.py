from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.agent import INVALID_REASONS, Episode, EpisodeSettings, workspace_hash
from pipeline.sandbox.judge import CaseResult, ExecResult
from pipeline.tasks.base import Task, TestSuite

BUGGY = "def add(a, b):\n    return a - b\n"
FIX = ('<think>\nsign bug\n</think>\n<edit path="solution.py">\n<search>\n    return a - b\n</search>\n'
       "<replace>\n    return a + b\n</replace>\n</edit>\n")


class CountingExecutor:
    """Test double: visible tests = 4 cases, 4 pass iff the fix is in, else 1 (records every call)."""

    def __init__(self):
        self.calls: list[tuple[bool, dict]] = []

    def run(self, task: Task, files: Mapping[str, str], *, hidden: bool = False) -> ExecResult:
        self.calls.append((hidden, dict(files)))
        ok = "return a + b" in files.get("solution.py", "")
        n = 4 if ok else 1
        cases = tuple(CaseResult(f"case {i}", i < n, "" if i < n else "AssertionError") for i in range(4))
        return ExecResult("passed" if ok else "failed", n, 4, 0.01, "test", cases)


def _task() -> Task:
    suite = TestSuite(kind="check", files={"t.py": "def check(c):\n    assert c(1, 2) == 3\n"}, entry_point="add",
                      module="solution")
    return Task("handmade/add", "handmade", "test", "Fix add.", {"solution.py": BUGGY}, suite, suite,
                {"solution.py": "def add(a, b):\n    return a + b\n"})


def test_fix_then_finish_rewards_and_records():
    ex = CountingExecutor()
    ep = Episode(_task(), ex, EpisodeSettings(max_turns=4, reward_coef=0.5, min_turns_before_finish=2))
    early = ep.step("<think>done?</think><finish/>")
    assert early.action_status == "finish_too_early" and early.step_reward == -0.1 and not ex.calls
    s1 = ep.step(FIX)
    assert s1.action_kind == "edit" and s1.exec_status == "passed" and s1.step_reward == pytest.approx(0.5)
    assert s1.files_before == (("solution.py", BUGGY),) and s1.files_after[0][1].endswith("return a + b\n")
    assert s1.workspace_hash_before == workspace_hash({"solution.py": BUGGY}) != s1.workspace_hash_after
    assert "-    return a - b" in s1.diff and s1.action_json["edits"][0]["search"] == "    return a - b\n"
    s2 = ep.step("<think>ship it</think>\n<finish/>")
    assert s2.done and s2.outcome == 1.0 and s2.step_reward == 1.0 and ex.calls[-1][0] is True
    assert ep.state.total_reward == pytest.approx(-0.1 + 0.5 + 1.0)
    with pytest.raises(RuntimeError, match="finished"):
        ep.step(FIX)


def test_turn_limit_runs_hidden_tests_and_prompt_shows_history():
    ex = CountingExecutor()
    ep = Episode(_task(), ex, EpisodeSettings(max_turns=2, history_turns=1))
    r = ep.step("<think>look</think><run_tests/>")
    assert r.step_reward == 0.0 and r.visible_passed == 1 and "FAILED case 1" in r.observation
    user = ep.prompt_messages()[1]["content"]
    assert "## Turn 1" in user and "<run_tests/>" in user and "Turn 2 of 2" in user
    assert "1| def add(a, b):\n2|     return a - b\n" in user  # the file, each line after its number
    last = ep.step("<think>oops</think><edit path='solution.py'>")
    assert last.exec_status == "invalid_action" and last.done and last.outcome == 0.0
    assert last.step_reward == pytest.approx(-0.1)


def test_the_steps_table_keeps_each_failing_case_and_why():
    from pipeline.rollout import failing_cases

    ep = Episode(_task(), CountingExecutor(), EpisodeSettings(max_turns=3))
    looked = ep.step("<think>look</think><run_tests/>")
    assert failing_cases(looked) == [{"case": f"case {i}", "detail": "AssertionError"} for i in (1, 2, 3)]
    assert failing_cases(ep.step(FIX)) == []  # every case passes
    assert failing_cases(ep.step("<edit path='solution.py'>")) == []  # nothing ran


def test_long_files_are_elided_with_markers_around_the_change():
    long = "".join(f"x{i} = {i}\n" for i in range(400)) + BUGGY
    task = Task("handmade/long", "handmade", "test", "Fix add.", {"solution.py": long}, _task().visible_tests,
                _task().hidden_tests, {"solution.py": long})
    ep = Episode(task, CountingExecutor(), EpisodeSettings(elide_lines=50))
    ep.step(FIX)
    user = ep.prompt_messages()[1]["content"]
    assert "[... lines 1-" in user and "elided ...]" in user and "402|     return a + b" in user
    assert "x10 = 10" not in user  # cut, but announced
    assert "400| x399 = 399" in user  # numbers are the file's own, also inside a window


def test_chat_template_rendering_uses_the_tokenizer():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "|".join(m["role"] for m in messages)

    ep = Episode(_task(), CountingExecutor())
    assert ep.render_prompt(Tok()) == "system|user"
    assert ep.render_prompt().endswith("<|im_start|>assistant\n")  # no tokenizer: ChatML


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(max_size=120), st.sampled_from([FIX, "<think>t</think><finish/>",
                                                                  "<think>t</think><run_tests/>"])),
                min_size=1, max_size=6))
def test_fuzz_episode_never_raises(responses):
    ep = Episode(_task(), CountingExecutor(), EpisodeSettings(max_turns=4))
    for text in responses:
        if ep.state.done:
            break
        r = ep.step(text)
        assert r.action_status == "ok" or r.action_status in INVALID_REASONS
        assert r.exec_status in ("passed", "failed", "invalid_action")


@pytest.mark.parametrize("style", ["full", "brief"])
def test_system_prompt_states_the_configured_grammar_spec(style):
    from pipeline.agent.grammar import ACTION_SPEC, ACTION_SPEC_BRIEF

    system = Episode(_task(), CountingExecutor(), EpisodeSettings(action_spec=style)).prompt_messages()[0]["content"]
    wanted, other = (ACTION_SPEC, ACTION_SPEC_BRIEF) if style == "full" else (ACTION_SPEC_BRIEF, ACTION_SPEC)
    assert wanted in system and other not in system
    with pytest.raises(ValueError, match="action_spec"):
        EpisodeSettings(action_spec="verbose")
