"""Fit every token of a stored run with dask, block by block, resumably.

The unit of work is one token chunk of the run's loss array (``token_chunk`` tokens across all
committed rows): a task opens the store, reads that block, fits it with :func:`fit_block` in
batches of ``batch_rows`` tokens (so memory stays bounded by the block, whatever the store's
size), writes every result field, and only then marks the block done. A job that is killed
and started again fits only the blocks not marked done.

Results live beside the run (``run.fit``); their layout belongs to the store
(``tokdyn/store/fit.py``, docs/store.md "Fit results"): this module only computes blocks and
hands them over, under the run's fit lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokdyn._checks import is_finite, numba_setting
from tokdyn._process import exit_with_parent, spawn_context, take_interrupts
from tokdyn._text import exact, one_line
from tokdyn._version import __version__
from tokdyn._version import build as tokdyn_build
from tokdyn.errors import ClusterError, InputError, NotAStoreError, RunNotFoundError, StoreError
from tokdyn.fit.backends import resolve_backend
from tokdyn.fit.block import FIT_FIELDS, fit_block
from tokdyn.fit.models import TWO_EVENTS, ClassDrops, class_loss_share, fit_class_drops, scored_counts
from tokdyn.fit.options import CLASS_NAMES, MODEL_NAMES, STATUS_NAMES, FitOptions
from tokdyn.fit.sigmoid import log_axis
from tokdyn.store import FitWriter, Run, TrajectoryStore, as_store
from tokdyn.store.fit import made_on, recorded_inputs
from tokdyn.store.schema import jsonable

__all__ = ["FitSummary", "fit_run", "read_fit", "stored_options", "stored_axis_min", "fit_inputs", "fitted_inputs",
           "rows_left_out", "missing_losses", "LOCAL_SCHEDULERS"]

LOCAL_SCHEDULERS = ("threads", "processes", "sync")


def fit_inputs(run: Run, *, axis_min: float | None = None, n_committed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The rows a fit uses and their ``x = log10(axis value)``.

    Rows with a non-positive axis value (step 0) are kept in the store and left out of fits, and
    so are rows below ``axis_min`` (an axis value: a step, tokens, parameters) when it is given,
    such as the steps of a learning-rate warm-up. ``n_committed``: only the first that many rows
    (default: every committed row; a recorder may commit more while this reads).
    """
    k = run.n_committed if n_committed is None else int(n_committed)
    if k == 0:
        raise StoreError(f"run {run.name!r} has no committed rows to fit")
    av = run.axis_values[:k]
    if not np.all(np.isfinite(av)):  # never a silently dropped row: a writer stores finite values only
        raise StoreError(f"run {run.name!r} has non-finite axis values at rows {np.flatnonzero(~np.isfinite(av))[:8].tolist()}; the store is damaged")
    keep = av > 0
    if axis_min is not None:
        lo = _axis_min(axis_min)
        keep &= av >= lo
        kept = int(keep.sum())
        if kept < 2:
            raise InputError(
                f"run {run.name!r} has {kept} row{'s' * (kept != 1)} at axis values >= {exact(lo)} (its axis runs "
                f"{av.min():g} .. {av.max():g}); a fit needs more: lower axis_min (--axis-min)"
            )
    rows = np.flatnonzero(keep)
    if rows.size < 2:
        raise InputError(f"run {run.name!r} has {rows.size} row{'s' * (rows.size != 1)} with a positive axis value; a fit needs more")
    try:
        return rows, log_axis(av[rows])
    except InputError as exc:
        raise InputError(f"run {run.name!r}: {exc}") from None


def rows_left_out(run: Run, rows, *, axis_min: float | None = None, n_committed: int | None = None) -> str | None:
    """One line: the committed rows (the first ``n_committed``) that a fit on ``rows`` leaves out
    and why, e.g. ``"left out: 1 row at step 0 (no place on a log axis)"``; None when it leaves
    out none. A fit counts its points, not the run's rows: "on 20 points" for a run of 21 rows
    said nothing of the row at step 0 that ``x = log10(step)`` cannot place."""
    k = run.n_committed if n_committed is None else int(n_committed)
    av = np.asarray(run.axis_values[:k], np.float64)
    out = np.ones(k, bool)
    out[np.asarray(rows, np.int64)] = False
    if not out.any():
        return None
    parts = []
    for which, why in ((out & (av <= 0), "no place on a log axis"),
                       (out & (av > 0), "before the fit window, --axis-min " + ("?" if axis_min is None else exact(axis_min)))):
        n = int(np.count_nonzero(which))
        if n:
            parts.append(f"{n:,} row{'s' * (n != 1)} at {_axis_span(run.axis, av[which])} ({why})")
    return "left out: " + "; ".join(parts)


def missing_losses(axis_values, axis: str, rows, n_points, nonfinite_rows, n_tokens: int) -> tuple[str | None, int, int]:
    """What a fit on ``rows`` was made without: the rows where no token has a loss (each NaN or
    inf, as a model whose weights turned NaN gives at every later checkpoint) and the observed
    tokens missing a loss at some other row. Returns ``(line, n_rows_without_loss,
    n_tokens_missing_points)``; the line is None where nothing is missing, else e.g. ``"no loss:
    the last 5 of the 24 points (steps 2424-10000) hold no token's loss ..."``.

    ``axis_values`` [committed rows], ``rows`` the fitted ones among them, ``n_points`` [N] each
    token's observed points (a fit's field), ``nonfinite_rows`` {row: NaN count} (the commit
    records', :meth:`Run.nonfinite`: padding's NaN counted too, so a row of ``n_tokens`` has none).
    A fit of a run whose last rows were all NaN said "on 24 points" and "learned 100%" alone."""
    rows = np.asarray(rows, np.int64)
    empty = np.array([nonfinite_rows.get(int(r), 0) >= n_tokens for r in rows], bool)
    k, e = int(rows.size), int(empty.sum())
    n_points = np.asarray(n_points, np.int64)
    short = (n_points > 0) & (n_points < k - e)  # a token set aside (invalid_input) counts no point: not missing
    m, lost = int(short.sum()), int((k - e - n_points[short]).sum())
    parts = []
    if e:
        av = np.asarray(axis_values, np.float64)[rows[empty]]
        last = bool(empty[k - e:].all())
        noun = _AXIS_NOUN.get(axis, "axis value")
        named = (_axis_span(axis, av) if last or e == 1 else
                 f"{noun}s {', '.join(f'{v:g}' for v in av[:4])}{', ...' if e > 4 else ''}")  # fmt: skip
        parts.append(f"no loss: {'the last ' if last and e < k else ''}{e:,} of the {k:,} points ({named}) hold no token's loss "
                     f"(each NaN or inf: a model that diverged?); the classes are of the other {k - e:,}")  # fmt: skip
    if m:
        of = f"{k:,} points" if not e else f"{k - e:,} points with losses"
        parts.append(f"missing: {m:,} of the {n_tokens:,} tokens have no loss at some of the {of} ({lost:,} losses NaN or inf); "
                     "each is fitted on its others")  # fmt: skip
    return ("\n".join(parts) or None), e, m


