"""Where offline checkpoints' models come from, and what the recorder may import.

A bare state dict's model is rebuilt by a builder from :mod:`tokdyn.runtime`'s registry, chosen
by its spec's ``"type"``: the recorder imports no model class, the command line still records the
demo model's checkpoints, and transformers is imported once, safely, before worker threads start.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import tokdyn
from offline_fixtures import direct_losses, hf_config, make_hf_model, make_probe, save_torch
from tokdyn.errors import InputError
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.record.offline import CheckpointRef, build_model, record_offline
from tokdyn.cli.record import add_cli_arguments, run_cli
from tokdyn.record.offline.loading import needs_transformers
from tokdyn.runtime import model_kinds, register_model_builder
from tokdyn.store import open_store

ROOT = Path(tokdyn.__file__).resolve().parents[1]
ATOL = 1e-5
DEMO_CONFIG = GPTConfig(vocab_size=257, context=128, n_layer=4)  # the model tokdyn demo trains (train.record_tiny_run)


def _python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports this checkout's tokdyn."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _demo_checkpoints(folder: Path, steps=(0, 50)) -> dict[int, TinyGPT]:
    """State dicts of the demo's model, as a training script saves them, with its GPTConfig as config.json."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(DEMO_CONFIG.to_dict()))
    models = {}
    for s in steps:
        torch.manual_seed(s)
        models[s] = TinyGPT(DEMO_CONFIG)
        save_torch(models[s], folder / f"step_{s:06d}.pt")
    return models


def _probe_store(path: Path):
    probe = make_probe(vocab=DEMO_CONFIG.vocab_size)
    open_store(path, probe, mode="a")
    return probe


# -- the demo's checkpoints -----------------------------------------------------------------


