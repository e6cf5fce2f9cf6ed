"""Everything the report and the demo summarise about a store, computed once.

:func:`analyze_run` gathers, for one fitted run: the learning events, the reconstruction of
``-dL/dx`` (with the spectrum and both power laws), the class shares of the loss drop, spectra
by class, domain, token frequency and position band, and the per-token cartography,
forgetting and Rho-1 statistics. :func:`analyze_store` does that for the store's fitted runs and
adds the D and M axes when they are present and fitted.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from functools import cached_property, partial

import numpy as np

from ._text import command_line
from .axes import assemble_axis, axis_run_problem, find_axis_run
from .errors import InputError, StoreError
from .fit.job import fit_run, stored_axis_min
from .fit.models import ClassDrops, class_loss_share, fit_class_drops, never_scored, scored_counts
from .fit.options import CLASS_NAMES, MIN_FIT_POINTS, FitOptions
from .reconstruct import Reconstruction, reconstruct_run
from .spectrum import Events, fit_scored, group_labels, run_events, spectra_by
from .store import Run, TrajectoryStore, as_store
from .tokenstats import TokenStats, frequency_bands, position_bands, token_stats

__all__ = ["LeftOutWarning", "RunAnalysis", "StoreAnalysis", "RunSpectrum", "AxisRun", "analyze_run", "analyze_store",
           "fitted_runs", "group_spectra", "run_spectrum", "axis_run", "run_order"]


class LeftOutWarning(UserWarning):
    """A run :func:`analyze_store` left out of the analysis (and so of the report): damaged, out
    of date with its rows, or with nothing to analyse; the message says which and why."""


@dataclass
class RunAnalysis:
    run: str
    axis: str
    reconstruction: Reconstruction
    events: Events
    fit: dict  # read_fit fields
    class_counts: dict  # of the tokens with a recorded loss (fit.models.never_scored), as FitSummary's
    class_loss_share: dict
    by_group: dict = field(default_factory=dict)  # {"class": {label: Spectrum}, "domain": ..., ...}
    stats: TokenStats | None = None
    across: dict = field(default_factory=dict)  # {label: Reconstruction} of this axis from another axis's events

    @cached_property
    def class_drops(self) -> ClassDrops:
        """Each class's drop and whether shares of it mean something (:func:`tokdyn.fit.models.class_drops`),
        from the fit, once: the report says it in its summary and its class figure."""
        return fit_class_drops(self.fit)

    def summary(self) -> dict:
        out = {"run": self.run, "axis": self.axis, **self.reconstruction.summary(),
               "class_counts": self.class_counts, "class_loss_share": self.class_loss_share}  # fmt: skip
        if "n_points" in self.fit:  # the tokens in no class: class_counts and these add up to the probe's
            out["n_unscored"] = int(np.count_nonzero(never_scored(self.fit)))
        if self.stats is not None:
            out["token_stats"] = self.stats.summary()
        return out


@dataclass
class StoreAnalysis:
    url: str
    runs: list[RunAnalysis]
    not_fitted: list[str]
    failed: dict[str, str] = field(default_factory=dict)  # run -> why it was left out

    def summary(self) -> dict:
        return {"store": self.url, "analyses": [a.summary() for a in self.runs], "not_fitted": self.not_fitted,
                "left_out": dict(self.failed)}  # fmt: skip


_NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)")


def run_order(name: str) -> tuple:
    """A run name's place in a list of runs: numbers in it by value, so that seed2 comes before
    seed10, lr1e-4 before lr3e-4 before lr1e-3 (the store lists names by code point: seed10, seed2)."""
    return tuple((0, float(p), p) if _NUMBER.fullmatch(p) else (1, 0.0, p) for p in _NUMBER.split(name) if p)


def fitted_runs(store: TrajectoryStore) -> tuple[list[str], list[str]]:
    """(runs with a complete, current fit; runs without one, or that cannot be opened), each in
    :func:`run_order`."""
    done, todo = [], []
    for name in sorted(store.runs, key=run_order):
        try:
            complete = store.run(name).fit.complete
        except StoreError:  # a run that cannot be opened (an interrupted creation, damage)
            complete = False
        (done if complete else todo).append(name)
    return done, todo


def analyze_run(
    run: Run,
    *,
    which: str = "two_step",
    bandwidth: str | float = "auto",
    n_boot: int = 200,
    groups: bool = True,
    seed: int = 0,
) -> RunAnalysis:
    """Analyse one fitted run (StoreError if it has not been fitted); ``groups=False`` skips the
    per-group spectra and the token statistics (the cheap part only)."""
    with run.fit.unchanged():  # the fields, then the events' options and the fitted rows: of one fit
        fit = run.fit.read()  # read once: the events, the classes and the report all use it
        events = run_events(run, which=which, fit=fit)
        rec = reconstruct_run(run, events=events, bandwidth=bandwidth, n_boot=n_boot, seed=seed)
        analysis = RunAnalysis(
            run=run.name, axis=run.axis, reconstruction=rec, events=events, fit=fit,
            class_counts=scored_counts(fit)[0],  # of the scored tokens: padding is in no class
            class_loss_share=class_loss_share(fit["class_code"], fit["drop"]),
        )  # fmt: skip
        if not groups:
            return analysis
        analysis.by_group = group_spectra(run, rec.events, fit, bandwidth=rec.spectrum.bandwidth, kernel=rec.spectrum.kernel)
    if run.n_committed >= 2:
        analysis.stats = token_stats(run)
    return analysis


def group_spectra(run: Run, events: Events, fit: dict, *, bandwidth: float, kernel: str = "event",
                  placement: str = "mu") -> dict:
    """Spectra of the events by class, and by domain, token frequency band and position band
    where the probe has that information: ``{"class": {label: Spectrum}, "domain": ...}``.

    ``events``, ``bandwidth``, ``kernel`` and ``placement`` must be those of the whole spectrum
    the groups are parts of (a reconstruction's: :attr:`Reconstruction.events`, which leaves out
    the tokens its measured mean left out and is normalised by the tokens kept), or the group
    spectra do not add up to it."""
    split = partial(spectra_by, events, bandwidth=bandwidth, kernel=kernel, placement=placement)
    return {kind: split(codes, labels) for kind, (codes, labels) in group_codes(run.store.probe, fit).items()}


def group_codes(probe, fit: dict) -> dict:
    """``{kind: (codes [N], labels)}`` of each grouping :func:`group_spectra` splits by that the
    probe has (class always; domain, frequency and position where it has that information):
    codes index the labels, -1 is no group (a token never scored has no frequency band)."""
    ta = probe.token_arrays
    out = {"class": (np.asarray(fit["class_code"]), CLASS_NAMES)}
    if "domain" in ta and probe.domains:
        out["domain"] = (np.asarray(ta["domain"]), list(probe.domains))
    if "token_id" in ta:  # counted over the scored tokens (observed at least once): padding's pad id is no occurrence
        out["frequency"] = frequency_bands(np.asarray(ta["token_id"]), scored=fit_scored(fit))
    if "token_pos" in ta:
        out["position"] = position_bands(np.asarray(ta["token_pos"]), probe.context)
    return out


def _of_run(name: str, why: str) -> str:
    """``why`` led by the run it is about, unless it names that run already (a reader's errors
    begin with it: they read "run 'a': run 'a': ...")."""
    return why if f"run {name!r}" in why else f"run {name!r}: {why}"


def analyze_store(
    store: TrajectoryStore | str,
    *,
    runs: list[str] | None = None,
    which: str = "two_step",
    bandwidth: str | float = "auto",
    n_boot: int = 200,
) -> StoreAnalysis:
    """Analyse the named runs (default: every fitted run of axis T) and the D and M axes when the
    store holds a fitted run of that axis. Full per-group detail for T runs; the cheap part for
    D and M (a handful of points).

    By default a run that cannot be analysed (no learning event at all, an axis run out of date
    with its sources) is left out with its reason (``failed``), so that one run does not take
    the whole report down; a run asked for by name that cannot be analysed is an error that
    names it."""
    st = as_store(store)
    done, todo = fitted_runs(st)
    failed: dict[str, str] = {}
    if runs is None:
        names = [n for n in done if st.run(n).axis == "T"]  # fitted runs open cleanly
        for n in todo:  # a fit made, but out of date (rows recorded since) or unfinished: not "not fitted"
            why = _stale_fit(st, n)
            if why is not None:
                failed[n] = why
        for axis in ("D", "M"):
            try:
                found = find_axis_run(st, axis)
                why = axis_run_problem(st.run(found), axis) if found is not None and found in done else None
            except (InputError, StoreError) as exc:
                failed[f"axis {axis}"] = str(exc)
                continue
            if why is not None:
                failed[found] = f"out of date ({why}); `{command_line('tokdyn reconstruct', st.url, ('--axis', axis))}` assembles it again"
            elif found is not None and found in done:
                names.append(found)
    else:
        unknown = [n for n in runs if n not in st.runs]
        if unknown:
            raise InputError(f"no run(s) {unknown} in {st.url}; runs: {', '.join(st.runs) or 'none'}")
        for n in runs:
            if n not in done:
                st.run(n).fit.check()  # what is missing and what to run: not fitted, unfinished, or stale
        missing = [n for n in runs if n not in done]
        if missing:  # (check found nothing wrong: the run changed meanwhile)
            raise StoreError(f"run(s) {missing} have no complete, current fit; run `{command_line('tokdyn fit', st.url)} --run NAME`")
        names = list(runs)
    if not names:
        if failed:  # an axis run left out: its reason, not advice to fit what is fitted
            raise StoreError(f"no run of {st.url} can be analysed: " + "; ".join(f"{n}: {why}" for n, why in failed.items()))
        raise StoreError(
            f"{st.url} has no fitted run to analyse (runs: {', '.join(st.runs) or 'none'}); "
            f"run `{command_line('tokdyn fit', st.url)} --run NAME` first"
        )
    out = []
    for n in names:
        r = st.run(n)
        try:
            out.append(analyze_run(r, which=which, bandwidth=bandwidth, n_boot=n_boot, groups=r.axis == "T"))
        except (InputError, StoreError) as exc:
            if runs is not None:
                raise type(exc)(_of_run(n, str(exc))) from None
            failed[n] = str(exc)
    if not out:
        raise StoreError(f"no run of {st.url} could be analysed: " + "; ".join(f"{n}: {why}" for n, why in failed.items()))
    for n, why in failed.items():  # the report says it too, but a page nobody reads to the end is no warning
        said = _of_run(n, why) if n in st.runs else f"{n}: {why}"  # or "axis D: ..."
        warnings.warn(f"left out of the analysis: {said}", LeftOutWarning, stacklevel=2)
    return StoreAnalysis(st.url, out, [n for n in todo if n not in names and n not in failed], failed)


def _stale_fit(st: TrajectoryStore, name: str) -> str | None:
    """Why run ``name``'s fit cannot be used where it has one (unfinished, or made on fewer rows
    than the run now has: a run still being recorded), with what to run; None where it has
    none."""
    try:
        fit = st.run(name).fit
        if not fit.meta:
            return None
        fit.check()
    except StoreError as exc:
        return str(exc)
    return None


@dataclass
class RunSpectrum:
    """The learning-time spectrum of a run with its reconstruction, and optionally the spectra of
    one grouping of its tokens (``by``: class, domain, frequency or position)."""

    reconstruction: Reconstruction
    by: str | None = None
    groups: dict = field(default_factory=dict)  # {label: Spectrum}
    # the probe's domains (by="domain") with no event at all: in no group's line, not even the
    # small groups' (a domain whose every loss was NaN vanished from the table without a word)
    no_events: list = field(default_factory=list)

    def summary(self) -> dict:
        rec, spec = self.reconstruction, self.reconstruction.spectrum
        out = {"run": rec.run, "axis": rec.axis, "bandwidth": spec.bandwidth, "n_events": spec.n_events,
               "n_tokens": spec.n_tokens, "total_drop": spec.total_drop, "x_range": list(spec.x_range),
               "spectrum_power_law": rec.spectrum_power_law.to_dict() if rec.spectrum_power_law else None,
               "loss_power_law": rec.loss_power_law.to_dict() if rec.loss_power_law else None}  # fmt: skip
        return out

    def to_dict(self) -> dict:
        out = {**self.summary(), "spectrum": self.reconstruction.spectrum.to_dict()}
        if self.by:
            out.update(by=self.by, groups={k: g.to_dict() for k, g in self.groups.items()}, no_events=list(self.no_events))
        return out


def run_spectrum(
    run: Run,
    *,
    which: str = "two_step",
    bandwidth: str | float = "auto",
    n_boot: int = 200,
    placement: str = "mu",
    kernel: str = "event",
    by: str | None = None,
) -> RunSpectrum:
    """The spectrum of a fitted run (through its reconstruction, which carries both power laws)
    and, with ``by``, the spectra of its tokens grouped by class, domain, frequency or position
    band at the same bandwidth."""
    with run.fit.unchanged():  # the fields, then the events' options and the fitted rows: of one fit
        fit = run.fit.read()
        events = run_events(run, which=which, fit=fit)
        rec = reconstruct_run(run, events=events, bandwidth=bandwidth, n_boot=n_boot, placement=placement, kernel=kernel)
        if by is None:
            return RunSpectrum(rec)
        # the groups of the spectrum shown: its tokens, its N, its bandwidth, kernel and placement
        groups = group_spectra(run, rec.events, fit, bandwidth=rec.spectrum.bandwidth, kernel=kernel, placement=placement)
    if by not in groups:
        raise InputError(f"by {by}: the probe has no {by} information (available: {', '.join(groups)})")
    none = []
    if by == "domain":  # a domain the probe declares: said where it has no event (classes and bands are not declared)
        codes, names = group_codes(run.store.probe, fit)["domain"]
        seen = np.zeros(len(names), bool)
        seen[np.unique(codes[rec.events.token])] = True
        none = [label for label, s in zip(group_labels(names), seen) if not s]
    return RunSpectrum(rec, by, groups[by], none)


@dataclass(frozen=True)
class AxisRun:
    """The run holding a store's D or M axis, and what :func:`axis_run` did to make it."""

    run: Run
    assembled: bool
    fitted: bool
    why: str | None = None  # why a run found for the axis was assembled again


