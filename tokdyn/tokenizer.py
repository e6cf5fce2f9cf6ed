"""Tokenizers: byte-level by default (nothing to download or train), or a HF ``tokenizers`` one.

Both expose ``encode(text) -> np.ndarray[int64]``, ``vocab_size``, ``eot_id`` (the id placed
between documents in the training stream, or None for a tokenizer without one) and ``spec()``, a
JSON-able description stored with every probe so that a store says which tokenizer produced its
ids. A user's tokenizer is taken as it is: nothing is added to it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from ._checks import is_int
from ._files import check_regular, loads_json, write_atomically
from .errors import InputError

__all__ = ["Tokenizer", "ByteTokenizer", "HFTokenizer", "get_tokenizer", "check_bpe_vocab"]

BPE_MIN_VOCAB = 300  # the 256 byte symbols, the end-of-text token, and room for merges
BPE_MAX_VOCAB = 2**31  # ids 0 .. 2**31 - 1: a probe stores them as int32


def check_bpe_vocab(vocab_size, name: str = "vocab_size") -> int:
    """``vocab_size`` for a byte-level BPE trained here, or an :class:`InputError` naming it as
    ``name`` (the CLI's option): a whole number from 300 (the 256 byte symbols and end-of-text,
    and room to merge) to 2**31 (ids a probe stores as int32). A corpus that offers fewer merges
    gives a smaller vocabulary: the number is a ceiling, as for the ``tokenizers`` trainer."""
    if not is_int(vocab_size):
        raise InputError(f"{name} must be a whole number of ids, got {vocab_size!r}")
    if not BPE_MIN_VOCAB <= vocab_size <= BPE_MAX_VOCAB:
        raise InputError(f"{name} must be from {BPE_MIN_VOCAB} (the 256 bytes, end-of-text and merges) to 2**31 "
                         f"(ids stored as int32) for byte-level BPE, got {vocab_size}")  # fmt: skip
    return int(vocab_size)


class Tokenizer(Protocol):
    vocab_size: int
    eot_id: int | None

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def spec(self) -> dict: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, and 256 as end-of-text: ``vocab_size`` 257."""

    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> np.ndarray:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _not_text(text, exc.start) from None
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def spec(self) -> dict:
        return {"kind": "byte", "vocab_size": self.vocab_size, "eot_id": self.eot_id}


