"""Hugging Face ``transformers.Trainer`` adapter: record the probe from a ``TrainerCallback``.

::

    from tokdyn.record.hf import TokdynTrainerCallback

    args = TrainingArguments(...)  # under torchrun this sets up the process group
    rec = TokenLossRecorder(model, probe, "runs.zarr", "gpt2-small", schedule=geometric_schedule(max_steps, 40))
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[TokdynTrainerCallback(rec)]).train()

The callback records at ``state.global_step`` (optimizer updates done) after every update, and
at the starting step when training begins (step 0, or the step a resumed run restarts from);
the recorder skips unscheduled and already-stored steps. When training ends it closes the
recorder (flushing every queued row). ``Trainer`` does not call any callback when training
raises, so wrap ``trainer.train()`` in ``with rec:`` to keep the rows recorded before an error.
"""

from __future__ import annotations

from collections.abc import Callable

from ._adapter import RecorderBinding
from .recorder import TokenLossRecorder

try:
    from transformers import TrainerCallback
    from transformers import __version__ as _TRANSFORMERS_VERSION
except ImportError as exc:  # pragma: no cover - exercised only without transformers
    raise ImportError(
        f"tokdyn.record.hf needs the transformers package ({exc}); install it with: pip install 'tokdyn[hf]'"
    ) from exc

__all__ = ["TokdynTrainerCallback"]

# The Trainer calls on_optimizer_step (right after optimizer.step()) from transformers 4.42 on;
# before, the callback reads the update's rate when its step begins (the scheduler has not
# stepped for it yet). Without either, every row would get the first update's rate.
_HAS_OPTIMIZER_STEP = hasattr(TrainerCallback, "on_optimizer_step")


def _steps_at_epoch_end(version: str) -> bool:
    """Whether the Trainer of transformers ``version`` steps the optimizer at each epoch's end on
    the micro-batches left (4.47.0 on); before, its count of micro-batches ran across epochs and
    every update was a full one."""
    import re

    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return found is None or tuple(int(g or 0) for g in found.groups()) >= (4, 47, 0)


class TokdynTrainerCallback(TrainerCallback):
    """Records per-token probe losses during ``Trainer.train()``.

    Parameters
    ----------
    recorder : TokenLossRecorder or callable
        The recorder (built on the *unwrapped* model, on the device the Trainer trains on), or a
        zero-argument callable returning one, called when training begins: by then the Trainer
        has placed the model on its device.
    close : bool
        Close the recorder when training ends (the default). With ``False`` it is only flushed,
        and the caller closes it, e.g. to train again with the same recorder.
    tokens_per_step : int, optional
        Tokens per optimizer update, all its ``gradient_accumulation_steps`` micro-batches, stored
        as ``tokens_seen = step * tokens_per_step`` (the shorter last update of an epoch whose
        batches are not a multiple of the accumulation counts only its own micro-batches). By
        default ``state.num_input_tokens_seen`` is stored when the Trainer counts it
        (``TrainingArguments(include_num_input_tokens_seen=True)``), and nothing otherwise.

    The learning rate stored with a row is that of the update that produced the weights (read
    after ``optimizer.step()``, before the scheduler steps; before transformers 4.42, which has
    no such event, when the update's step begins); step 0 gets the first update's.
    """

    def __init__(
        self,
        recorder: TokenLossRecorder | Callable[[], TokenLossRecorder],
        *,
        close: bool = True,
        tokens_per_step: int | None = None,
    ) -> None:
        self._binding = RecorderBinding(
            recorder, close=close, tokens_per_step=tokens_per_step,
            placement_hint="build the recorder after the Trainer has placed the model, pass device=..., "
            "or pass a factory (lambda: TokenLossRecorder(...))",
        )  # fmt: skip

    @property
    def recorder(self) -> TokenLossRecorder | None:
        """The recorder (None until training begins when a factory was given)."""
        return self._binding.recorder

    # -- Trainer events -------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        self._binding.start(kwargs.get("optimizer"), step=state.global_step, model=kwargs.get("model"))
        self._record(args, state, kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        if not _HAS_OPTIMIZER_STEP:  # before 4.42: the rate before the update, which the scheduler steps after it
            self._binding.snapshot_lr(kwargs.get("optimizer"))

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._binding.snapshot_lr(kwargs.get("optimizer"))  # before lr_scheduler.step(): this update's rate

    def on_step_end(self, args, state, control, **kwargs):
        self._record(args, state, kwargs)
        self._flush_before_save(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._flush_before_save(control)

    def on_evaluate(self, args, state, control, **kwargs):
        if getattr(args, "save_strategy", None) == "best":  # the save is decided after the evaluation
            self._binding.flush()

    def on_train_end(self, args, state, control, **kwargs):
        self._binding.end()

    def on_save(self, args, state, control, **kwargs):
        self._binding.flush()  # a checkpoint was saved: commit the rows recorded before it

    def _flush_before_save(self, control) -> None:
        """The Trainer saves a checkpoint right after this event when ``control.should_save`` is set
        (``on_save`` comes after the save): commit the rows recorded before it first, so that a
        process killed once the checkpoint is on disk never leaves a restart from it skipping a row."""
        if getattr(control, "should_save", False):
            self._binding.flush()

    def _record(self, args, state, kwargs) -> None:
        loader = kwargs.get("train_dataloader")
        try:
            batches = len(loader) if loader is not None else None  # per epoch; an iterable dataset has none
        except (TypeError, NotImplementedError):
            batches = None
        if not _steps_at_epoch_end(_TRANSFORMERS_VERSION):
            batches = None  # every update a full one: step * tokens_per_step
        self._binding.set_epochs(batches, getattr(args, "gradient_accumulation_steps", 1))
        counted = None if self._binding.tokens_per_step is not None else _counted_tokens(args, state)
        self._binding.record(state.global_step, tokens_seen=counted)


def _counted_tokens(args, state) -> int | None:
    """``state.num_input_tokens_seen`` when the Trainer counts input tokens, else None."""
    counted = getattr(state, "num_input_tokens_seen", 0) or 0
    counting = getattr(args, "include_num_input_tokens_seen", "no") not in (False, None, "no")
    return int(counted) if counting or counted > 0 else None
