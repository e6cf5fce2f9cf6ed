"""`tokdyn record-offline --model` takes the model spec as a JSON file or as the JSON itself
(docs/recording.md): both record the same losses, and a bad value of either kind is one line
naming the problem, exit 1, no traceback."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import tokdyn
from offline_fixtures import SPEC, make_model, make_probe, save_torch
from reliability_fixtures import cli_error_line, run_cli


@pytest.fixture(scope="module")
def probe_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "probe.zarr"
    tokdyn.open_store(path, make_probe(), mode="w")
    return path


@pytest.fixture(scope="module")
def bare_folder(tmp_path_factory):
    """Two bare state dicts and no model spec beside them: --model is needed."""
    folder = tmp_path_factory.mktemp("ckpts")
    for step in (0, 10):
        save_torch(make_model(step), folder / f"step_{step}.pt")
    return folder


def record(folder, out, probe_store, capsys, model: str | None) -> tuple[int, str]:
    return run_cli(["record-offline", "--checkpoints", str(folder), "--out", str(out), "--run", "r",
                    "--probe", str(probe_store), "--no-progress", "--workers", "1",
                    *([] if model is None else ["--model", model])], capsys)  # fmt: skip


def test_a_file_and_inline_json_record_the_same_losses(tmp_path, bare_folder, probe_store, capsys):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC))
    assert record(bare_folder, tmp_path / "file.zarr", probe_store, capsys, str(spec_file)) == (0, "")
    assert record(bare_folder, tmp_path / "inline.zarr", probe_store, capsys, json.dumps(SPEC)) == (0, "")
    assert record(bare_folder, tmp_path / "spaced.zarr", probe_store, capsys, "  " + json.dumps(SPEC, indent=1)) == (0, "")
    runs = [tokdyn.open_store(tmp_path / name).run("r") for name in ("file.zarr", "inline.zarr", "spaced.zarr")]
    assert [list(r.steps) for r in runs] == [[0, 10]] * 3
    for r in runs[1:]:
        np.testing.assert_array_equal(r.losses(), runs[0].losses())


BAD = {
    "inline JSON cut short": (lambda tmp: '{"type": "tinygpt", "config": {', "--model: not valid JSON"),
    "inline JSON with a trailing comma": (lambda tmp: '{"type": "tinygpt",}', "--model: not valid JSON"),
    "inline JSON of the wrong shape": (lambda tmp: '{"type": "tinygpt", "config": 5}', "--model: expected"),
    "inline JSON of an unknown kind": (lambda tmp: '{"type": "nosuch"}', "--model"),
    "a missing file": (lambda tmp: str(tmp / "nosuch.json"), "nosuch.json"),
    "a file that is not JSON": (lambda tmp: (tmp / "bad.json").write_text("{nope") and str(tmp / "bad.json"),
                                "cannot read model spec"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(BAD))
def test_a_bad_model_argument_is_one_line(what, tmp_path, bare_folder, probe_store, capsys):
    make, expected = BAD[what]
    code, err = record(bare_folder, tmp_path / "o.zarr", probe_store, capsys, make(tmp_path))
    line = cli_error_line(err)
    assert code == 1 and line.startswith("tokdyn record-offline: error: ") and expected in line, line
    assert not (tmp_path / "o.zarr").exists()  # refused before any store is made


def test_bare_state_dicts_without_a_model_name_every_way_to_give_one(tmp_path, bare_folder, probe_store, capsys):
    """The refusal named only the Python argument (model_factory=) to a user of the command line."""
    code, err = record(bare_folder, tmp_path / "o.zarr", probe_store, capsys, None)
    line = cli_error_line(err)
    assert code == 1 and "is a bare state dict and no model is known for it" in line, line
    for way in ("--model JSON", "model_factory=", "manifest.json", "tokdyn_model.json", "config.json"):
        assert way in line, (way, line)
    # the way the line now adds beside --model (tested above) works: a config.json of the spec's
    # GPTConfig fields beside the files
    folder = shutil.copytree(bare_folder, tmp_path / "ckpts")
    (folder / "config.json").write_text(json.dumps(SPEC["config"]))
    assert record(folder, tmp_path / "c.zarr", probe_store, capsys, None)[0] == 0
    assert list(tokdyn.open_store(tmp_path / "c.zarr").run("r").steps) == [0, 10]
