"""`tokdyn fit` over stores: planted events, scheduler/chunk invariance, resume, errors."""

from __future__ import annotations

import os
import threading
import time

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
        fit_run(st.run("r"), scheduler=sched, batch_rows=batch, progress=False, workers=None if sched == "sync" else 2)  # sync: one thread
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


def _interrupt_at(monkeypatch, call: int):
    """Make the job's fit_block raise KeyboardInterrupt at its ``call``-th call (the job is
    stopped there); returns the real fit_block."""
    real = fitjob.fit_block
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(fitjob, "fit_block", flaky)
    return real


def test_resume_after_interruption_fits_only_missing_blocks(tmp_path, data, monkeypatch):
    Y = data[0][:1000]
    ref_store = make_store(tmp_path / "ref.zarr", Y, token_chunk=200)
    fit_run(ref_store.run("r"), scheduler="sync", progress=False)
    ref = read_fit(ref_store, "r")

    st = make_store(tmp_path / "b.zarr", Y, token_chunk=200)
    real = _interrupt_at(monkeypatch, 3)  # the job is stopped while fitting the third block
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


def test_an_interrupted_fit_resumes_only_on_its_own_backend(tmp_path, data, monkeypatch):
    """Backends agree to solver tolerance, not to the bit: a fit stopped on one and resumed on
    another mixed the two (and recorded only the second). It is refused with both names; the
    same backend resumes, and --refit replaces it."""
    Y = data[0][:600]
    st = make_store(tmp_path / "b.zarr", Y, token_chunk=200)
    real = _interrupt_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        fit_run(st.run("r"), scheduler="sync", backend="numba", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    with pytest.raises(StoreError, match=r"another backend \(numba then, numpy now\).*--refit"):
        fit_run(st.run("r"), scheduler="sync", backend="numpy", progress=False)
    res = fit_run(st.run("r"), scheduler="sync", backend="numba", progress=False)
    assert res.blocks_resumed == 1 and res.blocks_fitted == 2 and res.backend == "numba"
    with pytest.raises(StoreError, match="another backend"):  # a complete fit too
        fit_run(st.run("r"), scheduler="sync", backend="numpy", progress=False)
    res = fit_run(st.run("r"), scheduler="sync", backend="numpy", refit=True, progress=False)
    assert res.blocks_fitted == 3 and st.run("r").fit.meta["backend"] == "numpy"


def test_a_fit_while_the_recorder_appends_is_a_fit_of_the_rows_it_read(tmp_path, data, monkeypatch):
    """A row committed during the fit: the fit succeeds on the rows it counted (it did all its
    work; it used to fail at its summary), and readers are then told to refit."""
    Y = data[0][:400]
    st = make_store(tmp_path / "c.zarr", Y, token_chunk=200)
    real = fitjob.fit_block
    appended = []

    def appending(*args, **kwargs):
        if not appended:
            w = st.run("r").writer(resume=True)
            w.append(Y[:, -1], step=20_000)
            w.release()
            appended.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(fitjob, "fit_block", appending)
    res = fit_run(st.run("r"), scheduler="sync", progress=False)
    fitted = int((np.asarray(STEPS) > 0).sum())  # step 0 is not fitted
    assert appended and res.n_points == fitted and res.blocks_fitted == 2
    assert sum(res.status_counts.values()) == 400
    run = st.run("r")
    assert run.n_committed == len(STEPS) + 1
    assert run.fit.meta["n_committed"] == len(STEPS) and len(run.fit.meta["rows"]) == fitted
    with pytest.raises(StoreError, match="refit"):
        read_fit(st, "r")


def test_fewer_rows_than_min_points_is_an_error_not_a_fit_of_unfit_tokens(tmp_path, data):
    """Every token would get too_few_points and the command exit 0 ("nan% of the loss drop")."""
    Y = data[0][:50]
    st = make_store(tmp_path / "f.zarr", Y)
    with pytest.raises(InputError, match=r"4 rows to fit at axis values >= .*min_points=6 \(--min-points, 5 at least\); or lower axis_min"):
        fit_run(st.run("r"), axis_min=float(STEPS[-4]), progress=False)  # the last 4 rows
    assert not st.run("r").fit.meta  # nothing created
    res = fit_run(st.run("r"), axis_min=float(STEPS[-6]), progress=False)  # 6 rows: fitted
    assert res.n_points == 6
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(50, dtype=np.int32), "token_pos": np.ones(50, np.int32)})
    short = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    w = short.create_run("r", capacity=8).writer()
    for j, step in enumerate(STEPS[:6]):  # step 0 and 5 positive steps
        w.append(Y[:, j], step=int(step))
    with pytest.raises(InputError, match=r"5 rows to fit; a fit needs at least min_points=6 \(--min-points, 5 at least\)$"):
        fit_run(short.run("r"), progress=False)
    assert fit_run(short.run("r"), options=tokdyn.fit.FitOptions(min_points=5), progress=False).n_points == 5
    assert main(["fit", str(tmp_path / "s.zarr"), "--run", "r", "--min-points", "5", "--refit", "--no-progress"]) == 0
    assert main(["fit", str(tmp_path / "s.zarr"), "--run", "r", "--min-points", "4", "--refit", "--no-progress"]) == 1


