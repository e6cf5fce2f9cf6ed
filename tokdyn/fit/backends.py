"""Backends of the fit: numba (CPU, compiled), numpy (CPU, batched) and torch (CPU or CUDA).

All three solve the same problem with the same algorithm (:mod:`tokdyn.fit.lm`) and agree to
solver tolerance. ``backend="auto"`` picks numba when it is installed, else torch on a CUDA
device when one is visible, else numpy. Why (measured, docs/fitting.md): the numba kernel
keeps one trajectory per thread in L1 and vectorises its inner loops, 177k sigmoid fits/s per
core; the batched numpy and torch code stream ~30 temporaries of [B, K] through memory per
iteration. On an H200 machine numba on its 16 cores fitted 631k sigmoids/s against 213k/s
for torch on the GPU (whose host-side share then dominates); for the whole record (two
sigmoids too) the GPU was ahead, 95k/s against 79k/s, so ask for ``backend="torch"``
there if that is what you run.

This module also holds ``ops``, the handful of array calls whose spelling differs between
numpy and torch, so the batched solver is written once.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import warnings
from typing import Any

import numpy as np

from tokdyn._checks import numba_setting
from tokdyn._text import one_line, shown
from tokdyn.errors import InputError
from tokdyn.fit.grid import grid_start, two_start
from tokdyn.fit.lm import MODEL_SIGMOID, LMResult, cholesky_solve, levenberg_marquardt
from tokdyn.fit.models import two_sigmoid_evaluate
from tokdyn.fit.prepare import NEGATIVE_TOLERANCE, SUMMARY_FIELDS, prepare
from tokdyn.fit.projection import sigmoid_amplitudes, sigmoid_projected
from tokdyn.fit.sigmoid import LEVEL_FLOOR, s_min_of, sigmoid_evaluate

__all__ = [
    "BACKENDS",
    "available_backends",
    "resolve_backend",
    "NumpyOps",
    "TorchOps",
    "load_numba",
    "run_lm",
    "prepare_rows",
    "inverse_diagonal",
    "grid_starts",
    "two_starts",
]

BACKENDS = ("auto", "numba", "numpy", "torch")


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def available_backends() -> list[str]:
    """Backends usable in this environment, fastest first for the CPU."""
    found = []
    if _has("numba"):
        found.append("numba")
    found.append("numpy")
    if _has("torch"):
        found.append("torch")
    return found


def _cuda_available() -> bool:
    if not _has("torch"):
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_backend(backend: str, device: Any = None) -> tuple[str, Any]:
    """Turn ``backend``/``device`` into a concrete (backend, device) pair, or raise InputError."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise InputError(f"backend: expected one of {BACKENDS}, got {shown(backend)}")
    if device is not None and backend not in ("auto", "torch"):
        raise InputError(f"device={shown(device)} only applies to backend='torch', got "
                         f"{backend!r}")
    if backend == "auto":
        if device is not None:
            backend = "torch"
        elif _has("numba"):
            backend = "numba"
        elif _cuda_available():
            backend = "torch"
        else:
            backend = "numpy"
    if backend not in available_backends():
        raise InputError(
            f"backend {backend!r} is not installed; available: {available_backends()}"
        )
    if backend == "numba":
        _require_numba_threads()
        from tokdyn._jit import warn_uncached

        load_numba()  # its kernels are made (kept on disk, or not: said once) as it is imported
        warn_uncached()
    if backend == "torch":
        import torch

        try:
            device = torch.device(device if device is not None else
                                  ("cuda" if torch.cuda.is_available() else "cpu"))
        except Exception as err:  # RuntimeError, TypeError, ValueError, by torch version
            raise InputError(f"device: expected a torch device, got {shown(device)}") from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InputError(f"device {device} requested but CUDA is not available")
        _check_device(torch, device)
    return backend, device


# Devices a float64 tensor was made on and read back from (in this process).
_DEVICES_OK: set[str] = set()


