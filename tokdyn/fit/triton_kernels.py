"""The sigmoid fit's whole solver loop in one GPU launch (Triton).

The torch backend's batched solver (:func:`tokdyn.fit.lm.levenberg_marquardt` with
:func:`tokdyn.fit.projection.sigmoid_projected`) launches a few dozen elementwise kernels per
iteration and asks the host every few iterations whether a row is still running; on an H200
that host traffic, not the arithmetic, set its speed (220k fits/s, docs/benchmarks.md).
:func:`projected_sigmoid_lm` runs the same iteration, step for step, inside one kernel: each
program takes ``BLOCK_R`` rows, keeps every row's state (th = (mu, ln s), the projected sum of
squares F, its gradient and 2x2 matrix, damping, trust region, status) in registers, and reads
the rows' points in chunks of ``BLOCK_K`` for each evaluation (summed per lane, reduced across
the lanes once). A program stops when all its rows have converged (or after ``max_iter``
steps); nothing goes back to the host until the end.

The arithmetic is that of :mod:`tokdyn.fit.projection` and :mod:`tokdyn.fit.lm` (variable
projection in (mu, ln s) with the levels at or above a floor; the bounded, damped step with
Marquardt scaling, active set, trust region and MINPACK's convergence tests), so the solver
reaches what the batched one reaches. Its roundings differ: each sum over the points is
added in another order, and compiled for a GPU, products and sums contract into fused
multiply-adds (``FP_FUSION``) and ``exp`` is CUDA's; near a threshold (a flat objective) that
can change a row's path, rarely its optimum (the interpreter, which the tests run, does
neither contraction).

A kernel that fails to compile or launch makes the torch backend fall back to its batched
solver with one warning (:func:`tokdyn.fit.backends._fused_solve`); a fault inside a running
kernel is reported by CUDA later, asynchronously, and leaves the device unusable: no fallback
can cover that.

Only :func:`tokdyn.fit.backends.load_triton` imports this module: it needs the ``triton``
package (shipped with CUDA builds of torch). Under ``TRITON_INTERPRET=1`` (set before triton is
first imported) the same kernels run in Triton's interpreter on the CPU (numpy): how the tests
check them on a machine without a GPU; they also compile them for an H100/H200 (sm_90), which
needs no GPU either (tests/test_fit_triton.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tokdyn.fit import lm
from tokdyn.fit.sigmoid import Z_CLIP as _Z

# The constants a kernel reads (Triton kernels see module globals only as constexpr).
Z_CLIP = tl.constexpr(_Z)
LM_CONVERGED = tl.constexpr(lm.LM_CONVERGED)
LM_FAILED = tl.constexpr(lm.LM_FAILED)
RADIUS_MAX = tl.constexpr(lm.RADIUS_MAX)
RADIUS_RHO = tl.constexpr(lm.RADIUS_RHO)

__all__ = ["BLOCK_K", "BLOCK_R", "NUM_WARPS", "projected_sigmoid_lm"]

# Rows per program, points per chunk of an evaluation, warps per program: one element of the
# [BLOCK_R, BLOCK_K] tile per thread, so each thread holds one row's state and 21 partial sums
# and the sums cross threads once per evaluation. Compiled for sm_90 (an H100/H200) without a
# GPU: 215 registers a thread and nothing on the stack with Triton 3.8 (3.6: 234 and nothing;
# 3.9: 255 and 48 bytes); 32 x 32 x 4 (eight elements a thread) spilled 11.8 kB a thread.
# pipelines/gpu_fit_check.py times other shapes.
BLOCK_R = 16
BLOCK_K = 8
NUM_WARPS = 4
# Multiplies and adds contracted into fused multiply-adds (Triton's default until 3.9, which
# warns unless it is asked for explicitly).
FP_FUSION = True


@triton.jit
def _finite(v):
    return (v == v) & (tl.abs(v) < float("inf"))


# Minimum and maximum that return NaN when either operand is, as torch's do (the GPU's own
# min and max return the other operand): a NaN step must stay NaN, as in the batched solver.
@triton.jit
def _min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _terms(c, c0, c1, c00, c01, c11, v, v0, v1, v00, v01, v11, syy, q00, q01, q11, w0, w1):
    """F = syy - c^2 / v of one amplitude d = c / v, with the gradient and matrix of F/2 in
    (mu, ln s): tokdyn.fit.projection._terms. Rows with v <= 0 get F = inf."""
    good = v > 0
    v = tl.where(good, v, 1.0)
    d = c / v
    F = syy - c * c / v
    F = tl.where(F > 0, F, 0.0)
    F = tl.where(good, F, float("inf"))
    d2 = d * d
    g0 = -d * c0 + 0.5 * d2 * v0
    g1 = -d * c1 + 0.5 * d2 * v1
    h00 = -(c0 * c0 + c * c00) / v + 2.0 * d * c0 * v0 / v + 0.5 * d2 * v00 - d2 * v0 * v0 / v
    h01 = (-(c0 * c1 + c * c01) / v + d * (c0 * v1 + c1 * v0) / v + 0.5 * d2 * v01
           - d2 * v0 * v1 / v)
    h11 = -(c1 * c1 + c * c11) / v + 2.0 * d * c1 * v1 / v + 0.5 * d2 * v11 - d2 * v1 * v1 / v
    pd = (h00 > 0) & (h11 > 0) & (h00 * h11 - h01 * h01 > 1e-12 * h00 * h11)
    m00 = tl.where(pd, h00, d2 * (q00 - w0 * w0 / v))
    m01 = tl.where(pd, h01, d2 * (q01 - w0 * w1 / v))
    m11 = tl.where(pd, h11, d2 * (q11 - w1 * w1 / v))
    return F, d, g0, g1, m00, m01, m11


@triton.jit
def _sums(X, YC, W, rows, rmask, stride, K, mu, lns, BLOCK_R: tl.constexpr,
          BLOCK_K: tl.constexpr):
    """The 21 sums over each row's observed points of the sigmoid at (mu, ln s) [BLOCK_R]
    that its projected F, gradient and matrix are made of (tokdyn.fit.projection._solve).

    Each sum is accumulated per lane of a [BLOCK_R, BLOCK_K] tile over the chunks of points
    and reduced across the lanes once, at the end."""
    inv_s = tl.exp(-lns)[:, None]
    mu2 = mu[:, None]
    zero = tl.zeros([BLOCK_R, BLOCK_K], dtype=tl.float64)
    sg = zero
    sgg = zero
    sgy = zero
    sa = zero
    sb = zero
    sga = zero
    sgb = zero
    saa = zero
    sab = zero
    sbb = zero
    say = zero
    sby = zero
    smmy = zero
    smty = zero
    stty = zero
    smm = zero
    smt = zero
    stt = zero
    sgmm = zero
    sgmt = zero
    sgtt = zero
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        cmask = cols < K
        at = rows[:, None] * stride + cols[None, :]
        m2 = rmask[:, None] & cmask[None, :]
        y = tl.load(YC + at, mask=m2, other=0.0)
        w = tl.load(W + at, mask=m2, other=0.0)
        x = tl.load(X + cols, mask=cmask, other=0.0)
        z = (x[None, :] - mu2) * inv_s
        z = _min(_max(z, -Z_CLIP), Z_CLIP)
        z = tl.where(cmask[None, :], z, 0.0)  # past the last point: finite whatever mu, s
        e = tl.exp(z)
        g0 = 1.0 / (1.0 + e)
        h = e * g0 * w
        g = g0 * w
        u = g * h
        a = u * inv_s
        b = u * z
        hg = h - g
        zw1 = z * hg - 1.0
        mm = u * hg * inv_s * inv_s
        mt = a * zw1
        tt = b * zw1
        sg += g
        sgg += g * g
        sgy += g * y
        sa += a
        sb += b
        sga += g * a
        sgb += g * b
        saa += a * a
        sab += a * b
        sbb += b * b
        say += a * y
        sby += b * y
        smmy += mm * y
        smty += mt * y
        stty += tt * y
        smm += mm
        smt += mt
        stt += tt
        sgmm += g * mm
        sgmt += g * mt
        sgtt += g * tt
    return (tl.sum(sg, axis=1), tl.sum(sgg, axis=1), tl.sum(sgy, axis=1), tl.sum(sa, axis=1),
            tl.sum(sb, axis=1), tl.sum(sga, axis=1), tl.sum(sgb, axis=1), tl.sum(saa, axis=1),
            tl.sum(sab, axis=1), tl.sum(sbb, axis=1), tl.sum(say, axis=1),
            tl.sum(sby, axis=1), tl.sum(smmy, axis=1), tl.sum(smty, axis=1),
            tl.sum(stty, axis=1), tl.sum(smm, axis=1), tl.sum(smt, axis=1),
            tl.sum(stt, axis=1), tl.sum(sgmm, axis=1), tl.sum(sgmt, axis=1),
            tl.sum(sgtt, axis=1))


@triton.jit
def _evaluate(X, YC, W, rows, rmask, stride, K, mu, lns, n, syy, mean, floor,
              BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(F, d, linf - mean, gradient, matrix) of the projected sigmoid at (mu, ln s) with both
    levels at or above ``floor`` (tokdyn.fit.projection._solve, row by row)."""
    (sg, sgg, sgy, sa, sb, sga, sgb, saa, sab, sbb, say, sby, smmy, smty, stty, smm, smt, stt,
     sgmm, sgmt, sgtt) = _sums(X, YC, W, rows, rmask, stride, K, mu, lns, BLOCK_R, BLOCK_K)
    # free levels: basis (1, g)
    v = sgg - sg * sg / n
    v = tl.where(v > 1e-12 * n, v, 0.0)
    w0 = sga - sg * sa / n
    w1 = sgb - sg * sb / n
    F, d, g0, g1, m00, m01, m11 = _terms(
        sgy, say, sby, smmy, smty, stty, v, 2.0 * w0, 2.0 * w1,
        2.0 * (saa + sgmm - (sa * sa + sg * smm) / n),
        2.0 * (sab + sgmt - (sa * sb + sg * smt) / n),
        2.0 * (sbb + sgtt - (sb * sb + sg * stt) / n),
        syy, saa - sa * sa / n, sab - sa * sb / n, sbb - sb * sb / n, w0, w1)
    lin = -d * sg / n
    m = mean - floor  # the data's mean above the floor
    syy_f = syy + n * m * m
    # linf = floor: l = floor + d g
    va = tl.where(sgg > 1e-12 * n, sgg, 0.0)
    Fa, da, ga0, ga1, ma00, ma01, ma11 = _terms(
        sgy + m * sg, say + m * sa, sby + m * sb, smmy + m * smm, smty + m * smt,
        stty + m * stt, va, 2.0 * sga, 2.0 * sgb, 2.0 * (saa + sgmm), 2.0 * (sab + sgmt),
        2.0 * (sbb + sgtt), syy_f, saa, sab, sbb, sga, sgb)
    # l0 = floor: l = floor + e (1 - g), d = -e
    vh = n - 2.0 * sg + sgg
    vh = tl.where(vh > 1e-12 * n, vh, 0.0)
    Fb, eb, gb0, gb1, mb00, mb01, mb11 = _terms(
        n * m - sgy - m * sg, -(say + m * sa), -(sby + m * sb), -(smmy + m * smm),
        -(smty + m * smt), -(stty + m * stt), vh, 2.0 * (sga - sa), 2.0 * (sgb - sb),
        2.0 * (saa + sgmm - smm), 2.0 * (sab + sgmt - smt), 2.0 * (sbb + sgtt - stt),
        syy_f, saa, sab, sbb, sga - sa, sgb - sb)
    Fa = tl.where(da >= 0, Fa, float("inf"))
    Fb = tl.where(eb >= 0, Fb, float("inf"))
    use_b = Fb < Fa
    Fc = tl.where(use_b, Fb, Fa)
    dc = tl.where(use_b, -eb, da)
    linc = tl.where(use_b, eb - m, -m)
    gc0 = tl.where(use_b, gb0, ga0)
    gc1 = tl.where(use_b, gb1, ga1)
    mc00 = tl.where(use_b, mb00, ma00)
    mc01 = tl.where(use_b, mb01, ma01)
    mc11 = tl.where(use_b, mb11, ma11)
    # neither: the loss stays at the floor (no gradient in th)
    none = ~_finite(Fc)
    Fc = tl.where(none, syy_f, Fc)
    dc = tl.where(none, 0.0, dc)
    linc = tl.where(none, -m, linc)
    gc0 = tl.where(none, 0.0, gc0)
    gc1 = tl.where(none, 0.0, gc1)
    mc00 = tl.where(none, 1.0, mc00)
    mc01 = tl.where(none, 0.0, mc01)
    mc11 = tl.where(none, 1.0, mc11)
    # the free levels where they are feasible (and where the basis is degenerate)
    free = ((mean + lin >= floor) & (mean + lin + d >= floor)) | ~_finite(F)
    return (tl.where(free, F, Fc), tl.where(free, d, dc), tl.where(free, lin, linc),
            tl.where(free, g0, gc0), tl.where(free, g1, gc1), tl.where(free, m00, mc00),
            tl.where(free, m01, mc01), tl.where(free, m11, mc11))


