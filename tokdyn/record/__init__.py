"""Recording: evaluate a probe along training (or over saved checkpoints) into a store."""

from .recorder import TokenLossRecorder, default_forward, shard_ranges, token_losses

__all__ = ["TokenLossRecorder", "default_forward", "token_losses", "shard_ranges"]
