"""Numbers `tokdyn spectrum` prints only where their inputs support them (docs/spectrum.md,
"What is not printed"): the spectrum's power law only on a window of at least
POWER_LAW_MIN_WIDTH resolution lengths where rho is positive; its bootstrap interval only from
BOOT_MIN_TOKENS tokens (effective) and BOOT_MIN_RESAMPLES fitted resamples, with the reason where
not; the loss law's exponent never its bound; and the histogram in at most HIST_LINES lines."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.spectrum import _ALPHA_MAX, _ALPHA_MIN, Events, learning_time_spectrum, loss_power_law, spectrum_power_law

# The rules, as numbers (test_the_rules_are_the_modules_constants ties them to the code).
POWER_LAW_MIN_WIDTH = 5  # resolution lengths: a line's 2 parameters and 3 independent values to judge it
BOOT_MIN_TOKENS = 10  # effective tokens a bootstrap over tokens needs
BOOT_MIN_RESAMPLES = 39  # the range of n resamples covers (n-1)/(n+1) of their distribution: 95 % at 39
HIST_LINES = 40  # histogram lines printed at most


def test_the_rules_are_the_modules_constants():
    from tokdyn import spectrum
    from tokdyn.cli import analysis

    assert (spectrum.POWER_LAW_MIN_WIDTH, spectrum.BOOT_MIN_TOKENS, spectrum.BOOT_MIN_RESAMPLES, analysis.HIST_LINES) == (
        POWER_LAW_MIN_WIDTH, BOOT_MIN_TOKENS, BOOT_MIN_RESAMPLES, HIST_LINES)  # fmt: skip


def _events(n_tokens, *, decades=4.0, k=30, seed=0, n_carry=None, drops=None, s=0.15) -> Events:
    """One event per token of the first ``n_carry`` (default all) of ``n_tokens``, learning times
    spread over the range, fitted on ``k`` checkpoints evenly spaced in log over ``decades``."""
    rng = np.random.default_rng(seed)
    n_carry = n_tokens if n_carry is None else n_carry
    mu = rng.uniform(0.1 * decades, 0.9 * decades, n_carry)
    d = np.full(n_carry, 2.0) if drops is None else np.asarray(drops, float)
    return Events(np.arange(n_carry), mu, np.full(n_carry, s), d, n_tokens, (0.0, decades), resolution=decades / (k - 1))


# -- 1. the power law's window -------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(k=st.integers(4, 7), decades=st.floats(1.0, 8.0), seed=st.integers(0, 1000), kernel=st.sampled_from(["event", "delta"]))
def test_few_checkpoints_leave_too_narrow_a_window_for_a_power_law(k, decades, seed, kernel):
    """K checkpoints evenly spaced in log: the default bandwidth is their spacing and the window
    K - 3 spacings, under 5 for K < 8. A line through a density smoothed over that fits whatever
    the events (5 checkpoints: "alpha -0.025, R^2 0.84"); it is refused, saying why."""
    ev = _events(400, decades=decades, k=k, seed=seed)
    with pytest.raises(InputError, match="resolution lengths wide"):
        spectrum_power_law(ev, n_boot=0, kernel=kernel)


def test_a_bandwidth_below_the_checkpoint_spacing_does_not_widen_the_window():
    ev = _events(400, k=5)  # 1 decade between checkpoints
    with pytest.raises(InputError, match="checkpoint spacing"):
        spectrum_power_law(ev, bandwidth=0.05, n_boot=0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(4, 60), decades=st.floats(0.5, 6.0), h=st.none() | st.floats(0.005, 2.0), seed=st.integers(0, 1000),
       trim=st.none() | st.floats(0.0, 1.0))  # fmt: skip
def test_a_fitted_spectrum_power_law_always_spans_enough_resolution_lengths(k, decades, h, seed, trim):
    ev = _events(300, decades=decades, k=k, seed=seed)
    try:
        pl = spectrum_power_law(ev, bandwidth="auto" if h is None else h, n_boot=0, trim=trim)
    except InputError:
        return
    length = max(pl.params["bandwidth"], ev.resolution)
    assert pl.x_fit[1] - pl.x_fit[0] >= POWER_LAW_MIN_WIDTH * length * (1 - 1e-9)


def test_the_demo_like_case_keeps_its_fit():
    """35 checkpoints over 3 decades (the demo's run): a window of about 30 bandwidths."""
    ev = _events(2000, decades=3.0, k=35)
    pl = spectrum_power_law(ev, n_boot=0)
    assert pl.x_fit[1] - pl.x_fit[0] > 20 * ev.resolution


def test_the_window_is_where_rho_is_positive():
    """Tokens whose loss rose (negative drops) make rho negative near x = 3: the line is fitted
    where log rho exists (it used to drop those points and still claim the whole window)."""
    good = _events(500, decades=4.0, seed=1)
    rng = np.random.default_rng(2)
    mu = np.concatenate([good.mu, rng.normal(3.2, 0.05, 100)])
    delta = np.concatenate([good.delta, np.full(100, -30.0)])
    ev = Events(np.arange(600), mu, np.full(600, 0.15), delta, 600, (0.0, 4.0), resolution=good.resolution)
    spec = learning_time_spectrum(ev)
    pl = spectrum_power_law(ev, n_boot=0, spectrum=spec)
    xs = np.linspace(spec.x_range[0] + spec.bandwidth, spec.x_range[1] - spec.bandwidth, 32)
    inside = xs[(xs >= pl.x_fit[0]) & (xs <= pl.x_fit[1])]
    assert (spec.at(xs) <= 0).any() and (spec.at(inside) > 0).all()


# -- 2. the bootstrap interval ---------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(n_carry=st.integers(1, BOOT_MIN_TOKENS - 1), n_tokens=st.integers(BOOT_MIN_TOKENS, 300), seed=st.integers(0, 1000),
       kernel=st.sampled_from(["event", "delta"]))  # fmt: skip
