"""The boundary between trusted test code and untrusted candidate code (stdlib only; runs inside the sandbox).

The candidate's modules live in process U, a freshly exec'd interpreter that never saw a test, an expected
value or the result channel. The test code (a HumanEval `check`, a pytest session, the io driver) runs in
process T. They talk over a pair of pipes with this object RPC:

- **Plain data crosses by value**: None, bool, int, float, complex, str, bytes, list, tuple, set, frozenset,
  dict. A subclass of one of them crosses as its builtin base's value (a namedtuple as a tuple, a `str`
  subclass as its characters): the candidate chooses the value, never how T compares it.
- **Everything else stays home behind a handle.** T sees a candidate object as a `Remote` whose attribute
  reads, calls and operators are forwarded to U. Equality between a `Remote` and plain data is identity
  (False); only two candidate objects compare by the candidate's own `__eq__`. Candidate classes appear in T
  as shadow classes built from names alone (instances, `isinstance`, `except CandidateError` all work, and no
  candidate code runs in T).
- **Exceptions cross as class chain + args**: T raises a builtin (or shadow) exception carrying plain args.
- **T's objects passed to the candidate** (a lambda, a mock file) become handles in U; U may call them and
  read their public attributes, nothing else (no `__globals__`, no `__self__`, no setattr), so the candidate
  cannot walk into T's modules.

Framing: 4-byte big-endian length + UTF-8 JSON. Whatever U sends is decoded defensively: a malformed,
oversized or too deeply nested message raises `ProtocolError` in T, which fails the test that caused it.

U runs `serve_candidate` (started by the slot's zygote, see `_worker.Zygote`).
"""

from __future__ import annotations

import builtins
import collections
import importlib
import importlib.abc
import importlib.util
import json
import math
import os
import re
import select
import struct
import sys
import time
import types

MAX_MSG_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 200
_HDR = struct.Struct(">I")
# stdlib dict subclasses with honest equality (Counter == dict compares items): sent as the plain dict
_DICT_LIKE = (collections.Counter, collections.OrderedDict, collections.defaultdict)
_PLAIN_BASES = (bool, int, float, complex, str, bytes, list, tuple, set, frozenset, dict)


# "path:line" of a workspace file, as U reports where the candidate's exception was raised
_WHERE = re.compile(r"[\w][\w./-]{0,199}:\d{1,7}")


def raised_at(exc: BaseException, root: str) -> str | None:
    """Where under `root` (the workspace) an exception was raised: "path:line" of the innermost traceback frame
    in a file there, as a traceback would show the candidate; None when no frame is in the workspace."""
    prefix = os.path.join(os.path.abspath(root), "")
    where, tb = None, exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if type(name) is str and name.startswith(prefix):
            where = f"{name[len(prefix):]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where  # T checks it against _WHERE: U is the candidate's process


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message of this protocol."""


class NotPlain(TypeError):
    """A value that is not plain data (None, bool, int, float, complex, str, bytes, list, tuple, set, dict)."""


# ------------------------------------------------------------------------------------------------ framing
def write_msg(fd: int, obj) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    buf = memoryview(_HDR.pack(len(data)) + data)
    while buf:
        buf = buf[os.write(fd, buf):]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no message before the deadline")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def parse_json(data: bytes | str, max_depth: int = MAX_DEPTH + 20):
    """json.loads that never raises anything but ValueError, and refuses nesting deeper than `max_depth`."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"malformed JSON message ({type(exc).__name__})") from None
    stack = [(value, 0)]
    while stack:  # iterative: a deep tree must not exhaust the reader's own stack later
        node, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"message nested deeper than {max_depth}")
        if type(node) is list:
            stack.extend((v, depth + 1) for v in node)
        elif type(node) is dict:
            stack.extend((v, depth + 1) for v in node.values())
    return value


def read_msg(fd: int, deadline: float | None = None, limit: int = MAX_MSG_BYTES):
    """One framed message, or None at end of stream. Oversized, malformed or too deep frames raise ValueError."""
    hdr = _read_exact(fd, _HDR.size, deadline)
    if hdr is None:
        return None
    (n,) = _HDR.unpack(hdr)
    if n > limit:
        raise ValueError(f"message of {n} bytes exceeds the {limit}-byte limit")
    data = _read_exact(fd, n, deadline)
    if data is None:
        raise ValueError("stream ended inside a message")
    return parse_json(data)


