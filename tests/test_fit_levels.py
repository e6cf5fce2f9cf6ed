"""Fitted loss levels stay at or above the floor (a cross-entropy is never below 0).

An event censored by the end of the run shows only its head: least squares without the bound
sends linf to large negative values with a drop to match (seen on the demo: a quarter of its
tokens, linf down to -3e5). The bounded fit is checked here against independent answers: the
projected sum of squares against a brute-force non-negative least squares (scipy's nnls), its
derivatives against finite differences, and the fitted levels of every backend on random and
censored data.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tokdyn.fit import available_backends, fit_sigmoids
from tokdyn.fit.backends import NumpyOps
from tokdyn.fit.projection import sigmoid_projected
from tokdyn.fit.sigmoid import LEVEL_FLOOR, sigmoid_curve

X = np.linspace(0.0, 3.0, 30)
BACKENDS = [b for b in ("numba", "numpy", "torch") if b in available_backends()]


def _g(x, th):
    return 1.0 / (1.0 + np.exp(np.clip((x - th[0]) / np.exp(th[1]), -50, 50)))


def _nnls_sse(x, y, th, floor=0.0):
    """min over l0, linf >= floor of sum (l0 g + linf (1 - g) - y)^2, by scipy's nnls."""
    from scipy.optimize import nnls

    g = _g(x, th)
    _, res = nnls(np.stack([g, 1.0 - g], 1), y - floor)
    return res * res


def _censored(rng, n):
    """Heads of events whose mu lies past the last point: the loss still falling at the end."""
    mu = rng.uniform(3.2, 4.2, n)
    s = rng.uniform(0.3, 1.2, n)
    l0 = rng.uniform(2.0, 6.0, n)
    Y = sigmoid_curve(X[None, :], l0[:, None], 0.0, mu[:, None], s[:, None])
    return np.abs(Y + 0.05 * rng.standard_normal(Y.shape))


def _projected_numba(x, y, th, floor=0.0):
    from tokdyn.fit.varpro import _N_BUF, _OUT_SIZE, _vp_sigmoid

    yc = y - y.mean()
    out = np.zeros(_OUT_SIZE)
    F = _vp_sigmoid(x, yc, x.size, float(yc @ yc), np.asarray(th, float),
                    np.zeros((_N_BUF, x.size)), out, floor, float(y.mean()))
    return F, out


def _projected_numpy(x, y, th, floor=0.0):
    yc = y - y.mean()
    F, A, grad = sigmoid_projected(NumpyOps, x, yc[None], np.ones((1, x.size)),
                                   np.asarray(th, float)[None], np.array([y.mean()]),
                                   np.array([floor]))
    out = np.zeros(24)
    out[0], out[3:5], out[7:11] = F[0], grad[0], A[0].ravel()
    return F[0], out


PROJECTIONS = [_projected_numpy] + ([_projected_numba] if "numba" in BACKENDS else [])


@pytest.mark.parametrize("projected", PROJECTIONS)
@settings(max_examples=60, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1))
def test_projected_sse_is_the_bounded_least_squares(projected, seed):
    """At any (mu, s), the projected sum of squares equals scipy's nnls with levels >= 0,
    whichever active set binds (data falling, rising, flat, censored at either end)."""
    pytest.importorskip("scipy")
    rng = np.random.default_rng(seed)
    kind = rng.integers(4)
    if kind == 0:
        y = _censored(rng, 1)[0]
    elif kind == 1:
        y = _censored(rng, 1)[0][::-1]  # rising, censored at the start
    else:
        y = np.abs(rng.uniform(0, 3) + rng.standard_normal(X.size) * rng.uniform(0.01, 1.0))
    th = np.array([rng.uniform(-1.5, 4.5), np.log(rng.uniform(0.01, 3.0))])
    F, _ = projected(X, y, th)
    g = _g(X, th)
    if not g.var() > 1e-12:  # g constant over the points: no event there, the step refused
        assert F == np.inf
        return
    ref = _nnls_sse(X, y, th)
    # The projection's rounding grows with the conditioning of the columns (1, g): where g
    # barely varies over the points (an event far outside them), var(g) is a difference of
    # nearly equal sums, and the explained part c^2 / v carries eps * mean(g^2) / var(g) of
    # relative error (measured on 20,000 draws: 12 beyond 1e-7 of nnls's answer, which a
    # 50-digit solve confirmed, all within 1.8 of this bound; typically it is 1e-15 of F).
    yc = y - y.mean()
    slack = (16 * np.finfo(float).eps * max(float(yc @ yc) - ref, 0.0)
             * float(np.mean(g * g) / g.var()))
    assert abs(F - ref) <= max(1e-7 * abs(ref), 1e-9 * float(y @ y)) + slack


