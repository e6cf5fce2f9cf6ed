"""Crash harness: SIGKILL a recording training process, and `tokdyn fit`, at random instants.

**Recording.** A child process trains a tiny GPT with a :class:`TokenLossRecorder` attached,
saving a training checkpoint (weights, optimizer, step) every few steps after ``rec.flush()``.
The harness kills it with SIGKILL, either at a random instant of its life or as soon as it is
seen in a chosen phase (opening/creating the store, training, evaluating the probe, writing a
row's chunks, committing a row, saving a checkpoint, closing), restarts it with ``resume=True``
from its last training checkpoint, and repeats until a life finishes. After every kill it checks
the store against an uninterrupted reference run of the same seeded job:

- no committed row lost: the store holds at least the rows the child had seen committed
  (it publishes the count in shared memory after each commit returns) and never fewer than
  after the previous kill;
- no row corrupt or duplicated: committed steps are the reference's first ``k`` steps, and
  every committed loss and coordinate equals the reference's bit for bit;
- at the end, the whole store equals the reference (trimmed to its rows, readable by plain
  ``xarray.open_zarr``).

**Fitting.** ``tokdyn fit`` (the CLI's ``main``) is killed at random instants on a copy of a
store of planted events and restarted until it exits 0. After every kill, every block marked
done must equal the uninterrupted fit's block; at the end every result field equals it.

**Refitting.** ``tokdyn fit --refit --axis-min 10`` of a fitted run is killed at random instants
and followed by ``tokdyn fit --axis-min 10`` (``--refit`` again where the kill came before the
refit had a group) until one exits 0. After every life the run must read as one whole fit, the
one it had or the uninterrupted refit, and once it reads the refit it must never read the old
fit again.

Children are forked from a forkserver that has imported torch and tokdyn once, so a life costs
a fork, not an interpreter start (the kill is still a SIGKILL of a separate training process).

    python pipelines/kill_harness.py --kills 120 --fit-kills 20 --refit-kills 20     # the figures in docs/reliability.md
    python pipelines/kill_harness.py --kills 12 --fit-kills 3 --seed 1 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

# -- phases, published by the child in a shared 16-byte file ------------------------------

MAIN_PHASES = ["starting", "opening", "training", "evaluating", "checkpointing", "closing", "done"]
WRITER_PHASES = ["idle", "writing", "committing"]
FIT_PHASES = ["starting", "preparing", "fitting", "writing", "committing", "done"]
_MAIN, _WRITER, _ROWS = 0, 1, 4  # byte offsets: main-thread phase, writer phase, int32 rows committed


class Phase:
    """Two phase bytes and a committed-row counter in a memory-mapped file, shared by the
    harness and its child."""

    def __init__(self, path: str | os.PathLike, *, create: bool = False) -> None:
        if create:
            Path(path).write_bytes(bytes(16))
        self._fh = open(path, "r+b")
        self._mm = mmap.mmap(self._fh.fileno(), 16)

    def set(self, offset: int, value: int) -> None:
        self._mm[offset] = value

    def get(self, offset: int) -> int:
        return self._mm[offset]

    @property
    def rows(self) -> int:
        return int.from_bytes(self._mm[_ROWS : _ROWS + 4], "little")

    @rows.setter
    def rows(self, k: int) -> None:
        self._mm[_ROWS : _ROWS + 4] = int(k).to_bytes(4, "little")

    def reset(self) -> None:
        self._mm[:] = bytes(16)

    def close(self) -> None:
        self._mm.close()
        self._fh.close()


# -- the recording job (runs in the child) ------------------------------------------------

RECORD_JOB = dict(steps=60, every=10, n_seq=32, context=32, token_chunk=256, batch=8, seed=0)


def schedule(steps: int) -> list[int]:
    """Dense early, sparser later: 0..12, then every third step (rows are frequent, so kills
    land on writes and commits often)."""
    return sorted(set(range(0, 13)) | set(range(12, steps + 1, 3)))


def _lr(step: int) -> float:
    return 3e-3 * min(1.0, step / 10) + 1e-4


def _build(job: dict):
    import torch

    import tokdyn
    from tokdyn.model import GPTConfig, TinyGPT

    rng = np.random.default_rng(job["seed"])
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 64, size=(job["n_seq"], job["context"] + 1)), tokenizer={"kind": "byte"})
    torch.manual_seed(job["seed"])
    model = TinyGPT(GPTConfig(vocab_size=64, context=job["context"], n_layer=1, n_head=2, n_embd=32))
    opt = torch.optim.AdamW(model.parameters(), lr=_lr(1))
    return probe, model, opt


def _instrument_recording(phase: Phase) -> None:
    """Publish what the child is doing; behaviour is unchanged (wrappers only set bytes)."""
    import zarr

    import tokdyn.store.writer as store_mod
    from tokdyn.record.recorder import TokenLossRecorder

    write = store_mod._write_concurrently

    def writing(writes):
        phase.set(_WRITER, WRITER_PHASES.index("writing"))
        write(writes)
        phase.set(_WRITER, 0)

    store_mod._write_concurrently = writing
    update = zarr.Group.update_attributes

    def committing(self, new_attributes):
        is_commit = "rows" in new_attributes and threading.current_thread().name.startswith("tokdyn-writer")
        if is_commit:
            phase.set(_WRITER, WRITER_PHASES.index("committing"))
        out = update(self, new_attributes)
        if is_commit:
            phase.rows = int(new_attributes["rows"])  # committed: the harness may now count on it
            phase.set(_WRITER, 0)
        return out

    zarr.Group.update_attributes = committing
    record = TokenLossRecorder.record

    def evaluating(self, *args, **kwargs):
        before = phase.get(_MAIN)
        phase.set(_MAIN, MAIN_PHASES.index("evaluating"))
        try:
            return record(self, *args, **kwargs)
        finally:
            phase.set(_MAIN, before)

    TokenLossRecorder.record = evaluating


def train_and_record(job: dict, store: str, run: str, workdir: str, phase_path: str, instrument: bool = True) -> None:
    """One life of the training job: resume from the last training checkpoint, train to
    ``job["steps"]`` with the recorder attached, checkpoint every ``job["every"]`` steps."""
    import torch
    import torch.nn.functional as F

    from tokdyn.record import TokenLossRecorder

    torch.set_num_threads(1)  # bit-exact and cheap on a shared machine
    phase = Phase(phase_path)
    if instrument:
        _instrument_recording(phase)
    main = lambda name: phase.set(_MAIN, MAIN_PHASES.index(name))  # noqa: E731
    probe, model, opt = _build(job)
    ckpt = Path(workdir) / "train.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
    main("opening")
    rec = TokenLossRecorder(model, probe, store, run, schedule=schedule(job["steps"]), resume=True,
                            token_chunk=job["token_chunk"], batch_size=8)  # fmt: skip
    with rec, rec.attach(opt, start_step=start, tokens_per_step=job["batch"] * job["context"]):
        for step in range(start + 1, job["steps"] + 1):
            main("training")
            g = torch.Generator().manual_seed(job["seed"] * 100_003 + step)
            batch = torch.randint(0, 64, (job["batch"], job["context"] + 1), generator=g)
            for group in opt.param_groups:
                group["lr"] = _lr(step)
            logits = model(batch[:, :-1])  # (B, C, V)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()  # the recorder's hook records scheduled steps here
            if step % job["every"] == 0 or step == job["steps"]:
                main("checkpointing")
                rec.flush()  # rows up to this step are committed before the checkpoint exists
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, ckpt)
        main("closing")
    main("done")


# -- the fit job (runs in the child) -------------------------------------------------------

FIT_JOB = dict(n_tokens=6_000, token_chunk=500, seed=3)


def make_fit_store(path: str, job: dict = FIT_JOB) -> None:
    """A store of planted sigmoid events on a log-spaced grid (step 0 included)."""
    import tokdyn
    from tokdyn.fit.synthetic import plant_sigmoids

    steps = np.concatenate([[0], np.unique(np.round(np.geomspace(1, 10_000, 36)).astype(int))])
    planted = plant_sigmoids(job["n_tokens"], np.log10(np.maximum(steps, 1)), rng=np.random.default_rng(job["seed"]))
    n = job["n_tokens"]
    probe = tokdyn.ProbeSet(None, {"sample_id": np.arange(n, dtype=np.int32), "token_pos": np.ones(n, np.int32)})
    st = tokdyn.open_store(path, probe, mode="w")
    with st.create_run("r", capacity=len(steps), token_chunk=job["token_chunk"]).writer() as w:
        for j, step in enumerate(steps):
            w.append(planted.Y[:, j].clip(0.01), step=int(step))


def run_fit_cli(store: str, phase_path: str, extra: tuple[str, ...] = ()) -> None:
    """One life of `tokdyn fit` (the CLI entry point, in this process), ``extra`` its further
    arguments."""
    import zarr

    import tokdyn.fit.job as job_mod
    import tokdyn.store.fit as store_fit
    from tokdyn.cli import main

    sys.stdout = open(os.devnull, "w")  # the summary table is not what the harness checks
    phase = Phase(phase_path)
    at = lambda name: phase.set(_MAIN, FIT_PHASES.index(name))  # noqa: E731
    fit_block, prepare, update = job_mod.fit_block, store_fit.FitWriter._prepare, zarr.Group.update_attributes

    def fitting(*a, **k):
        at("fitting")
        out = fit_block(*a, **k)
        at("writing")  # the block's fields, then its done flag
        return out

    def preparing(*a, **k):
        at("preparing")
        return prepare(*a, **k)

    def committing(self, new):
        at("committing")
        return update(self, new)

    job_mod.fit_block, store_fit.FitWriter._prepare, zarr.Group.update_attributes = fitting, preparing, committing
    rc = main(["fit", store, "--run", "r", "--scheduler", "sync", "--no-two-step", "--no-progress", "--batch-rows", "250", *extra])
    at("done")
    os._exit(rc)


# -- the harness (parent) ------------------------------------------------------------------


def _context() -> mp.context.BaseContext:
    """The forkserver, started now (so that timing a life does not time its imports)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "zarr", "tokdyn.record", "tokdyn.model", "tokdyn.fit.job", "tokdyn.cli", __name__])
    p = ctx.Process(target=int)
    p.start()
    p.join()
    return ctx


