"""Start values from a grid over (mu, s), scored in closed form (numpy reference).

Once mu and s are fixed, a sigmoid's amplitudes follow from linear least squares, and the sum
of squares it explains is ``cov(g, y)^2 / var(g)``: one dot product per grid event and row.
Each row starts from the grid event that explains most, so the solver begins in the basin of
the best coarse event instead of wherever the data's midpoint crossing points (that heuristic
left 2.5 % of real trajectories in a local optimum, docs/fitting.md). The two-sigmoid fit
starts from the one-sigmoid fit plus the grid event that, fitted jointly with it, explains
most of the rest.

Each row has its own grid, built from its observed points only (:func:`row_grids`): a row's
start values, and so its fit, never depend on the other rows of a block or on points it did
not observe. Rows that share their observed points share a grid; the grid's events are
evaluated once per distinct grid.

:mod:`tokdyn.fit.varpro` computes the same in compiled loops (tests hold the two equal).
"""

from __future__ import annotations

import numpy as np

from tokdyn.fit.sigmoid import Z_CLIP

__all__ = ["GRID_MU", "GRID_S", "row_grids", "start_grids", "sigmoid_grid", "grid_events",
           "step_caps", "grid_start", "best_step", "two_start", "two_sigmoid_amplitudes",
           "TWO_MIN_DET", "TWO_MIN_VAR"]

# Grid size: events per axis. 16 x 5 = 80 dot products per row cost about one solver step.
GRID_MU = 16
GRID_S = 5
# The two-sigmoid start's second event must not be nearly the first one's curve: its
# squared correlation with it (over the observed points) below 1 - TWO_MIN_DET. Two close
# events with large opposite amplitudes make a bump that fits a one-sigmoid fit's S-shaped
# residual and then traps the solver (measured: 1e-6 left both events at one place on most
# planted two-step tokens).
TWO_MIN_DET = 0.1
# ... and each event must vary over the observed points: variance at least this times n
# (a sigmoid varies by at most n/4; one centred far outside the points is a constant, and
# pairing two near-constants gives a meaningless score).
TWO_MIN_VAR = 1e-3
# Rows per call of the numpy two-sigmoid start (it holds a Q x Q Gram matrix per row: 50 kB).
_TWO_ROWS = 1024


