"""Curriculum: reweight training by when tokens become learnable (METHOD.md section 4).

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

docs/curriculum.md has a complete example; ``pipelines/curriculum_ab.py`` measures it.
"""

from .learnability import LearnabilityOptions, LearnabilityTable, build_table, context_keys, load_table, token_targets
from .pilot import pilot_probe, run_pilot
from .sampler import CurriculumSampler
from .schedule import CurriculumConfig, SampleSchedule, kernel
from .weights import TokenWeights

__all__ = [
    "pilot_probe", "run_pilot",
    "LearnabilityOptions", "LearnabilityTable", "build_table", "load_table", "context_keys", "token_targets",
    "CurriculumConfig", "SampleSchedule", "kernel",
    "CurriculumSampler", "TokenWeights",
]  # fmt: skip
