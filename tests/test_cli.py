"""The command line's conveniences: the run defaults to the store's only run, a demo output
folder is understood as its store, and every argument says what it is."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

import tokdyn
from reliability_fixtures import cli_error_line
from tokdyn.cli import build_parser, main

from test_hostile import fitted_store


def test_run_defaults_to_the_only_run_and_a_demo_folder_is_its_store(tmp_path, capsys):
    fitted_store(tmp_path / "demo" / "store.zarr", fit=False)  # the layout `tokdyn demo --out demo` writes
    assert main(["fit", str(tmp_path / "demo"), "--no-progress"]) == 0
    assert "fitted run 'r'" in capsys.readouterr().out
    assert main(["spectrum", str(tmp_path / "demo"), "--boot", "0"]) == 0
    assert main(["reconstruct", str(tmp_path / "demo"), "--boot", "0"]) == 0
    assert main(["export-npz", str(tmp_path / "demo"), str(tmp_path / "r.npz")]) == 0
    assert tokdyn.interchange.read_npz(tmp_path / "r.npz")["loss_matrix"].shape[0] == 60


def test_without_run_a_store_of_several_runs_names_them(tmp_path, capsys):
    st = fitted_store(tmp_path / "s.zarr", fit=False)
    with st.create_run("other", capacity=1).writer() as w:
        w.append(np.ones(60), step=1)
    assert main(["fit", str(tmp_path / "s.zarr"), "--no-progress"]) == 1
    assert cli_error_line(capsys.readouterr().err).endswith("holds 2 runs (other, r); choose one with --run NAME")


def _actions(parser: argparse.ArgumentParser, path=()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, (*path, name))
        elif not isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
            yield path, a


@pytest.mark.parametrize("path,action", list(_actions(build_parser())), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v.dest)
def test_every_argument_has_help(path, action):
    assert action.help, f"tokdyn {' '.join(path)}: argument {action.dest} has no help text"


def test_a_failed_command_leaves_no_new_store_behind(tmp_path, capsys):
    """record-offline on an empty folder, and import-npz of a file whose run cannot be created,
    fail with one line and leave nothing at the store path they would have created."""
    probe_store = fitted_store(tmp_path / "p.zarr", fit=False)
    del probe_store
    src = tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 50, (4, 9)))
    tokdyn.open_store(tmp_path / "probe.zarr", src, mode="w")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "new.zarr"
    assert main(["record-offline", "--checkpoints", str(tmp_path / "empty"), "--out", str(out), "--run", "r",
                 "--probe", str(tmp_path / "probe.zarr"), "--no-progress"]) == 1  # fmt: skip
    cli_error_line(capsys.readouterr().err)
    assert not out.exists()
    arrays = {"axis_values": np.array([1.0, 2.0]), "loss_matrix": np.ones((3, 2), np.float32), "axis_name": np.array(["T"])}
    np.savez(tmp_path / "bad run name.npz", **arrays)
    assert main(["import-npz", str(tmp_path / "bad run name.npz"), str(out), "--run", "a/b"]) == 1
    cli_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_spectrum_kernel_and_placement_from_the_command_line(tmp_path, capsys):
    fitted_store(tmp_path / "s.zarr")
    s = str(tmp_path / "s.zarr")
    assert main(["reconstruct", s, "--boot", "0", "--json"]) == 0
    event = json.loads(capsys.readouterr().out)
    assert main(["reconstruct", s, "--boot", "0", "--json", "--kernel", "delta", "--placement", "seen"]) == 0
    delta = json.loads(capsys.readouterr().out)
    assert event["kernel"] == "event" and delta["kernel"] == "delta"
    assert main(["spectrum", s, "--boot", "0", "--placement", "seen"]) == 1  # the event kernel has no placement
    assert "placement" in cli_error_line(capsys.readouterr().err)


def _planted_times_store(path, mu):
    """One T run whose tokens each learn in one sharp event at ``mu`` (log10 step)."""
    n = mu.size
    steps = np.unique(np.round(np.geomspace(1, 1000, 30)).astype(int))
    x = np.log10(steps)
    rng = np.random.default_rng(1)
    Y = 0.5 + 3.0 / (1 + np.exp((x[None, :] - mu[:, None]) / 0.08)) + rng.normal(0, 0.03, (n, x.size))
    arrays = {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)}
    st = tokdyn.open_store(path, tokdyn.ProbeSet(None, arrays), mode="w")
    with st.create_run("r", capacity=len(steps)).writer() as w:
        for j, step in enumerate(steps):
            w.append(Y[:, j], step=int(step))
    tokdyn.fit_run(st.run("r"), progress=False)
    return st


def test_the_report_headlines_an_exponent_only_for_a_power_law(tmp_path):
    """Learning times drawn from a density falling as 10**(-x) are a power law; uniform ones are
    not, and the report says so instead of printing an exponent near 0."""
    rng = np.random.default_rng(0)
    u = rng.uniform(size=600)
    # density proportional to 10**(-x) on [0.1, 2.9]: it covers the fitted range (the observed 0..3 decades less one
    # bandwidth at each edge); a planted edge inside that range is a drop to zero, which no power law fits
    falling = -np.log10(1 - u * (1 - 10**-2.8)) + 0.1
    flat = rng.uniform(0.1, 2.9, 600)
    pages = {}
    for name, mu in (("falling", falling), ("flat", flat)):
        st = _planted_times_store(tmp_path / f"{name}.zarr", mu)
        pages[name] = tokdyn.write_report(st, tmp_path / f"{name}.html").read_text()
    def spectrum_cell(page):  # the scores table's spectrum-exponent cell, found by its row's label
        row = page.split("spectrum exponent α [95%]", 1)[1].split("</tr>")[0]
        return row.split("<td>")[1].split("</td>")[0]

    assert spectrum_cell(pages["flat"]).startswith("not a power law")
    cell = spectrum_cell(pages["falling"])  # e.g. "0.95 [0.83, 1.12] (R² 0.86)"
    lo, hi = (float(v) for v in cell.split("[")[1].split("]")[0].split(","))
    assert lo <= 1.0 <= hi, cell  # the planted exponent, inside its interval


def test_python_dash_m_tokdyn_is_the_command():
    """`python -m tokdyn` runs the CLI (for environments without the script on PATH): the same
    help, and a failing command's one line and exit 1."""
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "tokdyn", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "usage: tokdyn" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "tokdyn", "info", "/nonexistent/store.zarr"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
