"""The framework adapters, each driven by the real library: a transformers ``Trainer`` on a tiny
GPT-2 built from a config (no downloads), and a Lightning ``Trainer`` on a tiny ``TinyGPT``.

Each checks that rows land at exactly the scheduled steps, that the stored learning rate is the
one of the update that produced the weights, that the model's mode is restored, and that the
last row equals an independent recomputation on the final weights.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokdyn
from framework_fixtures import hf as _hf, lightning as _lightning
from tokdyn.errors import InputError, TokdynError
from tokdyn.record import TokenLossRecorder

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning",  # Lightning's advice (num_workers, ...), irrelevant on 2 CPU cores
    "ignore::FutureWarning",
)


def read_run(path: str, name: str) -> tokdyn.Run:
    return tokdyn.open_store(path, mode="r").run(name)


def random_sequences(n: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 257, (n, length), generator=g)


# -- Hugging Face transformers --------------------------------------------------------------


def _tiny_gpt2(tf):
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=257, n_positions=64, bos_token_id=256, eos_token_id=256)
    # GPT-2's default dropout (0.1) stays on: a row recorded outside eval mode would not match
    # the eval-mode recomputation below.
    return tf.GPT2LMHeadModel(cfg)


def _hf_args(tf, tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path / "hf-out"), use_cpu=True, report_to=[], per_device_train_batch_size=4,
        learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=0, save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    kwargs.update(overrides)
    return tf.TrainingArguments(**kwargs)


def test_hf_trainer_callback_records_the_scheduled_steps(tmp_path, probe, store_path, reference_losses):
    tf = _hf()
    from tokdyn.record.hf import TokdynTrainerCallback

    class ModeSpy(tf.TrainerCallback):  # runs after ours at every step end
        def __init__(self):
            self.modes: list[bool] = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.modes.append(model.training)

    model = _tiny_gpt2(tf)
    data = [{"input_ids": s, "labels": s} for s in random_sequences(64, 32)]
    schedule, max_steps, lr0, batch = [0, 1, 2, 4, 8, 16, 30], 30, 1e-3, 4
    args = _hf_args(tf, tmp_path, max_steps=max_steps, include_num_input_tokens_seen=True)
    rec = TokenLossRecorder(model, probe, store_path, "hf", schedule=schedule, batch_size=3)
    spy = ModeSpy()
    trainer = tf.Trainer(model=model, args=args, train_dataset=data, callbacks=[TokdynTrainerCallback(rec), spy])
    trainer.train()

    run = read_run(store_path, "hf")
    assert run.steps.tolist() == schedule
    assert run.coord("tokens_seen").tolist() == [s * batch * 32 for s in schedule]
    # linear decay without warm-up: update k (1-based) runs at lr0 * (max_steps - (k - 1)) / max_steps
    np.testing.assert_allclose(run.coord("lr"), [lr0 * (max_steps - max(s - 1, 0)) / max_steps for s in schedule], rtol=1e-9)
    assert spy.modes == [True] * max_steps  # recording never left the model in eval mode
    assert run.attrs["model_class"] == "GPT2LMHeadModel" and run.attrs["model_config"]["n_embd"] == 32
    losses = run.losses()
    np.testing.assert_allclose(losses[-1], reference_losses(model, probe.tokens), rtol=1e-6, atol=1e-6)
    assert not np.allclose(losses[0], losses[-1])
    with pytest.raises(TokdynError, match="closed"):  # the callback closed the recorder at train end
        rec.record(31)


def test_before_transformers_4_42_each_row_gets_its_updates_rate(tmp_path, probe, store_path, monkeypatch):
    """transformers 4.40 and 4.41 call no on_optimizer_step: the rate is read when the update's
    step begins. Without that, every row held the first update's rate (seen on 4.40.2)."""
    tf = _hf()
    from tokdyn.record import hf as tokdyn_hf

    monkeypatch.setattr(tokdyn_hf, "_HAS_OPTIMIZER_STEP", False)
    monkeypatch.setattr(tokdyn_hf.TokdynTrainerCallback, "on_optimizer_step", lambda self, *a, **k: None)  # never called there
    model = _tiny_gpt2(tf)
    data = [{"input_ids": s, "labels": s} for s in random_sequences(64, 32)]
    schedule, max_steps, lr0 = [0, 1, 2, 5, 10], 10, 1e-3
    rec = TokenLossRecorder(model, probe, store_path, "hf", schedule=schedule, batch_size=3)
    tf.Trainer(model=model, args=_hf_args(tf, tmp_path, max_steps=max_steps), train_dataset=data,
               callbacks=[tokdyn_hf.TokdynTrainerCallback(rec)]).train()  # fmt: skip
    np.testing.assert_allclose(read_run(store_path, "hf").coord("lr"),
                               [lr0 * (max_steps - max(s - 1, 0)) / max_steps for s in schedule], rtol=1e-9)  # fmt: skip


