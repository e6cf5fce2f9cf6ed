"""`tokdyn fit` on the schedulers as researchers use them (hunt 12): a `processes` worker killed
mid-fit, a dask cluster whose processes lack tokdyn or run another version, and `--workers` at
its limits. Each test failed before its fix (docs/fitting.md, "Fitting a store")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tokdyn
from reliability_fixtures import cli_error_line
from test_store_fit import make_store, planted
from tokdyn.cli import main
from tokdyn.errors import ClusterError, InputError
from tokdyn.fit import FIT_FIELDS
from tokdyn.fit import job as fitjob
from tokdyn.fit.job import fit_run, read_fit

TESTS = Path(__file__).parent
# The real task, as a worker process imports it (the tests below patch the job's name for it).
_FIT_ONE_BLOCK = fitjob._fit_one_block


@pytest.fixture(scope="module")
def data():
    return planted(400)[0]


def _fields_equal(got: dict, expected: dict) -> None:
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def _reference(tmp_path: Path, Y) -> dict:
    ref = make_store(tmp_path / "ref.zarr", Y, token_chunk=100)
    fit_run(ref.run("r"), scheduler="sync", progress=False)
    return read_fit(ref, "r")


def die_on_block_2(b: int, **kwargs):
    """A block task whose process is killed (the OOM killer) on block 2, after blocks 0 and 1."""
    if b == 2:
        time.sleep(0.5)  # the other worker's block is written first: a resume has something to keep
        os.kill(os.getpid(), signal.SIGKILL)
    return _FIT_ONE_BLOCK(b, **kwargs)


# -- a `processes` worker killed mid-fit ------------------------------------------------------


@pytest.mark.slow
def test_a_killed_worker_process_is_one_line_and_the_fit_resumes(tmp_path, data):
    """A worker of `--scheduler processes` killed while it fits a block (the OOM killer, a kill):
    `tokdyn fit` ended with "internal error in tokdyn 0.1.0: BrokenProcessPool: ... (a bug: please
    report it ...)" and, under it, the resource tracker's two lines of "UserWarning: ... leaked
    semaphore objects". Now one line that names the cause and the resume; `tokdyn fit` again
    finishes, equal to a local fit."""
    expected = _reference(tmp_path, data)
    path = tmp_path / "s.zarr"
    make_store(path, data, token_chunk=100)
    script = ("import sys\n"
              "import test_hunt12_schedulers as t\n"
              "from tokdyn.cli import main\n"
              "t.fitjob._fit_one_block = t.die_on_block_2\n"
              "if __name__ == '__main__':\n"
              f"    sys.exit(main(['fit', {str(path)!r}, '--scheduler', 'processes', '--workers', '2', '--no-progress']))\n")  # fmt: skip
    (tmp_path / "job.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    job = subprocess.run([sys.executable, str(tmp_path / "job.py")], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert job.returncode == 1, job.stderr
    line = cli_error_line(job.stderr)  # the tracker's warning, which shares the terminal, is not there
    assert "internal error" not in line and "worker process of the fit died" in line and "tokdyn fit` again" in line
    res = fit_run(tokdyn.open_store(path, mode="r+").run("r"), scheduler="processes", workers=2, progress=False)
    assert res.blocks_fitted + res.blocks_resumed == 4
    _fields_equal(read_fit(path, "r"), expected)


def test_a_dead_process_pool_is_a_cluster_error_in_the_library(tmp_path, data, monkeypatch):
    """The library's error for the same: a ClusterError (a TokdynError), not dask's BrokenProcessPool."""
    from concurrent.futures.process import BrokenProcessPool

    def broken(*args, **kwargs):
        raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(fitjob, "_compute_local", broken)
    st = make_store(tmp_path / "s.zarr", data[:200], token_chunk=100)
    with pytest.raises(ClusterError, match=r"worker process of the fit died .* run `tokdyn fit` again"):
        fit_run(st.run("r"), scheduler="processes", workers=1, progress=False)


# -- `--workers` at its limits ----------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_more_workers_than_blocks_start_one_per_block_at_most(scheduler, tmp_path, data, monkeypatch):
    """`--workers 1000000` started a process per block (80 processes on 2 cores for an 80-block
    store: 4x slower than 2) or a thread per block, each holding its block in memory (2.7x the
    memory). Now never more workers than blocks to fit; the results are those of a local fit."""
    expected = _reference(tmp_path, data[:200])
    sizes = []
    real_pool, real_threads = fitjob._process_pool, fitjob.ThreadPoolExecutor
    monkeypatch.setattr(fitjob, "_process_pool", lambda n: sizes.append(n) or real_pool(n))
    monkeypatch.setattr(fitjob, "ThreadPoolExecutor", lambda n, **kw: sizes.append(n) or real_threads(n, **kw))
    st = make_store(tmp_path / "s.zarr", data[:200], token_chunk=100)
    fit_run(st.run("r"), scheduler=scheduler, workers=10**6, progress=False)
    assert sizes == [2]
    _fields_equal(read_fit(st, "r"), expected)


@pytest.mark.parametrize("option", ["--workers", "--batch-rows"])
def test_a_count_beyond_any_machine_is_named_as_typed(option, tmp_path, data, capsys):
    """`--workers 99999999999999999999` said "workers must be None or an int >= 1": the library's
    parameter, and a lower bound the value meets."""
    make_store(tmp_path / "s.zarr", data[:100], token_chunk=100)
    assert main(["fit", str(tmp_path / "s.zarr"), option, "99999999999999999999", "--no-progress"]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert line.startswith(f"tokdyn fit: error: {option} must be an integer from 1 to ")


# -- a cluster whose processes lack tokdyn, or run another version -----------------------------

distributed_needed = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("distributed"), reason="dask.distributed is not installed"
)


def _refit_on_a_cluster_fails(tmp_path, data, capsys, patch) -> str:
    """A store of 200 tokens fitted locally, then ``patch()``, then `tokdyn fit --refit` on a
    one-worker in-process dask cluster, which must fail: its error line."""
    import distributed

    st = make_store(tmp_path / "s.zarr", data[:200], token_chunk=100)
    fit_run(st.run("r"), scheduler="sync", progress=False)
    patch()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        assert main(["fit", str(tmp_path / "s.zarr"), "--scheduler", cluster.scheduler_address, "--refit", "--no-progress"]) == 1
    return cli_error_line(capsys.readouterr().err)


@distributed_needed
@pytest.mark.parametrize("answer, who, says", [
    ("__import__('tokdyn_not_installed_here')", "the scheduler", "cannot import tokdyn (ModuleNotFoundError"),
    ("'0.0.1'", "the scheduler", "runs tokdyn 0.0.1, this process "),
    (f"'{tokdyn.__version__}+000000000000'", "the worker",  # this version, other code: the scheduler, which fits nothing, passes
     f"runs tokdyn {tokdyn.__version__}+000000000000, this process {tokdyn._version.build()}: install the same tokdyn"),
], ids=["no tokdyn", "another version", "other code"])  # fmt: skip
def test_a_cluster_without_this_tokdyn_is_one_line_before_the_fit_is_touched(answer, who, says, tmp_path, data, capsys, monkeypatch):
    """A cluster started from an environment without tokdyn: its scheduler failed to unpickle the
    graph ("internal error ... (a bug: please report it)"), a worker without a nanny died on its
    first block and left the fit waiting for good. Another version would fit with other code.
    Now its processes are asked first (here the answer is patched in): one line naming who and
    what to install, and a `--refit` keeps the stored fit."""
    line = _refit_on_a_cluster_fails(tmp_path, data, capsys, lambda: monkeypatch.setattr(fitjob, "_IMPORT_TOKDYN", answer))
    assert line.startswith(f"tokdyn fit: error: {who} ") and " of the dask cluster at" in line and says in line
    assert tokdyn.open_store(tmp_path / "s.zarr").run("r").fit.complete  # --refit discarded nothing


def _fit_on(st, address: str, timeout: float) -> dict:
    """``fit_run`` of run "r" on the cluster at ``address`` in a thread: ``{"res": summary}`` or
    ``{"error": exception}``; an AssertionError where it has not ended within ``timeout`` s."""
    outcome: dict = {}

    def fit():
        try:
            outcome["res"] = fit_run(st.run("r"), scheduler=address, progress=False)
        except Exception as exc:  # noqa: BLE001
            outcome["error"] = exc

    t = threading.Thread(target=fit, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the fit waited for good"
    return outcome


@distributed_needed
@pytest.mark.slow
def test_a_worker_process_without_tokdyn_is_named_instead_of_a_fit_that_waits_for_good(tmp_path, data):
    """The real thing: a `dask worker` (no nanny) whose Python finds no tokdyn joins a scheduler;
    the fit sent it a block, it died unpickling it, and the fit waited for good for a worker."""
    import distributed

    blocker = tmp_path / "blocker" / "tokdyn"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'tokdyn'\", name='tokdyn')\n")
    st = make_store(tmp_path / "s.zarr", data[:200], token_chunk=100)
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=None) as cluster:
        worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address, "--nthreads", "1",
                                   "--no-nanny", "--dashboard-address", ":0"], cwd=tmp_path,
                                  env={**os.environ, "PYTHONPATH": str(blocker.parent)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not cluster.scheduler.workers and time.monotonic() < deadline:
                time.sleep(0.2)
            assert cluster.scheduler.workers, "the worker did not join"
            outcome = _fit_on(st, cluster.scheduler_address, 60)
        finally:
            worker.kill()
            worker.wait()
    assert isinstance(outcome.get("error"), InputError), outcome
    assert "cannot import tokdyn (ModuleNotFoundError" in str(outcome["error"]) and "the worker tcp://" in str(outcome["error"])


def test_a_block_task_checks_its_worker_s_version_before_it_reads_anything(tmp_path):
    """The check a dask task makes on its worker (here on no worker: said without an address),
    before the store is opened: the url names nothing, and the version's line comes first."""
    with pytest.raises(InputError, match=rf"^a worker process of the fit imported tokdyn {re.escape(tokdyn._version.build())}, the fit's process 0\.0\.1: tokdyn's files changed"):
        fitjob._fit_one_block(0, url=str(tmp_path / "nothing.zarr"), storage_options=None, run="r", rows=None, x=None,
                              options=None, backend="numpy", device=None, block=1, n=1, batch_rows=1, fit_id="f",
                              tokdyn_version="0.0.1")  # fmt: skip


