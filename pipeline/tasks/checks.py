"""How one output of a candidate is compared with the reference's (io suites; `meta["output_check"]`).

Generic comparisons (`equal`, `set`, `not_none`, `any`, `equal_or_zero`) and the oracles a task's intended
meaning needs where EvalPlus's expected outputs are one answer of several (HumanEval/32's roots of `poly`,
Mbpp/581's surface formula, Mbpp/558's digit distance): task knowledge, kept with the tasks so that the
sandbox's judge stays generic. Everything here runs outside the sandbox, on plain data only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any


def outputs_equal(expected, actual, atol: float) -> bool:
    """Plain-data equality with float tolerance (evalplus convention: atol 0 on floats means 1e-6)."""
    if isinstance(expected, float) or isinstance(actual, float):
        if isinstance(expected, bool) or isinstance(actual, bool):
            return expected == actual
        if not isinstance(expected, int | float) or not isinstance(actual, int | float):
            return False
        if expected == actual:  # exact, also between an int beyond float range and a float
            return True
        try:
            e, a = float(expected), float(actual)
        except OverflowError:  # an int beyond float range equals no float it is not exactly
            return False
        return (math.isnan(e) and math.isnan(a)) or math.isclose(e, a, rel_tol=0.0, abs_tol=atol or 1e-6)
    if type(expected) in (list, tuple):
        return (type(expected) is type(actual) and len(expected) == len(actual)
                and all(outputs_equal(e, a, atol) for e, a in zip(expected, actual, strict=True)))
    if type(expected) is dict:
        return (type(actual) is dict and expected.keys() == actual.keys()
                and all(outputs_equal(v, actual[k], atol) for k, v in expected.items()))
    return type(expected) is type(actual) and expected == actual or (
        isinstance(expected, int) and isinstance(actual, int) and expected == actual
    )


def _is_number(value) -> bool:
    return type(value) in (int, float)


def _poly(xs: Sequence[float], x: float) -> float:
    """sum_i xs[i] * x**i, summed left to right in floats exactly as HumanEval/32's own `poly` (and EvalPlus's
    oracle) does: a root found by that `poly` must pass, and for large coefficients an exact sum (fsum) can
    differ from it by more than atol. Raises OverflowError/TypeError on values it cannot evaluate."""
    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))


def _pyramid_surface(base: float, height: float) -> int:
    """Rounded surface area of a square pyramid: base**2 + 2*base*slant (Mbpp/581's intended formula)."""
    return round(base**2 + 2 * base * math.sqrt((base / 2) ** 2 + height**2))


def _digit_distance(a: int, b: int) -> int:
    """Sum of |digit differences| of a and b zero-padded to one length (Mbpp/558's intended meaning)."""
    sa, sb = str(a), str(b)
    width = max(len(sa), len(sb))
    return sum(abs(int(x) - int(y)) for x, y in zip(sa.zfill(width), sb.zfill(width), strict=True))


def _set_equal(expected, actual) -> bool:
    collections = (list, tuple, set, frozenset)
    if type(expected) not in collections or type(actual) not in collections:
        return False
    try:
        return set(expected) == set(actual)
    except TypeError:  # unhashable items: no set to compare
        return False


def _poly_root(expected, actual, args: Sequence, atol: float) -> bool:
    if not _is_number(actual) or len(args) != 1 or type(args[0]) not in (list, tuple):
        return False
    try:
        return abs(_poly(args[0], actual)) <= atol
    except (OverflowError, TypeError, ValueError):
        return False


def _surface_area(expected, actual, args: Sequence, atol: float) -> bool:
    if outputs_equal(expected, actual, atol):
        return True
    try:
        return _is_number(actual) and abs(actual - _pyramid_surface(*args)) <= atol
    except (OverflowError, TypeError, ValueError):  # the formula is undefined for these inputs: equality only
        return False


def _digit_distance_check(expected, actual, args: Sequence, atol: float) -> bool:
    if outputs_equal(expected, actual, atol):
        return True
    try:
        return type(actual) is int and actual == _digit_distance(*args)
    except (TypeError, ValueError):  # e.g. a negative number has no digit-wise distance: equality only
        return False


# check name -> (expected, actual, args, atol) -> passed. Both outputs are plain data; for "not_none" they were
# already reduced in the sandbox to `out if type(out) is bool else out is not None` (see `_OUTPUT_REDUCTIONS`).
_CHECKS: dict[str, Callable[[Any, Any, Sequence, float], bool]] = {
    "equal": lambda e, a, args, atol: outputs_equal(e, a, atol),
    "set": lambda e, a, args, atol: outputs_equal(e, a, atol) or _set_equal(e, a),
    "not_none": lambda e, a, args, atol: type(a) is bool and type(e) is bool and a == e,
    "any": lambda e, a, args, atol: True,
    "equal_or_zero": lambda e, a, args, atol: outputs_equal(e, a, atol) or (_is_number(a) and a == 0),
    "surface_area": _surface_area,
    "digit_distance": _digit_distance_check,
    "poly_root": _poly_root,
}
OUTPUT_CHECKS: tuple[str, ...] = tuple(_CHECKS)


def output_matches(check: str, expected, actual, args: Sequence, atol: float) -> bool:
    """Whether the candidate's `actual` output for the argument list `args` passes against the reference's
    `expected` output under EvalPlus's comparison `check` (one of OUTPUT_CHECKS; pipeline/tasks/evalplus.py):

      equal           outputs_equal (floats within atol, 1e-6 when atol is 0)
      set             equal, or the same set of items (order and duplicates ignored)
      not_none        both reduced outputs (bool: as is; else `is not None`) agree
      any             any returned value passes
      equal_or_zero   equal, or the output is the number 0
      surface_area    equal, or within atol of round(b**2 + 2*b*sqrt((b/2)**2 + h**2)) for args (b, h)
      digit_distance  equal, or the digit distance of args (a, b), zero-padded to one length
      poly_root       |sum_i xs[i] * actual**i| <= atol for args (xs,): any root passes; `expected` unused

    All plain data, evaluated here outside the sandbox; never raises on odd candidate outputs (they fail).
    """
    try:
        compare = _CHECKS[check]
    except KeyError:
        raise ValueError(f"unknown output check {check!r}; allowed: {', '.join(OUTPUT_CHECKS)}") from None
    return bool(compare(expected, actual, args, atol))
