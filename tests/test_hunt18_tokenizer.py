"""Hunt 18: a user's tokenizer and token file through ``tokdyn probe``: a BPE with dropout, a
closed WordLevel vocabulary, a token file of wider ids than the dtype it is read in, and tokenizer
files that are not regular files (a FIFO blocks a read forever)."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")
from reliability_fixtures import cli_error_line, run_cli, unblocking  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers  # noqa: E402

import tokdyn  # noqa: E402
from tokdyn.corpus import Document, bin_documents, split_documents, text_documents  # noqa: E402
from tokdyn.data import prepare_probe, training_stream  # noqa: E402
from tokdyn.errors import InputError  # noqa: E402

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
PROBE = ["--context", "16", "--sequences", "8", "--probe-fraction", "0.2"]


def write_folder(root, n_docs: int = 30, words_per_doc: int = 80):
    rng = np.random.default_rng(0)
    for i in range(n_docs):
        (root / "d").mkdir(parents=True, exist_ok=True)
        (root / "d" / f"{i}.txt").write_text(" ".join(rng.choice(WORDS, words_per_doc)), encoding="utf-8")
    return root


def probe_keys(root, fraction: float = 0.2) -> list[str]:
    """The keys on the probe side of the split ``tokdyn probe --probe-fraction`` makes."""
    return [d.key for d in split_documents(text_documents(root), probe_fraction=fraction)[1]]


def is_stretch(row, seqs) -> bool:
    """Whether ``row`` is a run of consecutive ids of one of ``seqs``."""
    row = list(row)
    return any(row == list(s[i : i + len(row)]) for s in seqs for i in range(len(s) - len(row) + 1))


def probe_of(store):
    return tokdyn.open_store(store).probe


# -- BPE dropout ---------------------------------------------------------------------------


def bpe_json(dropout: float | None) -> str:
    """A byte-level BPE trained on the words, with ``dropout`` in its model (as a file saved from
    a tokenizer trained with BPE dropout carries it)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)  # fmt: skip
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer=trainer)
    j = json.loads(tok.to_str())
    j["model"]["dropout"] = dropout
    return json.dumps(j)


def test_a_tokenizer_with_bpe_dropout_encodes_a_text_one_way_every_time(tmp_path):
    # BPE dropout skips each merge at random on every call: the same text gave other ids each
    # time, and so did every probe and training stream made from it.
    path = tmp_path / "tokenizer.json"
    path.write_text(bpe_json(0.5), encoding="utf-8")
    text = " ".join(WORDS * 3)
    plain = Tokenizer.from_str(bpe_json(None)).encode(text).ids  # the tokenizer's one segmentation
    assert len(set(tuple(Tokenizer.from_file(str(path)).encode(text).ids) for _ in range(20))) > 1  # it does sample
    tok = tokdyn.HFTokenizer.from_file(path)
    assert all(tok.encode(text).tolist() == plain for _ in range(20))
    given_tok = Tokenizer.from_file(str(path))
    wrapped = tokdyn.HFTokenizer(given_tok)
    assert wrapped.encode(text).tolist() == plain
    assert given_tok.model.dropout == pytest.approx(0.5)  # the caller's tokenizer is not changed
    assert tok.spec()["sha256"] == hashlib.sha256(given_tok.to_str().encode("utf-8")).hexdigest()  # the file as given


def test_a_unigram_sampling_in_memory_encodes_a_text_one_way_every_time():
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.UnigramTrainer(vocab_size=120, unk_token="<unk>", special_tokens=["<unk>"], show_progress=False)
    tok.train_from_iterator([" ".join(WORDS)] * 20 + ["alphabet betamax thetaiota kappagamma"] * 5, trainer=trainer)
    text = "alphabet betamax thetaiota kappagamma " * 4
    plain = Tokenizer.from_str(tok.to_str()).encode(text).ids
    tok.model.alpha, tok.model.nbest_size = 0.5, 10  # subword regularization: sampled segmentations
    hf = tokdyn.HFTokenizer(tok)
    assert all(hf.encode(text).tolist() == plain for _ in range(30))
    assert tok.model.alpha == pytest.approx(0.5)


