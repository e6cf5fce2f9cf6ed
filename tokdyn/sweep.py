"""The D axis from one run: a constant-learning-rate trunk with a short decay branched off it.

Training a separate run to completion for every data budget costs the sum of all budgets, and
each run's schedule (warm-up, cosine length) differs with its length. Instead (Hagele et al.
2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations"): train one
**trunk** at a constant learning rate after warm-up, and at each budget ``B`` copy the model and
optimizer at step ``B - d`` and **decay** the copy's learning rate to a floor over the last
``d = decay_frac * B`` steps. The branch's end is a completed run at budget ``B``: its probe
losses are one point of the D axis. The whole axis costs the longest budget plus the decays
(about 1.5-2x the longest run for 20-30 budgets).

:func:`branched_decay_sweep` writes, into a store:

- the trunk as a T run (its probe losses on a geometric schedule up to the largest budget), with
  ``attrs["lr_area"]``, the area under its learning-rate curve at each recorded step;
- one run per budget with a single row (the branch's end), ``attrs["sweep"] = "D"``,
  ``attrs["data_budget"]`` (tokens) and ``attrs["lr_area"]``: what :func:`tokdyn.axes.assemble_axis`
  and :func:`tokdyn.axes.effective_steps` read, and ``attrs["decay_lr"]``, the lr / peak of each
  update of its decay (what :func:`annealing_area` reads);
- optionally **calibration branches** (``cfg.calibration``: budgets, with their own decay share),
  the same kind of run tagged ``attrs["sweep"] = "D-calibration"``: they are no D point, but
  they say how much a decay gains over the trunk (:class:`tokdyn.annealing.AnnealingGain`), so
  that D can be predicted from the trunk's events without any fit on D's own points.

Learning-rate areas are in *steps at the peak learning rate*: ``sum over updates of lr / peak``.
It works on any ``torch.nn.Module`` whose output is logits (or has ``.logits``).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ._checks import is_real, is_whole
from .annealing import annealing_area
from .errors import InputError
from .probe import ProbeSet
from .record import TokenLossRecorder
from .record.recorder import default_forward
from .schedule import geometric_schedule
from .store import TrajectoryStore
from .store.schema import check_run_name

__all__ = ["DecaySweepConfig", "DecaySweep", "branched_decay_sweep", "log_budgets", "annealing_area"]

DECAY_SHAPES = ("linear", "sqrt")
# The attributes branched_decay_sweep writes on the trunk and the branches (never the caller's run_attrs).
SWEEP_ATTRS = ("sweep", "data_budget", "tokens_per_step", "decay_sweep", "lr_schedule", "lr_area", "budget_steps",
               "branch_start", "decay_steps", "decay_frac", "decay_lr")


def _steps(value, what: str, unit: str = "steps") -> int:
    """``value`` as a whole number of ``unit`` (an int, a numpy integer, or a float such as 100.0),
    else one clear :class:`InputError` (never a bool, never cut: 10.7 is not 10)."""
    if not is_whole(value):
        raise InputError(f"{what}: expected whole numbers of {unit}, got {value!r}")
    return int(value)


def _number(value, what: str) -> float:
    """``value`` as a finite float (not a bool), else one clear :class:`InputError`."""
    if not is_real(value) or not math.isfinite(value):
        raise InputError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def log_budgets(first: int, last: int, n: int) -> list[int]:
    """``n`` budgets (steps) evenly spaced in log between ``first`` and ``last``, rounded and distinct."""
    n = _steps(n, "n")
    if not (isinstance(first, (int, float, np.integer, np.floating)) and isinstance(last, (int, float, np.integer, np.floating))) \
            or isinstance(first, (bool, np.bool_)) or isinstance(last, (bool, np.bool_)) or not (1 <= first < last < math.inf) or n < 2:
        raise InputError(f"need 1 <= first < last and n >= 2, got first={first}, last={last}, n={n}")
    budgets = sorted({int(round(b)) for b in np.geomspace(first, last, n)})
    if len(budgets) < n:  # rounding to whole steps merged neighbours: fewer points than asked, without a word
        raise InputError(f"{n} budgets between {first:g} and {last:g} steps round to {len(budgets)} distinct whole "
                         f"steps ({budgets}); ask for fewer budgets or a wider range")  # fmt: skip
    return budgets


@dataclass(frozen=True)
class DecaySweepConfig:
    """The trunk's and the branches' schedule.

    budgets : steps at which the branches end, strictly increasing (each one D point).
    lr : the peak (trunk) learning rate; warmup : linear warm-up steps of the trunk.
    decay_frac : each branch decays over ``max(1, round(decay_frac * budget))`` steps.
    floor : the learning rate of a branch's last update, as a fraction of ``lr``.
    shape : ``"linear"`` or ``"sqrt"`` (``1 - sqrt`` of the decay's progress, Hagele et al.'s best).
    trunk_points : about how many log-spaced steps the trunk records (its T axis).
    calibration : extra branches, not D points: ``(budget, decay_frac)`` pairs, each ending at
        ``budget`` after a decay over its own share (see the module docstring).
    trunk_steps : how far the trunk trains and records (default: the largest budget). Training
        it beyond the largest budget lets the events of tokens still being learned there be
        fitted on T from both sides, which D rebuilt from T's events needs at its top end.
    """

    budgets: tuple[int, ...]
    lr: float = 3e-3
    warmup: int = 10
    decay_frac: float = 0.15
    floor: float = 0.0
    shape: str = "linear"
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0  # 0 or None: no clipping
    betas: tuple[float, float] = (0.9, 0.95)
    trunk_points: int = 40
    seed: int = 0
    calibration: tuple[tuple[int, float], ...] = ()
    trunk_steps: int | None = None

    def __post_init__(self) -> None:
        # Steps are whole numbers: int() cut a budget of 10.7 to 10 and a calibration budget of
        # 150.9 to 150 without a word, and a warm-up of 2.5 steps ran the trunk above its peak rate.
        try:
            b = tuple(_steps(x, "budgets") for x in self.budgets)
        except TypeError:
            raise InputError(f"budgets must be a sequence of steps, got {self.budgets!r}") from None
        object.__setattr__(self, "budgets", b)
        if len(b) < 1 or any(x < 1 for x in b) or any(y <= x for x, y in zip(b, b[1:])):
            raise InputError(f"budgets must be positive, strictly increasing steps, got {list(b)}")
        object.__setattr__(self, "warmup", _steps(self.warmup, "warmup"))
        object.__setattr__(self, "trunk_points", _steps(self.trunk_points, "trunk_points"))
        if self.trunk_steps is not None:
            object.__setattr__(self, "trunk_steps", _steps(self.trunk_steps, "trunk_steps"))
        if self.grad_clip is None:  # no clipping, as 0 says it (and as the training loop read None before)
            object.__setattr__(self, "grad_clip", 0.0)
        for what in ("lr", "decay_frac", "floor", "weight_decay", "grad_clip"):
            _number(getattr(self, what), what)
        try:
            betas = tuple(_number(v, "betas") for v in self.betas)
        except TypeError:
            raise InputError(f"betas must be two numbers, got {self.betas!r}") from None
        if len(betas) != 2 or not all(0 <= v < 1 for v in betas):
            raise InputError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise InputError(f"need weight_decay >= 0 and grad_clip >= 0 (0: no clipping), got {self.weight_decay} and {self.grad_clip}")
        if self.trunk_points < 2:
            raise InputError(f"trunk_points must be at least 2, got {self.trunk_points}")
        if not self.lr > 0 or self.warmup < 0 or not 0 < self.decay_frac < 1 or not 0 <= self.floor < 1:
            raise InputError("need lr > 0, warmup >= 0, 0 < decay_frac < 1 and 0 <= floor < 1")
        if self.shape not in DECAY_SHAPES:
            raise InputError(f"shape must be one of {DECAY_SHAPES}, got {self.shape!r}")
        if self.trunk_steps is not None and int(self.trunk_steps) < b[-1]:
            raise InputError(f"trunk_steps ({self.trunk_steps}) must reach the largest budget ({b[-1]})")
        try:
            cal = tuple((_steps(x, "calibration budgets"), _number(f, "calibration decay_frac")) for x, f in self.calibration)
        except InputError:
            raise
        except (TypeError, ValueError):
            raise InputError(f"calibration must be (budget, decay_frac) pairs, got {self.calibration!r}") from None
        object.__setattr__(self, "calibration", cal)
        if any(not 0 < f < 1 or not 1 <= x <= b[-1] for x, f in cal):
            raise InputError(f"calibration branches need 0 < decay_frac < 1 and 1 <= budget <= {b[-1]}, got {list(cal)}")
        early = [x for x in b if self.branch_start(x) < self.warmup]
        early += [x for x, f in cal if self.branch_start(x, f) < self.warmup]
        if early:
            raise InputError(f"budgets {early} would branch before the warm-up ({self.warmup} steps) ends; start later")

    def decay_steps(self, budget: int, frac: float | None = None) -> int:
        return max(1, int(round((self.decay_frac if frac is None else frac) * budget)))

    def branch_start(self, budget: int, frac: float | None = None) -> int:
        return int(budget) - self.decay_steps(budget, frac)

    def trunk_factor(self, step: int) -> float:
        """lr / peak for the trunk's update ``step`` (0-based): linear warm-up, then constant."""
        return (step + 1) / self.warmup if step < self.warmup else 1.0

    def decay_factor(self, j: int, d: int) -> float:
        """lr / peak for update ``j`` (0-based) of a decay of ``d`` updates; the last one is ``floor``."""
        p = (j + 1) / d
        g = p if self.shape == "linear" else math.sqrt(p)
        return self.floor + (1 - self.floor) * (1 - g)

    def trunk_area(self, step: int) -> float:
        """Area under the trunk's lr / peak after ``step`` updates (steps at the peak rate)."""
        w = min(int(step), self.warmup)
        return w * (w + 1) / (2 * self.warmup) + max(0, int(step) - self.warmup) if self.warmup else float(step)

    def decay_factors(self, d: int) -> list[float]:
        """lr / peak of the ``d`` updates of a decay."""
        return [self.decay_factor(j, d) for j in range(d)]

    def branch_area(self, budget: int, frac: float | None = None) -> float:
        """Area under a branch's lr / peak at its end: the trunk's up to the branch, plus the decay."""
        d = self.decay_steps(budget, frac)
        return self.trunk_area(self.branch_start(budget, frac)) + sum(self.decay_factors(d))



