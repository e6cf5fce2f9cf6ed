"""Hunt 23 on `tokdyn compare` and the D and M axes: axis attributes that are numbers no float
holds, and axis values a fit's log axis cannot tell apart. Planted stores of a few dozen tokens
(hunt 18's D sweep)."""

from __future__ import annotations

import numpy as np
import pytest

import tokdyn

from tokdyn.axes import assemble_axis, effective_steps, source_runs
from tokdyn.errors import InputError

from conftest import CONTEXT, VOCAB
from reliability_fixtures import cli_error_line, run_cli
from test_hunt18_axes import _d_store, _never_called, _set_attr

HUGE = (10**400, -(10**400))  # JSON holds them; a float does not


@pytest.mark.parametrize("value", HUGE, ids=["e400", "minus_e400"])
def test_a_data_budget_no_float_holds_is_one_line(tmp_path, capsys, value):
    """A run's data_budget of 10**400 (a hand-edited zarr.json, another program's metadata) was
    'internal error ... OverflowError' from `tokdyn reconstruct --axis D` (math.isfinite of the
    int); it is no positive, finite number, said as such."""
    st = _set_attr(_d_store(tmp_path / "s.zarr"), "r2", "data_budget", value)
    with pytest.raises(InputError, match="r2.*no positive, finite 'data_budget'"):
        assemble_axis(st, "D")
    code, err = run_cli(["reconstruct", str(tmp_path / "s.zarr"), "--axis", "D"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "internal error" not in line and "no positive, finite 'data_budget'" in line
    assert len(line) < 400  # the value said short, not in its 401 digits


def test_a_tokens_per_step_no_float_holds_tells_no_tokens_seen(tmp_path):
    """A source without tokens_seen whose tokens_per_step is 10**400 was OverflowError from
    assemble_axis (its step times that int); like a missing one, it tells no tokens seen, and
    the run takes its place at its data_budget."""
    st = _d_store(tmp_path / "s.zarr")
    with st.create_run("r5", capacity=1, attrs={"data_budget": 32000, "tokens_per_step": 10**400, "sweep": "D",
                                                "model_config": {"w": 1}}).writer() as w:
        w.append(np.full(st.probe.n_tokens, 1.0, np.float32), step=3200)  # no tokens_seen
    axis = assemble_axis(st, "D")
    assert axis.n_committed == 6 and axis.axis_values[-1] == 32000


@pytest.mark.parametrize("value", HUGE, ids=["e400", "minus_e400"])
def test_a_t_runs_tokens_per_step_no_float_holds_is_refused_by_effective_steps(tmp_path, value):
    st = _d_store(tmp_path / "s.zarr")
    axis = assemble_axis(st, "D", runs=[f"r{i}" for i in range(5)])
    st = _set_attr(st, "r0", "tokens_per_step", value)  # r0 read as the T run
    with pytest.raises(InputError, match="no positive, finite 'tokens_per_step'"):
        effective_steps(st.run(axis.name), st.run("r0"))


@pytest.mark.parametrize("entry", [{"run": "r0"}, {"run": "r0", "data_budget": 10**400}, {"run": "r0", "data_budget": "1e3"},
                                   {"data_budget": 1000.0}, "r0"])
def test_a_damaged_source_entry_of_an_axis_is_said(tmp_path, entry):
    """An axis run's sources entry without its axis value, with one no float holds or with no
    run was KeyError, OverflowError or ValueError from source_runs (and effective_steps)."""
    st = _d_store(tmp_path / "s.zarr")
    axis = assemble_axis(st, "D")
    sources = list(axis.attrs["sources"])
    sources[0] = entry
    st = _set_attr(st, axis.name, "sources", sources)
    with pytest.raises(InputError, match="a source entry lacks its run's name or a positive, finite data_budget"):
        source_runs(st.run(axis.name))


@pytest.mark.parametrize("budgets, pair", [((1000, 2000, 2**53, 2**53 + 2), "'r2' (data_budget = 9007199254740992.0) and 'r3'"),
                                           ((10**15, 10**15 + 1, 4000, 8000), "'r0' (data_budget = 1000000000000000.0) and 'r1'")])
def test_budgets_one_point_on_the_log_axis_are_refused_before_the_axis_is_written(tmp_path, capsys, budgets, pair):
    """Two data budgets whose log10 is one float64 (2**53 and 2**53 + 2 tokens) were assembled
    into axis-D, which `tokdyn fit` then refused ("too close to tell apart on a log scale"),
    leaving an axis run no fit takes; the assembly now asks the fit's own test first
    (_checks.log_tie, as import-npz does) and writes nothing."""
    path = tmp_path / "s.zarr"
    st = _d_store(path, budgets=(*budgets, 16000, 32000), tps=1)
    assert np.log10(float(sorted(budgets)[-2])) == np.log10(float(sorted(budgets)[-1]))  # planted: one log10
    with pytest.raises(InputError, match="one point on a fit's log axis"):
        assemble_axis(st, "D")
    assert "axis-D" not in st.runs
    code, err = run_cli(["reconstruct", str(path), "--axis", "D"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "one point on a fit's log axis" in line and pair in line


@pytest.mark.parametrize("attrs", [{"sweep": "D"}, {"sweep": "D", "model_config": {"w": 1}}, {"decay_lr": [0.5]},
                                   {"data_budget": 10}, {"lr_area": 3.0}])
def test_run_attrs_that_the_sweep_writes_itself_are_refused_before_training(tiny_model, probe, store_path, attrs):
    """run_attrs={"sweep": "D"} (how a recorder's runs of a sweep are tagged) was kept on the
    trunk, a T run at the largest budget whose learning rate never decayed: assemble_axis took it
    as a D point (budgets 384, 512, 640 and the trunk's 896 with trunk_steps=14), or, without
    trunk_steps, as a second run at the largest budget that --repeats mean averaged in."""
    from tokdyn.sweep import DecaySweepConfig, branched_decay_sweep

    cfg = DecaySweepConfig(budgets=(6, 8, 10), warmup=1, trunk_points=3, trunk_steps=14)
    st = tokdyn.open_store(store_path, probe, mode="w")
    with pytest.raises(InputError, match=rf"run_attrs sets \['{next(k for k in sorted(attrs) if k != 'model_config')}'\], "
                                         "which the sweep writes on its runs itself"):
        branched_decay_sweep(tiny_model, _never_called, probe, st, cfg, tokens_per_step=64, run_attrs=attrs)
    assert list(st.runs) == []


def test_a_sweep_tags_its_branches_alone_as_the_d_axis(tiny_model, probe, store_path):
    """The runs found for axis D are the branches, at their budgets, never the trunk."""
    import torch

    from tokdyn.axes import axis_sources
    from tokdyn.sweep import DecaySweepConfig, branched_decay_sweep

    def batches(start):
        g = torch.Generator().manual_seed(start)
        while True:
            yield torch.randint(0, VOCAB, (2, CONTEXT + 1), generator=g)

    cfg = DecaySweepConfig(budgets=(6, 8, 10), warmup=1, trunk_points=3, trunk_steps=14)
    st = tokdyn.open_store(store_path, probe, mode="w")
    out = branched_decay_sweep(tiny_model, batches, probe, st, cfg, tokens_per_step=64, run_attrs={"model_config": {"w": 1}})
    assert sorted(axis_sources(st, "D")) == out.branches == ["D00", "D01", "D02"]
    assert assemble_axis(st, "D").axis_values[:].tolist() == [384.0, 512.0, 640.0]


def test_an_axis_with_a_budget_no_float_holds_exactly_is_up_to_date_when_assembled(tmp_path):
    """A data_budget of 2**53 + 1 tokens is held on the axis as 2**53; the axis compared the
    source's int with it and called itself out of date the moment it was assembled, so every
    `tokdyn reconstruct --axis D` assembled it again (and reconstruct_across refused it). A
    budget changed since is still seen."""
    from tokdyn.axes import axis_run_problem

    st = _d_store(tmp_path / "s.zarr", budgets=(1000, 2000, 4000, 8000, 2**53 + 1), tps=1)
    axis = assemble_axis(st, "D")
    assert float(axis.axis_values[-1]) == float(2**53 + 1) and axis_run_problem(axis, "D") is None
    st = _set_attr(st, "r4", "data_budget", 2**53 + 5)
    assert "run 'r4' has data_budget 9007199254740997 now, 9007199254740992.0 when" in axis_run_problem(st.run("axis-D"), "D")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A run of 12 tokens, each learned once (test_compare's planted run), fitted."""
    from test_compare import _planted_run

    rng = np.random.default_rng(3)
    n = 12
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(tmp_path_factory.mktemp("tt") / "s.zarr", probe, mode="w")
    _planted_run(st, "A", rng.uniform(2.0, 3.5, n), rng)
    return st


@pytest.mark.parametrize("x_range", [(6.0, 7.0), (0.0, 3.0), (3.0, 5.5), (4.0, 2.0), (3.0, 3.0), (float("nan"), 3.0),
                                     ("1", "3"), (1.0,), (True, 3.0), 3.0])
def test_token_times_past_the_observed_range_is_refused(fitted, x_range):
    """token_times(x_range=(6, 7)) on a run observed over log10 steps 1..5 gave tokens a
    "learning time" at 6-7 (from the tails of sigmoids fitted to other steps: 4 of 200 tokens
    of test_compare's run at (10, 20)); a range past the run's, reversed, or not two numbers
    ("1", a bare 3.0) was that or a ValueError/TypeError. Now one InputError."""
    from tokdyn.compare import token_times

    with pytest.raises(InputError, match=r"x_range must be two log10 axis values, first < last, inside the range run 'A' "
                                         r"observed \(1\.0\.\.5\.0\)"):
        token_times(fitted, "A", x_range=x_range)


def test_token_times_inside_the_observed_range_are_taken(fitted):
    """Inside it (its ends included, an array too), a range is taken: the whole one gives the
    default's times bit for bit, a narrower one times inside it."""
    from tokdyn.compare import token_times

    whole, inner = token_times(fitted, "A"), token_times(fitted, "A", x_range=(1.0, 5.0))
    np.testing.assert_array_equal(whole.mu, inner.mu)
    narrower = token_times(fitted, "A", x_range=np.array([2.5, 4.5])).mu
    assert np.isfinite(narrower).sum() >= 4 and np.nanmin(narrower) >= 2.5 and np.nanmax(narrower) <= 4.5
