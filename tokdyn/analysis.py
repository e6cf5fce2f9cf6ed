"""Everything the report and the demo summarise about a store, computed once.

:func:`analyze_run` gathers, for one fitted run: the learning events, the reconstruction of
``-dL/dx`` (with the spectrum and both power laws), the class shares of the loss drop, spectra
by class, domain, token frequency and position band, and the per-token cartography,
forgetting and Rho-1 statistics. :func:`analyze_store` does that for the store's fitted runs and
adds the D and M axes when they are present and fitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .axes import find_axis_run
from .errors import InputError, StoreError
from .fit.job import fit_inputs, read_fit, stored_options
from .fit.models import class_loss_share
from .fit.options import CLASS_NAMES
from .reconstruct import Reconstruction, mean_probe_loss, reconstruct
from .spectrum import Events, events_from_fit, spectra_by
from .store import TrajectoryStore, open_store
from .tokenstats import TokenStats, frequency_bands, position_bands, token_stats

__all__ = ["RunAnalysis", "StoreAnalysis", "analyze_run", "analyze_store", "fitted_runs"]


@dataclass
class RunAnalysis:
    run: str
    axis: str
    reconstruction: Reconstruction
    events: Events
    fit: dict  # read_fit fields
    class_counts: dict
    class_loss_share: dict
    by_group: dict = field(default_factory=dict)  # {"class": {label: Spectrum}, "domain": ..., ...}
    stats: TokenStats | None = None

    def summary(self) -> dict:
        out = {"run": self.run, "axis": self.axis, **self.reconstruction.summary(),
               "class_counts": self.class_counts, "class_loss_share": self.class_loss_share}  # fmt: skip
        if self.stats is not None:
            out["token_stats"] = self.stats.summary()
        return out


@dataclass
class StoreAnalysis:
    url: str
    runs: list[RunAnalysis]
    not_fitted: list[str]

    def summary(self) -> dict:
        return {"store": self.url, "analyses": [a.summary() for a in self.runs], "not_fitted": self.not_fitted}


def fitted_runs(store: TrajectoryStore) -> tuple[list[str], list[str]]:
    """(runs with a complete, current fit; runs without one)."""
    done, todo = [], []
    for name in store.runs:
        try:
            read_fit(store, name, fields=("status",))
            done.append(name)
        except StoreError:  # not fitted, or a run that cannot be opened (an interrupted creation)
            todo.append(name)
    return done, todo


def analyze_run(
    store: TrajectoryStore | str,
    run: str,
    *,
    which: str = "two_step",
    bandwidth: str | float = "auto",
    n_boot: int = 200,
    groups: bool = True,
    seed: int = 0,
) -> RunAnalysis:
    """Analyse one fitted run (StoreError if it has not been fitted); ``groups=False`` skips the
    per-group spectra and the token statistics (the cheap part only)."""
    st = store if isinstance(store, TrajectoryStore) else open_store(store, mode="r")
    r = st.run(run)
    fit = read_fit(st, run)  # read once: the events, the classes and the report all use it
    events = events_from_fit(fit, which=which, options=stored_options(st, run))
    rows, x = fit_inputs(r)
    rec = reconstruct(x, mean_probe_loss(r, rows), events, axis=r.axis, run=run, bandwidth=bandwidth, n_boot=n_boot, seed=seed)
    codes, counts = np.unique(fit["class_code"], return_counts=True)
    analysis = RunAnalysis(
        run=run, axis=r.axis, reconstruction=rec, events=events, fit=fit,
        class_counts={CLASS_NAMES[int(c)]: int(n) for c, n in zip(codes, counts)},
        class_loss_share=class_loss_share(fit["class_code"], fit["drop"]),
    )  # fmt: skip
    if not groups:
        return analysis
    h = rec.spectrum.bandwidth
    probe = st.probe
    ta = probe.token_arrays
    by = {"class": spectra_by(events, fit["class_code"], CLASS_NAMES, bandwidth=h)}
    if "domain" in ta and probe.domains:
        by["domain"] = spectra_by(events, np.asarray(ta["domain"]), list(probe.domains), bandwidth=h)
    if "token_id" in ta:
        band, labels = frequency_bands(np.asarray(ta["token_id"]))
        by["frequency"] = spectra_by(events, band, labels, bandwidth=h)
    if "token_pos" in ta:
        band, labels = position_bands(np.asarray(ta["token_pos"]), probe.context)
        by["position"] = spectra_by(events, band, labels, bandwidth=h)
    analysis.by_group = by
    if r.n_committed >= 2:
        analysis.stats = token_stats(r)
    return analysis


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
    D and M (a handful of points)."""
    st = store if isinstance(store, TrajectoryStore) else open_store(store, mode="r")
    done, todo = fitted_runs(st)
    if runs is None:
        names = [n for n in done if st.run(n).axis == "T"]  # fitted runs open cleanly
        for axis in ("D", "M"):
            found = find_axis_run(st, axis)
            if found is not None and found in done:
                names.append(found)
    else:
        unknown = [n for n in runs if n not in st.runs]
        if unknown:
            raise InputError(f"no run(s) {unknown} in {st.url}; runs: {', '.join(st.runs) or 'none'}")
        missing = [n for n in runs if n not in done]
        if missing:
            raise StoreError(f"run(s) {missing} have not been fitted; run `tokdyn fit {st.url} --run NAME` first")
        names = list(runs)
    if not names:
        raise StoreError(
            f"{st.url} has no fitted run to analyse (runs: {', '.join(st.runs) or 'none'}); "
            f"run `tokdyn fit {st.url} --run NAME` first"
        )
    out = []
    for n in names:
        out.append(analyze_run(st, n, which=which, bandwidth=bandwidth, n_boot=n_boot, groups=st.run(n).axis == "T"))
    return StoreAnalysis(st.url, out, [n for n in todo if n not in names])