def test_an_interval_from_fewer_tokens_than_the_minimum_is_not_given(n_carry, n_tokens, seed, kernel):
    """One token: every resample is the same spectrum scaled, "alpha = -0.446 [-0.446, -0.446]"."""
    ev = _events(n_tokens, n_carry=n_carry, seed=seed, decades=4.0, s=0.6)
    pl = spectrum_power_law(ev, n_boot=200, kernel=kernel, bandwidth=0.2)
    assert np.isnan(pl.alpha_lo) and np.isnan(pl.alpha_hi)
    why = pl.params.get("alpha_ci95_why") or ""
    assert "token" in why and str(BOOT_MIN_TOKENS) in why


def test_one_token_of_drop_among_many_of_noise_counts_as_one():
    drops = np.r_[3.0, np.full(99, 1e-4)]
    pl = spectrum_power_law(_events(100, drops=drops, s=0.6), n_boot=200, bandwidth=0.2)
    assert np.isnan(pl.alpha_lo) and "effectively 1.0" in (pl.params.get("alpha_ci95_why") or "")


@pytest.mark.parametrize("n_boot", [0, 1, 2, BOOT_MIN_RESAMPLES - 1])
def test_too_few_resamples_give_no_interval(n_boot):
    pl = spectrum_power_law(_events(400), n_boot=n_boot)
    assert np.isnan(pl.alpha_lo) and np.isnan(pl.alpha_hi) and pl.params.get("alpha_ci95_why")
    assert np.isfinite(pl.alpha)  # the exponent itself is still fitted


def test_enough_tokens_and_resamples_give_an_interval():
    pl = spectrum_power_law(_events(400), n_boot=BOOT_MIN_RESAMPLES)
    assert pl.alpha_lo < pl.alpha_hi and pl.params.get("alpha_ci95_why") is None


# -- the loss law's exponent on its bound ----------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(n=st.integers(6, 30), kind=st.sampled_from(["floor_at_second_point", "rising", "flat"]), noise=st.floats(0, 1e-3),
       seed=st.integers(0, 1000))  # fmt: skip
def test_the_loss_exponent_is_never_its_bound(n, kind, noise, seed):
    """A loss on its floor from the second point fitted alpha = 10.000 [9.071, 10.000], R^2 1.000:
    the bound of the search, not a measurement. Whatever is returned lies inside the bounds."""
    x = np.linspace(0, 3, n)
    loss = {"floor_at_second_point": 1 + 2.0 * (x == 0), "rising": 1 + 0.2 * x, "flat": np.ones(n)}[kind]
    loss = loss + noise * np.random.default_rng(seed).standard_normal(n)
    try:
        pl = loss_power_law(x, loss)
    except InputError:
        return
    assert 2 * _ALPHA_MIN < pl.alpha < _ALPHA_MAX * (1 - 1e-6)


