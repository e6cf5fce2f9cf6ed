"""Interchange with the paper's public ``losses.npz`` format.

The file holds ``axis_values [K]``, ``loss_matrix [N, K]`` (nats), ``axis_name [1]`` (``"T"``,
``"D"`` or ``"M"``) and optional per-token arrays ``[N]`` (``sample_id``, ``token_pos`` and other
metadata). tokdyn reads and writes that schema unchanged, always with ``allow_pickle=False``.
A float32 matrix survives import then export bit for bit (NaN included).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .errors import InputError, NotAStoreError, ProbeMismatchError, UnsafeFileError
from .probe import ProbeSet
from .store import AXES, LOSS_DTYPES, Run, TrajectoryStore, open_store

__all__ = ["read_npz", "import_npz", "export_npz"]

_REQUIRED = ("axis_values", "loss_matrix", "axis_name")


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Load and validate a ``losses.npz``; returns its arrays.

    Raises :class:`UnsafeFileError` for object (pickled) arrays and :class:`InputError` for a
    missing key, wrong shapes, non-float losses or unsorted axis values.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"npz file not found: {p}")
    if not zipfile.is_zipfile(p):  # np.load would take any other file for a pickle
        raise InputError(f"{p} is not a readable npz file (not a zip archive)")
    _check_headers(p)  # shapes, dtypes and sizes from the members' headers, before inflating any data
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object" in str(exc).lower():
            raise _pickled(p) from None
        raise InputError(f"{p} is not a readable npz file: {exc}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InputError(f"{p} is not a readable npz file: {exc}") from None
    missing = [k for k in _REQUIRED if k not in arrays]
    if missing:
        raise InputError(f"{p} lacks {', '.join(missing)}; a losses.npz holds {', '.join(_REQUIRED)}")
    ax, lm, name = arrays["axis_values"], arrays["loss_matrix"], arrays["axis_name"]
    if lm.ndim != 2 or lm.dtype.kind != "f":
        raise InputError(f"loss_matrix must be a float array [N, K], got {lm.dtype} {lm.shape}")
    n, k = lm.shape
    if n == 0 or k == 0:
        raise InputError(f"loss_matrix is empty ({lm.shape})")
    if ax.shape != (k,) or ax.dtype.kind not in "fiu":
        raise InputError(f"axis_values must be numbers of shape ({k},) to match loss_matrix {lm.shape}, got {ax.dtype} {ax.shape}")
    if not np.all(np.isfinite(ax)) or np.any(np.diff(ax.astype(np.float64)) <= 0):  # no unsigned wrap-around
        raise InputError("axis_values must be finite and strictly increasing")
    if name.size != 1 or name.dtype.kind not in "US" or _axis_name(name) not in AXES:
        raise InputError(f"axis_name must be one string among {AXES}, got {name!r}")
    for key, v in arrays.items():
        if key in _REQUIRED:
            continue
        if v.shape != (n,):
            raise InputError(f"per-token array {key!r} has shape {v.shape}; expected ({n},) like loss_matrix rows")
        if v.dtype.kind not in "iufbU":
            raise InputError(f"per-token array {key!r} has unsupported dtype {v.dtype}")
        if not key.isidentifier() or key == "tokens":
            raise InputError(f"per-token array name {key!r} is not allowed (use a Python identifier other than 'tokens')")
    return arrays


def _pickled(p: Path) -> UnsafeFileError:
    return UnsafeFileError(f"{p} holds object arrays that need pickle to load; tokdyn never unpickles data files")


def _member_headers(p: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``{name: (shape, dtype)}`` of every array of an npz, read from the ``.npy`` headers only
    (a few hundred bytes of each member are inflated, never the data)."""
    out = {}
    try:
        with zipfile.ZipFile(p) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise InputError(f"{p}: member {info.filename!r} is not an array; an npz holds .npy members only")
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version not in ((1, 0), (2, 0), (3, 0)):
                        raise InputError(f"{p}: member {info.filename!r} has an unknown .npy version {version}")
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                    shape, _, dtype = read(fh, max_header_size=10_000)
                out[info.filename[:-4]] = (tuple(int(d) for d in shape), np.dtype(dtype))
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, TypeError) as exc:
        if isinstance(exc, ValueError) and "object" in str(exc).lower():
            raise _pickled(p) from None
        raise InputError(f"{p} is not a readable npz file: {type(exc).__name__}: {exc}") from None
    return out