def test_process_workers_do_not_outlive_a_killed_job(tmp_path, data):
    """`tokdyn fit --scheduler processes` killed on its own (SIGKILL: the OOM killer; no pool
    shutdown can run): its worker processes end too, instead of running on for good."""
    import signal
    import subprocess
    import sys

    psutil = pytest.importorskip("psutil")
    st = make_store(tmp_path / "k.zarr", np.tile(data[0], (8, 1)), token_chunk=2000)  # 12 blocks, ~2 s each
    job = subprocess.Popen([sys.executable, "-m", "tokdyn", "fit", str(tmp_path / "k.zarr"), "--run", "r", "--no-progress",
                            "--scheduler", "processes", "--workers", "2"])  # fmt: skip
    try:
        workers: list = []
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
            workers = [p for p in psutil.Process(job.pid).children() if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2, "the workers did not start"
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"{len(alive)} workers outlived the job"
    finally:
        if job.poll() is None:
            job.kill()
        for p in workers:
            if p.is_running():
                p.kill()
    assert not st.run("r").fit.complete


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_rows": "abc"}, "batch_rows must be an int"), ({"batch_rows": True}, "batch_rows must be an int"),
    ({"batch_rows": 0}, "batch_rows must be an int >= 1"), ({"workers": "2"}, "workers must be None or an int"),
    ({"workers": 1.5}, "workers must be None or an int"), ({"workers": False}, "workers must be None or an int"),
    ({"scheduler": 123}, "scheduler must be a string"), ({"axis_min": True}, "axis_min must be a number"),
])  # fmt: skip
def test_fit_run_arguments_of_the_wrong_type_are_one_error(tmp_path, data, kwargs, match):
    st = make_store(tmp_path / "a.zarr", data[0][:100])
    with pytest.raises(InputError, match=match):
        fit_run(st.run("r"), progress=False, **kwargs)
    assert not st.run("r").fit.meta  # nothing created


def test_fit_run_takes_numpy_integers(tmp_path, data):
    st = make_store(tmp_path / "a.zarr", data[0][:100])
    res = fit_run(st.run("r"), progress=False, batch_rows=np.int64(40), workers=np.int32(2), scheduler="threads")
    assert res.blocks_fitted == res.blocks


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


def _failing_fit_block(monkeypatch, *, fail_at: int, pause: float = 0.02, hold: int | None = None, release=None):
    """fit_block made slow (``pause`` s a call, so that other blocks are in flight) and failing
    at its ``fail_at``-th call; its ``hold``-th call waits (up to 2 s) for the event ``release``
    first. Returns the log of write_block entries and exits (monotonic s)."""
    from tokdyn.store.fit import FitResults

    real_fit, real_write = fitjob.fit_block, FitResults.write_block
    calls, log, lock = {"n": 0}, [], threading.Lock()

    def slow(*args, **kwargs):
        with lock:
            calls["n"] += 1
            n = calls["n"]
        time.sleep(pause)
        if n == hold:
            release.wait(2.0)
        if n == fail_at:
            raise ValueError("planted failure")
        return real_fit(*args, **kwargs)

    def logged(self, *args, **kwargs):
        log.append(("enter", time.monotonic()))
        try:
            return real_write(self, *args, **kwargs)
        finally:
            log.append(("exit", time.monotonic()))

    monkeypatch.setattr(fitjob, "fit_block", slow)
    monkeypatch.setattr(FitResults, "write_block", logged)
    return log


