"""The sigmoid fit against independent answers: scipy's optimum, planted truth, hand values."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.optimize import curve_fit

from tokdyn.errors import InputError
from tokdyn.fit import (
    STATUS_CODES,
    FitOptions,
    age_of_acquisition,
    available_backends,
    fit_sigmoids,
    log_axis,
)
from tokdyn.fit.sigmoid import LEVEL_FLOOR, sigmoid_bounds, sigmoid_start
from tokdyn.fit.synthetic import plant_sigmoids

CPU_BACKENDS = [b for b in ("numpy", "numba") if b in available_backends()]


def model(x, l0, linf, mu, s):
    return linf + (l0 - linf) / (1.0 + np.exp((x - mu) / s))


def scipy_fit(x, y, p0, bounds=None):
    """curve_fit's optimum and SSE, or None where it does not converge."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if bounds is None:
                p, _ = curve_fit(model, x, y, p0=p0, maxfev=4000)
            else:
                p, _ = curve_fit(model, x, y, p0=p0, bounds=bounds, max_nfev=4000)
        except (RuntimeError, ValueError):
            return None, None
    return p, float(np.sum((model(x, *p) - y) ** 2))


@pytest.fixture(scope="module")
def planted():
    x = np.linspace(0.0, 5.0, 100)
    return plant_sigmoids(400, x, rng=np.random.default_rng(7), noise=0.2)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_sse_no_worse_than_scipy_same_bounds(planted, backend):
    # Same problem for both (same start values and box): tokdyn's optimum must be scipy's.
    x, Y = planted.x, planted.Y
    fit = fit_sigmoids(x, Y, backend=backend, two_step=False)
    W = np.ones_like(Y)
    p0 = sigmoid_start(x, Y, W, FitOptions())
    lo, hi = sigmoid_bounds(x, W, FitOptions())
    no_worse, converged, close = 0, 0, 0
    for i in range(len(Y)):
        p, sse = scipy_fit(x, Y[i], p0[i], bounds=(lo[i], hi[i]))
        if p is None:
            continue
        converged += 1
        no_worse += fit.sse[i] <= sse * (1 + 1e-6)
        close += abs(fit.mu[i] - p[2]) < 1e-3
    assert converged >= 390
    assert no_worse / converged >= 0.995
    assert close / converged >= 0.99


def test_sse_no_worse_than_researcher_scipy(planted):
    # scipy as a researcher writes it: no bounds, plateaus from the ends, mu at the crossing.
    x, Y = planted.x, planted.Y
    fit = fit_sigmoids(x, Y, backend="auto", two_step=False)
    no_worse, converged = 0, 0
    for i in range(200):
        y = Y[i]
        a, b = y[:5].mean(), y[-5:].mean()
        p0 = [a, b, x[np.argmin(np.abs(y - (a + b) / 2))], 0.5]
        p, sse = scipy_fit(x, y, p0)
        if p is None:
            continue
        converged += 1
        no_worse += fit.sse[i] <= sse * (1 + 1e-6)
    assert converged >= 190
    assert no_worse / converged >= 0.995


def test_standard_errors_match_curve_fit():
    rng = np.random.default_rng(3)
    x = np.linspace(0, 4, 60)
    y = model(x, 6.0, 2.0, 2.0, 0.3) + 0.2 * rng.standard_normal(60)
    fit = fit_sigmoids(x, y[None], backend="numpy", two_step=False)
    p, pcov = curve_fit(model, x, y, p0=[6, 2, 2, 0.3])
    assert fit.status[0] == STATUS_CODES["converged"]
    np.testing.assert_allclose([fit.l0[0], fit.linf[0], fit.mu[0], fit.s[0]], p, rtol=1e-5)
    se = [fit.l0_se[0], fit.linf_se[0], fit.mu_se[0], fit.s_se[0]]
    np.testing.assert_allclose(se, np.sqrt(np.diag(pcov)), rtol=1e-3)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_planted_events_recovered(backend):
    # 100 log-spaced points over 4 decades, noise 0.2 nats, drops of 1-6 nats.
    x = np.linspace(1.0, 5.0, 100)
    pl = plant_sigmoids(2000, x, rng=np.random.default_rng(11), noise=0.2)
    fit = fit_sigmoids(x, pl.Y, backend=backend, two_step=False)
    t = pl.truth
    ok = np.isin(fit.status, [STATUS_CODES["converged"], STATUS_CODES["hit_bound"]])
    assert ok.mean() >= 0.99
    assert np.median(np.abs(fit.mu - t["mu"])) < 0.02  # decades
    assert np.quantile(np.abs(fit.mu - t["mu"]), 0.95) < 0.15
    assert np.median(np.abs(fit.s / t["s"] - 1)) < 0.1
    assert np.median(np.abs(fit.delta - t["delta"])) < 0.1  # nats
    assert abs(np.median(fit.rms) - 0.2) < 0.01  # the residual is the planted noise
    # the reported standard errors are honest: |error| / se is roughly standard normal
    z = (fit.mu - t["mu"]) / fit.mu_se
    assert 0.5 < np.median(np.abs(z)) < 0.9  # 0.674 for N(0, 1)


