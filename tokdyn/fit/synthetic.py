"""Planted learning events: trajectories with a known answer, for tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokdyn.fit.models import two_sigmoid_curve
from tokdyn.fit.sigmoid import sigmoid_curve

__all__ = ["Planted", "plant_sigmoids", "plant_two_steps"]


@dataclass(frozen=True)
class Planted:
    """Trajectories Y [B, K] on x [K] and the truth they were drawn from (arrays [B])."""

    x: np.ndarray
    Y: np.ndarray
    truth: dict[str, np.ndarray]


def plant_sigmoids(
    n: int,
    x: np.ndarray,
    *,
    rng: np.random.Generator,
    noise: float = 0.2,
    mu_range: tuple[float, float] | None = None,
    s_range: tuple[float, float] = (0.05, 0.5),
    delta_range: tuple[float, float] = (1.0, 6.0),
    linf_range: tuple[float, float] = (1.0, 3.0),
) -> Planted:
    """One sigmoid event per trajectory plus Gaussian noise (nats).

    mu is drawn uniformly inside the observed range (default: its middle 80 %), so events are
    seen whole; linf >= 1 keeps noisy losses positive, as real ones are.
    """
    x = np.asarray(x, dtype=np.float64)
    if mu_range is None:
        span = x[-1] - x[0]
        mu_range = (x[0] + 0.1 * span, x[-1] - 0.1 * span)
    mu = rng.uniform(*mu_range, n)
    s = rng.uniform(*s_range, n)
    delta = rng.uniform(*delta_range, n)
    linf = rng.uniform(*linf_range, n)
    l0 = linf + delta
    clean = sigmoid_curve(x[None, :], l0[:, None], linf[:, None], mu[:, None], s[:, None])
    Y = clean + noise * rng.standard_normal(clean.shape)
    return Planted(x, Y, dict(l0=l0, linf=linf, mu=mu, s=s, delta=delta))


def plant_two_steps(
    n: int,
    x: np.ndarray,
    *,
    rng: np.random.Generator,
    noise: float = 0.2,
    gap_range: tuple[float, float] = (1.0, 1.8),
    s_range: tuple[float, float] = (0.05, 0.25),
    delta_range: tuple[float, float] = (1.5, 3.0),
    linf: float = 2.0,
) -> Planted:
    """Two events per trajectory, the second ``gap_range`` decades after the first."""
    x = np.asarray(x, dtype=np.float64)
    span = x[-1] - x[0]
    mu1 = rng.uniform(x[0] + 0.1 * span, x[-1] - 0.1 * span - gap_range[1], n)
    mu2 = mu1 + rng.uniform(*gap_range, n)
    s1, s2 = rng.uniform(*s_range, n), rng.uniform(*s_range, n)
    d1, d2 = rng.uniform(*delta_range, n), rng.uniform(*delta_range, n)
    col = lambda a: np.asarray(a)[:, None]  # noqa: E731
    clean = two_sigmoid_curve(
        x[None, :], linf, col(d1), col(mu1), col(s1), col(d2), col(mu2), col(s2)
    )
    Y = clean + noise * rng.standard_normal(clean.shape)
    truth = dict(mu1=mu1, s1=s1, delta1=d1, mu2=mu2, s2=s2, delta2=d2,
                 linf=np.full(n, float(linf)))
    return Planted(x, Y, truth)
