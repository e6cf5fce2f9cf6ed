"""Online recording as a researcher's own training jobs meet it: a module that works on a mode
switch, a loop that runs ``opt.step()`` inside autocast, a second training with the same callback,
a checkpoint saved by the Hugging Face ``Trainer``, and a resumed training whose rows were lost.

Each check compares against an independent answer: the same training without the recorder, the
losses of each step's weights computed in float32 one sequence at a time, or the rows the store
must hold.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tokdyn
from framework_fixtures import hf as _hf, lightning as _lightning
from tokdyn.errors import InputError
from tokdyn.record import TokenLossRecorder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

VOCAB, C = 257, 32


def read_run(path: str, name: str) -> tokdyn.Run:
    return tokdyn.open_store(path, mode="r").run(name)


def batch(seed: int, n: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, C + 1), generator=g)  # [B, C+1]


def loss_of(model: nn.Module, b: torch.Tensor) -> torch.Tensor:
    logits = model(b[:, :-1])  # (B, C, V)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))


# -- a module that does work when its mode switches -----------------------------------------


class MergingLoRA(nn.Linear):
    """loralib's LoRA layer in brief: ``train(False)`` merges the low-rank update ``B @ A`` into the
    frozen weight (and the forward then skips it), ``train(True)`` takes it out again."""

    def __init__(self, n_in: int, n_out: int, r: int = 2):
        super().__init__(n_in, n_out)
        self.weight.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(r, n_in) * 0.1)
        self.B = nn.Parameter(torch.zeros(n_out, r))
        self.merged = False

    def train(self, mode: bool = True):
        super().train(mode)
        if mode and self.merged:
            self.weight.data -= self.B @ self.A
            self.merged = False
        elif not mode and not self.merged:
            self.weight.data += self.B @ self.A
            self.merged = True
        return self

    def forward(self, x):
        out = super().forward(x)
        return out if self.merged else out + x @ (self.B @ self.A).T


class LoRANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(0.3)
        self.head = MergingLoRA(16, VOCAB)

    def forward(self, x):  # (B, T) -> (B, T, V)
        return self.head(self.drop(self.emb(x)))


def _updates(model: nn.Module, opt: torch.optim.Optimizer, ks) -> None:
    """One optimizer update of ``model`` on ``batch(k)`` for each ``k``."""
    for k in ks:
        opt.zero_grad()
        loss_of(model, batch(k)).backward()
        opt.step()


def _train_lora(store: str | None, steps: int = 6) -> LoRANet:
    torch.manual_seed(0)
    model = LoRANet().train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(1).integers(0, VOCAB, (4, C + 1)))
    rec = TokenLossRecorder(model, probe, store, "lora", schedule=range(steps + 1)) if store else None
    with rec or contextlib.nullcontext(), rec.attach(opt) if rec else contextlib.nullcontext():
        for k in range(steps):
            loss = loss_of(model, batch(k))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def test_a_module_that_works_on_a_mode_switch_trains_as_without_the_recorder(tmp_path):
    """The probe is evaluated in eval mode; putting the model back through each module's own
    ``train()`` takes a merged LoRA update out of the weight again, so training goes on as it
    would have without recording (a restore that only set ``.training`` left it merged: the
    update counted twice in the weight's place and no gradient reached the LoRA factors)."""
    plain = _train_lora(None)
    recorded = _train_lora(str(tmp_path / "s.zarr"))
    assert not recorded.head.merged and recorded.training and recorded.head.training
    for name, p in plain.state_dict().items():
        torch.testing.assert_close(recorded.state_dict()[name], p, rtol=0, atol=1e-6, msg=name)
    assert plain.head.B.abs().max() > 1e-3  # the LoRA factors did train
    assert read_run(str(tmp_path / "s.zarr"), "lora").steps.tolist() == list(range(7))


def test_modes_are_restored_per_module_through_train():
    """A frozen part stays in eval mode, the rest goes back to train mode, each through train()."""
    calls: list[tuple[str, bool]] = []

    class Spy(nn.Linear):
        tag = ""

        def train(self, mode=True):
            calls.append((self.tag, mode))
            return super().train(mode)

    model = nn.Sequential(Spy(4, 4), Spy(4, 4)).train()
    model[0].tag, model[1].tag = "a", "b"
    model[1].eval()  # frozen
    calls.clear()
    tokdyn.record.token_losses(model, torch.zeros(1, 5, dtype=torch.long), forward=lambda m, x: torch.zeros(*x.shape, 8))
    assert model.training and model[0].training and not model[1].training
    assert ("a", True) in calls  # switched back through its own train(), not by setting .training


# -- autocast around opt.step() -------------------------------------------------------------


def test_rows_recorded_inside_an_autocast_region_hold_the_float32_losses(tmp_path, reference_losses):
    """A loop that wraps the whole step, ``opt.step()`` too, in ``torch.autocast``: the hook's
    probe forwards run outside it, so every row holds the losses of the weights in their own
    precision, like step 0 (recorded on entry, outside the region)."""
    from tokdyn.model import GPTConfig, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=VOCAB, context=C, n_layer=1, n_head=2, n_embd=32)).train()
    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(2).integers(0, VOCAB, (6, C + 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    weights = {0: copy.deepcopy(model.state_dict())}
    store = str(tmp_path / "s.zarr")
    with TokenLossRecorder(model, probe, store, "amp", schedule=[0, 1, 3]) as rec, rec.attach(opt):
        for k in range(1, 4):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model, batch(k))
                opt.zero_grad()
                loss.backward()
                opt.step()  # the hook records here, inside the region
            weights[k] = copy.deepcopy(model.state_dict())
    run = read_run(store, "amp")
    assert run.steps.tolist() == [0, 1, 3]
    check = copy.deepcopy(model)
    for row, step in zip(run.losses(), run.steps.tolist()):
        check.load_state_dict(weights[step])
        np.testing.assert_allclose(row, reference_losses(check, probe.tokens), rtol=1e-5, atol=1e-5)


# -- a second training with the same recorder -----------------------------------------------


def _gpt2(tf):
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=256, eos_token_id=256)
    return tf.GPT2LMHeadModel(cfg)