# ------------------------------------------------------------------------------------- plain-data codec
def _plain_value(value):
    """The builtin value of a plain-data subclass instance (its base's data, chosen by the candidate)."""
    t = type(value)
    if t in _DICT_LIKE:
        return dict(dict.items(value))
    for base in _PLAIN_BASES:
        if isinstance(value, base):
            if base is str:
                return str.__str__(value)
            if base is int:
                return int.__index__(value)
            if base is float:
                return float.__float__(value)
            if base is dict:
                return dict(dict.items(value))
            return base(base.__iter__(value)) if hasattr(base, "__iter__") and base is not bytes else base(value)
    return value


def _value_types() -> tuple[dict, dict]:
    import datetime
    import decimal
    import fractions

    types_ = {datetime.date: "date", datetime.datetime: "datetime", datetime.time: "time",
              datetime.timedelta: "timedelta", decimal.Decimal: "Decimal", fractions.Fraction: "Fraction"}
    builders = {
        "date": datetime.date, "time": datetime.time, "timedelta": datetime.timedelta,
        "datetime": datetime.datetime, "Decimal": lambda text: decimal.Decimal(str(text)),
        "Fraction": fractions.Fraction,
    }
    return types_, builders


def _value_fields(value) -> list:
    """The constructor arguments of a stdlib value (time zones are not carried: aware values compare naive)."""
    name = _VALUE_TYPES[type(value)]
    if name == "date":
        return [value.year, value.month, value.day]
    if name == "datetime":
        return [value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond]
    if name == "time":
        return [value.hour, value.minute, value.second, value.microsecond]
    if name == "timedelta":
        return [value.days, value.seconds, value.microseconds]
    if name == "Decimal":
        return [str(value)]
    return [value.numerator, value.denominator]


_VALUE_TYPES, _VALUE_BUILDERS = _value_types()


def encode(value, handle=None, _depth: int = 0):
    """Value -> JSON-able tagged tree. Non-plain values go to `handle(value)` (NotPlain when it is None)."""
    if _depth > MAX_DEPTH:
        raise NotPlain(f"nesting deeper than {MAX_DEPTH}")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if -(2**62) < value < 2**62 else {"I": hex(value)}  # hex: no int->str digit limit
    if t is float:
        return {"f": value} if math.isfinite(value) else {"f": repr(value)}
    if t is list:
        return [encode(v, handle, _depth + 1) for v in value]
    if t is tuple:
        return {"t": [encode(v, handle, _depth + 1) for v in value]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(v, handle, _depth + 1) for v in value]}
    if t is dict:
        return {"d": [[encode(k, handle, _depth + 1), encode(v, handle, _depth + 1)] for k, v in value.items()]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [encode(value.real), encode(value.imag)]}
    if t is type and getattr(builtins, value.__name__, None) is value:  # int, str, ValueError: the same on both sides
        return {"B": value.__name__}
    if t in _VALUE_TYPES:  # stdlib values with honest equality: rebuilt from their fields on the other side
        return {"v": [_VALUE_TYPES[t], _value_fields(value)]}
    # numpy scalars: a common, honest return type. The module test comes first: reading any other attribute
    # of a proxy's class would be a request to the other side.
    if t.__module__ == "numpy" and callable(getattr(t, "item", None)) and getattr(value, "ndim", 1) == 0:
        return encode(value.item(), handle, _depth + 1)
    if isinstance(value, _PLAIN_BASES) and not isinstance(value, BaseException):
        return encode(_plain_value(value), handle, _depth + 1)
    if handle is None:
        raise NotPlain(f"value of type {t.__name__} is not plain data")
    return {"h": handle(value)}


