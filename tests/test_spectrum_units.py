"""The spectrum's bootstrap resamples whole sampling units (a probe's documents), not tokens.

Tokens of one document are not independent draws, so an interval from resampling tokens one by
one was too narrow (2.9x on a curriculum pilot's probe of 160 windows of 64 tokens). Checked
against independent answers: a probe whose documents are k copies of one token each must give
exactly the interval of its one-token-a-document version (the units are what is sampled), tokens
as units give the old token bootstrap bit for bit, and the token bootstrap of the copies is
about sqrt(k) too narrow (what the units fix)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn.errors import InputError
from tokdyn.fit.job import fit_run
from tokdyn.spectrum import Events, probe_units, run_events, spectrum_power_law

import pipeline_scripts

units = pipeline_scripts.load("spectrum_units")
_power_law_events, _copies = units.power_law_events, units.copies_as_documents


@settings(max_examples=8, deadline=None)
@given(n=st.integers(30, 120), k=st.integers(2, 9), seed=st.integers(0, 10_000), kernel=st.sampled_from(["event", "delta"]))
def test_documents_of_copies_give_the_interval_of_one_token_a_document(n, k, seed, kernel):
    base = _power_law_events(n, seed)
    try:
        one = spectrum_power_law(base, n_boot=60, seed=seed, kernel=kernel)
    except InputError:  # no power-law window for this draw: nothing to compare
        return
    many = spectrum_power_law(_copies(base, k), n_boot=60, seed=seed, kernel=kernel)
    assert many.alpha == pytest.approx(one.alpha, rel=1e-9, abs=1e-12)
    assert [many.alpha_lo, many.alpha_hi] == pytest.approx([one.alpha_lo, one.alpha_hi], rel=1e-9, abs=1e-12, nan_ok=True)
    assert many.params["resampled"] == "documents" and many.params["n_units"] == n and one.params["resampled"] == "tokens"


def test_tokens_as_units_are_the_token_bootstrap_bit_for_bit():
    ev = _power_law_events(200, 3)
    plain = spectrum_power_law(ev, n_boot=80, seed=5)
    as_units = spectrum_power_law(replace(ev, unit=np.arange(200) + 7, unit_kind="token"), n_boot=80, seed=5)
    assert (as_units.alpha_lo, as_units.alpha_hi) == (plain.alpha_lo, plain.alpha_hi)


def test_resampling_the_copies_one_by_one_is_too_narrow():
    """What the units fix: the token bootstrap of k copies of each token reads k times the data
    (an interval about sqrt(k) narrower) where there is only the originals' worth."""
    k, widths = 9, []
    for seed in range(3):
        ev = _copies(_power_law_events(150, seed), k)
        by_doc = spectrum_power_law(ev, n_boot=100, seed=seed)
        by_token = spectrum_power_law(replace(ev, unit=None, unit_kind="token"), n_boot=100, seed=seed)
        widths.append((by_doc.alpha_hi - by_doc.alpha_lo) / (by_token.alpha_hi - by_token.alpha_lo))
    assert 2.0 < np.median(widths) < 4.5, widths  # sqrt(9) = 3


def test_too_few_documents_give_no_interval_saying_documents():
    base = _power_law_events(8, 1, alpha=0.2)  # 8 documents of 20 tokens: 160 tokens, effectively 8 units at most
    pl = spectrum_power_law(_copies(base, 20), n_boot=60)
    assert np.isnan(pl.alpha_lo) and "from 8 document(s)" in pl.params["alpha_ci95_why"], pl.params["alpha_ci95_why"]
    assert "a bootstrap over documents needs at least 10" in pl.params["alpha_ci95_why"]


@pytest.mark.parametrize("unit", [np.zeros(5), np.zeros(4, np.int64), np.zeros((5, 1), np.int64)])
def test_a_unit_array_of_the_wrong_kind_is_refused(unit):
    with pytest.raises(InputError, match="Events.unit"):
        Events(np.arange(3), np.ones(3), np.ones(3), np.ones(3), 5, (0.0, 1.0), unit=unit)


