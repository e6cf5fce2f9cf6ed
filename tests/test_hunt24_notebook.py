"""Hunt 24: tokdyn in a long-lived process (a notebook, a training script that also analyses).

Objects held across cells while another process (or another handle) deletes a run, makes it
again, or replaces the store: every read through the held object either gives what a fresh
process reads or says in one line what happened, never another run's rows under the held view's
shape, and never "damaged" for a store that is whole."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import zarr

import tokdyn
from tokdyn.errors import StoreError

N_SEQ, C = 4, 16  # 64 tokens
TC = 16


def _probe(fill: int = 0) -> tokdyn.ProbeSet:
    return tokdyn.ProbeSet.from_tokens(np.full((N_SEQ, C + 1), fill), tokenizer={"kind": "byte"})


def _record(store, name: str, rows: np.ndarray, *, token_chunk: int = TC, dtype: str = "float32", legacy: bool = False) -> None:
    """Run ``name`` of ``rows`` (steps 1..K), made again where it exists; ``legacy``: without the
    position checksums (a run an older tokdyn made), made at a second of its own (such a run is
    told from one made again under its name by its creation time, to the second)."""
    if name in store.runs:
        store.delete_run(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with store.create_run(name, dtype=dtype, token_chunk=token_chunk).writer() as w:
            for j, row in enumerate(rows):
                w.append(row, step=j + 1)
    if legacy:
        g = zarr.open_group(f"{store.url}/runs/{name}", mode="r+")
        meta = dict(g.attrs["tokdyn_run"])
        meta.pop("integrity")
        _record.made += 1
        meta["created"] = f"2020-01-01T00:00:{_record.made % 60:02d}+00:00"
        g.update_attributes({"tokdyn_run": meta})


_record.made = 0


def _rows(k: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((k, N_SEQ * C)) + seed).astype(np.float32)


READERS = {
    "losses": lambda run, held: run.losses(),
    "losses_at": lambda run, held: run.losses_at([0, 1], [3, 40]),
    "steps": lambda run, held: run.steps,
    "n_committed": lambda run, held: run.n_committed,
    "info": lambda run, held: run.info(),
    "to_dask": lambda run, held: run.to_dask(),
    "to_xarray": lambda run, held: run.to_xarray(),
    "fit.read": lambda run, held: run.fit.read(["mu"]),
    "dask made before": lambda run, held: held["dask"].compute(),
    "xarray made before": lambda run, held: held["xarray"]["loss"].values,
}


def _hold(url: str, legacy: bool):
    store = tokdyn.open_store(url, _probe(), mode="a")
    _record(store, "r", _rows(5, 0), legacy=legacy)
    run = tokdyn.open_store(url, mode="r").run("r")
    return run, {"dask": run.to_dask(), "xarray": run.to_xarray()}


@pytest.mark.parametrize("legacy", [False, True], ids=["checksummed", "legacy"])
@pytest.mark.parametrize("change", ["deleted", "made again", "made again, 7 rows", "made again, other chunks", "made again, float16"])
def test_a_held_run_whose_run_was_deleted_or_made_again_says_so(tmp_path, legacy, change):
    """A run deleted, or deleted and recorded again under its name, by another handle while a
    notebook holds a view of it (and a dask array, a Dataset made from it): each read says the
    run was deleted (and made again) since the view was opened, and to open it again. Before,
    the view's cached metadata read the new run: 'loss chunk (row 0, token chunk 0) does not hold
    the values committed there; it was moved, swapped, left stale or damaged', 'cannot decode ...
    is damaged', 'commit record of token range 0 is unreadable (GroupNotFoundError ...)' (a
    whole store said damaged), and, for a run without position checksums, the new run's rows
    read under the old view's shape without a word."""
    url = str(tmp_path / "s.zarr")
    run, held = _hold(url, legacy)
    other = tokdyn.open_store(url, mode="r+")
    if change == "deleted":
        other.delete_run("r")
    else:
        k = 7 if "7 rows" in change else 5
        _record(other, "r", _rows(k, 1), legacy=legacy, token_chunk=32 if "chunks" in change else TC,
                dtype="float16" if "float16" in change else "float32")
    for reader, read in READERS.items():
        with pytest.raises(StoreError) as err:
            read(run, held)
        msg = str(err.value)
        assert f"run 'r' in {url} was deleted" in msg and "open it again" in msg and "damaged" not in msg, (reader, msg)
        assert ("made again" in msg) == (change != "deleted"), (reader, msg)
    # and a view opened now reads the run there is
    if change != "deleted":
        fresh = tokdyn.open_store(url, mode="r").run("r")
        assert np.array_equal(fresh.losses(), _rows(fresh.n_committed, 1).astype(fresh.dtype))


