"""`tokdyn delete-run` and TrajectoryStore.delete_run: a run is removed whole, damaged or not,
never from under a live writer, and the store's other runs are untouched."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokdyn
from reliability_fixtures import cli_error_line
from tokdyn.cli import main
from tokdyn.errors import RunBusyError, RunNotFoundError
from tokdyn.fit.job import fit_run
from tokdyn.store.locks import _proc_stat


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 50, (4, 9)), tokenizer={"kind": "byte"})
    url = str(tmp_path / "s.zarr")
    st = tokdyn.open_store(url, probe, mode="w")
    for name in ("keep", "gone"):
        with st.create_run(name, capacity=12).writer() as w:
            for step in (10, 30, 100, 300, 1000, 3000, 10_000, 30_000, 100_000, 300_000):
                w.append(rng.uniform(0, 5, probe.n_tokens).astype(np.float32), step=step)
    fit_run(st.run("gone"), progress=False)
    return url, st.run("keep").losses()


def _deleted(url, kept, capsys) -> str:
    """Delete run 'gone' by the CLI; check it is gone and 'keep' untouched; the line printed."""
    code, out, err = run_cli(["delete-run", url, "--run", "gone"], capsys)
    assert code == 0, err
    _after(url, kept)
    return out


def _refused(url, capsys) -> str:
    """Try to delete run 'gone' by the CLI; it must fail in one line, which is returned."""
    code, _, err = run_cli(["delete-run", url, "--run", "gone"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "gone" in tokdyn.open_store(url).runs, line
    return line


def _after(url, kept):
    st = tokdyn.open_store(url)
    assert st.runs == ["keep"] and np.array_equal(st.run("keep").losses(), kept)
    assert not (Path(url) / "runs" / "gone").exists()


def run_cli(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_deletes_a_fitted_run_and_says_what_it_held(store, capsys):
    url, kept = store
    out = _deleted(url, kept, capsys)
    assert "deleted run gone from" in out and "10 rows x 32 tokens, fitted" in out, out


@pytest.mark.parametrize("damage", ["zarr.json lost", "zarr.json garbage", "loss metadata lost"])
def test_a_damaged_run_is_deleted_too(damage, store, capsys):
    """delete_run opened the run first, so a run whose metadata was lost or unreadable could not
    be deleted, and its name stayed taken ('remove it by hand')."""
    url, kept = store
    run_dir = Path(url) / "runs" / "gone"
    {"zarr.json lost": lambda: (run_dir / "zarr.json").unlink(),
     "zarr.json garbage": lambda: (run_dir / "zarr.json").write_text("{not json"),
     "loss metadata lost": lambda: (run_dir / "loss" / "zarr.json").unlink()}[damage]()  # fmt: skip
    out = _deleted(url, kept, capsys)
    assert "damaged" in out, out


def _live_holder(proc) -> dict:
    return {"host": socket.gethostname(), "pid": proc.pid, "start": _proc_stat(proc.pid)[1], "since": "now", "token": "x"}


@pytest.mark.parametrize("lock", ["commits/w0/writer.lock", "commits/fit.lock"])
def test_a_run_a_live_process_writes_or_fits_is_not_deleted(lock, store, capsys):
    url, kept = store
    path = Path(url) / "runs" / "gone" / lock
    before = tokdyn.open_store(url).run("gone").losses()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path.write_text(json.dumps(_live_holder(proc)))
        line = _refused(url, capsys)
        assert "is being written" in line and str(proc.pid) in line, line
        with pytest.raises(RunBusyError):
            tokdyn.open_store(url, mode="r+").delete_run("gone")
        assert np.array_equal(tokdyn.open_store(url).run("gone").losses(), before)  # untouched
    finally:
        proc.kill()
        proc.wait()
    _deleted(url, kept, capsys)  # its holder is gone now (a crash): the lock no longer holds the deletion up


def test_a_run_being_created_by_a_live_process_is_not_deleted(store, capsys):
    url, _ = store
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        g = __import__("zarr").open_group(url + "/runs/gone", mode="r+")
        g.attrs["tokdyn_creating"] = _live_holder(proc)
        assert "is being created" in _refused(url, capsys)
    finally:
        proc.kill()
        proc.wait()


def test_a_lock_from_another_machine_holds_it_up_and_names_the_file_to_remove(store, capsys):
    """This machine cannot tell whether the holder still runs: refused, naming the lock; once
    removed (its process known gone), the deletion goes through."""
    url, kept = store
    lock = Path(url) / "runs" / "gone" / "commits" / "w0" / "writer.lock"
    lock.write_text(json.dumps({"host": "another-machine", "pid": 4242, "start": "1", "since": "then", "token": "t"}))
    line = _refused(url, capsys)
    assert "another-machine" in line and "remove the lock runs/gone/commits/w0/writer.lock" in line, line
    lock.unlink()
    _deleted(url, kept, capsys)


def test_a_missing_run_and_a_missing_name_are_one_line(store, capsys):
    url, kept = store
    code, _, err = run_cli(["delete-run", url, "--run", "nope"], capsys)
    assert code == 1 and "no run 'nope'" in cli_error_line(err)
    with pytest.raises(RunNotFoundError):
        tokdyn.open_store(url, mode="r+").delete_run("nope")
    with pytest.raises(SystemExit) as e:  # never the store's only run by default: --run is required
        main(["delete-run", url])
    assert e.value.code == 2
    assert tokdyn.open_store(url).runs == ["gone", "keep"]
