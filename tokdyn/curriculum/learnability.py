"""The learnability model: each training token's learning time and loss drop, from cheap keys.

A pilot run's fitted events say, for every pilot token, *when* it was learned (``mu``, log10
pilot steps) and *how much* loss it shed (``delta``, nats). :class:`LearnabilityTable` turns
them into a predictor for any token of the training pool, keyed by the token with its preceding
one or two tokens (docs/method.md, "Reshaping training"):

- **targets** per pilot token (:func:`token_targets`): ``delta`` = the sum of its events' loss
  drops seen inside the pilot's observed range (:func:`seen_drops`: 0 for a token with no event;
  an event fitted outside the range, or a pair that cancels, adds nothing), ``mu`` = the
  drop-weighted mean learning time of its events with a positive drop (NaN when the token's
  drops sum to <= 0); a token the pilot's fit never observed (its loss NaN at every row) has
  ``delta`` NaN and counts in no estimate (counted as a drop of 0, it made its keys read as
  less learnable);
- **keys** (:func:`context_keys`): order 1 is the target id, order 2 adds the previous token,
  order 3 the one before; a target whose window has no such token uses the id ``V`` (no token);
- **estimates** per key: mean ``delta`` per occurrence, drop-weighted mean ``mu``, each shrunk
  toward the next shorter key's estimate with ``prior`` pseudo-occurrences (order 1 toward the
  global mean); keys of order >= 2 seen fewer than ``min_count`` times are dropped;
- **lookup**: the longest key present in the table answers, else a shorter one, else the global
  estimate. It runs in torch (``searchsorted`` and ``where``, no host sync), on the CPU for the
  sampler and on the training device for per-token loss weights.

docs/curriculum.md gives the file format (``save``/``load``).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._checks import as_array, as_values, check_count, is_int as _is_int, is_real as _is_real
from .._version import __version__
from ..errors import InputError, StoreError, UnsafeFileError
from ..store.schema import jsonable, utc_now  # numpy scalars and arrays as JSON, one InputError otherwise
from .._files import check_output_path, check_regular, loads_json, write_atomically
from ._common import require_step_axis

__all__ = [
    "LearnabilityOptions",
    "LearnabilityTable",
    "context_keys",
    "token_targets",
    "seen_drops",
    "build_table",
    "load_table",
    "TABLE_KIND",
    "TABLE_SCHEMA_VERSION",
]

TABLE_KIND = "tokdyn-learnability"
TABLE_SCHEMA_VERSION = 1
MAX_ORDER = 3
_FIELDS = ("keys", "mu", "delta", "count", "n_events")  # per order, saved as <field>_<order>


@dataclass(frozen=True)
class LearnabilityOptions:
    """How the table is built (all ours, docs/method.md, "Reshaping training").

    Parameters
    ----------
    order : int
        Longest key: the target and its ``order - 1`` preceding tokens (1 to 3).
    min_count : int
        Keys of order >= 2 seen fewer times in the pilot are dropped (lookups back off).
    prior : float
        Pseudo-occurrences of the shorter key's estimate mixed into each key's (shrinkage).
    holdout : float
        Fraction of pilot sequences held out to check the predictions (0: no check).
    seed : int
        Chooses the held-out sequences.
    """

    order: int = 3
    min_count: int = 5
    prior: float = 5.0
    holdout: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        # each option's type first (True was taken as order 1, a string raised TypeError, and a
        # numpy int order was refused while a numpy int seed was taken)
        if not (_is_int(self.order) and 1 <= self.order <= MAX_ORDER):
            raise InputError(f"order must be an int from 1 to {MAX_ORDER}, got {self.order!r}")
        if not (_is_int(self.min_count) and self.min_count >= 1):
            raise InputError(f"min_count must be an int >= 1, got {self.min_count!r}")
        if not (_is_real(self.prior) and np.isfinite(float(self.prior)) and self.prior >= 0):
            raise InputError(f"prior must be a finite number >= 0, got {self.prior!r}")
        if not (_is_real(self.holdout) and 0 <= self.holdout < 1):
            raise InputError(f"holdout must be a number in [0, 1), got {self.holdout!r}")
        if not (_is_int(self.seed) and self.seed >= 0):
            raise InputError(f"seed must be an int >= 0, got {self.seed!r}")
        for name in ("order", "min_count", "seed"):  # numpy ints as Python ints (arithmetic, JSON)
            object.__setattr__(self, name, int(getattr(self, name)))


# -- keys and targets ----------------------------------------------------------------------


def max_vocab(order: int) -> int:
    """The largest vocabulary whose keys of ``order`` fit in int64: ``(V + 1) ** order < 2**63``."""
    order = int(order)  # a numpy int wrapped in b**order: the loops below never ended
    b = int(round(2 ** (63 / order)))
    while b**order >= 2**63:
        b -= 1
    while (b + 1) ** order < 2**63:
        b += 1
    return b - 1


def _check_vocab(vocab_size: int, order: int = MAX_ORDER) -> int:
    """``vocab_size`` as an int whose keys of ``order`` fit in int64, or one :class:`InputError`
    (a vocabulary of 2**31 fits keys of order 1 and 2, not 3: the message names the order that
    holds it; a float such as 257.5 was cut to 257)."""
    if not _is_int(vocab_size):
        raise InputError(f"vocab_size must be an integer, got {vocab_size!r}")
    v = int(vocab_size)
    if v < 1:
        raise InputError(f"vocab_size must be >= 1, got {v}")
    if v > max_vocab(order):
        fits = [k for k in range(1, order) if v <= max_vocab(k)]
        raise InputError(f"a vocabulary of {v} is too large for keys of order {order} in int64 (at most {max_vocab(order):,}); "
                         + (f"build the table with --order {fits[-1]} (order={fits[-1]})" if fits
                            else "no key order holds it"))  # fmt: skip
    return v


def context_keys(tokens: torch.Tensor, *, order: int, vocab_size: int) -> list[torch.Tensor]:
    """Keys of every target of ``tokens [..., L]``: a list of ``order`` int64 tensors ``[..., L-1]``.

    Key ``k`` (1-based) of the target at position ``p`` is
    ``tokens[p] + b * tokens[p-1] + b**2 * tokens[p-2]`` up to ``k`` terms, with ``b = V + 1``
    and the id ``V`` standing for "no token" before the window's start. The key of order
    ``k - 1`` is the key of order ``k`` modulo ``b**(k-1)``.
    """
    if not (_is_int(order) and 1 <= order <= MAX_ORDER):
        raise InputError(f"order must be an int from 1 to {MAX_ORDER}, got {order!r}")
    order = int(order)
    v = _check_vocab(vocab_size, order)
    if tokens.ndim < 1 or tokens.shape[-1] < 2:
        raise InputError(f"tokens must have shape [..., L] with L >= 2, got {tuple(tokens.shape)}")
    tokens = tokens.long()
    n = tokens.shape[-1] - 1
    base = v + 1
    key = tokens[..., 1:].clone()
    keys = [key]
    for j in range(1, order):
        pad = min(j - 1, n)  # targets whose j-th preceding token lies before the window
        prev = torch.cat([tokens.new_full(tokens.shape[:-1] + (pad,), v), tokens[..., : n - pad]], dim=-1)
        key = key + prev * base**j
        keys.append(key)
    return keys


def token_targets(events: Mapping[str, np.ndarray], n_tokens: int, scored: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-token targets ``[n_tokens]`` from learning events (``token``, ``mu``, ``delta``:
    ``SigmoidFit.events()``, or better :func:`seen_drops` of them, as :func:`build_table` does).

    ``delta``: sum of the token's event drops (0 without events; NaN for a token not ``scored``,
    ``[n_tokens]`` bool, the tokens the fit observed: default every token); ``weight``: that sum
    clipped at 0 (a drop undone by a rise of the same token carries no weight); ``mu``: the
    positive-drop-weighted mean learning time of its events (NaN when its weight is 0).
    """
    tok, mu, delta = _event_arrays(events, ("mu", "delta"))
    if not (tok.shape == mu.shape == delta.shape and tok.ndim == 1):
        raise InputError("events must hold 1-D arrays token, mu, delta of one length")
    if tok.size and (tok.min() < 0 or tok.max() >= n_tokens):
        raise InputError(f"event token indices must lie in [0, {n_tokens})")
    ok = np.isfinite(mu) & np.isfinite(delta)
    tok, mu, delta = tok[ok], mu[ok], delta[ok]
    pos = np.clip(delta, 0.0, None)
    d = np.bincount(tok, weights=delta, minlength=n_tokens)
    p = np.bincount(tok, weights=pos, minlength=n_tokens)
    wmu = np.bincount(tok, weights=pos * mu, minlength=n_tokens)
    if scored is not None:
        scored = as_values("scored", scored, "flag")
        if scored.shape != (n_tokens,):
            raise InputError(f"scored must be one bool per token ({n_tokens}), got shape {scored.shape}")
        d = np.where(scored, d, np.nan)  # never observed: no target (a drop of 0 would say "nothing to learn")
    w = np.clip(np.nan_to_num(d), 0.0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where((w > 0) & (p > 0), wmu / p, np.nan)
    return {"delta": d, "mu": m, "weight": np.where(np.isfinite(m), w, 0.0)}


def _event_arrays(events: Mapping[str, np.ndarray], names: tuple[str, ...]) -> list[np.ndarray]:
    """``events["token"]`` as indices and ``events[name]`` as floats, each a new array
    (:func:`tokdyn._checks.as_values`: a token of 2.9 was token 2, a masked value taken)."""
    return [as_values("events['token']", events["token"], "index"), *(as_values(f"events[{k!r}]", events[k]) for k in names)]


def seen_drops(events: Mapping[str, np.ndarray], n_tokens: int, x_range: tuple[float, float]) -> dict[str, np.ndarray]:
    """``events`` (``token``, ``mu``, ``s``, ``delta``) with each ``delta`` replaced by the part
    of it that happens inside the observed range ``x_range`` of the pilot
    (:meth:`tokdyn.spectrum.Events.realized_drop`), and events without a finite shape left out.

    A fit can place an event of tens of nats outside the points it was fitted on (its drop was
    never seen), or a pair of large events of opposite sign that cancel; counted at face value
    they would make a token look learned early or by far more than its loss fell.
    """
    from ..spectrum import Events

    tok, mu, s, delta = _event_arrays(events, ("mu", "s", "delta"))
    ok = np.isfinite(mu) & np.isfinite(s) & np.isfinite(delta) & (s > 0)
    ev = Events(tok[ok], mu[ok], s[ok], delta[ok], n_tokens=n_tokens, x_range=x_range)
    return {"token": ev.token, "mu": ev.mu, "s": ev.s, "delta": ev.realized_drop()}


# -- the table -----------------------------------------------------------------------------


class LearnabilityTable:
    """Predicted learning time ``mu`` (log10 pilot steps) and loss drop ``delta`` (nats) per key.

    Build one with :meth:`fit` (arrays) or :func:`build_table` (a fitted pilot run in a store);
    save and load it with :meth:`save` / :func:`load_table`. Tensors live on ``self.device``;
    :meth:`to` gives a copy elsewhere (e.g. the training GPU).

    Attributes
    ----------
    vocab_size : int
    order : int
    mu_global, delta_global : float
        The answer for a token none of whose keys is in the table.
    meta : dict
        Provenance: tokenizer spec, pilot (store, run, x range, tokens per step), options and the
        held-out check (``meta["validation"]``).
    """

    def __init__(self, *, vocab_size: int, levels: list[dict[str, torch.Tensor]], mu_global: float,
                 delta_global: float, meta: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        if not 1 <= len(levels) <= MAX_ORDER:
            raise InputError(f"a table has 1 to {MAX_ORDER} key orders, got {len(levels)}")
        self.vocab_size = _check_vocab(vocab_size, len(levels))
        if not (np.isfinite(mu_global) and np.isfinite(delta_global)):
            raise InputError(f"global estimates must be finite, got mu={mu_global}, delta={delta_global}")
        for k, lev in enumerate(levels, 1):
            missing = [f for f in _FIELDS if f not in lev]
            if missing:
                raise InputError(f"order {k} of the table lacks {missing}")
            n = lev["keys"].shape
            if any(lev[f].shape != n or lev[f].ndim != 1 for f in _FIELDS):
                raise InputError(f"order {k}: every field must be 1-D of the keys' length {tuple(n)}")
            if n[0] > 1 and not bool(torch.all(lev["keys"][1:] > lev["keys"][:-1])):
                raise InputError(f"order {k}: keys must be sorted and unique")
            if n[0] and not (bool(torch.isfinite(lev["mu"]).all()) and bool(torch.isfinite(lev["delta"]).all())):
                raise InputError(f"order {k}: mu and delta must be finite")
            if n[0]:
                _check_level(k, lev, self.vocab_size)
        meta = dict(meta or {})
        spec_vocab = meta["tokenizer"].get("vocab_size") if isinstance(meta.get("tokenizer"), Mapping) else None
        if spec_vocab is not None and spec_vocab != self.vocab_size:  # check_tokenizer reads one, the keys the other
            raise InputError(f"vocab_size is {self.vocab_size} but the tokenizer spec in its metadata says {spec_vocab!r}")
        options = meta.get("options")
        if isinstance(options, Mapping) and options.get("order") not in (None, len(levels)):
            raise InputError(f"the table has {len(levels)} key orders but its options say order {options.get('order')!r}")
        self.levels = levels
        self.mu_global = float(mu_global)
        self.delta_global = float(delta_global)
        self.meta = meta

    # -- shape ----------------------------------------------------------------------------

    @property
    def order(self) -> int:
        return len(self.levels)

    @property
    def device(self) -> torch.device:
        return self.levels[0]["keys"].device

    @property
    def n_keys(self) -> list[int]:
        """Keys kept per order."""
        return [int(lev["keys"].numel()) for lev in self.levels]

    @property
    def validation(self) -> dict | None:
        """The held-out check made when the table was built (None without one)."""
        return self.meta.get("validation")

    def __repr__(self) -> str:
        return f"LearnabilityTable(vocab_size={self.vocab_size}, order={self.order}, keys={self.n_keys}, device={self.device})"

    def to(self, device: torch.device | str) -> "LearnabilityTable":
        """A copy with every tensor on ``device`` (keys int64, estimates float32)."""
        levels = [{f: t.to(device) for f, t in lev.items()} for lev in self.levels]
        return LearnabilityTable(vocab_size=self.vocab_size, levels=levels, mu_global=self.mu_global,
                                 delta_global=self.delta_global, meta=self.meta)  # fmt: skip

    # -- fitting --------------------------------------------------------------------------

    @classmethod
    def fit(cls, tokens: np.ndarray, targets: Mapping[str, np.ndarray], *, vocab_size: int,
            options: LearnabilityOptions | None = None, meta: Mapping[str, Any] | None = None) -> "LearnabilityTable":  # fmt: skip
        """Fit the table on pilot windows ``tokens [S, C+1]`` and per-target ``targets``
        (:func:`token_targets`: ``delta``, ``mu``, ``weight``, each ``[S*C]``, row-major; a
        ``delta`` of NaN marks a token that was not observed, which no estimate counts)."""
        opts = options or LearnabilityOptions()
        keys, d, m, w = _pilot_arrays(tokens, targets, vocab_size=vocab_size, order=opts.order)
        return _fit_arrays(keys, d, m, w, vocab_size=vocab_size, options=opts, meta=meta)

    # -- prediction -----------------------------------------------------------------------

    def lookup(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``mu``, ``delta`` (float32) and the key order that answered (int8, 0 = global) for every
        target of ``tokens [..., L]`` (shape ``[..., L-1]``), on the table's device.

        Only tensor operations: no host synchronisation, so it can run inside a CUDA step.
        Token ids must lie in ``[0, vocab_size)``; check them with :meth:`check_tokens` on the host.
        """
        keys = context_keys(tokens.to(self.device), order=self.order, vocab_size=self.vocab_size)
        return self._lookup_keys(keys)

    def _lookup_keys(self, keys: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shape = keys[0].shape
        mu = torch.full(shape, self.mu_global, dtype=torch.float32, device=self.device)
        delta = torch.full(shape, self.delta_global, dtype=torch.float32, device=self.device)
        level = torch.zeros(shape, dtype=torch.int8, device=self.device)
        for k, (lev, q) in enumerate(zip(self.levels, keys), 1):  # shorter keys first: longer ones override
            n = lev["keys"].numel()
            if n == 0:
                continue
            idx = torch.searchsorted(lev["keys"], q).clamp_(max=n - 1)
            hit = lev["keys"][idx] == q
            mu = torch.where(hit, lev["mu"][idx], mu)
            delta = torch.where(hit, lev["delta"][idx], delta)
            level = torch.where(hit, torch.full_like(level, k), level)
        return mu, delta, level

    def predict(self, tokens: np.ndarray, *, batch: int = 16384) -> dict[str, np.ndarray]:
        """Host-side :meth:`lookup` of windows ``tokens [N, L]`` in batches: numpy ``mu``,
        ``delta`` (float32) and ``level`` (int8), each ``[N, L-1]``."""
        batch = check_count("batch", batch)  # -1 returned the unfilled arrays, 2.5 was range()'s TypeError
        arr = as_array("tokens", tokens, "biufc", "token ids")  # (a masked id's value was looked up; floats: below)
        if arr.ndim != 2 or arr.shape[1] < 2:
            raise InputError(f"tokens must have shape [N, L] with L >= 2, got {arr.shape}")
        self.check_tokens(arr)
        out = {k: np.empty((arr.shape[0], arr.shape[1] - 1), dt) for k, dt in (("mu", np.float32), ("delta", np.float32), ("level", np.int8))}
        for a in range(0, arr.shape[0], batch):
            part = torch.from_numpy(np.ascontiguousarray(arr[a : a + batch], dtype=np.int64))
            for name, t in zip(("mu", "delta", "level"), self.lookup(part)):
                out[name][a : a + batch] = t.cpu().numpy()
        return out

    # -- compatibility --------------------------------------------------------------------

    def check_tokens(self, tokens: np.ndarray | torch.Tensor) -> None:
        """Raise :class:`InputError` when ids fall outside this table's vocabulary (a padding id
        added after the pilot, ``-100`` labels passed as tokens, another tokenizer). A tensor's
        range is read back as two numbers: one host sync on a device."""
        if isinstance(tokens, torch.Tensor):
            if tokens.dtype == torch.bool or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
                raise InputError(f"token ids must be integers, got {tokens.dtype}")
            lo, hi = torch.stack(torch.aminmax(tokens)).tolist() if tokens.numel() else (0, 0)
        else:
            arr = np.asarray(tokens)
            if arr.dtype.kind not in "iu":
                raise InputError(f"token ids must be integers, got {arr.dtype}")
            lo, hi = (int(arr.min()), int(arr.max())) if arr.size else (0, 0)
        if lo < 0 or hi >= self.vocab_size:
            raise InputError(
                f"token ids span [{lo}, {hi}] but the learnability table was built for a vocabulary of {self.vocab_size} "
                f"(tokenizer {self.meta.get('tokenizer', {})}): an id outside it would be read as another token's "
                "context (a padding id, -100 labels passed as tokens, another tokenizer?); build the table from a pilot "
                "with the training run's tokenizer"
            )

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise :class:`InputError` unless ``tokenizer`` (an object with ``spec()``, a spec dict
        or a vocabulary size) is the one the table was built for."""
        if isinstance(tokenizer, (int, np.integer)) and not isinstance(tokenizer, bool):
            spec = {"vocab_size": int(tokenizer)}
        elif isinstance(tokenizer, Mapping):
            spec = dict(tokenizer)
        elif hasattr(tokenizer, "spec"):
            spec = dict(tokenizer.spec())
        else:
            raise InputError(f"tokenizer must be a tokenizer, its spec() dict or a vocabulary size, got {type(tokenizer).__name__}")
        mine = self.meta.get("tokenizer", {})
        if spec.get("vocab_size") != self.vocab_size:
            raise InputError(
                f"the learnability table was built for a vocabulary of {self.vocab_size} (tokenizer {mine}); "
                f"the training run's has {spec.get('vocab_size')} ({spec}). Build the table from a pilot with this tokenizer"
            )
        for field in ("kind", "sha256"):
            if field in spec and field in mine and spec[field] != mine[field]:
                raise InputError(
                    f"the learnability table was built with tokenizer {mine}, the training run uses {spec} "
                    f"({field} differs); the keys would mean other tokens. Build the table from a pilot with this tokenizer"
                )

    # -- files ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the table as one ``.npz``: into a new temporary file created exclusively beside
        ``path``, then renamed over it (never half-written, never through a planted file or link).
        The folder must exist (:func:`tokdyn._files.check_output_path`): it is not created."""
        path = Path(path)
        if path.suffix != ".npz":
            raise InputError(f"a learnability table is saved as .npz, got {path}")
        meta = {**self.meta, "kind": TABLE_KIND, "schema_version": TABLE_SCHEMA_VERSION, "vocab_size": self.vocab_size,
                "order": self.order, "mu_global": self.mu_global, "delta_global": self.delta_global}  # fmt: skip
        arrays = {"meta": np.frombuffer(json.dumps(jsonable(meta, "table metadata")).encode(), dtype=np.uint8)}
        for k, lev in enumerate(self.levels, 1):
            for f in _FIELDS:
                arrays[f"{f}_{k}"] = lev[f].cpu().numpy()
        check_output_path(path, what="learnability table")  # its folder is never created
        return write_atomically(path, lambda fh: np.savez(fh, **arrays), binary=True, what="learnability table")


_NPZ_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip archive's first bytes (the second: an empty one)
_NPY_MAGIC = b"\x93NUMPY"


def load_table(path: str | os.PathLike, *, device: torch.device | str = "cpu") -> LearnabilityTable:
    """Load a table written by :meth:`LearnabilityTable.save` onto ``device``.

    Raises :class:`InputError` naming the file, and why in plain words, for any file that is not
    a whole learnability table (empty, not an .npz archive, damaged, or holding other arrays).
    """
    path = check_regular(path, "learnability table")

    def refuse(why: str) -> InputError:
        return InputError(f"{path} is not a learnability table: {why}")

    with open(path, "rb") as fh:
        head = fh.read(6)
    if not head:
        raise refuse("the file is empty")
    if head.startswith(_NPY_MAGIC):
        raise refuse("it holds a single numpy array (.npy), not the .npz archive `tokdyn curriculum build` writes")
    if not head.startswith(_NPZ_MAGIC):
        raise refuse("it is not an .npz archive (the zip file `tokdyn curriculum build` writes)")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (ValueError, EOFError, KeyError, RuntimeError, zipfile.BadZipFile, zlib.error) as exc:
        if "pickle" in str(exc):  # an object array: loading it could run code, and no table holds one
            raise UnsafeFileError(f"{path} is not a learnability table: an array in it would need pickle to load "
                                  "(arbitrary code); refused") from None  # fmt: skip
        raise refuse(f"the .npz archive is damaged or holds other data ({type(exc).__name__}: {exc})") from None
    try:
        meta = loads_json(bytes(np.ascontiguousarray(data["meta"])).decode())
    except KeyError:
        raise refuse("it has no 'meta' array") from None
    except (ValueError, UnicodeDecodeError, TypeError):
        raise refuse("its 'meta' array is not JSON text") from None
    if not isinstance(meta, dict):
        raise refuse(f"its 'meta' is a JSON {type(meta).__name__}, not an object")
    if meta.get("kind") != TABLE_KIND:
        raise refuse(f"kind {meta.get('kind')!r}, expected {TABLE_KIND!r}")
    if meta.get("schema_version") != TABLE_SCHEMA_VERSION:
        raise InputError(f"{path} has table schema version {meta.get('schema_version')!r}; this tokdyn reads {TABLE_SCHEMA_VERSION}")
    order, vocab = meta.get("order"), meta.get("vocab_size")
    if not (type(order) is int and 1 <= order <= MAX_ORDER):
        raise refuse(f"its 'order' is {order!r}, not an integer from 1 to {MAX_ORDER}")
    if type(vocab) is not int:
        raise refuse(f"its 'vocab_size' is {vocab!r}, not an integer")
    for name in ("mu_global", "delta_global"):
        if isinstance(meta.get(name), bool) or not isinstance(meta.get(name), (int, float)):
            raise refuse(f"its {name!r} is {meta.get(name)!r}, not a number")
    expected = {"meta"} | {f"{f}_{k}" for k in range(1, order + 1) for f in _FIELDS}
    extra = sorted(set(data) - expected)
    if extra:  # arrays of another order, or misnamed: a table that says one thing and holds another
        raise refuse(f"it holds arrays {extra} that a table of order {order} does not have")
    levels = []
    for k in range(1, order + 1):
        lev = {}
        for f in _FIELDS:
            a = data.get(f"{f}_{k}")
            if a is None:
                raise refuse(f"array '{f}_{k}' is missing")
            kinds = "iu" if f in ("keys", "count", "n_events") else "iuf"
            if a.ndim != 1 or a.dtype.kind not in kinds:
                raise refuse(f"array '{f}_{k}' is {a.dtype} of shape {a.shape}, expected a 1-D array of "
                             + ("integers" if kinds == "iu" else "numbers"))  # fmt: skip
            # the casts below must not wrap or overflow: a uint64 key of 2**64 - 1 became -1 (and was
            # reported as unsorted), a float64 mu of 1e300 became inf with a RuntimeWarning
            if a.size and a.dtype.kind == "u" and int(a.max()) >= 2**63:
                raise refuse(f"array '{f}_{k}' holds {int(a.max())}, beyond int64")
            if a.size and f in ("mu", "delta"):
                big = ~np.isfinite(a) | (np.abs(a.astype(np.float64)) > np.finfo(np.float32).max)
                if big.any():
                    raise refuse(f"array '{f}_{k}' holds {float(a[big][0])!r}; mu and delta must be finite float32 numbers")
            lev[f] = torch.from_numpy(a.astype(np.float32 if f in ("mu", "delta") else np.int64)).to(device)
        levels.append(lev)
    if not isinstance(meta.get("tokenizer", {}), dict) or not isinstance(meta.get("pilot", {}), dict) \
            or not isinstance(meta.get("validation"), (dict, type(None))):  # fmt: skip
        raise refuse("its 'tokenizer', 'pilot' or 'validation' metadata is not a JSON object")
    rest = {k: v for k, v in meta.items() if k not in ("vocab_size", "mu_global", "delta_global", "order")}
    try:
        return LearnabilityTable(vocab_size=vocab, levels=levels, mu_global=meta["mu_global"],
                                 delta_global=meta["delta_global"], meta=rest)  # fmt: skip
    except InputError as exc:
        raise refuse(str(exc)) from None


# -- from a fitted pilot run ---------------------------------------------------------------


def build_table(store, run: str, *, options: LearnabilityOptions | None = None) -> LearnabilityTable:
    """The learnability table of pilot run ``run`` (fitted with ``tokdyn fit``) in ``store``.

    The held-out check fits a table on ``1 - holdout`` of the pilot sequences and scores its
    predictions on the rest (``table.validation``); the returned table is then fitted on all.

    Raises :class:`StoreError` when the run has no (complete) fit or no learning events, and
    :class:`InputError` when its probe has no token ids or no vocabulary size.
    """
    from ..fit import FitOptions, SigmoidFit
    from ..fit.job import fitted_inputs
    from ..store import as_store

    opts = options or LearnabilityOptions()
    if not isinstance(opts, LearnabilityOptions):
        raise InputError(f"options must be a LearnabilityOptions, got {type(opts).__name__}")
    st = as_store(store)
    r = st.run(run)
    require_step_axis(r, "a learnability table")
    probe = st.probe
    if not probe.has_tokens:
        raise InputError(f"{st.url}: the probe is index-only (imported); a learnability table needs its token ids: record "
                         "the pilot into a store made by `tokdyn probe`, or import a losses.npz that carries probe_tokens")  # fmt: skip
    vocab = probe.tokenizer.get("vocab_size")
    if not vocab:
        raise InputError(f"{st.url}: the probe's tokenizer spec has no vocab_size; record the pilot with a known tokenizer")
    with r.fit.unchanged():  # the fields and the rows they were fitted on: of one fit
        fit = SigmoidFit(r.fit.read(), FitOptions())  # StoreError when not (completely) fitted
        _, x = fitted_inputs(r)
    events = seen_drops(fit.events(), probe.n_tokens, (float(x[0]), float(x[-1])))
    if events["token"].size == 0 or not np.any(events["delta"] > 0):
        raise StoreError(
            f"run {run!r} is fitted but has no learning event with a positive loss drop; a pilot needs tokens that "
            "were learned (train it longer, or on more steps of the schedule)"
        )
    targets = token_targets(events, probe.n_tokens, scored=np.asarray(fit.n_points) > 0)
    meta = {
        "tokenizer": dict(probe.tokenizer),
        "pilot": {
            "store": st.url, "run": run, "probe_fingerprint": probe.fingerprint, "n_tokens": probe.n_tokens,
            "n_events": int(events["token"].size), "x_first": float(x[0]), "x_last": float(x[-1]),
            "tokens_per_step": r.attrs.get("tokens_per_step"), "axis": r.axis,
        },
        "options": asdict(opts),
        "created": utc_now(),
        "tokdyn_version": __version__,
    }  # fmt: skip
    keys, d, m, w = _pilot_arrays(probe.tokens, targets, vocab_size=vocab, order=opts.order)
    meta["validation"] = holdout_check(keys, d, m, w, sequence_length=probe.context, vocab_size=vocab, options=opts)
    return _fit_arrays(keys, d, m, w, vocab_size=vocab, options=opts, meta=meta)


def holdout_check(keys: list[np.ndarray], delta: np.ndarray, mu: np.ndarray, weight: np.ndarray, *,
                  sequence_length: int, vocab_size: int, options: LearnabilityOptions) -> dict | None:  # fmt: skip
    """Fit on all but a random ``options.holdout`` of the sequences, predict the rest, and score
    the predictions: Spearman rank correlation and mean absolute error of ``delta`` (every
    held-out token) and of ``mu`` (held-out tokens with a positive event), beside the error of
    predicting the global mean, and the share of lookups answered at each key order."""
    from scipy.stats import spearmanr

    if options.holdout == 0:
        return None
    n_seq = delta.size // sequence_length
    rng = np.random.default_rng(options.seed)
    n_out = int(round(options.holdout * n_seq))
    if n_out < 1 or n_out >= n_seq:
        fix = (f"give a holdout from 1/{n_seq} to 1 - 1/{n_seq} ({1 / n_seq:.4g} to {1 - 1 / n_seq:.4g}), or 0 for no check" if n_seq >= 2
               else "give holdout 0 (no check): one sequence cannot be split")  # fmt: skip
        raise InputError(f"holdout {options.holdout} of {n_seq} pilot sequence(s) leaves no sequence on one side; {fix} "
                         "(--holdout)")  # fmt: skip
    held = np.zeros(n_seq, bool)
    held[rng.choice(n_seq, size=n_out, replace=False)] = True
    held = np.repeat(held, sequence_length)
    fit = _fit_arrays([k[~held] for k in keys], delta[~held], mu[~held], weight[~held], vocab_size=vocab_size, options=options)
    p_mu, p_delta, level = (t.numpy() for t in fit._lookup_keys([torch.from_numpy(k[held]) for k in keys]))
    seen = np.isfinite(delta[held])  # the held-out tokens the pilot observed: the others have no target
    p_mu, p_delta, level = p_mu[seen], p_delta[seen], level[seen]
    d_true, m_true = delta[held][seen], mu[held][seen]
    has = np.isfinite(m_true)

    def rho(a, b) -> float:
        return float(spearmanr(a, b).statistic) if a.size > 2 and np.ptp(a) > 0 and np.ptp(b) > 0 else float("nan")

    return {
        "holdout": options.holdout,
        "n_tokens": int(seen.sum()),
        "n_tokens_with_event": int(has.sum()),
        "delta_spearman": rho(p_delta, d_true),
        "delta_mae": float(np.mean(np.abs(p_delta - d_true))),
        "delta_mae_global": float(np.mean(np.abs(fit.delta_global - d_true))),
        "mu_spearman": rho(p_mu[has], m_true[has]),
        "mu_mae": float(np.mean(np.abs(p_mu[has] - m_true[has]))) if has.any() else float("nan"),
        "mu_mae_global": float(np.mean(np.abs(fit.mu_global - m_true[has]))) if has.any() else float("nan"),
        "level_share": {str(k): float(np.mean(level == k)) for k in range(options.order + 1)},
    }


# -- internals -----------------------------------------------------------------------------


def _check_level(k: int, lev: Mapping[str, torch.Tensor], vocab_size: int) -> None:
    """One :class:`InputError` unless every key of order ``k`` is one a lookup can produce, and
    its counts are possible (a hand-edited table loaded silently and was never looked up, or
    gave weights from impossible counts).

    A key is ``t0 + b t1 + b**2 t2`` (``b = V + 1``, :func:`context_keys`): the target ``t0`` and
    its previous token ``t1`` are ids below ``V``; only the third digit may be ``V`` (no token
    before the window). ``count`` (pilot occurrences) is >= 1 and ``n_events`` (those with a
    learning event) lies in ``[0, count]``.
    """
    keys = lev["keys"]
    base, v = vocab_size + 1, vocab_size
    lo, hi = int(keys.min()), int(keys.max())  # sorted, but a single pass says either end just as well
    if lo < 0 or hi >= base**k:
        bad = lo if lo < 0 else hi
        raise InputError(f"order {k}: key {bad} lies outside [0, {base**k}) (keys of order {k} are below (V + 1)**{k}, "
                         f"V = {v}); no lookup produces it")  # fmt: skip
    for j, role in ((0, "target"), (1, "previous token"))[:k]:
        digit = torch.div(keys, base**j, rounding_mode="floor") % base
        if bool((digit >= v).any()):
            bad = int(keys[digit >= v][0])
            raise InputError(f"order {k}: key {bad} has {role} id {int(digit[digit >= v][0])}, not below the vocabulary "
                             f"size {v}; no lookup produces it")  # fmt: skip
    count, n_ev = lev["count"], lev["n_events"]
    if bool((count < 1).any()):
        raise InputError(f"order {k}: 'count' must be >= 1 (pilot occurrences of each key), got {int(count.min())}")
    if bool(((n_ev < 0) | (n_ev > count)).any()):
        i = int(torch.nonzero((n_ev < 0) | (n_ev > count))[0, 0])
        raise InputError(f"order {k}: 'n_events' must lie in [0, count], got {int(n_ev[i])} for key {int(keys[i])} "
                         f"of count {int(count[i])}")  # fmt: skip


def _pilot_arrays(tokens, targets, *, vocab_size: int, order: int):
    """Flat keys (one int64 array per order) and targets ``[S*C]`` of pilot windows."""
    t = as_array("pilot tokens", tokens, "biufc", "token ids")  # a masked id's value was a context
    if t.ndim != 2 or t.shape[1] < 2 or t.dtype.kind not in "iu":
        raise InputError(f"pilot tokens must be integer windows [S, C+1], got {t.dtype} {t.shape}")
    v = _check_vocab(vocab_size, order)
    if t.min() < 0 or t.max() >= v:
        raise InputError(f"pilot token ids span [{t.min()}, {t.max()}], outside the vocabulary of {v}")
    n = t.shape[0] * (t.shape[1] - 1)
    arrays = []
    for name in ("delta", "mu", "weight"):
        a = as_values(f"target {name!r}", targets[name])  # a masked value is refused: a missing delta is NaN
        if a.shape != (n,):
            raise InputError(f"target {name!r} must have shape ({n},) (one per pilot target), got {a.shape}")
        arrays.append(a)
    keys = [k.reshape(-1).numpy() for k in context_keys(torch.from_numpy(t.astype(np.int64)), order=order, vocab_size=v)]
    return (keys, *arrays)


def _fit_arrays(keys, delta, mu, weight, *, vocab_size: int, options: LearnabilityOptions, meta=None) -> LearnabilityTable:
    """The table from flat per-token keys and targets (see the module docstring)."""
    counted = np.isfinite(delta)  # NaN: a token the pilot never observed, in no estimate
    if not counted.any():
        raise InputError("no pilot tokens to fit the learnability table on" if delta.size == 0 else
                         "no pilot token has a recorded loss to fit the learnability table on")  # fmt: skip
    has = counted & np.isfinite(mu) & (weight > 0)
    if not has.any():
        raise InputError("no pilot token has a learning event with a positive loss drop")
    delta = np.where(counted, delta, 0.0)
    w = np.where(has, weight, 0.0)
    wmu = np.where(has, w * np.nan_to_num(mu), 0.0)
    d_glob = float(delta.sum() / counted.sum())
    mu_glob = float(wmu.sum() / w.sum())
    w_bar = float(w[has].mean())  # drop of a typical learned token: the prior's weight per pseudo-occurrence
    prior = options.prior
    base = vocab_size + 1
    levels, parent = [], None
    for k, key in enumerate(keys, 1):
        uniq, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        count = np.bincount(inv, weights=counted, minlength=uniq.size).astype(np.int64)  # the tokens observed
        s_d = np.bincount(inv, weights=delta)
        s_w = np.bincount(inv, weights=w)
        s_wmu = np.bincount(inv, weights=wmu)
        n_ev = np.bincount(inv, weights=has.astype(np.float64))
        if parent is None:
            p_d, p_mu = np.full(uniq.size, d_glob), np.full(uniq.size, mu_glob)
        else:  # every key's parent (one token shorter) occurs in the data, so it is in `parent`
            pk, pmu, pd = parent
            j = np.searchsorted(pk, uniq % base ** (k - 1))
            p_d, p_mu = pd[j], pmu[j]
        # (s + prior p) / (n + prior), written as p + (s - n p) / (n + prior): the same number, and
        # finite at any finite prior (at 1e308, prior * p overflowed to inf / inf = NaN, and the
        # build failed with "order 1: mu and delta must be finite")
        with np.errstate(over="ignore"):
            est_d = p_d + (s_d - count * p_d) / (count + prior)
            pw = prior * w_bar  # inf at a huge prior: then every estimate is its parent's
        with np.errstate(invalid="ignore", divide="ignore"):
            est_mu = np.where(s_w + pw > 0, p_mu + (s_wmu - s_w * p_mu) / (s_w + pw), p_mu)
        parent = (uniq, est_mu, est_d)  # all keys, kept or not: the next order shrinks toward them
        keep = count >= (1 if k == 1 else options.min_count)
        levels.append({
            "keys": torch.from_numpy(uniq[keep].astype(np.int64)),
            "mu": torch.from_numpy(est_mu[keep].astype(np.float32)),
            "delta": torch.from_numpy(est_d[keep].astype(np.float32)),
            "count": torch.from_numpy(count[keep].astype(np.int64)),
            "n_events": torch.from_numpy(n_ev[keep].astype(np.int64)),
        })  # fmt: skip
    return LearnabilityTable(vocab_size=vocab_size, levels=levels, mu_global=mu_glob, delta_global=d_glob, meta=meta)