def test_hf_callback_builds_from_a_factory_and_can_leave_the_recorder_open(tmp_path, probe, store_path, reference_losses):
    tf = _hf()
    from tokdyn.record.hf import TokdynTrainerCallback

    model = _tiny_gpt2(tf)
    data = [{"input_ids": s, "labels": s} for s in random_sequences(16, 32, seed=1)]
    made = []

    def factory():
        made.append(TokenLossRecorder(model, probe, store_path, "hf2", schedule=[0, 2, 3]))
        return made[-1]

    cb = TokdynTrainerCallback(factory, close=False, tokens_per_step=1000)
    assert cb.recorder is None  # nothing is built before training begins
    tf.Trainer(model=model, args=_hf_args(tf, tmp_path, max_steps=3), train_dataset=data, callbacks=[cb]).train()
    assert len(made) == 1 and cb.recorder is made[0]
    run = read_run(store_path, "hf2")
    assert run.steps.tolist() == [0, 2, 3]  # flushed at train end, though still open
    assert run.coord("tokens_seen").tolist() == [0, 2000, 3000]
    np.testing.assert_allclose(run.losses()[-1], reference_losses(model, probe.tokens), rtol=1e-6, atol=1e-6)
    cb.recorder.close()

    with pytest.raises(InputError, match="TokenLossRecorder"):
        TokdynTrainerCallback("not a recorder")


# -- Lightning ------------------------------------------------------------------------------


