"""Appending rows to a run: one :class:`RunWriter` per token range, each row committed after
its data, under an exclusive writer lock (see ``tokdyn/store/store.py`` for the rules)."""

from __future__ import annotations

import asyncio
import json
import operator
import time
import zlib
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.core.sync import sync as zarr_sync

from .._checks import as_array, log_tie
from ..errors import InputError, RunBusyError, RunExistsError, StepOrderError, StoreError
from .fit import GROUPS as FIT_GROUPS
from .locks import LOCK_NAME, KeyLock, remove_stale_partials
from .schema import COORD_CHUNK, COORDS, join, position_crc

if TYPE_CHECKING:
    from .run import Run

__all__ = ["RunWriter", "check_row", "coord_record", "COORD_RECORD", "run_meta_crc"]


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
        self.overflowed = 0
        """Finite losses this writer was given that the run's dtype cannot hold (beyond float16's
        65504, say): stored as NaN and counted as non-finite like the others. A source that
        appends with ``warn_nonfinite=False`` (NaN meaning "missing") reads this to say so."""
        self._crc, self._coord_crc = dict(c.crc), dict(c.coord_crc)  # {row: ...} of committed rows
        self._is_coord_writer = writer == 0
        self._arrays = {name: run._group[name] for name in COORDS} if self._is_coord_writer else {}
        self._coord_chunk_start: int | None = None
        self._last_av: tuple[int, float | None] | None = None  # (rows, axis value of the last of them)
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
        return parts[0] not in FIT_GROUPS and self._is_coord_writer

    # -- the writer lock ------------------------------------------------------------------

    def _check_owner(self) -> None:
        """Before touching data: the lock must still be ours and the commit record must still be
        where this writer left it; otherwise another writer has appended, and this one stops. A
        lock lost because the run or its store is gone is said as such (:meth:`gone`)."""
        try:
            self._lock.check()
        except RunBusyError:
            gone = self.gone()
            if gone is not None:
                raise StoreError(f"{gone}: this writer of run {self.run.name!r} stops, writing nothing into it") from None
            raise
        c = self.run._commit(self.index)
        if c.rows != self.rows or c.last_step != self.last_step:
            raise RunBusyError(
                f"run {self.run.name!r} token range {self.index} was appended to by another writer "
                f"({c.rows} rows, last step {c.last_step}; this writer expected {self.rows}, {self.last_step}); it stops"
            )

    def gone(self) -> str | None:
        """What became of this writer's run, where it is no longer there to write: its store
        deleted (or moved) or replaced by another, or the run deleted or made again (by another
        process, whose writer took the lock key over); None where it is. Its lock was then
        "released" or "held by" another process: the writer stopped as if another writer of its
        run had taken over, and a recorder said its rows were committed and readable."""
        store = self.run.store
        what = store._replaced()
        if what is not None:
            return f"{store.url} was {what}"
        what = self.run._gone()
        return None if what is None else f"run {self.run.name!r} in {store.url} was {what} after this writer opened it"

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
        values = _losses(losses)
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
        values = _losses(losses)
        k = len(rows)
        if values.ndim != 2 or values.shape != (k, self.n_tokens):
            raise InputError(
                f"losses must have shape ({k}, {self.n_tokens}) for {k} rows of tokens [{self.token_start}, {self.token_stop}), "
                f"got {values.shape}"
            )
        if not k:
            return range(self.rows, self.rows)
        # Every value of every row checked and converted before anything is written: a value the
        # store's arrays cannot hold is refused, never truncated (step 1.7 was stored as 1), and an
        # axis value not after the row before's is refused (step 2**53 + 1 rounds to 2**53's).
        last, last_av = self.last_step, self._last_axis_value()
        checked, tied = [], []
        for r in rows:
            row = check_row(r)
            step, av = row["step"], row["axis_value"]
            if last is not None and step <= last:
                raise StepOrderError(
                    f"step {step} is not after the last committed step {last} of run {self.run.name!r}; "
                    "rows are never overwritten or duplicated"
                )
            if self._is_coord_writer and last_av is not None and not av > last_av:
                raise StepOrderError(
                    f"axis value {av!r} of step {step} is not after {last_av!r}, the axis value of the row before in run "
                    f"{self.run.name!r}; a run's axis values strictly increase (the fit, import-npz and the axes read them so)"
                )
            if self._is_coord_writer and last_av is not None and log_tie([last_av, av]) is not None:
                tied.append((step, av, last_av))  # kept (a recording loses no row), and said once committed
            last, last_av = step, av
            checked.append(row)
        given = values
        with np.errstate(over="ignore", invalid="ignore"):  # counted below: a loss beyond float16 is inf
            values = values.astype(self.run.dtype, copy=False)
        bad = ~np.isfinite(values)
        n_bad = bad.sum(axis=1).tolist()  # per row
        overflowed = 0
        if any(n_bad):
            if given.dtype != values.dtype:  # finite where given, beyond the run's dtype: lost, not missing
                overflowed = int(np.count_nonzero(np.isfinite(given[bad])))
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
            coords = [{**row, "wall_time": now if row["wall_time"] is None else row["wall_time"]} for row in checked]
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
        if self._is_coord_writer:
            self._last_av = (self.rows, last_av)
        self.overflowed += overflowed
        if tied:  # after the commit: a warning turned error (-W error) loses no row; one per append, not per row
            step, av, before = tied[0]
            more = f" (and {len(tied) - 1} more row{'s' * (len(tied) > 2)} of this append likewise)" if len(tied) > 1 else ""
            warnings.warn(f"run {self.run.name!r}: axis value {av!r} of step {step} and {before!r} of the row before are one "
                          f"point on a fit's log axis (log10 = {float(np.log10(av))!r} both, in float64){more}; the rows are "
                          "kept, but tokdyn fit refuses this run: record rows at axis values a log scale tells apart",
                          RuntimeWarning, stacklevel=3)  # fmt: skip
        return range(k0, k0 + k)

    def _last_axis_value(self) -> float | None:
        """The axis value of the last committed row (writer 0, which writes them), else None."""
        if not self._is_coord_writer or not self.rows:
            return None
        if self._last_av is None or self._last_av[0] != self.rows:
            value = float(self._arrays["axis_value"][self.rows - 1])
            self._last_av = (self.rows, value if np.isfinite(value) else None)
        return self._last_av[1]

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
        only: a run of several writers keeps its capacity (it cannot grow again on resume).

        Only while this writer holds the run's lock: one whose lock another writer took over (a
        recorder of the run made again in the same process, the first then closed) shrank the
        arrays under the other, whose next rows were committed past their end, and the whole
        run read as "the commit records count 3 rows, but the loss array holds 2; the store is
        damaged". A run gone or made again is not this writer's to trim either."""
        if len(self.run.writers) > 1 or not self._lock.held():  # never resize a multi-writer run: it could not be resumed
            return
        k = self.run.n_committed
        if k and self.run.capacity != k:
            self.run._loss.resize((k, self.run.n_tokens))
            for arr in self._arrays.values():
                arr.resize((k,))


