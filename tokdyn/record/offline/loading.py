"""Loading checkpoints safely: state dicts without unpickling code, models, fingerprints.

torch files are read only with ``torch.load(weights_only=True)``: a file that needs pickle for
anything beyond tensors and plain containers is refused with
:class:`~tokdyn.errors.UnsafeFileError`, never executed. An HF folder's ``pytorch_model*.bin``
files are checked the same way before transformers reads them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..._files import check_regular
from ...errors import InputError, UnsafeFileError
from .discovery import (MANIFEST, MODEL_DTYPE_NAMES, STEP_KEYS, CheckpointRef, file_kind, held_step, is_adapter_folder,
                        recorded_step)
from .files import check_regular_tree, read_json
from .models import HF_LOCK, build_model, check_causal_model_type, import_transformers, json_type, model_spec_beside, short_error

__all__ = ["read_state_dict", "read_torch_file", "load_checkpoint", "weights_fingerprint", "needs_transformers", "ModelFactory",
           "MODEL_DTYPES", "StepMismatchWarning"]

WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module")  # {"model": state_dict}, ...
STRIP_PREFIXES = ("module.", "_orig_mod.")  # DDP, torch.compile
MODEL_DTYPES = {name: getattr(torch, name) for name in MODEL_DTYPE_NAMES}

ModelFactory = Callable[[], torch.nn.Module]


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict in a torch or safetensors file, on the CPU, without unpickling code.

    torch files are read with ``torch.load(weights_only=True)``; a ``{"model": sd}`` /
    ``{"state_dict": sd}`` wrapper is unwrapped and a ``module.`` (DDP) or ``_orig_mod.``
    (torch.compile) prefix on every key is stripped.

    Raises
    ------
    UnsafeFileError
        The file needs pickle to rebuild arbitrary objects; nothing in it was executed.
    InputError
        The file is not a readable checkpoint, or holds no state dict.
    """
    p = Path(path)
    check_regular(p, "checkpoint")
    if file_kind(p) == "safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            obj: Any = load_file(p, device="cpu")
        except (SafetensorError, OSError) as exc:
            raise InputError(f"{p} is not a readable safetensors file (corrupt, or another format): {_error_detail(exc)}") from None
    else:
        obj = _torch_load_safely(p)
    return _strip_prefixes(_unwrap(obj, p))


class StepMismatchWarning(UserWarning):
    """A checkpoint's name gives one step and the file records another (the name's is used)."""


def read_torch_file(path: str | os.PathLike) -> Any:
    """The object in torch file ``path`` (a regular file), read with ``torch.load(weights_only=True)``,
    memory-mapped: a state dict, or a training checkpoint's dict (``global_step``, ...).

    Raises :class:`UnsafeFileError` or :class:`InputError` as :func:`read_state_dict` does.
    """
    p = Path(path)
    check_regular(p, "checkpoint")
    return _torch_load_safely(p)


