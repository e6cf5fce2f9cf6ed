"""Sums and maxima in eight vector lanes (tokdyn.fit.lanes).

The compiled lanes must add exactly what their numpy reference adds, in the same order (the
same bits: the fit's determinism rests on it), those sums must be the mathematical sums to
rounding (against math.fsum of the terms), maxima must be the plain maxima, and nothing past
the n-th point may reach a result.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from numba import njit
from numba.core.errors import TypingError

from tokdyn.fit import varpro
from tokdyn.fit.lanes import (
    LANES,
    clip,
    fma_exact,
    lane_maxima,
    lane_sums,
    reference_row_dots,
    reference_sums,
    reference_terms,
    row_dots,
    rows_dots,
)


def _toy_terms(a, b, s):
    return (a, a * b - s, (a - b) * (a + b) / (1.0 + b * b), clip(a * s, -0.5, 0.25), 2.0)


_toy_sums = lane_sums(_toy_terms, 2, 1)
_toy_max = lane_maxima(_toy_terms, 2, 1)


@njit
def _call_toy(a, b, s, n):
    return _toy_sums(a, b, s, n)


@njit
def _call_toy_max(a, b, s, n, row):
    return _toy_max(a, b, s, n, row)


# name: (terms, sums, columns, outputs, scalars)
_FIT_SUMS = {
    "sigmoid": (varpro._sigmoid_terms, varpro._sigmoid_sums, 2, 0, 3),
    "two": (varpro._two_terms, varpro._two_sums, 2, 6, 4),
    "derivative": (varpro._derivative_terms, varpro._derivative_sums, 7, 0, 5),
    "full_two": (varpro._full_two_terms, varpro._full_two_sums, 2, 0, 7),
}


def _caller(fn, n_args):
    names = ", ".join(f"a{i}" for i in range(n_args))
    space = {"fn": fn}
    exec(f"def call({names}):\n    return fn({names})\n", space)
    return njit(space["call"])


_CALLERS = {name: _caller(f, c + o + k + 1) for name, (_, f, c, o, k) in _FIT_SUMS.items()}


def _bits(values) -> list[bytes]:
    return [np.float64(v).tobytes() for v in values]


@settings(max_examples=80, deadline=None)
@given(name=hs.sampled_from(sorted(_FIT_SUMS)), n=hs.integers(0, 3 * LANES * 2 + 5),
       seed=hs.integers(0, 2**32 - 1))
def test_the_fit_sums_are_their_numpy_reference_to_the_bit(name, n, seed):
    terms, _, n_cols, n_out, n_scalars = _FIT_SUMS[name]
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-1.0, 4.0, n))
    y = rng.normal(0.0, 1.0, n)
    # event times within the axis or beyond it, widths from sharp to wide, amplitudes mixed
    scalars = [float(v) for v in rng.uniform(-2.0, 5.0, n_scalars)]
    if name == "derivative":  # the columns _two_terms writes
        columns = [*varpro._event(x, 1.2, 3.0), *varpro._event(x, 2.5, 0.4), y]
    else:
        scalars[1] = float(math.exp(rng.uniform(-3.0, 4.0)))  # an inverse width
        columns = [x, y]
    assert len(columns) == n_cols
    outputs = [np.full(n + 3, -7.0) for _ in range(n_out)]  # nothing may be written past n
    got = _CALLERS[name](*columns, *[o[:n] for o in outputs], *scalars, n)
    ref = reference_sums(terms, columns, scalars, n, n_outputs=n_out)
    assert _bits(got) == _bits(ref)
    want = reference_terms(terms, columns, scalars, n)[:n_out]
    for o, w in zip(outputs, want):
        assert o[:n].tobytes() == np.asarray(w, dtype=np.float64).tobytes()
        assert np.all(o[n:] == -7.0)


@settings(max_examples=40, deadline=None)
@given(n=hs.integers(0, 70), seed=hs.integers(0, 2**32 - 1))
def test_lane_sums_are_the_sums_to_rounding(n, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 3, n), rng.normal(0, 1, n)
    got = _call_toy(a, b, 0.7, n)
    terms = _toy_terms(a, b, 0.7)
    for g, t in zip(got, terms):
        t = np.broadcast_to(np.asarray(t, dtype=np.float64), (n,))
        exact = math.fsum(t)
        # a sum of n terms in any order is within n eps sum |t| of the exact sum
        assert abs(g - exact) <= 2 * max(n, 1) * np.finfo(float).eps * (np.abs(t).sum() + 1e-300)
    assert got[4] == 2.0 * n  # a constant term counts the points


_toy_sums_1 = lane_sums(_toy_terms, 2, 1, unroll=1)
_toy_sums_4 = lane_sums(_toy_terms, 2, 1, unroll=4)
_toy_sums_8 = lane_sums(_toy_terms, 2, 1, unroll=8)


@njit
def _call_toy_1(a, b, s, n):
    return _toy_sums_1(a, b, s, n)


@njit
def _call_toy_4(a, b, s, n):
    return _toy_sums_4(a, b, s, n)


@njit
def _call_toy_8(a, b, s, n):
    return _toy_sums_8(a, b, s, n)


@settings(max_examples=40, deadline=None)
@given(n=hs.integers(0, 9 * LANES + 7), seed=hs.integers(0, 2**32 - 1))
def test_blocks_per_step_change_the_speed_not_the_bits(n, seed):
    """Sums emitted 1, 2 (the default), 4 or 8 blocks a step (the blocks left in halving
    widths, then the masked last points) are the same bits for every point count."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 3, n), rng.normal(0, 1, n)
    want = _bits(_call_toy(a, b, 0.7, n))
    for call in (_call_toy_1, _call_toy_4, _call_toy_8):
        assert _bits(call(a, b, 0.7, n)) == want


