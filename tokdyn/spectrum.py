"""The learning-time spectrum: the loss-drop-weighted density of learning times on a log axis.

docs/method.md, "From events to the loss curve". Every fitted learning event ``(mu_i, s_i, delta_i)`` puts its loss drop
``delta_i`` (nats) at its learning time ``mu_i`` (log10 of the axis); the spectrum

    rho(x) = (1/N) sum_i delta_i * K_h(x - mu_i)          [nats per decade, per token]

is the kernel density of those drops over all N probe tokens. Sharp events make ``rho`` the
derivative ``-dL/dx`` of the mean probe loss (the delta approximation, :mod:`tokdyn.reconstruct`),
and a power law ``rho ~ 10**(-alpha x)`` is a power law ``L(a) = L_inf + A a**(-alpha)``.
Not every event is sharp, so by default (``kernel="event"``) each event's kernel is its own
sigmoid's derivative convolved with ``K_h``; ``kernel="delta"`` is the point-mass version.

The functions here take plain arrays (:class:`Events`); :func:`run_events` reads them from a
fitted run of a store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ._event_grid import BETWEEN, CURVE, DERIVATIVE, GRID_MULTIPLE, event_cells, event_sums, resample_cells
from ._checks import as_curve, as_values, check_count, is_finite, is_int, is_whole
from ._text import shown
from .errors import InputError
from .fit.options import CLASS_CODES, STATUS_CODES, FitOptions

__all__ = [
    "Events",
    "Spectrum",
    "PowerLaw",
    "events_from_fit",
    "run_events",
    "fit_scored",
    "probe_units",
    "select_bandwidth",
    "learning_time_spectrum",
    "fit_power_law",
    "spectrum_power_law",
    "spectrum_power_law_window",
    "loss_power_law",
    "BANDWIDTH_RULES",
    "PLACEMENTS",
    "KERNELS",
    "spectra_by",
    "group_labels",
    "units_by_group",
]

BANDWIDTH_RULES = ("auto", "events", "widths", "silverman")
PLACEMENTS = ("mu", "seen")
KERNELS = ("event", "delta")
_LOGISTIC_SD = math.pi / math.sqrt(3.0)  # standard deviation of the logistic density of scale 1


@dataclass(frozen=True)
class Events:
    """Learning events of ``n_tokens`` probe tokens (a token may carry 0, 1 or 2 events).

    Attributes
    ----------
    token : int array [E]
        Token index of each event.
    mu, s, delta : float arrays [E]
        Learning time (log10 axis units), width (decades) and loss drop (nats) of each event.
    n_tokens : int
        The number of probe tokens (token indices lie in [0, n_tokens)).
    n_scored : int or None
        N, the number of tokens the density is normalised by: those observed at least once
        (tokens without an event count as zero drop; a token never scored, such as padding in an
        imported losses.npz, is not in the measured mean loss either). Default ``n_tokens``.
    x_range : (float, float)
        First and last observed x of the trajectories the events were fitted on.
    well_fitted : bool array [E]
        Whether the event's fit converged with R^2 >= the fit's ``r2_min``.
    resolution : float
        Typical spacing (decades) of the points the events were fitted on: no event can be
        placed more finely than that, so the spectrum is never smoothed less (0: unknown).
    unit : int array [N] or None
        The sampling unit of each token, which the spectrum's bootstrap resamples whole: tokens
        of one document are not independent draws (they share its topic, its style, the words
        it repeats), so resampling tokens one by one makes an interval too narrow. None: each
        token is its own unit. :func:`run_events` takes the probe's documents (its windows
        where the probe does not tell documents apart).
    unit_kind : str
        What a unit is, for messages: ``"token"`` (default), ``"document"``, ``"window"``.
    scored : bool array [N] or None
        Which tokens N counts, where it is known (:func:`events_from_fit`: the tokens the fit
        observed at least once); ``n_scored`` is then their number. A rate per token of a group
        of tokens (:meth:`n_scored_of`) divides by the group's scored tokens: a token never
        observed has no event, and counting it made its group's rate read low.
    """

    token: np.ndarray
    mu: np.ndarray
    s: np.ndarray
    delta: np.ndarray
    n_tokens: int
    x_range: tuple[float, float]
    well_fitted: np.ndarray = field(default=None)  # type: ignore[assignment]
    resolution: float = 0.0
    n_scored: int | None = None
    unit: np.ndarray | None = field(default=None, compare=False)
    unit_kind: str = "token"
    scored: np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # each a new native array (as_values): a float token, a masked value, a flag of 0.2 are refused
        arrays = {name: as_values(f"Events.{name}", getattr(self, name), "index" if name == "token" else "real")
                  for name in ("token", "mu", "s", "delta")}  # fmt: skip
        n = arrays["mu"].shape
        if len(n) != 1:
            raise InputError(f"Events.mu: expected a 1-D array, got shape {n}")
        for name, a in arrays.items():
            if a.shape != n:
                raise InputError(f"Events.{name}: expected a 1-D array of length {n[0]}, got shape {a.shape}")
        for name in ("mu", "s", "delta"):
            if not np.all(np.isfinite(arrays[name])):
                raise InputError(f"Events.{name}: every event needs a finite value")
        if np.any(arrays["s"] <= 0):
            raise InputError("Events.s: widths must be > 0")
        object.__setattr__(self, "n_tokens", check_count("Events.n_tokens", self.n_tokens))
        if arrays["token"].size and (arrays["token"].min() < 0 or arrays["token"].max() >= self.n_tokens):
            raise InputError("Events.token: token indices must lie in [0, n_tokens)")
        x_range = as_values("Events.x_range", self.x_range)
        if x_range.shape != (2,) or not (np.all(np.isfinite(x_range)) and x_range[1] > x_range[0]):
            raise InputError(f"Events.x_range: expected two finite x with first < last, got {shown(self.x_range)}")
        wf = np.ones(n, bool) if self.well_fitted is None else as_values("Events.well_fitted", self.well_fitted, "flag")
        if wf.shape != n:
            raise InputError(f"Events.well_fitted: expected length {n[0]}, got shape {wf.shape}")
        for name, a in arrays.items():
            object.__setattr__(self, name, a)
        object.__setattr__(self, "well_fitted", wf)
        object.__setattr__(self, "x_range", (float(x_range[0]), float(x_range[1])))
        if self.n_scored is not None and not (is_int(self.n_scored) or is_whole(self.n_scored)):
            raise InputError(f"Events.n_scored must be None or a whole number of tokens, got {shown(self.n_scored)}")
        if self.scored is not None:
            mask = as_values("Events.scored", self.scored, "flag")
            if mask.shape != (self.n_tokens,):
                raise InputError(f"Events.scored: expected a bool array of length n_tokens={self.n_tokens}, got "
                                 f"shape {mask.shape}")  # fmt: skip
            n = int(np.count_nonzero(mask))
            if self.n_scored is not None and int(self.n_scored) != n:
                raise InputError(f"Events.n_scored ({self.n_scored}) is not the number of tokens scored ({n})")
            object.__setattr__(self, "scored", mask)
            object.__setattr__(self, "n_scored", n)
        scored = self.n_tokens if self.n_scored is None else int(self.n_scored)
        if not 1 <= scored <= self.n_tokens:
            raise InputError(f"Events.n_scored must lie in [1, n_tokens={self.n_tokens}], got {self.n_scored}")
        object.__setattr__(self, "n_scored", scored)
        if not (is_finite(self.resolution) and self.resolution >= 0):
            raise InputError(f"Events.resolution must be a finite number >= 0, got {shown(self.resolution)}")
        object.__setattr__(self, "resolution", float(self.resolution))
        if self.unit is not None:
            unit = as_values("Events.unit", self.unit, "code")
            if unit.shape != (self.n_tokens,):
                raise InputError(f"Events.unit: expected an integer array of length n_tokens={self.n_tokens}, got "
                                 f"shape {unit.shape}")  # fmt: skip
            if not _dense_codes(unit):  # (a copy made by subset or replace is dense already: no sort again)
                unit = np.unique(unit, return_inverse=True)[1].reshape(-1)
            object.__setattr__(self, "unit", unit.astype(np.int64, copy=False))
        if not (isinstance(self.unit_kind, str) and self.unit_kind):
            raise InputError(f"Events.unit_kind: expected a name such as 'document', got {self.unit_kind!r}")

    def __len__(self) -> int:
        return int(self.mu.size)

    def subset(self, mask: np.ndarray) -> "Events":
        """The events where ``mask [E]`` is true (same N, so densities stay comparable)."""
        m = as_values("Events.subset: mask", mask, "flag")
        if m.shape != self.mu.shape:
            raise InputError(f"Events.subset: mask must have shape {self.mu.shape}, got {m.shape}")
        return self._take(np.flatnonzero(m))

    def _take(self, idx: np.ndarray) -> "Events":
        """The events at positions ``idx`` (ascending), unchecked: a part of checked events is
        valid, and checking it again read the whole probe's units and scored mask (N each), once
        a group in :func:`spectra_by` (tokens x groups: minutes for 10,000 domains of 20M tokens)."""
        part = object.__new__(Events)
        part.__dict__.update(self.__dict__)
        for name in ("token", "mu", "s", "delta", "well_fitted"):
            object.__setattr__(part, name, getattr(self, name)[idx])
        return part

    def units(self) -> tuple[np.ndarray, int]:
        """The unit index of each token [N] (0 .. G-1) and the number of units G."""
        if self.unit is None:
            return np.arange(self.n_tokens), self.n_tokens
        return self.unit, int(self.unit.max()) + 1

    def for_tokens(self, token_mask: np.ndarray) -> "Events":
        """The events of the tokens where ``token_mask [N]`` is true."""
        return self.subset(self._token_mask(token_mask, "for_tokens")[self.token])

    def scored_in(self, token_mask: np.ndarray) -> np.ndarray:
        """The tokens ``[N]`` where ``token_mask`` is true that are scored (all of them where
        :attr:`scored` is not known)."""
        t = self._token_mask(token_mask, "scored_in")
        return t if self.scored is None else t & self.scored

    def n_scored_of(self, token_mask: np.ndarray) -> int:
        """How many of the tokens where ``token_mask [N]`` is true are scored."""
        return int(np.count_nonzero(self.scored_in(token_mask)))

    def _token_mask(self, token_mask: np.ndarray, name: str) -> np.ndarray:
        t = as_values(f"Events.{name}: mask", token_mask, "flag")
        if t.shape != (self.n_tokens,):
            raise InputError(f"Events.{name}: mask must have shape ({self.n_tokens},), got {t.shape}")
        return t

    def curve(self, x: np.ndarray) -> np.ndarray:
        """The events' share of the mean loss at x [G]: ``(1/N) sum_i delta_i sigma(-(x-mu_i)/s_i)``.

        The sum of fitted sigmoids, up to a constant: its derivative is the events' prediction
        of ``dL/dx``. Compiled, one pass over the events (:func:`tokdyn._event_grid.event_sums`).
        """
        return _at_points(CURVE, self, x) / self.n_scored

    def derivative(self, x: np.ndarray) -> np.ndarray:
        """``-dL/dx`` of the events at x [G]: ``(1/N) sum_i delta_i sigma'((x-mu_i)/s_i) / s_i``."""
        return _at_points(DERIVATIVE, self, x) / self.n_scored

    def realized_drop(self) -> np.ndarray:
        """[E] the part of each event's drop that happens inside the observed x range (nats).

        ``delta * (sigma(-(x_first - mu)/s) - sigma(-(x_last - mu)/s))``: an event centred
        outside the range, or wider than it, was only partly seen, and the spectrum counts only
        what was seen (the censoring correction of the delta approximation).
        """
        lo, hi = self.x_range
        return self.delta * (_sigmoid(-(lo - self.mu) / self.s) - _sigmoid(-(hi - self.mu) / self.s))

    def seen_centre(self) -> np.ndarray:
        """[E] where each event's seen drop happens on average: the mean of x over the observed
        range, weighted by the event's sigmoid derivative. ``mu`` for an event well inside the
        range; inside the range, near the edge, for a censored one (its seen tail)."""
        lo, hi = self.x_range
        zl, zh = (lo - self.mu) / self.s, (hi - self.mu) / self.s
        gl, gh = _sigmoid(zl), _sigmoid(zh)
        seen = gh - gl
        # int_lo^hi x dG = hi G(hi) - lo G(lo) - s (softplus(zh) - softplus(zl)),  G(x) = sigma((x - mu)/s)
        moment = hi * gh - lo * gl - self.s * (np.logaddexp(0, zh) - np.logaddexp(0, zl))
        with np.errstate(divide="ignore", invalid="ignore"):
            centre = moment / seen
        return np.where((seen > 1e-9) & np.isfinite(centre), np.clip(centre, lo, hi), np.clip(self.mu, lo, hi))

    def positions(self, placement: str = "mu") -> np.ndarray:
        """[E] where the spectrum puts each event's seen drop: its learning time ``mu``
        (``"mu"``, the literal delta approximation; outside the range it lands on the edge), or
        :meth:`seen_centre` (``"seen"``)."""
        if placement not in PLACEMENTS:
            raise InputError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        lo, hi = self.x_range
        return np.clip(self.mu, lo, hi) if placement == "mu" else self.seen_centre()

    @property
    def total_drop(self) -> float:
        """``(1/N) sum_i delta_i``: the mean loss drop the events carry, in nats."""
        return float(self.delta.sum() / self.n_scored)


