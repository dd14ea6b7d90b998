"""The action grammar: parse a response into one action (with exact payload spans), render it back.

A response is `<think>...</think>` followed by one action (the full text the model sees is `ACTION_SPEC`,
also published as docs/action_grammar.md). Parsing is total: every string yields an `Action` or an
`InvalidAction` with one reason from `INVALID_REASONS`; nothing raises.

Spans are half-open [start, end) Python str indices into the response text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ActionKind = Literal["edit", "insert", "write", "run_tests", "finish"]
EditOp = Literal["replace", "insert", "write"]

INVALID_REASONS: tuple[str, ...] = (
    "no_think",  # the response does not start with <think>...</think>
    "no_action",  # nothing after the think block
    "unknown_tag",  # a tag that is not part of the grammar
    "unclosed_tag",  # an opened tag or payload never closed
    "malformed_tag",  # bad or missing attributes, stray text, control action mixed with edits
    "search_not_found",  # a search text that does not occur in the file
    "search_ambiguous",  # a search text that occurs more than once
    "file_not_found",  # edit or insert into a file that does not exist
    "path_outside_workspace",  # absolute path, '..', empty or odd component
    "file_too_large",  # the action would make a file larger than the limit
    "truncated",  # the response hit the token limit before the action was complete
    "non_text",  # control characters or undecodable bytes
    "finish_too_early",  # finish before the minimum number of turns (decided by the episode)
)

ACTION_SPEC = """\
## How to respond

Every response is one thought followed by exactly one action:

<think>
your reasoning (free text)
</think>
ACTION

ACTION is one of:

1. Search/replace edits (one or more blocks; applied in order):
<edit path="solution.py">
<search>
exact lines copied from the current file
</search>
<replace>
the lines that take their place
</replace>
</edit>
   The search text must occur exactly once in the file (add surrounding lines to make it unique).
   Files are shown with each line after its number ("12| x = 1"); search text leaves the numbers out.

2. Insert lines before line N (1-based; N = number of lines + 1 appends):
<insert path="solution.py" line="N">
new lines
</insert>

3. Append lines at the end of a file:
<append path="solution.py">
new lines
</append>

4. Write a whole file (creates it or replaces all of its content):
<write path="solution.py">
full file content
</write>

5. Run the visible tests without changing anything:  <run_tests/>

6. Finish (the hidden tests then decide):  <finish/>

Rules: paths are relative to the workspace (no leading '/', no '..'). Edit, insert, append and write
blocks may be combined in one action; run_tests and finish stand alone. Right after an opening tag one
newline is ignored, so payloads can start on their own line; everything else is taken literally, up to
the closing tag (a payload cannot contain its own closing tag). Nothing but whitespace may appear
between blocks. Inserted or appended text gets a final newline if it lacks one.
"""

# The same grammar in a few lines, for small policies whose context is short or whose training budget is
# spent mostly on prompt tokens (the CPU demo): EpisodeSettings.action_spec = "brief". The parser is the same.
ACTION_SPEC_BRIEF = """\
## How to respond

