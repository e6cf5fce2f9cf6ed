"""The main job on the embedded default: ``tokdyn demo``.

Builds the probe from the standard library's own source, trains the tiny GPT with the recorder
attached on a log-spaced schedule, fits a learning event to every probe token, rebuilds the
loss derivative from the events and from the learning-time spectrum, and writes the store,
``report.html`` and ``summary.json`` (the reconstruction's R^2, the spectrum exponent with its
interval, class shares, tokens fitted and the wall time of each stage) into the output folder.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path


from ._files import check_output_path
from .data import prepare_corpus
from .errors import InputError
from .analysis import analyze_store
from .fit.job import fit_run
from .reconstruct import reconstruct_run
from .report import check_writable, write_report
from .runtime import resolve_device
from .store import open_store
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
    log=print,
) -> dict:
    """Run the demo into folder ``out``; returns the summary also written to ``summary.json``."""
    resolve_device(device)  # a clear error before any work
    out = check_output_path(out, what="demo folder", folder_ok=True)  # its parent must exist: never created
    out.mkdir(exist_ok=True)
    store_path = out / "store.zarr"
    check_writable(out / "report.html")
    if store_path.exists():
        if not overwrite:
            raise InputError(f"{store_path} exists; remove it or pass overwrite")
        shutil.rmtree(store_path)
    timings = {}

    t = time.perf_counter()
    log("[1/5] corpus: standard-library source, split by file into training and probe")
    corpus = prepare_corpus(context=context, n_probe_sequences=n_probe_sequences, seed=seed)
    timings["corpus_s"] = time.perf_counter() - t
    log(f"      {corpus.n_train_documents} training files ({corpus.train_tokens.size:,} tokens), "
        f"{corpus.n_probe_documents} probe files -> {corpus.probe.n_tokens:,} probe tokens")  # fmt: skip

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
        "fit": {k: fit[k] for k in ("n_tokens", "n_points", "backend", "scheduler", "status_counts", "class_counts", "class_loss_share")},
        "tokens_fitted": int(fit["n_tokens"]) - int(fit["class_counts"].get("unfit", 0)),
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
        "spectrum_exponent": None if sp is None else {"alpha": sp.alpha, "ci95": [sp.alpha_lo, sp.alpha_hi], "r2_log": sp.r2, "x_fit": list(sp.x_fit)},
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
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"done: {summary['checkpoints_recorded']} checkpoints x {summary['tokens_recorded']:,} tokens, "
        f"mean probe loss {summary['mean_probe_loss_first']:.2f} -> {summary['mean_probe_loss_last']:.2f} nats, "
        f"{summary['timings_s']['total_s']:.0f} s; wrote {out / 'report.html'} and {out / 'summary.json'}")  # fmt: skip
    drops = main.class_drops  # shares, or nats where they would mean nothing
    log(f"share of the loss drop by class: {drops.listing()}" if drops.meaningful else
        f"loss change by class, in nats per probe token: {drops.listing()}; no shares of the loss drop: {drops.reason}, "
        "so they would mean nothing")  # fmt: skip
    return summary
