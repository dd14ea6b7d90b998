"""Normalization and tokenization of code lines before near-duplicate comparison.

A line is compared without its comment, its indentation and its trailing space; blank lines are dropped.
Optionally, identifiers the candidate itself binds (loop variables, assignment targets, parameters, `as`
names) are renamed v0, v1, ... in order of first appearance, so a renamed loop variable still matches.
Tokens are hashed with a keyed BLAKE2 digest, never Python's salted `hash`, so signatures are the same in
every process.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

import numpy as np

_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d+)?|\S")
_IDENT = r"[A-Za-z_]\w*"
_NAMES = rf"\(?\s*{_IDENT}(?:\s*,\s*{_IDENT})*\s*,?\s*\)?"
_BINDERS = (
    re.compile(rf"\bfor\s+({_NAMES})\s+in\b"),
    re.compile(rf"^\s*({_NAMES})\s*(?:[-+*/%&|^@]|//|\*\*|<<|>>)?=(?!=)", re.MULTILINE),
    re.compile(r"\bdef\s+\w+\s*\(([^)]*)\)"),
    re.compile(r"\blambda\s+([^:]*):"),
    re.compile(rf"\bas\s+({_IDENT})"),
)
_KEYWORDS = frozenset(
    "False None True and as assert async await break class continue def del elif else except finally for "
    "from global if import in is lambda nonlocal not or pass raise return try while with yield self".split()
)


@lru_cache(maxsize=1 << 17)
def normalize_line(line: str) -> str:
    """The comparable form of one source line: comment, indentation and trailing space removed ("" = blank)."""
    if "#" in line:
        line = _strip_comment(line)
    return line.strip()


def _strip_comment(line: str) -> str:
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif line.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif ch in "\"'":
            quote = line[i : i + 3] if line[i : i + 3] in ('"""', "'''") else ch
            i += len(quote) - 1
        elif ch == "#":
            return line[:i]
        i += 1
    return line


def tokenize(text: str) -> list[str]:
    """Code tokens: identifiers, numbers, single punctuation characters (whitespace ignored)."""
    return _TOKEN.findall(text)


@lru_cache(maxsize=1 << 16)
def comparison_tokens(text: str, canonicalize: bool) -> tuple[str, ...]:
    """Tokens of a normalized candidate text, with locally bound identifiers renamed when asked."""
    tokens = tokenize(text)
    if not canonicalize:
        return tuple(tokens)
    bound: set[str] = set()
    for pattern in _BINDERS:
        for match in pattern.finditer(text):
            bound.update(name for name in re.findall(_IDENT, match.group(1)) if name not in _KEYWORDS)
    if not bound:
        return tuple(tokens)
    renamed: dict[str, str] = {}
    out = []
    previous = ""
    for tok in tokens:
        if tok in bound and previous != ".":
            tok = renamed.setdefault(tok, f"v{len(renamed)}")
        out.append(tok)
        previous = tok
    return tuple(out)


_TOKEN_HASHES: dict[str, int] = {}


def token_hash(token: str) -> int:
    """Stable 63-bit hash of a token (the same in every process)."""
    value = _TOKEN_HASHES.get(token)
    if value is None:
        digest = hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        value = int.from_bytes(digest, "little") >> 1
        if len(_TOKEN_HASHES) < 1 << 20:  # bounded cache
            _TOKEN_HASHES[token] = value
    return value


def token_hashes(tokens: tuple[str, ...]) -> np.ndarray:
    """[len(tokens)] uint64 stable token hashes."""
    return np.fromiter((token_hash(t) for t in tokens), dtype=np.uint64, count=len(tokens))