def _hf_trainer(tf, tmp_path, model, callbacks, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path / "hf-out"), use_cpu=True, report_to=[], per_device_train_batch_size=4,
        learning_rate=1e-3, save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    kwargs.update(overrides)
    data = [{"input_ids": s, "labels": s} for s in torch.cat([batch(k)[:, :C] for k in range(16)])]
    return tf.Trainer(model=model, args=tf.TrainingArguments(**kwargs), train_dataset=data, callbacks=callbacks)


def _lit(pl, net):
    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, b, batch_idx):
            return loss_of(self.net, b)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    return Lit()


def _lit_trainer(pl, callbacks, max_steps):
    return pl.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)  # fmt: skip


def _lit_fit(trainer, module):
    loader = torch.utils.data.DataLoader(torch.cat([batch(k) for k in range(16)]), batch_size=4, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)


def test_hf_a_second_train_from_step_0_is_refused_before_it_trains(tmp_path, probe, store_path):
    """``trainer.train()`` again without resuming counts from step 0 while the model keeps its
    weights: its rows would be numbered wrong (before: steps up to the first training's last one
    skipped, and 8 and 10 stored holding the weights of 13 and 15 updates)."""
    tf = _hf()
    from tokdyn.record.hf import TokdynTrainerCallback

    model = _gpt2(tf)
    rec = TokenLossRecorder(model, probe, store_path, "hf", schedule=[0, 2, 5, 8, 10])
    trainer = _hf_trainer(tf, tmp_path, model, [TokdynTrainerCallback(rec, close=False)], max_steps=5)
    trainer.train()
    trainer.args.max_steps = 10
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(InputError, match="training begins at step 0, but this callback already recorded run 'hf' up to step 5"):
        trainer.train()
    assert all(torch.equal(p, before[k]) for k, p in model.state_dict().items())  # refused before any update
    rec.close()
    assert read_run(store_path, "hf").steps.tolist() == [0, 2, 5]


def test_lightning_a_new_trainer_from_step_0_is_refused_and_the_same_trainer_continues(tiny_model, probe, store_path,
                                                                                      reference_losses):  # fmt: skip
    """A second ``fit`` on the same Trainer continues its step count (rows 8 and 10 are right); a
    new Trainer counts from 0 again on weights that kept training, and is refused."""
    pl = _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    module = _lit(pl, tiny_model)
    cb = TokdynLightningCallback(TokenLossRecorder(tiny_model, probe, store_path, "lit", schedule=[0, 2, 5, 8, 10]), close=False)
    trainer = _lit_trainer(pl, [cb], max_steps=5)
    _lit_fit(trainer, module)
    trainer.fit_loop.epoch_loop.max_steps = 10
    _lit_fit(trainer, module)
    assert trainer.global_step == 10
    with pytest.raises(InputError, match="training begins at step 0"):
        _lit_fit(_lit_trainer(pl, [cb], max_steps=12), module)
    cb.recorder.close()
    run = read_run(store_path, "lit")
    assert run.steps.tolist() == [0, 2, 5, 8, 10]
    np.testing.assert_allclose(run.losses()[-1], reference_losses(tiny_model, probe.tokens), rtol=1e-6, atol=1e-6)


