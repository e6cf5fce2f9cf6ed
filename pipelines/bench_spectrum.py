"""Benchmark: the event-kernel spectrum and its bootstrap, compiled (tokdyn._event_grid) against
the dense binning it replaced, side by side in one process.

Plants the learning events of ``--tokens`` tokens, two a token as the default ``two_step``
event set has them (learning times over 4 decades, widths log-uniform over 1e-3..1 decade,
a small second event), and computes, alternately ``--repeat`` times:

    reference   every event's sigmoid binned on every node of the fine grid (numpy,
                ``tokdyn.spectrum._node_blocks``), the bootstrap's resamples summed by one
                matrix product a block: the code before tokdyn._event_grid
    compiled    ``learning_time_spectrum`` and ``_event_bootstrap`` as tokdyn runs them

Prints one JSON line: each side's fastest seconds for the spectrum and for ``--boot``
resamples, the speed-ups, and how far the compiled spectrum is from the reference (largest
difference over the peak) and its total drop from the reference's.

    python pipelines/bench_spectrum.py                      # 200,000 tokens, 200 resamples
    python pipelines/bench_spectrum.py --tokens 2000000 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from tokdyn.spectrum import Events, _event_bootstrap, _fine_grid, _node_blocks, _smooth, learning_time_spectrum


def planted_events(n_tokens: int, seed: int) -> Events:
    rng = np.random.default_rng(seed)
    lo, hi = 2.0, 6.0
    mu = np.concatenate([rng.uniform(lo - 0.5, hi + 0.5, n_tokens), rng.uniform(lo, hi, n_tokens)])
    s = 10.0 ** rng.uniform(-3.0, 0.0, 2 * n_tokens)
    delta = np.concatenate([rng.uniform(0.2, 5.0, n_tokens), rng.uniform(0.0, 0.5, n_tokens)])
    token = np.concatenate([np.arange(n_tokens), np.arange(n_tokens)])
    return Events(token, mu, s, delta, n_tokens, (lo, hi), resolution=0.02)


def reference(ev: Events, h: float, n_boot: int, seed: int):
    """The dense binning and the bootstrap by products, on the compiled code's fine grid."""
    from tokdyn._event_grid import GRID_MULTIPLE

    fine, dx = _fine_grid(h, ev.x_range, multiple=GRID_MULTIPLE)
    x = np.linspace(*ev.x_range, 256)
    t0 = time.perf_counter()
    cells = np.zeros(fine.size)
    for _, m in _node_blocks(ev, fine, dx):
        cells += m.sum(axis=0)
    density = _smooth(cells, dx, h, x, ev.x_range[0]) / ev.n_scored
    t1 = time.perf_counter()
    rng = np.random.default_rng(seed)
    mult = np.stack([rng.poisson(1.0, ev.n_tokens) for _ in range(n_boot)]).astype(np.uint8)
    boot = np.zeros((n_boot, fine.size))
    for sl, m in _node_blocks(ev, fine, dx):
        boot += mult[:, ev.token[sl]].astype(np.float64) @ m
    t2 = time.perf_counter()
    return density, cells.sum() / ev.n_scored, t1 - t0, t2 - t1


def compiled(ev: Events, h: float, n_boot: int, seed: int):
    t0 = time.perf_counter()
    spec = learning_time_spectrum(ev, bandwidth=h, grid=256)  # read at the reference's points
    t1 = time.perf_counter()
    rng = np.random.default_rng(seed)
    _event_bootstrap(ev, spec, (rng.poisson(1.0, ev.n_tokens) for _ in range(n_boot)), n_boot)
    t2 = time.perf_counter()
    return spec.density, spec.total_drop, t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--boot", type=int, default=200, help="bootstrap resamples")
    ap.add_argument("--bandwidth", type=float, default=0.02, help="decades (the auto rule gives about this on 200 points over 4 decades)")
    ap.add_argument("--repeat", type=int, default=2, help="alternated runs of each side; the fastest is kept")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.tokens < 1 or args.boot < 0 or args.repeat < 1 or not args.bandwidth > 0:
        raise SystemExit("bench_spectrum: --tokens and --repeat must be >= 1, --boot >= 0, --bandwidth > 0")
    ev = planted_events(args.tokens, args.seed)
    compiled(planted_events(1000, 1), args.bandwidth, 2, 0)  # compile or load the kernels
    load = [round(os.getloadavg()[0], 2)]
    best = {"reference": [np.inf, np.inf], "compiled": [np.inf, np.inf]}
    out = {}
    for _ in range(args.repeat):
        for name, fn in (("reference", reference), ("compiled", compiled)):
            density, total, t_spec, t_boot = fn(ev, args.bandwidth, args.boot, args.seed)
            best[name] = [min(best[name][0], t_spec), min(best[name][1], t_boot)]
            out[name] = (density, total)
    load.append(round(os.getloadavg()[0], 2))
    (d_ref, tot_ref), (d_new, tot_new) = out["reference"], out["compiled"]
    print(json.dumps({
        "bench": "spectrum", "tokens": args.tokens, "events": len(ev), "bandwidth": args.bandwidth, "boot": args.boot,
        "reference_spectrum_s": round(best["reference"][0], 3), "compiled_spectrum_s": round(best["compiled"][0], 3),
        "spectrum_speedup": round(best["reference"][0] / best["compiled"][0], 1),
        "reference_boot_s": round(best["reference"][1], 3), "compiled_boot_s": round(best["compiled"][1], 3),
        "boot_speedup": round(best["reference"][1] / best["compiled"][1], 1) if args.boot else None,
        "max_diff_over_peak": float(f"{np.abs(d_new - d_ref).max() / d_ref.max():.3g}"),
        "total_drop_rel_diff": float(f"{abs(tot_new - tot_ref) / abs(tot_ref):.3g}"),
        "load_avg": load, "cpus": os.cpu_count(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
