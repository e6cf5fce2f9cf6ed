"""Rebuild the derivative of the mean probe loss from the learning events (docs/method.md, "From events to the loss curve").

Three curves on the axis points of one run (a T run, or a D or M axis assembled by
:mod:`tokdyn.axes`), all ``-dL/dx`` with ``x = log10(axis value)``, in nats per decade:

- **measured**: from the mean probe loss ``L(x)``, by local quadratic regression (a finite
  difference with light Gaussian smoothing over neighbouring axis points);
- **events**: the sum of the fitted sigmoids, ``(1/N) sum_i delta_i sigma(-(x-mu_i)/s_i)``,
  differentiated by the *same* estimator as the measurement, so both see the same grid and the
  same smoothing (its analytic derivative is reported beside it);
- **spectrum**: the learning-time spectrum alone, ``rho(x)`` (:func:`tokdyn.spectrum.learning_time_spectrum`:
  every event's drop spread over its own sigmoid, smoothed by the spectrum's bandwidth; with
  ``kernel="delta"`` the delta approximation, every event a step at its ``mu``).

The events may also come from *another* axis: :func:`reconstruct_across` rebuilds a D axis from
the events fitted on a T run, each D point placed at its effective step on T
(:func:`tokdyn.axes.effective_steps`), with no fit on D.

Each prediction is scored by R^2 and the relative L2 error against the measurement, over all
axis points and over the interior ones (without the two end points, where the measured
derivative is one-sided).

The measured mean is over one set of tokens at every point (:func:`measured_mean_loss`): a
point where fewer than half of the tokens have a loss is no measurement (NaN, out of the
scores), and a token missing a loss at some of the other points is left out of the mean, and
out of the events, at all of them; each is said (:attr:`Reconstruction.notes`, a warning).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ._checks import as_array, as_curve, as_values, check_count, is_finite
from .errors import InputError
from .fit.models import SHARE_MIN_NET
from .spectrum import Events, PowerLaw, Spectrum, learning_time_spectrum, loss_power_law, run_events, spectrum_power_law

__all__ = ["Reconstruction", "MeasuredMean", "MeasuredMeanWarning", "default_smoothing", "measured_derivative", "measured_mean_loss",
           "mean_probe_loss", "reconstruct", "reconstruct_run", "reconstruct_across", "scores"]

# The measured mean loss of a run (measured_mean_loss): a row is measured where at least this
# share of the tokens asked for has a loss there, and the mean over the tokens with a loss at
# every measured row must keep at least this share of them (else it is refused).
MEASURED_MIN_SHARE = 0.5


class MeasuredMeanWarning(UserWarning):
    """The measured mean probe loss left rows or tokens out (:func:`measured_mean_loss`)."""


# The measured derivative's default width (default_smoothing): 1.5 x the median spacing of the log
# axis, but never less than 1.25 x its mean spacing (its span over its gaps). The median alone
# read a grid dense in one part as dense everywhere: on Pythia's checkpoints (every 1000 steps to
# 143,000 after 1, 2, 4, ..., 512; median 0.0065 decades, mean 0.034) or every step to 199 then
# 8 points to 1e6, the width was a few hundredths of the events' and the measurement mostly noise
# (R^2 against planted truth 0.63 and -3.7; 0.99 and 0.87 now: docs/benchmarks.md). 1.25 is the
# widest round factor that leaves grids with mean / median spacing up to 1.2 as they were, bit
# for bit: log-uniform ones (1.0) and the demo's (geometric_schedule(800, 40): 1.146).
# The widths beyond which a point's weight in measured_derivative, sqrt(exp(-z^2 / 2)), is exactly
# 0.0 in float64 (z > 54.6): those points are left out of its regression, which they do not move.
WEIGHT_REACH = 56.0
SMOOTHING_PER_MEDIAN = 1.5
SMOOTHING_PER_MEAN = 1.25


def default_smoothing(x) -> float:
    """The default width (decades) of :func:`measured_derivative` on increasing log axis points
    x [K >= 2]: ``max(1.5 x median spacing, 1.25 x mean spacing)`` (see the note above)."""
    d = np.diff(np.asarray(x, dtype=np.float64))
    return max(SMOOTHING_PER_MEDIAN * float(np.median(d)), SMOOTHING_PER_MEAN * float(d.mean()))


def _check_smoothing(smoothing) -> float:
    """``smoothing`` as a float, or one InputError: a bool or a string was taken as a width (True
    as 1 decade, "0.3" as 0.3), and an array, a list or an int past 1e308 raised numpy's or
    Python's own error."""
    if not (is_finite(smoothing) and smoothing > 0):
        shown = smoothing.item() if isinstance(smoothing, np.generic) else smoothing  # np.True_ as True
        raise InputError(f"smoothing must be a positive, finite number of decades, got {shown!r:.40}")
    return float(smoothing)


