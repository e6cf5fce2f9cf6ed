"""Invariances of the analysis downstream of the fit (hunt 22), checked on planted stores: every
figure's count of the tokens (or groups) it shows and of those it leaves out adds up to the
tokens (or groups) it is about (the learning-time figure, cartography and Rho-1, the class
figure, the group figure, the mean-loss figure), and padding (a pad id, never scored) changes no
frequency band, no class share of the tokens and no figure's points."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn.analysis import analyze_run
from tokdyn.fit import CLASS_CODES
from tokdyn.fit.job import fit_run

STEPS = np.concatenate([[0], np.unique(np.round(np.geomspace(1, 10_000, 30)).astype(int))])
X = np.log10(np.maximum(STEPS, 1))


def _sig(m, w):
    return 1 / (1 + np.exp((X[None, :] - m) / w))


def planted_all_classes(seed: int = 0, n_each: int = 8) -> np.ndarray:
    """[N, K] float32 losses with every class planted, and the tokens a figure may leave out:
    multi-step tokens whose two events are both rises, events before the first recorded step
    (censored), padding (no loss anywhere) and tokens with no loss at the last step."""
    rng = np.random.default_rng(seed)
    k = len(STEPS)
    mu = rng.uniform(1.0, 3.0, (n_each, 1))
    parts = [
        1.5 + 3.0 * _sig(mu, 0.15),  # learned
        1.0 + 1.5 * _sig(mu - 0.7, 0.1) + 1.5 * _sig(mu + 0.7, 0.1),  # multi-step, two drops
        1.0 + 1.5 * (1 - _sig(1.2, 0.1)) + 1.5 * (1 - _sig(3.0, 0.1)) + 0 * mu,  # multi-step, two rises
        4.5 - 3.0 * _sig(mu, 0.15),  # forgotten
        np.full((n_each, k), 5.0),  # not yet learned
        np.full((n_each, k), 0.3),  # already known
        1.5 + 3.0 * _sig(-0.1 + 0 * mu, 0.15),  # learned before the first recorded step: censored
        4.0 - 0.6 * X[None, :] + 0 * mu,  # gradual
    ]
    Y = np.concatenate([p + rng.normal(0, 0.05, (n_each, k)) for p in parts]).clip(0.01).astype(np.float32)
    pad = np.full((5, k), np.nan, np.float32)  # padding of an imported matrix: never scored
    late = (1.5 + 3.0 * _sig(mu[:4], 0.15)).astype(np.float32)
    late[:, -1] = np.nan  # scored, but no loss at the last step
    return np.concatenate([Y, pad, late])


def make_store(path, Y, steps=STEPS, name="r", token_id=None, domain=None, domains=()):
    n = len(Y)
    arrays = {"sample_id": np.arange(n, dtype=np.int32), "token_pos": (np.arange(n) % 7 + 1).astype(np.int32),
              "token_id": (np.arange(n) % 9).astype(np.int32) if token_id is None else token_id}  # fmt: skip
    if domain is not None:
        arrays["domain"] = domain
    store = tokdyn.open_store(path, tokdyn.ProbeSet(None, arrays, domains=domains), mode="w")
    run = store.create_run(name, capacity=len(steps))
    with run.writer() as w:
        for j, s in enumerate(steps):
            w.append(Y[:, j], step=int(s), warn_nonfinite=False)
    return store


@pytest.fixture(scope="module")
def all_classes(tmp_path_factory):
    Y = planted_all_classes()
    store = make_store(tmp_path_factory.mktemp("all") / "s.zarr", Y)
    fit_run(store.run("r"), progress=False, scheduler="sync")
    with pytest.warns(Warning):  # the measured mean leaves out the tokens missing a loss
        a = analyze_run(store.run("r"), n_boot=0)
    return store, a, Y


def _count(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in {text!r}"
    return int(m.group(1).replace(",", ""))


# -- every figure's counts add up --------------------------------------------------------------


def test_the_planted_store_has_every_token_a_figure_may_leave_out(all_classes):
    _, a, _ = all_classes
    f = a.fit
    multi = f["class_code"] == CLASS_CODES["multi_step"]
    rises = multi & (f["delta1"] < 0) & (f["delta2"] < 0)
    assert rises.sum() >= 4, "no multi-step token with two rises"
    learned = np.isin(f["class_code"], [CLASS_CODES["learned"], CLASS_CODES["multi_step"]])
    assert (learned & (f["mu"] < f["x_first"])).sum() >= 4, "no censored learned token"
    assert set(a.class_counts) >= {"learned", "multi_step", "forgotten", "already_known", "not_yet_learned", "gradual"}


def test_the_learning_time_figure_counts_every_learned_and_multi_step_token(all_classes):
    """Figure 6 left a multi-step token whose two events are both rises (no learning time) out
    of its points and out of its "left out" count: shown + left out fell short of the tokens of
    the two classes it is about."""
    from tokdyn.report import _fig_time_vs_token

    store, a, _ = all_classes
    total = a.class_counts["learned"] + a.class_counts["multi_step"]
    fig = _fig_time_vs_token(store, a)
    cap = fig.caption
    shown = _count(r"Each of the ([\d,]+) learned or multi-step tokens", cap)
    censored = _count(r"Left out: ([\d,]+) tokens whose event time lies outside", cap)
    rises = _count(r"([\d,]+) multi-step tokens? whose two events are both rises", cap)
    assert rises == int(((a.fit["class_code"] == CLASS_CODES["multi_step"]) & (a.fit["delta1"] < 0)
                         & (a.fit["delta2"] < 0)).sum())  # fmt: skip
    assert shown + censored + rises == total, cap


def test_the_cartography_figure_counts_every_probe_token(all_classes):
    """The cartography and forgetting panels are over the scored tokens (the rest counted as
    left out); the Rho-1 bars are over those with a loss at both compared steps, and a scored
    token missing one was left out of them without a word."""
    from tokdyn.report import _fig_cartography

    store, a, Y = all_classes
    cap = _fig_cartography(store, a).caption
    n = len(Y)
    scored = int(np.isfinite(Y).any(axis=1).sum())
    assert _count(r"all ([\d,]+) tokens", cap) == scored
    assert _count(r"([\d,]+) probe tokens? with no recorded loss left out", cap) == n - scored == 5
    both = int((np.isfinite(Y[:, a.stats.early_row]) & np.isfinite(Y[:, a.stats.late_row])).sum())
    assert _count(r"([\d,]+) tokens? with a loss at both", cap) == both
    assert _count(r"([\d,]+) with a recorded loss but none at one of them left out", cap) == scored - both == 4


# -- padding is no occurrence of a token id -----------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), n_pad=st.integers(1, 300),
       pad_id=st.sampled_from([0, 1, 7, 10**6]), n_bands=st.integers(1, 6))  # fmt: skip
def test_frequency_bands_of_a_padded_probe_are_those_of_its_scored_tokens(seed, n, n_pad, pad_id, n_bands):
    """An imported probe right-padded with a pad id (never scored) counted that id at every
    padded position: the pad id became the most frequent token, the quantile edges moved and
    real tokens changed band (18 % of them at a quarter padding). Banded over the scored tokens,
    every real token has the band and label it has without the padding, the padding none."""
    from tokdyn.tokenstats import frequency_bands, id_counts

    rng = np.random.default_rng(seed)
    tid = rng.zipf(1.5, n) % 50
    where = np.sort(rng.choice(n + n_pad, n_pad, replace=False))
    scored = np.ones(n + n_pad, bool)
    scored[where] = False
    padded = np.full(n + n_pad, pad_id)
    padded[scored] = tid
    band0, labels0 = frequency_bands(tid, n_bands)
    band1, labels1 = frequency_bands(padded, n_bands, scored=scored)
    assert labels1 == labels0
    np.testing.assert_array_equal(band1[scored], band0)
    assert (band1[~scored] == -1).all()
    counts = id_counts(padded, scored)
    np.testing.assert_array_equal(counts[scored], [np.count_nonzero(tid == t) for t in tid])  # by hand
    assert (counts[~scored] == 0).all()


@pytest.fixture(scope="module")
def padded_pair(tmp_path_factory):
    """The same tokens fitted without and with padding (a pad id that is also a real token's,
    no loss anywhere), each as (store, analysis)."""
    tmp = tmp_path_factory.mktemp("pad")
    Y = planted_all_classes(seed=1)[:64]
    tid = (np.arange(64) * 7 % 13).astype(np.int32)
    n_pad = 40
    Yp = np.concatenate([Y, np.full((n_pad, Y.shape[1]), np.nan, np.float32)])
    tidp = np.concatenate([tid, np.full(n_pad, 3, np.int32)])
    out = []
    for name, L, t in (("plain", Y, tid), ("padded", Yp, tidp)):
        store = make_store(tmp / f"{name}.zarr", L, token_id=t)
        fit_run(store.run("r"), progress=False, scheduler="sync")
        out.append((store, analyze_run(store.run("r"), n_boot=0)))
    return out


def test_padding_changes_no_spectrum_by_frequency_and_no_learning_time_figure(padded_pair):
    """The same tokens with and without padding (a pad id, no loss anywhere) give the same
    spectra by frequency band and the same figure of learning time against frequency."""
    from tokdyn.report import _fig_time_vs_token

    (s0, a0), (s1, a1) = padded_pair
    assert a0.by_group["frequency"].keys() == a1.by_group["frequency"].keys()
    for label, sp in a0.by_group["frequency"].items():
        np.testing.assert_allclose(a1.by_group["frequency"][label].density, sp.density, rtol=1e-9, atol=1e-12)
    f0, f1 = _fig_time_vs_token(s0, a0), _fig_time_vs_token(s1, a1)
    assert f1.caption == f0.caption
    hb0 = f0.fig.axes[0].collections[0].get_offsets()
    hb1 = f1.fig.axes[0].collections[0].get_offsets()
    np.testing.assert_allclose(np.asarray(hb1), np.asarray(hb0))


def test_padding_changes_no_class_share_of_the_tokens(padded_pair):
    """The class figure's shares of the tokens counted padding as class unfit: every class's
    grey bar shrank (20.8 % -> 15.9 % at 40 % padding), so every class read as losing more loss
    per token than the average token. Over the scored tokens the bars are those of the same
    tokens unpadded, and the caption counts the tokens left out."""
    from tokdyn.report import _class_drops, _fig_class_changes, _fig_class_shares

    (s0, a0), (s1, a1) = padded_pair
    labels = lambda f: [t.get_text() for t in f.fig.axes[0].get_yticklabels()]  # noqa: E731
    texts = lambda f: [t.get_text() for t in f.fig.axes[0].texts]  # noqa: E731
    # both forms of the figure: shares of the drop, and changes in nats where shares mean nothing
    for draw in (_fig_class_shares, lambda a: _fig_class_changes(a, _class_drops(a)[0])):
        f0, f1 = draw(a0), draw(a1)
        assert labels(f1) == labels(f0)
        assert texts(f1) == texts(f0)
        assert not any("unfit" in t for t in labels(f1))
        assert _count(r"([\d,]+) probe tokens? with no recorded loss", f1.caption) == len(a1.fit["class_code"]) - len(a0.fit["class_code"]) == 40
        assert "no recorded loss" not in f0.caption


def test_the_group_figure_counts_the_groups_it_leaves_out(tmp_path):
    """Groups with fewer than 10 events have no curve. With 3 of 8 domains that small the
    caption read "The domain panel shows every domain": the drawn and left-out groups of each
    panel now add up to the groups the probe's scored tokens fall in."""
    from tokdyn.report import _fig_groups

    Y = planted_all_classes(seed=2)
    n = len(Y)
    dom = (np.arange(n) % 5).astype(np.int32)
    dom[:3], dom[3:5], dom[5] = 5, 6, 7  # three domains of 3, 2 and 1 tokens
    store = make_store(tmp_path / "g.zarr", Y, domain=dom, domains=[f"d{i}" for i in range(8)])
    fit_run(store.run("r"), progress=False, scheduler="sync")
    with pytest.warns(Warning):  # the measured mean leaves out the tokens missing a loss
        a = analyze_run(store.run("r"), n_boot=0)
    cap = _fig_groups(store, a).caption
    assert len(a.by_group["domain"]) == 5
    assert "shows every domain." not in cap
    assert _count(r"([\d,]+) of the 8 domains", cap) == 8 - len(a.by_group["domain"])
    for kind, noun in (("class", "class"), ("frequency", "frequency band"), ("position", "position band")):
        m = re.search(rf"([\d,]+) of the ([\d,]+) {noun}", cap)
        drawn = len(a.by_group[kind])
        # the groups the scored tokens fall in, counted here from the planted arrays and the fit
        scored = np.isfinite(Y).any(axis=1)
        if kind == "class":
            held = np.unique(a.fit["class_code"][scored]).size
        elif kind == "position":
            held = np.unique(np.floor(np.log2(np.arange(n)[scored] % 7 + 1))).size
        else:
            held = np.unique(np.bincount(np.arange(n)[scored] % 9)[np.arange(n)[scored] % 9]).size
        left = int(m.group(1)) if m else 0
        if m:
            assert int(m.group(2)) == held, (kind, cap)
        if kind != "frequency":  # quantile bands may merge counts: at most one band per count
            assert drawn + left == held, (kind, drawn, left, held, cap)


def test_the_mean_loss_figure_counts_the_padding_it_leaves_out(padded_pair, all_classes):
    """The mean-loss figure said "the loss averaged over all 64 probe tokens" of a probe of 104,
    40 of them padding: the tokens in the mean and those left out now add up to the probe's."""
    from tokdyn.report import _fig_reconstruction

    (s0, a0), (s1, a1) = padded_pair
    cap0, cap1 = _fig_reconstruction(s0, a0).caption, _fig_reconstruction(s1, a1).caption
    assert "no recorded loss" not in cap0
    n_mean = _count(r"averaged over all ([\d,]+) probe tokens", cap1)
    assert n_mean + _count(r"([\d,]+) probe tokens? with no recorded loss left out", cap1) == len(a1.fit["class_code"])
    # and beside tokens that miss a loss at some points (the other form of the sentence)
    store, a, Y = all_classes
    cap = _fig_reconstruction(store, a).caption
    kept = _count(r"the same ([\d,]+) probe tokens", cap)
    some = _count(r"([\d,]+) tokens? that miss a loss at some", cap)
    never = _count(r"([\d,]+) probe tokens? with no recorded loss left out", cap)
    assert kept + some + never == len(Y), cap