def test_tokdyn_probe_with_a_dropout_tokenizer_makes_one_probe(tmp_path, capsys):
    # Twice the same command gave two fingerprints, and a rerun into the same store was refused
    # ("probe fingerprint ... differs from the store's").
    texts = write_folder(tmp_path / "texts")
    (tmp_path / "tok.json").write_text(bpe_json(0.5), encoding="utf-8")
    args = ["--tokenizer", str(tmp_path / "tok.json"), *PROBE]
    for out in ("a.zarr", "b.zarr", "a.zarr"):
        code, err = run_cli(["probe", str(texts), "--out", str(tmp_path / out), *args], capsys)
        assert code == 0, err
    a, b = probe_of(tmp_path / "a.zarr"), probe_of(tmp_path / "b.zarr")
    assert a.fingerprint == b.fingerprint and np.array_equal(a.tokens, b.tokens)
    plain = Tokenizer.from_str(bpe_json(None))
    docs = [plain.encode(d.text).ids for d in text_documents(texts) if d.key in probe_keys(texts)]
    assert all(is_stretch(row, docs) for row in a.tokens)


# -- a closed WordLevel vocabulary ---------------------------------------------------------


def closed_tokenizer(extra: tuple[str, ...] = ()) -> Tokenizer:
    """The corpus words and ``<eos>``: its unk_token ``<unk>`` is not in the vocabulary, so a word
    outside it cannot be encoded at all (the Rust error "Missing [UNK] token")."""
    vocab = {t: i for i, t in enumerate([*WORDS, "<eos>", *extra])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_tokdyn_probe_with_a_closed_vocabulary_succeeds_and_again(tmp_path, capsys):
    # The store was written, then the summary's look at the post-processor encoded "a b", "a",
    # "0", "the": an internal error, exit 1, on this and every rerun.
    texts = write_folder(tmp_path / "texts")
    closed_tokenizer().save(str(tmp_path / "wl.json"))
    for _ in range(2):
        code, err = run_cli(["probe", str(texts), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(tmp_path / "wl.json"), *PROBE], capsys)
        assert code == 0 and err == "", err
    docs = [[WORDS.index(w) for w in d.text.split()] for d in text_documents(texts) if d.key in probe_keys(texts)]
    probe = probe_of(tmp_path / "p.zarr")
    assert probe.tokenizer["eot_id"] == len(WORDS) and all(is_stretch(row, docs) for row in probe.tokens)


def test_what_a_closed_vocabulary_adds_to_every_document_is_found_on_corpus_text(tmp_path, capsys):
    tok = closed_tokenizer(extra=("[CLS]", "[SEP]"))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", len(WORDS) + 1), ("[SEP]", len(WORDS) + 2)]
    )
    hf = tokdyn.HFTokenizer(tok)
    assert hf.added_per_document() == ([], [])  # none of its own samples encodes: nothing known, no error
    assert hf.added_per_document(["omega", "beta alpha"]) == (["[CLS]"], ["[SEP]"])  # "omega" cannot be encoded: passed over
    texts = write_folder(tmp_path / "texts")
    tok.save(str(tmp_path / "bert.json"))
    code, err = run_cli(["probe", str(texts), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(tmp_path / "bert.json"), *PROBE], capsys)
    assert code == 0, err
    probe = probe_of(tmp_path / "p.zarr")
    starts = probe.token_arrays["doc_pos"][:: probe.context] == 1  # windows at a document's start
    assert (probe.tokens[starts, 0] == len(WORDS) + 1).all()


def test_what_the_tokenizer_adds_is_not_said_of_a_token_files_tokens(tmp_path, capsys):
    # A token file's ids are taken as they are: the post-processor never ran on them.
    tok = closed_tokenizer(extra=("[CLS]", "[SEP]", "<unk>"))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", len(WORDS) + 1), ("[SEP]", len(WORDS) + 2)]
    )
    tok.save(str(tmp_path / "bert.json"))
    ids = np.random.default_rng(0).integers(0, len(WORDS), 40_000).astype(np.uint16)
    ids.tofile(tmp_path / "t.bin")
    from tokdyn.cli import main

    capsys.readouterr()
    assert main(["probe", str(tmp_path / "t.bin"), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(tmp_path / "bert.json"), *PROBE]) == 0
    out = capsys.readouterr().out
    assert "tokenizer  hf" in out and not any(line.split()[:1] == ["adds"] for line in out.splitlines()), out