class HFTokenizer:
    """A HuggingFace ``tokenizers.Tokenizer``, loaded from ``tokenizer.json`` or trained here.

    ``eot``: the end-of-text token placed between documents: its text (it must be in the
    vocabulary), ``"auto"`` (default: the first of :data:`EOT_CANDIDATES` the vocabulary has,
    else ``declared_eos``, the ``eos_token`` its HF folder declares, if the vocabulary has it,
    else none), or None (the tokenizer has none: documents are joined without a separator). The
    tokenizer itself is never changed; its truncation and padding (settings for batches of model
    inputs) are not applied, so every text is encoded whole, and neither is a sampled
    segmentation (a BPE's ``dropout``, a Unigram's ``alpha``: a regularization for training), so a
    text has one encoding, the same on every call.
    """

    EOT = "<|endoftext|>"
    EOT_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")

    def __init__(self, tokenizer, *, eot: str | None = "auto", declared_eos: str | None = None) -> None:
        # The tokenizer as given: its JSON is what the spec hashes, and what save() writes.
        self._json = tokenizer.to_str()
        if tokenizer.truncation is not None or tokenizer.padding is not None or _samples(tokenizer):
            # Settings for batches of model inputs, not part of the tokenization: applied to a
            # document, truncation would cut it (a document of 10,000 tokens kept to 512) and
            # padding would insert pad ids into the probe and the training stream. A sampled
            # segmentation (BPE dropout, Unigram sampling) drew other ids for the same text on
            # every call: a probe made twice was two probes (another fingerprint, refused by its
            # own store), and a model is measured on the tokenizer's one segmentation, as it is
            # evaluated. Encode with a copy without them; the caller's tokenizer is not changed
            # (nor the hash of its JSON, the spec's).
            tokenizer = type(tokenizer).from_str(self._json)  # a Unigram's alpha is not in the JSON
            tokenizer.no_truncation()
            tokenizer.no_padding()
            if _samples(tokenizer):
                tokenizer.model.dropout = None
        self._tok = tokenizer
        if eot == "auto":
            found = [t for t in self.EOT_CANDIDATES if tokenizer.token_to_id(t) is not None]
            if not found and declared_eos is not None and tokenizer.token_to_id(declared_eos) is not None:
                found = [declared_eos]  # the eos_token its HF folder declares ([EOS], <eod>, ...)
            eot = found[0] if found else None
        if eot is not None and tokenizer.token_to_id(eot) is None:
            raise InputError(f"the tokenizer has no token {eot!r} to use as end-of-text; name one it has, or none")
        self.eot = eot
        self.eot_id = None if eot is None else int(tokenizer.token_to_id(eot))
        # One past the largest id, not the number of tokens: a vocabulary may skip ids (a pruned or
        # merged one), and a model sized by the count would lack the ids past it.
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(int(tokenizer.get_vocab_size(with_added_tokens=True)), max(ids, default=-1) + 1)
        if self.vocab_size < 2:  # nothing to predict: a probe's spec refuses it later, after tokenizing everything
            raise InputError(f"the tokenizer has a vocabulary of {self.vocab_size} token(s); a language model needs at least 2: "
                             "give the tokenizer file your model was trained with (a trained tokenizer.json)")  # fmt: skip
        self.unk_id = _unk_id(tokenizer, self._json)

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, eot: str | None = "auto") -> "HFTokenizer":
        """Load a ``tokenizer.json`` (a file, or a folder holding one, such as a local HF
        tokenizer folder), as it is. With ``eot="auto"`` and none of :data:`EOT_CANDIDATES` in
        the vocabulary, the ``eos_token`` that the folder's ``tokenizer_config.json`` (or
        ``special_tokens_map.json``) declares is the end-of-text."""
        tokenizers = _import_tokenizers()
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
            if not os.path.lexists(p):  # a model folder with a slow tokenizer's files only
                slow = sorted(q.name for q in p.parent.glob("*") if q.name in _SLOW_FILES)
                raise InputError(f"{p.parent} holds no tokenizer.json" + (
                    f" (only {', '.join(slow)}, a slow tokenizer's files); {_WRITE_JSON.format(folder=p.parent)}" if slow
                    else " nor a slow tokenizer's files; give the tokenizer.json the model was trained with, or the folder that holds it"))  # fmt: skip
        elif (not os.path.lexists(p) and p.suffix.lower() not in (".json", ".model", ".txt") and _HUB_NAME.fullmatch(str(path))
              and not (len(p.parts) == 2 and os.path.isdir(p.parts[0]))):  # fmt: skip
            # `--tokenizer gpt2` or `EleutherAI/pythia-70m`, as transformers takes them (not a
            # mistyped folder in a folder that exists: `checkpoints/step33`)
            raise InputError(f"tokenizer file not found: {path} (nothing is downloaded: a Hugging Face Hub tokenizer is "
                             f"saved locally first, AutoTokenizer.from_pretrained({str(path)!r}).save_pretrained('DIR'), "
                             "and DIR given)")  # fmt: skip
        check_regular(p, "tokenizer file")  # a FIFO would block the read forever
        try:
            tok = tokenizers.Tokenizer.from_file(str(p))
        except Exception as exc:  # the Rust error says what is wrong with the file
            # a file of another kind (a tokenizer_config.json, a sentencepiece model) says how to get the right one
            other = "" if p.name == "tokenizer.json" else (
                "; it must be the tokenizers library's tokenizer.json (not a tokenizer_config.json, vocab.json or "
                f"sentencepiece .model): {_WRITE_JSON.format(folder=p.parent)}")  # fmt: skip
            raise InputError(f"cannot load tokenizer {p}: {exc}{other}") from None
        declared = None
        if eot == "auto" and not any(tok.token_to_id(t) is not None for t in cls.EOT_CANDIDATES):
            # the folder's configs are opened only where they decide the end-of-text
            declared = _declared_eos(p.parent)
        return cls(tok, eot=eot, declared_eos=declared)

    @classmethod
    def train(cls, texts: Iterable[str], *, vocab_size: int = 1024) -> "HFTokenizer":
        """Train a byte-level BPE tokenizer of at most ``vocab_size`` ids (:func:`check_bpe_vocab`)
        on ``texts`` (deterministic for a given corpus)."""
        vocab_size = check_bpe_vocab(vocab_size)
        tokenizers = _import_tokenizers()
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[cls.EOT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok, eot=cls.EOT)

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer's JSON to ``path`` (whole or not at all)."""
        write_atomically(path, lambda fh: fh.write(self._json), what="tokenizer")

    def encode(self, text: str) -> np.ndarray:
        # a lone surrogate is refused here: tokenizers raises a bare TypeError for one, and before
        # 0.20 encoded it without a word, as bytes that are no text
        if isinstance(text, str) and (bad := _LONE_SURROGATE.search(text)):
            raise _not_text(text, bad.start())
        try:
            ids = self._tok.encode(text).ids
        except TypeError:  # not a str
            raise
        except Exception as exc:  # noqa: BLE001 - the Rust error of a tokenizer that cannot encode this text
            # (a WordLevel vocabulary without its unk_token: "Missing [UNK] token from the vocabulary")
            raise InputError(f"the tokenizer cannot encode the text: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             " (is its unknown token in its vocabulary?)") from None  # fmt: skip
        return np.asarray(ids, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

    def added_per_document(self, texts: Iterable[str] = ()) -> tuple[list[str], list[str]]:
        """The special tokens the tokenizer's post-processor adds before and after the tokens of
        every text it encodes (``(["[CLS]"], ["[SEP]"])`` for a BERT template, ``(["<s>"], [])``
        for Llama's): they are part of every document, in the probe and in a training stream.

        Found by encoding a sample with and without them: the first of ``texts``, then of a few
        short words, that the tokenizer encodes to some tokens. Give text of the corpus: a closed
        vocabulary (a WordLevel one without its unknown token) encodes no other. A sample it
        cannot encode is passed over; when none is left, ``([], [])``: none is known to be added."""
        for sample in (*texts, "a b", "a", "0", "the"):
            try:
                bare = self._tok.encode(sample, add_special_tokens=False).ids
                full = self._tok.encode(sample).ids
            except Exception:  # noqa: BLE001 - the Rust error of a text it cannot encode: "Missing [UNK] token"
                continue
            # where the sample's own tokens lie in the full encoding (nowhere: it says nothing)
            k = next((k for k in range(len(full) - len(bare) + 1) if full[k : k + len(bare)] == bare), None) if bare else None
            if k is not None:
                name = self._tok.id_to_token
                return [name(i) for i in full[:k]], [name(i) for i in full[k + len(bare) :]]
        return [], []

    def spec(self) -> dict:
        digest = hashlib.sha256(self._json.encode("utf-8")).hexdigest()
        return {"kind": "hf", "vocab_size": self.vocab_size, "eot_id": self.eot_id, "eot": self.eot, "sha256": digest}


def get_tokenizer(name: str = "byte", *, path: str | os.PathLike | None = None) -> Tokenizer:
    """``"byte"`` (default) or ``"hf"`` with ``path`` to a ``tokenizer.json``."""
    if name == "byte":
        return ByteTokenizer()
    if name == "hf":
        if path is None:
            raise InputError("tokenizer 'hf' needs a path to a tokenizer.json")
        return HFTokenizer.from_file(path)
    raise InputError(f"unknown tokenizer {name!r}; expected 'byte' or 'hf'")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# What a folder saved with a slow (Python) tokenizer holds instead of a tokenizer.json.
_SLOW_FILES = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json", "merges.txt", "vocab.txt")
_WRITE_JSON = ("write a tokenizer.json with transformers, AutoTokenizer.from_pretrained('{folder}').save_pretrained('{folder}'), "
               "and give that")
# A Hugging Face Hub name (gpt2, EleutherAI/pythia-70m), which a path that does not exist may be.
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?")


def _unk_id(tokenizer, text: str) -> int | None:
    """The id of the tokenizer's unknown token, or None. BPE, WordPiece and WordLevel models name
    it (``unk_token``); a Unigram model gives only its id (``unk_id`` of its JSON)."""
    model = getattr(tokenizer, "model", None)
    unk = getattr(model, "unk_token", None)
    if isinstance(unk, str):
        return tokenizer.token_to_id(unk)
    if type(model).__name__ == "Unigram":
        unk_id = loads_json(text).get("model", {}).get("unk_id")
        return unk_id if isinstance(unk_id, int) and not isinstance(unk_id, bool) else None
    return None


def _samples(tokenizer) -> bool:
    """Whether the tokenizer's model samples its segmentation: BPE dropout, or a Unigram's sampling
    (``alpha``, set on a model in memory: its JSON does not keep it)."""
    model = getattr(tokenizer, "model", None)
    return bool(getattr(model, "dropout", None)) or bool(getattr(model, "alpha", None))


def _declared_eos(folder: Path) -> str | None:
    """The ``eos_token`` a Hugging Face tokenizer folder declares (``tokenizer_config.json``, else
    ``special_tokens_map.json``: a string, or an added token ``{"content": ...}``), or None. A
    config there that is not a regular file (a FIFO: the read would block forever) is an
    :class:`InputError`."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if not os.path.exists(path):  # absent (or a broken link): nothing declared there
            continue
        check_regular(path, "tokenizer config", "; give a regular file, or name the end-of-text token (--eot TOKEN, eot=)",
                      readable=False)  # unreadable: nothing declared there (below)
        try:
            config = loads_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # unreadable, or not a config: nothing declared there
            continue
        eos = config.get("eos_token") if isinstance(config, dict) else None
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and eos:
            return eos
    return None


def _not_text(text: str, at: int) -> InputError:
    """A lone surrogate (from a JSON escape such as "\\ud800") is not text any encoding writes."""
    return InputError(
        f"text holds a lone surrogate U+{ord(text[at]):04X} at character {at}, which is not valid Unicode; "
        "replace it (tokdyn's own readers put U+FFFD there)"
    )


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise InputError("the 'tokenizers' package is needed: pip install 'tokdyn[hf]'") from None
    return tokenizers
