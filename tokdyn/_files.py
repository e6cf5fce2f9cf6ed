"""Files written whole or not at all: the one way tokdyn writes a result file (a report, an
exported losses.npz, a curriculum schedule or learnability table)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import InputError

__all__ = ["write_atomically"]


def write_atomically(path: str | os.PathLike, write: Callable, *, binary: bool = False, what: str = "file") -> Path:
    """Write ``path`` as ``write(fh)`` writes it, atomically and without following a planted name.

    The text goes to a new file of a random name in the destination folder, created exclusively
    (``tempfile.mkstemp``: ``O_CREAT | O_EXCL``, so never through a file or link someone left
    there), is flushed to disk, then renamed over ``path`` (``os.replace``: a link at ``path``
    is replaced, not written through). A reader never sees a half-written file, and on any error
    the temporary file is removed and nothing else is touched. :class:`InputError` naming ``what``
    and the file when the folder cannot be written.
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # what open() would give (mkstemp's is 0600)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(f"cannot write the {what} to {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it, which another
    thread would see); 0o022 where the kernel does not say."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
