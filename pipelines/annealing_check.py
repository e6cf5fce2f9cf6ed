"""Checks of the annealing gain on a store written by ``pipelines/scaling_sweep.py``.

1. Held out: the gain calibrated on each set of calibration branches (15 % and 30 % decays)
   predicts the other set's gains and the D points' gains (nats, rms).
2. Where the rest of the miss of D from T lies: D rebuilt from the trunk's *measured* mean loss
   at each point's lr area (not its events), with and without the gain. A check, not a
   prediction the library offers.

    python pipelines/annealing_check.py scaling-sweep/store.zarr
"""

from __future__ import annotations

import sys

import numpy as np

import tokdyn
from tokdyn.annealing import _trunk_loss_at_area, branch_gains, decay_schedule, fit_annealing_gain
from tokdyn.axes import source_runs
from tokdyn.fit.job import fit_inputs
from tokdyn.reconstruct import measured_derivative, measured_mean_loss, scores


def main(argv=None) -> int:
    path = (argv or sys.argv[1:])[0]
    st = tokdyn.open_store(path, mode="r")
    trunk, axis = st.run("D-trunk"), st.run("axis-D")
    sets: dict[float, list] = {}
    for n in sorted(n for n in st.runs if n.startswith("D-cal")):
        sets.setdefault(st.run(n).attrs["decay_frac"], []).append(st.run(n))
    d_runs = source_runs(axis)
    rows, x = fit_inputs(axis)
    meas = measured_derivative(x, measured_mean_loss(axis, rows).loss)
    area = np.array([d_runs[k].attrs["lr_area"] for k in rows])
    trunk_loss = _trunk_loss_at_area(trunk, area)
    print(f"D from the trunk's measured loss by lr area, no gain: R^2 {scores(measured_derivative(x, trunk_loss), meas)['r2']:.3f}")
    for frac, runs in sets.items():
        gain = fit_annealing_gain(trunk, runs)
        print(f"calibrated on {len(runs)} branches of {frac:.0%} decays: C {gain.coef:.3g}, momentum {gain.momentum:.4f}, rms {gain.rms:.4f} nats")
        for label, others in [(f"{f:.0%} branches", r) for f, r in sets.items() if f != frac] + [("D points", d_runs)]:
            sched, g = branch_gains(trunk, others)
            p = np.array([gain.gain(s) for s in sched])
            print(f"  predicts the {label}' gains ({g.min():.3f}-{g.max():.3f} nats) to {np.sqrt(np.mean((p - g) ** 2)):.4f} rms")
        curve = trunk_loss - np.array([gain.gain(decay_schedule(d_runs[k])) for k in rows])
        pred = measured_derivative(x, curve)
        print(f"  D from the trunk's measured loss by lr area minus this gain: R^2 {scores(pred, meas)['r2']:.3f}, "
              f"interior {scores(pred[1:-1], meas[1:-1])['r2']:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
