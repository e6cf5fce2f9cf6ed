"""Hunt 21: the spectrum read between the points of its own grid, never-scored tokens in the
per-token statistics and the classes' drops, a multi-step token's learning time, the decay
sweep's random stream, and the axis named in the report's figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

import tokdyn
from tokdyn.axes import assemble_axis
from tokdyn.errors import InputError
from tokdyn.fit.job import fit_run
from tokdyn.fit.models import class_drops
from tokdyn.fit.options import CLASS_CODES
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.spectrum import Events, learning_time_spectrum
from tokdyn.sweep import DecaySweepConfig, branched_decay_sweep
from tokdyn.tokenstats import token_stats


# -- the spectrum at any point, not interpolated over a grid coarser than its bandwidth --------


def _gauss_sum(mu, d, x, h, n):
    """rho of point masses far from the range's edges: a plain sum of Gaussians, by hand."""
    return (d[None, :] * np.exp(-0.5 * ((x[:, None] - mu[None, :]) / h) ** 2)).sum(1) / (h * math.sqrt(2 * math.pi)) / n


@pytest.mark.parametrize("decades", [4, 12])
def test_the_spectrum_reads_rho_between_grid_points_on_a_long_axis(decades):
    """Sharp events 2 decades apart, bandwidth 0.01: a fixed 256-point grid over 12 decades is
    4.7 bandwidths a step, and read the peaks 57 % low; the delta kernel's rho is a plain sum of
    Gaussians away from the edges, so it is known by hand."""
    mu = np.arange(1.0, decades - 0.5, 2.0)
    d = np.linspace(1.0, 2.0, mu.size)
    ev = Events(np.arange(mu.size), mu, np.full(mu.size, 1e-3), d, mu.size, (0.0, float(decades)), resolution=0.01)
    spec = learning_time_spectrum(ev, bandwidth=0.01, kernel="delta")
    xs = (mu[:, None] + np.linspace(-0.03, 0.03, 13)[None, :]).ravel()  # across every peak
    exact = _gauss_sum(mu, d, xs, 0.01, mu.size)
    assert np.abs(spec.at(xs) - exact).max() <= 0.005 * exact.max()
    assert spec.x.size >= 6 * decades / 0.01  # points a bandwidth, whatever the range
    # an explicit grid is still the caller's
    assert learning_time_spectrum(ev, bandwidth=0.01, kernel="delta", grid=64).x.size == 64
    for bad in (7, 2.5, True, "auto"):
        with pytest.raises(InputError, match="grid must be"):
            learning_time_spectrum(ev, bandwidth=0.01, grid=bad)


# -- never-scored tokens: in no count, no mean ---------------------------------------------


def _store(path, Y, steps):
    n = Y.shape[0]
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(path, probe, mode="w")
    w = st.create_run("r", capacity=len(steps)).writer()
    for j, s in enumerate(steps):
        w.append(Y[:, j], step=int(s), warn_nonfinite=False)
    w.release()
    return st


@settings(max_examples=8, deadline=None)
@given(seed=hst.integers(0, 2**16), n_pad=hst.integers(1, 30), where=hst.sampled_from(["front", "back", "mixed"]))
def test_token_statistics_are_those_of_the_scored_tokens(tmp_path_factory, seed, n_pad, where):
    """Invariance: tokens with no loss at any row (padding) change no statistic; each token's own
    arrays are the same, and the summary's counts and means are over the scored tokens."""
    rng = np.random.default_rng(seed)
    steps = np.array([1, 2, 4, 8, 16, 32])
    Y = rng.uniform(0.05, 2.0, (12, steps.size)).astype(np.float32)
    pad = np.full((n_pad, steps.size), np.nan, np.float32)
    YY = {"front": np.concatenate([pad, Y]), "back": np.concatenate([Y, pad])}.get(where)
    if YY is None:
        YY = np.concatenate([Y, pad])[rng.permutation(12 + n_pad)]
    scored = np.isfinite(YY).any(1)
    path = tmp_path_factory.mktemp("ts")
    plain = token_stats(_store(path / "a.zarr", YY[scored], steps).run("r"))  # the same tokens in the same order
    padded = token_stats(_store(path / "b.zarr", YY, steps).run("r"))
    assert padded.scored.tolist() == scored.tolist()
    np.testing.assert_array_equal(padded.forgetting_events[scored], plain.forgetting_events)
    assert padded.threshold == plain.threshold
    a, b = plain.summary(), padded.summary()
    for k in ("forgetting_events_mean", "tokens_ever_forgotten", "confidence_mean", "variability_mean"):
        assert b[k] == pytest.approx(a[k], rel=1e-12), k
    assert b["rho1_shares"] == a["rho1_shares"]


