"""Reading a speed-up off a budget ladder, with intervals over seeds (docs/method.md, "Reshaping training").

Per seed, fully annealed uniform baselines are trained at fractions ``b`` of the arms' steps
(0.8, 0.9, 1.0 by default), each with its own complete learning-rate schedule. Their final
validation losses ``L(b)`` make the ladder. A run that used budget ``a`` (1.0 for an arm) and
ended at loss ``L_run`` *matches* the budget ``b*`` at which the ladder, interpolated linearly
in ``log b``, reaches ``L_run`` (extrapolated along the end segments outside the ladder, and
flagged). Its speed-up is the share of the baseline's steps it saves,

    speed-up = 1 - a / b*

(+10 %: the run reaches with 90 % of the steps what the baseline reaches with all of them).
The **positive control** is the 0.9x baseline itself, read as if it had used the full budget
against the ladder without its own rung: its true speed-up is ``1 - 1/0.9 = -11.1 %`` (it is
a 10 % cheaper run), which the protocol must recover inside its interval.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import as_curve, is_real
from ..errors import InputError

__all__ = ["matched_budget", "speedup", "paired_bootstrap", "auc_ratio"]


def matched_budget(budgets, losses, loss: float) -> tuple[float, bool]:
    """``(b*, inside)``: the budget at which the ladder ``losses [R]`` at ``budgets [R]`` reaches
    ``loss`` (linear in log budget); ``inside`` is False when extrapolated.

    ``(nan, False)`` where the ladder cannot be read: a loss that is not finite (a run that
    diverged), a segment that does not fall, or an extrapolation whose budget a float cannot
    hold (0 or past 1e308)."""
    b, l = as_curve(budgets, losses, names=("budgets", "losses"))  # a masked rung is refused (its value was read)
    if b.size < 2 or not np.all(np.isfinite(b)) or np.any(np.diff(b) <= 0) or np.any(b <= 0):
        raise InputError("a ladder needs >= 2 increasing positive budgets and one loss per budget")
    if not is_real(loss):
        raise InputError(f"loss must be a number, got {loss!r}")
    loss = float(loss)
    if not math.isfinite(loss) or not np.all(np.isfinite(l)):
        # a run that diverged (NaN, inf), or a rung of the ladder that did: there is no budget to
        # read (a NaN last rung raised IndexError below, after every run had trained)
        return float("nan"), False
    lb = np.log(b)
    inside = bool(l.min() <= loss <= l.max())
    # the segment whose loss range holds `loss`; else the end segment on its side
    if loss >= l[0]:
        i = 0
    elif loss <= l[-1]:
        i = b.size - 2
    else:
        i = int(min(np.flatnonzero(l <= loss)[0] - 1, b.size - 2))
    dl = l[i + 1] - l[i]
    if not dl < 0:  # a rung that did not improve (or a NaN rung): the ladder cannot be read here
        return float("nan"), False
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        bstar = float(np.exp(lb[i] + (loss - l[i]) * (lb[i + 1] - lb[i]) / dl))
    if not (math.isfinite(bstar) and bstar > 0):
        # extrapolated along a nearly flat segment past any budget a float holds (or to 0): the
        # ladder says nothing about this loss (math.exp raised OverflowError here, and a b* of 0
        # a ZeroDivisionError in speedup)
        return float("nan"), False
    return bstar, inside


def speedup(budgets, losses, loss: float, *, used: float = 1.0) -> tuple[float, bool]:
    """``(1 - used / b*, inside)`` for a run that used budget ``used`` and ended at ``loss``."""
    bstar, inside = matched_budget(budgets, losses, loss)
    return (1.0 - used / bstar if np.isfinite(bstar) else float("nan")), inside


def paired_bootstrap(values, *, n_boot: int = 10000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of per-seed values (each already a paired arm-vs-baseline figure) with an interval
    over seeds: the Student-t interval of the mean, widened to the percentile bootstrap interval
    on a side where that reaches further (``ci95``; each alone in ``ci95_t`` and
    ``ci95_bootstrap``).

    The percentile bootstrap alone cannot hold its level over a few seeds: its resampled means
    never leave the range of the values, and it ignores that the spread is itself estimated.
    Over normal values its "95 %" interval held the mean 50 % of the time from 2 seeds (it is
    their range), 74 % from 3, 84 % from 5 and 89 % from 10; the t interval holds 95 % at any
    count, and the bootstrap side keeps a skewed spread's longer tail. Values that are not
    finite (a diverged seed) are left out of both and counted in ``n_left_out``.
    """
    from scipy.stats import t as student_t

    v = np.asarray(values, np.float64)
    left_out = int((~np.isfinite(v)).sum())  # a diverged seed's NaN: counted, so it is said, not dropped unseen
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"mean": float("nan"), "ci95": [float("nan"), float("nan")], "n": 0, "n_left_out": left_out}
    if v.size == 1:
        return {"mean": float(v[0]), "ci95": [float("nan"), float("nan")], "n": 1, "n_left_out": left_out}
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(1)
    a = (1 - level) / 2
    mean, sd = float(v.mean()), float(v.std(ddof=1))
    boot = [float(np.quantile(means, a)), float(np.quantile(means, 1 - a))]
    half = float(student_t.ppf(1 - a, v.size - 1)) * sd / math.sqrt(v.size)
    t_ci = [mean - half, mean + half]
    return {"mean": mean, "ci95": [min(boot[0], t_ci[0]), max(boot[1], t_ci[1])], "ci95_t": t_ci,
            "ci95_bootstrap": boot, "sd": sd, "n": int(v.size), "n_left_out": left_out}  # fmt: skip


def auc_ratio(steps, arm, baseline) -> float:
    """Area under ``arm``'s validation curve over the baseline's (trapezoids; < 1 is better)."""
    s = np.asarray(steps, np.float64)
    return float(np.trapezoid(np.asarray(arm, np.float64), s) / np.trapezoid(np.asarray(baseline, np.float64), s))
