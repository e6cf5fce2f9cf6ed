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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import InputError
from .fit.models import SHARE_MIN_NET
from .spectrum import Events, PowerLaw, Spectrum, learning_time_spectrum, loss_power_law, run_events, spectrum_power_law

__all__ = ["Reconstruction", "measured_derivative", "reconstruct", "reconstruct_run", "reconstruct_across", "scores"]


def measured_derivative(x, loss, *, smoothing: float | None = None) -> np.ndarray:
    """``-dL/dx`` [K] of a curve sampled at increasing x [K], by local quadratic regression.

    At each point a quadratic in ``x - x_k`` is fitted by least squares with Gaussian weights
    of standard deviation ``smoothing`` decades (default: 1.5 x the median spacing of x, so a
    handful of neighbours count), widened where needed to reach the 3 nearest other points;
    its slope is the derivative (exact for a quadratic). NaN losses are skipped.
    """
    x, loss = np.asarray(x, np.float64), np.asarray(loss, np.float64)
    if x.ndim != 1 or x.shape != loss.shape:
        raise InputError(f"x and loss: expected two 1-D arrays of one length, got {x.shape} and {loss.shape}")
    if x.size < 3:
        raise InputError(f"a derivative needs at least 3 axis points, got {x.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.diff(x) > 0)):
        raise InputError("x must be finite and strictly increasing")
    h = 1.5 * float(np.median(np.diff(x))) if smoothing is None else float(smoothing)
    if not (math.isfinite(h) and h > 0):
        raise InputError(f"smoothing must be a positive number of decades, got {smoothing}")
    ok = np.isfinite(loss)
    if ok.sum() < 3:
        raise InputError(f"a derivative needs at least 3 finite loss values, got {int(ok.sum())}")
    xo, lo = x[ok], loss[ok]
    out = np.empty(x.size)
    for k, xk in enumerate(x):
        d = xo - xk
        # LOESS-style floor: the 3 nearest other points lie within 2 bandwidths (weight >= e^-2;
        # the ends of a geometric grid are sparse), so the local quadratic is always determined.
        hk = max(h, 0.5 * float(np.sort(np.abs(d))[min(3, d.size - 1)]))
        w = np.sqrt(np.exp(-0.5 * (d / hk) ** 2))
        A = np.stack([np.ones_like(d), d, d * d], axis=1) * w[:, None]
        coef, *_ = np.linalg.lstsq(A, lo * w, rcond=None)
        out[k] = -coef[1]
    return out


def scores(predicted, measured) -> dict:
    """R^2 and relative L2 error of a predicted curve against a measured one."""
    p, m = np.asarray(predicted, np.float64), np.asarray(measured, np.float64)
    ok = np.isfinite(p) & np.isfinite(m)
    if ok.sum() < 2:
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
        ``SHARE_MIN_NET`` of its range, so a share would be unbounded).
    drop_share_well_fitted : share carried by events whose fit converged with R^2 >= r2_min.
    spectrum : the :class:`Spectrum`; ``spectrum_power_law``/``loss_power_law`` the exponents.
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

    def summary(self) -> dict:
        """The scalar results, JSON-able. ``*_interior``: the scores without the two end points."""
        inner = slice(1, -1)
        ev_in, sp_in = scores(self.from_events[inner], self.measured[inner]), scores(self.from_spectrum[inner], self.measured[inner])
        return {
            "run": self.run, "axis": self.axis, "n_points": int(self.x.size), "n_tokens": self.n_tokens,
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
    """
    x, mean_loss = np.asarray(x, np.float64), np.asarray(mean_loss, np.float64)
    if not isinstance(events, Events):
        raise InputError(f"events must be an Events, got {type(events).__name__}")
    measured = measured_derivative(x, mean_loss, smoothing=smoothing)
    if at is None:
        at, jac = x, np.ones_like(x)
    else:
        at = np.asarray(at, np.float64)
        if at.shape != x.shape or not (np.all(np.isfinite(at)) and np.all(np.diff(at) > 0)):
            raise InputError(f"at: expected {x.size} finite, increasing positions on the events' axis, got shape {at.shape}")
        jac = np.gradient(at, x)  # d at / dx
    h_s = 1.5 * float(np.median(np.diff(x))) if smoothing is None else float(smoothing)
    spec = learning_time_spectrum(events, bandwidth=bandwidth, placement=placement, kernel=kernel)
    # The events' share of L (the spectrum above has refused an empty set): its -d/dx through
    # the measurement's estimator is the prediction, and its fall over the range their drop.
    curve = events.curve(at)
    extra = np.zeros_like(x)
    if loss_offset is not None:
        offset = np.asarray(loss_offset, np.float64)
        if offset.shape != x.shape or not np.all(np.isfinite(offset)):
            raise InputError(f"loss_offset: expected {x.size} finite values, got shape {offset.shape}")
        curve = curve + offset
        extra = measured_derivative(x, offset, smoothing=h_s)
    from_events = measured_derivative(x, curve, smoothing=h_s)
    analytic = events.derivative(at) * jac + extra
    from_spectrum = spec.at(at) * jac + extra
    s_ev, s_an, s_sp = scores(from_events, measured), scores(analytic, measured), scores(from_spectrum, measured)
    finite = mean_loss[np.isfinite(mean_loss)]
    measured_drop = float(finite[0] - finite[-1])
    ev_drop = float(curve[0] - curve[-1])
    well = events.subset(events.well_fitted)
    well_drop = float(well.curve(at[:1])[0] - well.curve(at[-1:])[0]) if len(well) else 0.0
    try:
        spl = spectrum_power_law(events, bandwidth=spec.bandwidth, n_boot=n_boot, seed=seed, placement=placement,
                                 kernel=kernel, spectrum=spec)
    except InputError:
        spl = None
    try:
        lpl = loss_power_law(x, mean_loss)
    except InputError:
        lpl = None
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
    :func:`tokdyn.spectrum.events_from_fit`), or ``events`` already made from it."""
    from .fit.job import fitted_inputs

    events = run_events(run, which=which) if events is None else events  # StoreError if not fitted
    rows, x = fitted_inputs(run)  # the rows the fit was made on (after any axis_min)
    # The mean over the tokens the events are normalised by (n_scored: the fit saw a point of
    # theirs), never over a token the fit set aside: one token at 2e4 nats (above max_loss,
    # unfit) made the "measured" mean a curve of that token alone, the events' share near 0.
    scored = np.asarray(run.fit.read(fields=("n_points",))["n_points"]) > 0
    return reconstruct(x, mean_probe_loss(run, rows, tokens=None if scored.all() else scored), events, axis=run.axis, run=run.name, bandwidth=bandwidth,
                       smoothing=smoothing, n_boot=n_boot, seed=seed, placement=placement, kernel=kernel)  # fmt: skip


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
    lies below that fit window is refused (:class:`InputError`), not extrapolated."""
    from .axes import effective_steps, source_runs
    from .fit.job import fit_inputs, stored_axis_min

    events = run_events(t_run, which=which)  # StoreError if T is not fitted
    rows, x = fit_inputs(axis_run)
    steps = effective_steps(axis_run, t_run, by=by)[rows]
    window = stored_axis_min(t_run)
    if window is not None and np.any(steps < window):
        raise InputError(
            f"{int(np.sum(steps < window))} of the {steps.size} {axis_run.axis} points lie at effective steps below "
            f"{t_run.name!r}'s fit window (from step {window:g}; the first at {steps.min():.3g}): its events would be "
            f"extrapolated there. Refit it with a lower --axis-min"
        )
    at = np.log10(steps)
    offset = None
    if annealing is not None:
        from .annealing import decay_schedule

        srcs = source_runs(axis_run)
        offset = -np.array([annealing.gain(decay_schedule(srcs[int(k)])) for k in rows])
    label = f"{axis_run.name} from {t_run.name}" + (" with the annealing gain" if annealing is not None else "")
    rec = reconstruct(x, mean_probe_loss(axis_run, rows), events, axis=axis_run.axis, run=label,
                      bandwidth=bandwidth, smoothing=smoothing, n_boot=0, kernel=kernel, at=at, loss_offset=offset)  # fmt: skip
    return rec


def mean_probe_loss(r, rows: np.ndarray | None = None, *, tokens: np.ndarray | None = None) -> np.ndarray:
    """Mean loss over tokens [K] of the given rows of run ``r`` (all committed rows by default),
    computed with dask over token chunks; NaN losses (non-finite when recorded) are skipped.
    ``tokens`` [N] (bool): only the tokens where it is true (default: all).

    Each chunk (all rows x 262,144 tokens by default) is summed in slices of
    :data:`_MEAN_SLICE` tokens: a float64 copy of a whole chunk and nanmean's temporaries held
    1-1.5 GB a thread for a 200-row run."""
    arr = r.to_dask()
    if rows is not None:
        arr = arr[np.asarray(rows)]
    k, nb = arr.shape[0], arr.numblocks[1]
    if tokens is not None:
        tokens = np.asarray(tokens, bool)
        if tokens.shape != (arr.shape[1],):
            raise InputError(f"tokens: expected {arr.shape[1]} booleans, got shape {tokens.shape}")
        if not tokens.any():
            raise InputError("tokens: no token selected for the mean probe loss")
        arr = arr.map_blocks(_only_tokens, tokens, dtype=arr.dtype)
    parts = arr.map_blocks(_nan_sums, chunks=(k, 2), dtype=np.float64).compute()  # [K, 2 nb]
    sums = parts.reshape(k, nb, 2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sums[:, 1] > 0, sums[:, 0] / np.maximum(sums[:, 1], 1), np.nan)


def _only_tokens(block: np.ndarray, tokens: np.ndarray, block_info=None) -> np.ndarray:
    """``block`` with the tokens not selected by ``tokens`` [N] set to NaN (skipped by the mean)."""
    a, b = block_info[0]["array-location"][1]
    keep = tokens[a:b]
    return block if keep.all() else np.where(keep[None, :], block, np.nan).astype(block.dtype, copy=False)


_MEAN_SLICE = 16384  # tokens of a chunk converted to float64 at once


def _nan_sums(block: np.ndarray) -> np.ndarray:
    """[K, 2]: each row's sum of its finite losses and their count, over ``block [K, B]``."""
    out = np.zeros((block.shape[0], 2))
    for a in range(0, block.shape[1], _MEAN_SLICE):
        part = block[:, a : a + _MEAN_SLICE].astype(np.float64)
        seen = ~np.isnan(part)
        out[:, 0] += np.where(seen, part, 0.0).sum(axis=1)
        out[:, 1] += seen.sum(axis=1)
    return out
