"""Offline recording of what a Hugging Face ``Trainer`` leaves on disk. Each test is a class of
layout that was recorded wrongly, refused, or named misleadingly:

1. ``trainer_state.json`` holds the step's ``num_input_tokens_seen`` and logged learning rate, but
   the rows stored ``tokens_seen = -1`` and ``lr = NaN``; the logged rate is the update's own since
   transformers 4.51 and the next update's before, so the version that saved it picks the entry;
2. the Trainer's training-state files (``training_args.bin``, ``optimizer.pt``, ``scheduler.pt``,
   ``rng_state.pth``) were taken for checkpoints without a step;
3. a save still being written under a temporary name (``checkpoint-20.tmp/``, ``tmp-checkpoint-30/``)
   was recorded at the step in its name;
4. the newest ``checkpoint-N/`` of a training still saving (no weights yet, or no
   ``trainer_state.json`` yet) stopped the recording with an error;
5. a PEFT adapter checkpoint was skipped as a folder lacking ``config.json``, or failed as a model
   without weights;
6. an HF folder's ``wall_time`` was the folder's modification time, which moves whenever a file in
   it is deleted (an optimizer state removed to save space).

And what was right, kept right: a bf16 or fp16 checkpoint is evaluated in ``--model-dtype``
(float32), with the losses of its weights upcast exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from offline_fixtures import direct_losses, make_hf_model, make_probe
from tokdyn.errors import InputError
from tokdyn.record.offline import discover_checkpoints, record_offline
from tokdyn.store import open_store

pytest.importorskip("transformers")


def _log(step: int, lr: float, tokens: int) -> dict:
    return {"epoch": 0.1 * step, "learning_rate": lr, "loss": 3.0, "num_input_tokens_seen": tokens, "step": step}


def _trainer_state(step: int, *, tokens: int | None = None, logs: list[dict] = ()) -> dict:
    state = {"global_step": step, "log_history": list(logs), "max_steps": 100}
    if tokens is not None:
        state["num_input_tokens_seen"] = tokens
    return state


def _checkpoint(folder: Path, step: int, *, seed: int | None = None, version: str = "5.25.0", state: dict | None = None) -> None:
    """An HF Trainer ``checkpoint-N/`` folder: a tiny GPT-2 (or only its config.json when ``seed`` is
    None), the Trainer's state files, and ``trainer_state.json``."""
    if seed is None:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "transformers_version": version}))
    else:  # the version as given, not the installed one's (what the lr's reading depends on)
        make_hf_model(seed).save_pretrained(folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "transformers_version": version}))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        (folder / name).write_bytes(b"not a model")
    if state is not None:
        (folder / "trainer_state.json").write_text(json.dumps(state))


def _probe_store(path: Path):
    return open_store(path, make_probe(n_sequences=4), mode="a")


def _record(folder: Path, store: Path, **kw) -> dict:
    return record_offline(folder, store, "r", progress=False, workers=1, **kw)


# == 1. tokens_seen and lr from trainer_state.json ==================================================

_LOGS = [_log(s, lr=1e-3 * s, tokens=64 * s) for s in range(1, 7)]


def test_trainer_state_gives_each_row_its_tokens_and_learning_rate(tmp_path):
    """transformers >= 4.51 logs at step s the rate of update s (the one that made these weights)."""
    for step in (2, 4):
        _checkpoint(tmp_path / f"checkpoint-{step}", step, state=_trainer_state(step, tokens=64 * step, logs=_LOGS[:step]))
    refs = discover_checkpoints(tmp_path)
    assert [(r.step, r.tokens_seen, r.lr) for r in refs] == [(2, 128, 2e-3), (4, 256, 4e-3)]


