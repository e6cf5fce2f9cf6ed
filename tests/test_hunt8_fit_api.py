"""Hunt 8: the fit's Python API as researchers call it on their own arrays in notebooks.

Each test checks behaviour against an independent answer: the same data given with NaN for
missing points, the model that generated noise-free data, BIC computed by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from tokdyn.errors import InputError
from tokdyn.fit import SigmoidFitter, fit_block, fit_sigmoids, log_axis, sigmoid_curve
from tokdyn.fit.models import N_PARAMS, two_sigmoid_curve
from tokdyn.fit.synthetic import plant_sigmoids

X = np.linspace(1.0, 5.0, 40)
BACKENDS = ["numba", "numpy", "torch"]


def _masked_block():
    """Planted rows with a masked stretch whose hidden values are garbage (1e3 nats, inf,
    negative): what a masked array holds under its mask is not data."""
    Y = plant_sigmoids(6, X, rng=np.random.default_rng(8)).Y
    mask = np.zeros(Y.shape, dtype=bool)
    mask[0, 10:20] = True
    mask[1, ::3] = True
    mask[2, :] = True  # every point masked: no data at all
    mask[3, -5:] = True
    data = Y.copy()
    data[mask] = np.resize([1e3, np.inf, -7.0], int(mask.sum()))
    return np.ma.masked_array(data, mask=mask), np.where(mask, np.nan, Y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_points_of_Y_are_missing_points(backend):
    masked, with_nan = _masked_block()
    kept = masked.data.copy()
    got = fit_sigmoids(X, masked, backend=backend).to_dict()
    ref = fit_sigmoids(X, with_nan, backend=backend).to_dict()
    for name, a in ref.items():
        np.testing.assert_array_equal(got[name], a, err_msg=name)
    assert list(got["n_points"][:4]) == [30, 26, 0, 35]
    np.testing.assert_array_equal(masked.data, kept)  # the caller's array is not written
    # fit_block and the estimator (a 1-D masked trajectory too) read the mask the same way
    block = fit_block(X, masked, backend=backend)
    np.testing.assert_array_equal(block["mu"], ref["mu"])
    est = SigmoidFitter(backend=backend).fit(X, masked[0])
    np.testing.assert_array_equal(est.params_[0], [ref[k][0] for k in ("l0", "linf", "mu", "s")])


def test_a_masked_axis_is_one_clear_error():
    Y = plant_sigmoids(2, X, rng=np.random.default_rng(9)).Y
    x = np.ma.masked_array(X, mask=np.arange(40) == 7)
    for call in (lambda: fit_sigmoids(x, Y), lambda: fit_block(x, Y),
                 lambda: SigmoidFitter().fit(x, Y)):
        with pytest.raises(InputError, match="masked"):
            call()
    steps = np.ma.masked_array(np.geomspace(10, 1e4, 40), mask=np.arange(40) == 0)
    with pytest.raises(InputError, match="masked"):
        log_axis(steps)
    # nothing masked: the values as they are
    np.testing.assert_array_equal(fit_sigmoids(np.ma.masked_array(X), Y).mu, fit_sigmoids(X, Y).mu)
    np.testing.assert_array_equal(log_axis(np.ma.masked_array(steps.data)), log_axis(steps.data))


def test_the_estimator_refuses_bad_arrays_in_one_input_error():
    est = SigmoidFitter()
    with pytest.raises(InputError, match="Y: expected"):
        est.fit(X[:2], [[1.0, 2.0], [1.0]])  # ragged
    est.fit(X, plant_sigmoids(2, X, rng=np.random.default_rng(1)).Y)
    for bad in ([[1.0, 2.0], [3.0]], ["a", "b"], np.array([1, 2], dtype="timedelta64[s]"),
                np.array([1.0, None], dtype=object)):
        with pytest.raises(InputError, match="x: expected"):
            est.predict(bad)
    np.testing.assert_allclose(est.predict([1, 2, 3]), est.predict(np.array([1.0, 2.0, 3.0])))


def test_durations_are_no_axis_and_no_losses():
    # timedelta64 counts as an integer to np.issubdtype: it used to be fitted as raw counts
    Y = plant_sigmoids(2, X, rng=np.random.default_rng(2)).Y
    with pytest.raises(InputError, match="x: expected real numbers"):
        fit_sigmoids(np.arange(1, 41).astype("timedelta64[s]"), Y)
    with pytest.raises(InputError, match="Y: expected real numbers"):
        fit_sigmoids(X, Y.astype("timedelta64[s]"))


def _noise_free_rows():
    """Noise-free rows of known model: 12 sigmoids, an exact step, two two-step rows, a line."""
    rng = np.random.default_rng(11)
    x = np.linspace(1.0, 5.0, 60)
    n = 12
    mu, s = rng.uniform(2, 4, n), rng.uniform(0.05, 0.5, n)
    d, linf = rng.uniform(1, 6, n), rng.uniform(1, 3, n)
    sig = sigmoid_curve(x[None], (linf + d)[:, None], linf[:, None], mu[:, None], s[:, None])
    step = np.where(x < 3.05, 5.0, 1.0)
    two = two_sigmoid_curve(x, 1.0, 2.0, 2.2, 0.1, 2.0, 3.8, 0.15)
    two_b = two_sigmoid_curve(x, 0.5, 3.0, 1.8, 0.2, 1.5, 4.0, 0.1)
    line = np.linspace(6.0, 2.0, 60)
    Y = np.vstack([sig, step, two, two_b, line])
    return x, Y, [2] * n + [2, 3, 3, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_noise_free_rows_get_the_model_that_made_them(backend):
    # An exact fit leaves rounding, not noise: BIC used to rank the sigmoid's and the two
    # sigmoids' rounding (1e-14 against 1e-29 nats^2), so noise-free sigmoids came out as two
    # sigmoids on 4-8 of 12 rows, other rows on each backend.
    x, Y, planted = _noise_free_rows()
    fit = fit_sigmoids(x, Y, backend=backend)
    np.testing.assert_array_equal(fit.model, planted)
    assert (fit.class_name[:13] == "learned").all()
    assert (fit.class_name[13:15] == "multi_step").all()
    # one event per planted sigmoid, at its place
    ev = fit.events()
    assert np.bincount(ev["token"], minlength=16).tolist() == [1] * 13 + [2, 2, 0]


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_bic_is_n_ln_sse_over_n_plus_k_ln_n_with_exact_fits_floored(backend):
    x, Y, _ = _noise_free_rows()
    rng = np.random.default_rng(3)
    Y = np.vstack([Y, Y[:4] + rng.normal(0, 0.2, (4, Y.shape[1]))])  # and noisy rows
    f = fit_sigmoids(x, Y, backend=backend)
    n = f.n_points.astype(float)
    sse_c = ((Y - Y.mean(1, keepdims=True)) ** 2).sum(1)
    line = np.array([np.polyfit(x, y, 1) for y in Y])
    sse_l = ((Y - (line[:, :1] * x + line[:, 1:])) ** 2).sum(1)
    for field, sse, model in (("bic_constant", sse_c, 0), ("bic_line", sse_l, 1),
                              ("bic_sigmoid", f.sse, 2), ("bic_two_sigmoids", f.sse2, 3)):
        floored = np.maximum(sse, 1e-10 * sse_c)  # below 1e-10 of the row's own: exact
        want = n * np.log(floored / n) + N_PARAMS[model] * np.log(n)
        np.testing.assert_allclose(getattr(f, field), want, rtol=1e-9, atol=1e-6, err_msg=field)
    # noisy rows: no floor in reach, BIC is plain n ln(SSE/n) + k ln n
    assert (f.sse[-4:] > 1e-3 * sse_c[-4:]).all()


def test_predict_refuses_a_masked_x_as_fit_does():
    from tokdyn.fit import SigmoidFitter

    x = np.linspace(0.0, 3.0, 20)
    est = SigmoidFitter().fit(x, 1.0 + 2.0 / (1.0 + np.exp((x - 1.5) / 0.2)))
    with pytest.raises(InputError, match="masked"):
        est.predict(np.ma.masked_array(x, mask=x > 2.5))
    assert est.predict(np.ma.masked_array(x)).shape == (1, 20)  # nothing masked: fine