def _at_points(kind: int, events: Events, x) -> np.ndarray:
    """:func:`tokdyn._event_grid.event_sums` of the events at x (any shape)."""
    x = as_values("x", x)
    return event_sums(kind, events.mu, events.s, events.delta, x.ravel()).reshape(x.shape)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free logistic


EVENT_SETS = ("two_step", "bic", "classified")


# The fit fields events_from_fit needs (it also takes n_points where the fit has it).
EVENT_FIELDS = ("mu", "s", "delta", "status", "r2", "model", "class_code", "mu1", "s1", "delta1", "mu2", "s2", "delta2",
                "status2", "x_first", "x_last")  # fmt: skip


def events_from_fit(
    fit: Mapping[str, np.ndarray], *, which: str = "two_step", options: FitOptions | None = None
) -> Events:
    """The learning events of a fit (``read_fit`` fields, or ``SigmoidFit.to_dict()``).

    which : {"two_step", "bic", "classified"}
        Which fitted sigmoids make up the sum. ``"two_step"`` (default): both events of every
        token's two-sigmoid fit where that fit did not fail and the token has more than 7
        points (the two-sigmoid model's parameters), else its one sigmoid; a token
        learned in one step then has a second event of negligible drop, or two events that
        coincide. ``"bic"``: both events only where BIC chose the two-sigmoid model, else the
        one sigmoid. ``"classified"``: the events of :meth:`tokdyn.fit.SigmoidFit.events`, i.e.
        only tokens whose chosen model is a sigmoid, plus both events of ``multi_step`` tokens
        (the line of a ``gradual`` token and flat tokens carry none). In every set a token whose
        fits failed carries no event.
    options : FitOptions
        For ``r2_min``, which decides ``well_fitted`` (default ``FitOptions()``).
    """
    if which not in EVENT_SETS:
        raise InputError(f"which must be one of {EVENT_SETS}, got {which!r}")
    missing = [k for k in EVENT_FIELDS if k not in fit]
    if missing:
        raise InputError(f"a fit needs the fields {missing} to give events; pass read_fit(...) with all fields")
    f = {k: np.asarray(fit[k]) for k in EVENT_FIELDS}
    n = f["mu"].shape[0]
    if n == 0:
        raise InputError("the fit has no tokens")
    opts = options or FitOptions()
    good_status = (STATUS_CODES["converged"], STATUS_CODES["hit_bound"])
    sig_ok = np.isfinite(f["mu"]) & np.isfinite(f["s"]) & np.isfinite(f["delta"]) & (f["s"] > 0)
    two_ok = (
        np.isfinite(f["mu1"]) & np.isfinite(f["mu2"]) & np.isfinite(f["delta1"]) & np.isfinite(f["delta2"])
        & (f["s1"] > 0) & (f["s2"] > 0)
    )  # fmt: skip
    if which == "two_step":
        # Two sigmoids have 7 parameters: only a trajectory with more points than that can
        # carry them (on a short D or M axis every token keeps its one sigmoid).
        enough = np.asarray(fit["n_points"]) > 7 if "n_points" in fit else np.ones(n, bool)
        two = two_ok & enough & np.isin(f["status2"], good_status + (STATUS_CODES["singular"],))
        one = ~two & sig_ok
    elif which == "bic":
        two = (f["model"] == 3) & two_ok
        one = ~two & sig_ok
    else:
        two = (f["class_code"] == CLASS_CODES["multi_step"]) & two_ok
        one = ~two & (f["model"] >= 2) & sig_ok
    t1, t2 = np.flatnonzero(one), np.flatnonzero(two)
    good1 = np.isin(f["status"][t1], good_status) & (f["r2"][t1] >= opts.r2_min)
    # A two-sigmoid fit whose second event is not identified (singular: a one-step token's
    # redundant event) is as well fitted as that token's sigmoid: counting such tokens as badly
    # fitted put 1,000 clean one-step tokens (sigmoid R^2 >= 0.997) at 76 % of the drop.
    sigmoid_good = np.isin(f["status"], good_status) & (f["r2"] >= opts.r2_min)
    good2 = np.isin(f["status2"][t2], good_status) | ((f["status2"][t2] == STATUS_CODES["singular"]) & sigmoid_good[t2])
    x_first, x_last = np.nanmin(f["x_first"]), np.nanmax(f["x_last"])
    if not (np.isfinite(x_first) and np.isfinite(x_last)):
        raise InputError("the fit has no observed x range (every token unfit)")
    spacing = (f["x_last"] - f["x_first"]) / np.maximum(np.asarray(fit["n_points"]) - 1, 1) if "n_points" in fit else np.array([])
    spacing = spacing[np.isfinite(spacing) & (spacing > 0)]
    return Events(
        resolution=float(np.median(spacing)) if spacing.size else 0.0,
        token=np.concatenate([t1, t2, t2]),
        mu=np.concatenate([f["mu"][t1], f["mu1"][t2], f["mu2"][t2]]),
        s=np.concatenate([f["s"][t1], f["s1"][t2], f["s2"][t2]]),
        delta=np.concatenate([f["delta"][t1], f["delta1"][t2], f["delta2"][t2]]),
        n_tokens=n,
        x_range=(float(x_first), float(x_last)),
        well_fitted=np.concatenate([good1, good2, good2]),
        # never-scored tokens (no observed point) are in neither the measured mean nor N
        scored=fit_scored(fit),
    )


