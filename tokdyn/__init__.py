"""tokdyn: token-level training dynamics for language-model training.

Record every probe token's loss along training (``record``), fit one learning event per token
(``fit``), and rebuild the validation-loss derivative from the spectrum of learning times.

The names below are loaded on first use, so ``import tokdyn.store`` (or any one stage) does not
import the others: docs/architecture.md gives the stages and what each may import.
"""

from __future__ import annotations

from ._lazy import lazy_names

from ._version import __version__
from .errors import (
    InputError,
    NotAStoreError,
    ProbeMismatchError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    SchemaVersionError,
    StepOrderError,
    StoreError,
    TokdynError,
    UnsafeFileError,
    WriterError,
)

_LAZY = {  # public name: the module that defines it
    **dict.fromkeys(["Document", "bin_documents", "jsonl_documents", "split_documents", "stdlib_documents", "text_documents"], "corpus"),
    **dict.fromkeys(["ProbeSet", "build_probe"], "probe"),
    **dict.fromkeys(["explicit_schedule", "geometric_schedule", "make_schedule", "pythia_schedule"], "schedule"),
    **dict.fromkeys(["Run", "RunWriter", "TrajectoryStore", "FitResults", "open_store", "as_store"], "store"),
    **dict.fromkeys(["ByteTokenizer", "HFTokenizer", "get_tokenizer"], "tokenizer"),
    **dict.fromkeys(["TokenLossRecorder"], "record"),
    **dict.fromkeys(["FitOptions", "fit_run", "fit_inputs", "fitted_inputs", "stored_options"], "fit"),
    **dict.fromkeys(["Events", "Spectrum", "events_from_fit", "learning_time_spectrum", "run_events", "spectrum_power_law"], "spectrum"),
    **dict.fromkeys(["Reconstruction", "reconstruct_run", "reconstruct_across"], "reconstruct"),
    **dict.fromkeys(["assemble_axis", "effective_steps"], "axes"),
    **dict.fromkeys(["DecaySweepConfig", "branched_decay_sweep"], "sweep"),
    **dict.fromkeys(["RunAnalysis", "StoreAnalysis", "analyze_run", "analyze_store"], "analysis"),
    **dict.fromkeys(["write_report"], "report"),
}  # fmt: skip

__all__ = [
    "__version__", *_LAZY,
    "TokdynError", "InputError", "StoreError", "NotAStoreError", "SchemaVersionError", "RunNotFoundError",
    "RunExistsError", "RunBusyError", "ProbeMismatchError", "StepOrderError", "UnsafeFileError", "WriterError",
]  # fmt: skip

__getattr__ = lazy_names(__name__, _LAZY)
