"""The annealing gain of a decayed branch (Tissue et al. 2024): its area by hand, its calibration
on planted branches, and D rebuilt from T's events with it (planted events and gains)."""

from __future__ import annotations

import numpy as np
import pytest

import tokdyn
from tokdyn.annealing import AnnealingGain, annealing_area, branch_gains, fit_annealing_gain
from tokdyn.axes import assemble_axis
from tokdyn.errors import InputError
from tokdyn.fit.job import fit_run
from tokdyn.reconstruct import reconstruct, reconstruct_across
from tokdyn.spectrum import Events
from tokdyn.sweep import DecaySweepConfig


def test_annealing_area_by_hand_and_its_saturation():
    # a linear decay over 4 updates: the rate drops 0.25 at each; without momentum m_i = 0.25
    assert annealing_area([0.75, 0.5, 0.25, 0.0], momentum=0.0) == pytest.approx(1.0)
    # momentum 0.5: m = 0.25, 0.375, 0.4375, 0.46875
    assert annealing_area([0.75, 0.5, 0.25, 0.0], momentum=0.5) == pytest.approx(1.53125)
    # a decay far shorter than the memory 1 / (1 - momentum): the area between peak and rate
    cfg = DecaySweepConfig(budgets=(100, 200), warmup=0)
    short = cfg.decay_factors(20)
    assert annealing_area(short, momentum=1 - 1e-6) == pytest.approx(sum(1 - f for f in short), rel=1e-4)
    # a far longer one saturates near (peak - end) / (1 - momentum) = 10 at momentum 0.9
    a1, a2 = (annealing_area(cfg.decay_factors(d), momentum=0.9) for d in (10_000, 40_000))
    assert a1 == pytest.approx(10, rel=2e-3) and a2 == pytest.approx(10, rel=1e-3)
    with pytest.raises(InputError, match="momentum"):
        annealing_area(short, momentum=1.0)


def test_reconstruct_adds_a_known_loss_offset_to_the_events():
    n = 300
    rng = np.random.default_rng(0)
    events = Events(np.arange(n), rng.uniform(1.5, 2.5, n), rng.uniform(0.05, 0.2, n), rng.uniform(0.5, 2, n), n, (1, 3))
    x = np.linspace(1.2, 2.8, 25)
    offset = -0.2 / (1 + np.exp(-(x - 2.2) / 0.15))  # a gain that grows over the range
    loss = 3.0 + events.curve(x) + offset
    with_offset = reconstruct(x, loss, events, n_boot=0, loss_offset=offset)
    without = reconstruct(x, loss, events, n_boot=0)
    assert with_offset.r2_events > 0.999 and without.r2_events < 0.95
    with pytest.raises(InputError, match="loss_offset"):
        reconstruct(x, loss, events, n_boot=0, loss_offset=offset[:-1])


def _probe(n_seq=10, context=30):
    rng = np.random.default_rng(0)
    return tokdyn.ProbeSet.from_tokens(rng.integers(0, 50, (n_seq, context + 1)), tokenizer={"kind": "byte"})


C_TRUE, MOMENTUM_TRUE = 4e-3, 0.99  # 1 - 0.99 = 10^-2 lies on the calibration's grid