def _lit_module(pl, model, lr0):
    class LitGPT(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            x, y = batch[:, :-1], batch[:, 1:]
            logits = self.model(x)  # (B, C, V)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=lr0)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1 + k))  # update k+1: lr0 / (k + 1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return LitGPT()


def _lightning_fit(pl, module, callbacks, *, max_steps, accumulate=1, seed=0):
    loader = torch.utils.data.DataLoader(random_sequences(64, 33, seed=seed), batch_size=4, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=accumulate,
        callbacks=callbacks,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's dataloader and sanity advice
        trainer.fit(module, loader)
    return trainer


@pytest.mark.parametrize("accumulate", [1, 2], ids=["plain", "grad-accumulation"])
def test_lightning_callback_records_the_scheduled_steps(accumulate, tiny_model, probe, store_path, reference_losses):
    pl = _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    class ModeSpy(pl.Callback):  # runs after ours at every batch end
        def __init__(self):
            self.modes: list[bool] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.modes.append(pl_module.training and tiny_model.training)

    schedule, max_steps, lr0 = [0, 1, 2, 3, 5, 8, 13, 20], 20, 1e-2
    module = _lit_module(pl, tiny_model, lr0)
    if accumulate == 1:  # a recorder built up front
        rec = TokenLossRecorder(tiny_model, probe, store_path, "lit", schedule=schedule, batch_size=3)
        cb = TokdynLightningCallback(rec)
    else:  # the factory form, built at train start (what DDP needs)
        cb = TokdynLightningCallback(lambda: TokenLossRecorder(tiny_model, probe, store_path, "lit", schedule=schedule))
    spy = ModeSpy()
    trainer = _lightning_fit(pl, module, [cb, spy], max_steps=max_steps, accumulate=accumulate)
    assert trainer.global_step == max_steps

    run = read_run(store_path, "lit")
    assert run.steps.tolist() == schedule  # once each, even with several batch ends per update
    np.testing.assert_allclose(run.coord("lr"), [lr0 / max(s, 1) for s in schedule], rtol=1e-12)
    assert spy.modes == [True] * (max_steps * accumulate)
    losses = run.losses()
    np.testing.assert_allclose(losses[-1], reference_losses(tiny_model, probe.tokens), rtol=1e-6, atol=1e-6)
    assert not np.allclose(losses[0], losses[-1])
    with pytest.raises(TokdynError, match="closed"):
        cb.recorder.record(max_steps + 1)


def test_lightning_callback_keeps_rows_when_training_raises(tiny_model, probe, store_path):
    pl = _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    class Boom(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                raise RuntimeError("boom")

    rec = TokenLossRecorder(tiny_model, probe, store_path, "lit-err", schedule=[0, 1, 2, 3, 10])
    with pytest.raises(RuntimeError, match="boom"):
        _lightning_fit(pl, _lit_module(pl, tiny_model, 1e-2), [TokdynLightningCallback(rec), Boom()], max_steps=10)
    assert read_run(store_path, "lit-err").steps.tolist() == [0, 1, 2, 3]  # flushed by on_exception
    rec.close()


def test_callbacks_commit_waiting_rows_when_a_checkpoint_is_saved(tiny_model, probe, store_path):
    """Rows wait up to commit_every before they are committed; a training checkpoint saved
    meanwhile must not get ahead of them (a restart from it would never record them)."""
    _hf()
    _lightning()
    from tokdyn.record.hf import TokdynTrainerCallback
    from tokdyn.record.lightning import TokdynLightningCallback

    for name, save in (("hf-save", lambda cb: cb.on_save(None, None, None)),
                       ("lit-save", lambda cb: cb.on_save_checkpoint(None, None, {}))):  # fmt: skip
        rec = TokenLossRecorder(tiny_model, probe, store_path, name, schedule=[0, 1, 2], commit_every=3600)
        cb = (TokdynTrainerCallback if name == "hf-save" else TokdynLightningCallback)(rec)
        rec.record(0)
        rec.record(1)
        assert read_run(store_path, name).n_committed == 0  # waiting for commit_every
        save(cb)
        assert read_run(store_path, name).steps.tolist() == [0, 1]
        rec.close()


# -- placement checks -----------------------------------------------------------------------


def test_adapters_refuse_a_recorder_that_evaluates_elsewhere_than_the_model(tiny_model, probe, store_path):
    from types import SimpleNamespace

    rec = TokenLossRecorder(tiny_model, probe, store_path, "meta", schedule=[0], device="meta")  # model on cpu
    state = SimpleNamespace(global_step=0, num_input_tokens_seen=0)
    try:
        if _has("transformers"):
            from tokdyn.record.hf import TokdynTrainerCallback

            with pytest.raises(InputError, match="model is on cpu but the recorder evaluates on meta"):
                TokdynTrainerCallback(rec).on_train_begin(None, state, None, optimizer=None)
        pl_ok = _has("lightning") or _has("pytorch_lightning")
        if pl_ok:
            from tokdyn.record.lightning import TokdynLightningCallback

            with pytest.raises(InputError, match="model is on cpu but the recorder evaluates on meta"):
                TokdynLightningCallback(rec).on_train_start(SimpleNamespace(optimizers=[], global_step=0), None)
    finally:
        rec.close()
    assert read_run(store_path, "meta").steps.tolist() == []  # nothing was recorded


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- without the libraries ------------------------------------------------------------------


def test_tokdyn_imports_without_the_frameworks_and_adapters_say_what_to_install():
    code = textwrap.dedent(
        """
        import sys
        for name in ("transformers", "lightning", "lightning.pytorch", "pytorch_lightning"):
            sys.modules[name] = None  # as if not installed
        import tokdyn, tokdyn.record
        for module, extra in (("tokdyn.record.hf", "hf"), ("tokdyn.record.lightning", "lightning")):
            try:
                __import__(module)
            except ImportError as exc:
                assert f"pip install 'tokdyn[{extra}]'" in str(exc), exc
            else:
                raise AssertionError(module + " imported without its library")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
