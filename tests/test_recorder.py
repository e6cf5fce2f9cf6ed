"""The plain-loop recorder: schedule, hook hygiene, model mode, exact losses, resume, failures.

Every loss check compares against an independent answer: ``F.cross_entropy`` computed one
sequence at a time on the same weights (the ``reference_losses`` fixture).
"""

from __future__ import annotations

import contextlib
import copy
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokdyn
from tokdyn.errors import InputError, ProbeMismatchError, RunExistsError, StepOrderError, TokdynError, WriterError
from tokdyn.record import TokenLossRecorder
from tokdyn.store import RunWriter


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    x, y = batch[:, :-1], batch[:, 1:]
    logits = model(x)  # (B, C, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """A deterministic weight change, so consecutive rows differ."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(scale * torch.randn(p.shape, generator=g))


def read_run(path: str, name: str) -> tokdyn.Run:
    return tokdyn.open_store(path, mode="r").run(name)


# -- attach(): the optimizer-hook API -------------------------------------------------------


def test_attach_records_exactly_the_scheduled_steps_with_exact_losses(tiny_model, probe, store_path, train_batches, reference_losses):
    schedule = [0, 1, 2, 3, 5, 8, 12]
    lr0, tokens_per_step = 1e-2, 4 * 32
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=lr0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1 + k))  # update k+1 uses lr0 / (k + 1)
    weights = {0: copy.deepcopy(tiny_model.state_dict())}
    with TokenLossRecorder(tiny_model, probe, store_path, "loop", schedule=schedule, batch_size=3) as rec:
        with rec.attach(opt, tokens_per_step=tokens_per_step):
            for step, batch in enumerate(train_batches(15), start=1):  # runs past the last scheduled step
                train_step(tiny_model, opt, batch)
                sched.step()
                weights[step] = copy.deepcopy(tiny_model.state_dict())
        assert rec.n_recorded == len(schedule)
        # its own time on the training thread: the forwards inside record(), the hook on the other steps
        assert 0 < rec.forward_seconds <= rec.record_seconds and rec.hook_seconds > 0

    run = read_run(store_path, "loop")
    assert run.steps.tolist() == schedule
    assert run.coord("tokens_seen").tolist() == [s * tokens_per_step for s in schedule]
    # lr of the update that produced the weights of step s (step 0: the first update's lr)
    np.testing.assert_allclose(run.coord("lr"), [lr0 / max(s, 1) for s in schedule], rtol=1e-12)
    losses = run.losses()
    assert losses.shape == (len(schedule), probe.n_tokens) and losses.dtype == np.float32
    check = copy.deepcopy(tiny_model)
    for row, step in enumerate(schedule):
        check.load_state_dict(weights[step])
        np.testing.assert_allclose(losses[row], reference_losses(check, probe.tokens), rtol=1e-6, atol=1e-6)
    assert not np.allclose(losses[0], losses[-1])  # training moved the losses


def test_attach_removes_exactly_its_hook_even_when_the_loop_raises(tiny_model, probe, store_path, train_batches):
    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    user_calls = []
    opt.register_step_post_hook(lambda o, args, kwargs: user_calls.append(1))  # the user's own hook
    before = dict(opt._optimizer_step_post_hooks)
    batches = iter(train_batches(8))
    rec = TokenLossRecorder(tiny_model, probe, store_path, "hooks", schedule=[0, 1, 2, 3, 100])

    with rec.attach(opt):  # a clean exit
        assert len(opt._optimizer_step_post_hooks) == len(before) + 1
        train_step(tiny_model, opt, next(batches))
    assert dict(opt._optimizer_step_post_hooks) == before

    with pytest.raises(RuntimeError, match="boom"):
        with rec.attach(opt, start_step=1):
            assert len(opt._optimizer_step_post_hooks) == len(before) + 1
            for step in (2, 3, 4):
                train_step(tiny_model, opt, next(batches))
                if step == 3:
                    raise RuntimeError("boom")
    assert dict(opt._optimizer_step_post_hooks) == before  # same handles, same callables

    n_user = len(user_calls)
    train_step(tiny_model, opt, next(batches))  # after detaching: the user's hook still runs, ours does not
    assert len(user_calls) == n_user + 1
    assert rec.n_recorded == 4
    rec.close()
    assert read_run(store_path, "hooks").steps.tolist() == [0, 1, 2, 3]


def test_recorder_context_manager_keeps_rows_and_does_not_mask_the_training_error(tiny_model, probe, store_path):
    with pytest.raises(KeyError, match="train"):
        with TokenLossRecorder(tiny_model, probe, store_path, "cm", schedule=[0, 1, 2]) as rec:
            rec.record(0)
            raise KeyError("train")
    assert read_run(store_path, "cm").steps.tolist() == [0]
    rec.close()  # idempotent
    with pytest.raises(InputError, match="closed"):
        rec.record(1)


