"""The learning event of one token: the 4-parameter sigmoid, its start values and bounds.

With x = log10(axis value) (docs/method.md, "The learning event of one token"):

    l(x) = l_inf + (l_0 - l_inf) * sigma(-(x - mu) / s),   sigma(z) = 1 / (1 + exp(-z)),  s > 0

Parameters are ordered (l0, linf, mu, s) everywhere. Everything here works on a block:
x [K] shared by all rows, Y [B, K] with missing points, W [B, K] = 1.0 where Y is observed.
"""

from __future__ import annotations

import numpy as np

from tokdyn._checks import log_tie
from tokdyn.errors import InputError
from tokdyn.fit.options import FitOptions

__all__ = [
    "PARAMS",
    "LEVEL_FLOOR",
    "Z_CLIP",
    "X_SPACING_MIN",
    "sigmoid_curve",
    "sigmoid_evaluate",
    "observed_edges",
    "default_s_min",
    "s_min_of",
    "check_axis",
    "sigmoid_bounds",
    "sigmoid_start",
    "age_of_acquisition",
    "log_axis",
]

PARAMS = ("l0", "linf", "mu", "s")
# The least level a fitted loss may have: a cross-entropy is never below 0. Without this bound
# an event censored by the end of the run has levels the data do not determine (only its
# visible head is seen), and least squares sends linf to -1e5 with a drop to match.
LEVEL_FLOOR = 0.0
# |z| = |x - mu| / s beyond this changes sigma by < 2e-22: clip it so exp never overflows.
Z_CLIP = 50.0
# The least spacing of consecutive x a fit takes. Its derivatives go as 1/s, with s down to
# the default s_min (1 % of the median spacing), and J^T J squares them: below ~1e-152 they
# overflow float64 (measured on planted events at spacing c: every fit failed at c = 1e-155,
# the default s_min underflowed to 0 at 5e-324 and broke the start grid). Log10 of
# float64 axis values are never closer than ~5e-17 (two neighbouring floats near 1).
X_SPACING_MIN = 1e-150


def sigmoid_curve(x, l0, linf, mu, s):
    """l(x) for arrays that broadcast (numpy); the reference model, also used by tests."""
    z = np.clip((np.asarray(x, dtype=np.float64) - mu) / s, -Z_CLIP, Z_CLIP)
    return linf + (l0 - linf) / (1.0 + np.exp(z))


def sigmoid_evaluate(ops, x, Y, W, q):
    """Sum of squares, J^T J and J^T r of the sigmoid for a batch q [B, 4] (any backend).

    The solver works in q = (l0, linf, mu, ln s): steps in ln s are multiplicative, so a long
    Gauss-Newton step cannot throw s onto its lower bound (with s itself, a step past 0 is
    clipped to s_min and the fit gets stuck on a sharp step at one noisy point; measured:
    ~30x more fits worse than the best found, on planted events). With z = (x - mu)/s,
    g = sigma(-z) = 1/(1 + e^z) and d = l0 - linf:
    dl/dl0 = g, dl/dlinf = 1 - g, dl/dmu = d g (1 - g) / s, dl/dln s = d g (1 - g) z.
    """
    l0, linf, mu, log_s = (q[:, j : j + 1] for j in range(4))  # each (B, 1)
    s = ops.exp(log_s)
    z = ops.clip_scalar((x[None, :] - mu) / s, -Z_CLIP, Z_CLIP)  # (B, K)
    e = ops.exp(z)
    g = 1.0 / (1.0 + e)
    h = e * g  # 1 - g without cancellation
    d = l0 - linf
    r = (linf + d * g - Y) * W  # (B, K) residuals, 0 where unobserved
    t = d * g * h
    J = ops.stack([g * W, h * W, t / s * W, t * z * W], axis=1)  # (B, 4, K)
    A = J @ J.swapaxes(1, 2)  # (B, 4, 4)
    grad = (J @ r[:, :, None])[:, :, 0]  # (B, 4)
    return ops.rowsum(r * r), A, grad


def _rank_positions(W: np.ndarray) -> np.ndarray:
    """[B, K] 1-based rank of each observed point within its row (0 where unobserved)."""
    return np.cumsum(W, axis=1) * W