def decode(tree, handle=None, _depth: int = 0):
    """Inverse of `encode`; builds fresh builtin objects only (handles through `handle(info)`).
    Raises ValueError on anything malformed."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"nesting deeper than {MAX_DEPTH}")
    if tree is None or type(tree) in (bool, int, str):
        return tree
    d = _depth + 1
    if type(tree) is list:
        return [decode(v, handle, d) for v in tree]
    if type(tree) is dict and len(tree) == 1:
        (tag, v), = tree.items()
        if tag == "I" and type(v) is str and len(v) < 100_000:
            return int(v, 16)
        if tag == "f" and type(v) in (int, float, str):
            return float(v)
        if tag == "t" and type(v) is list:
            return tuple(decode(x, handle, d) for x in v)
        if tag == "s" and type(v) is list:
            return {decode(x, handle, d) for x in v}
        if tag == "fs" and type(v) is list:
            return frozenset(decode(x, handle, d) for x in v)
        if tag == "d" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
            return {decode(k, handle, d): decode(x, handle, d) for k, x in v}
        if tag == "b" and type(v) is str:
            return bytes.fromhex(v)
        if tag == "c" and type(v) is list and len(v) == 2:
            return complex(decode(v[0], None, d), decode(v[1], None, d))
        if tag == "v" and type(v) is list and len(v) == 2 and v[0] in _VALUE_BUILDERS and type(v[1]) is list:
            return _VALUE_BUILDERS[v[0]](*[decode(x, None, d) for x in v[1]])
        if tag == "B" and type(v) is str and isinstance(getattr(builtins, v, None), type):
            return getattr(builtins, v)
        if tag == "h" and handle is not None and type(v) is dict:
            return handle(v)
    raise ValueError(f"malformed plain-data tree: {str(tree)[:80]}")


def decode_safely(tree, handle=None):
    """`decode` that reports every failure (bad tags, unhashable keys, bad numbers) as ProtocolError."""
    try:
        return decode(tree, handle)
    except ProtocolError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError, MemoryError) as exc:
        raise ProtocolError(f"candidate sent malformed data ({type(exc).__name__}: {str(exc)[:80]})") from None


# --------------------------------------------------------------------------------------------- the peer
# dunders U may ask of T's objects (what a file-like, an iterable, a callback or a context manager needs)
_CALLBACK_DUNDERS = frozenset({
    "__call__", "__enter__", "__exit__", "__iter__", "__next__", "__len__", "__getitem__", "__contains__",
    "__str__", "__repr__", "__bool__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__",
})


# attribute names and value types that lead from a test object to T's frames, code and modules
_INTROSPECTION_PREFIXES = ("gi_", "cr_", "ag_", "tb_", "f_", "co_")
_INTERNALS = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType)


def _builtin_base(cls: type) -> str | None:
    for k in cls.__mro__:
        if getattr(builtins, k.__name__, None) is k and k is not object:
            return k.__name__
    return None


class Peer:
    """One side of the RPC. `trusted=True` is T: it guards what U may do with T's objects and checks replies."""

    def __init__(self, rfd: int, wfd: int, *, trusted: bool):
        self.rfd, self.wfd, self.trusted = rfd, wfd, trusted
        self.side = "T" if trusted else "U"
        self._objects: dict[int, object] = {}  # handle id -> my object (kept alive for the job)
        self._ids: dict[int, int] = {}  # id(object) -> handle id
        self._proxies: dict[int, object] = {}  # remote handle id -> its proxy here
        self._shadows: dict[int, type] = {}  # remote class handle id -> shadow class here
        self.pid = os.getpid()
        # function-style suites (check, io): what a call returns must be plain data, never a candidate object
        self.plain_results = False

    # -- handles of my objects
    def _export(self, obj) -> dict:
        theirs = _remote_id(obj, self)
        if theirs is not None:  # a proxy going home: the other side resolves it to its own object
            return {"o": "U" if self.trusted else "T", "id": theirs}
        info = {"o": self.side, "id": self._handle_id(obj)}
        if isinstance(obj, type):
            info["cls"] = self._class_info(obj)
        else:
            info["of"] = self._class_info(type(obj))
            info["call"] = callable(obj)
        return info

    def _class_info(self, cls: type) -> dict:
        chain = []
        for k in cls.__mro__:
            if k is object or getattr(builtins, k.__name__, None) is k:
                break
            chain.append([self._handle_id(k), k.__name__])
        return {"chain": chain, "base": _builtin_base(cls)}

    def _handle_id(self, obj) -> int:
        """The handle of one of my objects: the same id each time it crosses, kept alive for the job."""
        hid = self._ids.get(id(obj))
        if hid is None:
            hid = len(self._objects) + 1
            self._objects[hid], self._ids[id(obj)] = obj, hid
        return hid

    def enc(self, value):
        return encode(value, self._export)

    def dec(self, tree):
        return decode_safely(tree, self._resolve)

    def _resolve(self, info: dict):
        """A handle in a message -> my own object, or a proxy for the other side's."""
        hid = info.get("id")
        if type(hid) is not int:
            raise ValueError("handle without an id")
        if info.get("o") == self.side:
            if hid not in self._objects:
                raise ValueError(f"unknown handle {hid}")
            return self._objects[hid]
        if hid in self._proxies:
            return self._proxies[hid]
        if type(info.get("cls")) is dict:
            proxy = self._shadow(hid, info["cls"])
        else:
            cls = self._shadow_of(info.get("of"))
            proxy = _make_remote(cls, self, hid)
        self._proxies[hid] = proxy
        return proxy

    def _shadow_of(self, info) -> type:
        """The local class standing for the class of a remote object (Remote when it has no candidate class)."""
        if type(info) is not dict or type(info.get("chain")) is not list or not info["chain"]:
            base = info.get("base") if type(info) is dict else None
            exc = getattr(builtins, base, None) if type(base) is str else None
            if isinstance(exc, type) and issubclass(exc, BaseException):
                return exc
            return Remote
        entry = info["chain"][0]
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int:
            raise ValueError("malformed class chain")
        return self._shadow(entry[0], info)

    def _shadow(self, hid: int, info: dict) -> type:
        """A local class for remote class `hid` whose MRO chain is `info["chain"]` (built from names only)."""
        if hid in self._shadows:
            return self._shadows[hid]
        chain = info.get("chain") if type(info) is dict else None
        if type(chain) is not list or not chain or type(chain[0]) is not list or chain[0][0] != hid:
            chain = [[hid, "RemoteClass"]]
        name = str(chain[0][1])[:100] if len(chain[0]) > 1 else "RemoteClass"
        if len(chain) > 1 and type(chain[1]) is list and type(chain[1][0]) is int:
            parent = self._shadow(chain[1][0], {"chain": chain[1:], "base": info.get("base")})
        else:
            base = info.get("base") if type(info) is dict else None
            exc = getattr(builtins, base, None) if type(base) is str else None
            if isinstance(exc, type) and issubclass(exc, BaseException):
                parent = exc if issubclass(exc, Exception) else RuntimeError
            else:
                parent = Remote
        if issubclass(parent, BaseException):
            cls = type(name, (parent,), {"__module__": "candidate", "_didpo_cpeer": self, "_didpo_chid": hid})
        else:
            cls = _RemoteMeta(name, (parent,), {"__module__": "candidate", "__slots__": (),
                                                "_didpo_cpeer": self, "_didpo_chid": hid})
        self._shadows[hid] = cls
        return cls

    # -- requests
    def request(self, op: str, target=None, *args, keep: bool = False):
        """Send one request and serve the other side's nested requests until its reply comes.

        keep: the other side answers with a handle even when the result is plain data (see `_binary`).
        """
        msg = {"q": op, "args": self.enc(list(args))}
        if target is not None:
            msg["target"] = self.enc(target)
        if keep:
            msg["keep"] = True
        write_msg(self.wfd, msg)
        while True:
            try:
                reply = read_msg(self.rfd)
            except (ValueError, OSError) as exc:
                raise ProtocolError(f"broken reply from the candidate process: {exc}") from None
            if reply is None:
                raise ProtocolError("the candidate process ended")
            if type(reply) is not dict:
                raise ProtocolError("malformed reply")
            if "q" in reply:
                self._serve_one(reply)
                continue
            if "ok" in reply:
                value = self.dec(reply["ok"])
                if self.plain_results and op == "call" and _holds_remote(value):
                    raise TypeError("the candidate returned an object that is not plain data")
                return value
            if "exc" in reply:
                raise self._exception(reply["exc"])
            raise ProtocolError("malformed reply")

    def _exception(self, tree) -> BaseException:
        if type(tree) is not dict:
            return ProtocolError("malformed exception")
        cls = self._shadow_of(tree.get("cls"))
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            cls = RuntimeError
        if not issubclass(cls, Exception):  # SystemExit & co from the candidate must not stop the tester
            cls = RuntimeError
        try:
            args = self.dec(tree.get("args", []))
        except ProtocolError:
            args = ["<malformed exception arguments>"]
        if type(args) not in (list, tuple):
            args = [str(args)]
        if cls is RuntimeError and type(tree.get("name")) is str:
            args = [f"{tree['name'][:100]}: " + ", ".join(str(a) for a in args if type(a) is str)]
        try:
            exc = cls(*args)
        except Exception:  # noqa: BLE001 - builtin exceptions with fixed arity (UnicodeError & co)
            exc = RuntimeError(", ".join(map(str, args))[:300])
        where = tree.get("where")
        if type(where) is str and _WHERE.fullmatch(where):
            # feedback only (the failing case's description); never part of the exception's args, which
            # a test may compare
            exc.raised_at = where
        return exc

    def exception_tree(self, exc: BaseException) -> dict:
        args = []
        for a in exc.args:
            try:
                args.append(self.enc(a))
            except NotPlain:
                args.append(str(a)[:300])
            except Exception:  # noqa: BLE001 - a lying __iter__/__str__ inside the exception's args
                args.append("<unencodable>")
        tree = {"cls": self._class_info(type(exc)), "name": type(exc).__name__, "args": {"t": args}}
        if not self.trusted:
            where = raised_at(exc, os.getcwd())
            if where:
                tree["where"] = where
        return tree

    # -- serving
    def serve(self) -> None:
        """Answer requests until the other side closes (U's main loop)."""
        while True:
            msg = read_msg(self.rfd)
            if msg is None:
                return
            self._serve_one(msg)

    def _serve_one(self, msg) -> None:
        try:
            result = self._perform(msg)
            keep = type(msg) is dict and msg.get("keep") is True and not self.trusted
            reply = {"ok": {"h": self._export(result)} if keep else self.enc(result)}
        except BaseException as exc:  # noqa: BLE001 - every failure crosses as an exception
            if os.getpid() != self.pid:  # a forked child of the candidate unwound into this loop: it must not reply
                os._exit(0)
            try:
                reply = {"exc": self.exception_tree(exc)}
            except BaseException:  # noqa: BLE001
                reply = {"exc": {"cls": {"chain": [], "base": "RuntimeError"}, "name": "RuntimeError",
                                 "args": {"t": ["unreportable exception"]}}}
        if os.getpid() != self.pid:
            os._exit(0)
        write_msg(self.wfd, reply)

    def _perform(self, msg):
        if type(msg) is not dict or type(msg.get("q")) is not str:
            raise ProtocolError("malformed request")
        op = msg["q"]
        args = self.dec(msg.get("args", []))
        if type(args) is not list:
            raise ProtocolError("malformed request arguments")
        target = self.dec(msg["target"]) if "target" in msg else None
        if op == "import":
            if self.trusted:
                raise PermissionError("the candidate may not import in the test process")
            return self._import(*args)
        if self.trusted:
            self._check_callback(op, target, args)
        if op == "call":
            fn_args, fn_kwargs = args
            return target(*fn_args, **fn_kwargs)
        if op == "getattr":
            value = getattr(target, args[0])
            if self.trusted and isinstance(value, _INTERNALS):  # a way into T's modules and frames
                raise PermissionError(f"the candidate may not read {args[0]!r} of a test object")
            return value
        if op == "setattr":
            setattr(target, args[0], args[1])
            return None
        if op == "delattr":
            delattr(target, args[0])
            return None
        if op == "dunder":
            name, rest = args[0], args[1:]
            if name in _OPERATORS:
                return _OPERATORS[name](target, *rest)
            return getattr(target, name)(*rest)
        raise ProtocolError(f"unknown request {op!r}")

    def _check_callback(self, op: str, target, args: list) -> None:
        """What U may do with T's objects: call them, read public attributes, use a few protocols."""
        if op == "call":
            if len(args) != 2 or type(args[0]) is not list or type(args[1]) is not dict:
                raise ProtocolError("malformed call")
            return
        if (op == "getattr" and len(args) == 1 and type(args[0]) is str and not args[0].startswith("_")
                and not args[0].startswith(_INTROSPECTION_PREFIXES)):
            return
        if op == "dunder" and args and args[0] in _CALLBACK_DUNDERS:
            return
        raise PermissionError(f"the candidate may not {op} {args[:1]!r} on a test object")

    def _import(self, name: str) -> dict:
        module = importlib.import_module(name)
        exports = {}
        for key, value in vars(module).items():
            if key.startswith("__"):
                continue
            exports[key] = value
        return {"exports": exports, "module": module}