def _losses(losses: Any) -> np.ndarray:
    """A row's (or rows') losses as numbers, without a copy where numpy makes none: a torch tensor
    with grad or in bfloat16 is its values; a masked array with masked values is refused (they
    were stored as the values under the mask: a missing loss is NaN)."""
    return as_array("losses", losses, "fiu", "numbers")


def _whole(value: Any, name: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]``: an integer, or a float holding a whole number; else
    InputError (never truncated: ``int(1.7)`` is 1)."""
    if value is None or isinstance(value, (bool, np.bool_, str, bytes)):
        number = None
    else:
        try:
            number = operator.index(value)
        except TypeError:
            try:
                f = float(value)
            except (TypeError, ValueError, OverflowError):
                f = float("nan")
            number = int(f) if np.isfinite(f) and f.is_integer() else None
    if number is None or not lo <= number <= hi:
        top = {2**63 - 1: "2**63", 2**64 - 1: "2**64"}.get(hi, str(hi + 1))
        bottom = "0" if name == "step" else str(lo)  # a negative step is an order error (check_row)
        raise InputError(f"{name} must be a whole number in [{bottom}, {top}), got {value!r}")
    return number


def _real(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_, str, bytes)):
        raise InputError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be a number, got {value!r}") from None


def check_row(r: Mapping[str, Any]) -> dict:
    """The per-checkpoint values of one row, checked and converted to what the arrays hold
    (``wall_time`` None: now, filled in by the caller); InputError (StepOrderError for a
    negative step) for a value they cannot hold. A source that hands rows to a writer on
    another thread (the recorder) checks them with this first, in its caller's thread."""
    if not isinstance(r, Mapping) or r.get("step") is None:
        raise InputError(f"each row needs a step, got {r!r}")
    step = _whole(r["step"], "step", -(2**63), 2**63 - 1)
    if step < 0:  # an order error, however it was written (-1 or -1.0)
        raise StepOrderError(f"step must be >= 0, got {step}")
    av = r.get("axis_value")
    if av is None:  # the step itself; beyond 2**53 rounded, and where two steps then share an axis
        axis = float(step)  # value the writer refuses the second (axis values strictly increase)
    else:
        axis = _real(av, "axis_value")
        if not np.isfinite(axis):
            raise InputError(f"axis_value must be finite, got {av} for step {step}")
    g = r.get
    return {
        "step": step,
        "axis_value": axis,
        "tokens_seen": -1 if g("tokens_seen") is None else _whole(g("tokens_seen"), "tokens_seen", -1, 2**63 - 1),
        "lr": np.nan if g("lr") is None else _real(g("lr"), "lr"),
        "wall_time": None if g("wall_time") is None else _real(g("wall_time"), "wall_time"),
        "ckpt_fingerprint": 0 if g("ckpt_fingerprint") is None else _whole(g("ckpt_fingerprint"), "ckpt_fingerprint", 0, 2**64 - 1),
    }


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


