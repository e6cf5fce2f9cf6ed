"""`tokdyn fit` on a dask.distributed cluster that misbehaves (hunt 25): the cluster loses its last
worker mid-fit, its workers are all paused (memory above dask's pause threshold), its workers
cannot see the store. Each test failed before its fix (docs/fitting.md, "Fitting a store")."""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from test_hunt12_schedulers import _fields_equal, _reference  # noqa: E402
from test_store_fit import make_store, planted  # noqa: E402
from tokdyn.fit import job as fitjob  # noqa: E402
from tokdyn.fit.job import fit_run, read_fit  # noqa: E402

_FIT_ONE_BLOCK = fitjob._fit_one_block


@pytest.fixture(scope="module")
def data():
    return planted(400)[0]


@pytest.fixture
def quick_watch(monkeypatch):  # (raising=False: before the watch, there was none)
    monkeypatch.setattr(fitjob, "CLUSTER_WATCH_INTERVAL", 0.2, raising=False)


def _fit_in_thread(st, address: str) -> tuple[threading.Thread, dict, list]:
    """``fit_run`` of run "r" on ``address`` in a thread: (thread, outcome, warnings said so far)."""
    outcome: dict = {}
    said: list = []

    def fit():
        try:
            outcome["res"] = fit_run(st.run("r"), scheduler=address, progress=False)
        except Exception as exc:  # noqa: BLE001
            outcome["error"] = exc

    catcher = warnings.catch_warnings(record=True)
    said.extend([catcher, catcher.__enter__()])  # (global: the fit's threads warn into it too)
    warnings.simplefilter("always")
    t = threading.Thread(target=fit, daemon=True)
    t.start()
    return t, outcome, said


def _wait_for(what, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.05)
    return False


def _said(said: list, text: str) -> bool:
    return any(text in str(w.message) for w in said[1])


def _done(path: Path) -> int:
    import zarr

    try:
        return int(zarr.open_array(str(path / "runs" / "r" / "fit" / "done"), mode="r")[...].sum())
    except Exception:  # noqa: BLE001 - not made yet
        return 0


def slow_block(b: int, **kwargs):
    """A block task that takes a while past block 0: the test acts between blocks."""
    if b > 0:
        time.sleep(0.4)
    return _FIT_ONE_BLOCK(b, **kwargs)


_GO_ON = threading.Event()
_STARTED: list = []


def gated_block(b: int, **kwargs):
    """A block task that, past the first to start (whichever block dask runs first), waits
    until the test lets it go on (an in-process cluster): the test sees what it waits for
    without racing the blocks to the fit's end."""
    _STARTED.append(b)
    if len(_STARTED) > 1:
        _GO_ON.wait(120)
    return _FIT_ONE_BLOCK(b, **kwargs)


def test_a_cluster_that_loses_its_last_worker_mid_fit_says_so(tmp_path, data, quick_watch, monkeypatch):
    """A worker without a nanny (`dask worker --no-nanny`, a preempted batch job) that was the
    cluster's last dies mid-fit: dask holds the blocks left for a worker to join, and the fit
    waited for good without a word (a scheduler without workers was said only when the fit
    began). Now it says so when it happens; a worker that joins then finishes the fit, equal to
    a local one."""
    monkeypatch.setattr(fitjob, "_fit_one_block", slow_block)
    st = make_store(tmp_path / "s.zarr", data, token_chunk=50)  # 8 blocks
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        t, outcome, said = _fit_in_thread(st, cluster.scheduler_address)
        try:
            assert _wait_for(lambda: _done(tmp_path / "s.zarr") >= 1, 60), outcome
            assert not _said(said, "has no workers")
            cluster.scale(0)
            assert _wait_for(lambda: _said(said, "has no workers; the fit waits until one joins"), 20), \
                [str(w.message) for w in said[1]]  # fmt: skip
            assert t.is_alive() and _done(tmp_path / "s.zarr") < 8
            cluster.scale(1)
            t.join(60)
        finally:
            said[0].__exit__(None, None, None)
    assert not t.is_alive() and "res" in outcome, outcome
    _fields_equal(read_fit(st, "r"), _reference(tmp_path, data))  # (blocks of 100 there: the fit does not depend on them)


