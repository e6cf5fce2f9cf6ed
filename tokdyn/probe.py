"""Probe sets: the fixed, held-out sequences whose every token's loss tokdyn tracks.

A probe holds token ids ``tokens [S, C+1]``; sequence ``s`` contributes the ``C``
*contextualized tokens* ``tokens[s, 1:]``, each predicted from the tokens before it (position 0
has no context and is excluded). Contextualized tokens are numbered row-major: token
``i = s * C + (p - 1)`` is position ``p`` (1..C) of sequence ``s``. Per token the probe keeps
``sample_id``, ``token_pos``, ``token_id`` (the target), ``doc_id``, ``doc_pos`` and ``domain``.

A probe imported from a ``losses.npz`` has no token ids (``tokens is None``): it is defined by
its per-token arrays alone. Either kind has a :attr:`ProbeSet.fingerprint`, a hash of its
content, stored in every store that uses it.

The reserved arrays ``sample_id``, ``token_pos`` and ``token_id`` are numbers every analysis
relies on, so every probe is checked when it is made (:func:`check_token_arrays`: from token
ids, from a ``losses.npz``, or read back from a store): integers of any width (floats only when
every value is a whole number; booleans and strings never), at least 0, one per token, and a
``token_id`` below the tokenizer's vocabulary size when the probe's tokenizer spec gives one.
Whole-number floats are kept as they are (not converted), so a probe's fingerprint is that of
its data.

A new probe's names are checked too (:func:`check_probe_names`): its domain names must be
distinct, and no per-token array may take a name a ``losses.npz`` keeps for its own members
(:data:`NPZ_MEMBERS`). A probe read back from a store is not held to these (``stored=True``): a
store written before they were checked still opens.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from functools import cached_property

import numpy as np

from .corpus import Document
from ._checks import as_array, check_count
from .errors import InputError
from .tokenizer import Tokenizer

__all__ = ["ProbeSet", "build_probe", "document_tokens", "check_token_arrays", "check_probe_names", "vocab_size_of", "RESERVED_TOKEN_ARRAYS",
           "NPZ_MEMBERS"]

_TOKEN_FIELDS = ("sample_id", "token_pos", "token_id", "doc_id", "doc_pos", "domain")

#: Per-token arrays whose values tokdyn reads as numbers (sequence, position, token id).
RESERVED_TOKEN_ARRAYS = ("sample_id", "token_pos", "token_id")
#: Names a ``losses.npz`` keeps for its own members (:mod:`tokdyn.interchange`): a per-token array
#: of one of these names would overwrite the member on export, so a new probe may not have one.
NPZ_MEMBERS = ("axis_values", "loss_matrix", "axis_name", "probe_tokens", "probe_domains", "probe_documents", "probe_tokenizer")
_ID_LIMIT = 2**31  # token ids are int32 (probe tokens are stored that way)
_INDEX_LIMIT = 2**63  # sample_id and token_pos are read as int64
_UNK_WARN = 0.1  # a probe with more unknown tokens than this is warned about


def vocab_size_of(tokenizer: Mapping | None) -> int | None:
    """The vocabulary size a tokenizer spec gives (an integer >= 2), else None (unknown).

    :class:`ProbeSet` refuses a spec whose ``vocab_size`` is anything else (the fit reads it)."""
    v = tokenizer.get("vocab_size") if isinstance(tokenizer, Mapping) else None
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= 2 else None


def check_token_arrays(arrays: Mapping[str, np.ndarray], n: int, *, vocab_size: int | None = None,
                       what: str = "probe array") -> None:  # fmt: skip
    """Check the reserved per-token arrays (:data:`RESERVED_TOKEN_ARRAYS`) present in ``arrays``.

    Each must be 1-d of length ``n``, of an integer dtype (any width, signed or not; a float
    dtype only if every value is finite and a whole number; booleans and strings are refused),
    with values ``>= 0`` and below 2**63 (``sample_id``, ``token_pos``) or below ``vocab_size``
    when known, else 2**31 (``token_id``). Raises one :class:`InputError` naming the array
    (prefixed by ``what``), what was expected and what was found.
    """
    for name in RESERVED_TOKEN_ARRAYS:
        if name not in arrays:
            continue
        v = np.asarray(arrays[name])
        is_id = name == "token_id"
        limit = (vocab_size if vocab_size is not None else _ID_LIMIT) if is_id else _INDEX_LIMIT
        bound = f"below the vocabulary size {vocab_size}" if is_id and vocab_size is not None else f"below 2**{limit.bit_length() - 1}"
        expected = f"{what} {name!r} must hold one integer per token, >= 0 and {bound}"
        if v.shape != (n,):
            raise InputError(f"{expected}; got shape {v.shape}, expected ({n},)")
        _check_whole(v, expected, limit)


def check_probe_names(arrays: Mapping[str, np.ndarray], domains: Sequence[str]) -> None:
    """Check the names of a new probe: no per-token array named as a ``losses.npz`` member
    (:data:`NPZ_MEMBERS`), and domain names that are distinct (each names one group of tokens).
    Raises one :class:`InputError` naming the offending names."""
    clash = [name for name in arrays if name in NPZ_MEMBERS]
    if clash:
        raise InputError(f"probe per-token array(s) {clash} take names a losses.npz keeps for its own members "
                         f"({', '.join(NPZ_MEMBERS)}); rename them")  # fmt: skip
    seen, repeated = set(), []
    for d in domains:
        if d in seen and d not in repeated:
            repeated.append(d)
        seen.add(d)
    if repeated:
        raise InputError(f"probe domain names must be distinct (each names one group of tokens); "
                         f"{', '.join(map(repr, repeated))} given more than once")  # fmt: skip


def _num(x: int | float) -> str:
    return repr(x) if isinstance(x, float) else str(x)


def _array(name: str, value) -> np.ndarray:
    """``np.asarray(value)``, with a ragged or unconvertible input, and a masked array with masked
    values (their data were taken as ids), as one :class:`InputError` (:func:`tokdyn._checks.as_array`)."""
    if isinstance(value, np.ma.MaskedArray):
        value = as_array(name, value, None, "an array of numbers")
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:  # a ragged list: "setting an array element with a sequence ..."
        raise InputError(f"{name} must be an array of numbers; {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def _check_ids(tokens, vocab: int | None) -> np.ndarray:
    """Probe token windows ``[S, C+1]`` of integer ids in ``[0, min(vocab, 2**31))``, as given
    (not cast): one :class:`InputError` otherwise, naming the limit that is passed.

    Probe ids are stored as int32 (docs/store.md), so a vocabulary of 2**31 or more is usable as
    long as the probe's own ids lie below 2**31; a larger id is refused here, before a cast could
    wrap it to a negative one."""
    t = _array("probe tokens", tokens)
    if t.ndim != 2 or t.shape[1] < 2 or t.dtype.kind not in "iu":
        raise InputError(f"probe tokens must be integers [S, C+1] with C >= 1, got {t.dtype} {t.shape}")
    if t.size == 0:
        return t  # no sequence: "probe has no tokens", said by ProbeSet
    lo, hi, top = int(t.min()), int(t.max()), min(vocab or _ID_LIMIT, _ID_LIMIT)
    if lo < 0 or hi >= top:
        why = ("the tokenizer vocabulary" if top == vocab else "tokdyn stores token ids as int32"
               + (f": a vocabulary of {vocab} is usable for ids below 2**31 only" if vocab is not None else ""))  # fmt: skip
        raise InputError(f"probe tokens must be ids in [0, {top}) ({why}), got ids {lo}..{hi}")
    return t


def _per_sequence(name: str, value, s: int, limit: int, dtype) -> np.ndarray:
    """One whole number per sequence in ``[0, limit)`` as ``dtype`` (zeros when ``value`` is None);
    whole-number floats are taken, booleans, strings and fractions refused, and nothing wraps."""
    if value is None:
        return np.zeros(s, dtype)
    v = _array(name, value)
    expected = f"{name} must hold one whole number per sequence, >= 0 and below {_bound(limit)}"
    if v.shape != (s,):
        raise InputError(f"{expected}; got shape {v.shape}, expected ({s},)")
    _check_whole(v, expected, limit)
    return v.astype(dtype)


def _check_whole(v: np.ndarray, expected: str, limit: int) -> None:
    """One :class:`InputError`, ``expected`` and what was found, unless ``v`` holds whole numbers
    in ``[0, limit)``: any integer dtype, or a float one whose values are finite and whole
    (booleans, strings and objects refused)."""
    if v.dtype.kind not in "iuf":
        kind = {"b": "booleans", "U": "strings", "S": "byte strings", "O": "objects"}.get(v.dtype.kind, "values")
        raise InputError(f"{expected}; got {kind} (dtype {v.dtype})")
    if v.size == 0:
        return
    if v.dtype.kind == "f":
        bad = ~np.isfinite(v)
        if bad.any():
            raise InputError(f"{expected}; got non-finite {v.dtype} values ({_num(float(v[bad][0]))})")
        frac = v != np.floor(v)
        if frac.any():
            raise InputError(f"{expected}; got {v.dtype} values that are not whole numbers (e.g. {_num(float(v[frac][0]))})")
        lo, hi = float(v.min()), float(v.max())
    else:
        lo, hi = int(v.min()), int(v.max())
    if lo < 0:
        raise InputError(f"{expected}; got negative values (down to {_num(lo)})")
    if hi >= limit:
        raise InputError(f"{expected}; got values up to {_num(hi)}")


# What to do with document indices past the document keys a probe names (a file of another
# probe's keys; a store written before they were checked exports such a file).
DOC_ID_FIX = ("give a key for every document the doc_id values index (probe_documents), or leave the keys out (doc_id is "
              "then a label)")


def _check_index(v: np.ndarray | None, name: str, names: Sequence[str], what: str, *, whole_floats: bool = False,
                 fix: str = "") -> None:
    """One :class:`InputError` unless the probe array ``name`` (``v``, None when the probe has
    none) holds integer indices into ``names`` (``what`` they are, for the message; ``fix`` what
    to do, appended), whole-number floats too where ``whole_floats`` (as a document index was
    taken before it was checked); anything goes when ``names`` is empty."""
    if v is None or not len(names) or not v.size:
        return
    if whole_floats and v.dtype.kind == "f":
        _check_whole(v, f"probe array {name!r} indexes {len(names)} {what}: it must hold whole numbers", 2**63)
    elif v.dtype.kind not in "iu":
        raise InputError(f"probe array {name!r} indexes {len(names)} {what}; expected integers, got {v.dtype}")
    lo, hi = int(v.min()), int(v.max())
    if lo < 0 or hi >= len(names):
        raise InputError(f"probe array {name!r} holds indices {lo}..{hi}, but there are {len(names)} {what} "
                         f"(indices 0..{len(names) - 1}){fix}")  # fmt: skip


def _bound(limit: int) -> str:
    """``2**31`` for a power of two, else the number (``2**63 - 64`` for a limit just below one)."""
    b = limit.bit_length()
    if limit == 1 << (b - 1):
        return f"2**{b - 1}"
    return f"2**{b} - {(1 << b) - limit}" if (1 << b) - limit < 1 << 20 else str(limit)


def _names(what: str, names) -> tuple[str, ...]:
    """Domain names or document keys as a tuple of strings: a single string (which ``tuple``
    would split into its characters: domains ``("d", "e", "f", ...)``) or a non-string name is
    one :class:`InputError`."""
    if isinstance(names, (str, bytes)):
        raise InputError(f"{what} must be a sequence of names, got the single string {names!r} (give [{names!r}])")
    try:
        out = tuple(names)
    except TypeError:
        raise InputError(f"{what} must be a sequence of names, got {type(names).__name__}") from None
    bad = [x for x in out if not isinstance(x, str)]
    if bad:
        raise InputError(f"{what} must be strings, got {bad[0]!r} ({type(bad[0]).__name__})")
    return out


@dataclass(frozen=True, eq=False)
class ProbeSet:
    """A fixed probe set. Build one with :func:`build_probe` or :meth:`from_tokens`.

    Attributes
    ----------
    tokens : int32 [S, C+1] or None
        Token ids of each probe sequence; None for an index-only (imported) probe.
    token_arrays : dict of [N] arrays
        Per contextualized token: ``sample_id``, ``token_pos`` and, where known, ``token_id``,
        ``doc_id``, ``doc_pos``, ``domain`` (an index into ``domains``) and any extra arrays.
    domains : tuple of str
        Domain names, indexed by ``token_arrays["domain"]``.
    documents : tuple of str
        Document keys, indexed by ``token_arrays["doc_id"]``.
    tokenizer : dict
        The tokenizer's ``spec()``; ``{}`` when unknown.
    stored : bool, keyword only
        True for a probe read back from a store: its names are not checked again
        (:func:`check_probe_names`), so a store written before that check still opens.
    """

    tokens: np.ndarray | None
    token_arrays: Mapping[str, np.ndarray]
    domains: tuple[str, ...] = ()
    documents: tuple[str, ...] = ()
    tokenizer: Mapping = field(default_factory=dict)
    stored: InitVar[bool] = field(default=False, kw_only=True)

    def __post_init__(self, stored: bool) -> None:
        arrays = {}
        for k, v in self.token_arrays.items():
            v = as_array(f"probe array {k!r}", v, None, "one value per token")  # a masked value's data was the probe's
            # native byte order: zarr hands arrays back that way, and the fingerprint hashes dtypes
            arrays[k] = v.astype(v.dtype.newbyteorder("=")) if v.dtype.byteorder not in "=|" else v
        for name in ("sample_id", "token_pos"):
            if name not in arrays:
                raise InputError(f"probe needs a per-token array {name!r}")
        n = arrays["sample_id"].shape
        for k, v in arrays.items():
            if v.ndim != 1 or v.shape != n:
                raise InputError(f"probe array {k!r} has shape {v.shape}; expected {n} like sample_id")
            if v.dtype.kind not in "iufbU":
                raise InputError(f"probe array {k!r} has dtype {v.dtype}; expected numbers, booleans or strings")
        if n[0] == 0:
            raise InputError("probe has no tokens")
        domains, documents = (tuple(self.domains), tuple(self.documents)) if stored \
            else (_names("domains", self.domains), _names("documents", self.documents))  # fmt: skip
        if not stored:
            check_probe_names(arrays, domains)
        tokenizer = {} if self.tokenizer is None else self.tokenizer
        if not isinstance(tokenizer, Mapping):
            raise InputError(f"probe tokenizer must be a tokenizer spec (a dict), got {type(tokenizer).__name__}")
        vocab = vocab_size_of(tokenizer)
        if tokenizer.get("vocab_size") is not None and vocab is None:  # the fit's age of acquisition reads it
            raise InputError(f"probe tokenizer spec: vocab_size must be an integer >= 2, got {tokenizer['vocab_size']!r}")
        t = None
        if self.tokens is not None:  # first: an id past int32 is named as such, not as the negative token_id it wrapped to
            t = _check_ids(self.tokens, vocab)
            if t.shape[0] * (t.shape[1] - 1) != n[0]:
                raise InputError(f"probe tokens {t.shape} give {t.shape[0] * (t.shape[1] - 1)} targets, arrays have {n[0]}")
        check_token_arrays(arrays, n[0], vocab_size=vocab)
        if t is not None and not stored:  # token i is position i % C + 1 of sequence i // C, whose target is tokens[s, p]
            c = t.shape[1] - 1
            layout = {"sample_id": lambda: np.arange(n[0]) // c, "token_pos": lambda: np.arange(n[0]) % c + 1,
                      "token_id": lambda: t[:, 1:].reshape(-1)}  # fmt: skip
            for name, want in layout.items():
                if name in arrays and not np.array_equal(arrays[name], want()):
                    raise InputError(f"probe array {name!r} does not match the probe tokens (token i is position i % C + 1 "
                                     f"of sequence i // C, and its id tokens[i // C, i % C + 1])")  # fmt: skip
        # domain indexes the domain names, doc_id the document keys, where the probe names them:
        # out of range, a token's domain would be no group or another's (silently), its document
        # none or another's. (Unnamed, they are labels only: unchecked.) A stored probe's doc_id
        # is not held to it, so a store written before it was checked still opens.
        _check_index(arrays.get("domain"), "domain", domains, "names")
        if not stored:
            _check_index(arrays.get("doc_id"), "doc_id", documents, "document keys", whole_floats=True,
                         fix=f"; {DOC_ID_FIX}")  # fmt: skip
        if t is not None:
            object.__setattr__(self, "tokens", t.astype(np.int32, copy=False))  # checked: every id fits
        object.__setattr__(self, "token_arrays", arrays)
        object.__setattr__(self, "domains", domains)
        object.__setattr__(self, "documents", documents)
        object.__setattr__(self, "tokenizer", dict(tokenizer))

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_tokens(
        cls,
        tokens: np.ndarray,
        *,
        doc_id: np.ndarray | None = None,
        doc_offset: np.ndarray | None = None,
        domain: np.ndarray | None = None,
        domains: Sequence[str] = ("default",),
        documents: Sequence[str] = (),
        tokenizer: Mapping | None = None,
    ) -> "ProbeSet":
        """A probe from token windows ``[S, C+1]`` and per-sequence document info ``[S]``.

        Every value is checked before it is cast to its stored dtype (docs/store.md, "Probe"), so
        none wraps: token ids in ``[0, 2**31)`` (and below the tokenizer's ``vocab_size``),
        ``doc_id`` and ``domain`` whole numbers in ``[0, 2**31)``, ``doc_offset`` whole numbers
        >= 0 whose positions ``doc_offset + C`` stay below 2**63. ``domains`` and ``documents`` are
        sequences of names (a single string is refused, not split into characters).
        """
        spec = {} if tokenizer is None else tokenizer
        t = _check_ids(tokens, vocab_size_of(spec))  # before any cast: an id of 2**31 wrapped to a negative one
        s, c = t.shape[0], t.shape[1] - 1
        pos = np.arange(1, c + 1, dtype=np.int32)
        doc_id = _per_sequence("doc_id", doc_id, s, _ID_LIMIT, np.int32)
        doc_offset = _per_sequence("doc_offset", doc_offset, s, _INDEX_LIMIT - c, np.int64)  # doc_pos = offset + p < 2**63
        domain = _per_sequence("domain", domain, s, _ID_LIMIT, np.int32)
        arrays = {
            "sample_id": np.repeat(np.arange(s, dtype=np.int32), c),
            "token_pos": np.tile(pos, s),
            "token_id": t[:, 1:].reshape(-1).astype(np.int32),
            "doc_id": np.repeat(doc_id, c),
            "doc_pos": (doc_offset[:, None] + pos[None, :]).reshape(-1),
            "domain": np.repeat(domain, c),
        }
        return cls(t, arrays, domains=_names("domains", domains), documents=_names("documents", documents), tokenizer=spec)

    # -- shape ----------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Number of contextualized tokens ``N``."""
        return int(self.token_arrays["sample_id"].shape[0])

    @property
    def n_sequences(self) -> int:
        if self.tokens is None:
            return int(np.unique(self.token_arrays["sample_id"]).size)
        return int(self.tokens.shape[0])

    @property
    def context(self) -> int | None:
        """Context length ``C`` (targets per sequence); None for an index-only probe."""
        return None if self.tokens is None else int(self.tokens.shape[1] - 1)

    @property
    def has_tokens(self) -> bool:
        return self.tokens is not None

    def sequence_range(self, token_start: int, token_stop: int) -> tuple[int, int]:
        """The sequences whose targets are tokens ``[token_start, token_stop)``.

        Both ends must fall on sequence boundaries (multiples of ``C``).
        """
        c = self._require_tokens("sequence_range")
        if token_start % c or (token_stop % c and token_stop != self.n_tokens):
            raise InputError(f"token range [{token_start}, {token_stop}) is not aligned to sequences of {c} tokens")
        return token_start // c, -(-token_stop // c)

    def _require_tokens(self, what: str) -> int:
        if self.tokens is None:
            raise InputError(f"{what} needs a probe with token ids; this probe is index-only (imported)")
        return int(self.tokens.shape[1] - 1)

    # -- identity -------------------------------------------------------------------------

    @cached_property
    def fingerprint(self) -> str:
        """sha256 (hex, first 32 digits) of the token ids, per-token arrays and names."""
        h = hashlib.sha256()
        if self.tokens is not None:
            h.update(b"tokens")
            h.update(str(self.tokens.shape).encode())
            h.update(np.ascontiguousarray(self.tokens, dtype="<i4").tobytes())
        for k in sorted(self.token_arrays):
            v = self.token_arrays[k]
            h.update(k.encode() + b"\0" + str(v.dtype.str).encode())
            h.update(np.ascontiguousarray(v).tobytes())
        meta = {"domains": list(self.domains), "documents": list(self.documents), "tokenizer": self.tokenizer}
        h.update(json.dumps(meta, sort_keys=True).encode())
        return h.hexdigest()[:32]

    def summary(self) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "n_tokens": self.n_tokens,
            "n_sequences": self.n_sequences,
            "context": self.context,
            "n_documents": len(self.documents),
            "n_domains": len(self.domains),
            "tokenizer": dict(self.tokenizer),
        }


