"""`tokdyn info` says where each run's fit stands (``run.fit.summary()``): none, complete,
stale, stopped, being fitted, a refit beside it, damaged; and the command it names goes on from
there (it is run here and must do what the line says)."""

from __future__ import annotations

import json
import re
import shlex
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokdyn
from test_store_fit import STEPS, _interrupt_at, make_store, planted
from tokdyn.cli import main
from tokdyn.fit import job as fitjob
from tokdyn.fit.job import fit_run, read_fit
from tokdyn.store import fit as fitstore

N, CHUNK = 250, 50  # 5 fit blocks


def _info(url, capsys) -> tuple[int, list[str], str]:
    """``tokdyn info`` of ``url``: its exit code, its lines about fits, and stderr."""
    rc = main(["info", str(url)])
    out, err = capsys.readouterr()
    return rc, [line.strip() for line in out.splitlines() if line.startswith("    ")], err


def _summary(url) -> dict:
    """The run's fit as ``tokdyn info --json`` gives it."""
    return tokdyn.open_store(url, mode="r").info()["runs"]["r"]["fit"]


def _run_named(line: str, capsys) -> int:
    """Run the ``tokdyn ...`` command a line of info names between backticks."""
    argv = shlex.split(re.search(r"`(tokdyn fit [^`]*)`", line).group(1))
    rc = main(argv[1:] + ["--scheduler", "sync", "--no-progress"])
    capsys.readouterr()
    return rc


@pytest.fixture
def fitted(tmp_path):
    """A store whose run has a complete fit (and the losses), on the backend every machine has."""
    store = make_store(tmp_path / "s.zarr", planted(N)[0], token_chunk=CHUNK)
    fit_run(store.run("r"), backend="numpy", scheduler="sync", progress=False)
    return tmp_path / "s.zarr"


