"""Hunt 9 on the D and M axes, the sweep helpers and the annealing gain: an axis run named as one
of its own sources, axis attributes that are no number, sources of mixed dtypes, D rebuilt from a
trunk that stops short of it, calibration branches beyond the recorded trunk, sweep settings
that were cut to whole steps, non-numeric decay rates, and ``--runs`` lists with empty names;
plus the science (planted events recovered along D; a change of unit shifts learning times by
its log10 and changes nothing else; token order does not matter). Planted stores of a few
hundred tokens."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

import tokdyn
from tokdyn.annealing import annealing_area, branch_gains, decay_schedule, fit_annealing_gain
from tokdyn.axes import assemble_axis, axis_sources
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.fit.job import fit_run
from tokdyn.reconstruct import reconstruct_across, reconstruct_run
from tokdyn.store import as_store
from tokdyn.sweep import DecaySweepConfig, log_budgets


def _probe(seed=0, n_seq=8, context=30):
    rng = np.random.default_rng(seed)
    return tokdyn.ProbeSet.from_tokens(rng.integers(0, 50, (n_seq, context + 1)), tokenizer={"kind": "byte"})


def _store(path, seed=0):
    return tokdyn.open_store(str(path), _probe(seed), mode="w")


def _planted(n, seed=1, lo=1.2, hi=2.8):
    """Per-token loss at axis value a: one sigmoid in log10 a per token (mu, s, d kept on it)."""
    rng = np.random.default_rng(seed)
    mu, s, d = rng.uniform(lo, hi, n), rng.uniform(0.05, 0.25, n), rng.uniform(0.5, 3.0, n)

    def loss(a):
        return 1.0 + d / (1 + np.exp((np.log10(a) - mu) / s))

    loss.mu, loss.s, loss.d = mu, s, d
    return loss


def _one_row(st, name, row, *, step, attrs, dtype="float32", **coords):
    w = st.create_run(name, capacity=1, attrs=attrs, dtype=dtype).writer()
    w.append(np.asarray(row, np.float32), step=step, warn_nonfinite=False, **coords)
    w.release()
    return st.run(name)


# -- an axis run named as one of its sources ---------------------------------------------------


def test_the_axis_run_named_as_one_of_its_sources_is_refused_and_the_source_kept(tmp_path):
    """assemble_axis(..., name="d0", overwrite=True) with d0 among the runs deleted d0 before its
    final row was read: the assembly then failed on the missing run, and the source was gone."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for j in range(4):
        _one_row(st, f"d{j}", np.full(n, 4.0 - j), step=j + 1, attrs={"data_budget": 100 * 2**j})
    before = st.run("d0").losses().copy()
    for overwrite in (True, False):
        with pytest.raises(InputError, match=r"run 'd0' is one of the runs of axis D; the axis run needs another name"):
            assemble_axis(st, "D", runs=["d0", "d1", "d2", "d3"], name="d0", overwrite=overwrite)
    assert sorted(as_store(str(tmp_path / "a.zarr")).runs) == ["d0", "d1", "d2", "d3"]
    np.testing.assert_array_equal(as_store(str(tmp_path / "a.zarr")).run("d0").losses(), before)
    assert assemble_axis(st, "D", runs=["d0", "d1", "d2", "d3"], name="mine").n_committed == 4  # another name is fine


def test_runs_given_as_one_name_are_refused_not_read_letter_by_letter(tmp_path):
    """runs="d1" was iterated letter by letter: "no run 'd'"."""
    st = _store(tmp_path / "a.zarr")
    for j in range(3):
        _one_row(st, f"d{j}", np.full(st.probe.n_tokens, 4.0 - j), step=j + 1, attrs={"data_budget": 100 * 2**j})
    with pytest.raises(InputError, match=r"runs must be a list of run names or Run objects, got 'd1' alone"):
        assemble_axis(st, "D", runs="d1")
    with pytest.raises(InputError, match=r"got 'd1' alone"):
        assemble_axis(st, "D", runs=st.run("d1"))


# -- axis attributes that are no number --------------------------------------------------------


