"""Measurement: could an exact bound skip the two-sigmoid fit without changing any token's model?

The full record fits two sigmoids to every token (docs/fitting.md, "Two sigmoids"), about
three quarters of its time. The model ``linf + d1 g1 + d2 g2`` (``g`` a falling sigmoid) is
monotone when both drops have one sign and has at most three monotone pieces otherwise (its
slope is a sum of two logistic bumps of opposite signs, whose log-ratio falls then rises:
two sign changes at most). So the best function of three alternating monotone pieces
(falling-rising-falling or rising-falling-rising) is a lower bound on the two-sigmoid sum of
squares, whatever the solver does. Two sigmoids are chosen only when their BIC is below
every simpler model's by ``bic_margin``, that is when

    SSE2 < n exp((min(BIC_constant, BIC_line, BIC_sigmoid) - bic_margin - 7 ln n) / n),

so a row whose bound is at or above that threshold could skip the fit and keep its model and
class exactly. This script fits planted single events (the benchmark's rows), planted
two-step rows and the tiny GPT's real probe tokens with the full record, computes the bound
(exactly, O(n^2) a row: every segment's monotone regression by pool-adjacent-violators) and
the monotone-only bound, and prints one JSON line per set: the share of rows the bound would
skip, how many fitted two-sigmoid sums of squares fall below the bound (must be 0: the bound
is a bound), and the bound's cost a row. docs/fitting.md has the figures and the verdict.

    python pipelines/two_sigmoid_bound.py [--n 3000]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numba
import numpy as np

from tokdyn.fit import FitOptions, fit_sigmoids
from tokdyn.fit.models import N_PARAMS, winning_sse
from tokdyn.fit.synthetic import plant_sigmoids, plant_two_steps

REAL = Path(__file__).resolve().parent.parent / "tests" / "data" / "tiny_gpt_real.npz"


@numba.njit(cache=True)
def segment_sse(y, sign):
    """S [n+1, n+1]: S[a, b] the sum of squares of the best rising (sign +1) or falling (-1)
    fit to y[a:b], by pool-adjacent-violators from every start a."""
    n = y.shape[0]
    S = np.zeros((n + 1, n + 1))
    block_sum = np.empty(n)
    block_count = np.empty(n)
    for a in range(n):
        top, squares, explained = 0, 0.0, 0.0
        for b in range(a, n):
            v = sign * y[b]
            squares += v * v
            s, c = v, 1.0
            while top > 0 and block_sum[top - 1] / block_count[top - 1] > s / c:
                top -= 1
                explained -= block_sum[top] * block_sum[top] / block_count[top]
                s += block_sum[top]
                c += block_count[top]
            block_sum[top], block_count[top] = s, c
            top += 1
            explained += s * s / c
            S[a, b + 1] = max(squares - explained, 0.0)
    return S


@numba.njit(cache=True)
def piece_bounds(y):
    """(best three alternating monotone pieces, best one monotone piece): sums of squares."""
    n = y.shape[0]
    fall = segment_sse(y, -1.0)
    rise = segment_sse(y, 1.0)
    best = np.inf
    for a in range(n + 1):
        for b in range(a, n + 1):
            best = min(best, fall[0, a] + rise[a, b] + fall[b, n], rise[0, a] + fall[a, b] + rise[b, n])
    return best, min(fall[0, n], rise[0, n])


def measure(label: str, x: np.ndarray, Y: np.ndarray) -> dict:
    opts = FitOptions()
    fit = fit_sigmoids(x, Y, backend="numba")
    n = np.isfinite(Y).sum(1).astype(np.float64)
    simpler = np.minimum(np.minimum(fit.bic_constant, fit.bic_line), fit.bic_sigmoid)
    threshold = winning_sse(simpler, n, N_PARAMS[3], opts.bic_margin)
    three, one = np.empty(len(Y)), np.empty(len(Y))
    piece_bounds(Y[0][np.isfinite(Y[0])])  # compile outside the timing
    t0 = time.perf_counter()
    for i, row in enumerate(Y):
        three[i], one[i] = piece_bounds(row[np.isfinite(row)])
    cost = (time.perf_counter() - t0) / len(Y)
    fitted = np.isfinite(fit.sse2)
    skip = three >= threshold
    return {
        "set": label, "rows": int(len(Y)), "points": int(np.median(n)),
        "skip_frac": round(float(skip.mean()), 4),
        "skip_frac_monotone_only": round(float((one >= threshold).mean()), 4),
        "two_sigmoids_chosen": int((fit.model == 3).sum()),
        "chosen_among_skipped": int((fit.model[skip] == 3).sum()),
        "sse2_below_bound": int((fit.sse2[fitted] < three[fitted] * (1 - 1e-9)).sum()),
        "bound_over_threshold_median": round(float(np.median(three / threshold)), 3),
        "bound_us_per_row": round(cost * 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="planted rows per set")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    for points in (30, 100, 200):
        x = np.linspace(0.0, 4.0, points)
        print(json.dumps(measure(f"single events, {points} points", x, plant_sigmoids(args.n, x, rng=rng).Y)))
    x = np.linspace(0.0, 4.0, 100)
    print(json.dumps(measure("two-step, 100 points", x, plant_two_steps(args.n, x, rng=rng).Y)))
    real = np.load(REAL)
    print(json.dumps(measure("tiny GPT probe tokens", real["x"], real["Y"].astype(np.float64))))


if __name__ == "__main__":
    main()