def test_a_document_the_tokenizer_cannot_encode_is_one_line_naming_it_before_anything_is_written(tmp_path, capsys):
    texts = write_folder(tmp_path / "texts")
    key = probe_keys(texts)[1]
    (texts / key).write_text("alpha beta omega gamma", encoding="utf-8")  # "omega": not in the vocabulary
    closed_tokenizer().save(str(tmp_path / "wl.json"))
    code, err = run_cli(["probe", str(texts), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(tmp_path / "wl.json"),
                         "--held-out", str(tmp_path / "held.txt"), *PROBE], capsys)  # fmt: skip
    line = cli_error_line(err)
    assert code == 1 and f"document {key!r}" in line and "cannot encode" in line and "internal error" not in line, line
    assert sorted(os.listdir(tmp_path)) == ["texts", "wl.json"]  # no store, no held-out file, no temporary file
    hf = tokdyn.HFTokenizer(closed_tokenizer())
    with pytest.raises(InputError, match=r"document 'x/1\.txt': the tokenizer cannot encode"):
        training_stream([Document("x/0.txt", "x", text="alpha beta"), Document("x/1.txt", "x", text="alpha omega")], hf)


# -- a token file read in a narrower dtype than written -------------------------------------


def byte_ids(n: int, seed: int = 0) -> np.ndarray:
    """``n`` byte-tokenizer ids of text (printable bytes), with end-of-text 256 every 300."""
    ids = np.random.default_rng(seed).integers(32, 127, n)
    ids[::300] = 256
    return ids


@pytest.mark.parametrize("written", ["uint32", "int32"])
def test_a_32_bit_token_file_read_as_uint16_is_refused_naming_its_dtype(written, tmp_path, capsys):
    # Read as uint16 (the default), every id was two, the second 0: a probe of ids 0 half the
    # time, that passed every check (0 and the low halves are in any vocabulary), exit 0.
    ids = byte_ids(20_000)
    ids.astype(written).tofile(tmp_path / "t.bin")
    for dtype in ([], ["--bin-dtype", "uint16"]):
        code, err = run_cli(["probe", str(tmp_path / "t.bin"), "--out", str(tmp_path / "p.zarr"), *PROBE, *dtype], capsys)
        line = cli_error_line(err)
        assert code == 1 and "t.bin" in line and "--bin-dtype uint32" in line, line
        assert not (tmp_path / "p.zarr").exists()
    code, err = run_cli(["probe", str(tmp_path / "t.bin"), "--out", str(tmp_path / "p.zarr"), *PROBE, "--bin-dtype", written,
                         "--bin-eot-id", "256"], capsys)  # fmt: skip
    assert code == 0, err
    assert all(is_stretch(row, [ids]) for row in probe_of(tmp_path / "p.zarr").tokens)


def test_a_64_bit_token_file_is_refused_saying_how_to_convert_it(tmp_path):
    # np.array(ids).tofile(path) writes int64, numpy's default integer.
    ids = byte_ids(5000)
    ids.astype(np.int64).tofile(tmp_path / "t.bin")
    for dtype in ("uint16", "uint32", "int32"):
        with pytest.raises(InputError, match=r"64-bit token ids \(int64.*astype\(np\.uint32\)"):
            bin_documents(tmp_path / "t.bin", dtype=dtype)