def axis_run(store: TrajectoryStore | str, axis: str, *, runs: list[str] | None = None, rebuild: bool = False,
             repeats: str = "refuse") -> AxisRun:
    """The fitted run of axis ``axis`` (D or M) of ``store``: found (:func:`tokdyn.axes.find_axis_run`),
    or assembled from the store's runs (``runs``, or those found from run metadata) when there is
    none or ``rebuild``; fitted when it has no complete, current fit. ``repeats``: what runs that
    share an axis value are when assembling (:func:`tokdyn.axes.assemble_axis`: ``"refuse"``, or
    ``"mean"`` for seeds of one point, averaged)."""
    st = as_store(store)
    name = None if rebuild else find_axis_run(st, axis)
    found = st.run(name) if name is not None else None
    why = axis_run_problem(found, axis, runs) if found is not None else None
    if found is not None and why is None and found.fit.complete:
        return AxisRun(found, assembled=False, fitted=False)
    if not st.writable:
        st = as_store(st.url, mode="r+", storage_options=st.storage_options)
    if why is not None:  # assembled again, never used short or from other runs than asked
        name, rebuild = None, True
    run = assemble_axis(st, axis, runs=runs, overwrite=rebuild, repeats=repeats) if name is None else st.run(name)
    window = stored_axis_min(run) if name is not None else None  # an unfinished fit's window is kept
    need = FitOptions().min_points
    if run.n_committed < need:  # the fit's own error named an option (--min-points) reconstruct does not take
        n, least = run.n_committed, MIN_FIT_POINTS
        how = (f"record more runs, or fit it on {n} (`{command_line('tokdyn fit', st.url, ('--run', run.name), ('--min-points', n))}`) "
               "and reconstruct the axis again, which then uses that fit" if n >= least else
               f"record {least - n} more run{'s' * (least - n != 1)} at least ({need - n} for the default fit; a fit takes "
               f"{least} points at the fewest) and reconstruct the axis again")  # fmt: skip
        raise InputError(f"the {axis} axis has {n} points (run {run.name!r}, assembled); a fit of each token needs "
                         f"{need} by default: {how}")  # fmt: skip
    fit_run(run, progress=False, refit=True, axis_min=window)
    return AxisRun(run, assembled=name is None, fitted=True, why=why)