def test_a_loss_on_its_floor_after_one_point_has_no_exponent():
    x = np.linspace(0, 3, 12)
    with pytest.raises(InputError, match="bound"):
        loss_power_law(x, 1 + 2.0 * (x == 0))


# -- the command ---------------------------------------------------------------------------------


def _store(path, k, *, n=120, seed=0) -> str:
    rng = np.random.default_rng(seed)
    steps = np.unique(np.round(np.geomspace(10, 100_000, k)).astype(np.int64))
    x = np.log10(steps)
    mu = rng.uniform(x[0], x[-1], n)
    Y = 1 + 3.0 / (1 + np.exp((x[None, :] - mu[:, None]) / 0.2)) + 0.05 * rng.standard_normal((n, x.size))
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st_ = tokdyn.open_store(path, probe, mode="w")
    with st_.create_run("r", capacity=len(steps)).writer() as w:
        for j, step in enumerate(steps):
            w.append(Y[:, j].astype(np.float32), step=int(step))
    tokdyn.fit_run(st_.run("r"), progress=False, options=tokdyn.FitOptions(min_points=min(6, k)))
    return str(path)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("honesty")
    return {"k5": _store(d / "k5.zarr", 5), "k30": _store(d / "k30.zarr", 30)}


def _power_lines(out: str) -> dict:
    return {ln.split()[4]: ln for ln in out.splitlines() if ln.startswith("power law of the")}


def test_cli_says_why_there_is_no_power_law(stores, capsys):
    assert main(["spectrum", stores["k5"], "--run", "r", "--boot", "0"]) == 0
    lines = _power_lines(capsys.readouterr().out)
    assert "none:" in lines["spectrum"] and "resolution lengths wide" in lines["spectrum"], lines
    assert "none:" in lines["loss"] and "at least 6" in lines["loss"], lines


@pytest.mark.parametrize("boot", ["0", "2"])
def test_cli_says_why_there_is_no_interval(stores, capsys, boot):
    assert main(["spectrum", stores["k30"], "--run", "r", "--boot", boot]) == 0
    line = _power_lines(capsys.readouterr().out)["spectrum"]
    assert "no 95 % interval:" in line and "nan" not in line, line


def test_cli_histogram_is_bounded_and_json_keeps_every_bin(stores, capsys):
    assert main(["spectrum", stores["k30"], "--run", "r", "--boot", "0", "--bandwidth", "0.001"]) == 0
    out = capsys.readouterr().out
    bars = [ln for ln in out.splitlines() if ln.startswith("  x ")]
    assert 1 <= len(bars) <= HIST_LINES and len(out.splitlines()) <= HIST_LINES + 5
    assert "--json" in out
    assert main(["spectrum", stores["k30"], "--run", "r", "--boot", "0", "--bandwidth", "0.001", "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["spectrum"]
    edges, hist = np.array(spec["edges"]), np.array(spec["hist"])
    assert hist.size == round(4 / 0.001)  # every bin, one per bandwidth over the 4 decades
    # the printed lines carry the same drop: each the drop per decade of the bins it merges
    printed = sum((float(b) - float(a)) * float(v) for a, b, v in
                  (re.match(r"\s+x\s+(\S+)\.\.\s*(\S+)\s+(\S+) nats", ln).groups() for ln in bars))  # fmt: skip
    assert printed == pytest.approx(float((hist * np.diff(edges)).sum()), rel=0.02)


def test_cli_histogram_is_unchanged_where_it_is_short(stores, capsys):
    assert main(["spectrum", stores["k30"], "--run", "r", "--boot", "0"]) == 0
    bars = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  x ")]
    assert main(["spectrum", stores["k30"], "--run", "r", "--boot", "0", "--json"]) == 0
    assert len(bars) == len(json.loads(capsys.readouterr().out)["spectrum"]["hist"]) <= HIST_LINES


@pytest.mark.parametrize("command", ["spectrum", "reconstruct"])
def test_cli_refuses_a_boot_out_of_range_instead_of_dropping_the_power_law(stores, capsys, command):
    assert main([command, stores["k30"], "--run", "r", "--boot", "-1"]) == 1
    err = capsys.readouterr().err.strip()
    assert "--boot" in err and len(err.splitlines()) == 1
