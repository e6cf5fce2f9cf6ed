"""Hunt 24 review: what the merged hunt-24 branches refused or did otherwise for a legitimate
user, each failing on the merge before its fix."""

from __future__ import annotations

import numpy as np
import pytest

from tokdyn.schedule import explicit_schedule, geometric_schedule


@pytest.mark.parametrize("steps", [{300, 100, 200}, frozenset({100, 200, 300}), {100: "a", 200: "b", 300: "c"}.keys()],
                         ids=["set", "frozenset", "dict keys"])  # fmt: skip
def test_an_explicit_schedule_of_a_set_is_its_steps_sorted(steps):
    """explicit_schedule took any iterable of steps (np.asarray(list(steps))); hunt 24's as_values
    read a set or dict keys as one object ('expected integers, got dtype object')."""
    assert explicit_schedule(steps).tolist() == sorted(steps)


def test_a_schedule_made_by_a_union_of_schedules():
    """The union of a geometric schedule and extra steps, written as sets, is a schedule."""
    extra = {250, 750}
    assert explicit_schedule(set(geometric_schedule(1000, 5).tolist()) | extra).tolist() == sorted(
        set(geometric_schedule(1000, 5).tolist()) | extra)


def test_a_plain_resume_of_a_float16_run_whose_replay_differs_by_kernel_noise_says_nothing(tmp_path):
    """A resumed recorder evaluates the probe again at the run's last stored step and warns where
    a token's loss differs by more than 1e-3 nats (REPLAY_TOLERANCE). In a float16 run the stored
    losses are rounded to steps of 0.004 nats (near 5 nats): a replay of the same weights that
    differs by kernel noise (another thread count, a GPU's non-deterministic reductions; here
    1e-4 of each weight, under 1e-4 nats on every token) crossed a rounding boundary on some
    tokens, and the warning said the training was 'not the one that recorded it', by 0.0039 nats."""
    import warnings

    import numpy as np
    import torch

    import tokdyn
    from tokdyn.model import GPTConfig, TinyGPT
    from tokdyn.record import TokenLossRecorder
    from tokdyn.record.recorder import REPLAY_TOLERANCE, token_losses

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=257, context=32, n_layer=1, n_head=2, n_embd=32))
    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(1).integers(0, 257, (32, 33)))
    store = str(tmp_path / "s.zarr")
    with TokenLossRecorder(model, probe, store, "r", schedule=[0, 8, 16], dtype="float16") as rec:
        rec.maybe_record(0)
        rec.maybe_record(8)
    before = token_losses(model, torch.as_tensor(probe.tokens).long()).numpy()
    with torch.no_grad():  # the same weights, as a replay on other kernels computes with them
        for p in model.parameters():
            p.mul_(1 + 1e-4 * torch.randn_like(p))
    after = token_losses(model, torch.as_tensor(probe.tokens).long()).numpy()
    assert np.abs(after - before).max() < REPLAY_TOLERANCE / 10  # the premise: noise, not another training
    rounded = np.abs(after.astype(np.float16).astype(np.float32) - before.astype(np.float16).astype(np.float32))
    assert rounded.max() > REPLAY_TOLERANCE  # ... which float16's rounding makes a step of 0.004 nats
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with TokenLossRecorder(model, probe, store, "r", schedule=[0, 8, 16], resume=True) as rec2:
            rec2.maybe_record(8)  # the resumed training at the run's last stored step
            rec2.maybe_record(16)
    assert not [str(w.message) for w in caught if "not the one that recorded it" in str(w.message)]
    assert tokdyn.open_store(store, mode="r").run("r").steps.tolist() == [0, 8, 16]


def test_a_folder_whose_every_checkpoint_is_named_tmp_is_recorded(tmp_path):
    """Hunt 24 skips a checkpoint file under a temporary name (tmp_step_30.pt beside step_20.pt:
    a save not yet renamed into place). A folder whose every checkpoint is so named (a scratch
    run's tmp_ckpt_100.pt, 200, 300) has no final names to wait for: it was recorded before hunt
    24 and then said 'no checkpoints in ...'. It is recorded again, by the steps in the names; a
    temporary name beside final ones is still skipped."""
    import torch

    from tokdyn.record.offline.discovery import discover_checkpoints

    for s in (100, 200, 300):
        torch.save({"w": torch.zeros(2)}, tmp_path / f"tmp_ckpt_{s}.pt")
    assert [(r.step, r.path.name) for r in discover_checkpoints(tmp_path)] == [
        (100, "tmp_ckpt_100.pt"), (200, "tmp_ckpt_200.pt"), (300, "tmp_ckpt_300.pt")]
    torch.save({"w": torch.zeros(2)}, tmp_path / "step_400.pt")
    with pytest.warns(UserWarning, match="saves still being written"):
        assert [r.step for r in discover_checkpoints(tmp_path)] == [400]


@pytest.mark.parametrize("predicted, measured", [(np.ones((3, 4)), np.ones(4)), (np.ones(5), np.ones(4)), (np.ones(4), np.ones((4, 1))),
                                                 (np.float64(1.0), np.ones(1))])
def test_scores_of_curves_of_other_shapes_is_one_input_error(predicted, measured):
    """``reconstruct.scores`` of a 2-D array, or of two curves of other lengths, was an IndexError
    or a broadcast R^2 over a grid no curve has; it is one line naming both shapes."""
    from tokdyn.errors import InputError
    from tokdyn.reconstruct import scores

    with pytest.raises(InputError, match="two curves of one length"):
        scores(predicted, measured)
    assert scores(np.arange(4.0), np.arange(4.0))["r2"] == 1.0
