"""Measurement: the measured derivative's default width on even and uneven checkpoint grids.

``tokdyn.reconstruct.measured_derivative`` measures ``-dL/dlog10 step`` of the mean probe loss
by a local quadratic with Gaussian weights. Its width is a number of decades; this script plants
one sigmoid learning event per token (``tokdyn.fit.synthetic.plant_sigmoids``: mu over the
middle 80 % of the axis, s 0.05-0.5 decades, drops 1-6 nats, per-token Gaussian noise), takes
the mean over the tokens at every checkpoint, measures its derivative, and scores it (R^2,
:func:`tokdyn.reconstruct.scores`) against the planted analytic derivative, the exact answer:

- ``exact``: the positive control, the estimator on the noise-free mean (only its bias);
- ``old``: 1.5 x the median spacing of log10 step (the default before hunt 25);
- ``default``: this checkout's default (``smoothing=None``);
- ``mean x C``: C x the mean spacing, for each C of ``--c``.

Grids: log-spaced (geomspace 1..1e5, 40 points), Pythia's (``tokdyn.schedule.pythia_schedule``
to 143,000), dense-then-sparse (every step 1-199, then 8 points to 1e6), the demo's
(``geometric_schedule(800, 40)``, step 0 left out, as the fit does).

    python pipelines/smoothing_check.py [--seeds 5] [--tokens 1000] [--noise 0.5] [--c 1 1.25 1.5]
"""

from __future__ import annotations

import argparse

import numpy as np

from tokdyn.fit.synthetic import plant_sigmoids
from tokdyn.reconstruct import default_smoothing, measured_derivative, scores
from tokdyn.schedule import geometric_schedule, pythia_schedule


def grids() -> dict[str, np.ndarray]:
    dense_sparse = np.concatenate([np.arange(1, 200), np.round(np.geomspace(200, 1e6, 9)[1:])])
    steps = {
        "log-spaced (1..1e5, 40)": np.geomspace(1, 1e5, 40),
        "Pythia (1..143,000)": pythia_schedule(143_000),
        "dense-then-sparse (1..199, 8 to 1e6)": dense_sparse,
        "demo (geometric 800, 40)": geometric_schedule(800, 40),
    }
    return {name: np.log10(s[s > 0].astype(np.float64)) for name, s in steps.items()}


def planted(x: np.ndarray, *, seed: int, tokens: int, noise: float):
    """The noisy mean loss, the noise-free one and the exact -dL/dx [K] of planted events."""
    p = plant_sigmoids(tokens, x, rng=np.random.default_rng(seed), noise=noise)
    t = p.truth
    sig = 1.0 / (1.0 + np.exp(np.clip((x[None, :] - t["mu"][:, None]) / t["s"][:, None], -50, 50)))
    clean = t["linf"][:, None] + t["delta"][:, None] * sig
    exact = (t["delta"][:, None] / t["s"][:, None] * sig * (1 - sig)).mean(axis=0)
    return p.Y.mean(axis=0), clean.mean(axis=0), exact


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=0.5, help="per-token noise sd, nats")
    ap.add_argument("--c", type=float, nargs="*", default=[1.0, 1.25, 1.5])
    args = ap.parse_args(argv)
    print("| grid | points | median / mean spacing (decades) | width old / default | exact (control) | old: 1.5 x median | default "
          + "".join(f"| mean x {c:g} " for c in args.c) + "|")
    print("|---" * (7 + len(args.c)) + "|")
    for name, x in grids().items():
        d = np.diff(x)
        med, mean = float(np.median(d)), float(d.mean())
        r2: dict[str, list[float]] = {}
        for seed in range(args.seeds):
            noisy, clean, exact = planted(x, seed=seed, tokens=args.tokens, noise=args.noise)
            cases = {"exact": (clean, None), "old": (noisy, 1.5 * med), "default": (noisy, None)}
            cases.update({f"c{c}": (noisy, c * mean) for c in args.c})
            for key, (loss, h) in cases.items():
                r2.setdefault(key, []).append(scores(measured_derivative(x, loss, smoothing=h), exact)["r2"])
        default_h = default_smoothing(x)

        def cell(key):
            v = np.array(r2[key])
            return f"{np.median(v):.3f} ({v.min():.3f}-{v.max():.3f})"
        print(f"| {name} | {x.size} | {med:.4f} / {mean:.4f} | {1.5 * med:.4f} / {default_h:.4f} | {cell('exact')} | {cell('old')} "
              f"| **{cell('default')}** " + "".join(f"| {cell(f'c{c}')} " for c in args.c) + "|")
    print(f"R^2 against the planted analytic -dL/dlog10 step: median (min-max) over {args.seeds} seeds; "
          f"{args.tokens} tokens, per-token noise {args.noise} nats")



if __name__ == "__main__":
    main()
