"""The D and M axes assembled from a researcher's own sweep: runs named twice, runs recorded again
after the axis was made, final rows that are not the run at its budget, two sweeps in one store,
runs on another probe, learning-rate area tables that would be misread, and calibration branches
with missing losses (planted stores of a few hundred tokens)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tokdyn
from tokdyn.annealing import annealing_area, branch_gains, fit_annealing_gain
import tokdyn.axes
from tokdyn.axes import assemble_axis, axis_run_problem, axis_sources, effective_steps
from tokdyn.cli import main
from tokdyn.errors import InputError, ProbeMismatchError
from tokdyn.fit.job import fit_run
from tokdyn.reconstruct import MeasuredMeanWarning, reconstruct_across
from tokdyn.store import as_store
from tokdyn.sweep import DecaySweepConfig


def _probe(seed=0, n_seq=8, context=30):
    rng = np.random.default_rng(seed)
    return tokdyn.ProbeSet.from_tokens(rng.integers(0, 50, (n_seq, context + 1)), tokenizer={"kind": "byte"})


def _store(path, seed=0):
    return tokdyn.open_store(path, _probe(seed), mode="w")


def _planted(n, seed=1):
    """Per-token loss as a function of (effective) step: one sigmoid in log10 step per token."""
    rng = np.random.default_rng(seed)
    mu, s, d = rng.uniform(1.2, 2.8, n), rng.uniform(0.05, 0.25, n), rng.uniform(0.5, 3.0, n)
    return lambda step: 1.0 + d / (1 + np.exp((np.log10(step) - mu) / s))


def _one_row(st, name, row, *, step, attrs, **coords):
    st.create_run(name, capacity=1, attrs=attrs).writer().append(np.asarray(row, np.float32), step=step, warn_nonfinite=False,
                                                                 **coords)  # fmt: skip
    return st.run(name)


# -- a run named twice -------------------------------------------------------------------------


def test_a_run_named_twice_is_refused_not_counted_twice_in_a_mean_of_seeds(tmp_path):
    """Seeds s0 (loss 4) and s1 (loss 6) of one size average to 5. With s0 named twice the mean
    came out 4.667 (s0 counted twice) without a word; named twice is now an error, however it is
    named (a name, a Run object, the store spelled another way)."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for size, base in ((1000, 4.0), (2000, 3.0), (4000, 2.0)):
        for seed in (0, 1):
            _one_row(st, f"m{size}s{seed}", np.full(n, base + 2 * seed), step=10, attrs={"n_params_non_embedding": size})
    names = [f"m{size}s{seed}" for size in (1000, 2000, 4000) for seed in (0, 1)]
    axis = assemble_axis(st, "M", runs=names, repeats="mean")
    np.testing.assert_allclose(axis.losses()[:, 0], [5.0, 4.0, 3.0])  # by hand: (base + base + 2) / 2
    other_spelling = as_store(str(tmp_path / "a.zarr") + "/").run("m1000s0")
    for twice in (["m1000s0", *names], [st.run("m1000s0"), *names], [other_spelling, *names]):
        for repeats in ("mean", "refuse"):
            with pytest.raises(InputError, match="'m1000s0' .* named twice"):
                assemble_axis(st, "M", runs=twice, repeats=repeats, name="axis-M2")
    assert "axis-M2" not in st.runs


# -- a source recorded again -------------------------------------------------------------------