def test_a_failed_fit_returns_only_once_no_block_is_being_written(tmp_path, data, monkeypatch):
    """dask re-raises a task's error at once and leaves the other threads running: they wrote
    blocks and done flags after the fit had failed and let go of its lock. Now the fit stops
    them and waits: nothing is written after it returns."""
    st = make_store(tmp_path / "t.zarr", data[0][:800], token_chunk=50)  # 16 blocks of 5 batches
    log = _failing_fit_block(monkeypatch, fail_at=12)
    with pytest.raises(ValueError, match="planted"):
        fit_run(st.run("r"), scheduler="threads", workers=2, batch_rows=10, progress=False)
    returned = time.monotonic()
    time.sleep(0.5)  # what the other thread had left of its block, and more
    assert log and all(t <= returned for _, t in log), "a block was written after the failed fit returned"
    assert not st.run("r").fit.meta["complete"]


@pytest.mark.parametrize("guard", ["both", "store only"])
def test_a_refit_right_after_a_failed_fit_holds_only_its_own_blocks(tmp_path, data, monkeypatch, guard):
    """A fit fails in one block while another block is still being fitted; a refit on other
    inputs (a fit window) starts at once and finishes before that block would be written. Every
    block of the refit is its own, equal to the same fit on a fresh store. Two guards each
    suffice: the job waits for its threads; the store refuses a block of a replaced fit (what
    protects cluster workers), checked here with the job's wait switched off."""
    import dask

    Y = data[0][:800]
    ref = make_store(tmp_path / "ref.zarr", Y, token_chunk=50)
    fit_run(ref.run("r"), scheduler="sync", axis_min=STEPS[5], progress=False)
    expected = read_fit(ref, "r")
    st = make_store(tmp_path / "u.zarr", Y, token_chunk=50)
    release = threading.Event()
    if guard == "store only":  # dask's own thread pool, which nothing waits for
        monkeypatch.setattr(fitjob, "_run_tasks", lambda todo, task_args, **kw: fitjob._compute_local(
            [dask.delayed(fitjob._fit_one_block, pure=False)(b, **task_args) for b in todo], False, scheduler="threads", num_workers=2))
    with monkeypatch.context() as m:
        _failing_fit_block(m, fail_at=2, hold=1, release=release)  # block 1 fails while block 0 is held
        with pytest.raises(ValueError, match="planted"):
            fit_run(st.run("r"), scheduler="threads", workers=2, batch_rows=50, progress=False)
    res = fit_run(st.run("r"), scheduler="threads", workers=2, refit=True, axis_min=STEPS[5], progress=False)
    release.set()
    time.sleep(0.3)  # the held block, if anything still runs it, is written now
    assert res.n_points == len(STEPS) - 5 and res.blocks_fitted == 16
    got = read_fit(st, "r")
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_block_of_a_replaced_fit_is_refused(tmp_path, data):
    """A worker of an earlier fit (a failed job's, a lost cluster worker's) hands over its block
    after a refit began: the store refuses it and the refit's arrays and done flags stay as they
    were; the same block with the current fit_id is written."""
    st = make_store(tmp_path / "v.zarr", data[0][:100], token_chunk=50)
    run = st.run("r")
    fields = {name: np.dtype(dt).str for name, dt in FIT_FIELDS.items()}
    block = {name: np.ones(50, dtype=dt) for name, dt in FIT_FIELDS.items()}
    with run.fit.writer({"n_committed": run.n_committed, "block_tokens": 50}, fields, n_blocks=2) as old:
        stale = old.fit_id
    with run.fit.writer({"n_committed": run.n_committed, "block_tokens": 50}, fields, n_blocks=2, refit=True) as new:
        assert new.fit_id != stale
        with pytest.raises(StoreError, match="was replaced while block 1"):
            run.fit.write_block(1, 50, block, fit_id=stale)
        assert new.todo() == ([0, 1], [])  # neither block done
        g = run._group["fit"]
        assert np.isnan(g["mu"][...]).all() and not g["crc"][...].any()
        run.fit.write_block(1, 50, block, fit_id=new.fit_id)
        assert new.todo() == ([0], [])  # block 1 done


