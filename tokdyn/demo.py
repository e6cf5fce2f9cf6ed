"""The main job on the embedded default: ``tokdyn demo``.

Builds the probe from the standard library's own source, trains the tiny GPT with the recorder
attached on a log-spaced schedule, and writes the store plus ``summary.json`` (stage timings and
what was recorded and fitted) into the output folder, then fits a learning event to every
probe token. Later stages (spectrum, report) extend it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from .data import prepare_corpus
from .errors import InputError
from .fit.job import fit_run
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
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"--device: not a torch device: {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available on this machine")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    store_path = out / "store.zarr"
    if store_path.exists():
        if not overwrite:
            raise InputError(f"{store_path} exists; remove it or pass overwrite")
        shutil.rmtree(store_path)
    timings = {}

    t = time.perf_counter()
    log("[1/3] corpus: standard-library source, split by file into training and probe")
    corpus = prepare_corpus(context=context, n_probe_sequences=n_probe_sequences, seed=seed)
    timings["corpus_s"] = time.perf_counter() - t
    log(f"      {corpus.n_train_documents} training files ({corpus.train_tokens.size:,} tokens), "
        f"{corpus.n_probe_documents} probe files -> {corpus.probe.n_tokens:,} probe tokens")  # fmt: skip

    t = time.perf_counter()
    log(f"[2/3] train the tiny GPT for {steps} steps, recording the probe at ~{n_points} log-spaced steps")
    stats = record_tiny_run(str(store_path), corpus=corpus, train_config=TrainConfig(steps=steps, seed=seed),
                            n_points=n_points, device=device, progress=progress)  # fmt: skip
    timings["train_record_s"] = time.perf_counter() - t

    t = time.perf_counter()
    log("[3/3] fit one sigmoid learning event (and the models it is compared with) per token")
    fit = fit_run(str(store_path), "tiny", progress=progress)
    timings["fit_s"] = time.perf_counter() - t

    run = open_store(store_path, mode="r").run("tiny")
    losses = run.losses()
    mean = np.nanmean(losses, axis=1)
    summary = {
        "store": str(store_path),
        "probe_fingerprint": corpus.probe.fingerprint,
        "tokens_recorded": int(losses.shape[1]),
        "checkpoints_recorded": int(losses.shape[0]),
        "steps": run.steps.tolist(),
        "mean_probe_loss_first": float(mean[0]),
        "mean_probe_loss_last": float(mean[-1]),
        "n_params": run.attrs.get("n_params"),
        "n_params_non_embedding": run.attrs.get("n_params_non_embedding"),
        "final_train_loss": stats["final_train_loss"],
        "recorder_seconds_in_training_thread": stats["record_seconds"],
        "fit": {k: fit[k] for k in ("n_points", "backend", "scheduler", "status_counts", "class_counts", "class_loss_share")},
        "timings_s": {**timings, "total_s": sum(timings.values())},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"done: {summary['checkpoints_recorded']} checkpoints x {summary['tokens_recorded']:,} tokens, "
        f"mean probe loss {summary['mean_probe_loss_first']:.2f} -> {summary['mean_probe_loss_last']:.2f} nats, "
        f"{summary['timings_s']['total_s']:.0f} s; wrote {out / 'summary.json'}")  # fmt: skip
    shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(fit["class_loss_share"].items(), key=lambda kv: -abs(kv[1])) if abs(v) >= 0.005)
    log(f"share of the loss drop by class: {shares}")
    return summary
