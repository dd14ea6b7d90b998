from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.agent import (
    ACTION_SPEC,
    ACTION_SPEC_BRIEF,
    INVALID_REASONS,
    Action,
    Edit,
    InvalidAction,
    action_json,
    apply_action,
    parse_action,
    parse_response,
    render_action,
)

FILES = {"solution.py": "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n",
         "pkg/util.py": "X = 1\n"}

BUNDLED = """<think>
Two fixes in one action.
</think>
<edit path="solution.py">
<search>
def add(a, b):
    return a - b
</search>
<replace>
def add(a, b):
    return a + b
</replace>
</edit>
<append path="pkg/util.py">
Y = 2
</append>
"""


def test_bundled_action_spans_and_json():
    a = parse_response(BUNDLED)
    assert isinstance(a, Action) and a.kind == "edit" and len(a.edits) == 2
    e = a.edits[0]
    assert BUNDLED[slice(*e.search_span)] == e.search == "def add(a, b):\n    return a - b\n"
    assert BUNDLED[slice(*e.replace_span)] == e.replace == "def add(a, b):\n    return a + b\n"
    assert BUNDLED[slice(*a.think_span)] == "Two fixes in one action.\n"
    j = a.to_json()
    assert j["edits"][0]["op"] == "replace" and j["edits"][0]["search_span"] == list(e.search_span)
    assert j["edits"][1] == {"op": "insert", "path": "pkg/util.py", "search": "", "replace": "Y = 2\n",
                             "search_span": None, "replace_span": list(a.edits[1].replace_span), "line": None}
    new = apply_action(a, FILES, max_file_bytes=10_000)
    assert new["solution.py"].startswith("def add(a, b):\n    return a + b\n") and new["pkg/util.py"] == "X = 1\nY = 2\n"


@pytest.mark.parametrize(("text", "reason"), [
    ("no think here <finish/>", "no_think"),
    ("<think>x</think>", "no_action"),
    ("<think>x</think><delete path='a'/>", "unknown_tag"),
    ("<think>x</think><frobnicate/>", "unknown_tag"),
    ("<think>x", "unclosed_tag"),
    ('<think>x</think><write path="solution.py">abc', "unclosed_tag"),
    ('<think>x</think><edit path="solution.py"><search>a</search>', "unclosed_tag"),
    ("<think>x</think>Here you go: <finish/>", "malformed_tag"),
    ("<think>x</think><finish/><run_tests/>", "malformed_tag"),
    ('<think>x</think><insert path="solution.py" line="zero">a</insert>', "malformed_tag"),
    ('<think>x</think><write path="/etc/passwd">a</write>', "path_outside_workspace"),
    ('<think>x</think><write path="../x.py">a</write>', "path_outside_workspace"),
    ('<think>x</think><write path="a/./b.py">a</write>', "path_outside_workspace"),
    ("<think>x\x00</think><finish/>", "non_text"),
    ("<think>bad byte \ufffd</think><finish/>", "non_text"),
])
def test_syntax_reasons(text, reason):
    r = parse_response(text)
    assert isinstance(r, InvalidAction) and r.reason == reason, r


@pytest.mark.parametrize(("body", "reason"), [
    ('<edit path="solution.py"><search>nothing like this</search><replace>x</replace></edit>', "search_not_found"),
    ('<edit path="solution.py"><search>    return a - b\n</search><replace>x</replace></edit>', "search_ambiguous"),
    ('<edit path="nope.py"><search>a</search><replace>b</replace></edit>', "file_not_found"),
    ('<write path="big.py">' + "x" * 2000 + "</write>", "file_too_large"),
    ('<write path="solution.py/inner.py">x</write>', "path_outside_workspace"),
])
def test_semantic_reasons(body, reason):
    r = parse_action("<think>t</think>" + body, FILES, max_file_bytes=1000)
    assert isinstance(r, InvalidAction) and r.reason == reason, r


