"""Offline recording of checkpoints whose weights, forward or name do not say what they seem to.
Each test is a class that was recorded wrongly, refused wrongly, or reported as a bug of tokdyn:

1. a Hugging Face folder whose weights lack some of the model's (an untied LM head removed, every
   key under a prefix, a folder saved from ``GPT2Model``), hold more than its config builds, or
   hold tensors of other shapes was recorded with the random values ``from_pretrained`` gave the
   rest (two byte-identical checkpoints gave two rows), or failed pointing at a report that
   transformers had printed above;
2. a GPT-2 state dict saved by a transformers before 4.31 (with its causal-mask buffers
   ``attn.bias`` and ``attn.masked_bias``) was refused as holding weights the model lacks;
3. a model whose forward fails on the probe's shape (8 learned positions, a context of 16) was an
   "internal error ... a bug" of tokdyn; running out of memory must stay what it is;
4. the advice to pass ``forward=`` for a nanoGPT-style model (last position's logits only) named
   an argument ``record_offline`` did not take, and was the command line's advice too;
5. a name with a model or a parallelism after its step (``ckpt-1000_gpt2.pt``,
   ``ckpt_1000_tp2.pt``) was read as step 2.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch import nn

from offline_fixtures import direct_losses, hf_config, make_hf_model, make_probe
from tokdyn.cli import main
from tokdyn.errors import InputError, TokdynError
from tokdyn.record import TokenLossRecorder, record_offline, token_losses
from tokdyn.record.offline import discovery
from tokdyn.record.offline.discovery import discover_checkpoints
from tokdyn.runtime import register_model_builder
from tokdyn.store import open_store

V = 64  # the probe's vocabulary and the tiny models'


def _record(folder: Path, store: Path, run: str = "r", **kw) -> dict:
    return record_offline(folder, store, run, probe=make_probe(n_sequences=4, context=16), progress=False, workers=1, **kw)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "internal error" not in err, err
    return err


# == 1. a Hugging Face folder whose weights are not all the model's ===================================


@pytest.fixture
def load_reports():
    """What transformers logs about a checkpoint's weights while the test runs (its LOAD REPORT)."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logging.getLogger("transformers").addHandler(handler)
    yield seen
    logging.getLogger("transformers").removeHandler(handler)


