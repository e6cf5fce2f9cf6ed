"""Recording: evaluate a probe along training (or over saved checkpoints) into a store.

Framework adapters live in :mod:`tokdyn.record.hf` (HF ``Trainer``) and
:mod:`tokdyn.record.lightning` (Lightning); they import their framework only when used.
"""

from .offline import discover_checkpoints, record_offline, weights_fingerprint
from .recorder import TokenLossRecorder, default_forward, model_attrs, shard_ranges, token_losses

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
