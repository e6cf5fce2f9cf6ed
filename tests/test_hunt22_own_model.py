"""A researcher's own model, tokenizer and checkpoint folder, as docs/own-model.md and
docs/recording.md describe them. Each section is a class of inputs that gave a wrong number:

1. a checkpoint name with a word and a number glued together (``final2``, ``best2``, ``L12``,
   ``e10``, ``resnet50``) was read as that step (2, 2, 12, 10, 50), beside real steps or alone;
2. a tokenizer given as transformers takes one (a Hub name, a model folder saved with a slow
   tokenizer's ``vocab.json``/``merges.txt`` or ``tokenizer.model``, a ``tokenizer_config.json``)
   was "not found" or a parser's message, with nothing saying how to get the ``tokenizer.json``
   tokdyn reads;
3. a training stream (``tokdyn.data.training_stream``) cast its ids to int32 unchecked: an id of
   2**31 or more (a tokenizer of ids up to 2**32) wrapped to a negative id, a float id was cut,
   and an id past the tokenizer's vocabulary reached the model;
4. ``random_batches`` refused a stream of exactly one window ("65 tokens is shorter than one
   window of 65"), gave empty batches (a NaN mean loss) for ``batch_size=0``, and said any of it
   only at the first batch.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

import tokdyn
from tokdyn.errors import InputError
from tokdyn.record.offline.discovery import discover_checkpoints

from test_hunt5_offline_steps import _STEP, V, _net, _step_of  # the step helpers and tiny model of the name rules' tests

_EXT = hs.sampled_from([".pt", ".ckpt", ".safetensors", ".bin", ".pth", ""])


# == 1. a word with a number glued on is not a step ==============================================

# The names researchers' checkpoints carry, and the step each gives: the step where the name says
# one, None (then the step the file records, else one line refusing the folder) where it does not.
_CONVENTIONS = [
    ("checkpoint-500", 500), ("step_1000.pt", 1000), ("global_step2000", 2000), ("epoch=3-step=1200.ckpt", 1200),
    ("iter_0001000", 1000), ("iter_0001000.pt", 1000), ("iter500.pt", 500), ("it500.pt", 500), ("ckpt500.pt", 500),
    ("model100.pt", 100), ("gpt2-124M-step1000", 1000), ("gpt2-124M-1000.pt", 1000), ("1000.pt", 1000),
    ("model_final.pt", None), ("best.ckpt", None), ("last.ckpt", None), ("v2.pt", None), ("model-v2.pt", None),
    ("final2", None), ("final2.pt", None), ("model_final2.pt", None), ("best2.pt", None), ("latest3.ckpt", None),
    ("L12", None), ("ckpt_L12.pt", None), ("ckpt_e3.pt", None), ("e10.pt", None), ("resnet50.pt", None),
    ("vit16.pt", None), ("mnist2.pt", None), ("exp2_ckpt.pt", None), ("try3.pt", None), ("gpt2-124M.pt", None),
    ("ckpt_100_final2.pt", 100), ("L12_step300.pt", 300), ("exp2_1000.pt", 1000), ("resnet50-2500.pt", 2500),
    # Composer / LLM Foundry (ep{epoch}-ba{batch}-rank{rank}.pt), and short spellings of a step
    ("ep0-ba1000-rank0.pt", 1000), ("ep1-ba2000.pt", 2000), ("batch1000.pt", 1000), ("s1000.pt", 1000),
    ("gs1000.pt", 1000), ("stp1000.pt", 1000), ("checkpoint_e5_s1000.pt", 1000),
]  # fmt: skip


@pytest.mark.parametrize("name,step", _CONVENTIONS)
def test_common_checkpoint_names_give_their_step_or_none(name, step):
    """`final2` was step 2 and `L12` step 12 (a second final model, a layer); `e10` an epoch,
    `resnet50` a model: none is a step, while `iter500` and `ckpt500` still are."""
    assert _step_of(name) == step


# A word that is no step counter: letters (either case), never one of the words a step is glued to,
# nor holding "step" (whose number is the step, section 1 of docs/recording.md "Steps").
_COUNTING = ["steps", "stp", "s", "gs", "iter", "iters", "iteration", "it", "ba", "batch", "batches", "ckpt", "chkpt", "model",
             "weights", "update", "updates", "upd", "save", "snapshot"]  # written here, not read from the code
_WORD_GLUED = hs.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=8).filter(
    lambda w: w.lower() not in _COUNTING and "step" not in w.lower())  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(word=_WORD_GLUED, number=hs.integers(0, 10**6), zeros=hs.integers(0, 2),
       before=hs.sampled_from(["", "model_", "ckpt-", "run_a."]), ext=_EXT)  # fmt: skip
def test_a_number_glued_to_a_word_is_never_the_step(word, number, zeros, before, ext):
    """Any word with its number glued on (`final2`, `Best3`, `L12`, `xq7`) gives no step: the
    researcher is asked for the step (the file's, else a manifest), never given a made-up one."""
    assert _step_of(f"{before}{word}{'0' * zeros}{number}{ext}") is None


@settings(max_examples=200, deadline=None)
@given(word=_WORD_GLUED, number=hs.integers(0, 10**6), step=_STEP, sep=hs.sampled_from(["-", "_"]), first=hs.booleans(),
       ext=_EXT)  # fmt: skip
def test_a_number_glued_to_a_word_never_replaces_the_step_beside_it(word, number, step, sep, first, ext):
    """`ckpt_100_final2.pt` was step 2; `L12_300.pt` is step 300 wherever the glued part stands
    (joined by a dot, `final2.300` would be a decimal number, no step)."""
    glued = f"{word}{number}"
    name = f"{glued}{sep}{step}" if first else f"ckpt{sep}{step}{sep}{glued}"
    assert _step_of(name + ext) == step


@settings(max_examples=100, deadline=None)
@given(word=hs.sampled_from(_COUNTING),
       upper=hs.booleans(), step=_STEP, zeros=hs.integers(0, 3), ext=_EXT)  # fmt: skip
def test_a_step_glued_to_a_word_that_counts_steps_is_the_step(word, upper, step, zeros, ext):
    """The words a step's number is glued to (`iter500`, `ckpt500`, `model100`) still give it."""
    assert _step_of(f"{word.upper() if upper else word}{'0' * zeros}{step}{ext}") == step


def test_a_folder_with_a_glued_name_is_refused_in_one_line_saying_how_to_give_steps(tmp_path):
    """`final2.pt` beside `step_100.pt` and `step_200.pt` was recorded as step 2, a row before
    step 100 holding the final weights. It is now refused, naming the file and the manifest."""
    for name in ("step_100.pt", "step_200.pt", "final2.pt"):
        torch.save(_net(0).state_dict(), tmp_path / name)
    with pytest.raises(InputError, match=r"cannot tell the step of \['final2\.pt'\].*'final2'.*manifest\.json") as info:
        discover_checkpoints(tmp_path)
    assert "\n" not in str(info.value)


def test_a_glued_name_whose_file_records_its_step_takes_that_step(tmp_path):
    """A Lightning-style checkpoint that records its `global_step` is read at it, whatever its name."""
    torch.save({"state_dict": _net(0).state_dict(), "global_step": 300}, tmp_path / "final2.ckpt")
    torch.save({"state_dict": _net(1).state_dict(), "global_step": 12}, tmp_path / "L12.ckpt")
    assert [(r.step, r.path.name, r.step_from) for r in discover_checkpoints(tmp_path)] == [
        (12, "L12.ckpt", "file"), (300, "final2.ckpt", "file")]  # fmt: skip


def test_the_command_line_says_it_in_one_line(tmp_path, capsys):
    """`tokdyn record-offline` on such a folder: exit 1, one line naming the file and the fix."""
    from tokdyn.cli import main

    tokdyn.open_store(tmp_path / "s.zarr", tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, V, (3, 9))), mode="a")
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in ("step_100.pt", "L12.pt"):
        torch.save(_net(0).state_dict(), ck / name)
    assert main(["record-offline", "--checkpoints", str(ck), "--out", str(tmp_path / "s.zarr"), "--run", "r",
                 "--no-progress"]) == 1  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot tell the step of ['L12.pt']" in err and "manifest.json" in err


