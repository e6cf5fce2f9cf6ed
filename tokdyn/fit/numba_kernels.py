"""Compiled (numba) building blocks of the CPU fit: an arithmetic ``exp``, one event's columns,
small Cholesky solves, the rows' preparation and the standard errors' inverse diagonals.

The solvers themselves (variable projection, start grids) are in :mod:`tokdyn.fit.varpro`;
the full-parameter Levenberg-Marquardt of the numpy and torch backends (:mod:`tokdyn.fit.lm`)
is their reference. Why numba for the CPU: a batched numpy solver streams ~30 temporaries of
[B, K] through memory per iteration; compiled, each trajectory's observed points sit in L1,
the model is evaluated in short loops (with an arithmetic ``exp``: libm's is scalar), and
chunks of trajectories run on all cores. Compiled functions are cached on disk
(``cache=True``, keyed by tokdyn's code id: :mod:`tokdyn._jit`) so only the first fit on a
machine pays the compile.

Each kernel is a plain compiled function over one chunk of rows (``_*_chunk``, ``nogil``),
which allocates the chunk's scratch and writes its rows of the caller's arrays;
:func:`run_chunks` hands the chunks to ``numba.get_num_threads()`` threads, the caller's and a
pool's. numba's own ``prange`` was used before and cost compile time for nothing: numba links
every compiled callee into each caller and LLVM optimises it again there, and a ``prange`` body
becomes a function of its own inside its kernel, so the grid start, the solvers and the
two-sigmoid start were each optimised twice more (and numba's ``omp`` layer left its threads
spinning through the numpy between kernels). With the chunks on threads the first fit compiles
in 20-25 s instead of 63-72 s on 2 cores, and fits are as fast and bit for bit the same
(docs/benchmarks.md).

Import this module only through :func:`tokdyn.fit.backends.load_numba`, which returns None
when numba is missing.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from tokdyn._jit import njit
from tokdyn.fit.lanes import lane_maxima, lane_sums
from tokdyn.fit.sigmoid import Z_CLIP

# No fastmath: strict IEEE arithmetic, so that a result does not depend on how a kernel was
# compiled. numba links a private copy of every compiled callee into each caller and LLVM
# re-optimises it there (inlined, fused with the caller's code); with value-changing flags
# ("reassoc", "arcp", "contract", "afn") each copy may round differently, and which copy runs
# depends on what this process compiled and what it loaded from the on-disk cache (measured;
# the exact LLVM mechanism, e.g. which weak definition the JIT binds, was not pinned down).
# Results must be identical whichever copy runs, and only IEEE semantics guarantee that. The
# varpro fits differed between a process that compiled the kernels and one that loaded them
# from the cache (two sigmoids: ~900 of 1,200 planted rows; tests/test_fit_determinism.py).
# The elementwise loops (_exp, _sigmoid_columns) still vectorise; sums do not, which is why
# the fit's sums are written in explicit vector lanes (tokdyn/fit/lanes.py).
_JIT = dict(cache=True, nogil=True)


def _runtime_flag_supported() -> bool:
    try:
        from numba.core.cpu import CPUTargetOptions
    except ImportError:
        return False
    return hasattr(CPUTargetOptions, "_nrt")


# Kernels that allocate nothing (they work in their callers' arrays) are compiled without
# numba's runtime (its private ``_nrt`` flag). With it, every array argument and every view
# (a scratch row such as ``buf[3]``) is reference counted on entry and exit: an atomic
# increment and decrement through a call, which numba does not prune across calls (numba
# issues 2345, 2350). perf put those counts at a third of the two-sigmoid solver's time on
# real tokens. A kernel that did allocate would not compile under it (numba refuses), so the
# flag cannot silently leak memory; a numba without the flag keeps the runtime.
_KERNEL = dict(_JIT, _nrt=False) if _runtime_flag_supported() else _JIT


@njit(inline="always", **_JIT)
def _exp(z):
    """e^z for |z| <= 50 in plain arithmetic, so the loops around it vectorise (libm's exp
    does not): Taylor series of e^(z/256) to degree 10, squared 8 times. Relative error
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


@njit(**_JIT)
def exp_approx(z):
    """Vectorised :func:`_exp` over an array (for tests)."""
    out = np.empty_like(z)
    for k in range(z.shape[0]):
        out[k] = _exp(z[k])
    return out


@njit(**_KERNEL)
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


