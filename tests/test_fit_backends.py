"""Backends agree with each other, and results do not depend on block size or row order."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tokdyn.errors import InputError
from tokdyn.fit import FIT_FIELDS, FitOptions, available_backends, fit_block, fit_sigmoids
from tokdyn.fit.backends import resolve_backend
from tokdyn.fit.prepare import prepare
from tokdyn.fit.synthetic import plant_sigmoids, plant_two_steps

X = np.linspace(1.0, 5.0, 50)

# Fitted parameters agree to these (they are the same optimum reached along slightly
# different roundings: numba's exp differs from numpy's by < 2e-13 relative).
PARAM_FIELDS = ["l0", "linf", "mu", "s", "sse", "r2", "bic_sigmoid"]


def _mixed(n_each: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    Y = np.concatenate([
        plant_sigmoids(n_each, X, rng=rng).Y,
        plant_two_steps(n_each, X, rng=rng).Y,
        5.0 + rng.standard_normal((n_each, X.size)),
    ])
    Y[rng.random(Y.shape) < 0.05] = np.nan  # missing points
    Y[3] = np.nan  # one empty trajectory
    Y[4, :3] = 2.0
    Y[4, 3:] = np.nan  # too few points
    Y[5, 7] = np.inf  # invalid
    return Y


def _assert_same(a: dict, b: dict, rtol: float = 1e-6) -> None:
    assert set(a) == set(b) == set(FIT_FIELDS)
    for name in ("status", "class_code", "model", "n_points"):
        mismatch = np.flatnonzero(a[name] != b[name])
        assert mismatch.size <= 0.02 * len(a[name]), (name, mismatch)
    same = (a["status"] == b["status"]) & (a["status"] <= 1)
    for name in PARAM_FIELDS:
        np.testing.assert_allclose(a[name][same], b[name][same], rtol=rtol, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_backend_matches_numpy(backend):
    if backend not in available_backends():
        pytest.skip(f"{backend} not installed")
    Y = _mixed()
    ref = fit_block(X, Y, backend="numpy")
    other = fit_block(X, Y, backend=backend)
    _assert_same(ref, other)
    for name in ("status", "n_points", "x_first", "x_last"):  # bad rows: identical verdicts
        np.testing.assert_array_equal(ref[name][:6], other[name][:6])


def test_numba_prepare_matches_numpy():
    pytest.importorskip("numba")
    from tokdyn.fit.backends import prepare_rows

    Y = _mixed()
    Y[6, 10] = -1.0  # negative: invalid
    Y[7, 11] = 1e9  # huge: invalid
    a = prepare(X, Y, FitOptions())
    b = prepare_rows(X, Y, FitOptions(), "numba")
    for name in a:
        np.testing.assert_allclose(np.asarray(a[name], float), np.asarray(b[name], float),
                                   rtol=1e-12, atol=1e-12, err_msg=name)


def test_fast_exp_accuracy():
    pytest.importorskip("numba")
    from tokdyn.fit.numba_kernels import exp_approx

    z = np.linspace(-50, 50, 200_001)
    assert np.max(np.abs(exp_approx(z) / np.exp(z) - 1)) < 2e-13


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_block_size_and_row_order_invariance(backend):
    if backend not in available_backends():
        pytest.skip(f"{backend} not installed")
    Y = _mixed(30)
    whole = fit_sigmoids(X, Y, backend=backend).to_dict()
    blocks = fit_sigmoids(X, Y, backend=backend, block_rows=7).to_dict()
    perm = np.random.default_rng(1).permutation(len(Y))
    shuffled = fit_sigmoids(X, Y[perm], backend=backend).to_dict()
    for name in FIT_FIELDS:
        np.testing.assert_allclose(whole[name], blocks[name], rtol=1e-12, err_msg=name)
        np.testing.assert_allclose(whole[name][perm], shuffled[name], rtol=1e-12, err_msg=name)


@pytest.mark.parametrize("backend", [b for b in ("numpy", "torch") if b in available_backends()])
def test_missing_points_are_skipped_not_zero(backend):
    # Dropping columns from x and Y is the same as marking them NaN (the batched backends
    # make their masks from the NaN where they solve: backends._observed_rows).
    Y = plant_sigmoids(30, X, rng=np.random.default_rng(4)).Y
    keep = np.ones(X.size, bool)
    keep[::3] = False
    Y_nan = Y.copy()
    Y_nan[:, ~keep] = np.nan
    a = fit_sigmoids(X, Y_nan, backend=backend)
    b = fit_sigmoids(X[keep], Y[:, keep], backend=backend)
    # The same optimum; the paths differ (the start grid's s follows the spacing of x), so
    # the solvers stop within their tolerance of it, not bit for bit.
    for name in ("l0", "linf", "mu", "s", "sse", "n_points", "l0_se", "mu_se", "sse2"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-6,
                                   err_msg=name)


def test_resolve_backend():
    assert resolve_backend("numpy") == ("numpy", None)
    name, _ = resolve_backend("auto")
    assert name in available_backends()
    with pytest.raises(InputError, match="backend"):
        resolve_backend("jax")
    with pytest.raises(InputError, match="device"):
        resolve_backend("numpy", device="cpu")


@pytest.mark.skipif("torch" not in available_backends(), reason="torch not installed")
def test_torch_cuda_matches_numpy():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    Y = _mixed(200)
    _assert_same(fit_block(X, Y, backend="numpy"), fit_block(X, Y, backend="torch",
                                                               device="cuda"))


def test_auto_falls_back_to_numpy_without_numba(monkeypatch):
    from tokdyn.fit import backends

    monkeypatch.setattr(backends, "_has", lambda module: module != "numba")
    monkeypatch.setattr(backends, "_cuda_available", lambda: False)
    assert backends.resolve_backend("auto") == ("numpy", None)
    assert "numba" not in backends.available_backends()
    with pytest.raises(InputError, match="not installed"):
        backends.resolve_backend("numba")
    Y = plant_sigmoids(5, X, rng=np.random.default_rng(0)).Y
    assert fit_block(X, Y)["status"].tolist() == [0] * 5  # and the fit still runs (numpy)


def test_threads_share_the_fit():
    # dask's threads scheduler calls fit_block from several threads at once
    from concurrent.futures import ThreadPoolExecutor

    Y = plant_sigmoids(64, X, rng=np.random.default_rng(8)).Y
    ref = fit_block(X, Y)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: fit_block(X, Y), range(8)))
    for out in outs:
        np.testing.assert_array_equal(out["mu"], ref["mu"])


@settings(max_examples=40, deadline=None)
@given(p=hs.sampled_from([2, 4, 7]), log_cond=hs.floats(0.0, 8.0), seed=hs.integers(0, 2**32 - 1))
def test_inverse_diagonal_is_the_inverse_matrix_diagonal(p, log_cond, seed):
    """Standard errors' diag(A^-1) on both host paths (numba's triangular inverse, numpy's
    solves) against numpy's inverse, on SPD matrices of condition up to 1e8; matrices that
    are not positive definite or not finite are flagged, not answered."""
    from tokdyn.fit.backends import inverse_diagonal

    rng = np.random.default_rng(seed)
    B = 12
    Qm = np.linalg.qr(rng.normal(size=(B, p, p)))[0]
    eig = 10.0 ** rng.uniform(0.0, log_cond, (B, p))
    eig[:, 0] = 1.0
    eig[:, -1] = 10.0 ** log_cond
    A = np.einsum("bij,bj,bkj->bik", Qm, eig, Qm)
    A = 0.5 * (A + A.transpose(0, 2, 1))
    A[1] = -A[1]  # negative definite
    A[2, 0, 0] = np.nan
    A[3] = np.outer(np.arange(1.0, p + 1), np.arange(1.0, p + 1))  # rank 1
    want = np.diagonal(np.linalg.inv(A[4:]), axis1=1, axis2=2)
    for backend in [b for b in ("numba", "numpy") if b in available_backends()]:
        with np.errstate(all="ignore"):  # as fit_block calls it: the bad matrices overflow
            got, ok = inverse_diagonal(A, backend)
        assert ok[0] and ok[4:].all() and not ok[1:4].any(), backend
        assert np.isnan(got[1:4]).all(), backend
        np.testing.assert_allclose(got[4:], want, rtol=1e-13 * 10.0 ** log_cond + 1e-12)


def _reference_counts(flags: dict) -> int:
    """How many calls to numba's reference counting a small kernel makes under ``flags``: a
    loop passing views of a scratch matrix's rows to another kernel, as the solvers do."""
    import re

    from numba import njit

    flags = dict(flags, cache=False)  # inspect_llvm needs code compiled in this process

    @njit(**flags)
    def inner(row, k):
        return row[k] if row[k] > 0 else row[0]

    @njit(**flags)
    def outer(buf, j, k):
        s = 0.0
        for i in range(j):
            s += inner(buf[i], k)
        return s

    assert outer(np.arange(12.0).reshape(3, 4), 3, 2) == 2.0 + 6.0 + 10.0
    ir = "\n".join(f.inspect_llvm(f.signatures[0]) for f in (outer, inner))
    return len(re.findall(r"call [^\n]*@NRT_(?:incref|decref)", ir))