@pytest.mark.parametrize("bad", [[100], {"tokens": 100}, [[1, 2]]])
def test_an_axis_attribute_that_is_a_list_or_dict_is_one_clear_error(tmp_path, capsys, bad):
    """A data_budget written as a list made axis_sources fail on "unhashable type: 'list'" (an
    internal error on the command line); now the run is named as one that cannot sit on the axis."""
    url = str(tmp_path / "a.zarr")
    st = _store(url)
    loss = _planted(st.probe.n_tokens)
    for j in range(7):
        _one_row(st, f"d{j}", loss(10 * 2**j), step=j + 1, attrs={"data_budget": bad if j == 2 else 10 * 2**j})
    assert sorted(axis_sources(st, "D")) == [f"d{j}" for j in range(7)]
    with pytest.raises(InputError, match=r"run 'd2' has no positive, finite 'data_budget'"):
        assemble_axis(st, "D")
    assert main(["reconstruct", url, "--axis", "D", "--boot", "0"]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "run 'd2' has no positive, finite 'data_budget'" in err


def test_equal_axis_values_of_int_and_float_count_once_when_finding_the_runs(tmp_path):
    """10 and 10.0 are one data budget: two runs at it are not two points of an axis."""
    st = _store(tmp_path / "a.zarr")
    n = st.probe.n_tokens
    for j, v in enumerate((10, 10.0, 20)):
        _one_row(st, f"d{j}", np.full(n, 4.0 - j), step=j + 1, attrs={"data_budget": v})
    with pytest.raises(InputError, match="needs at least 3 runs with distinct 'data_budget'"):
        axis_sources(st, "D")


# -- sources of mixed dtypes -------------------------------------------------------------------


@given(order=st_.permutations(["float16", "float32", "float32", "float64"]), value=st_.floats(0.5, 20.0))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_float16_source_does_not_round_the_others(tmp_path_factory, order, value):
    """The axis took the first source's dtype: a float16 run first rounded every other source's
    losses to three digits (2.0001 read 2.0) without a word. Now the widest dtype, so every
    source's final row is there exactly as it was stored."""
    st = _store(tmp_path_factory.mktemp("mix") / "a.zarr")
    n = st.probe.n_tokens
    rows = []
    for j, dtype in enumerate(order):
        row = np.linspace(value, value + 1e-3, n) + j
        rows.append(_one_row(st, f"d{j}", row, step=j + 1, attrs={"data_budget": 100 * 2**j}, dtype=dtype).losses()[0])
    axis = assemble_axis(st, "D")
    assert axis.dtype == np.float64 or str(axis.dtype) == "float64"
    for j in range(len(order)):
        np.testing.assert_array_equal(axis.losses()[j].astype(np.float64), rows[j].astype(np.float64))


# -- D rebuilt from a trunk that stops short of it ---------------------------------------------


def _trunk_and_axis(tmp_path, *, recorded_to=3000):
    """A planted trunk whose lr-area table lists steps to 3000, recorded up to ``recorded_to``
    (a trunk still being recorded, or stopped), and D points at 30-2000 of the same law."""
    st = _store(tmp_path / "s.zarr")
    loss = _planted(st.probe.n_tokens)
    t_steps = np.unique(np.round(np.geomspace(1, 3000, 30)).astype(int))
    w = st.create_run("trunk", capacity=t_steps.size,
                      attrs={"tokens_per_step": 100, "lr_area": {"step": t_steps.tolist(), "area": t_steps.tolist()}}).writer()  # fmt: skip
    for s in t_steps[t_steps <= recorded_to]:
        w.append(loss(s), step=int(s))
    w.release()
    budgets = [30, 60, 120, 250, 500, 1000, 2000]
    for j, b in enumerate(budgets):
        _one_row(st, f"b{j}", loss(b), step=b, attrs={"data_budget": b * 100, "lr_area": float(b), "decay_lr": [0.5, 0.2]})
    return st, assemble_axis(st, "D", runs=[f"b{j}" for j in range(len(budgets))])


@pytest.mark.parametrize("by", ["tokens", "lr_area"])
def test_d_points_beyond_the_fitted_trunk_are_refused_not_extrapolated(tmp_path, by):
    """A trunk recorded to step 200 of 3000 rebuilt D points at 250-2000 from its events
    extrapolated 1 decade past its last point (R^2 0.98 on planted sigmoids, which extrapolate
    perfectly; real events do not), without a word. Points below the fit window were refused
    already; now points above the fitted steps are too."""
    st, axis = _trunk_and_axis(tmp_path, recorded_to=200)
    fit_run(st.run("trunk"), progress=False)
    with pytest.raises(InputError, match=r"4 of the 7 D points lie at effective steps outside the steps 'trunk' was fitted on "
                                         r"\(1 to 190; the points run 30 to 2000\): its events would be extrapolated"):
        reconstruct_across(axis, st.run("trunk"), by=by)


def test_d_points_within_the_fitted_trunk_are_rebuilt_as_before(tmp_path):
    st, axis = _trunk_and_axis(tmp_path)
    fit_run(st.run("trunk"), progress=False)
    assert reconstruct_across(axis, st.run("trunk"), by="tokens").r2_events > 0.99


def test_a_point_within_half_a_checkpoint_interval_of_the_trunk_is_read_off_its_edge(tmp_path):
    """A trunk recorded at steps up to 1999 (a loop numbering its 2000 updates from 0) and a D
    budget of 2000 steps: 0.0002 decades past the fit's last step, and the whole rebuild (R^2
    1.0 before the refusal) and the annealing gains were refused. Half the last interval is
    read off the edge; beyond it, still refused."""
    st = _store(tmp_path / "s.zarr")
    loss = _planted(st.probe.n_tokens)
    t_steps = np.unique(np.round(np.geomspace(1, 1999, 30)).astype(int))
    w = st.create_run("trunk", capacity=t_steps.size,
                      attrs={"tokens_per_step": 100, "lr_area": {"step": [*t_steps.tolist(), 4000], "area": [*t_steps.tolist(), 4000]}}).writer()  # fmt: skip
    for s in t_steps:
        w.append(loss(s), step=int(s))
    w.release()
    budgets = [30, 60, 120, 250, 500, 1000, 2000, 2500]
    for j, b in enumerate(budgets):
        _one_row(st, f"b{j}", loss(b), step=b, attrs={"data_budget": b * 100, "lr_area": float(b), "decay_lr": [0.5, 0.2]})
    fit_run(st.run("trunk"), progress=False)
    axis = assemble_axis(st, "D", runs=[f"b{j}" for j in range(7)], name="D7")
    assert reconstruct_across(axis, st.run("trunk"), by="tokens").r2_events > 0.99
    _, g = branch_gains(st.run("trunk"), [st.run(f"b{j}") for j in range(7)])
    np.testing.assert_allclose(g, 0.0, atol=2e-3)
    # 2500 is 0.1 decades past 1999, the last interval 0.12 decades: more than half of it
    far = assemble_axis(st, "D", runs=[f"b{j}" for j in range(8)], name="D8")
    with pytest.raises(InputError, match=r"1 of the 8 D points lie at effective steps outside"):
        reconstruct_across(far, st.run("trunk"), by="tokens")
    with pytest.raises(InputError, match=r"1 of the 8 lr areas fall at steps 2500-2500"):
        branch_gains(st.run("trunk"), [st.run(f"b{j}") for j in range(8)])


def test_branch_gains_beyond_the_recorded_trunk_are_refused_not_read_at_its_last_row(tmp_path):
    """The trunk's loss at a branch's lr area was read by np.interp, which holds the last
    measured value past the end: branches at steps 250-2000 of a trunk recorded to 200 read gains
    of 0.12-0.55 nats where the planted gain is 0."""
    st, _ = _trunk_and_axis(tmp_path, recorded_to=200)
    branches = [st.run(f"b{j}") for j in range(7)]
    with pytest.raises(InputError, match=r"4 of the 7 lr areas fall at steps 250-2000 of T run 'trunk', outside the steps "
                                         r"where its mean loss was measured \(1-190\)"):
        branch_gains(st.run("trunk"), branches)
    _, g = branch_gains(st.run("trunk"), branches[:3])  # those inside: the planted gain, 0
    np.testing.assert_allclose(g, 0.0, atol=2e-3)


def test_a_branch_named_twice_is_refused_not_weighed_twice(tmp_path):
    st, _ = _trunk_and_axis(tmp_path)
    b = [st.run(f"b{j}") for j in range(3)]
    with pytest.raises(InputError, match=r"branch 'b1' .* named twice"):
        fit_annealing_gain(st.run("trunk"), [b[0], b[1], st.run("b1"), b[2]])
    assert fit_annealing_gain(st.run("trunk"), (r for r in b)).n_branches == 3  # a generator is a sequence of branches too


def test_branches_that_never_decay_are_refused_not_calibrated_to_zero(tmp_path):
    """Branches whose decay_lr never falls below the peak have no annealing area at any
    momentum; the fit returned C = 0 as if calibrated."""
    st = _store(tmp_path / "s.zarr")
    loss = _planted(st.probe.n_tokens)
    t_steps = np.unique(np.round(np.geomspace(1, 3000, 30)).astype(int))
    w = st.create_run("trunk", capacity=t_steps.size,
                      attrs={"lr_area": {"step": t_steps.tolist(), "area": t_steps.tolist()}}).writer()  # fmt: skip
    for s in t_steps:
        w.append(loss(s), step=int(s))
    w.release()
    flat = [_one_row(st, f"c{j}", loss(b) - 0.05, step=b, attrs={"lr_area": float(b), "decay_lr": [1.0, 1.0]})
            for j, b in enumerate((50, 200, 800))]  # fmt: skip
    with pytest.raises(InputError, match="none of the 3 branches has an annealing area"):
        fit_annealing_gain(st.run("trunk"), flat)


# -- sweep settings and decay rates that are no numbers ----------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(budgets=(50, 100.7)), r"budgets: expected whole numbers of steps, got 100.7"),  # was cut to 100
        (dict(budgets=(True, 200)), r"budgets: expected whole numbers"),  # was 1
        (dict(budgets=(100, 200), calibration=((150.9, 0.2),)), r"calibration budgets: expected whole numbers"),  # was 150
        (dict(budgets=(100, 200), warmup=2.5), r"warmup: expected whole numbers"),  # lr above the peak at step 2
        (dict(budgets=(100, 200), warmup=True), r"warmup: expected whole numbers"),
        (dict(budgets=(100, 200), trunk_steps=250.5), r"trunk_steps: expected whole numbers"),
        (dict(budgets=(100, 200), trunk_points=0), r"trunk_points must be at least 2"),
        (dict(budgets=(100, 200), lr=float("inf")), r"lr must be a finite number"),
        (dict(budgets=(100, 200), weight_decay=float("nan")), r"weight_decay must be a finite number"),
        (dict(budgets=(100, 200), grad_clip=-1.0), r"grad_clip >= 0"),
        (dict(budgets=(100, 200), betas=(1.5, 0.9)), r"betas must be two numbers in \[0, 1\)"),
        (dict(budgets=(100, 200), calibration=((150,),)), r"calibration must be \(budget, decay_frac\) pairs"),
    ],
)
def test_sweep_settings_that_would_be_cut_or_are_no_numbers_are_refused(kw, match):
    with pytest.raises(InputError, match=match):
        DecaySweepConfig(**kw)


