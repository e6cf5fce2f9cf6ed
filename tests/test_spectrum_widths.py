"""The event kernel: each event spread over its own sigmoid, against closed-form answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokdyn.errors import InputError
from tokdyn.fit.sigmoid import sigmoid_curve
from tokdyn.reconstruct import reconstruct, scores
from tokdyn.spectrum import Events, _event_bootstrap, learning_time_spectrum

X = np.linspace(0.0, 3.0, 41)  # log10 steps 1 .. 1000, spacing 0.075 decades


def sharp_and_wide(n=3000, seed=0) -> Events:
    """Half the tokens learned sharply (s 0.02-0.05) near x = 0.8, half slowly (s 0.3-0.5) near 2:
    a narrow peak and a broad bump that no single kernel width can draw both of."""
    rng = np.random.default_rng(seed)
    sharp = rng.uniform(size=n) < 0.5
    mu = np.where(sharp, rng.normal(0.8, 0.1, n), rng.normal(2.0, 0.2, n))
    s = np.where(sharp, rng.uniform(0.02, 0.05, n), rng.uniform(0.3, 0.5, n))
    return Events(np.arange(n), mu, s, rng.uniform(0.5, 2.0, n), n, (X[0], X[-1]), resolution=float(X[1] - X[0]))


def exact_derivative(ev: Events, x: np.ndarray) -> np.ndarray:
    """-dL/dx of the planted sigmoids, written out: (1/N) sum_i delta_i g (1 - g) / s_i."""
    g = 1.0 / (1.0 + np.exp(-(x[None, :] - ev.mu[:, None]) / ev.s[:, None]))
    return (ev.delta[:, None] * g * (1 - g) / ev.s[:, None]).sum(axis=0) / ev.n_tokens


def test_event_kernel_draws_sharp_and_wide_events_as_they_are():
    ev = sharp_and_wide()
    exact = exact_derivative(ev, X)
    got = learning_time_spectrum(ev, bandwidth=0.02)  # the default kernel="event"
    assert scores(got.at(X), exact)["r2"] > 0.999
    # the delta approximation misses at every bandwidth: narrow ones leave the wide events as
    # spikes, broad ones flatten the sharp peak
    for h in np.geomspace(0.01, 1.0, 21):
        assert scores(learning_time_spectrum(ev, bandwidth=float(h), kernel="delta").at(X), exact)["r2"] < 0.8


def test_spectrum_alone_rebuilds_the_measured_derivative_of_wide_events():
    ev = sharp_and_wide()
    Y = sigmoid_curve(X[None, :], 1 + ev.delta[:, None], 1.0, ev.mu[:, None], ev.s[:, None])
    rec = reconstruct(X, Y.mean(axis=0), ev, n_boot=0)
    assert rec.spectrum.kernel == "event" and rec.spectrum.bandwidth == pytest.approx(0.075)  # the resolution
    assert rec.r2_events > 0.999 and rec.r2_spectrum > 0.95
    old = reconstruct(X, Y.mean(axis=0), ev, n_boot=0, kernel="delta")
    assert old.r2_spectrum < 0.7


def test_event_kernel_integrates_to_the_seen_drop():
    # censored on both sides, wider than the range, sharper than the fine grid
    ev = Events(
        [0, 1, 2, 3, 4, 5],
        [-0.4, 3.3, 1.5, 1.01234, 0.0, 2.9],
        [0.3, 0.2, 2.0, 1e-4, 0.05, 1e-3],
        [2.0, 1.0, 3.0, 1.5, 0.7, -0.4],
        8,
        (0.0, 3.0),
    )
    spec = learning_time_spectrum(ev, bandwidth=0.1, grid=4001)
    seen = ev.realized_drop().sum() / ev.n_tokens
    assert spec.total_drop == pytest.approx(seen, rel=1e-9)
    assert np.trapezoid(spec.density, spec.x) == pytest.approx(seen, rel=2e-3)
    assert np.sum(spec.hist * np.diff(spec.edges)) == pytest.approx(seen, rel=1e-9)


def test_one_event_is_its_sigmoid_derivative_convolved_with_the_gaussian():
    from scipy.integrate import quad

    mu, s, delta, h, n = 1.4, 0.25, 2.0, 0.1, 4
    ev = Events([0], [mu], [s], [delta], n, (0.0, 3.0))
    spec = learning_time_spectrum(ev, bandwidth=h, grid=301)

    def expect(x):  # far from the edges, so no reflection: the convolution integral itself
        f = lambda u: math.exp(-(u - mu) / s) / (s * (1 + math.exp(-(u - mu) / s)) ** 2)  # noqa: E731
        k = lambda u: math.exp(-0.5 * ((x - u) / h) ** 2) / (h * math.sqrt(2 * math.pi))  # noqa: E731
        return delta / n * quad(lambda u: f(u) * k(u), x - 8 * h, x + 8 * h, limit=200)[0]

    for x in (0.8, 1.2, 1.4, 1.7, 2.2):
        assert spec.at(x) == pytest.approx(expect(x), rel=3e-3)


def test_a_sharp_event_is_the_delta_kernel():
    ev = Events([0, 1], [1.0, 2.0], [1e-4, 1e-4], [1.0, 0.5], 2, (0.0, 3.0))
    a = learning_time_spectrum(ev, bandwidth=0.15, kernel="event")
    b = learning_time_spectrum(ev, bandwidth=0.15, kernel="delta")
    np.testing.assert_allclose(a.density, b.density, atol=2e-3 * b.density.max())


def test_event_bootstrap_equals_each_weighted_spectrum():
    ev = sharp_and_wide(600, seed=1)
    ev = Events(ev.token // 2, ev.mu, ev.s, ev.delta, 300, ev.x_range, resolution=ev.resolution)  # 2 events a token
    spec = learning_time_spectrum(ev)
    rng = np.random.default_rng(0)
    mults = [rng.poisson(1.0, ev.n_tokens) for _ in range(3)]
    for got, m in zip(_event_bootstrap(ev, spec, mults), mults):
        want = learning_time_spectrum(ev, bandwidth=spec.bandwidth, weights=m[ev.token])
        np.testing.assert_allclose(got.density, want.density, rtol=1e-9, atol=1e-12)
        assert got.total_drop == pytest.approx(want.total_drop)


def test_summary_scores_without_the_end_points():
    ev = sharp_and_wide(800)
    Y = sigmoid_curve(X[None, :], 1 + ev.delta[:, None], 1.0, ev.mu[:, None], ev.s[:, None])
    rec = reconstruct(X, Y.mean(axis=0), ev, n_boot=0)
    s = rec.summary()
    inner = scores(rec.from_spectrum[1:-1], rec.measured[1:-1])
    assert (s["r2_spectrum_interior"], s["rel_l2_spectrum_interior"]) == (inner["r2"], inner["rel_l2"])
    assert s["r2_events_interior"] == scores(rec.from_events[1:-1], rec.measured[1:-1])["r2"]
    assert s["kernel"] == "event"


def test_kernel_is_validated():
    ev = sharp_and_wide(50)
    with pytest.raises(InputError, match="kernel"):
        learning_time_spectrum(ev, kernel="gaussian")
    with pytest.raises(InputError, match="kernel"):
        reconstruct(X, np.linspace(3, 1, X.size), ev, n_boot=0, kernel="box")
    with pytest.raises(InputError, match="placement"):  # point-mass placement means nothing to the event kernel
        learning_time_spectrum(ev, placement="seen")
    learning_time_spectrum(ev, placement="seen", kernel="delta")