# == 2. a tokenizer as transformers takes one ======================================================


@pytest.fixture
def texts(tmp_path):
    for k in range(6):
        (tmp_path / "texts" / f"d{k % 2}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "texts" / f"d{k % 2}" / f"{k}.txt").write_text(f"document {k} " + "import json and the rest " * 40)
    return tmp_path / "texts"


def _probe_error(tmp_path, texts, capsys, tokenizer) -> str:
    from reliability_fixtures import cli_error_line
    from tokdyn.cli import main

    assert main(["probe", str(texts), "--out", str(tmp_path / "s.zarr"), "--tokenizer", str(tokenizer), "--context", "8",
                 "--sequences", "2", "--probe-fraction", "0.5"]) == 1  # fmt: skip
    assert not (tmp_path / "s.zarr").exists()
    return cli_error_line(capsys.readouterr().err)


def _slow_folder(folder: Path, bpe_json: Path) -> Path:
    """A GPT-2 style tokenizer folder as a slow tokenizer saves it: vocab.json and merges.txt."""
    from tokenizers import Tokenizer

    folder.mkdir()
    Tokenizer.from_file(str(bpe_json)).model.save(str(folder))
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>"}')
    return folder


@pytest.fixture
def bpe_json(tmp_path, texts):
    import tokdyn

    tok = tokdyn.HFTokenizer.train((f.read_text() for f in sorted(texts.rglob("*.txt"))), vocab_size=300)
    tok.save(tmp_path / "bpe.json")
    return tmp_path / "bpe.json"


def test_a_folder_with_a_slow_tokenizer_only_says_how_to_write_its_tokenizer_json(tmp_path, texts, bpe_json, capsys):
    """It said `tokenizer file not found: FOLDER/tokenizer.json`, beside the files that make one.
    The advice of the line works: the tokenizer.json it writes encodes as the original does."""
    pytest.importorskip("transformers")
    import tokdyn

    folder = _slow_folder(tmp_path / "slow", bpe_json)
    line = _probe_error(tmp_path, texts, capsys, folder)
    assert "holds no tokenizer.json" in line and "merges.txt, vocab.json" in line
    assert f"AutoTokenizer.from_pretrained('{folder}').save_pretrained('{folder}')" in line
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(folder)).save_pretrained(str(folder))  # as the line says
    text = "import json and the rest"
    assert tokdyn.HFTokenizer.from_file(folder).encode(text).tolist() == tokdyn.HFTokenizer.from_file(bpe_json).encode(text).tolist()


