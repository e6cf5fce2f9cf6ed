"""The fit on real trajectories, and variable projection against independent answers.

tests/data/tiny_gpt_real.npz: 1000 probe tokens (chosen at random, seed 0) of a tiny GPT
trained 400 steps on the standard library with the recorder on (``record_tiny_run``,
26 log-spaced checkpoints after step 0, float32 losses), and for each the least sigmoid sum
of squares of many starts (:func:`tokdyn.fit.reference.multistart_sigmoid`: a 120 x 40
dense grid polished by scipy from its 3 best minima, plus 21 researcher starts, 7 mu x 3 s),
computed once with scipy in the fit's box.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tokdyn.fit import FitOptions, available_backends, fit_sigmoids
from tokdyn.fit.grid import grid_start, row_grids, two_start
from tokdyn.fit.models import two_sigmoid_bounds
from tokdyn.fit.prepare import prepare
from tokdyn.fit.sigmoid import default_s_min
from tokdyn.fit.synthetic import plant_sigmoids, plant_two_steps

DATA = Path(__file__).parent / "data" / "tiny_gpt_real.npz"


def _real():
    d = np.load(DATA)
    return d["x"], d["Y"].astype(np.float64), d["ref_sse"]


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_real_trajectories_reach_the_multistart_optimum(backend):
    if backend not in available_backends():
        pytest.skip(f"{backend} not installed")
    x, Y, ref = _real()
    fit = fit_sigmoids(x, Y, backend=backend, two_step=False)
    best = np.minimum(ref, fit.sse)
    converged = fit.status == 0
    at_optimum = fit.sse <= best * (1 + 1e-3)
    assert converged.sum() > 800
    assert at_optimum[converged].mean() >= 0.995, np.flatnonzero(converged & ~at_optimum)
    assert at_optimum.mean() >= 0.99  # hit_bound and singular fits too


def test_stored_reference_matches_a_fresh_search():
    pytest.importorskip("scipy")
    from tokdyn.fit.reference import multistart_sigmoid

    x, Y, ref = _real()
    rows = np.arange(0, 1000, 100)
    prep = prepare(x, Y[rows], FitOptions())
    fresh = multistart_sigmoid(x, Y[rows], prep["lo"], prep["hi"], n_mu=60, n_s=20)
    assert np.all(ref[rows] <= fresh * (1 + 1e-9))


def test_projected_derivatives_match_finite_differences():
    pytest.importorskip("numba")
    from tokdyn.fit.varpro import _N_BUF, _OUT_SIZE, _vp_sigmoid

    x = np.linspace(1.0, 5.0, 60)
    pl = plant_sigmoids(5, x, rng=np.random.default_rng(3))
    buf = np.zeros((_N_BUF, x.size))
    for b in range(5):
        y = pl.Y[b]
        yc = y - y.mean()
        syy = float(yc @ yc)

        def F(th):
            out = np.zeros(_OUT_SIZE)
            return _vp_sigmoid(x, yc, x.size, syy, np.asarray(th, float), buf, out), out

        th = np.array([pl.truth["mu"][b] + 0.2, np.log(pl.truth["s"][b]) - 0.3])
        f0, out = F(th)
        eps = 1e-5
        grad = [(F(th + eps * e)[0] - F(th - eps * e)[0]) / (4 * eps) for e in np.eye(2)]
        np.testing.assert_allclose(out[3:5], grad, rtol=1e-5, atol=1e-7)
        # the matrix is the exact Hessian of F/2 where that is positive definite
        hess = np.array([[(F(th + eps * e)[1][3 + i] - F(th - eps * e)[1][3 + i]) / (2 * eps)
                          for e in np.eye(2)] for i in range(2)])
        if hess[0, 0] > 0 and np.linalg.det(hess) > 0:
            np.testing.assert_allclose(out[7:11].reshape(2, 2), hess, rtol=1e-4, atol=1e-6)
        # and F is the sum of squares of the best amplitudes
        g = 1.0 / (1.0 + np.exp((x - th[0]) / np.exp(th[1])))
        A = np.stack([np.ones_like(g), g], 1)
        coef = np.linalg.lstsq(A, y, rcond=None)[0]
        assert f0 == pytest.approx(float(np.sum((A @ coef - y) ** 2)), rel=1e-10)


def test_compiled_starts_match_numpy():
    pytest.importorskip("numba")
    from tokdyn.fit import varpro

    x = np.linspace(1.0, 5.0, 40)
    rng = np.random.default_rng(2)
    Y = np.concatenate([plant_sigmoids(60, x, rng=rng).Y, plant_two_steps(60, x, rng=rng).Y])
    Y[rng.random(Y.shape) < 0.05] = np.nan
    prep = prepare(x, Y, FitOptions())
    grid = row_grids(x, Y, default_s_min(x))
    a, b = grid_start(x, Y, prep["lo"], prep["hi"], *grid), varpro.grid_start_block(
        x, Y, prep["lo"], prep["hi"], *grid)
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, rtol=1e-9, atol=1e-12)
    lo, hi = two_sigmoid_bounds(prep["lo"], prep["hi"])
    p1 = prep["p0"]
    np.testing.assert_allclose(two_start(x, Y, p1, lo, hi, *grid),
                               varpro.two_start_block(x, Y, p1, lo, hi, *grid), rtol=1e-12)


@settings(max_examples=25, deadline=None)
@given(rows=hs.lists(hs.tuples(hs.integers(0, 4), hs.booleans()), min_size=2, max_size=24),
       seed=hs.integers(0, 2**32 - 1))
def test_compiled_two_start_shares_pair_forms_only_between_rows_that_miss_the_same_points(
        rows, seed):
    """Rows that miss the same points reuse one set of pair forms (a checkpoint lost for every
    token); a row with other points or another grid in between must not leave stale ones.
    Blocks of rows with 5 kinds of observed points (0: all) and two grids in a drawn order,
    against numpy's start and each row alone."""
    pytest.importorskip("numba")
    from tokdyn.fit import varpro

    x = np.linspace(1.0, 5.0, 30)
    rng = np.random.default_rng(seed)
    rows = (rows * 64)[:64]  # several rows per chunk (a chunk's rows share its scratch)
    n = len(rows)
    Y = np.concatenate([plant_sigmoids(n, x, rng=rng).Y[: n // 2],
                        plant_two_steps(n, x, rng=rng).Y[: n - n // 2]])
    missing = {1: [12], 2: [0, 7, 29], 3: [12, 13], 4: [3, 20]}  # 3, 4: as many, not the same
    for row, (m, _) in enumerate(rows):
        Y[row, missing.get(m, [])] = np.nan
    prep = prepare(x, Y, FitOptions())
    mus, ss = row_grids(x, Y, default_s_min(x))
    shifted = np.array([s for _, s in rows])
    mus[shifted] += 0.4  # another grid for the same points
    ss[shifted] *= 2.5
    lo, hi = two_sigmoid_bounds(prep["lo"], prep["hi"])
    p1 = prep["p0"]
    block = varpro.two_start_block(x, Y, p1, lo, hi, mus, ss)
    np.testing.assert_allclose(two_start(x, Y, p1, lo, hi, mus, ss), block, rtol=1e-12)
    for row in range(n):
        r = slice(row, row + 1)
        alone = varpro.two_start_block(x, Y[r], p1[r], lo[r], hi[r], mus[r], ss[r])
        assert alone.tobytes() == block[r].tobytes()


@settings(max_examples=8, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1))
def test_compiled_starts_of_a_row_do_not_depend_on_its_batch(seed):
    """Rows on one grid with the same observed points are projected onto it sixteen at a time
    (fully observed rows, and rows that all miss the same checkpoint), and fully observed
    rows' pairs scored four at a time; a row with other points or another grid sends its
    batch row by row. Each row's own box (drawn per row here) still decides which events it
    may use. Every row's grid start and two-sigmoid start are the bits of that row fitted
    alone."""
    pytest.importorskip("numba")
    from tokdyn.fit import varpro

    x = np.linspace(1.0, 5.0, 30)
    rng = np.random.default_rng(seed)
    n = 40 * 16  # rows per chunk (8 chunks per thread) >= a batch
    Y = np.concatenate([plant_sigmoids(n // 2, x, rng=rng).Y,
                        plant_two_steps(n // 2, x, rng=rng).Y])
    Y = Y[rng.permutation(n)]
    Y[rng.random(n) < 0.02, 7] = np.nan
    lost = slice(n // 4, n // 4 + 5 * 16 + 3)  # a checkpoint lost: whole batches and a part
    Y[lost, 12] = np.nan
    Y[n // 4 + rng.integers(0, 5 * 16, 3), 20] = np.nan  # three of them miss another point
    mus, ss = row_grids(x, Y, default_s_min(x))
    shifted = rng.random(n) < 0.02
    mus[shifted] += 0.4
    prep = prepare(x, Y, FitOptions())
    lo1, hi1 = prep["lo"], prep["hi"]
    lo1[:, 2] += rng.uniform(0.0, 1.5, n) * (rng.random(n) < 0.5)  # boxes that cut the grid
    hi1[:, 3] *= rng.uniform(0.2, 1.0, n)
    lo, hi = two_sigmoid_bounds(lo1, hi1)
    p1 = prep["p0"]
    starts = varpro.grid_start_block(x, Y, lo1, hi1, mus, ss)
    two = varpro.two_start_block(x, Y, p1, lo, hi, mus, ss)
    for row in range(n):
        r = slice(row, row + 1)
        alone = varpro.grid_start_block(x, Y[r], lo1[r], hi1[r], mus[r], ss[r])
        assert all(a.tobytes() == b[r].tobytes() for a, b in zip(alone, starts)), row
        alone = varpro.two_start_block(x, Y[r], p1[r], lo[r], hi[r], mus[r], ss[r])
        assert alone.tobytes() == two[r].tobytes(), row


def test_sigmoid_at_scipy_optimum_from_a_far_start():
    # variable projection from the grid reaches what scipy reaches from the truth
    scipy = pytest.importorskip("scipy.optimize")
    x = np.linspace(1.0, 5.0, 80)
    pl = plant_sigmoids(40, x, rng=np.random.default_rng(11))
    fit = fit_sigmoids(x, pl.Y, two_step=False)
    t = pl.truth
    for b in range(40):
        def res(p, y=pl.Y[b]):
            return p[1] + (p[0] - p[1]) / (1 + np.exp((x - p[2]) / p[3])) - y

        sol = scipy.least_squares(res, [t["l0"][b], t["linf"][b], t["mu"][b], t["s"][b]],
                                  method="lm", xtol=1e-12, ftol=1e-12)
        assert fit.sse[b] <= 2 * sol.cost * (1 + 1e-7)


def test_result_does_not_depend_on_batch_or_chunk_size():
    x = np.linspace(1.0, 5.0, 30)
    rng = np.random.default_rng(4)
    Y = np.concatenate([plant_sigmoids(50, x, rng=rng).Y, plant_two_steps(50, x, rng=rng).Y])
    whole = fit_sigmoids(x, Y).to_dict()
    for rows in (1, 13, 64):
        part = fit_sigmoids(x, Y, block_rows=rows).to_dict()
        for name, v in whole.items():
            np.testing.assert_array_equal(v, part[name], err_msg=name)
