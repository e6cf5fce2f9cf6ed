"""Sums over a trajectory's points in eight explicit lanes (a numba intrinsic).

The kernels are compiled without fastmath so that their bits do not depend on how they were
compiled (see numba_kernels.py). Without reassociation LLVM cannot vectorise a sum: every
``acc += term`` is one chain waiting on its own latency, and a fit evaluation is mostly such
sums (21 of them per point for the sigmoid, 39 for two sigmoids). Here the order of the
additions is itself vectorised, so strict IEEE arithmetic keeps it:

    sum = tree over lanes j of ( sum over blocks b, in order, of term(point 8 b + j) )

with the lanes added pairwise, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). The final
block's lanes past the last point add +0.0. :func:`lane_sums` turns a Python function of the
point's columns and a few scalars, written with ``+``, ``-``, ``*``, ``/`` and :func:`clip`
only, into a numba intrinsic that emits that function once on ``<8 x double>`` vectors: each
term is the same sequence of correctly rounded operations on every lane as it would be on one
point, and the accumulators are vectors. :func:`reference_sums` computes the same sums in numpy in the
same order; the tests require identical bits.

Measured (one core, 100 points, the sigmoid's 21 sums as a loop in numba): 0.59 us as scalar
chains, 0.12 us with fastmath's vectorisation (whose bits depend on the compilation). In
lanes, the whole projected evaluation of the sigmoid (the exponentials and divisions
included) takes 0.53 us against 1.0 us before; see docs/benchmarks.md.

numba caches a compiled kernel keyed on its own source file only: after editing this module
(or a terms function's helpers in another one), delete ``tokdyn/fit/__pycache__`` so the
kernels that inline these intrinsics are compiled again.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

__all__ = ["LANES", "clip", "lane_maxima", "lane_sums", "reference_sums"]

LANES = 8

_DOUBLE = ir.DoubleType()
_VEC = ir.VectorType(_DOUBLE, LANES)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _binary(name: str):
    """The operator and its reflection for one IR instruction (``fadd``, ``fsub``, ...)."""

    def op(self, o):
        return self._op(name, self.value, self._operand(o))

    def rop(self, o):
        return self._op(name, self._operand(o), self.value)

    return op, rop


class _Lanes:
    """One value on all eight lanes while the terms are emitted: +, -, * and / with each other
    or with Python numbers (broadcast), as IEEE operations without fast-math flags."""

    __slots__ = ("builder", "value")

    def __init__(self, builder: ir.IRBuilder, value: ir.Value) -> None:
        self.builder, self.value = builder, value

    def _operand(self, other) -> ir.Value:
        if isinstance(other, _Lanes):
            return other.value
        if isinstance(other, (int, float)):
            return _constant(self.value.type, other)
        return NotImplemented

    def _op(self, name: str, a, b):
        if a is NotImplemented or b is NotImplemented:
            return NotImplemented
        return _Lanes(self.builder, getattr(self.builder, name)(a, b))

    __add__, __radd__ = _binary("fadd")
    __sub__, __rsub__ = _binary("fsub")
    __mul__, __rmul__ = _binary("fmul")
    __truediv__, __rtruediv__ = _binary("fdiv")


def clip(v, lo: float, hi: float):
    """v limited to [lo, hi] (lo where v < lo, hi where v > hi, else v) on lanes or numpy
    arrays; the same bits either way (NaN passes through)."""
    if isinstance(v, _Lanes):
        b = v.builder
        lo_v, hi_v = v._operand(lo), v._operand(hi)
        w = b.select(b.fcmp_ordered(">", v.value, hi_v), hi_v, v.value)
        return _Lanes(b, b.select(b.fcmp_ordered("<", v.value, lo_v), lo_v, w))
    v = np.asarray(v, dtype=np.float64)
    return np.where(v < lo, lo, np.where(v > hi, hi, v))


def _constant(ty: ir.VectorType, value: float) -> ir.Constant:
    return ir.Constant(ty, [float(value)] * ty.count)


def _count_terms(terms: Callable, n_columns: int, n_scalars: int) -> int:
    out = terms(*[np.zeros(LANES)] * n_columns, *[0.0] * n_scalars)
    if not isinstance(out, tuple) or not out:
        raise TypeError(f"{terms.__name__} must return a non-empty tuple of terms")
    return len(out)


def _splat(builder: ir.IRBuilder, scalar: ir.Value, ty: ir.VectorType) -> ir.Value:
    v = builder.insert_element(ir.Constant(ty, ir.Undefined), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(ty, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, ty.count), [0] * ty.count))


# Blocks per step of the main loop: the terms of two consecutive blocks are emitted as one
# 16-wide vector, so the long dependency chains (the exponential is ~30 operations in a row)
# of two blocks interleave; each half is then added to the accumulators in block order.
_UNROLL = 2


def lane_sums(terms: Callable, n_columns: int, n_scalars: int, n_outputs: int = 0):
    """A numba intrinsic ``f(col_1 .. col_C, out_1 .. out_O, scalar_1 .. scalar_S, n)``
    returning the tuple of sums over points k < n of ``terms(col_1[k], .., col_C[k],
    scalar_1, .., scalar_S)``.

    ``terms`` returns a tuple of expressions built with +, -, *, / and :func:`clip` (and
    number constants); columns are 1-D C-contiguous float64 arrays with at least n entries,
    scalars float64. The first ``n_outputs`` expressions are not summed but written to the
    output arrays (1-D, C-contiguous, at least n entries; out_i[k] for k < n, nothing past):
    columns a later pass reads instead of computing them again.
    """
    return _lane_reduction(terms, n_columns, n_scalars, "sum", n_outputs=n_outputs)


def lane_maxima(terms: Callable, n_columns: int, n_scalars: int):
    """As :func:`lane_sums`, the maximum of each term over k < n instead of its sum (-inf for
    n = 0; NaN terms are passed over), and one more argument after n: ``row``, the row a 2-D
    (C-contiguous) column is read from (1-D columns are read whole). A maximum does not depend
    on the order it is taken in, so these are exactly a scalar loop's maxima."""
    return _lane_reduction(terms, n_columns, n_scalars, "max", rows=True)


