"""Type checks of settings given as numbers, shared by the stages that take them: ``True`` is no
count, ``"3"`` no prior, and an int past 1e308 no float. Imports nothing of tokdyn."""

from __future__ import annotations

import math

import numpy as np


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
