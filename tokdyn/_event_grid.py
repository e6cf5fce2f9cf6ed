"""The event kernel's binning, compiled: each learning event's seen drop on the spectrum's fine grid.

:func:`tokdyn.spectrum.learning_time_spectrum` (``kernel="event"``) puts each event's whole
sigmoid on a fine grid of spacing ``dx`` (about an eighth of the bandwidth) by linear binning:
node ``j`` gets ``int hat_j dF_i``, ``F_i(u) = delta_i sigma((u - mu_i)/s_i)`` (the closed form
in :func:`tokdyn.spectrum._node_blocks`, the numpy reference). Done densely that is
``E x F`` logistic and softplus evaluations, and the bootstrap multiplies them by every
resample: minutes for a run of 2M tokens (four million events on 1,600 nodes). Two things here
make it cheap without changing what is computed:

- **A window per event.** Only the nodes within ``20 s`` of ``mu`` are computed; what the
  sigmoid does farther out (``|z| > 20``: less than ``e^-20 = 2e-9`` of its drop) goes to the
  window's first and last nodes, so each event's masses still add up to its seen drop.
- **A grid per width.** A wide event (``s >= 8 D``) is binned on a coarser grid of spacing
  ``D = dx 2^l`` (every ``2^l``-th fine node) and each coarse node's mass is then spread over
  the fine nodes by a tent of half-width ``D`` (at a bound, by the shares a smooth drop would
  give them). Mass and mean are kept exactly; the event's profile gains a variance of at most ``D^2 / 3 <= s^2 / 192`` against its
  own ``pi^2 s^2 / 3`` (under 0.2 %), before the bandwidth's Gaussian smooths it further.
  At a bound of the observed range the half cell takes the drop's slope to first order only:
  an event wider than the whole range moves the spectrum there by up to 0.15 % of its peak
  (``tests/test_event_grid.py``). So an
  event costs at most about ``1,300`` node evaluations, whatever the grid.

The events are split in a fixed number of chunks, each summed into its own buffer on the
threads numba is given (:func:`tokdyn.fit.numba_kernels.run_chunks`), and the buffers added in
chunk order, so the result does not depend on the number of threads.
"""

from __future__ import annotations

import math

import numpy as np

from tokdyn._jit import njit

# Levels of coarser grids: spacings dx * 2^l for l <= MAX_LEVEL, so the fine grid's cells
# number a multiple of 2^MAX_LEVEL (tokdyn.spectrum._fine_grid).
MAX_LEVEL = 6
GRID_MULTIPLE = 1 << MAX_LEVEL
# |z| beyond which an event's drop (less than e^-20 = 2e-9 of it) is lumped at its window's ends
Z_WINDOW = 20.0
# an event goes on the coarsest grid whose spacing is at most its width s over this
WIDTH_PER_SPACING = 16.0
# fixed chunks of events, each summed into its own buffer (bits independent of the threads)
CHUNKS = 8
# the widest event (decades) the binning computes as it is; a wider one is binned at this width
MAX_WIDTH = 1e200
# cells narrower than this share of an event's width take the cancellation-free cell mean (_masses)
WIDE_CELL = 1e-3


@njit(cache=True, nogil=True)
def _logistic(z):
    """sigma(z) and softplus(z) = log(1 + e^z), overflow-free."""
    e = math.exp(-abs(z))
    g = 1.0 / (1.0 + e) if z >= 0.0 else e / (1.0 + e)
    return g, max(z, 0.0) + math.log1p(e)


@njit(cache=True, nogil=True)
def _level_of(s, dx):
    level = 0
    while level < MAX_LEVEL and dx * (1 << (level + 1)) * WIDTH_PER_SPACING <= s:
        level += 1
    return level


