"""Device-side curriculum: per-token loss weights looked up inside the training step.

:class:`TokenWeights` holds the learnability table on the training device and maps a batch
``[B, C+1]`` to weights ``[B, C]`` with tensor operations only (``searchsorted``, ``gather``,
``where``, a mean): nothing is copied to the host and nothing waits for the device, so it adds
no synchronisation to a CUDA step. Use the weights as

    nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(w)
    loss = (w * nll).sum() / w.sum()
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError
from ..train import resolve_device
from .learnability import LearnabilityTable
from .schedule import CurriculumConfig

__all__ = ["TokenWeights"]


class TokenWeights:
    """``weights(tokens [B, C+1], step) -> [B, C]``: float32, batch mean 1, each ``>= floor``.

    Parameters
    ----------
    table : LearnabilityTable
    config : CurriculumConfig
    tokenizer : tokenizer, spec dict or int
        The training run's tokenizer (or vocabulary size), checked against the table's.
    device : torch device
        Where the training step runs; the table is copied there once.

    ``step`` is the 0-based optimizer update the batch is for: a Python int (checked against
    the schedule's range on the host, no device work) or a 0-d integer tensor on the device
    (for captured graphs; range-checked on the CPU only, since on a device that would need a
    sync). Token ids must be integers in the table's vocabulary: an id outside it is an
    :class:`InputError` for CPU tokens, and makes the batch's weights NaN on a device (no host
    sync there; the loss says so). With ``floor == 0`` a batch in which no token scores gets
    uniform weights (1) rather than zeros.
    """

    def __init__(self, table: LearnabilityTable, config: CurriculumConfig, *, tokenizer: Any,
                 device: torch.device | str = "cpu") -> None:  # fmt: skip
        if not isinstance(table, LearnabilityTable):
            raise InputError(f"table must be a LearnabilityTable, got {type(table).__name__}")
        if not isinstance(config, CurriculumConfig):
            raise InputError(f"config must be a CurriculumConfig, got {type(config).__name__}")
        table.check_tokenizer(tokenizer)
        if not any(bool((lv["delta"] > 0).any()) for lv in table.levels) and table.delta_global <= 0:
            raise InputError("the learnability table predicts no positive loss drop for any key: every curriculum weight would be zero")
        self.device = resolve_device(device)
        self.table = table.to(self.device)
        self.config = config

    def x(self, step: int | torch.Tensor) -> float | torch.Tensor:
        """``log10`` pilot step of update ``step`` (plus lead): a float, or a device tensor."""
        if isinstance(step, torch.Tensor):
            if step.numel() != 1 or step.dtype == torch.bool or step.dtype.is_floating_point or step.dtype.is_complex:
                raise InputError(f"step must be an int or a one-element integer tensor (the 0-based optimizer update), "
                                 f"got a {step.dtype} tensor of shape {tuple(step.shape)}")  # fmt: skip
            step = step.reshape(())
            if step.device.type == "cpu":  # checked where it costs no device sync
                self.config.check_step(int(step))
            c = self.config
            return torch.log10((step.to(torch.float32) + 1.0) * c.time_scale) + c.lead
        return self.config.x(step)

    def __call__(self, tokens: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.shape[1] < 2:
            raise InputError(f"tokens must be a tensor [B, C+1], got {getattr(tokens, 'shape', type(tokens).__name__)}")
        if tokens.dtype == torch.bool or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
            raise InputError(f"tokens must be integer token ids, got {tokens.dtype} (a float or bool id would be read as "
                             "another token)")  # fmt: skip
        v = self.table.vocab_size
        if tokens.device.type == "cpu":  # on the host the check costs no device sync
            self.check_ids(tokens)
        x = self.x(step)
        mu, delta, _ = self.table.lookup(tokens)  # (B, C) each, on the device
        q = self.config.sharpen(self.config.learnability(x, mu, delta))
        mean = q.mean()
        # a NaN score (a damaged table) stays NaN, as the training loss then says, never uniform
        # weights without a word; checked without a host sync
        share = torch.where((mean > 0) | mean.isnan(), q / mean.clamp(min=torch.finfo(q.dtype).tiny), torch.ones_like(q))
        f = self.config.floor
        w = f + (1.0 - f) * share
        if tokens.device.type != "cpu":  # an id outside the vocabulary: NaN weights (the loss says so), no host sync
            t = tokens.to(self.device)
            w = torch.where(((t < 0) | (t >= v)).any(), torch.full_like(w, float("nan")), w)
        return w

    def check_ids(self, tokens: torch.Tensor) -> None:
        """:class:`InputError` where ``tokens`` hold an id outside the table's vocabulary
        (:meth:`LearnabilityTable.check_tokens`). On a device this reads two numbers back, one
        host sync: :meth:`__call__` does it only for CPU tokens (on a device it makes such a
        batch's weights NaN instead), and :class:`~tokdyn.curriculum.hf.CurriculumTrainer` calls
        it every step, since the Trainer syncs each step anyway and leaves a NaN loss out of its
        logs."""
        self.table.check_tokens(tokens)

    def __repr__(self) -> str:
        return f"TokenWeights({self.table!r}, {self.config})"