def test_a_forgetting_across_a_missing_point_is_counted_as_without_that_row(tmp_path):
    """By hand: token 0 learned (0.1) at step 8, missing at 16, not learned (2.0) at 32: one
    forgetting, as with the row of step 16 removed; token 1 learned, missing, learned: none;
    token 2 not learned, missing, learned, not learned: one."""
    Y = np.array([[0.1, np.nan, 2.0, 2.0], [0.1, np.nan, 0.2, 0.3], [3.0, np.nan, 0.1, 3.0]], np.float32)
    with_gap = token_stats(_store(tmp_path / "a.zarr", Y, [8, 16, 32, 64]).run("r"), early_row=0)
    without = token_stats(_store(tmp_path / "b.zarr", Y[:, [0, 2, 3]], [8, 32, 64]).run("r"), early_row=0)
    assert with_gap.forgetting_events.tolist() == [1, 0, 1] == without.forgetting_events.tolist()


def test_rho1_threshold_is_the_median_of_the_tokens_it_classes(tmp_path):
    """Tokens with a loss at only one of the two rows get no class, so they do not move the
    median: H->H and L->L then hold equally many tokens (no ties), as the report says."""
    early = np.array([0.5, 1.5, 2.5, 3.5, 0.7, 2.2])
    late = np.array([0.4, 0.6, 3.0, 1.2, 2.8, 0.3])
    extra_early = np.full(7, 9.0)  # seven tokens lost at the late row: they pulled the median up
    Y = np.stack([np.concatenate([early, extra_early]), np.concatenate([late, np.full(7, np.nan)])], 1).astype(np.float32)
    ts = token_stats(_store(tmp_path / "s.zarr", Y, [1, 10]).run("r"), early_row=0)
    assert ts.threshold == pytest.approx(np.median(np.concatenate([early, late])), rel=1e-6)
    shares = ts.rho1_shares()
    assert shares["H->H"] == shares["L->L"]
    assert (ts.rho1[6:] == -1).all()


def test_class_drops_divide_by_the_scored_tokens():
    """By hand: three learned tokens fell 1, 2 and 3 nats; two padding tokens were never seen:
    the classes' drops add up to the fall of the mean loss over the three, 2 nats."""
    code = np.array([CLASS_CODES["learned"]] * 3 + [CLASS_CODES["unfit"]] * 2)
    drop = np.array([1.0, 2.0, 3.0, np.nan, np.nan])
    scored = np.array([True, True, True, False, False])
    cd = class_drops(code, drop, scored=scored)
    assert cd.nats["learned"] == pytest.approx(2.0) and cd.net == pytest.approx(2.0)
    assert class_drops(code, drop).nats["learned"] == pytest.approx(6.0 / 5)  # no mask: every token, as documented
    for bad in (scored[:4], scored.astype(int)):
        with pytest.raises(InputError, match="scored"):
            class_drops(code, drop, scored=bad)


def test_the_fit_summary_says_each_class_change_per_scored_token(tmp_path):
    """Every scored token's loss rises 3 nats; 3/4 of the probe is padding. The class change
    tokdyn fit prints is the mean's rise, 3 nats, not a quarter of it."""
    steps = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    x = np.log10(steps)
    rng = np.random.default_rng(0)
    rise = (1.0 + 3.0 / (1 + np.exp(-(x[None] - rng.uniform(1.0, 2.0, (40, 1))) / 0.15))).astype(np.float32)
    Y = np.concatenate([rise, np.full((120, steps.size), np.nan, np.float32)])
    st = _store(tmp_path / "s.zarr", Y, steps)
    res = fit_run(st.run("r"), progress=False, scheduler="sync")
    fell = sum(res.class_drops.nats.values())
    measured = np.nanmean(Y[:, -1]) - np.nanmean(Y[:, 0])  # rose, nats per scored token
    assert -fell == pytest.approx(measured, rel=0.02)


# -- a multi-step token's learning time is its first drop ------------------------------------


def test_a_multi_step_token_is_learned_at_its_first_drop_not_its_first_event():
    from tokdyn.report import _learning_time

    m, lr = CLASS_CODES["multi_step"], CLASS_CODES["learned"]
    f = {"class_code": np.array([m, m, m, lr]), "mu": np.array([np.nan, np.nan, np.nan, 2.5]),
         "mu1": np.array([1.0, 1.0, 1.0, np.nan]), "mu2": np.array([3.0, 3.0, 3.0, np.nan]),
         "delta1": np.array([2.0, -2.0, -1.0, np.nan]), "delta2": np.array([1.0, 3.0, -1.0, np.nan])}  # fmt: skip
    np.testing.assert_array_equal(_learning_time(f), [1.0, 3.0, np.nan, 2.5])  # drop first; rise then drop; two rises