def measured_derivative(x, loss, *, smoothing: float | None = None) -> np.ndarray:
    """``-dL/dx`` [K] of a curve sampled at increasing x [K], by local quadratic regression.

    At each point a quadratic in ``x - x_k`` is fitted by least squares with Gaussian weights
    of standard deviation ``smoothing`` decades (default, :func:`default_smoothing`: 1.5 x the
    median spacing of x, so a handful of neighbours count, and at least 1.25 x the mean spacing,
    so a grid dense in one part is not measured by that part's width everywhere), widened where needed to reach the 3 nearest other points;
    its slope is the derivative (exact for a quadratic). NaN losses are skipped by the
    regression, and the derivative at a NaN loss is NaN: nothing was measured there (the local
    quadratic of its neighbours used to print there as a measured value).
    """
    x, loss = as_curve(x, loss)  # a masked loss is refused: a missing one is NaN
    if x.size < 3:
        raise InputError(f"a derivative needs at least 3 axis points, got {x.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.diff(x) > 0)):
        raise InputError("x must be finite and strictly increasing")
    h = default_smoothing(x) if smoothing is None else _check_smoothing(smoothing)
    ok = np.isfinite(loss)
    if ok.sum() < 3:
        raise InputError(f"a derivative needs at least 3 finite loss values, got {int(ok.sum())}")
    xo, lo = x[ok], loss[ok]
    out = np.empty(x.size)
    nearest = min(3, xo.size - 1)
    for k, xk in enumerate(x):
        # LOESS-style floor: the 3 nearest other points lie within 2 bandwidths (weight >= e^-2;
        # the ends of a geometric grid are sparse), so the local quadratic is always determined.
        # Those lie among the 4 sorted points on either side of xk.
        j = int(np.searchsorted(xo, xk))
        hk = max(h, 0.5 * float(np.sort(np.abs(xo[max(j - 4, 0) : j + 4] - xk))[nearest]))
        # Only the points a weight reaches: beyond WEIGHT_REACH widths it is exactly 0. Each
        # point's quadratic was fitted over every point, and all sorted: a checkpoint every step
        # to 40,000 took 90 s, to Pythia's 143,000 about 20 minutes a curve.
        rows = slice(int(np.searchsorted(xo, xk - WEIGHT_REACH * hk, side="left")),
                     int(np.searchsorted(xo, xk + WEIGHT_REACH * hk, side="right")))
        d = xo[rows] - xk
        w = np.sqrt(np.exp(-0.5 * (d / hk) ** 2))
        A = np.stack([np.ones_like(d), d, d * d], axis=1) * w[:, None]
        coef, *_ = np.linalg.lstsq(A, lo[rows] * w, rcond=None)
        out[k] = -coef[1]
    out[~ok] = np.nan  # no measurement at a point whose loss is missing
    return out


# The fewest points R^2 and the relative L2 error are given on (NaN below). The measured -dL/dx is
# the slope of a local quadratic: over 3 points it is one parabola's slope, a line, and any two
# numbers have an R^2; a line's 2 values and 3 more to judge it by, the rule of the spectrum's
# power-law window (tokdyn.spectrum.POWER_LAW_MIN_WIDTH). R^2 used to be given on 2 points (the
# interior of a 4-point axis, or 2 measured rows of a run whose other rows had no loss).
SCORE_MIN_POINTS = 5


def scores(predicted, measured, *, min_points: int = 2) -> dict:
    """R^2 and relative L2 error of a predicted curve against a measured one, over the points
    where both are finite; NaN for both on fewer than ``min_points`` of them (a reconstruction's
    scores: :data:`SCORE_MIN_POINTS`)."""
    p, m = as_curve(predicted, measured, names=("predicted", "measured"))
    ok = np.isfinite(p) & np.isfinite(m)
    if ok.sum() < max(check_count("min_points", min_points, 0), 2):
        return {"r2": float("nan"), "rel_l2": float("nan")}
    p, m = p[ok], m[ok]
    ss = ((m - m.mean()) ** 2).sum()
    norm = math.sqrt((m * m).sum())
    err = p - m
    return {
        "r2": float(1 - (err * err).sum() / ss) if ss > 0 else float("nan"),
        "rel_l2": float(math.sqrt((err * err).sum()) / norm) if norm > 0 else float("nan"),
    }


@dataclass(frozen=True)
class Reconstruction:
    """Measured and rebuilt ``-dL/dx`` on the axis points of one run; see the module docstring.

    Attributes
    ----------
    axis, run : what was rebuilt.
    x [K] : log10 axis values; ``mean_loss`` [K] the mean probe loss (nats).
    measured, from_events, from_events_analytic, from_spectrum : [K] ``-dL/dx``, nats/decade.
    r2_events, rel_l2_events, r2_spectrum, rel_l2_spectrum, r2_events_analytic : the scores.
    drop_share_events : share of the measured loss drop over the range that the events carry
        (NaN where the mean loss did not clearly move one way: its net change below
        ``SHARE_MIN_NET`` of its range, so a share would be unbounded); the events' own drop,
        without a ``loss_offset`` (an annealing gain is no event's).
    drop_share_well_fitted : share carried by events whose fit converged with R^2 >= r2_min.
    spectrum : the :class:`Spectrum`; ``spectrum_power_law``/``loss_power_law`` the exponents, or
        None, and then ``spectrum_power_law_why``/``loss_power_law_why`` the fit's refusal.
    n_tokens : the tokens of the mean and of the events (the N they are normalised by).
    n_tokens_left_out : tokens left out of both because they miss a loss at some measured point
        (:func:`measured_mean_loss`).
    notes : what the measurement left out and why, one line each (also warned).
    rows_left_out : the committed rows the fit left out and why (step 0, a fit window), or None.
    events : the :class:`Events` the predictions and the spectrum were made from (over the
        ``n_tokens`` tokens of the measured mean): a part of the spectrum, such as the spectrum
        of a group of tokens, is a part of it only when made from these.
    """

    axis: str
    run: str
    x: np.ndarray
    mean_loss: np.ndarray
    measured: np.ndarray
    from_events: np.ndarray
    from_events_analytic: np.ndarray
    from_spectrum: np.ndarray
    r2_events: float
    rel_l2_events: float
    r2_events_analytic: float
    r2_spectrum: float
    rel_l2_spectrum: float
    drop_share_events: float
    drop_share_well_fitted: float
    smoothing: float
    spectrum: Spectrum
    spectrum_power_law: PowerLaw | None
    loss_power_law: PowerLaw | None
    n_tokens: int
    n_events: int
    n_tokens_left_out: int = 0
    notes: tuple[str, ...] = ()
    rows_left_out: str | None = None
    spectrum_power_law_why: str | None = None
    loss_power_law_why: str | None = None
    events: Events | None = None

    @property
    def mean_loss_rose(self) -> bool:
        """Whether the mean loss ended above where it began (its first and last measured rows):
        the ``drop_share_*`` are then shares of that rise."""
        ok = np.flatnonzero(np.isfinite(self.mean_loss))
        return bool(ok.size >= 2 and self.mean_loss[ok[-1]] > self.mean_loss[ok[0]])

    def summary(self) -> dict:
        """The scalar results, JSON-able. ``*_interior``: the scores without the two end points
        of the measured ones (where the measured derivative is one-sided: a first row with no
        measurement leaves the second one-sided, and it was scored as interior)."""
        inner = np.flatnonzero(np.isfinite(self.measured))[1:-1]
        ev_in, sp_in = (scores(c[inner], self.measured[inner], min_points=SCORE_MIN_POINTS) for c in (self.from_events, self.from_spectrum))
        return {
            "run": self.run, "axis": self.axis, "n_points": int(self.x.size),
            "n_points_measured": int(np.count_nonzero(np.isfinite(self.measured))), "n_tokens": self.n_tokens,
            "n_tokens_left_out": self.n_tokens_left_out, "notes": list(self.notes), "rows_left_out": self.rows_left_out,
            "n_events": self.n_events, "x_range": [float(self.x[0]), float(self.x[-1])],
            "r2_events": self.r2_events, "rel_l2_events": self.rel_l2_events,
            "r2_events_analytic": self.r2_events_analytic,
            "r2_spectrum": self.r2_spectrum, "rel_l2_spectrum": self.rel_l2_spectrum,
            "r2_events_interior": ev_in["r2"], "rel_l2_events_interior": ev_in["rel_l2"],
            "r2_spectrum_interior": sp_in["r2"], "rel_l2_spectrum_interior": sp_in["rel_l2"],
            "drop_share_events": self.drop_share_events, "drop_share_well_fitted": self.drop_share_well_fitted,
            "bandwidth": self.spectrum.bandwidth, "kernel": self.spectrum.kernel, "smoothing": self.smoothing,
            "spectrum_power_law": self.spectrum_power_law.to_dict() if self.spectrum_power_law else None,
            "loss_power_law": self.loss_power_law.to_dict() if self.loss_power_law else None,
        }  # fmt: skip

    def to_dict(self) -> dict:
        """Everything, with the curves as lists."""
        curves = {k: getattr(self, k).tolist() for k in ("x", "mean_loss", "measured", "from_events",
                                                          "from_events_analytic", "from_spectrum")}  # fmt: skip
        return {**self.summary(), "curves": curves, "spectrum": self.spectrum.to_dict()}


def reconstruct(
    x,
    mean_loss,
    events: Events,
    *,
    axis: str = "T",
    run: str = "",
    bandwidth: str | float = "auto",
    smoothing: float | None = None,
    n_boot: int = 200,
    seed: int = 0,
    placement: str = "mu",
    kernel: str = "event",
    at=None,
    loss_offset=None,
    notes: Sequence[str] | None = None,
) -> Reconstruction:
    """Rebuild ``-dL/dx`` of ``mean_loss`` [K] at x [K] from ``events``; see the module docstring.

    ``events`` must come from a fit of the same tokens (their ``n_scored``, the tokens observed at
    least once, is the N the mean is taken over), on the same x, or on another axis: then ``at`` [K] (increasing) gives each
    point's position on the events' axis, the events' curve is read there and differentiated
    along x, and the spectrum is carried over by the chain rule (``rho(at) * d at / dx``). ``bandwidth``, ``placement`` and ``kernel`` make the spectrum
    (:func:`tokdyn.spectrum.learning_time_spectrum`). ``loss_offset`` [K] (nats) is a known
    term the events do not carry, added to their share of the loss at each point (minus the
    annealing gain of a decayed branch, :mod:`tokdyn.annealing`); its ``-d/dx`` through the
    measurement's estimator is added to every prediction. ``n_boot`` bootstrap resamples give the
    spectrum exponent's interval (0 skips the power laws' intervals; the exponents are still fitted).

    A NaN in ``mean_loss`` is a point with no measurement: its measured derivative is NaN, it
    is left out of every score and of the drop shares (measured between the first and the last
    measured point), and a note says so (``notes``, when given, say it instead: what the caller
    left out and why). Each note is also warned (:class:`MeasuredMeanWarning`).
    """
    x, mean_loss = as_curve(x, mean_loss, names=("x", "mean_loss"))  # a masked loss is refused: a missing one is NaN
    if not isinstance(events, Events):
        raise InputError(f"events must be an Events, got {type(events).__name__}")
    measured = measured_derivative(x, mean_loss, smoothing=smoothing)
    unmeasured = ~np.isfinite(mean_loss)
    if notes is None:
        notes = [f"no measured mean loss at {_count(int(unmeasured.sum()), 'point')} (x = {_listed(x[unmeasured])}): "
                 f"no measured -dL/dx there, left out of the scores"] if unmeasured.any() else []
    notes = tuple(str(n) for n in notes if n)
    for note in notes:
        warnings.warn(f"{f'run {run!r}' if run else 'reconstruction'}: {note}", MeasuredMeanWarning, stacklevel=2)
    if at is None:
        at, jac = x, np.ones_like(x)
    else:
        at = as_values("at", at)
        if at.shape != x.shape or not (np.all(np.isfinite(at)) and np.all(np.diff(at) > 0)):
            raise InputError(f"at: expected {x.size} finite, increasing positions on the events' axis, got shape {at.shape}")
        jac = np.gradient(at, x)  # d at / dx
    h_s = default_smoothing(x) if smoothing is None else _check_smoothing(smoothing)

    def same_grid(curve: np.ndarray) -> np.ndarray:
        """``-d curve/dx`` by the measurement's estimator on the points it measured (at a point
        it did not, where nothing is scored, from every point: the prediction is still drawn)."""
        d = measured_derivative(x, curve, smoothing=h_s)
        if unmeasured.any():
            d = np.where(unmeasured, d, measured_derivative(x, np.where(unmeasured, np.nan, curve), smoothing=h_s))
        return d
    spec = learning_time_spectrum(events, bandwidth=bandwidth, placement=placement, kernel=kernel)
    # The events' share of L (the spectrum above has refused an empty set): its -d/dx through
    # the measurement's estimator is the prediction, and its fall over the range their drop.
    curve = events.curve(at)
    extra = np.zeros_like(x)
    if loss_offset is not None:
        offset = as_values("loss_offset", loss_offset)
        if offset.shape != x.shape or not np.all(np.isfinite(offset)):
            raise InputError(f"loss_offset: expected {x.size} finite values, got shape {offset.shape}")
        curve = curve + offset
        extra = same_grid(offset)
    from_events = same_grid(curve)
    analytic = events.derivative(at) * jac + extra
    from_spectrum = spec.at(_onto_range(at, spec.x_range)) * jac + extra
    s_ev, s_an, s_sp = (scores(c, measured, min_points=SCORE_MIN_POINTS) for c in (from_events, analytic, from_spectrum))
    n_scored = int(np.count_nonzero(np.isfinite(measured)))
    if n_scored < SCORE_MIN_POINTS + 2:
        what = (f"no R^2 or relative L2 error: {_count(n_scored, 'measured point')}" if n_scored < SCORE_MIN_POINTS else
                f"no R^2 or relative L2 error without the end points: {_count(n_scored - 2, 'measured point')} between them")
        note = (f"{what}, and a score needs {SCORE_MIN_POINTS} at least (the measured -dL/dx is the slope of local "
                f"quadratics: over fewer points any prediction's R^2 says little)")  # fmt: skip
        warnings.warn(f"{f'run {run!r}' if run else 'reconstruction'}: {note}", MeasuredMeanWarning, stacklevel=2)
        notes = notes + (note,)
    # the drops between the first and the last measured point, on both sides
    i0, i1 = np.flatnonzero(~unmeasured)[[0, -1]]  # measured_derivative has made sure of 3
    finite = mean_loss[~unmeasured]
    measured_drop = float(mean_loss[i0] - mean_loss[i1])
    ev_drop = float(curve[i0] - curve[i1]) - (float(offset[i0] - offset[i1]) if loss_offset is not None else 0.0)
    well = events.subset(events.well_fitted)
    well_drop = float(well.curve(at[i0 : i0 + 1])[0] - well.curve(at[i1 : i1 + 1])[0]) if len(well) else 0.0
    spl = lpl = spl_why = lpl_why = None
    try:
        spl = spectrum_power_law(events, bandwidth=spec.bandwidth, n_boot=n_boot, seed=seed, placement=placement,
                                 kernel=kernel, spectrum=spec)
    except InputError as exc:
        spl_why = str(exc)
    try:
        lpl = loss_power_law(x, mean_loss)
    except InputError as exc:
        lpl_why = str(exc)
    # A share of the measured fall is bounded only where the mean loss clearly moved one way:
    # its net change at least SHARE_MIN_NET of its range (the class shares' rule). A flat, noisy
    # mean (net -0.003 nats over a range of 0.1) read -2,170 % and -28,099 % before.
    span = float(finite.max() - finite.min())
    share = (lambda d: d / measured_drop if measured_drop != 0 and abs(measured_drop) >= SHARE_MIN_NET * span else float("nan"))
    return Reconstruction(
        axis=axis, run=run, x=x, mean_loss=mean_loss, measured=measured, from_events=from_events,
        from_events_analytic=analytic, from_spectrum=from_spectrum,
        r2_events=s_ev["r2"], rel_l2_events=s_ev["rel_l2"], r2_events_analytic=s_an["r2"],
        r2_spectrum=s_sp["r2"], rel_l2_spectrum=s_sp["rel_l2"],
        drop_share_events=share(ev_drop), drop_share_well_fitted=share(well_drop), smoothing=h_s,
        spectrum=spec, spectrum_power_law=spl, loss_power_law=lpl, n_tokens=events.n_scored, n_events=len(events),
        notes=notes, spectrum_power_law_why=spl_why, loss_power_law_why=lpl_why, events=events,
    )  # fmt: skip


def reconstruct_run(
    run,
    *,
    which: str = "two_step",
    bandwidth: str | float = "auto",
    smoothing: float | None = None,
    n_boot: int = 200,
    seed: int = 0,
    placement: str = "mu",
    kernel: str = "event",
    events: Events | None = None,
) -> Reconstruction:
    """:func:`reconstruct` for a fitted :class:`~tokdyn.store.Run`: its mean probe loss on the
    fitted rows and the events of its stored fit (``which``: see
    :func:`tokdyn.spectrum.events_from_fit`), or ``events`` already made from it.

    Both sides are over one set of tokens (:func:`measured_mean_loss`): the tokens the fit
    scored that have a loss at every measured row; a token left out of the mean is left out of
    the events too (N is then the tokens kept), so the two stay comparable."""
    from .axes import AxisWarning, axis_run_problem
    from .fit.job import fitted_inputs, rows_left_out, stored_axis_min

    if run.axis in ("D", "M") and run.attrs.get("sources"):  # an assembled axis: its rows are copies of its sources'
        stale = axis_run_problem(run, run.axis)
        if stale is not None:
            warnings.warn(f"axis run {run.name!r} is out of date ({stale}): this is the axis as it was assembled; "
                          "assemble it again (assemble_axis(..., overwrite=True), or tokdyn reconstruct --axis)",
                          AxisWarning, stacklevel=2)  # fmt: skip
    with run.fit.unchanged():  # the events, the rows, the tokens scored and the window: of one fit
        events = run_events(run, which=which) if events is None else events  # StoreError if not fitted
        rows, x = fitted_inputs(run)  # the rows the fit was made on (after any axis_min)
        # The mean over the tokens the events are normalised by (n_scored: the fit saw a point of
        # theirs), never over a token the fit set aside: one token at 2e4 nats (above max_loss,
        # unfit) made the "measured" mean a curve of that token alone, the events' share near 0.
        scored = np.asarray(run.fit.read(fields=("n_points",))["n_points"]) > 0
        mm = measured_mean_loss(run, rows, tokens=None if scored.all() else scored)
        rec = reconstruct(x, mm.loss, _events_of(events, mm.tokens, scored), axis=run.axis, run=run.name, bandwidth=bandwidth,
                          smoothing=smoothing, n_boot=n_boot, seed=seed, placement=placement, kernel=kernel, notes=mm.notes)  # fmt: skip
        return replace(rec, n_tokens_left_out=mm.n_left_out, rows_left_out=rows_left_out(run, rows, axis_min=stored_axis_min(run)))


def _onto_range(at: np.ndarray, x_range: tuple[float, float]) -> np.ndarray:
    """``at`` with the points that lie past an end of the events' observed ``x_range`` by at most
    :data:`EDGE_MAX` decades moved onto it: the spectrum is read at its edge there, as the
    events are evaluated just past it (:func:`edge_tolerance`). The spectrum is 0 outside the
    observed range, and a D budget of 2000 steps read from a trunk recorded to step 1999 (0.0002
    decades past it) got a spectrum of 0 at its last point (R^2 -1.06 for 0.9 and more)."""
    lo, hi = x_range
    near = (at >= lo - EDGE_MAX) & (at <= hi + EDGE_MAX)
    return np.where(near, np.clip(at, lo, hi), at)


def _events_of(events: Events, kept: np.ndarray, scored: np.ndarray) -> Events:
    """``events`` over the tokens ``kept`` [N] of the measured mean, normalised by their number
    (unchanged where they are every token ``scored`` [N], the common case)."""
    if kept.shape != (events.n_tokens,):
        raise InputError(f"events of {events.n_tokens} tokens for a run of {kept.size}: not the run's fit")
    if np.array_equal(kept, scored):
        return events
    return replace(events.for_tokens(kept), n_scored=None, scored=kept)


# the most a point may lie past the measured steps (decades): 0.02 is 5 % of a step, which holds
# an off-by-one at step 20 and on (0-based against 1-based counting, a budget's rounding)
EDGE_MAX = 0.02


def edge_tolerance(x: np.ndarray) -> tuple[float, float]:
    """How far below and above the measured ``x`` (log10 steps, increasing) a point may lie and
    still be taken: half the interval between the first two and between the last two points, at
    most :data:`EDGE_MAX` decades (1e-9 with fewer than two points). The fitted events are
    evaluated there, a short extrapolation; the measured mean loss is read at the edge."""
    x = np.sort(np.asarray(x, np.float64))
    if x.size < 2:
        return 1e-9, 1e-9
    return (max(min(0.5 * float(x[1] - x[0]), EDGE_MAX), 1e-9), max(min(0.5 * float(x[-1] - x[-2]), EDGE_MAX), 1e-9))


def reconstruct_across(
    axis_run,
    t_run,
    *,
    by: str = "tokens",
    which: str = "two_step",
    bandwidth: str | float = "auto",
    smoothing: float | None = None,
    kernel: str = "event",
    annealing=None,
) -> Reconstruction:
    """Rebuild ``-dL/dlog10 D`` of D axis run ``axis_run`` from the events fitted on T run ``t_run``
    alone (no fit on D): each D point is read at its effective step on T
    (:func:`tokdyn.axes.effective_steps`, ``by`` ``"tokens"`` or ``"lr_area"``). Its scores say
    whether learning times are a property of the token that carries across axes.

    ``annealing`` (a :class:`tokdyn.annealing.AnnealingGain`, calibrated on other branches)
    subtracts from each point the loss its decay gains over the trunk (Tissue et al. 2024; use
    it with ``by="lr_area"``, the forward area of their law); each D point's source run must
    carry ``attrs["decay_lr"]``.

    Fit ``t_run`` from the end of its warm-up (``fit_run(t_run, axis_min=warmup_steps)``): the D
    points lie after it, and over every step the warm-up's drop takes one of each token's two
    events (docs/spectrum.md, "D rebuilt from the events of T"). A point whose effective step
    lies below that fit window, or outside the steps the T fit was made on at all (above its last
    fitted step: a trunk stopped short) by more than half a checkpoint interval or 0.02 decades
    (:func:`edge_tolerance`), is refused (:class:`InputError`), not extrapolated."""
    from .axes import axis_run_problem, check_same_probe, effective_steps, source_runs
    from .fit.job import fit_inputs, fitted_inputs, stored_axis_min

    check_same_probe(axis_run, t_run)  # the T events of token i are read against D's token i
    stale = axis_run_problem(axis_run, "D") if axis_run.axis == "D" else None
    if stale is not None:  # its rows are not its sources' final rows any more
        raise InputError(f"{axis_run.name!r} is out of date ({stale}); assemble it again: "
                         f"assemble_axis(store, 'D', runs=..., overwrite=True)")  # fmt: skip
    with t_run.fit.unchanged():  # the events, the tokens scored, the window and the rows of T: of one fit
        events = run_events(t_run, which=which)  # StoreError if T is not fitted
        scored = np.asarray(t_run.fit.read(fields=("n_points",))["n_points"]) > 0  # the tokens N counts
        rows, x = fit_inputs(axis_run)
        steps = effective_steps(axis_run, t_run, by=by)[rows]
        window = stored_axis_min(t_run)
        if window is not None and np.any(steps < window):
            raise InputError(
                f"{int(np.sum(steps < window))} of the {steps.size} {axis_run.axis} points lie at effective steps below "
                f"{t_run.name!r}'s fit window (from step {window:g}; the first at {steps.min():.3g}): its events would be "
                f"extrapolated there. Refit it with a lower --axis-min"
            )
        # Above the T fit's last step (a trunk still being recorded, or trained short of the largest
        # budget) the events were extrapolated as silently as below its window, and read as a rebuild.
        # Half a checkpoint interval (at most 0.02 decades) past either end is taken, the events
        # evaluated there: a trunk recorded at steps 0..1999 and a D budget of 2000 steps differ by
        # 0.0002 decades, and were refused.
        _, t_x = fitted_inputs(t_run)
    at = np.log10(steps)
    lo_tol, hi_tol = edge_tolerance(t_x)
    outside = (at < t_x.min() - lo_tol) | (at > t_x.max() + hi_tol)
    if outside.any():
        raise InputError(
            f"{int(outside.sum())} of the {steps.size} {axis_run.axis} points lie at effective steps outside the steps "
            f"{t_run.name!r} was fitted on ({10 ** t_x.min():.4g} to {10 ** t_x.max():.4g}; the points run {steps.min():.4g} "
            f"to {steps.max():.4g}): its events would be extrapolated there. Record and fit T over every point "
            f"(a trunk trained to the largest budget), or leave those points out"
        )
    offset = None
    if annealing is not None:
        from .annealing import decay_schedule

        srcs = source_runs(axis_run)
        offset = -np.array([annealing.gain(decay_schedule(srcs[int(k)])) for k in rows])
    label = f"{axis_run.name} from {t_run.name}" + (" with the annealing gain" if annealing is not None else "")
    if scored.shape != (axis_run.n_tokens,):
        raise InputError(f"{t_run.name!r} has {scored.size} tokens and {axis_run.name!r} {axis_run.n_tokens}: not one probe")
    # one set of tokens on both sides, as in reconstruct_run: those T scored with a loss at every D point
    mm = measured_mean_loss(axis_run, rows, tokens=None if scored.all() else scored)
    rec = reconstruct(x, mm.loss, _events_of(events, mm.tokens, scored), axis=axis_run.axis, run=label,
                      bandwidth=bandwidth, smoothing=smoothing, n_boot=0, kernel=kernel, at=at, loss_offset=offset,
                      notes=mm.notes)  # fmt: skip
    return replace(rec, n_tokens_left_out=mm.n_left_out)


@dataclass(frozen=True)
class MeasuredMean:
    """The measured mean probe loss of rows of a run, over one set of tokens (:func:`measured_mean_loss`).

    Attributes
    ----------
    loss [K] : the mean loss (nats) of each row over ``tokens``; NaN at a row left out.
    tokens [N] : bool, the tokens averaged: those asked for with a loss at every row kept.
    n_asked : the tokens asked for (the ``tokens`` mask given, or every token).
    missing [K] : bool, the rows left out: fewer than :data:`MEASURED_MIN_SHARE` of the tokens
        asked for have a loss there.
    notes : what was left out and why, one line each (none when nothing was).
    """

    loss: np.ndarray
    tokens: np.ndarray
    n_asked: int
    missing: np.ndarray
    notes: tuple[str, ...] = ()

    @property
    def n_tokens(self) -> int:
        return int(np.count_nonzero(self.tokens))

    @property
    def n_left_out(self) -> int:
        """Tokens asked for but left out: each misses a loss at one or more of the rows kept."""
        return self.n_asked - self.n_tokens


def measured_mean_loss(r, rows: np.ndarray | None = None, *, tokens: np.ndarray | None = None) -> MeasuredMean:
    """The mean probe loss [K] of the given rows of run ``r`` (all committed rows by default) over
    one set of tokens at every row: what a reconstruction measures.

    ``tokens`` [N] (bool): the tokens asked for (default: all). A row where fewer than
    :data:`MEASURED_MIN_SHARE` (half) of them have a loss (NaN: not finite when recorded, or
    lost) is left out: NaN, no measurement. Over the other rows the mean is over the tokens with
    a loss at every one of them; a token missing one at some rows only is left out at all of
    them, and the notes say how many and where. Averaging each row over whichever tokens it has
    measured a different set at each row: with the highest-loss tenth of the tokens missing at
    the first 4 rows, the early mean read too low, and the events' R^2 fell from 1.000 to 0.924
    on a planted run whose events were exact. Where that leaves fewer than half of the tokens,
    :class:`InputError`: the mean of a minority is not the probe's mean loss. Where every token
    has a loss at every row (the common case), the numbers are those of :func:`mean_probe_loss`.
    """
    arr, sel, n_asked = _selection(r, rows, tokens)
    k = arr.shape[0]
    idx = np.arange(k) if rows is None else _row_indices(rows, r.n_committed)
    p = _parts(arr, sel)
    need = MEASURED_MIN_SHARE * n_asked
    missing = p.observed < need
    if missing.all():
        raise InputError(f"run {r.name!r}: none of the {_count(k, 'row')} has a loss for at least half of the {n_asked:,} "
                         f"probe tokens; there is no mean probe loss to measure")  # fmt: skip
    kept = np.flatnonzero(~missing)
    q = _parts(arr[kept], sel) if missing.any() else p  # the tokens with a loss at every row kept
    keep = q.counts == kept.size
    if sel is not None:
        keep &= sel
    n_kept = int(np.count_nonzero(keep))
    names = _row_names(r, idx)
    lacking = n_asked - p.observed  # tokens asked for without a loss, per row
    worst = [int(i) for i in kept[np.argsort(-lacking[kept], kind="stable")][:3] if lacking[i] > 0]
    where = ", ".join(f"{names[i]}: {int(lacking[i]):,} missing" for i in sorted(worst))
    if n_kept < need:
        raise InputError(
            f"run {r.name!r}: only {n_kept:,} of the {n_asked:,} probe tokens have a loss at every one of the "
            f"{_count(kept.size, 'row')} measured; the rest miss one at some (most at {where}). A mean over other tokens at "
            f"each row would be biased, and one over that minority is not the probe's mean loss: record the missing losses "
            f"again, or fit from later rows (--axis-min) if they are the early ones"
        )
    notes = []
    if missing.any():
        why = ", ".join(f"{names[i]} ({'no loss' if p.observed[i] == 0 else f'{p.observed[i] / n_asked:.0%} of the tokens'})"
                        for i in np.flatnonzero(missing)[:6]) + (", ..." if missing.sum() > 6 else "")  # fmt: skip
        notes.append(f"{_count(int(missing.sum()), 'row')} with a loss for fewer than half of the {n_asked:,} tokens left "
                     f"out of the measured mean: {why}; no measured -dL/dx there, and out of the scores")  # fmt: skip
    if n_kept < n_asked:
        notes.append(f"the measured mean is over the {n_kept:,} tokens with a loss at every measured row: {n_asked - n_kept:,} "
                     f"of {n_asked:,} ({(n_asked - n_kept) / n_asked:.1%}) miss one at some rows (most at {where or 'none'}) "
                     f"and are left out at every row (and out of the events), since a mean over whichever tokens each "
                     f"row has is biased where they are missing")  # fmt: skip
    loss = np.full(k, np.nan)
    loss[kept] = q.full / n_kept
    return MeasuredMean(loss=loss, tokens=keep, n_asked=n_asked, missing=missing, notes=tuple(notes))


def mean_probe_loss(r, rows: np.ndarray | None = None, *, tokens: np.ndarray | None = None) -> np.ndarray:
    """Mean loss over tokens [K] of the given rows of run ``r`` (all committed rows by default),
    computed with dask over token chunks; each row over the tokens with a loss in it (NaN
    losses, non-finite when recorded, are skipped; NaN where a row has none).
    ``tokens`` [N] (bool): only the tokens where it is true (default: all).

    The plain per-row mean: where some tokens miss a loss at some rows only, each row's mean is
    over a different set of tokens, and it warns (:class:`MeasuredMeanWarning`). A curve to
    differentiate or compare along the axis wants :func:`measured_mean_loss`, one set of tokens
    at every row (what the reconstruction measures); a single row's mean is this.

    Each chunk (all rows x 262,144 tokens by default) is summed in slices of
    :data:`_MEAN_SLICE` tokens: a float64 copy of a whole chunk and nanmean's temporaries held
    1-1.5 GB a thread for a 200-row run."""
    arr, sel, _ = _selection(r, rows, tokens)
    p = _parts(arr, sel)
    rows_seen = int(np.count_nonzero(p.observed))
    partial = int(np.count_nonzero((p.counts > 0) & (p.counts < rows_seen)))
    if partial:
        warnings.warn(f"run {r.name!r}: {partial:,} tokens have a loss at some of the {rows_seen} rows only, so each row's "
                      f"mean probe loss is over other tokens (measured_mean_loss: over one set of tokens)",
                      MeasuredMeanWarning, stacklevel=2)  # fmt: skip
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(p.observed > 0, p.raw / np.maximum(p.observed, 1), np.nan)


def _selection(r, rows, tokens):
    """(the dask array of ``rows`` of run ``r``, chunked over tokens only; the token mask or None; tokens asked for)."""
    arr = r.to_dask()
    if rows is not None:
        arr = arr[_row_indices(rows, arr.shape[0])]
    if arr.numblocks[0] != 1:
        arr = arr.rechunk({0: -1})
    n = arr.shape[1]
    if tokens is None:
        return arr, None, n
    tokens = as_values("tokens", tokens, "flag")  # token indices (or 0.2) cast to bools were another selection
    if tokens.shape != (n,):
        raise InputError(f"tokens: expected {n} booleans, got shape {tokens.shape}")
    if not tokens.any():
        raise InputError("tokens: no token selected for the mean probe loss")
    return arr, tokens, int(np.count_nonzero(tokens))


def _row_indices(rows, k: int) -> np.ndarray:
    """``rows`` as int64 indices of a run's ``k`` rows: integers (numpy's rule: -1 is the last)
    or a boolean mask of ``k``. A float row (2.7), one past the run and a masked array with masked
    values were dask's IndexError or, masked, rows the caller had masked out; a mask's row names
    in the notes were its bools."""
    a = as_array("rows", rows, "biu", "row indices or a boolean mask")
    if a.ndim != 1:
        raise InputError(f"rows: expected a 1-D array of row indices or a boolean mask, got shape {a.shape}")
    if a.dtype.kind == "b":
        if a.size != k:
            raise InputError(f"rows: a boolean mask needs one value for each of the {k} rows, got {a.size}")
        return np.flatnonzero(a)
    if a.size and (int(a.min()) < -k or int(a.max()) >= k):
        raise InputError(f"rows: expected indices of the run's {k} rows, got {int(a.min())}..{int(a.max())}")
    return np.where(a < 0, a + k, a).astype(np.int64)


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'s' * (n != 1)}"


