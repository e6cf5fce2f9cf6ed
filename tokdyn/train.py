"""A plain training loop for the tiny GPT, with the recorder attached.

Used by ``pipelines/train_tiny.py``, the benchmarks and ``tokdyn demo``. It is deliberately an
ordinary PyTorch loop: the recorder rides on an optimizer hook, so the loop has no tokdyn code.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ._checks import is_int, is_real
from .data import Corpus, prepare_corpus, random_batches
from .errors import InputError
from .model import GPTConfig, TinyGPT
from .record import TokenLossRecorder
from .runtime import resolve_device
from .schedule import geometric_schedule

__all__ = ["TrainConfig", "train", "record_tiny_run", "resolve_device"]  # resolve_device: from tokdyn.runtime


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 20
    min_lr_frac: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        # types first: lr=inf or NaN trained a model of NaN weights, steps=2.5 raised deep in the loop
        for name in ("steps", "batch_size", "warmup", "seed"):
            v = getattr(self, name)
            if not is_int(v):
                raise InputError(f"{name} must be an int, got {v!r}")
        for name in ("lr", "min_lr_frac", "weight_decay", "grad_clip"):
            v = getattr(self, name)
            if name == "grad_clip" and v is None:  # no clipping, as 0
                continue
            if not is_real(v) or not math.isfinite(v) or v < 0:
                raise InputError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.steps < 1 or self.batch_size < 1:
            raise InputError(f"steps and batch_size must be >= 1, got {self.steps} and {self.batch_size}")
        if not self.lr > 0 or self.warmup < 0 or not 0 <= self.min_lr_frac <= 1:
            raise InputError("need lr > 0, warmup >= 0 and 0 <= min_lr_frac <= 1")


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_frac``."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def train(
    model: torch.nn.Module,
    batches: Iterator[torch.Tensor],
    cfg: TrainConfig,
    *,
    recorder: TokenLossRecorder | None = None,
    start_step: int = 0,
    on_step: Callable[[int, torch.Tensor], None] | None = None,
    loss_weights: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
) -> dict:
    """Train ``model`` on ``batches [B, C+1]`` for ``cfg.steps`` optimizer steps.

    ``batches`` is any iterator of token batches: :func:`~tokdyn.data.random_batches`, or
    ``iter(DataLoader(WindowDataset(...), sampler=...))``. With a ``recorder``, it is attached
    to the optimizer for the whole loop (step 0, the untrained model, is recorded first when
    scheduled). ``loss_weights(batch, step) -> [B, C]`` weights each token's loss (the loss is
    ``sum(w * nll) / sum(w)``; e.g. :class:`tokdyn.curriculum.TokenWeights`), ``step`` being the
    0-based update the batch is for. Returns the last loss and timings.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s + start_step, cfg))
    model.train()
    loss = torch.tensor(float("nan"))
    t0 = time.perf_counter()
    attach = recorder.attach(opt, start_step=start_step, tokens_per_step=None) if recorder else contextlib.nullcontext()
    with attach:
        for step in range(start_step, cfg.steps):
            batch = next(batches, None)
            if batch is None:  # a sampler or loader shorter than the run: say so, not a bare StopIteration
                raise InputError(f"the batches ran out at step {step}: {step - start_step} of the {cfg.steps - start_step} steps "
                                 f"asked for were trained; give at least that many batches (a sampler covering "
                                 f"{cfg.steps} steps)")  # fmt: skip
            x, y = batch[:, :-1], batch[:, 1:]
            logits = model(x)  # (B, C, V)
            if loss_weights is None:
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            else:
                w = loss_weights(batch, step)  # (B, C), on the device
                nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
                loss = (w.reshape(-1) * nll).sum() / w.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            if on_step is not None:
                on_step(step + 1, loss.detach())  # a tensor: the callee decides when to sync
    return {"final_train_loss": float(loss.detach()), "train_seconds": time.perf_counter() - t0, "steps": cfg.steps}


def record_tiny_run(
    store: str,
    *,
    run: str = "tiny",
    corpus: Corpus | None = None,
    model_config: GPTConfig | None = None,
    train_config: TrainConfig = TrainConfig(),
    n_points: int = 40,
    dtype: str = "float32",
    device: str = "cpu",
    resume: bool = False,
    progress: bool = True,
) -> dict:
    """Train the tiny GPT on ``corpus`` (default: the standard library) with the recorder on a
    geometric schedule of about ``n_points`` steps, writing run ``run`` into ``store``."""
    corpus = corpus or prepare_corpus()
    mcfg = model_config or GPTConfig(vocab_size=corpus.tokenizer.vocab_size, context=corpus.probe.context, n_layer=4)
    if mcfg.vocab_size < corpus.tokenizer.vocab_size or mcfg.context < corpus.probe.context:
        raise InputError("model vocab_size/context are smaller than the tokenizer's/probe's")
    torch.manual_seed(train_config.seed)
    model = TinyGPT(mcfg).to(device)
    schedule = geometric_schedule(train_config.steps, n_points)
    attrs = {
        "model_config": mcfg.to_dict(),
        "train_config": asdict(train_config),
        "seed": train_config.seed,
        "data_budget": train_config.steps * train_config.batch_size * mcfg.context,
        "tokens_per_step": train_config.batch_size * mcfg.context,
    }
    batches = random_batches(corpus.train_tokens, batch_size=train_config.batch_size, context=mcfg.context,
                             seed=train_config.seed, device=device)  # fmt: skip
    bar = _progress(train_config.steps, progress)
    with TokenLossRecorder(model, corpus.probe, store, run, schedule=schedule, dtype=dtype, device=device,
                           resume=resume, run_attrs=attrs, rank=0, world_size=1) as rec:  # fmt: skip (one process trains: a launcher's WORLD_SIZE is not ours)
        stats = train(model, batches, train_config, recorder=rec, on_step=lambda s, l: bar(s, l))
    bar(None, None)
    return {**stats, "rows_recorded": rec.n_recorded, "record_seconds": rec.record_seconds,
            "n_tokens": corpus.probe.n_tokens, "schedule_points": len(schedule), **attrs}  # fmt: skip


def _progress(total: int, enabled: bool) -> Callable:
    if not enabled:
        return lambda s, l: None
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="train", unit="step", leave=False)

    def update(step, loss):
        if step is None:
            bar.close()
            return
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{float(loss):.3f}")

    return update