# -- a branch of the decay sweep leaves the trunk's random stream alone ---------------------


def test_a_calibration_branch_changes_no_d_point_with_dropout(tmp_path):
    """Branches are copies that never feed back into the trunk: adding one (a calibration
    branch) must leave the trunk and every D point as they were, also with dropout, which draws
    from torch's random stream (it moved the trunk's masks: 0.93 nats on a D point)."""
    rng = np.random.default_rng(1234)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 257, size=(4, 17)), tokenizer={"kind": "byte"})
    g = torch.Generator().manual_seed(0)
    stream = [torch.randint(0, 257, (4, 17), generator=g) for _ in range(20)]

    def sweep(calibration, name):
        torch.manual_seed(0)
        model = TinyGPT(GPTConfig(vocab_size=257, context=16, n_layer=1, n_head=2, n_embd=16, dropout=0.3)).train()
        st = tokdyn.open_store(tmp_path / name, probe, mode="w")
        cfg = DecaySweepConfig(budgets=(8, 16), lr=1e-2, warmup=2, decay_frac=0.2, trunk_points=6, calibration=calibration)
        branched_decay_sweep(model, lambda s: iter(stream[s:]), probe, st, cfg, tokens_per_step=64)
        return st.run("D01").losses()[0], st.run("D-trunk").losses()

    d_plain, trunk_plain = sweep((), "a.zarr")
    d_cal, trunk_cal = sweep(((10, 0.5),), "b.zarr")
    np.testing.assert_array_equal(trunk_cal, trunk_plain)
    np.testing.assert_array_equal(d_cal, d_plain)


# -- the axis a figure is about ---------------------------------------------------------------


def test_the_example_tokens_of_a_d_axis_are_at_each_data_budget(tmp_path):
    from tokdyn.analysis import analyze_run
    from tokdyn.report import _fig_trajectories

    n, budgets = 200, np.geomspace(1e5, 1e8, 8)
    rng = np.random.default_rng(0)
    mu = rng.uniform(5.5, 7.5, n)
    Y = 1 + 2 / (1 + np.exp((np.log10(budgets)[None, :] - mu[:, None]) / 0.1)) + rng.normal(0, 0.02, (n, budgets.size))
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32) // 20, "token_pos": (np.arange(n) % 20 + 1).astype(np.int32)})
    st = tokdyn.open_store(tmp_path / "d.zarr", probe, mode="w")
    for j, b in enumerate(budgets):
        w = st.create_run(f"d{j}", capacity=2, attrs={"data_budget": float(b)}).writer()
        for k, step in enumerate((10, 100)):
            w.append(Y[:, j] + (1 - k), step=step)
    run = assemble_axis(st, "D")
    fit_run(run, progress=False, scheduler="sync")
    fig = _fig_trajectories(st, analyze_run(st.run(run.name), n_boot=0))
    assert "recorded data budget" in fig.title and "step" not in fig.title


def test_seeds_stand_in_only_where_another_seed_has_the_loss(tmp_path):
    """Two seeds of a budget: seed 0 misses tokens 0-3, seed 1 tokens 2-5. Tokens 0-1 and 4-5
    are filled by the other seed, 2-3 stay NaN; each warning says so, not "stand in" for all."""
    import warnings

    from tokdyn.axes import AxisWarning

    n = 12
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(tmp_path / "m.zarr", probe, mode="w")
    for j, b in enumerate([100, 1000, 10000]):
        for seed, missing in enumerate((slice(0, 4), slice(2, 6))):
            y = np.full(n, 3.0 - j + 0.1 * seed, np.float32)
            if j == 1:
                y[missing] = np.nan
            w = st.create_run(f"d{j}s{seed}", capacity=1, attrs={"data_budget": b}).writer()
            w.append(y, step=10, warn_nonfinite=False)
            w.release()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = assemble_axis(st, "D", repeats="mean").losses()[1]
    said = [str(w.message) for w in caught if issubclass(w.category, AxisWarning)]
    assert len(said) == 2 and all("stand in for 2 of them, the rest stay NaN" in m for m in said), said
    assert np.isnan(row[2:4]).all() and np.allclose(row[[0, 1]], 2.1) and np.allclose(row[[4, 5]], 2.0)
    assert np.allclose(row[6:], 2.05)
