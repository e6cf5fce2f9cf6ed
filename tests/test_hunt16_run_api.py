"""Hunt 16: the run read API (losses, losses_at, coord, to_dask, to_xarray, fit.read) with the
arguments researchers and hostile clients pass, each answer compared with numpy indexing the
full ``losses()`` array."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn.errors import InputError
from tokdyn.store.run import Run

K, N, TC = 6, 20, 5  # rows, tokens, token chunk


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{kind: (run, expected full matrix)}: one writer, float16, two writers (one a row ahead),
    a D axis, and a run made before position checksums (no integrity)."""
    url = str(tmp_path_factory.mktemp("h16") / "s.zarr")
    s = tokdyn.open_store(url, tokdyn.ProbeSet.from_tokens(np.zeros((4, 6), int)), mode="a")
    full = np.arange(K * N, dtype=np.float32).reshape(K, N) / 8
    full[2, 7] = np.nan
    out = {}
    for name, dtype in (("f32", "float32"), ("f16", "float16"), ("legacy", "float32")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with s.create_run(name, dtype=dtype, token_chunk=TC).writer() as w:
                for j in range(K):
                    w.append(full[j], step=j + 1)
        out[name] = full.astype(dtype)
    g = zarr.open_group(f"{url}/runs/legacy", mode="r+")
    meta = dict(g.attrs["tokdyn_run"])
    meta.pop("integrity")
    g.update_attributes({"tokdyn_run": meta})
    mw = s.create_run("mw", axis="D", token_chunk=TC, writers=[(0, 10), (10, N)])
    w0, w1 = mw.writer(writer=0), mw.writer(writer=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for j in range(K):
            w0.append(full[j, :10], step=j + 1, axis_value=10.0**j)
            if j < K - 1:
                w1.append(full[j, 10:], step=j + 1, axis_value=10.0**j)
    out["mw"] = full[: K - 1]
    reader = tokdyn.open_store(url, mode="r")
    return {name: (reader.run(name), want) for name, want in out.items()}


KINDS = ["f32", "f16", "legacy", "mw"]


def _index(draw, n):
    """An index argument numpy takes: integers of any dtype (any order, repeats) or a mask."""
    if draw(st.booleans()):
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return draw(st.sampled_from([np.array(mask, bool), mask]))
    idx = draw(st.lists(st.integers(0, n - 1), max_size=8))
    kind = draw(st.sampled_from(["list", "int8", "uint8", "int32", "uint64", "int64", "range"]))
    if kind == "list":
        return idx
    if kind == "range":
        return range(0, n, draw(st.integers(1, 4)))
    return np.array(idx, dtype=kind)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_losses_at_is_numpys_fancy_indexing_of_losses(runs, data):
    """Unsorted, repeated, any integer dtype, or a boolean mask: numpy's answer (a mask used to
    be read as indices 0 and 1)."""
    run, full = runs[data.draw(st.sampled_from(KINDS))]
    rows, tokens = _index(data.draw, full.shape[0]), _index(data.draw, N)
    want = full[np.ix_(_numpy(rows), _numpy(tokens))]
    got = run.losses_at(rows, tokens)
    assert got.dtype == full.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run.losses()[np.ix_(_numpy(rows), _numpy(tokens))], want)


def _numpy(idx) -> np.ndarray:
    """The index as numpy takes it (an empty list is a float array to numpy)."""
    a = np.asarray(idx)
    return a if a.dtype == bool else a.astype(np.int64)


def _slices(n):
    return st.builds(slice, st.none() | st.integers(-n - 2, n + 2), st.none() | st.integers(-n - 2, n + 2),
                     st.none() | st.integers(-4, 4).filter(bool))  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_losses_and_dask_and_xarray_are_numpys_slicing(runs, data):
    run, full = runs[data.draw(st.sampled_from(KINDS))]
    rows, tokens = data.draw(_slices(full.shape[0])), data.draw(_slices(N))
    np.testing.assert_array_equal(run.losses(rows=rows, tokens=tokens), full[rows][:, tokens])
    # dask's own slicing (not tokdyn's) differs from numpy for a negative step from before the
    # start: da.arange(6)[-7::-1] is all six (dask 2026.8), numpy's is empty; so steps > 0 here
    rows, tokens = (slice(r.start, r.stop, abs(r.step or 1)) for r in (rows, tokens))
    block = data.draw(st.integers(1, N + 3))
    np.testing.assert_array_equal(run.to_dask(token_block=block)[rows, tokens].compute(), full[rows][:, tokens])


@pytest.mark.parametrize("kind", KINDS)
def test_to_xarray_is_lazy_with_the_committed_coordinates(runs, kind):
    run, full = runs[kind]
    ds = run.to_xarray()
    assert ds.loss.dims == ("checkpoint", "token") and ds.loss.shape == full.shape
    assert type(ds.loss.data).__module__.startswith("dask")  # not read yet
    np.testing.assert_array_equal(ds.step.values, np.arange(1, full.shape[0] + 1))
    np.testing.assert_array_equal(ds.loss.isel(checkpoint=[2, 0, 0], token=[19, 3, 3]).values, full[[2, 0, 0]][:, [19, 3, 3]])
    assert ds.attrs["n_committed"] == full.shape[0] and ds.loss.dtype == full.dtype


BAD_INDICES = {
    "float 1.5 (was read as 1)": [1.5],
    "float 1.0": np.array([1.0]),
    "string": ["1"],
    "None": None,
    "python int": 3,
    "numpy scalar": np.int64(3),
    "2-d": np.array([[1, 2], [3, 4]]),
    "ragged": [[1], [2, 3]],
    "mask of another length": np.ones(5, bool),
    "python bools of another length (were indices 1, 0)": [True, False],
    "negative": [-1],
    "negative int8": np.array([3, -1], np.int8),
    "out of range": [N],
    "uint64 past 2**63": np.array([2**63 + 1], np.uint64),
}


@pytest.mark.parametrize("bad", BAD_INDICES.values(), ids=BAD_INDICES.keys())
@pytest.mark.parametrize("axis", ["rows", "tokens"])
def test_losses_at_refuses_what_is_no_index_with_one_input_error(runs, bad, axis):
    run, _ = runs["f32"]
    args = {"rows": [0, 1], "tokens": [0, 1], axis: bad}
    with pytest.raises(InputError) as e:
        run.losses_at(**args)
    assert axis in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [slice(0, 2.0), slice(0.5, None), slice("a", 3), slice(None, None, 0)])