@pytest.mark.parametrize("name", ["gpt2", "EleutherAI/pythia-70m", "meta-llama/Llama-3.2-1B"])
def test_a_hub_name_says_that_nothing_is_downloaded(tmp_path, texts, capsys, monkeypatch, name):
    """`--tokenizer gpt2` said only `tokenizer file not found: gpt2`."""
    monkeypatch.chdir(tmp_path)
    line = _probe_error(tmp_path, texts, capsys, name)
    assert f"tokenizer file not found: {name} (nothing is downloaded" in line
    assert f"AutoTokenizer.from_pretrained({name!r}).save_pretrained('DIR')" in line


def test_a_folder_without_tokenizer_files_asks_for_the_tokenizer(tmp_path, texts, capsys):
    """A checkpoint folder with weights alone: no advice to convert files that are not there."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text("{}")
    line = _probe_error(tmp_path, texts, capsys, tmp_path / "ck")
    assert line.endswith(f"{tmp_path / 'ck'} holds no tokenizer.json nor a slow tokenizer's files; give the tokenizer.json "
                         "the model was trained with, or the folder that holds it")  # fmt: skip


def test_a_missing_folder_inside_one_that_exists_is_not_taken_for_a_hub_name(tmp_path, texts, capsys, monkeypatch):
    """`checkpoints/step33` (a typo for step32) is a path that is not there, said as such."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    line = _probe_error(tmp_path, texts, capsys, "checkpoints/step33")
    assert line.endswith("tokenizer file not found: checkpoints/step33")


