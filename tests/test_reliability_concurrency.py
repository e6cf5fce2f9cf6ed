"""Several processes on one run: four DDP ranks writing disjoint token ranges at once give the
store a single writer gives; two writers of the same token range are refused, never interleaved."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tokdyn
from reliability_fixtures import kill_harness, live_foreign_owner, put_lock, raw, read_lock
from test_store import make_probe, row_values
from tokdyn.errors import RunBusyError, RunExistsError, WriterError
from tokdyn.record import TokenLossRecorder

SCHEDULE = [0, 1, 2, 4, 8]
WORLD = 4


def _record(store: str, run: str, out: str, rank: int = 0, world: int = 1) -> None:
    """The recording job of one process (one DDP rank when ``world > 1``): a seeded model whose
    weights move deterministically between the scheduled steps."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    if world > 1:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))  # fmt: skip
    try:
        probe, model, _ = kill_harness._build(dict(kill_harness.RECORD_JOB, n_seq=16))
        # batch_size=1: every process forwards each sequence alone, so losses are bit-identical
        with TokenLossRecorder(model, probe, store, run, schedule=SCHEDULE, batch_size=1) as rec:
            for step in SCHEDULE:
                g = torch.Generator().manual_seed(step)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(0.05 * torch.randn(p.shape, generator=g))
                rec.record(step, tokens_seen=100 * step, lr=1.0 / (step + 1))
        Path(out, f"done{rank}").write_text(json.dumps(rec.n_recorded))
    finally:
        if world > 1:
            dist.destroy_process_group()


