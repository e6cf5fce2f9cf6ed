"""Shared fixtures: a tiny probe, a tiny GPT, a store path, and an independent loss reference."""

from __future__ import annotations

import re
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tokdyn
from tokdyn.errors import TokdynError
from tokdyn.model import GPTConfig, TinyGPT

VOCAB, CONTEXT, N_SEQ = 257, 32, 8

# The tests of Ctrl-C need Python's own SIGINT handler. A suite started in the background by a
# shell without job control (`pytest &` in a script) inherits SIGINT ignored, and Python then
# installs none: a Ctrl-C the tests send raised nothing, and 5 of them failed.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _tiny_config() -> GPTConfig:
    return GPTConfig(vocab_size=VOCAB, context=CONTEXT, n_layer=1, n_head=2, n_embd=32)


@pytest.fixture(scope="session")
def probe() -> tokdyn.ProbeSet:
    """8 random byte sequences of context 32: 256 contextualized tokens."""
    rng = np.random.default_rng(1234)
    return tokdyn.ProbeSet.from_tokens(rng.integers(0, VOCAB, size=(N_SEQ, CONTEXT + 1)), tokenizer={"kind": "byte"})


@pytest.fixture
def tiny_config() -> GPTConfig:
    return _tiny_config()


@pytest.fixture
def tiny_model() -> TinyGPT:
    """A freshly initialised, seeded 1-layer TinyGPT in train mode."""
    torch.manual_seed(0)
    return TinyGPT(_tiny_config()).train()


@pytest.fixture
def store_path(tmp_path) -> str:
    return str(tmp_path / "store.zarr")


@pytest.fixture
def train_batches():
    """``batches(n, batch_size=4, seed=0)``: a list of ``n`` random token batches ``[B, C+1]``."""

    def make(n: int, *, batch_size: int = 4, seed: int = 0) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return [torch.randint(0, VOCAB, (batch_size, CONTEXT + 1), generator=g) for _ in range(n)]

    return make


@pytest.fixture
def reference_losses():
    """``ref(model, tokens [S, C+1]) -> float64 [S * C]``: the per-token losses computed
    independently of tokdyn, one sequence at a time with ``F.cross_entropy``, in eval mode."""

    @torch.no_grad()
    def ref(model: torch.nn.Module, tokens, forward=None) -> np.ndarray:
        tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        was_training = model.training
        model.eval()
        try:
            rows = []
            for seq in tokens:
                x, y = seq[None, :-1], seq[1:]  # (1, C), (C,)
                out = model(x) if forward is None else forward(model, x)
                logits = out if isinstance(out, torch.Tensor) else out.logits  # (1, C, V)
                rows.append(F.cross_entropy(logits[0].float(), y, reduction="none").double().numpy())
        finally:
            model.train(was_training)
        return np.concatenate(rows)

    return ref


# numpy 2 writes a scalar's repr as its constructor (np.int64(5), np.float64(0.5),
# np.str_('a')): a value taken from an array and quoted with !r in a message showed that to the
# user ("axis_values[3] = np.int64(9007199254740993)"). Every test checks every error it makes.
_NUMPY_REPR = re.compile(r"\bnp\.(u?int(8|16|32|64)|float(16|32|64|96|128)|longdouble|complex(64|128|192|256)|clongdouble"
                         r"|bool|str_|bytes_|datetime64|timedelta64|void|object_)\(|\bnp\.(True|False)_")  # not np.fromfile(...)


@pytest.fixture(autouse=True)
def _messages_show_plain_values(monkeypatch, request):
    """Every TokdynError made during a test (raised to the test, or caught and printed by the
    CLI as its one line): its message holds no numpy repr. A test marked ``echoes_numpy`` passes
    numpy scalars as arguments itself, and an argument's refusal quotes it as the caller wrote it."""
    if request.node.get_closest_marker("echoes_numpy"):
        yield
        return
    made = []
    init = TokdynError.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(" ".join(str(a) for a in args))

    monkeypatch.setattr(TokdynError, "__init__", record)
    yield
    shown = [m for m in made if _NUMPY_REPR.search(m)]
    assert not shown, f"a message quotes a numpy repr (write the value with str(), or .item() first): {shown[0]}"
