"""Fit a block of trajectories: every model, BIC, class and age of acquisition per token.

:func:`fit_block` is the plain function over one block (x [K], Y [B, K]) that returns the fixed
record :data:`FIT_FIELDS` (1-D arrays of length B), the unit a store lifts over its token
chunks. :func:`fit_sigmoids` is the same for arrays in memory of any size, returning a
:class:`SigmoidFit`.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np

from tokdyn.errors import InputError
from tokdyn.fit.backends import (
    grid_starts,
    prepare_rows,
    resolve_backend,
    run_lm,
    two_starts,
)
from tokdyn.fit.grid import start_grids, two_sigmoid_amplitudes
from tokdyn.fit.lm import LM_CONVERGED, MODEL_SIGMOID, MODEL_TWO_SIGMOIDS
from tokdyn.fit.models import (
    EXACT_FIT_SHARE,
    N_PARAMS,
    bic,
    choose_model,
    class_loss_share,
    classify,
    drop_bound,
    model_level,
    order_events,
    two_sigmoid_bounds,
    two_sigmoid_start,
)
from tokdyn._checks import host_values
from tokdyn._text import shown
from tokdyn.fit.options import (
    CLASS_CODES,
    CLASS_NAMES,
    MODEL_NAMES,
    STATUS_CODES,
    STATUS_NAMES,
    INT64_MAX,
    FitOptions,
)
from tokdyn.fit.sigmoid import age_of_acquisition, check_axis, refuse_masked, s_min_of

__all__ = ["FIT_FIELDS", "SigmoidFit", "fit_block", "fit_sigmoids", "validate_inputs"]

F8, I4, I1 = np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int8)

FIT_FIELDS: dict[str, np.dtype] = {
    # data
    "n_points": I4,  # observed (non-NaN) points (of every row, fitted or not)
    "x_first": F8,  # first and last observed x
    "x_last": F8,
    # one sigmoid (docs/method.md, "The learning event of one token")
    "status": I1,  # STATUS_NAMES
    "n_iter": I4,
    "l0": F8,
    "linf": F8,
    "mu": F8,
    "s": F8,
    "delta": F8,  # l0 - linf
    "l0_se": F8,
    "linf_se": F8,
    "mu_se": F8,
    "s_se": F8,
    "sse": F8,
    "rms": F8,
    "r2": F8,
    # constant and line
    "mean": F8,
    "const_rms": F8,  # RMS about the mean
    "line_intercept": F8,  # l = line_intercept + line_slope * x
    "line_slope": F8,
    # two sigmoids, events ordered mu1 <= mu2; l0 = linf2 + delta1 + delta2
    "status2": I1,
    "n_iter2": I4,
    "linf2": F8,
    "delta1": F8,
    "mu1": F8,
    "s1": F8,
    "delta2": F8,
    "mu2": F8,
    "s2": F8,
    "sse2": F8,
    # comparison and classes
    "bic_constant": F8,
    "bic_line": F8,
    "bic_sigmoid": F8,
    "bic_two_sigmoids": F8,
    "model": I1,  # MODEL_NAMES; -1 where nothing was fitted
    "class_code": I1,  # CLASS_NAMES
    "drop": F8,  # chosen model's loss at x_first minus at x_last
    "aoa": F8,  # Chang et al.'s age of acquisition (x units); NaN without vocab_size
}


def validate_inputs(x: Any, Y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Check and convert the arrays of one call; raise one InputError that says what is wrong.

    x must be 1-D, finite and strictly increasing (log10 of positive axis values: drop step
    0 first); Y must be 2-D [B, K] real numbers with K = len(x). NaN in Y marks a missing point;
    other bad values (inf, negative, huge) are judged per trajectory, not here. A numpy masked
    array's masked points of Y are missing points too (``np.asarray`` alone would hand the fit
    the values under the mask); x has no missing points, so a masked x is refused.
    """
    refuse_masked(x, "x", "leave those columns out of x and Y (or mask Y's points instead)")
    Y_mask = np.ma.getmaskarray(Y) if isinstance(Y, np.ma.MaskedArray) else None
    x_arr = _as_array("x", x)
    Y_arr = _as_array("Y", Y)
    if x_arr.ndim != 1:
        raise InputError(f"x: expected a 1-D array of axis positions, got shape {x_arr.shape}")
    if not _real_dtype(x_arr):
        raise InputError(f"x: expected real numbers, got dtype {x_arr.dtype}")
    if Y_arr.ndim != 2:
        raise InputError(
            f"Y: expected a 2-D array [trajectories, points], got shape {Y_arr.shape}"
        )
    if not _real_dtype(Y_arr):
        raise InputError(f"Y: expected real numbers, got dtype {Y_arr.dtype}")
    if Y_arr.shape[1] != x_arr.shape[0]:
        raise InputError(
            f"Y: expected {x_arr.shape[0]} columns (one per x), got shape {Y_arr.shape}"
        )
    with np.errstate(over="ignore"):  # a value beyond float64 becomes inf: judged below
        x_arr = _converted("x", x_arr, lambda a: a.astype(np.float64))  # a copy, always
        Y_arr = _converted("Y", Y_arr, np.ascontiguousarray, dtype=np.float64)
    if Y_mask is not None and Y_mask.any():
        Y_arr = np.where(Y_mask, np.nan, Y_arr)  # a new array: the caller's data stay as they are
    check_axis(x_arr, "x")
    return x_arr, Y_arr