# -- model mode -----------------------------------------------------------------------------


def test_record_evaluates_in_eval_mode_and_restores_the_mode(tiny_model, probe, store_path):
    seen = []

    def spy(model, x):
        seen.append([m.training for m in model.modules()])
        return model(x)

    rec = TokenLossRecorder(tiny_model, probe, store_path, "mode", schedule=[0, 1, 2], forward=spy, batch_size=3)
    tiny_model.train()
    rec.record(0)
    assert all(m.training for m in tiny_model.modules())
    tiny_model.eval()
    rec.record(1)
    assert not any(m.training for m in tiny_model.modules())  # left in eval, stays in eval
    assert len(seen) == 2 * 3 and not any(any(s) for s in seen)  # every probe forward ran in eval mode

    def broken(model, x):
        raise ValueError("forward failed")

    tiny_model.train()
    rec.forward = broken
    with pytest.raises(ValueError, match="forward failed"):
        rec.record(2)
    assert all(m.training for m in tiny_model.modules())  # restored on error too
    rec.close()


def test_record_restores_per_submodule_modes(tiny_model, probe, store_path):
    tiny_model.train()
    tiny_model.blocks.eval()  # e.g. a frozen backbone during fine-tuning
    with TokenLossRecorder(tiny_model, probe, store_path, "frozen", schedule=[0]) as rec:
        rec.record(0)
    assert tiny_model.training and not tiny_model.blocks.training


# -- resume and step order -----------------------------------------------------------------


def test_resume_skips_committed_steps_and_appends_later_ones(tiny_model, probe, store_path):
    schedule = [0, 1, 2, 4, 8]
    with TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=schedule) as rec:
        for step in range(3):
            perturb(tiny_model, step)
            assert rec.maybe_record(step)
    first = read_run(store_path, "r").losses().copy()

    with pytest.raises(RunExistsError, match="resume=True"):
        TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=schedule)

    with TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=schedule, resume=True) as rec:
        assert rec.last_step == 2
        recorded = []
        for step in range(10):  # the restarted loop replays from 0
            perturb(tiny_model, 100 + step)
            if rec.maybe_record(step):
                recorded.append(step)
    assert recorded == [4, 8]

    run = read_run(store_path, "r")
    assert run.steps.tolist() == schedule  # no duplicates, in order
    losses = run.losses()
    np.testing.assert_array_equal(losses[:3], first)  # committed rows untouched
    assert np.all(np.isfinite(losses)) and not np.allclose(losses[3], losses[2])


def test_steps_at_or_before_the_last_committed_one_are_refused(tiny_model, probe, store_path):
    with TokenLossRecorder(tiny_model, probe, store_path, "order", schedule=[0, 5, 10]) as rec:
        rec.record(5)

    run = tokdyn.open_store(store_path, mode="r+").run("order")
    with pytest.raises(RunExistsError):
        run.writer()  # a fresh writer must say it resumes
    writer = run.writer(resume=True)
    row = np.ones(run.n_tokens, np.float32)
    for step in (5, 3):
        with pytest.raises(StepOrderError, match="not after the last committed step 5"):
            writer.append(row, step=step)
    assert run.steps.tolist() == [5]

    # The same refusal through the recorder's explicit record(): raised there, or surfaced from
    # the writer as a WriterError caused by it.
    rec = TokenLossRecorder(tiny_model, probe, store_path, "order", schedule=[0, 5, 10], resume=True)
    with pytest.raises((StepOrderError, WriterError)) as info:
        rec.record(5)
        rec.flush()
    err = info.value
    assert isinstance(err, StepOrderError) or isinstance(err.__cause__, StepOrderError)
    with pytest.raises(WriterError) if isinstance(err, WriterError) else contextlib.nullcontext():
        rec.close()
    assert read_run(store_path, "order").steps.tolist() == [5]


def test_maybe_record_twice_for_one_step_records_once(tiny_model, probe, store_path, monkeypatch):
    original = RunWriter.append_rows  # every write goes through it (append too)

    def slow_append(self, *args, **kwargs):  # a slow disk: the commit lands after the second call
        time.sleep(0.2)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RunWriter, "append_rows", slow_append)
    rec = TokenLossRecorder(tiny_model, probe, store_path, "dup", schedule=[0, 1])
    assert rec.maybe_record(1)
    assert not rec.maybe_record(1)  # e.g. gradient accumulation: one optimizer step, several batch ends
    rec.close()


# -- commit_every: rows written and committed together -----------------------------------------


