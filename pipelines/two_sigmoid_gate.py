"""Measurement: could the two-sigmoid fit stop early where it is far from winning?

The full record fits two sigmoids to every token, about three quarters of its time, and on
single-event rows the solver takes about 10 steps to the optimum of a fit that BIC then
rejects. Two sigmoids are chosen only when

    SSE2 < T = n exp((min(BIC_constant, BIC_line, BIC_sigmoid) - bic_margin - 7 ln n) / n),

so a gate would stop a row after ``k`` steps when its sum of squares then, SSE2_k, is still
far above T: ``1 - T / SSE2_k > r`` (the fit would have to lose more than the share ``r`` of
what is left to win). The gate is safe only if no row that the full fit gives two sigmoids
is stopped. For each set (planted single events and planted two-step rows of the benchmark's
100 log-spaced points, the tiny GPT's real probe tokens) this script fits the full record,
then the two-sigmoid stage again from the same start with at most ``k`` steps, and prints one
JSON line per (set, k, r): the share of rows the gate stops, the two-sigmoid rows it would
lose, the share of the two-sigmoid steps it saves, and the largest share of SSE2_k that the
remaining steps still removed. docs/benchmarks.md has the figures and the verdict.

    python pipelines/two_sigmoid_gate.py [--n 20000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from tokdyn.fit import FitOptions, fit_sigmoids
from tokdyn.fit import block as _block
from tokdyn.fit.backends import prepare_rows
from tokdyn.fit.grid import start_grids
from tokdyn.fit.models import N_PARAMS, winning_sse
from tokdyn.fit.sigmoid import s_min_of
from tokdyn.fit.synthetic import plant_sigmoids, plant_two_steps

REAL = Path(__file__).resolve().parent.parent / "tests" / "data" / "tiny_gpt_real.npz"


def two_sigmoid_sse(x, Y, options: FitOptions, max_iter: int) -> np.ndarray:
    """SSE2 [B] of the full record's two-sigmoid stage stopped after at most ``max_iter``
    steps, from the start the full record uses (the same sigmoid fit, the same grids).
    Every row of Y must be valid with at least ``options.min_points_two`` points."""
    prep = prepare_rows(x, Y, options, "numba")
    prep["grid_mu"], prep["grid_s"], prep["step_max"] = start_grids(
        x, Y, s_min_of(x, options), observed=prep["n"])
    res1, _, _ = _block._fit_sigmoid(_block._Solver(x, options, "numba", None), Y, prep)
    solve = _block._Solver(x, dataclasses.replace(options, max_iter=max_iter), "numba", None)
    res2, _, _ = _block._fit_two_sigmoids(solve, Y, res1["p"], prep)
    return res2["sse"]


def gate_figures(x, Y, label: str, ks=(2, 4, 6), rs=(0.1, 0.2, 0.3)) -> list[dict]:
    """One dict per (k, r): what the gate would stop, lose and save on the rows of Y."""
    options = FitOptions()
    # the rows given two sigmoids at all (valid, enough points); a row's fit does not depend
    # on the others in its block
    Y = Y[np.isfinite(fit_sigmoids(x, Y, backend="numba", options=options).sse2)]
    fit = fit_sigmoids(x, Y, backend="numba", options=options)
    n = fit.n_points.astype(np.float64)
    simpler = np.minimum(np.minimum(fit.bic_constant, fit.bic_line), fit.bic_sigmoid)
    T = winning_sse(simpler, n, N_PARAMS[3], options.bic_margin)
    fitted = np.isfinite(fit.sse2)
    two = fit.model == 3
    steps = fit.n_iter2.astype(np.float64)
    rows = []
    for k in ks:
        sse_k = two_sigmoid_sse(x, Y, options, k)
        live = fitted & (fit.n_iter2 > k)  # rows the full fit took further than k steps
        left = np.where(live, (sse_k - fit.sse2) / sse_k, 0.0)
        for r in rs:
            stop = live & (1.0 - T / sse_k > r)
            rows.append({
                "set": label, "rows": int(len(Y)), "points": int(Y.shape[1]), "k": k, "r": r,
                "two_sigmoid_rows": int(two.sum()), "stopped_frac": round(float(stop.mean()), 4),
                "two_sigmoid_rows_lost": int((stop & two).sum()),
                "steps_saved_frac": round(float((steps[stop] - k).sum() / steps[fitted].sum()), 4),
                "max_left_frac": round(float(left.max()), 3),
                "mean_steps_two": round(float(steps[fitted].mean()), 2),
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="planted rows per set")
    args = ap.parse_args()
    x = np.log10(np.geomspace(10.0, 1e5, 100))
    sets = [("planted single events", plant_sigmoids(args.n, x, rng=np.random.default_rng(0)).Y),
            ("planted two-step", plant_two_steps(args.n, x, rng=np.random.default_rng(1)).Y)]
    for label, Y in sets:
        for row in gate_figures(x, Y, label):
            print(json.dumps(row))
    with np.load(REAL) as d:
        for row in gate_figures(d["x"], d["Y"].astype(np.float64), "tiny GPT probe tokens"):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
