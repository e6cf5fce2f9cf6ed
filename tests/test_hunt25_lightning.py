"""The Lightning callback under Lightning's own features: the spawn and fork strategies (the
callback sent to, or copied into, other processes), run on CPU with tiny models.

Each check compares against an independent answer: the losses of the trained weights computed
apart from tokdyn, the steps Lightning reports, or the one-line refusal the user must see.
"""

from __future__ import annotations

import copy
import functools
import pickle
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokdyn
from framework_fixtures import lightning as _lightning
from tokdyn.errors import InputError
from tokdyn.model import GPTConfig, TinyGPT
from tokdyn.record import TokenLossRecorder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")

VOCAB, C = 257, 16


def read_run(path: str, name: str) -> tokdyn.Run:
    return tokdyn.open_store(path, mode="r").run(name)


def tiny_net() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=VOCAB, context=C, n_layer=1, n_head=2, n_embd=16)).train()


@pytest.fixture
def probe16() -> tokdyn.ProbeSet:
    rng = np.random.default_rng(7)
    return tokdyn.ProbeSet.from_tokens(rng.integers(0, VOCAB, size=(4, C + 1)), tokenizer={"kind": "byte"})


def loader(n: int = 32) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.DataLoader(torch.randint(0, VOCAB, (n, C + 1), generator=g), batch_size=4)


def _lit_class():
    pl = _lightning()

    class Lit(pl.LightningModule):  # module level through _LIT below: spawned processes import it
        def __init__(self, net):
            super().__init__()
            self.net = net

        def training_step(self, b, batch_idx):
            return F.cross_entropy(self.net(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    Lit.__qualname__ = Lit.__name__ = "Lit"
    return Lit


try:
    Lit = _lit_class()
except BaseException:  # no Lightning: each test skips through _lightning()
    Lit = None


def trainer(callbacks, **kwargs):
    pl = _lightning()
    base = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False)  # fmt: skip
    base.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **base)


