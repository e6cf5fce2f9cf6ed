"""Recording: evaluate a probe along training (or over saved checkpoints) into a store.

Framework adapters live in :mod:`tokdyn.record.hf` (HF ``Trainer``) and
:mod:`tokdyn.record.lightning` (Lightning); they import their framework only when used.
"""

from .._lazy import lazy_names

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

__getattr__ = lazy_names(__name__, _LAZY)
