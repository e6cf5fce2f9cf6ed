"""Hunt 14: `tokdyn probe` on hostile and unusual sources (corpus reading and the split)."""

from __future__ import annotations

import json
import os
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize("pattern", ["*.txt", "**/*.txt", "a/**/*.txt", "**/*", "*/*.txt", "a/*", "d1*"])
def test_files_are_those_rglob_finds(tmp_path, pattern):
    src = _folder(tmp_path / "src")
    (src / "a" / "deep" / "er").mkdir(parents=True)
    (src / "a" / "deep" / "er" / "x.txt").write_text(_text(50))
    (src / "top.txt").write_text(_text(51))
    (src / "b" / "note.md").write_text(_text(52))
    (src / "link").symlink_to("a")  # a symlinked folder: rglob's '**' does not enter it
    from pathlib import Path

    expected = sorted(f.relative_to(src).as_posix() for f in Path(src).rglob(pattern) if f.is_file())
    assert expected  # the pattern finds something here, or the comparison says nothing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # top.txt beside nothing; a/ files beside a folder of their stem: not the point
        keys = sorted(d.key for d in text_documents(src, pattern=pattern))
    assert keys == expected


def test_store_in_a_hidden_folder_of_the_source_is_allowed(tmp_path, capsys):
    src = _folder(tmp_path / "src")
    args = ["--sequences", "2", "--context", "8"]
    (src / ".tokdyn").mkdir()
    assert main(["probe", str(src), "--out", str(src / ".tokdyn" / "probe.zarr"), *args]) == 0, capsys.readouterr().err
    assert main(["probe", str(src), "--out", str(src / "a" / ".probe.zarr"), *args]) == 0, capsys.readouterr().err
    keys = {d.key for d in text_documents(src)}
    assert not any("zarr" in k for k in keys)  # the stores were never read as documents
    assert main(["probe", str(src), "--out", str(tmp_path / "p.zarr"), "--held-out", str(src / ".keys.txt"), *args]) == 0
    assert main(["probe", str(src), "--out", str(tmp_path / "q.zarr"), "--held-out", str(src / "keys.txt"), *args]) != 0
    assert "is part of the source" in capsys.readouterr().err


def test_jsonl_names_only_the_lines_whose_bytes_were_not_utf8(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_bytes('{"text": "café"}\n'.encode("latin-1")
                  + '{"text": "a real \ufffd in valid UTF-8"}\n'.encode()
                  + '{"text": "\\ufffd escaped"}\r\n'.encode())  # fmt: skip
    with pytest.warns(UserWarning, match=r"1 line\(s\) not valid UTF-8.*: line 1 \(1 place\) \(") as rec:
        docs = jsonl_documents(f)
    assert len(rec) == 1 and [d.text for d in docs] == ["caf\ufffd", "a real \ufffd in valid UTF-8", "\ufffd escaped"]


def test_jsonl_valid_lines_with_replacement_chars_warn_nothing(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + '{"text": "\ufffd"}\n{"text": "x"}\r{"text": "y"}\n'.encode())  # BOM; a lone \r ends a line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        docs = jsonl_documents(f)
    assert [(d.key, d.text) for d in docs] == [("c.jsonl:1", "\ufffd"), ("c.jsonl:2", "x"), ("c.jsonl:3", "y")]


_SEGMENTS = ["*", "**", "a*", "*.txt", "b", "x?", "[ab]*"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.lists(st.lists(st.sampled_from(["a", "b", "xy", "ab.txt", "b.txt", ".h"]), min_size=1, max_size=4), max_size=12),
       pattern=st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=3))  # fmt: skip
def test_listed_files_are_rglobs_without_hidden_ones(tmp_path_factory, tree, pattern):
    """Any tree, any pattern: the files read are those rglob finds, less those under a hidden name."""
    from pathlib import Path

    from tokdyn.corpus import _list_files

    root = tmp_path_factory.mktemp("t")
    for parts in tree:  # every path a file; a path whose prefix is already a file is left out
        f = root.joinpath(*parts)
        if any(p.is_file() for p in [f, *f.parents]) or f.is_dir():
            continue
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    pat = "/".join(pattern)
    want = sorted(f for f in Path(root).rglob(pat) if f.is_file() and not any(p.startswith(".") for p in f.relative_to(root).parts))
    assert _list_files(root, pat) == want
