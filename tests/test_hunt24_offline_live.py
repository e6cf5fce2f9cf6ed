"""Offline recording of a training that is still running: ``record-offline`` rerun (from cron, by
hand) on a folder that training keeps saving into and rotating. Each test is a class that stopped
the recording, or recorded what it should not:

1. the newest checkpoint *file* still being written (a ``.pt`` whose zip has no central directory
   yet, a ``.safetensors`` shorter than its header promises, an empty file just created; an HF
   folder's ``model.safetensors`` cut short) stopped the recording with "not a readable
   checkpoint" each time it was run, where an HF folder still being written waited for
   ``--resume`` with a warning;
2. a checkpoint deleted after it was listed (``save_total_limit`` rotating old ones away) stopped
   the recording at it ("checkpoint not found"), leaving the checkpoints after it unrecorded;
3. a checkpoint file saved under a temporary name (``tmp_step_30.pt``, ``step_30.tmp.pt``,
   ``tempfile``'s ``tmpab12cd_3.pt``) was recorded at the step in its name, or refused the folder.

Every recorded row is checked against a manual forward of its checkpoint.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from offline_fixtures import direct_losses, make_hf_model, make_model, make_probe, save_safetensors, save_torch, write_spec
from tokdyn.cli import main
from tokdyn.errors import InputError, RunBusyError
from tokdyn.record.offline import discover_checkpoints, record_offline
from tokdyn.record.offline import recording as offline_recording
from tokdyn.record.offline.discovery import drop_unfinished
from tokdyn.store import open_store

PROBE = make_probe(n_sequences=4)
SAVERS = {"pt": save_torch, "safetensors": save_safetensors}


def _folder(root: Path, steps, ext: str = "pt") -> Path:
    d = root / "ck"
    d.mkdir(parents=True, exist_ok=True)
    write_spec(d)
    for s in steps:
        SAVERS[ext](make_model(s), d / f"step_{s}.{ext}")
    return d


def _record(folder, store: Path, **kw) -> dict:
    if not store.exists():
        open_store(store, PROBE, mode="a")
    return record_offline(folder, store, "r", progress=False, workers=2, **kw)


def _check_rows(store: Path, steps) -> None:
    """The run holds exactly ``steps``, each row the manual forward of its checkpoint's model."""
    run = open_store(store).run("r")
    assert run.steps.tolist() == list(steps)
    losses = run.losses()  # [rows, tokens]
    for j, s in enumerate(steps):
        np.testing.assert_allclose(losses[j], direct_losses(make_model(s), PROBE), atol=1e-5)


def _cut(p: Path, keep: int) -> bytes:
    """Cut ``p`` to its first ``keep`` bytes (a save caught half-way); returns the whole file."""
    whole = p.read_bytes()
    p.write_bytes(whole[:keep])
    return whole


# == 1. the newest file still being written ==========================================================

CUTS = {"empty": lambda n: 0, "header only": lambda n: 40, "half": lambda n: n // 2, "all but one byte": lambda n: n - 1}


@pytest.mark.parametrize("ext", ["pt", "safetensors"])
@pytest.mark.parametrize("cut", list(CUTS))
def test_the_newest_file_being_written_waits_for_resume(tmp_path, ext, cut):
    d = _folder(tmp_path, (10, 20, 30), ext)
    newest = d / f"step_30.{ext}"
    whole = _cut(newest, CUTS[cut](newest.stat().st_size))
    store = tmp_path / "s.zarr"
    with pytest.warns(UserWarning, match=rf"step_30\.{ext} \(step 30\), the newest checkpoint, is cut short .*still being written"):
        assert _record(d, store, resume=True)["recorded"] == [10, 20]
    _check_rows(store, [10, 20])
    newest.write_bytes(whole)  # the save completes: the next run records it, quietly
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _record(d, store, resume=True)["recorded"] == [30]
    _check_rows(store, [10, 20, 30])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ext=hs.sampled_from(["pt", "safetensors"]), frac=hs.floats(0, 1, exclude_max=True))
