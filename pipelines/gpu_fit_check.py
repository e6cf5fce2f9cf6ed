"""GPU check of the sigmoid fit by variable projection: the solver loop in one launch.

Written and run on a machine without a GPU (issue 14): there every path below ran on the CPU
(``--device cpu``; the Triton kernel in Triton's interpreter, ``TRITON_INTERPRET=1``). On a
CUDA machine one command measures, within a few minutes of device time:

- ``fused``: the shipped one-launch solver (:func:`tokdyn.fit.triton_kernels.
  projected_sigmoid_lm`: every row's damped Newton steps on (mu, ln s) in registers, no host
  round trip) from grid start values made on the device (one matmul of the centred losses
  with the grid's sigmoids; every row here is fully observed, so each row's own grid,
  ``tokdyn.fit.grid.row_grids``, is the grid of x). Timed for each kernel configuration of
  ``--configs`` (rows per program x points per chunk x warps);
- ``graph``: the same start and a fixed number of the batched solver's steps (elementwise
  torch kernels, ``torch.where`` for damping and acceptance) captured once in a CUDA graph
  and replayed per block (``--no-graph``: launched eagerly);
- ``product``: ``fit_sigmoids(backend="torch", device=...)`` as a user calls it, the sigmoid
  alone (``--n-product`` rows; host-side preparation and start values by numba, the fused
  solver on the device), the full record (a quarter of them), and the sigmoid with the
  batched solver instead (``TOKDYN_FUSED=0``, a quarter);
- fits/s (best of ``--repeat``) over ``--n`` planted trajectories, and agreement with the CPU
  backend (numba, the shipped CPU path) on ``--n-check`` of them: relative SSE and |mu|
  difference on the rows both call converged.

Prints one JSON line. Usage:
    python pipelines/gpu_fit_check.py --n 4000000 --block 1048576
    TRITON_INTERPRET=1 python pipelines/gpu_fit_check.py --device cpu --n 2000 --n-check 500 \
        --n-product 2000 --configs 32x32x4
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from tokdyn.fit import backends, fit_sigmoids, log_axis
from tokdyn.fit.backends import SHRINK_MIN, TorchOps, load_triton
from tokdyn.fit.grid import sigmoid_grid
from tokdyn.fit.options import FitOptions
from tokdyn.fit.projection import sigmoid_amplitudes, sigmoid_projected
from tokdyn.fit.sigmoid import LEVEL_FLOOR, default_s_min
from tokdyn.fit.synthetic import plant_sigmoids


class GridStart:
    """Start values on the grid of x for fully observed rows, on the device: the bounds, the
    trust region (half a grid cell) and th0 = the grid event explaining most of each row."""

    def __init__(self, x, device) -> None:
        x_np = x.cpu().numpy()
        s_min = default_s_min(x_np)
        self.mu_q, self.s_q, self.G = (torch.as_tensor(a, device=device)
                                       for a in sigmoid_grid(x_np, s_min))
        span = float(x_np[-1] - x_np[0])
        self.lo = torch.tensor([x_np[0] - 0.5 * span, np.log(s_min)], device=device,
                               dtype=torch.float64)
        self.hi = torch.tensor([x_np[-1] + 0.5 * span, np.log(span)], device=device,
                               dtype=torch.float64)
        mus, ss = torch.unique(self.mu_q), torch.unique(self.s_q)
        self.step_max = torch.stack([0.5 * (mus[1] - mus[0]), 0.5 * torch.log(ss[1] / ss[0])])
        Gc = self.G - self.G.mean(1, keepdim=True)
        var = (Gc * Gc).sum(1)
        self.inv_var = torch.where(var > 1e-12 * x.numel(), 1.0 / var.clamp(min=1e-300),
                                   torch.zeros_like(var))

    def __call__(self, Y):
        """(th0 [B, 2], mean [B], centred Y [B, K])."""
        Ym = Y.mean(1)
        Yc = Y - Ym[:, None]
        cov = Yc @ self.G.T  # [B, Q]
        q = torch.argmax(cov * cov * self.inv_var, dim=1)
        th = torch.stack([self.mu_q[q], torch.log(self.s_q[q])], 1)
        return torch.minimum(torch.maximum(th, self.lo), self.hi), Ym, Yc


def make_fused_solver(x, start: GridStart, block: int, options: FitOptions, config):
    """Y [block, K] (device) -> (mu, ln s, d, linf - mean, F) [block] by the one-launch
    kernel; config = (rows per program, points per chunk, warps)."""
    fused = load_triton()
    B = block
    dev = dict(device=x.device, dtype=torch.float64)
    W = torch.ones(B, x.numel(), **dev)
    lo, hi, caps = (a.expand(B, 2).contiguous() for a in (start.lo, start.hi, start.step_max))
    floor = torch.full((B,), LEVEL_FLOOR, **dev)
    block_r, block_k, warps = config

    def solve(Y):
        th, Ym, Yc = start(Y)
        out = fused.projected_sigmoid_lm(
            x, Yc, W, th, lo, hi, caps, Ym, floor, max_iter=options.max_iter,
            ftol=options.ftol, xtol=options.xtol, shrink_min=SHRINK_MIN, block_r=block_r,
            block_k=block_k, num_warps=warps)
        return out["p"][:, 0], out["p"][:, 1], out["d"], out["lin"], out["sse"]
    return solve


def make_graph_solver(x, start: GridStart, block: int, steps: int, *, graph: bool):
    """Y [block, K] (device) -> (mu, ln s, d, linf - mean, F) [block]: a fixed number of the
    batched solver's steps, captured in a CUDA graph."""
    device = x.device
    ops = TorchOps(device)
    K = x.numel()
    W = torch.ones(block, K, dtype=torch.float64, device=device)
    Y_in = torch.zeros(block, K, dtype=torch.float64, device=device)
    lo, hi, step_max = start.lo, start.hi, start.step_max
    floor = LEVEL_FLOOR

    def run():
        th, Ym, Yc = start(Y_in)
        F, A, g = sigmoid_projected(ops, x, Yc, W, th, Ym, floor)
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
            F_t, A_t, g_t = sigmoid_projected(ops, x, Yc, W, th_t, Ym, floor)
            better = ok & torch.isfinite(F_t) & (F_t < F)
            hc = th_t - th
            pred = -2.0 * (g * hc).sum(1) - (hc * (A @ hc[:, :, None])[:, :, 0]).sum(1)
            rho = torch.where(pred > 0, (F - F_t) / torch.where(pred > 0, pred, 1.0), 0.0)
            th = torch.where(better[:, None], th_t, th)
            F = torch.where(better, F_t, F)
            A = torch.where(better[:, None, None], A_t, A)
            g = torch.where(better[:, None], g_t, g)
            shrink = (1.0 - (2.0 * rho - 1.0) ** 3).clamp(min=0.1)
            lam = torch.where(better, lam * shrink, lam * 2.0)
        d, c0 = sigmoid_amplitudes(ops, x, Yc, W, th, Ym, floor)
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


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_solver(solve, Y, block: int, repeat: int, device) -> tuple[float, list]:
    """(best seconds over the whole of Y in blocks, the last run's outputs per block)."""
    best = np.inf
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        parts = [solve(Y[a:a + block]) for a in range(0, Y.shape[0] - block + 1, block)]
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, parts


