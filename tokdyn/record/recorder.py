"""Recording per-token probe losses during training.

:class:`TokenLossRecorder` is framework-agnostic: call :meth:`~TokenLossRecorder.maybe_record`
with the current optimizer step (or let :meth:`~TokenLossRecorder.attach` do it from an
optimizer hook), and at scheduled steps it evaluates the probe in eval mode without gradients,
restores the model's mode, and hands the per-token losses to a background writer thread.

What the training step pays: the probe forwards, and on CUDA a non-blocking copy of one float
per token into pinned host memory. The writer thread waits on a CUDA event, never the training
stream, and does the NaN count, the zarr write and the commit. Rows that arrive within
``commit_every`` seconds of each other are written and committed together: on a CPU the zarr
calls of a row cost more than its compression, and every cycle the writer spends is taken from
training. A writer failure is re-raised in the training process at the next recorder call
(:class:`~tokdyn.errors.WriterError`).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import logging
import os
import queue
import random
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .._text import command_line
from .._checks import check_count
from ..errors import InputError, RunExistsError, StepOrderError, StoreError, TokdynError, WriterError
from ..probe import ProbeSet
from ..runtime import count_parameters
from ..schedule import explicit_schedule
from ..store import DEFAULT_TOKEN_CHUNK, LOSS_DTYPES, RunWriter, TrajectoryStore, check_row, open_store
from ._interrupt import hold_interrupts
from .offline.models import short_error

__all__ = ["TokenLossRecorder", "default_forward", "token_losses", "shard_ranges", "model_attrs", "model_positions",
           "check_model_context"]

log = logging.getLogger(__name__)

ForwardFn = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


class _NeedsForward(InputError):
    """The model's output is not logits ``[B, T, V]``, which a ``forward=`` can make of it: the
    message says how; the command line, which takes no forward, says what it can do instead."""


class _ModelFailed(InputError):
    """The model's own forward raised on the probe's token ids (a recorder names the step)."""


def _is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed (Python's, CUDA's, or torch's CPU allocator,
    which raises a plain RuntimeError): never a fault of the model or the probe to report as one,
    and one a caller may handle itself (with a smaller batch)."""
    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in ("out of memory", "can't allocate memory", "not enough memory"))


def default_forward(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """``model(input_ids)`` as logits ``[B, T, V]``: a tensor, ``.logits`` (HF), a dict's
    ``"logits"``, or a tuple's first item."""
    out = model(input_ids)
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, Mapping):
        logits = out.get("logits")
    if logits is None and isinstance(out, (tuple, list)) and out:
        logits = out[0]
    if not isinstance(logits, torch.Tensor):
        raise _NeedsForward(
            f"model output of type {type(out).__name__} has no logits; pass forward=fn(model, input_ids) -> logits"
        )
    return logits


@torch.no_grad()
def token_losses(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    *,
    batch_size: int = 32,
    forward: ForwardFn = default_forward,
    out: torch.Tensor | None = None,
    max_target: int | None = None,
) -> torch.Tensor:
    """Per-token cross-entropy in nats of ``tokens [S, C+1]``: a tensor ``[S * C]`` on their device.

    The model is put in eval mode for the forwards (through each module's ``train()``) and its
    previous modes restored the same way, even on error; the forwards run outside any autocast
    region the caller is in, in the precision of the weights. Logits that do not cover a target
    id are an :class:`InputError` (never a cross-entropy index error, which on a GPU is a
    device-side assert that ends the process): ``max_target``, the largest id in
    ``tokens[:, 1:]``, is computed here when not given (one device sync). So is a forward that
    fails on the probe's shape ``[B, C]`` (a model with fewer positions than the probe's
    context, ...): one line with the model's own message, never its traceback as a bug of
    tokdyn's; running out of memory is raised as it is (the caller may retry in smaller batches).
    """
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise InputError(f"tokens must have shape [S, C+1], got {tuple(tokens.shape)}")
    s, c = tokens.shape[0], tokens.shape[1] - 1
    if max_target is None:
        max_target = int(tokens[:, 1:].max())
    if out is None:
        out = torch.empty(s * c, dtype=torch.float32, device=tokens.device)
    modes = [(m, m.training) for m in model.modules()]  # each submodule's own mode (a frozen part stays eval)
    model.eval()
    try:
        # Weights are evaluated in their own precision: a hook fires inside opt.step(), which a loop
        # may have wrapped in torch.autocast with the forward; rows would then differ in precision
        # from step 0's (recorded outside it) and from those the framework callbacks record.
        dev = tokens.device.type
        with (torch.autocast(dev, enabled=False) if _autocast_on(dev) else contextlib.nullcontext(),
              _unpatched_forward(model), _kept_rng(tokens.device)):
            for a in range(0, s, batch_size):
                chunk = tokens[a : a + batch_size]
                x, y = chunk[:, :-1], chunk[:, 1:]  # (B, C), (B, C)
                try:
                    logits = forward(model, x)
                except IndexError as exc:  # an embedding lookup past the model's vocabulary or positions
                    raise InputError(
                        f"the model cannot take the probe's tokens ({exc}): its ids reach {int(tokens.max())} and a sequence has "
                        f"{c} positions; the model's vocabulary must cover the probe's tokenizer and its context the probe's"
                    ) from exc
                except TokdynError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a model fails on an input it cannot take with any exception type
                    if _is_out_of_memory(exc):
                        raise
                    raise _ModelFailed(
                        f"the model failed on the probe's token ids, a batch of shape [B, C] = [{x.shape[0]}, {c}] "
                        f"({type(exc).__name__}: {short_error(exc)}); it must take token ids [B, C], C the probe's context, "
                        "and give logits [B, C, V]"
                    ) from exc
                if not isinstance(logits, torch.Tensor):
                    raise _NeedsForward(f"forward returned a {type(logits).__name__}, not logits [B, T, V]; "
                                        "pass forward=fn(model, input_ids) -> logits")  # fmt: skip
                if logits.ndim != 3 or logits.shape[:2] != x.shape:
                    # nanoGPT-style models give the last position's logits alone when called without targets
                    last = logits.ndim == 3 and logits.shape[0] == x.shape[0] and logits.shape[1] == 1 < x.shape[1]
                    raise (_NeedsForward if last else InputError)(
                        f"forward returned logits {tuple(logits.shape)}; expected [B, T, V] with B, T = {tuple(x.shape)}"
                        + ("; the model gave the last position's logits only (as nanoGPT's does without targets): pass a "
                           "forward that returns every position's, e.g. forward=lambda model, ids: model(ids, ids)[0]" if last else "")
                    )  # fmt: skip
                if logits.shape[-1] <= max_target:
                    raise InputError(
                        f"the model gives {logits.shape[-1]} logits per position but the probe's target ids reach {max_target}; "
                        "the model's vocabulary must cover the probe's tokenizer"
                    )
                nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
                out[a * c : (a + chunk.shape[0]) * c] = nll
    finally:
        _restore_modes(modes)
    return out


