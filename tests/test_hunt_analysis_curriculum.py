"""The mixture schedule under hostile knobs and pilots: weights are finite and sum to 1 at any
temperature; a domain the pilot has no token of is refused (not silently held at the floor); a
schedule file that is damaged or edited is one InputError, never a traceback or other weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokdyn
from reliability_fixtures import cli_error_line, run_cli
from tokdyn.curriculum.mixture import (DomainRates, MixtureConfig, MixtureSchedule, load_mixture_schedule,
                                       pilot_events)  # fmt: skip
from tokdyn.errors import InputError

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))
BYTE = {"kind": "byte", "vocab_size": 257, "eot_id": 256}


def planted(path, mu, domain, domains) -> str:
    """A fitted pilot: token i learned at mu[i] (3 nats, width 0.1 decades), of domain[i]."""
    rng = np.random.default_rng(0)
    mu = np.asarray(mu, float)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(97, 123, size=(mu.size, 2)), domain=np.asarray(domain),
                                        domains=tuple(domains), tokenizer=BYTE)  # fmt: skip
    x = np.log10(STEPS)
    st_ = tokdyn.open_store(path, probe, mode="w")
    with st_.create_run("pilot", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            w.append((1 + 3 / (1 + np.exp((x[j] - mu) / 0.1)) + 0.05 * rng.standard_normal(mu.size)).astype(np.float32),
                     step=int(step))  # fmt: skip
    tokdyn.fit_run(tokdyn.open_store(path, mode="r+").run("pilot"), progress=False)
    return str(path)


@pytest.fixture(scope="module")
def three_domains(tmp_path_factory):
    """Domains a and b with 40 tokens each, c with none."""
    rng = np.random.default_rng(1)
    return planted(tmp_path_factory.mktemp("p") / "p.zarr", np.r_[rng.uniform(2, 3, 40), rng.uniform(3, 4, 40)],
                   np.repeat([0, 1], 40), ("a", "b", "c"))  # fmt: skip


# -- temperature: the weights stay finite and sum to 1 ----------------------------------------


@settings(max_examples=200, deadline=None)
@given(log_t=st.floats(-323.3, 300), floor=st.floats(0, 1), seed=st.integers(0, 2**32 - 1), d=st.integers(2, 5),
       scale=st.sampled_from([1e-300, 1e-5, 1.0, 30.0, 1e200]))  # fmt: skip
def test_weights_are_finite_and_sum_to_1_at_any_temperature(log_t, floor, seed, d, scale):
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0, 1, (50, d)) * scale
    rates[rng.uniform(size=rates.shape) < 0.3] = 0.0
    x = np.linspace(0, 3, 50)
    sched = MixtureSchedule(DomainRates([f"d{k}" for k in range(d)], x, rates),
                            MixtureConfig(total_steps=500, floor=floor, temperature=10.0**log_t))  # fmt: skip
    w = sched.table_
    assert np.all(np.isfinite(w))
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(w >= floor * sched.base - 1e-12)
    e = sched.enrichment()
    assert all(np.isfinite(e[k]) for k in ("schedule", "best", "unbounded", "baseline_rate"))
    # every non-floor weight goes to falling domains: a domain that does not fall keeps the floor
    r = sched.rates.at(sched.config.xs())
    falling = (r > 0).any(axis=1)
    assert np.allclose(w[falling][r[falling] == 0], (floor * sched.base[None, :].repeat(falling.sum(), 0))[r[falling] == 0])


def test_a_tiny_temperature_by_the_command_line_gives_a_valid_file(three_domains, tmp_path, capsys):
    # c has no token: use a two-domain pilot made of a and b only
    rng = np.random.default_rng(2)
    p = planted(tmp_path / "p.zarr", np.r_[rng.uniform(2, 3, 30), rng.uniform(3, 4, 30)], np.repeat([0, 1], 30), ("a", "b"))
    out = tmp_path / "m.json"
    assert run_cli(["curriculum", "schedule", p, "--run", "pilot", "--steps", "300", "--out", str(out),
                    "--temperature", "1e-300"], capsys)[0] == 0  # fmt: skip
    d = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the schedule file"))
    w = np.asarray(d["weights"])
    assert np.all(np.isfinite(w)) and np.allclose(w.sum(1), 1)
    assert np.isfinite(d["enrichment"]["schedule"])
    load_mixture_schedule(out)


# -- a domain the pilot has no token of --------------------------------------------------------


def test_a_domain_without_probe_tokens_is_refused(three_domains, tmp_path, capsys):
    pe = pilot_events(three_domains, "pilot")
    with pytest.raises(InputError, match=r"\['c'\] have no probe tokens"):
        DomainRates.from_events(pe.events, pe.token_domain, pe.domains)
    out = tmp_path / "m.json"
    code, err = run_cli(["curriculum", "schedule", three_domains, "--run", "pilot", "--steps", "100", "--out", str(out)], capsys)
    assert code == 1 and "have no probe tokens" in cli_error_line(err) and not out.exists()


def test_domain_indices_outside_the_names_are_refused(three_domains):
    pe = pilot_events(three_domains, "pilot")
    dom = pe.token_domain.copy()
    dom[0] = 7
    with pytest.raises(InputError, match="indices into the 2 domains"):
        DomainRates.from_events(pe.events, dom, ("a", "b"))


# -- a schedule file that is damaged or edited ------------------------------------------------


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    x = np.linspace(1, 4, 30)
    rates = np.stack([np.exp(-((x - 2) ** 2)), np.exp(-((x - 3) ** 2))], axis=1)
    path = tmp_path_factory.mktemp("m") / "good.json"
    MixtureSchedule(DomainRates(["a", "b"], x, rates), MixtureConfig(total_steps=200), base=[0.7, 0.3]).save(path)
    return json.loads(path.read_text())


def _without(d, key):
    return {k: v for k, v in d.items() if k != key}


DAMAGED = {
    "no rates": lambda d: _without(d, "rates"),
    "no config": lambda d: _without(d, "config"),
    "no base": lambda d: _without(d, "base"),
    "no weights": lambda d: _without(d, "weights"),
    "config a list": lambda d: {**d, "config": [1, 2]},
    "unknown config field": lambda d: {**d, "config": {**d["config"], "evil": 1}},
    "floor a string": lambda d: {**d, "config": {**d["config"], "floor": "x"}},
    "rates null": lambda d: {**d, "rates": None},
    "rates a string of domains": lambda d: {**d, "rates": {**d["rates"], "domains": "ab"}},
    "ragged rates": lambda d: {**d, "rates": {**d["rates"], "rates": [[0.1], [0.2, 0.3]]}},
    "base null": lambda d: {**d, "base": None},
    "base a string": lambda d: {**d, "base": "x"},
    "other domains": lambda d: {**d, "domains": ["z", "y"]},
    "edited weights": lambda d: {**d, "weights": [[1.0, 0.0]] * len(d["weights"])},
    "weights of other steps": lambda d: {**d, "weights": d["weights"][:-1]},
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_or_edited_schedule_file_is_one_input_error(case, good_file, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(DAMAGED[case](good_file)))
    with pytest.raises(InputError, match="m.json"):
        load_mixture_schedule(path)


def test_the_good_file_loads_with_its_base(good_file, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(good_file))
    sched = load_mixture_schedule(path)
    assert sched.base.tolist() == [0.7, 0.3]
    assert np.array_equal(sched.table_, np.asarray(good_file["weights"]))


def test_a_table_under_a_file_says_which_part_is_a_file(three_domains, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    code, err = run_cli(["curriculum", "build", three_domains, "--run", "pilot", "--out", str(tmp_path / "afile" / "t.npz")],
                        capsys)  # fmt: skip
    assert code == 1 and "afile is a file, not a folder" in cli_error_line(err)


def test_a_huge_lead_is_said_in_a_few_digits(tmp_path, capsys):
    from tokdyn.cli import main

    rng = np.random.default_rng(2)
    p = planted(tmp_path / "p.zarr", np.r_[rng.uniform(2, 3, 30), rng.uniform(3, 4, 30)], np.repeat([0, 1], 30), ("a", "b"))
    capsys.readouterr()
    assert main(["curriculum", "schedule", p, "--run", "pilot", "--steps", "10", "--out", str(tmp_path / "m.json"),
                 "--lead", "1e300"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "x 1e+300..1e+300" in out and max(len(line) for line in out.splitlines()) < 400


def test_domain_names_that_show_nothing_are_escaped_on_the_terminal(tmp_path, capsys):
    """A domain name from the probe's files with a right-to-left override turned the rest of the
    schedule's line around on a terminal, and a zero-width space made two names look alike: the
    schedule's lines escape them as the report does; so does every error and warning line."""
    from tokdyn.cli import error_line, main

    rng = np.random.default_rng(2)
    names = ("a\u202eb", "c\u200bd")
    p = planted(tmp_path / "p.zarr", np.r_[rng.uniform(2, 3, 30), rng.uniform(3, 4, 30)], np.repeat([0, 1], 30), names)
    capsys.readouterr()
    assert main(["curriculum", "schedule", p, "--run", "pilot", "--steps", "10", "--out", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "\u202e" not in out and "\u200b" not in out and "a\\u202eb" in out and "c\\u200bd" in out
    assert error_line(InputError("domain x\u202ey, run\x1b[31m red")) == "domain x\\u202ey, run\\x1b[31m red"
