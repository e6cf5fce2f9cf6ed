"""The event kernel's compiled binning (tokdyn._event_grid) against the dense numpy reference.

The reference, :func:`tokdyn.spectrum._node_blocks`, bins every event's whole sigmoid on every
node in closed form. The compiled one computes each event on a window of nodes (what lies
beyond goes to the window's ends) and a wide event on a coarser grid spread back by tents:
sharp events must come out as the reference's, every event's masses must add up to its seen
drop, and wide ones must keep their mean and change the smoothed spectrum by less than 0.1 %.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokdyn import _event_grid as eg
from tokdyn.spectrum import Events, _drop_blocks, _fine_grid, _node_blocks, _sigmoid, _smooth, learning_time_spectrum

LO, HI = 1.0, 5.0
N_FINE = 1 + 64 * 10  # spacing 0.00625 decades
DX = (HI - LO) / (N_FINE - 1)
FINE = LO + DX * np.arange(N_FINE)


def dense(mu, s, d) -> np.ndarray:
    """[E, F] the reference's masses."""
    ev = Events(np.arange(len(mu)), mu, s, d, len(mu), (LO, HI))
    return np.concatenate([m for _, m in _node_blocks(ev, FINE, DX)])


def compiled(mu, s, d, weights=None) -> np.ndarray:
    """[F] the compiled cells of the events together."""
    E = len(mu)
    return eg.event_cells(mu, s, d, np.zeros(E, np.int64), np.ones((1, 1), np.uint8), LO, DX, N_FINE,
                          event_weight=weights)[0]  # fmt: skip


def seen_drop(mu, s, d) -> np.ndarray:
    return d * (_sigmoid((HI - mu) / s) - _sigmoid((LO - mu) / s))