<think>
your reasoning
</think>
then one action: <write path="F">whole file</write>, or <edit path="F"><search>lines copied exactly, without
their "N| " numbers</search><replace>new lines</replace></edit> (one or more), <insert path="F" line="N">lines</insert>,
<append path="F">lines</append>, <run_tests/> or <finish/>.
"""

ACTION_SPECS = {"full": ACTION_SPEC, "brief": ACTION_SPEC_BRIEF}


@dataclass(frozen=True)
class Edit:
    """One file change of an action."""

    op: EditOp  # replace (search/replace), insert (insert/append), write (whole file)
    path: str
    search: str  # "" for insert and write
    replace: str  # the new text (replacement, inserted lines, or whole file)
    search_span: tuple[int, int] | None  # response span of the search payload (replace only)
    replace_span: tuple[int, int]  # response span of the new text
    line: int | None = None  # insert: 1-based line the text goes before; None = append at the end

    def key(self) -> tuple:
        """Everything but the spans: equality of meaning, used for round-trip checks."""
        return (self.op, self.path, self.search, self.replace, self.line)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    think: str
    think_span: tuple[int, int]
    edits: tuple[Edit, ...] = ()

    ok = True

    def to_json(self) -> dict:
        """The `action_json` of the steps table (see notes/schema.md)."""
        return {
            "kind": self.kind,
            "think_span": list(self.think_span),
            "edits": [
                {
                    "op": e.op, "path": e.path, "search": e.search, "replace": e.replace,
                    "search_span": list(e.search_span) if e.search_span else None,
                    "replace_span": list(e.replace_span), "line": e.line,
                }
                for e in self.edits
            ],
        }

    def key(self) -> tuple:
        return (self.kind, self.think, tuple(e.key() for e in self.edits))


@dataclass(frozen=True)
class InvalidAction:
    reason: str  # one of INVALID_REASONS
    detail: str  # human-readable explanation (shown to the model as the observation)
    position: int = -1  # char offset in the response where the problem is, -1 if none

    ok = False
    kind = "invalid"

    def __post_init__(self) -> None:
        if self.reason not in INVALID_REASONS:
            raise ValueError(f"unknown invalid-action reason {self.reason!r}; allowed: {INVALID_REASONS}")

    def to_json(self) -> dict:
        return {"kind": "invalid", "reason": self.reason, "detail": self.detail, "position": self.position,
                "edits": []}


def action_json(action: Action | InvalidAction) -> str:
    return json.dumps(action.to_json(), ensure_ascii=False, sort_keys=True)


# ------------------------------------------------------------------------------------------------ parsing
_NON_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffd]")
_OPEN = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)((?:\s+[A-Za-z_]+\s*=\s*\"[^\"<>]*\")*)\s*(/?)>")
_ATTR = re.compile(r"([A-Za-z_]+)\s*=\s*\"([^\"<>]*)\"")
_FILE_TAGS = {"edit": ("path",), "insert": ("path", "line"), "append": ("path",), "write": ("path",)}
_CONTROL_TAGS = ("run_tests", "finish")
# ASCII digits only: str.isdigit() also accepts '²' or '٣', which int() refuses. Nine significant digits keep
# int() and json.dumps far from Python's 4,300-digit conversion limit (no file has a billion lines).
_LINE = re.compile(r"0*([1-9][0-9]{0,8})")


class _Invalid(Exception):
    def __init__(self, reason: str, detail: str, position: int = -1):
        super().__init__(detail)
        self.result = InvalidAction(reason, detail, position)


def check_path(path: str) -> str | None:
    """None if `path` is a safe workspace-relative file path, else why not."""
    if not path:
        return "empty path"
    if len(path) > 255 or "\\" in path or "\x00" in path or path.startswith(("/", "~")) or ":" in path[:3]:
        return f"path {path!r} must be relative to the workspace"
    parts = path.split("/")
    if any(p in ("", ".", "..") or p.strip() != p for p in parts):
        return f"path {path!r} has an empty, '.', '..' or space-padded component"
    return None


def _payload(text: str, start: int, close: str) -> tuple[str, tuple[int, int], int]:
    """Payload after an opening tag ending at `start` (one newline dropped) up to `close`; returns end pos."""
    if text.startswith("\n", start):
        start += 1
    end = text.find(close, start)
    if end < 0:
        raise _Invalid("unclosed_tag", f"missing {close}", start)
    return text[start:end], (start, end), end + len(close)


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _expect(text: str, pos: int, tag: str) -> int:
    pos = _skip_ws(text, pos)
    if not text.startswith(tag, pos):
        found = text[pos:pos + 20]
        if pos >= len(text):
            raise _Invalid("unclosed_tag", f"expected {tag} but the response ended", pos)
        raise _Invalid("malformed_tag", f"expected {tag}, found {found!r}", pos)
    return pos + len(tag)


def _attrs(tag: str, raw: str, pos: int) -> dict[str, str]:
    attrs = dict(_ATTR.findall(raw))
    allowed = _FILE_TAGS.get(tag, ())
    extra = set(attrs) - set(allowed)
    if extra:
        raise _Invalid("malformed_tag", f"<{tag}> does not take attribute(s) {sorted(extra)}", pos)
    missing = [a for a in allowed if a not in attrs]
    if missing:
        raise _Invalid("malformed_tag", f"<{tag}> needs attribute(s) {missing}", pos)
    if "path" in attrs:
        why = check_path(attrs["path"])
        if why:
            raise _Invalid("path_outside_workspace", why, pos)
    return attrs


def _parse(text: str) -> Action:
    bad = _NON_TEXT.search(text)
    if bad:
        raise _Invalid("non_text", f"control or undecodable character U+{ord(bad.group()):04X}", bad.start())
    pos = _skip_ws(text, 0)
    if not text.startswith("<think>", pos):
        raise _Invalid("no_think", "the response must start with <think>...</think>", pos)
    think, think_span, pos = _payload(text, pos + len("<think>"), "</think>")
    edits: list[Edit] = []
    control: str | None = None
    while True:
        pos = _skip_ws(text, pos)
        if pos >= len(text):
            break
        m = _OPEN.match(text, pos)
        if not m:
            if text.startswith("</", pos) or text.startswith("<", pos):
                tag = re.match(r"</?\s*([^\s>/]*)", text[pos:])
                name = tag.group(1) if tag else ""
                if name and name not in (*_FILE_TAGS, *_CONTROL_TAGS, "search", "replace", "think"):
                    raise _Invalid("unknown_tag", f"unknown tag <{name}>", pos)
                raise _Invalid("malformed_tag", f"malformed tag {text[pos:pos + 30]!r}", pos)
            raise _Invalid("malformed_tag", f"text outside any action block: {text[pos:pos + 30]!r}", pos)
        tag, raw_attrs, selfclose = m.group(1), m.group(2), m.group(3)
        if tag in _CONTROL_TAGS:
            if raw_attrs.strip():
                raise _Invalid("malformed_tag", f"<{tag}> takes no attributes", pos)
            pos = m.end() if selfclose else _expect(text, m.end(), f"</{tag}>")
            if control or edits:
                raise _Invalid("malformed_tag", f"<{tag}/> must be the only action", m.start())
            control = tag
            continue
        if tag not in _FILE_TAGS:
            raise _Invalid("unknown_tag", f"unknown tag <{tag}>", pos)
        if control:
            raise _Invalid("malformed_tag", f"<{control}/> must be the only action", m.start())
        if selfclose:
            raise _Invalid("malformed_tag", f"<{tag}> needs content", pos)
        attrs = _attrs(tag, raw_attrs, pos)
        path = attrs["path"]
        if tag == "edit":
            p = _expect(text, m.end(), "<search>")
            search, s_span, p = _payload(text, p, "</search>")
            if not search:
                raise _Invalid("malformed_tag", "empty <search> text", s_span[0])
            p = _expect(text, p, "<replace>")
            replace, r_span, p = _payload(text, p, "</replace>")
            pos = _expect(text, p, "</edit>")
            edits.append(Edit("replace", path, search, replace, s_span, r_span))
        else:
            body, b_span, pos = _payload(text, m.end(), f"</{tag}>")
            line = None
            if tag == "insert":
                number = _LINE.fullmatch(attrs["line"])
                if not number:
                    raise _Invalid("malformed_tag", f"line={attrs['line'][:20]!r} must be an integer from 1 to "
                                   "999999999", m.start())
                line = int(number.group(1))
            op: EditOp = "write" if tag == "write" else "insert"
            edits.append(Edit(op, path, "", body, None, b_span, line))
    if control:
        return Action(control, think, think_span)  # type: ignore[arg-type]
    if not edits:
        raise _Invalid("no_action", "an action must follow </think>", pos)
    ops = {e.op for e in edits}
    kind: ActionKind = "write" if ops == {"write"} else "insert" if ops == {"insert"} else "edit"
    return Action(kind, think, think_span, tuple(edits))


def parse_response(text: str, *, truncated: bool = False) -> Action | InvalidAction:
    """Syntax only. `truncated`: generation stopped at the token limit (turns a parse failure into
    reason "truncated", since the action was cut, not malformed)."""
    try:
        return _parse(text)
    except _Invalid as exc:
        if truncated and exc.result.reason != "non_text":
            return InvalidAction("truncated", f"response hit the length limit ({exc.result.detail})",
                                 exc.result.position)
        return exc.result


# ------------------------------------------------------------------------------------------- semantics
def apply_action(action: Action, files: Mapping[str, str], *, max_file_bytes: int) -> dict[str, str] | InvalidAction:
    """The workspace after `action` (edits applied in order), or why the action cannot apply."""
    new = dict(files)
    for e in action.edits:
        old = new.get(e.path)
        if e.op == "write":
            text = e.replace
        elif old is None:
            return InvalidAction("file_not_found", f"{e.path} does not exist (use <write> to create it)",
                                 e.replace_span[0])
        elif e.op == "replace":
            at = old.find(e.search)
            if at < 0:
                return InvalidAction("search_not_found", f"search text not found in {e.path}",
                                     e.search_span[0] if e.search_span else -1)
            # a second match may overlap the first ("\n\n" in "\n\n\n"): str.count would miss it
            if old.find(e.search, at + 1) >= 0:
                return InvalidAction("search_ambiguous", f"search text occurs more than once in {e.path}",
                                     e.search_span[0] if e.search_span else -1)
            text = old[:at] + e.replace + old[at + len(e.search):]
        else:
            body = e.replace if not e.replace or e.replace.endswith("\n") else e.replace + "\n"
            lines = old.splitlines(keepends=True)
            if e.line is None:
                text = old + ("\n" if old and not old.endswith("\n") else "") + body
            elif e.line > len(lines) + 1:
                return InvalidAction("malformed_tag", f"line {e.line} is past the end of {e.path} "
                                     f"({len(lines)} lines)", e.replace_span[0])
            else:
                head = "".join(lines[: e.line - 1])
                if head and not head.endswith("\n"):
                    head += "\n"
                text = head + body + "".join(lines[e.line - 1:])
        for other in new:  # a file cannot also be a directory
            if other != e.path and (other.startswith(e.path + "/") or e.path.startswith(other + "/")):
                return InvalidAction("path_outside_workspace", f"{e.path} collides with {other}",
                                     e.replace_span[0])
        if len(text.encode("utf-8")) > max_file_bytes:
            return InvalidAction("file_too_large", f"{e.path} would exceed {max_file_bytes} bytes",
                                 e.replace_span[0])
        new[e.path] = text
    return new


def parse_action(text: str, files: Mapping[str, str] | None = None, *, max_file_bytes: int = 256 * 1024,
                 truncated: bool = False) -> Action | InvalidAction:
    """Parse and, when `files` is given, also check that the action applies to them."""
    action = parse_response(text, truncated=truncated)
    if files is None or not action.ok or action.kind in _CONTROL_TAGS:
        return action
    applied = apply_action(action, files, max_file_bytes=max_file_bytes)  # type: ignore[arg-type]
    return applied if isinstance(applied, InvalidAction) else action


# ---------------------------------------------------------------------------------------------- render
def _check_payload(payload: str, close: str) -> str:
    if close in payload:
        raise ValueError(f"payload contains its own closing tag {close}: it cannot be rendered")
    return payload


def render_action(action: Action) -> str:
    """Canonical response text; `parse_response(render_action(a)).key() == a.key()`."""
    parts = ["<think>\n", _check_payload(action.think, "</think>"), "</think>\n"]
    if action.kind in _CONTROL_TAGS:
        parts.append(f"<{action.kind}/>")
        return "".join(parts)
    for e in action.edits:
        if check_path(e.path) or '"' in e.path or "<" in e.path or ">" in e.path:
            raise ValueError(f"cannot render path {e.path!r}")
        if e.op == "replace":
            parts += [f'<edit path="{e.path}">\n<search>\n', _check_payload(e.search, "</search>"),
                      "</search>\n<replace>\n", _check_payload(e.replace, "</replace>"), "</replace>\n</edit>\n"]
        elif e.op == "write":
            parts += [f'<write path="{e.path}">\n', _check_payload(e.replace, "</write>"), "</write>\n"]
        elif e.line is None:
            parts += [f'<append path="{e.path}">\n', _check_payload(e.replace, "</append>"), "</append>\n"]
        else:
            parts += [f'<insert path="{e.path}" line="{e.line}">\n', _check_payload(e.replace, "</insert>"),
                      "</insert>\n"]
    return "".join(parts)