def test_solver_kernels_count_no_references():
    """The kernels that allocate nothing are compiled without numba's runtime
    (numba_kernels._KERNEL): its reference counts on every argument and view were a third of
    the two-sigmoid solver's time. Under those flags a kernel makes none; the control, the
    same kernel with the runtime, makes some (so the count can see them)."""
    pytest.importorskip("numba")
    from tokdyn.fit import numba_kernels

    assert numba_kernels._KERNEL.get("_nrt") is False  # this numba has the flag
    assert _reference_counts(numba_kernels._JIT) > 0
    assert _reference_counts(numba_kernels._KERNEL) == 0


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_fit_restarted_at_its_optimum_takes_no_step(backend):
    """A step that predicts a gain within ftol ends the fit before its trial point is
    evaluated: restarted from its own optimum, a fit makes no trial step and returns its
    start (every fit would make at least one without that rule): mu and s as given, the
    levels and SSE to the rounding of s's trip through ln s (the solvers' parameter)."""
    from tokdyn.fit.backends import run_lm
    from tokdyn.fit.lm import LM_CONVERGED, MODEL_SIGMOID

    if backend not in available_backends():
        pytest.skip(f"{backend} not installed")
    planted = plant_sigmoids(200, X, rng=np.random.default_rng(3))
    t = planted.truth
    p0 = np.stack([t["linf"] + t["delta"], t["linf"], t["mu"], t["s"]], axis=1)
    B = len(p0)
    lo = np.tile([0.0, 0.0, X[0] - 2.0, 0.01], (B, 1))
    hi = np.tile([50.0, 50.0, X[-1] + 2.0, 10.0], (B, 1))
    kw = dict(max_iter=100, ftol=1e-10, xtol=1e-10, backend=backend)
    first = run_lm(MODEL_SIGMOID, X, planted.Y, p0, lo, hi, **kw)
    assert np.all(first["status"] == LM_CONVERGED) and np.all(first["n_iter"] >= 1)
    again = run_lm(MODEL_SIGMOID, X, planted.Y, first["p"], lo, hi, **kw)
    assert np.all(again["status"] == LM_CONVERGED)
    still = again["n_iter"] == 0
    assert still.mean() > 0.9, np.bincount(again["n_iter"])
    np.testing.assert_array_equal(again["p"][still, 2:], first["p"][still, 2:])
    np.testing.assert_allclose(again["p"][still, :2], first["p"][still, :2], rtol=1e-13)
    np.testing.assert_allclose(again["sse"][still], first["sse"][still], rtol=1e-13)


