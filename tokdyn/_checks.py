"""Type checks of settings given as numbers, shared by the stages that take them: ``True`` is no
count, ``"3"`` no prior, and an int past 1e308 no float; and what a fit's log axis can tell apart
(:func:`log_tie`), shared by the fit and the stages that take axis values for it. Imports nothing
of tokdyn but its errors."""

from __future__ import annotations

import math

import numpy as np

from .errors import InputError


def is_int(v) -> bool:
    """An int or a numpy integer, not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_real(v) -> bool:
    """A real number a float holds: an int, a float or a numpy number, not a bool, a string, or
    an int past 1e308."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return False
    try:
        float(v)
    except OverflowError:
        return False
    return True


def is_finite(v) -> bool:
    """A finite real number (:func:`is_real`, not NaN or infinite)."""
    return is_real(v) and math.isfinite(float(v))


def is_whole(v) -> bool:
    """A whole number: an int, a numpy integer, or a float such as 100.0 (not a bool, not 10.7)."""
    return is_finite(v) and float(v).is_integer()


def check_count(name: str, v, minimum: int = 1) -> int:
    """``v`` as an int >= ``minimum``, or one :class:`InputError` naming ``name``: a float is
    never cut to an int (``context=2.5`` made windows of 2 tokens without a word), and a bool or a
    string ("8") is no count."""
    if not is_int(v) or v < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {v.item() if isinstance(v, np.generic) else v!r}")
    return int(v)


def log_tie(values) -> int | None:
    """The first ``i`` where the axis values ``values[i]`` and ``values[i + 1]`` (strictly
    increasing) are both positive and give one log10 in float64, else None.

    A fit's axis is x = log10 of the positive axis values, so two such values are one point to
    it (1e15 and 1e15 + 1: log10 15.0 both), and it refuses them (:func:`tokdyn.fit.log_axis`);
    a stage that takes axis values for a fit (``import-npz``) refuses them by the same test, so
    a run no fit can use is never made."""
    a = np.asarray(values, dtype=np.float64)
    pos = np.flatnonzero(a > 0)  # a suffix of increasing values: each next to the next
    if pos.size < 2:
        return None
    same = np.flatnonzero(~(np.diff(np.log10(a[pos])) > 0))
    return int(pos[same[0]]) if same.size else None