def _check_device(torch, device) -> None:
    """InputError unless the fit can run on ``device``: a float64 tensor made there, computed
    with and read back. A device torch names but cannot compute on (``meta``, which holds no
    data; a CUDA index beyond the GPUs there; one without float64, such as ``mps``) fails
    here with one clear error, not in the middle of a fit."""
    key = str(device)
    if key in _DEVICES_OK:
        return
    try:
        t = torch.ones(2, dtype=torch.float64, device=device)
        value = float((t * 2.0).sum().cpu().item())
    except Exception as err:
        first = f"{type(err).__name__}: {err}".splitlines()[0][:200]
        raise InputError(
            f"device {key!r}: the fit cannot run there ({first}); use 'cpu' or a CUDA device"
        ) from err
    if value != 4.0:
        raise InputError(f"device {key!r}: 2 * (1 + 1) computed there gave {value}, not 4")
    _DEVICES_OK.add(key)


class NumpyOps:
    """The array calls the batched solver needs, numpy flavour (float64 throughout)."""

    float_dtype = np.float64

    @staticmethod
    def asarray(a):
        return np.ascontiguousarray(a, dtype=np.float64)

    @staticmethod
    def to_numpy(a):
        return np.asarray(a)

    exp = staticmethod(np.exp)
    sqrt = staticmethod(np.sqrt)
    abs = staticmethod(np.abs)
    isfinite = staticmethod(np.isfinite)
    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    zeros_like = staticmethod(np.zeros_like)
    ones_like = staticmethod(np.ones_like)
    full_like = staticmethod(np.full_like)

    @staticmethod
    def clip(a, lo, hi):
        return np.minimum(np.maximum(a, lo), hi)

    @staticmethod
    def clip_scalar(a, lo: float, hi: float):
        return np.clip(a, lo, hi)

    @staticmethod
    def rowmax(a):
        return a.max(-1, keepdims=True)

    @staticmethod
    def rowsum(a):
        """Sum over the last axis, left to right: exact zeros (unobserved points) then change
        nothing, so a row's sums do not depend on how many unobserved columns it has
        (numpy's pairwise sum groups terms by position)."""
        return np.add.accumulate(a, axis=-1)[..., -1]

    @staticmethod
    def stack(arrays, axis):
        return np.stack(arrays, axis=axis)

    @staticmethod
    def arange(n):
        return np.arange(n)

    @staticmethod
    def zeros_int(n):
        return np.zeros(n, dtype=np.int64)

    @staticmethod
    def full_int(n, value):
        return np.full(n, value, dtype=np.int64)

    @staticmethod
    def full_int_like(a, value):
        return np.full_like(a, value)

    @staticmethod
    def cast(a, like):
        return a.astype(like.dtype)

    @staticmethod
    def nonzero(mask):
        return np.flatnonzero(mask)


class TorchOps:
    """The same calls, torch flavour, on one device (float64: the optimum must match scipy's)."""

    def __init__(self, device) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.float_dtype = torch.float64

    def asarray(self, a):
        return self.torch.as_tensor(np.ascontiguousarray(a), dtype=self.float_dtype,
                                    device=self.device)

    @staticmethod
    def to_numpy(a):
        return a.detach().cpu().numpy()

    def exp(self, a):
        return self.torch.exp(a)

    def sqrt(self, a):
        return self.torch.sqrt(a)

    def abs(self, a):
        return self.torch.abs(a)

    def isfinite(self, a):
        return self.torch.isfinite(a)

    def where(self, cond, a, b):
        return self.torch.where(cond, a, b)

    def maximum(self, a, b):
        return self.torch.maximum(a, b)

    def zeros_like(self, a):
        return self.torch.zeros_like(a)

    def ones_like(self, a):
        return self.torch.ones_like(a)

    def full_like(self, a, value):
        return self.torch.full_like(a, value)

    def clip(self, a, lo, hi):
        return self.torch.minimum(self.torch.maximum(a, lo), hi)

    def clip_scalar(self, a, lo: float, hi: float):
        return self.torch.clamp(a, lo, hi)

    def rowmax(self, a):
        return a.amax(-1, keepdim=True)

    def rowsum(self, a):
        return a.sum(-1)

    def stack(self, arrays, axis):
        return self.torch.stack(arrays, dim=axis)

    def arange(self, n):
        return self.torch.arange(n, device=self.device)

    def zeros_int(self, n):
        return self.torch.zeros(n, dtype=self.torch.int64, device=self.device)

    def full_int(self, n, value):
        return self.torch.full((n,), value, dtype=self.torch.int64, device=self.device)

    def full_int_like(self, a, value):
        return self.torch.full_like(a, value)

    def cast(self, a, like):
        return a.to(like.dtype)

    def nonzero(self, mask):
        return self.torch.nonzero(mask).squeeze(1)