@dataclass(frozen=True)
class DecaySweep:
    """What :func:`branched_decay_sweep` wrote: run names (D points, then calibration branches),
    the D points' budgets (steps and tokens), start and final lr / peak, areas, and timings."""

    trunk: str
    branches: list[str]
    budgets: list[int]
    data_budgets: list[int]
    branch_starts: list[int]
    final_lr_frac: list[float]
    lr_area: list[float]
    train_seconds: float
    record_seconds: float
    steps_trained: int = field(default=0)
    calibration: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return asdict(self)


def _next_token_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    x, y = batch[:, :-1], batch[:, 1:]
    logits = default_forward(model, x)  # (B, C, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def branched_decay_sweep(
    model: torch.nn.Module,
    batches: Callable[[int], Iterator[torch.Tensor]],
    probe: ProbeSet,
    store: TrajectoryStore,
    cfg: DecaySweepConfig,
    *,
    tokens_per_step: int,
    prefix: str = "D",
    trunk: str | None = None,
    run_attrs: Mapping | None = None,
    loss_fn: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None,
    device: str | torch.device | None = None,
    on_step: Callable[[str, int], None] | None = None,
) -> DecaySweep:
    """Train ``model`` as a constant-lr trunk to the largest budget (or ``cfg.trunk_steps``), branching a decay at each.

    Parameters
    ----------
    model : trained in place as the trunk (each branch trains a deep copy).
    batches : ``batches(start_step)`` -> an iterator of training batches ``[B, C+1]`` for the
        updates from ``start_step`` on; called once for the trunk (0) and once per branch (its
        start), so that a branch sees the data the trunk would have seen next when the stream
        is a function of the step.
    probe, store : the probe every run is evaluated on, and an open writable store.
    cfg : :class:`DecaySweepConfig`.
    tokens_per_step : tokens per update, for ``data_budget`` and ``tokens_seen``.
    prefix : branches are runs ``{prefix}00, {prefix}01, ...`` by budget; ``trunk`` names the
        trunk run (default ``{prefix}-trunk``).
    run_attrs : extra attributes of every run (model configuration, seed, ...); none of
        :data:`SWEEP_ATTRS`, which the sweep writes itself (an InputError before any training).
    loss_fn : ``loss_fn(model, batch) -> scalar`` (default: next-token cross-entropy of the logits).

    Returns a :class:`DecaySweep`. The AdamW optimizer of a branch starts from a copy of the
    trunk's state; AdamW's hyperparameters are ``cfg``'s.
    """
    tokens_per_step = _steps(tokens_per_step, "tokens_per_step", "tokens")  # 2.9 was cut to 2: every data_budget 30 % short
    if tokens_per_step < 1:
        raise InputError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
    loss_fn = loss_fn or _next_token_loss
    if not isinstance(prefix, str) or (trunk is not None and not isinstance(trunk, str)):
        raise InputError(f"prefix and trunk must be run names (strings), got {prefix!r} and {trunk!r}")
    trunk = trunk or f"{prefix}-trunk"
    names = [f"{prefix}{i:02d}" for i in range(len(cfg.budgets))]
    cal_names = [f"{prefix}-cal{i:02d}" for i in range(len(cfg.calibration))]
    # Every name checked before the first update: a bad or repeated one failed after the trunk had
    # trained (a trunk named like a branch, a prefix with a '/'), leaving runs that block a rerun.
    for n in (trunk, *names, *cal_names):
        check_run_name(n, new=True)
    if trunk in names or trunk in cal_names:
        raise InputError(f"the trunk's name {trunk!r} is also a branch's (branches are {prefix}00, {prefix}01, ..."
                         f"{', ' + prefix + '-cal00, ...' if cal_names else ''}); give the trunk another name")  # fmt: skip
    # What the sweep writes on its runs is its own: a run_attrs {"sweep": "D"} (as a recorder's
    # runs are tagged) was kept on the trunk, a T run at the largest budget without a decay, and
    # assemble_axis took it as a D point (or as a seed of the last one, with --repeats mean).
    attrs = dict(run_attrs or {})
    clash = sorted(set(attrs) & set(SWEEP_ATTRS))
    if clash:
        raise InputError(f"run_attrs sets {clash}, which the sweep writes on its runs itself (the branches' sweep tag "
                         f"and data budgets, each run's learning-rate schedule; the trunk is a T run, no D point); "
                         "leave them out")  # fmt: skip
    taken = [n for n in (trunk, *names, *cal_names) if n in store.runs]
    if taken:
        raise InputError(f"runs {taken} already exist in {store.url}; use another prefix or a fresh store")
    base = {**attrs, "decay_sweep": {k: v for k, v in asdict(cfg).items() if k not in ("budgets", "calibration")},
            "tokens_per_step": int(tokens_per_step)}  # fmt: skip
    last = int(cfg.trunk_steps or cfg.budgets[-1])
    schedule = geometric_schedule(last, cfg.trunk_points)
    trunk_attrs = {**base, "lr_schedule": "warm-up then constant", "data_budget": last * int(tokens_per_step),
                   "lr_area": {"step": schedule.tolist(), "area": [cfg.trunk_area(s) for s in schedule]}}  # fmt: skip
    # Every branch: (name, budget, decay share, sweep tag); the D points, then the calibration ones.
    specs = [(n, b, cfg.decay_frac, "D") for n, b in zip(names, cfg.budgets)]
    specs += [(n, b, f, "D-calibration") for n, (b, f) in zip(cal_names, cfg.calibration)]
    opt = _adamw(model, cfg)
    stream = batches(0)
    final_lr, t_train, t_record, n_steps = {}, 0.0, 0.0, 0
    model.train()
    with TokenLossRecorder(model, probe, store, trunk, schedule=schedule, device=device, run_attrs=trunk_attrs) as rec:
        with rec.attach(opt, tokens_per_step=int(tokens_per_step)):
            for step in range(last):
                for name, b, frac, tag in (sp for sp in specs if cfg.branch_start(sp[1], sp[2]) == step):
                    t = time.perf_counter()
                    with _forked_rng(model):  # the branch's dropout draws leave the trunk's random stream as it was
                        lr_end, seconds = _branch(model, opt, batches, probe, store, cfg, name, b, frac, tag, base,
                                                  tokens_per_step=int(tokens_per_step), loss_fn=loss_fn, device=device,
                                                  on_step=on_step)  # fmt: skip
                    final_lr[name] = lr_end
                    t_record += seconds
                    t_train += time.perf_counter() - t - seconds
                    n_steps += cfg.decay_steps(b, frac)
                t = time.perf_counter()
                _set_lr(opt, cfg.lr * cfg.trunk_factor(step))
                _update(model, opt, loss_fn, next(stream), cfg)
                t_train += time.perf_counter() - t
                n_steps += 1
                if on_step is not None:
                    on_step(trunk, step + 1)
        t_record += rec.record_seconds
    t_train -= rec.record_seconds  # the trunk's recordings ran inside its updates' hook
    return DecaySweep(trunk=trunk, branches=names, budgets=list(cfg.budgets),
                      data_budgets=[b * int(tokens_per_step) for b in cfg.budgets],
                      branch_starts=[cfg.branch_start(b) for b in cfg.budgets], final_lr_frac=[final_lr[n] for n in names],
                      lr_area=[cfg.branch_area(b) for b in cfg.budgets], train_seconds=round(t_train, 2),
                      record_seconds=round(t_record, 2), steps_trained=n_steps, calibration=cal_names)  # fmt: skip


