"""Hunt 24: arrays from a researcher's own code through the public Python API (big-endian,
strided, Fortran-order, read-only, masked, numpy subclasses, lists, torch tensors), checked
against the same values as a plain native C-contiguous float64 array."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from test_hunt5_sampler import _schedule
from tokdyn import InputError
from tokdyn._checks import as_values
from tokdyn.curriculum import DomainRates, LearnabilityTable, MixtureSchedule, MixtureConfig, mixture_sampler, token_targets
from tokdyn.spectrum import Events, learning_time_spectrum

MU, S, DELTA = np.array([0.5, 1.0, 1.5, 2.2]), np.array([0.1, 0.3, 0.2, 0.15]), np.array([1.0, 0.5, 2.0, -0.3])
TOKEN = np.array([0, 1, 1, 3])
XS = np.linspace(0.0, 3.0, 13)


def _events(token=TOKEN, mu=MU, s=S, delta=DELTA, **kw) -> Events:
    return Events(token, mu, s, delta, 5, (0.0, 3.0), **kw)


def _layouts(a: np.ndarray) -> dict:
    """The values of ``a`` as others' code hands them over."""
    strided = np.repeat(a, 3)[1::3]
    fortran = np.asfortranarray(np.stack([a, a], axis=1))[:, 1]
    ro = a.copy()
    ro.flags.writeable = False
    out = {"big-endian": a.astype(a.dtype.newbyteorder(">")), "strided": strided, "fortran column": fortran,
           "read-only": ro, "reversed twice": a[::-1].copy()[::-1], "list": a.tolist(),
           "unmasked masked array": np.ma.array(a, mask=np.zeros(a.shape, bool))}  # fmt: skip
    if a.dtype.kind == "f":
        out |= {"torch with grad": torch.tensor(a, requires_grad=True), "float32 torch": torch.tensor(a, dtype=torch.float32)}
    return out


@pytest.mark.parametrize("layout", list(_layouts(MU)))
def test_events_of_any_layout_are_the_events_of_native_float64_bit_for_bit(layout):
    """The events' curve, derivative and spectrum read the values, whatever their byte order,
    strides, subclass or library; torch tensors with grad were a RuntimeError."""
    ref = _events()
    if layout == "float32 torch":  # float32 values: compare with the same values as float64
        ref = _events(mu=MU.astype(np.float32), s=S.astype(np.float32), delta=DELTA.astype(np.float32))
    ev = _events(*(_layouts(a)[layout] if layout in _layouts(a) else a for a in (TOKEN, MU, S, DELTA)))
    for got, want in ((ev.curve(XS), ref.curve(XS)), (ev.derivative(XS), ref.derivative(XS)),
                      (learning_time_spectrum(ev).density, learning_time_spectrum(ref).density)):  # fmt: skip
        np.testing.assert_array_equal(got, want)
    for a in (ev.token, ev.mu, ev.s, ev.delta, ev.well_fitted):
        assert a.dtype.isnative and a.flags.c_contiguous and a.flags.writeable


def test_bfloat16_tensor_events_are_their_values():
    """A bfloat16 tensor (a model's own losses) was "TypeError: Got unsupported ScalarType"."""
    mu = torch.tensor(MU).bfloat16()
    ev = _events(mu=mu)
    np.testing.assert_array_equal(ev.mu, mu.float().numpy().astype(np.float64))


def test_events_never_write_the_callers_arrays():
    mu = MU.copy()
    ev = _events(mu=mu)
    ev.mu[:] = 9.0  # a new array: the caller's stays as it is, and the events do not follow it
    assert np.array_equal(mu, MU)
    mu[0] = -5.0
    assert _events(mu=MU).mu[0] == MU[0]