def test_waiting_rows_are_committed_in_order_by_flush_and_close(tiny_model, probe, tmp_path, monkeypatch):
    """Rows wait for commit_every; flush() and close() write them at once, none lost, none
    reordered, each equal to the row written on its own (commit_every=0), with queue_size=1 so the
    writer takes rows off a full queue while others wait."""
    blocks = []
    original = RunWriter.append_rows

    def counting(self, losses, rows, **kw):
        blocks.append([r["step"] for r in rows])
        return original(self, losses, rows, **kw)

    monkeypatch.setattr(RunWriter, "append_rows", counting)
    schedule, flush_after = list(range(0, 40, 2)), {6, 8, 20, 34}
    for every in (0, 3600):
        model = copy.deepcopy(tiny_model)
        rec = TokenLossRecorder(model, probe, str(tmp_path / f"{every}.zarr"), "r", schedule=schedule,
                                queue_size=1, commit_every=every)  # fmt: skip
        blocks.clear()
        for step in schedule:
            perturb(model, step)
            rec.record(step, lr=step / 100)
            if step in flush_after:
                rec.flush()
                assert rec.last_step == step  # committed when flush returns
                assert read_run(str(tmp_path / f"{every}.zarr"), "r").steps.tolist() == [s for s in schedule if s <= step]
            elif every:
                assert read_run(str(tmp_path / f"{every}.zarr"), "r").n_committed < schedule.index(step) + 1  # still waiting
        rec.close()  # writes the rows recorded after the last flush
        assert sum(blocks, []) == schedule
        assert len(blocks) == (len(schedule) if every == 0 else len(flush_after) + 1)
    one, many = read_run(str(tmp_path / "0.zarr"), "r"), read_run(str(tmp_path / "3600.zarr"), "r")
    assert many.steps.tolist() == schedule
    np.testing.assert_array_equal(many.losses(), one.losses())
    np.testing.assert_array_equal(many.coord("lr"), one.coord("lr"))


def test_rows_are_committed_after_commit_every_without_flush(tiny_model, probe, store_path):
    rec = TokenLossRecorder(tiny_model, probe, store_path, "due", schedule=[0, 1, 2], commit_every=0.2)
    for step in (0, 1):
        rec.record(step)
    deadline = time.monotonic() + 60
    while rec.last_step != 1 and time.monotonic() < deadline:  # the writer commits them on its own
        time.sleep(0.02)
    assert rec.last_step == 1 and read_run(store_path, "due").steps.tolist() == [0, 1]
    rec.record(2)
    rec.close()
    assert read_run(store_path, "due").steps.tolist() == [0, 1, 2]


def test_commit_every_is_validated(tiny_model, probe, store_path):
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(TokdynError, match="commit_every"):
            TokenLossRecorder(tiny_model, probe, store_path, "bad", schedule=[0], commit_every=bad)


# -- failures -------------------------------------------------------------------------------


@pytest.mark.parametrize("first_call", ["maybe_record", "flush", "close"])
def test_writer_failure_surfaces_as_writer_error_and_committed_rows_stay_readable(
    first_call, tiny_model, probe, store_path, monkeypatch
):
    rec = TokenLossRecorder(tiny_model, probe, store_path, "full", schedule=[0, 1, 2, 3])
    for step in (0, 1):
        perturb(tiny_model, step)
        rec.maybe_record(step)
    rec.flush()
    good = read_run(store_path, "full").losses().copy()

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunWriter, "append_rows", disk_full)
    assert rec.maybe_record(2)  # queued; the write fails in the background

    def raise_first():
        if first_call == "maybe_record":  # poll with an unscheduled step until the failure is seen
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                rec.maybe_record(999)
                time.sleep(0.01)
            pytest.fail("the writer failure never surfaced")
        getattr(rec, first_call)()

    with pytest.raises(WriterError, match="No space left on device") as info:
        raise_first()
    assert isinstance(info.value, RuntimeError) and isinstance(info.value.__cause__, OSError)
    assert "step 1" in str(info.value)  # says what is committed
    for later in (lambda: rec.maybe_record(3), rec.flush, rec.close):  # and keeps saying it
        with pytest.raises(WriterError):
            later()
    monkeypatch.undo()

    run = read_run(store_path, "full")
    assert run.steps.tolist() == [0, 1]
    np.testing.assert_array_equal(run.losses(), good)


