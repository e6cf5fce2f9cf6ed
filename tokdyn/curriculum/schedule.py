"""The weight schedule: at step ``t``, weight what is becoming learnable around ``log10 t``.

A token ``j`` with predicted learning time ``mu_j`` and loss drop ``delta_j`` (a
:class:`~tokdyn.curriculum.LearnabilityTable`) has, at ``x``, the *learnability*

    u_j(x) = max(delta_j, 0) * K((x - mu_j) / w) / w

the rate at which its drop is being learned if its event had width ``w`` (with the logistic
kernel ``K = sigma'`` this is exactly ``-dl/dx`` of the event, docs/method.md, "From events to the loss curve"). A sample's
score is the sum over its targets. Scores become weights with a temperature ``T`` (``q = u**(1/T)``)
and a uniform floor ``f``, so that no weight falls below ``f`` times the uniform one:

    sampling (per sample i of N):   p_i = f / N + (1 - f) * q_i / sum(q)
    loss weights (per token j):     w_j = f + (1 - f) * q_j / mean_batch(q)     (batch mean 1)

``x`` of the batch for optimizer update ``t`` (0-based, producing the weights of step ``t+1``) is
``log10((t + 1) * time_scale) + lead``: ``time_scale`` converts training steps into pilot steps
(the table's ``mu`` unit), ``lead`` looks ahead (decades). Everything here is our design
(docs/method.md, "Reshaping training"), so every knob is in :class:`CurriculumConfig`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from .._checks import as_array, check_count, is_real, is_whole
from ..errors import InputError
from .learnability import LearnabilityTable

__all__ = ["CurriculumConfig", "SampleSchedule", "kernel", "KERNELS"]

KERNELS = ("logistic", "gaussian")
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def kernel(z, kind: str = "logistic"):
    """A unit-area kernel of ``z`` (numpy array or torch tensor, same type back).

    ``"logistic"``: ``sigma'(z) = e^-|z| / (1 + e^-|z|)^2`` (the shape of a learning event's
    derivative); ``"gaussian"``: the standard normal density.
    """
    xp = torch if isinstance(z, torch.Tensor) else np
    if kind == "logistic":
        e = xp.exp(-xp.abs(z))
        return e / (1.0 + e) ** 2
    if kind == "gaussian":
        return xp.exp(-0.5 * z * z) * _INV_SQRT_2PI
    raise InputError(f"kernel must be one of {KERNELS}, got {kind!r}")


@dataclass(frozen=True)
class CurriculumConfig:
    """The schedule's knobs (docs/curriculum.md).

    Parameters
    ----------
    total_steps : int
        Optimizer updates the schedule covers: steps ``0 .. total_steps - 1``.
    width : float
        Kernel width ``w`` in decades of steps.
    kernel : {"logistic", "gaussian"}
    temperature : float
        ``T > 0``: scores are raised to ``1/T`` (large ``T`` flattens towards uniform).
    floor : float
        Share ``f`` in [0, 1] of the weight spread uniformly (1: uniform training).
    lead : float
        Decades added to ``x``: > 0 favours tokens shortly *before* their learning time.
    time_scale : float
        Pilot steps per training step (e.g. ``tokens_per_step / pilot tokens_per_step`` when
        learning goes by tokens seen).
    """

    total_steps: int
    width: float = 0.3
    kernel: str = "logistic"
    temperature: float = 1.0
    floor: float = 0.3
    lead: float = 0.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.total_steps, (int, np.integer)) and not isinstance(self.total_steps, bool)
                and self.total_steps >= 1):  # fmt: skip
            raise InputError(f"total_steps must be an int >= 1, got {self.total_steps!r}")
        for name in ("width", "temperature", "floor", "lead", "time_scale"):
            v = getattr(self, name)
            if not is_real(v):
                raise InputError(f"{name} must be a number, got {v!r}")
        if not (math.isfinite(self.width) and self.width > 0):
            raise InputError(f"width must be > 0 decades, got {self.width!r}")
        if self.kernel not in KERNELS:
            raise InputError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InputError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0 <= self.floor <= 1:
            raise InputError(f"floor must be in [0, 1], got {self.floor!r}")
        if not math.isfinite(self.lead):
            raise InputError(f"lead must be finite, got {self.lead!r}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise InputError(f"time_scale must be > 0, got {self.time_scale!r}")

    def check_step(self, step: int) -> int:
        """``step`` as an int, or :class:`InputError` when it is outside ``0 .. total_steps - 1``."""
        if not is_whole(step):  # a tensor, a bool, 2.5 or "3" is no step
            raise InputError(f"step must be an integer, got {step!r}")
        step = int(step)
        if not 0 <= step < self.total_steps:
            raise InputError(
                f"the curriculum schedule covers steps 0..{self.total_steps - 1} (total_steps={self.total_steps}); "
                f"asked for step {step}. Build it with the run's total number of optimizer steps"
            )
        return step

    def x(self, step: int) -> float:
        """``log10`` pilot step of the batch of update ``step`` (plus ``lead``)."""
        return math.log10((self.check_step(step) + 1) * self.time_scale) + self.lead

    def learnability(self, x, mu, delta):
        """``u = max(delta, 0) K((x - mu)/w) / w`` (numpy or torch, broadcasting)."""
        clip = delta.clamp(min=0) if isinstance(delta, torch.Tensor) else np.clip(delta, 0, None)
        return clip * kernel((x - mu) / self.width, self.kernel) / self.width

    def sharpen(self, u):
        """``u ** (1/T)``, up to one common factor: ``(u / max u) ** (1/T)`` when ``T != 1``.

        Only ratios of the result are ever used (``q / sum q``, ``q / mean q``), and they are the
        same; but ``u ** (1/T)`` itself overflows (inf, then NaN or uniform weights) or underflows
        (all 0: uniform weights, or "nothing scores") at a small ``T``: a score of 19 at
        ``T = 0.01`` is 1e128, beyond float32, and at ``T = 0.002`` beyond float64. Divided by the
        largest score first, every value lies in [0, 1] and the largest is 1. Torch tensors stay
        on their device (no host sync).
        """
        if self.temperature == 1:
            return u
        if isinstance(u, torch.Tensor):
            top = u.amax() if u.numel() else u.new_zeros(())
            # a NaN score stays NaN (as u ** (1/T) had it), never uniform weights without a word
            r = torch.where((top > 0) | top.isnan(), u / top.clamp(min=torch.finfo(u.dtype).tiny), torch.zeros_like(u))
            return r ** (1.0 / self.temperature)
        u = np.asarray(u)
        top = u.max() if u.size else 0.0
        if np.isnan(top):
            return np.full_like(u, np.nan, dtype=np.float64)
        if not top > 0:
            return np.zeros_like(u)
        with np.errstate(under="ignore"):
            return (u / top) ** (1.0 / self.temperature)

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True, default=str).encode()).hexdigest()[:16]


class SampleSchedule:
    """Sampling probabilities over training samples (windows), step by step.

    Parameters
    ----------
    table : LearnabilityTable
        Predicted ``mu``/``delta`` per key.
    windows : array [N, C+1]
        The training samples' token ids (``WindowDataset.windows()``; a view is fine).
    config : CurriculumConfig
    tokenizer : tokenizer, spec dict or int
        The training run's tokenizer (or vocabulary size), checked against the table's.
    bin_width : float
        Predicted ``mu`` is binned at this resolution (decades) once, so that a step costs one
        ``[N, bins] @ [bins]`` product instead of a pass over every token; the error in a
        sample's score is that of moving each ``mu`` by at most ``bin_width / 2``.
    batch : int
        Windows looked up at once while binning (bounds memory).

    Raises :class:`InputError` when no sample has a positive predicted loss drop (every weight
    but the floor would be zero at every step).
    """

    def __init__(self, table: LearnabilityTable, windows: Any, config: CurriculumConfig, *, tokenizer: Any,
                 bin_width: float = 0.02, batch: int = 8192) -> None:  # fmt: skip
        if not isinstance(table, LearnabilityTable):
            raise InputError(f"table must be a LearnabilityTable, got {type(table).__name__}")
        if not isinstance(config, CurriculumConfig):
            raise InputError(f"config must be a CurriculumConfig, got {type(config).__name__}")
        if not (math.isfinite(bin_width) and bin_width > 0):
            raise InputError(f"bin_width must be > 0, got {bin_width!r}")
        batch = check_count("batch", batch)  # -1 binned no window: said as "no sample has a positive predicted loss drop"
        table.check_tokenizer(tokenizer)
        # (no copy; a masked array's masked ids were binned as the samples' tokens)
        w = windows.windows() if hasattr(windows, "windows") else as_array("windows", windows, None, "token windows")
        if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 2:
            raise InputError(f"windows must have shape [N, C+1] with N >= 1, C >= 1, got {w.shape}")
        self.table = table.to("cpu")
        self.config = config
        self.n_samples = int(w.shape[0])
        self.centers, self.hist = self._bin(w, bin_width, int(batch))
        if not np.any(self.hist > 0):
            raise InputError(
                "no training sample has a positive predicted loss drop: every curriculum weight would be zero. "
                "Check the learnability table (table.validation, its pilot) and the tokenizer"
            )
        self._cache: tuple[int, np.ndarray] | None = None
        h = hashlib.sha256(config.fingerprint().encode())
        h.update(np.ascontiguousarray(self.hist).tobytes())
        self._fingerprint = h.hexdigest()[:16]

    def _bin(self, windows: np.ndarray, bin_width: float, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """Per sample, the positive predicted drop binned by predicted ``mu``: ``hist [N, bins]``."""
        lev = [lv for lv in self.table.levels if lv["mu"].numel()]
        mus = [float(self.table.mu_global)] + [float(v) for lv in lev for v in (lv["mu"].min(), lv["mu"].max())]
        lo, hi = min(mus), max(mus)
        n_bins = max(1, int(math.ceil((hi - lo) / bin_width)) + 1)
        if n_bins > 512:  # a very wide range: coarser bins keep the matrix small
            n_bins, bin_width = 512, (hi - lo) / 511
        centers = lo + bin_width * np.arange(n_bins)
        hist = np.zeros((self.n_samples, n_bins), np.float32)
        for a in range(0, self.n_samples, batch):
            pred = self.table.predict(windows[a : a + batch], batch=batch)
            b = np.clip(np.rint((pred["mu"] - lo) / bin_width), 0, n_bins - 1).astype(np.int64)
            rows = np.arange(b.shape[0])[:, None] * n_bins
            part = np.bincount((rows + b).ravel(), weights=np.clip(pred["delta"], 0, None).ravel(), minlength=b.shape[0] * n_bins)
            hist[a : a + b.shape[0]] = part.reshape(b.shape[0], n_bins)
        return centers, hist

    def scores(self, step: int) -> np.ndarray:
        """Each sample's learnability ``sum_j u_j(x)`` at ``step``: float64 ``[N]``."""
        x = self.config.x(step)
        k = self.config.learnability(x, self.centers, np.ones_like(self.centers)).astype(np.float32)
        return (self.hist @ k).astype(np.float64)

    def probabilities(self, step: int) -> np.ndarray:
        """Sampling probabilities at ``step``: float64 ``[N]``, summing to 1, each ``>= floor / N``.

        With ``floor > 0`` a step at which no sample scores (a narrow kernel far from every
        predicted ``mu``) is uniform; with ``floor == 0`` it is an :class:`InputError`. A copy:
        editing it changes neither the schedule nor a sampler drawing from it.
        """
        step = self.config.check_step(step)
        if self._cache is not None and self._cache[0] == step:
            return self._cache[1].copy()  # a copy: a caller that edits its row changed the schedule's next answer
        q = self.config.sharpen(self.scores(step))
        total = q.sum()
        f, n = self.config.floor, self.n_samples
        if np.isnan(total):  # never uniform probabilities, nor "nothing scores", for a damaged table
            raise InputError(f"at step {step} the samples' scores hold NaN ({int(np.isnan(q).sum()):,} of {q.size:,}): "
                             "the learnability table or the samples' predicted events are damaged")
        if not (total > 0 and np.isfinite(total)):
            if f == 0:
                raise InputError(
                    f"at step {step} (x = {self.config.x(step):.2f}) no sample has a predicted loss drop within reach of "
                    f"the kernel (width {self.config.width}): with floor=0 every weight would be zero. "
                    "Use floor > 0, a wider kernel, or check time_scale"
                )
            p = np.full(n, 1.0 / n)
        else:
            p = f / n + (1.0 - f) * (q / total)
        p.setflags(write=False)
        self._cache = (step, p)
        return p.copy()

    def fingerprint(self) -> str:
        """Identifies the schedule (config, samples, table) in a sampler's state."""
        return self._fingerprint