@pytest.mark.parametrize("projected", PROJECTIONS)
def test_bounded_derivatives_match_finite_differences(projected):
    """Where linf sits on the floor, the gradient (and the matrix, where it is the Hessian)
    is that of the bounded projected sum of squares."""
    rng = np.random.default_rng(5)
    Y = _censored(rng, 60)
    checked = 0
    for y in Y:
        th = np.array([3.6, np.log(0.7)])
        F0, out = projected(X, y, th)
        # only where the bound binds at th and nearby (away from a switch of active set)
        levels_free = _free_levels(X, y, th)
        if min(levels_free) >= 0:
            continue
        eps = 1e-5
        grad = [(projected(X, y, th + eps * e)[0] - projected(X, y, th - eps * e)[0]) / (4 * eps)
                for e in np.eye(2)]
        np.testing.assert_allclose(out[3:5], grad, rtol=1e-4, atol=1e-8 * max(F0, 1.0))
        hess = np.array([[(projected(X, y, th + eps * e)[1][3 + i]
                           - projected(X, y, th - eps * e)[1][3 + i]) / (2 * eps)
                          for e in np.eye(2)] for i in range(2)])
        if hess[0, 0] > 0 and np.linalg.det(hess) > 0:
            np.testing.assert_allclose(out[7:11].reshape(2, 2), hess, rtol=1e-3,
                                       atol=1e-6 * max(F0, 1.0))
        checked += 1
    assert checked >= 10


def _free_levels(x, y, th):
    g = _g(x, th)
    l0, linf = np.linalg.lstsq(np.stack([g, 1.0 - g], 1), y, rcond=None)[0]
    return l0, linf


@pytest.mark.parametrize("backend", BACKENDS)
def test_censored_events_keep_their_levels_at_or_above_zero(backend):
    rng = np.random.default_rng(1)
    Y = _censored(rng, 200)
    fit = fit_sigmoids(X, Y, backend=backend)
    for name in ("l0", "linf", "linf2"):
        v = getattr(fit, name)
        assert np.all(v[np.isfinite(v)] >= LEVEL_FLOOR - 1e-9), name
    # the bound binds for most of them (the free optimum would be below 0) and the fit stays
    # at the bounded optimum: no worse than a scipy search with the same bounds
    pytest.importorskip("scipy")
    from tokdyn.fit.prepare import prepare
    from tokdyn.fit.options import FitOptions
    from tokdyn.fit.reference import multistart_sigmoid

    rows = np.arange(0, 200, 20)
    prep = prepare(X, Y[rows], FitOptions())
    ref = multistart_sigmoid(X, Y[rows], prep["lo"], prep["hi"], n_mu=60, n_s=20)
    assert np.all(fit.sse[rows] <= ref * (1 + 1e-3))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1))
def test_levels_never_below_zero(backend, seed):
    """Any non-negative data: every fitted level of both models is >= 0."""
    rng = np.random.default_rng(seed)
    n = 24
    parts = [_censored(rng, n), _censored(rng, n)[:, ::-1],
             np.abs(rng.uniform(0, 4, (n, 1)) + rng.standard_normal((n, X.size)))]
    Y = np.concatenate(parts)
    Y[rng.random(Y.shape) < 0.1] = np.nan
    fit = fit_sigmoids(X, Y, backend=backend)
    for name in ("l0", "linf", "linf2"):
        v = getattr(fit, name)
        assert np.all(v[np.isfinite(v)] >= LEVEL_FLOOR - 1e-9), (name, np.nanmin(v))


# ---------------------------------------------------------------------------------------------
# Two sigmoids: linf >= 0 and each drop within -+ MAX_DROP_RANGE times the observed range


def _two_sse_reference(x, y, th, floor, max_drop):
    """min over linf >= floor, |d1|, |d2| <= max_drop of sum (linf + d1 g1 + d2 g2 - y)^2, by
    scipy's bounded linear least squares (an independent solver)."""
    from scipy.optimize import lsq_linear

    A = np.stack([np.ones_like(x), _g(x, th[:2]), _g(x, th[2:])], 1)
    sol = lsq_linear(A, y, bounds=([floor, -max_drop, -max_drop], [np.inf, max_drop, max_drop]),
                     method="bvls", tol=1e-14, lsmr_tol=None)
    r = A @ sol.x - y
    return float(r @ r), sol.x


