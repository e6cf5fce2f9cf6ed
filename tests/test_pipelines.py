"""Smoke tests of the end-to-end entry points at tiny sizes: the demo, train_tiny.py, scaling_sweep.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokdyn
from tokdyn.cli import main
from tokdyn.fit import read_fit

import pipeline_scripts

ROOT = Path(__file__).resolve().parents[1]


def test_demo_records_and_fits(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "12", "--points", "8", "--probe-sequences", "6", "--no-progress"]) == 0
    # strict JSON: a NaN (an exponent without an interval on a run this short) is null, not NaN
    summary = json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))
    run = tokdyn.open_store(out / "store.zarr", mode="r").run("tiny")
    assert summary["checkpoints_recorded"] == run.n_committed == len(summary["steps"])
    assert summary["steps"][0] == 0 and summary["steps"][-1] == 12
    assert summary["tokens_recorded"] == 6 * 128
    assert summary["mean_probe_loss_last"] < summary["mean_probe_loss_first"]  # it learned something
    fit = read_fit(out / "store.zarr", "tiny", fields=("status",))
    assert fit["status"].shape == (6 * 128,)
    assert abs(sum(summary["fit"]["class_counts"].values()) - 6 * 128) == 0
    assert "share of the loss drop" in capsys.readouterr().out
    rec = summary["reconstruction"]
    for key in ("r2_sigmoid_sum", "r2_spectrum", "rel_l2_sigmoid_sum", "drop_share_events", "bandwidth_decades"):
        assert np.isfinite(rec[key]), key
    assert set(summary["class_shares_of_loss_drop"]) >= {"learned", "multi_step", "gradual"}
    assert summary["tokens_fitted"] <= 6 * 128
    assert {"corpus_s", "train_record_s", "fit_s", "spectrum_s", "report_s", "total_s"} <= set(summary["timings_s"])
    html = (out / "report.html").read_text()
    assert html.count("<img") >= 6 and "tokdyn demo" in html


def test_demo_refuses_an_unwritable_output(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["demo", "--out", str(tmp_path / "file"), "--steps", "2", "--no-progress"]) == 1
    assert "not a folder" in capsys.readouterr().err


def test_train_tiny_pipeline(tmp_path):
    store = tmp_path / "t.zarr"
    cmd = [sys.executable, str(ROOT / "pipelines" / "train_tiny.py"), "--out", str(store), "--steps", "6", "--points", "4",
           "--probe-sequences", "4", "--context", "32", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--dtype", "float16"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    run = tokdyn.open_store(store, mode="r").run("tiny")
    assert run.dtype == np.float16 and run.n_committed == stats["rows_recorded"]
    assert run.attrs["model_config"]["n_layer"] == 1 and run.attrs["n_params_non_embedding"] > 0


def test_scaling_sweep_quick(tmp_path):
    out = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "pipelines" / "scaling_sweep.py"), "--out", str(out), "--quick", "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    head = json.loads(proc.stdout.strip().splitlines()[-1])
    assert head["quick"] and head["n_tokens"] == 8 * 32
    result = json.loads((out / "sweep.json").read_text())
    st = tokdyn.open_store(out / "store.zarr", mode="r")
    for axis, points in (("D", 20), ("M", 8)):
        run = st.run(f"axis-{axis}")
        assert run.axis == axis and run.n_committed == points
        assert np.all(np.diff(run.axis_values) > 0)
        assert np.isfinite(result["axes"][axis]["r2_events"])
    # the D axis's points are the branches' data budgets, <= 0.1 decade apart; M averages 2 seeds a size
    budgets = [st.run(f"D{i:02d}").attrs["data_budget"] for i in range(20)]
    np.testing.assert_allclose(st.run("axis-D").axis_values, budgets)
    assert np.diff(np.log10(budgets)).max() <= 0.1 and st.run("D-trunk").axis == "T"
    assert len(st.run("axis-M").attrs["sources"]) == 16
    # calibration branches (15 % and 30 % decays) are no D point; each set calibrates a gain
    cal = [n for n in st.runs if n.startswith("D-cal")]
    assert len(cal) >= 6 and not set(cal) & {s["run"] for s in st.run("axis-D").attrs["sources"]}
    assert set(result["annealing_gain"]) == {"0.15", "0.3"}
    for key in ("D", "M", "D_from_T_tokens", "D_from_T_lr_area", "D_from_T_annealing_15", "D_from_T_annealing_30"):
        assert np.isfinite(head[key]["r2_events"]) and np.isfinite(head[key]["rel_l2_spectrum_interior"]), key
    assert (out / "report.html").stat().st_size > 10_000


def _git_checkout() -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_bench_fit_reports_the_solvers_steps_and_the_time_outside_kernels(backend):
    """bench_fit's JSON line carries the mean solver steps of the sigmoid and of the two
    sigmoids (what a rate is made of, whatever the machine's speed), each at least one step
    and at most max_iter (plus its restarts) per trajectory; and on numba the share of each
    fit's time outside its compiled kernels (none on numpy, which has no kernels)."""
    pytest.importorskip(backend)
    cmd = [sys.executable, str(ROOT / "pipelines" / "bench_fit.py"), "--n", "200", "--n-scipy",
           "10", "--repeat", "1", "--backend", backend, "--real", ""]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 1.0 <= out["steps_sigmoid"] <= 300 and 1.0 <= out["steps_two_sigmoids"] <= 100, out
    if backend == "numpy":
        assert out["outside_kernels_frac"] is None
    else:
        assert set(out["outside_kernels_frac"]) == {"sigmoid", "full"}
        assert all(0.0 < f < 1.0 for f in out["outside_kernels_frac"].values()), out


def test_bench_fit_against_a_revision_times_both_in_their_own_processes(tmp_path):
    """bench_fit --against HEAD: both sides are this code, so they fit identically (the digest
    covers every field), each pair holds two positive rates, and the temporary worktree is
    gone afterwards."""
    if not _git_checkout():
        pytest.skip("not a git checkout")
    before = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                            text=True).stdout
    cmd = [sys.executable, str(ROOT / "pipelines" / "bench_fit.py"), "--against", "HEAD",
           "--pairs", "2", "--n", "300", "--repeat", "1", "--backend", "numpy"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "fit_against" and out["base"] == out["head"] and out["pairs"] == 2
    assert out["identical_fits"] is True
    assert len(out["fits_per_s"]) == 2 and all(a > 0 and b > 0 for a, b in out["fits_per_s"])
    lo, hi = out["speedup_range"]
    assert lo <= out["speedup_median"] <= hi
    after = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                           text=True).stdout
    assert after == before
    # the digest is of the fits themselves: other rows give another, the same rows the same
    x = np.linspace(1.0, 4.0, 30)
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        mu = rng.uniform(2.0, 3.0, (40, 1))
        Y = 1.0 + 3.0 / (1.0 + np.exp((x - mu) / 0.3)) + 0.1 * rng.standard_normal((40, 30))
        np.savez(tmp_path / f"{name}.npz", x=x, Y=Y)
    child = [sys.executable, str(ROOT / "pipelines" / "bench_fit.py"), "--repeat", "1",
             "--backend", "numpy", "--child"]
    digests = [json.loads(subprocess.run([*child, str(tmp_path / f"{name}.npz")],
                                         capture_output=True, text=True, timeout=300,
                                         check=True).stdout)["digest"]
               for name in ("a", "a", "b")]
    assert digests[0] == digests[1] != digests[2]