def test_a_source_recorded_again_with_as_many_rows_makes_the_axis_out_of_date(tmp_path, capsys):
    """A source deleted and recorded again (a fixed training rerun, same schedule) has as many
    rows as before: the staleness check compared row counts only, and the command reused the axis
    holding the old run's losses. Now it is out of date, and `reconstruct --axis` assembles it again."""
    url = str(tmp_path / "a.zarr")
    st = _store(url)
    loss = _planted(st.probe.n_tokens)
    budgets = [30, 60, 120, 250, 500, 1000, 2000]
    for j, b in enumerate(budgets):
        _one_row(st, f"d{j}", loss(b), step=b, attrs={"data_budget": b * 100})
    assert main(["reconstruct", url, "--axis", "D", "--json", "--boot", "0"]) == 0
    capsys.readouterr()
    assert axis_run_problem(as_store(url).run("axis-D"), "D") is None
    st = as_store(url, mode="r+")
    st.delete_run("d3")  # recorded again: the same budget and schedule, other losses
    _one_row(st, "d3", loss(budgets[3]) + 0.5, step=budgets[3], attrs={"data_budget": budgets[3] * 100})
    why = axis_run_problem(as_store(url).run("axis-D"), "D")
    assert why is not None and "'d3' was recorded again" in why
    assert main(["reconstruct", url, "--axis", "D", "--json", "--boot", "0"]) == 0
    assert "again (run 'd3' was recorded again" in capsys.readouterr().err
    np.testing.assert_allclose(as_store(url).run("axis-D").losses()[3], loss(budgets[3]) + 0.5, rtol=1e-6)
    assert axis_run_problem(as_store(url).run("axis-D"), "D") is None  # and now current


def test_reconstruct_across_refuses_an_axis_whose_source_was_recorded_since(tmp_path):
    """From Python, reconstruct_across read an axis run whose source had a new final row since
    it was assembled (the command line assembles it again; this call went on with the old row)."""
    st, axis = _trunk_and_axis(tmp_path)
    fit_run(st.run("trunk"), progress=False)
    assert reconstruct_across(axis, st.run("trunk")).r2_events > 0.9
    w = st.run("b3").writer(resume=True)
    w.append(np.ones(st.probe.n_tokens, np.float32), step=300)
    w.release()
    with pytest.raises(InputError, match=r"'axis-D' is out of date \(run 'b3' has 2 rows now, 1 when"):
        reconstruct_across(st.run("axis-D"), st.run("trunk"))


def test_reconstruct_run_of_an_out_of_date_axis_says_so(tmp_path):
    """The axis run's own reconstruction from Python went on with rows its source has replaced."""
    from tokdyn.reconstruct import reconstruct_run

    st, axis = _trunk_and_axis(tmp_path)
    fit_run(axis, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tokdyn.axes.AxisWarning)
        reconstruct_run(axis, n_boot=0)  # current: nothing to say
    w = st.run("b3").writer(resume=True)
    w.append(np.ones(st.probe.n_tokens, np.float32), step=300)
    w.release()
    with pytest.warns(tokdyn.axes.AxisWarning, match=r"axis run 'axis-D' is out of date \(run 'b3' has 2 rows now"):
        reconstruct_run(st.run("axis-D"), n_boot=0)


# -- final rows that are not the run at its budget ---------------------------------------------