@triton.jit
def _sigmoid_lm_kernel(X, YC, W, TH, LO, HI, SM, MEAN, FLOOR,
                       P_OUT, F_OUT, A_OUT, D_OUT, LIN_OUT, NIT_OUT, ST_OUT,
                       PARAMS, B, K, stride, max_iter,
                       BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """levenberg_marquardt(sigmoid_projected, step_max, flat_converged=True) for BLOCK_R rows
    (tokdyn.fit.lm: the same step, tests and updates, row by row in registers). PARAMS:
    float64 (ftol, xtol, shrink_min, lam0) (a float argument would be float32)."""
    ftol = tl.load(PARAMS)
    xtol = tl.load(PARAMS + 1)
    shrink_min = tl.load(PARAMS + 2)
    lam0 = tl.load(PARAMS + 3)
    pid = tl.program_id(0)
    rows = (pid * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < B
    two = rows * 2
    mu = tl.load(TH + two, mask=rmask, other=0.0)
    lns = tl.load(TH + two + 1, mask=rmask, other=0.0)
    lo0 = tl.load(LO + two, mask=rmask, other=0.0)
    lo1 = tl.load(LO + two + 1, mask=rmask, other=0.0)
    hi0 = tl.load(HI + two, mask=rmask, other=0.0)
    hi1 = tl.load(HI + two + 1, mask=rmask, other=0.0)
    sm0 = tl.load(SM + two, mask=rmask, other=1.0)
    sm1 = tl.load(SM + two + 1, mask=rmask, other=1.0)
    mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
    floor = tl.load(FLOOR + rows, mask=rmask, other=0.0)
    mu = _min(_max(mu, lo0), hi0)
    lns = _min(_max(lns, lo1), hi1)
    # the rows' observed points and sum of squares (the data are centred)
    n = tl.zeros([BLOCK_R, BLOCK_K], dtype=tl.float64)
    syy = tl.zeros([BLOCK_R, BLOCK_K], dtype=tl.float64)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        at = rows[:, None] * stride + cols[None, :]
        m2 = rmask[:, None] & (cols < K)[None, :]
        y = tl.load(YC + at, mask=m2, other=0.0)
        n += tl.load(W + at, mask=m2, other=0.0)
        syy += y * y
    n = tl.sum(n, axis=1)
    syy = tl.sum(syy, axis=1)
    F, d, lin, g0, g1, a00, a01, a11 = _evaluate(X, YC, W, rows, rmask, stride, K, mu, lns, n,
                                                syy, mean, floor, BLOCK_R, BLOCK_K)
    D0 = a00
    D1 = a11
    lam = tl.zeros([BLOCK_R], dtype=tl.float64) + lam0
    nu = tl.zeros([BLOCK_R], dtype=tl.float64) + 2.0
    radius = tl.zeros([BLOCK_R], dtype=tl.float64) + 1.0
    n_iter = tl.zeros([BLOCK_R], dtype=tl.int64)
    status = tl.zeros([BLOCK_R], dtype=tl.int64) + LM_FAILED
    active = _finite(F) & rmask
    it = 0
    while (it < max_iter) & (tl.max(active.to(tl.int32), axis=0) > 0):
        D0 = _max(D0, a00)
        D1 = _max(D1, a11)
        dfloor = 1e-12 * _max(D0, D1) + 1e-300
        dl0 = _max(D0, dfloor) * lam
        dl1 = _max(D1, dfloor) * lam
        # active set: a parameter on a bound whose descent direction points outwards
        fixed0 = ((mu <= lo0) & (g0 > 0)) | ((mu >= hi0) & (g0 < 0))
        fixed1 = ((lns <= lo1) & (g1 > 0)) | ((lns >= hi1) & (g1 < 0))
        f0 = tl.where(fixed0, 0.0, 1.0)
        f1 = tl.where(fixed1, 0.0, 1.0)
        M00 = tl.where(fixed0, 1.0, a00 * f0 * f0 + dl0)
        M11 = tl.where(fixed1, 1.0, a11 * f1 * f1 + dl1)
        M01 = a01 * f0 * f1
        # Cholesky of the 2x2 (tokdyn.fit.lm.cholesky_solve)
        ok = _finite((M00 + M01) + (M01 + M11))
        ok = ok & (M00 > 1e-14 * tl.abs(M00))
        L00 = tl.sqrt(tl.where(M00 > 0, M00, 1.0))
        L10 = M01 / L00
        piv = M11 - L10 * L10
        ok = ok & (piv > 1e-14 * tl.abs(M11))
        L11 = tl.sqrt(tl.where(piv > 0, piv, 1.0))
        y0 = -g0 * f0 / L00
        y1 = (-g1 * f1 - L10 * y0) / L11
        h1 = y1 / L11
        h0 = (y0 - L10 * h1) / L00
        # the trust region
        # (an axis without a region, sm = inf, never scales the step, even an infinite one)
        over = _max(tl.where(sm0 == float("inf"), 0.0, tl.abs(h0) / (sm0 * radius)),
                    tl.where(sm1 == float("inf"), 0.0, tl.abs(h1) / (sm1 * radius)))
        capped = over > 1.0
        scale = _max(over, 1.0)
        h0 = h0 / scale
        h1 = h1 / scale
        mu_t = _min(_max(mu + h0, lo0), hi0)
        lns_t = _min(_max(lns + h1, lo1), hi1)
        hc0 = mu_t - mu
        hc1 = lns_t - lns
        pred = (-2.0 * (g0 * hc0 + g1 * hc1)
                - (hc0 * (a00 * hc0 + a01 * hc1) + hc1 * (a01 * hc0 + a11 * hc1)))
        F_t, d_t, lin_t, g0_t, g1_t, a00_t, a01_t, a11_t = _evaluate(
            X, YC, W, rows, rmask, stride, K, mu_t, lns_t, n, syy, mean, floor, BLOCK_R,
            BLOCK_K)
        # at the optimum to ftol already (a nearly undamped step predicts no real gain):
        # converged, the step neither taken nor counted
        # (not a step the trust region cut short: its gain is small for being short)
        flat = active & ok & ~capped & (lam <= 1.0) & (pred >= 0) & (pred <= ftol * F)
        step_ok = active & ok & _finite(F_t) & ~flat
        better = step_ok & (F_t < F)
        actred = F - F_t
        rho = tl.where(pred > 0, actred / tl.where(pred > 0, pred, 1.0), 0.0)
        small_f = better & (actred <= ftol * F) & (pred <= ftol * F) & (rho <= 2.0)
        exact = better & (F_t <= 0)
        hn = tl.sqrt(hc0 * hc0 + hc1 * hc1)
        pn = tl.sqrt(mu * mu + lns * lns)
        small_x = active & ok & (hn <= xtol * (pn + xtol))
        converged = small_f | exact | small_x | flat
        mu = tl.where(better, mu_t, mu)
        lns = tl.where(better, lns_t, lns)
        F = tl.where(better, F_t, F)
        d = tl.where(better, d_t, d)
        lin = tl.where(better, lin_t, lin)
        g0 = tl.where(better, g0_t, g0)
        g1 = tl.where(better, g1_t, g1)
        a00 = tl.where(better, a00_t, a00)
        a01 = tl.where(better, a01_t, a01)
        a11 = tl.where(better, a11_t, a11)
        t = 2.0 * rho - 1.0
        shrink = 1.0 - t * t * t
        shrink = tl.where(shrink > shrink_min, shrink, shrink_min)
        grow = active & ~better
        lam = tl.where(better, lam * shrink, tl.where(grow, lam * nu, lam))
        nu = tl.where(better, 2.0, tl.where(grow, nu * 2.0, nu))
        wide = tl.where(2.0 * radius < RADIUS_MAX, 2.0 * radius, RADIUS_MAX)
        narrow = _max(0.5 * radius, 1.0)
        radius = tl.where(better & capped & (rho > RADIUS_RHO), wide,
                          tl.where(grow, narrow, radius))
        n_iter += (active & ~flat).to(tl.int64)
        status = tl.where(active & converged, LM_CONVERGED, status)
        active = active & ~converged
        it += 1
    tl.store(P_OUT + two, mu, mask=rmask)
    tl.store(P_OUT + two + 1, lns, mask=rmask)
    tl.store(F_OUT + rows, F, mask=rmask)
    four = rows * 4
    tl.store(A_OUT + four, a00, mask=rmask)
    tl.store(A_OUT + four + 1, a01, mask=rmask)
    tl.store(A_OUT + four + 2, a01, mask=rmask)
    tl.store(A_OUT + four + 3, a11, mask=rmask)
    tl.store(D_OUT + rows, d, mask=rmask)
    tl.store(LIN_OUT + rows, lin, mask=rmask)
    tl.store(NIT_OUT + rows, n_iter, mask=rmask)
    tl.store(ST_OUT + rows, status, mask=rmask)


def projected_sigmoid_lm(x, Yc, W, th0, lo, hi, step_max, mean, floor, *, max_iter: int,
                         ftol: float, xtol: float, shrink_min: float, lam0: float = 1e-3,
                         block_r: int = BLOCK_R, block_k: int = BLOCK_K,
                         num_warps: int = NUM_WARPS) -> dict:
    """Fit the projected sigmoid to every row in one launch; torch tensors on one device.

    x [K]; Yc [B, K] each row's data minus its mean over the observed points, 0 where missing;
    W [B, K] 1.0 observed, 0.0 not; th0, lo, hi, step_max [B, 2] in (mu, ln s) (step_max: the
    trust region, +inf for none); mean, floor [B] (the levels stay >= floor). float64.

    Returns p [B, 2], sse [B] (the projected F), A [B, 2, 2] (its matrix), d and lin [B] (the
    amplitude and linf - mean at p), n_iter, status [B] (int64): what
    :func:`tokdyn.fit.lm.levenberg_marquardt` returns for :func:`tokdyn.fit.projection.
    sigmoid_projected` with ``flat_converged=True``, plus the amplitudes.
    """
    import torch

    B, K = Yc.shape
    f64 = dict(dtype=torch.float64, device=Yc.device)
    Yc, W = (a.to(torch.float64).contiguous() for a in (Yc, W))
    args = [a.to(torch.float64).contiguous() for a in (x, th0, lo, hi, step_max, mean, floor)]
    out = dict(p=torch.empty(B, 2, **f64), sse=torch.empty(B, **f64),
               A=torch.empty(B, 2, 2, **f64), d=torch.empty(B, **f64),
               lin=torch.empty(B, **f64),
               n_iter=torch.empty(B, dtype=torch.int64, device=Yc.device),
               status=torch.empty(B, dtype=torch.int64, device=Yc.device))
    if B == 0:
        return out
    grid = (triton.cdiv(B, block_r),)
    _sigmoid_lm_kernel[grid](
        args[0], Yc, W, *args[1:], out["p"], out["sse"], out["A"], out["d"], out["lin"],
        out["n_iter"], out["status"],
        torch.tensor([ftol, xtol, shrink_min, lam0], **f64), B, K, Yc.stride(0),
        int(max_iter), BLOCK_R=block_r, BLOCK_K=block_k, num_warps=num_warps,
        enable_fp_fusion=FP_FUSION)
    return out