def test_a_failed_fit_on_a_cluster_cancels_its_other_blocks_and_a_refit_is_clean(tmp_path, data, monkeypatch):
    """On a dask.distributed cluster (in-process workers, so the failure can be planted) the
    task's own error is raised, the blocks not started are cancelled, and a refit at once on other
    inputs holds only its own blocks."""
    distributed = pytest.importorskip("distributed")
    Y = data[0][:800]
    ref = make_store(tmp_path / "ref.zarr", Y, token_chunk=50)
    fit_run(ref.run("r"), scheduler="sync", axis_min=STEPS[5], progress=False)
    st = make_store(tmp_path / "w.zarr", Y, token_chunk=50)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        with monkeypatch.context() as m:
            log = _failing_fit_block(m, fail_at=3, pause=0.2)  # 13 more blocks would take >= 1.3 s
            with pytest.raises(ValueError, match="planted"):
                fit_run(st.run("r"), scheduler=cluster.scheduler_address, batch_rows=50, progress=False)
        assert sum(what == "enter" for what, _ in log) < 16  # the rest were cancelled
        fit_run(st.run("r"), scheduler=cluster.scheduler_address, refit=True, axis_min=STEPS[5], progress=False)
    got, expected = read_fit(st, "r"), read_fit(ref, "r")
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def _as_an_earlier_tokdyn_left_it(run, *, complete: bool, **options):
    """The fit's metadata as the previous tokdyn wrote it: no backend or device among its inputs
    (recorded only when a fit finished, then under `backend`), no min_points_two among its
    options; unfinished with its first block not done, or complete."""
    g = run.fit._group()
    meta = dict(g.attrs["tokdyn_fit"])
    for key in ("backend", "device"):
        meta.pop(key, None)
    if complete:
        meta["backend"] = "numba"
    meta["options"] = {k: v for k, v in meta["options"].items() if k != "min_points_two"} | options
    meta["complete"] = complete
    g.update_attributes({"tokdyn_fit": meta})
    if not complete:
        g["done"][0] = 0


def test_fits_made_by_the_previous_tokdyn_are_redone_or_read(tmp_path, data):
    """An unfinished fit of the previous version is redone whole (no --backend could resume it);
    a complete one is read (spectrum, options) and refit only on --refit, with an error that says
    why; a stored option this version refuses (max_iter above its limit) is read as its default."""
    from tokdyn.fit.job import stored_options

    st = make_store(tmp_path / "o.zarr", data[0][:600], token_chunk=200)
    fit_run(st.run("r"), progress=False)
    _as_an_earlier_tokdyn_left_it(st.run("r"), complete=False)
    res = fit_run(st.run("r"), progress=False)
    assert res.blocks_fitted == 3 and res.blocks_resumed == 0
    _as_an_earlier_tokdyn_left_it(st.run("r"), complete=True, max_iter=20_000)
    opts = stored_options(st.run("r"))
    assert opts.max_iter == tokdyn.FitOptions().max_iter and opts.min_points_two == 14
    assert main(["spectrum", str(tmp_path / "o.zarr"), "--run", "r", "--boot", "0"]) == 0
    with pytest.raises(StoreError, match=r"made by an earlier tokdyn \(it records no device, options.min_points_two\).*--refit"):
        fit_run(st.run("r"), progress=False)
    assert fit_run(st.run("r"), progress=False, refit=True).blocks_fitted == 3
