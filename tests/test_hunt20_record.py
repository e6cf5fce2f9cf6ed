"""Recording a researcher's own setup (hunt 20): an optimizer prepared by accelerate, manifests
whose keys would be dropped, checkpoints named in another case or saved by
torch.distributed.checkpoint, and the command `tokdyn probe` names. Each was a traceback, a
silent change of axis or a silent skip."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokdyn
from offline_fixtures import SPEC, direct_losses, make_model, make_probe, save_safetensors
from reliability_fixtures import cli_error_line, run_cli
from tokdyn.errors import InputError
from tokdyn.record import TokenLossRecorder
from tokdyn.record.offline import discover_checkpoints

# -- attach() on an optimizer accelerate prepared ------------------------------------------------


def test_attach_follows_an_accelerated_optimizer_through_gradient_accumulation(tmp_path):
    """accelerate's AcceleratedOptimizer is a torch Optimizer without hooks of its own (attach
    raised AttributeError from inside torch, after writing step 0). Now the optimizer it wraps is
    hooked: one row step per real update (gradient accumulation 2: 8 updates of 16 batches), and
    the last row is the trained model's own losses."""
    accelerate = pytest.importorskip("accelerate")
    probe = make_probe(n_sequences=3)
    model = make_model(0)
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    assert not hasattr(opt, "_optimizer_step_post_hooks")  # the wrapper this test is about
    rng = torch.Generator().manual_seed(0)
    with TokenLossRecorder(model, probe, str(tmp_path / "s.zarr"), "r", schedule=list(range(9))) as rec:
        with rec.attach(opt):
            for _ in range(16):
                x = torch.randint(0, 64, (4, 33), generator=rng)
                with acc.accumulate(model):
                    loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
                    acc.backward(loss)
                    opt.step()
                    opt.zero_grad()
    run = tokdyn.open_store(tmp_path / "s.zarr", mode="r").run("r")
    assert run.steps.tolist() == list(range(9))
    assert np.allclose(run.losses()[-1], direct_losses(acc.unwrap_model(model), probe), atol=1e-5)


def test_an_optimizer_without_hooks_or_an_inner_one_is_refused_before_any_row(tmp_path):
    class Hollow(torch.optim.Optimizer):  # a wrapper that never ran Optimizer.__init__, holding nothing
        def __init__(self, params):
            self.param_groups = [{"params": list(params), "lr": 0.1}]

    model = make_model(0)
    with TokenLossRecorder(model, make_probe(n_sequences=2), str(tmp_path / "s.zarr"), "r", schedule=[0, 1]) as rec:
        with pytest.raises(InputError, match="has no step hooks"):
            with rec.attach(Hollow(model.parameters())):
                pass
    assert tokdyn.open_store(tmp_path / "s.zarr", mode="r").run("r").n_committed == 0


# -- manifests: a key given is a key used --------------------------------------------------------


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / "tokdyn_model.json").write_text(json.dumps(SPEC))
    for s in (100, 1000):
        torch.save(make_model(s).state_dict(), root / f"ckpt_{s}.pt")
    return root


@pytest.mark.parametrize("manifest, said", [
    ({"Axis": "D", "checkpoints": [{"path": "ckpt_100.pt", "axis_value": 1e6}, {"path": "ckpt_1000.pt", "axis_value": 1e7}]},
     r"unknown keys \['Axis'\]"),
    ({"axis": "D", "mdoel": SPEC, "checkpoints": [{"path": "ckpt_100.pt", "axis_value": 1e6}]}, r"unknown keys \['mdoel'\]"),
    ({"checkpoints": [{"path": "ckpt_100.pt", "axis_value": 1e6}]}, r'"axis_value" applies to a D or M sweep'),
    ({"axis": "D", "checkpoints": [{"path": "ckpt_100.pt", "axis_value": 1e6, "step": 5}]}, r'"step" applies to an axis-T run'),
    ({"axis": "D", "checkpoints": [{"path": "ckpt_100.pt", "axis_value": -5}]}, r'"axis_value" -5 is negative'),
])  # fmt: skip
def test_a_manifest_key_that_would_be_dropped_is_an_error(folder, tmp_path, capsys, manifest, said):
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=said):
        discover_checkpoints(folder)
    tokdyn.open_store(tmp_path / "s.zarr", make_probe(n_sequences=2), mode="w")
    code, err = run_cli(["record-offline", "--checkpoints", str(folder), "--out", str(tmp_path / "s.zarr"), "--run", "r",
                         "--no-progress"], capsys)  # fmt: skip
    assert code == 1 and "manifest.json" in cli_error_line(err)
    assert "r" not in tokdyn.open_store(tmp_path / "s.zarr", mode="r").runs