_AXIS_NOUN = {"T": "step", "D": "data budget", "M": "model size"}  # one row's axis value, by axis


def _axis_span(axis: str, values: np.ndarray) -> str:
    """'step 0', 'steps 1-8', 'data budget 1e+06', 'model sizes 1e+06-3e+06'."""
    noun = _AXIS_NOUN.get(axis, "axis value")
    lo, hi = float(values.min()), float(values.max())
    return f"{noun} {lo:g}" if lo == hi else f"{noun}s {lo:g}-{hi:g}"


def fitted_inputs(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """The rows and ``x`` the stored fit of ``run`` was made on (those of :func:`fit_inputs`
    with the fit's ``axis_min``): what its results describe. :class:`StoreError` when the run has
    no complete, current fit."""
    return recorded_inputs(run, run.fit.check())


def stored_axis_min(run: Run) -> float | None:
    """The fit window (``axis_min``) the stored fit of ``run`` was made with (None: none, or no
    fit); :class:`StoreError` when the stored value is not a number."""
    v = run.fit.meta.get("axis_min")
    if v is None:
        return None
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and is_finite(v)):
        raise StoreError(f"the fit of run {run.name!r} records axis_min {v!r}, not a number; it is damaged, refit it (--refit)")
    return float(v)


def _count(value) -> bool:
    """Whether ``value`` is an integer >= 1 (a numpy one too; never a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and 1 <= value < 2**63


def _axis_min(value) -> float:
    """``axis_min`` as a finite float, else one clear :class:`InputError`."""
    if isinstance(value, (bool, np.bool_)):
        raise InputError(f"axis_min must be a number (an axis value such as a step), got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"axis_min must be a number (an axis value such as a step), got {value!r}") from None
    if not np.isfinite(v):
        raise InputError(f"axis_min must be finite, got {value!r}")
    return v


@dataclass(frozen=True)
class FitSummary:
    """What :func:`fit_run` did: blocks fitted and resumed, time, and the counts of the fit."""

    run: str
    n_tokens: int
    n_points: int
    blocks: int
    blocks_fitted: int  # by this call
    blocks_resumed: int
    seconds: float
    fits_per_s: float
    backend: str
    scheduler: str
    status_counts: dict  # of the tokens with a recorded loss (models.never_scored: set-aside tokens are unfit): with n_unscored, n_tokens
    class_counts: dict  # likewise: padding (no recorded loss) is in no class, and counted in n_unscored
    class_loss_share: dict
    n_unscored: int = 0  # probe tokens with no recorded loss in the fitted rows (padding, never recorded)
    axis_min: float | None = None  # rows below this axis value were left out
    rows_left_out: str | None = None  # the committed rows not fitted and why (rows_left_out()), None: none
    n_rows_left_out: int = 0
    # rows the run committed while this fit ran (a recorder appending): the fit does not cover
    # them and is stale when it returns (its readers ask for --refit)
    n_rows_committed_since: int = 0
    # blocks marked done by an earlier call whose stored results were damaged (a chunk cut short,
    # deleted, overwritten): fitted again by this call (counted in blocks_fitted)
    blocks_repaired: list = field(default_factory=list)
    # the fitted rows where no token has a loss (a model that diverged), and the observed tokens
    # missing a loss at some other fitted row (missing_losses()); missing_losses None: none
    missing_losses: str | None = None
    n_rows_without_loss: int = 0
    n_tokens_missing_points: int = 0
    # each class's drop and whether shares of it mean something (the rule the report and the
    # command line say it by); not in summary(), whose class_loss_share holds the shares
    class_drops: ClassDrops | None = field(default=None, repr=False)

    def summary(self) -> dict:
        out = dataclasses.asdict(self)
        del out["class_drops"]
        return out


def fit_run(
    run: Run,
    *,
    options: FitOptions | None = None,
    backend: str = "auto",
    device: Any = None,
    scheduler: str | None = None,
    workers: int | None = None,
    batch_rows: int = 16384,
    refit: bool = False,
    repair: bool = False,
    progress: bool = True,
    axis_min: float | None = None,
) -> FitSummary:
    """Fit every token of ``run`` and store the results beside it (``run.fit``).

    Parameters
    ----------
    run : Run
        A run of a store opened for writing (``open_store(url, mode="r+").run(name)``).
    options : FitOptions, optional
        Thresholds and solver settings (default ``FitOptions()``). When ``vocab_size`` is not
        set it is taken from the probe's tokenizer, if known, for the age of acquisition.
    backend, device : see :func:`tokdyn.fit.fit_sigmoids`.
    scheduler : {"threads", "processes", "sync"} or "tcp://HOST:PORT", optional
        Local dask scheduler (default ``"threads"``), or the address of a running
        dask.distributed scheduler (of a ``Client``: ``client.scheduler.address``).
    workers : int, optional
        Local workers (default: one per core).
    batch_rows : int
        Tokens fitted at once inside a block (bounds the solver's temporaries).
    refit : bool
        Fit again from scratch. A complete stored fit is kept, and read by everything else,
        until the new one is complete (it is written beside it and then takes its place); a
        refit stopped or failed leaves it as it was, and a fit on the refit's inputs resumes the
        refit. Without it, a fit on the same inputs (rows, x, options) is resumed, and one on
        other inputs is an error.
    repair : bool
        Read every block marked done, check it against its checksums, and fit the damaged ones
        again (:meth:`~tokdyn.store.fit.FitWriter.todo`; ``tokdyn fit --repair``): what to do
        when a reader says a chunk "does not hold the results written there". Reads the whole fit.
        The stored fit's options and ``axis_min`` are used where these are left at their defaults.
    progress : bool
        Show a progress bar over blocks.
    axis_min : float, optional
        Fit only the rows at axis values >= this (a step, tokens, parameters), e.g. the end of a
        learning-rate warm-up: each token's events then describe what happens from there on.
        Stored with the fit (it is one of the inputs a resumed fit must match); everything that
        reads the fit uses its rows (:func:`fitted_inputs`).
    """
    if not isinstance(run, Run):
        raise InputError(f"run must be a tokdyn Run (open_store(url, mode='r+').run(name)), got {type(run).__name__}")
    if not _count(batch_rows):
        raise InputError(f"batch_rows must be an int >= 1, got {batch_rows!r}")
    if workers is not None and not _count(workers):
        raise InputError(f"workers must be None or an int >= 1, got {workers!r}")
    if scheduler is not None and not isinstance(scheduler, str):
        raise InputError(f"scheduler must be a string (threads, processes, sync or tcp://HOST:PORT), got {_not_an_address(scheduler)}")
    batch_rows, workers = int(batch_rows), None if workers is None else int(workers)
    st = run.store
    st.require_writable()
    if repair and not refit:  # the stored fit as it was made: its options and window, unless given
        options, axis_min = _stored_inputs(run, options, axis_min)
    axis_min = None if axis_min is None else _axis_min(axis_min)
    # the rows counted once: a recorder appending meanwhile makes a fit of these rows, stale once
    # it is done (never one that claims rows it did not fit)
    n_committed = run.n_committed
    rows, x = fit_inputs(run, axis_min=axis_min, n_committed=n_committed)
    opts = options if options is not None else FitOptions()
    if not isinstance(opts, FitOptions):
        raise InputError(f"options must be a FitOptions, got {type(opts).__name__}")
    if rows.size < opts.min_points:  # every token would be unfit (too_few_points), reported as a success
        window = "" if axis_min is None else f" at axis values >= {exact(axis_min)}"
        raise InputError(
            f"run {run.name!r} has {rows.size} rows to fit{window}; a fit needs at least min_points={opts.min_points}"
            f" (--min-points, 5 at least){'' if axis_min is None else '; or lower axis_min (--axis-min)'}"
        )
    vocab = st.probe.tokenizer.get("vocab_size")
    if vocab and opts.vocab_size is None:  # the age of acquisition needs the vocabulary size
        opts = dataclasses.replace(opts, vocab_size=int(vocab))
    block, n = run.token_chunk, run.n_tokens
    n_blocks = -(-n // block)
    inputs = {"rows": rows.tolist(), "n_committed": n_committed, "x": x.tolist(),
              "options": dataclasses.asdict(opts), "block_tokens": block, "axis_min": axis_min}  # fmt: skip
    if backend == "auto" and device is None and not refit:
        backend, device = _stored_backend(run, inputs)  # a fit is resumed (or found done) on its own backend
    backend, device = resolve_backend(backend, device)
    distributed = scheduler is not None and "://" in scheduler
    if scheduler is not None and not distributed and scheduler not in LOCAL_SCHEDULERS:
        raise InputError(f"scheduler must be one of {LOCAL_SCHEDULERS} or a tcp:// address, got {scheduler!r}")
    scheduler = scheduler or "threads"
    if distributed and workers is not None:
        warnings.warn(f"workers={workers} is ignored: it sets this machine's workers, and the cluster at {scheduler} "
                      "fits with its own (start more with `dask worker`)", RuntimeWarning, stacklevel=2)  # fmt: skip
    if scheduler == "sync" and workers not in (None, 1):  # said, as for a cluster: it fitted on one thread without a word
        warnings.warn(f"workers={workers} is ignored: the sync scheduler fits one block at a time in this thread "
                      "(use threads or processes for more)", RuntimeWarning, stacklevel=2)  # fmt: skip
    if (scheduler == "processes" or distributed) and st.url.startswith("memory://"):
        raise InputError("a memory:// store is private to this process; use scheduler='threads' or 'sync'")

    # backends agree to solver tolerance, not to the bit: a resumed fit stays on its own
    inputs.update(backend=backend, device=None if device is None else str(getattr(device, "type", device)))
    labels = {f"{what}_names": {str(k): v for k, v in names.items()}
              for what, names in (("status", STATUS_NAMES), ("class", CLASS_NAMES), ("model", MODEL_NAMES))}  # fmt: skip
    fields = {name: np.dtype(dt).str for name, dt in FIT_FIELDS.items()}
    # A cluster is reached before the fit group is touched: with --refit, a scheduler address
    # that fails (a typo, a cluster that is down) used to be found only after the stored fit had
    # been discarded, leaving none.
    with contextlib.ExitStack() as cluster:
        client = None
        if distributed:
            cluster.enter_context(_quiet_client_log())
            client = cluster.enter_context(_connect(scheduler))
        # Workers resolve a relative path against their own working folder, not this process's.
        url = os.path.abspath(st.url) if distributed and "://" not in st.url else st.url
        with run.fit.writer(inputs, fields, n_blocks=n_blocks, refit=refit, labels=labels) as fw, \
                _said_after_refit(fw):  # fmt: skip
            # blocks marked done whose stored results are damaged are fitted again, and said
            todo, repaired = fw.todo(verify=repair)
            t0 = time.perf_counter()
            if todo:
                task_args = dict(url=url, storage_options=st.storage_options, run=run.name, rows=rows, x=x,
                                 options=opts, backend=backend, device=str(device) if device is not None else None,
                                 block=block, n=n, batch_rows=int(batch_rows), fit_id=fw.fit_id)  # fmt: skip
                if scheduler in ("threads", "sync"):
                    task_args["store"] = st  # share the open store (and a memory:// one) with the threads
                _run_tasks(todo, task_args, scheduler=scheduler, client=client, workers=workers, progress=progress)
            seconds = time.perf_counter() - t0
            if todo or not fw.complete:  # a fit found complete is left as it was (its finish time, its seconds)
                fw.finish(backend=backend, seconds=seconds)
            # read under the fit lock: once it is released, a refit may replace these results
            # (the fit's own rows, also where a recorder appended more meanwhile: the next reader is told to refit)
            res = run.fit.read(fields=("status", "class_code", "drop", "n_points", *TWO_EVENTS), current=False)
            since = run.n_committed - n_committed
    fitted = sum(min(block, n - b * block) for b in todo)  # tokens fitted by this call
    class_counts, status_counts, unscored = scored_counts(res)  # of the scored tokens: padding is in no class
    missing, n_empty, n_short = missing_losses(run.axis_values[:n_committed], run.axis, rows, res["n_points"],
                                               run.nonfinite()[1], n)  # fmt: skip
    return FitSummary(
        run=run.name, n_tokens=n, n_points=int(rows.size), blocks=n_blocks, blocks_fitted=len(todo),
        blocks_resumed=n_blocks - len(todo), seconds=seconds, fits_per_s=fitted / seconds if fitted else 0.0,
        backend=backend, scheduler=scheduler, status_counts=status_counts, class_counts=class_counts, n_unscored=unscored,
        class_loss_share=class_loss_share(res["class_code"], res["drop"]), axis_min=axis_min,
        rows_left_out=rows_left_out(run, rows, axis_min=axis_min, n_committed=n_committed),
        n_rows_left_out=n_committed - int(rows.size), n_rows_committed_since=since, class_drops=fit_class_drops(res),
        blocks_repaired=repaired, missing_losses=missing, n_rows_without_loss=n_empty, n_tokens_missing_points=n_short,
    )  # fmt: skip


@contextlib.contextmanager
def _said_after_refit(fw: FitWriter):
    """A refit of a finished fit that fails (a damaged chunk of losses, which no fit can read
    until its rows are recorded again; a cluster that failed under it) says that the finished
    fit is kept: it was written beside it (``FitWriter.staged`` until the swap begins), and readers
    go on reading it."""
    try:
        yield
    except (StoreError, ClusterError) as exc:
        if not fw.staged:
            raise
        raise type(exc)(f"{exc} (the fit stored before is kept)") from None


def _not_an_address(scheduler) -> str:
    """What ``scheduler`` is, and for a dask.distributed Client or cluster (a notebook's) the
    address to pass instead (its repr alone said neither)."""
    address = getattr(scheduler, "scheduler_address", None)  # a cluster's
    if address is None:  # a Client's
        address = getattr(getattr(scheduler, "scheduler", None), "address", None)
    if isinstance(address, str) and type(scheduler).__module__.split(".")[0] == "distributed":
        return f"a dask.distributed {type(scheduler).__name__}: pass its scheduler's address, scheduler={address!r}"
    return repr(scheduler)


def _stored_inputs(run: Run, options: FitOptions | None, axis_min: float | None) -> tuple[FitOptions | None, float | None]:
    """For a repair: the stored fit's options where ``options`` are None or the defaults (as a
    bare ``tokdyn fit --repair`` gives them), and its window where ``axis_min`` is None, so that
    the command a reader names repairs a fit made with ``--axis-min`` or ``--no-two-step`` (it
    found "a fit made with other options" and pointed at a refit of the whole run)."""
    meta = _stored_meta(run)
    stored = meta.get("options")
    if isinstance(stored, dict) and (options is None or options == FitOptions()):
        try:
            options = FitOptions(**stored)
        except (InputError, TypeError):  # options of another version: the writer names what differs
            pass
    if axis_min is None:
        axis_min = meta.get("axis_min")
    return options, axis_min


def _stored_backend(run: Run, inputs: dict) -> tuple[str, Any]:
    """The backend and device of the run's stored fit where this machine has them, else ("auto",
    None). Backends agree to solver tolerance, not to the bit, so a fit is resumed on its own: a
    plain `tokdyn fit` after `--backend numpy` said "another backend (numpy then, numba now)".
    A stopped refit beside the fit (``run.fit.staged_meta``) made on ``inputs`` (all but the
    backend) is the fit resumed, on its backend."""
    try:
        staged = run.fit.staged_meta
    except StoreError:
        staged = {}
    meta = staged if staged and made_on(staged, jsonable(inputs, "fit inputs")) else _stored_meta(run)
    backend, device = meta.get("backend"), meta.get("device")
    try:
        resolve_backend(backend, device)
    except InputError:  # none recorded, or not here: a backend not installed, a GPU this machine lacks
        return "auto", None
    return backend, device


def _stored_meta(run: Run) -> dict:
    """The run's stored fit's record ({} for none, or a damaged one: the writer says so)."""
    try:
        return run.fit.meta or {}
    except StoreError:
        return {}


def read_fit(store: TrajectoryStore | str | os.PathLike, run: str, *, fields=None) -> dict[str, np.ndarray]:
    """The stored fit of run ``run`` of ``store`` (a shorthand for ``store.run(run).fit.read(fields)``)."""
    return as_store(store).run(run).fit.read(fields)


def stored_options(run: Run) -> FitOptions:
    """The :class:`FitOptions` the stored fit of ``run`` was made with."""
    known = {f.name for f in dataclasses.fields(FitOptions)}
    stored = {k: v for k, v in run.fit.options().items() if k in known}
    try:
        return FitOptions(**stored)
    except InputError:
        # A fit of an earlier tokdyn may record a value this one refuses (max_iter above today's
        # limit): its readers need the classifier's thresholds, not the solver's limits, so each
        # value refused on its own is read as its default.
        return FitOptions(**{k: v for k, v in stored.items() if _accepted(k, v)})


def _accepted(name: str, value) -> bool:
    try:
        FitOptions(**{name: value})
    except InputError:
        return False
    return True


# -- internals -----------------------------------------------------------------------------


def _fit_one_block(b: int, *, url, storage_options, run, rows, x, options, backend, device, block, n, batch_rows, fit_id,
                   store=None, stop=None, tokdyn_version: str | None = None) -> int | None:  # fmt: skip
    """Fit token block ``b``: read, fit in batches, hand the fields to the store, which marks it
    done. ``stop`` (a :class:`threading.Event`, threads only) set by the job when another block
    failed: the block is dropped between batches, unwritten (the job waits for it before it
    returns and lets go of the fit lock). ``tokdyn_version`` (a dask.distributed or ``processes``
    task): the fit's version and code (`_version.build`), which this process must run."""
    if tokdyn_version is not None:
        _check_worker_version(tokdyn_version)
        _check_worker_backend(backend, device)
    try:
        st = store if store is not None else as_store(url, mode="r+", storage_options=storage_options or None)
        r = st.run(run)
    except (NotAStoreError, RunNotFoundError) as exc:
        if (where := _cluster_worker()) is None:
            raise
        # its own file system's answer, where the user sees the store: "no tokdyn store at /data/s.zarr"
        raise type(exc)(f"{where} cannot see the store at {url} (it finds: {exc}): the store must be reachable from the "
                        "cluster's workers at the same path or URL (a shared file system, an object store)") from None  # fmt: skip
    a, e = b * block, min(n, (b + 1) * block)
    first, last = int(rows.min()), int(rows.max()) + 1  # a fit window (axis_min) leaves the early rows unread
    Y = r.losses(tokens=slice(a, e), rows=slice(first, last))  # [K, B] in the stored dtype; damage is a StoreError
    if rows.size != last - first:  # (the rows a fit takes are one run, those past step 0 and axis_min: no gathered copy
        Y = Y[rows - first]  # of a block that is K x token_chunk, 5 GB of float32 at 5,000 rows)
    out = {name: np.empty(e - a, dtype=dt) for name, dt in FIT_FIELDS.items()}
    for s in range(0, e - a, batch_rows):
        if stop is not None and stop.is_set():
            return None
        # tokens by rows, float64: one copy that converts as it transposes (astype, then a
        # contiguous copy of its transposed result, took twice as long)
        fit_block(x, np.ascontiguousarray(Y[:, s : s + batch_rows].T, dtype=np.float64), options=options, backend=backend,
                  device=device, out={name: a[s : s + batch_rows] for name, a in out.items()})  # fmt: skip
    if stop is not None and stop.is_set():
        return None
    r.fit.write_block(b, a, out, fit_id=fit_id)
    return e - a


