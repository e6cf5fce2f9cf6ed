"""Interchange with the paper's public ``losses.npz`` format.

The file holds ``axis_values [K]``, ``loss_matrix [N, K]`` (nats), ``axis_name [1]`` (``"T"``,
``"D"`` or ``"M"``) and optional per-token arrays ``[N]`` (``sample_id``, ``token_pos`` and other
metadata). tokdyn reads and writes that schema unchanged, always with ``allow_pickle=False``.
A float32 matrix survives import then export bit for bit (NaN included). The reserved per-token
arrays ``sample_id``, ``token_pos`` and ``token_id`` must hold whole numbers >= 0
(:func:`tokdyn.probe.check_token_arrays`), checked before anything is written.

A store's probe holds more than per-token arrays; export adds what else it has, under names
that readers of the plain format can ignore, and import restores it, so the probe fingerprint
survives export then import (and the imported probe keeps its token ids):

- ``probe_tokens [S, C+1]``: the token ids (absent for an index-only probe);
- ``probe_domains [n]``, ``probe_documents [n]``: domain names and document keys;
- ``probe_tokenizer [1]``: the tokenizer spec as a JSON object.
"""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np

from ._checks import log_tie
from ._files import check_regular, loads_json, write_atomically
from .errors import InputError, NotAStoreError, ProbeMismatchError, RunExistsError, StoreError, UnsafeFileError
from .probe import DOC_ID_FIX, ProbeSet, check_token_arrays, vocab_size_of
from .store import AXES, LOSS_DTYPES, Run, RunWriter, TrajectoryStore, open_store
from .store.schema import check_run_name

__all__ = ["read_npz", "import_npz", "export_npz"]

