"""Compiled (numba) Levenberg-Marquardt: one trajectory per thread, the same steps as lm.py.

Why numba for the CPU: the batched numpy solver streams ~30 temporaries of [B, K] through
memory per iteration; here each trajectory's observed points sit in L1, the model is evaluated
in short loops that LLVM vectorises (with an arithmetic ``exp``: libm's is scalar), and
``prange`` spreads chunks of trajectories over the cores. Compiled functions are cached on
disk (``cache=True``) so only the first import on a machine pays the compile.

Import this module only through :func:`tokdyn.fit.backends.load_numba`, which returns None
when numba is missing.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from tokdyn.fit.lm import LM_CONVERGED, LM_FAILED, MODEL_SIGMOID
from tokdyn.fit.sigmoid import Z_CLIP

# No fastmath: strict IEEE arithmetic, so that a result does not depend on how a kernel was
# compiled. numba links a private copy of every compiled callee into each caller and LLVM
# re-optimises it there (inlined, fused with the caller's code); with value-changing flags
# ("reassoc", "arcp", "contract", "afn") each copy may round differently, and which copy runs
# depends on what this process compiled and what it loaded from the on-disk cache (measured;
# the exact LLVM mechanism, e.g. which weak definition the JIT binds, was not pinned down).
# Results must be identical whichever copy runs, and only IEEE semantics guarantee that.
# The varpro fits differed
# between a process that compiled the kernels and one that loaded them from the cache (two
# sigmoids: ~900 of 1,200 planted rows; tests/test_fit_determinism.py). The elementwise loops
# (_exp, _sigmoid_columns) still vectorise; the sums no longer do. Measured on 2 shared
# cores, warm: fit_block of 3,000 planted rows 0.21-0.23 s against 0.20-0.21 s with the flags.
_JIT = dict(cache=True, nogil=True)
# Kept as a name for the model evaluations; the same options (see above).
_JIT_SIMD = _JIT

# Scratch rows per trajectory used by the evaluations (see _eval_two_sigmoids).
N_SCRATCH = 11


@njit(inline="always", **_JIT_SIMD)
def _exp(z):
    """e^z for |z| <= 50 in plain arithmetic, so the loops around it vectorise (libm's exp
    does not): Taylor series of e^(z/256) to degree 11, squared 8 times. Relative error
    below 2e-13 on [-50, 50] (tests check it); the fit is unaffected at that level."""
    r = z * (1.0 / 256.0)
    p = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (
        1.0 / 120 + r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (
            1.0 / 362880 + r * (1.0 / 3628800))))))))))
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    return p * p


@njit(**_JIT_SIMD)
def exp_approx(z):
    """Vectorised :func:`_exp` over an array (for tests)."""
    out = np.empty_like(z)
    for k in range(z.shape[0]):
        out[k] = _exp(z[k])
    return out


@njit(**_JIT_SIMD)
def _sigmoid_columns(xo, n, mu, inv_s, zb, gb, hb):
    """zb = z clipped, gb = sigma(-z), hb = 1 - gb for the n observed points.

    Three simple loops rather than one: each of them vectorises.
    """
    for k in range(n):
        zb[k] = min(max((xo[k] - mu) * inv_s, -Z_CLIP), Z_CLIP)
    for k in range(n):
        gb[k] = _exp(zb[k])
    for k in range(n):
        e = gb[k]
        g = 1.0 / (1.0 + e)
        gb[k] = g
        hb[k] = e * g


@njit(**_JIT_SIMD)
def _eval_sigmoid(xo, yo, n, p, A, grad, buf):
    """Fill A = J^T J and grad = J^T r at p = (l0, linf, mu, ln s); return the sum of squares."""
    l0, linf, mu, inv_s = p[0], p[1], p[2], math.exp(-p[3])
    d = l0 - linf
    zb, gb, hb = buf[0], buf[1], buf[2]
    _sigmoid_columns(xo, n, mu, inv_s, zb, gb, hb)
    a00 = a01 = a02 = a03 = a11 = a12 = a13 = a22 = a23 = a33 = 0.0
    g0 = g1 = g2 = g3 = 0.0
    sse = 0.0
    for k in range(n):
        g = gb[k]
        h = hb[k]
        r = linf + d * g - yo[k]
        j3 = d * g * h
        t = j3 * inv_s
        j3 = j3 * zb[k]
        sse += r * r
        a00 += g * g
        a01 += g * h
        a02 += g * t
        a03 += g * j3
        a11 += h * h
        a12 += h * t
        a13 += h * j3
        a22 += t * t
        a23 += t * j3
        a33 += j3 * j3
        g0 += g * r
        g1 += h * r
        g2 += t * r
        g3 += j3 * r
    A[0, 0], A[0, 1], A[0, 2], A[0, 3] = a00, a01, a02, a03
    A[1, 0], A[1, 1], A[1, 2], A[1, 3] = a01, a11, a12, a13
    A[2, 0], A[2, 1], A[2, 2], A[2, 3] = a02, a12, a22, a23
    A[3, 0], A[3, 1], A[3, 2], A[3, 3] = a03, a13, a23, a33
    grad[0], grad[1], grad[2], grad[3] = g0, g1, g2, g3
    return sse


@njit(inline="always", **_JIT_SIMD)
def _dot(u, v, n):
    acc = 0.0
    for k in range(n):
        acc += u[k] * v[k]
    return acc


@njit(**_JIT_SIMD)
def _eval_two_sigmoids(xo, yo, n, p, A, grad, buf):
    """As _eval_sigmoid for p = (linf, d1, mu1, ln s1, d2, mu2, ln s2).

    buf rows: 0-2 and 3-5 the columns of each event; 6-9 the mu and ln s columns of J;
    10 the residuals. J^T J is then 28 vectorised dot products.
    """
    linf, d1, mu1, d2, mu2 = p[0], p[1], p[2], p[4], p[5]
    inv_s1, inv_s2 = math.exp(-p[3]), math.exp(-p[6])
    _sigmoid_columns(xo, n, mu1, inv_s1, buf[0], buf[1], buf[2])
    _sigmoid_columns(xo, n, mu2, inv_s2, buf[3], buf[4], buf[5])
    z1, g1, h1, z2, g2, h2 = buf[0], buf[1], buf[2], buf[3], buf[4], buf[5]
    m1, w1, m2, w2, r = buf[6], buf[7], buf[8], buf[9], buf[10]
    sse = 0.0
    for k in range(n):
        t1 = d1 * g1[k] * h1[k]
        t2 = d2 * g2[k] * h2[k]
        m1[k] = t1 * inv_s1
        w1[k] = t1 * z1[k]
        m2[k] = t2 * inv_s2
        w2[k] = t2 * z2[k]
        rk = linf + d1 * g1[k] + d2 * g2[k] - yo[k]
        r[k] = rk
        sse += rk * rk
    # columns of J in parameter order; column 0 (d/dlinf) is all ones
    cols = (g1, m1, w1, g2, m2, w2)
    A[0, 0] = n
    grad[0] = 0.0
    for k in range(n):
        grad[0] += r[k]
    for a in range(6):
        ca = cols[a]
        s0 = 0.0
        for k in range(n):
            s0 += ca[k]
        A[0, a + 1] = A[a + 1, 0] = s0
        grad[a + 1] = _dot(ca, r, n)
        for b in range(a + 1):
            A[a + 1, b + 1] = A[b + 1, a + 1] = _dot(ca, cols[b], n)
    return sse


@njit(**_JIT)
def _evaluate(model, xo, yo, n, p, A, grad, buf):
    if model == MODEL_SIGMOID:
        return _eval_sigmoid(xo, yo, n, p, A, grad, buf)
    return _eval_two_sigmoids(xo, yo, n, p, A, grad, buf)


@njit(**_JIT)
def _cholesky_solve(M, rhs, h, L):
    """Solve M h = rhs (M small SPD); False if a pivot is not positive (as lm.cholesky_solve)."""
    ok = _cholesky_factor(M, L)
    _cholesky_substitute(L, rhs, h)
    return ok


@njit(inline="always", **_JIT)
def _cholesky_factor(M, L):
    """L L^T = M (lower triangle of L); False if a pivot is not positive (it is then taken
    as 1)."""
    P = M.shape[0]
    ok = True
    for j in range(P):
        d = M[j, j]
        for k in range(j):
            d -= L[j, k] * L[j, k]
        if not (d > 1e-14 * abs(M[j, j])):
            ok = False
            d = 1.0
        d = math.sqrt(d)
        L[j, j] = d
        for i in range(j + 1, P):
            v = M[i, j]
            for k in range(j):
                v -= L[i, k] * L[j, k]
            L[i, j] = v / d
    return ok


@njit(inline="always", **_JIT)
def _cholesky_substitute(L, rhs, h):
    """h = (L L^T)^-1 rhs by forward and back substitution."""
    P = L.shape[0]
    for j in range(P):
        v = rhs[j]
        for k in range(j):
            v -= L[j, k] * h[k]
        h[j] = v / L[j, j]
    for j in range(P - 1, -1, -1):
        v = h[j]
        for k in range(j + 1, P):
            v -= L[k, j] * h[k]
        h[j] = v / L[j, j]


@njit(**_JIT)
def _lm_row(model, xo, yo, n, p, lo, hi, max_iter, ftol, xtol, A, work, J_work, buf):
    """Fit one trajectory in place (p, A); return (sse, iterations, status).

    ``work`` [10, P], ``J_work`` [3, P, P] and ``buf`` [N_SCRATCH, K] are scratch space
    reused across rows (allocating inside a parallel loop serialises the threads on the
    allocator).
    """
    P = p.shape[0]
    grad, g_t, rhs, h, p_try, D = work[0], work[1], work[2], work[3], work[4], work[5]
    fixed = work[6]  # 1.0 where the parameter is held on its bound this step
    A_t, M, L = J_work[0], J_work[1], J_work[2]
    for j in range(P):
        p[j] = min(max(p[j], lo[j]), hi[j])
    sse = _evaluate(model, xo, yo, n, p, A, grad, buf)
    if not math.isfinite(sse):
        return sse, 0, LM_FAILED
    for j in range(P):
        D[j] = A[j, j]
    lam = 1e-3
    nu = 2.0
    for it in range(max_iter):
        dmax = 0.0
        for j in range(P):
            D[j] = max(D[j], A[j, j])
            dmax = max(dmax, D[j])
        floor = 1e-12 * dmax + 1e-300
        for j in range(P):
            out = (p[j] <= lo[j] and grad[j] > 0) or (p[j] >= hi[j] and grad[j] < 0)
            fixed[j] = 1.0 if out else 0.0
        for a in range(P):
            for b in range(P):
                M[a, b] = 0.0 if (fixed[a] > 0 or fixed[b] > 0) else A[a, b]
            M[a, a] = 1.0 if fixed[a] > 0 else M[a, a] + lam * max(D[a], floor)
            rhs[a] = 0.0 if fixed[a] > 0 else -grad[a]
        ok = _cholesky_solve(M, rhs, h, L)

        hn = 0.0
        pn = 0.0
        for j in range(P):
            p_try[j] = min(max(p[j] + h[j], lo[j]), hi[j])
            h[j] = p_try[j] - p[j]
            hn += h[j] * h[j]
            pn += p[j] * p[j]
        pred = 0.0
        for a in range(P):
            v = 0.0
            for b in range(P):
                v += A[a, b] * h[b]
            pred -= 2.0 * grad[a] * h[a] + h[a] * v
        sse_t = _evaluate(model, xo, yo, n, p_try, A_t, g_t, buf)

        better = ok and math.isfinite(sse_t) and sse_t < sse
        actred = sse - sse_t
        rho = actred / pred if pred > 0 else 0.0
        converged = (
            (better and actred <= ftol * sse and pred <= ftol * sse and rho <= 2.0)
            or (better and sse_t <= 0)
            or (ok and math.sqrt(hn) <= xtol * (math.sqrt(pn) + xtol))
        )
        if better:
            sse = sse_t
            for a in range(P):
                p[a] = p_try[a]
                grad[a] = g_t[a]
                for b in range(P):
                    A[a, b] = A_t[a, b]
            lam *= max(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
            nu = 2.0
        else:
            lam *= nu
            nu *= 2.0
        if converged:
            return sse, it + 1, LM_CONVERGED
    return sse, max_iter, LM_FAILED


def lm_block(model, x, Y, p0, lo, hi, max_iter, ftol, xtol):
    """Fit every row of Y [B, K] (NaN = missing) from p0 [B, P] within [lo, hi].

    Returns p [B, P], sse [B], A [B, P, P], n_iter [B], status [B].
    """
    # Several chunks per thread even out trajectories of unequal cost.
    n_chunks = max(1, min(Y.shape[0], 8 * numba.get_num_threads()))
    return _lm_chunks(model, x, Y, p0, lo, hi, max_iter, ftol, xtol, n_chunks)


@njit(cache=True, parallel=True, nogil=True)
def _lm_chunks(model, x, Y, p0, lo, hi, max_iter, ftol, xtol, n_chunks):
    B, K = Y.shape
    P = p0.shape[1]
    p_out = p0.copy()
    sse = np.empty(B)
    A = np.zeros((B, P, P))
    n_iter = np.zeros(B, dtype=np.int64)
    status = np.full(B, LM_FAILED, dtype=np.int64)
    for c in prange(n_chunks):
        xo = np.empty(K)
        yo = np.empty(K)
        work = np.zeros((10, P))
        J_work = np.zeros((3, P, P))
        buf = np.zeros((N_SCRATCH, K))
        for b in range(c * B // n_chunks, (c + 1) * B // n_chunks):
            n = 0
            for k in range(K):
                if not math.isnan(Y[b, k]):
                    xo[n] = x[k]
                    yo[n] = Y[b, k]
                    n += 1
            sse[b], n_iter[b], status[b] = _lm_row(
                model, xo, yo, n, p_out[b], lo[b], hi[b], max_iter, ftol, xtol, A[b],
                work, J_work, buf,
            )
    return p_out, sse, A, n_iter, status


@njit(cache=True, parallel=True, nogil=True)
def prepare_block(x, Y, max_loss, neg_tol, edge_points, s_min, s_max_frac, mu_margin,
                  level_floor):
    """Everything tokdyn.fit.prepare.prepare computes, in one pass per row.

    Returns (n, x_first, x_last, invalid, mean, sse_const, intercept, slope, sse_line,
    p0 [B, 4], lo [B, 4], hi [B, 4]); see that function for the definitions.
    """
    B, K = Y.shape
    nan = np.nan
    n_out = np.zeros(B, dtype=np.int64)
    x_first = np.full(B, nan)
    x_last = np.full(B, nan)
    invalid = np.zeros(B, dtype=np.bool_)
    mean = np.full(B, nan)
    sse_c = np.full(B, nan)
    intercept = np.full(B, nan)
    slope = np.full(B, nan)
    sse_l = np.full(B, nan)
    p0 = np.empty((B, 4))
    lo = np.full((B, 4), level_floor)
    hi = np.full((B, 4), np.inf)
    grid_span = max(x[K - 1] - x[0], 1.0)
    for b in prange(B):
        xo = np.empty(K)
        yo = np.empty(K)
        n = 0
        bad = False
        for k in range(K):
            y = Y[b, k]
            if math.isnan(y):
                continue
            if math.isinf(y) or y < -neg_tol or y > max_loss:
                bad = True
            xo[n] = x[k]
            yo[n] = y
            n += 1
        if bad:
            n = 0
        invalid[b] = bad
        n_out[b] = n
        # observed range and bounds
        if n > 0:
            first, last = xo[0], xo[n - 1]
            x_first[b], x_last[b] = first, last
        else:
            first, last = x[0], x[K - 1]
        span = last - first if last > first else grid_span
        lo[b, 2] = first - mu_margin * span
        hi[b, 2] = last + mu_margin * span
        lo[b, 3] = s_min
        hi[b, 3] = max(s_max_frac * span, s_min)
        # constant and line
        if n > 0:
            sy = 0.0
            sx = 0.0
            for k in range(n):
                sy += yo[k]
                sx += xo[k]
            ym = sy / n
            xm = sx / n
            sc = 0.0
            sxx = 0.0
            sxy = 0.0
            for k in range(n):
                sc += (yo[k] - ym) ** 2
                sxx += (xo[k] - xm) ** 2
                sxy += (xo[k] - xm) * (yo[k] - ym)
            sl = sxy / sxx if sxx > 0 else 0.0
            ic = ym - sl * xm
            sl_sse = 0.0
            for k in range(n):
                sl_sse += (yo[k] - ic - sl * xo[k]) ** 2
            mean[b], sse_c[b] = ym, sc
            intercept[b], slope[b], sse_l[b] = ic, sl, sl_sse
        # sigmoid start values
        m = max(min(edge_points, n // 4), 1)
        l0 = 0.0
        linf = 0.0
        for k in range(min(m, n)):
            l0 += yo[k]
            linf += yo[n - 1 - k]
        l0 /= m
        linf /= m
        mid = 0.5 * (l0 + linf)
        d = l0 - linf
        sign = 1.0 if d >= 0 else -1.0
        c = 0
        band = 0
        for k in range(n):
            if sign * (yo[k] - mid) > 0:
                c += 1
            if abs(yo[k] - mid) < 0.25 * abs(d):
                band += 1
        nn = max(n, 1)
        if n > 0:
            x_lo = xo[min(max(c, 1), nn) - 1]
            x_hi = xo[min(max(c + 1, 1), nn) - 1]
        else:
            x_lo = x_hi = x[0]
        s_span = last - first if (n > 0 and last > first) else 1.0
        s = band / nn * s_span / 2.2
        s = min(max(s, s_span / 50.0), s_span / 4.0)
        p0[b, 0] = l0
        p0[b, 1] = linf
        p0[b, 2] = min(max(0.5 * (x_lo + x_hi), lo[b, 2]), hi[b, 2])
        p0[b, 3] = min(max(s, lo[b, 3]), hi[b, 3])
    return (n_out, x_first, x_last, invalid, mean, sse_c, intercept, slope, sse_l, p0, lo, hi)


def inverse_diagonal(A):
    """diag(A^-1) [B, P] of SPD matrices A [B, P, P] by Cholesky, and ok [B] (as lm.py)."""
    B = A.shape[0]
    return _inverse_diagonal_chunks(A, max(1, min(B, 8 * numba.get_num_threads())))


@njit(cache=True, parallel=True, nogil=True)
def _inverse_diagonal_chunks(A, n_chunks):
    B, P = A.shape[0], A.shape[1]
    out = np.full((B, P), np.nan)
    ok = np.zeros(B, dtype=np.bool_)
    for c in prange(n_chunks):
        L = np.zeros((P, P))  # scratch per chunk (an allocation per row serialises threads)
        e = np.zeros(P)
        col = np.zeros(P)
        for b in range(c * B // n_chunks, (c + 1) * B // n_chunks):
            good = True
            for j in range(P):
                for i in range(P):
                    good = good and math.isfinite(A[b, i, j])
            good = _cholesky_factor(A[b], L) and good  # once: the same L for every column
            for j in range(P):
                e[:] = 0.0
                e[j] = 1.0
                _cholesky_substitute(L, e, col)
                out[b, j] = col[j]
            ok[b] = good
    return out, ok
