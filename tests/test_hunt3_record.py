"""Three defects of the record stage, each fixed as a class:

1. a checkpoint name without a step (Lightning's ``last-v1.ckpt``, ``model_bf16.pt``) was read
   as a made-up step (1, 16) and its row stored there, silently;
2. a second Ctrl-C while the recorder closed (or flushed) dropped the rows of its last
   ``commit_every`` window, silently; the offline recorder dropped rows it had evaluated;
3. a model declaring fewer positions than the probe's context was evaluated anyway: silently
   wrong losses (rotary positions) or an error from deep inside the model (learned positions).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch import nn

import tokdyn
from tokdyn.errors import InputError
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.record import TokenLossRecorder, record_offline
from tokdyn.record.offline import discovery
from tokdyn.record.offline.discovery import discover_checkpoints

V, C, S = 40, 8, 4  # a tiny vocabulary, context and probe


class Net(nn.Module):
    """Embedding + linear head: declares no context (no config)."""

    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(V, 8)
        self.h = nn.Linear(8, V)

    def forward(self, x):
        return self.h(self.e(x))


def _probe(context: int = C, seed: int = 0) -> tokdyn.ProbeSet:
    return tokdyn.ProbeSet.from_tokens(np.random.default_rng(seed).integers(0, V, (S, context + 1)))


def _net(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def _lightning(path: Path, net: nn.Module, global_step: int) -> None:
    """What a Lightning ``.ckpt`` holds: the module's state dict under ``state_dict`` and the
    trainer's ``global_step``, beside loop and callback state of plain values."""
    torch.save({"epoch": 0, "global_step": global_step, "pytorch-lightning_version": "2.6.6",
                "state_dict": {f"net.{k}": v for k, v in net.state_dict().items()},
                "loops": {"fit_loop": {"state_dict": {}}}, "callbacks": {}, "optimizer_states": [],
                "lr_schedulers": [], "hparams_name": "kwargs", "hyper_parameters": {"lr": 0.1}}, path)  # fmt: skip


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


# == 1. checkpoint names without a step =========================================================


@pytest.mark.parametrize("name", ["last-v1.ckpt", "last.ckpt", "best.ckpt", "model-v2.pt", "model_bf16.pt", "weights_fp32.bin",
                                  "epoch=3.ckpt", "epoch=3-val_loss=0.12.ckpt", "pythia-70m.pt", "llama-7b.safetensors",
                                  "model-00001-of-00002.safetensors", "ckpt-3f2a9c.pt", "seed42.pt", "run3.pt",
                                  "model-v1.0.pt", "final_lr3e-4.pt", "2024-05-01.pt", "step100k.pt"])  # fmt: skip
def test_a_name_without_a_step_gives_none(name):
    """`last-v1.ckpt` was step 1, `model_bf16.pt` step 16, `epoch=3-val_loss=0.12.ckpt` step 12."""
    assert discovery._last_int(Path("/nonexistent") / name) is None


@pytest.mark.parametrize("name,step", [("step1000", 1000), ("checkpoint-500", 500), ("epoch=0-step=100.ckpt", 100),
                                       ("epoch=1-step=200-v1.ckpt", 200), ("step100_bf16.pt", 100), ("model_100.bin", 100),
                                       ("ckpt-7.safetensors", 7), ("a_7.safetensors", 7), ("iter_0001000.pt", 1000),
                                       ("1000.pt", 1000), ("checkpoint-300-v1.ckpt", 300), ("model_100_bf16.pt", 100),
                                       ("pythia-70m-deduped-143000.pt", 143000), ("gpt2-124M-1000.pt", 1000),
                                       ("ckpt_100_epoch=3.pt", 100), ("llama-v2-7b-100.pt", 100)])  # fmt: skip
def test_names_that_give_a_step_keep_it(name, step):
    assert discovery._last_int(Path("/nonexistent") / name) == step


_WORDS = ["checkpoint", "ckpt", "model", "iter", "weights", "last", "best", "final", "run_a", "latest"]


@hs.composite
def _non_step_part(draw) -> str:
    """A part of a name that holds a number but is never a step."""
    k, j = draw(hs.integers(0, 999)), draw(hs.integers(0, 99))
    return draw(hs.sampled_from([
        f"v{k}", "bf16", "fp16", "fp32", "fp8", "int8", "int4", f"epoch={k}", f"epoch_{k}", f"ep{k}", f"seed{k}",
        f"rank{k}", f"run{k}", f"{k}m", f"{k}b", f"{k}.{j}b", f"{k}k", f"val_loss={k}.{j:02d}", f"acc={j}",
        f"{k:05d}-of-{k + j + 1:05d}", f"lr{j + 1}e-{j % 9 + 1}", f"{k}.{j}", f"{k}e-{j}", "2024-05-01",
        f"{k}f{j}a", f"v{k}.{j}",
    ]))  # fmt: skip