def test_a_run_resamples_its_probe_documents_or_else_its_windows(tmp_path):
    rng = np.random.default_rng(0)
    n_seq, c = 12, 8
    windows = rng.integers(0, 50, (n_seq, c + 1))
    docs = np.arange(n_seq) // 3  # 4 documents of 3 windows each
    for name, doc_id, kind, want in (("docs", docs, "document", docs), ("one", None, "window", np.arange(n_seq))):
        probe = tokdyn.ProbeSet.from_tokens(windows, doc_id=doc_id, tokenizer={"kind": "byte"})
        unit, got_kind = probe_units(probe)
        assert got_kind == kind and np.array_equal(unit, np.repeat(want, c))
        st_ = tokdyn.open_store(str(tmp_path / f"{name}.zarr"), probe, mode="w")
        with st_.create_run("r", capacity=30).writer() as w:
            steps = np.unique(np.geomspace(10, 10_000, 30).round().astype(int))
            mu = rng.uniform(1.5, 3.5, probe.n_tokens)
            for step in steps:
                w.append((1 + 3 / (1 + np.exp((np.log10(step) - mu) / 0.2)) + 0.05 * rng.standard_normal(probe.n_tokens)).astype(np.float32),
                         step=int(step))  # fmt: skip
        fit_run(st_.run("r"), progress=False)
        ev = run_events(st_.run("r"))
        assert ev.unit_kind == kind and np.array_equal(ev.unit, np.unique(np.repeat(want, c), return_inverse=True)[1])
        half = ev.for_tokens(np.arange(probe.n_tokens) % 2 == 0)  # a group's events keep the units
        assert half.unit_kind == kind and np.array_equal(half.unit, ev.unit)


@pytest.mark.parametrize("doc_id, kind, groups", [
    (np.repeat(np.arange(5.0), 8), "document", 5),          # an imported probe's float ids
    (np.repeat(np.array(list("abcde")), 8), "document", 5),  # or string ids
    (np.zeros(40), "window", 4),                            # one document: its windows
    (np.arange(40), "window", 4),                           # every token its own "document": its windows
    (None, "window", 4),
])  # fmt: skip
def test_units_of_a_probe_of_any_id_dtype(doc_id, kind, groups):
    """A probe's ids may be floats or strings (import-npz takes them): coded by value; spectrum,
    reconstruct and report failed on such a store ('Events.unit: expected an integer array')."""
    arrays = {"sample_id": np.repeat(np.arange(4), 10).astype(np.float64), "token_pos": np.tile(np.arange(10), 4)}
    if doc_id is not None:
        arrays["doc_id"] = doc_id
    unit, got = probe_units(tokdyn.ProbeSet(None, arrays))
    assert got == kind and unit.dtype == np.int64 and np.unique(unit).size == groups
    assert np.array_equal(unit, np.unique(arrays["doc_id" if kind == "document" else "sample_id"], return_inverse=True)[1])
    ev = Events(np.arange(40), np.ones(40), np.ones(40), np.ones(40), 40, (0.0, 2.0), unit=unit, unit_kind=got)
    assert ev.units()[1] == groups


def test_an_imported_probe_that_numbers_its_tokens_resamples_tokens():
    unit, kind = probe_units(tokdyn.ProbeSet(None, {"sample_id": np.arange(30), "token_pos": np.ones(30, np.int32)}))
    assert kind == "token" and np.array_equal(unit, np.arange(30))


