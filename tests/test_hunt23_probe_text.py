"""Hunt 23, area f: a probe built from a researcher's own text (tokdyn probe, tokdyn.corpus)."""

from __future__ import annotations

import codecs
import json
import warnings

import pytest

from tests.test_hunt14_corpus import _folder, _text
from tokdyn.corpus import _list_files, jsonl_documents, text_documents
from tokdyn.errors import InputError


def _keys(src, **kw):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        docs = text_documents(src, **kw)
    return sorted(d.key for d in docs), [str(w.message) for w in rec]


# -- linked folders --------------------------------------------------------------------------


def test_a_linked_folder_outside_the_source_is_read(tmp_path):
    """A corpus assembled from links (data/wiki -> /big/disk/wiki): the linked folder's files were
    left out without a word, a whole domain gone from the probe."""
    src = _folder(tmp_path / "src")
    (tmp_path / "disk" / "wiki" / "en").mkdir(parents=True)
    (tmp_path / "disk" / "wiki" / "w1.txt").write_text(_text(101))
    (tmp_path / "disk" / "wiki" / "en" / "w2.txt").write_text(_text(102))
    (src / "wiki").symlink_to(tmp_path / "disk" / "wiki")
    keys, said = _keys(src)
    assert {"wiki/w1.txt", "wiki/en/w2.txt"} <= set(keys), keys
    with pytest.warns(UserWarning, match="outside the folder"):
        docs = {d.key: d for d in text_documents(src)}
    assert docs["wiki/en/w2.txt"].domain == "wiki" and docs["wiki/w1.txt"].text == _text(101)
    assert len(said) == 1 and f"read 2 document(s) through links that lead outside the folder: wiki (-> {tmp_path / 'disk' / 'wiki'})" in said[0], said


def test_reading_through_a_link_gives_the_documents_of_a_copy(tmp_path):
    """Invariance: a folder linked in reads as the same folder copied in (keys, domains, texts)."""
    (tmp_path / "disk" / "c" / "deep").mkdir(parents=True)
    for i, name in enumerate(["x.txt", "deep/y.txt", "deep/z.md"]):
        (tmp_path / "disk" / "c" / name).write_text(_text(200 + i))
    linked, copied = _folder(tmp_path / "linked", 6), _folder(tmp_path / "copied", 6)
    (linked / "c").symlink_to(tmp_path / "disk" / "c")
    import shutil

    shutil.copytree(tmp_path / "disk" / "c", copied / "c")
    with pytest.warns(UserWarning, match="outside the folder"):  # the linked one
        read = [[(d.key, d.domain, d.text) for d in text_documents(s)] for s in (linked, copied)]
    assert read[0] == read[1] and len(read[0]) == 9


def test_links_that_loop_or_repeat_a_folder_end_and_are_named(tmp_path):
    """A link back up (a loop), a link to a folder of the source, two links to one outside folder,
    and a link inside the outside folder back to itself: every folder is read once, the walk
    ends, and each link skipped is named with the folder it repeats."""
    src = _folder(tmp_path / "src")
    out = tmp_path / "disk" / "o"
    out.mkdir(parents=True)
    (out / "o.txt").write_text(_text(300))
    (out / "again").symlink_to(out)  # loops inside the outside folder
    (src / "a" / "up").symlink_to("..")
    (src / "b" / "also_a").symlink_to("../a")
    (src / "o1").symlink_to(out)
    (src / "o2").symlink_to(out)
    keys, said = _keys(src)
    assert "o1/o.txt" in keys and not any(k.startswith(("o2/", "a/up/", "b/also_a/", "o1/again/")) for k in keys), keys
    assert len(keys) == 41
    line = next(s for s in said if "link" in s)
    for name, repeats in (("a/up", "the source folder"), ("b/also_a", "a"), ("o2", "o1"), ("o1/again", "o1")):
        assert f"{name} (-> {repeats})" in line, line
    (src / "b" / "parent").symlink_to(tmp_path)  # holds the source itself and the outside folder: both said, not read twice
    repeated: dict = {}
    files = _list_files(src, "*", {}, repeated)
    assert sorted(f.relative_to(src).as_posix() for f in files) == keys
    assert {f.relative_to(src).as_posix(): first for f, first in repeated.items()} == {
        "a/up": "", "b/also_a": "a", "o2": "o1", "o1/again": "o1", "b/parent/src": "", "b/parent/disk/o": "o1"}


# -- one corpus, two spellings of its names ----------------------------------------------------


