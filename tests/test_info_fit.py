"""`tokdyn info` says where each run's fit stands (``run.fit.summary()``): none, complete,
stale, stopped, being fitted, a refit beside it, damaged; and the command it names goes on from
there (it is run here and must do what the line says)."""

from __future__ import annotations

import dataclasses
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
from tokdyn.fit import FitOptions
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


@pytest.mark.parametrize("rows", [0, 1, 4, 5, 6])
def test_an_unfitted_run_with_few_rows_says_what_it_lacks(tmp_path, capsys, rows):
    """Step 0 and rows + 1 more: info names a command only where it fits the run, and the
    command it names fits it."""
    url = tmp_path / "s.zarr"
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(N, dtype=np.int32), "token_pos": np.ones(N, np.int32)})
    w = tokdyn.open_store(url, probe, mode="w").create_run("r", capacity=8, token_chunk=CHUNK).writer()
    for j, step in enumerate([0, 10, 100, 1000, 3000, 10_000, 30_000][: rows + 1]):
        w.append(planted(N)[0][:, j], step=step)
    rc, lines, _ = _info(url, capsys)
    said = {0: "the run has 0 rows at a positive axis value (the rows a fit takes); a fit needs 5 at least: record more",
            1: "the run has 1 row at a positive axis value (the rows a fit takes); a fit needs 5 at least: record more",
            4: "the run has 4 rows at a positive axis value (the rows a fit takes); a fit needs 5 at least: record more",
            5: "the run has 5 rows at a positive axis value (the rows a fit takes), fewer than a fit takes by default (6): "
               f"`tokdyn fit {url} --run r --min-points 5` fits it",
            6: f"`tokdyn fit {url} --run r` fits it"}  # fmt: skip
    assert rc == 0 and lines == [f"fit   none: {said[rows]}"]
    rc = main(["fit", str(url), "--backend", "numpy", "--scheduler", "sync", "--no-progress"])
    assert (rc == 0) == (rows >= 6)  # a plain fit: refused with fewer rows
    capsys.readouterr()
    if rows == 5:
        assert _run_named(lines[0], capsys) == 0 and _summary(url)["fit"]["complete"]


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
    assert fit_run(tokdyn.open_store(fitted).run("r"), scheduler="sync", progress=False).blocks_fitted == 0
    assert tokdyn.open_store(fitted, mode="r").run("r").fit.meta == meta  # a fit found done: its record as it was


@pytest.mark.parametrize("options, axis_min, flags", [
    ({}, 10, " --axis-min 10"),
    ({"two_step": False, "min_points": 8}, 10, " --axis-min 10 --min-points 8 --no-two-step"),
    ({"vocab_size": 1000}, 1234.5678, " --axis-min 1234.5678 --vocab-size 1000"),  # not 1234.57: another window
    ({}, -0.5, " --axis-min=-0.5"),
])  # fmt: skip
def test_a_stopped_fit_and_the_command_that_resumes_it(tmp_path, monkeypatch, capsys, options, axis_min, flags):
    """The command is whole: the window, to the last digit, and every option the fit was
    started with (a plain `tokdyn fit` of a fit made with --no-two-step is refused: other options)."""
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    real = _interrupt_at(monkeypatch, 3)  # two blocks written, stopped in the third
    with pytest.raises(KeyboardInterrupt):
        fit_run(store.run("r"), options=FitOptions(**options), axis_min=axis_min, backend="numpy", scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    f = _summary(url)["fit"]
    assert (f["complete"], f["blocks_done"], f["blocks"], f["axis_min"]) == (False, 2, 5, axis_min)
    assert f["options"] == dataclasses.asdict(FitOptions(**options))
    rc, lines, _ = _info(url, capsys)
    assert rc == 0 and lines == [f"fit   stopped at 2 of 5 blocks: `tokdyn fit {url} --run r{flags}` resumes it"]
    calls = {"n": 0}
    monkeypatch.setattr(fitjob, "fit_block", lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1])
    assert _run_named(lines[0], capsys) == 0
    assert calls["n"] == 3  # resumed: only the blocks not done
    f = _summary(url)["fit"]
    assert f["complete"] and f["current"] and f["blocks_done"] == 5
    assert f["options"] == dataclasses.asdict(FitOptions(**options))


