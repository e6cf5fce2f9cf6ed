"""Curriculum v2: reshape the *domain mixture* by when each domain's loss becomes learnable.

From a pilot run (the uniform mixture, another seed, recorded on training steps: axis T) with a
probe of training windows labelled by domain, every token's learning events give, per domain
``k``, the loss-drop-weighted learning-time density

    rho_k(x) = (1 / N_k) sum_{events e of domain k} delta_e (g_e * G_h)(x)
    g_e(u) = K((u - mu_e) / s_e) / s_e  for u in [x_first, x_last] (the pilot's observed range), else 0
    r_k(x) = max(0, rho_k(x) shrunk toward the domains' mean by its noise)

i.e. the rate ``-dL_k/dx`` (nats per decade of steps, per token) at which the domain's loss
falls at ``x = log10 step``: ``rho_k`` is the domain's learning-time spectrum (:mod:`tokdyn.spectrum`,
``kernel="event"``): each event's own sigmoid derivative (``K`` the logistic density) over the
observed range, with its sign, smoothed by a Gaussian ``G_h`` of ``h = (pi/sqrt 3) width``
decades (reflected at the range's ends; ``r_k`` is 0 outside it). An event counts only by the
drop it makes inside the observed range: one fitted outside it, or a pair of opposite sign that
cancels, adds nothing. Each domain's difference from the domains' mean rate is then shrunk by
two of its bootstrap standard errors (:meth:`DomainRates.from_events`), so that domains which
differ only by sampling noise get equal rates. At update ``t`` the domain weights are

    w_k(t) = floor * b_k + (1 - floor) * b_k r_k(x_t)^(1/T) / sum_j b_j r_j(x_t)^(1/T)

with ``b`` the baseline mixture (equal by default) and ``x_t = log10((t + 1) time_scale) +
lead``: a domain whose drop lies ahead is deferred, one that has stopped falling (base64
certificates) keeps only the floor, and none is starved. The batch size, hence the token
budget, is unchanged.

**Enrichment** (:meth:`MixtureSchedule.enrichment`): the learnable-now drop the schedule feeds
the model, over the baseline mixture's (equal by default),

    E = sum_t sum_k w_k(t) r_k(x_t) / sum_t sum_k b_k r_k(x_t)

and the most any schedule with the same floor could reach (all non-floor weight on the
fastest-falling domain at each step). When that best value is near 1, the domains fall in
proportion and no mixture schedule can help: :func:`enrichment_verdict` says so; when no
domain's drop falls in the steps covered at all, it says that there is nothing to judge. A
domain of base weight 0 has weight 0 at every step (no schedule can feed it): the best value is
over the other domains, and the verdict names it first.

Everything here is our design (docs/method.md, "Reshaping training"); each choice is a field of
:class:`MixtureConfig`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from .._checks import as_values, is_finite, is_int, is_real, is_whole
from ..errors import InputError
from ._common import domain_names as _domain_names, floats as _floats

__all__ = ["MixtureConfig", "DomainRates", "MixtureSchedule", "enrichment_verdict", "ContextSchedule", "PilotEvents",
           "pilot_events", "load_mixture_schedule", "mixture_sampler", "MAX_MIXTURE_STEPS"]

_NO_HELP = 1.05  # best achievable enrichment below this: no schedule can help
_LOGISTIC_SD = math.pi / math.sqrt(3.0)  # standard deviation of the logistic density of scale 1
_MIN_SMOOTHING = 0.01  # decades: the narrowest Gaussian the rates are smoothed with (the spectrum's finest)
# The most updates a mixture schedule covers: well above the step count of a training run, and
# below counts that would run for hours. The schedule and its file hold one row of weights per
# update (a JSON [steps, D] table, about 20 bytes a number): at this bound, with 5 domains, it
# takes about 1.5 minutes, 2 GB of memory and a 1.1 GB file; 10^10 steps would take days.
MAX_MIXTURE_STEPS = 10_000_000


@dataclass(frozen=True)
class PilotEvents:
    """A fitted pilot's learning events and, per probe token, its domain and position."""

    events: object  # tokdyn.spectrum.Events
    token_domain: np.ndarray  # int [N], index into domains
    token_pos: np.ndarray  # int [N], 1-based position in its window
    domains: tuple[str, ...]


def pilot_events(store, run: str) -> PilotEvents:
    """The fitted learning events of pilot run ``run`` with its probe's domain labels: the
    events of the tokens whose chosen model is a step (:func:`tokdyn.spectrum.events_from_fit`,
    ``which="classified"``; a flat token, whose fitted sigmoids are noise, carries none).

    The one place this package reads fit results (and the probe) from a store. The run must lie
    on the training-step axis T (:class:`InputError` for a D or M run: its learning times are
    log10 tokens or parameters, which a schedule would read as log10 steps).
    """
    from ..spectrum import run_events, units_by_group
    from ..store import open_store
    from ._common import require_step_axis

    st = open_store(store, mode="r")
    r = st.run(run)
    require_step_axis(r, "a curriculum schedule")
    # The events of tokens whose chosen model is a step (the "classified" set), as the learnability
    # table and compare read them: a token whose loss stays flat (BIC: a constant or a line) has no
    # event, and the two sigmoids fitted to its noise put phantom rates in a noisy domain (a pilot
    # in which nothing was learned gave the noisier domain 0.8 of the weight and "+49 %").
    events = run_events(r, which="classified")
    probe = st.probe
    ta = probe.token_arrays
    domain = ta.get("domain")
    if domain is None or not probe.domains or np.asarray(domain).dtype.kind not in "iu":
        domain = np.zeros(probe.n_tokens, np.int64)  # not labelled by domain (an imported losses.npz): one domain
    domain = np.asarray(domain)
    return PilotEvents(units_by_group(events, ta["sample_id"], domain), domain, np.asarray(ta["token_pos"]), tuple(probe.domains))