_REQUIRED = ("axis_values", "loss_matrix", "axis_name")
_PROBE = ("probe_tokens", "probe_domains", "probe_documents", "probe_tokenizer")  # the rest of a store's probe


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Load and validate a ``losses.npz``; returns its arrays.

    Raises :class:`UnsafeFileError` for object (pickled) arrays and :class:`InputError` for a
    missing key, wrong shapes, non-float losses, unsorted axis values (or two a fit's log axis
    cannot tell apart: :func:`tokdyn._checks.log_tie`), or reserved per-token
    arrays (``sample_id``, ``token_pos``, ``token_id``) that are not whole numbers >= 0 (and
    token ids below the vocabulary size of ``probe_tokenizer`` when it gives one).
    """
    return _read_npz(path, matrix=True)


def _read_npz(path: str | os.PathLike, *, matrix: bool) -> dict[str, np.ndarray]:
    """:func:`read_npz`; with ``matrix=False`` the data of ``loss_matrix`` is not read: it
    stands in as a view of one value broadcast to the shape and dtype its header declares (no
    memory), every check on it made from the header (import streams the data itself)."""
    p = check_regular(path, "npz file")
    if not zipfile.is_zipfile(p):  # np.load would take any other file for a pickle
        raise InputError(f"{p} is not a readable npz file (not a zip archive)")
    headers = _check_headers(p)  # shapes, dtypes and sizes from the members' headers, before inflating any data
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if matrix or k != "loss_matrix"}
            if not matrix and "loss_matrix" in z.files:
                shape, dtype = headers["loss_matrix"]
                arrays["loss_matrix"] = np.broadcast_to(np.zeros((), dtype), shape)
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object" in str(exc).lower():
            raise _pickled(p) from None
        raise InputError(f"{p} is not a readable npz file: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a damaged member: zipfile, zlib, bz2, lzma... each its own error
        if isinstance(exc, MemoryError):
            raise
        raise InputError(f"{p} is not a readable npz file: {exc}") from None
    missing = [k for k in _REQUIRED if k not in arrays]
    if missing:
        raise InputError(f"{p} lacks {', '.join(missing)}; a losses.npz holds {', '.join(_REQUIRED)}")
    ax, lm, name = arrays["axis_values"], arrays["loss_matrix"], arrays["axis_name"]
    if lm.ndim != 2 or lm.dtype.kind != "f":
        raise InputError(f"loss_matrix must be a float array [N, K], got {lm.dtype} {lm.shape}")
    if lm.dtype.itemsize > 8:
        raise InputError(f"loss_matrix is {lm.dtype}; a store keeps float16, float32 or float64 losses "
                         "(convert it, e.g. to float64, before importing)")
    n, k = lm.shape
    if n == 0 or k == 0:
        raise InputError(f"loss_matrix is empty ({lm.shape})")
    if ax.shape != (k,) or ax.dtype.kind not in "fiu":
        raise InputError(f"axis_values must be numbers of shape ({k},) to match loss_matrix {lm.shape}, got {ax.dtype} {ax.shape}")
    if not np.all(np.isfinite(ax)) or np.any(ax[1:] <= ax[:-1]):  # compared in their own dtype: no wrap-around
        raise InputError("axis_values must be finite and strictly increasing")
    _check_axis_exact(ax, _axis_name(name) if name.size == 1 and name.dtype.kind in "US" else "")
    if name.size != 1 or name.dtype.kind not in "US" or _axis_name(name) not in AXES:
        raise InputError(f"axis_name must be one string among {AXES}, got {name!r}")
    tie = log_tie(ax)  # one point to a fit (x = log10 of the axis values), which refuses the run: refused now
    # (after the exactness check: values a float64 cannot tell apart at all are said as such)
    if tie is not None:
        raise InputError(f"axis_values[{tie}] = {ax[tie]} and axis_values[{tie + 1}] = {ax[tie + 1]} are too close to tell "
                         f"apart on a log scale: both give log10 = {float(np.log10(float(ax[tie])))!r} in float64, so no "
                         "fit could use the run (tokdyn fit refuses it); make them distinct, or leave one of the two out")  # fmt: skip
    for key, v in arrays.items():
        if key in _REQUIRED:
            continue
        if key in _PROBE:
            _check_probe_member(p, key, v, n)
            continue
        if v.shape != (n,):
            raise InputError(f"per-token array {key!r} has shape {v.shape}; expected ({n},) like loss_matrix rows")
        if v.dtype.kind not in "iufbU" or (v.dtype.kind == "f" and v.dtype.itemsize > 8):
            raise InputError(f"per-token array {key!r} has unsupported dtype {v.dtype} (numbers of at most 64 bits, "
                             "booleans or unicode strings" + ("; these are bytes: decode them, e.g. arr.astype(str)" if v.dtype.kind == "S" else "")
                             + ")")  # fmt: skip
        if not key.isidentifier() or key == "tokens":
            raise InputError(f"per-token array name {key!r} is not allowed (use a Python identifier other than 'tokens')")
    # the probe's own numbers: the analyses read them as integers (the same check as ProbeSet's)
    check_token_arrays(arrays, n, vocab_size=vocab_size_of(_tokenizer_spec(arrays)), what=f"{p}: per-token array")
    return arrays


def _whole(ax: np.ndarray) -> bool:
    """Whether every axis value is a whole number >= 0 (what a step is, range aside)."""
    return bool(np.all(ax >= 0) and (ax.dtype.kind in "iu" or np.all(ax == np.round(ax))))


def _steps_hold(ax: np.ndarray, axis: str) -> bool:
    """Whether the rows of a file of axis values ``ax`` on ``axis`` get those values as steps
    (int64, exact): a T axis of whole numbers >= 0 below 2**63."""
    if axis != "T" or not np.all(ax >= 0):
        return False
    if ax.dtype.kind in "iu":
        return bool(np.all(ax.astype(np.uint64) < np.uint64(2**63)))
    # compared in float64: 2^63 cast to a float16 array's own dtype overflows (a warning)
    return bool(np.all(ax == np.round(ax)) and np.all(ax.astype(np.float64) < 2.0**63))


def _check_axis_exact(ax: np.ndarray, axis: str) -> None:
    """Refuse axis values that the store's float64 ``axis_value`` cannot hold exactly (integers
    beyond 2**53, wider floats), unless they are steps of a T axis (kept exactly as int64)."""
    as_float = ax.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = np.array_equal(as_float.astype(ax.dtype), ax) and (ax.dtype.kind != "f" or np.all(np.isfinite(as_float)))
    if exact or (ax.dtype.kind in "iu" and _steps_hold(ax, axis)):
        return
    with np.errstate(invalid="ignore", over="ignore"):
        bad = next(i for i in range(ax.size) if as_float[i].astype(ax.dtype) != ax[i] or not np.isfinite(as_float[i]))
    raise InputError(f"axis_values[{bad}] = {ax[bad]} ({ax.dtype}) cannot be stored exactly: a store keeps axis values "
                     f"as float64, which reads it as {as_float[bad]}")


def _tokenizer_spec(arrays: dict[str, np.ndarray]) -> dict:
    """The tokenizer spec of a validated npz (``{}`` without ``probe_tokenizer``)."""
    return loads_json(str(arrays["probe_tokenizer"].reshape(-1)[0])) if "probe_tokenizer" in arrays else {}


def _check_probe_member(p: Path, key: str, v: np.ndarray, n: int) -> None:
    if key == "probe_tokens":
        if v.ndim != 2 or v.shape[1] < 2 or v.dtype.kind not in "iu" or v.shape[0] * (v.shape[1] - 1) != n:
            raise InputError(f"{p}: probe_tokens must be integer token ids [S, C+1] with S * C = {n} (loss_matrix rows), got {v.dtype} {v.shape}")
        if v.size and (v.min() < 0 or v.max() > np.iinfo(np.int32).max):
            raise InputError(f"{p}: probe_tokens holds ids outside [0, 2**31)")
    elif key == "probe_tokenizer":
        if v.size != 1 or v.dtype.kind != "U":
            raise InputError(f"{p}: probe_tokenizer must be one JSON string, got {v.dtype} {v.shape}")
        try:
            spec = loads_json(str(v.reshape(-1)[0]))
        except ValueError:
            spec = None
        if not isinstance(spec, dict):
            raise InputError(f"{p}: probe_tokenizer must hold a JSON object (the tokenizer spec)")
    elif v.ndim != 1 or v.dtype.kind != "U":  # probe_domains, probe_documents
        raise InputError(f"{p}: {key} must be a 1-d array of strings, got {v.dtype} {v.shape}")


def _pickled(p: Path) -> UnsafeFileError:
    return UnsafeFileError(f"{p} holds object arrays that need pickle to load; tokdyn never unpickles data files")


def _member_headers(p: Path) -> dict[str, tuple[tuple[int, ...], np.dtype, tuple[int, bool]]]:
    """``{name: (shape, dtype, holds)}`` of every array of an npz, read from the ``.npy`` headers
    only (a few hundred bytes of each member are inflated, never the data); ``holds``: the most
    bytes of data the member can hold after its header (:func:`_member_holds`)."""
    out = {}
    try:
        with zipfile.ZipFile(p) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise InputError(f"{p}: member {info.filename!r} is not an array; an npz holds .npy members only")
                if info.filename[:-4] in out:  # np.load would take the last, after the first was checked
                    raise InputError(f"{p}: member {info.filename!r} appears twice; which one is meant is ambiguous")
                if info.flag_bits & 0x1:  # zipfile asks for a password (a RuntimeError quoting its ZipInfo)
                    raise InputError(f"{p}: member {info.filename!r} is encrypted; tokdyn reads an npz as np.savez writes "
                                     "it, without a password: save the arrays again")  # fmt: skip
                try:
                    fh = zf.open(info)
                except NotImplementedError:  # a method this Python's zipfile has no decompressor for
                    raise InputError(f"{p}: member {info.filename!r} is compressed with zip method {info.compress_type}, which "
                                     "Python's zipfile cannot read: save the arrays again with np.savez or np.savez_compressed") from None  # fmt: skip
                with fh:
                    shape, _, dtype = _npy_header(fh, p, info.filename)
                    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    out[info.filename[:-4]] = (shape, dtype, _member_holds(info, fh.tell(), fh, declared))
    except (InputError, MemoryError):  # already says what is wrong (an InputError is a ValueError too)
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged member: zipfile, zlib, bz2, lzma... each its own error
        if isinstance(exc, ValueError) and "object" in str(exc).lower():
            raise _pickled(p) from None
        raise InputError(f"{p} is not a readable npz file: {type(exc).__name__}: {exc}") from None
    return out


# Deflate inflates at most about 1032 bytes per byte: a member whose zip directory claims more
# than this many bytes per stored byte cannot hold them.
_DEFLATE_RATIO = 1100


def _member_holds(info: zipfile.ZipInfo, header: int, fh, declared: int) -> tuple[int, bool]:
    """The most bytes of data a member can hold after its ``.npy`` header of ``header`` bytes,
    and whether that is its size (else a bound: a deflated member holds at most
    ``_DEFLATE_RATIO`` times its stored bytes, whatever size the directory claims). Stored or
    deflated, from the zip directory; compressed another way (bzip2, LZMA), counted from ``fh``
    (left at the member's data) up to the ``declared`` bytes its header gives: bzip2 inflates
    zeros a million-fold, so neither its stored bytes nor the directory's claim bound it (a
    692-byte file claiming 200 MB built a probe of 50 million tokens before the data was missing).
    A member declaring more than this machine's memory is not read (:func:`_check_headers`
    refuses it)."""
    holds, exact = info.file_size - header, True
    if info.compress_type == zipfile.ZIP_STORED and info.compress_size < info.file_size:
        holds = info.compress_size - header
    elif info.compress_type == zipfile.ZIP_DEFLATED and info.compress_size * _DEFLATE_RATIO < holds:
        holds, exact = info.compress_size * _DEFLATE_RATIO, False
    elif info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) and declared <= (_memory_bytes() or declared):
        holds = 0
        while holds < declared:
            data = fh.read(min(1 << 20, declared - holds))
            if not data:
                break
            holds += len(data)
    return max(0, holds), exact


def _check_member_size(p: Path, name: str, shape: tuple[int, ...], dtype: np.dtype, holds: tuple[int, bool]) -> None:
    """Refuse a member whose ``.npy`` header declares more data than the member holds, before
    anything is made for it: a file of a few hundred bytes declaring 2e8 tokens built (and
    wrote) a 1.7 GB probe before its data was found missing."""
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    size, exact = holds
    if declared > size:
        ends = f"its data ends after {size:,} of the {declared:,} bytes" if exact else \
            f"its compressed data cannot hold the {declared:,} bytes"  # fmt: skip
        raise InputError(f"{p} is not a readable npz file: {name} is cut short: {ends} its header declares ({dtype} {shape})")


def _npy_header(fh, p: Path, member: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the ``.npy`` member ``member`` of ``p``, read from ``fh``
    at its start, which is left at the member's data."""
    version = np.lib.format.read_magic(fh)
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise InputError(f"{p}: member {member!r} has an unknown .npy version {version}")
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran_order, dtype = read(fh, max_header_size=10_000)
    return tuple(int(d) for d in shape), bool(fortran_order), np.dtype(dtype)


