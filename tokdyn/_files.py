"""Files written whole or not at all: the one way tokdyn writes a result file (a report, an
exported losses.npz, a curriculum schedule or learnability table).

Where an output goes: tokdyn writes the file (or store) it is given, never the folders above it.
A missing parent folder is one line naming it (:func:`check_output_path`, before any work;
:func:`write_atomically` names it too, at the write), as ``open()``, ``cp`` and ``np.save`` do: a typo in
a path (``--out reslts/m.json``) is said, not turned into a new tree of folders.

Two paths are never outputs (:func:`_refuse_not_an_output`, at the check and at the write): ``-``,
which commands of other tools read as standard output (tokdyn writes results only to files, and
wrote a file named ``-``), and a path inside a zarr hierarchy (a folder above it holds
``zarr.json``, or version 2's ``.zgroup`` or ``.zarray``), where a report or a table would be written among a store's own nodes."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import InputError

__all__ = ["write_atomically", "check_output_path", "check_regular", "kind_of_mode", "link_note", "loads_json", "strict_json", "remove_store_folder",
           "DEMO_STORE"]

DEMO_STORE = "store.zarr"  # where `tokdyn demo --out DIR` puts its store (the CLI takes DIR for it)


def strict_json(value):
    """``value`` with every non-finite float as None, numpy scalars and arrays as Python ones:
    JSON has no NaN or Infinity, and strict parsers (jq, most languages' own) reject them."""
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy array or scalar
        return strict_json(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def kind_of_mode(mode: int) -> str:
    """What a file of ``mode`` (an ``st_mode``) is, as the messages say it: "a regular file",
    "a folder", "a link", "a FIFO", "a socket" or "a device" (character or block)."""
    return ("a regular file" if stat.S_ISREG(mode) else "a folder" if stat.S_ISDIR(mode) else "a link" if stat.S_ISLNK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device")  # fmt: skip


def not_a_folder(url: str | os.PathLike) -> str:
    """Where a local ``url`` (a store's), or a path above it, is there but is not a folder, the
    clause that says so - "PATH is a FIFO, not a store's folder", "PATH, above it, is a regular
    file, not a folder" - for a message that no store can be opened or made there; else ""
    (a URL, a folder, nothing there)."""
    path = os.fspath(url) if isinstance(url, os.PathLike) else url
    if not isinstance(path, str) or "://" in path:
        return ""
    path = path.rstrip(os.sep) or path  # "a.txt/" is a.txt
    here = path
    while here:
        try:
            mode = os.stat(here).st_mode
        except OSError as exc:  # not there (or unreadable): look above it, but for a link that leads nowhere
            if not os.path.islink(here):
                up = os.path.dirname(here)
                here = "" if up == here else up
                continue
            what = "a link loop" if exc.errno == errno.ELOOP else f"a broken link (to {_link_target(here)})"
        else:
            if stat.S_ISDIR(mode):
                return ""
            what = kind_of_mode(mode)
        return f"{here} is {what}, not a store's folder" if here == path else f"{here}, above it, is {what}, not a folder"
    return ""


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # replaced since
        return "?"


def link_note(path: str | os.PathLike) -> str:
    """Where ``path`` really is, for a message about what is there: `` (a link to REAL)`` where
    its own name is a link, `` (at REAL)`` where a folder above it is one, else nothing."""
    real = os.path.realpath(path)
    if os.path.islink(path):
        return f" (a link to {real})"
    return f" (at {real})" if real != os.path.abspath(path) else ""


def check_regular(path: str | os.PathLike, what: str, hint: str = "", *, readable: bool = True) -> Path:
    """``path`` as a :class:`Path`, or :class:`InputError` naming ``what`` and the path unless it
    is a regular file (links followed) this process may read: the one check before tokdyn opens
    an input file. A FIFO would block the read forever and a device such as ``/dev/zero`` never
    ends, so neither is opened; a folder, a missing file, a broken link and an unreadable file
    are each said as what they are (not all as "not found"). ``hint`` ends the message of a
    file that is there but not regular (what to give instead). ``readable=False`` leaves a file
    this process may not read to the caller (one that may never be opened: a checkpoint
    folder's optimizer state, a config whose absence is allowed)."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        broken = " (a broken link)" if os.path.islink(p) else ""
        raise InputError(f"{what} not found: {p}{broken}") from None
    except OSError as exc:  # a permission denied on a folder above it, a link loop, a name too long
        raise InputError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = kind_of_mode(mode)
        raise InputError(f"{what} {p} is {kind}, not a regular file{link_note(p)}{hint}")
    if readable and not os.access(p, os.R_OK):
        raise InputError(f"cannot read {what} {p}: permission denied")
    return p


def loads_json(text: str | bytes, **options):
    """``json.loads(text, **options)``, with a document nested too deeply for Python's parser (``[[[[...``,
    some thousands deep) raised as the :class:`json.JSONDecodeError` every other malformed
    document raises, not as a :class:`RecursionError`: the one way tokdyn parses JSON it did not
    write itself (a file, an archive's member, an argument), so each reader's ``except
    ValueError`` says it in one line."""
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise _NestedTooDeeply() from None


class _NestedTooDeeply(json.JSONDecodeError):
    """:func:`loads_json`'s error: said without a position (where the parser gave up means nothing)."""

    def __init__(self):
        super().__init__("nested too deeply", "", 0)

    def __str__(self) -> str:
        return "nested too deeply to read"


def write_atomically(path: str | os.PathLike, write: Callable, *, binary: bool = False, what: str = "file") -> Path:
    """Write ``path`` as ``write(fh)`` writes it, atomically and without following a planted name.

    The text goes to a new file of a random name in the destination folder, created exclusively
    (``tempfile.mkstemp``: ``O_CREAT | O_EXCL``, so never through a file or link someone left
    there), is flushed to disk, then renamed over ``path`` (``os.replace``: a link at ``path``
    is replaced, not written through). A reader never sees a half-written file, and on any error
    the temporary file is removed and nothing else is touched. :class:`InputError` naming ``what``
    and the file when the folder cannot be written. An OSError of ``write`` that names a file (a
    write to ``fh`` names none) is of a file it reads as it goes, a store's chunk that may not be
    read or whose disk fails, and is raised as it is, naming that file: it was said as "cannot
    write the losses.npz to out.npz: Permission denied", which sent the user after a folder they
    could write.
    """
    _refuse_not_an_output(path, what)
    path = Path(path)
    _refuse_special(path, what)
    tmp = read_failed = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{temporary_prefix(path.name)}.", suffix=".tmp")
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as fh:
            try:
                write(fh)
            except OSError as exc:
                if exc.filename is not None:  # a write to fh names no file: one the callback read
                    read_failed = exc
                raise
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # what open() would give (mkstemp's is 0600)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        if exc is read_failed:
            raise  # an input's (the store's), said by its own path
        why = exc.strerror or str(exc)
        if exc.errno == errno.ENOENT and not path.parent.is_dir():  # the folder, not the file, is missing: name it
            why = f"folder {path.parent} does not exist"
        raise InputError(f"cannot write the {what} to {path}: {why}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path


def check_output_path(path: str | os.PathLike, *, what: str = "file", folder_ok: bool = False) -> Path:
    """Refuse, in one :class:`InputError` line, an output path tokdyn cannot create: its parent
    folder is missing (named), a part of that folder is a file (named), or the path itself is a
    folder (``folder_ok``, for a store or a results folder: a file). The parent is never created."""
    _refuse_not_an_output(path, what)
    p = Path(path)
    if not folder_ok and p.is_dir():
        raise InputError(f"cannot write the {what} to {p}: it is a folder; give the path of a file")
    if not folder_ok:
        _refuse_special(p, what)
    if folder_ok and p.exists() and not p.is_dir():
        raise InputError(f"cannot write the {what} to {p}: it is a file, not a folder")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        blocker = next((a for a in (parent, *parent.parents) if a.exists()), None)
        if blocker is not None and not blocker.is_dir():  # a file where a folder of the path should be
            raise InputError(f"cannot write the {what} to {p}: {blocker} is a file, not a folder")
        raise InputError(f"cannot write the {what} to {p}: folder {parent} does not exist")
    return p


# what makes a folder a zarr node: v3's one metadata file, and v2's (a store another tool wrote)
_ZARR_METADATA = ("zarr.json", ".zgroup", ".zarray")


def _refuse_not_an_output(path: str | os.PathLike, what: str) -> None:
    """:class:`InputError` where ``p`` is ``-`` (standard output elsewhere; tokdyn has no result
    written there, and wrote a file named ``-``; ``./-`` still names that file), or lies inside a
    zarr hierarchy: any folder above it (links followed, as the write follows them) holds zarr
    metadata, so ``--out store.zarr/report.html`` or a run's folder would put a file among the
    store's nodes. The store named is the outermost such folder. A path that is itself a store
    (a store to append to) is not refused here."""
    if os.fspath(path) == "-":  # as given: Path("./-") is "-" too
        raise InputError(f"cannot write the {what} to -: tokdyn writes results to files, never to standard output; "
                         "name a file (./- for a file named -)")  # fmt: skip
    refuse_inside_zarr(path, what)


def refuse_inside_zarr(path: str | os.PathLike, what: str) -> None:
    """:class:`InputError` where ``path`` lies inside a zarr hierarchy (see :func:`_refuse_not_an_output`)."""
    p = Path(path)
    if "://" in os.fspath(path):  # a URL (a store on S3): no local folders above it
        return
    parent = Path(os.path.realpath(p.parent if str(p.parent) else "."))
    nodes = [(a, m) for a in (parent, *parent.parents) for m in _ZARR_METADATA if (a / m).is_file()]
    if nodes:
        top, meta = nodes[-1]
        raise InputError(f"cannot write the {what} to {p}: it is inside the zarr store {top} (which holds {meta}), "
                         "whose folders hold only the store's own data; give a path outside it")  # fmt: skip


def _refuse_special(p: Path, what: str) -> None:
    """:class:`InputError` naming what ``p`` is where it is a device, FIFO or socket: a result
    file is renamed over its path, so ``--out /dev/null`` replaced the machine's null device by
    a regular file (for every program on it). A link at ``p`` is replaced, not written through,
    as documented; a link to a device, FIFO or socket is refused too (``--out /dev/stdout``: a
    link to ``/proc/self/fd/1``, which the result replaced)."""
    kinds = {}
    for look in (os.lstat, os.stat):  # the path, then what a link at it names
        try:
            mode = look(p).st_mode
        except OSError:  # nothing there, a dangling link (or unreadable: the write says so)
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
            kinds[look] = kind_of_mode(mode)
    if kinds:
        where = f"it is {kinds[os.lstat]}" if os.lstat in kinds else f"it is a link to {kinds[os.stat]}"
        raise InputError(f"cannot write the {what} to {p}: {where}, not a regular file, which writing the file would "
                         "replace; give the path of a file")  # fmt: skip


def temporary_prefix(name: str, limit: int = 100) -> str:
    """``name`` cut to at most ``limit`` bytes of UTF-8 (whole characters), for the name of a
    temporary file beside it: a whole name of 242 bytes or more, with mkstemp's 8 characters and
    a suffix, was too long for the file system, and the file was never written."""
    return name.encode("utf-8", "surrogateescape")[:limit].decode("utf-8", "ignore")


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


def rmtree_named(path: str | os.PathLike) -> None:
    """``shutil.rmtree``, whose error names the file by its path: rmtree walks by folder handle,
    and its OSError named a file by its name alone (``Read-only file system: 'zarr.json'``, for
    ``open_store(path, probe, mode="w")`` on a read-only store), which says nothing of where."""

    def named(where, exc):
        if isinstance(exc, OSError) and exc.filename is not None and os.fspath(exc.filename) != os.fspath(where):
            raise type(exc)(exc.errno, exc.strerror, os.fspath(where)) from None
        raise exc

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=lambda func, where, exc: named(where, exc))
    else:
        shutil.rmtree(path, onerror=lambda func, where, info: named(where, info[1]))


def remove_store_folder(path: str | os.PathLike, *, what: str = "store") -> None:
    """Delete the store an earlier run of a pipeline left at ``path``, to make it again.

    Only an empty folder or a folder holding a zarr store is deleted: a link there (``rmtree``
    raised on it, with a traceback), a file, or a folder of something else is an
    :class:`InputError` naming it, and it is left as it is. The folder is moved aside whole
    (``.<name>.removing`` beside it) before it is deleted, so that a run stopped part-way leaves
    the whole store or none (deleted in place, a Ctrl-C left a folder without its ``zarr.json``,
    which every rerun refused); a folder left aside by such a run is deleted first."""
    path = Path(path)
    trash = path.parent / f".{path.name}.removing"
    if os.path.lexists(trash):
        if trash.is_dir() and not trash.is_symlink():
            rmtree_named(trash)
        else:
            trash.unlink()
    if not os.path.lexists(path):
        return
    kind = ("a link" if path.is_symlink() else "a file" if not path.is_dir() else
            None if not os.listdir(path) or (path / "zarr.json").is_file() else "a folder that holds no zarr store")  # fmt: skip
    if kind is not None:
        raise InputError(f"{path} is {kind}, not the {what} an earlier run left, which this run makes again: "
                         "move it, or give another output folder")  # fmt: skip
    os.replace(path, trash)
    rmtree_named(trash)