def _planted_sweep(tmp_path, *, missing_until: int = 0):
    """A trunk whose tokens learn by planted sigmoids in log10(step), and branches whose loss is
    the trunk's at their lr area minus C * S2 of their decay (the law of Tissue et al.).
    ``missing_until``: the trunk's rows up to this step have no loss (NaN) for the tenth of the
    tokens with the largest drops."""
    probe = _probe()
    n = probe.n_tokens
    rng = np.random.default_rng(1)
    mu, s, d = rng.uniform(1.2, 2.8, n), rng.uniform(0.05, 0.25, n), rng.uniform(0.5, 3.0, n)

    def losses(step):
        return 1.0 + d / (1 + np.exp((np.log10(step) - mu) / s))

    cfg = DecaySweepConfig(budgets=(20, 3000), warmup=0, decay_frac=0.2)
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    t_steps = np.unique(np.round(np.geomspace(1, 3000, 40)).astype(int))
    trunk = st.create_run("trunk", capacity=t_steps.size,
                          attrs={"tokens_per_step": 100, "lr_area": {"step": t_steps.tolist(), "area": t_steps.tolist()}})  # fmt: skip
    w = trunk.writer()
    high = d >= np.quantile(d, 0.9)
    for step in t_steps:
        row = losses(step) + rng.normal(0, 0.02, n)
        if step <= missing_until:
            row[high] = np.nan
        w.append(row, step=int(step))

    def branch(name, b, frac, tag):
        k = cfg.decay_steps(b, frac)
        sched = cfg.decay_factors(k)
        area = cfg.branch_area(b, frac)
        row = losses(area) - C_TRUE * annealing_area(sched, momentum=MOMENTUM_TRUE)
        st.create_run(name, capacity=1, attrs={"data_budget": b * 100, "lr_area": area, "decay_lr": sched, "sweep": tag}
                      ).writer().append(row, step=b)  # fmt: skip

    budgets = np.unique(np.round(np.geomspace(25, 2500, 22)).astype(int))
    for j, b in enumerate(budgets):
        branch(f"D{j:02d}", int(b), 0.2, "D")
    cal = [33, 80, 190, 450, 1100, 2200]
    for j, b in enumerate(cal):
        branch(f"cal{j}", b, 0.2, "D-calibration")
        branch(f"cal{j}-long", b, 0.4, "D-calibration")
    return st, [f"D{j:02d}" for j in range(budgets.size)], cal


@pytest.mark.filterwarnings("ignore:.*non-finite losses:RuntimeWarning")
def test_branch_gains_are_over_one_set_of_tokens_where_the_trunk_misses_some(tmp_path):
    # The planted gain, C * S2 of the branch's decay, is the same for every token, so it is the
    # gain over any set of tokens. With the largest-drop tenth of the tokens missing from the
    # trunk's rows up to step 300, a mean over whichever tokens each trunk row has read the early
    # trunk too low, and the gains of the branches there came out negative (about -0.2 nats).
    st, _, cal = _planted_sweep(tmp_path, missing_until=300)
    trunk = st.run("trunk")
    branches = [st.run(f"cal{j}") for j in range(len(cal))]
    sched, g = branch_gains(trunk, branches)
    planted = np.array([C_TRUE * annealing_area(s, momentum=MOMENTUM_TRUE) for s in sched])
    np.testing.assert_allclose(g, planted, atol=0.03)
    gain = fit_annealing_gain(trunk, branches)
    assert gain.coef == pytest.approx(C_TRUE, rel=0.15)


def test_annealing_gain_is_calibrated_on_other_branches_and_predicts_d_from_t(tmp_path):
    st, d_names, cal = _planted_sweep(tmp_path)
    trunk = st.run("trunk")
    short = [st.run(f"cal{j}") for j in range(len(cal))]
    long_ = [st.run(f"cal{j}-long") for j in range(len(cal))]
    _, g = branch_gains(trunk, short)
    assert g.min() > 0 and g.max() > 0.1  # the planted gains, read off the trunk within its noise
    for runs in (short, long_):  # the same law from decays of 20 % or of 40 %
        gain = fit_annealing_gain(trunk, runs)
        assert gain.momentum == pytest.approx(MOMENTUM_TRUE, abs=2e-3)
        assert gain.coef == pytest.approx(C_TRUE, rel=0.1) and gain.rms < 0.01 and gain.n_branches == len(cal)
    with pytest.raises(InputError, match="at least 3"):
        fit_annealing_gain(trunk, short[:2])

    axis = assemble_axis(st, "D", runs=d_names)
    fit_run(trunk, progress=False)
    gain = fit_annealing_gain(trunk, long_)  # calibrated on 40 % decays, predicting 20 % ones
    with_gain = reconstruct_across(axis, trunk, by="lr_area", annealing=gain)
    plain = reconstruct_across(axis, trunk, by="lr_area")
    exact = reconstruct_across(axis, trunk, by="lr_area", annealing=AnnealingGain(C_TRUE, MOMENTUM_TRUE))
    assert exact.r2_events > 0.9 and with_gain.r2_events > exact.r2_events - 0.02
    assert plain.r2_events < with_gain.r2_events - 0.1  # the gain is what the area alone misses
    assert "annealing" in with_gain.run