def test_a_stopped_fit_made_on_fewer_rows_names_the_refit(tmp_path, monkeypatch, capsys):
    """A stopped fit, then a row recorded: resuming it is refused (other rows), so info names
    the refit, which covers every row."""
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    real = _interrupt_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fit_run(store.run("r"), options=FitOptions(two_step=False), backend="numpy", scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    tokdyn.open_store(url).run("r").writer(resume=True).append(planted(N, seed=1)[0][:, -1], step=int(STEPS[-1]) * 2)
    rc, lines, _ = _info(url, capsys)
    assert rc == 0 and lines == [f"fit   stopped at 2 of 5 blocks, made on {len(STEPS)} of the run's {len(STEPS) + 1} committed rows: "
                                 f"`tokdyn fit {url} --run r --no-two-step --refit` starts it over on every row"]  # fmt: skip
    assert _run_named(lines[0], capsys) == 0
    f = _summary(url)["fit"]
    assert f["current"] and f["n_committed"] == len(STEPS) + 1 and f["options"]["two_step"] is False


def test_commands_named_for_a_run_or_store_beginning_with_a_dash_run(tmp_path, monkeypatch, capsys):
    """argparse takes `--run -lr3e-4` and a store `-s.zarr` for options: the commands named
    write `--run=-lr3e-4` and `./-s.zarr`, and they run; a reader's message quotes a name with
    a space."""
    monkeypatch.chdir(tmp_path)
    name = "-lr 3e-4"
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(N, dtype=np.int32), "token_pos": np.ones(N, np.int32)})
    st = tokdyn.open_store("-s.zarr", probe, mode="w")
    w = st.create_run(name, capacity=len(STEPS), token_chunk=CHUNK).writer()
    for j, step in enumerate(STEPS):
        w.append(planted(N)[0][:, j], step=int(step))
    with pytest.raises(tokdyn.StoreError) as exc:  # a reader's message: the command, quoted
        st.run(name).fit.read()
    said = re.search(r"`(tokdyn fit [^`]*)`", str(exc.value)).group(1)
    assert f"--run='{name}'" in said and shlex.split(said)[-1] == f"--run={name}"
    assert main(["info", "--", "-s.zarr"]) == 0
    line = next(line.strip() for line in capsys.readouterr().out.splitlines() if line.startswith("    fit"))
    assert line == f"fit   none: `tokdyn fit ./-s.zarr --run='{name}'` fits it"
    assert _run_named(line, capsys) == 0
    assert tokdyn.open_store("-s.zarr", mode="r").run(name).fit.complete
    shutil.rmtree(tmp_path / "-s.zarr" / "runs" / name / "fit" / "mu")  # a reader names the refit
    with pytest.raises(tokdyn.StoreError) as exc:
        tokdyn.open_store("-s.zarr", mode="r").run(name).fit.read()
    said = str(exc.value)
    assert f"`tokdyn fit ./-s.zarr --run='{name}' --refit`" in said, said
    assert _run_named(said, capsys) == 0 and tokdyn.open_store("-s.zarr", mode="r").run(name).fit.read()["mu"].shape == (N,)