@pytest.mark.parametrize("given", ["tokenizer_config.json", "vocab.json", "tokenizer.model"])
def test_a_file_of_another_kind_says_which_file_tokdyn_reads(tmp_path, texts, bpe_json, capsys, given):
    """A `tokenizer_config.json`, `vocab.json` or sentencepiece `tokenizer.model` was the parser's
    own message (`Model missing. at line 1 column 2`) alone."""
    folder = _slow_folder(tmp_path / "slow", bpe_json)
    (folder / "tokenizer.model").write_bytes(bytes(range(256)) * 4)  # a sentencepiece model is protobuf
    line = _probe_error(tmp_path, texts, capsys, folder / given)
    assert line.startswith(f"tokdyn probe: error: cannot load tokenizer {folder / given}: ")
    assert "it must be the tokenizers library's tokenizer.json" in line and f"from_pretrained('{folder}')" in line


def test_a_damaged_tokenizer_json_is_said_as_such(tmp_path, texts, bpe_json, capsys):
    """The advice is for files of another kind: a cut tokenizer.json keeps the parser's message alone."""
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "tokenizer.json").write_text(bpe_json.read_text()[:100])
    line = _probe_error(tmp_path, texts, capsys, tmp_path / "cut")
    assert "cannot load tokenizer" in line and "save_pretrained" not in line


# == 3. the ids of a training stream ===============================================================


class _Ids:
    """A tokenizer as the Tokenizer protocol has it, for documents given as ids (a .bin's)."""

    def __init__(self, vocab_size, eot_id):
        self.vocab_size, self.eot_id = vocab_size, eot_id

    def encode(self, text):
        raise AssertionError("documents of ids are not encoded")


@settings(max_examples=150, deadline=None)
@given(docs=hs.lists(hs.lists(hs.integers(-3, 2**32 + 5), min_size=0, max_size=6), min_size=1, max_size=4),
       vocab=hs.sampled_from([None, 100, 2**31, 2**33]), eot=hs.sampled_from([None, 0, 99]),
       dtype=hs.sampled_from(["int64", "uint32"]))  # fmt: skip
def test_a_training_stream_holds_every_id_as_it_is_or_refuses_the_document(docs, vocab, eot, dtype):
    """The stream is the documents' ids, each followed by the end-of-text (unless it ends in it),
    unchanged; an id outside [0, min(vocab, 2**31)) is one InputError naming its document. Ids of
    2**31 to 2**32 were wrapped to negative ones, silently."""
    from tokdyn.corpus import Document
    from tokdyn.data import training_stream

    top = min(vocab or 2**31, 2**31)
    if dtype == "uint32":
        docs = [[i for i in d if 0 <= i < 2**32] for d in docs]
    documents = [Document(f"doc{k}", "d", tokens=np.array(d, dtype)) for k, d in enumerate(docs)]
    want = [i for d in docs for i in ([*d] if d and d[-1] == eot else [*d, *([] if eot is None else [eot])])]
    bad = next((k for k, d in enumerate(docs) if any(not 0 <= i < top for i in d)), None)
    eot_bad = eot is not None and not eot < top
    if bad is None and not eot_bad:
        stream = training_stream(documents, _Ids(vocab, eot))
        assert stream.dtype == np.int32 and stream.tolist() == want
        return
    with pytest.raises(InputError) as info:
        training_stream(documents, _Ids(vocab, eot))
    line = str(info.value)
    assert "\n" not in line and f"outside [0, {top})" in line
    if bad is not None and (not eot_bad or bad == 0):
        assert line.startswith(f"document 'doc{bad}': ")


