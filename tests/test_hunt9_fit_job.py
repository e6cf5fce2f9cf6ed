"""`tokdyn fit` as researchers run it (hunt 9): resuming a fit whose stored blocks were damaged by
hand or by the disk, and fit (and writer) locks whose key names no live process. Each test failed
before its fix (docs/fitting.md, "Fitting a store")."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import tokdyn
from reliability_fixtures import cli_error_line
from test_store_fit import make_store, planted
from tokdyn.cli import main
from tokdyn.fit import FIT_FIELDS
from tokdyn.fit.job import fit_run, read_fit
from tokdyn.store.locks import owner_state

HOST = socket.gethostname()


@functools.lru_cache(maxsize=None)
def _template() -> tuple[str, dict]:
    """A fitted store of 300 tokens in 3 fit blocks (built once) and its fit."""
    folder = tempfile.mkdtemp(prefix="tokdyn-hunt9-")
    url = os.path.join(folder, "t.zarr")
    Y, _, _ = planted(300)
    st = make_store(url, Y, token_chunk=100)
    fit_run(st.run("r"), progress=False)
    return url, read_fit(st, "r")


def _copy(to: Path) -> Path:
    url, _ = _template()
    shutil.copytree(url, to)
    return to


def _chunk_files(store: Path) -> list[tuple[str, int, Path]]:
    """(array, block, file) of every stored chunk of the fit group (its fields, crc, done)."""
    fit = store / "runs" / "r" / "fit"
    out = []
    for f in sorted(fit.glob("*/c/**/*")):
        if f.is_file():
            array = f.relative_to(fit).parts[0]
            out.append((array, int(f.relative_to(fit / array / "c").parts[0]), f))
    return out


def _fields_equal(got: dict, expected: dict) -> None:
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


# -- a resume fits again the blocks marked done whose stored results are damaged -----------------


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=hs.integers(0, 10**6), how=hs.sampled_from(["truncate", "delete", "garbage", "other block"]))
def test_a_resume_fits_again_a_done_block_whose_stored_results_are_damaged(pick, how, capsys):
    """A chunk of a fitted block (any field, its checksums or its done flag) cut short, deleted,
    overwritten or copied from another block: `tokdyn fit` said "0 blocks fitted, 3 already done"
    and exit 0 (or, for a done flag, "refit it": all of it), and every reader then refused the
    fit asking for a refit of all of it. Now `tokdyn fit --repair` (the readers name it) fits
    that block again, says so, and the fit equals the undamaged one."""
    _, expected = _template()
    with tempfile.TemporaryDirectory() as tmp:
        store = _copy(Path(tmp) / "s.zarr")
        files = _chunk_files(store)
        array, block, f = files[pick % len(files)]
        if how == "truncate":
            f.write_bytes(f.read_bytes()[:3])
        elif how == "delete":
            f.unlink()
        elif how == "garbage":
            f.write_bytes(os.urandom(len(f.read_bytes())))
        else:
            others = [g for a, b, g in files if a == array and b != block and g.read_bytes() != f.read_bytes()]
            if not others:  # nothing that differs to copy over it: cut it short instead
                f.write_bytes(f.read_bytes()[:3])
            else:
                shutil.copyfile(others[pick % len(others)], f)
        changed = array != "done" or how != "delete"  # a done flag deleted reads 0: not done, fitted as any other
        capsys.readouterr()
        assert main(["fit", str(store), "--no-progress", "--repair"]) == 0
        out = capsys.readouterr().out
        if changed:
            assert f"fitted again: 1 block marked done whose stored results were damaged (block {block})" in out, out
        assert "1 block fitted, 2 already done" in out, out
        _fields_equal(read_fit(tokdyn.open_store(store), "r"), expected)  # every reader reads it again


def test_the_blocks_fitted_again_are_in_the_summary(tmp_path):
    store = _copy(tmp_path / "s.zarr")
    for b in (0, 2):
        (store / "runs" / "r" / "fit" / "mu" / "c" / str(b)).unlink()
    res = fit_run(tokdyn.open_store(store, mode="r+").run("r"), progress=False, repair=True)
    assert res.blocks_repaired == [0, 2] and res.blocks_fitted == 2 and res.blocks_resumed == 1
    assert res.summary()["blocks_repaired"] == [0, 2]
    _fields_equal(read_fit(tokdyn.open_store(store), "r"), _template()[1])


def test_a_damaged_complete_fit_is_incomplete_until_it_is_fitted_again(tmp_path, monkeypatch):
    """The repair marks the fit incomplete before it fits a damaged block: a repair killed
    meanwhile leaves a fit its readers call incomplete, not a complete one with a block undone."""
    store = _copy(tmp_path / "s.zarr")
    (store / "runs" / "r" / "fit" / "mu" / "c" / "1").write_bytes(b"xyz")
    import tokdyn.fit.job as fitjob

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(fitjob, "_run_tasks", killed)
    with pytest.raises(KeyboardInterrupt):
        fit_run(tokdyn.open_store(store, mode="r+").run("r"), progress=False, repair=True)
    with pytest.raises(tokdyn.errors.StoreError, match="incomplete"):
        read_fit(tokdyn.open_store(store), "r")
    monkeypatch.undo()
    res = fit_run(tokdyn.open_store(store, mode="r+").run("r"), progress=False)  # the flag was cleared: a plain resume
    assert res.blocks_fitted == 1  # the block's done flag was cleared first
    _fields_equal(read_fit(tokdyn.open_store(store), "r"), _template()[1])


def test_a_plain_fit_reads_only_the_done_flags_and_readers_name_repair(tmp_path, monkeypatch, capsys):
    """Without --repair a complete fit is not read again (every field of every block, on each
    no-op `tokdyn fit`: 4x slower at 2M tokens, a download of the whole fit on S3; found by the
    review); a reader that meets the damage names --repair."""
    store = _copy(tmp_path / "s.zarr")
    (store / "runs" / "r" / "fit" / "mu" / "c" / "1").write_bytes(b"xyz")
    from tokdyn.store import fit as store_fit

    real = store_fit.position_crc
    checked = []

    def counted(salt, key, *a, **k):
        checked.append(key)
        return real(salt, key, *a, **k)

    monkeypatch.setattr(store_fit, "position_crc", counted)
    res = fit_run(tokdyn.open_store(store, mode="r+").run("r"), progress=False)
    assert res.blocks_fitted == 0 and res.blocks_repaired == []
    assert "fit/mu" not in checked and "fit/s_se" not in checked  # only the summary's own fields, as a reader
    monkeypatch.undo()
    with pytest.raises(tokdyn.errors.StoreError, match=r"fit/mu.* --repair` \(or all of it: --refit\)"):
        read_fit(tokdyn.open_store(store), "r")
    assert main(["fit", str(store), "--no-progress", "--refit", "--repair"]) == 1
    assert "give one of them" in capsys.readouterr().err


@pytest.mark.parametrize("error", [MemoryError, RuntimeError])
def test_a_read_that_fails_for_another_reason_is_not_damage(tmp_path, monkeypatch, error):
    """--repair took any error of a read (out of memory, a dropped connection) as damage of
    every block, and marked a healthy complete fit incomplete (found by the review). Memory is
    raised; another error must repeat on a block's second read to count."""
    store = _copy(tmp_path / "s.zarr")
    import zarr

    real = zarr.Array.__getitem__
    failed = set()

    def flaky(self, key):
        if self.path.endswith("fit/mu") and (error is MemoryError or id(key) not in failed):
            failed.add(id(key))
            raise error("transient")
        return real(self, key)

    monkeypatch.setattr(zarr.Array, "__getitem__", flaky)
    run = tokdyn.open_store(store, mode="r+").run("r")
    if error is MemoryError:
        with pytest.raises(MemoryError):
            fit_run(run, progress=False, repair=True)
    else:
        res = fit_run(run, progress=False, repair=True)
        assert res.blocks_repaired == [] and res.blocks_fitted == 0
    monkeypatch.undo()
    assert tokdyn.open_store(store).run("r").fit.complete
    _fields_equal(read_fit(tokdyn.open_store(store), "r"), _template()[1])


