"""The compiled fit's chunks on threads (tokdyn.fit.numba_kernels.run_chunks)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

numba = pytest.importorskip("numba")

from tokdyn.fit import numba_kernels  # noqa: E402
from tokdyn.fit.numba_kernels import run_chunks  # noqa: E402


@numba.njit(nogil=True)
def _count_rows(seen, first, last):
    for b in range(first, last):
        seen[b] += 1


class _Threads:
    """numba.set_num_threads for one block, restored after."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self):
        self.saved = numba.get_num_threads()
        numba.set_num_threads(min(self.n, numba.config.NUMBA_NUM_THREADS))

    def __exit__(self, *exc):
        numba.set_num_threads(self.saved)


@settings(max_examples=60, deadline=None)
@given(n_rows=hs.integers(0, 300), threads=hs.integers(1, 4))
def test_every_row_is_in_one_chunk_once(n_rows, threads):
    seen = np.zeros(n_rows, dtype=np.int64)
    with _Threads(threads):
        run_chunks(_count_rows, n_rows, seen)
    assert (seen == 1).all()


def test_chunks_are_consecutive_and_run_on_the_threads_asked_for():
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one thread")
    calls, idents, zero = [], set(), []
    other = threading.Event()

    def work(out, first, last):  # plain Python: records who ran which rows
        me = threading.get_ident()
        calls.append((first, last))
        idents.add(me)
        if first == 0:  # the first chunk waits until another thread runs one
            zero.append(me)
            other.wait(10)
        elif zero and me != zero[0]:
            other.set()
        out[first:last] = first

    out = np.full(1000, -1)
    with _Threads(2):
        run_chunks(work, 1000, out)
        n_chunks = numba_kernels.CHUNKS_PER_THREAD * 2
    bounds = sorted(calls)
    assert len(bounds) == n_chunks
    assert bounds[0][0] == 0 and bounds[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert len(idents) == 2 and threading.get_ident() in idents  # the caller works too
    for first, last in bounds:
        assert (out[first:last] == first).all()


def test_an_error_in_a_chunk_reaches_the_caller_and_stops_the_rest():
    done = []

    def work(first, last):
        if first == 0:
            raise ValueError("chunk 0")
        time.sleep(0.02)
        done.append(first)

    for threads in (1, 2):
        done.clear()
        with _Threads(threads), pytest.raises(ValueError, match="chunk 0"):
            run_chunks(work, 64)
        # chunk 0 is the first one taken; after it fails no thread takes another (the
        # others finish the one they hold)
        assert len(done) <= threads


def _fork_child(queue):
    seen = np.zeros(100, dtype=np.int64)
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    run_chunks(_count_rows, 100, seen)
    queue.put(int(seen.sum()))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_runs_chunks_without_its_parents_threads():
    seen = np.zeros(100, dtype=np.int64)
    with _Threads(2):
        run_chunks(_count_rows, 100, seen)  # the parent's pool exists now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_fork_child, args=(queue,))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, "the forked child hung waiting for its parent's threads"
    assert queue.get(timeout=5) == 100


def test_a_fit_is_the_same_to_the_bit_on_one_thread_and_on_two():
    """The rows of a chunk do not depend on which thread runs it, nor on how many chunks the
    block is cut into: every field of the full record equal to the bit (planted rows, a
    third of them missing points)."""
    from tokdyn.fit import fit_sigmoids, log_axis
    from tokdyn.fit.synthetic import plant_sigmoids

    x = log_axis(np.geomspace(10.0, 1e5, 40))
    Y = plant_sigmoids(600, x, rng=np.random.default_rng(3), noise=0.2).Y
    Y[::3, 5] = np.nan
    Y[1::7, 20:23] = np.nan
    fits = []
    for threads in (1, 2, 3):
        with _Threads(threads):
            fits.append(fit_sigmoids(x, Y, backend="numba").to_dict())
    for other in fits[1:]:
        for name, values in fits[0].items():
            assert np.array_equal(values, other[name], equal_nan=values.dtype.kind == "f"), name
