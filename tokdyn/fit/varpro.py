"""Variable projection (numba): Levenberg-Marquardt over the nonlinear parameters only.

Both models are linear in their amplitudes once the event times and widths are fixed:

    sigmoid        l(x) = linf + d g(x; mu, s)                          amplitudes (linf, d)
    two sigmoids   l(x) = linf + d1 g(x; mu1, s1) + d2 g(x; mu2, s2)    amplitudes (linf, d1, d2)

with g = sigma(-(x - mu)/s). For given (mu, ln s) the amplitudes solve a 2x2 (3x3) least
squares problem in closed form, so the solver searches only (mu, ln s) (four numbers for two
sigmoids) on the projected sum of squares (Golub and Pereyra). Every evaluation is a pass
over the trajectory's observed points that accumulates a few sums (two sigmoids: two passes,
the second only where the solver takes the step, :func:`_vp_two`); everything else is
arithmetic on those sums, which run in eight vector lanes (:mod:`tokdyn.fit.lanes`: the
evaluation's terms are written once, as Python functions such as :func:`_sigmoid_terms`, and
emitted as vector code whose summation order is fixed). The sigmoid gets the exact Hessian of
the projected sum of squares (damped Newton, :func:`_vp_sigmoid`), and so do two sigmoids
(:func:`_vp_two`: Kaufman's Gauss-Newton matrix, the Schur complement of the full J^T J in its
amplitude block, plus the residual terms it leaves out). Where the exact Hessian is not
positive definite, Kaufman's matrix stands in.

Start values (:func:`grid_start_block`, :func:`two_start_block`; numpy references in
:mod:`tokdyn.fit.grid`): the event of the row's own grid over (mu, s) that explains most of
it, and the best single step (a second try where it fits about as well); for two sigmoids the
best pair of grid events or the sigmoid fit plus the event that best explains its residuals.
All scored in closed form, from the row's observed points only. A grid's events are evaluated
once per chunk of rows and kept while the next row has the same grid (fully observed rows
all do).

The returned parameters and J^T J are those of the full models in the solver's
parameterisation (l0, linf, mu, ln s) and (linf, d1, mu1, ln s1, d2, mu2, ln s2), so standard
errors follow as with the full-parameter solver of the numpy and torch backends
(:mod:`tokdyn.fit.lm`).
"""

from __future__ import annotations

import math

import numpy as np

from tokdyn._jit import njit
from tokdyn.fit.grid import TWO_MIN_DET, TWO_MIN_VAR
from tokdyn.fit.lanes import LANES as _LANES
from tokdyn.fit.lanes import clip, lane_maxima, lane_sums, row_dots, rows_dots
from tokdyn.fit.lm import LM_CONVERGED, LM_FAILED, RADIUS_MAX, RADIUS_RHO
from tokdyn.fit.numba_kernels import (
    _JIT,
    _KERNEL,
    _cholesky_solve,
    _exp,
    _inverse_diagonal_row,
    _observed_points,
    _pivot,
    _sigmoid_columns,
    run_chunks,
)
from tokdyn.fit.sigmoid import Z_CLIP

__all__ = ["grid_start_block", "varpro_block", "two_start_block"]

# Scratch rows per trajectory: _vp_two keeps three short vectors of sums in the first three,
# its events' columns (z, g, h of each) in the next six.
_N_BUF = 9
# Outputs of one projected evaluation: sse, the amplitudes, gradient [P], step matrix [P, P], and
# (two sigmoids) the two matrices it is chosen from with their scratch, and what its second
# pass takes from the first, at _PROJ (see _vp_two).
_OUT_SIZE = 86
_PROJ = 78
# What an accepted step carries over: sse, amplitudes, gradient, step matrix and the sigmoid's sums.
_OUT_KEPT = 24
# Least factor by which a successful step shrinks the damping (Nielsen's rule uses 1/3: with
# an exact Hessian that damping, not the model, then limits the convergence rate; measured
# on 20,000 planted events with the half-cell trust region: 4.91 steps with 1/3, 4.90 with
# 0.1, and fewer slow tails).
SHRINK_MIN = 0.1


# ---------------------------------------------------------------------------------------------
# Gathering a row


def _value_terms(y):
    return (y,)


def _centre_terms(y, mean):
    v = y - mean
    return (v, v * v)


# The gather's two sums in vector lanes: as scalar chains (two of n dependent additions)
# they were most of its time; with them, and plain copies for a fully observed row, a row of
# 100 points gathers in 0.07-0.09 us instead of 0.24 (one thread; every compiled stage gathers
# each row it fits once more).
_total = lane_sums(_value_terms, 1, 0)
_centre = lane_sums(_centre_terms, 1, 1, n_outputs=1)


@njit(inline="always", **_JIT)
def _gather(x, Y, b, xo, yc, idx):
    """Observed points of row b into xo, yc (centred: y - mean) and idx; return (n, mean, Syy).

    The mean and Syy are lane sums (:mod:`tokdyn.fit.lanes`): a fixed order, so a row's
    values do not depend on where it is gathered from."""
    n = _observed_points(x, Y, b, xo, yc, idx)
    (sy,) = _total(yc, n)
    mean = sy / max(n, 1)
    (syy,) = _centre(yc, yc, mean, n)  # yc centred in place: each block is read, then written
    return n, mean, syy


# ---------------------------------------------------------------------------------------------
# Start values on each row's grid

# Grid slots per chunk of rows: 0 for fully observed rows (they all share one grid), 1 for
# the last other grid seen.
_FULL, _OTHER = 0, 1


@njit(inline="always", **_JIT)
def _use_grid(x, mus, ss, b, slot, keys, mu_q, s_q, G, GT):
    """Make ``slot`` hold row b's grid, axes mus[b] [n_mu] and ss[b] [n_s] (mus [B, n_mu], ss
    [B, n_s]); return True where it had to be evaluated (keys start NaN, which equals
    nothing). The keys are compared in place: a view of the row per call (reference counted)
    cost more than the comparisons."""
    n_mu = mus.shape[1]
    same = True
    for i in range(n_mu):
        same = same and keys[slot, i] == mus[b, i]
    for j in range(ss.shape[1]):
        same = same and keys[slot, n_mu + j] == ss[b, j]
    if same:
        return False
    _evaluate_grid(x, mus[b], ss[b], slot, keys, mu_q, s_q, G, GT)
    return True


@njit(inline="always", **_JIT)
def _grid_slots(K, mus, ss):
    """Empty slots for :func:`_use_grid` over K points (mus [B, n_mu], ss [B, n_s]): keys
    [2, n_mu + n_s] (NaN: no grid yet), mu_q and s_q [2, Q], G [2, Q, K], GT [2, K, Q]."""
    Q = mus.shape[1] * ss.shape[1]
    return (np.full((2, mus.shape[1] + ss.shape[1]), np.nan), np.empty((2, Q)),
            np.empty((2, Q)), np.empty((2, Q, K)), np.empty((2, K, Q)))


# Rows per batch of the start grids: a batch of fully observed rows on one grid is projected
# onto it at once (lanes.rows_dots reads the grid's events once per four rows; row by row,
# reading them bounded the projections). Other rows are projected one by one.
_BATCH = 16


@njit(inline="always", **_JIT)
def _gather_batch(x, Y, b0, m, mus, ss, XO, YC, IDX, stats):
    """Rows b0 .. b0 + m - 1 gathered (:func:`_gather`) into XO, YC, IDX [_BATCH, K] and
    stats [_BATCH, 3] (n, mean, Syy); returns whether they can be projected together: the
    same observed points (at least 2) in each, every point or the same ones missing (a
    checkpoint lost for every token), and one grid (mus [B, n_mu], ss [B, n_s]) for all."""
    K = x.shape[0]
    together = True
    for j in range(m):
        n, mean, syy = _gather(x, Y, b0 + j, XO[j], YC[j], IDX[j])
        stats[j, 0] = n
        stats[j, 1] = mean
        stats[j, 2] = syy
        together = together and n == stats[0, 0]
    n0 = int(stats[0, 0])
    together = together and n0 >= 2
    for j in range(1, m if together and n0 < K else 0):  # (every point: the same columns)
        for k in range(n0):
            together = together and IDX[j, k] == IDX[0, k]
    for j in range(1, m if together else 0):
        for i in range(mus.shape[1]):
            together = together and mus[b0 + j, i] == mus[b0, i]
        for i in range(ss.shape[1]):
            together = together and ss[b0 + j, i] == ss[b0, i]
    return together


@njit(inline="always", **_JIT)
def _batch_scratch(K):
    """Empty XO, YC, IDX [_BATCH, K] and stats [_BATCH, 3] for :func:`_gather_batch`."""
    return (np.empty((_BATCH, K)), np.empty((_BATCH, K)), np.empty((_BATCH, K), dtype=np.int64),
            np.empty((_BATCH, 3)))


@njit(**_KERNEL)
def _evaluate_grid(x, mus, ss, slot, keys, mu_q, s_q, G, GT):
    """Evaluate the grid with axes mus [n_mu], ss [n_s] (mu-major events) into ``slot``: keys
    [2, n_mu + n_s], mu_q and s_q [2, Q], G [2, Q, K] = sigma(-(x - mu)/s) and its point-major
    copy GT [2, K, Q]."""
    n_mu = mus.shape[0]
    n_s = ss.shape[0]
    K = x.shape[0]
    for i in range(n_mu):
        keys[slot, i] = mus[i]
        for j in range(n_s):
            q = i * n_s + j
            mu_q[slot, q] = mus[i]
            s_q[slot, q] = ss[j]
            Gq = G[slot, q]
            for k in range(K):
                Gq[k] = min(max((x[k] - mus[i]) / ss[j], -Z_CLIP), Z_CLIP)
            for k in range(K):
                Gq[k] = 1.0 / (1.0 + _exp(Gq[k]))
                GT[slot, k, q] = Gq[k]
    for j in range(n_s):
        keys[slot, n_mu + j] = ss[j]


# A row's covariances with every grid event are summed point-major, each event's sum a plain
# chain over the row's points in order (:func:`tokdyn.fit.lanes.row_dots` keeps forty events'
# chains in vector registers and reads each point's events once). A fully observed row and
# the same row gathered from a block with missing columns add the same values in the same
# order: the same bits.


@njit(inline="always", **_JIT)
def _grid_moments(GT, n_points, s1, s2):
    """s1 [Q] = sum g, s2 [Q] = sum g^2 of every grid event over the grid's n_points points."""
    Q = GT.shape[1]
    for q in range(Q):
        s1[q] = 0.0
        s2[q] = 0.0
    for k in range(n_points):
        row = GT[k]
        for q in range(Q):
            g = row[q]
            s1[q] += g
            s2[q] += g * g


@njit(inline="always", **_JIT)
def _grid_dots(GT, idx, v, n, c):
    """c [Q] = sum g v of every grid event over the row's n points (v [n] at its points: the
    centred data, or a column; idx [n] says which: for a fully observed row, 0 .. K - 1)."""
    row_dots(GT, idx, v, n, c, None, None)


