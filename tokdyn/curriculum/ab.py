"""Curriculum v2 measurement: mixture schedules on a corpus of domains, coupled, on a budget ladder.

The design is docs/method.md, "Reshaping training":

1. **Pilot** (its compute reported apart): the uniform mixture from another seed, trained
   without the last tenth of each domain's training documents, a probe of windows of those
   documents recorded and fitted (``pilot_probe="split"``; :class:`~.pilot.PilotSplit`: text the
   pilot never trained on, from the training pool, so no validation document reaches the
   schedule); per-domain learning-time densities
   (:class:`~tokdyn.curriculum.mixture.DomainRates`), a learnability table for window scores.
2. **Enrichment** of the mixture schedule, printed before any arm trains.
3. Per seed, from the seed's initial weights, every run draws its batches through one
   :class:`~tokdyn.curriculum.coupled.CoupledSampler` keyed by the seed:

   - ``base@0.8``, ``base@0.9``, ``base@1.0``: the uniform mixture, fully annealed at 0.8x,
     0.9x, 1.0x of the steps (the budget ladder; a shorter rung sees the first batches of the
     longer ones);
   - ``aa``: the uniform mixture through the arm code path (A/A): its batches are checked
     bit-identical to ``base@1.0``'s on every seed and it is trained on ``aa_train_seeds``;
   - ``mixture``: domain weights from the pilot's per-domain spectra;
   - ``reducible``: windows weighted by predicted reducible loss (the pilot's loss at the step
     minus its final loss, predicted per window by the learnability table);
   - ``short_long``: the uniform mixture's very batches, cut into short contexts early and
     lengthened at the steps the spectrum's position bands give
     (:class:`~tokdyn.curriculum.mixture.ContextSchedule`);
   - ``mixture_hand``: the hand-made schedule of docs/method.md, "Reshaping training" (certificates cut to a quarter
     after step 30), for reference; and the v1 per-token arms are in ``experiment.py``.

4. Per run the validation loss of every domain (held-out documents, ``val_tokens`` in all) and
   of the mixture (their mean: the baseline's mixture); per arm and seed the **speed-up** read
   off the ladder (:mod:`~tokdyn.curriculum.measure`) and the **AUC ratio** against
   ``base@1.0``, summarised with 95 % intervals over seeds (t, widened by the bootstrap); the **positive control**
   (the 0.9x rung read against the others) and the **A/A** difference.

:func:`run_mixture_ab` does the work; ``pipelines/curriculum_ab.py`` parses and prints.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .._checks import is_int, is_real
from .._files import check_output_path, check_regular, loads_json, remove_store_folder, strict_json, write_atomically
from .._text import say
from .._process import exit_with_parent
from ..corpus import source_kind
from ..data import DomainCorpus, MixtureDataset, prepare_domains
from ..errors import InputError
from ..model import GPTConfig, TinyGPT
from ..train import TrainConfig, lr_factor, resolve_device
from .coupled import CoupledSampler, domain_probabilities
from .measure import auc_ratio, paired_bootstrap, speedup
from .mixture import ContextSchedule, DomainRates, MixtureConfig, MixtureSchedule, enrichment_verdict, pilot_events

__all__ = ["MixtureABConfig", "MIXTURE_ARMS", "run_mixture_ab", "ArmSpec", "build_arms"]

MIXTURE_ARMS = ("aa", "mixture", "reducible", "short_long", "mixture_hand")
# where the pilot's probe windows come from: the training windows it trains on; the validation
# documents (windows between the measurement's own); training documents held out from the pilot
PILOT_PROBES = ("train", "heldout", "split")


@dataclass(frozen=True)
class MixtureABConfig:
    """Sizes and knobs of the v2 measurement. The defaults fit 15 minutes on 2 unloaded CPU
    cores (docs/curriculum.md says why these sizes)."""

    source: str = "stdlib-mix"
    max_train_tokens: int | None = None
    steps: int = 500
    batch_size: int = 32
    context: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    lr: float = 3e-3
    seeds: tuple[int, ...] = tuple(range(10))
    arms: tuple[str, ...] = ("aa", "mixture", "reducible", "short_long")
    ladder: tuple[float, ...] = (0.8, 0.9, 1.0)
    aa_train_seeds: int = 1
    pilot_seed: int = 1000
    pilot_per_domain: int = 32
    pilot_probe: str = "split"
    pilot_share: float = 0.1
    pilot_points: int = 30
    val_tokens: int = 32768
    eval_points: int = 10
    floor: float = 0.3
    temperature: float = 1.0
    width: float = 0.2
    lead: float = 0.0
    reducible_floor: float = 0.5
    reducible_width: float = 0.3
    contexts: tuple[int, ...] = (16, 32, 64)
    context_start: float = 0.25
    compare_seed: int | None = None
    reuse: str | None = None
    device: str = "cpu"
    workers: int = 2
    threads: int = 1

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in MIXTURE_ARMS]
        if unknown:
            raise InputError(f"unknown arms {unknown}; choose from {list(MIXTURE_ARMS)}")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds or min(self.seeds) < 0:
            raise InputError(f"seeds must be distinct, >= 0 and at least one, got {self.seeds}")
        if self.compare_seed is not None and self.compare_seed not in self.seeds:
            raise InputError(f"compare_seed {self.compare_seed} is not one of the seeds {list(self.seeds)}")
        if self.pilot_seed < 0:
            raise InputError(f"pilot_seed must be >= 0, got {self.pilot_seed}")
        lad = tuple(self.ladder)
        if len(lad) < 2 or 1.0 not in lad or any(b <= a for a, b in zip(lad, lad[1:])) or lad[0] <= 0:
            raise InputError(f"ladder must be >= 2 increasing budgets including 1.0, got {self.ladder}")
        if self.eval_points < 2 or self.steps < self.eval_points:
            raise InputError(f"need 2 <= eval_points <= steps, got {self.eval_points} and {self.steps}")
        if self.contexts[-1] != self.context:
            raise InputError(f"the longest of contexts {self.contexts} must be the model context {self.context}")
        if self.pilot_probe not in PILOT_PROBES:
            raise InputError(f"pilot_probe must be one of {list(PILOT_PROBES)}, got {self.pilot_probe!r}")
        if not 0.0 < self.pilot_share < 1.0:
            raise InputError(f"pilot_share must be in (0, 1), got {self.pilot_share}")
        if self.workers < 1 or self.threads < 1:
            raise InputError("workers and threads must be >= 1")

    @classmethod
    def quick(cls, **overrides) -> "MixtureABConfig":
        """Tiny sizes for CI (well under a minute)."""
        base = dict(steps=40, batch_size=8, context=32, n_layer=1, n_head=2, n_embd=32, seeds=(0, 1, 2), aa_train_seeds=3,
                    arms=("aa", "mixture", "reducible", "short_long"), pilot_per_domain=6, pilot_points=10,
                    val_tokens=2048, eval_points=4, contexts=(8, 16, 32), workers=1,
                    max_train_tokens=40_000, compare_seed=0)  # fmt: skip
        return cls(**{**base, **overrides})

    def model_config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig(vocab_size=vocab_size, context=self.context, n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd)


@dataclass
class ArmSpec:
    """How one run draws and shapes its batches: ``probabilities(step) -> [N]`` (None: the
    baseline) and an optional context schedule."""

    name: str
    probabilities: Callable[[int], np.ndarray] | None = None
    contexts: ContextSchedule | None = None


def build_arms(cfg: MixtureABConfig, *, dataset: MixtureDataset, base: np.ndarray, rates: DomainRates,
               table=None, events=None, probe_pos=None, domains=()) -> tuple[dict[str, ArmSpec], dict]:  # fmt: skip
    """The arms' specs and what describes them (weights, enrichment, switch steps)."""
    arms, info = {}, {}
    ids = dataset.domain_ids
    for name in cfg.arms:
        if name == "aa":
            flat = MixtureSchedule(rates, MixtureConfig(total_steps=cfg.steps, floor=1.0))  # uniform, same code
            arms[name] = ArmSpec(name, _DomainProbs(ids, flat))
        elif name == "mixture":
            sched = MixtureSchedule(rates, MixtureConfig(total_steps=cfg.steps, floor=cfg.floor, temperature=cfg.temperature,
                                                         width=cfg.width, lead=cfg.lead))  # fmt: skip
            arms[name] = ArmSpec(name, _DomainProbs(ids, sched))
            info[name] = sched.to_dict()
        elif name == "mixture_hand":
            arms[name] = ArmSpec(name, _DomainProbs(ids, _HandSchedule(domains, cfg.steps)))
        elif name == "reducible":
            if table is None:
                raise InputError("the reducible arm needs the pilot's learnability table")
            red = ReducibleLoss(table, dataset, base, total_steps=cfg.steps, floor=cfg.reducible_floor,
                                width=cfg.reducible_width, x_end=math.log10(cfg.steps))  # fmt: skip
            arms[name] = ArmSpec(name, red)
            info[name] = red.describe(dataset)
        elif name == "short_long":
            cs = ContextSchedule.from_events(events, probe_pos, contexts=cfg.contexts, total_steps=cfg.steps, start=cfg.context_start)
            arms[name] = ArmSpec(name, None, cs)
            info[name] = cs.to_dict()
    return arms, info


