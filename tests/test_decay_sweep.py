"""The D axis from one run (branched decays), seeds averaged on an axis, effective steps, and D
rebuilt from the events of T (planted events)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokdyn
from tokdyn.axes import assemble_axis, effective_steps
from tokdyn.errors import InputError
from tokdyn.fit.job import fit_run
from tokdyn.reconstruct import reconstruct, reconstruct_across
from tokdyn.spectrum import Events
from tokdyn.sweep import DecaySweepConfig, branched_decay_sweep, log_budgets

TPS = 4 * 32  # tokens per step of the tiny batches


def test_branched_decay_sweep_writes_one_completed_d_point_per_budget(tiny_model, probe, store_path, train_batches, reference_losses):
    cfg = DecaySweepConfig(budgets=(6, 8, 10, 13, 16), lr=1e-2, warmup=2, decay_frac=0.2, floor=0.1, trunk_points=6,
                           calibration=((12, 0.5),), trunk_steps=20)  # fmt: skip
    stream = train_batches(20)
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
    assert trunk.axis == "T" and trunk.coord("step")[-1] == 20  # trained on past the largest budget
    assert np.allclose(trunk.coord("lr")[trunk.coord("step") >= 2], 1e-2)  # constant after warm-up
    axis = assemble_axis(st, "D", runs=out.branches)
    np.testing.assert_allclose(axis.axis_values, np.array(cfg.budgets) * TPS)
    # the calibration branch: its own decay share (6 of 12 steps), tagged apart, no D point
    assert out.calibration == ["D-cal00"]
    cal = st.run("D-cal00")
    assert cal.attrs["sweep"] == "D-calibration" and cal.attrs["branch_start"] == 6 and cal.coord("step").tolist() == [12]
    assert cal.attrs["decay_lr"] == pytest.approx([0.1 + 0.9 * (1 - (j + 1) / 6) for j in range(6)])
    assert cal.attrs["lr_area"] == pytest.approx(cfg.trunk_area(6) + sum(cal.attrs["decay_lr"]))
    assert sorted(tokdyn.axes.axis_sources(st, "D")) == out.branches

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
    with pytest.raises(InputError, match="trunk_steps"):
        DecaySweepConfig(budgets=(20, 40), trunk_steps=30)
    with pytest.raises(InputError, match="calibration"):
        DecaySweepConfig(budgets=(20, 40), calibration=((50, 0.2),))
    with pytest.raises(InputError, match="warm-up"):
        DecaySweepConfig(budgets=(20, 40), warmup=5, calibration=((10, 0.6),))
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


def _probe(n_seq=10, context=30):
    rng = np.random.default_rng(0)
    return tokdyn.ProbeSet.from_tokens(rng.integers(0, 50, (n_seq, context + 1)), tokenizer={"kind": "byte"})


def test_effective_steps_by_tokens_and_by_lr_area(tmp_path):
    probe = _probe()
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    n = probe.n_tokens
    t = st.create_run("trunk", capacity=4, attrs={"tokens_per_step": 64,
                                                  "lr_area": {"step": [0, 10, 20, 40], "area": [0, 8.5, 18.5, 38.5]}})  # fmt: skip
    w = t.writer()
    for s in (0, 10, 20, 40):
        w.append(np.ones(n), step=s)
    for name, budget, area in (("b0", 20, 15.5), ("b1", 30, 24.5), ("b2", 40, 36.0)):
        st.create_run(name, capacity=1, attrs={"data_budget": budget * 64, "lr_area": area}).writer().append(np.ones(n), step=budget)
    axis = assemble_axis(st, "D", runs=["b2", "b0", "b1"])
    np.testing.assert_allclose(effective_steps(axis, st.run("trunk"), by="tokens"), [20, 30, 40])
    # area 15.5 lies between (10, 8.5) and (20, 18.5) where one step adds 1: step 17, and so on
    np.testing.assert_allclose(effective_steps(axis, st.run("trunk"), by="lr_area"), [17, 26, 37.5])
    with pytest.raises(InputError, match="by must be"):
        effective_steps(axis, st.run("trunk"), by="flops")


def test_seeds_of_one_size_are_averaged_into_one_m_point(tmp_path):
    probe = _probe()
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    n = probe.n_tokens
    for i, size in enumerate((1000, 2000, 4000)):
        for seed in (0, 1):
            st.create_run(f"m{i}s{seed}", capacity=1, attrs={"n_params_non_embedding": size}).writer().append(
                np.full(n, 5.0 - i + seed), step=10)  # fmt: skip
    names = [f"m{i}s{s}" for i in range(3) for s in (0, 1)]
    with pytest.raises(InputError, match="share"):
        assemble_axis(st, "M", runs=names)
    axis = assemble_axis(st, "M", runs=names, repeats="mean")
    np.testing.assert_allclose(axis.losses()[:, 0], [5.5, 4.5, 3.5])
    np.testing.assert_allclose(axis.axis_values, [1000, 2000, 4000])


def _planted(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(1.2, 2.8, n), rng.uniform(0.05, 0.25, n), rng.uniform(0.5, 3.0, n)


def test_cross_axis_reconstruction_of_planted_events_is_exact():
    """The events of T at each D point's effective step predict D's derivative (plain arrays)."""
    n = 400
    mu, s, d = _planted(n)
    events = Events(np.arange(n), mu, s, d, n, (0.0, 3.5))
    steps = np.geomspace(20, 1000, 24)  # effective steps on T of 24 budgets
    budgets = steps * 1.25 * 128  # each budget 25 % further on in tokens, 128 tokens a step
    x = np.log10(budgets)
    loss = 2.0 + events.curve(np.log10(steps))
    rec = reconstruct(x, loss, events, axis="D", at=np.log10(steps), n_boot=0)
    assert rec.r2_events > 0.999
    np.testing.assert_allclose(rec.from_events_analytic, events.derivative(np.log10(steps)), rtol=1e-6)  # d at/dx = 1
    assert rec.r2_spectrum > 0.95
    with pytest.raises(InputError, match="increasing"):
        reconstruct(x, loss, events, at=np.log10(steps)[::-1], n_boot=0)


def test_reconstruct_across_rebuilds_a_planted_d_axis_from_a_fitted_t_run(tmp_path):
    probe = _probe()
    n = probe.n_tokens
    mu, s, d = _planted(n, seed=1)
    rng = np.random.default_rng(2)

    def losses(log_step):
        return 1.0 + d / (1 + np.exp((log_step - mu) / s)) + rng.normal(0, 0.02, n)

    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    t_steps = np.unique(np.round(np.geomspace(1, 3000, 40)).astype(int))
    w = st.create_run("trunk", capacity=t_steps.size, attrs={"tokens_per_step": 100}).writer()
    for step in t_steps:
        w.append(losses(np.log10(step)), step=int(step))
    budgets = np.unique(np.round(np.geomspace(20, 2000, 22)).astype(int))
    for j, b in enumerate(budgets):
        st.create_run(f"b{j}", capacity=1, attrs={"data_budget": int(b) * 100}).writer().append(losses(np.log10(b)), step=int(b))
    axis = assemble_axis(st, "D", runs=[f"b{j}" for j in range(budgets.size)])
    fit_run(st.run("trunk"), progress=False)
    rec = reconstruct_across(axis, st.run("trunk"), by="tokens")
    assert rec.x.size == budgets.size and rec.r2_events > 0.9
    # a trunk fitted from step 100 on does not reach the budgets below: refused, not extrapolated
    fit_run(st.run("trunk"), progress=False, refit=True, axis_min=100, options=tokdyn.FitOptions(two_step=False))
    with pytest.raises(InputError, match=r"below 'trunk''s fit window \(from step 100"):
        reconstruct_across(axis, st.run("trunk"), by="tokens")
    fit_run(st.run("trunk"), progress=False, refit=True)
    with pytest.raises(InputError, match="lr_area"):
        reconstruct_across(axis, st.run("trunk"), by="lr_area")
    # the report draws it on D's figure, as the sweep does
    from tokdyn.analysis import analyze_store
    from tokdyn.report import write_report

    fit_run(axis, progress=False)
    an = analyze_store(st, runs=[axis.name])
    an.runs[0].across = {"D from T events": rec}
    page = write_report(st, tmp_path / "r.html", analysis=an).read_text()
    assert "rebuilt from the events of another run" in page
    # more curves than line styles, with labels as long as the sweep's: every one is drawn, and
    # the legend goes under both panels instead of squeezing them
    from tokdyn.report import ACROSS_STYLES, _fig_reconstruction

    label = "from the trunk's T events, by lr area, with the annealing gain of 15 % decays"
    an.runs[0].across = {f"{label} ({k})": rec for k in range(len(ACROSS_STYLES) + 1)}
    fig = _fig_reconstruction(st, an.runs[0]).fig
    fig.canvas.draw()
    ax0, ax1 = fig.axes
    assert len(ax1.get_lines()) == 3 + len(ACROSS_STYLES) + 1 + 1  # measured, sums, spectrum, 5 across, the 0 line
    assert min(ax0.get_position().width, ax1.get_position().width) > 0.3