@njit(inline="always", **_JIT)
def _grid_projections(GT, idx, v, n, full, c, s1, s2):
    """:func:`_grid_dots`, and for a gathered row (not ``full``) also s1 [Q] = sum g and s2 [Q]
    = sum g^2 over its points (a fully observed row takes those from :func:`_grid_moments`)."""
    if full:
        _grid_dots(GT, idx, v, n, c)
    else:
        row_dots(GT, idx, v, n, c, s1, s2)


@njit(inline="always", **_JIT)
def _inverse_variance(s1, s2, n):
    """1 / var(g) over n points from sum g and sum g^2 (0 where g is about constant)."""
    var = s2 - s1 * s1 / n
    return 1.0 / var if var > 1e-12 * n else 0.0


@njit(**_KERNEL)
def _grid_inverse_variances(GT, inv_var, s1, s2):
    """inv_var [Q] of each grid event over all K points (s1, s2 [Q]: scratch), summed as
    _grid_projections sums a gathered row's (so a fully observed row scores the same bits
    either way)."""
    K, Q = GT.shape
    _grid_moments(GT, K, s1, s2)
    for q in range(Q):
        inv_var[q] = _inverse_variance(s1[q], s2[q], K)


@njit(**_KERNEL)
def _grid_best(c, inv_var_full, s1, s2, n, full, lo_mu, hi_mu, lo_s, hi_s, mu_q, s_q):
    """Index of the grid sigmoid with the largest explained sum of squares (cov^2 / var) that
    lies inside the row's box, or -1; and that score. c [Q]: the row's projections onto the
    grid (:func:`_grid_projections`); the events' inverse variances are inv_var_full [Q] for
    a ``full`` row (every point observed), else from s1, s2 [Q], its n points' sums of g and
    g^2."""
    Q = c.shape[0]
    best = -1
    best_score = -1.0
    for q in range(Q):
        if mu_q[q] < lo_mu or mu_q[q] > hi_mu or s_q[q] < lo_s or s_q[q] > hi_s:
            continue
        inv_var = inv_var_full[q] if full else _inverse_variance(s1[q], s2[q], n)
        score = c[q] * c[q] * inv_var
        if score > best_score:
            best_score = score
            best = q
    return best, best_score


def grid_start_block(x, Y, lo, hi, mus, ss):
    """Start values from each row's grid (mus [B, n_mu], ss [B, n_s] of
    :func:`tokdyn.fit.grid.row_grids`) and from the best step, as
    :func:`tokdyn.fit.grid.grid_start`.

    Returns (p0 [B, 4], p_step [B, 4], sse_step [B]); see there.
    """
    B = Y.shape[0]
    p0 = np.full((B, 4), np.nan)
    p_step = np.full((B, 4), np.nan)
    sse_step = np.full(B, np.nan)
    run_chunks(_grid_start_chunk, B, x, Y, lo, hi, np.ascontiguousarray(mus),
               np.ascontiguousarray(ss), p0, p_step, sse_step)
    return p0, p_step, sse_step


@njit(**_JIT)
def _grid_start_chunk(x, Y, lo, hi, mus, ss, p0, p_step, sse_step, first, last):
    """Rows first .. last - 1 of :func:`grid_start_block`, into p0, p_step, sse_step."""
    K = Y.shape[1]
    Q = mus.shape[1] * ss.shape[1]
    every = np.arange(K)
    XO, YC, IDX, stats = _batch_scratch(K)
    keys, mu_q, s_q, G, GT = _grid_slots(K, mus, ss)
    inv_var_full = np.empty(Q)
    CB = np.empty((_BATCH, Q))
    s1b = np.empty(Q)
    s2b = np.empty(Q)
    s1_full = np.empty(Q)  # the full grid's sums of g and g^2 over every point
    s2_full = np.empty(Q)
    for b0 in range(first, last, _BATCH):
        m = min(_BATCH, last - b0)
        together = _gather_batch(x, Y, b0, m, mus, ss, XO, YC, IDX, stats)
        n0 = int(stats[0, 0])
        if together and n0 == K:  # one grid, every point: all the rows' projections at once
            if _use_grid(x, mus, ss, b0, _FULL, keys, mu_q, s_q, G, GT):
                _grid_inverse_variances(GT[_FULL], inv_var_full, s1_full, s2_full)
            rows_dots(GT[_FULL], every, YC, m, K, CB)
        elif together:  # one grid, the same points missing from each: the events' sums
            # over those points once (the first row's, as row by row), then all at once
            _use_grid(x, mus, ss, b0, _OTHER, keys, mu_q, s_q, G, GT)
            row_dots(GT[_OTHER], IDX[0], YC[0], n0, CB[0], s1b, s2b)
            rows_dots(GT[_OTHER], IDX[0], YC, m, n0, CB)
        for j in range(m):
            b = b0 + j
            n = int(stats[j, 0])
            if n < 2:
                continue
            mean, syy = stats[j, 1], stats[j, 2]
            xo, yc, idx = XO[j], YC[j], IDX[j]
            # the best step between two neighbouring points (the limit s -> 0), by prefix
            # sums
            s1 = 0.0
            best_e = -1.0
            jb = 0
            for i in range(n - 1):
                s1 += yc[i]
                n1 = i + 1.0
                e = s1 * s1 * n / (n1 * (n - n1))
                if e > best_e:
                    best_e = e
                    jb = i
            head = 0.0
            for i in range(jb + 1):
                head += yc[i]
            gap = xo[jb + 1] - xo[jb]
            p_step[b, 0] = mean + head / (jb + 1.0)
            p_step[b, 1] = mean - head / (n - jb - 1.0)
            p_step[b, 2] = 0.5 * (xo[jb] + xo[jb + 1])
            p_step[b, 3] = min(max(0.1 * gap, lo[b, 3]), hi[b, 3])
            sse_step[b] = syy - best_e
            full = n == K
            slot = _FULL if full else _OTHER
            if not together:
                if _use_grid(x, mus, ss, b, slot, keys, mu_q, s_q, G, GT) and full:
                    _grid_inverse_variances(GT[_FULL], inv_var_full, s1_full, s2_full)
                _grid_projections(GT[slot], idx, yc, n, full, CB[j], s1b, s2b)
            q, _ = _grid_best(CB[j], inv_var_full, s1b, s2b, n, full, lo[b, 2], hi[b, 2],
                              lo[b, 3], hi[b, 3], mu_q[slot], s_q[slot])
            if q < 0:
                continue
            # amplitudes of that event: d = cov / var, linf = mean - d mean(g), from its
            # projection and sums of g and g^2 over the row's points (each a chain over
            # them in order: what summing them again gave, to the bit, at 0.1 us a row)
            cv = CB[j, q]
            s1, s2 = (s1_full[q], s2_full[q]) if full else (s1b[q], s2b[q])
            var = s2 - s1 * s1 / n
            d = cv / var if var > 0 else 0.0
            linf = mean - d * s1 / n
            p0[b, 0] = linf + d
            p0[b, 1] = linf
            p0[b, 2] = mu_q[slot, q]
            p0[b, 3] = s_q[slot, q]


# ---------------------------------------------------------------------------------------------
# Projected evaluations


@njit(inline="always", **_JIT)
def _projected_terms(c, c_0, c_1, c_00, c_01, c_11, v, v_0, v_1, v_00, v_01, v_11, syy,
                     q00, q01, q11, w0, w1):
    """F = syy - c^2 / v of one amplitude (d = c / v) with its gradient and matrix in (mu, ln s).

    c, v and their first (c_i, v_i) and second (c_ij, v_ij) derivatives come from the one
    pass of sums; q_ij and w_i = v_i / 2 give Kaufman's Gauss-Newton matrix d^2 (q - w w^T / v),
    which stands in where the exact Hessian is not positive definite.
    Returns (F, d, g0, g1, m00, m01, m11): gradient and matrix of F/2.
    """
    inv_v = 1.0 / v
    d = c * inv_v
    sse = max(syy - d * c, 0.0)
    g0 = -d * c_0 + 0.5 * d * d * v_0
    g1 = -d * c_1 + 0.5 * d * d * v_1
    # Hessian of F/2: -(c_i c_j + c c_ij)/v + (c c_i v_j + c c_j v_i)/v^2 + c^2 v_ij/(2 v^2)
    #                 - c^2 v_i v_j / v^3
    d2 = d * d
    h00 = (-(c_0 * c_0 + c * c_00) * inv_v + 2.0 * d * c_0 * v_0 * inv_v + 0.5 * d2 * v_00
           - d2 * v_0 * v_0 * inv_v)
    h01 = (-(c_0 * c_1 + c * c_01) * inv_v + d * (c_0 * v_1 + c_1 * v_0) * inv_v
           + 0.5 * d2 * v_01 - d2 * v_0 * v_1 * inv_v)
    h11 = (-(c_1 * c_1 + c * c_11) * inv_v + 2.0 * d * c_1 * v_1 * inv_v + 0.5 * d2 * v_11
           - d2 * v_1 * v_1 * inv_v)
    if not (h00 > 0 and h11 > 0 and h00 * h11 - h01 * h01 > 1e-12 * h00 * h11):
        h00 = d2 * (q00 - w0 * w0 * inv_v)
        h01 = d2 * (q01 - w0 * w1 * inv_v)
        h11 = d2 * (q11 - w1 * w1 * inv_v)
    return sse, d, g0, g1, h00, h01, h11


def _event(x, mu, inv_s):
    """One event at the points x: z = (x - mu)/s clipped, g = sigma(-z) and h = 1 - g, by the
    formula of :func:`tokdyn.fit.numba_kernels._sigmoid_columns` (in lanes the exponential's
    Horner steps are fused multiply-adds, so the two differ in the last bits)."""
    z = clip((x - mu) * inv_s, -Z_CLIP, Z_CLIP)
    e = _exp.py_func(z)
    g = 1.0 / (1.0 + e)
    return z, g, e * g


def _sigmoid_terms(x, y, mu, inv_s, inv_s2):
    """What :func:`_vp_sigmoid` sums over the points: g, its derivatives in mu and ln s (a, b)
    and its second derivatives (mm, mt, tt), their products with g, with each other and with
    the centred data y."""
    z, g, h = _event(x, mu, inv_s)
    u = g * h
    a = u * inv_s  # dg/dmu
    b = u * z  # dg/dln s
    zw1 = z * (h - g) - 1.0
    mm = u * (h - g) * inv_s2  # second derivatives of g
    mt = a * zw1
    tt = b * zw1
    return (g, g * g, g * y, a, b, g * a, g * b, a * a, a * b, b * b, a * y, b * y,
            mm, mt, tt, g * mm, g * mt, g * tt, mm * y, mt * y, tt * y)


# four blocks of points a step: one evaluation, one thread, 259 -> 204-215 ns at 100 points,
# 422 -> 331-339 ns at 200 (the two-sigmoid passes gained nothing measurable from four)
_sigmoid_sums = lane_sums(_sigmoid_terms, 2, 3, unroll=4)