def test_a_genuine_uint16_file_with_many_zeros_is_read_as_it_is(tmp_path, capsys):
    # 0 as the end-of-text id between short documents, and a file that is mostly 0 (padding):
    # nothing of a wider file there, whatever the share of zeros.
    rng = np.random.default_rng(1)
    with_eot = np.concatenate([np.append(rng.integers(1, 256, rng.integers(17, 22)), 0) for _ in range(800)]).astype(np.uint16)
    mostly_zero = np.where(rng.random(30_000) < 0.9, 0, rng.integers(1, 256, 30_000)).astype(np.uint16)
    for name, arr, extra in (("eot.bin", with_eot, ["--bin-eot-id", "0"]), ("pad.bin", mostly_zero, [])):
        arr.tofile(tmp_path / name)
        code, err = run_cli(["probe", str(tmp_path / name), "--out", str(tmp_path / f"{name}.zarr"), *PROBE, *extra], capsys)
        assert code == 0, err
        assert all(is_stretch(row, [arr]) for row in probe_of(tmp_path / f"{name}.zarr").tokens)
    short = np.concatenate([np.append(rng.integers(1, 256, rng.integers(1, 4)), 0) for _ in range(3000)]).astype(np.uint16)
    short.tofile(tmp_path / "short.bin")  # a third to a half of the tokens 0
    assert np.array_equal(np.concatenate([d.tokens for d in bin_documents(tmp_path / "short.bin", eot_id=0)]), short)


def test_a_token_file_of_four_ids_is_read_as_it_is_and_refused_as_32_bit_ids(tmp_path):
    # DNA's A, C, G, T: every token is 0 to 3, at even and odd places alike.
    ids = np.random.default_rng(2).integers(0, 4, 20_000)
    ids.astype(np.uint16).tofile(tmp_path / "t16.bin")
    assert np.array_equal(np.concatenate([d.tokens for d in bin_documents(tmp_path / "t16.bin")]), ids)
    ids.astype(np.uint32).tofile(tmp_path / "t32.bin")
    with pytest.raises(InputError, match="32-bit token ids"):
        bin_documents(tmp_path / "t32.bin")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(512, 6000), zeros=st.floats(0.0, 0.95),
       vocab=st.sampled_from([4, 257, 50_257, 65_536]))  # fmt: skip
def test_a_uint16_file_is_never_taken_for_wider_ids(seed, n, zeros, vocab, tmp_path_factory):
    rng = np.random.default_rng(seed)
    ids = np.where(rng.random(n) < zeros, 0, rng.integers(0, vocab, n)).astype(np.uint16)
    path = tmp_path_factory.mktemp("bin") / "t.bin"
    ids.tofile(path)
    assert np.array_equal(np.concatenate([d.tokens for d in bin_documents(path, doc_tokens=n)]), ids)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(256, 6000), zeros=st.floats(0.0, 0.4),
       vocab=st.sampled_from([257, 50_257, 128_256, 262_144]), written=st.sampled_from(["uint32", "int32"]))  # fmt: skip
def test_32_bit_ids_read_as_uint16_are_always_refused(seed, n, zeros, vocab, written, tmp_path_factory):
    rng = np.random.default_rng(seed)
    ids = np.where(rng.random(n) < zeros, 0, rng.integers(0, vocab, n)).astype(written)
    path = tmp_path_factory.mktemp("bin") / "t.bin"
    ids.tofile(path)
    with pytest.raises(InputError, match="32-bit token ids"):
        bin_documents(path)
    assert np.array_equal(np.concatenate([d.tokens for d in bin_documents(path, dtype=written, doc_tokens=n)]), ids)


def wide_tokenizer() -> Tokenizer:
    """A vocabulary whose largest id is 70,000: more than a uint16 holds."""
    vocab = {**{f"w{i}": i for i in range(1000)}, "<unk>": 1000, "</s>": 1001, "omega": 70_000}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_a_tokenizer_of_more_than_65536_ids_needs_the_token_files_dtype_named(tmp_path, capsys):
    # Read as uint16 by default, no id reaches 65,536: the check against the vocabulary of such
    # a tokenizer always passed, whatever the file held.
    wide_tokenizer().save(str(tmp_path / "wide.json"))
    ids = np.random.default_rng(0).integers(0, 1000, 40_000)
    ids[::200] = 70_000
    ids.astype(np.uint32).tofile(tmp_path / "t32.bin")
    ids[ids == 70_000] = 1001
    ids.astype(np.uint16).tofile(tmp_path / "t16.bin")  # a genuine uint16 file of its small ids
    tok = ["--tokenizer", str(tmp_path / "wide.json"), *PROBE]
    for name, said in (("t32.bin", "32-bit token ids"), ("t16.bin", "70,001 token ids")):  # the file's halves, or the vocabulary
        code, err = run_cli(["probe", str(tmp_path / name), "--out", str(tmp_path / "p.zarr"), *tok], capsys)
        line = cli_error_line(err)
        assert code == 1 and said in line and "--bin-dtype uint32" in line, line
        assert not (tmp_path / "p.zarr").exists()
        with pytest.raises(InputError, match=r"uint32'\)"):
            prepare_probe(str(tmp_path / name), tokenizer=tokdyn.HFTokenizer(wide_tokenizer()), context=16, n_sequences=8, probe_fraction=0.2)
    for name, dtype in (("t32.bin", "uint32"), ("t16.bin", "uint16")):  # named: read as it is
        code, err = run_cli(["probe", str(tmp_path / name), "--out", str(tmp_path / f"{name}.zarr"), *tok, "--bin-dtype", dtype], capsys)
        assert code == 0, err
        assert all(is_stretch(row, [np.fromfile(tmp_path / name, dtype)]) for row in probe_of(tmp_path / f"{name}.zarr").tokens)


