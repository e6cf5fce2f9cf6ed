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

from collections.abc import Callable, Iterator

import numpy as np
import torch

from ..errors import InputError

__all__ = ["CoupledSampler", "domain_probabilities"]


def domain_probabilities(domain_ids: np.ndarray, weights) -> np.ndarray:
    """Per-sample probabilities ``[N]`` of a domain mixture: ``weights[k] / n_k`` for each of
    the ``n_k`` samples of domain ``k`` (``domain_ids [N]``, ``weights [D]`` summing to 1)."""
    ids = np.asarray(domain_ids)
    w = np.asarray(weights, np.float64)
    counts = np.bincount(ids, minlength=w.size)
    if counts.size != w.size:
        raise InputError(f"domain ids reach {counts.size - 1} but only {w.size} domain weights were given")
    if np.any(w < 0) or not np.isclose(w.sum(), 1.0):
        raise InputError(f"domain weights must be >= 0 and sum to 1, got {w.tolist()}")
    if np.any((counts == 0) & (w > 0)):
        raise InputError("a domain with positive weight has no training sample")
    per = np.divide(w, counts, out=np.zeros_like(w), where=counts > 0)
    return per[ids]


class CoupledSampler(torch.utils.data.Sampler[int]):
    """Indices of training samples, step by step, coupled to a baseline draw.

    Parameters
    ----------
    base : float array [N]
        The baseline's sampling probabilities (sum 1).
    probabilities : callable ``step -> float array [N]``, or None
        The arm's probabilities at a step; None is the baseline itself.
    samples_per_step, total_steps, seed : int

    ``draws(step)`` returns the step's indices; ``kept(step)`` also says which were the
    baseline's. Iterating yields ``total_steps * samples_per_step`` indices in order (for a
    ``DataLoader`` with ``batch_size=samples_per_step``).
    """

    def __init__(self, base: np.ndarray, probabilities: Callable[[int], np.ndarray] | None = None, *,
                 samples_per_step: int, total_steps: int, seed: int = 0) -> None:  # fmt: skip
        p0 = np.asarray(base, np.float64)
        if p0.ndim != 1 or p0.size < 1 or np.any(p0 < 0) or not np.isclose(p0.sum(), 1.0):
            raise InputError(f"base must be probabilities [N] (>= 0, sum 1), got shape {p0.shape}, sum {p0.sum():.6g}")
        for name, v in (("samples_per_step", samples_per_step), ("total_steps", total_steps)):
            if int(v) != v or int(v) < 1:
                raise InputError(f"{name} must be an int >= 1, got {v!r}")
        if isinstance(seed, bool) or int(seed) != seed or int(seed) < 0:  # numpy's generators take seeds >= 0
            raise InputError(f"seed must be an int >= 0, got {seed!r}")
        self.base, self.probabilities = p0, probabilities
        self.samples_per_step, self.total_steps, self.seed = int(samples_per_step), int(total_steps), int(seed)
        self._cdf0 = _cdf(p0)

    @property
    def n_samples(self) -> int:
        return int(self.base.size)

    def __len__(self) -> int:
        return self.total_steps * self.samples_per_step

    def kept(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(indices [B], kept [B])``: the step's draw and which indices are the baseline's."""
        if not 0 <= int(step) < self.total_steps:
            raise InputError(f"the sampler covers steps 0..{self.total_steps - 1}; asked for step {step}")
        base_rng = np.random.default_rng([self.seed, int(step)])
        idx = np.searchsorted(self._cdf0, base_rng.random(self.samples_per_step), side="right")
        idx = np.minimum(idx, self.n_samples - 1)
        if self.probabilities is None:
            return idx, np.ones(idx.size, bool)
        p = np.asarray(self.probabilities(int(step)), np.float64)
        if p.shape != self.base.shape:
            raise InputError(f"the arm's probabilities have shape {p.shape}; the pool has {self.base.shape}")
        rng = np.random.default_rng([self.seed, int(step), 1])
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

    def __iter__(self) -> Iterator[int]:
        for step in range(self.total_steps):
            yield from (int(i) for i in self.draws(step))


def _cdf(p: np.ndarray) -> np.ndarray:
    c = np.cumsum(p)
    if not c[-1] > 0:
        raise InputError("probabilities sum to zero")
    return c / c[-1]
