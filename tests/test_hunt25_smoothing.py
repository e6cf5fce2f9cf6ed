"""Hunt 25, the measured derivative's default width (tokdyn.reconstruct.default_smoothing).

The width was 1.5 x the median spacing of the log axis: on a grid dense in one part (Pythia's
checkpoints, every step then a few) it was that part's width everywhere and the measured
-dL/dlog10 step mostly noise. Now at least 1.25 x the mean spacing; grids with mean / median
spacing up to 1.2 (log-uniform ones, the demo's) keep the old width bit for bit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from pipeline_scripts import load
from test_hostile import fitted_store
from test_hunt25_diverge import run_cli
from tokdyn.reconstruct import default_smoothing, measured_derivative, scores
from tokdyn.schedule import geometric_schedule

check = load("smoothing_check")
GRIDS = check.grids()


def old_width(x) -> float:
    return 1.5 * float(np.median(np.diff(x)))


@pytest.mark.parametrize("name, bound", [("Pythia (1..143,000)", 0.95), ("dense-then-sparse (1..199, 8 to 1e6)", 0.8)])
def test_uneven_grids_measure_the_planted_derivative(name, bound):
    """Planted events on an uneven grid, 4000 tokens, noise 0.3 nats: the measured derivative is
    the planted one (R^2 >= bound on every seed). The median's width scored at most 0.75 and -2.6."""
    x = GRIDS[name]
    for seed in range(5):
        noisy, clean, exact = check.planted(x, seed=seed, tokens=4000, noise=0.3)
        assert scores(measured_derivative(x, clean), exact)["r2"] > 0.98  # the positive control: no noise
        assert scores(measured_derivative(x, noisy), exact)["r2"] >= bound, seed


@pytest.mark.parametrize("name", ["log-spaced (1..1e5, 40)", "demo (geometric 800, 40)"])
def test_even_grids_keep_the_old_width_bit_for_bit(name):
    x = GRIDS[name]
    assert default_smoothing(x) == old_width(x)
    noisy, _, _ = check.planted(x, seed=0, tokens=500, noise=0.5)
    assert np.array_equal(measured_derivative(x, noisy), measured_derivative(x, noisy, smoothing=old_width(x)))
    assert np.array_equal(measured_derivative(x, noisy), reference_derivative(x, noisy, old_width(x)))  # the old code's


@settings(max_examples=60, deadline=None)
@given(lo=hs.floats(-2, 6), span=hs.floats(0.5, 8), n=hs.integers(3, 300))
def test_log_uniform_grids_keep_the_old_width(lo, span, n):
    """Any log-uniform grid (mean = median spacing up to rounding): the old width, exactly."""
    x = np.linspace(lo, lo + span, n)
    assert default_smoothing(x) == old_width(x)


@settings(max_examples=60, deadline=None)
@given(last=hs.integers(100, 10**7), n=hs.integers(5, 40))
def test_geometric_schedules_keep_the_old_width_where_nearly_even(last, n):
    s = geometric_schedule(last, n)
    x = np.log10(s[s > 0].astype(float))
    d = np.diff(x)
    if d.mean() <= 1.2 * np.median(d):
        assert default_smoothing(x) == old_width(x)
    assert default_smoothing(x) >= 1.25 * d.mean() * (1 - 1e-12)  # never narrower than 1.25 mean gaps


def test_width_ignores_how_the_points_cluster():
    """The same span and count, points bunched at one end: the width never falls below 1.25x the
    even grid's spacing (it fell with the bunch's median)."""
    even = np.linspace(0, 5, 101)
    bunched = np.concatenate([np.linspace(0, 4, 6)[:-1], np.linspace(4, 5, 96)])
    assert default_smoothing(bunched) >= 1.25 * 0.05 - 1e-15 > old_width(bunched)
    assert default_smoothing(even) == old_width(even)


# -- the CLI's --smoothing ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-0.1", "nan", "inf", "-inf", "1e-400"])
def test_cli_refuses_a_width_that_is_no_positive_number_in_one_line(tmp_path, capsys, value):
    """Refused before the store is opened (an axis would be assembled and fitted first)."""
    code, out, err = run_cli(["reconstruct", str(tmp_path / "none.zarr"), f"--smoothing={value}"], capsys)
    assert code != 0 and not out
    assert err.strip().count("\n") == 0 and "--smoothing must be a positive, finite number of decades" in err
    assert value in err and "Traceback" not in err


def test_cli_refuses_a_width_that_is_no_number_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(["reconstruct", str(tmp_path / "none.zarr"), "--smoothing", "wide"], capsys)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid float value: 'wide'" in err.strip().splitlines()[-1]


@pytest.mark.slow  # a fit (its kernels' first compile: about 35 s)
def test_cli_width_is_used_and_reported(tmp_path, capsys):
    fitted_store(tmp_path / "s.zarr")
    code, out, _ = run_cli(["reconstruct", str(tmp_path / "s.zarr"), "--json", "--boot", "0"], capsys)
    default = json.loads(out)
    x = np.log10(np.unique(np.round(np.geomspace(1, 1000, 14)).astype(int)).astype(float))
    assert code == 0 and default["smoothing"] == default_smoothing(x)
    code, out, _ = run_cli(["reconstruct", str(tmp_path / "s.zarr"), "--json", "--boot", "0", "--smoothing", "0.4"], capsys)
    wide = json.loads(out)
    assert code == 0 and wide["smoothing"] == 0.4 and wide["r2_events"] != default["r2_events"]
    code, out, _ = run_cli(["reconstruct", str(tmp_path / "s.zarr"), "--boot", "0", "--smoothing", "0.4"], capsys)
    assert code == 0 and "local quadratics 0.4 decades wide" in out