def _check_headers(p: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Refuse, before any data is inflated, an npz whose declared arrays are not a losses.npz,
    would not fit in this machine's memory, or are more than their members hold; returns the
    headers (:func:`_member_headers`)."""
    sizes = _member_headers(p)
    headers = {name: (shape, dtype) for name, (shape, dtype, _) in sizes.items()}
    limit = _memory_bytes()
    for name, (shape, dtype) in headers.items():
        if dtype.hasobject:
            raise _pickled(p)
        size = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if limit and size > limit:
            raise InputError(f"{p}: array {name!r} declares shape {shape} of {dtype} ({size / 2**30:,.1f} GiB), more than "
                             f"this machine's memory ({limit / 2**30:,.1f} GiB)")  # fmt: skip
    if "loss_matrix" in headers:
        shape, dtype = headers["loss_matrix"]
        if len(shape) != 2 or dtype.kind != "f":
            raise InputError(f"loss_matrix must be a float array [N, K], got {dtype} {shape}")
        n, k = shape
        for name, (sh, _) in headers.items():
            want = (k,) if name == "axis_values" else (1,) if name == "axis_name" else None if name in ("loss_matrix", *_PROBE) else (n,)
            if want is not None and sh != want and not (name == "axis_name" and int(np.prod(sh)) == 1):
                raise InputError(f"{'per-token ' if want == (n,) else ''}array {name!r} declares shape {sh}; expected {want} to match loss_matrix {shape}")
    for name, (shape, dtype, holds) in sizes.items():
        _check_member_size(p, name, shape, dtype, holds)
    return headers


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def import_npz(
    path: str | os.PathLike, store: str | os.PathLike | TrajectoryStore, *, run: str | None = None, dtype: str | None = None
) -> Run:
    """Import a ``losses.npz`` as a run of ``store`` (created if missing).

    The run's axis is the file's ``axis_name``; its rows are the ``K`` axis points. Into an
    existing store, the file must describe the same tokens: ``N`` equal, every per-token array
    the file shares with the store's probe equal, and the token ids equal when both have them.
    A new store gets the probe the file describes: its per-token arrays and, when the file
    carries them (``export_npz`` writes them), the token ids, domains, documents and tokenizer,
    so a store exported then imported keeps its probe fingerprint. ``dtype`` defaults to the
    file's, so nothing is rounded unless asked.

    The loss matrix is never in memory whole: every other member is read and checked first, as
    by :func:`read_npz` (the matrix from its header), then the matrix is read from the file
    (stored or compressed) ``IMPORT_TOKENS`` tokens at a time and appended a group of rows
    (``IMPORT_BYTES``) at a time (:func:`_import_matrix`): the same run as appending each
    column of the loaded matrix made.
    """
    if run is not None and not run.strip():
        raise InputError("run: expected a name, got an empty one (leave --run out to name the run after the file)")
    arrays = _read_npz(path, matrix=False)  # loss_matrix: its shape and dtype only
    name = run or Path(path).stem
    try:
        check_run_name(name, new=True)  # before a store is made for it
    except InputError as exc:
        if run is not None:
            raise
        raise InputError(f"the run is named after the file, {Path(path).name!r}, but {exc}; name it with --run NAME") from None
    lm = arrays["loss_matrix"]
    n, k = lm.shape
    # the file's own dtype by default, in native byte order (a big-endian '>f4' is float32)
    dtype = dtype or lm.dtype.newbyteorder("=").name
    if dtype not in LOSS_DTYPES:
        raise InputError(f"dtype must be one of {LOSS_DTYPES}, got {dtype!r}")
    axis = _axis_name(arrays["axis_name"])
    top = np.max(arrays["axis_values"])
    # a step is an int64: the cast would wrap negative (integers compared exactly: 2^63 - 512
    # as a float is 2^63); only whole values >= 0 would be steps (others number the rows)
    if axis == "T" and _whole(arrays["axis_values"]) and (int(top) if arrays["axis_values"].dtype.kind in "iu" else float(top)) >= 2**63:
        raise InputError(f"axis_values reach {float(top):g}; a step on T must be below 2^63 (are these tokens? name the axis D)")
    carried = [key for key in arrays if key not in _REQUIRED and key not in _PROBE]  # per-token arrays in the file
    axis_values = arrays["axis_values"]
    integral = _steps_hold(axis_values, axis)
    steps = axis_values.astype(np.int64) if integral else np.arange(k)  # D/M rows are numbered
    # how the file held what the store keeps in its own dtypes: export writes them back so
    layout = {"axis_values": axis_values.dtype.str, "loss_matrix": lm.dtype.str,
              "axis_name": [arrays["axis_name"].dtype.str, list(arrays["axis_name"].shape)],
              "token_arrays": {key: arrays[key].dtype.str for key in carried},
              "probe": _probe_layout(arrays)}  # fmt: skip
    # a failed command leaves no new store behind (and a folder that was there before, empty)
    st = _open_or_create(store, _probe_from(arrays, Path(path)), carried)
    try:
        r = st.create_run(name, axis=axis, capacity=k, dtype=dtype,
                          attrs={"source": "npz", "source_file": Path(path).name, "npz_layout": layout})  # fmt: skip
    except RunExistsError:  # import makes a new run: there is nothing to resume
        st.discard_if_new()
        raise RunExistsError(f"run {name!r} already exists in {st.url}; import under another name (--run NAME), or delete "
                             "that run first (tokdyn delete-run STORE --run NAME, or tokdyn.open_store(STORE, mode='r+').delete_run(NAME))") from None  # fmt: skip
    except BaseException:
        st.discard_if_new()
        raise
    w = None
    try:
        w = r.writer()
        infinite = _import_matrix(Path(path), (n, k, lm.dtype), w, steps, axis_values)
    except BaseException:
        st.delete_run(name)  # never leave a partial run that blocks a retry
        st.discard_if_new()
        raise
    finally:
        if w is not None:
            w.release()
    if infinite:  # the store keeps every non-finite loss as NaN (docs/store.md)
        # each line names its file and run: Python says a text once per place, so a loop of imports
        # with as many such losses each was told of the first file only, and not which
        warnings.warn(f"{os.fspath(path)} (run {name!r}): loss_matrix holds {infinite:,} infinite losses; the store keeps every non-finite loss as NaN, "
                      "so they export as NaN", UserWarning, stacklevel=2)  # fmt: skip
    overflow = w.overflowed  # finite losses the run's dtype cannot hold (a narrower --dtype): stored as NaN
    if overflow:  # --dtype narrower than the file: rounding was asked for, losing values was not
        warnings.warn(f"{os.fspath(path)} (run {name!r}): loss_matrix holds {overflow:,} finite losses beyond the range of {dtype} (largest "
                      f"{float(np.finfo(dtype).max):g}); they are stored as NaN (import with a wider --dtype, e.g. "
                      f"{lm.dtype.newbyteorder('=').name}, to keep them)", UserWarning, stacklevel=2)  # fmt: skip
    return r


# Tokens read from the file at once by import: 16,384 tokens x 200 rows of float32 is 13 MB
# (no single read of the loss matrix returns more than this many tokens).
IMPORT_TOKENS = 16_384
# Rows of the run import holds at once, each with all its tokens in the file's dtype: as many as
# fit in this many bytes, at least one (2,000,000 tokens of float32: 50 rows, so a C-ordered
# matrix of 200 rows is read in 4 passes; docs/benchmarks.md, "Analysis at scale").
IMPORT_BYTES = 384 * 2**20


class _MatrixMember:
    """The data of the ``loss_matrix.npy`` member of an npz, read in order, ``count`` values at a
    time (a stored member is read as it lies, a compressed one inflated as it goes: never whole).
    Whatever goes wrong reading it is an :class:`InputError` naming the file."""

    def __init__(self, p: Path, n: int, k: int, dtype: np.dtype) -> None:
        self.p, self.dtype = p, dtype
        self.left = n * k * dtype.itemsize  # bytes of data still to read
        self.total = self.left
        self._zf = self._fh = None
        try:
            self._zf = zipfile.ZipFile(p)
            self._fh = self._zf.open("loss_matrix.npy")
            shape, self.fortran_order, got = _npy_header(self._fh, p, "loss_matrix.npy")
        except Exception as exc:  # noqa: BLE001 - as in read
            self.close()
            if isinstance(exc, (MemoryError, InputError)):
                raise
            raise self._error(exc) from None
        if shape != (n, k) or got != dtype:  # another file since it was checked
            self.close()
            raise InputError(f"{p}: loss_matrix now declares {np.dtype(got)} {tuple(shape)}, not {dtype} {(n, k)} as when "
                             "the file was checked; it changed while it was imported")  # fmt: skip

    def _error(self, exc: BaseException) -> InputError:
        return InputError(f"{self.p} is not a readable npz file: loss_matrix: {type(exc).__name__}: {exc}")

    def read(self, count: int) -> np.ndarray:
        """The next ``count`` values (in the file's dtype, read-only)."""
        size = count * self.dtype.itemsize
        parts, got = [], 0
        try:
            while got < size:
                data = self._fh.read(size - got)
                if not data:
                    break
                parts.append(data)
                got += len(data)
        except Exception as exc:  # noqa: BLE001 - a damaged member: zipfile, zlib, lzma... each its own error
            if isinstance(exc, MemoryError):
                raise
            raise self._error(exc) from None
        if got < size:
            done = self.total - self.left + got
            raise InputError(f"{self.p} is not a readable npz file: loss_matrix is cut short: its data ends after "
                             f"{done:,} of the {self.total:,} bytes its header declares")  # fmt: skip
        self.left -= size
        return np.frombuffer(parts[0] if len(parts) == 1 else b"".join(parts), dtype=self.dtype)

    def finish(self) -> None:
        """Read to the member's end (bytes after the data are ignored, as ``np.load`` ignores
        them): zipfile checks the member's CRC-32 there, which a damaged byte fails."""
        try:
            while self._fh.read(1 << 20):
                pass
        except Exception as exc:  # noqa: BLE001 - as in read
            if isinstance(exc, MemoryError):
                raise
            raise self._error(exc) from None

    def close(self) -> None:
        for f in (self._fh, self._zf):
            if f is not None:
                f.close()


def _import_matrix(p: Path, header: tuple[int, int, np.dtype], w: RunWriter, steps: np.ndarray, axis_values: np.ndarray) -> int:
    """Append ``loss_matrix [N, K]`` of ``p`` as the ``K`` rows of ``w``'s new run, one
    :meth:`RunWriter.append` a row as before, never holding the matrix whole: a group of rows
    (``IMPORT_BYTES``) at a time; returns how many of its values are infinite.

    The file reads in order, ``IMPORT_TOKENS`` tokens at a time. A Fortran-ordered matrix holds
    each row of the run (a column of the matrix) contiguously: one pass fills one group of rows
    after another. A C-ordered one (what ``np.save`` writes) holds tokens contiguously: each
    group of rows is one pass over the data, every slice of tokens transposed into the group;
    a compressed member is inflated again for each pass (zip members read in order only)."""
    n, k, dtype = header
    g = max(1, min(k, IMPORT_BYTES // (n * dtype.itemsize)))
    rows = np.empty((g, n), dtype)
    infinite, member = 0, None
    try:
        for j0 in range(0, k, g):
            part = rows[: min(k, j0 + g) - j0]
            if member is None or not member.fortran_order:  # a C-ordered matrix: read again from its start
                if member is not None:
                    member.close()
                member = _MatrixMember(p, n, k, dtype)
            if member.fortran_order:
                for row in part:
                    for a in range(0, n, IMPORT_TOKENS):
                        row[a : a + IMPORT_TOKENS] = member.read(min(IMPORT_TOKENS, n - a))
            else:
                for a in range(0, n, IMPORT_TOKENS):
                    e = min(n, a + IMPORT_TOKENS)
                    part[:, a:e] = member.read((e - a) * k).reshape(e - a, k)[:, j0 : j0 + len(part)].T
                member.finish()  # the member's CRC-32, checked before the rows of this pass are stored
            infinite += int(np.isinf(part).sum())
            for i, row in enumerate(part):
                j = j0 + i
                w.append(row, step=int(steps[j]), axis_value=float(axis_values[j]), wall_time=np.nan, warn_nonfinite=False)
        if member.fortran_order:
            member.finish()
    finally:
        if member is not None:
            member.close()
    return infinite


def _probe_from(arrays: dict[str, np.ndarray], p: Path) -> ProbeSet:
    """The probe a validated npz describes: its per-token arrays, and the token ids, domains,
    documents and tokenizer when it carries them (index-only without ``probe_tokens``)."""
    n = arrays["loss_matrix"].shape[0]
    token_arrays = {key: v for key, v in arrays.items() if key not in _REQUIRED and key not in _PROBE}
    tokens = arrays.get("probe_tokens")
    if tokens is None:
        token_arrays.setdefault("sample_id", np.arange(n, dtype=np.int32))
        token_arrays.setdefault("token_pos", np.zeros(n, dtype=np.int32))
    else:  # token i is position i % C + 1 of sequence i // C: the per-token arrays must say the same
        c = tokens.shape[1] - 1
        layout = {"sample_id": np.arange(n) // c, "token_pos": np.arange(n) % c + 1, "token_id": tokens[:, 1:].reshape(-1)}
        for key, want in layout.items():
            if key in token_arrays and not np.array_equal(token_arrays[key], want):
                raise InputError(f"{p}: per-token array {key!r} does not match probe_tokens (token i is position i % C + 1 of sequence i // C)")
            token_arrays.setdefault(key, want.astype(np.int32))
    try:
        return ProbeSet(
            tokens,
            token_arrays,
            domains=[str(d) for d in arrays.get("probe_domains", ())],
            documents=[str(d) for d in arrays.get("probe_documents", ())],
            tokenizer=_tokenizer_spec(arrays),
        )
    except InputError as exc:
        raise InputError(f"{p}: {exc}") from None


def _open_or_create(store, probe: ProbeSet, carried: list[str]) -> TrajectoryStore:
    """The target store: an existing one must describe the same tokens (the per-token arrays
    ``carried`` in the file, and the token ids); a new one gets the file's probe."""
    if isinstance(store, TrajectoryStore):
        st = store
    else:
        local = os.fspath(store)
        if isinstance(local, str) and "://" not in local and os.path.isfile(os.path.expanduser(local)):
            raise InputError(f"{local} is a file; a store is a folder (give a new path to create one)")
        try:
            st = TrajectoryStore.open(store, mode="r+")
        except NotAStoreError:
            return open_store(store, probe, mode="a")
    _check_compatible(st.probe, probe, carried)
    return st


def export_npz(run: Run, out: str | os.PathLike) -> Path:
    """Write ``run`` as a ``losses.npz`` (float16 losses widen exactly to float32), with every
    field of the store's probe: ``import_npz`` of the file rebuilds a probe of the same
    fingerprint."""
    if not isinstance(run, Run):
        raise InputError(f"run must be a tokdyn Run (open_store(url).run(name)), got {type(run).__name__}")
    r, st = run, run.store
    if r.n_committed == 0:
        raise InputError(f"run {r.name!r} has no committed rows to export")
    clash = sorted(set(st.probe.token_arrays) & {*_REQUIRED, *_PROBE})
    if clash:  # they would overwrite the file's own members: axis values replaced by a probe field
        raise InputError(f"the store's probe has per-token array(s) {clash}, names a losses.npz keeps for its own members; "
                         "the run cannot be exported without losing one of them (rename the probe's arrays)")  # fmt: skip
    out = Path(out)
    if out.suffix != ".npz":
        # (".npz" alone is a hidden file with no suffix: "must end in .npz, got .npz")
        why = "a name before .npz" if out.name == ".npz" else "a name that ends in .npz"
        raise InputError(f"output must be a file with {why}, got {out}")
    if not out.parent.exists():
        raise InputError(f"output folder does not exist: {out.parent}")
    _warn_past_documents(st.probe)
    layout = _layout(r)
    axis_values = _axis_values_as_imported(r, layout.get("axis_values"))
    k, stored = axis_values.size, r.dtype  # the rows written: those committed when their axis values were read
    matrix = layout.get("loss_matrix")
    if matrix is not None and matrix.newbyteorder("=") != stored:
        matrix = None  # imported with another --dtype: exported as stored
    if matrix is None:  # float16 widened (exactly) to float32, unless the file was float16
        matrix = np.dtype(np.float32) if stored == np.float16 else stored
    # (the file's dtype differs from the stored one at most in byte order: every value holds)
    members = {
        "axis_values": axis_values,
        "loss_matrix": None,  # streamed: never the whole [tokens, rows] matrix in memory
        "axis_name": _axis_name_as_imported(r.axis, layout.get("axis_name")),
        **{key: _exactly(np.asarray(v), layout.get("token_arrays", {}).get(key)) for key, v in st.probe.token_arrays.items()},
        **_probe_members(st.probe, layout.get("probe", {})),
    }

    def write(fh) -> None:
        # np.savez's own layout (stored members, zip64, .npy format 1.0), member by member
        with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for key, value in members.items():
                with zf.open(key + ".npy", "w", force_zip64=True) as member:
                    if value is None:
                        _write_loss_matrix(member, r, k, matrix)
                    else:
                        np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)

    # never a half-written file under the final name, never written through a planted link
    return write_atomically(out, write, binary=True, what="losses.npz")


def _warn_past_documents(probe: ProbeSet) -> None:
    """A warning where the probe's ``doc_id`` indexes past its document keys (a store written
    before they were checked): the file is written as the store holds it, and import-npz refuses
    it until the keys are given or left out, which the warning says first."""
    doc_id, documents = probe.token_arrays.get("doc_id"), probe.documents
    if doc_id is None or not len(documents) or not np.size(doc_id):
        return
    lo, hi = float(np.min(doc_id)), float(np.max(doc_id))
    if lo < 0 or hi >= len(documents):
        warnings.warn(f"the store's probe gives doc_id values {lo:g}..{hi:g} past its {len(documents)} document keys (a store "
                      f"written before tokdyn checked them): the file holds them as stored, and import-npz refuses it "
                      f"until you {DOC_ID_FIX}", stacklevel=2)  # fmt: skip


# Tokens converted and written at once by export: 16,384 tokens x 200 rows of float32 is 13 MB.
EXPORT_TOKENS = 16_384


def _write_loss_matrix(fh, r: Run, k: int, dtype: np.dtype) -> None:
    """The ``.npy`` of ``loss_matrix [N, K]`` (the run's first ``k`` rows, transposed, in
    ``dtype``), as ``np.save`` writes it, from the store a token chunk at a time: the store
    keeps rows contiguous ([K, N], chunks of one row by ``token_chunk`` tokens), the file
    tokens, so a column of chunks (every row, one chunk of tokens) is read, checked, and written
    out ``EXPORT_TOKENS`` tokens at a time."""
    n = r.n_tokens
    np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n, k)})
    tc = r.token_chunk
    for a in range(0, n, tc):
        block = r.losses(tokens=slice(a, min(n, a + tc)), rows=slice(0, k))  # [k, tokens]
        if block.shape != (k, min(n, a + tc) - a):
            raise StoreError(f"run {r.name!r}: loss[:{k}, {a}:{a + tc}] read as {block.shape}; the store changed while it was exported")
        for i in range(0, block.shape[1], EXPORT_TOKENS):
            fh.write(np.ascontiguousarray(block[:, i : i + EXPORT_TOKENS].astype(dtype).T).data)


# The longest tokenizer spec text a run keeps as its file held it (spacing, key order, escapes);
# a longer one exports as the spec's own JSON (the same object).
_TOKENIZER_TEXT = 65_536


def _probe_layout(arrays: dict[str, np.ndarray]) -> dict:
    """How the file held the probe members it carries (dtype; the tokenizer spec's text and
    shape too), for export to write them back so."""
    out: dict = {key: arrays[key].dtype.str for key in ("probe_tokens", "probe_domains", "probe_documents") if key in arrays}
    tok = arrays.get("probe_tokenizer")
    if tok is not None:
        text = str(tok.reshape(-1)[0])
        out["probe_tokenizer"] = [tok.dtype.str, list(tok.shape), text if len(text) <= _TOKENIZER_TEXT else None]
    return out


def _layout_dtype(text, kinds: str, itemsize: int) -> np.dtype | None:
    """The dtype ``text`` (from a run's attributes, whatever they hold) names when it is a plain
    one of a kind in ``kinds`` and at most ``itemsize`` bytes wide; else None."""
    try:
        with warnings.catch_warnings():  # a deprecated alias ('a') is still a dtype
            warnings.simplefilter("ignore")
            dt = np.dtype(str(text))
    except (TypeError, ValueError):
        return None
    return dt if dt.kind in kinds and dt.itemsize <= itemsize and not dt.fields and not dt.shape else None


def _layout(r: Run) -> dict:
    """The dtypes (and the axis name's shape) of the file a run was imported from, as far as
    they are valid (``attrs["npz_layout"]``, written by :func:`import_npz`): ``{}`` for a run
    recorded here, or one imported by an older tokdyn."""
    raw = r.attrs.get("npz_layout") if r.attrs.get("source") == "npz" else None
    out: dict = {"token_arrays": {}, "probe": {}}
    if not isinstance(raw, dict):
        return {}
    # axis values of any float width a file held (a float128 of float64 values exports so)
    for key, kinds, width in (("axis_values", "iuf", 16), ("loss_matrix", "f", 8)):
        dt = _layout_dtype(raw.get(key), kinds, width)
        if dt is not None and (dt.kind != "f" or dt.itemsize <= 8 or key == "axis_values"):
            out[key] = dt
    tokens = raw.get("token_arrays")
    for key, text in (tokens.items() if isinstance(tokens, dict) else ()):
        dt = _layout_dtype(text, "iufbU", 4096)
        if dt is not None and (dt.kind == "U" or dt.itemsize <= 8):
            out["token_arrays"][key] = dt
    name = raw.get("axis_name")
    if isinstance(name, list) and len(name) == 2 and isinstance(name[1], list) and len(name[1]) <= 8 and all(type(d) is int and d == 1 for d in name[1]):  # (a bool is an int: [true] failed in reshape)
        dt = _layout_dtype(name[0], "US", 4096)
        if dt is not None and dt.itemsize:
            out["axis_name"] = (dt, tuple(name[1]))
    probe = raw.get("probe")
    for key, kinds, width in (("probe_tokens", "iu", 8), ("probe_domains", "U", 4096), ("probe_documents", "U", 4096)):
        dt = _layout_dtype(probe.get(key), kinds, width) if isinstance(probe, dict) else None
        if dt is not None:
            out["probe"][key] = dt
    tok = probe.get("probe_tokenizer") if isinstance(probe, dict) else None
    if isinstance(tok, list) and len(tok) == 3 and isinstance(tok[1], list) and len(tok[1]) <= 8 and all(isinstance(d, int) and d == 1 for d in tok[1]):
        dt = _layout_dtype(tok[0], "U", 4 * _TOKENIZER_TEXT)
        if dt is not None:
            out["probe"]["probe_tokenizer"] = (dt, tuple(tok[1]), tok[2] if isinstance(tok[2], str) else None)
    return out


def _exactly(values: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """``values`` in ``dtype`` when that holds every value exactly (NaN as NaN), else unchanged."""
    if dtype is None or dtype == values.dtype or dtype.kind not in {"f": "fiu", "i": "iu", "u": "iu"}.get(values.dtype.kind, values.dtype.kind):
        return values
    with np.errstate(invalid="ignore", over="ignore"):
        cast = values.astype(dtype)
        same = np.array_equal(cast.astype(values.dtype), values, equal_nan=values.dtype.kind == "f" and dtype.kind == "f")
    return cast if same else values


def _axis_values_as_imported(r: Run, dtype: np.dtype | None) -> np.ndarray:
    """The run's axis values, in the dtype of the file it was imported from (exactly: integer
    steps of a T axis from the int64 steps, which hold any of them), else float64 — but a T
    run whose axis values are its steps, one of them beyond 2**53, as its int64 steps: as
    floats they round (step 2**63 - 512 to 2**63, which no import takes as a step)."""
    values = r.axis_values
    if dtype is None and r.axis == "T":
        steps = r.steps
        if steps.size and steps.max() > 2**53 and np.array_equal(steps.astype(np.float64), values):
            dtype = np.dtype(np.int64)
    if dtype is not None and dtype.kind in "iu" and r.axis == "T":
        steps = r.steps
        if np.all(steps >= 0) and np.array_equal(steps.astype(np.float64), values):  # the steps are the values
            with np.errstate(invalid="ignore", over="ignore"):
                cast = steps.astype(dtype)
            if np.array_equal(cast.astype(np.int64), steps) and np.all(cast >= 0):
                return cast
    return _exactly(values, dtype)


def _axis_name_as_imported(axis: str, layout) -> np.ndarray:
    """The axis name as the imported file held it (str or bytes, its shape), else ``[axis]``."""
    if layout is not None:
        dtype, shape = layout
        try:
            return np.array(axis.encode("ascii") if dtype.kind == "S" else axis, dtype=dtype).reshape(shape)
        except (ValueError, TypeError, UnicodeError):
            pass
    return np.array([axis])


def _probe_members(probe: ProbeSet, layout: dict) -> dict[str, np.ndarray]:
    """The probe's fields beyond its per-token arrays, as npz members (only those it has, so an
    imported plain losses.npz exports as it came), each as the run's file held it (``layout``,
    from :func:`_layout`) wherever that holds the same values: the tokenizer spec's own text
    when it reads as the probe's spec."""
    out = {}
    if probe.tokens is not None:
        out["probe_tokens"] = _exactly(probe.tokens, layout.get("probe_tokens"))
    if probe.domains:
        out["probe_domains"] = _exactly(np.array(probe.domains, dtype=str), layout.get("probe_domains"))
    if probe.documents:
        out["probe_documents"] = _exactly(np.array(probe.documents, dtype=str), layout.get("probe_documents"))
    if probe.tokenizer:
        out["probe_tokenizer"] = _tokenizer_member(dict(probe.tokenizer), layout.get("probe_tokenizer"))
    return out


def _tokenizer_member(spec: dict, layout) -> np.ndarray:
    """``probe_tokenizer``: the spec as JSON, ``[1]``; as the file held it (its text, dtype and
    shape) where ``layout`` gives them and they hold the same spec."""
    text = json.dumps(spec, sort_keys=True)
    if layout is None:
        return np.array([text])
    dtype, shape, held = layout
    try:
        if held is not None and loads_json(held) == spec:
            text = held
    except ValueError:
        pass
    try:
        member = np.array(text, dtype=dtype).reshape(shape)
    except (ValueError, TypeError, UnicodeError):
        return np.array([text])
    return member if str(member.reshape(-1)[0]) == text else np.array([text])  # a narrower dtype cuts the text


def _axis_name(a: np.ndarray) -> str:
    v = a.reshape(-1)[0]
    return v.decode("ascii", "replace") if isinstance(v, bytes) else str(v)


def _check_compatible(store_probe: ProbeSet, probe: ProbeSet, carried: list[str]) -> None:
    """Refuse a file whose tokens differ from the store's probe in anything both describe; warn
    about what the file describes that the store's probe cannot keep (its probe was made
    before), which the run's export will not give back."""
    if store_probe.n_tokens != probe.n_tokens:
        raise ProbeMismatchError(f"npz has {probe.n_tokens} tokens; the store's probe has {store_probe.n_tokens}")
    if store_probe.tokens is not None and probe.tokens is not None and not np.array_equal(store_probe.tokens, probe.tokens):
        raise ProbeMismatchError("npz probe_tokens differ from the store's probe token ids; these are different tokens")
    # the file's own per-token arrays, and those its probe_tokens lay out (token i is position
    # i % C + 1 of sequence i // C): facts of the file, compared like the ones it names; except
    # against a store made from a file without token ids, whose sample_id and token_pos are the
    # placeholders import gives (0..N-1 and 0), not facts of its tokens
    n = store_probe.n_tokens
    placeholders = store_probe.tokens is None and all(
        np.array_equal(store_probe.token_arrays.get(k), v)
        for k, v in (("sample_id", np.arange(n)), ("token_pos", np.zeros(n))))  # fmt: skip
    laid_out = () if probe.tokens is None or placeholders else ("sample_id", "token_pos", "token_id")
    known = [*carried, *(k for k in laid_out if k not in carried)]
    for key in known:
        mine = store_probe.token_arrays.get(key)
        if mine is not None and not np.array_equal(mine, probe.token_arrays[key]):
            raise ProbeMismatchError(f"npz per-token array {key!r} differs from the store's probe; these are different tokens")
    dropped = [key for key in carried if key not in store_probe.token_arrays]
    if probe.tokens is not None and store_probe.tokens is None:
        dropped.append("probe_tokens")
    for member, mine, theirs in (("probe_domains", list(store_probe.domains), list(probe.domains)),
                                 ("probe_documents", list(store_probe.documents), list(probe.documents)),
                                 ("probe_tokenizer", dict(store_probe.tokenizer), dict(probe.tokenizer))):  # fmt: skip
        if theirs and mine and theirs != mine:
            raise ProbeMismatchError(f"npz {member} differs from the store's probe; these are different tokens (or labels)")
        if theirs and not mine:
            dropped.append(member)
    if dropped:
        warnings.warn(f"the store's probe (made before) has no {', '.join(dropped)}; the file's are not kept, and the run's "
                      "export will lack them (import into a new store to keep them)", UserWarning, stacklevel=3)  # fmt: skip