def _torch_load_safely(p: Path) -> Any:
    """The object in torch file ``p``, read with ``torch.load(weights_only=True)``.

    Every way the file can fail to load is one :class:`InputError` naming it: a file that is not
    a torch checkpoint (text, random bytes, another format) or is cut short is recognised from its
    header before torch reads it (torch would print warnings about it, then fail in any of a dozen
    ways); only a well-formed pickle that names a Python global torch will not load is an
    :class:`UnsafeFileError`.
    """
    zipped = _check_torch_header(p)
    try:
        with warnings.catch_warnings():
            # a PROTO opcode past the header (a damaged legacy file: its pickles follow one
            # another) makes the weights-only unpickler warn, then read on: an error here
            warnings.filterwarnings("error", message=_LATE_PROTOCOL.pattern, category=UserWarning)
            # mmap: tensor data stays on disk until copied into the model (zip-format files only).
            return torch.load(p, map_location="cpu", weights_only=True, mmap=zipped)
    except MemoryError:
        raise
    except UserWarning as exc:
        found = _LATE_PROTOCOL.search(str(exc))
        raise _not_a_checkpoint(p, f"pickle protocol {found.group(1)} declared past its header"
                                if found else exc) from None
    except pickle.UnpicklingError as exc:
        found = _UNSAFE_GLOBAL.search(str(exc))
        if found is None:  # a damaged pickle (an unknown opcode, a short string, ...), not code
            raise _not_a_checkpoint(p, exc) from None
        raise UnsafeFileError(
            f"{p} cannot be loaded without unpickling arbitrary Python objects (it references {found.group(1)}); "
            "tokdyn loads torch files only with torch.load(weights_only=True) and refuses to run code from a "
            "checkpoint. If you trust it, load it yourself and save only its tensors: torch.save(state_dict, PATH), or "
            "safetensors.torch.save_file({k: v.clone().contiguous() for k, v in state_dict.items()}, PATH) (the clone "
            "parts tied weights, which save_file refuses to write shared)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - torch fails on damaged files with any exception type
        raise _not_a_checkpoint(p, exc) from None


# What torch's weights-only unpickler warns when a pickle declares another protocol than 2.
_LATE_PROTOCOL = re.compile(r"Detected pickle protocol (\d+)")
# A Python global the weights-only unpickler refused ("GLOBAL os.system whose module os is blocked",
# "GLOBAL eval was not an allowed global"): a well-formed pickle of code. A damaged file fails on
# an opcode or a truncated string instead.
_UNSAFE_GLOBAL = re.compile(r"GLOBAL ([A-Za-z_][\w.]*) (?:was not an allowed global|whose module)")
_PICKLE_PROTO = 0x80  # a pickle of protocol 2 or later starts with PROTO, then the protocol number
_TORCH_PROTOCOLS = (2, 3)  # torch.save's default is 2; the weights-only unpickler fails on 4 and 5 (their FRAME opcode)
# torch warns of every pickle protocol but 2 it meets, mid-file too (a damaged file, or protocol 3,
# which it reads): a damaged file is one error line, a readable one loads quietly. A filter, not
# catch_warnings: files load in worker threads, and catch_warnings is not thread-safe.
warnings.filterwarnings("ignore", message=r"Detected pickle protocol \d+ in the checkpoint", category=UserWarning)


def _check_torch_header(p: Path) -> bool:
    """Whether ``p`` is a zip-format torch file (else a legacy one); an :class:`InputError` when
    its first bytes are neither, or its pickle protocol is one ``weights_only`` cannot read."""
    try:
        zipped = zipfile.is_zipfile(p)
        with zipfile.ZipFile(p) if zipped else contextlib.nullcontext() as zf:
            pkl = p if zf is None else next((n for n in zf.namelist() if n.rsplit("/", 1)[-1] == "data.pkl"), None)
            if pkl is not None:
                with open(pkl, "rb") if zf is None else zf.open(pkl) as fh:
                    head = fh.read(2)
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as exc:  # a damaged archive
        raise _not_a_checkpoint(p, exc) from None
    if pkl is None:
        raise _not_a_checkpoint(p, "a zip archive without data.pkl")
    if len(head) < 2 or head[0] != _PICKLE_PROTO or not 2 <= head[1] <= pickle.HIGHEST_PROTOCOL:
        with open(p, "rb") as fh:
            start = fh.read(4)
        if not start:
            raise _not_a_checkpoint(p, "an empty file")
        raise _not_a_checkpoint(p, "a truncated zip archive" if start == b"PK\x03\x04" and not zipped else None)
    if head[1] not in _TORCH_PROTOCOLS:
        raise InputError(
            f"{p} is pickled with protocol {head[1]}, which torch.load(weights_only=True) cannot read; save it with "
            "torch.save's default protocol (2), or convert it to safetensors"
        )
    return zipped


def _not_a_checkpoint(p: Path, detail: BaseException | str | None) -> InputError:
    text = detail if isinstance(detail, str) or detail is None else _error_detail(detail)
    return InputError(f"{p} is not a readable torch checkpoint (corrupt, or another format)" + (f": {text}" if text else ""))


def _error_detail(exc: BaseException) -> str:
    """What went wrong, in a few words: torch's weights-only errors bury it under a long preamble."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n")[0]
    return short_error(text or type(exc).__name__, limit=200)


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def _unwrap(obj: Any, p: Path) -> dict[str, torch.Tensor]:
    if _is_state_dict(obj):
        return dict(obj)
    if isinstance(obj, Mapping):
        for key in WRAPPER_KEYS:
            if _is_state_dict(obj.get(key)):
                return dict(obj[key])
        keys = ", ".join(map(str, list(obj)[:8]))
        raise InputError(f"{p} holds no state dict: a mapping of names to tensors, or one under {WRAPPER_KEYS} (found keys: {keys})")
    raise InputError(f"{p} holds a {type(obj).__name__}, not a state dict")


def _strip_prefixes(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    while True:
        prefix = next((q for q in STRIP_PREFIXES if all(k.startswith(q) for k in sd)), None)
        if prefix is None:
            return sd
        sd = {k[len(prefix) :]: v for k, v in sd.items()}


def load_checkpoint(
    ref: CheckpointRef,
    *,
    model_factory: ModelFactory | None = None,
    device: torch.device | str = "cpu",
    model_dtype: str | None = "float32",
) -> torch.nn.Module:
    """The model of one checkpoint, on ``device`` in ``model_dtype`` (None: as built/stored).

    An HF folder is loaded with ``AutoModelForCausalLM.from_pretrained`` from local files only
    (safetensors when present; a ``pytorch_model.bin`` is first checked with
    ``torch.load(weights_only=True)``). A bare state dict is loaded into ``model_factory()``,
    else into the model of ``ref.model``, else of a ``tokdyn_model.json`` / ``config.json``
    beside the file (``model_factory`` does not apply to HF folders: they carry their config).
    """
    if model_dtype is not None and model_dtype not in MODEL_DTYPES:
        raise InputError(f"model_dtype must be one of {tuple(MODEL_DTYPES)} or None, got {model_dtype!r}")
    if ref.kind == "hf":
        if ref.step_from == "name":
            _check_recorded_step(ref, held_step(ref.path, "hf"), "trainer_state.json global_step")
        model = _load_hf(ref.path)
    else:
        sd = _state_dict_of(ref)
        model = _bare_model(ref, model_factory)
        _load_into(model, sd, ref.path)
        del sd
    if model_dtype is not None:
        model = model.to(MODEL_DTYPES[model_dtype])
    return model.to(device).eval()


def _state_dict_of(ref: CheckpointRef) -> dict[str, torch.Tensor]:
    """:func:`read_state_dict` of ``ref``'s file, checking a step read from its name against the
    one a torch file records (Lightning's ``global_step``, ...), from the same single read."""
    p = ref.path
    if file_kind(p) == "safetensors" or ref.step_from != "name":
        return read_state_dict(p)
    obj = read_torch_file(p)
    found = recorded_step(obj, STEP_KEYS[:3])  # not "step": its meaning varies
    if found is not None:
        _check_recorded_step(ref, found[1], found[0])
    return _strip_prefixes(_unwrap(obj, p))


def _check_recorded_step(ref: CheckpointRef, recorded: int | None, what: str) -> None:
    """Warn when the step a checkpoint records contradicts the step its name gave (which is used:
    the run's rows are already ordered by it)."""
    if recorded is not None and recorded != ref.step:
        warnings.warn(
            f"{ref.path}: its name gives step {ref.step} but the checkpoint records {what} {recorded}; it is recorded "
            f"at step {ref.step}. If the file is right, rename it or give its \"step\" in {MANIFEST}",
            StepMismatchWarning,
            stacklevel=2,
        )


def _model_spec_for(ref: CheckpointRef) -> tuple[Mapping, str] | None:
    """The spec of a bare state dict's model and where it came from: the manifest, else beside the file."""
    if ref.model is not None:
        return ref.model, f"model spec for {ref.path}"
    found = model_spec_beside(ref.path.parent)
    return None if found is None else (found[0], str(found[1]))


def _bare_model(ref: CheckpointRef, model_factory: ModelFactory | None) -> torch.nn.Module:
    """A fresh model for a bare state dict: ``model_factory()``, else built from its spec."""
    if model_factory is not None:
        model = model_factory()
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"the model factory returned a {type(model).__name__}, not a torch.nn.Module")
        return model
    found = _model_spec_for(ref)
    if found is None:
        raise InputError(
            f"{ref.path} is a bare state dict and no model is known for it: pass --model JSON (tokdyn record-offline) "
            f'or model_factory= (Python), add "model": {{"type": "tinygpt", "config": {{...}}}} to {MANIFEST}, or put a '
            f"tokdyn_model.json or config.json beside it"
        )
    return build_model(found[0], where=found[1])


def _load_into(model: torch.nn.Module, sd: Mapping[str, torch.Tensor], p: Path) -> None:
    """``load_state_dict``, once ``sd`` is checked to hold the model's weights (:func:`_check_weights`):
    keys the model lacks that transformers itself ignores (the causal-mask buffers an older
    transformers saved with every GPT-2) are dropped first."""
    model_sd = model.state_dict()
    ignored = _ignored_unexpected(model)
    sd = _strip_owner_prefix(sd, set(model_sd), ignored)
    sd = {k: v for k, v in sd.items() if k in model_sd or not ignored(k)}
    mismatched = [(k, tuple(v.shape), tuple(model_sd[k].shape)) for k, v in sd.items()
                  if k in model_sd and isinstance(model_sd[k], torch.Tensor) and not _same_shape(v.shape, model_sd[k].shape)]  # fmt: skip
    _check_weights(model, p, missing=set(model_sd) - set(sd), unexpected=[k for k in sd if k not in model_sd],
                   mismatched=mismatched, fix="Check the model config")  # fmt: skip
    try:
        model.load_state_dict(sd, strict=False)
    except RuntimeError as exc:  # what the shapes do not show (a dtype torch cannot copy, ...)
        raise InputError(f"{p} does not fit the model: {short_error(exc)}. Check the model config") from None


def _same_shape(file_shape: torch.Size, model_shape: torch.Size) -> bool:
    # load_state_dict takes a one-element tensor for a scalar (what older torch saved for one)
    return file_shape == model_shape or (len(model_shape) == 0 and tuple(file_shape) == (1,))


def _check_weights(model: torch.nn.Module, where: Path, *, missing: Iterable[str], unexpected: Iterable[str],
                   mismatched: Iterable[tuple[str, tuple, tuple]], fix: str) -> None:  # fmt: skip
    """Refuse, in one :class:`InputError` line naming a few of each, weights that do not match the
    model they were loaded into: a model left with weights the file lacks would be evaluated with
    the random values it was built with, and one that leaves weights of the file out (a config
    with fewer layers than were trained) is not the model that was trained.

    A key missing from the file is allowed where its tensor is tied to one that is present (a
    tied LM head: safetensors and ``save_pretrained`` store shared tensors once) or where the
    model's class declares it may be missing (``_keys_to_ignore_on_load_missing``); ``unexpected``
    comes without the keys transformers ignores (:func:`_ignored_unexpected`).
    """
    needed = _needed(model, set(missing))
    unexpected, mismatched = sorted(unexpected), sorted(mismatched)
    if not (needed or unexpected or mismatched):
        return
    parts = []
    if mismatched:
        shapes = ", ".join(f"{k} is {list(a)} in the file and {list(b)} in the model" for k, a, b in mismatched[:4])
        parts.append(f"does not fit the model: {shapes}{_more(mismatched, 4)}")
    if needed:
        head = _lm_head_keys(model) & set(needed)
        parts.append(f"lacks weights the model needs: {needed[:8]}{_more(needed, 8)}"
                     + (f" (the LM head of {type(model).__name__}: saved from the base model without it, such as "
                        "GPT2Model rather than GPT2LMHeadModel?)" if head == set(needed) else ""))  # fmt: skip
    if unexpected:
        prefix = _extra_prefix(unexpected, set(needed))
        parts.append(f"has weights the model lacks: {unexpected[:8]}{_more(unexpected, 8)}"
                     + (f" (its keys carry a prefix, {prefix!r}, that the model's lack)" if prefix else ""))  # fmt: skip
    raise InputError(f"{where} " + "; it ".join(parts) + f". {fix}")


def _extra_prefix(unexpected: Sequence[str], needed: set[str]) -> str | None:
    """The dotted prefix every key of ``unexpected`` shares, when without it they are keys the
    model needs (weights saved from a module that held the model under an attribute)."""
    return next((prefix for prefix in _shared_prefixes(unexpected) if any(k[len(prefix) :] in needed for k in unexpected)), None)


def _shared_prefixes(keys: Sequence[str]):
    """Each dotted prefix (``net.``, ``net.model.``) that every key of ``keys`` starts with, shortest first."""
    parts = keys[0].split(".")
    for n in range(1, len(parts)):
        prefix = ".".join(parts[:n]) + "."
        if not all(k.startswith(prefix) for k in keys):
            return
        yield prefix


def _more(items: Sequence, shown: int) -> str:
    return f" and {len(items) - shown} more" if len(items) > shown else ""


def _needed(model: torch.nn.Module, missing: set[str]) -> list[str]:
    """The keys of ``missing`` the model cannot do without, sorted: not those tied to a key that is
    present, nor those its class says may be missing."""
    declared = _patterns(model, "_keys_to_ignore_on_load_missing")
    by_tensor: dict[int, list[str]] = {}
    tensor_of: dict[str, int] = {}
    for name, t in model.state_dict(keep_vars=True).items():  # tied names hold the same tensor object
        by_tensor.setdefault(id(t), []).append(name)
        tensor_of[name] = id(t)
    return sorted(k for k in missing if not declared(k)
                  and (k not in tensor_of or all(n in missing for n in by_tensor[tensor_of[k]])))  # fmt: skip


def _lm_head_keys(model: torch.nn.Module) -> set[str]:
    """The state-dict keys of the model's own LM head (its output embedding, when it says which):
    none where the head is tied to the input embedding (then it is no head of its own)."""

    def tensors(getter: str) -> set[int]:
        get = getattr(model, getter, None)
        try:
            module = get() if callable(get) else None
        except (NotImplementedError, AttributeError):  # an HF model without one
            return set()
        return {id(t) for t in module.state_dict(keep_vars=True).values()} if isinstance(module, torch.nn.Module) else set()

    own = tensors("get_output_embeddings") - tensors("get_input_embeddings")
    return {name for name, t in model.state_dict(keep_vars=True).items() if id(t) in own}


# Buffers that older transformers versions saved with the weights and newer ones compute (never
# learned): GPT-2's and GPT-J's `attn.masked_bias` (before 4.31), the rotary `inv_freq` and
# `position_ids` (transformers itself ignores the last two, where the model has such buffers).
_HF_LEGACY_BUFFERS = (r"(^|\.)masked_bias$", r"rotary_emb\.inv_freq$", r"(^|\.)position_ids$")


def _ignored_unexpected(model: torch.nn.Module) -> Callable[[str], bool]:
    """Whether a key of a file that ``model`` lacks is one to drop quietly: one of the patterns its
    class declares (``_keys_to_ignore_on_load_unexpected``, found with ``re.search`` as
    transformers does: GPT-2's ``attn.bias``, the causal mask every GPT-2 saved before
    transformers 4.31), for a transformers model a buffer older versions saved (above), or a
    buffer the model keeps out of its state (``persistent=False``: it computes it, as the GPT-2
    of transformers 4.x does its causal mask, which transformers drops from a file too)."""
    is_hf = any(c.__module__.split(".")[0] == "transformers" for c in type(model).__mro__)
    declared = _patterns(model, "_keys_to_ignore_on_load_unexpected", _HF_LEGACY_BUFFERS if is_hf else ())
    computed = {name for name, _ in model.named_buffers(remove_duplicate=False)} - set(model.state_dict())
    return lambda key: key in computed or declared(key)


def _patterns(model: torch.nn.Module, attr: str, extra: Iterable[str] = ()) -> Callable[[str], bool]:
    """A test of whether a key matches one of the regular expressions ``model.<attr>`` lists
    (transformers: None, a list or a set; an instance gathers its submodules' too) or ``extra``."""
    declared = getattr(model, attr, None)
    found = []
    for pattern in [*(declared if isinstance(declared, (list, tuple, set, frozenset)) else ()), *extra]:
        try:
            found.append(re.compile(pattern))
        except (re.error, TypeError):  # a pattern transformers could not use either
            continue
    return lambda key: any(r.search(key) for r in found)


def _strip_owner_prefix(sd: Mapping[str, torch.Tensor], model_keys: set[str],
                        ignored: Callable[[str], bool] = lambda key: False) -> Mapping[str, torch.Tensor]:  # fmt: skip
    """``sd`` without a dotted prefix that every key shares (``net.``, ``model.``: a Lightning module
    saves its network under the attribute that holds it), when that prefix is all that keeps the
    keys from being the model's (but for keys ``ignored`` drops); otherwise ``sd`` as it is."""

    def fits(keys) -> bool:
        return all(k in model_keys or ignored(k) for k in keys)

    if not sd or fits(sd):
        return sd
    for prefix in _shared_prefixes(list(sd)):
        stripped = {k[len(prefix) :]: v for k, v in sd.items()}
        if fits(stripped):
            return stripped
    return sd


def needs_transformers(refs: Iterable[CheckpointRef], model_factory: ModelFactory | None = None) -> bool:
    """Whether loading ``refs`` uses transformers: an HF folder, or a bare state dict whose spec is ``"hf"``.

    A spec that cannot be read counts as not: loading that checkpoint reports the error.
    """
    for ref in refs:
        if ref.kind == "hf":
            return True
        if model_factory is None:
            try:
                found = _model_spec_for(ref)
            except InputError:
                continue
            if found is not None and isinstance(found[0], Mapping) and found[0].get("type") == "hf":
                return True
    return False


def _load_hf(folder: Path) -> torch.nn.Module:
    transformers = import_transformers()
    check_regular_tree(folder)  # also for a manifest's entry, which discovery did not look into: a FIFO would block
    config = read_json(folder / "config.json", "Hugging Face config")
    if not isinstance(config, Mapping):
        raise InputError(f"{folder / 'config.json'}: expected an object of config fields, got {json_type(config)}")
    try:
        check_causal_model_type(config.get("model_type"))
    except InputError as exc:
        raise InputError(f"{folder / 'config.json'}: {exc}") from None
    _check_config_numbers(folder, config, transformers)
    has_st = any((folder / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json"))
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not has_st:
        if not bins and is_adapter_folder(folder):
            raise InputError(f"{folder} holds a PEFT adapter (adapter_config.json), not a whole model; tokdyn records whole models: "
                             "merge the adapter into its base model (peft's merge_and_unload(), then save_pretrained) and record that")
        if not bins:
            raise InputError(f"Hugging Face folder {folder} has no model.safetensors or pytorch_model.bin")
        for b in bins:  # refuse pickled code ourselves, whatever the transformers version does
            _torch_load_safely(b)
    # the loading info lists what the file and the model do not share; with mismatched sizes
    # ignored, a tensor of another shape is listed too (and refused below), not a bare error
    kwargs: dict[str, Any] = {"local_files_only": True, "use_safetensors": has_st, "trust_remote_code": False,
                              "output_loading_info": True, "ignore_mismatched_sizes": True}  # fmt: skip
    if "weights_only" in _from_pretrained_params(transformers):  # an explicit parameter since transformers 5
        kwargs["weights_only"] = True
    try:
        with HF_LOCK, _no_load_report():
            model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except pickle.UnpicklingError:
        raise UnsafeFileError(
            f"{folder}: the weights cannot be loaded without unpickling arbitrary Python objects; tokdyn refuses "
            "to run code from a checkpoint. If you trust it, convert it to safetensors"
        ) from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged folder fails in transformers or safetensors with any exception type
        raise InputError(f"cannot load Hugging Face folder {folder}: {_error_detail(exc)}") from None
    if info.get("error_msgs"):
        raise InputError(f"cannot load Hugging Face folder {folder}: {short_error(info['error_msgs'][0], limit=200)}")
    ignored = _ignored_unexpected(model)
    _check_weights(
        model, folder, missing=info.get("missing_keys") or (),
        unexpected=[k for k in info.get("unexpected_keys") or () if not ignored(k)],
        mismatched=[(k, tuple(a), tuple(b)) for k, a, b in info.get("mismatched_keys") or ()],
        fix=f"The weights must be those of the model its config.json builds ({type(model).__name__})",
    )  # fmt: skip
    return model


class _LoadReportFilter(logging.Filter):
    """Drops transformers' report of the weights a checkpoint and its model do not share (the table
    of transformers 5, the "Some weights of ..." lines before): :func:`_check_weights` refuses those
    that matter in one line, and those it lets pass (a tied head, an old causal-mask buffer) are
    no news."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is not the report
            return True
        return "LOAD REPORT" not in text and not text.startswith("Some weights of")


@contextlib.contextmanager
def _no_load_report():
    """transformers' loading report left out while the block runs (under :data:`HF_LOCK`: the
    filter is on transformers' process-wide logger)."""
    log = logging.getLogger("transformers.modeling_utils")
    quiet = _LoadReportFilter()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


def _check_config_numbers(folder: Path, config: Mapping, transformers) -> None:
    """Refuse a config.json field that holds text, true or false where its model's config class
    has a number (``"n_embd": "abc"``), naming it: transformers 4.x built the model with it and failed in
    torch ("empty(): argument 'size' failed to unpack ..."), which names no field."""
    try:
        with HF_LOCK:  # transformers' lazy imports, as for the model itself
            default = transformers.AutoConfig.for_model(config["model_type"])
    except Exception:  # noqa: BLE001 - no defaults to compare with: loading says what is wrong
        return
    for key, value in config.items():
        try:
            number = getattr(default, key, None) if isinstance(key, str) and key.isidentifier() else None
        except Exception:  # noqa: BLE001 - a config property that cannot be read: nothing to compare with
            continue
        if isinstance(value, (str, bool)) and isinstance(number, (int, float)) and not isinstance(number, bool):
            what = "true or false" if isinstance(value, bool) else "text"  # (lists stay: token ids may be one)
            raise InputError(f"{folder / 'config.json'}: {key} is {short_error(json.dumps(value), limit=60)}, {what} where "
                             f"{type(default).__name__} takes a number ({number!r} by default)")


@functools.cache
def _from_pretrained_params(transformers) -> frozenset:
    import inspect

    return frozenset(inspect.signature(transformers.PreTrainedModel.from_pretrained).parameters)


def weights_fingerprint(state_dict: Mapping[str, torch.Tensor] | torch.nn.Module) -> int:
    """A uint64 fingerprint of weights: blake2b over the sorted names, dtypes, shapes and bytes.

    Equal fingerprints mean (up to a 2^-64 chance) identical weights under identical names.
    A module is fingerprinted by its ``state_dict()``.
    """
    if isinstance(state_dict, torch.nn.Module):
        state_dict = state_dict.state_dict()
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(state_dict):
        t = state_dict[name]
        if not isinstance(t, torch.Tensor):
            continue
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # raw bytes, any dtype (bf16 too)
    return int.from_bytes(h.digest(), "little")
