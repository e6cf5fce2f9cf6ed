"""Recording: evaluate a probe along training (or over saved checkpoints) into a store.

Framework adapters live in :mod:`tokdyn.record.hf` (HF ``Trainer``) and
:mod:`tokdyn.record.lightning` (Lightning); they import their framework only when used.
"""

import importlib

_LAZY = {  # public name: the module that defines it (loaded on first use: torch is imported only then)
    **dict.fromkeys(["discover_checkpoints", "record_offline", "weights_fingerprint"], "offline"),
    **dict.fromkeys(["TokenLossRecorder", "default_forward", "model_attrs", "shard_ranges", "token_losses"], "recorder"),
}  # fmt: skip

__all__ = [
    "TokenLossRecorder",
    "default_forward",
    "token_losses",
    "shard_ranges",
    "model_attrs",
    "record_offline",
    "discover_checkpoints",
    "weights_fingerprint",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