def test_noise_free_is_exact():
    x = np.linspace(0, 3, 40)
    y = model(x, 5.0, 1.0, 1.7, 0.25)
    fit = fit_sigmoids(x, y[None], backend="numpy", two_step=False)
    np.testing.assert_allclose([fit.l0[0], fit.linf[0], fit.mu[0], fit.s[0]],
                               [5.0, 1.0, 1.7, 0.25], rtol=1e-7)
    assert fit.r2[0] > 1 - 1e-12


def test_start_values_by_hand():
    # 12 points, a clean step between x=5 and x=6: plateaus 4 and 1, crossing at 5.5.
    x = np.arange(12, dtype=float)
    y = np.where(x <= 5, 4.0, 1.0)[None]
    p0 = sigmoid_start(x, y, np.ones_like(y), FitOptions(edge_points=3))
    l0, linf, mu, s = p0[0]
    assert (l0, linf, mu) == (4.0, 1.0, 5.5)
    assert s == pytest.approx(11 / 50)  # no point in the middle band: the floor, range/50


def test_start_values_skip_missing_points():
    x = np.arange(12, dtype=float)
    y = np.where(x <= 5, 4.0, 1.0)
    y_nan = y.copy()
    y_nan[[0, 11]] = np.nan  # first and last missing
    W = (~np.isnan(y_nan)).astype(float)[None]
    p0 = sigmoid_start(x, np.nan_to_num(y_nan)[None], W, FitOptions())
    assert p0[0, 0] == 4.0 and p0[0, 1] == 1.0 and p0[0, 2] == 5.5


def test_bounds_by_hand():
    x = np.linspace(1.0, 5.0, 41)  # spacing 0.1
    W = np.ones((1, 41))
    W[0, :10] = 0  # observed range [2, 5]
    lo, hi = sigmoid_bounds(x, W, FitOptions(mu_margin=0.5, s_max_frac=1.0))
    assert lo[0, 2] == pytest.approx(0.5) and hi[0, 2] == pytest.approx(6.5)
    assert lo[0, 3] == pytest.approx(0.001) and hi[0, 3] == pytest.approx(3.0)
    assert (lo[0, :2] == LEVEL_FLOOR).all() and np.isposinf(hi[0, :2]).all()  # a loss is >= 0


def test_straight_line_hits_width_bound():
    # A straight line is a sigmoid of infinite width: s is pushed onto s_max = range of x.
    x = np.linspace(0, 2, 50)
    y = 5.0 - x + 0.01 * np.random.default_rng(0).standard_normal(50)
    fit = fit_sigmoids(x, y[None], backend="numpy")
    assert fit.status[0] == STATUS_CODES["hit_bound"]
    assert fit.s[0] == pytest.approx(2.0)
    assert fit.class_name[0] == "gradual"


def test_age_of_acquisition_by_hand():
    # l0 = ln V = 10 (chance), linf = 2, mu = 3, s = 0.5, last point far right (best = 2).
    # Halfway level: 6 = 2 + 8 sigma(-z) -> sigma(-z) = 1/2 -> z = 0 -> x = mu = 3.
    V = int(round(math.exp(10.0)))
    aoa = age_of_acquisition(np.array([math.log(V)]), np.array([2.0]), np.array([3.0]),
                             np.array([0.5]), np.array([50.0]), V)
    assert aoa[0] == pytest.approx(3.0, abs=1e-9)
    # l0 = 12 above chance ln V: level (ln V + 2)/2 = 2 + 10 sigma(-z), solve for z
    frac = (0.5 * (math.log(V) + 2.0) - 2.0) / 10.0  # = 0.4 up to rounding V
    aoa = age_of_acquisition(np.array([12.0]), np.array([2.0]), np.array([3.0]),
                             np.array([0.5]), np.array([50.0]), V)
    assert aoa[0] == pytest.approx(3.0 + 0.5 * math.log(1 / frac - 1), abs=1e-9)
    # a rising curve never crosses: NaN
    assert np.isnan(age_of_acquisition(np.array([2.0]), np.array([9.0]), np.array([3.0]),
                                       np.array([0.5]), np.array([5.0]), 1000))[0]


def test_age_of_acquisition_in_fit():
    x = np.linspace(1, 5, 60)
    V = 1000
    y = model(x, math.log(V), 1.0, 3.0, 0.2)
    fit = fit_sigmoids(x, y[None], backend="numpy", vocab_size=V, two_step=False)
    best = model(x[-1], math.log(V), 1.0, 3.0, 0.2)
    level = 0.5 * (math.log(V) + best)
    assert model(fit.aoa[0], math.log(V), 1.0, 3.0, 0.2) == pytest.approx(level, abs=1e-6)
    assert np.isnan(fit_sigmoids(x, y[None], backend="numpy", two_step=False).aoa[0])


def test_log_axis():
    np.testing.assert_allclose(log_axis([1, 10, 1000]), [0, 1, 3])
    with pytest.raises(InputError, match="positive.*step 0"):
        log_axis([0, 1, 2])
    with pytest.raises(InputError, match="increasing"):
        log_axis([1, 3, 2])