@njit(cache=True, nogil=True)
def _masses(mi, si, d, level, lo, dx, n_fine, sp, mass):
    """One event's masses on level ``level``'s coarse grid, written to ``mass[:n]`` for its
    nodes ``j0 .. j0 + n - 1``; returns (j0, n)."""
    step = 1 << level
    nc = (n_fine - 1) // step + 1
    D = dx * step
    a = (mi - Z_WINDOW * si - lo) / D
    b = (mi + Z_WINDOW * si - lo) / D
    if not (b >= 0.0 and a <= nc - 1):  # the window outside the grid: what little is seen
        j0 = j1 = 0 if b < 0.0 else nc - 1  # goes to the nearer bound
    else:
        j0 = 0 if a <= 1.0 else int(a) - 1
        j1 = nc - 1 if b >= nc - 2 else int(b) + 2
    c = d * si / D
    dz = D / si  # a cell's width in units of the event's width
    # softplus(z + dz) - softplus(z) = log1p(sigma(z) expm1(dz)) for an event much wider than a
    # cell, without the cancellation of two values near log 2: for s >> D their difference fell
    # below their rounding and the cell mean (times s / D) was noise (one event 1e12 decades wide
    # moved a spectrum by 0.08 % of its peak, one 1e15 wide by 78 %). Elsewhere the softplus at
    # each node, differenced, is exact enough (1e-13 at dz = 1e-3) and twice as fast.
    wide = dz < WIDE_CELL
    grow = math.expm1(dz)
    if not wide:  # softplus at nodes j0 .. j1, the cell means between them, the masses by differences
        for k in range(j0, j1 + 1):
            z = (lo + dx * (k * step) - mi) / si
            sp[k - j0] = _logistic(z)[1]
    # the drop seen before the window's first cell goes to its first node (all of the first
    # node's share where the window starts at the grid's lower bound) ...
    prev = d * _logistic((lo - mi) / si)[0]
    for k in range(j0, j1):
        if wide:
            z = (lo + dx * (k * step) - mi) / si
            cm = d * math.log1p(_logistic(z)[0] * grow) / dz
        else:
            cm = c * (sp[k + 1 - j0] - sp[k - j0])
        mass[k - j0] = cm - prev
        prev = cm
    # ... and the rest of the seen drop to its last node: every event's masses add up to its
    # seen drop, delta (sigma at the upper bound - sigma at the lower bound)
    mass[j1 - j0] = d * _logistic((lo + dx * ((nc - 1) * step) - mi) / si)[0] - prev
    return j0, j1 - j0 + 1


@njit(cache=True, nogil=True)
def _cells_chunk(mu, s, delta, event_weight, token, mult, lo, dx, n_fine, offsets, out, first, last):
    """Add events ``first .. last - 1`` to ``out [W, offsets[-1]]``: row b, level l's coarse
    nodes at ``offsets[l] ..``, each event's masses times ``mult[b, token[i]]``."""
    W = mult.shape[0]
    sp = np.empty(n_fine + 1)
    mass = np.empty(n_fine + 1)
    for i in range(first, last):
        si = s[i]
        d = delta[i] * event_weight[i]
        if not (si > 0.0) or d == 0.0:
            continue
        level = _level_of(si, dx)
        j0, n = _masses(mu[i], si, d, level, lo, dx, n_fine, sp, mass)
        base = offsets[level] + j0
        t = token[i]
        for r in range(W):
            w = float(mult[r, t])
            if w == 0.0:
                continue
            row = out[r]
            for k in range(n):
                row[base + k] += w * mass[k]


@njit(cache=True, nogil=True)
def _levels(s, dx, out):
    for i in range(s.shape[0]):
        out[i] = _level_of(s[i], dx) if s[i] > 0.0 else -1


@njit(cache=True, nogil=True)
def _block_masses(mu, s, delta, rows, level, lo, dx, n_fine, M, first, last):
    """Rows ``first .. last - 1`` of ``M [B, nc]`` (zero): the masses of events ``rows[..]``,
    all of level ``level``, on its coarse grid."""
    sp = np.empty(n_fine + 1)
    mass = np.empty(n_fine + 1)
    for q in range(first, last):
        i = rows[q]
        j0, n = _masses(mu[i], s[i], delta[i], level, lo, dx, n_fine, sp, mass)
        for k in range(n):
            M[q, j0 + k] = mass[k]


