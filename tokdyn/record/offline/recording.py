"""The recording loop: evaluate the probe on checkpoints and append their rows in step order.

:func:`record_offline` reads as its steps: check the options, open the store and the run to
resume, find the checkpoints, skip those already committed, then evaluate ``workers`` checkpoints
at a time with dask (threads; torch releases the GIL in its kernels) and append each batch's rows
in step order. At most ``workers`` models are in memory, and a crash leaves a prefix of the run
that ``resume=True`` continues.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..._files import not_a_folder
from ..._checks import check_count
from ...errors import InputError, NotAStoreError, RunBusyError, RunExistsError, StoreError, TokdynError
from ...probe import ProbeSet
from ...runtime import resolve_device
from ...store import AXES, LOSS_DTYPES, TrajectoryStore, open_store
from .._interrupt import hold_interrupts
from ..recorder import (ForwardFn, _is_out_of_memory, _NeedsForward, _steps_text, check_model_context, default_forward, model_attrs,
                        token_losses)
from .discovery import MANIFEST, CheckpointRef, discover_checkpoints, drop_unfinished, hf_weight_files, manifest_axis, order_refs
from .loading import MODEL_DTYPES, ModelFactory, load_checkpoint, needs_transformers, weights_fingerprint
from .models import hf_progress_bars, import_transformers, short_error

__all__ = ["record_offline", "DuplicateWeightsWarning"]


class DuplicateWeightsWarning(UserWarning):
    """Two checkpoints at different steps hold identical weights (both are still recorded)."""


def record_offline(
    checkpoints: str | os.PathLike | Sequence[CheckpointRef],
    store: TrajectoryStore | str | os.PathLike,
    run: str,
    *,
    probe: ProbeSet | TrajectoryStore | str | os.PathLike | None = None,
    model_factory: ModelFactory | None = None,
    forward: ForwardFn | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 32,
    workers: int | None = None,
    dtype: str = "float32",
    model_dtype: str | None = "float32",
    resume: bool = False,
    progress: bool = True,
    axis: str | None = None,
    run_attrs: Mapping[str, Any] | None = None,
) -> dict:
    """Evaluate the probe on saved checkpoints and append one row per checkpoint to ``run``.

    Parameters
    ----------
    checkpoints : path or list of CheckpointRef
        A folder (or manifest file), read with :func:`discover_checkpoints`, or references.
    store : TrajectoryStore or str
        The store. It must exist unless ``probe`` is given (then it is created for it).
    run : str
        Run name; an existing run is refused unless ``resume=True``.
    probe : ProbeSet, TrajectoryStore or str, optional
        The probe, or a store (object or path) whose probe to use. Default: ``store``'s probe.
    model_factory : callable, optional
        ``model_factory() -> nn.Module`` for bare state dicts (overrides manifest specs).
    forward : callable, optional
        ``forward(model, input_ids) -> logits [B, T, V]``, for a model whose output is not that
        (a nanoGPT model gives only the last position's logits without targets:
        ``forward=lambda model, ids: model(ids, ids)[0]``). Default: the model's output, its
        ``.logits``, its ``"logits"`` or its first item, as :class:`TokenLossRecorder` takes it.
    device : str or torch.device
        Where the probe forwards run.
    batch_size : int
        Probe sequences per forward (fewer need less memory: running out of it is an error saying so).
    workers : int, optional
        Checkpoints evaluated at once (dask threads); also the number of models in memory.
        Default: ``min(4, cpu cores)`` on CPU, 2 on an accelerator (one loads while one runs).
    dtype : {"float32", "float16", "float64"}
        Storage dtype of the losses.
    model_dtype : {"float32", "bfloat16", "float16"} or None
        Dtype the model is evaluated in; None keeps what the checkpoint/factory gives.
    resume : bool
        Continue an existing run: checkpoints at or before its last committed step are skipped
        (a D/M sweep must then list the committed axis values first, unchanged).
    progress : bool
        Show a tqdm bar; False also turns off transformers' per-checkpoint loading bars.
    axis : {"T", "D", "M"}, optional
        Default: the manifest's ``"axis"``, else T (or the existing run's axis when resuming).
    run_attrs : dict, optional
        Extra run metadata.

    Returns
    -------
    dict
        ``store``, ``run``, ``axis``, ``recorded`` (steps written now), ``skipped`` (steps at or
        before the run's last committed step: already committed, or ``out_of_order``: never stored,
        a checkpoint saved later inside the committed range, warned about), ``deleted`` (steps whose checkpoint was deleted after it was listed, e.g. by a
        training's ``save_total_limit``: warned about, not recorded), ``rows`` (committed rows now), ``duplicates`` (pairs of steps with identical
        weights), ``fingerprints`` ({step: uint64} of the rows written now), ``seconds``.
    """
    t0 = time.perf_counter()
    _check_options(dtype=dtype, model_dtype=model_dtype, batch_size=batch_size, axis=axis)
    if forward is not None and not callable(forward):
        raise InputError(f"forward must be a callable forward(model, input_ids) -> logits, got a {type(forward).__name__}")
    device = resolve_device(device)  # before any work: a device that can hold weights
    workers = _worker_count(workers, device)  # before the store is opened, as the other options
    ts = _open_target_store(store, probe)
    try:
        existing = _run_to_resume(ts, run, resume=resume, axis=axis)
        refs, axis, source = _checkpoint_refs(checkpoints, axis or (existing.axis if existing is not None else None))
        if existing is not None and existing.axis != axis:
            raise InputError(f"run {run!r} has axis {existing.axis}; the checkpoints form an axis-{axis} sweep")
        _check_checkpoint_tokenizer(refs, ts.probe)
        tokens = _probe_tokens(ts, device)
        rows = _RunRows(ts, run, existing, axis=axis, capacity=len(refs), dtype=dtype, source=source, run_attrs=run_attrs)
    except BaseException:
        ts.discard_if_new()  # a failed command leaves no new store behind
        raise
    restore_threads = torch.get_num_threads()
    stop = threading.Event()
    try:
        todo = rows.skip_committed(refs)
        if needs_transformers(todo, model_factory):
            import_transformers()  # here, once: its first import is not safe from several threads
        evaluate = functools.partial(
            _evaluate, tokens=tokens, max_id=int(tokens.max().item()), model_factory=model_factory, forward=forward, device=device,
            model_dtype=model_dtype, batch_size=int(batch_size), threads=_threads_per_worker(workers, device),
            restore_threads=restore_threads, stop=stop,
        )  # fmt: skip
        with hf_progress_bars(progress):
            rows.check_saved_again(refs, functools.partial(_fingerprint_of, model_factory=model_factory, device=device,
                                                           model_dtype=model_dtype))  # fmt: skip
            _record_in_order(todo, evaluate, rows, workers=workers, progress=progress)
    except BaseException:
        stop.set()  # Ctrl-C or a failure: the checkpoints still in the workers stop at their next forward
        with hold_interrupts(rows.closing_notice, rows.closing_lost_notice):  # a second Ctrl-C: finish closing first
            rows.close()
            ts.discard_if_new()  # nothing was committed into a store this call made: remove it
        raise
    finally:
        torch.set_num_threads(restore_threads)
        rows.close()
    return rows.summary(seconds=time.perf_counter() - t0)


# -- the steps, in order ------------------------------------------------------------------


def _check_checkpoint_tokenizer(refs: Sequence[CheckpointRef], probe: ProbeSet) -> None:
    """Warn where the checkpoints' own tokenizer (the ``tokenizer.json`` of the first HF folder
    holding one) is not the probe's: each probe id would then be another token to the model, and
    every loss would be of other text, without an error. A warning, not a refusal: the same
    tokenizer saved by another library version may serialise differently."""
    folder = next((r.path for r in refs if r.kind == "hf" and (r.path / "tokenizer.json").is_file()), None)
    if folder is None:
        return
    from ...tokenizer import HFTokenizer

    try:
        theirs = HFTokenizer.from_file(folder, eot=None).spec()
    except (InputError, ImportError):  # unreadable here: nothing to compare
        return
    mine = dict(probe.tokenizer)
    if not mine.get("kind") or (mine.get("kind") == "hf" and mine.get("sha256") == theirs["sha256"]):
        return  # a probe of ids that names no tokenizer: nothing to compare with
    made = (f"a {mine.get('kind')} tokenizer" + (f" (sha256 {str(mine.get('sha256'))[:12]}, vocabulary {mine.get('vocab_size')})"
                                                  if mine.get("kind") == "hf" else ""))  # fmt: skip
    warnings.warn(f"{folder} holds a tokenizer (sha256 {theirs['sha256'][:12]}, vocabulary {theirs['vocab_size']:,}) other than "
                  f"the probe's, {made}: if it encodes text otherwise, each probe id is another token to these models and "
                  f"the losses are of other text. Make the probe with it (tokdyn probe SOURCE --tokenizer {folder})",
                  RuntimeWarning, stacklevel=3)  # fmt: skip


def _check_options(*, dtype: str, model_dtype: str | None, batch_size: int, axis: str | None) -> None:
    if dtype not in LOSS_DTYPES:
        raise InputError(f"dtype must be one of {LOSS_DTYPES}, got {dtype!r}")
    if model_dtype is not None and model_dtype not in MODEL_DTYPES:
        raise InputError(f"model_dtype must be one of {tuple(MODEL_DTYPES)} or None, got {model_dtype!r}")
    check_count("batch_size", batch_size)
    if axis is not None and axis not in AXES:
        raise InputError(f"axis must be one of {AXES}, got {axis!r}")


def _open_target_store(store, probe) -> TrajectoryStore:
    probe_set = _resolve_probe(probe)
    if isinstance(store, TrajectoryStore):
        if probe_set is not None:
            store.check_probe(probe_set)
        return store
    if probe_set is None:
        try:
            return open_store(store, mode="r+")
        except NotAStoreError:
            if not_a_folder(store):  # a file in the way: a probe would not help
                raise
            raise NotAStoreError(f"no tokdyn store at {store}; give probe= (--probe STORE: a store whose probe to use) to create one") from None
    return open_store(store, probe_set, mode="a")


def _resolve_probe(probe) -> ProbeSet | None:
    if probe is None or isinstance(probe, ProbeSet):
        return probe
    if isinstance(probe, TrajectoryStore):
        return probe.probe
    if isinstance(probe, (str, os.PathLike)):
        if os.fspath(probe).endswith(".npz"):
            raise InputError(
                f"{probe}: a losses.npz carries no token ids, so its probe cannot be evaluated; "
                "give a tokdyn store whose probe has tokens"
            )
        return open_store(probe, mode="r").probe
    raise InputError(f"probe must be a ProbeSet or a store (path), got {type(probe).__name__}")


def _run_to_resume(ts: TrajectoryStore, run: str, *, resume: bool, axis: str | None):
    """The existing run to continue, or None for a new one; an existing run needs ``resume``."""
    if not ts.has_run(run):  # an aborted creation (a crash) is replaced, not resumed
        return None
    if not resume:
        raise RunExistsError(f"run {run!r} already exists in {ts.url}; pass resume=True (--resume) to continue it")
    existing = ts.run(run)
    if axis is not None and axis != existing.axis:
        raise InputError(f"run {run!r} has axis {existing.axis}, asked for {axis}")
    return existing


def _checkpoint_refs(checkpoints, axis: str | None) -> tuple[list[CheckpointRef], str, str | None]:
    """The checkpoints in order, the run's axis, and the folder they came from (None for a list)."""
    source = None
    if isinstance(checkpoints, (str, os.PathLike)):
        source = os.path.abspath(checkpoints)
        refs = discover_checkpoints(checkpoints, axis=axis)
        axis = axis or manifest_axis(checkpoints) or "T"
        # a training still saving: its newest folder waits for --resume (a manifest's entries are
        # what the user listed: never dropped, a damaged one fails when loaded)
        if axis == "T" and not (Path(checkpoints) / MANIFEST).is_file():
            refs = drop_unfinished(refs, os.fspath(checkpoints))
    else:
        axis = axis or "T"
        refs = order_refs([r if isinstance(r, CheckpointRef) else _bad_ref(r) for r in checkpoints], axis, "checkpoints")
    if not refs:
        raise InputError("no checkpoints to record")
    return refs, axis, source


