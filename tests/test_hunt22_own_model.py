"""A researcher's own model, tokenizer and checkpoint folder, as docs/own-model.md and
docs/recording.md describe them. Each section is a class of inputs that gave a wrong number:

1. a checkpoint name with a word and a number glued together (``final2``, ``best2``, ``L12``,
   ``e10``, ``resnet50``) was read as that step (2, 2, 12, 10, 50), beside real steps or alone;
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch import nn

import tokdyn
from tokdyn.errors import InputError
from tokdyn.record.offline import discovery
from tokdyn.record.offline.discovery import discover_checkpoints

V = 40
_EXT = hs.sampled_from([".pt", ".ckpt", ".safetensors", ".bin", ".pth", ""])
_SEP = hs.sampled_from(["-", "_", "."])
# Steps; not those that read as a date (20100901): a date in a name is never its step.
_STEP = hs.integers(0, 10**9).filter(lambda n: discovery._DATE.fullmatch(str(n)) is None)


def _step_of(name: str) -> int | None:
    return discovery._last_int(Path("/nonexistent") / name)


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(V, 4), nn.Linear(4, V))


# == 1. a word with a number glued on is not a step ==============================================

# The names researchers' checkpoints carry, and the step each gives: the step where the name says
# one, None (then the step the file records, else one line refusing the folder) where it does not.
_CONVENTIONS = [
    ("checkpoint-500", 500), ("step_1000.pt", 1000), ("global_step2000", 2000), ("epoch=3-step=1200.ckpt", 1200),
    ("iter_0001000", 1000), ("iter_0001000.pt", 1000), ("iter500.pt", 500), ("it500.pt", 500), ("ckpt500.pt", 500),
    ("model100.pt", 100), ("gpt2-124M-step1000", 1000), ("gpt2-124M-1000.pt", 1000), ("1000.pt", 1000),
    ("model_final.pt", None), ("best.ckpt", None), ("last.ckpt", None), ("v2.pt", None), ("model-v2.pt", None),
    ("final2", None), ("final2.pt", None), ("model_final2.pt", None), ("best2.pt", None), ("latest3.ckpt", None),
    ("L12", None), ("ckpt_L12.pt", None), ("ckpt_e3.pt", None), ("e10.pt", None), ("resnet50.pt", None),
    ("vit16.pt", None), ("mnist2.pt", None), ("exp2_ckpt.pt", None), ("try3.pt", None), ("gpt2-124M.pt", None),
    ("ckpt_100_final2.pt", 100), ("L12_step300.pt", 300), ("exp2_1000.pt", 1000), ("resnet50-2500.pt", 2500),
]  # fmt: skip


@pytest.mark.parametrize("name,step", _CONVENTIONS)
def test_common_checkpoint_names_give_their_step_or_none(name, step):
    """`final2` was step 2 and `L12` step 12 (a second final model, a layer); `e10` an epoch,
    `resnet50` a model: none is a step, while `iter500` and `ckpt500` still are."""
    assert _step_of(name) == step


# A word that is no step counter: letters (either case), never one of the words a step is glued to,
# nor holding "step" (whose number is the step, section 1 of docs/recording.md "Steps").
_COUNTING = ["iter", "iteration", "it", "ckpt", "chkpt", "model", "weights", "update", "updates", "upd", "save", "snapshot"]
_WORD_GLUED = hs.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=8).filter(
    lambda w: w.lower() not in _COUNTING and "step" not in w.lower())  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(word=_WORD_GLUED, number=hs.integers(0, 10**6), zeros=hs.integers(0, 2),
       before=hs.sampled_from(["", "model_", "ckpt-", "run_a."]), ext=_EXT)  # fmt: skip
def test_a_number_glued_to_a_word_is_never_the_step(word, number, zeros, before, ext):
    """Any word with its number glued on (`final2`, `Best3`, `L12`, `xq7`) gives no step: the
    researcher is asked for the step (the file's, else a manifest), never given a made-up one."""
    assert _step_of(f"{before}{word}{'0' * zeros}{number}{ext}") is None


@settings(max_examples=200, deadline=None)
@given(word=_WORD_GLUED, number=hs.integers(0, 10**6), step=_STEP, sep=hs.sampled_from(["-", "_"]), first=hs.booleans(),
       ext=_EXT)  # fmt: skip
def test_a_number_glued_to_a_word_never_replaces_the_step_beside_it(word, number, step, sep, first, ext):
    """`ckpt_100_final2.pt` was step 2; `L12_300.pt` is step 300 wherever the glued part stands
    (joined by a dot, `final2.300` would be a decimal number, no step)."""
    glued = f"{word}{number}"
    name = f"{glued}{sep}{step}" if first else f"ckpt{sep}{step}{sep}{glued}"
    assert _step_of(name + ext) == step


@settings(max_examples=100, deadline=None)
@given(word=hs.sampled_from(_COUNTING),
       upper=hs.booleans(), step=_STEP, zeros=hs.integers(0, 3), ext=_EXT)  # fmt: skip
def test_a_step_glued_to_a_word_that_counts_steps_is_the_step(word, upper, step, zeros, ext):
    """The words a step's number is glued to (`iter500`, `ckpt500`, `model100`) still give it."""
    assert _step_of(f"{word.upper() if upper else word}{'0' * zeros}{step}{ext}") == step


def test_a_folder_with_a_glued_name_is_refused_in_one_line_saying_how_to_give_steps(tmp_path):
    """`final2.pt` beside `step_100.pt` and `step_200.pt` was recorded as step 2, a row before
    step 100 holding the final weights. It is now refused, naming the file and the manifest."""
    for name in ("step_100.pt", "step_200.pt", "final2.pt"):
        torch.save(_net(0).state_dict(), tmp_path / name)
    with pytest.raises(InputError, match=r"cannot tell the step of \['final2\.pt'\].*'final2'.*manifest\.json") as info:
        discover_checkpoints(tmp_path)
    assert "\n" not in str(info.value)


def test_a_glued_name_whose_file_records_its_step_takes_that_step(tmp_path):
    """A Lightning-style checkpoint that records its `global_step` is read at it, whatever its name."""
    torch.save({"state_dict": _net(0).state_dict(), "global_step": 300}, tmp_path / "final2.ckpt")
    torch.save({"state_dict": _net(1).state_dict(), "global_step": 12}, tmp_path / "L12.ckpt")
    assert [(r.step, r.path.name, r.step_from) for r in discover_checkpoints(tmp_path)] == [
        (12, "L12.ckpt", "file"), (300, "final2.ckpt", "file")]  # fmt: skip


def test_the_command_line_says_it_in_one_line(tmp_path, capsys):
    """`tokdyn record-offline` on such a folder: exit 1, one line naming the file and the fix."""
    from tokdyn.cli import main

    tokdyn.open_store(tmp_path / "s.zarr", tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, V, (3, 9))), mode="a")
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in ("step_100.pt", "L12.pt"):
        torch.save(_net(0).state_dict(), ck / name)
    assert main(["record-offline", "--checkpoints", str(ck), "--out", str(tmp_path / "s.zarr"), "--run", "r",
                 "--no-progress"]) == 1  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot tell the step of ['L12.pt']" in err and "manifest.json" in err
