"""The curriculum's parts against independent answers: hand-computed keys, targets, shrinkage,
weights and probabilities; planted learning times recovered per key; invariances (probabilities
sum to 1 and never fall below the floor, token weights average 1); a sampler that resumes to
the same sequence; and one clear error per kind of bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokdyn.curriculum import (
    CurriculumConfig,
    CurriculumSampler,
    LearnabilityOptions,
    LearnabilityTable,
    SampleSchedule,
    TokenWeights,
    context_keys,
    kernel,
    load_table,
    token_targets,
)
from tokdyn.curriculum.experiment import compare_curves, steps_to_reach, summarize, weight_diagnostics
from tokdyn.data import WindowDataset
from tokdyn.errors import InputError
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.train import TrainConfig, train

V = 10


def _table(levels: dict[int, dict[int, tuple[float, float]]], *, vocab=V, mu_global=1.0, delta_global=0.5, meta=None):
    """A table from ``{order: {key: (mu, delta)}}`` written by hand."""
    out = []
    for k in range(1, max(levels) + 1):
        items = sorted(levels.get(k, {}).items())
        out.append({
            "keys": torch.tensor([key for key, _ in items], dtype=torch.int64),
            "mu": torch.tensor([m for _, (m, _) in items], dtype=torch.float32),
            "delta": torch.tensor([d for _, (_, d) in items], dtype=torch.float32),
            "count": torch.ones(len(items), dtype=torch.int64),
            "n_events": torch.ones(len(items), dtype=torch.int64),
        })  # fmt: skip
    return LearnabilityTable(vocab_size=vocab, levels=out, mu_global=mu_global, delta_global=delta_global,
                             meta=meta or {"tokenizer": {"kind": "byte", "vocab_size": vocab}})  # fmt: skip


# -- keys and targets ----------------------------------------------------------------------


def test_context_keys_by_hand():
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    k1, k2, k3 = context_keys(tokens, order=3, vocab_size=V)
    b = V + 1
    assert k1.tolist() == [[1, 4, 1, 5]]
    assert k2.tolist() == [[1 + b * 3, 4 + b * 1, 1 + b * 4, 5 + b * 1]]
    prev2 = [V, 3, 1, 4]  # the first target has no token two back: "no token" id V
    assert k3.tolist() == [[k + b * b * p for k, p in zip(k2[0].tolist(), prev2)]]
    assert torch.equal(k3 % b**2, k2) and torch.equal(k2 % b, k1)  # parents by modulo


def test_token_targets_by_hand():
    ev = {"token": np.array([0, 0, 2, 3]), "mu": np.array([1.0, 2.0, 0.5, np.nan]), "delta": np.array([1.0, 3.0, -1.0, 2.0])}
    t = token_targets(ev, 4)
    np.testing.assert_allclose(t["delta"], [4.0, 0.0, -1.0, 0.0])  # the NaN event is dropped
    np.testing.assert_allclose(t["weight"], [4.0, 0.0, 0.0, 0.0])
    assert t["mu"][0] == pytest.approx((1 * 1 + 3 * 2) / 4) and np.isnan(t["mu"][1:]).all()


def test_shrinkage_toward_the_global_mean_by_hand():
    # order 1: token 7 three times (drops 1, 2, 3; learned at 0, 1, 2), token 8 once (drop 10 at mu 3)
    tokens = np.array([[0, 7], [0, 7], [0, 7], [0, 8]])
    targets = {"delta": np.array([1.0, 2, 3, 10]), "mu": np.array([0.0, 1, 2, 3]), "weight": np.array([1.0, 2, 3, 10])}
    tab = LearnabilityTable.fit(tokens, targets, vocab_size=V, options=LearnabilityOptions(order=1, prior=1.0, holdout=0))
    d_glob, mu_glob, w_bar = 16 / 4, (0 * 1 + 1 * 2 + 2 * 3 + 3 * 10) / 16, 16 / 4
    assert tab.delta_global == pytest.approx(d_glob) and tab.mu_global == pytest.approx(mu_glob)
    mu, delta, level = tab.lookup(torch.tensor([[0, 7, 8, 9]]))
    np.testing.assert_allclose(delta[0].numpy(), [(6 + d_glob) / 4, (10 + d_glob) / 2, d_glob], rtol=1e-6)
    mu7 = (8 + w_bar * mu_glob) / (6 + w_bar)
    mu8 = (30 + w_bar * mu_glob) / (10 + w_bar)
    np.testing.assert_allclose(mu[0].numpy(), [mu7, mu8, mu_glob], rtol=1e-6)
    assert level[0].tolist() == [1, 1, 0]  # token 9 was never seen: the global estimate answers


def test_table_recovers_planted_learning_times_per_key():
    """Plant mu by (previous token, token) and delta by token; the table must find them."""
    rng = np.random.default_rng(0)
    v = 6
    mu_true = rng.uniform(0.5, 2.5, size=(v, v))  # [prev, tok]
    d_true = rng.uniform(0.5, 3.0, size=v)
    windows = rng.integers(0, v, size=(3000, 17))
    prev, tok = windows[:, :-1], windows[:, 1:]
    mu = mu_true[prev, tok] + rng.normal(0, 0.05, size=tok.shape)
    delta = d_true[tok] + rng.normal(0, 0.05, size=tok.shape)
    targets = {"delta": delta.ravel(), "mu": mu.ravel(), "weight": np.clip(delta, 0, None).ravel()}
    tab = LearnabilityTable.fit(windows, targets, vocab_size=v, options=LearnabilityOptions(order=3, min_count=5))
    probe = np.array([[a, b] for a in range(v) for b in range(v)])  # every (prev, tok) once
    mu_hat, d_hat, level = tab.lookup(torch.from_numpy(probe))
    np.testing.assert_allclose(mu_hat[:, 0].numpy(), mu_true[probe[:, 0], probe[:, 1]], atol=0.03)
    np.testing.assert_allclose(d_hat[:, 0].numpy(), d_true[probe[:, 1]], atol=0.03)
    assert (level == 3).all()  # (no token, prev, tok): every pilot window's first target had such a key


def test_rare_keys_back_off_to_shorter_ones():
    # (1 -> 2) occurs 3 times (below min_count 5): the order-2 key is dropped and token 2 answers
    tokens = np.array([[1, 2]] * 3 + [[0, 2]] * 20 + [[0, 3]] * 20)
    mu = np.array([5.0] * 3 + [1.0] * 20 + [2.0] * 20)
    targets = {"delta": np.ones(43), "mu": mu, "weight": np.ones(43)}
    tab = LearnabilityTable.fit(tokens, targets, vocab_size=V, options=LearnabilityOptions(order=2, min_count=5, holdout=0))
    m, _, level = tab.lookup(torch.tensor([[1, 2], [0, 2]]))
    m1, _, _ = LearnabilityTable.fit(tokens, targets, vocab_size=V, options=LearnabilityOptions(order=1, holdout=0)).lookup(
        torch.tensor([[1, 2]]))  # fmt: skip
    assert level[:, 0].tolist() == [1, 2]
    assert m[0, 0] == pytest.approx(float(m1[0, 0]))


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    windows = rng.integers(0, V, size=(200, 9))
    n = 200 * 8
    targets = {"delta": rng.uniform(0, 2, n), "mu": rng.uniform(0, 2, n), "weight": np.ones(n)}
    tab = LearnabilityTable.fit(windows, targets, vocab_size=V, meta={"tokenizer": {"kind": "byte", "vocab_size": V}})
    path = tab.save(tmp_path / "t.npz")
    back = load_table(path)
    probe = torch.from_numpy(rng.integers(0, V, size=(50, 9)))
    for a, b in zip(tab.lookup(probe), back.lookup(probe)):
        assert torch.equal(a, b)
    assert back.meta["tokenizer"] == {"kind": "byte", "vocab_size": V} and back.n_keys == tab.n_keys
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(InputError, match="not a learnability table"):
        load_table(tmp_path / "other.npz")
    with pytest.raises(InputError, match=".npz"):
        tab.save(tmp_path / "t.json")


def test_table_from_another_tokenizer_is_refused():
    tab = _table({1: {1: (1.0, 1.0)}}, meta={"tokenizer": {"kind": "hf", "vocab_size": V, "sha256": "aa"}})
    tab.check_tokenizer(V)
    tab.check_tokenizer({"kind": "hf", "vocab_size": V, "sha256": "aa"})
    with pytest.raises(InputError, match="vocabulary of 10.*has 257"):
        tab.check_tokenizer(257)
    with pytest.raises(InputError, match="sha256 differs"):
        tab.check_tokenizer({"kind": "hf", "vocab_size": V, "sha256": "bb"})
    with pytest.raises(InputError, match="vocabulary of 10"):
        TokenWeights(tab, CurriculumConfig(total_steps=10), tokenizer=257)
    with pytest.raises(InputError, match=r"token ids span \[1, 12\].*vocabulary of 10"):
        tab.predict(np.array([[1, 12]]))


# -- schedule ------------------------------------------------------------------------------


def test_config_validates_and_refuses_steps_beyond_its_range():
    cfg = CurriculumConfig(total_steps=100, time_scale=2.0, lead=0.1)
    assert cfg.x(0) == pytest.approx(math.log10(2.0) + 0.1)
    assert cfg.x(99) == pytest.approx(math.log10(200.0) + 0.1)
    with pytest.raises(InputError, match="covers steps 0..99.*step 100"):
        cfg.x(100)
    for bad in (dict(width=0), dict(floor=1.5), dict(temperature=0), dict(kernel="box"), dict(time_scale=-1)):
        with pytest.raises(InputError):
            CurriculumConfig(total_steps=10, **bad)


def test_kernels_have_unit_area_and_match_between_numpy_and_torch():
    z = np.linspace(-40, 40, 200001)
    for kind in ("logistic", "gaussian"):
        assert np.trapezoid(kernel(z, kind), z) == pytest.approx(1.0, abs=1e-6)
        np.testing.assert_allclose(kernel(torch.from_numpy(z), kind).numpy(), kernel(z, kind))
    s = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(kernel(z, "logistic"), s * (1 - s), atol=1e-15)


# Two keys by hand: token 1 learned at mu 0.5 with drop 2, token 2 at mu 2.0 with drop 1; others global.
HAND = {1: {1: (0.5, 2.0), 2: (2.0, 1.0), 3: (1.0, 0.0)}}


def _direct_probabilities(windows, cfg, step, mu_of, d_of):
    """An independent computation straight from the formula, token by token."""
    x = math.log10((step + 1) * cfg.time_scale) + cfg.lead
    scores = []
    for w in windows:
        u = 0.0
        for t in w[1:]:
            mu, d = mu_of[t], d_of[t]
            z = (x - mu) / cfg.width
            k = math.exp(-abs(z)) / (1 + math.exp(-abs(z))) ** 2 if cfg.kernel == "logistic" else math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
            u += max(d, 0.0) * k / cfg.width
        scores.append(u ** (1 / cfg.temperature))
    q = np.array(scores)
    return cfg.floor / len(q) + (1 - cfg.floor) * q / q.sum()


@pytest.mark.parametrize("kind,temperature,floor", [("logistic", 1.0, 0.3), ("gaussian", 0.5, 0.1), ("logistic", 2.0, 0.0)])
def test_sample_probabilities_by_hand(kind, temperature, floor):
    rng = np.random.default_rng(2)
    windows = rng.integers(0, 5, size=(40, 6))
    tab = _table(HAND, mu_global=1.0, delta_global=0.5)
    mu_of = {0: 1.0, 1: 0.5, 2: 2.0, 3: 1.0, 4: 1.0}
    d_of = {0: 0.5, 1: 2.0, 2: 1.0, 3: 0.0, 4: 0.5}
    cfg = CurriculumConfig(total_steps=1000, width=0.4, kernel=kind, temperature=temperature, floor=floor)
    sched = SampleSchedule(tab, windows, cfg, tokenizer=V, bin_width=0.5)  # every planted mu on a bin centre
    for step in (0, 3, 30, 999):
        p = sched.probabilities(step)
        np.testing.assert_allclose(p, _direct_probabilities(windows, cfg, step, mu_of, d_of), rtol=1e-5)
        assert p.sum() == pytest.approx(1.0) and p.min() >= floor / len(p) * (1 - 1e-12)


def test_floor_one_is_uniform_and_early_steps_favour_early_tokens():
    windows = np.array([[0, 1, 1, 1], [0, 2, 2, 2]])  # all early (mu 0.5) vs all late (mu 2.0)
    tab = _table(HAND)
    uniform = SampleSchedule(tab, windows, CurriculumConfig(total_steps=1000, floor=1.0), tokenizer=V)
    np.testing.assert_allclose(uniform.probabilities(5), [0.5, 0.5])
    sched = SampleSchedule(tab, windows, CurriculumConfig(total_steps=1000, floor=0.2), tokenizer=V)
    assert sched.probabilities(2)[0] > 0.8  # x = log10 3 = 0.48: the early window's tokens are being learned
    assert sched.probabilities(999)[1] > 0.8  # x = 3: only the late tokens are still near


def test_all_zero_weights_are_refused():
    windows = np.array([[0, 3, 3], [3, 3, 3]])
    zero = _table({1: {3: (1.0, 0.0)}}, delta_global=-0.5)  # no positive drop anywhere
    with pytest.raises(InputError, match="every curriculum weight would be zero"):
        SampleSchedule(zero, windows, CurriculumConfig(total_steps=10), tokenizer=V)
    with pytest.raises(InputError, match="would be zero"):
        TokenWeights(zero, CurriculumConfig(total_steps=10), tokenizer=V)
    far = _table({1: {3: (50.0, 1.0)}}, mu_global=50.0)  # learned 10^50 steps from now
    sched = SampleSchedule(far, windows, CurriculumConfig(total_steps=10, kernel="gaussian", width=0.1, floor=0.0), tokenizer=V)
    with pytest.raises(InputError, match="floor=0 every weight would be zero"):
        sched.probabilities(3)
    ok = SampleSchedule(far, windows, CurriculumConfig(total_steps=10, kernel="gaussian", width=0.1, floor=0.5), tokenizer=V)
    np.testing.assert_allclose(ok.probabilities(3), [0.5, 0.5])  # the floor alone: uniform


# -- sampler -------------------------------------------------------------------------------


def _schedule(n=30, steps=20, floor=0.3):
    rng = np.random.default_rng(3)
    return SampleSchedule(_table(HAND), rng.integers(0, 5, size=(n, 6)), CurriculumConfig(total_steps=steps, floor=floor), tokenizer=V)


def test_sampler_is_deterministic_and_resumes_to_the_same_sequence():
    sched = _schedule()
    full = list(CurriculumSampler(sched, samples_per_step=4, seed=7))
    assert len(full) == 20 * 4 and full == list(CurriculumSampler(sched, samples_per_step=4, seed=7))
    assert full != list(CurriculumSampler(sched, samples_per_step=4, seed=8))
    s = CurriculumSampler(sched, samples_per_step=4, seed=7)
    it = iter(s)
    head = [next(it) for _ in range(33)]  # stop in the middle of a step
    state = s.state_dict()
    resumed = CurriculumSampler(sched, samples_per_step=4, seed=7)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    at_step = CurriculumSampler(sched, samples_per_step=4, seed=7)
    at_step.load_state_dict(s.state_dict(step=5))
    assert list(at_step) == full[20:]
    with pytest.raises(InputError, match="does not match"):
        CurriculumSampler(sched, samples_per_step=4, seed=8).load_state_dict(state)
    with pytest.raises(InputError, match="does not match"):
        CurriculumSampler(_schedule(floor=0.5), samples_per_step=4, seed=7).load_state_dict(state)


def test_sampler_draws_follow_the_schedule_and_split_over_ranks():
    sched = _schedule(steps=3)
    s = CurriculumSampler(sched, samples_per_step=40000, seed=0)
    counts = np.bincount(s.draws(1), minlength=30) / 40000
    np.testing.assert_allclose(counts, sched.probabilities(1), atol=0.01)
    ranks = [list(CurriculumSampler(sched, samples_per_step=6, seed=1, rank=r, world_size=3)) for r in range(3)]
    whole = list(CurriculumSampler(sched, samples_per_step=6, seed=1))
    for step in range(3):
        got = sorted(i for r in ranks for i in r[step * 2 : step * 2 + 2])
        assert got == sorted(whole[step * 6 : step * 6 + 6])
    with pytest.raises(InputError, match="covers steps 0..2"):
        s.draws(3)


def test_sampler_feeds_a_plain_dataloader():
    stream = np.random.default_rng(4).integers(0, 5, size=30 * 5 + 1)
    ds = WindowDataset(stream, context=5)
    sched = SampleSchedule(_table(HAND), ds, CurriculumConfig(total_steps=6), tokenizer=V)
    sampler = CurriculumSampler(sched, samples_per_step=4, seed=2)
    batches = list(torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler))
    assert len(batches) == 6
    for step, b in enumerate(batches):
        idx = sampler.draws(step)
        assert torch.equal(b, torch.stack([ds[int(i)] for i in idx]))
        assert torch.equal(b[:, 0], torch.from_numpy(stream[idx * 5]))


def test_uniform_sampler_needs_sizes():
    with pytest.raises(InputError, match="needs n_samples and total_steps"):
        CurriculumSampler(None, samples_per_step=4)
    s = CurriculumSampler(None, samples_per_step=4, n_samples=10, total_steps=3, seed=0)
    assert len(list(s)) == 12 and max(s) < 10


# -- token weights -------------------------------------------------------------------------


def _devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
def test_token_weights_by_hand(device):
    tab = _table({1: {1: (0.5, 2.0), 2: (2.0, 1.0)}, 2: {2 + (V + 1) * 1: (1.0, 4.0)}}, mu_global=1.0, delta_global=0.5)
    cfg = CurriculumConfig(total_steps=100, width=0.3, floor=0.25, temperature=0.5)
    tw = TokenWeights(tab, cfg, tokenizer=V, device=device)
    tokens = torch.tensor([[0, 1, 2, 3], [1, 2, 2, 0]], device=device)
    w = tw(tokens, 9)  # x = 1
    assert w.device.type == device and w.shape == (2, 3)
    # per target: (mu, delta) from the table by hand; (1 -> 2) is the order-2 key
    md = [[(0.5, 2.0), (1.0, 4.0), (1.0, 0.5)], [(1.0, 4.0), (2.0, 1.0), (1.0, 0.5)]]
    u = np.array([[d * math.exp(-abs((1 - m) / 0.3)) / (1 + math.exp(-abs((1 - m) / 0.3))) ** 2 / 0.3 for m, d in row] for row in md])
    q = u**2
    expected = 0.25 + 0.75 * q / q.mean()
    np.testing.assert_allclose(w.cpu().numpy(), expected, rtol=1e-5)
    assert w.mean().item() == pytest.approx(1.0, rel=1e-6) and w.min().item() >= 0.25 - 1e-7
    np.testing.assert_allclose(tw(tokens, torch.tensor(9, device=device)).cpu().numpy(), expected, rtol=1e-5)
    with pytest.raises(InputError, match="covers steps 0..99"):
        tw(tokens, 100)


def test_token_weights_floor_zero_without_scores_are_uniform():
    tab = _table({1: {3: (50.0, 1.0)}}, mu_global=50.0)
    tw = TokenWeights(tab, CurriculumConfig(total_steps=10, kernel="gaussian", width=0.1, floor=0.0), tokenizer=V)
    assert torch.equal(tw(torch.tensor([[3, 3, 3]]), 2), torch.ones(1, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_token_weights_add_no_host_sync_on_cuda():
    tab = _table(HAND)
    tw = TokenWeights(tab, CurriculumConfig(total_steps=100), tokenizer=V, device="cuda")
    tokens = torch.randint(0, V, (8, 33), device="cuda")
    tw(tokens, 3)  # warm-up
    torch.cuda.set_sync_debug_mode("error")
    try:
        tw(tokens, 4)
        tw(tokens, torch.tensor(5, device="cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_train_with_unit_loss_weights_equals_plain_training():
    cfg = GPTConfig(vocab_size=V, context=8, n_layer=1, n_head=2, n_embd=16)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, V, (4, 9), generator=g) for _ in range(5)]
    models = []
    for weights in (None, lambda b, s: torch.ones(b.shape[0], b.shape[1] - 1)):
        torch.manual_seed(0)
        m = TinyGPT(cfg)
        train(m, iter(batches), TrainConfig(steps=5, batch_size=4), loss_weights=weights)
        models.append(m)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b)


def test_train_passes_the_update_index_and_weights_the_loss():
    cfg = GPTConfig(vocab_size=V, context=8, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    batch = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    seen, losses = [], []

    def weights(b, step):
        seen.append(step)
        w = torch.zeros(b.shape[0], b.shape[1] - 1)
        w[0, 3] = 1.0  # only one target counts
        with torch.no_grad():
            losses.append(F.cross_entropy(model(b[:, :-1])[0, 3], b[0, 4]).item())
        return w

    out = train(model, iter([batch] * 3), TrainConfig(steps=3, batch_size=2, warmup=1), loss_weights=weights)
    assert seen == [0, 1, 2]
    assert out["final_train_loss"] == pytest.approx(losses[-1], rel=1e-5)


def test_train_on_batches_that_run_out_says_how_far_it_got():
    # A sampler covering fewer steps than the run ended in a bare StopIteration traceback.
    cfg = GPTConfig(vocab_size=V, context=8, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    batches = [torch.randint(0, V, (2, 9)) for _ in range(3)]
    with pytest.raises(InputError, match=r"ran out at step 4: 3 of the 5 steps"):
        train(TinyGPT(cfg), iter(batches), TrainConfig(steps=6, batch_size=2), start_step=1)


# -- experiment metrics --------------------------------------------------------------------


def test_steps_to_reach_and_comparison_by_hand():
    assert steps_to_reach([10, 20, 30], [3.0, 2.0, 1.0], 1.5) == (25.0, True)
    assert steps_to_reach([10, 20, 30], [3.0, 2.0, 1.6], 1.5) == (30.0, False)
    assert steps_to_reach([10, 20], [1.0, 0.5], 2.0) == (10.0, True)
    base = {0: {"steps": [10, 20, 30, 40], "val_loss": [4.0, 3.0, 2.0, 1.0]}}
    arm = {0: {"steps": [10, 20, 30, 40], "val_loss": [4.0, 2.0, 1.0, 0.5]}}
    c = compare_curves(base, arm)
    assert c["per_seed"]["speedup"] == [pytest.approx(1 - 30 / 40)]
    assert c["per_seed"]["auc_ratio"] == [pytest.approx((3 + 1.5 + 0.75) * 10 / ((3.5 + 2.5 + 1.5) * 10))]
    s = summarize([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["sd"] == pytest.approx(1.0)
    assert s["ci95"][1] - 2.0 == pytest.approx(4.302652729911275 / math.sqrt(3))


def test_weight_diagnostics_of_uniform_and_of_concentrated_weights():
    ds = WindowDataset(np.array([0, 1, 1, 1, 2, 2, 2] * 4 + [0]), context=3)  # windows alternate early / late tokens
    for floor, expect in ((1.0, 1.0), (0.0, None)):
        cfg = CurriculumConfig(total_steps=1000, floor=floor, width=0.1)
        d = weight_diagnostics(SampleSchedule(_table(HAND), ds, cfg, tokenizer=V), TokenWeights(_table(HAND), cfg, tokenizer=V),
                               ds, steps=[2, 999], n_windows=len(ds))  # fmt: skip
        if expect is not None:
            np.testing.assert_allclose(d["sample_effective_share"] + d["token_effective_share"], 1.0)
            np.testing.assert_allclose(d["sample_max_over_uniform"] + d["token_max_over_uniform"], 1.0)
        else:  # all weight on about half the windows / tokens
            assert all(0.3 < v < 0.75 for v in d["sample_effective_share"] + d["token_effective_share"])
