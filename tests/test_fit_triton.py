"""The fused GPU sigmoid solver (tokdyn.fit.triton_kernels) against the batched one it fuses.

Without a GPU its kernels run in Triton's interpreter (numpy, on the CPU), which Triton
chooses once, when it is first imported (``TRITON_INTERPRET=1``). So the checks run in a child
process started with that setting (this file run as a script, ``--worker``) that prints one
JSON line; the tests read it. The reference is the torch backend's batched solver on the CPU
(:func:`tokdyn.fit.lm.levenberg_marquardt` with :func:`tokdyn.fit.projection.
sigmoid_projected`): the kernel takes the same steps, so both must end at the same point with
the same iterations and status, up to the order of each sum over the points.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

X = np.linspace(1.0, 5.0, 45)  # 45 points: not a multiple of a chunk of points


def _mixed(seed: int = 0) -> np.ndarray:
    """Trajectories that take every path of the solver: single events, two steps, flat noise,
    events whose final level presses on the floor (losses falling to about 0) and rising
    ones whose first level does (forgetting from about 0), missing points, a row too short
    and one empty."""
    from tokdyn.fit.synthetic import plant_sigmoids, plant_two_steps

    rng = np.random.default_rng(seed)
    near_floor = plant_sigmoids(20, X, rng=rng, noise=0.05, linf_range=(0.0, 0.05)).Y
    Y = np.concatenate([
        plant_sigmoids(40, X, rng=rng).Y,
        plant_two_steps(20, X, rng=rng).Y,
        np.clip(near_floor, 0.0, None),
        np.clip(near_floor[:10, ::-1], 0.0, None),  # x is evenly spaced: a rising event
        np.clip(0.03 * near_floor[10:, ::-1], 0.0, None),  # rising by only 0.03-0.18
        3.0 + 0.3 * rng.standard_normal((10, X.size)),
        np.full((3, X.size), 2.0),  # constant: the basis is degenerate
    ])
    Y[rng.random(Y.shape) < 0.05] = np.nan
    Y[5, 4:] = np.nan  # four points
    Y[6] = np.nan
    return Y


def _compare(ref: dict, got: dict) -> dict:
    """Per field: the largest difference relative to the field's scale per row (floats, where
    both are finite), whether NaN sits in the same places, the share of equal values (ints)."""
    out = {}
    for k, a in ref.items():
        a, b = np.asarray(a), np.asarray(got[k])
        if a.dtype.kind == "f":
            both = np.isfinite(a) & np.isfinite(b)
            scale = np.abs(a).reshape(len(a), -1).max(1) if a.ndim > 1 else np.abs(a)
            scale = scale.reshape((-1,) + (1,) * (a.ndim - 1))
            diff = np.abs(a - b) / (np.broadcast_to(scale, a.shape) + 1e-12)
            out[k] = {"max_rel": float(diff[both].max(initial=0.0)),
                      "same_nan": bool(np.array_equal(np.isnan(a), np.isnan(b)))}
        else:
            out[k] = {"equal_frac": float(np.mean(a == b)) if a.size else 1.0}
    return out


def _solve_both(fused, x, Yc, W, th0, lo, hi, caps, mean, floor, *, max_iter, block):
    """The batched solver (levenberg_marquardt over sigmoid_projected, on the CPU) and the
    kernel (tile ``block`` = (rows, points)) on the same numpy problem; caps None: no trust
    region (the kernel takes +inf). Returns both results as numpy dicts."""
    import torch

    from tokdyn.fit import backends
    from tokdyn.fit.lm import levenberg_marquardt
    from tokdyn.fit.projection import sigmoid_projected

    ops = backends.TorchOps(torch.device("cpu"))
    t = [torch.as_tensor(a) for a in (x, Yc, W, th0, lo, hi)]
    mean_t, floor_t = torch.as_tensor(mean), torch.as_tensor(floor)
    lm = levenberg_marquardt(
        ops, lambda x_, Y_, W_, th_, m_, f_: sigmoid_projected(ops, x_, Y_, W_, th_, m_, f_),
        *t, max_iter=max_iter, ftol=1e-8, xtol=1e-8,
        step_max=None if caps is None else torch.as_tensor(caps),
        shrink_min=backends.SHRINK_MIN, flat_converged=True, row_data=(mean_t, floor_t))
    out = fused.projected_sigmoid_lm(
        *t, torch.as_tensor(np.full(th0.shape, np.inf) if caps is None else caps), mean_t,
        floor_t, max_iter=max_iter, ftol=1e-8, xtol=1e-8, shrink_min=backends.SHRINK_MIN,
        block_r=block[0], block_k=block[1])
    fields = ("p", "sse", "A", "n_iter", "status")
    return ({k: getattr(lm, k).numpy() for k in fields}, {k: v.numpy() for k, v in out.items()})


def _worker() -> dict:
    import torch

    from tokdyn.fit import backends, fit_sigmoids

    fused = backends.load_triton()
    report = {"interpreted": os.environ.get("TRITON_INTERPRET") == "1"}
    Y = _mixed()
    ref = fit_sigmoids(X, Y, backend="torch", device="cpu", two_step=False)
    # the product's path: the torch backend taking the fused solver
    backends._fused_sigmoid_solver = lambda ops: fused
    got = fit_sigmoids(X, Y, backend="torch", device="cpu", two_step=False)
    fields = ["status", "n_iter", "l0", "linf", "mu", "s", "sse", "r2", "mu_se", "s_se"]
    report["fit"] = _compare({k: getattr(ref, k) for k in fields},
                             {k: getattr(got, k) for k in fields})
    report["fit_rows"] = int(Y.shape[0])
    report["fit_statuses"] = sorted({int(v) for v in ref.status})

    # the kernel alone against levenberg_marquardt: other block shapes, a tight iteration
    # limit (rows end as failed), no trust region, and an empty batch
    rng = np.random.default_rng(1)
    from tokdyn.fit.synthetic import plant_sigmoids

    Yp = plant_sigmoids(37, X, rng=rng).Y
    W = (rng.random(Yp.shape) > 0.1).astype(np.float64)
    n = W.sum(1)
    mean = (np.where(W > 0, Yp, 0.0)).sum(1) / n
    Yc = np.where(W > 0, Yp - mean[:, None], 0.0)
    th0 = np.stack([rng.uniform(1.5, 4.5, len(Yp)), np.log(rng.uniform(0.05, 0.6, len(Yp)))], 1)
    lo = np.tile([0.0, np.log(0.01)], (len(Yp), 1))
    hi = np.tile([6.0, np.log(4.0)], (len(Yp), 1))
    floor = np.zeros(len(Yp))
    for name, caps, max_iter, shape in [
        ("caps_blocks_8x16", np.full((len(Yp), 2), 0.1), 50, (8, 16)),
        ("no_caps_blocks_64x64", None, 50, (64, 64)),
        ("max_iter_3", np.full((len(Yp), 2), 0.1), 3, (32, 32)),
    ]:
        ref_k, out = _solve_both(fused, X, Yc, W, th0, lo, hi, caps, mean, floor,
                                 max_iter=max_iter, block=shape)
        report[name] = _compare(ref_k, {k: out[k] for k in ref_k})
        report[name + "_converged"] = float(np.mean(ref_k["status"] == 0))
    report["random"] = _random_cases(fused)
    t = [torch.as_tensor(a) for a in (X, Yc[:0], W[:0], th0[:0], lo[:0], hi[:0], th0[:0],
                                      mean[:0], floor[:0])]
    empty = fused.projected_sigmoid_lm(*t, max_iter=5, ftol=1e-8, xtol=1e-8, shrink_min=0.1)
    report["empty_shapes"] = {k: list(v.shape) for k, v in empty.items()}
    return report


def _random_cases(fused, cases: int = 12) -> dict:
    """The kernel against levenberg_marquardt on random problems: 1-40 rows, 3-40 points
    (irregular x), 0-60 % of points missing, start values anywhere in random boxes (on a
    bound too), floors below, at and above the data, trust regions random or none, tiles of
    random shape. Returns totals over all rows, and the largest difference of the sums of
    squares (relative to the row's sum of squares about its mean) where both converged, over
    all rows and over well-posed ones (>= 10 points, the event explaining >= half of the
    variance). Random problems hold many ill-posed rows (two to five points, pure noise, an
    exact fit): their objective is flat, so a difference in the last bits can end the two
    paths at different points of a valley, or one at the iteration limit; the parameters are
    not compared for that reason."""
    rng = np.random.default_rng(20261203)
    totals = {"rows": 0, "status_equal": 0, "n_iter_equal": 0, "sse_max_rel": 0.0,
              "well_posed": 0, "well_posed_status_equal": 0, "sse_max_rel_well_posed": 0.0,
              "floor_rows": 0, "converged": 0}
    for _ in range(cases):
        B, K = int(rng.integers(1, 41)), int(rng.integers(3, 41))
        x = np.sort(rng.uniform(0.0, 5.0, K))
        x += np.arange(K) * 1e-3  # strictly increasing
        mu = rng.uniform(x[0], x[-1], B)
        s = np.exp(rng.uniform(np.log(0.02), np.log(2.0), B))
        level = rng.uniform(-0.5, 3.0, B)[:, None]  # some rows end below the floor 0
        drop = rng.uniform(-1.0, 5.0, B)[:, None]
        z = np.clip((x[None, :] - mu[:, None]) / s[:, None], -50, 50)
        Y = level + drop / (1.0 + np.exp(z)) + rng.normal(0, rng.uniform(0.01, 0.5), (B, K))
        W = (rng.random((B, K)) >= rng.uniform(0.0, 0.6)).astype(np.float64)
        W[:, :2] = 1.0  # at least two points
        n = W.sum(1)
        mean = (W * Y).sum(1) / n
        Yc = np.where(W > 0, Y - mean[:, None], 0.0)
        lo = np.stack([x[0] - rng.uniform(0, 1, B), np.log(rng.uniform(1e-3, 0.05, B))], 1)
        hi = np.stack([x[-1] + rng.uniform(0, 1, B), np.log(rng.uniform(1.0, 5.0, B))], 1)
        th0 = lo + rng.random((B, 2)) * (hi - lo)
        th0[rng.random(B) < 0.2, 0] = lo[0, 0]  # some start on a bound
        floor = rng.choice([-np.inf, 0.0, 0.5], B)
        caps = (np.full((B, 2), np.inf) if rng.random() < 0.3
                else rng.uniform(0.05, 1.0, (B, 2)))
        max_iter = int(rng.choice([5, 30, 60]))
        block = (int(rng.choice([8, 16, 32])), int(rng.choice([4, 8, 16, 64])))
        lm, out = _solve_both(fused, x, Yc, W, th0, lo, hi, caps, mean, floor,
                              max_iter=max_iter, block=block)
        same_status = lm["status"] == out["status"]
        same_iter = lm["n_iter"] == out["n_iter"]
        totals["rows"] += B
        totals["status_equal"] += int(same_status.sum())
        totals["n_iter_equal"] += int(same_iter.sum())
        totals["floor_rows"] += int(np.sum(np.isfinite(floor)))
        totals["converged"] += int(np.sum(lm["status"] == 0))
        both = (lm["status"] == 0) & (out["status"] == 0)
        syy = (Yc * Yc).sum(1) + 1e-300
        rel = np.abs(lm["sse"] - out["sse"]) / syy
        well = (n >= 10) & (lm["sse"] <= 0.5 * syy)
        totals["sse_max_rel"] = max(totals["sse_max_rel"], float(rel[both].max(initial=0.0)))
        totals["well_posed"] += int(well.sum())
        totals["well_posed_status_equal"] += int((well & same_status).sum())
        totals["sse_max_rel_well_posed"] = max(totals["sse_max_rel_well_posed"],
                                               float(rel[both & well].max(initial=0.0)))
    return totals


@pytest.fixture(scope="module")
def report() -> dict:
    triton = pytest.importorskip("triton")
    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 8):
        # Triton 3.6's interpreter cannot loop over a range bounded by a kernel argument
        # (the compiled kernel can: the compile test below runs on any version)
        pytest.skip(f"Triton's interpreter before 3.8 (found {triton.__version__})")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(Path(__file__)), "--worker"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernels_ran_in_the_interpreter(report):
    assert report["interpreted"]


def test_fused_fit_matches_batched_torch(report):
    """Every path (free levels, a level on the floor, degenerate and failed rows, missing
    points): the same status on every row, the same optimum to rounding. Iterations may
    differ where the sums' order tips a decision on a flat objective (measured on an earlier
    draw: one flat-noise row of 93, 109 iterations summed over its restarts against 29 or 51
    as the roundings went, the same optimum)."""
    fit = report["fit"]
    assert len(report["fit_statuses"]) >= 2  # more than one outcome is exercised
    assert fit["status"]["equal_frac"] == 1.0
    assert fit["n_iter"]["equal_frac"] >= 0.97
    for k in ("l0", "linf", "mu", "s", "sse", "r2"):
        assert fit[k]["same_nan"], k
        assert fit[k]["max_rel"] < 1e-8, (k, fit[k])
    for k in ("mu_se", "s_se"):
        assert fit[k]["same_nan"], k
        assert fit[k]["max_rel"] < 1e-5, (k, fit[k])


@pytest.mark.parametrize("case", ["caps_blocks_8x16", "no_caps_blocks_64x64", "max_iter_3"])
def test_kernel_matches_levenberg_marquardt(report, case):
    """Other block shapes (rows and points not multiples of them), no trust region, and an
    iteration limit that leaves rows unconverged: the same steps as the batched solver."""
    r = report[case]
    assert r["status"]["equal_frac"] == 1.0
    assert r["n_iter"]["equal_frac"] >= 0.97
    for k in ("p", "sse", "A"):
        assert r[k]["same_nan"], k
        assert r[k]["max_rel"] < 1e-8, (k, r[k])
    if case == "max_iter_3":
        assert report[case + "_converged"] < 0.5  # the limit did stop rows
    else:
        assert report[case + "_converged"] > 0.9


def test_kernel_matches_levenberg_marquardt_on_random_problems(report):
    """Random shapes, gaps, boxes, floors, trust regions and tiles: well-posed rows end with
    the same status and sum of squares; ill-posed ones (flat objectives) nearly always too.
    Measured: statuses equal on all 78 well-posed rows and on 286 of 289 in all, iterations
    on 280; sums of squares within 1.3e-5 of the data's variance where both converged (a
    flat valley), within 7e-14 on well-posed rows."""
    r = report["random"]
    assert r["rows"] >= 150 and r["floor_rows"] > 0 and 0 < r["converged"] < r["rows"]
    assert r["well_posed"] >= 50, r
    assert r["well_posed_status_equal"] == r["well_posed"], r
    assert r["sse_max_rel_well_posed"] < 1e-10, r
    assert r["status_equal"] >= 0.97 * r["rows"], r
    assert r["n_iter_equal"] >= 0.93 * r["rows"], r
    assert r["sse_max_rel"] < 1e-4, r


def test_empty_batch(report):
    assert report["empty_shapes"] == {"p": [0, 2], "sse": [0], "A": [0, 2, 2], "d": [0],
                                      "lin": [0], "n_iter": [0], "status": [0]}


def test_kernel_compiles_for_an_h200_without_large_spills(tmp_path):
    """The interpreter runs the kernel as numpy and misses what only the compiler checks
    (types carried through the loop, constexpr globals); compiling it for sm_90 needs Triton's
    bundled ptxas, not a GPU. With the default shape at most a few words go to the stack (0
    bytes with Triton 3.8, 48 with 3.9: its registers differ by version), not the kilobytes
    of a tile too large for the registers (32 x 32 x 4: 11.8 kB a thread, a slow kernel)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tokdyn.fit import triton_kernels as tk

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip("triton without its NVIDIA tools")
    fn = tk._sigmoid_lm_kernel
    ints = {"B", "K", "stride", "max_iter"}
    signature = {name: ("constexpr" if name.startswith("BLOCK_") else "i32" if name in ints
                        else "*i64" if name in ("NIT_OUT", "ST_OUT") else "*fp64")
                 for name in fn.arg_names}
    kernel = triton.compile(
        ASTSource(fn=fn, signature=signature,
                  constexprs={"BLOCK_R": tk.BLOCK_R, "BLOCK_K": tk.BLOCK_K}),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": tk.NUM_WARPS, "enable_fp_fusion": tk.FP_FUSION})
    cubin = tmp_path / "sigmoid_lm.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)],
                           capture_output=True, text=True, check=True).stdout
    line = next(part for part in usage.splitlines() if "REG:" in part)
    fields = dict(item.split(":") for item in line.split() if ":" in item)
    assert int(fields["STACK"]) <= 256, line
    assert int(fields["LOCAL"]) == 0, line


