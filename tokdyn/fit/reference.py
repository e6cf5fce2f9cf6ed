"""Independent answers for tests and benchmarks: the best sigmoid of many starts (scipy).

:func:`multistart_sigmoid` finds, per trajectory, the least sum of squares of the sigmoid in
the fit's box by brute force and polishing: the projected sum of squares (amplitudes solved
exactly) on a dense grid over (mu, s), then ``scipy.optimize.least_squares`` (bounded
trust-region reflective, all four parameters) from the best few separated grid minima, and
optionally from a fixed grid of starts as a researcher would place them. It shares no code
with the fit's solver, only the box. Slow (milliseconds per trajectory): for checks, not fits.
"""

from __future__ import annotations

import warnings

import numpy as np

from tokdyn.fit.sigmoid import Z_CLIP

__all__ = ["multistart_sigmoid"]


def _model(x, l0, linf, mu, s):
    return linf + (l0 - linf) / (1.0 + np.exp(np.clip((x - mu) / s, -Z_CLIP, Z_CLIP)))


def _dense_sse(x, y, mus, ss, floor=-np.inf):
    """Projected SSE [len(mus), len(ss)] of the sigmoid with amplitudes solved exactly; with a
    finite ``floor``, both levels at or above it: l - floor = a g + b (1 - g) with a, b >= 0,
    a two-column non-negative least squares solved by enumerating its active sets."""
    g = 1.0 / (1.0 + np.exp(np.clip((x[None, None, :] - mus[:, None, None]) / ss[None, :, None],
                                    -Z_CLIP, Z_CLIP)))
    if not np.isfinite(floor):
        yc = y - y.mean()
        gc = g - g.mean(-1, keepdims=True)
        var = (gc * gc).sum(-1)
        cov = (gc * yc).sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            explained = np.where(var > 1e-12 * len(x), cov * cov / var, 0.0)
        return (yc * yc).sum() - explained
    t = y - floor
    h = 1.0 - g
    # the normal equations of (a, b), then each one-column fit and the empty one
    gg, gh, hh = (g * g).sum(-1), (g * h).sum(-1), (h * h).sum(-1)
    gt, ht, tt = (g * t).sum(-1), (h * t).sum(-1), float(t @ t)
    with np.errstate(divide="ignore", invalid="ignore"):
        det = gg * hh - gh * gh
        a = (hh * gt - gh * ht) / det
        b = (gg * ht - gh * gt) / det
        both = np.where((det > 1e-12 * gg * hh) & (a >= 0) & (b >= 0),
                        tt - a * gt - b * ht, np.inf)
        only_g = np.where((gg > 0) & (gt >= 0), tt - gt * gt / gg, np.inf)
        only_h = np.where((hh > 0) & (ht >= 0), tt - ht * ht / hh, np.inf)
    return np.maximum(np.minimum(np.minimum(both, only_g), np.minimum(only_h, tt)), 0.0)


def multistart_sigmoid(
    x: np.ndarray,
    Y: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    n_mu: int = 120,
    n_s: int = 40,
    polish: int = 3,
    researcher_starts: tuple[int, int] | None = None,
) -> np.ndarray:
    """Best sum of squares [B] of one sigmoid per row of Y [B, K] (NaN = missing) within the
    box lo, hi [B, 4] (natural s; the fit's bounds, levels included).

    Dense grid: ``n_mu`` x ``n_s`` events (mu linear, s geometric over the box); the
    ``polish`` lowest local minima of that grid (8-neighbourhood) are polished with scipy;
    ``researcher_starts=(m, k)`` adds m x k starts (mu evenly inside the observed range, s
    geometric from 2 % to 50 % of it), each polished too (the issue's "best of 21 starts" is
    (7, 3)). Returns NaN for rows with fewer than 5 observed points.
    """
    from scipy.optimize import least_squares

    B = Y.shape[0]
    best = np.full(B, np.nan)
    for b in range(B):
        obs = ~np.isnan(Y[b])
        xo, yo = x[obs], Y[b, obs]
        if xo.size < 5:
            continue
        mlo, mhi, slo, shi = lo[b, 2], hi[b, 2], lo[b, 3], hi[b, 3]
        mus = np.linspace(mlo, mhi, n_mu)
        ss = np.geomspace(slo, shi, n_s)
        floor = max(lo[b, 0], lo[b, 1])  # the fit's level floor (both levels share it)
        F = _dense_sse(xo, yo, mus, ss, floor)
        # local minima of the grid, lowest first
        pad = np.pad(F, 1, constant_values=np.inf)
        neigh = np.min([pad[1 + di:1 + di + n_mu, 1 + dj:1 + dj + n_s]
                        for di in (-1, 0, 1) for dj in (-1, 0, 1) if (di, dj) != (0, 0)], axis=0)
        cand = np.argwhere(F <= neigh)
        cand = cand[np.argsort(F[cand[:, 0], cand[:, 1]])][:polish]
        starts = [(mus[i], ss[j]) for i, j in cand]
        if researcher_starts is not None:
            m, k = researcher_starts
            span = xo[-1] - xo[0]
            for mu0 in np.linspace(xo[0], xo[-1], m):
                for s0 in np.geomspace(0.02 * span, 0.5 * span, k):
                    starts.append((mu0, float(np.clip(s0, slo, shi))))
        top = F.min()
        for mu0, s0 in starts:
            g = 1.0 / (1.0 + np.exp(np.clip((xo - mu0) / s0, -Z_CLIP, Z_CLIP)))
            A = np.stack([g, 1.0 - g], 1)
            l0, linf = np.linalg.lstsq(A, yo, rcond=None)[0]
            p0 = np.array([l0, linf, mu0, s0])
            lb = np.array([lo[b, 0], lo[b, 1], mlo, slo])
            ub = np.array([hi[b, 0], hi[b, 1], mhi, shi])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = least_squares(lambda p: _model(xo, *p) - yo, np.clip(p0, lb, ub),
                                    bounds=(lb, ub), method="trf", xtol=1e-12, ftol=1e-12,
                                    gtol=1e-12, max_nfev=2000)
            top = min(top, float(2.0 * res.cost))
        best[b] = top
    return best
