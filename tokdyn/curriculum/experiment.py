"""The A/B measurement of the curriculum (docs/method.md, "Reshaping training").

A pilot run and its learnability table, then, for every seed, a uniform baseline and each
curriculum arm trained with the same token budget (same steps, batch and context), the same
initial weights and the same validation set (held-out documents). Per seed and arm:

- **speed-up** ``1 - steps_arm / steps_baseline``, where ``steps_x`` is the first step at which
  run ``x``'s validation loss reaches the baseline's final one (linear interpolation between
  evaluations; the baseline may reach it before its last step). An arm that never reaches it
  gets ``steps_arm = total steps`` and the result is flagged as an upper bound;
- **AUC ratio**: area under the arm's validation-loss curve over the baseline's (trapezoids on
  the evaluation steps; < 1 is better).

:func:`run_ab` does the work; ``pipelines/curriculum_ab.py`` parses options and prints.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .._checks import is_int as _is_int, is_real
from .._files import check_output_path, remove_store_folder, strict_json, write_atomically
from .._text import say
from ..data import Corpus, WindowDataset, prepare_corpus
from ..errors import InputError
from ..model import GPTConfig, TinyGPT
from ..record.recorder import token_losses
from ..train import TrainConfig, resolve_device, train
from .learnability import LearnabilityOptions, build_table
from .pilot import run_pilot
from .sampler import CurriculumSampler
from .schedule import CurriculumConfig, SampleSchedule
from .weights import TokenWeights

__all__ = ["ABConfig", "ARMS", "run_ab", "arm_line", "steps_to_reach", "compare_curves", "summarize", "plot_curves", "weight_diagnostics"]

# arm name -> (how the curriculum is applied, which kernel width)
ARMS: dict[str, tuple[str, str | None]] = {
    "baseline": ("uniform", None),
    "sample": ("sample", "width"),
    "token": ("token", "width"),
    "sample_wide": ("sample", "wide_width"),
    "token_wide": ("token", "wide_width"),
}


@dataclass(frozen=True)
class ABConfig:
    """Sizes and knobs of the A/B run; the defaults fit in 20 minutes on 2 CPU cores."""

    steps: int = 300
    batch_size: int = 16
    context: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    lr: float = 3e-3
    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[str, ...] = ("baseline", "sample", "token", "sample_wide", "token_wide")
    pilot_steps: int | None = None  # None: the same as steps
    pilot_seed: int = 1000
    pilot_sequences: int = 256
    pilot_points: int = 30
    eval_points: int = 30
    val_sequences: int = 128
    width: float = 0.3
    wide_width: float = 0.6
    kernel: str = "logistic"
    floor: float = 0.3
    temperature: float = 1.0
    lead: float = 0.0
    learnability: LearnabilityOptions = LearnabilityOptions()
    device: str = "cpu"

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or "baseline" not in self.arms:
            raise InputError(f"arms must include 'baseline' and be some of {list(ARMS)}, got {list(self.arms)}")
        for name in ("steps", "batch_size", "context", "n_layer", "n_head", "n_embd", "pilot_sequences", "pilot_points",
                     "eval_points", "val_sequences") + (("pilot_steps",) if self.pilot_steps is not None else ()):  # fmt: skip
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise InputError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if not all(_is_int(s) for s in self.seeds) or not _is_int(self.pilot_seed):
            raise InputError(f"seeds and pilot_seed must be ints, got {self.seeds} and {self.pilot_seed!r}")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds or min(self.seeds) < 0:
            raise InputError(f"seeds must be distinct, >= 0 and at least one, got {self.seeds}")
        if self.pilot_seed < 0:
            raise InputError(f"pilot_seed must be >= 0, got {self.pilot_seed}")
        if self.eval_points < 2 or self.steps < self.eval_points:
            raise InputError(f"need 2 <= eval_points <= steps, got {self.eval_points} and {self.steps}")
        if not is_real(self.lr) \
                or not (math.isfinite(self.lr) and self.lr > 0):  # fmt: skip
            raise InputError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not isinstance(self.learnability, LearnabilityOptions):
            raise InputError(f"learnability must be a LearnabilityOptions, got {type(self.learnability).__name__}")
        # Everything the pilot and the arms will need, checked now rather than after the pilot's
        # training (a --width of -1 or a kernel "box" used to fail only when the first arm began)
        GPTConfig(vocab_size=2, context=self.context, n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd)
        for field in sorted({ARMS[a][1] for a in self.arms if ARMS[a][1]}):
            self.curriculum(field)

    @classmethod
    def quick(cls, **overrides) -> "ABConfig":
        """Tiny sizes for tests (seconds, not minutes)."""
        base = dict(steps=40, batch_size=8, context=32, n_layer=1, n_head=2, n_embd=32, seeds=(0, 1),
                    arms=("baseline", "sample", "token"), pilot_sequences=48, pilot_points=12, eval_points=5,
                    val_sequences=8, learnability=LearnabilityOptions(min_count=2))  # fmt: skip
        return cls(**{**base, **overrides})

    def curriculum(self, width_field: str) -> CurriculumConfig:
        return CurriculumConfig(total_steps=self.steps, width=getattr(self, width_field), kernel=self.kernel,
                                temperature=self.temperature, floor=self.floor, lead=self.lead)  # fmt: skip


def run_ab(out: str | Path, config: ABConfig = ABConfig(), *, corpus: Corpus | None = None,
           log: Callable[[str], None] = say) -> dict:  # fmt: skip
    """Run the whole experiment into folder ``out``: ``pilot.zarr``, ``learnability.npz``,
    ``results.json`` and ``curves.png``. Returns the results."""
    cfg = config
    dev = resolve_device(cfg.device)
    out = Path(out)
    check_output_path(out, what="results folder", folder_ok=True)  # created; the folder above it is not
    out.mkdir(exist_ok=True)
    t_start = time.perf_counter()
    corpus = corpus or prepare_corpus(context=cfg.context, n_probe_sequences=cfg.val_sequences)
    if corpus.probe.context != cfg.context:
        raise InputError(f"corpus probe context {corpus.probe.context} differs from the experiment's {cfg.context}")
    mcfg = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, context=cfg.context, n_layer=cfg.n_layer,
                     n_head=cfg.n_head, n_embd=cfg.n_embd)  # fmt: skip
    ds = WindowDataset(corpus.train_tokens, context=cfg.context)
    val = torch.as_tensor(corpus.probe.tokens[: cfg.val_sequences], dtype=torch.long, device=dev)

    log(f"[1/3] pilot: {cfg.pilot_steps or cfg.steps} steps, {cfg.pilot_sequences} training samples recorded at ~{cfg.pilot_points} steps")
    pilot_store = out / "pilot.zarr"
    remove_store_folder(pilot_store, what="pilot store")
    t = time.perf_counter()
    pilot_cfg = TrainConfig(steps=cfg.pilot_steps or cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.pilot_seed)
    pilot = run_pilot(pilot_store, corpus=corpus, model_config=mcfg, train_config=pilot_cfg, n_sequences=cfg.pilot_sequences,
                      n_points=cfg.pilot_points, probe_seed=cfg.pilot_seed, device=str(dev))  # fmt: skip
    table = build_table(pilot_store, "pilot", options=cfg.learnability)
    table.save(out / "learnability.npz")
    pilot_s = time.perf_counter() - t
    v = table.validation or {}
    log(f"      {pilot_s:.0f} s; held-out check: mu rank corr {v.get('mu_spearman', float('nan')):.3f}, "
        f"delta rank corr {v.get('delta_spearman', float('nan')):.3f}; keys per order {table.n_keys}")  # fmt: skip

    log(f"[2/3] train {len(cfg.arms)} arms x {len(cfg.seeds)} seeds, {cfg.steps} steps of {cfg.batch_size} x {cfg.context} tokens")
    schedules: dict[str, SampleSchedule] = {}
    curves: dict[str, dict[int, dict]] = {arm: {} for arm in cfg.arms}
    eval_steps = np.unique(np.linspace(0, cfg.steps, cfg.eval_points + 1).round().astype(int)[1:])
    for seed in cfg.seeds:
        for arm in cfg.arms:
            mode, width_field = ARMS[arm]
            sampler = CurriculumSampler(None, n_samples=len(ds), total_steps=cfg.steps, samples_per_step=cfg.batch_size, seed=seed)
            weights = None
            if mode == "sample":
                if width_field not in schedules:
                    schedules[width_field] = SampleSchedule(table, ds, cfg.curriculum(width_field), tokenizer=corpus.tokenizer)
                sampler = CurriculumSampler(schedules[width_field], samples_per_step=cfg.batch_size, seed=seed)
            elif mode == "token":
                weights = TokenWeights(table, cfg.curriculum(width_field), tokenizer=corpus.tokenizer, device=dev)
            t = time.perf_counter()
            curve = _train_arm(mcfg, cfg, ds, sampler, weights, val, eval_steps, seed=seed, device=dev)
            curves[arm][seed] = curve
            log(f"      seed {seed} {arm:<12} final val loss {curve['val_loss'][-1]:.4f}  ({time.perf_counter() - t:.0f} s)")

    log("[3/3] compare with the baseline")
    comparison = {arm: compare_curves(curves["baseline"], curves[arm]) for arm in cfg.arms if arm != "baseline"}
    probe_steps = np.unique(np.geomspace(1, cfg.steps, 6).round().astype(int) - 1)
    widths = sorted({ARMS[a][1] for a in cfg.arms if ARMS[a][1]})
    diagnostics = {}
    for f in widths:
        sched = schedules.get(f) or SampleSchedule(table, ds, cfg.curriculum(f), tokenizer=corpus.tokenizer)
        tw = TokenWeights(table, cfg.curriculum(f), tokenizer=corpus.tokenizer, device=dev)
        diagnostics[f] = weight_diagnostics(sched, tw, ds, steps=probe_steps)
    results = {
        "config": asdict(cfg),
        "pilot": {"seconds": pilot_s, "classes": pilot["fit"]["class_counts"],
                  "class_loss_share": pilot["fit"]["class_loss_share"], "table_keys": table.n_keys,
                  "validation": table.validation},  # fmt: skip
        "eval_steps": eval_steps.tolist(),
        "curves": {arm: {str(s): c for s, c in by_seed.items()} for arm, by_seed in curves.items()},
        "comparison": comparison,
        "weight_diagnostics": diagnostics,
        "total_seconds": time.perf_counter() - t_start,
    }
    write_atomically(out / "results.json", lambda fh: fh.write(json.dumps(strict_json(results), indent=2, allow_nan=False)),
                     what="results")  # strict JSON (a seed's NaN is null), never half written
    plot_curves(results, out / "curves.png")
    for arm, c in comparison.items():
        log(f"      {arm_line(arm, c)}")
    log(f"done in {results['total_seconds']:.0f} s; wrote {out / 'results.json'} and {out / 'curves.png'}")
    return results


def _train_arm(mcfg, cfg: ABConfig, ds, sampler, weights, val, eval_steps, *, seed: int, device) -> dict:
    """Train one arm from seed ``seed``'s initial weights; validation loss at ``eval_steps``."""
    torch.manual_seed(seed)
    model = TinyGPT(mcfg).to(device)
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)
    batches = (b.to(device, non_blocking=True) for b in loader)
    wanted = set(eval_steps.tolist())
    losses: list[float] = []

    def on_step(step: int, _loss) -> None:
        if step in wanted:
            losses.append(float(token_losses(model, val).mean()))
            model.train()

    stats = train(model, batches, TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=seed),
                  on_step=on_step, loss_weights=weights)  # fmt: skip
    return {"steps": eval_steps.tolist(), "val_loss": losses, "final_train_loss": stats["final_train_loss"],
            "train_seconds": stats["train_seconds"]}  # fmt: skip