def test_a_manifest_of_each_axis_with_its_own_keys_is_read(folder):
    (folder / "manifest.json").write_text(json.dumps({"axis": "D", "checkpoints": [
        {"path": "ckpt_1000.pt", "axis_value": 1e7}, {"path": "ckpt_100.pt", "axis_value": 0}]}))  # fmt: skip
    assert [(r.step, r.axis_value, r.path.name) for r in discover_checkpoints(folder)] == [(0, 0.0, "ckpt_100.pt"),
                                                                                          (1, 1e7, "ckpt_1000.pt")]  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps({"axis": "T", "checkpoints": [{"path": "ckpt_100.pt", "step": 7}]}))
    assert [(r.step, r.path.name) for r in discover_checkpoints(folder)] == [(7, "ckpt_100.pt")]


# -- checkpoint names in other cases, and saves tokdyn does not read -----------------------------


def test_checkpoints_named_in_any_case_are_recorded(tmp_path, capsys):
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / "tokdyn_model.json").write_text(json.dumps(SPEC))
    models = {0: "step_0.pt", 10: "step_10.pth.tar", 20: "step_20.PT", 30: "step_30.Pth"}
    for step, name in models.items():
        torch.save(make_model(step).state_dict(), root / name)
    save_safetensors(make_model(40), root / "step_40.SafeTensors")
    assert [(r.step, r.kind) for r in discover_checkpoints(root)] == [(0, "torch"), (10, "torch"), (20, "torch"),
                                                                      (30, "torch"), (40, "safetensors")]  # fmt: skip
    probe = make_probe(n_sequences=2)
    tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    code, err = run_cli(["record-offline", "--checkpoints", str(root), "--out", str(tmp_path / "s.zarr"), "--run", "r",
                         "--no-progress"], capsys)  # fmt: skip
    assert code == 0, err
    run = tokdyn.open_store(tmp_path / "s.zarr", mode="r").run("r")
    assert run.steps.tolist() == [0, 10, 20, 30, 40]
    for j, step in enumerate([0, 10, 20, 30, 40]):
        assert np.allclose(run.losses()[j], direct_losses(make_model(step), probe), atol=1e-5)


def test_a_distributed_checkpoint_folder_is_named_when_it_is_skipped(folder):
    dcp = folder / "step-50"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"\x80")
    (dcp / "__0_0.distcp").write_bytes(b"\x00")
    with pytest.warns(UserWarning, match=r"\['step-50'\] are torch.distributed.checkpoint saves.*dcp_to_torch_save"):
        refs = discover_checkpoints(folder)
    assert [r.step for r in refs] == [100, 1000]


# -- the command `tokdyn probe` names ----------------------------------------------------------------


def test_the_record_command_tokdyn_probe_names_runs_as_printed(tmp_path, capsys, monkeypatch):
    texts = tmp_path / "texts"
    texts.mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        (texts / f"doc{i}.txt").write_text(" ".join(rng.choice(["alpha", "beta", "gamma", "loss"], 300)) + "\n")
    monkeypatch.chdir(tmp_path)
    from tokdyn.cli import main

    assert main(["probe", "texts", "--out", "my runs.zarr", "--context", "16", "--sequences", "8", "--probe-fraction", "0.2"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("next: ")][0]
    argv = shlex.split(line[len("next: "):].split(", or in a training loop")[0])
    assert argv[:4] == ["tokdyn", "record-offline", "--checkpoints", "DIR"] and argv[4:6] == ["--out", "my runs.zarr"]


# -- a store created by another process at the same moment ------------------------------------------


def test_a_store_another_process_is_creating_this_moment_is_waited_for(tmp_path):
    """A script launched twice at once: the second saw the first's store folder before its creation
    marker and said "no tokdyn store" (1 time in 8). A location that holds something but no store
    is watched a moment for a creation in progress: here another process's, 0.2 s after the folder
    appeared. What follows is the store, or the creation in progress said as such, never "no store"."""
    import subprocess
    import sys

    from tokdyn.errors import RunBusyError

    url = tmp_path / "s.zarr"
    url.mkdir()
    (url / "probe").mkdir()  # what a creator has made before its marker
    probe = make_probe(n_sequences=2)
    np.save(tmp_path / "tokens.npy", probe.tokens)
    creator = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, numpy as np, tokdyn; from tokdyn.store.store import TrajectoryStore; "
        f"p = tokdyn.ProbeSet.from_tokens(np.load({str(tmp_path / 'tokens.npy')!r})); print('ready', flush=True); "
        f"time.sleep(0.2); TrajectoryStore.create({str(url)!r}, p, overwrite=True); print('created')")],
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert creator.stdout.readline().strip() == "ready"
        try:
            st = tokdyn.open_store(url, probe, mode="a")
            assert st.probe.fingerprint == probe.fingerprint
        except RunBusyError as exc:
            assert "is being created by process" in str(exc)
    finally:
        out, _ = creator.communicate(timeout=120)
    assert "created" in out


def test_a_location_that_never_becomes_a_store_is_still_refused(tmp_path):
    from tokdyn.errors import NotAStoreError

    (tmp_path / "s.zarr").mkdir()
    (tmp_path / "s.zarr" / "notes.txt").write_text("mine")
    with pytest.raises(NotAStoreError):
        tokdyn.open_store(tmp_path / "s.zarr", make_probe(n_sequences=2), mode="a")
    assert (tmp_path / "s.zarr" / "notes.txt").read_text() == "mine"
