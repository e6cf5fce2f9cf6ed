"""Property-based tests (hypothesis) of the store's append and read paths."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn.errors import StepOrderError

CONTEXT = 4


@st.composite
def scenarios(draw):
    n_seq = draw(st.integers(1, 6))
    n = n_seq * CONTEXT
    chunk = CONTEXT * draw(st.integers(1, n_seq))
    capacity = draw(st.integers(1, 5))
    dtype = draw(st.sampled_from(["float32", "float16", "float64"]))
    ops = draw(st.lists(st.tuples(
        st.sampled_from(["append", "append", "append", "reopen", "trim"]),
        st.integers(0, 30),  # step
        st.lists(st.sampled_from([0.0, 1.5, 2.25, np.nan, np.inf, -np.inf, 7.0]), min_size=n, max_size=n),
    ), max_size=12))  # fmt: skip
    return n_seq, chunk, capacity, dtype, ops


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenarios())
def test_reader_sees_exactly_the_accepted_rows(tmp_path_factory, scenario):
    n_seq, chunk, capacity, dtype, ops = scenario
    probe = tokdyn.ProbeSet.from_tokens(np.arange(n_seq * (CONTEXT + 1)).reshape(n_seq, CONTEXT + 1) % 257)
    store = tokdyn.open_store(tmp_path_factory.mktemp("p") / "s.zarr", probe, mode="a")
    run = store.create_run("r", capacity=capacity, dtype=dtype, token_chunk=chunk)
    writer = run.writer()
    expected_rows, expected_steps, last = [], [], None
    for op, step, values in ops:
        if op == "reopen":
            writer = tokdyn.open_store(store.url, mode="r+").run("r").writer(resume=True)
            continue
        if op == "trim":
            writer.trim()
            continue
        row = np.array(values, dtype=np.float64)
        if last is not None and step <= last:
            try:
                writer.append(row, step=step, warn_nonfinite=False)
            except StepOrderError:
                continue
            raise AssertionError("a step not after the last committed one was accepted")
        writer.append(row, step=step, warn_nonfinite=False)
        expected_rows.append(np.where(np.isfinite(row), row, np.nan).astype(dtype))
        expected_steps.append(step)
        last = step
    reader = tokdyn.open_store(store.url, mode="r").run("r")
    assert reader.n_committed == len(expected_rows)
    np.testing.assert_array_equal(reader.steps, expected_steps)
    got = reader.losses()
    assert got.dtype == np.dtype(dtype) and got.shape == (len(expected_rows), n_seq * CONTEXT)
    if expected_rows:
        np.testing.assert_array_equal(got, np.stack(expected_rows))  # NaN where not finite
    total, _ = reader.nonfinite()
    assert total == sum(int(np.isnan(r).sum()) for r in expected_rows)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["float16", "float32", "float64"]), rows=st.integers(0, 5),
       cols=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))
def test_nan_per_row_counts_every_nan_bit_pattern(dtype, rows, cols, seed):
    """The read check's NaN count (float16 by its bits) is numpy's isnan count, for any bit
    pattern: every NaN payload and sign, infinities, zeros, subnormals."""
    from tokdyn.store.run import nan_per_row

    rng = np.random.default_rng(seed)
    uint = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}[dtype]
    bits = rng.integers(0, np.iinfo(uint).max, (rows, cols), dtype=uint, endpoint=True)
    exponent = {"float16": 0x7C00, "float32": 0x7F800000, "float64": 0x7FF0000000000000}[dtype]
    bits[rng.random((rows, cols)) < 0.3] |= uint(exponent)  # NaN of random payloads
    sign = uint(1) << uint(8 * np.dtype(dtype).itemsize - 1)
    for value in (exponent, exponent | sign, 0, sign, 1):  # +-inf, +-0, the least subnormal
        bits[rng.random((rows, cols)) < 0.1] = uint(value)
    block = bits.view(dtype)
    want = np.isnan(block).sum(axis=1)
    np.testing.assert_array_equal(nan_per_row(block), want)
    np.testing.assert_array_equal(nan_per_row(block[:, ::2]), np.isnan(block[:, ::2]).sum(axis=1))