_EXT = hs.sampled_from([".pt", ".ckpt", ".safetensors", ".bin", ".pth"])
_SEP = hs.sampled_from(["-", "_"])
# Steps; not those that read as a date (20100901): a date in a name is never its step.
_STEP = hs.integers(0, 10**12).filter(lambda n: discovery._DATE.fullmatch(str(n)) is None)


@settings(max_examples=150, deadline=None)
@given(word=hs.sampled_from(_WORDS), before=hs.lists(hs.tuples(_SEP, _non_step_part()), max_size=2), sep=_SEP,
       step=_STEP, zeros=hs.integers(0, 3), after=hs.lists(hs.tuples(_SEP, _non_step_part()), max_size=3),
       ext=_EXT)  # fmt: skip
def test_the_step_of_a_name_is_its_last_integer_that_is_not_something_else(word, before, sep, step, zeros, after, ext):
    """Versions, dtypes, epochs, seeds, sizes, shards, logged values and hashes around the step
    never replace it (`ckpt-100-v1` is 100, not 1; `pythia-70m-100_bf16` is 100, not 16)."""
    name = word + "".join(s + p for s, p in before) + sep + "0" * zeros + str(step) + "".join(s + p for s, p in after) + ext
    assert discovery._last_int(Path("/nonexistent") / name) == step, name


@settings(max_examples=150, deadline=None)
@given(word=hs.sampled_from(_WORDS), parts=hs.lists(hs.tuples(_SEP, _non_step_part()), max_size=3), ext=_EXT)
def test_a_name_made_of_parts_that_are_not_steps_gives_none(word, parts, ext):
    """`last-v1.ckpt`, `model_bf16.pt`, `best-epoch=3-val_loss=0.12.ckpt`: no step, never a made-up one."""
    name = word + "".join(s + p for s, p in parts) + ext
    assert discovery._last_int(Path("/nonexistent") / name) is None, name


@settings(max_examples=100, deadline=None)
@given(word=hs.sampled_from(_WORDS), parts=hs.lists(hs.tuples(_SEP, _non_step_part()), max_size=3),
       sep=hs.sampled_from(["", "_", "-", "="]), step=hs.integers(0, 10**12), ext=_EXT)  # fmt: skip
def test_the_integer_after_step_wins_over_every_other_part(word, parts, sep, step, ext):
    middle = len(parts) // 2
    name = (word + "".join(s + p for s, p in parts[:middle]) + f"-step{sep}{step}" + "".join(s + p for s, p in parts[middle:]) + ext)
    assert discovery._last_int(Path("/nonexistent") / name) == step, name


def test_a_lightning_folder_takes_the_step_a_checkpoint_records_when_its_name_gives_none(tmp_path):
    """`last-v1.ckpt` was recorded as step 1 and `last.ckpt` refused the whole folder. A Lightning
    checkpoint records its global_step: `last-v1.ckpt` is step 300, and `last.ckpt`, a copy of the
    step-200 checkpoint (save_last), is skipped with a warning instead of failing as a duplicate."""
    nets = {s: _net(s) for s in (100, 200, 300)}
    _lightning(tmp_path / "epoch=0-step=100.ckpt", nets[100], 100)
    _lightning(tmp_path / "epoch=1-step=200.ckpt", nets[200], 200)
    _lightning(tmp_path / "last.ckpt", nets[200], 200)
    _lightning(tmp_path / "last-v1.ckpt", nets[300], 300)
    with pytest.warns(UserWarning, match=r"last\.ckpt records step 200, the step of epoch=1-step=200\.ckpt.*not recorded twice"):
        refs = discover_checkpoints(tmp_path)
    assert [(r.step, r.path.name, r.step_from) for r in refs] == [
        (100, "epoch=0-step=100.ckpt", "name"), (200, "epoch=1-step=200.ckpt", "name"), (300, "last-v1.ckpt", "file")]  # fmt: skip

    store = str(tmp_path / "s.zarr")
    probe = _probe()
    tokdyn.open_store(store, probe, mode="a")
    with pytest.warns(UserWarning, match="not recorded twice"):
        summary = record_offline(tmp_path, store, "lit", model_factory=Net, progress=False, workers=2)
    assert summary["recorded"] == [100, 200, 300]
    t = torch.as_tensor(probe.tokens).long()
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(nets[300](t[:, :-1]).flatten(0, 1), t[:, 1:].flatten(), reduction="none")
    np.testing.assert_allclose(tokdyn.open_store(store).run("lit").losses()[2], want.numpy(), rtol=1e-6, atol=1e-6)


