"""From documents to a training stream and a probe, split by document.

:func:`prepare_corpus` is the one call the pipelines make: read a text source, split its
documents deterministically into training and probe sides, tokenize, and return the training
token stream with the probe built from the held-out side.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .corpus import Document, bin_documents, iter_texts, jsonl_documents, split_documents, stdlib_documents, text_documents
from .errors import InputError
from .probe import ProbeSet, build_probe
from .tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = ["Corpus", "prepare_corpus", "load_documents", "training_stream", "random_batches", "WindowDataset"]


@dataclass(frozen=True)
class Corpus:
    """A training stream and the probe held out from it."""

    train_tokens: np.ndarray  # int32 [T]: training documents joined by the end-of-text id
    probe: ProbeSet
    tokenizer: Tokenizer
    n_train_documents: int
    n_probe_documents: int


def load_documents(source: str = "stdlib", *, text_field: str = "text", bin_dtype: str = "uint16", eot_id: int | None = None) -> list[Document]:
    """Documents from ``source``: ``"stdlib"`` (default), a ``.jsonl`` file, a ``.bin`` token
    file, or a text file / folder."""
    if source == "stdlib":
        return stdlib_documents()
    if not os.path.exists(source):
        raise InputError(f"corpus source not found: {source!r} (use 'stdlib', a folder, a text, .jsonl or .bin file)")
    if source.endswith(".jsonl"):
        return jsonl_documents(source, text_field=text_field)
    if source.endswith(".bin"):
        return bin_documents(source, dtype=bin_dtype, eot_id=eot_id)
    return text_documents(source)


def training_stream(docs: Sequence[Document], tokenizer: Tokenizer) -> np.ndarray:
    """All documents' tokens joined by ``tokenizer.eot_id``, as int32."""
    parts = []
    eot = np.array([tokenizer.eot_id], np.int64)
    for d in docs:
        ids = d.tokens if d.tokens is not None else tokenizer.encode(d.text)
        parts.append(ids)
        if not (len(ids) and ids[-1] == tokenizer.eot_id):  # a .bin document may end in its own
            parts.append(eot)
    if not parts:
        raise InputError("no training documents")
    return np.concatenate(parts).astype(np.int32)


def prepare_corpus(
    source: str = "stdlib",
    *,
    tokenizer: str | Tokenizer = "byte",
    vocab_size: int = 1024,
    context: int = 128,
    n_probe_sequences: int = 128,
    probe_fraction: float = 0.05,
    seed: int = 0,
) -> Corpus:
    """Read ``source``, split by document, tokenize, and build the probe.

    ``tokenizer``: ``"byte"``, ``"bpe"`` (a byte-level BPE of ``vocab_size`` trained on the
    *training* documents only), a path to a ``tokenizer.json``, or a tokenizer object.
    """
    docs = load_documents(source)
    train_docs, probe_docs = split_documents(docs, probe_fraction=probe_fraction)
    if isinstance(tokenizer, str):
        if tokenizer == "byte":
            tok: Tokenizer = ByteTokenizer()
        elif tokenizer == "bpe":
            tok = HFTokenizer.train(iter_texts(train_docs), vocab_size=vocab_size)
        else:
            tok = HFTokenizer.from_file(tokenizer)
    else:
        tok = tokenizer
    probe = build_probe(probe_docs, tok, context=context, n_sequences=n_probe_sequences, seed=seed)
    return Corpus(training_stream(train_docs, tok), probe, tok, len(train_docs), len(probe_docs))


def random_batches(stream: np.ndarray, *, batch_size: int, context: int, seed: int = 0, device: str | torch.device = "cpu") -> Iterator[torch.Tensor]:
    """Endless batches ``[batch_size, context + 1]`` of random windows of ``stream``."""
    if stream.ndim != 1 or stream.size < context + 2:
        raise InputError(f"training stream of {stream.size} tokens is shorter than one window of {context + 1}")
    data = torch.from_numpy(stream.astype(np.int64))
    g = torch.Generator().manual_seed(seed)
    offs = torch.arange(context + 1)
    while True:
        starts = torch.randint(0, data.numel() - context, (batch_size,), generator=g)  # the last window too
        yield data[starts[:, None] + offs].to(device, non_blocking=True)


class WindowDataset(torch.utils.data.Dataset):
    """The training stream as numbered samples: window ``i`` is ``stream[i*C : i*C + C + 1]``.

    Windows of ``C + 1`` tokens overlap by one token (the last target of one window is the first
    input of the next), so every token after the first is a target of exactly one window. This
    is what a sampler over training samples draws from (``tokdyn.curriculum``); items are int64
    tensors ``[C+1]``, which a ``DataLoader`` stacks into batches ``[B, C+1]``.
    """

    def __init__(self, stream: np.ndarray, *, context: int) -> None:
        stream = np.asarray(stream)
        if stream.ndim != 1 or stream.dtype.kind not in "iu":
            raise InputError(f"stream must be a 1-D integer array of token ids, got {stream.dtype} {stream.shape}")
        if int(context) < 1:
            raise InputError(f"context must be >= 1, got {context}")
        if stream.size < context + 1:
            raise InputError(f"training stream of {stream.size} tokens is shorter than one window of {context + 1}")
        self.stream = stream
        self.context = int(context)

    def __len__(self) -> int:
        return (self.stream.size - 1) // self.context

    def windows(self) -> np.ndarray:
        """All windows as a read-only view ``[len(self), C+1]`` of the stream (no copy)."""
        view = np.lib.stride_tricks.sliding_window_view(self.stream, self.context + 1)[:: self.context]
        return view[: len(self)]

    def __getitem__(self, i: int) -> torch.Tensor:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} out of range for {len(self)} windows")
        a = i * self.context
        return torch.from_numpy(self.stream[a : a + self.context + 1].astype(np.int64))
