"""numba's ``njit`` as tokdyn's kernels use it: kept on disk under the code's id, or compiled
in each process where numba has no folder to keep it in.

numba keys a function's on-disk cache by that function's own file alone. tokdyn's entry kernels
(:mod:`tokdyn.fit.varpro`) inline callees and constants of other files
(:mod:`tokdyn.fit.numba_kernels`, :mod:`tokdyn.fit.lanes`, ``Z_CLIP``), so after a change there
alone (a ``git pull``, an upgrade over an old ``__pycache__``, a read-only install cached in the
user's folder) numba loaded the old machine code without a word: a fit by the new code with the
old code's numbers, recorded under the new code's id. Each entry here holds the code's id
(:func:`tokdyn._version.build`) beside numba's own stamp, so any change to tokdyn compiles anew.

Where numba finds no writable folder (beside the sources, ``NUMBA_CACHE_DIR``, the user's cache
folder: a read-only install in a container whose home cannot be written), ``cache=True`` raised
a RuntimeError as the module was imported: a traceback for every ``tokdyn`` command, ``--help``
included. The kernels are then compiled without a cache, and the fit says so once
(:func:`warn_uncached`).
"""

from __future__ import annotations

import multiprocessing
import os
import warnings

import numba

from tokdyn._text import one_line
from tokdyn._version import build, code_id

__all__ = ["njit", "warn_uncached"]

# why numba cannot keep this process's compiled kernels, by source file (empty: it can)
_UNCACHED: dict[str, str] = {}
_WARNED = False


def njit(**options):
    """``numba.njit(**options)``, whose ``cache=True`` is kept under the code's id (above)."""
    cache = options.pop("cache", False)

    def decorate(fn):
        dispatcher = numba.njit(**options)(fn)
        if cache:
            _keep(dispatcher, fn)
        return dispatcher

    return decorate


def _keep(dispatcher, fn) -> None:
    """Give ``dispatcher`` numba's cache of ``fn``, its entries stamped with the code's id; or
    none, with the reason noted, where numba cannot keep one or the code has no id (a zip
    import: two versions would share entries)."""
    from numba.core.caching import FunctionCache

    file = fn.__code__.co_filename
    if code_id() is None:
        _UNCACHED.setdefault(file, "tokdyn's code has no id here (imported from a zip?)")
        return
    try:
        cache = FunctionCache(fn)
        stamp = cache._cache_file._source_stamp  # what numba compares before it loads an entry
        cache._cache_file._source_stamp = (stamp, build())
    except RuntimeError as exc:  # "cannot cache function ...: no locator available for file ..."
        why = (f"it can write no folder for them (beside {os.path.dirname(file)}, NUMBA_CACHE_DIR or the user's cache folder)"
               if "no locator" in str(exc) else one_line(exc, 200))
        _UNCACHED.setdefault(file, why)
        return
    except AttributeError:  # a numba whose cache is built otherwise: its own stamp could miss a change
        _UNCACHED.setdefault(file, f"this numba ({numba.__version__}) keeps its cache in a way tokdyn does not know")
        return
    dispatcher._cache = cache  # what numba.njit(cache=True) sets (Dispatcher.enable_caching)


def warn_uncached() -> None:
    """Say once, in the process the user started (not in a fit's worker processes), that the
    compiled kernels are not kept on disk, and why."""
    global _WARNED
    if not _UNCACHED or _WARNED or multiprocessing.parent_process() is not None:
        return
    _WARNED = True
    why = next(iter(_UNCACHED.values()))
    warnings.warn(f"numba cannot keep tokdyn's compiled kernels on disk: {why}; each process compiles them again "
                  "(about 20 s before its first fit); set NUMBA_CACHE_DIR to a writable folder", RuntimeWarning, stacklevel=2)