@pytest.mark.parametrize(
    "case",
    ["stopped at half its budget (tokens_seen)", "stopped at half its budget (step x tokens_per_step)", "budget in steps"],
)
@pytest.mark.parametrize("axis", ["D", "M"])
def test_a_final_row_that_is_not_the_run_at_its_budget_is_refused(tmp_path, case, axis):
    """A run that stopped early (or is still being recorded) was placed on the axis at the budget
    it never reached, and a data_budget in steps put it decades away, without a word. Where the
    final row's tokens are known (tokens_seen, or step x tokens_per_step), they must be the budget."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    tps = 128
    for j, steps in enumerate((100, 200, 400, 800)):
        attrs = {"data_budget": steps * tps, "tokens_per_step": tps, "n_params_non_embedding": 1000 * 2**j}
        seen = {"tokens_seen": steps * tps}
        if j == 2:
            if case.startswith("stopped") and "tokens_seen" in case:
                seen = {"tokens_seen": steps * tps // 2}
            elif case.startswith("stopped"):
                seen, steps = {}, steps // 2  # the step is known, the tokens from it
            else:
                attrs["data_budget"] = steps  # steps, where tokens are expected
        if axis == "M":
            attrs["data_budget"] = attrs["data_budget"] if j == 2 else 800 * tps
            if j != 2:
                seen, steps = {"tokens_seen": 800 * tps}, 800
        _one_row(st, f"r{j}", np.full(n, 4.0 - j), step=steps, attrs=attrs, **seen)
    with pytest.raises(InputError, match=r"'r2': its final row .* not the run at its budget"):
        assemble_axis(st, axis, runs=["r0", "r1", "r2", "r3"])
    assert assemble_axis(st, axis, runs=["r0", "r1", "r3"]).n_committed == 3  # the others are fine


def test_a_final_row_within_the_budgets_rounding_is_kept(tmp_path):
    """A budget given in round tokens (1.0e6 for 999,424 seen) is the run at its budget."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for j, (budget, seen) in enumerate(((1_000_000, 999_424), (2_000_000, 2_007_040), (4_000_000, 4_000_000))):
        _one_row(st, f"r{j}", np.full(n, 3.0 - j), step=j + 1, attrs={"data_budget": budget}, tokens_seen=seen)
    np.testing.assert_allclose(assemble_axis(st, "D").axis_values, [1e6, 2e6, 4e6])


# -- a NaN final row ---------------------------------------------------------------------------


def test_a_final_row_with_nan_losses_is_said_where_seeds_would_hide_it(tmp_path):
    """A seed that diverged (NaN final losses) was averaged away by the mean of the other seed
    without a word; now a warning names it and says how many losses."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for size in (1000, 2000, 4000):
        for seed in (0, 1):
            row = np.full(n, 3.0 + seed)
            if size == 2000 and seed == 1:
                row[: n // 3] = np.nan
            _one_row(st, f"m{size}s{seed}", row, step=10, attrs={"n_params_non_embedding": size})
    names = [f"m{size}s{seed}" for size in (1000, 2000, 4000) for seed in (0, 1)]
    with pytest.warns(tokdyn.axes.AxisWarning, match=rf"'m2000s1': {n // 3:,} of the {n:,} losses of its final row .* NaN; the other seeds"):
        axis = assemble_axis(st, "M", runs=names, repeats="mean")
    row = axis.losses()[1]
    np.testing.assert_allclose(row[: n // 3], 3.0)  # the other seed alone, as documented
    np.testing.assert_allclose(row[n // 3 :], 3.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say where every loss is there
        assemble_axis(st, "M", runs=[n for n in names if n.endswith("s0")], name="clean")


# -- two sweeps in one store -------------------------------------------------------------------


def test_tagged_runs_of_two_sweeps_are_not_merged_into_one_axis(tmp_path):
    """Two decay sweeps of different models in one store, both tagged sweep='D', were merged
    into one axis of interleaved budgets; M runs of two data budgets likewise. Now that is
    ambiguous (an error asking for the runs); a tagged run that does not say joins the others."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for pre, cfg, tps in (("A", {"n_layer": 2}, 100), ("B", {"n_layer": 4}, 130)):
        for j, b in enumerate((100, 200, 400)):
            _one_row(st, f"{pre}{j}", np.full(n, 4.0 - j), step=b, attrs={"data_budget": b * tps, "sweep": "D", "model_config": cfg})
    for budget in (1000, 3000):
        for j, size in enumerate((10, 20, 40)):
            _one_row(st, f"M{budget}-{j}", np.full(n, 4.0 - j), step=5,
                     attrs={"n_params_non_embedding": size, "data_budget": budget, "sweep": "M"})  # fmt: skip
    with pytest.raises(InputError, match=r"sweep='D' have 2 different model configurations: \[\['A0', 'A1', 'A2'\], \['B0', 'B1', 'B2'\]\]"):
        axis_sources(st, "D")
    with pytest.raises(InputError, match="sweep='M' have 2 different data budgets"):
        assemble_axis(st, "M")
    assert "axis-D" not in st.runs and "axis-M" not in st.runs
    st2 = _store(tmp_path / "b.zarr")
    for j, b in enumerate((100, 200, 400)):
        _one_row(st2, f"A{j}", np.full(n, 4.0 - j), step=b, attrs={"data_budget": b * 100, "sweep": "D", "model_config": {"n_layer": 2}})
    _one_row(st2, "extra", np.full(n, 1.0), step=800, attrs={"data_budget": 80_000, "sweep": "D"})
    assert axis_sources(st2, "D") == ["A0", "A1", "A2", "extra"]


