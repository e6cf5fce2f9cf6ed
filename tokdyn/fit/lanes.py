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
point, and the accumulators are vectors.

Fused multiply-adds, by rule rather than by the compiler's choice: in a summed function a
product that is an operand of ``+`` or ``-`` is not rounded on its own, the two make one
fused multiply-add (``llvm.fma``: one rounding on every CPU, libm's correctly rounded
``fma`` where there is no FMA unit); of two products added, the left one is fused. A term
that is a product is added to its accumulator the same way (acc = fma(a, b, acc)). A product
used in any other way is rounded. So Horner's steps in the exponential and most sums cost
one instruction instead of two: the sigmoid's projected evaluation 0.67 -> 0.41 us, the
two-sigmoid one 1.1 -> 0.97 us (docs/benchmarks.md). Maxima (:func:`lane_maxima`) are not
fused: the two-sigmoid start compares them with a scalar computation of the same form.

:func:`reference_sums` and :func:`reference_terms` compute the same values in numpy with the
same roundings in the same order (:func:`fma_exact` for the fused ones); the tests require
identical bits, and check the fusion against hand-computed values.

:func:`row_dots` is the other way round: many sums at once, each over the same chosen rows
of a matrix (the start grids' covariances of a row with 80 grid events). There the lanes are
the matrix's columns, each one plain chain in row order (no fusion: the bits of a scalar
loop), held in registers over the rows.