# -- metrics -------------------------------------------------------------------------------


def weight_diagnostics(schedule: SampleSchedule, weights: TokenWeights, ds: WindowDataset, *, steps,
                       n_windows: int = 256, seed: int = 0) -> dict:  # fmt: skip
    """How strongly each way of applying one schedule reweights, at ``steps``.

    Effective share ``(sum w)^2 / (n sum w^2)`` (1: uniform; 0.1: as if a tenth of the data
    carried the weight) and the largest weight relative to uniform: of the sampling
    probabilities over all training samples, and of the token weights over ``n_windows``
    random training windows.
    """
    pick = np.random.default_rng(seed).choice(len(ds), size=min(n_windows, len(ds)), replace=False)
    batch = torch.stack([ds[int(i)] for i in pick]).to(weights.device)

    def stats(w: np.ndarray) -> tuple[float, float]:
        return float(w.sum() ** 2 / (w.size * (w * w).sum())), float(w.max() / w.mean())

    out = {"steps": [int(s) for s in steps], "sample_effective_share": [], "sample_max_over_uniform": [],
           "token_effective_share": [], "token_max_over_uniform": []}  # fmt: skip
    for step in out["steps"]:
        token_w = weights(batch, step).cpu().numpy().astype(np.float64)
        for name, w in (("sample", schedule.probabilities(step)), ("token", token_w)):
            share, top = stats(w)
            out[f"{name}_effective_share"].append(share)
            out[f"{name}_max_over_uniform"].append(top)
    return out


