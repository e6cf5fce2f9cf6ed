"""Hunt 14: `tokdyn probe` on hostile and unusual sources (corpus reading and the split)."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from tokdyn.cli import main
from tokdyn.corpus import jsonl_documents, split_documents, text_documents
from tokdyn.errors import InputError

WORDS = "alpha beta gamma delta epsilon zeta eta theta".split()


def _text(i: int, n: int = 60) -> str:
    return " ".join(WORDS[(i * 7 + j * (i % 5 + 1)) % len(WORDS)] for j in range(n)) + f" doc{i}"


def _folder(root, n=40):
    for i in range(n):
        d = root / ("a" if i % 2 else "b")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"d{i}.txt").write_text(_text(i))
    return root


def _probe(src, **kw):
    from tokdyn.data import prepare_probe

    return prepare_probe(str(src), context=8, n_sequences=2, **kw)


def _copied(tmp_path):
    src = _folder(tmp_path / "src")
    (src / "c").mkdir()
    for f in sorted((src / "a").iterdir()):  # the same files copied into another folder
        (src / "c" / f.name).write_bytes(f.read_bytes())
    return src


def test_copies_of_a_held_out_document_are_named(tmp_path):
    split = _probe(_copied(tmp_path), probe_fraction=0.3)
    probe_texts = {d.text for d in split.probe_documents}
    leaked = [d.key for d in split.train_documents if d.text in probe_texts]
    assert leaked and list(split.train_copies) == leaked
    # the split itself stays the split by key (the held-out file's contract)
    _, probe = split_documents(text_documents(tmp_path / "src"), probe_fraction=0.3)
    assert [d.key for d in split.probe_documents] == [d.key for d in probe]


def test_repeated_jsonl_lines_are_named(tmp_path):
    lines = [json.dumps({"text": _text(i)}) for i in range(30)]
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(lines + lines) + "\n")
    split = _probe(f, probe_fraction=0.3)
    probe_texts = {d.text for d in split.probe_documents}
    assert split.train_copies == tuple(d.key for d in split.train_documents if d.text in probe_texts) != ()


def test_no_copies_no_line(tmp_path, capsys):
    src = _folder(tmp_path / "src")
    assert _probe(src, probe_fraction=0.3).train_copies == ()
    assert main(["probe", str(src), "--out", str(tmp_path / "s.zarr"), "--sequences", "2", "--context", "8"]) == 0
    assert "repeat the text" not in capsys.readouterr().out


def test_cli_says_the_copies(tmp_path, capsys):
    src = _copied(tmp_path)
    assert main(["probe", str(src), "--out", str(tmp_path / "s.zarr"), "--sequences", "2", "--context", "8",
                 "--probe-fraction", "0.3"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("copies"))
    assert "repeat the text of a held-out one" in line and "leave them out of training" in line


def test_latin1_file_is_said(tmp_path):
    src = _folder(tmp_path / "src")
    (src / "a" / "latin.txt").write_bytes(("café naïve " * 20).encode("latin-1"))
    with pytest.warns(UserWarning, match=r"not valid UTF-8.*a/latin\.txt \(40 places\)"):
        docs = text_documents(src)
    assert "\ufffd" in next(d for d in docs if d.key == "a/latin.txt").text
    with pytest.warns(UserWarning, match="not valid UTF-8"):
        text_documents(src / "a" / "latin.txt")


def test_valid_utf8_folder_warns_nothing(tmp_path):
    src = _folder(tmp_path / "src")
    (src / "a" / "u.txt").write_text("café \ufffd literal replacement char", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text_documents(src)


def test_latin1_jsonl_line_is_said(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_bytes(b'{"text": "ok"}\n' + '{"text": "café"}\n'.encode("latin-1"))
    with pytest.warns(UserWarning, match=r"1 line\(s\) not valid UTF-8.*line 2"):
        docs = jsonl_documents(f)
    assert docs[1].text == "caf\ufffd"


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_file_with_bom_is_text(tmp_path, codec):
    src = _folder(tmp_path / "src")
    body = "Unicode text saved by Notepad: café"
    data = body.encode(codec) if codec != "utf-16-be" else b"\xfe\xff" + body.encode(codec)
    (src / "a" / "u16.txt").write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not "skipped as binary"
        docs = text_documents(src)
    assert next(d for d in docs if d.key == "a/u16.txt").text == body
    assert text_documents(src / "a" / "u16.txt")[0].text == body


def test_binary_file_opening_like_a_bom_is_still_binary(tmp_path):
    src = _folder(tmp_path / "src")
    (src / "a" / "x.dat").write_bytes(b"\xff\xfe\x00\xd8\x00\x00" * 10)  # not valid UTF-16
    with pytest.warns(UserWarning, match="binary"):
        keys = [d.key for d in text_documents(src)]
    assert "a/x.dat" not in keys


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
@pytest.mark.parametrize("name", ["pipe", "pipe.jsonl", "pipe.bin"])
def test_fifo_source_is_not_called_missing(tmp_path, capsys, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    assert main(["probe", str(fifo), "--out", str(tmp_path / "s.zarr")]) != 0
    err = capsys.readouterr().err
    assert "not a regular file" in err and "not found" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_fifo_inside_folder_is_skipped(tmp_path):
    src = _folder(tmp_path / "src")
    os.mkfifo(src / "a" / "pipe.txt")
    assert "a/pipe.txt" not in [d.key for d in text_documents(src)]


def test_store_inside_source_folder_is_refused(tmp_path, capsys):
    src = _folder(tmp_path / "src")
    assert main(["probe", str(src), "--out", str(src / "store.zarr"), "--sequences", "2", "--context", "8"]) != 0
    err = capsys.readouterr().err
    assert "inside the source folder" in err and len(err.strip().splitlines()) == 1
    assert not (src / "store.zarr").exists()


def test_unreadable_folder_is_an_error_not_left_out(tmp_path, monkeypatch):
    src = _folder(tmp_path / "src")
    (src / "c").mkdir()
    (src / "c" / "x.txt").write_text(_text(99))
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith(os.sep + "c"):  # as chmod 000 does for any user but root
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(InputError, match=r"cannot list the folder c \(permission denied\)"):
        text_documents(src)


def test_unreadable_file_is_one_line(tmp_path, monkeypatch, capsys):
    import pathlib

    src = _folder(tmp_path / "src")
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self.name == "d3.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    with pytest.raises(InputError, match=r"cannot read a/d3\.txt \(permission denied\)"):
        text_documents(src)


def test_hidden_folders_are_not_entered(tmp_path, monkeypatch):
    src = _folder(tmp_path / "src")
    (src / ".git" / "objects").mkdir(parents=True)
    (src / ".git" / "objects" / "x").write_text("blob")
    real = os.scandir

    def scandir(path="."):
        assert ".git" not in os.fspath(path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert all(".git" not in d.key for d in text_documents(src))


def test_symlink_loop_and_links_to_folders(tmp_path):
    src = _folder(tmp_path / "src")
    (src / "a" / "up").symlink_to("..")
    (src / "a" / "self").symlink_to("self")  # a loop of one link
    (src / "a" / "copy.txt").symlink_to("d1.txt")
    docs = text_documents(src)
    assert not any("up/" in d.key for d in docs) and "a/copy.txt" in [d.key for d in docs]


def test_file_beside_a_folder_of_its_name_is_said(tmp_path):
    src = _folder(tmp_path / "src")
    (src / "a.txt").write_text(_text(77))
    with pytest.warns(UserWarning, match=r"a\.txt joins a/"):
        docs = text_documents(src)
    assert next(d for d in docs if d.key == "a.txt").domain == "a"
