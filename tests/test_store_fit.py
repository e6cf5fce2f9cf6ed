"""`tokdyn fit` over stores: planted events, scheduler/chunk invariance, resume, errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tokdyn
from tokdyn.cli import main
from tokdyn.errors import InputError, RunNotFoundError, StoreError
from tokdyn.fit import CLASS_CODES, FIT_FIELDS
from tokdyn.fit import job as fitjob
from tokdyn.fit.job import fit_run, read_fit

STEPS = np.concatenate([[0], np.unique(np.round(np.geomspace(1, 10_000, 40)).astype(int))])


def planted(n: int, seed: int = 0):
    """Trajectories with known sigmoid events on STEPS (step 0 included, as a recorder stores)."""
    rng = np.random.default_rng(seed)
    x = np.log10(np.maximum(STEPS, 1))
    mu = rng.uniform(1.0, 3.0, n)
    s = rng.uniform(0.08, 0.3, n)
    l0 = rng.uniform(4.0, 6.0, n)
    linf = rng.uniform(0.5, 2.0, n)
    Y = linf[:, None] + (l0 - linf)[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / s[:, None]))
    Y = (Y + rng.normal(0, 0.1, Y.shape)).clip(0.01).astype(np.float32)
    return Y, mu, s


def make_store(url, Y, *, token_chunk=None):
    n = Y.shape[0]
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(url, probe, mode="w")
    w = st.create_run("r", capacity=len(STEPS), token_chunk=token_chunk).writer()
    for j, step in enumerate(STEPS):
        w.append(Y[:, j], step=int(step))
    return st


@pytest.fixture(scope="module")
def data():
    return planted(3000)


def test_planted_events_recovered(tmp_path, data):
    Y, mu, s = data
    st = make_store(tmp_path / "a.zarr", Y, token_chunk=1000)
    res = fit_run(st.run("r"), progress=False)
    assert res.blocks == 3 and res.blocks_fitted == 3 and res.n_points == len(STEPS) - 1  # step 0 left out
    f = read_fit(st, "r")
    assert set(f) == set(FIT_FIELDS)
    assert np.median(np.abs(f["mu"] - mu)) < 0.03  # decades
    assert np.mean(f["class_code"] == CLASS_CODES["learned"]) > 0.9
    assert res.class_loss_share["learned"] > 0.9
    assert abs(sum(v for v in res.class_loss_share.values()) - 1) < 1e-9


def test_results_invariant_to_scheduler_and_chunking(tmp_path, data):
    Y = data[0][:1200]
    ref = None
    for i, (chunk, sched, batch) in enumerate([(400, "sync", 16384), (400, "threads", 100), (1200, "sync", 16384), (300, "processes", 16384)]):
        st = make_store(tmp_path / f"s{i}.zarr", Y, token_chunk=chunk)
        fit_run(st.run("r"), scheduler=sched, batch_rows=batch, progress=False, workers=2)
        f = read_fit(st, "r")
        if ref is None:
            ref = f
            continue
        for name in FIT_FIELDS:
            np.testing.assert_array_equal(f[name], ref[name], err_msg=f"{name} differs with chunk={chunk}, {sched}, batch={batch}")


def test_processes_scheduler_hands_each_worker_one_block_at_a_time(tmp_path, data, monkeypatch):
    """Each block is its own hand-over to a worker (dask batches 6 tasks to a worker by
    default: with 8 blocks and 2 workers one of them then idled), and a worker's kernels get
    its share of the cores."""
    from concurrent.futures import ThreadPoolExecutor

    handed = []

    class Pool(ThreadPoolExecutor):  # the worker processes, as threads that count hand-overs
        def submit(self, fn, *args, **kwargs):
            handed.append(args)
            return super().submit(fn, *args, **kwargs)

    made = []
    monkeypatch.setattr(fitjob, "_process_pool", lambda workers: made.append(workers) or Pool(workers))
    st = make_store(tmp_path / "p.zarr", data[0][:800], token_chunk=100)
    res = fit_run(st.run("r"), scheduler="processes", workers=2, progress=False)
    assert res.blocks_fitted == 8 and made == [2]
    assert len(handed) == 8  # one block each time

    monkeypatch.setenv("NUMBA_NUM_THREADS", "7")  # a value the user set stays
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    numba = pytest.importorskip("numba")
    before = numba.get_num_threads()
    try:
        fitjob._worker_threads(1)
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)
    assert os.environ["NUMBA_NUM_THREADS"] == "7" and os.environ["OMP_NUM_THREADS"] == "1"


def test_resume_after_interruption_fits_only_missing_blocks(tmp_path, data, monkeypatch):
    Y = data[0][:1000]
    ref_store = make_store(tmp_path / "ref.zarr", Y, token_chunk=200)
    fit_run(ref_store.run("r"), scheduler="sync", progress=False)
    ref = read_fit(ref_store, "r")

    st = make_store(tmp_path / "b.zarr", Y, token_chunk=200)
    real = fitjob.fit_block
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # the job is stopped while fitting the third block
        return real(*args, **kwargs)

    monkeypatch.setattr(fitjob, "fit_block", flaky)
    with pytest.raises(KeyboardInterrupt):
        fit_run(st.run("r"), scheduler="sync", progress=False)
    with pytest.raises(StoreError, match="incomplete"):
        read_fit(st, "r")
    monkeypatch.setattr(fitjob, "fit_block", real)
    res = fit_run(st.run("r"), scheduler="sync", progress=False)
    assert res.blocks_resumed == 2 and res.blocks_fitted == 3
    f = read_fit(st, "r")
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(f[name], ref[name], err_msg=name)


def test_stale_fit_needs_refit(tmp_path, data):
    Y = data[0][:300]
    st = make_store(tmp_path / "c.zarr", Y)
    fit_run(st.run("r"), progress=False)
    w = st.run("r").writer(resume=True)
    w.append(Y[:, -1], step=20_000)
    with pytest.raises(StoreError, match="refit"):
        fit_run(st.run("r"), progress=False)
    res = fit_run(st.run("r"), refit=True, progress=False)
    assert res.n_points == len(STEPS)  # the new row is used
    assert res.blocks_fitted == res.blocks


def test_fit_errors(tmp_path, data):
    st = make_store(tmp_path / "d.zarr", data[0][:50])
    with pytest.raises(RunNotFoundError):
        fit_run(st.run("nope"))
    with pytest.raises(InputError, match="scheduler"):
        fit_run(st.run("r"), scheduler="gpu-cluster")
    with pytest.raises(InputError, match="backend"):
        fit_run(st.run("r"), backend="jax")
    with pytest.raises(StoreError, match="not been fitted"):
        read_fit(st, "r")
    st.create_run("empty")
    with pytest.raises(StoreError, match="no committed rows"):
        fit_run(st.run("empty"))
    with pytest.raises(StoreError, match="read-only"):
        fit_run(tokdyn.open_store(tmp_path / "d.zarr", mode="r").run("r"))


def test_fit_results_readable_with_xarray(tmp_path, data):
    xr = pytest.importorskip("xarray")
    st = make_store(tmp_path / "e.zarr", data[0][:200])
    fit_run(st.run("r"), progress=False)
    ds = xr.open_zarr(st.url, group="runs/r/fit", consolidated=False)
    assert ds["mu"].dims == ("token",)
    np.testing.assert_array_equal(ds["mu"].values, read_fit(st, "r")["mu"])


def test_cli_fit(tmp_path, data, capsys):
    make_store(tmp_path / "f.zarr", data[0][:200])
    assert main(["fit", str(tmp_path / "f.zarr"), "--run", "r", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "learned" in out and "of the loss drop" in out
    assert main(["fit", str(tmp_path / "f.zarr"), "--run", "missing"]) == 1
    assert "no run 'missing'" in capsys.readouterr().err


def test_localcluster_matches_local(tmp_path, data):
    distributed = pytest.importorskip("distributed")
    Y = data[0][:600]
    ref_store = make_store(tmp_path / "ref.zarr", Y, token_chunk=200)
    fit_run(ref_store.run("r"), scheduler="sync", progress=False)
    st = make_store(tmp_path / "g.zarr", Y, token_chunk=200)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        res = fit_run(st.run("r"), scheduler=cluster.scheduler_address, progress=False)
    assert res.blocks_fitted == 3
    ref, f = read_fit(ref_store, "r"), read_fit(st, "r")
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(f[name], ref[name], err_msg=name)


def test_read_fit_refuses_a_stale_fit(tmp_path, data):
    Y = data[0][:100]
    st = make_store(tmp_path / "h.zarr", Y)
    fit_run(st.run("r"), progress=False)
    st.run("r").writer(resume=True).append(Y[:, -1], step=50_000)
    with pytest.raises(StoreError, match="--refit"):
        read_fit(st, "r")
