"""Hunt 18 on the D and M axes and the annealing gain: an axis's sources found from any working
folder, a run that is not an assembled axis never deleted by a rebuild, equal budgets and
configurations written differently are one, the annealing momentum's tie rule and a calibration
that cannot tell the momentum, decay rates that are not fractions of the peak, and the annealing
area in closed form against its recursion. Planted stores of a few dozen tokens."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

import tokdyn
from tokdyn.annealing import AnnealingWarning, annealing_area, decay_schedule, fit_annealing_gain
from tokdyn.axes import _check_replaceable, assemble_axis, axis_run_problem, axis_sources, source_runs
from tokdyn.cli import main
from tokdyn.errors import InputError, StoreError
from tokdyn.store import as_store

N = 40


def _d_store(path, budgets=(1000, 2000, 4000, 8000, 16000), configs=None, tag=True, tps=10):
    """A D sweep: each run two rows, the last at its data budget, one planted drop per token."""
    rng = np.random.default_rng(0)
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(N, dtype=np.int32), "token_pos": np.ones(N, np.int32)})
    st = tokdyn.open_store(str(path), probe, mode="w")
    mu = rng.uniform(3.2, 4.1, N)
    for i, b in enumerate(budgets):
        attrs = {"data_budget": b, "tokens_per_step": tps, "model_config": (configs or [{"w": 1}])[i % len(configs or [1])]}
        if tag:
            attrs["sweep"] = "D"
        with st.create_run(f"r{i}", capacity=3, attrs=attrs).writer() as w:
            for step in (int(b) // tps // 2, int(b) // tps):
                row = 1 + 3 / (1 + np.exp((np.log10(b) - mu) / 0.15))
                w.append(row.astype(np.float32), step=step, tokens_seen=step * tps)
    return st


def _set_attr(st, name, key, value):
    """Edit a run's stored metadata, as a user's script or an older tokdyn left it."""
    group = st.run(name)._group
    meta = dict(group.attrs["tokdyn_run"])
    meta[key] = value
    group.attrs["tokdyn_run"] = meta
    return as_store(str(st.url), mode="r+")


def _append_row(st, name, value, step, tps=10):
    w = st.run(name).writer(resume=True)
    w.append(np.full(N, value, np.float32), step=step, tokens_seen=step * tps)
    w.release()


# -- an axis's sources, read from any working folder --------------------------------------------


def test_a_source_with_new_rows_is_seen_from_any_working_folder(tmp_path, monkeypatch):
    """The axis kept the store path as typed ('d.zarr'); read from another folder a stale axis
    was used without a word (and source_runs failed, or read another folder's d.zarr)."""
    monkeypatch.chdir(tmp_path)
    st = _d_store("d.zarr")
    axis = assemble_axis(st, "D")
    assert all(os.path.isabs(s["store"]) and s["same_store"] for s in axis.attrs["sources"])
    _append_row(st, "r4", 0.5, 1700)  # r4's final row is another one now (its budget moved too)
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    _d_store("d.zarr", budgets=(100, 200, 400))  # a store of the same name in the folder of the moment
    moved = as_store(str(tmp_path / "d.zarr"))
    assert "r4 has" in (axis_run_problem(moved.run("axis-D"), "D") or "").replace("'", "")
    assert [r.name for r in source_runs(moved.run("axis-D"))] == ["r0", "r1", "r2", "r3", "r4"]
    assert all(r.store.url == moved.url for r in source_runs(moved.run("axis-D")))


def test_an_axis_store_moved_whole_still_finds_its_own_sources(tmp_path):
    st = _d_store(tmp_path / "d.zarr")
    assemble_axis(st, "D")
    os.rename(tmp_path / "d.zarr", tmp_path / "moved.zarr")
    moved = as_store(str(tmp_path / "moved.zarr"))
    assert axis_run_problem(moved.run("axis-D"), "D") is None
    assert [r.store.url for r in source_runs(moved.run("axis-D"))] == [moved.url] * 5


def test_an_older_axis_with_a_relative_source_path_reads_as_before(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    st = _d_store("d.zarr")
    axis = assemble_axis(st, "D")
    old = [{k: v for k, v in s.items() if k != "same_store"} | {"store": "d.zarr"} for s in axis.attrs["sources"]]
    axis = _set_attr(st, "axis-D", "sources", old).run("axis-D")  # as assemble_axis wrote it before
    assert "same_store" not in axis.attrs["sources"][0]
    assert axis_run_problem(axis, "D") is None and len(source_runs(axis)) == 5


# -- a rebuild deletes only what an assembly made ------------------------------------------------


@pytest.mark.parametrize("kind", ["T", "imported"])
def test_a_rebuild_never_deletes_a_run_it_did_not_assemble(tmp_path, capsys, kind):
    st = _d_store(tmp_path / "d.zarr")
    probe_rows = np.full((3, N), 2.0, np.float32)
    if kind == "T":
        mine = st.create_run("axis-D", capacity=3, attrs={"note": "mine"})
    else:  # an axis of losses imported from elsewhere: no sources, cannot be assembled again
        mine = st.create_run("axis-D", axis="D", capacity=3, attrs={"note": "mine"})
    with mine.writer() as w:
        for k, row in enumerate(probe_rows):
            w.append(row, step=k, **({"axis_value": 10.0 ** (k + 1)} if kind != "T" else {}))
    assert main(["reconstruct", str(st.url), "--axis", "D", "--rebuild", "--boot", "0"]) == 1
    err = capsys.readouterr().err
    assert "would delete" in err and "delete_run('axis-D')" in err and len(err.strip().splitlines()) == 1
    kept = as_store(str(st.url)).run("axis-D")
    assert kept.attrs["note"] == "mine" and kept.n_committed == 3
    with pytest.raises(InputError, match="would delete"):
        assemble_axis(st, "D", overwrite=True)


def test_an_assembled_axis_of_the_other_axis_is_named_as_such(tmp_path):
    st = _d_store(tmp_path / "d.zarr")
    assemble_axis(st, "D")
    with pytest.raises(InputError, match=r"'axis-D' of .* is an axis D run assembled from runs, which assembling axis M"):
        _check_replaceable(st, "axis-D", "M")  # what assemble_axis(st, "M", name="axis-D", overwrite=True) asks


def test_a_rebuild_still_replaces_an_assembled_axis(tmp_path):
    st = _d_store(tmp_path / "d.zarr")
    first = assemble_axis(st, "D")
    n_first = first.n_committed
    again = assemble_axis(st, "D", overwrite=True)
    assert again.n_committed == n_first == 5
    # the view of the axis run it replaced says so (hunt 24: a held view of a run made again)
    with pytest.raises(StoreError, match="deleted and made again after this view of it was opened"):
        first.n_committed


# -- what is held fixed along an axis, compared as values ---------------------------------------


@pytest.mark.parametrize(
    "configs", [[{"n_layer": 2, "n_embd": 64}, {"n_embd": 64, "n_layer": 2}], [{"w": 1}, {"w": 1.0}]]
)
def test_one_configuration_written_two_ways_is_one_sweep(tmp_path, configs):
    st = _d_store(tmp_path / "d.zarr", configs=configs)
    assert axis_sources(st, "D") == ["r0", "r1", "r2", "r3", "r4"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "different model configurations" warning either
        assert assemble_axis(st, "D").n_committed == 5


def test_one_data_budget_written_two_ways_is_one_m_sweep(tmp_path):
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(N, dtype=np.int32), "token_pos": np.ones(N, np.int32)})
    st = tokdyn.open_store(str(tmp_path / "m.zarr"), probe, mode="w")
    for i, p in enumerate((1e4, 3e4, 1e5, 3e5)):
        attrs = {"sweep": "M", "n_params": p, "data_budget": 1_000_000 if i % 2 else 1e6, "tokens_per_step": 1000}
        with st.create_run(f"m{i}", capacity=1, attrs=attrs).writer() as w:
            w.append(np.full(N, 3.0 - i * 0.3, np.float32), step=1000, tokens_seen=1_000_000)
    assert axis_sources(st, "M") == ["m0", "m1", "m2", "m3"]
    # two sweeps really differing are still refused
    st = _set_attr(st, "m3", "data_budget", 2e6)
    with pytest.raises(InputError, match="2 different data budgets"):
        axis_sources(st, "M")


# -- the annealing gain ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    eta=st_.lists(st_.floats(0.0, 1.0), min_size=1, max_size=60),
    momentum=st_.one_of(st_.just(0.0), st_.floats(0.0, 0.999999), st_.just(1 - 1e-9)),
)
def test_annealing_area_in_closed_form_is_the_recursion(eta, momentum):
    m, total, prev = 0.0, 0.0, 1.0
    for e in eta:  # the definition: m_i = momentum * m_{i-1} + (eta_{i-1} - eta_i), S2 = sum m_i
        m = momentum * m + (prev - e)
        total += m
        prev = e
    assert annealing_area(eta, momentum=momentum) == pytest.approx(total, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("bad", [[99.5, 99.0, 98.0], [0.5, -0.1], [1.5, 1.0]])
def test_decay_rates_that_are_no_fraction_of_the_peak_are_refused(tmp_path, bad):
    with pytest.raises(InputError, match=r"fractions of the peak rate in \[0, 1\]"):
        annealing_area(bad, momentum=0.9)
    st = _d_store(tmp_path / "d.zarr")
    st = _set_attr(st, "r0", "decay_lr", bad)
    with pytest.raises(InputError, match=r"run 'r0': its 'decay_lr' attribute must hold lr / peak"):
        decay_schedule(st.run("r0"))


def _trunk_and_branches(path, decays, c_true=0.05, momentum_true=0.9):
    """A T trunk at constant lr (mean loss falling in log step) and one branch per decay, each
    ending at its own lr area with the planted gain c * S2(decay, momentum) off the trunk."""
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(N, dtype=np.int32), "token_pos": np.ones(N, np.int32)})
    st = tokdyn.open_store(str(path), probe, mode="w")
    steps = np.unique(np.geomspace(1, 4000, 40).astype(int))
    trunk_loss = lambda s: 4.0 - 0.5 * np.log10(s)  # noqa: E731
    table = {"step": steps.tolist(), "area": steps.tolist()}  # a constant rate: the area is the step
    with st.create_run("trunk", capacity=len(steps), attrs={"lr_area": table}).writer() as w:
        for s in steps:
            w.append(np.full(N, trunk_loss(s), np.float32), step=int(s))
    branches = []
    for i, (start, d) in enumerate(decays):
        sched = list(np.linspace(1, 0, d + 1)[1:])
        area = start + sum(sched)
        gain = c_true * annealing_area(sched, momentum=momentum_true)
        name = f"b{i}"
        with st.create_run(name, capacity=1, attrs={"lr_area": area, "decay_lr": sched}).writer() as w:
            w.append(np.full(N, trunk_loss(area) - gain, np.float32), step=start + d)
        branches.append(st.run(name))
    return st.run("trunk"), branches