def _timed_reference(ctx, target, args) -> float:
    """Run one uninterrupted life; returns its duration in seconds (random kills fall inside it)."""
    t0 = time.monotonic()
    p = ctx.Process(target=target, args=args)
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"the reference {target.__name__} failed (exit {p.exitcode})")
    return time.monotonic() - t0


def _read_run(path: str, run: str):
    """(steps, losses, coords, nonfinite) of the committed rows; empty when nothing is there yet
    (a store or run killed while being created is not a store or run yet)."""
    import tokdyn
    from tokdyn.errors import NotAStoreError

    try:
        st = tokdyn.open_store(path, mode="r")
    except NotAStoreError:
        return None
    if not st.has_run(run):
        return None
    r = st.run(run)
    coords = {c: r.coord(c) for c in ("step", "axis_value", "tokens_seen", "lr", "wall_time")}
    return {"k": r.n_committed, "losses": r.losses(), "coords": coords, "nonfinite": r.nonfinite(), "capacity": r.capacity}


def _compare(got: dict | None, ref: dict, seen_rows: int, prev_k: int) -> tuple[int, list[str]]:
    """Committed rows of ``got`` against the reference; returns (k, violations)."""
    if got is None:
        return 0, [] if seen_rows == 0 and prev_k == 0 else [f"store or run gone: {seen_rows} rows had been committed"]
    k, bad = got["k"], []
    if k < max(seen_rows, prev_k):
        bad.append(f"rows lost: {k} committed now, {seen_rows} seen committed by the child, {prev_k} after the last kill")
    if k > ref["k"]:
        bad.append(f"{k} rows committed, the reference has {ref['k']}")
        return k, bad
    for c in ("step", "axis_value", "tokens_seen", "lr"):
        if not np.array_equal(got["coords"][c], ref["coords"][c][:k], equal_nan=True):
            bad.append(f"coordinate {c} differs: {got['coords'][c].tolist()} vs {ref['coords'][c][:k].tolist()}")
    if not np.all(np.isfinite(got["coords"]["wall_time"])):
        bad.append("a committed row has no wall time")
    diff = np.flatnonzero(~np.all(got["losses"] == ref["losses"][:k], axis=1))
    if diff.size:
        bad.append(f"loss rows {diff.tolist()} differ from the reference")
    if got["nonfinite"] != (0, {}):
        bad.append(f"non-finite losses counted: {got['nonfinite']}")
    return k, bad


