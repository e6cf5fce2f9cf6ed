"""Benchmark: tokdyn's batched sigmoid fit against scipy.optimize.curve_fit one token at a time.

Plants one learning event per trajectory (100 log-spaced points, Gaussian noise 0.2 nats),
fits all of them with tokdyn and the first ``--n-scipy`` with curve_fit as a researcher would
write it (data-driven start values, default Levenberg-Marquardt), and prints one JSON line:

    fits_per_s         tokdyn, one sigmoid per trajectory with SEs, R^2, status (two_step off);
                       this and scipy's rate are the fastest of --repeat runs
    full_fits_per_s    tokdyn's whole record: sigmoid, constant, line, two sigmoids, BIC, class
    scipy_fits_per_s   curve_fit loop
    speedup            fits_per_s / scipy_fits_per_s
    agree_frac         share of scipy-converged trajectories where tokdyn's SSE <= scipy's
                       SSE * (1 + 1e-6)
    mu_mae_*           median |mu - planted mu| (decades), tokdyn on all and on scipy's subset

Usage: python pipelines/bench_fit.py [--n 200000] [--n-scipy 2000] [--backend auto]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import numpy as np
from scipy.optimize import curve_fit

from tokdyn.fit import available_backends, fit_sigmoids, log_axis
from tokdyn.fit.backends import resolve_backend
from tokdyn.fit.synthetic import plant_sigmoids


def researcher_model(x, l0, linf, mu, s):
    return linf + (l0 - linf) / (1.0 + np.exp((x - mu) / s))


def scipy_loop(x: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """curve_fit per row, start values from the data; (params [n, 4], sse [n], seconds).

    Rows where curve_fit raises (no convergence) get NaN.
    """
    params = np.full((len(Y), 4), np.nan)
    sse = np.full(len(Y), np.nan)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exp overflow, covariance warnings
        for i, y in enumerate(Y):
            l0, linf = y[:5].mean(), y[-5:].mean()
            mu0 = x[np.argmin(np.abs(y - 0.5 * (l0 + linf)))]
            p0 = [l0, linf, mu0, (x[-1] - x[0]) / 10]
            try:
                p, _ = curve_fit(researcher_model, x, y, p0=p0)
            except RuntimeError:
                continue
            params[i] = p
            sse[i] = np.sum((researcher_model(x, *p) - y) ** 2)
    return params, sse, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="trajectories fitted by tokdyn")
    ap.add_argument("--n-scipy", type=int, default=2000, help="trajectories fitted by scipy")
    ap.add_argument("--backend", default="auto", choices=["auto", *available_backends()])
    ap.add_argument("--device", default=None, help="torch device (backend torch)")
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--noise", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="time tokdyn's sigmoid fit and the scipy loop this many times, keep "
                         "the fastest (the least disturbed on a shared machine)")
    args = ap.parse_args()

    x = log_axis(np.geomspace(10.0, 1e5, args.points))  # 4 decades, log-spaced checkpoints
    planted = plant_sigmoids(args.n, x, rng=np.random.default_rng(args.seed), noise=args.noise)
    Y, mu_true = planted.Y, planted.truth["mu"]
    backend, device = resolve_backend(args.backend, args.device)

    t0 = time.perf_counter()
    fit_sigmoids(x, Y[:256], backend=backend, device=device)  # compile / load kernels
    warmup_s = time.perf_counter() - t0

    tokdyn_s = np.inf
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        fit = fit_sigmoids(x, Y, backend=backend, device=device, two_step=False)
        tokdyn_s = min(tokdyn_s, time.perf_counter() - t0)
    t0 = time.perf_counter()
    full = fit_sigmoids(x, Y, backend=backend, device=device)
    full_s = time.perf_counter() - t0

    m = min(args.n_scipy, args.n)
    scipy_s = np.inf
    for _ in range(args.repeat):
        p_sc, sse_sc, seconds = scipy_loop(x, Y[:m])
        scipy_s = min(scipy_s, seconds)
    conv = np.isfinite(sse_sc)
    agree = fit.sse[:m][conv] <= sse_sc[conv] * (1 + 1e-6)

    result = {
        "bench": "fit_sigmoid",
        "n": args.n,
        "n_scipy": m,
        "points": args.points,
        "noise": args.noise,
        "backend": backend if device is None else f"{backend}:{device}",
        "fits_per_s": round(args.n / tokdyn_s, 1),
        "full_fits_per_s": round(args.n / full_s, 1),
        "scipy_fits_per_s": round(m / scipy_s, 1),
        "speedup": round((args.n / tokdyn_s) / (m / scipy_s), 1),
        "agree_frac": round(float(agree.mean()), 5),
        "scipy_converged": int(conv.sum()),
        "mu_mae_tokdyn": round(float(np.median(np.abs(fit.mu - mu_true))), 5),
        "mu_mae_tokdyn_subset": round(float(np.median(np.abs(fit.mu[:m] - mu_true[:m]))), 5),
        "mu_mae_scipy": round(float(np.median(np.abs(p_sc[conv, 2] - mu_true[:m][conv]))), 5),
        "tokdyn_s": round(tokdyn_s, 3),
        "full_s": round(full_s, 3),
        "scipy_s": round(scipy_s, 3),
        "warmup_s": round(warmup_s, 3),
        "repeat": args.repeat,
        "status_converged_frac": round(float(np.mean(fit.status == 0)), 5),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