def _rewrite_weights(folder: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    f = folder / "model.safetensors"
    save_file(change(load_file(f)), f, metadata={"format": "pt"})


def _untied(seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(hf_config(tie_word_embeddings=False))


def _without_head(folder: Path) -> set[str]:
    _untied().save_pretrained(folder)
    _rewrite_weights(folder, lambda sd: {k: v for k, v in sd.items() if not k.startswith("lm_head.")})
    return {"lm_head.weight"}


def _under_a_prefix(folder: Path) -> set[str]:
    _untied().save_pretrained(folder)
    _rewrite_weights(folder, lambda sd: {f"foo.{k}": v for k, v in sd.items()})
    return {"lm_head.weight", "foo.lm_head.weight", "prefix, 'foo.',"}


def _base_model(folder: Path) -> set[str]:
    import transformers

    torch.manual_seed(0)
    transformers.GPT2Model(hf_config(tie_word_embeddings=False)).save_pretrained(folder)
    return {"lm_head.weight"}


@pytest.mark.parametrize("make", [_without_head, _under_a_prefix, _base_model])
def test_an_hf_folder_lacking_weights_is_refused_naming_them(tmp_path, make, load_reports):
    """Two byte-identical folders, each lacking weights its config.json's model has: they were
    recorded (different random values in each row, exit 0) under transformers' report."""
    pytest.importorskip("transformers")
    lacking = make(tmp_path / "ck" / "step0")
    shutil.copytree(tmp_path / "ck" / "step0", tmp_path / "ck" / "step1")
    with pytest.raises(InputError, match="lacks weights the model needs") as info:
        _record(tmp_path / "ck", tmp_path / "s.zarr")
    assert "step0" in str(info.value) and all(k in str(info.value) for k in lacking), info.value  # named, a few of each
    assert "\n" not in str(info.value)
    assert not any("LOAD REPORT" in m or m.startswith("Some weights of") for m in load_reports)  # the one line says it
    assert not (tmp_path / "s.zarr").exists()  # no row, and no store left by the failed call


def test_an_hf_folder_with_more_layers_than_its_config_is_refused(tmp_path):
    """A config.json of 1 layer beside the weights of 2 built a 1-layer model from the first layer's
    weights (the second's unused): recorded as if it were the model trained."""
    pytest.importorskip("transformers")
    import transformers

    transformers.GPT2LMHeadModel(hf_config(n_layer=2)).save_pretrained(tmp_path / "ck" / "step0")
    hf_config(n_layer=1).to_json_file(tmp_path / "ck" / "step0" / "config.json")
    with pytest.raises(InputError, match=r"has weights the model lacks: \['transformer\.h\.1\."):
        _record(tmp_path / "ck", tmp_path / "s.zarr")


def test_an_hf_folder_of_other_shapes_names_them(tmp_path, load_reports):
    """A config.json of another width: "You set `ignore_mismatched_sizes` to `False` ... look at the
    above report", with the report printed above it. Now the line names the shapes itself."""
    pytest.importorskip("transformers")
    make_hf_model(0).save_pretrained(tmp_path / "ck" / "step0")
    cfg = json.loads((tmp_path / "ck" / "step0" / "config.json").read_text())
    (tmp_path / "ck" / "step0" / "config.json").write_text(json.dumps({**cfg, "n_embd": 32}))
    with pytest.raises(InputError, match=r"does not fit the model: .*c_attn\.weight is \[16, 48\] in the file and \[32, 96\] in the model"):
        _record(tmp_path / "ck", tmp_path / "s.zarr")
    assert not any("LOAD REPORT" in m for m in load_reports)


def test_the_command_says_it_in_one_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    _without_head(tmp_path / "ck" / "step0")
    probe = make_probe(n_sequences=4, context=16)
    open_store(tmp_path / "s.zarr", probe, mode="a")
    capsys.readouterr()  # what saving the folder printed
    assert main(["record-offline", "--checkpoints", str(tmp_path / "ck"), "--out", str(tmp_path / "s.zarr"), "--run", "r",
                 "--no-progress", "--workers", "1"]) == 1  # fmt: skip
    err = _one_error_line(capsys)
    assert err.startswith("tokdyn record-offline: error: ") and "lacks weights the model needs: ['lm_head.weight']" in err
    assert "LOAD REPORT" not in err


def test_tied_and_old_hf_folders_still_record_their_weights(tmp_path, load_reports):
    """What transformers itself lets pass is not refused: a tied LM head (stored once) and the
    causal-mask buffers older versions saved with GPT-2 (``attn.bias``, ``attn.masked_bias``)."""
    pytest.importorskip("transformers")
    models = {s: make_hf_model(s) for s in (0, 1)}
    for s, m in models.items():
        m.save_pretrained(tmp_path / "ck" / f"step{s}")

    def old(sd):  # what save_pretrained wrote before transformers 4.31
        sd["transformer.h.0.attn.bias"] = torch.tril(torch.ones(32, 32, dtype=torch.uint8)).view(1, 1, 32, 32)
        sd["transformer.h.0.attn.masked_bias"] = torch.tensor(-1e4)
        return sd

    _rewrite_weights(tmp_path / "ck" / "step1", old)
    summary = _record(tmp_path / "ck", tmp_path / "s.zarr")
    assert summary["recorded"] == [0, 1]
    losses = open_store(tmp_path / "s.zarr").run("r").losses()
    for k, s in enumerate((0, 1)):
        np.testing.assert_allclose(losses[k], direct_losses(models[s], make_probe(n_sequences=4, context=16)), rtol=0, atol=1e-5)
    assert not any("LOAD REPORT" in m for m in load_reports)


# == 2. a GPT-2 state dict saved before transformers 4.31 ==============================================


def test_an_old_gpt2_state_dict_with_its_causal_mask_buffers_records(tmp_path):
    """`oldgpt2/step100.pt has weights the model lacks: ['transformer.h.0.attn.bias', ...]`: the
    buffers model.state_dict() held before transformers 4.31, which the model computes now."""
    pytest.importorskip("transformers")
    model = make_hf_model(3)
    sd = model.state_dict()
    sd["transformer.h.0.attn.bias"] = torch.tril(torch.ones(32, 32, dtype=torch.uint8)).view(1, 1, 32, 32)
    sd["transformer.h.0.attn.masked_bias"] = torch.tensor(-1e4)
    (tmp_path / "oldgpt2").mkdir()
    torch.save(sd, tmp_path / "oldgpt2" / "step100.pt")
    hf_config().to_json_file(tmp_path / "oldgpt2" / "config.json")
    assert _record(tmp_path / "oldgpt2", tmp_path / "s.zarr")["recorded"] == [100]
    np.testing.assert_allclose(open_store(tmp_path / "s.zarr").run("r").losses()[0],
                               direct_losses(model, make_probe(n_sequences=4, context=16)), rtol=0, atol=1e-5)  # fmt: skip
    # a weight the model lacks beside them is still refused, and named alone
    sd["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(16, 64)
    torch.save(sd, tmp_path / "oldgpt2" / "step100.pt")
    with pytest.raises(InputError, match=r"has weights the model lacks: \['transformer\.h\.1\.mlp\.c_fc\.weight'\]\."):
        _record(tmp_path / "oldgpt2", tmp_path / "s2.zarr")


def test_a_buffer_the_model_keeps_out_of_its_state_is_dropped_from_a_file_quietly():
    """The class behind the GPT-2 case, whatever transformers is installed (its 4.x GPT-2 holds
    the causal mask as a buffer with persistent=False, which a file saved before 4.31 carries):
    a key naming a buffer the model computes is dropped, as transformers drops it; a key of a
    buffer or weight the model does not have is not."""
    from tokdyn.record.offline.loading import _ignored_unexpected

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("mask", torch.ones(4, 4), persistent=False)
            self.register_buffer("scale", torch.ones(4))

    ignored = _ignored_unexpected(nn.Sequential(Masked()))
    assert ignored("0.mask")
    assert not any(map(ignored, ["mask", "0.scale", "0.lin.weight", "0.other", "0.mask.x", "1.mask"]))


# == 3. a model that fails on the probe's shape ========================================================


class Pos8(nn.Module):
    """8 learned positions, added to the embeddings as many a hand-written model does."""

    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(V, 8)
        self.pos = nn.Parameter(torch.zeros(1, 8, 8))
        self.h = nn.Linear(8, V)

    def forward(self, idx):  # (B, T) ids; fails past T = 8
        return self.h(self.e(idx) + self.pos[:, : idx.shape[1]])


def _state_dicts(folder: Path, factory, steps=(1,)) -> None:
    folder.mkdir()
    for s in steps:
        torch.manual_seed(s)
        torch.save(factory().state_dict(), folder / f"step{s}.pt")


def test_a_model_failing_on_the_probes_shape_is_one_line_naming_the_checkpoint(tmp_path):
    """`internal error in tokdyn 0.1.0: RuntimeError: The size of tensor a (16) must match ...
    (a bug: please report it ...)`: any error of the model's own forward is the model's."""
    _state_dicts(tmp_path / "ck", Pos8)
    with pytest.raises(InputError) as info:
        _record(tmp_path / "ck", tmp_path / "s.zarr", model_factory=Pos8)
    text = str(info.value)
    assert text.startswith(f"checkpoint {tmp_path / 'ck' / 'step1.pt'} (step 1): ") and "\n" not in text
    assert "[B, C] = [4, 16]" in text and "RuntimeError: The size of tensor a (16) must match the size of tensor b (8)" in text


def test_the_recorder_names_the_step_the_model_failed_at(tmp_path):
    probe = make_probe(n_sequences=4, context=16)
    with pytest.raises(InputError, match=r"^recording step 0 of run 'r': the model failed .*\[B, C\] = \[4, 16\]"):
        with TokenLossRecorder(Pos8(), probe, tmp_path / "s.zarr", "r", schedule=[0, 1]) as rec:
            rec.record(0)


def _record_with_builder(tmp_path, capsys, name: str, cls) -> str:
    """`tokdyn record-offline` of state dicts of ``cls``, built by a builder registered as
    ``name``, on a probe of context 16: it fails, and its one error line is returned."""
    register_model_builder(name, lambda config: cls())
    _state_dicts(tmp_path / "ck", cls)
    open_store(tmp_path / "s.zarr", make_probe(n_sequences=4, context=16), mode="a")
    assert main(["record-offline", "--checkpoints", str(tmp_path / "ck"), "--out", str(tmp_path / "s.zarr"), "--run", "r",
                 "--model", f'{{"type": "{name}"}}', "--no-progress", "--workers", "1"]) == 1  # fmt: skip
    return _one_error_line(capsys)


def test_the_command_reports_the_models_failure_in_one_line(tmp_path, capsys):
    err = _record_with_builder(tmp_path, capsys, "pos8-hunt18", Pos8)
    assert "step1.pt (step 1): the model failed" in err and "must match the size" in err


class Failing(nn.Module):
    def __init__(self, exc: BaseException):
        super().__init__()
        self.h, self.exc = nn.Linear(1, 1), exc

    def forward(self, idx):
        raise self.exc


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), MemoryError(),
                                 RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
                                 KeyboardInterrupt()])  # fmt: skip
