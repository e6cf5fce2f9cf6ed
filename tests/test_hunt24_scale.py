"""Hunt 24, scale limits: work that grows with tokens x groups (a probe of 20M tokens split by
10,000 domains: a folder whose files each are a domain, a JSON field of many labels), index
arithmetic past 2**31 and the store's metadata at 20M tokens x 5,000 checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokdyn.compare import _groups
from tokdyn.spectrum import Events, learning_time_spectrum, spectra_by, units_by_group


def _big_events(n: int, seed: int = 0) -> Events:
    """Events on half of ``n`` tokens, in documents of 100 tokens, every token scored."""
    rng = np.random.default_rng(seed)
    e = n // 2
    tok = np.sort(rng.choice(n, e, replace=False))
    return Events(tok, rng.uniform(1, 4, e), rng.uniform(0.05, 0.3, e), rng.uniform(0.1, 1, e), n, (0.0, 5.0),
                  unit=np.arange(n) // 100, unit_kind="document", scored=np.ones(n, bool))  # fmt: skip


class _Counting(np.ndarray):
    """A code array that counts the numpy operations (ufuncs such as ``==``, functions such as
    ``np.isin`` or ``np.unique``) that read it whole."""

    reads = 0

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _Counting.reads += 1
        return getattr(ufunc, method)(*(np.asarray(x) if isinstance(x, _Counting) else x for x in inputs), **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        _Counting.reads += 1
        return func(*(np.asarray(x) if isinstance(x, _Counting) else x for x in args), **kwargs)


# -- per-group loops that scanned every token once per group ---------------------------------
#
# Measured on the code before (2 shared cores), the groups' own spectra left out (min_events
# above every group): 1M tokens, 500 groups: spectra_by 3.4 s, units_by_group 1.9 s,
# compare's _groups 1.5 s; 4M tokens, 500 groups: 22.9 s, 13.1 s, 5.1 s: tokens x groups, some
# 12 minutes each at 20M tokens and 10,000 domains; at 1M tokens by 2,000 groups the code
# after took 0.04, 0.08 and 0.12 s. The tests count the passes over the whole probe instead of
# timing them (a fixed number, not one a group).

N_BIG, G_BIG = 20_000, 400


def test_spectra_by_many_groups_does_not_scan_the_probe_once_a_group(monkeypatch):
    """Each group took a mask of every token, the events' tokens through it, and a new Events
    that checked the whole probe's units and scored mask again (N a group): 7.5 s for 2,000
    groups of a 1M-token probe before any group's spectrum was computed."""
    ev, g = _big_events(N_BIG), np.random.default_rng(1).integers(0, G_BIG, N_BIG)
    checks = []
    real = Events.__post_init__
    monkeypatch.setattr(Events, "__post_init__", lambda self: (checks.append(1), real(self))[1])
    spectra_by(ev, g, [f"d{i}" for i in range(G_BIG)], bandwidth=0.1, min_events=10**9)
    assert len(checks) <= 2  # 400 before: one whole check a group