def _check_headers(p: Path) -> None:
    """Refuse, before any data is inflated, an npz whose declared arrays are not a losses.npz or
    would not fit in this machine's memory."""
    headers = _member_headers(p)
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
            want = (k,) if name == "axis_values" else (1,) if name == "axis_name" else None if name == "loss_matrix" else (n,)
            if want is not None and sh != want and not (name == "axis_name" and int(np.prod(sh)) == 1):
                raise InputError(f"{'per-token ' if want == (n,) else ''}array {name!r} declares shape {sh}; expected {want} to match loss_matrix {shape}")


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
    existing store, the file must describe the same tokens: ``N`` equal, and every per-token
    array the file shares with the store's probe equal. ``dtype`` defaults to the file's, so
    nothing is rounded unless asked.
    """
    arrays = read_npz(path)
    lm = arrays["loss_matrix"]
    n, k = lm.shape
    dtype = dtype or str(lm.dtype)
    if dtype not in LOSS_DTYPES:
        raise InputError(f"dtype must be one of {LOSS_DTYPES}, got {dtype!r}")
    axis = _axis_name(arrays["axis_name"])
    token_arrays = {key: v for key, v in arrays.items() if key not in _REQUIRED}
    st = _open_or_create(store, token_arrays, n)
    name = run or Path(path).stem
    try:
        r = st.create_run(name, axis=axis, capacity=k, dtype=dtype, attrs={"source": "npz", "source_file": Path(path).name})
    except BaseException:
        st.discard_if_new()  # a failed command leaves no new store behind
        raise
    w = r.writer()
    axis_values = arrays["axis_values"]
    integral = axis == "T" and bool(np.all(axis_values >= 0) and np.all(axis_values == np.round(axis_values)))
    steps = axis_values.astype(np.int64) if integral else np.arange(k)  # D/M rows are numbered
    try:
        for j in range(k):
            w.append(lm[:, j], step=int(steps[j]), axis_value=float(axis_values[j]), wall_time=np.nan, warn_nonfinite=False)
    except BaseException:
        st.delete_run(name)  # never leave a partial run that blocks a retry
        st.discard_if_new()
        raise
    finally:
        w.release()
    return r


def _open_or_create(store, token_arrays: dict, n: int) -> TrajectoryStore:
    """The target store: an existing one must describe the same tokens; a new one gets an
    index-only probe made of the file's per-token arrays."""
    if isinstance(store, TrajectoryStore):
        st = store
    else:
        try:
            st = TrajectoryStore.open(store, mode="r+")
        except NotAStoreError:
            full = dict(token_arrays)
            full.setdefault("sample_id", np.arange(n, dtype=np.int32))
            full.setdefault("token_pos", np.zeros(n, dtype=np.int32))
            return open_store(store, ProbeSet(None, full), mode="a")
    _check_compatible(st.probe, token_arrays, n)
    return st


def export_npz(run: Run, out: str | os.PathLike) -> Path:
    """Write ``run`` as a ``losses.npz`` (float16 losses widen exactly to float32)."""
    if not isinstance(run, Run):
        raise InputError(f"run must be a tokdyn Run (open_store(url).run(name)), got {type(run).__name__}")
    r, st = run, run.store
    if r.n_committed == 0:
        raise InputError(f"run {r.name!r} has no committed rows to export")
    losses = r.losses()
    if losses.dtype == np.float16:
        losses = losses.astype(np.float32)
    arrays = {
        "axis_values": r.axis_values,
        "loss_matrix": np.ascontiguousarray(losses.T),
        "axis_name": np.array([r.axis]),
        **st.probe.token_arrays,
    }
    out = Path(out)
    if out.suffix != ".npz":
        raise InputError(f"output must end in .npz, got {out}")
    if not out.parent.exists():
        raise InputError(f"output folder does not exist: {out.parent}")
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, out)  # never leave a half-written file under the final name
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _axis_name(a: np.ndarray) -> str:
    v = a.reshape(-1)[0]
    return v.decode("ascii", "replace") if isinstance(v, bytes) else str(v)


def _check_compatible(store_probe: ProbeSet, token_arrays: dict, n: int) -> None:
    if store_probe.n_tokens != n:
        raise ProbeMismatchError(f"npz has {n} tokens; the store's probe has {store_probe.n_tokens}")
    for key, v in token_arrays.items():
        mine = store_probe.token_arrays.get(key)
        if mine is not None and not np.array_equal(mine, v):
            raise ProbeMismatchError(f"npz per-token array {key!r} differs from the store's probe; these are different tokens")
