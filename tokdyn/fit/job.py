"""Fit every token of a stored run with dask, block by block, resumably.

The unit of work is one token chunk of the run's loss array (``token_chunk`` tokens across all
committed rows): a task opens the store, reads that block, fits it with :func:`fit_block` in
batches of ``batch_rows`` tokens (so memory stays bounded by the block, whatever the store's
size), writes every result field, and only then marks the block done. A job that is killed
and started again fits only the blocks not marked done.

Results live beside the run, in ``/runs/<name>/fit`` (docs/store.md, "Fit results"): one
``[token]`` array per :data:`FIT_FIELDS` name, a ``done [block]`` array, and
``attrs["tokdyn_fit"]`` describing the inputs (rows, x, options) they were fitted on.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr

from tokdyn import __version__
from tokdyn.errors import InputError, StoreError
from tokdyn.fit.backends import resolve_backend
from tokdyn.fit.block import FIT_FIELDS, fit_block
from tokdyn.fit.models import class_loss_share
from tokdyn.fit.options import CLASS_NAMES, MODEL_NAMES, STATUS_NAMES, FitOptions
from tokdyn.fit.sigmoid import log_axis
from tokdyn.store import Run, TrajectoryStore, open_store

__all__ = ["FIT_SCHEMA_VERSION", "fit_run", "read_fit", "stored_options", "fit_inputs", "LOCAL_SCHEDULERS"]

FIT_SCHEMA_VERSION = 1
LOCAL_SCHEDULERS = ("threads", "processes", "sync")


def fit_inputs(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """The rows a fit uses and their ``x = log10(axis value)``.

    Rows with a non-positive axis value (step 0) are kept in the store and left out of fits.
    """
    k = run.n_committed
    if k == 0:
        raise StoreError(f"run {run.name!r} has no committed rows to fit")
    av = run.axis_values
    if not np.all(np.isfinite(av)):  # never a silently dropped row: a writer stores finite values only
        raise StoreError(f"run {run.name!r} has non-finite axis values at rows {np.flatnonzero(~np.isfinite(av))[:8].tolist()}; the store is damaged")
    rows = np.flatnonzero(av > 0)
    if rows.size < 2:
        raise InputError(f"run {run.name!r} has {rows.size} rows with a positive axis value; a fit needs more")
    try:
        return rows, log_axis(av[rows])
    except InputError as exc:
        raise InputError(f"run {run.name!r}: {exc}") from None


def fit_run(
    store: TrajectoryStore | str | os.PathLike,
    run: str,
    *,
    options: FitOptions | None = None,
    backend: str = "auto",
    device: Any = None,
    scheduler: str | None = None,
    workers: int | None = None,
    batch_rows: int = 16384,
    refit: bool = False,
    progress: bool = True,
    storage_options: Mapping | None = None,
) -> dict:
    """Fit every token of run ``run`` and store the results beside it.

    Parameters
    ----------
    store : TrajectoryStore or URL
    run : str
    options : FitOptions, optional
        Thresholds and solver settings (default ``FitOptions()``). When ``vocab_size`` is not
        set it is taken from the probe's tokenizer, if known, for the age of acquisition.
    backend, device : see :func:`tokdyn.fit.fit_sigmoids`.
    scheduler : {"threads", "processes", "sync"} or "tcp://HOST:PORT", optional
        Local dask scheduler (default ``"threads"``), or the address of a running
        dask.distributed scheduler.
    workers : int, optional
        Local workers (default: one per core).
    batch_rows : int
        Tokens fitted at once inside a block (bounds the solver's temporaries).
    refit : bool
        Discard any stored fit and fit again. Without it, a fit on the same inputs (rows, x,
        options) is resumed, and one on other inputs is an error.
    progress : bool
        Show a progress bar over blocks.

    Returns
    -------
    dict with ``n_tokens``, ``blocks``, ``blocks_fitted`` (this call), ``blocks_resumed``,
    ``seconds``, ``status_counts``, ``class_counts`` and ``class_loss_share``.
    """
    if int(batch_rows) < 1:
        raise InputError(f"batch_rows must be >= 1, got {batch_rows}")
    if workers is not None and int(workers) < 1:
        raise InputError(f"workers must be >= 1, got {workers}")
    st = store if isinstance(store, TrajectoryStore) else open_store(store, mode="r+", storage_options=storage_options)
    st._require_writable()
    r = st.run(run)
    rows, x = fit_inputs(r)
    opts = options if options is not None else FitOptions()
    if not isinstance(opts, FitOptions):
        raise InputError(f"options must be a FitOptions, got {type(opts).__name__}")
    vocab = st.probe.tokenizer.get("vocab_size")
    if vocab and opts.vocab_size is None:  # the age of acquisition needs the vocabulary size
        opts = dataclasses.replace(opts, vocab_size=int(vocab))
    backend, device = resolve_backend(backend, device)
    distributed = scheduler is not None and "://" in scheduler
    if scheduler is not None and not distributed and scheduler not in LOCAL_SCHEDULERS:
        raise InputError(f"scheduler must be one of {LOCAL_SCHEDULERS} or a tcp:// address, got {scheduler!r}")
    scheduler = scheduler or "threads"
    if scheduler in ("processes",) or distributed:
        if st.url.startswith("memory://"):
            raise InputError("a memory:// store is private to this process; use scheduler='threads' or 'sync'")

    block = r.token_chunk
    n = r.n_tokens
    n_blocks = -(-n // block)
    inputs = {
        "rows": rows.tolist(),
        "n_committed": r.n_committed,
        "x": x.tolist(),
        "options": dataclasses.asdict(opts),
        "block_tokens": block,
    }
    g = _prepare_group(r, inputs, n, block, n_blocks, refit=refit)
    done = g["done"][...]
    todo = [b for b in range(n_blocks) if not done[b]]
    t0 = time.perf_counter()
    if todo:
        task_args = dict(url=st.url, storage_options=dict(storage_options or {}), run=run, rows=rows, x=x,
                         options=opts, backend=backend, device=str(device) if device is not None else None,
                         block=block, n=n, batch_rows=int(batch_rows))  # fmt: skip
        if scheduler in ("threads", "sync"):
            task_args["store"] = st  # share the open store (and a memory:// one) with the threads
        _run_tasks(todo, task_args, scheduler=scheduler, distributed=distributed, workers=workers, progress=progress)
    seconds = time.perf_counter() - t0
    meta = dict(g.attrs["tokdyn_fit"])
    meta.update({"complete": True, "backend": backend, "finished": _now()})
    meta["seconds"] = meta.get("seconds", 0.0) + seconds
    g.update_attributes({"tokdyn_fit": meta})
    fitted = sum(min(block, n - b * block) for b in todo)  # tokens fitted by this call
    res = read_fit(st, run, fields=("status", "class_code", "drop"))
    status_counts = {STATUS_NAMES[c]: int(v) for c, v in zip(*np.unique(res["status"], return_counts=True))}
    class_counts = {CLASS_NAMES[c]: int(v) for c, v in zip(*np.unique(res["class_code"], return_counts=True))}
    return {
        "run": run,
        "n_tokens": n,
        "n_points": int(rows.size),
        "blocks": n_blocks,
        "blocks_fitted": len(todo),
        "blocks_resumed": n_blocks - len(todo),
        "seconds": seconds,
        "fits_per_s": fitted / seconds if fitted else 0.0,
        "backend": backend,
        "scheduler": scheduler,
        "status_counts": status_counts,
        "class_counts": class_counts,
        "class_loss_share": class_loss_share(res["class_code"], res["drop"]),
    }


def read_fit(store: TrajectoryStore | str | os.PathLike, run: str, *, fields=None) -> dict[str, np.ndarray]:
    """The stored fit of ``run`` as a dict of ``[token]`` arrays (all :data:`FIT_FIELDS` by default).

    Raises :class:`StoreError` when the run has not been fitted completely, or has grown since.
    """
    st = store if isinstance(store, TrajectoryStore) else open_store(store, mode="r")
    r = st.run(run)
    try:
        g = r._group["fit"]
    except KeyError:
        raise StoreError(f"run {run!r} has not been fitted; run `tokdyn fit {st.url} --run {run}` first") from None
    meta = g.attrs.get("tokdyn_fit", {})
    if not meta.get("complete"):
        raise StoreError(f"the fit of run {run!r} is incomplete (interrupted?); run `tokdyn fit` again to finish it")
    if meta.get("n_committed") != r.n_committed:
        raise StoreError(
            f"the fit of run {run!r} was made on {meta.get('n_committed')} rows; the run now has {r.n_committed}. "
            f"Refit it: `tokdyn fit {st.url} --run {run} --refit`"
        )
    names = list(FIT_FIELDS) if fields is None else list(fields)
    unknown = [f for f in names if f not in FIT_FIELDS]
    if unknown:
        raise InputError(f"unknown fit fields {unknown}; expected some of {list(FIT_FIELDS)}")
    return {name: g[name][...] for name in names}


def stored_options(store: TrajectoryStore | str | os.PathLike, run: str) -> FitOptions:
    """The :class:`FitOptions` the stored fit of ``run`` was made with."""
    st = store if isinstance(store, TrajectoryStore) else open_store(store, mode="r")
    try:
        meta = st.run(run)._group["fit"].attrs.get("tokdyn_fit", {})
    except KeyError:
        raise StoreError(f"run {run!r} has not been fitted; run `tokdyn fit {st.url} --run {run}` first") from None
    known = {f.name for f in dataclasses.fields(FitOptions)}
    return FitOptions(**{k: v for k, v in dict(meta.get("options", {})).items() if k in known})


# -- internals -----------------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _prepare_group(r: Run, inputs: dict, n: int, block: int, n_blocks: int, *, refit: bool) -> zarr.Group:
    """The run's fit group, for these inputs: resumed when it matches, else made anew (refit)."""
    parent = r._group
    if "fit" in parent.group_keys():
        g = parent["fit"]
        meta = g.attrs.get("tokdyn_fit")
        if not refit and isinstance(meta, Mapping) and all(meta.get(k) == v for k, v in inputs.items()):
            return g
        if isinstance(meta, Mapping) and not refit:
            why = "rows" if meta.get("n_committed") != inputs["n_committed"] else "options"
            raise StoreError(
                f"run {r.name!r} already has a fit made with other {why} "
                f"({meta.get('n_committed')} rows then, {inputs['n_committed']} now); pass refit=True (--refit) to replace it"
            )
        del parent["fit"]  # a refit, or a group whose creation never finished
    g = parent.create_group("fit")
    for name, dt in FIT_FIELDS.items():
        fill = np.nan if np.dtype(dt).kind == "f" else 0
        g.create_array(name, shape=(n,), chunks=(block,), dtype=dt, fill_value=fill, dimension_names=("token",))
    g.create_array("done", shape=(n_blocks,), chunks=(1,), dtype="uint8", fill_value=0, dimension_names=("fit_block",))
    g.update_attributes(
        {
            "tokdyn_fit": {
                **inputs,
                "schema_version": FIT_SCHEMA_VERSION,
                "tokdyn_version": __version__,
                "created": _now(),
                "complete": False,
                "status_names": {str(k): v for k, v in STATUS_NAMES.items()},
                "class_names": {str(k): v for k, v in CLASS_NAMES.items()},
                "model_names": {str(k): v for k, v in MODEL_NAMES.items()},
            }
        }
    )
    return g


def _fit_one_block(b: int, *, url, storage_options, run, rows, x, options, backend, device, block, n, batch_rows, store=None) -> int:
    """Fit token block ``b``: read, fit in batches, write the fields, then mark it done."""
    st = store if store is not None else open_store(url, mode="r+", storage_options=storage_options or None)
    r = st.run(run)
    g = r._group["fit"]
    a, e = b * block, min(n, (b + 1) * block)
    Y = r.losses(tokens=slice(a, e), rows=slice(0, int(rows.max()) + 1))[rows]  # [K, B] in the stored dtype; damage is a StoreError
    out = {name: np.empty(e - a, dtype=dt) for name, dt in FIT_FIELDS.items()}
    for s in range(0, e - a, batch_rows):
        part = fit_block(x, Y[:, s : s + batch_rows].T.astype(np.float64), options=options, backend=backend, device=device)
        for name in FIT_FIELDS:
            out[name][s : s + batch_rows] = part[name]
    for name in FIT_FIELDS:
        g[name][a:e] = out[name]
    g["done"][b] = 1  # the block's commit, after its data
    return e - a


def _run_tasks(todo, task_args, *, scheduler: str, distributed: bool, workers: int | None, progress: bool) -> None:
    """Run one task per block on the chosen scheduler; a task's error is raised here."""
    import dask

    tasks = [dask.delayed(_fit_one_block, pure=False)(b, **task_args) for b in todo]
    if distributed:
        try:
            from distributed import Client, as_completed
        except ImportError:
            raise InputError("a scheduler address needs dask.distributed: pip install 'tokdyn[distributed]'") from None
        try:
            client = Client(scheduler, timeout="10s")
        except OSError as exc:
            raise InputError(f"cannot reach the dask scheduler at {scheduler}: {exc}") from None
        with client:
            futures = client.compute(tasks)
            bar = _bar(len(tasks), progress)
            for fut in as_completed(futures):
                fut.result()  # re-raises a task's error here
                bar.update(1)
            bar.close()
        return
    if scheduler == "processes":
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing as mp

        # "spawn": forking a process that has started numba/torch/zarr threads can deadlock.
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count(), mp_context=mp.get_context("spawn")) as pool:
            _compute_local(tasks, progress, scheduler="processes", pool=pool)
        return
    _compute_local(tasks, progress, scheduler=scheduler, num_workers=workers)


def _compute_local(tasks, progress: bool, **kwargs) -> None:
    import dask
    from dask.callbacks import Callback

    bar = _bar(len(tasks), progress)

    class _Progress(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if isinstance(result, (int, np.integer)):
                bar.update(1)

    with _Progress():
        dask.compute(*tasks, **kwargs)
    bar.close()


def _bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="fit", unit="block", disable=not enabled, leave=False)
