"""Crashes and failing disks: SIGKILLed recording and fitting (the kill harness in a reduced
form), a writer thread whose disk fills up or refuses writes, aborted creations, and the
resume rule that keeps a restart from skipping rows.

The full harness (`python pipelines/kill_harness.py --kills 120 --fit-kills 20`) gives the
figures in docs/reliability.md; here every kill target is hit once.
"""

from __future__ import annotations

import errno
import json
import warnings

import numpy as np
import pytest
import torch

import tokdyn
from reliability_fixtures import FailingDisk, kill_harness, raw, snapshot
from test_recorder import perturb
from tokdyn.errors import WriterError
from tokdyn.record import TokenLossRecorder
from tokdyn.store.locks import CREATING, owner


def test_sigkilled_recording_resumes_equal_to_an_uninterrupted_run(tmp_path):
    """A SIGKILL while creating the store and run, in a row's chunk writes, in a row's commit,
    and at a random instant (the full harness adds training, evaluation, checkpoints, close)."""
    targets = ["opening", "writing", "committing", "random"]
    res = kill_harness.record_harness(len(targets), seed=1, targets=targets, workdir=str(tmp_path), log=lambda *_: None)
    assert res["violations"] == [], res["violations"]
    assert res["kills"] == len(targets) and res["rows_lost"] == 0
    assert res["partial_files_left"] == 0  # what a kill in a write leaves, the next writer removes
    assert res["episodes"] >= 1  # at least one run went from kills to a complete, reference-equal store
    # A targeted kill lands in its phase unless the wait for it timed out; most must have.
    assert sum(res["by_phase"].get(t, 0) for t in targets[:-1]) >= 2, res["by_phase"]


@pytest.mark.slow  # ~10 s; CI keeps test_store_fit's interrupted-fit resume, the full harness kills fits 20 times
def test_sigkilled_fit_resumes_equal_to_an_uninterrupted_fit(tmp_path):
    res = kill_harness.fit_harness(1, seed=2, job=dict(n_tokens=2000, token_chunk=250), workdir=str(tmp_path), log=lambda *_: None)
    assert res["violations"] == [], res["violations"]
    assert res["kills"] == 1 and res["blocks_lost"] == 0


def test_sigkilled_refit_keeps_one_whole_fit_and_resumes(tmp_path):
    """`tokdyn fit --refit` of a fitted run SIGKILLed at random instants: after every life the
    run reads as the fit it had or the finished refit, whole (docs/reliability.md: before, a
    killed refit left no fit to read), and `tokdyn fit` with the refit's options finishes it."""
    res = kill_harness.refit_harness(3, seed=4, job=dict(n_tokens=2000, token_chunk=250), workdir=str(tmp_path), log=lambda *_: None)
    assert res["violations"] == [], res["violations"]
    assert res["kills"] == 3 and res["read_old"] >= 1 and res["read_new"] >= 1


# -- a writer thread that fails -------------------------------------------------------------


def _record(rec: TokenLossRecorder, model, step: int) -> None:
    perturb(model, step)
    rec.record(step)


@pytest.mark.parametrize(
    "err, where",
    [
        (errno.ENOSPC, "chunk"),  # disk full while a row's second chunk is written: half a row on disk
        (errno.EACCES, "commit"),  # permission lost on the commit record: the whole row on disk, uncommitted
    ],
)
def test_failing_disk_surfaces_in_training_and_keeps_committed_rows(err, where, tiny_model, probe, store_path, monkeypatch, reference_losses):
    c = probe.context
    disk = FailingDisk(monkeypatch, err, match=(lambda k: "/loss/c/" in k and k.endswith("/1")) if where == "chunk"
                       else (lambda k: k.endswith("commits/w0/zarr.json")))  # fmt: skip
    rec = TokenLossRecorder(tiny_model, probe, store_path, "disk", schedule=range(10), token_chunk=2 * c)
    expected = []
    for step in range(3):
        _record(rec, tiny_model, step)
        expected.append(reference_losses(tiny_model, probe.tokens))
    rec.flush()
    before = snapshot(store_path)
    disk.armed = True
    _record(rec, tiny_model, 3)
    with pytest.raises(WriterError) as info:
        rec.flush()
    msg = str(info.value)
    assert ("No space left on device" if err == errno.ENOSPC else "Permission denied") in msg
    assert "Rows up to step 2 are committed and readable" in msg
    assert disk.failures >= 1
    # Readable up to the last committed row, those rows untouched, nothing of the failed row visible.
    run = tokdyn.open_store(store_path, mode="r").run("disk")
    assert run.steps.tolist() == [0, 1, 2]
    np.testing.assert_allclose(run.losses(), np.stack(expected), rtol=1e-6, atol=1e-6)
    after = snapshot(store_path)
    committed_chunks = [n for n in before if n.startswith(("runs/disk/loss/c/0/", "runs/disk/loss/c/1/", "runs/disk/loss/c/2/"))]
    assert len(committed_chunks) == 3 * probe.n_tokens // (2 * c)
    assert all(after[n] == before[n] for n in committed_chunks)
    with pytest.raises(WriterError):
        rec.close()
    # The disk comes back: a resumed recorder in the same process takes over and goes on.
    disk.armed = False
    with TokenLossRecorder(tiny_model, probe, store_path, "disk", schedule=range(10), resume=True) as rec2:
        _record(rec2, tiny_model, 4)
    run = tokdyn.open_store(store_path, mode="r").run("disk")
    assert run.steps.tolist() == [0, 1, 2, 4]
    np.testing.assert_allclose(run.losses()[3], reference_losses(tiny_model, probe.tokens), rtol=1e-6, atol=1e-6)