@pytest.mark.parametrize("kw, what", [
    (dict(token=np.array([0.0, 1.2, 1.0, 2.9])), "Events.token"),  # before: tokens 0, 1, 1, 2 without a word
    (dict(token=np.array([0.0, np.nan, 1.0, 3.0])), "Events.token"),  # before: token -2**63, past the range check
    (dict(token=np.array([True, False, True, True])), "Events.token"),
    (dict(mu=np.ma.array(MU, mask=[0, 1, 0, 0])), "Events.mu: .*1 masked value"),  # before: the value under the mask
    (dict(delta=np.ma.array(DELTA, mask=[0, 0, 0, 1])), "Events.delta: .*masked"),
    (dict(mu=MU + 0.5j), "Events.mu: .*complex"),  # before: the imaginary part dropped (a ComplexWarning)
    (dict(mu=np.array(["0.5", "1", "1.5", "2"])), "Events.mu"),  # before: a TypeError from np.isfinite
    (dict(well_fitted=np.array([0.2, 0.0, 1.0, 1.0])), "Events.well_fitted"),  # before: 0.2 was True
    (dict(scored=np.ma.array(np.ones(5, bool), mask=[0, 0, 0, 0, 1])), "Events.scored"),  # before: counted as scored
    (dict(unit=np.ma.array([0, 1, 1, 2, 2], mask=[0, 0, 0, 0, 1])), "Events.unit"),
    (dict(unit=np.array([0, 1, 2, 2**63 + 5, 3], np.uint64)), "Events.unit: .*past int64"),  # before: a ValueError
    (dict(n_scored=4.5), "Events.n_scored"),  # before: 4 tokens
], ids=["float token", "NaN token", "bool token", "masked mu", "masked delta", "complex mu", "text mu",
        "well_fitted 0.2", "masked scored", "masked unit", "unit past int64", "n_scored 4.5"])  # fmt: skip
def test_what_np_asarray_took_without_a_word_is_one_input_error(kw, what):
    with pytest.raises(InputError, match=what):
        _events(**kw)


@pytest.mark.parametrize("n_tokens", [4.7, "5", True], ids=["4.7", "text", "bool"])
def test_n_tokens_that_is_no_count_is_refused(n_tokens):
    with pytest.raises(InputError, match="Events.n_tokens"):  # before: int(4.7) = 4, int("5") = 5
        Events(np.array([0, 1]), MU[:2], S[:2], DELTA[:2], n_tokens, (0.0, 3.0))


@pytest.mark.parametrize("call, what", [
    (lambda ev: ev.curve(np.ma.array(XS, mask=XS > 2)), "x: .*masked"),  # before: read at the masked x
    (lambda ev: learning_time_spectrum(ev, weights=np.ma.array(np.ones(4), mask=[1, 0, 0, 0])), "weights: .*masked"),
    (lambda ev: learning_time_spectrum(ev, weights=np.array([True, False, True, True])), "weights: .*bool"),
    (lambda ev: ev.subset(np.array([0.5, 0.0, 1.0, 1.0])), "subset"),  # before: 0.5 kept the event
    (lambda ev: ev.for_tokens(np.ma.array(np.ones(5, bool), mask=[1, 0, 0, 0, 0])), "for_tokens"),
], ids=["masked x", "masked weights", "bool weights", "subset of 0.5", "masked token mask"])  # fmt: skip
def test_the_events_methods_refuse_what_they_would_misread(call, what):
    with pytest.raises(InputError, match=what):
        call(_events())


def test_token_targets_refuse_float_tokens_that_are_no_index():
    """A float token of 1.7 (events from another tool's npz) was token 1 without a word; a
    whole float is that index."""
    ev = {"token": np.array([0.0, 1.7]), "mu": np.array([1.0, 2.0]), "delta": np.array([1.0, 1.0])}
    with pytest.raises(InputError, match="events\\['token'\\].*1.7"):
        token_targets(ev, 3)
    whole = token_targets({**ev, "token": np.array([0.0, 2.0])}, 3)
    np.testing.assert_array_equal(whole["delta"], [1.0, 0.0, 1.0])


def test_a_learnability_target_with_masked_values_is_refused():
    tokens = np.array([[1, 2, 3], [2, 3, 1]])
    targets = {"delta": np.ma.array([1.0, 0.5, 0.2, 0.1], mask=[0, 1, 0, 0]), "mu": np.ones(4), "weight": np.ones(4)}
    with pytest.raises(InputError, match="target 'delta': .*masked"):  # before: 0.5, under its mask, was a target
        LearnabilityTable.fit(tokens, targets, vocab_size=8)


