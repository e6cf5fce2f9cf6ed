"""Offline recording: evaluate the probe on every saved checkpoint in a folder.

A folder of checkpoints becomes one run of a store, one row per checkpoint, in step order
(``docs/recording_offline.md``). Three kinds of checkpoint are read:

- ``torch``: a state dict saved with ``torch.save`` (``.pt``, ``.pth``, ``.bin``, ``.ckpt``), read
  with ``torch.load(weights_only=True)`` only. A file that needs pickle for anything beyond
  tensors and plain containers is refused with :class:`~tokdyn.errors.UnsafeFileError`; it is
  never executed.
- ``safetensors``: a ``.safetensors`` state dict.
- ``hf``: a Hugging Face model folder (``config.json`` plus weights), e.g. a Trainer
  ``checkpoint-100/``, loaded with ``AutoModelForCausalLM.from_pretrained`` from local files.

Bare state dicts need a model to load into: ``model_factory=``, a ``"model"`` spec in the
manifest, or a ``tokdyn_model.json`` / ``config.json`` beside the files.

Checkpoints are evaluated in parallel with dask (threads; torch releases the GIL in its
kernels), ``workers`` at a time so that at most ``workers`` models are in memory, and rows are
appended in step order, so a crash leaves a prefix of the run that ``resume=True`` continues.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import pickle
import re
import threading
import time
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError, NotAStoreError, RunExistsError, StoreError, UnsafeFileError
from ..probe import ProbeSet
from ..store import AXES, LOSS_DTYPES, TrajectoryStore, open_store
from .recorder import model_attrs, token_losses

__all__ = [
    "CheckpointRef",
    "DuplicateWeightsWarning",
    "discover_checkpoints",
    "read_state_dict",
    "build_model",
    "load_checkpoint",
    "weights_fingerprint",
    "record_offline",
    "add_cli_arguments",
    "run_cli",
]

MANIFEST = "manifest.json"
MODEL_SPEC_FILES = ("tokdyn_model.json", "config.json")  # beside bare state dicts, first found wins
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
SAFETENSORS_SUFFIXES = (".safetensors",)
KINDS = ("torch", "safetensors", "hf")
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module")  # {"model": state_dict}, ...
STRIP_PREFIXES = ("module.", "_orig_mod.")  # DDP, torch.compile
MODEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ENTRY_KEYS = {"path", "step", "tokens_seen", "axis_value", "lr", "kind", "model"}
_INT = re.compile(r"\d+")
# transformers builds models under process-global patches (meta-device init, tied weights), so
# two threads in from_pretrained/from_config corrupt each other: HF construction is serialised,
# the probe forwards still run in parallel.
_HF_LOCK = threading.Lock()

ModelFactory = Callable[[], torch.nn.Module]


class DuplicateWeightsWarning(UserWarning):
    """Two checkpoints at different steps hold identical weights (both are still recorded)."""


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
    """

    step: int
    path: Path
    kind: str
    tokens_seen: int | None = None
    axis_value: float | None = None
    lr: float | None = None
    model: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"checkpoint kind must be one of {KINDS}, got {self.kind!r} for {self.path}")
        object.__setattr__(self, "path", Path(self.path))


# -- discovery ----------------------------------------------------------------------------