@dataclass(frozen=True)
class MixtureConfig:
    """Knobs of the mixture schedule (docs/curriculum.md).

    total_steps : optimizer updates covered (``0 .. total_steps - 1``), at most
        :data:`MAX_MIXTURE_STEPS`.
    floor : share in [0, 1] of each step's weight kept at the baseline mixture (1: baseline).
    temperature : ``T > 0``; rates are raised to ``1/T`` (large: flatter).
    width : smoothing of each event, decades.
    lead : decades added to ``x`` (> 0: favour a domain shortly before its drop).
    time_scale : pilot steps per training step.
    """

    total_steps: int
    floor: float = 0.3
    temperature: float = 1.0
    width: float = 0.2
    lead: float = 0.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.total_steps, (int, np.integer)) and not isinstance(self.total_steps, bool)
                and 1 <= self.total_steps <= MAX_MIXTURE_STEPS):  # fmt: skip
            raise InputError(f"total_steps must be an int from 1 to {MAX_MIXTURE_STEPS:,} (a schedule holds a row of weights "
                             f"per step), got {self.total_steps!r}")  # fmt: skip
        for name in ("floor", "temperature", "width", "lead", "time_scale"):
            v = getattr(self, name)
            if not is_real(v):
                raise InputError(f"{name} must be a number, got {v!r}")
            object.__setattr__(self, name, float(v))  # plain Python numbers: the config is written as JSON
        object.__setattr__(self, "total_steps", int(self.total_steps))
        if not 0 <= self.floor <= 1:
            raise InputError(f"floor must be in [0, 1], got {self.floor!r}")
        for name in ("temperature", "time_scale"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"{name} must be > 0, got {v!r}")
        _check_width(self.width)
        if not math.isfinite(self.lead):
            raise InputError(f"lead must be finite, got {self.lead!r}")

    def x(self, step: int) -> float:
        # an int (numpy's too, or an integral float): 2.7 or "3" is not read as step 2 or 3
        if not is_whole(step) or not 0 <= int(step) < self.total_steps:
            raise InputError(f"the schedule covers steps 0..{self.total_steps - 1} (integers); asked for step {step!r}")
        return math.log10((int(step) + 1) * self.time_scale) + self.lead

    def xs(self) -> np.ndarray:
        """``x`` of every step ``0 .. total_steps - 1`` ``[steps]``."""
        return np.log10(np.arange(1, self.total_steps + 1, dtype=np.float64) * self.time_scale) + self.lead


