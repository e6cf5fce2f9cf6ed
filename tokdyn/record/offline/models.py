"""Models for checkpoints: model specs, and transformers, imported and used safely from threads.

A bare state dict is loaded into a model rebuilt from a spec, ``{"type": KIND, "config": {...}}``,
given in the manifest or found in a ``tokdyn_model.json`` / ``config.json`` beside the files. The
spec's type picks a builder from the registry in :mod:`tokdyn.runtime`: ``"tinygpt"`` is
registered by :mod:`tokdyn.model`, ``"hf"`` (any transformers causal LM) here, and a user's own
model with :func:`tokdyn.runtime.register_model_builder`. So the recorder imports no model class.

transformers is imported once, under a lock, and builds models under process-global patches
(meta-device init, tied weights), so two threads in ``from_pretrained``/``from_config`` corrupt
each other: HF construction is serialised (:data:`HF_LOCK`); the probe forwards stay parallel.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..._text import one_line
from ...errors import InputError
from ...runtime import model_builder, model_kinds, register_model_builder
from .files import read_json

__all__ = ["build_model", "model_spec_beside", "import_transformers", "hf_progress_bars", "check_causal_model_type",
           "short_error", "json_type", "HF_LOCK", "MODEL_SPEC_FILES"]

MODEL_SPEC_FILES = ("tokdyn_model.json", "config.json")  # beside bare state dicts, first found wins
HF_LOCK = threading.Lock()  # held while transformers builds or loads a model
_IMPORT_LOCK = threading.Lock()


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
        if f.exists():
            spec = read_json(f, "model spec")
            if name == "config.json":
                if not isinstance(spec, Mapping):
                    raise InputError(f"{f}: a config.json beside state dicts holds an object of model config fields, got {json_type(spec)}")
                spec = {"type": "hf" if "model_type" in spec else "tinygpt", "config": spec}
            return spec, f
    return None


def json_type(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (for messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "a number", float: "a number", str: "a string", list: "an array"}.get(type(value), type(value).__name__)


def import_transformers():
    """The ``transformers`` module, imported under a lock with the names tokdyn uses resolved.

    Its first import is not thread-safe: it swaps a lazy module into ``sys.modules`` midway, so a
    second thread can get a module without ``PreTrainedModel``. Import it before starting threads.
    """
    with _IMPORT_LOCK:
        try:
            import transformers
        except ImportError:
            raise InputError("loading Hugging Face checkpoints needs transformers: pip install 'tokdyn[hf]'") from None
        transformers.PreTrainedModel, transformers.AutoConfig, transformers.AutoModelForCausalLM  # noqa: B018 - load them now
    return transformers


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """transformers' own progress bars (one per ``from_pretrained``) off unless ``enabled``.

    The switch is process-wide in transformers: it is restored on exit. A no-op when transformers
    has not been imported.
    """
    hf = sys.modules.get("transformers")
    if enabled or hf is None:
        yield
        return
    hf_logging = hf.utils.logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _build_hf(config: dict[str, Any]) -> torch.nn.Module:
    """The ``"hf"`` model kind: ``AutoModelForCausalLM.from_config`` on a config with ``"model_type"``."""
    transformers = import_transformers()
    model_type = config.pop("model_type", None)
    if model_type is None:
        raise InputError('an "hf" model config needs "model_type"')
    check_causal_model_type(model_type)
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **config)
        with HF_LOCK:
            return transformers.AutoModelForCausalLM.from_config(hf_config)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers checks a config's values with any exception type
        raise InputError(f"cannot build a causal LM from this config: {short_error(exc)}") from None


_EXAMPLE_MODEL_TYPES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")


def check_causal_model_type(model_type: Any) -> None:
    """An :class:`InputError` unless ``model_type`` names a transformers architecture with a causal
    LM (transformers' own errors list every model type it knows: thousands of characters)."""
    import_transformers()
    from transformers.models.auto import configuration_auto, modeling_auto

    causal = getattr(modeling_auto, "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", None)
    if model_type is None:
        raise InputError('no "model_type" in the Hugging Face config')
    if not isinstance(model_type, str) or model_type not in configuration_auto.CONFIG_MAPPING_NAMES:
        raise InputError(
            f"unknown Hugging Face model_type {model_type!r} (this transformers knows e.g. {', '.join(_EXAMPLE_MODEL_TYPES)}; "
            "a newer transformers may know more)"
        )
    if causal is not None and model_type not in causal:
        raise InputError(f"Hugging Face model_type {model_type!r} has no causal language model (AutoModelForCausalLM cannot build it)")


def short_error(exc: BaseException | str, limit: int = 300) -> str:
    """``exc``'s message on one line, at most about ``limit`` characters."""
    text = one_line(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


register_model_builder("hf", _build_hf)