# Seconds a scheduler address has to answer (connect, handshake, identity) before a fit gives up.
SCHEDULER_TIMEOUT = 10.0
# Seconds past dask's own connect deadline before the check gives up on the connect itself.
CONNECT_MARGIN = 2.0


def check_scheduler(address: str, timeout: float | None = None) -> None:
    """Raise InputError unless a dask scheduler answers at ``address`` within ``timeout`` seconds
    (default :data:`SCHEDULER_TIMEOUT`).

    ``Client(address, timeout=...)`` bounds the TCP connect only: a server that accepts the
    connection and never answers hung the fit for good, and one that answers with something
    else (an SSH banner) was read as a frame of exabytes and reported as running out of memory.
    This asks the scheduler who it is first, in a thread of its own with a hard deadline. An
    address that is no address at all (no port, a port beyond 65535, another scheme) is said to
    be one at once, not after the deadline or as "another service".
    """
    import threading

    from distributed.comm import connect
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.security import Security

    _check_address(address)
    timeout = SCHEDULER_TIMEOUT if timeout is None else timeout

    async def identity():
        # A host name that does not resolve is said as such (an OSError): dask's connect retries
        # it until the deadline, "did not answer within 10 s", as if a scheduler were there
        scheme, rest = parse_address(address)
        if scheme in ("tcp", "tls"):
            host, port = parse_host_port(rest)
            await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, port), timeout)
        # dask's own deadline first: at the same one, a port where nothing listens was said at random
        # as "did not answer" (the outer deadline) or "cannot reach ... Timed out trying to connect"
        comm = await asyncio.wait_for(connect(address, timeout=timeout, **Security().get_connection_args("client")),
                                      timeout + CONNECT_MARGIN)  # fmt: skip
        try:
            await asyncio.wait_for(comm.write({"op": "identity", "reply": True}), timeout)
            return await asyncio.wait_for(comm.read(), timeout)
        finally:
            comm.abort()

    answer: dict = {}

    def ask() -> None:
        try:
            answer["reply"] = asyncio.run(identity())
        except BaseException as exc:  # noqa: BLE001 - reported below, in one line
            answer["error"] = exc

    t = threading.Thread(target=ask, name="tokdyn-scheduler-check", daemon=True)
    t.start()
    t.join(3 * timeout + CONNECT_MARGIN + 1)
    if t.is_alive() or isinstance(answer.get("error"), (asyncio.TimeoutError, TimeoutError)):
        raise InputError(f"the dask scheduler at {address} did not answer within {timeout:g} s")
    err = answer.get("error")
    if isinstance(err, OSError):
        raise InputError(f"cannot reach the dask scheduler at {address}: {one_line(err)}")
    if isinstance(err, (TypeError, ValueError)):  # what dask's connect says of a scheme it cannot use here (tls without a TLS set-up)
        raise InputError(f"cannot connect to the dask scheduler at {address}: {one_line(err)}")
    reply = answer.get("reply")
    if err is not None or not (isinstance(reply, dict) and reply.get("type") == "Scheduler"):
        raise InputError(f"{address} did not answer as a dask scheduler (is it another service?)")