def test_truncated_flag_names_the_cause():
    cut = BUNDLED[: BUNDLED.index("</replace>")]
    assert parse_response(cut).reason == "unclosed_tag"
    assert parse_response(cut, truncated=True).reason == "truncated"
    assert parse_response(BUNDLED, truncated=True).ok  # a complete action is kept even at the limit


def test_insert_and_write_semantics():
    a = parse_response('<think>t</think><insert path="pkg/util.py" line="1">import os</insert>'
                       '<write path="new.py">\nprint(1)\n</write>')
    assert a.kind == "edit"
    new = apply_action(a, FILES, max_file_bytes=10_000)
    assert new["pkg/util.py"] == "import os\nX = 1\n" and new["new.py"] == "print(1)\n"


def test_spec_is_published_verbatim_in_docs():
    doc = Path(__file__).resolve().parents[3] / "docs" / "action_grammar.md"
    assert ACTION_SPEC.strip() in doc.read_text()
    assert ACTION_SPEC_BRIEF.strip() in doc.read_text()


# ------------------------------------------------------------------------------------------------ hypothesis
_payload = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffd") | st.just("\n"),
                   max_size=40).filter(lambda s: "</" not in s)
_path = st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,8}(\.py)?", fullmatch=True), min_size=1, max_size=3).map("/".join)


@st.composite
def actions(draw):
    kind = draw(st.sampled_from(["edits", "run_tests", "finish"]))
    think = draw(_payload)
    if kind != "edits":
        return Action(kind, think, (0, 0))
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["replace", "insert", "write"]))
        path = draw(_path)
        if op == "replace":
            edits.append(Edit("replace", path, draw(_payload.filter(bool)), draw(_payload), (0, 0), (0, 0)))
        elif op == "insert":
            edits.append(Edit("insert", path, "", draw(_payload), None, (0, 0), draw(st.none() | st.integers(1, 50))))
        else:
            edits.append(Edit("write", path, "", draw(_payload), None, (0, 0)))
    ops = {e.op for e in edits}
    k = "write" if ops == {"write"} else "insert" if ops == {"insert"} else "edit"
    return Action(k, think, (0, 0), tuple(edits))


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions())
def test_render_parse_round_trip(action):
    text = render_action(action)
    parsed = parse_response(text)
    assert parsed.ok and parsed.key() == action.key()
    assert render_action(parsed) == text
    for e in parsed.edits:  # spans point at the payloads
        assert text[slice(*e.replace_span)] == e.replace
        if e.search_span:
            assert text[slice(*e.search_span)] == e.search


def _check_total(result):
    assert isinstance(result, Action | InvalidAction)
    if isinstance(result, InvalidAction):
        assert result.reason in INVALID_REASONS and result.detail and len(result.detail) < 500
    action_json(result)  # what the steps table stores must serialize too


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_random_text(text):
    _check_total(parse_response(text))
    _check_total(parse_action(text, FILES, max_file_bytes=1000))


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions(), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3), st.text(max_size=6)), max_size=5))
def test_fuzz_mutated_responses(action, mutations):
    text = render_action(action)
    for pos, cut, insert in mutations:
        pos %= len(text) + 1
        text = text[:pos] + insert + text[pos + cut:]
    _check_total(parse_response(text))
    _check_total(parse_action(text, FILES, max_file_bytes=1000, truncated=bool(mutations)))


def test_overlapping_search_matches_are_ambiguous():
    files = {"n.txt": "aaa\n"}  # "aa" occurs twice, overlapping: str.count says once
    r = parse_action('<think>t</think><edit path="n.txt"><search>aa</search><replace>b</replace></edit>',
                     files, max_file_bytes=1000)
    assert isinstance(r, InvalidAction) and r.reason == "search_ambiguous", r
    ok = parse_action('<think>t</think><edit path="n.txt"><search>aaa</search><replace>b</replace></edit>',
                      files, max_file_bytes=1000)
    assert ok.ok and apply_action(ok, files, max_file_bytes=1000) == {"n.txt": "b\n"}