@given(budget=st_.floats(20.0, 1e6).filter(lambda v: not v.is_integer()))
@settings(max_examples=25, deadline=None)
def test_a_budget_that_is_not_a_whole_step_is_never_cut(budget):
    with pytest.raises(InputError, match="whole numbers of steps"):
        DecaySweepConfig(budgets=(10_000_000, budget) if budget > 10_000_000 else (budget, 10_000_000))


@given(budgets=st_.lists(st_.integers(20, 10_000), min_size=1, max_size=5, unique=True))
@settings(max_examples=25, deadline=None)
def test_whole_budgets_given_as_floats_or_numpy_integers_are_kept(budgets):
    b = sorted(budgets)
    for given_as in ([float(v) for v in b], np.array(b, np.int64), b):
        assert DecaySweepConfig(budgets=given_as).budgets == tuple(b)


def test_log_budgets_refuses_a_count_that_is_not_whole():
    with pytest.raises(InputError, match=r"n: expected whole numbers"):
        log_budgets(1, 10, 2.5)
    assert log_budgets(1, 100, 3.0) == [1, 10, 100]


@pytest.mark.parametrize("decay_lr, momentum", [(["a"], 0.9), ([0.5, "x"], 0.9), ([0.5], "0.5"), ([0.5], None)])
def test_annealing_area_of_no_numbers_is_one_clear_error(decay_lr, momentum):
    """A string among the rates was numpy's ValueError, a momentum of "0.5" a TypeError."""
    with pytest.raises(InputError, match="decay_lr must be|momentum must be"):
        annealing_area(decay_lr, momentum=momentum)


