"""Hunt 25, the measured derivative's default width (tokdyn.reconstruct.default_smoothing).

The width was 1.5 x the median spacing of the log axis: on a grid dense in one part (Pythia's
checkpoints, every step then a few) it was that part's width everywhere and the measured
-dL/dlog10 step mostly noise. Now at least 1.25 x the mean spacing; grids with mean / median
spacing up to 1.2 (log-uniform ones, the demo's) keep the old width bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from pipeline_scripts import load
from tokdyn.reconstruct import default_smoothing, measured_derivative, scores
from tokdyn.schedule import geometric_schedule

check = load("smoothing_check")
GRIDS = check.grids()


def old_width(x) -> float:
    return 1.5 * float(np.median(np.diff(x)))


@pytest.mark.parametrize("name, bound", [("Pythia (1..143,000)", 0.95), ("dense-then-sparse (1..199, 8 to 1e6)", 0.8)])
def test_uneven_grids_measure_the_planted_derivative(name, bound):
    """Planted events on an uneven grid, 4000 tokens, noise 0.3 nats: the measured derivative is
    the planted one (R^2 >= bound on every seed). The median's width scored at most 0.75 and -2.6."""
    x = GRIDS[name]
    for seed in range(5):
        noisy, clean, exact = check.planted(x, seed=seed, tokens=4000, noise=0.3)
        assert scores(measured_derivative(x, clean), exact)["r2"] > 0.98  # the positive control: no noise
        assert scores(measured_derivative(x, noisy), exact)["r2"] >= bound, seed


@pytest.mark.parametrize("name", ["log-spaced (1..1e5, 40)", "demo (geometric 800, 40)"])
def test_even_grids_keep_the_old_width_bit_for_bit(name):
    x = GRIDS[name]
    assert default_smoothing(x) == old_width(x)
    noisy, _, _ = check.planted(x, seed=0, tokens=500, noise=0.5)
    assert np.array_equal(measured_derivative(x, noisy), measured_derivative(x, noisy, smoothing=old_width(x)))


@settings(max_examples=60, deadline=None)
@given(lo=hs.floats(-2, 6), span=hs.floats(0.5, 8), n=hs.integers(3, 300))
def test_log_uniform_grids_keep_the_old_width(lo, span, n):
    """Any log-uniform grid (mean = median spacing up to rounding): the old width, exactly."""
    x = np.linspace(lo, lo + span, n)
    assert default_smoothing(x) == old_width(x)


@settings(max_examples=60, deadline=None)
@given(last=hs.integers(100, 10**7), n=hs.integers(5, 40))
def test_geometric_schedules_keep_the_old_width_where_nearly_even(last, n):
    s = geometric_schedule(last, n)
    x = np.log10(s[s > 0].astype(float))
    d = np.diff(x)
    if d.mean() <= 1.2 * np.median(d):
        assert default_smoothing(x) == old_width(x)
    assert default_smoothing(x) >= 1.25 * d.mean() * (1 - 1e-12)  # never narrower than 1.25 mean gaps


def test_width_ignores_how_the_points_cluster():
    """The same span and count, points bunched at one end: the width never falls below 1.25x the
    even grid's spacing (it fell with the bunch's median)."""
    even = np.linspace(0, 5, 101)
    bunched = np.concatenate([np.linspace(0, 4, 6)[:-1], np.linspace(4, 5, 96)])
    assert default_smoothing(bunched) >= 1.25 * 0.05 - 1e-15 > old_width(bunched)
    assert default_smoothing(even) == old_width(even)