def test_a_cluster_whose_workers_are_all_paused_says_so(tmp_path, data, quick_watch):
    """A worker whose memory is above dask's pause threshold (80 % of its limit: a limit below
    what its process holds once tokdyn and numba are imported) takes no task until it falls
    again: the fit waited for good without a word. Now it says so, naming the threshold; once the
    worker runs again the fit finishes, equal to a local one."""
    import dask

    st = make_store(tmp_path / "s.zarr", data[:200], token_chunk=100)
    # a threshold of 4 MB, below what any Python process holds: dask's own monitor pauses the worker
    memory = {f"distributed.worker.memory.{k}": v for k, v in dict(pause=0.001, terminate=False, spill=False, target=False).items()}
    with dask.config.set(memory), distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, memory_limit="4GiB",
                                                           dashboard_address=None) as cluster:  # fmt: skip
        (worker,) = cluster.workers.values()
        (seen,) = cluster.scheduler.workers.values()
        assert _wait_for(lambda: seen.status == distributed.core.Status.paused, 10)
        t, outcome, said = _fit_in_thread(st, cluster.scheduler_address)
        try:
            assert _wait_for(lambda: _said(said, "are all paused"), 30), [str(w.message) for w in said[1]]
            msg = next(str(w.message) for w in said[1] if "are all paused" in str(w.message))
            assert "distributed.worker.memory.pause) of their limit (4 GiB)" in msg and "Ctrl-C stops it" in msg
            assert t.is_alive() and _done(tmp_path / "s.zarr") == 0
            worker.memory_manager.memory_pause_fraction = 0.99  # its monitor resumes it
            t.join(60)
        finally:
            said[0].__exit__(None, None, None)
    assert not t.is_alive() and "res" in outcome, outcome
    _fields_equal(read_fit(st, "r"), _reference(tmp_path, data[:200]))


@pytest.mark.parametrize("there", ["nothing", "another store"])
def test_workers_that_cannot_see_the_store_say_so(there, tmp_path, data, monkeypatch):
    """The store's path on this machine is not the workers' (a local disk, a cluster of other
    machines; checked by hand with a worker in a mount namespace of its own): the fit said
    "no tokdyn store at /abs/s.zarr" (or "no run 'r' in ...", where the workers hold another
    store there) while the store is right there for the user. Now the line says that the
    worker cannot see it, and where it looked. Here the workers' view is another folder."""
    from tokdyn.errors import NotAStoreError, RunNotFoundError

    st = make_store(tmp_path / "s.zarr", data[:200], token_chunk=100)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if there == "another store":
        _other_store(elsewhere / "s.zarr", data)
    real = fitjob.as_store
    monkeypatch.setattr(fitjob, "as_store", lambda url, **kw: real(str(url).replace(str(tmp_path), str(elsewhere)), **kw))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with pytest.raises(NotAStoreError if there == "nothing" else RunNotFoundError) as err:
            fit_run(st.run("r"), scheduler=cluster.scheduler_address, progress=False)
    msg = str(err.value)
    assert msg.startswith("the worker inproc://") and f"of the dask cluster at {cluster.scheduler_address} " in msg, msg
    assert f"{tmp_path / 's.zarr'}" in msg and "the store must be reachable from the cluster's workers" in msg, msg


def _other_store(url, data):
    """A store at ``url`` whose one run is named "other", not "r"."""
    import tokdyn

    n = 100
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(url, probe, mode="w")
    w = st.create_run("other", capacity=2).writer()
    w.append(data[:n, 0], step=1)
    return st


def test_workers_without_the_fit_s_backend_say_so(tmp_path, data, monkeypatch):
    """`backend="auto"` is resolved where the fit runs (numba, installed there); workers whose
    environment lacks numba (checked by hand: a `dask worker` without it) said "backend 'numba'
    is not installed; available: [...]", of the machine where it is. Now the line names the
    worker and what to do. Here the workers' threads are told numba is missing."""
    from tokdyn.errors import InputError
    from tokdyn.fit import backends

    real = backends.available_backends
    monkeypatch.setattr(backends, "available_backends",
                        lambda: [b for b in real() if b != "numba" or fitjob._cluster_worker() is None])  # fmt: skip
    st = make_store(tmp_path / "s.zarr", data[:200], token_chunk=100)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with pytest.raises(InputError) as err:
            fit_run(st.run("r"), backend="numba", scheduler=cluster.scheduler_address, progress=False)
    msg = str(err.value)
    assert msg.startswith("the worker inproc://") and f"of the dask cluster at {cluster.scheduler_address} cannot fit" in msg, msg
    assert "backend 'numba' is not installed" in msg and "--backend" in msg, msg