def test_running_out_of_memory_or_ctrl_c_is_not_the_models_failure(exc):
    """A training loop may catch CUDA's OutOfMemoryError to retry smaller: the probe's forward
    passes it on as it is, as Ctrl-C."""
    t = torch.as_tensor(make_probe(n_sequences=2, context=4).tokens).long()
    with pytest.raises(type(exc)) as info:
        token_losses(Failing(exc), t)
    assert info.value is exc


def test_offline_out_of_memory_says_what_to_lower(tmp_path):
    """Offline, tokdyn runs the loop: one line (a MemoryError still) naming --batch-size, never a bug report."""
    _state_dicts(tmp_path / "ck", lambda: Failing(RuntimeError()))
    factory = lambda: Failing(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))  # noqa: E731
    with pytest.raises(MemoryError, match=r"step1\.pt \(step 1\): out of memory on cpu .*--batch-size, batch_size=; now 3") as info:
        _record(tmp_path / "ck", tmp_path / "s.zarr", model_factory=factory, batch_size=3)
    assert isinstance(info.value, TokdynError)


# == 4. forward= offline ===============================================================================


class Nano(nn.Module):
    """nanoGPT's contract: all positions' logits with targets, the last position's alone without."""

    def __init__(self):
        super().__init__()
        self.e, self.h = nn.Embedding(V, 8), nn.Linear(8, V)

    def forward(self, idx, targets=None):
        logits = self.h(self.e(idx))
        return (logits, None) if targets is not None else (logits[:, -1:, :], None)


