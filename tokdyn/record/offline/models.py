"""Models for checkpoints: model specs, and transformers, imported and used safely from threads.

A bare state dict is loaded into a model rebuilt from a spec, ``{"type": KIND, "config": {...}}``,
given in the manifest or found in a ``tokdyn_model.json`` / ``config.json`` beside the files. The
spec's type picks a builder from the registry in :mod:`tokdyn.runtime`: ``"tinygpt"`` is
registered by :mod:`tokdyn.model`, ``"hf"`` (any transformers causal LM) here, and a user's own
model with :func:`tokdyn.runtime.register_model_builder`. So the recorder imports no model class.

transformers builds models under process-global patches (meta-device init, tied weights), so two threads in ``from_pretrained``/``from_config`` corrupt
each other: HF construction is serialised (:data:`HF_LOCK`); the probe forwards stay parallel.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError
from ...runtime import model_builder, model_kinds, register_model_builder

__all__ = ["build_model", "model_spec_beside", "import_transformers", "HF_LOCK", "MODEL_SPEC_FILES"]

MODEL_SPEC_FILES = ("tokdyn_model.json", "config.json")  # beside bare state dicts, first found wins
HF_LOCK = threading.Lock()  # held while transformers builds or loads a model


def build_model(spec: Mapping[str, Any], *, where: str = "model spec") -> torch.nn.Module:
    """A freshly initialised model from a spec ``{"type": KIND, "config": {...}}``.

    ``KIND`` (default ``"tinygpt"``) is a kind registered in :mod:`tokdyn.runtime`:
    ``"tinygpt"`` takes ``GPTConfig`` fields, ``"hf"`` an HF config with ``"model_type"``.
    Errors are :class:`~tokdyn.errors.InputError` starting with ``where``.
    """
    if not isinstance(spec, Mapping) or not isinstance(spec.get("config", {}), Mapping):
        raise InputError(f'{where}: expected {{"type": KIND, "config": {{...}}}} with KIND one of {list(model_kinds())}, got {spec!r}')
    try:
        model = model_builder(spec.get("type", "tinygpt"))(dict(spec.get("config", {})))
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"{where}: the builder returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def model_spec_beside(folder: Path) -> tuple[Mapping, Path] | None:
    """The model spec in a ``tokdyn_model.json`` or ``config.json`` in ``folder``, and its file.

    A ``config.json`` is a bare config: an HF one when it has ``"model_type"``, else GPTConfig fields.
    """
    for name in MODEL_SPEC_FILES:
        f = folder / name
        if f.is_file():
            try:
                spec = json.loads(f.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise InputError(f"cannot read model spec {f}: {exc}") from None
            if name == "config.json":
                spec = {"type": "hf" if "model_type" in spec else "tinygpt", "config": spec}
            return spec, f
    return None


def import_transformers():
    """The ``transformers`` module, or an InputError saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise InputError("loading Hugging Face checkpoints needs transformers: pip install 'tokdyn[hf]'") from None
    return transformers


def _build_hf(config: dict[str, Any]) -> torch.nn.Module:
    """The ``"hf"`` model kind: ``AutoModelForCausalLM.from_config`` on a config with ``"model_type"``."""
    transformers = import_transformers()
    model_type = config.pop("model_type", None)
    if model_type is None:
        raise InputError('an "hf" model config needs "model_type"')
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **config)
        with HF_LOCK:
            return transformers.AutoModelForCausalLM.from_config(hf_config)
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot build a causal LM from this config: {exc}") from None


register_model_builder("hf", _build_hf)
