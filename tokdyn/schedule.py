"""Recording schedules: at which optimizer steps the probe is evaluated.

Learning times span decades, so schedules are (mostly) even in ``log step``. Every schedule is
a sorted array of distinct integer steps that always contains its first and last step. Step 0
(before any update) is kept in the store and left out of fits, since it has no logarithm.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ._checks import check_count, is_int
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
    steps = np.round(np.geomspace(lo, last, n)).astype(np.int64) if last > lo else np.array([lo])
    return _finish(np.concatenate([[first, last], steps]))


def pythia_schedule(last: int, *, every: int = 1000, first: int = 0) -> np.ndarray:
    """Pythia's grid: ``first``, then 1, 2, 4, ... up to ``every``, then every ``every`` steps."""
    _check_range(first, last)
    every = check_count("every", every)  # 2.5 gave steps 2.5, 5.0, ...
    powers = 2 ** np.arange(0, int(np.log2(every)) + 1)
    steps = np.concatenate([[first, last], powers, np.arange(every, last + 1, every)])
    return _finish(steps[(steps >= first) & (steps <= last)])


def explicit_schedule(steps: Iterable[int]) -> np.ndarray:
    """A user-given list of steps (sorted; duplicates and negatives are an error)."""
    arr = np.asarray(list(steps))
    if arr.size == 0:
        raise InputError("explicit schedule is empty")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise InputError("schedule steps must be integers")
        arr = arr.astype(np.int64)
    if arr.min() < 0:
        raise InputError(f"schedule steps must be >= 0, got {int(arr.min())}")
    if np.unique(arr).size != arr.size:
        raise InputError("schedule has duplicate steps")
    return np.sort(arr.astype(np.int64))


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
    if int(first) != first or int(last) != last:
        raise InputError("schedule bounds must be integers")
    if first < 0 or last < first:
        raise InputError(f"schedule needs 0 <= first <= last, got first={first}, last={last}")


def _finish(steps: np.ndarray) -> np.ndarray:
    return np.unique(steps.astype(np.int64))