def test_units_by_group_many_groups_does_not_scan_the_probe_once_a_group(monkeypatch):
    ev, g = _big_events(N_BIG), np.random.default_rng(1).integers(0, G_BIG, N_BIG)
    masks = []
    real = Events.scored_in
    monkeypatch.setattr(Events, "scored_in", lambda self, m: (masks.append(1), real(self, m))[1])
    units_by_group(ev, np.arange(N_BIG) // 10, g)
    assert len(masks) <= 2  # 400 before: the scored tokens of a mask of N, a group


def test_compare_domain_groups_do_not_scan_the_probe_once_a_domain():
    index = np.random.default_rng(1).integers(0, G_BIG, N_BIG).view(_Counting)
    _Counting.reads = 0
    groups = _groups(np.array([f"d{i}" for i in range(G_BIG)]), index)
    assert len(groups) == G_BIG and _Counting.reads <= 3  # 401 before: np.isin over every token, a domain


# -- the same groups as one group at a time ----------------------------------------------------


def _units_by_group_reference(events: Events, sample_id, group):
    """The rule of :func:`units_by_group` a group at a time, as it was written: each group's
    scored tokens at the first level (the probe's units, windows, tokens) where they lie in two
    units at least, else the last."""
    unit, _ = events.units()
    n = events.n_tokens
    levels = [unit, np.unique(sample_id, return_inverse=True)[1].reshape(-1), np.arange(n)]
    chosen = np.zeros(n, np.int64)
    for k in np.unique(group):
        scored = (group == k) & events.scored
        chosen[group == k] = next((i for i, c in enumerate(levels) if np.unique(c[scored]).size >= 2), len(levels) - 1)
    return chosen, np.choose(chosen, levels)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), n_docs=st.integers(1, 4), n_windows=st.integers(1, 8), n_groups=st.integers(1, 6),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_units_by_group_gives_each_group_the_level_a_group_at_a_time_gives(n, n_docs, n_windows, n_groups, seed):
    """Groups of any codes (negative, sparse), scored tokens anywhere: every token gets the
    level and unit the one-group-at-a-time rule gives it (compared as a partition: the codes
    themselves are arbitrary)."""
    rng = np.random.default_rng(seed)
    scored = rng.random(n) < 0.7
    scored[rng.integers(n)] = True
    tok = np.flatnonzero(scored)
    ev = Events(tok, np.full(tok.size, 2.0), np.full(tok.size, 0.2), np.ones(tok.size), n, (1.0, 4.0),
                unit=np.sort(rng.integers(0, n_docs, n)), unit_kind="document", scored=scored)  # fmt: skip
    sample_id = np.sort(rng.integers(0, n_windows, n)) * 7
    group = rng.choice(np.array([-3, 0, 5, 11, 2**40, 9, -1])[:n_groups], n)
    out = units_by_group(ev, sample_id, group)
    chosen, picked = _units_by_group_reference(ev, sample_id, group)
    if not chosen.any():
        assert out is ev
        return
    pairs = chosen * (n + 1) + picked  # the reference's (level, unit), as a partition of the tokens
    assert np.array_equal(np.unique(pairs, return_inverse=True)[1].reshape(-1), out.unit)


def test_spectra_by_many_groups_equals_each_group_on_its_own():
    """Each group's spectrum is that of its tokens' events alone, on the whole's bandwidth, with
    the same N (so they add up to the whole)."""
    ev = _big_events(20_000, seed=3)
    g = np.random.default_rng(4).integers(-2, 40, 20_000)
    g[g == 7] = 8  # a code without tokens
    labels = {int(c): f"d{c}" for c in range(-2, 40)}
    out = spectra_by(ev, g, labels)
    h = learning_time_spectrum(ev).bandwidth
    assert set(out) == {f"d{c}" for c in np.unique(g)}
    for c in np.unique(g).tolist():
        alone = learning_time_spectrum(ev.for_tokens(g == c), bandwidth=h)
        assert np.array_equal(out[f"d{c}"].density, alone.density) and out[f"d{c}"].n_tokens == ev.n_scored
    total = sum(s.total_drop for s in out.values())
    assert total == pytest.approx(learning_time_spectrum(ev).total_drop, rel=1e-9)


def test_compare_groups_are_the_tokens_of_each_name():
    """Two codes of one name are one group; each group is exactly the tokens whose code has its name."""
    names = np.array(["b", "a", "b", "c"])
    index = np.array([3, 0, 2, 2, 0, 1, 3, 0])
    got = [(name, np.flatnonzero(np.zeros(index.size, bool) | _as_mask(m, index.size))) for name, m in _groups(names, index)]
    assert [name for name, _ in got] == ["a", "b", "c"]
    assert [w.tolist() for _, w in got] == [[5], [1, 2, 3, 4, 7], [0, 6]]


def _as_mask(m, n: int) -> np.ndarray:
    """A group's selection (a mask or indices) as a mask of n tokens."""
    m = np.asarray(m)
    if m.dtype == bool:
        return m
    out = np.zeros(n, bool)
    out[m] = True
    return out


# -- the fit's block: all rows of a loss chunk, held once --------------------------------------


class _Read(Exception):
    """Raised by the stub fit: the block has been read."""