def test_named_runs_of_several_models_or_budgets_are_said_to_mix_two_variables(tmp_path):
    """Runs named for an M axis at two data budgets (or a D axis of two models) were assembled
    without a word: the axis's derivative then mixes model size and data."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for j, (size, budget) in enumerate(((10, 1000), (20, 1000), (40, 3000))):
        _one_row(st, f"M{j}", np.full(n, 4.0 - j), step=5, attrs={"n_params_non_embedding": size, "data_budget": budget})
    with pytest.warns(tokdyn.axes.AxisWarning, match=r"axis M have 2 different data budgets, so the axis varies that too"):
        assemble_axis(st, "M", runs=["M0", "M1", "M2"])
    for j, cfg in enumerate(({"n_layer": 2}, {"n_layer": 2}, {"n_layer": 4})):
        _one_row(st, f"D{j}", np.full(n, 4.0 - j), step=100 * (j + 1), attrs={"data_budget": 10_000 * (j + 1), "model_config": cfg})
    with pytest.warns(tokdyn.axes.AxisWarning, match=r"axis D have 2 different model configurations"):
        assemble_axis(st, "D", runs=["D0", "D1", "D2"])
    with warnings.catch_warnings():  # one model: nothing to say
        warnings.simplefilter("error", tokdyn.axes.AxisWarning)
        for j in range(3):
            _one_row(st, f"E{j}", np.full(n, 4.0 - j), step=100 * (j + 1), attrs={"data_budget": 10_000 * (j + 1), "model_config": {"n_layer": 2}})
        assemble_axis(st, "D", runs=["E0", "E1", "E2"], overwrite=True)


# -- runs on another probe ---------------------------------------------------------------------


def _trunk_and_axis(tmp_path, *, seed=0, name="s"):
    st = _store(tmp_path / f"{name}.zarr", seed=seed)
    loss = _planted(st.probe.n_tokens)
    t_steps = np.unique(np.round(np.geomspace(1, 3000, 30)).astype(int))
    w = st.create_run("trunk", capacity=t_steps.size,
                      attrs={"tokens_per_step": 100, "lr_area": {"step": t_steps.tolist(), "area": t_steps.tolist()}}).writer()  # fmt: skip
    for s in t_steps:
        w.append(loss(s), step=int(s))
    budgets = [30, 60, 120, 250, 500, 1000, 2000]
    for j, b in enumerate(budgets):
        _one_row(st, f"b{j}", loss(b), step=b, attrs={"data_budget": b * 100, "lr_area": float(b), "decay_lr": [0.5]})
    return st, assemble_axis(st, "D", runs=[f"b{j}" for j in range(len(budgets))])


def test_a_t_run_or_branch_on_another_probe_of_the_same_size_is_refused(tmp_path):
    """reconstruct_across compared token counts only: a T run of another store, recorded on
    another probe of as many tokens, rebuilt D token by token from other tokens' events (R^2
    1.000 here: the planted losses are a function of the position alone). branch_gains read a
    branch of another probe the same way, or failed on a shape message."""
    st, axis = _trunk_and_axis(tmp_path)
    other, other_axis = _trunk_and_axis(tmp_path, seed=5, name="o")
    assert other.probe.n_tokens == st.probe.n_tokens and other.probe.fingerprint != st.probe.fingerprint
    fit_run(other.run("trunk"), progress=False)
    with pytest.raises(ProbeMismatchError, match="not one probe"):
        reconstruct_across(axis, other.run("trunk"))
    assert reconstruct_across(other_axis, other.run("trunk")).r2_events > 0.9  # its own axis is fine
    with pytest.raises(ProbeMismatchError, match=r"'b0' of .*o\.zarr.*not one probe"):
        branch_gains(st.run("trunk"), [st.run("b1"), other.run("b0"), st.run("b2")])
    smaller = tokdyn.open_store(tmp_path / "c.zarr", _probe(seed=0, n_seq=4), mode="w")
    _one_row(smaller, "x", np.ones(smaller.probe.n_tokens), step=5, attrs={"lr_area": 5.0, "decay_lr": [0.5]})
    with pytest.raises(ProbeMismatchError, match="not one probe"):
        branch_gains(st.run("trunk"), [smaller.run("x")])


# -- learning-rate area tables -----------------------------------------------------------------

GOOD = {"step": [1, 10, 20, 40], "area": [0.1, 8.5, 18.5, 38.5]}


@pytest.mark.parametrize(
    "table, match",
    [
        ({"step": GOOD["step"][::-1], "area": GOOD["area"][::-1]}, "increasing steps"),  # read as: every point at step 1
        ({"step": GOOD["step"], "area": [0.1, float("nan"), 18.5, 38.5]}, "non-finite"),  # read as: every point NaN
        ({"step": GOOD["step"][:3], "area": GOOD["area"]}, "as many areas as steps"),  # a numpy traceback
        ({"step": GOOD["step"], "area": [3 * a for a in GOOD["area"]]}, "more than the step"),  # not in steps at the peak
        ({"step": GOOD["step"], "area": ["a", "b", "c", "d"]}, "other things than numbers"),
    ],
)
def test_an_lr_area_table_that_would_be_misread_is_refused(tmp_path, table, match):
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for name, budget, area in (("b0", 20, 15.5), ("b1", 30, 24.5), ("b2", 40, 36.0)):
        _one_row(st, name, np.ones(n), step=budget, attrs={"data_budget": budget * 64, "lr_area": area, "decay_lr": [0.5]})
    axis = assemble_axis(st, "D")

    def trunk(name, attrs):
        w = st.create_run(name, capacity=4, attrs=attrs).writer()
        for s in GOOD["step"]:
            w.append(np.ones(n), step=s)
        return st.run(name)

    good = trunk("good", {"tokens_per_step": 64, "lr_area": GOOD})
    np.testing.assert_allclose(effective_steps(axis, good, by="lr_area"), [17, 26, 37.5])  # by hand, as test_decay_sweep
    bad = trunk("bad", {"tokens_per_step": 64, "lr_area": table})
    with pytest.raises(InputError, match=match):
        effective_steps(axis, bad, by="lr_area")
    with pytest.raises(InputError, match=match):  # the annealing gain reads the same table
        branch_gains(bad, [st.run("b0")])


@pytest.mark.parametrize("tps", [True, float("inf"), float("nan"), 0, "64"])
def test_tokens_per_step_that_is_no_positive_number_is_refused(tmp_path, tps):
    """True was read as 1 token a step, inf put every point at step 0 (log10: -inf)."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for j, b in enumerate((20, 30, 40)):
        _one_row(st, f"b{j}", np.ones(n), step=b, attrs={"data_budget": b * 64, "lr_area": float("nan") if j == 1 else 10.0})
    axis = assemble_axis(st, "D")
    t = _one_row(st, "t", np.ones(n), step=40, attrs={"tokens_per_step": tps, "lr_area": GOOD})
    with pytest.raises(InputError, match="positive, finite 'tokens_per_step'"):
        effective_steps(axis, t, by="tokens")
    with pytest.raises(InputError, match=r"\['b1 \(nan\)'\] have no positive, finite 'lr_area'"):
        effective_steps(axis, t, by="lr_area")


