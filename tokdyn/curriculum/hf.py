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

The Trainer's update ``t`` must be the sampler's step ``t``: its global batch (per-device batch
x gradient accumulation x data-parallel processes) must be the sampler's ``samples_per_step``,
and it must train at most the sampler's ``total_steps`` updates (a second pass over the sampler
would start its schedule again at step 0); either mismatch is an :class:`InputError` when the
training data loader is built.
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
        if self.curriculum_sampler is None:  # transformers 4.x passes no dataset, and takes none
            return super()._get_train_sampler() if train_dataset is None else super()._get_train_sampler(train_dataset)
        s = self.curriculum_sampler
        n = len(train_dataset if train_dataset is not None else self.train_dataset)
        if n != s.n_samples:
            raise InputError(f"the curriculum sampler covers {s.n_samples} samples; the training dataset has {n}")
        _check_steps_match(self, s)
        return s

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.token_weights is None:
            # num_items_in_batch only where given: the Trainer takes it from transformers 4.46 on
            counted = {} if num_items_in_batch is None else {"num_items_in_batch": num_items_in_batch}
            return super().compute_loss(model, inputs, return_outputs=return_outputs, **counted)
        if "input_ids" not in inputs:
            raise InputError(f"token weights are looked up from the batch's input_ids; the batch has {sorted(inputs)}")
        ids = inputs["input_ids"]  # (B, T)
        labels = inputs.get("labels", ids)
        if labels.shape != ids.shape:
            raise InputError(f"labels {tuple(labels.shape)} must have the shape of input_ids {tuple(ids.shape)} (the "
                             "token weights are those of the targets input_ids[:, 1:])")  # fmt: skip
        # ids outside the table's vocabulary: one line here, not NaN weights on a device (the
        # Trainer leaves a NaN loss out of its logs, logging_nan_inf_filter, while its gradients
        # turn every parameter NaN); a host sync, as the Trainer makes every step anyway
        self.token_weights.check_ids(ids)
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]  # (B, T, V)
        target = labels[:, 1:].long()  # int32 labels (a collator's) are ids too; cross_entropy takes int64 only
        w = self.token_weights(ids, self.state.global_step).to(target.device)  # (B, T-1); a no-op on one device
        w = w * (target != -100)
        nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target.flatten(), ignore_index=-100, reduction="none")
        loss = (w.flatten() * nll).sum() / w.sum().clamp(min=torch.finfo(w.dtype).tiny)
        return (loss, outputs) if return_outputs else loss


def _check_steps_match(trainer, sampler) -> None:
    """:class:`InputError` unless the Trainer's updates are the sampler's steps: the same global
    batch, at most ``total_steps`` of them, and one sampler for all processes."""
    args = trainer.args
    if sampler.world_size != 1:
        raise InputError(f"under the Trainer, give the curriculum sampler rank=0, world_size=1 (accelerate splits one "
                         f"sampler's batches between processes), got world_size={sampler.world_size}")  # fmt: skip
    if getattr(getattr(args, "accelerator_config", None), "split_batches", False):  # one loader batch split between processes
        global_batch = trainer._train_batch_size * args.gradient_accumulation_steps
    elif hasattr(trainer, "get_total_train_batch_size"):
        global_batch = trainer.get_total_train_batch_size(args)
    else:  # older transformers
        global_batch = trainer._train_batch_size * args.gradient_accumulation_steps * args.world_size
    if global_batch != sampler.samples_per_step:
        raise InputError(f"the curriculum sampler draws {sampler.samples_per_step} samples per step; the Trainer's global "
                         f"batch is {global_batch} (per-device batch {trainer._train_batch_size} x gradient accumulation "
                         f"{args.gradient_accumulation_steps} x {args.world_size} processes): its updates would not be the "
                         "schedule's steps. Give the sampler samples_per_step equal to the global batch")  # fmt: skip
    if args.max_steps > 0:
        if args.max_steps > sampler.total_steps:
            raise InputError(f"the curriculum sampler covers {sampler.total_steps} steps; the Trainer's max_steps is "
                             f"{args.max_steps}: after step {sampler.total_steps} it would draw the schedule again from "
                             "step 0. Build the schedule for the run's number of optimizer steps")  # fmt: skip
    elif args.num_train_epochs > 1:
        raise InputError(f"the curriculum sampler is one pass of {sampler.total_steps} steps; the Trainer's "
                         f"num_train_epochs is {args.num_train_epochs:g}: each epoch after the first would draw the "
                         "schedule again from step 0. Set max_steps (at most the schedule's steps) instead")  # fmt: skip
