"""From documents to a training stream and a probe, split by document.

:func:`prepare_corpus` is the one call the pipelines make: read a text source, split its
documents deterministically into training and probe sides, tokenize, and return the training
token stream with the probe built from the held-out side.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .corpus import (Document, bin_documents, source_kind, iter_texts, jsonl_documents, relabel_documents, split_digest, split_documents, stdlib_documents,
                     stdlib_mixture_documents, text_documents)  # fmt: skip
from ._checks import check_count, is_finite
from .errors import InputError
from .probe import _ID_LIMIT, ProbeSet, build_probe, document_tokens  # _ID_LIMIT: ids are int32, in a probe as in a stream
from .tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, check_bpe_vocab

__all__ = ["Corpus", "prepare_corpus", "ProbeSplit", "prepare_probe", "training_copies", "resolve_tokenizer", "load_documents", "training_stream", "random_batches", "WindowDataset",
           "DomainCorpus", "prepare_domains", "split_by_domain", "MixtureDataset"]


@dataclass(frozen=True)
class Corpus:
    """A training stream and the probe held out from it."""

    train_tokens: np.ndarray  # int32 [T]: training documents joined by the end-of-text id
    probe: ProbeSet
    tokenizer: Tokenizer
    n_train_documents: int
    n_probe_documents: int


def load_documents(source: str = "stdlib", *, text_field: str = "text", domain_field: str | None = None,
                   bin_dtype: str | None = None, eot_id: int | None = None) -> list[Document]:  # fmt: skip
    """Documents from ``source``: ``"stdlib"`` (default), ``"stdlib-mix"`` (the mixture of
    domains, :func:`~tokdyn.corpus.stdlib_mixture_documents`), a ``.jsonl`` file (domain from
    ``domain_field``), a ``.bin`` token file (of ``bin_dtype``, by default uint16), or a text
    file / folder (domain = first sub-folder). ``text_field`` and ``domain_field`` name a
    ``.jsonl`` record's fields: given with another kind of source they would be ignored, so they
    are refused."""
    if source_kind(source) != "jsonl":
        for name, value, default in (("domain_field", domain_field, None), ("text_field", text_field, "text")):
            if value != default:
                raise InputError(f"{name}={value!r} applies to a .jsonl source only; {source!r} is not one (a folder's "
                                 "domain is its first sub-folder; relabel documents with mapping=)")  # fmt: skip
    if source in ("stdlib", "stdlib-mix"):
        if os.path.lexists(source):  # the user's own data under that name was read as the embedded corpus, unsaid
            kind = "folder" if os.path.isdir(source) else "file"
            warnings.warn(f"{source!r} is the embedded corpus (the Python standard library's own files); the {kind} "
                          f"./{source} is not read: give ./{source} to read it", stacklevel=2)  # fmt: skip
        return stdlib_documents() if source == "stdlib" else stdlib_mixture_documents()
    if not os.path.exists(source):
        raise InputError(f"corpus source not found: {source!r} (use 'stdlib', 'stdlib-mix', a folder, a text, .jsonl or .bin file)")
    if source_kind(source) == "jsonl":
        return jsonl_documents(source, text_field=text_field, domain_field=domain_field)
    if source_kind(source) == "bin":
        return bin_documents(source, dtype=bin_dtype or "uint16", eot_id=eot_id)
    return text_documents(source)


def training_stream(docs: Sequence[Document], tokenizer: Tokenizer) -> np.ndarray:
    """All documents' tokens joined by ``tokenizer.eot_id`` (a tokenizer without one: joined as
    they are), as int32.

    Every id must be an integer in ``[0, vocab_size)`` and below 2**31, checked before the cast:
    an id past int32 (a tokenizer of ids up to 2**32) wrapped to a negative one, a float id was
    cut to its integer part, and an id past the vocabulary (a ``.bin`` of another tokenizer's ids)
    reached the model. Otherwise one :class:`InputError` naming the first such document."""
    parts, owners = [], []  # owners: the document of each part, None for an end-of-text
    eot_id = getattr(tokenizer, "eot_id", None)
    eot = np.array([] if eot_id is None else [eot_id], np.int64)
    for d in docs:
        ids = np.asarray(document_tokens(d, tokenizer))
        parts.append(ids)
        owners.append(d)
        if not (len(ids) and ids[-1] == eot_id):  # a .bin document may end in its own
            parts.append(eot)
            owners.append(None)  # the tokenizer's end-of-text
    if not parts:
        raise InputError("no training documents")
    vocab = getattr(tokenizer, "vocab_size", None)
    top = min(vocab, _ID_LIMIT) if vocab is not None else _ID_LIMIT
    for ids, doc in zip(parts, owners):
        if ids.size and (ids.dtype.kind not in "iu" or int(ids.min()) < 0 or int(ids.max()) >= top):
            what = f"document {doc.key!r}" if doc is not None else f"the tokenizer's end-of-text id {eot_id}"
            if ids.dtype.kind not in "iu":
                raise InputError(f"{what}: the tokenizer gives {ids.dtype} values, not integer token ids; encode() must "
                                 "return integers")  # fmt: skip
            why = (f"the tokenizer's vocabulary of {vocab}" if top == vocab
                   else "a training stream holds token ids as int32, below 2**31")  # fmt: skip
            raise InputError(f"{what}: token ids {int(ids.min())}..{int(ids.max())}, outside [0, {top}) ({why})"
                             + ("; pre-tokenized documents (a .bin) need the tokenizer that made them"
                                if doc is not None and doc.tokens is not None else ""))  # fmt: skip
    return np.concatenate(parts).astype(np.int32)


# The ids a uint16 token can hold: 0 .. 65,535.
_UINT16_IDS = 1 << 16


def _check_bin_dtype(source: str, bin_dtype: str | None, tokenizer: Tokenizer) -> None:
    """:class:`InputError` for a token file read as uint16 by default with a tokenizer whose ids
    do not fit 16 bits (a vocabulary of more than 65,536: Llama 3's, Gemma's): a writer of its
    ids picks uint32 (or int32), and those read as uint16 are every id cut in two halves, which
    all pass the check against the vocabulary (no uint16 reaches it). Said before the file's
    tokens are used. A uint16 file of such a tokenizer is possible (a writer that picks the
    dtype by the largest id it wrote), so the dtype given by name is taken as it is: the file
    is then checked for halves of wider ids (:func:`~tokdyn.corpus.bin_documents`)."""
    vocab = getattr(tokenizer, "vocab_size", None)
    if source_kind(source) == "bin" and bin_dtype is None and vocab is not None and vocab > _UINT16_IDS:
        raise InputError(f"the tokenizer has {vocab:,} token ids, more than a uint16 token holds ({_UINT16_IDS:,}), the dtype "
                         f"a token file is read in by default; give the file's dtype: --bin-dtype uint32 (bin_dtype='uint32'), "
                         "or uint16 if the file really holds 16-bit ids")  # fmt: skip


def prepare_corpus(
    source: str = "stdlib",
    *,
    tokenizer: str | Tokenizer = "byte",
    vocab_size: int = 1024,
    context: int = 128,
    n_probe_sequences: int = 128,
    probe_fraction: float = 0.05,
    seed: int = 0,
    bin_dtype: str | None = None,
) -> Corpus:
    """Read ``source``, split by document, tokenize, and build the probe.

    ``tokenizer``: ``"byte"``, ``"bpe"`` (a byte-level BPE of ``vocab_size`` trained on the
    *training* documents only), a path to a ``tokenizer.json``, or a tokenizer object.
    ``bin_dtype``: the dtype of a ``.bin`` source (as :func:`prepare_probe`).
    """
    _check_probe_options(context=context, n_sequences=n_probe_sequences, probe_fraction=probe_fraction, seed=seed)
    _check_tokenizer_options(tokenizer, vocab_size)
    docs = load_documents(source, bin_dtype=bin_dtype)
    train_docs, probe_docs = split_documents(docs, probe_fraction=probe_fraction)
    tok = resolve_tokenizer(tokenizer, train_docs=train_docs, vocab_size=vocab_size)
    _check_bin_dtype(source, bin_dtype, tok)
    probe = build_probe(probe_docs, tok, context=context, n_sequences=n_probe_sequences, seed=seed)
    return Corpus(training_stream(train_docs, tok), probe, tok, len(train_docs), len(probe_docs))


def training_copies(train: Sequence[Document], probe: Sequence[Document]) -> list[str]:
    """The keys of the training documents whose text is that of a held-out document, in order: a
    file copied into two folders, a symlink to a file beside it, a repeated JSON line. The split is
    by key, so each copy lands on its own side; trained on, such a copy trains the probe's text.
    Leave them out of training: ``[d for d in train if d.key not in set(copies)]``."""
    import hashlib

    def digest(d: Document) -> bytes:
        return hashlib.sha256(d.text.encode("utf-8", "surrogatepass")).digest()

    held = {digest(d) for d in probe if d.text is not None}
    return [d.key for d in train if d.text is not None and digest(d) in held] if held else []


def _check_probe_options(*, context: int, n_sequences: int, probe_fraction: float, seed: int) -> None:
    """The probe's numbers, checked before the corpus is read (that can take minutes)."""
    for name, value, low in (("context", context, 1), ("n_sequences", n_sequences, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(probe_fraction, bool) or not isinstance(probe_fraction, (int, float, np.number)) or not 0.0 < probe_fraction < 1.0:
        raise InputError(f"probe_fraction must be in (0, 1), got {probe_fraction!r}")


def _check_tokenizer_options(tokenizer: str | Tokenizer, vocab_size: int) -> None:
    """A BPE's vocabulary size, checked before the corpus is read (as the probe's numbers)."""
    if isinstance(tokenizer, str) and tokenizer == "bpe":
        check_bpe_vocab(vocab_size)


def resolve_tokenizer(tokenizer: str | Tokenizer, *, train_docs: Sequence[Document] = (), vocab_size: int = 1024) -> Tokenizer:
    """``"byte"``, ``"bpe"`` (a byte-level BPE of ``vocab_size`` trained on ``train_docs``), a
    ``tokenizer.json`` or a local HF tokenizer folder holding one, or a tokenizer object."""
    if not isinstance(tokenizer, str):
        return tokenizer
    if tokenizer == "byte":
        return ByteTokenizer()
    if tokenizer == "bpe":
        if not train_docs:
            raise InputError("tokenizer 'bpe' is trained on the training documents; there are none")
        if all(d.text is None for d in train_docs):
            raise InputError("tokenizer 'bpe' is trained on the training documents' text; these are token ids (a .bin "
                             "source), already a tokenizer's: give that tokenizer")  # fmt: skip
        return HFTokenizer.train(iter_texts(train_docs), vocab_size=vocab_size)
    return HFTokenizer.from_file(tokenizer)


@dataclass(frozen=True)
class ProbeSplit:
    """A probe built from the held-out side of a split by document, and the two sides."""

    probe: ProbeSet
    tokenizer: Tokenizer
    train_documents: list[Document]
    probe_documents: list[Document]
    # keys of training documents whose text is a held-out document's (copies under another key):
    # leave them out of training too (:func:`training_copies`)
    train_copies: tuple[str, ...] = ()


def prepare_probe(
    source: str,
    *,
    tokenizer: str | Tokenizer = "byte",
    context: int = 128,
    n_sequences: int = 128,
    probe_fraction: float = 0.05,
    seed: int = 0,
    text_field: str = "text",
    domain_field: str | None = None,
    bin_dtype: str | None = None,
    eot_id: int | None = None,
    vocab_size: int = 1024,
) -> ProbeSplit:
    """The probe of ``source`` (see :func:`load_documents`): its documents split
    deterministically by document (:func:`~tokdyn.corpus.split_documents`), the probe cut from
    the held-out side only. Train on ``train_documents`` (the same split is reproduced by
    ``split_documents`` on the same keys), never on ``probe_documents``, nor on the training
    documents listed in ``train_copies`` (their text is a held-out document's).

    ``bin_dtype``: the dtype of a ``.bin`` source's tokens; by default uint16 (nanoGPT's), which
    is refused for a tokenizer of more than 65,536 ids (they need uint32: name the dtype). A
    probe document the tokenizer cannot encode is an :class:`InputError` naming it.
    ``vocab_size``: with ``tokenizer="bpe"``, the most ids the BPE trained on the training
    side may have (:func:`~tokdyn.tokenizer.check_bpe_vocab`)."""
    _check_probe_options(context=context, n_sequences=n_sequences, probe_fraction=probe_fraction, seed=seed)
    _check_tokenizer_options(tokenizer, vocab_size)
    docs = load_documents(source, text_field=text_field, domain_field=domain_field, bin_dtype=bin_dtype, eot_id=eot_id)
    train_docs, probe_docs = split_documents(docs, probe_fraction=probe_fraction)
    tok = resolve_tokenizer(tokenizer, train_docs=train_docs, vocab_size=vocab_size)
    _check_bin_dtype(source, bin_dtype, tok)
    probe = build_probe(probe_docs, tok, context=context, n_sequences=n_sequences, seed=seed)
    return ProbeSplit(probe, tok, train_docs, probe_docs, tuple(training_copies(train_docs, probe_docs)))


def random_batches(stream: np.ndarray, *, batch_size: int, context: int, seed: int = 0, device: str | torch.device = "cpu") -> Iterator[torch.Tensor]:
    """Endless batches ``[batch_size, context + 1]`` of random windows of ``stream``.

    ``batch_size`` and ``context`` are integers >= 1 (a batch size of 0 gave empty batches, whose
    mean loss is NaN), and ``stream`` a 1-D array of at least one window (a stream of exactly one
    was refused as "shorter than one window")."""
    batch_size, context = check_count("batch_size", batch_size), check_count("context", context)
    stream = np.asarray(stream)
    if stream.ndim != 1 or stream.dtype.kind not in "iu":
        raise InputError(f"stream must be a 1-D integer array of token ids, got {stream.dtype} {stream.shape}")
    if stream.size < context + 1:
        raise InputError(f"training stream of {stream.size} tokens is shorter than one window of {context + 1}")
    return _random_windows(stream, batch_size, context, seed, device)  # checked here, at the call, not at the first batch


def _random_windows(stream: np.ndarray, batch_size: int, context: int, seed: int, device) -> Iterator[torch.Tensor]:
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
        context = check_count("context", context)
        if stream.size < context + 1:
            raise InputError(f"training stream of {stream.size} tokens is shorter than one window of {context + 1}")
        self.stream = stream
        self.context = context

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


# -- corpora of labelled domains (the curriculum's mixture) ---------------------------------


@dataclass(frozen=True)
class DomainCorpus:
    """Per-domain training streams and held-out validation streams, split by document.

    ``train[k]`` and ``val[k]`` are int32 token streams of domain ``domains[k]`` (documents
    joined by the end-of-text id); no validation document is ever in a training stream.
    """

    domains: tuple[str, ...]
    train: tuple[np.ndarray, ...]
    val: tuple[np.ndarray, ...]
    tokenizer: Tokenizer
    n_documents: dict  # domain -> [training, validation] documents

    def val_windows(self, *, context: int, per_domain: int, offset: float = 0.0) -> np.ndarray:
        """``per_domain`` windows ``[C+1]`` of each domain's validation stream, spread evenly over
        it (non-overlapping while the stream is long enough): int64 ``[D, per_domain, C+1]``.
        ``offset`` (in [0, 1)) shifts every start by that share of the spacing: 0.5 gives the
        windows between those of 0 (another sample of the same held-out documents)."""
        context, per_domain = check_count("context", context), check_count("per_domain", per_domain)
        if not is_finite(offset) or not 0 <= offset < 1:
            raise InputError(f"offset must be a number in [0, 1) (a share of the spacing of the windows), got {offset!r}")
        out = np.empty((len(self.domains), per_domain, context + 1), np.int64)
        for k, stream in enumerate(self.val):
            n = stream.size - context
            if n < 1:
                raise InputError(f"domain {self.domains[k]!r}: validation stream of {stream.size} tokens is shorter than one window")
            step = (n - 1) / max(per_domain, 1)
            starts = np.clip(np.linspace(0, n - 1, per_domain) + offset * step, 0, n - 1).round().astype(np.int64)
            out[k] = stream[starts[:, None] + np.arange(context + 1)]
        return out


def split_by_domain(docs: Sequence[Document], *, val_fraction: float = 0.1, salt: str = "tokdyn") -> tuple[list[Document], list[Document]]:
    """Split documents into (train, validation) within each domain.

    In each domain the documents are ordered by a hash of ``salt`` and their key, and taken
    into validation until it holds ``val_fraction`` of the domain's characters (or tokens),
    at least one document, and never the last one: every domain with two or more documents has
    held-out text, and the split is the same on every machine. A domain with a single document
    is dropped from validation (it stays in training) -- split its text into documents first.
    """
    if not 0.0 < val_fraction < 1.0:
        raise InputError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if len({d.key for d in docs}) != len(docs):
        raise InputError("document keys must be unique to split deterministically")
    by: dict[str, list[Document]] = {}
    for d in docs:
        by.setdefault(d.domain, []).append(d)
    train, val = [], []
    for dom, group in by.items():
        size = lambda d: len(d.text) if d.text is not None else d.tokens.size  # noqa: E731
        total, held = sum(size(d) for d in group), 0
        order = sorted(group, key=lambda d: split_digest(salt, d.key))
        for i, d in enumerate(order):
            if i < len(order) - 1 and (i == 0 or held < val_fraction * total):
                val.append(d)
                held += size(d)
            else:
                train.append(d)
    return train, val


def prepare_domains(
    source: str | Sequence[Document] = "stdlib-mix",
    *,
    tokenizer: str | Tokenizer = "byte",
    vocab_size: int = 1024,
    val_fraction: float = 0.1,
    text_field: str = "text",
    domain_field: str | None = None,
    mapping=None,
    min_tokens: int = 1024,
    max_train_tokens: int | None = None,
) -> DomainCorpus:
    """Read ``source`` (as :func:`load_documents`, or a list of documents), label, split each
    domain by document into training and validation, tokenize.

    A ``.jsonl`` source needs ``domain_field`` (the record field naming each document's
    domain) or ``mapping``: without either every document would be labelled ``"default"``
    (:class:`InputError`, naming the records' string fields); ``domain_field`` and
    ``text_field`` apply to a ``.jsonl`` source only.
    ``mapping`` (dict key -> domain, or callable) relabels documents
    (:func:`~tokdyn.corpus.relabel_documents`). Domains with fewer than ``min_tokens`` training
    or validation tokens are left out, with the reason in ``n_documents``; an
    :class:`InputError` when none is left. ``max_train_tokens`` cuts each domain's training
    stream to that many tokens (small runs and tests).
    """
    _check_tokenizer_options(tokenizer, vocab_size)
    if max_train_tokens is not None:  # a float (1e5) was cut by int() at the first domain, after the tokenizer's training
        max_train_tokens = check_count("max_train_tokens", max_train_tokens)
    if isinstance(source, (str, os.PathLike)):
        source = os.fspath(source)
        _check_domain_source(source, text_field=text_field, domain_field=domain_field, mapping=mapping)
        docs = load_documents(source, text_field=text_field, domain_field=domain_field)
    else:
        if domain_field is not None:
            raise InputError(f"domain_field={domain_field!r} names the domain field of a .jsonl source; documents given "
                             "as a list carry their own domain (relabel them with mapping=)")  # fmt: skip
        docs = list(source)
    if mapping is not None:
        docs = relabel_documents(docs, mapping)
    train_docs, val_docs = split_by_domain(docs, val_fraction=val_fraction)
    tok = resolve_tokenizer(tokenizer, train_docs=train_docs, vocab_size=vocab_size)
    names = list(dict.fromkeys(d.domain for d in docs))
    domains, train, val, counts = [], [], [], {}
    for name in names:
        tr = [d for d in train_docs if d.domain == name]
        va = [d for d in val_docs if d.domain == name]
        if not tr or not va:
            counts[name] = {"train": len(tr), "val": len(va), "left_out": "needs documents on both sides"}
            continue
        a, b = training_stream(tr, tok), training_stream(va, tok)
        if max_train_tokens is not None:
            a = a[:max_train_tokens]
        if min(a.size, b.size) < min_tokens:
            counts[name] = {"train": len(tr), "val": len(va), "left_out": f"fewer than {min_tokens} tokens on one side"}
            continue
        domains.append(name)
        train.append(a)
        val.append(b)
        counts[name] = {"train": len(tr), "val": len(va), "train_tokens": int(a.size), "val_tokens": int(b.size)}
    if not domains:
        raise InputError(f"no domain has enough text for training and validation: {counts}")
    return DomainCorpus(tuple(domains), tuple(train), tuple(val), tok, counts)


def _check_domain_source(source: str, *, text_field: str, domain_field: str | None, mapping) -> None:
    """:class:`InputError` for a ``.jsonl`` source whose domains :func:`prepare_domains` would
    get wrong: without ``domain_field`` every document would be labelled ``"default"`` (a mixture
    of one domain, whatever the records say) unless ``mapping`` labels them. (``domain_field`` or
    ``text_field`` with another kind of source: :func:`load_documents` refuses them.)"""
    if source_kind(source) != "jsonl" or domain_field is not None or mapping is not None or not os.path.isfile(source):
        return  # a missing file is said by the reader
    fields = _string_fields(source, skip=text_field)
    hint = (f"the records have string fields {fields}: e.g. domain_field={fields[0]!r}" if fields
            else "the first records have no string field besides the text")  # fmt: skip
    raise InputError(f"{source}: a .jsonl source of a domain mixture needs domain_field= (the record field naming each "
                     f"document's domain; {hint}); without it every document would be labelled 'default', one domain. "
                     "To label the documents otherwise, give mapping= (a dict from key to domain, or a function)")  # fmt: skip


def _string_fields(path: str, *, skip: str, lines: int = 20) -> list[str]:
    """The fields holding a string in the first ``lines`` JSON records of ``path`` (for a message),
    those named like a domain first."""
    from ._files import loads_json

    found: dict[str, None] = {}
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as fh:
            for _, line in zip(range(lines), fh):
                try:
                    rec = loads_json(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    found.update((k, None) for k, v in rec.items() if k != skip and isinstance(v, str))
    except OSError:
        return []
    likely = ("domain", "source", "src", "category", "label", "subset", "dataset")
    return sorted(found, key=lambda k: (k.lower() not in likely, likely.index(k.lower()) if k.lower() in likely else 0))


class MixtureDataset(torch.utils.data.Dataset):
    """The training windows of every domain as one numbered pool.

    Sample ``i`` is a window ``[C+1]`` of one domain's training stream (numbered as
    :class:`WindowDataset` within the domain, domains one after another); ``domain_ids[i]`` is
    its domain's index (into ``domains``, the corpus's domain names), ``counts[k]`` the number
    of windows of domain ``k``. ``mixture_sampler(dataset, schedule, ...)`` matches the
    dataset's domains to the schedule's by name.
    """

    def __init__(self, corpus: DomainCorpus, *, context: int) -> None:
        self.domains = tuple(corpus.domains)
        self.context = check_count("context", context)
        self.parts = [WindowDataset(s, context=self.context) for s in corpus.train]
        self.counts = np.array([len(p) for p in self.parts], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])
        self.domain_ids = np.repeat(np.arange(len(self.parts)), self.counts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> torch.Tensor:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} windows")
        k = int(self.domain_ids[i])
        return self.parts[k][i - int(self.starts[k])]

    def batch(self, indices) -> torch.Tensor:
        """Samples ``indices`` stacked into ``[B, C+1]`` int64 (faster than a DataLoader)."""
        return torch.stack([self[int(i)] for i in indices])
