"""Hunt 8, the command line of `tokdyn demo` and `tokdyn fit` and the CLI's shared plumbing:

- the demo replaces the store an earlier demo left in its folder, and no other (it deleted any
  `store.zarr`, runs and all), and never writes into a folder that is a store itself;
- a second demo into a folder where one runs is refused; one left by a killed demo is taken over;
- the store it replaces takes its summary.json and report.html with it (a stopped rerun left a
  summary of a store that was gone);
- demo settings it cannot finish with (a count out of range, steps and points too few for a
  fit) are one line naming the option, before the corpus is read and the model trained (the fit
  found too few points only after the whole training; a huge --steps was an internal error);
- `--out ""` is refused, not the current folder;
- `tokdyn fit` names the option a bad value came in (`--workers`), not a library parameter;
- a stdout that cannot encode a name (PYTHONIOENCODING=ascii, an old locale) prints it escaped,
  as stderr does, instead of an "internal error" after the work was done.

The demo's corpus reading is replaced by a sentinel that says whether the work started: every
check here must come before it.
"""

from __future__ import annotations

import io
import json
import os
import sys

import numpy as np
import pytest

import tokdyn
import tokdyn.demo as demo
from reliability_fixtures import cli_error_line, live_foreign_owner, snapshot
from test_hostile import fitted_store
from tokdyn.cli import main
from tokdyn.errors import InputError


class _Started(InputError):
    """Raised where the demo's work would start (reading the corpus)."""


@pytest.fixture
def started(monkeypatch):
    """A list that gets one entry when the demo starts its work (which then stops at once)."""
    calls: list = []

    def corpus(**kwargs):
        calls.append(kwargs)
        raise _Started("work started")

    monkeypatch.setattr(demo, "prepare_corpus", corpus)
    return calls


def _demo(out, *extra):
    return main(["demo", "--out", str(out), "--steps", "12", "--points", "8", "--probe-sequences", "6", "--no-progress", *extra])


def _demo_store(path):
    """A store as an earlier demo leaves it: run 'tiny' alone."""
    probe = tokdyn.ProbeSet(None, {"sample_id": np.zeros(4, np.int32), "token_pos": np.arange(1, 5, dtype=np.int32)})
    st = tokdyn.open_store(path, probe, mode="w")
    with st.create_run("tiny", capacity=3).writer() as w:
        for step in (0, 1, 2):
            w.append(np.ones(4, np.float32), step=step)
    return st


# -- the demo folder ------------------------------------------------------------------------------


def test_the_demo_never_deletes_a_store_it_did_not_write(tmp_path, started, capsys):
    out = tmp_path / "work"
    fitted_store(out / "store.zarr", fit=False)  # the user's own store, run 'r', where the demo puts its own
    before = snapshot(out)
    assert _demo(out) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert "store.zarr" in line and "runs r" in line, line
    assert snapshot(out) == before and not started


@pytest.mark.parametrize("kind", ["file", "link"])
def test_the_demo_never_replaces_a_file_or_a_link_named_like_its_store(tmp_path, started, capsys, kind):
    out = tmp_path / "work"
    out.mkdir()
    target = tmp_path / "elsewhere.zarr"
    fitted_store(target, fit=False)
    if kind == "file":
        (out / "store.zarr").write_text("mine")
    else:
        os.symlink(target, out / "store.zarr")
    before = (snapshot(out), snapshot(target))
    assert _demo(out) == 1
    assert "store.zarr" in cli_error_line(capsys.readouterr().err)
    assert (snapshot(out), snapshot(target)) == before and not started


def test_a_demo_folder_that_is_a_store_is_refused_before_any_work(tmp_path, started, capsys):
    """`tokdyn demo --out runs.zarr`: its store, report and summary went inside the user's store,
    and `tokdyn info runs.zarr` went on showing the outer store, not the demo's."""
    fitted_store(tmp_path / "runs.zarr", fit=False)
    before = snapshot(tmp_path / "runs.zarr")
    assert _demo(tmp_path / "runs.zarr") == 1
    assert "is a zarr store itself" in cli_error_line(capsys.readouterr().err)
    assert snapshot(tmp_path / "runs.zarr") == before and not started


def test_an_earlier_demos_store_is_replaced_with_its_summary_and_report(tmp_path, monkeypatch, capsys):
    """The positive control of the refusals above, and a rerun stopped after it replaced the
    store (at training, the corpus prepared) leaves no summary.json or report.html of the store
    that is gone."""
    def train(*args, **kwargs):
        raise _Started("training started")

    monkeypatch.setattr(demo, "record_tiny_run", train)
    out = tmp_path / "demo"
    _demo_store(out / "store.zarr")
    (out / "summary.json").write_text(json.dumps({"store": str(out / "store.zarr")}))
    (out / "report.html").write_text("<html>the old run</html>")
    assert _demo(out) == 1  # stopped where the training starts
    assert "training started" in cli_error_line(capsys.readouterr().err)
    assert not (out / "store.zarr").exists()
    assert not (out / "summary.json").exists() and not (out / "report.html").exists()
    assert not (out / demo._LOCK).exists()  # the folder lock is let go on the way out