@njit(**_KERNEL)
def _vp_sigmoid(xo, yc, n, syy, th, buf, out, floor=-math.inf, mean=0.0):
    """Projected fit of l = linf + d g at th = (mu, ln s) to the centred data yc.

    The projected sum of squares is F = Syy - c^2 / v with c = sum g y and v = sum g^2 -
    (sum g)^2 / n, so its exact gradient and Hessian follow from sums of g and of its first
    and second derivatives in (mu, ln s): one pass, and Newton's quadratic convergence near
    the optimum (Gauss-Newton's is only linear when residuals are not small: 6.6 steps
    against ~4 on planted events). Where that Hessian is not positive definite (far from a
    minimum) Kaufman's Gauss-Newton matrix stands in.

    Levels at or above ``floor`` (the data's mean is ``mean``; -inf: unbounded): where the
    least-squares levels break it, the amplitudes are those of the best feasible active set
    (linf = floor with d free, l0 = floor with linf free, or both), each again one amplitude
    in closed form from the same sums (a convex problem in the amplitudes: the best feasible
    candidate is its optimum, and F stays continuous in th).

    out: [0] F, [1] linf - mean, [2] d, [3:5] gradient F/2, [7:11] 2x2 matrix (Hessian of
    F/2 or its Gauss-Newton stand-in), [11:20] sums for the full J^T J at the end.
    Returns F (inf where the basis is degenerate).
    """
    mu, inv_s = th[0], math.exp(-th[1])
    (sg, sgg, sgy, sa, sb, sga, sgb, saa, sab, sbb, say, sby, smm, smt, stt, sgmm, sgmt, sgtt,
     smmy, smty, stty) = _sigmoid_sums(xo, yc, mu, inv_s, inv_s * inv_s, n)
    nf = float(n)
    v = sgg - sg * sg / nf
    if not v > 1e-12 * nf:
        out[0] = math.inf
        return math.inf
    w0 = sga - sg * sa / nf  # v_i / 2
    w1 = sgb - sg * sb / nf
    sse, d, g0, g1, h00, h01, h11 = _projected_terms(
        sgy, say, sby, smmy, smty, stty, v, 2.0 * w0, 2.0 * w1,
        2.0 * (saa + sgmm - (sa * sa + sg * smm) / nf),
        2.0 * (sab + sgmt - (sa * sb + sg * smt) / nf),
        2.0 * (sbb + sgtt - (sb * sb + sg * stt) / nf), syy,
        saa - sa * sa / nf, sab - sa * sb / nf, sbb - sb * sb / nf, w0, w1)
    lin = -d * sg / nf  # linf - mean
    if mean + lin < floor or mean + lin + d < floor:
        # the active sets; m: the data's mean above the floor
        m = mean - floor
        syy_f = syy + nf * m * m
        best = math.inf
        if sgg > 1e-12 * nf:  # linf = floor, l = floor + d g
            r = _projected_terms(
                sgy + m * sg, say + m * sa, sby + m * sb, smmy + m * smm, smty + m * smt,
                stty + m * stt, sgg, 2.0 * sga, 2.0 * sgb, 2.0 * (saa + sgmm),
                2.0 * (sab + sgmt), 2.0 * (sbb + sgtt), syy_f, saa, sab, sbb, sga, sgb)
            if r[1] >= 0.0:
                best = r[0]
                sse, d, g0, g1, h00, h01, h11 = r
                lin = -m
        vh = nf - 2.0 * sg + sgg  # sum (1 - g)^2
        if vh > 1e-12 * nf:  # l0 = floor, l = floor + e (1 - g), d = -e
            r = _projected_terms(
                nf * m - sgy - m * sg, -(say + m * sa), -(sby + m * sb), -(smmy + m * smm),
                -(smty + m * smt), -(stty + m * stt), vh, 2.0 * (sga - sa), 2.0 * (sgb - sb),
                2.0 * (saa + sgmm - smm), 2.0 * (sab + sgmt - smt), 2.0 * (sbb + sgtt - stt),
                syy_f, saa, sab, sbb, sga - sa, sgb - sb)
            if r[1] >= 0.0 and r[0] < best:
                best = r[0]
                sse, e, g0, g1, h00, h01, h11 = r
                d = -e
                lin = -m + e
        if best == math.inf:  # both: the loss stays at the floor
            sse, d, lin = syy_f, 0.0, -m
            g0 = g1 = h01 = 0.0
            h00 = h11 = 1.0
    out[0] = sse
    out[1] = lin
    out[2] = d
    out[3] = g0
    out[4] = g1
    out[7], out[8], out[9], out[10] = h00, h01, h01, h11
    out[11], out[12], out[13], out[14], out[15] = sg, sgg, sa, sb, sga
    out[16], out[17], out[18], out[19] = sgb, saa, sab, sbb
    return sse


@njit(inline="always", **_JIT)
def _sigmoid_normal_matrix(out, n, A):
    """Full J^T J [4, 4] in (l0, linf, mu, ln s) from the sums of the last evaluation:
    columns g, 1 - g, d dg/dmu, d dg/dln s."""
    d = out[2]
    sg, sgg, sa, sb, sga = out[11], out[12], out[13], out[14], out[15]
    sgb, saa, sab, sbb = out[16], out[17], out[18], out[19]
    A[0, 0] = sgg
    A[0, 1] = sg - sgg
    A[1, 1] = n - 2.0 * sg + sgg
    A[0, 2] = d * sga
    A[0, 3] = d * sgb
    A[1, 2] = d * (sa - sga)
    A[1, 3] = d * (sb - sgb)
    A[2, 2] = d * d * saa
    A[2, 3] = d * d * sab
    A[3, 3] = d * d * sbb
    for i in range(4):
        for j in range(i):
            A[i, j] = A[j, i]


@njit(inline="always", **_JIT)
def _free_solve(fix0, fix1, fix2, a0, a1, a2, nf, sg1, sg2, u11, u12, u22, y1, y2, syy):
    """One active set of the amplitude box: amplitudes flagged fixed keep their value (a0 the
    constant, a1 and a2 the drops), the free ones solve the least squares problem that is
    left. Returns (ok, sse, c0, d1, d2); ok False where the free block is singular."""
    # the data less the fixed columns: its sum and its products with g1, g2
    ty = -(a0 * nf if fix0 else 0.0)
    t1 = y1 - (a0 * sg1 if fix0 else 0.0)
    t2 = y2 - (a0 * sg2 if fix0 else 0.0)
    tt = syy + (nf * a0 * a0 if fix0 else 0.0)
    if fix1:
        ty -= a1 * sg1
        t1 -= a1 * u11
        t2 -= a1 * u12
        tt += a1 * a1 * u11 + 2.0 * a1 * ((a0 * sg1 if fix0 else 0.0) - y1)
    if fix2:
        ty -= a2 * sg2
        t1 -= a2 * u12
        t2 -= a2 * u22
        tt += a2 * a2 * u22 + 2.0 * a2 * ((a0 * sg2 if fix0 else 0.0) - y2)
        if fix1:
            tt += 2.0 * a1 * a2 * u12
    inv_n = 0.0 if fix0 else 1.0 / nf
    v11 = u11 - sg1 * sg1 * inv_n
    v12 = u12 - sg1 * sg2 * inv_n
    v22 = u22 - sg2 * sg2 * inv_n
    c1 = t1 - sg1 * ty * inv_n
    c2 = t2 - sg2 * ty * inv_n
    sse = tt - ty * ty * inv_n
    d1, d2 = a1, a2
    if not fix1 and not fix2:
        det = v11 * v22 - v12 * v12
        if not (det > 1e-14 * v11 * v22 and v11 > 0.0 and v22 > 0.0):
            return False, math.inf, 0.0, 0.0, 0.0
        d1 = (v22 * c1 - v12 * c2) / det
        d2 = (v11 * c2 - v12 * c1) / det
        sse -= d1 * c1 + d2 * c2
    elif not fix1:
        if not v11 > 0.0:
            return False, math.inf, 0.0, 0.0, 0.0
        d1 = c1 / v11
        sse -= d1 * c1
    elif not fix2:
        if not v22 > 0.0:
            return False, math.inf, 0.0, 0.0, 0.0
        d2 = c2 / v22
        sse -= d2 * c2
    c0 = a0
    if not fix0:
        c0 = (ty - (0.0 if fix1 else d1 * sg1) - (0.0 if fix2 else d2 * sg2)) / nf
    return True, max(sse, 0.0), c0, d1, d2


@njit(inline="always", **_JIT)
def _inside(v, lo, hi):
    tol = 1e-9 * (1.0 + abs(v))
    return lo - tol <= v <= hi + tol


def _two_terms(x, y, mu1, inv_s1, mu2, inv_s2):
    """What :func:`_two_value` sums over the points to solve the amplitudes: each event's g,
    with their products (sum g, sum g g', sum g y). The events' columns (z, g, h of each) are
    written out for :func:`_derivative_terms`."""
    z1, g1, h1 = _event(x, mu1, inv_s1)
    z2, g2, h2 = _event(x, mu2, inv_s2)
    return ((z1, g1, h1, z2, g2, h2)
            + (g1, g2, g1 * g1, g1 * g2, g2 * g2, g1 * y, g2 * y))


_two_sums = lane_sums(_two_terms, 2, 4, n_outputs=6)


def _derivative_terms(z1, g1, h1, z2, g2, h2, y, inv_s1, inv_s2, c0, d1, d2):
    """What :func:`_two_steps` sums over the points, from the events' columns that
    :func:`_two_terms` wrote: the derivative columns c = (a1, b1, a2, b2) of g in (mu, ln s)
    with their products (sum c_j, sum g1 c_j, sum g2 c_j, sum c_j y; sum c_i c_j, i >= j),
    then sum q, sum q z, sum q z^2 of each event, q = r g h (h - g) with r the residuals of the
    two-sigmoid model at the amplitudes (c0, d1, d2): the exact Hessian's second-derivative
    terms."""
    u1 = g1 * h1
    u2 = g2 * h2
    c = (u1 * inv_s1, u1 * z1, u2 * inv_s2, u2 * z2)
    r = y - c0 - d1 * g1 - d2 * g2
    q1 = r * g1 * h1 * (h1 - g1)
    q2 = r * g2 * h2 * (h2 - g2)
    return (c + tuple(g1 * cj for cj in c) + tuple(g2 * cj for cj in c)
            + tuple(cj * y for cj in c)
            + tuple(c[i] * c[j] for i in range(4) for j in range(i + 1))
            + (q1, q1 * z1, q1 * z1 * z1, q2, q2 * z2, q2 * z2 * z2))


_derivative_sums = lane_sums(_derivative_terms, 7, 5)