def test_blocks_per_step_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of 2"):
        lane_sums(_toy_terms, 2, 1, unroll=3)


def test_no_point_past_n_reaches_a_sum():
    """The last block's lanes past n read the n-th point again and are masked out: poison
    after n (NaN, inf) changes nothing, and n = 0 gives zeros."""
    rng = np.random.default_rng(3)
    for n in range(0, 3 * LANES + 1):
        a = np.concatenate([rng.normal(size=n), np.full(9, np.nan)])
        b = np.concatenate([rng.normal(size=n), np.full(9, np.inf)])
        clean = _call_toy(a[:n].copy(), b[:n].copy(), 0.3, n)
        poisoned = _call_toy(a, b, 0.3, n)
        assert _bits(clean) == _bits(poisoned)
        assert all(math.isfinite(v) for v in poisoned)
    assert _call_toy(np.zeros(0), np.zeros(0), 1.0, 0) == (0.0,) * 5
    assert _call_toy(np.ones(4), np.ones(4), 1.0, -3) == (0.0,) * 5  # n < 0: nothing


@settings(max_examples=40, deadline=None)
@given(n=hs.integers(0, 40), row=hs.integers(0, 2), seed=hs.integers(0, 2**32 - 1),
       nan_frac=hs.sampled_from([0.0, 0.2, 1.0]))
def test_lane_maxima_are_the_maxima_and_read_the_given_row(n, row, seed, nan_frac):
    rng = np.random.default_rng(seed)
    A = rng.normal(0, 2, (3, max(n, 1)))
    A[rng.random(A.shape) < nan_frac] = np.nan
    b = rng.normal(0, 1, max(n, 1))
    got = _call_toy_max(A, b, 0.7, n, row)
    terms = _toy_terms(A[row, :n], b[:n], 0.7)
    for g, t in zip(got, terms):
        t = np.broadcast_to(np.asarray(t, dtype=np.float64), (n,))
        finite = t[~np.isnan(t)]
        want = finite.max() if finite.size else -math.inf  # NaN terms are passed over
        assert g == want
    ref = reference_sums(_toy_terms, [A[row], b], [0.7], n, kind="max")
    assert _bits(got) == _bits(ref)