def test_a_setting_the_corpus_refuses_leaves_the_earlier_demo_as_it_was(tmp_path, capsys):
    """`--probe-sequences 100000000` passes the checks made before any work; the corpus refuses it.
    The earlier demo's store, summary and report were deleted first, leaving an empty folder."""
    out = tmp_path / "demo"
    _demo_store(out / "store.zarr")
    (out / "summary.json").write_text(json.dumps({"store": str(out / "store.zarr")}))
    (out / "report.html").write_text("<html>the old run</html>")
    before = snapshot(out / "store.zarr")
    assert main(["demo", "--out", str(out), "--steps", "12", "--points", "8", "--probe-sequences", "100000000",
                 "--no-progress"]) == 1  # fmt: skip
    assert "asked for 100000000" in cli_error_line(capsys.readouterr().err)
    assert snapshot(out / "store.zarr") == before and (out / "report.html").read_text() == "<html>the old run</html>"
    assert (out / "summary.json").exists() and not (out / demo._LOCK).exists()


def test_an_empty_store_folder_left_by_a_demo_is_replaced(tmp_path, started, capsys):
    (tmp_path / "demo" / "store.zarr").mkdir(parents=True)
    assert _demo(tmp_path / "demo") == 1
    assert "work started" in cli_error_line(capsys.readouterr().err)


def test_a_second_demo_into_a_folder_where_one_runs_is_refused(tmp_path, started, capsys):
    out = tmp_path / "demo"
    _demo_store(out / "store.zarr")  # the first demo's store, being recorded
    (out / demo._LOCK).write_text(json.dumps(live_foreign_owner()))
    before = snapshot(out / "store.zarr")
    assert _demo(out) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert "being written" in line and "wait for it to finish" in line, line
    assert snapshot(out / "store.zarr") == before and not started
    assert (out / demo._LOCK).exists()  # the other demo's lock is left to it


def test_a_lock_left_by_a_killed_demo_is_taken_over(tmp_path, started, capsys):
    out = tmp_path / "demo"
    _demo_store(out / "store.zarr")
    gone = {**live_foreign_owner(), "pid": 2**22 + 12345, "start": "1"}  # no such process
    (out / demo._LOCK).write_text(json.dumps(gone))
    assert _demo(out) == 1
    assert "work started" in cli_error_line(capsys.readouterr().err)
    assert not (out / demo._LOCK).exists()


