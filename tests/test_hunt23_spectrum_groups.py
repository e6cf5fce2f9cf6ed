"""Hunt 23, the spectrum and its groups (`tokdyn spectrum --by`, :func:`tokdyn.spectrum.spectra_by`):
groups that were lost or merged without a word, and what a group held in one document claims."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_hunt23_curriculum import _one_document_a_domain
from tokdyn.cli import main
from tokdyn.spectrum import Events, group_labels, learning_time_spectrum, spectra_by


def _events(n: int, seed: int = 0) -> Events:
    """One sharp event a token, learning times drawn from 1.5 .. 3.5 over an observed 1 .. 4."""
    rng = np.random.default_rng(seed)
    return Events(token=np.arange(n), mu=rng.uniform(1.5, 3.5, n), s=np.full(n, 0.2), delta=rng.uniform(0.5, 1.5, n),
                  n_tokens=n, x_range=(1.0, 4.0))  # fmt: skip


# -- names that read alike -----------------------------------------------------------------


def test_a_name_that_reads_as_another_groups_label_keeps_both_groups():
    """Domains 'a', 'a' and 'a [1]' (an old store's probe may name two alike): the second 'a'
    was labelled by its code, 'a [1]', which the third already was, and its spectrum was
    overwritten: 2 groups of 3, 0.654 of the 0.983 nats/token the whole spectrum carries."""
    ev = _events(90)
    out = spectra_by(ev, np.repeat([0, 1, 2], 30), ["a", "a", "a [1]"])
    assert len(out) == 3 and [s.n_events for s in out.values()] == [30, 30, 30]
    assert sum(s.total_drop for s in out.values()) == pytest.approx(learning_time_spectrum(ev).total_drop, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(names=st.lists(st.sampled_from(["a", "a [0]", "a [1]", "a [2]", "a [1] [1]", "b", "b [0]", ""]), min_size=1, max_size=6),
       seed=st.integers(0, 3))  # fmt: skip
def test_every_group_keeps_its_spectrum_whatever_its_name(names, seed):
    """Every group of 10 events or more has a spectrum under a label no other group has, and the
    group spectra add up to the whole (the labels are those :func:`group_labels` gives)."""
    k = len(names)
    ev = _events(12 * k, seed)
    code = np.random.default_rng(seed).permutation(np.repeat(np.arange(k), 12))
    out = spectra_by(ev, code, names)
    assert list(out) == group_labels(names) and len(set(out)) == k
    for label, c in zip(group_labels(names), range(k)):  # each label is its own group's events
        assert out[label].n_events == 12 and out[label].total_drop == pytest.approx(
            learning_time_spectrum(ev.for_tokens(code == c), bandwidth=out[label].bandwidth).total_drop)
    assert sum(s.total_drop for s in out.values()) == pytest.approx(learning_time_spectrum(ev).total_drop, rel=1e-9)


def test_distinct_names_are_their_own_labels():
    assert group_labels(["web", "code", "a [1]"]) == ["web", "code", "a [1]"]
    assert group_labels(["a", "a", "b"], [3, 7, 9]) == ["a [3]", "a [7]", "b"]


# -- groups held in one document -----------------------------------------------------------


def test_domains_of_one_document_each_claim_no_interval(tmp_path, capsys):
    """The known limit said `tokdyn spectrum --by domain` gave a domain held in one document an
    interval of zero width. The groups have no interval of their own (drop, peak and events
    only); the whole spectrum's interval resamples the probe's documents, and two of them are
    too few: it is refused, saying so, never [a, a]."""
    url = _one_document_a_domain(tmp_path / "p.zarr")
    assert main(["spectrum", url, "--by", "domain"]) == 0
    out = capsys.readouterr().out
    assert "no 95 % interval: the events' drop comes from 2 document(s)" in out
    rows = [line for line in out.splitlines() if line.startswith("  a ") or line.startswith("  b ")]
    assert len(rows) == 2 and not any("[" in r for r in rows)
    assert main(["spectrum", url, "--by", "domain", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["spectrum_power_law"]["alpha_ci95"] == [None, None] or all(
        v != v for v in res["spectrum_power_law"]["alpha_ci95"])  # NaN or null: no interval
    assert res["spectrum_power_law"]["resampled"] == "documents" and res["spectrum_power_law"]["n_units"] == 2
    assert set(res["groups"]) == {"a", "b"} and not any("alpha" in g for g in res["groups"].values())


# -- names as the table prints them --------------------------------------------------------


def _two_domain_store(path, domains) -> str:
    """A fitted run of 16 windows of 4 tokens, alternately of the two domains ``domains``."""
    from test_hunt11_spectrum import _fitted_store, _sigmoids

    return _fitted_store(path, _sigmoids(np.random.default_rng(3).uniform(1.8, 3.2, 64)), domains=domains)


@pytest.mark.parametrize("domains", [("web\n  forged      9.999   x   1.00   99", "\x1b[2Jcode"), ("", " "), ("code", "code ")])
def test_the_by_table_shows_each_name_on_its_own_line_told_apart(tmp_path, capsys, domains):
    """The `--by domain` table printed a domain's name as it is: a newline in it made a line of
    its own (a forged group row), an escape sequence cleared the terminal, and domains '' and ' '
    (or 'code' and 'code ') printed as rows no reader could tell apart. The names are shown as
    the other commands show them (tokdyn._text.labels): escaped, quoted where they would show
    nothing or alike."""
    from tokdyn._text import labels

    url = _two_domain_store(tmp_path / "s.zarr", domains)
    assert main(["spectrum", url, "--by", "domain", "--boot", "0"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    table = out.split("by domain:")[1].splitlines()[1:3]
    assert all(line.startswith("  ") and len(line.split()) >= 4 for line in table)
    assert sorted(line[2:].rsplit(None, 4)[0] for line in table) == sorted(labels(domains))
    assert len({line[2:].rsplit(None, 4)[0] for line in table}) == 2


# -- the units of the whole spectrum's interval: of the tokens it scored ------------------------


def _one_document(path, *, padding: int) -> str:
    """A fitted run of one document of 30 windows of 2 targets, learned at times from 2 .. 3.5,
    and ``padding`` windows more in a document of their own that are never scored (NaN at every
    step: an imported probe's padding)."""
    import tokdyn
    from test_curriculum_pilot_checks import BYTE, STEPS

    rng = np.random.default_rng(7)
    mu = rng.uniform(2, 3.5, 60)
    noise = rng.standard_normal((len(STEPS), 60))
    doc = np.repeat([0, 1], [30, padding])
    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(1).integers(97, 123, size=(30 + padding, 3)), doc_id=doc,
                                        tokenizer=BYTE)  # fmt: skip
    x = np.log10(STEPS)
    store = tokdyn.open_store(str(path), probe, mode="w")
    with store.create_run("r", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            y = np.full(2 * (30 + padding), np.nan, np.float32)
            y[:60] = 1 + 3 / (1 + np.exp((x[j] - mu) / 0.1)) + 0.05 * noise[j]
            w.append(y, step=int(step))
    tokdyn.fit_run(tokdyn.open_store(str(path), mode="r+").run("r"), progress=False)
    return str(path)


@pytest.mark.filterwarnings("ignore:.*non-finite losses stored as NaN")
def test_never_scored_tokens_in_a_document_of_their_own_do_not_take_the_interval_away(tmp_path, capsys):
    """A probe of one document is resampled by its windows (a document alone gives every
    resample the same spectrum); with never-scored padding in a second document, the probe told
    two documents apart, the bootstrap took documents, found the drop in one, and printed no
    interval at all. The units are chosen among the tokens scored (the curriculum's rule,
    tokdyn.spectrum.units_by_group): the padding changes the units and the exponent in
    nothing (the draws of the resamples, which also number its windows, differ)."""
    lines = {}
    for padding in (0, 4):
        url = _one_document(tmp_path / f"p{padding}.zarr", padding=padding)
        assert main(["spectrum", url, "--json"]) == 0
        lines[padding] = json.loads(capsys.readouterr().out)["spectrum_power_law"]
    assert lines[0]["resampled"] == "windows" and lines[0]["n_units"] == 30
    assert lines[4]["resampled"] == lines[0]["resampled"] and lines[4]["n_units"] == lines[0]["n_units"]
    assert lines[4]["alpha"] == pytest.approx(lines[0]["alpha"], rel=1e-9) and lines[4]["alpha_ci95_why"] is None
    (lo0, hi0), (lo4, hi4) = lines[0]["alpha_ci95"], lines[4]["alpha_ci95"]  # other draws (2 units more): alike, not equal
    assert lo4 < lines[4]["alpha"] < hi4 and 0.5 < (hi4 - lo4) / (hi0 - lo0) < 2