def arm_line(arm: str, c: dict) -> str:
    """One arm's read-out (:func:`compare_curves`) as the log line: speed-up and AUC ratio with
    their intervals, or, from fewer than two seeds, that there is none (it printed "+nan%")."""
    s, a = c["speedup"], c["auc_ratio"]
    per_seed = ", ".join(f"{x:+.1%}" for x in c["per_seed"]["speedup"])
    flags = ("; upper bound: not reached" if c["not_reached"] else "") + \
            (f"; diverged on seeds {c['diverged']}, left out" if c.get("diverged") else "") + \
            (f"; no speed-up to read on seeds {c['unreadable']} (the baseline at its final loss from the first "
             "evaluation), left out" if c.get("unreadable") else "")  # fmt: skip
    if s["n"] < 2:
        return (f"{arm:<12} speed-up {s['mean']:+.1%} (n={s['n']}: no interval from {'one seed' if s['n'] else 'no seed'}; "
                f"per seed {per_seed}{flags}), AUC ratio {a['mean']:.4f}")  # fmt: skip
    return (f"{arm:<12} speed-up {s['mean']:+.1%} (95% CI {s['ci95'][0]:+.1%} .. {s['ci95'][1]:+.1%}; per seed {per_seed}{flags}), "
            f"AUC ratio {a['mean']:.4f} ({a['ci95'][0]:.4f} .. {a['ci95'][1]:.4f})")  # fmt: skip