def test_an_older_transformers_logged_the_next_updates_rate(tmp_path):
    """Before 4.51 the Trainer logged after the scheduler stepped: the entry at s holds update s+1's
    rate, so update s's is the entry at s - 1; with none there, the rate is unknown, not guessed."""
    _checkpoint(tmp_path / "checkpoint-4", 4, version="4.40.2", state=_trainer_state(4, tokens=256, logs=_LOGS[:4]))
    _checkpoint(tmp_path / "checkpoint-6", 6, version="4.50.0", state=_trainer_state(6, tokens=384, logs=_LOGS[5:6]))
    _checkpoint(tmp_path / "checkpoint-8", 8, version="", state=_trainer_state(8, tokens=512, logs=[_log(8, 1.0, 512)]))
    refs = discover_checkpoints(tmp_path)
    assert [(r.step, r.tokens_seen, r.lr) for r in refs] == [(4, 256, 3e-3), (6, 384, None), (8, 512, None)]


def test_a_state_of_another_step_or_without_a_count_gives_nothing(tmp_path):
    """A trainer_state.json whose global_step is not the folder's step (a renamed copy) belongs to
    another step: neither its tokens nor its rate are stored. A count of 0 (the Trainer's default,
    include_num_input_tokens_seen off) is unknown, not 0."""
    _checkpoint(tmp_path / "checkpoint-4", 4, state=_trainer_state(6, tokens=384, logs=_LOGS))
    _checkpoint(tmp_path / "checkpoint-6", 6, state=_trainer_state(6, tokens=0, logs=_LOGS))
    refs = discover_checkpoints(tmp_path)
    assert [(r.step, r.tokens_seen, r.lr) for r in refs] == [(4, None, None), (6, None, 6e-3)]


def test_a_manifest_value_wins_over_the_trainer_state(tmp_path):
    _checkpoint(tmp_path / "checkpoint-4", 4, state=_trainer_state(4, tokens=256, logs=_LOGS))
    (tmp_path / "manifest.json").write_text(json.dumps({"checkpoints": [{"path": "checkpoint-4", "tokens_seen": 1000}]}))
    [ref] = discover_checkpoints(tmp_path)
    assert (ref.step, ref.tokens_seen, ref.lr) == (4, 1000, 4e-3)


def test_the_rows_store_them(tmp_path):
    for step, seed in ((2, 1), (4, 2)):
        _checkpoint(tmp_path / "out" / f"checkpoint-{step}", step, seed=seed,
                    state=_trainer_state(step, tokens=64 * step, logs=_LOGS[:step]))  # fmt: skip
    _probe_store(tmp_path / "s.zarr")
    _record(tmp_path / "out", tmp_path / "s.zarr")
    run = open_store(tmp_path / "s.zarr").run("r")
    assert run.steps.tolist() == [2, 4]
    assert run.coord("tokens_seen").tolist() == [128, 256]
    np.testing.assert_allclose(run.coord("lr"), [2e-3, 4e-3])


# == 2. the Trainer's state files are no checkpoints ================================================


def test_training_state_files_are_not_checkpoints(tmp_path):
    """A flat folder of state dicts beside a loop's optimizer and RNG state records the state dicts."""
    (tmp_path / "step_100.pt").write_bytes(b"")
    for name in ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth", "rng_state_3.pth", "training_args.bin"):
        (tmp_path / name).write_bytes(b"")
    assert [(r.step, r.path.name) for r in discover_checkpoints(tmp_path)] == [(100, "step_100.pt")]


def test_a_trainer_output_folder_names_only_its_model(tmp_path):
    """The output folder's own final model is not recorded (tests/test_hunt5_offline_steps.py): the
    warning names its weights, never ``training_args.bin`` (which no rename makes a checkpoint)."""
    for step in (2, 4):
        _checkpoint(tmp_path / f"checkpoint-{step}", step, state=_trainer_state(step))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "training_args.bin").write_bytes(b"")
    with pytest.warns(UserWarning, match=r"own model \(\['model\.safetensors'\]:") as seen:
        refs = discover_checkpoints(tmp_path)
    assert [r.step for r in refs] == [2, 4] and not any("training_args" in str(w.message) for w in seen)


# == 3. temporary names ==============================================================================


def test_saves_under_a_temporary_name_are_not_recorded(tmp_path):
    _checkpoint(tmp_path / "checkpoint-10", 10, state=_trainer_state(10))
    _checkpoint(tmp_path / "checkpoint-20.tmp", 20)
    _checkpoint(tmp_path / "tmp-checkpoint-30", 30)
    (tmp_path / "tmp_cache").mkdir()  # an unrelated folder: not a save, not named
    with pytest.warns(UserWarning, match=r"\['checkpoint-20\.tmp', 'tmp-checkpoint-30'\] are named as saves still being written"):
        refs = discover_checkpoints(tmp_path)
    assert [r.step for r in refs] == [10]


