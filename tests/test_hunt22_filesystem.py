"""Hunt 22: stores on real file systems. A fit record its readers refuse is not called complete
by `tokdyn info`; a run that is a link is deleted as a link; a store file that cannot be read
while an export writes is said by its own path; a read-only store is read and never written."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tokdyn
from test_store_fit import STEPS, planted
from tokdyn.cli import main
from tokdyn.errors import InputError, StoreError
from tokdyn.fit.job import fit_run, fitted_inputs, read_fit, stored_options

ROOT = Path(__file__).resolve().parents[1]
N = 40


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A store whose run ``r`` has a complete fit, and no writer holding it."""
    url = tmp_path_factory.mktemp("fitted") / "s.zarr"
    Y = planted(N)[0]
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(N, dtype=np.int32), "token_pos": np.ones(N, np.int32)})
    with tokdyn.open_store(url, probe, mode="w").create_run("r", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            w.append(Y[:, j], step=int(step))
    fit_run(tokdyn.open_store(url, mode="r+").run("r"), backend="numpy", scheduler="sync", progress=False)
    return url


def _fit_line(url, capsys) -> tuple[int, str]:
    rc = main(["info", str(url)])
    out, _ = capsys.readouterr()
    return rc, next(line.strip() for line in out.splitlines() if line.strip().startswith("fit "))


def _readers_read(url) -> bool:
    """Whether the readers of a fit (its fields, its rows and x, its options) read it, or refuse
    it in one line."""
    run = tokdyn.open_store(url, mode="r").run("r")
    try:
        read_fit(run.store, "r", fields=["mu"])
        fitted_inputs(run)
        stored_options(run)
    except (StoreError, InputError) as exc:
        assert "\n" not in str(exc)
        return False
    return True


# -- a fit record its readers refuse is no complete fit --------------------------------------------

KEEP = object()  # the entry as the fit wrote it
_KEYS = ["options", "fields", "axis_min", "n_committed", "rows", "x", "complete"]
_VALUES = st.one_of(st.just(KEEP), st.none(), st.booleans(), st.integers(-3, 40), st.floats(allow_nan=False), st.text(max_size=4),
                    st.lists(st.integers(-1, 40), max_size=4), st.lists(st.floats(-1, 3), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2))  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(_KEYS), _VALUES, min_size=1, max_size=3))
@example(changes={"options": None})
@example(changes={"fields": {}})
@example(changes={"n_committed": "12"})
@example(changes={"rows": None})
@example(changes={"x": [0.0, 1.0]})
@example(changes={"options": KEEP})  # the record as written: complete, and read
def test_info_calls_a_fit_complete_exactly_when_its_readers_read_it(fitted, capsys, changes):
    """Whatever a complete fit's record holds, `tokdyn info` says "complete" exactly when every
    reader reads the fit; where they refuse it, info's line is the readers' (ERROR, exit 1) and
    names the refit. Info called a record with ``"options": null`` complete while every reader
    refused it."""
    path = fitted / "runs" / "r" / "fit" / "zarr.json"
    text = path.read_text()
    try:
        doc = json.loads(text)
        meta = doc["attributes"]["tokdyn_fit"]
        meta.update({k: v for k, v in changes.items() if v is not KEEP})
        path.write_text(json.dumps(doc))
        rc, line = _fit_line(fitted, capsys)
        complete = line.startswith("fit   complete:")
        assert complete == _readers_read(fitted), (changes, line)
        if complete:
            assert rc == 0
        elif meta.get("complete") is True and line.startswith("fit   ERROR"):
            assert rc == 1 and f"tokdyn fit {fitted} --run r" in line and "--refit" in line, line
    finally:
        path.write_text(text)


