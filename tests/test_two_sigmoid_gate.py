"""pipelines/two_sigmoid_gate.py: its stopped fits are the full record's, cut short.

The measurement compares each row's two-sigmoid sum of squares after k steps with the full
record's; it means something only if the stopped fit is the full record's own path: with the
full step budget it gives the record's SSE2 to the bit, with fewer steps never a lower one,
and the figures it prints count the planted two-step rows that a gate would lose.
"""

from __future__ import annotations

import numpy as np

from tokdyn.fit import FitOptions, fit_sigmoids
from tokdyn.fit.synthetic import plant_two_steps

import pipeline_scripts

gate = pipeline_scripts.load("two_sigmoid_gate")

X = np.log10(np.geomspace(10.0, 1e5, 100))


def _rows(n=200):
    return pipeline_scripts.planted_rows(X, n)


def test_the_full_step_budget_gives_the_records_two_sigmoid_fit_to_the_bit():
    Y = _rows()
    options = FitOptions()
    full = fit_sigmoids(X, Y, backend="numba", options=options)
    assert np.array_equal(gate.two_sigmoid_sse(X, Y, options, options.max_iter), full.sse2)


def test_fewer_steps_never_end_lower():
    Y = _rows()
    options = FitOptions()
    full = fit_sigmoids(X, Y, backend="numba", options=options).sse2
    for k in (1, 3):
        cut = gate.two_sigmoid_sse(X, Y, options, k)
        assert np.all(cut >= full)
        assert np.any(cut > full * 1.01)  # the cut is a real one on some rows


def test_the_figures_count_two_sigmoid_rows_a_gate_loses():
    Y = plant_two_steps(300, X, rng=np.random.default_rng(5)).Y
    rows = gate.gate_figures(X, Y, "two-step", ks=(1,), rs=(-np.inf,))
    # r = -inf stops every row the full fit took past one step: every such two-sigmoid row is lost
    full = fit_sigmoids(X, Y, backend="numba")
    expected = int(((full.model == 3) & (full.n_iter2 > 1)).sum())
    assert rows[0]["two_sigmoid_rows_lost"] == expected > 0