def test_domain_inputs_with_masked_values_are_refused():
    ev = Events(np.arange(20), np.where(np.arange(20) < 10, 0.5, 2.5), np.full(20, 0.1), np.full(20, 2.0), 20, (0.0, 3.0))
    dom = np.ma.array(np.repeat([0, 1], 10), mask=np.arange(20) == 19)
    with pytest.raises(InputError, match="token_domain: .*masked"):  # before: the masked token kept its domain
        DomainRates.from_events(ev, dom, ("a", "b"), width=0.1, significance=0)
    with pytest.raises(InputError, match="rates must be numbers.*masked"):
        DomainRates(("a", "b"), [0.0, 1.0], np.ma.array(np.ones((2, 2)), mask=[[0, 1], [0, 0]]))
    ids = np.ma.array(np.repeat([0, 1, 2], 5), mask=np.arange(15) == 0)
    with pytest.raises(InputError, match="domain_ids must be one integer per sample.*masked"):
        mixture_sampler(ids, _schedule(), samples_per_step=4)
    with pytest.raises(InputError, match="base must be numbers.*masked"):
        MixtureSchedule(DomainRates(("a", "b"), [0.0, 1.0], np.ones((2, 2))), MixtureConfig(total_steps=10),
                        base=np.ma.array([0.5, 0.5], mask=[0, 1]))  # fmt: skip


_DTYPES = st.sampled_from(["<f8", ">f8", "<f4", ">f4", "<f2", ">f2", "<i4", ">i4", ">i8", "<u2", ">u4"])


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=_DTYPES, kind=st.sampled_from(["real", "index", "flag"]))
def test_as_values_is_the_values_as_native_float64_int64_or_bool(data, dtype, kind):
    """Any byte order, width and layout: the same values in a new native C-contiguous array."""
    floats = np.dtype(dtype).kind == "f"
    if kind == "flag":
        dtype = data.draw(st.sampled_from(["?", "=?"]))
    elems = (None if kind == "flag" else
             st.floats(-6e4, 6e4, width=8 * np.dtype(dtype).itemsize).map(round if kind == "index" else float) if floats
             else None)  # fmt: skip
    a = data.draw(hnp.arrays(dtype, hnp.array_shapes(max_dims=2, max_side=5), elements=elems))
    view = data.draw(st.sampled_from(["plain", "transposed", "every other", "read-only"]))
    if view == "transposed":
        a = a.T
    elif view == "every other":
        a = a[::2]
    elif view == "read-only":
        a.flags.writeable = False
    before = a.copy()
    got = as_values("v", a, kind)
    want = {"real": np.float64, "index": np.int64, "flag": np.bool_}[kind]
    assert got.dtype == want and got.dtype.isnative and got.flags.c_contiguous and got.flags.writeable
    np.testing.assert_array_equal(got, a.astype(want))  # the values (an int64 past 2**53 too)
    assert not np.shares_memory(got, a) and np.array_equal(a, before)


def test_reconstruct_refuses_a_masked_mean_loss_and_reads_any_layout():
    """A mean loss with masked points (a researcher's np.ma of checkpoints that failed) was read
    at the values under the mask; a missing point is NaN, which reconstruct leaves out."""
    from tokdyn.reconstruct import measured_derivative, reconstruct

    x = np.linspace(0.0, 3.0, 16)
    ev = _events()
    loss = 5.0 + ev.curve(x)
    masked = np.ma.array(loss, mask=x > 2.5)
    with pytest.raises(InputError, match="mean_loss: .*masked"):
        reconstruct(x, masked, ev, n_boot=0)
    with pytest.raises(InputError, match="loss: .*masked"):
        measured_derivative(x, masked)
    ref = measured_derivative(x, loss)
    for name, layout in _layouts(loss).items():
        if name != "float32 torch":  # (other values)
            np.testing.assert_array_equal(measured_derivative(x[::-1][::-1], layout), ref)


def test_a_writer_stores_any_layouts_values_and_refuses_masked_losses(tmp_path):
    """``run.writer().append`` took a masked array's values under its mask (a token the
    researcher's code masked out was stored as if scored) and a tensor with grad or in bfloat16
    was numpy's RuntimeError or TypeError; each layout is now stored as its values."""
    import tokdyn

    n = 6
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n), "token_pos": np.ones(n, np.int64)})
    st_ = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a")
    losses = np.linspace(0.5, 3.0, n)
    w = st_.create_run("r", dtype="float32").writer()
    with pytest.raises(InputError, match="losses: .*1 masked value"):
        w.append(np.ma.array(losses, mask=np.arange(n) == 2), step=1)
    layouts = {k: v for k, v in _layouts(losses).items() if k != "list"} | {"bfloat16": torch.tensor(losses).bfloat16()}
    for step, (name, values) in enumerate(layouts.items(), start=1):
        w.append(values, step=step)
        want = losses if name != "bfloat16" else torch.tensor(losses).bfloat16().float().numpy()
        np.testing.assert_array_equal(st_.run("r").losses()[-1], want.astype(np.float32), err_msg=name)
    assert np.array_equal(losses, np.linspace(0.5, 3.0, n))  # the caller's array as it was