# ---------------------------------------------------------------------------------------------
# Running the solver on a backend

# Least damping shrink of variable projection (as tokdyn.fit.varpro.SHRINK_MIN).
SHRINK_MIN = 0.1

# Rows per batched call: big enough to amortise Python overhead, small enough that the
# [rows, K] temporaries stay in cache on a CPU.
_NUMPY_ROWS = 1024
_TORCH_CPU_ROWS = 4096
_TORCH_CUDA_ROWS = 1 << 18


# One compiled kernel call at a time: each already spreads its chunks over every core
# (numba_kernels.run_chunks), so two at once (a dask threads scheduler's workers) would only
# oversubscribe them.
_NUMBA_LOCK = threading.Lock()


def _require_numba_threads() -> None:
    """InputError unless numba takes this environment's settings (:func:`tokdyn._checks.numba_setting`)
    and starts its threading layer: ``NUMBA_THREADING_LAYER=tbb`` without TBB installed was
    "internal error ... No threading layer could be loaded" at the fit's first kernel."""
    why = numba_setting()
    if why is not None:
        raise InputError(why)
    from numba.np.ufunc.parallel import _launch_threads

    try:
        _launch_threads()  # once per process; numba's own first kernel call does the same
    except ValueError as exc:
        layer = os.environ.get("NUMBA_THREADING_LAYER")
        raise InputError(f"numba cannot start its threads ({one_line(exc, 150)})"
                         f"{f': NUMBA_THREADING_LAYER={layer!r} names a layer this machine lacks; unset it' if layer else ''}") from None


def load_numba():
    """The compiled kernels module, or None when numba is not installed."""
    if not _has("numba"):
        return None
    from tokdyn.fit import numba_kernels

    return numba_kernels


def load_triton():
    """The fused GPU solver's module (:mod:`tokdyn.fit.triton_kernels`), or None when triton
    is not installed or does not import. Under ``TRITON_INTERPRET=1`` (set before triton is
    first imported) its kernels run in Triton's interpreter on the CPU: how the tests check
    them without a GPU."""
    if not _has("triton"):
        return None
    try:
        from tokdyn.fit import triton_kernels
    except (ImportError, RuntimeError):
        return None
    return triton_kernels


# Why the one-launch solver failed in this process (it is then not tried again): empty, or
# one line.
_FUSED_ERROR: list[str] = []
# One launch of it at a time: Triton compiles a kernel on its first call, and two threads
# compiling the same kernel at once can fail (triton-lang/triton#5933); the launches share
# the device's stream anyway.
_FUSED_LOCK = threading.Lock()


def _fused_sigmoid_solver(ops):
    """The one-launch sigmoid solver for the torch backend's device, or None: on CUDA with
    triton installed (set TOKDYN_FUSED=0 to use the batched solver there instead), unless it
    already failed in this process."""
    if (ops.device.type != "cuda" or os.environ.get("TOKDYN_FUSED", "1") == "0"
            or _FUSED_ERROR):
        return None
    return load_triton()


def _fused_solve(fused, *args, **kwargs) -> dict | None:
    """``fused.projected_sigmoid_lm(*args, **kwargs)``, or None where it already failed in
    this process or fails now (a Triton or driver that cannot build or run it): then it says
    so once, and the batched solver fits this and every later block (same results)."""
    if _FUSED_ERROR:
        return None
    try:
        with _FUSED_LOCK:
            return fused.projected_sigmoid_lm(*args, **kwargs)
    except Exception as err:
        _FUSED_ERROR.append(f"{type(err).__name__}: {err}".splitlines()[0][:300])
        warnings.warn("tokdyn: the fused GPU sigmoid solver failed (" + _FUSED_ERROR[0] + "); "
                      "fitting with the batched torch solver instead (same results, slower)",
                      RuntimeWarning, stacklevel=3)
        return None


# The width columns of each model's parameters: s, and s1 and s2 (the solvers work in ln s).
WIDTH_COLUMNS = {4: (3,), 7: (3, 6)}