def test_a_writer_from_a_view_of_a_run_made_again_is_refused(tmp_path):
    """A writer made from a held view of a run that was since deleted and made again would
    write the old run's checksums (its id) into the new run, whose reads then fail as 'moved,
    swapped, left stale or damaged': it is refused, and the new run keeps its rows."""
    url = str(tmp_path / "s.zarr")
    store = tokdyn.open_store(url, _probe(), mode="a")
    _record(store, "r", _rows(3, 0))
    held = store.run("r")
    _record(tokdyn.open_store(url, mode="r+"), "r", _rows(3, 1))
    with pytest.raises(StoreError, match="was deleted and made again after this view"):
        with held.writer(resume=True) as w:
            w.append(_rows(4, 0)[3], step=4)
    assert np.array_equal(tokdyn.open_store(url, mode="r").run("r").losses(), _rows(3, 1))


def test_a_held_run_reads_rows_another_process_appends(tmp_path):
    """The ordinary case stays as it was: rows another process commits (a resumed writer) are
    read by the held view, as by a fresh process; a dask array made before keeps its rows."""
    url = str(tmp_path / "s.zarr")
    store = tokdyn.open_store(url, _probe(), mode="a")
    full = _rows(8, 3)
    _record(store, "r", full[:5])
    run = tokdyn.open_store(url, mode="r").run("r")
    before = run.to_dask()
    code = (
        "import sys, numpy as np, tokdyn\n"
        f"full = (np.random.default_rng(3).random((8, {N_SEQ * C})) + 3).astype(np.float32)\n"
        f"with tokdyn.open_store({url!r}, mode='r+').run('r').writer(resume=True) as w:\n"
        "    [w.append(full[j], step=j + 1) for j in range(5, 8)]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert run.n_committed == 8 and np.array_equal(run.losses(), full) and np.array_equal(run.steps, np.arange(1, 9))
    assert np.array_equal(before.compute(), full[:5])
    assert "rows=8" in repr(run)


def test_repr_of_a_run_that_is_gone_says_so_without_raising(tmp_path):
    """A notebook shows a held object's repr first: for a run deleted meanwhile it raised
    ('commit record of token range 0 is unreadable'); it names the run and says it is gone."""
    url = str(tmp_path / "s.zarr")
    run, _ = _hold(url, False)
    assert repr(run) == "Run('r', axis=T, rows=5, tokens=64, fit=none)"
    tokdyn.open_store(url, mode="r+").delete_run("r")
    assert repr(run) == "Run('r', axis=T, tokens=64: deleted after this view was opened)"


def test_a_held_store_replaced_by_a_store_of_another_probe_says_so(tmp_path):
    """The store a notebook holds is removed and a store of another probe made at its path (the
    demo run again, a pipeline's 'w'): the held store's probe (cached) is not the runs' probe, so
    a run read through it paired the new run with the old probe's tokens, domains and
    documents, without a word (or, where the probe was not read yet, said 'the probe arrays were
    modified or damaged'), and a run created through the held store (a recorder holding it) was
    recorded with the old probe's tokens into the store of the new one. Now each says in one
    line that the store was replaced."""
    url = str(tmp_path / "s.zarr")
    held = tokdyn.open_store(url, _probe(0), mode="a")
    _record(held, "r", _rows(5, 0))
    first = tokdyn.open_store(url, mode="r")
    assert first.probe.fingerprint == _probe(0).fingerprint  # read and cached, as a notebook would
    lazy = tokdyn.open_store(url, mode="r")  # its probe not read yet
    new = tokdyn.open_store(url, _probe(1), mode="w")
    _record(new, "r", _rows(5, 1))
    for reader in (lambda: first.run("r"), lambda: lazy.probe, lambda: lazy.run("r"), lambda: held.create_run("next"),
                   lambda: first.info()):
        with pytest.raises(StoreError) as err:
            reader()
        msg = str(err.value)
        assert f"{url} was replaced by another store" in msg and "open it again" in msg and "damaged" not in msg, msg
    with pytest.raises(StoreError, match="was replaced by another store"):
        held.delete_run("r")  # the new store's run, which the held handle never held: it used to go
    fresh = tokdyn.open_store(url, mode="r")
    assert fresh.runs == ["r"]
    assert fresh.probe.fingerprint == _probe(1).fingerprint and np.array_equal(fresh.run("r").losses(), _rows(5, 1))


def test_a_held_store_whose_folder_was_deleted_says_so(tmp_path):
    """store.info() of a store deleted meanwhile described the cached probe, no runs and 0
    bytes, as if an empty store were there; run() and info() now say it was deleted."""
    import shutil

    url = str(tmp_path / "s.zarr")
    held = tokdyn.open_store(url, _probe(), mode="a")
    _record(held, "r", _rows(2, 0))
    shutil.rmtree(url)
    for reader in (held.info, lambda: held.run("r")):
        with pytest.raises(StoreError, match=f"{url} was deleted after this object opened it: open it again"):
            reader()


def _tiny_recorder(url: str, *, resume: bool = False):
    import torch

    from tokdyn.model import GPTConfig, TinyGPT

    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 257, size=(N_SEQ, C + 1)), tokenizer={"kind": "byte"})
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=257, context=C, n_layer=1, n_head=2, n_embd=32))
    return tokdyn.TokenLossRecorder(model, probe, url, "r", schedule=range(1, 9), resume=resume, commit_every=0)