def test_the_refit_info_names_for_a_damaged_record_mends_it(fitted, tmp_path, capsys):
    url = tmp_path / "s.zarr"
    shutil.copytree(fitted, url)
    path = url / "runs" / "r" / "fit" / "zarr.json"
    doc = json.loads(path.read_text())
    doc["attributes"]["tokdyn_fit"]["options"] = None
    path.write_text(json.dumps(doc))
    rc, line = _fit_line(url, capsys)
    assert rc == 1 and "damaged" in line and "options" in line
    argv = shlex.split(re.search(r"`(tokdyn fit [^`]*)`", line).group(1))
    assert argv[-1] == "--refit"
    assert main(argv[1:] + ["--scheduler", "sync", "--no-progress", "--backend", "numpy"]) == 0
    capsys.readouterr()
    rc, line = _fit_line(url, capsys)
    assert rc == 0 and line.startswith("fit   complete:") and _readers_read(url)


# -- a run that is a link ----------------------------------------------------------------------------


def _listing(root) -> dict:
    """Every path under ``root`` (links not followed) with its size, mtime and mode."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(folder, name)
            s = os.lstat(p)
            out[os.path.relpath(p, root)] = (s.st_size, s.st_mtime_ns, s.st_mode)
    return out


@pytest.mark.parametrize("api", [False, True])
def test_deleting_a_run_that_is_a_link_removes_the_link_not_what_it_leads_to(fitted, tmp_path, capsys, api):
    """A run of another store linked into this one: delete-run deleted the other store's run
    metadata through the link (that store then read its run as damaged), then failed with
    "Cannot call rmtree on a symbolic link". Now the link goes, and the other store is as it was."""
    here, other = tmp_path / "here.zarr", tmp_path / "other.zarr"
    shutil.copytree(fitted, here)
    shutil.copytree(fitted, other)
    os.symlink(other / "runs" / "r", here / "runs" / "linked")
    before = _listing(other)
    assert tokdyn.open_store(here, mode="r").runs == ["linked", "r"]
    if api:
        st_ = tokdyn.open_store(here, mode="r+")
        assert st_.linked_run("linked") == os.path.realpath(other / "runs" / "r") and st_.linked_run("r") is None
        st_.delete_run("linked")
    else:
        assert main(["delete-run", str(here), "--run", "linked"]) == 0
        out, err = capsys.readouterr()
        assert err == "" and f"a link to {os.path.realpath(other / 'runs' / 'r')}, which is left as it is" in out
    assert not os.path.lexists(here / "runs" / "linked")
    assert _listing(other) == before
    assert tokdyn.open_store(here, mode="r").runs == ["r"]
    for url in (here, other):  # both stores read their run as before
        assert _readers_read(url)


def test_a_run_that_is_a_link_leading_nowhere_is_listed_said_and_deleted(fitted, tmp_path, capsys):
    """A linked run whose folder was moved or deleted: info left it out without a word (exit 0),
    readers said there was no such run, and an import under its name said the run "was created by
    another process at the same time". Now each says it is a link leading nowhere, naming where,
    nothing is written where it leads, and delete-run removes the link."""
    here, gone = tmp_path / "here.zarr", tmp_path / "moved-away" / "runs" / "r"
    shutil.copytree(fitted, here)
    os.symlink(gone, here / "runs" / "b")
    said = f"is a link to {gone}, which is not there"
    assert tokdyn.open_store(here, mode="r").runs == ["b", "r"]
    assert main(["info", str(here)]) == 1
    out, err = capsys.readouterr()
    assert "run b" in out and said in out and err.count("\n") == 1
    tokdyn.interchange.export_npz(tokdyn.open_store(here, mode="r").run("r"), tmp_path / "r.npz")
    for argv in (["spectrum", str(here), "--run", "b"], ["import-npz", str(tmp_path / "r.npz"), str(here), "--run", "b"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "tokdyn delete-run" in err, (argv, err)
    assert not os.path.lexists(tmp_path / "moved-away")
    assert main(["delete-run", str(here), "--run", "b"]) == 0
    assert f"a link to {gone}, which is not there" in capsys.readouterr().out
    assert not os.path.lexists(here / "runs" / "b") and tokdyn.open_store(here, mode="r").runs == ["r"]


def test_a_hidden_folder_or_link_under_runs_is_no_run(fitted, tmp_path, capsys):
    """A name no run can have (a hidden folder a file browser or notebook left, ``.old``; a hidden
    link leading nowhere) under ``runs/``: listed, it made ``tokdyn info`` fail on its name
    ("run name must be ... a leading dot") with no run shown, and ``spectrum`` ask for ``--run``
    among two runs. It is no run: the store lists and reads its one run."""
    here = tmp_path / "here.zarr"
    shutil.copytree(fitted, here)
    (here / "runs" / ".ipynb_checkpoints").mkdir()
    (here / "runs" / ".ipynb_checkpoints" / "notes.txt").write_text("x")
    os.symlink(tmp_path / "nowhere", here / "runs" / ".old")
    assert tokdyn.open_store(here, mode="r").runs == ["r"]
    assert main(["info", str(here)]) == 0
    out = capsys.readouterr().out
    assert "run r" in out and ".old" not in out and "ipynb" not in out
    assert main(["spectrum", str(here), "--json"]) == 0, capsys.readouterr().err


# -- a store file that cannot be read while an export writes ---------------------------------------


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO])
def test_an_unreadable_store_chunk_in_an_export_is_said_by_its_path(fitted, tmp_path, capsys, monkeypatch, code):
    """A loss chunk that may not be read (or whose disk fails) while export-npz writes its file:
    the line said "cannot write the losses.npz to OUT: Permission denied", sending the user after
    a folder they can write. Now it names the chunk, and no file (nor temporary file) is left."""
    chunk = os.path.join(str(fitted), "runs", "r", "loss", "c", "3", "0")
    assert os.path.isfile(chunk)
    read_bytes = pathlib.Path.read_bytes

    def failing(self):
        if os.fspath(self) == chunk:
            raise OSError(code, os.strerror(code), os.fspath(self))
        return read_bytes(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", failing)
    out = tmp_path / "o.npz"
    assert main(["export-npz", str(fitted), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and os.path.join("runs", "r", "loss", "c", "3", "0") in err, err
    assert "cannot write" not in err and os.strerror(code).lower() in err.lower()
    assert list(tmp_path.iterdir()) == []


def test_an_output_folder_that_cannot_be_written_is_still_said_as_the_output(fitted, tmp_path, monkeypatch):
    """The other side: a failure of the output itself still names the output."""
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / ".o.npz.x.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    from tokdyn.interchange import export_npz

    with pytest.raises(InputError, match=r"cannot write the losses.npz to .*o\.npz: Permission denied"):
        export_npz(tokdyn.open_store(fitted, mode="r").run("r"), tmp_path / "o.npz")


# -- a file of the store replaced by a folder ----------------------------------------------------------

FOLDERS = {"loss chunk": "runs/r/loss/c/3/0", "fit chunk": "runs/r/fit/mu/c/0", "run metadata": "runs/r/zarr.json",
           "commit record": "runs/r/commits/w0/zarr.json", "store metadata": "zarr.json", "probe metadata": "probe/zarr.json"}  # fmt: skip


@pytest.mark.parametrize("what", FOLDERS)
def test_a_store_file_replaced_by_a_folder_is_named_by_every_command(fitted, tmp_path, capsys, what):
    """A chunk or metadata file of the store replaced by a folder: zarr read it as absent ("chunk
    files of this row are missing", "no tokdyn store", a fit said to need --repair), and a write
    to it failed as "[Errno 21] Is a directory: '...partial' -> ...". Each command now either
    reads what it needs without it or names that folder, in one line."""
    url = tmp_path / "s.zarr"
    shutil.copytree(fitted, url)
    key = url / FOLDERS[what]
    key.unlink()
    key.mkdir()
    for argv in (["info", str(url)], ["spectrum", str(url)], ["export-npz", str(url), str(tmp_path / "o.npz")]):
        code = main(argv)
        err = capsys.readouterr().err
        assert code in (0, 1) and err.count("\n") == code, (argv, err)
        if code and argv[0] != "info":  # (info lists a run it cannot read, with the reason, on stdout)
            assert f"{key} is a folder where the store keeps a file" in err and "Errno" not in err, (argv, err)


def test_a_fit_chunk_replaced_by_a_folder_is_named_by_the_repair_and_mended_once_removed(fitted, tmp_path, capsys):
    url = tmp_path / "s.zarr"
    shutil.copytree(fitted, url)
    key = url / "runs" / "r" / "fit" / "mu" / "c" / "0"
    key.unlink()
    key.mkdir()
    repair = ["fit", str(url), "--run", "r", "--repair", "--scheduler", "sync", "--no-progress", "--backend", "numpy"]
    assert main(repair) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{key} is a folder where the store keeps a file" in err and "Errno" not in err, err
    key.rmdir()
    assert main(repair) == 0
    capsys.readouterr()
    assert _readers_read(url)


# -- a read-only store: read, never written ----------------------------------------------------------

_READ_ONLY = textwrap.dedent("""
    import json, sys
    from tokdyn.cli import main
    from contextlib import redirect_stderr, redirect_stdout
    import io
    results = []
    for argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            rc = main(argv)
        results.append([rc, err.getvalue()])
    print(json.dumps(results))
""")


def _read_only_runner(store) -> list[str] | None:
    """A command prefix that runs a process for which ``store`` is read-only as a file system
    makes it: a read-only bind mount of it (EROFS), where this process may mount (root in a
    container), else None."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("mount")):
        return None
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {shlex.quote(str(store))} {shlex.quote(str(store))} && "
                            f"mount -o remount,bind,ro {shlex.quote(str(store))}"], capture_output=True)  # fmt: skip
    if probe.returncode:
        return None
    q = shlex.quote(str(store))
    return ["unshare", "-m", "sh", "-c", f'mount --bind {q} {q} && mount -o remount,bind,ro {q} && exec "$@"', "sh"]


