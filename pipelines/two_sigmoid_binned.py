"""Measurement: is the two-sigmoid fit cheaper on half the points, then polished on all?

The full record spends about three quarters of its time fitting two sigmoids to every token,
and each solver step costs about as much as the points it sums over. Tried here: fit the two
sigmoids on the trajectory binned in pairs (adjacent points averaged: half the points, the same
shape), then polish on every point from that optimum. If the polish took a step or two, the
stage would cost about 0.5 + 0.2 of today's. The script fits the full record's sigmoid stage
once, then times the record's two-sigmoid stage (start, fit) against the binned variant (start
and fit on the binned points, polish on all; the binning itself and the binned points' bounds
and grids left out of its time, its best case), alternated ``--repeats`` times in this process,
and prints one JSON line per (set, points, polish budget): the best times and their ratio, the
mean steps of each fit, how the polished sums of squares compare with the record's, and the
rows whose choice of two sigmoids by BIC would change. docs/benchmarks.md has the figures and
the verdict.

    python pipelines/two_sigmoid_binned.py [--n 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings

import numpy as np

from tokdyn.fit import FitOptions, fit_sigmoids
from tokdyn.fit import block as _block
from tokdyn.fit.backends import prepare_rows
from tokdyn.fit.grid import start_grids
from tokdyn.fit.lm import MODEL_TWO_SIGMOIDS
from tokdyn.fit.models import N_PARAMS, winning_sse
from tokdyn.fit.sigmoid import s_min_of
from tokdyn.fit.synthetic import plant_sigmoids, plant_two_steps

TOLERANCE = 1e-3  # a polished SSE2 within this share of the record's counts as the same optimum


def binned(x, Y):
    """(x, Y) with adjacent points averaged in pairs; an odd last point stays on its own, and a
    pair with one missing point keeps the other."""
    K = len(x)
    pairs = K // 2 * 2
    xb = 0.5 * (x[0:pairs:2] + x[1:pairs:2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-missing pair stays missing
        Yb = np.nanmean(Y[:, :pairs].reshape(len(Y), pairs // 2, 2), axis=2)
    if K % 2:
        xb, Yb = np.append(xb, x[-1]), np.concatenate([Yb, Y[:, -1:]], axis=1)
    return xb, np.ascontiguousarray(Yb)


def _prepared(x, Y, options):
    prep = prepare_rows(x, Y, options, "numba")
    prep["grid_mu"], prep["grid_s"], prep["step_max"] = start_grids(
        x, Y, s_min_of(x, options), observed=prep["n"])
    return prep


def record_stage(x, Y, options, p1, prep):
    """The full record's two-sigmoid stage from the sigmoid fit p1: run_lm's dict."""
    res, _, _ = _block._fit_two_sigmoids(_block._Solver(x, options, "numba", None), Y, p1, prep)
    return res


def polish(x, Y, options, p0, prep, max_iter):
    """The two-sigmoid fit on every point from p0 [B, 7], at most ``max_iter`` steps."""
    lo, hi = _block.two_sigmoid_bounds(prep["lo"], prep["hi"], _block.drop_bound(prep["span"]))
    p0 = np.minimum(np.maximum(np.where(np.isfinite(p0), p0, 0.0), lo), hi)
    solve = _block._Solver(x, dataclasses.replace(options, max_iter=max_iter), "numba", None)
    return solve(MODEL_TWO_SIGMOIDS, Y, p0, lo, hi, prep["step_max"])


def binned_stage(x, Y, xb, Yb, options, p1, prep, polish_iter):
    """The two-sigmoid stage on the binned points (xb, Yb), polished on all: (binned fit,
    polished). The binned fit uses the full points' bounds, start grids and trust regions (the
    binned points span nearly the same axis), so that, as the binning, they cost it nothing:
    the variant's best case."""
    coarse = record_stage(xb, Yb, options, p1, prep)
    return coarse, polish(x, Y, options, coarse["p"], prep, polish_iter)


def compare(x, Y, label: str, polish_iters=(100, 4), repeats: int = 3) -> list[dict]:
    """One dict per polish budget: times, steps and optima of the two stages on the rows of Y
    that the full record gives two sigmoids at all."""
    options = FitOptions()
    Y = np.ascontiguousarray(Y[np.isfinite(fit_sigmoids(x, Y, backend="numba").sse2)])
    fit = fit_sigmoids(x, Y, backend="numba", options=options)
    n = fit.n_points.astype(np.float64)
    simpler = np.minimum(np.minimum(fit.bic_constant, fit.bic_line), fit.bic_sigmoid)
    T = winning_sse(simpler, n, N_PARAMS[3], options.bic_margin)
    prep = _prepared(x, Y, options)
    p1 = _block._fit_sigmoid(_block._Solver(x, options, "numba", None), Y, prep)[0]["p"]
    xb, Yb = binned(x, Y)
    rows = []
    for polish_iter in polish_iters:
        t_record, t_binned = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            record = record_stage(x, Y, options, p1, prep)
            t1 = time.perf_counter()
            coarse, polished = binned_stage(x, Y, xb, Yb, options, p1, prep, polish_iter)
            t_binned.append(time.perf_counter() - t1)
            t_record.append(t1 - t0)
        rel = (polished["sse"] - record["sse"]) / record["sse"]
        two, two_now = record["sse"] < T, polished["sse"] < T
        rows.append({
            "set": label, "rows": int(len(Y)), "points": int(len(x)), "polish_max_iter": polish_iter,
            "record_s": round(min(t_record), 3), "binned_s": round(min(t_binned), 3),
            "speedup": round(min(t_record) / min(t_binned), 3),
            "record_steps": round(float(record["n_iter"].mean()), 2),
            "binned_steps": round(float(coarse["n_iter"].mean()), 2),
            "polish_steps": round(float(polished["n_iter"].mean()), 2),
            "same_optimum_frac": round(float((np.abs(rel) <= TOLERANCE).mean()), 4),
            "worse_frac": round(float((rel > TOLERANCE).mean()), 4),
            "better_frac": round(float((rel < -TOLERANCE).mean()), 4),
            "two_sigmoid_rows": int(two.sum()), "two_sigmoid_rows_lost": int((two & ~two_now).sum()),
            "two_sigmoid_rows_gained": int((~two & two_now).sum()),
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="planted rows per set")
    ap.add_argument("--repeats", type=int, default=3, help="alternated timings of each stage")
    args = ap.parse_args()
    for K in (100, 200):
        x = np.log10(np.geomspace(10.0, 1e5, K))
        sets = [("planted single events", plant_sigmoids(args.n, x, rng=np.random.default_rng(0)).Y),
                ("planted two-step", plant_two_steps(args.n, x, rng=np.random.default_rng(1)).Y)]
        for label, Y in sets:
            for row in compare(x, Y, label, repeats=args.repeats):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