def _bad_ref(r: Any) -> CheckpointRef:
    raise InputError(f"checkpoints must be a folder or a list of CheckpointRef, got a {type(r).__name__} in the list")


def _worker_count(workers: int | None, device: torch.device) -> int:
    if workers is None:
        workers = min(4, os.cpu_count() or 1) if device.type == "cpu" else 2
    return check_count("workers", workers)


def _threads_per_worker(workers: int, device: torch.device) -> int:
    """torch threads for each worker, so that workers x threads never oversubscribes the cores."""
    cores = os.cpu_count() or 1
    return max(1, cores // workers) if device.type == "cpu" else max(1, min(4, cores // workers))


def _probe_tokens(ts: TrajectoryStore, device: torch.device) -> torch.Tensor:
    probe_set = ts.probe
    if not probe_set.has_tokens:
        raise InputError(f"the probe of {ts.url} is index-only (imported); it has no token ids to evaluate: record into a "
                         "store made by `tokdyn probe`, or import a losses.npz that carries probe_tokens")  # fmt: skip
    return torch.as_tensor(probe_set.tokens, dtype=torch.long).to(device)


def _record_in_order(todo: Sequence[CheckpointRef], evaluate: Callable, rows: _RunRows, *, workers: int, progress: bool) -> None:
    """Evaluate ``workers`` checkpoints at a time and append their rows in step order; a failure
    is raised after the rows before it are appended."""
    bar = _progress_bar(len(todo), rows.run, enabled=progress)
    try:
        for b in range(0, len(todo), workers):
            batch = todo[b : b + workers]
            results = _compute(evaluate, batch, workers)
            # Evaluated rows are written even if Ctrl-C comes meanwhile (it is raised after them):
            # evaluating them took far longer than writing them takes.
            done = itertools.takewhile(lambda rr: not isinstance(rr[1], BaseException), zip(batch, results))
            evaluated = [ref.step for ref, res in done if not isinstance(res, _Deleted)]
            with hold_interrupts(functools.partial(rows.writing_notice, evaluated), functools.partial(rows.lost_notice, evaluated)):
                for ref, res in zip(batch, results):
                    if isinstance(res, BaseException):
                        raise res
                    if isinstance(res, _Deleted):
                        rows.deleted_after_listing(ref)
                    else:
                        rows.append(ref, res)
                    bar.update(1)
    finally:
        bar.close()


def _compute(evaluate: Callable, batch: Sequence[CheckpointRef], workers: int) -> tuple:
    """Evaluate ``batch`` with dask's threaded scheduler; results in input order."""
    import dask

    # Indices, not the refs, go into the graph: dask would rebuild dataclass arguments itself.
    tasks = [dask.delayed(lambda j: evaluate(batch[j]), pure=False)(j) for j in range(len(batch))]
    return dask.compute(*tasks, scheduler="threads", num_workers=workers)


def _progress_bar(total: int, run: str, *, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"record {run}", unit="ckpt", disable=not enabled or total == 0)


# -- one checkpoint, in a worker thread ----------------------------------------------------


@dataclass
class _Evaluated:
    losses: np.ndarray  # [N] float32, nats
    fingerprint: int
    model_attrs: dict
    mtime: float


def _evaluate(
    ref: CheckpointRef,
    tokens: torch.Tensor,
    *,
    max_id: int,
    model_factory: ModelFactory | None,
    device: torch.device,
    model_dtype: str | None,
    batch_size: int,
    threads: int,
    restore_threads: int,
    stop: threading.Event | None = None,
    forward: ForwardFn | None = None,
) -> _Evaluated | _Deleted | BaseException:
    """Load, fingerprint and evaluate one checkpoint. Runs in a dask worker thread; a failure
    is returned (not raised) so that the rows before it can still be committed in order, and a
    checkpoint deleted since it was listed (a training's ``save_total_limit`` rotating old ones
    away) gives :class:`_Deleted`, whatever its load failed on. Once
    ``stop`` is set (the recording was interrupted) it gives up before its next forward: the
    interpreter waits for worker threads at exit, and a large model's probe takes minutes."""
    torch.set_num_threads(threads)  # per calling thread with OpenMP: keep workers x threads <= cores
    where = f"checkpoint {ref.path} (step {ref.step})"
    try:
        _check_stop(stop)
        saved = _saved_at(ref)  # before reading it: a checkpoint rotated away after that keeps its row
        model = load_checkpoint(ref, model_factory=model_factory, device=device, model_dtype=model_dtype)
        fp = weights_fingerprint(model)
        _check_input_vocabulary(model, max_id, where)
        check_model_context(model, tokens.shape[1] - 1, f"{where}: ")
        covering = functools.partial(_forward_covering, forward=forward or default_forward, max_id=max_id, where=where, stop=stop)
        try:
            losses = token_losses(model, tokens, batch_size=batch_size, forward=covering).cpu().numpy()
        except InputError as exc:  # say which checkpoint the probe's tokens do not fit
            if str(exc).startswith(where):
                raise
            raise (type(exc) if isinstance(exc, _NeedsForward) else InputError)(f"{where}: {exc}") from exc
        return _Evaluated(losses, fp, model_attrs(model), saved)
    except Exception as exc:  # noqa: BLE001 - re-raised in order by record_offline
        if not os.path.exists(ref.path):  # deleted since it was listed (save_total_limit): nothing left to record
            return _Deleted()
        if _is_out_of_memory(exc):  # not chained: its traceback holds the tensors that filled the memory
            exc = _OutOfMemory(
                f"{where}: out of memory on {device} ({short_error(exc, limit=160)}); evaluate fewer probe sequences per "
                f"forward (--batch-size, batch_size=; now {batch_size}), fewer checkpoints at once (--workers, workers=), "
                "or the model in a smaller dtype (--model-dtype bfloat16)"
            )  # fmt: skip
        if hasattr(exc, "add_note"):
            exc.add_note(f"while recording checkpoint {ref.path} (step {ref.step})")
        return exc
    finally:
        torch.set_num_threads(restore_threads)


def _fingerprint_of(ref: CheckpointRef, *, model_factory: ModelFactory | None, device: torch.device, model_dtype: str | None) -> int | None:
    """:func:`weights_fingerprint` of ``ref``'s model as a row of it stores it, or None when it cannot
    be loaded now (being saved again, say)."""
    try:
        return weights_fingerprint(load_checkpoint(ref, model_factory=model_factory, device=device, model_dtype=model_dtype))
    except Exception:  # noqa: BLE001 - a check only: loading it for its row says what is wrong
        return None


def _saved_at(ref: CheckpointRef) -> float:
    """When ``ref`` was saved: its file's modification time; an HF folder's, its weight files' (the
    folder's own changes whenever a file in it is added or removed, e.g. an optimizer state deleted
    later to save space)."""
    files = hf_weight_files(ref.path) if ref.kind == "hf" else None
    return max(f.stat().st_mtime for f in files) if files else ref.path.stat().st_mtime


def _check_input_vocabulary(model: torch.nn.Module, max_id: int, where: str) -> None:
    """Refuse a model whose input embedding (when it says) lacks the probe's largest token id,
    before a forward: on a GPU the lookup would be a device-side assert, not an error."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        n = getattr(get(), "num_embeddings", None) if callable(get) else None
    except (NotImplementedError, AttributeError):  # an HF model without the method
        n = None
    if isinstance(n, int) and max_id >= n:
        raise InputError(
            f"{where}: the model's vocabulary has {n} tokens but the probe's token ids reach {max_id}; "
            "the model must use the probe's tokenizer"
        )


class _Deleted:
    """What evaluating a checkpoint that was deleted after it was listed gives: no row."""


class _Stopped(TokdynError):
    """The recording was interrupted: a worker gives up its checkpoint (never reported). A
    TokdynError, so that :func:`token_losses` passes it on as it is, not as the model's failure."""


class _OutOfMemory(TokdynError, MemoryError):
    """A checkpoint did not fit in memory, loaded or evaluated: one line saying what to lower."""


def _check_stop(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise _Stopped("recording interrupted")


def _forward_covering(model: torch.nn.Module, input_ids: torch.Tensor, *, max_id: int, where: str,
                      stop: threading.Event | None = None, forward: ForwardFn = default_forward) -> torch.Tensor:  # fmt: skip
    """``forward`` (:func:`default_forward`, or the caller's), refusing logits that do not cover the
    probe's token ids: a target (the last position of a sequence) beyond them would fail in
    cross-entropy."""
    _check_stop(stop)
    logits = forward(model, input_ids)
    if isinstance(logits, torch.Tensor) and logits.ndim == 3 and logits.shape[-1] <= max_id:
        raise InputError(
            f"{where}: the model gives {logits.shape[-1]} logits per position but the probe's token ids reach {max_id}; "
            "the model must use the probe's tokenizer"
        )
    return logits


# -- the run's rows --------------------------------------------------------------------------


class _RunRows:
    """The rows of one run, appended in step order by the recording loop.

    Holds the run's writer (when resuming, from the start): the run is created at the first
    evaluated checkpoint, identical weights at two steps are warned about, and :meth:`close`
    trims the run to its rows and releases the writer.
    """

    def __init__(self, ts: TrajectoryStore, run: str, existing, *, axis: str, capacity: int, dtype: str, source, run_attrs):
        if existing is not None and len(existing.writers) != 1:
            raise StoreError(f"run {run!r} has {len(existing.writers)} token-range writers; offline recording writes single-writer runs")
        self.ts, self.run, self.axis, self.existing = ts, run, axis, existing
        self._create = functools.partial(_create_run, ts, run, axis=axis, capacity=capacity, dtype=dtype,
                                         source=source, run_attrs=run_attrs)  # fmt: skip
        self.writer = existing.writer(resume=True) if existing is not None else None
        self.recorded: list[int] = []
        self.skipped: list[int] = []
        self.out_of_order: list[int] = []  # of skipped, the steps no row holds
        self.deleted: list[int] = []
        self.fingerprints: dict[int, int] = {}
        self.duplicates: list[list[int]] = []
        self._seen: dict[int, tuple[int, str]] = {}  # fingerprint -> (step, "step S (path)")
        self._closed = False

    def skip_committed(self, refs: Sequence[CheckpointRef]) -> list[CheckpointRef]:
        """The checkpoints after the run's last committed step (all, for a new run)."""
        last = None if self.writer is None else self.writer.last_step
        todo = [r for r in refs if last is None or r.step > last]
        self.skipped = [r.step for r in refs if last is not None and r.step <= last]
        lost = sorted(set(self.skipped) - set(self.existing.steps.tolist())) if self.skipped else []
        self.out_of_order = lost
        if lost:
            warnings.warn(
                f"run {self.run!r}: checkpoints at steps {lost} come before its last committed step {last} and are not "
                "recorded (rows only ever append in step order); record them into a new run",
                stacklevel=3,
            )
        if self.existing is not None and self.existing.n_committed:
            if self.axis != "T":
                _check_sweep_prefix(self.existing, refs, self.run)
            for s, fp in zip(self.existing.steps.tolist(), self.existing.coord("ckpt_fingerprint").tolist()):
                if fp:
                    self._seen.setdefault(int(fp), (int(s), f"step {s} (committed earlier)"))
        return todo

    def check_saved_again(self, refs: Sequence[CheckpointRef], fingerprint: Callable[[CheckpointRef], int | None]) -> None:
        """Warn when the checkpoint at the run's last committed step was saved again, since its row
        was recorded, with other weights: a training restarted from an earlier checkpoint (after a
        divergence, with a fix) rewrites the checkpoints after it, and the rows appended now would
        be its, after the first training's. Only a checkpoint whose save time is not its row's
        ``wall_time`` is loaded (one, at most, per call); the same weights saved again or copied
        say nothing."""
        if self.existing is None or self.axis != "T":
            return
        steps = self.existing.steps  # one read of the committed rows (then two coordinates, where a checkpoint is there)
        ref = next((r for r in refs if steps.size and r.step == steps[-1]), None)
        if ref is None:
            return
        last, row = int(steps[-1]), steps.size - 1
        stored = int(self.existing.coord("ckpt_fingerprint")[row])
        try:
            if not stored or _saved_at(ref) == float(self.existing.coord("wall_time")[row]):
                return
        except OSError:  # gone meanwhile: nothing to compare
            return
        now = fingerprint(ref)
        if now is not None and now != stored:
            warnings.warn(
                f"run {self.run!r}: {ref.path.name}, the checkpoint at its last committed step {last}, now holds other weights "
                f"than its row (fingerprint {now:016x}, the row's {stored:016x}): saved again by a training restarted from an "
                f"earlier checkpoint? Its rows up to step {last} are then the first training's and those appended now the new "
                "one's; record the new training into a new run to keep them apart",
                stacklevel=3,  # record_offline's caller
            )

    def append(self, ref: CheckpointRef, res: _Evaluated) -> None:
        if self.writer is None:
            try:
                created = self._create(res=res)
            except RunExistsError:  # it was not there when this recording began: another one made it
                raise RunBusyError(
                    f"run {self.run!r} of {self.ts.url} was created by another process while this one evaluated its first "
                    "checkpoints (a second record-offline of the same run?); this one stops without writing: rerun it "
                    "with --resume (resume=True) once the other has finished"
                ) from None
            self.writer = created.writer()
        label = f"step {ref.step} ({ref.path})"
        if res.fingerprint in self._seen:
            first_step, first_label = self._seen[res.fingerprint]
            self.duplicates.append([first_step, ref.step])
            warnings.warn(
                f"checkpoints at {first_label} and {label} have identical weights "
                f"(fingerprint {res.fingerprint:016x}); both are recorded. Published checkpoint "
                "suites have shipped duplicates: check which step is right",
                DuplicateWeightsWarning,
                stacklevel=4,  # record_offline's caller
            )
        self._seen.setdefault(res.fingerprint, (ref.step, label))
        self.writer.append(
            res.losses, step=ref.step, axis_value=None if self.axis == "T" else ref.axis_value,
            tokens_seen=ref.tokens_seen, lr=ref.lr, wall_time=res.mtime, ckpt_fingerprint=res.fingerprint,
        )  # fmt: skip
        self.recorded.append(ref.step)
        self.fingerprints[ref.step] = res.fingerprint

    def deleted_after_listing(self, ref: CheckpointRef) -> None:
        """Skip ``ref``, gone since it was listed, with a warning: no rerun can record it."""
        self.deleted.append(ref.step)
        warnings.warn(
            f"{ref.path} (step {ref.step}) was deleted after it was listed (a training's save_total_limit rotating old "
            "checkpoints away?) and is not recorded; the run has no row at that step",
            stacklevel=4,  # record_offline's caller
        )

    def _uncommitted(self, steps: Sequence[int]) -> list[int]:
        last = None if self.writer is None else self.writer.last_step
        return [s for s in steps if last is None or s > last]

    def writing_notice(self, steps: Sequence[int]) -> str:
        todo = self._uncommitted(steps)
        return f"writing the rows of {len(todo)} evaluated checkpoint(s) of run {self.run!r} ({_steps_text(todo)})"

    def lost_notice(self, steps: Sequence[int]) -> str:
        todo, last = self._uncommitted(steps), None if self.writer is None else self.writer.last_step
        return (
            f"run {self.run!r}: stopped while writing; the rows of {_steps_text(todo)} were evaluated but are not committed "
            f"(the run's last committed step is {last}); --resume (resume=True) evaluates them again"
        )

    def closing_notice(self) -> str:
        return f"closing run {self.run!r} (every evaluated row is committed)"

    def closing_lost_notice(self) -> str:
        last = None if self.writer is None else self.writer.last_step
        return f"run {self.run!r}: stopped while closing; every row written is committed (last step {last})"

    def close(self) -> None:
        """Trim the run to its rows and release the writer. Idempotent."""
        if self.writer is not None and not self._closed:
            if self.writer.rows:
                self.writer.trim()
            self.writer.release()
        self._closed = True

    def summary(self, *, seconds: float) -> dict:
        return {
            "store": self.ts.url,
            "run": self.run,
            "axis": self.axis,
            "recorded": self.recorded,
            "skipped": self.skipped,
            "out_of_order": self.out_of_order,
            "deleted": self.deleted,
            "rows": 0 if self.writer is None else self.writer.rows,
            "duplicates": self.duplicates,
            "fingerprints": self.fingerprints,
            "seconds": seconds,
        }


def _create_run(ts: TrajectoryStore, run: str, *, axis: str, capacity: int, dtype: str, res: _Evaluated, source, run_attrs):
    attrs = dict(res.model_attrs)
    if axis == "M":  # every row is a different model: per-model counts would mislead here
        attrs = {"model_class": attrs.get("model_class")}
    attrs.update({"source": "offline"})
    if source is not None:
        attrs["checkpoints"] = source
    attrs.update(dict(run_attrs or {}))
    return ts.create_run(run, axis=axis, capacity=capacity, dtype=dtype, attrs=attrs)


def _check_sweep_prefix(existing, refs: Sequence[CheckpointRef], run: str) -> None:
    done = existing.axis_values
    given = np.array([r.axis_value for r in refs[: len(done)]], dtype=np.float64)
    if len(given) < len(done) or not np.array_equal(done, given):
        raise InputError(
            f"run {run!r} holds axis values {done.tolist()}; resuming needs the sweep to list them first, "
            f"unchanged, and only add larger ones (got {[r.axis_value for r in refs]})"
        )