# -- creation killed half-way ---------------------------------------------------------------


def _dead_owner() -> dict:
    who = owner()
    who["pid"] = 2**22 + 12345  # above the default pid_max: no such process
    return who


def test_a_store_whose_creation_was_killed_is_created_again(tmp_path, probe):
    url = tmp_path / "s.zarr"
    st = tokdyn.open_store(url, probe, mode="a")
    raw(st).attrs.put({CREATING: _dead_owner()})  # what a creator killed before its last write leaves
    with pytest.raises(tokdyn.NotAStoreError):
        tokdyn.open_store(url, mode="r")  # not a store (yet): readers never see half a probe
    again = tokdyn.open_store(url, probe, mode="a")  # the recorder's call: starts again
    assert again.probe.fingerprint == probe.fingerprint and again.runs == []


def test_a_run_whose_creation_was_killed_is_replaced(tmp_path, probe):
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a")
    st.create_run("r")
    raw(st, "runs/r").attrs.put({CREATING: _dead_owner()})  # killed before the run metadata was written
    assert not st.has_run("r") and "r" in st.runs
    assert "error" in st.info()["runs"]["r"]  # visible as broken, not as a run
    run = st.create_run("r", capacity=2)
    assert st.has_run("r") and run.n_committed == 0


def test_a_store_being_created_by_a_live_process_is_not_taken(tmp_path, probe):
    from reliability_fixtures import live_foreign_owner

    url = tmp_path / "s.zarr"
    raw(tokdyn.open_store(url, probe, mode="a")).attrs.put({CREATING: live_foreign_owner()})
    with pytest.raises(tokdyn.errors.RunBusyError, match="being created by process"):
        tokdyn.open_store(url, probe, mode="a")


# -- resume: a training checkpoint saved while rows were queued ------------------------------


def test_resume_warns_about_scheduled_steps_it_can_never_record(tiny_model, probe, store_path):
    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    with TokenLossRecorder(tiny_model, probe, store_path, "gap", schedule=[0, 1, 2, 5, 8, 12]) as rec:
        rec.record(0)
        rec.record(1)
    rec = TokenLossRecorder(tiny_model, probe, store_path, "gap", schedule=[0, 1, 2, 5, 8, 12], resume=True)
    with pytest.warns(RuntimeWarning, match=r"scheduled steps \[2, 5\] .* last committed step 1 and start_step 6.*flush"):
        with rec.attach(opt, start_step=6):
            pass
    rec.close()


def test_commit_record_is_one_json_document(tmp_path, probe):
    """The commit is one zarr.json write (atomic rename locally): rows and last_step together."""
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a")
    with st.create_run("r").writer() as w:
        w.append(np.ones(probe.n_tokens, np.float32), step=3)
    doc = json.loads((tmp_path / "s.zarr" / "runs" / "r" / "commits" / "w0" / "zarr.json").read_text())
    assert doc["attributes"]["rows"] == 1 and doc["attributes"]["last_step"] == 3
    assert not (tmp_path / "s.zarr" / "runs" / "r" / "commits" / "w0" / "writer.lock").exists()  # released


# -- temporary files of killed writes -------------------------------------------------------


def _append_until_killed(url: str, stuck: str) -> None:
    """Child: append rows, and hang inside the rename of the first write whose key ends with
    ``stuck``, its temporary ``*.partial`` file on disk, as a kill during that write leaves it."""
    import time
    from pathlib import Path

    original = Path.replace

    def replace(self, target):
        if str(self).endswith(".partial") and str(target).endswith(stuck):
            time.sleep(600)
        return original(self, target)

    Path.replace = replace
    st = tokdyn.open_store(url, mode="r+")
    with st.run("r").writer(resume=True) as w:
        for step in range(10, 20):
            w.append(np.full(st.probe.n_tokens, float(step)), step=step)


