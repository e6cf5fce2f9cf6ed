"""The models compared per token (constant, line, sigmoid, two sigmoids), BIC, and classes.

The two-sigmoid model has parameters (linf, d1, mu1, s1, d2, mu2, s2):

    l(x) = linf + d1 sigma(-(x - mu1)/s1) + d2 sigma(-(x - mu2)/s2),   mu1 <= mu2 after the fit

so each of its two events has a learning time, width and loss drop of its own (docs/method.md,
"What we measured": many tokens learn in two steps, and each step belongs in the spectrum).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tokdyn.errors import InputError
from tokdyn.fit.options import CLASS_CODES, CLASS_NAMES, STATUS_CODES, STATUS_NAMES, FitOptions
from tokdyn.fit.sigmoid import Z_CLIP, sigmoid_curve

__all__ = [
    "N_PARAMS",
    "constant_fit",
    "line_fit",
    "two_sigmoid_curve",
    "two_sigmoid_evaluate",
    "two_sigmoid_start",
    "two_sigmoid_bounds",
    "drop_bound",
    "MAX_DROP_RANGE",
    "order_events",
    "bic",
    "choose_model",
    "winning_sse",
    "classify",
    "class_loss_share",
    "never_scored",
    "scored_counts",
    "SHARE_MIN_NET",
    "unfit_reasons",
    "ClassDrops",
    "class_drops",
    "model_level",
]

# Free parameters of each model, by MODEL_NAMES code (the noise variance is common to all).
N_PARAMS = {0: 1, 1: 2, 2: 4, 3: 7}


def constant_fit(Y: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean level [B] and sum of squares [B] of the best constant (Y is 0 where W is 0)."""
    n = np.maximum(W.sum(1), 1.0)
    mean = (Y * W).sum(1) / n
    sse = (((Y - mean[:, None]) * W) ** 2).sum(1)
    return mean, sse


