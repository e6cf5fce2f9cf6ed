"""Hostile inputs to `tokdyn probe` and the corpus readers: file names that are not UTF-8 or not
in NFC, hidden and binary files in a text folder, options of one kind of source given with
another, token files larger than memory, and tokenizers whose ids skip numbers."""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import tokdyn
from tokdyn.cli import main
from tokdyn.corpus import Document, bin_documents, split_documents, text_documents
from tokdyn.errors import InputError
from tokdyn.probe import build_probe
from tokdyn.tokenizer import ByteTokenizer

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def _folder(root, names, text=TEXT):
    for name in names:
        path = os.path.join(os.fsencode(root), name if isinstance(name, bytes) else os.fsencode(name))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(text.encode() if isinstance(text, str) else text)
    return root


def _can_name(tmp_path, name: bytes) -> bool:
    try:
        open(os.path.join(os.fsencode(tmp_path), name), "wb").close()
    except OSError:
        return False
    os.unlink(os.path.join(os.fsencode(tmp_path), name))
    return True


# -- file names ------------------------------------------------------------------------------


def test_a_file_name_that_is_not_utf8_is_a_valid_key_not_an_internal_error(tmp_path, capsys):
    """Linux file names are bytes: a Latin-1 name came back as a lone surrogate, which neither the
    split's hash nor the held-out file could encode (an internal error)."""
    if not _can_name(tmp_path, b"caf\xe9.txt"):
        pytest.skip("the file system refuses names that are not UTF-8")
    src = _folder(tmp_path / "texts", [f"a/doc{i}.txt" for i in range(30)] + [b"a/caf\xe9.txt"])
    docs = text_documents(src)
    keys = [d.key for d in docs]
    assert "a/caf\\xe9.txt" in keys
    for k in keys:
        k.encode("utf-8")  # valid Unicode
    held = tmp_path / "held.txt"
    rc = main(["probe", str(src), "--out", str(tmp_path / "s.zarr"), "--context", "8", "--sequences", "2",
               "--probe-fraction", "0.5", "--held-out", str(held)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "internal error" not in err


@settings(max_examples=30, deadline=None)
@given(name=hs.text(hs.characters(codec="utf-8", exclude_characters="/\0."), min_size=1, max_size=12))
def test_the_split_is_the_same_for_both_unicode_spellings_of_a_name(name):
    """macOS writes names decomposed (NFD), Linux keeps what it is given: the same corpus copied
    between them must split the same, or a probe document may be trained on."""
    docs = [Document(key=f"d/{i}.txt", domain="d", text="x") for i in range(40)]
    nfc = docs + [Document(key=unicodedata.normalize("NFC", name) + ".txt", domain="d", text="x")]
    nfd = docs + [Document(key=unicodedata.normalize("NFD", name) + ".txt", domain="d", text="x")]
    a_train, a_probe = split_documents(nfc, probe_fraction=0.3)
    b_train, b_probe = split_documents(nfd, probe_fraction=0.3)
    assert len(a_probe) == len(b_probe) and len(a_train) == len(b_train)


def test_a_key_with_a_lone_surrogate_splits_without_error():
    docs = [Document(key=f"k{i}\udce9", domain="d", text="x") for i in range(40)]
    train, probe = split_documents(docs, probe_fraction=0.3)
    assert len(train) + len(probe) == 40


def test_folder_keys_are_nfc(tmp_path):
    decomposed = unicodedata.normalize("NFD", "a/café.txt")
    docs = text_documents(_folder(tmp_path / "t", [decomposed, "a/b.txt"]))
    assert unicodedata.normalize("NFC", "a/café.txt") in [d.key for d in docs]


# -- what a text folder holds ----------------------------------------------------------------


def test_hidden_entries_of_a_text_folder_are_not_documents(tmp_path):
    """A corpus folder that is a git checkout, or was on a Mac, held .git objects (compressed
    binary) and .DS_Store files, which became probe documents."""
    src = _folder(tmp_path / "t", ["a/one.txt", "b/two.txt"])
    _folder(src, [".git/objects/ab/cdef", ".git/HEAD", "a/.DS_Store", "a/.one.txt.swp"], text=b"ref: refs/heads/main\n")
    docs = text_documents(src)
    assert sorted(d.key for d in docs) == ["a/one.txt", "b/two.txt"]
    assert {d.domain for d in docs} == {"a", "b"}


def test_binary_files_in_a_text_folder_are_skipped_with_a_warning_naming_them(tmp_path):
    src = _folder(tmp_path / "t", ["a/one.txt", "a/two.txt"])
    _folder(src, ["a/logo.png", "a/mod.pyc"], text=b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    with pytest.warns(UserWarning, match=r"skipped 2 binary file\(s\).*a/logo\.png"):
        docs = text_documents(src)
    assert sorted(d.key for d in docs) == ["a/one.txt", "a/two.txt"]
    for d in docs:
        assert "\x00" not in d.text


def test_entries_of_a_text_folder_that_are_not_files_are_skipped_with_a_warning_naming_them(tmp_path):
    """A FIFO, a socket, a broken link or a link loop among a folder's files was left out without
    a word (and the folder's document count then said something else); each is named with what it is."""
    import socket
    import tempfile

    src = _folder(tmp_path / "t", ["a/one.txt", "a/two.txt"])
    os.mkfifo(src / "a" / "pipe.txt")
    (src / "a" / "gone.txt").symlink_to(src / "a" / "nowhere.txt")
    (src / "b.txt").symlink_to(src / "b.txt")
    short = Path(tempfile.mkdtemp(dir="/tmp"))
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(short / "s"))
        (src / "a" / "sock.txt").symlink_to(short / "s")
        for pattern in ("*", "**/*.txt", "*/**/*"):  # ** reaches a folder several ways: each entry said once
            with pytest.warns(UserWarning) as got:
                docs = text_documents(src, pattern=pattern)
            said = [str(w.message) for w in got if "not regular files" in str(w.message)]
            assert len(said) == 1, [str(w.message) for w in got]
            n = 4 if pattern != "*/**/*" else 3  # b.txt lies in no sub-folder
            assert f"skipped {n} entries that are not regular files" in said[0], said[0]
            for part in ("a/gone.txt (a broken link)", "a/pipe.txt (a FIFO)", "a/sock.txt (a socket)", "b.txt (a link loop)")[:n]:
                assert part in said[0], said[0]
            assert sorted(d.key for d in docs) == ["a/one.txt", "a/two.txt"]
    finally:
        sock.close()
        shutil.rmtree(short)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pattern that does not name them: nothing to say
        assert len(text_documents(src, pattern="*/one.txt")) == 1


def test_a_binary_file_named_as_the_source_is_one_error_line(tmp_path, capsys):
    f = tmp_path / "train.u16"
    np.arange(5000, dtype=np.uint16).tofile(f)
    assert main(["probe", str(f), "--out", str(tmp_path / "s.zarr"), "--context", "8", "--sequences", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "binary, not text" in err and "*.bin" in err


@pytest.mark.parametrize("option", [["--bin-eot-id", "0"], ["--bin-dtype", "uint32"], ["--text-field", "body"], ["--domain-field", "src"]])
def test_an_option_of_another_kind_of_source_is_refused_not_ignored(option, tmp_path, capsys):
    """--bin-eot-id given with a token file not named *.bin read it as text, silently."""
    src = _folder(tmp_path / "t", [f"a/{i}.txt" for i in range(20)])
    rc = main(["probe", str(src), "--out", str(tmp_path / "s.zarr"), "--context", "8", "--sequences", "2", *option])
    assert rc == 1
    assert f"{option[0]} applies to a ." in capsys.readouterr().err
    assert not (tmp_path / "s.zarr").exists()


# -- token files -----------------------------------------------------------------------------


def test_a_token_file_is_cut_into_views_of_the_file_not_copies(tmp_path):
    """Each document was copied into int64: a token file took four times its size in memory (a
    nanoGPT train.bin of 17 GB, 70 GB) before the probe side was even chosen."""
    p = tmp_path / "t.bin"
    a = np.arange(10_000, dtype=np.uint16) % 250
    a[::100] = 256
    a.tofile(p)
    docs = bin_documents(p, eot_id=256)
    assert all(isinstance(d.tokens, np.memmap) and d.tokens.dtype == np.uint16 for d in docs)
    assert sum(d.tokens.size for d in docs) == a.size - 1  # the first document is a lone end-of-text
    assert np.array_equal(np.concatenate([d.tokens for d in docs]), a[1:])


@settings(max_examples=25, deadline=None)
@given(lengths=hs.lists(hs.integers(0, 120), min_size=1, max_size=30), context=hs.integers(1, 20),
       n=hs.integers(1, 12), seed=hs.integers(0, 2**32 - 1))  # fmt: skip
def test_the_probe_windows_are_the_documents_tokens(lengths, context, n, seed):
    """Every probe window is a stretch of one document, at a multiple of context + 1, and its
    doc_id / doc_pos say which (the probe is built without listing every candidate window)."""
    rng = np.random.default_rng(seed)
    docs = [Document(key=f"d{i}", domain=f"x{i % 3}", tokens=rng.integers(0, 257, k).astype(np.uint16)) for i, k in enumerate(lengths)]
    w = context + 1
    total = sum(k // w for k in lengths)
    if total < n:
        with pytest.raises(InputError, match=f"hold {total} windows" if any(lengths) else "gives no tokens"):
            build_probe(docs, ByteTokenizer(), context=context, n_sequences=n, seed=seed)
        return
    p = build_probe(docs, ByteTokenizer(), context=context, n_sequences=n, seed=seed)
    doc_id = p.token_arrays["doc_id"].reshape(n, context)[:, 0]
    start = p.token_arrays["doc_pos"].reshape(n, context)[:, 0] - 1
    for s in range(n):
        doc = docs[[d.key for d in docs].index(p.documents[doc_id[s]])]
        assert start[s] % w == 0 and start[s] + w <= doc.tokens.size
        assert np.array_equal(p.tokens[s], doc.tokens[start[s] : start[s] + w])
    assert len({(doc_id[s], start[s]) for s in range(n)}) == n  # drawn without replacement


def test_ids_past_the_tokenizer_say_which_ids_and_what_to_do(tmp_path, capsys):
    p = tmp_path / "gpt2.bin"
    a = np.random.default_rng(0).integers(0, 50000, 20_000).astype(np.uint16)
    a[::500] = 50256
    a.tofile(p)
    assert main(["probe", str(p), "--out", str(tmp_path / "s.zarr"), "--bin-eot-id", "50256", "--context", "16", "--sequences", "4"]) == 1
    err = capsys.readouterr().err
    assert "outside [0, 257)" in err and "--tokenizer" in err


# -- tokenizers ------------------------------------------------------------------------------


def test_a_tokenizer_whose_ids_skip_numbers_reports_one_past_its_largest_id(tmp_path):
    """vocab_size was the number of tokens: a vocabulary with a gap in its ids gave a size the ids
    exceed (a model sized by it lacks them; the probe refused them as 'outside the vocabulary')."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 5000, "<unk>": 1, "</s>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    hf = tokdyn.HFTokenizer.from_file(path)
    assert hf.vocab_size == 5001 and hf.eot_id == 2
    texts = _folder(tmp_path / "t", [f"d/{i}.txt" for i in range(30)], text="a b " * 50)
    split = tokdyn.data.prepare_probe(str(texts), tokenizer=hf, context=8, n_sequences=2, probe_fraction=0.5)
    assert int(split.probe.tokens.max()) == 5000 < split.probe.tokenizer["vocab_size"]
    assert json.loads(json.dumps(split.probe.tokenizer))["vocab_size"] == 5001


def test_a_jsonl_file_with_a_byte_order_mark_reads(tmp_path):
    """Windows tools (PowerShell's Out-File, Notepad) start UTF-8 files with a byte-order mark:
    line 1 was 'not valid JSON'."""
    p = tmp_path / "docs.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b"\n".join(json.dumps({"text": f"doc {i}"}).encode() for i in range(3)))
    docs = tokdyn.jsonl_documents(p)
    assert [d.text for d in docs] == ["doc 0", "doc 1", "doc 2"]


class _Fixed:
    """A tokenizer stand-in: every text encodes to ``ids``."""

    vocab_size, eot_id = 10, None

    def __init__(self, ids, unk_id=None):
        self.ids, self.unk_id = np.asarray(ids, np.int64), unk_id

    def encode(self, text):
        return self.ids

    def spec(self):
        return {"kind": "test", "vocab_size": self.vocab_size}


def test_a_tokenizer_that_gives_no_tokens_is_named_as_the_cause():
    """It was 'probe documents hold 0 windows ... use fewer sequences, a shorter context'."""
    docs = [Document(key=f"d{i}", domain="x", text="some text") for i in range(5)]
    with pytest.raises(InputError, match="the tokenizer gives no tokens for any of the 5 probe documents"):
        build_probe(docs, _Fixed([]), context=4, n_sequences=1)


def test_a_probe_of_unknown_tokens_is_warned_about(tmp_path):
    """A WordLevel/WordPiece tokenizer of other text maps everything to its unknown token: the
    probe was built, silently, of one id repeated."""
    docs = [Document(key=f"d{i}", domain="x", text="some text") for i in range(5)]
    with pytest.warns(UserWarning, match=r"maps 100% of the probe's tokens to its unknown token \(id 3\)"):
        build_probe(docs, _Fixed([3] * 20, unk_id=3), context=4, n_sequences=2)
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"zzz": 0, "<unk>": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    assert tokdyn.HFTokenizer.from_file(tmp_path / "tok.json").unk_id == 1