def _kill_when(proc, phase: Phase, target: str, rng: np.random.Generator, life_s: float) -> str | None:
    """SIGKILL ``proc`` at a random instant (``target="random"``) or as soon as it is seen in
    phase ``target``; returns the phase observed just before the signal (None: it exited first)."""
    deadline = time.monotonic() + (rng.uniform(0.05, life_s) if target == "random" else 3 * life_s)
    want = None if target == "random" else target
    while proc.is_alive():
        main, writer = MAIN_PHASES[phase.get(_MAIN)], WRITER_PHASES[phase.get(_WRITER)]
        seen = writer if writer != "idle" else main
        if (want is not None and seen == want) or time.monotonic() > deadline:
            proc.kill()
            return seen
        time.sleep(0.0005 if want is None else 0)  # a targeted kill spins (commits last ~1 ms), yielding the core
    return None


TARGETS = ["random"] * 4 + ["opening", "training", "evaluating", "writing", "writing", "committing", "committing",
                           "checkpointing", "closing"]  # fmt: skip


@contextlib.contextmanager
def _workdir(workdir: str | None, prefix: str):
    """A harness's folder (``workdir``, or a temporary one removed at the end) and its phase
    channel, closed at the end."""
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix=prefix) if own else workdir)
    phase = Phase(root / "phase", create=True)
    try:
        yield root, phase
    finally:
        phase.close()
        if own:
            shutil.rmtree(root, ignore_errors=True)