def test_a_repair_beside_a_stopped_refit_is_said_as_the_fit_being_fitted(fitted, monkeypatch, capsys):
    """A --repair makes the fit unfinished while it holds the lock: the fit is the one being
    fitted, and the stopped refit beside it is said as stopped (not as being written)."""
    _interrupt_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fit_run(tokdyn.open_store(fitted).run("r"), axis_min=10, refit=True, backend="numpy", scheduler="sync", progress=False)
    monkeypatch.undo()
    run = tokdyn.open_store(fitted).run("r")
    g = run._group["fit"]
    g.update_attributes({"tokdyn_fit": {**g.attrs["tokdyn_fit"], "complete": False}})  # as todo(verify=True) leaves it
    g["done"][1] = 0
    lock = run.fit._lock()
    lock.claim()
    try:
        rc, lines, _ = _info(fitted, capsys)
    finally:
        lock.release()
    assert rc == 0 and lines[0].startswith("fit   being fitted by process ") and lines[0].endswith(": 4 of 5 blocks done")
    assert lines[1].startswith("refit stopped at 2 of 5 blocks, beside the fit above")
    # a refit writing beside a complete fit (whose record is damaged, so an ERROR line): it is the one being written
    g.update_attributes({"tokdyn_fit": {**g.attrs["tokdyn_fit"], "complete": True, "block_tokens": "many"}})
    lock.claim()
    try:
        rc, lines, _ = _info(fitted, capsys)
    finally:
        lock.release()
    assert rc == 1 and lines[0].startswith("fit   ERROR: ") and lines[1].startswith("refit being written by process "), lines