def _wait_for(rec) -> None:
    rec._thread.join(10)
    assert not rec._thread.is_alive()


def test_a_recorder_whose_writer_failed_unsaid_says_at_exit_which_rows_are_lost(tmp_path, caplog):
    """A cell run again makes a second recorder of the run in the same process (it takes the
    writer lock over from the first, by design); the first one, still held, records a step: its
    writer stops ('no longer holds its lock') and the row is lost. The script (or kernel) then
    ends without another call to the first recorder: nothing was said, because the exit flush
    skipped a recorder whose writer thread had ended. Now the exit says the writer's failure
    and the steps lost, once: not again for a failure its training thread was already told."""
    from tokdyn.record import recorder as recorder_module

    url = str(tmp_path / "s.zarr")
    first = _tiny_recorder(url)
    first.record(1)
    first.flush()
    second = _tiny_recorder(url, resume=True)
    first.record(2)
    _wait_for(first)
    with caplog.at_level("ERROR", logger=recorder_module.__name__):
        recorder_module._flush_at_exit()
    said = [r.getMessage() for r in caplog.records if "run 'r'" in r.getMessage()]
    assert len(said) == 1 and "no longer holds its lock" in said[0] and "step 2" in said[0] and "lost" in said[0], said
    second.close()
    assert tokdyn.open_store(url, mode="r").run("r").steps.tolist() == [1]  # what the line says: step 2 is not there
    # a failure the training thread was told of is not said again at exit
    caplog.clear()
    third = _tiny_recorder(url, resume=True)
    third.record(3)
    fourth = _tiny_recorder(url, resume=True)
    third.record(4)
    _wait_for(third)
    with pytest.raises(tokdyn.WriterError):
        third.record(5)
    with caplog.at_level("ERROR", logger=recorder_module.__name__):
        recorder_module._flush_at_exit()
    assert not [r for r in caplog.records if "run 'r'" in r.getMessage()]
    fourth.close()