@pytest.mark.parametrize("steps, what", [
    (np.array([[5, 1], [3, 2]]), "1-D"),  # before: a 2-D "schedule", sorted row by row
    (np.array([1, 2**64 - 1], np.uint64), "past int64"),  # before: step -1, sorted first
    ([1.0, 1e30], "past int64"),  # before: "must be >= 0, got -9223372036854775808"
    (np.ma.array([1, 2, 3], mask=[0, 1, 0]), "masked"),
    (np.array(5), "1-D"),  # before: TypeError: iteration over a 0-d array
    ([0, 2.5], "no whole number"),
], ids=["2-d", "uint64 past int64", "1e30", "masked", "0-d", "2.5"])  # fmt: skip
def test_explicit_schedule_refuses_what_is_no_list_of_steps(steps, what):
    from tokdyn.schedule import explicit_schedule

    with pytest.raises(InputError, match=f"schedule steps: .*{what}"):
        explicit_schedule(steps)


@pytest.mark.parametrize("steps", [np.array([30, 1, 7], ">i8"), np.array([30.0, 1.0, 7.0], ">f4"), torch.tensor([30, 1, 7]),
                                   np.array([99, 30, 5, 1, 3, 7])[1::2], (s for s in (30, 1, 7)), np.array([30, 7, 1], np.uint16)])
def test_explicit_schedule_of_any_layout_is_its_sorted_steps(steps):
    from tokdyn.schedule import explicit_schedule

    got = explicit_schedule(steps)
    assert got.dtype == np.int64 and got.tolist() == [1, 7, 30]


@pytest.mark.parametrize("last", [float("nan"), float("inf"), 1e30, 2**70, True, "100"])
def test_a_schedule_bound_that_is_no_step_is_one_input_error(last):
    """NaN and inf were int()'s ValueError and OverflowError, 1e30 a schedule holding step
    -2**63, 2**70 numpy's TypeError, True the schedule [0, 1]."""
    from tokdyn.schedule import geometric_schedule, pythia_schedule

    for make in (lambda: geometric_schedule(last, 5), lambda: pythia_schedule(last)):
        with pytest.raises(InputError, match="schedule bounds must be integers"):
            make()


@settings(max_examples=60, deadline=None)
@given(last=st.integers(0, 2**63 - 1), n=st.integers(2, 60), first=st.integers(0, 2**63 - 1))
def test_a_geometric_schedule_is_distinct_steps_from_first_to_last(last, n, first):
    """Past 2**53 float64 rounds the end: 2**63 - 1 gave step -2**63, 2**53 + 1 a step 2**53
    beside it; and last=0 had a step 1 past it."""
    from tokdyn.schedule import geometric_schedule

    first = min(first, last)
    got = geometric_schedule(last, n, first=first)
    assert got[0] == first and got[-1] == last and np.all(np.diff(got) > 0) and got.size <= n + 2


@pytest.fixture
def four_rows(tmp_path):
    """A run of 6 tokens at 4 rows: token t's loss at row i is t + i + 1."""
    import tokdyn

    n = 6
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n), "token_pos": np.ones(n, np.int64)})
    st_ = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a")
    w = st_.create_run("r").writer()
    for s in range(1, 5):
        w.append(np.arange(n) + float(s), step=s)
    return st_.run("r")


@pytest.mark.parametrize("args, what", [
    (dict(tokens=np.array([0, 5, 1, 1, 2, 3])), "tokens: expected bools"),  # before: tokens 1..5, not the indices
    (dict(tokens=np.array([0.2, 0, 0, 0, 0, 1.0])), "tokens: expected bools"),  # before: 0.2 was True
    (dict(tokens=np.ma.array(np.ones(6, bool), mask=[1, 0, 0, 0, 0, 0])), "tokens: .*masked"),
    (dict(rows=np.ma.array([0, 3], mask=[0, 1])), "rows: .*masked"),  # before: row 3, masked out, was read
    (dict(rows=np.array([0.5, 2.7])), "rows: expected row indices"),  # before: dask's IndexError
    (dict(rows=np.array([9])), "rows: expected indices of the run's 4 rows"),  # before: dask's IndexError
], ids=["int tokens", "float tokens", "masked tokens", "masked rows", "float rows", "row past the run"])  # fmt: skip
def test_the_mean_probe_loss_refuses_a_selection_it_would_misread(four_rows, args, what):
    from tokdyn.reconstruct import mean_probe_loss, measured_mean_loss

    for mean in (mean_probe_loss, measured_mean_loss):
        with pytest.raises(InputError, match=what):
            mean(four_rows, **args)