def test_a_name_without_a_step_and_a_file_without_one_is_refused_in_one_line(tmp_path):
    """`model-v2.pt` holding a bare state dict was recorded at step 2, silently."""
    torch.save(_net(0).state_dict(), tmp_path / "step_1.pt")
    torch.save(_net(1).state_dict(), tmp_path / "model-v2.pt")
    sd = _net(2).state_dict()
    sd["step"] = torch.tensor(5)  # a model's buffer named "step" is not the checkpoint's step
    torch.save(sd, tmp_path / "weights_bf16.pt")
    with pytest.raises(InputError, match=r"cannot tell the step of \['model-v2\.pt', 'weights_bf16\.pt'\].*-v1.*manifest\.json") as info:
        discover_checkpoints(tmp_path)
    _one_line(info.value)


def test_the_command_line_names_the_files_in_one_line(tmp_path, capsys):
    from tokdyn.cli import main

    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save(_net(0).state_dict(), ck / "last-v1.ckpt")
    tokdyn.open_store(str(tmp_path / "s.zarr"), _probe(), mode="a")
    assert main(["record-offline", "--checkpoints", str(ck), "--out", str(tmp_path / "s.zarr"), "--run", "r", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot tell the step of ['last-v1.ckpt']" in err and "manifest.json" in err, err


def test_a_file_records_its_step_for_a_single_file_a_manifest_and_other_loops(tmp_path):
    """A single `last-v1.ckpt` was step 1; nanoGPT's `ckpt.pt` (iter_num), an HF folder without a
    number (trainer_state.json) and a manifest entry without "step" were refused."""
    _lightning(tmp_path / "last-v1.ckpt", _net(0), 300)
    (ref,) = discover_checkpoints(tmp_path / "last-v1.ckpt")
    assert (ref.step, ref.step_from) == (300, "file")

    nano = tmp_path / "nano"
    nano.mkdir()
    torch.save({"model": _net(0).state_dict(), "iter_num": 250, "best_val_loss": torch.tensor(1.5),
                "model_args": {"n_layer": 1}}, nano / "ckpt.pt")  # fmt: skip
    assert [r.step for r in discover_checkpoints(nano)] == [250]

    hf = tmp_path / "hf"
    (hf / "final").mkdir(parents=True)
    (hf / "final" / "config.json").write_text("{}")  # discovery reads names and trainer_state.json only
    (hf / "final" / "trainer_state.json").write_text(json.dumps({"global_step": 40, "epoch": 1.0}))
    assert [(r.step, r.kind) for r in discover_checkpoints(hf)] == [(40, "hf")]

    man = tmp_path / "man"
    man.mkdir()
    _lightning(man / "last.ckpt", _net(0), 9)
    (man / "manifest.json").write_text(json.dumps({"checkpoints": [{"path": "last.ckpt"}]}))
    assert [(r.step, r.step_from) for r in discover_checkpoints(man)] == [(9, "file")]
    (man / "manifest.json").write_text(json.dumps({"checkpoints": [{"path": "last.ckpt", "step": 12}]}))
    assert [(r.step, r.step_from) for r in discover_checkpoints(man)] == [(12, "manifest")]  # the manifest wins


def test_a_name_that_contradicts_the_step_its_file_records_is_said(tmp_path):
    from tokdyn.record.offline.loading import StepMismatchWarning

    _lightning(tmp_path / "epoch=0-step=5.ckpt", _net(0), 7)
    store = str(tmp_path / "s.zarr")
    tokdyn.open_store(store, _probe(), mode="a")
    with pytest.warns(StepMismatchWarning, match=r"name gives step 5 but the checkpoint records global_step 7; it is recorded at step 5"):
        summary = record_offline(tmp_path, store, "lit", model_factory=Net, progress=False, workers=1)
    assert summary["recorded"] == [5]


# == 2. a second Ctrl-C while rows are being written ============================================


def _recorder(store_path: str, steps=(0, 1, 2, 3)) -> TokenLossRecorder:
    """A recorder whose rows all wait in the writer's block (commit_every=60) until close/flush."""
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=V, context=C, n_layer=1, n_head=2, n_embd=16))
    rec = TokenLossRecorder(model, _probe(), store_path, "r", schedule=list(steps), commit_every=60)
    for s in steps:
        rec.record(s)
    return rec