def _listed(values, most: int = 6) -> str:
    v = [f"{float(a):.3g}" for a in np.asarray(values).reshape(-1)]
    return ", ".join(v[:most]) + (", ..." if len(v) > most else "")


_AXIS_ROW = {"T": "step", "D": "data budget", "M": "model size"}


def _row_names(r, idx: np.ndarray) -> list[str]:
    """Each row of ``idx`` by its axis value: 'step 0', 'data budget 1e+09'."""
    av = np.asarray(r.axis_values[: r.n_committed], np.float64)[idx]
    noun = _AXIS_ROW.get(getattr(r, "axis", ""), "axis value")
    return [f"{noun} {v:g}" for v in av]


class _Parts(NamedTuple):
    raw: np.ndarray  # [K] each row's sum of its selected tokens' losses
    observed: np.ndarray  # [K] how many selected tokens have a loss in each row
    full: np.ndarray  # [K] each row's sum over the selected tokens with a loss at every row
    counts: np.ndarray  # [N] rows at which each token has a loss (0 for a token not selected)


def _parts(arr, tokens: np.ndarray | None) -> _Parts:
    """The sums and counts of :class:`_Parts` over ``arr [K, N]`` (chunked over tokens only), one
    task per chunk; the chunks added in order."""
    import dask

    bounds = np.cumsum((0,) + tuple(arr.chunks[1]))
    tasks = [dask.delayed(_block_parts, pure=True)(block, None if tokens is None else tokens[a:e])
             for block, a, e in zip(arr.to_delayed()[0], bounds[:-1], bounds[1:])]  # fmt: skip
    parts = dask.compute(*tasks)
    return _Parts(
        raw=np.stack([p[0] for p in parts]).sum(axis=0), observed=np.stack([p[1] for p in parts]).sum(axis=0),
        full=np.stack([p[2] for p in parts]).sum(axis=0), counts=np.concatenate([p[3] for p in parts]),
    )  # fmt: skip


_MEAN_SLICE = 16384  # tokens of a chunk converted to float64 at once


def _block_parts(block: np.ndarray, keep: np.ndarray | None):
    """(raw [K], observed [K], full [K], counts [B]) of :class:`_Parts` over ``block [K, B]``."""
    k, b = block.shape
    raw, full, observed = np.zeros(k), np.zeros(k), np.zeros(k, np.int64)
    counts = np.zeros(b, np.int64)
    for a in range(0, b, _MEAN_SLICE):
        part = block[:, a : a + _MEAN_SLICE].astype(np.float64)
        seen = ~np.isnan(part)
        if keep is not None:
            seen &= keep[None, a : a + _MEAN_SLICE]
        vals = np.where(seen, part, 0.0)
        sums = vals.sum(axis=1)
        raw += sums
        observed += seen.sum(axis=1)
        c = seen.sum(axis=0)
        counts[a : a + part.shape[1]] = c
        every = c == k
        if every.all():
            full += sums
        elif every.any():
            full += vals[:, every].sum(axis=1)
    return raw, observed, full, counts