class DomainRates:
    """Per-domain rate of loss fall ``r_k(x)`` (nats per decade per token) on a grid of ``x``.

    Build it with :meth:`from_events` (a pilot's fitted events and each token's domain) or
    :meth:`from_curves` (per-domain loss curves, e.g. a pilot's validation losses).
    """

    def __init__(self, domains, x: np.ndarray, rates: np.ndarray) -> None:
        self.domains = _domain_names(domains)
        x, rates = _floats("x", x), _floats("rates", rates)
        if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)) or np.any(np.diff(x) <= 0):
            raise InputError("x must be an increasing grid of at least 2 finite points")
        if rates.shape != (x.size, len(self.domains)):
            raise InputError(f"rates must have shape {(x.size, len(self.domains))} (grid x domains), got {rates.shape}")
        if not np.all(np.isfinite(rates)):
            raise InputError("rates must be finite")
        self.x, self.rates = x, np.clip(rates, 0.0, None)
        # what from_events shrank away as noise: the rates before it, and over what they were
        # resampled ({"significance", "resampled", "n_units"}); None for rates given as they are
        self.unshrunk: DomainRates | None = None
        self.noise: dict | None = None

    @classmethod
    def from_events(cls, events, token_domain: np.ndarray, domains, *, width: float = 0.2,
                    grid: np.ndarray | None = None, significance: float = 2.0, n_boot: int = 64,
                    seed: int = 0) -> "DomainRates":  # fmt: skip
        """From :class:`tokdyn.spectrum.Events` of ``N`` probe tokens and ``token_domain [N]``
        (indices into ``domains``).

        Domain ``k``'s rate is its learning-time spectrum (:func:`tokdyn.spectrum.learning_time_spectrum`,
        ``kernel="event"``) per token of the domain: every event contributes its own sigmoid's
        derivative over the pilot's observed x range, with its sign, smoothed by a Gaussian of
        standard deviation ``(pi/sqrt 3) width`` (a logistic of scale ``width``; at least 0.01
        decades). So each event carries the drop it makes inside the observed range: one fitted
        outside it (whose drop the pilot never saw) carries almost none, and events of opposite
        sign that cancel carry none. The rates are 0 outside the observed range (nothing was
        seen there) and where a domain's loss rises.

        What is left is sampling noise (the fits of a finite probe): where the domains' rates
        differ by less than it, their ratio, which sets the weights, would be noise. So each
        domain's difference from the domains' mean rate is shrunk toward 0 by ``significance``
        standard errors (soft thresholding; the errors from ``n_boot`` Poisson resamples of the
        probe's sampling units, drawn from ``seed``: its documents, or its windows where it does
        not tell documents apart, :attr:`tokdyn.spectrum.Events.unit`; all tokens of a unit share
        its multiplicity, since they are not independent draws): domains whose rates differ
        only by noise get equal rates, hence their baseline weights. ``significance=0`` keeps
        the raw rates.
        """
        from ..spectrum import _event_bootstrap, learning_time_spectrum

        domains = _domain_names(domains)
        dom = as_values("token_domain", token_domain, "code")  # a masked array's mask would be no domain
        if dom.shape != (events.n_tokens,):
            raise InputError(f"token_domain must have one entry per probe token ({events.n_tokens}), got shape {dom.shape}")
        _check_width(width)
        if not (math.isfinite(significance) and significance >= 0):
            raise InputError(f"significance must be a finite number of standard errors >= 0, got {significance!r}")
        if not (isinstance(n_boot, (int, np.integer)) and not isinstance(n_boot, bool) and 2 <= n_boot <= 10_000):
            raise InputError(f"n_boot must be an int from 2 to 10000, got {n_boot!r}")
        if dom.size and (dom.dtype.kind not in "iu" or dom.min() < 0 or dom.max() >= len(domains)):
            raise InputError(f"token_domain must hold indices into the {len(domains)} domains, got values "
                             f"{dom.min()}..{dom.max()} ({dom.dtype})")  # fmt: skip
        # a domain's rate is per token of it that the pilot scored (one never observed, e.g. a
        # loss of NaN at every row, has no event: counted, it made its domain read as slower)
        counted = [events.scored_in(dom == k) for k in range(len(domains))]
        scored = [int(np.count_nonzero(c)) for c in counted]
        empty = [str(domains[k]) for k in range(len(domains)) if scored[k] == 0]
        if empty:  # its rate would read 0: a domain nobody measured would be deferred to the floor
            tokens = any(np.any(dom == k) for k in range(len(domains)) if scored[k] == 0)
            none = "no probe token with a recorded loss at a row the pilot's fit took" if tokens else "no probe tokens"
            raise InputError(f"domain(s) {empty} have {none}: the pilot says nothing about when they are learned, "
                             "and a schedule would hold them at the floor as if they had nothing to learn; record a pilot "
                             "whose probe has tokens of every domain (tokdyn.curriculum.mixture_probe), or leave those "
                             "domains out of the mixture")  # fmt: skip
        shrink = significance > 0 and len(domains) > 1
        unit, n_units = events.units()  # a unit's tokens (a document's, a window's) share its multiplicity
        single = [str(domains[k]) for k in range(len(domains)) if np.unique(unit[counted[k]]).size < 2]
        if shrink and single:  # every resample draws its one unit or none: the same rate, an error of 0
            raise InputError(f"domain(s) {single} have their scored probe tokens in one {events.unit_kind}: resampling "
                             f"{events.unit_kind}s cannot show the noise of their rate, which would be kept as exact, "
                             f"noise included; record a pilot probe with two or more {events.unit_kind}s of each domain, "
                             "or keep the raw rates (DomainRates.from_events(..., significance=0))")  # fmt: skip
        h = max(_LOGISTIC_SD * width, _MIN_SMOOTHING)
        lo, hi = events.x_range
        n_grid = max(241, int(math.ceil((hi - lo) / (h / 4))) + 1)  # 4 points per h at least
        x = np.linspace(lo, hi, n_grid)
        rates = np.zeros((n_grid, len(domains)))
        rng = np.random.default_rng(seed)
        # [n_boot, units] Poisson(1) counts (uint8: they stay far below 256), token arrays made one at a time
        unit_mults = np.minimum(rng.poisson(1.0, (n_boot if shrink else 0, n_units)), 255).astype(np.uint8)
        boots = np.zeros((len(unit_mults), n_grid, len(domains)))  # a domain without events: 0 in every resample
        for k in range(len(domains)):
            in_k = dom == k
            sub = events.for_tokens(in_k)
            if len(sub) == 0:
                continue
            spec = learning_time_spectrum(sub, bandwidth=h, kernel="event", grid=n_grid)  # per scored token
            rates[:, k] = spec.density * events.n_scored / scored[k]
            # a resample's rate is per token of the domain *it* drew: resampling whole units moves
            # that count too, and a fixed one would count its swing (1/sqrt(units)) as noise
            drawn = unit_mults @ np.bincount(unit[counted[k]], minlength=n_units)
            resampled = (m[unit] for m in unit_mults)
            for b, sb in enumerate(_event_bootstrap(sub, spec, resampled, len(unit_mults))):
                boots[b, :, k] = sb.density * events.n_scored / drawn[b] if drawn[b] > 0 else np.nan  # none drawn: no rate
        raw = rates
        if shrink:
            mean = rates.mean(axis=1, keepdims=True)  # each domain toward the domains' mean, by its own error
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a domain no resample drew: no error, 0
                se = np.nan_to_num(np.nanstd(boots, axis=0))  # NaN: a resample that drew none of a domain
            dev = rates - mean
            rates = mean + np.sign(dev) * np.clip(np.abs(dev) - significance * se, 0.0, None)
        if grid is not None:
            g = np.asarray(grid, np.float64)
            on = lambda r: np.stack([np.interp(g, x, r[:, k], left=0.0, right=0.0) for k in range(len(domains))], axis=-1)  # noqa: E731
            rates, raw, x = on(rates), on(raw), g
        out = cls(domains, x, rates)  # clipped at 0 there: a domain whose loss rises is not falling
        if shrink:
            out.unshrunk = cls(domains, x, raw)
            out.noise = {"significance": float(significance), "resampled": f"{events.unit_kind}s", "n_units": int(n_units)}
        return out

    @classmethod
    def from_curves(cls, steps, losses, domains, *, width: float = 0.2, grid: np.ndarray | None = None) -> "DomainRates":
        """From per-domain loss curves ``losses [S, D]`` at ``steps [S]`` (>= 1): the fall
        ``-dL_k/dlog10 step`` between points, with its sign, smoothed by a Gaussian of ``width``
        decades, then clipped at 0 (noise that goes up and down cancels)."""
        domains = _domain_names(domains)
        s, loss = _floats("steps", steps), _floats("losses", losses)
        if s.ndim != 1 or loss.shape != (s.size, len(domains)) or s.size < 2 or not np.all(np.isfinite(s)) \
                or np.any(s < 1) or np.any(np.diff(s) <= 0):  # fmt: skip
            raise InputError("steps must be increasing, >= 1, and losses of shape [steps, domains]")
        _check_width(width)
        lx = np.log10(s)
        mid, r = (lx[1:] + lx[:-1]) / 2, -np.diff(loss, axis=0) / np.diff(lx)[:, None]
        x = np.linspace(lx[0], lx[-1], 241) if grid is None else _floats("grid", grid)
        # each grid point's Gaussian weights over the midpoints, scaled by the largest (in logs): a
        # narrow width left a point between two midpoints with weights that were all 0 (rates 0/0)
        z = -0.5 * ((x[:, None] - mid[None, :]) / max(width, 1e-6)) ** 2
        k = np.exp(z - z.max(axis=1, keepdims=True)) * np.diff(lx)[None, :]
        # signed falls, smoothed, then clipped (by the constructor): a rise and a fall of the
        # same size (noise about a flat curve) cancel instead of leaving a phantom rate
        return cls(domains, x, (k @ r) / k.sum(1, keepdims=True))

    def at(self, x) -> np.ndarray:
        """``r_k(x)`` for every domain (0 outside the grid): ``[D]`` for one ``x``, ``[len(x), D]``
        for an array of them."""
        return np.stack([np.interp(x, self.x, self.rates[:, k], left=0.0, right=0.0) for k in range(len(self.domains))], axis=-1)

    def to_dict(self) -> dict:
        d = {"domains": list(self.domains), "x": self.x.tolist(), "rates": self.rates.tolist()}
        if self.unshrunk is not None:  # what the noise shrinkage took away, for the verdict of a loaded schedule
            d.update(unshrunk=self.unshrunk.rates.tolist(), noise=dict(self.noise))
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "DomainRates":
        """The rates :meth:`to_dict` wrote (a schedule file's ``"rates"``); :class:`InputError`
        (or ``KeyError`` / ``TypeError`` / ``ValueError`` for a field missing or of the wrong
        kind, which the file's reader words) where they cannot be."""
        out = cls(d["domains"], d["x"], d["rates"])
        if "unshrunk" in d or "noise" in d:
            noise = d["noise"]
            if not (isinstance(noise, Mapping) and set(noise) == {"significance", "resampled", "n_units"}
                    and is_real(noise["significance"]) and noise["significance"] >= 0 and isinstance(noise["resampled"], str)
                    and is_int(noise["n_units"]) and noise["n_units"] >= 1):  # fmt: skip
                raise TypeError(f"its rates' noise is not {{significance, resampled, n_units}}: {noise!r}"[:200])
            out.unshrunk = cls(d["domains"], d["x"], d["unshrunk"])
            out.noise = {"significance": float(noise["significance"]), "resampled": noise["resampled"], "n_units": int(noise["n_units"])}
        return out