def test_columns_must_be_contiguous_float64_vectors():
    with pytest.raises(TypingError, match="C-contiguous"):
        _call_toy(np.arange(10.0)[::2], np.zeros(5), 1.0, 5)
    with pytest.raises(TypingError, match="C-contiguous"):
        _call_toy(np.zeros(5, dtype=np.float32), np.zeros(5), 1.0, 5)
    with pytest.raises(TypingError, match="scalars"):
        _call_toy(np.zeros(5), np.zeros(5), 1, 5)
    with pytest.raises(TypeError, match="tuple"):
        lane_sums(lambda a: a, 1, 0)
    with pytest.raises(TypeError, match="outputs"):
        lane_sums(lambda a: (a, a), 1, 0, n_outputs=2)


def test_a_sum_does_not_depend_on_the_threads_or_the_call_site():
    """The same row summed inside a parallel loop, on any thread, gives the same bits."""

    @njit(parallel=True)
    def many(x, y, reps):
        out = np.empty((reps, 21))
        for r in numba.prange(reps):
            t = varpro._sigmoid_sums(x, y, 1.3, 2.0, 4.0, x.shape[0])
            for j in range(21):
                out[r, j] = t[j]
        return out

    rng = np.random.default_rng(0)
    x, y = np.sort(rng.uniform(0, 3, 37)), rng.normal(size=37)
    out = many(x, y, 64)
    ref = reference_sums(varpro._sigmoid_terms, [x, y], [1.3, 2.0, 4.0], 37)
    assert all(_bits(row) == _bits(ref) for row in out)


# -- fused multiply-adds ----------------------------------------------------------------------


def _exact(*values) -> Fraction:
    return sum((Fraction(v) for v in values), Fraction(0))


_finite = hs.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_subnormal=True)


@settings(max_examples=300, deadline=None)
@given(a=_finite, b=_finite, c=_finite, scale=hs.sampled_from([1.0, 2.0**-300, 2.0**-530]))
def test_fma_exact_is_the_product_plus_the_addend_rounded_once(a, b, c, scale):
    """numpy has no fma: the reference's (Dekker's product and fsum, exact rationals near
    underflow) against Python's exact rationals, rounded by float() (correctly rounded)."""
    a, c = a * scale, c * scale * scale
    want = float(Fraction(a) * Fraction(b) + Fraction(c))
    got = fma_exact(np.array([a]), np.array([b]), np.array([c]))[0]
    assert np.float64(got).tobytes() == np.float64(want).tobytes()


def _fused_terms(a, b, c, d):
    return (a * b + c, d - a * b, a * b - d, a * b + c * d, c * d + a * b, (a * b) / 1.0, a * b)


_fused_sums = lane_sums(_fused_terms, 4, 0, n_outputs=6)


@njit
def _call_fused(a, b, c, d, o1, o2, o3, o4, o5, o6, n):
    return _fused_sums(a, b, c, d, o1, o2, o3, o4, o5, o6, n)


def test_a_product_feeding_an_addition_is_rounded_once():
    """By hand, at point 8: a = 1 + 2^-30, b = 1 - 2^-30, so a b = 1 - 2^-60, which rounds to
    1; c = -1, d = 1. Fused, a b + c = -2^-60, d - a b = 2^-60 and a b - d = -2^-60 (rounded
    separately, all 0); of two products the left one is fused and the right one rounded (a b
    + c d = -2^-60, c d + a b = 0); a product used otherwise is rounded ((a b) / 1 = 1). The
    summed a b: point 0 (a = -1, b = 1) leaves -1 in lane 0, to which point 8's product is
    added in one rounding: -2^-60 (rounded separately: 0)."""
    n = 9
    a, b, c, d = np.zeros(n), np.zeros(n), np.full(n, -1.0), np.ones(n)
    a[0], b[0] = -1.0, 1.0
    a[8], b[8] = 1 + 2.0**-30, 1 - 2.0**-30
    outs = [np.full(n, np.nan) for _ in range(6)]
    sums = _call_fused(a, b, c, d, *outs, n)
    tiny = 2.0**-60
    assert [o[8] for o in outs] == [-tiny, tiny, -tiny, -tiny, 0.0, 1.0]
    assert sums == (-tiny,)
    ref = reference_sums(_fused_terms, [a, b, c, d], [], n, n_outputs=6)
    assert _bits(sums) == _bits(ref)
    for o, w in zip(outs, reference_terms(_fused_terms, [a, b, c, d], [], n)):
        assert o.tobytes() == w.tobytes()
    # maxima are not fused (the pair search compares them with scalar code)
    top = lane_maxima(_fused_terms, 4, 0)
    got = njit(lambda a, b, c, d, n, row: top(a, b, c, d, n, row))(a, b, c, d, n, 0)
    assert got[0] == 0.0  # RN(a b) - 1 at point 8 (fused it would be -2^-60)