def _x_at_rank(x: np.ndarray, ranks: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """x of the ``rank``-th observed point of each row (rank [B], 1-based, clipped to [1, n])."""
    if len(x) == 0:  # no points: no rank to find
        return np.full(len(rank), np.nan)
    hit = ranks == rank[:, None]
    return x[np.argmax(hit, axis=1)]


def observed_edges(x: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Number of observed points, first and last observed x of each row ([B] each).

    Rows with no observed point get x_first = x_last = NaN.
    """
    n = W.sum(axis=1)
    if W.shape[1] == 0:  # no points at all (argmax has nothing to look at)
        return n.astype(np.int64), np.full(W.shape[0], np.nan), np.full(W.shape[0], np.nan)
    any_obs = n > 0
    first = np.where(any_obs, x[np.argmax(W > 0, axis=1)], np.nan)
    last = np.where(any_obs, x[len(x) - 1 - np.argmax(W[:, ::-1] > 0, axis=1)], np.nan)
    return n.astype(np.int64), first, last


def check_axis(x: np.ndarray, name: str = "x") -> None:
    """Raise one InputError unless x [K] (float64) is a fit's axis: finite, strictly increasing
    (x = log10 of the axis values: leave step 0 out), consecutive values at least
    :data:`X_SPACING_MIN` apart."""
    if not np.all(np.isfinite(x)):
        raise InputError(
            f"{name}: expected finite values (x = log10(axis value); leave step 0 out), "
            f"got {x[~np.isfinite(x)][:5].tolist()}"
        )
    if x.size < 2:
        return
    gaps = np.diff(x)
    if not np.all(gaps > 0):
        bad = int(np.argmin(gaps > 0))
        raise InputError(
            f"{name}: expected strictly increasing values, got {name}[{bad}]={float(x[bad])!r} "
            f"then {name}[{bad + 1}]={float(x[bad + 1])!r}"
        )
    if not np.all(gaps >= X_SPACING_MIN):
        bad = int(np.argmin(gaps >= X_SPACING_MIN))
        raise InputError(
            f"{name}: consecutive values closer than {X_SPACING_MIN:g} "
            f"({name}[{bad}]={float(x[bad])!r}, {name}[{bad + 1}]={float(x[bad + 1])!r}) are "
            "below what the fit can resolve in float64 (its derivatives, 1/s with s down to 1 % "
            "of a spacing, overflow when squared); x is log10 of the axis values, whose "
            "spacing is never below ~5e-17"
        )


def default_s_min(x: np.ndarray) -> float:
    """1 % of the median spacing of the grid: any sharper, and the sigmoid is a step between
    two checkpoints (it moves the nearest point by < exp(-50)); never binding for a real event.
    """
    if len(x) < 2:
        return 1e-4
    return float(0.01 * np.median(np.diff(x)))


def s_min_of(x: np.ndarray, options: FitOptions) -> float:
    """The lower bound of s in use: ``options.s_min``, or its grid-based default."""
    return options.s_min if options.s_min is not None else default_s_min(x)


def sigmoid_bounds(
    x: np.ndarray, W: np.ndarray, options: FitOptions
) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds [B, 4] of (l0, linf, mu, s); l0 and linf at least
    :data:`LEVEL_FLOOR`, unbounded above.

    mu lies within ``mu_margin`` times the observed range of x around it; s in
    ``[s_min, s_max_frac * range]``. Rows with fewer than two observed points get bounds
    built from the whole grid (they are not fitted anyway).
    """
    _, first, last = observed_edges(x, W)
    x0, x1 = (float(x[0]), float(x[-1])) if len(x) else (0.0, 0.0)  # no points: any bounds
    first = np.where(np.isfinite(first), first, x0)
    last = np.where(np.isfinite(last), last, x1)
    span = last - first
    span = np.where(span > 0, span, max(x1 - x0, 1.0))
    s_min = s_min_of(x, options)
    B = W.shape[0]
    lo = np.full((B, 4), LEVEL_FLOOR)
    hi = np.full((B, 4), np.inf)
    lo[:, 2] = first - options.mu_margin * span
    hi[:, 2] = last + options.mu_margin * span
    lo[:, 3] = s_min
    hi[:, 3] = np.maximum(options.s_max_frac * span, s_min)
    return lo, hi


def sigmoid_start(
    x: np.ndarray, Y: np.ndarray, W: np.ndarray, options: FitOptions
) -> np.ndarray:
    """Data-driven start values [B, 4] (inside the bounds of :func:`sigmoid_bounds`).

    - l0, linf: means of the first and last ``m = min(edge_points, n // 4)`` observed points.
    - mu: where the data cross the midpoint: with c points on the l0 side of it, halfway
      between the c-th and (c+1)-th observed x (counting is robust to noise, unlike looking
      for the first crossing).
    - s: from the share of points in the middle half of the drop (between 25 % and 75 %): for
      a sigmoid that band is 2 ln 3 s = 2.2 s wide; kept within [range/50, range/4].

    Y must hold 0 (not NaN) where W is 0.
    """
    n, first, last = observed_edges(x, W)
    nn = np.maximum(n, 1).astype(np.float64)
    m = np.clip(np.minimum(options.edge_points, n // 4), 1, None).astype(np.float64)
    ranks = _rank_positions(W)
    head = (ranks >= 1) & (ranks <= m[:, None])
    tail = ranks > (n - m)[:, None]
    l0 = (Y * head).sum(1) / m
    linf = (Y * tail).sum(1) / m
    mid = 0.5 * (l0 + linf)
    d = l0 - linf
    sign = np.where(d >= 0, 1.0, -1.0)
    upper_side = (sign[:, None] * (Y - mid[:, None]) > 0) & (W > 0)
    c = upper_side.sum(1)
    x_lo = _x_at_rank(x, ranks, np.clip(c, 1, np.maximum(n, 1)))
    x_hi = _x_at_rank(x, ranks, np.clip(c + 1, 1, np.maximum(n, 1)))
    mu = 0.5 * (x_lo + x_hi)
    span = np.where(np.isfinite(last - first) & (last > first), last - first, 1.0)
    band = (np.abs(Y - mid[:, None]) < 0.25 * np.abs(d)[:, None]) & (W > 0)
    s = (band.sum(1) / nn) * span / 2.2
    s = np.clip(s, span / 50.0, span / 4.0)
    p0 = np.stack([l0, linf, mu, s], axis=1)
    lo, hi = sigmoid_bounds(x, W, options)
    return np.minimum(np.maximum(p0, lo), hi)


def age_of_acquisition(
    l0: np.ndarray, linf: np.ndarray, mu: np.ndarray, s: np.ndarray, x_last: np.ndarray,
    vocab_size: int,
) -> np.ndarray:
    """Chang et al.'s age of acquisition [B] in x units (log10 of the axis value).

    The x where the fitted sigmoid crosses halfway from chance surprisal ln V to the best
    surprisal the fit reaches in the observed range (its value at the last observed x).
    Solved in closed form, so the crossing may lie before the first observed point (an
    extrapolation of the fitted curve); NaN where the curve never crosses that level (it
    rises, or lies below the level everywhere).
    """
    chance = np.log(float(vocab_size))
    best = sigmoid_curve(x_last, l0, linf, mu, s)
    target = 0.5 * (chance + best)
    d = l0 - linf
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = (target - linf) / d  # = sigma(-z) at the crossing
        ok = (d > 0) & (frac > 0) & (frac < 1)
        z = np.log(np.where(ok, 1.0 / frac - 1.0, 1.0))
    return np.where(ok, mu + s * z, np.nan)


def refuse_masked(values, name: str, hint: str) -> None:
    """One InputError for a numpy masked array with masked values where every value is needed
    (an axis: ``np.asarray`` would take the values under the mask); ``hint`` says what to do."""
    if isinstance(values, np.ma.MaskedArray) and np.ma.getmaskarray(values).any():
        raise InputError(f"{name}: expected every value, got a masked array with "
                         f"{int(np.ma.getmaskarray(values).sum())} masked value(s): {hint}")  # fmt: skip


def log_axis(axis_values) -> np.ndarray:
    """x = log10(axis values) [K] for a fit; raise InputError unless all are positive and
    strictly increasing (drop step 0, which has no logarithm, first). A masked array with
    masked values is refused (``np.asarray`` would take the values under its mask)."""
    refuse_masked(axis_values, "axis values", "leave those checkpoints out (and their columns of the losses)")
    try:
        a = np.asarray(axis_values, dtype=np.float64)
    except Exception as err:  # ragged, not numbers, an int beyond float64
        first = f"{type(err).__name__}: {err}".splitlines()[0][:200]
        raise InputError(f"axis values: expected a 1-D array of numbers ({first})") from None
    if a.ndim != 1:
        raise InputError(f"axis values: expected a 1-D array, got shape {a.shape}")
    bad = ~(np.isfinite(a) & (a > 0))
    if bad.any():
        raise InputError(
            "axis values: expected finite positive values (leave step 0 out of fits), got "
            f"{a[bad][:5].tolist()} at positions {np.flatnonzero(bad)[:5].tolist()}"
        )
    if a.size > 1 and not np.all(np.diff(a) > 0):
        i = int(np.argmin(np.diff(a) > 0))
        raise InputError(
            f"axis values: expected strictly increasing values, got {float(a[i])!r} then "
            f"{float(a[i + 1])!r}"
        )
    x = np.log10(a)
    i = log_tie(a)  # neighbours within float64's rounding (the test import-npz makes too)
    if i is not None:
        raise InputError(
            f"axis values {float(a[i])!r} and {float(a[i + 1])!r} are too close to tell apart "
            f"on a log scale: both give log10 = {float(x[i])!r} in float64"
        )
    check_axis(x, "log10(axis values)")
    return x
