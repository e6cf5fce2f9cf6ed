"""Tokenizers: byte-level by default (nothing to download or train), or a HF ``tokenizers`` one.

Both expose ``encode(text) -> np.ndarray[int64]``, ``vocab_size``, ``eot_id`` (the id placed
between documents in the training stream) and ``spec()``, a JSON-able description stored with
every probe so that a store says which tokenizer produced its ids.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from .errors import InputError

__all__ = ["Tokenizer", "ByteTokenizer", "HFTokenizer", "get_tokenizer"]


class Tokenizer(Protocol):
    vocab_size: int
    eot_id: int

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def spec(self) -> dict: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, and 256 as end-of-text: ``vocab_size`` 257."""

    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def spec(self) -> dict:
        return {"kind": "byte", "vocab_size": self.vocab_size, "eot_id": self.eot_id}


class HFTokenizer:
    """A HuggingFace ``tokenizers.Tokenizer``, loaded from ``tokenizer.json`` or trained here."""

    EOT = "<|endoftext|>"

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        eot = tokenizer.token_to_id(self.EOT)
        if eot is None:
            raise InputError(f"tokenizer has no {self.EOT!r} token; add it as a special token")
        self.eot_id = int(eot)
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self._json = tokenizer.to_str()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "HFTokenizer":
        """Load a ``tokenizer.json`` (a file, or a folder holding one)."""
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
        if tok.token_to_id(cls.EOT) is None:
            tok.add_special_tokens([cls.EOT])
        return cls(tok)

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
        return cls(tok)

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(self._json, encoding="utf-8")

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

    def spec(self) -> dict:
        digest = hashlib.sha256(self._json.encode("utf-8")).hexdigest()
        return {"kind": "hf", "vocab_size": self.vocab_size, "eot_id": self.eot_id, "sha256": digest}


def get_tokenizer(name: str = "byte", *, path: str | os.PathLike | None = None) -> Tokenizer:
    """``"byte"`` (default) or ``"hf"`` with ``path`` to a ``tokenizer.json``."""
    if name == "byte":
        return ByteTokenizer()
    if name == "hf":
        if path is None:
            raise InputError("tokenizer 'hf' needs a path to a tokenizer.json")
        return HFTokenizer.from_file(path)
    raise InputError(f"unknown tokenizer {name!r}; expected 'byte' or 'hf'")


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise InputError("the 'tokenizers' package is needed: pip install 'tokdyn[hf]'") from None
    return tokenizers
