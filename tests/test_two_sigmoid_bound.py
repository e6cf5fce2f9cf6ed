"""pipelines/two_sigmoid_bound.py: the lower bound on the two-sigmoid sum of squares it measures.

The bound rests on two facts checked here against independent answers: a two-sigmoid curve
has at most three monotone pieces (dense evaluation of random curves), and the segment
regressions are scipy's isotonic regression; then on planted and real rows no fitted
two-sigmoid sum of squares falls below it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import isotonic_regression

from tokdyn.fit.models import two_sigmoid_curve

import pipeline_scripts

bound = pipeline_scripts.load("two_sigmoid_bound")

finite = dict(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(d1=st.floats(-5, 5, **finite), d2=st.floats(-5, 5, **finite), mu1=st.floats(-1, 5, **finite),
       mu2=st.floats(-1, 5, **finite), ls1=st.floats(-3, 0.5, **finite), ls2=st.floats(-3, 0.5, **finite))
def test_a_two_sigmoid_curve_has_at_most_three_monotone_pieces(d1, d2, mu1, mu2, ls1, ls2):
    x = np.linspace(-3.0, 7.0, 20_001)
    slope = np.diff(two_sigmoid_curve(x, 1.0, d1, mu1, np.exp(ls1), d2, mu2, np.exp(ls2)))
    tol = 1e-12 * (abs(d1) + abs(d2) + 1.0)
    signs = np.sign(slope[np.abs(slope) > tol])
    assert np.count_nonzero(signs[1:] != signs[:-1]) <= 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-10, 10, **finite), min_size=1, max_size=25))
def test_every_segments_monotone_regression_is_scipys(values):
    y = np.array(values)
    for sign in (1.0, -1.0):
        S = bound.segment_sse(y, sign)
        for a in range(len(y)):
            for b in range(a + 1, len(y) + 1):
                fit = isotonic_regression(y[a:b], increasing=sign > 0).x
                assert abs(S[a, b] - ((y[a:b] - fit) ** 2).sum()) <= 1e-9 * (1.0 + (y[a:b] ** 2).sum())


def test_no_fitted_two_sigmoid_sum_of_squares_is_below_the_bound():
    x = np.linspace(0.0, 4.0, 40)
    from tokdyn.fit.synthetic import plant_sigmoids, plant_two_steps

    rng = np.random.default_rng(3)
    for Y in (plant_sigmoids(150, x, rng=rng).Y, plant_two_steps(150, x, rng=rng).Y):
        out = bound.measure("planted", x, Y)
        assert out["sse2_below_bound"] == 0
        assert out["chosen_among_skipped"] == 0
    real = np.load(bound.REAL)
    out = bound.measure("real", real["x"], real["Y"][:300].astype(np.float64))
    assert out["sse2_below_bound"] == 0 and out["two_sigmoids_chosen"] > 0