@pytest.mark.parametrize("stuck", ["/c/1/0", "w0/zarr.json"], ids=["chunk write", "commit"])
def test_partial_files_of_a_killed_write_are_removed_by_the_next_writer(stuck, tmp_path, probe):
    """zarr writes a key to ``<name>.<hex>.partial`` and renames it; a SIGKILL in between left the
    file behind for good. The next writer of the range removes it once it holds the lock."""
    import multiprocessing as mp
    import time
    from pathlib import PurePosixPath

    url = str(tmp_path / "s.zarr")
    st = tokdyn.open_store(url, probe, mode="a")
    with st.create_run("r", capacity=4, token_chunk=128).writer() as w:
        w.append(np.ones(probe.n_tokens), step=1)
    proc = mp.get_context("forkserver").Process(target=_append_until_killed, args=(url, stuck))
    proc.start()

    # the stuck write's temporary file, <key less its extension>.<hex>.partial: the child's
    # other writes leave theirs for microseconds too, and a kill after seeing one of those
    # found nothing left (a flaky failure)
    stem = PurePosixPath(stuck).with_suffix("").as_posix()

    def stuck_partials():
        return [p for p in (tmp_path / "s.zarr").rglob("*.partial")
                if p.as_posix().rsplit(".", 2)[0].endswith(stem)]

    deadline = time.monotonic() + 60
    while not stuck_partials() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.kill()
    proc.join()
    assert stuck_partials(), "the child never reached the write"
    with tokdyn.open_store(url, mode="r+").run("r").writer(resume=True) as w:
        assert not list((tmp_path / "s.zarr").rglob("*.partial"))
        w.append(np.full(probe.n_tokens, 99.0), step=99)
    run = tokdyn.open_store(url, mode="r").run("r")
    assert run.steps[0] == 1 and run.steps[-1] == 99 and run.losses()[-1, 0] == 99.0


def test_partial_files_of_another_live_writer_are_left_alone(tmp_path, probe):
    """With several token ranges, a writer removes only its own range's temporary files, and only
    when the lock it took was free or a crashed process's: another range may be writing now."""
    from reliability_fixtures import live_foreign_owner, put_lock

    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="a")
    n = probe.n_tokens
    st.create_run("r", capacity=2, token_chunk=128, writers=[(0, 128), (128, n)])
    hexname = "0123456789abcdef" * 2
    root = tmp_path / "s.zarr" / "runs" / "r"
    planted = {"mine": root / "loss" / "c" / "0" / f"0.{hexname}.partial", "mine commit": root / "commits" / "w0" / f"zarr.{hexname}.partial",
               "coordinates": root / "step" / "c" / f"0.{hexname}.partial", "other range": root / "loss" / "c" / "0" / f"1.{hexname}.partial",
               "other commit": root / "commits" / "w1" / f"zarr.{hexname}.partial", "fit": root / "fit" / "mu" / "c" / f"0.{hexname}.partial"}  # fmt: skip
    for path in planted.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    put_lock(st, "runs/r/commits/w0/writer.lock", _dead_owner())  # range 0: killed
    put_lock(st, "runs/r/commits/w1/writer.lock", live_foreign_owner())  # range 1: writing now
    st.run("r").writer(writer=0, resume=True).release()
    left = {k for k, p in planted.items() if p.exists()}
    assert left == {"other range", "other commit", "fit"}


# -- the Resume guide's script, killed ------------------------------------------------------


def _text_or_empty(path) -> str:
    """The text of a file another process may remove at any instant (a writer lock released between
    a check and a read): empty when it is not there."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _guide_script(tmp_path):
    """The restartable training script of docs/recording.md (Resume), as a file."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "recording.md").read_text()
    code = doc.split("<!-- resumable-training-script -->\n```python\n", 1)[1].split("\n```", 1)[0]
    path = tmp_path / "train_resumable.py"
    path.write_text(code)
    return path