@pytest.mark.slow
def test_a_read_only_store_is_read_by_every_reader_and_refused_by_every_writer_in_one_line(fitted, tmp_path):
    """Every command that reads a store reads it on a read-only file system and writes nothing
    into it (listing, sizes and mtimes unchanged); every command that writes it ends in one line
    saying the file system is read-only and naming the store, with nothing half-written."""
    store = tmp_path / "s.zarr"
    shutil.copytree(fitted, store)
    prefix = _read_only_runner(store)
    if prefix is None:
        pytest.skip("needs a read-only bind mount (root, with unshare and mount)")
    tokdyn.interchange.export_npz(tokdyn.open_store(store, mode="r").run("r"), tmp_path / "in.npz")
    out = tmp_path / "out"
    out.mkdir()
    reads = [["info", str(store)], ["info", str(store), "--json"], ["spectrum", str(store)], ["reconstruct", str(store)],
             ["report", str(store), "--out", str(out / "r.html")], ["export-npz", str(store), str(out / "e.npz")]]  # fmt: skip
    writes = [["fit", str(store), "--run", "r", "--refit", "--scheduler", "sync"], ["delete-run", str(store), "--run", "r"],
              ["import-npz", str(tmp_path / "in.npz"), str(store), "--run", "again"]]  # fmt: skip
    before = _listing(store)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([*prefix, sys.executable, "-c", _READ_ONLY, json.dumps(reads + writes)], capture_output=True, text=True,
                       env=env, timeout=500)  # fmt: skip
    assert p.returncode == 0, p.stderr
    results = json.loads(p.stdout.strip().splitlines()[-1])
    for argv, (rc, err) in zip(reads, results[: len(reads)]):
        assert rc == 0 and err == "", (argv, err)
    for argv, (rc, err) in zip(writes, results[len(reads) :]):
        assert rc == 1 and err.count("\n") == 1 and "read-only file system" in err and str(store) in err, (argv, err)
    assert _listing(store) == before
    assert {p.name for p in out.iterdir()} == {"r.html", "e.npz"}