@pytest.mark.parametrize("bad", [["0.5", 0.2], [0.5, float("nan")], [[0.5]], [True, 0.5]])
def test_a_branch_decay_lr_attribute_of_no_numbers_is_one_clear_error(tmp_path, bad):
    st = _store(tmp_path / "a.zarr")
    run = _one_row(st, "b", np.ones(st.probe.n_tokens), step=5, attrs={"decay_lr": bad})
    with pytest.raises(InputError, match=r"run 'b': its 'decay_lr' attribute must hold finite numbers"):
        decay_schedule(run)


# -- --runs lists with empty names -------------------------------------------------------------


def test_cli_runs_with_spaces_empty_names_or_none_at_all(tmp_path, capsys):
    """``--runs ""`` meant "every run found from metadata" without a word, ``a,,b`` asked for
    run '' and ``a, b`` for run ' b'."""
    url = str(tmp_path / "a.zarr")
    st = _store(url)
    loss = _planted(st.probe.n_tokens)
    for j in range(7):
        _one_row(st, f"d{j}", loss(10 * 2**j), step=j + 1, attrs={"data_budget": 10 * 2**j})
    _one_row(st, "other", loss(5), step=1, attrs={"data_budget": 5})
    for runs, match in (("", "--runs names no run"), (" , ", "--runs names no run"), ("d0,,d1,d2", "empty name between commas")):
        assert main(["reconstruct", url, "--axis", "D", "--runs", runs, "--boot", "0"]) == 1
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1, err
    assert "axis-D" not in as_store(url).runs
    assert main(["reconstruct", url, "--axis", "D", "--runs", "d0, d1, d2, d3, d4, d5, d6", "--json", "--boot", "0"]) == 0
    assert [s["run"] for s in as_store(url).run("axis-D").attrs["sources"]] == [f"d{j}" for j in range(7)]
    assert main(["reconstruct", url, "--run", "axis-D", "--runs", "", "--boot", "0"]) == 1
    assert "--runs applies to an axis" in capsys.readouterr().err


