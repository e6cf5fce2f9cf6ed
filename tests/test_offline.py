"""Offline recording of saved checkpoints (tokdyn.record.offline)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import warnings

import numpy as np
import pytest
import torch

from offline_fixtures import (
    CONFIG,
    SPEC,
    direct_losses,
    hf_config,
    make_hf_model,
    make_model,
    make_probe,
    mixed_folder,
    save_safetensors,
    save_torch,
    write_spec,
)
from tokdyn.errors import InputError, NotAStoreError, RunExistsError, UnsafeFileError
from tokdyn.model import GPTConfig, TinyGPT, count_parameters
from tokdyn.record.offline import (
    CheckpointRef,
    DuplicateWeightsWarning,
    discover_checkpoints,
    read_state_dict,
    record_offline,
    weights_fingerprint,
)
from tokdyn.cli.record import add_cli_arguments, run_cli
from tokdyn.store import open_store

ATOL = 1e-5  # float32 losses, same weights, possibly a different thread count


@pytest.fixture(scope="module")
def probe():
    return make_probe()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpts")
    return d, mixed_folder(d)


class _Touch:
    """Unpickling this calls ``Path.touch(target)``: a stand-in for arbitrary code."""

    def __init__(self, target: pathlib.Path) -> None:
        self.target = target

    def __reduce__(self):
        return (pathlib.Path.touch, (self.target,))


# -- discovery ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, step",
    [("step_000100.pt", 100), ("ckpt-100.safetensors", 100), ("model_100.bin", 100), ("step100.pth", 100),
     ("run3_step_250.ckpt", 250), ("checkpoint-100", 100)],
)  # fmt: skip
def test_step_is_last_integer_of_name(tmp_path, name, step):
    p = tmp_path / name
    if name.startswith("checkpoint-"):
        p.mkdir()
        (p / "config.json").write_text("{}")
    else:
        p.write_bytes(b"")  # discovery reads names only
    (tmp_path / "notes.txt").write_text("ignored")
    (ref,) = discover_checkpoints(tmp_path)
    assert (ref.step, ref.path.name) == (step, name)
    assert ref.kind == {"checkpoint-100": "hf", "ckpt-100.safetensors": "safetensors"}.get(name, "torch")


def test_name_without_integer_is_an_error(tmp_path):
    for n in ("step_1.pt", "final.pt", "latest.safetensors"):
        (tmp_path / n).write_bytes(b"")
    with pytest.raises(InputError, match=r"final\.pt.*latest\.safetensors.*manifest\.json"):
        discover_checkpoints(tmp_path)


def test_two_checkpoints_with_one_step_is_an_error(tmp_path):
    (tmp_path / "step_100.pt").write_bytes(b"")
    (tmp_path / "ckpt-0100.safetensors").write_bytes(b"")
    with pytest.raises(InputError, match=r"ckpt-0100\.safetensors.*step_100\.pt.*both have step 100"):
        discover_checkpoints(tmp_path)


def test_manifest_wins_and_is_validated(tmp_path):
    (tmp_path / "weights").mkdir()
    for n in ("final.pt", "a_7.safetensors", "b.pt"):
        (tmp_path / "weights" / n).write_bytes(b"")
    entries = [
        {"path": "weights/final.pt", "step": 5000, "tokens_seen": 5000 * 64, "lr": 1e-4},
        {"path": "weights/a_7.safetensors", "tokens_seen": 7 * 64},  # step from the name
        {"path": str(tmp_path / "weights" / "b.pt"), "step": 0, "model": {"type": "tinygpt", "config": {"n_embd": 8}}},
    ]
    (tmp_path / "manifest.json").write_text(json.dumps({"checkpoints": entries, "model": SPEC}))
    refs = discover_checkpoints(tmp_path)
    assert [(r.step, r.path.name, r.kind, r.tokens_seen) for r in refs] == [
        (0, "b.pt", "torch", None), (7, "a_7.safetensors", "safetensors", 448), (5000, "final.pt", "torch", 320000)
    ]  # fmt: skip
    assert refs[2].lr == 1e-4
    assert refs[0].model == {"type": "tinygpt", "config": {"n_embd": 8}} and refs[1].model == SPEC

    (tmp_path / "manifest.json").write_text(json.dumps({"checkpoints": [{"path": "weights/b.pt", "steps": 1}]}))
    with pytest.raises(InputError, match="unknown keys.*steps"):
        discover_checkpoints(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"checkpoints": [{"path": "weights/missing.pt", "step": 1}]}))
    with pytest.raises(InputError, match="missing.pt does not exist"):
        discover_checkpoints(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"axis": "D", "checkpoints": [{"path": "weights/b.pt"}]}))
    with pytest.raises(InputError, match="axis_value"):
        discover_checkpoints(tmp_path)


# -- safety -------------------------------------------------------------------------------


def test_pickled_code_is_refused_and_never_run(tmp_path, probe):
    marker = tmp_path / "pwned"
    d = tmp_path / "ckpts"
    d.mkdir()
    write_spec(d)
    save_torch(make_model(1), d / "step_10.pt")
    sd = dict(make_model(2).state_dict())
    sd["extra"] = _Touch(marker)
    torch.save(sd, d / "step_20.pt")

    with pytest.raises(UnsafeFileError, match=r"step_20\.pt.*weights_only=True.*safetensors"):
        read_state_dict(d / "step_20.pt")
    with pytest.raises(UnsafeFileError, match=r"step_20\.pt"):
        record_offline(d, tmp_path / "s.zarr", "r", probe=probe, workers=1, progress=False)
    assert not marker.exists()
    # The checkpoint before the bad one is committed; rows stop at the failure, in order.
    assert open_store(tmp_path / "s.zarr", mode="r").run("r").steps.tolist() == [10]

    hf = tmp_path / "hf" / "checkpoint-30"
    hf.mkdir(parents=True)
    hf_config().save_pretrained(hf)
    sd = dict(make_hf_model(0).state_dict())
    sd["extra"] = _Touch(marker)
    torch.save(sd, hf / "pytorch_model.bin")
    with pytest.raises(UnsafeFileError, match=r"pytorch_model\.bin"):
        record_offline(hf.parent, tmp_path / "s2.zarr", "r", probe=probe, progress=False)
    assert not marker.exists()


def test_unreadable_and_wrapped_files(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="junk.pt"):
        read_state_dict(tmp_path / "junk.pt")
    torch.save({"optimizer": {"lr": 1.0}, "step": 3}, tmp_path / "nostate.pt")
    with pytest.raises(InputError, match="no state dict"):
        read_state_dict(tmp_path / "nostate.pt")


def test_ddp_compile_prefixes_and_wrappers_are_stripped(tmp_path, probe):
    write_spec(tmp_path)
    models = {s: make_model(s) for s in (1, 2, 3)}
    save_torch(models[1], tmp_path / "step_1.pt", prefix="module.")
    save_torch(models[2], tmp_path / "step_2.pt", prefix="module._orig_mod.", wrap="model")
    save_torch(models[3], tmp_path / "step_3.pt", prefix="_orig_mod.", wrap="state_dict")
    for s in (1, 2, 3):
        assert read_state_dict(tmp_path / f"step_{s}.pt").keys() == models[s].state_dict().keys()
    record_offline(tmp_path, tmp_path / "s.zarr", "r", probe=probe, workers=2, progress=False)
    run = open_store(tmp_path / "s.zarr", mode="r").run("r")
    for k, s in enumerate(run.steps.tolist()):
        np.testing.assert_allclose(run.losses()[k], direct_losses(models[s], probe), rtol=0, atol=ATOL)


# -- fingerprints -------------------------------------------------------------------------


def test_weights_fingerprint():
    m = make_model(0)
    sd = m.state_dict()
    fp = weights_fingerprint(sd)
    assert 0 <= fp < 2**64 and fp == weights_fingerprint(m)
    assert fp == weights_fingerprint({k: v.clone() for k, v in reversed(list(sd.items()))})  # order-free
    changed = {k: v.clone() for k, v in sd.items()}
    changed["ln_f.bias"][0] += 1e-6
    assert weights_fingerprint(changed) != fp
    assert weights_fingerprint({("x" + k): v for k, v in sd.items()}) != fp
    assert weights_fingerprint({k: v.to(torch.bfloat16) for k, v in sd.items()}) not in (fp, None)
    assert weights_fingerprint({"a": torch.zeros(2, 3)}) != weights_fingerprint({"a": torch.zeros(3, 2)})


def test_identical_weights_at_two_steps_warn_and_are_both_recorded(tmp_path, probe):
    write_spec(tmp_path)
    a, b = make_model(1), make_model(2)
    save_torch(a, tmp_path / "step_10.pt")
    save_safetensors(a, tmp_path / "step_20.safetensors")  # same weights, other format
    save_torch(b, tmp_path / "step_30.pt")
    with pytest.warns(DuplicateWeightsWarning, match=r"step 10 .*step 20 "):
        out = record_offline(tmp_path, tmp_path / "s.zarr", "r", probe=probe, progress=False)
    assert out["duplicates"] == [[10, 20]]
    run = open_store(tmp_path / "s.zarr", mode="r").run("r")
    fps = run.coord("ckpt_fingerprint").tolist()
    assert run.steps.tolist() == [10, 20, 30] and fps[0] == fps[1] != fps[2]


def test_the_cli_warns_of_identical_weights_once(tmp_path, probe, capsys):
    # record-offline printed the warning, then a second "warning: steps 10 and 20 ..." on stdout
    from tokdyn.cli import main

    write_spec(tmp_path)
    a = make_model(1)
    save_torch(a, tmp_path / "step_10.pt")
    save_torch(a, tmp_path / "step_20.pt")
    save_torch(make_model(2), tmp_path / "step_30.pt")
    open_store(tmp_path / "src.zarr", probe, mode="a")
    assert main(["record-offline", "--checkpoints", str(tmp_path), "--out", str(tmp_path / "s.zarr"), "--run", "r",
                 "--probe", str(tmp_path / "src.zarr"), "--no-progress"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    said = [line for line in (out + err).splitlines() if "identical weights" in line]
    assert len(said) == 1 and said[0].startswith("tokdyn record-offline: warning: checkpoints at step 10 "), said


# -- recording ----------------------------------------------------------------------------


def test_rows_equal_direct_losses_of_each_checkpoint(tmp_path, folder, probe):
    d, models = folder
    out = record_offline(d, tmp_path / "s.zarr", "r", probe=probe, workers=2, progress=False)
    assert out["recorded"] == [0, 10, 100, 1000] and out["rows"] == 4 and out["skipped"] == []
    run = open_store(tmp_path / "s.zarr", mode="r").run("r")
    assert run.axis == "T" and run.steps.tolist() == [0, 10, 100, 1000]
    assert run.axis_values.tolist() == [0.0, 10.0, 100.0, 1000.0]
    assert run.coord("ckpt_fingerprint").tolist() == [weights_fingerprint(models[s]) for s in run.steps.tolist()]
    assert len(set(run.coord("ckpt_fingerprint").tolist())) == 4
    for k, s in enumerate(run.steps.tolist()):
        np.testing.assert_allclose(run.losses()[k], direct_losses(models[s], probe), rtol=0, atol=ATOL)
    assert run.attrs["source"] == "offline" and run.attrs["model_class"] == "TinyGPT"
    assert run.attrs["n_params_non_embedding"] == count_parameters(TinyGPT(CONFIG))["n_params_non_embedding"]
    assert run.capacity == 4  # trimmed
    paths = {r.step: r.path for r in discover_checkpoints(d)}
    assert run.coord("wall_time").tolist() == [os.path.getmtime(paths[s]) for s in run.steps.tolist()]


def test_result_is_invariant_to_worker_count_and_batch_size(tmp_path, folder, probe):
    d, _ = folder
    record_offline(d, tmp_path / "s.zarr", "w1", probe=probe, workers=1, batch_size=3, progress=False)
    record_offline(d, tmp_path / "s.zarr", "w2", workers=2, progress=False)  # probe from the store
    s = open_store(tmp_path / "s.zarr", mode="r")
    a, b = s.run("w1"), s.run("w2")
    assert a.steps.tolist() == b.steps.tolist()
    assert a.coord("ckpt_fingerprint").tolist() == b.coord("ckpt_fingerprint").tolist()
    np.testing.assert_allclose(a.losses(), b.losses(), rtol=0, atol=ATOL)


def test_resume_appends_only_new_checkpoints(tmp_path, folder, probe):
    d, models = folder
    refs = discover_checkpoints(d)
    store = tmp_path / "s.zarr"
    first = record_offline(refs[:2], store, "r", probe=probe, progress=False)
    assert first["recorded"] == [0, 10]
    with pytest.raises(RunExistsError, match="resume"):
        record_offline(d, store, "r", progress=False)
    out = record_offline(d, store, "r", resume=True, progress=False)
    assert out["skipped"] == [0, 10] and out["recorded"] == [100, 1000] and out["rows"] == 4
    run = open_store(store, mode="r").run("r")
    assert run.steps.tolist() == [0, 10, 100, 1000]
    for k, s in enumerate(run.steps.tolist()):
        np.testing.assert_allclose(run.losses()[k], direct_losses(models[s], probe), rtol=0, atol=ATOL)
    again = record_offline(d, store, "r", resume=True, progress=False)
    assert again["recorded"] == [] and again["rows"] == 4

    late = [CheckpointRef(50, refs[0].path, "torch")]  # a step inside the committed range, never stored
    with pytest.warns(UserWarning, match=r"steps \[50\].*not recorded"):
        out = record_offline(late, store, "r", resume=True, progress=False)
    assert out["recorded"] == [] and out["skipped"] == [50]


def test_huggingface_folders(tmp_path, probe):
    pytest.importorskip("transformers")
    st, pt = make_hf_model(1), make_hf_model(2)
    st.save_pretrained(tmp_path / "checkpoint-100")  # config.json + model.safetensors
    (tmp_path / "checkpoint-200").mkdir()
    hf_config().save_pretrained(tmp_path / "checkpoint-200")
    torch.save(pt.state_dict(), tmp_path / "checkpoint-200" / "pytorch_model.bin")  # legacy layout
    out = record_offline(tmp_path, tmp_path / "s.zarr", "hf", probe=probe, workers=2, progress=False)
    assert out["recorded"] == [100, 200]
    run = open_store(tmp_path / "s.zarr", mode="r").run("hf")
    assert run.coord("ckpt_fingerprint").tolist() == [weights_fingerprint(st), weights_fingerprint(pt)]
    assert run.attrs["model_class"] == "GPT2LMHeadModel"
    for k, m in enumerate((st, pt)):
        np.testing.assert_allclose(run.losses()[k], direct_losses(m, probe), rtol=0, atol=ATOL)


def test_bare_state_dicts_of_an_hf_architecture(tmp_path, probe):
    pytest.importorskip("transformers")
    models = {s: make_hf_model(s) for s in (5, 6)}
    hf_config().to_json_file(tmp_path / "config.json")  # has model_type: an HF config for the bare files
    torch.save(models[5].state_dict(), tmp_path / "step_5.pt")
    save_torch(models[6], tmp_path / "step_6.pt", prefix="module.")
    record_offline(tmp_path, tmp_path / "s.zarr", "r", probe=probe, workers=2, progress=False)
    run = open_store(tmp_path / "s.zarr", mode="r").run("r")
    assert run.coord("ckpt_fingerprint").tolist() == [weights_fingerprint(models[s]) for s in (5, 6)]
    for k, s in enumerate((5, 6)):
        np.testing.assert_allclose(run.losses()[k], direct_losses(models[s], probe), rtol=0, atol=ATOL)


def test_model_factory_and_missing_model(tmp_path, probe):
    cfg = GPTConfig(vocab_size=64, context=32, n_layer=1, n_head=2, n_embd=8)
    models = {s: make_model(s, cfg) for s in (1, 2)}
    for s, m in models.items():
        save_torch(m, tmp_path / f"step_{s}.pt")
    with pytest.raises(InputError, match="model_factory"):
        record_offline(tmp_path, tmp_path / "s.zarr", "r", probe=probe, progress=False)
    assert not (tmp_path / "s.zarr").exists()  # the failed call left no new store behind
    record_offline(tmp_path, tmp_path / "s.zarr", "r", probe=probe, model_factory=lambda: TinyGPT(cfg), progress=False)
    run = open_store(tmp_path / "s.zarr", mode="r").run("r")
    np.testing.assert_allclose(run.losses()[1], direct_losses(models[2], probe), rtol=0, atol=ATOL)
    with pytest.raises(InputError, match="does not fit the model"):  # wrong config: a clear message
        record_offline(tmp_path, tmp_path / "s.zarr", "r2", model_factory=lambda: TinyGPT(CONFIG), progress=False)


def test_store_without_probe(tmp_path, folder, probe):
    d, _ = folder
    with pytest.raises(NotAStoreError, match="probe"):
        record_offline(d, tmp_path / "none.zarr", "r", progress=False)
    src = tmp_path / "src.zarr"
    open_store(src, probe, mode="a")
    record_offline(refs := discover_checkpoints(d)[:1], tmp_path / "new.zarr", "r", probe=src, progress=False)
    assert open_store(tmp_path / "new.zarr", mode="r").probe_fingerprint == probe.fingerprint
    assert isinstance(refs[0], CheckpointRef)


# -- D and M axes -------------------------------------------------------------------------


def test_data_axis_sweep_from_manifest(tmp_path, probe):
    write_spec(tmp_path)
    budgets = {4096: make_model(11), 1024: make_model(12), 2048: make_model(13)}
    entries = []
    for budget, m in budgets.items():
        save_torch(m, tmp_path / f"final_{budget}.pt")
        entries.append({"path": f"final_{budget}.pt", "axis_value": budget, "tokens_seen": budget})
    (tmp_path / "manifest.json").write_text(json.dumps({"axis": "D", "checkpoints": entries}))
    out = record_offline(tmp_path, tmp_path / "s.zarr", "d", probe=probe, progress=False)
    assert out["axis"] == "D"
    run = open_store(tmp_path / "s.zarr", mode="r").run("d")
    assert run.axis == "D" and run.steps.tolist() == [0, 1, 2]
    assert run.axis_values.tolist() == [1024, 2048, 4096] and run.coord("tokens_seen").tolist() == [1024, 2048, 4096]
    for k, budget in enumerate((1024, 2048, 4096)):
        np.testing.assert_allclose(run.losses()[k], direct_losses(budgets[budget], probe), rtol=0, atol=ATOL)

    save_torch(make_model(14), tmp_path / "final_8192.pt")  # the sweep grows: resume appends
    entries.append({"path": "final_8192.pt", "axis_value": 8192})
    (tmp_path / "manifest.json").write_text(json.dumps({"axis": "D", "checkpoints": entries}))
    out = record_offline(tmp_path, tmp_path / "s.zarr", "d", resume=True, progress=False)
    assert out["recorded"] == [3] and open_store(tmp_path / "s.zarr", mode="r").run("d").axis_values[-1] == 8192
    entries.append({"path": "final_8192.pt", "axis_value": 512})  # a value before the committed ones
    (tmp_path / "manifest.json").write_text(json.dumps({"axis": "D", "checkpoints": entries}))
    with pytest.raises(InputError, match="axis values"):
        record_offline(tmp_path, tmp_path / "s.zarr", "d", resume=True, progress=False)


def test_model_size_axis_with_per_entry_models(tmp_path, probe):
    entries, models = [], {}
    for width in (16, 8):
        cfg = GPTConfig(vocab_size=64, context=32, n_layer=1, n_head=2, n_embd=width)
        m = make_model(width, cfg)
        n = count_parameters(m)["n_params_non_embedding"]
        save_safetensors(m, tmp_path / f"width{width}.safetensors")
        models[n] = m
        entries.append({"path": f"width{width}.safetensors", "axis_value": n, "model": {"type": "tinygpt", "config": cfg.to_dict()}})
    (tmp_path / "manifest.json").write_text(json.dumps({"checkpoints": entries}))
    record_offline(tmp_path, tmp_path / "s.zarr", "m", probe=probe, axis="M", progress=False)
    run = open_store(tmp_path / "s.zarr", mode="r").run("m")
    assert run.axis == "M" and run.axis_values.tolist() == sorted(models)
    assert "n_params" not in run.attrs  # one count per run would be wrong on an M axis
    for k, n in enumerate(sorted(models)):
        np.testing.assert_allclose(run.losses()[k], direct_losses(models[n], probe), rtol=0, atol=ATOL)


# -- command line -------------------------------------------------------------------------


def test_cli_functions(tmp_path, folder, probe, capsys):
    d, _ = folder
    src = tmp_path / "src.zarr"
    open_store(src, probe, mode="a")
    parser = add_cli_arguments(argparse.ArgumentParser(prog="tokdyn record-offline"))
    argv = ["--checkpoints", str(d), "--out", str(tmp_path / "o.zarr"), "--run", "r", "--probe", str(src),
            "--workers", "2", "--no-progress"]  # fmt: skip
    assert run_cli(parser.parse_args(argv)) == 0
    assert "recorded 4 checkpoint(s) (steps 0..1000)" in capsys.readouterr().out
    assert run_cli(parser.parse_args(argv + ["--resume"])) == 0
    assert "nothing new, 4 already committed" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match="npz"):
            run_cli(parser.parse_args(argv[:6] + ["--probe", str(tmp_path / "losses.npz")]))
