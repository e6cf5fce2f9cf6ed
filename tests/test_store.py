"""The trajectory store: schema, append/commit, resume, crash safety, xarray view, errors."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import zarr

import tokdyn
from reliability_fixtures import raw
from tokdyn.errors import (
    InputError,
    NotAStoreError,
    ProbeMismatchError,
    RunExistsError,
    RunNotFoundError,
    SchemaVersionError,
    StepOrderError,
    StoreError,
)


def make_probe(n_seq=6, context=8, seed=0) -> tokdyn.ProbeSet:
    rng = np.random.default_rng(seed)
    return tokdyn.ProbeSet.from_tokens(rng.integers(0, 257, size=(n_seq, context + 1)), tokenizer={"kind": "byte"})


def row_values(step: int, n: int) -> np.ndarray:
    """Deterministic row content, so a reader can check any committed row independently."""
    return (np.sin(np.arange(n) * 0.1 + step) + 2.0).astype(np.float32)


@pytest.fixture
def probe():
    return make_probe()


@pytest.fixture
def store(tmp_path, probe):
    return tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a")


def test_create_write_read_roundtrip(store, probe):
    run = store.create_run("r", capacity=2, attrs={"seed": 3, "n_params": 10})
    w = run.writer()
    steps = [0, 1, 2, 4, 8]
    for s in steps:
        w.append(row_values(s, probe.n_tokens), step=s, tokens_seen=s * 100, lr=0.1 * s)
    assert run.n_committed == 5
    assert run.capacity >= 5  # grew past the initial capacity of 2
    np.testing.assert_array_equal(run.steps, steps)
    np.testing.assert_array_equal(run.coord("tokens_seen"), [s * 100 for s in steps])
    np.testing.assert_allclose(run.coord("lr"), [0.1 * s for s in steps])
    np.testing.assert_array_equal(run.axis_values, np.array(steps, float))
    expected = np.stack([row_values(s, probe.n_tokens) for s in steps])
    np.testing.assert_array_equal(run.losses(), expected)
    np.testing.assert_array_equal(run.losses(tokens=slice(8, 16)), expected[:, 8:16])
    w.trim()
    assert run.capacity == 5
    # A fresh read-only handle sees the same.
    again = tokdyn.open_store(store.url, mode="r").run("r")
    np.testing.assert_array_equal(again.losses(), expected)
    assert again.attrs["seed"] == 3 and again.attrs["schema_version"] == tokdyn.store.SCHEMA_VERSION


def test_probe_roundtrip_and_fingerprint(store, probe):
    reopened = tokdyn.open_store(store.url, mode="r")
    p2 = reopened.probe
    assert p2.fingerprint == probe.fingerprint
    np.testing.assert_array_equal(p2.tokens, probe.tokens)
    for k, v in probe.token_arrays.items():
        np.testing.assert_array_equal(p2.token_arrays[k], v)
    assert tokdyn.open_store(store.url, mode="r").probe_fingerprint == probe.fingerprint


def test_probe_mismatch_refused(store):
    other = make_probe(seed=1)
    with pytest.raises(ProbeMismatchError, match="fingerprint"):
        tokdyn.open_store(store.url, other, mode="a")


def test_float16_storage(store, probe):
    run = store.create_run("h", dtype="float16")
    run.writer().append(row_values(0, probe.n_tokens), step=0)
    out = run.losses()
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out[0], row_values(0, probe.n_tokens).astype(np.float16))


def test_step_order_and_no_overwrite(store, probe):
    run = store.create_run("r")
    w = run.writer()
    w.append(row_values(5, probe.n_tokens), step=5)
    for bad in (5, 3):
        with pytest.raises(StepOrderError, match="not after the last committed step 5"):
            w.append(row_values(bad, probe.n_tokens), step=bad)
    assert run.n_committed == 1
    np.testing.assert_array_equal(run.losses()[0], row_values(5, probe.n_tokens))


def test_resume_requires_flag_and_continues(store, probe):
    run = store.create_run("r")
    w = run.writer()
    for s in (0, 1, 2):
        w.append(row_values(s, probe.n_tokens), step=s)
    with pytest.raises(RunExistsError, match="resume=True"):
        run.writer()
    w2 = run.writer(resume=True)
    assert w2.rows == 3 and w2.last_step == 2
    assert not w2.accepts(2) and w2.accepts(3)
    w2.append(row_values(4, probe.n_tokens), step=4)
    np.testing.assert_array_equal(run.steps, [0, 1, 2, 4])
    with pytest.raises(RunExistsError):
        store.create_run("r")


def test_nonfinite_stored_as_nan_and_counted(store, probe):
    run = store.create_run("r")
    v = row_values(0, probe.n_tokens)
    v[[1, 5]] = [np.inf, np.nan]
    with pytest.warns(RuntimeWarning, match="2 non-finite"):
        run.writer().append(v, step=0)
    got = run.losses()[0]
    assert np.isnan(got[[1, 5]]).all() and np.isfinite(np.delete(got, [1, 5])).all()
    assert run.nonfinite() == (2, {0: 2})
    assert run.info()["nonfinite_losses"] == 2


def test_uncommitted_tail_is_invisible_and_overwritten(store, probe):
    """Data written past the commit (a process killed between write and commit) is not seen,
    and a resumed writer overwrites it."""
    run = store.create_run("r", capacity=4)
    w = run.writer()
    w.append(row_values(0, probe.n_tokens), step=0)
    raw(store, "runs/r/loss")[1, :] = 99.0  # a row in flight, never committed
    raw(store, "runs/r/step")[1] = 7
    assert run.n_committed == 1
    np.testing.assert_array_equal(run.steps, [0])
    w2 = run.writer(resume=True)
    w2.append(row_values(3, probe.n_tokens), step=3)
    np.testing.assert_array_equal(run.losses()[1], row_values(3, probe.n_tokens))
    np.testing.assert_array_equal(run.steps, [0, 3])


def test_multiple_writers_commit_min(store, probe):
    c = probe.context
    run = store.create_run("d", capacity=3, token_chunk=2 * c, writers=[(0, 2 * c), (2 * c, probe.n_tokens)])
    w0, w1 = run.writer(writer=0), run.writer(writer=1)
    full = row_values(0, probe.n_tokens)
    w0.append(full[: 2 * c], step=0)
    assert run.n_committed == 0  # only one token range written
    w1.append(full[2 * c :], step=0)
    assert run.n_committed == 1
    np.testing.assert_array_equal(run.losses()[0], full)
    with pytest.raises(InputError, match="tile"):
        store.create_run("bad", token_chunk=2 * c, writers=[(0, 2 * c), (3 * c, probe.n_tokens)])
    with pytest.raises(InputError, match="chunk boundary"):
        store.create_run("bad2", token_chunk=2 * c, writers=[(0, c), (c, probe.n_tokens)])


def test_xarray_view(store, probe):
    xr = pytest.importorskip("xarray")
    run = store.create_run("r", capacity=10)
    w = run.writer()
    for s in (0, 1, 3):
        w.append(row_values(s, probe.n_tokens), step=s)
    ds = run.to_xarray()
    assert ds["loss"].dims == ("checkpoint", "token")
    np.testing.assert_array_equal(ds["step"].values, [0, 1, 3])
    w.trim()  # after trimming, plain xarray.open_zarr sees exactly the committed rows
    ds2 = xr.open_zarr(store.url, group="runs/r", consolidated=False)
    assert ds2["loss"].shape == (3, probe.n_tokens)
    assert "step" in ds2["loss"].coords
    np.testing.assert_array_equal(ds2["loss"].values, run.losses())


def test_dask_view_chunks(store, probe):
    run = store.create_run("r")
    w = run.writer()
    for s in range(4):
        w.append(row_values(s, probe.n_tokens), step=s)
    arr = run.to_dask(token_block=16)
    assert arr.chunks[0] == (4,) and set(arr.chunks[1][:-1]) == {16}
    np.testing.assert_array_equal(arr.compute(), run.losses())


def test_not_a_store_and_schema_version(tmp_path, probe):
    with pytest.raises(NotAStoreError, match="no tokdyn store"):
        tokdyn.open_store(tmp_path / "missing.zarr", mode="r")
    g = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w")
    g.attrs["x"] = 1
    with pytest.raises(NotAStoreError, match="not a tokdyn store"):
        tokdyn.open_store(tmp_path / "plain.zarr", mode="r")
    with pytest.raises(NotAStoreError):  # and "a" does not clobber a foreign zarr group
        tokdyn.open_store(tmp_path / "plain.zarr", probe, mode="a")
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a")
    meta = dict(raw(st).attrs["tokdyn"])
    meta["schema_version"] = 99
    raw(st).attrs["tokdyn"] = meta
    with pytest.raises(SchemaVersionError, match="version 99"):
        tokdyn.open_store(tmp_path / "s.zarr", mode="r")


def test_run_errors(store):
    with pytest.raises(RunNotFoundError, match="no run 'nope'"):
        store.run("nope")
    with pytest.raises(InputError, match="run name"):
        store.create_run("a/b")
    with pytest.raises(InputError, match="axis"):
        store.create_run("x", axis="Q")
    with pytest.raises(InputError, match="dtype"):
        store.create_run("x", dtype="int8")
    with pytest.raises(InputError, match="JSON"):
        store.create_run("x", attrs={"f": object()})
    ro = tokdyn.open_store(store.url, mode="r")
    with pytest.raises(StoreError, match="read-only"):
        ro.create_run("y")


def test_writer_validates_rows(store, probe):
    w = store.create_run("r").writer()
    with pytest.raises(InputError, match="shape"):
        w.append(np.zeros(3), step=0)
    with pytest.raises(InputError, match="numbers"):
        w.append(np.array(["a"] * probe.n_tokens), step=0)
    with pytest.raises(StepOrderError):
        w.append(np.zeros(probe.n_tokens), step=-1)


def test_memory_url_store(probe):
    pytest.importorskip("fsspec")
    url = f"memory://tokdyn-test-{os.getpid()}-{time.time_ns()}"
    st = tokdyn.open_store(url, probe, mode="a")
    st.create_run("r").writer().append(row_values(0, probe.n_tokens), step=0)
    again = tokdyn.open_store(url, mode="r")
    np.testing.assert_array_equal(again.run("r").losses()[0], row_values(0, probe.n_tokens))
    assert again.info()["runs"]["r"]["shape"] == [1, probe.n_tokens]


def test_info_is_json(store, probe):
    store.create_run("r").writer().append(row_values(0, probe.n_tokens), step=0)
    info = store.info()
    json.dumps(info)
    assert info["probe"]["fingerprint"] == probe.fingerprint
    assert info["runs"]["r"]["steps"] == [0]
    assert info["size_bytes"] > 0


_KILL_CHILD = textwrap.dedent(
    """
    import sys, numpy as np, tokdyn
    sys.path.insert(0, {tests!r})
    from test_store import make_probe, row_values
    probe = make_probe(n_seq=64, context=64)
    st = tokdyn.open_store({url!r}, probe, mode="a")
    run = st.run("k") if "k" in st.runs else st.create_run("k", capacity=1, token_chunk=512)
    w = run.writer(resume=True)
    for s in range(1, 100000):
        if w.accepts(s):
            w.append(row_values(s, probe.n_tokens), step=s)
            print(s, flush=True)
    """
)


def test_sigkill_during_appends_loses_nothing_committed(tmp_path):
    """Kill an appending process at random instants, restart it with resume, and check that
    every committed row is complete and correct and that steps continue without gaps."""
    url = str(tmp_path / "k.zarr")
    code = _KILL_CHILD.format(tests=os.path.dirname(__file__), url=url)
    rng = np.random.default_rng(0)
    probe = make_probe(n_seq=64, context=64)
    last = 0
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Wait until it is appending, then kill it at a random instant.
        first = proc.stdout.readline()
        assert first, proc.stderr.read().decode()
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        run = tokdyn.open_store(url, mode="r").run("k")
        k = run.n_committed
        assert k >= last  # nothing committed is ever lost
        np.testing.assert_array_equal(run.steps, np.arange(1, k + 1))
        got = run.losses()
        expected = np.stack([row_values(s, probe.n_tokens) for s in range(1, k + 1)])
        np.testing.assert_array_equal(got, expected)
        last = k
    assert last > 6


def test_coordinates_survive_growth_trim_and_resume(store, probe):
    """Per-checkpoint values are rewritten a chunk at a time from the writer's memory: check them
    across capacity growth, a trim, a resumed writer, and a chunk boundary."""
    from tokdyn.store.schema import COORD_CHUNK

    run = store.create_run("c", capacity=3)
    w = run.writer()
    steps = list(range(COORD_CHUNK + 5))
    for s in steps[:10]:
        w.append(row_values(s, probe.n_tokens), step=s, lr=s / 10)
    w.trim()
    w2 = run.writer(resume=True)
    for s in steps[10:]:
        w2.append(row_values(s, probe.n_tokens), step=s, lr=s / 10)
    np.testing.assert_array_equal(run.steps, steps)
    np.testing.assert_allclose(run.coord("lr"), [s / 10 for s in steps])
    assert run.losses().shape == (len(steps), probe.n_tokens)


def test_multi_writer_run_keeps_capacity_and_resumes(store, probe):
    c = probe.context
    ranges = [(0, 2 * c), (2 * c, probe.n_tokens)]
    run = store.create_run("ddp", capacity=4, token_chunk=2 * c, writers=ranges)
    full = [row_values(s, probe.n_tokens) for s in range(4)]
    for j, (a, b) in enumerate(ranges):
        w = run.writer(writer=j)
        for s in (0, 1):
            w.append(full[s][a:b], step=s)
        w.trim()  # what a normal close does: must not shrink a multi-writer run
    assert run.capacity == 4
    for j, (a, b) in enumerate(ranges):  # the next job resumes and records the rest
        w = run.writer(writer=j, resume=True)
        for s in (2, 3):
            w.append(full[s][a:b], step=s)
    np.testing.assert_array_equal(run.losses(), np.stack(full))


def test_reader_opened_before_growth_sees_every_row(store, probe):
    run = store.create_run("g", capacity=1)
    reader = tokdyn.open_store(store.url, mode="r").run("g")
    w = run.writer()
    for s in range(3):
        w.append(row_values(s, probe.n_tokens), step=s)
    assert reader.losses().shape == (3, probe.n_tokens)
    assert reader.to_dask().shape == (3, probe.n_tokens)


def test_big_endian_probe_arrays_round_trip(tmp_path):
    n = 12
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=">i4"), "token_pos": np.ones(n, dtype=">i8")})
    tokdyn.open_store(tmp_path / "be.zarr", probe, mode="a")
    again = tokdyn.open_store(tmp_path / "be.zarr", probe, mode="r")
    assert again.probe.fingerprint == probe.fingerprint


def test_failed_store_creation_leaves_nothing_behind(tmp_path):
    bad = tokdyn.ProbeSet(None, {"sample_id": np.arange(3), "token_pos": np.ones(3), "tokens": np.ones(3)})
    with pytest.raises(InputError, match="not allowed"):
        tokdyn.open_store(tmp_path / "x.zarr", bad, mode="a")
    tokdyn.open_store(tmp_path / "x.zarr", make_probe(), mode="a")  # the path is free again


def test_to_xarray_after_a_crash_between_resizes(store, probe):
    run = store.create_run("x", capacity=2)
    w = run.writer()
    for s in range(2):
        w.append(row_values(s, probe.n_tokens), step=s)
    for name in ("step", "lr"):
        raw(store, f"runs/x/{name}").resize((8,))  # a process killed after growing some coordinates only
    ds = run.to_xarray()
    assert ds["loss"].shape == (2, probe.n_tokens)
    np.testing.assert_array_equal(ds["step"].values, [0, 1])


def test_rows_appended_together_equal_rows_appended_one_by_one(tmp_path, probe):
    """append_rows (one commit for several rows) stores exactly what append stores row by row,
    checksums included, across a coordinate chunk boundary and the arrays' growth."""
    n, steps = probe.n_tokens, [3 * s + 1 for s in range(300)]  # 300 rows: past COORD_CHUNK (256)
    M = np.stack([row_values(s, n) for s in steps])
    M[7, 2] = np.inf  # a non-finite loss: stored as NaN and counted on its row
    meta = [{"step": s, "lr": s / 1000, "tokens_seen": 10 * s, "wall_time": 1e9 + s} for s in steps]
    one = tokdyn.open_store(tmp_path / "one.zarr", probe, mode="w").create_run("r", capacity=4)
    w = one.writer()
    for row, m in zip(M, meta):
        with pytest.warns(RuntimeWarning) if np.isinf(row).any() else contextlib.nullcontext():
            w.append(row, **m)
    many = tokdyn.open_store(tmp_path / "many.zarr", probe, mode="w").create_run("r", capacity=4)
    w = many.writer()
    bounds = [0, 1, 5, 60, 250, 262, 300]  # blocks of 1, 4, 55, 190 (across row 256), 12, 38 rows
    for a, b in zip(bounds[:-1], bounds[1:]):
        with pytest.warns(RuntimeWarning) if a <= 7 < b else contextlib.nullcontext():
            assert w.append_rows(M[a:b], meta[a:b]) == range(a, b)
    assert w.rows == 300 and w.last_step == steps[-1]
    for run in (one, many):
        run = tokdyn.open_store(run.store.url, mode="r").run("r")  # a fresh reader checks every checksum
        np.testing.assert_array_equal(run.losses(), np.where(np.isfinite(M), M, np.nan))
        for name in ("step", "lr", "tokens_seen", "wall_time"):
            np.testing.assert_array_equal(run.coord(name), [m[name] for m in meta])
        assert run.nonfinite() == (1, {7: 1})
        run.to_xarray()
        assert set(run._commit(0).crc) == set(run._commit(0).coord_crc) == {str(r) for r in range(300)}