# -- column sums over chosen rows (row_dots) --------------------------------------------------


@njit
def _call_row_dots(M, idx, v, n, c, s1, s2):
    row_dots(M, idx, v, n, c, s1, s2)


@njit
def _call_row_dots_only(M, idx, v, n, c):
    row_dots(M, idx, v, n, c, None, None)


@settings(max_examples=120, deadline=None)
@given(q=hs.integers(1, 6 * LANES + 3), rows=hs.integers(1, 12), n=hs.integers(-2, 30),
       seed=hs.integers(0, 2**32 - 1))
def test_row_dots_are_plain_loops_to_the_bit(q, rows, n, seed):
    """Every column count (whole groups of vectors, a shorter group, single columns left) and
    rows read in any order, repeated: the bits of ``for k: c[q] += M[idx[k], q] * v[k]``, summed
    here in Python floats one column at a time; s1, s2 the same for g and g * g."""
    rng = np.random.default_rng(seed)
    M = rng.normal(0, 1, (rows, q)) * 10.0 ** rng.integers(-5, 5, (rows, q))
    m = max(n, 0)
    idx = rng.integers(0, rows, m + 3)
    v = rng.normal(0, 1, m + 3)
    c, s1, s2 = (np.full(q, np.nan) for _ in range(3))
    _call_row_dots(M, idx, v, n, c, s1, s2)
    only = np.full(q, np.nan)
    _call_row_dots_only(M, idx, v, n, only)
    for j in range(q):
        want_c = want_1 = want_2 = 0.0
        for k in range(m):
            g = float(M[idx[k], j])
            want_c += g * float(v[k])
            want_1 += g
            want_2 += g * g
        assert _bits([c[j], only[j], s1[j], s2[j]]) == _bits([want_c, want_c, want_1, want_2])
    ref = reference_row_dots(M, idx, v, n)
    assert _bits(np.concatenate(ref)) == _bits(np.concatenate([c, s1, s2]))


@njit
def _call_rows_dots(M, idx, V, m, n, C):
    rows_dots(M, idx, V, m, n, C)


@settings(max_examples=80, deadline=None)
@given(q=hs.integers(1, 6 * LANES + 3), rows=hs.integers(1, 12), n=hs.integers(-2, 30),
       m=hs.integers(0, 11), seed=hs.integers(0, 2**32 - 1))
def test_rows_dots_are_row_dots_of_each_row_to_the_bit(q, rows, n, m, seed):
    """Every count of rows (passes of four, a shorter pass), columns and points: each of the
    first m rows of C has the bits row_dots gives that row of V alone, and no later row of C
    is written."""
    rng = np.random.default_rng(seed)
    M = rng.normal(0, 1, (rows, q)) * 10.0 ** rng.integers(-5, 5, (rows, q))
    k = max(n, 0)
    idx = rng.integers(0, rows, k + 3)
    V = rng.normal(0, 1, (11, k + 3)) * 10.0 ** rng.integers(-3, 3, (11, k + 3))
    C = np.full((11, q), np.nan)
    _call_rows_dots(M, idx, V, m, n, C)
    for r in range(11):
        if r < m:
            want = np.full(q, np.nan)
            _call_row_dots_only(M, idx, V[r], n, want)
            assert _bits(C[r]) == _bits(want), r
        else:
            assert np.isnan(C[r]).all(), r