def test_record_offline_command_on_the_demo_models_checkpoints(tmp_path):
    models = _demo_checkpoints(tmp_path / "ckpts")
    probe = _probe_store(tmp_path / "src.zarr")
    out = tmp_path / "out.zarr"
    proc = _python("", "-m", "tokdyn.cli", "record-offline", "--checkpoints", str(tmp_path / "ckpts"), "--out", str(out),
                   "--run", "demo", "--probe", str(tmp_path / "src.zarr"), "--workers", "2", "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recorded 2 checkpoint(s) (steps 0..50)" in proc.stdout
    run = open_store(out, mode="r").run("demo")
    assert run.steps.tolist() == [0, 50] and run.attrs["model_class"] == "TinyGPT"
    assert run.attrs["model_config"] == DEMO_CONFIG.to_dict()
    for k, s in enumerate(run.steps.tolist()):
        np.testing.assert_allclose(run.losses()[k], direct_losses(models[s], probe), rtol=0, atol=ATOL)


def test_tinygpt_kind_works_in_a_process_that_never_imported_the_model(tmp_path):
    models = _demo_checkpoints(tmp_path / "ckpts", steps=(3,))
    probe = _probe_store(tmp_path / "src.zarr")
    code = """
        import sys
        from tokdyn.record.offline import record_offline
        assert "tokdyn.model" not in sys.modules, "the recorder imported the demo model"
        out = record_offline(sys.argv[1], sys.argv[2], "r", probe=sys.argv[3], workers=1, progress=False)
        assert out["recorded"] == [3], out
        assert "tokdyn.model" in sys.modules  # imported by the registry, for the "tinygpt" kind
        print("ok")
    """
    proc = _python(code, str(tmp_path / "ckpts"), str(tmp_path / "out.zarr"), str(tmp_path / "src.zarr"))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    run = open_store(tmp_path / "out.zarr", mode="r").run("r")
    np.testing.assert_allclose(run.losses()[0], direct_losses(models[3], probe), rtol=0, atol=ATOL)


# -- the registry -----------------------------------------------------------------------------


def test_a_registered_kind_builds_bare_state_dicts(tmp_path):
    cfg = GPTConfig(vocab_size=64, context=32, n_layer=1, n_head=2, n_embd=8)
    built = []

    def build(config: dict) -> TinyGPT:
        built.append(config)
        return TinyGPT(GPTConfig(**config))

    register_model_builder("test-registered-gpt", build)
    assert "test-registered-gpt" in model_kinds()
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    save_torch(model, tmp_path / "final.pt")
    manifest = {"model": {"type": "test-registered-gpt", "config": cfg.to_dict()}, "checkpoints": [{"path": "final.pt", "step": 7}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    probe = make_probe()
    record_offline(tmp_path, tmp_path / "s.zarr", "r", probe=probe, workers=1, progress=False)
    assert built == [cfg.to_dict()]
    run = open_store(tmp_path / "s.zarr", mode="r").run("r")
    np.testing.assert_allclose(run.losses()[0], direct_losses(model, probe), rtol=0, atol=ATOL)


def test_build_model_errors_name_the_spec():
    with pytest.raises(InputError, match=r"^spec\.json: model type must be one of \[.*'hf'.*'tinygpt'.*\], got 'nope'"):
        build_model({"type": "nope", "config": {}}, where="spec.json")
    with pytest.raises(InputError, match=r"^spec\.json: unknown GPTConfig fields \['width'\]"):
        build_model({"type": "tinygpt", "config": {"width": 3}}, where="spec.json")
    with pytest.raises(InputError, match=r"^spec\.json: n_embd \(7\) must be divisible by n_head \(2\)"):
        build_model({"config": {"n_embd": 7, "n_head": 2}}, where="spec.json")  # type defaults to tinygpt
    register_model_builder("test-not-a-module", lambda config: "a string")
    with pytest.raises(InputError, match=r"spec\.json: the builder returned a str"):
        build_model({"type": "test-not-a-module"}, where="spec.json")


# -- import rules -----------------------------------------------------------------------------


def _imported_modules(path: Path) -> set[str]:
    """Every module an import statement anywhere in ``path`` names (functions included), absolute."""
    package = ".".join(path.relative_to(ROOT).parent.parts)  # tokdyn/record/offline/x.py: tokdyn.record.offline
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def test_the_recorder_never_imports_the_demo_model():
    files = sorted((ROOT / "tokdyn" / "record").rglob("*.py"))
    assert any(f.parent.name == "offline" for f in files)
    for f in files:
        bad = {m for m in _imported_modules(f) for top in ("tokdyn.model", "tokdyn.train", "tokdyn.demo")
               if m == top or m.startswith(top + ".")}  # fmt: skip
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}"


def test_importing_the_recorder_loads_no_model_and_no_command_line():
    code = """
        import sys
        import tokdyn.record, tokdyn.record.offline
        from tokdyn.record.offline import discovery, loading, models, recording
        loaded = sorted(m for m in sys.modules if m in ("tokdyn.model", "tokdyn.train", "tokdyn.demo", "tokdyn.cli",
                                                        "tokdyn.cli.record", "transformers"))
        assert not loaded, loaded
        print("ok")
    """
    proc = _python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# -- transformers -----------------------------------------------------------------------------


def test_first_import_of_transformers_is_safe_from_threads():
    """transformers swaps a lazy module into sys.modules mid-import: 16 threads importing it at
    once got ``module 'transformers' has no attribute 'PreTrainedModel'`` in 8 of 10 fresh
    processes before the import was taken under a lock."""
    pytest.importorskip("transformers")
    code = """
        import threading
        from tokdyn.record.offline.models import import_transformers

        N = 16
        barrier = threading.Barrier(N)
        errors = []

        def work():
            barrier.wait()
            try:
                import_transformers().PreTrainedModel
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=work) for _ in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(errors or "ok")
    """
    proc = _python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.stdout + proc.stderr)[-3000:]


def test_transformers_is_imported_before_workers_only_when_needed(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "step_1.pt").write_bytes(b"")
    ref = CheckpointRef(1, bare / "step_1.pt", "torch")
    assert not needs_transformers([ref])  # no spec: loading it reports the error
    (bare / "config.json").write_text(json.dumps(DEMO_CONFIG.to_dict()))
    assert not needs_transformers([ref])  # GPTConfig fields: the tiny GPT
    hf_config().to_json_file(bare / "config.json")
    assert needs_transformers([ref]) and not needs_transformers([ref], model_factory=lambda: TinyGPT(DEMO_CONFIG))
    (tmp_path / "checkpoint-5").mkdir()
    assert needs_transformers([CheckpointRef(5, tmp_path / "checkpoint-5", "hf")])


def test_no_progress_silences_transformers_loading_bars(tmp_path, capfd):
    transformers = pytest.importorskip("transformers")
    make_hf_model(1).save_pretrained(tmp_path / "ckpts" / "checkpoint-10")
    open_store(tmp_path / "src.zarr", make_probe(), mode="a")
    parser = add_cli_arguments(argparse.ArgumentParser(prog="tokdyn record-offline"))
    argv = ["--checkpoints", str(tmp_path / "ckpts"), "--out", str(tmp_path / "o.zarr"), "--run", "r",
            "--probe", str(tmp_path / "src.zarr"), "--workers", "1"]  # fmt: skip
    assert transformers.utils.logging.is_progress_bar_enabled()
    capfd.readouterr()
    assert run_cli(parser.parse_args(argv + ["--no-progress"])) == 0
    err = capfd.readouterr().err
    assert "it/s]" not in err and "%|" not in err, err  # no tqdm bar, ours or transformers'
    assert transformers.utils.logging.is_progress_bar_enabled()  # the process-wide switch is restored
