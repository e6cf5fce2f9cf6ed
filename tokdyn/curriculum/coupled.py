"""Coupled sampling: every arm's batches are drawn *from the baseline's draw*.

At step ``t`` the baseline draws ``B`` indices from its distribution ``p0`` over the ``N``
training samples (a generator seeded with ``(seed, t)``). An arm with distribution ``p``
keeps each drawn index ``i`` with probability ``min(1, p_i / p0_i)`` and redraws the others
from the excess ``(p - p0)+`` (a second generator, seeded ``(seed, t, 1)``). This is the
maximal coupling of ``p0`` and ``p``: each kept-or-redrawn index is distributed exactly as
``p``, and an index differs from the baseline's with probability ``TV(p, p0)``, the least
possible. With ``p == p0`` (an A/A arm: uniform weights through the same code) nothing is
redrawn and the batches are bit-identical, so any difference in the result is the schedule's,
not sampling noise. docs/method.md, "Reshaping training".

With ``p0`` uniform over samples the keep probability is ``min(1, N p_i)``; here ``p0`` may be
any baseline mixture (by default equal weight per domain, uniform within a domain).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from .._checks import as_array
from ..errors import InputError
from ._common import floats as _floats
from .sampler import StepSampler

__all__ = ["CoupledSampler", "domain_probabilities"]


def domain_probabilities(domain_ids: np.ndarray, weights) -> np.ndarray:
    """Per-sample probabilities ``[N]`` of a domain mixture: ``weights[k] / n_k`` for each of
    the ``n_k`` samples of domain ``k`` (``domain_ids [N]``, ``weights [D]`` summing to 1)."""
    w = _floats("domain weights", weights)
    # no copy of a plain array (this runs at every step); a masked one's masked samples were drawn
    ids = as_array("domain ids", domain_ids, "iu", "one integer per sample",
                   lead=f"domain ids must be one integer per sample, indices into the {w.size} domain weights")  # fmt: skip
    if w.ndim != 1 or np.any(w < 0) or not np.isclose(w.sum(), 1.0):
        raise InputError(f"domain weights must be >= 0 and sum to 1, got {w.tolist()}")
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= w.size:  # (integers: as_array)
        raise InputError(f"domain ids must be one integer per sample, indices into the {w.size} domain weights, "
                         f"got {_described(ids)}")  # fmt: skip
    counts = np.bincount(ids, minlength=w.size)
    empty = np.flatnonzero((counts == 0) & (w > 0))
    if empty.size:
        raise InputError(f"domain(s) {empty.tolist()} have weight > 0 ({w[empty].tolist()}) but no training sample")
    per = np.divide(w, counts, out=np.zeros_like(w), where=counts > 0)
    return per[ids]


class CoupledSampler(StepSampler):
    """Indices of training samples, step by step, coupled to a baseline draw.

    Parameters
    ----------
    base : float array [N]
        The baseline's sampling probabilities (sum 1).
    probabilities : callable ``step -> float array [N]``, float array [N], or None
        The arm's probabilities at a step (>= 0, sum 1, checked at every step); an array is
        the same at every step (checked here); None is the baseline itself.
    samples_per_step, total_steps, seed : int
        ``samples_per_step`` over all ranks; ``seed`` 0 to 2**32 - 1.
    rank, world_size : int
        For one sampler per rank (``DistributedSampler``-style): rank ``r`` takes draws
        ``r, r + world_size, ...`` of each step. Keep the defaults under the HF Trainer /
        accelerate, which split one sampler's batches between processes themselves.
    fingerprint : str, optional
        Identifies the arm's probabilities in :meth:`state_dict` (:func:`mixture_sampler`
        gives the schedule's), so that a state saved with another schedule is refused.

    ``draws(step)`` returns the step's indices over all ranks; ``kept(step)`` also says which
    were the baseline's. Iterating yields this rank's ``total_steps * samples_per_step /
    world_size`` indices in order from the current position (for a ``DataLoader`` with
    ``batch_size=samples_per_step / world_size``); :meth:`state_dict` / :meth:`load_state_dict`
    save and restore it.
    """

    _state_keys = ("n_samples", "samples_per_step", "total_steps", "seed", "rank", "world_size", "base", "arm")

    def __init__(self, base: np.ndarray, probabilities: Callable[[int], np.ndarray] | np.ndarray | None = None, *,
                 samples_per_step: int, total_steps: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 fingerprint: str | None = None) -> None:  # fmt: skip
        p0 = _floats("base", base)
        if p0.ndim != 1 or p0.size < 1 or np.any(p0 < 0) or not np.isclose(p0.sum(), 1.0):
            raise InputError(f"base must be probabilities [N] (>= 0, sum 1), got shape {p0.shape}, sum {p0.sum():.6g}")
        if probabilities is not None and not callable(probabilities):
            if isinstance(probabilities, (str, bytes)) or not hasattr(probabilities, "__len__"):
                raise InputError(f"probabilities must be a callable step -> [N], an array [N] or None, "
                                 f"got {type(probabilities).__name__}")  # fmt: skip
            fixed = _floats("the arm's probabilities", probabilities)
            if fixed.shape != p0.shape:
                raise InputError(f"the arm's probabilities have shape {fixed.shape}; the pool has {p0.shape}")
            if not (np.isclose(fixed.sum(), 1.0) and fixed.min() >= 0):
                raise InputError(f"the arm's probabilities must be >= 0 and sum to 1, got sum {fixed.sum():.6g}, "
                                 f"least {fixed.min():.6g}")  # fmt: skip
            if fingerprint is None:  # a state saved with other fixed probabilities is refused
                fingerprint = hashlib.sha256(np.ascontiguousarray(fixed).tobytes()).hexdigest()[:16]
            probabilities = lambda step, _p=fixed: _p  # noqa: E731
        self.base, self.probabilities = p0, probabilities
        self._setup(n_samples=p0.size, total_steps=total_steps, samples_per_step=samples_per_step, seed=seed,
                    rank=rank, world_size=world_size)  # fmt: skip
        self._cdf0 = _cdf(p0)
        self._base_fingerprint = hashlib.sha256(np.ascontiguousarray(p0).tobytes()).hexdigest()[:16]
        self._arm = None if probabilities is None else str(fingerprint or "arm")

    def kept(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(indices [B], kept [B])``: the step's draw and which indices are the baseline's."""
        step = self._check_step(step)
        base_rng = np.random.default_rng([self.seed, step])
        idx = np.searchsorted(self._cdf0, base_rng.random(self.samples_per_step), side="right")
        idx = np.minimum(idx, self.n_samples - 1)
        if self.probabilities is None:
            return idx, np.ones(idx.size, bool)
        p = _floats(f"the arm's probabilities at step {step}", self.probabilities(step))
        if p.shape != self.base.shape:
            raise InputError(f"the arm's probabilities have shape {p.shape}; the pool has {self.base.shape}")
        total = p.sum()
        if not (np.isclose(total, 1.0) and p.min() >= 0):  # NaN fails both; the coupling is exact only for a distribution
            raise InputError(f"the arm's probabilities at step {step} must be >= 0 and sum to 1, got sum {total:.6g}, "
                             f"least {p.min():.6g}")  # fmt: skip
        rng = np.random.default_rng([self.seed, step, 1])
        u = rng.random(idx.size)
        keep = u * self.base[idx] < p[idx]  # min(1, p/p0) without dividing: p == p0 always keeps
        if not keep.all():
            excess = np.maximum(p - self.base, 0.0)
            redraw = np.searchsorted(_cdf(excess), rng.random(int((~keep).sum())), side="right")
            idx = idx.copy()
            idx[~keep] = np.minimum(redraw, self.n_samples - 1)
        return idx, keep

    def draws(self, step: int) -> np.ndarray:
        """The ``samples_per_step`` indices of ``step`` (int64)."""
        return self.kept(step)[0]

    def _setting(self, key: str):
        return {"base": self._base_fingerprint, "arm": self._arm}.get(key) if key in ("base", "arm") else getattr(self, key)


def _described(ids: np.ndarray) -> str:
    """Domain ids for a message: their range and dtype, or their shape."""
    if ids.ndim == 1 and ids.size and ids.dtype.kind in "iuf":
        return f"values {ids.min()}..{ids.max()} ({ids.dtype})"
    return f"{ids.dtype} of shape {ids.shape}"


def _cdf(p: np.ndarray) -> np.ndarray:
    c = np.cumsum(p)
    if not c[-1] > 0:
        raise InputError("probabilities sum to zero")
    return c / c[-1]
