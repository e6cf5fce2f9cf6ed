"""tokdyn: token-level training dynamics for language-model training.

Record every probe token's loss along training (``record``), fit one learning event per token
(``fit``), and rebuild the validation-loss derivative from the spectrum of learning times.
"""

__version__ = "0.1.0"

from .corpus import Document, bin_documents, jsonl_documents, split_documents, stdlib_documents, text_documents
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
from .probe import ProbeSet, build_probe
from .schedule import explicit_schedule, geometric_schedule, make_schedule, pythia_schedule
from .store import Run, RunWriter, TrajectoryStore, open_store
from .tokenizer import ByteTokenizer, HFTokenizer, get_tokenizer
from .spectrum import Events, Spectrum, events_from_fit, learning_time_spectrum, run_events, spectrum_power_law
from .reconstruct import Reconstruction, reconstruct_run
from .axes import assemble_axis

__all__ = [
    "__version__",
    "Document", "stdlib_documents", "text_documents", "jsonl_documents", "bin_documents", "split_documents",
    "ByteTokenizer", "HFTokenizer", "get_tokenizer",
    "ProbeSet", "build_probe",
    "geometric_schedule", "pythia_schedule", "explicit_schedule", "make_schedule",
    "TrajectoryStore", "Run", "RunWriter", "open_store",
    "Events", "Spectrum", "events_from_fit", "run_events", "learning_time_spectrum", "spectrum_power_law",
    "Reconstruction", "reconstruct_run", "assemble_axis",
    "TokdynError", "InputError", "StoreError", "NotAStoreError", "SchemaVersionError", "RunNotFoundError",
    "RunExistsError", "RunBusyError", "ProbeMismatchError", "StepOrderError", "UnsafeFileError", "WriterError",
]  # fmt: skip