def _two_numba(x, y, th, floor, max_drop):
    from tokdyn.fit.varpro import _N_BUF, _OUT_SIZE, _vp_two

    yc = y - y.mean()
    out = np.zeros(_OUT_SIZE)
    bnd = np.array([floor, -max_drop, max_drop, -max_drop, max_drop])
    F = _vp_two(x, yc, x.size, float(yc @ yc), np.asarray(th, float), np.zeros((_N_BUF, x.size)),
                out, bnd, float(y.mean()))
    return F, out


def _two_data(rng):
    kind = rng.integers(4)
    if kind == 0:
        return _censored(rng, 1)[0]
    if kind == 1:
        return _censored(rng, 1)[0][::-1]
    if kind == 2:  # two steps
        mu = np.sort(rng.uniform(0.3, 2.7, 2))
        y = (1.0 + rng.uniform(0.5, 2) * _g(X, [mu[0], np.log(0.1)])
             + rng.uniform(0.5, 2) * _g(X, [mu[1], np.log(0.1)]))
        return np.abs(y + 0.05 * rng.standard_normal(X.size))
    return np.abs(rng.uniform(0, 3) + rng.standard_normal(X.size) * rng.uniform(0.01, 1.0))


needs_numba = pytest.mark.skipif("numba" not in BACKENDS, reason="numba not installed")


@needs_numba
@settings(max_examples=80, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1))
def test_two_sigmoid_projection_is_the_box_constrained_least_squares(seed):
    """At any pair of events, the projected SSE and amplitudes are those of scipy's bounded
    least squares, whichever bounds bind (drop bounds from far inside to far below the data's
    range, so every active set is met)."""
    pytest.importorskip("scipy")
    rng = np.random.default_rng(seed)
    y = _two_data(rng)
    th = np.array([rng.uniform(-1.0, 4.0), np.log(rng.uniform(0.02, 2.0)),
                   rng.uniform(-1.0, 4.0), np.log(rng.uniform(0.02, 2.0))])
    # up to 100x the range: unbounded, an event off the points takes drops of 1e3-1e5 with the
    # basis' condition number 1e5-1e6, and both solvers only agree to rounding (the bound's reason)
    max_drop = float(np.ptp(y)) * rng.choice([0.05, 0.3, 1.0, 2.0, 100.0])
    F, out = _two_numba(X, y, th, 0.0, max_drop)
    if not np.isfinite(F):  # a degenerate basis (events coincide or lie off the points)
        g1, g2 = _g(X, th[:2]), _g(X, th[2:])
        A = np.stack([np.ones_like(X), g1, g2], 1)
        assert np.linalg.cond(A) > 1e6
        return
    ref, amp = _two_sse_reference(X, y, th, 0.0, max_drop)
    mine = np.array([out[1] + y.mean(), out[2], out[3]])
    assert mine[0] >= -1e-9 and max(abs(mine[1]), abs(mine[2])) <= max_drop * (1 + 1e-9)
    A = np.stack([np.ones_like(X), _g(X, th[:2]), _g(X, th[2:])], 1)
    r = A @ mine - y
    # its amplitudes are the bounded optimum ...
    assert float(r @ r) == pytest.approx(ref, rel=1e-7, abs=1e-9 * float(y @ y))
    # ... and the SSE it reports is theirs
    assert F == pytest.approx(ref, rel=1e-7, abs=1e-9 * float(y @ y))
    if np.linalg.cond(A) < 1e3:
        np.testing.assert_allclose(mine, amp, rtol=1e-5, atol=1e-6 * (1 + np.ptp(y)))


@needs_numba
def test_two_sigmoid_gradient_matches_finite_differences_where_drops_bind():
    rng = np.random.default_rng(8)
    checked = 0
    for _ in range(200):
        y = _two_data(rng)
        th = np.array([rng.uniform(0.5, 2.5), np.log(rng.uniform(0.1, 1.0)),
                       rng.uniform(0.5, 2.5), np.log(rng.uniform(0.1, 1.0))])
        max_drop = 0.3 * float(np.ptp(y))
        F0, out = _two_numba(X, y, th, 0.0, max_drop)
        if not np.isfinite(F0) or max(abs(out[2]), abs(out[3])) < max_drop * (1 - 1e-9):
            continue
        eps = 1e-6
        Fs = [(_two_numba(X, y, th + eps * e, 0.0, max_drop)[0],
               _two_numba(X, y, th - eps * e, 0.0, max_drop)[0]) for e in np.eye(4)]
        _, out_p = _two_numba(X, y, th + eps * np.eye(4)[0], 0.0, max_drop)
        if abs(out_p[2]) < max_drop * (1 - 1e-9) and abs(out_p[3]) < max_drop * (1 - 1e-9):
            continue  # an active-set switch within eps
        grad = [(a - b) / (4 * eps) for a, b in Fs]
        np.testing.assert_allclose(out[4:8], grad, rtol=1e-4, atol=1e-7 * max(F0, 1.0))
        checked += 1
    assert checked >= 20