def _real_dtype(a: np.ndarray) -> bool:
    """Integers or floats. Not bools, complex numbers, objects, nor numpy's timedelta64 (an
    integer kind to ``np.issubdtype``: durations in some unit, not log10 of an axis, and as
    losses meaningless)."""
    return a.dtype.kind in "iuf"


def _as_array(name: str, value: Any) -> np.ndarray:
    """``np.asarray(value)``, or one InputError saying why it is no array (a ragged list, an
    object whose conversion fails); a torch tensor is its values (:func:`tokdyn._checks.host_values`)."""
    return _converted(name, host_values(value), np.asarray)  # a tensor with grad, in bfloat16: its values


def _converted(name: str, value: Any, convert, **kwargs) -> np.ndarray:
    try:
        return convert(value, **kwargs)
    except Exception as err:  # ValueError (ragged), TypeError, OverflowError, a tensor's own
        first = f"{type(err).__name__}: {err}".splitlines()[0][:200]
        expected = ("a 1-D array of axis positions" if name == "x"
                    else "a 2-D array [trajectories, points] of real numbers")
        raise InputError(f"{name}: expected {expected}, got a {type(value).__name__} "
                         f"that numpy cannot convert ({first})") from None


def _on_bound(p, lo, hi, cols) -> np.ndarray:
    """[B] True where a parameter of ``cols`` sits on its bound (to rounding: the solver
    works in ln s, so s comes back through exp(log(bound)))."""
    at = np.zeros(p.shape[0], dtype=bool)
    for c in cols:  # column views: p[:, cols] would copy [B, len(cols)] three times
        pc = p[:, c]
        tol = 1e-12 * (1.0 + np.abs(pc))
        at |= (pc <= lo[:, c] + tol) | (pc >= hi[:, c] - tol)
    return at


def _final_status(lm_status, p, lo, hi, cov_ok, bounded_cols) -> np.ndarray:
    """Solver outcome -> status code. A converged fit on a bound is ``hit_bound`` (even if
    also singular: the bound is the better explanation), else ``singular`` where J^T J is."""
    at_bound = _on_bound(p, lo, hi, bounded_cols)
    converged = lm_status == LM_CONVERGED
    status = np.where(converged, STATUS_CODES["converged"], STATUS_CODES["failed"])
    status = np.where(converged & ~cov_ok, STATUS_CODES["singular"], status)
    return np.where(converged & at_bound, STATUS_CODES["hit_bound"], status)