def line_fit(
    x: np.ndarray, Y: np.ndarray, W: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares line ``l = intercept + slope * x`` per row: (intercept, slope, sse), [B]."""
    n = np.maximum(W.sum(1), 1.0)
    xm = (W * x).sum(1) / n
    ym = (Y * W).sum(1) / n
    dx = (x[None, :] - xm[:, None]) * W
    sxx = (dx * dx).sum(1)
    sxy = (dx * (Y - ym[:, None])).sum(1)
    slope = np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), 0.0)
    intercept = ym - slope * xm
    sse = (((Y - intercept[:, None] - slope[:, None] * x[None, :]) * W) ** 2).sum(1)
    return intercept, slope, sse


def two_sigmoid_curve(x, linf, d1, mu1, s1, d2, mu2, s2):
    """l(x) of the two-sigmoid model for arrays that broadcast (numpy)."""
    return (
        linf
        + sigmoid_curve(x, d1, 0.0, mu1, s1)
        + sigmoid_curve(x, d2, 0.0, mu2, s2)
    )


def two_sigmoid_evaluate(ops, x, Y, W, q):
    """Sum of squares, J^T J and J^T r of the two-sigmoid model (any backend).

    q [B, 7] = (linf, d1, mu1, ln s1, d2, mu2, ln s2): widths in logs, as for the sigmoid.
    """
    linf, d1, mu1, ls1, d2, mu2, ls2 = (q[:, j : j + 1] for j in range(7))  # each (B, 1)
    cols = [W]
    fit = linf
    for d, mu, log_s in ((d1, mu1, ls1), (d2, mu2, ls2)):
        s = ops.exp(log_s)
        z = ops.clip_scalar((x[None, :] - mu) / s, -Z_CLIP, Z_CLIP)  # (B, K)
        e = ops.exp(z)
        g = 1.0 / (1.0 + e)
        t = d * g * (e * g)
        fit = fit + d * g
        cols += [g * W, t / s * W, t * z * W]
    r = (fit - Y) * W
    J = ops.stack(cols, axis=1)  # (B, 7, K)
    A = J @ J.swapaxes(1, 2)
    grad = (J @ r[:, :, None])[:, :, 0]
    return (r * r).sum(-1), A, grad


# Each event of the two-sigmoid model drops (or rises) by at most this many times the observed
# range of the token's losses. Without a bound, two events at nearly the same time (or both
# off the observed window) with large opposite drops fit a wiggle between two points; the
# curve at the points is fine, but the events are not events, and in the spectrum their huge
# drops of opposite sign cancel badly (the scaling sweep's M axis: R^2 of the spectrum alone
# -2.87 unbounded, 0.842 with this bound; 20-40 % of its two-sigmoid fits had a drop above twice
# the range, up to 1e4 times it). Scanned from 2 to 1000 on the sweep and the demo
# (docs/benchmarks.md): below 10 the fits lose real censored events (the sum of sigmoids on D
# fell to 0.877 at 2), above 50 the wiggles come back.
MAX_DROP_RANGE = 10.0


def drop_bound(span: np.ndarray) -> np.ndarray:
    """The largest drop [B] of a two-sigmoid event: MAX_DROP_RANGE times the range of each
    row's observed losses (span [B], max - min: :func:`tokdyn.fit.prepare.prepare`); +inf for
    a row with none (NaN)."""
    span = np.asarray(span, dtype=np.float64)
    return np.where(np.isfinite(span), MAX_DROP_RANGE * span, np.inf)


def two_sigmoid_bounds(lo1: np.ndarray, hi1: np.ndarray, max_drop: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Bounds [B, 7] from the sigmoid's [B, 4]: both events' mu and s bounded as its mu and s,
    the final level linf as the sigmoid's, each drop within -+``max_drop`` [B]
    (:func:`drop_bound`; None: the drops unbounded)."""
    B = lo1.shape[0]
    lo = np.full((B, 7), -np.inf)
    hi = np.full((B, 7), np.inf)
    lo[:, 0], hi[:, 0] = lo1[:, 1], hi1[:, 1]
    for j in (2, 5):
        lo[:, j], hi[:, j] = lo1[:, 2], hi1[:, 2]
    for j in (3, 6):
        lo[:, j], hi[:, j] = lo1[:, 3], hi1[:, 3]
    if max_drop is not None:
        for j in (1, 4):
            lo[:, j], hi[:, j] = -max_drop, max_drop
    return lo, hi


def two_sigmoid_start(p1: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Start values [B, 7] from the one-sigmoid fit p1 = (l0, linf, mu, s) [B, 4].

    A two-step curve fitted by one sigmoid gives mu between the steps and a width covering
    both, so the start splits that event in two halves at mu -+ 1.5 s, each half as wide.
    Rows whose sigmoid fit is not finite start from zeros clipped into the bounds.
    """
    l0, linf, mu, s = p1.T
    d = l0 - linf
    start = np.stack(
        [linf, 0.5 * d, mu - 1.5 * s, 0.5 * s, 0.5 * d, mu + 1.5 * s, 0.5 * s], axis=1
    )
    start = np.where(np.isfinite(start), start, 0.0)
    return np.minimum(np.maximum(start, lo), hi)


def order_events(p2: np.ndarray) -> np.ndarray:
    """Swap the two events of p2 [B, 7] where needed so that mu1 <= mu2."""
    out = p2.copy()
    swap = p2[:, 2] > p2[:, 5]
    out[swap, 1:4], out[swap, 4:7] = p2[swap, 4:7], p2[swap, 1:4]
    return out


# A sum of squares below this share of the trajectory's own (about its mean) is an exact fit:
# what is left is rounding (of float32 or float64 data, float32 losses to 6e-8 of their value,
# or of the solver's sums, the projected SSE to ~1e-16 of it), not noise a model can explain.
# float16 data round to 5e-4 of their value, far above it: their rounding is fitted as noise. Without
# this floor BIC ranked exact fits by their rounding: noise-free planted sigmoids were chosen
# as two sigmoids on 4-8 of 12 rows, a different 4-8 on each backend.
EXACT_FIT_SHARE = 1e-10


def bic(sse: np.ndarray, n: np.ndarray, k: int, floor: np.ndarray | float = 0.0) -> np.ndarray:
    """Gaussian BIC ``n ln(SSE/n) + k ln n`` [B]; +inf where SSE is not finite or n < 1.

    SSE is floored at ``floor`` (the block passes :data:`EXACT_FIT_SHARE` of each row's sum of
    squares about its mean: exact fits then tie, and the simplest wins) and at 1e-24 n, so an
    exact fit gives a finite (very low) value.
    """
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sse_f = np.maximum(np.maximum(sse, 1e-24 * n), np.where(np.isfinite(floor), floor, 0.0))
        out = n * np.log(sse_f / n) + k * np.log(n)
    return np.where(np.isfinite(sse) & (n >= 1) & np.isfinite(out), out, np.inf)


def choose_model(bics: np.ndarray, margin: float) -> np.ndarray:
    """Model code [B] from BICs [B, 4] (constant, line, sigmoid, two sigmoids).

    Walk from the simplest model up; a richer model is chosen when its BIC is below that of
    *every* simpler model by at least ``margin``.
    """
    chosen = np.zeros(bics.shape[0], dtype=np.int8)
    best_simpler = bics[:, 0].copy()
    for m in range(1, bics.shape[1]):
        wins = bics[:, m] < best_simpler - margin
        chosen[wins] = m
        best_simpler = np.minimum(best_simpler, bics[:, m])
    return chosen


def winning_sse(best_simpler_bic: np.ndarray, n: np.ndarray, k: int, margin: float) -> np.ndarray:
    """The sum of squares [B] below which a model of ``k`` parameters is chosen over simpler
    models whose lowest BIC is ``best_simpler_bic``: :func:`bic` solved for SSE at
    :func:`choose_model`'s bound, ``n exp((best_simpler_bic - margin - k ln n) / n)``. Where
    that is below :func:`bic`'s floors, no sum of squares wins."""
    n = np.asarray(n, dtype=np.float64)
    return n * np.exp((best_simpler_bic - margin - k * np.log(n)) / n)


# A drop is clear when it is at least this many times the scatter of the points about the fit.
CLEAR_DROP_NOISE = 2.0


def _fit_noise(const_rms: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """RMS of the points about the sigmoid fit [B], from the RMS about the mean and R^2.

    R^2 = 1 - SSE/SSE_const, so the residual RMS is const_rms * sqrt(1 - R^2); NaN R^2 (a flat
    trajectory) counts as no scatter explained (the residual is the whole RMS).
    """
    unexplained = np.where(np.isfinite(r2), np.clip(1.0 - r2, 0.0, 1.0), 1.0)
    return const_rms * np.sqrt(unexplained)


def classify(
    *,
    model: np.ndarray,
    status: np.ndarray,
    level_first: np.ndarray,
    level_last: np.ndarray,
    const_rms: np.ndarray,
    delta: np.ndarray,
    mu: np.ndarray,
    r2: np.ndarray,
    delta1: np.ndarray,
    mu1: np.ndarray,
    delta2: np.ndarray,
    mu2: np.ndarray,
    x_first: np.ndarray,
    x_last: np.ndarray,
    options: FitOptions,
) -> np.ndarray:
    """Class code [B] (:data:`CLASS_NAMES`) of each token: what its loss did in the observed window.

    All arguments are [B] arrays: the chosen model (:func:`choose_model`), the sigmoid fit's
    status, the chosen model's fitted loss at the first and last observed x, the RMS about the
    mean, the sigmoid's delta, mu and R^2, the two-sigmoid events, and the observed x range.
    First rule that applies wins:

    1. ``unfit``: status too_few_points or invalid_input.
    2. constant chosen: ``already_known`` if the level <= known_loss, else ``noisy`` if the
       scatter about it > noise_rms, else ``not_yet_learned``.
    3. two sigmoids chosen, both events' |drop| >= delta_min and both mu inside the observed
       range: ``multi_step`` (otherwise judged as a sigmoid below).
    4. any model whose fitted change over the observed range is below delta_min in size ("no
       clear drop"): ``already_known`` if it starts <= known_loss, else ``not_yet_learned``.
    5. line chosen: ``already_known`` if it starts <= known_loss, else ``gradual``.
    6. sigmoid chosen (or two sigmoids failing rule 3), a change of delta_min or more:
       ``forgotten`` if the loss rises; ``already_known`` if it starts <= known_loss;
       ``noisy`` if R^2 < r2_min or the drop is under CLEAR_DROP_NOISE times the scatter about
       the fit; else ``learned``.

    A clear drop inside the window is learning seen in the window, so rule 6 does not look at
    where the sigmoid's mu lies: a curve whose event centre is fitted before the first point
    (the tail of a fast early drop) or after the last (a second event still under way) but
    that falls by nats in the window is ``learned``, not ``already_known`` or
    ``not_yet_learned``; its censored time is the spectrum's business (its censored edges).
    ``delta`` and ``mu`` are therefore not read.
    """
    del delta, mu  # the one-sigmoid event does not decide the class (see above)
    o = options
    code = np.full(model.shape, CLASS_CODES["noisy"], dtype=np.int8)
    known = level_first <= o.known_loss
    change = level_first - level_last
    unfit = (status == STATUS_CODES["too_few_points"]) | (status == STATUS_CODES["invalid_input"])
    const = model == 0
    inside1 = (mu1 >= x_first) & (mu1 <= x_last)
    inside2 = (mu2 >= x_first) & (mu2 <= x_last)
    multi = (
        (model == 3)
        & (np.abs(delta1) >= o.delta_min)
        & (np.abs(delta2) >= o.delta_min)
        & inside1
        & inside2
    )
    flat = ~const & ~multi & (np.abs(change) < o.delta_min)
    line = (model == 1) & ~flat
    sig = (model >= 2) & ~multi & ~flat
    unclear = (r2 < o.r2_min) | (change < CLEAR_DROP_NOISE * _fit_noise(const_rms, r2))

    def put(mask: np.ndarray, name: str) -> None:
        code[mask] = CLASS_CODES[name]

    # Written from the last rule to the first, so that earlier rules overwrite later ones.
    put(sig, "learned")
    put(sig & unclear, "noisy")
    put(sig & known, "already_known")
    put(sig & (change < 0), "forgotten")
    put(line, "gradual")
    put(line & known, "already_known")
    put(flat, "not_yet_learned")
    put(flat & known, "already_known")
    put(multi, "multi_step")
    put(const & (const_rms > o.noise_rms), "noisy")
    put(const & (const_rms <= o.noise_rms), "not_yet_learned")
    put(const & known, "already_known")
    put(unfit, "unfit")
    return code


def class_loss_share(class_code: np.ndarray, drop: np.ndarray) -> dict[str, float]:
    """Each class's share of the total loss drop, by class name (shares sum to 1).

    ``drop`` [N] is each token's fitted loss at the first observed point minus at the last
    (the ``drop`` field of a fit), so the total is N times the drop of the mean loss over the
    observed range; tokens that got worse count negatively. NaN drops (unfit tokens) count
    as 0. Shares are NaN when the total is 0.
    """
    class_code = np.asarray(class_code)
    drop = np.asarray(drop, dtype=np.float64)
    if class_code.shape != drop.shape or class_code.ndim != 1:
        raise InputError(
            f"class_code and drop: expected two 1-D arrays of one length, got shapes "
            f"{class_code.shape} and {drop.shape}"
        )
    drop = np.where(np.isfinite(drop), drop, 0.0)
    total = drop.sum()
    out = {}
    for code, name in CLASS_NAMES.items():
        part = drop[class_code == code].sum()
        out[name] = float(part / total) if total != 0 else float("nan")
    return out


# Shares of the loss drop are shown only where the net fall is at least this part of the classes'
# gross movement (the sum of each class's |fall|): below it, falls and rises nearly cancel and a
# share (a class's fall over the net) reads hundreds or thousands of percent.
SHARE_MIN_NET = 0.5

# Class changes are given to 0.001 nats per probe token: below half of it in all, nothing changed
FLAT_NATS = 0.001


@dataclass(frozen=True)
class ClassDrops:
    """Each class's fitted loss drop, and how to say it (:func:`class_drops`).

    ``nats``: by class name (the classes that hold tokens), the class's fall of the loss in nats
    per probe token (negative: it rose); they add up to the fall of the fitted mean loss.
    ``shares``: the same over their sum (:func:`class_loss_share`), meaningful only where
    :attr:`meaningful` (the net fall is at least :data:`SHARE_MIN_NET` of the classes' falls and
    rises together); else each class is described by its change in nats per probe token.
    """

    nats: dict
    shares: dict
    meaningful: bool
    # the multi_step class by the signs of its two events, where they were given: name -> (tokens,
    # nats per probe token), names "two drops", "a drop then a rise", "a rise then a drop", "two rises"
    multi_step_kinds: dict = dataclasses.field(default_factory=dict)

    @property
    def flat(self) -> bool:
        """Every class's change rounds to 0.000 nats per probe token (:data:`FLAT_NATS`): no
        class moved, which is neither a rise nor a fall."""
        return _flat(self.nats)

    @property
    def net(self) -> float:
        """The net fall, nats per probe token (the fall of the fitted mean loss)."""
        return float(sum(self.nats.values()))

    @property
    def gross(self) -> float:
        """The classes' falls and rises together, nats per probe token."""
        return float(sum(abs(v) for v in self.nats.values()))

    def describe(self, name: str) -> str:
        """What class ``name`` carried: its share of the loss drop (``"42.0% of the loss drop"``)
        where shares mean something, else its change (``"fell 0.123 nats per probe token"``)."""
        if self.meaningful:
            return f"{self.shares.get(name, 0.0):.1%} of the loss drop"
        v = self.nats.get(name, 0.0)
        return f"{'fell' if v >= 0 else 'rose'} {abs(v):.3f} nats per probe token"

    @property
    def reason(self) -> str:
        """Why shares are not shown (empty where they are), e.g. "the classes' falls and rises
        nearly cancel (net fall +0.050 nats per token)"."""
        if self.meaningful:
            return ""
        net = self.net
        # changes that all round to 0.000 nats (the precision they are given in) are no rise
        how = (f"no class's fitted loss changed by as much as {FLAT_NATS:g} nats per probe token" if self.flat else
               "the classes' falls and rises nearly cancel" if net > 0 else
               "the classes' falls and rises end in a rise" if net < 0 else "the classes' falls and rises cancel")  # fmt: skip
        return f"{how} (net fall {net:+.3f} nats per token)".replace("-0.000 ", "+0.000 ")  # no "fall -0.000"

    def listing(self, top: int | None = None) -> str:
        """The classes, largest first: shares (``"learned 61%, gradual 40%, forgotten -1%"``;
        with ``top``, only the ``top`` largest positive ones) where they mean something, else
        changes in nats per probe token (``"learned fell 1.502, forgotten rose 1.449"``);
        ``"none"`` where no class carried any."""
        if self.meaningful:
            shares = [(v, c) for c, v in self.shares.items() if np.isfinite(v) and (v > 0.005 if top else abs(v) >= 0.005)]
            return ", ".join(f"{c} {v:.0%}" for v, c in sorted(shares, key=lambda vc: -abs(vc[0]))[:top]) or "none"
        moved = sorted(((abs(v), c, v) for c, v in self.nats.items() if abs(v) >= 0.0005), reverse=True)[:top]
        return ", ".join(f"{c} {'fell' if v > 0 else 'rose'} {abs(v):.3f}" for _, c, v in moved) or "none"

    def multi_step_note(self) -> str:
        """What ``multi_step`` holds by the signs of its two events (``"multi_step is two drops
        for 4,919 tokens (38.1% of the loss drop), a drop then a rise for 1,483 (5.0%)"``): the class
        holds every token two fitted steps explain better than one, a drop and a rise too (a
        token learned then forgotten, or a spike at one point); empty without a split."""
        kinds = self.multi_step_kinds_text()
        return f"multi_step is {kinds}" if kinds else ""

    def multi_step_kinds_text(self) -> str:
        """The kinds of :meth:`multi_step_note` alone (``"two drops for 4,919 tokens (...), ..."``;
        ``tokdyn fit`` prints it under the class's line); empty without a split."""
        kinds = [(k, n, v) for k, (n, v) in self.multi_step_kinds.items() if n]
        if not kinds:
            return ""
        def carried(v: float, first: bool) -> str:
            if self.meaningful:
                pct = f"{v / self.net:.1%}".replace("-0.0%", "0.0%")
                return f"{pct} of the loss drop" if first else pct
            moved = f"{'fell' if v >= 0 else 'rose'} {abs(v):.3f}" if abs(v) >= FLAT_NATS / 2 else "changed under 0.001"
            return f"{moved}{' nats per probe token' if first else ''}"
        return ", ".join(f"{k} for {n:,}{' token' + 's' * (n != 1) if i == 0 else ''} ({carried(v, i == 0)})"
                         for i, (k, n, v) in enumerate(kinds))  # fmt: skip

    def summary(self, top: int | None = 3) -> str:
        """One sentence: the largest shares of the loss drop by class, or (where shares would
        mean nothing) the largest changes in nats per probe token and why (:meth:`listing`)."""
        if self.meaningful:
            return f"{'Largest shares' if top else 'Shares'} of the loss drop by token class: {self.listing(top)}"
        return (f"Loss change by token class, in nats per probe token: {self.listing(top)}; {self.reason}, "
                "so shares of the loss drop would mean nothing and are not shown")


# the fields of the two-sigmoid fit's events that split multi_step (:func:`fit_class_drops`)
TWO_EVENTS = ("delta1", "mu1", "delta2", "mu2")


def fit_class_drops(fields) -> ClassDrops:
    """:func:`class_drops` of a fit's fields (a mapping of ``class_code``, ``drop`` and, where
    they were read, the two events of :data:`TWO_EVENTS`)."""
    n_points = fields.get("n_points")
    scored = None if n_points is None else np.asarray(n_points) > 0
    return class_drops(fields["class_code"], fields["drop"], scored=scored, **{k: fields.get(k) for k in TWO_EVENTS})


def never_scored(fields) -> np.ndarray:
    """[N] the tokens of a fit with no recorded loss in its rows (an imported probe's padding, a
    token never recorded): no observed point (``n_points == 0``) and not set aside for its losses
    (``invalid_input``, whose points the fit counts as none: those tokens had losses, and are
    ``unfit``). None of them where ``fields`` lacks ``n_points`` or ``status``."""
    code = np.asarray(fields["class_code"])
    if "n_points" not in fields or "status" not in fields:
        return np.zeros(code.shape, bool)
    return (np.asarray(fields["n_points"]) <= 0) & (np.asarray(fields["status"]) != STATUS_CODES["invalid_input"])


def scored_counts(fields) -> tuple[dict[str, int], dict[str, int], int]:
    """Each class's and each status's count of a fit's tokens with a recorded loss, and how many
    have none (:func:`never_scored`): the one count by which ``tokdyn fit``,
    :class:`~tokdyn.fit.job.FitSummary` and the report say the classes. A token with no recorded
    loss is in no class and no status: counted as ``unfit`` with "too few points", it shrank
    every class's share of the tokens (a probe 40 % padding read 40 % unfit)."""
    code, status = np.asarray(fields["class_code"]), np.asarray(fields["status"])
    scored = ~never_scored(fields)
    count = lambda names, a: {names[int(c)]: int(n) for c, n in zip(*np.unique(a[scored], return_counts=True))}  # noqa: E731
    return count(CLASS_NAMES, code), count(STATUS_NAMES, status), int(np.count_nonzero(~scored))


def class_drops(class_code: np.ndarray, drop: np.ndarray, *, scored=None, delta1=None, mu1=None, delta2=None,
                mu2=None) -> ClassDrops:  # fmt: skip
    """Each class's fitted loss drop in nats per probe token (``drop`` summed over the class's
    tokens, NaN as 0, divided by the scored tokens), its share of the net drop, and whether
    shares mean something (:data:`SHARE_MIN_NET`): the one rule by which the report, ``tokdyn
    fit`` and the demo say what each class carried.

    ``scored`` [N] (bool, default all): the tokens observed at least once (a fit's ``n_points >
    0``), the N of the measured mean loss, so the classes' drops add up to the fall of that mean
    (divided by every token, a probe half padding read half the fall). With the two-sigmoid
    events (``delta1``, ``mu1``, ``delta2``, ``mu2``; ``delta > 0`` a drop) the ``multi_step``
    class is also split by their signs, in time order (:attr:`ClassDrops.multi_step_kinds`)."""
    shares = class_loss_share(class_code, drop)  # checks the arrays
    code, drop = np.asarray(class_code), np.asarray(drop, np.float64)
    drop = np.where(np.isfinite(drop), drop, 0.0)
    if scored is None:
        n = max(drop.size, 1)
    else:
        scored = np.asarray(scored)
        if scored.shape != drop.shape or scored.dtype != bool:
            raise InputError(f"scored: expected a bool array of shape {drop.shape}, got {scored.dtype} {scored.shape}")
        n = max(int(np.count_nonzero(scored)), 1)
    nats = {name: float(drop[code == c].sum() / n) for c, name in CLASS_NAMES.items() if (code == c).any()}
    net, gross = sum(nats.values()), sum(abs(v) for v in nats.values())
    kinds = {}
    if all(a is not None for a in (delta1, mu1, delta2, mu2)):
        multi = code == CLASS_CODES["multi_step"]
        d1, m1, d2, m2 = (np.asarray(a, np.float64)[multi] for a in (delta1, mu1, delta2, mu2))
        first, second = np.where(m1 <= m2, d1, d2) > 0, np.where(m1 <= m2, d2, d1) > 0  # in time order; drop > 0
        for name, sel in (("two drops", first & second), ("a drop then a rise", first & ~second),
                          ("a rise then a drop", ~first & second), ("two rises", ~first & ~second)):  # fmt: skip
            kinds[name] = (int(sel.sum()), float(drop[multi][sel].sum() / n))
    # shares need a net fall that dominates the falls and rises, and some class that moved: the
    # shares of a flat run's 0.0002-nat "drop" read "not_yet_learned 100%" (:attr:`ClassDrops.flat`)
    meaningful = bool(net > 0 and net >= SHARE_MIN_NET * gross and not _flat(nats))
    return ClassDrops(nats, {c: shares[c] for c in nats}, meaningful, kinds)


def _flat(nats: dict) -> bool:
    """Every class's change in ``nats`` rounds to 0.000 nats per probe token (:data:`FLAT_NATS`)."""
    return max(map(abs, nats.values()), default=0.0) < FLAT_NATS / 2


def model_level(
    model: np.ndarray,
    at: np.ndarray,
    *,
    mean: np.ndarray,
    intercept: np.ndarray,
    slope: np.ndarray,
    p1: np.ndarray,
    p2: np.ndarray,
) -> np.ndarray:
    """The chosen model's fitted loss [B] at x = ``at`` [B]."""
    sig1 = sigmoid_curve(at, *p1.T)
    sig2 = two_sigmoid_curve(at, *p2.T)
    return np.select(
        [model == 0, model == 1, model == 2, model == 3],
        [mean, intercept + slope * at, sig1, sig2],
        np.nan,
    )


def unfit_reasons(status_counts: dict, options: dict | FitOptions | None = None) -> list[str]:
    """Why the ``unfit`` tokens of a fit were not fitted, one phrase per cause that occurred:
    ``status_counts`` maps status names to token counts (``FitSummary.status_counts``), and
    ``options`` (the fit's, as a :class:`FitOptions` or its stored dict) gives the thresholds.

    ``unfit`` covers two statuses that mean different things to the researcher: too few observed
    points (``too_few_points``), and a loss no per-token cross-entropy takes anywhere in the
    token's trajectory (``invalid_input``: infinite, below 0, or above ``max_loss``), which sets the
    whole token aside. The report and ``tokdyn fit`` say which, so a run of losses in other
    units (log-probabilities, sums over a sequence, float16 values near 65,504) is not shown as
    all ``unfit`` with "too few points" as the only explanation."""
    o = dataclasses.asdict(options) if isinstance(options, FitOptions) else dict(options or {})
    d = FitOptions()
    max_loss, min_points = o.get("max_loss", d.max_loss), o.get("min_points", d.min_points)
    out = []
    few = int(status_counts.get("too_few_points", 0))
    if few:
        out.append(f"{few:,} token{'s' * (few != 1)} with fewer than {min_points} observed points (min_points)")
    bad = int(status_counts.get("invalid_input", 0))
    if bad:
        out.append(f"{bad:,} token{'s' * (bad != 1)} set aside whole for a loss no token loss takes (infinite, below 0, or "
                   f"above max_loss = {max_loss:g} nats) at one or more points")
    return out
