"""Appending rows to a run: one :class:`RunWriter` per token range, each row committed after
its data, under an exclusive writer lock (see ``tokdyn/store/store.py`` for the rules)."""

from __future__ import annotations

import asyncio
import json
import time
import zlib
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.core.sync import sync as zarr_sync

from ..errors import InputError, RunBusyError, RunExistsError, StepOrderError, StoreError
from .locks import LOCK_NAME, KeyLock, remove_stale_partials
from .schema import COORD_CHUNK, COORDS, join, position_crc

if TYPE_CHECKING:
    from .run import Run

__all__ = ["RunWriter", "coord_record", "COORD_RECORD", "run_meta_crc"]


class RunWriter:
    """Appends checkpoint rows to one token range of a run, committing each after its data.

    Not thread-safe: one writer per (run, token range) at a time. A fresh writer on a run that
    already has committed rows is refused unless ``resume=True``; a resumed writer skips steps
    at or before its last committed step (they are already stored) and continues after it.
    """

    def __init__(self, run: "Run", writer: int, *, resume: bool) -> None:
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
        self._crc, self._coord_crc = dict(c.crc), dict(c.coord_crc)  # {row: ...} of committed rows
        self._is_coord_writer = writer == 0
        self._arrays = {name: run._group[name] for name in COORDS} if self._is_coord_writer else {}
        self._coord_chunk_start: int | None = None
        self._coord_buffers: dict[str, np.ndarray] = {}
        what = f"run {run.name!r} token range {writer}"
        self._lock = KeyLock(run._group.store, join(run._group.path, "commits", f"w{writer}", LOCK_NAME), what=what,
                             if_gone=f"break the lock with tokdyn.open_store(url, mode='r+').run({run.name!r}).break_lock()")  # fmt: skip
        if self._lock.claim() != "self":  # no live process writes this range now: clear what a killed one left
            remove_stale_partials(run._group.store, run._group.path, self._owns)

    def _owns(self, stem: str) -> bool:
        """Whether key ``stem`` (under the run, without extension) is written by this token range:
        its loss chunks and commit record; writer 0 also the coordinates and the run's metadata."""
        parts = stem.split("/")
        if parts[:2] == ["loss", "c"]:
            tc = self.run.token_chunk
            return len(parts) == 4 and parts[3].isdigit() and self.token_start // tc <= int(parts[3]) < -(-self.token_stop // tc)
        if parts[0] == "commits":
            return len(parts) == 3 and parts[1] == f"w{self.index}"
        return parts[0] != "fit" and self._is_coord_writer

    # -- the writer lock ------------------------------------------------------------------

    def _check_owner(self) -> None:
        """Before touching data: the lock must still be ours and the commit record must still be
        where this writer left it; otherwise another writer has appended, and this one stops."""
        self._lock.check()
        c = self.run._commit(self.index)
        if c.rows != self.rows or c.last_step != self.last_step:
            raise RunBusyError(
                f"run {self.run.name!r} token range {self.index} was appended to by another writer "
                f"({c.rows} rows, last step {c.last_step}; this writer expected {self.rows}, {self.last_step}); it stops"
            )

    def release(self) -> None:
        """Give the lock back (the recorder does this on close). Idempotent."""
        self._lock.release()

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
        values = np.asarray(losses)
        if values.shape != (self.n_tokens,):
            raise InputError(f"losses must have shape ({self.n_tokens},) for tokens [{self.token_start}, {self.token_stop}), got {values.shape}")
        row = {"step": step, "axis_value": axis_value, "tokens_seen": tokens_seen, "lr": lr, "wall_time": wall_time,
               "ckpt_fingerprint": ckpt_fingerprint}  # fmt: skip
        return self.append_rows(values[None], [row], warn_nonfinite=warn_nonfinite)[0]

    def append_rows(self, losses: np.ndarray, rows: Sequence[Mapping[str, Any]], *, warn_nonfinite: bool = True) -> range:
        """Write several rows and commit them together; returns their row indices.

        ``losses`` is ``[k, n_tokens]``; ``rows`` holds, for each, the keywords of :meth:`append`
        (``step`` required; ``axis_value``, ``tokens_seen``, ``lr``, ``wall_time``,
        ``ckpt_fingerprint`` optional). One commit covers all ``k`` rows, written after their
        data: a crash leaves all of them or none. The zarr calls and the commit are paid once per
        call, not per row, which is most of a small row's cost.
        """
        values = np.asarray(losses)
        k = len(rows)
        if values.ndim != 2 or values.shape != (k, self.n_tokens):
            raise InputError(
                f"losses must have shape ({k}, {self.n_tokens}) for {k} rows of tokens [{self.token_start}, {self.token_stop}), "
                f"got {values.shape}"
            )
        if not k:
            return range(self.rows, self.rows)
        if values.dtype.kind not in "fiu":
            raise InputError(f"losses must be numbers, got dtype {values.dtype}")
        last = self.last_step
        for r in rows:
            step = int(r["step"])
            if step < 0:
                raise StepOrderError(f"step must be >= 0, got {step}")
            if last is not None and step <= last:
                raise StepOrderError(
                    f"step {step} is not after the last committed step {last} of run {self.run.name!r}; "
                    "rows are never overwritten or duplicated"
                )
            av = r.get("axis_value")
            if av is not None and not np.isfinite(float(av)):
                raise InputError(f"axis_value must be finite, got {av} for step {step}")
            last = step
        with np.errstate(over="ignore", invalid="ignore"):  # counted below: a loss beyond float16 is inf
            values = values.astype(self.run.dtype, copy=False)
        bad = ~np.isfinite(values)
        n_bad = bad.sum(axis=1).tolist()  # per row
        if any(n_bad):
            values = np.where(bad, np.nan, values)
        values = np.ascontiguousarray(values, dtype=self.run.dtype)  # the stored bytes, which the checksums cover
        if warn_nonfinite:
            for r, n in zip(rows, n_bad):
                if n:
                    warnings.warn(f"run {self.run.name!r} step {int(r['step'])}: {n} non-finite losses stored as NaN",
                                  RuntimeWarning, stacklevel=3)  # fmt: skip
        self._check_owner()
        k0 = self.rows
        self._ensure_capacity(k0 + k)
        writes = [(self.run._loss, (slice(k0, k0 + k), slice(self.token_start, self.token_stop)), values)]
        coords = []
        if self._is_coord_writer:
            now = time.time()
            for r in rows:
                g = r.get
                coords.append({
                    "step": int(r["step"]),
                    "axis_value": float(r["step"]) if g("axis_value") is None else float(g("axis_value")),
                    "tokens_seen": -1 if g("tokens_seen") is None else int(g("tokens_seen")),
                    "lr": np.nan if g("lr") is None else float(g("lr")),
                    "wall_time": now if g("wall_time") is None else float(g("wall_time")),
                    "ckpt_fingerprint": 0 if g("ckpt_fingerprint") is None else int(g("ckpt_fingerprint")),
                })  # fmt: skip
            writes += self._coordinate_writes(k0, coords)
        _write_concurrently(writes)
        for i, n in enumerate(n_bad):
            if n:
                self._nonfinite += n
                self._nonfinite_rows[str(k0 + i)] = n
        salt, checksums = self.run._salt, {}
        if salt is not None:  # checksums bound to position, committed with the row (docs/store.md)
            tc, c0 = self.run.token_chunk, self.token_start // self.run.token_chunk
            for i in range(k):
                self._crc[str(k0 + i)] = [position_crc(salt, "loss", (k0 + i, c0 + j), values[i, a : a + tc])
                                          for j, a in enumerate(range(0, self.n_tokens, tc))]  # fmt: skip
            checksums["crc"] = self._crc
            if self._is_coord_writer:
                for i, row in enumerate(coords):
                    self._coord_crc[str(k0 + i)] = position_crc(salt, "coords", (k0 + i,), coord_record(row))
                checksums["coord_crc"] = self._coord_crc
        # The commit: one atomic metadata write, after the data. (Not ``attrs.update``: zarr's
        # MutableMapping.update writes once per key, and a kill between two writes would leave
        # ``rows`` and ``last_step`` out of step; the crash test caught exactly that.)
        self._commit_group.update_attributes(
            {"rows": k0 + k, "last_step": last, "nonfinite": self._nonfinite, "nonfinite_rows": self._nonfinite_rows, **checksums}
        )
        self.rows, self.last_step = k0 + k, last
        return range(k0, k0 + k)

    def _coordinate_writes(self, k0: int, rows: list[dict]) -> list:
        """Whole-chunk writes of the per-checkpoint values of rows ``k0, k0 + 1, ...``.

        The writer keeps the current chunk of each coordinate in memory and rewrites it whole:
        zarr then skips the read-modify-write of a partial chunk (half the cost of a row). The
        rewrite carries the committed values unchanged and chunk writes are atomic, so committed
        rows stay safe."""
        writes = []
        for i, row in enumerate(rows):
            k = k0 + i
            c0 = (k // COORD_CHUNK) * COORD_CHUNK
            c1 = min(c0 + COORD_CHUNK, self.run.capacity)
            if self._coord_chunk_start != c0:  # a new chunk (or a resumed writer): load it once
                self._coord_buffers = {name: arr[c0:c1] for name, arr in self._arrays.items()}
                self._coord_chunk_start = c0
            for name, value in row.items():
                buf = self._coord_buffers[name]
                if len(buf) != c1 - c0:  # the arrays were resized inside this chunk
                    buf = np.concatenate([buf, np.full(max(0, c1 - c0 - len(buf)), COORDS[name][1], dtype=buf.dtype)])[: c1 - c0]
                buf[k - c0] = value
                self._coord_buffers[name] = buf
            if i == len(rows) - 1 or (k + 1) // COORD_CHUNK * COORD_CHUNK != c0:  # the chunk is complete for this call
                writes += [(self._arrays[name], (slice(c0, c1),), self._coord_buffers[name]) for name in row]
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


META_CHECKED = ("axis", "dtype", "token_chunk", "codec", "writers")  # what readers act on


def run_meta_crc(run_id: str, meta: dict) -> int:
    """The checksum of the run metadata readers act on (a flipped axis would relabel an export)."""
    return zlib.crc32(json.dumps([run_id, *(meta.get(k) for k in META_CHECKED)]).encode())


COORD_RECORD = np.dtype([(name, np.dtype(dt).newbyteorder("<")) for name, (dt, _) in COORDS.items()])


def coord_record(row: dict) -> np.ndarray:
    """The per-checkpoint values of one row as one record (what its coordinate checksum covers)."""
    rec = np.zeros(1, COORD_RECORD)
    for name in COORDS:
        rec[name] = row[name]
    return rec


def _write_concurrently(writes: list[tuple[zarr.Array, tuple, np.ndarray]]) -> None:
    """Do several array writes at once on zarr's event loop: the row's loss chunks and its
    per-checkpoint values overlap their I/O instead of queueing one after another."""

    async def write_all() -> None:
        await asyncio.gather(*(arr._async_array.setitem(sel, value) for arr, sel, value in writes))

    zarr_sync(write_all())


