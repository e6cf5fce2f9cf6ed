"""Variable projection for the batched solver (numpy and torch), as :mod:`tokdyn.fit.varpro`.

For fixed th = (mu, ln s) the sigmoid's amplitudes follow from linear least squares, and the
projected sum of squares is ``F = Syy - c^2 / v`` with ``c = sum g (y - mean)`` and
``v = sum g^2 - (sum g)^2 / n``. :func:`sigmoid_projected` returns F, its exact gradient and
Hessian (halved, the solver's convention ``J^T r``, ``J^T J``), with Kaufman's Gauss-Newton
matrix standing in where the Hessian is not positive definite.

Both levels stay at or above a floor (:data:`tokdyn.fit.sigmoid.LEVEL_FLOOR`): where the
least-squares levels break it, the amplitudes are those of the best feasible active set
(linf = floor, or l0 = floor, or both), each one amplitude in closed form from the same sums.
The same formulas, one trajectory at a time, are in :func:`tokdyn.fit.varpro._vp_sigmoid`.
"""

from __future__ import annotations

from tokdyn.fit.sigmoid import Z_CLIP

__all__ = ["sigmoid_projected", "sigmoid_amplitudes"]


def _columns(ops, x, W, th):
    mu, inv_s = th[:, 0:1], ops.exp(-th[:, 1:2])  # (B, 1)
    z = ops.clip_scalar((x[None, :] - mu) * inv_s, -Z_CLIP, Z_CLIP)  # (B, K)
    e = ops.exp(z)
    g = 1.0 / (1.0 + e)
    h = e * g
    return z, g * W, h * W, inv_s


def _terms(ops, c, cd, cdd, v, vd, vdd, syy, q, w):
    """F = syy - c^2/v of one amplitude d = c/v, with the gradient [B, 2] and matrix [B, 2, 2]
    of F/2 in (mu, ln s); cd = (c_0, c_1), cdd = (c_00, c_01, c_11), likewise v; q and w give
    Kaufman's matrix d^2 (q - w w^T / v). Rows with v <= 0 get F = inf."""
    good = v > 0
    v = ops.where(good, v, ops.ones_like(v))
    d = c / v
    F = syy - c * c / v
    F = ops.where(F > 0, F, ops.zeros_like(F))
    F = ops.where(good, F, ops.full_like(F, float("inf")))
    (c0, c1), (c00, c01, c11) = cd, cdd
    (v0, v1), (v00, v01, v11) = vd, vdd
    d2 = d * d
    grad = ops.stack([-d * c0 + 0.5 * d2 * v0, -d * c1 + 0.5 * d2 * v1], 1)
    h00 = -(c0 * c0 + c * c00) / v + 2.0 * d * c0 * v0 / v + 0.5 * d2 * v00 - d2 * v0 * v0 / v
    h01 = (-(c0 * c1 + c * c01) / v + d * (c0 * v1 + c1 * v0) / v + 0.5 * d2 * v01
           - d2 * v0 * v1 / v)
    h11 = -(c1 * c1 + c * c11) / v + 2.0 * d * c1 * v1 / v + 0.5 * d2 * v11 - d2 * v1 * v1 / v
    pd = (h00 > 0) & (h11 > 0) & (h00 * h11 - h01 * h01 > 1e-12 * h00 * h11)
    (q00, q01, q11), (w0, w1) = q, w
    m00 = ops.where(pd, h00, d2 * (q00 - w0 * w0 / v))
    m01 = ops.where(pd, h01, d2 * (q01 - w0 * w1 / v))
    m11 = ops.where(pd, h11, d2 * (q11 - w1 * w1 / v))
    A = ops.stack([ops.stack([m00, m01], 1), ops.stack([m01, m11], 1)], 1)
    return F, d, grad, A