@distributed_needed
@pytest.mark.filterwarnings("ignore:the dask scheduler at .* has no workers")  # none until the check is done
def test_a_worker_of_another_version_that_joins_after_the_check_fits_nothing(tmp_path, data):
    """The cluster's workers are asked for their tokdyn when a fit starts; a worker that joined
    later was sent blocks and fitted them with its own code, unchecked (a silent mix of two
    versions' results in one fit). Here a `dask worker` whose tokdyn says 0.0.1 joins once the
    check is done: the fit stops in one line naming it, and writes no block of its own."""
    import shutil

    import distributed

    other = tmp_path / "other"
    shutil.copytree(Path(tokdyn.__file__).parent, other / "tokdyn", ignore=shutil.ignore_patterns("__pycache__"))
    version = other / "tokdyn" / "_version.py"
    version.write_text(version.read_text().replace(f'__version__ = "{tokdyn.__version__}"', '__version__ = "0.0.1"'))
    st = make_store(tmp_path / "s.zarr", data[:200], token_chunk=100)
    workers: list = []
    real_check = fitjob._check_cluster_tokdyn

    def check_then_join(client, address):
        real_check(client, address)  # no workers yet: nobody to ask
        workers.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                                         "--no-nanny", "--dashboard-address", ":0"], cwd=tmp_path,
                                        env={**os.environ, "PYTHONPATH": str(other)},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip

    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=None) as cluster:
        try:
            fitjob._check_cluster_tokdyn = check_then_join
            outcome = _fit_on(st, cluster.scheduler_address, 90)
        finally:
            fitjob._check_cluster_tokdyn = real_check
            for w in workers:
                w.kill()
                w.wait()
    assert isinstance(outcome.get("error"), InputError), outcome
    msg = str(outcome["error"])
    assert "the worker tcp://" in msg and "runs tokdyn 0.0.1+" in msg and f", the fit {tokdyn._version.build()}: install the same tokdyn" in msg
    import zarr

    assert not zarr.open_array(str(tmp_path / "s.zarr" / "runs" / "r" / "fit" / "done"), mode="r")[...].any()


