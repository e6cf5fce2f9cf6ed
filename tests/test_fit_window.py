"""A fit window (``fit_run(axis_min=...)``, ``tokdyn fit --axis-min``): which rows a fit uses, that
everything reading the fit uses the same rows, and why a run with a warm-up is fitted after it."""

from __future__ import annotations

import numpy as np
import pytest

import tokdyn
from tokdyn.cli import main
from tokdyn.errors import InputError, StoreError
from tokdyn.fit.job import fit_inputs, fit_run, fitted_inputs
from tokdyn.reconstruct import reconstruct, reconstruct_run
from tokdyn.spectrum import run_events
from tokdyn.store import as_store

N = 600
STEPS = np.unique(np.round(np.geomspace(1, 3000, 36)).astype(int))
WARMUP = 10


def sig(x, mu, s):
    return 1.0 / (1.0 + np.exp(-(x - mu) / s))


def planted(rng, n=N):
    """Per-token losses [n, steps] and the noise-free mean curve's parts.

    Every token falls from chance during the warm-up (an event near step 3, as the rate ramps
    up), then its loss rises a little in a bump (around steps 20-60) and later falls in its
    learning event (steps 100-2000): three events, one more than a two-sigmoid fit can carry
    over the whole run, two after the warm-up.
    """
    x = np.log10(STEPS)
    warm = 2.0 * (1 - sig(x[None, :], np.log10(3.0), 0.08))
    mu_b, mu_l = rng.uniform(1.3, 1.8, n), rng.uniform(2.0, 3.3, n)
    bump = rng.uniform(0.2, 0.5, n)[:, None] * sig(x[None, :], mu_b[:, None], 0.08)
    learn = rng.uniform(0.8, 2.0, n)[:, None] * (1 - sig(x[None, :], mu_l[:, None], rng.uniform(0.08, 0.2, n)[:, None]))
    clean = 1.0 + warm + bump + learn
    return clean + rng.normal(0, 0.03, clean.shape), clean.mean(0)


def make_store(path, Y):
    rng = np.random.default_rng(1)
    n = Y.shape[0]
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32) // 50, "token_pos": (np.arange(n) % 50 + 1).astype(np.int32),
                                   "token_id": rng.integers(0, 40, n).astype(np.int32)})  # fmt: skip
    st = tokdyn.open_store(path, probe, mode="w")
    w = st.create_run("main", capacity=len(STEPS) + 1).writer()
    w.append(np.full(n, 6.0), step=0)
    for j, step in enumerate(STEPS):
        w.append(Y[:, j], step=int(step))
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    Y, _ = planted(np.random.default_rng(0))
    return make_store(tmp_path_factory.mktemp("win") / "w.zarr", Y.clip(0.01))


def test_fit_window_rows_are_stored_and_read_back(store_path):
    r = as_store(store_path, mode="r+").run("main")
    rows_all, x_all = fit_inputs(r)
    assert rows_all[0] == 1 and x_all.size == STEPS.size  # step 0 is never fitted
    res = fit_run(r, progress=False, refit=True, axis_min=WARMUP, options=tokdyn.FitOptions(two_step=False))
    keep = STEPS >= WARMUP
    assert res.n_points == keep.sum() and res.axis_min == WARMUP
    rows, x = fitted_inputs(r)
    assert np.array_equal(rows, 1 + np.flatnonzero(keep))
    np.testing.assert_allclose(x, np.log10(STEPS[keep]))
    assert r.fit.meta["axis_min"] == WARMUP
    # everything that reads the fit uses its rows
    rec = reconstruct_run(r, n_boot=0)
    np.testing.assert_allclose(rec.x, x)
    assert rec.mean_loss.size == keep.sum()
    fit = r.fit.read(("x_first",))
    assert np.nanmin(fit["x_first"]) == pytest.approx(np.log10(STEPS[keep][0]))
    # the fit is resumed only with the same window; another one needs --refit
    fit_run(r, progress=False, axis_min=float(WARMUP), options=tokdyn.FitOptions(two_step=False))
    with pytest.raises(StoreError, match=r"another axis_min \(10 then, 5 now\); pass axis_min=10 \(--axis-min 10\) to resume"):
        fit_run(r, progress=False, axis_min=5, options=tokdyn.FitOptions(two_step=False))
    with pytest.raises(StoreError, match=r"another axis_min \(10 then, none now\)"):
        fit_run(r, progress=False, options=tokdyn.FitOptions(two_step=False))
    fit_run(r, progress=False, refit=True, options=tokdyn.FitOptions(two_step=False))
    assert fitted_inputs(r)[0].size == STEPS.size


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "ten", 1e9, 3000.5])
def test_fit_window_refuses_in_one_clear_error(store_path, bad):
    r = as_store(store_path, mode="r+").run("main")
    with pytest.raises(InputError, match="axis_min"):
        fit_run(r, progress=False, refit=True, axis_min=bad)