def test_the_mean_probe_loss_of_rows_given_any_way_is_their_mean(four_rows):
    from tokdyn.reconstruct import mean_probe_loss, measured_mean_loss

    want = np.array([1.0, 3.0]) + 2.5  # rows 0 and 2: the mean of t + i + 1 over t = 0..5
    for rows in (np.array([0, 2], ">i4"), np.array([True, False, True, False]), [0, -2], np.array([0, 0, 2, 2])[::2]):
        np.testing.assert_array_equal(mean_probe_loss(four_rows, rows), want)
        np.testing.assert_array_equal(measured_mean_loss(four_rows, rows).loss, want)


def test_fit_sigmoids_of_tensors_with_grad_or_in_bfloat16_fits_their_values():
    """A tensor of a model's losses with grad was "RuntimeError: Can't call numpy() on Tensor that
    requires grad", and bfloat16 "unsupported ScalarType"; both are their values now, fitted as
    the same values in float64 are (bit for bit: the numpy backend is deterministic)."""
    from tokdyn.fit import fit_sigmoids

    rng = np.random.default_rng(0)
    x = np.linspace(0.0, 3.0, 16)
    mu = rng.uniform(0.5, 2.5, 5)
    Y = 3 - 2 / (1 + np.exp(-(x[None] - mu[:, None]) / 0.2)) + rng.normal(0, 0.05, (5, 16))
    for tensor, values in ((torch.tensor(Y, requires_grad=True), Y),
                           (torch.tensor(Y).bfloat16(), torch.tensor(Y).bfloat16().float().numpy())):  # fmt: skip
        got = fit_sigmoids(torch.tensor(x), tensor, backend="numpy")
        want = fit_sigmoids(x, values.astype(np.float64), backend="numpy")
        np.testing.assert_array_equal(got.mu, want.mu)
        np.testing.assert_array_equal(got.delta, want.delta)


def test_a_runs_readers_refuse_masked_indices(four_rows):
    """``run.losses_at(rows, tokens)`` read the rows and tokens under a mask (row 3, masked out,
    was read as asked for)."""
    with pytest.raises(InputError, match="rows: .*masked"):
        four_rows.losses_at(np.ma.array([0, 3], mask=[0, 1]), [0])
    with pytest.raises(InputError, match="tokens: .*masked"):
        four_rows.losses_at([0], np.ma.array([0, 5], mask=[1, 0]))
    np.testing.assert_array_equal(four_rows.losses_at(np.array([3, 0], ">i2"), torch.tensor([5, 0])), [[9.0, 4.0], [6.0, 1.0]])


def test_groups_domain_ids_and_a_loss_curve_with_masked_values_are_refused():
    """units_by_group took a masked or a 0.5 group code as a group; domain_probabilities drew a
    masked-out sample at its domain's rate; loss_power_law fitted the losses under a mask."""
    from tokdyn.curriculum import domain_probabilities
    from tokdyn.spectrum import loss_power_law, units_by_group

    ev = Events(np.arange(6), np.linspace(0.5, 2.5, 6), np.full(6, 0.1), np.ones(6), 6, (0.0, 3.0))
    for group in (np.ma.array([0, 0, 0, 1, 1, 1], mask=[0, 0, 0, 0, 0, 1]), np.array([0, 0, 0.5, 1, 1, 1])):
        with pytest.raises(InputError, match="group: expected an integer array"):
            units_by_group(ev, np.arange(6), group)
    with pytest.raises(InputError, match="domain ids must be one integer per sample.*masked"):
        domain_probabilities(np.ma.array([0, 1, 1], mask=[0, 0, 1]), [0.5, 0.5])
    np.testing.assert_array_equal(domain_probabilities(np.array([0, 1, 1], ">i4"), [0.5, 0.5]), [0.5, 0.25, 0.25])
    x = np.linspace(0.0, 3.0, 20)
    with pytest.raises(InputError, match="loss: .*7 masked"):
        loss_power_law(x, np.ma.array(3 * 10 ** (-0.3 * x), mask=x > 2))