@njit(**_KERNEL)
def _cholesky_solve(M, rhs, h, L):
    """Solve M h = rhs (M small SPD); False if a pivot is not positive (as lm.cholesky_solve)."""
    ok = _cholesky_factor(M, L)
    _cholesky_substitute(L, rhs, h)
    return ok


@njit(inline="always", **_JIT)
def _pivot(d, m):
    """A Cholesky pivot d of a matrix's diagonal entry m: its root and whether it is positive
    (by a margin: d > 1e-14 |m|); else the root of 1 and False. The solvers' Cholesky
    factors, generic (:func:`_cholesky_factor`) and written out for 2 and 4 parameters
    (:mod:`tokdyn.fit.varpro`), all take their pivots here."""
    if not (d > 1e-14 * abs(m)):
        return 1.0, False
    return math.sqrt(d), True


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
        d, positive = _pivot(d, M[j, j])
        ok = ok and positive
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


# Several chunks per thread even out rows of unequal cost (a two-sigmoid fit takes 3 to 100
# steps); each chunk allocates its scratch once.
CHUNKS_PER_THREAD = 8

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _forget_pools() -> None:
    _POOLS.clear()  # a forked child has the pools but not their threads


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere nothing forks
    os.register_at_fork(after_in_child=_forget_pools)


def _pool(threads: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="tokdyn-fit")
        return pool


def run_chunks(work, n_rows: int, *args) -> None:
    """``work(*args, first, last)`` for consecutive chunks of ``n_rows`` rows, on
    ``numba.get_num_threads()`` threads (``numba.set_num_threads`` and ``NUMBA_NUM_THREADS``
    set it, as for numba's own parallel loops): the calling thread and a pool's.

    ``work`` is a compiled chunk function (``nogil``) that writes its rows of the caller's
    arrays: the threads run it in parallel, and a row's result does not depend on its chunk.
    Each thread takes the next chunk as it frees up. Why threads instead of numba's
    ``prange``: see the module doc."""
    threads = max(1, numba.get_num_threads())
    # (one thread: one chunk, one call)
    n_chunks = 1 if threads == 1 else max(1, min(n_rows, CHUNKS_PER_THREAD * threads))
    chunks = iter([(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks)
                   for c in range(n_chunks)])

    def take() -> None:
        try:
            for first, last in chunks:  # next() on a list iterator is atomic under the GIL
                work(*args, first, last)
        except BaseException:  # an error (or an interrupt): no more chunks for anyone
            for _ in chunks:
                pass
            raise

    helpers = [] if n_chunks == 1 else [
        _pool(threads - 1).submit(take) for _ in range(min(threads, n_chunks) - 1)]
    try:
        take()
    finally:
        for helper in helpers:
            helper.result()


def prepare_block(x, Y, max_loss, neg_tol, edge_points, s_min, s_max_frac, mu_margin,
                  level_floor):
    """Everything tokdyn.fit.prepare.prepare computes, in one pass per row.

    Returns (n, x_first, x_last, invalid, mean, sse_const, intercept, slope, sse_line,
    p0 [B, 4], lo [B, 4], hi [B, 4], span); see that function for the definitions.
    """
    B, K = Y.shape
    nan = np.nan
    out = (np.zeros(B, dtype=np.int64), np.full(B, nan), np.full(B, nan),
           np.zeros(B, dtype=np.bool_), np.full(B, nan), np.full(B, nan), np.full(B, nan),
           np.full(B, nan), np.full(B, nan), np.empty((B, 4)), np.full((B, 4), level_floor),
           np.full((B, 4), np.inf), np.full(B, nan))
    grid_span = max(x[K - 1] - x[0], 1.0) if K else 1.0
    run_chunks(_prepare_chunk, B, x, Y, max_loss, neg_tol, edge_points, s_min, s_max_frac,
               mu_margin, grid_span, *out)
    return out


@njit(inline="always", **_JIT)
def _observed_points(x, Y, b, xo, yo, idx):
    """Row b's observed (non-NaN) points into xo, yo and their columns into idx, in order;
    returns their count. A fully observed row (counted first: an integer sum, vectorised)
    is copied without a test per point."""
    K = x.shape[0]
    missing = 0
    for k in range(K):
        missing += Y[b, k] != Y[b, k]
    if missing == 0:
        for k in range(K):
            xo[k] = x[k]
            yo[k] = Y[b, k]
            idx[k] = k
        return K
    n = 0
    for k in range(K):
        y = Y[b, k]
        if not math.isnan(y):
            xo[n] = x[k]
            yo[n] = y
            idx[n] = k
            n += 1
    return n


