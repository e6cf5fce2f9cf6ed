"""D/M axes assembled from runs, per-token statistics, the CLI of the spectrum stage and the report."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hst
import pytest

import tokdyn
from tokdyn.store import as_store
from tokdyn.axes import assemble_axis, axis_sources, find_axis_run
from tokdyn.cli import main
from tokdyn.errors import InputError, ProbeMismatchError, RunExistsError, StoreError
from tokdyn.fit.job import fit_run
from tokdyn.reconstruct import reconstruct_run
from tokdyn.report import write_report
from tokdyn.tokenstats import frequency_bands, position_bands, token_stats

N = 1500
BUDGETS = np.geomspace(1e5, 1e8, 10)  # tokens


def make_probe(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32) // 50, "token_pos": (np.arange(n) % 50 + 1).astype(np.int32),
                                  "token_id": rng.integers(0, 40, n).astype(np.int32)})  # fmt: skip


def planted_axis(seed=0):
    """Per-token losses at each budget: one sigmoid in log10 budget per token, small noise."""
    rng = np.random.default_rng(seed)
    x = np.log10(BUDGETS)
    mu = rng.uniform(5.5, 7.5, N)
    s = rng.uniform(0.05, 0.2, N)
    d = rng.uniform(1, 4, N)
    Y = 1 + d[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / s[:, None]))
    return (Y + rng.normal(0, 0.05, Y.shape)).clip(0.01)


def budget_store(path, *, budgets=BUDGETS, probe=None, tag=None):
    """One T run per budget (three checkpoints each; the last holds the planted final losses)."""
    Y = planted_axis()
    st = tokdyn.open_store(path, probe or make_probe(), mode="w")
    for j, b in enumerate(budgets):
        attrs = {"data_budget": float(b), "model_config": {"n_layer": 2}, **({"sweep": tag} if tag else {})}
        w = st.create_run(f"d{j}", capacity=3, attrs=attrs).writer()
        col = int(np.argmin(np.abs(np.log(BUDGETS / b))))  # the planted column of this budget
        for k, step in enumerate((0, 10, 100)):
            w.append(Y[:, col] + (2 - k), step=step)
    return st, Y


@pytest.fixture(scope="module")
def budget_template(tmp_path_factory):
    path = tmp_path_factory.mktemp("axis") / "a.zarr"
    _, Y = budget_store(path)
    return path, Y


@pytest.fixture
def budgets(budget_template, tmp_path):
    """A fresh copy of the ten-budget store (building it is the slow part)."""
    src, Y = budget_template
    shutil.copytree(src, tmp_path / "a.zarr")
    return tokdyn.open_store(tmp_path / "a.zarr", mode="r+"), Y


def test_assemble_axis_takes_final_rows_sorted_by_budget(budgets):
    st, Y = budgets
    assert sorted(axis_sources(st, "D")) == [f"d{j}" for j in range(10)]
    order = [3, 1, 0, 2, 9, 8, 5, 4, 6, 7]
    run = assemble_axis(st, "D", runs=[f"d{j}" for j in order])
    assert run.name == "axis-D" and run.axis == "D" and find_axis_run(st, "D") == "axis-D"
    np.testing.assert_allclose(run.axis_values, BUDGETS)
    np.testing.assert_allclose(run.losses(), Y.T, rtol=1e-6)  # float32 storage
    with pytest.raises(RunExistsError, match="overwrite"):
        assemble_axis(st, "D")
    assert assemble_axis(st, "D", overwrite=True).n_committed == 10


def test_axis_is_fitted_and_reconstructed_like_a_run(budgets):
    st, _ = budgets
    assemble_axis(st, "D")
    fit_run(st.run("axis-D"), progress=False)
    rec = reconstruct_run(st.run("axis-D"), n_boot=0)
    assert rec.axis == "D" and rec.x.size == 10
    assert rec.r2_events > 0.9


@pytest.mark.parametrize("n_runs", [1, 2])
def test_axis_needs_three_runs(tmp_path, n_runs):
    st, _ = budget_store(tmp_path / "a.zarr", budgets=BUDGETS[:n_runs])
    with pytest.raises(InputError, match="at least 3"):
        assemble_axis(st, "D")
    with pytest.raises(InputError, match="at least 3"):
        assemble_axis(st, "D", runs=[f"d{j}" for j in range(n_runs)])


def test_axis_refuses_repeated_values_and_missing_attrs(tmp_path):
    st, _ = budget_store(tmp_path / "a.zarr", budgets=[1e5, 1e6, 1e6])
    with pytest.raises(InputError, match="distinct"):
        assemble_axis(st, "D", runs=["d0", "d1", "d2"])
    with pytest.raises(InputError, match="n_params_non_embedding"):
        assemble_axis(st, "M", runs=["d0", "d1", "d2"])
    with pytest.raises(InputError, match="axis must be"):
        assemble_axis(st, "T")


def test_axis_refuses_runs_recorded_on_another_probe(budgets, tmp_path):
    st, _ = budgets
    other, _ = budget_store(tmp_path / "b.zarr", budgets=BUDGETS[:3], probe=make_probe(seed=1))
    with pytest.raises(ProbeMismatchError, match="probe"):
        assemble_axis(st, "D", runs=["d0", "d1", other.run("d2")])
    assert "axis-D" not in st.runs  # nothing half-made


def test_token_stats_by_hand(tmp_path):
    probe = tokdyn.ProbeSet(None, {"sample_id": np.zeros(3, np.int32), "token_pos": np.arange(1, 4, dtype=np.int32)})
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    L = np.array([[5.0, 5.0, 0.1], [0.1, 5.0, 0.1], [2.0, 5.0, 0.1], [0.1, 0.2, 0.1], [3.0, 0.3, 0.1]])  # [K, N]
    w = st.create_run("r", capacity=5).writer()
    for k, row in enumerate(L):
        w.append(row, step=k)
    ts = token_stats(st.run("r"), early_row=1, threshold=1.0)
    p = np.exp(-L)
    np.testing.assert_allclose(ts.confidence, p.mean(0), rtol=1e-6)
    np.testing.assert_allclose(ts.variability, p.std(0), rtol=1e-5)
    np.testing.assert_array_equal(ts.forgetting_events, [2, 0, 0])  # token 0: learned -> lost at rows 1->2 and 3->4
    # rows 1 and 4: token 0: 0.1 -> 3.0 (L->H), 1: 5 -> 0.3 (H->L), 2: L->L
    np.testing.assert_array_equal(ts.rho1, [2, 1, 3])
    assert ts.rho1_shares() == pytest.approx({"H->H": 0, "H->L": 1 / 3, "L->H": 1 / 3, "L->L": 1 / 3})
    assert token_stats(st.run("r")).early_row == 2  # steps 1..4: log10 midpoint 0.3 is nearest step 2
    with pytest.raises(InputError, match="before"):
        token_stats(st.run("r"), early_row=4, late_row=2)
    with pytest.raises(InputError, match="row index"):
        token_stats(st.run("r"), early_row=9)


def test_frequency_and_position_bands():
    band, labels = frequency_bands(np.array([1, 1, 1, 1, 2, 2, 3, 4]), n_bands=2)
    assert band.tolist() == [1, 1, 1, 1, 0, 0, 0, 0] and len(labels) == 2
    band, labels = position_bands(np.array([1, 2, 3, 4, 7, 8, 127, 128]), 128)
    assert band.tolist() == [0, 1, 1, 2, 2, 3, 6, 7] and labels[:3] == ["1", "2-3", "4-7"]
    assert labels[6:] == ["64-127", "128"]  # a context of 128 ends with its own last position


@settings(max_examples=200, deadline=None)
@given(context=hst.integers(1, 5000), with_context=hst.booleans())
def test_every_position_sits_in_the_band_its_label_names(context, with_context):
    pos = np.arange(1, context + 1)
    band, labels = position_bands(pos, context if with_context else None)
    ranges = [tuple(int(v) for v in lab.split("-")) if "-" in lab else (int(lab), int(lab)) for lab in labels]
    lo, hi = np.array([r[0] for r in ranges]), np.array([r[1] for r in ranges])
    assert np.all((lo[band] <= pos) & (pos <= hi[band]))
    assert lo[0] == 1 and hi[-1] == context and np.all(lo[1:] == hi[:-1] + 1)  # 1..context, no gap or overlap


# -- CLI and report ------------------------------------------------------------------------


@pytest.fixture
def fitted_T(tmp_path):
    """A store with one fitted T run of planted events on 30 log-spaced steps."""
    rng = np.random.default_rng(0)
    steps = np.unique(np.round(np.geomspace(1, 3000, 30)).astype(int))
    x = np.log10(steps)
    mu, s, d = rng.uniform(0.5, 3.0, N), rng.uniform(0.05, 0.2, N), rng.uniform(1, 4, N)
    Y = 1 + d[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / s[:, None])) + rng.normal(0, 0.1, (N, x.size))
    path = tmp_path / "t.zarr"
    st = tokdyn.open_store(path, make_probe(), mode="w")
    w = st.create_run("main", capacity=len(steps) + 1, attrs={"seed": 0}).writer()
    w.append(np.full(N, 5.0), step=0)
    for j, step in enumerate(steps):
        w.append(Y[:, j].clip(0.01), step=int(step))
    return path


def test_cli_spectrum_and_reconstruct(fitted_T, capsys):
    assert main(["spectrum", str(fitted_T), "--run", "main"]) == 1
    assert "has not been fitted" in capsys.readouterr().err
    assert main(["fit", str(fitted_T), "--run", "main", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["spectrum", str(fitted_T), "--run", "main", "--json", "--boot", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spectrum_power_law"]["n_boot"] == 20 and len(out["spectrum"]["density"]) == 256
    assert main(["spectrum", str(fitted_T), "--run", "main", "--json", "--boot", "0", "--by", "frequency"]) == 0
    by = json.loads(capsys.readouterr().out)
    parts = sum(np.array(g["density"]) for g in by["groups"].values())  # the bands add up to the whole
    np.testing.assert_allclose(parts, by["spectrum"]["density"], atol=1e-9)
    assert main(["spectrum", str(fitted_T), "--run", "main", "--boot", "0", "--by", "position"]) == 0
    assert "by position" in capsys.readouterr().out
    assert main(["spectrum", str(fitted_T), "--run", "main", "--boot", "0", "--by", "domain"]) == 1  # index-only probe
    assert "no domain information" in capsys.readouterr().err
    assert main(["reconstruct", str(fitted_T), "--run", "main", "--json", "--boot", "0"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["axis"] == "T" and rec["r2_events"] > 0.95 and rec["r2_spectrum"] > 0.8
    assert main(["reconstruct", str(fitted_T), "--run", "main", "--boot", "0", "--bandwidth", "0.15"]) == 0
    assert "spectrum alone" in capsys.readouterr().out
    assert main(["reconstruct", str(fitted_T), "--axis", "M"]) == 1
    err = capsys.readouterr().err
    assert "at least 3" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["spectrum", str(fitted_T), "--run", "main", "--bandwidth", "wide"]) == 1
    assert "bandwidth" in capsys.readouterr().err


def test_cli_reconstruct_axis_assembles_and_fits(tmp_path, capsys):
    budget_store(tmp_path / "a.zarr", budgets=BUDGETS[[9, 0, 2, 4, 6, 7, 8]], tag="D")
    assert main(["reconstruct", str(tmp_path / "a.zarr"), "--axis", "D", "--json", "--boot", "0"]) == 0
    captured = capsys.readouterr()
    assert "assembled run 'axis-D'" in captured.err and "fitted" in captured.err
    assert json.loads(captured.out)["r2_events"] > 0.9
    assert main(["reconstruct", str(tmp_path / "a.zarr"), "--axis", "D", "--json", "--boot", "0"]) == 0  # reused
    assert "assembled" not in capsys.readouterr().err


def test_cli_reconstruct_axis_averages_seeds_only_when_asked(tmp_path, capsys):
    """Two runs per budget (seeds): refused in one line that names the option, then averaged."""
    budgets = BUDGETS[[0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 9, 9]]
    st, Y = budget_store(tmp_path / "a.zarr", budgets=budgets, tag="D")
    w = st.create_run("extra", capacity=3, attrs={"data_budget": float(BUDGETS[5]), "sweep": "D"}).writer()
    for k, step in enumerate((0, 10, 100)):  # a single-seed point between them
        w.append(Y[:, 5] + (2 - k), step=step)
    assert main(["reconstruct", str(tmp_path / "a.zarr"), "--axis", "D", "--json", "--boot", "0"]) == 1
    err = capsys.readouterr().err
    assert "--repeats mean" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["reconstruct", str(tmp_path / "a.zarr"), "--axis", "D", "--json", "--boot", "0", "--repeats", "mean"]) == 0
    assert json.loads(capsys.readouterr().out)["n_points"] == 7
    axis = tokdyn.open_store(tmp_path / "a.zarr", mode="r").run("axis-D")
    np.testing.assert_allclose(axis.losses()[0], Y[:, 0], rtol=1e-6)  # the two seeds' mean (equal here)


def test_report_is_one_self_contained_file(fitted_T, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(fitted_T), "--out", str(out)]) == 1  # nothing fitted yet
    assert "no fitted run" in capsys.readouterr().err and not out.exists()
    fit_run(as_store(fitted_T, mode="r+").run("main"), progress=False)
    assert main(["report", str(fitted_T), "--out", str(out)]) == 0
    html = out.read_text()
    assert html.count("<img") >= 6 and "data:image/png;base64," in html
    assert not re.search(r"(src|href)=['\"]?(http|file|/)", html)  # nothing outside the file
    assert "R² sigmoid sum" in html and "main" in html
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("bad", ["missing/dir/r.html", "."])
def test_report_path_that_cannot_be_written(fitted_T, tmp_path, capsys, bad):
    target = str(tmp_path / bad) if bad != "." else str(tmp_path)
    assert main(["report", str(fitted_T), "--out", target]) == 1
    err = capsys.readouterr().err
    assert "report" in err and "Traceback" not in err
    with pytest.raises(InputError):
        write_report(fitted_T, target)


def test_analysis_of_unfitted_run_is_a_clear_error(fitted_T):
    with pytest.raises(StoreError, match="not been fitted"):
        reconstruct_run(as_store(fitted_T).run("main"))


def test_imported_npz_axis_is_found_fitted_and_reconstructed(budgets, tmp_path, capsys):
    st, _ = budgets
    assemble_axis(st, "D")
    npz = tmp_path / "losses.npz"
    assert main(["export-npz", str(st.url), str(npz), "--run", "axis-D"]) == 0
    other = tmp_path / "imported.zarr"
    assert main(["import-npz", str(npz), str(other), "--run", "paper-D"]) == 0
    capsys.readouterr()
    assert main(["reconstruct", str(other), "--axis", "D", "--json", "--boot", "0"]) == 0
    captured = capsys.readouterr()
    assert "assembled" not in captured.err and "fitted run 'paper-D'" in captured.err
    got = json.loads(captured.out)
    assert got["run"] == "paper-D" and got["axis"] == "D"
    fit_run(st.run("axis-D"), progress=False)
    want = reconstruct_run(st.run("axis-D"), n_boot=0)
    assert got["r2_events"] == pytest.approx(want.r2_events, abs=1e-3)  # same losses, same answer


def test_an_axis_run_out_of_date_is_assembled_again_never_used_short(tmp_path, capsys, monkeypatch):
    """A failed assembly leaves nothing behind; an axis run holding fewer points than its sources
    (an assembly killed before it could clean up), made from other runs than --runs names, or
    whose source has committed rows since, is assembled again (the command says why) instead of
    being used as the axis."""
    from tokdyn.axes import axis_run_problem

    _, Y = budget_store(tmp_path / "a.zarr", budgets=BUDGETS[[0, 2, 4, 5, 6, 8, 9]], tag="D")
    url = str(tmp_path / "a.zarr")
    real = tokdyn.store.Run.losses
    calls = {"n": 0}

    def failing(self, *args, **kwargs):  # the sixth source cannot be read
        calls["n"] += 1
        if calls["n"] == 6:
            raise StoreError("run 'd5': cannot decode loss (planted damage)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tokdyn.store.Run, "losses", failing)
    assert main(["reconstruct", url, "--axis", "D", "--boot", "0"]) == 1
    assert "planted damage" in capsys.readouterr().err
    assert "axis-D" not in as_store(url).runs  # nothing half-made
    # killed before it could clean up: 5 of 7 rows written, the run left behind
    calls["n"] = 0
    monkeypatch.setattr(tokdyn.store.TrajectoryStore, "delete_run", lambda self, name: None)
    assert main(["reconstruct", url, "--axis", "D", "--boot", "0"]) == 1
    monkeypatch.undo()
    capsys.readouterr()
    assert as_store(url).run("axis-D").n_committed == 5
    assert "holds 5 of its 7 points" in axis_run_problem(as_store(url).run("axis-D"), "D")
    assert main(["reconstruct", url, "--axis", "D", "--json", "--boot", "0"]) == 0
    captured = capsys.readouterr()
    assert "again (it holds 5 of its 7 points" in captured.err and json.loads(captured.out)["n_points"] == 7
    assert main(["reconstruct", url, "--axis", "D", "--json", "--boot", "0"]) == 0  # now reused
    assert "assembled" not in capsys.readouterr().err
    # other --runs than it was made from
    six = "d0,d1,d2,d3,d4,d5"
    assert main(["reconstruct", url, "--axis", "D", "--json", "--boot", "0", "--runs", six]) == 0
    captured = capsys.readouterr()
    assert "again (it was assembled from" in captured.err and json.loads(captured.out)["n_points"] == 6
    # a source with a new final row
    w = as_store(url, mode="r+").run("d0").writer(resume=True)
    w.append(Y[:, 0] - 0.5, step=1000)
    w.release()
    assert main(["reconstruct", url, "--axis", "D", "--json", "--boot", "0", "--runs", six]) == 0
    assert "again (run 'd0' has 4 rows now, 3 when" in capsys.readouterr().err
    np.testing.assert_allclose(as_store(url).run("axis-D").losses()[0], Y[:, 0] - 0.5, rtol=1e-6)
    # axis flags without --axis; a run of the axis's name that holds another axis
    assert main(["reconstruct", url, "--runs", "d0,d1,d2", "--run", "d0"]) == 1
    assert "--runs applies to an axis" in capsys.readouterr().err
    assert main(["reconstruct", url, "--run", "d0", "--curves"]) == 1  # the text has no curves: not ignored
    assert "--curves adds the curves to the --json output" in capsys.readouterr().err
    with pytest.raises(InputError, match="holds axis D, not M"):
        axis_run_problem(as_store(url).run("axis-D"), "M")


def test_report_leaves_out_a_run_that_cannot_be_analysed_and_says_why(fitted_T, tmp_path, capsys):
    """One run with no learning event at all does not take the default report down; asked for by
    name, it is an error that names it."""
    st = as_store(fitted_T, mode="r+")
    fit_run(st.run("main"), progress=False)
    n = st.probe.n_tokens
    w = st.create_run("flat", capacity=8).writer()
    for step in (0, 1, 2, 4, 8, 16, 32, 64):
        w.append(np.full(n, np.nan, np.float32), step=step, warn_nonfinite=False)  # never scored
    fit_run(st.run("flat"), progress=False)
    out = tmp_path / "r.html"
    capsys.readouterr()
    assert main(["report", str(fitted_T), "--out", str(out)]) == 0
    html = out.read_text()
    assert "Left out, flat:" in html and "run main" in html
    # and the command says it, not only the page
    assert capsys.readouterr().err.strip().splitlines() == [
        "tokdyn report: warning: left out of the analysis: run 'flat': the fit has no observed x range (every token unfit)"]
    assert main(["report", str(fitted_T), "--out", str(out), "--run", "flat"]) == 1
    err = capsys.readouterr().err
    assert "run 'flat'" in err and len(err.strip().splitlines()) == 1


def test_cli_spectrum_says_when_the_power_law_is_not_one(tmp_path, capsys):
    """Every token learned around one time: the spectrum is one bump, and its power-law fit
    (R^2 well below 0.8) is printed with the report's verdict, not as a plain exponent."""
    rng = np.random.default_rng(2)
    n = 400
    steps = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))
    x, mu = np.log10(steps.astype(float)), rng.normal(3.0, 0.05, n)
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(tmp_path / "b.zarr", probe, mode="w")
    with st.create_run("r", capacity=len(steps)).writer() as w:
        for j, step in enumerate(steps):
            w.append((1 + 3 / (1 + np.exp((x[j] - mu) / 0.1)) + 0.05 * rng.standard_normal(n)).astype(np.float32), step=int(step))
    fit_run(st.run("r"), progress=False)
    assert main(["spectrum", str(tmp_path / "b.zarr"), "--run", "r", "--boot", "0"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("power law of the spectrum"))
    assert "not a power law: R^2 below 0.8" in line, line


def test_an_axis_source_with_new_rows_is_seen_however_the_store_is_spelled(tmp_path, monkeypatch):
    """The staleness check compared the recorded store URL as text: opened as `a.zarr/`, through
    `..` or by a relative path, a source's new rows went unseen and the stale axis was reused.
    A source in another store is checked too."""
    from tokdyn.axes import axis_run_problem

    _, Y = budget_store(tmp_path / "a.zarr", budgets=BUDGETS[:4])
    assemble_axis(as_store(tmp_path / "a.zarr", mode="r+"), "D")
    w = as_store(tmp_path / "a.zarr", mode="r+").run("d0").writer(resume=True)
    w.append(Y[:, 0], step=1000)
    w.release()
    monkeypatch.chdir(tmp_path)
    for spelled in (str(tmp_path / "a.zarr"), str(tmp_path / "a.zarr") + "/", str(tmp_path / ".." / tmp_path.name / "a.zarr"), "a.zarr"):
        assert "run 'd0' has 4 rows now, 3 when" in axis_run_problem(as_store(spelled).run("axis-D"), "D"), spelled
    other, _ = budget_store(tmp_path / "b.zarr", budgets=BUDGETS[4:6])
    st = as_store(tmp_path / "a.zarr", mode="r+")
    assemble_axis(st, "D", runs=["d1", "d2", other.run("d0")], overwrite=True)
    assert axis_run_problem(st.run("axis-D"), "D") is None
    w = as_store(tmp_path / "b.zarr", mode="r+").run("d0").writer(resume=True)
    w.append(Y[:, 4], step=1000)
    w.release()
    assert "run 'd0' has 4 rows now, 3 when" in axis_run_problem(as_store(tmp_path / "a.zarr").run("axis-D"), "D")


def test_an_axis_of_five_runs_says_how_to_fit_it_and_then_reconstructs(tmp_path, capsys):
    """Five runs assemble an axis the default fit (6 points) cannot take: the error named
    `--min-points`, an option reconstruct does not have; it now gives the command that works."""
    path = tmp_path / "five.zarr"
    budget_store(path, budgets=BUDGETS[:5])
    assert main(["reconstruct", str(path), "--axis", "D", "--boot", "0"]) == 1
    err = capsys.readouterr().err
    assert "5 points" in err and f"tokdyn fit {tokdyn.open_store(path).url} --run axis-D --min-points 5" in err
    assert main(["fit", str(path), "--run", "axis-D", "--min-points", "5", "--no-progress"]) == 0
    assert main(["reconstruct", str(path), "--axis", "D", "--boot", "0"]) == 0


@pytest.mark.parametrize("n", [3, 4])
def test_an_axis_of_three_or_four_runs_asks_for_runs_not_a_fit_that_is_refused(n, tmp_path, capsys):
    """With 3 or 4 points the error named `--min-points 5`, which the fit then refused ("a fit
    needs at least min_points=5"), with a literal STORE: it asks for the runs missing."""
    path = tmp_path / "few.zarr"
    budget_store(path, budgets=BUDGETS[:n])
    assert main(["reconstruct", str(path), "--axis", "D", "--boot", "0"]) == 1
    err = capsys.readouterr().err
    assert f"{n} points" in err and "--min-points" not in err and f"record {5 - n} more run" in err, err


def test_runs_tagged_since_an_axis_was_assembled_are_taken_in(tmp_path, capsys):
    """An axis assembled from the store's tagged runs was reused after more were tagged (seeds
    added for `--repeats mean`, more budgets): the seeds were never averaged, without a word."""
    from tokdyn.axes import axis_run_problem

    path = tmp_path / "grow.zarr"
    budget_store(path, budgets=BUDGETS[:6], tag="D")
    assert main(["reconstruct", str(path), "--axis", "D", "--boot", "0", "--json"]) == 0
    assert axis_run_problem(as_store(path).run("axis-D"), "D") is None  # nothing changed: reused
    st = as_store(path, mode="r+")
    src = st.run("d0")
    w = st.create_run("d0s1", capacity=src.n_committed, attrs=dict(src.attrs)).writer()  # a second seed of d0
    for i, step in enumerate(src.steps):
        w.append(src.losses(rows=slice(i, i + 1))[0] + 0.01, step=int(step))
    w.release()
    assert "runs ['d0s1'] of the axis were added" in axis_run_problem(as_store(path).run("axis-D"), "D")
    capsys.readouterr()
    assert main(["reconstruct", str(path), "--axis", "D", "--boot", "0", "--repeats", "mean", "--json"]) == 0
    sources = sorted(s["run"] for s in as_store(path).run("axis-D").attrs["sources"])
    assert sources == sorted(["d0s1", *(f"d{j}" for j in range(6))])
    # what is no new point leaves the axis as it is: a tagged run created with no row yet, and a
    # source deleted since (the axis keeps its copy of the source's final row)
    st = as_store(path, mode="r+")
    st.create_run("d_new", capacity=3, attrs={"sweep": "D", "data_budget": 5e5, "model_config": {"n_layer": 2}})
    st.delete_run("d5")
    assert axis_run_problem(as_store(path).run("axis-D"), "D") is None
    assert main(["reconstruct", str(path), "--axis", "D", "--boot", "0", "--json"]) == 0
    assert as_store(path).run("axis-D").n_committed == 6
    # the report of a store whose one fitted run, the axis, is out of date says why (it said "run
    # `tokdyn fit` first", of a fitted run)
    src = st.run("d1")
    w = st.create_run("d1s1", capacity=src.n_committed, attrs=dict(src.attrs)).writer()
    for i, step in enumerate(src.steps):
        w.append(src.losses(rows=slice(i, i + 1))[0] - 0.01, step=int(step))
    w.release()
    from tokdyn.analysis import analyze_store

    with pytest.raises(StoreError, match=r"axis-D: out of date \(runs \['d1s1'\] of the axis were added"):
        analyze_store(as_store(path))
