"""A refit of a complete fit is written beside it (``fit_next``) and swapped in when it is
complete: stopped, failed or killed at any point, the run keeps one whole fit that readers read."""

from __future__ import annotations

import os
import shutil

import fsspec
import numpy as np
import pytest
from zarr.storage import FsspecStore, LocalStore

import tokdyn
from test_store_fit import STEPS, _interrupt_at, make_store, planted
from tokdyn.cli import main
from tokdyn.fit import FIT_FIELDS
from tokdyn.fit import job as fitjob
from tokdyn.fit.job import fit_run, read_fit
from tokdyn.store import fit as fitstore
from tokdyn.store.schema import has_keys, join

FIELDS = {name: np.dtype(dt).str for name, dt in FIT_FIELDS.items()}
N, BLOCK = 100, 50


def _equal(got: dict, expected: dict) -> None:
    for name in FIT_FIELDS:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def _staged_keys(run) -> bool:
    return has_keys(run._group.store, join(run._group.path, fitstore.NEXT) + "/")


def test_a_refit_stopped_midway_keeps_the_fit_and_tokdyn_fit_resumes_it(tmp_path, monkeypatch, capsys):
    """`tokdyn fit --refit` stopped in its third block (Ctrl-C, a kill) left the run with an
    unfinished fit that every reader refused. The fit there was is now read as before until the
    refit is complete; `tokdyn fit` with the refit's options resumes it (only the blocks it had
    not fitted) and swaps it in, and its result is the fit made from scratch with those options."""
    Y = planted(1000)[0]
    ref = make_store(tmp_path / "ref.zarr", Y, token_chunk=200)
    fit_run(ref.run("r"), axis_min=10, scheduler="sync", progress=False)
    windowed = read_fit(ref, "r")

    st = make_store(tmp_path / "s.zarr", Y, token_chunk=200)
    fit_run(st.run("r"), scheduler="sync", progress=False)
    before = read_fit(st, "r")
    real = _interrupt_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fit_run(st.run("r"), axis_min=10, refit=True, scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    run = tokdyn.open_store(tmp_path / "s.zarr").run("r")
    assert run.fit.complete and run.fit.meta["axis_min"] is None and _staged_keys(run)
    _equal(read_fit(st, "r"), before)
    assert main(["report", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "r.html")]) == 0, capsys.readouterr().err

    res = fit_run(st.run("r"), axis_min=10, scheduler="sync", progress=False)
    assert (res.blocks_resumed, res.blocks_fitted) == (2, 3)
    run = tokdyn.open_store(tmp_path / "s.zarr").run("r")
    assert run.fit.meta["axis_min"] == 10 and not _staged_keys(run)
    _equal(read_fit(st, "r"), windowed)
    assert not (tmp_path / "s.zarr" / "runs" / "r" / "fit_next").exists()