def _check_width(width) -> None:
    """One :class:`InputError` unless ``width`` (decades of smoothing) is a finite number >= 0."""
    if not (is_finite(width) and width >= 0):
        raise InputError(f"width must be >= 0 decades, got {width!r}")


class MixtureSchedule:
    """Domain weights step by step (module docstring), from :class:`DomainRates`.

    Parameters
    ----------
    rates : DomainRates
    config : MixtureConfig
    base : float array [D], optional
        The baseline mixture (default: equal weights).
    """

    def __init__(self, rates: DomainRates, config: MixtureConfig, *, base=None) -> None:
        if not isinstance(rates, DomainRates):
            raise InputError(f"rates must be DomainRates, got {type(rates).__name__}")
        d = len(rates.domains)
        b = np.full(d, 1.0 / d) if base is None else _floats("base", base)
        if b.shape != (d,) or not np.all(np.isfinite(b)) or np.any(b < 0) or not np.isclose(b.sum(), 1.0):
            raise InputError(f"base must be {d} weights >= 0 summing to 1, got {np.asarray(base).tolist()}")
        self.rates, self.config, self.base = rates, config, b
        xs = config.xs()
        r = self.rates.at(xs)  # r_k(x_t) of every step [steps, D], whole arrays
        self.table_ = self._weights(r)  # (steps, D)
        self.table_.setflags(write=False)  # what weights() hands out and the fingerprint covers
        self._enrichment_ = self._enrichment(r)  # from the same rates: interpolated once
        if rates.unshrunk is not None:  # what the rates would allow before their noise was shrunk away
            best, unbounded = self._best(rates.unshrunk, xs)
            self._enrichment_.update(best_unshrunk=best, unbounded_unshrunk=unbounded, noise=dict(rates.noise))

    @property
    def domains(self) -> tuple[str, ...]:
        return self.rates.domains

    def _weights(self, r: np.ndarray) -> np.ndarray:
        """The weights ``[steps, D]`` at rates ``r [steps, D]`` (module docstring)."""
        c = self.config
        with np.errstate(over="ignore", under="ignore"):
            q = self.base * (r if c.temperature == 1 else r ** (1.0 / c.temperature))
        total = q.sum(axis=1, keepdims=True)
        # r^(1/T) overflows (inf / inf: NaN weights) or underflows (all 0: the baseline, though
        # some domain falls) for a small T: those rows in logs, shifted by their largest term
        bad = ~np.isfinite(total[:, 0]) | ((total[:, 0] == 0) & ((r > 0) & (self.base > 0)).any(axis=1))
        if bad.any():
            # log q = log base + log r / T, times T (the order is the same), less its largest: u <= 0,
            # and exp(u / T) is 1 at the largest and falls to 0, never inf - inf (NaN: a subnormal T
            # made log r / T infinite for every domain, and such rows took the baseline mixture)
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                u = c.temperature * np.log(self.base) + np.log(r[bad])
                u = u - u.max(axis=1, keepdims=True)
                e = np.exp(np.where(u < 0, u / c.temperature, 0.0))
            q[bad], total[bad] = e, e.sum(axis=1, keepdims=True)
        q = np.where(total > 0, q / np.where(total > 0, total, 1.0), self.base)
        return c.floor * self.base + (1.0 - c.floor) * q

    def fingerprint(self) -> str:
        """Identifies the schedule (its description and weights) in a sampler's state."""
        import hashlib
        import json

        h = hashlib.sha256(json.dumps(self._head(), sort_keys=True).encode())
        h.update(np.ascontiguousarray(self.table_).tobytes())
        return h.hexdigest()[:16]

    def weights(self, step: int) -> np.ndarray:
        """Domain weights ``[D]`` (sum 1) for update ``step`` (a copy: the schedule's own table is
        read-only)."""
        self.config.x(step)  # range check
        return self.table_[int(step)].copy()

    def enrichment(self) -> dict:
        """``schedule``: the enrichment E of these weights; ``best``: the most any schedule with
        this floor reaches; ``unbounded``: with floor 0; ``baseline_rate``: the mean over the
        steps of the baseline mixture's rate ``sum_k b_k r_k(x_t)`` (nats per decade per token;
        0 when no domain's drop falls in the steps covered, and then E is 1 with nothing to
        judge); ``zero_base``: the domains of base weight 0 (never fed: a weight is the base
        weight times the rate, so ``best`` and ``unbounded`` are over the others) and ``n_fed``
        how many others there are; ``per_step``: E at each step. Rates from a pilot's events
        (:meth:`DomainRates.from_events`) add ``best_unshrunk`` and ``unbounded_unshrunk``, the
        ``best`` and ``unbounded`` of their rates before the differences within noise were
        shrunk away, and ``noise``, over what."""
        e = self._enrichment_
        # its lists and dicts copied too: editing the answer's noise record changed the saved file's
        return {**{k: type(v)(v) if isinstance(v, (dict, list)) else v for k, v in e.items()}, "per_step": e["per_step"].tolist()}

    def _enrichment(self, r: np.ndarray) -> dict:
        """:meth:`enrichment` at the step rates ``r [steps, D]``, with ``per_step`` an array."""
        fed = self.base > 0  # a domain of base weight 0 has weight 0 at every step: no schedule can feed it
        who = {"zero_base": [str(d) for d, f in zip(self.domains, fed) if not f], "n_fed": int(fed.sum())}
        base = r @ self.base
        den = base.sum()
        if not den > 0:  # no drop in range: nothing to judge (enrichment_verdict says so)
            return {"schedule": 1.0, "best": 1.0, "unbounded": 1.0, "baseline_rate": 0.0, **who, "per_step": np.ones(len(r))}
        top = r[:, fed].max(1)  # the most a step can feed: all its non-floor weight on a fed domain
        per = np.divide((self.table_ * r).sum(1), base, out=np.ones(len(r)), where=base > 0)
        return {"schedule": float((self.table_ * r).sum() / den), "best": self._best_sum(base, top) / den,
                "unbounded": float(top.sum() / den), "baseline_rate": float(den / len(r)), **who, "per_step": per}  # fmt: skip

    def _best(self, rates: DomainRates, xs: np.ndarray, block: int = 1 << 20) -> tuple[float, float]:
        """:meth:`_enrichment`'s ``best`` and ``unbounded`` for other ``rates`` at the steps'
        ``xs``, a block of steps at a time (not another [steps, D] array beside the schedule's
        own)."""
        fed = self.base > 0
        num = top_sum = den = 0.0
        for a in range(0, xs.size, block):
            r = rates.at(xs[a : a + block])
            base, top = r @ self.base, r[:, fed].max(1)
            num += self._best_sum(base, top)
            top_sum += float(top.sum())
            den += float(base.sum())
        return (num / den, top_sum / den) if den > 0 else (1.0, 1.0)

    def _best_sum(self, base: np.ndarray, top: np.ndarray) -> float:
        """The most any schedule with this floor feeds over steps whose baseline rate is ``base``
        and whose fastest fed domain's rate is ``top``: the floor's share at the baseline, the
        rest on that domain."""
        f = self.config.floor
        return float((f * base + (1 - f) * top).sum())

    def _head(self) -> dict:
        """The schedule's description before its per-step arrays (:meth:`to_dict`, :meth:`save`)."""
        return {"kind": "tokdyn-mixture-schedule", "schema_version": 1, "domains": list(self.domains),
                "config": asdict(self.config), "base": self.base.tolist()}  # fmt: skip

    def to_dict(self) -> dict:
        return {**self._head(), "weights": self.table_.tolist(), "enrichment": self.enrichment(),
                "rates": self.rates.to_dict()}

    def save(self, path) -> str:
        """Write the schedule as JSON: the text of :meth:`to_dict`, its per-step arrays written a
        block of rows at a time (memory independent of the steps), into a new temporary file
        created exclusively beside ``path``, then renamed over it (never written through a file
        or link planted at a predictable name, never half-written)."""
        import json
        import os

        from .._files import write_atomically

        path = os.fspath(path)
        e = dict(self._enrichment_)
        per_step = e.pop("per_step")
        head = self._head()

        def write(fh) -> None:
            fh.write(json.dumps(head)[:-1] + ', "weights": ')
            _write_rows(fh, self.table_)
            fh.write(', "enrichment": ' + json.dumps(e)[:-1] + ', "per_step": ')
            _write_rows(fh, per_step)
            fh.write('}, "rates": ' + json.dumps(self.rates.to_dict()) + "}")

        write_atomically(path, write, what="mixture schedule")
        return path