_OPERATORS = {
    "__eq__": lambda a, b: a == b, "__ne__": lambda a, b: a != b, "__lt__": lambda a, b: a < b,
    "__le__": lambda a, b: a <= b, "__gt__": lambda a, b: a > b, "__ge__": lambda a, b: a >= b,
    "__str__": lambda a: str(a), "__repr__": lambda a: repr(a), "__len__": lambda a: len(a),
    "__bool__": lambda a: bool(a), "__hash__": lambda a: hash(a), "__iter__": lambda a: iter(a),
    "__next__": lambda a: next(a), "__contains__": lambda a, b: b in a, "__call__": lambda a, *x: a(*x),
    "__getitem__": lambda a, k: a[k], "__setitem__": lambda a, k, v: a.__setitem__(k, v),
    "__delitem__": lambda a, k: a.__delitem__(k), "__enter__": lambda a: a.__enter__(),
    "__exit__": lambda a, *x: a.__exit__(*x), "__reversed__": lambda a: reversed(a),
    "__neg__": lambda a: -a, "__pos__": lambda a: +a, "__abs__": lambda a: abs(a), "__invert__": lambda a: ~a,
    "__int__": lambda a: int(a), "__float__": lambda a: float(a), "__index__": lambda a: a.__index__(),
    "__round__": lambda a, *n: round(a, *n),
    **{f"__{n}__": (lambda op: lambda a, b: op(a, b))(f) for n, f in {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "truediv": lambda a, b: a / b, "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
        "pow": lambda a, b: a ** b, "and": lambda a, b: a & b, "or": lambda a, b: a | b,
        "xor": lambda a, b: a ^ b, "lshift": lambda a, b: a << b, "rshift": lambda a, b: a >> b,
        "matmul": lambda a, b: a @ b,
        "radd": lambda a, b: b + a, "rsub": lambda a, b: b - a, "rmul": lambda a, b: b * a,
        "rtruediv": lambda a, b: b / a, "rfloordiv": lambda a, b: b // a, "rmod": lambda a, b: b % a,
        "rpow": lambda a, b: b ** a, "rand": lambda a, b: b & a, "ror": lambda a, b: b | a,
        "rxor": lambda a, b: b ^ a,
    }.items()},
}


