"""What a store looks like: version, names, dtypes, chunking, codecs, and the checks on names
and values that every writer applies before anything reaches storage (docs/store.md)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.sync import sync as zarr_sync

from ..errors import InputError, StoreError, TokdynError

__all__ = [
    "SCHEMA_VERSION", "STORE_KIND", "LOSS_DTYPES", "AXES", "CODECS", "DEFAULT_TOKEN_CHUNK", "COORD_CHUNK", "INTEGRITY", "COORDS",
    "compressor", "position_crc", "folders", "has_keys", "utc_now", "join", "check_url", "local_url", "check_run_name", "check_writer_ranges", "jsonable",
    "damage", "check_zarr", "operation", "one_operation", "once",
]  # fmt: skip

SCHEMA_VERSION = 1
STORE_KIND = "tokdyn-store"
LOSS_DTYPES = ("float32", "float16", "float64")
AXES = ("T", "D", "M")
CODECS = ("lz4", "zstd", "none")
DEFAULT_TOKEN_CHUNK = 262144  # 1 MiB of float32 per chunk: see docs/store.md
COORD_CHUNK = 256
INTEGRITY = "crc32 over (run_id, array, chunk coordinates, values), in the commit records"
COORDS = {  # name: (dtype, fill value) of the per-checkpoint arrays
    "step": ("int64", -1),
    "axis_value": ("float64", np.nan),
    "tokens_seen": ("int64", -1),
    "lr": ("float64", np.nan),
    "wall_time": ("float64", np.nan),
    "ckpt_fingerprint": ("uint64", 0),
}
_RUN_NAME_FORBIDDEN = set('/\\:*?"<>|') | {"\0"}


def compressor(codec: str = "lz4") -> tuple:
    """Byte-shuffled Blosc, then a CRC32C checksum of the chunk. lz4 (default) keeps the writer
    above 300 MB/s on 2 cores; zstd stores ~10 % fewer bytes at about half the speed
    (docs/store.md has the measurements). The checksum makes a damaged chunk an error on read:
    Blosc alone decodes a chunk cut short without complaint, as zeros (docs/reliability.md)."""
    if codec not in CODECS:
        raise InputError(f"codec must be one of {CODECS}, got {codec!r}")
    if codec == "none":
        return (Crc32cCodec(),)
    return (BloscCodec(cname=codec, clevel=5 if codec == "lz4" else 3, shuffle="shuffle"), Crc32cCodec())


def position_crc(salt: str, array: str, coords: tuple[int, ...], values: np.ndarray) -> int:
    """CRC-32 of a chunk's values bound to where they belong: the run (``salt``, its random id),
    the array and the chunk's coordinates are hashed before the values. The codec's CRC32C
    covers a chunk's bytes only, so a chunk copied over another of the same array passes it;
    this one does not (docs/store.md, "Integrity")."""
    head = zlib.crc32(f"{salt}/{array}/{'.'.join(str(int(c)) for c in coords)}".encode())
    data = np.ascontiguousarray(values, dtype=np.asarray(values).dtype.newbyteorder("<"))
    return zlib.crc32(data, head) if data.size else head


def folders(store, path: str) -> list[str]:
    """Names of the folders directly under ``path`` of ``store``, whether or not zarr recognises
    them: zarr skips (with a warning) a group whose ``zarr.json`` is lost, which would make a
    damaged run or fit look absent. A folder is a name with a key below it; files are left out."""

    async def ls(prefix: str) -> list[str]:
        return [k async for k in store.list_dir(prefix)]

    base = f"{path.strip('/')}/" if path.strip("/") else ""
    names = {k.strip("/") for k in zarr_sync(ls(base))} - {"", "zarr.json"}
    names = {n for n in names if not n.endswith(".partial")}  # a temporary file of zarr's, not a folder
    return sorted(n for n in names if zarr_sync(store.exists(f"{base}{n}/zarr.json")) or has_keys(store, f"{base}{n}/"))


def has_keys(store, prefix: str) -> bool:
    """Whether any key of ``store`` starts with ``prefix`` (a folder holds something); zarr's
    temporary ``*.partial`` files do not count."""

    async def first() -> bool:
        async for key in store.list_prefix(prefix):
            if not key.endswith(".partial"):
                return True
        return False

    return zarr_sync(first())


def utc_now() -> str:
    """The time now, UTC, to the second, as every timestamp in a store is written."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def join(*parts: str) -> str:
    """A store key from path parts (no leading, trailing or doubled slashes)."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


@functools.cache
def _zarr_refusal() -> str | None:
    """Why this zarr cannot read a group here, or None: zarr 3.1 takes the group's ``node_type``
    out of its metadata inside an ``assert``, which ``python -O`` skips, and then fails on it as
    an unknown argument: every store read as damaged ("the probe group's metadata is
    unreadable (TypeError: ...)")."""
    from zarr import __version__
    from zarr.core.group import GroupMetadata

    try:
        GroupMetadata.from_dict({"zarr_format": 3, "node_type": "group", "attributes": {}})
    except TypeError:
        how = f"python -O{'O' if sys.flags.optimize > 1 else ''}" + (" (PYTHONOPTIMIZE)" if os.environ.get("PYTHONOPTIMIZE") else "")
        return (f"zarr {__version__} cannot read a store's groups under {how}: it skips an assert that reads their metadata; "
                "run python without -O (unset PYTHONOPTIMIZE)")
    return None


def check_zarr() -> None:
    """A StoreError where zarr cannot read stores in this interpreter (:func:`_zarr_refusal`),
    before a store is opened or made, rather than every store said to be damaged."""
    why = _zarr_refusal()
    if why is not None:
        raise StoreError(why)


def check_url(url: Any) -> None:
    if not isinstance(url, (str, os.PathLike)) or not os.fspath(url):
        raise InputError(f"store must be a path or an fsspec URL, got {url!r}")


_LOCAL_SCHEMES = ("file://", "local://")


def local_url(url: str | os.PathLike) -> str | bytes:
    """``url`` with a ``file://`` (or fsspec's ``local://``) scheme taken off: the local path it
    names. zarr would open such a URL through fsspec's local filesystem, which neither makes the
    folders a new store needs (creating one failed, "No such file or directory: .../zarr.json")
    nor writes a commit record by temporary file and rename, the atomic write crash safety rests
    on (docs/store.md, "Commits"); a plain path gets zarr's local store, which does both. As with
    fsspec, the rest of the URL is the path as written (no percent-decoding). A path that
    starts with ``~`` is the user's home, as in a shell (``open_store("~/runs.zarr")`` in a
    notebook made a folder named ``~`` beside it). A path object is taken as its string."""
    url = os.fspath(url)
    if not isinstance(url, str):  # a bytes path: as it is
        return url
    if url.startswith("~"):
        return os.path.expanduser(url)
    if url[:8].lower().startswith(_LOCAL_SCHEMES):
        scheme = next(s for s in _LOCAL_SCHEMES if url.lower().startswith(s))
        path = url[len(scheme):]
        if not path:
            raise InputError(f"store URL {url!r} names no path")
        return path
    return url


# a run name is one folder name: file systems hold 255 bytes (ext4, xfs, APFS; NTFS 255 UTF-16 units)
RUN_NAME_MAX_BYTES = 255


def check_run_name(name: str, *, new: bool = False) -> None:
    """A run name is a folder under ``runs/``: a non-empty string without ``/ \\ : * ? " < > |``
    or a leading dot (it must stay a folder inside ``runs/``). A ``new`` run's name must also be
    one that every reader lists: ``zarr.json`` is the folder's own metadata, and a name ending in
    ``.partial`` is what zarr calls its temporary files, which :func:`folders` leaves out (such a
    run was written and never listed); control characters (a newline) would split the one line
    ``tokdyn info`` prints per run. Runs an older version created under such names are still
    opened, read and deleted by name."""
    if not isinstance(name, str) or not name or name.startswith(".") or set(name) & _RUN_NAME_FORBIDDEN:
        raise InputError(f"run name must be a non-empty string without / \\ : * ? \" < > | or a leading dot, got {name!r}")
    if new and (name == "zarr.json" or name.endswith(".partial") or not name.strip()
                or any(ord(ch) < 32 or ord(ch) == 127 for ch in name)):  # fmt: skip
        raise InputError(f"a new run name must not be blank, hold control characters, be zarr.json or end in .partial "
                         f"(readers would not list such a run); got {name!r}")  # fmt: skip
    if new and len(name.encode("utf-8", "surrogatepass")) > RUN_NAME_MAX_BYTES:  # "File name too long" from the disk
        raise InputError(f"a new run name is a folder name, at most {RUN_NAME_MAX_BYTES} bytes in UTF-8; got one of "
                         f"{len(name.encode('utf-8', 'surrogatepass'))} ({name[:40]!r}...)")  # fmt: skip


def check_writer_ranges(ranges: list[tuple[int, int]], n: int, chunk: int) -> None:
    pos = 0
    for a, b in ranges:
        if a != pos or b <= a:
            raise InputError(f"writer token ranges must tile [0, {n}) in order without gaps, got {ranges}")
        if a % chunk:
            raise InputError(f"writer range {a}:{b} does not start on a token-chunk boundary ({chunk})")
        pos = b
    if pos != n:
        raise InputError(f"writer token ranges end at {pos}; the probe has {n} tokens")


# What a failed chunk read raises that is not damage to the chunk: the store's or the machine's
# trouble (tokdyn's own refusals, an OSError, out of memory), raised as it is; anything else a
# read raises is a codec's error on damaged data.
NOT_DAMAGE = (TokdynError, OSError, MemoryError)


def damage(exc: BaseException) -> str:
    """What an error reading a store's metadata or chunk says, for a message: ``ErrorType: text``,
    and a zarr.json nested past Python's parser (a :class:`RecursionError` in zarr's read) as
    that, not as the interpreter's "maximum recursion depth exceeded while decoding ..."."""
    if isinstance(exc, RecursionError):
        return "its JSON is nested too deeply to read"
    return f"{type(exc).__name__}: {exc}"


def jsonable(obj: Any, what: str) -> Any:
    """``obj`` as plain JSON values (numpy scalars and arrays included); InputError otherwise."""
    try:
        return json.loads(json.dumps(obj, default=_json_default))
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} must be JSON-serialisable: {exc}") from None


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


