"""Hugging Face ``transformers.Trainer`` with the curriculum: a sampler, token weights, or both.

::

    from tokdyn.curriculum.hf import CurriculumTrainer

    trainer = CurriculumTrainer(model=model, args=args, train_dataset=ds,
                                curriculum_sampler=CurriculumSampler(schedule, samples_per_step=global_batch))
    trainer = CurriculumTrainer(model=model, args=args, train_dataset=ds,
                                token_weights=TokenWeights(table, config, tokenizer=tok, device=args.device))

The sampler replaces the Trainer's random sampler (``samples_per_step`` = per-device batch x
gradient accumulation x processes: accelerate splits one sampler's batches between processes).
Token weights replace the causal-LM loss by ``sum(w * nll) / sum(w)`` over the targets
``input_ids[:, 1:]`` whose label is not -100, with ``w`` looked up on the training device at
``state.global_step`` (the 0-based update the batch is for).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import InputError
from .sampler import CurriculumSampler
from .weights import TokenWeights

try:
    from transformers import Trainer
except ImportError as exc:  # pragma: no cover - exercised only without transformers
    raise ImportError(f"tokdyn.curriculum.hf needs the transformers package ({exc}); pip install 'tokdyn[hf]'") from exc

__all__ = ["CurriculumTrainer"]


class CurriculumTrainer(Trainer):
    """A ``Trainer`` that draws training samples with ``curriculum_sampler`` and/or weights each
    target token's loss with ``token_weights``; other arguments are the Trainer's."""

    def __init__(self, *args, curriculum_sampler: CurriculumSampler | None = None,
                 token_weights: TokenWeights | None = None, **kwargs) -> None:  # fmt: skip
        from .coupled import CoupledSampler

        if curriculum_sampler is not None and not isinstance(curriculum_sampler, (CurriculumSampler, CoupledSampler)):
            raise InputError(f"curriculum_sampler must be a CurriculumSampler or CoupledSampler, got {type(curriculum_sampler).__name__}")
        if token_weights is not None and not isinstance(token_weights, TokenWeights):
            raise InputError(f"token_weights must be a TokenWeights, got {type(token_weights).__name__}")
        super().__init__(*args, **kwargs)
        self.curriculum_sampler = curriculum_sampler
        self.token_weights = token_weights
        if token_weights is not None:
            self.model_accepts_loss_kwargs = False  # our loss is a per-batch mean: let the Trainer scale accumulation

    def _get_train_sampler(self, train_dataset=None):
        if self.curriculum_sampler is None:
            return super()._get_train_sampler(train_dataset)
        n = len(train_dataset if train_dataset is not None else self.train_dataset)
        if n != self.curriculum_sampler.n_samples:
            raise InputError(f"the curriculum sampler covers {self.curriculum_sampler.n_samples} samples; the training dataset has {n}")
        return self.curriculum_sampler

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.token_weights is None:
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        ids = inputs["input_ids"]  # (B, T)
        labels = inputs.get("labels", ids)
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]  # (B, T, V)
        target = labels[:, 1:]
        w = self.token_weights(ids, self.state.global_step)  # (B, T-1), on the device
        w = w * (target != -100)
        nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target.flatten(), ignore_index=-100, reduction="none")
        loss = (w.flatten() * nll).sum() / w.sum().clamp(min=torch.finfo(w.dtype).tiny)
        return (loss, outputs) if return_outputs else loss