def _slow_writes(monkeypatch, rec: TokenLossRecorder, wait_s: float):
    """Make the writer thread's block write wait ``wait_s`` seconds (or until ``go``) before writing:
    a slow disk, while the researcher presses Ctrl-C. Returns (entered, go)."""
    entered, go = threading.Event(), threading.Event()
    real = rec._writer.append_rows

    def slow(*args, **kwargs):
        entered.set()
        go.wait(wait_s)
        return real(*args, **kwargs)

    monkeypatch.setattr(rec._writer, "append_rows", slow)
    return entered, go


def _ctrl_c_when(event: threading.Event, *, then: threading.Event | None = None) -> threading.Thread:
    """Once ``event`` is set, deliver SIGINT to the main thread (a Ctrl-C); with ``then``, a second
    one once ``then`` is set too."""

    def press():
        if not event.wait(10):
            return
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        if then is not None and then.wait(10):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    t = threading.Thread(target=press, daemon=True)
    t.start()
    return t


class _Seen(logging.Handler):
    """Sets ``event`` when a record containing ``text`` is logged."""

    def __init__(self, text: str):
        super().__init__()
        self.text, self.event = text, threading.Event()

    def emit(self, record):
        if self.text in record.getMessage():
            self.event.set()


@pytest.mark.parametrize("how", ["close", "flush"])
def test_a_ctrl_c_while_rows_are_written_is_held_until_they_are_committed(store_path, monkeypatch, caplog, how):
    """Ctrl-C during close() (the second of a researcher who stopped training with one) raised at
    once from the wait for the writer thread: the block of rows waiting for commit_every was never
    written (the process exits; the daemon writer dies with it)."""
    rec = _recorder(store_path)
    entered, go = _slow_writes(monkeypatch, rec, wait_s=1.0)
    _ctrl_c_when(entered)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
            getattr(rec, how)()
        assert tokdyn.open_store(store_path).run("r").steps.tolist() == [0, 1, 2, 3]  # all committed, then re-raised
    finally:
        go.set()
        rec.close()
    assert "writing the 4 recorded row(s) of run 'r' not yet committed (steps [0, 1, 2, 3]) before stopping" in caplog.text
    assert "press Ctrl-C again" in caplog.text


def test_a_second_ctrl_c_while_rows_are_written_stops_and_names_the_lost_rows(store_path, monkeypatch, caplog):
    rec = _recorder(store_path)
    entered, go = _slow_writes(monkeypatch, rec, wait_s=30)
    seen = _Seen("press Ctrl-C again")
    logging.getLogger("tokdyn.record").addHandler(seen)
    _ctrl_c_when(entered, then=seen.event)
    t0 = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
            rec.close()
        assert time.monotonic() - t0 < 10  # it stopped, without waiting for the writer
    finally:
        logging.getLogger("tokdyn.record").removeHandler(seen)
        go.set()
        rec._thread.join(10)
    lost = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lost) == 1 and "\n" not in lost[0].getMessage()
    assert "run 'r': stopped while writing; the rows of steps [0, 1, 2, 3] were recorded but are not committed" in lost[0].getMessage()


_TWICE = """
import signal, sys, threading, time
import numpy as np, torch, tokdyn
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.record import TokenLossRecorder

probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 40, (4, 9)))
model = TinyGPT(GPTConfig(vocab_size=40, context=8, n_layer=1, n_head=2, n_embd=16))
rec = TokenLossRecorder(model, probe, sys.argv[1], "r", schedule=[0, 1, 2, 3], commit_every=60)
real = rec._writer.append_rows

def slow(*args, **kwargs):  # a slow disk: the researcher presses Ctrl-C again while close() waits
    time.sleep(0.3)  # close() is blocked waiting for this thread by now
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    time.sleep(2.0)
    return real(*args, **kwargs)

rec._writer.append_rows = slow
with rec:
    for step in range(4):
        rec.record(step)
    raise KeyboardInterrupt  # the first Ctrl-C, in the training loop
"""