def test_branches_of_one_decay_shape_keep_the_smallest_momentum_and_say_so(tmp_path):
    trunk, branches = _trunk_and_branches(tmp_path / "a.zarr", [(200, 20), (400, 20), (800, 20), (1600, 20)])
    with pytest.warns(AnnealingWarning, match="do not tell the momentum"):
        gain = fit_annealing_gain(trunk, branches)
    assert gain.momentum == 0.0  # the docstring's tie rule (it kept 0.9999, and a 300-step decay gained 9x)
    assert gain.gain(list(np.linspace(1, 0, 21)[1:])) == pytest.approx(0.05 * annealing_area(
        list(np.linspace(1, 0, 21)[1:]), momentum=0.9), rel=1e-3)  # fmt: skip - its own shape is still right


def test_branches_of_several_decay_lengths_measure_the_momentum_without_a_warning(tmp_path):
    trunk, branches = _trunk_and_branches(tmp_path / "a.zarr", [(200, 10), (400, 40), (800, 160), (1600, 640)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", AnnealingWarning)
        gain = fit_annealing_gain(trunk, branches)
    assert gain.coef == pytest.approx(0.05, rel=0.1) and abs(np.log10(1 - gain.momentum) - (-1)) <= 0.05


# -- the sweep's names and counts, checked before any training ---------------------------------


def _never_called(start):
    raise AssertionError("training started before the settings were checked")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(trunk="D01"), r"the trunk's name 'D01' is also a branch's"),
        (dict(trunk="D-cal00"), r"the trunk's name 'D-cal00' is also a branch's"),
        (dict(prefix="a/b"), r"run name must be"),
        (dict(trunk="t/x"), r"run name must be"),
        (dict(tokens_per_step=2.9), r"tokens_per_step: expected whole numbers of tokens"),
        (dict(tokens_per_step="32"), r"tokens_per_step: expected whole numbers of tokens"),
        (dict(tokens_per_step=True), r"tokens_per_step: expected whole numbers of tokens"),
    ],
)
def test_sweep_names_and_token_counts_are_checked_before_training(tiny_model, probe, store_path, kw, match):
    from tokdyn.sweep import DecaySweepConfig, branched_decay_sweep

    cfg = DecaySweepConfig(budgets=(6, 8), warmup=1, trunk_points=3, calibration=((7, 0.5),))
    st = tokdyn.open_store(store_path, probe, mode="w")
    args = {"tokens_per_step": 128, **kw}
    with pytest.raises(InputError, match=match):
        branched_decay_sweep(tiny_model, _never_called, probe, st, cfg, **args)
    assert list(st.runs) == []  # nothing left behind that blocks a rerun


@pytest.mark.parametrize("first, last, n", [(1.5, 2.4, 3), (1, 5, 10), (10, 12, 5)])
def test_log_budgets_that_round_to_fewer_points_are_refused(first, last, n):
    from tokdyn.sweep import log_budgets

    with pytest.raises(InputError, match=rf"{n} budgets between .* round to \d+ distinct whole steps"):
        log_budgets(first, last, n)


@settings(max_examples=40, deadline=None)
@given(first=st_.integers(1, 1000), ratio=st_.floats(1.01, 1e4), n=st_.integers(2, 40))
def test_log_budgets_gives_n_distinct_budgets_or_says_why_not(first, ratio, n):
    from tokdyn.sweep import log_budgets

    try:
        b = log_budgets(first, first * ratio, n)
    except InputError as exc:
        assert "distinct whole steps" in str(exc)
        return
    assert len(b) == n and b == sorted(set(b)) and b[0] == first