def _check_address(address: str) -> None:
    """InputError unless ``address`` reads as a dask address, ``tcp://HOST:PORT`` (or another of
    dask's schemes) with a port in 1..65535: `tcp://host` or `tcp://host:99999` were tried until
    the deadline and then reported as a scheduler that did not answer, `http://...` as "another
    service"."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import backends

    expected = "a dask scheduler address is tcp://HOST:PORT (the address `dask scheduler` prints)"
    scheme, rest = parse_address(address)
    if scheme not in backends:
        raise InputError(f"{expected}; got {address!r}, whose scheme {scheme!r} is none of dask's ({', '.join(sorted(backends))})")
    if scheme == "inproc":  # a scheduler of this process
        return
    try:
        host, port = parse_host_port(rest)
    except ValueError as exc:
        raise InputError(f"{expected}; got {address!r} ({one_line(exc)})") from None
    if not host or not 1 <= port <= 65535:
        raise InputError(f"{expected}; got {address!r} ({'no host' if not host else f'port {port} is not in 1..65535'})")


@contextlib.contextmanager
def _quiet_client_log():
    """dask's client logs each failure it meets (a lost scheduler) as tracebacks, before the
    job raises it as one line; those records are left out while the fit holds its client."""
    import logging

    try:
        import distributed  # noqa: F401 - its import sets its loggers' levels: first
    except ImportError:
        pass
    log = logging.getLogger("distributed.client")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _connect(address: str):
    """A dask.distributed client of the scheduler at ``address``, checked first (:func:`check_scheduler`)."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError("a scheduler address needs dask.distributed: pip install 'tokdyn[distributed]'") from None
    check_scheduler(address)
    try:
        client = Client(address, timeout="10s")
    except OSError as exc:
        raise InputError(f"cannot reach the dask scheduler at {address}: {exc}") from None
    try:
        _check_cluster_tokdyn(client, address)
    except BaseException:
        client.close()
        raise
    return client