def fit(tr, module, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.fit(module, *args, **kwargs)


@torch.no_grad()
def losses_of(net, tokens) -> np.ndarray:
    """Per-token losses of ``net`` in eval mode, apart from tokdyn: ``[S * C]``."""
    was = net.training
    net.eval()
    t = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    out = F.cross_entropy(net(t[:, :-1]).flatten(0, 1).float(), t[:, 1:].flatten(), reduction="none")
    net.train(was)
    return out.double().numpy()


# -- the callback sent to other processes (ddp_spawn pickles it, XLA's launcher deep-copies it) ------


def test_a_callback_that_cannot_reach_spawned_processes_is_refused_in_one_line(tmp_path, probe16):
    """``strategy="ddp_spawn"`` pickles the trainer, callbacks included, into every process. A
    callback holding a recorder failed with ``TypeError: cannot pickle '_thread.lock' object``,
    and one holding the docs' lambda factory with ``Can't pickle local object``: neither says what
    to do. Each is now an InputError naming the picklable form; that form, and deep copies of a
    factory callback, still work."""
    _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    net, store = tiny_net(), str(tmp_path / "s.zarr")
    rec = TokenLossRecorder(net, probe16, store, "held", schedule=[0, 1])
    try:
        for held in (rec, TokdynLightningCallback(rec)):
            with pytest.raises(InputError, match="cannot be sent to another process.*functools.partial"):
                pickle.dumps(held)
            with pytest.raises(InputError, match="cannot be sent to another process"):
                copy.deepcopy(held)
    finally:
        rec.close()
    with pytest.raises(InputError, match=r"recorder factory .* cannot be sent to another process.*functools.partial"):
        pickle.dumps(TokdynLightningCallback(lambda: TokenLossRecorder(net, probe16, store, "lam", schedule=[0])))
    lam = TokdynLightningCallback(lambda: TokenLossRecorder(net, probe16, store, "lam", schedule=[0]))
    assert copy.deepcopy(lam).recorder is None  # a deep copy (no process boundary) keeps working
    odd = tiny_net()
    odd.hook = lambda: None  # a model that does not pickle, inside a partial: said in one short line
    with pytest.raises(InputError, match=r"factory functools.partial\(TokenLossRecorder, \.\.\.\), which") as said:
        pickle.dumps(TokdynLightningCallback(functools.partial(TokenLossRecorder, odd, probe16, store, "odd")))
    assert "\n" not in str(said.value) and len(str(said.value)) < 600

    part = functools.partial(TokenLossRecorder, net, probe16, store, "part", schedule=[0, 1])
    cb = pickle.loads(pickle.dumps(TokdynLightningCallback(part)))
    assert cb.recorder is None
    fit(trainer([cb], max_steps=1), Lit(cb._binding._factory.args[0]), loader())
    assert read_run(store, "part").steps.tolist() == [0, 1]


def test_ddp_spawn_with_a_held_recorder_is_refused_before_any_process_starts(tmp_path, probe16):
    _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    net, store = tiny_net(), str(tmp_path / "s.zarr")
    rec = TokenLossRecorder(net, probe16, store, "held", schedule=[0, 1])
    tr = trainer([TokdynLightningCallback(rec)], max_steps=2, strategy="ddp_spawn", devices=2)
    with pytest.raises(InputError, match="cannot be sent to another process"):
        fit(tr, Lit(net), loader())
    rec.close()
    assert read_run(store, "held").steps.tolist() == []


@pytest.mark.slow
def test_ddp_spawn_with_a_picklable_factory_records_the_trained_weights(tmp_path, probe16):
    """Two spawned CPU ranks each evaluate their shard; the rows are those of one process, and the
    last is the losses of the weights Lightning hands back to the parent."""
    _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    net, store = tiny_net(), str(tmp_path / "s.zarr")
    first = losses_of(net, probe16.tokens)
    cb = TokdynLightningCallback(functools.partial(TokenLossRecorder, net, probe16, store, "sp", schedule=[0, 2, 4]))
    fit(trainer([cb], max_steps=4, strategy="ddp_spawn", devices=2), Lit(net), loader())
    run = read_run(store, "sp")
    assert run.steps.tolist() == [0, 2, 4]
    np.testing.assert_allclose(run.losses()[0], first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run.losses()[-1], losses_of(net, probe16.tokens), rtol=1e-5, atol=1e-5)
    assert not np.allclose(run.losses()[0], run.losses()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("form", ["held", "factory"])
def test_ddp_fork_refuses_a_recorder_built_before_the_fork_and_records_with_a_factory(tmp_path, probe16, form):
    """``strategy="ddp_fork"`` copies a recorder built beforehand into each process without its
    writer thread, each copy taking itself for the only writer: every rank failed at step 0 with
    ``WriterError: background writer stopped unexpectedly``. Now each rank refuses it at train
    start, in one line naming the factory; with a factory, each rank builds its own."""
    _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    net, store = tiny_net(), str(tmp_path / "s.zarr")
    first = losses_of(net, probe16.tokens)
    if form == "held":
        rec = TokenLossRecorder(net, probe16, store, "fk", schedule=[0, 2, 4])
        with pytest.raises(Exception, match="was built in process .* a fork of it .*pass a factory"):
            fit(trainer([TokdynLightningCallback(rec)], max_steps=4, strategy="ddp_fork", devices=2), Lit(net), loader())
        rec.close()
        assert read_run(store, "fk").steps.tolist() == []
        return
    cb = TokdynLightningCallback(lambda: TokenLossRecorder(net, probe16, store, "fk", schedule=[0, 2, 4]))
    fit(trainer([cb], max_steps=4, strategy="ddp_fork", devices=2), Lit(net), loader())
    run = read_run(store, "fk")
    assert run.steps.tolist() == [0, 2, 4]
    np.testing.assert_allclose(run.losses()[0], first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run.losses()[-1], losses_of(net, probe16.tokens), rtol=1e-5, atol=1e-5)


# -- fast_dev_run -----------------------------------------------------------------------------


def test_fast_dev_run_records_nothing_and_leaves_the_run_to_the_real_training(tmp_path, probe16):
    """``Trainer(fast_dev_run=...)``, Lightning's smoke test that suppresses logging and
    checkpointing, wrote its rows 0..3 into the real run: the real training afterwards was refused
    (the run existed), or with ``resume=True`` kept the smoke test's rows as its own. Now the
    callback records nothing there (said once) and builds no recorder; the real run is whole."""
    _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    net, store = tiny_net(), str(tmp_path / "s.zarr")
    first = losses_of(net, probe16.tokens)

    def recorder():
        return TokenLossRecorder(net, probe16, store, "r", schedule=[0, 1, 2, 3, 6])

    smoke = TokdynLightningCallback(recorder)
    with pytest.warns(UserWarning, match="fast_dev_run: tokdyn records nothing"):
        trainer([smoke], fast_dev_run=3).fit(Lit(net), loader())
    assert smoke.recorder is None
    assert not tokdyn.open_store(store, probe16, mode="a").has_run("r")

    net2 = tiny_net()  # the real training, from the same start
    fit(trainer([TokdynLightningCallback(lambda: TokenLossRecorder(net2, probe16, store, "r", schedule=[0, 1, 2, 3, 6]))],
                max_steps=6), Lit(net2), loader())  # fmt: skip
    run = read_run(store, "r")
    assert run.steps.tolist() == [0, 1, 2, 3, 6]
    np.testing.assert_allclose(run.losses()[0], first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run.losses()[-1], losses_of(net2, probe16.tokens), rtol=1e-5, atol=1e-5)


# -- several optimizers -----------------------------------------------------------------------


class TwoOptimizers(Lit if Lit is not None else object):
    """Manual optimization stepping two optimizers a batch (a GAN's pattern): global_step moves by
    2 a batch; the first optimizer's rate decays by half each of its updates, the second's is 0.5."""

    def __init__(self, net):
        super().__init__(net)
        self.automatic_optimization = False

    def training_step(self, b, batch_idx):
        for opt in self.optimizers():
            loss = F.cross_entropy(self.net(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        self.lr_schedulers().step()

    def configure_optimizers(self):
        ps = list(self.parameters())
        first = torch.optim.SGD(ps[: len(ps) // 2], lr=0.08)
        sched = torch.optim.lr_scheduler.ExponentialLR(first, gamma=0.5)
        return [first, torch.optim.SGD(ps[len(ps) // 2 :], lr=0.5)], [sched]


def test_with_several_optimizers_every_row_gets_the_first_optimizers_rate(tmp_path, probe16):
    """The step-0 row took the first optimizer's rate and every later row the rate of whichever
    optimizer stepped last (0.5, the second's): one run's lr column mixed two optimizers. Every
    row now gets the first optimizer's rate of the update that made its weights (the batch k's
    update ran at 0.08 / 2**(k-1), its weights are row 2k)."""
    _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    net, store = tiny_net(), str(tmp_path / "s.zarr")
    cb = TokdynLightningCallback(lambda: TokenLossRecorder(net, probe16, store, "two", schedule=[0, 2, 4, 6]))
    tr = trainer([cb], max_steps=6)
    fit(tr, TwoOptimizers(net), loader())
    assert tr.global_step == 6
    run = read_run(store, "two")
    assert run.steps.tolist() == [0, 2, 4, 6]
    np.testing.assert_allclose(run.coord("lr"), [0.08, 0.08, 0.04, 0.02], rtol=1e-12)
    np.testing.assert_allclose(run.losses()[-1], losses_of(net, probe16.tokens), rtol=1e-5, atol=1e-5)


def test_fast_dev_run_leaves_a_held_recorder_open_for_the_real_training(tmp_path, probe16):
    """A notebook's smoke test then its training, one callback holding a recorder: the smoke test
    closed the recorder at its end, and the real training was refused ("closed when an earlier
    training ended"). The smoke test now leaves it as it found it."""
    _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    net, store = tiny_net(), str(tmp_path / "s.zarr")
    first = losses_of(net, probe16.tokens)
    cb = TokdynLightningCallback(TokenLossRecorder(net, probe16, store, "r", schedule=[0, 1, 2, 3, 6]))
    with pytest.warns(UserWarning, match="fast_dev_run"):
        trainer([cb], fast_dev_run=2).fit(Lit(net), loader())
    net.load_state_dict(tiny_net().state_dict())  # the smoke test trained it: back to the start
    fit(trainer([cb], max_steps=6), Lit(net), loader())
    run = read_run(store, "r")
    assert run.steps.tolist() == [0, 1, 2, 3, 6]
    np.testing.assert_allclose(run.losses()[0], first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run.losses()[-1], losses_of(net, probe16.tokens), rtol=1e-5, atol=1e-5)


# -- a training stopped inside the recording, then fit again ---------------------------------------


def test_a_step_whose_recording_failed_is_recorded_when_fit_goes_on(tmp_path, probe16):
    """The probe forward failed at step 3 (an out-of-memory on the device, a Ctrl-C that Lightning
    turns into an exit a notebook survives): the callback had already taken step 3 as handed over,
    so ``fit`` again on the same Trainer, which starts at step 3 on the same weights, skipped it
    without a word. Now the step is taken only once its row is; the retry records it."""
    _lightning()
    from tokdyn.record.lightning import TokdynLightningCallback

    net, store = tiny_net(), str(tmp_path / "s.zarr")
    rec = TokenLossRecorder(net, probe16, store, "r", schedule=[0, 1, 3, 5])
    own, calls = rec.forward, []

    def flaky(model, tokens):
        calls.append(1)
        if len(calls) == 3:  # the third recorded step, 3
            raise RuntimeError("out of memory (simulated)")
        return own(model, tokens)

    rec.forward = flaky
    cb = TokdynLightningCallback(rec, close=False)
    tr = trainer([cb], max_steps=5)
    with pytest.raises(RuntimeError, match="out of memory"):
        fit(tr, Lit(net), loader())
    assert tr.global_step == 3
    at3 = losses_of(net, probe16.tokens)
    fit(tr, Lit(net), loader())  # the same Trainer goes on from step 3
    rec.close()
    run = read_run(store, "r")
    assert run.steps.tolist() == [0, 1, 3, 5]
    np.testing.assert_allclose(run.losses()[2], at3, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run.losses()[3], losses_of(net, probe16.tokens), rtol=1e-5, atol=1e-5)