def test_four_ranks_writing_at_once_equal_a_single_writer(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    ctx = kill_harness._context()
    store = str(tmp_path / "s.zarr")
    single = ctx.Process(target=_record, args=(store, "single", str(tmp_path)))
    single.start()
    single.join(120)
    assert single.exitcode == 0
    ranks = [ctx.Process(target=_record, args=(store, "ddp", str(tmp_path), r, WORLD)) for r in range(WORLD)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(180)
    assert [p.exitcode for p in ranks] == [0] * WORLD
    st = tokdyn.open_store(store, mode="r")
    ddp, one = st.run("ddp"), st.run("single")
    assert len(ddp.writers) == WORLD and len(one.writers) == 1
    assert ddp.steps.tolist() == one.steps.tolist() == SCHEDULE
    for name in ("axis_value", "tokens_seen", "lr"):
        np.testing.assert_array_equal(ddp.coord(name), one.coord(name))
    np.testing.assert_array_equal(ddp.losses(), one.losses())  # bit for bit
    assert ddp.nonfinite() == one.nonfinite() == (0, {})
    assert not list(Path(store).rglob("writer.lock"))  # every rank released its lock


# -- two writers of one token range -----------------------------------------------------------


def _hold_writer(store: str, ready: str, release: str) -> None:
    """Append one row, then hold the writer open until told to stop."""
    st = tokdyn.open_store(store, mode="r+")
    w = st.run("r").writer(resume=True)
    w.append(row_values(1, st.probe.n_tokens), step=1)
    Path(ready).write_text("1")
    while not Path(release).exists():
        time.sleep(0.01)
    w.append(row_values(2, st.probe.n_tokens), step=2)
    w.release()


def _start_holder(tmp_path: Path):
    """A store with run ``r`` and a separate process holding its writer (one row appended)."""
    probe = make_probe()
    store = str(tmp_path / "s.zarr")
    tokdyn.open_store(store, probe, mode="a").create_run("r")
    holder = kill_harness._context().Process(target=_hold_writer, args=(store, str(tmp_path / "ready"), str(tmp_path / "release")))
    holder.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and holder.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return probe, store, holder


def test_a_second_process_appending_to_the_same_run_is_refused(tmp_path):
    probe, store, holder = _start_holder(tmp_path)
    try:
        run = tokdyn.open_store(store, mode="r+").run("r")
        with pytest.raises(RunBusyError, match=rf"being written by process {holder.pid} .*refused rather than interleaved"):
            run.writer(resume=True)
        with pytest.raises(RunBusyError):  # the recorder says the same, at construction
            TokenLossRecorder(torch.nn.Linear(1, 1), probe, store, "r", schedule=[0, 5], resume=True)
        (tmp_path / "release").write_text("1")
        holder.join(60)
        assert holder.exitcode == 0
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join()
    run = tokdyn.open_store(store, mode="r").run("r")
    assert run.steps.tolist() == [1, 2]  # only the holder's rows, in order
    np.testing.assert_array_equal(run.losses(), np.stack([row_values(s, probe.n_tokens) for s in (1, 2)]))


def test_a_sigkilled_writer_lock_is_taken_over(tmp_path):
    probe, store, holder = _start_holder(tmp_path)
    holder.kill()  # SIGKILL: the lock stays behind, its process is gone
    holder.join()
    assert list(Path(store).rglob("writer.lock"))
    w = tokdyn.open_store(store, mode="r+").run("r").writer(resume=True)
    w.append(row_values(5, probe.n_tokens), step=5)
    assert tokdyn.open_store(store, mode="r").run("r").steps.tolist() == [1, 5]


def test_an_earlier_writer_of_this_process_is_superseded_and_stops(tmp_path):
    probe = make_probe()
    run = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a").create_run("r")
    first = run.writer()
    first.append(row_values(0, probe.n_tokens), step=0)
    second = run.writer(resume=True)  # e.g. a restarted loop in the same interpreter
    second.append(row_values(1, probe.n_tokens), step=1)
    with pytest.raises(RunBusyError, match="no longer holds its lock"):
        first.append(row_values(2, probe.n_tokens), step=2)
    assert run.steps.tolist() == [0, 1]


def test_a_recorder_superseded_by_another_stops_with_a_writer_error(tiny_model, probe, store_path):
    rec1 = TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=[0, 1, 2, 3])
    rec1.record(0)
    rec1.flush()
    rec2 = TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=[0, 1, 2, 3], resume=True)
    rec2.record(1)
    rec2.flush()
    rec1.record(2)
    with pytest.raises(WriterError, match="no longer holds its lock"):
        rec1.flush()
    rec2.close()
    assert tokdyn.open_store(store_path, mode="r").run("r").steps.tolist() == [0, 1]


def test_commits_by_another_writer_stop_this_one(tmp_path):
    """Even with the lock lost silently (e.g. an object store without exclusive writes), a
    writer that finds rows committed behind its back stops before writing."""
    probe = make_probe()
    run = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a").create_run("r")
    w = run.writer()
    w.append(row_values(0, probe.n_tokens), step=0)
    raw(run.store, "runs/r/commits/w0").update_attributes({"rows": 2, "last_step": 7})  # what another writer's commit looks like
    with pytest.raises(RunBusyError, match="appended to by another writer"):
        w.append(row_values(1, probe.n_tokens), step=1)


def test_a_lock_from_another_machine_is_refused_until_broken(tmp_path):
    probe = make_probe()
    run = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a").create_run("r")
    lock = "runs/r/commits/w0/writer.lock"
    put_lock(run.store, lock, {**live_foreign_owner(), "host": "gpu-node-17"})
    with pytest.raises(RunBusyError, match=r"gpu-node-17.*cannot tell whether it still runs.*break_lock"):
        run.writer()
    put_lock(run.store, lock, live_foreign_owner(), exclusive=False)  # a live process on this machine
    with pytest.raises(RunBusyError, match="wait for it to finish"):
        run.writer()
    run.break_lock()
    assert read_lock(run.store, lock) is None
    with run.writer() as w:
        w.append(row_values(0, probe.n_tokens), step=0)
    with pytest.raises(RunExistsError):  # the usual rule still comes first
        run.writer()