class _Solver:
    """run_lm with the options and backend of one call."""

    def __init__(self, x: np.ndarray, options: FitOptions, backend: str, device: Any) -> None:
        self.x, self.options, self.backend, self.device = x, options, backend, device

    def __call__(self, model, Y, p0, lo, hi, step_max):
        """Fit from p0 within [lo, hi] (natural parameters); returns run_lm's dict (p, sse,
        se, cov_ok, n_iter, status).

        step_max [B, 2]: variable projection's trust region per row, half a cell of the row's
        start grid in mu and in ln s."""
        o = self.options
        ftol = o.ftol if model == MODEL_SIGMOID else o.ftol_two
        return run_lm(model, self.x, Y, p0, lo, hi, max_iter=o.max_iter, ftol=ftol,
                      xtol=o.xtol, backend=self.backend, device=self.device,
                      step_max=step_max)


# A second sigmoid fit, from the best step, where that step's sum of squares is within this
# fraction of the first fit's (measured on a tiny GPT's probe tokens: the steeper optima that
# the grid start missed were all within 2 % of it).
STEP_RETRY = 0.05


def _fit_sigmoid(solve: _Solver, Y, prep):
    """One sigmoid per row from its own grid's best event; a second try from the best step where
    that step alone fits better; a restart for fits that end on a bound or fail."""
    lo, hi, caps = prep["lo"], prep["hi"], prep["step_max"]
    p0, p_step, sse_step = grid_starts(solve.x, Y, lo, hi, prep["grid_mu"], prep["grid_s"],
                                       solve.backend)
    no_grid = ~np.all(np.isfinite(p0), axis=1)
    p0[no_grid] = prep["p0"][no_grid]  # the data-driven start where no grid event fits
    p0 = np.minimum(np.maximum(p0, lo), hi)
    res = solve(MODEL_SIGMOID, Y, p0, lo, hi, caps)
    # A jump between two checkpoints is a basin of its own that a smooth start may not reach:
    # where the best step alone fits about as well (within STEP_RETRY) or better, fit again
    # from that step and keep the better.
    again = np.flatnonzero(np.isfinite(sse_step) & ~(sse_step > res["sse"] * (1.0 + STEP_RETRY)))
    again = again[np.all(np.isfinite(p_step[again]), axis=1)]
    if again.size:
        _try_again(solve, Y, res, again, np.minimum(np.maximum(p_step[again], lo[again]),
                                                    hi[again]), lo, hi, caps)
    # A fit ending on a bound may have slid into a boundary basin (a sharp step on one noisy
    # point, or an event pushed out of range); try again from a wide, central start.
    at_bound = _on_bound(res["p"], lo, hi, [2, 3])
    again = np.flatnonzero(at_bound | (res["status"] != LM_CONVERGED))
    if again.size:
        first, last = prep["x_first"][again], prep["x_last"][again]
        p_alt = p0[again].copy()
        p_alt[:, 2] = 0.5 * (first + last)
        p_alt[:, 3] = np.clip(0.2 * (last - first), lo[again, 3], hi[again, 3])
        _try_again(solve, Y, res, again, p_alt, lo, hi, caps)
    status = _final_status(res["status"], res["p"], lo, hi, res["cov_ok"], [2, 3])
    return res, res["se"], status


def _try_again(solve: _Solver, Y, res, rows, p_start, lo, hi, caps) -> None:
    """Fit ``rows`` again from p_start; keep the better fit in ``res`` (iterations add up)."""
    alt = solve(MODEL_SIGMOID, Y[rows], p_start, lo[rows], hi[rows], caps[rows])
    total_iter = res["n_iter"][rows] + alt["n_iter"]
    better = alt["sse"] < res["sse"][rows]
    better |= ~np.isfinite(res["sse"][rows]) & np.isfinite(alt["sse"])
    for k in res:
        res[k][rows[better]] = alt[k][better]
    res["n_iter"][rows] = total_iter


