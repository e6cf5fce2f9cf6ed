"""Host-side curriculum: a ``torch.utils.data.Sampler`` that draws training samples by schedule.

The sampler yields ``samples_per_step`` indices per optimizer step, drawn with replacement from
the schedule's probabilities at that step (or uniformly, without a schedule: the baseline). The
draws of step ``t`` come from a generator seeded with ``(seed, t)``, so the sequence is a pure
function of the position: a resumed sampler (``load_state_dict``) or a framework that replays
batches to skip them (the HF Trainer) reproduces it exactly, and prefetching workers cannot
shift it. :class:`StepSampler` holds these mechanics (iteration, ranks, checkpointing) for this
sampler and for the mixture's :class:`~tokdyn.curriculum.coupled.CoupledSampler`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from .._checks import is_whole as _is_int  # an integral float counts: a step 3.0 is step 3
from ..errors import InputError
from .schedule import SampleSchedule

__all__ = ["CurriculumSampler", "StepSampler", "check_seed", "SEED_BOUND"]

# numpy reads an int seed list word by word (32 bits a word, trailing zero words dropped), so a
# seed or step of 2**32 or more would share its generator with another (seed, step): seed
# 2**32 + s at step 0 drew what seed s draws at step 1. Seeds and steps stay below this bound.
SEED_BOUND = 2**32


def check_seed(seed) -> int:
    """``seed`` as an int in ``0 .. 2**32 - 1``, or :class:`InputError`."""
    if not (_is_int(seed) and 0 <= int(seed) < SEED_BOUND):
        raise InputError(f"seed must be an int from 0 to 2**32 - 1 (a step's draws come from a generator keyed by "
                         f"(seed, step); a larger seed would repeat another seed's draws), got {seed!r}")  # fmt: skip
    return int(seed)


class StepSampler(torch.utils.data.Sampler[int]):
    """What every step-keyed sampler shares: :meth:`draws` gives the ``samples_per_step``
    indices of one optimizer step over all ranks; iterating yields this rank's share (draws
    ``rank, rank + world_size, ...`` of each step) from the current position, and
    :meth:`state_dict` / :meth:`load_state_dict` save and restore that position.

    A subclass calls :meth:`_setup`, defines :meth:`draws`, and lists in ``_state_keys`` the
    settings a resumed sampler must share (:meth:`_setting` gives each).
    """

    _state_keys: tuple[str, ...] = ()

    def _setup(self, *, n_samples, total_steps, samples_per_step, seed, rank, world_size) -> None:
        for name, v, least in (("n_samples", n_samples, 1), ("total_steps", total_steps, 1),
                               ("samples_per_step", samples_per_step, 1), ("world_size", world_size, 1)):  # fmt: skip
            if not (_is_int(v) and int(v) >= least):
                raise InputError(f"{name} must be an int >= {least}, got {v!r}")
        if int(total_steps) > SEED_BOUND:
            raise InputError(f"total_steps must be at most 2**32 (a step's draws come from a generator keyed by "
                             f"(seed, step)), got {total_steps!r}")  # fmt: skip
        self.seed = check_seed(seed)
        if not (_is_int(rank) and 0 <= int(rank) < int(world_size)):
            raise InputError(f"rank must be an int in [0, {world_size}), got {rank!r}")
        if int(samples_per_step) % int(world_size):
            raise InputError(f"samples_per_step ({samples_per_step}) must be a multiple of world_size ({world_size})")
        self.n_samples, self.total_steps = int(n_samples), int(total_steps)
        self.samples_per_step = int(samples_per_step)
        self.rank, self.world_size = int(rank), int(world_size)
        self.per_rank = self.samples_per_step // self.world_size
        self.position = 0  # indices yielded (this rank) in the current pass
        self._resume_at: int | None = None

    def _check_step(self, step) -> int:
        """``step`` as an int, or :class:`InputError` when it is not one of ``0 .. total_steps - 1``."""
        if not (_is_int(step) and 0 <= int(step) < self.total_steps):
            raise InputError(f"the sampler covers steps 0..{self.total_steps - 1}; asked for step {step!r}")
        return int(step)

    def draws(self, step: int) -> np.ndarray:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __len__(self) -> int:
        return self.total_steps * self.per_rank

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
        if step is not None and not (_is_int(step) and 0 <= int(step) <= self.total_steps):
            raise InputError(f"state_dict(step=...) takes the optimizer step to resume at, an int from 0 to "
                             f"{self.total_steps}, got {step!r}")  # fmt: skip
        position = self.position if step is None else int(step) * self.per_rank
        if not 0 <= position <= len(self):
            raise InputError(f"position {position} is outside this sampler's 0..{len(self)}")
        return {"position": position, **{k: self._setting(k) for k in self._state_keys}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next ``iter()``; a state from a sampler with other
        settings (seed, sizes, schedule) is refused.

        Any rank may load any rank's state of the same ``world_size`` (ranks move in lockstep,
        so their positions are equal: the usual "save on rank 0, load on every rank"). A state
        saved under another ``world_size`` resumes at the same optimizer step when it was saved
        at a step boundary (``state_dict(step=k)``, or a position between steps); saved in the
        middle of a step it is refused, since that step's draws are split otherwise."""
        if not isinstance(state, dict) or "position" not in state:
            raise InputError(f"state must be a dict from {type(self).__name__}.state_dict()")
        free = ("rank", "world_size")  # checked below: a state moves between ranks and world sizes
        diff = {k: (state.get(k), self._setting(k)) for k in self._state_keys
                if k not in free and state.get(k) != self._setting(k)}  # fmt: skip
        if diff:
            raise InputError(f"sampler state does not match this sampler (saved, now): {diff}")
        position = state["position"]
        if not _is_int(position):
            raise InputError(f"saved position must be an int (indices yielded by the rank), got {position!r}")
        position = int(position)
        saved_ws = state.get("world_size", self.world_size)
        if not (_is_int(saved_ws) and int(saved_ws) >= 1 and self.samples_per_step % int(saved_ws) == 0):
            raise InputError(f"saved world_size must be an int >= 1 dividing samples_per_step ({self.samples_per_step}), "
                             f"got {saved_ws!r}")  # fmt: skip
        saved_ws = int(saved_ws)
        if saved_ws != self.world_size:
            saved_per_rank = self.samples_per_step // saved_ws
            step, offset = divmod(position, saved_per_rank)
            if offset:
                raise InputError(f"the state was saved with world_size={saved_ws} in the middle of step {step} "
                                 f"({offset} of its {saved_per_rank} draws per rank taken); a sampler of world_size="
                                 f"{self.world_size} can resume it only at a step boundary: save it with "
                                 "state_dict(step=k), k the next optimizer step")  # fmt: skip
            position = step * self.per_rank
        if not 0 <= position <= len(self):
            raise InputError(f"saved position {position} is outside this sampler's 0..{len(self)}")
        self._resume_at = position
        self.position = position

    def _setting(self, key: str):
        return getattr(self, key)


