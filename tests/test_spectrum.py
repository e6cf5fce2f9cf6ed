"""Spectrum and reconstruction against planted ground truth, hand-computed values and invariances."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokdyn.errors import InputError
from tokdyn.fit import fit_sigmoids
from tokdyn.fit.sigmoid import sigmoid_curve
from tokdyn.fit.synthetic import plant_two_steps
from tokdyn.reconstruct import measured_derivative, reconstruct, scores
from tokdyn.spectrum import (
    Events,
    events_from_fit,
    fit_power_law,
    learning_time_spectrum,
    loss_power_law,
    select_bandwidth,
    spectra_by,
    spectrum_power_law,
)

X = np.linspace(0.0, 3.0, 41)  # log10 steps 1 .. 1000


def power_law_mu(n: int, alpha: float, lo: float, hi: float, rng) -> np.ndarray:
    """Learning times with density proportional to 10**(-alpha x) on [lo, hi] (inverse CDF)."""
    k = alpha * math.log(10)
    u = rng.uniform(size=n)
    return lo - np.log(1 - u * (1 - math.exp(-k * (hi - lo)))) / k


def planted_events(n=20000, alpha=0.5, s=(0.03, 0.08), seed=0, lo=-0.5, hi=3.5) -> Events:
    rng = np.random.default_rng(seed)
    mu = power_law_mu(n, alpha, lo, hi, rng)
    return Events(np.arange(n), mu, rng.uniform(*s, n), np.full(n, 2.0), n, (X[0], X[-1]))


def planted_curves(ev: Events, noise=0.0, seed=1):
    """Trajectories [N, K] of the events' tokens (one event each, plateau 1 nat)."""
    rng = np.random.default_rng(seed)
    Y = sigmoid_curve(X[None, :], 1 + ev.delta[:, None], 1.0, ev.mu[:, None], ev.s[:, None])
    return Y + noise * rng.standard_normal(Y.shape)


# -- events --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mu=[np.nan]), "mu"),
        (dict(s=[0.0]), "widths"),
        (dict(token=[5]), "token indices"),
        (dict(x_range=(1.0, 1.0)), "x_range"),
        (dict(delta=[1.0, 2.0]), "delta"),
        (dict(n_tokens=0), "n_tokens"),
    ],
)
def test_events_validate_their_input(kwargs, match):
    base = dict(token=[0], mu=[1.0], s=[0.1], delta=[1.0], n_tokens=2, x_range=(0.0, 3.0))
    with pytest.raises(InputError, match=match):
        Events(**{**base, **kwargs})


def test_realized_drop_by_hand():
    # an event centred on the lower edge: half its drop happened before the first point
    ev = Events([0, 1], [0.0, 1.5], [0.1, 0.01], [2.0, 3.0], 2, (0.0, 3.0))
    np.testing.assert_allclose(ev.realized_drop(), [1.0, 3.0], atol=1e-9)


def test_seen_centre_by_hand():
    # inside: mu; centred on the lower edge: the mean of the seen half of a logistic,
    # lo + s * 2 ln 2 (the mean of x over x > mu of the logistic density is s * 2 ln 2)
    ev = Events([0, 1], [1.5, 0.0], [0.05, 0.1], [1.0, 1.0], 2, (0.0, 3.0))
    np.testing.assert_allclose(ev.seen_centre(), [1.5, 0.1 * 2 * math.log(2)], atol=1e-9)
    np.testing.assert_allclose(ev.positions("mu"), [1.5, 0.0])
    with pytest.raises(InputError, match="placement"):
        ev.positions("middle")


def test_multi_step_tokens_contribute_both_events():
    rng = np.random.default_rng(0)
    p = plant_two_steps(400, X, rng=rng, noise=0.05)
    fit = fit_sigmoids(p.x, p.Y).to_dict()
    ev = events_from_fit(fit, which="two_step")
    assert len(ev) >= 2 * 390  # nearly every token gives two events
    two = np.bincount(ev.token, minlength=400) == 2
    # both planted learning times are found for the tokens with two events
    mus = np.sort(np.stack([ev.mu[ev.token == t] for t in np.flatnonzero(two)[:200]]), axis=1)
    truth = np.stack([p.truth["mu1"], p.truth["mu2"]], axis=1)[np.flatnonzero(two)[:200]]
    assert np.median(np.abs(mus - truth)) < 0.05
    classified = events_from_fit(fit, which="classified")
    multi = fit["class_code"] == 4
    assert multi.mean() > 0.8
    assert np.all(np.bincount(classified.token, minlength=400)[multi] == 2)