# -- the library's smoothing= -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [True, np.bool_(True), "0.3", "abc", np.array([0.1, 0.2]), np.array(0.2), [0.2], 10**400,
                                 0, -1e-3, float("nan"), float("inf"), None.__class__], ids=lambda v: repr(v)[:24])
def test_library_refuses_a_width_that_is_no_positive_number(bad):
    """One InputError each: a bool or a string was taken as a width (True as 1 decade), an array,
    a list or a huge int raised numpy's or Python's own error."""
    from tokdyn.errors import InputError
    x = np.linspace(0, 3, 20)
    with pytest.raises(InputError, match="smoothing must be a positive, finite number of decades"):
        measured_derivative(x, np.exp(-x), smoothing=bad)


@pytest.mark.parametrize("good", [0.2, 1, np.float32(0.2), np.int64(1), 1e-320, 1e300])
def test_library_takes_any_positive_real_width(good):
    x = np.linspace(0, 3, 20)
    d = measured_derivative(x, np.exp(-x), smoothing=good)
    assert np.all(np.isfinite(d)) and np.array_equal(d, measured_derivative(x, np.exp(-x), smoothing=float(good)))


# -- many checkpoints ---------------------------------------------------------------------------


def reference_derivative(x, loss, h):
    """The estimator as its docstring says it, over every point (each point's weights over all
    others, its width floored to reach its 3 nearest): the answer the windowed one must give."""
    ok = np.isfinite(loss)
    xo, lo = x[ok], loss[ok]
    out = np.empty(x.size)
    for k, xk in enumerate(x):
        d = xo - xk
        hk = max(h, 0.5 * float(np.sort(np.abs(d))[min(3, d.size - 1)]))
        w = np.sqrt(np.exp(-0.5 * (d / hk) ** 2))
        coef, *_ = np.linalg.lstsq(np.stack([np.ones_like(d), d, d * d], axis=1) * w[:, None], lo * w, rcond=None)
        out[k] = -coef[1]
    out[~ok] = np.nan
    return out


@settings(max_examples=25, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1), n=hs.integers(3, 400), nan_share=hs.sampled_from([0.0, 0.2]),
       scale=hs.sampled_from([None, 0.01, 0.3]))
def test_windowed_derivative_is_the_estimator_over_every_point(seed, n, nan_share, scale):
    rng = np.random.default_rng(seed)
    x = np.unique(np.concatenate([np.log10(np.arange(1, n + 1)), rng.uniform(0, 6, n // 3)]))
    loss = 3 / (1 + np.exp((x - 2) / 0.3)) + rng.normal(0, 0.05, x.size)
    loss[rng.random(x.size) < nan_share] = np.nan
    if np.isfinite(loss).sum() < 3:
        return
    h = default_smoothing(x) if scale is None else scale
    np.testing.assert_allclose(measured_derivative(x, loss, smoothing=scale), reference_derivative(x, loss, h),
                               rtol=1e-7, atol=1e-9 * np.nanmax(np.abs(loss)) / h)


def test_a_checkpoint_every_step_is_measured_in_seconds(monkeypatch):
    """Every step to 40,000: each point's quadratic was fitted over all 40,000 (and all sorted),
    about 90 s here and 20 minutes at Pythia's 143,000; the points beyond 56 widths weigh exactly
    0 and are left out (the windowed estimator is the whole one: the property test above). The
    work is counted, not timed: the rows of all the least-squares fits (40,000^2 before; about
    3e7 now, the sparse first decades reaching every point), stopped once past the bound."""
    x = np.log10(np.arange(1, 40_001, dtype=float))
    loss = 3 / (1 + np.exp((x - 2.5) / 0.3))  # noise-free: the default width is no noise filter here
    lstsq, rows = np.linalg.lstsq, [0]

    def counted(A, b, **kwargs):
        rows[0] += A.shape[0]
        assert rows[0] <= x.size**2 // 20, "each point's quadratic is fitted over far more points than its weights reach"
        return lstsq(A, b, **kwargs)

    monkeypatch.setattr(np.linalg, "lstsq", counted)
    d = measured_derivative(x, loss)
    monkeypatch.undo()
    exact = 3 / 0.3 * np.exp((x - 2.5) / 0.3) / (1 + np.exp((x - 2.5) / 0.3)) ** 2
    assert scores(d, exact)["r2"] > 0.999


def test_the_benchmark_script_prints_its_table(capsys):
    check.main(["--seeds", "2", "--tokens", "300", "--c", "1.5"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| grid")]
    assert [r.split(" | ")[0][2:] for r in rows] == list(GRIDS) and lines[-1].startswith("R^2 against the planted")
    assert all(len(r.split(" | ")) == 8 for r in rows)