def record_harness(n_kills: int, *, seed: int = 0, targets: list[str] | None = None, workdir: str | None = None, log=print) -> dict:
    """Kill recording lives until ``n_kills`` kills have been survived; returns the figures.

    Each kill aims at a target drawn from ``targets`` (default :data:`TARGETS`); given as a list
    of ``n_kills`` names, the kills take them in order (the CI test uses that)."""
    ctx = _context()
    rng = np.random.default_rng(seed)
    job = dict(RECORD_JOB)
    with _workdir(workdir, "tokdyn-kill-") as (root, phase):
        ref_store = str(root / "reference.zarr")
        (root / "ref").mkdir()
        life_s = _timed_reference(ctx, train_and_record, (job, ref_store, "r", str(root / "ref"), str(root / "phase")))
        ref = _read_run(ref_store, "r")
        assert ref["k"] == len(schedule(job["steps"])), "the reference run did not record its schedule"
        in_order = targets is not None and len(targets) == n_kills
        targets = targets or TARGETS
        out = {"kills": 0, "by_phase": Counter(), "lives": 0, "episodes": 0, "rows_lost": 0,
               "violations": [], "reference_rows": ref["k"], "reference_seconds": round(life_s, 2),
               "partial_files_left": 0}  # fmt: skip
        while out["kills"] < n_kills:
            ep = root / f"ep{out['episodes']}"
            ep.mkdir()
            store, prev_k = str(ep / "s.zarr"), 0
            for life in range(200):
                phase.reset()
                phase.rows = prev_k
                proc = ctx.Process(target=train_and_record, args=(job, store, "r", str(ep), str(root / "phase")))
                proc.start()
                seen = None
                if out["kills"] < n_kills:  # the last episode runs to its end once the kills are done
                    target = targets[out["kills"]] if in_order else str(rng.choice(targets))
                    seen = _kill_when(proc, phase, target, rng, life_s)
                proc.join()
                out["lives"] += 1
                got = _read_run(store, "r")
                k, bad = _compare(got, ref, phase.rows, prev_k)
                if seen is None:  # it finished on its own
                    if proc.exitcode != 0:
                        bad.append(f"life {life} exited with {proc.exitcode}")
                    elif k != ref["k"] or got["capacity"] != ref["capacity"]:
                        bad.append(f"finished with {k} rows (capacity {got and got['capacity']}); the reference has {ref['k']}")
                else:
                    out["kills"] += 1
                    out["by_phase"][seen] += 1
                out["rows_lost"] += max(0, max(phase.rows, prev_k) - k)
                out["violations"] += [f"episode {out['episodes']} life {life} (killed {seen}): {b}" for b in bad]
                prev_k = max(prev_k, k)
                if seen is None:
                    break
            else:
                out["violations"].append(f"episode {out['episodes']} never finished")
            out["episodes"] += 1
            out["partial_files_left"] += sum(1 for _ in Path(store).rglob("*.partial"))
            log(f"episode {out['episodes']}: {out['kills']} kills, {out['lives']} lives, {len(out['violations'])} violations")
        out["by_phase"] = dict(out["by_phase"])
        return out