def level_offsets(n_fine: int) -> np.ndarray:
    """[MAX_LEVEL + 2] where each level's coarse nodes start in a buffer row, and its length."""
    sizes = [(n_fine - 1) // (1 << lev) + 1 for lev in range(MAX_LEVEL + 1)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def event_cells(mu, s, delta, token, mult, lo: float, dx: float, n_fine: int,
                event_weight: np.ndarray | None = None) -> np.ndarray:
    """[W, n_fine]: each row the events' seen drops binned on the fine grid ``lo + dx *
    arange(n_fine)`` (``n_fine - 1`` a multiple of :data:`GRID_MULTIPLE`), event i weighted by
    ``mult[row, token[i]]`` (``mult [W, N]``, small integers) times ``event_weight[i]``."""
    mu, s, delta, token, mult = _grid_events(mu, s, delta, token, mult, n_fine)
    ew = np.ones(mu.size) if event_weight is None else np.ascontiguousarray(event_weight, np.float64)
    offsets = level_offsets(n_fine)
    lo, dx, n_fine = float(lo), float(dx), int(n_fine)
    coarse = _in_fixed_chunks(mu.size, (mult.shape[0], int(offsets[-1])), lambda out, first, last: _cells_chunk(
        mu, s, delta, ew, token, mult, lo, dx, n_fine, offsets, out, first, last))
    return _prolong(coarse, offsets, n_fine)


def _grid_events(mu, s, delta, token, mult, n_fine: int):
    """The arguments of :func:`event_cells` and :func:`resample_cells` as their kernels take
    them (ValueError where the fine grid has no whole coarse cells)."""
    if (n_fine - 1) % GRID_MULTIPLE:
        raise ValueError(f"n_fine - 1 must be a multiple of {GRID_MULTIPLE}, got {n_fine - 1}")
    mu, s, delta = (np.ascontiguousarray(a, np.float64) for a in (mu, s, delta))
    # A width past MAX_WIDTH decades is cut to it: the cell masses are delta (s / D) times a softplus
    # difference of about D / s, and s / D overflowed (s = 1e308: inf * 0, a NaN spectrum). Such
    # an event's seen drop is below 1e-200 of its delta over any range either way.
    s = np.minimum(s, MAX_WIDTH)
    return mu, s, delta, np.ascontiguousarray(token, np.int64), np.ascontiguousarray(mult)


