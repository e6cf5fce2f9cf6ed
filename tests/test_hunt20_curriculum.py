"""The mixture curriculum as a researcher feeds it: a pilot whose probe has tokens without a
recorded loss, a probe labelled with the domains in another order, the temperature's limit, grids
and weights from hand-made rates. Each was a silent wrong answer or a traceback (hunt 20)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokdyn
from reliability_fixtures import cli_error_line, run_cli
from tokdyn.corpus import Document
from tokdyn.curriculum.pilot import mixture_probe, split_pilot_pool
from tokdyn.curriculum.mixture import DomainRates, MixtureConfig, MixtureSchedule, load_mixture_schedule, pilot_events
from tokdyn.data import MixtureDataset, prepare_domains
from tokdyn.errors import InputError

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))
BYTE = {"kind": "byte", "vocab_size": 257, "eot_id": 256}


def _pilot(path, mu: np.ndarray, domain: np.ndarray, domains, unrecorded: np.ndarray) -> str:
    """A fitted pilot: token i learned at mu[i] (3 nats, width 0.1 decades), of domain[i]; the
    tokens ``unrecorded`` have a loss of NaN at every step (never observed)."""
    rng = np.random.default_rng(0)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(97, 123, size=(mu.size, 2)), domain=domain, domains=tuple(domains),
                                        tokenizer=BYTE)  # fmt: skip
    noise = 0.05 * rng.standard_normal((len(STEPS), mu.size))
    st_ = tokdyn.open_store(path, probe, mode="w")
    with st_.create_run("pilot", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            row = 1 + 3 / (1 + np.exp((np.log10(step) - mu) / 0.1)) + noise[j]
            row[unrecorded] = np.nan
            with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning) if unrecorded.any() else _nothing():
                w.append(row.astype(np.float32), step=int(step))
    tokdyn.fit_run(tokdyn.open_store(path, mode="r+").run("pilot"), progress=False)
    return str(path)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- a domain's rate is per token the pilot scored ---------------------------------------------


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """Domains a and b learned token for token at the same times; every other token of b never
    recorded (NaN). The rates must be equal: b's unrecorded tokens say nothing about b."""
    m = 120
    mu_a = np.random.default_rng(3).uniform(2, 3, m)
    unrecorded = np.zeros(2 * m, bool)
    unrecorded[m + np.arange(0, m, 2)] = True
    return _pilot(tmp_path_factory.mktemp("p") / "p.zarr", np.r_[mu_a, mu_a], np.repeat([0, 1], m), ("a", "b"), unrecorded)


def test_tokens_without_a_recorded_loss_do_not_lower_their_domains_rate(twins):
    pe = pilot_events(twins, "pilot")
    assert pe.events.n_scored == 180 and pe.events.n_scored_of(pe.token_domain == 1) == 60
    raw = DomainRates.from_events(pe.events, pe.token_domain, pe.domains, significance=0)
    peak = raw.rates.max()
    on = raw.rates.max(axis=1) > 0.2 * peak  # where the domains learn (b's every other token is a's twin)
    ratio = raw.rates[on, 1] / raw.rates[on, 0]
    assert 0.8 < np.median(ratio) < 1.25, np.median(ratio)  # was 0.5: b's rate over all 120 of its tokens
    # with the noise shrinkage, two domains learned at the same times get the baseline mixture
    sched = MixtureSchedule(DomainRates.from_events(pe.events, pe.token_domain, pe.domains), MixtureConfig(total_steps=10_000))
    assert np.allclose(sched.table_, 0.5, atol=0.03), sched.table_.min(axis=0)