# -- the science: planted events, a change of unit, token order --------------------------------


def _planted_axis(path, *, unit=1.0, perm=None, axis="D"):
    st = _store(path)
    n = st.probe.n_tokens
    loss = _planted(n)
    attr = "data_budget" if axis == "D" else "n_params_non_embedding"
    for j, a in enumerate(np.geomspace(10, 10_000, 16)):
        row = loss(a) if perm is None else loss(a)[perm]
        _one_row(st, f"r{j}", row, step=j + 1, attrs={attr: float(a * unit)})
    run = assemble_axis(st, axis)
    fit_run(run, progress=False)
    return run, loss


@pytest.mark.slow
def test_planted_events_are_recovered_and_a_change_of_unit_or_token_order_changes_nothing_else(tmp_path):
    """Independent answers: the fit of an axis made of planted sigmoids finds their learning
    times; counting the axis in other units (1000 x: tokens as thousands, parameters as
    millions...) shifts every learning time by log10 of the factor and changes no score; the
    order of the tokens changes nothing but the order of the results."""
    run, loss = _planted_axis(tmp_path / "a.zarr")
    base = reconstruct_run(run, n_boot=0)
    mu = np.asarray(run.fit.read(fields=("mu",))["mu"])
    np.testing.assert_allclose(mu, loss.mu, atol=1e-4)
    assert base.r2_events > 0.999 and base.drop_share_events == pytest.approx(1.0, abs=1e-3)
    for unit in (1e3, 10**-2.5):
        other, _ = _planted_axis(tmp_path / f"u{unit}.zarr", unit=unit, axis="M")
        rec = reconstruct_run(other, n_boot=0)
        np.testing.assert_allclose(rec.x, base.x + np.log10(unit), atol=1e-12)
        np.testing.assert_allclose(np.asarray(other.fit.read(fields=("mu",))["mu"]), mu + np.log10(unit), atol=1e-5)
        for k in ("r2_events", "r2_spectrum", "drop_share_events", "bandwidth"):
            assert rec.summary()[k] == pytest.approx(base.summary()[k], abs=1e-6), k
        np.testing.assert_allclose(rec.measured, base.measured, atol=1e-9)
    perm = np.random.default_rng(3).permutation(run.n_tokens)
    shuffled, _ = _planted_axis(tmp_path / "p.zarr", perm=perm)
    rec = reconstruct_run(shuffled, n_boot=0)
    np.testing.assert_allclose(np.asarray(shuffled.fit.read(fields=("mu",))["mu"]), mu[perm], atol=1e-9)
    assert rec.r2_events == pytest.approx(base.r2_events, abs=1e-9)
    assert rec.r2_spectrum == pytest.approx(base.r2_spectrum, abs=1e-9)