@pytest.mark.parametrize("array", ["mu", "status", "crc", "done"])
def test_a_fit_array_whose_metadata_names_other_chunks_is_refused_at_resume(array, tmp_path, capsys):
    """A field's zarr.json naming other chunks than the fit's blocks: the resume said "already
    done" over a field no reader can decode (and rewriting a block through it would scatter it
    over chunks the others do not use). Now one line asking for --refit, which works."""
    store = _copy(tmp_path / "s.zarr")
    meta = store / "runs" / "r" / "fit" / array / "zarr.json"
    m = json.loads(meta.read_text())
    shape = m["chunk_grid"]["configuration"]["chunk_shape"]
    m["chunk_grid"]["configuration"]["chunk_shape"] = [7] + shape[1:] if array != "crc" else [2, shape[1]]
    meta.write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["fit", str(store), "--no-progress"]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert f"fit/{array} is missing or is not" in line and "--refit" in line, line
    assert main(["fit", str(store), "--no-progress", "--refit"]) == 0
    _fields_equal(read_fit(tokdyn.open_store(store), "r"), _template()[1])


# -- a lock key that names no live process is taken over ----------------------------------------

JSON = hs.recursive(hs.none() | hs.booleans() | hs.integers() | hs.floats(allow_nan=False) | hs.text(max_size=5),
                    lambda inner: hs.lists(inner, max_size=3) | hs.dictionaries(hs.text(max_size=4), inner, max_size=3),
                    max_leaves=6)