def _in_fixed_chunks(n_events: int, shape: tuple[int, ...], add) -> np.ndarray:
    """The sum over events of what ``add(out, first, last)`` (a compiled, ``nogil`` kernel)
    adds to a zero array ``out`` of ``shape`` for events ``first .. last - 1``: the events in
    :data:`CHUNKS` fixed chunks, each into its own array, on the threads numba is given
    (:func:`tokdyn.fit.numba_kernels.run_chunks`), the arrays added in chunk order, so the
    bits do not depend on the number of threads."""
    from tokdyn.fit.numba_kernels import run_chunks

    n_chunks = max(1, min(CHUNKS, n_events))
    bounds = [c * n_events // n_chunks for c in range(n_chunks + 1)]
    buffers = np.zeros((n_chunks, *shape))
    if n_events:

        def work(first: int, last: int) -> None:
            for c in range(first, last):  # chunk c always sums the same events into buffer c
                add(buffers[c], bounds[c], bounds[c + 1])

        run_chunks(work, n_chunks)
    out = buffers[0].copy()
    for c in range(1, n_chunks):
        out += buffers[c]
    return out


# Bytes of one level's dense block of event masses in resample_cells
_BLOCK_BYTES = 1 << 24


def resample_cells(mu, s, delta, token, mult, lo: float, dx: float, n_fine: int) -> np.ndarray:
    """[W, n_fine]: :func:`event_cells` of many resamples at once (``mult [W, N]``, the
    bootstrap's token multiplicities). Events on the fine grid go through :func:`event_cells`
    (their windows are narrow); a coarser level's masses are computed once, in dense blocks
    [B, nodes of the level], and summed under all resamples by one matrix product a block
    (``mult[:, token] @ M``), which the window loop, bound by memory, is not for windows as
    wide as the level's grid. The same masses, so the same cells to rounding."""
    from tokdyn.fit.numba_kernels import run_chunks

    mu, s, delta, token, mult = _grid_events(mu, s, delta, token, mult, n_fine)
    offsets = level_offsets(n_fine)
    coarse = np.zeros((mult.shape[0], int(offsets[-1])))
    levels = np.empty(mu.size, np.int64)
    _levels(s, float(dx), levels)
    levels[delta == 0.0] = -1
    sharp = levels == 0
    fine0 = event_cells(mu[sharp], s[sharp], delta[sharp], token[sharp], mult, lo, dx, n_fine)
    for level in range(1, MAX_LEVEL + 1):
        rows = np.flatnonzero(levels == level)
        nc = int(offsets[level + 1] - offsets[level])
        block = max(1, _BLOCK_BYTES // (8 * nc))
        for a in range(0, rows.size, block):
            r = rows[a : a + block]
            M = np.zeros((r.size, nc))
            run_chunks(lambda first, last: _block_masses(mu, s, delta, r, level, float(lo), float(dx), int(n_fine),
                                                         M, first, last), r.size)  # fmt: skip
            coarse[:, offsets[level] : offsets[level + 1]] += mult[:, token[r]].astype(np.float64) @ M
    return fine0 + _prolong(coarse, offsets, n_fine)


def _prolong(coarse: np.ndarray, offsets: np.ndarray, n_fine: int) -> np.ndarray:
    """[W, n_fine]: level 0 as it is, each coarser level's node masses spread over the fine
    nodes by a tent of half-width 2^l fine cells: the transpose of linear interpolation, so a
    drop that is linear across a coarse cell is spread as the fine grid would have binned it
    (at a bound: below)."""
    fine = coarse[:, offsets[0] : offsets[1]].copy()
    for level in range(1, MAX_LEVEL + 1):
        c = coarse[:, offsets[level] : offsets[level + 1]]
        if not c.any():
            continue
        n = 1 << level
        # A bound's coarse half tent is the fine half tent at the bound plus, for 0 < t < n,
        # (1 - t/n) of the fine tents inside; a smooth drop puts twice the interior share on
        # those (their tents are whole) and the interior share on the bound node: weights
        # 1/n at the bound and 2 (1 - t/n) / n inside, which add up to 1.
        bounds = c[:, [0, -1]] / n
        c = c.copy()
        c[:, 0] *= 2.0
        c[:, -1] *= 2.0
        fine[:, 0] -= bounds[:, 0]
        fine[:, -1] -= bounds[:, 1]
        for t in range(-(n - 1), n):
            w = (1.0 - abs(t) / n) / n
            # fine node J n + t for coarse node J, kept inside [0, n_fine)
            j_lo = 1 if t < 0 else 0
            j_hi = c.shape[1] - 1 if t > 0 else c.shape[1]
            fine[:, j_lo * n + t : (j_hi - 1) * n + t + 1 : n] += w * c[:, j_lo:j_hi]
    return fine


# What event_sums adds up at each point x: the event's share of the loss still to fall,
# delta sigma(-(x - mu)/s); its rate of fall, delta g (1 - g) / s; or its drop between
# consecutive points, delta (sigma(-(x_k - mu)/s) - sigma(-(x_k+1 - mu)/s)).
CURVE, DERIVATIVE, BETWEEN = 0, 1, 2


@njit(cache=True, nogil=True)
def _sums_chunk(kind, mu, s, delta, weight, x, out, first, last):
    G = x.shape[0]
    g = np.empty(G)  # sigma(z), z = (x - mu)/s
    h = np.empty(G)  # sigma(-z) = 1 - sigma(z), each without cancellation
    for i in range(first, last):
        si, mi = s[i], mu[i]
        d = delta[i] * weight[i]
        if d == 0.0:
            continue
        for k in range(G):
            z = (x[k] - mi) / si
            e = math.exp(-abs(z))
            q = 1.0 / (1.0 + e)
            g[k] = q if z >= 0.0 else e * q
            h[k] = e * q if z >= 0.0 else q
        if kind == CURVE:
            for k in range(G):
                out[k] += d * h[k]
        elif kind == DERIVATIVE:
            for k in range(G):
                out[k] += d * g[k] * h[k] / si
        else:
            for k in range(G - 1):
                out[k] += d * (g[k + 1] - g[k])


def event_sums(kind: int, mu, s, delta, x, weight: np.ndarray | None = None) -> np.ndarray:
    """Over the events, at each point of ``x`` [G]: the sum of :data:`CURVE`,
    :data:`DERIVATIVE` or :data:`BETWEEN` (then [G - 1]) terms, event i weighted by
    ``weight[i]`` (:func:`_in_fixed_chunks`)."""
    mu, s, delta = (np.ascontiguousarray(a, np.float64) for a in (mu, s, delta))
    x = np.ascontiguousarray(x, np.float64)
    w = np.ones(mu.size) if weight is None else np.ascontiguousarray(weight, np.float64)
    out = _in_fixed_chunks(mu.size, (x.size,), lambda buf, first, last: _sums_chunk(
        kind, mu, s, delta, w, x, buf, first, last))
    return out if kind != BETWEEN else out[:-1]