def test_a_second_loop_attached_from_step_0_is_refused(tiny_model, probe, store_path):
    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    with TokenLossRecorder(tiny_model, probe, store_path, "loop", schedule=[0, 1, 2, 4, 6]) as rec:
        with rec.attach(opt):
            _updates(tiny_model, opt, range(3))
        with pytest.raises(InputError, match=r"attach\(start_step=0\), but this recorder already recorded run 'loop' up to step 2"):
            with rec.attach(opt):
                pass
        with rec.attach(opt, start_step=3):  # the count continued: step 4 is the 4th update's weights
            _updates(tiny_model, opt, range(3, 4))
    assert read_run(store_path, "loop").steps.tolist() == [0, 1, 2, 4]


def test_a_closed_recorder_is_refused_when_training_begins_again(tiny_model, probe, store_path):
    """The callback closed the recorder at the first training's end; a second ``fit`` is refused
    at its start in one line (before: a TokdynError at the first scheduled step past the first
    training's last, after training up to it; or no row at all and no word when it ended earlier)."""
    pl = _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    module = _lit(pl, tiny_model)
    cb = TokdynLightningCallback(TokenLossRecorder(tiny_model, probe, store_path, "lit", schedule=[0, 2, 5, 8, 10]))
    trainer = _lit_trainer(pl, [cb], max_steps=5)
    _lit_fit(trainer, module)
    trainer.fit_loop.epoch_loop.max_steps = 10
    with pytest.raises(InputError, match="the recorder of run 'lit' was closed when an earlier training ended"):
        _lit_fit(trainer, module)
    assert trainer.global_step == 5  # refused before it trained
    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    with pytest.raises(tokdyn.TokdynError, match="the recorder of run 'lit' is closed"):
        with cb.recorder.attach(opt, start_step=5):
            pass


def test_a_factory_builds_the_recorder_again_for_a_second_training(tiny_model, probe, store_path, reference_losses):
    pl = _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    module = _lit(pl, tiny_model)
    made = []

    def factory():
        made.append(TokenLossRecorder(tiny_model, probe, store_path, "lit", schedule=[0, 2, 5, 8, 10], resume=True))
        return made[-1]

    cb = TokdynLightningCallback(factory)
    trainer = _lit_trainer(pl, [cb], max_steps=5)
    _lit_fit(trainer, module)
    trainer.fit_loop.epoch_loop.max_steps = 10
    _lit_fit(trainer, module)
    assert len(made) == 2 and made[1]._closed
    run = read_run(store_path, "lit")
    assert run.steps.tolist() == [0, 2, 5, 8, 10]
    np.testing.assert_allclose(run.losses()[-1], reference_losses(tiny_model, probe.tokens), rtol=1e-6, atol=1e-6)


# -- checkpoints and resumes ----------------------------------------------------------------


def test_hf_commits_the_rows_before_the_trainer_writes_a_checkpoint(tmp_path, probe, store_path):
    """Rows wait up to ``commit_every``; the Trainer calls ``on_save`` only after writing the
    checkpoint, so a process killed between the two left a checkpoint ahead of the store."""
    tf = _hf()
    from tokdyn.record.hf import TokdynTrainerCallback

    model = _gpt2(tf)
    schedule = [0, 1, 2, 3, 4, 6]
    rec = TokenLossRecorder(model, probe, store_path, "hf", schedule=schedule, commit_every=3600)
    trainer = _hf_trainer(tf, tmp_path, model, [TokdynTrainerCallback(rec)], max_steps=6, save_strategy="steps", save_steps=2)
    seen = []
    save = trainer._save_checkpoint

    def spy(*args, **kwargs):
        seen.append((trainer.state.global_step, read_run(store_path, "hf").steps.tolist()))
        return save(*args, **kwargs)

    trainer._save_checkpoint = spy
    trainer.train()
    assert seen == [(s, [x for x in schedule if x <= s]) for s in (2, 4, 6)]