# Seconds the scheduler and workers have to import tokdyn's fit job (numba and zarr: a few seconds
# on a busy machine) and say its version, before a fit goes on without knowing.
CLUSTER_IMPORT_TIMEOUT = 60.0
# What the cluster's processes run: the module the tasks' function lives in, imported as a task's
# unpickling would, and its version and code (`_version.build`; an older tokdyn, without it, says
# its version alone); eval and a string travel by value where a function of tokdyn could not.
_IMPORT_TOKDYN = "(lambda t: getattr(t._version, 'build', lambda: t.__version__)())(__import__('tokdyn.fit.job'))"
# What the two checks below ask for where the answer differs.
_SAME_CODE = "install the same tokdyn where the cluster runs (another version, or one with other changes to its code, fits with other code)"


def _check_cluster_tokdyn(client, address: str) -> None:
    """InputError unless the scheduler and every worker of ``client`` import tokdyn, the workers
    this process's version and code (`_version.build`), the scheduler, which fits nothing, its
    version. A cluster started from an environment without tokdyn failed in the middle
    of the fit: a scheduler that could not unpickle the task graph as "internal error ... (a bug:
    please report it)", a worker without a nanny by dying on the first task and leaving the fit
    waiting for good, one with a nanny as a "KilledWorker: out of memory?". Another version
    would fit with other code: not the results a local fit of the same store and options gives."""
    answer: dict = {}

    def ask() -> None:
        try:
            answer["scheduler"] = {"the scheduler": _tokdyn_on_scheduler(client)}
            answer["workers"] = {f"the worker {w}": v for w, v in client.run(eval, _IMPORT_TOKDYN, on_error="return").items()}
        except BaseException as exc:  # noqa: BLE001 - reported below
            answer["error"] = exc

    t = threading.Thread(target=ask, name="tokdyn-cluster-check", daemon=True)
    t.start()
    t.join(CLUSTER_IMPORT_TIMEOUT)
    if t.is_alive() or "error" in answer:  # no word on it: the fit goes on, as it did before this check
        why = f"no answer within {CLUSTER_IMPORT_TIMEOUT:g} s" if t.is_alive() else one_line(answer["error"], 150)
        warnings.warn(f"could not ask the dask cluster at {address} for its tokdyn version ({why}); fitting anyway",
                      RuntimeWarning, stacklevel=4)  # fmt: skip
        return
    here = tokdyn_build()
    for who, got in {**answer["scheduler"], **answer["workers"]}.items():
        if isinstance(got, BaseException):
            raise InputError(f"{who} of the dask cluster at {address} cannot import tokdyn "
                             f"({type(got).__name__}: {one_line(got, 150)}): install tokdyn {here} "
                             "where the cluster's scheduler and workers run, then start them again")  # fmt: skip
        # the scheduler fits nothing: it needs this version's tasks to unpickle, not this code
        if got != here and (who != "the scheduler" or str(got).split("+")[0] != __version__):
            raise InputError(f"{who} of the dask cluster at {address} runs tokdyn {one_line(got, 60)}, "
                             f"this process {here}: {_SAME_CODE}")  # fmt: skip