numba caches a compiled kernel keyed on its own source file only: after editing this module
(or a terms function's helpers in another one), delete ``tokdyn/fit/__pycache__`` so the
kernels that inline these intrinsics are compiled again.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

__all__ = ["LANES", "clip", "fma_exact", "lane_maxima", "lane_sums", "reference_sums",
           "reference_terms", "row_dots", "rows_dots", "reference_row_dots"]

LANES = 8

_DOUBLE = ir.DoubleType()
_VEC = ir.VectorType(_DOUBLE, LANES)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


class _IROps:
    """The operations of traced terms on LLVM vectors: IEEE instructions without fast-math
    flags, and ``llvm.fma`` (one rounding, whatever the CPU: where it has no FMA unit LLVM
    calls libm's correctly rounded ``fma``)."""

    def __init__(self, builder: ir.IRBuilder) -> None:
        self.b = builder

    def const(self, like: ir.Value, value: float) -> ir.Value:
        return _constant(like.type, value)

    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def neg(self, a):
        return self.b.fneg(a)

    def fma(self, a, b, c):
        return _fma(self.b, a, b, c)

    def clip(self, v, lo, hi):
        b = self.b
        w = b.select(b.fcmp_ordered(">", v, hi), hi, v)
        return b.select(b.fcmp_ordered("<", v, lo), lo, w)


class _NumpyOps:
    """The same operations on numpy arrays, for :func:`reference_sums` (fma exactly rounded:
    :func:`fma_exact`)."""

    @staticmethod
    def const(like, value: float):
        return np.float64(value)

    add, sub, mul, div, neg = np.add, np.subtract, np.multiply, np.divide, np.negative

    @staticmethod
    def fma(a, b, c):
        return fma_exact(a, b, c)

    @staticmethod
    def clip(v, lo, hi):
        return np.where(v < lo, lo, np.where(v > hi, hi, v))


class _Term:
    """One value of a terms function while it is traced (on LLVM vectors, or on numpy arrays
    for the reference): +, -, * and / with each other or with Python numbers. With ``fuse``,
    a product stays unrounded until it is used: as an operand of + or - it makes one fused
    multiply-add (the left operand's product first where both are products), anywhere else
    it is rounded once."""

    __slots__ = ("ops", "fuse", "_value", "factors")

    def __init__(self, ops, fuse: bool, value=None, factors=None) -> None:
        self.ops, self.fuse, self._value, self.factors = ops, fuse, value, factors

    @property
    def value(self):
        if self._value is None:
            self._value = self.ops.mul(*self.factors)
        return self._value

    def _term(self, other):
        if isinstance(other, _Term):
            return other
        if isinstance(other, (int, float)):
            return _Term(self.ops, self.fuse, self.ops.const(self.value, other))
        return NotImplemented

    def _new(self, value=None, factors=None) -> "_Term":
        return _Term(self.ops, self.fuse, value, factors)

    def _product(self, a: "_Term", b: "_Term") -> "_Term":
        if self.fuse:
            return self._new(factors=(a.value, b.value))
        return self._new(self.ops.mul(a.value, b.value))

    def _add(self, a: "_Term", b: "_Term", subtract: bool) -> "_Term":
        ops = self.ops
        if a.factors is not None:  # a0 a1 +- b
            c = b.value
            return self._new(ops.fma(*a.factors, ops.neg(c) if subtract else c))
        if b.factors is not None:  # a +- b0 b1
            b0, b1 = b.factors
            return self._new(ops.fma(ops.neg(b0) if subtract else b0, b1, a.value))
        return self._new((ops.sub if subtract else ops.add)(a.value, b.value))

    def _binary(self, other, reflected: bool, fn):
        o = self._term(other)
        if o is NotImplemented:
            return NotImplemented
        return fn(o, self) if reflected else fn(self, o)

    def __add__(self, o):
        return self._binary(o, False, lambda a, b: self._add(a, b, False))

    def __radd__(self, o):
        return self._binary(o, True, lambda a, b: self._add(a, b, False))

    def __sub__(self, o):
        return self._binary(o, False, lambda a, b: self._add(a, b, True))

    def __rsub__(self, o):
        return self._binary(o, True, lambda a, b: self._add(a, b, True))

    def __mul__(self, o):
        return self._binary(o, False, self._product)

    def __rmul__(self, o):
        return self._binary(o, True, self._product)

    def __truediv__(self, o):
        return self._binary(o, False, lambda a, b: self._new(self.ops.div(a.value, b.value)))

    def __rtruediv__(self, o):
        return self._binary(o, True, lambda a, b: self._new(self.ops.div(a.value, b.value)))


def clip(v, lo: float, hi: float):
    """v limited to [lo, hi] (lo where v < lo, hi where v > hi, else v) on traced terms or
    numpy arrays; the same bits either way (NaN passes through)."""
    if isinstance(v, _Term):
        x = v.value
        return v._new(v.ops.clip(x, v.ops.const(x, lo), v.ops.const(x, hi)))
    return _NumpyOps.clip(np.asarray(v, dtype=np.float64), lo, hi)


def _fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a b + c rounded once (``llvm.fma`` on vectors of doubles)."""
    ty = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty, ty]),
                                        f"llvm.fma.v{ty.count}f64")
    return builder.call(fn, [a, b, c])


_SPLITTER = 134217729.0  # 2^27 + 1: Veltkamp's split of a double into two 26-bit halves


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = _SPLITTER * a
    hi = t - (t - a)
    return hi, a - hi


def fma_exact(a, b, c) -> np.ndarray:
    """a b + c rounded once, elementwise, in numpy (which has no fma): the product exactly as
    p + e (Dekker's product of Veltkamp's halves), then math.fsum's correctly rounded sum of
    p, e and c. Where a value is not finite or near overflow, the plain a b + c (both agree
    there up to the overflow's edge, which the fit's terms never reach)."""
    a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (a, b, c)))
    p = a * b
    (ah, al), (bh, bl) = _split(a), _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    ok = np.isfinite(p) & np.isfinite(e) & np.isfinite(c) & (np.abs(p) < 1e300) \
        & (np.abs(c) < 1e300) & (np.abs(a) < 1e290) & (np.abs(b) < 1e290)
    out = p + c
    # a product near underflow is not split exactly: there, exact rationals
    tiny = ok & (np.abs(p) < 1e-280) & (a != 0) & (b != 0)
    ok &= ~tiny
    if ok.any():
        out[ok] = [math.fsum(t) for t in zip(p[ok].tolist(), e[ok].tolist(), c[ok].tolist())]
    if tiny.any():
        out[tiny] = [float(Fraction(x) * Fraction(y) + Fraction(z))
                     for x, y, z in zip(a[tiny].tolist(), b[tiny].tolist(), c[tiny].tolist())]
    return out


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


# Blocks per step of the main loop (default): the terms of two consecutive blocks are
# emitted as one 16-wide vector, so the long dependency chains (the exponential is ~30
# operations in a row) of two blocks interleave; each half is then added to the accumulators
# in block order. With ``unroll`` 4 the blocks left go two at a time, then one. The sums'
# order is the blocks' order whatever the width: the bits do not depend on it, only the
# speed (registers against interleaving: docs/benchmarks.md).
_UNROLL = 2


def lane_sums(terms: Callable, n_columns: int, n_scalars: int, n_outputs: int = 0,
              unroll: int = _UNROLL):
    """A numba intrinsic ``f(col_1 .. col_C, out_1 .. out_O, scalar_1 .. scalar_S, n)``
    returning the tuple of sums over points k < n of ``terms(col_1[k], .., col_C[k],
    scalar_1, .., scalar_S)``.

    ``terms`` returns a tuple of expressions built with +, -, *, / and :func:`clip` (and
    number constants); columns are 1-D C-contiguous float64 arrays with at least n entries,
    scalars float64. The first ``n_outputs`` expressions are not summed but written to the
    output arrays (1-D, C-contiguous, at least n entries; out_i[k] for k < n, nothing past):
    columns a later pass reads instead of computing them again. ``unroll`` (1, 2, 4, ...):
    blocks of 8 points per step of the main loop (the speed only, not the bits).
    """
    return _lane_reduction(terms, n_columns, n_scalars, "sum", n_outputs=n_outputs,
                           unroll=unroll)


def lane_maxima(terms: Callable, n_columns: int, n_scalars: int):
    """As :func:`lane_sums`, the maximum of each term over k < n instead of its sum (-inf for
    n = 0; NaN terms are passed over), and one more argument after n: ``row``, the row a 2-D
    (C-contiguous) column is read from (1-D columns are read whole). A maximum does not depend
    on the order it is taken in, so these are exactly a scalar loop's maxima."""
    return _lane_reduction(terms, n_columns, n_scalars, "max", rows=True)


_START = {"sum": 0.0, "max": -math.inf}


def _require_array(what: str, a, dims: tuple[int, ...], dtype=types.float64,
                   writable: bool = False) -> None:
    """Raise numba's TypingError unless ``a`` is a C-contiguous array of ``dtype`` with one of
    the dimensions ``dims`` (and writable where asked)."""
    if not (isinstance(a, types.Array) and a.ndim in dims and a.dtype == dtype
            and a.layout == "C" and (a.mutable or not writable)):
        raise TypingError(f"{what} must be a {'writable ' if writable else ''}"
                          f"{' or '.join(f'{d}-D' for d in dims)} C-contiguous {dtype} array, "
                          f"got {a}")


def _combine(builder: ir.IRBuilder, kind: str, acc: ir.Value, v: ir.Value) -> ir.Value:
    """acc + v, or v where v > acc (else acc: NaN never replaces it)."""
    if kind == "sum":
        return builder.fadd(acc, v)
    return builder.select(builder.fcmp_ordered(">", v, acc), v, acc)


def _lane_reduction(terms: Callable, n_columns: int, n_scalars: int, kind: str,
                    rows: bool = False, n_outputs: int = 0, unroll: int = _UNROLL):
    if unroll < 1 or unroll & (unroll - 1):
        raise ValueError(f"unroll must be a power of 2, got {unroll}")
    fuse = kind == "sum"  # maxima are compared with scalar code (varpro._pair_form): no fma
    n_sums = _count_terms(terms, n_columns, n_scalars) - n_outputs
    if n_sums < 1:
        raise TypeError(f"{terms.__name__} must return more than its {n_outputs} outputs")
    n_arrays = n_columns + n_outputs
    n_args = n_arrays + n_scalars + (2 if rows else 1)
    dims = (1, 2) if rows else (1,)

    def typer(typingctx, *args):
        for i, a in enumerate(args[n_columns:n_arrays]):
            _require_array(f"{terms.__name__}: output {i}", a, (1,), writable=True)
        for i, a in enumerate(args[:n_columns]):
            _require_array(f"{terms.__name__}: column {i}", a, dims)
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

            ir_ops = _IROps(builder)

            def emit(vectors):
                """The terms on vectors of LANES * m points (m blocks side by side): outputs
                as values, summed terms as values or, where fused, as their two factors."""
                ty = vectors[0].type
                out = terms(*[_Term(ir_ops, fuse, v) for v in vectors],
                            *[_Term(ir_ops, fuse, _splat(builder, s, ty)) for s in scalars])
                values = []
                for i, t in enumerate(out):
                    if not isinstance(t, _Term):
                        values.append(_constant(ty, t))
                    elif t.factors is not None and i >= n_outputs:
                        values.append(t.factors)
                    else:
                        values.append(t.value)
                return values

            def add(values, block, mask=None):
                """Add block ``block`` of each summed term to the accumulators (a product
                by one fused multiply-add; masked lanes add 0 x 0)."""

                def part(v):
                    if v.type.count > LANES:
                        v = builder.shuffle_vector(v, v, ir.Constant(
                            ir.VectorType(_I32, LANES),
                            list(range(block * LANES, (block + 1) * LANES))))
                    return v if mask is None else builder.select(mask, v, start)

                for acc, v in zip(accs, values[n_outputs:]):
                    if isinstance(v, tuple):
                        new = _fma(builder, part(v[0]), part(v[1]), builder.load(acc))
                    else:
                        new = _combine(builder, kind, builder.load(acc), part(v))
                    builder.store(new, acc)

            def load(k0, width):
                ty = ir.VectorType(_DOUBLE, width)
                return [builder.load(builder.bitcast(builder.gep(p, [k0]), ty.as_pointer()),
                                     align=8) for p in cols]

            def store(values, k0):
                for p, v in zip(outs, values[:n_outputs]):
                    builder.store(v, builder.bitcast(builder.gep(p, [k0]), v.type.as_pointer()),
                                  align=8)

            # whole blocks, ``unroll`` at a time, then halving widths down to one block
            k0 = ir.Constant(_I64, 0)
            width = unroll
            while width >= 1:
                step = ir.Constant(_I64, LANES * width)
                n_steps = builder.sdiv(builder.sub(n, k0), step)
                with cgutils.for_range(builder, n_steps) as loop:
                    k = builder.add(k0, builder.mul(loop.index, step))
                    values = emit(load(k, LANES * width))
                    store(values, k)
                    for block in range(width):
                        add(values, block)
                k0 = builder.add(k0, builder.mul(n_steps, step))
                width //= 2
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


# Vectors of columns per pass of row_dots: five chains of 8 columns in flight hide an
# addition's latency behind the loads and products of the others (the default grid's 80
# events in two passes; 4, 8 and 10 measured no better).
_DOT_VECTORS = 5
# Rows of V per pass of rows_dots, and vectors of columns per pass there: each vector of M's
# columns, once loaded, is multiplied into this many rows' chains. M comes from the
# second-level cache (the default grid's events over 200 points are 128 kB), and row_dots
# waits on those loads (one product and sum per 64 bytes read). Four rows of four vectors (16
# chains, in registers with their four loads): about 3x row_dots at 100 and 200 points, as
# fast as any shape tried (docs/benchmarks.md).
_DOT_ROWS = 4
_ROWS_DOT_VECTORS = 4


def _emit_dots(context, builder, M, idx, n, rows, outs, vectors):
    """The loops of row_dots and rows_dots: ``rows`` points to each v's first point (a
    compile-time count of them), ``outs`` to the outputs, one per product with a v, then two
    for the moments (sum g, sum g^2) where there are more outputs than rows. The chains run
    over M's columns in passes of ``vectors`` vectors, then a shorter pass and single
    columns."""
    width = cgutils.unpack_tuple(builder, M.shape, 2)[1]
    base = M.data
    n_ = builder.select(builder.icmp_signed("<", n, ir.Constant(_I64, 0)),
                        ir.Constant(_I64, 0), n)

    def group(q0, ty, m, rows, outs):
        """Columns q0 .. q0 + m * lanes(ty) - 1 of every output: chains in registers."""
        vector = isinstance(ty, ir.VectorType)
        step = ty.count if vector else 1
        zero = _constant(ty, 0.0) if vector else ir.Constant(ty, 0.0)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(m)] for _ in outs]
        with cgutils.for_range(builder, n_) as loop:
            r = builder.load(builder.gep(idx, [loop.index]))
            row = builder.gep(base, [builder.add(builder.mul(r, width), q0)])
            vks = []
            for vrow in rows:
                vk = builder.load(builder.gep(vrow, [loop.index]))
                vks.append(_splat(builder, vk, ty) if vector else vk)
            for j in range(m):
                ptr = builder.gep(row, [ir.Constant(_I64, j * step)])
                if vector:
                    ptr = builder.bitcast(ptr, ty.as_pointer())
                g = builder.load(ptr, align=8)
                terms = [builder.fmul(g, vk) for vk in vks]
                if len(outs) > len(rows):  # the moments: sum g, sum g^2
                    terms += [g, builder.fmul(g, g)]
                for acc, t in zip(accs, terms):
                    builder.store(builder.fadd(builder.load(acc[j]), t), acc[j])
        for out, acc in zip(outs, accs):
            for j in range(m):
                ptr = builder.gep(out, [builder.add(q0, ir.Constant(_I64, j * step))])
                if vector:
                    ptr = builder.bitcast(ptr, ty.as_pointer())
                builder.store(builder.load(acc[j]), ptr, align=8)

    lanes = ir.Constant(_I64, LANES)
    span = ir.Constant(_I64, LANES * vectors)
    n_groups = builder.sdiv(width, span)
    with cgutils.for_range(builder, n_groups) as loop:
        group(builder.mul(loop.index, span), _VEC, vectors, rows, outs)
    q0 = builder.mul(n_groups, span)
    # the columns left: whole vectors in one group, then single columns
    left_vecs = builder.sdiv(builder.sub(width, q0), lanes)
    for m in range(1, vectors):
        with builder.if_then(builder.icmp_signed("==", left_vecs, ir.Constant(_I64, m))):
            group(q0, _VEC, m, rows, outs)
    q0 = builder.add(q0, builder.mul(left_vecs, lanes))
    with cgutils.for_range(builder, builder.sub(width, q0)) as loop:
        group(builder.add(q0, loop.index), _DOUBLE, 1, rows, outs)