# ------------------------------------------------------------------------------------ totality (never raises)
# Digits that str.isdigit() accepts but int() refuses, digits of other scripts that int() does accept, and
# numbers past Python's 4,300-digit int/str conversion limit.
_NUMBERS = st.one_of(
    st.sampled_from(["²", "³", "¹", "٣", "𝟘", "𝟙", "१", "٠١", "①", "Ⅻ", "1²", "-1", "+1", "0", "00", "1e3", "1_0",
                     " 1", "1 ", "0x1", "", "1" * 4301, "9" * 10_000, "0" * 5000 + "1"]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(st.characters(whitelist_categories=("Nd", "No", "Nl")), min_size=1, max_size=12),
    st.integers(1, 12_000).map(lambda n: "7" * n),
)
_TAGS = ["think", "edit", "search", "replace", "insert", "append", "write", "run_tests", "finish", "delete"]
_ATTRS = st.one_of(st.sampled_from(['path="solution.py"', 'path="pkg/util.py"', 'path="a/../b"', 'path=""']),
                   _NUMBERS.map(lambda n: f'line="{n}"'))
_OPEN_TAGS = st.builds(lambda tag, attrs, close: f"<{tag}{''.join(' ' + a for a in attrs)}{close}>",
                       st.sampled_from(_TAGS), st.lists(_ATTRS, max_size=3), st.sampled_from(["", "/"]))
# whole blocks, mostly well formed, so the parser gets past the first block to the attributes of the next
_BLOCKS = st.builds(lambda tag, attrs, body: f"<{tag}{''.join(' ' + a for a in attrs)}>{body}</{tag}>",
                    st.sampled_from(["insert", "insert", "append", "write", "edit"]),
                    st.lists(_ATTRS, min_size=1, max_size=2).map(lambda a: sorted(a, key=lambda x: x[0] != "p")),
                    st.sampled_from(["x\n", "<search>a</search><replace>b</replace>", ""]) | st.text(max_size=6))
_SOUP_PIECES = st.one_of(
    _BLOCKS,
    _BLOCKS,
    _OPEN_TAGS,
    st.sampled_from(_TAGS).map(lambda tag: f"</{tag}>"),
    st.sampled_from(["<", "</", ">", "/>", '"', "=", " ", "\n", "def f():\n    return 1\n"]),
    st.text(max_size=8),
)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_SOUP_PIECES, max_size=30).map("".join), st.booleans())
def test_tag_soup_never_raises(soup, truncated):
    text = "<think>t</think>" + soup
    _check_total(parse_response(text, truncated=truncated))
    _check_total(parse_action(text, FILES, max_file_bytes=1000, truncated=truncated))
    _check_total(parse_response(soup))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_NUMBERS)
def test_insert_line_is_ascii_digits_or_a_parse_error(number):
    r = parse_response(f'<think>t</think><insert path="solution.py" line="{number}">x</insert>')
    _check_total(r)
    stripped = number.lstrip("0")
    if number.isascii() and number.isdigit() and stripped and len(stripped) <= 9:
        assert r.ok and r.edits[0].line == int(stripped)
    else:
        assert r.reason == "malformed_tag" and "line=" in r.detail, r


@pytest.mark.parametrize("number", ["²", "1" * 4301])
def test_unparseable_line_numbers_are_invalid_actions_not_errors(number):
    """Regressions: '²' passes str.isdigit() but not int(); 4,301 digits pass neither int() nor str()."""
    text = f'<think>t</think><insert path="solution.py" line="{number}">x</insert>'
    for r in (parse_response(text), parse_action(text, FILES), parse_response(text, truncated=True)):
        assert isinstance(r, InvalidAction) and r.reason in ("malformed_tag", "truncated"), r
        assert "must be an integer" in r.detail and len(r.detail) < 120


def test_line_numbers_keep_their_meaning():
    r = parse_action('<think>t</think><insert path="solution.py" line="0002">Z = 0\n</insert>', FILES)
    assert r.ok and r.edits[0].line == 2
    far = parse_action('<think>t</think><insert path="solution.py" line="999999999">x</insert>', FILES)
    assert far.reason == "malformed_tag" and "past the end" in far.detail
