"""GPU check of the sigmoid fit by variable projection: the whole loop in one CUDA graph.

UNTESTED: written on a machine without a GPU (issue 14); the CPU path of the same code
(``--device cpu``) was run. On a CUDA machine it measures, within a few minutes:

- grid start values (one matmul of the centred losses with the grid's sigmoids; every row
  here is fully observed, so each row's own grid, ``tokdyn.fit.grid.row_grids``, is the
  grid of x) and a fixed number of damped-Newton steps on (mu, ln s)
  (:func:`tokdyn.fit.projection.sigmoid_projected`, the same formulas as the numba kernel),
  every step a handful of elementwise kernels with no host round trip: damping, acceptance
  and the trust region are ``torch.where``. The steps are captured once in a CUDA graph and
  replayed per block (``--no-graph`` to launch them eagerly);
- fits/s over ``--n`` planted trajectories (best of ``--repeat``), and agreement with the CPU
  backend (numba, the shipped path) on ``--n-check`` of them: relative SSE and |mu| difference.

Prints one JSON line. Usage:
    python pipelines/gpu_fit_check.py --n 4000000 --block 1048576 --steps 12
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from tokdyn.fit import fit_sigmoids, log_axis
from tokdyn.fit.backends import TorchOps
from tokdyn.fit.grid import sigmoid_grid
from tokdyn.fit.projection import sigmoid_amplitudes, sigmoid_projected
from tokdyn.fit.sigmoid import LEVEL_FLOOR, default_s_min
from tokdyn.fit.synthetic import plant_sigmoids


def make_solver(x, block: int, steps: int, device, *, graph: bool):
    """A function Y [block, K] (device, float64) -> (mu, ln s, d, linf - mean, F) [block]."""
    ops = TorchOps(device)
    K = x.numel()
    mu_q, s_q, G = (torch.as_tensor(a, device=device) for a in
                    sigmoid_grid(x.cpu().numpy(), default_s_min(x.cpu().numpy())))
    span = float(x[-1] - x[0])
    lo = torch.tensor([float(x[0]) - 0.5 * span, np.log(default_s_min(x.cpu().numpy()))],
                      device=device, dtype=torch.float64)
    hi = torch.tensor([float(x[-1]) + 0.5 * span, np.log(span)], device=device,
                      dtype=torch.float64)
    mus, ss = torch.unique(mu_q), torch.unique(s_q)
    step_max = torch.stack([0.5 * (mus[1] - mus[0]), 0.5 * torch.log(ss[1] / ss[0])])
    Gc = G - G.mean(1, keepdim=True)
    var = (Gc * Gc).sum(1)
    inv_var = torch.where(var > 1e-12 * K, 1.0 / var.clamp(min=1e-300), torch.zeros_like(var))
    W = torch.ones(block, K, dtype=torch.float64, device=device)
    Y_in = torch.zeros(block, K, dtype=torch.float64, device=device)

    def run():
        Ym = Y_in.mean(1)
        Yc = Y_in - Ym[:, None]
        cov = Yc @ G.T  # [B, Q]
        q = torch.argmax(cov * cov * inv_var, dim=1)
        th = torch.minimum(torch.maximum(torch.stack([mu_q[q], torch.log(s_q[q])], 1), lo), hi)
        F, A, g = sigmoid_projected(ops, x, Yc, W, th, Ym, LEVEL_FLOOR)
        D = torch.diagonal(A, dim1=1, dim2=2).abs()
        lam = torch.full_like(F, 1e-3)
        eye = torch.eye(2, dtype=torch.float64, device=device)
        for _ in range(steps):
            D = torch.maximum(D, torch.diagonal(A, dim1=1, dim2=2).abs())
            M = A + lam[:, None, None] * eye * D[:, :, None]
            det = M[:, 0, 0] * M[:, 1, 1] - M[:, 0, 1] ** 2
            ok = (M[:, 0, 0] > 0) & (det > 0)
            sdet = torch.where(ok, det, torch.ones_like(det))
            h0 = -(M[:, 1, 1] * g[:, 0] - M[:, 0, 1] * g[:, 1]) / sdet
            h1 = -(M[:, 0, 0] * g[:, 1] - M[:, 0, 1] * g[:, 0]) / sdet
            h = torch.stack([h0, h1], 1)
            over = (h.abs() / step_max).amax(1).clamp(min=1.0)
            th_t = torch.minimum(torch.maximum(th + h / over[:, None], lo), hi)
            hc = th_t - th
            pred = -2.0 * (g * hc).sum(1) - (hc * (A @ hc[:, :, None])[:, :, 0]).sum(1)
            F_t, A_t, g_t = sigmoid_projected(ops, x, Yc, W, th_t, Ym, LEVEL_FLOOR)
            better = ok & torch.isfinite(F_t) & (F_t < F)
            rho = torch.where(pred > 0, (F - F_t) / torch.where(pred > 0, pred, 1.0), 0.0)
            th = torch.where(better[:, None], th_t, th)
            F = torch.where(better, F_t, F)
            A = torch.where(better[:, None, None], A_t, A)
            g = torch.where(better[:, None], g_t, g)
            shrink = (1.0 - (2.0 * rho - 1.0) ** 3).clamp(min=0.1)
            lam = torch.where(better, lam * shrink, lam * 2.0)
        d, c0 = sigmoid_amplitudes(ops, x, Yc, W, th, Ym, LEVEL_FLOOR)
        return th[:, 0], th[:, 1], d, c0, F

    if not graph or device.type != "cuda":
        def solve(Y):
            Y_in.copy_(Y)
            return run()
        return solve
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # warm-up (allocations) before capture
    torch.cuda.current_stream().wait_stream(stream)
    g_ = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_):
        outs = run()

    def solve(Y):
        Y_in.copy_(Y)
        g_.replay()
        return tuple(o.clone() for o in outs)
    return solve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--block", type=int, default=1 << 20)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--n-check", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-graph", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    x_np = log_axis(np.geomspace(10.0, 1e5, args.points))
    planted = plant_sigmoids(args.n, x_np, rng=np.random.default_rng(0))
    Y = torch.as_tensor(planted.Y, device=device)
    x = torch.as_tensor(x_np, device=device)
    block = min(args.block, args.n)
    solve = make_solver(x, block, args.steps, device, graph=not args.no_graph)
    best = np.inf
    for _ in range(args.repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        parts = [solve(Y[a:a + block]) for a in range(0, args.n - block + 1, block)]
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    fitted = len(parts) * block
    mu = torch.cat([p[0] for p in parts]).cpu().numpy()
    sse = torch.cat([p[4] for p in parts]).cpu().numpy()
    m = min(args.n_check, fitted)
    cpu = fit_sigmoids(x_np, planted.Y[:m], two_step=False)
    conv = cpu.status == 0
    rel = np.abs(sse[:m] / cpu.sse - 1)[conv]
    print(json.dumps({
        "bench": "gpu_fit_check", "untested_on_gpu_when_written": True,
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(),
        "graph": not args.no_graph and device.type == "cuda", "steps": args.steps,
        "n": fitted, "points": args.points, "block": block,
        "fits_per_s": round(fitted / best, 1), "seconds": round(best, 3),
        "check_n": int(conv.sum()),
        "sse_rel_diff_p99": float(np.quantile(rel, 0.99)),
        "sse_within_1e-6_frac": float(np.mean(rel <= 1e-6)),
        "mu_abs_diff_p99": float(np.quantile(np.abs(mu[:m] - cpu.mu)[conv], 0.99)),
    }))


if __name__ == "__main__":
    main()