def test_a_failing_fused_solver_falls_back_once(monkeypatch):
    """A Triton or driver that cannot build or run the kernel: one warning, then the batched
    solver fits that block and every later one, with its results."""
    from tokdyn.fit import backends, fit_sigmoids

    calls = []

    class Broken:
        @staticmethod
        def projected_sigmoid_lm(*args, **kwargs):
            calls.append(1)
            raise RuntimeError("PTX .version 9.9 does not support .target sm_20\nmore")

    monkeypatch.setattr(backends, "_FUSED_ERROR", [])
    monkeypatch.setattr(backends, "_fused_sigmoid_solver",
                        lambda ops: None if backends._FUSED_ERROR else Broken)
    Y = _mixed()
    with pytest.warns(RuntimeWarning, match="fused GPU sigmoid solver failed .RuntimeError: "
                      "PTX .version 9.9 does not support .target sm_20.; fitting with"):
        got = fit_sigmoids(X, Y, backend="torch", device="cpu", two_step=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        again = fit_sigmoids(X, Y, backend="torch", device="cpu", two_step=False)
    assert len(calls) == 1
    monkeypatch.setattr(backends, "_fused_sigmoid_solver", lambda ops: None)
    ref = fit_sigmoids(X, Y, backend="torch", device="cpu", two_step=False)
    for fit in (got, again):
        np.testing.assert_array_equal(fit.status, ref.status)
        np.testing.assert_array_equal(fit.mu, ref.mu)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    print(json.dumps(_worker()))