def test_an_unfitted_run_names_the_command_that_fits_it(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    make_store(url, planted(N)[0], token_chunk=CHUNK)
    assert _summary(url) == {"fit": None, "refit": None, "lock": None}
    rc, lines, _ = _info(url, capsys)
    assert rc == 0 and lines == [f"fit   none: `tokdyn fit {url} --run r` fits it"]
    assert _run_named(lines[0], capsys) == 0
    assert tokdyn.open_store(url).run("r").fit.complete


def test_a_complete_fit_is_summarised_from_its_record(fitted, capsys):
    run = tokdyn.open_store(fitted, mode="r").run("r")
    meta = run.fit.meta
    got = _summary(fitted)
    assert got["refit"] is None and got["lock"] is None  # the fit's lock was released
    f = got["fit"]
    rows = int(np.count_nonzero(STEPS > 0))  # step 0 is not fitted (log10 of 0)
    assert (f["complete"], f["current"], f["rows"], f["n_committed"], f["blocks"], f["blocks_done"]) == (True, True, rows, len(STEPS), 5, 5)
    assert (f["backend"], f["seconds"], f["finished"]) == ("numpy", meta["seconds"], meta["finished"])
    json.dumps(got)
    rc, lines, _ = _info(fitted, capsys)
    assert rc == 0 and len(lines) == 1
    assert lines[0].startswith(f"fit   complete: {rows} rows, 5 blocks, numpy, ") and meta["finished"] in lines[0]


def test_a_stopped_fit_and_the_command_that_resumes_it(tmp_path, monkeypatch, capsys):
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    real = _interrupt_at(monkeypatch, 3)  # two blocks written, stopped in the third
    with pytest.raises(KeyboardInterrupt):
        fit_run(store.run("r"), axis_min=10, backend="numpy", scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    f = _summary(url)["fit"]
    assert (f["complete"], f["blocks_done"], f["blocks"], f["axis_min"]) == (False, 2, 5, 10)
    rc, lines, _ = _info(url, capsys)
    assert rc == 0 and len(lines) == 1 and lines[0].startswith("fit   stopped at 2 of 5 blocks: ")
    assert f"`tokdyn fit {url} --run r --axis-min 10`" in lines[0]  # the window it was started with
    calls = {"n": 0}
    monkeypatch.setattr(fitjob, "fit_block", lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1])
    assert _run_named(lines[0], capsys) == 0
    assert calls["n"] == 3  # resumed: only the blocks not done
    f = _summary(url)["fit"]
    assert f["complete"] and f["current"] and f["blocks_done"] == 5


def test_a_stopped_refit_beside_the_fit_and_the_command_that_resumes_it(fitted, monkeypatch, capsys):
    before = read_fit(tokdyn.open_store(fitted, mode="r"), "r")
    real = _interrupt_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fit_run(tokdyn.open_store(fitted).run("r"), axis_min=10, refit=True, backend="numpy", scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    got = _summary(fitted)
    assert got["fit"]["complete"] and got["fit"]["axis_min"] is None  # readers still read the old fit
    r = got["refit"]
    assert (r["complete"], r["blocks_done"], r["blocks"], r["axis_min"]) == (False, 2, 5, 10)
    rc, lines, _ = _info(fitted, capsys)
    assert rc == 0 and len(lines) == 2 and lines[0].startswith("fit   complete: ")
    assert lines[1].startswith("refit stopped at 2 of 5 blocks, beside the fit above") and "--refit starts it over" in lines[1]
    for name, values in read_fit(tokdyn.open_store(fitted, mode="r"), "r").items():
        np.testing.assert_array_equal(values, before[name])
    assert _run_named(lines[1], capsys) == 0
    got = _summary(fitted)
    assert got["refit"] is None and got["fit"]["axis_min"] == 10 and got["fit"]["current"]


def test_a_stale_fit_names_the_refit_that_fits_the_new_rows(fitted, capsys):
    tokdyn.open_store(fitted).run("r").writer(resume=True).append(planted(N, seed=1)[0][:, -1], step=int(STEPS[-1]) * 2)
    f = _summary(fitted)["fit"]
    assert f["complete"] and not f["current"] and f["n_committed"] == len(STEPS)
    rc, lines, _ = _info(fitted, capsys)
    assert rc == 0 and lines[0].startswith(f"fit   complete but stale, made on {len(STEPS)} committed rows: ")
    assert "--refit`" in lines[0]
    assert _run_named(lines[0], capsys) == 0
    f = _summary(fitted)["fit"]
    assert f["current"] and f["n_committed"] == len(STEPS) + 1


def test_a_fit_being_written_names_its_process(fitted, capsys):
    run = tokdyn.open_store(fitted).run("r")
    lock = run.fit._lock()
    lock.claim()  # as a running fit holds it
    try:
        got = _summary(fitted)
        assert got["lock"]["state"] == "self" and isinstance(got["lock"]["pid"], int)
        rc, lines, _ = _info(fitted, capsys)
        assert rc == 0 and lines[0].startswith("fit   complete: ")  # a complete fit: a no-op fit may hold the lock
        fitstore.zarr_sync(run._group.store.delete(fitstore.join(run._group.path, "fit", "zarr.json")))  # not started yet
        rc, lines, _ = _info(fitted, capsys)
        assert rc == 0 and lines == [f"fit   being started by process {got['lock']['pid']} on {got['lock']['host']}, since {got['lock']['since']}"]
    finally:
        lock.release()


def test_a_refit_whose_move_was_stopped_is_said_and_moved_by_the_next_fit(fitted, monkeypatch, capsys):
    """A refit complete but not yet in the fit's place (its move stopped before it began): info
    says the next fit moves it; once the old fit's record is gone (a move stopped after its first
    change), readers read the refit, which info shows as the fit."""
    def stopped(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(fitstore.FitWriter, "_swap", stopped)
    with pytest.raises(KeyboardInterrupt):
        fit_run(tokdyn.open_store(fitted).run("r"), axis_min=10, refit=True, backend="numpy", scheduler="sync", progress=False)
    monkeypatch.undo()
    got = _summary(fitted)
    assert got["fit"]["axis_min"] is None and got["refit"]["complete"] and got["refit"]["axis_min"] == 10
    rc, lines, _ = _info(fitted, capsys)
    assert rc == 0 and lines[1].startswith("refit complete, not yet in the fit's place")
    run = tokdyn.open_store(fitted).run("r")
    fitstore.zarr_sync(run._group.store.delete(fitstore.join(run._group.path, "fit", "zarr.json")))  # the move's first change
    got = _summary(fitted)
    assert got["fit"]["axis_min"] == 10 and got["fit"]["complete"] and got["refit"] is None
    fit_run(tokdyn.open_store(fitted).run("r"), axis_min=10, backend="numpy", scheduler="sync", progress=False)
    got = _summary(fitted)
    assert got["fit"]["axis_min"] == 10 and got["refit"] is None
    assert not (fitted / "runs" / "r" / "fit_next").exists()


@pytest.mark.parametrize("damage", ["record", "record gone", "done", "block_tokens"])
def test_a_damaged_fit_is_one_line_and_exit_1(fitted, capsys, damage):
    fit = fitted / "runs" / "r" / "fit"
    if damage == "record":
        (fit / "zarr.json").write_text("{not json")
    elif damage == "record gone":  # readers take the run as not fitted: info says it is damaged
        (fit / "zarr.json").unlink()
    elif damage == "done":
        for chunk in (fit / "done").rglob("c/*"):
            if chunk.is_file():
                chunk.write_bytes(b"\x00garbage")
    else:
        meta = json.loads((fit / "zarr.json").read_text())
        meta["attributes"]["tokdyn_fit"]["block_tokens"] = "many"
        (fit / "zarr.json").write_text(json.dumps(meta))
    assert "error" in _summary(fitted)["fit"]
    rc, lines, err = _info(fitted, capsys)
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("fit   ERROR: ")
    assert err.count("\n") == 1 and err.startswith("tokdyn info: error: the fit of 1 run(s) cannot be read: r")


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(max_size=30), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=6)  # fmt: skip
_KEYS = ["complete", "n_committed", "rows", "axis_min", "backend", "device", "seconds", "created", "finished",
         "tokdyn_version", "block_tokens", "fit_id"]  # fmt: skip


@pytest.fixture(scope="module")
def one_fit(tmp_path_factory):
    url = tmp_path_factory.mktemp("hostile") / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    fit_run(store.run("r"), backend="numpy", scheduler="sync", progress=False)
    return url


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(_KEYS), _JSON, min_size=1, max_size=4), staged=st.booleans())
def test_info_says_any_fit_record_in_lines_never_a_traceback(one_fit, capsys, changes, staged):
    """Whatever values a fit's record holds (a record damaged, or written by other code), info
    prints its lines, escaped, and exits 0 or 1 (1 only where the fit cannot be read)."""
    path = one_fit / "runs" / "r" / ("fit_next" if staged else "fit")
    if staged:  # the record as a refit's beside the fit
        shutil.copytree(one_fit / "runs" / "r" / "fit", path)
    text = (path / "zarr.json").read_text()
    try:
        meta = json.loads(text)
        meta["attributes"]["tokdyn_fit"].update(changes)
        (path / "zarr.json").write_text(json.dumps(meta))
        rc, lines, err = _info(one_fit, capsys)
        assert rc in (0, 1) and 1 <= len(lines) <= 2, (lines, err)
        assert all(line.isprintable() for line in lines)
        assert (rc == 1) == ("ERROR:" in "".join(lines)) and (rc == 0 or err.count("\n") == 1)
        json.dumps(tokdyn.open_store(one_fit, mode="r").info())
    finally:
        if staged:
            shutil.rmtree(path)
        else:
            (path / "zarr.json").write_text(text)


def test_a_fit_of_one_block_is_one_block(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(40)[0])  # one chunk of tokens: one fit block
    fit_run(store.run("r"), backend="numpy", scheduler="sync", progress=False)
    rc, lines, _ = _info(url, capsys)
    assert rc == 0 and ", 1 block, numpy, " in lines[0]
