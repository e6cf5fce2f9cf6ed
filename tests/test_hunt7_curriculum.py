"""Hunt 7, the curriculum's analysis side: the v1 weights at a small temperature (they
overflowed to uniform or NaN weights), the A/B intervals over few seeds (a percentile bootstrap
that held the mean half the time from 2 seeds), and `tokdyn compare` on tokens a run never
learned (noise fitted as learning events, counted as moved)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tokdyn
from tokdyn.compare import compare_runs
from tokdyn.errors import InputError
from tokdyn.curriculum.learnability import LearnabilityOptions, LearnabilityTable
from tokdyn.curriculum.measure import paired_bootstrap
from tokdyn.curriculum.schedule import CurriculumConfig, SampleSchedule
from tokdyn.curriculum.weights import TokenWeights

BYTE = {"kind": "byte", "vocab_size": 257, "eot_id": 256}


# -- v1 weights at a small temperature ------------------------------------------------------------


def _table(scale: float = 1.0) -> LearnabilityTable:
    """Order 1, vocabulary 4: token 0 learned at x 1 dropping 3 * scale nats, the others at x 2
    dropping 1 * scale (every pilot token of an id has the same targets, so the estimates are them)."""
    rng = np.random.default_rng(0)
    tok = rng.integers(0, 4, (40, 9))
    t = tok[:, 1:].reshape(-1)
    mu, delta = np.where(t == 0, 1.0, 2.0), np.where(t == 0, 3.0, 1.0) * scale
    return LearnabilityTable.fit(tok, {"mu": mu, "delta": delta, "weight": delta}, vocab_size=4,
                                 options=LearnabilityOptions(order=1, holdout=0, prior=0))  # fmt: skip


def _expected_probabilities(scores: np.ndarray, temperature: float, floor: float) -> np.ndarray:
    """``floor/N + (1-floor) s^(1/T) / sum s^(1/T)``, in logs (math.fsum of exp of differences)."""
    logq = [math.log(s) / temperature if s > 0 else -math.inf for s in scores]
    top = max(logq)
    e = [math.exp(v - top) for v in logq]
    tot = math.fsum(e)
    return np.array([floor / len(scores) + (1 - floor) * v / tot for v in e])


WINDOWS = np.array([[0] * 9, [1] * 9, [2] * 9, [0, 1] * 4 + [0]])


@pytest.mark.parametrize("temperature", [0.5, 0.05, 0.01, 0.002, 1e-6])
@pytest.mark.parametrize("floor", [0.0, 0.3])
def test_sampling_probabilities_at_a_small_temperature_are_the_tempered_scores(temperature, floor):
    table = _table()
    sched = SampleSchedule(table, WINDOWS, CurriculumConfig(total_steps=100, temperature=temperature, floor=floor), tokenizer=4)
    for step in (0, 9, 99):
        s = sched.scores(step)
        p = sched.probabilities(step)  # was uniform (inf / inf) at T <= 0.002, or "no sample scores" at floor 0
        assert np.all(np.isfinite(p)) and p.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(p, _expected_probabilities(s, temperature, floor), rtol=1e-9, atol=1e-12)


def test_sampling_at_a_small_temperature_with_tiny_scores_does_not_give_up():
    # every score below 1: s^(1/T) underflowed to 0 for all, and floor 0 said nothing scores
    table = _table(scale=1e-3)
    sched = SampleSchedule(table, WINDOWS, CurriculumConfig(total_steps=100, temperature=0.002, floor=0.0), tokenizer=4)
    s = sched.scores(9)
    assert 0 < s.max() < 1
    np.testing.assert_allclose(sched.probabilities(9), _expected_probabilities(s, 0.002, 0.0), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("temperature", [0.5, 0.05, 0.01, 0.002])
@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_token_weights_at_a_small_temperature_are_the_tempered_rates(temperature, scale):
    table = _table(scale)
    cfg = CurriculumConfig(total_steps=100, temperature=temperature, floor=0.3)
    tw = TokenWeights(table, cfg, tokenizer=4)
    batch = torch.tensor(WINDOWS)
    for step in (0, 9, 99):
        w = tw(batch, step).double().numpy()  # was NaN (inf / inf) or all 0.3 (batch mean 0.3, not 1)
        mu, delta, _ = table.lookup(batch)
        u = cfg.learnability(cfg.x(step), mu.double().numpy(), delta.double().numpy()).ravel()
        p = _expected_probabilities(u, temperature, 0.0)  # q / sum q, in logs
        want = 0.3 + 0.7 * p * u.size  # q / mean q = (q / sum q) * n
        assert np.all(np.isfinite(w)) and w.mean() == pytest.approx(1.0, rel=1e-5)
        np.testing.assert_allclose(w.ravel(), want, rtol=1e-4, atol=1e-5)


# -- intervals over seeds -------------------------------------------------------------------------


def test_the_interval_from_two_seeds_is_the_t_interval_not_their_range():
    # two seeds: the percentile bootstrap gave [1, 3] (their range); the mean's 95 % t interval is
    # 2 +- t(0.975, 1) * sd / sqrt(2) with t(0.975, 1) = 12.7062 and sd = sqrt(2)
    r = paired_bootstrap([1.0, 3.0])
    assert r["mean"] == pytest.approx(2.0) and r["n"] == 2
    assert r["ci95"] == [pytest.approx(2 - 12.7062047, abs=1e-5), pytest.approx(2 + 12.7062047, abs=1e-5)]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_95_percent_interval_holds_the_mean_95_percent_of_the_time(n):
    rng = np.random.default_rng(n)
    reps = 600
    hits = 0
    for r in range(reps):
        lo, hi = paired_bootstrap(rng.normal(0.05, 0.02, n), n_boot=400, seed=r)["ci95"]
        hits += lo <= 0.05 <= hi
    # binomial sd at 0.95 over 600: 0.9 %; the percentile bootstrap held 50 / 74 / 84 %
    assert hits / reps >= 0.92


def test_constant_values_still_give_a_zero_width_interval():
    r = paired_bootstrap([0.1] * 4)
    assert r["ci95"] == [pytest.approx(0.1), pytest.approx(0.1)]


# -- tokdyn compare: a token a run never learned has no shift -------------------------------------

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))


def _add_run(path, name, mu, *, probe=None, seed=0) -> None:
    """Run ``name``: token i's loss falls 3 nats at mu[i] (width 0.1 decades), noise 0.05;
    a mu far past the range (9) is a loss that stays flat at 4 nats, never learned."""
    rng = np.random.default_rng(seed)
    x = np.log10(STEPS)
    st = tokdyn.open_store(path, probe, mode="w") if probe is not None else tokdyn.open_store(path, mode="r+")
    with st.create_run(name, capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            w.append((1 + 3 / (1 + np.exp((x[j] - mu) / 0.1)) + 0.05 * rng.standard_normal(mu.size)).astype(np.float32),
                     step=int(step))  # fmt: skip
    tokdyn.fit_run(tokdyn.open_store(path, mode="r+").run(name), progress=False)


@pytest.fixture(scope="module")
def half_never_learned(tmp_path_factory):
    """Run A learns 160 tokens at x 1.5..3.5; run B learns the even ones 0.3 decades later and
    never learns the odd ones (their loss stays flat)."""
    rng = np.random.default_rng(0)
    n = 160
    mu = rng.uniform(1.5, 3.5, n)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(97, 123, size=(n // 4, 5)), domain=np.repeat([0, 1], n // 8),
                                        domains=("a", "b"), tokenizer=BYTE)  # fmt: skip
    path = tmp_path_factory.mktemp("cmp") / "s.zarr"
    _add_run(path, "A", mu, probe=probe)
    _add_run(path, "B", np.where(np.arange(n) % 2 == 0, mu + 0.3, 9.0), seed=2)
    return str(path), n


def test_tokens_a_run_never_learned_are_not_counted_as_moved(half_never_learned):
    path, n = half_never_learned
    r = compare_runs(path, "A", "B")
    o = r["overall"]
    # the answer: half the tokens learned in both, each 0.3 decades later; none earlier. Before,
    # the flat tokens' noise fits made about half of them "learned in both" (of 400 tokens: 97 of
    # 200), and 14 % of the tokens and of the drop "moved earlier"
    assert o["n_tokens"] == n // 2
    assert o["share_earlier"] == 0.0 and o["drop_share_earlier"] == 0.0
    assert o["median_shift"] == pytest.approx(0.3, abs=0.05)
    assert r["n_learned"] == {"A": n, "B": n // 2}
    for dom in r["by_domain"].values():
        assert dom["share_earlier"] == 0.0


def test_compare_prints_how_many_tokens_each_run_learned(half_never_learned, capsys):
    path, n = half_never_learned
    from tokdyn.cli import main

    capsys.readouterr()
    assert main(["compare", path, "--run", "A", "--run", "B"]) == 0
    out = capsys.readouterr().out
    assert f"{n // 2} of {n} tokens with an event in both" in out
    assert f"in 'A': {n}, in 'B': {n // 2}" in out


def test_a_nan_score_stays_nan_at_any_temperature_never_uniform_weights():
    """Reviewed: dividing by the largest score made a NaN one (the largest is then NaN) into zeros,
    and the weights uniform without a word; u ** (1/T) gave NaN, as it does again."""
    import torch

    from tokdyn.curriculum.schedule import CurriculumConfig

    for t in (1.0, 0.5, 0.01):
        c = CurriculumConfig(total_steps=10, temperature=t)
        assert np.isnan(c.sharpen(np.array([0.5, np.nan, 0.2]))).any()
        assert torch.isnan(c.sharpen(torch.tensor([0.5, float("nan"), 0.2]))).any()


def test_a_nan_score_reaches_the_weights_and_probabilities_as_nan_or_one_error(monkeypatch):
    """Reviewed: the consumers of sharpen turned a NaN score into uniform weights (TokenWeights'
    NaN mean failed "mean > 0") or into "no sample scores" (SampleSchedule)."""
    import torch

    from test_curriculum import HAND, V, _table
    from tokdyn.curriculum.schedule import CurriculumConfig, SampleSchedule
    from tokdyn.curriculum.weights import TokenWeights

    tab = _table(HAND, mu_global=1.0, delta_global=0.5)
    windows = np.random.default_rng(2).integers(0, 5, size=(40, 6))
    sched = SampleSchedule(tab, windows, CurriculumConfig(total_steps=100), tokenizer=V, bin_width=0.5)
    good = sched.scores(3)
    monkeypatch.setattr(sched, "scores", lambda step: np.where(np.arange(good.size) == 2, np.nan, good))
    with pytest.raises(InputError, match="NaN"):
        sched.probabilities(3)
    w = TokenWeights(tab, CurriculumConfig(total_steps=100), tokenizer=V)
    real = w.table.lookup
    monkeypatch.setattr(w.table, "lookup", lambda t: (lambda mu, d, e: (mu.clone().fill_(float("nan")), d, e))(*real(t)))
    assert torch.isnan(w(torch.randint(0, 5, (2, 7)), 3)).all()