def test_nonfinite_losses_are_stored_as_nan_counted_and_warned(tiny_model, probe, store_path, reference_losses):
    c = probe.context
    bad = [(0, 3), (1, 5), (2, 7)]  # (sequence, position) of the poisoned predictions

    def poisoned(model, x):
        logits = model(x).clone()  # (B, C, V): the whole probe in one batch
        logits[0, 3, :] = float("nan")  # NaN loss
        logits[1, 5, :] = float("inf")  # inf - inf: NaN loss
        target = int(probe.tokens[2, 8])
        logits[2, 7, :] = float("-inf")
        logits[2, 7, (target + 1) % logits.shape[-1]] = 0.0  # the target has probability 0: +inf loss
        return logits

    with pytest.warns(RuntimeWarning, match="non-finite"):
        with TokenLossRecorder(tiny_model, probe, store_path, "nan", schedule=[0, 1], forward=poisoned) as rec:
            rec.record(0)
            perturb(tiny_model, 0)
            rec.record(1)

    run = read_run(store_path, "nan")
    assert run.steps.tolist() == [0, 1]
    assert run.nonfinite() == (6, {0: 3, 1: 3})
    losses = run.losses()
    idx = [s * c + p for s, p in bad]
    assert np.isnan(losses[:, idx]).all()
    ok = np.setdiff1d(np.arange(probe.n_tokens), idx)
    np.testing.assert_allclose(losses[1, ok], reference_losses(tiny_model, probe.tokens)[ok], rtol=1e-6, atol=1e-6)


def test_float16_run_stores_float16(tiny_model, probe, store_path, reference_losses):
    with TokenLossRecorder(tiny_model, probe, store_path, "half", schedule=[0], dtype="float16") as rec:
        rec.record(0)
    run = read_run(store_path, "half")
    assert run.dtype == np.float16 and run.losses().dtype == np.float16
    np.testing.assert_allclose(run.losses()[0], reference_losses(tiny_model, probe.tokens), rtol=1e-3)


def test_a_different_probe_is_refused(tiny_model, probe, store_path):
    with TokenLossRecorder(tiny_model, probe, store_path, "a", schedule=[0]) as rec:
        rec.record(0)
    other = tokdyn.ProbeSet.from_tokens(np.asarray(probe.tokens)[::-1].copy(), tokenizer=probe.tokenizer)
    with pytest.raises(ProbeMismatchError, match="fingerprint"):
        TokenLossRecorder(tiny_model, other, store_path, "b", schedule=[0])
    with pytest.raises(ProbeMismatchError):
        TokenLossRecorder(tiny_model, other, tokdyn.open_store(store_path, mode="r+"), "b", schedule=[0])
    assert tokdyn.open_store(store_path, mode="r").runs == ["a"]


# -- dtype on resume, capacity with several ranks, rows at interpreter exit ----------------


def test_resume_keeps_the_stored_dtype_and_refuses_another(tiny_model, probe, store_path):
    with TokenLossRecorder(tiny_model, probe, store_path, "h", schedule=[0, 1], dtype="float16") as rec:
        rec.record(0)
    with pytest.raises(tokdyn.InputError, match="stores float16"):
        TokenLossRecorder(tiny_model, probe, store_path, "h", schedule=[0, 1], resume=True, dtype="float32")
    with TokenLossRecorder(tiny_model, probe, store_path, "h", schedule=[0, 1], resume=True) as rec:
        rec.record(1)
    run = read_run(store_path, "h")
    assert run.dtype == np.float16 and run.steps.tolist() == [0, 1]


def test_full_multi_rank_run_refuses_at_the_call(tiny_model, probe, store_path):
    # rank 0 of 2 without a process group: barriers are no-ops, the run gets two writers.
    rec = TokenLossRecorder(tiny_model, probe, store_path, "ddp", schedule=[0, 1], rank=0, world_size=2)
    rec.record(0)
    rec.record(1)
    with pytest.raises(tokdyn.StoreError, match="allocated 2 rows"):
        rec.record(2)  # not in the schedule: the preallocated run has no room, said here, not in the writer
    rec.flush()


@pytest.mark.parametrize("ending, code", [("pass", 0), ("raise RuntimeError('training crashed')", 1)])
def test_rows_queued_at_exit_are_written(tmp_path, ending, code):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import time, numpy as np, torch, tokdyn
        from tokdyn.model import GPTConfig, TinyGPT
        from tokdyn.record import TokenLossRecorder
        from tokdyn.store import RunWriter
        slow = RunWriter.append_rows
        def append_rows(self, *a, **k):
            time.sleep(0.2)  # a slow disk: rows are still queued when the script ends
            return slow(self, *a, **k)
        RunWriter.append_rows = append_rows
        torch.manual_seed(0)
        probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 257, (4, 17)))
        model = TinyGPT(GPTConfig(context=16, n_layer=1, n_head=2, n_embd=16))
        rec = TokenLossRecorder(model, probe, {str(tmp_path / 's.zarr')!r}, "r", schedule=[0, 1, 2])
        for s in (0, 1, 2):
            rec.record(s)
        # no close(): the script just ends, or crashes
        {ending}
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert read_run(str(tmp_path / "s.zarr"), "r").steps.tolist() == [0, 1, 2]