def _spelled(root, form):
    import unicodedata

    for i in range(40):
        name = unicodedata.normalize(form, f"{'é' if i % 2 else 'f'}{i}.txt")
        (root / "x").mkdir(parents=True, exist_ok=True)
        (root / "x" / name).write_text(_text(i))
    return root


def test_the_probe_is_the_same_whichever_way_the_file_system_spells_names(tmp_path):
    """A corpus copied from macOS (names decomposed, NFD) and the same on Linux (NFC): the keys and
    the split were the same, but the documents came in another order (e + U+0301 sorts before f,
    é after), so the same seed drew other windows: another probe, whose store refused the other
    machine's runs."""
    from tokdyn.data import prepare_probe

    a, b = (prepare_probe(str(_spelled(tmp_path / form, form)), context=8, n_sequences=12, probe_fraction=0.5)
            for form in ("NFC", "NFD"))  # fmt: skip
    assert [d.key for d in a.probe_documents] == [d.key for d in b.probe_documents]
    assert a.probe.fingerprint == b.probe.fingerprint


# -- JSON lines whose records say two things -----------------------------------------------------


@pytest.mark.parametrize("line, field", [
    ('{"text": "benign", "text": "other"}', "text"),
    ('{"text": "x", "domain": "web", "domain": "code"}', "domain"),
    ('{"text": "x", "domain": "web", "domain": "web"}', "domain"),  # the same twice: still two fields
])  # fmt: skip
def test_a_record_naming_its_text_or_domain_twice_is_refused(tmp_path, line, field):
    """json.loads keeps the last of two fields of one name without a word; another reader (a
    training pipeline's) may keep the first, and train on the text this probe held out. Such a
    record is one line naming the line and the field; a field of another name given twice, or a
    nested object's, is not the reader's business."""
    f = tmp_path / "c.jsonl"
    good = ['{"text": "a", "domain": "web", "n": 1, "n": 2}', '{"text": "b", "domain": "web", "meta": {"text": 1, "text": 2}}']
    f.write_text("\n".join([*good, line, *good]) + "\n")
    with pytest.raises(InputError, match=rf"c\.jsonl:3: the field {field!r} is given twice"):
        jsonl_documents(f, domain_field="domain")
    f.write_text("\n".join(good) + "\n")
    assert [d.text for d in jsonl_documents(f, domain_field="domain")] == ["a", "b"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32", "utf-8-sig"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_jsonl_saved_as_unicode_reads_as_its_utf8_twin(tmp_path, encoding, newline):
    """Windows PowerShell's Out-File saves UTF-16 with a byte-order mark (Notepad's "Unicode"): a
    text file so saved was read, a .jsonl was "line 1: not valid JSON (Expecting value)" for a
    file an editor shows as valid JSON. It now reads as the same records in UTF-8 (keys, domains,
    texts)."""
    records = [{"text": "naïve café 🙂", "d": "x"}, {"text": ""}, {"text": "second\nline", "d": "y"}, {"text": "三", "d": "x"}]
    lines = newline.join(json.dumps(r, ensure_ascii=False) for r in records) + newline
    twin, saved = tmp_path / "twin.jsonl", tmp_path / "saved.jsonl"
    twin.write_bytes(lines.encode("utf-8"))
    bom = {"utf-16-be": codecs.BOM_UTF16_BE}.get(encoding, b"")
    saved.write_bytes(bom + lines.encode(encoding))
    read = [[(d.key.split(":")[1], d.domain, d.text) for d in jsonl_documents(f)] for f in (twin, saved)]
    assert read[0] == read[1] == [("1", "default", records[0]["text"]), ("3", "default", "second\nline"), ("4", "default", "三")]


def test_a_jsonl_of_damaged_utf16_names_its_bytes(tmp_path):
    f = tmp_path / "saved.jsonl"
    f.write_bytes(codecs.BOM_UTF16_LE + '{"text": "a"}\n{"text": "b'.encode("utf-16-le") + b"\x00\xd8"  # a lone surrogate
                  + '"}\n'.encode("utf-16-le"))  # fmt: skip
    with pytest.warns(UserWarning, match=r"not valid utf-16.*saved\.jsonl \(1 place\)"):
        assert [d.text for d in jsonl_documents(f)] == ["a", "b\ufffd"]


@pytest.mark.parametrize("option", ["--out", "--held-out"])
def test_an_output_inside_a_linked_folder_of_the_source_is_refused(tmp_path, capsys, option):
    """A linked folder is read as part of the source: the store or the held-out keys written in it
    would be read as documents the next time (another corpus, another probe), as inside the
    source itself; a hidden folder of it is still a place for them."""
    from tests.reliability_fixtures import cli_error_line
    from tokdyn.cli import main

    src = _folder(tmp_path / "src", 12)
    (tmp_path / "disk" / "wiki").mkdir(parents=True)
    (tmp_path / "disk" / "wiki" / "w.txt").write_text(_text(99))
    (src / "wiki").symlink_to(tmp_path / "disk" / "wiki")
    args = ["--sequences", "2", "--context", "8", "--probe-fraction", "0.5"]
    there = {"--out": ["--out", str(tmp_path / "disk" / "wiki" / "p.zarr")],
             "--held-out": ["--out", str(tmp_path / "p.zarr"), "--held-out", str(tmp_path / "disk" / "wiki" / "keys.txt")]}[option]
    assert main(["probe", str(src), *there, *args]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert option in line and ("inside the source" in line or "part of the source" in line), line
    assert sorted(p.name for p in (tmp_path / "disk" / "wiki").iterdir()) == ["w.txt"]
    hidden = {"--out": ["--out", str(tmp_path / "disk" / "wiki" / ".p.zarr")],
              "--held-out": ["--out", str(tmp_path / "p.zarr"), "--held-out", str(tmp_path / "disk" / "wiki" / ".keys")]}[option]
    assert main(["probe", str(src), *hidden, *args]) == 0, capsys.readouterr().err


def test_one_entry_skipped_is_said_in_the_singular(tmp_path):
    import os

    src = _folder(tmp_path / "src", 4)
    os.mkfifo(src / "a" / "pipe.txt")
    _, said = _keys(src)
    assert any("skipped 1 entry that is not a regular file (no text to read): a/pipe.txt (a FIFO)" in s for s in said), said


# -- token files -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, eot", [("uint16", 256), ("uint32", 256), ("uint16", 251)])
def test_an_end_of_text_id_the_token_file_never_holds_is_said(tmp_path, dtype, eot):
    """--bin-eot-id that never occurs (a wrong id; or the right one, read as another dtype, where
    it never lines up) cut nothing: one document, refused as 'the source is one document ... a
    folder of text files, or a .jsonl file', which names neither the id nor the dtype."""
    import numpy as np

    from tokdyn.corpus import bin_documents

    ids = np.random.default_rng(0).integers(1, 250, 20_000).astype(np.uint16)
    ids[::500] = 256
    f = tmp_path / "t.bin"
    ids.tofile(f)
    if dtype == "uint16" and eot == 256:
        assert len(bin_documents(f, dtype=dtype, eot_id=eot)) == 40
        return
    with pytest.raises(InputError, match=rf"end-of-text id {eot} does not occur in its {20_000 * 2 // np.dtype(dtype).itemsize:,} {dtype} tokens"):
        bin_documents(f, dtype=dtype, eot_id=eot)


@pytest.mark.parametrize("where", ["in the source", "in a linked folder"])
def test_the_trained_tokenizer_is_not_saved_where_it_would_be_read_as_a_document(tmp_path, capsys, where):
    """--out and --held-out inside the source were refused; --save-tokenizer was not: the BPE's
    tokenizer.json was written into the corpus and read as a document by the next run (another
    split, another probe, another tokenizer)."""
    from tests.reliability_fixtures import cli_error_line
    from tokdyn.cli import main

    src = _folder(tmp_path / "src", 12)
    (tmp_path / "disk").mkdir()
    (src / "more").symlink_to(tmp_path / "disk")
    target = src / "tok.json" if where == "in the source" else src / "more" / "tok.json"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code = main(["probe", str(src), "--out", str(tmp_path / "p.zarr"), "--tokenizer", "bpe", "--save-tokenizer", str(target),
                 "--sequences", "2", "--context", "8", "--probe-fraction", "0.5"])  # fmt: skip
    line = cli_error_line(capsys.readouterr().err)
    assert code == 1 and "--save-tokenizer" in line and "part of the source" in line, line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("other", ["--held-out", "--out"])
def test_the_trained_tokenizer_and_another_output_at_one_path_are_refused(tmp_path, capsys, other):
    """--save-tokenizer and --held-out naming one file: the keys were moved over the tokenizer
    just saved (its only copy: the store keeps its hash), exit 0. With --out, the store was made
    and the save then failed on its folder."""
    from tests.reliability_fixtures import cli_error_line
    from tokdyn.cli import main

    src = _folder(tmp_path / "src", 12)
    same = str(tmp_path / "out.json")
    outs = ["--out", str(tmp_path / "p.zarr"), "--held-out", same] if other == "--held-out" else ["--out", same]
    code = main(["probe", str(src), *outs, "--tokenizer", "bpe", "--save-tokenizer", same,
                 "--sequences", "2", "--context", "8", "--probe-fraction", "0.5"])  # fmt: skip
    line = cli_error_line(capsys.readouterr().err)
    assert code == 1 and "--save-tokenizer" in line and other in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("form", ["file", "folder"])
def test_the_held_out_keys_never_replace_the_tokenizer_they_were_made_with(tmp_path, capsys, form):
    """--held-out naming the --tokenizer file (or the tokenizer.json of the --tokenizer folder):
    the probe was made, then the keys were moved over the user's tokenizer, exit 0."""
    from tests.reliability_fixtures import cli_error_line
    from tokdyn.cli import main
    from tokdyn.corpus import iter_texts
    from tokdyn.tokenizer import HFTokenizer

    src = _folder(tmp_path / "src", 12)
    (tmp_path / "tok").mkdir()
    tok = tmp_path / "tok" / "tokenizer.json"
    HFTokenizer.train(iter_texts(text_documents(src)), vocab_size=300).save(tok)
    saved = tok.read_bytes()
    given = str(tok if form == "file" else tok.parent)
    code = main(["probe", str(src), "--out", str(tmp_path / "p.zarr"), "--tokenizer", given, "--held-out", str(tok),
                 "--sequences", "2", "--context", "8", "--probe-fraction", "0.5"])  # fmt: skip
    line = cli_error_line(capsys.readouterr().err)
    assert code == 1 and "--held-out" in line and "--tokenizer" in line, line
    assert tok.read_bytes() == saved and not (tmp_path / "p.zarr").exists()


def test_documents_read_through_links_that_leave_the_folder_are_named(tmp_path):
    """A corpus unpacked from an archive or cloned (both keep links) can link out of itself, to a
    file or a folder the user never meant to put in a probe store (``notes -> ~/.ssh``): its text
    became documents without a word. It still does (a corpus assembled from links is a real one),
    but the warning names each link that leaves the folder and where it leads."""
    src = _folder(tmp_path / "src", 6)
    (tmp_path / "home" / "keys").mkdir(parents=True)
    (tmp_path / "home" / "keys" / "id").write_text("secret " * 20)
    (tmp_path / "home" / "keys" / "id2").write_text("secret two " * 20)
    (tmp_path / "home" / "note.txt").write_text("private " * 20)
    (src / "b" / "inner").symlink_to(src / "a")  # a link that stays inside: not said
    (src / "a" / "see.txt").symlink_to(src / "b" / "d0.txt")
    (src / "keys").symlink_to(tmp_path / "home" / "keys")
    (src / "a" / "note.txt").symlink_to(tmp_path / "home" / "note.txt")
    keys, said = _keys(src)
    assert {"keys/id", "keys/id2", "a/note.txt", "a/see.txt"} <= set(keys)
    line = next(s for s in said if "outside" in s)
    assert "3 document(s)" in line and f"keys (-> {tmp_path / 'home' / 'keys'})" in line, line
    assert f"a/note.txt (-> {tmp_path / 'home' / 'note.txt'})" in line and "see.txt" not in line and "inner" not in line, line


def test_a_tokenizer_kept_in_the_source_folder_is_not_read_as_a_document(tmp_path, capsys):
    """--tokenizer my_texts/tok (the tokenizer kept beside the texts): its tokenizer.json (a
    vocabulary and merges, as JSON text) became a document, trained on or put in the probe,
    without a word. Refused before any work; in a hidden folder of the source it is fine."""
    from tests.reliability_fixtures import cli_error_line
    from tokdyn.cli import main
    from tokdyn.corpus import iter_texts
    from tokdyn.tokenizer import HFTokenizer

    src = _folder(tmp_path / "src", 12)
    tok = HFTokenizer.train(iter_texts(text_documents(src)), vocab_size=300)
    for folder in ("tok", ".tok"):
        (src / folder).mkdir()
        tok.save(src / folder / "tokenizer.json")
    args = ["--sequences", "2", "--context", "8", "--probe-fraction", "0.5"]
    assert main(["probe", str(src), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(src / "tok"), *args]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert "--tokenizer" in line and "part of the source" in line, line
    assert not (tmp_path / "p.zarr").exists()
    (src / "tok" / "tokenizer.json").unlink()
    (src / "tok").rmdir()
    assert main(["probe", str(src), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(src / ".tok"), *args]) == 0