def test_a_refit_stopped_then_refit_again_starts_over(tmp_path, monkeypatch):
    """`--refit` after a stopped refit fits every block again (it does not resume the stopped one),
    still beside the complete fit; the run never has two fits in the end."""
    Y = planted(600)[0]
    st = make_store(tmp_path / "s.zarr", Y, token_chunk=200)
    fit_run(st.run("r"), scheduler="sync", progress=False)
    real = _interrupt_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        fit_run(st.run("r"), refit=True, scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    staged_id = st.run("r").fit._staged().attrs["tokdyn_fit"]["fit_id"]
    res = fit_run(st.run("r"), axis_min=10, refit=True, scheduler="sync", progress=False)
    assert res.blocks_fitted == 3 and res.blocks_resumed == 0
    meta = st.run("r").fit.meta
    assert meta["axis_min"] == 10 and meta["fit_id"] != staged_id and not _staged_keys(st.run("r"))


def test_a_refit_of_an_unfinished_fit_is_made_in_its_place(tmp_path, monkeypatch):
    """Only a complete fit is kept beside a refit: an unfinished one has nothing a reader reads,
    and its refit replaces it where it is."""
    Y = planted(400)[0]
    st = make_store(tmp_path / "s.zarr", Y, token_chunk=200)
    real = _interrupt_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        fit_run(st.run("r"), scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    run = st.run("r")
    with run.fit.writer({"n_committed": run.n_committed, "block_tokens": 200}, FIELDS, n_blocks=2, refit=True) as fw:
        assert not fw.staged and not _staged_keys(run)


# -- a swap killed at any point ------------------------------------------------------------------


class Killed(Exception):
    """The process dies here: nothing after it runs (an Exception, not a BaseException, so that
    zarr's event loop hands it back from a coroutine instead of stopping)."""


def _url(tmp_path, kind: str, i: int) -> str:
    return str(tmp_path / f"s{i}.zarr") if kind == "local" else f"memory://tokdyn-refit-{os.getpid()}-{id(tmp_path)}-{i}"


def _store(tmp_path, kind: str, i: int):
    """Store ``i`` of ``kind`` with run "r" (N tokens): the first one made, the others copies of
    it (made and written through fsspec, a memory store is slow to make)."""
    url, first = _url(tmp_path, kind, i), _url(tmp_path, kind, 0)
    if not i:
        return make_store(url, planted(N)[0], token_chunk=BLOCK)
    if kind == "local":
        shutil.copytree(first, url)
    else:
        fsspec.filesystem("memory").copy(first, url, recursive=True)
    return tokdyn.open_store(url, mode="r+")


def _fit(run, which: str, *, refit: bool) -> None:
    """A fit of run written through the store's writer, every field ``which``'s value."""
    value = {"old": 1, "new": 2}[which]
    inputs = {"n_committed": run.n_committed, "block_tokens": BLOCK, "options": {"which": which}}
    with run.fit.writer(inputs, FIELDS, n_blocks=N // BLOCK, refit=refit) as fw:
        assert fw.staged == refit
        for b in range(N // BLOCK):
            run.fit.write_block(b, b * BLOCK, {k: np.full(BLOCK, value, dtype=dt) for k, dt in FIELDS.items()}, fit_id=fw.fit_id)
        fw.finish()


def _value(run) -> int:
    """The one value every field of the run's fit holds (a fit mixed of two is an error)."""
    got = run.fit.read()
    values = {float(v) for a in got.values() for v in np.unique(a)}
    assert len(values) == 1, values
    return int(values.pop())


def _arm(monkeypatch, store, at: int) -> dict:
    """Kill the swap at its ``at``-th change to the store (a key set or deleted, a folder
    deleted or renamed); returns the count of changes a swap makes that was not killed."""
    state = {"active": False, "n": 0}

    def gate() -> None:
        if state["active"]:
            if state["n"] == at:
                raise Killed
            state["n"] += 1

    cls = type(store)
    for name in ("set", "delete", "delete_dir"):
        real = getattr(cls, name)

        async def changed(self, *args, _real=real, **kwargs):
            gate()
            return await _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, changed)
    replace = os.replace
    monkeypatch.setattr(fitstore.os, "replace", lambda *a, **k: (gate(), replace(*a, **k))[1])
    swap = fitstore.FitWriter._swap

    def watched(self) -> None:
        state["active"] = True
        try:
            swap(self)
        finally:
            state["active"] = False

    monkeypatch.setattr(fitstore.FitWriter, "_swap", watched)
    return state


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_swap_killed_at_any_point_leaves_one_whole_fit(tmp_path, monkeypatch, kind):
    """The swap that puts a complete refit in place of the fit renames a folder on a local
    store and copies every key on others. Killed at each of its changes in turn, the run holds
    one whole fit: the old one until the old fit's metadata is removed (the first change), the
    refit from then on, never a mix and never an error; and the next fit on the refit's inputs
    finishes the swap, finds nothing to fit, and leaves no second group."""
    st = _store(tmp_path, kind, 0)
    _fit(st.run("r"), "old", refit=False)  # the copies start from here
    store = st.run("r")._group.store
    assert isinstance(store, LocalStore if kind == "local" else FsspecStore)
    with monkeypatch.context() as m:
        changes = _arm(m, store, at=10**9)
        _fit(_store(tmp_path, kind, 1).run("r"), "new", refit=True)
    n = changes["n"]
    assert n >= 3 and _value(tokdyn.open_store(_url(tmp_path, kind, 1)).run("r")) == 2
    # a rename is 3 changes, a copy one per key: its first and last few, and some between
    points = range(n) if n <= 12 else sorted({*range(4), *range(n - 4, n), *range(4, n - 4, max(1, n // 8))})
    for at in points:
        st = _store(tmp_path, kind, at + 2)
        with monkeypatch.context() as m:
            _arm(m, store, at=at)
            with pytest.raises(Killed):
                _fit(st.run("r"), "new", refit=True)
        run = tokdyn.open_store(st.url).run("r")
        assert run.fit.complete
        assert _value(run) == (1 if at == 0 else 2), at
        inputs = {"n_committed": run.n_committed, "block_tokens": BLOCK, "options": {"which": "new"}}
        with run.fit.writer(inputs, FIELDS, n_blocks=N // BLOCK) as fw:
            assert not fw.staged and fw.todo() == ([], []), at
        assert _value(run) == 2 and not _staged_keys(run), at
        assert run.fit.meta["options"] == {"which": "new"}


def test_a_block_of_a_stopped_refit_is_refused_by_the_next_one(tmp_path):
    """A late block of a refit that was stopped (a cluster worker still running) after another
    refit began beside the same fit is refused, and neither fit takes it."""
    st = _store(tmp_path, "local", 0)
    run = st.run("r")
    _fit(run, "old", refit=False)
    inputs = {"n_committed": run.n_committed, "block_tokens": BLOCK, "options": {"which": "new"}}
    with run.fit.writer(inputs, FIELDS, n_blocks=N // BLOCK, refit=True) as first:
        stale = first.fit_id
    block = {k: np.full(BLOCK, 3, dtype=dt) for k, dt in FIELDS.items()}
    with run.fit.writer(inputs, FIELDS, n_blocks=N // BLOCK, refit=True) as second:
        assert second.staged and second.fit_id != stale
        with pytest.raises(tokdyn.errors.StoreError, match="was replaced while block 1"):
            run.fit.write_block(1, BLOCK, block, fit_id=stale)
        assert second.todo() == ([0, 1], [])
    assert _value(run) == 1  # the fit there was, read all along


def test_a_refit_swapped_in_reads_back_and_repair_finds_nothing_damaged(tmp_path):
    """The staged refit's results carry the same position-bound checksums as a fit made in
    place (they name ``fit/<field>``, not the group they were written in): moved into place,
    every block reads back and `--repair` finds nothing damaged."""
    Y = planted(300)[0]
    st = make_store(tmp_path / "s.zarr", Y, token_chunk=100)
    fit_run(st.run("r"), scheduler="sync", progress=False)
    fit_run(st.run("r"), refit=True, axis_min=float(STEPS[3]), scheduler="sync", progress=False)
    res = fit_run(st.run("r"), repair=True, scheduler="sync", progress=False)
    assert res.blocks_repaired == [] and res.blocks_fitted == 0
    assert read_fit(st, "r")["n_points"].max() == len(STEPS) - 3


def test_a_refit_killed_while_its_group_was_created_is_removed_by_the_next_fit(tmp_path):
    """A refit killed before its group had its metadata left a ``fit_next`` that is no refit to
    resume: the next fit removes it (as an unfinished creation of ``fit`` is made again), reads
    on the complete fit, and a fit on the fit's own inputs finds nothing to do."""
    st = _store(tmp_path, "local", 0)
    run = st.run("r")
    _fit(run, "old", refit=False)
    run._group.create_group(fitstore.NEXT)  # its zarr.json, no tokdyn_fit yet
    assert _staged_keys(run) and _value(run) == 1
    inputs = {"n_committed": run.n_committed, "block_tokens": BLOCK, "options": {"which": "old"}}
    with run.fit.writer(inputs, FIELDS, n_blocks=N // BLOCK) as fw:
        assert not fw.staged and fw.todo() == ([], [])
    assert not _staged_keys(run) and _value(run) == 1


# -- what the stored fit's readers and the resume take from a refit beside it ----------------------


def test_a_stopped_refit_on_another_backend_is_resumed_on_its_own(tmp_path, monkeypatch):
    """A plain fit resumes a stored fit on the backend it was made on; it took that backend from
    the old fit even where a stopped refit beside it, on another backend, was the fit asked for,
    so the refit was never resumed (a plain fit said the old one was done)."""
    Y = planted(600)[0]
    st = make_store(tmp_path / "s.zarr", Y, token_chunk=200)
    fit_run(st.run("r"), backend="numpy", scheduler="sync", progress=False)
    real = _interrupt_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        fit_run(st.run("r"), axis_min=10, refit=True, scheduler="sync", progress=False)  # auto: numba
    monkeypatch.setattr(fitjob, "fit_block", real)
    assert st.run("r").fit.staged_meta["backend"] == "numba"
    res = fit_run(st.run("r"), axis_min=10, scheduler="sync", progress=False)
    assert (res.backend, res.blocks_resumed, res.blocks_fitted) == ("numba", 1, 2)
    assert st.run("r").fit.meta["axis_min"] == 10 and not _staged_keys(st.run("r"))
    # and the old fit's own inputs still find the old fit, on its backend, done
    st2 = make_store(tmp_path / "t.zarr", Y, token_chunk=200)
    fit_run(st2.run("r"), backend="numpy", scheduler="sync", progress=False)
    with pytest.raises(KeyboardInterrupt):
        _interrupt_at(monkeypatch, 2)
        fit_run(st2.run("r"), axis_min=10, refit=True, scheduler="sync", progress=False)
    monkeypatch.setattr(fitjob, "fit_block", real)
    res = fit_run(st2.run("r"), scheduler="sync", progress=False)
    assert (res.backend, res.blocks_fitted) == ("numpy", 0) and _staged_keys(st2.run("r"))


def test_reads_across_a_swap_are_refused_not_mixed(tmp_path, monkeypatch):
    """A reader that reads a fit several times (compare's slices; a read's record, then its
    arrays) while a refit is swapped in used to mix the two fits without a word (the old fit
    read well until the swap), or to call the refit's arrays damage and ask for --repair. Both
    now say the fit was replaced while it was read."""
    from tokdyn import compare
    from tokdyn.store.fit import FitResults

    Y = planted(600)[0]
    st = make_store(tmp_path / "s.zarr", Y, token_chunk=100)
    fit_run(st.run("r"), scheduler="sync", progress=False)
    url = str(tmp_path / "s.zarr")
    whole = compare.token_times(url, "r")
    monkeypatch.setattr(compare, "SLICE_TOKENS", 200)  # three slices
    read_tokens, calls = FitResults.read_tokens, []

    def refit_after_the_first_slice(self, *args, **kwargs):
        out = read_tokens(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            fit_run(tokdyn.open_store(url, mode="r+").run("r"), axis_min=10, refit=True, scheduler="sync", progress=False)
        return out

    monkeypatch.setattr(FitResults, "read_tokens", refit_after_the_first_slice)
    with pytest.raises(tokdyn.errors.StoreError, match="was replaced while it was being read"):
        compare.token_times(url, "r")
    monkeypatch.setattr(FitResults, "read_tokens", read_tokens)
    assert not np.array_equal(compare.token_times(url, "r").mu, whole.mu, equal_nan=True)  # the refit, read whole

    checked, swapped = FitResults._checked, []

    def swap_after_the_check(self, meta, current):
        out = checked(self, meta, current)
        if not swapped:
            swapped.append(1)
            fit_run(tokdyn.open_store(url, mode="r+").run("r"), refit=True, scheduler="sync", progress=False)
        return out

    monkeypatch.setattr(FitResults, "_checked", swap_after_the_check)
    with pytest.raises(tokdyn.errors.StoreError, match="was replaced while it was being read") as info:
        tokdyn.open_store(url).run("r").fit.read()
    assert "--repair" not in str(info.value)
