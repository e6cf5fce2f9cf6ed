"""Hunt 17: ``tokdyn demo`` as newcomers and scripts use it, reruns and interrupts above all.

The training is swapped for a stand-in wherever the demo's own files are what is checked: each
test runs in a second or two.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import tokdyn.demo as demo
from tokdyn.cli import main


def _earlier_demo(out):
    """The files an earlier demo left: its store (run ``tiny``), report.html and summary.json."""
    (out / "store.zarr" / "runs" / "tiny").mkdir(parents=True)
    (out / "store.zarr" / "zarr.json").write_text("{}")
    (out / "summary.json").write_text(json.dumps({"steps": [0, 1, 2]}))
    (out / "report.html").write_text("<html>earlier</html>")
    (out / "notes.txt").write_text("mine")  # not the demo's: never touched
    return out


def _fake_corpus(monkeypatch):
    corpus = SimpleNamespace(probe=SimpleNamespace(n_tokens=1), n_train_documents=1, train_tokens=np.zeros(1),
                             n_probe_documents=1)  # fmt: skip
    monkeypatch.setattr(demo, "prepare_corpus", lambda **_: corpus)


class _Stop(Exception):
    pass


def test_a_demo_stopped_while_it_deletes_the_earlier_store_leaves_a_folder_a_rerun_takes(tmp_path, monkeypatch):
    """Ctrl-C while the earlier store was being deleted in place left ``store.zarr`` without its
    ``zarr.json``; every rerun then refused the folder as not a demo's ("holds runs tiny")."""
    out = _earlier_demo(tmp_path / "demo")
    _fake_corpus(monkeypatch)
    rmtree = shutil.rmtree

    def interrupted(path, *a, **k):  # deletes the top of the store, then the user presses Ctrl-C
        Path(path, "zarr.json").unlink(missing_ok=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(out, steps=40, n_points=6, n_probe_sequences=1, progress=False, log=lambda *_: None)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert not (out / demo._LOCK).exists()  # no stale lock
    demo._check_demo_folder(out)  # a rerun is not refused

    def record(store, **_):  # the rerun reaches training with the old store gone, moved-aside copy too
        assert not (out / "store.zarr").exists() and not (out / demo._TRASH).exists()
        assert not (out / "summary.json").exists() and (out / "notes.txt").read_text() == "mine"
        raise _Stop

    monkeypatch.setattr(demo, "record_tiny_run", record)
    with pytest.raises(_Stop):
        demo.run_demo(out, steps=40, n_points=6, n_probe_sequences=1, progress=False, log=lambda *_: None)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_ctrl_c_in_training_says_one_line_leaves_no_lock_and_no_old_results(tmp_path, monkeypatch, capsys):
    out = _earlier_demo(tmp_path / "demo")
    _fake_corpus(monkeypatch)

    def record(store, **_):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "record_tiny_run", record)
    rc = main(["demo", "--out", str(out), "--steps", "40", "--points", "6", "--probe-sequences", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 130 and err.strip() == "tokdyn demo: interrupted", err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # no lock, no summary of a store that is gone


def test_a_note_on_the_measured_mean_is_said_once_not_once_per_reconstruction(tmp_path, monkeypatch):
    """``--steps 40 --points 6``: the note that no R^2 is scored without the end points came
    twice, word for word, the second from the comparison with the BIC-chosen events."""
    import warnings

    import tokdyn
    from tokdyn.reconstruct import MeasuredMeanWarning

    steps = np.array([0, 1, 2, 4, 9, 19, 40])  # the schedule of --steps 40 --points 6
    rng = np.random.default_rng(0)
    n = 40
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(97, 123, size=(n, 2)), tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256})
    mu, drop = rng.uniform(0.3, 1.3, n), rng.uniform(1, 3, n)
    Y = 5 - drop[:, None] / (1 + np.exp(-(np.log10(steps + 1)[None] - mu[:, None]) / 0.1))
    corpus = SimpleNamespace(probe=probe, n_train_documents=1, train_tokens=np.zeros(1), n_probe_documents=1)

    def record(store, *, corpus, **_):
        with tokdyn.open_store(store, corpus.probe, mode="a").create_run("tiny", capacity=len(steps)).writer() as w:
            for j, s in enumerate(steps):
                w.append((Y[:, j] + rng.normal(0, 0.01, n)).astype(np.float32), step=int(s))
        return {"final_train_loss": 1.0, "record_seconds": 0.0}

    monkeypatch.setattr(demo, "prepare_corpus", lambda **_: corpus)
    monkeypatch.setattr(demo, "record_tiny_run", record)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        demo.run_demo(tmp_path / "demo", progress=False, log=lambda *_: None)
    notes = [str(w.message) for w in caught if issubclass(w.category, MeasuredMeanWarning)]
    assert notes and len(notes) == len(set(notes)), notes
