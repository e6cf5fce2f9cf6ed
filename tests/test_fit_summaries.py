"""The per-row summaries a fit starts from are each row's own, however they are batched.

Three pieces compute them for a whole block at once: the preparation (counts, constant and
line fits, start values; numba against the numpy reference), the gather of a row's observed
points that every compiled stage begins with (its mean and sum of squares in vector lanes),
and the start grids with their trust regions (computed once per pattern of observed points).
Each is checked here against an independent answer for a row on its own (hypothesis), on
blocks whose rows share patterns of missing points, miss all or all but one, or hold the
values the preparation must call invalid.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokdyn.fit import FitOptions
from tokdyn.fit.grid import GRID_MU, GRID_S, _axes, row_grids, start_grids, step_caps
from tokdyn.fit.prepare import prepare

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from tokdyn.fit import varpro  # noqa: E402
from tokdyn.fit.backends import prepare_rows  # noqa: E402
from tokdyn.fit.lanes import reference_sums, reference_terms  # noqa: E402


@st.composite
def blocks(draw, *, hostile: bool = False):
    """(x [K], Y [B, K]): rows drawn from a few patterns of missing points (so that some
    share one), plus rows with no point, one point, or every point; with ``hostile``, some
    rows also hold an inf, a negative or a huge loss."""
    seed = draw(st.integers(0, 2**32 - 1))
    K = draw(st.integers(1, 40))
    B = draw(st.integers(1, 24))
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-1.0, 6.0, K)) + np.arange(K) * 1e-3  # strictly increasing
    Y = rng.uniform(0.0, 8.0, (B, K))
    patterns = rng.random((draw(st.integers(1, 4)), K)) < rng.uniform(0.0, 0.6)
    kind = rng.integers(0, 5, B)
    for i in range(B):
        if kind[i] <= 1:  # a shared pattern of missing points
            Y[i, patterns[rng.integers(len(patterns))]] = np.nan
        elif kind[i] == 2:  # nothing observed, or a single point
            Y[i] = np.nan
            if rng.random() < 0.5:
                Y[i, rng.integers(K)] = 1.5
        elif kind[i] == 3:  # a constant row
            Y[i] = 2.0
    if hostile:
        for i in np.flatnonzero(rng.random(B) < 0.3):
            Y[i, rng.integers(K)] = rng.choice([np.inf, -np.inf, -1.0, 1e9])
    return x, Y


def _grid_alone(x, y, s_min):
    """A row's grid from its own observed points (docs: row_grids): NaN below 2 points."""
    xs = x[~np.isnan(y)]
    if xs.size < 2:
        return np.full(GRID_MU, np.nan), np.full(GRID_S, np.nan)
    spacing = np.median(np.diff(xs))
    mus, ss = _axes(xs[:1], xs[-1:], np.array([spacing]), s_min, GRID_MU, GRID_S)
    return mus[0], ss[0]


@settings(max_examples=150, deadline=None)
@given(case=blocks())
def test_start_grids_are_each_rows_own_grid_and_trust_region(case):
    x, Y = case
    s_min = 0.01
    n = (~np.isnan(Y)).sum(1)
    for observed in (None, n):
        mus, ss, caps = start_grids(x, Y, s_min, observed=observed)
        for i in range(len(Y)):
            mu_i, s_i = _grid_alone(x, Y[i], s_min)
            assert mus[i].tobytes() == mu_i.tobytes()
            assert ss[i].tobytes() == s_i.tobytes()
            assert caps[i].tobytes() == step_caps(mu_i[None], s_i[None])[0].tobytes()
    assert [a.tobytes() for a in row_grids(x, Y, s_min)] == [mus.tobytes(), ss.tobytes()]


@njit
def _gathered(x, Y, b):
    K = x.shape[0]
    xo, yc, idx = np.full(K, -7.0), np.full(K, -7.0), np.full(K, -7, dtype=np.int64)
    n, mean, syy = varpro._gather(x, Y, b, xo, yc, idx)
    return n, mean, syy, xo, yc, idx


@settings(max_examples=150, deadline=None)
@given(case=blocks())
def test_a_gathered_row_is_its_observed_points_centred_by_the_lane_sums(case):
    x, Y = case
    for b in range(len(Y)):
        n, mean, syy, xo, yc, idx = _gathered(x, Y, b)
        obs = np.flatnonzero(~np.isnan(Y[b]))
        assert n == obs.size
        assert idx[:n].tolist() == obs.tolist() and xo[:n].tobytes() == x[obs].tobytes()
        assert np.all(xo[n:] == -7.0) and np.all(yc[n:] == -7.0)  # nothing past the points
        y = Y[b, obs]
        (total,) = reference_sums(varpro._value_terms, [y], [], n)
        want_mean = total / max(n, 1)
        assert np.float64(mean).tobytes() == np.float64(want_mean).tobytes()
        (want_syy,) = reference_sums(varpro._centre_terms, [y], [want_mean], n, n_outputs=1)
        assert np.float64(syy).tobytes() == np.float64(want_syy).tobytes()
        want_yc = reference_terms(varpro._centre_terms, [y], [want_mean], n)[0]
        assert yc[:n].tobytes() == np.asarray(want_yc, dtype=np.float64)[:n].tobytes()
        if n:  # the sums are the sums, to rounding
            assert math.isclose(mean, math.fsum(y) / n, rel_tol=1e-13, abs_tol=1e-13)
            assert math.isclose(syy, math.fsum((y - math.fsum(y) / n) ** 2),
                                rel_tol=1e-10, abs_tol=1e-10)


@settings(max_examples=60, deadline=None)
@given(case=blocks(), extra=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_a_row_gathers_the_same_bits_from_a_block_with_columns_it_never_observed(case, extra,
                                                                              seed):
    x, Y = case
    rng = np.random.default_rng(seed)
    # the same rows on an axis with more points (between two of theirs, and after the last),
    # which no row observed
    mids = 0.5 * (x[:-1] + x[1:])
    new = np.concatenate([rng.choice(mids, min(extra, mids.size), replace=False), x[-1:] + 1.0])
    xw = np.sort(np.concatenate([x, new]))
    keep = np.searchsorted(xw, x)
    Yw = np.full((len(Y), xw.size), np.nan)
    Yw[:, keep] = Y
    for b in range(len(Y)):
        n, mean, syy, xo, yc, _ = _gathered(x, Y, b)
        nw, mean_w, syy_w, xo_w, yc_w, _ = _gathered(xw, Yw, b)
        assert (n, np.float64(mean).tobytes(), np.float64(syy).tobytes()) == (
            nw, np.float64(mean_w).tobytes(), np.float64(syy_w).tobytes())
        assert xo[:n].tobytes() == xo_w[:n].tobytes() and yc[:n].tobytes() == yc_w[:n].tobytes()


@settings(max_examples=150, deadline=None)
@given(case=blocks(hostile=True))
def test_the_compiled_preparation_is_the_numpy_reference(case):
    x, Y = case
    a = prepare(x, Y, FitOptions())
    b = prepare_rows(x, Y, FitOptions(), "numba")
    for name in a:
        np.testing.assert_allclose(np.asarray(a[name], float), np.asarray(b[name], float),
                                   rtol=1e-12, atol=1e-12, err_msg=name)