def test_any_cut_of_the_newest_file_is_seen_as_a_save_in_progress(tmp_path_factory, ext, frac):
    """Wherever a save is caught (every byte count short of the whole file), the newest file is
    taken for one still being written: never recorded, never an error."""
    root = tmp_path_factory.mktemp("cut")
    d = _folder(root, (10,), ext)
    SAVERS[ext](make_model(20), d / f"step_20.{ext}")
    newest = d / f"step_20.{ext}"
    _cut(newest, int(frac * newest.stat().st_size))
    with pytest.warns(UserWarning, match=r"the newest checkpoint, is cut short"):
        refs = drop_unfinished(discover_checkpoints(d), str(d))
    assert [r.step for r in refs] == [10]


def test_a_cut_file_before_the_newest_is_still_an_error(tmp_path):
    """Only the newest file can be a save in progress: one before it is a damaged run, said as one."""
    d = _folder(tmp_path, (10, 20, 30))
    _cut(d / "step_20.pt", 100)
    with pytest.raises(InputError, match=r"step_20\.pt is not a readable torch checkpoint"):
        _record(d, tmp_path / "s.zarr")
    _check_rows(tmp_path / "s.zarr", [10])


def test_an_hf_folder_whose_weights_are_cut_short_waits_for_resume(tmp_path):
    """A folder saved by save_pretrained (no trainer_state.json, so only its weights tell) whose
    model.safetensors is still being written."""
    pytest.importorskip("transformers")
    d = tmp_path / "out"
    for s in (2, 4):
        make_hf_model(s).save_pretrained(d / f"step-{s}")
    weights = d / "step-4" / "model.safetensors"
    whole = _cut(weights, weights.stat().st_size // 3)
    store = tmp_path / "s.zarr"
    with pytest.warns(UserWarning, match=r"step-4 \(step 4\), the newest checkpoint, is cut short \(model\.safetensors"):
        assert _record(d, store)["recorded"] == [2]
    weights.write_bytes(whole)
    assert _record(d, store, resume=True)["recorded"] == [4]


def test_the_command_says_it_in_one_line_and_exits_0(tmp_path, capsys):
    d = _folder(tmp_path, (10, 20))
    save_torch(make_model(30), d / "step_30.pt")
    whole = _cut(d / "step_30.pt", 1000)
    store = tmp_path / "s.zarr"
    open_store(store, PROBE, mode="a")
    args = ["record-offline", "--checkpoints", str(d), "--out", str(store), "--run", "r", "--no-progress", "--resume"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "recorded 2 checkpoint(s) (steps 10..20)" in out
    (line,) = err.splitlines()
    assert line.startswith("tokdyn record-offline: warning: ") and "step_30.pt (step 30), the newest checkpoint, is cut short" in line
    (d / "step_30.pt").write_bytes(whole)
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "recorded 1 checkpoint(s) (steps 30..30, 2 already committed)" in out and not err
    _check_rows(store, [10, 20, 30])


# == 2. a checkpoint deleted after it was listed =====================================================


def _delete_after_listing(monkeypatch, victim: Path) -> None:
    """Rotate ``victim`` away (as save_total_limit does) between listing the folder and reading it."""
    listed = offline_recording.discover_checkpoints

    def discover_then_rotate(*args, **kw):
        refs = listed(*args, **kw)
        shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
        return refs

    monkeypatch.setattr(offline_recording, "discover_checkpoints", discover_then_rotate)


@pytest.mark.parametrize("gone", [10, 20, 40])
def test_a_checkpoint_rotated_away_after_listing_is_skipped_with_a_warning(tmp_path, monkeypatch, gone):
    d = _folder(tmp_path, (10, 20, 30, 40))
    _delete_after_listing(monkeypatch, d / f"step_{gone}.pt")
    store = tmp_path / "s.zarr"
    with pytest.warns(UserWarning, match=rf"step_{gone}\.pt \(step {gone}\) was deleted after it was listed"):
        summary = _record(d, store)
    kept = [s for s in (10, 20, 30, 40) if s != gone]
    assert summary["recorded"] == kept
    _check_rows(store, kept)


def test_an_hf_folder_rotated_away_after_listing_is_skipped(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    d = tmp_path / "out"
    for s in (2, 4, 6):
        make_hf_model(s).save_pretrained(d / f"checkpoint-{s}")
    _delete_after_listing(monkeypatch, d / "checkpoint-2")
    with pytest.warns(UserWarning, match=r"checkpoint-2 \(step 2\) was deleted after it was listed"):
        assert _record(d, tmp_path / "s.zarr")["recorded"] == [4, 6]


def test_a_listed_checkpoint_that_is_gone_from_a_list_of_refs_too(tmp_path):
    d = _folder(tmp_path, (10, 20, 30))
    refs = discover_checkpoints(d)
    (d / "step_20.pt").unlink()
    with pytest.warns(UserWarning, match="was deleted after it was listed"):
        assert _record(refs, tmp_path / "s.zarr")["recorded"] == [10, 30]


# == 3. files saved under a temporary name ===========================================================


@pytest.mark.parametrize("name", ["tmp_step_30.pt", "tmp-step_30.pt", "step_30.tmp.pt", "step_30.partial.safetensors",
                                  "tmpab12cd_3.pt", "tmp4k2j9xq0.safetensors"])  # fmt: skip
def test_a_file_under_a_temporary_name_is_not_recorded(tmp_path, name):
    d = _folder(tmp_path, (10, 20))
    SAVERS["safetensors" if name.endswith(".safetensors") else "pt"](make_model(30), d / name)
    with pytest.warns(UserWarning, match=rf"\['{name}'\] are named as saves still being written"):
        refs = discover_checkpoints(d)
    assert [r.step for r in refs] == [10, 20]


def test_names_that_merely_start_with_tmp_letters_are_still_checkpoints(tmp_path):
    """``tmp`` glued to a word is not tempfile's name: ``tmpl_step_5.pt`` is a checkpoint of step 5."""
    d = _folder(tmp_path, ())
    save_torch(make_model(5), d / "tmpl_step_5.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.step for r in discover_checkpoints(d)] == [5]


@pytest.mark.parametrize("ext", ["pt", "safetensors"])
def test_the_only_checkpoint_cut_short_is_one_error_line_naming_it(tmp_path, ext, capsys):
    """Nothing else to record: one line naming the file and what it lacks, not a warning naming it
    followed by "no checkpoints to record"."""
    d = _folder(tmp_path, (10,), ext)
    _cut(d / f"step_10.{ext}", 300)
    store = tmp_path / "s.zarr"
    open_store(store, PROBE, mode="a")
    assert main(["record-offline", "--checkpoints", str(d), "--out", str(store), "--run", "r", "--no-progress", "--resume"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tokdyn record-offline: error: ") and f"step_10.{ext} (step 10), the only checkpoint, is cut short" in line


# == 4. two recordings of one run at once ============================================================


@pytest.mark.parametrize("resume", [True, False])
def test_a_run_created_by_another_recording_meanwhile_is_said_as_such(tmp_path, monkeypatch, resume):
    """Two cron runs overlapping on a new run: both find no run, both evaluate their first
    checkpoints, the first creates it. The second said "already exists ...; resume it", to a
    command given --resume. Now it says another process made it meanwhile, and writes nothing."""
    d = _folder(tmp_path, (10, 20))
    store = tmp_path / "s.zarr"
    open_store(store, PROBE, mode="a")
    listed = offline_recording.discover_checkpoints

    def discover_then_the_other_creates_it(*args, **kw):
        refs = listed(*args, **kw)
        other = open_store(store, mode="r+").create_run("r")
        writer = other.writer()
        writer.append(direct_losses(make_model(10), PROBE), step=10)
        writer.release()
        return refs

    monkeypatch.setattr(offline_recording, "discover_checkpoints", discover_then_the_other_creates_it)
    with pytest.raises(RunBusyError, match=r"run 'r' of .* was created by another process while this one evaluated"):
        _record(d, store, resume=resume)
    assert open_store(store).run("r").steps.tolist() == [10]  # the other's rows, untouched


# == 5. a checkpoint rewritten by a training restarted from an earlier one ===========================


def _resave(path: Path, seed: int, ext: str = "pt") -> None:
    SAVERS[ext](make_model(seed), path)
    st = path.stat()
    os.utime(path, (st.st_atime + 100, st.st_mtime + 100))  # saved later, whatever the clock's resolution


@pytest.mark.parametrize("ext", ["pt", "safetensors"])
def test_a_restart_that_rewrote_the_last_recorded_checkpoint_is_said(tmp_path, ext):
    """A training restarted from step 10 (after a divergence, with a fix) saves step_20 and step_30
    again, then step_40: --resume skipped 20 and 30 (committed) and appended 40 after the first
    training's rows without a word. Now the checkpoint at the run's last committed step, saved
    again with other weights, is warned about (its fingerprint against the row's)."""
    d = _folder(tmp_path, (10, 20, 30), ext)
    store = tmp_path / "s.zarr"
    _record(d, store)
    for s in (20, 30):
        _resave(d / f"step_{s}.{ext}", 100 + s, ext)
    SAVERS[ext](make_model(40), d / f"step_40.{ext}")
    with pytest.warns(UserWarning, match=rf"run 'r': step_30\.{ext}, the checkpoint at its last committed step 30, now holds "
                                         r"other weights than its row"):
        assert _record(d, store, resume=True)["recorded"] == [40]


def test_the_same_checkpoints_saved_again_or_copied_say_nothing(tmp_path):
    """The invariance: a checkpoint whose time changed but whose weights did not (the folder copied,
    the file touched, saved again from the same weights) is no restart."""
    d = _folder(tmp_path, (10, 20, 30))
    store = tmp_path / "s.zarr"
    _record(d, store)
    _resave(d / "step_30.pt", 30)  # the same weights, saved again later
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)  # every time new
    SAVERS["pt"](make_model(40), copy / "step_40.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _record(d, store, resume=True)["recorded"] == []
        assert _record(copy, store, resume=True)["recorded"] == [40]
    _check_rows(store, [10, 20, 30, 40])


def test_a_failed_recording_never_removes_a_store_another_records_into(tmp_path, monkeypatch):
    """Two first cron runs with --probe: the one that made the store fails (the other made the run
    meanwhile) and removed the new store, the other's run and its held writer with it: the other
    then failed on its lost lock, its evaluated rows gone. Now a store holding a run this call did
    not make is left in place."""
    d = _folder(tmp_path, (10, 20))
    store = tmp_path / "s.zarr"
    listed = offline_recording.discover_checkpoints
    held = {}

    def discover_then_the_other_creates_it(*args, **kw):
        refs = listed(*args, **kw)
        held["writer"] = open_store(store, mode="r+").create_run("r").writer()  # the other holds it, nothing committed yet
        return refs

    monkeypatch.setattr(offline_recording, "discover_checkpoints", discover_then_the_other_creates_it)
    with pytest.raises(RunBusyError, match="was created by another process"):
        record_offline(d, store, "r", probe=PROBE, resume=True, progress=False, workers=1)
    held["writer"].append(direct_losses(make_model(10), PROBE), step=10)  # the other goes on
    held["writer"].release()
    _check_rows(store, [10])


def test_a_checkpoint_deleted_while_its_probe_is_evaluated_keeps_its_row(tmp_path):
    """Its weights were read: the row is the checkpoint's, stored with the time it was saved (the
    time was read after the forwards, from a file then gone: the row was lost)."""
    d = _folder(tmp_path, (20,))
    saved = (d / "step_20.pt").stat().st_mtime

    def forward_then_rotate(model, ids):
        (d / "step_20.pt").unlink(missing_ok=True)
        return model(ids)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _record(d, tmp_path / "s.zarr", forward=forward_then_rotate)["recorded"] == [20]
    assert open_store(tmp_path / "s.zarr").run("r").coord("wall_time").tolist() == [saved]
    _check_rows(tmp_path / "s.zarr", [20])
