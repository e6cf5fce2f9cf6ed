"""`tokdyn fit` under interruption, concurrency and odd environments (hunt 23). Each test failed
before its fix (docs/fitting.md, "Fitting a store")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import pytest

from reliability_fixtures import cli_error_line
from test_store_fit import make_store, planted
from tokdyn._checks import numba_setting

ROOT = Path(__file__).resolve().parents[1]


def _tokdyn(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`python -m tokdyn ARGS` in a fresh process (numba reads its settings as it is imported)
    under ``env`` added to this one's, with this checkout first on the path."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    full.update(env, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "tokdyn", *args], env=full, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("hunt23") / "s.zarr")
    Y, _, _ = planted(40)
    make_store(url, Y, token_chunk=20)
    return url


# -- numba's settings in the environment -----------------------------------------------------------


@pytest.mark.parametrize("name, value", [
    ("NUMBA_NUM_THREADS", "0"),        # numba's import raised ValueError: a traceback before any command ran
    ("NUMBA_NUM_THREADS", "-2"),
    ("NUMBA_NUM_THREADS", "two"),      # numba's warning, with its traceback, then the default
    ("NUMBA_DISABLE_JIT", "1"),        # "internal error ... <intrinsic ...> is not usable in pure-python (a bug ...)"
    ("NUMBA_THREADING_LAYER", "fast"),  # "internal error ... The threading layer requested 'fast' is unknown"
])  # fmt: skip
def test_a_numba_setting_numba_refuses_is_one_line_naming_it(name, value, small_store):
    """A researcher's shell with a numba setting numba refuses: every tokdyn command was a
    traceback (NUMBA_NUM_THREADS=0 fails numba's import, which the CLI made before parsing), numba's
    multi-line warning, or a fit that said "internal error ... a bug". Now one line names the
    variable, exit 1, and the store is not touched (no fit group)."""
    done = _tokdyn(["fit", small_store, "--run", "r", "--no-progress", "--no-two-step"], {name: value})
    line = cli_error_line(done.stderr)
    said_by = "tokdyn" if name == "NUMBA_NUM_THREADS" else "tokdyn fit"  # numba's import, or its compiled kernels
    assert done.returncode == 1 and line.startswith(f"{said_by}: error: {name}={value!r}"), done.stderr
    assert not (Path(small_store) / "runs" / "r" / "fit").exists()


@pytest.mark.parametrize("name, value", [("NUMBA_DISABLE_JIT", "1"), ("NUMBA_THREADING_LAYER", "fast")])
def test_a_setting_only_compiled_kernels_need_leaves_the_other_commands_be(name, value, small_store):
    """Review of hunt 23: the first check refused every command under a setting only numba's
    compiler or threads refuse, so `tokdyn info` under NUMBA_DISABLE_JIT=1 (a debugging setting),
    which read the store before, said "tokdyn: error: NUMBA_DISABLE_JIT='1' ...". Such a setting
    is refused where compiled kernels run (the numba backend, above) and nowhere else: info reads
    the store, and the numpy backend fits the planted tokens (independent of numba's kernels)."""
    info = _tokdyn(["info", small_store], {name: value})
    assert info.returncode == 0 and "error" not in info.stderr and "run r" in info.stdout, info.stderr
    done = _tokdyn(["fit", small_store, "--run", "r", "--no-progress", "--no-two-step", "--backend", "numpy", "--json"],
                   {name: value})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status_counts"].get("converged", 0) >= 30


def test_numba_settings_it_takes_are_taken(small_store, tmp_path):
    """The check refuses only what numba refuses: a thread count, a named layer in any case and
    the compiler left on fit as before (the fit's own results, to the bit, on one thread)."""
    done = _tokdyn(["fit", small_store, "--run", "r", "--no-progress", "--no-two-step", "--json"],
                   {"NUMBA_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "WorkQueue", "NUMBA_DISABLE_JIT": "0"})  # fmt: skip
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr


@pytest.mark.parametrize("env, refused", [
    ({}, None),
    ({"NUMBA_NUM_THREADS": "1"}, None),
    ({"NUMBA_NUM_THREADS": " 16 "}, None),  # int() takes the spaces, as numba reads it
    ({"NUMBA_NUM_THREADS": "+3"}, None),
    ({"NUMBA_NUM_THREADS": ""}, "NUMBA_NUM_THREADS"),
    ({"NUMBA_NUM_THREADS": "1.5"}, "NUMBA_NUM_THREADS"),
    ({"NUMBA_DISABLE_JIT": "0"}, None),
    ({"NUMBA_DISABLE_JIT": "yes"}, "NUMBA_DISABLE_JIT"),
    ({"NUMBA_DISABLE_JIT": "2"}, "NUMBA_DISABLE_JIT"),
    ({"NUMBA_THREADING_LAYER": "OMP"}, None),  # numba lowers the name
    ({"NUMBA_THREADING_LAYER": "safe"}, None),
    ({"NUMBA_THREADING_LAYER": " omp"}, "NUMBA_THREADING_LAYER"),  # numba does not strip it
])  # fmt: skip
def test_numba_setting_reads_the_values_as_numba_does(env, refused):
    why = numba_setting(env)
    assert (why is None) == (refused is None) and (refused is None or why.startswith(refused)), why


def test_a_threading_layer_this_machine_lacks_is_one_line(tmp_path):
    """NUMBA_THREADING_LAYER=tbb without TBB installed: "internal error ... No threading layer
    could be loaded" at the first kernel; now the backend's check says it, naming the variable."""
    pytest.importorskip("numba")
    import importlib.util

    if importlib.util.find_spec("tbb") is not None:
        pytest.skip("TBB is installed here")
    url = str(tmp_path / "s.zarr")
    make_store(url, planted(40)[0], token_chunk=20)
    done = _tokdyn(["fit", url, "--run", "r", "--no-progress", "--no-two-step"], {"NUMBA_THREADING_LAYER": "tbb"})
    line = cli_error_line(done.stderr)
    assert done.returncode == 1 and line.startswith("tokdyn fit: error: numba cannot start its threads") and "'tbb'" in line
    assert not (Path(url) / "runs" / "r" / "fit").exists()  # said before the fit group is made


def test_the_numpy_backend_fits_on_worker_processes_where_numba_refuses_the_environment(tmp_path):
    """`fit_run(run, backend="numpy", scheduler="processes")` with NUMBA_NUM_THREADS=0: the
    numpy backend needs no numba, but each worker process imported numba to set its threads,
    died of numba's ValueError (its traceback on stderr) and the fit said "a worker process of
    the fit died ... out of memory?". Now the workers leave numba alone and the fit equals the
    same fit on this process's threads, to the bit."""
    from tokdyn.fit import FIT_FIELDS
    from tokdyn.fit.job import fit_run, read_fit

    url = str(tmp_path / "s.zarr")
    st = make_store(url, planted(40)[0], token_chunk=20)
    fit_run(st.run("r"), backend="numpy", progress=False)
    expected = read_fit(st, "r")
    code = ("import sys, tokdyn; from tokdyn.fit import fit_run; "
            "r = fit_run(tokdyn.open_store(sys.argv[1], mode='r+').run('r'), backend='numpy', scheduler='processes', "
            "workers=2, refit=True, progress=False); print(r.blocks_fitted)")  # fmt: skip
    full = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    full.update(NUMBA_NUM_THREADS="0", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code, url], env=full, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["2"] and "Traceback" not in done.stderr, done.stderr
    got = read_fit(url, "r")
    for name in FIT_FIELDS:
        assert np.array_equal(got[name], expected[name], equal_nan=True), name


def test_a_run_of_one_token_is_one_token_and_sync_says_it_ignores_workers(tmp_path, capsys):
    """A run of one token was "fitted run 'r': 1 tokens"; `--scheduler sync --workers 4` fitted
    on one thread without a word (a cluster address says it ignores --workers). Now "1 token", and
    the warning names what sync does; the fit is the same as without --workers."""
    from tokdyn.cli import main
    from tokdyn.fit.job import read_fit

    url = str(tmp_path / "s.zarr")
    make_store(url, planted(1)[0])
    assert main(["fit", url, "--run", "r", "--scheduler", "sync", "--workers", "4", "--no-progress", "--no-two-step"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("fitted run 'r': 1 token on ") and "1 tokens" not in out, out
    assert err.splitlines() == ["tokdyn fit: warning: workers=4 is ignored: the sync scheduler fits one block at a time "
                                "in this thread (use threads or processes for more)"], err  # fmt: skip
    first = read_fit(url, "r")
    assert main(["fit", url, "--run", "r", "--scheduler", "sync", "--refit", "--no-progress", "--no-two-step"]) == 0
    assert capsys.readouterr().err == ""  # no --workers: no warning
    for name, v in read_fit(url, "r").items():
        assert np.array_equal(v, first[name], equal_nan=True), name


# -- SIGTERM ------------------------------------------------------------------------------------

_SLOW_FIT = """
import sys, time
from pathlib import Path
import tokdyn.fit.job as job
from tokdyn.cli import main

real, marker = job._fit_one_block, Path(sys.argv[2])

def slow(b, **kw):  # each block a while: the SIGTERM lands mid-fit, after a first block is done
    out = real(b, **kw)
    marker.write_text(str(b))
    time.sleep(0.3)
    return out

job._fit_one_block = slow
sys.exit(main(["fit", sys.argv[1], "--run", "r", "--no-progress", "--no-two-step", "--workers", "1"]))
"""


def test_a_sigterm_stops_the_fit_as_a_ctrl_c_does_and_lets_go_of_its_lock(tmp_path):
    """A batch system preempts a job with SIGTERM: `tokdyn fit` died at once, without a word,
    leaving its fit lock behind, which a job requeued on another machine cannot tell from a
    live one ("this machine cannot tell whether it still runs"). Now it stops as for a Ctrl-C:
    one line, exit 143, the lock let go, the blocks done kept, and the resume equals an
    uninterrupted fit."""
    import shutil
    import signal
    import time

    import zarr

    import tokdyn
    from tokdyn.cli import main
    from tokdyn.fit import FitOptions
    from tokdyn.fit.job import fit_run, read_fit

    url = tmp_path / "s.zarr"
    make_store(str(url), planted(120)[0], token_chunk=10)  # 12 blocks
    shutil.copytree(url, tmp_path / "whole.zarr")
    marker = tmp_path / "first-block"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    p = subprocess.Popen([sys.executable, "-c", _SLOW_FIT, str(url), str(marker)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143 and cli_error_line(err) == "tokdyn fit: terminated (SIGTERM)", (p.returncode, err)
    assert not (url / "runs" / "r" / "commits" / "fit.lock").exists()  # let go: any machine may resume
    done = zarr.open_array(url / "runs" / "r" / "fit" / "done", mode="r")[:]
    assert 1 <= np.count_nonzero(done) < done.size  # stopped mid-fit, with its blocks done kept
    assert main(["fit", str(url), "--run", "r", "--no-progress", "--no-two-step"]) == 0
    fit_run(tokdyn.open_store(str(tmp_path / "whole.zarr"), mode="r+").run("r"), options=FitOptions(two_step=False), progress=False)
    expected, got = read_fit(str(tmp_path / "whole.zarr"), "r"), read_fit(str(url), "r")
    for name, v in expected.items():
        assert np.array_equal(got[name], v, equal_nan=True), name


_NUMBA_READS = """
import warnings
warnings.simplefilter("error")  # numba's warning of a value it cannot parse: refused
try:
    import numba
    print("ok" if numba.config.DISABLE_JIT == 0 else "refused")
except Exception:
    print("refused")
"""


@pytest.mark.parametrize("name, value", [
    ("NUMBA_NUM_THREADS", "1"), ("NUMBA_NUM_THREADS", " 3"), ("NUMBA_NUM_THREADS", "0"), ("NUMBA_NUM_THREADS", "1e3"),
    ("NUMBA_NUM_THREADS", ""), ("NUMBA_DISABLE_JIT", "0"), ("NUMBA_DISABLE_JIT", "1"), ("NUMBA_DISABLE_JIT", "on"),
])  # fmt: skip
def test_numba_setting_agrees_with_numba_itself(name, value):
    """The independent answer: numba imported under the setting, in a fresh process, takes it
    (no warning, no error, its compiler on) exactly where numba_setting does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env[name] = value
    got = subprocess.run([sys.executable, "-c", _NUMBA_READS], env=env, capture_output=True, text=True, timeout=120)
    assert got.stdout.split() == ["ok" if numba_setting({name: value}) is None else "refused"], got.stderr


# -- a scheduler address where nothing listens ------------------------------------------------------


def test_a_port_where_nothing_listens_is_said_the_same_way_every_time():
    """`--scheduler tcp://HOST:PORT` with no scheduler at that port: dask's connect and the
    check's own deadline were the same, so the line was "cannot reach ... Timed out trying to
    connect" or "did not answer within 10 s" (a server that is there but silent) at random, 5
    times in 8 the latter. Now dask's deadline comes first: the same line every time, in about
    the deadline; a silent server is still "did not answer"."""
    import socket
    import threading
    import time

    from tokdyn.errors import InputError
    from tokdyn.fit.job import check_scheduler

    pytest.importorskip("distributed")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # the port is free: connections to it are refused
    for _ in range(6):
        t0 = time.monotonic()
        with pytest.raises(InputError) as exc:
            check_scheduler(address, timeout=0.4)
        assert str(exc.value).startswith(f"cannot reach the dask scheduler at {address}: Timed out trying to connect")
        assert time.monotonic() - t0 < 5
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    held = []  # the accepted connection, kept open and unanswered
    threading.Thread(target=lambda: held.append(silent.accept()), daemon=True).start()
    try:
        with pytest.raises(InputError, match="did not answer within 0.4 s"):
            check_scheduler(f"tcp://127.0.0.1:{silent.getsockname()[1]}", timeout=0.4)
    finally:
        silent.close()
