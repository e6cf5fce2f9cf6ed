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
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec
from zarr.core.sync import sync as zarr_sync

from . import __version__
from .errors import (
    InputError,
    NotAStoreError,
    ProbeMismatchError,
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
    """Byte-shuffled Blosc. lz4 (default) keeps the writer above 300 MB/s on 2 cores; zstd
    stores ~10 % fewer bytes at about half the speed (docs/store.md has the measurements)."""
    if codec == "none":
        return ()
    if codec not in CODECS:
        raise InputError(f"codec must be one of {CODECS}, got {codec!r}")
    return (BloscCodec(cname=codec, clevel=5 if codec == "lz4" else 3, shuffle="shuffle"),)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _delete_group(group: zarr.Group) -> None:
    """Remove everything under ``group`` (best effort)."""
    try:
        zarr_sync(group.store.delete_dir(group.path))
    except Exception:  # noqa: BLE001 - cleaning up after another error
        pass


def _open_group(url: str | os.PathLike, mode: str, storage_options: Mapping | None = None) -> zarr.Group:
    kwargs = {"storage_options": dict(storage_options)} if storage_options else {}
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
        url = os.fspath(url) if isinstance(url, os.PathLike) else url
        try:
            group = _open_group(url, "w" if overwrite else "w-", storage_options)
        except (FileExistsError, zarr.errors.ContainsGroupError, zarr.errors.ContainsArrayError):
            raise StoreError(f"{url} already exists; open it, or pass overwrite=True to replace it") from None
        try:
            _write_probe(group.create_group("probe"), probe)
            group.create_group("runs")
        except BaseException:
            _delete_group(group)  # never leave a half-made store that blocks the next attempt
            raise
        # The root attribute is written last: a store is recognised only once its probe is whole.
        group.attrs["tokdyn"] = {
            "kind": STORE_KIND,
            "schema_version": SCHEMA_VERSION,
            "probe_fingerprint": probe.fingerprint,
            "tokdyn_version": __version__,
            "zarr_version": zarr.__version__,
            "created": _now(),
        }
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
        url = os.fspath(url) if isinstance(url, os.PathLike) else url
        try:
            group = _open_group(url, mode, storage_options)
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, zarr.errors.NodeTypeValidationError):
            raise NotAStoreError(f"no tokdyn store at {url}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
            raise StoreError(f"{url}: store metadata is unreadable ({exc})") from None
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
            raise RunExistsError(f"run {name!r} already exists in {self.url}; resume it or choose another name")
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
        run_attrs = _jsonable(dict(attrs or {}), "run attrs")
        g = self._group["runs"].create_group(name)
        cap = int(capacity)
        g.create_array(
            "loss", shape=(cap, n), chunks=(1, chunk), dtype=dtype, fill_value=np.nan,
            dimension_names=("checkpoint", "token"), compressors=compressors,
            attributes={"units": "nats", "long_name": "per-token cross-entropy", "coordinates": " ".join(COORDS)},
        )  # fmt: skip
        for cname, (cdtype, fill) in COORDS.items():
            g.create_array(cname, shape=(cap,), chunks=(COORD_CHUNK,), dtype=cdtype, fill_value=fill, dimension_names=("checkpoint",))
        commits = g.create_group("commits")
        for j in range(len(ranges)):
            commits.create_group(f"w{j}", attributes={"rows": 0, "last_step": None, "nonfinite": 0, "nonfinite_rows": {}})
        # Written last: a run group without this attribute is an aborted creation.
        g.attrs["tokdyn_run"] = {
            **run_attrs,
            "axis": axis,
            "dtype": dtype,
            "token_chunk": chunk,
            "codec": codec,
            "writers": [list(r) for r in ranges],
            "schema_version": SCHEMA_VERSION,
            "tokdyn_version": __version__,
            "created": _now(),
        }
        return Run(self, name, g)

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
                fs = getattr(fs, "sync_fs", fs)
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
            if _exists_nonempty(url, storage_options):
                raise
            return TrajectoryStore.create(url, probe, storage_options=storage_options)
    else:
        store = TrajectoryStore.open(url, mode=mode, storage_options=storage_options)
    if probe is not None:
        store.check_probe(probe)
        store._probe = store._probe or probe
    return store


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
        self.axis: str = meta["axis"]
        self.writers: list[tuple[int, int]] = [tuple(w) for w in meta["writers"]]
        self._loss = group["loss"]

    # -- commit state ---------------------------------------------------------------------

    def _commit(self, j: int) -> _Commit:
        a = zarr.open_group(store=self._group.store, path=f"{self._group.path}/commits/w{j}", mode="r").attrs
        return _Commit(int(a["rows"]), a.get("last_step"), int(a.get("nonfinite", 0)), dict(a.get("nonfinite_rows", {})))

    @property
    def n_committed(self) -> int:
        """Rows complete in every token range: the rows readers see."""
        return min(self._commit(j).rows for j in range(len(self.writers)))

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
        return self._group[name][:k] if k else np.empty(0, COORDS[name][0])

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
        return self._loss[rsl, tsl]

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
        bad = ~np.isfinite(values)
        n_bad = int(bad.sum())
        if n_bad:
            values = np.where(bad, np.nan, values)
        if n_bad and warn_nonfinite:
            warnings.warn(
                f"run {self.run.name!r} step {step}: {n_bad} non-finite losses stored as NaN", RuntimeWarning, stacklevel=2
            )
        k = self.rows
        self._ensure_capacity(k + 1)
        writes = [(self.run._loss, (k, slice(self.token_start, self.token_stop)), values.astype(self.run.dtype, copy=False))]
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
            arrays = {name: g[name][...] for name in names}
        tokens = g["tokens"][...] if "tokens" in g.array_keys() else None
    except KeyError as exc:
        raise StoreError(f"probe group is incomplete: missing {exc}") from None
    return ProbeSet(tokens, arrays, domains=a.get("domains", ()), documents=a.get("documents", ()), tokenizer=a.get("tokenizer", {}))


# -- validation helpers -------------------------------------------------------------------


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


def _jsonable(obj: Any, what: str) -> Any:
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