@njit
def _call_pair_max(fa, fb, fe, fp, rowpen, cq, c1, n, q):
    return varpro._pair_max(fa, fb, fe, fp, rowpen, cq, c1, c1 * c1, n, q)[0]


@njit
def _call_pair_max4(fa, fb, fe, fp, RP, CQ, q, n):
    x0, x1, x2, x3 = CQ[0, q], CQ[1, q], CQ[2, q], CQ[3, q]
    return varpro._pair_max4(fa, fb, fe, fp, RP[0], CQ[0], RP[1], CQ[1], RP[2], CQ[2], RP[3],
                             CQ[3], x0, x0 * x0, x1, x1 * x1, x2, x2 * x2, x3, x3 * x3, n, q)


@settings(max_examples=60, deadline=None)
@given(Q=hs.integers(1, 3 * LANES + 5), seed=hs.integers(0, 2**32 - 1))
def test_four_rows_pair_maxima_are_each_rows_own(Q, seed):
    """The two-sigmoid start's pair scores of four rows at once (the pair forms read once) are
    each row's own maxima to the bit, whatever the pair and row penalties (-inf) and lengths."""
    rng = np.random.default_rng(seed)
    fa, fb, fe = (rng.normal(0, 1, (Q, Q)) for _ in range(3))
    fp = np.where(rng.random((Q, Q)) < 0.2, -np.inf, 0.0)
    RP = np.where(rng.random((4, Q)) < 0.3, -np.inf, 0.0)
    CQ = rng.normal(0, 3, (4, Q))
    for q in range(Q):
        n = int(rng.integers(0, Q + 1))
        tops = _call_pair_max4(fa, fb, fe, fp, RP, CQ, q, n)
        want = [_call_pair_max(fa, fb, fe, fp, RP[i], CQ[i], CQ[i, q], n, q) for i in range(4)]
        assert _bits(tops) == _bits(want)


def test_row_dots_read_only_the_rows_named_and_write_only_their_outputs():
    """Rows not in idx[:n] (NaN here) and entries of v past n never reach a sum; the outputs
    are exactly their Q entries (a guard after them keeps its value)."""
    M = np.full((4, 11), np.nan)
    M[1] = np.arange(11.0)
    M[3] = 2.0
    idx = np.array([3, 1, 1, 0, 2])
    v = np.array([1.0, 0.5, 2.0, np.nan, np.inf])
    out = np.full(12, -7.0)
    s = np.full(12, -7.0)
    s2 = np.full(12, -7.0)
    _call_row_dots(M, idx, v, 3, out[:11], s[:11], s2[:11])
    np.testing.assert_array_equal(out[:11], 2.0 + 2.5 * np.arange(11.0))
    np.testing.assert_array_equal(s[:11], 2.0 + 2.0 * np.arange(11.0))
    np.testing.assert_array_equal(s2[:11], 4.0 + 2.0 * np.arange(11.0) ** 2)
    assert out[11] == s[11] == s2[11] == -7.0


def test_row_dots_check_their_arguments():
    M, idx, v, c = np.zeros((3, 4)), np.zeros(2, dtype=np.int64), np.zeros(2), np.zeros(4)
    with pytest.raises(TypingError, match="both arrays or both None"):
        _call_row_dots(M, idx, v, 2, c, c, None)
    with pytest.raises(TypingError, match="M must be"):
        _call_row_dots_only(M[:, ::2], idx, v, 2, c)
    with pytest.raises(TypingError, match="idx must be"):
        _call_row_dots_only(M, idx.astype(np.int32), v, 2, c)
    with pytest.raises(TypingError, match="c must be"):
        _call_row_dots_only(M, idx, v, 2, c.astype(np.float32))