def test_the_spectrum_by_domain_still_shares_out_the_whole_probe(twins):
    """The per-token rate of a domain is the curriculum's; the spectrum's densities stay shares of
    the mean over every scored token (a domain's parts add up to the whole)."""
    pe = pilot_events(twins, "pilot")
    whole = tokdyn.spectrum.learning_time_spectrum(pe.events, bandwidth=0.1, kernel="event", grid=101)
    parts = [tokdyn.spectrum.learning_time_spectrum(pe.events.for_tokens(pe.token_domain == k), bandwidth=0.1, kernel="event",
                                                    grid=101) for k in range(2)]  # fmt: skip
    assert np.allclose(parts[0].density + parts[1].density, whole.density, rtol=1e-9, atol=1e-12)


def test_a_domain_whose_tokens_were_never_recorded_is_refused(tmp_path, capsys):
    m = 60
    mu = np.random.default_rng(4).uniform(2, 3, 2 * m)
    p = _pilot(tmp_path / "p.zarr", mu, np.repeat([0, 1], m), ("a", "b"), np.repeat([False, True], m))
    pe = pilot_events(p, "pilot")
    with pytest.raises(InputError, match=r"\['b'\] have no probe token with a recorded loss"):
        DomainRates.from_events(pe.events, pe.token_domain, pe.domains)
    out = tmp_path / "m.json"
    code, err = run_cli(["curriculum", "schedule", p, "--run", "pilot", "--steps", "100", "--out", str(out)], capsys)
    assert code == 1 and "['b'] have no probe token with a recorded loss" in cli_error_line(err) and not out.exists()


def test_events_scored_must_agree_with_their_count():
    ev = dict(token=[0], mu=[2.0], s=[0.1], delta=[1.0], n_tokens=3, x_range=(1.0, 4.0))
    e = tokdyn.spectrum.Events(**ev, scored=np.array([True, False, True]))
    assert e.n_scored == 2 and e.n_scored_of(np.array([False, True, True])) == 1
    assert tokdyn.spectrum.Events(**ev).n_scored_of(np.array([False, True, True])) == 2  # unknown: every token
    with pytest.raises(InputError, match="not the number of tokens scored"):
        tokdyn.spectrum.Events(**ev, scored=np.array([True, False, True]), n_scored=3)
    with pytest.raises(InputError, match="Events.scored"):
        tokdyn.spectrum.Events(**ev, scored=np.array([1, 0, 1]))


# -- a probe's domain labels are the dataset's --------------------------------------------------


@pytest.fixture(scope="module")
def mixture():
    docs = [Document(key=f"z{i}", domain="zeros", text="0" * 3000) for i in range(4)] + \
           [Document(key=f"l{i}", domain="letters", text="abcdefghij" * 300) for i in range(4)]  # fmt: skip
    corpus = prepare_domains(docs, min_tokens=100)
    return MixtureDataset(corpus, context=16), corpus.tokenizer.spec()


def test_a_probe_labels_each_domain_with_its_own_windows(mixture):
    ds, tok = mixture
    for make in (lambda **kw: mixture_probe(ds, tokenizer=tok, **kw),
                 lambda **kw: split_pilot_pool(ds, eot_id=None, share=0.5).probe(ds, tokenizer=tok, **kw)):  # fmt: skip
        probe = make(per_domain=3)
        assert probe.domains == ds.domains == ("zeros", "letters")
        dom, tid = np.asarray(probe.token_arrays["domain"]), np.asarray(probe.token_arrays["token_id"])
        zeros = set(tid[dom == 0].tolist())
        assert len(zeros) == 1 and zeros.isdisjoint(tid[dom == 1].tolist())  # one repeated symbol, none of the letters'
        assert make(per_domain=3, domains=["zeros", "letters"]).fingerprint == probe.fingerprint
        for other in (("letters", "zeros"), ("a", "b"), ("zeros",), "zl"):
            with pytest.raises(InputError, match="domains"):
                make(per_domain=3, domains=other)


# -- the temperature's limit, hand-made rates, the weights handed out ---------------------------