def fit_harness(n_kills: int, *, seed: int = 0, job: dict | None = None, workdir: str | None = None, log=print) -> dict:
    """Kill `tokdyn fit` lives until ``n_kills`` kills; every restart must keep the done blocks
    and the end result must equal an uninterrupted fit."""
    import zarr

    from tokdyn.fit import FIT_FIELDS
    from tokdyn.fit.job import read_fit

    ctx = _context()
    rng = np.random.default_rng(seed)
    with _workdir(workdir, "tokdyn-fitkill-") as (root, phase):
        base = str(root / "base.zarr")
        job = dict(FIT_JOB, **(job or {}))
        make_fit_store(base, job)
        ref_store = str(root / "ref.zarr")
        shutil.copytree(base, ref_store)
        life_s = _timed_reference(ctx, run_fit_cli, (ref_store, str(root / "phase")))
        ref = read_fit(ref_store, "r")
        block = job["token_chunk"]
        out = {"kills": 0, "by_phase": Counter(), "lives": 0, "episodes": 0, "blocks_lost": 0, "violations": [],
               "reference_seconds": round(life_s, 2)}  # fmt: skip
        while out["kills"] < n_kills:
            store = str(root / f"ep{out['episodes']}.zarr")
            shutil.copytree(base, store)
            prev_done = 0
            for life in range(100):
                proc, seen = _fit_life(ctx, (store, str(root / "phase")), phase, out, kill=out["kills"] < n_kills,
                                       within=rng.uniform(0.05, life_s))  # fmt: skip
                bad = []
                g = zarr.open_group(store, path="runs/r", mode="r")  # below tokdyn: what is on disk
                done = g["fit/done"][...] if "fit" in g.group_keys() and "done" in g["fit"].array_keys() else np.zeros(0)
                n_done = int(np.count_nonzero(done))  # a flag names the code that fitted the block: counted, not summed
                if n_done < prev_done:
                    bad.append(f"{prev_done - n_done} done blocks lost")
                    out["blocks_lost"] += prev_done - n_done
                for b in np.flatnonzero(done):
                    for name in FIT_FIELDS:
                        a = g[f"fit/{name}"][b * block : (b + 1) * block]
                        if not np.array_equal(a, ref[name][b * block : (b + 1) * block], equal_nan=True):
                            bad.append(f"block {b} marked done but field {name} differs from the reference")
                prev_done = max(prev_done, n_done)
                if seen is None:
                    if proc.exitcode != 0:
                        bad.append(f"life {life} exited with {proc.exitcode}")
                    else:
                        got = read_fit(store, "r")
                        bad += [f"field {n} differs from the uninterrupted fit" for n in FIT_FIELDS
                                if not np.array_equal(got[n], ref[n], equal_nan=True)]  # fmt: skip
                _tally(out, "fit", life, seen, bad)
                if seen is None:
                    break
            out["episodes"] += 1
            log(f"fit episode {out['episodes']}: {out['kills']} kills, {out['lives']} lives, {len(out['violations'])} violations")
        out["by_phase"] = dict(out["by_phase"])
        return out


def _fit_life(ctx, args: tuple, phase: Phase, out: dict, *, kill: bool, within: float):
    """One life of `tokdyn fit` (:func:`run_fit_cli` with ``args``), SIGKILLed ``within``
    seconds if ``kill`` and it is still alive then; returns the process, joined, and the phase
    it was killed in (None: not killed)."""
    phase.reset()
    proc = ctx.Process(target=run_fit_cli, args=args)
    proc.start()
    seen = None
    if kill:
        deadline = time.monotonic() + within
        while proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
        if proc.is_alive():
            seen = FIT_PHASES[phase.get(_MAIN)]
            proc.kill()
    proc.join()
    out["lives"] += 1
    return proc, seen


def _tally(out: dict, what: str, life: int, seen: str | None, bad: list[str]) -> None:
    """Count a life's kill (by the phase it landed in) and its violations."""
    if seen is not None:
        out["kills"] += 1
        out["by_phase"][seen] += 1
    out["violations"] += [f"{what} episode {out['episodes']} life {life} (killed {seen}): {b}" for b in bad]


REFIT_AXIS_MIN = "10"  # the refit's window: other inputs than the fit it replaces, so old and new differ