def _check_worker_version(wanted: str) -> None:
    """On a dask worker, before it reads a block: InputError unless it runs tokdyn ``wanted``
    (a version and code, `_version.build`). :func:`_check_cluster_tokdyn` asks the workers there
    when the fit starts; one that joins the cluster later is sent blocks too, and would fit them
    with other code. The same in a worker process of this machine (``processes``), which imports
    tokdyn's files as they are when it starts: an edit since the fit's process imported them."""
    if (here := tokdyn_build()) != wanted:
        who = _cluster_worker(scheduler=False)
        if who is None:  # raised out of the except: the error, with no context, goes back to the job pickled
            raise InputError(f"a worker process of the fit imported tokdyn {here}, the fit's process {wanted}: tokdyn's "
                             "files changed after the fit's process imported them; run `tokdyn fit` again from a new "
                             "process (the blocks done are kept)")  # fmt: skip
        raise InputError(f"{who} of the dask cluster runs tokdyn {here}, the fit {wanted}: {_SAME_CODE}; the blocks done "
                         "are kept: run `tokdyn fit` again to fit the rest")  # fmt: skip


def _check_worker_backend(backend: str, device: str | None) -> None:
    """On a dask.distributed worker: InputError naming it unless it can fit on ``backend`` (and
    ``device``), which were resolved where the fit runs (``auto``: numba, a GPU there). A worker
    without them said "backend 'numba' is not installed; available: [...]", as if of the
    machine where it is."""
    if (where := _cluster_worker()) is None:
        return
    try:
        resolve_backend(backend, device)
    except InputError as exc:
        raise InputError(f"{where} cannot fit with backend {backend!r}{f' on {device}' if device else ''} ({exc}): "
                         "install it where the cluster's workers run, or name one they have (--backend numpy)") from None  # fmt: skip