def test_a_client_or_cluster_given_for_the_scheduler_says_which_address_to_pass(tmp_path, data):
    """`fit_run(run, scheduler=client)` (a notebook's Client, or its LocalCluster) was refused
    with the object's repr; the line now says to pass its scheduler's address, and names it."""
    from tokdyn.errors import InputError

    st = make_store(tmp_path / "s.zarr", data[:100], token_chunk=100)
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:  # fmt: skip
        for given in (client, cluster):
            with pytest.raises(InputError, match=rf"^scheduler must be a string .* got a dask\.distributed {type(given).__name__}: "
                               rf"pass its scheduler's address, scheduler={cluster.scheduler_address!r}$"):  # fmt: skip
                fit_run(st.run("r"), scheduler=given, progress=False)


def test_a_scheduler_that_stops_answering_mid_fit_is_said(tmp_path, data, quick_watch, monkeypatch):
    """A scheduler process that stops answering (SIGSTOP, swapping; checked by hand with a
    `dask scheduler` sent SIGSTOP mid-fit) kept its connections open: the fit waited for good
    without a word. Now the watch's look at it has a deadline, and the fit says so; here its
    `identity` handler hangs while blocks go on, then answers again, and the fit ends equal to a
    local one."""
    import asyncio

    go_on = _GO_ON
    go_on.clear()
    _STARTED.clear()
    monkeypatch.setattr(fitjob, "_fit_one_block", gated_block)
    st = make_store(tmp_path / "s.zarr", data, token_chunk=50)  # 8 blocks
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        handlers = cluster.scheduler.handlers
        identity = handlers["identity"]

        async def hung(*args, **kwargs):
            await asyncio.sleep(3600)

        t, outcome, said = _fit_in_thread(st, cluster.scheduler_address)
        try:
            assert _wait_for(lambda: _done(tmp_path / "s.zarr") >= 1, 60), outcome
            monkeypatch.setattr(fitjob, "SCHEDULER_TIMEOUT", 0.5)  # the watch's deadline (past the address check)
            handlers["identity"] = hung
            assert _wait_for(lambda: _said(said, "has not answered for 0.5 s"), 20), [str(w.message) for w in said[1]]
            handlers["identity"] = identity
            go_on.set()
            t.join(60)
        finally:
            go_on.set()
            handlers["identity"] = identity
            said[0].__exit__(None, None, None)
    assert not t.is_alive() and "res" in outcome, outcome
    _fields_equal(read_fit(st, "r"), _reference(tmp_path, data))


def test_a_cluster_warning_made_an_error_stops_the_fit_with_it(tmp_path, data):
    """python -W error (PYTHONWARNINGS=error) with a scheduler that has no workers: before the
    watch, its warning was raised in the fit's own thread (the CLI's one line); the watch raised
    it in its thread, which printed a traceback and died, and the fit waited for good without a
    word. The warning now cancels the blocks and is the fit's error."""
    st = make_store(tmp_path / "s.zarr", data, token_chunk=50)
    errors: list = []
    hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    try:
        with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
            outcome: dict = {}

            def fit():
                try:
                    outcome["res"] = fit_run(st.run("r"), scheduler=cluster.scheduler_address, progress=False)
                except BaseException as exc:  # noqa: BLE001
                    outcome["error"] = exc

            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                t = threading.Thread(target=fit, daemon=True)
                t.start()
                t.join(60)  # (a deadline for a fit that waits for good, not a timing)
            alive = t.is_alive()
    finally:
        threading.excepthook = hook
    assert not alive and not errors, errors
    assert isinstance(outcome.get("error"), RuntimeWarning), outcome
    assert "has no workers; the fit waits until one joins" in str(outcome["error"])