def test_a_resumed_training_says_which_rows_were_never_committed(tiny_model, probe, store_path):
    """The framework callbacks warn as ``attach`` does when a training resumes past scheduled steps
    the store never got (a checkpoint saved before they were committed)."""
    _lightning()  # skips without Lightning
    from tokdyn.record.lightning import TokdynLightningCallback

    with TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=[0, 1, 2, 3, 5, 8]) as rec:
        rec.record(0)
        rec.record(1)
    rec = TokenLossRecorder(tiny_model, probe, store_path, "r", schedule=[0, 1, 2, 3, 5, 8], resume=True)
    cb = TokdynLightningCallback(rec)
    with pytest.warns(RuntimeWarning, match=r"scheduled steps \[2, 3\] lie between its last committed step 1 and start_step 5"):
        with pytest.warns(RuntimeWarning, match="step 5 was never committed"):
            cb.on_train_start(SimpleNamespace(optimizers=[], global_step=5), None)
    rec.close()
    run = read_run(store_path, "r")
    assert run.steps.tolist() == [0, 1, 5] and np.isnan(run.coord("lr")[-1])


# -- the recorder must watch the model being trained ----------------------------------------


def test_a_loop_training_another_model_is_refused(tiny_model, probe, store_path):
    """An optimizer over another model's parameters: every row would evaluate weights that never
    change (before: a run of identical rows, without a word)."""
    torch.manual_seed(1)
    other = copy.deepcopy(tiny_model)  # same architecture and values, other memory
    rec = TokenLossRecorder(tiny_model, probe, store_path, "loop", schedule=[0, 1, 2])
    with pytest.raises(InputError, match="evaluates a model that the optimizer given to attach\\(\\) does not train"):
        with rec.attach(torch.optim.SGD(other.parameters(), lr=0.1)):
            pass
    # wrappers that keep the parameters are the model being trained; so is a part of it (adapters, a head)
    rec.check_trains(list(torch.compile(tiny_model).parameters()), "a compiled model")
    rec.check_trains([list(tiny_model.parameters())[-1]], "an optimizer of the head alone")
    rec.check_trains([p.detach()[:1] for p in tiny_model.parameters()], "views")
    with rec.attach(torch.optim.SGD(tiny_model.parameters(), lr=0.1)):
        pass
    rec.close()


def test_hf_model_init_that_replaces_the_recorded_model_is_refused(tmp_path, probe, store_path):
    """``Trainer(model_init=...)`` builds a new model at ``train()``: a recorder built on the
    first one evaluated it, untrained, at every step (before: rows 0, 2 and 4 identical)."""
    tf = _hf()
    from tokdyn.record.hf import TokdynTrainerCallback

    first = _gpt2(tf)
    rec = TokenLossRecorder(first, probe, store_path, "hf", schedule=[0, 2, 4])
    made = _hf_trainer(tf, tmp_path, first, [TokdynTrainerCallback(rec)], max_steps=4)
    trainer = tf.Trainer(model_init=lambda *a: _gpt2(tf), args=made.args, train_dataset=made.train_dataset,
                         callbacks=[TokdynTrainerCallback(rec)])  # fmt: skip
    with pytest.raises(InputError, match="evaluates a model that the trainer does not train"):
        trainer.train()


def test_lightning_training_another_module_is_refused(tiny_model, probe, store_path):
    pl = _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    cb = TokdynLightningCallback(TokenLossRecorder(tiny_model, probe, store_path, "lit", schedule=[0, 2]))
    with pytest.raises(InputError, match="evaluates a model that the trainer does not train"):
        _lit_fit(_lit_trainer(pl, [cb], max_steps=2), _lit(pl, copy.deepcopy(tiny_model)))


def test_a_recorder_that_records_nothing_says_so_when_it_closes(tiny_model, probe, store_path):
    """A schedule whose steps all lie past the training left an empty run without a word."""
    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    rec = TokenLossRecorder(tiny_model, probe, store_path, "late", schedule=[100, 1000])
    with rec.attach(opt):
        _updates(tiny_model, opt, range(3))
    with pytest.warns(RuntimeWarning, match=r"run 'late' closed without a row: no step of its schedule \(100\.\.1000, 2 steps\)"):
        rec.close()
    with warnings.catch_warnings():  # one that recorded says nothing
        warnings.simplefilter("error")
        with TokenLossRecorder(tiny_model, probe, store_path, "early", schedule=[0, 1000]) as rec2:
            with rec2.attach(opt):
                pass
