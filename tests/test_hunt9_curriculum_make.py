"""Making curriculum weights from a fitted pilot, under hostile inputs (hunt 9).

- the ladder read-out (``measure.speedup``) of a diverged arm (NaN, inf) or a nearly flat ladder
  is NaN, never an IndexError, ZeroDivisionError or OverflowError at the end of a measurement;
- the v1 comparison of a diverged baseline is NaN, not a speed-up of 0.0, and a NaN evaluation
  crosses nothing;
- ``ABConfig`` refuses knobs the arms would refuse, before the pilot trains;
- the pilot helpers take counts and seeds as ints (2.5 windows was cut to 2; 0 and -1 failed
  inside numpy);
- ``token_stats`` checks its numbers before any work, never blames a threshold it was not given,
  and picks its default early row before a given late row;
- the learnability table: a huge finite ``prior`` gives the parents' estimates (it was NaN, "mu
  and delta must be finite"), a vocabulary too large for order-3 keys is refused naming the
  order that holds it (and order 1 or 2 take it), options of the wrong type are one InputError,
  and a holdout that cannot split the pilot names --holdout;
- the science: a planted pilot's table is the docs' shrinkage formula, computed by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

import tokdyn
from reliability_fixtures import cli_error_line, run_cli
from tokdyn.errors import InputError

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 24)).astype(np.int64))


def planted(path, tokens, mu, *, vocab, delta=3.0, run="pilot", seed=0, unrecorded=None) -> str:
    """A fitted pilot whose probe windows are ``tokens [S, C+1]``; target i learned at ``mu[i]``
    (``delta`` nats, width 0.1 decades), NaN: flat; the targets ``unrecorded`` (a bool mask) have
    a loss of NaN at every step."""
    rng = np.random.default_rng(seed)
    probe = tokdyn.ProbeSet.from_tokens(np.asarray(tokens), tokenizer={"kind": "byte", "vocab_size": vocab})
    mu = np.asarray(mu, float)
    d, m = np.where(np.isfinite(mu), delta, 0.0), np.nan_to_num(mu)
    x = np.log10(STEPS)
    st = tokdyn.open_store(str(path), probe, mode="w")
    with st.create_run(run, capacity=len(STEPS)).writer() as w:
        for j, s in enumerate(STEPS):
            row = 1 + d / (1 + np.exp((x[j] - m) / 0.1)) + 0.02 * rng.standard_normal(mu.size)
            if unrecorded is not None:
                row[unrecorded] = np.nan
            w.append(row.astype(np.float32), step=int(s), warn_nonfinite=False)
    tokdyn.fit_run(tokdyn.open_store(str(path), mode="r+").run(run), progress=False)
    return str(path)


# -- 1. the ladder read-out -------------------------------------------------------------------


LADDER = [0.8, 0.9, 1.0]


@settings(max_examples=300, deadline=None)
@given(l0=hs.floats(0.1, 10), drops=hs.lists(hs.floats(0, 1) | hs.sampled_from([0.0, 1e-15, 1e-12]), min_size=2, max_size=2),
       loss=hs.floats(allow_nan=True, allow_infinity=True) | hs.sampled_from([float("nan"), float("inf"), 0.0, 500.0]))  # fmt: skip
def test_the_ladder_read_out_never_raises_and_is_finite_or_nan(l0, drops, loss):
    from tokdyn.curriculum.measure import matched_budget, speedup

    losses = [l0, l0 - drops[0], l0 - drops[0] - drops[1]]
    bstar, inside = matched_budget(LADDER, losses, loss)
    v, inside2 = speedup(LADDER, losses, loss)
    assert inside == inside2 and isinstance(inside, bool)
    assert math.isnan(bstar) or (math.isfinite(bstar) and bstar > 0)
    assert math.isnan(v) == math.isnan(bstar)
    if not math.isfinite(loss):  # a diverged run: nothing to read, never a traceback
        assert math.isnan(v) and not inside


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), 2.0])
def test_a_diverged_arm_or_a_flat_ladder_reads_nan(loss):
    from tokdyn.curriculum.measure import speedup

    # IndexError (nan), ZeroDivisionError (inf), OverflowError (a ladder flat to 1e-12) before
    assert math.isnan(speedup(LADDER, [3.2, 3.0, 3.0 - 1e-12], loss)[0])
    with pytest.raises(InputError, match="loss must be a number"):
        speedup(LADDER, [3.2, 3.1, 3.0], "3.05")


def test_a_diverged_v1_baseline_gives_no_speed_up_rather_than_zero():
    from tokdyn.curriculum.experiment import compare_curves, steps_to_reach

    # the baseline's final loss is NaN: there is nothing to reach (it read 0.0, "no effect")
    c = compare_curves({0: {"steps": [10, 20, 30], "val_loss": [3.0, 2.0, float("nan")]}},
                       {0: {"steps": [10, 20, 30], "val_loss": [3.0, 2.0, 1.5]}})  # fmt: skip
    assert math.isnan(c["per_seed"]["speedup"][0])
    assert steps_to_reach([10, 20, 30], [3.0, 2.0, 1.0], float("nan")) == (pytest.approx(float("nan"), nan_ok=True), False)
    # a NaN evaluation in the middle is skipped: the crossing lies between the finite ones
    assert steps_to_reach([10, 20, 30], [3.0, float("nan"), 1.0], 1.5) == (pytest.approx(25.0), True)
    # a baseline whose loss is reached at step 0: NaN, not a ZeroDivisionError
    c = compare_curves({0: {"steps": [0, 2], "val_loss": [1.0, 3.0]}}, {0: {"steps": [0, 2], "val_loss": [3.0, 2.0]}})
    assert math.isnan(c["per_seed"]["speedup"][0])


@pytest.mark.parametrize("knob", [dict(width=-1.0), dict(width=float("nan")), dict(kernel="box"), dict(floor=2.0),
                                  dict(temperature=0.0), dict(batch_size=0), dict(context=0), dict(lr=float("nan")),
                                  dict(seeds=(0.5,)), dict(pilot_steps=0), dict(learnability={"order": 2}),
                                  dict(steps="300"), dict(n_embd=30, n_head=4)])  # fmt: skip
def test_the_v1_experiment_refuses_its_knobs_before_the_pilot(knob):
    """Each was accepted, and failed (if at all) only after the pilot had trained and been fitted."""
    from tokdyn.curriculum.experiment import ABConfig

    with pytest.raises(InputError):
        ABConfig(**knob)


def test_the_v1_experiment_checks_only_the_widths_its_arms_use():
    from tokdyn.curriculum.experiment import ABConfig

    ABConfig(arms=("baseline", "sample"), wide_width=-1.0)  # the wide arms are not run
    with pytest.raises(InputError, match="width"):
        ABConfig(arms=("baseline", "sample_wide"), wide_width=-1.0)


# -- 2. pilot helpers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixture():
    from tokdyn.corpus import Document
    from tokdyn.data import MixtureDataset, prepare_domains

    docs = [Document(f"k{i}", "a" if i % 2 else "b", text=("alpha beta gamma " if i % 2 else "0123 4567 89 ") * 400)
            for i in range(12)]  # fmt: skip
    corpus = prepare_domains(docs)
    return corpus, MixtureDataset(corpus, context=16)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_pilot_probe_counts_are_ints_at_least_1(bad, mixture):
    from tokdyn.curriculum.pilot import mixture_probe, pilot_probe, split_pilot_pool

    corpus, ds = mixture
    spec = corpus.tokenizer.spec()
    with pytest.raises(InputError, match="n_sequences must be an int >= 1"):
        pilot_probe(np.arange(200) % 7, context=8, n_sequences=bad, tokenizer={"vocab_size": 7})
    with pytest.raises(InputError, match="per_domain must be an int >= 1"):
        mixture_probe(ds, per_domain=bad, domains=corpus.domains, tokenizer=spec)
    split = split_pilot_pool(ds, eot_id=spec.get("eot_id"), share=0.3)
    with pytest.raises(InputError, match="per_domain must be an int >= 1"):
        split.probe(ds, per_domain=bad, domains=corpus.domains, tokenizer=spec)
    assert mixture_probe(ds, per_domain=np.int64(2), domains=corpus.domains, tokenizer=spec).n_sequences == 4


def test_pilot_probe_seeds_and_share_are_checked(mixture):
    from tokdyn.curriculum.pilot import mixture_probe, pilot_probe, split_pilot_pool

    corpus, ds = mixture
    with pytest.raises(InputError, match="seed must be an int >= 0"):
        pilot_probe(np.arange(200) % 7, context=8, n_sequences=2, tokenizer={"vocab_size": 7}, seed=-1)
    with pytest.raises(InputError, match="seed must be an int >= 0"):
        mixture_probe(ds, per_domain=2, domains=corpus.domains, tokenizer=corpus.tokenizer.spec(), seed=-1)
    with pytest.raises(InputError, match="share must be a number in"):
        split_pilot_pool(ds, eot_id=None, share="x")


# -- 3. token statistics ----------------------------------------------------------------------


def _stats_run(path, Y, steps):
    n = Y.shape[1]
    st = tokdyn.open_store(str(path), tokdyn.ProbeSet(None, {"sample_id": np.zeros(n, np.int32),
                                                             "token_pos": np.arange(1, n + 1, dtype=np.int32)}), mode="w")  # fmt: skip
    with st.create_run("r", capacity=len(steps)).writer() as w:
        for j, s in enumerate(steps):
            w.append(Y[j].astype(np.float32), step=int(s))
    return st.run("r")


def test_token_stats_of_rows_without_a_finite_loss_give_no_class_rather_than_blaming_the_threshold(tmp_path):
    from tokdyn.tokenstats import token_stats

    Y = np.full((5, 4), np.nan)
    Y[:, 0] = [3, 2, np.nan, 1, np.nan]  # rows 2 (the default early) and 4 (late) have no finite loss
    s = token_stats(_stats_run(tmp_path / "s.zarr", Y, [1, 10, 100, 1000, 10000]))
    assert (s.early_row, s.late_row) == (2, 4)
    assert math.isnan(s.threshold) and np.all(s.rho1 == -1)
    assert s.confidence[0] == pytest.approx(np.mean(np.exp(-np.array([3.0, 2.0, 1.0]))))


def test_token_stats_numbers_are_checked_first_and_the_default_early_row_precedes_late_row(tmp_path):
    from tokdyn.tokenstats import frequency_bands, token_stats

    Y = np.abs(np.random.default_rng(0).normal(2, 1, (5, 4)))
    run = _stats_run(tmp_path / "s.zarr", Y, [1, 10, 100, 1000, 10000])
    for kw in (dict(threshold="x"), dict(threshold=10**400), dict(threshold=float("inf")), dict(learned_loss="1"),
               dict(learned_loss=10**400), dict(early_row=True)):  # fmt: skip
        with pytest.raises(InputError):
            token_stats(run, **kw)
    assert token_stats(run).early_row == 2  # the middle of the log axis, as before
    s = token_stats(run, late_row=1)  # "early_row (2) must come before late_row (1)" before
    assert (s.early_row, s.late_row) == (0, 1)
    assert token_stats(run, late_row=3).early_row == 1  # the middle of rows 0..3 (x 0..3: 1.5)
    with pytest.raises(InputError, match="n_bands"):
        frequency_bands(np.array([1, 1, 2]), n_bands=True)
    ids = np.array([1, 1, 2, 3, 3, 3, 4])
    assert frequency_bands(ids, n_bands=np.int64(2))[1] == frequency_bands(ids, n_bands=2)[1]


# -- 4. the learnability table ----------------------------------------------------------------


def _arrays(rng, S=30, C=3, vocab=4):
    tokens = rng.integers(0, vocab, size=(S, C + 1))
    n = S * C
    mu = rng.uniform(1, 4, n)
    delta = rng.uniform(-0.5, 3, n)
    w = np.clip(delta, 0, None)
    mu = np.where(w > 0, mu, np.nan)
    return tokens, {"delta": delta, "mu": mu, "weight": np.where(np.isfinite(mu), w, 0.0)}


@settings(max_examples=40, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1), log_prior=hs.floats(300, 308), order=hs.integers(1, 3))
def test_a_huge_prior_gives_the_parents_estimates(seed, log_prior, order):
    """At a finite prior of 1e300..1e308 every key's estimate is its parent's, down to the global
    mean (the limit of the docs' formula); before, prior * p overflowed to inf / inf = NaN."""
    from tokdyn.curriculum.learnability import LearnabilityOptions, LearnabilityTable

    tokens, targets = _arrays(np.random.default_rng(seed))
    t = LearnabilityTable.fit(tokens, targets, vocab_size=4,
                              options=LearnabilityOptions(order=order, prior=10.0**log_prior, min_count=1, holdout=0))  # fmt: skip
    for lev in t.levels:
        assert torch.allclose(lev["mu"], torch.full_like(lev["mu"], t.mu_global), atol=1e-5)
        assert torch.allclose(lev["delta"], torch.full_like(lev["delta"], t.delta_global), atol=1e-5)


def test_shrinkage_is_unchanged_at_ordinary_priors_by_hand():
    """One key, order 1: (sum delta + prior * global) / (n + prior) and its mu, by hand."""
    from tokdyn.curriculum.learnability import LearnabilityOptions, LearnabilityTable

    tokens = np.array([[0, 1, 1, 2]])  # targets 1, 1, 2
    targets = {"delta": np.array([2.0, 1.0, 0.0]), "mu": np.array([1.0, 3.0, np.nan]), "weight": np.array([2.0, 1.0, 0.0])}
    t = LearnabilityTable.fit(tokens, targets, vocab_size=3, options=LearnabilityOptions(order=1, prior=2.0, holdout=0))
    d_glob, mu_glob, w_bar = 1.0, (2 * 1 + 1 * 3) / 3, 1.5
    lev = t.levels[0]
    assert lev["keys"].tolist() == [1, 2]
    assert lev["delta"].tolist() == pytest.approx([(3 + 2 * d_glob) / 4, (0 + 2 * d_glob) / 3])
    assert lev["mu"].tolist() == pytest.approx([(5 + 2 * w_bar * mu_glob) / (3 + 2 * w_bar), mu_glob], rel=1e-6)


def test_a_vocabulary_too_large_for_order_3_keys_names_the_order_that_holds_it():
    from tokdyn.curriculum.learnability import LearnabilityOptions, LearnabilityTable, context_keys

    tokens, targets = _arrays(np.random.default_rng(0))
    with pytest.raises(InputError, match=r"too large for keys of order 3.*--order 2"):
        LearnabilityTable.fit(tokens, targets, vocab_size=2**31, options=LearnabilityOptions(holdout=0))
    for order in (1, 2):  # refused at every order before, though their keys fit in int64
        t = LearnabilityTable.fit(tokens, targets, vocab_size=2**31, options=LearnabilityOptions(order=order, holdout=0))
        assert t.vocab_size == 2**31 and t.order == order
    with pytest.raises(InputError, match="vocab_size must be an integer"):
        context_keys(torch.tensor([[1, 2]]), order=1, vocab_size=257.5)  # was cut to 257


@pytest.mark.parametrize("kw", [dict(order=True), dict(min_count=True), dict(prior="5"), dict(prior=10**400),
                                dict(prior=True), dict(holdout="0.2"), dict(holdout=None)])  # fmt: skip
def test_learnability_options_of_the_wrong_type_are_one_input_error(kw):
    from tokdyn.curriculum.learnability import LearnabilityOptions

    with pytest.raises(InputError):
        LearnabilityOptions(**kw)


def test_learnability_options_take_numpy_ints():
    from tokdyn.curriculum.learnability import LearnabilityOptions

    assert LearnabilityOptions(order=np.int64(2), min_count=np.int32(3)).order == 2


def test_a_holdout_that_cannot_split_the_pilot_names_the_option(tmp_path, capsys):
    p = planted(tmp_path / "one.zarr", np.array([[1, 2]]), np.array([2.5]), vocab=4)
    code, err = run_cli(["curriculum", "build", p, "--run", "pilot", "--out", str(tmp_path / "t.npz")], capsys)
    line = cli_error_line(err)
    assert code == 1 and "--holdout" in line and "give holdout 0" in line, line
    code, _ = run_cli(["curriculum", "build", p, "--run", "pilot", "--out", str(tmp_path / "t.npz"), "--holdout", "0"], capsys)
    assert code == 0


@pytest.mark.parametrize("unrecorded_share", [0.0, 0.3])
def test_a_planted_pilot_gives_the_docs_estimates_by_hand(tmp_path, unrecorded_share):
    """Targets learned at a time set by the token and its predecessor; every estimate of the
    table built from the fitted pilot is the docs' formula computed here key by key, and the
    order-1 estimates are the planted times. Targets never recorded (NaN at every step) count in
    no estimate and no key's count (they were counted as drops of 0: their keys read as less
    learnable)."""
    from tokdyn.curriculum import build_table
    from tokdyn.curriculum.learnability import LearnabilityOptions

    rng = np.random.default_rng(1)
    V = 3
    tok = rng.integers(0, V, size=(30, 4))
    S, C = tok.shape[0], tok.shape[1] - 1
    mu = np.array([[np.nan if tok[s, p] == 2 and tok[s, p - 1] == 2 else 1.8 + 0.4 * tok[s, p] + 0.3 * tok[s, p - 1]
                    for p in range(1, C + 1)] for s in range(S)]).reshape(-1)  # fmt: skip
    seen = rng.uniform(size=mu.size) >= unrecorded_share
    p = planted(tmp_path / "p.zarr", tok, mu, vocab=V, unrecorded=~seen)
    t = build_table(p, "pilot", options=LearnabilityOptions(order=3, prior=5.0, min_count=3, holdout=0))
    # the targets by hand: each planted event lies well inside the observed range 1..5, so its
    # seen drop is its 3 nats (to the fit's noise) and its time the planted one
    d = np.where(np.isfinite(mu), 3.0, 0.0)
    w = d.copy()
    has = np.isfinite(mu) & seen
    ctx = [(tok[s, q], tok[s, q - 1], tok[s, q - 2] if q >= 2 else V) for s in range(S) for q in range(1, C + 1)]
    w_bar, mu_g, d_g = w[has].mean(), np.average(mu[has], weights=w[has]), d[seen].mean()
    assert t.mu_global == pytest.approx(mu_g, abs=0.01) and t.delta_global == pytest.approx(d_g, abs=0.02)

    def estimates(width, parent):
        groups = {}
        for i, c in enumerate(ctx):
            groups.setdefault(c[:width], []).append(i)
        out = {}
        for k, idx in groups.items():
            idx = np.array(idx)
            idx = idx[seen[idx]]
            pd, pm = parent(k)
            h = idx[has[idx]]
            out[k] = ((d[idx].sum() + 5 * pd) / (idx.size + 5), (np.sum(w[h] * mu[h]) + 5 * w_bar * pm) / (w[h].sum() + 5 * w_bar),
                      idx.size)  # fmt: skip
        return out

    e1 = estimates(1, lambda k: (d_g, mu_g))
    e2 = estimates(2, lambda k: e1[k[:1]][:2])
    e3 = estimates(3, lambda k: e2[k[:2]][:2])
    for order, e in ((1, e1), (2, e2), (3, e3)):
        lev = t.levels[order - 1]
        want = {sum(int(k[j]) * (V + 1) ** j for j in range(order)): v for k, v in e.items() if v[2] >= (1 if order == 1 else 3)}
        assert sorted(want) == lev["keys"].tolist()
        assert lev["count"].tolist() == [want[k][2] for k in sorted(want)]
        got = {int(k): (float(dd), float(mm)) for k, dd, mm in zip(lev["keys"], lev["delta"], lev["mu"])}
        for k, (wd, wm, _) in want.items():
            assert got[k][0] == pytest.approx(wd, abs=0.02) and got[k][1] == pytest.approx(wm, abs=0.01), (order, k)
    # with no shrinkage, order 1 answers the planted drop-weighted mean time of each token id
    t1 = build_table(p, "pilot", options=LearnabilityOptions(order=1, prior=0.0, min_count=1, holdout=0))
    tgt = tok[:, 1:].reshape(-1)
    for k, m in zip(t1.levels[0]["keys"].tolist(), t1.levels[0]["mu"].tolist()):
        assert m == pytest.approx(np.nanmean(mu[(tgt == k) & seen]), abs=0.01)


@pytest.mark.parametrize("bad", [dict(lr=float("inf")), dict(lr=float("nan")), dict(steps=2.5), dict(seed=True),
                                 dict(weight_decay=-1.0), dict(grad_clip=float("inf")), dict(batch_size="8")])  # fmt: skip
def test_train_config_refuses_settings_no_run_can_use(bad):
    # lr=inf was accepted and trained a model of NaN weights (noticed by the curriculum hunt)
    import numpy as np

    from tokdyn.errors import InputError
    from tokdyn.train import TrainConfig

    with pytest.raises(InputError):
        TrainConfig(**bad)
    assert TrainConfig(steps=np.int64(5), lr=np.float32(1e-3), grad_clip=None).steps == 5  # numpy numbers, no clipping


def test_numpy_int_key_orders_do_not_hang():
    # max_vocab(np.int64(2)) wrapped b**order in int64 and never left its loop (found by the review)
    import numpy as np
    import torch

    from tokdyn.curriculum.learnability import LearnabilityOptions, context_keys, max_vocab

    for k in np.arange(1, 4):
        assert max_vocab(k) == max_vocab(int(k))
        assert len(context_keys(torch.zeros(1, 5, dtype=torch.long), order=k, vocab_size=50)) == int(k)
    o = LearnabilityOptions(order=np.int64(2), min_count=np.int32(3), seed=np.uint8(1))
    assert (o.order, o.min_count, o.seed) == (2, 3, 1) and all(type(v) is int for v in (o.order, o.min_count, o.seed))