def test_events_from_fit_rejects_incomplete_fields():
    with pytest.raises(InputError, match="fields"):
        events_from_fit({"mu": np.zeros(3)})
    with pytest.raises(InputError, match="which"):
        events_from_fit({}, which="everything")


# -- the density ---------------------------------------------------------------------------


def test_spectrum_integrates_to_the_seen_drop():
    ev = planted_events(5000)
    spec = learning_time_spectrum(ev, bandwidth=0.1, grid=2001)
    integral = np.trapezoid(spec.density, spec.x)
    assert integral == pytest.approx(ev.realized_drop().sum() / ev.n_tokens, rel=2e-3)
    assert spec.total_drop == pytest.approx(ev.realized_drop().sum() / ev.n_tokens)
    assert np.sum(spec.hist * np.diff(spec.edges)) == pytest.approx(spec.total_drop, rel=1e-9)


def test_spectrum_of_one_event_is_a_gaussian():
    ev = Events([0], [1.5], [0.01], [2.0], 4, (0.0, 3.0))
    spec = learning_time_spectrum(ev, bandwidth=0.2, grid=301, kernel="delta")
    expect = 2.0 / 4 * np.exp(-0.5 * ((spec.x - 1.5) / 0.2) ** 2) / (0.2 * math.sqrt(2 * math.pi))
    np.testing.assert_allclose(spec.density, expect, atol=2e-3 * expect.max())


def test_spectra_by_group_add_up_to_the_whole():
    ev = planted_events(3000)
    group = np.arange(3000) % 3
    parts = spectra_by(ev, group, ["a", "b", "c"], bandwidth=0.1, min_events=0)
    whole = learning_time_spectrum(ev, bandwidth=0.1)
    np.testing.assert_allclose(sum(p.density for p in parts.values()), whole.density, rtol=1e-9, atol=1e-12)


def test_bandwidth_rules():
    ev = planted_events(20000, s=(0.1, 0.1))
    assert select_bandwidth(ev, 0.07) == 0.07
    # the single Gaussian that best replaces logistic events of width s has sd near pi/sqrt(3) s
    assert 0.12 <= select_bandwidth(ev, "events", kernel="delta") <= 0.25
    # events that carry their own widths need no more smoothing than the points resolve
    assert select_bandwidth(ev, "events") == 0.01
    coarse = Events(ev.token, ev.mu, ev.s, ev.delta, ev.n_tokens, ev.x_range, resolution=0.075)
    assert select_bandwidth(coarse, "auto") == 0.075
    with pytest.raises(InputError, match="kernel"):
        select_bandwidth(ev, "auto", kernel="box")
    assert select_bandwidth(ev, "widths") == pytest.approx(math.pi / math.sqrt(3) * 0.1)
    assert 0 < select_bandwidth(ev, "silverman") < 0.2
    for bad in ("grid", -1.0, float("nan"), True):
        with pytest.raises(InputError, match="bandwidth"):
            select_bandwidth(ev, bad)


def test_spectrum_power_law_recovers_planted_exponent():
    ev = planted_events(40000, alpha=0.5)
    pl = spectrum_power_law(ev, bandwidth=0.1, n_boot=50, seed=0)
    assert abs(pl.alpha - 0.5) < 0.05
    assert pl.alpha_lo < pl.alpha < pl.alpha_hi
    assert pl.alpha_hi - pl.alpha_lo < 0.1
    assert pl.r2 > 0.95


def test_fit_power_law_by_hand():
    x = np.array([0.0, 1.0, 2.0])
    alpha, log_a, r2 = fit_power_law(x, 3 * 10 ** (-0.7 * x))
    assert (alpha, 10**log_a, r2) == pytest.approx((0.7, 3.0, 1.0))
    with pytest.raises(InputError, match="3 positive"):
        fit_power_law(x, np.array([1.0, -1.0, 0.0]))


def test_loss_power_law_recovers_planted_curve():
    a = np.geomspace(1, 1e4, 30)
    pl = loss_power_law(np.log10(a), 1.2 + 3.0 * a**-0.35)
    assert pl.alpha == pytest.approx(0.35, abs=1e-4)
    assert pl.params["L_inf"] == pytest.approx(1.2, abs=1e-3)
    assert pl.r2 > 0.9999