def _stepping(optimizer) -> torch.optim.Optimizer:
    """The optimizer whose ``step()`` makes the update, which ``attach`` hooks: ``optimizer``, or
    the one a wrapper without hooks of its own holds. accelerate's ``AcceleratedOptimizer`` is a
    ``torch.optim.Optimizer`` that never ran its ``__init__`` (hooking it raised AttributeError
    from inside torch, after the step-0 row was written); it steps ``.optimizer`` once per real
    update, skipping the steps of gradient accumulation, which is what a row's step counts."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InputError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    seen = set()
    while not hasattr(optimizer, "_optimizer_step_post_hooks") and id(optimizer) not in seen:
        seen.add(id(optimizer))
        inner = next((getattr(optimizer, name) for name in ("optimizer", "_optimizer")
                      if isinstance(getattr(optimizer, name, None), torch.optim.Optimizer)), None)  # fmt: skip
        if inner is None:
            raise InputError(f"the optimizer {type(optimizer).__name__} has no step hooks (a wrapper that never ran "
                             "torch.optim.Optimizer.__init__) and holds no optimizer that has: pass the optimizer whose "
                             "step() updates the weights")  # fmt: skip
        optimizer = inner
    return optimizer


def _tensors_of(optimizer) -> list:
    """The tensors an optimizer updates (its parameter groups'; also accelerate's and
    Lightning's wrappers, which expose ``param_groups``)."""
    return [t for g in getattr(optimizer, "param_groups", None) or () for t in g.get("params", ())]


def _storages(tensors) -> set[int]:
    """Addresses of the memory that ``tensors`` live in (a view shares its base's); tensors
    without memory (meta, fake, 0 bytes) are left out."""
    out = set()
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            try:
                ptr = t.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
                continue
            if ptr:
                out.add((t.device.type, t.device.index, ptr))
    return out


@contextlib.contextmanager
def _unpatched_forward(model: torch.nn.Module) -> Iterator[None]:
    """Run the block with the model's own ``forward``. accelerate's mixed precision (the Hugging Face
    ``Trainer`` with ``bf16=True`` or ``fp16=True``, ``Accelerator(mixed_precision=...)``) replaces
    ``model.forward`` on the instance by one that runs inside ``torch.autocast``, keeping the
    original as ``model._original_forward``: an autocast region opened inside the call, which
    disabling autocast around it cannot reach. The patched forward is put back afterwards."""
    own = model.__dict__
    if "forward" not in own or not callable(own.get("_original_forward")):
        yield
        return
    patched = own["forward"]
    model.forward = own["_original_forward"]
    try:
        yield
    finally:
        model.forward = patched


@contextlib.contextmanager
def _kept_rng(device: torch.device) -> Iterator[None]:
    """Run the block on a copy of the global random states: torch's (the CPU generator's, and the
    evaluating CUDA device's), numpy's legacy global generator's (``np.random.rand``) and Python's
    ``random``'s. A model that draws random numbers in eval mode (noise, a random router, dropout
    called with ``training=True``, from any of the three) would otherwise shift the training's
    random stream, and a run with the recorder would train other weights than the same run
    without it. (Generators a model holds itself, such as a ``np.random.Generator``, are its own.)"""
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    kept_np, kept_py = np.random.get_state(), random.getstate()
    try:
        with torch.random.fork_rng(devices=cuda, device_type="cuda"):
            yield
    finally:
        np.random.set_state(kept_np)
        random.setstate(kept_py)


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know (meta, ...): never on
        return False


def _restore_modes(modes: list[tuple[torch.nn.Module, bool]]) -> None:
    """Put each module back in its mode through its own ``train()``, as ``model.eval()`` left it
    through its own: a module that does work on a switch (loralib's LoRA layers merge their update
    into the weight in eval mode and take it out again in train mode) undoes it. ``modes`` lists
    parents before children, so a parent's ``train()`` never overrides a child's own mode."""
    for m, training in modes:
        if m.training != training:
            m.train(training)


# Config fields in which a model declares the most positions it was built (and trained) for:
# Hugging Face's names (GPT-2's n_positions and n_ctx, most others' max_position_embeddings, MPT's
# max_seq_len) and nanoGPT's block_size. A model that declares none is not second-guessed.
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length", "block_size")


def model_positions(model: torch.nn.Module) -> tuple[int, str] | None:
    """The most positions ``model`` declares it takes, and the field that says so
    (``"config.max_position_embeddings"``, tokdyn's own ``"config.context"``, ...); None when its
    config declares none. Several declared: the smallest."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    if (type(cfg).__module__, type(cfg).__name__) == ("tokdyn.model", "GPTConfig"):  # the tiny GPT (never imported here)
        return int(cfg.context), "config.context"  # its position table has `context` rows
    found = []
    try:  # Hugging Face's aliases (GPT-2's max_position_embeddings reads n_positions): named as the config spells it
        aliases = dict(getattr(cfg, "attribute_map", None) or {})
    except Exception:  # noqa: BLE001 - a config object of any kind: no aliases it can give
        aliases = {}
    for name in POSITION_FIELDS:
        try:
            value = cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)
        except Exception:  # noqa: BLE001 - a config object of any kind: unreadable means undeclared
            continue
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
            spelled = aliases.get(name, name)
            found.append((int(value), f"config.{spelled if isinstance(spelled, str) else name}"))
    return min(found) if found else None


def check_model_context(model: torch.nn.Module, context: int, where: str = "") -> None:
    """Refuse, with one :class:`InputError` line naming both lengths, a model that declares fewer
    positions than the probe's ``context``: past its trained length a learned position table has
    no row (an IndexError deep inside the model, a device-side assert on a GPU) and rotary or
    other positions give losses of a model never trained there, silently."""
    declared = model_positions(model)
    if declared is not None and declared[0] < int(context):
        n, field = declared
        raise InputError(
            f"{where}the model takes at most {n} positions ({field}) but the probe's sequences have a context of {context} "
            f"tokens, so it would be evaluated at positions it was never trained for; use a probe of context <= {n} "
            f"(tokdyn probe --context {n}) or a model built for {context}"
        )


def shard_ranges(n_sequences: int, context: int, world_size: int, *, token_chunk: int | None = None) -> tuple[int, list[tuple[int, int]]]:
    """Split ``n_sequences`` probe sequences into ``world_size`` chunk-aligned token ranges.

    Returns ``(token_chunk, ranges)``: every range starts on a chunk boundary, so each rank
    writes its own chunk objects.
    """
    if world_size < 1:
        raise InputError(f"world_size must be >= 1, got {world_size}")
    n = n_sequences * context
    if token_chunk is None:
        seqs = max(1, min(DEFAULT_TOKEN_CHUNK // context, -(-n_sequences // world_size)))
        token_chunk = seqs * context
    n_chunks = -(-n // token_chunk)
    if n_chunks < world_size:
        raise InputError(
            f"probe of {n_sequences} sequences in chunks of {token_chunk // context} cannot be split over "
            f"{world_size} ranks; use a smaller token_chunk or a larger probe"
        )
    bounds = [min(n, (r * n_chunks // world_size) * token_chunk) for r in range(world_size)] + [n]
    return token_chunk, list(zip(bounds[:-1], bounds[1:]))


class TokenLossRecorder:
    """Evaluates a probe at scheduled steps and appends per-token losses to a store.

    Parameters
    ----------
    model : torch.nn.Module
        The model being trained. Its output must be logits ``[B, T, V]`` (or an object with
        ``.logits``); otherwise pass ``forward``.
    probe : ProbeSet
        The probe (with token ids). The store's probe fingerprint must match.
    store : TrajectoryStore or str
        A store, or a URL opened (created if missing) with this probe.
    run : str
        Run name. An existing run is refused unless ``resume=True``.
    schedule : sequence of int
        Steps at which to record (e.g. :func:`~tokdyn.geometric_schedule`).
    device : torch.device or str, optional
        Where the probe forwards run; defaults to the model's device.
    dtype : {"float32", "float16", "float64"}, optional
        Storage dtype of the losses (computed in float32 whatever the model's precision, so
        float64 holds no more than float32): float32 for a new run; a resumed run keeps its own, and
        asking for another is an error (nothing is rounded silently).
    batch_size : int
        Probe sequences per forward.
    resume : bool
        Continue an existing run: steps at or before its last committed step are skipped.
    run_attrs : dict, optional
        Run metadata (``model_config``, ``seed``, ``data_budget``, ...); parameter counts are
        filled in from the model when absent.
    forward : callable, optional
        ``forward(model, input_ids) -> logits``.
    queue_size : int
        Rows that may wait for the writer before ``record`` blocks (back-pressure).
    commit_every : float
        Seconds a recorded row may wait in memory so that the rows recorded meanwhile are
        written and committed with it, in one set of zarr calls (default 10). ``0`` writes each
        row on its own as soon as it arrives. :meth:`flush` and :meth:`close` write waiting rows
        at once; a crash loses at most the rows of the last ``commit_every`` seconds (and those
        queued), which a restart from a training checkpoint saved after :meth:`flush` records
        again.
    rank, world_size : int, optional
        Distributed position; read from ``torch.distributed`` when it is initialised. Each rank
        evaluates and writes a disjoint, chunk-aligned shard of the probe.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        probe: ProbeSet,
        store: TrajectoryStore | str | os.PathLike,
        run: str,
        *,
        schedule: Sequence[int] | np.ndarray,
        device: torch.device | str | None = None,
        dtype: str | None = None,
        batch_size: int = 32,
        resume: bool = False,
        run_attrs: Mapping[str, Any] | None = None,
        forward: ForwardFn | None = None,
        queue_size: int = 4,
        commit_every: float = 10.0,
        rank: int | None = None,
        world_size: int | None = None,
        token_chunk: int | None = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(probe, ProbeSet) or not probe.has_tokens:
            raise InputError("probe must be a ProbeSet with token ids (an imported, index-only probe cannot be evaluated): "
                             "make one with `tokdyn probe`, or import a losses.npz that carries probe_tokens")  # fmt: skip
        if dtype is not None and dtype not in LOSS_DTYPES:
            raise InputError(f"dtype must be one of {LOSS_DTYPES}, got {dtype!r}")
        batch_size, queue_size = check_count("batch_size", batch_size), check_count("queue_size", queue_size)
        if not 0 <= float(commit_every) < float("inf"):
            raise InputError(f"commit_every must be a finite number of seconds >= 0, got {commit_every}")
        check_model_context(model, probe.context)  # before the store or run is made
        self.schedule = explicit_schedule(schedule)
        self._scheduled = set(self.schedule.tolist())
        self.model = model
        self.probe = probe
        self.forward = forward or default_forward
        self.batch_size = batch_size
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.rank, self.world_size = _dist_position(rank, world_size)
        if isinstance(store, TrajectoryStore):
            store.check_probe(probe)
            self.store = store
        else:
            self.store = open_store(store, probe, mode="a") if self.rank == 0 else None
            if self.world_size > 1:
                _barrier()
            if self.store is None:
                self.store = open_store(store, probe, mode="r+")
        self.run_name = run
        self._writer = self._open_writer(run, dtype=dtype, resume=resume, run_attrs=run_attrs, token_chunk=token_chunk)

        # The local shard on the device, once; a reusable output buffer on the device.
        s0, s1 = probe.sequence_range(self._writer.token_start, self._writer.token_stop)
        self._tokens = torch.as_tensor(probe.tokens[s0:s1], dtype=torch.long).to(self.device)
        self._max_target = int(probe.tokens[s0:s1, 1:].max())  # on the host: no device sync per record
        self._buf = torch.empty(self._writer.n_tokens, dtype=torch.float32, device=self.device)
        self._cuda = self.device.type == "cuda"
        # Pinned host buffers cycle between the training thread and the writer.
        self._free: queue.Queue = queue.Queue()
        n_host = int(queue_size) + 2
        for _ in range(n_host):
            self._free.put(torch.empty(self._writer.n_tokens, dtype=torch.float32, pin_memory=self._cuda))
        self._queue: queue.Queue = queue.Queue(maxsize=int(queue_size))
        self.commit_every = float(commit_every)
        # Rows waiting to be committed together live in one block (at most 16 MiB, 64 rows).
        self._batch_rows = 1 if self.commit_every == 0 else max(1, min(64, (16 << 20) // (4 * self._writer.n_tokens)))
        self._error: BaseException | None = None
        self._error_said = False  # the writer's failure was raised in the training thread
        self._closed = False
        self._last_queued: int | None = self._writer.last_step  # the last step handed to the writer
        self._followed = False  # a training was followed (attach() or a framework callback began)
        self._pending: collections.deque[int] = collections.deque()  # steps handed to the writer, not yet seen committed
        self._rows_queued = self._writer.rows
        self._replayed = self._last_stored_row()  # (step, row) a resumed training is compared at, if it gets there
        self.n_recorded = 0
        self.record_seconds = 0.0  # training-thread time spent inside record()
        self.forward_seconds = 0.0  # of which in the probe forwards (token_losses)
        self.hook_seconds = 0.0  # training-thread time in the optimizer hook on steps not recorded
        # A daemon, so that it never keeps a finished job alive; rows still queued when the
        # script ends (normally or with an exception) are written by _flush_at_exit.
        self._thread = threading.Thread(target=self._write_loop, name=f"tokdyn-writer-{run}", daemon=True)
        self._thread.start()
        self._pid = os.getpid()  # a forked process has a copy of this recorder, but not its writer thread
        _register_exit_flush(self)

    # -- set-up ---------------------------------------------------------------------------

    def _open_writer(self, run: str, *, dtype: str | None, resume: bool, run_attrs, token_chunk) -> RunWriter:
        store = self.store
        exists = store.has_run(run)  # an aborted creation (a crash) is replaced, not resumed
        if self.world_size > 1:
            _barrier()  # every rank has looked at the run list before rank 0 may create the run
        if exists and not resume:
            try:
                empty = store.run(run).n_committed == 0
            except TokdynError:  # a damaged run: the plain message
                empty = False
            # a recorder that failed at its first row (a model whose vocabulary is too small) left it
            left = (" with no committed row (a recorder that failed before its first?); pass resume=True to record "
                    f"into it, or delete it: {command_line('tokdyn delete-run', store.url, ('--run', run))} (or "
                    f"tokdyn.open_store({store.url!r}, mode='r+').delete_run({run!r}))") if empty else \
                "; pass resume=True to continue it"  # fmt: skip
            raise RunExistsError(f"run {run!r} already exists in {store.url}{left}")
        if not exists:
            if self.rank == 0:
                attrs = {**model_attrs(self.model), **dict(run_attrs or {})}
                attrs.setdefault("schedule", self.schedule.tolist())
                attrs.setdefault("world_size", self.world_size)
                # One writer per rank (a single one covering every token without distribution).
                chunk, ranges = shard_ranges(self.probe.n_sequences, self.probe.context, self.world_size, token_chunk=token_chunk)
                store.create_run(run, axis="T", capacity=len(self.schedule), dtype=dtype or "float32",
                                 token_chunk=chunk, writers=ranges, attrs=attrs)  # fmt: skip
            if self.world_size > 1:
                _barrier()
        r = store.run(run)
        if len(r.writers) != self.world_size:
            raise InputError(
                f"run {run!r} was recorded with {len(r.writers)} writer(s); this process group has {self.world_size}"
            )
        if dtype is not None and r.dtype != np.dtype(dtype):
            raise InputError(f"run {run!r} stores {r.dtype} losses; asked for {dtype}. Resume it with dtype={str(r.dtype)!r} or None")
        return r.writer(writer=self.rank, resume=resume)

    # -- the training-side API ------------------------------------------------------------

    def should_record(self, step: int) -> bool:
        """Whether ``step`` is scheduled and not already committed."""
        step = int(step)
        return step in self._scheduled and (self._last_queued is None or step > self._last_queued)

    def maybe_record(self, step: int, *, tokens_seen: int | None = None, lr: float | None = None) -> bool:
        """Record if ``step`` is scheduled (and not yet stored); returns whether it did. A resumed
        run's last stored scheduled step is evaluated once when it is reached again, and a
        warning says when its losses are not the stored row's (:meth:`_check_replayed`)."""
        self._check_error()
        if not self.should_record(step):
            self._check_replayed(step)
            return False
        self.record(step, tokens_seen=tokens_seen, lr=lr)
        return True

    def record(self, step: int, *, tokens_seen: int | None = None, lr: float | None = None) -> None:
        """Evaluate the probe now and queue the row for ``step``."""
        self._check_error()
        if self._closed:
            raise InputError(f"the recorder of run {self.run_name!r} is closed; build a new one (resume=True continues the run)")
        # checked here, in the caller's thread, as the writer checks it: a step of 1.7 was stored
        # as step 1, and a value the writer refuses would stop its thread at a later call
        step = check_row({"step": step, "tokens_seen": tokens_seen, "lr": lr})["step"]
        if self._last_queued is not None and step <= self._last_queued:
            raise StepOrderError(
                f"step {step} is not after step {self._last_queued}, the last one recorded in run {self.run_name!r}; "
                "rows are never overwritten or duplicated"
            )
        if self._last_queued is not None and not float(step) > float(self._last_queued):  # past 2**53: the writer's rule
            raise StepOrderError(  # (its thread refused the row and stopped, losing the rows queued with it)
                f"step {step} has the axis value {float(step)!r} of step {self._last_queued}, the last one recorded in run "
                f"{self.run_name!r} (float64 holds whole numbers exactly only to 2**53); a run's axis values strictly increase"
            )
        if self.world_size > 1 and self._rows_queued >= self._writer.run.capacity:
            raise StoreError(
                f"run {self.run_name!r} was allocated {self._writer.run.capacity} rows (its schedule) and is full; "
                "with several ranks the store cannot grow, so record only scheduled steps"
            )
        t0 = time.perf_counter()
        wall = time.time()
        try:
            token_losses(self.model, self._tokens, batch_size=self.batch_size, forward=self.forward, out=self._buf,
                         max_target=self._max_target)  # fmt: skip
        except _ModelFailed as exc:  # which row the model failed at
            raise _ModelFailed(f"recording step {step} of run {self.run_name!r}: {exc}") from exc.__cause__
        self.forward_seconds += time.perf_counter() - t0
        host = self._take_host_buffer()
        if self._cuda:
            host.copy_(self._buf, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        else:
            host.copy_(self._buf)
            ready = None
        meta = {"step": step, "tokens_seen": tokens_seen, "lr": lr, "wall_time": wall}
        self._put((ready, host, meta))
        self._pending.append(step)
        committed = self._writer.last_step
        while self._pending and committed is not None and self._pending[0] <= committed:
            self._pending.popleft()
        self._last_queued = step
        self._rows_queued += 1
        self.n_recorded += 1
        self.record_seconds += time.perf_counter() - t0

    def check_trains(self, tensors, what: str) -> None:
        """:class:`InputError` when ``tensors`` (what a training updates: an optimizer's
        parameters, or the model a framework trains) share no memory with this recorder's model:
        every row would evaluate weights that never change (a recorder built on a model that
        ``model_init``, a hyperparameter search or a rebuilt model replaced). Wrappers that keep
        the parameters (DDP, ``torch.compile``, PEFT, FSDP's views) share it. Nothing is checked
        where either side has no parameter in memory."""
        mine = _storages(self.model.parameters())
        theirs = _storages(tensors)
        if mine and theirs and not (mine & theirs):
            raise InputError(
                f"the recorder of run {self.run_name!r} evaluates a model that {what} does not train (they share no "
                "parameter): every row would hold the losses of weights that never change. Build the recorder on the "
                "model being trained (under a trainer that builds its model, model_init, pass a factory that builds the "
                "recorder when training begins)"
            )

    @contextlib.contextmanager
    def attach(self, optimizer: torch.optim.Optimizer, *, start_step: int = 0, tokens_per_step: int | None = None) -> Iterator["TokenLossRecorder"]:
        """Record from an optimizer hook: the step counter starts at ``start_step`` and grows by
        one after every ``optimizer.step()``. Exiting removes exactly the hook it added (even on
        an exception) and waits for the queued rows to be written.

        The model is recorded at ``start_step`` on entry when that step is scheduled (and not
        yet stored). At step 0 that row gets the first update's learning rate; at a resumed
        ``start_step`` its rate is unknown (NaN): the update that made those weights is done,
        and the optimizer already holds the next one's rate.
        """
        optimizer = _stepping(optimizer)
        if isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer)) or start_step < 0:
            raise InputError(f"start_step counts the optimizer updates already done: an integer >= 0, got {start_step!r}")
        if self._closed:
            raise InputError(f"the recorder of run {self.run_name!r} is closed; build a new one (resume=True continues the run)")
        if start_step == 0 and self.n_recorded and self._last_queued > 0:
            # A second loop that counts from 0 again while the model kept its weights: its rows would be
            # numbered from 0 again (steps up to the last one skipped, later ones misnumbered).
            raise InputError(
                f"attach(start_step=0), but this recorder already recorded run {self.run_name!r} up to step {self._last_queued} "
                "and the model kept training since; pass start_step=<optimizer updates done> to continue the count, or "
                "record the new training into a new run"
            )
        if tokens_per_step is not None and (isinstance(tokens_per_step, bool) or not isinstance(
                tokens_per_step, (int, np.integer)) or tokens_per_step < 1):
            raise InputError(f"tokens_per_step must be an integer >= 1, got {tokens_per_step!r}")
        self.check_trains(_tensors_of(optimizer), "the optimizer given to attach()")
        state = {"step": int(start_step)}
        self._warn_skipped(int(start_step))
        self._begins_at(int(start_step))
        self._followed = True

        def seen(step: int) -> int | None:
            return None if tokens_per_step is None else step * int(tokens_per_step)

        def hook(opt, args, kwargs) -> None:
            t0 = time.perf_counter()
            state["step"] += 1
            s = state["step"]
            if self.should_record(s):  # read lr (maybe a device tensor: a sync) only for a recorded row
                self.record(s, tokens_seen=seen(s), lr=float(opt.param_groups[0]["lr"]))
            else:
                self._check_error()
                self._check_replayed(s)
                self.hook_seconds += time.perf_counter() - t0

        # Only before the first update is the optimizer's rate the one of the row's update; after a
        # restart it is update start_step + 1's (its scheduler has stepped), which is not stored.
        entry_lr = float(optimizer.param_groups[0]["lr"]) if int(start_step) == 0 else None
        self.maybe_record(state["step"], tokens_seen=seen(state["step"]), lr=entry_lr)
        handle = optimizer.register_step_post_hook(hook)
        try:
            yield self
        finally:
            handle.remove()
        self.flush()

    def _begins_at(self, start_step: int) -> None:
        """A training begins at ``start_step`` after this recorder recorded later steps (a restart,
        in this process, from an earlier checkpoint): commit those rows, and compare the training
        with the last of them when it gets there again, as for a run resumed by a new recorder."""
        if self._last_queued is not None and start_step < self._last_queued and self._replayed is None:
            self.flush()
            self._replayed = self._last_stored_row()

    def _last_stored_row(self) -> tuple[int, int] | None:
        """The last committed row of a resumed run whose step this recorder's schedule holds:
        ``(step, row)``, or None (a new run, or no stored step scheduled)."""
        if self._writer.last_step is None:
            return None
        steps = self._writer.run.steps
        rows = np.flatnonzero(np.isin(steps, self.schedule))
        return (int(steps[rows[-1]]), int(rows[-1])) if rows.size else None

    def _check_replayed(self, step: int) -> None:
        """A resumed training that reaches the last stored scheduled step again (a restart from a
        training checkpoint saved before it) must be the training that recorded it: its row is
        kept, and the rows after it are this training's. Once, there, the probe is evaluated and
        compared with the stored row; a training restarted from an earlier checkpoint after a
        change (a lower rate after a divergence, other data, another seed) gives other losses,
        and the run would silently join two trainings: a warning says so, with the difference."""
        if self._replayed is None or int(step) != self._replayed[0]:
            return
        step, row = self._replayed
        self._replayed = None
        run, a, b = self._writer.run, self._writer.token_start, self._writer.token_stop
        row_losses = run.losses(tokens=slice(a, b), rows=slice(row, row + 1))[0]  # in the run's dtype
        stored = row_losses.astype(np.float32)
        now = token_losses(self.model, self._tokens, batch_size=self.batch_size, forward=self.forward,
                           max_target=self._max_target).cpu().numpy().astype(run.dtype).astype(np.float32)  # fmt: skip
        with np.errstate(invalid="ignore"):
            delta = np.abs(now - stored)
        nan_apart = np.isnan(now) != np.isnan(stored)
        # a float16 row is rounded to steps of 0.004 nats near 5: a replay off by noise may round one step apart
        limit = REPLAY_TOLERANCE + np.abs(np.spacing(row_losses)).astype(np.float32)
        if not nan_apart.any() and not (np.nan_to_num(delta) > limit).any():
            return
        finite = np.isfinite(delta)
        said = (f"by up to {float(delta[finite].max()):.3g} nats (mean {float(delta[finite].mean()):.3g})" if finite.any() else "")
        said += f"{', and ' if said else ''}{int(nan_apart.sum())} token(s) finite in one and not the other" if nan_apart.any() else ""
        warnings.warn(
            f"run {self.run_name!r}: this training is not the one that recorded it: at step {step}, the run's last stored "
            f"step it has reached again, its probe losses differ from the stored row's {said}. It restarted from a "
            f"training checkpoint before step {step} and trains otherwise (a changed rate after a divergence, other data "
            f"or seed?): the run keeps the earlier training's rows up to step {step} and gets this one's after it. Record "
            "a changed training into a new run (another run name), from its restart step",
            RuntimeWarning,
            stacklevel=3,
        )

    def _warn_skipped(self, start_step: int) -> None:
        """A resumed loop that starts after scheduled steps that were never committed will never
        record them: say so (the usual cause is a training checkpoint saved while rows were
        still queued; flush() before saving one)."""
        last = self._writer.last_step
        if last is None:
            return
        missed = [int(s) for s in self.schedule if last < s < start_step]
        if start_step > 0 and self.should_record(start_step):  # recorded on entry (below), by a restart
            warnings.warn(
                f"run {self.run_name!r}: step {start_step} was never committed, although the training checkpoint it "
                "restarts from was saved after it; it is recorded now, on entry, with an unknown learning rate (NaN). "
                "Call rec.flush() before saving a training checkpoint",
                RuntimeWarning,
                stacklevel=3,
            )
        if missed:
            warnings.warn(
                f"run {self.run_name!r}: scheduled steps {missed[:6]}{'...' if len(missed) > 6 else ''} lie between its last "
                f"committed step {last} and start_step {start_step} and will never be recorded. Call rec.flush() before "
                "saving a training checkpoint, so that a restart from it never skips a row",
                RuntimeWarning,
                stacklevel=3,
            )

    def flush(self) -> None:
        """Block until every queued row is committed; re-raise a writer failure.

        A Ctrl-C meanwhile is held back until the rows are committed, then raised (one line says
        so); a second one stops at once, after one line naming the steps whose rows are lost."""
        if self._thread.is_alive() and self._queue.unfinished_tasks:
            with hold_interrupts(self._writing_notice, self._lost_notice):
                self._put(_FLUSH)  # write the rows waiting for commit_every now
                while self._queue.unfinished_tasks and self._error is None and self._thread.is_alive():
                    time.sleep(0.001)
        self._check_error()

    def close(self, *, trim: bool = True) -> None:
        """Write what is queued, stop the writer, and (single writer) trim the arrays to the
        committed rows. Idempotent; re-raises a writer failure.

        A Ctrl-C while closing (the second of a researcher who stopped training with one) is held
        back until every recorded row is committed, then raised; a further one stops at once,
        after one line naming the steps whose rows are lost."""
        if self._closed:
            self._check_error()
            return
        self._closed = True
        with hold_interrupts(self._writing_notice, self._lost_notice):
            if self._thread.is_alive():
                self._put(None)
                while self._thread.is_alive():  # in slices: a Ctrl-C that lands just before a blocking
                    self._thread.join(0.1)  # join would only be seen once the join ends
            self._check_error()
            if self.world_size > 1:
                _barrier()
            if trim and self.rank == 0:
                self._writer.trim()
            self._writer.release()
        if self._followed and self.n_recorded == 0 and self._writer.last_step is None and self._error is None:
            first, last = int(self.schedule[0]), int(self.schedule[-1])
            warnings.warn(f"run {self.run_name!r} closed without a row: no step of its schedule ({first}..{last}, "
                          f"{len(self.schedule)} steps) was reached while it recorded", RuntimeWarning, stacklevel=2)  # fmt: skip

    def _uncommitted_steps(self) -> list[int]:
        """The steps handed to the writer whose rows are not committed yet."""
        last = self._writer.last_step
        return [s for s in self._pending if last is None or s > last]

    def _writing_notice(self) -> str:
        steps = self._uncommitted_steps()
        if not steps:
            return f"closing run {self.run_name!r} (every recorded row is committed)"
        return f"writing the {len(steps)} recorded row(s) of run {self.run_name!r} not yet committed ({_steps_text(steps)})"

    def _lost_notice(self) -> str:
        steps, last = self._uncommitted_steps(), self._writer.last_step
        if not steps:
            return f"run {self.run_name!r}: stopped while closing; every recorded row is committed (last step {last})"
        return (
            f"run {self.run_name!r}: stopped while writing; the rows of {_steps_text(steps)} were recorded but are not "
            f"committed and are lost (the run's last committed step is {last})"
        )

    def __getstate__(self):
        # pickle and copy.deepcopy both come here; without this they failed on the writer's lock
        raise InputError(
            f"the recorder of run {self.run_name!r} cannot be sent to another process or copied (it holds its open store "
            "and its writer thread); build it in the process that records: with Lightning's strategy='ddp_spawn', pass the "
            "callback a factory that pickles, functools.partial(TokenLossRecorder, net, probe, path, run, schedule=...)"
        )

    def __enter__(self) -> "TokenLossRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # keep what was recorded, but never mask the training error
            if self.world_size > 1:
                self.flush()  # no barrier: the other ranks may never reach close()
            else:
                self.close()
        except KeyboardInterrupt:  # Ctrl-C again while writing: held until the rows were committed, or they were named as lost
            if not issubclass(exc_type, KeyboardInterrupt):
                raise
            # the first Ctrl-C propagates on its own
        except Exception as close_exc:  # noqa: BLE001
            log.error("tokdyn recorder failed while closing after an error: %s", close_exc)

    @property
    def last_step(self) -> int | None:
        return self._writer.last_step

    # -- the writer thread ----------------------------------------------------------------

    def _take_host_buffer(self) -> torch.Tensor:
        while True:
            self._check_error()
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                if not self._thread.is_alive():
                    self._check_error()
                    raise WriterError("background writer stopped unexpectedly")

    def _put(self, item) -> None:
        while True:
            self._check_error()
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    self._check_error()
                    raise WriterError("background writer stopped unexpectedly") from None

    def _write_loop(self) -> None:
        """Take rows off the queue into a block; write and commit the block when its first row has
        waited ``commit_every`` seconds, when it is full, or on flush/close. A row is marked done
        (``task_done``) only once committed, so :meth:`flush` waits for it."""
        block = np.empty((self._batch_rows, self._writer.n_tokens), np.float32) if self._batch_rows > 1 else None
        metas: list[dict] = []
        deadline = 0.0
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()) if metas else None)
            except queue.Empty:
                item = _DUE  # the oldest waiting row has waited commit_every seconds
            try:
                if isinstance(item, tuple):
                    ready, host, meta = item
                    if ready is not None:
                        ready.synchronize()
                    if block is None:  # commit_every=0: each row on its own, from its host buffer
                        self._writer.append(host.numpy(), **meta)
                        self._free.put(host)
                        self._queue.task_done()
                        continue
                    block[len(metas)] = host.numpy()
                    self._free.put(host)
                    if not metas:
                        deadline = time.monotonic() + self.commit_every
                    metas.append(meta)
                    if len(metas) < self._batch_rows:
                        continue
                if metas:  # due, full, flush or close: write and commit what waits, in step order
                    self._writer.append_rows(block[: len(metas)], metas)
                    for _ in metas:
                        self._queue.task_done()
                    metas = []
                if item is None or item is _FLUSH:
                    self._queue.task_done()
                if item is None:
                    return
            except BaseException as exc:  # noqa: BLE001 - surfaced in the training thread
                self._error = exc
                return

    def _check_error(self) -> None:
        if self._error is not None:
            exc = self._error
            self._error_said = True
            # a run or store gone under the writer holds none of its rows (a store replaced meanwhile: another's)
            kept = "" if self._writer.gone() else f" Rows up to step {self._writer.last_step} are committed and readable."
            raise WriterError(f"tokdyn writer for run {self.run_name!r} failed: {type(exc).__name__}: {exc}.{kept}") from exc