def discover_checkpoints(path: str | os.PathLike, *, axis: str | None = None) -> list[CheckpointRef]:
    """The checkpoints in folder ``path``, sorted by step (T) or by ``axis_value`` (D, M).

    A ``manifest.json`` in the folder (or ``path`` naming a manifest file) wins. Otherwise every
    ``.pt``/``.pth``/``.bin``/``.ckpt``/``.safetensors`` file and every sub-folder holding a
    ``config.json`` is a checkpoint whose step is the last integer in its name
    (``step_000100.pt``, ``ckpt-100.safetensors``, ``checkpoint-100/`` -> 100). A name without an
    integer, or two checkpoints with one step, is an :class:`~tokdyn.errors.InputError` naming
    the files: a guessed step would silently misplace a row.

    ``axis``: ``"T"``, ``"D"`` or ``"M"``; default the manifest's ``"axis"``, else ``"T"``. A D or
    M sweep needs a manifest giving each entry's ``axis_value``; its rows get steps 0, 1, 2, ...
    in ``axis_value`` order.
    """
    root = Path(path)
    if root.is_file() and root.name.endswith(".json"):
        return _read_manifest(root, axis)
    if not root.exists():
        raise InputError(f"checkpoint folder {root} does not exist")
    if root.is_file():
        kind = _kind_of(root)
        if kind is None:
            raise InputError(f"{root} is not a checkpoint (expected {', '.join(TORCH_SUFFIXES + SAFETENSORS_SUFFIXES)})")
        return _order([CheckpointRef(_step_from_name(root), root, kind)], axis or "T", str(root))
    if (root / MANIFEST).is_file():
        return _read_manifest(root / MANIFEST, axis)
    axis = axis or "T"
    if axis != "T":
        raise InputError(f"an axis-{axis} sweep needs {root / MANIFEST} giving each checkpoint's axis_value")
    found, unnamed, skipped_dirs = [], [], []
    for p in sorted(root.iterdir()):
        if p.name.startswith("."):
            continue
        kind = _kind_of(p)
        if kind is None:
            if p.is_dir() and any(_kind_of(q) in ("torch", "safetensors") for q in p.iterdir()):
                skipped_dirs.append(p.name)
            continue
        step = _last_int(p)
        if step is None:
            unnamed.append(p.name)
        else:
            found.append(CheckpointRef(step, p, kind))
    if skipped_dirs:
        warnings.warn(
            f"{root}: sub-folders {skipped_dirs} hold weight files but no config.json and were skipped; "
            f"list their files in a {MANIFEST} to record them",
            stacklevel=2,
        )
    if unnamed:
        hint = ""
        if (root / "config.json").is_file() and any(n.startswith(("model", "pytorch_model")) for n in unnamed):
            hint = " (it looks like a single Hugging Face model folder: point at the folder that holds it)"
        raise InputError(
            f"{root}: cannot tell the step of {unnamed}: no integer in the name{hint}. "
            f"Rename them (e.g. step_000100.pt), move them out, or list every checkpoint in {MANIFEST}"
        )
    if not found:
        raise InputError(f"no checkpoints in {root} (expected {', '.join(TORCH_SUFFIXES + SAFETENSORS_SUFFIXES)} files, HF folders or {MANIFEST})")
    return _order(found, "T", str(root))


def _kind_of(p: Path) -> str | None:
    if p.is_dir():
        return "hf" if (p / "config.json").is_file() else None
    if p.suffix in SAFETENSORS_SUFFIXES:
        return "safetensors"
    if p.suffix in TORCH_SUFFIXES:
        return "torch"
    return None


def _last_int(p: Path) -> int | None:
    name = p.name if p.is_dir() else p.name[: -len(p.suffix)] if p.suffix else p.name
    ints = _INT.findall(name)
    return int(ints[-1]) if ints else None


def _step_from_name(p: Path) -> int:
    step = _last_int(p)
    if step is None:
        raise InputError(f"cannot tell the step of {p}: no integer in its name; give the step in a {MANIFEST}")
    return step


def _read_manifest(path: Path, axis: str | None) -> list[CheckpointRef]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read manifest {path}: {exc}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("checkpoints"), list) or not doc["checkpoints"]:
        raise InputError(f'{path}: a manifest is {{"checkpoints": [{{"path": ..., "step": ...}}, ...]}} with at least one entry')
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
        p = Path(e["path"])
        p = p if p.is_absolute() else path.parent / p
        if not p.exists():
            raise InputError(f"{where}: {p} does not exist")
        kind = e.get("kind") or _kind_of(p)
        if kind is None:
            raise InputError(f'{where}: cannot tell the kind of {p}; add "kind": one of {KINDS}')
        if axis == "T":
            step = e["step"] if "step" in e else _step_from_name(p)
        else:
            if "axis_value" not in e:
                raise InputError(f'{where}: an axis-{axis} manifest needs "axis_value" in every entry')
            step = 0  # ordinal, assigned by _order
        try:
            refs.append(
                CheckpointRef(
                    step=_int(step, "step"), path=p, kind=kind,
                    tokens_seen=None if e.get("tokens_seen") is None else _int(e["tokens_seen"], "tokens_seen"),
                    axis_value=None if e.get("axis_value") is None else float(e["axis_value"]),
                    lr=None if e.get("lr") is None else float(e["lr"]),
                    model=e.get("model", default_model),
                )  # fmt: skip
            )
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: {exc}") from None
    return _order(refs, axis, str(path))


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise InputError(f"{what} must be a non-negative integer, got {v!r}")
    return int(v)


