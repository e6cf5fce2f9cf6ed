"""Offline recording against the checkpoint layouts real frameworks write: each checkpoint gets its
true training step, or is refused or skipped in one line; never a made-up step, never one
checkpoint recorded twice. Each test is a class of names or layouts that was misassigned:

1. a decimal after ``step`` (``step_1.5k``) was its integer part (step 1);
2. fairseq's end-of-epoch ``checkpoint3.pt`` was step 3 (it is epoch 3);
3. a token, sample or example count (``tokens_1000000``) or a plural counter (``epochs_3``) was the step;
4. a timestamp (``run_20240501_1230``, ``2024-05-01T1230``, ``2024_05_01``) gave a piece of
   itself as the step (1230, 5, 1);
5. a link to a checkpoint (``latest -> step1000``) refused the folder, or failed as a second
   checkpoint at the same step;
6. Megatron's ``iter_0005000/mp_rank_00/*.pt`` folders were skipped without a word;
7. a Trainer output folder's own final model was refused with advice that records the wrong thing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch import nn

import tokdyn
from tokdyn.errors import InputError
from tokdyn.record import record_offline
from tokdyn.record.offline import discovery
from tokdyn.record.offline.discovery import discover_checkpoints

V = 40
_EXT = hs.sampled_from([".pt", ".ckpt", ".safetensors", ".bin", ".pth"])
_SEP = hs.sampled_from(["-", "_"])
_WORD = hs.sampled_from(["model", "ckpt", "weights", "run_a", "final"])
# Steps; not those that read as a date (20100901): a date in a name is never its step (section 4).
_STEP = hs.integers(0, 10**9).filter(lambda n: discovery._DATE.fullmatch(str(n)) is None)


def _step_of(name: str) -> int | None:
    return discovery._last_int(Path("/nonexistent") / name)


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(V, 4), nn.Linear(4, V))


def _no_warnings(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args)


# == 1. a decimal after "step" ==================================================================


@settings(max_examples=100, deadline=None)
@given(word=_WORD, sep=hs.sampled_from(["", "_", "-", "="]), whole=hs.integers(0, 10**6), frac=hs.integers(0, 999),
       unit=hs.sampled_from(["", "k", "K", "M", "B"]), ext=_EXT)  # fmt: skip
def test_a_decimal_after_step_is_not_its_integer_part(word, sep, whole, frac, unit, ext):
    """`model_step_1.5k.pt` was step 1 and `step-2.5M.pt` step 2: 1500 and 2.5 million steps, or
    not a step at all, but never the digits before the point."""
    assert _step_of(f"{word}_step{sep}{whole}.{frac}{unit}{ext}") is None


# == 2. fairseq: checkpoint<epoch>.pt, checkpoint_<epoch>_<updates>.pt ===========================


@settings(max_examples=100, deadline=None)
@given(epoch=hs.integers(0, 10**4), updates=_STEP,
       suffix=hs.sampled_from(["", "-shard0", "-model_part-1", "-shard3-model_part-0"]))  # fmt: skip
def test_fairseq_names_give_updates_never_the_epoch(epoch, updates, suffix):
    """fairseq saves `checkpoint{epoch}.pt` at the end of an epoch and `checkpoint_{epoch}_{updates}.pt`
    every --save-interval-updates: the first gives no step (it was the epoch), the second its updates."""
    assert _step_of(f"checkpoint{epoch}{suffix}.pt") is None
    assert _step_of(f"checkpoint_{epoch}_{updates}{suffix}.pt") == updates


def test_a_fairseq_folder_is_refused_in_one_line_naming_its_epoch_checkpoints(tmp_path):
    """`checkpoint1.pt` and `checkpoint2.pt` (epochs) were recorded at steps 1 and 2 beside
    `checkpoint_2_5000.pt` at step 5000."""
    for name in ("checkpoint1.pt", "checkpoint2.pt", "checkpoint_2_5000.pt"):
        torch.save(_net(0).state_dict(), tmp_path / name)
    with pytest.raises(InputError, match=r"cannot tell the step of \['checkpoint1\.pt', 'checkpoint2\.pt'\].*checkpoint3") as info:
        discover_checkpoints(tmp_path)
    assert "\n" not in str(info.value)
    # a converted epoch checkpoint that kept its update count records at that step
    torch.save({"model": _net(0).state_dict(), "iteration": 4000}, tmp_path / "checkpoint1.pt")
    torch.save({"model": _net(0).state_dict(), "iteration": 5000}, tmp_path / "checkpoint2.pt")
    (tmp_path / "checkpoint_2_5000.pt").unlink()
    assert [(r.step, r.path.name, r.step_from) for r in discover_checkpoints(tmp_path)] == [
        (4000, "checkpoint1.pt", "file"), (5000, "checkpoint2.pt", "file")]  # fmt: skip


# == 3. token, sample and example counts; plural counters ========================================

_COUNTER = hs.sampled_from(["tokens", "token", "toks", "tok", "samples", "sample", "examples", "seqs", "sequences",
                            "epochs", "seeds", "runs", "ranks", "shards", "parts"])  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(word=_WORD, sep=_SEP, counter=_COUNTER, csep=hs.sampled_from(["", "_", "-"]), count=hs.integers(0, 10**13),
       step=_STEP, ext=_EXT)  # fmt: skip
def test_a_count_of_tokens_samples_or_epochs_is_never_the_step(word, sep, counter, csep, count, step, ext):
    """`tokens_1000000.pt` was step 1,000,000 and `epochs_3.pt` step 3; a step beside them keeps its place."""
    _never_the_step(f"{counter}{csep}{count}", word=word, sep=sep, step=step, ext=ext)


def _never_the_step(part: str, *, word: str, sep: str, step: int, ext: str) -> None:
    """``part`` gives no step alone, and a step before or after it (bare, or after "step") keeps its place."""
    assert _step_of(f"{word}{sep}{part}{ext}") is None
    assert _step_of(f"{word}{sep}{step}{sep}{part}{ext}") == step
    assert _step_of(f"{word}{sep}{part}{sep}{step}{ext}") == step
    assert _step_of(f"{word}{sep}step{step}{sep}{part}{ext}") == step


# == 4. timestamps ===============================================================================

_STAMPS = ["%Y%m%d", "%Y%m%d_%H%M", "%Y%m%d-%H%M%S", "%Y%m%dT%H%M%S", "%Y%m%d%H%M", "%Y_%m_%d", "%Y_%m_%d_%H%M",
           "%Y-%m-%dT%H%M", "%Y-%m-%dT%H-%M", "%Y-%m-%d_%H-%M-%S", "%Y-%m-%d_%H_%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(when=hs.datetimes(min_value=dt.datetime(1990, 1, 1), max_value=dt.datetime(2099, 12, 31)), fmt=hs.sampled_from(_STAMPS),
       prefix=hs.sampled_from(["", "run_", "ckpt-", "model_", "run"]), step=_STEP, ext=_EXT)  # fmt: skip
def test_a_timestamp_gives_no_step(when, fmt, prefix, step, ext):
    """`run_20240501_1230.pt` was step 1230, `2024-05-01T1230.pt` step 5, `2024_05_01.pt` step 1
    and `ckpt_20240501.pt` step 20,240,501; a step beside a timestamp keeps its place."""
    stamp = when.strftime(fmt)
    assert _step_of(f"{prefix}{stamp}{ext}") is None, stamp
    assert _step_of(f"{prefix}{stamp}-step{step}{ext}") == step, stamp
    assert _step_of(f"ckpt-{step}-{stamp}{ext}") == step, stamp


# == 5. links: one checkpoint under two names =====================================================


def _hf_folder(p: Path, trainer_step: int | None = None) -> None:
    p.mkdir(parents=True)
    (p / "config.json").write_text("{}")  # discovery reads names and trainer_state.json only
    (p / "model.safetensors").write_bytes(b"")
    if trainer_step is not None:
        (p / "trainer_state.json").write_text(json.dumps({"global_step": trainer_step}))


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_second_name_of_one_checkpoint_is_recorded_once(tmp_path, link):
    """`latest.pt -> step_1000.pt` refused the folder ('cannot tell the step of latest.pt'), and
    `ckpt-1000.pt -> step_1000.pt` failed as two checkpoints at step 1000."""
    make = os.symlink if link == "symlink" else lambda src, dst: os.link(tmp_path / src, dst)
    torch.save(_net(0).state_dict(), tmp_path / "step_1000.pt")
    torch.save(_net(1).state_dict(), tmp_path / "step_2000.pt")
    make("step_2000.pt", tmp_path / "latest.pt")
    make("step_1000.pt", tmp_path / "ckpt-1000.pt")
    with pytest.warns(UserWarning, match=r"latest\.pt is step_2000\.pt .*recorded once") as got:
        refs = discover_checkpoints(tmp_path)
    assert [r.step for r in refs] == [1000, 2000]
    assert [os.path.samefile(r.path, tmp_path / f"step_{r.step}.pt") for r in refs] == [True, True]
    if link == "symlink":  # the real file is the name kept; of two hard links, neither is more real
        assert [r.path.name for r in refs] == ["step_1000.pt", "step_2000.pt"]
        assert "ckpt-1000.pt is step_1000.pt" in str(got[0].message)
    assert len(got) == 1 and "\n" not in str(got[0].message)


def test_a_pythia_folder_with_a_latest_link_records_each_step_once(tmp_path):
    """Pythia-style `step1000/`, `step2000/` (no trainer_state.json) beside `latest -> step2000`
    refused the folder; `main -> latest` too (a link to a link)."""
    _hf_folder(tmp_path / "step1000")
    _hf_folder(tmp_path / "step2000")
    os.symlink("step2000", tmp_path / "latest")
    os.symlink("latest", tmp_path / "main")
    with pytest.warns(UserWarning, match=r"latest is step2000; main is step2000"):
        refs = discover_checkpoints(tmp_path)
    assert [(r.step, r.path.name, r.kind) for r in refs] == [(1000, "step1000", "hf"), (2000, "step2000", "hf")]


def test_two_links_to_one_checkpoint_outside_the_folder_are_one_checkpoint(tmp_path):
    """`last.ckpt` and `best.ckpt`, both links to one Lightning checkpoint kept elsewhere, were two
    checkpoints at its recorded step (an error); it is one, recorded once at that step."""
    (tmp_path / "ck").mkdir()
    torch.save({"global_step": 300, "state_dict": _net(0).state_dict()}, tmp_path / "kept.ckpt")
    os.symlink("../kept.ckpt", tmp_path / "ck" / "last.ckpt")
    os.symlink("../kept.ckpt", tmp_path / "ck" / "best.ckpt")
    torch.save(_net(1).state_dict(), tmp_path / "ck" / "step_100.pt")
    with pytest.warns(UserWarning, match=r"last\.ckpt is best\.ckpt .*recorded once"):
        refs = discover_checkpoints(tmp_path / "ck")
    assert [(r.step, r.path.name, r.step_from) for r in refs] == [(100, "step_100.pt", "name"), (300, "best.ckpt", "file")]


def test_a_linked_checkpoint_records_one_row(tmp_path):
    """End to end: the rows of a folder with `latest.pt -> step_2000.pt` are the two real checkpoints."""
    ck = tmp_path / "ck"
    ck.mkdir()
    nets = {s: _net(s) for s in (1000, 2000)}
    for s, net in nets.items():
        torch.save(net.state_dict(), ck / f"step_{s}.pt")
    os.symlink("step_2000.pt", ck / "latest.pt")
    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, V, (3, 9)))
    store = str(tmp_path / "s.zarr")
    tokdyn.open_store(store, probe, mode="a")
    with pytest.warns(UserWarning, match="recorded once"):
        summary = record_offline(ck, store, "r", model_factory=lambda: _net(0), progress=False, workers=1)
    assert summary["recorded"] == [1000, 2000] and not summary["duplicates"]


# == 6. Megatron ================================================================================


def test_a_megatron_iteration_folder_is_named_when_skipped(tmp_path):
    """`iter_0005000/mp_rank_00/model_optim_rng.pt` was skipped without a word (the folder was
    recorded as if it held only the converted checkpoint beside it)."""
    (tmp_path / "iter_0005000" / "mp_rank_00").mkdir(parents=True)
    torch.save({"iteration": 5000, "model": _net(0).state_dict()}, tmp_path / "iter_0005000" / "mp_rank_00" / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5000")
    _hf_folder(tmp_path / "hf_iter_4000")
    with pytest.warns(UserWarning, match=r"sub-folders \['iter_0005000'\] hold weight files but no config\.json and were skipped"):
        refs = discover_checkpoints(tmp_path)
    assert [(r.step, r.path.name) for r in refs] == [(4000, "hf_iter_4000")]


# == 7. a Trainer output folder ===================================================================


def test_a_trainer_output_folder_records_its_checkpoints_not_its_final_model(tmp_path):
    """`Trainer.save_model` writes the final model into the output folder, beside `checkpoint-500/`
    and `checkpoint-1000/`: the folder was refused with 'point at the folder that holds it', which
    records the output folder as one checkpoint, the final model, and none of the others; then
    refused naming the final model, so every researcher moved it out by hand. Its checkpoint
    folders are recorded now, and the final model (no step of its own) is named in a warning."""
    _hf_folder(tmp_path / "checkpoint-500", 500)
    _hf_folder(tmp_path / "checkpoint-1000", 1000)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 1000}))
    with pytest.warns(UserWarning, match=r"own model \(\['model\.safetensors'\].*not recorded; its checkpoint folders are"):
        refs = discover_checkpoints(tmp_path)
    assert [(r.step, r.path.name) for r in refs] == [(500, "checkpoint-500"), (1000, "checkpoint-1000")]
    # beside a file that is no HF weight file, the folder is still refused, naming that file
    (tmp_path / "extra.pt").write_bytes(b"")
    with pytest.raises(InputError, match=r"cannot tell the step of \['extra\.pt'"):
        discover_checkpoints(tmp_path)
    (tmp_path / "extra.pt").unlink()
    # a lone model folder still gets the advice that fits it
    single = tmp_path / "single"
    single.mkdir()
    (single / "config.json").write_text("{}")
    (single / "model.safetensors").write_bytes(b"")
    with pytest.raises(InputError, match="point at the folder that holds it"):
        discover_checkpoints(single)


# == layouts that were right: kept right ===========================================================


@pytest.mark.parametrize("name,step", [
    ("iter_0005000", 5000), ("global_step500", 500), ("checkpoint-500", 500), ("step143000", 143000),
    ("step1000-unsharded", 1000), ("step1000-tokens4B", 1000), ("stage1-step1000-tokens5B", 1000),
    ("checkpoint_5000", 5000), ("epoch=0-step=100.ckpt", 100), ("checkpoint_3_5000.pt", 5000),
    ("2024-05-01_1230.pt", 1230), ("ckpt_20240501-step_7.pt", 7), ("seq2seq_100.pt", 100),
])  # fmt: skip
def test_framework_names_that_give_their_step(name, step):
    assert _no_warnings(_step_of, name) == step


@pytest.mark.parametrize("name", ["checkpoint_last.pt", "checkpoint_best.pt", "checkpoint.best_loss_2.34.pt", "ckpt-100-of-143000.pt",
                                  "model_step_1k.pt", "step_10k.pt", "2.5M.pt", "tokens_1B.pt", "last.ckpt", "last-v1.ckpt",
                                  "model-00001-of-00003.safetensors", "pytorch_model-00001-of-00002.bin", "2024-05-01T12-30.pt"])  # fmt: skip
def test_framework_names_that_give_no_step(name):
    assert _step_of(name) is None


# == a hyperparameter in the name ================================================================

_HYPER = hs.sampled_from(["ctx", "context", "seqlen", "seq_len", "len", "bs", "batch_size", "bsz", "mbs", "gbs", "dim",
                          "d_model", "hidden", "width", "depth", "vocab", "n_embd", "n_layer", "n_head", "layers",
                          "layer", "heads", "head", "lr", "wd", "warmup"])  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(word=_WORD, sep=_SEP, hyper=_HYPER, hsep=hs.sampled_from(["", "_", "-"]), value=hs.integers(0, 10**6),
       step=_STEP, ext=_EXT)  # fmt: skip
def test_a_hyperparameter_in_the_name_is_never_the_step(word, sep, hyper, hsep, value, step, ext):
    """`ckpt_100_ctx2048.pt` was step 2048 and `model_bs32.pt` step 32: the last integer."""
    _never_the_step(f"{hyper}{hsep}{value}", word=word, sep=sep, step=step, ext=ext)


def test_a_batch_count_stays_a_step():
    """`batch_300.pt` (the batches trained: the step) is not a batch size."""
    assert _step_of("batch_300.pt") == 300 and _step_of("ckpt_bsz8_batch_300.pt") == 300


# == the checkpoints' own tokenizer ================================================================


def test_checkpoints_whose_tokenizer_is_not_the_probes_are_warned_about(tmp_path):
    """A checkpoint folder's tokenizer.json other than the probe's tokenizer recorded losses of
    other text without a word (each probe id is another token to the model)."""
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from offline_fixtures import make_hf_model, make_probe

    from tokdyn.probe import ProbeSet
    from tokdyn.record.offline import record_offline
    from tokdyn.tokenizer import HFTokenizer

    def word_level(words):
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        return tok

    ours = word_level(["[UNK]"] + [f"w{i}" for i in range(63)])
    other = word_level(["[UNK]"] + [f"v{i}" for i in range(63)])
    for step, tok in ((10, ours), (20, ours)):
        folder = tmp_path / "ckpts" / f"checkpoint-{step}"
        make_hf_model(step).save_pretrained(folder)
        tok.save(str(folder / "tokenizer.json"))
    spec = HFTokenizer(ours).spec()
    probe = ProbeSet.from_tokens(make_probe().tokens, tokenizer=spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the probe's own tokenizer: nothing to say
        record_offline(tmp_path / "ckpts", tmp_path / "a.zarr", "r", probe=probe, progress=False, workers=1)
    for step in (10, 20):
        other.save(str(tmp_path / "ckpts" / f"checkpoint-{step}" / "tokenizer.json"))
    with pytest.warns(RuntimeWarning, match=r"checkpoint-10 holds a tokenizer .* other than the probe's, a hf tokenizer"):
        record_offline(tmp_path / "ckpts", tmp_path / "b.zarr", "r", probe=probe, progress=False, workers=1)
    byte_probe = ProbeSet.from_tokens(make_probe().tokens, tokenizer={"kind": "byte"})
    with pytest.warns(RuntimeWarning, match=r"other than the probe's, a byte tokenizer"):
        record_offline(tmp_path / "ckpts", tmp_path / "c.zarr", "r", probe=byte_probe, progress=False, workers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a probe of ids that names no tokenizer: no basis to compare
        record_offline(tmp_path / "ckpts", tmp_path / "d.zarr", "r", probe=make_probe(), progress=False, workers=1)