# == 4. the newest checkpoint of a training still saving ============================================


@pytest.mark.parametrize("unfinished", ["no weights", "a shard missing", "no trainer_state.json"])
def test_the_newest_folder_being_written_waits_for_resume(tmp_path, unfinished):
    out = tmp_path / "out"
    _checkpoint(out / "checkpoint-2", 2, seed=1, state=_trainer_state(2))
    _checkpoint(out / "checkpoint-4", 4, seed=2, state=None if unfinished == "no trainer_state.json" else _trainer_state(4))
    newest = out / "checkpoint-4"
    if unfinished == "no weights":
        (newest / "model.safetensors").unlink()
    elif unfinished == "a shard missing":
        (newest / "model.safetensors").rename(newest / "model-00002-of-00002.safetensors")
        index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        (newest / "model.safetensors.index.json").write_text(json.dumps(index))
    _probe_store(tmp_path / "s.zarr")
    with pytest.warns(UserWarning, match=r"checkpoint-4 \(step 4\), the newest checkpoint, lacks its .*still being written"):
        summary = _record(out, tmp_path / "s.zarr")
    assert summary["recorded"] == [2]
    # the save completes: --resume records it
    shutil.rmtree(newest)
    _checkpoint(newest, 4, seed=2, state=_trainer_state(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _record(out, tmp_path / "s.zarr", resume=True)["recorded"] == [4]
    assert open_store(tmp_path / "s.zarr").run("r").steps.tolist() == [2, 4]


@pytest.mark.parametrize("how", ["a folder saved by save_pretrained", "a manifest entry"])
def test_a_finished_folder_that_never_gets_a_trainer_state_is_recorded(tmp_path, how):
    """Only the Trainer's own checkpoint-N folders are written with a trainer_state.json: a newest
    folder saved by save_pretrained (as the warning on the output folder's final model advises)
    was taken for a save in progress and skipped for good, and so was a manifest's entry (found
    by review)."""
    out = tmp_path / "out"
    _checkpoint(out / "checkpoint-2", 2, seed=1, state=_trainer_state(2))
    _checkpoint(out / "checkpoint-4", 4, seed=2, state=_trainer_state(4))
    make_hf_model(3).save_pretrained(out / ("final-step-6" if how != "a manifest entry" else "final"))
    if how == "a manifest entry":
        (out / "manifest.json").write_text(json.dumps({"checkpoints": [
            {"path": "checkpoint-2"}, {"path": "checkpoint-4"}, {"path": "final", "step": 6}]}))
    _probe_store(tmp_path / "s.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert _record(out, tmp_path / "s.zarr")["recorded"] == [2, 4, 6]


def test_a_folder_without_weights_before_the_newest_is_still_an_error(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out / "checkpoint-2", 2, state=_trainer_state(2))  # config only: a damaged run, not a save in progress
    _checkpoint(out / "checkpoint-4", 4, seed=2, state=_trainer_state(4))
    _probe_store(tmp_path / "s.zarr")
    with pytest.raises(InputError, match="checkpoint-2 has no model.safetensors or pytorch_model.bin"):
        _record(out, tmp_path / "s.zarr")


# == 5. PEFT adapters ===============================================================================


def _adapter(folder: Path, *, config: bool) -> None:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "gpt2"}))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    if config:
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))


def test_an_adapter_folder_is_named_as_one(tmp_path):
    _adapter(tmp_path / "checkpoint-10", config=False)
    _checkpoint(tmp_path / "checkpoint-20", 20, state=_trainer_state(20))
    with pytest.warns(UserWarning, match=r"\['checkpoint-10'\] hold PEFT adapters \(adapter_config\.json\), not whole models") as got:
        refs = discover_checkpoints(tmp_path)
    assert [r.step for r in refs] == [20] and not any("no config.json" in str(w.message) for w in got)