def test_record_offline_takes_the_forward_its_advice_names(tmp_path):
    """The error said `forward=lambda model, ids: model(ids, ids)[0]`; record_offline(forward=...) was a TypeError."""
    _state_dicts(tmp_path / "ck", Nano, steps=(1, 2))
    with pytest.raises(InputError, match=r"last position's logits only .*forward=lambda model, ids"):
        _record(tmp_path / "ck", tmp_path / "s.zarr", model_factory=Nano)
    summary = _record(tmp_path / "ck", tmp_path / "s.zarr", model_factory=Nano, forward=lambda model, ids: model(ids, ids)[0])
    assert summary["recorded"] == [1, 2]
    t = torch.as_tensor(make_probe(n_sequences=4, context=16).tokens).long()
    for k, s in enumerate((1, 2)):
        net = Nano()
        net.load_state_dict(torch.load(tmp_path / "ck" / f"step{s}.pt"))
        with torch.no_grad():  # by hand: log-softmax of every position, the target's entry
            logp = torch.log_softmax(net.h(net.e(t[:, :-1])), dim=-1)
        want = -logp.gather(-1, t[:, 1:, None])[..., 0].reshape(-1)
        np.testing.assert_allclose(open_store(tmp_path / "s.zarr").run("r").losses()[k], want.numpy(), rtol=0, atol=1e-5)
    with pytest.raises(InputError, match="forward must be a callable"):
        _record(tmp_path / "ck", tmp_path / "s.zarr", run="r2", model_factory=Nano, forward="model(ids, ids)")