@functools.cache
def _solver_pair():
    """A compiled harness running the generic solver (varpro._vp_lm) and its copy in scalars
    for that model (_vp_lm2: P = 2, one sigmoid; _vp_lm4: P = 4, two) on one row from one
    start: (sse, iterations, status, th, out[:24]) of each."""
    from numba import njit

    from tokdyn.fit import varpro

    @njit(cache=False)
    def run(x, y, th0, lo, hi, caps, bnd, max_iter, ftol):
        K, P = x.shape[0], th0.shape[0]
        Y = y.reshape(1, K)
        xo, yc, idx = np.empty(K), np.empty(K), np.empty(K, dtype=np.int64)
        n, mean, syy = varpro._gather(x, Y, 0, xo, yc, idx)
        buf = np.zeros((varpro._N_BUF, K))
        res = []
        for generic in (True, False):
            th = th0.copy()
            out, out_t = np.zeros(varpro._OUT_SIZE), np.zeros(varpro._OUT_SIZE)
            if generic:
                work, L3 = np.zeros((5, P)), np.zeros((2, P, P))
                s, it, st = varpro._vp_lm(P, xo, yc, n, syy, th, lo, hi, max_iter, ftol, 1e-10,
                                          buf, out, out_t, work, L3, caps, 0.1, bnd, mean)
            elif P == 2:
                s, it, st = varpro._vp_lm2(xo, yc, n, syy, th, lo, hi, max_iter, ftol, 1e-10,
                                           buf, out, out_t, caps, 0.1, bnd[0], mean)
            else:
                s, it, st = varpro._vp_lm4(xo, yc, n, syy, th, lo, hi, max_iter, ftol, 1e-10,
                                           buf, out, out_t, caps, 0.1, bnd, mean)
            res.append((s, it, st, th, out[:24].copy()))
        return res[0], res[1]

    return run


