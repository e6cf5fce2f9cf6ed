"""Options and call arguments of the fit: whatever a caller passes, either a fit or one InputError.

Every FitOptions field, ``block_rows``, ``device`` and the arrays x, Y are given arbitrary
values (ints of any size, floats with nan and inf, numpy scalars, bools, strings, None, other
objects): the call either works or raises :class:`InputError`, never another exception (the
CLI reports those as an internal error). Options that construct fit a small planted block on
every CPU backend.
"""

from __future__ import annotations

import dataclasses
import json
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokdyn.errors import InputError
from tokdyn.fit import (
    CLASS_CODES,
    FIT_FIELDS,
    STATUS_CODES,
    FitOptions,
    available_backends,
    fit_block,
    fit_sigmoids,
)
from tokdyn.fit.backends import resolve_backend
from tokdyn.fit.block import validate_inputs
from tokdyn.fit.options import INT64_MAX, MAX_ITER_LIMIT
from tokdyn.fit.sigmoid import X_SPACING_MIN, log_axis

CPU_BACKENDS = [b for b in ("numpy", "numba") if b in available_backends()]
OPTION_NAMES = [f.name for f in dataclasses.fields(FitOptions)]
INT_OPTIONS = {"max_iter", "min_points", "min_points_two", "edge_points", "vocab_size"}
FLOAT_OPTIONS = set(OPTION_NAMES) - INT_OPTIONS - {"two_step"}

X = np.linspace(1.0, 4.0, 20)

# the options' tests pass numpy scalars, whose refusals quote them back as written (conftest)
pytestmark = pytest.mark.echoes_numpy


def _planted() -> np.ndarray:
    """A small block of every kind: one event, two events, flat, noise, one event with
    missing points."""
    rng = np.random.default_rng(7)
    Y = np.empty((5, 20))
    Y[0] = 1 + 4 / (1 + np.exp((X - 2.5) / 0.2))
    Y[1] = 2 + 3 / (1 + np.exp((X - 1.8) / 0.1)) + 2 / (1 + np.exp((X - 3.4) / 0.1))
    Y[2] = 3.0
    Y[3] = 3.0 + 0.3 * rng.standard_normal(20)
    Y[4] = 1 + 4 / (1 + np.exp((X - 2.0) / 0.3))
    Y[[0, 1, 3, 4]] += 0.02 * rng.standard_normal((4, 20))
    Y[4, ::3] = np.nan
    return Y


Y_PLANTED = _planted()


# ---------------------------------------------------------------------------------------------
# Arbitrary values