def test_cli_axis_min(store_path, capsys):
    assert main(["fit", str(store_path), "--run", "main", "--axis-min", "100", "--no-two-step", "--refit", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"on {(STEPS >= 100).sum()} points (axis values >= 100)" in out
    assert main(["fit", str(store_path), "--run", "main", "--axis-min", "1e9", "--no-progress", "--refit"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "axis values >= 1e+09" in err[0] and "Traceback" not in err[0]
    assert main(["fit", str(store_path), "--run", "main", "--axis-min", "nan", "--no-progress", "--refit"]) == 1
    assert "--axis-min must be a finite number" in capsys.readouterr().err


def test_window_after_warmup_rebuilds_the_planted_derivative(tmp_path):
    """Positive control on planted ground truth: three events per token over the run, two after
    the warm-up. The events of a fit after the warm-up rebuild the true -dL/dlog10 step there;
    a fit over every step spends one of each token's two events on the warm-up and does not."""
    Y, clean = planted(np.random.default_rng(5))
    path = make_store(tmp_path / "p.zarr", Y.clip(0.01))
    r = as_store(path, mode="r+").run("main")
    keep = STEPS >= WARMUP
    xk = np.log10(STEPS[keep])
    truth = -np.gradient(clean[keep], xk)  # the planted mean curve's slope, no noise

    def r2(pred):
        return 1 - ((pred - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum()

    scores = {}
    for axis_min in (None, WARMUP):
        fit_run(r, progress=False, refit=True, axis_min=axis_min)
        ev = run_events(r)
        curve = ev.curve(xk)
        scores[axis_min] = r2(-np.gradient(curve, xk))
    assert scores[WARMUP] > 0.95, scores
    assert scores[WARMUP] > scores[None] + 0.1, scores
    # and through the library's own estimator, on the window's points
    rec = reconstruct(xk, Y[:, keep].mean(0), run_events(r), n_boot=0)
    assert rec.r2_events > 0.9


@pytest.mark.parametrize("rows, x", [
    ([1, 2], None),                       # x of other rows
    ([3, 1], "same"),                     # not increasing
    ([1, 99], "same"),                    # beyond the committed rows
    ([[1, 2]], "same"),                   # not 1-D
    (["a", "b"], [0.0, 0.1]),             # not integers
    (None, None),                         # missing
])
def test_fitted_inputs_refuse_a_damaged_record(tmp_path, rows, x):
    Y, _ = planted(np.random.default_rng(2), n=100)
    r = as_store(make_store(tmp_path / "d.zarr", Y.clip(0.01)), mode="r+").run("main")
    fit_run(r, progress=False, axis_min=WARMUP, options=tokdyn.FitOptions(two_step=False))
    meta = dict(r.fit.meta)
    if rows is None:
        del meta["rows"]
    else:
        meta["rows"] = rows
        meta["x"] = np.log10(STEPS[5:7]).tolist() if x is None else (meta["x"][: len(rows)] if x == "same" else x)
    r.fit._group().update_attributes({"tokdyn_fit": meta})
    with pytest.raises(StoreError, match="refit it"):
        fitted_inputs(r)
    with pytest.raises(StoreError, match="refit it"):
        reconstruct_run(r, n_boot=0)


@pytest.mark.parametrize("axis_min", [0.5, 4, 10.0, 99.9, 300, 1000])
def test_a_window_fit_equals_the_fit_of_the_sliced_arrays(tmp_path, axis_min):
    """Invariance: the stored fit with a window is the fit of the same losses with the rows
    below the window cut off beforehand (fit_sigmoids on arrays, no store)."""
    from tokdyn.fit import fit_sigmoids

    Y, _ = planted(np.random.default_rng(3), n=200)
    Y = Y.clip(0.01).astype(np.float32)  # what the store holds
    r = as_store(make_store(tmp_path / "s.zarr", Y), mode="r+").run("main")
    keep = STEPS >= axis_min
    if keep.sum() < tokdyn.FitOptions().min_points:  # every token would be too_few_points
        with pytest.raises(InputError, match=f"{keep.sum()} rows to fit at axis values >= {axis_min:g}"):
            fit_run(r, progress=False, axis_min=axis_min, options=tokdyn.FitOptions(two_step=False))
        return
    fit_run(r, progress=False, axis_min=axis_min, options=tokdyn.FitOptions(two_step=False))
    ref = fit_sigmoids(np.log10(STEPS[keep]), Y[:, keep].astype(np.float64), two_step=False)
    got = r.fit.read(("mu", "s", "delta", "sse", "status"))
    np.testing.assert_array_equal(got["status"], ref.status)
    for name in ("mu", "s", "delta", "sse"):
        np.testing.assert_allclose(got[name], getattr(ref, name), rtol=1e-6, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("damaged", ["ten", True, float("nan"), [10]])
def test_a_damaged_stored_window_is_one_clear_error(tmp_path, damaged):
    """A fit whose stored axis_min is not a number: resuming, and reading the window, end in one
    StoreError (never a TypeError from formatting or comparing it)."""
    from tokdyn.fit.job import stored_axis_min

    Y, _ = planted(np.random.default_rng(4), n=100)
    r = as_store(make_store(tmp_path / "w.zarr", Y.clip(0.01)), mode="r+").run("main")
    fit_run(r, progress=False, axis_min=WARMUP, options=tokdyn.FitOptions(two_step=False))
    meta = dict(r.fit.meta)
    meta["axis_min"] = damaged if not (isinstance(damaged, float) and damaged != damaged) else "NaN"
    r.fit._group().update_attributes({"tokdyn_fit": meta})
    with pytest.raises(StoreError, match="another axis_min"):
        fit_run(r, progress=False, axis_min=WARMUP, options=tokdyn.FitOptions(two_step=False))
    with pytest.raises(StoreError, match="not a number"):
        stored_axis_min(r)


def test_a_stale_window_fit_says_how_to_refit_it_with_its_window(tmp_path, capsys):
    """Rows appended after a window fit: every reader (the report asked for that run too) says
    the fit is stale, and the command it gives keeps the fit's window (following the old advice
    silently dropped it)."""
    Y, _ = planted(np.random.default_rng(6), n=100)
    path = make_store(tmp_path / "w.zarr", Y.clip(0.01))
    r = as_store(path, mode="r+").run("main")
    fit_run(r, progress=False, axis_min=WARMUP, options=tokdyn.FitOptions(two_step=False))
    w = r.writer(resume=True)
    w.append(Y[:, -1], step=int(STEPS[-1]) * 2)
    w.release()
    for argv in (["spectrum", str(path), "--run", "main"], ["report", str(path), "--run", "main", "--out", str(tmp_path / "r.html")]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "was made on" in err, err
        assert f"--run main --axis-min {WARMUP:g} --no-two-step --refit" in err, err  # its window and options