NO_PROCESS = hs.fixed_dictionaries({"pid": hs.integers(max_value=0) | hs.booleans() | hs.none() | hs.text(max_size=3)
                                    | hs.floats(allow_nan=False), "host": hs.just(HOST)})  # fmt: skip


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(held=JSON.filter(lambda v: not (isinstance(v, dict) and isinstance(v.get("pid"), int))) | NO_PROCESS)
def test_a_fit_lock_naming_no_live_process_is_taken_over(held):
    """A fit lock key whose content names no process (a JSON list, number, string or null; a pid
    of 0, -1 or true): a list was "internal error ... AttributeError", null "another process keeps
    taking the writer lock" for good, pid 0 and -1 "being written by process -1" (os.kill(-1, 0)
    asks of every process). Now it is taken over as a crashed holder's."""
    with tempfile.TemporaryDirectory() as tmp:
        store = _copy(Path(tmp) / "s.zarr")
        (store / "runs" / "r" / "commits" / "fit.lock").write_text(json.dumps(held))
        res = fit_run(tokdyn.open_store(store, mode="r+").run("r"), progress=False)
        assert res.blocks_resumed == 3
        assert not (store / "runs" / "r" / "commits" / "fit.lock").exists()  # released


@pytest.mark.parametrize("held", [[1], "x", None, 5, {"pid": -1, "host": HOST}, {"pid": 0, "host": HOST}])
def test_a_writer_lock_naming_no_live_process_is_taken_over(held, tmp_path):
    """The same for a recorder's writer lock of a token range (the same lock class)."""
    store = _copy(tmp_path / "s.zarr")
    (store / "runs" / "r" / "commits" / "w0" / "writer.lock").write_text(json.dumps(held))
    with tokdyn.open_store(store, mode="r+").run("r").writer(resume=True):
        pass


def test_a_pid_that_names_no_single_process_is_dead():
    for pid in (0, -1, -os.getpid(), True, False):
        assert owner_state({"pid": pid, "host": HOST}) == "dead", pid
    assert owner_state({"pid": os.getpid(), "host": HOST, "start": None}) in ("self", "alive")


def test_a_complete_fit_made_before_checksums_is_found_done_not_damaged(tmp_path):
    """A fit of a tokdyn that wrote no checksums (no fit_id, no fit/crc) is read by every reader;
    a plain `tokdyn fit` called it damaged ("fit/crc is missing ... refit it"), against
    docs/store.md's "older stores stay readable" (found by the review)."""
    import zarr

    store = _copy(tmp_path / "s.zarr")
    g = zarr.open_group(str(store / "runs" / "r" / "fit"), mode="r+")
    meta = dict(g.attrs["tokdyn_fit"])
    meta.pop("fit_id")
    g.attrs["tokdyn_fit"] = meta
    shutil.rmtree(store / "runs" / "r" / "fit" / "crc")
    res = fit_run(tokdyn.open_store(store, mode="r+").run("r"), progress=False)
    assert res.blocks_fitted == 0 and res.blocks_resumed == 3
    res = fit_run(tokdyn.open_store(store, mode="r+").run("r"), progress=False, repair=True)  # nothing to check it by
    assert res.blocks_fitted == 0 and res.blocks_repaired == []
    _fields_equal(read_fit(tokdyn.open_store(store), "r"), _template()[1])