# ------------------------------------------------------------------------------------------- proxies in T
def _remote_id(obj, peer: Peer) -> int | None:
    """The handle id of `obj` when it is `peer`'s proxy of an object of the other side, else None."""
    if isinstance(obj, Remote):
        return _hid_of(obj) if _peer_of(obj) is peer else None
    own = vars(obj) if isinstance(obj, type | BaseException) else {}
    if own.get("_didpo_cpeer") is peer:
        return own.get("_didpo_chid")
    if own.get("_didpo_peer") is peer:
        return own.get("_didpo_hid")
    return None


def _peer_of(obj) -> Peer:
    return object.__getattribute__(obj, "_didpo_peer")


def _hid_of(obj) -> int:
    return object.__getattribute__(obj, "_didpo_hid")


def _make_remote(cls: type, peer: Peer, hid: int):
    if issubclass(cls, BaseException):  # a candidate exception object passed as a value
        obj = cls()
        obj._didpo_peer, obj._didpo_hid = peer, hid
        return obj
    obj = object.__new__(cls)
    object.__setattr__(obj, "_didpo_peer", peer)
    object.__setattr__(obj, "_didpo_hid", hid)
    return obj


def _typed(value, kind: type, what: str):
    if type(value) is not kind:
        raise TypeError(f"candidate's {what} returned {type(value).__name__}, not {kind.__name__}")
    return value