def test_ctrl_c_twice_in_a_training_script_keeps_every_recorded_row(tmp_path):
    """End to end: the script ends with KeyboardInterrupt either way; the rows must be in the store."""
    script = tmp_path / "twice.py"
    script.write_text(textwrap.dedent(_TWICE))
    store = str(tmp_path / "s.zarr")
    proc = subprocess.run([sys.executable, str(script), store], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    assert tokdyn.open_store(store).run("r").steps.tolist() == [0, 1, 2, 3], proc.stderr
    assert "tokdyn: writing the 4 recorded row(s) of run 'r' not yet committed (steps [0, 1, 2, 3]) before stopping" in proc.stderr


def test_offline_rows_evaluated_when_ctrl_c_comes_are_written_first(tmp_path, monkeypatch, caplog):
    """A Ctrl-C while a batch of evaluated checkpoints was being appended dropped the rest of
    the batch: evaluations that take minutes each on a large model."""
    from tokdyn.record.offline import recording

    for s in range(4):
        torch.save(_net(s).state_dict(), tmp_path / f"step_{s}.pt")
    store = str(tmp_path / "s.zarr")
    tokdyn.open_store(store, _probe(), mode="a")
    real = recording._RunRows.append
    calls = []

    def append(self, ref, res):
        if not calls:  # Ctrl-C as the first evaluated row is written
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        calls.append(ref.step)
        return real(self, ref, res)

    monkeypatch.setattr(recording._RunRows, "append", append)
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        record_offline(tmp_path, store, "r", model_factory=Net, progress=False, workers=4)
    assert tokdyn.open_store(store).run("r").steps.tolist() == [0, 1, 2, 3]
    assert "writing the rows of 4 evaluated checkpoint(s) of run 'r'" in caplog.text


def test_holding_ctrl_c_leaves_another_handler_and_other_threads_alone():
    from tokdyn.record._interrupt import hold_interrupts

    mine = []
    previous = signal.signal(signal.SIGINT, lambda *a: mine.append(1))
    try:
        with hold_interrupts(lambda: "w", lambda: "l"):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(0.05)
        assert mine == [1]  # the program's own handler ran; nothing is raised
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    box = []
    t = threading.Thread(target=lambda: box.append(hold_interrupts(lambda: "w", lambda: "l").__enter__()))
    t.start()
    t.join()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # nothing installed from a thread


# == 3. a model shorter than the probe's context ==================================================


def _llama(positions: int):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=2, max_position_embeddings=positions)  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _gpt2(positions: int):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_positions=positions, n_embd=16, n_layer=1, n_head=2))


@pytest.mark.parametrize("make,field", [
    (lambda: _llama(16), "max_position_embeddings"),  # rotary: evaluated past 16 silently
    (lambda: _gpt2(16), "n_positions"),  # learned: an IndexError deep inside (a device-side assert on a GPU)
    (lambda: TinyGPT(GPTConfig(vocab_size=V, context=16, n_layer=1, n_head=2, n_embd=16)), "config.context"),
    (lambda: types.SimpleNamespace(config=types.SimpleNamespace(block_size=16)), "config.block_size"),  # nanoGPT
])  # fmt: skip
def test_a_model_declaring_fewer_positions_than_the_probe_is_refused_before_the_store(tmp_path, make, field):
    model = make()
    if not isinstance(model, nn.Module):  # nanoGPT's GPT: a module whose config says block_size
        net = Net()
        net.config = model.config
        model = net
    store = tmp_path / "s.zarr"
    with pytest.raises(InputError, match=r"the model takes at most 16 positions \(config\.\w+\) but the probe's sequences have a "
                                         r"context of 32 tokens") as info:  # fmt: skip
        TokenLossRecorder(model, _probe(context=32), str(store), "r", schedule=[0])
    _one_line(info.value)
    # the field as the model's config spells it (GPT-2's n_positions, not the alias HF reads it by)
    assert f"({field if field.startswith('config.') else 'config.' + field})" in str(info.value)
    assert not store.exists()  # refused before the store was made


def test_a_model_declaring_enough_positions_or_none_records(tmp_path):
    for j, model in enumerate([_llama(32), _gpt2(32), Net()]):
        with TokenLossRecorder(model, _probe(context=32), str(tmp_path / "s.zarr"), f"r{j}", schedule=[0]) as rec:
            rec.record(0)
    assert [tokdyn.open_store(str(tmp_path / "s.zarr")).run(f"r{j}").n_committed for j in range(3)] == [1, 1, 1]


def test_offline_recording_refuses_a_checkpoint_shorter_than_the_probe_in_one_line(tmp_path, capsys):
    from tokdyn.cli import main

    ck = tmp_path / "ck"
    _llama(16).save_pretrained(ck / "checkpoint-1")
    capsys.readouterr()  # transformers' progress bar
    store = str(tmp_path / "s.zarr")
    tokdyn.open_store(store, _probe(context=32), mode="a")
    with pytest.raises(InputError, match=r"checkpoint-1 \(step 1\): the model takes at most 16 positions .* context of 32"):
        record_offline(ck, store, "r", progress=False, workers=1)
    assert main(["record-offline", "--checkpoints", str(ck), "--out", store, "--run", "r2", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "at most 16 positions" in err and "context of 32" in err, err
    assert os.path.isdir(store) and not tokdyn.open_store(store).has_run("r")
