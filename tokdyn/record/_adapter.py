"""What the framework callbacks share: the recorder (or the factory that builds it), a guard that
hands each step over once, and a learning-rate snapshot read without a device sync."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch

from ..errors import InputError
from .recorder import TokenLossRecorder


class RecorderBinding:
    """A recorder as a training framework's callback drives it.

    Parameters
    ----------
    recorder : TokenLossRecorder or callable
        The recorder, or a zero-argument callable returning one, called by :meth:`start` (once the
        framework has placed the model on its device and set up the process group).
    close : bool
        :meth:`end` closes the recorder (default) or only flushes it.
    tokens_per_step : int, optional
        Tokens per optimizer update (all its micro-batches), stored as ``tokens_seen = step *
        tokens_per_step`` (an epoch's shorter last update counted as short: :meth:`tokens_at`).
    placement_hint : str
        Advice appended to the error raised when the model is not where the recorder evaluates.
    """

    def __init__(
        self,
        recorder: TokenLossRecorder | Callable[[], TokenLossRecorder],
        *,
        close: bool,
        tokens_per_step: int | None,
        placement_hint: str,
    ) -> None:
        if not isinstance(recorder, TokenLossRecorder) and not callable(recorder):
            raise InputError(f"recorder must be a TokenLossRecorder or a callable returning one, got {type(recorder).__name__}")
        if tokens_per_step is not None and int(tokens_per_step) < 1:
            raise InputError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
        self._factory = None if isinstance(recorder, TokenLossRecorder) else recorder
        self.recorder: TokenLossRecorder | None = recorder if isinstance(recorder, TokenLossRecorder) else None
        self.close_at_end = bool(close)
        self.tokens_per_step = None if tokens_per_step is None else int(tokens_per_step)
        self.placement_hint = placement_hint
        self.lr: float | torch.Tensor | None = None
        self._last_step: int | None = None  # the last step handed to the recorder
        self._epoch_shape: tuple[int, int] | None = None  # (micro-batches per epoch, accumulated per update)
        self._warned_jump = False  # scheduled steps jumped over were said

    def start(self, optimizer=None, *, step: int = 0, model=None) -> TokenLossRecorder:
        """Build the recorder if needed, check where the model lives, snapshot the rate. At a
        resumed ``step`` the optimizer holds the next update's rate, not the one that made the
        weights: the row recorded there gets an unknown rate (NaN)."""
        step = int(step)
        if step == 0 and self._last_step is not None and self._last_step > 0:
            # Another training from step 0 after this callback recorded later steps: the model kept its
            # weights, so its rows would be numbered from 0 again (steps up to the last one skipped,
            # later ones misnumbered). A resumed training starts at its checkpoint's step instead.
            raise InputError(
                f"training begins at step 0, but this callback already recorded run {self.recorder.run_name!r} up to step "
                f"{self._last_step} in an earlier training; the model kept its weights, so the steps of this one would not "
                "number them. Record it into a new run (a new callback and recorder), or resume the trainer from a checkpoint"
            )
        if self.recorder is not None and self.recorder._closed:
            if self._factory is None:
                raise InputError(
                    f"the recorder of run {self.recorder.run_name!r} was closed when an earlier training ended; to train "
                    "again with it pass close=False, or pass a factory (lambda: TokenLossRecorder(..., resume=True))"
                )
            self.recorder = None  # built again below: the factory's recorder continues the run (resume=True)
        if self.recorder is None:
            rec = self._factory()
            if not isinstance(rec, TokenLossRecorder):
                raise InputError(f"the recorder factory returned {type(rec).__name__}, not a TokenLossRecorder")
            self.recorder = rec
        _check_process(self.recorder)
        _check_placement(self.recorder, self.placement_hint)
        if model is not None:  # the model the framework trains: the recorder must watch it
            self.recorder.check_trains(list(model.parameters()), "the trainer")
        self.recorder._warn_skipped(step)  # a resumed training after rows that were never committed
        self.recorder._begins_at(step)  # a restart from an earlier checkpoint than the last row: compared there
        if self._last_step is not None and step < self._last_step:
            self._last_step = None  # its steps up to the last row reach the recorder, which skips (and checks) them
        self.recorder._followed = True
        self.snapshot_lr(optimizer if step == 0 else None)
        return self.recorder

    def snapshot_lr(self, optimizer) -> None:
        """Keep the first group's learning rate; a tensor rate is copied on its device
        (schedulers update it in place) and read only when a row is recorded."""
        groups = getattr(optimizer, "param_groups", None)  # also accelerate's / Lightning's wrappers
        if not groups:
            self.lr = None
            return
        lr = groups[0]["lr"]
        self.lr = lr.detach().clone() if isinstance(lr, torch.Tensor) else float(lr)

    def set_epochs(self, batches: int | float | None, accumulation: int | None) -> None:
        """What the trainer says of its epochs: ``batches`` micro-batches each (None or inf for a
        stream without length), ``accumulation`` of them per optimizer update."""
        try:
            n, acc = int(batches), int(accumulation or 1)
        except (TypeError, ValueError, OverflowError):  # no length: an iterable stream, inf
            n, acc = 0, 1
        self._epoch_shape = (n, acc) if n > 0 and acc > 1 and n % acc else None

    def tokens_at(self, step: int) -> int | None:
        """``step * tokens_per_step``, except where an epoch's micro-batches are not a multiple of the
        accumulation: the last update of each epoch then accumulates only the rest of them (both
        trainers step the optimizer at an epoch's end), and counts their tokens alone, at
        ``tokens_per_step / accumulation`` each."""
        if self.tokens_per_step is None:
            return None
        if self._epoch_shape is None:
            return step * self.tokens_per_step
        n, acc = self._epoch_shape
        epochs, rest = divmod(step, -(-n // acc))  # ceil(n / acc) updates per epoch
        micro = epochs * n + rest * acc  # micro-batches done by the end of update `step`
        return (micro * self.tokens_per_step + acc // 2) // acc

    def record(self, step: int, tokens_seen: int | None = None) -> None:
        """Hand ``step`` to the recorder once (several hooks may fire on one optimizer step)."""
        step = int(step)
        prev = self._last_step
        if prev is not None and step <= prev:
            return
        rec = self.recorder
        if prev is not None and step > prev + 1 and not self._warned_jump:
            # several optimizer steps between two hooks (Lightning's manual optimization with two
            # optimizers steps global_step twice a batch): the scheduled steps between are never seen
            between = rec.schedule[(rec.schedule > prev) & (rec.schedule < step)]
            if between.size:
                self._warned_jump = True
                warnings.warn(
                    f"run {rec.run_name!r}: the trainer's step went from {prev} to {step} between two of its hooks (several "
                    f"optimizer steps a batch?), past scheduled steps {between[:6].tolist()}{'...' if between.size > 6 else ''}, "
                    "which are not recorded; schedule steps the trainer's global_step reaches (said once)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        if rec.should_record(step):  # read the rate (maybe a device tensor) only for a recorded row
            if tokens_seen is None:
                tokens_seen = self.tokens_at(step)
            rec.record(step, tokens_seen=tokens_seen, lr=None if self.lr is None else float(self.lr))
        else:
            rec.maybe_record(step)  # records nothing; raises a pending writer failure
        self._last_step = step  # only now: a step whose recording raised is tried again when training goes on

    def flush(self) -> None:
        """A training checkpoint is being saved: commit every row recorded so far (rows wait up to
        the recorder's ``commit_every``), so a restart from the checkpoint never skips one."""
        if self.recorder is not None:
            self.recorder.flush()

    def end(self) -> None:
        """Training ended: close the recorder (or flush it, with ``close=False``)."""
        if self.recorder is None:
            return
        if self.close_at_end:
            self.recorder.close()
        else:
            self.recorder.flush()


def _check_process(rec: TokenLossRecorder) -> None:
    """A recorder copied into a forked process (Lightning's ``ddp_fork``, ``ddp_notebook``) lacks
    its writer thread, and every copy takes itself for the only writer."""
    if rec._pid != os.getpid():
        raise InputError(
            f"the recorder of run {rec.run_name!r} was built in process {rec._pid}, and this is process {os.getpid()}, "
            "a fork of it (as strategy='ddp_fork' or 'ddp_notebook' makes): its writer thread stayed there; pass a factory "
            "(lambda: TokenLossRecorder(...)) so that each process builds its own"
        )


def _check_placement(rec: TokenLossRecorder, hint: str) -> None:
    """Fail early, with advice, when the recorder cannot evaluate the model it was given."""
    model = rec.model
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise InputError("build the recorder on the unwrapped model (ddp.module), not the DistributedDataParallel wrapper")
    p = next(model.parameters(), None)
    if p is None:
        return
    dev, want = p.device, rec.device
    if dev.type != want.type or (dev.index is not None and want.index is not None and dev.index != want.index):
        raise InputError(f"the model is on {dev} but the recorder evaluates on {want}; {hint}")