def test_the_command_line_says_what_it_can_do_instead_of_forward(tmp_path, capsys):
    """The command takes no forward=: its line says to record from Python with it, or give
    --model a model whose output is every position's logits."""
    err = _record_with_builder(tmp_path, capsys, "nano-hunt18", Nano)
    assert "last position's logits only" in err and "The command line takes no forward" in err
    assert "record_offline(..., forward=...)" in err and "--model" in err


# == 5. a model or a parallelism named after the step ==================================================

_GLUED = ["gpt2", "tp2", "pp4", "mp8", "dp16", "llama3", "t5", "zero3", "fsdp2", "qwen2", "phi3", "a100", "h100",
          "ddp4", "world8", "world_8", "fold3", "a6000", "v100", "l40s", "mi300x"]


@pytest.mark.parametrize("name,step", [
    ("ckpt-1000_gpt2.pt", 1000), ("ckpt_1000_tp2.pt", 1000), ("gpt2_ckpt_1000.pt", 1000), ("llama3-8b_500_tp2_pp4.pt", 500),
    ("ckpt1000_tp2.pt", 1000), ("iter500_gpt2.pt", 500), ("step100_tp2.pt", 100), ("a_7.safetensors", 7), ("model100.pt", 100),
    ("gpt2_tp4.pt", None), ("llama3_zero3.pt", None), ("gpt2_final.pt", None), ("llama3_best.pt", None),
    ("gpt2_model1000.pt", 1000), ("llama2_it1000.pt", 1000), ("run-1_model500.pt", 500), ("exp1_model500.pt", 500),
    ("qwen2.5_ckpt_300.pt", 300), ("gpt_1000.pt", 1000), ("llama-500.pt", 500),
    ("ckpt_1000_world8.pt", 1000), ("ckpt_1000_ddp4.pt", 1000), ("ckpt_1000_a6000.pt", 1000), ("fold3_ckpt_200.pt", 200),
])  # fmt: skip
def test_the_step_of_a_name_with_a_model_or_parallelism_in_it(name, step):
    """A model or a parallelism with its number (gpt2, llama3, tp2) is never the step, wherever it
    stands; the step is the last integer left, and a name with none left has no step."""
    assert discovery._last_int(Path("/nonexistent") / name) == step


@settings(max_examples=150, deadline=None)
@given(word=hs.sampled_from(["model", "ckpt", "weights", "run_a", "final"]), glued=hs.lists(hs.sampled_from(_GLUED), min_size=1, max_size=3),
       at=hs.integers(0, 3), sep=hs.sampled_from(["-", "_"]), step=hs.integers(0, 10**9).filter(lambda n: discovery._DATE.fullmatch(str(n)) is None),
       ext=hs.sampled_from([".pt", ".ckpt", ".safetensors", ".bin", ".pth"]))  # fmt: skip
def test_a_model_or_parallelism_number_is_never_the_step_beside_one(word, glued, at, sep, step, ext):
    parts = [*glued[:at], str(step), *glued[at:]]
    assert discovery._last_int(Path("/nonexistent") / (word + sep + sep.join(parts) + ext)) == step


def test_a_folder_of_such_names_records_each_at_its_step(tmp_path):
    """`ckpt-1000_gpt2.pt` and `ckpt-2000_gpt2.pt` were both step 2 (an error: two checkpoints at one step)."""
    for s in (1000, 2000):
        (tmp_path / f"ckpt-{s}_gpt2.pt").write_bytes(b"")
    assert [(r.step, r.path.name) for r in discover_checkpoints(tmp_path)] == [(1000, "ckpt-1000_gpt2.pt"), (2000, "ckpt-2000_gpt2.pt")]