def test_an_axis_on_which_the_loss_rises_is_rebuilt_as_a_rise(tmp_path):
    """Larger models worse on every token (a planted rise): the events carry the rise, with
    negative drops, and the rebuilt derivative is negative where the measured one is."""
    st = _store(tmp_path / "a.zarr")
    loss = _planted(st.probe.n_tokens)
    for j, a in enumerate(np.geomspace(10, 10_000, 10)):
        _one_row(st, f"m{j}", 5.0 - loss(a), step=1, attrs={"n_params_non_embedding": float(a)})
    run = assemble_axis(st, "M")
    fit_run(run, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = reconstruct_run(run, n_boot=0)
    assert rec.mean_loss_rose and rec.r2_events > 0.99 and rec.drop_share_events == pytest.approx(1.0, abs=1e-3)
    big = np.abs(rec.measured) > 0.1  # (the flat ends, one-sided, read a small slope of either sign)
    assert big.sum() >= 5 and np.all(rec.measured[big] < 0) and np.all(rec.from_events[big] < 0)
    assert np.nanmax(np.asarray(run.fit.read(fields=("delta",))["delta"])) < 0  # every event a rise


def test_decay_sweep_grad_clip_none_is_no_clipping():
    # DecaySweepConfig(grad_clip=None) meant no clipping (the loop tests `if cfg.grad_clip`); the
    # settings check refused it as "not a finite number"
    from tokdyn.sweep import DecaySweepConfig

    assert DecaySweepConfig(budgets=(100, 200), grad_clip=None).grad_clip == 0.0
    with pytest.raises(InputError, match="grad_clip"):
        DecaySweepConfig(budgets=(100, 200), grad_clip=-1.0)


def test_an_axis_run_is_no_source_of_another_axis(tmp_path):
    # assemble_axis took a D axis run among the sources of axis M: its last row (the largest
    # budget) was read as a training run's end (noticed by the axes hunt)
    st, axis = _trunk_and_axis(tmp_path)
    with pytest.raises(InputError, match=r"run 'axis-D' is a D axis run; the runs of axis D are training \(T\) runs"):
        assemble_axis(st, "D", runs=["b0", "b1", axis.name], name="D2")
