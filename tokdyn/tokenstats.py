"""Per-token measurements from the literature, computed from the same loss matrix (docs/method.md, "Other per-token measurements").

- **Cartography** (Swayamdipta et al. 2020): ``confidence`` = mean over checkpoints of the
  gold-token probability ``p = exp(-loss)``, ``variability`` = its standard deviation.
- **Forgetting events** (Toneva et al. 2019): how often a token goes from *learned* (loss below
  ``learned_loss`` nats, default ln 2: the gold token has p > 1/2, so it is the model's top
  choice) at one checkpoint to not learned at the next one where it has a loss.
- **Rho-1 classes** (Lin et al. 2024): each token's loss at an early and a late checkpoint,
  each called high or low against ``threshold`` nats: H->H, H->L, L->H, L->L.

Everything is a dask reduction over token chunks of the run, so memory stays bounded by one
chunk whatever the store's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import is_int, is_real as _is_number
from .errors import InputError, StoreError
from .store import Run

__all__ = ["TokenStats", "RHO1_CLASSES", "token_stats", "id_counts", "frequency_bands", "position_bands"]

RHO1_CLASSES = ("H->H", "H->L", "L->H", "L->L")


@dataclass(frozen=True)
class TokenStats:
    """Per-token arrays [N] (``rho1`` holds codes into :data:`RHO1_CLASSES`) and their settings.

    ``scored`` [N] marks the tokens with a finite loss at some row read; the others (padding, a
    token never recorded) have no confidence, no Rho-1 class, and are left out of every count
    and mean of :meth:`summary` (their 0 forgetting events made them read "never forgotten").
    """

    confidence: np.ndarray
    variability: np.ndarray
    forgetting_events: np.ndarray
    rho1: np.ndarray
    early_row: int
    late_row: int
    threshold: float
    learned_loss: float
    scored: np.ndarray | None = None  # [N] bool; None: every token

    def __post_init__(self):
        n = self.forgetting_events.shape
        mask = np.ones(n, bool) if self.scored is None else np.asarray(self.scored, bool)
        if mask.shape != n:
            raise InputError(f"TokenStats.scored: expected a bool array of shape {n}, got {mask.shape}")
        object.__setattr__(self, "scored", mask)

    def rho1_shares(self) -> dict[str, float]:
        """Fraction of tokens in each Rho-1 class."""
        counts = np.bincount(self.rho1[self.rho1 >= 0], minlength=4)
        total = counts.sum()
        return {name: float(c / total) if total else float("nan") for name, c in zip(RHO1_CLASSES, counts)}

    def summary(self) -> dict:
        fe = self.forgetting_events[self.scored]  # over the scored tokens: NaN where there are none
        return {
            "confidence_mean": float(np.nanmean(self.confidence)),
            "variability_mean": float(np.nanmean(self.variability)),
            "forgetting_events_mean": float(fe.mean()) if fe.size else float("nan"),
            "tokens_ever_forgotten": float((fe > 0).mean()) if fe.size else float("nan"),
            "rho1_shares": self.rho1_shares(),
            "early_row": self.early_row, "late_row": self.late_row,
            "threshold": self.threshold, "learned_loss": self.learned_loss,
        }  # fmt: skip


STATS_SLICE = 16384  # tokens a dask block of token_stats holds in float64


def token_stats(
    run: Run,
    *,
    early_row: int | None = None,
    late_row: int = -1,
    threshold: float | None = None,
    learned_loss: float = math.log(2.0),
) -> TokenStats:
    """Cartography, forgetting events and Rho-1 classes of every token of ``run``.

    Parameters
    ----------
    early_row, late_row : rows (checkpoints) compared for Rho-1; default: the row before
        ``late_row`` nearest the middle of the log axis up to it (a partly trained model, as
        Rho-1 compares) and the last row. Negative indices count from the end.
    threshold : loss (nats) separating high from low for Rho-1; default the median of the
        losses at the two rows, pooled, of the tokens with a finite loss at both (the tokens
        classed; NaN when there are none: then no token gets a class).
    learned_loss : loss (nats) below which a token counts as learned for forgetting events.
    """
    import dask.array as da

    if not isinstance(run, Run):
        raise InputError(f"run must be a store Run, got {type(run).__name__}")
    # the numbers first, before any work (a threshold of "x" or 10**400 raised ValueError or
    # OverflowError, and an infinite one was refused only after the whole run had been read)
    if not (_is_number(learned_loss) and math.isfinite(learned_loss) and learned_loss > 0):
        raise InputError(f"learned_loss must be a finite positive number of nats, got {learned_loss!r}")
    if threshold is not None and not (_is_number(threshold) and math.isfinite(threshold)):
        raise InputError(f"threshold must be a finite loss in nats (or None: the median), got {threshold!r}")
    k = run.n_committed
    if k < 2:
        raise StoreError(f"run {run.name!r} has {k} committed rows; token statistics need at least 2")
    for name, r in (("early_row", early_row), ("late_row", late_row)):
        if r is not None and (not is_int(r) or not -k <= r < k):
            raise InputError(f"{name} must be a row index in [-{k}, {k}), got {r!r}")
    late = int(late_row) % k
    if early_row is None:  # the row before late_row nearest the middle of the log axis up to late_row
        av = run.axis_values[: late + 1]  # (a late_row of 1 used to meet a default early_row of 2: an error)
        positive = np.flatnonzero(av > 0)
        if positive.size >= 2:
            x = np.log10(av[positive])
            before = positive < late
            early_row = int(positive[before][np.argmin(np.abs(x[before] - 0.5 * (x[0] + x[-1])))])
        else:
            early_row = 0
    rows = [int(early_row) % k, late]
    if rows[0] >= rows[1]:
        raise InputError(f"early_row ({rows[0]}) must come before late_row ({rows[1]})")

    # [K, N], in float64 a slice of 16,384 tokens at a time: whole stored chunks (262,144 tokens)
    # in float64, with nanstd's temporaries, held 2-3 GB a thread for a 200-row run
    L = run.to_dask().rechunk({1: STATS_SLICE}).astype(np.float64)
    p = da.exp(-L)
    # every row of a slice of tokens in one block: a forgetting is counted between observed
    # points, across a missing one (a token learned at step 8, missing at 16, not learned at 32
    # was forgotten once, as without the row of step 16; comparing neighbouring rows lost it)
    forgets = L.rechunk({0: -1}).map_blocks(_forgetting_events, float(learned_loss), drop_axis=0, dtype=np.int64)
    early, late = L[rows[0]], L[rows[1]]
    scored = da.isfinite(L).any(axis=0)
    conf, var, fe, early, late, scored = da.compute(da.nanmean(p, axis=0), da.nanstd(p, axis=0), forgets, early, late, scored)
    # pooled over the tokens with a loss at both rows, the ones classed: a token with one of them
    # missing moved the median, and H->H and L->L then no longer held equally many tokens
    pair = np.isfinite(early) & np.isfinite(late)
    both = np.concatenate([early[pair], late[pair]])
    # the median of the two rows' losses; NaN when no token has a finite loss at both (then no
    # token gets a class: this used to say "threshold must be a finite loss, got None")
    thr = (float(np.median(both)) if both.size else float("nan")) if threshold is None else float(threshold)
    code = np.where(early >= thr, 0, 2) + np.where(late >= thr, 0, 1)  # H->H 0, H->L 1, L->H 2, L->L 3
    code = np.where(pair, code, -1).astype(np.int8)
    return TokenStats(np.asarray(conf), np.asarray(var), np.asarray(fe, np.int32), code, rows[0], rows[1], thr,
                      float(learned_loss), np.asarray(scored, bool))  # fmt: skip


def _forgetting_events(L: np.ndarray, learned_loss: float) -> np.ndarray:
    """[N] of losses [K, N]: how often each token goes from learned (loss below
    ``learned_loss``) at one observed point to not learned at its next observed point (NaN
    points are skipped)."""
    count = np.zeros(L.shape[1], np.int64)
    state = np.full(L.shape[1], -1, np.int8)  # at the last observed point: -1 none yet, 0 not learned, 1 learned
    for row in L:
        seen = np.isfinite(row)
        now = row < learned_loss
        count += seen & (state == 1) & ~now
        state = np.where(seen, now.astype(np.int8), state)
    return count


def id_counts(token_id: np.ndarray, scored: np.ndarray | None = None) -> np.ndarray:
    """[N] how often each token's id occurs among the ``scored`` tokens of the probe (all of
    them where ``scored`` is None); 0 for a token not scored. Padding (a pad id at every padded
    position of an imported probe, never scored) is no occurrence of any id: counted, it made
    the pad id the most frequent token and moved the quantile bands of the real ones."""
    tid = np.asarray(token_id)
    if tid.ndim != 1 or tid.size == 0:
        raise InputError("token_id: expected a non-empty 1-D array")
    mask = np.ones(tid.shape, bool) if scored is None else np.asarray(scored, bool)
    if mask.shape != tid.shape:
        raise InputError(f"scored: expected a bool array of shape {tid.shape}, got {mask.shape}")
    out = np.zeros(tid.shape, np.int64)
    if mask.any():
        _, inverse, counts = np.unique(tid[mask], return_inverse=True, return_counts=True)
        out[mask] = counts[inverse.reshape(-1)]
    return out


def frequency_bands(token_id: np.ndarray, n_bands: int = 4, scored: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
    """Band [N] of each token by how often its id occurs in the probe (quantiles of log count).

    Returns band codes 0 (rarest) .. n_bands-1 (most frequent) and a label per band. With
    ``scored`` [N] bool, the counts and quantiles are those of the scored tokens only
    (:func:`id_counts`), and a token not scored is in no band (code -1): never-scored tokens
    are in no count, as in :func:`token_stats`.
    """
    if not is_int(n_bands) or n_bands < 1:
        raise InputError(f"n_bands must be an int >= 1, got {n_bands!r}")
    n_bands = int(n_bands)
    counts = id_counts(token_id, scored)
    mask = counts > 0
    if not mask.any():  # no token scored: no band
        return np.full(counts.shape, -1, np.int64), []
    freq = counts[mask]
    # Integer edges (a count is an integer: rounding an edge up moves no count across it and only
    # drops bands no count can fall in); a band holds [edges[b], edges[b+1]), the last one its top
    # edge too, and its label says so: "17-19", "20-22", never a count in two labels.
    edges = np.unique(np.ceil(np.quantile(freq, np.linspace(0, 1, n_bands + 1)))).astype(np.int64)
    band = np.clip(np.searchsorted(edges, freq, side="right") - 1, 0, max(len(edges) - 2, 0))

    def label(lo: int, hi: int) -> str:
        return f"{lo} occurrence{'s' * (lo != 1)}" if lo == hi else f"{lo}-{hi} occurrences"

    last = len(edges) - 2
    labels = [label(int(edges[b]), int(edges[b + 1]) - (b < last)) for b in range(len(edges) - 1)] if len(edges) > 1 \
        else [label(int(edges[0]), int(edges[0]))]  # fmt: skip
    out = np.full(counts.shape, -1, np.int64)
    out[mask] = band
    return out, labels


def position_bands(token_pos: np.ndarray, context: int | None) -> tuple[np.ndarray, list[str]]:
    """Band [N] of each token by its position in the sequence, on doubling bands 1, 2-3, 4-7, ...
    (a band of one position is labelled by it alone: "1", not "1-1").

    ``token_pos``: whole numbers >= 0 and below 2**63, of any integer dtype or a float dtype
    holding whole numbers (a probe's ``token_pos`` may be stored as floats: docs/store.md); a
    fraction, NaN or infinity is an :class:`InputError` (they were cut to an integer: 3.9 went
    into "2-3", NaN became -2**63). ``context``: None, or an integer >= 1.
    """
    pos = np.asarray(token_pos)
    expected = "token_pos: expected a non-empty 1-D array of whole-number positions >= 0 and below 2**63"
    if pos.ndim != 1 or pos.size == 0:
        raise InputError(f"{expected}; got shape {pos.shape}")
    if pos.dtype.kind not in "iuf":
        raise InputError(f"{expected}; got dtype {pos.dtype}")
    if pos.dtype.kind == "f":
        bad = ~np.isfinite(pos) | (pos != np.floor(pos))
        if bad.any():
            raise InputError(f"{expected}; got {float(pos[bad][0])!r}")
    lo, hi = (float(pos.min()), float(pos.max())) if pos.dtype.kind == "f" else (int(pos.min()), int(pos.max()))
    if lo < 0 or hi >= 2**63:
        raise InputError(f"{expected}; got values from {lo!r} to {hi!r}")
    if context is not None and not (is_int(context) and 1 <= context < 2**63):
        raise InputError(f"context must be None or an integer >= 1 (positions per sequence), got {context!r}")
    pos = pos.astype(np.int64)  # exact: whole numbers below 2**63
    # positions run 1..context (a target's place in its window; 0 counts with 1): the last band
    # holds the context's own last position (with ceil(log2), a context of 64 put position 64
    # into "32-63")
    top = max(int(context or 0), int(hi), 1)
    n = top.bit_length()  # floor(log2(top)) + 1 doubling bands: the last one starts <= top
    band = _floor_log2(np.maximum(pos, 1))
    labels = [f"{2**b}" if 2**b >= min(2 ** (b + 1) - 1, top) else f"{2**b}-{min(2 ** (b + 1) - 1, top)}" for b in range(n)]
    return band, labels


def _floor_log2(x: np.ndarray) -> np.ndarray:
    """``floor(log2(x))`` of int64 ``x >= 1``, exact (through float64, 2**62 - 1 rounded up to
    2**62 and went into the band above)."""
    x = x.copy()
    out = np.zeros(x.shape, np.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        big = x >= (1 << shift)
        out[big] += shift
        x[big] >>= shift
    return out