def _median_spacing(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Median spacing [B] of the observed x of each row of W [B, K] (each with >= 2 points)."""
    order = np.argsort(~W, axis=1, kind="stable")  # observed points first, in order
    xs = np.where(np.take_along_axis(W, order, 1), x[order], np.nan)
    return np.nanmedian(np.diff(xs, axis=1), axis=1)


def _axes(first, last, spacing, s_min, n_mu, n_s):
    span = np.maximum(last - first, 1e-12)
    mus = np.linspace(first - 0.15 * span, last + 0.15 * span, n_mu, axis=1)
    s_lo = np.maximum(0.25 * spacing, s_min)
    return mus, np.geomspace(s_lo, np.maximum(span, s_lo), n_s, axis=1)


def row_grids(x: np.ndarray, Y: np.ndarray, s_min: float, *, n_mu: int = GRID_MU,
              n_s: int = GRID_S) -> tuple[np.ndarray, np.ndarray]:
    """The start grid of each row of Y [B, K] (NaN = missing): axes mu [B, n_mu], s [B, n_s].

    Built from the row's own observed points only, so a row's start (and fit) does not
    depend on the other rows of its block nor on points it never observed. mu: ``n_mu``
    points from 15 % of the observed range before the first observed x to 15 % after the
    last (an event a little outside still shapes the curve inside); s: ``n_s`` geometric
    steps from a quarter of the median spacing of the observed x (real trajectories often
    jump between two checkpoints), at least ``s_min``, to the whole observed range (a nearly
    straight decline). Rows with fewer than 2 observed points get NaN. Fully observed rows
    are computed once, by the same code as any other row.
    """
    mus, ss, _ = start_grids(x, Y, s_min, n_mu=n_mu, n_s=n_s)
    return mus, ss


def start_grids(x: np.ndarray, Y: np.ndarray, s_min: float, *, observed: np.ndarray | None = None,
                n_mu: int = GRID_MU, n_s: int = GRID_S
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`row_grids` and the solver's trust region of each row (:func:`step_caps`):
    (mu [B, n_mu], s [B, n_s], caps [B, 2]).

    ``observed`` [B]: the rows' counts of observed points where the caller has them (the
    fit's preparation does), so that only rows with a missing point are scanned for NaN. The
    fully observed rows' grid and caps are computed once and copied to each of them.
    """
    x = np.asarray(x, dtype=np.float64)
    B, K = Y.shape
    n = (~np.isnan(Y)).sum(1) if observed is None else np.asarray(observed)
    full = (n == K) & (K >= 2)
    mus, ss, caps = np.empty((B, n_mu)), np.empty((B, n_s)), np.empty((B, 2))
    if not full.all():
        mus[~full], ss[~full], caps[~full] = np.nan, np.nan, np.nan
    if full.any():
        all_x = np.ones((1, K), dtype=bool)
        mu_f, s_f = _axes(x[:1], x[-1:], _median_spacing(x, all_x), s_min, n_mu, n_s)
        rows = slice(None) if full.all() else full
        mus[rows], ss[rows], caps[rows] = mu_f, s_f, step_caps(mu_f, s_f)
    part = np.flatnonzero(~full & (n >= 2))
    if part.size:
        # once per pattern of observed points: rows missing the same checkpoints (a whole
        # checkpoint lost, a shorter run) share it, and the median spacing sorts each row
        Wp = ~np.isnan(Y if part.size == B else Y[part])
        packed = np.ascontiguousarray(np.packbits(Wp, axis=1))
        keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
        _, first_row, pattern = np.unique(keys, return_index=True, return_inverse=True)
        Wu = Wp[first_row]
        first = x[np.argmax(Wu, axis=1)]
        last = x[K - 1 - np.argmax(Wu[:, ::-1], axis=1)]
        mu_u, s_u = _axes(first, last, _median_spacing(x, Wu), s_min, n_mu, n_s)
        pattern = pattern.ravel()
        mus[part], ss[part], caps[part] = mu_u[pattern], s_u[pattern], step_caps(mu_u, s_u)[pattern]
    none = np.flatnonzero(~full & (n < 2))
    if none.size:  # no grid: step_caps of its NaN axes
        caps[none] = step_caps(mus[none], ss[none])
    return mus, ss, caps


def sigmoid_grid(x: np.ndarray, s_min: float, *, n_mu: int = GRID_MU, n_s: int = GRID_S
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The start grid of a row observed at every point of x [K] (:func:`row_grids`):
    (mu [Q], s [Q], G [Q, K] = g = sigma(-(x - mu)/s)), Q = n_mu n_s."""
    x = np.asarray(x, dtype=np.float64)
    mus, ss = row_grids(x, x[None, :], s_min, n_mu=n_mu, n_s=n_s)
    return grid_events(x, mus[0], ss[0])


def grid_events(x: np.ndarray, mus: np.ndarray, ss: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row's grid events on axis x [K]: mu [Q], s [Q] (mu-major) and G [Q, K]."""
    mu = np.repeat(mus, ss.size)
    s = np.tile(ss, mus.size)
    z = np.clip((x[None, :] - mu[:, None]) / s[:, None], -Z_CLIP, Z_CLIP)
    G = 1.0 / (1.0 + np.exp(z))
    return mu, s, np.ascontiguousarray(G)


def step_caps(mus: np.ndarray, ss: np.ndarray) -> np.ndarray:
    """The solver's trust region per row [B, 2] (mu, ln s): half a cell of the row's grid
    (mus [B, n_mu], ss [B, n_s] of :func:`row_grids`); inf along an axis with one value."""
    cap_mu = 0.5 * np.diff(mus, axis=1).min(1) if mus.shape[1] > 1 else np.full(len(mus), np.inf)
    if ss.shape[1] > 1:
        ratio = ss[:, 1] / ss[:, 0]
        cap_s = np.where(ratio > 1.0, 0.5 * np.log(np.where(ratio > 1.0, ratio, 2.0)), np.inf)
    else:
        cap_s = np.full(len(ss), np.inf)
    return np.stack([cap_mu, cap_s], axis=1)


def _groups(mus: np.ndarray, ss: np.ndarray):
    """Rows sharing a grid: yields (rows, mus [n_mu], ss [n_s]) per distinct grid."""
    keys = np.concatenate([mus, ss], axis=1)
    fine = np.all(np.isfinite(keys), axis=1)
    if not fine.any():
        return
    uniq, inverse = np.unique(keys[fine], axis=0, return_inverse=True)
    rows_fine = np.flatnonzero(fine)
    for u in range(len(uniq)):
        yield rows_fine[inverse.ravel() == u], uniq[u, : mus.shape[1]], uniq[u, mus.shape[1]:]


def _centred(Y: np.ndarray):
    W = ~np.isnan(Y)
    n = W.sum(1)
    mean = np.add.accumulate(np.where(W, Y, 0.0), axis=1)[:, -1] / np.maximum(n, 1)
    Yc = np.where(W, Y - mean[:, None], 0.0)
    return W.astype(np.float64), n.astype(np.float64), mean, Yc


def _in_box(mu_q, s_q, lo_mu, hi_mu, lo_s, hi_s) -> np.ndarray:
    """[B, Q] True where grid event q lies inside row b's box."""
    return ((mu_q[None, :] >= lo_mu[:, None]) & (mu_q[None, :] <= hi_mu[:, None])
            & (s_q[None, :] >= lo_s[:, None]) & (s_q[None, :] <= hi_s[:, None]))


def best_step(x: np.ndarray, Y: np.ndarray, lo_s: np.ndarray, hi_s: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """The best single step per row (the sigmoid's limit s -> 0), by prefix sums.

    Splitting the observed points after the j-th explains ``S_j^2 n / (j (n - j))`` of the
    centred sum of squares (S_j: sum of the first j centred values). Returns a start
    (l0, linf, mu, s) [B, 4] at the best split (mu halfway between the two points, s a tenth
    of their distance, within [lo_s, hi_s]) and that split's sum of squares [B]; NaN for rows
    with fewer than 2 points.
    """
    W, n, mean, Yc = _centred(Y)
    B, K = Y.shape
    n1 = np.cumsum(W, 1)  # points up to and including k
    S = np.cumsum(Yc, 1)
    nn = n[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        e = S * S * nn / (n1 * (nn - n1))
    # a split after point k needs k observed and a later point observed
    e = np.where((W > 0) & (n1 < nn), e, -np.inf)
    k = np.argmax(e, axis=1)
    rows = np.arange(B)
    # the next observed point after k
    later = np.where((W > 0) & (np.arange(K)[None, :] > k[:, None]), np.arange(K)[None, :], K)
    k2 = np.minimum(later.min(1), K - 1)
    j = n1[rows, k]
    head = S[rows, k]
    x = np.asarray(x, dtype=np.float64)
    gap = x[k2] - x[k]
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.stack([mean + head / j, mean - head / (n - j), 0.5 * (x[k] + x[k2]),
                      np.minimum(np.maximum(0.1 * gap, lo_s), hi_s)], axis=1)
    sse = (Yc * Yc).sum(1) - e[rows, k]
    bad = n < 2
    p[bad] = np.nan
    sse[bad] = np.nan
    return p, sse


def grid_start(x: np.ndarray, Y: np.ndarray, lo: np.ndarray, hi: np.ndarray, mus: np.ndarray,
               ss: np.ndarray):
    """Start values of the sigmoid per row of Y [B, K] (NaN = missing) within lo, hi [B, 4],
    from each row's grid (mus [B, n_mu], ss [B, n_s] of :func:`row_grids`).

    Returns (p0, p_step, sse_step): p0 [B, 4] = (l0, linf, mu, s) of the grid event that
    explains most (NaN where no grid event lies in the box or fewer than 2 points are
    observed); and the best step (:func:`best_step`), the start of a second try where it
    beats the fit from p0 (real trajectories often have one jump between two checkpoints).
    """
    p0 = np.full((len(Y), 4), np.nan)
    for rows, mu_axis, s_axis in _groups(mus, ss):
        p0[rows] = _grid_best(x, Y[rows], lo[rows], hi[rows], grid_events(x, mu_axis, s_axis))
    p_step, sse_step = best_step(x, Y, lo[:, 3], hi[:, 3])
    return p0, p_step, sse_step


def _grid_best(x, Y, lo, hi, grid) -> np.ndarray:
    """p0 [B, 4] of :func:`grid_start` for rows that share one grid (mu [Q], s [Q], G [Q, K])."""
    mu_q, s_q, G = grid
    W, n, mean, Yc = _centred(Y)
    S1 = W @ G.T  # [B, Q] sum of g over observed points
    S2 = W @ (G * G).T
    C = Yc @ G.T  # [B, Q] sum of g (y - mean)
    nn = np.maximum(n, 1)[:, None]
    var = S2 - S1 * S1 / nn
    score = np.where(var > 1e-12 * nn, C * C / np.where(var > 0, var, 1.0), 0.0)
    box = _in_box(mu_q, s_q, lo[:, 2], hi[:, 2], lo[:, 3], hi[:, 3])
    score = np.where(box, score, -np.inf)
    q = np.argmax(score, axis=1)
    rows = np.arange(len(Y))
    d = np.where(var[rows, q] > 0, C[rows, q] / np.where(var[rows, q] > 0, var[rows, q], 1.0),
                 0.0)
    linf = mean - d * S1[rows, q] / nn[:, 0]
    p0 = np.stack([linf + d, linf, mu_q[q], s_q[q]], axis=1)
    bad = ~box.any(1) | (n < 2)
    p0[bad] = np.nan
    return p0


def _pair_scores(v11, v12, v22, c1, c2, n):
    det = v11 * v22 - v12 * v12
    v_min = TWO_MIN_VAR * n
    good = (det > TWO_MIN_DET * v11 * v22) & (v11 > v_min) & (v22 > v_min)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = (v22 * c1 * c1 - 2.0 * v12 * c1 * c2 + v11 * c2 * c2) / det
    return np.where(good, sc, -1.0)


def two_start(x: np.ndarray, Y: np.ndarray, p1: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              mus: np.ndarray, ss: np.ndarray) -> np.ndarray:
    """Start values [B, 7] for two sigmoids (only the nonlinear columns 2, 3, 5, 6 filled).

    Candidates from each row's grid (mus, ss of :func:`row_grids`), scored by the sum of
    squares they explain with free amplitudes (closed form): (a) every pair of grid events;
    (b) the sigmoid fit p1 [B, 4] (natural s) with the grid event that best explains what it
    leaves. Pairs whose curves are nearly the same (squared correlation above 1 -
    TWO_MIN_DET) are skipped; grid events outside the box lo, hi [B, 7] too. NaN where
    nothing qualifies (fewer than 3 points).
    """
    out = np.full((len(Y), 7), np.nan)
    for rows, mu_axis, s_axis in _groups(mus, ss):
        grid = grid_events(x, mu_axis, s_axis)
        for part in np.array_split(rows, -(-rows.size // _TWO_ROWS)):  # [rows, Q, Q] per call
            out[part] = _two_best(x, Y[part], p1[part], lo[part], hi[part], grid)
    return out


def _two_best(x, Y, p1, lo, hi, grid) -> np.ndarray:
    """:func:`two_start` for rows that share one grid (mu [Q], s [Q], G [Q, K])."""
    mu_q, s_q, G = grid
    B, K = Y.shape
    Q = G.shape[0]
    W, n, mean, Yc = _centred(Y)
    x = np.asarray(x, dtype=np.float64)
    nn = np.maximum(n, 1)
    sq = W @ G.T  # [B, Q]
    cq = Yc @ G.T
    full = n == K
    # centred Gram matrices [B, Q, Q]: shared over all K for full rows, per row otherwise
    Gc = G - G.mean(1, keepdims=True)
    V = np.broadcast_to(Gc @ Gc.T, (B, Q, Q)).copy()
    if not full.all():
        part = ~full
        Wp = W[part]
        V[part] = (np.einsum("bk,qk,rk->bqr", Wp, G, G)
                   - sq[part][:, :, None] * sq[part][:, None, :] / nn[part][:, None, None])
    inb = _in_box(mu_q, s_q, lo[:, 5], hi[:, 5], lo[:, 6], hi[:, 6])  # [B, Q]
    # (a) pairs q > r, in the compiled kernel's order
    qi, ri = np.tril_indices(Q, -1)
    sc = _pair_scores(V[:, qi, qi], V[:, qi, ri], V[:, ri, ri], cq[:, qi], cq[:, ri],
                      n[:, None])
    sc = np.where(inb[:, qi] & inb[:, ri], sc, -1.0)
    k = np.argmax(sc, axis=1)
    best = sc[np.arange(B), k]
    out = np.full((B, 7), np.nan)
    out[:, 2], out[:, 3] = mu_q[qi[k]], s_q[qi[k]]
    out[:, 5], out[:, 6] = mu_q[ri[k]], s_q[ri[k]]
    # (b) the sigmoid fit plus one grid event
    mu1, s1 = p1[:, 2], p1[:, 3]
    ok1 = np.isfinite(mu1) & (s1 > 0)
    z = np.clip((x[None, :] - np.where(ok1, mu1, 0.0)[:, None])
                / np.where(ok1, s1, 1.0)[:, None], -Z_CLIP, Z_CLIP)
    g1 = W / (1.0 + np.exp(z))
    sg1 = g1.sum(1)
    v11 = (g1 * g1).sum(1) - sg1 * sg1 / nn
    c1 = (g1 * Yc).sum(1)
    v12 = g1 @ G.T - sg1[:, None] * sq / nn[:, None]
    vqq = V[:, np.arange(Q), np.arange(Q)]
    sb = _pair_scores(v11[:, None], v12, vqq, c1[:, None], cq, n[:, None])
    sb = np.where(inb & ok1[:, None], sb, -1.0)
    kb = np.argmax(sb, axis=1)
    bb = sb[np.arange(B), kb]
    use_b = bb > best
    out[use_b, 2], out[use_b, 3] = mu1[use_b], s1[use_b]
    out[use_b, 5], out[use_b, 6] = mu_q[kb[use_b]], s_q[kb[use_b]]
    bad = (np.maximum(best, bb) < 0) | (n < 3)
    out[bad] = np.nan
    return out


def two_sigmoid_amplitudes(x: np.ndarray, Y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """p [B, 7] (natural s) with (linf, d1, d2) replaced by their least-squares values for its
    events (the start of the full-parameter solver; variable projection does this itself).
    Rows whose 3x3 system is singular keep their amplitudes."""
    W = ~np.isnan(Y)
    Y0 = np.where(W, Y, 0.0)
    Wf = W.astype(np.float64)
    cols = [Wf]
    for mu, s in ((p[:, 2], p[:, 3]), (p[:, 5], p[:, 6])):
        z = np.clip((x[None, :] - mu[:, None]) / s[:, None], -Z_CLIP, Z_CLIP)
        cols.append(Wf / (1.0 + np.exp(z)))
    Phi = np.stack(cols, axis=1)  # [B, 3, K]
    M = Phi @ Phi.transpose(0, 2, 1)
    rhs = Phi @ Y0[:, :, None]
    out = p.copy()
    ok = np.isfinite(M).all((1, 2)) & (np.abs(np.linalg.det(M)) > 1e-10 * np.abs(
        M[:, 0, 0] * M[:, 1, 1] * M[:, 2, 2]))
    if ok.any():
        coef = np.linalg.solve(M[ok], rhs[ok])[:, :, 0]
        out[ok, 0], out[ok, 1], out[ok, 4] = coef[:, 0], coef[:, 1], coef[:, 2]
    return out
