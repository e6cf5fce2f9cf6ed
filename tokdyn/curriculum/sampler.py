"""Host-side curriculum: a ``torch.utils.data.Sampler`` that draws training samples by schedule.

The sampler yields ``samples_per_step`` indices per optimizer step, drawn with replacement from
the schedule's probabilities at that step (or uniformly, without a schedule: the baseline). The
draws of step ``t`` come from a generator seeded with ``(seed, t)``, so the sequence is a pure
function of the position: a resumed sampler (``load_state_dict``) or a framework that replays
batches to skip them (the HF Trainer) reproduces it exactly, and prefetching workers cannot
shift it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from .schedule import SampleSchedule

__all__ = ["CurriculumSampler"]

_STATE_KEYS = ("n_samples", "samples_per_step", "total_steps", "seed", "rank", "world_size", "schedule")


class CurriculumSampler(torch.utils.data.Sampler[int]):
    """Indices of training samples, step by step, weighted by a :class:`SampleSchedule`.

    Parameters
    ----------
    schedule : SampleSchedule or None
        None draws uniformly (the baseline; then give ``n_samples`` and ``total_steps``).
    samples_per_step : int
        Samples per optimizer update over all ranks (batch size x gradient accumulation x
        ranks drawing from this sampler).
    seed : int
    n_samples, total_steps : int, optional
        Needed without a schedule (with one, they are the schedule's).
    rank, world_size : int
        For one sampler per rank (``DistributedSampler``-style): rank ``r`` takes draws
        ``r, r + world_size, ...`` of each step. Keep the defaults under the HF Trainer /
        accelerate, which split one sampler's batches between processes themselves.

    Iterating yields ``len(self)`` indices (``total_steps * samples_per_step / world_size``)
    from the current position; :meth:`state_dict` / :meth:`load_state_dict` save and restore it.
    """

    def __init__(self, schedule: SampleSchedule | None, *, samples_per_step: int, seed: int = 0,
                 n_samples: int | None = None, total_steps: int | None = None, rank: int = 0,
                 world_size: int = 1) -> None:  # fmt: skip
        if schedule is not None and not isinstance(schedule, SampleSchedule):
            raise InputError(f"schedule must be a SampleSchedule or None, got {type(schedule).__name__}")
        if schedule is not None:
            for name, given, own in (("n_samples", n_samples, schedule.n_samples), ("total_steps", total_steps, schedule.config.total_steps)):
                if given is not None and int(given) != own:
                    raise InputError(f"{name}={given} differs from the schedule's {own}")
            n_samples, total_steps = schedule.n_samples, schedule.config.total_steps
        elif n_samples is None or total_steps is None:
            raise InputError("a uniform sampler (schedule=None) needs n_samples and total_steps")
        for name, v, least in (("n_samples", n_samples, 1), ("total_steps", total_steps, 1),
                               ("samples_per_step", samples_per_step, 1), ("world_size", world_size, 1)):  # fmt: skip
            if int(v) != v or int(v) < least:
                raise InputError(f"{name} must be an int >= {least}, got {v!r}")
        if isinstance(seed, bool) or int(seed) != seed or int(seed) < 0:  # numpy's generators take seeds >= 0
            raise InputError(f"seed must be an int >= 0, got {seed!r}")
        if not 0 <= int(rank) < int(world_size):
            raise InputError(f"rank must be in [0, {world_size}), got {rank}")
        if int(samples_per_step) % int(world_size):
            raise InputError(f"samples_per_step ({samples_per_step}) must be a multiple of world_size ({world_size})")
        self.schedule = schedule
        self.n_samples, self.total_steps = int(n_samples), int(total_steps)
        self.samples_per_step, self.seed = int(samples_per_step), int(seed)
        self.rank, self.world_size = int(rank), int(world_size)
        self.per_rank = self.samples_per_step // self.world_size
        self.position = 0  # indices yielded (this rank) in the current pass
        self._resume_at: int | None = None

    def __len__(self) -> int:
        return self.total_steps * self.per_rank

    def draws(self, step: int) -> np.ndarray:
        """The ``samples_per_step`` indices of ``step`` over all ranks (int64)."""
        if not 0 <= int(step) < self.total_steps:
            raise InputError(f"the sampler covers steps 0..{self.total_steps - 1}; asked for step {step}")
        rng = np.random.default_rng([self.seed, int(step)])
        if self.schedule is None:
            return rng.integers(0, self.n_samples, size=self.samples_per_step)
        return rng.choice(self.n_samples, size=self.samples_per_step, p=self.schedule.probabilities(int(step)))

    def __iter__(self) -> Iterator[int]:
        start = self._resume_at or 0
        self._resume_at = None
        self.position = start
        step, offset = divmod(start, self.per_rank)
        while step < self.total_steps:
            mine = self.draws(step)[self.rank :: self.world_size]
            for i in mine[offset:]:
                self.position += 1
                yield int(i)
            step, offset = step + 1, 0

    # -- checkpointing --------------------------------------------------------------------

    def state_dict(self, *, step: int | None = None) -> dict[str, Any]:
        """What resumes this sampler: its position (indices yielded by this rank), or the
        start of optimizer step ``step`` (use that when a DataLoader prefetches ahead), and
        the settings a resumed sampler must share."""
        position = self.position if step is None else int(step) * self.per_rank
        if not 0 <= position <= len(self):
            raise InputError(f"position {position} is outside this sampler's 0..{len(self)}")
        return {"position": position, **{k: self._setting(k) for k in _STATE_KEYS}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next ``iter()``; a state from a sampler with other
        settings (seed, sizes, schedule) is refused."""
        if not isinstance(state, dict) or "position" not in state:
            raise InputError("state must be a dict from CurriculumSampler.state_dict()")
        diff = {k: (state.get(k), self._setting(k)) for k in _STATE_KEYS if state.get(k) != self._setting(k)}
        if diff:
            raise InputError(f"sampler state does not match this sampler (saved, now): {diff}")
        position = int(state["position"])
        if not 0 <= position <= len(self):
            raise InputError(f"saved position {position} is outside this sampler's 0..{len(self)}")
        self._resume_at = position
        self.position = position

    def _setting(self, key: str):
        if key == "schedule":
            return None if self.schedule is None else self.schedule.fingerprint()
        return getattr(self, key)