def _write_rows(fh, arr: np.ndarray, block: int = 65536) -> None:
    """``json.dumps(arr.tolist())`` written to ``fh`` a block of rows at a time (json's C encoder
    for each block: ``json.dump`` would go through the Python one, 5x slower)."""
    import json

    fh.write("[")
    for a in range(0, len(arr), block):
        fh.write((", " if a else "") + json.dumps(arr[a : a + block].tolist())[1:-1])
    fh.write("]")


def load_mixture_schedule(path) -> MixtureSchedule:
    """A schedule written by :meth:`MixtureSchedule.save` (or ``tokdyn curriculum schedule``)."""
    import json
    import os

    from .._files import check_regular, loads_json

    if not isinstance(path, (str, os.PathLike)):  # an int would be read as an open file descriptor, and closed
        raise InputError(f"path must be a file path (str or os.PathLike), got {type(path).__name__}")
    try:
        check_regular(path, "mixture schedule")  # a FIFO would block the read forever
        with open(path, encoding="utf-8") as fh:
            d = loads_json(fh.read())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not a JSON mixture schedule ({exc.msg})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a JSON mixture schedule (not UTF-8 text)") from None
    except OSError as exc:  # an I/O error, a file removed or changed since the check
        raise InputError(f"cannot read the mixture schedule {path}: {exc.strerror or exc}") from None
    if not isinstance(d, dict) or d.get("kind") != "tokdyn-mixture-schedule":
        raise InputError(f"{path}: not a tokdyn mixture schedule (kind {d.get('kind') if isinstance(d, dict) else None!r})")
    if type(d.get("schema_version")) is not int or d["schema_version"] != 1:  # True and 1.0 are not 1
        raise InputError(f"{path}: mixture schedule schema version {d.get('schema_version')!r}; this tokdyn reads 1")
    try:
        r, config, base = d["rates"], d["config"], d["base"]
        if not (isinstance(r, dict) and isinstance(config, dict) and isinstance(base, list)
                and isinstance(r["domains"], list) and isinstance(d["domains"], list)):  # fmt: skip
            raise TypeError("rates, config, base or domains of the wrong type")
        if set(config) - set(MixtureConfig.__dataclass_fields__):
            raise TypeError(f"unknown config fields {sorted(set(config) - set(MixtureConfig.__dataclass_fields__))}")
        for key, v in config.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"config {key} is not a number: {v!r}")
        cfg, rates = MixtureConfig(**config), DomainRates.from_dict(r)
        if list(d["domains"]) != list(rates.domains):
            raise ValueError(f"its domains {d['domains']} are not its rates' {list(rates.domains)}")
        # the file's rows before the schedule's: a config of 10,000,000 steps over a file holding
        # none made the reader compute them all (seconds and GBs, more with more domains) to refuse it
        weights = _floats("its weights", d["weights"])
        if weights.shape != (cfg.total_steps, len(rates.domains)):
            raise ValueError(f"its weights have shape {list(weights.shape)}; its config and domains say "
                             f"[{cfg.total_steps}, {len(rates.domains)}] (steps, domains)")  # fmt: skip
        sched = MixtureSchedule(rates, cfg, base=base)
    except InputError as exc:
        raise InputError(f"{path}: not a valid mixture schedule: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        what = f"it lacks {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InputError(f"{path}: not a valid mixture schedule: {what}") from None
    # the weights are computed again from the rates and the config: they must be the file's
    if weights.shape != sched.table_.shape or not np.allclose(weights, sched.table_, rtol=0, atol=1e-9):
        raise InputError(f"{path}: its weights are not the ones its rates and config give (edited, or written by "
                         "another version of tokdyn); write it again with `tokdyn curriculum schedule`")  # fmt: skip
    return sched


def mixture_sampler(domain_ids, schedule: MixtureSchedule, *, samples_per_step: int, seed: int = 0,
                    domains=None, arm: bool = True, rank: int = 0, world_size: int = 1):  # fmt: skip
    """A :class:`~tokdyn.curriculum.coupled.CoupledSampler` over a pool of training samples
    whose domain is ``domain_ids [N]`` (indices into ``schedule.domains``, or into ``domains``,
    the names of the pool's domains, which are then matched to the schedule's by name; a
    :class:`~tokdyn.data.MixtureDataset` in place of ``domain_ids`` gives both, so matched by name),
    drawing the schedule's mixture step by step (``arm=False``: its baseline mixture, coupled
    to it). ``rank`` / ``world_size``: one sampler per rank (:class:`CoupledSampler`)."""
    import hashlib

    from .coupled import CoupledSampler, _described, domain_probabilities

    if not isinstance(schedule, MixtureSchedule):
        raise InputError(f"schedule must be a MixtureSchedule (load_mixture_schedule(path) reads a file the CLI wrote), "
                         f"got {type(schedule).__name__}")  # fmt: skip
    if domains is not None and (isinstance(domains, (str, bytes)) or not hasattr(domains, "__iter__")):
        raise InputError(f"domains must be the pool's domain names, a list of str (e.g. corpus.domains), got {domains!r}")
    if hasattr(domain_ids, "domain_ids") and hasattr(domain_ids, "domains"):  # a MixtureDataset: match by name
        domains = domain_ids.domains if domains is None else domains
        domain_ids = domain_ids.domain_ids
    # a masked array's mask would be no domain
    ids = as_values("domain_ids", domain_ids, "code", lead="domain_ids must be one integer per sample")
    names = list(schedule.domains) if domains is None else [str(d) for d in domains]
    if len(set(names)) != len(names):  # two pool domains of one name would be drawn as one
        raise InputError(f"domains must be distinct names, got {names}")
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= len(names):  # (integers: as_values)
        raise InputError(f"domain_ids must be one integer per sample, indices into the {len(names)} domains "
                         f"{names}{'' if domains is None else ' given'}, got {_described(ids)}")  # fmt: skip
    if domains is not None:
        pos = {d: i for i, d in enumerate(schedule.domains)}
        missing = sorted(set(names) - set(pos))
        if missing:
            raise InputError(f"domains {missing} are not in the schedule's {list(schedule.domains)}")
        ids = np.array([pos[d] for d in names])[ids]
    counts = np.bincount(ids, minlength=len(schedule.domains))
    empty = [d for d, n, b in zip(schedule.domains, counts, schedule.base) if n == 0 and b > 0]
    if empty:  # a domain of base weight 0 is never drawn, so it may be absent
        raise InputError(f"the schedule's domain(s) {empty} have base weight > 0 but no training sample in the pool "
                         f"(samples per domain {dict(zip(schedule.domains, counts.tolist()))})")  # fmt: skip
    base = domain_probabilities(ids, schedule.base)
    probs = (lambda step: domain_probabilities(ids, schedule.weights(step))) if arm else None
    key = hashlib.sha256(schedule.fingerprint().encode() + np.ascontiguousarray(ids, np.int64).tobytes()).hexdigest()[:16]
    return CoupledSampler(base, probs, samples_per_step=samples_per_step, total_steps=schedule.config.total_steps,
                          seed=seed, rank=rank, world_size=world_size, fingerprint=key)  # fmt: skip


def enrichment_verdict(e: dict) -> str:
    """One line on what the enrichment means (:meth:`MixtureSchedule.enrichment`)."""
    zero = list(e.get("zero_base") or [])
    if zero:  # the real reason comes first: a domain of base weight 0 is never fed, whatever its rate
        names = ", ".join(repr(z) for z in zero)
        one = len(zero) == 1
        why = (f"domain{'' if one else 's'} {names} {'has' if one else 'have'} base weight 0, so the schedule never feeds "
               f"{'it' if one else 'them'} (a domain's weight is its base weight times its rate)")  # fmt: skip
        if e.get("n_fed", 2) < 2:
            return (f"{why}; one domain is left, and the schedule keeps it at weight 1 at every step: there is no mixture "
                    "to reshape (give every domain a base weight above 0)")  # fmt: skip
        return f"{why}; over the other domains: {_verdict(e)}"
    return _verdict(e)


def _verdict(e: dict) -> str:
    """:func:`enrichment_verdict` over the domains the schedule feeds."""
    if not e.get("baseline_rate", 1.0) > 0:
        return ("no domain's loss falls over the steps this schedule covers, by the pilot's rates: there is no drop in "
                "range to judge, and the schedule keeps the baseline mixture (do the pilot's steps, times time_scale, "
                "overlap the run's?)")  # fmt: skip
    if e["best"] < _NO_HELP and e.get("unbounded", e["best"]) >= _NO_HELP:  # the domains differ; the floor holds the mix
        return (f"enrichment {e['schedule']:.3f} (best possible {e['best']:.3f} with this floor, {e['unbounded']:.3f} "
                "with floor 0): the domains' drops differ in time, but the floor keeps too much of each step at the "
                "baseline mixture for a schedule to help; lower the floor to use them")  # fmt: skip
    raw_best, raw_unbounded = e.get("best_unshrunk", 1.0), e.get("unbounded_unshrunk", e.get("best_unshrunk", 1.0))
    if e["best"] < _NO_HELP and raw_unbounded >= _NO_HELP:  # they differ, by no more than noise
        n = e["noise"]
        on_them = (f"{raw_best:.3f} on them" if raw_best >= _NO_HELP else  # the floor would hold those back as well
                   f"{raw_best:.3f} on them with this floor, {raw_unbounded:.3f} with floor 0")  # fmt: skip
        return (f"enrichment {e['schedule']:.3f} (best possible {e['best']:.3f}): the pilot's raw domain rates differ "
                f"(best possible {on_them}), but only within about {n['significance']:g} bootstrap errors "
                f"over its probe's {n['n_units']:,} {n['resampled']}: at this size that is noise, so the schedule keeps the "
                f"baseline mixture (a pilot probe with more {n['resampled']} per domain may tell the domains apart)")  # fmt: skip
    if e["best"] < _NO_HELP:
        return (f"enrichment {e['schedule']:.3f} (best possible {e['best']:.3f}): the domains' loss falls in proportion, "
                "so no mixture schedule can help here; keep the baseline mixture")  # fmt: skip
    return (f"enrichment {e['schedule']:.3f}: the schedule feeds {e['schedule'] - 1:+.1%} more learnable-now loss drop "
            f"than the baseline mixture (best possible with this floor {e['best']:.3f})")  # fmt: skip


class ContextSchedule:
    """Short-to-long context keyed to the spectrum's position bands.

    ``contexts`` are increasing lengths dividing the model context ``C`` (e.g. 16, 32, 64).
    The run trains at ``contexts[i]`` until the step at which the pilot's tokens at positions
    in ``(contexts[i], contexts[i+1]]`` (which need the longer context) reach the
    drop-weighted quantile ``start`` of their learning times; before that the long positions
    have little to learn. A batch ``[B, C+1]`` is cut into ``C / c`` pieces of ``c`` targets
    (:meth:`split`), so a step sees exactly the same target tokens at every context.
    """

    def __init__(self, contexts, switch_steps, *, total_steps: int) -> None:
        self.contexts = tuple(int(c) for c in contexts)
        self.switch_steps = tuple(int(s) for s in switch_steps)
        if len(self.switch_steps) != len(self.contexts) - 1 or any(np.diff(self.contexts) <= 0):
            raise InputError("contexts must increase, with one switch step fewer than contexts")
        if any(self.contexts[-1] % c for c in self.contexts):
            raise InputError(f"every context must divide the longest ({self.contexts[-1]}), got {self.contexts}")
        self.total_steps = int(total_steps)

    @classmethod
    def from_events(cls, events, token_pos: np.ndarray, *, contexts, total_steps: int, start: float = 0.25,
                    time_scale: float = 1.0) -> "ContextSchedule":  # fmt: skip
        """Switch steps from the events of probe tokens at positions ``token_pos [N]`` (1-based).

        A band's quantile is that of the drop its events make inside the pilot's observed range
        (:meth:`tokdyn.spectrum.Events.curve`, signed): the first ``x`` by which ``start`` of the
        band's seen drop is done. An event fitted outside the range, or a pair that cancels,
        does not move it; a band with no net drop switches at once.
        """
        pos = np.asarray(token_pos)[events.token]
        lo_x, hi_x = events.x_range
        xs = np.linspace(lo_x, hi_x, 2049)
        switches = []
        for lo, hi in zip(contexts[:-1], contexts[1:]):
            band = events.subset((pos > lo) & (pos <= hi))
            done = band.curve(xs[:1]) - band.curve(xs) if len(band) else np.zeros(xs.size)  # drop done by each x
            if not done[-1] > 1e-9 * np.abs(band.realized_drop()).sum() / events.n_scored:  # none, or only rounding
                switches.append(0)
                continue
            x = float(xs[np.argmax(done >= start * done[-1])])
            switches.append(int(np.clip(round(10**x / time_scale) - 1, 0, total_steps)))
        return cls(contexts, np.maximum.accumulate(switches), total_steps=total_steps)

    def context(self, step: int) -> int:
        return self.contexts[int(np.searchsorted(self.switch_steps, int(step), side="right"))]

    @staticmethod
    def split(batch, c: int):
        """``(x, y)`` of ``batch [B, C+1]`` cut into pieces of ``c`` targets: ``[B*C/c, c]`` each."""
        B, C1 = batch.shape
        x, y = batch[:, :-1], batch[:, 1:]
        return x.reshape(B * (C1 - 1) // c, c), y.reshape(B * (C1 - 1) // c, c)

    def to_dict(self) -> dict:
        return {"contexts": list(self.contexts), "switch_steps": list(self.switch_steps)}