def refit_harness(n_kills: int, *, seed: int = 0, job: dict | None = None, workdir: str | None = None, log=print) -> dict:
    """Kill `tokdyn fit --refit --axis-min 10` of a fitted run, then `tokdyn fit --axis-min 10`
    (which resumes the refit or finishes its swap; `--refit` again where the kill came before the
    refit had a group), until one life is not killed. After every life the run must read as one
    whole fit, the one it had or the uninterrupted refit, never a mix or an error, and once a
    life reads the refit no later one may read the old fit; the last must read the refit."""
    import zarr

    from tokdyn.fit import FIT_FIELDS
    from tokdyn.fit.job import read_fit

    ctx = _context()
    rng = np.random.default_rng(seed)
    refit = ("--axis-min", REFIT_AXIS_MIN)
    with _workdir(workdir, "tokdyn-refitkill-") as (root, phase):
        base = str(root / "base.zarr")
        job = dict(FIT_JOB, **(job or {}))
        make_fit_store(base, job)
        _timed_reference(ctx, run_fit_cli, (base, str(root / "phase")))
        old = read_fit(base, "r")
        ref_store = str(root / "ref.zarr")
        shutil.copytree(base, ref_store)
        life_s = _timed_reference(ctx, run_fit_cli, (ref_store, str(root / "phase"), (*refit, "--refit")))
        new = read_fit(ref_store, "r")

        def which(store: str) -> str | None:
            try:
                got = read_fit(store, "r")
            except Exception as exc:  # noqa: BLE001 - the violation is recorded with its message
                return f"error: {exc}"
            for name, fit in (("old", old), ("new", new)):
                if all(np.array_equal(got[f], fit[f], equal_nan=True) for f in FIT_FIELDS):
                    return name
            return "a mix of the two fits"

        out = {"kills": 0, "by_phase": Counter(), "lives": 0, "episodes": 0, "read_old": 0, "read_new": 0, "violations": [],
               "reference_seconds": round(life_s, 2)}  # fmt: skip
        while out["kills"] < n_kills:
            store = str(root / f"ep{out['episodes']}.zarr")
            shutil.copytree(base, store)
            seen_new = False
            for life in range(100):
                g = zarr.open_group(store, path="runs/r", mode="r")  # below tokdyn: is a refit (or its result) there?
                started = ("fit_next" in g.group_keys() and "tokdyn_fit" in g["fit_next"].attrs
                           or g["fit"].attrs["tokdyn_fit"].get("axis_min") is not None)  # fmt: skip
                proc, seen = _fit_life(ctx, (store, str(root / "phase"), refit if started else (*refit, "--refit")), phase, out,
                                       kill=out["kills"] < n_kills, within=rng.uniform(0.05, life_s))  # fmt: skip
                got, bad = which(store), []
                if got not in ("old", "new"):
                    bad.append(f"the run reads {got}")
                elif got == "old" and seen_new:
                    bad.append("the run reads the old fit after it had read the refit")
                else:
                    out[f"read_{got}"] += 1
                    seen_new |= got == "new"
                if seen is None:
                    if proc.exitcode != 0:
                        bad.append(f"life {life} exited with {proc.exitcode}")
                    elif got != "new":
                        bad.append(f"the finished refit reads {got}")
                    elif "fit_next" in zarr.open_group(store, path="runs/r", mode="r").group_keys():
                        bad.append("fit_next is left after the refit finished")
                _tally(out, "refit", life, seen, bad)
                if seen is None:
                    break
            out["episodes"] += 1
            log(f"refit episode {out['episodes']}: {out['kills']} kills, {out['lives']} lives, {len(out['violations'])} violations")
        out["by_phase"] = dict(out["by_phase"])
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=120, help="SIGKILLs of the recording job (default 120)")
    ap.add_argument("--fit-kills", type=int, default=20, help="SIGKILLs of tokdyn fit (default 20)")
    ap.add_argument("--refit-kills", type=int, default=20, help="SIGKILLs of tokdyn fit --refit of a fitted run (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    t0 = time.monotonic()
    log = lambda *a: print(*a, flush=True)  # noqa: E731 - progress lines reach a log file as they happen
    res = {"record": record_harness(args.kills, seed=args.seed, log=log), "fit": fit_harness(args.fit_kills, seed=args.seed, log=log),
           "refit": refit_harness(args.refit_kills, seed=args.seed, log=log)}  # fmt: skip
    res["seconds"] = round(time.monotonic() - t0, 1)
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 1 if any(res[k]["violations"] for k in ("record", "fit", "refit")) else 0


if __name__ == "__main__":
    raise SystemExit(main())