def _order(refs: Sequence[CheckpointRef], axis: str, where: str) -> list[CheckpointRef]:
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
    if axis != "T":
        refs = [dataclasses.replace(r, step=k) for k, r in enumerate(refs)]
    return refs


# -- loading ------------------------------------------------------------------------------


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
    if p.suffix in SAFETENSORS_SUFFIXES:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            obj: Any = load_file(p, device="cpu")
        except (SafetensorError, OSError) as exc:
            raise InputError(f"cannot read {p} as safetensors: {exc}") from None
    else:
        obj = _torch_load_safely(p)
    return _strip_prefixes(_unwrap(obj, p))


def _torch_load_safely(p: Path) -> Any:
    try:
        # mmap: tensor data stays on disk until copied into the model (zip-format files only).
        return torch.load(p, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(p))
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower() and "weights_only" not in str(exc).lower():
            raise InputError(f"cannot read {p} as a torch checkpoint: {_first_line(exc)}") from None
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f" (it references {found.group(1)})" if found else ""
        raise UnsafeFileError(
            f"{p} cannot be loaded without unpickling arbitrary Python objects{what}; tokdyn loads torch "
            "files only with torch.load(weights_only=True) and refuses to run code from a checkpoint. "
            "If you trust it, convert it to safetensors (load it yourself, then "
            "safetensors.torch.save_file(state_dict, ...)) or save only model.state_dict()"
        ) from None
    except (RuntimeError, OSError, EOFError, KeyError, ValueError) as exc:
        raise InputError(f"cannot read {p} as a torch checkpoint: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


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


def _model_spec_beside(folder: Path) -> tuple[Mapping, Path] | None:
    for name in MODEL_SPEC_FILES:
        f = folder / name
        if f.is_file():
            try:
                spec = json.loads(f.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise InputError(f"cannot read model spec {f}: {exc}") from None
            if name == "config.json":  # a plain config: HF (has model_type) or GPTConfig fields
                spec = {"type": "hf" if "model_type" in spec else "tinygpt", "config": spec}
            return spec, f
    return None


def build_model(spec: Mapping[str, Any], *, where: str = "model spec") -> torch.nn.Module:
    """A freshly initialised model from a spec: ``{"type": "tinygpt", "config": {GPTConfig
    fields}}`` or ``{"type": "hf", "config": {HF config with "model_type"}}``."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("config", {}), Mapping):
        raise InputError(f'{where}: expected {{"type": "tinygpt"|"hf", "config": {{...}}}}, got {spec!r}')
    kind, cfg = spec.get("type", "tinygpt"), dict(spec.get("config", {}))
    if kind == "tinygpt":
        from ..model import GPTConfig, TinyGPT

        names = {f.name for f in dataclasses.fields(GPTConfig)}
        if unknown := set(cfg) - names:
            raise InputError(f"{where}: unknown GPTConfig fields {sorted(unknown)}; expected some of {sorted(names)}")
        return TinyGPT(GPTConfig(**cfg))
    if kind == "hf":
        transformers = _import_transformers()
        model_type = cfg.pop("model_type", None)
        if model_type is None:
            raise InputError(f'{where}: an "hf" model config needs "model_type"')
        try:
            config = transformers.AutoConfig.for_model(model_type, **cfg)
            with _HF_LOCK:
                return transformers.AutoModelForCausalLM.from_config(config)
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{where}: cannot build a causal LM from this config: {exc}") from None
    raise InputError(f'{where}: model type must be "tinygpt" or "hf", got {kind!r}')


def _load_into(model: torch.nn.Module, sd: Mapping[str, torch.Tensor], p: Path) -> None:
    """``load_state_dict`` that allows a missing key only when its tensor is tied to a loaded one."""
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
        model = _load_hf(ref.path)
    else:
        sd = read_state_dict(ref.path)
        if model_factory is not None:
            model = model_factory()
        elif ref.model is not None:
            model = build_model(ref.model, where=f"model spec for {ref.path}")
        elif (found := _model_spec_beside(ref.path.parent)) is not None:
            model = build_model(found[0], where=str(found[1]))
        else:
            raise InputError(
                f"{ref.path} is a bare state dict and no model is known for it: pass model_factory=, add "
                f'"model": {{"type": "tinygpt", "config": {{...}}}} to {MANIFEST}, or put tokdyn_model.json beside it'
            )
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"the model factory returned a {type(model).__name__}, not a torch.nn.Module")
        _load_into(model, sd, ref.path)
        del sd
    if model_dtype is not None:
        model = model.to(MODEL_DTYPES[model_dtype])
    return model.to(device).eval()


def _import_transformers():
    try:
        import transformers
    except ImportError:
        raise InputError("loading Hugging Face checkpoints needs transformers: pip install 'tokdyn[hf]'") from None
    return transformers


def _load_hf(folder: Path) -> torch.nn.Module:
    transformers = _import_transformers()
    has_st = any((folder / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json"))
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not has_st:
        if not bins:
            raise InputError(f"Hugging Face folder {folder} has no model.safetensors or pytorch_model.bin")
        for b in bins:  # refuse pickled code ourselves, whatever the transformers version does
            _torch_load_safely(b)
    kwargs: dict[str, Any] = {"local_files_only": True, "use_safetensors": has_st, "trust_remote_code": False}
    if "weights_only" in _from_pretrained_params(transformers):  # an explicit parameter since transformers 5
        kwargs["weights_only"] = True
    try:
        with _HF_LOCK:
            return transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except pickle.UnpicklingError:
        raise UnsafeFileError(
            f"{folder}: the weights cannot be loaded without unpickling arbitrary Python objects; tokdyn refuses "
            "to run code from a checkpoint. If you trust it, convert it to safetensors"
        ) from None
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise InputError(f"cannot load Hugging Face folder {folder}: {_first_line(exc)}") from None


@functools.cache
def _from_pretrained_params(transformers) -> frozenset:
    import inspect

    return frozenset(inspect.signature(transformers.PreTrainedModel.from_pretrained).parameters)


# -- fingerprints -------------------------------------------------------------------------


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


# -- recording ----------------------------------------------------------------------------


@dataclass
class _Evaluated:
    losses: np.ndarray  # [N] float32, nats
    fingerprint: int
    model_attrs: dict
    mtime: float


def _evaluate(
    ref: CheckpointRef,
    tokens: torch.Tensor,
    *,
    model_factory: ModelFactory | None,
    device: torch.device,
    model_dtype: str | None,
    batch_size: int,
    threads: int,
    restore_threads: int,
) -> _Evaluated | BaseException:
    """Load, fingerprint and evaluate one checkpoint. Runs in a dask worker thread; a failure
    is returned (not raised) so that the rows before it can still be committed in order."""
    torch.set_num_threads(threads)  # per calling thread with OpenMP: keep workers x threads <= cores
    try:
        model = load_checkpoint(ref, model_factory=model_factory, device=device, model_dtype=model_dtype)
        fp = weights_fingerprint(model)
        losses = token_losses(model, tokens, batch_size=batch_size).cpu().numpy()
        return _Evaluated(losses, fp, model_attrs(model), ref.path.stat().st_mtime)
    except Exception as exc:  # noqa: BLE001 - re-raised in order by record_offline
        if hasattr(exc, "add_note"):
            exc.add_note(f"while recording checkpoint {ref.path} (step {ref.step})")
        return exc
    finally:
        torch.set_num_threads(restore_threads)


def record_offline(
    checkpoints: str | os.PathLike | Sequence[CheckpointRef],
    store: TrajectoryStore | str | os.PathLike,
    run: str,
    *,
    probe: ProbeSet | TrajectoryStore | str | os.PathLike | None = None,
    model_factory: ModelFactory | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 32,
    workers: int | None = None,
    dtype: str = "float32",
    model_dtype: str | None = "float32",
    resume: bool = False,
    progress: bool = True,
    axis: str | None = None,
    run_attrs: Mapping[str, Any] | None = None,
) -> dict:
    """Evaluate the probe on saved checkpoints and append one row per checkpoint to ``run``.

    Parameters
    ----------
    checkpoints : path or list of CheckpointRef
        A folder (or manifest file), read with :func:`discover_checkpoints`, or references.
    store : TrajectoryStore or str
        The store. It must exist unless ``probe`` is given (then it is created for it).
    run : str
        Run name; an existing run is refused unless ``resume=True``.
    probe : ProbeSet, TrajectoryStore or str, optional
        The probe, or a store (object or path) whose probe to use. Default: ``store``'s probe.
    model_factory : callable, optional
        ``model_factory() -> nn.Module`` for bare state dicts (overrides manifest specs).
    device : str or torch.device
        Where the probe forwards run.
    batch_size : int
        Probe sequences per forward.
    workers : int, optional
        Checkpoints evaluated at once (dask threads); also the number of models in memory.
        Default: ``min(4, cpu cores)`` on CPU, 2 on an accelerator (one loads while one runs).
    dtype : {"float32", "float16", "float64"}
        Storage dtype of the losses.
    model_dtype : {"float32", "bfloat16", "float16"} or None
        Dtype the model is evaluated in; None keeps what the checkpoint/factory gives.
    resume : bool
        Continue an existing run: checkpoints at or before its last committed step are skipped
        (a D/M sweep must then list the committed axis values first, unchanged).
    progress : bool
        Show a tqdm bar.
    axis : {"T", "D", "M"}, optional
        Default: the manifest's ``"axis"``, else T (or the existing run's axis when resuming).
    run_attrs : dict, optional
        Extra run metadata.

    Returns
    -------
    dict
        ``store``, ``run``, ``axis``, ``recorded`` (steps written now), ``skipped`` (steps already
        committed), ``rows`` (committed rows now), ``duplicates`` (pairs of steps with identical
        weights), ``fingerprints`` ({step: uint64} of the rows written now), ``seconds``.
    """
    t0 = time.perf_counter()
    if dtype not in LOSS_DTYPES:
        raise InputError(f"dtype must be one of {LOSS_DTYPES}, got {dtype!r}")
    if model_dtype is not None and model_dtype not in MODEL_DTYPES:
        raise InputError(f"model_dtype must be one of {tuple(MODEL_DTYPES)} or None, got {model_dtype!r}")
    if int(batch_size) < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if axis is not None and axis not in AXES:
        raise InputError(f"axis must be one of {AXES}, got {axis!r}")
    device = torch.device(device)
    ts = _open_target_store(store, probe)
    exists = ts.has_run(run)  # an aborted creation (a crash) is replaced, not resumed
    if exists and not resume:
        raise RunExistsError(f"run {run!r} already exists in {ts.url}; pass resume=True (--resume) to continue it")
    existing = ts.run(run) if exists else None
    if existing is not None:
        if axis is not None and axis != existing.axis:
            raise InputError(f"run {run!r} has axis {existing.axis}, asked for {axis}")
        axis = axis or existing.axis
    source = None
    if isinstance(checkpoints, (str, os.PathLike)):
        source = os.path.abspath(checkpoints)
        refs = discover_checkpoints(checkpoints, axis=axis)
        axis = axis or _manifest_axis(checkpoints) or "T"
    else:
        axis = axis or "T"
        refs = _order([r if isinstance(r, CheckpointRef) else _bad_ref(r) for r in checkpoints], axis, "checkpoints")
    if not refs:
        raise InputError("no checkpoints to record")
    if existing is not None and existing.axis != axis:
        raise InputError(f"run {run!r} has axis {existing.axis}; the checkpoints form an axis-{axis} sweep")
    if workers is None:
        workers = min(4, os.cpu_count() or 1) if device.type == "cpu" else 2
    workers = int(workers)
    if workers < 1:
        raise InputError(f"workers must be >= 1, got {workers}")

    probe_set = ts.probe
    if not probe_set.has_tokens:
        raise InputError(f"the probe of {ts.url} is index-only (imported); it has no token ids to evaluate")
    tokens = torch.as_tensor(probe_set.tokens, dtype=torch.long).to(device)

    if existing is not None and len(existing.writers) != 1:
        raise StoreError(f"run {run!r} has {len(existing.writers)} token-range writers; offline recording writes single-writer runs")
    writer = existing.writer(resume=True) if existing is not None else None
    last = None if writer is None else writer.last_step
    todo = [r for r in refs if last is None or r.step > last]
    skipped = [r.step for r in refs if last is not None and r.step <= last]
    if skipped:
        lost = sorted(set(skipped) - set(existing.steps.tolist()))
        if lost:
            warnings.warn(
                f"run {run!r}: checkpoints at steps {lost} come before its last committed step {last} and are not "
                "recorded (rows only ever append in step order); record them into a new run",
                stacklevel=2,
            )
    seen: dict[int, tuple[int, str]] = {}  # fingerprint -> (step, "step S (path)")
    if existing is not None and existing.n_committed:
        if axis != "T":
            _check_sweep_prefix(existing, refs, run)
        for s, fp in zip(existing.steps.tolist(), existing.coord("ckpt_fingerprint").tolist()):
            if fp:
                seen.setdefault(int(fp), (int(s), f"step {s} (committed earlier)"))

    cores = os.cpu_count() or 1
    threads = max(1, cores // workers) if device.type == "cpu" else max(1, min(4, cores // workers))
    restore = torch.get_num_threads()
    evaluate = functools.partial(
        _evaluate, tokens=tokens, model_factory=model_factory, device=device, model_dtype=model_dtype,
        batch_size=int(batch_size), threads=threads, restore_threads=restore,
    )  # fmt: skip
    recorded, fingerprints, duplicates = [], {}, []
    bar = _progress_bar(len(todo), run, enabled=progress)
    try:
        for b in range(0, len(todo), workers):
            batch = todo[b : b + workers]
            for ref, res in zip(batch, _compute(evaluate, batch, workers)):
                if isinstance(res, BaseException):
                    raise res
                if writer is None:
                    writer = _create_run(ts, run, axis=axis, capacity=len(refs), dtype=dtype, res=res,
                                         source=source, run_attrs=run_attrs).writer()  # fmt: skip
                label = f"step {ref.step} ({ref.path})"
                if res.fingerprint in seen:
                    first_step, first_label = seen[res.fingerprint]
                    duplicates.append([first_step, ref.step])
                    warnings.warn(
                        f"checkpoints at {first_label} and {label} have identical weights "
                        f"(fingerprint {res.fingerprint:016x}); both are recorded. Published checkpoint "
                        "suites have shipped duplicates: check which step is right",
                        DuplicateWeightsWarning,
                        stacklevel=2,
                    )
                seen.setdefault(res.fingerprint, (ref.step, label))
                writer.append(
                    res.losses, step=ref.step, axis_value=None if axis == "T" else ref.axis_value,
                    tokens_seen=ref.tokens_seen, lr=ref.lr, wall_time=res.mtime, ckpt_fingerprint=res.fingerprint,
                )  # fmt: skip
                recorded.append(ref.step)
                fingerprints[ref.step] = res.fingerprint
                bar.update(1)
    finally:
        bar.close()
        torch.set_num_threads(restore)
        if writer is not None:
            if writer.rows:
                writer.trim()
            writer.release()
    return {
        "store": ts.url,
        "run": run,
        "axis": axis,
        "recorded": recorded,
        "skipped": skipped,
        "rows": 0 if writer is None else writer.rows,
        "duplicates": duplicates,
        "fingerprints": fingerprints,
        "seconds": time.perf_counter() - t0,
    }


def _bad_ref(r: Any) -> CheckpointRef:
    raise InputError(f"checkpoints must be a folder or a list of CheckpointRef, got a {type(r).__name__} in the list")


def _manifest_axis(path: str | os.PathLike) -> str | None:
    p = Path(path)
    m = p if p.is_file() else p / MANIFEST
    if m.is_file() and m.name.endswith(".json"):
        doc = json.loads(m.read_text())
        return doc.get("axis") if isinstance(doc, Mapping) else None
    return None


def _compute(evaluate: Callable, batch: Sequence[CheckpointRef], workers: int) -> tuple:
    """Evaluate ``batch`` with dask's threaded scheduler; results in input order."""
    import dask

    # Indices, not the refs, go into the graph: dask would rebuild dataclass arguments itself.
    tasks = [dask.delayed(lambda j: evaluate(batch[j]), pure=False)(j) for j in range(len(batch))]
    return dask.compute(*tasks, scheduler="threads", num_workers=workers)


def _progress_bar(total: int, run: str, *, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"record {run}", unit="ckpt", disable=not enabled or total == 0)


def _open_target_store(store, probe) -> TrajectoryStore:
    probe_set = _resolve_probe(probe)
    if isinstance(store, TrajectoryStore):
        if probe_set is not None:
            store.check_probe(probe_set)
        return store
    if probe_set is None:
        try:
            return open_store(store, mode="r+")
        except NotAStoreError:
            raise NotAStoreError(f"no tokdyn store at {store}; give probe= (--probe STORE: a store whose probe to use) to create one") from None
    return open_store(store, probe_set, mode="a")


def _resolve_probe(probe) -> ProbeSet | None:
    if probe is None or isinstance(probe, ProbeSet):
        return probe
    if isinstance(probe, TrajectoryStore):
        return probe.probe
    if isinstance(probe, (str, os.PathLike)):
        if os.fspath(probe).endswith(".npz"):
            raise InputError(
                f"{probe}: a losses.npz carries no token ids, so its probe cannot be evaluated; "
                "give a tokdyn store whose probe has tokens"
            )
        return open_store(probe, mode="r").probe
    raise InputError(f"probe must be a ProbeSet or a store (path), got {type(probe).__name__}")


def _create_run(ts: TrajectoryStore, run: str, *, axis: str, capacity: int, dtype: str, res: _Evaluated, source, run_attrs):
    attrs = dict(res.model_attrs)
    if axis == "M":  # every row is a different model: per-model counts would mislead here
        attrs = {"model_class": attrs.get("model_class")}
    attrs.update({"source": "offline"})
    if source is not None:
        attrs["checkpoints"] = source
    attrs.update(dict(run_attrs or {}))
    return ts.create_run(run, axis=axis, capacity=capacity, dtype=dtype, attrs=attrs)


def _check_sweep_prefix(existing, refs: Sequence[CheckpointRef], run: str) -> None:
    done = existing.axis_values
    given = np.array([r.axis_value for r in refs[: len(done)]], dtype=np.float64)
    if len(given) < len(done) or not np.array_equal(done, given):
        raise InputError(
            f"run {run!r} holds axis values {done.tolist()}; resuming needs the sweep to list them first, "
            f"unchanged, and only add larger ones (got {[r.axis_value for r in refs]})"
        )


# -- command line -------------------------------------------------------------------------


def add_cli_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``record-offline`` arguments to ``parser`` (a subcommand parser)."""
    parser.add_argument("--checkpoints", required=True, metavar="DIR", help=f"folder of checkpoints, or a {MANIFEST}")
    parser.add_argument("--out", required=True, metavar="STORE", help="store to write (created when --probe is given)")
    parser.add_argument("--run", required=True, metavar="NAME", help="run name")
    parser.add_argument("--probe", metavar="STORE", help="a tokdyn store whose probe to use (default: the --out store's own)")
    parser.add_argument("--model", metavar="JSON", help='model spec for bare state dicts: {"type": "tinygpt", "config": {...}}')
    parser.add_argument("--axis", choices=AXES, help="T (steps, default), or D/M for a sweep listed in a manifest")
    parser.add_argument("--workers", type=int, metavar="N", help="checkpoints evaluated at once (default: min(4, cores); 2 on a GPU)")
    parser.add_argument("--device", default="cpu", help="torch device for the probe forwards (default: cpu)")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="probe sequences per forward (default: 32)")
    parser.add_argument("--dtype", choices=LOSS_DTYPES, default="float32", help="storage dtype of the losses")
    parser.add_argument("--model-dtype", choices=tuple(MODEL_DTYPES), default="float32", help="dtype the models run in")
    parser.add_argument("--resume", action="store_true", help="continue an existing run after its last committed step")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def run_cli(args: argparse.Namespace) -> int:
    """Run ``record-offline`` from parsed arguments; prints a summary, returns 0.

    Errors are raised as :class:`~tokdyn.errors.TokdynError` for the CLI to report.
    """
    factory = None
    if args.model:
        try:
            spec = json.loads(Path(args.model).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"cannot read model spec {args.model}: {exc}") from None
        build_model(spec, where=args.model)  # fail now on a bad spec, not in a worker
        factory = functools.partial(build_model, spec, where=args.model)
    summary = record_offline(
        args.checkpoints, args.out, args.run, probe=args.probe, model_factory=factory, device=args.device,
        batch_size=args.batch_size, workers=args.workers, dtype=args.dtype, model_dtype=args.model_dtype,
        resume=args.resume, progress=not args.no_progress, axis=args.axis,
    )  # fmt: skip
    steps = summary["recorded"]
    span = f"steps {steps[0]}..{steps[-1]}" if steps else "nothing new"
    skipped = f", {len(summary['skipped'])} already committed" if summary["skipped"] else ""
    print(
        f"recorded {len(steps)} checkpoint(s) ({span}{skipped}) into run {summary['run']!r} (axis {summary['axis']}, "
        f"{summary['rows']} rows) of {summary['store']} in {summary['seconds']:.1f} s"
    )
    for a, b in summary["duplicates"]:
        print(f"warning: steps {a} and {b} have identical weights")
    return 0
