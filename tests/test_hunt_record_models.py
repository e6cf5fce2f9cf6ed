"""Hostile models and checkpoint folders for the recorder and record-offline: outputs of every
shape (dicts, tuples, half precision), logits that do not cover the probe, step numbers in
checkpoint names that are not the last integer, Lightning checkpoints (the network under an
attribute prefix), and Ctrl-C while checkpoints are being evaluated."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch import nn

import tokdyn
from tokdyn.errors import InputError
from tokdyn.record import TokenLossRecorder, record_offline
from tokdyn.record.offline.discovery import discover_checkpoints

V, C, S = 40, 8, 4


class Net(nn.Module):
    """Embedding + linear head; ``out`` chooses the output's form, ``head`` the logits' width."""

    def __init__(self, out: str = "tensor", dtype: torch.dtype = torch.float32, head: int = V):
        super().__init__()
        self.e = nn.Embedding(V, 16)
        self.h = nn.Linear(16, head)
        self.out, self.dt = out, dtype

    def forward(self, x):
        logits = self.h(self.e(x)).to(self.dt)  # (B, T, head)
        return {"tensor": lambda: logits, "dict": lambda: {"loss": None, "logits": logits},
                "tuple": lambda: (logits, None)}[self.out]()  # fmt: skip


def _probe(last: int | None = None, seed: int = 0) -> tokdyn.ProbeSet:
    t = np.random.default_rng(seed).integers(0, V, (S, C + 1))
    if last is not None:
        t[:, -1] = last
    return tokdyn.ProbeSet.from_tokens(t)


def _reference(model: Net, probe: tokdyn.ProbeSet) -> np.ndarray:
    with torch.no_grad():
        t = torch.as_tensor(probe.tokens).long()
        logits = model.h(model.e(t[:, :-1])).to(model.dt).float()
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), t[:, 1:].flatten(), reduction="none").numpy()


@pytest.mark.parametrize("out,dtype", [("dict", torch.float32), ("tuple", torch.float32), ("tensor", torch.bfloat16),
                                       ("tensor", torch.float16)])  # fmt: skip
def test_every_output_form_records_the_losses_of_its_logits(out, dtype, tmp_path):
    torch.manual_seed(0)
    model, probe = Net(out, dtype), _probe()
    with TokenLossRecorder(model, probe, str(tmp_path / "s.zarr"), "r", schedule=[0]) as rec:
        assert rec.maybe_record(0)
    row = tokdyn.open_store(str(tmp_path / "s.zarr")).run("r").losses()[0]
    np.testing.assert_allclose(row, _reference(model, probe), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("head", [V - 5, 10])
def test_logits_that_do_not_cover_a_target_are_one_input_error_at_the_call(head, tmp_path):
    """A target id past the logits (a model whose head is narrower than its embedding, or a
    probe whose last tokens only exceed it) was a raw IndexError from cross-entropy, and on a GPU
    a device-side assert that ends the training process."""
    probe = _probe(last=V - 1)
    rec = TokenLossRecorder(Net(head=head), probe, str(tmp_path / "s.zarr"), "r", schedule=[0, 1])
    with pytest.raises(InputError, match=rf"gives {head} logits per position but the probe's target ids reach {V - 1}"):
        rec.record(0)
    rec.close()


def test_token_losses_checks_the_targets_itself():
    from tokdyn.record import token_losses

    t = torch.as_tensor(_probe(last=V - 1).tokens).long()
    with pytest.raises(InputError, match="logits per position"):
        token_losses(Net(head=V - 1), t)
    assert token_losses(Net(head=V), t).shape == (S * C,)


def test_logits_without_a_vocabulary_axis_are_refused():
    from tokdyn.record import token_losses

    t = torch.as_tensor(_probe().tokens).long()
    with pytest.raises(InputError, match=r"expected \[B, T, V\]"):
        token_losses(Net(), t, forward=lambda m, x: m(x)[..., 0])  # (B, T): the shape of the inputs


# -- checkpoint names ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(step=hs.integers(0, 10**9), zeros=hs.integers(0, 3), sep=hs.sampled_from(["", "_", "-", "="]),
       prefix=hs.sampled_from(["", "epoch=3-", "run7_", "pythia-70m-", "global_"]),
       suffix=hs.sampled_from(["", "_bf16", "-v1", "_fp16_rank0", "-of-143000", "_seed42"]),
       ext=hs.sampled_from([".pt", ".ckpt", ".safetensors", ".bin", ""]))  # fmt: skip
def test_the_step_of_a_name_is_the_integer_after_step(step, zeros, sep, prefix, suffix, ext):
    """The last integer of `step100_bf16.pt` is 16, of Lightning's `epoch=0-step=100-v1.ckpt` 1:
    rows were stored at wrong steps, silently."""
    from tokdyn.record.offline.discovery import _last_int

    name = f"{prefix}step{sep}{'0' * zeros}{step}{suffix}{ext}"
    assert _last_int(Path("/nonexistent") / name) == step


@pytest.mark.parametrize("name,step", [("checkpoint-300", 300), ("model_100.bin", 100), ("ckpt-7.safetensors", 7),
                                       ("run3_step_250.ckpt", 250), ("step_000100.pt", 100), ("final.pt", None)])  # fmt: skip
def test_names_without_step_keep_the_last_integer(name, step):
    from tokdyn.record.offline.discovery import _last_int

    assert _last_int(Path("/nonexistent") / name) == step


def test_a_folder_of_lightning_style_names_is_read_at_the_right_steps(tmp_path):
    for name in ("epoch=0-step=100.ckpt", "epoch=1-step=200-v1.ckpt", "step300_bf16.pt"):
        torch.save({"w": torch.zeros(1)}, tmp_path / name)
    assert [r.step for r in discover_checkpoints(tmp_path)] == [100, 200, 300]
    torch.save({"w": torch.zeros(1)}, tmp_path / "epoch=1-step=200.ckpt")  # Lightning's -v1 beside the original
    with pytest.raises(InputError, match="both have step 200"):
        discover_checkpoints(tmp_path)


# -- a Lightning module's checkpoint ---------------------------------------------------------


class Owner(nn.Module):  # what a LightningModule's state dict looks like: the network under an attribute
    def __init__(self):
        super().__init__()
        self.net = Net()


def test_a_state_dict_saved_under_an_attribute_prefix_loads_into_the_network(tmp_path):
    """A Lightning .ckpt holds the LightningModule's state dict: every key starts with the
    attribute holding the network (`net.`, `model.`); it was refused as 'weights the model lacks'."""
    torch.manual_seed(0)
    owner, probe = Owner(), _probe()
    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save({"epoch": 0, "global_step": 5, "state_dict": owner.state_dict()}, ck / "epoch=0-step=5.ckpt")
    store = str(tmp_path / "s.zarr")
    tokdyn.open_store(store, probe, mode="a")
    summary = record_offline(ck, store, "lit", model_factory=Net, progress=False, workers=1)
    assert summary["recorded"] == [5]
    np.testing.assert_allclose(tokdyn.open_store(store).run("lit").losses()[0], _reference(owner.net, probe), rtol=1e-6, atol=1e-6)


def test_a_prefix_that_does_not_make_the_keys_the_models_is_still_refused(tmp_path):
    torch.manual_seed(0)
    sd = {f"net.{k}": v for k, v in Net().state_dict().items()}
    sd["ema.e.weight"] = torch.zeros(V, 16)  # not every key shares the prefix
    torch.save(sd, tmp_path / "step_1.pt")
    store = str(tmp_path / "s.zarr")
    tokdyn.open_store(store, _probe(), mode="a")
    with pytest.raises(InputError, match="has weights the model lacks"):
        record_offline(tmp_path, store, "x", model_factory=Net, progress=False, workers=1)


# -- Ctrl-C ----------------------------------------------------------------------------------

_SLOW = """
import sys, time, numpy as np, torch, tokdyn
from torch import nn
from tokdyn.record import record_offline