_objects = st.sampled_from([
    "", "1", "nan", "1e-8", b"3", [], [3], (3,), {}, {"a": 1}, object(), 1j, np.complex128(2.0),
    Fraction(1, 3), Fraction(10**400, 3), Decimal("0.5"), np.array(3), np.array([1.0, 2.0]),
    np.datetime64("2020-01-01"), float, max,
])
_numpy_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 2**64 - 1).map(np.uint64),
    st.integers(-(2**31), 2**31 - 1).map(np.int32),
    st.integers(0, 255).map(np.uint8),
    st.floats(width=32, allow_nan=True, allow_infinity=True).map(np.float32),
    st.floats(allow_nan=True, allow_infinity=True).map(np.float64),
    st.floats(width=16).map(np.float16),
    st.floats(allow_nan=False, allow_infinity=True).map(np.longdouble),
    st.booleans().map(np.bool_),
)
ANY_VALUE = st.one_of(
    st.integers(),  # small and large, negative too
    st.integers(-(2**70), 2**70),
    st.integers(min_value=2**62, max_value=2**65),  # around int64's end
    st.sampled_from([10**30, 10**400, -(10**400), 2**63 - 1, 2**63, MAX_ITER_LIMIT,
                     MAX_ITER_LIMIT + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0.0, 1.0),
    st.sampled_from([5e-324, 1e-308, 1.7976931348623157e308, -0.0, 1e-300, 1e300]),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    _numpy_scalars,
    _objects,
)


def _id(value) -> str | None:
    """A test id for ints too long to print (pytest's default would fail)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"int_of_{value.bit_length()}_bits"
    return None


def _check_fit(out: dict) -> None:
    """Every field of every row written, codes known, converged fits finite."""
    assert set(out) == set(FIT_FIELDS)
    assert np.all(np.isin(out["status"], list(STATUS_CODES.values())))
    assert np.all(np.isin(out["status2"], list(STATUS_CODES.values())))
    assert np.all(np.isin(out["class_code"], list(CLASS_CODES.values())))
    assert np.all(out["n_iter"] >= 0) and np.all(out["n_iter2"] >= 0)
    ok = out["status"] == STATUS_CODES["converged"]
    for name in ("l0", "linf", "mu", "s", "sse", "rms", "bic_sigmoid"):
        assert np.all(np.isfinite(out[name][ok])), name
    assert np.all(out["s"][ok] > 0)


def _check_stored(opts: FitOptions, name: str, value) -> None:
    """The option is stored as a plain Python value equal to what was given, and the options
    travel as JSON (as they do with a stored fit)."""
    got = getattr(opts, name)
    if value is None:
        assert got is None
    elif name == "two_step":
        assert type(got) is bool and got == bool(value)
    elif name in INT_OPTIONS:
        assert type(got) is int and got == int(value)
    else:
        assert type(got) is float and got == float(value) and math.isfinite(got)
    values = dataclasses.asdict(opts)
    assert json.loads(json.dumps(values)) == values
    assert FitOptions(**json.loads(json.dumps(values))) == opts


def _fits_everywhere(opts: FitOptions) -> None:
    """The planted block fits on numba, and on the batched numpy solver unless max_iter is
    large (a row that never converges costs it ~100 us an iteration: up to seconds at
    MAX_ITER_LIMIT, which numba does in milliseconds)."""
    for backend in CPU_BACKENDS:
        if backend == "numpy" and opts.max_iter > 1000 and len(CPU_BACKENDS) > 1:
            continue
        _check_fit(fit_block(X, Y_PLANTED, options=opts, backend=backend))


@pytest.mark.parametrize("name", OPTION_NAMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=ANY_VALUE)
def test_property_any_option_value_fits_or_is_one_input_error(name, value):
    """FitOptions(name=value) constructs or raises InputError naming the option; what
    constructs stores a plain value and fits a planted block on every CPU backend; the same
    value passed to fit_sigmoids is the same error."""
    try:
        opts = FitOptions(**{name: value})
    except InputError as err:
        assert f"FitOptions.{name}: expected" in str(err)
        with pytest.raises(InputError, match=f"FitOptions.{name}"):
            fit_sigmoids(X, Y_PLANTED, backend="numpy", **{name: value})
        return
    _check_stored(opts, name, value)
    _fits_everywhere(opts)


# Each option over its whole valid domain, extremes included: every combination constructs
# and fits.
_positive = st.one_of(st.floats(min_value=5e-324, max_value=1.7976931348623157e308),
                      st.sampled_from([5e-324, 1e-300, 1e300, 1.7976931348623157e308]))
_open_unit = st.one_of(st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
                       st.sampled_from([5e-324, 1e-300, 0.9999999999999999]))
_non_negative = st.one_of(st.floats(min_value=0.0, max_value=1.7976931348623157e308),
                          st.sampled_from([0.0, 5e-324, 1.7976931348623157e308]))
_finite = st.floats(allow_nan=False, allow_infinity=False)
VALID = {
    "max_iter": st.integers(1, 300) | st.sampled_from([MAX_ITER_LIMIT]),
    "ftol": _open_unit,
    "ftol_two": _open_unit,
    "xtol": _open_unit,
    "min_points": st.integers(5, 40) | st.sampled_from([INT64_MAX]),
    "min_points_two": st.integers(8, 40) | st.sampled_from([INT64_MAX]),
    "max_loss": _positive,
    "s_min": st.none() | _positive,
    "s_max_frac": _positive,
    "mu_margin": _non_negative,
    "two_step": st.booleans() | st.booleans().map(np.bool_),
    "bic_margin": _non_negative,
    "delta_min": _non_negative,
    "known_loss": _finite,
    "noise_rms": _non_negative,
    "r2_min": st.floats(max_value=1.0, allow_infinity=False),
    "edge_points": st.integers(1, 40) | st.sampled_from([INT64_MAX]),
    "vocab_size": st.none() | st.integers(2, 10**6) | st.sampled_from([INT64_MAX]),
}
assert set(VALID) == set(OPTION_NAMES)


def _as_numpy(value):
    """The same value as a numpy scalar (where it has one)."""
    if isinstance(value, (bool, np.bool_)):
        return np.bool_(value)
    if value is None:
        return value
    if isinstance(value, int):
        return np.int64(value)
    return np.float64(value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.fixed_dictionaries(VALID), numpy=st.booleans())
def test_property_valid_options_in_any_combination_fit(values, numpy):
    if numpy:
        values = {k: _as_numpy(v) for k, v in values.items()}
    opts = FitOptions(**values)
    for name, value in values.items():
        _check_stored(opts, name, value)
    _fits_everywhere(opts)


@pytest.mark.parametrize("name", sorted(INT_OPTIONS))
def test_numpy_integers_are_ints(name):
    value = {"vocab_size": 50304, "min_points": 7, "min_points_two": 15}.get(name, 50)
    for np_type in (np.int64, np.int32, np.uint64, np.uint32):
        opts = FitOptions(**{name: np_type(value)})
        assert type(getattr(opts, name)) is int and getattr(opts, name) == value
    fit = fit_sigmoids(X, Y_PLANTED, backend=CPU_BACKENDS[-1], **{name: np.int64(value)})
    assert type(getattr(fit.options, name)) is int


@pytest.mark.parametrize("name, value", [
    ("max_iter", 10**30), ("max_iter", 2**63), ("max_iter", MAX_ITER_LIMIT + 1),
    ("edge_points", 2**63), ("min_points", 2**63), ("vocab_size", 2**63),
    ("vocab_size", 10**400), ("max_loss", 10**400), ("s_min", 10**400), ("ftol", 10**400),
    ("known_loss", 10**400), ("known_loss", -(10**400)), ("max_iter", 10**5000),
    ("max_iter", True), ("vocab_size", True), ("edge_points", np.bool_(True)),
    ("ftol", True), ("known_loss", False), ("max_loss", np.bool_(True)),
    ("two_step", 1), ("two_step", "yes"), ("max_iter", 100.0), ("max_iter", "100"),
    ("ftol", "1e-8"), ("ftol", np.float64("nan")), ("s_min", np.float32("inf")),
    ("ftol", 1j), ("max_loss", Decimal("1e4")), ("r2_min", [0.5]),
], ids=_id)
def test_bad_option_is_one_input_error(name, value):
    with pytest.raises(InputError, match=f"FitOptions.{name}: expected"):
        FitOptions(**{name: value})
    with pytest.raises(InputError, match=f"FitOptions.{name}: expected"):
        fit_sigmoids(X, Y_PLANTED, backend=CPU_BACKENDS[-1], **{name: value})


def test_bound_values_are_accepted():
    opts = FitOptions(max_iter=MAX_ITER_LIMIT, edge_points=INT64_MAX, vocab_size=INT64_MAX,
                      min_points=np.int64(INT64_MAX), max_loss=10**300, known_loss=-(10**300))
    assert opts.max_loss == 1e300 and type(opts.max_loss) is float
    _fits_everywhere(opts)


# ---------------------------------------------------------------------------------------------
# block_rows, backend, device

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=ANY_VALUE)
def test_property_block_rows(value):
    try:
        fit = fit_sigmoids(X, Y_PLANTED, backend=CPU_BACKENDS[-1], block_rows=value)
    except InputError as err:
        assert "block_rows: expected" in str(err)
        assert value is not None
        return
    assert len(fit) == len(Y_PLANTED)


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 0, -1, 2**63, 10**5000, 2.0,
                                   "2", np.float64(2.0)], ids=_id)
def test_bad_block_rows(value):
    with pytest.raises(InputError, match="block_rows: expected"):
        fit_sigmoids(X, Y_PLANTED, backend=CPU_BACKENDS[-1], block_rows=value)


def test_numpy_block_rows():
    want = fit_sigmoids(X, Y_PLANTED, backend="numpy", block_rows=2)
    got = fit_sigmoids(X, Y_PLANTED, backend="numpy", block_rows=np.int64(2))
    np.testing.assert_array_equal(got.mu, want.mu)


@pytest.mark.parametrize("device", ["meta", "bogus", "cuda:x", "cpu:-1", 1.5, True, [1],
                                    "mps", "xpu"])
def test_device_that_cannot_fit_is_one_input_error(device):
    pytest.importorskip("torch")
    with pytest.raises(InputError, match="device"):
        resolve_backend("torch", device)
    with pytest.raises(InputError, match="device"):
        fit_sigmoids(X, Y_PLANTED, backend="torch", device=device)


@pytest.mark.parametrize("backend", ["numpy", "torch", "auto"])
def test_device_of_any_size_is_one_input_error(backend):
    pytest.importorskip("torch")
    for device in (10**5000, -(10**400), 2**63):
        with pytest.raises(InputError, match="device"):
            resolve_backend(backend, device)


def test_meta_torch_device_is_one_input_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(InputError, match="'meta'"):
        fit_sigmoids(X, Y_PLANTED, device=torch.device("meta"))


@settings(max_examples=60, deadline=None)
@given(device=st.one_of(st.text(max_size=8), st.integers(), st.none(), ANY_VALUE),
       backend=st.sampled_from(["auto", "torch", "numpy", "numba", "jax", None, 3]))
def test_property_backend_and_device(backend, device):
    pytest.importorskip("torch")
    try:
        got_backend, got_device = resolve_backend(backend, device)
    except InputError:
        return
    assert got_backend in available_backends()


# ---------------------------------------------------------------------------------------------
# x and Y

class _Unconvertible:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("no array here")


@pytest.mark.parametrize("x, Y, match", [
    (X, [[1.0, 2.0], [1.0]], "Y: expected a 2-D array"),
    (X, [list(range(20)), list(range(19))], "Y: expected a 2-D array"),
    ([[1.0, 2.0], [3.0]], np.ones((2, 2)), "x: expected a 1-D array"),
    (X, _Unconvertible(), "Y: expected"),
    (_Unconvertible(), np.ones((1, 20)), "x: expected"),
    (X, [[10**400] * 20], "Y: expected real numbers"),
    ([10**400] * 20, np.ones((1, 20)), "x: expected real numbers"),
    (X, None, "Y: expected a 2-D"),
    (None, np.ones((1, 20)), "x: expected a 1-D"),
    (np.arange(30) * 5e-324, np.ones((2, 30)), "below what the fit can resolve"),
    (np.arange(30) * 1e-200 + 1e-300, np.ones((2, 30)), "below what the fit can resolve"),
    (np.r_[0.0, 1e-160, np.arange(2, 30.0)], np.ones((2, 30)), "closer than 1e-150"),
])
def test_bad_arrays_are_one_input_error(x, Y, match):
    with pytest.raises(InputError, match=match):
        validate_inputs(x, Y)
    for backend in CPU_BACKENDS:
        with pytest.raises(InputError, match=match):
            fit_sigmoids(x, Y, backend=backend)


def test_tiny_but_resolvable_spacing_fits():
    x = np.arange(20) * X_SPACING_MIN * 10
    for backend in CPU_BACKENDS:
        _check_fit(fit_block(x, Y_PLANTED, backend=backend))


def test_longdouble_beyond_float64_is_judged_not_raised():
    x = np.linspace(1.0, 4.0, 20).astype(np.longdouble)
    Y = np.ones((2, 20), dtype=np.longdouble)
    if np.finfo(np.longdouble).max > np.finfo(np.float64).max:
        Y[0, 3] = np.longdouble(10) ** 400  # inf in float64: that trajectory is invalid
    fit = fit_sigmoids(x, Y, backend=CPU_BACKENDS[-1])
    assert len(fit) == 2


_nested = st.recursive(
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.none(),
              st.text(max_size=2), st.booleans()),
    lambda children: st.lists(children, max_size=4), max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(x=_nested, Y=_nested)
def test_property_arbitrary_arrays(x, Y):
    try:
        x_arr, Y_arr = validate_inputs(x, Y)
    except InputError:
        return
    assert x_arr.dtype == np.float64 and Y_arr.dtype == np.float64
    assert Y_arr.ndim == 2 and Y_arr.shape[1] == x_arr.size


def test_no_points_on_numpy_is_too_few_points_as_on_numba():
    for backend in CPU_BACKENDS:
        fit = fit_sigmoids(np.zeros(0), np.zeros((3, 0)), backend=backend)
        assert list(fit.status_name) == ["too_few_points"] * 3


def test_axis_values_too_close_for_log10():
    a = np.array([1.0, 10.0, 1e15, 1e15 + 1, 1e16])
    with pytest.raises(InputError, match="too close to tell apart on a log scale"):
        log_axis(a)


@pytest.mark.parametrize("values", [[1, 10**400], [[1.0, 2.0], [3.0]], ["a", "b"], None])
def test_axis_values_that_are_no_numbers(values):
    with pytest.raises(InputError, match="axis values"):
        log_axis(values)
