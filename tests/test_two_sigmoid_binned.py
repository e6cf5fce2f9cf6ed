"""pipelines/two_sigmoid_binned.py: its figures compare the record's own fit with the variant.

The measurement means something only if its record stage is the full record's two-sigmoid fit
(to the bit), its binning is the plain average of adjacent pairs, and its polish only ever
improves on the point it starts from.
"""

from __future__ import annotations

import numpy as np
import pytest

from tokdyn.fit import FitOptions, fit_sigmoids
from tokdyn.fit.synthetic import plant_two_steps

import pipeline_scripts

binned = pipeline_scripts.load("two_sigmoid_binned")

X = np.log10(np.geomspace(10.0, 1e5, 60))


def _rows(n=150):
    return pipeline_scripts.planted_rows(X, n)


def _record(Y, options):
    prep = binned._prepared(X, Y, options)
    p1 = binned._block._fit_sigmoid(binned._block._Solver(X, options, "numba", None), Y, prep)[0]["p"]
    return prep, p1, binned.record_stage(X, Y, options, p1, prep)


def test_binning_averages_adjacent_pairs_and_keeps_an_odd_last_point():
    x = np.array([0.0, 1.0, 2.0, 4.0, 7.0])
    Y = np.array([[1.0, 3.0, 5.0, np.nan, 9.0],
                  [np.nan, np.nan, 2.0, 6.0, np.nan]])
    xb, Yb = binned.binned(x, Y)
    assert np.array_equal(xb, [0.5, 3.0, 7.0])
    np.testing.assert_array_equal(Yb, [[2.0, 5.0, 9.0], [np.nan, 4.0, np.nan]])
    xe, Ye = binned.binned(x[:4], Y[:, :4])
    assert np.array_equal(xe, [0.5, 3.0]) and Ye.shape == (2, 2)


def test_the_record_stage_is_the_full_records_two_sigmoid_fit_to_the_bit():
    Y = _rows()
    options = FitOptions()
    full = fit_sigmoids(X, Y, backend="numba", options=options)
    assert np.array_equal(_record(Y, options)[2]["sse"], full.sse2)


def test_a_polish_never_ends_above_its_start():
    Y = _rows()
    options = FitOptions()
    prep, _, record = _record(Y, options)
    again = binned.polish(X, Y, options, record["p"], prep, options.max_iter)
    assert np.all(again["sse"] <= record["sse"] * (1 + 1e-9))


def test_the_figures_count_the_records_two_sigmoid_rows():
    Y = plant_two_steps(200, X, rng=np.random.default_rng(5)).Y
    (row,) = binned.compare(X, Y, "two-step", polish_iters=(100,), repeats=1)
    full = fit_sigmoids(X, Y, backend="numba")
    assert row["two_sigmoid_rows"] == int((full.model == 3).sum()) > 100
    assert row["same_optimum_frac"] + row["worse_frac"] + row["better_frac"] == pytest.approx(1.0)
    assert row["two_sigmoid_rows_lost"] <= row["two_sigmoid_rows"]