def test_a_stopped_fit_with_options_no_flag_sets_names_them(tmp_path, monkeypatch, capsys):
    """A fit started in Python with an option the command line does not set: info names it (no
    `tokdyn fit` resumes that fit), and `tokdyn fit` itself names the options that differ."""
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    real = _interrupt_at(monkeypatch, 3)
    options = FitOptions(max_iter=50, two_step=False)
    with pytest.raises(KeyboardInterrupt):
        fit_run(store.run("r"), options=options, backend="numpy", scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    rc, lines, _ = _info(url, capsys)
    call = "fit_run(run, options=FitOptions(max_iter=50, two_step=False))"
    assert rc == 0 and lines == [f"fit   stopped at 2 of 5 blocks: made with options set in Python (max_iter): {call} "
                                 f"resumes it; `tokdyn fit {url} --run r --no-two-step --refit` starts it over"]  # fmt: skip
    assert main(["fit", str(url), "--run", "r", "--scheduler", "sync", "--no-progress", "--no-two-step"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other options (max_iter 50 then, 100 now);" in err, err
    namespace = {"run": store.run("r"), "FitOptions": FitOptions,
                 "fit_run": lambda *a, **k: fit_run(*a, **k, backend="numpy", scheduler="sync", progress=False)}
    assert eval(call, namespace).blocks_fitted == 3  # the call named resumes it
    assert _run_named(lines[0], capsys) == 0  # the named refit, with the command line's options
    f = _summary(url)["fit"]
    assert f["complete"] and f["options"] == dataclasses.asdict(FitOptions(two_step=False))


@pytest.mark.parametrize("change, said", [
    (lambda m: m["options"].update(future_option=1), "other options (future_option 1 then, none now); pass the options"),
    (lambda m: m["options"].update(min_points="8\n"), "other options (min_points '8\\n' then, 6 now); pass the options"),
    (lambda m: m["fields"].pop("mu"), "other result fields (another tokdyn version's); pass refit=True (--refit)"),
])  # fmt: skip
def test_a_fit_on_other_inputs_is_refused_naming_what_differs(tmp_path, monkeypatch, capsys, change, said):
    """A stopped fit whose record differs from this fit's inputs (a fit made by other code) is
    refused in one line naming the difference (docs/fitting.md: "the error names what differs")."""
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    _interrupt_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        fit_run(store.run("r"), backend="numpy", scheduler="sync", progress=False)
    monkeypatch.undo()
    path = url / "runs" / "r" / "fit" / "zarr.json"
    meta = json.loads(path.read_text())
    change(meta["attributes"]["tokdyn_fit"])
    path.write_text(json.dumps(meta))
    assert main(["fit", str(url), "--run", "r", "--backend", "numpy", "--scheduler", "sync", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"run 'r' already has a fit made with {said}" in err, err


@settings(max_examples=80, deadline=None)
@given(two_step=st.booleans(), min_points=st.integers(5, 10**6), vocab=st.none() | st.integers(2, 10**6),
       probe_vocab=st.none() | st.integers(2, 10**6), max_iter=st.none() | st.integers(1, 1000))
def test_fit_flags_give_back_the_options(two_step, min_points, vocab, probe_vocab, max_iter):
    """fit_flags is the inverse of the command line: its flags, parsed by `tokdyn fit`'s own
    parser and completed as fit_run completes them (the probe's vocabulary), give the options
    back; an option no flag sets is returned, never dropped."""
    from tokdyn.cli import build_parser
    from tokdyn.cli.fit import _options, fit_flags

    given_ = dict(two_step=two_step, min_points=min_points, vocab_size=vocab)
    if max_iter is not None:
        given_["max_iter"] = max_iter
    made = FitOptions(**given_)
    if made.vocab_size is None and probe_vocab:
        made = dataclasses.replace(made, vocab_size=probe_vocab)  # what fit_run stores
    flags, python, missing = fit_flags(dataclasses.asdict(made), probe_vocab)
    assert missing == []
    assert fitstore.FLAG_DEFAULTS == {k: v for k, v in dataclasses.asdict(FitOptions()).items() if k in fitstore.FLAG_DEFAULTS}
    args = build_parser().parse_args(["fit", "s.zarr", *shlex.split(flags)])
    got = _options(args)
    if got.vocab_size is None and probe_vocab:
        got = dataclasses.replace(got, vocab_size=probe_vocab)
    got = dataclasses.replace(got, **python)
    assert got == made
    assert set(python) == ({"max_iter"} if max_iter not in (None, FitOptions().max_iter) else set())


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


@pytest.mark.parametrize("options, flags", [({}, ""), ({"two_step": False}, " --no-two-step")])
def test_a_stale_fit_names_the_refit_that_fits_the_new_rows(tmp_path, capsys, options, flags):
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    fit_run(store.run("r"), options=FitOptions(**options), backend="numpy", scheduler="sync", progress=False)
    tokdyn.open_store(url).run("r").writer(resume=True).append(planted(N, seed=1)[0][:, -1], step=int(STEPS[-1]) * 2)
    f = _summary(url)["fit"]
    assert f["complete"] and not f["current"] and f["n_committed"] == len(STEPS)
    rc, lines, _ = _info(url, capsys)
    assert rc == 0 and lines[0].startswith(f"fit   complete but stale, made on {len(STEPS)} committed rows: ")
    assert f"`tokdyn fit {url} --run r{flags} --refit` fits the rows since (" in lines[0]  # with the fit's own options
    assert _run_named(lines[0], capsys) == 0
    f = _summary(url)["fit"]
    assert f["current"] and f["n_committed"] == len(STEPS) + 1 and f["options"]["two_step"] == (not flags)


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


@pytest.mark.parametrize("damage", ["record", "record gone", "block_tokens", "done of a stopped fit"])
def test_a_damaged_fit_is_one_line_exit_1_and_the_command_it_names_mends_it(fitted, capsys, monkeypatch, damage):
    fit = fitted / "runs" / "r" / "fit"
    if damage == "record":
        (fit / "zarr.json").write_text("{not json")
    elif damage == "record gone":  # readers take the run as not fitted: info says it is damaged
        (fit / "zarr.json").unlink()
    elif damage == "block_tokens":
        meta = json.loads((fit / "zarr.json").read_text())
        meta["attributes"]["tokdyn_fit"]["block_tokens"] = "many"
        (fit / "zarr.json").write_text(json.dumps(meta))
    else:  # a stopped fit's done flags: which blocks to resume is unknown
        _interrupt_at(monkeypatch, 3)
        with pytest.raises(KeyboardInterrupt):
            fit_run(tokdyn.open_store(fitted).run("r"), refit=True, backend="numpy", scheduler="sync", progress=False)
        monkeypatch.undo()
        fit = fitted / "runs" / "r" / "fit_next"
        for chunk in (fit / "done").rglob("c/*"):
            if chunk.is_file():
                chunk.write_bytes(b"\x00garbage")
    both = _summary(fitted)
    assert any(isinstance(g, dict) and "error" in g for g in (both["fit"], both["refit"]))
    rc, lines, err = _info(fitted, capsys)
    assert rc == 1 and any(line.startswith(("fit   ERROR: ", "refit ERROR: ")) for line in lines), lines
    assert err.count("\n") == 1 and err.startswith("tokdyn info: error: the fit of 1 run(s) cannot be read: r")
    assert main(["info", str(fitted), "--json"]) == 1  # the same exit code as the lines
    capsys.readouterr()
    assert _run_named(next(line for line in lines if "ERROR" in line), capsys) == 0  # the command it names
    got = _summary(fitted)
    assert got["fit"]["complete"] and got["fit"]["current"] and got["refit"] is None
    assert read_fit(tokdyn.open_store(fitted, mode="r"), "r")["mu"].shape == (N,)  # readers read it


@pytest.mark.parametrize("gone", ["mu", "crc"])
def test_a_fit_array_gone_is_read_as_needing_the_refit_it_names(tmp_path, capsys, gone):
    """A complete fit whose field (or checksums) folder is gone: a reader named `--repair`,
    which refuses a missing array ("refit it"); it names the refit, with the fit's window and
    options, and that refit mends it."""
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    fit_run(store.run("r"), options=FitOptions(two_step=False, min_points=8), axis_min=10, backend="numpy", scheduler="sync",
            progress=False)  # fmt: skip
    shutil.rmtree(url / "runs" / "r" / "fit" / gone)
    with pytest.raises(tokdyn.StoreError) as exc:
        read_fit(tokdyn.open_store(url, mode="r"), "r")
    said = str(exc.value)
    assert f"fit/{gone} cannot be read" in said and f"`tokdyn fit {url} --run r --axis-min 10 --min-points 8 --no-two-step --refit`" in said, said
    assert _run_named(said, capsys) == 0
    f = _summary(url)["fit"]
    assert f["complete"] and f["axis_min"] == 10 and f["options"]["two_step"] is False and f["options"]["min_points"] == 8
    assert read_fit(tokdyn.open_store(url, mode="r"), "r")["mu"].shape == (N,)


@pytest.mark.parametrize("damage", ["block_tokens", "record"])
def test_the_command_that_mends_a_damaged_fit_keeps_its_window_and_options(tmp_path, capsys, damage):
    """Where the damaged record still gives the fit's window and options, the refit info names
    takes them (it dropped them, and the refit fitted another window with other options)."""
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    fit_run(store.run("r"), options=FitOptions(two_step=False, min_points=8), axis_min=10, backend="numpy", scheduler="sync",
            progress=False)  # fmt: skip
    path = url / "runs" / "r" / "fit" / "zarr.json"
    if damage == "record":  # nothing of it can be read: the plain refit, named by the store's error
        path.write_text("{not json")
        flags = ""
    else:
        meta = json.loads(path.read_text())
        meta["attributes"]["tokdyn_fit"]["block_tokens"] = "many"
        path.write_text(json.dumps(meta))
        flags = " --axis-min 10 --min-points 8 --no-two-step"
    rc, lines, _ = _info(url, capsys)
    assert rc == 1 and lines[0].startswith("fit   ERROR: ") and f"`tokdyn fit {url} --run r{flags} --refit`" in lines[0], lines
    assert _run_named(lines[0], capsys) == 0
    f = _summary(url)["fit"]
    assert f["complete"] and f["current"]
    assert (f["axis_min"], f["options"]["two_step"], f["options"]["min_points"]) == ((10, False, 8) if flags else (None, True, 6))


@pytest.mark.parametrize("record", ["earlier", "options damaged", "no fit_id"])
def test_a_stopped_fit_of_an_earlier_tokdyn_or_a_damaged_record_names_what_fits_it(tmp_path, monkeypatch, capsys, record):
    """A stopped fit whose record lacks an option this tokdyn records (an earlier one's), or
    its fit id, is redone whole by a plain fit; one whose options are not a mapping needs
    --refit. Neither is said as options set in Python."""
    url = tmp_path / "s.zarr"
    store = make_store(url, planted(N)[0], token_chunk=CHUNK)
    _interrupt_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fit_run(store.run("r"), axis_min=10, backend="numpy", scheduler="sync", progress=False)
    monkeypatch.undo()
    path = url / "runs" / "r" / "fit" / "zarr.json"
    meta = json.loads(path.read_text())
    m = meta["attributes"]["tokdyn_fit"]
    if record == "earlier":
        del m["options"]["min_points_two"]
        said, go = "made by an earlier tokdyn (its record has no min_points_two): ", "fits it again whole"
    elif record == "no fit_id":
        del m["fit_id"]
        said, go = "made by an earlier tokdyn: ", "fits it again whole"
    else:
        m["options"] = [1]
        said, go = "its record's options are damaged: ", "starts it over"
    path.write_text(json.dumps(meta))
    rc, lines, _ = _info(url, capsys)
    refit = " --refit" if go == "starts it over" else ""
    assert rc == 0 and lines == [f"fit   stopped at 2 of 5 blocks: {said}`tokdyn fit {url} --run r --axis-min 10{refit}` {go}"], lines
    calls = {"n": 0}
    real = fitjob.fit_block
    monkeypatch.setattr(fitjob, "fit_block", lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1])
    assert _run_named(lines[0], capsys) == 0
    assert calls["n"] == 5  # whole
    f = _summary(url)["fit"]
    assert f["complete"] and f["current"] and f["axis_min"] == 10


def test_a_complete_fit_whose_done_flags_are_damaged_reads_and_is_complete(fitted, capsys):
    """No reader of a complete fit reads its done flags: info does not call it damaged."""
    for chunk in (fitted / "runs" / "r" / "fit" / "done").rglob("c/*"):
        if chunk.is_file():
            chunk.write_bytes(b"\x00garbage")
    f = _summary(fitted)["fit"]
    assert f["complete"] and f["blocks_done"] is None
    rc, lines, _ = _info(fitted, capsys)
    assert rc == 0 and lines[0].startswith("fit   complete: ")
    read_fit(tokdyn.open_store(fitted, mode="r"), "r")


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.just(10**400) | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(max_size=30), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=6)  # fmt: skip
_KEYS = ["complete", "n_committed", "rows", "axis_min", "options", "backend", "device", "seconds", "created", "finished",
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
        try:  # a reader: the fit, or one error line
            read_fit(tokdyn.open_store(one_fit, mode="r"), "r", fields=["mu"])
        except (tokdyn.StoreError, tokdyn.InputError) as exc:
            assert "\n" not in str(exc)
    finally:
        if staged:
            shutil.rmtree(path)
        else:
            (path / "zarr.json").write_text(text)


def test_a_fit_of_one_block_is_one_block(tmp_path, capsys):
    url = tmp_path / "s.zarr"
    make_store(url, planted(40)[0])  # one chunk of tokens: one fit block
    assert main(["fit", str(url), "--backend", "numpy", "--scheduler", "sync", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert ", 1 block fitted, 0 already done, " in out and not re.search(r"\b1 tokens\b", out), out
    rc, lines, _ = _info(url, capsys)
    assert rc == 0 and ", 1 block, numpy, " in lines[0]
