"""Lightning adapter: record the probe from a ``lightning.pytorch`` (or ``pytorch_lightning``) Callback.

::

    from tokdyn.record.lightning import TokdynLightningCallback

    cb = TokdynLightningCallback(lambda: TokenLossRecorder(net, probe, "runs.zarr", "lit", schedule=schedule))
    Trainer(max_steps=max_steps, callbacks=[cb]).fit(module, loader)

The callback records at ``trainer.global_step`` (optimizer updates done) after every training
batch, and at the starting step when training starts; the recorder skips unscheduled and
already-stored steps, and the callback never hands it one step twice (with gradient
accumulation several batches end on one step). It closes the recorder when training ends, and
flushes it when training raises, so the rows recorded before the error stay readable. Under
``fast_dev_run`` (Lightning's smoke test) it records nothing and builds no recorder.

Under DDP pass a factory (a zero-argument callable returning the recorder): Lightning starts the
process group and moves the model to its device inside ``fit``, and the recorder must be built
after both, on every rank.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import warnings
from collections.abc import Callable

import torch

from ..errors import InputError
from ._adapter import RecorderBinding
from .recorder import TokenLossRecorder

try:
    import lightning.pytorch as pl
except ImportError:
    try:
        import pytorch_lightning as pl
    except ImportError as exc:  # pragma: no cover - exercised only without Lightning
        raise ImportError(
            f"tokdyn.record.lightning needs Lightning ({exc}); install it with: pip install 'tokdyn[lightning]'"
        ) from exc

__all__ = ["TokdynLightningCallback"]

log = logging.getLogger(__name__)


class TokdynLightningCallback(pl.Callback):
    """Records per-token probe losses during ``Trainer.fit``.

    Built on ``lightning.pytorch.Callback`` when the ``lightning`` package is installed, else on
    ``pytorch_lightning.Callback``: use it with the matching ``Trainer``.

    Parameters
    ----------
    recorder : TokenLossRecorder or callable
        The recorder, built on the network being trained (e.g. the ``TinyGPT`` inside the
        ``LightningModule``, never a DDP wrapper), or a zero-argument callable returning one,
        called at ``on_train_start`` once the process group exists and the model is on its device.
    close : bool
        Close the recorder when training ends (the default); with ``False`` it is only flushed.
    tokens_per_step : int, optional
        Tokens per optimizer update, all its ``accumulate_grad_batches`` micro-batches, stored as
        ``tokens_seen = step * tokens_per_step`` (the shorter last update of an epoch whose batches
        are not a multiple of the accumulation counts only its own micro-batches).

    The learning rate stored with a row is that of the update that produced the weights (read
    just before ``optimizer.step()``; Lightning steps the scheduler before the batch-end hook);
    step 0 gets the first update's. With several optimizers (manual optimization) it is the
    first one's, ``trainer.optimizers[0]``.
    """

    def __init__(
        self,
        recorder: TokenLossRecorder | Callable[[], TokenLossRecorder],
        *,
        close: bool = True,
        tokens_per_step: int | None = None,
    ) -> None:
        super().__init__()
        self._binding = RecorderBinding(
            recorder, close=close, tokens_per_step=tokens_per_step,
            placement_hint="pass a factory (lambda: TokenLossRecorder(...)) so the recorder is built after "
            "Lightning places the model, or pass device=...",
        )  # fmt: skip
        self._dev_run = False  # this training is Lightning's fast_dev_run: nothing recorded

    def __getstate__(self) -> dict:
        # Lightning pickles the trainer, callbacks included, into every process of a spawn strategy
        # (strategy="ddp_spawn"); pickle failed there on the recorder's lock or on a lambda factory.
        self._refuse_if_built()
        factory = self._binding._factory
        try:
            _Probe(_Discard()).dump(factory)  # all but the tensors' data, written nowhere
        except Exception as exc:  # noqa: BLE001 - whatever pickle says, said in one line
            raise InputError(_unsendable(f"was given the recorder factory {_name(factory)}, which ({exc})")) from None
        return self.__dict__

    def __deepcopy__(self, memo) -> "TokdynLightningCallback":
        # A copy in this process (XLA's launcher deep-copies the trainer): a factory needs no pickling.
        self._refuse_if_built()
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def _refuse_if_built(self) -> None:
        """InputError where this callback holds its built recorder (open store, lock, writer
        thread), which no copy or pickle of it can take along."""
        if self._binding.recorder is not None:
            raise InputError(_unsendable(f"holds the recorder of run {self._binding.recorder.run_name!r}, which"))

    @property
    def recorder(self) -> TokenLossRecorder | None:
        """The recorder (None until training starts when a factory was given)."""
        return self._binding.recorder

    # -- Lightning hooks ------------------------------------------------------------------

    def on_train_start(self, trainer, pl_module) -> None:
        self._dev_run = bool(getattr(trainer, "fast_dev_run", False))
        if self._dev_run:  # Lightning's smoke test: its rows would become the run's (a real training is refused)
            warnings.warn(
                "fast_dev_run: tokdyn records nothing (no recorder is built, no run made), as Lightning suppresses "
                "logging and checkpointing",
                UserWarning,
                stacklevel=2,
            )
            return
        self._binding.start(trainer.optimizers[0] if trainer.optimizers else None, step=trainer.global_step, model=pl_module)
        self._record(trainer)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        first = trainer.optimizers[0] if trainer.optimizers else None
        if first is None or optimizer is first or getattr(optimizer, "optimizer", None) is first:
            self._binding.snapshot_lr(optimizer)  # with several (manual optimization), the first's, as at step 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._dev_run:
            self._record(trainer)  # once per step, even with gradient accumulation

    def _record(self, trainer) -> None:
        self._binding.set_epochs(getattr(trainer, "num_training_batches", None), getattr(trainer, "accumulate_grad_batches", 1))
        self._binding.record(trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        if not self._dev_run:  # a smoke test leaves a held recorder open for the training after it
            self._binding.end()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._binding.flush()  # the rows recorded before this checkpoint are committed with it

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Flush, not close: close() waits on a barrier under DDP, which a failed rank never reaches.
        if self.recorder is None or self.recorder._pid != os.getpid():  # a forked copy has no writer to flush
            return
        try:
            self.recorder.flush()
        except Exception as exc:  # noqa: BLE001 - never mask the training error
            log.error("tokdyn recorder failed while flushing after a training error: %s", exc)


class _Probe(pickle.Pickler):
    """Pickles an object's structure to see that it can be: tensors (a model's weights) are left out."""

    def persistent_id(self, obj):
        return id(obj) if isinstance(obj, torch.Tensor) else None


class _Discard:
    """A file that forgets what is written to it: pickles a factory only to see that it can."""

    def write(self, data) -> int:
        return len(data)


def _name(factory) -> str:
    """A factory's name, short (a partial's repr holds the whole probe and model)."""
    func = getattr(factory, "func", None)
    if func is not None and hasattr(factory, "args"):
        return f"functools.partial({getattr(func, '__qualname__', type(func).__name__)}, ...)"
    return getattr(factory, "__qualname__", type(factory).__name__)


def _unsendable(what: str) -> str:
    return (
        f"the tokdyn callback {what} cannot be sent to another process, as strategy='ddp_spawn' sends every callback; "
        "pass a factory that pickles: functools.partial(TokenLossRecorder, net, probe, path, run, schedule=...), or a "
        "function defined at module level"
    )
