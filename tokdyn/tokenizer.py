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

from .errors import InputError

__all__ = ["Tokenizer", "ByteTokenizer", "HFTokenizer", "get_tokenizer"]


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
    vocabulary), ``"auto"`` (default: the first of :data:`EOT_CANDIDATES` the vocabulary has, or
    none), or None (the tokenizer has none: documents are joined without a separator). The
    tokenizer itself is never changed.
    """

    EOT = "<|endoftext|>"
    EOT_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")

    def __init__(self, tokenizer, *, eot: str | None = "auto") -> None:
        self._tok = tokenizer
        if eot == "auto":
            found = [t for t in self.EOT_CANDIDATES if tokenizer.token_to_id(t) is not None]
            eot = found[0] if found else None
        if eot is not None and tokenizer.token_to_id(eot) is None:
            raise InputError(f"the tokenizer has no token {eot!r} to use as end-of-text; name one it has, or none")
        self.eot = eot
        self.eot_id = None if eot is None else int(tokenizer.token_to_id(eot))
        # One past the largest id, not the number of tokens: a vocabulary may skip ids (a pruned or
        # merged one), and a model sized by the count would lack the ids past it.
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(int(tokenizer.get_vocab_size(with_added_tokens=True)), max(ids, default=-1) + 1)
        self._json = tokenizer.to_str()
        unk = getattr(getattr(tokenizer, "model", None), "unk_token", None)  # WordLevel, WordPiece, BPE(unk_token=)
        self.unk_id = None if not isinstance(unk, str) else tokenizer.token_to_id(unk)

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, eot: str | None = "auto") -> "HFTokenizer":
        """Load a ``tokenizer.json`` (a file, or a folder holding one, such as a local HF
        tokenizer folder), as it is."""
        tokenizers = _import_tokenizers()
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise InputError(f"tokenizer file not found: {p}")
        try:
            tok = tokenizers.Tokenizer.from_file(str(p))
        except Exception as exc:  # the Rust error says what is wrong with the file
            raise InputError(f"cannot load tokenizer {p}: {exc}") from None
        return cls(tok, eot=eot)

    @classmethod
    def train(cls, texts: Iterable[str], *, vocab_size: int = 1024) -> "HFTokenizer":
        """Train a byte-level BPE tokenizer on ``texts`` (deterministic for a given corpus)."""
        if vocab_size < 300:
            raise InputError(f"vocab_size must be >= 300 for byte-level BPE, got {vocab_size}")
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
        Path(path).write_text(self._json, encoding="utf-8")

    def encode(self, text: str) -> np.ndarray:
        try:
            ids = self._tok.encode(text).ids
        except TypeError:  # what tokenizers raises for a str it cannot encode (a lone surrogate)
            if isinstance(text, str) and (bad := _LONE_SURROGATE.search(text)):
                raise _not_text(text, bad.start()) from None
            raise
        return np.asarray(ids, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

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