@distributed_needed
def test_a_worker_whose_tokdyn_predates_the_check_is_one_line(tmp_path, data, capsys, monkeypatch):
    """An older tokdyn's block task takes no ``tokdyn_version`` (nor, older still, ``fit_id``,
    which Python names first): its TypeError on the worker is said as what it means (here the
    job's task is one without those parameters)."""

    def older(b, *, url, storage_options, run, rows, x, options, backend, device, block, n, batch_rows, store=None,
              stop=None):  # fmt: skip
        raise AssertionError("not called with these arguments")

    older.__name__ = older.__qualname__ = "_fit_one_block"  # as Python names it in the TypeError

    line = _refit_on_a_cluster_fails(tmp_path, data, capsys, lambda: monkeypatch.setattr(fitjob, "_fit_one_block", older))
    assert "a worker of the dask cluster at" in line and "runs an older tokdyn, which does not take this version's tasks" in line


# -- an address whose host does not resolve ---------------------------------------------------


@distributed_needed
def test_a_host_that_does_not_resolve_is_said_as_such(monkeypatch):
    """`--scheduler tcp://nosuchhost.invalid:8786` (a typo in the host): dask's connect retried
    the name until the deadline and the fit said "did not answer within 10 s", as if a scheduler
    were there and busy. Now the name is resolved first: "cannot reach ...", at once."""
    monkeypatch.setattr(fitjob, "SCHEDULER_TIMEOUT", 3.0)
    t0 = time.monotonic()
    with pytest.raises(InputError, match=r"cannot reach the dask scheduler at tcp://nosuchhost\.invalid:8786: "):
        fitjob.check_scheduler("tcp://nosuchhost.invalid:8786")
    assert time.monotonic() - t0 < 3.0


def test_the_library_leaves_the_resource_tracker_s_warnings_to_the_user(tmp_path):
    """The tracker serves the whole process: quieted by a fit on processes inside a notebook, it hid
    the user's own leaks for good (found by review); only tokdyn's own command quiets it."""
    import subprocess
    import sys

    code = ("from tokdyn._process import spawn_context; spawn_context(); "
            "from multiprocessing import shared_memory; m = shared_memory.SharedMemory(create=True, size=64); m.close()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "leaked shared_memory" in p.stderr, p.stderr