def agreement(mu, sse, cpu, m: int) -> dict:
    """mu, sse [>= m] against the CPU fit of the first m rows, where the CPU converged."""
    conv = cpu.status == 0
    rel = np.abs(sse[:m] / cpu.sse - 1)[conv]
    return {"check_n": int(conv.sum()),
            "sse_rel_diff_p99": float(np.quantile(rel, 0.99)),
            "sse_within_1e-6_frac": float(np.mean(rel <= 1e-6)),
            "sse_not_worse_frac": float(np.mean(sse[:m][conv] <= cpu.sse[conv] * (1 + 1e-6))),
            "mu_abs_diff_p99": float(np.quantile(np.abs(mu[:m] - cpu.mu)[conv], 0.99))}


def parse_configs(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in c.split("x")) for c in text.split(",") if c]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--block", type=int, default=1 << 20)
    ap.add_argument("--steps", type=int, default=12, help="graph solver: fixed steps")
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--n-check", type=int, default=20_000)
    ap.add_argument("--n-product", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--solvers", default="fused,graph,product")
    ap.add_argument("--configs", default="16x8x4,32x4x4,8x16x4,64x2x4,32x8x8",
                    help="fused kernel: rows x points x warps, comma-separated")
    ap.add_argument("--no-graph", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    solvers = args.solvers.split(",")
    x_np = log_axis(np.geomspace(10.0, 1e5, args.points))
    planted = plant_sigmoids(args.n, x_np, rng=np.random.default_rng(0))
    Y = torch.as_tensor(planted.Y, device=device)
    x = torch.as_tensor(x_np, device=device)
    block = min(args.block, args.n)
    start = GridStart(x, device)
    options = FitOptions()
    m = min(args.n_check, args.n)
    cpu = fit_sigmoids(x_np, planted.Y[:m], two_step=False)  # numba when installed
    out = {"bench": "gpu_fit_check",
           "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(),
           "n": args.n, "points": args.points, "block": block}

    def record(name, seconds, parts, **extra):
        mu = torch.cat([p[0] for p in parts]).cpu().numpy()
        sse = torch.cat([p[4] for p in parts]).cpu().numpy()
        fitted = len(parts) * block
        out[name] = {"fits_per_s": round(fitted / seconds, 1), "seconds": round(seconds, 4),
                     **extra, **agreement(mu, sse, cpu, m)}

    def fused(config):
        solve = make_fused_solver(x, start, block, options, config)
        t0 = time.perf_counter()
        solve(Y[:block])  # compile
        _sync(device)
        compile_s = time.perf_counter() - t0
        seconds, parts = time_solver(solve, Y, block, args.repeat, device)
        record("fused_" + "x".join(map(str, config)), seconds, parts,
               first_call_s=round(compile_s, 2))

    def graph():
        captured = not args.no_graph and device.type == "cuda"
        solve = make_graph_solver(x, start, block, args.steps, graph=captured)
        seconds, parts = time_solver(solve, Y, block, args.repeat, device)
        record("graph", seconds, parts, graph=captured, steps=args.steps)

    def product():
        n_p = min(args.n_product, args.n)
        Y_np = planted.Y[:n_p]
        kw = dict(backend="torch", device=device)
        fit_sigmoids(x_np, Y_np[:1000], two_step=False, **kw)  # compile, warm up
        t0 = time.perf_counter()
        fit = fit_sigmoids(x_np, Y_np, two_step=False, **kw)
        sig_s = time.perf_counter() - t0
        n_full = max(n_p // 4, 1)
        t0 = time.perf_counter()
        fit_sigmoids(x_np, Y_np[:n_full], **kw)
        full_s = time.perf_counter() - t0
        # the same call with the batched solver (TOKDYN_FUSED=0), on a quarter of the rows
        os.environ["TOKDYN_FUSED"] = "0"
        try:
            t0 = time.perf_counter()
            batched = fit_sigmoids(x_np, Y_np[:n_full], two_step=False, **kw)
            batched_s = time.perf_counter() - t0
        finally:
            del os.environ["TOKDYN_FUSED"]
        k = min(m, n_full)
        out["product"] = {"fits_per_s": round(n_p / sig_s, 1), "n": n_p,
                          "full_fits_per_s": round(n_full / full_s, 1), "full_n": n_full,
                          "batched_fits_per_s": round(n_full / batched_s, 1),
                          "fused": (load_triton() is not None and device.type == "cuda"
                                    and not backends._FUSED_ERROR),
                          "fused_error": backends._FUSED_ERROR[:1],
                          "status_equal_frac": float(np.mean(fit.status[:m] == cpu.status)),
                          "status_equal_batched_frac": float(np.mean(
                              fit.status[:k] == batched.status[:k])),
                          **agreement(fit.mu, fit.sse, cpu, min(m, n_p))}

    sections = [("fused_" + "x".join(map(str, c)), lambda c=c: fused(c))
                for c in parse_configs(args.configs) if "fused" in solvers]
    sections += [(name, fn) for name, fn in (("graph", graph), ("product", product))
                 if name in solvers]
    for name, run in sections:  # one failing section does not cost the others' figures
        try:
            run()
        except Exception as err:  # noqa: BLE001 - reported in the JSON line
            out[name] = {"error": f"{type(err).__name__}: {err}"[:500]}
        print(json.dumps(out), flush=True)  # a line after each section: a timeout keeps them


if __name__ == "__main__":
    main()