class Remote:
    """An object of the candidate process. Every use is forwarded there; comparisons with plain data are False."""

    __slots__ = ("_didpo_peer", "_didpo_hid", "_didpo_taint", "__weakref__")

    def _didpo(self, name, *args):
        if _tainted(self):  # computed from the test's own values: stays an object, never a number
            if name in _CONVERSIONS:
                raise TypeError(f"{name} of a value the candidate computed from the test's data")
            if name not in ("__str__", "__repr__"):
                return _taint(_peer_of(self).request("dunder", self, name, *args, keep=True))
        return _peer_of(self).request("dunder", self, name, *args)

    def __getattr__(self, name):
        if name.startswith("_didpo"):
            raise AttributeError(name)
        if _tainted(self):
            return _taint(_peer_of(self).request("getattr", self, name, keep=True))
        return _peer_of(self).request("getattr", self, name)

    def __setattr__(self, name, value):
        _peer_of(self).request("setattr", self, name, value)

    def __call__(self, *args, **kwargs):
        if _tainted(self):
            return _taint(_peer_of(self).request("call", self, list(args), dict(kwargs), keep=True))
        return _peer_of(self).request("call", self, list(args), dict(kwargs))

    def __iter__(self):
        return self._didpo("__iter__")

    def __next__(self):
        return self._didpo("__next__")

    def __contains__(self, item):
        return self._didpo("__contains__", item)

    def __getitem__(self, key):
        return self._didpo("__getitem__", key)

    def __setitem__(self, key, value):
        self._didpo("__setitem__", key, value)

    def __delitem__(self, key):
        self._didpo("__delitem__", key)

    def __reversed__(self):
        return self._didpo("__reversed__")

    def __enter__(self):
        return self._didpo("__enter__")

    def __exit__(self, exc_type, exc, tb):
        # the type and the exception cross as handles (the test may check their identity); never the traceback
        return self._didpo("__exit__", exc_type, exc, None)

    def __round__(self, *n):
        return self._didpo("__round__", *n)

    def __neg__(self):
        return self._didpo("__neg__")

    def __pos__(self):
        return self._didpo("__pos__")

    def __abs__(self):
        return self._didpo("__abs__")

    def __invert__(self):
        return self._didpo("__invert__")

    def _didpo_compare(self, name, other):
        # the candidate's own comparison only between its own objects: never against T's plain values
        if isinstance(other, Remote) and _peer_of(other) is _peer_of(self):
            return _peer_of(self).request("dunder", self, name, other)
        return NotImplemented

    def __eq__(self, other):
        return self._didpo_compare("__eq__", other)

    def __ne__(self, other):
        return self._didpo_compare("__ne__", other)

    def __lt__(self, other):
        return self._didpo_compare("__lt__", other)

    def __le__(self, other):
        return self._didpo_compare("__le__", other)

    def __gt__(self, other):
        return self._didpo_compare("__gt__", other)

    def __ge__(self, other):
        return self._didpo_compare("__ge__", other)