def test_the_resume_guides_script_killed_at_random_instants_equals_an_uninterrupted_run(tmp_path):
    """SIGKILL the guide's script three times at random instants of its training, run it again
    each time, and compare the store with one uninterrupted life: same steps, and bit-identical
    losses, learning rates and tokens seen."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = _guide_script(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}

    def committed_rows(store: str) -> int:
        try:
            return tokdyn.open_store(store, mode="r").run("tiny").n_committed
        except tokdyn.TokdynError:  # no store or run yet (the script creates them)
            return 0

    def life(store: str, workdir: Path, kill_after: int | None = None, delay: float = 0.0) -> bool:
        """One run of the script; with ``kill_after``, SIGKILLed ``delay`` seconds after the
        run has that many committed rows (progress, not a clock: a loaded machine slows the
        script, and a kill timed against another life's speed could come after it finished).
        Returns whether it finished on its own."""
        workdir.mkdir(exist_ok=True)
        p = subprocess.Popen([sys.executable, str(script), store, str(workdir), "200"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        deadline = time.monotonic() + 300
        while p.poll() is None and time.monotonic() < deadline:
            if kill_after is not None and committed_rows(store) >= kill_after:
                time.sleep(delay)
                p.kill()
                p.communicate()
                return False
            time.sleep(0.02)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
        return True

    assert life(str(tmp_path / "ref.zarr"), tmp_path / "ref")
    total = committed_rows(str(tmp_path / "ref.zarr"))
    assert total > 10
    rng = np.random.default_rng(7)
    store, kills, committed = str(tmp_path / "s.zarr"), 0, []
    for _ in range(3):  # three kills at random points of the training, each after the last
        lo = committed_rows(store) + 1
        if not life(store, tmp_path / "w", kill_after=int(rng.integers(lo, max(lo + 1, total - 3))),
                    delay=float(rng.uniform(0.0, 0.05))):  # fmt: skip
            kills += 1
            committed.append(committed_rows(store))
    assert life(store, tmp_path / "w")
    ref, got = tokdyn.open_store(tmp_path / "ref.zarr", mode="r").run("tiny"), tokdyn.open_store(store, mode="r").run("tiny")
    assert kills == 3 and got.n_committed == ref.n_committed > 10
    assert any(0 < k < ref.n_committed for k in committed), committed  # at least one kill landed mid-run
    np.testing.assert_array_equal(got.steps, ref.steps)
    np.testing.assert_array_equal(got.losses(), ref.losses())
    for name in ("lr", "tokens_seen", "axis_value"):
        np.testing.assert_array_equal(got.coord(name), ref.coord(name))
    assert not list(Path(store).rglob("*.partial"))


def test_a_row_recorded_on_entry_after_a_restart_gets_no_borrowed_learning_rate(tiny_model, probe, store_path, train_batches):
    """A restart whose checkpoint was saved without flush() lost the row of its own step c; the
    resumed attach(start_step=c) records it on entry. The optimizer then holds update c+1's rate
    (its scheduler has stepped): that rate was stored as step c's, silently. Now NaN, and a warning."""
    import copy

    batches = train_batches(8)
    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (k + 1))  # a different rate every update

    def update(b) -> None:
        loss = torch.nn.functional.cross_entropy(tiny_model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()

    schedule = [0, 1, 2, 3, 4, 5]
    rec = TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=schedule)
    with rec.attach(opt):  # records 0, 1, 2 with the rates of updates 1, 1, 2
        for b in batches[:2]:
            update(b)
    rec.close()
    update(batches[2])  # update 3, whose row is lost with the process (no flush before the checkpoint)
    saved = copy.deepcopy((tiny_model.state_dict(), opt.state_dict(), sched.state_dict()))
    rates_after_3 = opt.param_groups[0]["lr"]  # update 4's rate
    tiny_model.load_state_dict(saved[0])
    rec = TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=schedule, resume=True)
    with pytest.warns(RuntimeWarning, match="step 3 was never committed.*unknown learning rate"):
        with rec.attach(opt, start_step=3):
            update(batches[3])
    rec.close()
    run = tokdyn.open_store(store_path, mode="r").run("r")
    assert run.steps.tolist() == [0, 1, 2, 3, 4]
    lr = run.coord("lr")
    assert np.isnan(lr[3]) and lr[4] == rates_after_3  # step 3's rate is unknown; step 4's is update 4's
    assert lr[0] == lr[1] == 0.1 and lr[2] == 0.05


def test_the_trainer_callbacks_take_no_rate_at_a_resumed_start(tiny_model, probe, store_path):
    """The same for the Trainer and Lightning callbacks, which record on entry at the step
    training begins at: only at step 0 is the optimizer's rate the one of the row's update."""
    from tokdyn.record._adapter import RecorderBinding

    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    rec = TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=[0, 5])
    binding = RecorderBinding(rec, close=True, tokens_per_step=None, placement_hint="")
    binding.start(opt, step=5)
    assert binding.lr is None
    binding.start(opt, step=0)
    assert binding.lr == 0.1
    rec.close()


def test_a_trainer_step_that_jumps_over_scheduled_steps_is_said_once(tiny_model, probe, store_path):
    """Lightning's manual optimization with two optimizers moves global_step by 2 a batch: the
    callbacks saw steps 0, 2, 4, ... and the scheduled odd steps were silently never recorded."""
    from tokdyn.record._adapter import RecorderBinding

    rec = TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=[0, 1, 2, 3, 4])
    binding = RecorderBinding(rec, close=True, tokens_per_step=None, placement_hint="")
    binding.start(None, step=0)
    binding.record(0)
    with pytest.warns(RuntimeWarning, match=r"went from 0 to 2 .*past scheduled steps \[1\]"):
        binding.record(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        binding.record(4)  # said once
    rec.close()
    assert tokdyn.open_store(store_path).run("r").steps.tolist() == [0, 2, 4]
