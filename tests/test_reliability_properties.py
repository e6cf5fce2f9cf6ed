"""Property-based tests (hypothesis) of the store's read paths after crashes and of the fitter.

test_store_properties.py checks appends against a model of the accepted rows; test_fit_inputs.py
checks the fitter on random values and random sigmoids. Here: any slice a reader asks for equals
the same slice of the committed matrix whatever garbage a dead writer left past the commit, and
the fitter treats a missing (NaN) point exactly as a point that was never there.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokdyn
from reliability_fixtures import raw
from tokdyn.fit import fit_sigmoids

CONTEXT = 4


@st.composite
def committed_runs(draw):
    n_seq = draw(st.integers(1, 5))
    k = draw(st.integers(1, 6))
    chunk = CONTEXT * draw(st.integers(1, n_seq))
    dtype = draw(st.sampled_from(["float32", "float16", "float64"]))
    tail = draw(st.integers(0, 3))  # rows written by a writer killed before its commit
    values = draw(st.lists(st.floats(0, 20, width=16), min_size=n_seq * CONTEXT * k, max_size=n_seq * CONTEXT * k))
    a = draw(st.integers(0, n_seq * CONTEXT))
    b = draw(st.integers(a, n_seq * CONTEXT))
    r0 = draw(st.integers(0, k))
    r1 = draw(st.integers(r0, k + 2))
    block = draw(st.integers(1, n_seq * CONTEXT))
    return n_seq, k, chunk, dtype, tail, np.array(values).reshape(k, -1), slice(a, b), slice(r0, r1), block


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(committed_runs())
def test_every_read_path_sees_the_committed_matrix_only(tmp_path_factory, case):
    n_seq, k, chunk, dtype, tail, M, tokens, rows, block = case
    probe = tokdyn.ProbeSet.from_tokens(np.arange(n_seq * (CONTEXT + 1)).reshape(n_seq, CONTEXT + 1) % 257)
    st_ = tokdyn.open_store(tmp_path_factory.mktemp("r") / "s.zarr", probe, mode="a")
    run = st_.create_run("r", capacity=k + tail, dtype=dtype, token_chunk=chunk)
    with run.writer() as w:
        for j in range(k):
            w.append(M[j], step=10 * j + 1)
    for j in range(tail):  # a dead writer's rows: data and coordinates, never committed
        raw(st_, "runs/r/loss")[k + j, :] = -1.0
        raw(st_, "runs/r/step")[k + j] = 10_000 + j
    expected = M.astype(dtype)
    reader = tokdyn.open_store(st_.url, mode="r").run("r")
    np.testing.assert_array_equal(reader.losses(), expected)
    np.testing.assert_array_equal(reader.losses(tokens=tokens, rows=rows), expected[rows, tokens])
    np.testing.assert_array_equal(reader.to_dask(token_block=block).compute(), expected)
    ds = reader.to_xarray()
    np.testing.assert_array_equal(ds["loss"].values, expected)
    np.testing.assert_array_equal(ds["step"].values, 10 * np.arange(k) + 1)
    assert reader.steps.tolist() == (10 * np.arange(k) + 1).tolist()


X = np.log10(np.geomspace(1, 10_000, 14))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mu=st.floats(1.0, 3.0),
    s=st.floats(0.1, 0.6),
    drop=st.floats(0.5, 5.0),
    linf=st.floats(0.5, 3.0),
    missing=st.sets(st.integers(1, len(X) - 2), min_size=1, max_size=4),  # inside the observed range
    seed=st.integers(0, 2**16),
)
def test_a_missing_point_is_a_point_never_observed(mu, s, drop, linf, missing, seed):
    rng = np.random.default_rng(seed)
    y = linf + drop / (1 + np.exp((X - mu) / s)) + rng.normal(0, 0.05, X.size)
    keep = np.array([i not in missing for i in range(X.size)])
    with_nan = np.where(keep, y, np.nan)
    opts = dict(s_min=0.01, two_step=False)  # s_min fixed: by default it follows the grid's spacing
    a = fit_sigmoids(X, with_nan[None], backend="numpy", **opts)
    b = fit_sigmoids(X[keep], y[keep][None], backend="numpy", **opts)
    assert a.status[0] == b.status[0] and a.n_points[0] == b.n_points[0] == keep.sum()
    for name in ("l0", "linf", "mu", "s", "r2"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-6, atol=1e-8, err_msg=name)
