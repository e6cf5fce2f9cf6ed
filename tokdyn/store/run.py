"""A read view of one run: its committed rows, coordinates, commit records and attributes.

Every reader sees exactly the committed rows (see ``tokdyn/store/store.py`` for the rules that
make that safe while a writer appends)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.core.sync import sync as zarr_sync

from .._checks import as_array, is_int
from ..errors import InputError, SchemaVersionError, StoreError, TokdynError
from .fit import FitResults
from .locks import LOCK_NAME
from .schema import AXES, COORDS, LOSS_DTYPES, NOT_DAMAGE, SCHEMA_VERSION, damage, join, once, one_operation, operation, position_crc
from .writer import COORD_RECORD, RunWriter, run_meta_crc

if TYPE_CHECKING:
    from .store import TrajectoryStore

__all__ = ["Run"]


@dataclass(frozen=True)
class _Commit:
    rows: int
    last_step: int | None
    nonfinite: int
    nonfinite_rows: dict
    crc: dict  # {row: [checksum of each loss chunk of the range]} (runs with an integrity id)
    coord_crc: dict  # {row: checksum of the row's per-checkpoint values} (writer 0)


# a public read of a run as one operation of its view: the run's id and its commit records are
# read once for all the reads it is made of
_operation = one_operation()


class Run:
    """A read view of one run. Every reader sees exactly the committed rows."""

    def __init__(self, store: "TrajectoryStore", name: str, group: zarr.Group) -> None:
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
        except (KeyError, ValueError, TypeError, RecursionError) as exc:  # RecursionError: a zarr.json nested past the parser
            raise StoreError(f"run {name!r} in {store.url} is damaged: {damage(exc)}") from None
        if self.axis not in AXES:  # read into reports and file names: only the values a writer makes
            raise StoreError(f"run {name!r} in {store.url} is damaged: its axis is {str(self.axis)[:40]!r}, expected one of {AXES}")
        self._check_arrays(coords)
        integrity = meta.get("integrity")  # absent in runs made before position-bound checksums
        if integrity is not None and not (
            isinstance(integrity, Mapping) and isinstance(integrity.get("run_id"), str)
            and integrity.get("meta_crc") == run_meta_crc(integrity["run_id"], meta)
        ):  # fmt: skip
            raise StoreError(f"run {name!r} in {store.url} is damaged: its metadata does not match its checksum ({str(integrity)[:80]})")
        self._salt: str | None = integrity["run_id"] if integrity is not None else None
        self._identity = _identity(meta)
        self.fit = FitResults(self)
        """The run's fit results (:class:`tokdyn.store.FitResults`)."""

    def _check_arrays(self, coords: Mapping[str, Any]) -> None:
        """Refuse arrays of a dtype or shape a tokdyn writer never makes (object dtype included):
        whatever wrote them, tokdyn would misread them."""
        loss, where = self._loss, f"run {self.name!r} in {self.store.url}"
        if not isinstance(loss, zarr.Array) or str(loss.dtype) not in LOSS_DTYPES or loss.ndim != 2:
            raise StoreError(f"{where}: loss must be a 2-D array of {'/'.join(LOSS_DTYPES)}, found {getattr(loss, 'dtype', type(loss).__name__)} with shape {getattr(loss, 'shape', None)}")
        n = self.store.probe_group().attrs.get("n_tokens")
        if loss.shape[1] != n or not self.writers or self.writers[0][0] != 0 or self.writers[-1][1] != loss.shape[1]:
            raise StoreError(f"{where}: loss has {loss.shape[1]} tokens and writers {self.writers}; the probe has {n}")
        if loss.chunks != (1, self.attrs.get("token_chunk")):
            raise StoreError(f"{where}: loss chunks are {loss.chunks}, the run metadata says (1, {self.attrs.get('token_chunk')!r})")
        for name, arr in coords.items():
            if not isinstance(arr, zarr.Array) or arr.ndim != 1 or arr.dtype != np.dtype(COORDS[name][0]):
                raise StoreError(f"{where}: {name} must be a 1-D {COORDS[name][0]} array, found {getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', None)}")

    # -- commit state ---------------------------------------------------------------------

    def _gone(self) -> str | None:
        """What became of the run since this view was opened, where it is no longer the run the
        view was opened on: ``"deleted"``, or ``"deleted and made again"`` (by another process,
        or another handle of this one); None where it is the same run. The view's cached
        metadata (run id, writers, chunks, dtype, the loss array's shape) are the old run's, so
        nothing is read through it: the new run's chunks failed the old checksums as 'moved ...
        or damaged', and a run without checksums was read under the old view's shape unsaid."""
        try:
            now = zarr.open_group(store=self._group.store, path=self._group.path, mode="r").attrs.get("tokdyn_run")
        except (FileNotFoundError, zarr.errors.GroupNotFoundError):
            return "deleted"
        except (KeyError, ValueError, TypeError, RecursionError):  # damaged metadata: the reads say it, as before
            return None
        if isinstance(now, Mapping) and _identity(now) != self._identity:
            return "deleted and made again"
        return None

    def _require_same_run(self) -> None:
        """:class:`StoreError` when the run is no longer the one this view was opened on; once
        per operation (:func:`~tokdyn.store.schema.once`)."""

        def check() -> None:
            gone = self._gone()
            if gone is not None:
                raise StoreError(f"run {self.name!r} in {self.store.url} was {gone} after this view of it was opened: "
                                 f"open it again (store.run({self.name!r}))")

        once(self, "checked", check)

    def _commit(self, j: int) -> _Commit:
        """The commit record of token range ``j``, read once in an operation of this view (its
        rows, then the checksums of what it read: 4.6 MB of JSON at 5,000 rows of 77 chunks)."""
        return once(self, ("commit", j), lambda: self._read_commit(j))

    def _read_commit(self, j: int) -> _Commit:
        try:
            a = zarr.open_group(store=self._group.store, path=f"{self._group.path}/commits/w{j}", mode="r").attrs
            if not is_int(a["rows"]):  # "3" or 2.5 read as a count of rows
                raise TypeError(f"rows is {a['rows']!r}, not a whole number")
            c = _Commit(int(a["rows"]), a.get("last_step"), int(a.get("nonfinite", 0)), dict(a.get("nonfinite_rows", {})),
                        dict(a.get("crc", {})), dict(a.get("coord_crc", {})))  # fmt: skip
            counted = sum(int(n) for n in c.nonfinite_rows.values())
            rows_named = {int(r) for r in c.nonfinite_rows}
        except (KeyError, ValueError, TypeError, RecursionError, FileNotFoundError, zarr.errors.GroupNotFoundError) as exc:
            raise StoreError(f"run {self.name!r}: commit record of token range {j} is unreadable ({damage(exc)})") from None
        if c.rows < 0 or (c.rows and not isinstance(c.last_step, int)):
            raise StoreError(f"run {self.name!r}: commit record of token range {j} is damaged (rows {c.rows}, last step {c.last_step!r})")
        # What is written together must agree: the non-finite counts, and no checksum of a row past
        # the count (a count that fell); a row without its checksum is an error when it is read.
        # (by arithmetic: sets of every row number grew to 22 GB for a damaged count of 10**20)
        if counted != c.nonfinite or not all(0 <= r < c.rows for r in rows_named) or (
            self._salt is not None and not (_row_keys(c.crc, c.rows) and (j != 0 or _row_keys(c.coord_crc, c.rows)))
        ):
            raise StoreError(
                f"run {self.name!r}: commit record of token range {j} is damaged (rows {c.rows}, non-finite {c.nonfinite} "
                f"against {counted} by row, checksums for {len(c.crc)} rows)"
            )
        return c

    @property
    def n_committed(self) -> int:
        """Rows complete in every token range: the rows readers see. Every reader reads it
        first, so each read checks once that the run is still the one this view was opened on
        (one small read; a writer checks its lock before each row)."""
        self._require_same_run()
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
            zarr_sync(self._group.store.delete(join(self._group.path, "commits", f"w{j}", LOCK_NAME)))

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

    @_operation
    def coord(self, name: str) -> np.ndarray:
        """Per-checkpoint array ``name`` (one of ``step``, ``axis_value``, ``tokens_seen``, ...)."""
        if not isinstance(name, str) or name not in COORDS:  # a list is unhashable: the same one error line
            raise InputError(f"unknown coordinate {name!r}; expected one of {', '.join(COORDS)}")
        return self._read_coord(name, self.n_committed)

    def _read_coord(self, name: str, k: int) -> np.ndarray:
        if not k:
            return np.empty(0, COORDS[name][0])
        if self._salt is None:
            out = self._read(lambda: self._group[name][:k], f"{name}[:{k}]")
        else:
            out = self._coords(k)[name]
        if name == "step" and (out.size != k or out.min() < 0 or np.any(np.diff(out) <= 0)):
            raise StoreError(f"run {self.name!r}: committed steps must be >= 0 and strictly increasing, found {out[:8].tolist()}...; the store is damaged")
        return out

    def _coords(self, k: int) -> dict[str, np.ndarray]:
        """Every per-checkpoint array of the first ``k`` rows, each row checked against the
        checksum its writer committed (bound to the row: a moved chunk is an error)."""
        rec = np.zeros(k, COORD_RECORD)
        for name in COORDS:
            values = self._read(lambda name=name: self._group[name][:k], f"{name}[:{k}]")
            if values.shape != (k,):
                raise StoreError(f"run {self.name!r}: {name} holds {values.size} rows where {k} are committed; the store is damaged")
            rec[name] = values
        committed = self._commit(0).coord_crc
        for r in range(k):
            if str(r) not in committed:
                raise StoreError(f"run {self.name!r}: the commit record of token range 0 holds no checksum for row {r}; the store is damaged")
            if position_crc(self._salt, "coords", (r,), rec[r : r + 1]) != committed.get(str(r)):
                found = _implausible(rec)
                raise StoreError(
                    f"run {self.name!r}: {found + '; ' if found else ''}the per-checkpoint values (step, axis_value, lr, ...) "
                    f"of row {r} are not the ones committed for it: a chunk of them was moved, swapped, left stale or damaged"
                )
        return {name: rec[name].copy() for name in COORDS}

    def _loss_checksums(self, rows, chunks: range) -> dict[tuple[int, int], int]:
        """{(row, token chunk): checksum} committed for those rows and chunks."""
        tc, out = self.token_chunk, {}
        for j, (a, b) in enumerate(self.writers):
            mine = range(a // tc, -(-b // tc))
            wanted = range(max(mine.start, chunks.start), min(mine.stop, chunks.stop))
            if not wanted:
                continue
            crc = self._commit(j).crc
            for r in rows:
                got = crc.get(str(r))
                if not isinstance(got, list) or len(got) != len(mine):
                    raise StoreError(f"run {self.name!r}: the commit record of token range {j} holds no checksums for row {r}; the store is damaged")
                out.update({(r, c): got[c - mine.start] for c in wanted})
        return out

    def _check_chunks(self, block: np.ndarray, rows, first: int, committed: dict | None = None) -> None:
        """Compare each chunk of ``block`` (rows ``rows``, whole token chunks from chunk ``first``)
        with the checksum committed for that position (``committed``: those of
        :meth:`_loss_checksums`, read by the caller once for many blocks). Runs made before
        these checksums pass."""
        if self._salt is None or not block.size:
            return
        tc = self.token_chunk
        chunks = range(first, first + -(-block.shape[1] // tc))
        committed = self._loss_checksums(rows, chunks) if committed is None else committed
        for i, r in enumerate(rows):
            for c in chunks:
                a = (c - first) * tc
                if position_crc(self._salt, "loss", (r, c), block[i, a : a + tc]) != committed[(r, c)]:
                    raise StoreError(
                        f"run {self.name!r}: loss chunk (row {r}, token chunk {c}) does not hold the values committed there; "
                        "it was moved, swapped, left stale or damaged"
                    )

    def _read(self, read, what: str, *, hint: str = "", loss_chunks=None):
        """Run a chunk read; damaged chunk data (cut short, overwritten) is a StoreError naming it
        (and ``hint``: what to do about it). The store's or the machine's trouble (an OSError, out
        of memory) is raised as it is: it is no damage. ``loss_chunks``: a function giving the (rows,
        token chunks) that a read of losses covered, called on failure only: the first damaged one
        is found and named."""
        try:
            return read()
        except NOT_DAMAGE:
            raise
        except Exception as exc:  # noqa: BLE001 - codecs raise RuntimeError, ValueError, TypeError...
            which = "a chunk of it is damaged"
            found = None if loss_chunks is None else self._damaged_loss_chunk(*loss_chunks())
            if found is not None:
                which = f"its chunk of row {found[0]}, token chunk {found[1]} is damaged"
            raise StoreError(f"run {self.name!r}: cannot decode {what} ({damage(exc)}); {which}"
                             f"{'. ' + hint if hint else ''}") from None

    def _damaged_loss_chunk(self, rows, chunks) -> tuple[int, int] | None:
        """The first loss chunk (row, token chunk) of ``rows`` x ``chunks`` that does not decode,
        read one at a time (after a read of them all failed: the message then names the chunk,
        not the slice that was asked for); None when each decodes alone."""
        tc = self.token_chunk
        for r in rows:
            for c in chunks:
                try:
                    self._loss[int(r), int(c) * tc : min(self.n_tokens, (int(c) + 1) * tc)]
                except NOT_DAMAGE:  # the read's own failure is then the one said
                    return None
                except Exception:  # noqa: BLE001 - as in _read
                    return int(r), int(c)
        return None

    @property
    def steps(self) -> np.ndarray:
        return self.coord("step")

    @property
    def axis_values(self) -> np.ndarray:
        return self.coord("axis_value")

    @_operation
    def losses(self, tokens: slice | None = None, rows: slice | None = None) -> np.ndarray:
        """Loss matrix ``[checkpoint, token]`` in nats (committed rows only; NaN = not finite)."""
        for name, value in (("rows", rows), ("tokens", tokens)):
            if value is not None and not isinstance(value, slice):
                raise InputError(f"{name} must be a slice or None, got {type(value).__name__} (losses_at takes index arrays)")
            if value is not None and not all(v is None or hasattr(v, "__index__") for v in (value.start, value.stop, value.step)):
                raise InputError(f"{name} must be a slice of integers, got {value!r}")  # slice(0, 2.0): numpy's rule
            if value is not None and value.step == 0:
                raise InputError(f"{name}: a slice step cannot be zero, got {value!r}")
        k = self.n_committed
        self._refresh(k)
        if rows is not None and range(k)[rows].step < 0:  # zarr reads ascending slices only: read those, reversed
            up = range(k)[rows][::-1]
            return self.losses(tokens=tokens, rows=slice(up.start, up.stop, up.step))[::-1].copy()
        rsl = slice(0, k) if rows is None else _clip(rows, k)
        tsl = slice(None) if tokens is None else tokens
        rows, idx = range(k)[rsl], range(self.n_tokens)[tsl]
        if not rows or not idx:
            return np.empty((len(rows), len(idx)), self.dtype)
        # Read whole chunks, so that each can be checked against its committed checksum.
        tc = self.token_chunk
        lo, hi = min(idx[0], idx[-1]), max(idx[0], idx[-1]) + 1
        ca, cb = lo // tc * tc, min(self.n_tokens, -(-hi // tc) * tc)
        block = self._read(lambda: self._loss[rsl, ca:cb], f"loss[{rsl.start}:{rsl.stop}, {ca}:{cb}]",
                           loss_chunks=lambda: (rows, range(ca // tc, -(-cb // tc))))
        self._check_nan_counts(block, rows)
        self._check_chunks(block, rows, ca // tc)
        if idx.step != 1:
            return block[:, np.asarray(idx) - ca]
        return block if (lo, hi) == (ca, cb) else block[:, lo - ca : hi - ca].copy()

    @_operation
    def losses_at(self, rows, tokens) -> np.ndarray:
        """Losses ``[len(rows), len(tokens)]`` of the given committed rows and tokens, read without
        the rest of their chunks' rows: ``losses()[np.ix_(rows, tokens)]``.

        Each of ``rows`` and ``tokens`` is a 1-D sequence of integer indices (any integer dtype,
        in any order, repeats allowed; negative ones are refused, not counted from the end) or a
        boolean mask of exactly ``n_committed`` rows / ``n_tokens`` tokens. Anything else is an
        :class:`InputError`."""
        k = self.n_committed
        rows = _indices("rows", rows, k, f"committed rows of run {self.name!r}")
        tokens = _indices("tokens", tokens, self.n_tokens, f"tokens of run {self.name!r}")
        if self._salt is None:
            # each row and token read once: a token asked for twice counted its recorded NaN twice,
            # "2 losses read as missing where 1 non-finite were recorded" (a run without checksums)
            ur, r_at = np.unique(rows, return_inverse=True)
            ut, t_at = np.unique(tokens, return_inverse=True)
            out = self._read(lambda: self._loss.get_orthogonal_selection((ur, ut)), f"loss[{ur.size} rows, {ut.size} tokens]",
                             loss_chunks=lambda: (ur.tolist(), np.unique(ut // self.token_chunk).tolist()))
            self._check_nan_counts(out, ur.tolist())
            return out[np.ix_(r_at.ravel(), t_at.ravel())]
        # Whole chunks, each checked, a few rows at a time (memory: 32 rows of one chunk). The
        # commit records (every row's checksums: 4.6 MB of JSON at 5,000 rows of 77 chunks) are
        # read once for the call: read for each 32 rows of each chunk, they were most of the time
        # (rows x rows x chunks: 18 tokens of 18 chunks at 2,000 rows took 43 s).
        out, tc = np.empty((rows.size, tokens.size), self.dtype), self.token_chunk
        chunk_of = tokens // tc
        found = np.unique(chunk_of).tolist()
        committed = self._loss_checksums(np.unique(rows).tolist(), range(found[0], found[-1] + 1)) if found else {}
        counted = functools.cache(lambda: self._nonfinite()[1])  # the non-finite counts by row, read at the first NaN
        for c in found:
            cols = np.flatnonzero(chunk_of == c)
            ca, cb = c * tc, min(self.n_tokens, (c + 1) * tc)
            for r0 in range(0, rows.size, 32):
                rr = rows[r0 : r0 + 32]
                block = self._read(lambda rr=rr: self._loss.get_orthogonal_selection((rr, slice(ca, cb))), f"loss[{rr.size} rows, {ca}:{cb}]",
                                   loss_chunks=lambda rr=rr, c=c: (np.unique(rr).tolist(), [c]))
                self._check_nan_counts(block, rr.tolist(), counted)
                self._check_chunks(block, rr.tolist(), c, committed)
                out[r0 : r0 + 32, cols] = block[:, tokens[cols] - ca]
        return out

    def _check_nan_counts(self, block: np.ndarray, rows: range, counted: Callable[[], dict] | None = None) -> None:
        """A missing chunk reads as NaN (the fill value). Every NaN a writer stored is counted in
        its commit record, so a row with more NaN than counted has lost chunk data. ``counted``:
        a function giving the counts by row (a caller checking many blocks reads them once). The
        caller has checked that the run is still this view's (:attr:`n_committed`)."""
        nan = nan_per_row(block)
        if not nan.any():
            return
        by_row = self._nonfinite()[1] if counted is None else counted()
        for i, r in enumerate(rows):
            if nan[i] > by_row.get(r, 0):
                raise StoreError(
                    f"run {self.name!r} row {r}: {int(nan[i])} losses read as missing where {by_row.get(r, 0)} non-finite "
                    "were recorded; chunk files of this row are missing from the store"
                )

    def to_dask(self, token_block: int | None = None):
        """The committed loss matrix as a dask array chunked ``(all rows, token_block)``."""
        if token_block is not None and not (is_int(token_block) and token_block > 0):
            raise InputError(f"token_block must be a whole number of tokens > 0 (or None: the run's token_chunk), got {token_block!r}")
        return self._to_dask(self.n_committed, token_block)

    def _to_dask(self, k: int, token_block: int | None = None):
        """:meth:`to_dask` of the first ``k`` committed rows (to_xarray's coordinates hold as many)."""
        import dask.array as da

        if k == 0:
            raise StoreError(f"run {self.name!r} has no committed rows")
        # Each block goes through losses(), so every chunk read is checked like any other read.
        return da.from_array(_CommittedLoss(self, k), chunks=(k, int(token_block or self.token_chunk)), name=False,
                             meta=np.empty((0, 0), self.dtype))  # fmt: skip

    @_operation
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
        if k:  # the data through the checked readers; xarray gives the names, dimensions and attributes
            parts["loss"] = parts["loss"].copy(data=self._to_dask(k))  # k rows, as the coordinates: a writer may commit meanwhile
            values = self._coords(k) if self._salt is not None else {n: self._read_coord(n, k) for n in COORDS}
            for n in COORDS:
                parts[n] = parts[n].copy(data=values[n])
        ds = xr.Dataset({"loss": parts["loss"]}, coords={n: parts[n] for n in COORDS})
        return ds.assign_attrs(n_committed=k, **{"tokdyn_run": self.attrs})

    @_operation
    def nonfinite(self) -> tuple[int, dict[int, int]]:
        """Total count of non-finite losses recorded (stored as NaN) and the count per row."""
        self._require_same_run()
        return self._nonfinite()

    def _nonfinite(self) -> tuple[int, dict[int, int]]:
        """:meth:`nonfinite` of a view its caller has checked is still of its run."""
        total, per_row = 0, {}
        for j in range(len(self.writers)):
            c = self._commit(j)
            total += c.nonfinite
            for r, n in c.nonfinite_rows.items():
                per_row[int(r)] = per_row.get(int(r), 0) + int(n)
        return total, per_row

    @_operation
    def info(self) -> dict:
        k = self.n_committed  # read the commit records once
        nonfinite, _ = self._nonfinite()
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
            "attrs": {k: v for k, v in self.attrs.items() if k not in ("writers", "integrity")},
            "fit": self.fit.summary(),
        }

    def writer(self, *, writer: int = 0, resume: bool = False) -> "RunWriter":
        """A :class:`RunWriter` appending rows for token range ``writer``."""
        self.store.require_writable()
        self._require_same_run()  # it would write the old run's checksums into the new one
        return RunWriter(self, writer, resume=resume)

    def __repr__(self) -> str:
        """The run, its committed rows and its fit's state (a few small reads, no loss read); a
        run gone or unreadable is said, not raised (a notebook shows the repr first)."""
        head = f"Run({self.name!r}, axis={self.axis}"
        try:
            with operation(self):  # the run's id read once for both
                k, fit = self.n_committed, self.fit.meta
        except TokdynError as exc:
            gone = self._gone()
            return f"{head}, tokens={self.n_tokens}: {f'{gone} after this view was opened' if gone else f'unreadable: {exc}'})"
        state = "none" if not fit else "incomplete" if not fit.get("complete") else (
            "complete" if fit.get("n_committed") == k else f"stale (made on {fit.get('n_committed')} rows)")
        return f"{head}, rows={k}, tokens={self.n_tokens}, fit={state})"


def nan_per_row(block: np.ndarray) -> np.ndarray:
    """The NaN in each row of a 2-D block of losses. float16 by its bits (exponent all ones,
    fraction not zero): numpy's isnan widens each half first, four times slower, and this
    check reads every loss a fit reads."""
    if block.dtype == np.float16:
        return np.count_nonzero((block.view(np.uint16) & 0x7FFF) > 0x7C00, axis=1)
    return np.count_nonzero(np.isnan(block), axis=1)


def _implausible(rec: np.ndarray) -> str | None:
    """What is visibly wrong with damaged per-checkpoint values (steps or axis values out of
    order, non-finite axis values), to say in the error; None when nothing is."""
    steps, av = rec["step"], rec["axis_value"]
    if steps.min() < 0 or np.any(np.diff(steps) <= 0):
        return f"committed steps must be >= 0 and strictly increasing, found {steps[:8].tolist()}"
    if not np.isfinite(av).all():
        return f"non-finite axis values at rows {np.flatnonzero(~np.isfinite(av))[:8].tolist()}"
    if np.any(np.diff(av) <= 0):
        i = int(np.argmin(np.diff(av) > 0))
        return f"axis values: expected strictly increasing values, got {float(av[i])} then {float(av[i + 1])} at rows {i} and {i + 1}"
    return None


class _CommittedLoss:
    """The committed loss matrix as an array dask can slice: every block is read by
    :meth:`Run.losses`, so each chunk is checked."""

    def __init__(self, run: Run, k: int) -> None:
        self.run, self.shape, self.dtype, self.ndim = run, (k, run.n_tokens), run.dtype, 2

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows, tokens = key
        return self.run.losses(tokens=tokens, rows=rows)


def _indices(name: str, value, n: int, what: str) -> np.ndarray:
    """``value`` as int64 indices into ``range(n)``: a 1-D sequence of integers (any integer
    dtype, any order, repeats kept) or a boolean mask of length ``n`` (numpy's rule: the places
    it is True). Floats, negative or out-of-range indices, scalars, nested lists and masks of
    another length are an :class:`InputError`, never cast (1.5 read as 1, True as index 1)."""
    if value is None or isinstance(value, (str, bytes)):
        raise InputError(f"{name} must be a 1-D array of indices or a boolean mask, got {type(value).__name__}")
    # (ragged nested lists, text, and a masked array with masked values, whose indices under the mask
    # were read, are refused here; a float, below, with its values)
    a = as_array(name, value, "biuf", "a 1-D array of indices or a boolean mask")
    if a.ndim != 1:
        raise InputError(f"{name} must be a 1-D array of indices or a boolean mask, got {a.ndim}-D ({a.shape})")
    if a.dtype == np.bool_:
        if a.size != n:
            raise InputError(f"{name}: a boolean mask must have one value for each of the {n} {what}, got {a.size}")
        return np.flatnonzero(a)
    if a.size == 0:
        return np.empty(0, np.int64)
    if a.dtype.kind not in "iu":  # numpy refuses float indices too; an object array is refused whole
        raise InputError(f"{name} must be integer indices (or a boolean mask), got {a.dtype} values such as {a[:4].tolist()}")
    lo, hi = (int(a.min()), int(a.max()))  # compared as Python ints: a uint64 past 2**63 does not wrap
    if lo < 0 or hi >= n:
        raise InputError(f"{name} must lie in [0, {n}), the {what}; got indices {lo}..{hi}")
    return a.astype(np.int64)


def _identity(meta: Mapping) -> tuple:
    """What tells a run from another made under its name later (a run's metadata is written once,
    when it is made): its random id; a run made before position checksums has none, and is told
    by its creation time (to the second) and the layout its readers act on."""
    integrity = meta.get("integrity")
    if isinstance(integrity, Mapping):
        return (integrity.get("run_id"),)
    return tuple(str(meta.get(k)) for k in ("created", "axis", "dtype", "token_chunk", "codec", "writers"))


def _clip(rows: slice, k: int) -> slice:
    start, stop, step = rows.indices(k)
    return slice(start, stop, step)


def _row_keys(keys, rows: int) -> bool:
    """Every key of a commit record's checksums names a row below ``rows`` ("0", "1", ...)."""
    return all(isinstance(k, str) and k.isascii() and k.isdigit() and str(int(k)) == k and int(k) < rows for k in keys)