def test_an_adapter_folder_with_a_config_fails_as_an_adapter(tmp_path):
    _adapter(tmp_path / "out" / "checkpoint-10", config=True)
    _probe_store(tmp_path / "s.zarr")
    with pytest.raises(InputError, match=r"checkpoint-10 holds a PEFT adapter .*merge the adapter into its base model") as info:
        _record(tmp_path / "out", tmp_path / "s.zarr")
    assert "\n" not in str(info.value)


# == 6. wall_time ====================================================================================


def test_wall_time_is_when_the_weights_were_saved(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out / "checkpoint-2", 2, seed=1, state=_trainer_state(2))
    saved = 1_600_000_000.0
    os.utime(out / "checkpoint-2" / "model.safetensors", (saved, saved))
    (out / "checkpoint-2" / "optimizer.pt").unlink()  # later, to save space: the folder's mtime moves
    _probe_store(tmp_path / "s.zarr")
    _record(out, tmp_path / "s.zarr")
    assert open_store(tmp_path / "s.zarr").run("r").coord("wall_time").tolist() == [saved]


# == kept right: half-precision checkpoints ==========================================================


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_checkpoint_is_evaluated_in_float32(tmp_path, dtype):
    """A model saved in bf16/fp16 (config.json's dtype) is evaluated in --model-dtype, float32 by
    default: the losses of its stored weights upcast, computed by hand."""
    half = make_hf_model(7).to(dtype)
    half.save_pretrained(tmp_path / "out" / "checkpoint-5")
    upcast = make_hf_model(0)
    upcast.load_state_dict({k: v.float() for k, v in half.state_dict().items()})
    probe = make_probe(n_sequences=4)
    open_store(tmp_path / "s.zarr", probe, mode="a")
    _record(tmp_path / "out", tmp_path / "s.zarr")
    stored = open_store(tmp_path / "s.zarr").run("r").losses()[0]
    np.testing.assert_allclose(stored, direct_losses(upcast, probe), rtol=1e-5, atol=1e-5)


# == a real Trainer ===================================================================================


@pytest.mark.slow
def test_a_real_trainer_output_folder(tmp_path):
    """A Trainer run for 6 steps saving every 2 (warm-up 2, then linear decay): every checkpoint at
    its step, with the tokens it saw and the rate of the update that made it, computed here."""
    from transformers import Trainer, TrainingArguments

    model = make_hf_model(0)
    rng = np.random.default_rng(0)
    data = [{"input_ids": (t := torch.tensor(rng.integers(0, 64, 16))), "labels": t} for _ in range(64)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, save_steps=2, per_device_train_batch_size=4,
                             learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, logging_steps=1, report_to=[],
                             include_num_input_tokens_seen=True, use_cpu=True, disable_tqdm=True)  # fmt: skip
    Trainer(model=model, args=args, train_dataset=data).train()
    _probe_store(tmp_path / "s.zarr")
    _record(tmp_path / "out", tmp_path / "s.zarr")
    run = open_store(tmp_path / "s.zarr").run("r")
    assert run.steps.tolist() == [2, 4, 6]
    assert run.coord("tokens_seen").tolist() == [2 * 64, 4 * 64, 6 * 64]  # 4 sequences of 16 tokens an update
    rate = lambda s: 1e-3 * ((s - 1) / 2 if s <= 2 else (6 - (s - 1)) / 4)  # noqa: E731 - update s runs at scheduler step s - 1
    np.testing.assert_allclose(run.coord("lr"), [rate(2), rate(4), rate(6)])


def test_a_peft_training_output_folder_is_said_to_hold_adapters(tmp_path):
    """checkpoint-N/ folders of adapters and the final adapter in the output folder itself (PEFT's
    layout) was "cannot tell the step of ['adapter_model.safetensors'] ... Rename them"."""
    out = tmp_path / "out"
    for folder in (out / "checkpoint-10", out / "checkpoint-20", out):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
        (folder / "adapter_model.safetensors").write_bytes(b"")
    (out / "training_args.bin").write_bytes(b"")
    with pytest.raises(InputError, match=r"holds a PEFT adapter .*merge_and_unload") as e, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        discover_checkpoints(out)
    assert "Rename" not in str(e.value)
