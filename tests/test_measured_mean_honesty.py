"""The measured side of a reconstruction, and the fit's point count, say what they leave out.

- The measured mean probe loss averaged each row over whichever tokens had a loss there: with the
  highest-loss tenth of the tokens missing (NaN) at the first rows, each row's mean was over other
  tokens, the early mean too low, and the events' R^2 read 0.924 on a run whose events are exact.
  Now the mean is over one set of tokens at every row (the rest left out of both sides and said;
  refused past half).
- A row with no loss at all still got a "measured" derivative (the local quadratic of its
  neighbours), printed and scored as measured. Now NaN, out of the scores, and said.
- ``tokdyn fit`` said "on 20 points" for a run of 21 rows: the row at step 0, which
  ``x = log10(step)`` cannot place, left out without a word (and rows before ``--axis-min``).
"""

from __future__ import annotations

import json
import os
import time
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokdyn
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.fit.job import fitted_inputs
from tokdyn.reconstruct import measured_derivative, mean_probe_loss, reconstruct, reconstruct_run, scores
from tokdyn.spectrum import Events

STEPS = np.r_[0, np.unique(np.round(np.geomspace(4, 4000, 20)).astype(np.int64))]  # 21 rows, the first at step 0
N = 300


def _planted(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] one-step trajectories (start 2..9 nats, learned at x 1..3.2), and their start levels."""
    rng = np.random.default_rng(seed)
    x = np.log10(np.maximum(STEPS, 1))
    mu, l0 = rng.uniform(1.0, 3.2, N), rng.uniform(2.0, 9.0, N)
    Y = 0.5 + (l0 - 0.5)[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / 0.15)) + rng.normal(0, 0.03, (N, x.size))
    return Y, l0


def _store(path, Y: np.ndarray, steps=STEPS, *, fit: bool = True, **fit_kw) -> tokdyn.TrajectoryStore:
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(Y.shape[0], dtype=np.int32),
                                   "token_pos": np.ones(Y.shape[0], np.int32)})  # fmt: skip
    s = tokdyn.open_store(str(path), probe, mode="w")
    with s.create_run("r", capacity=len(steps)).writer() as w:
        for j, step in enumerate(steps):
            w.append(Y[:, j].astype(np.float32), step=int(step), warn_nonfinite=False)
    if fit:
        tokdyn.fit_run(s.run("r"), progress=False, workers=1, **fit_kw)
    return s


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """clean; partial (the highest-loss tenth lost at the first 4 rows); empty (no loss at row 10)."""
    root = tmp_path_factory.mktemp("measured")
    Y, l0 = _planted()
    partial = Y.copy()
    partial[np.argsort(-l0)[: N // 10], :4] = np.nan
    empty = Y.copy()
    empty[:, 10] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the all-NaN row is warned at append
        return {name: _store(root / f"{name}.zarr", y) for name, y in (("clean", Y), ("partial", partial), ("empty", empty))}


def _rec(st):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return reconstruct_run(st.run("r"), n_boot=0)


# -- 1. one set of tokens at every row -------------------------------------------------------------


def test_tokens_missing_at_some_rows_are_left_out_of_both_sides_and_said(stores):
    """The planted events are exact: the reconstruction must read as such, over the tokens kept."""
    clean, partial = _rec(stores["clean"]), _rec(stores["partial"])
    assert clean.r2_events > 0.999
    assert partial.r2_events > 0.999  # was 0.924: the early mean lacked the high-loss tokens
    assert partial.drop_share_events == pytest.approx(1.0, abs=0.01)  # was 1.076
    assert partial.n_tokens == N - N // 10 and partial.spectrum.n_tokens == N - N // 10  # the events too
    s = partial.summary()
    assert s["n_tokens_left_out"] == N // 10
    assert any("30 of 300" in n and "left out" in n for n in s["notes"])
    with pytest.warns(UserWarning, match="30 of 300"):
        reconstruct_run(stores["partial"].run("r"), n_boot=0)


def test_the_measured_mean_is_over_one_set_of_tokens(stores):
    """The measured curve is the plain mean, over the same tokens at every fitted row."""
    r = stores["partial"].run("r")
    rows, _ = fitted_inputs(r)
    L = r.losses_at(rows, np.arange(N)).astype(np.float64)
    every = ~np.isnan(L).any(axis=0)
    np.testing.assert_allclose(_rec(stores["partial"]).mean_loss, L[:, every].mean(axis=1), rtol=1e-12)


def test_nothing_changes_where_every_token_has_every_loss(stores):
    r = stores["clean"].run("r")
    rows, _ = fitted_inputs(r)
    rec = _rec(stores["clean"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and nothing is warned
        plain = mean_probe_loss(r, rows)
        reconstruct_run(r, n_boot=0)
    np.testing.assert_array_equal(rec.mean_loss, plain)
    assert rec.n_tokens == N and rec.summary()["n_tokens_left_out"] == 0 and rec.summary()["notes"] == []


def test_a_minority_mean_is_refused(tmp_path):
    Y, _ = _planted(1)
    Y[:100, 3] = np.nan  # a third of the tokens miss a loss at one row, another third at another:
    Y[100:200, 5] = np.nan  # each row keeps two thirds, but only a third have a loss at both
    st_ = _store(tmp_path / "s.zarr", Y)
    with pytest.raises(InputError, match="have a loss at every one"):
        reconstruct_run(st_.run("r"), n_boot=0)


def test_the_plain_per_row_mean_warns_where_its_rows_average_other_tokens(stores):
    r = stores["partial"].run("r")
    with pytest.warns(UserWarning, match="30 tokens have a loss at some of the 21 rows only"):
        mean_probe_loss(r)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean_probe_loss(r, np.array([20]))  # one row: its own mean, nothing to warn


def _memory_run(Y: np.ndarray, chunk: int):
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(Y.shape[1], dtype=np.int32),
                                   "token_pos": np.ones(Y.shape[1], np.int32)})  # fmt: skip
    s = tokdyn.open_store(f"memory://tokdyn-mm-{os.getpid()}-{time.time_ns()}", probe, mode="w")
    w = s.create_run("r", capacity=Y.shape[0], token_chunk=chunk).writer()
    for j, row in enumerate(Y):
        w.append(row, step=j + 1, warn_nonfinite=False)
    return s.run("r")


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(3, 7), n=st.integers(1, 40), chunk=st.integers(3, 16), p=st.sampled_from([0.0, 0.02, 0.1, 0.4]),
    lost_row=st.booleans(), masked=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_measured_mean_is_the_mean_of_the_tokens_with_a_loss_at_every_measured_row(k, n, chunk, p, lost_row, masked, seed):
    """Against numpy: rows where fewer than half of the tokens asked for have a loss are NaN; the
    rest is the mean over the tokens asked for with a loss at every one of them; under half kept
    is refused; notes say what was left out."""
    from tokdyn.reconstruct import measured_mean_loss  # new in this change: the rest of the module imports on the old code

    rng = np.random.default_rng(seed)
    Y = rng.uniform(0.1, 9.0, (k, n)).astype(np.float32)
    Y[rng.random((k, n)) < p] = np.nan
    if lost_row:
        Y[rng.integers(k)] = np.nan
    sel = rng.random(n) < 0.7 if masked else np.ones(n, bool)
    if not sel.any():
        sel[0] = True
    r = _memory_run(Y, chunk)
    L = r.losses_at(np.arange(k), np.arange(n)).astype(np.float64)
    seen = ~np.isnan(L) & sel[None, :]
    n_asked = int(sel.sum())
    missing = seen.sum(axis=1) < 0.5 * n_asked
    keep = sel & seen[~missing].all(axis=0) if (~missing).any() else np.zeros(n, bool)
    args = {"tokens": sel} if masked else {}
    if missing.all() or keep.sum() < 0.5 * n_asked:
        with pytest.raises(InputError):
            measured_mean_loss(r, **args)
        return
    mm = measured_mean_loss(r, **args)
    want = np.full(k, np.nan)
    want[~missing] = L[np.ix_(~missing, keep)].mean(axis=1)
    np.testing.assert_allclose(mm.loss, want, rtol=1e-12)
    np.testing.assert_array_equal(mm.tokens, keep)
    np.testing.assert_array_equal(mm.missing, missing)
    assert mm.n_left_out == n_asked - keep.sum()
    assert bool(mm.notes) == bool(missing.any() or mm.n_left_out)
    if not (missing.any() or mm.n_left_out) and not masked:  # every loss there: the plain mean, bit for bit
        np.testing.assert_array_equal(mm.loss, mean_probe_loss(r))


# -- 2. a row with no loss is no measurement ---------------------------------------------------------


def test_a_row_without_losses_has_no_measured_derivative_and_no_score(stores):
    rec = _rec(stores["empty"])
    rows, _ = fitted_inputs(stores["empty"].run("r"))
    at = int(np.flatnonzero(rows == 10)[0])
    assert np.isnan(rec.mean_loss[at]) and np.isnan(rec.measured[at])  # was a "measured" 1.959
    assert np.isfinite(np.delete(rec.measured, at)).all() and np.isfinite(rec.from_events).all()
    assert rec.r2_events == scores(np.delete(rec.from_events, at), np.delete(rec.measured, at))["r2"]
    s = rec.summary()
    assert s["n_points"] == 20 and s["n_points_measured"] == 19
    assert any("step 105 (no loss)" in n for n in s["notes"])


def test_tokdyn_reconstruct_prints_the_missing_row_as_missing_and_says_why(stores, capsys):
    assert main(["reconstruct", str(stores["empty"].url), "--boot", "0"]) == 0
    out, err = capsys.readouterr()
    assert "warning" in err and "step 105 (no loss)" in err
    row = [line for line in out.splitlines() if line.split()[:1] == ["2.021"]]
    assert row and row[0].split()[1] == "nan"


@settings(max_examples=60, deadline=None)
@given(k=st.integers(5, 25), seed=st.integers(0, 2**16), frac=st.floats(0.0, 0.5))
def test_the_measured_derivative_is_missing_exactly_where_the_loss_is(k, seed, frac):
    """NaN where the loss is NaN; elsewhere the regression over the measured points alone."""
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.uniform(0.05, 0.4, k))
    loss = 5 - x + 0.1 * x**2 + rng.normal(0, 0.01, k)
    lost = rng.random(k) < frac
    if (~lost).sum() < 3:
        lost[:] = False
    loss[lost] = np.nan
    got = measured_derivative(x, loss, smoothing=0.3)
    np.testing.assert_array_equal(np.isnan(got), lost)
    np.testing.assert_allclose(got[~lost], measured_derivative(x[~lost], loss[~lost], smoothing=0.3), rtol=1e-12, atol=1e-12)


def test_reconstruct_scores_and_shares_only_the_measured_points():
    x = np.linspace(0, 3, 16)
    ev = Events(np.arange(2), np.array([1.0, 2.0]), np.array([0.2, 0.3]), np.array([2.0, 1.0]), 2, (0.0, 3.0))
    loss = 1.0 + ev.curve(x)
    loss[[0, 7]] = np.nan  # the first point, and one inside
    with pytest.warns(UserWarning, match="no measured mean loss at 2 points"):
        rec = reconstruct(x, loss, ev, n_boot=0)
    assert np.isnan(rec.measured[[0, 7]]).all()
    assert rec.drop_share_events == pytest.approx(1.0, abs=1e-9)  # both drops from the first measured point
    assert rec.r2_events == pytest.approx(1.0, abs=1e-3)


# -- 3. the rows a fit leaves out, said ------------------------------------------------------------


def test_tokdyn_fit_says_which_rows_it_left_out_and_why(tmp_path, capsys):
    Y, _ = _planted(2)
    s = str(_store(tmp_path / "s.zarr", Y, fit=False).url)
    assert main(["fit", s, "--no-progress", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "on 20 points" in out and "left out: 1 row at step 0 (no place on a log axis)" in out
    assert main(["fit", s, "--no-progress", "--workers", "1", "--refit", "--axis-min", "10", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_points"] + summary["n_rows_left_out"] == len(STEPS)
    assert summary["rows_left_out"] == ("left out: 1 row at step 0 (no place on a log axis); "
                                        "3 rows at steps 4-8 (before the fit window, --axis-min 10)")  # fmt: skip
    rec = _rec(tokdyn.open_store(s))
    assert rec.summary()["rows_left_out"] == summary["rows_left_out"]
    page = tokdyn.write_report(s, tmp_path / "r.html").read_text()
    assert "3 rows at steps 4-8 (before the fit window, --axis-min 10)" in page


def test_a_fit_of_every_row_says_nothing_left_out(tmp_path, capsys):
    Y, _ = _planted(3)
    s = _store(tmp_path / "s.zarr", Y[:, 1:], STEPS[1:], fit=False)
    res = tokdyn.fit_run(s.run("r"), progress=False, workers=1)
    assert res.rows_left_out is None and res.n_rows_left_out == 0
