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
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError, UnsafeFileError
from .discovery import (MANIFEST, MODEL_DTYPE_NAMES, SAFETENSORS_SUFFIXES, STEP_KEYS, CheckpointRef, held_step, is_adapter_folder,
                        recorded_step)
from .files import check_regular, read_json
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
    check_regular(p)
    if p.suffix in SAFETENSORS_SUFFIXES:
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
    check_regular(p)
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
            "checkpoint. If you trust it, convert it to safetensors (load it yourself, then "
            "safetensors.torch.save_file(state_dict, ...)) or save only model.state_dict()"
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
    if p.suffix in SAFETENSORS_SUFFIXES or ref.step_from != "name":
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
            f"{ref.path} is a bare state dict and no model is known for it: pass model_factory=, add "
            f'"model": {{"type": "tinygpt", "config": {{...}}}} to {MANIFEST}, or put tokdyn_model.json beside it'
        )
    return build_model(found[0], where=found[1])


def _load_into(model: torch.nn.Module, sd: Mapping[str, torch.Tensor], p: Path) -> None:
    """``load_state_dict`` that allows a missing key only when its tensor is tied to a loaded one."""
    sd = _strip_owner_prefix(sd, set(model.state_dict()))
    try:
        result = model.load_state_dict(sd, strict=False)
    except RuntimeError as exc:  # shape mismatch
        raise InputError(f"{p} does not fit the model: {exc}. Check the model config") from None
    if result.unexpected_keys:
        raise InputError(f"{p} has weights the model lacks: {result.unexpected_keys[:8]}. Check the model config")
    missing = set(result.missing_keys)
    if missing:
        groups: dict[int, list[str]] = {}
        for name, t in model.state_dict(keep_vars=True).items():
            groups.setdefault(id(t), []).append(name)
        untied = sorted(k for names in groups.values() if all(n in missing for n in names) for k in names)
        if untied:
            raise InputError(f"{p} lacks weights the model needs: {untied[:8]}. Check the model config")


def _strip_owner_prefix(sd: Mapping[str, torch.Tensor], model_keys: set[str]) -> Mapping[str, torch.Tensor]:
    """``sd`` without a dotted prefix that every key shares (``net.``, ``model.``: a Lightning module
    saves its network under the attribute that holds it), when that prefix is all that keeps the
    keys from being the model's; otherwise ``sd`` as it is."""
    if not sd or set(sd) <= model_keys:
        return sd
    keys = list(sd)
    parts = keys[0].split(".")
    for n in range(1, len(parts)):
        prefix = ".".join(parts[:n]) + "."
        if not all(k.startswith(prefix) for k in keys):
            break
        stripped = {k[len(prefix) :]: v for k, v in sd.items()}
        if set(stripped) <= model_keys:
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
    config = read_json(folder / "config.json", "Hugging Face config")
    if not isinstance(config, Mapping):
        raise InputError(f"{folder / 'config.json'}: expected an object of config fields, got {json_type(config)}")
    try:
        check_causal_model_type(config.get("model_type"))
    except InputError as exc:
        raise InputError(f"{folder / 'config.json'}: {exc}") from None
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
    kwargs: dict[str, Any] = {"local_files_only": True, "use_safetensors": has_st, "trust_remote_code": False}
    if "weights_only" in _from_pretrained_params(transformers):  # an explicit parameter since transformers 5
        kwargs["weights_only"] = True
    try:
        with HF_LOCK:
            return transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except pickle.UnpicklingError:
        raise UnsafeFileError(
            f"{folder}: the weights cannot be loaded without unpickling arbitrary Python objects; tokdyn refuses "
            "to run code from a checkpoint. If you trust it, convert it to safetensors"
        ) from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged folder fails in transformers or safetensors with any exception type
        raise InputError(f"cannot load Hugging Face folder {folder}: {_error_detail(exc)}") from None


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