def test_a_hashing_tokenizer_of_ids_past_int32_is_refused_naming_the_document():
    """A tokenizer whose ids are a hash of each word (crc32: up to 2**32 - 1, no vocabulary size):
    the stream held -1294967296 for the id 3,000,000,000. Ids below 2**31 pass as they are."""
    import zlib

    from tokdyn.corpus import Document
    from tokdyn.data import training_stream

    class Hashing(_Ids):
        def encode(self, text):
            return np.array([zlib.crc32(w.encode()) for w in text.split()], np.int64)

    small = [w for w in ("a", "b", "c", "d", "e", "f") if zlib.crc32(w.encode()) < 2**31]
    large = next(w for w in ("a", "b", "c", "d", "e", "f") if zlib.crc32(w.encode()) >= 2**31)
    ids = [zlib.crc32(w.encode()) for w in small]
    assert training_stream([Document("k1", "d", " ".join(small))], Hashing(None, None)).tolist() == ids
    with pytest.raises(InputError, match=rf"^document 'k2': token ids \d+\.\.{zlib.crc32(large.encode())}, outside "
                                         r"\[0, 2147483648\) \(a training stream holds token ids as int32, below 2\*\*31\)$"):  # fmt: skip
        training_stream([Document("k1", "d", " ".join(small)), Document("k2", "d", f"{small[0]} {large}")], Hashing(None, None))


def test_a_tokenizer_of_float_ids_is_refused():
    """A tokenizer object whose encode gives floats: 1.7 was the id 1."""
    from tokdyn.corpus import Document
    from tokdyn.data import training_stream

    class Floats(_Ids):
        def encode(self, text):
            return np.array([1.7, 2.0])

    with pytest.raises(InputError, match=r"^document 'k': the tokenizer gives float64 values, not integer token ids"):
        training_stream([Document("k", "d", "ab")], Floats(10, None))


# == 4. random_batches' arguments ===================================================================


@settings(max_examples=100, deadline=None)
@given(extra=hs.integers(0, 5), context=hs.integers(1, 8), batch_size=hs.integers(1, 5), seed=hs.integers(0, 100))
def test_every_batch_row_is_a_window_of_the_stream(extra, context, batch_size, seed):
    """A stream of `context + 1 + extra` tokens, one window (extra 0) too: each row of a batch is
    `stream[a : a + context + 1]` for some start a (distinct ids make the start readable)."""
    from tokdyn.data import random_batches

    stream = np.arange(100, 100 + context + 1 + extra)
    batches = random_batches(stream, batch_size=batch_size, context=context, seed=seed)
    for _ in range(3):
        batch = next(batches)
        assert tuple(batch.shape) == (batch_size, context + 1) and batch.dtype == torch.int64
        for row in batch.tolist():
            a = row[0] - 100
            assert row == stream[a : a + context + 1].tolist()


@pytest.mark.parametrize("kw,match", [
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"), (dict(batch_size=2.5), "batch_size must be an integer"),
    (dict(context=0), "context must be an integer >= 1, got 0"), (dict(context=True), "context must be an integer"),
    (dict(stream=np.arange(12).reshape(3, 4)), "stream must be a 1-D integer array"),
    (dict(stream=np.arange(8.0)), "stream must be a 1-D integer array"),
    (dict(stream=np.arange(4)), "training stream of 4 tokens is shorter than one window of 5"),
])  # fmt: skip
def test_random_batches_refuses_what_it_cannot_batch_when_called(kw, match):
    """At the call, not at the first next(): a batch size of 0 gave empty batches (their mean loss NaN)."""
    from tokdyn.data import random_batches

    args = dict(stream=np.arange(8), batch_size=2, context=4) | kw
    with pytest.raises(InputError, match=re.escape(match)):
        random_batches(args.pop("stream"), **args)
