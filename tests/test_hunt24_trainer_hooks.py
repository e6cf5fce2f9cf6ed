"""Recording hooks under the trainer features researchers turn on: a training restarted from an
earlier checkpoint than the run's last row (the Hugging Face ``Trainer``'s
``resume_from_checkpoint``, Lightning's ``ckpt_path``, a plain loop's ``attach``), the same
restart after a change (a divergence fixed by clipping or a lower rate), and the environment of
a distributed launch.

Each check compares against an independent answer: the rows an uninterrupted training stores,
the losses of the weights at a step computed apart from tokdyn, or the run the store must hold.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokdyn
from framework_fixtures import hf as _hf, lightning as _lightning
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.record import TokenLossRecorder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")

VOCAB, C = 257, 32
REPLAY = "this training is not the one that recorded it"


def read_run(path: str, name: str) -> tokdyn.Run:
    return tokdyn.open_store(path, mode="r").run(name)


def batch(seed: int, n: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, C + 1), generator=g)  # [B, C+1]


@pytest.fixture
def probe4() -> tokdyn.ProbeSet:
    return tokdyn.ProbeSet.from_tokens(np.random.default_rng(1).integers(0, VOCAB, (4, C + 1)))


def replay_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if REPLAY in str(w.message)]


# -- a plain loop restarted from an earlier checkpoint -------------------------------------


def _tiny() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=VOCAB, context=C, n_layer=1, n_head=2, n_embd=32))


def _train(model, opt, rec, first: int, last: int, *, lr_from: dict | None = None, start_step: int = 0):
    """Updates ``first..last`` (batches a function of the update), recorded through ``attach``;
    ``lr_from`` sets the rate from an update on (the researcher's change after a divergence)."""
    with rec.attach(opt, start_step=start_step):
        for update in range(first, last + 1):
            for g in opt.param_groups:
                g["lr"] = (lr_from or {}).get("lr", 1e-2) if update >= (lr_from or {}).get("update", 10**9) else 1e-2
            b = batch(update)
            loss = F.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()


@pytest.mark.parametrize("restart", [0, 3, 6])
@pytest.mark.parametrize("changed", [False, True])
def test_a_loop_restarted_from_an_earlier_checkpoint_is_compared_with_its_stored_rows(tmp_path, probe4, restart, changed):
    """A run recorded to step 8, restarted from the weights saved at ``restart`` (an earlier step
    than its last row). Replayed unchanged (a crash restart), the rows equal an uninterrupted run's
    and nothing is said. Changed (a lower rate from the restart on: a divergence fixed), the rows
    up to 8 are the first training's and those after it the second's: a warning names step 8, the
    last stored step the training reached again, and the measured difference."""
    store, schedule = str(tmp_path / "s.zarr"), [0, 1, 2, 4, 8, 9, 10]
    model = _tiny()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    saved = None
    with TokenLossRecorder(model, probe4, store, "r", schedule=schedule) as rec:
        with rec.attach(opt):
            for update in range(1, 9):
                if update - 1 == restart:
                    saved = ({k: v.clone() for k, v in model.state_dict().items()}, update - 1)
                b = batch(update)
                loss = F.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
                opt.zero_grad()
                loss.backward()
                opt.step()
    first_rows = read_run(store, "r").losses()
    model2 = _tiny()
    model2.load_state_dict(saved[0])
    opt2 = torch.optim.SGD(model2.parameters(), lr=1e-2)
    rec2 = TokenLossRecorder(model2, probe4, store, "r", schedule=schedule, resume=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rec2:
            _train(model2, opt2, rec2, restart + 1, 10, start_step=restart,
                   lr_from={"update": restart + 1, "lr": 3e-2} if changed else None)  # fmt: skip
    said = replay_warnings(caught)
    run = read_run(store, "r")
    assert run.steps.tolist() == schedule
    np.testing.assert_array_equal(run.losses()[:5], first_rows)  # the stored rows are kept either way
    if changed:
        assert len(said) == 1 and "at step 8" in said[0] and "nats" in said[0], said
    else:
        assert said == []
        # an uninterrupted training of 10 updates stores the same rows, bit for bit
        whole, model3 = str(tmp_path / "whole.zarr"), _tiny()
        with TokenLossRecorder(model3, probe4, whole, "r", schedule=schedule) as rec3:
            _train(model3, torch.optim.SGD(model3.parameters(), lr=1e-2), rec3, 1, 10)
        np.testing.assert_array_equal(run.losses(), read_run(whole, "r").losses())


def test_a_restarted_loop_whose_stored_row_is_nan_and_now_finite_is_said(tmp_path, probe4):
    """The run diverged (its last stored row NaN), the researcher restarts from before it with a
    fix: NaN against finite losses is a difference, named as such."""
    store = str(tmp_path / "s.zarr")
    model = _tiny()
    with TokenLossRecorder(model, probe4, store, "r", schedule=[0, 5, 9], commit_every=0) as rec:
        rec.record(0)
        with torch.no_grad():
            saved = {k: v.clone() for k, v in model.state_dict().items()}
            model.head.weight.fill_(float("nan")) if hasattr(model, "head") else next(model.parameters()).fill_(float("nan"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec.record(5)
    model.load_state_dict(saved)
    rec2 = TokenLossRecorder(model, probe4, store, "r", schedule=[0, 5, 9], resume=True)
    with pytest.warns(RuntimeWarning, match=r"at step 5.*token\(s\) finite in one and not the other"):
        rec2.maybe_record(5)
    rec2.close()


# -- the Hugging Face Trainer's resume_from_checkpoint --------------------------------------


def _gpt2(tf):
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=256, eos_token_id=256)
    return tf.GPT2LMHeadModel(cfg)


def _hf_trainer(tf, out, model, callbacks, **overrides):
    kwargs = dict(output_dir=str(out), use_cpu=True, report_to=[], per_device_train_batch_size=4, learning_rate=1e-3,
                  save_strategy="steps", save_steps=4, logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                  seed=0, max_steps=12)  # fmt: skip
    kwargs.update(overrides)
    data = [{"input_ids": s, "labels": s} for s in torch.cat([batch(k)[:, :C] for k in range(16)])]
    return tf.Trainer(model=model, args=tf.TrainingArguments(**kwargs), train_dataset=data, callbacks=callbacks)


@pytest.mark.parametrize("changed", [False, True])
def test_hf_resume_from_an_earlier_checkpoint_keeps_the_rows_and_says_a_changed_training(tmp_path, probe4, changed):
    """``trainer.train(resume_from_checkpoint=".../checkpoint-4")`` after the run recorded to step
    12: the Trainer replays updates 5..12, which are stored already and skipped. Unchanged, nothing
    is said (its weights at 12 give the stored row); with gradient clipping added (a divergence's
    usual fix, which the checkpoint does not hold) the rows up to 12 are another training's: said."""
    tf = _hf()
    from tokdyn.record.hf import TokdynTrainerCallback

    store, out = str(tmp_path / "s.zarr"), tmp_path / "out"
    model = _gpt2(tf)
    rec = TokenLossRecorder(model, probe4, store, "r", schedule=range(13), resume=True)
    _hf_trainer(tf, out, model, [TokdynTrainerCallback(rec)]).train()
    first = read_run(store, "r").losses()
    model2 = _gpt2(tf)
    rec2 = TokenLossRecorder(model2, probe4, store, "r", schedule=range(13), resume=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _hf_trainer(tf, out, model2, [TokdynTrainerCallback(rec2)], **({"max_grad_norm": 0.05} if changed else {})).train(
            resume_from_checkpoint=str(out / "checkpoint-4"))
    said = replay_warnings(caught)
    run = read_run(store, "r")
    assert run.steps.tolist() == list(range(13))
    np.testing.assert_array_equal(run.losses(), first)
    assert (len(said) == 1 and "at step 12" in said[0]) if changed else said == [], said


# -- Lightning's ckpt_path ------------------------------------------------------------------


def test_lightning_fit_from_an_earlier_ckpt_path_with_clipping_keeps_the_rows_and_says_so(tmp_path, probe4):
    """``Trainer(gradient_clip_val=...).fit(..., ckpt_path="step=4.ckpt")`` after the run recorded
    to step 12 (the fix of a divergence, from before it): the stored rows stay, and a warning says
    that the training reaching step 12 again is not the one that recorded it. (Lightning's plain
    resume from that checkpoint is not a replay either: its weights at step 12 differ, and the
    same warning rightly comes.)"""
    pl = _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    class Lit(pl.LightningModule):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def training_step(self, b, batch_idx):
            return F.cross_entropy(self.net(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    store, ck = str(tmp_path / "s.zarr"), str(tmp_path / "ck")

    def fit(net, ckpt=None, **kwargs):
        cb = TokdynLightningCallback(lambda: TokenLossRecorder(net, probe4, store, "r", schedule=range(13), resume=True))
        saver = pl.callbacks.ModelCheckpoint(dirpath=ck, every_n_train_steps=4, save_top_k=-1, filename="{step}")
        loader = torch.utils.data.DataLoader(torch.cat([batch(k) for k in range(16)]), batch_size=4)
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[cb, saver], max_steps=12, **kwargs)  # fmt: skip
        trainer.fit(Lit(net), loader, ckpt_path=ckpt)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(_tiny())
    first = read_run(store, "r").losses()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(_tiny(), ckpt=str(tmp_path / "ck" / "step=4.ckpt"), gradient_clip_val=0.05)
    said = replay_warnings(caught)
    assert len(said) == 1 and "at step 12" in said[0], said
    run = read_run(store, "r")
    assert run.steps.tolist() == list(range(13))
    np.testing.assert_array_equal(run.losses(), first)


# -- a distributed launch's environment -----------------------------------------------------


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_launchers_world_without_a_process_group_is_refused_before_the_store(tmp_path, probe4, monkeypatch, rank):
    """``WORLD_SIZE=2`` (torchrun, accelerate launch) with a recorder built before
    ``init_process_group``: each process took itself for the only writer, rank 0 wrote the whole
    run and rank 1 failed on its lock, said to be another job's. Now one line, before any store is
    made; ``rank=``/``world_size=`` given still record from this process alone."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    store = str(tmp_path / "s.zarr")
    with pytest.raises(tokdyn.errors.InputError, match=r"WORLD_SIZE=2, RANK=%s.*not initialised.*init_process_group" % rank):
        TokenLossRecorder(_tiny(), probe4, store, "r", schedule=[0])
    assert not (tmp_path / "s.zarr").exists()
    with TokenLossRecorder(_tiny(), probe4, store, "r", schedule=[0], rank=0, world_size=1) as rec:
        rec.maybe_record(0)
    assert read_run(store, "r").steps.tolist() == [0]
    monkeypatch.setenv("WORLD_SIZE", "1")
    with TokenLossRecorder(_tiny(), probe4, store, "r", schedule=[0, 1], resume=True) as rec:
        rec.maybe_record(1)
    assert read_run(store, "r").steps.tolist() == [0, 1]


@pytest.mark.parametrize("changed", [False, True])
def test_hf_the_same_trainer_resumed_from_an_earlier_checkpoint_in_the_process_is_compared_too(tmp_path, probe4, changed):
    """The same ``Trainer`` and callback (``close=False``) trained to step 12, then
    ``trainer.train(resume_from_checkpoint=".../checkpoint-4")`` in the same process, clipping
    added or not: the callback handed the replayed steps to no one (each at or before the last one
    it had seen), so even the check of a new recorder could not run. Now the same comparison."""
    tf = _hf()
    from tokdyn.record.hf import TokdynTrainerCallback

    store, out = str(tmp_path / "s.zarr"), tmp_path / "out"
    model = _gpt2(tf)
    rec = TokenLossRecorder(model, probe4, store, "r", schedule=range(13))
    trainer = _hf_trainer(tf, out, model, [TokdynTrainerCallback(rec, close=False)])
    trainer.train()
    first = read_run(store, "r").losses()
    if changed:
        trainer.args.max_grad_norm = 0.05
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    rec.close()
    said = replay_warnings(caught)
    assert (len(said) == 1 and "at step 12" in said[0]) if changed else said == [], said
    run = read_run(store, "r")
    assert run.steps.tolist() == list(range(13))
    np.testing.assert_array_equal(run.losses(), first)


def test_tokdyns_own_one_process_trainings_record_under_a_launchers_world_size(tmp_path, monkeypatch):
    """tokdyn's own loops (``record_tiny_run``: the demo's and the pilot's training; the
    mixture pilot; the A/B arms) train in one process: a ``WORLD_SIZE=2`` left in the
    environment (a job script's, a notebook started under a launcher) must not refuse them as
    it refuses a user's recorder built before its process group."""
    from tokdyn.data import Corpus
    from tokdyn.tokenizer import ByteTokenizer
    from tokdyn.train import TrainConfig, record_tiny_run

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    rng = np.random.default_rng(0)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 256, size=(2, 17)), tokenizer={"kind": "byte"})
    corpus = Corpus(rng.integers(0, 256, size=4000).astype(np.int32), probe, ByteTokenizer(), 1, 1)
    cfg = tokdyn.model.GPTConfig(vocab_size=257, context=16, n_layer=1, n_head=2, n_embd=16)
    record_tiny_run(str(tmp_path / "s.zarr"), corpus=corpus, model_config=cfg, progress=False, n_points=4,
                    train_config=TrainConfig(steps=8, batch_size=2))
    run = read_run(str(tmp_path / "s.zarr"), "tiny")
    assert run.n_committed >= 4 and run.steps[-1] == 8
    assert np.isfinite(run.losses()[-1]).all()