def test_the_report_says_what_its_interval_resampled_in_the_table_and_the_figure(tmp_path):
    """The report's table cell and the spectrum figure's legend both say over how many of what the
    exponent's interval was resampled (the figure's legend said the interval alone); where there is
    no interval the table says why and the legend, short, that there is none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tokdyn.analysis import analyze_run
    from tokdyn.report import _fig_spectrum, _power_law_text
    from tokdyn.spectrum import PowerLaw

    rng = np.random.default_rng(1)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 50, (12, 9)), doc_id=np.arange(12) // 3, tokenizer={"kind": "byte"})
    st_ = tokdyn.open_store(str(tmp_path / "s.zarr"), probe, mode="w")
    with st_.create_run("r", capacity=30).writer() as w:
        mu = rng.uniform(1.5, 3.5, probe.n_tokens)
        for step in np.unique(np.geomspace(10, 10_000, 30).round().astype(int)):
            w.append((1 + 3 / (1 + np.exp((np.log10(step) - mu) / 0.2))).astype(np.float32), step=int(step))
    fit_run(st_.run("r"), progress=False)
    a = analyze_run(st_.run("r"), n_boot=0, groups=False)
    lo, hi = a.reconstruction.spectrum.x_range
    why = "the events' drop comes from 3 documents, effectively 2.5 (weighted by drop); ..."
    for (a_lo, a_hi), cell, legend in (
        ((1.2, 1.8), "1.50 [1.20, 1.80] over 4 documents (R² 0.95)", "power law α = 1.50 [1.20, 1.80] over 4 documents"),
        ((np.nan, np.nan), f"1.50 (no 95 % interval: {why}) (R² 0.95)", "power law α = 1.50 (no 95 % interval)"),
    ):
        pl = PowerLaw("spectrum", 1.5, a_lo, a_hi, 0.95, (lo + 0.2, hi - 0.2),
                      {"log10_amplitude": 0.0, "n_boot": 200, "alpha_ci95_why": None if np.isfinite(a_lo) else why,
                       "resampled": "documents", "n_units": 4})  # fmt: skip
        assert _power_law_text(pl.to_dict()) == cell
        a.reconstruction = replace(a.reconstruction, spectrum_power_law=pl)
        f = _fig_spectrum(st_, a)
        try:
            assert legend in [t.get_text() for t in f.fig.legends[0].get_texts()]
        finally:
            plt.close(f.fig)


# -- the curriculum's domain rates: their errors resample the same units ---------------------------


def _two_domains(n: int, seed: int) -> tuple[Events, np.ndarray]:
    """Planted events of two domains that differ (one's events later and larger)."""
    ev = _power_law_events(n, seed)
    dom = np.arange(n) % 2
    return replace(ev, mu=ev.mu + 0.4 * dom[ev.token], delta=ev.delta * (1 + 0.5 * dom[ev.token])), dom


@settings(max_examples=6, deadline=None)
@given(n=st.integers(40, 120), k=st.integers(2, 6), seed=st.integers(0, 10_000))
def test_domain_rates_of_copies_as_documents_are_those_of_one_token_a_document(n, k, seed):
    """The shrinkage's errors resample the probe's units: k copies of each token in one
    document carry exactly the information of the token alone, so the shrunk rates are equal."""
    from tokdyn.curriculum.mixture import DomainRates

    ev, dom = _two_domains(n, seed)
    one = DomainRates.from_events(ev, dom, ("a", "b"), n_boot=16, seed=seed)
    many = DomainRates.from_events(_copies(ev, k), np.repeat(dom, k), ("a", "b"), n_boot=16, seed=seed)
    np.testing.assert_allclose(many.rates, one.rates, rtol=1e-9, atol=1e-12)


def test_domain_rates_resampled_token_by_token_shrink_too_little():
    """What the units fix, as in the spectrum: copies resampled one by one read as k times the
    data, errors about sqrt(k) too small, so differences that are noise survive the shrinkage."""
    from tokdyn.curriculum.mixture import DomainRates

    ev, dom = _two_domains(60, 4)
    docs, ddom = _copies(ev, 9), np.repeat(dom, 9)
    raw = DomainRates.from_events(docs, ddom, ("a", "b"), significance=0).rates
    spread = lambda r: np.abs(r - r.mean(1, keepdims=True)).sum()  # noqa: E731
    by_doc = spread(DomainRates.from_events(docs, ddom, ("a", "b")).rates) / spread(raw)
    by_token = spread(DomainRates.from_events(replace(docs, unit=None, unit_kind="token"), ddom, ("a", "b")).rates) / spread(raw)
    tokens_as_units = DomainRates.from_events(replace(docs, unit=np.arange(docs.n_tokens), unit_kind="token"), ddom, ("a", "b"))
    np.testing.assert_array_equal(tokens_as_units.rates, DomainRates.from_events(replace(docs, unit=None, unit_kind="token"), ddom, ("a", "b")).rates)
    assert by_doc < 0.5 * by_token, (by_doc, by_token)  # 0.07-0.09 against 0.51-0.54 over seeds 0-2


def test_the_measurement_of_a_pilots_domain_rates_is_the_same_over_one_token_windows(tmp_path):
    """pipelines/spectrum_units.py's "domain rates" case on a pilot whose windows hold one target
    each: its units are its tokens (so named), and the two bootstraps agree exactly."""
    from test_curriculum_pilot_checks import planted_pilot

    rng = np.random.default_rng(3)
    store = planted_pilot(tmp_path / "p.zarr", rng.uniform(2.0, 3.0, 40), rng.uniform(3.0, 4.0, 40))
    out = units.domain_rates(tokdyn.open_store(store), "pilot", 100_000)
    assert out["units"] == out["tokens"] and out["units"]["resampled"] == "tokens"
    assert out["units"]["n_units"] == out["probe_tokens"] == 80
    assert 0 < out["units"]["spread_kept"] <= 1 and out["units"]["best"] <= out["units"]["best_unshrunk"]
