"""Scaling sweep: rebuild -dL/dlog D and -dL/dlog M from per-token learning events.

Trains tiny GPTs on the standard-library corpus into ONE store that shares one probe:

- an **M sweep**: models of increasing size (non-embedding parameters), one data budget;
- a **D sweep**: one model size, increasing data budgets, each run a complete schedule (warm-up
  and cosine decay fitted to its own length).

Each run records the probe on a short log-spaced schedule (its own T axis); its final row is its
point on the D or M axis. The axes are assembled (``tokdyn.axes.assemble_axis``), fitted with
``tokdyn fit``'s code path, reconstructed, and written to DIR/report.html and DIR/sweep.json.

    python pipelines/scaling_sweep.py --out scaling-sweep          # defaults: <= 20 min on 2 CPU cores
    python pipelines/scaling_sweep.py --out /tmp/sweep --quick     # seconds, for tests
    python pipelines/scaling_sweep.py --out sweep --device cuda --scale 4   # bigger, on a GPU
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from tokdyn.analysis import analyze_store
from tokdyn.axes import assemble_axis
from tokdyn.data import prepare_corpus
from tokdyn.errors import TokdynError
from tokdyn.fit.job import fit_run
from tokdyn.model import GPTConfig
from tokdyn.reconstruct import reconstruct_run
from tokdyn.report import check_writable, write_report
from tokdyn.train import TrainConfig, record_tiny_run
from tokdyn.store import as_store

# (n_layer, n_embd, n_head): non-embedding parameters grow ~1000x over the sweep (3 decades),
# so that -dL/dlog M has structure to rebuild, not only a level.
SIZES = [(1, 8, 2), (1, 16, 2), (1, 32, 2), (2, 48, 4), (2, 64, 4), (2, 96, 4), (3, 128, 4), (4, 160, 4)]
SIZES_QUICK = [(1, 8, 2), (1, 12, 2), (1, 16, 2), (2, 16, 2), (2, 24, 2), (2, 32, 2)]
D_MODEL = (2, 96, 4)
D_MODEL_QUICK = (1, 16, 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="scaling-sweep", help="output folder (store.zarr, report.html, sweep.json)")
    ap.add_argument("--quick", action="store_true", help="tiny models and budgets (seconds; for tests)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--scale", type=int, default=1, help="multiply widths and budgets (for a GPU)")
    ap.add_argument("--m-steps", type=int, help="training steps of every M-sweep run (default 400; quick 30)")
    ap.add_argument("--d-steps", help="comma-separated step budgets of the D sweep (default 6,12,25,...,1600; quick 6..96)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--points", type=int, default=6, help="log-spaced recording points per run (its own T axis)")
    ap.add_argument("--probe-sequences", type=int, help="probe sequences (default 64; quick 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--analyze-only", action="store_true", help="reuse the runs already in OUT/store.zarr: assemble, fit, rebuild, report")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        result = run_sweep(args)
    except TokdynError as exc:
        print(f"scaling_sweep: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result["headline"]))
    return 0


def run_sweep(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check_writable(out / "report.html")
    store = out / "store.zarr"
    if store.exists() and not args.analyze_only:
        shutil.rmtree(store)
    quick, k = args.quick, max(1, int(args.scale))
    context = 32 if quick else 128
    sizes = [(l, e * k, h) for l, e, h in (SIZES_QUICK if quick else SIZES)]
    d_model = D_MODEL_QUICK if quick else D_MODEL
    d_model = (d_model[0], d_model[1] * k, d_model[2])
    m_steps = args.m_steps or (30 if quick else 400) * k
    d_steps = [int(s) for s in args.d_steps.split(",")] if args.d_steps else [s * k for s in ((6, 12, 24, 48, 72, 96) if quick else (6, 12, 25, 50, 100, 200, 400, 800, 1600))]
    t0 = time.perf_counter()
    corpus = prepare_corpus(context=context, n_probe_sequences=args.probe_sequences or (8 if quick else 64), seed=args.seed)
    timings, runs = {}, {"M": [], "D": []}

    def train(name: str, arch: tuple, steps: int) -> None:
        if args.analyze_only:
            return
        n_layer, n_embd, n_head = arch
        mcfg = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, context=context, n_layer=n_layer, n_embd=n_embd, n_head=n_head)
        t = time.perf_counter()
        record_tiny_run(str(store), run=name, corpus=corpus, model_config=mcfg, n_points=args.points, device=args.device,
                        train_config=TrainConfig(steps=steps, batch_size=args.batch_size, seed=args.seed,
                                                 warmup=max(1, min(20, steps // 10))),
                        progress=not args.no_progress)  # fmt: skip
        timings[name] = round(time.perf_counter() - t, 1)
        print(f"  {name}: {n_layer} layers x {n_embd}, {steps} steps, {timings[name]} s", file=sys.stderr)

    print(f"M sweep: {len(sizes)} sizes at {m_steps} steps", file=sys.stderr)
    for i, arch in enumerate(sizes):
        train(f"M{i}", arch, m_steps)
        runs["M"].append(f"M{i}")
    print(f"D sweep: {len(d_steps)} budgets of the {d_model[0]}x{d_model[1]} model", file=sys.stderr)
    for i, steps in enumerate(d_steps):
        train(f"D{i}", d_model, steps)
        runs["D"].append(f"D{i}")
    t = time.perf_counter()
    for axis in ("M", "D"):
        assemble_axis(str(store), axis, runs=runs[axis], overwrite=args.analyze_only)
        fit_run(as_store(str(store), mode="r+").run(f"axis-{axis}"), progress=False)
    analysis = analyze_store(str(store), runs=["axis-M", "axis-D"])
    timings["fit_and_reconstruct"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    write_report(str(store), out / "report.html", analysis=analysis, title="tokdyn scaling sweep: D and M axes",
                 extra={"sizes (layers, width, heads)": sizes, "M-sweep steps": m_steps, "D-sweep model": d_model,
                        "D-sweep steps": d_steps, "batch": f"{args.batch_size} x {context} tokens"})  # fmt: skip
    timings["report"] = round(time.perf_counter() - t, 1)
    timings["total"] = round(time.perf_counter() - t0, 1)
    summaries = {a.axis: a.summary() for a in analysis.runs}
    for axis in ("D", "M"):  # the other event sets, for comparison (docs/method.md)
        for which in ("bic", "classified"):
            other = reconstruct_run(as_store(str(store)).run(f"axis-{axis}"), which=which, n_boot=0)
            summaries[axis][f"r2_events_{which}"] = other.r2_events
            summaries[axis][f"r2_spectrum_{which}"] = other.r2_spectrum
    headline = {
        "quick": quick,
        "n_tokens": corpus.probe.n_tokens,
        **{f"r2_events_{ax}": summaries[ax]["r2_events"] for ax in ("D", "M")},
        **{f"r2_spectrum_{ax}": summaries[ax]["r2_spectrum"] for ax in ("D", "M")},
        **{f"r2_events_bic_{ax}": summaries[ax]["r2_events_bic"] for ax in ("D", "M")},
        **{f"drop_share_events_{ax}": summaries[ax]["drop_share_events"] for ax in ("D", "M")},
        "total_s": timings["total"],
    }
    result = {"headline": headline, "axes": summaries, "timings_s": timings, "sizes": sizes, "m_steps": m_steps,
              "d_model": d_model, "d_steps": d_steps, "batch_size": args.batch_size, "context": context}  # fmt: skip
    (out / "sweep.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.exit(main())