def test_the_command_a_reader_names_repairs_a_fit_made_with_other_options(tmp_path, capsys):
    """The reader's hint was not shell-quoted (a store path with a space split into two
    arguments) and a bare --repair compared its default options with a fit made with
    --axis-min and --no-two-step ("a fit made with other options ... --refit"): the hint is
    quoted, and --repair takes the stored fit's options and window (found by the review)."""
    import shlex

    Y, _, _ = planted(300)
    url = str(tmp_path / "my store.zarr")
    st = make_store(url, Y, token_chunk=100)
    assert main(["fit", url, "--axis-min", "100", "--no-two-step", "--no-progress"]) == 0
    expected = read_fit(tokdyn.open_store(url), "r")
    (Path(url) / "runs" / "r" / "fit" / "mu" / "c" / "1").write_bytes(b"xyz")
    with pytest.raises(tokdyn.errors.StoreError) as ex:
        read_fit(tokdyn.open_store(url), "r")
    command = str(ex.value).split("`")[1]
    argv = shlex.split(command)
    assert argv[:3] == ["tokdyn", "fit", url] and argv[-1] == "--repair"
    capsys.readouterr()
    assert main(argv[1:] + ["--no-progress"]) == 0, capsys.readouterr().err
    assert "fitted again: 1 block marked done whose stored results were damaged (block 1)" in capsys.readouterr().out
    _fields_equal(read_fit(tokdyn.open_store(url), "r"), expected)
    assert st.run("r").fit.meta["axis_min"] == 100 and st.run("r").fit.meta["options"]["two_step"] is False


def test_a_read_out_of_memory_is_not_damage_for_any_reader(tmp_path, monkeypatch):
    # the fit's reader and the run's share one read (Run._read): out of memory is raised as it
    # is, not called "a chunk of it is damaged" with a command that would not mend it
    import zarr

    store = _copy(tmp_path / "s.zarr")

    def oom(self, key):
        raise MemoryError

    monkeypatch.setattr(zarr.Array, "__getitem__", oom)
    run = tokdyn.open_store(store).run("r")
    with pytest.raises(MemoryError):
        run.fit.read(fields=("mu",))
    with pytest.raises(MemoryError):
        run.losses()
    with pytest.raises(MemoryError):  # the probe's reader called it a damaged probe group
        tokdyn.open_store(store).probe


def test_a_refit_that_cannot_read_the_losses_keeps_the_finished_fit(tmp_path, capsys):
    """`tokdyn fit --refit` on a run with a damaged loss chunk discarded the finished fit first,
    then failed with the damage alone: the fit was gone without a word (every later reader: "the
    fit is incomplete (interrupted?)"). The refit is now written beside the finished fit, which
    is kept, read as before, and said to be kept."""
    _, expected = _template()
    store = _copy(tmp_path / "s.zarr")
    chunk = store / "runs" / "r" / "loss" / "c" / "5" / "1"  # row 5 (fitted: not step 0), token block 1
    blob = bytearray(chunk.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # its checksum no longer holds
    chunk.write_bytes(bytes(blob))
    capsys.readouterr()
    for command in (["--refit"], []):  # the refit, then `tokdyn fit`, which resumes it: the same failure
        assert main(["fit", str(store), "--run", "r", *command, "--no-progress"]) == 1
        line = cli_error_line(capsys.readouterr().err)
        # the chunk itself is named (the message named the slice read: all rows of token block 1)
        assert "its chunk of row 5, token chunk 1 is damaged" in line, line
        assert line.endswith("(the fit stored before is kept)"), line
        assert tokdyn.open_store(store).run("r").fit.complete
        _fields_equal(read_fit(tokdyn.open_store(store), "r"), expected)
    assert (store / "runs" / "r" / "fit_next").is_dir()  # the refit, kept to be resumed
    # every reader names it: a run's whole losses, and chosen rows and tokens across it
    run = tokdyn.open_store(store).run("r")
    for read in (run.losses, lambda: run.losses_at([0, 5, 6], [0, 150, 299])):
        with pytest.raises(tokdyn.errors.StoreError, match="its chunk of row 5, token chunk 1 is damaged"):
            read()