# -- the measured derivative and the scores -----------------------------------------------


def test_measured_derivative_is_exact_for_a_quadratic():
    x = np.sort(np.random.default_rng(0).uniform(0, 3, 25))
    loss = 5 - 1.3 * x + 0.2 * x**2
    np.testing.assert_allclose(measured_derivative(x, loss), 1.3 - 0.4 * x, atol=1e-9)
    np.testing.assert_allclose(measured_derivative(x, loss, smoothing=0.05), 1.3 - 0.4 * x, atol=1e-7)


@pytest.mark.parametrize(
    "x, loss, match",
    [([0, 1], [1, 2], "at least 3"), ([0, 2, 1], [1, 2, 3], "increasing"), ([0, 1, 2], [1, np.nan, np.nan], "finite loss")],
)
def test_measured_derivative_rejects_bad_input(x, loss, match):
    with pytest.raises(InputError, match=match):
        measured_derivative(np.array(x, float), np.array(loss, float))


def test_scores_by_hand():
    s = scores([1.0, 2.0, 4.0], [1.0, 2.0, 3.0])
    assert s["r2"] == pytest.approx(1 - 1 / 2)
    assert s["rel_l2"] == pytest.approx(1 / math.sqrt(14))


# -- reconstruction ------------------------------------------------------------------------


def test_planted_events_rebuild_the_planted_curve():
    ev = planted_events(20000, s=(0.05, 0.15))
    Y = planted_curves(ev)
    rec = reconstruct(X, Y.mean(axis=0), ev, n_boot=0)
    assert rec.r2_events > 0.999  # the truth, through the same estimator as the measurement
    assert rec.r2_spectrum > 0.95  # the delta approximation of sharp events
    assert rec.drop_share_events == pytest.approx(1.0, abs=1e-6)


def test_fitted_events_rebuild_a_noisy_curve():
    ev = planted_events(4000, s=(0.05, 0.15), lo=0.2, hi=2.8)
    Y = planted_curves(ev, noise=0.3)
    fit = fit_sigmoids(X, Y).to_dict()
    got = events_from_fit(fit)
    rec = reconstruct(X, Y.mean(axis=0), got, n_boot=0)
    assert rec.r2_events > 0.95 and rec.r2_spectrum > 0.9
    assert 0.9 < rec.drop_share_events < 1.1


def test_reconstruction_is_invariant_to_token_order():
    ev = planted_events(3000)
    Y = planted_curves(ev, noise=0.1)
    perm = np.random.default_rng(3).permutation(3000)
    shuffled = Events(np.argsort(perm)[ev.token], ev.mu, ev.s, ev.delta, ev.n_tokens, ev.x_range)
    a = reconstruct(X, Y.mean(axis=0), ev, n_boot=0)
    b = reconstruct(X, Y[perm].mean(axis=0), shuffled, n_boot=0)
    assert a.r2_events == pytest.approx(b.r2_events, abs=1e-12)
    assert a.r2_spectrum == pytest.approx(b.r2_spectrum, abs=1e-12)


def test_never_scored_tokens_change_nothing():
    """Tokens never observed (padding in an imported losses.npz) are not in the measured mean
    (a mean that skips NaN), so they are not in the N the events are divided by either: with
    as many padded tokens as real ones, the reconstruction and the spectrum are the same (they
    were halved: R^2 0.42 instead of 1, half the drop carried)."""
    ev = planted_events(2000, s=(0.05, 0.15), lo=0.2, hi=2.8)
    Y = planted_curves(ev, noise=0.1)
    padded = np.vstack([Y, np.full_like(Y, np.nan)])
    clean = events_from_fit(fit_sigmoids(X, Y).to_dict())
    got = events_from_fit(fit_sigmoids(X, padded).to_dict())
    assert got.n_tokens == 4000 and got.n_scored == 2000 == clean.n_scored
    a = reconstruct(X, np.nanmean(Y, axis=0), clean, n_boot=0)
    b = reconstruct(X, np.nanmean(padded, axis=0), got, n_boot=0)
    assert a.r2_events > 0.95
    for name in ("r2_events", "r2_spectrum", "drop_share_events", "drop_share_well_fitted"):
        assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-9), name
    assert b.spectrum.total_drop == pytest.approx(a.spectrum.total_drop, rel=1e-9)
    np.testing.assert_allclose(b.spectrum.density, a.spectrum.density, rtol=1e-9, atol=1e-12)


