"""Running `tokdyn fit` as on a real job (hunt 5): a scheduler address that fails, a cluster that
fails mid-fit, relative store paths on a cluster, a recorder appending while the fit runs, and a
refit landing as a fit ends. Each test failed before its fix (docs/fitting.md, "Fitting a store")."""

from __future__ import annotations

import os
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

import tokdyn
from reliability_fixtures import cli_error_line
from test_store_fit import STEPS, make_store, planted
from tokdyn.cli import main
from tokdyn.errors import ClusterError
from tokdyn.fit import FIT_FIELDS
from tokdyn.fit import job as fitjob
from tokdyn.fit.job import fit_run, read_fit

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def data():
    return planted(600)


def _fields_equal(got: dict, expected: dict) -> None:
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def _silent_server() -> tuple[str, socket.socket]:
    """A TCP server that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    held = []
    threading.Thread(target=lambda: held.append(s.accept()), daemon=True).start()
    return f"tcp://127.0.0.1:{s.getsockname()[1]}", s


# -- a refit whose cluster cannot be reached keeps the stored fit --------------------------------


@pytest.mark.parametrize("address", ["silent", "tcp://127.0.0.1:99999", "tcp://localhost", "http://127.0.0.1:8787"])
def test_a_refit_whose_scheduler_fails_keeps_the_stored_fit(address, tmp_path, data, capsys, monkeypatch):
    """`tokdyn fit --refit --scheduler ADDR` with an address that leads nowhere discarded the
    complete stored fit first and then failed on the address: the run was left with an
    unfinished fit that spectrum and report refuse. The cluster is now reached before the stored
    fit is touched."""
    monkeypatch.setattr(fitjob, "SCHEDULER_TIMEOUT", 1.0)
    path = str(tmp_path / "s.zarr")
    st = make_store(path, data[0][:200], token_chunk=100)
    fit_run(st.run("r"), scheduler="sync", progress=False)
    before, fit_id = read_fit(st, "r"), st.run("r").fit.meta["fit_id"]
    sock = None
    if address == "silent":
        address, sock = _silent_server()
    try:
        assert main(["fit", path, "--refit", "--axis-min", "10", "--scheduler", address, "--no-progress"]) == 1
    finally:
        if sock is not None:
            sock.close()
    assert address in cli_error_line(capsys.readouterr().err)
    run = tokdyn.open_store(path).run("r")
    assert run.fit.complete and run.fit.meta["fit_id"] == fit_id and run.fit.meta["axis_min"] is None
    _fields_equal(read_fit(path, "r"), before)


# -- an address that is no address is said to be one, at once -------------------------------------


@pytest.mark.parametrize("address, says", [
    ("tcp://127.0.0.1:99999", "port 99999 is not in 1..65535"),
    ("tcp://localhost", "missing port"),
    ("tcp://localhost:notaport", "invalid literal"),
    ("tcp://:8786", "no host"),
    ("http://127.0.0.1:8787", "scheme 'http' is none of dask's"),
    ("://", "scheme '' is none of dask's"),
])  # fmt: skip
def test_a_malformed_scheduler_address_is_named_as_such_at_once(address, says, tmp_path, data, capsys):
    """A port beyond 65535 was tried for the whole deadline (10 s) and then reported as a
    scheduler that "did not answer"; a missing port, a non-numeric one or a dashboard's http://
    address as "another service". Each is now what it is, before any connection is tried."""
    path = str(tmp_path / "s.zarr")
    make_store(path, data[0][:100])
    t0 = time.monotonic()
    assert main(["fit", path, "--scheduler", address, "--no-progress"]) == 1
    assert time.monotonic() - t0 < 5
    line = cli_error_line(capsys.readouterr().err)
    assert "a dask scheduler address is tcp://HOST:PORT" in line and says in line and repr(address) in line, line
    assert "did not answer" not in line and "another service" not in line
    assert not tokdyn.open_store(path).run("r").fit.meta  # nothing created


# -- the cluster's own failures are one line that says what happened ------------------------------


def test_a_block_that_kills_its_workers_is_one_line_not_a_bug_report(tmp_path, data, capsys, monkeypatch):
    """dask gives up on a task whose workers keep dying (out of memory) with KilledWorker; the
    command reported it as "internal error in tokdyn ... (a bug: please report it)". Now it says
    that the workers died, what to try, and that the blocks done are kept (a rerun resumes)."""
    from distributed import KilledWorker

    path = str(tmp_path / "s.zarr")
    st = make_store(path, data[0][:400], token_chunk=100)
    real, calls = fitjob._fit_one_block, []

    def dying(b, **kwargs):
        calls.append(b)
        if b == 2:
            raise KilledWorker(f"_fit_one_block-{b}", SimpleNamespace(address="tcp://127.0.0.1:1"), 3)
        return real(b, **kwargs)

    monkeypatch.setattr(fitjob, "_fit_one_block", dying)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        assert main(["fit", path, "--scheduler", cluster.scheduler_address, "--no-progress"]) == 1
        line = cli_error_line(capsys.readouterr().err)
        assert "internal error" not in line and "a bug" not in line
        assert "workers" in line and "died" in line and cluster.scheduler_address in line and "tokdyn fit` again" in line
        monkeypatch.setattr(fitjob, "_fit_one_block", real)
        done_before = int(np.count_nonzero(st.run("r").fit._group()["done"][...]))
        monkeypatch.setattr(fitjob, "_fit_one_block", dying)
        with pytest.raises(ClusterError, match="died while fitting a block"):  # its own type, from the library too
            fit_run(st.run("r"), scheduler=cluster.scheduler_address, refit=True, progress=False)
        monkeypatch.setattr(fitjob, "_fit_one_block", real)
        done_before = int(np.count_nonzero(st.run("r").fit._group()["done"][...]))
        res = fit_run(tokdyn.open_store(path, mode="r+").run("r"), scheduler=cluster.scheduler_address, progress=False)
    assert res.blocks_resumed == done_before and res.blocks_fitted == 4 - done_before


def test_local_workers_asked_of_a_cluster_are_said_to_be_ignored(tmp_path, data):
    st = make_store(tmp_path / "s.zarr", data[0][:200], token_chunk=100)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with pytest.warns(RuntimeWarning, match=r"workers=3 is ignored: it sets this machine's workers"):
            res = fit_run(st.run("r"), scheduler=cluster.scheduler_address, workers=3, progress=False)
    assert res.blocks_fitted == 2


@pytest.mark.slow
def test_a_scheduler_lost_mid_fit_is_one_line_and_the_fit_resumes(tmp_path, data):
    """The scheduler's process SIGKILLed while the fit runs on it: dask's client logged its
    reconnection tracebacks and the command ended with "internal error in tokdyn ...:
    FutureCancelledError ... (a bug: please report it)". Now one line (that the tasks were
    cancelled, and that a rerun resumes), and a rerun on a new cluster finishes with every
    field equal to a local fit."""
    import signal
    import subprocess
    import sys

    Y = np.tile(data[0], (40, 1))  # 24,000 tokens, 48 blocks
    ref = make_store(tmp_path / "ref.zarr", Y, token_chunk=500)
    fit_run(ref.run("r"), scheduler="sync", progress=False)
    path = str(tmp_path / "s.zarr")
    make_store(path, Y, token_chunk=500)
    script = ("import sys, time, distributed\n"
              "if __name__ == '__main__':\n"
              "    c = distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)\n"
              "    print(c.scheduler_address, flush=True)\n"
              "    time.sleep(600)\n")  # fmt: skip
    (tmp_path / "cluster.py").write_text(script)
    cluster = subprocess.Popen([sys.executable, str(tmp_path / "cluster.py")], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        address = cluster.stdout.readline().strip()
        job = subprocess.Popen([sys.executable, "-m", "tokdyn", "fit", path, "--scheduler", address, "--no-progress"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job.poll() is None:  # until a block is done
            time.sleep(0.2)
            g = tokdyn.open_store(path).run("r").fit._group()
            if g is not None and "done" in g and np.asarray(g["done"][...]).any():
                break
        os.killpg(cluster.pid, signal.SIGKILL)
        _, err = job.communicate(timeout=60)
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait()
    assert job.returncode == 1, err
    line = cli_error_line(err)
    assert "internal error" not in line and "cancelled" in line and "tokdyn fit` again" in line
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        res = fit_run(tokdyn.open_store(path, mode="r+").run("r"), scheduler=c.scheduler_address, progress=False)
    assert res.blocks_resumed >= 1
    _fields_equal(read_fit(path, "r"), read_fit(ref, "r"))


def test_a_scheduler_without_workers_is_said_before_the_fit_waits_for_one(tmp_path, data):
    """A scheduler with no worker (none started yet, or the last one lost without a nanny): the
    fit waited for good without a word. Now a warning says so first; the fit goes on as soon as
    a worker joins."""
    st = make_store(tmp_path / "s.zarr", data[0][:200], token_chunk=100)
    with distributed.LocalCluster(n_workers=0, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        threading.Timer(1.0, lambda: cluster.scale(1)).start()
        with pytest.warns(RuntimeWarning, match=r"has no workers; the fit waits until one joins"):
            res = fit_run(st.run("r"), scheduler=cluster.scheduler_address, progress=False)
    assert res.blocks_fitted == 2


# -- a relative store path on a cluster ----------------------------------------------------------


def test_a_relative_store_path_reaches_cluster_workers_started_elsewhere(tmp_path, data, monkeypatch):
    """`tokdyn fit runs.zarr --scheduler tcp://...`: the workers opened `runs.zarr` in their own
    working folder (here: the folder the cluster was started from), where there is no store, or
    another one. The path now goes to them absolute, and the fit equals a local one."""
    Y = data[0][:400]
    ref = make_store(tmp_path / "ref.zarr", Y, token_chunk=200)
    fit_run(ref.run("r"), scheduler="sync", progress=False)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        monkeypatch.chdir(tmp_path / "here")
        st = make_store("s.zarr", Y, token_chunk=200)
        assert st.url == "s.zarr"
        res = fit_run(st.run("r"), scheduler=cluster.scheduler_address, progress=False)
    assert res.blocks_fitted == 2
    assert not (tmp_path / "elsewhere" / "s.zarr").exists()
    _fields_equal(read_fit(tmp_path / "here" / "s.zarr", "r"), read_fit(ref, "r"))


# -- what a fit says of the rows it covers --------------------------------------------------------


def test_the_fit_says_when_the_run_grew_while_it_ran(tmp_path, data, capsys, monkeypatch):
    """A recorder committed a row while `tokdyn fit` ran: the fit covered the rows it counted and
    said "fitted ... on 37 points" and nothing else; the first word of the new row came from the
    next reader's refusal. Now the fit's own output says the row is not covered, and its
    summary counts it."""
    path = str(tmp_path / "s.zarr")
    Y = data[0][:200]
    st = make_store(path, Y, token_chunk=100)
    real, appended = fitjob.fit_block, []

    def appending(*args, **kwargs):
        if not appended:
            with st.run("r").writer(resume=True) as w:
                w.append(Y[:, -1], step=20_000)
            appended.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(fitjob, "fit_block", appending)
    assert main(["fit", path, "--scheduler", "sync", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"on {len(STEPS) - 1} points" in out
    assert "not covered: 1 row the run committed while this fit ran; the fit is already stale" in out and "--refit" in out
    monkeypatch.setattr(fitjob, "fit_block", real)
    res = fit_run(st.run("r"), refit=True, scheduler="sync", progress=False)
    assert res.n_rows_committed_since == 0 and res.n_points == len(STEPS)


# -- the summary is of the fit it made ------------------------------------------------------------


def test_the_summary_is_of_this_fit_even_when_a_refit_follows_at_once(tmp_path, data, monkeypatch):
    """The job read its results for the summary after letting go of the fit lock: a refit that
    took the lock at that instant replaced them first, and the summary printed the refit's
    classes under this fit's point count. The summary is now read under the lock."""
    from tokdyn.store.fit import FitWriter

    Y = data[0][:300]
    ref = make_store(tmp_path / "ref.zarr", Y, token_chunk=100)
    expected = fit_run(ref.run("r"), scheduler="sync", progress=False)
    st = make_store(tmp_path / "s.zarr", Y, token_chunk=100)
    real_release, refits, started = FitWriter.release, [], []

    def release_then_refit(self):
        real_release(self)
        if not started:  # another `tokdyn fit --refit --axis-min ...` gets the lock first
            started.append(True)
            refits.append(fit_run(st.run("r"), scheduler="sync", refit=True, axis_min=float(STEPS[-8]), progress=False))

    monkeypatch.setattr(FitWriter, "release", release_then_refit)
    got = fit_run(st.run("r"), scheduler="sync", progress=False)
    assert refits and refits[0].class_counts != expected.class_counts  # the refit's classes differ
    assert got.class_counts == expected.class_counts and got.status_counts == expected.status_counts
    assert got.class_loss_share == expected.class_loss_share