def fit_scored(fit: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """[N] the tokens a fit saw observed at least once (``n_points > 0``), or None where its
    fields do not say (every token). A token never scored, such as padding, is in no count."""
    return np.asarray(fit["n_points"]) > 0 if "n_points" in fit else None


def run_events(run, *, which: str = "two_step", fit: Mapping[str, np.ndarray] | None = None) -> Events:
    """The events of a fitted :class:`~tokdyn.store.Run` (its stored fit, or the fields already
    read from it as ``fit``, then :func:`events_from_fit` with the options it was fitted with)."""
    from .fit.job import stored_options

    with run.fit.unchanged():  # the fields and the options they were fitted with: of one fit
        events = events_from_fit(run.fit.read() if fit is None else fit, which=which, options=stored_options(run))
    probe = run.store.probe
    unit, kind = probe_units(probe)
    if unit.shape != (events.n_tokens,):
        return events
    # units chosen among the tokens scored: never-scored padding in a document of its own took the interval away
    # not down to tokens: a probe of one window keeps its one unit, and no interval (as one of two windows)
    return units_by_group(replace(events, unit=unit, unit_kind=kind), probe.token_arrays["sample_id"], tokens=False)


def probe_units(probe) -> tuple[np.ndarray, str]:
    """The sampling unit of each probe token as codes 0 .. G-1, and what a unit is: its document
    (``doc_id``) where the probe tells two documents apart, else its window (``sample_id``: a
    probe cut from one document, or from windows whose documents it does not know, as a
    curriculum pilot's), else the token itself (an imported probe whose ``sample_id`` numbers
    the tokens). Any dtype a probe array may have (an imported one's float or string ids) is
    coded by value."""
    arrays = probe.token_arrays
    n = len(arrays["sample_id"])
    for name, kind in (("doc_id", "document"), ("sample_id", "window")):
        if name in arrays:
            codes = np.unique(arrays[name], return_inverse=True)[1].reshape(-1).astype(np.int64)
            groups = int(codes.max()) + 1 if codes.size else 0
            if 1 < groups < n or (name == "sample_id" and groups == 1):
                return codes, kind
    return np.arange(n, dtype=np.int64), "token"


_FINER = {"document": ("window", "token"), "window": ("token",)}  # the sampling units below each


def units_by_group(events: Events, sample_id: np.ndarray, group: np.ndarray | None = None, *,
                   tokens: bool = True) -> Events:
    """``events`` whose sampling units (what a bootstrap resamples whole: :attr:`Events.unit`)
    give every group of tokens (``group [N]`` codes; None: the whole probe, one group) two at
    least among its scored tokens: the probe's own (documents where it tells them apart), and for
    a group whose scored tokens lie in one of them, its windows (``sample_id [N]``), else its
    tokens (with ``tokens=False``, never: it stays in its one window). The one rule of the
    spectrum's interval (:func:`run_events`, the whole probe) and of the curriculum's domain
    rates (:func:`tokdyn.curriculum.pilot_events`, each domain).

    A domain that is one document drew the same rate in every resample of documents: its error
    read 0, and its whole difference from the others, noise included, was kept as real. A probe of
    one scored document beside never-scored padding in another was resampled by documents, and
    its spectrum had no interval, where the same probe without the padding had one over windows."""
    unit, _ = events.units()
    n = events.n_tokens
    group = np.zeros(n, np.int64) if group is None else as_values("group", group, "code")  # 0.5, a masked code: no group
    levels = [(unit, events.unit_kind)]
    for kind in _FINER.get(events.unit_kind, ()):
        if kind == "token" and not tokens:
            continue
        codes = np.unique(np.asarray(sample_id), return_inverse=True)[1].reshape(-1) if kind == "window" else np.arange(n)
        if codes.shape == (n,):
            levels.append((codes.astype(np.int64), kind))
    # Each group's level: the first whose codes take two values among the group's scored tokens,
    # else the last; all groups in one pass a level (a mask a group read N tokens G times).
    values, code_of = np.unique(group, return_inverse=True)
    code_of = code_of.reshape(-1)
    scored = events.scored_in(np.ones(n, bool))
    gs = code_of[scored]
    at = np.full(values.size, len(levels) - 1, np.int64)
    open_ = np.ones(values.size, bool)
    for i, (codes, _) in enumerate(levels[:-1]):
        cs = codes[scored]
        one = np.zeros(values.size, cs.dtype)
        one[gs] = cs  # one scored token's code of each group: two values where another differs from it
        two = np.bincount(gs[cs != one[gs]], minlength=values.size) > 0
        at[open_ & two] = i
        open_ &= ~two
    chosen = at[code_of]  # the level each token's group is resampled at
    if not chosen.any():
        return events  # every group has two units of the probe's own kind at least
    picked = np.choose(chosen, [codes for codes, _ in levels])
    joint = chosen * (n + 1) + picked  # (level, unit): distinct values, which Events codes 0 .. G-1
    kinds = {levels[i][1] for i in np.unique(chosen)}
    return replace(events, unit=joint.astype(np.int64), unit_kind=kinds.pop() if len(kinds) == 1 else "sampling unit")


def _dense_codes(unit: np.ndarray) -> bool:
    """Whether the integer array ``unit`` already holds the codes 0 .. G-1, each used (cheaper
    than a sort)."""
    return not unit.size or (unit.min() >= 0 and bool(np.bincount(unit).all()))


# -- the density ---------------------------------------------------------------------------


# A power-law fit below this R^2 (of log rho, or of L) is reported as "not a power law" (the
# report, the spectrum command).
POWER_LAW_R2 = 0.8

# The most bootstrap resamples a spectrum's exponent interval takes (each is a pass over the
# events; 200, the default, gives the 2.5-97.5 percentiles to about 1 %).
MAX_BOOT = 10_000

# The narrowest window a spectrum's power law is fitted on, in resolution lengths (the larger of
# the bandwidth and the spacing of the points the events were fitted on). A density smoothed at
# that length has about W / length independent values over a window W (a generous count: values
# one bandwidth apart still correlate 0.78); a line takes 2 of them and needs 3 more to be judged
# by, the loss law's rule (LOSS_LAW_MIN_POINTS). Narrower, the smoothing alone makes log rho
# nearly straight whatever the events: 5 checkpoints over 4 decades left a window of 2 bandwidths
# and "alpha = -0.049, R^2 0.961" (uniform learning times). With the default bandwidth and K checkpoints
# evenly spaced in log, the window is K - 3 spacings: 8 checkpoints at least.
POWER_LAW_MIN_WIDTH = 5

# The fewest units (tokens, or the documents a run's probe tokens come from: Events.unit) a bootstrap
# interval of the spectrum's exponent is given from: Kish's effective number of units, each weighted
# by the loss drop its tokens' events show over the observed range (the bootstrap resamples units,
# so one document's drop among a hundred of noise is one unit). With one,
# every resample is the same spectrum scaled and the interval has zero width; with a handful the
# resamples take few distinct values and a percentile interval under-covers badly (its variance is
# (n-1)/n of the truth at best, and the bootstrap is not relied on below about 10 observations).
BOOT_MIN_TOKENS = 10

# The fewest fitted resamples a 95 % percentile interval is given from: the range of n draws covers
# on average (n-1)/(n+1) of their distribution, which reaches 95 % at n = 39; from fewer, even
# the whole range of the resamples is a narrower interval than the one printed.
BOOT_MIN_RESAMPLES = 39

# The narrowest kernel a spectrum is computed with, in decades (an explicit bandwidth below it is
# refused; Silverman's rule is floored there too).
MIN_BANDWIDTH = 1e-3


def select_bandwidth(events: Events, rule: str | float = "auto", *, placement: str = "mu", kernel: str = "event") -> float:
    """The kernel bandwidth of the spectrum, in decades, chosen from the events.

    rule : {"auto", "events", "widths", "silverman"} or a positive float
        ``"events"`` (what ``"auto"`` means): the Gaussian width ``h`` with which the spectrum
        comes closest (least squares over the observed range) to the events' own sum of sigmoid
        derivatives, never below the events' ``resolution`` (the spacing of the points they
        were fitted on). With ``kernel="delta"`` that is the one kernel that best stands in for
        all the event widths, searched on a log grid from 0.01 to 1 decade; with
        ``kernel="event"`` each event already carries its own width, the events' derivative is
        the spectrum's ``h -> 0`` limit, and the rule gives the smallest ``h`` allowed:
        ``max(0.01, resolution)``. ``"widths"``: the standard
        deviation of a typical event, ``(pi/sqrt 3) * median s`` weighted by |realized drop|.
        ``"silverman"``: Silverman's rule for the |delta|-weighted learning times
        (``0.9 min(sd, IQR/1.34) n_eff**-0.2``, Kish's effective sample size). None of them
        looks at the checkpoint grid (docs/method.md, "What we measured"); docs/method.md compares them.
    kernel : {"event", "delta"}
        The spectrum's kernel, see :func:`learning_time_spectrum`.
    """
    _check_kernel(kernel)
    if isinstance(rule, (int, float)) and not isinstance(rule, bool):
        if not (math.isfinite(rule) and rule > 0):
            raise InputError(f"bandwidth must be a positive number of decades, got {rule}")
        if rule < MIN_BANDWIDTH:  # the spectrum's grid and bins grow as 1/h: 1e-5 ran for minutes
            raise InputError(f"bandwidth must be at least {MIN_BANDWIDTH:g} decades (a factor {10 ** MIN_BANDWIDTH:.4f} on the axis, "
                             f"finer than any checkpoint spacing), got {rule:g}")  # fmt: skip
        return float(rule)
    if rule not in BANDWIDTH_RULES:
        raise InputError(f"bandwidth must be a positive float or one of {BANDWIDTH_RULES}, got {rule!r}")
    if len(events) == 0:
        raise InputError("no learning events: the spectrum is empty (no token's fit gave a sigmoid)")
    w = np.abs(events.realized_drop())
    if not w.sum() > 0:
        raise InputError("no event's loss drop falls inside the observed range: the spectrum is empty")
    if rule == "widths":  # widths may be as sharp as s_min (a step between two checkpoints)
        return float(max(_LOGISTIC_SD * _weighted_quantile(events.s, w, 0.5), MIN_BANDWIDTH))
    if rule == "silverman":
        mean = np.average(events.mu, weights=w)
        sd = math.sqrt(np.average((events.mu - mean) ** 2, weights=w))
        iqr = _weighted_quantile(events.mu, w, 0.75) - _weighted_quantile(events.mu, w, 0.25)
        spread = min(sd, iqr / 1.34) if iqr > 0 else sd
        n_eff = w.sum() ** 2 / (w**2).sum()
        return float(max(0.9 * spread * n_eff ** (-0.2), MIN_BANDWIDTH))
    if kernel == "event":
        # Smoothing an exact event shape only moves it away from the events' derivative, so
        # the least-squares h is the smallest searched, floored at the resolution as below.
        return max(_H_MIN, events.resolution)
    # "events"/"auto" with point masses: match the events' own derivative (a subsample bounds the cost).
    ev = events
    if len(ev) > 200_000:
        ev = ev.subset(np.random.default_rng(0).permutation(len(ev)) < 200_000)
    lo, hi = ev.x_range
    xs = np.linspace(lo, hi, 200)
    target = ev.derivative(xs)
    realized, centre = ev.realized_drop(), ev.positions(placement)
    best, best_err = None, np.inf
    for h in np.geomspace(_H_MIN, 1.0, 41):
        err = float(((_kde(centre, realized, xs, h, ev.x_range) / ev.n_scored - target) ** 2).sum())
        if err < best_err:
            best, best_err = float(h), err
    return max(best, events.resolution)


_H_MIN = 0.01  # decades: the finest bandwidth the "events" rule considers


def _check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise InputError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def _weighted_quantile(v: np.ndarray, w: np.ndarray, q: float) -> float:
    order = np.argsort(v)
    cw = np.cumsum(w[order])
    return float(v[order][min(np.searchsorted(cw, q * cw[-1]), v.size - 1)])


@dataclass(frozen=True)
class Spectrum:
    """A learning-time spectrum on a grid of x = log10(axis value).

    Attributes
    ----------
    x : [G] grid (log10 axis units); ``density`` [G] rho(x) in nats per decade per token.
    edges : [B+1] histogram bin edges; ``hist`` [B] the weighted histogram, same units.
    bandwidth : Gaussian kernel standard deviation, decades.
    kernel : ``"event"`` (each event spread over its own sigmoid, then the Gaussian) or
        ``"delta"`` (each event a point mass, then the Gaussian); see :func:`learning_time_spectrum`.
    x_range : the observed range; events outside it are censored (their mu is bounded there).
    n_events, n_tokens, total_drop : events used, tokens normalised by, ``sum delta / N``.
    """

    x: np.ndarray
    density: np.ndarray
    edges: np.ndarray
    hist: np.ndarray
    bandwidth: float
    x_range: tuple[float, float]
    n_events: int
    n_tokens: int
    total_drop: float
    kernel: str = "event"

    def at(self, x) -> np.ndarray:
        """rho at arbitrary x (linear interpolation on the grid, 0 outside the observed range)."""
        return np.interp(np.asarray(x, np.float64), self.x, self.density, left=0.0, right=0.0)

    def to_dict(self) -> dict:
        return {
            "x": self.x.tolist(), "density": self.density.tolist(), "edges": self.edges.tolist(),
            "hist": self.hist.tolist(), "bandwidth": self.bandwidth, "x_range": list(self.x_range),
            "n_events": self.n_events, "n_tokens": self.n_tokens, "total_drop": self.total_drop,
            "kernel": self.kernel,
        }  # fmt: skip


# Points of a spectrum's grid a bandwidth: linear interpolation between them misses the peak of
# one Gaussian of that width by at most (1/6)^2 / 8, 0.35 %.
GRID_PER_BANDWIDTH = 6


def learning_time_spectrum(
    events: Events,
    *,
    bandwidth: str | float = "auto",
    grid: int | None = None,
    bins: int | None = None,
    weights: np.ndarray | None = None,
    placement: str = "mu",
    kernel: str = "event",
) -> Spectrum:
    """rho(x) = (1/N) sum_i w_i [kernel of event i](x): the density of the events' seen loss drops.

    kernel : {"event", "delta"}
        ``"event"`` (default): event ``i`` contributes its own sigmoid's derivative,
        ``delta_i sigma'((x - mu_i)/s_i) / s_i`` on the observed range, convolved with a
        Gaussian of standard deviation ``h`` (the resolution of the points the events were
        fitted on); a sharp event is then a Gaussian at ``mu_i``, a wide one is spread as it
        was seen. ``"delta"``: the delta approximation, a Gaussian ``d_i N(x; p_i, h^2)`` of
        every event's seen drop ``d_i`` (:meth:`Events.realized_drop`) at one position ``p_i``,
        ``mu_i`` (``placement="mu"``) or where the seen part happens on average (``"seen"``,
        see :meth:`Events.positions`); ``placement`` applies to this kernel only (``"seen"`` with
        the event kernel is an error).

    Either way rho integrates to the drop of the mean loss that the events carry over the
    observed range (kernel mass past an edge is reflected back).

    Parameters
    ----------
    events : Events
    bandwidth : rule or decades, see :func:`select_bandwidth`.
    grid : points of the returned grid, which spans the observed range (the spectrum is 0
        outside it: nothing was seen there); default :data:`GRID_PER_BANDWIDTH` points a
        bandwidth, at least 256, so that :meth:`Spectrum.at` (linear interpolation) reads rho
        within about 0.4 % of its peak anywhere (a fixed 256 points over 12 decades at a
        bandwidth of 0.01 read a peak 57 % low).
    bins : histogram bins over the observed range (default: one per bandwidth, at least 8);
        with ``kernel="event"`` each bin holds the part of each event's drop seen inside it.
    weights : [E] optional multiplicities of the events (a bootstrap resample).

    The density is computed by linear binning on a fine grid (the delta kernel: of the
    positions; the event kernel: of each sigmoid's whole drop, in closed form) and one
    convolution, so it costs O(E + G_fine * kernel) for the delta kernel; for the event kernel
    at most about 1,300 nodes an event (those within 20 s of mu; a wide event on a coarser
    grid, spread back by tents: :mod:`tokdyn._event_grid`).
    """
    if len(events) == 0:
        raise InputError("no learning events: the spectrum is empty (no token's fit gave a sigmoid)")
    if not (grid is None or (isinstance(grid, int) and not isinstance(grid, bool) and grid >= 8)):
        raise InputError(f"grid must be None (automatic) or an int >= 8, got {grid!r}")
    _check_kernel(kernel)
    if kernel == "event" and placement != "mu":
        raise InputError(f"placement={placement!r} moves point masses and applies to kernel='delta' only: the event "
                         "kernel spreads each drop where its sigmoid put it")  # fmt: skip
    h = select_bandwidth(events, bandwidth, placement=placement, kernel=kernel)
    lo_obs, hi_obs = events.x_range
    w = None if weights is None else _check_weights(weights, len(events))
    if grid is None:
        grid = max(256, int(math.ceil(GRID_PER_BANDWIDTH * (hi_obs - lo_obs) / h)) + 1)
    x = np.linspace(lo_obs, hi_obs, grid)
    if bins is None:
        bins = max(8, int(round((hi_obs - lo_obs) / h)))
    if not (isinstance(bins, int) and bins >= 1):
        raise InputError(f"bins must be an int >= 1, got {bins!r}")
    edges = np.linspace(lo_obs, hi_obs, bins + 1)
    if kernel == "delta":
        realized = events.realized_drop()
        wd = realized if w is None else realized * w
        centre = events.positions(placement)
        density = _kde(centre, wd, x, h, events.x_range) / events.n_scored
        hist, _ = np.histogram(centre, bins=edges, weights=wd)
        total = float(wd.sum() / events.n_scored)
    else:
        fine, dx = _fine_grid(h, events.x_range, multiple=GRID_MULTIPLE)
        # [F] the events' seen drops, linearly binned (tokdyn._event_grid; _node_blocks is the reference)
        cells = event_cells(events.mu, events.s, events.delta, np.zeros(len(events), np.int64), np.ones((1, 1), np.uint8),
                            lo_obs, dx, fine.size, event_weight=w)[0]  # fmt: skip
        density = _smooth(cells, dx, h, x, lo_obs) / events.n_scored
        hist = _drops_between(events, edges, w)
        total = float(cells.sum() / events.n_scored)
    hist = hist / np.diff(edges) / events.n_scored
    return Spectrum(x=x, density=density, edges=edges, hist=hist, bandwidth=h, x_range=(lo_obs, hi_obs),
                    n_events=len(events), n_tokens=events.n_scored, total_drop=total, kernel=kernel)  # fmt: skip


def _check_weights(weights, n: int) -> np.ndarray:
    w = as_values("weights", weights)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise InputError(f"weights: expected {n} finite non-negative numbers, got shape {w.shape}")
    return w


def _fine_grid(h: float, bounds: tuple[float, float], multiple: int = 1) -> tuple[np.ndarray, float]:
    """The fine grid [F] on [lo, hi] that a kernel of width h is computed on, and its spacing
    (at most h / 8; its cells a multiple of ``multiple`` in number)."""
    lo, hi = bounds
    dx = min(h / 8.0, (hi - lo) / 256)
    n_fine = -(-int(math.ceil((hi - lo) / dx)) // multiple) * multiple + 1
    dx = (hi - lo) / (n_fine - 1)
    return lo + dx * np.arange(n_fine), dx


def _drop_blocks(events: Events, edges: np.ndarray):
    """Yield ``(slice, D [B, C])``: the part of each event's drop inside each of the C intervals
    between ``edges`` [C+1], ``delta_i (sigma(-(e_k - mu_i)/s_i) - sigma(-(e_k+1 - mu_i)/s_i))``.
    Exact for any width, so a sharp event is never lost between grid points; over the
    observed range the row sums are :meth:`Events.realized_drop`."""
    step = max(1, (1 << 21) // edges.size)  # bounds a block's memory
    for a in range(0, len(events), step):
        sl = slice(a, a + step)
        g = _sigmoid((edges[None, :] - events.mu[sl, None]) / events.s[sl, None])  # [B, C+1]
        yield sl, events.delta[sl, None] * np.diff(g, axis=1)


def _node_blocks(events: Events, fine: np.ndarray, dx: float):
    """Yield ``(slice, M [B, F])``: each event's drop linearly binned onto the fine grid [F].

    Linear binning of a point mass, applied to the event's whole sigmoid: node j gets
    ``int hat_j(u) dF_i(u)``, ``F_i(u) = delta_i sigma((u - mu_i)/s_i)`` the drop done by u and
    ``hat_j`` the tent of half-width dx on node j (half tents at the bounds). By parts this is
    ``A_j - A_(j-1)`` with ``A_k`` the mean of F_i over the k-th cell, in closed form through
    ``int sigma = s softplus``. Exact for any width: a point mass gets linear binning, and each
    row sums to :meth:`Events.realized_drop`.
    """
    step = max(1, (1 << 21) // fine.size)  # bounds a block's memory
    for a in range(0, len(events), step):
        sl = slice(a, a + step)
        s, d = events.s[sl, None], events.delta[sl, None]
        z = (fine[None, :] - events.mu[sl, None]) / s  # [B, F]
        f = d * _sigmoid(z)
        cell_mean = d * s * np.diff(np.logaddexp(0.0, z), axis=1) / dx  # [B, F-1]
        m = np.empty_like(f)
        m[:, 0] = cell_mean[:, 0] - f[:, 0]
        m[:, 1:-1] = np.diff(cell_mean, axis=1)
        m[:, -1] = f[:, -1] - cell_mean[:, -1]
        yield sl, m


def _drops_between(events: Events, edges: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """[C] the (weighted) sum over events of :func:`_drop_blocks` (compiled:
    :func:`tokdyn._event_grid.event_sums`; :func:`_drop_blocks` is the numpy reference)."""
    return event_sums(BETWEEN, events.mu, events.s, events.delta, edges, weights)


def _kde(mu: np.ndarray, w: np.ndarray, x: np.ndarray, h: float, bounds: tuple[float, float]) -> np.ndarray:
    """sum_i w_i N(x; mu_i, h^2) on [lo, hi] with mass reflected at both bounds, at points x.

    Positions outside [lo, hi] are clipped to it. Computed by linear binning on a fine grid and
    one convolution (:func:`_smooth`): O(E + fine grid * kernel).
    """
    lo, hi = bounds
    fine, dx = _fine_grid(h, bounds)
    n_fine = fine.size
    pos = (np.clip(mu, lo, hi) - lo) / dx
    i0 = np.minimum(np.floor(pos).astype(np.int64), n_fine - 1)
    frac = pos - i0
    i1 = np.minimum(i0 + 1, n_fine - 1)
    binned = np.bincount(i0, w * (1 - frac), n_fine) + np.bincount(i1, w * frac, n_fine)
    return _smooth(binned, dx, h, x, lo)


def _smooth(binned: np.ndarray, dx: float, h: float, x: np.ndarray, lo: float) -> np.ndarray:
    """Masses ``binned`` [F] at the fine grid ``lo + dx * arange(F)``, convolved with N(0, h^2),
    at points x. Reflection (the standard boundary correction of a kernel density) keeps the
    kernel mass that would leak past an edge of the grid inside it.
    """
    n_fine = binned.size
    period = 2 * max(n_fine - 1, 1)  # fine cells in one period of the grid reflected about both bounds
    if 5 * h / dx <= 4 * period:
        half = int(math.ceil(5 * h / dx))  # 5 h each side
        k = np.exp(-0.5 * (np.arange(-half, half + 1) * dx / h) ** 2) * dx / (h * math.sqrt(2 * math.pi))
        ext = np.convolve(np.pad(binned, half), k, mode="same") / dx  # on [lo - half dx, hi + half dx]
        # Fold what leaked past the bounds back into the grid, f(x) + f(2 lo - x) + f(2 hi - x) + ...,
        # every image (the bounds themselves double): a kernel wider than the range is reflected
        # more than once, and one reflection lost its mass (h = the range: 15 %; h = 10 x: 88 %).
        folded = np.arange(-half, n_fine + half) % period
        folded = np.where(folded > n_fine - 1, period - folded, folded)
        fine = np.bincount(folded, ext, n_fine)
        fine[[0, -1]] *= 2.0
    else:  # a kernel of many periods (a bandwidth far wider than the range): the images summed as a Fourier series
        fine = _wrapped_sum(binned, dx, h, period)
    # The grid's last node is lo + dx (F - 1), which rounding may put just below hi: np.interp's
    # right=0 then read 0 at the spectrum's last point (1 range in 150), not the density there.
    nodes = lo + dx * np.arange(n_fine)
    x = np.asarray(x, np.float64)
    tol = 1e-6 * dx
    inside = (x >= nodes[0] - tol) & (x <= nodes[-1] + tol)
    return np.where(inside, np.interp(np.clip(x, nodes[0], nodes[-1]), nodes, fine), 0.0)


def _wrapped_sum(binned: np.ndarray, dx: float, h: float, period: int) -> np.ndarray:
    """At each fine node j: sum_i binned_i (W((j - i) dx) + W((j + i) dx)), W the Gaussian of
    width h wrapped on a period of ``period`` cells (the reflections of :func:`_smooth` about
    both bounds, all of them), by its Fourier series: ``W(d) = (1/P)(1 + 2 sum_n c_n cos(2 pi n
    d / P))``, ``c_n = exp(-2 pi^2 n^2 h^2 / P^2)``, ``P = period dx``. Used where h is over
    about 1.6 times the range (5 h past 4 periods of the reflected grid): a few terms then reach
    double precision."""
    p_len = period * dx
    j = np.arange(binned.size)
    out = np.full(binned.size, 2.0 * binned.sum() / p_len)
    for n in range(1, 64):
        q = math.pi * n * h / p_len
        c = math.exp(-2.0 * q * q)  # (q * q, not q ** 2: an infinite square is 0 here, not an OverflowError)
        if c < 1e-18:
            break
        ang = 2.0 * math.pi * n * j / period
        cos = np.cos(ang)
        out += (4.0 * c / p_len) * cos * float(binned @ cos)  # cos(u - v) + cos(u + v) = 2 cos u cos v
    return out


# -- power laws ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerLaw:
    """A power-law fit: ``alpha`` with a 95 % interval ``(alpha_lo, alpha_hi)``.

    ``what`` says which: the spectrum (``rho ~ 10**(-alpha x)``, fitted on its log inside the
    uncensored range) or the mean loss (``L = L_inf + A a**(-alpha)``, least squares).
    ``r2`` is the fit's R^2 (of log rho, or of L); ``x_fit`` the x range fitted.
    """

    what: str
    alpha: float
    alpha_lo: float
    alpha_hi: float
    r2: float
    x_fit: tuple[float, float]
    params: dict

    def to_dict(self) -> dict:
        return {"what": self.what, "alpha": self.alpha, "alpha_ci95": [self.alpha_lo, self.alpha_hi], "r2": self.r2,
                "x_fit": list(self.x_fit), **self.params}  # fmt: skip


def fit_power_law(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares line of log10 y on x: returns (alpha, log10 A, R^2) with y ~ A 10**(-alpha x)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    ok = np.isfinite(x) & np.isfinite(y) & (y > 0)
    if ok.sum() < 3:
        raise InputError(f"a power-law fit needs at least 3 positive points, got {int(ok.sum())}")
    ly = np.log10(y[ok])
    slope, intercept = np.polyfit(x[ok], ly, 1)
    resid = ly - (intercept + slope * x[ok])
    ss = ((ly - ly.mean()) ** 2).sum()
    return float(-slope), float(intercept), float(1 - (resid**2).sum() / ss) if ss > 0 else float("nan")


def spectrum_power_law(
    events: Events,
    *,
    bandwidth: str | float = "auto",
    n_boot: int = 200,
    seed: int = 0,
    trim: float | None = None,
    placement: str = "mu",
    kernel: str = "event",
    spectrum: Spectrum | None = None,
) -> PowerLaw:
    """Power-law exponent of the spectrum inside the uncensored range, with a bootstrap interval.

    The fit is a line through ``log10 rho(x)`` on the grid points at least ``trim`` decades
    (default: one bandwidth) inside the observed range, where events are not piled up on the
    bounds of ``mu``. The interval is the 2.5-97.5 percentile range over ``n_boot`` Poisson
    bootstrap resamples of the events' units (:attr:`Events.unit`: a run's probe documents; all
    events of a unit's tokens share its multiplicity), each with the same bandwidth and kernel;
    ``params["resampled"]`` names the unit and ``params["n_units"]`` counts those the events
    fall in. ``spectrum``: the events' spectrum with these settings, where the caller has
    already computed it (:func:`tokdyn.reconstruct.reconstruct`).

    The window is :func:`spectrum_power_law_window`'s, which refuses (:class:`InputError`, with
    the reason) one narrower than :data:`POWER_LAW_MIN_WIDTH` resolution lengths (over fewer, the
    smoothing alone makes any spectrum a line); ``x_fit`` is its span. The interval is
    NaN, and ``params["alpha_ci95_why"]`` says why, where the events' drop comes from fewer than
    :data:`BOOT_MIN_TOKENS` units (effective number) or fewer than :data:`BOOT_MIN_RESAMPLES`
    resamples could be fitted (``params["n_boot"]``: how many were).
    """
    if not (isinstance(n_boot, int) and not isinstance(n_boot, bool) and 0 <= n_boot <= MAX_BOOT):
        raise InputError(f"n_boot must be an int from 0 to {MAX_BOOT}, got {n_boot!r}")
    if spectrum is None:
        spec = learning_time_spectrum(events, bandwidth=bandwidth, placement=placement, kernel=kernel)
    elif spectrum.kernel != kernel or spectrum.n_events != len(events) or spectrum.n_tokens != events.n_scored:
        raise InputError("spectrum_power_law: the spectrum given was not made from these events with this kernel")
    else:
        spec = spectrum
    h = spec.bandwidth
    xs = spectrum_power_law_window(spec, resolution=events.resolution, trim=trim)
    alpha, log_a, r2 = fit_power_law(xs, spec.at(xs))
    unit, n_units = events.units()
    n_tok, n_eff = _boot_units(events, unit, n_units)
    boots: list[float] = []
    if n_boot == 0:
        why = "no bootstrap resamples were asked for (n_boot 0)"
    elif n_eff < BOOT_MIN_TOKENS:
        kind = events.unit_kind
        why = (f"the events' drop comes from {n_tok} {kind}(s), effectively {n_eff:.1f} (weighted by drop); a bootstrap "
               f"over {kind}s needs at least {BOOT_MIN_TOKENS}: from fewer, its resamples barely differ and the interval "
               "would read as certainty")  # fmt: skip
    else:
        rng = np.random.default_rng(seed)
        mults = (rng.poisson(1.0, n_units)[unit] for _ in range(n_boot))  # a unit's tokens share its multiplicity
        if kernel == "event":
            curves = _event_bootstrap(events, spec, mults, n_boot)
        else:
            curves = (learning_time_spectrum(events, bandwidth=h, weights=m[events.token], placement=placement, kernel=kernel)
                      for m in mults)  # fmt: skip
        for curve in curves:
            try:
                boots.append(fit_power_law(xs, curve.at(xs))[0])
            except InputError:
                continue
        why = None if len(boots) >= BOOT_MIN_RESAMPLES else (
            f"{len(boots)} of {n_boot} bootstrap resamples could be fitted; a 95 % interval needs at least "
            f"{BOOT_MIN_RESAMPLES} (the range of n resamples covers on average (n-1)/(n+1) of their distribution)")  # fmt: skip
    a_lo, a_hi = np.percentile(boots, [2.5, 97.5]).tolist() if why is None else (float("nan"), float("nan"))
    return PowerLaw("spectrum", alpha, float(a_lo), float(a_hi), r2, (float(xs[0]), float(xs[-1])),
                    {"log10_amplitude": log_a, "bandwidth": h, "n_boot": len(boots), "alpha_ci95_why": why,
                     "resampled": f"{events.unit_kind}s", "n_units": int(np.unique(unit[events.token]).size)})  # fmt: skip


def spectrum_power_law_window(spec: Spectrum, *, resolution: float = 0.0, trim: float | None = None) -> np.ndarray:
    """The points [<= 32] of x that :func:`spectrum_power_law` fits ``log10 rho`` on, or the
    :class:`InputError` that says why there is no power law to fit (no bootstrap: cheap).

    32 points from ``trim`` decades (default: one bandwidth) inside each edge of the observed
    range; where rho is zero or negative at some (tokens whose loss rose), the longest run of
    consecutive points where it is positive (log rho is undefined elsewhere). Refused where that
    window is narrower than :data:`POWER_LAW_MIN_WIDTH` resolution lengths, the larger of the
    bandwidth and ``resolution`` (the spacing of the points the events were fitted on,
    :attr:`Events.resolution`).
    """
    h = spec.bandwidth
    trim = h if trim is None else float(trim)
    if not (math.isfinite(trim) and trim >= 0):  # a negative trim fitted where nothing was observed (rho 0)
        raise InputError(f"trim must be a finite number of decades >= 0, got {trim}")
    lo, hi = spec.x_range[0] + trim, spec.x_range[1] - trim
    if not hi - lo > 0:
        raise InputError(
            f"the observed range ({spec.x_range[1] - spec.x_range[0]:.3g} decades) is too short for a spectrum "
            f"power law with {trim:.3g} decades trimmed at each edge"
        )
    xs = np.linspace(lo, hi, 32)
    a, b = _longest_positive_run(spec.at(xs))
    if b - a < 3:
        raise InputError(f"the spectrum is positive at {b - a} consecutive points at most of its power-law window (x {lo:.2f} "
                         f"to {hi:.2f}; a power law needs 3 at least): log rho is undefined elsewhere")  # fmt: skip
    xs = xs[a:b]  # where rho is negative (tokens whose loss rose) or zero, log rho and a power law are undefined
    length = max(h, float(resolution))
    if xs[-1] - xs[0] < POWER_LAW_MIN_WIDTH * length * (1 - 1e-9):  # (a window of exactly 5 is one)
        what = f"the bandwidth, {h:.3g}" if h >= resolution else f"the checkpoint spacing, {resolution:.3g}"
        where = "" if b - a == 32 else f", where rho is positive, of x {lo:.2f} to {hi:.2f}"
        raise InputError(
            f"the spectrum's power-law window (x {xs[0]:.2f} to {xs[-1]:.2f}{where}) is {(xs[-1] - xs[0]) / length:.1f} "
            f"resolution lengths wide ({what} decades); a power law needs at least {POWER_LAW_MIN_WIDTH}: over fewer the "
            f"smoothing alone makes log rho a line, whatever the events (record more checkpoints, or over more decades)"
        )  # fmt: skip
    return xs


def _longest_positive_run(rho: np.ndarray) -> tuple[int, int]:
    """``(a, b)``: the longest run of consecutive points where ``rho > 0`` is ``rho[a:b]`` (the first of equals)."""
    best, start = (0, 0), None
    for i, ok in enumerate(np.append(rho > 0, False)):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    return best


def _boot_units(events: Events, unit: np.ndarray, n_units: int) -> tuple[int, float]:
    """The units whose tokens' events show a drop over the observed range, and their effective
    number (Kish: ``(sum w)^2 / sum w^2``, ``w`` each unit's summed |seen drop|)."""
    w = np.bincount(unit[events.token], np.abs(events.realized_drop()), n_units)
    w = w[w > 0]
    return int(w.size), float(w.sum() ** 2 / (w**2).sum()) if w.size else 0.0


# Bytes of resample multiplicities held at once by the spectrum's bootstrap ([resamples, N] uint8).
_BOOT_BYTES = 1 << 28


def _event_bootstrap(events: Events, spec: Spectrum, token_mults, n: int | None = None) -> list[Spectrum]:
    """The event-kernel spectrum of each resample (``token_mults``: [N] multiplicities each, a
    list or an iterator of ``n``).

    The density is linear in the weights, so every event's drops on the fine grid are computed
    once per group of resamples and summed under all of them in one product per block
    (:func:`tokdyn._event_grid.resample_cells`), instead of n_boot passes of sigmoids. The
    resamples go through in groups of at most :data:`_BOOT_BYTES` of multiplicities (the
    default 200 on 2M tokens held 3.2 GB of them at once); the results do not depend on the
    grouping.
    """
    n = len(token_mults) if n is None else int(n)
    if n == 0:
        return []
    fine, dx = _fine_grid(spec.bandwidth, spec.x_range, multiple=GRID_MULTIPLE)
    cells = np.zeros((n, fine.size))  # [n_boot, F]
    group = max(1, min(n, _BOOT_BYTES // max(1, events.n_tokens)))  # resamples at once: their multiplicities
    mults = iter(token_mults)
    for a in range(0, n, group):
        mult = np.empty((min(group, n - a), events.n_tokens), np.uint8)  # Poisson(1) counts stay far below 256
        for i in range(mult.shape[0]):
            mult[i] = next(mults)
        cells[a : a + mult.shape[0]] = resample_cells(events.mu, events.s, events.delta, events.token, mult,
                                                      spec.x_range[0], dx, fine.size)  # fmt: skip
    out = []
    for c in cells:
        density = _smooth(c, dx, spec.bandwidth, spec.x, spec.x_range[0]) / events.n_scored
        out.append(Spectrum(spec.x, density, spec.edges, np.full(spec.hist.shape, np.nan), spec.bandwidth, spec.x_range,
                            spec.n_events, spec.n_tokens, float(c.sum() / events.n_scored), spec.kernel))  # fmt: skip
    return out


LOSS_LAW_MIN_POINTS = 6  # the loss power law's three parameters, and three points more
_ALPHA_MIN, _ALPHA_MAX = 1e-6, 10.0  # the loss exponent's bounds (its fit and its interval)


def loss_power_law(x: np.ndarray, loss: np.ndarray) -> PowerLaw:
    """Direct fit of ``L(a) = L_inf + A a**(-alpha)`` (``a = 10**x``) to the mean loss curve.

    Least squares by scipy's trust-region solver with ``alpha`` in (0, 10] and
    ``0 <= L_inf <= min L``; the interval is +-1.96 standard errors from the Jacobian, cut to
    the bounds of ``alpha``. At least :data:`LOSS_LAW_MIN_POINTS` points: with 4 or 5, three
    parameters pass close to every point whatever the curve, and R^2 says nothing. Refused
    (:class:`InputError`) where the fitted exponent lies on one of its bounds: the number would
    be the bound. ``params["alpha_ci95_why"]`` says why the interval is NaN, where it is.
    """
    from scipy.optimize import curve_fit

    x, loss = as_curve(x, loss)  # a masked loss is refused: a missing one is NaN
    ok = np.isfinite(x) & np.isfinite(loss)
    x, loss = x[ok], loss[ok]
    if x.size < LOSS_LAW_MIN_POINTS:
        raise InputError(f"a power-law fit of the loss needs at least {LOSS_LAW_MIN_POINTS} finite points (3 parameters "
                         f"and 3 left to judge it by), got {x.size}")  # fmt: skip
    x0 = x[0]

    def model(xv, linf, log_a, alpha):
        return linf + 10.0 ** (log_a - alpha * (xv - x0))

    lmin = float(loss.min())
    linf0 = max(0.0, lmin - 0.1 * (loss.max() - lmin) - 1e-3)
    alpha0, log_a0, _ = _safe_line(x - x0, loss - linf0)
    p0 = [linf0, log_a0, min(max(alpha0, 1e-3), 9.0)]
    try:
        p, cov = curve_fit(model, x, loss, p0=p0, bounds=([0.0, -10.0, _ALPHA_MIN], [lmin, 10.0, _ALPHA_MAX]), method="trf",
                           maxfev=20000)  # fmt: skip
    except (RuntimeError, ValueError) as exc:
        raise InputError(f"the power-law fit of the mean loss did not converge: {exc}") from None
    # An exponent on its bound is the bound, not an estimate: at 10 the loss fell to its floor
    # faster than any power law the points can tell apart ("alpha = 10.000 [9.071, 10.000], R^2
    # 1.000" for a loss flat after its second point); near 0 the fitted curve is a constant.
    if p[2] >= _ALPHA_MAX * (1 - 1e-6):
        raise InputError(f"the power-law fit of the mean loss ran into the exponent's bound, {_ALPHA_MAX:g}: the loss falls to "
                         "its floor faster than any power law these points can tell apart, so no exponent is measured")  # fmt: skip
    if p[2] <= 2 * _ALPHA_MIN:
        raise InputError(f"the power-law fit of the mean loss ran into the exponent's bound, {_ALPHA_MIN:g}: the mean loss "
                         "does not fall as a power law of the axis (flat or rising)")  # fmt: skip
    resid = loss - model(x, *p)
    ss = ((loss - loss.mean()) ** 2).sum()
    se = float(np.sqrt(cov[2, 2])) if np.all(np.isfinite(cov)) else float("nan")
    lo, hi = max(float(p[2] - 1.96 * se), _ALPHA_MIN), min(float(p[2] + 1.96 * se), _ALPHA_MAX)  # NaN stays NaN
    why = None if np.isfinite(se) else "the fit's covariance is not finite: the exponent's standard error is not identified"
    return PowerLaw("loss", float(p[2]), lo if np.isfinite(se) else float("nan"), hi if np.isfinite(se) else float("nan"),
                    float(1 - (resid**2).sum() / ss) if ss > 0 else float("nan"), (float(x[0]), float(x[-1])),
                    {"L_inf": float(p[0]), "A_at_first_point": float(10 ** p[1]), "alpha_ci95_why": why})  # fmt: skip


def _safe_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    try:
        return fit_power_law(x, y)
    except InputError:
        return 0.5, float(np.log10(max(np.nanmax(y), 1e-6))), float("nan")



# The fewest events a group of tokens gets a spectrum of its own from (spectra_by).
GROUP_MIN_EVENTS = 10


def spectra_by(
    events: Events, group: np.ndarray, labels: list[str] | dict, *, bandwidth: str | float = "auto",
    min_events: int = GROUP_MIN_EVENTS, placement: str = "mu", kernel: str = "event",
) -> dict[str, Spectrum]:
    """One spectrum per group of tokens (``group [N]`` codes indexing ``labels``), all on the
    bandwidth and kernel of the whole (so they add up to it) and normalised by the same N, so each is
    that group's contribution to rho. Groups with fewer than ``min_events`` events (and groups
    with none, whatever ``min_events``) are left out.
    """
    g = np.asarray(group)
    if g.shape != (events.n_tokens,):
        raise InputError(f"group must have one code per token, shape ({events.n_tokens},), got {g.shape}")
    names = dict(enumerate(labels)) if not isinstance(labels, dict) else dict(labels)
    h = select_bandwidth(events, bandwidth, placement=placement, kernel=kernel)
    codes, members = group_members(g[events.token])  # each group's events, by one sort (not a mask of N a group)
    events_of = dict(zip(codes.tolist(), members))
    out = {}
    for (code, _), label in zip(names.items(), group_labels(names.values(), names.keys())):
        idx = events_of.get(code)
        if idx is not None and idx.size >= max(min_events, 1):  # an empty group has no spectrum (min_events=0 raised "no learning events")
            out[label] = learning_time_spectrum(events._take(idx), bandwidth=h, placement=placement, kernel=kernel)
    return out


def group_members(codes) -> tuple[np.ndarray, list[np.ndarray]]:
    """The distinct values of ``codes [N]``, sorted, and the positions [n_k] of each (ascending).

    One sort for all groups: a mask ``codes == k`` a group read all N codes once a group,
    tokens x groups (20M tokens by 10,000 domains: minutes a pass)."""
    codes = np.asarray(codes).reshape(-1)
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    cut = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    if not codes.size:
        return ordered, []
    return ordered[np.concatenate([[0], cut])], np.split(order, cut)


def group_labels(names, codes=None) -> list[str]:
    """The label of each group named in ``names`` (codes ``codes``, default 0, 1, ...), one per
    group: its name, and where names read alike (a probe of an old store may name two domains
    alike) ``name [code]``, its code added until no two labels read the same. Only the name's
    code told them apart, so domains 'a', 'a' and 'a [1]' were labelled 'a [0]', 'a [1]' and
    'a [1]', and one group's spectrum overwrote another's without a word."""
    labels = [str(n) for n in names]
    codes = list(range(len(labels))) if codes is None else list(codes)
    for _ in range(len(labels)):  # each pass adds a code to every label that reads as another's
        seen: dict[str, int] = {}
        for label in labels:
            seen[label] = seen.get(label, 0) + 1
        if all(v == 1 for v in seen.values()):
            break
        labels = [f"{label} [{c}]" if seen[label] > 1 else label for label, c in zip(labels, codes)]
    return labels