class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.e, self.h = nn.Embedding(64, 8), nn.Linear(8, 64)

    def forward(self, x):
        time.sleep(1.5)
        return self.h(self.e(x))

folder = sys.argv[1]
for st in range(4):
    torch.save(Slow().state_dict(), f"{folder}/step{st}.pt")
probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 64, (8, 9)))
tokdyn.open_store(f"{folder}/s.zarr", probe, mode="a")
print("ready", flush=True)
try:
    record_offline(folder, f"{folder}/s.zarr", "r", model_factory=Slow, workers=2, batch_size=1, progress=False)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.slow
def test_ctrl_c_during_offline_recording_ends_within_one_forward(tmp_path):
    """The worker threads went on evaluating their checkpoints after Ctrl-C (every forward of the
    probe), and the interpreter waited for them at exit: minutes for a large model."""
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(_SLOW))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(2.0)  # inside the first checkpoints' forwards (8 sequences x 1.5 s each)
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    waited = time.monotonic() - t0
    assert "interrupted" in out
    assert waited < 5.0, f"exited {waited:.1f} s after Ctrl-C"


# -- attach ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"start_step": -1}, {"start_step": 2.5}, {"start_step": True}, {"tokens_per_step": 0}])
def test_attach_refuses_a_counter_that_would_misnumber_rows(kwargs, tmp_path):
    """start_step=-1 numbered the first update step 0 and stored it as the untrained model;
    a float start_step was truncated; tokens_per_step=0 stored tokens_seen 0 for every row."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TokenLossRecorder(model, _probe(), str(tmp_path / "s.zarr"), "r", schedule=[0, 1, 2]) as rec:
        with pytest.raises(InputError):
            with rec.attach(opt, **kwargs):
                pass
        assert rec.n_recorded == 0


def test_last_position_logits_name_the_forward_that_gives_every_position():
    """A nanoGPT-style model called without targets returns logits [B, 1, V]: the line says so and
    how to pass a forward that gives every position's."""
    from tokdyn.record import token_losses

    t = torch.as_tensor(_probe().tokens).long()
    with pytest.raises(InputError, match=r"last position's logits only .*forward=lambda model, ids"):
        token_losses(Net(), t, forward=lambda m, x: m(x)[:, -1:, :])
    with pytest.raises(InputError) as e:  # another shape: no such advice
        token_losses(Net(), t, forward=lambda m, x: m(x)[..., 0])
    assert "last position" not in str(e.value)


def test_a_run_left_empty_by_a_failed_first_row_says_how_to_go_on(tmp_path):
    """A recorder whose first row failed (the model's vocabulary too small) leaves its run with no
    row: the retry under the same name said only "pass resume=True to continue it"."""
    from tokdyn.errors import RunExistsError
    from tokdyn.record import TokenLossRecorder

    probe, path = _probe(last=V - 1), str(tmp_path / "s.zarr")
    with pytest.raises(InputError, match="logits per position"):
        with TokenLossRecorder(Net(head=V - 1), probe, path, "r", schedule=[0, 1]) as rec:
            rec.maybe_record(0)
    with pytest.raises(RunExistsError, match=r"no committed row .*resume=True .*delete_run\('r'\)"):
        TokenLossRecorder(Net(), probe, path, "r", schedule=[0, 1])
    with TokenLossRecorder(Net(), probe, path, "r", schedule=[0, 1], resume=True) as rec:  # as it says
        rec.maybe_record(0)
    assert tokdyn.open_store(path).run("r").n_committed == 1
    with pytest.raises(RunExistsError, match=r"already exists in .*; pass resume=True to continue it$"):
        TokenLossRecorder(Net(), probe, path, "r", schedule=[0, 1])