def _fit_two_sigmoids(solve: _Solver, Y, p1, prep):
    """Two sigmoids per row, started from the sigmoid fit plus the grid event that best
    explains what it leaves (where none qualifies: the sigmoid split in two halves)."""
    lo, hi = two_sigmoid_bounds(prep["lo"], prep["hi"], drop_bound(prep["span"]))
    p0 = two_sigmoid_start(p1, lo, hi)
    alt = two_starts(solve.x, Y, p1, lo, hi, prep["grid_mu"], prep["grid_s"], solve.backend)
    use = np.all(np.isfinite(alt[:, [2, 3, 5, 6]]), axis=1)
    for j in (2, 3, 5, 6):
        p0[use, j] = alt[use, j]
    if solve.backend != "numba":  # the full-parameter solver also needs amplitudes
        p0[use] = two_sigmoid_amplitudes(solve.x, Y[use], p0[use])
    p0 = np.minimum(np.maximum(np.where(np.isfinite(p0), p0, 0.0), lo), hi)
    res = solve(MODEL_TWO_SIGMOIDS, Y, p0, lo, hi, prep["step_max"])
    # a drop on its bound (MAX_DROP_RANGE) is a fit on a bound too: the data ask for more
    status = _final_status(res["status"], res["p"], lo, hi, res["cov_ok"], [1, 2, 3, 4, 5, 6])
    return res, order_events(res["p"]), status


def _fit_two_where_enough(solve: _Solver, Y, p1, prep, options: FitOptions):
    """Two sigmoids on the rows with at least ``options.min_points_two`` observed points:
    (p2 [B, 7], status2, n_iter2, sse2), NaN and ``too_few_points`` on the others."""
    enough = prep["n"] >= options.min_points_two
    if enough.all():
        res, p2, status = _fit_two_sigmoids(solve, Y, p1, prep)
        return p2, status, res["n_iter"], res["sse"]
    B = Y.shape[0]
    p2, sse = np.full((B, 7), np.nan), np.full(B, np.nan)
    status = np.full(B, STATUS_CODES["too_few_points"], dtype=np.int8)
    n_iter = np.zeros(B, dtype=np.int64)
    sub = np.flatnonzero(enough)
    if sub.size:
        res, p2[sub], status[sub] = _fit_two_sigmoids(solve, Y[sub], p1[sub],
                                                      {k: v[sub] for k, v in prep.items()})
        n_iter[sub], sse[sub] = res["n_iter"], res["sse"]
    return p2, status, n_iter, sse


