"""Recording under torch.distributed: 2 CPU processes (gloo) each evaluate and write a disjoint,
chunk-aligned shard of the probe, and the run equals a single-process recording of the same.

The worker processes run this file as a script (``python test_distributed.py worker ...``), so
they need nothing from pytest; the parent builds the same seeded model and probe to compare.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import tokdyn
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.record import TokenLossRecorder, shard_ranges

SCHEDULE = [0, 1, 3, 7]
RUN = "ddp"


def build() -> tuple[TinyGPT, tokdyn.ProbeSet]:
    """The same seeded model and probe in every process."""
    rng = np.random.default_rng(7)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 257, size=(8, 33)), tokenizer={"kind": "byte"})
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=257, context=32, n_layer=1, n_head=2, n_embd=32)), probe


@torch.no_grad()
def advance(model: torch.nn.Module, step: int) -> None:
    """A deterministic stand-in for the training between two recorded steps."""
    g = torch.Generator().manual_seed(1000 + step)
    for p in model.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=g))


def record_all(model, probe, store, run, forward=None) -> None:
    kwargs = {} if forward is None else {"forward": forward}
    rec = TokenLossRecorder(model, probe, store, run, schedule=SCHEDULE, batch_size=3, **kwargs)
    for step in SCHEDULE:
        advance(model, step)
        rec.record(step, tokens_seen=step * 128, lr=1.0 / (step + 1))
    rec.close()


# -- the worker processes -------------------------------------------------------------------


def worker(rank: int, world: int, store: str, out: str, mode: str) -> None:
    # Rendezvous through a file (no port to pick); gloo then talks over loopback (GLOO_SOCKET_IFNAME=lo).
    init = f"file://{Path(out, 'rendezvous')}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        model, probe = build()
        _rank_timing(rank, mode)
        prompts = {tuple(row): s for s, row in enumerate(np.asarray(probe.tokens)[:, :-1].tolist())}
        evaluated: set[int] = set()

        def spy(m, x):  # which probe sequences this rank evaluates
            evaluated.update(prompts[tuple(row)] for row in x.tolist())
            return m(x)

        record_all(model, probe, store, RUN, forward=spy)
        Path(out, f"rank{rank}.json").write_text(json.dumps({"evaluated": sorted(evaluated)}))
    finally:
        dist.destroy_process_group()


def _rank_timing(rank: int, mode: str) -> None:
    """Order the ranks around run creation (see test_run_creation_has_no_race_between_ranks).

    ``safe``: rank 0 creates the run late. ``race``: rank 1 looks for the run late, after rank 0
    created it (the start-up race the recorder once had: both orders must work).
    """
    if mode == "safe" and rank == 0:
        create = tokdyn.TrajectoryStore.create_run

        def late_create(self, *args, **kwargs):
            time.sleep(0.3)
            return create(self, *args, **kwargs)

        tokdyn.TrajectoryStore.create_run = late_create
    if mode == "race" and rank == 1:
        runs = tokdyn.TrajectoryStore.runs.fget

        def late_runs(self):
            time.sleep(0.5)
            return runs(self)

        tokdyn.TrajectoryStore.runs = property(late_runs)


def run_workers(tmp_path: Path, store: str, *, mode: str, world: int = 2, timeout: float = 120) -> list[subprocess.CompletedProcess]:
    out = tmp_path / f"out-{mode}"
    out.mkdir()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(r), str(world), store, str(out), mode],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        for r in range(world)
    ]
    results = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                stdout, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, _ = p.communicate()
                stdout += f"\n[killed after {timeout} s]"
            results.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, ""))
    finally:
        for p in procs:  # only on an unexpected error above
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


# -- the tests ------------------------------------------------------------------------------


def _skip_without_gloo():
    import pytest

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")


def test_two_gloo_ranks_write_disjoint_chunk_aligned_shards_equal_to_one_process(tmp_path):
    _skip_without_gloo()
    store = str(tmp_path / "store.zarr")
    results = run_workers(tmp_path, store, mode="safe")
    for r, res in enumerate(results):
        assert res.returncode == 0, f"rank {r} failed:\n{res.stdout[-4000:]}"

    # The single-process reference: the same model, probe and steps, in this process.
    model, probe = build()
    record_all(model, probe, store, "single")

    st = tokdyn.open_store(store, mode="r")
    ddp, single = st.run(RUN), st.run("single")
    assert ddp.steps.tolist() == single.steps.tolist() == SCHEDULE
    for name in ("tokens_seen", "lr"):
        np.testing.assert_array_equal(ddp.coord(name), single.coord(name))
    # Not bit-exact in general: a rank forwards its own sequences, so the batches (and with them
    # the matmul blocking) differ from the single process's; the math per token is the same.
    np.testing.assert_allclose(ddp.losses(), single.losses(), rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(ddp.losses())) and not np.allclose(ddp.losses()[0], ddp.losses()[-1])

    chunk, ranges = shard_ranges(probe.n_sequences, probe.context, 2)
    assert len(ddp.writers) == 2 and ddp.writers == [tuple(r) for r in ranges]
    assert ddp.writers[0][0] == 0 and ddp.writers[-1][1] == probe.n_tokens
    assert all(start % ddp.token_chunk == 0 for start, _ in ddp.writers)
    assert ddp.token_chunk == chunk and ddp.attrs["world_size"] == 2
    assert ddp.capacity == len(SCHEDULE)

    # Each rank evaluated exactly the sequences of its own token range.
    c = probe.context
    for r, (start, stop) in enumerate(ddp.writers):
        evaluated = json.loads((tmp_path / "out-safe" / f"rank{r}.json").read_text())["evaluated"]
        assert evaluated == list(range(start // c, stop // c))


def test_run_creation_has_no_race_between_ranks(tmp_path):
    """Rank 1 looks for the run only after rank 0 has created it: both must still agree."""
    _skip_without_gloo()
    results = run_workers(tmp_path, str(tmp_path / "store.zarr"), mode="race", timeout=90)
    for r, res in enumerate(results):
        assert res.returncode == 0, f"rank {r} failed:\n{res.stdout[-4000:]}"


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    rank, world, store, out, mode = sys.argv[2:7]
    worker(int(rank), int(world), store, out, mode)