def test_a_fit_block_holds_its_rows_once(tmp_path, monkeypatch):
    """A fit block is every row of a loss chunk (262,144 tokens): at 5,000 checkpoints 5.2 GB of
    float32. Its rows were then gathered by index (``Y[rows - first]``; the rows a fit takes
    are always one run of rows, the ones past step 0 and axis_min), a second whole copy made
    beside the first: 10.5 GB a worker. Over the bare read of the block (tracemalloc), the
    fit's own read now adds its result fields only (272 bytes a token, under a tenth of the
    block's 600 rows of float32 here); it added a whole block more before."""
    import tracemalloc

    import tokdyn.fit.job as job
    from tokdyn.fit.options import FitOptions
    from tokdyn.probe import ProbeSet
    from tokdyn.store import open_store

    k, n = 600, 4096
    probe = ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 50, (n // 64, 65)))
    st = open_store(str(tmp_path / "s.zarr"), probe, mode="w")
    st.create_run("r", axis="T", capacity=k)
    w = st.run("r").writer()
    w.append_rows(np.random.default_rng(1).uniform(1, 5, (k, n)).astype(np.float32), [{"step": s} for s in range(k)])
    w.release()
    r = st.run("r")
    rows, x = job.fit_inputs(r)
    assert rows.tolist() == list(range(1, k)) and r.token_chunk == n  # step 0 left out: one run of rows; one block

    def peak(f) -> int:
        tracemalloc.start()
        try:
            f()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    def read_only(x, Y, **_):
        raise _Read(tracemalloc.get_traced_memory()[1])

    monkeypatch.setattr(job, "fit_block", read_only)
    bare = peak(lambda: r.losses(tokens=slice(0, n), rows=slice(1, k)))
    tracemalloc.start()
    try:
        with pytest.raises(_Read) as got:
            job._fit_one_block(0, url=st.url, storage_options=None, run="r", rows=rows, x=x, options=FitOptions(), backend="numpy",
                               device=None, block=n, n=n, batch_rows=1024, fit_id="x", store=st)  # fmt: skip
    finally:
        tracemalloc.stop()
    assert got.value.args[0] - bare < 0.5 * (k - 1) * n * 4


# -- a selection's checks read the commit records once ------------------------------------------


def test_losses_at_reads_the_commit_records_once_a_call(monkeypatch):
    """``losses_at`` (the report's trajectories and viewer) reads whole chunks, 32 rows at a
    time, and checked each against the commit record read again each time: the record holds
    every row's checksums (4.6 MB of JSON at 5,000 rows of a 20M-token probe), so 18 tokens in
    18 chunks read it K/32 x 18 times: rows x rows x chunks (500, 1,000, 2,000 rows of 77
    chunks: 6.5, 17.3, 43 s; now 6.9 s and 10.2 s at 1,000 and 2,000). Once a call now, NaN
    counts too; the values are those of ``losses()``."""
    from tokdyn.probe import ProbeSet
    from tokdyn.store import open_store
    from tokdyn.store.run import Run

    k, c, chunks = 70, 8, 6
    probe = ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 50, (chunks, c + 1)))
    st = open_store("memory://hunt24-losses-at", probe, mode="w")
    st.create_run("r", axis="T", capacity=k, token_chunk=c)
    y = np.random.default_rng(1).uniform(1, 5, (k, c * chunks)).astype(np.float32)
    y[:, 3] = np.nan  # a token never finite: every block has NaN to count
    w = st.run("r").writer()
    w.append_rows(y, [{"step": s + 1} for s in range(k)], warn_nonfinite=False)
    w.release()
    r = st.run("r")
    reads = []
    real = Run._commit
    monkeypatch.setattr(Run, "_commit", lambda self, j: reads.append(j) or real(self, j))
    rows, tokens = np.arange(k)[::-1], np.array([3, 9, 20, 47, 30, 9])
    got = r.losses_at(rows, tokens)
    assert len(reads) <= 3  # the row count, the checksums, the non-finite counts (19 before: 3 row groups x 5 chunks, 3 x NaN, 1)
    np.testing.assert_array_equal(got, r.losses()[np.ix_(rows, tokens)])