def document_tokens(d: Document, tokenizer: Tokenizer) -> np.ndarray:
    """The token ids of ``d``: its own tokens, or its text encoded. A text the tokenizer cannot
    encode is an :class:`InputError` naming the document (the tokenizer's own error cannot say
    which of thousands it was)."""
    if d.tokens is not None:
        return d.tokens
    try:
        return tokenizer.encode(d.text)
    except InputError as exc:
        raise InputError(f"document {d.key!r}: {exc}") from None


def _halves_hint(windows: np.ndarray, drawn: list, vocab: int | None) -> str:
    """Where 32-bit token ids out of the vocabulary are each two 16-bit ids inside it, side by
    side: the hint that the file was written in uint16 (a uint16 file read as uint32 pairs its
    ids up). Empty otherwise."""
    dtypes = {np.asarray(ids).dtype for ids in drawn}
    if vocab is None or vocab > 1 << 16 or len(dtypes) != 1 or dtypes.pop().itemsize != 4 or windows.min() < 0:
        return ""
    if np.all((windows & 0xFFFF) < vocab) and np.all((windows >> 16) < vocab):
        return (f", and the dtype they were written in: every id here is two ids below {vocab} side by side, as a "
                "uint16 file's ids are when read as 32-bit (--bin-dtype uint16)")
    return ""