events = st.tuples(
    st.floats(LO - 6.0, HI + 6.0),  # centres in, near and far outside the range
    st.floats(-11.0, 1.0).map(lambda e: 10.0**e),  # widths from 1e-11 to 10 decades
    st.floats(-3.0, 6.0).filter(lambda v: abs(v) > 1e-3),  # drops (negative: a loss that rises)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, min_size=1, max_size=6))
def test_every_event_adds_up_to_its_seen_drop(evs):
    for mu, s, d in evs:
        got = compiled(np.array([mu]), np.array([s]), np.array([d]))
        want = seen_drop(np.array([mu]), np.array([s]), np.array([d]))[0]
        assert got.sum() == pytest.approx(want, rel=1e-12, abs=1e-12 * abs(d))


@settings(max_examples=200, deadline=None)
@given(st.lists(events.filter(lambda e: e[1] < eg.WIDTH_PER_SPACING * 2 * DX), min_size=1, max_size=8))
def test_events_on_the_fine_grid_are_the_reference_binning(evs):
    """Events narrow enough for the fine grid: the reference's masses, node by node (the
    window's lumped tails are below 2e-9 of a drop)."""
    mu, s, d = (np.array(v) for v in zip(*evs))
    assert np.all([eg._level_of(v, DX) == 0 for v in s])
    want = dense(mu, s, d).sum(axis=0)
    np.testing.assert_allclose(compiled(mu, s, d), want, rtol=0, atol=1e-8 * np.abs(d).sum())


@pytest.mark.parametrize("s", [0.2, 0.5, 1.5])
def test_a_wide_event_keeps_its_mass_and_mean_and_its_smoothed_shape(s):
    mu, d = np.array([3.1]), np.array([2.0])
    s = np.array([s])
    assert eg._level_of(s[0], DX) > 0  # binned on a coarser grid
    got, want = compiled(mu, s, d), dense(mu, s, d)[0]
    assert got.sum() == pytest.approx(want.sum(), rel=1e-12)
    if s[0] < 0.3:  # seen almost whole (the bounds 10 s away): the mean drop position kept
        assert (got * FINE).sum() == pytest.approx((want * FINE).sum(), rel=1e-8)
    h = 8 * DX
    x = np.linspace(LO, HI, 256)
    a, b = _smooth(got, DX, h, x, LO), _smooth(want, DX, h, x, LO)
    inner = (x > LO + 3 * h) & (x < HI - 3 * h)
    assert np.abs(a - b)[inner].max() < 1e-3 * b.max()
    # at a bound the coarse grid's half cell gets the drop's slope to first order only
    assert np.abs(a - b).max() < 2e-3 * b.max()


def test_the_spectrum_of_many_events_is_the_dense_one_within_a_thousandth():
    rng = np.random.default_rng(3)
    E = 4000
    mu = rng.uniform(LO - 1, HI + 1, E)
    s = 10.0 ** rng.uniform(-4, 0.3, E)  # sharp to wide, censored ones included
    d = rng.uniform(0.1, 3.0, E)
    ev = Events(np.arange(E), mu, s, d, E, (LO, HI))
    spec = learning_time_spectrum(ev, bandwidth=0.05)
    fine, dx = _fine_grid(0.05, (LO, HI), multiple=eg.GRID_MULTIPLE)
    cells = np.concatenate([m for _, m in _node_blocks(ev, fine, dx)]).sum(axis=0)
    want = _smooth(cells, dx, 0.05, spec.x, LO) / E
    assert np.abs(spec.density - want).max() < 1e-3 * want.max()
    assert spec.total_drop == pytest.approx(cells.sum() / E, rel=1e-12)


def test_weights_and_multiplicities_scale_each_event():
    rng = np.random.default_rng(0)
    E, N = 300, 100
    mu, s, d = rng.uniform(0, 6, E), 10.0 ** rng.uniform(-3, 0, E), rng.uniform(0.5, 2, E)
    token = rng.integers(0, N, E)
    mult = rng.poisson(1.0, (3, N)).astype(np.uint8)
    got = eg.event_cells(mu, s, d, token, mult, LO, DX, N_FINE)
    for r in range(3):
        w = mult[r, token].astype(np.float64)
        np.testing.assert_allclose(got[r], compiled(mu, s, d, weights=w), rtol=0, atol=1e-12 * d.sum())
        keep = w > 0  # an event counted w times is the event with w times its drop
        np.testing.assert_allclose(got[r], compiled(mu[keep], s[keep], d[keep] * w[keep]), rtol=0,
                                   atol=1e-12 * d.sum())  # fmt: skip


def test_the_bits_do_not_depend_on_the_threads():
    rng = np.random.default_rng(1)
    E = 5000
    mu, s, d = rng.uniform(0, 6, E), 10.0 ** rng.uniform(-3, 0, E), rng.uniform(0.5, 2, E)
    x = np.linspace(0, 6, 50)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = compiled(mu, s, d), eg.event_sums(eg.CURVE, mu, s, d, x)
        numba.set_num_threads(old)
        many = compiled(mu, s, d), eg.event_sums(eg.CURVE, mu, s, d, x)
    finally:
        numba.set_num_threads(old)
    assert all(np.array_equal(a, b) for a, b in zip(one, many))


def test_the_sums_at_points_are_the_numpy_formulas():
    rng = np.random.default_rng(2)
    E = 700
    mu, s, d = rng.uniform(-1, 7, E), 10.0 ** rng.uniform(-6, 1, E), rng.uniform(-1, 3, E)
    w = rng.uniform(0, 2, E)
    x = np.linspace(0.5, 5.5, 37)
    z = (x[None, :] - mu[:, None]) / s[:, None]
    g = _sigmoid(z)
    scale = np.abs(d).sum()
    np.testing.assert_allclose(eg.event_sums(eg.CURVE, mu, s, d, x), (d[:, None] * _sigmoid(-z)).sum(0),
                               rtol=0, atol=1e-12 * scale)  # fmt: skip
    np.testing.assert_allclose(eg.event_sums(eg.DERIVATIVE, mu, s, d, x),
                               (d[:, None] * g * (1 - g) / s[:, None]).sum(0), rtol=1e-10, atol=1e-12 * scale)  # fmt: skip
    ev = Events(np.arange(E), mu, s, d, E, (x[0], x[-1]))
    between = np.concatenate([b for _, b in _drop_blocks(ev, x)])
    np.testing.assert_allclose(eg.event_sums(eg.BETWEEN, mu, s, d, x, w), w @ between, rtol=0, atol=1e-12 * scale)


def test_the_fine_grid_has_whole_coarse_cells():
    for h in (0.001, 0.0123, 0.08, 0.5, 3.0):
        fine, dx = _fine_grid(h, (0.3, 4.7), multiple=eg.GRID_MULTIPLE)
        assert (fine.size - 1) % eg.GRID_MULTIPLE == 0 and dx <= h / 8 + 1e-15
        assert fine[0] == 0.3 and fine[-1] == pytest.approx(4.7, abs=1e-12)
    with pytest.raises(ValueError, match="multiple"):
        eg.event_cells([1.0], [0.1], [1.0], [0], np.ones((1, 1), np.uint8), LO, DX, N_FINE - 1)


def test_resamples_at_once_are_each_resample_alone():
    rng = np.random.default_rng(5)
    E, N = 2000, 900
    mu, s, d = rng.uniform(0, 6, E), 10.0 ** rng.uniform(-4, 0.5, E), rng.uniform(-0.5, 2, E)
    d[::50] = 0.0
    token = rng.integers(0, N, E)
    mult = rng.poisson(1.0, (7, N)).astype(np.uint8)
    got = eg.resample_cells(mu, s, d, token, mult, LO, DX, N_FINE)
    want = eg.event_cells(mu, s, d, token, mult, LO, DX, N_FINE)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(d).sum())