def _active_set(out, floor_c, max_drop):
    """Which amplitudes sit on a bound: (linf on the floor, d1 on +-max_drop, d2 likewise)."""
    tol = 1e-9 * (1 + max_drop)
    return (abs(out[1] - floor_c) < tol, abs(abs(out[2]) - max_drop) < tol,
            abs(abs(out[3]) - max_drop) < tol)


@needs_numba
@settings(max_examples=60, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1))
def test_two_sigmoid_step_matrix_is_the_exact_hessian_or_kaufmans(seed):
    """The exact Hessian of the projected SSE that the evaluation reports (out[40:56]) equals
    the finite-difference derivative of its gradient, whichever amplitudes sit on their bounds;
    the solver steps with it where it is positive definite and with Kaufman's matrix
    (out[24:40]) elsewhere, so the matrix it steps with is always positive definite."""
    rng = np.random.default_rng(seed)
    y = _two_data(rng)
    th = np.array([rng.uniform(0.3, 2.7), np.log(rng.uniform(0.1, 1.0)),
                   rng.uniform(0.3, 2.7), np.log(rng.uniform(0.1, 1.0))])
    max_drop = float(np.ptp(y)) * rng.choice([0.3, 1.0, 10.0])
    F, out = _two_numba(X, y, th, 0.0, max_drop)
    if not np.isfinite(F):
        return
    step, kaufman, exact = (out[a:a + 16].reshape(4, 4) for a in (8, 24, 40))
    for m in (step, kaufman, exact):
        np.testing.assert_array_equal(m, m.T)
    exact_pd = np.all(np.linalg.eigvalsh(exact) > 1e-9 * np.abs(np.diag(exact)).max())
    if exact_pd:
        np.testing.assert_array_equal(step, exact)
    elif not np.all(np.linalg.eigvalsh(exact) > 0):
        np.testing.assert_array_equal(step, kaufman)
    assert np.all(np.linalg.eigvalsh(step) > 0)
    eps = 1e-6 * (1 + np.abs(th))
    state = _active_set(out, -y.mean(), max_drop)
    fd = np.empty((4, 4))
    for j in range(4):
        e = np.eye(4)[j] * eps[j]
        _, op = _two_numba(X, y, th + e, 0.0, max_drop)
        _, om = _two_numba(X, y, th - e, 0.0, max_drop)
        if any(_active_set(o, -y.mean(), max_drop) != state for o in (op, om)):
            return  # an active-set switch within eps: the SSE is not twice differentiable there
        fd[:, j] = (op[4:8] - om[4:8]) / (2 * eps[j])
    # entries near 0 are compared on the matrix's scale: the differences' noise (rounding, z
    # clipped far out) is up to ~1e-5 of it (measured over 4,000 draws); a wrong term is not
    np.testing.assert_allclose(exact, (fd + fd.T) / 2, rtol=1e-4, atol=1e-3 * np.abs(exact).max())


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=10, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1))
def test_two_sigmoid_drops_stay_within_the_bound(backend, seed):
    """Every backend: each fitted drop within MAX_DROP_RANGE times the row's observed range,
    linf >= 0, on censored, two-step and noise data with missing points."""
    from tokdyn.fit.models import MAX_DROP_RANGE

    rng = np.random.default_rng(seed)
    Y = np.stack([_two_data(rng) for _ in range(40)])
    Y[rng.random(Y.shape) < 0.1] = np.nan
    fit = fit_sigmoids(X, Y, backend=backend)
    span = np.nanmax(Y, 1) - np.nanmin(Y, 1)
    for name in ("delta1", "delta2"):
        v = getattr(fit, name)
        ok = np.isfinite(v)
        assert np.all(np.abs(v[ok]) <= MAX_DROP_RANGE * span[ok] * (1 + 1e-9) + 1e-12), name
    v = fit.linf2
    assert np.all(v[np.isfinite(v)] >= LEVEL_FLOOR - 1e-9)
