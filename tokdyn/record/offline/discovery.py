"""Finding checkpoints: the checkpoints in a folder, by file name or from a ``manifest.json``.

A checkpoint is a :class:`CheckpointRef`: its step (or, in a D or M sweep, its ordinal and
``axis_value``), its path and kind, and what the manifest says beside it. Names and the manifest
are read here; a checkpoint is opened only when its name gives no step, to read the step it
records (safely: ``torch.load(weights_only=True)``, or an HF folder's ``trainer_state.json``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..._checks import axis_tie, is_int, is_real
from ...errors import InputError
from ...store import AXES
from ..._files import check_regular
from .files import check_regular_tree, read_json

__all__ = ["CheckpointRef", "discover_checkpoints", "held_step", "recorded_step", "order_refs", "manifest_axis", "MANIFEST", "KINDS",
           "MODEL_DTYPE_NAMES", "STEP_KEYS", "step_value", "trainer_state_coords", "drop_unfinished", "cut_short", "hf_weight_files",
           "is_adapter_folder", "file_kind"]

MANIFEST = "manifest.json"
MODEL_DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the dtypes models may run in (loading maps them to torch's)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
SAFETENSORS_SUFFIXES = (".safetensors",)
KINDS = ("torch", "safetensors", "hf")
_ENTRY_KEYS = {"path", "step", "tokens_seen", "axis_value", "lr", "kind", "model"}
_MANIFEST_KEYS = {"checkpoints", "axis", "model"}
_INT = re.compile(r"\d+")
# The integer after "step": not step100k (100 thousand, or not a step), nor step_1.5k (1500, not 1).
_STEP_INT = re.compile(r"step[_\-=]?(\d+)(?![a-z0-9]|\.\d)", re.IGNORECASE)
# A date, with the time it may carry: 2024-05-01, 2024_05_01, 20240501, 2024-05-01T12-30,
# 2024-05-01T1230, 20240501_1230, 20240501-123045 (a real month and day, years 1900-2099, so that
# the step before it in ckpt-1234-2024-05-01 is not taken for one). Dropped from a name before the
# parts below, so that none of them takes a piece of it (run_20240501_1230 is not step 1230). A
# number after a dashed date without a T stays a step: 2024-05-01_1230 is step 1230.
_MONTH, _DAY = r"(?:0[1-9]|1[0-2])", r"(?:0[1-9]|[12]\d|3[01])"
_HH_MM = r"(?:[01]\d|2[0-3])[-:_][0-5]\d(?:[-:_][0-5]\d)?(?![-_:.]?\d)"  # 12-30, 12:30:45
_HHMM = r"(?:[01]\d|2[0-3])[0-5]\d(?:[0-5]\d)?"  # 1230, 123045
_DATE = re.compile(
    r"(?<!\d)(?:19|20)\d{2}(?:"
    r"(-)" + _MONTH + r"\1" + _DAY + r"(?:[t_-]" + _HH_MM + r"|t" + _HHMM + r")?"  # 2024-05-01, 2024-05-01T12-30, 2024-05-01T1230
    r"|(_?)" + _MONTH + r"\2" + _DAY + r"(?:[t_-]" + _HH_MM + r"|[t_-]?" + _HHMM + r")?"  # 20240501_1230, 2024_05_01
    r")(?!\d)",
    re.IGNORECASE,
)
# The words that a step's number is glued to in a name (iter500, it1000, ckpt1000, model100,
# Composer's ep0-ba1000-rank0.pt, s1000, gs1000; Megatron's iter_0001000 and the Trainer's
# checkpoint-500 stand apart): any other word with a number glued on is no step (below).
_COUNTING_WORDS = ("steps", "stp", "s", "gs", "iter", "iters", "iteration", "it", "ba", "batch", "batches", "ckpt", "chkpt",
                   "model", "weights", "update", "updates", "upd", "save", "snapshot")  # fmt: skip
_COUNTS_STEPS = "(?:" + "|".join(_COUNTING_WORDS) + ")"
# The parts of a name that hold a number but never a step. Without "step" in a name, its step is
# the last integer left once these are dropped: Lightning's `last-v1.ckpt` is not step 1, nor
# `model_bf16.pt` step 16, `epoch=3.ckpt` step 3 or `pythia-70m.pt` step 70.
_NOT_A_STEP = re.compile(
    r"(?<![a-z0-9])(?:"
    r"[a-z][a-z0-9]*(?:_[a-z][a-z0-9]*)*=[-+]?[0-9.]+(?:e[-+]?\d+)?"  # a logged value: epoch=3, val_loss=0.12
    r"|\d+[_-]of[_-]\d+"  # a shard: 00001-of-00002
    r"|[a-z]*\d+(?:\.\d+)*e[-+]?\d+"  # a number in e-notation: 3e-4, lr1e-3
    r"|[a-z]*\d+(?:\.\d+)+[a-z]*"  # a decimal or a dotted version: 0.5, 1.4b, 1.2.3, step1.5k (not step 1)
    r"|(?:version|v|bf|fp|float|half|int|uint|of"  # a version, a dtype, and another counter (plural too: epochs_3, tokens_500):
    r"|(?:epoch|ep|seed|rank|run|shard|part|gpu|node|worker|world|fold|token|tok|sample|example|seq|sequence)s?)[_-]?\d+(?:\.\d+)*"
    # a hyperparameter in the name: the context, batch, width, depth (ctx2048, bs32, seqlen_512,
    # d_model768, layers12, heads_8, lr3 of lr3e-4, warmup2000)
    r"|(?:ctx|context|seqlen|seq_len|len|bs|batch_size|bsz|mbs|gbs|dim|d_model|dmodel|hidden|width|depth|vocab|emb|embd"
    r"|n_embd|n_layer|n_head|nl|nh|layers?|heads?|lr|wd|warmup)[_-]?\d+(?:\.\d+)*"
    # a model or a parallelism named in the name: ckpt-1000_gpt2.pt is step 1000, not 2 (nor is the
    # 3 of llama3_best.pt a step: such a name has none)
    r"|(?:gpt|llama|qwen|phi|bert|opt|gemma|mistral|mixtral|falcon|bloom|olmo|pythia"
    r"|tp|pp|dp|ddp|mp|cp|zero|fsdp)\d+(?:\.\d+)*|m?t5|[ah]100|h200|a6000|a40|a10g?|v100|l40s?|mi\d{3}x?"  # glued
    # (gpt_1000 is step 1000 of a "gpt"; a GPU: ckpt_1000_a6000.pt was step 6000)
    r"|checkpoint\d+"  # fairseq's end-of-epoch checkpoint: checkpoint3.pt is epoch 3 (checkpoint_3_5000.pt: update 5000)
    r"|[a-z]*\d+[a-z][a-z0-9]*"  # letters after digits: a size (70m, 7b, 100k) or a hash (3f2a9c)
    # letters before digits, unless the letters are a word that counts steps (ckpt1000, iter500,
    # model100): final2, best2, L12, e10, resnet50, exp2 name a model, a layer, an epoch or a
    # variant, never the step, so they were read as steps 2, 2, 12, 10, 50 and 2
    r"|(?!" + _COUNTS_STEPS + r"\d)[a-z]+\d+"
    r")(?![a-z0-9])",
    re.IGNORECASE,
)
# Files a training run saves beside its weights that hold no model (the HF Trainer's arguments,
# optimizer, scheduler, scaler and RNG states): never a checkpoint, in any folder.
_TRAINING_STATE = re.compile(r"^(?:training_args\.bin|optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(?:_\d+)?\.pth)$")
# A name still being written, or left by a save that died: checkpoint-500.tmp/, transformers 4.36's
# tmp-checkpoint-500/ (renamed when complete). Its number is a step whose weights may be half there.
_IN_PROGRESS = re.compile(r"^tmp[-_]|\.(?:tmp|temp|partial|incomplete)$", re.IGNORECASE)
# A file named by tempfile (NamedTemporaryFile(dir=..., suffix=".pt"), renamed into place when
# written): "tmp" and 8 random letters, digits or underscores.
_TEMPFILE = re.compile(r"^tmp[a-z0-9_]{8}$")
# The name the Hugging Face Trainer gives its checkpoint folders.
_TRAINER_SAVE = re.compile(r"^checkpoint-\d+$")
# A Hugging Face folder's own weights: they hold no step (the folder does).
_HF_WEIGHTS = re.compile(r"^(?:model|pytorch_model)(?:-\d+-of-\d+)?\.(?:safetensors|bin)$")
# transformers 4.51 (huggingface/transformers#36973) logs the learning rate of the update just done;
# before, the rate of the next one (the scheduler had stepped).
_LOGS_OWN_LR = (4, 51)
# Where a training checkpoint keeps its step: Lightning's global_step, Megatron's iteration,
# nanoGPT's iter_num, and a plain "step" (last: some loops count something else under it, so a
# name's step is checked against the first three only).
STEP_KEYS = ("global_step", "iteration", "iter_num", "step")


@dataclass(frozen=True)
class CheckpointRef:
    """One saved checkpoint.

    Attributes
    ----------
    step : int
        Optimizer step (axis T); for a D or M sweep, the row's ordinal in ``axis_value`` order.
    path : Path
        The file (torch, safetensors) or folder (hf).
    kind : {"torch", "safetensors", "hf"}
    tokens_seen, axis_value, lr : optional
        Stored beside the row when known. ``axis_value`` is the D budget or M parameter count.
    model : dict, optional
        Model spec for a bare state dict (``{"type": "tinygpt", "config": {...}}``), from the
        manifest; otherwise one beside the file is used.
    step_from : {"name", "file", "manifest"} or None
        Where ``step`` was read: the file's name, the step the file records, the manifest; None
        when given otherwise. A step from the name is checked, when the checkpoint is loaded,
        against the one the file records.
    """

    step: int
    path: Path
    kind: str
    tokens_seen: int | None = None
    axis_value: float | None = None
    lr: float | None = None
    model: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    step_from: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"checkpoint kind must be one of {KINDS}, got {self.kind!r} for {self.path}")
        object.__setattr__(self, "path", Path(self.path))


def discover_checkpoints(path: str | os.PathLike, *, axis: str | None = None) -> list[CheckpointRef]:
    """The checkpoints in folder ``path``, sorted by step (T) or by ``axis_value`` (D, M).

    A ``manifest.json`` in the folder (or ``path`` naming a manifest file) wins. Otherwise every
    ``.pt``/``.pth``/``.bin``/``.ckpt``/``.safetensors`` file and every sub-folder holding a
    ``config.json`` is a checkpoint whose step is the integer after ``step`` in its name, else its
    last integer that is not a version, dtype, epoch, token count, size, date or logged value (``step_000100.pt``,
    ``step100_bf16.pt``, ``ckpt-100.safetensors``, ``checkpoint-100/`` -> 100; ``last-v1.ckpt``,
    ``model_bf16.pt`` -> none), else the step the file records (a torch checkpoint's
    ``global_step``, ``iteration``, ``iter_num`` or ``step``; an HF folder's
    ``trainer_state.json``). A checkpoint whose step is found nowhere, or two checkpoints with one
    step, is an :class:`~tokdyn.errors.InputError` naming the files: a guessed step would
    silently misplace a row. A checkpoint whose step comes from the file alone and equals a named
    one's (Lightning's ``last.ckpt`` beside the checkpoint it copies) is skipped with a warning,
    and so is a second name of one file or folder (a link: ``latest -> step1000``) that gives no
    step or the same step.

    ``axis``: ``"T"``, ``"D"`` or ``"M"``; default the manifest's ``"axis"``, else ``"T"``. A D or
    M sweep needs a manifest giving each entry's ``axis_value``; its rows get steps 0, 1, 2, ...
    in ``axis_value`` order.
    """
    root = Path(path)
    if root.name.endswith(".json") and root.exists() and not root.is_dir():
        return _read_manifest(root, axis)
    if not root.exists():
        raise InputError(f"checkpoint folder {root} does not exist")
    if not root.is_dir():  # a FIFO, a device, a socket: said as what it is (iterdir() said "Not a directory")
        check_regular(root, "checkpoint")
    if root.is_file():
        kind = _kind_of(root)
        if kind is None:
            raise InputError(f"{root} is not a checkpoint (expected {', '.join(TORCH_SUFFIXES + SAFETENSORS_SUFFIXES)})")
        step, step_from = _step_of(root, kind)
        return order_refs([CheckpointRef(step, root, kind, step_from=step_from)], axis or "T", str(root))
    if (root / MANIFEST).exists():  # whatever it is: read_json refuses anything but a regular file
        return _read_manifest(root / MANIFEST, axis)
    axis = axis or "T"
    if axis != "T":
        raise InputError(f"an axis-{axis} sweep needs {root / MANIFEST} giving each checkpoint's axis_value")
    entries, skipped_dirs, adapters, in_progress, dcp = [], [], [], [], []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or _TRAINING_STATE.match(p.name):
            continue
        kind = _kind_of(p)
        if _in_progress_name(p) and (kind is not None or (p.is_dir() and _holds_weights(p))):
            in_progress.append((p, kind))
            continue
        if kind is None:
            if p.is_dir() and is_adapter_folder(p):
                adapters.append(p.name)
            elif p.is_dir() and _holds_weights(p):
                skipped_dirs.append(p.name)
            elif p.is_dir() and _is_dcp(p):
                dcp.append(p.name)
            continue
        entries.append((p, kind))
    if not entries and any(p.is_file() for p, _ in in_progress):  # every checkpoint file so named (tmp_ckpt_100.pt): a naming
        entries = [(p, kind) for p, kind in in_progress if p.is_file()]
        in_progress = [(p, kind) for p, kind in in_progress if not p.is_file()]
    in_progress = [p.name for p, _ in in_progress]
    found, unnamed = [], []
    for p, kind in _one_per_file(entries, root):
        step = _last_int(p)
        if step is not None:
            found.append(CheckpointRef(_name_step(step, p), p, kind, step_from="name"))
        elif (held := held_step(p, kind)) is not None:
            found.append(CheckpointRef(held, p, kind, step_from="file"))
        else:
            unnamed.append(p.name)
    if in_progress:
        warnings.warn(
            f"{root}: {in_progress} are named as saves still being written (or left by a save that died) and were not "
            "recorded; once the save completes under its final name, --resume (resume=True) records it",
            stacklevel=2,
        )
    if dcp:
        warnings.warn(
            f"{root}: sub-folders {dcp} are torch.distributed.checkpoint saves (.metadata and .distcp files), which tokdyn "
            "does not read, and were skipped; convert each into one file (torch.distributed.checkpoint.format_utils."
            "dcp_to_torch_save(folder, 'step_N.pt')) and record those",
            stacklevel=2,
        )
    if adapters:
        warnings.warn(
            f"{root}: sub-folders {adapters} hold PEFT adapters (adapter_config.json), not whole models, and were skipped; "
            "tokdyn records whole models: merge each adapter into its base model (peft's merge_and_unload(), then "
            "save_pretrained) and record those folders",
            stacklevel=2,
        )
    if skipped_dirs:
        warnings.warn(
            f"{root}: sub-folders {skipped_dirs} hold weight files but no config.json and were skipped; "
            f"list their files in a {MANIFEST} to record them",
            stacklevel=2,
        )
    if unnamed and is_adapter_folder(root):  # a PEFT training's output folder: its own adapter, and its checkpoints'
        raise InputError(f"{root} holds a PEFT adapter (adapter_config.json), not a whole model; tokdyn records whole "
                         "models: merge each adapter into its base model (peft's merge_and_unload(), then save_pretrained) "
                         "and record those folders")  # fmt: skip
    own = (root / "config.json").is_file() and any(r.kind == "hf" for r in found)
    if unnamed and own and all(_HF_WEIGHTS.match(n) for n in unnamed):
        # a Trainer's output folder: Trainer.save_model writes the final model (or the best, with
        # load_best_model_at_end) beside the checkpoint folders; it has no step of its own
        warnings.warn(
            f"{root}: the folder's own model ({unnamed}: the final or best model Trainer.save_model writes beside its "
            "checkpoint folders) has no step of its own and is not recorded; its checkpoint folders are. To record it, "
            "copy it (with config.json) into a folder named for its step",
            stacklevel=2,
        )
        unnamed = []
    if unnamed:
        hint = ""
        if (root / "config.json").is_file() and any(_HF_WEIGHTS.match(n) for n in unnamed):
            hint = (
                " (the folder's own model, saved beside its checkpoint folders as Trainer.save_model saves the final one)"
                if any(r.kind == "hf" for r in found) else
                " (it looks like a single Hugging Face model folder: point at the folder that holds it)"
            )  # fmt: skip
        raise InputError(f"{root}: cannot tell the step of {unnamed}: {_NO_STEP}{hint}. {_NO_STEP_FIX}")
    if not found:
        raise InputError(f"no checkpoints in {root} (expected {', '.join(TORCH_SUFFIXES + SAFETENSORS_SUFFIXES)} files, HF folders or {MANIFEST})")
    return order_refs([_with_trainer_coords(r) for r in _drop_copies(found, root)], "T", str(root))


_NO_STEP = (
    "no integer in the name that is a step (the one after 'step', else the last one that is not a version "
    "like '-v1', a dtype like 'bf16', an epoch (fairseq's checkpoint3), seed, token count, size, date, logged value, "
    "model like 'gpt2' or 'llama3', parallelism like 'tp2', or other word with its number glued on like 'final2' or "
    f"'L12'; only {', '.join(_COUNTING_WORDS)} count steps glued: 'iter500', 'ba500') "
    "and none recorded in the file "
    f"({', '.join(STEP_KEYS)}; an HF folder's trainer_state.json)"
)
_NO_STEP_FIX = f"Rename them (e.g. step_000100.pt), move them out, or list every checkpoint with its \"step\" in {MANIFEST}"


def _in_progress_name(p: Path) -> bool:
    """Whether ``p`` is named as a save still being written: a folder (``checkpoint-500.tmp/``,
    ``tmp-checkpoint-500/``), or a checkpoint file whose name without its suffix is such a name
    (``tmp_step_500.pt``, ``step_500.tmp.pt``) or tempfile's (``tmpk3j2x9ab.pt``; not one that
    names a step: ``tmpl_step_5.pt`` is step 5)."""
    if p.is_dir():
        return bool(_IN_PROGRESS.search(p.name))
    if file_kind(p) is None:
        return False
    stem = p.name[: -len("".join(p.suffixes[-2:]))] if file_kind(Path(p.stem)) is not None else p.stem  # .pth.tar: both
    return bool(_IN_PROGRESS.search(stem) or (_TEMPFILE.match(stem) and "step" not in stem.lower()))


def _is_dcp(folder: Path) -> bool:
    """Whether ``folder`` is a torch.distributed.checkpoint save (torchtitan's ``step-50/``)."""
    try:
        return (folder / ".metadata").is_file() and any(q.suffix == ".distcp" for q in folder.iterdir())
    except OSError:
        return False


def _holds_weights(folder: Path) -> bool:
    """Whether ``folder`` (not an HF folder) holds torch or safetensors files, itself or one level
    down: DeepSpeed's ``global_step500/mp_rank_00_model_states.pt``, Megatron's
    ``iter_0005000/mp_rank_00/model_optim_rng.pt``. A folder that cannot be listed holds none."""
    try:
        return any(
            _kind_of(q) in ("torch", "safetensors") or (q.is_dir() and any(_kind_of(r) in ("torch", "safetensors") for r in q.iterdir()))
            for q in folder.iterdir()
        )
    except OSError:
        return False


def is_adapter_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a PEFT adapter (``adapter_config.json``) and no whole model's weights."""
    return (folder / "adapter_config.json").is_file() and not hf_weight_files(folder)


def hf_weight_files(folder: Path) -> list[Path] | None:
    """The weight files of Hugging Face folder ``folder``: ``model.safetensors`` or
    ``pytorch_model.bin``, or every shard its ``*.index.json`` lists. None when they are not all
    there (a save still being written, or cut short); an unreadable index lists none."""
    for single, index in (("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            try:
                doc = read_json(folder / index, "weights index")
            except InputError:
                return None
            shards = sorted(set(doc.get("weight_map", {}).values())) if isinstance(doc, Mapping) else []
            files = [folder / str(n) for n in shards]
            return files if files and all(f.is_file() for f in files) else None
    return None


def drop_unfinished(refs: Sequence[CheckpointRef], where: str) -> list[CheckpointRef]:
    """``refs`` (in step order) without the last one when it is a save still being written: a
    Hugging Face folder whose weights are not all there yet, or, for a Trainer's ``checkpoint-N``
    folder, that has no ``trainer_state.json`` (the Trainer writes it last) where every other
    checkpoint folder has one; or a file (an HF folder's weight file) cut short of what its format
    says it holds (:func:`cut_short`). Named in a warning: ``resume=True`` records it later. An
    unfinished checkpoint before the last is left to fail when loaded (a damaged run). The only
    checkpoint, unfinished, is an :class:`~tokdyn.errors.InputError` naming it: nothing to record."""
    if not refs:
        return list(refs)
    missing = _unfinished_folder(refs) if refs[-1].kind == "hf" else None
    short = cut_short(refs[-1]) if missing is None else None
    if missing is None and short is None:
        return list(refs)
    what = f"lacks {missing}" if missing else f"is cut short ({short})"
    if len(refs) == 1:
        raise InputError(f"{where}: {refs[-1].path.name} (step {refs[-1].step}), the only checkpoint, {what}: a save still "
                         "being written, or damaged; nothing to record until it is complete")  # fmt: skip
    warnings.warn(
        f"{where}: {refs[-1].path.name} (step {refs[-1].step}), the newest checkpoint, {what}: taken for a save still being "
        "written and not recorded; --resume (resume=True) records it once it is complete",
        stacklevel=3,
    )
    return list(refs[:-1])


def _unfinished_folder(refs: Sequence[CheckpointRef]) -> str | None:
    """What the newest checkpoint, an HF folder, lacks for a complete save ("its weights", "its
    trainer_state.json"), or None."""
    last = refs[-1].path
    if is_adapter_folder(last):
        return None
    if hf_weight_files(last) is None:
        return "its weights"
    # only a Trainer's own save (checkpoint-N) is written with its state: a folder saved by
    # save_pretrained, or copied in by hand, never gets one, and must not wait for it for good
    hf = [r for r in refs if r.kind == "hf"]
    stateless = bool(_TRAINER_SAVE.match(last.name)) and not (last / "trainer_state.json").is_file() and len(hf) > 1 \
        and all((r.path / "trainer_state.json").is_file() for r in hf[:-1])  # fmt: skip
    return "its trainer_state.json" if stateless else None


# safetensors refuses a header longer than this (its MAX_HEADER_SIZE): no file's of ours
_MAX_SAFETENSORS_HEADER = 100_000_000
_ZIP_START = b"PK\x03\x04"


def cut_short(ref: CheckpointRef) -> str | None:
    """Why checkpoint ``ref`` is shorter than its format says, as a save caught half-way leaves it,
    or None: an empty file; a safetensors file shorter than its header, or than the tensors its
    header lists; a zip-format torch file without its end record (``torch.save`` writes it last).
    An HF folder's weight files are each checked. A file damaged otherwise is None here: loading it
    says what is wrong."""
    files = [ref.path] if ref.kind != "hf" else hf_weight_files(ref.path) or []
    for f in files:
        short = _file_cut_short(f)
        if short is not None:
            return short if ref.kind != "hf" else f"{f.name}: {short}"
    return None


def _file_cut_short(f: Path) -> str | None:
    try:
        size = f.stat().st_size
        if size == 0:
            return "an empty file"
        with open(f, "rb") as fh:
            head = fh.read(8)
            if file_kind(f) != "safetensors":
                zipped = head[:4] == _ZIP_START or (size < 4 and _ZIP_START.startswith(head))
                return "a zip archive without its end record, which torch.save writes last" if zipped and not zipfile.is_zipfile(f) else None
            n = int.from_bytes(head, "little")
            if size < 8 or n > _MAX_SAFETENSORS_HEADER:
                return f"{size} bytes, less than its header's length" if size < 8 else None
            if size < 8 + n:
                return f"{size:,} of the {8 + n:,} bytes of its header"
            header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return None  # unreadable or not this format: loading it says so
    return f"{size:,} of the {8 + n + end:,} bytes its header promises" if size < 8 + n + end else None


def trainer_state_coords(folder: Path, step: int) -> tuple[int | None, float | None]:
    """``(tokens_seen, lr)`` of the HF Trainer checkpoint in ``folder`` at ``step``, from its
    ``trainer_state.json``, each None where unknown.

    ``tokens_seen`` is ``num_input_tokens_seen`` (0 there means not counted). ``lr`` is the rate of
    the update that produced these weights: the ``learning_rate`` logged at ``step`` by transformers
    4.51 and later (the ``transformers_version`` of the folder's ``config.json``), at ``step - 1``
    before (it logged the next update's rate); None where that step logged none, or the version is
    unknown. Both None when the state's ``global_step`` is not ``step``: they would be another step's.
    """
    state = folder / "trainer_state.json"
    try:
        doc = read_json(state, "trainer state") if state.is_file() else None
    except InputError:
        return None, None
    if not isinstance(doc, Mapping) or step_value(doc.get("global_step")) != step:
        return None, None
    tokens = step_value(doc.get("num_input_tokens_seen"))
    version = _transformers_version(folder)
    logged_at = None if version is None else step if version >= _LOGS_OWN_LR else step - 1
    lr = None
    for entry in doc.get("log_history") or ():
        if isinstance(entry, Mapping) and entry.get("step") == logged_at and is_real(entry.get("learning_rate")):
            lr = float(entry["learning_rate"])
    return (tokens or None), (lr if lr is not None and np.isfinite(lr) else None)


def _transformers_version(folder: Path) -> tuple[int, int] | None:
    """(major, minor) of the transformers that saved HF folder ``folder`` (its ``config.json``)."""
    try:
        config = read_json(folder / "config.json", "Hugging Face config")
    except InputError:
        return None
    found = re.match(r"(\d+)\.(\d+)", str(config.get("transformers_version", ""))) if isinstance(config, Mapping) else None
    return (int(found.group(1)), int(found.group(2))) if found else None


def _with_trainer_coords(ref: CheckpointRef) -> CheckpointRef:
    """``ref`` with the ``tokens_seen`` and ``lr`` its HF folder's ``trainer_state.json`` gives,
    where the manifest gave none."""
    if ref.kind != "hf" or (ref.tokens_seen is not None and ref.lr is not None):
        return ref
    tokens, lr = trainer_state_coords(ref.path, ref.step)
    return dataclasses.replace(ref, tokens_seen=ref.tokens_seen if ref.tokens_seen is not None else tokens,
                               lr=ref.lr if ref.lr is not None else lr)  # fmt: skip


def _one_per_file(entries: list[tuple[Path, str]], root: Path) -> list[tuple[Path, str]]:
    """``entries`` with one name per checkpoint file or folder: a link (``latest -> step1000``,
    Lightning's ``save_last="link"``) or a hard link is the checkpoint it points at, so a name of
    it that gives no step, or the step another of its names gives, is dropped, named in one
    warning. Names that give two different steps are all kept: identical weights at two steps are
    recorded as the duplicate-weights rule says (both, with a warning)."""
    by_file: dict[tuple[int, int], list[tuple[Path, str]]] = {}
    for p, kind in entries:
        st = os.stat(p)
        by_file.setdefault((st.st_dev, st.st_ino), []).append((p, kind))
    dropped: dict[Path, Path] = {}  # a name dropped: the name kept for the same file
    for same in by_file.values():
        same.sort(key=lambda e: (_last_int(e[0]) is None, e[0].is_symlink()))  # a name with a step, the real path, first
        steps: set[int | None] = set()
        for p, _ in same:
            step = _last_int(p)
            if step in steps or (step is None and steps):
                dropped[p] = same[0][0]
            steps.add(step)
    if dropped:
        said = "; ".join(f"{p.name} is {kept.name}" for p, kept in dropped.items())
        warnings.warn(f"{root}: {said} (a link to it, or the same file): recorded once, not twice", stacklevel=3)
    return [e for e in entries if e[0] not in dropped]


def _drop_copies(refs: list[CheckpointRef], root: Path) -> list[CheckpointRef]:
    """``refs`` without the checkpoints whose step comes from the file alone and equals a named
    checkpoint's: Lightning's ``last.ckpt`` (``save_last``) is a copy of, or a link to, the
    latest checkpoint it saved. Each one dropped is named in one warning."""
    named = {r.step: r for r in refs if r.step_from == "name"}
    copies = [r for r in refs if r.step_from == "file" and r.step in named]
    if not copies:
        return refs
    said = "; ".join(f"{r.path.name} records step {r.step}, the step of {named[r.step].path.name}" for r in copies)
    warnings.warn(
        f"{root}: {said}: taken for a copy of that checkpoint (as Lightning's last.ckpt is) and not recorded "
        f"twice; list the checkpoints in {MANIFEST} to record it under another step",
        stacklevel=3,
    )
    dropped = {id(r) for r in copies}
    return [r for r in refs if id(r) not in dropped]


def file_kind(p: Path) -> str | None:
    """``"safetensors"`` or ``"torch"`` by the name of file ``p``, in any case (``step_20.PT``),
    and ``.pth.tar`` (PyTorch's ImageNet example) as torch; None for other names. Such files were
    skipped without a word beside the ones recorded."""
    suffixes = [x.lower() for x in p.suffixes[-2:]]
    suffix = suffixes[-1] if suffixes else ""
    if suffix == ".tar" and len(suffixes) == 2 and suffixes[0] in TORCH_SUFFIXES:
        return "torch"
    return "safetensors" if suffix in SAFETENSORS_SUFFIXES else "torch" if suffix in TORCH_SUFFIXES else None


def _kind_of(p: Path) -> str | None:
    """The kind of checkpoint at ``p`` (None: not one). A checkpoint that is not made of regular
    files (a FIFO, a device, a link to one) is an :class:`InputError`: reading it could block
    or never end."""
    if p.is_dir():
        if not (p / "config.json").exists():
            return None
        check_regular_tree(p)
        return "hf"
    if (kind := file_kind(p)) is not None:
        check_regular(p, "checkpoint")
    return kind


def _last_int(p: Path) -> int | None:
    """The step a name gives: the integer after the last ``step`` in it (``step100``, ``step_100``,
    ``global_step-100``, ``step=100``: whatever follows, such as ``_bf16`` or Lightning's ``-v1``),
    else its last integer once the parts that hold a number but never a step are dropped
    (``checkpoint-100``, ``model_100``, ``ckpt-100-v1``, ``model_100_bf16``, ``pythia-70m-100``,
    ``ckpt-100_gpt2``, ``ckpt_100_tp2``, ``gpt2_model100``, ``final2_100``: 100); None when no
    integer is left (``last-v1``, ``model_bf16``, ``epoch=3``, ``final``, ``gpt2_tp4``,
    ``llama3_best``, ``final2``, ``L12``).

    The parts dropped: a version (``v1``, Lightning's suffix on a clashing name), a dtype
    (``bf16``, ``fp32``, ``int8``), another counter (``epoch``, ``ep``, ``seed``, ``rank``,
    ``run``, ``shard``, ``part``, ``token``, ``sample``, ``example``, ``seq``, plural too, and
    ``of`` followed by a number; ``00001-of-00002``; fairseq's ``checkpoint3``, epoch 3), a logged
    value (``val_loss=0.12``: any ``key=number``), a date with its time (``2024-05-01T12-30``,
    ``20240501_1230``), a decimal or e-notation number (``0.5``, ``3e-4``) and a part with
    letters after its digits (``70m``, ``1.4b``, ``100k``, a hash such as ``3f2a9c``), and a model
    or a parallelism with its number (``gpt2``, ``llama3``, ``qwen2.5``, ``tp2``, ``zero3``,
    ``a100``), and any other word with its number glued on (``final2``, ``L12``, ``e10``,
    ``resnet50``) but one that counts steps (``iter500``, ``it500``, ``ckpt500``, ``model500``:
    500). A decimal
    after ``step`` (``step_1.5k``) is not an integer step either.
    """
    name = p.name if p.is_dir() else p.name[: -len(p.suffix)] if p.suffix else p.name
    after_step = _STEP_INT.findall(name)
    if after_step:
        return int(after_step[-1])
    ints = _INT.findall(_NOT_A_STEP.sub(" ", _DATE.sub(" ", name)))
    return int(ints[-1]) if ints else None


def held_step(p: Path, kind: str) -> int | None:
    """The step checkpoint ``p`` records itself, or None: a torch file's top-level ``global_step``
    (Lightning), ``iteration`` (Megatron), ``iter_num`` (nanoGPT) or ``step``; an HF folder's
    ``trainer_state.json`` ``global_step``. Read safely (``weights_only``, memory-mapped); a file
    that cannot be read so records nothing here (loading it reports why)."""
    if kind == "hf":
        state = p / "trainer_state.json"
        try:
            doc = read_json(state, "trainer state") if state.is_file() else None
        except InputError:
            return None
        return step_value(doc.get("global_step")) if isinstance(doc, Mapping) else None
    if kind != "torch":
        return None
    from .loading import read_torch_file  # torch: imported only when a name gives no step

    try:
        obj = read_torch_file(p)
    except InputError:  # UnsafeFileError too: refused again, with its message, when loaded
        return None
    found = recorded_step(obj)
    return None if found is None else found[1]


def recorded_step(obj: Any, keys: Sequence[str] = STEP_KEYS) -> tuple[str, int] | None:
    """(the key, the step) a torch checkpoint's object records under the first of ``keys`` that
    holds a step (:func:`step_value`), or None; a bare state dict records none."""
    if not isinstance(obj, Mapping) or all(hasattr(v, "numel") for v in obj.values()):
        return None  # a bare state dict: a tensor named "step" there is a model's buffer, not the checkpoint's step
    for key in keys:
        if (step := step_value(obj.get(key))) is not None:
            return key, step
    return None


def step_value(v: Any) -> int | None:
    """``v`` as a step: an integer in [0, 2**63 - 1] (a one-element integer tensor too), else None."""
    if hasattr(v, "numel") and hasattr(v, "item") and v.numel() == 1 and not v.is_floating_point() and not v.is_complex():
        v = v.item()
    if not is_int(v) or not 0 <= v <= MAX_STEP:
        return None
    return int(v)


def _step_of(p: Path, kind: str | None) -> tuple[int, str]:
    """The step of checkpoint ``p`` and where it was read (``"name"`` or ``"file"``); an
    :class:`InputError` naming it when neither gives one."""
    step = _last_int(p)
    if step is not None:
        return _name_step(step, p), "name"
    if kind is not None and (held := held_step(p, kind)) is not None:
        return held, "file"
    raise InputError(f"cannot tell the step of {p}: {_NO_STEP}. Rename it (e.g. step_000100.pt) or give its \"step\" in a {MANIFEST}")


def _name_step(step: int, p: Path) -> int:
    """The step read from ``p``'s name, checked to fit the store's int64 steps."""
    if step > MAX_STEP:
        raise InputError(f"{p}: step {step} in its name is beyond 2**63 - 1; rename it, or give its step in a {MANIFEST}")
    return step


def _read_manifest(path: Path, axis: str | None) -> list[CheckpointRef]:
    doc = read_json(path, "manifest")
    if not isinstance(doc, Mapping) or not isinstance(doc.get("checkpoints"), list) or not doc["checkpoints"]:
        raise InputError(f'{path}: a manifest is {{"checkpoints": [{{"path": ..., "step": ...}}, ...]}} with at least one entry')
    if unknown := set(doc) - _MANIFEST_KEYS:  # "Axis" dropped made a D sweep a T run, its steps read from names
        raise InputError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(_MANIFEST_KEYS)}")
    axis = axis or doc.get("axis", "T")
    if axis not in AXES:
        raise InputError(f"{path}: axis must be one of {AXES}, got {axis!r}")
    default_model = doc.get("model")
    refs = []
    for j, e in enumerate(doc["checkpoints"]):
        where = f"{path} entry {j}"
        if not isinstance(e, Mapping) or "path" not in e:
            raise InputError(f'{where}: expected an object with "path", got {e!r}')
        if unknown := set(e) - _ENTRY_KEYS:
            raise InputError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_ENTRY_KEYS)}")
        # a key of the other kind of axis would be dropped: a value given is a value used
        other, needs = ("axis_value", 'a D or M sweep ("axis": "D" or "M")') if axis == "T" else ("step", "an axis-T run")
        if other in e:
            raise InputError(f'{where}: "{other}" applies to {needs}; this manifest is of axis {axis}'
                             f"{' (--axis)' if axis != doc.get('axis', 'T') else ''}")  # fmt: skip
        if not isinstance(e["path"], str) or not e["path"] or "\0" in e["path"]:
            raise InputError(f'{where}: "path" must be a non-empty string (a file or folder name), got {e["path"]!r}')
        if e.get("kind") and e["kind"] not in KINDS:
            raise InputError(f'{where}: "kind" must be one of {KINDS}, got {e["kind"]!r}')
        p = Path(e["path"])
        p = p if p.is_absolute() else path.parent / p
        if not p.exists():
            raise InputError(f"{where}: {p} does not exist")
        kind = e.get("kind") or _kind_of(p)
        if kind is None:
            raise InputError(f'{where}: cannot tell the kind of {p}; add "kind": one of {KINDS}')
        step_from = "manifest"
        if axis == "T":
            if "step" in e:
                step = e["step"]
            else:
                step, step_from = _step_of(p, kind if kind in KINDS else None)
        else:
            if "axis_value" not in e:
                raise InputError(f'{where}: an axis-{axis} manifest needs "axis_value" in every entry')
            if is_real(e["axis_value"]) and e["axis_value"] < 0:  # a fit leaves it out as no place on a log axis
                raise InputError(f'{where}: "axis_value" {e["axis_value"]!r} is negative; an axis-{axis} value counts '
                                 f'{"training tokens" if axis == "D" else "parameters"}')  # fmt: skip
            step = 0  # ordinal, assigned by _order
        try:
            refs.append(
                CheckpointRef(
                    step=_int(step, "step"), path=p, kind=kind,
                    tokens_seen=None if e.get("tokens_seen") is None else _int(e["tokens_seen"], "tokens_seen"),
                    axis_value=None if e.get("axis_value") is None else _float(e["axis_value"], "axis_value"),
                    lr=None if e.get("lr") is None else _float(e["lr"], "lr"),
                    model=e.get("model", default_model), step_from=step_from if axis == "T" else None,
                )  # fmt: skip
            )
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: {exc}") from None
        if axis == "T":
            refs[-1] = _with_trainer_coords(refs[-1])
    return order_refs(refs, axis, str(path))