@settings(max_examples=80, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1), events=hs.sampled_from([1, 2]),
       missing=hs.floats(0.0, 0.5), floor=hs.sampled_from([-np.inf, 0.0, 2.5]),
       max_iter=hs.sampled_from([1, 3, 100]), ftol=hs.sampled_from([1e-10, 1e-4]),
       cap=hs.floats(0.01, 2.0))
def test_the_solvers_in_scalars_are_the_generic_solver(seed, events, missing, floor, max_iter,
                                                       ftol, cap):
    """varpro._vp_lm2 and _vp_lm4 (one and two sigmoids, their state in scalars) make the
    generic solver's steps (_vp_lm with P = 2 and 4) to the bit: the same optimum,
    iterations, status and evaluation, on planted events, noise and flat rows with missing
    points, active level floors and drop bounds, parameter bounds met, trust regions that cut
    every step, and fits stopped at max_iter."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(seed)
    kind = rng.integers(4)
    if kind == 0:
        y = plant_sigmoids(1, X, rng=rng, noise=float(rng.uniform(0.01, 1.0))).Y[0]
    elif kind == 1:
        y = plant_two_steps(1, X, rng=rng).Y[0]
    elif kind == 2:
        y = 3.0 + rng.standard_normal(X.size)
    else:
        y = np.full(X.size, 2.0) + 1e-9 * rng.standard_normal(X.size)
    y[rng.random(X.size) < missing] = np.nan
    lo = np.tile([X[0] - rng.uniform(0.0, 1.0), np.log(rng.uniform(0.005, 0.05))], events)
    hi = np.tile([X[-1] + rng.uniform(0.0, 1.0), np.log(rng.uniform(0.5, 8.0))], events)
    th0 = rng.uniform(lo - np.array([0.5, 0.0] * events), hi + np.array([0.5, 0.0] * events))
    caps = np.tile([cap, 3.0 * cap], events)
    drop = rng.choice([np.inf, 4.0, 0.5])
    bnd = np.array([floor, -drop, drop, -drop, drop])
    generic, scalars = _solver_pair()(X, y, th0, lo, hi, caps, bnd, max_iter, ftol)
    for a, b in zip(generic, scalars):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_trust_region_widens_to_its_bound_and_no_further(backend):
    """The trust region (half a start-grid cell) widens while its capped steps are predicted
    well, to RADIUS_MAX times its size: from a start DIST away in mu with a cap of CAP per
    step, a noise-free event is reached exactly in fewer than DIST / CAP steps (the fixed
    cap's least count) and in no fewer than DIST / (RADIUS_MAX CAP)."""
    from tokdyn.fit.backends import run_lm
    from tokdyn.fit.lm import LM_CONVERGED, MODEL_SIGMOID, RADIUS_MAX
    from tokdyn.fit.sigmoid import sigmoid_curve

    if backend not in available_backends():
        pytest.skip(f"{backend} not installed")
    dist, cap = 1.0, 0.02
    mu = np.array([3.2, 3.5, 3.8])
    Y = sigmoid_curve(X[None, :], 6.0, 2.0, mu[:, None], 0.5)
    B = len(mu)
    p0 = np.stack([np.full(B, 6.0), np.full(B, 2.0), mu - dist, np.full(B, 0.5)], 1)
    lo = np.tile([0.0, 0.0, X[0] - 2.0, 0.01], (B, 1))
    hi = np.tile([50.0, 50.0, X[-1] + 2.0, 10.0], (B, 1))
    res = run_lm(MODEL_SIGMOID, X, Y, p0, lo, hi, max_iter=200, ftol=1e-10, xtol=1e-10,
                 backend=backend, step_max=np.tile([cap, 5.0], (B, 1)))
    assert np.all(res["status"] == LM_CONVERGED)
    np.testing.assert_allclose(res["p"][:, 2], mu, atol=1e-6)
    assert np.all(res["n_iter"] >= dist / (RADIUS_MAX * cap)), res["n_iter"]
    assert np.all(res["n_iter"] < dist / cap), res["n_iter"]