# -- calibration branches with missing losses --------------------------------------------------

C_TRUE, MOMENTUM_TRUE = 4e-3, 0.99


def _calibration(tmp_path, *, lost: float = 0.0, dead: int | None = None):
    """A planted trunk and branches whose loss is the trunk's at their lr area minus C * S2
    (Tissue et al.'s law). ``lost``: the share of the tokens with the highest final loss that
    every branch's final row lacks (NaN); ``dead``: the branch whose final row has no loss."""
    st = _store(tmp_path / "s.zarr")
    n = st.probe.n_tokens
    loss = _planted(n)
    cfg = DecaySweepConfig(budgets=(20, 3000), warmup=0, decay_frac=0.2)
    t_steps = np.unique(np.round(np.geomspace(1, 3000, 40)).astype(int))
    w = st.create_run("trunk", capacity=t_steps.size,
                      attrs={"tokens_per_step": 100, "lr_area": {"step": t_steps.tolist(), "area": t_steps.tolist()}}).writer()  # fmt: skip
    for s in t_steps:
        w.append(loss(s), step=int(s))
    final = loss(3000.0)
    hard = final >= np.quantile(final, 1 - lost) if lost else np.zeros(n, bool)
    branches = []
    for j, b in enumerate((33, 80, 190, 450, 1100, 2200)):
        sched = cfg.decay_factors(cfg.decay_steps(b))
        area = cfg.branch_area(b)
        row = loss(area) - C_TRUE * annealing_area(sched, momentum=MOMENTUM_TRUE)
        row[hard] = np.nan
        if j == dead:
            row[:] = np.nan
        branches.append(_one_row(st, f"cal{j}", row, step=b, attrs={"lr_area": area, "decay_lr": sched}))
    return st.run("trunk"), branches