# -- tokenizer files that are not regular files --------------------------------------------


def folder_with(tmp_path, tok: Tokenizer, special: str | None = None, config: str = "tokenizer_config.json"):
    folder = tmp_path / "tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    if special == "fifo":
        os.mkfifo(folder / config)
    elif special is not None:
        os.symlink(special, folder / config)
    return folder


def no_eot_tokenizer() -> Tokenizer:
    """Words and "[EOS]": none of the end-of-text names tokdyn knows, so the folder's configs decide."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate([*WORDS, "[EOS]", "[UNK]"])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")


@needs_fifo
@pytest.mark.parametrize("config", ["tokenizer_config.json", "special_tokens_map.json"])
@pytest.mark.parametrize("special, kind", [("fifo", "a FIFO"), ("/dev/null", "a device")])
def test_a_config_that_is_not_a_regular_file_is_one_line_not_a_read_forever(config, special, kind, tmp_path):
    if special != "fifo" and not os.path.exists(special):
        pytest.skip(f"no {special}")
    folder = folder_with(tmp_path, no_eot_tokenizer(), special, config)
    with unblocking(folder / config) as opened:
        with pytest.raises(InputError, match=rf"{config} is {kind}, not a regular file.*--eot"):
            tokdyn.HFTokenizer.from_file(folder)
    assert not opened


@needs_fifo
def test_a_config_is_not_opened_where_it_decides_nothing(tmp_path):
    # It was read whenever eot was "auto": a FIFO there blocked `tokdyn probe` forever, even
    # with "</s>" in the vocabulary (the end-of-text it takes first).
    tok = no_eot_tokenizer()
    tok.add_special_tokens(["</s>"])
    folder = folder_with(tmp_path, tok, "fifo")
    with unblocking(folder / "tokenizer_config.json") as opened:
        assert tokdyn.HFTokenizer.from_file(folder).eot == "</s>"
        assert tokdyn.HFTokenizer.from_file(folder, eot=None).eot is None
    assert not opened


@needs_fifo
def test_a_fifo_tokenizer_json_is_called_a_fifo(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    os.mkfifo(folder / "tokenizer.json")
    for path in (folder, folder / "tokenizer.json"):
        with unblocking(folder / "tokenizer.json") as opened, pytest.raises(InputError, match=r"tokenizer\.json is a FIFO, not a regular file"):
            tokdyn.HFTokenizer.from_file(path)
        assert not opened


@needs_fifo
def test_tokdyn_probe_with_a_fifo_config_ends_in_one_line(tmp_path, capsys):
    texts = write_folder(tmp_path / "texts")
    folder = folder_with(tmp_path, no_eot_tokenizer(), "fifo")
    with unblocking(folder / "tokenizer_config.json") as opened:
        code, err = run_cli(["probe", str(texts), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(folder), *PROBE], capsys)
        line = cli_error_line(err)
        assert code == 1 and "tokenizer_config.json is a FIFO" in line, line
        assert not (tmp_path / "p.zarr").exists()
        code, err = run_cli(["probe", str(texts), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(folder), "--eot", "[EOS]", *PROBE], capsys)
        assert code == 0, err
    assert not opened
    assert probe_of(tmp_path / "p.zarr").tokenizer["eot"] == "[EOS]"