@intrinsic
def row_dots(typingctx, M, idx, v, n, c, s1, s2):
    """``row_dots(M, idx, v, n, c, s1, s2)`` (a numba intrinsic): for every column q of
    M [R, Q], c[q] = sum over k < n, in order, of M[idx[k], q] * v[k], each product rounded
    and then added, as the plain loop ``for k: c[q] += M[idx[k], q] * v[k]`` adds it; where
    s1, s2 are arrays (not None) also s1[q] = sum M[idx[k], q] and s2[q] = sum M[idx[k], q]^2
    the same way.

    The columns run in vector lanes, each its own chain over the rows kept in registers (five
    vectors of eight columns at a time), so the bits are a scalar loop's.
    """
    moments = not isinstance(s1, types.NoneType)
    if moments == isinstance(s2, types.NoneType):
        raise TypingError("row_dots: s1 and s2 are both arrays or both None")
    _require_array("row_dots: M", M, (2,))
    _require_array("row_dots: idx", idx, (1,), types.int64)
    _require_array("row_dots: v", v, (1,))
    if not isinstance(n, types.Integer):
        raise TypingError(f"row_dots: n must be an integer, got {n}")
    for name, a in (("c", c), ("s1", s1), ("s2", s2)) if moments else (("c", c),):
        _require_array(f"row_dots: {name}", a, (1,), writable=True)
    sig = types.none(M, idx, v, n, c, s1, s2)

    def codegen(context, builder, sig, llargs):
        data = [context.make_array(sig.args[i])(context, builder, llargs[i]).data
                for i in ((1, 2, 4, 5, 6) if moments else (1, 2, 4))]
        _emit_dots(context, builder, context.make_array(sig.args[0])(context, builder, llargs[0]),
                   data[0], context.cast(builder, llargs[3], sig.args[3], types.int64),
                   [data[1]], data[2:], _DOT_VECTORS)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def rows_dots(typingctx, M, idx, V, m, n, C):
    """``rows_dots(M, idx, V, m, n, C)`` (a numba intrinsic): :func:`row_dots` of each of the
    first m rows of V [R, K] into the same row of C [R, Q] (the caller keeps m <= R and both
    arrays wide enough): C[r, q] = sum over k < n, in order, of M[idx[k], q] * V[r, k], the
    bits of ``row_dots(M, idx, V[r], n, C[r], None, None)``.

    Rows run in passes of four: each vector of M loaded is multiplied into four rows' chains,
    so M is read once per four rows (row_dots is bound by reading it). The caller's rows share
    idx and n: a block's fully observed rows.
    """
    _require_array("rows_dots: M", M, (2,))
    _require_array("rows_dots: idx", idx, (1,), types.int64)
    _require_array("rows_dots: V", V, (2,))
    _require_array("rows_dots: C", C, (2,), writable=True)
    for name, a in (("m", m), ("n", n)):
        if not isinstance(a, types.Integer):
            raise TypingError(f"rows_dots: {name} must be an integer, got {a}")
    sig = types.none(M, idx, V, m, n, C)

    def codegen(context, builder, sig, llargs):
        Marr = context.make_array(sig.args[0])(context, builder, llargs[0])
        rows = context.make_array(sig.args[1])(context, builder, llargs[1]).data
        Varr = context.make_array(sig.args[2])(context, builder, llargs[2])
        Carr = context.make_array(sig.args[5])(context, builder, llargs[5])
        v_width = cgutils.unpack_tuple(builder, Varr.shape, 2)[1]
        c_width = cgutils.unpack_tuple(builder, Carr.shape, 2)[1]
        m_ = context.cast(builder, llargs[3], sig.args[3], types.int64)
        n_ = context.cast(builder, llargs[4], sig.args[4], types.int64)
        m_ = builder.select(builder.icmp_signed("<", m_, ir.Constant(_I64, 0)),
                            ir.Constant(_I64, 0), m_)

        def emit(r0, count):
            vrows = [builder.gep(Varr.data, [builder.mul(builder.add(
                r0, ir.Constant(_I64, r)), v_width)]) for r in range(count)]
            crows = [builder.gep(Carr.data, [builder.mul(builder.add(
                r0, ir.Constant(_I64, r)), c_width)]) for r in range(count)]
            _emit_dots(context, builder, Marr, rows, n_, vrows, crows, _ROWS_DOT_VECTORS)

        per = ir.Constant(_I64, _DOT_ROWS)
        passes = builder.sdiv(m_, per)
        with cgutils.for_range(builder, passes) as loop:
            emit(builder.mul(loop.index, per), _DOT_ROWS)
        r0 = builder.mul(passes, per)
        left = builder.sub(m_, r0)
        for count in range(1, _DOT_ROWS):
            with builder.if_then(builder.icmp_signed("==", left, ir.Constant(_I64, count))):
                emit(r0, count)
        return context.get_dummy_value()

    return sig, codegen


