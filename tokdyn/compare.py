"""Learning-time shift between two runs on the same probe (``tokdyn compare``).

Did a curriculum move learning events? For two fitted runs of one store (same probe: a
curriculum arm and its baseline), every probe token's learning time is where its loss fell in
the observed range: the mean of its falling events' seen centres (``two_step`` event set of
:mod:`tokdyn.spectrum`; ``Events.seen_centre``), weighted by the drop each made inside the range
(``Events.realized_drop``), and its drop the net seen drop. An event fitted outside the range, or
one of a pair of opposite sign that cancel, does not make a learning time.
Over tokens with a positive drop in both runs, ``shift = mu_B - mu_A`` (decades; < 0: learned
earlier in B); reported overall, by the token's class in run A and by domain (when the probe
labels its tokens by domain; else ``by_domain`` is empty): the median and quartiles of the
shift, the share of tokens that moved earlier, and the share of run A's loss drop carried by
tokens that moved earlier by more than ``tolerance`` decades (and later). Both runs must lie
on one axis (T, D or M): a shift between a step and a token count means nothing. Two runs
observed over different ranges (one recorded to step 300, the other to 100,000) are compared
over the range both observed (``x_range`` of the result): a token learned after the end of one
run's range shows there only the start of its drop, and seemed learned earlier in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import InputError

__all__ = ["TokenTimes", "token_times", "compare_runs"]


@dataclass(frozen=True)
class TokenTimes:
    """Per probe token: learning time ``mu`` (nan without a positive drop), total ``drop``, class
    name and domain name (None when the probe has no domain labels); ``axis`` of the run."""

    mu: np.ndarray
    drop: np.ndarray
    klass: np.ndarray
    domain: np.ndarray | None
    axis: str = "T"


def _read(r):
    """(events, fit) of a fitted run. The one place this module reads fit results."""
    from .spectrum import run_events

    fit = r.fit.read()
    return run_events(r, fit=fit), fit


def token_times(store, run: str, *, x_range: tuple[float, float] | None = None) -> TokenTimes:
    """Per-token learning times of a fitted run, from what its events did inside its observed
    range, or inside ``x_range`` (log10 axis values) when given: two runs observed over
    different ranges are compared over the range both observed (:func:`compare_runs`)."""
    from .store import as_store

    st = as_store(store, mode="r")
    r = st.run(run)
    ev, fit = _read(r)
    return _times(st, ev, fit, r.axis, x_range)


def _times(st, ev, fit, axis: str, x_range) -> TokenTimes:
    import dataclasses

    from .fit.options import CLASS_NAMES

    if x_range is not None:
        ev = dataclasses.replace(ev, x_range=tuple(float(v) for v in x_range))
    probe = st.probe
    n = ev.n_tokens
    # What each event did inside the observed range: an event fitted outside it (a drop never
    # seen) carries none, and a pair of opposite sign that cancels carries only what is left.
    seen = ev.realized_drop()
    drop = np.bincount(ev.token, weights=seen, minlength=n)  # the token's net seen drop
    w = np.clip(seen, 0, None)  # where it fell: the falling events' seen centres
    wsum = np.bincount(ev.token, weights=w, minlength=n)
    wmu = np.bincount(ev.token, weights=w * ev.seen_centre(), minlength=n)
    mu = np.divide(wmu, wsum, out=np.full(n, np.nan), where=(drop > 0) & (wsum > 0))
    drop = np.where(drop > 0, drop, 0.0)
    names = np.array([CLASS_NAMES.get(int(c), "?") for c in range(max(CLASS_NAMES) + 1)])
    klass = names[np.clip(np.asarray(fit["class_code"]).astype(int), 0, names.size - 1)]
    return TokenTimes(mu, drop, klass, _token_domains(probe), axis)


def _token_domains(probe) -> np.ndarray | None:
    """Each probe token's domain name, or None when the probe does not label its tokens by domain
    (an imported losses.npz without ``domain``, or a probe without domain names)."""
    idx = probe.token_arrays.get("domain")
    if idx is None or not probe.domains or np.asarray(idx).dtype.kind not in "iu":
        return None
    doms = np.array(list(probe.domains))
    return doms[np.clip(np.asarray(idx).astype(np.int64), 0, doms.size - 1)]


def _summary(shift: np.ndarray, drop: np.ndarray, tol: float) -> dict:
    if shift.size == 0:
        return {"n_tokens": 0}
    q = np.quantile(shift, [0.25, 0.5, 0.75])
    total = drop.sum()
    return {"n_tokens": int(shift.size), "median_shift": float(q[1]), "q25": float(q[0]), "q75": float(q[2]),
            "mean_shift": float(shift.mean()), "share_earlier": float((shift < 0).mean()),
            "drop_share_earlier": float(drop[shift < -tol].sum() / total) if total > 0 else float("nan"),
            "drop_share_later": float(drop[shift > tol].sum() / total) if total > 0 else float("nan")}  # fmt: skip


def compare_runs(store, run_a: str, run_b: str, *, tolerance: float = 0.05) -> dict:
    """The learning-time shift of ``run_b`` against ``run_a`` (module docstring).

    Raises :class:`InputError` when the runs are the same, lie on different axes or share no
    token with an event, or when ``tolerance`` is not a finite number >= 0.
    """
    from .store import as_store

    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(tolerance) and tolerance >= 0):  # fmt: skip
        raise InputError(f"tolerance must be a finite number of decades >= 0, got {tolerance!r}")
    if run_a == run_b:
        raise InputError(f"compare needs two different runs, got {run_a!r} twice")
    st = as_store(store, mode="r")
    ra, rb = st.run(run_a), st.run(run_b)  # RunNotFoundError before any fit is read
    if ra.axis != rb.axis:
        raise InputError(f"run {run_a!r} lies on the {ra.axis} axis and run {run_b!r} on the {rb.axis} axis; "
                         "compare needs two runs of one axis (a shift between them would mean nothing)")  # fmt: skip
    (ea, fa), (eb, fb) = _read(ra), _read(rb)
    # Over the range both runs observed: a token learned past the end of one run's range shows
    # there only the start of its drop, whose seen centre lies early, and seemed learned earlier.
    common = (max(ea.x_range[0], eb.x_range[0]), min(ea.x_range[1], eb.x_range[1]))
    if not common[1] > common[0]:
        raise InputError(f"runs {run_a!r} and {run_b!r} observed no common range of the {ra.axis} axis (log10 "
                         f"{ea.x_range[0]:.3g}..{ea.x_range[1]:.3g} and {eb.x_range[0]:.3g}..{eb.x_range[1]:.3g}); "
                         "their learning times cannot be compared")  # fmt: skip
    a, b = _times(st, ea, fa, ra.axis, common), _times(st, eb, fb, rb.axis, common)
    if a.mu.shape != b.mu.shape:
        raise InputError(f"runs {run_a!r} and {run_b!r} have {a.mu.size} and {b.mu.size} probe tokens; they must share the probe")
    both = np.isfinite(a.mu) & np.isfinite(b.mu)
    if not both.any():
        raise InputError(f"no probe token has a positive learning event in both {run_a!r} and {run_b!r}")
    shift, drop = (b.mu - a.mu)[both], a.drop[both]
    out = {"run_a": run_a, "run_b": run_b, "axis": a.axis, "tolerance": float(tolerance), "n_probe_tokens": int(a.mu.size),
           "x_range": list(common), "x_ranges": {run_a: list(ea.x_range), run_b: list(eb.x_range)},
           "has_domains": a.domain is not None,
           "overall": _summary(shift, drop, tolerance), "by_class": {}, "by_domain": {},
           "histogram": dict(zip(("counts", "edges"), (lambda h: (h[0].tolist(), h[1].tolist()))(np.histogram(shift, bins=40))))}  # fmt: skip
    groups = [("by_class", a.klass[both])] + ([("by_domain", a.domain[both])] if a.domain is not None else [])
    for key, labels in groups:
        for lab in sorted(set(labels.tolist())):
            m = labels == lab
            out[key][lab] = _summary(shift[m], drop[m], tolerance)
    return out