@pytest.mark.parametrize("axis", ["rows", "tokens"])
def test_losses_refuses_a_slice_of_non_integers_with_one_input_error(runs, bad, axis):
    with pytest.raises(InputError, match=axis):
        runs["f32"][0].losses(**{axis: bad})


def test_losses_takes_numpy_integers_and_bools_in_slices(runs):
    run, full = runs["f32"]
    np.testing.assert_array_equal(run.losses(rows=slice(np.uint64(1), np.int8(4)), tokens=slice(True, None, np.int64(3))),
                                  full[1:4, 1::3])  # fmt: skip


@pytest.mark.parametrize("bad", [["step"], None, b"step", 0])
def test_coord_names_anything_else_with_one_input_error(runs, bad):
    with pytest.raises(InputError, match="unknown coordinate"):
        runs["f32"][0].coord(bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", 2.0])
def test_to_dask_refuses_a_token_block_that_is_no_count(runs, bad):
    """token_block=0 used to give the default blocks silently, True blocks of 1, "3" blocks of 3."""
    with pytest.raises(InputError, match="token_block"):
        runs["f32"][0].to_dask(token_block=bad)


def test_to_xarray_holds_one_row_count_while_a_writer_commits(tmp_path, monkeypatch):
    """A row committed between reading the coordinates and the losses: the Dataset holds the
    rows counted first, everywhere (the loss array was read with the new count)."""
    s = tokdyn.open_store(tmp_path / "s.zarr", tokdyn.ProbeSet.from_tokens(np.zeros((2, 6), int)), mode="a")
    w = s.create_run("r", token_chunk=5, capacity=8).writer()
    for j in range(2):
        w.append(np.full(10, j, np.float32), step=j + 1)
    reader = tokdyn.open_store(s.url, mode="r").run("r")
    counted = Run.n_committed.fget

    def committing(self):
        k = counted(self)
        w.append(np.full(10, k, np.float32), step=k + 1)  # the live writer, between two reads
        return k

    monkeypatch.setattr(Run, "n_committed", property(committing))
    ds = reader.to_xarray()
    monkeypatch.undo()
    assert ds.loss.shape[0] == ds.step.size == ds.attrs["n_committed"]
    np.testing.assert_array_equal(ds.loss.values, reader.losses()[: ds.step.size])


def test_a_reader_sees_only_whole_committed_rows_while_a_writer_appends(tmp_path):
    n = 30
    s = tokdyn.open_store(tmp_path / "s.zarr", tokdyn.ProbeSet.from_tokens(np.zeros((5, 7), int)), mode="a")
    run = s.create_run("r", token_chunk=6, capacity=2)  # grows while read
    w = run.writer()
    w.append(np.zeros(n, np.float32), step=1)
    stop = threading.Event()

    def write():
        for j in range(1, 25):
            w.append(np.full(n, j, np.float32), step=j + 1)
        stop.set()

    t = threading.Thread(target=write)
    reader = tokdyn.open_store(s.url, mode="r").run("r")
    t.start()
    try:
        while not stop.is_set():
            got = reader.losses()
            np.testing.assert_array_equal(got, np.repeat(np.arange(got.shape[0], dtype=np.float32)[:, None], n, 1))
            at = reader.losses_at(np.arange(got.shape[0])[::-1], [29, 0, 13])
            np.testing.assert_array_equal(at[::-1, 0], np.arange(got.shape[0]))
            ds = reader.to_xarray()
            np.testing.assert_array_equal(ds.step.values, np.arange(1, ds.step.size + 1))
            np.testing.assert_array_equal(ds.loss.values[:, 5], np.arange(ds.step.size))
    finally:
        t.join()
    assert reader.n_committed == 25


def test_empty_and_one_row_runs(tmp_path):
    s = tokdyn.open_store(tmp_path / "s.zarr", tokdyn.ProbeSet.from_tokens(np.zeros((4, 6), int)), mode="a")
    e = s.create_run("e", token_chunk=5)
    assert e.losses().shape == (0, N) and e.losses(rows=slice(None, None, -1)).shape == (0, N)
    assert e.losses_at([], [1, 2]).shape == (0, 2) and e.losses_at(np.zeros(0, bool), [3]).shape == (0, 1)
    with pytest.raises(InputError):
        e.losses_at([0], [1])
    assert e.steps.size == 0 and e.to_xarray().loss.shape == (0, N)
    one = s.create_run("one", token_chunk=10, dtype="float16")
    row = (np.arange(N, dtype=np.float32) / 7).astype(np.float16)
    one.writer().append(row, step=0)
    np.testing.assert_array_equal(one.losses(rows=slice(-1, None)), row[None])
    np.testing.assert_array_equal(one.losses_at([True], [19, 0, 0]), row[None, [19, 0, 0]])


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    s = tokdyn.open_store(tmp_path_factory.mktemp("fit") / "s.zarr", tokdyn.ProbeSet.from_tokens(np.zeros((4, 6), int)), mode="a")
    r = s.create_run("r", token_chunk=TC)
    with r.writer() as w:
        for j in range(3):
            w.append(np.arange(N, dtype=np.float32), step=j + 1)
    fields = {"mu": "float64", "status": "int8"}
    with r.fit.writer({"rows": [0, 1, 2], "n_committed": 3, "block_tokens": TC}, fields, n_blocks=N // TC) as fw:
        for b in range(N // TC):
            fw.results.write_block(b, b * TC, {"mu": np.arange(b * TC, (b + 1) * TC) * 1.0, "status": np.full(TC, b, np.int8)},
                                   fit_id=fw.fit_id)  # fmt: skip
        fw.finish()
    return tokdyn.open_store(s.url, mode="r").run("r")


def test_fit_read_field_lists(fitted):
    mu = np.arange(N) * 1.0
    assert list(fitted.fit.read(["mu", "mu"])) == ["mu"]
    assert fitted.fit.read([]) == {}
    np.testing.assert_array_equal(fitted.fit.read(("mu",))["mu"], mu)
    np.testing.assert_array_equal(fitted.fit.read_tokens(np.int64(3), np.uint64(12), ["mu"])["mu"], mu[3:12])
    np.testing.assert_array_equal(fitted.fit.read_tokens(4, 11)["status"], np.arange(4, 11) // TC)
    assert fitted.fit.read_tokens(7, 7, ["mu"])["mu"].size == 0


@pytest.mark.parametrize("fields", ["mu", 3, [None], [["mu"]], ["nope"]])
def test_fit_read_refuses_what_is_no_field_list(fitted, fields):
    """A string was read as its letters ("unknown fit fields ['m', 'u']"), an int was a TypeError."""
    with pytest.raises(InputError, match="field"):
        fitted.fit.read(fields)


@pytest.mark.parametrize("start, stop", [(1.5, 4.9), (True, 3), (None, 3), ("3", 5), (0, 5.0), (-3, 3), (19, 21)])
def test_fit_read_tokens_refuses_what_is_no_token_range(fitted, start, stop):
    """1.5 was cut to 1 (tokens 1..3 for "1.5 to 4.9"), "3" read as 3, None a TypeError."""
    with pytest.raises(InputError, match="tokens"):
        fitted.fit.read_tokens(start, stop, ["mu"])