class CurriculumSampler(StepSampler):
    """Indices of training samples, step by step, weighted by a :class:`SampleSchedule`.

    Parameters
    ----------
    schedule : SampleSchedule or None
        None draws uniformly (the baseline; then give ``n_samples`` and ``total_steps``).
    samples_per_step : int
        Samples per optimizer update over all ranks (batch size x gradient accumulation x
        ranks drawing from this sampler).
    seed : int
        0 to 2**32 - 1.
    n_samples, total_steps : int, optional
        Needed without a schedule (with one, they are the schedule's).
    rank, world_size : int
        For one sampler per rank (``DistributedSampler``-style): rank ``r`` takes draws
        ``r, r + world_size, ...`` of each step. Keep the defaults under the HF Trainer /
        accelerate, which split one sampler's batches between processes themselves.

    Iterating yields ``len(self)`` indices (``total_steps * samples_per_step / world_size``)
    from the current position; :meth:`state_dict` / :meth:`load_state_dict` save and restore it.
    """

    _state_keys = ("n_samples", "samples_per_step", "total_steps", "seed", "rank", "world_size", "schedule")

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
        self.schedule = schedule
        self._setup(n_samples=n_samples, total_steps=total_steps, samples_per_step=samples_per_step, seed=seed,
                    rank=rank, world_size=world_size)  # fmt: skip

    def draws(self, step: int) -> np.ndarray:
        """The ``samples_per_step`` indices of ``step`` over all ranks (int64)."""
        step = self._check_step(step)
        rng = np.random.default_rng([self.seed, step])
        if self.schedule is None:
            return rng.integers(0, self.n_samples, size=self.samples_per_step)
        return rng.choice(self.n_samples, size=self.samples_per_step, p=self.schedule.probabilities(step))

    def _setting(self, key: str):
        if key == "schedule":
            return None if self.schedule is None else self.schedule.fingerprint()
        return getattr(self, key)