def test_a_bandwidth_below_the_floor_is_refused_and_no_rule_goes_below_it():
    """The spectrum's grid and bins grow as 1/h: an explicit 1e-5 ran for minutes and 1e-300
    ended in an internal error. Explicit values below MIN_BANDWIDTH are one InputError; the
    rules never return less (events of s = 1e-4: a step between two checkpoints)."""
    from tokdyn.spectrum import MIN_BANDWIDTH

    ev = planted_events(500, s=(1e-4, 2e-4))
    for bad in (1e-300, 1e-5, MIN_BANDWIDTH / 2):
        with pytest.raises(InputError, match="at least 0.001 decades"):
            select_bandwidth(ev, bad)
    assert select_bandwidth(ev, MIN_BANDWIDTH) == MIN_BANDWIDTH
    for rule in ("auto", "events", "widths", "silverman"):
        assert select_bandwidth(ev, rule) >= MIN_BANDWIDTH, rule


def test_clean_one_step_tokens_are_well_fitted_events():
    """A one-step token's two-sigmoid fit has a second event it cannot identify (singular); its
    events are as well fitted as its sigmoid (R^2 >= r2_min), so on clean planted single events
    the well-fitted events carry the drop the events carry (they carried 76 %)."""
    ev = planted_events(1500, s=(0.05, 0.15), lo=0.2, hi=2.8)
    Y = planted_curves(ev, noise=0.05)
    fit = fit_sigmoids(X, Y).to_dict()
    assert (fit["r2"] > 0.9).mean() > 0.95 and (fit["status2"] == 2).mean() > 0.05  # singular seconds
    rec = reconstruct(X, Y.mean(axis=0), events_from_fit(fit), n_boot=0)
    assert rec.drop_share_events > 0.97
    assert rec.drop_share_well_fitted > 0.97 * rec.drop_share_events


def test_the_bootstrap_in_groups_gives_the_same_interval(monkeypatch):
    """The resamples' multiplicities are held a group at a time (200 resamples of 2M tokens held
    3.2 GB at once); the grouping changes nothing. More than MAX_BOOT resamples is an error."""
    from tokdyn import spectrum as sp

    ev = planted_events(3000, s=(0.05, 0.15))
    whole = sp.spectrum_power_law(ev, bandwidth=0.1, n_boot=40)
    monkeypatch.setattr(sp, "_BOOT_BYTES", 3000 * 7)  # groups of 7 resamples
    grouped = sp.spectrum_power_law(ev, bandwidth=0.1, n_boot=40)
    assert (grouped.alpha, grouped.alpha_lo, grouped.alpha_hi) == (whole.alpha, whole.alpha_lo, whole.alpha_hi)
    assert np.isfinite(whole.alpha_lo) and whole.alpha_lo < whole.alpha < whole.alpha_hi
    with pytest.raises(InputError, match="n_boot must be an int from 0 to 10000"):
        sp.spectrum_power_law(ev, bandwidth=0.1, n_boot=sp.MAX_BOOT + 1)


def test_tokens_observed_too_few_times_are_scored_tokens():
    """A token seen at 5 points is not fitted (too_few_points) but is in the measured mean: its
    observed points stay in the fit's fields and it counts in N (it was left out of N when the
    unfitted rows' n_points were overwritten with 0)."""
    ev = planted_events(200, s=(0.05, 0.15), lo=0.2, hi=2.8)
    Y = planted_curves(ev, noise=0.05)
    Y[100:, 5:] = np.nan  # tokens 100-199 seen at their first 5 points only
    for backend in ("numba", "numpy"):
        fit = fit_sigmoids(X, Y, backend=backend).to_dict()
        assert (fit["n_points"][100:] == 5).all() and np.allclose(fit["x_last"][100:], X[4])
        assert (fit["status"][100:] == 4).all()  # too_few_points
        assert events_from_fit(fit).n_scored == 200
    Y[:10] = np.nan  # never observed at all: not scored
    assert events_from_fit(fit_sigmoids(X, Y).to_dict()).n_scored == 190
