"""The trajectory store: one zarr v3 hierarchy holding one probe set and any number of runs.

Layout (``docs/store.md`` is the full schema)::

    /                      attrs["tokdyn"]: kind, schema_version, probe_fingerprint, versions
    /probe                 attrs: fingerprint, domains, documents, tokenizer, context
    /probe/tokens          int32 [sequence, position]       (absent for an imported probe)
    /probe/<field>         [token]: sample_id, token_pos, token_id, doc_id, doc_pos, domain, ...
    /runs/<name>           attrs["tokdyn_run"]: axis, model config, parameter counts, writers, ...
    /runs/<name>/loss      float32|float16|float64 [checkpoint, token], chunks (1, token_chunk)
    /runs/<name>/step, axis_value, tokens_seen, lr, wall_time, ckpt_fingerprint   [checkpoint]
    /runs/<name>/commits/w<j>   attrs: rows, last_step, nonfinite   (one per writer)

Crash safety rests on three rules. (1) Every loss chunk holds one checkpoint row, so appending
a row writes new chunk objects and never rewrites a committed one. (2) A row becomes visible
only when its writer's commit record (a zarr.json, which zarr writes atomically: temp file and
rename locally, one PUT on object stores) is updated *after* the data. (3) A run's committed
row count is the minimum over its writers, so a row counts only once every token range of it
is written. Arrays may be longer than the committed count (capacity allocated ahead, or a row
in flight when a process died); readers slice to the committed rows, and a resumed writer
overwrites the uncommitted tail.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import os
import socket
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync as zarr_sync
from zarr.storage import StorePath

from . import __version__
from .errors import (
    InputError,
    TokdynError,
    NotAStoreError,
    ProbeMismatchError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    SchemaVersionError,
    StepOrderError,
    StoreError,
)
from .probe import ProbeSet

__all__ = ["SCHEMA_VERSION", "TrajectoryStore", "Run", "RunWriter", "open_store", "LOSS_DTYPES", "AXES"]

SCHEMA_VERSION = 1
STORE_KIND = "tokdyn-store"
LOSS_DTYPES = ("float32", "float16", "float64")
AXES = ("T", "D", "M")
DEFAULT_TOKEN_CHUNK = 262144  # 1 MiB of float32 per chunk: see docs/store.md
COORD_CHUNK = 256
COORDS = {  # name: (dtype, fill value) of the per-checkpoint arrays
    "step": ("int64", -1),
    "axis_value": ("float64", np.nan),
    "tokens_seen": ("int64", -1),
    "lr": ("float64", np.nan),
    "wall_time": ("float64", np.nan),
    "ckpt_fingerprint": ("uint64", 0),
}
_RUN_NAME_FORBIDDEN = set('/\\:*?"<>|') | {"\0"}


CODECS = ("lz4", "zstd", "none")


def _compressor(codec: str = "lz4") -> tuple:
    """Byte-shuffled Blosc, then a CRC32C checksum of the chunk. lz4 (default) keeps the writer
    above 300 MB/s on 2 cores; zstd stores ~10 % fewer bytes at about half the speed
    (docs/store.md has the measurements). The checksum makes a damaged chunk an error on read:
    Blosc alone decodes a chunk cut short without complaint, as zeros (docs/reliability.md)."""
    if codec not in CODECS:
        raise InputError(f"codec must be one of {CODECS}, got {codec!r}")
    if codec == "none":
        return (Crc32cCodec(),)
    return (BloscCodec(cname=codec, clevel=5 if codec == "lz4" else 3, shuffle="shuffle"), Crc32cCodec())


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _delete_group(group: zarr.Group) -> None:
    """Remove everything under ``group`` (best effort)."""
    try:
        zarr_sync(group.store.delete_dir(group.path))
    except Exception:  # noqa: BLE001 - cleaning up after another error
        pass


def _open_group(url: str | os.PathLike, mode: str, storage_options: Mapping | None = None, **kwargs) -> zarr.Group:
    if storage_options:
        kwargs["storage_options"] = dict(storage_options)
    return zarr.open_group(store=str(url) if isinstance(url, os.PathLike) else url, mode=mode, **kwargs)


class TrajectoryStore:
    """A tokdyn store. Open one with :func:`open_store` (or :meth:`create` / :meth:`open`).

    Attributes
    ----------
    url : str
        Where the store lives (a local path or an fsspec URL).
    probe_fingerprint : str
        Fingerprint of the probe every run in the store was evaluated on.
    """

    def __init__(self, group: zarr.Group, url: str, *, writable: bool) -> None:
        meta = group.attrs.get("tokdyn")
        if not isinstance(meta, Mapping) or meta.get("kind") != STORE_KIND:
            raise NotAStoreError(f"{url} is a zarr group but not a tokdyn store (no attrs['tokdyn'] of kind {STORE_KIND!r})")
        version = meta.get("schema_version")
        if version != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{url} has store schema version {version!r}; this tokdyn ({__version__}) reads version {SCHEMA_VERSION}"
            )
        self._group = group
        self.url = url
        self.writable = writable
        self.probe_fingerprint: str = meta["probe_fingerprint"]
        self._probe: ProbeSet | None = None

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def create(
        cls, url: str | os.PathLike, probe: ProbeSet, *, overwrite: bool = False, storage_options: Mapping | None = None
    ) -> "TrajectoryStore":
        """Create a new store for ``probe`` at ``url``; an existing one is an error unless ``overwrite``."""
        if not isinstance(probe, ProbeSet):
            raise InputError(f"probe must be a ProbeSet, got {type(probe).__name__}")
        _check_url(url)
        url = os.fspath(url) if isinstance(url, os.PathLike) else url
        try:  # the group is born with a marker naming its creator, so a killed creation is recognised
            group = _open_group(url, "w" if overwrite else "w-", storage_options, attributes={CREATING: _owner()})
        except (FileExistsError, zarr.errors.ContainsGroupError, zarr.errors.ContainsArrayError):
            raise StoreError(f"{url} already exists; open it, or pass overwrite=True to replace it") from None
        try:
            _write_probe(group.create_group("probe"), probe)
            group.create_group("runs")
        except BaseException:
            _delete_group(group)  # never leave a half-made store that blocks the next attempt
            raise
        # The root attribute is written last (replacing the marker, one write): a store is
        # recognised only once its probe is whole.
        group.attrs.put({"tokdyn": {
            "kind": STORE_KIND,
            "schema_version": SCHEMA_VERSION,
            "probe_fingerprint": probe.fingerprint,
            "tokdyn_version": __version__,
            "zarr_version": zarr.__version__,
            "created": _now(),
        }})
        store = cls(group, url, writable=True)
        store._probe = probe
        return store

    @classmethod
    def open(
        cls, url: str | os.PathLike, *, mode: str = "r", storage_options: Mapping | None = None
    ) -> "TrajectoryStore":
        """Open an existing store, read-only (``mode="r"``) or for appending (``"r+"``)."""
        if mode not in ("r", "r+"):
            raise InputError(f"mode must be 'r' or 'r+', got {mode!r}")
        _check_url(url)
        url = os.fspath(url) if isinstance(url, os.PathLike) else url
        try:
            group = _open_group(url, mode, storage_options)
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, zarr.errors.NodeTypeValidationError):
            raise NotAStoreError(f"no tokdyn store at {url}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
            raise StoreError(f"{url}: store metadata is unreadable ({type(exc).__name__}: {exc})") from None
        return cls(group, url, writable=mode == "r+")

    # -- probe ----------------------------------------------------------------------------

    @property
    def probe(self) -> ProbeSet:
        """The probe set, read from the store once and cached."""
        if self._probe is None:
            self._probe = _read_probe(self._group["probe"])
            if self._probe.fingerprint != self.probe_fingerprint:
                raise StoreError(
                    f"{self.url}: probe content hashes to {self._probe.fingerprint}, store records "
                    f"{self.probe_fingerprint}; the probe arrays were modified or damaged"
                )
        return self._probe

    def check_probe(self, probe: ProbeSet) -> None:
        """Raise :class:`ProbeMismatchError` unless ``probe`` is the store's probe."""
        if probe.fingerprint != self.probe_fingerprint:
            raise ProbeMismatchError(
                f"probe fingerprint {probe.fingerprint} differs from the store's {self.probe_fingerprint} "
                f"({self.url}); a store holds runs on one probe only, use another store for this probe"
            )

    # -- runs -----------------------------------------------------------------------------

    @property
    def runs(self) -> list[str]:
        """Names of the runs in the store, sorted."""
        return sorted(self._group["runs"].group_keys())

    def run(self, name: str) -> "Run":
        """A read view of run ``name``."""
        _check_run_name(name)
        try:
            g = self._group[f"runs/{name}"]
        except KeyError:
            raise RunNotFoundError(f"no run {name!r} in {self.url}; runs: {', '.join(self.runs) or 'none'}") from None
        except (ValueError, TypeError) as exc:  # a zarr.json cut short or overwritten
            raise StoreError(f"run {name!r} in {self.url}: metadata unreadable ({type(exc).__name__}: {exc})") from None
        return Run(self, name, g)

    def create_run(
        self,
        name: str,
        *,
        axis: str = "T",
        capacity: int = 16,
        dtype: str = "float32",
        token_chunk: int | None = None,
        writers: Sequence[tuple[int, int]] | None = None,
        attrs: Mapping[str, Any] | None = None,
        codec: str = "lz4",
    ) -> "Run":
        """Create an empty run; write rows with :meth:`Run.writer`.

        Parameters
        ----------
        axis : {"T", "D", "M"}
            What the rows index: checkpoints of one run (T), data budgets (D), model sizes (M).
        capacity : int
            Rows allocated ahead (a single writer grows the arrays when it runs out).
        dtype : {"float32", "float16", "float64"}
            Storage dtype of the losses.
        token_chunk : int, optional
            Tokens per chunk; by default about 262144, rounded to whole probe sequences.
        writers : list of (start, stop), optional
            Token ranges written by separate processes (distributed ranks); they must tile
            ``[0, N)`` in order and start on chunk boundaries. Default: one writer for all tokens.
        attrs : dict, optional
            JSON-able run metadata: ``model_config``, ``n_params``, ``n_params_non_embedding``,
            ``data_budget``, ``seed``, and anything else.
        codec : {"lz4", "zstd", "none"}
            Compression of the loss chunks.
        """
        self._require_writable()
        _check_run_name(name)
        if name in self.runs:
            if self.has_run(name):
                raise RunExistsError(f"run {name!r} already exists in {self.url}; resume it or choose another name")
            self._discard_aborted_run(name)
        if axis not in AXES:
            raise InputError(f"axis must be one of {AXES}, got {axis!r}")
        if dtype not in LOSS_DTYPES:
            raise InputError(f"dtype must be one of {LOSS_DTYPES}, got {dtype!r}")
        if int(capacity) < 1:
            raise InputError(f"capacity must be >= 1, got {capacity}")
        n = self.probe.n_tokens
        chunk = self._token_chunk(token_chunk)
        compressors = _compressor(codec)
        ranges = [(0, n)] if writers is None else [(int(a), int(b)) for a, b in writers]
        _check_writer_ranges(ranges, n, chunk)
        run_attrs = jsonable(dict(attrs or {}), "run attrs")
        g = self._group["runs"].create_group(name, attributes={CREATING: _owner()})
        cap = int(capacity)
        g.create_array(
            "loss", shape=(cap, n), chunks=(1, chunk), dtype=dtype, fill_value=np.nan,
            dimension_names=("checkpoint", "token"), compressors=compressors,
            attributes={"units": "nats", "long_name": "per-token cross-entropy", "coordinates": " ".join(COORDS)},
        )  # fmt: skip
        for cname, (cdtype, fill) in COORDS.items():
            g.create_array(cname, shape=(cap,), chunks=(COORD_CHUNK,), dtype=cdtype, fill_value=fill, dimension_names=("checkpoint",),
                           compressors=_compressor())  # fmt: skip
        commits = g.create_group("commits")
        for j in range(len(ranges)):
            commits.create_group(f"w{j}", attributes={"rows": 0, "last_step": None, "nonfinite": 0, "nonfinite_rows": {}})
        # Written last, replacing the marker: a run group without it is an aborted creation
        # (it holds no committed row: writers need this metadata).
        g.attrs.put({"tokdyn_run": {
            **run_attrs,
            "axis": axis,
            "dtype": dtype,
            "token_chunk": chunk,
            "codec": codec,
            "writers": [list(r) for r in ranges],
            "schema_version": SCHEMA_VERSION,
            "tokdyn_version": __version__,
            "created": _now(),
        }})
        return Run(self, name, g)

    def has_run(self, name: str) -> bool:
        """Whether run ``name`` exists and its creation finished (an aborted one is replaced by
        :meth:`create_run`)."""
        _check_run_name(name)
        if name not in self.runs:
            return False
        try:
            return isinstance(self._group[f"runs/{name}"].attrs.get("tokdyn_run"), Mapping)
        except (KeyError, ValueError, TypeError):
            return False

    def _discard_aborted_run(self, name: str) -> None:
        """Remove a run group whose creation never finished (no committed row can be in it),
        unless its creator is still alive (:class:`RunBusyError`)."""
        try:
            owner = self._group[f"runs/{name}"].attrs.get(CREATING)
        except (KeyError, ValueError, TypeError):
            owner = None
        if owner is not None:
            _refuse_if_live(owner, f"run {name!r} of {self.url} is being created")
        zarr_sync(self._group.store.delete_dir(_join(self._group.path, "runs", name)))

    def delete_run(self, name: str) -> None:
        """Remove run ``name`` and everything stored under it (its fit too)."""
        self._require_writable()
        self.run(name)  # RunNotFoundError if absent
        del self._group["runs"][name]

    def _token_chunk(self, token_chunk: int | None) -> int:
        c = self.probe.context or 1
        n = self.probe.n_tokens
        if token_chunk is None:
            token_chunk = max(c, (DEFAULT_TOKEN_CHUNK // c) * c)
            return min(token_chunk, -(-n // c) * c)
        token_chunk = int(token_chunk)
        if token_chunk < 1 or token_chunk % c:
            raise InputError(f"token_chunk must be a positive multiple of the probe context {c}, got {token_chunk}")
        return token_chunk

    def _require_writable(self) -> None:
        if not self.writable:
            raise StoreError(f"{self.url} is open read-only; open it with mode='r+' to write")

    # -- description ----------------------------------------------------------------------

    def size_bytes(self) -> int | None:
        """Bytes the store takes on its storage (None where the backend cannot say)."""
        st = self._group.store
        root = getattr(st, "root", None)
        if root is not None:
            return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        fs = getattr(st, "fs", None)
        if fs is not None:
            try:
                if getattr(fs, "asynchronous", False):  # zarr's fsspec filesystems are async
                    return int(zarr_sync(fs._du(st.path, total=True)))
                return int(fs.du(st.path, total=True))
            except Exception:  # noqa: BLE001 - size is informative only
                return None
        return None

    def info(self) -> dict:
        """A JSON-able description: probe, runs (shapes, steps, NaNs), size on disk."""
        runs = {}
        for name in self.runs:
            try:
                runs[name] = self.run(name).info()
            except StoreError as exc:
                runs[name] = {"error": str(exc)}
        return {
            "url": self.url,
            "schema_version": SCHEMA_VERSION,
            "probe": self.probe.summary(),
            "runs": runs,
            "size_bytes": self.size_bytes(),
        }

    def __repr__(self) -> str:
        return f"TrajectoryStore({self.url!r}, probe={self.probe_fingerprint}, runs={self.runs})"


def open_store(
    url: str | os.PathLike,
    probe: ProbeSet | None = None,
    *,
    mode: str = "a",
    storage_options: Mapping | None = None,
) -> TrajectoryStore:
    """Open a store, creating it for ``probe`` when ``mode="a"`` and nothing is there.

    ``mode``: ``"r"`` read-only, ``"r+"`` existing store for writing, ``"a"`` open or create
    (needs ``probe``), ``"w"`` create, replacing what is there (needs ``probe``). When a
    ``probe`` is given for an existing store, its fingerprint must match.
    """
    if mode not in ("r", "r+", "a", "w"):
        raise InputError(f"mode must be one of 'r', 'r+', 'a', 'w', got {mode!r}")
    _check_url(url)
    if probe is not None and not isinstance(probe, ProbeSet):
        raise InputError(f"probe must be a ProbeSet, got {type(probe).__name__}")
    if mode == "w":
        if probe is None:
            raise InputError("creating a store needs a probe")
        return TrajectoryStore.create(url, probe, overwrite=True, storage_options=storage_options)
    if mode == "a":
        try:
            store = TrajectoryStore.open(url, mode="r+", storage_options=storage_options)
        except NotAStoreError:
            if probe is None:
                raise
            if _aborted_creation(url, storage_options):  # a creator killed half-way: start again
                return TrajectoryStore.create(url, probe, overwrite=True, storage_options=storage_options)
            if _exists_nonempty(url, storage_options):
                raise
            return TrajectoryStore.create(url, probe, storage_options=storage_options)
    else:
        store = TrajectoryStore.open(url, mode=mode, storage_options=storage_options)
    if probe is not None:
        store.check_probe(probe)
        store._probe = store._probe or probe
    return store


def _aborted_creation(url: str | os.PathLike, storage_options: Mapping | None) -> bool:
    """True when ``url`` holds a store whose creation never finished and whose creator is gone.
    A creation still in progress in a live process is :class:`RunBusyError`."""
    try:
        attrs = dict(_open_group(url, "r", storage_options).attrs)
    except Exception:  # noqa: BLE001 - not a zarr group at all: not ours to replace
        return False
    if "tokdyn" in attrs or CREATING not in attrs:
        return False
    _refuse_if_live(attrs[CREATING], f"store {url} is being created")
    return True


def _exists_nonempty(url: str | os.PathLike, storage_options: Mapping | None) -> bool:
    """True when ``url`` holds anything (so creating a store there would clobber it)."""
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(os.fspath(url), **dict(storage_options or {}))
        return bool(fs.exists(path) and (not fs.isdir(path) or fs.ls(path)))
    except Exception:  # noqa: BLE001 - be conservative: only an empty/missing location is created
        return False


@dataclass(frozen=True)
class _Commit:
    rows: int
    last_step: int | None
    nonfinite: int
    nonfinite_rows: dict


class Run:
    """A read view of one run. Every reader sees exactly the committed rows."""

    def __init__(self, store: TrajectoryStore, name: str, group: zarr.Group) -> None:
        meta = group.attrs.get("tokdyn_run")
        if not isinstance(meta, Mapping):
            raise StoreError(f"run {name!r} in {store.url} is incomplete (no run metadata); it was never fully created")
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"run {name!r} has schema version {meta.get('schema_version')!r}; this tokdyn reads {SCHEMA_VERSION}"
            )
        self.store = store
        self.name = name
        self._group = group
        self.attrs: dict = dict(meta)
        try:
            self.axis: str = meta["axis"]
            self.writers: list[tuple[int, int]] = [(int(a), int(b)) for a, b in meta["writers"]]
            self._loss = group["loss"]
            coords = {c: group[c] for c in COORDS}
        except (KeyError, ValueError, TypeError) as exc:
            raise StoreError(f"run {name!r} in {store.url} is damaged: {type(exc).__name__}: {exc}") from None
        self._check_arrays(coords)

    def _check_arrays(self, coords: Mapping[str, Any]) -> None:
        """Refuse arrays of a dtype or shape a tokdyn writer never makes (object dtype included):
        whatever wrote them, tokdyn would misread them."""
        loss, where = self._loss, f"run {self.name!r} in {self.store.url}"
        if not isinstance(loss, zarr.Array) or str(loss.dtype) not in LOSS_DTYPES or loss.ndim != 2:
            raise StoreError(f"{where}: loss must be a 2-D array of {'/'.join(LOSS_DTYPES)}, found {getattr(loss, 'dtype', type(loss).__name__)} with shape {getattr(loss, 'shape', None)}")
        n = self.store._group["probe"].attrs.get("n_tokens")
        if loss.shape[1] != n or not self.writers or self.writers[0][0] != 0 or self.writers[-1][1] != loss.shape[1]:
            raise StoreError(f"{where}: loss has {loss.shape[1]} tokens and writers {self.writers}; the probe has {n}")
        for name, arr in coords.items():
            if not isinstance(arr, zarr.Array) or arr.ndim != 1 or arr.dtype != np.dtype(COORDS[name][0]):
                raise StoreError(f"{where}: {name} must be a 1-D {COORDS[name][0]} array, found {getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', None)}")

    # -- commit state ---------------------------------------------------------------------

    def _commit(self, j: int) -> _Commit:
        try:
            a = zarr.open_group(store=self._group.store, path=f"{self._group.path}/commits/w{j}", mode="r").attrs
            c = _Commit(int(a["rows"]), a.get("last_step"), int(a.get("nonfinite", 0)), dict(a.get("nonfinite_rows", {})))
        except (KeyError, ValueError, TypeError, FileNotFoundError, zarr.errors.GroupNotFoundError) as exc:
            raise StoreError(f"run {self.name!r}: commit record of token range {j} is unreadable ({type(exc).__name__}: {exc})") from None
        if c.rows < 0 or (c.rows and not isinstance(c.last_step, int)):
            raise StoreError(f"run {self.name!r}: commit record of token range {j} is damaged (rows {c.rows}, last step {c.last_step!r})")
        return c

    @property
    def n_committed(self) -> int:
        """Rows complete in every token range: the rows readers see."""
        k = min(self._commit(j).rows for j in range(len(self.writers)))
        self._refresh(k)
        if k > self._loss.shape[0]:
            raise StoreError(f"run {self.name!r}: the commit records count {k} rows, but the loss array holds {self._loss.shape[0]}; the store is damaged")
        return k

    def break_lock(self, writer: int | None = None) -> None:
        """Remove the writer lock of token range ``writer`` (all by default). Only for a lock left
        by a process on another machine that is known to be gone: a crash on this machine is
        recognised, and its lock taken over, without this."""
        for j in range(len(self.writers)) if writer is None else [int(writer)]:
            zarr_sync(self._group.store.delete(_join(self._group.path, "commits", f"w{j}", LOCK_NAME)))

    @property
    def capacity(self) -> int:
        return int(self._loss.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self._loss.shape[1])

    @property
    def dtype(self) -> np.dtype:
        return self._loss.dtype

    @property
    def token_chunk(self) -> int:
        return int(self.attrs["token_chunk"])

    # -- reading --------------------------------------------------------------------------

    def _refresh(self, k: int) -> None:
        """Reopen the loss array when a writer grew it since this view was opened."""
        if k > self._loss.shape[0]:
            self._loss = self._group["loss"]

    def coord(self, name: str) -> np.ndarray:
        """Per-checkpoint array ``name`` (one of ``step``, ``axis_value``, ``tokens_seen``, ...)."""
        if name not in COORDS:
            raise InputError(f"unknown coordinate {name!r}; expected one of {', '.join(COORDS)}")
        return self._read_coord(name, self.n_committed)

    def _read_coord(self, name: str, k: int) -> np.ndarray:
        if not k:
            return np.empty(0, COORDS[name][0])
        out = self._read(lambda: self._group[name][:k], f"{name}[:{k}]")
        if name == "step" and (out.size != k or out.min() < 0 or np.any(np.diff(out) <= 0)):
            raise StoreError(f"run {self.name!r}: committed steps must be >= 0 and strictly increasing, found {out[:8].tolist()}...; the store is damaged")
        return out

    def _read(self, read, what: str):
        """Run a chunk read; damaged chunk data (cut short, overwritten) is a StoreError naming it."""
        try:
            return read()
        except (TokdynError, OSError):
            raise
        except Exception as exc:  # noqa: BLE001 - codecs raise RuntimeError, ValueError, TypeError...
            raise StoreError(f"run {self.name!r}: cannot decode {what} ({type(exc).__name__}: {exc}); a chunk of it is damaged") from None

    @property
    def steps(self) -> np.ndarray:
        return self.coord("step")

    @property
    def axis_values(self) -> np.ndarray:
        return self.coord("axis_value")

    def losses(self, tokens: slice | None = None, rows: slice | None = None) -> np.ndarray:
        """Loss matrix ``[checkpoint, token]`` in nats (committed rows only; NaN = not finite)."""
        k = self.n_committed
        self._refresh(k)
        rsl = slice(0, k) if rows is None else _clip(rows, k)
        tsl = slice(None) if tokens is None else tokens
        if k == 0:
            return np.empty((0, len(range(*tsl.indices(self.n_tokens)))), self.dtype)
        out = self._read(lambda: self._loss[rsl, tsl], f"loss[{rsl.start}:{rsl.stop}, {tsl.start}:{tsl.stop}]")
        self._check_nan_counts(out, range(k)[rsl])
        return out

    def _check_nan_counts(self, block: np.ndarray, rows: range) -> None:
        """A missing chunk reads as NaN (the fill value). Every NaN a writer stored is counted in
        its commit record, so a row with more NaN than counted has lost chunk data."""
        nan = np.isnan(block).sum(axis=1)
        if not nan.any():
            return
        _, counted = self.nonfinite()
        for i, r in enumerate(rows):
            if nan[i] > counted.get(r, 0):
                raise StoreError(
                    f"run {self.name!r} row {r}: {int(nan[i])} losses read as missing where {counted.get(r, 0)} non-finite "
                    "were recorded; chunk files of this row are missing from the store"
                )

    def to_dask(self, token_block: int | None = None):
        """The committed loss matrix as a dask array chunked ``(all rows, token_block)``."""
        import dask.array as da

        k = self.n_committed
        if k == 0:
            raise StoreError(f"run {self.name!r} has no committed rows")
        self._refresh(k)
        arr = da.from_zarr(self._loss)[:k]
        return arr.rechunk((k, token_block or self.token_chunk))

    def to_xarray(self):
        """An ``xarray.Dataset`` of the committed rows: ``loss`` (checkpoint, token) with coordinates."""
        import xarray as xr

        k = self.n_committed
        # Open each array on its own and cut it to the committed rows: after a crash the arrays
        # may have different lengths (see RunWriter._ensure_capacity), which xarray would refuse.
        names = ["loss", *COORDS]
        parts = {n: xr.open_zarr(self._group.store, group=self._group.path, consolidated=False,
                                 drop_variables=[m for m in names if m != n])[n].isel(checkpoint=slice(0, k))
                 for n in names}  # fmt: skip
        ds = xr.Dataset({"loss": parts["loss"]}, coords={n: parts[n] for n in COORDS})
        return ds.assign_attrs(n_committed=k, **{"tokdyn_run": self.attrs})

    def nonfinite(self) -> tuple[int, dict[int, int]]:
        """Total count of non-finite losses recorded (stored as NaN) and the count per row."""
        total, per_row = 0, {}
        for j in range(len(self.writers)):
            c = self._commit(j)
            total += c.nonfinite
            for r, n in c.nonfinite_rows.items():
                per_row[int(r)] = per_row.get(int(r), 0) + int(n)
        return total, per_row

    def info(self) -> dict:
        k = self.n_committed  # read the commit records once
        nonfinite, _ = self.nonfinite()
        return {
            "axis": self.axis,
            "shape": [k, self.n_tokens],
            "capacity": self.capacity,
            "dtype": str(self.dtype),
            "token_chunk": self.token_chunk,
            "writers": len(self.writers),
            "steps": self._read_coord("step", k).tolist(),
            "axis_values": self._read_coord("axis_value", k).tolist(),
            "nonfinite_losses": nonfinite,
            "attrs": {k: v for k, v in self.attrs.items() if k not in ("writers",)},
        }

    def writer(self, *, writer: int = 0, resume: bool = False) -> "RunWriter":
        """A :class:`RunWriter` appending rows for token range ``writer``."""
        self.store._require_writable()
        return RunWriter(self, writer, resume=resume)

    def __repr__(self) -> str:
        return f"Run({self.name!r}, axis={self.axis}, rows={self.n_committed}, tokens={self.n_tokens})"


def _clip(rows: slice, k: int) -> slice:
    start, stop, step = rows.indices(k)
    return slice(start, stop, step)


class RunWriter:
    """Appends checkpoint rows to one token range of a run, committing each after its data.

    Not thread-safe: one writer per (run, token range) at a time. A fresh writer on a run that
    already has committed rows is refused unless ``resume=True``; a resumed writer skips steps
    at or before its last committed step (they are already stored) and continues after it.
    """

    def __init__(self, run: Run, writer: int, *, resume: bool) -> None:
        if not 0 <= writer < len(run.writers):
            raise InputError(f"writer index {writer} out of range for {len(run.writers)} token ranges")
        self.run = run
        self.index = writer
        self.token_start, self.token_stop = run.writers[writer]
        self._commit_group = zarr.open_group(
            store=run._group.store, path=f"{run._group.path}/commits/w{writer}", mode="r+"
        )
        c = run._commit(writer)
        if c.rows and not resume:
            raise RunExistsError(
                f"run {run.name!r} already has {c.rows} committed rows (last step {c.last_step}); "
                "pass resume=True to continue it, or use a new run name"
            )
        self.rows = c.rows
        self.last_step: int | None = c.last_step
        self._nonfinite = c.nonfinite
        self._nonfinite_rows = dict(c.nonfinite_rows)
        self._is_coord_writer = writer == 0
        self._arrays = {name: run._group[name] for name in COORDS} if self._is_coord_writer else {}
        self._coord_chunk_start: int | None = None
        self._coord_buffers: dict[str, np.ndarray] = {}
        self._lock = StorePath(run._group.store, _join(run._group.path, "commits", f"w{writer}", LOCK_NAME))
        self._token: str | None = None
        self._claim()

    # -- the writer lock ------------------------------------------------------------------

    def _claim(self) -> None:
        """Take this token range's lock: create it exclusively, or take it over from a process
        that is gone (a crash) or from an earlier writer of this same process; refuse when
        another live process holds it."""
        me = {**_owner(), "token": uuid.uuid4().hex}
        for _ in range(3):
            _write_json_key(self._lock, me, exclusive=True)
            holder = _read_json_key(self._lock)
            if holder is not None and holder.get("token") == me["token"]:
                self._token = me["token"]
                return
            if holder is not None:
                _refuse_if_live(holder, f"run {self.run.name!r} token range {self.index} is being written",
                                if_gone=f"break the lock with tokdyn.open_store(url, mode='r+').run({self.run.name!r}).break_lock()")  # fmt: skip
                zarr_sync(self._lock.delete())  # its holder crashed, or is an older writer of ours
        raise RunBusyError(f"run {self.run.name!r} token range {self.index}: another process keeps taking the writer lock")

    def _check_owner(self) -> None:
        """Before touching data: the lock must still be ours and the commit record must still be
        where this writer left it; otherwise another writer has appended, and this one stops."""
        holder = _read_json_key(self._lock)
        if self._token is None or holder is None or holder.get("token") != self._token:
            who = "nobody (it was released)" if not holder else f"process {holder.get('pid')} on {holder.get('host')}"
            raise RunBusyError(
                f"this writer of run {self.run.name!r} token range {self.index} no longer holds its lock (held by {who}); "
                "it stops rather than interleave rows with the other writer"
            )
        c = self.run._commit(self.index)
        if c.rows != self.rows or c.last_step != self.last_step:
            raise RunBusyError(
                f"run {self.run.name!r} token range {self.index} was appended to by another writer "
                f"({c.rows} rows, last step {c.last_step}; this writer expected {self.rows}, {self.last_step}); it stops"
            )

    def release(self) -> None:
        """Give the lock back (the recorder does this on close). Idempotent."""
        if self._token is None:
            return
        holder = _read_json_key(self._lock)
        if holder is not None and holder.get("token") == self._token:
            zarr_sync(self._lock.delete())
        self._token = None

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    @property
    def n_tokens(self) -> int:
        return self.token_stop - self.token_start

    def accepts(self, step: int) -> bool:
        """Whether ``step`` comes after the last committed step (a resumed writer skips others)."""
        return self.last_step is None or int(step) > self.last_step

    def append(
        self,
        losses: np.ndarray,
        *,
        step: int,
        axis_value: float | None = None,
        tokens_seen: int | None = None,
        lr: float | None = None,
        wall_time: float | None = None,
        ckpt_fingerprint: int | None = None,
        warn_nonfinite: bool = True,
    ) -> int:
        """Write one row and commit it; returns its row index.

        Non-finite losses are stored as NaN and counted in the commit record (and warned about
        unless ``warn_nonfinite=False``, for sources where NaN already means "missing").
        """
        step = int(step)
        if step < 0:
            raise StepOrderError(f"step must be >= 0, got {step}")
        if not self.accepts(step):
            raise StepOrderError(
                f"step {step} is not after the last committed step {self.last_step} of run {self.run.name!r}; "
                "rows are never overwritten or duplicated"
            )
        values = np.asarray(losses)
        if values.shape != (self.n_tokens,):
            raise InputError(f"losses must have shape ({self.n_tokens},) for tokens [{self.token_start}, {self.token_stop}), got {values.shape}")
        if values.dtype.kind not in "fiu":
            raise InputError(f"losses must be numbers, got dtype {values.dtype}")
        if axis_value is not None and not np.isfinite(float(axis_value)):
            raise InputError(f"axis_value must be finite, got {axis_value} for step {step}")
        with np.errstate(over="ignore", invalid="ignore"):  # counted below: a loss beyond float16 is inf
            values = values.astype(self.run.dtype, copy=False)
        bad = ~np.isfinite(values)
        n_bad = int(bad.sum())
        if n_bad:
            values = np.where(bad, np.nan, values)
        if n_bad and warn_nonfinite:
            warnings.warn(
                f"run {self.run.name!r} step {step}: {n_bad} non-finite losses stored as NaN", RuntimeWarning, stacklevel=2
            )
        self._check_owner()
        k = self.rows
        self._ensure_capacity(k + 1)
        writes = [(self.run._loss, (k, slice(self.token_start, self.token_stop)), values)]
        if self._is_coord_writer:
            row = {
                "step": step,
                "axis_value": float(step) if axis_value is None else float(axis_value),
                "tokens_seen": -1 if tokens_seen is None else int(tokens_seen),
                "lr": np.nan if lr is None else float(lr),
                "wall_time": time.time() if wall_time is None else float(wall_time),
                "ckpt_fingerprint": 0 if ckpt_fingerprint is None else int(ckpt_fingerprint),
            }
            writes += self._coordinate_writes(k, row)
        _write_concurrently(writes)
        if n_bad:
            self._nonfinite += n_bad
            self._nonfinite_rows[str(k)] = n_bad
        # The commit: one atomic metadata write, after the data. (Not ``attrs.update``: zarr's
        # MutableMapping.update writes once per key, and a kill between two writes would leave
        # ``rows`` and ``last_step`` out of step; the crash test caught exactly that.)
        self._commit_group.update_attributes(
            {"rows": k + 1, "last_step": step, "nonfinite": self._nonfinite, "nonfinite_rows": self._nonfinite_rows}
        )
        self.rows, self.last_step = k + 1, step
        return k

    def _coordinate_writes(self, k: int, row: dict) -> list:
        """Whole-chunk writes of the per-checkpoint values of row ``k``.

        The writer keeps the current chunk of each coordinate in memory and rewrites it whole:
        zarr then skips the read-modify-write of a partial chunk (half the cost of a row). The
        rewrite carries the committed values unchanged and chunk writes are atomic, so committed
        rows stay safe."""
        c0 = (k // COORD_CHUNK) * COORD_CHUNK
        c1 = min(c0 + COORD_CHUNK, self.run.capacity)
        if self._coord_chunk_start != c0:  # a new chunk (or a resumed writer): load it once
            self._coord_buffers = {name: arr[c0:c1] for name, arr in self._arrays.items()}
            self._coord_chunk_start = c0
        writes = []
        for name, value in row.items():
            buf = self._coord_buffers[name]
            if len(buf) != c1 - c0:  # the arrays were resized inside this chunk
                buf = np.concatenate([buf, np.full(max(0, c1 - c0 - len(buf)), COORDS[name][1], dtype=buf.dtype)])[: c1 - c0]
            buf[k - c0] = value
            self._coord_buffers[name] = buf
            writes.append((self._arrays[name], (slice(c0, c1),), buf))
        return writes

    def _ensure_capacity(self, rows: int) -> None:
        cap = self.run.capacity
        if rows <= cap:
            return
        if len(self.run.writers) > 1:
            raise StoreError(
                f"run {self.run.name!r} has capacity {cap} rows and several writers; allocate every row "
                "up front (capacity = schedule length) when writing from several processes"
            )
        new = max(rows, 2 * cap)
        # Coordinates first: capacity is read from the loss array, so a process killed between
        # the two leaves coordinates longer than the losses, which the next growth repairs.
        for arr in self._arrays.values():
            arr.resize((new,))
        self.run._loss.resize((new, self.run.n_tokens))

    def trim(self) -> None:
        """Shrink the arrays to the committed rows, so xarray sees no padding. Single writer
        only: a run of several writers keeps its capacity (it cannot grow again on resume)."""
        if len(self.run.writers) > 1:  # never resize a multi-writer run: it could not be resumed
            return
        k = self.run.n_committed
        if k and self.run.capacity != k:
            self.run._loss.resize((k, self.run.n_tokens))
            for arr in self._arrays.values():
                arr.resize((k,))


def _write_concurrently(writes: list[tuple[zarr.Array, tuple, np.ndarray]]) -> None:
    """Do several array writes at once on zarr's event loop: the row's loss chunks and its
    per-checkpoint values overlap their I/O instead of queueing one after another."""

    async def write_all() -> None:
        await asyncio.gather(*(arr._async_array.setitem(sel, value) for arr, sel, value in writes))

    zarr_sync(write_all())


# -- who is writing: creation markers and writer locks ------------------------------------
#
# A store or run under creation carries ``attrs[CREATING]`` (its creator) until its metadata is
# complete; a writer holds ``commits/w<j>/writer.lock`` while it appends. Both name the process
# (host, pid, start time), so a later process can tell a crashed owner (take over) from a live
# one (refuse: two writers would interleave rows).

CREATING = "tokdyn_creating"
LOCK_NAME = "writer.lock"


def _owner() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _proc_stat(pid)[1], "since": _now()}


def _proc_stat(pid: int) -> tuple[str | None, str | None]:
    """(state, start time) of process ``pid`` from /proc (Linux); (None, None) elsewhere or if gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            data = fh.read()
    except (OSError, ValueError, TypeError, OverflowError):
        return None, None
    fields = data[data.rindex(b")") + 2 :].split()  # after "pid (comm) "
    return fields[0].decode(), fields[19].decode()


def _owner_state(owner: Any) -> str:
    """``"self"`` (this process), ``"alive"``, ``"dead"`` or ``"unknown"`` (another machine)."""
    if not isinstance(owner, Mapping) or not isinstance(owner.get("pid"), int):
        return "dead"  # unreadable: whoever wrote it did not finish writing it
    if owner.get("host") != socket.gethostname():
        return "unknown"
    pid = owner["pid"]
    state, start = _proc_stat(pid)
    if pid == os.getpid() and start == owner.get("start"):
        return "self"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        pass  # another user's process: alive
    except (OverflowError, ValueError):
        return "dead"
    if state == "Z" or (start is not None and owner.get("start") is not None and start != owner["start"]):
        return "dead"  # a zombie, or the pid was reused by another process
    return "alive"


def _refuse_if_live(owner: Any, what: str, *, if_gone: str = "delete it and try again") -> str:
    """Raise :class:`RunBusyError` when ``owner`` may still be running; returns its state."""
    state = _owner_state(owner)
    if state in ("alive", "unknown"):
        where = f"process {owner.get('pid')} on {owner.get('host')} (since {owner.get('since')})"
        hint = "wait for it to finish, or stop it" if state == "alive" else (
            f"this machine cannot tell whether it still runs; if it does not, {if_gone}")  # fmt: skip
        raise RunBusyError(f"{what} by {where}; a second writer is refused rather than interleaved: {hint}")
    return state


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _read_json_key(sp: StorePath) -> Any:
    buf = zarr_sync(sp.get(prototype=default_buffer_prototype()))
    if buf is None:
        return None
    try:
        return json.loads(buf.to_bytes())
    except (ValueError, UnicodeDecodeError):
        return {}  # a lock cut short: its writer died while writing it


def _write_json_key(sp: StorePath, obj: Any, *, exclusive: bool) -> None:
    buf = default_buffer_prototype().buffer.from_bytes(json.dumps(obj).encode())
    zarr_sync(sp.set_if_not_exists(buf) if exclusive else sp.set(buf))


# -- probe (de)serialisation --------------------------------------------------------------


def _write_probe(g: zarr.Group, probe: ProbeSet) -> None:
    if probe.tokens is not None:
        t = probe.tokens
        g.create_array("tokens", shape=t.shape, chunks=(max(1, min(t.shape[0], 4096)), t.shape[1]), dtype="int32",
                       dimension_names=("sequence", "position"), compressors=_compressor())[...] = t  # fmt: skip
    n = probe.n_tokens
    for name, arr in probe.token_arrays.items():
        if name in ("tokens",) or not name.isidentifier():
            raise InputError(f"probe array name {name!r} is not allowed")
        with warnings.catch_warnings():  # fixed-width strings (npz metadata) have no v3 spec yet
            warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")
            g.create_array(name, shape=(n,), chunks=(min(n, 1 << 20),), dtype=arr.dtype, dimension_names=("token",),
                           compressors=_compressor())[...] = arr  # fmt: skip
    g.update_attributes(
        {
            "fingerprint": probe.fingerprint,
            "n_tokens": n,
            "context": probe.context,
            "domains": list(probe.domains),
            "documents": list(probe.documents),
            "tokenizer": dict(probe.tokenizer),
            "token_arrays": list(probe.token_arrays),
        }
    )


def _read_probe(g: zarr.Group) -> ProbeSet:
    a = dict(g.attrs)
    try:
        names = a["token_arrays"]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")
            nodes = {name: g[name] for name in names}
            if "tokens" in g.array_keys():
                nodes["tokens"] = g["tokens"]
            for name, arr in nodes.items():  # object / variable-length dtypes are never read
                if not isinstance(arr, zarr.Array) or np.dtype(arr.dtype).kind not in "iufbUS":
                    raise StoreError(f"probe array {name!r} has dtype {getattr(arr, 'dtype', None)}; tokdyn reads numbers and fixed-width strings only")
            arrays = {name: nodes[name][...] for name in names}
        tokens = nodes["tokens"][...] if "tokens" in nodes else None
    except (TokdynError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001 - a missing array, bad metadata, a chunk codecs cannot decode
        raise StoreError(f"probe group is incomplete or damaged: {type(exc).__name__}: {exc}") from None
    return ProbeSet(tokens, arrays, domains=a.get("domains", ()), documents=a.get("documents", ()), tokenizer=a.get("tokenizer", {}))


# -- validation helpers -------------------------------------------------------------------


def _check_url(url: Any) -> None:
    if not isinstance(url, (str, os.PathLike)) or not os.fspath(url):
        raise InputError(f"store must be a path or an fsspec URL, got {url!r}")


def _check_run_name(name: str) -> None:
    if not isinstance(name, str) or not name or name.startswith(".") or set(name) & _RUN_NAME_FORBIDDEN:
        raise InputError(f"run name must be a non-empty string without / \\ : * ? \" < > | or a leading dot, got {name!r}")


def _check_writer_ranges(ranges: list[tuple[int, int]], n: int, chunk: int) -> None:
    pos = 0
    for a, b in ranges:
        if a != pos or b <= a:
            raise InputError(f"writer token ranges must tile [0, {n}) in order without gaps, got {ranges}")
        if a % chunk:
            raise InputError(f"writer range {a}:{b} does not start on a token-chunk boundary ({chunk})")
        pos = b
    if pos != n:
        raise InputError(f"writer token ranges end at {pos}; the probe has {n} tokens")


def jsonable(obj: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(obj, default=_json_default))
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} must be JSON-serialisable: {exc}") from None


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")