def test_a_learnability_table_refuses_masked_token_ids_and_reads_any_layout():
    """predict and fit looked up the ids under a mask (a researcher's padding, masked out) as
    contexts; big-endian, Fortran-order and tensor ids are their values."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 8, (20, 5))
    targets = {"delta": rng.uniform(0, 1, 80), "mu": rng.uniform(0, 2, 80), "weight": np.ones(80)}
    table = LearnabilityTable.fit(tokens, targets, vocab_size=8)
    masked = np.ma.array(tokens[:3], mask=np.eye(3, 5, dtype=bool))
    with pytest.raises(InputError, match="tokens: .*3 masked"):
        table.predict(masked)
    with pytest.raises(InputError, match="pilot tokens: .*masked"):
        LearnabilityTable.fit(np.ma.array(tokens, mask=tokens == 3), targets, vocab_size=8)
    ref = table.predict(tokens[:3])
    for ids in (tokens[:3].astype(">i2"), np.asfortranarray(tokens[:3]), torch.tensor(tokens[:3])):
        got = table.predict(ids)
        assert all(np.array_equal(got[k], ref[k]) for k in ref)


def test_a_probe_refuses_masked_arrays_and_keeps_any_layouts_values():
    """ProbeSet took a masked per-token array's data (a domain code the researcher had masked out
    became the token's domain); a tensor or a big-endian array is its values, one fingerprint."""
    import tokdyn

    n = 6
    arrays = {"sample_id": np.arange(n), "token_pos": np.ones(n, np.int64)}
    with pytest.raises(InputError, match="probe array 'token_pos': .*1 masked"):
        tokdyn.ProbeSet(None, {**arrays, "token_pos": np.ma.array(np.ones(n, np.int64), mask=np.arange(n) == 4)})
    ref = tokdyn.ProbeSet(None, arrays).fingerprint
    for sid in (torch.arange(n), np.arange(n, dtype=">i8"), np.repeat(np.arange(n), 2)[::2]):
        assert tokdyn.ProbeSet(None, {**arrays, "sample_id": sid}).fingerprint == ref
    with pytest.raises(InputError, match="probe tokens: .*masked"):  # ids under a mask were windows' tokens
        tokdyn.ProbeSet(np.ma.array(np.ones((2, 4), np.int64), mask=np.eye(2, 4, dtype=bool)), arrays)


def test_a_sample_schedule_refuses_masked_windows():
    """SampleSchedule binned the ids under a mask as the samples' tokens."""
    from test_curriculum import HAND, V, _table
    from tokdyn.curriculum import CurriculumConfig, SampleSchedule

    windows = np.random.default_rng(2).integers(0, 5, size=(40, 6))
    tab, cfg = _table(HAND, mu_global=1.0, delta_global=0.5), CurriculumConfig(total_steps=1000, width=0.4)
    with pytest.raises(InputError, match="windows: .*2 masked"):
        SampleSchedule(tab, np.ma.array(windows, mask=np.eye(40, 6, dtype=bool) & (np.arange(40) < 2)[:, None]), cfg,
                       tokenizer=V)  # fmt: skip
    ref = SampleSchedule(tab, windows, cfg, tokenizer=V).probabilities(30)
    np.testing.assert_array_equal(SampleSchedule(tab, windows.astype(">i2").T.copy().T, cfg, tokenizer=V).probabilities(30), ref)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["<f8", ">f8", "<f4", ">f4", ">f2", "<f2"]), step=st.integers(1, 3),
       n=st.integers(1, 12))  # fmt: skip
def test_events_of_any_float_dtype_and_stride_are_those_of_their_float64_values(data, dtype, step, n):
    """Events' compiled sums (numba) read the values whatever their width, byte order and strides."""
    floats = st.floats(0.0625, 3.0, width=16)  # representable in every width drawn
    mu = data.draw(hnp.arrays(dtype, n * step, elements=floats))[::step]
    s = data.draw(hnp.arrays(dtype, n * step, elements=floats))[::step]
    token = data.draw(hnp.arrays(">i4", n, elements=st.integers(0, 4)))
    got = Events(token, mu, s, np.ones(n, ">f2"), 5, (0.0, 3.0))
    want = Events(token.astype(np.int64), mu.astype(np.float64), s.astype(np.float64), np.ones(n), 5, (0.0, 3.0))
    np.testing.assert_array_equal(got.curve(XS.astype(">f4")), want.curve(XS.astype(np.float32).astype(np.float64)))
    np.testing.assert_array_equal(got.derivative(XS[::2]), want.derivative(XS[::2].copy()))