@njit(**_KERNEL)
def _vp_two(xo, yc, n, syy, th, buf, out, bnd, mean=0.0):
    """Projected fit of l = linf + d1 g1 + d2 g2 at th = (mu1, ln s1, mu2, ln s2).

    The amplitudes solve a box-constrained least squares problem: the final level linf stays
    at or above ``bnd[0]`` (the data's mean is ``mean``), each drop d_k within
    [bnd[2k-1], bnd[2k]]. Where the unconstrained solution leaves the box, every active set
    (each amplitude free or on one of its bounds) is solved and the best one inside the box
    kept: the problem is convex, so that is its optimum. The gradient (envelope theorem) and
    Kaufman's matrix then hold the fixed amplitudes as constants and project out the free
    columns only.

    The step matrix is the exact Hessian of the projected SSE (halved) where it is positive
    definite, else Kaufman's matrix: with r the residuals and c_j the derivative columns of
    g (unscaled), the exact one adds to Kaufman's the residuals' products with each event's
    second derivatives and the terms r.c_j in the amplitudes' cross block (Golub and Pereyra's
    full Jacobian of the projection). On planted single events it cut the mean steps from
    14.7 to 11.2 and the rows that run out of steps from 0.56 % to 0.19 %; on a tiny GPT's
    probe tokens 1.4 % to 0.1 % (the sum of squares lower in total on both).

    Two passes over the points: :func:`_two_value` (the exponentials, the amplitudes and the
    sum of squares: all a trial step needs to be judged), then :func:`_two_steps` (the
    gradient and both matrices, from the events' columns the first pass wrote to ``buf``).
    The solver runs the second only where it takes the step (:func:`_vp_lm`).

    out: [0] SSE, [1] linf - mean, [2:4] (d1, d2), [4:8] gradient J^T r, [8:24] the 4x4
    step matrix, [24:40] Kaufman's matrix, [40:56] the exact Hessian, [56:62] the residuals'
    second-derivative products, [62:78] scratch, [78:86] what the second pass takes from the
    first (the events' sums, the free amplitudes' projection, the inverse widths). Returns the
    SSE (inf where the basis is degenerate; then ``out`` holds nothing else).
    """
    sse = _two_value(xo, yc, n, syy, th, buf, out, bnd, mean)
    if math.isfinite(sse):
        _two_steps(yc, n, buf, out)
    return sse