@settings(max_examples=60, deadline=None)
@given(t=st.floats(5e-324, 1e-300), floor=st.floats(0, 1), seed=st.integers(0, 2**32 - 1))
def test_a_vanishing_temperature_gives_the_largest_rate_everything_but_the_floor(t, floor, seed):
    """T -> 0: every weight above the floor goes to the domain of the largest rate (subnormal T
    made every row the baseline mixture)."""
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.01, 3.0, (8, 3))
    sched = MixtureSchedule(DomainRates(["a", "b", "c"], np.linspace(0, 3, 8), rates),
                            MixtureConfig(total_steps=1000, floor=floor, temperature=t))  # fmt: skip
    r = sched.rates.at(sched.config.xs())
    want = floor / 3 + (1 - floor) * (r == r.max(axis=1, keepdims=True))
    assert np.allclose(sched.table_, want, atol=1e-12)


def test_a_grid_that_is_not_finite_is_refused():
    rates = np.ones((4, 2))
    for x in ([0, np.nan, 1, 2], [0, 1, 2, np.inf], [-np.inf, 0, 1, 2]):
        with pytest.raises(InputError, match="increasing grid of at least 2 finite points"):
            DomainRates(["a", "b"], x, rates)


@pytest.mark.parametrize("width", [0.0, 0.001, 0.01, 0.2, 2.0])
def test_rates_from_curves_at_any_width(width):
    """Losses falling 1 nat per decade (a) and 0.5 (b) from one evaluation per decade: the rates are
    1 and 0.5 everywhere, at any width (at 0.01 every grid point between two midpoints had weights
    of 0 and the constructor said 'rates must be finite')."""
    steps = [10, 100, 1000, 10_000]
    r = DomainRates.from_curves(steps, np.array([[4, 3], [3, 2.5], [2, 2], [1, 1.5]]), ["a", "b"], width=width)
    assert np.allclose(r.rates, [1.0, 0.5])


def test_weights_handed_out_do_not_change_the_schedule(tmp_path):
    sched = MixtureSchedule(DomainRates(["a", "b"], [0, 2, 4], [[1, 2], [3, 1], [1, 1]]), MixtureConfig(total_steps=100))
    before, fp = sched.table_.copy(), sched.fingerprint()
    w = sched.weights(5)
    w[0], w[1] = 0.0, 1.0  # a user's loop edits the row it was given
    assert np.array_equal(sched.table_, before) and sched.fingerprint() == fp
    with pytest.raises(ValueError):
        sched.table_[5, 0] = 0.0
    sched.save(tmp_path / "m.json")
    assert load_mixture_schedule(tmp_path / "m.json").fingerprint() == fp


@pytest.mark.parametrize("call, what", [
    (lambda: DomainRates([], [0, 1], np.zeros((2, 0))), "one domain at least"),
    (lambda: DomainRates("ab", [0, 1], np.zeros((2, 2))), "sequence of domain names"),
    (lambda: DomainRates(["a", "b"], [0, 1], [["x", "y"], ["z", "w"]]), "rates must be numbers"),
    (lambda: DomainRates.from_curves([1, 10], [[2, 2], [1, 1]], "ab"), "sequence of domain names"),
    (lambda: DomainRates.from_curves([1, 10], [[2, 2], [1, 1]], ["a", "b"], width=-1), "width"),
    (lambda: MixtureSchedule(DomainRates(["a", "b"], [0, 1], np.ones((2, 2))), MixtureConfig(total_steps=10),
                             base={"a": 0.5, "b": 0.5}), "base must be numbers"),
])  # fmt: skip
def test_hand_made_rates_are_refused_in_one_line(call, what):
    with pytest.raises(InputError, match=what):
        call()


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_a_schedule_file_of_another_schema_version_is_refused(tmp_path, version):
    path = tmp_path / "m.json"
    MixtureSchedule(DomainRates(["a", "b"], [0, 2, 4], [[1, 2], [3, 1], [1, 1]]), MixtureConfig(total_steps=50)).save(path)
    d = json.loads(path.read_text())
    path.write_text(json.dumps({**d, "schema_version": version}))
    with pytest.raises(InputError, match="schema version"):
        load_mixture_schedule(path)