def test_append_rows_refuses_a_bad_block_before_writing_anything(store, probe):
    run = store.create_run("r", capacity=4)
    w = run.writer()
    w.append(row_values(0, probe.n_tokens), step=5)
    M = np.stack([row_values(s, probe.n_tokens) for s in (1, 2)])
    with pytest.raises(StepOrderError):
        w.append_rows(M, [{"step": 6}, {"step": 6}])  # not increasing inside the block
    with pytest.raises(StepOrderError):
        w.append_rows(M, [{"step": 4}, {"step": 7}])  # the first is not after the committed step
    with pytest.raises(InputError):
        w.append_rows(M[:1], [{"step": 6}, {"step": 7}])  # one row of losses for two rows
    with pytest.raises(InputError):
        w.append_rows(M, [{"step": 6}, {"step": 7, "axis_value": float("nan")}])
    assert w.append_rows(M[:0], []) == range(1, 1)
    assert run.n_committed == 1 and run.steps.tolist() == [5]
    assert w.append_rows(M, [{"step": 6}, {"step": 7}]) == range(1, 3)
    assert run.steps.tolist() == [5, 6, 7]


def test_a_discarded_store_leaves_a_folder_that_was_there_before(tmp_path, monkeypatch):
    """A command that fails half-way discards the store it made, but not the (empty) folder it
    was given: the user made it, or mounted something there. A new path goes entirely."""
    import os

    from tokdyn.store import store as store_mod

    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(4, dtype=np.int32), "token_pos": np.ones(4, np.int32)})
    given = tmp_path / "given"
    given.mkdir(mode=0o750)
    st = tokdyn.open_store(given, probe, mode="w")
    assert st.discard_if_new()
    assert given.is_dir() and not any(given.iterdir()) and (given.stat().st_mode & 0o777) == 0o750
    new = tmp_path / "new"
    st = tokdyn.open_store(new, probe, mode="w")
    assert st.discard_if_new() and not new.exists()

    def broken(group, probe):
        raise OSError("disk full")

    monkeypatch.setattr(store_mod, "write_probe", broken)
    with pytest.raises(OSError, match="disk full"):
        tokdyn.TrajectoryStore.create(given, probe)
    assert given.is_dir() and not any(given.iterdir())
    assert os.access(given, os.W_OK)
