"""Curriculum: reweight training by when tokens become learnable (docs/method.md, "Reshaping training").

1. **Pilot** (:func:`run_pilot`, :func:`pilot_probe`): record and fit trajectories of tokens
   drawn from the training pool.
2. **Learnability model** (:func:`build_table`, :class:`LearnabilityTable`): predict every
   training token's learning time ``mu`` and loss drop ``delta`` from the token and its
   preceding one or two tokens; saved as ``.npz`` (:meth:`LearnabilityTable.save`,
   :func:`load_table`) and checked on held-out pilot tokens (``table.validation``).
3. **Schedule** (:class:`CurriculumConfig`): at step ``t``, weight what is becoming learnable
   around ``log10 t`` (a kernel in ``x - mu``), mixed with a uniform floor.
4. **Apply** it host-side as a sampler over training samples (:class:`SampleSchedule` +
   :class:`CurriculumSampler`, for a DataLoader or the HF Trainer) or device-side as per-token
   loss weights (:class:`TokenWeights`).

v2 (the default, :mod:`tokdyn.curriculum.mixture`): per-domain learning-time densities from a
pilot whose probe is labelled by domain (:func:`run_mixture_pilot`, :func:`pilot_events`,
:class:`DomainRates`) become a mixture schedule (:class:`MixtureSchedule`, with its
enrichment), drawn through a sampler coupled to the baseline's (:class:`CoupledSampler`,
:func:`mixture_sampler`); :mod:`tokdyn.curriculum.ab` measures it on a budget ladder.

docs/curriculum.md has complete examples; ``pipelines/curriculum_ab.py`` measures both.
"""

from .learnability import LearnabilityOptions, LearnabilityTable, build_table, context_keys, load_table, token_targets
from .pilot import pilot_probe, run_pilot
from .sampler import CurriculumSampler
from .schedule import CurriculumConfig, SampleSchedule, kernel
from .weights import TokenWeights
from .coupled import CoupledSampler, domain_probabilities
from .mixture import (ContextSchedule, DomainRates, MixtureConfig, MixtureSchedule, PilotEvents, enrichment_verdict,
                      load_mixture_schedule, mixture_sampler, pilot_events)
from .pilot import mixture_probe, run_mixture_pilot

__all__ = [
    "pilot_probe", "run_pilot",
    "LearnabilityOptions", "LearnabilityTable", "build_table", "load_table", "context_keys", "token_targets",
    "CurriculumConfig", "SampleSchedule", "kernel",
    "CurriculumSampler", "TokenWeights",
    "CoupledSampler", "domain_probabilities", "mixture_probe", "run_mixture_pilot", "pilot_events", "PilotEvents",
    "DomainRates", "MixtureConfig", "MixtureSchedule", "enrichment_verdict", "load_mixture_schedule", "mixture_sampler",
    "ContextSchedule",
]  # fmt: skip