def _extreme_terms(y):
    return (y, 0.0 - y)


def _total_terms(y, x):
    return (y, x)


def _moment_terms(y, x, ym, xm):
    dy = y - ym
    dx = x - xm
    return (dy * dy, dx * dx, dx * dy)


def _line_terms(y, x, intercept, slope):
    r = y - intercept - slope * x
    return (r * r,)


# The preparation's reductions in vector lanes (tokdyn.fit.lanes): the loss range and the
# constant's and the line's sums. As scalar chains (n dependent additions or comparisons
# each, four rounds of them) they were most of its time: with them, and a fully observed
# row's plain copies, 0.50 -> 0.32 us a row of 100 points (one thread).
_totals = lane_sums(_total_terms, 2, 0)
_extrema = lane_maxima(_extreme_terms, 1, 0)
_moments = lane_sums(_moment_terms, 2, 2)
_line_sse = lane_sums(_line_terms, 2, 2)


@njit(**_JIT)
def _prepare_chunk(x, Y, max_loss, neg_tol, edge_points, s_min, s_max_frac, mu_margin,
                   grid_span, n_out, x_first, x_last, invalid, mean, sse_c, intercept, slope,
                   sse_l, p0, lo, hi, y_span, row0, row1):
    """Rows row0 .. row1 - 1 of :func:`prepare_block`, into its outputs."""
    K = Y.shape[1]
    xo = np.empty(K)
    yo = np.empty(K)
    idx = np.empty(K, dtype=np.int64)
    for b in range(row0, row1):
        n_bad = 0
        for k in range(K):  # an integer sum: vectorised
            y = Y[b, k]
            n_bad += (y == math.inf) | (y == -math.inf) | (y < -neg_tol) | (y > max_loss)
        bad = n_bad > 0
        n = _observed_points(x, Y, b, xo, yo, idx)
        y_max, neg_min = _extrema(yo, n, 0)
        y_min = -neg_min
        if bad:
            n = 0
        invalid[b] = bad
        n_out[b] = n
        if n > 0:
            y_span[b] = y_max - y_min
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
            sy, sx = _totals(yo, xo, n)
            ym = sy / n
            xm = sx / n
            sc, sxx, sxy = _moments(yo, xo, ym, xm, n)
            sl = sxy / sxx if sxx > 0 else 0.0
            ic = ym - sl * xm
            (sl_sse,) = _line_sse(yo, xo, ic, sl, n)
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


def inverse_diagonal(A):
    """diag(A^-1) [B, P] of SPD matrices A [B, P, P] by Cholesky, and ok [B] (as lm.py; NaN
    where not ok)."""
    B, P = A.shape[0], A.shape[1]
    out = np.full((B, P), np.nan)
    ok = np.zeros(B, dtype=np.bool_)
    run_chunks(_inverse_diagonal_chunk, B, A, out, ok)
    return out, ok


@njit(**_JIT)
def _inverse_diagonal_chunk(A, out, ok, first, last):
    P = A.shape[1]
    L = np.zeros((P, P))  # scratch per chunk (an allocation per row serialises threads)
    w = np.zeros(P)
    inv_d = np.zeros(P)
    for b in range(first, last):
        ok[b] = _inverse_diagonal_row(A[b], L, w, inv_d, out[b])


@njit(inline="always", **_JIT)
def _inverse_diagonal_row(A, L, w, inv_d, out):
    """diag(A^-1) [P] of one SPD matrix A [P, P] into ``out``; False (and ``out`` untouched)
    where A is not finite or not positive definite. L [P, P], w and inv_d [P]: scratch.

    The squared column norms of W = L^-1 (A = L L^T), one column of the triangular inverse at
    a time: P^3 / 6 multiply-adds and P divisions, instead of P solves (P^3 and P^2
    divisions)."""
    P = A.shape[0]
    good = True
    for j in range(P):
        for i in range(P):
            good = good and math.isfinite(A[i, j])
    good = _cholesky_factor(A, L) and good
    if not good:  # no inverse: NaN, as the numpy path answers
        return False
    for i in range(P):
        inv_d[i] = 1.0 / L[i, i]
    for j in range(P):  # column j of W, from its diagonal down
        w[j] = inv_d[j]
        acc = inv_d[j] * inv_d[j]
        for i in range(j + 1, P):
            v = 0.0
            for k in range(j, i):
                v += L[i, k] * w[k]
            w[i] = -v * inv_d[i]
            acc += w[i] * w[i]
        out[j] = acc
    return True
