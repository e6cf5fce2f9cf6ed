"""Hunt 19: every file tokdyn reads that a user names, given as something that is not a regular
file, and JSON nested past Python's parser.

- Each reader (tokenizer files, checkpoints, model specs, text, JSON lines and token sources, a
  losses.npz, a learnability table, a mixture schedule, a held-out list, an A/B pipeline's
  ``--reuse``) makes one check before it opens a file (``tokdyn._files.check_regular``): a FIFO
  is refused, not read (the held-out list, the mixture schedule and ``--reuse`` blocked on one
  forever), and a folder, a device, a socket, a broken link and a missing file are each said as
  what they are (a FIFO was "npz file not found" or "learnability table not found").
- JSON nested some thousands deep is valid JSON that Python's parser refuses with a
  RecursionError, not the ValueError of every other malformed document: a JSON lines source, a
  model spec, ``--reuse`` and any zarr.json of a store (tests/test_corruption.py) were an
  "internal error ... a bug". Every parse of JSON tokdyn did not write is one line now.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from reliability_fixtures import cli_error_line, run_cli, unblocking

import tokdyn
import tokdyn.corpus
import tokdyn.curriculum.learnability
import tokdyn.curriculum.mixture
import tokdyn.interchange
from tokdyn._files import check_regular, kind_of_mode, link_note, loads_json
from tokdyn.errors import InputError, StoreError

NESTED = "[" * 100_000 + "]" * 100_000


def _reuse(path):
    from tokdyn.curriculum.ab import MixtureABConfig, _reusable_base_runs

    return _reusable_base_runs(MixtureABConfig.quick(reuse=str(path)), lambda m: None)


def _tokenizer(path):
    return tokdyn.HFTokenizer.from_file(path)


def _checkpoint(path):
    from tokdyn.record.offline.loading import read_state_dict

    return read_state_dict(path)


def _model_spec(path):
    from tokdyn.record.offline.files import read_json

    return read_json(Path(path), "model spec")


# (reader, what its messages call the file, the file's name: a suffix some readers go by)
READERS = {
    "tokenizer": (_tokenizer, "tokenizer file", "tokenizer.json"),
    "checkpoint": (_checkpoint, "checkpoint", "model.pt"),
    "model spec": (_model_spec, "model spec", "spec.json"),
    "text source": (lambda p: tokdyn.corpus.text_documents(p), "text source", "notes.txt"),
    "JSON lines": (lambda p: tokdyn.corpus.jsonl_documents(p), "JSON lines file", "docs.jsonl"),
    "token file": (lambda p: tokdyn.corpus.bin_documents(p), "token file", "train.bin"),
    "losses.npz": (lambda p: tokdyn.interchange.read_npz(p), "npz file", "losses.npz"),
    "learnability table": (lambda p: tokdyn.curriculum.learnability.load_table(p), "learnability table", "table.npz"),
    "mixture schedule": (lambda p: tokdyn.curriculum.mixture.load_mixture_schedule(p), "mixture schedule", "schedule.json"),
    "held-out list": (lambda p: tokdyn.corpus.read_held_out(p), "held-out file", "held_out.txt"),
    "--reuse": (_reuse, "--reuse file", "results.json"),
}


def _make(kind: str, path: Path, keep: list) -> str:
    """Put a ``kind`` entry at ``path``; the words its message must hold."""
    if kind == "missing":
        return "not found"
    if kind == "broken link":
        path.symlink_to(path.parent / "nowhere")
        return "not found: {p} (a broken link)"
    if kind == "folder":
        path.mkdir()
        return "{p} is a folder, not a regular file"
    if kind in ("FIFO", "link to a FIFO"):
        target = path if kind == "FIFO" else path.parent / "pipe"
        os.mkfifo(target)
        if kind != "FIFO":
            path.symlink_to(target)
            return f"{{p}} is a FIFO, not a regular file (a link to {target})"
        return "{p} is a FIFO, not a regular file"
    if kind == "FIFO in a linked folder":  # ``path`` is in a folder that is a link
        os.mkfifo(path)
        return f"{{p}} is a FIFO, not a regular file (at {path.resolve()})"
    if kind == "device":
        path.symlink_to("/dev/zero")  # a read would never end
        return "{p} is a device, not a regular file (a link to /dev/zero)"
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        keep.append(s)
        s.bind(str(path))
        return "{p} is a socket, not a regular file"
    raise AssertionError(kind)


KINDS = ["missing", "broken link", "folder", "FIFO", "link to a FIFO", "FIFO in a linked folder", "device",
         "socket"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_what_is_not_a_regular_file_saying_what_it_is(reader, kind, tmp_path):
    read, what, name = READERS[reader]
    if kind == "folder" and reader in ("text source", "tokenizer"):
        pytest.skip("a folder is a text source, and a tokenizer's when it holds tokenizer.json")
    path = tmp_path / name
    if kind == "FIFO in a linked folder":
        (tmp_path / "real").mkdir()
        (tmp_path / "via").symlink_to(tmp_path / "real")
        path = tmp_path / "via" / name
    if kind == "socket" and len(str(path)) > 100:
        pytest.skip("a socket's path is at most 107 bytes")
    keep: list = []
    expect = _make(kind, path, keep).format(p=path)
    with unblocking(*[f for f in (path, tmp_path / "pipe") if f.is_fifo()]) as opened:  # fails, not hangs, where one is read
        with pytest.raises(InputError) as info:
            read(path)
    for s in keep:
        s.close()
    msg = str(info.value)
    assert not opened, f"{reader}: the FIFO was opened"
    assert expect in msg and what in msg and "\n" not in msg, msg


def test_the_link_note_says_where_a_path_really_is_whichever_part_is_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    f = tmp_path / "real" / "f"
    f.write_text("x")
    (tmp_path / "via").symlink_to(tmp_path / "real")
    (tmp_path / "to_f").symlink_to(f)
    real = str(f.resolve())
    assert link_note(f.resolve()) == ""
    assert link_note(tmp_path / "to_f") == f" (a link to {real})"
    assert link_note(tmp_path / "via" / "f") == f" (at {real})"
    assert link_note(tmp_path / "via" / ".." / "via" / "f") == f" (at {real})"


def test_a_stores_fifo_behind_a_linked_folder_says_where_it_is(tmp_path):
    from tokdyn.store.store import _check_store_file

    (tmp_path / "real").mkdir()
    os.mkfifo(tmp_path / "real" / "0")
    (tmp_path / "s.zarr").symlink_to(tmp_path / "real")
    with pytest.raises(StoreError, match=r"s\.zarr/0 is a FIFO \(at .*real/0\), not a regular file"):
        _check_store_file(tmp_path / "s.zarr" / "0")


def test_the_check_returns_a_regular_file_and_refuses_an_unreadable_one(tmp_path, monkeypatch):
    f = tmp_path / "a.txt"
    f.write_text("x")
    assert check_regular(str(f), "file") == f
    (tmp_path / "link").symlink_to(f)
    assert check_regular(tmp_path / "link", "file") == tmp_path / "link"  # links followed
    monkeypatch.setattr(os, "access", lambda p, mode: False)  # as a user without the permission (tests may run as root)
    with pytest.raises(InputError, match=r"cannot read file .*a\.txt: permission denied"):
        check_regular(f, "file")
    monkeypatch.undo()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(InputError, match=r"cannot read file .*loop: Too many levels of symbolic links"):
        check_regular(tmp_path / "loop", "file")


def test_the_kind_of_a_file_is_said_as_the_kernel_reports_it(tmp_path):
    """kind_of_mode against real files of each kind (the one naming of kinds every message uses)."""
    (tmp_path / "f").write_text("x")
    os.mkfifo(tmp_path / "p")
    (tmp_path / "l").symlink_to(tmp_path / "f")
    import tempfile

    short = Path(tempfile.mkdtemp(dir="/tmp"))  # a socket's path is at most 107 bytes
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(short / "s"))
        got = {n: kind_of_mode(os.lstat(tmp_path / n).st_mode) for n in ("f", "p", "l")}
        got["s"] = kind_of_mode(os.lstat(short / "s").st_mode)
    finally:
        s.close()
        shutil.rmtree(short)
    got["d"] = kind_of_mode(os.stat(tmp_path).st_mode)
    got["null"] = kind_of_mode(os.stat("/dev/null").st_mode)  # a character device
    assert got == {"f": "a regular file", "p": "a FIFO", "l": "a link", "s": "a socket", "d": "a folder", "null": "a device"}


@pytest.mark.parametrize("text", [NESTED, '{"a": ' * 50_000 + "1" + "}" * 50_000, "[1, " + "[" * 100_000])
def test_json_nested_past_the_parser_is_a_decode_error(text):
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        loads_json(text)
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        loads_json(text.encode())
    assert loads_json('{"a": [[[1]]]}') == {"a": [[[1]]]}  # what json.loads reads, read the same
    assert loads_json(json.dumps(np.arange(3).tolist())) == [0, 1, 2]


@pytest.mark.parametrize("reader", ["model spec", "mixture schedule", "--reuse", "JSON lines"])
def test_every_json_reader_says_a_document_nested_too_deeply_in_one_line(reader, tmp_path):
    read, what, name = READERS[reader]
    path = tmp_path / name
    path.write_text('{"text": "fine"}\n' + NESTED + "\n" if reader == "JSON lines" else NESTED)
    with pytest.raises(InputError, match="nested too deeply") as info:
        read(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_the_cli_says_nested_json_in_one_line_not_an_internal_error(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "fine"}\n' * 3 + NESTED + "\n")
    code, err = run_cli(["probe", str(src), "--out", str(tmp_path / "p.zarr")], capsys)
    line = cli_error_line(err)
    assert code == 1 and "internal error" not in line and f"{src}:4: not valid JSON (nested too deeply)" in line, line
    spec = tmp_path / "spec.json"
    spec.write_text(NESTED)
    for model in ("{" + '"a": {' * 50_000 + "}" * 50_001, str(spec)):  # inline, and a file
        code, err = run_cli(["record-offline", "--checkpoints", str(tmp_path), "--out", str(tmp_path / "o.zarr"), "--run", "r",
                             "--model", model], capsys)  # fmt: skip
        line = cli_error_line(err)
        assert code == 1 and "internal error" not in line and "nested too deeply" in line, line


def _run(arm="base", seed=0, budget=1.0, **over):
    return {"seed": seed, "arm": arm, "budget": budget, "steps": 40, "final": [3.0, 3.1], "final_mixture": 3.05,
            "curve": [[3.2, 3.3], [3.0, 3.1]], "draws_sha256": "x", **over}  # fmt: skip


@pytest.mark.parametrize("doc, why", [
    ([], "a list"),
    ({"config": None, "runs": []}, "config not an object"),
    ({"runs": {"0": _run()}}, "runs not a list"),
    ({"runs": [_run(), 3]}, "a run not an object"),
    ({"runs": [{k: v for k, v in _run().items() if k != "seed"}]}, "a run without its seed"),
    ({"runs": [_run(seed=[0])]}, "a seed that is a list (unhashable: a TypeError)"),
    ({"runs": [_run(budget="1.0")]}, "a budget that is text"),
    ({"runs": [_run(final="3.0")]}, "final losses that are text"),
    ({"runs": [_run(final_mixture=[3.0])]}, "a mixture loss that is a list"),
    ({"runs": [_run(curve=[3.0, 3.1])]}, "a curve of numbers, not of per-domain losses"),
    ({"runs": [{k: v for k, v in _run().items() if k != "curve"}]}, "a run without its curve"),
])  # fmt: skip
def test_reuse_refuses_a_results_file_of_another_shape_in_one_line(doc, why, tmp_path):
    from tokdyn.curriculum.ab import MixtureABConfig

    if isinstance(doc, dict):
        doc = {"config": asdict(MixtureABConfig.quick()), **doc}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="not a results.json of this pipeline"):
        _reuse(path)


def test_reuse_takes_the_matching_baselines_of_a_results_file_with_diverged_runs(tmp_path):
    from tokdyn.curriculum.ab import MixtureABConfig

    runs = [_run(), _run(seed=1, final=[None, 3.1], final_mixture=None), _run(arm="mixture"), _run(seed=9)]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"config": asdict(MixtureABConfig.quick()), "runs": runs}))
    assert _reuse(path) == runs[:1]  # the diverged run (null losses) is trained again; arms and other seeds never taken


# -- `tokdyn probe --tokenizer bpe`: the trained tokenizer is saved ------------------------------


@pytest.fixture
def text_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "tokens", "learned", "loss", "step"]
    for i in range(12):
        (src / f"d{i}.txt").write_text(" ".join(rng.choice(words, 300)) + f" {i}\n")
    return src


def test_bpe_saves_the_tokenizer_the_probe_was_made_with(text_folder, tmp_path, capsys):
    # it was trained, used and never saved: the store keeps only its hash, so no model could be
    # trained with the tokenizer of its probe, and no report could show the probe's text
    out, saved = tmp_path / "p.zarr", tmp_path / "tok.json"
    code, err = run_cli(["probe", str(text_folder), "--out", str(out), "--tokenizer", "bpe", "--save-tokenizer", str(saved),
                         "--context", "16", "--sequences", "4", "--probe-fraction", "0.3"], capsys)  # fmt: skip
    assert code == 0, err
    probe = tokdyn.open_store(out).probe
    tok = tokdyn.HFTokenizer.from_file(saved)
    assert tok.spec() == dict(probe.tokenizer) and tok.spec()["sha256"]
    docs = {d.stem: tok.encode((text_folder / f"{d.stem}.txt").read_text()) for d in text_folder.iterdir()}
    for row in np.asarray(probe.tokens):  # each probe window is a stretch of one document's encoding
        assert any(_holds(ids, row) for ids in docs.values()), row


def test_bpe_vocab_bounds_the_trained_tokenizer(text_folder, tmp_path, capsys):
    """--bpe-vocab N: the saved tokenizer, the store's spec and every probe id stay below N (the
    corpus offers more merges than 300 - 257, so N is reached); the default is 1,024."""
    sizes = {}
    for n in (None, 300, 301):
        out, saved = tmp_path / f"p{n}.zarr", tmp_path / f"tok{n}.json"
        code, err = run_cli(["probe", str(text_folder), "--out", str(out), "--tokenizer", "bpe", "--save-tokenizer", str(saved),
                             "--context", "16", "--sequences", "4", "--probe-fraction", "0.3",
                             *([] if n is None else ["--bpe-vocab", str(n)])], capsys)  # fmt: skip
        assert code == 0, err
        probe = tokdyn.open_store(out).probe
        sizes[n] = tokdyn.HFTokenizer.from_file(saved).vocab_size
        assert probe.tokenizer["vocab_size"] == sizes[n] and int(np.asarray(probe.tokens).max()) < sizes[n]
    assert sizes[300] == 300 and sizes[301] == 301 and 301 < sizes[None] <= 1024, sizes


@given(hs.one_of(hs.integers(-2**40, 2**40), hs.sampled_from([299, 300, 2**31, 2**31 + 1]), hs.floats(allow_nan=True),
                 hs.booleans(), hs.text(max_size=3), hs.none()))  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_a_bpe_vocabulary_is_taken_exactly_when_whole_and_in_range(v):
    from tokdyn.tokenizer import check_bpe_vocab

    ok = isinstance(v, int) and not isinstance(v, bool) and 300 <= v <= 2**31
    try:
        assert check_bpe_vocab(v) == v and ok
    except InputError as exc:
        assert not ok and "\n" not in str(exc)


def test_the_library_checks_a_bpe_vocabulary_before_reading_the_corpus(tmp_path):
    from tokdyn.data import prepare_corpus, prepare_domains, prepare_probe

    missing = str(tmp_path / "no-such-folder")  # read first, it would say "not found"
    for prepare in (prepare_probe, prepare_corpus, prepare_domains):
        with pytest.raises(InputError, match="vocab_size must be from 300"):
            prepare(missing, tokenizer="bpe", vocab_size=12)
        with pytest.raises(InputError, match="vocab_size must be a whole number"):
            prepare(missing, tokenizer="bpe", vocab_size=1024.0)


def _holds(ids: np.ndarray, row: np.ndarray) -> bool:
    n = len(row)
    return any(np.array_equal(ids[i:i + n], row) for i in range(len(ids) - n + 1))


@pytest.mark.parametrize("args, says", [
    (["--tokenizer", "bpe"], "--save-tokenizer FILE"),
    (["--save-tokenizer", "{tmp}/t.json"], "byte is not trained here"),
    (["--tokenizer", "bpe", "--save-tokenizer", "{tmp}/nodir/t.json"], "nodir does not exist"),
    (["--bpe-vocab", "4096"], "--bpe-vocab is for the tokenizer --tokenizer bpe trains; byte is not trained here"),
    (["--tokenizer", "bpe", "--save-tokenizer", "{tmp}/t.json", "--bpe-vocab", "299"], "--bpe-vocab must be from 300"),
    (["--tokenizer", "bpe", "--save-tokenizer", "{tmp}/t.json", "--bpe-vocab", str(2**31 + 1)], "(ids stored as int32)"),
])  # fmt: skip
def test_bpe_options_are_checked_before_any_work(args, says, text_folder, tmp_path, capsys):
    code, err = run_cli(["probe", str(text_folder), "--out", str(tmp_path / "p.zarr"), *[a.format(tmp=tmp_path) for a in args]],
                        capsys)  # fmt: skip
    line = cli_error_line(err)
    assert code == 1 and says in line, line
    assert not (tmp_path / "p.zarr").exists() and not (tmp_path / "t.json").exists()


def test_bpe_on_a_token_file_is_refused_naming_why(tmp_path, capsys):
    # it trained on no text and failed with a vocabulary error that did not say why
    from tokdyn.corpus import bin_documents
    from tokdyn.data import resolve_tokenizer

    np.arange(5000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    code, err = run_cli(["probe", str(tmp_path / "train.bin"), "--out", str(tmp_path / "p.zarr"), "--tokenizer", "bpe",
                         "--save-tokenizer", str(tmp_path / "t.json")], capsys)  # fmt: skip
    line = cli_error_line(err)
    assert code == 1 and "is a token file" in line and "--tokenizer PATH" in line, line
    with pytest.raises(InputError, match="token ids"):
        resolve_tokenizer("bpe", train_docs=bin_documents(tmp_path / "train.bin"))


# -- help and version that cannot be written ----------------------------------------------------


class _Full(io.StringIO):
    def __init__(self, error: type[OSError]):
        super().__init__()
        self.error = error

    def write(self, text):
        raise self.error(28, "No space left on device")


@pytest.mark.parametrize("argv, what", [(["--help"], "the help"), (["fit", "--help"], "the help"), ([], "the help"),
                                        (["curriculum", "schedule", "--help"], "the help"), (["--version"], "the version")])  # fmt: skip
def test_a_help_that_cannot_be_written_is_one_line_and_exit_1(argv, what, monkeypatch, capsys):
    # argparse writes help and version ignoring OSError: `tokdyn --help > /dev/full` said nothing, exit 0
    from tokdyn.cli import main

    monkeypatch.setattr("sys.stdout", _Full(OSError))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"tokdyn: error: cannot write {what} to standard output: No space left on device\n", err
    monkeypatch.setattr("sys.stdout", _Full(BrokenPipeError))  # `tokdyn --help | head -0`: the reader left, quietly
    assert main(argv) == 141 and capsys.readouterr().err == ""


def test_help_still_prints_and_usage_errors_still_exit_2(capsys):
    from tokdyn.cli import main

    with pytest.raises(SystemExit) as info:
        main(["info", "--help"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("usage: tokdyn info")
    with pytest.raises(SystemExit) as info:
        main(["info"])
    assert info.value.code == 2 and "the following arguments are required: store" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_help_to_a_full_device_in_a_real_process():
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        got = subprocess.run([sys.executable, "-m", "tokdyn", "--help"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert got.returncode == 1 and got.stderr.splitlines() == ["tokdyn: error: cannot write the help to standard output: "
                                                               "No space left on device"], got.stderr  # fmt: skip


def test_build_probe_called_directly_names_a_document_it_cannot_encode():
    # prepare_probe and prepare_corpus named it; build_probe, documented for documents of one's
    # own, gave the tokenizer's message alone (which of thousands of documents?)
    from tokdyn.corpus import Document
    from tokdyn.probe import build_probe

    class Closed(tokdyn.ByteTokenizer):
        def encode(self, text):
            if "\u2603" in text:
                raise InputError("cannot encode '\u2603': not in the vocabulary")
            return super().encode(text)

    docs = [Document("a.txt", "d", text="plain text " * 20), Document("snow/b.txt", "d", text="a \u2603 here " * 20)]
    with pytest.raises(InputError, match=r"^document 'snow/b\.txt': cannot encode"):
        build_probe(docs, Closed(), context=8, n_sequences=2)
    assert build_probe(docs[:1], Closed(), context=8, n_sequences=2).n_sequences == 2


@pytest.mark.parametrize("read_as", ["uint32", "int32"])
def test_a_uint16_token_file_read_as_32_bit_is_said_as_such(read_as, tmp_path, capsys):
    # the vocabulary check refused it with a hint naming the tokenizer only
    ids = np.random.default_rng(0).integers(0, 257, 200_000).astype(np.uint16)
    ids.tofile(tmp_path / "t.bin")
    code, err = run_cli(["probe", str(tmp_path / "t.bin"), "--out", str(tmp_path / "p.zarr"), "--bin-dtype", read_as,
                         "--probe-fraction", "0.3"], capsys)  # fmt: skip
    line = cli_error_line(err)
    assert code == 1 and "two ids below 257 side by side" in line and "--bin-dtype uint16" in line, line
    wide = np.random.default_rng(0).integers(0, 70_000, 100_000).astype(np.uint32)  # ids of another tokenizer: no such hint
    wide.tofile(tmp_path / "w.bin")
    code, err = run_cli(["probe", str(tmp_path / "w.bin"), "--out", str(tmp_path / "w.zarr"), "--bin-dtype", "uint32",
                         "--probe-fraction", "0.3"], capsys)  # fmt: skip
    line = cli_error_line(err)
    assert code == 1 and "outside [0, 257)" in line and "side by side" not in line, line


# -- found by a review of the above ---------------------------------------------------------------


def test_a_checkpoint_folder_s_or_tokenizer_config_s_unreadable_file_is_left_to_its_reader(tmp_path, monkeypatch):
    # the readability check refused an HF folder whose optimizer.pt (never opened) was unreadable,
    # and a tokenizer folder whose unreadable config says nothing the reader needed
    from tokdyn.record.offline.files import check_regular_tree

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "optimizer.pt").write_text("x")
    monkeypatch.setattr(os, "access", lambda p, mode: False)  # as a user without the permission
    check_regular_tree(tmp_path / "ckpt")
    with pytest.raises(InputError, match="permission denied"):
        check_regular(tmp_path / "ckpt" / "optimizer.pt", "file")


def test_a_manifest_s_hf_entry_is_checked_for_files_that_are_not_regular(tmp_path):
    # a manifest entry of kind "hf" skipped discovery's check: its FIFO of weights hung the load
    from tokdyn.record.offline.loading import _load_hf

    folder = tmp_path / "step-2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    os.mkfifo(folder / "pytorch_model.bin")
    with unblocking(folder / "pytorch_model.bin") as opened, pytest.raises(InputError, match=r"pytorch_model\.bin is a FIFO"):
        _load_hf(folder)
    assert not opened


@pytest.mark.parametrize("kind", ["FIFO", "device", "socket"])
def test_checkpoints_given_as_a_special_file_is_said_as_such(kind, tmp_path):
    # was "Not a directory: x/fifo.pt (a part of the path is a file, where a folder is needed)"
    from tokdyn.record.offline.discovery import discover_checkpoints

    keep: list = []
    path = tmp_path / "c.pt"
    expect = _make(kind, path, keep).format(p=path)
    with pytest.raises(InputError) as info:
        discover_checkpoints(path)
    for s in keep:
        s.close()
    assert f"checkpoint {expect}" in str(info.value), info.value


def test_reuse_is_read_before_the_pilot_trains(tmp_path):
    # the pilot trained (minutes in a full run) before a bad --reuse file was said
    from tokdyn.curriculum.ab import MixtureABConfig, run_mixture_ab

    os.mkfifo(tmp_path / "results.json")
    with unblocking(tmp_path / "results.json"), pytest.raises(InputError, match="is a FIFO"):
        run_mixture_ab(tmp_path / "ab", MixtureABConfig.quick(reuse=str(tmp_path / "results.json")), log=lambda m: None)
    assert not (tmp_path / "ab").exists()


def test_a_json_metadata_file_over_the_limit_is_refused_by_its_size(tmp_path, monkeypatch):
    """read_json (manifests, HF configs, trainer states) reads at most the limit and says the size."""
    import tokdyn.record.offline.files as files

    monkeypatch.setattr(files, "MAX_JSON_BYTES", 2**20)
    f = tmp_path / "manifest.json"
    f.write_text(json.dumps({"checkpoints": ["x" * 100] * 30_000}))  # about 3 MiB
    with pytest.raises(InputError, match=r"manifest .*manifest\.json is 3 MiB; a manifest is metadata, at most 1 MiB"):
        files.read_json(f, "manifest")
    f.write_text(json.dumps({"checkpoints": ["x" * 100] * 10}))
    assert files.read_json(f, "manifest") == {"checkpoints": ["x" * 100] * 10}