def test_bench_fit_times_a_store_fit_against_a_revision(tmp_path):
    """bench_fit --store-tokens --against HEAD: one store, `tokdyn fit` by both trees in
    alternated children; the same code stores the same fit, and the worktree is gone after."""
    if not _git_checkout():
        pytest.skip("not a git checkout")
    before = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    cmd = [sys.executable, str(ROOT / "pipelines" / "bench_fit.py"), "--store-tokens", "300", "--store-rows", "20",
           "--against", "HEAD", "--pairs", "2", "--backend", "numpy"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "fit_store_against" and out["base"] == out["head"] and out["pairs"] == 2
    assert out["identical_fits"] is True
    assert [len(out["wall_s"][who]) for who in ("base", "head")] == [2, 2]
    assert all(w > 0 for who in ("base", "head") for w in out["wall_s"][who])
    lo, hi = out["speedup_range"]
    assert lo <= out["speedup_median"] <= hi
    after = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert after == before


def _bench_fit_compile(*args: str) -> dict:
    cmd = [sys.executable, str(ROOT / "pipelines" / "bench_fit.py"), "--compile", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bench_fit_compile_times_a_first_fit_and_one_from_the_cache():
    """bench_fit --compile: one run per side, each a first fit (with an empty numba cache)
    and a second one; numpy compiles nothing, so its cache folder stays empty."""
    out = _bench_fit_compile("--backend", "numpy")
    assert out["bench"] == "fit_compile" and list(out["runs"]) == ["head"]
    (run,) = out["runs"]["head"]
    assert run["cache_files"] == 0
    assert run["first_s"] == pytest.approx(run["first_sigmoid_s"] + run["first_full_s"], abs=0.02)
    assert run["first_s"] > 0 and run["cached_s"] > 0


@pytest.mark.slow
def test_bench_fit_compile_fills_an_empty_cache_that_the_next_fit_loads():
    """With numba the first fit compiles into the empty cache folder (files appear there) and
    the second process loads them: much faster than compiling."""
    pytest.importorskip("numba")
    (run,) = _bench_fit_compile("--backend", "numba")["runs"]["head"]
    assert run["cache_files"] > 0
    assert run["cached_s"] < 0.5 * run["first_s"], run


def _bench_kernels():
    return pipeline_scripts.load("bench_kernels")


def test_a_pipeline_scripts_cached_kernels_load_on_the_next_run(tmp_path):
    """The tests import a script's module as pipeline_scripts.load gives it; numba's cache of a
    ``cache=True`` function there names that module, and the next run, which loads the cache,
    imports it by that name (two of the bound's tests failed on every run after the first)."""
    code = ("import sys; sys.path.insert(0, 'tests'); import numpy as np, pipeline_scripts; "
            "m = pipeline_scripts.load('two_sigmoid_bound'); "
            "print(m.segment_sse(np.array([1.0, 0.0, 2.0]), 1.0)[0, 3])")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    assert list(tmp_path.rglob("*.nbi")), "the first run cached nothing: the test tests nothing"
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    # the best rising fit to (1, 0, 2): (0.5, 0.5, 2), a sum of squares of 0.5
    assert [float(r.stdout) for r in runs] == [0.5, 0.5]


def test_bench_kernels_loads_a_revision_under_its_own_module_names(tmp_path, monkeypatch):
    """REV's kernel modules import each other under the new names (so no compiled function
    is shared with this checkout's), and the identity check sees one bit."""
    if not _git_checkout():
        pytest.skip("not a git checkout")
    bench = _bench_kernels()
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        rev = bench.load_revision("HEAD", tmp_path)
        assert rev["varpro"].__name__ == "_rev_varpro"
        assert rev["varpro"].lane_sums.__module__ == "_rev_lanes"
        assert rev["varpro"]._cholesky_solve.py_func.__module__ == "_rev_numba_kernels"
        assert rev["numba_kernels"]._sigmoid_columns.py_func.__module__ == "_rev_numba_kernels"
    finally:
        for name in bench.MODULES:
            sys.modules.pop(f"_rev_{name}", None)
    a = (np.array([1.0, np.nan]), np.arange(3))
    assert bench.same([a], [(a[0].copy(), a[1].copy())])
    assert not bench.same([a], [(np.nextafter(a[0], 2.0), a[1])])
    assert not bench.same([a], [(a[0], np.arange(4))])
    with pytest.raises(SystemExit, match="cannot read"):
        bench.load_revision("no-such-revision", tmp_path)
    # a revision's kernel that cannot take this checkout's arguments is reported, not raised

    def old_kernel(x, Y):
        raise TypeError("takes 7 positional arguments\nbut 8 were given")

    call = ("varpro", "grid_start_block", (np.zeros(3), np.zeros((4, 3))), {})
    got = bench.compare([call], {"varpro": type("Rev", (), {"grid_start_block": staticmethod(old_kernel)})}, 1)
    assert got == {"rows": 4, "skipped": "the revision's fails here: TypeError: takes 7 positional arguments"}


@pytest.mark.slow
def test_bench_kernels_against_head_is_identical(tmp_path):
    """bench_kernels --against HEAD (a clean checkout): every kernel's outputs identical on both
    sides, positive times, the speed-up inside its range. Compiles HEAD's kernels afresh."""
    if not _git_checkout():
        pytest.skip("not a git checkout")
    cmd = [sys.executable, str(ROOT / "pipelines" / "bench_kernels.py"), "--against", "HEAD",
           "--n", "300", "--repeat", "1", "--data", "planted"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    kernels = out["planted"]
    assert {"grid_start_block", "varpro_block/4", "varpro_block/7", "two_start_block"} <= set(kernels)
    for name, k in kernels.items():
        assert k["rev_us_per_row"] > 0 and k["head_us_per_row"] > 0, name
        assert k["speedup_range"][0] <= k["speedup_median"] <= k["speedup_range"][1]
        if not out["head_uncommitted_changes"]:
            assert k["identical"] is True, name


def test_bench_spectrum_times_both_sides_and_says_how_far_apart_they_are():
    cmd = [sys.executable, str(ROOT / "pipelines" / "bench_spectrum.py"), "--tokens", "500", "--boot", "5", "--repeat", "1"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout.splitlines()[-1])
    assert out["events"] == 1000 and out["boot"] == 5
    assert out["reference_spectrum_s"] > 0 and out["compiled_spectrum_s"] > 0 and out["boot_speedup"] > 0
    assert 0 <= out["max_diff_over_peak"] < 1e-3 and out["total_drop_rel_diff"] < 1e-12
