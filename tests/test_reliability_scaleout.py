"""Scale-out: the store's behaviour on a real S3 endpoint (moto's server on loopback, through
zarr's fsspec URLs and s3fs) equals its behaviour on a local disk, and a dask.distributed fit
survives a worker killed mid-job (dask reschedules its blocks) with results equal to a local fit.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import zarr

import tokdyn
from tokdyn.store import as_store
from reliability_fixtures import live_foreign_owner, put_lock, raw, s3_endpoint
from test_store import make_probe, row_values
from test_store_fit import make_store, planted
from tokdyn.errors import ProbeMismatchError, RunBusyError, RunExistsError, StepOrderError, StoreError
from tokdyn.fit import FIT_FIELDS
from tokdyn.fit.job import fit_run, read_fit
from tokdyn.interchange import export_npz, import_npz


@pytest.fixture(scope="module")
def s3():
    with s3_endpoint() as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def backend(request, tmp_path):
    """(url of a fresh store location, storage options) on each backend."""
    if request.param == "local":
        return str(tmp_path / "s.zarr"), None
    s3 = request.getfixturevalue("s3")
    # no [ ] in the key: fsspec reads them as a glob, and deletes would miss the object
    return f"s3://{s3['bucket']}/{request.node.originalname}-{time.time_ns()}", s3["storage_options"]


def _open(backend, probe=None, mode="a"):
    url, options = backend
    return tokdyn.open_store(url, probe, mode=mode, storage_options=options)


def test_append_read_resume_on_each_backend(backend):
    probe = make_probe()
    st = _open(backend, probe)
    run = st.create_run("r", capacity=2, token_chunk=2 * probe.context)
    with run.writer() as w:
        for s in (0, 1, 2, 4):
            w.append(row_values(s, probe.n_tokens), step=s, lr=s / 10)
        with pytest.raises(StepOrderError):
            w.append(row_values(4, probe.n_tokens), step=4)
        w.trim()
    with pytest.raises(RunExistsError):
        run.writer()
    with _open(backend, mode="r+").run("r").writer(resume=True) as w2:
        assert w2.last_step == 4
        w2.append(row_values(9, probe.n_tokens), step=9)
    again = _open(backend, mode="r").run("r")
    assert again.steps.tolist() == [0, 1, 2, 4, 9]
    np.testing.assert_array_equal(again.losses(), np.stack([row_values(s, probe.n_tokens) for s in (0, 1, 2, 4, 9)]))
    np.testing.assert_allclose(again.coord("lr")[:4], [0, 0.1, 0.2, 0.4])
    np.testing.assert_array_equal(again.to_dask(token_block=16).compute(), again.losses())
    assert again.to_xarray()["loss"].shape == (5, probe.n_tokens)
    info = _open(backend, mode="r").info()
    assert info["runs"]["r"]["shape"] == [5, probe.n_tokens] and info["size_bytes"] > 0
    with pytest.raises(ProbeMismatchError):
        _open(backend, make_probe(seed=9))


def test_uncommitted_rows_and_several_writers_on_each_backend(backend):
    probe = make_probe()
    c = probe.context
    st = _open(backend, probe)
    run = st.create_run("d", capacity=3, token_chunk=2 * c, writers=[(0, 2 * c), (2 * c, probe.n_tokens)])
    full = row_values(0, probe.n_tokens)
    run.writer(writer=0).append(full[: 2 * c], step=0)
    assert _open(backend, mode="r").run("d").n_committed == 0  # one token range is not a row
    run.writer(writer=1).append(full[2 * c :], step=0)
    raw(st, "runs/d/loss")[1, :] = 99.0  # a row written by a process that died before committing it
    reader = _open(backend, mode="r").run("d")
    assert reader.n_committed == 1 and reader.steps.tolist() == [0]
    np.testing.assert_array_equal(reader.losses(), full[None])


def test_writer_lock_and_damage_detection_on_each_backend(backend):
    probe = make_probe()
    st = _open(backend, probe)
    run = st.create_run("r", token_chunk=2 * probe.context)
    put_lock(st, "runs/r/commits/w0/writer.lock", live_foreign_owner())
    with pytest.raises(RunBusyError, match="refused rather than interleaved"):
        run.writer()
    run.break_lock()
    with run.writer() as w:
        for s in (0, 1):
            w.append(row_values(s, probe.n_tokens), step=s)
    from zarr.core.sync import sync

    sync(raw(st).store.delete("runs/r/loss/c/1/1"))  # a chunk object lost from the bucket
    with pytest.raises(StoreError, match="row 1: 16 losses read as missing"):
        _open(backend, mode="r").run("r").losses()


@pytest.mark.slow  # about 20 s on S3 (moto answers each request in milliseconds)
def test_fit_and_npz_round_trip_on_each_backend(backend, tmp_path, monkeypatch):
    import test_store_fit

    monkeypatch.setattr(test_store_fit, "STEPS", test_store_fit.STEPS[::4])  # 11 rows: S3 round trips are slow
    Y = planted(200)[0]
    url, options = backend
    local = make_store(tmp_path / "ref.zarr", Y, token_chunk=100)
    fit_run(as_store(local, mode="r+").run("r"), scheduler="sync", progress=False)
    export_npz(as_store(local).run("r"), tmp_path / "r.npz")
    assert import_npz(tmp_path / "r.npz", _create_for_npz(backend, Y), run="r").n_committed == Y.shape[1]
    res = fit_run(as_store(url, mode="r+", storage_options=options).run("r"), scheduler="threads", workers=2, progress=False)
    assert res.blocks == 1  # the imported run has the default chunking: one block
    ref, got = read_fit(local, "r"), read_fit(_open(backend, mode="r"), "r")
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


def _create_for_npz(backend, Y):
    n = Y.shape[0]
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    return _open(backend, probe)


# -- dask.distributed: a worker killed mid-job ------------------------------------------------


def test_distributed_fit_survives_a_worker_killed_mid_job(tmp_path):
    distributed = pytest.importorskip("distributed")
    Y = planted(3000, seed=4)[0]
    ref_store = make_store(tmp_path / "ref.zarr", Y, token_chunk=250)
    fit_run(ref_store.run("r"), scheduler="sync", progress=False)
    st = make_store(tmp_path / "d.zarr", Y, token_chunk=250)
    killed = {}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            pids = client.run(os.getpid)  # {worker address: pid}
            done = threading.Event()
            result = {}

            def fit():
                try:
                    result["res"] = fit_run(as_store(str(tmp_path / "d.zarr"), mode="r+").run("r"), scheduler=cluster.scheduler_address, progress=False)
                except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                    result["error"] = exc
                finally:
                    done.set()

            worker = threading.Thread(target=fit)
            worker.start()
            deadline = time.monotonic() + 120

            def fit_done():
                # Opened as an array, never "array or group": zarr.open reads the node's metadata
                # twice, and an array created between the two reads is then refused as a group.
                try:
                    return zarr.open_array(store=st.url, path="runs/r/fit/done", mode="r")[...]
                except (KeyError, FileNotFoundError, ValueError):  # not made yet, or its metadata half written
                    return np.zeros(1)

            while time.monotonic() < deadline and not done.is_set():
                busy = {a: ts for a, ts in client.processing().items() if ts}
                n_done = int(np.count_nonzero(fit_done()))
                if busy and n_done >= 1:  # mid-job: some blocks done, a worker busy with the next
                    addr = next(iter(busy))
                    killed.update(addr=addr, blocks_done=n_done, blocks=len(fit_done()))
                    os.kill(pids[addr], signal.SIGKILL)
                    break
                time.sleep(0.02)
            worker.join(180)
    assert "error" not in result, result.get("error")
    assert killed and killed["blocks_done"] < killed["blocks"], f"the worker was not killed mid-job: {killed}"
    ref, got = read_fit(ref_store, "r"), read_fit(tmp_path / "d.zarr", "r")
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
