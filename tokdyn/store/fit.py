"""The fit results of a run: ``/runs/<name>/fit`` (docs/store.md, "Fit results").

Layout::

    /runs/<name>/fit            attrs["tokdyn_fit"]: the inputs the results were fitted on (rows,
                                n_committed, x, options, block_tokens), the fields and their
                                dtypes, code names, complete, backend, seconds, versions
    /runs/<name>/fit/<field>    [token], one array per result field, chunks (block_tokens,)
    /runs/<name>/fit/crc        uint32 [fit_block, field]: each block's checksums, bound to position
    /runs/<name>/fit/done       uint8 [fit_block]: nonzero once every field of that block is written
                                (1, or 2 + the index in ``fitted_by`` of the code that fitted it)
    /runs/<name>/fit_next       a refit of a complete fit, laid out as ``fit``: written beside the
                                fit it replaces, which readers go on reading, and moved in its
                                place once it is complete (:meth:`FitWriter.finish`)
    /runs/<name>/commits/fit.lock   held by the process running the fit

The store knows the layout, not the fitting: the fitter names the fields and their dtypes when
it starts (:meth:`FitResults.start`), hands blocks over as they are fitted
(:meth:`FitResults.write_block`), and says when it is done (:meth:`FitResults.finish`). A block
counts only once its ``done`` flag is written after its data, so a killed fit resumes with the
blocks not marked done. The whole fit, creation of the group included, runs under an exclusive
lock, so a second fit of the same run is refused instead of deleting the first one's group.

A refit of a complete fit is written into ``fit_next`` and swapped in when it finishes: a refit
that fails (a damaged loss chunk, a lost cluster) or is killed leaves the fit there was, whole
and read as before, and ``tokdyn fit`` with the refit's inputs resumes it. The swap removes the
old fit's metadata first, so that from then on readers take the complete refit
(:meth:`FitResults._group`), and the next fit finishes a swap that was killed
(:meth:`FitWriter._settle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync as zarr_sync
from zarr.storage import LocalStore

from .._checks import is_finite, is_int
from .._text import command_line, exact, one_line
from .._version import __version__, build
from ..errors import InputError, StoreError
from .locks import KeyLock, owner_state, remove_stale_partials
from .schema import NOT_DAMAGE, compressor, damage, folders, has_keys, join, jsonable, one_operation, position_crc, utc_now

if TYPE_CHECKING:
    from .run import Run

__all__ = ["FIT_SCHEMA_VERSION", "FitResults", "FitWriter"]

FIT_SCHEMA_VERSION = 1
GROUP = "fit"
NEXT = "fit_next"  # a refit of a complete fit, until it is complete and takes GROUP's place
GROUPS = (GROUP, NEXT)
META = "tokdyn_fit"
LOCK_KEY = ("commits", "fit.lock")


# a public read of a fit as one operation of its run's view: the run's id and commit records are
# read once for all its parts (a read of the fit's groups, its record and the run's rows each read them)
_one_operation = one_operation(lambda fit: fit._run)


class FitResults:
    """The stored fit of one run (``run.fit``): whether there is one, and its fields."""

    def __init__(self, run: "Run") -> None:
        self._run = run

    def _at(self, name: str) -> zarr.Group | None:
        """The group ``name`` of the run (``fit`` or ``fit_next``); None when there is none.
        A view of a run deleted (or made again) since it was opened reads no fit of it."""
        self._run._require_same_run()
        g = self._run._group
        try:
            return g[name]
        except KeyError:  # none, or its zarr.json is lost: like a creation that never finished (redone by the next fit)
            return None
        except (ValueError, TypeError, RecursionError) as exc:  # a fit group whose metadata is damaged
            command = command_line("tokdyn fit", self._run.store.url, ("--run", self._run.name), "--refit")
            raise StoreError(f"the fit of run {self._run.name!r} is damaged: {damage(exc)}; refit it: `{command}`") from None

    def _staged(self) -> zarr.Group | None:
        """``fit_next``, a refit written beside the fit (None: none, or not a readable group: the
        next fit removes it)."""
        try:
            g = self._at(NEXT)
        except StoreError:
            return None
        return g if isinstance(g, zarr.Group) else None

    def _group(self) -> zarr.Group | None:
        """The fit readers read: ``fit``; where it is gone, a swap was killed after it removed the
        old fit's metadata, and the complete refit in ``fit_next`` is the fit."""
        g = self._at(GROUP)
        if g is None:
            staged = self._staged()
            if staged is not None and _meta_of(staged).get("complete"):
                return staged
        return g

    @property
    @_one_operation
    def meta(self) -> dict:
        """``attrs["tokdyn_fit"]`` of the fit group ({} when there is none)."""
        return _meta_of(self._group())

    @property
    @_one_operation
    def exists(self) -> bool:
        """Whether a fit was started (complete or not)."""
        return bool(self.meta)

    @property
    @_one_operation
    def complete(self) -> bool:
        """Whether a fit finished and still matches the run's committed rows."""
        return _current(self.meta, self._run)

    @property
    @_one_operation
    def staged_meta(self) -> dict:
        """The record of a refit written beside the fit and not yet swapped in (``fit_next``: a
        refit running, or one stopped, which a fit on its inputs resumes); {} when there is none."""
        return _meta_of(self._staged())

    @_one_operation
    def summary(self) -> dict:
        """Where the run's fit stands, as ``tokdyn info`` shows it (JSON values):

        - ``fit``: the fit readers read (None: none); ``refit``: a refit written beside it and
          not yet in its place (None: none). Each is :func:`_state` of its group: ``complete``,
          ``current`` (complete and made on the run's committed rows), ``rows`` fitted of
          ``n_committed``, ``blocks_done`` of ``blocks`` (None for a complete fit whose done
          flags cannot be read: no reader of it reads them), ``axis_min``, ``options`` (the
          fit's :class:`~tokdyn.fit.FitOptions` as stored), ``backend``, ``device``,
          ``seconds``, ``created``, ``finished``, ``tokdyn_version``, ``fit_id``; or
          ``{"error": ...}`` (with ``axis_min`` and ``options`` as stored) where its record, or
          an unfinished fit's done flags, cannot be read.
        - ``lock``: the holder of the fit lock (``pid``, ``host``, ``since``, and ``state``:
          ``alive``, ``unknown`` on another machine, ``dead`` for a fit that was killed: the next
          fit takes its lock over), None when there is no lock.

        Reads each group's record and its done flags (one byte per block): a few small reads."""
        run, lock = self._run, self._holder()
        try:
            g = self._group()
        except StoreError as exc:
            g, fit = None, {"error": str(exc)}
        else:
            fit = _state(run, g) if _meta_of(g) else None
            # a fit group without its record (no zarr.json, or none naming a fit), and no live fit
            # making it: damaged, or a fit killed while it created the group (the record is
            # written last). Readers take the run as not fitted; "none" would hide what is there.
            running = lock is not None and lock["state"] != "dead"
            if fit is None and not running and has_keys(run._group.store, join(run._group.path, GROUP) + "/"):
                command = command_line("tokdyn fit", run.store.url, ("--run", run.name))
                fit = {"error": f"the fit group holds no fit record ({GROUP}/zarr.json damaged, or a fit killed while it "
                                f"created the group): readers take the run as not fitted, and `{command}` fits it again"}  # fmt: skip
        # a refit beside the fit; not when it is the fit readers read (a move cut short after it
        # removed the old fit's record) or a copy already in place whose source is not yet removed.
        # A group with no record (its creation cut short) is no fit, as readers take it.
        staged = self._staged()
        staged_meta = _meta_of(staged)
        beside = bool(staged_meta) and staged_meta.get("fit_id") != _meta_of(g).get("fit_id")
        return {"fit": fit, "refit": _state(run, staged) if beside else None, "lock": lock}

    def _lock(self) -> KeyLock:
        """The run's fit lock, held by the process running a fit."""
        run = self._run
        return KeyLock(run._group.store, join(run._group.path, *LOCK_KEY), what=f"the fit of run {run.name!r}",
                       if_gone="delete the key commits/fit.lock of the run and try again")  # fmt: skip

    def _holder(self) -> dict | None:
        """The fit lock's holder with its ``state`` (:func:`owner_state`); None when unheld."""
        holder = self._lock().holder()
        if holder is None:
            return None
        return {**{k: holder.get(k) for k in ("pid", "host", "since")}, "state": owner_state(holder)}

    @contextlib.contextmanager
    def unchanged(self) -> Iterator[dict]:
        """Several reads of the fit as reads of one fit: yields its record, and raises
        :class:`StoreError` on leaving when the fit was replaced meanwhile (a refit that finished:
        the fit's id changed), so that what was read of two fits is not used together. A reader
        that reads a fit more than once (its record, its options, its rows, slices of its
        fields) reads inside it."""
        meta = self.meta
        yield meta
        self._require_unchanged(meta)

    def _require_unchanged(self, meta: Mapping) -> None:
        """:class:`StoreError` when the run's fit is no longer the one of record ``meta``."""
        if self.meta.get("fit_id") != meta.get("fit_id"):
            raise StoreError(f"the fit of run {self._run.name!r} was replaced while it was being read (a refit finished "
                             "meanwhile), so what was read would mix two fits; run the command again")  # fmt: skip

    @_one_operation
    def check(self, *, current: bool = True) -> dict:
        """The fit's metadata; :class:`StoreError` saying what to run when there is no complete,
        current fit (with ``current=False``, a complete fit of rows the run has since added to
        will do)."""
        return self._checked(self.meta, current)

    def _checked(self, meta: dict, current: bool) -> dict:
        """:meth:`check` of the record ``meta``."""
        r = self._run
        if not meta:
            raise StoreError(f"run {r.name!r} has not been fitted; run `{command_line('tokdyn fit', r.store.url, ('--run', r.name))}` first")
        if not meta.get("complete"):
            raise StoreError(f"the fit of run {r.name!r} is incomplete (interrupted?); `{self._fit_command(meta)}` "
                             "finishes it (`tokdyn info` names the command for a fit made on fewer rows or in Python)")
        bad = _damaged_record(meta)
        if bad:
            raise StoreError(f"the fit record of run {r.name!r} is damaged ({bad}); refit it: "
                             f"`{command_line('tokdyn fit', r.store.url, ('--run', r.name), '--refit')}`")  # fmt: skip
        if current and meta.get("n_committed") != r.n_committed:
            raise StoreError(
                f"the fit of run {r.name!r} was made on {meta.get('n_committed')} rows; the run now has {r.n_committed}. "
                f"Refit it: `{self._refit_command(meta)}`"
            )
        return meta

    def refusal(self, meta: Mapping, group: zarr.Group | None = None) -> str | None:
        """The line every reader refuses the complete fit of record ``meta`` (in fit group
        ``group``, the run's fit by default) with, made on whatever rows (a stale fit is said
        apart), or None where they read it: a damaged entry (:meth:`check`), rows and x that do
        not fit the run (:func:`recorded_inputs`), or ``fields`` that are not the result arrays the
        group holds (a reader asking for ``mu`` was told there is none, or met checksums in
        another order). What ``tokdyn info`` says of such a fit, which it called complete
        (``"options": null``) while every reader refused it."""
        try:
            recorded_inputs(self._run, self._checked(dict(meta), current=False))
            g = self._group() if group is None else group
            named = meta.get("fields")
            # the group's folders, listed without parsing each array's metadata (one damaged is
            # said by the reads that open it, in one line: parsing it here raised its error raw)
            if named and g is not None and set(named) != set(folders(g.store, g.path)) - {"done", "crc"}:
                raise StoreError(f"the fit of run {self._run.name!r} is damaged: its record's fields are not the result arrays "
                                 "it holds; refit it (tokdyn fit --refit)")  # fmt: skip
        except StoreError as exc:
            return str(exc)
        return None

    @property
    @_one_operation
    def fields(self) -> list[str]:
        """Names of the stored result fields."""
        return _fields(self.meta, self._group())

    @_one_operation
    def options(self) -> dict:
        """The options the fit was made with, as stored (a dict of JSON values)."""
        return dict(self.check().get("options", {}))

    @_one_operation
    def read(self, fields: Sequence[str] | None = None, *, current: bool = True) -> dict[str, np.ndarray]:
        """The stored fit as a dict of ``[token]`` arrays (every field by default).

        Raises :class:`StoreError` when the run has not been fitted completely, or (unless
        ``current=False``: the fitting job's own summary, while a recorder goes on appending) has
        grown since.
        """
        return self._read_range(0, self._run.n_tokens, fields, current)

    @_one_operation
    def read_tokens(self, start: int, stop: int, fields: Sequence[str] | None = None, *, current: bool = True) -> dict[str, np.ndarray]:
        """The stored fit of tokens ``[start, stop)`` only, as :meth:`read` gives it for all of
        them (every field by default): a reader that goes over a large fit a slice at a time
        holds one slice of the fields it asks for. The fit blocks the slice lies in are read
        whole and each is checked against its committed checksum, as :meth:`read` checks them.
        """
        return self._read_range(start, stop, fields, current)

    def _read_range(self, start: int, stop: int, fields: Sequence[str] | None, current: bool) -> dict[str, np.ndarray]:
        """:meth:`read` and :meth:`read_tokens`: the fields of tokens ``[start, stop)``, each fit
        block read checked against its committed checksum."""
        if fields is not None and (isinstance(fields, (str, bytes)) or not isinstance(fields, Iterable)):
            raise InputError(f"fields must be a list of fit field names (or None: all), got {fields!r}")  # "mu" is not ["m", "u"]
        if not (is_int(start) and is_int(stop)):  # 1.5 is no token, True no index: never cut to 1
            raise InputError(f"tokens [{start!r}, {stop!r}) must be whole numbers of tokens")
        g = self._group()  # looked up once: the record and the arrays read are one fit's, also across a swap
        meta = self._checked(_meta_of(g), current)
        stored = _fields(meta, g)
        names = stored if fields is None else list(fields)
        unknown = [f for f in names if not isinstance(f, str) or f not in stored]
        if unknown:
            raise InputError(f"unknown fit fields {unknown}; expected some of {stored}")
        names = list(dict.fromkeys(names))  # a field named twice is read once
        n = self._run.n_tokens
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= n:
            raise InputError(f"tokens [{start}, {stop}) must lie in [0, {n}), the tokens of run {self._run.name!r}")
        salt = self._salt(meta)
        whole = (start, stop) == (0, n)  # read's errors name the field alone, a slice's its tokens too
        if salt is None:  # fits made before position-bound checksums have none to compare
            return {name: self._run._read(lambda name=name: g[name][start:stop], f"fit/{name}" + ("" if whole else f"[{start}:{stop}]"))
                    for name in names}  # fmt: skip
        block = meta.get("block_tokens")
        if not is_int(block) or block <= 0:  # the blocks the checksums are by
            raise StoreError(f"the fit of run {self._run.name!r} is damaged: its record's block_tokens is "
                             f"{_value_text(block, 40)}; refit it: `{self._refit_command(meta)}`")  # fmt: skip
        block = int(block)
        b0, b1 = start // block, -(-stop // block)
        a0, a1 = b0 * block, min(n, b1 * block)
        try:  # a fit swapped in under this read (its group's path now holds the refit) is said as such, not as damage
            crc = self._array(g, "crc", meta)
            if crc.shape != (-(-n // block), len(stored)):
                raise StoreError(f"the fit of run {self._run.name!r}: fit/crc has shape {crc.shape}; the fit is damaged, "
                                 f"refit it: `{self._refit_command(meta)}`")  # fmt: skip
            committed = self._run._read(lambda: crc[b0:b1], "fit/crc", hint=self._repair_hint())
            out = {}
            for name in names:
                array = self._array(g, name, meta)
                values = self._run._read(lambda: array[a0:a1], f"fit/{name}" + ("" if whole else f"[{a0}:{a1}]"),
                                         hint=self._repair_hint())  # fmt: skip
                f = stored.index(name)
                for b, a in zip(range(b0, b1), range(0, a1 - a0, block)):
                    if values.shape != (a1 - a0,) or position_crc(salt, f"fit/{name}", (b,), values[a : a + block]) != committed[b - b0, f]:
                        raise StoreError(
                            f"the fit of run {self._run.name!r}: chunk {b} of fit/{name} does not hold the results written "
                            f"there; it was moved, swapped, left stale or damaged. {self._repair_hint()}"
                        )
                out[name] = values if (a0, a1) == (start, stop) else values[start - a0 : stop - a0].copy()
        except StoreError:
            self._require_unchanged(meta)
            raise
        return out

    def _array(self, g: zarr.Group, name: str, meta: Mapping) -> zarr.Array:
        """Array ``name`` of fit group ``g``; one that is gone or whose metadata cannot be read is
        a StoreError naming the refit (a repair fits blocks again into the arrays there are)."""
        try:
            array = g[name]
        except NOT_DAMAGE:
            raise
        except Exception as exc:  # noqa: BLE001 - a missing key, undecodable metadata
            array, why = None, damage(exc)
        else:
            why = "it is not an array"
        if not isinstance(array, zarr.Array):
            raise StoreError(f"the fit of run {self._run.name!r} is damaged: fit/{name} cannot be read ({why}); "
                             f"refit it: `{self._refit_command(meta)}`")  # fmt: skip
        return array

    def _refit_command(self, meta: Mapping) -> str:
        """The command that refits the run with the window and the options (those a flag sets)
        of the fit of record ``meta``."""
        return self._fit_command(meta, "--refit")

    def _fit_command(self, meta: Mapping, *more: str) -> str:
        """``tokdyn fit`` of the run with the window and the options (those a flag sets) of the
        fit of record ``meta``, and ``more``."""
        window = meta.get("axis_min")
        window = [("--axis-min", exact(window))] if is_finite(window) else []
        flags, _, _ = fit_flags(meta.get("options"), self._run.store.probe.tokenizer.get("vocab_size"))
        return command_line("tokdyn fit", self._run.store.url, ("--run", self._run.name), *window, *flags.split(), *more)

    def _repair_hint(self) -> str:
        """The command that fits a checksummed fit's damaged blocks again, shell-quoted."""
        command = command_line("tokdyn fit", self._run.store.url, ("--run", self._run.name), "--repair")
        return f"Fit the damaged blocks again: `{command}` (or all of it: --refit)"

    def _salt(self, meta: Mapping) -> str | None:
        """What this fit's checksums are bound to: the run's id and this fit's (None: a fit made
        before position-bound checksums)."""
        fit_id = meta.get("fit_id")
        return None if fit_id is None or self._run._salt is None else f"{self._run._salt}/{fit_id}"

    def write_block(self, block: int, start: int, values: Mapping[str, np.ndarray], *, fit_id: str | None = None) -> None:
        """Write the results of tokens ``[start, start + len)``, then mark ``block`` done (its
        commit). Called by the workers of a :class:`FitWriter`'s job, in any process.

        ``fit_id`` is the job's (:attr:`FitWriter.fit_id`): a block of a fit that has since been
        replaced (a worker of a failed or killed job still running when a refit started) is
        refused with a :class:`StoreError` instead of being written into the new fit, and is not
        marked done if the fit is replaced while it is written. The done flag names the code that
        wrote the block, this process's (:func:`_done_flag`). The block goes into the fit of that
        id: the run's, or the refit being written beside it (``fit_next``); without ``fit_id``,
        into the refit where one is being written.
        """
        where, g = self._written(fit_id)
        if g is None:
            raise StoreError(f"run {self._run.name!r} has no fit group to write into; it was removed while fitting")
        meta = _meta_of(g)
        if fit_id is not None:
            self._require_fit(meta, fit_id, block)
        fields = _fields(meta, g)
        if set(values) != set(fields):
            raise InputError(f"a fit block must hold the fields {sorted(fields)}, got {sorted(values)}")
        for name, v in values.items():
            g[name][start : start + len(v)] = v
        salt = self._salt(meta)
        if salt is not None:  # the block's checksums, bound to its position, before its done flag
            dtypes = meta.get("fields") or {}
            g["crc"][block, :] = [position_crc(salt, f"fit/{name}", (block,), np.asarray(values[name], dtype=dtypes.get(name)))
                                  for name in fields]  # fmt: skip
        if fit_id is not None:  # replaced while writing: the new fit fits (and overwrites) this block itself
            self._require_fit(_meta_of(self._at(where)), fit_id, block)
        g["done"][block] = _done_flag(meta)

    def _written(self, fit_id: str | None) -> tuple[str, zarr.Group | None]:
        """The group a block of fit ``fit_id`` goes into, by name and as opened: the staged
        refit's when it is that fit (or, without an id, when there is one), otherwise the run's
        fit (whose id the block's is then checked against)."""
        staged = self._staged()
        if staged is not None and (fit_id is None or _meta_of(staged).get("fit_id") == fit_id):
            return NEXT, staged
        return GROUP, self._at(GROUP)

    def _require_fit(self, meta: Mapping, fit_id: str, block: int) -> None:
        if meta.get("fit_id") != fit_id:
            raise StoreError(f"the fit of run {self._run.name!r} was replaced while block {block} was being fitted; "
                             "its results, the old fit's, are not taken into the new one")  # fmt: skip

    def writer(
        self,
        inputs: Mapping[str, Any],
        fields: Mapping[str, str],
        *,
        n_blocks: int,
        refit: bool = False,
        labels: Mapping[str, Any] | None = None,
    ) -> "FitWriter":
        """Take the run's fit lock and prepare the fit group for ``inputs``: resumed when the
        stored inputs match, made anew when there is none (or an unfinished creation) or when
        ``refit``; a fit on other inputs without ``refit`` is a :class:`StoreError`."""
        self._run.store.require_writable()
        return FitWriter(self, dict(inputs), dict(fields), n_blocks=int(n_blocks), refit=refit, labels=dict(labels or {}))


def _unrecorded(meta: Mapping, inputs: Mapping) -> list[str]:
    """The inputs of a fit (and options) that ``meta``, a stored fit's, does not record at all:
    it was made by an earlier tokdyn, before they existed."""
    out = [k for k in inputs if k not in meta]
    options, stored = inputs.get("options"), meta.get("options")
    if isinstance(options, Mapping) and isinstance(stored, Mapping):
        out += [f"options.{k}" for k in options if k not in stored]
    return out


# A block's done flag: 0 not done; DONE_UNKNOWN done by code not recorded; FIRST_CODE + i done by
# the code fitted_by[i] (a uint8: the codes past LAST_FLAG are not recorded).
DONE_UNKNOWN, FIRST_CODE, LAST_FLAG = 1, 2, 255


def _done_flag(meta: Mapping) -> int:
    """The done flag of a block this process writes: the one naming its build (`_version.build`)
    in the fit's ``fitted_by`` (the job put it there), DONE_UNKNOWN where the list does not hold
    it (a writer that is not the fit's job, of other code) or past LAST_FLAG."""
    fitted_by, now = meta.get("fitted_by"), build()
    if not isinstance(fitted_by, list) or now not in fitted_by:
        return DONE_UNKNOWN
    flag = FIRST_CODE + fitted_by.index(now)
    return flag if flag <= LAST_FLAG else DONE_UNKNOWN


def _flag_code(flag: int, fitted_by: list):
    """The build a done flag names in ``fitted_by`` (None: code not recorded)."""
    return fitted_by[flag - FIRST_CODE] if FIRST_CODE <= flag < len(fitted_by) + FIRST_CODE else None


def _fitted_by_text(builds: list) -> str:
    """Codes of ``fitted_by`` for a message: each trimmed; None is code that was not recorded."""
    return ", ".join("code not recorded" if b is None else f"tokdyn {one_line(b, 40)}"
                     for b in builds[:4]) + (f" and {len(builds) - 4} more" if len(builds) > 4 else "")  # fmt: skip


class FitWriter:
    """The job side of a fit: holds the fit lock from preparation to :meth:`finish` (use it as a
    context manager). Blocks are written with :meth:`FitResults.write_block`.

    It writes into the run's ``fit`` group, or, for a refit of a complete fit, into ``fit_next``
    beside it (:attr:`staged`), which :meth:`finish` moves in its place."""

    def __init__(self, results: FitResults, inputs: dict, fields: dict, *, n_blocks: int, refit: bool, labels: dict) -> None:
        run = results._run
        self.results = results
        self._lock = results._lock()
        self._name = GROUP  # the group this fit writes: fit, or fit_next for a refit of a complete fit
        if self._lock.claim() != "self":  # no live fit: clear what a killed one left
            remove_stale_partials(run._group.store, run._group.path,
                                  lambda stem: stem.split("/", 1)[0] in GROUPS or stem == "commits/fit")  # fmt: skip
        try:
            self._settle()
            self._prepare(jsonable(inputs, "fit inputs"), fields, n_blocks, refit, jsonable(labels, "fit labels"))
        except BaseException:
            self._lock.release()
            raise

    @property
    def staged(self) -> bool:
        """Whether this fit is a refit written beside the complete fit it replaces."""
        return self._name == NEXT

    def _g(self) -> zarr.Group | None:
        return self.results._at(self._name)

    def _meta(self) -> dict:
        return _meta_of(self._g())

    def _settle(self) -> None:
        """Before anything else, holding the lock: finish what a killed refit left. A complete
        ``fit_next`` is swapped in (killed before or during its swap), or removed where it was
        already copied into place; one that is not a readable group with its metadata (its creation,
        or its removal after a copy, killed) is removed. An unfinished one is kept for
        :meth:`_prepare`."""
        run = self.results._run
        store, path = run._group.store, join(run._group.path, NEXT)
        staged = self.results._staged()
        meta = _meta_of(staged)
        if not meta:  # none, or its creation never finished (no metadata yet): there is no refit to resume
            if has_keys(store, path + "/"):
                zarr_sync(store.delete_dir(path))
            return
        if not meta.get("complete"):
            return
        try:
            current = self.results._at(GROUP)
        except StoreError:  # the old fit's metadata damaged: the refit replaces it all the same
            current = None
        if current is not None and _meta_of(current).get("fit_id") == meta.get("fit_id"):
            zarr_sync(store.delete_dir(path))  # copied into place, its source not yet removed
        else:
            self._swap()

    def _swap(self) -> None:
        """Put the complete refit in ``fit_next`` in the place of ``fit``. The old fit's
        metadata goes first: from then on readers read the refit (:meth:`FitResults._group`),
        and a kill at any point leaves one complete fit that the next fit's :meth:`_settle`
        swaps in. A local store renames the folder; other stores copy every key, the group's
        metadata last, then remove the source."""
        run = self.results._run
        store, base = run._group.store, run._group.path
        old, new = join(base, GROUP), join(base, NEXT)
        self._name = GROUP  # from the first change on, the old fit is no longer kept
        zarr_sync(store.delete(join(old, "zarr.json")))
        zarr_sync(store.delete_dir(old))
        root = getattr(store, "root", None)
        if isinstance(store, LocalStore) and root is not None:
            os.replace(os.path.join(root, new), os.path.join(root, old))
        else:
            zarr_sync(_copy_keys(store, new, old))
            zarr_sync(store.delete_dir(new))

    def _prepare(self, inputs: dict, fields: dict, n_blocks: int, refit: bool, labels: dict) -> None:
        run = self.results._run
        staged = self.results._staged()
        if staged is not None and not refit and _same_inputs(_meta_of(staged), inputs, fields):
            self._name = NEXT  # a refit that was stopped: resumed beside the fit it replaces
            self._check_arrays(fields, n_blocks)
            return
        try:
            meta = self.results.meta
        except StoreError:  # the fit's metadata damaged: a refit is made in its place; a fit says so
            if not refit:
                raise
            meta = {}
        unrecorded = _unrecorded(meta, inputs) if meta else []
        if meta and not meta.get("complete") and ("fit_id" not in meta or unrecorded):
            refit = True  # an unfinished fit of an earlier tokdyn (no checksums, or inputs it did not record): redone whole
        if meta and not refit:
            if _same_inputs(meta, inputs, fields):
                self._check_arrays(fields, n_blocks)
                return  # resume
            if unrecorded:
                raise StoreError(
                    f"run {run.name!r} has a fit made by an earlier tokdyn (it records no {', '.join(unrecorded)}); "
                    "pass refit=True (--refit) to fit it again with this one"
                )
            if meta.get("n_committed") != inputs.get("n_committed"):
                what = f"other rows ({meta.get('n_committed')} rows then, {inputs.get('n_committed')} now)"
            elif meta.get("axis_min") != inputs.get("axis_min"):
                then, now = (_value_text(meta.get("axis_min")), _value_text(inputs.get("axis_min")))
                resume = "no axis_min (no --axis-min)" if then == "none" else f"axis_min={then} (--axis-min {then})"
                raise StoreError(
                    f"run {run.name!r} already has a fit made with another axis_min ({then} then, {now} now); "
                    f"pass {resume} to resume it, or refit=True (--refit) to replace it"
                )
            elif (meta.get("backend"), meta.get("device")) != (inputs.get("backend"), inputs.get("device")):
                then, now = (" on ".join(str(v) for v in (d.get("backend"), d.get("device")) if v is not None)
                             or "not recorded" for d in (meta, inputs))  # fmt: skip
                raise StoreError(
                    f"run {run.name!r} already has a fit made on another backend ({then} then, {now} now); "
                    f"pass that backend (--backend, --device) to resume it, or refit=True (--refit) to replace it"
                )
            else:
                options = _differences(meta.get("options"), inputs.get("options"))
                if options:
                    raise StoreError(
                        f"run {run.name!r} already has a fit made with other options ({options}); pass the options it "
                        "was made with to resume it, or refit=True (--refit) to replace it"
                    )
                what = ("other result fields (another tokdyn version's)" if meta.get("fields") != fields
                        else f"other inputs ({_differences(meta, inputs, inputs) or 'as stored'})")  # fmt: skip
            raise StoreError(f"run {run.name!r} already has a fit made with {what}; pass refit=True (--refit) to replace it")
        parent = run._group
        # A refit of a complete fit is written beside it (fit_next); any other fit replaces what
        # is there: a refit of an unfinished fit, or a creation that never finished (we hold the lock).
        self._name = NEXT if refit and meta.get("complete") else GROUP
        for name in dict.fromkeys((NEXT, self._name)):
            if has_keys(parent.store, join(parent.path, name) + "/"):
                zarr_sync(parent.store.delete_dir(join(parent.path, name)))
        n, block = run.n_tokens, int(inputs["block_tokens"])
        g = parent.create_group(self._name)
        for name, dt in fields.items():
            fill = np.nan if np.dtype(dt).kind == "f" else 0
            g.create_array(name, shape=(n,), chunks=(block,), dtype=dt, fill_value=fill, dimension_names=("token",),
                           compressors=compressor())  # fmt: skip
        g.create_array("crc", shape=(n_blocks, len(fields)), chunks=(1, len(fields)), dtype="uint32", fill_value=0,
                       dimension_names=("fit_block", "field"), compressors=compressor())  # fmt: skip
        g.create_array("done", shape=(n_blocks,), chunks=(1,), dtype="uint8", fill_value=0, dimension_names=("fit_block",),
                       compressors=compressor())  # fmt: skip
        # Written last: a group without it is an unfinished creation, redone by the next fit.
        g.update_attributes({META: {**inputs, "fields": fields, **labels, "fit_id": uuid.uuid4().hex, "schema_version": FIT_SCHEMA_VERSION,
                                    "tokdyn_version": __version__, "fitted_by": [], "created": utc_now(),
                                    "complete": False}})  # fmt: skip

    def _check_arrays(self, fields: dict, n_blocks: int) -> None:
        """Before resuming: every array of the fit is there with its shape, dtype and chunks, so
        blocks marked done are not taken as written over a field that was deleted or replaced (a
        resume would otherwise report success over a fit nothing can read)."""
        run, g = self.results._run, self._g()
        meta = _meta_of(g)
        block = int(meta["block_tokens"])
        expected = {name: ((run.n_tokens,), (block,), np.dtype(dt)) for name, dt in fields.items()}
        if self.results._salt(meta) is not None:  # a fit made before checksums has none
            expected["crc"] = ((n_blocks, len(fields)), (1, len(fields)), np.dtype("uint32"))
        expected["done"] = ((n_blocks,), (1,), np.dtype("uint8"))
        for name, (shape, chunks, dt) in expected.items():
            try:
                arr = g[name] if g is not None else None
            except Exception:  # noqa: BLE001 - missing, or its metadata unreadable
                arr = None
            # chunks too: a field whose zarr.json names other chunks cannot decode its blocks, and
            # rewriting one through it would scatter it over chunks the others do not use
            if not isinstance(arr, zarr.Array) or arr.shape != shape or np.dtype(arr.dtype) != dt or tuple(arr.chunks) != chunks:
                raise StoreError(f"the fit of run {run.name!r} is damaged: fit/{name} is missing or is not a {dt} array of "
                                 f"shape {shape} in chunks of {chunks}; refit it (`{self.results._refit_command(meta)}`)")  # fmt: skip

    def todo(self, *, verify: bool = False) -> tuple[list[int], list[int]]:
        """The blocks this fit must fit, and of them those it fits again: ``(todo, damaged)``.

        ``todo``: the blocks not marked done when this is called (a done flag that cannot be
        decoded counts as not done), and the ``damaged`` ones. With ``verify`` (``tokdyn fit
        --repair``) every field of every block marked done is read and checked against the
        block's committed checksum, as a reader checks it, and a block whose stored results are
        not what was written there (a chunk cut short, deleted, overwritten, swapped; its
        checksums undecodable) is damaged too; fits made before checksums have none to check.
        Damaged blocks are marked not done again (and a complete fit incomplete) before this
        returns, and where blocks are left to fit this job's code is added to the record's
        ``fitted_by`` (with a warning where kept blocks came from other code:
        :meth:`_fitted_by_this`). Without ``verify`` only the done flags are read: a reader
        finds damage in what it reads and names ``--repair``; reading the whole fit on every
        plain resume made a no-op ``tokdyn fit`` of a complete 2M-token fit 4x slower (and one
        on S3 download it).
        """
        results, g = self.results, self._g()
        run, meta = results._run, _meta_of(g)
        n, block = run.n_tokens, int(meta["block_tokens"])
        n_blocks = -(-n // block)
        def per_block(arr, index, damaged: set[int]) -> dict[int, Any]:
            """``arr`` read whole, or block by block where that fails (the blocks it cannot
            decode are added to ``damaged``)."""
            try:
                whole = arr[...]
                return {b: whole[index(b)] for b in range(n_blocks)}
            except NOT_DAMAGE:
                raise
            except Exception:  # noqa: BLE001 - a codec's error on a damaged chunk
                pass
            out = {}
            for b in range(n_blocks):
                for attempt in (0, 1):  # read twice before calling it damaged: a transport error passes
                    try:
                        out[b] = arr[index(b)]
                        break
                    except NOT_DAMAGE:
                        raise
                    except Exception:  # noqa: BLE001 - this block's chunk is damaged
                        if attempt:
                            damaged.add(b)
            return out

        unreadable: set[int] = set()  # blocks whose done flag cannot be decoded: fitted again
        flags = per_block(g["done"], lambda b: b, unreadable)
        done = [b for b in range(n_blocks) if b in flags and flags[b]]
        bad: set[int] = set()  # of the blocks marked done, those not holding what was written
        salt = results._salt(meta)
        if verify and salt is not None and done:
            fields = _fields(meta, g)
            dtypes = meta.get("fields") or {}
            crc = per_block(g["crc"], lambda b: slice(b, b + 1), bad)
            for f, name in enumerate(fields):
                values = per_block(g[name], lambda b: slice(b * block, min(n, (b + 1) * block)), bad)
                for b in done:
                    if b not in bad and (b not in crc or b not in values or position_crc(
                            salt, f"fit/{name}", (b,), np.asarray(values[b], dtype=dtypes.get(name))) != crc[b][0, f]):
                        bad.add(b)
        damaged = sorted(unreadable | (bad & set(done)))
        if damaged and meta.get("complete"):  # not complete until they are fitted again (a kill meanwhile: readers are told)
            g.update_attributes({META: {**meta, "complete": False}})
        for b in damaged:
            g["done"][b] = 0  # rewritten whole: an undecodable flag chunk is replaced too
        # the flags as read first (a late block of a failed job may land meanwhile: fitted again, to the same values)
        todo = sorted(set(range(n_blocks)) - set(done) | set(damaged))
        if todo:
            self._fitted_by_this([int(flags[b]) for b in done if b not in damaged])
        return todo, damaged

    def _fitted_by_this(self, kept_flags: list[int]) -> None:
        """Before this code fits blocks: its build (`_version.build`) in ``fitted_by``, the list
        of the codes that fitted the fit's blocks (each block's done flag names its code:
        :func:`_done_flag`), and a RuntimeWarning where a kept block (its flag among
        ``kept_flags``) was fitted by other code, which agrees with this one to the solver's
        tolerance at best, or by code not recorded (DONE_UNKNOWN: a tokdyn before the list, or a
        writer whose code the list did not hold). Not refused, as another backend is: the code's
        id changes with any change to the package, and a long fit would be lost to an edit
        outside fitting."""
        meta, now = self._meta(), build()
        fitted_by = meta.get("fitted_by")
        if not isinstance(fitted_by, list):  # none (an earlier tokdyn's fit) or damaged: the flags there say nothing
            fitted_by = [None] * (max(kept_flags, default=DONE_UNKNOWN) - DONE_UNKNOWN)
        others: list = []
        for flag in sorted(set(kept_flags)):
            code = _flag_code(flag, fitted_by)
            if code != now and code not in others:
                others.append(code)
        if others:
            warnings.warn(f"the fit of run {self.results._run.name!r} keeps blocks fitted by other code "
                          f"({_fitted_by_text(others)}), and this code (tokdyn {now}) fits the rest; refit=True "
                          "(--refit) fits every block with this one", RuntimeWarning, stacklevel=4)  # fmt: skip
        if now not in fitted_by:
            fitted_by = [*fitted_by, now]
        if fitted_by != meta.get("fitted_by"):
            self._g().update_attributes({META: {**meta, "fitted_by": fitted_by}})

    @property
    def complete(self) -> bool:
        """Whether the fit being written is marked complete (a fit found done: nothing to write)."""
        return bool(self._meta().get("complete"))

    @property
    def fit_id(self) -> str | None:
        """The id of the fit being written (None: one made before fits had ids); workers pass it
        to :meth:`FitResults.write_block`."""
        return self._meta().get("fit_id")

    def finish(self, **meta: Any) -> None:
        """Mark the fit complete, adding ``meta`` (``seconds`` adds up over resumed calls); a
        refit written beside the old fit then takes its place (:meth:`_swap`)."""
        self._lock.check()
        g = self._g()
        old = dict(g.attrs[META])
        seconds = float(old.get("seconds", 0.0)) + float(meta.pop("seconds", 0.0))
        g.update_attributes({META: {**old, **jsonable(meta, "fit metadata"), "seconds": seconds, "complete": True,
                                    "finished": utc_now()}})  # fmt: skip
        if self.staged:
            self._swap()

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "FitWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _meta_of(g: zarr.Group | None) -> dict:
    """``attrs["tokdyn_fit"]`` of fit group ``g`` ({} when there is none)."""
    meta = g.attrs.get(META) if g is not None else None
    return dict(meta) if isinstance(meta, Mapping) else {}


def _current(meta: Mapping, run: "Run") -> bool:
    """Whether the fit of record ``meta`` is complete and made on ``run``'s committed rows."""
    return bool(meta.get("complete")) and meta.get("n_committed") == run.n_committed


def _state(run: "Run", g: zarr.Group) -> dict:
    """What :meth:`FitResults.summary` says of fit group ``g``. Values are the record's, as
    stored (a damaged record's may be of any JSON type: a reader of them checks)."""
    meta = _meta_of(g)
    given = {k: meta.get(k) for k in ("axis_min", "options")}  # what a command that mends it takes, damaged or not
    block = meta.get("block_tokens")
    if not is_int(block) or block <= 0:
        return {**given, "error": f"the fit's record is damaged (block_tokens {_value_text(block)})"}
    rows = meta.get("rows")
    out = {
        "complete": bool(meta.get("complete")),
        "current": _current(meta, run),
        "rows": len(rows) if isinstance(rows, list) else None,
        **given,
        **{k: meta.get(k) for k in ("n_committed", "backend", "device", "seconds", "created", "finished", "tokdyn_version",
                                    "fit_id")},  # fmt: skip
        "blocks": -(-run.n_tokens // block),
    }
    if out["complete"]:  # one its readers refuse is no complete fit
        why = run.fit.refusal(meta, g)
        if why is not None:
            return {**out, "error": why}
    try:
        done = np.asarray(g["done"][...])
    except NOT_DAMAGE:
        raise
    except Exception as exc:  # noqa: BLE001 - a missing or undecodable done array
        if out["complete"]:  # read by no reader of a complete fit, and rewritten by a refit
            return {**out, "blocks_done": None}
        return {**out, "error": f"its done flags cannot be read: {damage(exc)}"}
    return {**out, "blocks_done": int(np.count_nonzero(done))}


def made_on(meta: Mapping, inputs: Mapping) -> bool:
    """Whether the fit of record ``meta`` was made on ``inputs`` (each of them as recorded:
    JSON values)."""
    return all(meta.get(k) == v for k, v in inputs.items())


def _same_inputs(meta: Mapping, inputs: Mapping, fields: Mapping) -> bool:
    """Whether the fit of ``meta`` was made on ``inputs``, with result ``fields``: resumed."""
    return made_on(meta, inputs) and meta.get("fields") == fields


async def _copy_keys(store, source: str, target: str, *, at_once: int = 16) -> None:
    """Copy every key under ``source`` to the same place under ``target``, ``at_once`` keys at a
    time (an object store's round trips overlap), the group metadata ``source/zarr.json`` last:
    until it lands, ``target`` is not a group, and a copy cut short reads as none."""
    group_meta = join(source, "zarr.json")

    async def copy(key: str) -> None:
        value = await store.get(key, prototype=default_buffer_prototype())
        if value is not None:
            await store.set(target + key[len(source):], value)

    keys = [k async for k in store.list_prefix(source + "/") if k != group_meta]
    for i in range(0, len(keys), at_once):
        done = await asyncio.gather(*(copy(k) for k in keys[i : i + at_once]), return_exceptions=True)
        failed = [e for e in done if isinstance(e, BaseException)]
        if failed:  # raised once no copy of the batch is still running
            raise failed[0]
    await copy(group_meta)


# The options `tokdyn fit` sets by a flag, each with the value a fit made without its flag takes:
# FitOptions' defaults (tests/test_info_fit.py holds them to it), and the probe's vocabulary size.
FLAG_DEFAULTS = {"two_step": True, "min_points": 6, "vocab_size": None}


def fit_flags(options: Any, vocab_size: Any = None, defaults: Mapping | None = None) -> tuple[str, dict, list]:
    """What a fit made with ``options`` (its record's: any JSON value where it is damaged) takes
    on the command line, ``(flags, others, missing)``:

    - ``flags``: those of ``tokdyn fit`` that give its options (`` --min-points 8 --no-two-step``;
      the inverse of the command line's parsing);
    - ``others``: the options it was made with that no flag sets (name -> value), where they are
      not ``defaults``' (every option's default; None: not looked for);
    - ``missing``: the options ``defaults`` names that its record lacks (made by an earlier tokdyn).

    ``vocab_size``: the probe's tokenizer's, which a fit without ``--vocab-size`` takes. Values are
    compared as the fit's writer compares them to resume it (``==``)."""
    plain = {**(defaults or {}), **FLAG_DEFAULTS}
    if is_int(vocab_size) and vocab_size > 0:
        plain["vocab_size"] = int(vocab_size)
    stored = options if isinstance(options, Mapping) else {}
    flags, others = [], {}
    for name, value in sorted(stored.items(), key=lambda kv: str(kv[0])):
        if value == plain.get(name):
            continue
        if name == "two_step" and value is False:
            flags.append("--no-two-step")
        elif name in ("min_points", "vocab_size") and is_int(value):
            flags.append(f"--{name.replace('_', '-')} {int(value)}")
        elif defaults is not None:
            others[name] = value
    missing = [k for k in (defaults or {}) if isinstance(options, Mapping) and k not in stored]
    return "".join(f" {f}" for f in flags), others, missing


def _differences(then: Any, now: Mapping, keys: Iterable[str] | None = None) -> str:
    """Where record ``then`` (stored: of any JSON type where damaged) differs from ``now``, in
    ``keys`` (default: the keys of either), as ``min_points 8 then, 6 now; two_step False then,
    True now``; "" where it does not."""
    then, now = (d if isinstance(d, Mapping) else {} for d in (then, now))
    keys = sorted({str(k) for k in (*then, *now)} if keys is None else keys)
    return "; ".join(f"{one_line(k, 40)} {_value_text(then.get(k), 40)} then, {_value_text(now.get(k), 40)} now"
                     for k in keys if then.get(k) != now.get(k))  # fmt: skip


def _value_text(v: Any, limit: int | None = None) -> str:
    """A stored number for a message (``none`` for None; anything else, damaged, as its repr,
    cut to ``limit`` characters with an ellipsis)."""
    if v is None:
        return "none"
    text = (str(v) if isinstance(v, int) else exact(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else repr(v)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _damaged_record(meta: Mapping) -> str | None:
    """What is wrong with the types of a fit record's entries that readers use (``options`` a
    mapping, ``fields`` a list of names, ``axis_min`` a finite number or null, ``n_committed`` a
    count), or None. A record still valid JSON but edited or damaged (``"options": null``) was a
    TypeError, reported as a bug in tokdyn. ``fields`` empty or null in a fit with checksums read the
    group's arrays in name order, as for a fit made before records named them, and the
    checksums (kept in the record's order) then failed as damaged blocks, naming a repair;
    ``n_committed`` a string was said as "made on 8 rows; the run now has 8"."""
    if "options" in meta and not isinstance(meta["options"], Mapping):
        return f"options is {type(meta['options']).__name__}, not a mapping"
    fields = meta.get("fields")
    if (fields is not None and not _names(fields)) or (not fields and meta.get("fit_id") is not None):  # checksums go by its order
        return "fields does not name the result fields"
    if "n_committed" in meta and not (is_int(meta["n_committed"]) and meta["n_committed"] >= 0):
        return f"n_committed is {_value_text(meta['n_committed'], 40)}, not a count of rows"
    v = meta.get("axis_min")
    if v is not None and not is_finite(v):
        return f"axis_min is {one_line(v)[:40]}, not a finite number"
    return None


def recorded_inputs(run: "Run", meta: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """The rows and ``x`` the complete fit of record ``meta`` was made on, as its record holds
    them; :class:`StoreError` where they do not fit ``run`` (rows increasing, at least two, among
    its committed rows, each ``x`` the log10 of its row's axis value)."""
    try:
        rows = np.asarray(meta["rows"])
        x = np.asarray(meta["x"], dtype=np.float64)
    except (KeyError, TypeError, ValueError):
        raise StoreError(f"the fit of run {run.name!r} does not record its rows and x; it is damaged, refit it (--refit)") from None
    ok = (rows.dtype.kind in "iu" and rows.ndim == 1 and rows.shape == x.shape and rows.size >= 2 and np.all(np.diff(rows) > 0)
          and rows[0] >= 0 and rows[-1] < run.n_committed)  # fmt: skip
    if ok:  # the rows' own axis values give the same x (committed rows never change)
        av = run.axis_values[rows]
        ok = bool(np.all(av > 0)) and np.allclose(x, np.log10(av), rtol=0, atol=1e-9)
    if not ok:
        raise StoreError(f"the fit of run {run.name!r} records rows and x that do not fit the run; it is damaged, refit it (--refit)")
    return rows, x


def _fields(meta: Mapping, g: zarr.Group | None) -> list[str]:
    """The result fields of a fit: as its metadata names them (fits written before the metadata
    named them: the group's arrays)."""
    if meta.get("fields"):
        if not _names(meta["fields"]):
            raise StoreError("a fit record is damaged (its fields do not name the result fields); refit it (tokdyn fit --refit)")
        return list(meta["fields"])
    return sorted(k for k in g.array_keys() if k not in ("done", "crc")) if g is not None else []


def _names(fields) -> bool:
    """Whether a fit record's ``fields`` names fields: a mapping of names to dtypes, or (older
    records) a list of names."""
    return isinstance(fields, (Mapping, list)) and all(isinstance(k, str) for k in fields)