def _forked_rng(model: torch.nn.Module):
    """The torch random state (CPU, and the CUDA devices ``model`` is on) restored on leaving: a
    branch is a copy that never feeds back into the trunk, so it must not move the trunk's stream
    either (with dropout, adding a calibration branch changed the trunk after it and every later
    D point). Other accelerators' generators (MPS) are not forked: there a branch's dropout draws
    still move the trunk's."""
    cuda = {p.device.index if p.device.index is not None else torch.cuda.current_device()
            for p in model.parameters() if p.device.type == "cuda"}  # fmt: skip
    return torch.random.fork_rng(devices=sorted(cuda))


def _branch(trunk_model, trunk_opt, batches, probe, store, cfg, name, budget, frac, tag, base, *, tokens_per_step, loss_fn,
            device, on_step) -> tuple[float, float]:  # fmt: skip
    """Decay a copy of the trunk from its current state to ``budget`` over the share ``frac`` and
    record its end as run ``name``. Returns the last update's lr / peak and the seconds spent recording."""
    start, d = cfg.branch_start(budget, frac), cfg.decay_steps(budget, frac)
    model = copy.deepcopy(trunk_model)
    opt = _adamw(model, cfg)
    opt.load_state_dict(copy.deepcopy(trunk_opt.state_dict()))  # its own moment buffers, never the trunk's
    stream = batches(start)
    factors = cfg.decay_factors(d)
    for j, factor in enumerate(factors):
        _set_lr(opt, cfg.lr * factor)
        _update(model, opt, loss_fn, next(stream), cfg)
        if on_step is not None:
            on_step(name, start + j + 1)
    attrs = {**base, "sweep": tag, "data_budget": budget * tokens_per_step, "budget_steps": budget,
             "branch_start": start, "decay_steps": d, "decay_frac": frac, "lr_area": cfg.branch_area(budget, frac),
             "decay_lr": factors, "lr_schedule": f"trunk to step {start}, then {cfg.shape} decay to {cfg.floor} x peak"}  # fmt: skip
    with TokenLossRecorder(model, probe, store, name, schedule=[budget], device=device, run_attrs=attrs) as rec:
        rec.record(budget, tokens_seen=budget * tokens_per_step, lr=cfg.lr * factors[-1])
    return factors[-1], rec.record_seconds


def _adamw(model: torch.nn.Module, cfg: DecaySweepConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def _update(model, opt, loss_fn, batch, cfg: DecaySweepConfig) -> None:
    loss = loss_fn(model, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
