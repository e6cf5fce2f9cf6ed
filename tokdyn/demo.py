"""The main job on the embedded default: ``tokdyn demo``.

Builds the probe from the standard library's own source, trains the tiny GPT with the recorder
attached on a log-spaced schedule, fits a learning event to every probe token, rebuilds the
loss derivative from the events and from the learning-time spectrum, and writes the store,
``report.html`` and ``summary.json`` (the reconstruction's R^2, the spectrum exponent with its
interval, class shares, tokens fitted and the wall time of each stage) into the output folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np

from ._checks import is_int
from ._files import DEMO_STORE, check_output_path, remove_store_folder, strict_json
from ._text import say
from .data import prepare_corpus
from .errors import InputError
from .analysis import analyze_store
from .fit.job import fit_run
from .fit.options import FitOptions
from .reconstruct import MeasuredMeanWarning, reconstruct_run
from .report import check_writable, write_report
from .runtime import resolve_device
from .schedule import geometric_schedule
from .store import open_store
from .store.locks import KeyLock
from .train import TrainConfig, record_tiny_run

__all__ = ["run_demo"]


def run_demo(
    out: str | Path = "tokdyn-demo",
    *,
    steps: int = 800,
    n_points: int = 40,
    n_probe_sequences: int = 128,
    context: int = 128,
    device: str = "cpu",
    seed: int = 0,
    overwrite: bool = True,
    progress: bool = True,
    log=say,
) -> dict:
    """Run the demo into folder ``out``; returns the summary also written to ``summary.json``."""
    resolve_device(device)  # a clear error before any work
    if not str(out).strip():  # `--out "$DIR"` with DIR unset: never the current folder by accident
        raise InputError("the demo folder (--out) is an empty path; give a folder such as tokdyn-demo")
    out = check_output_path(out, what="demo folder", folder_ok=True)  # its parent must exist: never created
    _check_demo_folder(out)
    check_settings(steps=steps, n_points=n_points, n_probe_sequences=n_probe_sequences, seed=seed)
    out.mkdir(exist_ok=True)
    with _folder_lock(out) as lock:
        return _run_demo(out, lock, steps=steps, n_points=n_points, n_probe_sequences=n_probe_sequences, context=context,
                         device=device, seed=seed, overwrite=overwrite, progress=progress, log=log)  # fmt: skip


DEMO_RUN = "tiny"
_LOCK = ".tokdyn-demo.lock"  # held in the demo folder while a demo writes there


def check_settings(*, steps, n_points, n_probe_sequences, seed) -> None:
    """Refuse, before any work, settings the demo cannot finish with: a count out of range, or
    steps and points whose schedule records fewer steps after step 0 than a fit needs (found
    before, only after the whole training, by the fit)."""
    for name, option, value, lo in (("steps", "--steps", steps, 1), ("n_points", "--points", n_points, 2),
                                    ("n_probe_sequences", "--probe-sequences", n_probe_sequences, 1),
                                    ("seed", "--seed", seed, 0)):  # fmt: skip
        if not is_int(value) or not lo <= value < 2**62:
            raise InputError(f"{name} ({option}) must be an integer >= {lo}, got {value!r}")
    need = FitOptions().min_points
    recorded = int(np.count_nonzero(geometric_schedule(int(steps), int(n_points)) > 0))
    if recorded < need:
        fix = f"raise steps (--steps) to {need} at least" if steps < need else "raise n_points (--points)"
        raise InputError(f"steps={steps} (--steps) with n_points={n_points} (--points) records {recorded} step"
                         f"{'s' * (recorded != 1)} after step 0; a fit of each token needs {need}: {fix}")  # fmt: skip


def _check_demo_folder(out: Path) -> None:
    """Refuse an output folder that is a store itself, or whose ``store.zarr`` is not one a demo
    left there: the demo replaces its own store, and no other (it deleted any, runs and all)."""
    if not out.is_dir():
        return
    if (out / "zarr.json").exists():
        raise InputError(f"the demo folder {out} is a zarr store itself; the demo writes a folder of its own "
                         f"({DEMO_STORE}, report.html, summary.json): give a new folder")  # fmt: skip
    sp = out / DEMO_STORE
    if not os.path.lexists(sp):
        return
    if sp.is_symlink() or not sp.is_dir():
        raise InputError(f"{sp} is not a store an earlier demo left (it is a {'link' if sp.is_symlink() else 'file'}); "
                         "the demo would replace it: move it, or give another folder")  # fmt: skip
    entries = set(os.listdir(sp))
    if not entries:
        return
    # the runs as the store lists them (no hidden folder: .snapshot, .ipynb_checkpoints); a demo
    # stopped before it made its run left its store without one
    runs = ({e.name for e in os.scandir(sp / "runs") if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")}
            if (sp / "runs").is_dir() else set())  # fmt: skip
    if "zarr.json" not in entries or not runs <= {DEMO_RUN}:
        what = f"runs {', '.join(sorted(runs))}" if runs else "no run"
        raise InputError(f"{sp} is not a store an earlier demo left (it holds {what}; a demo's holds run {DEMO_RUN!r} "
                         "alone); the demo would replace it: move it, or give another folder")  # fmt: skip


@contextlib.contextmanager
def _folder_lock(out: Path):
    """The demo folder's lock, the store's own writer lock (:class:`tokdyn.store.locks.KeyLock`,
    one JSON file created whole and exclusively): a second demo into the same folder while one
    runs is refused (it deleted the first's store under its recorder); one left by a demo that is
    gone is taken over. Yields the lock: :meth:`KeyLock.check` before destroying anything."""
    from zarr.storage import LocalStore

    lock = KeyLock(LocalStore(out), _LOCK, what=f"the demo folder {out}", if_gone=f"remove {out / _LOCK} and try again")
    try:
        lock.claim()
    except OSError as exc:
        raise InputError(f"cannot write in the demo folder {out}: {exc.strerror or exc}") from None
    try:
        yield lock
    finally:
        lock.release()


_TRASH = ".store.zarr.removing"  # the earlier demo's store, moved aside whole before it is deleted (remove_store_folder)


def _remove_store(store_path: Path) -> None:
    """Delete the earlier demo's store in one step as far as a rerun can tell (moved aside first:
    deleted in place, a Ctrl-C part-way left a store without its ``zarr.json`` that every rerun
    refused as not a demo's)."""
    remove_store_folder(store_path, what="demo store")


def _run_demo(out: Path, lock: KeyLock, *, steps, n_points, n_probe_sequences, context, device, seed, overwrite, progress, log) -> dict:
    store_path = out / DEMO_STORE
    check_writable(out / "report.html")
    if store_path.exists() and not overwrite:
        raise InputError(f"{store_path} exists; remove it or pass overwrite")
    timings = {}

    t = time.perf_counter()
    log("[1/5] corpus: standard-library source, split by file into training and probe")
    # before the earlier demo's results go: a setting only the corpus can refuse (a probe of more
    # windows than it holds) deleted them, then failed, leaving an empty folder
    corpus = prepare_corpus(context=context, n_probe_sequences=n_probe_sequences, seed=seed)
    timings["corpus_s"] = time.perf_counter() - t
    log(f"      {corpus.n_train_documents} training files ({corpus.train_tokens.size:,} tokens), "
        f"{corpus.n_probe_documents} probe files -> {corpus.probe.n_tokens:,} probe tokens")  # fmt: skip

    lock.check()  # still ours (not taken over by a demo that judged this one gone)
    if store_path.exists():
        # the results of the store being replaced go with it: a run stopped or failed after this
        # never leaves a summary.json or report.html of a store that is no longer there
        for stale in (out / "summary.json", out / "report.html"):
            stale.unlink(missing_ok=True)
    _remove_store(store_path)

    t = time.perf_counter()
    log(f"[2/5] train the tiny GPT for {steps} steps, recording the probe at ~{n_points} log-spaced steps")
    stats = record_tiny_run(str(store_path), corpus=corpus, train_config=TrainConfig(steps=steps, seed=seed),
                            n_points=n_points, device=device, progress=progress)  # fmt: skip
    timings["train_record_s"] = time.perf_counter() - t

    t = time.perf_counter()
    log("[3/5] fit one sigmoid learning event (and the models it is compared with) per token")
    run = open_store(store_path, mode="r+").run("tiny")
    fit = fit_run(run, progress=progress).summary()
    timings["fit_s"] = time.perf_counter() - t

    t = time.perf_counter()
    log("[4/5] learning-time spectrum and the loss derivative it rebuilds")
    analysis = analyze_store(run.store, runs=["tiny"])
    main = analysis.runs[0]
    rec = main.reconstruction
    # The same reconstruction with only the events BIC chose, for comparison (docs/method.md).
    # Its notes on the measured mean are the analysis's, already said: not a second time.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MeasuredMeanWarning)
        bic = reconstruct_run(run, which="bic", n_boot=0)
    timings["spectrum_s"] = time.perf_counter() - t
    log(f"      R^2 of -dL/dlog10 t: sum of fitted sigmoids {rec.r2_events:.3f}, spectrum alone {rec.r2_spectrum:.3f}")

    t = time.perf_counter()
    log("[5/5] report")
    timings["report_s"] = 0.0  # filled in below; the report shows the timings so far
    mean = rec.mean_loss
    sp, lp = rec.spectrum_power_law, rec.loss_power_law
    summary = {
        "store": str(store_path),
        "report": str(out / "report.html"),
        "probe_fingerprint": corpus.probe.fingerprint,
        "tokens_recorded": int(run.n_tokens),
        "checkpoints_recorded": int(run.n_committed),
        "steps": run.steps.tolist(),
        "mean_probe_loss_first": float(mean[0]),
        "mean_probe_loss_last": float(mean[-1]),
        "n_params": run.attrs.get("n_params"),
        "n_params_non_embedding": run.attrs.get("n_params_non_embedding"),
        "final_train_loss": stats["final_train_loss"],
        "recorder_seconds_in_training_thread": stats["record_seconds"],
        "fit": {k: fit[k] for k in ("n_tokens", "n_points", "backend", "scheduler", "status_counts", "class_counts", "class_loss_share",
                                    "n_unscored")},
        # the class counts are of the scored tokens (FitSummary): those never scored are no fitted token either
        "tokens_fitted": sum(fit["class_counts"].values()) - int(fit["class_counts"].get("unfit", 0)),
        "reconstruction": {
            "axis": "T",
            "events": "two_step",
            "r2_sigmoid_sum": rec.r2_events,
            "r2_spectrum": rec.r2_spectrum,
            "rel_l2_sigmoid_sum": rec.rel_l2_events,
            "rel_l2_spectrum": rec.rel_l2_spectrum,
            "r2_sigmoid_sum_analytic": rec.r2_events_analytic,
            "r2_sigmoid_sum_bic_events": bic.r2_events,
            "r2_spectrum_bic_events": bic.r2_spectrum,
            "drop_share_events": rec.drop_share_events,
            "drop_share_well_fitted": rec.drop_share_well_fitted,
            "bandwidth_decades": rec.spectrum.bandwidth,
        },
        "spectrum_exponent": None if sp is None else {"alpha": sp.alpha, "ci95": [sp.alpha_lo, sp.alpha_hi], "r2_log": sp.r2, "x_fit": list(sp.x_fit),
                                                      "ci95_resampled": sp.params.get("resampled"), "ci95_units": sp.params.get("n_units")},
        "loss_exponent": None if lp is None else {"alpha": lp.alpha, "ci95": [lp.alpha_lo, lp.alpha_hi], "r2": lp.r2, "L_inf": lp.params["L_inf"]},
        "class_shares_of_loss_drop": fit["class_loss_share"],
        "token_stats": main.stats.summary() if main.stats is not None else None,
        "timings_s": timings,
    }
    extra = {"wall time so far (s)": {k: round(v, 1) for k, v in timings.items() if k != "report_s"},
             "tokens fitted": summary["tokens_fitted"], "final train loss (nats)": stats["final_train_loss"]}  # fmt: skip
    write_report(str(store_path), out / "report.html", analysis=analysis, title="tokdyn demo: tiny GPT on the standard library", extra=extra)
    timings["report_s"] = time.perf_counter() - t
    summary["timings_s"] = {**timings, "total_s": sum(timings.values())}
    # strict JSON (NaN, say an exponent without an interval, as null): jq and most parsers refuse NaN
    (out / "summary.json").write_text(json.dumps(strict_json(summary), indent=2, allow_nan=False))
    log(f"done: {summary['checkpoints_recorded']} checkpoints x {summary['tokens_recorded']:,} tokens, "
        f"mean probe loss {summary['mean_probe_loss_first']:.2f} -> {summary['mean_probe_loss_last']:.2f} nats, "
        f"{summary['timings_s']['total_s']:.0f} s; wrote {out / 'report.html'} and {out / 'summary.json'}")  # fmt: skip
    drops = main.class_drops  # shares, or nats where they would mean nothing
    log(f"share of the loss drop by class: {drops.listing()}" if drops.meaningful else
        f"loss change by class, in nats per probe token: {drops.listing()}; no shares of the loss drop: {drops.reason}, "
        "so they would mean nothing")  # fmt: skip
    note = drops.multi_step_note()
    if note:
        log(note)
    return summary
