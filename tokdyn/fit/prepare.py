"""Per-trajectory summaries of a block, computed before any iterative fit.

One pass over Y [B, K] gives, per row: which points are observed, whether the row is valid,
its observed x range, the constant and straight-line fits, the sigmoid's start values and
bounds, and the range of its losses (which bounds the two-sigmoid fit's drops). The numpy
code here is the reference; :func:`tokdyn.fit.numba_kernels.prepare_block` computes the same
in one compiled pass (tests hold the two equal).
"""

from __future__ import annotations

import numpy as np

from tokdyn.fit.models import constant_fit, line_fit
from tokdyn.fit.options import FitOptions
from tokdyn.fit.sigmoid import observed_edges, sigmoid_bounds, sigmoid_start

__all__ = ["NEGATIVE_TOLERANCE", "SUMMARY_FIELDS", "prepare", "invalid_rows"]

# Losses down to this far below 0 are float noise of a log-softmax, not corrupt data.
NEGATIVE_TOLERANCE = 1e-4

# name -> columns (1 for a [B] array)
SUMMARY_FIELDS = {
    "n": 1, "x_first": 1, "x_last": 1, "invalid": 1,
    "mean": 1, "sse_const": 1, "intercept": 1, "slope": 1, "sse_line": 1,
    "p0": 4, "lo": 4, "hi": 4, "span": 1,
}


def invalid_rows(Y: np.ndarray, max_loss: float) -> np.ndarray:
    """[B] True where a row holds an inf, a loss below -NEGATIVE_TOLERANCE, or one > max_loss."""
    with np.errstate(invalid="ignore"):
        bad = np.isinf(Y) | (Y < -NEGATIVE_TOLERANCE) | (Y > max_loss)
    return bad.any(axis=1)


def prepare(x: np.ndarray, Y: np.ndarray, options: FitOptions) -> dict[str, np.ndarray]:
    """Summaries of every row of Y [B, K] (NaN = missing); see SUMMARY_FIELDS.

    Invalid rows are summarised as if they had no observed point (n = 0, NaN elsewhere).
    """
    invalid = invalid_rows(Y, options.max_loss)
    W = (~np.isnan(Y) & ~invalid[:, None]).astype(np.float64)
    Y0 = np.where(W > 0, Y, 0.0)
    n, x_first, x_last = observed_edges(x, W)
    mean, sse_const = constant_fit(Y0, W)
    intercept, slope, sse_line = line_fit(x, Y0, W)
    empty = n == 0
    for a in (mean, sse_const, intercept, slope, sse_line):
        a[empty] = np.nan
    lo, hi = sigmoid_bounds(x, W, options)
    span = (np.max(np.where(W > 0, Y0, -np.inf), axis=1, initial=-np.inf)  # initial: no points at all (K = 0)
            - np.min(np.where(W > 0, Y0, np.inf), axis=1, initial=np.inf))
    span[empty] = np.nan
    return dict(
        n=n, x_first=x_first, x_last=x_last, invalid=invalid,
        mean=mean, sse_const=sse_const, intercept=intercept, slope=slope, sse_line=sse_line,
        p0=sigmoid_start(x, Y0, W, options), lo=lo, hi=hi, span=span,
    )