def steps_to_reach(steps, losses, target: float) -> tuple[float, bool]:
    """First step at which the curve ``losses`` (at ``steps``) falls to ``target``, interpolating
    linearly between evaluations (an evaluation that is NaN or inf is skipped); ``(last step,
    False)`` when it never does, and ``(nan, False)`` when ``target`` is not finite."""
    s, l = np.asarray(steps, float), np.asarray(losses, float)
    if s.ndim != 1 or s.shape != l.shape or s.size == 0:
        raise InputError(f"steps and losses must be 1-D of one length, got {s.shape} and {l.shape}")
    if not math.isfinite(target):  # a baseline that diverged: there is no loss to reach
        return float("nan"), False
    last = float(s[-1])
    s, l = s[np.isfinite(l)], l[np.isfinite(l)]  # an evaluation that is NaN or inf crosses nothing
    hit = np.flatnonzero(l <= target)
    if hit.size == 0:
        return last, False
    i = int(hit[0])
    if i == 0:
        return float(s[0]), True
    frac = (l[i - 1] - target) / (l[i - 1] - l[i])
    return float(s[i - 1] + frac * (s[i] - s[i - 1])), True


def compare_curves(baseline: dict[int, dict], arm: dict[int, dict]) -> dict:
    """Speed-up and AUC ratio of ``arm`` against ``baseline``, paired by seed, with summaries."""
    seeds = sorted(set(baseline) & set(arm))
    if not seeds:
        raise InputError("no seed was run for both the baseline and the arm")
    speed, auc, missed, diverged, unreadable = [], [], [], [], []
    for s in seeds:
        b, a = baseline[s], arm[s]
        target = b["val_loss"][-1]
        if not (math.isfinite(target) and math.isfinite(a["val_loss"][-1])):
            # a run that diverged is no faster run: its NaN evaluations were skipped, so an arm
            # that reached the target and then diverged read as a speed-up; named, left out
            diverged.append(s)
            speed.append(float("nan"))
            auc.append(float("nan"))
            continue
        steps_b, _ = steps_to_reach(b["steps"], b["val_loss"], target)
        steps_a, reached = steps_to_reach(a["steps"], a["val_loss"], target)
        if steps_b > 0:
            speed.append(1.0 - steps_a / steps_b)
        else:  # a baseline that reached its loss at step 0 gives no speed-up to read: NaN, not a ZeroDivisionError
            speed.append(float("nan"))  # (a diverged one read 0.0, "no effect"), and named, as the mixture A/B names it:
            unreadable.append(s)  # left out unnamed, the mean read as if of every seed
        auc.append(float(np.trapezoid(a["val_loss"], a["steps"]) / np.trapezoid(b["val_loss"], b["steps"])))
        if not reached:
            missed.append(s)
    return {"seeds": seeds, "per_seed": {"speedup": speed, "auc_ratio": auc}, "not_reached": missed, "diverged": diverged,
            "unreadable": unreadable, "speedup": summarize(speed), "auc_ratio": summarize(auc)}  # fmt: skip