# Per thread: the views (by id: a view is pickled to dask's workers, a lock is not) in an
# operation, each with what that operation has read once for all its parts (once).
_OPERATIONS = threading.local()


@contextlib.contextmanager
def operation(view: object) -> Iterator[dict]:
    """One operation of ``view`` (a store or run view: a public read, and the reads it is made
    of): yields its state, what it has read once for all its parts (:func:`once`).
    Its first check that the view is still what it was opened on records ``"checked"`` there,
    and the later ones inside it read nothing: ``Run.info`` read the run's id 4 times and its
    commit record 8 times (its rows, the fit's record, its summary), a read of a fit slice the
    id twice, and ``losses`` the commit record twice. A check that fails is not recorded (the
    next one inside reads again, as before). Per thread: another thread's operation on the same
    view reads for itself. An operation inside another of the same view is part of it."""
    views = _OPERATIONS.__dict__.setdefault("views", {})
    if id(view) in views:
        yield views[id(view)]
        return
    views[id(view)] = state = {}
    try:
        yield state
    finally:
        del views[id(view)]


def one_operation(view: Callable[[Any], object] = lambda self: self):
    """A decorator: each call of the method is one :func:`operation` of ``view(self)`` (the
    object itself; a fit's, its run), so the reads it is made of read the run's id and commit
    records once."""

    def decorate(method):
        @functools.wraps(method)
        def read(self, *args, **kwargs):
            with operation(view(self)):
                return method(self, *args, **kwargs)

        return read

    return decorate


def once(view: object, key: Any, read: Callable[[], Any]) -> Any:
    """``read()``, once in an :func:`operation` of ``view`` in this thread: kept in its state
    under ``key`` for the later calls inside it (``"checked"``: the view is still what it was
    opened on; a commit record); outside one, read at every call. A read that raises keeps
    nothing (the next one inside reads again)."""
    state = getattr(_OPERATIONS, "views", {}).get(id(view))
    if state is None:
        return read()
    if key not in state:
        state[key] = read()
    return state[key]
