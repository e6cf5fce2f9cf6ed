"""Smoke tests of the end-to-end entry points at tiny sizes: the demo and train_tiny.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import tokdyn
from tokdyn.cli import main
from tokdyn.fit import read_fit

ROOT = Path(__file__).resolve().parents[1]


def test_demo_records_and_fits(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "12", "--points", "8", "--probe-sequences", "6", "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    run = tokdyn.open_store(out / "store.zarr", mode="r").run("tiny")
    assert summary["checkpoints_recorded"] == run.n_committed == len(summary["steps"])
    assert summary["steps"][0] == 0 and summary["steps"][-1] == 12
    assert summary["tokens_recorded"] == 6 * 128
    assert summary["mean_probe_loss_last"] < summary["mean_probe_loss_first"]  # it learned something
    fit = read_fit(out / "store.zarr", "tiny", fields=("status",))
    assert fit["status"].shape == (6 * 128,)
    assert abs(sum(summary["fit"]["class_counts"].values()) - 6 * 128) == 0
    assert "share of the loss drop" in capsys.readouterr().out


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