def summarize(values) -> dict:
    """Mean, standard deviation and a 95 % Student-t interval of the mean over seeds; values that
    are not finite (a seed that diverged, or had no speed-up to read) are left out and counted
    in ``n_left_out`` (one NaN made every figure NaN)."""
    from scipy.stats import t as student_t

    v = np.asarray(values, float)
    left_out = int((~np.isfinite(v)).sum())
    v = v[np.isfinite(v)]
    n = v.size
    mean = float(v.mean()) if n else float("nan")
    if n < 2:
        return {"mean": mean, "sd": float("nan"), "ci95": [float("nan"), float("nan")], "n": n, "n_left_out": left_out}
    sd = float(v.std(ddof=1))
    half = float(student_t.ppf(0.975, n - 1) * sd / math.sqrt(n))
    return {"mean": mean, "sd": sd, "ci95": [mean - half, mean + half], "n": n, "n_left_out": left_out}


def plot_curves(results: dict, path: Path) -> None:
    """Validation loss of every arm (mean over seeds, band = min..max), full and late part."""
    from .._fonts import load_matplotlib

    matplotlib = load_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = np.asarray(results["eval_steps"])
    late = steps >= steps[-1] * 0.5
    for arm, by_seed in results["curves"].items():
        y = np.array([c["val_loss"] for c in by_seed.values()])
        for ax, sel in ((axes[0], slice(None)), (axes[1], late)):
            line = ax.plot(steps[sel], y.mean(0)[sel], label=arm)[0]
            ax.fill_between(steps[sel], y.min(0)[sel], y.max(0)[sel], color=line.get_color(), alpha=0.15)
    base = np.array([c["val_loss"][-1] for c in results["curves"]["baseline"].values()]).mean()
    axes[1].axhline(base, color="k", lw=0.8, ls="--", label="baseline final (mean)")
    axes[0].set_xscale("log")
    for ax, title in zip(axes, ("validation loss", "second half")):
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("validation loss (nats)")
        ax.set_title(title)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"curriculum A/B, {len(results['curves']['baseline'])} seeds (band: min..max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