# Nats by which a token's loss may differ from its stored row's when a resumed training reaches a
# stored step again: a replay of the same training (the same weights) gives the same losses, up
# to the kernels' non-determinism on a GPU; a training changed since gives others.
REPLAY_TOLERANCE = 1e-3


def _steps_text(steps: Sequence[int]) -> str:
    """``step 40`` / ``steps [40, 50, 60]`` / ``steps 40..900 (12 rows)``."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) <= 6:
        return f"steps {list(steps)}"
    return f"steps {steps[0]}..{steps[-1]} ({len(steps)} rows)"


_FLUSH, _DUE = object(), object()  # writer-thread signals: write what waits now (flush; commit_every elapsed)
_OPEN: "weakref.WeakSet[TokenLossRecorder]" = weakref.WeakSet()
_EXIT_HOOK = []


def _register_exit_flush(rec: TokenLossRecorder) -> None:
    """Write queued rows at interpreter exit. The hook must run before the thread pools that zarr
    does its I/O on refuse new work, which happens at *threading* shutdown, before ``atexit``:
    so it is registered there (last registered, first run), after zarr has been imported."""
    _OPEN.add(rec)
    if not _EXIT_HOOK:
        register = getattr(threading, "_register_atexit", None) or atexit.register
        register(_flush_at_exit)
        _EXIT_HOOK.append(register)


def _flush_at_exit() -> None:
    for rec in list(_OPEN):
        # a writer that failed after the training thread's last call (its lock taken over by a
        # recorder made again in this process, a full disk) has ended its thread too: it was
        # skipped, and the rows it lost were never said
        if rec._closed or (not rec._thread.is_alive() and (rec._error is None or rec._error_said)):
            continue
        try:
            rec.flush()
        except KeyboardInterrupt:  # Ctrl-C while exiting: flush() has said which rows, if any, are lost
            continue
        except Exception as exc:  # noqa: BLE001 - exiting anyway: say what was lost
            lost = rec._uncommitted_steps()
            log.error("tokdyn recorder for run %r could not write its last rows at exit: %s%s", rec.run_name, exc,
                      f" The rows of {_steps_text(lost)} are lost." if lost else "")  # fmt: skip


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def model_attrs(model: torch.nn.Module) -> dict:
    """Run attributes known from the model itself: parameter counts, config, class name."""
    attrs: dict[str, Any] = dict(count_parameters(model))
    cfg = getattr(model, "config", None)
    if cfg is not None:
        to_dict = getattr(cfg, "to_dict", None)
        try:
            attrs["model_config"] = to_dict() if callable(to_dict) else dict(vars(cfg))
        except TypeError:
            pass
    attrs["model_class"] = type(getattr(model, "_orig_mod", model)).__name__  # a torch.compile'd model's own class
    return json.loads(json.dumps(attrs, default=str))  # e.g. a torch dtype in a HF config


def _dist_position(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else torch.distributed's. A launcher's environment that
    says several processes (torchrun's, accelerate's ``WORLD_SIZE``) without a process group is
    refused: every rank would write the whole run as rank 0, and all but one fail on the run's
    writer lock (another job's, it said) or find the run made by another."""
    dist = torch.distributed
    if rank is None and world_size is None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    said = os.environ.get("WORLD_SIZE", "").strip()
    if rank is None and world_size is None and said.isdigit() and int(said) > 1:
        raise InputError(
            f"the environment says this is one of {int(said)} processes (WORLD_SIZE={said}, RANK="
            f"{os.environ.get('RANK', '?')}) but torch.distributed is not initialised: build the recorder after "
            "init_process_group (with the Hugging Face Trainer, after TrainingArguments(...); with Lightning, pass a "
            "factory), or pass rank= and world_size= (rank=0, world_size=1 records from this process alone)"
        )
    rank = 0 if rank is None else int(rank)
    world_size = 1 if world_size is None else int(world_size)
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} out of range for world_size {world_size}")
    return rank, world_size


def _barrier() -> None:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
