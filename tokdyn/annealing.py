"""The loss a learning-rate decay gains over the constant-rate trunk it branches from.

Tissue et al. (2024, "Scaling law with learning rate annealing") write the loss after ``s``
updates of any schedule as ``L(s) = L0 + A * S1^-alpha - C * S2``: ``S1`` the forward area
under the learning rate, ``S2`` the annealing area (:func:`annealing_area`, the
area the rate has lost, through a momentum that makes long decays saturate). A branch of
:func:`tokdyn.sweep.branched_decay_sweep` that ends at budget ``B`` is therefore the trunk at
the step of the same ``S1`` (:func:`tokdyn.axes.effective_steps` ``by="lr_area"``), minus
``C * S2`` of its decay. The trunk's T events carry the first part; :class:`AnnealingGain`
carries the second, calibrated on branches that are *not* the D points being predicted (the
sweep's calibration branches), so that D is predicted with no fit on D
(:func:`tokdyn.reconstruct.reconstruct_across` ``annealing=``).

``C`` and the momentum are the same for every token here: the gain is calibrated on the mean
probe loss, which is what the D axis's derivative is scored on (per-token least squares with a
shared momentum would give the same mean).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ._checks import is_real
from .errors import InputError

__all__ = ["AnnealingGain", "AnnealingWarning", "annealing_area", "branch_gains", "fit_annealing_gain", "decay_schedule"]

# log10(1 - momentum) searched by fit_annealing_gain, from momentum 0 up: memories of 1 to 10^4 updates
_LOG_FORGET = np.linspace(0.0, -4.0, 161)
MIN_BRANCHES = 3


class AnnealingWarning(UserWarning):
    """A calibration that holds with a caveat (its branches do not tell the momentum)."""


@dataclass(frozen=True)
class AnnealingGain:
    """``gain = coef * S2(decay, momentum)`` nats, what a decay takes off the trunk's loss at equal
    forward lr area. ``n_branches`` and ``rms`` (nats) describe the calibration; ``branches``
    names its runs."""

    coef: float
    momentum: float
    n_branches: int = 0
    rms: float = float("nan")
    branches: tuple[str, ...] = ()

    def gain(self, decay_lr: Sequence[float]) -> float:
        """Nats gained by a decay of lr / peak ``decay_lr`` [d] (see :func:`annealing_area`)."""
        return self.coef * annealing_area(decay_lr, momentum=self.momentum)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["branches"] = list(self.branches)
        return d


def annealing_area(decay_lr: Sequence[float], *, momentum: float) -> float:
    """Tissue et al.'s (2024) annealing area ``S2`` of a decay from the peak rate, in steps at the peak.

    ``decay_lr`` [d] is lr / peak at each update of the decay (the rate before it is the peak).
    With ``m_i = momentum * m_{i-1} + (eta_{i-1} - eta_i)`` and ``m_0 = 0``, ``S2 = sum_i m_i``:
    for a decay much shorter than ``1 / (1 - momentum)`` steps it is the area between the peak
    and the decayed rate; a longer one saturates near ``(peak - end) / (1 - momentum)``, so the
    loss gained by annealing, ``C * S2``, stops growing with the decay's length.
    """
    if not is_real(momentum) or not 0 <= momentum < 1:
        raise InputError(f"momentum must be a number in [0, 1), got {momentum!r}")
    try:  # a string among the rates was a ValueError from numpy
        eta = np.asarray(decay_lr, np.float64)
    except (TypeError, ValueError):
        raise InputError(f"decay_lr must be a finite 1-D sequence of lr / peak values, got {decay_lr!r}") from None
    if eta.ndim != 1 or not np.all(np.isfinite(eta)):
        raise InputError("decay_lr must be a finite 1-D sequence of lr / peak values")
    _check_fractions(eta, "decay_lr")
    # S2 = sum_i m_i = sum_j d_j * (1 + momentum + ... + momentum^(n-1-j)), d_j = eta_{j-1} - eta_j:
    # the recursion summed in closed form (a Python loop took 0.15 s for a decay of 1e5 updates,
    # and fit_annealing_gain runs it 161 times a branch)
    n = eta.size
    drops = -np.diff(eta, prepend=1.0)
    if momentum == 0:
        return float(drops.sum())
    k = np.arange(n, 0, -1, dtype=np.float64)  # updates each drop is remembered for
    weights = -np.expm1(k * np.log(momentum)) / (1.0 - momentum)
    return float(drops @ weights)


def _check_fractions(eta: np.ndarray, where: str) -> None:
    """lr / peak values lie in [0, 1]: a decay given in percent of the peak (99.5) or in the rate
    itself (3e-4) computed an annealing area of another scale and calibrated a wrong gain."""
    bad = (eta < 0) | (eta > 1 + 1e-9)
    if bad.any():
        v = float(eta[bad][0])
        raise InputError(f"{where} must hold lr / peak, fractions of the peak rate in [0, 1] (not percent, not the rate "
                         f"itself); found {v:g}")  # fmt: skip


def decay_schedule(run) -> list[float]:
    """lr / peak of each update of a branch's decay: its ``attrs["decay_lr"]`` (written by
    :func:`tokdyn.sweep.branched_decay_sweep`)."""
    sched = run.attrs.get("decay_lr")
    if not isinstance(sched, list) or not sched:
        raise InputError(f"run {run.name!r} has no 'decay_lr' attribute (the lr / peak of its decay's updates)")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in sched)
    if not ok:  # float() of a string raised ValueError, of a list TypeError, and NaN reached the fit
        raise InputError(f"run {run.name!r}: its 'decay_lr' attribute must hold finite numbers (lr / peak), got {sched[:8]!r}")
    _check_fractions(np.array(sched, np.float64), f"run {run.name!r}: its 'decay_lr' attribute")
    return [float(v) for v in sched]


def _trunk_loss_at_area(trunk, areas: np.ndarray, measured=None) -> np.ndarray:
    """The trunk's measured mean probe loss at the steps where its lr area equals ``areas``,
    linear in log10 step between its recorded steps. ``measured``: the trunk's
    :func:`~tokdyn.reconstruct.measured_mean_loss`, where the caller has it already (one set of
    tokens at every row: a mean over whichever tokens each row has bends the curve where some
    are missing)."""
    from .axes import lr_area_table
    from .reconstruct import edge_tolerance, measured_mean_loss

    t_steps, t_area = lr_area_table(trunk)  # checked: a reversed or NaN table misreads every area
    if areas.min() < t_area.min() or areas.max() > t_area.max():
        raise InputError(f"areas {areas.min():g}-{areas.max():g} fall outside T run {trunk.name!r}'s {t_area.min():g}-{t_area.max():g}")
    at = np.interp(areas, t_area, t_steps)
    steps = trunk.coord("step")[: trunk.n_committed].astype(np.float64)
    loss = (measured if measured is not None else measured_mean_loss(trunk)).loss
    ok = (steps > 0) & np.isfinite(loss)
    if np.count_nonzero(ok) < 2:
        raise InputError(f"T run {trunk.name!r} has {np.count_nonzero(ok)} measured rows at steps > 0; reading its loss needs 2")
    lo, hi = steps[ok].min(), steps[ok].max()
    # The lr-area table may reach beyond the rows recorded (a trunk still being recorded, or one
    # that stopped): np.interp held the last measured loss there, and every such gain was wrong.
    # Within half a recorded interval of either end (at most 0.02 decades) the edge's loss
    # stands (steps 0..1999 and a branch at step 2000).
    lo_tol, hi_tol = edge_tolerance(np.log10(steps[ok]))
    out = (at < lo * 10**-lo_tol) | (at > hi * 10**hi_tol)
    if out.any():
        raise InputError(f"{int(out.sum())} of the {at.size} lr areas fall at steps {at[out].min():.4g}-{at[out].max():.4g} of "
                         f"T run {trunk.name!r}, outside the steps where its mean loss was measured ({lo:g}-{hi:g}); "
                         "record the trunk over them, or leave those branches out")  # fmt: skip
    return np.interp(np.log10(at), np.log10(steps[ok]), loss[ok])


def branch_gains(trunk, branches: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """For each branch run: its decay's lr / peak list, and the loss it gained, in nats: the
    trunk's mean probe loss at the branch's lr area minus the branch's final mean probe loss,
    both over the tokens the trunk has a loss for at every measured row
    (:func:`~tokdyn.reconstruct.measured_mean_loss`) and every branch at its final row (a
    warning says how many others are left out; a branch with a loss for fewer than half of them
    is an InputError). Branches must be on the trunk's probe.

    Returns ``(schedules, gains [K])``; ``schedules`` is a list of K lists.
    """
    from .axes import _positive, _same_place, check_same_probe
    from .reconstruct import MEASURED_MIN_SHARE, MeasuredMeanWarning, measured_mean_loss

    if trunk.axis != "T":
        raise InputError(f"the trunk must be a T run, got {trunk.name!r} of axis {trunk.axis}")
    branches = list(branches)
    for i, b in enumerate(branches):  # a mean over the trunk's tokens is read off each branch
        check_same_probe(trunk, b)
        if any(q.name == b.name and _same_place(q.store.url, b.store.url) for q in branches[:i]):  # weighed twice in the fit
            raise InputError(f"branch {b.name!r} of {b.store.url} is named twice among the branches; name each branch once")
    measured = measured_mean_loss(trunk)
    # One set of tokens on both sides: a branch whose final row lacks some tokens would be
    # averaged over others than the trunk (a NaN row gave a NaN gain, and C = 0 as if calibrated).
    have = measured.tokens.copy()
    rows = []  # each branch's final row, read once
    for b in branches:
        last = b.n_committed - 1
        if last < 0:
            raise InputError(f"branch {b.name!r} has no committed row")
        rows.append(b.losses(rows=slice(last, last + 1))[0])
        ok = np.isfinite(rows[-1]) & measured.tokens
        if np.count_nonzero(ok) < MEASURED_MIN_SHARE * measured.n_tokens:
            raise InputError(f"branch {b.name!r}: its final row has a loss for {np.count_nonzero(ok):,} of the trunk's "
                             f"{measured.n_tokens:,} tokens, fewer than half; leave it out of the calibration")  # fmt: skip
        have &= ok
    if np.count_nonzero(have) < measured.n_tokens:
        if np.count_nonzero(have) < MEASURED_MIN_SHARE * measured.n_tokens:
            raise InputError(f"the branches' final rows share a loss for {np.count_nonzero(have):,} of the trunk's "
                             f"{measured.n_tokens:,} tokens, fewer than half; leave out the branches that miss the most")  # fmt: skip
        warnings.warn(f"annealing gain: {measured.n_tokens - np.count_nonzero(have):,} of the trunk's {measured.n_tokens:,} "
                      "tokens lack a loss at some branch's final row and are left out of every gain",
                      MeasuredMeanWarning, stacklevel=2)  # fmt: skip
        measured = measured_mean_loss(trunk, tokens=have)
    areas, final, scheds = [], [], []
    for b, row in zip(branches, rows):
        a = b.attrs.get("lr_area")
        if not _positive(a):
            raise InputError(f"branch {b.name!r} has no positive, finite 'lr_area' attribute (found {a!r})")
        scheds.append(decay_schedule(b))
        areas.append(float(a))
        final.append(float(row[measured.tokens].astype(np.float64).mean()))  # every one a loss: have
    return scheds, _trunk_loss_at_area(trunk, np.array(areas), measured) - np.array(final)


def fit_annealing_gain(trunk, branches: Sequence) -> AnnealingGain:
    """Calibrate :class:`AnnealingGain` on ``branches`` (runs of decays off ``trunk``; at least 3).

    For each momentum of a grid (``1 - momentum`` from 1e-4 to 1, 161 values log-spaced) the
    coefficient is the non-negative least-squares one, ``C = max(0, <S2, g> / <S2, S2>)``; the
    pair with the smallest squared error wins (ties: the smaller momentum). Deterministic.
    Pass branches that are not the points you then predict.
    """
    branches = list(branches)  # a generator had no len()
    if len(branches) < MIN_BRANCHES:
        raise InputError(f"calibrating the annealing gain needs at least {MIN_BRANCHES} branches, got {len(branches)}")
    scheds, g = branch_gains(trunk, branches)
    best, any_area, shapes = None, False, []
    for lf in _LOG_FORGET:  # momentum rising: a tie keeps the smaller
        lam = 1.0 - 10.0**lf
        s2 = np.array([annealing_area(s, momentum=lam) for s in scheds])
        any_area |= float(s2 @ s2) > 0
        c = max(0.0, float(s2 @ g) / float(s2 @ s2)) if float(s2 @ s2) > 0 else 0.0
        sse = float(((c * s2 - g) ** 2).sum())
        if best is None or sse < best[0] - 1e-12 * float(g @ g):  # lower beyond rounding
            best = (sse, c, lam)
        if float(s2 @ s2) > 0:
            shapes.append(s2 / np.sqrt(s2 @ s2))
    if not any_area:  # no rate below the peak: S2 is 0 at every momentum, and C = 0 came back as if calibrated
        raise InputError(f"none of the {len(scheds)} branches has an annealing area (their 'decay_lr' never falls below "
                         "the peak rate), so they say nothing of what a decay gains; calibrate on decayed branches")  # fmt: skip
    if max(float(np.abs(u - shapes[0]).max()) for u in shapes) < 1e-6:
        # S2 of every branch scales alike with the momentum (one decay shape: a fixed-length cooldown),
        # so every momentum fits as well: the one kept (the smallest) is not measured, and a decay of
        # another length is predicted with it by chance (momentum 0.9999 gave 9x the true gain)
        warnings.warn(f"annealing gain: the {len(scheds)} branches' decays have one shape, so they do not tell the "
                      f"momentum; momentum {best[2]:g} is kept (the smallest that fits), and the gain holds only for "
                      "decays of that shape; calibrate on decays of different lengths to measure it",
                      AnnealingWarning, stacklevel=2)  # fmt: skip
    sse, c, lam = best
    return AnnealingGain(coef=c, momentum=float(lam), n_branches=len(branches), rms=float(np.sqrt(sse / len(branches))),
                         branches=tuple(b.name for b in branches))  # fmt: skip