SCRIPT = """
import os, sys
import numpy as np
import tokdyn
with open(sys.argv[2], "a") as fh:  # who ran this top level
    fh.write(f"{os.getpid()}\\n")
s = tokdyn.open_store(sys.argv[1], tokdyn.ProbeSet.from_tokens(np.zeros((4, 17), int)), mode="w")
losses = np.load(sys.argv[3])
with s.create_run("r", token_chunk=16).writer() as w:
    for j, row in enumerate(losses):
        w.append(row, step=int(10 * 1.3**j))
tokdyn.fit_run(s.run("r"), backend="numpy", scheduler="processes", workers=2, progress=False)
print("fitted", flush=True)
"""


def test_a_script_that_fits_with_worker_processes_is_not_run_again_by_them(tmp_path):
    """A training script that also analyses, written without `if __name__ == "__main__":`, fits
    with ``scheduler="processes"``: each worker, started by "spawn", ran the script's top level
    again before fitting (Python's rule for a pool of the user's own functions; the fit's tasks
    are tokdyn's). Its `open_store(..., mode="w")` deleted the store the parent was fitting,
    recorded run included, and the parent said 'a worker process of the fit died ... (killed, or
    out of memory?)'. The fit's workers now start without the parent's main module: the script
    runs once, and the fit is the one a single thread makes."""
    rng = np.random.default_rng(5)
    x = np.log10(10 * 1.3 ** np.arange(24))
    losses = (1 + 3 / (1 + np.exp((x[:, None] - rng.uniform(1.5, 3.0, 64)) / 0.2))
              + rng.normal(0, 0.05, (24, 64))).astype(np.float32)  # fmt: skip
    np.save(tmp_path / "losses.npy", losses)
    (tmp_path / "train_and_fit.py").write_text(SCRIPT)
    url, ran = str(tmp_path / "s.zarr"), tmp_path / "ran.txt"
    done = subprocess.run([sys.executable, str(tmp_path / "train_and_fit.py"), url, str(ran), str(tmp_path / "losses.npy")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "fitted" in done.stdout, done.stderr[-2000:]
    assert len(ran.read_text().split()) == 1  # the top level ran in the script's own process only
    # the independent answer: the same losses fitted on one thread, in this process
    ref = tokdyn.open_store(str(tmp_path / "ref.zarr"), tokdyn.ProbeSet.from_tokens(np.zeros((4, 17), int)), mode="a")
    with ref.create_run("r", token_chunk=16).writer() as w:
        for j, row in enumerate(losses):
            w.append(row, step=int(10 * 1.3**j))
    tokdyn.fit_run(ref.run("r"), backend="numpy", scheduler="sync", progress=False)
    got, want = tokdyn.open_store(url, mode="r").run("r").fit.read(["mu", "status"]), ref.run("r").fit.read(["mu", "status"])
    assert np.array_equal(got["status"], want["status"]) and np.allclose(got["mu"], want["mu"], equal_nan=True)


def test_each_import_of_a_loop_says_its_own_infinite_and_overflowing_losses(tmp_path):
    """Python says a warning once per text and place (its "default" rule, which a notebook
    keeps): a loop importing several files, each with as many infinite losses (or finite losses
    past float16) as the one before, was told of the first file only, and the line did not say
    which file or run it was about. Each import's lines now name the file and the run."""
    from tokdyn.interchange import import_npz

    for j in range(3):
        lm = np.ones((4, 3), np.float32)
        lm[0, j], lm[1, j] = np.inf, 1e6  # one infinite loss, one beyond float16, in each file
        np.savez(tmp_path / f"seed{j}.npz", axis_values=np.array([1.0, 2.0, 4.0]), loss_matrix=lm, axis_name=np.array(["T"]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for j in range(3):
            import_npz(tmp_path / f"seed{j}.npz", tmp_path / "s.zarr", dtype="float16")
    said = [str(w.message) for w in caught]
    for j in range(3):
        mine = [m for m in said if f"seed{j}.npz" in m and f"run 'seed{j}'" in m]
        assert len(mine) == 2 and any("1 infinite losses" in m for m in mine) and any("1 finite losses beyond" in m for m in mine), said