def test_an_empty_out_is_not_the_current_folder(tmp_path, started, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _demo_store(tmp_path / "store.zarr")  # what `--out ""` replaced: the store in the current folder
    before = snapshot(tmp_path)
    assert _demo("") == 1
    assert "empty path" in cli_error_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before and not started


# -- the demo's settings ----------------------------------------------------------------------------


@pytest.mark.parametrize("argv,option", [
    (["--steps", "0"], "--steps"), (["--steps", "-5"], "--steps"), (["--steps", str(10**22)], "--steps"),
    (["--points", "1"], "--points"), (["--probe-sequences", "0"], "--probe-sequences"), (["--seed", "-1"], "--seed"),
    # a schedule of 1..5 holds 5 steps after step 0 whatever the points; 5 points hold 5; a fit needs 6
    (["--steps", "5", "--points", "40"], "--steps"), (["--steps", "1"], "--steps"), (["--steps", "800", "--points", "5"], "--points"),
])  # fmt: skip
def test_demo_settings_it_cannot_finish_with_are_refused_before_any_work(tmp_path, started, capsys, argv, option):
    assert _demo(tmp_path / "demo", *argv) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert line.startswith("tokdyn demo: error: ") and option in line and "internal error" not in line, line
    assert not started and not (tmp_path / "demo").exists()


@pytest.mark.parametrize("steps,points", [(6, 40), (12, 8), (800, 6)])
def test_the_fewest_steps_and_points_a_fit_takes_start_the_work(tmp_path, started, capsys, steps, points):
    """The positive control: 1..6 are six steps after step 0, and six log-spaced points of 800
    are six distinct steps (1, 4, 15, 55, 210, 800)."""
    assert _demo(tmp_path / "demo", "--steps", str(steps), "--points", str(points)) == 1
    assert "work started" in cli_error_line(capsys.readouterr().err) and len(started) == 1


# -- tokdyn fit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,option", [
    (["--workers", "0"], "--workers"), (["--batch-rows", "-5"], "--batch-rows"), (["--min-points", "3"], "--min-points"),
    (["--vocab-size", "1"], "--vocab-size"), (["--axis-min", "nan"], "--axis-min"), (["--axis-min", "inf"], "--axis-min"),
])  # fmt: skip
def test_a_fit_option_out_of_range_is_named_as_typed(tmp_path, capsys, argv, option):
    path = tmp_path / "s.zarr"
    fitted_store(path, fit=False)
    before = snapshot(path)
    assert main(["fit", str(path), "--no-progress", *argv]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert line.startswith(f"tokdyn fit: error: {option} "), line
    assert "FitOptions" not in line and "None" not in line, line
    assert snapshot(path) == before


def test_fit_options_in_range_still_fit(tmp_path, capsys):
    path = tmp_path / "s.zarr"
    fitted_store(path, fit=False)
    assert main(["fit", str(path), "--no-progress", "--workers", "1", "--batch-rows", "7", "--min-points", "5",
                 "--vocab-size", "300", "--json"]) == 0  # fmt: skip
    got = json.loads(capsys.readouterr().out)
    stored = tokdyn.fit.read_fit(path, "r", fields=("status",))
    assert got["n_tokens"] == stored["status"].size == 60
    assert tokdyn.fit.stored_options(tokdyn.open_store(path).run("r")).min_points == 5


# -- stdout --------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_stdout_that_cannot_encode_a_name_prints_it_escaped(tmp_path, monkeypatch, capsys, encoding):
    path = tmp_path / "données α.zarr"
    fitted_store(path, fit=False)
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding=encoding, errors="strict")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["info", str(path)]) == 0
    assert capsys.readouterr().err == ""
    out.flush()
    text = raw.getvalue().decode(encoding)
    assert str(path).encode(encoding, "backslashreplace").decode(encoding) in text, text  # "donn\\xe9es \\u03b1.zarr"
    assert out.errors == "strict"  # the caller's stdout is given back as it was


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_plain_fit_after_one_on_another_backend_keeps_it(tmp_path, capsys, backend):
    """`tokdyn fit --backend numpy`, then `tokdyn fit`: the plain call said "another backend (numpy
    then, numba now)"; it finds the fit done on its own backend (an explicit other one still asks
    for --refit)."""
    path = str(tmp_path / "s.zarr")
    fitted_store(path, fit=False)
    assert main(["fit", path, "--run", "r", "--backend", backend, "--no-progress"]) == 0
    before = tokdyn.fit.read_fit(path, "r")
    capsys.readouterr()
    assert main(["fit", path, "--run", "r", "--no-progress"]) == 0
    after = tokdyn.fit.read_fit(path, "r")
    assert all(np.array_equal(before[k], after[k], equal_nan=before[k].dtype.kind == "f") for k in before)
    assert main(["fit", path, "--run", "r", "--backend", "numba", "--no-progress"]) == 1
    assert "another backend" in capsys.readouterr().err


@pytest.mark.parametrize("state", ["hidden folder among its runs", "stopped before its run"])
def test_a_demo_folder_as_a_demo_or_the_filesystem_leaves_it_is_run_again(tmp_path, started, capsys, state):
    """Reviewed: a `.snapshot` (NFS) or `.ipynb_checkpoints` folder under runs/, which the store
    never lists, or a demo stopped between making its store and its run, was refused."""
    out = tmp_path / "demo"
    if state.startswith("hidden"):
        _demo_store(out / "store.zarr")
        (out / "store.zarr" / "runs" / ".snapshot").mkdir()
    else:
        probe = tokdyn.ProbeSet(None, {"sample_id": np.zeros(4, np.int32), "token_pos": np.arange(1, 5, dtype=np.int32)})
        tokdyn.open_store(out / "store.zarr", probe, mode="w")
    assert _demo(out) == 1
    assert "work started" in cli_error_line(capsys.readouterr().err) and started


def test_the_demo_lock_is_never_seen_half_written(tmp_path, monkeypatch):
    """The lock is linked into place whole: a reader sees no lock or its whole owner record."""
    import threading

    out = tmp_path / "demo"
    out.mkdir()
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            try:
                seen.append((out / demo._LOCK).read_text())
            except FileNotFoundError:
                pass

    t = threading.Thread(target=watch)
    t.start()
    try:
        for _ in range(200):
            with demo._folder_lock(out):
                pass
    finally:
        stop.set()
        t.join()
    assert all(json.loads(text)["pid"] == os.getpid() for text in seen)  # never empty, never partial
    assert sorted(p.name for p in out.iterdir()) == []  # no lock, no temporary file left