_START = {"sum": 0.0, "max": -math.inf}


def _combine(builder: ir.IRBuilder, kind: str, acc: ir.Value, v: ir.Value) -> ir.Value:
    """acc + v, or v where v > acc (else acc: NaN never replaces it)."""
    if kind == "sum":
        return builder.fadd(acc, v)
    return builder.select(builder.fcmp_ordered(">", v, acc), v, acc)


def _lane_reduction(terms: Callable, n_columns: int, n_scalars: int, kind: str,
                    rows: bool = False, n_outputs: int = 0):
    n_sums = _count_terms(terms, n_columns, n_scalars) - n_outputs
    if n_sums < 1:
        raise TypeError(f"{terms.__name__} must return more than its {n_outputs} outputs")
    n_arrays = n_columns + n_outputs
    n_args = n_arrays + n_scalars + (2 if rows else 1)
    dims = (1, 2) if rows else (1,)

    def typer(typingctx, *args):
        for i, a in enumerate(args[n_columns:n_arrays]):
            if not (isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.float64
                    and a.layout == "C" and a.mutable):
                raise TypingError(f"{terms.__name__}: output {i} must be a writable 1-D "
                                  f"C-contiguous float64 array, got {a}")
        for i, a in enumerate(args[:n_columns]):
            if not (isinstance(a, types.Array) and a.ndim in dims and a.dtype == types.float64
                    and a.layout == "C"):
                raise TypingError(f"{terms.__name__}: column {i} must be a "
                                  f"{' or '.join(f'{d}-D' for d in dims)} C-contiguous float64 "
                                  f"array, got {a}")
        for a in args[n_arrays:n_arrays + n_scalars]:
            if not isinstance(a, types.Float):
                raise TypingError(f"{terms.__name__}: scalars must be floats, got {a}")
        for a in args[n_arrays + n_scalars:]:
            if not isinstance(a, types.Integer):
                raise TypingError(f"{terms.__name__}: n (and row) must be integers, got {a}")
        sig = types.UniTuple(types.float64, n_sums)(*args)

        def codegen(context, builder, sig, llargs):
            i_n = n_arrays + n_scalars
            outs = [context.make_array(sig.args[i])(context, builder, llargs[i]).data
                    for i in range(n_columns, n_arrays)]
            cols = []
            for i in range(n_columns):
                arr = context.make_array(sig.args[i])(context, builder, llargs[i])
                ptr = arr.data
                if sig.args[i].ndim == 2:  # row ``row`` of a C-contiguous matrix
                    row = context.cast(builder, llargs[i_n + 1], sig.args[i_n + 1], types.int64)
                    width = cgutils.unpack_tuple(builder, arr.shape, 2)[1]
                    ptr = builder.gep(ptr, [builder.mul(row, width)])
                cols.append(ptr)
            scalars = [context.cast(builder, llargs[n_arrays + i], sig.args[n_arrays + i],
                                    types.float64) for i in range(n_scalars)]
            n = context.cast(builder, llargs[i_n], sig.args[i_n], types.int64)
            n = builder.select(builder.icmp_signed("<", n, ir.Constant(_I64, 0)),
                               ir.Constant(_I64, 0), n)
            start = _constant(_VEC, _START[kind])
            accs = [cgutils.alloca_once_value(builder, start) for _ in range(n_sums)]

            def emit(vectors):
                """The terms on vectors of LANES * m points (m blocks side by side)."""
                ty = vectors[0].type
                out = terms(*[_Lanes(builder, v) for v in vectors],
                            *[_Lanes(builder, _splat(builder, s, ty)) for s in scalars])
                return [t.value if isinstance(t, _Lanes) else _constant(ty, t) for t in out]

            def add(values, block, mask=None):
                """Add block ``block`` of each summed term's vector to the accumulators."""
                for acc, v in zip(accs, values[n_outputs:]):
                    if v.type.count > LANES:
                        v = builder.shuffle_vector(v, v, ir.Constant(
                            ir.VectorType(_I32, LANES),
                            list(range(block * LANES, (block + 1) * LANES))))
                    if mask is not None:
                        v = builder.select(mask, v, start)
                    builder.store(_combine(builder, kind, builder.load(acc), v), acc)

            def load(k0, width):
                ty = ir.VectorType(_DOUBLE, width)
                return [builder.load(builder.bitcast(builder.gep(p, [k0]), ty.as_pointer()),
                                     align=8) for p in cols]

            def store(values, k0):
                for p, v in zip(outs, values[:n_outputs]):
                    builder.store(v, builder.bitcast(builder.gep(p, [k0]), v.type.as_pointer()),
                                  align=8)

            step = ir.Constant(_I64, LANES * _UNROLL)
            n_steps = builder.sdiv(n, step)
            with cgutils.for_range(builder, n_steps) as loop:
                k = builder.mul(loop.index, step)
                values = emit(load(k, LANES * _UNROLL))
                store(values, k)
                for block in range(_UNROLL):
                    add(values, block)
            k0 = builder.mul(n_steps, step)
            lanes = ir.Constant(_I64, LANES)
            n_blocks = builder.sdiv(builder.sub(n, k0), lanes)  # whole blocks left (< _UNROLL)
            with cgutils.for_range(builder, n_blocks) as loop:
                k = builder.add(k0, builder.mul(loop.index, lanes))
                values = emit(load(k, LANES))
                store(values, k)
                add(values, 0)
            k0 = builder.add(k0, builder.mul(n_blocks, lanes))
            left = builder.sub(n, k0)
            with builder.if_then(builder.icmp_signed(">", left, ir.Constant(_I64, 0))):
                # the last points: lane j reads point min(k0 + j, n - 1) (no read past n), the
                # lanes past n are masked out of the sums, and their outputs (those of point
                # n - 1 again) are written to it again
                last = builder.sub(left, ir.Constant(_I64, 1))
                points = []
                for j in range(LANES):
                    jj = ir.Constant(_I64, j)
                    points.append(builder.add(k0, builder.select(
                        builder.icmp_signed("<", jj, last), jj, last)))
                vectors = []
                for p in cols:
                    v = ir.Constant(_VEC, ir.Undefined)
                    for j, k in enumerate(points):
                        v = builder.insert_element(v, builder.load(builder.gep(p, [k])),
                                                   ir.Constant(_I32, j))
                    vectors.append(v)
                lane_index = ir.Constant(ir.VectorType(_I64, LANES), list(range(LANES)))
                mask = builder.icmp_signed("<", lane_index,
                                           _splat(builder, left, ir.VectorType(_I64, LANES)))
                values = emit(vectors)
                for p, v in zip(outs, values[:n_outputs]):
                    for j, k in enumerate(points):
                        builder.store(builder.extract_element(v, ir.Constant(_I32, j)),
                                      builder.gep(p, [k]))
                add(values, 0, mask)
            sums = []
            for acc in accs:
                v = builder.load(acc)
                e = [builder.extract_element(v, ir.Constant(_I32, j)) for j in range(LANES)]
                while len(e) > 1:
                    e = [_combine(builder, kind, e[i], e[i + 1]) for i in range(0, len(e), 2)]
                sums.append(e[0])
            return context.make_tuple(builder, sig.return_type, sums)

        return sig, codegen

    # numba's intrinsic needs a fixed arity (no *args)
    names = ", ".join(f"a{i}" for i in range(n_args))
    space = {"typer": typer}
    exec(f"def {terms.__name__}_{kind}(typingctx, {names}):\n"
         f"    return typer(typingctx, {names})\n", space)
    fn = space[f"{terms.__name__}_{kind}"]
    fn.__doc__ = f"Lane {kind} of {terms.__name__} (tokdyn.fit.lanes)."
    return intrinsic(fn)


def reference_sums(terms: Callable, columns: Sequence[np.ndarray], scalars: Sequence[float],
                   n: int, kind: str = "sum", n_outputs: int = 0) -> tuple[float, ...]:
    """The sums (``kind`` "max": the maxima) that :func:`lane_sums` (:func:`lane_maxima`)
    computes, in numpy, in the same order (for tests); the first ``n_outputs`` terms are
    outputs, not sums, and left out."""
    values = terms(*[np.asarray(c, dtype=np.float64)[:n] for c in columns],
                   *[float(s) for s in scalars])[n_outputs:]
    start = _START[kind]

    def combine(acc, v):
        return acc + v if kind == "sum" else np.where(v > acc, v, acc)

    n_blocks = -(-n // LANES)
    out = []
    for t in values:
        padded = np.full(n_blocks * LANES, start)
        padded[:n] = t
        acc = np.full(LANES, start)
        for b in range(n_blocks):
            acc = combine(acc, padded[b * LANES:(b + 1) * LANES])
        e = list(acc)
        while len(e) > 1:
            e = [float(combine(e[i], e[i + 1])) for i in range(0, len(e), 2)]
        out.append(float(e[0]))
    return tuple(out)
