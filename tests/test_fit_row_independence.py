"""A row's fit depends on its own observed points only (hypothesis).

Start values (each row's grid over mu and s, the best step, the two-sigmoid pairs), trust
regions and the solver's sums are built from a row's observed points, so fitting a row inside
a block of other rows, with columns it never observed, gives what fitting that row alone on
its observed points gives. ``s_min`` is fixed here: by default it follows the spacing of the
block's whole axis, a bound shared by the block by design (docs/fitting.md, "Bounds").
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokdyn.fit import FIT_FIELDS, available_backends, fit_sigmoids

X = np.log10(np.geomspace(10, 100_000, 24))
OPTIONS = dict(s_min=0.01)
INT_FIELDS = [name for name, dt in FIT_FIELDS.items() if dt.kind == "i"]
SIGMOID_FIELDS = ["l0", "linf", "mu", "s", "delta", "sse", "r2", "mean", "line_slope"]
TWO_FIELDS = ["linf2", "delta1", "mu1", "s1", "delta2", "mu2", "s2", "sse2"]


def _trajectory(rng, *, two: bool) -> np.ndarray:
    mu = rng.uniform(X[0], X[-1])
    y = 1.0 + rng.uniform(0.5, 4.0) / (1.0 + np.exp((X - mu) / rng.uniform(0.02, 0.6)))
    if two:
        mu2 = rng.uniform(X[0], X[-1])
        y += rng.uniform(0.5, 2.0) / (1.0 + np.exp((X - mu2) / rng.uniform(0.05, 0.4)))
    return y + rng.normal(0.0, rng.uniform(0.01, 0.3), X.size)


@st.composite
def blocks(draw):
    """A row with some points missing, placed among other rows (their own missing points)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    row = _trajectory(rng, two=draw(st.booleans()))
    missing = draw(st.sets(st.integers(0, X.size - 1), max_size=X.size - 6))
    keep = np.array([k not in missing for k in range(X.size)])
    n_other = draw(st.integers(0, 6))
    others = np.array([_trajectory(rng, two=bool(b % 2)) for b in range(n_other)]
                      ).reshape(n_other, X.size)
    others[rng.random(others.shape) < draw(st.sampled_from([0.0, 0.1, 0.4]))] = np.nan
    # eight copies: the compiled kernels split a block into 8 chunks per thread and each chunk
    # keeps state from row to row (grids, pair forms); with a few rows every chunk holds one
    others = np.tile(others, (8, 1))
    at = draw(st.integers(0, len(others)))
    block = np.insert(others, at, np.where(keep, row, np.nan), axis=0)
    return row, keep, block, at


def _check(backend, case, fields, two_step):
    if backend not in available_backends():
        pytest.skip(f"{backend} not installed")
    row, keep, block, at = case
    alone = fit_sigmoids(X[keep], row[keep][None], backend=backend, two_step=two_step,
                         **OPTIONS)
    among = fit_sigmoids(X, block, backend=backend, two_step=two_step, **OPTIONS)
    for name in INT_FIELDS:
        assert getattr(among, name)[at] == getattr(alone, name)[0], name
    for name in fields:
        a, b = getattr(among, name)[at], getattr(alone, name)[0]
        if backend == "numba":  # every sum runs over the row's gathered points: the same bits
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:  # the constant and line fits' sums are numpy's pairwise ones
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=blocks())
def test_a_rows_sigmoid_depends_on_its_observed_points_only(backend, case):
    _check(backend, case, SIGMOID_FIELDS, two_step=False)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=blocks())
def test_a_rows_full_record_depends_on_its_observed_points_only(case):
    # the compiled backend computes every start and sum over the row's gathered points
    _check("numba", case, SIGMOID_FIELDS + TWO_FIELDS, two_step=True)
