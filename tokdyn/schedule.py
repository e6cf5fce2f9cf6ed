"""Recording schedules: at which optimizer steps the probe is evaluated.

Learning times span decades, so schedules are (mostly) even in ``log step``. Every schedule is
a sorted array of distinct integer steps that always contains its first and last step. Step 0
(before any update) is kept in the store and left out of fits, since it has no logarithm.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ._checks import INT64_MAX, as_values, check_count, axis_tie, is_int, is_whole
from ._text import shown
from .errors import InputError

__all__ = ["geometric_schedule", "pythia_schedule", "explicit_schedule", "make_schedule"]


def geometric_schedule(last: int, n: int, *, first: int = 0) -> np.ndarray:
    """About ``n`` steps evenly spaced in ``log step`` between ``max(first, 1)`` and ``last``.

    Rounding to integers merges steps that collide early on, so fewer than ``n`` may come back;
    ``first`` (0 by default, the untrained model) and ``last`` are always included.
    """
    _check_range(first, last)
    if not is_int(n) or n < 2:  # 10.5 was numpy's TypeError
        raise InputError(f"a geometric schedule needs n >= 2 points (an integer), got {n}")
    lo = max(first, 1)
    # the points between lo and last, rounded in float64: kept below last, which float64 may round
    # up (2**63 - 1 became step -2**63; 2**53 + 1 gained a step 2**53 beside it)
    inner = np.round(np.geomspace(lo, last, n)[1:-1]) if last > lo else np.array([])
    inner = inner[inner < float(last)].astype(np.int64)  # each then below last too
    ends = [first, lo, last] if lo <= last else [first, last]  # (last 0 had a step 1 past it)
    return _finish(np.concatenate([np.array(ends, np.int64), inner]))


def pythia_schedule(last: int, *, every: int = 1000, first: int = 0) -> np.ndarray:
    """Pythia's grid: ``first``, then 1, 2, 4, ... up to ``every``, then every ``every`` steps."""
    _check_range(first, last)
    every = check_count("every", every)  # 2.5 gave steps 2.5, 5.0, ...
    powers = 2 ** np.arange(0, int(np.log2(every)) + 1)
    steps = np.concatenate([[first, last], powers, np.arange(every, last + 1, every)])
    return _finish(steps[(steps >= first) & (steps <= last)])


def explicit_schedule(steps: Iterable[int]) -> np.ndarray:
    """A user-given list of steps (sorted; duplicates and negatives are an error).

    ``steps`` is any 1-D sequence of whole numbers (an array of any integer or float dtype, a
    tensor, a range, a generator); :func:`tokdyn._checks.as_values` refuses what no step is (a
    masked value, 2.5, a step past int64: a uint64 2**64 - 1 was step -1)."""
    if not (isinstance(steps, Sequence) or hasattr(steps, "__array__")):  # a generator, a set, dict keys: its values
        steps = list(steps)
    arr = as_values("schedule steps", steps, "index")
    if arr.ndim != 1:  # a 2-D array was sorted row by row and handed back as a 2-D "schedule"
        raise InputError(f"schedule steps: expected a 1-D sequence of steps, got shape {arr.shape}")
    if arr.size == 0:
        raise InputError("explicit schedule is empty")
    if arr.min() < 0:
        raise InputError(f"schedule steps must be >= 0, got {int(arr.min())}")
    steps = np.unique(arr)  # sorted
    if steps.size != arr.size:
        raise InputError("schedule has duplicate steps")
    # steps a fit's log axis cannot tell apart (2**53 and 2**53 + 1: one float64; 10**15 and
    # 10**15 + 1: one log10): a recorder stopped at the second, or made a run no fit takes
    i = axis_tie(steps)
    if i is not None:
        raise InputError(f"schedule steps {int(steps[i])} and {int(steps[i + 1])} are too close to tell apart on a fit's "
                         f"log axis (log10 = {float(np.log10(float(steps[i])))!r} both, in float64); leave one of them out")  # fmt: skip
    return steps


def make_schedule(kind: str, last: int, *, n: int = 40, every: int = 1000, steps: Iterable[int] | None = None) -> np.ndarray:
    """Dispatch on ``kind``: ``"geometric"``, ``"pythia"`` or ``"explicit"``."""
    if kind == "geometric":
        return geometric_schedule(last, n)
    if kind == "pythia":
        return pythia_schedule(last, every=every)
    if kind == "explicit":
        if steps is None:
            raise InputError("an explicit schedule needs steps")
        return explicit_schedule(steps)
    raise InputError(f"unknown schedule {kind!r}; expected geometric, pythia or explicit")


def _check_range(first: int, last: int) -> None:
    # NaN and inf were int()'s ValueError and OverflowError, 1e30 a schedule of steps -2**63 and
    # 10**15, True step 1, "100" a TypeError deeper down
    for name, v in (("first", first), ("last", last)):
        if not ((is_int(v) or is_whole(v)) and 0 <= v <= INT64_MAX):
            raise InputError(f"schedule bounds must be integers in [0, 2**63), got {name}={shown(v)}")
    if last < first:
        raise InputError(f"schedule needs 0 <= first <= last, got first={first}, last={last}")


def _finish(steps: np.ndarray) -> np.ndarray:
    return np.unique(steps.astype(np.int64))
