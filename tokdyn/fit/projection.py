"""Variable projection for the batched solver (numpy and torch), as :mod:`tokdyn.fit.varpro`.

For fixed th = (mu, ln s) the sigmoid's amplitudes follow from linear least squares, and the
projected sum of squares is ``F = Syy - c^2 / v`` with ``c = sum g (y - mean)`` and
``v = sum g^2 - (sum g)^2 / n``. :func:`sigmoid_projected` returns F, its exact gradient and
Hessian (halved, the solver's convention ``J^T r``, ``J^T J``), with Kaufman's Gauss-Newton
matrix standing in where the Hessian is not positive definite. The same formulas, one
trajectory at a time, are in :func:`tokdyn.fit.varpro._vp_sigmoid`.
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


def sigmoid_amplitudes(ops, x, Yc, W, th):
    """(d, linf - mean) [B] of the projected sigmoid at th [B, 2]; Yc centred, 0 if missing."""
    _, g, _, _ = _columns(ops, x, W, th)
    n = W.sum(-1)
    sg = ops.rowsum(g)
    v = ops.rowsum(g * g) - sg * sg / n
    d = ops.rowsum(g * Yc) / v
    return d, -d * sg / n


def sigmoid_projected(ops, x, Yc, W, th):
    """F [B], matrix [B, 2, 2] and gradient [B, 2] at th = (mu, ln s) [B, 2].

    Yc [B, K]: data minus each row's mean over observed points, 0 where W is 0. F is inf
    where the basis is degenerate (g constant over the observed points).
    """
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

    sg, sgg, c = S(g), S(g * g), S(g * Yc)
    sa, sb = S(a), S(b)
    sga, sgb = S(g * a), S(g * b)
    saa, sab, sbb = S(a * a), S(a * b), S(b * b)
    c0, c1 = S(a * Yc), S(b * Yc)
    c00, c01, c11 = S(mm * Yc), S(mt * Yc), S(tt * Yc)
    smm, smt, stt = S(mm), S(mt), S(tt)
    sgmm, sgmt, sgtt = S(g * mm), S(g * mt), S(g * tt)
    v = sgg - sg * sg / n
    good = v > 1e-12 * n
    v = ops.where(good, v, ops.ones_like(v))
    syy = S(Yc * Yc)
    F = syy - c * c / v
    F = ops.where(F > 0, F, ops.zeros_like(F))
    F = ops.where(good, F, ops.full_like(F, float("inf")))
    w0 = sga - sg * sa / n
    w1 = sgb - sg * sb / n
    v0, v1 = 2.0 * w0, 2.0 * w1
    v00 = 2.0 * (saa + sgmm - (sa * sa + sg * smm) / n)
    v01 = 2.0 * (sab + sgmt - (sa * sb + sg * smt) / n)
    v11 = 2.0 * (sbb + sgtt - (sb * sb + sg * stt) / n)
    cv = c / v
    cv2 = cv * cv
    grad = ops.stack([-cv * c0 + 0.5 * cv2 * v0, -cv * c1 + 0.5 * cv2 * v1], 1)
    h00 = -(c0 * c0 + c * c00) / v + 2.0 * cv * c0 * v0 / v + 0.5 * cv2 * v00 - cv2 * v0 * v0 / v
    h01 = (-(c0 * c1 + c * c01) / v + cv * (c0 * v1 + c1 * v0) / v + 0.5 * cv2 * v01
           - cv2 * v0 * v1 / v)
    h11 = -(c1 * c1 + c * c11) / v + 2.0 * cv * c1 * v1 / v + 0.5 * cv2 * v11 - cv2 * v1 * v1 / v
    pd = (h00 > 0) & (h11 > 0) & (h00 * h11 - h01 * h01 > 1e-12 * h00 * h11)
    dd = cv * cv  # d^2
    k00 = dd * (saa - sa * sa / n - w0 * w0 / v)
    k01 = dd * (sab - sa * sb / n - w0 * w1 / v)
    k11 = dd * (sbb - sb * sb / n - w1 * w1 / v)
    m00 = ops.where(pd, h00, k00)
    m01 = ops.where(pd, h01, k01)
    m11 = ops.where(pd, h11, k11)
    A = ops.stack([ops.stack([m00, m01], 1), ops.stack([m01, m11], 1)], 1)
    return F, A, grad
