"""Type checks of settings given as numbers, shared by the stages that take them: ``True`` is no
count, ``"3"`` no prior, and an int past 1e308 no float; and what a fit's log axis can tell apart
(:func:`log_tie`), shared by the fit and the stages that take axis values for it. Imports nothing
of tokdyn but its errors (and, to write a value in one, ``_text.shown``)."""

from __future__ import annotations

import math

import numpy as np

from ._text import shown  # a value short and never failing: an int of 4300+ digits has no repr
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
    string ("8") is no count. A whole float (``8.0``, as a config file or a computation may give
    it) is that int, as it was taken before these checks."""
    if not (is_int(v) or is_whole(v)) or v < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {shown(v.item() if isinstance(v, np.generic) else v)}")
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


# numba's threading layers by name (NUMBA_THREADING_LAYER): a specific one, or a kind it picks from
NUMBA_LAYERS = ("default", "safe", "forksafe", "threadsafe", "tbb", "omp", "workqueue")


def numba_setting(environ=None, *, compiled: bool = True) -> str | None:
    """Why numba cannot take a setting of ``environ`` (default ``os.environ``) as tokdyn runs it,
    in one line naming the variable, or None.

    numba reads them as it is imported: ``NUMBA_NUM_THREADS=0`` raised a ValueError there (a
    traceback before any ``tokdyn`` command ran); ``NUMBA_NUM_THREADS=abc`` printed a warning
    with numba's traceback and took the default; ``NUMBA_DISABLE_JIT=1`` (which leaves tokdyn's
    compiled kernels uncompilable) and a threading layer numba does not know were "internal
    error ... (a bug: please report it)" in the fit.

    ``compiled=False`` asks only what numba's import needs (the thread count), for commands that
    import numba but need none of tokdyn's compiled kernels (``tokdyn info`` under
    ``NUMBA_DISABLE_JIT=1``, a debugging setting, reads as before)."""
    import os

    env = os.environ if environ is None else environ
    v = env.get("NUMBA_NUM_THREADS")
    if v is not None and (_int_text(v) or 0) < 1:
        return f"NUMBA_NUM_THREADS={v!r} is no number of threads for numba (an integer >= 1); set one, or unset it"
    if not compiled:
        return None
    v = env.get("NUMBA_DISABLE_JIT")
    if v is not None and _int_text(v) != 0:
        return (f"NUMBA_DISABLE_JIT={v!r}: tokdyn's kernels need numba's compiler (NUMBA_DISABLE_JIT=1 turns it off; "
                "numba takes 0 or 1); unset it, or fit with --backend numpy")
    v = env.get("NUMBA_THREADING_LAYER")
    if v is not None and v.lower() not in NUMBA_LAYERS:
        return (f"NUMBA_THREADING_LAYER={v!r} is none of numba's threading layers ({', '.join(NUMBA_LAYERS)}); unset it, "
                "or fit with --backend numpy")
    return None


def _int_text(v: str) -> int | None:
    """The int that numba's ``int(value)`` reads from an environment value, or None."""
    try:
        return int(v)
    except ValueError:
        return None
