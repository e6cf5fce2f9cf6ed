"""Offline recording: evaluate the probe on every saved checkpoint in a folder.

A folder of checkpoints becomes one run of a store, one row per checkpoint, in step order
(``docs/recording.md``, its last section). Three kinds of checkpoint are read:

- ``torch``: a state dict saved with ``torch.save`` (``.pt``, ``.pth``, ``.bin``, ``.ckpt``), read
  with ``torch.load(weights_only=True)`` only. A file that needs pickle for anything beyond
  tensors and plain containers is refused with :class:`~tokdyn.errors.UnsafeFileError`; it is
  never executed.
- ``safetensors``: a ``.safetensors`` state dict.
- ``hf``: a Hugging Face model folder (``config.json`` plus weights), e.g. a Trainer
  ``checkpoint-100/``, loaded with ``AutoModelForCausalLM.from_pretrained`` from local files.

Bare state dicts need a model to load into: ``model_factory=``, a ``"model"`` spec in the
manifest, or a ``tokdyn_model.json`` / ``config.json`` beside the files; a spec's type names a
builder registered in :mod:`tokdyn.runtime` (the tiny GPT registers ``"tinygpt"``).

Checkpoints are evaluated in parallel with dask (threads; torch releases the GIL in its
kernels), ``workers`` at a time so that at most ``workers`` models are in memory, and rows are
appended in step order, so a crash leaves a prefix of the run that ``resume=True`` continues.

One module per job: :mod:`.discovery` (names, manifest), :mod:`.loading` (safe reading, models,
fingerprints), :mod:`.models` (model specs, transformers) and :mod:`.recording` (the loop);
the ``tokdyn record-offline`` command in :mod:`tokdyn.cli.record`.
"""

from ..._lazy import lazy_names

_LAZY = {  # public name: the module that defines it (loaded on first use: torch is imported only then)
    **dict.fromkeys(["CheckpointRef", "discover_checkpoints"], "discovery"),
    **dict.fromkeys(["load_checkpoint", "read_state_dict", "weights_fingerprint"], "loading"),
    **dict.fromkeys(["build_model"], "models"),
    **dict.fromkeys(["DuplicateWeightsWarning", "record_offline"], "recording"),
}  # fmt: skip

__all__ = [
    "CheckpointRef",
    "DuplicateWeightsWarning",
    "discover_checkpoints",
    "read_state_dict",
    "build_model",
    "load_checkpoint",
    "weights_fingerprint",
    "record_offline",
]

__getattr__ = lazy_names(__name__, _LAZY)
