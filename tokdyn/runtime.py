"""What any stage needs about torch models, owned by none of them.

- :func:`resolve_device`: a device name checked once, with a clear error.
- :func:`count_parameters`: total and non-embedding parameter counts (the M axis).
- A registry of model builders, keyed by a model spec's ``"type"``: the offline recorder rebuilds
  a checkpoint's model from ``{"type": KIND, "config": {...}}`` through it, so it never imports a
  model class. A model registers its builder where it is defined: ``"tinygpt"`` in
  :mod:`tokdyn.model`, ``"hf"`` (any transformers causal LM) in :mod:`tokdyn.record.offline.models`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .errors import InputError

__all__ = ["resolve_device", "count_parameters", "ModelBuilder", "register_model_builder", "model_builder", "model_kinds"]

ModelBuilder = Callable[[dict[str, Any]], nn.Module]
"""``builder(config) -> nn.Module``: a freshly initialised model; a bad config raises InputError."""

_BUILDERS: dict[str, ModelBuilder] = {}
# Kinds that ship with tokdyn, and the module that registers each when imported: a spec of such a
# kind works in a process that never imported that module (e.g. `tokdyn record-offline`).
_PROVIDERS: Mapping[str, str] = {"tinygpt": "tokdyn.model"}


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` that can hold data on this machine; an
    :class:`InputError` for a bad name, absent CUDA, a device index beyond those present, or the
    ``meta`` device (it holds shapes only)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"not a torch device: {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {device}: CUDA is not available on this machine")
    if dev.type == "meta":
        raise InputError(f"device {device!s}: the meta device holds no data, only shapes; use cpu or cuda")
    try:
        torch.zeros(1, device=dev)
    except Exception as exc:  # noqa: BLE001 - torch reports a missing backend with any exception type
        detail = " ".join(str(exc).split())
        raise InputError(f"device {device!s} cannot be used on this machine: {detail[:150]}") from None
    return dev


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total and non-embedding parameter counts (tied weights counted once).

    Non-embedding excludes token and position embeddings (and a head tied to the token
    embedding), following Kaplan et al.'s convention for the M axis.
    """
    seen, total, emb = set(), 0, 0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            total += p.numel()
            if isinstance(module, nn.Embedding):
                emb += p.numel()
    return {"n_params": total, "n_params_non_embedding": total - emb}


def register_model_builder(kind: str, builder: ModelBuilder) -> ModelBuilder:
    """Build models of spec type ``kind`` with ``builder(config)``; returns ``builder``.

    Registering a kind again replaces its builder (a module reloaded, or a user's own model).
    """
    if not isinstance(kind, str) or not kind:
        raise InputError(f"a model kind is a non-empty string, got {kind!r}")
    if not callable(builder):
        raise InputError(f"the builder for model kind {kind!r} is not callable: {builder!r}")
    _BUILDERS[kind] = builder
    return builder


def model_builder(kind: str) -> ModelBuilder:
    """The builder registered for ``kind``, importing the module that provides a built-in kind."""
    if not isinstance(kind, str):
        raise InputError(f"model type must be one of {list(model_kinds())}, got {kind!r}")
    if kind not in _BUILDERS and kind in _PROVIDERS:
        # No lock of ours around the import: Python's import lock already makes a second thread
        # wait for the module, and a lock held across an import could deadlock with it.
        importlib.import_module(_PROVIDERS[kind])
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise InputError(f"model type must be one of {list(model_kinds())}, got {kind!r}")
    return builder


def model_kinds() -> tuple[str, ...]:
    """The model kinds a spec may name: those registered and those tokdyn provides."""
    return tuple(sorted(set(_BUILDERS) | set(_PROVIDERS)))