MAX_STEP = int(np.iinfo(np.int64).max)  # steps and token counts are stored as int64


def _int(v: Any, what: str) -> int:
    if not is_int(v) or not 0 <= v <= MAX_STEP:
        raise InputError(f"{what} must be an integer in [0, 2**63 - 1], got {v!r}")
    return int(v)


def _float(v: Any, what: str) -> float:
    if not is_real(v) or not np.isfinite(float(v)):  # an int past 1e308 is no axis value
        raise InputError(f"{what} must be a finite number, got {v!r}")
    return float(v)


def order_refs(refs: Sequence[CheckpointRef], axis: str, where: str) -> list[CheckpointRef]:
    """Sort by step (T) or axis_value (D, M, which get ordinal steps); refuse duplicates."""
    if axis not in AXES:
        raise InputError(f"axis must be one of {AXES}, got {axis!r}")
    key = "step" if axis == "T" else "axis_value"
    if axis != "T" and any(r.axis_value is None for r in refs):
        raise InputError(f"{where}: every checkpoint of an axis-{axis} run needs an axis_value")
    refs = sorted(refs, key=lambda r: getattr(r, key))
    for a, b in zip(refs, refs[1:]):
        if getattr(a, key) == getattr(b, key):
            raise InputError(f"{where}: {a.path} and {b.path} both have {key} {getattr(a, key)}; keep one, or give steps in a {MANIFEST}")
    # The axis a fit reads, known in full before any checkpoint is evaluated (as assemble_axis and
    # import-npz know theirs): steps past 2**53 whose float64 values tie stopped the recording at
    # the second, its rows before kept; a log10 tie was recorded whole, and no fit could use it.
    values = np.array([float(getattr(r, key)) for r in refs])
    tie = axis_tie(values)
    if tie is not None:
        a, b = refs[tie], refs[tie + 1]
        why = (f"one float64 axis value ({float(values[tie])!r})" if values[tie] == values[tie + 1] else
               f"too close to tell apart on a log scale (log10 = {float(np.log10(values[tie]))!r} both, in float64)")
        raise InputError(f"{where}: {a.path} and {b.path} ({key} {getattr(a, key)!r} and {getattr(b, key)!r}) are {why}: "
                         f"one point on a fit's log axis, so no fit could use the run; leave one of them out")  # fmt: skip
    if axis != "T":
        refs = [dataclasses.replace(r, step=k) for k, r in enumerate(refs)]
    return refs


def manifest_axis(path: str | os.PathLike) -> str | None:
    """The ``"axis"`` of the manifest at ``path`` (a manifest, or a folder holding one), if any."""
    p = Path(path)
    m = p if p.is_file() else p / MANIFEST
    if m.is_file() and m.name.endswith(".json"):
        doc = read_json(m, "manifest")
        return doc.get("axis") if isinstance(doc, Mapping) else None
    return None