def build_probe(
    docs: Sequence[Document],
    tokenizer: Tokenizer,
    *,
    context: int = 128,
    n_sequences: int = 128,
    seed: int = 0,
) -> ProbeSet:
    """Cut probe documents into windows of ``context + 1`` tokens and draw ``n_sequences``.

    Windows do not overlap within a document; they are drawn uniformly without replacement
    (``seed``), then kept in document order. Fewer windows than asked is an error that says how
    many the documents hold.
    """
    # counts, never cut (context=8.5 and n_sequences=4.5 were numpy's and slicing's TypeErrors)
    context, n_sequences = check_count("context", context), check_count("n_sequences", n_sequences)
    if not docs:
        raise InputError("no probe documents")
    w = context + 1
    encoded = [document_tokens(d, tokenizer) for d in docs]
    # The candidate windows, numbered document by document (offsets 0, w, 2w, ... in each), without
    # listing them: a held-out side of a large token file holds millions.
    per_doc = np.array([len(ids) // w for ids in encoded], np.int64)
    ends = np.cumsum(per_doc)
    n_candidates = int(ends[-1])
    if n_candidates < n_sequences and not any(len(ids) for ids in encoded):
        raise InputError(f"the tokenizer gives no tokens for any of the {len(docs)} probe documents; is it the tokenizer of this text?")
    if n_candidates < n_sequences:
        raise InputError(
            f"probe documents hold {n_candidates} windows of {w} tokens; asked for {n_sequences}"
            " (use fewer sequences, a shorter context, or a larger probe fraction)"
        )
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(n_candidates, size=n_sequences, replace=False))
    doc_of = np.searchsorted(ends, pick, side="right")
    chosen = [(int(j), int(i - (ends[j] - per_doc[j])) * w) for j, i in zip(doc_of, pick)]
    windows = np.stack([np.asarray(encoded[j][off : off + w]) for j, off in chosen])
    if windows.dtype.kind not in "iu":  # a tokenizer's floats were cut to ids (1.7 to 1), its huge ids raised OverflowError
        raise InputError(f"the tokenizer gives {windows.dtype} values, not integer token ids; encode() must return integers")
    windows = windows.astype(np.int64) if windows.dtype != np.uint64 else windows  # before int32: no wrap
    vocab = getattr(tokenizer, "vocab_size", None)
    lo, hi = int(windows.min()), int(windows.max())
    if lo < 0 or (vocab is not None and hi >= vocab):
        raise InputError(
            f"probe documents hold token ids {lo}..{hi}, outside [0, {vocab or _ID_LIMIT}) of the tokenizer's vocabulary"
            + (f" ({vocab})" if vocab is not None else "")
            + "; pre-tokenized documents (a .bin) need the tokenizer that made them (--tokenizer)"
            + (_halves_hint(windows, [docs[j].tokens for j, _ in chosen], vocab) if all(docs[j].tokens is not None for j, _ in chosen) else "")
        )
    if hi >= _ID_LIMIT:  # inside the vocabulary (or none is known), but past what a probe stores
        raise InputError(f"probe documents hold token ids up to {hi}; tokdyn stores probe token ids as int32, below 2**31")
    tokens = windows.astype(np.int32)
    unk = getattr(tokenizer, "unk_id", None)
    if unk is not None and (share := float(np.mean(tokens == unk))) > _UNK_WARN:
        warnings.warn(
            f"the tokenizer maps {share:.0%} of the probe's tokens to its unknown token (id {unk}): "
            "the losses of a probe of unknown tokens say little; is it the tokenizer of this text?",
            stacklevel=2,
        )
    used_docs = sorted({j for j, _ in chosen})
    doc_index = {j: k for k, j in enumerate(used_docs)}
    domain_names = sorted({docs[j].domain for j in used_docs})
    dom_index = {d: k for k, d in enumerate(domain_names)}
    return ProbeSet.from_tokens(
        tokens,
        doc_id=np.array([doc_index[j] for j, _ in chosen], np.int32),
        doc_offset=np.array([off for _, off in chosen], np.int64),
        domain=np.array([dom_index[docs[j].domain] for j, _ in chosen], np.int32),
        domains=domain_names,
        documents=[docs[j].key for j in used_docs],
        tokenizer=tokenizer.spec(),
    )
