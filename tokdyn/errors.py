"""Error types raised by tokdyn.

Every error derives from :class:`TokdynError` and also from the builtin that matches the
problem (a missing run is also a ``KeyError``, a bad argument also a ``ValueError``), so callers
can catch either. Messages say what was expected and what was found.
"""

from __future__ import annotations

__all__ = [
    "TokdynError",
    "InputError",
    "StoreError",
    "NotAStoreError",
    "SchemaVersionError",
    "RunNotFoundError",
    "RunExistsError",
    "ProbeMismatchError",
    "StepOrderError",
    "UnsafeFileError",
    "WriterError",
    "RunBusyError",
    "ClusterError",
]


class TokdynError(Exception):
    """Base class of every error tokdyn raises on purpose."""


class InputError(TokdynError, ValueError):
    """An argument or input file has the wrong type, shape, dtype or value."""


class StoreError(TokdynError):
    """A trajectory store cannot be read or written as asked."""


class NotAStoreError(StoreError, FileNotFoundError):
    """The path or zarr group is not a tokdyn store."""


class SchemaVersionError(StoreError, ValueError):
    """The store was written with a schema version this tokdyn does not read."""


class RunNotFoundError(StoreError, KeyError):
    """The store holds no run of the requested name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class RunExistsError(StoreError, FileExistsError):
    """A run of that name already exists and the caller did not ask to resume it."""


class ProbeMismatchError(StoreError, ValueError):
    """The probe set given differs from the one the store was built with."""


class StepOrderError(StoreError, ValueError):
    """A checkpoint row would not come after the last committed one."""


class UnsafeFileError(InputError):
    """A file would need pickle (arbitrary code execution) to load, and was refused."""


class WriterError(TokdynError, RuntimeError):
    """The background writer failed; raised in the training process at the next call."""


class RunBusyError(StoreError, RuntimeError):
    """Another live process is writing the same token range of a run (or creating the store or
    run); a second writer is refused, never interleaved."""


class ClusterError(TokdynError, RuntimeError):
    """The processes a job runs on failed under it: the dask.distributed cluster (its scheduler
    lost, a task's workers all died) or a worker of the local ``processes`` pool (killed, or out
    of memory); the blocks done are kept, and running the job again resumes it."""