# what a tainted value may not become: a number or truth value the candidate picked after seeing the test's
# value (its text stays readable: `str(Clock(10, 0) + 3) == "10:03"` is how such results are checked)
_CONVERSIONS = frozenset({"__len__", "__bool__", "__hash__", "__int__", "__index__", "__float__"})


def _tainted(obj) -> bool:
    try:
        return object.__getattribute__(obj, "_didpo_taint") is True
    except AttributeError:
        return False


def _taint(obj):
    if isinstance(obj, Remote):
        object.__setattr__(obj, "_didpo_taint", True)
    return obj


def _holds_remote(value, _depth: int = 0) -> bool:
    if isinstance(value, Remote | _RemoteMeta) or (isinstance(value, BaseException) and "_didpo_hid" in vars(value)):
        return True
    if _depth < MAX_DEPTH and type(value) in (list, tuple, set, frozenset):
        return any(_holds_remote(v, _depth + 1) for v in value)
    if _depth < MAX_DEPTH and type(value) is dict:
        return any(_holds_remote(k, _depth + 1) or _holds_remote(v, _depth + 1) for k, v in value.items())
    return False


def _binary(name):
    def op(self, other):
        # With one of the test's own values as operand, the candidate would learn it (the expected value in
        # `abs(result - expected) < eps`) and could answer any plain number: such a result stays a candidate
        # object, so it never compares equal to or less than the test's values. Between two candidate objects
        # (Rational(1, 2) + Rational(1, 2)) the result is what the candidate's own arithmetic says.
        mixed = not (isinstance(other, Remote) and _peer_of(other) is _peer_of(self))
        if mixed or _tainted(self) or _tainted(other):
            return _taint(_peer_of(self).request("dunder", self, name, other, keep=True))
        return _peer_of(self).request("dunder", self, name, other)

    op.__name__ = name
    return op


