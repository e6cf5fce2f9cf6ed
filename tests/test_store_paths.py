"""A store path where something other than a folder is (a file, a FIFO, a socket, a link to
one, a broken link, a link loop), or under such a thing: every way in says what is there, and
nothing is replaced.

Opening said "no tokdyn store at X" without saying that X is a FIFO; creating with
``overwrite=True`` said "X already exists; ... pass overwrite=True to replace it" (it had been
passed, and the file is not replaced); a file above the path reached the library's caller as
Python's ``NotADirectoryError``."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

import tokdyn
from reliability_fixtures import cli_error_line
from tokdyn._files import not_a_folder
from tokdyn.cli import main
from tokdyn.errors import NotAStoreError, StoreError
from tokdyn.store.store import TrajectoryStore


def _make(kind: str, path):
    """A ``kind`` thing at ``path``; its kind as the messages say it."""
    if kind == "file":
        path.write_text("x")
        return "a regular file"
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO"
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))  # closed at once: the socket file stays
        s.close()
        return "a socket"
    if kind == "link":  # a link to a regular file: what it leads to is what is there
        (path.parent / "target").write_text("x")
        path.symlink_to(path.parent / "target")
        return "a regular file"
    if kind == "broken link":
        path.symlink_to(path.parent / "nowhere")
        return f"a broken link (to {path.parent / 'nowhere'})"
    if kind == "link loop":
        path.symlink_to(path.parent / "other")
        (path.parent / "other").symlink_to(path)
        return "a link loop"
    raise AssertionError(kind)


def _snapshot(folder):
    return sorted((p.name, p.lstat().st_mode) for p in folder.iterdir())


def _probe():
    return tokdyn.ProbeSet.from_tokens(np.zeros((2, 5), int), tokenizer={"kind": "byte"})


@pytest.mark.parametrize("kind", ["file", "fifo", "socket", "link", "broken link", "link loop"])
@pytest.mark.parametrize("below", ["", "sub.zarr", "a/b.zarr/"])
def test_a_store_path_that_is_not_a_folder_says_what_is_there(tmp_path, kind, below, capsys):
    work = tmp_path / "w"
    work.mkdir()
    thing = work / "x.zarr"
    said = _make(kind, thing)
    url = str(thing / below) if below else str(thing)
    if below.endswith("/"):
        url += "/"
    clause = f"{thing} is {said}, not a store's folder" if not below else f"{thing}, above it, is {said}, not a folder"
    assert not_a_folder(url) == clause
    before = _snapshot(work)
    for mode in ("r", "r+"):
        with pytest.raises(NotAStoreError) as e:
            tokdyn.open_store(url, mode=mode)
        assert str(e.value) == f"no tokdyn store at {url} ({clause})"
    for overwrite in (False, True):
        with pytest.raises(StoreError) as e:
            TrajectoryStore.create(url, _probe(), overwrite=overwrite)
        assert str(e.value) == f"cannot make a store at {url} ({clause}); give a new path"
        assert "overwrite=True" not in str(e.value)  # it would not help
    with pytest.raises(StoreError) as e:  # open, else create: either way the line says what is there
        tokdyn.open_store(url, _probe(), mode="a")
    assert str(e.value).endswith(f"({clause})") or str(e.value).endswith(f"({clause}); give a new path")
    assert main(["info", url]) == 1
    assert cli_error_line(capsys.readouterr().err) == f"tokdyn info: error: no tokdyn store at {url} ({clause})"
    assert _snapshot(work) == before  # nothing replaced, nothing made
    if kind in ("file", "link"):
        assert (thing.read_text()) == "x"


@pytest.mark.parametrize("url", ["nothing.zarr", "nothing/below.zarr", "", "file://x.zarr", "s3://bucket/x.zarr"])
def test_nothing_there_a_folder_or_a_url_is_not_called_a_file(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder.zarr").mkdir()
    assert not_a_folder(url) == "" and not_a_folder(tmp_path / "folder.zarr") == "" and not_a_folder("/") == ""


def test_probe_out_says_what_is_in_the_way(tmp_path, capsys):
    src = tmp_path / "text"
    src.mkdir()
    (src / "a.txt").write_text("some text to make a probe of, " * 20)
    os.mkfifo(tmp_path / "f.zarr")
    (tmp_path / "gone.zarr").symlink_to(tmp_path / "nowhere")
    for out, says in ((tmp_path / "f.zarr", f"--out: {tmp_path / 'f.zarr'} is a FIFO, not a store's folder"),
                      (tmp_path / "gone.zarr", f"--out: {tmp_path / 'gone.zarr'} is a broken link (to {tmp_path / 'nowhere'}), not a store's folder")):  # fmt: skip
        assert main(["probe", str(src), "--out", str(out)]) == 1
        line = cli_error_line(capsys.readouterr().err)
        assert line == f"tokdyn probe: error: {says}; give a new path or an existing store", line