class _DomainProbs:
    """``step -> [N]`` per-sample probabilities of a domain schedule (picklable)."""

    def __init__(self, domain_ids, schedule) -> None:
        self.ids, self.schedule = domain_ids, schedule

    def __call__(self, step: int) -> np.ndarray:
        return domain_probabilities(self.ids, self.schedule.weights(step))


class _HandSchedule:
    """The hand-made schedule of docs/method.md ("Reshaping training"): equal weights, certificates' share cut to a quarter
    after step 30."""

    def __init__(self, domains, total_steps: int) -> None:
        self.w0 = np.full(len(domains), 1.0 / len(domains))
        w = np.ones(len(domains))
        if "certs" in domains:
            w[list(domains).index("certs")] = 0.25
        self.w1 = w / w.sum()

    def weights(self, step: int) -> np.ndarray:
        return self.w0 if step < 30 else self.w1


class ReducibleLoss:
    """Window selection by predicted reducible loss.

    Per window ``i`` and step ``t``, ``R_i(t) = sum_j max(delta_j, 0) [F((x_end - mu_j)/w) -
    F((x_t - mu_j)/w)]``: the loss the pilot still dropped between step ``t`` and its end,
    predicted per token by the learnability table (``F`` the logistic CDF). The probabilities
    tilt the baseline's: ``p_i = p0_i (floor + (1 - floor) R_i / sum_j p0_j R_j)``.
    """

    def __init__(self, table, dataset: MixtureDataset, base: np.ndarray, *, total_steps: int, floor: float = 0.5,
                 width: float = 0.3, x_end: float, bin_width: float = 0.05) -> None:  # fmt: skip
        from .schedule import CurriculumConfig, SampleSchedule

        windows = np.concatenate([p.windows() for p in dataset.parts])
        sched = SampleSchedule(table, windows, CurriculumConfig(total_steps=total_steps), tokenizer=table.vocab_size,
                               bin_width=bin_width)  # fmt: skip
        self.centers, self.hist = sched.centers, sched.hist  # (bins,), (N, bins) predicted drop by predicted mu
        self.base, self.floor, self.width, self.x_end = base, float(floor), float(width), float(x_end)
        self.total_steps = int(total_steps)

    def reducible(self, step: int) -> np.ndarray:
        x = math.log10(int(step) + 1)
        g = _logistic_cdf((self.x_end - self.centers) / self.width) - _logistic_cdf((x - self.centers) / self.width)
        return (self.hist @ np.clip(g, 0, None).astype(np.float32)).astype(np.float64)

    def __call__(self, step: int) -> np.ndarray:
        r = self.reducible(step)
        m = float(self.base @ r)
        if not m > 0:
            return self.base
        return self.base * (self.floor + (1 - self.floor) * r / m)

    def describe(self, dataset: MixtureDataset) -> dict:
        steps = sorted({0, self.total_steps // 10, self.total_steps // 2, self.total_steps - 1})
        share = {}
        for s in steps:
            p = self(s)
            share[str(s)] = np.bincount(dataset.domain_ids, weights=p, minlength=len(dataset.counts)).tolist()
        return {"domain_share_at_step": share, "floor": self.floor, "width": self.width}


def _logistic_cdf(z):
    return 1.0 / (1.0 + np.exp(-z))


# -- one training run ---------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(state: dict, threads: int, parent: int | None = None) -> None:
    if parent is not None:  # a worker pool's process: gone with the experiment's
        exit_with_parent(parent)
    torch.set_num_threads(threads)
    _WORKER.clear()
    _WORKER.update(state)


@torch.no_grad()
def evaluate_domains(model, val: torch.Tensor, *, batch: int = 128) -> np.ndarray:
    """Mean validation loss of each domain ``[D]`` on ``val [D, n, C+1]``."""
    was = model.training
    model.eval()
    out = []
    for k in range(val.shape[0]):
        tot = 0.0
        for a in range(0, val.shape[1], batch):
            w = val[k, a : a + batch]
            logits = model(w[:, :-1])  # (b, C, V)
            tot += float(F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum"))
        out.append(tot / (val.shape[1] * (val.shape[2] - 1)))
    model.train(was)
    return np.array(out)


def _run_job(job: tuple[int, str, float], record: dict | None = None) -> dict:
    """Train one run (seed, arm, budget) and return its validation losses; with ``record``
    (``store``, ``run``, ``probe``, ``n_points``) the pilot's probe is recorded along the way."""
    import contextlib

    seed, arm, budget = job
    st = _WORKER
    cfg: MixtureABConfig = st["cfg"]
    dev = torch.device(st["device"])
    spec: ArmSpec | None = st["arms"].get(arm)
    steps = int(round(budget * cfg.steps))
    ds: MixtureDataset = st["dataset"]
    val = st["val"].to(dev)
    sampler = CoupledSampler(st["base"], spec.probabilities if spec else None, samples_per_step=cfg.batch_size,
                             total_steps=steps, seed=seed)  # fmt: skip
    torch.manual_seed(seed)
    model = TinyGPT(st["model_config"]).to(dev)
    tc = TrainConfig(steps=steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, tc))
    eval_at = set(st["eval_steps"]) if budget == 1.0 else set()
    curve, digest = [], hashlib.sha256()
    t0 = time.perf_counter()
    stack = contextlib.ExitStack()
    if record is not None:
        from ..record import TokenLossRecorder
        from ..schedule import geometric_schedule

        rec = stack.enter_context(TokenLossRecorder(model, record["probe"], record["store"], record["run"], device=dev,
                                                    schedule=geometric_schedule(steps, record["n_points"]), rank=0, world_size=1))  # fmt: skip (one process trains)
        stack.enter_context(rec.attach(opt))
    with stack:
        kept = _loop(model, opt, sched, sampler, spec, ds, val, cfg, tc, eval_at, dev, digest, curve)
    final = evaluate_domains(model, val)
    if eval_at:
        curve.append(final.tolist())
    return {"seed": seed, "arm": arm, "budget": budget, "steps": steps, "final": final.tolist(),
            "final_mixture": float(final.mean()), "curve": curve, "draws_sha256": digest.hexdigest(),
            "kept_share": kept / (steps * cfg.batch_size), "seconds": time.perf_counter() - t0}  # fmt: skip


def _loop(model, opt, sched, sampler, spec, ds, val, cfg, tc, eval_at, dev, digest, curve) -> int:
    """The training steps of one run; returns how many drawn indices were the baseline's."""
    kept = 0
    for t in range(tc.steps):
        idx, keep = sampler.kept(t)
        digest.update(idx.astype(np.int64).tobytes())
        kept += int(keep.sum())
        batch = ds.batch(idx).to(dev, non_blocking=True)  # (B, C+1)
        c = spec.contexts.context(t) if spec is not None and spec.contexts is not None else cfg.context
        x, y = ContextSchedule.split(batch, c)  # (B*C/c, c) each
        logits = model(x)  # (B', c, V)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        sched.step()
        if t + 1 in eval_at and t + 1 < tc.steps:
            curve.append(evaluate_domains(model, val).tolist())
    return kept


def _map(jobs, state: dict, cfg: MixtureABConfig, log) -> list[dict]:
    if cfg.workers == 1:
        _init_worker(state, cfg.threads)
        out = []
        for j in jobs:
            out.append(_run_job(j))
            _log_job(out[-1], log)
        return out
    import multiprocessing as mp

    ctx = mp.get_context("fork" if cfg.device == "cpu" else "spawn")
    out = []
    with ctx.Pool(cfg.workers, initializer=_init_worker, initargs=(state, cfg.threads, os.getpid())) as pool:
        for r in pool.imap_unordered(_run_job, jobs):
            out.append(r)
            _log_job(r, log)
    return out


def _log_job(r: dict, log) -> None:
    name = f"base@{r['budget']:g}" if r["arm"] == "base" else r["arm"]
    log(f"      seed {r['seed']:>2} {name:<12} {r['steps']:>5} steps  val mixture {r['final_mixture']:.4f}  ({r['seconds']:.0f} s)")


# -- the experiment -----------------------------------------------------------------------


def run_mixture_ab(out: str | os.PathLike, config: MixtureABConfig = MixtureABConfig(), *,
                   corpus: DomainCorpus | None = None, log: Callable[[str], None] = say) -> dict:  # fmt: skip
    """Run the whole measurement into folder ``out`` (``pilot.zarr``, ``learnability.npz``,
    ``results.json``, ``curves.png``); returns the results."""
    from .learnability import LearnabilityOptions, build_table
    from .pilot import run_mixture_pilot

    cfg = config
    dev = resolve_device(cfg.device)
    out = Path(out)
    check_output_path(out, what="results folder", folder_ok=True)  # created; the folder above it is not
    reused = _reusable_base_runs(cfg, log) if cfg.reuse else []  # read before the pilot: a bad file is said at once
    out.mkdir(exist_ok=True)
    t_start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    corpus = corpus or prepare_domains(cfg.source, max_train_tokens=cfg.max_train_tokens,
                                       domain_field="domain" if source_kind(cfg.source) == "jsonl" else None)  # fmt: skip
    if len(corpus.domains) < 2:
        log(f"note: only one domain ({corpus.domains[0]}) has text here: a mixture schedule cannot do anything")
    ds = MixtureDataset(corpus, context=cfg.context)
    per_dom = max(1, math.ceil(cfg.val_tokens / (len(corpus.domains) * cfg.context)))
    val = torch.from_numpy(corpus.val_windows(context=cfg.context, per_domain=per_dom))
    mcfg = cfg.model_config(corpus.tokenizer.vocab_size)
    base = domain_probabilities(ds.domain_ids, np.full(len(corpus.domains), 1.0 / len(corpus.domains)))
    log(f"[0/4] corpus {cfg.source}: domains {', '.join(f'{d} ({n:,} windows)' for d, n in zip(corpus.domains, ds.counts))}; "
        f"validation {val.shape[0]} x {val.shape[1]} windows = {val.shape[0] * val.shape[1] * cfg.context:,} tokens")  # fmt: skip

    log(f"[1/4] pilot: uniform mixture, seed {cfg.pilot_seed}, {cfg.steps} steps, {cfg.pilot_per_domain} windows per domain recorded")
    t = time.perf_counter()
    store = out / "pilot.zarr"
    remove_store_folder(store, what="pilot store")
    pilot_base, probe, probe_info = _pilot_pool(cfg, corpus, ds, base)
    pilot_sampler = CoupledSampler(pilot_base, samples_per_step=cfg.batch_size, total_steps=cfg.steps, seed=cfg.pilot_seed)
    batches = (ds.batch(pilot_sampler.draws(s)).to(dev) for s in range(cfg.steps))
    pilot = run_mixture_pilot(store, dataset=ds, domains=corpus.domains, batches=batches, model_config=mcfg,
                              train_config=TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.pilot_seed),
                              tokenizer=corpus.tokenizer.spec(), per_domain=cfg.pilot_per_domain, n_points=cfg.pilot_points,
                              device=str(dev), probe=probe)  # fmt: skip
    pe = pilot_events(store, "pilot")
    events = pe.events
    rates = DomainRates.from_events(events, pe.token_domain, corpus.domains, width=cfg.width)
    table = None
    if "reducible" in cfg.arms:
        table = build_table(store, "pilot", options=LearnabilityOptions(min_count=2 if cfg.steps < 100 else 5, holdout=0.0))
        table.save(out / "learnability.npz")
    arms, arm_info = build_arms(cfg, dataset=ds, base=base, rates=rates, table=table, events=events,
                                probe_pos=pe.token_pos, domains=corpus.domains)  # fmt: skip
    pilot_s = time.perf_counter() - t
    pilot_info = {"seconds": pilot_s, "steps": cfg.steps, "tokens": cfg.steps * cfg.batch_size * cfg.context,
                  "train_seconds": pilot["train_seconds"], "n_events": len(events), "rates": rates.to_dict(),
                  "class_counts": pilot["fit"].get("class_counts"), "probe": probe_info}  # fmt: skip
    log(f"      {pilot_s:.0f} s (pilot compute: {cfg.steps} steps = one 1.0x run, not counted in the arms' budget); "
        f"{len(events)} events")

    sched = MixtureSchedule(rates, MixtureConfig(total_steps=cfg.steps, floor=cfg.floor, temperature=cfg.temperature,
                                                 width=cfg.width, lead=cfg.lead))  # fmt: skip
    enr = sched.enrichment()
    log(f"[2/4] mixture schedule, before training: {enrichment_verdict(enr)}")
    for s in sorted({0, 9, 29, cfg.steps // 3, cfg.steps - 1} & set(range(cfg.steps))):
        log(f"      step {s + 1:>5}: " + ", ".join(f"{d} {w:.2f}" for d, w in zip(corpus.domains, sched.weights(s))))
    if "short_long" in arm_info:
        log(f"      short_long: contexts {arm_info['short_long']['contexts']} switching at steps {arm_info['short_long']['switch_steps']}")

    jobs = [(s, "base", b) for s in cfg.seeds for b in cfg.ladder]
    for s_i, s in enumerate(cfg.seeds):
        for a in cfg.arms:
            if a != "aa" or s_i < cfg.aa_train_seeds:
                jobs.append((s, a, 1.0))
    done = {(r["seed"], r["arm"], r["budget"]) for r in reused}
    jobs = [j for j in jobs if j not in done]
    jobs.sort(key=lambda j: -j[2])  # longest first: better packing over workers
    eval_steps = np.unique(np.linspace(0, cfg.steps, cfg.eval_points + 1).round().astype(int)[1:]).tolist()
    log(f"[3/4] {len(jobs)} runs ({len(cfg.seeds)} seeds; ladder {list(cfg.ladder)}; arms {list(cfg.arms)}) on {cfg.workers} worker(s)")
    state = {"cfg": cfg, "device": str(dev), "arms": arms, "dataset": ds, "val": val, "base": base,
             "model_config": mcfg, "eval_steps": eval_steps}  # fmt: skip
    t = time.perf_counter()
    runs = reused + _map(jobs, state, cfg, log)
    train_s = time.perf_counter() - t

    compare = None
    if cfg.compare_seed is not None:
        compare = _record_and_compare(cfg, state, store, runs, log)
    log("[4/4] compare")
    aa_identical = _aa_check(cfg, ds, base, arms.get("aa"))
    results = {
        "config": asdict(cfg),
        "domains": list(corpus.domains),
        "corpus": corpus.n_documents,
        "validation": {"windows_per_domain": per_dom, "tokens": int(val.shape[0] * val.shape[1] * cfg.context)},
        "pilot": pilot_info,
        "enrichment": enr,
        "enrichment_verdict": enrichment_verdict(enr),
        "arm_info": arm_info,
        "eval_steps": eval_steps,
        "runs": runs,
        "aa_batches_identical": aa_identical,
        "compare": compare,
        **summarize_runs(runs, cfg, corpus.domains),
        "train_seconds": train_s,
        "total_seconds": time.perf_counter() - t_start,
    }
    _write_results(out / "results.json", results)
    try:
        plot_mixture(results, out / "curves.png")
    except ImportError:  # matplotlib is optional
        pass
    for line in headline_lines(results):
        log("      " + line)
    log(f"done in {results['total_seconds']:.0f} s (pilot {pilot_s:.0f} s, runs {train_s:.0f} s); wrote {out / 'results.json'}")
    return results


# what must agree for a previous run's baselines to stand in for this one's
_LADDER_FIELDS = ("source", "max_train_tokens", "steps", "batch_size", "context", "n_layer", "n_head", "n_embd", "lr",
                  "val_tokens", "eval_points", "threads", "device")


def _write_results(path: Path, results: dict) -> None:
    """``results.json`` as strict JSON (a diverged seed's NaN written null: a bare NaN is no
    JSON, and jq or another language's parser refused the file), written whole or not at all."""
    write_atomically(path, lambda fh: fh.write(json.dumps(strict_json(results), indent=2, allow_nan=False)), what="results")


def _finite(value) -> bool:
    """Whether a run's record holds finite numbers wherever it holds numbers (null: a NaN written
    strict; a bare NaN: a results.json written before)."""
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))  # null, or a bare NaN of an older file


def _is_run_record(r) -> bool:
    """Whether ``r`` has the fields of a run of :func:`_run_job` that a reused baseline is read by,
    with their types: an edited or foreign file is refused at ``--reuse``, not met as a
    traceback in the comparison. (A null loss stands for a run that diverged; it is trained again.)"""
    def losses(v):
        return isinstance(v, list) and all(x is None or is_real(x) for x in v)

    return (isinstance(r, dict) and isinstance(r.get("arm"), str) and is_int(r.get("seed")) and is_real(r.get("budget"))
            and losses(r.get("final")) and (r.get("final_mixture") is None or is_real(r.get("final_mixture")))
            and isinstance(r.get("curve"), list) and all(map(losses, r["curve"])))  # fmt: skip


def _reusable_base_runs(cfg: MixtureABConfig, log) -> list[dict]:
    """The baseline (ladder) runs of a previous ``results.json`` (``cfg.reuse``) made with the
    same data, model, steps and validation: they are deterministic, so rerunning them would
    reproduce them. Arms are never reused."""
    path = check_regular(cfg.reuse, "--reuse file")  # a FIFO would block the read forever
    try:
        prev = loads_json(path.read_bytes())
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, and bytes that are not UTF-8
        raise InputError(f"--reuse {cfg.reuse}: not a readable results.json ({exc})") from None
    runs = prev.get("runs") if isinstance(prev, dict) else None
    if not (isinstance(runs, list) and isinstance(prev.get("config", {}), dict) and all(map(_is_run_record, runs))):
        raise InputError(f"--reuse {cfg.reuse}: not a results.json of this pipeline (a list of runs, each with its arm, seed, "
                         "budget, final losses and curve)")  # fmt: skip
    pc = prev.get("config", {})
    diff = {k: (pc.get(k), getattr(cfg, k)) for k in _LADDER_FIELDS if pc.get(k) != getattr(cfg, k)}
    if diff:
        raise InputError(f"--reuse {cfg.reuse}: its baselines were made with other settings (then, now): {diff}")
    out = [r for r in prev.get("runs", []) if r["arm"] == "base" and r["seed"] in cfg.seeds and r["budget"] in cfg.ladder
           and _finite(r)]  # a run whose loss was not finite (null in the file) is trained again  # fmt: skip
    log(f"      reusing {len(out)} baseline runs of {cfg.reuse}")
    return out


def _pilot_pool(cfg: MixtureABConfig, corpus: DomainCorpus, ds: MixtureDataset, base: np.ndarray):
    """The pilot's sampling probabilities, its probe (None: :func:`~.pilot.mixture_probe`'s
    training windows) and what describes them, for ``cfg.pilot_probe``."""
    if cfg.pilot_probe == "heldout":
        return base, _heldout_probe(corpus, cfg), {"kind": "heldout", "note": "windows of the validation documents"}
    if cfg.pilot_probe == "train":
        return base, None, {"kind": "train", "note": "training windows the pilot trains on"}
    from .pilot import split_pilot_pool

    sp = split_pilot_pool(ds, eot_id=corpus.tokenizer.eot_id, share=cfg.pilot_share)
    probe = sp.probe(ds, per_domain=cfg.pilot_per_domain, domains=corpus.domains, tokenizer=corpus.tokenizer.spec())
    held = np.bincount(ds.domain_ids, weights=sp.held, minlength=len(corpus.domains)).astype(int).tolist()
    return sp.pilot_probabilities(base, ds.domain_ids), probe, {
        "kind": "split", "share": cfg.pilot_share, "held_windows": dict(zip(corpus.domains, held)),
        "cut_on_document_boundary": dict(zip(corpus.domains, sp.boundary)),
        "note": "training documents held out from the pilot (the arms train on them; validation is never seen)"}  # fmt: skip


def _heldout_probe(corpus: DomainCorpus, cfg: MixtureABConfig):
    """A pilot probe of held-out windows: the validation documents' windows halfway between
    the measurement's own windows (the per-domain spectra then say when each domain's
    *held-out* loss falls; the schedule has seen those documents, not those windows)."""
    from ..probe import ProbeSet

    w = corpus.val_windows(context=cfg.context, per_domain=cfg.pilot_per_domain, offset=0.5)  # (D, n, C+1)
    dom = np.repeat(np.arange(w.shape[0]), w.shape[1]).astype(np.int32)
    return ProbeSet.from_tokens(w.reshape(-1, w.shape[-1]), domain=dom, domains=corpus.domains, documents=("held-out",),
                                tokenizer=corpus.tokenizer.spec())  # fmt: skip


def _record_and_compare(cfg: MixtureABConfig, state: dict, store: Path, runs: list[dict], log) -> dict:
    """Rerun seed ``compare_seed``'s baseline and arms recording the pilot's probe into the
    pilot store, fit them, and compare each arm's learning times with the baseline's
    (:func:`tokdyn.compare.compare_runs`). The reruns must reproduce the unrecorded runs. The
    baseline of another seed is recorded and compared too: the spread of shifts between two runs
    that differ only in their seed, against which an arm's shifts are read."""
    from ..compare import compare_runs
    from ..fit.job import fit_run
    from ..store import open_store

    seed = cfg.compare_seed
    probe = open_store(store, mode="r").probe
    _init_worker(state, cfg.threads)
    out, same = {}, True
    log(f"      recording seed {seed}'s baseline and arms on the pilot's probe for tokdyn compare")
    for arm in ("base", *cfg.arms):
        name = f"s{seed}-{arm}"
        r = _run_job((seed, arm, 1.0), record={"store": os.fspath(store), "run": name, "probe": probe, "n_points": cfg.pilot_points})
        ref = next((x for x in runs if (x["seed"], x["arm"], x["budget"]) == (seed, arm, 1.0)), None)
        same &= ref is None or ref["final"] == r["final"]
        fit_run(open_store(os.fspath(store), mode="r+").run(name), progress=False)
    pairs = [(arm, f"s{seed}-{arm}") for arm in cfg.arms]
    other = next((s for s in cfg.seeds if s != seed), None)
    if other is not None:  # the reference: how far events move between two baselines that differ only in seed
        name = f"s{other}-base"
        _run_job((other, "base", 1.0), record={"store": os.fspath(store), "run": name, "probe": probe, "n_points": cfg.pilot_points})
        fit_run(open_store(os.fspath(store), mode="r+").run(name), progress=False)
        pairs.append((f"base, seed {other}", name))
    for label, name in pairs:
        out[label] = compare_runs(store, f"s{seed}-base", name)
        o = out[label]["overall"]
        log(f"      compare {label:<12} median shift {o['median_shift']:+.3f} decades (q25 {o['q25']:+.3f}, q75 {o['q75']:+.3f}), "
            f"loss drop moved earlier {o['drop_share_earlier']:.1%} / later {o['drop_share_later']:.1%}")  # fmt: skip
    return {"seed": seed, "store": os.fspath(store), "reruns_reproduce": bool(same), "arms": out,
            "reference": f"base, seed {other}" if other is not None else None}  # fmt: skip


def _aa_check(cfg: MixtureABConfig, ds, base, spec: ArmSpec | None) -> dict | None:
    """Whether the A/A arm's draws equal the baseline's at every step of every seed."""
    if spec is None:
        return None
    same = True
    for s in cfg.seeds:
        a = CoupledSampler(base, samples_per_step=cfg.batch_size, total_steps=cfg.steps, seed=s)
        b = CoupledSampler(base, spec.probabilities, samples_per_step=cfg.batch_size, total_steps=cfg.steps, seed=s)
        same &= all(np.array_equal(a.draws(t), b.draws(t)) for t in range(cfg.steps))
    return {"seeds": list(cfg.seeds), "identical": bool(same)}


def summarize_runs(runs: list[dict], cfg: MixtureABConfig, domains) -> dict:
    """Per arm: speed-up (ladder), AUC ratio, final losses; the positive control; the A/A."""
    by = {(r["seed"], r["arm"], r["budget"]): r for r in runs}
    seeds = [s for s in cfg.seeds if all((s, "base", b) in by for b in cfg.ladder)]
    ladder = {s: [by[(s, "base", b)]["final_mixture"] for b in cfg.ladder] for s in seeds}
    lad_dom = {s: np.array([by[(s, "base", b)]["final"] for b in cfg.ladder]) for s in seeds}  # (R, D)
    full = cfg.ladder.index(1.0)
    arms = {}
    for arm in cfg.arms:
        sp, auc, outside, diverged, unreadable, dom_sp, finals, diffs = [], [], [], [], [], [], [], []
        for s in seeds:
            r = by.get((s, arm, 1.0))
            if r is None:
                continue
            v, inside = speedup(cfg.ladder, ladder[s], r["final_mixture"])
            b = by[(s, "base", 1.0)]
            a = auc_ratio(cfg_eval_steps(cfg), np.mean(r["curve"], axis=1), np.mean(b["curve"], axis=1))
            dom = [speedup(cfg.ladder, lad_dom[s][:, k], r["final"][k])[0] for k in range(len(domains))]
            # a seed whose arm or baseline loss is not finite has no figures: said by name, each
            # of them NaN so that every mean leaves it out and counts it (n_left_out)
            if not (np.isfinite(r["final_mixture"]) and np.all(np.isfinite(ladder[s]))):
                diverged.append(s)
                v, a, dom = float("nan"), float("nan"), [float("nan")] * len(domains)
            elif not math.isfinite(v):
                # the ladder's segment at the arm's loss does not fall (a rung no lower than the one
                # below it): no budget to read, so no speed-up; it was called "outside the ladder",
                # and the seed left out of the mean unnamed is the one where the arm did worst
                unreadable.append(s)
            elif not inside:
                outside.append(s)
            sp.append(v)
            finals.append(r["final_mixture"])
            diffs.append(r["final_mixture"] - ladder[s][full] if s not in diverged else float("nan"))
            auc.append(a)
            dom_sp.append(dom)
        if not sp:
            continue
        d = np.array(dom_sp)
        arms[arm] = {"speedup": paired_bootstrap(sp), "auc_ratio": paired_bootstrap(auc),
                     "per_seed": {"speedup": sp, "auc_ratio": auc, "final_mixture": finals},
                     "outside_ladder": outside, "diverged": diverged, "unreadable": unreadable,
                     "domain_speedup": {dom: paired_bootstrap(d[:, k]) for k, dom in enumerate(domains)},
                     "final_loss_diff": paired_bootstrap(diffs)}  # fmt: skip
    control = None
    if 0.9 in cfg.ladder and len(cfg.ladder) >= 3:
        i = cfg.ladder.index(0.9)
        rest = [b for b in cfg.ladder if b != 0.9]
        vals = []
        for s in seeds:
            ls = [lo for b, lo in zip(cfg.ladder, ladder[s]) if b != 0.9]
            vals.append(speedup(rest, ls, ladder[s][i], used=1.0)[0])
        finite = {s: bool(np.all(np.isfinite(ladder[s]))) for s in seeds}
        control = {"expected": 1 - 1 / 0.9, "speedup": paired_bootstrap(vals), "per_seed": vals,
                   # a seed whose ladder is not finite diverged (as the arms say); one whose
                   # rungs give no budget to read is unreadable
                   "diverged": [s for s in seeds if not finite[s]],
                   "unreadable": [s for s, v in zip(seeds, vals) if not math.isfinite(v) and finite[s]],
                   "matched_budget": paired_bootstrap([1 / (1 - v) for v in vals])}  # fmt: skip
        c = control["speedup"]["ci95"]
        control["detected"] = bool(c[0] <= control["expected"] <= c[1] and c[1] < 0)
    aa = None
    aa_runs = [(by[(s, "aa", 1.0)], by[(s, "base", 1.0)]) for s in seeds if (s, "aa", 1.0) in by]
    if aa_runs:
        aa = {"seeds_trained": [a["seed"] for a, _ in aa_runs],
              "max_abs_final_loss_diff": max(abs(a["final_mixture"] - b["final_mixture"]) for a, b in aa_runs),
              "draws_identical": all(a["draws_sha256"] == b["draws_sha256"] for a, b in aa_runs)}  # fmt: skip
    base = {"final_mixture": {str(b): paired_bootstrap([ladder[s][j] for s in seeds]) for j, b in enumerate(cfg.ladder)}}
    return {"comparison": arms, "positive_control": control, "aa": aa, "baseline": base, "seeds_compared": seeds}


def cfg_eval_steps(cfg: MixtureABConfig) -> list[int]:
    return np.unique(np.linspace(0, cfg.steps, cfg.eval_points + 1).round().astype(int)[1:]).tolist()


def headline_lines(res: dict) -> list[str]:
    lines = [res["enrichment_verdict"]]
    c = res.get("positive_control")
    if c:
        s = c["speedup"]
        head = f"positive control (0.9x baseline as a full run; true {c['expected']:+.1%}): "
        gone = _diverged_note(c, why_unread="no budget to read")
        if s["n"] < 2:  # no interval to judge it by (its ci95 is NaN): not "NOT detected: the interval reaches 0"
            lines.append(head + (f"{s['mean']:+.1%}, n=1 (no interval from one seed, so not judged)" if s["n"] else
                                 "no seed's ladder could be read, so not judged") + gone)  # fmt: skip
        else:
            if c["detected"]:
                verdict = "detected"
            elif s["ci95"][1] < 0:  # seen, but the read-out is off by more than its interval: say by how much
                verdict = f"NOT detected: the true value lies outside the interval (read-out bias {s['mean'] - c['expected']:+.2%})"
            else:
                verdict = "NOT detected: the interval reaches 0"
            lines.append(f"{head}{s['mean']:+.1%} (95% CI {s['ci95'][0]:+.2%} .. {s['ci95'][1]:+.2%}) -> {verdict}{gone}")
    if res.get("aa"):
        a = res["aa"]
        lines.append(f"A/A: draws identical {a['draws_identical']}, final loss difference {a['max_abs_final_loss_diff']:.1e} "
                     f"(seeds {a['seeds_trained']}); batches identical on all seeds: {res['aa_batches_identical']['identical']}")  # fmt: skip
    for arm, c in res["comparison"].items():
        s, a = c["speedup"], c["auc_ratio"]
        if s["n"] < 2:  # one seed (or none left): no interval to give
            lines.append(f"{arm:<12} speed-up {s['mean']:+.1%}, AUC ratio {a['mean']:.4f}, n={s['n']} (no interval from "
                         f"{'one seed' if s['n'] else 'no seed'})" + _diverged_note(c))  # fmt: skip
            continue
        lines.append(f"{arm:<12} speed-up {s['mean']:+.1%} (95% CI {s['ci95'][0]:+.1%} .. {s['ci95'][1]:+.1%}), "
                     f"AUC ratio {a['mean']:.4f} ({a['ci95'][0]:.4f} .. {a['ci95'][1]:.4f}), n={s['n']}"
                     + (f"; outside the ladder on seeds {c['outside_ladder']}" if c["outside_ladder"] else "")
                     + _diverged_note(c))  # fmt: skip
    return lines


def _diverged_note(c: dict, why_unread: str = "the ladder has no budget for the arm's loss (a rung no lower than the "
                                               "one below it)") -> str:
    """``; diverged on seeds [..] (left out)`` for an arm whose loss, or its baseline's, was not
    finite on some seeds (they have no speed-up; the mean and its interval are of the others),
    and likewise for the seeds whose speed-up could not be read (``why_unread``), of an arm or of
    the positive control."""
    bad, unread = c.get("diverged") or [], c.get("unreadable") or []
    return ((f"; loss not finite (diverged) on seeds {bad}, left out" if bad else "")
            + (f"; {why_unread} on seeds {unread}, left out" if unread else ""))


def plot_mixture(res: dict, path: Path) -> None:
    """Mixture validation loss per arm (mean over seeds) and the schedule's domain weights."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._fonts import legend_labels, use_fallback_fonts

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = np.asarray(res["eval_steps"])
    curves: dict[str, list] = {}
    for r in res["runs"]:
        if r["curve"]:
            curves.setdefault("base@1" if r["arm"] == "base" else r["arm"], []).append(np.mean(r["curve"], axis=1))
    for name, cs in curves.items():
        y = np.array(cs)
        axes[0].plot(steps, y.mean(0), label=f"{name} (n={len(cs)})")
    axes[0].set_xlabel("optimizer step")
    axes[0].set_ylabel("mixture validation loss (nats)")
    axes[0].set_xscale("log")
    axes[0].legend(fontsize=8)
    info = res["arm_info"].get("mixture")
    if info:
        w = np.asarray(info["weights"])
        # the domains' names are the user's: drawn as the report draws them, each given its line
        # (a legend drops a label that starts with "_"), escapes where no font has a character
        lines = [axes[1].plot(np.arange(1, len(w) + 1), w[:, k])[0] for k in range(len(info["domains"]))]
        axes[1].set_xscale("log")
        axes[1].set_xlabel("optimizer step")
        axes[1].set_ylabel("domain weight (mixture arm)")
        axes[1].legend(lines, legend_labels(info["domains"]), fontsize=8)
    use_fallback_fonts(fig)  # before the layout is measured
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
