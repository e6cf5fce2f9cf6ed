"""Scaling sweep: rebuild -dL/dlog D and -dL/dlog M from per-token learning events.

Trains tiny GPTs on the standard-library corpus into ONE store that shares one probe:

- a **D sweep** from one run (``tokdyn.sweep.branched_decay_sweep``): a trunk of the D model at
  a constant learning rate after warm-up, recorded as a T run, with a short linear decay (15 %
  of the budget) branched off at each of >= 20 budgets spaced <= 0.1 decade apart; each
  branch's end is one D point (``--trunk-factor 2`` trains the trunk on to twice the largest
  budget: measured worse for D from T, docs/benchmarks.md); 7 calibration branches at other budgets (the geometric midpoints
  of every third gap of the D grid) decay over 15 % and, again, over 30 % of their budget: no
  D point, they calibrate the loss a decay gains over the trunk (``tokdyn.annealing``);
- an **M sweep**: >= 16 model sizes (widths and depths; ``--m-family width``: depth 2 only,
  growing in width), each trained at one data budget with warm-up and cosine decay and a
  learning rate set by width (``lr_for_width``), at 2 seeds whose final per-token losses are
  averaged into one M point.

The axes are assembled (``tokdyn.axes.assemble_axis``), fitted with ``tokdyn fit``'s code path
and rebuilt; the trunk is fitted too (from the end of its warm-up on: ``--trunk-axis-min``), and
the D axis is rebuilt a second time from the trunk's events alone (no fit on D), each budget
placed at its effective step on the trunk (tokens seen, or the area under the learning-rate
curve), and by the area with each point's annealing gain
(Tissue et al. 2024) calibrated on the calibration branches: the 15 % set is the prediction
reported against the target, the 30 % set checks that the calibration carries to another decay
length. Results go to DIR/report.html and DIR/sweep.json.

    python pipelines/scaling_sweep.py --out scaling-sweep          # defaults: <= 20 min on 2 CPU cores
    python pipelines/scaling_sweep.py --out /tmp/sweep --quick     # seconds, for tests
    python pipelines/scaling_sweep.py --out sweep --device cuda --scale 4   # bigger, on a GPU
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

import tokdyn
from tokdyn._files import remove_store_folder
from tokdyn.analysis import analyze_store
from tokdyn.annealing import fit_annealing_gain
from tokdyn.axes import assemble_axis
from tokdyn.data import prepare_corpus, random_batches
from tokdyn.errors import InputError, TokdynError
from tokdyn.fit.job import fit_run
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.reconstruct import reconstruct_across, reconstruct_run
from tokdyn.report import check_writable, write_report
from tokdyn.sweep import DecaySweepConfig, branched_decay_sweep, log_budgets
from tokdyn.train import TrainConfig, record_tiny_run

# (n_layer, n_embd, n_head): 18 sizes, 0.9k-450k non-embedding parameters (2.7 decades, about
# 0.16 decade apart); depth grows with width, as in the usual model families.
SIZES = [(1, 8, 2), (1, 10, 2), (1, 12, 2), (1, 16, 2), (1, 20, 2), (2, 16, 2), (2, 20, 2), (2, 24, 4), (2, 28, 4),
         (2, 32, 4), (2, 40, 4), (2, 48, 4), (3, 48, 4), (3, 56, 4), (3, 64, 4), (3, 80, 4), (4, 80, 4), (4, 96, 4)]  # fmt: skip
SIZES_QUICK = [(1, 8, 2), (1, 10, 2), (1, 12, 2), (1, 16, 2), (1, 20, 2), (2, 16, 2), (2, 20, 2), (2, 24, 4)]
# --m-family width: one depth and one head count, widths 8-128 log-spaced (even), 1.6k-400k
# non-embedding parameters, so that no depth step falls inside the axis (measured worse: the
# per-size noise, not depth steps, dominated; docs/benchmarks.md).
SIZES_WIDTH = [(2, w, 2) for w in (8, 10, 12, 14, 16, 18, 22, 26, 30, 34, 40, 48, 56, 66, 78, 92, 108, 128)]
SIZES_WIDTH_QUICK = [(2, w, 2) for w in (8, 10, 12, 14, 16, 18, 20, 24)]
CAL_FRACS = (0.15, 0.30)  # decay shares of the calibration branches: the D points' own, and twice it
D_MODEL = (2, 96, 4)
D_MODEL_QUICK = (1, 16, 2)


def lr_for_width(n_embd: int, *, base: float = 3e-3, base_width: int = 96) -> float:
    """The M sweep's learning rate: ``base * sqrt(base_width / n_embd)``, 3e-3 at the D model's
    width 96 (the demo's rate), 1.04e-2 at width 8. Adam's best rate falls with width (about as
    1/width under muP for hidden weights; Kaplan et al. 2020 fit a slow fall with size); the
    square root is the milder rule for models this small, where embeddings dominate."""
    return base * math.sqrt(base_width / n_embd)


def calibration_budgets(budgets: list[int]) -> list[int]:
    """The calibration branches' budgets: the geometric midpoints of every third gap of the D
    grid, from the third on (7 of the default 22 budgets' gaps, spread over the whole range),
    leaving out any that falls on a D budget."""
    mids = [int(round(math.sqrt(budgets[i] * budgets[i + 1]))) for i in range(2, len(budgets) - 1, 3)]
    return sorted(set(mids) - set(budgets))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="scaling-sweep", help="output folder (store.zarr, report.html, sweep.json)")
    ap.add_argument("--quick", action="store_true", help="tiny models and budgets (seconds; for tests)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--scale", type=int, default=1, help="multiply widths and budgets (for a GPU)")
    ap.add_argument("--m-steps", type=int, help="training steps of every M-sweep run (default 400; quick 40)")
    ap.add_argument("--m-family", choices=("mixed", "width"), default="mixed",
                    help="M sizes: depth growing with width (default), or depth 2 growing in width only")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per M size, averaged (default 2)")
    ap.add_argument("--d-budgets", type=int, help="number of D budgets, log-spaced (default 22; quick 20)")
    ap.add_argument("--d-range", help="first,last D budget in steps (default 25,1600; quick 10,120)")
    ap.add_argument("--decay-frac", type=float, default=0.15, help="each D branch decays over this share of its budget")
    ap.add_argument("--trunk-factor", type=float, default=1.0,
                    help="the trunk trains to this multiple of the largest D budget (default 1; 2 was measured worse, docs/benchmarks.md)")
    ap.add_argument("--trunk-axis-min", type=float,
                    help="fit the trunk from this step on (default: the end of its warm-up, 10 steps, 5 with --quick; 0 fits every step)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--context", type=int, help="tokens per sequence (default 64; quick 32)")
    ap.add_argument("--points", type=int, default=2, help="log-spaced recording points per M run (its own T axis)")
    ap.add_argument("--probe-sequences", type=int, help="probe sequences (default 128; quick 8)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--analyze-only", action="store_true", help="reuse the runs already in OUT/store.zarr: assemble, fit, rebuild, report")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
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
    path = out / "store.zarr"
    if not args.analyze_only:  # the store an earlier sweep left, made again (never a link, a file or another folder)
        remove_store_folder(path, what="sweep store")
    quick, k = args.quick, max(1, int(args.scale))
    context = args.context or (32 if quick else 64)
    family = {("mixed", False): SIZES, ("mixed", True): SIZES_QUICK, ("width", False): SIZES_WIDTH, ("width", True): SIZES_WIDTH_QUICK}
    sizes = [(l, e * k, h) for l, e, h in family[(args.m_family, quick)]]
    d_model = D_MODEL_QUICK if quick else D_MODEL
    d_model = (d_model[0], d_model[1] * k, d_model[2])
    m_steps = args.m_steps or (40 if quick else 400) * k
    first, last = (int(v) for v in args.d_range.split(",")) if args.d_range else ((10, 120) if quick else (25, 1600))
    budgets = log_budgets(first * k, last * k, args.d_budgets or (20 if quick else 22))
    spacing = float(np.max(np.diff(np.log10(budgets))))
    t0, cpu0 = time.perf_counter(), time.process_time()
    corpus = prepare_corpus(context=context, n_probe_sequences=args.probe_sequences or (8 if quick else 128), seed=args.seed)
    store = tokdyn.open_store(str(path), corpus.probe, mode="a")
    timings, runs_m = {}, []
    tokens_per_step = args.batch_size * context

    def gpt(arch: tuple) -> GPTConfig:
        n_layer, n_embd, n_head = arch
        return GPTConfig(vocab_size=corpus.tokenizer.vocab_size, context=context, n_layer=n_layer, n_embd=n_embd, n_head=n_head)

    seeds = [args.seed + j for j in range(max(1, args.seeds))]
    print(f"M sweep: {len(sizes)} sizes x {len(seeds)} seeds at {m_steps} steps", file=sys.stderr)
    for i, arch in enumerate(sizes):
        for seed in seeds:
            name = f"M{i:02d}s{seed}"
            runs_m.append(name)
            if args.analyze_only:
                continue
            t = time.perf_counter()
            lr = lr_for_width(arch[1] // k)
            record_tiny_run(str(path), run=name, corpus=corpus, model_config=gpt(arch), n_points=args.points, device=args.device,
                            train_config=TrainConfig(steps=m_steps, batch_size=args.batch_size, seed=seed, lr=lr,
                                                     warmup=max(1, min(20, m_steps // 10))),
                            progress=False)  # fmt: skip
            timings[name] = round(time.perf_counter() - t, 1)
            print(f"  {name}: {arch[0]} layers x {arch[1]}, lr {lr:.2e}, {m_steps} steps, {timings[name]} s", file=sys.stderr)
    timings["M_runs"] = round(sum(v for n, v in timings.items() if n.startswith("M")), 1)

    cal_budgets = calibration_budgets(budgets)
    fracs = (args.decay_frac, 2 * args.decay_frac)
    calibration = tuple((b, f) for f in fracs for b in cal_budgets)
    cfg = DecaySweepConfig(budgets=tuple(budgets), lr=3e-3, warmup=5 if quick else 10, decay_frac=args.decay_frac,
                           trunk_points=40, seed=args.seed, calibration=calibration,
                           trunk_steps=int(round(args.trunk_factor * budgets[-1])))  # fmt: skip
    print(f"D sweep: {len(budgets)} budgets {budgets[0]}-{budgets[-1]} steps (<= {spacing:.3f} decade apart) "
          f"of the {d_model[0]}x{d_model[1]} model; calibration branches at {cal_budgets} over {fracs}", file=sys.stderr)  # fmt: skip
    decay = None
    if not args.analyze_only:
        t = time.perf_counter()
        torch.manual_seed(args.seed)
        model = TinyGPT(gpt(d_model)).to(args.device)

        def batches(start: int):  # the stream from update `start` on: a function of the step
            return random_batches(corpus.train_tokens, batch_size=args.batch_size, context=context,
                                  seed=args.seed * 1_000_003 + start, device=args.device)  # fmt: skip

        decay = branched_decay_sweep(model, batches, corpus.probe, store, cfg, tokens_per_step=tokens_per_step, prefix="D",
                                     run_attrs={"model_config": gpt(d_model).to_dict(), "seed": args.seed},
                                     device=args.device)  # fmt: skip
        timings["D_runs"] = round(time.perf_counter() - t, 1)
        print(f"  trunk and {len(budgets)} branches: {decay.steps_trained} steps, {timings['D_runs']} s", file=sys.stderr)
    runs_d = [f"D{i:02d}" for i in range(len(budgets))]

    t = time.perf_counter()
    axis_runs = {"M": assemble_axis(store, "M", runs=runs_m, overwrite=args.analyze_only, repeats="mean"),
                 "D": assemble_axis(store, "D", runs=runs_d, overwrite=args.analyze_only)}  # fmt: skip
    trunk = store.run("D-trunk")
    # The trunk's events are fitted from the end of its warm-up on: during the warm-up every
    # token's loss falls from chance towards its unigram level while the rate ramps up, and that
    # drop would take one of each token's two events (docs/spectrum.md, "D rebuilt from T").
    trunk_min = float(cfg.warmup if args.trunk_axis_min is None else args.trunk_axis_min)
    for r in (axis_runs["M"], axis_runs["D"]):
        fit_run(r, progress=False, refit=args.analyze_only)
    fit_run(trunk, progress=False, refit=args.analyze_only, axis_min=trunk_min)
    timings["fit"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    analysis = analyze_store(store, runs=["axis-M", "axis-D"])
    summaries = {a.run: a.summary() for a in analysis.runs}
    axes = {"D": summaries["axis-D"], "M": summaries["axis-M"], "T (D trunk)": reconstruct_run(trunk, n_boot=0).summary()}
    for axis in ("D", "M"):  # the other event sets, for comparison (docs/method.md)
        for which in ("bic", "classified"):
            try:
                other = reconstruct_run(axis_runs[axis], which=which, n_boot=0)
            except InputError:  # no event of this set (the classified set of a tiny --quick probe)
                other = None
            axes[axis][f"r2_events_{which}"] = other.r2_events if other else None
            axes[axis][f"r2_spectrum_{which}"] = other.r2_spectrum if other else None
    across_rec = {by: reconstruct_across(axis_runs["D"], trunk, by=by) for by in ("tokens", "lr_area")}
    # The annealing gain, calibrated on the calibration branches only (never on a D point).
    cal_names = [f"D-cal{i:02d}" for i in range(len(calibration))]
    gains = {}
    if all(n in store.runs for n in cal_names):
        for f in fracs:
            runs_f = [store.run(n) for n, (_, fr) in zip(cal_names, calibration) if fr == f]
            gains[f] = fit_annealing_gain(trunk, runs_f)
            across_rec[f"lr_area_annealing_{round(100 * f)}"] = reconstruct_across(axis_runs["D"], trunk, by="lr_area",
                                                                                 annealing=gains[f])  # fmt: skip
    across = {by: rec.summary() for by, rec in across_rec.items()}
    for a in analysis.runs:  # the report draws them on D's figure
        if a.run == "axis-D":
            a.across = {_across_label(by): rec for by, rec in across_rec.items()}
    timings["reconstruct"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    write_report(store, out / "report.html", analysis=analysis, title="tokdyn scaling sweep: D and M axes",
                 extra={"sizes (layers, width, heads)": sizes, "M-sweep steps": m_steps, "M seeds": seeds,
                        "D-sweep model": d_model, "D budgets (steps)": budgets, "D decay": f"linear over {args.decay_frac:.0%} of the budget",
                        "calibration branches (budget, decay share)": [list(c) for c in calibration],
                        "batch": f"{args.batch_size} x {context} tokens"})  # fmt: skip
    timings["report"] = round(time.perf_counter() - t, 1)
    timings["total"] = round(time.perf_counter() - t0, 1)
    timings["cpu_total"] = round(time.process_time() - cpu0, 1)

    def scores(s: dict) -> dict:
        keys = ("n_points", "r2_events", "r2_spectrum", "r2_events_interior", "r2_spectrum_interior", "rel_l2_events",
                "rel_l2_spectrum", "rel_l2_events_interior", "rel_l2_spectrum_interior")  # fmt: skip
        return {key: s[key] for key in keys}

    headline = {
        "quick": quick,
        "n_tokens": corpus.probe.n_tokens,
        "D": scores(axes["D"]),
        "M": scores(axes["M"]),
        "D_from_T_tokens": scores(across["tokens"]),
        "D_from_T_lr_area": scores(across["lr_area"]),
        **{f"D_from_T_annealing_{round(100 * f)}": scores(across[f"lr_area_annealing_{round(100 * f)}"]) for f in gains},
        "T_trunk": scores(axes["T (D trunk)"]),
        "trunk_axis_min": trunk_min,
        "total_s": timings["total"],
        "cpu_s": timings["cpu_total"],
    }
    result = {"headline": headline, "axes": axes, "d_from_t": across, "timings_s": timings, "sizes": sizes,
              "m_family": args.m_family, "lr_per_size": [lr_for_width(e // k) for _, e, _ in sizes], "m_steps": m_steps, "seeds": seeds,
              "d_model": d_model, "d_budgets": budgets, "d_max_spacing_decades": spacing, "trunk_axis_min": trunk_min,
              "decay": decay.summary() if decay else None, "batch_size": args.batch_size, "context": context,
              "calibration": [list(c) for c in calibration], "annealing_gain": {str(f): g.to_dict() for f, g in gains.items()}}  # fmt: skip
    (out / "sweep.json").write_text(json.dumps(result, indent=2))
    _print_table(headline)
    return result


def _across_label(by: str) -> str:
    if by.startswith("lr_area_annealing_"):
        return f"from the trunk's T events, by lr area, with the annealing gain of {by.rsplit('_', 1)[1]} % decays"
    return f"from the trunk's T events, by {by}"


def _print_table(h: dict) -> None:
    print(f"{'axis':<22}{'points':>7}{'R2 sigmoids':>13}{'R2 spectrum':>13}{'interior':>18}{'rel L2':>16}", file=sys.stderr)
    for name in [k for k in h if k in ("D", "M", "T_trunk") or k.startswith("D_from_T")]:
        s = h[name]
        print(f"{name:<22}{s['n_points']:>7}{s['r2_events']:>13.3f}{s['r2_spectrum']:>13.3f}"
              f"{s['r2_events_interior']:>9.3f}{s['r2_spectrum_interior']:>9.3f}"
              f"{s['rel_l2_events']:>8.3f}{s['rel_l2_spectrum']:>8.3f}", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
