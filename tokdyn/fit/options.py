"""Options of the fit and the integer codes it writes (status, class).

Every threshold the fit and the classifier use lives in :class:`FitOptions`, validated once in
``__post_init__``; the codes are fixed so that stores written today read the same tomorrow.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass, fields

import numpy as np

from tokdyn._text import shown
from tokdyn.errors import InputError

__all__ = [
    "FitOptions",
    "STATUS_CODES",
    "STATUS_NAMES",
    "CLASS_CODES",
    "CLASS_NAMES",
    "MODEL_NAMES",
    "MAX_ITER_LIMIT",
    "INT64_MAX",
]

# Status of one fit (sigmoid or two-sigmoid). Codes are stored: never renumber, only append.
STATUS_NAMES: dict[int, str] = {
    0: "converged",  # a local minimum, inside the bounds
    1: "hit_bound",  # converged with mu or s on a bound (censored or sharper than s_min)
    2: "singular",  # converged, but J^T J is singular: some parameter is not identified (flat data)
    3: "failed",  # no convergence within max_iter, or a non-finite value appeared
    4: "too_few_points",  # fewer observed points than options.min_points (status2: min_points_two)
    5: "invalid_input",  # an inf, a negative loss, or a loss above options.max_loss
    6: "not_fitted",  # the model was not asked for (two sigmoids with two_step=False)
}
STATUS_CODES: dict[str, int] = {name: code for code, name in STATUS_NAMES.items()}

# Classes of docs/method.md, "The learning event of one token" (see tokdyn.fit.models.classify for the rules).
CLASS_NAMES: dict[int, str] = {
    0: "learned",
    1: "already_known",
    2: "not_yet_learned",
    3: "forgotten",
    4: "multi_step",
    5: "gradual",
    6: "noisy",
    7: "unfit",  # too few points or invalid input: no class can be given
}
CLASS_CODES: dict[str, int] = {name: code for code, name in CLASS_NAMES.items()}

# The models compared by BIC, simplest first; "model" fields store these codes.
MODEL_NAMES: dict[int, str] = {0: "constant", 1: "line", 2: "sigmoid", 3: "two_sigmoids"}


@dataclass(frozen=True)
class FitOptions:
    """Everything the fit and the classifier can be told; all thresholds in nats or decades.

    Each value is checked on construction (an :class:`InputError` names the option, what it
    expects and what it got) and stored as a plain Python value: an int option takes any
    integer, numpy's too (never a bool), up to the int64 the compiled kernels take; a float
    option any finite real number (never a bool).

    Parameters
    ----------
    max_iter : int
        Levenberg-Marquardt iterations per trajectory (one trial step each); at most
        :data:`MAX_ITER_LIMIT` (10,000).
    ftol : float
        Converged when an accepted step lowers the sum of squares by less than ``ftol`` times
        it, and the linear model predicted no more (MINPACK's test); or when the next step
        predicts no more. 1e-8, about scipy's ``curve_fit`` default (1.49e-8): a relative
        change d of the SSE moves the parameters by about sqrt(2 d (n - 4)) of their standard
        errors (measured against 1e-10: at most 0.002 of them on 20,000 planted events and a
        tiny GPT's tokens), in 7 % fewer steps on planted events and 21 % on those tokens.
    ftol_two : float
        ``ftol`` of the two-sigmoid fit. It is judged by BIC, which a relative change d of
        its SSE moves by n d: 1e-6 leaves BIC within 1e-3 for n <= 1000 (the margin is 10)
        and the events' mu within a small fraction of their standard errors, and saves ~35 %
        of its iterations on single-event tokens, whose second event is not identified.
    xtol : float
        Converged when the step is shorter than ``xtol`` times the parameter norm.
    min_points : int
        Fewer observed (non-NaN) points than this give status ``too_few_points``. At least 5:
        the sigmoid has 4 parameters and its standard errors need one more point.
    min_points_two : int
        Fewer observed points than this: the two-sigmoid model is neither fitted (``status2``
        ``too_few_points``, its fields NaN) nor chosen. At least 8 (its 7 parameters and one
        more). 14, two points a parameter: with fewer, its two free events fit noise closely
        enough to beat every other model by BIC (measured on pure noise with 6, 8, 10 and 12
        log-spaced points: 40, 11, 4 and 2 % of the tokens; 0.9 % at 14, none from 26; on
        planted single events the same shares turned into ``multi_step``), so a short run
        (or a fit window, ``--axis-min``, near its end) was classified multi-step for noise.
    max_loss : float
        Losses above this (nats) are treated as corrupt: status ``invalid_input``.
    s_min : float or None
        Lower bound of the width ``s`` (decades). None: 1 % of the median spacing of ``x``
        (a transition sharper than that is a step between two checkpoints either way).
    s_max_frac : float
        Upper bound of ``s`` as a fraction of the observed range of ``x``.
    mu_margin : float
        ``mu`` may lie this fraction of the observed range before the first or after the last
        observed point (censored events).
    two_step : bool
        Also fit two sigmoids (needed for the ``multi_step`` class and both events' fields).
    bic_margin : float
        A richer model must lower BIC by at least this to be chosen over a simpler one
        (10 is "very strong" evidence on the Kass-Raftery scale).
    delta_min : float
        A "clear" loss drop (nats); also the least size of each event of a multi-step token.
    known_loss : float
        Loss (nats) at or below which a token counts as known (low from the start).
    noise_rms : float
        Scatter (nats, RMS about the mean) above which a token that no model explains is
        ``noisy`` rather than flat.
    r2_min : float
        Least R^2 of the sigmoid for a ``learned`` token ("good fit").
    edge_points : int
        Points at each end averaged for the fallback start's plateau levels, used only where no
        event of a row's start grid lies inside its box (docs/fitting.md, "Fallback start
        values"). The start and end levels the classes read are the chosen model's fitted
        values at the first and last observed x, not averages of points.
    vocab_size : int or None
        Vocabulary size V for the age of acquisition (chance surprisal ln V); None: no AoA.
    """

    max_iter: int = 100
    ftol: float = 1e-8
    ftol_two: float = 1e-6
    xtol: float = 1e-10
    min_points: int = 6
    min_points_two: int = 14
    max_loss: float = 1e4
    s_min: float | None = None
    s_max_frac: float = 1.0
    mu_margin: float = 0.5
    two_step: bool = True
    bic_margin: float = 10.0
    delta_min: float = 0.5
    known_loss: float = 1.0
    noise_rms: float = 0.5
    r2_min: float = 0.5
    edge_points: int = 3
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        # Each value is checked for its type and range and stored in its plain Python type
        # (numpy scalars become int, float or bool): options travel as JSON with a stored fit.
        for name, check in _CHECKS.items():
            object.__setattr__(self, name, check(name, getattr(self, name)))

    @classmethod
    def from_kwargs(cls, base: FitOptions | None = None, **overrides: object) -> FitOptions:
        """``base`` (default options if None) with ``overrides`` applied; unknown names raise."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise InputError(
                f"unknown fit option(s) {unknown}; expected some of {sorted(known)}"
            )
        if base is None:
            return cls(**overrides)  # type: ignore[arg-type]
        if not isinstance(base, FitOptions):
            raise InputError(f"options: expected a FitOptions, got {type(base).__name__}")
        values = {f.name: getattr(base, f.name) for f in fields(cls)}
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


# The largest integer the compiled kernels take (int64).
INT64_MAX = 2**63 - 1
# The most iterations a fit may be given: 100 times the default, far more than a trajectory
# needs (measured with max_iter 10,000 on 20,000 planted single events, 5,000 two-step and
# 5,000 noise rows: at most 1,574 over all of a row's tries, 99.9 % within 120), while a
# larger value only makes a fit hang on rows that never converge (each runs to max_iter:
# ~1 us an iteration on numba, ~100 us a block's iteration on the batched numpy solver, in
# each of a row's up to four solves); a row's tries add up in the int32 field n_iter.
MAX_ITER_LIMIT = 10_000
# The fewest observed points a token's sigmoid fit may be asked to take (FitOptions.min_points):
# four parameters and one degree of freedom for the sum of squares.
MIN_FIT_POINTS = 5


def _bad(name: str, value: object, expected: str) -> InputError:
    return InputError(f"FitOptions.{name}: expected {expected}, got {shown(value)}")


def _is_bool(value: object) -> bool:
    return isinstance(value, (bool, np.bool_))


def _integer(lo: int, hi: int, *, optional: bool = False):
    """Check of an int option in [lo, hi] (a numpy integer too; never a bool)."""
    expected = f"{'None or ' if optional else ''}" + (f"an int >= {lo}" if hi >= 2**62 else f"an int in [{lo}, {hi}]")

    def check(name: str, value: object):
        if optional and value is None:
            return None
        if _is_bool(value) or not isinstance(value, numbers.Integral):
            raise _bad(name, value, expected)
        v = operator.index(value)
        if not lo <= v <= hi:
            raise _bad(name, value, expected)
        return int(v)

    return check


def _real(expected: str, ok, *, optional: bool = False):
    """Check of a float option: a finite real number (int, float, numpy scalar; never a bool)
    for which ``ok(value)`` holds."""
    expected = f"{'None or ' if optional else ''}{expected}"

    def check(name: str, value: object):
        if optional and value is None:
            return None
        if _is_bool(value) or not isinstance(value, numbers.Real):
            raise _bad(name, value, expected)
        try:
            v = float(value)
        except (OverflowError, ValueError, TypeError):  # an int beyond float64's range
            raise _bad(name, value, expected) from None
        if not (math.isfinite(v) and ok(v)):
            raise _bad(name, value, expected)
        return v

    return check


def _boolean(name: str, value: object) -> bool:
    if not _is_bool(value):
        raise _bad(name, value, "a bool")
    return bool(value)


_CHECKS = {
    "max_iter": _integer(1, MAX_ITER_LIMIT),
    "ftol": _real("a float in (0, 1)", lambda v: 0 < v < 1),
    "ftol_two": _real("a float in (0, 1)", lambda v: 0 < v < 1),
    "xtol": _real("a float in (0, 1)", lambda v: 0 < v < 1),
    "min_points": _integer(MIN_FIT_POINTS, INT64_MAX),
    "min_points_two": _integer(8, INT64_MAX),
    "max_loss": _real("a finite float > 0", lambda v: v > 0),
    "s_min": _real("a finite float > 0", lambda v: v > 0, optional=True),
    "s_max_frac": _real("a finite float > 0", lambda v: v > 0),
    "mu_margin": _real("a finite float >= 0", lambda v: v >= 0),
    "two_step": _boolean,
    "bic_margin": _real("a finite float >= 0", lambda v: v >= 0),
    "delta_min": _real("a finite float >= 0", lambda v: v >= 0),
    "known_loss": _real("a finite float", lambda v: True),
    "noise_rms": _real("a finite float >= 0", lambda v: v >= 0),
    "r2_min": _real("a finite float <= 1", lambda v: v <= 1),
    "edge_points": _integer(1, INT64_MAX),
    "vocab_size": _integer(2, INT64_MAX, optional=True),
}
assert list(_CHECKS) == [f.name for f in fields(FitOptions)]