def _conversion(name: str, kind: type):
    def convert(self):  # the candidate's answer must be of the exact builtin type Python expects here
        return _typed(self._didpo(name), kind, name)

    convert.__name__ = name
    return convert


for _name, _kind in (("__str__", str), ("__repr__", str), ("__len__", int), ("__bool__", bool), ("__hash__", int),
                     ("__int__", int), ("__index__", int), ("__float__", float)):
    setattr(Remote, _name, _conversion(_name, _kind))

for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift",
              "matmul", "radd", "rsub", "rmul", "rtruediv", "rfloordiv", "rmod", "rpow", "rand", "ror", "rxor"):
    setattr(Remote, f"__{_name}__", _binary(f"__{_name}__"))


class _RemoteMeta(type):
    """Metaclass of shadow classes: calling one builds the object in U; class attributes are read there."""

    def __call__(cls, *args, **kwargs):
        return cls._didpo_cpeer.request("call", cls, list(args), dict(kwargs))

    def __getattr__(cls, name):
        if name.startswith("_didpo") or name.startswith("__"):
            raise AttributeError(name)
        return cls._didpo_cpeer.request("getattr", cls, name)


def install_remote_modules(peer: Peer, names) -> None:
    """Make `import NAME` in T give a proxy of the candidate's module NAME (imported in U on first use).

    `from NAME import *` binds the candidate's public names except those that shadow a builtin: a candidate
    cannot redefine `abs` or `isinstance` for the tests.
    """
    names, shadowed = frozenset(names), frozenset(dir(builtins))

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return RemoteModule(spec.name)

        def exec_module(self, module):
            reply = peer.request("import", None, module.__name__)
            if type(reply) is not dict or type(reply.get("exports")) is not dict:
                raise ImportError(f"candidate module {module.__name__} sent a malformed export list")
            exports = {k: v for k, v in reply["exports"].items() if type(k) is str and not k.startswith("__")}
            module.__dict__.update(exports)
            module.__dict__["__all__"] = [k for k in exports if not k.startswith("_") and k not in shadowed]
            if isinstance(reply.get("module"), Remote):
                module.__dict__["_didpo_module"] = reply["module"]

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] in names:
                return importlib.util.spec_from_loader(fullname, Loader())
            return None

    sys.meta_path.insert(0, Finder())


class RemoteModule(types.ModuleType):
    """T's stand-in for a candidate module: names it lacks are read in U; names set on it (mock.patch) are set
    there too, so the candidate's code sees what the test patched."""

    def __getattr__(self, name):
        handle = self.__dict__.get("_didpo_module")
        if name.startswith("__") or handle is None:
            raise AttributeError(name)
        return getattr(handle, name)

    def __setattr__(self, name, value):
        handle = self.__dict__.get("_didpo_module")
        if handle is not None and not name.startswith("__"):
            setattr(handle, name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name):
        handle = self.__dict__.get("_didpo_module")
        if handle is not None and not name.startswith("__"):
            _peer_of(handle).request("delattr", handle, name)
        if name in self.__dict__:
            super().__delattr__(name)


# --------------------------------------------------------------------------------------------------- U
def serve_candidate(spec: dict) -> None:
    """Process U: serve T's requests on descriptors 3 (in) and 4 (out) against the candidate's modules.

    spec: {"paths": [dirs appended to sys.path, e.g. site-packages]}; the workspace (cwd) comes first.
    """
    for fd in (3, 4):
        os.set_inheritable(fd, False)  # a subprocess of the candidate does not inherit the channel
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.getcwd(), *(p for p in sys.path if p and os.path.abspath(p) != here)]
    sys.path.extend(p for p in spec.get("paths", []) if type(p) is str)
    sys.argv = [sys.argv[0]]
    peer = Peer(3, 4, trusted=False)
    try:
        peer.serve()
    except (ValueError, OSError):
        pass  # T went away or sent garbage: nothing left to serve