def reference_row_dots(M: np.ndarray, idx: np.ndarray, v: np.ndarray, n: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(c, s1, s2) of :func:`row_dots` in numpy, in the same order with the same roundings."""
    M = np.asarray(M, dtype=np.float64)
    c = np.zeros(M.shape[1])
    s1 = np.zeros(M.shape[1])
    s2 = np.zeros(M.shape[1])
    for k in range(max(n, 0)):
        g = M[idx[k]]
        c = c + g * v[k]
        s1 = s1 + g
        s2 = s2 + g * g
    return c, s1, s2


def _traced(terms: Callable, columns: Sequence[np.ndarray], scalars: Sequence[float], n: int,
            fuse: bool) -> list:
    """``terms`` traced on numpy arrays (the first n points of each column) as the lanes
    trace it: _Term values (unrounded products included) or plain numbers."""
    ops = _NumpyOps()
    return list(terms(*[_Term(ops, fuse, np.asarray(c, dtype=np.float64)[:n]) for c in columns],
                      *[_Term(ops, fuse, np.float64(s)) for s in scalars]))


def reference_terms(terms: Callable, columns: Sequence[np.ndarray], scalars: Sequence[float],
                    n: int, fuse: bool = True) -> list[np.ndarray]:
    """Each term of ``terms`` at the first n points, in numpy, rounded as :func:`lane_sums`
    rounds it (``fuse``; :func:`lane_maxima`: False), as arrays [n]: what the outputs hold."""
    return [np.broadcast_to(np.asarray(t.value if isinstance(t, _Term) else t, np.float64),
                            (n,)).copy() for t in _traced(terms, columns, scalars, n, fuse)]


def reference_sums(terms: Callable, columns: Sequence[np.ndarray], scalars: Sequence[float],
                   n: int, kind: str = "sum", n_outputs: int = 0) -> tuple[float, ...]:
    """The sums (``kind`` "max": the maxima) that :func:`lane_sums` (:func:`lane_maxima`)
    computes, in numpy, with the same roundings in the same order (for tests); the first
    ``n_outputs`` terms are outputs, not sums, and left out."""
    values = _traced(terms, columns, scalars, n, kind == "sum")[n_outputs:]
    start = _START[kind]
    n_blocks = -(-n // LANES)

    def padded(v):
        out = np.full(n_blocks * LANES, start)
        out[:n] = v
        return out.reshape(n_blocks, LANES)

    def combine(acc, v):
        return acc + v if kind == "sum" else np.where(v > acc, v, acc)

    out = []
    for t in values:
        acc = np.full(LANES, start)
        if isinstance(t, _Term) and t.factors is not None:  # acc = fma(a, b, acc) per block
            fa, fb = (padded(np.broadcast_to(f, (n,))) for f in t.factors)
            for b in range(n_blocks):
                acc = fma_exact(fa[b], fb[b], acc)
        else:
            v = padded(np.broadcast_to(t.value if isinstance(t, _Term) else t, (n,)))
            for b in range(n_blocks):
                acc = combine(acc, v[b])
        e = list(acc)
        while len(e) > 1:
            e = [float(combine(e[i], e[i + 1])) for i in range(0, len(e), 2)]
        out.append(float(e[0]))
    return tuple(out)
