"""Type checks of settings given as numbers, shared by the stages that take them: ``True`` is no
count, ``"3"`` no prior, and an int past 1e308 no float; arrays from a researcher's own code as
the stages compute on them (:func:`as_values`); and what a fit's log axis can tell apart
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


# What as_values makes of an array, by kind: the dtype, the dtype kinds it takes, and what it says it expected
VALUE_KINDS = {
    "real": (np.float64, "iuf", "real numbers"),
    "index": (np.int64, "iuf", "integers"),  # a whole float too (an npz may hold indices as floats)
    "code": (np.int64, "iu", "an integer array"),  # integers only
    "flag": (np.bool_, "b", "bools"),  # not 0/1 numbers: [0, 2] may be meant as indices
}


def host_values(value):
    """A torch tensor as a CPU tensor numpy converts (its values: detached from its graph, off
    its device, bfloat16 as float32, which holds each value exactly); anything else as it is.
    ``np.asarray`` refused a tensor with grad (RuntimeError) and bfloat16 (TypeError)."""
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
    return value


def as_array(name: str, value, kinds: str | None, expected: str, *, lead: str | None = None) -> np.ndarray:
    """``np.asarray(value)`` of dtype kind in ``kinds`` (None: any; a view where numpy makes one), or one
    :class:`InputError` naming ``name`` and saying ``expected``: a CPU torch tensor (with grad,
    in bfloat16) is its values; a masked array with masked values is refused (:func:`as_values`).
    ``lead``: what the error says before ``, got ...`` (default ``"{name}: expected {expected}"``)."""
    lead = lead or f"{name}: expected {expected}"
    value = host_values(value)
    if isinstance(value, np.ma.MaskedArray) and np.ma.getmaskarray(value).any():
        raise InputError(f"{lead}, got a masked array with {int(np.ma.getmaskarray(value).sum())} "
                         "masked value(s), whose values numpy would take as data: give each as what it is (NaN where "
                         "a value is missing) or leave it out")  # fmt: skip
    try:
        a = np.asarray(value)
    except Exception as err:  # ragged, an object whose conversion fails
        raise InputError(f"{lead}, got a {type(value).__name__} that numpy cannot convert "
                         f"({f'{type(err).__name__}: {err}'.splitlines()[0][:200]})") from None  # fmt: skip
    if kinds is not None and a.dtype.kind not in kinds:
        raise InputError(f"{lead}, got dtype {a.dtype}")
    return a


def as_values(name: str, value, kind: str = "real", *, lead: str | None = None) -> np.ndarray:
    """``value`` as a new native-endian, C-contiguous array of ``kind`` (:data:`VALUE_KINDS`), or
    one :class:`InputError` naming ``name`` (or saying ``lead``, as :func:`as_array`): the caller's
    array is never the one computed on or written.

    Arrays from a researcher's own code come as lists, big-endian, strided or read-only numpy
    arrays, numpy subclasses and torch tensors (a CPU tensor with grad or in bfloat16 is taken
    as its values). What ``np.asarray(value, dtype)`` took without a word is refused: a masked
    array with masked values (it took the values under the mask); as indices, a float that is
    no whole number, or a value past int64 (2.9 was index 2, NaN was -2**63); as flags, numbers
    (0.2 was True, and [0, 2] may be meant as indices); and anywhere a bool as a number, a
    complex number (its imaginary part dropped) or text ("1" was 1.0)."""
    dtype, kinds, expected = VALUE_KINDS[kind]
    lead = lead or f"{name}: expected {expected}"
    a = as_array(name, value, kinds, expected, lead=lead)
    if kind in ("index", "code") and a.size:
        whole = np.isfinite(a) & (a == np.round(a)) if a.dtype.kind == "f" else None
        if whole is not None and not whole.all():
            raise InputError(f"{lead}, got {int((~whole).sum())} value(s) that are no whole "
                             f"number, such as {shown(a[~whole][0].item())}")  # fmt: skip
        with np.errstate(over="ignore"):  # 2**63 as a float16 is inf: still above every float16
            past = a.max() > INT64_MAX if a.dtype.kind == "u" else a.dtype.kind == "f" and abs(a).max() >= 2.0**63
        if past:
            raise InputError(f"{lead}, got a value past int64 ({shown(a.max().item())})")
    with np.errstate(over="ignore"):  # a float past float64 (a longdouble) becomes inf: the caller's finiteness check
        return np.array(a, dtype=dtype, order="C", copy=True)


INT64_MAX = np.iinfo(np.int64).max


def as_curve(x, loss, *, names: tuple[str, str] = ("x", "loss")) -> tuple[np.ndarray, np.ndarray]:
    """Two curves over the same points (an axis ``x`` and a loss over it; a prediction and a
    measurement) as two new 1-D float64 arrays of one length (:func:`as_values`: a masked value
    is refused, a missing one is NaN), or one :class:`InputError` naming them by ``names``: every
    public entry that takes a curve says the same line of the same bad input."""
    a, b = names
    x, loss = as_values(a, x), as_values(b, loss)
    if x.ndim != 1 or x.shape != loss.shape:
        raise InputError(f"{a} and {b}: expected two curves of one length (1-D arrays), got shapes {x.shape} and {loss.shape}")
    return x, loss


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


def axis_tie(values) -> int | None:
    """The first ``i`` where the increasing numbers ``values[i]`` and ``values[i + 1]`` (steps,
    tokens seen) give one float64 axis value (past 2**53: 2**53 and 2**53 + 1), else the first
    :func:`log_tie` of those axis values, else None: a pair a fit's log axis cannot tell apart."""
    a = np.asarray(values, dtype=np.float64)
    same = np.flatnonzero(np.diff(a) == 0)
    return int(same[0]) if same.size else log_tie(a)


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