def fit_block(
    x: Any,
    Y: Any,
    *,
    options: FitOptions | None = None,
    backend: str = "auto",
    device: Any = None,
    out: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Fit every trajectory of one block; return :data:`FIT_FIELDS` as 1-D arrays of length B.

    Parameters
    ----------
    x : array [K]
        log10 of the axis values (finite, strictly increasing).
    Y : array [B, K]
        Token losses in nats; NaN marks a missing point.
    options : FitOptions, optional
    backend, device : see :func:`fit_sigmoids`.
    out : optional dict of every :data:`FIT_FIELDS` name to a writable 1-D array of length B
        and that field's dtype (a view into a larger array is fine): the fields are written
        there, and ``out`` is returned. By default fresh arrays.

    Bad trajectories never raise: each gets a status (and class ``unfit``) instead.
    """
    options = FitOptions() if options is None else FitOptions.from_kwargs(options)
    x, Y = validate_inputs(x, Y)
    backend, device = resolve_backend(backend, device)
    out = _output_fields(Y.shape[0], out)
    # Degenerate rows (denormal or flat data) may overflow or divide by zero on the way;
    # their status says so, so numpy's warnings would only be noise.
    with np.errstate(all="ignore"):
        return _fit_checked_block(x, Y, options, backend, device, out)


def _output_fields(B: int, out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """``out`` checked against :data:`FIT_FIELDS` (InputError where it does not fit), or
    fresh arrays of length B."""
    if out is None:
        return {name: np.empty(B, dtype=dt) for name, dt in FIT_FIELDS.items()}
    if not isinstance(out, dict):
        raise InputError(f"out: expected a dict of FIT_FIELDS arrays, got {type(out).__name__}")
    for name, dt in FIT_FIELDS.items():
        a = out.get(name)
        if not (isinstance(a, np.ndarray) and a.shape == (B,) and a.dtype == dt
                and a.flags.writeable):
            found = "nothing" if a is None else (
                f"{type(a).__name__} {getattr(a, 'shape', '')} {getattr(a, 'dtype', '')}")
            raise InputError(f"out[{name!r}]: expected a writable array of shape ({B},) and "
                             f"dtype {dt}, got {found}")
    return out


def _fit_checked_block(x, Y, options, backend, device, out) -> dict[str, np.ndarray]:
    """fit_block after its arguments are checked: every field of ``out`` written."""
    B = Y.shape[0]
    prep = prepare_rows(x, Y, options, backend)
    n = prep["n"]
    invalid = prep["invalid"]
    out["n_points"][:] = n
    out["x_first"][:], out["x_last"][:] = prep["x_first"], prep["x_last"]
    rows = np.flatnonzero(~invalid & (n >= options.min_points))
    written = {"n_points", "x_first", "x_last"}
    if rows.size:
        _fit_rows(x, Y, rows, prep, options, backend, device, out, written)
    # what no fit wrote: each field's value for a row that was not fitted. The row's data
    # (its observed points and their range) are kept for every row: a token observed too few
    # times is still a scored token (the spectrum divides by them, docs/method.md).
    unfit = np.ones(B, dtype=bool)
    unfit[rows] = False
    for name, dt in FIT_FIELDS.items():
        if name in _DATA_FIELDS or (name in written and rows.size == B):
            continue
        at = unfit if name in written else slice(None)
        if name in ("status", "status2"):
            out[name][at] = np.where(invalid, STATUS_CODES["invalid_input"],
                                     STATUS_CODES["too_few_points"])[at]
        else:
            out[name][at] = _UNFIT.get(name, np.nan if dt.kind == "f" else 0)
    return out


# What a row's data are, whether or not it was fitted.
_DATA_FIELDS = ("n_points", "x_first", "x_last")

# A field's value for a row that was not fitted, where it is not NaN or 0 (the statuses say
# why per row: invalid_input or too_few_points)
_UNFIT = {"model": -1, "class_code": CLASS_CODES["unfit"]}


def _fit_rows(x, Y, rows, prep, options, backend, device, out, written) -> None:
    """Fit the block's ``rows`` (each valid, with enough points) into ``out``, adding the
    names of the fields it wrote to ``written``."""
    B = Y.shape[0]
    if rows.size < B:
        Y = Y[rows]
        prep = {k: v[rows] for k, v in prep.items()}
    nr = prep["n"].astype(np.float64)
    xf, xl = prep["x_first"], prep["x_last"]
    mean, sse_c, sse_l = prep["mean"], prep["sse_const"], prep["sse_line"]
    # each row's start grid and trust region, from its own observed points (tokdyn.fit.grid)
    prep["grid_mu"], prep["grid_s"], prep["step_max"] = start_grids(
        x, Y, s_min_of(x, options), observed=prep["n"])
    solve = _Solver(x, options, backend, device)

    res1, se1, status1 = _fit_sigmoid(solve, Y, prep)
    p1, sse1 = res1["p"], res1["sse"]
    # flat: every observed loss the same (its span 0). Its sum of squares about the mean is then
    # the mean's rounding (1e-30 for most float64 levels), not 0, and gave R^2 = 1 or -5e4.
    has_spread = (sse_c > 0) & (prep["span"] > 0)
    r2 = np.where(has_spread, 1.0 - sse1 / np.where(has_spread, sse_c, 1.0), np.nan)
    # A flat trajectory: R^2 undefined and the event not identified, whatever the solver says.
    status1 = np.where((status1 == STATUS_CODES["converged"]) & ~has_spread,
                       STATUS_CODES["singular"], status1)

    at = slice(None) if rows.size == B else rows  # a slice copies 5x faster than an index

    def put(name: str, values) -> None:
        out[name][at] = values
        written.add(name)

    put("status", status1)
    put("n_iter", res1["n_iter"])
    for j, name in enumerate(("l0", "linf", "mu", "s")):
        put(name, p1[:, j])
        put(name + "_se", se1[:, j])
    put("delta", p1[:, 0] - p1[:, 1])
    put("sse", sse1)
    put("rms", np.sqrt(sse1 / nr))
    put("r2", r2)
    put("mean", mean)
    put("const_rms", np.sqrt(sse_c / nr))
    put("line_intercept", prep["intercept"])
    put("line_slope", prep["slope"])

    bics = np.full((rows.size, 4), np.inf)
    floor = EXACT_FIT_SHARE * sse_c  # exact fits tie (their rounding is no evidence)
    for m, sse in enumerate((sse_c, sse_l, sse1)):
        bics[:, m] = bic(sse, nr, N_PARAMS[m], floor)
    p2 = np.full((rows.size, 7), np.nan)
    if options.two_step:
        p2, status2, n_iter2, sse2 = _fit_two_where_enough(solve, Y, p1, prep, options)
        bics[:, 3] = bic(sse2, nr, N_PARAMS[3], floor)  # +inf where not fitted: never chosen
        put("status2", status2)
        put("n_iter2", n_iter2)
        for j, name in enumerate(("linf2", "delta1", "mu1", "s1", "delta2", "mu2", "s2")):
            put(name, p2[:, j])
        put("sse2", sse2)
    else:
        put("status2", STATUS_CODES["not_fitted"])
    for j, name in enumerate(("bic_constant", "bic_line", "bic_sigmoid", "bic_two_sigmoids")):
        put(name, bics[:, j])

    model = choose_model(bics, options.bic_margin)
    levels = dict(mean=mean, intercept=prep["intercept"], slope=prep["slope"], p1=p1, p2=p2)
    first = model_level(model, xf, **levels)
    last = model_level(model, xl, **levels)
    code = classify(
        model=model, status=status1, level_first=first, level_last=last,
        const_rms=np.sqrt(sse_c / nr), delta=p1[:, 0] - p1[:, 1], mu=p1[:, 2], r2=r2,
        delta1=p2[:, 1], mu1=p2[:, 2], delta2=p2[:, 4], mu2=p2[:, 5],
        x_first=xf, x_last=xl, options=options,
    )
    put("model", model)
    put("class_code", code)
    put("drop", first - last)
    if options.vocab_size is not None:
        put("aoa", age_of_acquisition(*p1.T, xl, options.vocab_size))


class SigmoidFit:
    """Per-trajectory results of :func:`fit_sigmoids`: one 1-D array per :data:`FIT_FIELDS` name.

    Fields are attributes (``fit.mu``, ``fit.status``); ``to_dict()`` gives them all.
    """

    def __init__(self, fields: dict[str, np.ndarray], options: FitOptions) -> None:
        missing = set(FIT_FIELDS) - set(fields)
        if missing:
            raise InputError(f"SigmoidFit: missing fields {sorted(missing)}")
        self._fields = {name: fields[name] for name in FIT_FIELDS}
        self.options = options

    def __getattr__(self, name: str) -> np.ndarray:
        fields = self.__dict__.get("_fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(f"SigmoidFit has no field {name!r}; fields: {list(FIT_FIELDS)}")

    def __len__(self) -> int:
        return len(self._fields["status"])

    def __repr__(self) -> str:
        names, counts = np.unique(self.class_name, return_counts=True)
        classes = ", ".join(f"{k}={v}" for k, v in zip(names, counts))
        return f"SigmoidFit({len(self)} trajectories: {classes})"

    def to_dict(self) -> dict[str, np.ndarray]:
        return dict(self._fields)

    @property
    def status_name(self) -> np.ndarray:
        return _names(self._fields["status"], STATUS_NAMES)

    @property
    def class_name(self) -> np.ndarray:
        return _names(self._fields["class_code"], CLASS_NAMES)

    @property
    def model_name(self) -> np.ndarray:
        return _names(self._fields["model"], {-1: "none", **MODEL_NAMES})

    def class_loss_share(self) -> dict[str, float]:
        """Each class's share of the total loss drop (see :func:`class_loss_share`)."""
        return class_loss_share(self._fields["class_code"], self._fields["drop"])

    def events(self) -> dict[str, np.ndarray]:
        """Learning events for the spectrum: one per sigmoid token, two per multi-step token.

        Returns 1-D arrays ``token`` (row index), ``mu``, ``s``, ``delta``. Tokens whose
        chosen model is a sigmoid contribute their sigmoid; tokens of class ``multi_step``
        contribute both events of the two-sigmoid fit; others contribute none.
        """
        f = self._fields
        multi = f["class_code"] == CLASS_CODES["multi_step"]
        single = (f["model"] >= 2) & ~multi & np.isfinite(f["mu"])
        t1 = np.flatnonzero(single)
        tm = np.flatnonzero(multi)
        return {
            "token": np.concatenate([t1, tm, tm]),
            "mu": np.concatenate([f["mu"][t1], f["mu1"][tm], f["mu2"][tm]]),
            "s": np.concatenate([f["s"][t1], f["s1"][tm], f["s2"][tm]]),
            "delta": np.concatenate([f["delta"][t1], f["delta1"][tm], f["delta2"][tm]]),
        }


def _names(codes: np.ndarray, table: dict[int, str]) -> np.ndarray:
    lookup = np.array([table.get(int(c), "?") for c in range(-1, max(table) + 1)])
    return lookup[np.clip(codes.astype(np.int64), -1, max(table)) + 1]


def fit_sigmoids(
    x: Any,
    Y: Any,
    *,
    backend: str = "auto",
    device: Any = None,
    options: FitOptions | None = None,
    block_rows: int | None = None,
    **overrides: Any,
) -> SigmoidFit:
    """Fit the sigmoid (and the models it is compared with) to every trajectory of Y.

    Parameters
    ----------
    x : array [K]
        log10 of the axis values (step, tokens, parameters), finite and strictly increasing.
    Y : array [B, K]
        Token losses in nats; NaN marks a missing point.
    backend : {"auto", "numba", "numpy", "torch"}
        "auto": numba if installed, else torch on CUDA if visible, else numpy (see
        docs/fitting.md for the measurements behind that order).
    device : torch device for backend "torch" (default: CUDA if available, else CPU).
    options : FitOptions, optional; ``**overrides`` replace single options
        (``fit_sigmoids(x, Y, vocab_size=50304)``).
    block_rows : rows fitted at once (bounds the memory of the temporaries); default 65536,
        or 262144 on a CUDA device.

    Returns
    -------
    SigmoidFit with one array of length B per :data:`FIT_FIELDS` name.
    """
    opts = FitOptions.from_kwargs(options, **overrides)
    x, Y = validate_inputs(x, Y)
    if block_rows is not None:
        if (isinstance(block_rows, (bool, np.bool_)) or not isinstance(block_rows, numbers.Integral)
                or not 1 <= operator.index(block_rows) <= INT64_MAX):
            raise InputError(f"block_rows: expected None or an int in [1, {INT64_MAX}], got "
                             f"{shown(block_rows)}")
        block_rows = int(block_rows)
    backend, device = resolve_backend(backend, device)
    if block_rows is None:
        cuda = backend == "torch" and device.type == "cuda"
        block_rows = 1 << 18 if cuda else 1 << 16
    B = Y.shape[0]
    fields = _output_fields(B, None)
    for start in range(0, max(B, 1), block_rows):  # each block written into its rows
        part = slice(start, start + block_rows)
        fit_block(x, Y[part], options=opts, backend=backend, device=device,
                  out={name: a[part] for name, a in fields.items()})
    return SigmoidFit(fields, opts)