def run_lm(
    model: int,
    x: np.ndarray,
    Y: np.ndarray,
    p0: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    max_iter: int,
    ftol: float,
    xtol: float,
    backend: str,
    device: Any = None,
    step_max: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Fit ``model`` (MODEL_SIGMOID or MODEL_TWO_SIGMOIDS) to every row on a concrete backend.

    Parameters are natural: (l0, linf, mu, s) for the sigmoid, (linf, d1, mu1, s1, d2, mu2,
    s2) for two; every solver works in ln s. numba solves by variable projection
    (:mod:`tokdyn.fit.varpro`: only mu and ln s are searched, the amplitudes of p0 are not
    used); numpy and torch run the full-parameter solver of :mod:`tokdyn.fit.lm` from p0.
    Both reach the same optimum from the same start. ``step_max`` [B, 2] = (mu, ln s): each
    row's longest step of variable projection in an event's parameters (a trust region of
    half a cell of the row's start grid).

    Inputs are numpy (NaN in Y marks a missing point); the result is numpy: p [B, P],
    sse [B], se [B, P] (the standard errors as ``curve_fit`` reports them, NaN where J^T J is
    singular), cov_ok [B] (False there), n_iter [B], status [B] (lm.LM_CONVERGED or
    lm.LM_FAILED).
    """
    B, P = p0.shape
    if B == 0:
        return dict(p=p0.copy(), sse=np.zeros(0), se=np.zeros((0, P)),
                    cov_ok=np.zeros(0, dtype=bool), n_iter=np.zeros(0, np.int64),
                    status=np.zeros(0, np.int64))
    if backend == "numba":
        from tokdyn.fit import varpro

        with _NUMBA_LOCK:
            p, sse, se, cov_ok, n_iter, status = varpro.varpro_block(
                P, x, Y, p0, lo, hi, max_iter, ftol, xtol, step_max, varpro.SHRINK_MIN
            )
        return dict(p=p, sse=sse, se=se, cov_ok=cov_ok, n_iter=n_iter, status=status)
    cols = list(WIDTH_COLUMNS[P])
    given = p0
    p0, lo, hi = (_log_columns(a, cols) for a in (p0, lo, hi))
    if model == MODEL_SIGMOID:
        res = _run_projected_sigmoid(x, Y, p0, lo, hi, max_iter=max_iter, ftol=ftol,
                                     xtol=xtol, backend=backend, device=device,
                                     step_max=step_max)
    else:
        res = _run_two_sigmoids(x, Y, p0, lo, hi, max_iter=max_iter, ftol=ftol, xtol=xtol,
                                backend=backend, device=device)
    # back to s; one the solver left where it started stays as given (exp(log(s)) may differ
    # from s in its last bit)
    th = res["p"][:, cols]
    res["p"][:, cols] = np.where(th == p0[:, cols], given[:, cols], np.exp(th))
    res["se"], res["cov_ok"] = _standard_errors(res.pop("A"), res["sse"], res.pop("n"),
                                                res["p"], cols, backend)
    return res


def _log_columns(a: np.ndarray, cols: list[int]) -> np.ndarray:
    """Copy of a with ln taken of the width columns (the solvers' parameterization)."""
    out = np.array(a, dtype=np.float64)
    out[:, cols] = np.log(out[:, cols])
    return out


def _standard_errors(A, sse, n, p, cols, backend) -> tuple[np.ndarray, np.ndarray]:
    """SEs [B, P] of the natural parameters (se of s = s * se of ln s) and ok [B], from the
    full J^T J [B, P, P] in the solver's parameters: cov = s^2 (J^T J)^-1 with s^2 = SSE /
    (n - P), as scipy's curve_fit reports it."""
    P = A.shape[1]
    inv_diag, ok = inverse_diagonal(A, backend)
    var = inv_diag * (sse / np.maximum(n - P, 1))[:, None]
    ok = ok & np.all(np.isfinite(var) & (var >= 0), axis=1)
    se = np.where(ok[:, None], np.sqrt(np.abs(var)), np.nan)
    se[:, cols] *= p[:, cols]
    return se, ok


def _run_two_sigmoids(x, Y, p0, lo, hi, *, max_iter, ftol, xtol, backend, device):
    """Two sigmoids by the full-parameter solver on numpy or torch (in ln s); p, sse, A [B, P,
    P], n_iter, status."""
    ops, rows, check_every = _batched_ops(backend, device)

    def evaluate(x_, Y_, W_, p_):
        return two_sigmoid_evaluate(ops, x_, Y_, W_, p_)

    parts = []
    x_b = ops.asarray(x)
    for start in range(0, Y.shape[0], rows):
        sl = slice(start, start + rows)
        Y0, W, n = _observed_rows(ops, Y[sl])
        res = levenberg_marquardt(
            ops, evaluate, x_b, Y0, W, ops.asarray(p0[sl]),
            ops.asarray(lo[sl]), ops.asarray(hi[sl]),
            max_iter=max_iter, ftol=ftol, xtol=xtol, check_every=check_every,
        )
        fields = ("p", "sse", "A", "n_iter", "status")
        parts.append({k: ops.to_numpy(getattr(res, k)) for k in fields})
        parts[-1]["n"] = ops.to_numpy(n)
    return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}


def _observed_rows(ops, Y: np.ndarray):
    """A block of host rows (NaN: missing) on the backend's device in one transfer: (Y0 [B, K]
    with 0 at missing points, W [B, K] 1.0 observed / 0.0 not, n [B] observed points). The
    masks are made where the solver runs, not by numpy passes on the host and three
    transfers."""
    Yd = ops.asarray(Y)
    observed = Yd == Yd  # not NaN
    W = ops.cast(observed, Yd)
    return ops.where(observed, Yd, ops.zeros_like(Yd)), W, ops.rowsum(W)


def _batched_ops(backend: str, device: Any):
    """(ops, rows per call, steps between activity checks) of a batched backend."""
    if backend == "numpy":
        return NumpyOps, _NUMPY_ROWS, 1
    ops = TorchOps(device)
    cuda = ops.device.type == "cuda"
    return ops, (_TORCH_CUDA_ROWS if cuda else _TORCH_CPU_ROWS), (4 if cuda else 1)


def _run_projected_sigmoid(x, Y, p0, lo, hi, *, max_iter, ftol, xtol, backend, device,
                           step_max) -> dict[str, np.ndarray]:
    """The sigmoid by variable projection on numpy or torch (as varpro does on numba):
    LM over (mu, ln s) only, then the amplitudes, J^T J and SSE of the full model.

    On CUDA with triton the LM loop runs in one kernel launch per block of rows
    (:mod:`tokdyn.fit.triton_kernels`, chosen by :func:`_fused_sigmoid_solver`)."""
    ops, rows, check_every = _batched_ops(backend, device)
    fused = _fused_sigmoid_solver(ops) if backend == "torch" else None
    x_b = ops.asarray(x)
    parts = []
    for start in range(0, Y.shape[0], rows):
        sl = slice(start, start + rows)
        Y0, W, n = _observed_rows(ops, Y[sl])
        mean_b = ops.rowsum(Y0) / ops.maximum(n, ops.ones_like(n))
        Yc = ops.where(W > 0, Y0 - mean_b[:, None], Y0)  # (Y0 is 0 where W is)
        floor = ops.asarray(lo[sl, 1])  # the least level (linf's bound; l0 shares it)
        th0, lo_b, hi_b = (ops.asarray(a[sl, 2:4]) for a in (p0, lo, hi))
        caps = None if step_max is None else ops.asarray(step_max[sl])
        out = None if fused is None else _fused_solve(
            fused, x_b, Yc, W, th0, lo_b, hi_b,
            ops.full_like(th0, float("inf")) if caps is None else caps, mean_b, floor,
            max_iter=max_iter, ftol=ftol, xtol=xtol, shrink_min=SHRINK_MIN)
        if out is not None:
            th, d, c0 = out["p"], out["d"], out["lin"]
            res = LMResult(**{k: out[k] for k in ("p", "sse", "A", "n_iter", "status")})
        else:
            res = levenberg_marquardt(
                ops,
                lambda x_, Y_, W_, th_, m_, f_: sigmoid_projected(ops, x_, Y_, W_, th_, m_, f_),
                x_b, Yc, W, th0, lo_b, hi_b, max_iter=max_iter, ftol=ftol, xtol=xtol,
                check_every=check_every, step_max=caps, shrink_min=SHRINK_MIN,
                flat_converged=True, row_data=(mean_b, floor),
            )
            th = res.p
            d, c0 = sigmoid_amplitudes(ops, x_b, Yc, W, th, mean_b, floor)
        linf = c0 + mean_b
        q = ops.stack([linf + d, linf, th[:, 0], th[:, 1]], 1)
        sse, A, _ = sigmoid_evaluate(ops, x_b, Y0, W, q)
        fin = ops.isfinite(res.sse)
        nan = ops.full_like(sse, float("nan"))
        parts.append(dict(
            p=ops.to_numpy(ops.where(fin[:, None], q, ops.asarray(p0[sl]))),
            sse=ops.to_numpy(ops.where(fin, sse, nan)), A=ops.to_numpy(A),
            n_iter=ops.to_numpy(res.n_iter), status=ops.to_numpy(res.status),
            n=ops.to_numpy(n),
        ))
    return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}


def _host_kernels(backend: str):
    """The compiled kernels for host-side work: with backend numba, and with torch (whose
    solver runs on the device while start values and summaries are made on the host), when
    numba is installed. The numpy backend stays pure numpy: it is the reference."""
    if backend == "numba" or (backend == "torch" and _has("numba")):
        return load_numba()
    return None


def prepare_rows(x: np.ndarray, Y: np.ndarray, options, backend: str) -> dict[str, np.ndarray]:
    """Per-row summaries (:func:`tokdyn.fit.prepare.prepare`), compiled where possible."""
    kernels = _host_kernels(backend)
    if kernels is None:
        return prepare(x, Y, options)
    with _NUMBA_LOCK:
        values = kernels.prepare_block(
            x, Y, float(options.max_loss), NEGATIVE_TOLERANCE, int(options.edge_points),
            float(s_min_of(x, options)), float(options.s_max_frac), float(options.mu_margin),
            LEVEL_FLOOR,
        )
    return dict(zip(SUMMARY_FIELDS, values))


def inverse_diagonal(A: np.ndarray, backend: str) -> tuple[np.ndarray, np.ndarray]:
    """diag(A^-1) [B, P] for SPD A [B, P, P] via Cholesky, and ok [B] (False: singular)."""
    kernels = _host_kernels(backend)
    if kernels is not None and A.shape[0] > 0:
        with _NUMBA_LOCK:
            return kernels.inverse_diagonal(np.ascontiguousarray(A))
    B, P = A.shape[:2]
    out = np.empty((B, P))
    ok = np.ones(B, dtype=bool)
    for j in range(P):
        e = np.zeros((B, P))
        e[:, j] = 1.0
        col, ok_j = cholesky_solve(NumpyOps, A, e)
        out[:, j] = col[:, j]
        ok &= ok_j
    return np.where(ok[:, None], out, np.nan), ok


def grid_starts(x: np.ndarray, Y: np.ndarray, lo: np.ndarray, hi: np.ndarray, mus: np.ndarray,
                ss: np.ndarray, backend: str) -> np.ndarray:
    """Sigmoid start values [B, 4] from each row's (mu, s) grid
    (:func:`tokdyn.fit.grid.grid_start`), compiled where possible."""
    if _host_kernels(backend) is None:
        return grid_start(x, Y, lo, hi, mus, ss)
    from tokdyn.fit import varpro

    with _NUMBA_LOCK:
        return varpro.grid_start_block(x, Y, lo, hi, mus, ss)


def two_starts(x: np.ndarray, Y: np.ndarray, p1: np.ndarray, lo: np.ndarray, hi: np.ndarray,
               mus: np.ndarray, ss: np.ndarray, backend: str) -> np.ndarray:
    """Two-sigmoid start values [B, 7] from each row's grid (:func:`tokdyn.fit.grid.two_start`),
    compiled where possible."""
    if _host_kernels(backend) is None:
        return two_start(x, Y, p1, lo, hi, mus, ss)
    from tokdyn.fit import varpro

    with _NUMBA_LOCK:
        return varpro.two_start_block(x, Y, np.ascontiguousarray(p1), lo, hi, mus, ss)
