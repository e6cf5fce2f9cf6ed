"""A newcomer's own tokenizer and text through ``tokdyn probe``: what a tokenizer file carries
besides its tokenization (truncation, padding, a post-processor's template, a folder's declared
eos_token, a Unigram's unknown token) and a source that cannot be split."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, models, pre_tokenizers, processors  # noqa: E402

import tokdyn  # noqa: E402
from tokdyn.cli import main  # noqa: E402
from tokdyn.corpus import Document, split_documents, text_documents  # noqa: E402
from tokdyn.data import training_stream  # noqa: E402
from tokdyn.errors import InputError  # noqa: E402

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
SPECIAL = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[EOS]"]


def word_tokenizer(extra: tuple[str, ...] = ()) -> Tokenizer:
    """Whitespace words, one id each: a text of n known words is n ids, in order (ids 0-4 special)."""
    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS + list(extra))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def expected_ids(text: str) -> list[int]:
    return [len(SPECIAL) + WORDS.index(w) for w in text.split()]


def write_folder(root, n_docs: int = 40, words_per_doc: int = 60) -> None:
    rng = np.random.default_rng(0)
    for d in ("one", "two"):
        (root / d).mkdir(parents=True)
        for i in range(n_docs // 2):
            (root / d / f"{i}.txt").write_text(" ".join(rng.choice(WORDS, words_per_doc)), encoding="utf-8")


# -- truncation and padding of a tokenizer file ---------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=80), limit=st.integers(1, 20), pad=st.integers(1, 120))
def test_a_tokenizer_files_truncation_and_padding_never_cut_or_pad_a_document(words, limit, pad):
    # Tokenizers saved for batches of model inputs (a BERT's, a sentence encoder's) carry
    # truncation and padding: applied to a document, they cut it to `limit` ids or padded it
    # with [PAD] ids, in the probe and in the training stream, without a word.
    text = " ".join(words)
    tok = word_tokenizer()
    tok.enable_truncation(max_length=limit)
    tok.enable_padding(length=pad, pad_id=3, pad_token="[PAD]")
    ids = tokdyn.HFTokenizer(tok).encode(text)
    assert ids.tolist() == expected_ids(text)
    assert tok.truncation is not None and tok.padding is not None  # the caller's tokenizer is not changed


def test_a_probe_with_a_truncating_tokenizer_file_is_the_probe_of_the_whole_documents(tmp_path, capsys):
    write_folder(tmp_path / "texts")
    word_tokenizer().save(str(tmp_path / "plain.json"))
    tok = word_tokenizer()
    tok.enable_truncation(max_length=8)
    tok.enable_padding(length=100, pad_id=3, pad_token="[PAD]")
    tok.save(str(tmp_path / "batched.json"))
    for name in ("plain", "batched"):
        assert main(["probe", str(tmp_path / "texts"), "--out", str(tmp_path / f"{name}.zarr"), "--tokenizer",
                     str(tmp_path / f"{name}.json"), "--probe-fraction", "0.3", "--context", "15", "--sequences", "8"]) == 0  # fmt: skip
    plain, batched = (tokdyn.open_store(tmp_path / f"{n}.zarr").probe for n in ("plain", "batched"))
    assert np.array_equal(plain.tokens, batched.tokens)  # windows of 16 from documents of 60 words, no [PAD] (3)
    assert not (batched.tokens == 3).any()
    # the spec still names the file as given (its hash), so the report's --tokenizer check holds
    batched_tok = tokdyn.HFTokenizer.from_file(tmp_path / "batched.json")
    assert batched.tokenizer["sha256"] == batched_tok.spec()["sha256"] != plain.tokenizer["sha256"]
    train, _ = split_documents(text_documents(tmp_path / "texts"), probe_fraction=0.3)
    assert len(training_stream(train, batched_tok)) == len(train) * 60  # every word, no eot (none declared)


# -- the end-of-text a Hugging Face folder declares ----------------------------------------------


@pytest.mark.parametrize("where, value", [
    ("tokenizer_config.json", "[EOS]"),
    ("tokenizer_config.json", {"__type": "AddedToken", "content": "[EOS]", "special": True}),
    ("special_tokens_map.json", {"content": "[EOS]", "lstrip": False}),
])  # fmt: skip
def test_the_eos_token_a_tokenizer_folder_declares_ends_documents(tmp_path, where, value):
    # A tokenizer saved with save_pretrained(eos_token="[EOS]") was read as having no end-of-text
    # (none of <|endoftext|>, </s>, ... in it): documents were joined without a separator.
    folder = tmp_path / "tok"
    folder.mkdir()
    word_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / where).write_text(json.dumps({"eos_token": value, "model_max_length": 512}), encoding="utf-8")
    for path in (folder, folder / "tokenizer.json"):  # the folder, or its tokenizer.json
        tok = tokdyn.HFTokenizer.from_file(path)
        assert (tok.eot, tok.eot_id) == ("[EOS]", SPECIAL.index("[EOS]"))
    docs = [Document("a", "d", text="alpha beta"), Document("b", "d", text="gamma")]
    assert training_stream(docs, tok).tolist() == expected_ids("alpha beta") + [4] + expected_ids("gamma") + [4]


def test_a_known_end_of_text_and_an_explicit_choice_win_over_the_declared_one(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    word_tokenizer(extra=("</s>",)).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "[EOS]"}), encoding="utf-8")
    assert tokdyn.HFTokenizer.from_file(folder).eot == "</s>"  # as before: a stored probe keeps its fingerprint
    assert tokdyn.HFTokenizer.from_file(folder, eot=None).eot is None
    assert tokdyn.HFTokenizer.from_file(folder, eot="[SEP]").eot == "[SEP]"
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eod>"}), encoding="utf-8")
    word_tokenizer().save(str(folder / "tokenizer.json"))
    assert tokdyn.HFTokenizer.from_file(folder).eot is None  # declared, but not a token of this tokenizer


# -- what a post-processor adds to every document -------------------------------------------------


def with_template(single: str, specials: list[str]) -> Tokenizer:
    tok = word_tokenizer()
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[(t, SPECIAL.index(t)) for t in specials])
    return tok


@pytest.mark.parametrize("single, specials, added", [
    ("[CLS] $A [SEP]", ["[CLS]", "[SEP]"], (["[CLS]"], ["[SEP]"])),
    ("[CLS] $A", ["[CLS]"], (["[CLS]"], [])),
    ("$A [EOS]", ["[EOS]"], ([], ["[EOS]"])),
    ("$A", [], ([], [])),
])  # fmt: skip
def test_the_tokens_a_post_processor_adds_to_every_document_are_known(single, specials, added):
    tok = tokdyn.HFTokenizer(with_template(single, specials))
    assert tok.added_per_document() == added
    text = "beta gamma"  # and they are what encode puts around a document's own ids
    ids = [SPECIAL.index(t) for t in added[0]] + expected_ids(text) + [SPECIAL.index(t) for t in added[1]]
    assert tok.encode(text).tolist() == ids


def test_tokdyn_probe_says_what_the_tokenizer_adds_to_every_document(tmp_path, capsys):
    # A BERT WordPiece's [CLS] ... [SEP] template went into every probe document and every
    # training document, and the summary said nothing of it.
    write_folder(tmp_path / "texts")
    with_template("[CLS] $A [SEP]", ["[CLS]", "[SEP]"]).save(str(tmp_path / "bert.json"))
    word_tokenizer().save(str(tmp_path / "plain.json"))
    args = ["--probe-fraction", "0.3", "--context", "15", "--sequences", "8"]
    assert main(["probe", str(tmp_path / "texts"), "--out", str(tmp_path / "b.zarr"), "--tokenizer", str(tmp_path / "bert.json"), *args]) == 0
    out = capsys.readouterr().out
    assert "adds       [CLS] before and [SEP] after every document" in out
    assert "end-of-text id none" in out
    probe = tokdyn.open_store(tmp_path / "b.zarr").probe
    starts = probe.token_arrays["doc_pos"][:: probe.context] == 1  # windows at a document's start
    assert (probe.tokens[starts, 0] == SPECIAL.index("[CLS]")).all()
    assert main(["probe", str(tmp_path / "texts"), "--out", str(tmp_path / "p.zarr"), "--tokenizer", str(tmp_path / "plain.json"), *args]) == 0
    assert "adds" not in capsys.readouterr().out


# -- a Unigram tokenizer's unknown token ---------------------------------------------------------


def test_a_unigram_tokenizer_that_knows_none_of_the_text_is_warned_about():
    # BPE and WordPiece name their unknown token; a Unigram (SentencePiece) gives only its id,
    # so a Unigram of other text mapped the whole probe to <unk> without the warning.
    pieces = [("<unk>", 0.0)] + [(c, -1.0) for c in "abcdefghijklmnopqrstuvwxyz "]
    uni = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=False))
    tok = tokdyn.HFTokenizer(uni)
    assert tok.unk_id == 0
    docs = [Document(f"d{i}", "cjk", text="天 地 玄 黃 " * 20) for i in range(3)]  # <unk> " " <unk> " " ...
    assert tok.encode(docs[0].text).tolist()[:4] == [0, 27, 0, 27]
    with pytest.warns(UserWarning, match=r"maps 50% of the probe's tokens to its unknown token \(id 0\)"):
        tokdyn.build_probe(docs, tok, context=7, n_sequences=4)  # windows of 8: 4 <unk> each


# -- a source that cannot be split ---------------------------------------------------------------


def test_a_single_text_file_says_the_probe_needs_several_documents(tmp_path, capsys):
    (tmp_path / "book.txt").write_text("alpha beta " * 5000, encoding="utf-8")
    assert main(["probe", str(tmp_path / "book.txt"), "--out", str(tmp_path / "s.zarr")]) == 1
    err = capsys.readouterr().err
    assert "the source is one document ('book.txt')" in err and "a folder of text files" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("fraction, side, fix", [(1e-6, "probe", "larger"), (1 - 1e-9, "training", "smaller")])
def test_a_split_that_leaves_a_side_empty_names_the_side_and_the_fix(fraction, side, fix):
    docs = [Document(f"k{i}", "d", text="x") for i in range(5)]
    with pytest.raises(InputError, match=rf"left the {side} side empty; give a {fix} probe fraction"):
        split_documents(docs, probe_fraction=fraction)


# -- a text file saved with a byte-order mark ----------------------------------------------------


@settings(max_examples=25, deadline=None)
@example(text="\ufeffx\ny")
@given(text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=50))
def test_a_byte_order_mark_opening_a_text_file_is_not_part_of_the_document(tmp_path_factory, text):
    # Windows Notepad saves UTF-8 with a byte-order mark: it became U+FEFF at the start of every
    # such document (three byte tokens 0xEF 0xBB 0xBF, or a token of its own), in the probe and the
    # training stream, while the same mark in a .jsonl was dropped.
    folder = tmp_path_factory.mktemp("bom")
    (folder / "a").mkdir()
    (folder / "a" / "win.txt").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    (folder / "a" / "unix.txt").write_bytes(text.encode("utf-8"))
    docs = {d.key: d.text for d in text_documents(folder)}
    assert docs["a/win.txt"] == text.replace("\n", "\r\n")  # line ends kept as written; the mark is not text
    assert docs["a/unix.txt"] == text.removeprefix("\ufeff")  # a mark opening a file is one, however it got there
    assert text_documents(folder / "a" / "win.txt")[0].text == docs["a/win.txt"]