def _cluster_worker(*, scheduler: bool = True) -> str | None:
    """In a dask.distributed task: "the worker ADDRESS" (and " of the dask cluster at SCHEDULER"
    with ``scheduler``); None in any other process or thread (one of this machine's)."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except Exception:  # noqa: BLE001 - not a dask.distributed worker (or dask.distributed not installed)
        return None
    at = getattr(getattr(worker, "scheduler", None), "address", None)
    return f"the worker {worker.address}" + (f" of the dask cluster at {at}" if scheduler and at else "")


def _tokdyn_on_scheduler(client):
    """tokdyn's version and code as the scheduler imports it, or the exception its import raised."""
    try:
        return client.run_on_scheduler(eval, _IMPORT_TOKDYN)
    except (ImportError, AttributeError, SyntaxError) as exc:  # its import's error, raised here
        return exc


def _run_tasks(todo, task_args, *, scheduler: str, client=None, workers: int | None, progress: bool) -> None:
    """Run one task per block on the chosen scheduler (a dask.distributed one when ``client``
    is given); a task's error is raised here, once no task of this job is still writing (the
    caller holds the fit lock until then)."""
    import dask

    def tasks(**extra):
        return [dask.delayed(_fit_one_block, pure=False)(b, **task_args, **extra) for b in todo]

    # Never more workers than blocks to fit: `--workers 1000000` started a process (or a thread
    # holding its block in memory) per block, 80 processes on 2 cores for an 80-block store.
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    if client is not None:  # each task checks its worker's version: a worker may join after _check_cluster_tokdyn
        _run_distributed(tasks(tokdyn_version=tokdyn_build()), client, scheduler, progress)
    elif scheduler == "processes":  # a new process imports tokdyn's files as they are now: checked too
        if not _run_processes(tasks(tokdyn_version=tokdyn_build()), workers, progress):  # outside the except: the dead pool is let go first
            raise ClusterError("a worker process of the fit died while fitting a block (killed, or out of memory? "
                               "lower --workers or --batch-rows); the blocks done are kept: run `tokdyn fit` again "
                               "to fit the rest")  # fmt: skip
    elif scheduler == "threads":
        # dask raises a task's error at once and leaves the other threads running: on their own
        # they went on writing blocks (and done flags) after the fit had failed and its lock was
        # released, into a refit started meanwhile. Our own pool, a stop flag, and a wait.
        stop = threading.Event()
        pool = ThreadPoolExecutor(workers, thread_name_prefix="tokdyn-fit")
        try:
            _compute_local(tasks(stop=stop), progress, scheduler="threads", pool=pool)
        finally:
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
    else:
        _compute_local(tasks(), progress, scheduler=scheduler)


