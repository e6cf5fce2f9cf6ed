"""Learning-time shift between two runs on the same probe (``tokdyn compare``).

Did a curriculum move learning events? For two fitted runs of one store (same probe: a
curriculum arm and its baseline), every probe token's learning time is where its loss fell in
the observed range: the mean of its falling events' seen centres (``two_step`` event set of
:mod:`tokdyn.spectrum`; ``Events.seen_centre``), weighted by the drop each made inside the range
(``Events.realized_drop``), and its drop the net seen drop. An event fitted outside the range, or
one of a pair of opposite sign that cancel, does not make a learning time; nor does a token
whose chosen model (BIC) in that run is a constant or a line: flat noise has no event, and the
two sigmoids fitted to it put a "learning time" anywhere in the range. Over tokens learned (a
step, with a positive drop) in both runs and not censored (below), ``shift = mu_B - mu_A``
(decades; < 0: learned earlier in B); reported overall, by the token's class in run A and by
domain (when the probe labels its tokens by domain; else ``by_domain`` is empty): the median
and quartiles of the shift, the share of tokens that moved earlier, and the share of run A's loss drop carried by
tokens that moved earlier by more than ``tolerance`` decades (and later). Both runs must lie
on one axis (T, D or M): a shift between a step and a token count means nothing. Two runs
observed over different ranges (one recorded to step 300, the other to 100,000; one run's steps
scaled by 10) are read over the range both observed (``x_range`` of the result): an event fitted
where only one run observed (a noise event of its two-sigmoid fit) would move that run's times
alone. A drop that range cuts in one run, which saw it past the range's edge, and not in the
other has a seen centre inside the edge in one run only, and a shift the edge made (every step
x 10 read a median 0.14 decades short, 57 % of the drop past the tolerance): a token is compared
only when, in each run, the range both observed shows at least ``WHOLE_SHARE`` of the falling
drop that run saw; the others are counted apart (``censored``). Runs observed over one range
censor nothing.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

import numpy as np

from ._checks import is_real
from ._text import shown
from .errors import InputError
from .spectrum import EVENT_FIELDS, group_members

__all__ = ["TokenTimes", "token_times", "compare_runs"]


@dataclass(frozen=True)
class TokenTimes:
    """Per probe token: learning time ``mu`` (nan where not learned: no positive seen drop, or a
    chosen model without a step), seen ``drop`` (0 there), class
    name and domain name (None when the probe has no domain labels); ``axis`` of the run."""

    mu: np.ndarray
    drop: np.ndarray
    klass: np.ndarray
    domain: np.ndarray | None
    axis: str = "T"


# What compare reads of a fit: the fields events_from_fit takes (the class codes among them).
# The rest of a fit (39 fields) it never needs.
_FIELDS = (*EVENT_FIELDS, "n_points")
# The fit's models (tokdyn.fit.options.MODEL_NAMES) that are a step in the loss: a token whose
# chosen model is another one (a constant, a line) has no learning event in that run.
_STEP_MODELS = ("sigmoid", "two_sigmoids")
# Tokens a slice: the fit's blocks (262,144 by default) hold that many, and a slice of the 17
# fields with its events and float64 temporaries stays under 100 MB.
SLICE_TOKENS = 262_144
# A token is compared when, in each run, the range both observed shows at least this share of
# the falling drop the run saw (module docstring). Measured (pipelines/compare_edge_bias.py, 3
# seeds): every step x 10 read a median 0.023 decades short at 0.9, 0.020 at 0.95, 0.014 at 0.98
# with 4 of 5 tokens learned in both censored (0.14 with none).
WHOLE_SHARE = 0.95


@dataclass(frozen=True)
class _Fitted:
    """A fitted run as compare reads it: its fields (those of ``_FIELDS`` the fit has), the
    options it was fitted with, its fit block and its observed range (log10 axis values)."""

    run: object
    fields: tuple[str, ...]
    options: object
    block: int
    x_range: tuple[float, float]


def _open_fit(r) -> _Fitted:
    """The fit of run ``r``, checked as :func:`tokdyn.spectrum.run_events` checks it (the same
    errors), and its observed range, from two of its fields."""
    from .fit.job import stored_options

    meta = r.fit.check()
    stored = r.fit.fields
    missing = [k for k in EVENT_FIELDS if k not in stored]  # n_points: optional, as events_from_fit takes it
    if missing:
        raise InputError(f"a fit needs the fields {missing} to give events; pass read_fit(...) with all fields")
    if r.n_tokens == 0:
        raise InputError("the fit has no tokens")
    options = stored_options(r)
    ends = r.fit.read(["x_first", "x_last"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: the error below
        x_first, x_last = np.nanmin(ends["x_first"]), np.nanmax(ends["x_last"])
    if not (np.isfinite(x_first) and np.isfinite(x_last)):
        raise InputError("the fit has no observed x range (every token unfit)")
    block = int(meta.get("block_tokens") or SLICE_TOKENS)
    return _Fitted(r, tuple(k for k in _FIELDS if k in stored), options, block, (float(x_first), float(x_last)))


@dataclass(frozen=True)
class _Times:
    """Per probe token of one run: learning time, drop and class code (clipped to the names);
    ``whole``, of the learned tokens, the share of the falling drop the run saw that the range
    the times were read over shows (1 where not asked, or not learned)."""

    mu: np.ndarray
    drop: np.ndarray
    class_index: np.ndarray
    whole: np.ndarray | None = None


def _slices(f: _Fitted):
    n = f.run.n_tokens
    step = f.block * max(1, SLICE_TOKENS // f.block)  # whole fit blocks: each read checks them once
    return ((a, min(n, a + step)) for a in range(0, n, step))


def _slice_events(f: _Fitted, part: dict, x_range: tuple[float, float]):
    """The events of the tokens of ``part`` (a slice of the fit), token indices within the slice,
    placed in ``x_range``. A slice is given one more token, last, that carries no event (NaN
    everywhere) but spans the run's observed range once scored: events_from_fit then finds in
    every slice the range and the scored token it finds in the whole fit (it would refuse a
    slice whose tokens are all unfit), and the slice's own tokens give the events they give in
    the whole fit, in the same order."""
    from .spectrum import events_from_fit

    def pad(k: str, v: np.ndarray) -> np.ndarray:
        extra = {"x_first": f.x_range[0], "x_last": f.x_range[1], "n_points": 1}.get(k, np.nan if v.dtype.kind == "f" else 0)
        return np.concatenate([v, np.array([extra], v.dtype)])

    ev = events_from_fit({k: pad(k, v) for k, v in part.items()}, options=f.options)
    return dataclasses.replace(ev, x_range=tuple(float(v) for v in x_range))


def _run_times(f: _Fitted, x_range: tuple[float, float], *, whole_of: tuple[float, float] | None = None) -> _Times:
    """Each token's learning time and seen drop inside ``x_range``, one slice of tokens at a
    time (module docstring; the numbers of the whole fit at once, bit for bit: each token's
    events are summed in the same order); with ``whole_of`` (a range holding ``x_range``: the
    run's own), the share of its falling events' drop there that ``x_range`` shows."""
    from .fit.options import CLASS_NAMES, MODEL_NAMES

    step_codes = [code for code, name in MODEL_NAMES.items() if name in _STEP_MODELS]
    n = f.run.n_tokens
    mu_all, drop_all = np.empty(n), np.empty(n)
    n_names = max(CLASS_NAMES) + 1
    klass = np.empty(n, np.int64)
    whole = None if whole_of is None else np.ones(n)
    for a, b in _slices(f):
        part = f.run.fit.read_tokens(a, b, f.fields)
        ev = _slice_events(f, part, x_range)
        m = b - a
        # What each event did inside the observed range: an event fitted outside it (a drop never
        # seen) carries none, and a pair of opposite sign that cancels carries only what is left.
        seen = ev.realized_drop()
        drop = np.bincount(ev.token, weights=seen, minlength=m + 1)[:m]  # the token's net seen drop
        w = np.clip(seen, 0, None)  # where it fell: the falling events' seen centres
        wsum = np.bincount(ev.token, weights=w, minlength=m + 1)[:m]
        wmu = np.bincount(ev.token, weights=w * ev.seen_centre(), minlength=m + 1)[:m]
        # learned in this run: the fit's own model choice (BIC) found a step in the loss, and it
        # fell inside the range. A token whose best model is a constant or a line (flat noise, a
        # steady slope) has no learning time: its two-step events are fitted to noise, with a
        # seen drop of a few hundredths of a nat and a centre anywhere in the range.
        stepped = np.isin(np.asarray(part["model"]), step_codes)
        fell = (drop > 0) & (wsum > 0) & stepped
        np.divide(wmu, wsum, out=mu_all[a:b], where=fell)
        mu_all[a:b][~fell] = np.nan
        drop_all[a:b] = np.where(fell, drop, 0.0)
        klass[a:b] = np.clip(np.asarray(part["class_code"]).astype(int), 0, n_names - 1)
        if whole_of is not None:  # of the falling drop the run saw, the share x_range shows
            falls = ev.delta > 0
            there = dataclasses.replace(ev, x_range=whole_of).realized_drop()
            there = np.bincount(ev.token, weights=np.where(falls, there, 0.0), minlength=m + 1)[:m]
            here = np.bincount(ev.token, weights=np.where(falls, seen, 0.0), minlength=m + 1)[:m]
            whole[a:b] = np.divide(here, there, out=np.ones(m), where=fell & (there > 0))
    return _Times(mu_all, drop_all, klass, whole)


def _class_names() -> np.ndarray:
    from .fit.options import CLASS_NAMES

    return np.array([CLASS_NAMES.get(int(c), "?") for c in range(max(CLASS_NAMES) + 1)])


def token_times(store, run: str, *, x_range: tuple[float, float] | None = None) -> TokenTimes:
    """Per-token learning times of a fitted run, from what its events did inside its observed
    range, or inside ``x_range`` (log10 axis values, within the observed range: an InputError
    past it) when given. :func:`compare_runs` reads two runs observed over different ranges
    over the range both observed, and censors the tokens whose drop it cuts in one run only
    (module docstring)."""
    from .store import as_store

    st = as_store(store, mode="r")
    r = st.run(run)
    with r.fit.unchanged():  # its record, then its fields a slice at a time: all of one fit
        f = _open_fit(r)
        t = _run_times(f, f.x_range if x_range is None else _inside(x_range, f.x_range, run))
    return TokenTimes(t.mu, t.drop, _class_names()[t.class_index], _token_domains(st.probe), r.axis)


def _inside(x_range, observed: tuple[float, float], run: str) -> tuple[float, float]:
    """``x_range`` checked: two log10 axis values, first < last, inside the range run ``run``
    observed. Past it, its events are extrapolated: (10, 20) on a run observed over 1..5 gave
    4 tokens a "learning time" there, from the tails of sigmoids fitted to other steps."""
    try:
        lo, hi = x_range
        ok = is_real(lo) and is_real(hi) and observed[0] <= float(lo) < float(hi) <= observed[1]
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise InputError(f"x_range must be two log10 axis values, first < last, inside the range run {run!r} observed "
                         f"({observed[0]!r}..{observed[1]!r}); got {shown(x_range)}")  # fmt: skip
    return float(lo), float(hi)


def _common_range(fa: _Fitted, fb: _Fitted, ra, rb) -> tuple[float, float]:
    """The range both runs observed (log10 axis values), checked, with their shared probe.

    Over the range both observed: a token learned past the end of one run's range shows there
    only the start of its drop, whose seen centre lies early, and seemed learned earlier; and an
    event fitted where only one run observed (a noise event of its two-sigmoid fit) moves its
    time alone. A drop that range cuts in one run and not in the other is censored."""
    common = (max(fa.x_range[0], fb.x_range[0]), min(fa.x_range[1], fb.x_range[1]))
    if not common[1] > common[0]:
        raise InputError(f"runs {ra.name!r} and {rb.name!r} observed no common range of the {ra.axis} axis (log10 "
                         f"{fa.x_range[0]:.3g}..{fa.x_range[1]:.3g} and {fb.x_range[0]:.3g}..{fb.x_range[1]:.3g}); "
                         "their learning times cannot be compared")  # fmt: skip
    if ra.n_tokens != rb.n_tokens:
        raise InputError(f"runs {ra.name!r} and {rb.name!r} have {ra.n_tokens} and {rb.n_tokens} probe tokens; they must share the probe")
    return common


def _token_domains(probe) -> np.ndarray | None:
    """Each probe token's domain name, or None when the probe does not label its tokens by domain
    (an imported losses.npz without ``domain``, or a probe without domain names)."""
    idx = _domain_index(probe)
    return None if idx is None else idx[0][idx[1]]


def _domain_index(probe) -> tuple[np.ndarray, np.ndarray] | None:
    """(the domain names, each probe token's index into them), or None as :func:`_token_domains`:
    the names a token at a time are an array of strings as large as the probe."""
    idx = probe.token_arrays.get("domain")
    if idx is None or not probe.domains or np.asarray(idx).dtype.kind not in "iu":
        return None
    doms = np.array(list(probe.domains))
    return doms, np.clip(np.asarray(idx).astype(np.int64), 0, doms.size - 1)


def _groups(names: np.ndarray, index: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The labels ``names[index]`` takes, sorted, each with the positions where it is taken
    (ascending): the groups of ``sorted(set(names[index].tolist()))``, without making the labels
    token by token (two codes of one name, such as two unknown classes, are one group), and by
    one sort, not a pass over every token a name (tokens x domains)."""
    present, code_at = np.unique(index, return_inverse=True)
    labels, label_of = np.unique(names[present], return_inverse=True)  # sorted as sorted() sorts str
    found, members = group_members(label_of.reshape(-1)[code_at.reshape(-1)])
    return [(str(labels[k]), m) for k, m in zip(found.tolist(), members)]


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

    Raises :class:`InputError` when the runs are the same, lie on different axes, observed no
    common range or share no token with an event seen whole in both, or when ``tolerance`` is
    not a finite number >= 0.
    """
    from .store import as_store

    if not is_real(tolerance) or not (math.isfinite(tolerance) and tolerance >= 0):
        raise InputError(f"tolerance must be a finite number of decades >= 0, got {tolerance!r}")
    if run_a == run_b:
        raise InputError(f"compare needs two different runs, got {run_a!r} twice")
    st = as_store(store, mode="r")
    ra, rb = st.run(run_a), st.run(run_b)  # RunNotFoundError before any fit is read
    if ra.axis != rb.axis:
        raise InputError(f"run {run_a!r} lies on the {ra.axis} axis and run {run_b!r} on the {rb.axis} axis; "
                         "compare needs two runs of one axis (a shift between them would mean nothing)")  # fmt: skip
    with ra.fit.unchanged(), rb.fit.unchanged():  # each run's record, then its fields a slice at a time: of one fit
        fa, fb = _open_fit(ra), _open_fit(rb)  # the checks, then the range each observed
        common = _common_range(fa, fb, ra, rb)
        a, b = _run_times(fa, common, whole_of=fa.x_range), _run_times(fb, common, whole_of=fb.x_range)
    learned = np.isfinite(a.mu) & np.isfinite(b.mu)
    # seen whole (nearly) in both: a drop the common range cuts in one run, where that run saw it
    # past the range's edge, and not in the other has a seen centre inside the edge in one run
    # only, and a shift the edge made
    cut = {run_a: learned & (a.whole < WHOLE_SHARE), run_b: learned & (b.whole < WHOLE_SHARE)}
    censored = cut[run_a] | cut[run_b]
    both = learned & ~censored
    if not both.any():
        whole = f" seen whole over the range both observed ({int(censored.sum())} cut by its edge in one run)"
        raise InputError(f"no probe token has a positive learning event in both {run_a!r} and {run_b!r}{whole if censored.any() else ''}")
    shift, drop = (b.mu - a.mu)[both], a.drop[both]
    # learned in one run only: not in the shifts (a token a curriculum pushed past the end of
    # its run, or learned only there), so counted apart; and the censored ones
    n_learned = {run_a: int(np.isfinite(a.mu).sum()), run_b: int(np.isfinite(b.mu).sum())}
    total = a.drop[learned].sum()
    cens = {"n_tokens": int(censored.sum()), "drop_share": float(a.drop[censored].sum() / total) if total > 0 else float("nan"),
            "cut_in": {k: int(v.sum()) for k, v in cut.items()}, "whole_share": WHOLE_SHARE}
    del b
    domains = _domain_index(st.probe)
    out = {"run_a": run_a, "run_b": run_b, "axis": ra.axis, "tolerance": float(tolerance), "n_probe_tokens": int(a.mu.size),
           "x_range": list(common), "x_ranges": {run_a: list(fa.x_range), run_b: list(fb.x_range)},
           "has_domains": domains is not None, "n_learned": n_learned, "censored": cens,
           "overall": _summary(shift, drop, tolerance), "by_class": {}, "by_domain": {},
           "histogram": dict(zip(("counts", "edges"), (lambda h: (h[0].tolist(), h[1].tolist()))(np.histogram(shift, bins=40))))}  # fmt: skip
    # by run A's class of each token, and by domain: groups of codes (a label a token would be
    # an array of strings as large as the probe)
    groups = [("by_class", _class_names(), a.class_index[both])]
    if domains is not None:
        groups.append(("by_domain", domains[0], domains[1][both]))
    for key, names, index in groups:
        for lab, m in _groups(names, index):
            out[key][lab] = _summary(shift[m], drop[m], tolerance)
    if domains is not None:  # a domain with no token compared (none learned in both runs) is a row of 0, not no row
        out["by_domain"] = {lab: out["by_domain"].get(lab, {"n_tokens": 0}) for lab in sorted({str(d) for d in domains[0]})}
    return out
