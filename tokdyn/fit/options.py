"""Options of the fit and the integer codes it writes (status, class).

Every threshold the fit and the classifier use lives in :class:`FitOptions`, validated once in
``__post_init__``; the codes are fixed so that stores written today read the same tomorrow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from tokdyn.errors import InputError

__all__ = [
    "FitOptions",
    "STATUS_CODES",
    "STATUS_NAMES",
    "CLASS_CODES",
    "CLASS_NAMES",
    "MODEL_NAMES",
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

    Parameters
    ----------
    max_iter : int
        Levenberg-Marquardt iterations per trajectory (one trial step each).
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
        Points at each end averaged for the plateau start values and the start/end levels.
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
        def need(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise InputError(
                    f"FitOptions.{name}: expected {expected}, got {getattr(self, name)!r}"
                )

        def finite(name: str) -> bool:
            value = getattr(self, name)
            return (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
            )

        def integer(name: str) -> bool:
            value = getattr(self, name)
            return isinstance(value, int) and not isinstance(value, bool)

        need(integer("max_iter") and self.max_iter >= 1, "max_iter", "an int >= 1")
        need(finite("ftol") and 0 < self.ftol < 1, "ftol", "a float in (0, 1)")
        need(finite("ftol_two") and 0 < self.ftol_two < 1, "ftol_two", "a float in (0, 1)")
        need(finite("xtol") and 0 < self.xtol < 1, "xtol", "a float in (0, 1)")
        need(integer("min_points") and self.min_points >= 5, "min_points", "an int >= 5")
        need(integer("min_points_two") and self.min_points_two >= 8, "min_points_two", "an int >= 8")
        need(finite("max_loss") and self.max_loss > 0, "max_loss", "a positive float")
        need(
            self.s_min is None or (finite("s_min") and self.s_min > 0),
            "s_min",
            "None or a positive float",
        )
        need(finite("s_max_frac") and self.s_max_frac > 0, "s_max_frac", "a positive float")
        need(finite("mu_margin") and self.mu_margin >= 0, "mu_margin", "a float >= 0")
        need(isinstance(self.two_step, bool), "two_step", "a bool")
        need(finite("bic_margin") and self.bic_margin >= 0, "bic_margin", "a float >= 0")
        need(finite("delta_min") and self.delta_min >= 0, "delta_min", "a float >= 0")
        need(finite("known_loss"), "known_loss", "a finite float")
        need(finite("noise_rms") and self.noise_rms >= 0, "noise_rms", "a float >= 0")
        need(finite("r2_min") and self.r2_min <= 1, "r2_min", "a float <= 1")
        need(integer("edge_points") and self.edge_points >= 1, "edge_points", "an int >= 1")
        need(
            self.vocab_size is None or (integer("vocab_size") and self.vocab_size >= 2),
            "vocab_size",
            "None or an int >= 2",
        )

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