def _run_processes(tasks, workers: int, progress: bool) -> bool:
    """The tasks in a pool of ``workers`` processes; False when one of them died (killed, or by
    the OOM killer): dask raised the pool's BrokenProcessPool, reported as "internal error ...
    (a bug: please report it)"."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        # The pool's exit waits for the blocks in flight (dask hands one to each worker at a time).
        with _process_pool(workers) as pool:
            # One block per hand-over: dask's default batches 6 tasks to a worker, which left
            # one of 2 workers idle for most of an 8-block fit (2M tokens: 34.2 s, now 29-31 s).
            _compute_local(tasks, progress, scheduler="processes", pool=pool, chunksize=1)
    except BrokenProcessPool:
        return False
    return True


def _run_distributed(tasks, client, address: str, progress: bool) -> None:
    """The tasks on the dask.distributed cluster of ``client``; on a task's error the blocks
    not started are cancelled (one already running that finishes after a refit began is refused
    by the store: its fit_id is no longer the fit's). The cluster's own failures (the scheduler
    lost, a block whose workers all died) are one :class:`~tokdyn.errors.ClusterError` line, not dask's error
    reported as a bug in tokdyn."""
    from concurrent.futures import CancelledError

    from distributed import KilledWorker, as_completed

    futures = client.compute(tasks)
    bar = _bar(len(tasks), progress)
    try:
        with _watched(client, address, futures):
            for fut in as_completed(futures):
                fut.result()  # re-raises a task's error here
                bar.update(1)
    except BaseException as exc:
        try:
            client.cancel(futures)
        except Exception:  # noqa: BLE001 - a client that lost its scheduler: nothing left to cancel
            pass
        resume = "the blocks done are kept: run `tokdyn fit` again to fit the rest"
        if isinstance(exc, KilledWorker):
            raise ClusterError(f"the dask workers at {address} died while fitting a block ({one_line(exc, 200)}); "
                              f"out of memory? give the workers more, or lower --batch-rows; {resume}") from None  # fmt: skip
        if isinstance(exc, TypeError) and "_fit_one_block() got an unexpected keyword argument" in str(exc):  # an older worker
            raise InputError(f"a worker of the dask cluster at {address} runs an older tokdyn, which does not take this "
                             f"version's tasks ({one_line(exc, 150)}): install the same version where the "
                             f"cluster runs; {resume}") from None  # fmt: skip
        if isinstance(exc, CancelledError):
            raise ClusterError(f"the fit's tasks on the dask scheduler at {address} were cancelled "
                              f"({one_line(exc, 200)}); {resume}") from None  # fmt: skip
        raise
    finally:
        bar.close()


# Seconds between looks at a cluster while the fit waits for its blocks (:func:`_watched`).
CLUSTER_WATCH_INTERVAL = 2.0


@contextlib.contextmanager
def _watched(client, address: str, futures):
    """While the fit waits for its blocks: a warning each time the cluster comes to fit none
    (:func:`_cluster_stall`). dask holds the blocks left until it can, for good and without a
    word: a cluster that lost its last worker mid-fit (one without a nanny, a preempted batch
    job), whose workers were all paused by their memory limit, or whose scheduler stopped
    answering waited silently; only a scheduler without workers when the fit began was said.
    The fit goes on waiting (an adaptive cluster starts its workers when blocks are queued).
    A warning made an error (``python -W error``) cancels ``futures`` and is the fit's error."""
    stop = threading.Event()
    raised: list[Warning] = []

    def watch() -> None:
        said = None
        while True:
            why = _cluster_stall(client, address)
            if why is not None and why != said and not stop.is_set():  # (never after the wait, from a look still in flight)
                try:
                    warnings.warn(f"{why} (Ctrl-C stops it; the blocks done are kept)", RuntimeWarning, stacklevel=2)
                except Warning as exc:  # -W error: raised in this thread, it printed a traceback and the fit waited on
                    raised.append(exc)
                    with contextlib.suppress(Exception):
                        client.cancel(futures)  # the wait ends, with the warning as its error (below)
                    return
            said = why
            if stop.wait(CLUSTER_WATCH_INTERVAL):
                return

    t = threading.Thread(target=watch, name="tokdyn-cluster-watch", daemon=True)
    t.start()
    try:
        yield
    except BaseException:
        if raised:
            raise raised[0] from None
        raise
    finally:
        stop.set()
        t.join(1.0)  # a look in flight at a scheduler that does not answer ends at its deadline, on its own


def _cluster_stall(client, address: str) -> str | None:
    """Why the cluster of ``client`` fits no block now and what the fit waits for, or None: its
    scheduler does not answer within :data:`SCHEDULER_TIMEOUT` (stopped, swapping: the fit waited
    for good), it has no workers (none but closing ones), or every one is paused (its memory above
    dask's pause threshold)."""
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=SCHEDULER_TIMEOUT)
        workers = list((info.get("workers") or {}).values())
    except (asyncio.TimeoutError, TimeoutError):
        return (f"the dask scheduler at {address} has not answered for {SCHEDULER_TIMEOUT:g} s (stopped, or out of "
                "memory and swapping?); the fit waits for it")  # fmt: skip
    except Exception:  # noqa: BLE001 - a lost scheduler: its futures say so, as a ClusterError
        return None
    status = [str(getattr(w.get("status"), "value", w.get("status"))) for w in workers]
    if "running" in status:
        return None
    paused = [w for w, s in zip(workers, status) if s == "paused"]
    if not paused:
        return f"the dask scheduler at {address} has no workers; the fit waits until one joins"
    limits = sorted({w.get("memory_limit") for w in paused if w.get("memory_limit")})
    limit = f" of their limit ({', '.join(f'{v / 2**30:.3g} GiB' for v in limits)})" if limits else ""
    return (f"the dask workers at {address} are all paused ({len(paused)}): their memory is above dask's pause threshold "
            f"(distributed.worker.memory.pause){limit}; give them more memory (dask worker --memory-limit); "
            "the fit waits until one runs again")  # fmt: skip


def _process_pool(workers: int):
    """The worker processes of ``scheduler="processes"``: started by "spawn" (forking a process
    that has started numba/torch/zarr threads can deadlock), each with its share of the cores for
    its compiled kernels' threads, so that the workers together do not oversubscribe them."""
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // workers)
    # spawn_context: a Ctrl-C while a worker imports is the job's, not a traceback of the worker's;
    # main=False: the tasks are tokdyn's functions, so a worker does not run the user's script again
    return ProcessPoolExecutor(max_workers=workers, mp_context=spawn_context(main=False),
                               initializer=_worker_threads, initargs=(threads, os.getpid()))


def _worker_threads(threads: int, parent: int | None = None) -> None:
    """In a new worker process: its kernels' threads (numba's, and torch's, OpenMP's where
    they start later in it), an exit of its own when the job's process is gone, and Ctrl-C taken
    again (:func:`tokdyn._process.take_interrupts`) now that it is set up."""
    if parent is not None:
        exit_with_parent(parent)
        take_interrupts()
    for name in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):  # a value the user set stays
        os.environ.setdefault(name, str(threads))
    if numba_setting() is not None:  # numba refuses this environment (its backend says so before the fit):
        return  # numpy and torch fit without it; importing it here killed every worker ("out of memory?")
    try:
        import numba
    except ImportError:
        return
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def _compute_local(tasks, progress: bool, **kwargs) -> None:
    import dask
    from dask.callbacks import Callback

    bar = _bar(len(tasks), progress)

    class _Progress(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if isinstance(result, (int, np.integer)):
                bar.update(1)

    try:
        with _Progress():
            dask.compute(*tasks, **kwargs)
    finally:
        bar.close()


def _bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="fit", unit="block", disable=not enabled, leave=False)