@njit(**_KERNEL)
def _two_value(xo, yc, n, syy, th, buf, out, bnd, mean):
    """:func:`_vp_two`'s first pass: the amplitudes and the sum of squares at th, into
    out[0:4]; the events' columns (z, g, h of each) into buf[3:9] and what the second pass
    needs of the amplitudes' solve into out[78:86]. Returns the SSE."""
    inv_s1, inv_s2 = math.exp(-th[1]), math.exp(-th[3])
    sg1, sg2, u11, u12, u22, y1, y2 = _two_sums(
        xo, yc, buf[3], buf[4], buf[5], buf[6], buf[7], buf[8], th[0], inv_s1, th[2], inv_s2, n)
    nf = float(n)
    lb0 = bnd[0] - mean
    # the unconstrained amplitudes (a tiny ridge keeps the 2x2 solve finite when the two
    # events coincide); a degenerate basis is no answer. inv_n = 1/n projects out the free
    # constant; i11, i12, i22 invert the free drops' block, for Kaufman's matrix too.
    inv_n = 1.0 / nf
    v11 = u11 - sg1 * sg1 * inv_n
    v12 = u12 - sg1 * sg2 * inv_n
    v22 = u22 - sg2 * sg2 * inv_n
    ridge = 1e-12 * (v11 + v22) + 1e-300
    v11 += ridge
    v22 += ridge
    det = v11 * v22 - v12 * v12
    if not (det > 1e-14 * v11 * v22 and v11 > 1e-12 * nf and v22 > 1e-12 * nf):
        out[0] = math.inf
        return math.inf
    i11, i12, i22 = v22 / det, -v12 / det, v11 / det
    d1 = i11 * y1 + i12 * y2
    d2 = i12 * y1 + i22 * y2
    c0 = -(d1 * sg1 + d2 * sg2) * inv_n
    sse = max(syy - d1 * y1 - d2 * y2, 0.0)
    if not (c0 >= lb0 and _inside(d1, bnd[1], bnd[2]) and _inside(d2, bnd[3], bnd[4])):
        # every active set: 0 free, 1 on the lower bound, 2 on the upper (linf has none)
        sse = math.inf
        fix0 = fix1 = fix2 = False
        for state in range(18):
            k0, k1, k2 = state % 2, (state // 2) % 3, state // 6
            if k0 + k1 + k2 == 0:
                continue
            f1 = bnd[1] if k1 == 1 else bnd[2]
            f2 = bnd[3] if k2 == 1 else bnd[4]
            if ((k0 > 0 and not math.isfinite(lb0)) or (k1 > 0 and not math.isfinite(f1))
                    or (k2 > 0 and not math.isfinite(f2))):
                continue
            ok, s_c, e0, e1, e2 = _free_solve(k0 > 0, k1 > 0, k2 > 0, lb0, f1, f2, nf, sg1,
                                              sg2, u11, u12, u22, y1, y2, syy)
            if not (ok and s_c < sse and e0 >= lb0 - 1e-9 * (1.0 + abs(lb0))
                    and _inside(e1, bnd[1], bnd[2]) and _inside(e2, bnd[3], bnd[4])):
                continue
            sse, c0 = s_c, max(e0, lb0)
            d1, d2 = min(max(e1, bnd[1]), bnd[2]), min(max(e2, bnd[3]), bnd[4])
            fix0, fix1, fix2 = k0 > 0, k1 > 0, k2 > 0
        if not math.isfinite(sse):
            out[0] = math.inf
            return math.inf
        # Kaufman's matrix projects the derivative columns off the free amplitude columns only
        inv_n = 0.0 if fix0 else 1.0 / nf
        v11 = u11 - sg1 * sg1 * inv_n
        v12 = u12 - sg1 * sg2 * inv_n
        v22 = u22 - sg2 * sg2 * inv_n
        if not fix1 and not fix2:
            ridge = 1e-12 * (v11 + v22) + 1e-300
            v11 += ridge
            v22 += ridge
            det = v11 * v22 - v12 * v12
            i11, i12, i22 = v22 / det, -v12 / det, v11 / det
        else:
            i11 = 0.0 if fix1 else 1.0 / v11
            i22 = 0.0 if fix2 else 1.0 / v22
            i12 = 0.0
    out[0] = sse
    out[1] = c0
    out[2] = d1
    out[3] = d2
    out[_PROJ], out[_PROJ + 1], out[_PROJ + 2] = sg1, sg2, inv_n
    out[_PROJ + 3], out[_PROJ + 4], out[_PROJ + 5] = i11, i12, i22
    out[_PROJ + 6], out[_PROJ + 7] = inv_s1, inv_s2
    return sse


@njit(**_KERNEL)
def _two_steps(yc, n, buf, out):
    """:func:`_vp_two`'s second pass, at the buf and out of the first: the gradient,
    Kaufman's matrix, the exact Hessian and the step matrix chosen from them (out[4:78])."""
    inv_s1, inv_s2 = out[_PROJ + 6], out[_PROJ + 7]
    c0, d1, d2 = out[1], out[2], out[3]
    sg1, sg2, inv_n = out[_PROJ], out[_PROJ + 1], out[_PROJ + 2]
    i11, i12, i22 = out[_PROJ + 3], out[_PROJ + 4], out[_PROJ + 5]
    (sc0, sc1, sc2, sc3, s10, s11, s12, s13, s20, s21, s22, s23, cy0, cy1, cy2, cy3,
     cc00, cc10, cc11, cc20, cc21, cc22, cc30, cc31, cc32, cc33,
     q10, q11, q12, q20, q21, q22) = _derivative_sums(
        buf[3], buf[4], buf[5], buf[6], buf[7], buf[8], yc, inv_s1, inv_s2, c0, d1, d2, n)
    scale = (d1, d1, d2, d2)
    w1, w2, rc = buf[0], buf[1], buf[2]
    sc = (sc0, sc1, sc2, sc3)
    s1 = (s10, s11, s12, s13)
    s2 = (s20, s21, s22, s23)
    cy = (cy0, cy1, cy2, cy3)
    # the derivative columns' products c_i.c_j, j <= i, at i (i + 1) / 2 + j
    cc = (cc00, cc10, cc11, cc20, cc21, cc22, cc30, cc31, cc32, cc33)
    q = (q10, q11, q12, q20, q21, q22)
    for j in range(4):
        w1[j] = s1[j] - sg1 * sc[j] * inv_n
        w2[j] = s2[j] - sg2 * sc[j] * inv_n
        rc[j] = cy[j] - c0 * sc[j] - d1 * s1[j] - d2 * s2[j]  # r . c_j
        out[4 + j] = -scale[j] * rc[j]
    # The residuals' products with each event's second derivatives (mu mu, mu ln s, ln s ln s):
    # the exact Hessian's terms that Kaufman's matrix leaves out. With u = g h, q = r u (h - g):
    # r.g_mumu = q0 / s^2, r.g_mu,lns = (q1 - r.u) / s and r.g_lns,lns = q2 - r.(u z), where
    # qj = sum q z^j, r.u = s r.c_mu and r.(u z) = r.c_lns
    rq = 56  # out[56:62] (buf's rows may be as short as 5 points)
    for e in range(2):
        q0, q1, q2 = q[3 * e], q[3 * e + 1], q[3 * e + 2]
        inv_s = inv_s1 if e == 0 else inv_s2
        out[rq + 3 * e] = q0 * inv_s * inv_s
        out[rq + 3 * e + 1] = (q1 - rc[2 * e] / inv_s) * inv_s
        out[rq + 3 * e + 2] = q2 - rc[2 * e + 1]
    # Both matrices of F/2 over the free amplitudes' projection (W^-1 by the centred block
    # above): Kaufman's d_i d_j (c_i.c_j - Q(b_i, b_j)) with b_j = (1, g1, g2) . c_j, and the
    # exact Hessian d_i d_j c_i.c_j - R2_ij - Q(b'_i, b'_j), where b'_j = d_j b_j less r.c_j
    # in the component of c_j's own event and R2 holds d_e r.(second derivative of g_e)
    for i in range(4):
        ei = i // 2
        x1i = scale[i] * w1[i] - (rc[i] if ei == 0 else 0.0)
        x2i = scale[i] * w2[i] - (rc[i] if ei == 1 else 0.0)
        for j in range(i + 1):
            ej = j // 2
            x1j = scale[j] * w1[j] - (rc[j] if ej == 0 else 0.0)
            x2j = scale[j] * w2[j] - (rc[j] if ej == 1 else 0.0)
            cc_ij = scale[i] * scale[j] * cc[i * (i + 1) // 2 + j]
            qq = scale[i] * scale[j] * sc[i] * sc[j] * inv_n
            proj = (qq + scale[i] * scale[j] * (w1[i] * (i11 * w1[j] + i12 * w2[j])
                                               + w2[i] * (i12 * w1[j] + i22 * w2[j])))
            r2 = (scale[i] * out[rq + 3 * ei + (i % 2) + (j % 2)]) if ei == ej else 0.0
            exact = cc_ij - r2 - (qq + x1i * (i11 * x1j + i12 * x2j)
                                  + x2i * (i12 * x1j + i22 * x2j))
            out[40 + 4 * i + j] = exact
            out[40 + 4 * j + i] = exact
            out[24 + 4 * i + j] = cc_ij - proj
            out[24 + 4 * j + i] = cc_ij - proj
    # the exact Hessian where it is positive definite, else Kaufman's matrix
    src = 40 if _positive_definite4(out, 40, 62) else 24
    for j in range(16):
        out[8 + j] = out[src + j]


def _full_two_terms(x, y, linf, d1, mu1, inv_s1, d2, mu2, inv_s2):
    """The full two-sigmoid model's squared residuals, its Jacobian's columns in (linf, d1,
    mu1, ln s1, d2, mu2, ln s2) (the first is 1) and their products (i >= j >= 1), at the
    centred data y (linf centred too)."""
    z1, g1, h1 = _event(x, mu1, inv_s1)
    z2, g2, h2 = _event(x, mu2, inv_s2)
    t1 = d1 * g1 * h1
    t2 = d2 * g2 * h2
    cols = (g1, t1 * inv_s1, t1 * z1, g2, t2 * inv_s2, t2 * z2)
    r = linf + d1 * g1 + d2 * g2 - y
    return ((r * r,) + cols
            + tuple(cols[i] * cols[j] for i in range(6) for j in range(i + 1)))


_full_two_sums = lane_sums(_full_two_terms, 2, 7)


@njit(inline="always", **_JIT)
def _two_normal_matrix(xo, yc, n, mean, p, A):
    """Fill A [7, 7] = J^T J of the two-sigmoid model at p (linf, d1, mu1, ln s1, d2, mu2,
    ln s2) over a row's observed points (yc centred on ``mean``); return its sum of squares
    (direct, not projected)."""
    t = _full_two_sums(xo, yc, p[0] - mean, p[1], p[2], math.exp(-p[3]), p[4], p[5],
                       math.exp(-p[6]), n)
    A[0, 0] = n
    k = 7
    for a in range(6):
        A[0, a + 1] = A[a + 1, 0] = t[1 + a]
        for b in range(a + 1):
            A[a + 1, b + 1] = A[b + 1, a + 1] = t[k]
            k += 1
    return t[0]


@njit(inline="always", **_JIT)
def _positive_definite4(out, o, f):
    """Whether the symmetric 4x4 matrix at out[o:o + 16] is positive definite by a margin: each
    Cholesky pivot above 1e-12 of its diagonal entry (as _projected_terms' 2x2 test). The
    factor is worked out in out[f:f + 16]."""
    for j in range(4):
        d = out[o + 5 * j]
        if not d > 0.0:
            return False
        piv = d
        for k in range(j):
            piv -= out[f + 4 * j + k] ** 2
        if not piv > 1e-12 * d:
            return False
        ljj = math.sqrt(piv)
        out[f + 5 * j] = ljj
        for i in range(j + 1, 4):
            v = out[o + 4 * i + j]
            for k in range(j):
                v -= out[f + 4 * i + k] * out[f + 4 * j + k]
            out[f + 4 * i + j] = v / ljj
    return True


# Where the gradient and normal matrix sit in ``out`` for each model (P = 2 or 4).
@njit(inline="always", **_JIT)
def _layout(P):
    return (3, 7) if P == 2 else (4, 8)


@njit(**_KERNEL)
def _vp_eval(P, xo, yc, n, syy, th, buf, out, bnd, mean):
    if P == 2:
        return _vp_sigmoid(xo, yc, n, syy, th, buf, out, bnd[0], mean)
    return _vp_two(xo, yc, n, syy, th, buf, out, bnd, mean)


@njit(**_KERNEL)
def _vp_value(P, xo, yc, n, syy, th, buf, out, bnd, mean):
    """A trial point's evaluation, as much as judging the step needs: the sigmoid's whole
    (one pass), two sigmoids' first pass (:func:`_two_steps` completes it if the step is
    taken)."""
    if P == 2:
        return _vp_sigmoid(xo, yc, n, syy, th, buf, out, bnd[0], mean)
    return _two_value(xo, yc, n, syy, th, buf, out, bnd, mean)


# ---------------------------------------------------------------------------------------------
# The solver over the nonlinear parameters


@njit(inline="always", **_JIT)
def _converged(ok, better, sse, sse_t, syy, pred, rho, hn, pn, ftol, xtol):
    """MINPACK's tests after a trial step (see :func:`_vp_lm`): an accepted step that gained
    at most ftol and was predicted to, an exact fit, or a step shorter than xtol."""
    actred = sse - sse_t
    return ((better and actred <= ftol * sse and pred <= ftol * sse and rho <= 2.0)
            or (better and sse_t <= 1e-30 * syy)
            or (ok and math.sqrt(hn) <= xtol * (math.sqrt(pn) + xtol)))


@njit(inline="always", **_JIT)
def _damped(better, capped, rho, lam, nu, radius, shrink_min):
    """The damping lam, its growth factor nu and the trust region's radius after a trial step
    (Nielsen's rule; the region widens after a well-predicted step it cut short, up to
    RADIUS_MAX, and narrows back after a rejected one)."""
    if better:
        lam *= max(shrink_min, 1.0 - (2.0 * rho - 1.0) ** 3)
        nu = 2.0
        if capped and rho > RADIUS_RHO:
            radius = min(2.0 * radius, RADIUS_MAX)
    else:
        lam *= nu
        nu *= 2.0
        radius = max(1.0, 0.5 * radius)
    return lam, nu, radius


@njit(**_KERNEL)
def _vp_lm(P, xo, yc, n, syy, th, lo, hi, max_iter, ftol, xtol, buf, out, out_t, work, L3,
           step_max, shrink_min, bnd, mean):
    """Bounded LM over th [P] (mu, ln s pairs) on the projected SSE; the steps of tokdyn.fit.lm.
    Written once for any P, this is the reference: the fits run its copies with their
    state in scalars, :func:`_vp_lm2` (one sigmoid) and :func:`_vp_lm4` (two), which make
    the same operations in the same order (tests hold them equal to the bit).

    ``bnd``: the amplitudes' bounds (the least level, then each drop's low and high bound).
    A trial point is evaluated only as far as judging its step needs (:func:`_vp_value`),
    and completed where the step is taken and the solver goes on: 21-23 % of two-sigmoid
    steps are rejected, and the last step ends the fit. On return ``out`` holds the
    evaluation at the final th (two sigmoids: its sum of squares and amplitudes, out[0:4]);
    returns (sse, iterations, status).
    """
    gi, ni = _layout(P)
    D, h, rhs, th_t, fixed = work[0], work[1], work[2], work[3], work[4]
    M, L = L3[0], L3[1]
    for j in range(P):
        th[j] = min(max(th[j], lo[j]), hi[j])
    sse = _vp_eval(P, xo, yc, n, syy, th, buf, out, bnd, mean)
    if not math.isfinite(sse):
        return sse, 0, LM_FAILED
    for j in range(P):
        D[j] = abs(out[ni + P * j + j])
    lam = 1e-3
    nu = 2.0
    radius = 1.0  # the trust region in units of step_max (tokdyn.fit.lm.RADIUS_MAX)
    for it in range(max_iter):
        dmax = 0.0
        for j in range(P):
            D[j] = max(D[j], abs(out[ni + P * j + j]))
            dmax = max(dmax, D[j])
        d_floor = 1e-12 * dmax + 1e-300
        for j in range(P):
            gj = out[gi + j]
            fixed[j] = 1.0 if ((th[j] <= lo[j] and gj > 0) or (th[j] >= hi[j] and gj < 0)) else 0.0
        for a in range(P):
            for b in range(P):
                M[a, b] = 0.0 if (fixed[a] > 0 or fixed[b] > 0) else out[ni + P * a + b]
            M[a, a] = 1.0 if fixed[a] > 0 else M[a, a] + lam * max(D[a], d_floor)
            rhs[a] = 0.0 if fixed[a] > 0 else -out[gi + a]
        ok = _cholesky_solve(M, rhs, h, L)
        # Trust region of a grid cell: from the grid's best event the optimum is within
        # about one cell, and a longer Newton step is an extrapolation (measured: from the
        # grid start, uncapped steps were rejected 3-4 times in a row on 15 % of rows). It
        # widens to RADIUS_MAX half cells while the model predicts capped steps well, for an
        # optimum further away (tokdyn.fit.lm).
        scale = 1.0
        for j in range(P):
            if abs(h[j]) * scale > radius * step_max[j]:
                scale = radius * step_max[j] / abs(h[j])
        capped = scale < 1.0
        for j in range(P):
            h[j] *= scale
        hn = 0.0
        pn = 0.0
        for j in range(P):
            th_t[j] = min(max(th[j] + h[j], lo[j]), hi[j])
            h[j] = th_t[j] - th[j]
            hn += h[j] * h[j]
            pn += th[j] * th[j]
        pred = 0.0
        for a in range(P):
            v = 0.0
            for b in range(P):
                v += out[ni + P * a + b] * h[b]
            pred -= 2.0 * out[gi + a] * h[a] + h[a] * v
        # At the optimum to the tolerance already: a nearly undamped step predicts no more
        # than ftol (rounding in the projected sums may make its trial look like no gain), so
        # the step is neither evaluated nor taken. Not a step the trust region cut short: its
        # gain is small for being short (a two-sigmoid start whose second event sat between
        # two points had its Newton step cut to 1e-3 of itself, and stopped "converged" at
        # the start, at 4 times the optimum's sum of squares).
        if ok and not capped and lam <= 1.0 and 0.0 <= pred <= ftol * sse:
            return sse, it, LM_CONVERGED
        sse_t = _vp_value(P, xo, yc, n, syy, th_t, buf, out_t, bnd, mean)
        better = ok and math.isfinite(sse_t) and sse_t < sse
        rho = (sse - sse_t) / pred if pred > 0 else 0.0
        converged = _converged(ok, better, sse, sse_t, syy, pred, rho, hn, pn, ftol, xtol)
        if better:
            if P == 4 and not converged:  # the gradient and matrix for the next step
                _two_steps(yc, n, buf, out_t)
            sse = sse_t
            for j in range(P):
                th[j] = th_t[j]
            for j in range(_OUT_KEPT):  # the rest is the evaluation's scratch
                out[j] = out_t[j]
        lam, nu, radius = _damped(better, capped, rho, lam, nu, radius, shrink_min)
        if converged:
            return sse, it + 1, LM_CONVERGED
    return sse, max_iter, LM_FAILED


@njit(**_KERNEL)
def _vp_lm2(xo, yc, n, syy, th, lo, hi, max_iter, ftol, xtol, buf, out, out_t, step_max,
            shrink_min, floor, mean):
    """:func:`_vp_lm` for one sigmoid (P = 2), its state in scalars: the same operations in
    the same order (the same bits), without the P x P loops over scratch arrays: their
    loads, stores and generic Cholesky cost a fifth of the sigmoid solver's time (2.13 ->
    1.72 us a planted row of 100 points, one thread; docs/benchmarks.md). On return ``out``
    holds the evaluation at the final th."""
    lo0, lo1, hi0, hi1 = lo[0], lo[1], hi[0], hi[1]
    t0 = min(max(th[0], lo0), hi0)
    t1 = min(max(th[1], lo1), hi1)
    th[0], th[1] = t0, t1
    sse = _vp_sigmoid(xo, yc, n, syy, th, buf, out, floor, mean)
    if not math.isfinite(sse):
        return sse, 0, LM_FAILED
    D0, D1 = abs(out[7]), abs(out[10])
    cap0, cap1 = step_max[0], step_max[1]
    lam = 1e-3
    nu = 2.0
    radius = 1.0
    for it in range(max_iter):
        a00, a01, a10, a11 = out[7], out[8], out[9], out[10]
        g0, g1 = out[3], out[4]
        D0 = max(D0, abs(a00))
        D1 = max(D1, abs(a11))
        d_floor = 1e-12 * max(max(0.0, D0), D1) + 1e-300
        f0 = (t0 <= lo0 and g0 > 0) or (t0 >= hi0 and g0 < 0)
        f1 = (t1 <= lo1 and g1 > 0) or (t1 >= hi1 and g1 < 0)
        m00 = 1.0 if f0 else a00 + lam * max(D0, d_floor)
        m10 = 0.0 if (f0 or f1) else a10
        m11 = 1.0 if f1 else a11 + lam * max(D1, d_floor)
        r0 = 0.0 if f0 else -g0
        r1 = 0.0 if f1 else -g1
        # numba_kernels._cholesky_solve written out for P = 2
        l00, ok0 = _pivot(m00, m00)
        l10 = m10 / l00
        l11, ok1 = _pivot(m11 - l10 * l10, m11)
        ok = ok0 and ok1
        h0 = r0 / l00
        h1 = (r1 - l10 * h0) / l11
        h1 = h1 / l11
        h0 = (h0 - l10 * h1) / l00
        # the trust region (see _vp_lm)
        scale = 1.0
        if abs(h0) * scale > radius * cap0:
            scale = radius * cap0 / abs(h0)
        if abs(h1) * scale > radius * cap1:
            scale = radius * cap1 / abs(h1)
        capped = scale < 1.0
        h0 *= scale
        h1 *= scale
        u0 = min(max(t0 + h0, lo0), hi0)
        u1 = min(max(t1 + h1, lo1), hi1)
        h0 = u0 - t0
        h1 = u1 - t1
        hn = (0.0 + h0 * h0) + h1 * h1
        pn = (0.0 + t0 * t0) + t1 * t1
        v = (0.0 + a00 * h0) + a01 * h1
        pred = 0.0 - (2.0 * g0 * h0 + h0 * v)
        v = (0.0 + a10 * h0) + a11 * h1
        pred -= 2.0 * g1 * h1 + h1 * v
        if ok and not capped and lam <= 1.0 and 0.0 <= pred <= ftol * sse:
            return sse, it, LM_CONVERGED
        th[0], th[1] = u0, u1
        sse_t = _vp_sigmoid(xo, yc, n, syy, th, buf, out_t, floor, mean)
        better = ok and math.isfinite(sse_t) and sse_t < sse
        rho = (sse - sse_t) / pred if pred > 0 else 0.0
        converged = _converged(ok, better, sse, sse_t, syy, pred, rho, hn, pn, ftol, xtol)
        if better:
            sse = sse_t
            t0, t1 = u0, u1
            for j in range(_OUT_KEPT):
                out[j] = out_t[j]
        else:
            th[0], th[1] = t0, t1
        lam, nu, radius = _damped(better, capped, rho, lam, nu, radius, shrink_min)
        if converged:
            return sse, it + 1, LM_CONVERGED
    return sse, max_iter, LM_FAILED


@njit(**_KERNEL)
def _vp_lm4(xo, yc, n, syy, th, lo, hi, max_iter, ftol, xtol, buf, out, out_t, step_max,
            shrink_min, bnd, mean):
    """:func:`_vp_lm` for two sigmoids (P = 4), its state in scalars: the same operations
    in the same order (the same bits), as :func:`_vp_lm2` is for one. On return ``out``
    holds the final th's sum of squares and amplitudes (out[0:4])."""
    lo0, lo1, lo2, lo3 = lo[0], lo[1], lo[2], lo[3]
    hi0, hi1, hi2, hi3 = hi[0], hi[1], hi[2], hi[3]
    c0, c1, c2, c3 = step_max[0], step_max[1], step_max[2], step_max[3]
    t0 = min(max(th[0], lo0), hi0)
    t1 = min(max(th[1], lo1), hi1)
    t2 = min(max(th[2], lo2), hi2)
    t3 = min(max(th[3], lo3), hi3)
    th[0], th[1], th[2], th[3] = t0, t1, t2, t3
    sse = _vp_two(xo, yc, n, syy, th, buf, out, bnd, mean)
    if not math.isfinite(sse):
        return sse, 0, LM_FAILED
    D0, D1, D2, D3 = abs(out[8]), abs(out[13]), abs(out[18]), abs(out[23])
    lam = 1e-3
    nu = 2.0
    radius = 1.0
    for it in range(max_iter):
        g0, g1, g2, g3 = out[4], out[5], out[6], out[7]
        D0 = max(D0, abs(out[8]))
        D1 = max(D1, abs(out[13]))
        D2 = max(D2, abs(out[18]))
        D3 = max(D3, abs(out[23]))
        d_floor = 1e-12 * max(max(max(max(0.0, D0), D1), D2), D3) + 1e-300
        f0 = (t0 <= lo0 and g0 > 0) or (t0 >= hi0 and g0 < 0)
        f1 = (t1 <= lo1 and g1 > 0) or (t1 >= hi1 and g1 < 0)
        f2 = (t2 <= lo2 and g2 > 0) or (t2 >= hi2 and g2 < 0)
        f3 = (t3 <= lo3 and g3 > 0) or (t3 >= hi3 and g3 < 0)
        # the damped matrix's lower triangle (numba_kernels._cholesky_solve reads no more)
        m00 = 1.0 if f0 else out[8] + lam * max(D0, d_floor)
        m11 = 1.0 if f1 else out[13] + lam * max(D1, d_floor)
        m22 = 1.0 if f2 else out[18] + lam * max(D2, d_floor)
        m33 = 1.0 if f3 else out[23] + lam * max(D3, d_floor)
        m10 = 0.0 if (f1 or f0) else out[12]
        m20 = 0.0 if (f2 or f0) else out[16]
        m21 = 0.0 if (f2 or f1) else out[17]
        m30 = 0.0 if (f3 or f0) else out[20]
        m31 = 0.0 if (f3 or f1) else out[21]
        m32 = 0.0 if (f3 or f2) else out[22]
        r0 = 0.0 if f0 else -g0
        r1 = 0.0 if f1 else -g1
        r2 = 0.0 if f2 else -g2
        r3 = 0.0 if f3 else -g3
        # numba_kernels._cholesky_solve written out for P = 4
        l00, ok0 = _pivot(m00, m00)
        l10 = m10 / l00
        l20 = m20 / l00
        l30 = m30 / l00
        l11, ok1 = _pivot(m11 - l10 * l10, m11)
        l21 = (m21 - l20 * l10) / l11
        l31 = (m31 - l30 * l10) / l11
        l22, ok2 = _pivot((m22 - l20 * l20) - l21 * l21, m22)
        l32 = ((m32 - l30 * l20) - l31 * l21) / l22
        l33, ok3 = _pivot(((m33 - l30 * l30) - l31 * l31) - l32 * l32, m33)
        ok = ok0 and ok1 and ok2 and ok3
        h0 = r0 / l00
        h1 = (r1 - l10 * h0) / l11
        h2 = ((r2 - l20 * h0) - l21 * h1) / l22
        h3 = (((r3 - l30 * h0) - l31 * h1) - l32 * h2) / l33
        h3 = h3 / l33
        h2 = (h2 - l32 * h3) / l22
        h1 = ((h1 - l21 * h2) - l31 * h3) / l11
        h0 = (((h0 - l10 * h1) - l20 * h2) - l30 * h3) / l00
        # the trust region (see _vp_lm)
        scale = 1.0
        if abs(h0) * scale > radius * c0:
            scale = radius * c0 / abs(h0)
        if abs(h1) * scale > radius * c1:
            scale = radius * c1 / abs(h1)
        if abs(h2) * scale > radius * c2:
            scale = radius * c2 / abs(h2)
        if abs(h3) * scale > radius * c3:
            scale = radius * c3 / abs(h3)
        capped = scale < 1.0
        h0 *= scale
        h1 *= scale
        h2 *= scale
        h3 *= scale
        u0 = min(max(t0 + h0, lo0), hi0)
        u1 = min(max(t1 + h1, lo1), hi1)
        u2 = min(max(t2 + h2, lo2), hi2)
        u3 = min(max(t3 + h3, lo3), hi3)
        h0, h1, h2, h3 = u0 - t0, u1 - t1, u2 - t2, u3 - t3
        hn = (((0.0 + h0 * h0) + h1 * h1) + h2 * h2) + h3 * h3
        pn = (((0.0 + t0 * t0) + t1 * t1) + t2 * t2) + t3 * t3
        pred = 0.0
        for a in range(4):
            v = 0.0 + out[8 + 4 * a] * h0
            v += out[9 + 4 * a] * h1
            v += out[10 + 4 * a] * h2
            v += out[11 + 4 * a] * h3
            ha = h0 if a == 0 else (h1 if a == 1 else (h2 if a == 2 else h3))
            pred -= 2.0 * out[4 + a] * ha + ha * v
        if ok and not capped and lam <= 1.0 and 0.0 <= pred <= ftol * sse:
            return sse, it, LM_CONVERGED
        th[0], th[1], th[2], th[3] = u0, u1, u2, u3
        sse_t = _two_value(xo, yc, n, syy, th, buf, out_t, bnd, mean)
        better = ok and math.isfinite(sse_t) and sse_t < sse
        rho = (sse - sse_t) / pred if pred > 0 else 0.0
        converged = _converged(ok, better, sse, sse_t, syy, pred, rho, hn, pn, ftol, xtol)
        if better:
            if not converged:  # the gradient and matrix for the next step
                _two_steps(yc, n, buf, out_t)
            sse = sse_t
            t0, t1, t2, t3 = u0, u1, u2, u3
            for j in range(_OUT_KEPT):
                out[j] = out_t[j]
        else:
            th[0], th[1], th[2], th[3] = t0, t1, t2, t3
        lam, nu, radius = _damped(better, capped, rho, lam, nu, radius, shrink_min)
        if converged:
            return sse, it + 1, LM_CONVERGED
    return sse, max_iter, LM_FAILED


def varpro_block(model_p, x, Y, p0, lo, hi, max_iter, ftol, xtol, step_max=None,
                 shrink_min=SHRINK_MIN):
    """Fit every row of Y [B, K] by variable projection, with the interface of
    :func:`tokdyn.fit.backends.run_lm`: natural parameters in and out, standard errors at
    the end.

    ``model_p``: 4 (sigmoid, p = (l0, linf, mu, s)) or 7 (two sigmoids, p = (linf, d1, mu1,
    s1, d2, mu2, s2)). Only p0's nonlinear columns are used as the start; lo, hi bound them
    (the solver works in ln s). ``step_max``: None or [B, 2], each row's longest step in (mu,
    ln s) of an event. Returns p [B, P], sse [B], se [B, P] (as ``curve_fit`` reports them:
    SSE / (n - P) times the diagonal of (J^T J)^-1, the width's scaled by it), cov_ok [B]
    (False where J^T J is singular: se NaN), n_iter, status.
    """
    Pn = 2 if model_p == 4 else 4
    B = Y.shape[0]
    caps = np.full((B, Pn), np.inf)
    if step_max is not None:
        caps[:] = np.tile(np.asarray(step_max, dtype=np.float64).reshape(B, 2), (1, Pn // 2))
    P = model_p
    out = (p0.copy(), np.full(B, np.nan), np.full((B, P), np.nan), np.zeros(B, dtype=np.bool_),
           np.zeros(B, dtype=np.int64), np.full(B, LM_FAILED, dtype=np.int64))
    run_chunks(_varpro_chunk, B, P, x, Y, p0, lo, hi, max_iter, ftol, xtol, caps,
               float(shrink_min), *out)
    return out  # p, sse, se, cov_ok, n_iter, status


@njit(**_JIT)
def _varpro_chunk(P, x, Y, p0, lo, hi, max_iter, ftol, xtol, step_max, shrink_min, p_out, sse,
                  se, cov_ok, n_iter, status, first, last):
    """Rows first .. last - 1 of :func:`varpro_block`, into its outputs."""
    K = Y.shape[1]
    Pn = 2 if P == 4 else 4
    nl = np.array([2, 3, 0, 0]) if P == 4 else np.array([2, 3, 5, 6])  # nonlinear columns
    _varpro_rows(P, x, Y, p0, lo, hi, max_iter, ftol, xtol, step_max, shrink_min, first, last,
                 p_out, sse, se, cov_ok, n_iter, status, nl, np.empty(K), np.empty(K),
                 np.empty(K, dtype=np.int64), np.zeros((_N_BUF, K)), np.zeros(_OUT_SIZE),
                 np.zeros(_OUT_SIZE), np.empty(Pn), np.full(5, -np.inf), np.empty(Pn),
                 np.empty(Pn), np.zeros((P, P)), np.zeros((P, P)), np.zeros(P), np.zeros(P),
                 np.zeros(P))


# Below this share of a row's sum of squares about its mean, a projected sum of squares has
# lost more than 1e-8 of itself to rounding (float64 keeps 1e-16 of syy): the residuals are summed.
_PROJECTED_EXACT = 1e-8


@njit(**_KERNEL)
def _varpro_rows(P, x, Y, p0, lo, hi, max_iter, ftol, xtol, step_max, shrink_min, first, last,
                 p_out, sse, se, cov_ok, n_iter, status, nl, xo, yc, idx, buf, out, out_t, th,
                 bnd, tlo, thi, A, L, w, inv_d, var):
    """:func:`_varpro_chunk`'s rows in its scratch (compiled without numba's runtime, so no
    reference counts on the arrays it indexes)."""
    Pn = 2 if P == 4 else 4
    for b in range(first, last):
        n, mean, syy = _gather(x, Y, b, xo, yc, idx)
        for j in range(Pn):  # mu as it is, s as ln s
            wide = j % 2 == 1
            th[j] = math.log(p0[b, nl[j]]) if wide else p0[b, nl[j]]
            tlo[j] = math.log(lo[b, nl[j]]) if wide else lo[b, nl[j]]
            thi[j] = math.log(hi[b, nl[j]]) if wide else hi[b, nl[j]]
        # the least level: linf's lower bound (the sigmoid's l0 shares it); the drops' box
        bnd[0] = lo[b, 1] if P == 4 else lo[b, 0]
        if P == 7:
            bnd[1], bnd[2], bnd[3], bnd[4] = lo[b, 1], hi[b, 1], lo[b, 4], hi[b, 4]
        if P == 4:
            s, it, st = _vp_lm2(xo, yc, n, syy, th, tlo, thi, max_iter, ftol, xtol, buf,
                                out, out_t, step_max[b], shrink_min, bnd[0], mean)
        else:
            s, it, st = _vp_lm4(xo, yc, n, syy, th, tlo, thi, max_iter, ftol, xtol, buf,
                                out, out_t, step_max[b], shrink_min, bnd, mean)
        n_iter[b] = it
        status[b] = st
        if not math.isfinite(s):
            sse[b] = s
            continue
        pb = p_out[b]
        linf = mean + out[1]
        if P == 4:
            pb[0] = linf + out[2]
            pb[1] = linf
            pb[2] = th[0]
            pb[3] = th[1]
        else:
            pb[0] = linf
            pb[1] = out[2]
            pb[2] = th[0]
            pb[3] = th[1]
            pb[4] = out[3]
            pb[5] = th[2]
            pb[6] = th[3]
        # the full model's J^T J at the optimum (two sigmoids: one direct evaluation)
        if P == 4:
            # the projected sum (syy - d c) loses its digits to cancellation on a near-exact fit
            # (clipped at 0: standard errors of 0 under "converged"): there, the residuals' own
            sse[b] = s if s > _PROJECTED_EXACT * syy else _full_two_sums(
                xo, yc, out[1], out[2], th[0], math.exp(-th[1]), 0.0, th[0], math.exp(-th[1]), n)[0]
            _sigmoid_normal_matrix(out, n, A)
        else:
            sse[b] = _two_normal_matrix(xo, yc, n, mean, pb, A)
        for j in range(1, Pn, 2):  # back to s (one the solver left where it started
            k = nl[j]  # stays as given: exp(log(s)) may differ from s in its last bit)
            pb[k] = p0[b, k] if pb[k] == math.log(p0[b, k]) else math.exp(pb[k])
        # standard errors: var = SSE / (n - P) diag((J^T J)^-1) in (.., mu, ln s), and
        # se(s) = s se(ln s); NaN for all where any variance is not a finite one
        ok = _inverse_diagonal_row(A, L, w, inv_d, var)
        scale = sse[b] / max(n - P, 1)
        for j in range(P):
            var[j] = var[j] * scale
            ok = ok and math.isfinite(var[j]) and var[j] >= 0
        cov_ok[b] = ok
        if ok:
            for j in range(P):
                se[b, j] = math.sqrt(abs(var[j]))
            for j in range(1, Pn, 2):
                se[b, nl[j]] *= pb[nl[j]]


# ---------------------------------------------------------------------------------------------
# Two-sigmoid start: the best pair of grid events, or the one-sigmoid fit plus the grid event
# that best explains what it leaves, whichever explains more (closed form)


def two_start_block(x, Y, p1, lo, hi, mus, ss):
    """Two-sigmoid start values [B, 7] from each row's grid (mus [B, n_mu], ss [B, n_s]), as
    :func:`tokdyn.fit.grid.two_start`."""
    p0 = np.full((Y.shape[0], 7), np.nan)
    run_chunks(_two_start_chunk, Y.shape[0], x, Y, np.ascontiguousarray(p1), lo, hi,
               np.ascontiguousarray(mus), np.ascontiguousarray(ss), float(TWO_MIN_DET),
               float(TWO_MIN_VAR), p0)
    return p0


@njit(**_JIT)
def _full_pair_forms(G, gram, qa, qb, qe, pen, min_det, min_var):
    """For rows with every point observed, a pair's score is a quadratic form in the two
    covariances with fixed coefficients: score = qa c_q^2 + qb c_q c_r + qe c_r^2 (+ pen:
    -inf for pairs that are collinear or hold a near-constant event, and for r >= q: each
    pair is scored once, as (q, r) with r < q). Fills gram [Q, Q] (the centred Gram matrix
    over all K points) and the coefficients [Q, Q] (:func:`_pair_forms`)."""
    Q, K = G.shape
    mean = np.empty(Q)
    for q in range(Q):
        acc = 0.0
        for k in range(K):
            acc += G[q, k]
        mean[q] = acc / K
    for q in range(Q):
        for r in range(q + 1):
            acc = 0.0
            for k in range(K):
                acc += (G[q, k] - mean[q]) * (G[r, k] - mean[r])
            gram[q, r] = acc
            gram[r, q] = acc
    _pair_forms(gram, qa, qb, qe, pen, min_det, min_var * K)


@njit(**_KERNEL)
def _pair_forms(gram, qa, qb, qe, pen, min_det, v_min):
    """The pair scores' coefficients [Q, Q] from a centred Gram matrix of grid events over a
    row's points (see :func:`_full_pair_forms`; v_min: the least variance of an event)."""
    Q = gram.shape[0]
    for q in range(Q):
        for r in range(Q):
            vq, vr = gram[q, q], gram[r, r]
            det = vq * vr - gram[q, r] * gram[q, r]
            if r < q and det > min_det * vq * vr and vq > v_min and vr > v_min:
                qa[q, r] = vr / det
                qb[q, r] = -2.0 * gram[q, r] / det
                qe[q, r] = vq / det
                pen[q, r] = 0.0
            else:
                qa[q, r] = 0.0
                qb[q, r] = 0.0
                qe[q, r] = 0.0
                pen[q, r] = -np.inf


@njit(**_KERNEL)
def _pair_score(v11, v12, v22, c1, c2, min_det, v_min):
    """Explained sum of squares of two centred columns with variances v11, v22, covariance v12
    and covariances c1, c2 with the data; -1 where they are (nearly) collinear or one is
    (nearly) constant over the points (variance below v_min)."""
    det = v11 * v22 - v12 * v12
    if not (det > min_det * v11 * v22 and v11 > v_min and v22 > v_min):
        return -1.0
    return (v22 * c1 * c1 - 2.0 * v12 * c1 * c2 + v11 * c2 * c2) / det


def _pair_form_py(a, b, e, pen, rowpen, c, c1, c1s):
    """A row's score of a pair of grid events from the pair forms (see
    :func:`_full_pair_forms`)."""
    return a * c1s + b * c1 * c + e * c * c + pen + rowpen


def _pair_terms(a, b, e, pen, rowpen, c, c1, c1s):
    return (_pair_form_py(a, b, e, pen, rowpen, c, c1, c1s),)


_pair_form = njit(inline="always", **_JIT)(_pair_form_py)
# the best score of one event q with every r < q (the same bits as _pair_form's)
_pair_max = lane_maxima(_pair_terms, 6, 2)


def _pair_terms4(a, b, e, pen, rp0, c0, rp1, c1, rp2, c2, rp3, c3,
                 x0, xs0, x1, xs1, x2, xs2, x3, xs3):
    return (_pair_form_py(a, b, e, pen, rp0, c0, x0, xs0),
            _pair_form_py(a, b, e, pen, rp1, c1, x1, xs1),
            _pair_form_py(a, b, e, pen, rp2, c2, x2, xs2),
            _pair_form_py(a, b, e, pen, rp3, c3, x3, xs3))


# the same for four rows that share the pair forms (fully observed rows on one grid): each
# row's maximum has _pair_max's bits, and the forms (4 x 25 kB for the default grid, read
# from the second-level cache) are read once for the four
_pair_max4 = lane_maxima(_pair_terms4, 12, 8)


@njit(inline="always", **_JIT)
def _row_in_box(mu_q, s_q, lo, hi, b, inb):
    """inb [Q]: whether each grid event lies inside row b's box for an event (lo, hi [B, 7]:
    the second event's mu and s, which bound both)."""
    for q in range(mu_q.shape[0]):
        inb[q] = not (mu_q[q] < lo[b, 5] or mu_q[q] > hi[b, 5] or s_q[q] < lo[b, 6]
                      or s_q[q] > hi[b, 6])


@njit(**_KERNEL)
def _first_pair(fa, fb, fe, fp, rowpen, cq, q, c1, c1s, top):
    """The first r < q whose pair with q scores ``top`` (-1 where none does)."""
    for r in range(q):
        if _pair_form(fa[q, r], fb[q, r], fe[q, r], fp[q, r], rowpen[r], cq[r], c1, c1s) == top:
            return r
    return -1


@njit(**_KERNEL)
def _best_pair(fa, fb, fe, fp, rowpen, cq, inb):
    """(a) of :func:`_two_start_chunk` for one row: the best pair (q, r), r < q, of the grid
    events inside its box (inb [Q]), by the pair forms fa, fb, fe, fp [Q, Q] and the row's
    projections cq [Q]: (score, q, r), (-1, -1, -1) where no pair qualifies. Fills rowpen."""
    Q = cq.shape[0]
    for q in range(Q):
        rowpen[q] = 0.0 if inb[q] else -np.inf
    best = -1.0
    bq = -1
    br = -1
    for q in range(Q):
        if not inb[q]:
            continue
        # the largest quadratic form in lanes, then the first pair with it
        c1 = cq[q]
        c1s = c1 * c1
        # whole blocks of r (pen is -inf from r = q on), so no ragged last one
        top = _pair_max(fa, fb, fe, fp, rowpen, cq, c1, c1s,
                        min(-(-q // _LANES) * _LANES, Q), q)[0]
        if top > best:
            best = top
            bq = q
    if bq >= 0:  # its first r (the maximum is one of the forms to the bit: there is one)
        c1 = cq[bq]
        br = _first_pair(fa, fb, fe, fp, rowpen, cq, bq, c1, c1 * c1, best)
    return (best, bq, br) if br >= 0 else (-1.0, -1, -1)


@njit(**_KERNEL)
def _best_pairs4(fa, fb, fe, fp, ROWPEN, CQ, INB, j0, best, bq, br):
    """:func:`_best_pair` of rows j0 .. j0 + 3 of ROWPEN, CQ, INB [_BATCH, Q] (filled, the
    same pair forms for all four), into best, bq, br [_BATCH] (which start at -1)."""
    Q = CQ.shape[1]
    rp0, rp1, rp2, rp3 = ROWPEN[j0], ROWPEN[j0 + 1], ROWPEN[j0 + 2], ROWPEN[j0 + 3]
    c0, c1, c2, c3 = CQ[j0], CQ[j0 + 1], CQ[j0 + 2], CQ[j0 + 3]
    for q in range(Q):
        if not (INB[j0, q] or INB[j0 + 1, q] or INB[j0 + 2, q] or INB[j0 + 3, q]):
            continue
        x0, x1, x2, x3 = c0[q], c1[q], c2[q], c3[q]
        tops = _pair_max4(fa, fb, fe, fp, rp0, c0, rp1, c1, rp2, c2, rp3, c3,
                          x0, x0 * x0, x1, x1 * x1, x2, x2 * x2, x3, x3 * x3,
                          min(-(-q // _LANES) * _LANES, Q), q)
        for i in range(4):
            j = j0 + i
            if INB[j, q] and tops[i] > best[j]:
                best[j] = tops[i]
                bq[j] = q
    for j in range(j0, j0 + 4):
        if bq[j] >= 0:
            x = CQ[j, bq[j]]
            br[j] = _first_pair(fa, fb, fe, fp, ROWPEN[j], CQ[j], bq[j], x, x * x, best[j])
            if br[j] < 0:
                best[j], bq[j] = -1.0, -1


@njit(**_JIT)
def _two_start_chunk(x, Y, p1, lo, hi, mus, ss, min_det, min_var, p0, first, last):
    """Rows first .. last - 1 of :func:`two_start_block`, into p0."""
    K = Y.shape[1]
    Q = mus.shape[1] * ss.shape[1]
    every = np.arange(K)
    XO, YC, IDX, stats = _batch_scratch(K)
    G1 = np.empty((_BATCH, K))  # each row's sigmoid fit over its points
    zb = np.empty(K)
    hb = np.empty(K)
    CQ = np.empty((_BATCH, Q))  # each row's projections onto its grid
    S12 = np.empty((_BATCH, Q))  # and its sigmoid fit's
    sq = np.empty(Q)
    vq = np.empty((Q, Q))
    inb = np.empty(Q, dtype=np.bool_)
    rowpen = np.empty(Q)
    INB = np.empty((_BATCH, Q), dtype=np.bool_)  # the same per row of a batch
    ROWPEN = np.empty((_BATCH, Q))
    BEST = np.empty(_BATCH)
    BQ = np.empty(_BATCH, dtype=np.int64)
    BR = np.empty(_BATCH, dtype=np.int64)
    keys, mu_g, s_g, G2, GT2 = _grid_slots(K, mus, ss)
    sq_full = np.empty(Q)
    s2q = np.empty(Q)
    gram = np.empty((Q, Q))
    qa = np.empty((Q, Q))
    qb = np.empty((Q, Q))
    qe = np.empty((Q, Q))
    pen = np.empty((Q, Q))
    # the same for the last set of observed points of a gathered row (rows that all miss
    # the same points, a checkpoint lost for every token, reuse them)
    qa_g = np.empty((Q, Q))
    qb_g = np.empty((Q, Q))
    qe_g = np.empty((Q, Q))
    pen_g = np.empty((Q, Q))
    seen_idx = np.empty(K, dtype=np.int64)
    seen_n = -1
    for b0 in range(first, last, _BATCH):
        m = min(_BATCH, last - b0)
        # one grid, every point (rows that miss the same points go row by row, sharing
        # their pair forms)
        together = (_gather_batch(x, Y, b0, m, mus, ss, XO, YC, IDX, stats)
                    and int(stats[0, 0]) == K)
        if together:  # all the rows' projections at once
            if _use_grid(x, mus, ss, b0, _FULL, keys, mu_g, s_g, G2, GT2):
                _full_pair_forms(G2[_FULL], gram, qa, qb, qe, pen, min_det, min_var)
                _grid_moments(GT2[_FULL], K, sq_full, s2q)
            rows_dots(GT2[_FULL], every, YC, m, K, CQ)
            for j in range(m):  # (b) below: each row's sigmoid fit as a column
                m1, w1 = p1[b0 + j, 2], p1[b0 + j, 3]
                if math.isfinite(m1) and w1 > 0:
                    _sigmoid_columns(XO[j], K, m1, 1.0 / w1, zb, G1[j], hb)
                else:
                    G1[j, :] = 0.0  # (b) skips the row
            rows_dots(GT2[_FULL], every, G1, m, K, S12)
            # (a) below for all of them, four rows at a time
            mu_q, s_q = mu_g[_FULL], s_g[_FULL]
            for j in range(m):
                _row_in_box(mu_q, s_q, lo, hi, b0 + j, INB[j])
                for q in range(Q):
                    ROWPEN[j, q] = 0.0 if INB[j, q] else -np.inf
                BEST[j] = -1.0
                BQ[j] = -1
                BR[j] = -1
            for j0 in range(0, m - 3, 4):
                _best_pairs4(qa, qb, qe, pen, ROWPEN, CQ, INB, j0, BEST, BQ, BR)
            for j in range(m - m % 4, m):
                BEST[j], BQ[j], BR[j] = _best_pair(qa, qb, qe, pen, ROWPEN[j], CQ[j], INB[j])
        for j in range(m):
            b = b0 + j
            n = int(stats[j, 0])
            if n < 3:
                continue
            xo, yc, idx, cq, s12q = XO[j], YC[j], IDX[j], CQ[j], S12[j]
            nf = float(n)
            full = n == K
            v_min = min_var * nf
            slot = _FULL if full else _OTHER
            if not together and _use_grid(x, mus, ss, b, slot, keys, mu_g, s_g, G2, GT2):
                if full:
                    _full_pair_forms(G2[_FULL], gram, qa, qb, qe, pen, min_det, min_var)
                    _grid_moments(GT2[_FULL], K, sq_full, s2q)
                else:
                    seen_n = -1  # another grid: the gathered forms are stale
            GT, mu_q, s_q = GT2[slot], mu_g[slot], s_g[slot]
            if together:
                row_inb = INB[j]
            else:
                row_inb = inb
                _row_in_box(mu_q, s_q, lo, hi, b, inb)
                _grid_projections(GT, idx, yc, n, full, cq, sq, s2q)
            if full:
                for q in range(Q):
                    sq[q] = sq_full[q]
            same = n == seen_n
            for k in range(n if same else 0):
                same = same and idx[k] == seen_idx[k]
            if not full and not same:  # the centred Gram matrix over this row's points
                # point-major, each entry summed over the points in order (as a plain loop
                # would), the pass over r contiguous so that it vectorises
                for q in range(Q):
                    for r in range(q + 1):
                        vq[q, r] = 0.0
                for k in range(n):
                    kk = idx[k]
                    for q in range(Q):
                        gq = GT[kk, q]
                        for r in range(q + 1):
                            vq[q, r] += gq * GT[kk, r]
                for q in range(Q):
                    for r in range(q + 1):
                        v = vq[q, r] - sq[q] * sq[r] / nf
                        vq[q, r] = v
                        vq[r, q] = v
                _pair_forms(vq, qa_g, qb_g, qe_g, pen_g, min_det, v_min)
                seen_n = n
                for k in range(n):
                    seen_idx[k] = idx[k]
            fa, fb, fe, fp = (qa, qb, qe, pen) if full else (qa_g, qb_g, qe_g, pen_g)
            # (a) every pair of grid events
            if together:
                best, bq, br = BEST[j], BQ[j], BR[j]
            else:
                best, bq, br = _best_pair(fa, fb, fe, fp, rowpen, cq, inb)
            mu1 = 0.0
            s1 = 0.0
            mu2 = 0.0
            s2 = 0.0
            if bq >= 0:
                mu1, s1, mu2, s2 = mu_q[bq], s_q[bq], mu_q[br], s_q[br]
            # (b) the sigmoid fit with the grid event that best explains what it leaves
            m1, w1 = p1[b, 2], p1[b, 3]
            if math.isfinite(m1) and w1 > 0:
                g1 = G1[j]
                if not together:
                    _sigmoid_columns(xo, n, m1, 1.0 / w1, zb, g1, hb)
                sg1 = 0.0
                s11 = 0.0
                c1 = 0.0
                for k in range(n):
                    sg1 += g1[k]
                    s11 += g1[k] * g1[k]
                    c1 += g1[k] * yc[k]
                v11 = s11 - sg1 * sg1 / nf
                if not together:
                    _grid_dots(GT, idx, g1, n, s12q)
                for q in range(Q):
                    if not row_inb[q]:
                        continue
                    s12 = s12q[q]
                    v22 = gram[q, q] if full else vq[q, q]
                    sc = _pair_score(v11, s12 - sg1 * sq[q] / nf, v22, c1, cq[q], min_det,
                                     v_min)
                    if sc > best:
                        best = sc
                        mu1, s1, mu2, s2 = m1, w1, mu_q[q], s_q[q]
            if best < 0:
                continue
            p0[b, 2] = mu1
            p0[b, 3] = s1
            p0[b, 5] = mu2
            p0[b, 6] = s2