def test_a_branch_without_a_loss_is_refused_not_calibrated_to_zero(tmp_path):
    """One calibration branch whose final row is NaN made every squared error NaN, and the fit
    returned C = 0 (momentum 0.9999, rms NaN) as if calibrated."""
    trunk, branches = _calibration(tmp_path, dead=2)
    with pytest.raises(InputError, match="'cal2': its final row has a loss for 0 of the trunk's"):
        fit_annealing_gain(trunk, branches)
    gain = fit_annealing_gain(trunk, branches[:2] + branches[3:])
    assert gain.coef == pytest.approx(C_TRUE, rel=0.15) and np.isfinite(gain.rms)


def test_branch_gains_are_over_the_tokens_every_branch_has(tmp_path):
    """Branches missing the hardest fifth of the tokens at their final row were averaged over
    the easy 80 % and the trunk over all: every gain read far too high (C several times the
    planted one). The gain is the same for every token (planted), so over any one set of tokens
    it is the planted one."""
    trunk, branches = _calibration(tmp_path, lost=0.2)
    with pytest.warns(MeasuredMeanWarning, match="left out of every gain"):
        sched, g = branch_gains(trunk, branches)
    planted = np.array([C_TRUE * annealing_area(s, momentum=MOMENTUM_TRUE) for s in sched])
    np.testing.assert_allclose(g, planted, atol=0.03)
    with pytest.warns(MeasuredMeanWarning):
        gain = fit_annealing_gain(trunk, branches)
    assert gain.coef == pytest.approx(C_TRUE, rel=0.15)


def test_the_cli_axis_command_refuses_a_stopped_run_in_one_line(tmp_path, capsys):
    url = str(tmp_path / "a.zarr")
    st = _store(url)
    n = st.probe.n_tokens
    for j, steps in enumerate((100, 200, 400)):
        _one_row(st, f"d{j}", np.full(n, 3.0 - j), step=steps if j != 1 else 50, attrs={"data_budget": steps * 10, "tokens_per_step": 10})
    assert main(["reconstruct", url, "--axis", "D", "--boot", "0"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "'d1': its final row (step 50)" in err
    assert "axis-D" not in as_store(url).runs
