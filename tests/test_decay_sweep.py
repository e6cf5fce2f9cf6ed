"""The D axis from one run: a constant-lr trunk with branched decays."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokdyn
from tokdyn.axes import assemble_axis
from tokdyn.errors import InputError
from tokdyn.sweep import DecaySweepConfig, branched_decay_sweep, log_budgets

TPS = 4 * 32  # tokens per step of the tiny batches


def test_branched_decay_sweep_writes_one_completed_d_point_per_budget(tiny_model, probe, store_path, train_batches, reference_losses):
    cfg = DecaySweepConfig(budgets=(6, 8, 10, 13, 16), lr=1e-2, warmup=2, decay_frac=0.2, floor=0.1, trunk_points=6)
    stream = train_batches(16)
    fresh = copy.deepcopy(tiny_model)
    st = tokdyn.open_store(store_path, probe, mode="w")
    out = branched_decay_sweep(tiny_model, lambda start: iter(stream[start:]), probe, st, cfg, tokens_per_step=TPS)
    assert out.branches == ["D00", "D01", "D02", "D03", "D04"] and out.budgets == [6, 8, 10, 13, 16]
    assert out.branch_starts == [5, 6, 8, 10, 13]  # decays of 1, 2, 2, 3, 3 steps (20 %)
    assert out.final_lr_frac == pytest.approx([0.1] * 5)
    for name, b in zip(out.branches, cfg.budgets):
        r = st.run(name)
        assert r.n_committed == 1 and r.coord("step").tolist() == [b]
        assert r.attrs["sweep"] == "D" and r.attrs["data_budget"] == b * TPS
        assert r.coord("lr")[0] == pytest.approx(0.1 * 1e-2)  # the last update ran at the floor
    trunk = st.run("D-trunk")
    assert trunk.axis == "T" and trunk.coord("step")[-1] == 16
    assert np.allclose(trunk.coord("lr")[trunk.coord("step") >= 2], 1e-2)  # constant after warm-up
    axis = assemble_axis(st, "D", runs=out.branches)
    np.testing.assert_allclose(axis.axis_values, np.array(cfg.budgets) * TPS)

    # Independent answer: budget 13 trained from scratch with its whole lr schedule written out.
    b = 13
    start, d = cfg.branch_start(b), cfg.decay_steps(b)
    lrs = [1e-2 * min(1.0, (s + 1) / 2) for s in range(start)] + [1e-2 * (0.1 + 0.9 * (1 - (j + 1) / d)) for j in range(d)]
    opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2, weight_decay=cfg.weight_decay, betas=cfg.betas)
    for s, lr in enumerate(lrs):
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = stream[s][:, :-1], stream[s][:, 1:]
        loss = F.cross_entropy(fresh(x).reshape(-1, 257), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(fresh.parameters(), cfg.grad_clip)
        opt.step()
    np.testing.assert_allclose(st.run("D03").losses()[0], reference_losses(fresh, probe.tokens), rtol=1e-4, atol=1e-5)


def test_decay_sweep_config_is_checked():
    with pytest.raises(InputError, match="strictly increasing"):
        DecaySweepConfig(budgets=(10, 10, 20))
    with pytest.raises(InputError, match="warm-up"):
        DecaySweepConfig(budgets=(10, 20), warmup=10)
    with pytest.raises(InputError, match="shape"):
        DecaySweepConfig(budgets=(20,), shape="cosine")
    b = log_budgets(25, 1600, 22)
    assert len(b) == 22 and b[0] == 25 and b[-1] == 1600 and np.diff(np.log10(b)).max() <= 0.1


def test_learning_rate_areas_by_hand():
    cfg = DecaySweepConfig(budgets=(20, 40), warmup=4, decay_frac=0.25)
    assert cfg.trunk_area(4) == pytest.approx(0.25 + 0.5 + 0.75 + 1.0)
    assert cfg.trunk_area(15) == pytest.approx(2.5 + 11)
    # budget 20: 15 trunk updates, then 5 decaying ones at 0.8, 0.6, 0.4, 0.2, 0 of the peak
    assert cfg.branch_area(20) == pytest.approx(13.5 + 2.0)
    sq = DecaySweepConfig(budgets=(20,), warmup=4, decay_frac=0.25, shape="sqrt", floor=0.5)
    assert sq.decay_factor(4, 5) == pytest.approx(0.5) and sq.decay_factor(0, 5) == pytest.approx(0.5 + 0.5 * (1 - 0.2**0.5))