def _solve(ops, x, Yc, W, th, mean, floor):
    """(F, A, grad, d, linf - mean) at th [B, 2]; the levels at or above ``floor`` where
    ``mean`` [B] (the rows' means) is given."""
    z, g, h, inv_s = _columns(ops, x, W, th)
    n = W.sum(-1)
    u = g * h
    a = u * inv_s  # dg/dmu (0 where unobserved)
    b = u * z  # dg/dln s
    zw1 = z * (h - g) - 1.0
    mm = u * (h - g) * inv_s * inv_s  # second derivatives of g
    mt = a * zw1
    tt = b * zw1

    def S(v):
        return ops.rowsum(v)

    sg, sgg, sgy = S(g), S(g * g), S(g * Yc)
    sa, sb = S(a), S(b)
    sga, sgb = S(g * a), S(g * b)
    saa, sab, sbb = S(a * a), S(a * b), S(b * b)
    say, sby = S(a * Yc), S(b * Yc)
    smmy, smty, stty = S(mm * Yc), S(mt * Yc), S(tt * Yc)
    smm, smt, stt = S(mm), S(mt), S(tt)
    sgmm, sgmt, sgtt = S(g * mm), S(g * mt), S(g * tt)
    syy = S(Yc * Yc)
    # free levels: basis (1, g)
    v = sgg - sg * sg / n
    v = ops.where(v > 1e-12 * n, v, ops.zeros_like(v))
    w0, w1 = sga - sg * sa / n, sgb - sg * sb / n
    F, d, grad, A = _terms(
        ops, sgy, (say, sby), (smmy, smty, stty), v, (2.0 * w0, 2.0 * w1),
        (2.0 * (saa + sgmm - (sa * sa + sg * smm) / n),
         2.0 * (sab + sgmt - (sa * sb + sg * smt) / n),
         2.0 * (sbb + sgtt - (sb * sb + sg * stt) / n)),
        syy, (saa - sa * sa / n, sab - sa * sb / n, sbb - sb * sb / n), (w0, w1))
    lin = -d * sg / n
    if mean is None:
        return F, A, grad, d, lin
    m = mean - floor  # the data's mean above the floor
    syy_f = syy + n * m * m
    # linf = floor: l = floor + d g
    va = ops.where(sgg > 1e-12 * n, sgg, ops.zeros_like(sgg))
    Fa, da, ga, Aa = _terms(
        ops, sgy + m * sg, (say + m * sa, sby + m * sb),
        (smmy + m * smm, smty + m * smt, stty + m * stt), va, (2.0 * sga, 2.0 * sgb),
        (2.0 * (saa + sgmm), 2.0 * (sab + sgmt), 2.0 * (sbb + sgtt)), syy_f,
        (saa, sab, sbb), (sga, sgb))
    # l0 = floor: l = floor + e (1 - g), d = -e
    vh = n - 2.0 * sg + sgg
    vh = ops.where(vh > 1e-12 * n, vh, ops.zeros_like(vh))
    Fb, eb, gb, Ab = _terms(
        ops, n * m - sgy - m * sg, (-(say + m * sa), -(sby + m * sb)),
        (-(smmy + m * smm), -(smty + m * smt), -(stty + m * stt)), vh,
        (2.0 * (sga - sa), 2.0 * (sgb - sb)),
        (2.0 * (saa + sgmm - smm), 2.0 * (sab + sgmt - smt), 2.0 * (sbb + sgtt - stt)),
        syy_f, (saa, sab, sbb), (sga - sa, sgb - sb))
    inf = ops.full_like(F, float("inf"))
    Fa = ops.where(da >= 0, Fa, inf)
    Fb = ops.where(eb >= 0, Fb, inf)
    use_b = Fb < Fa
    F_c = ops.where(use_b, Fb, Fa)
    d_c = ops.where(use_b, -eb, da)
    lin_c = ops.where(use_b, eb - m, -m)
    grad_c = ops.where(use_b[:, None], gb, ga)
    A_c = ops.where(use_b[:, None, None], Ab, Aa)
    # neither: the loss stays at the floor (no gradient in th)
    none = ~ops.isfinite(F_c)
    eye = ops.stack([ops.stack([ops.ones_like(F), ops.zeros_like(F)], 1),
                     ops.stack([ops.zeros_like(F), ops.ones_like(F)], 1)], 1)
    F_c = ops.where(none, syy_f, F_c)
    d_c = ops.where(none, ops.zeros_like(d_c), d_c)
    lin_c = ops.where(none, -m, lin_c)
    grad_c = ops.where(none[:, None], ops.zeros_like(grad_c), grad_c)
    A_c = ops.where(none[:, None, None], eye, A_c)
    # the free levels where they are feasible (and where the basis is degenerate)
    free = (mean + lin >= floor) & (mean + lin + d >= floor) | ~ops.isfinite(F)
    return (ops.where(free, F, F_c), ops.where(free[:, None, None], A, A_c),
            ops.where(free[:, None], grad, grad_c), ops.where(free, d, d_c),
            ops.where(free, lin, lin_c))


def sigmoid_amplitudes(ops, x, Yc, W, th, mean=None, floor=0.0):
    """(d, linf - mean) [B] of the projected sigmoid at th [B, 2]; Yc centred, 0 if missing.
    With the rows' ``mean`` [B] given, both levels stay at or above ``floor``."""
    _, _, _, d, lin = _solve(ops, x, Yc, W, th, mean, floor)
    return d, lin


def sigmoid_projected(ops, x, Yc, W, th, mean=None, floor=0.0):
    """F [B], matrix [B, 2, 2] and gradient [B, 2] at th = (mu, ln s) [B, 2].

    Yc [B, K]: data minus each row's mean over observed points, 0 where W is 0. F is inf
    where the basis is degenerate (g constant over the observed points). With the rows'
    ``mean`` [B] given, both levels stay at or above ``floor``.
    """
    F, A, grad, _, _ = _solve(ops, x, Yc, W, th, mean, floor)
    return F, A, grad
