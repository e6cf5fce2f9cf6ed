"""Finding checkpoints: the checkpoints in a folder, by file name or from a ``manifest.json``.

A checkpoint is a :class:`CheckpointRef`: its step (or, in a D or M sweep, its ordinal and
``axis_value``), its path and kind, and what the manifest says beside it. Only names and the
manifest are read here; nothing is loaded.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...store import AXES
from .files import check_regular, check_regular_tree, read_json

__all__ = ["CheckpointRef", "discover_checkpoints", "order_refs", "manifest_axis", "MANIFEST", "KINDS", "MODEL_DTYPE_NAMES"]

MANIFEST = "manifest.json"
MODEL_DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the dtypes models may run in (loading maps them to torch's)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
SAFETENSORS_SUFFIXES = (".safetensors",)
KINDS = ("torch", "safetensors", "hf")
_ENTRY_KEYS = {"path", "step", "tokens_seen", "axis_value", "lr", "kind", "model"}
_INT = re.compile(r"\d+")
_STEP_INT = re.compile(r"step[_\-=]?(\d+)", re.IGNORECASE)


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


def discover_checkpoints(path: str | os.PathLike, *, axis: str | None = None) -> list[CheckpointRef]:
    """The checkpoints in folder ``path``, sorted by step (T) or by ``axis_value`` (D, M).

    A ``manifest.json`` in the folder (or ``path`` naming a manifest file) wins. Otherwise every
    ``.pt``/``.pth``/``.bin``/``.ckpt``/``.safetensors`` file and every sub-folder holding a
    ``config.json`` is a checkpoint whose step is the integer after ``step`` in its name, else its
    last integer (``step_000100.pt``, ``step100_bf16.pt``, ``ckpt-100.safetensors``,
    ``checkpoint-100/`` -> 100). A name without an
    integer, or two checkpoints with one step, is an :class:`~tokdyn.errors.InputError` naming
    the files: a guessed step would silently misplace a row.

    ``axis``: ``"T"``, ``"D"`` or ``"M"``; default the manifest's ``"axis"``, else ``"T"``. A D or
    M sweep needs a manifest giving each entry's ``axis_value``; its rows get steps 0, 1, 2, ...
    in ``axis_value`` order.
    """
    root = Path(path)
    if root.name.endswith(".json") and root.exists() and not root.is_dir():
        return _read_manifest(root, axis)
    if not root.exists():
        raise InputError(f"checkpoint folder {root} does not exist")
    if root.is_file():
        kind = _kind_of(root)
        if kind is None:
            raise InputError(f"{root} is not a checkpoint (expected {', '.join(TORCH_SUFFIXES + SAFETENSORS_SUFFIXES)})")
        return order_refs([CheckpointRef(_step_from_name(root), root, kind)], axis or "T", str(root))
    if (root / MANIFEST).exists():  # whatever it is: read_json refuses anything but a regular file
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
            found.append(CheckpointRef(_name_step(step, p), p, kind))
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
    return order_refs(found, "T", str(root))


def _kind_of(p: Path) -> str | None:
    """The kind of checkpoint at ``p`` (None: not one). A checkpoint that is not made of regular
    files (a FIFO, a device, a link to one) is an :class:`InputError`: reading it could block
    or never end."""
    if p.is_dir():
        if not (p / "config.json").exists():
            return None
        check_regular_tree(p)
        return "hf"
    if p.suffix in SAFETENSORS_SUFFIXES + TORCH_SUFFIXES:
        check_regular(p)
        return "safetensors" if p.suffix in SAFETENSORS_SUFFIXES else "torch"
    return None


def _last_int(p: Path) -> int | None:
    """The step a name gives: the integer after the last ``step`` in it (``step100``, ``step_100``,
    ``global_step-100``, ``step=100``: whatever follows, such as ``_bf16`` or Lightning's ``-v1``),
    else its last integer (``checkpoint-100``, ``model_100``); None when it holds none."""
    name = p.name if p.is_dir() else p.name[: -len(p.suffix)] if p.suffix else p.name
    after_step = _STEP_INT.findall(name)
    if after_step:
        return int(after_step[-1])
    ints = _INT.findall(name)
    return int(ints[-1]) if ints else None


def _step_from_name(p: Path) -> int:
    step = _last_int(p)
    if step is None:
        raise InputError(f"cannot tell the step of {p}: no integer in its name; give the step in a {MANIFEST}")
    return _name_step(step, p)


def _name_step(step: int, p: Path) -> int:
    """The step read from ``p``'s name, checked to fit the store's int64 steps."""
    if step > MAX_STEP:
        raise InputError(f"{p}: step {step} in its name is beyond 2**63 - 1; rename it, or give its step in a {MANIFEST}")
    return step


def _read_manifest(path: Path, axis: str | None) -> list[CheckpointRef]:
    doc = read_json(path, "manifest")
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
                    axis_value=None if e.get("axis_value") is None else _float(e["axis_value"], "axis_value"),
                    lr=None if e.get("lr") is None else _float(e["lr"], "lr"),
                    model=e.get("model", default_model),
                )  # fmt: skip
            )
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: {exc}") from None
    return order_refs(refs, axis, str(path))


MAX_STEP = int(np.iinfo(np.int64).max)  # steps and token counts are stored as int64


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= MAX_STEP:
        raise InputError(f"{what} must be an integer in [0, 2**63 - 1], got {v!r}")
    return int(v)


def _float(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(float(v)):
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
