"""The D and M axes: one run per data budget or model size, arranged into one loss matrix.

Along T a run's own checkpoints are the axis. Along D (data budget, tokens) and M (non-embedding
parameters) every axis point is a separate training run taken to completion; its *final*
checkpoint's per-token losses are one row. :func:`assemble_axis` writes those rows, sorted by
axis value, as a derived run of axis ``D`` or ``M`` (named ``axis-D`` / ``axis-M``) in the same
store, so that fitting (``tokdyn fit``) and reconstruction treat it exactly like a T run. A
``losses.npz`` of axis D or M imported with ``tokdyn import-npz`` is such a run already.

Runs that share an axis value (seeds of one model size) can be averaged into one row
(``repeats="mean"``). :func:`effective_steps` places each point of a D axis on the step axis of
a T run (by tokens seen, or by the area under the learning-rate curve), for rebuilding D from
the events fitted on T (:func:`tokdyn.reconstruct.reconstruct_across`).
"""

from __future__ import annotations

from collections.abc import Sequence

import json
import math
import os
import warnings

import numpy as np

from ._checks import is_finite, log_tie
from ._text import command_line, shown
from .errors import InputError, ProbeMismatchError, RunExistsError, StoreError
from .store import Run, TrajectoryStore, as_store

__all__ = ["AXIS_ATTRS", "AxisWarning", "axis_sources", "assemble_axis", "axis_run_name", "axis_run_problem", "check_same_probe", "find_axis_run", "effective_steps", "lr_area_table", "EFFECTIVE_TIMES", "source_runs"]

# The run attribute that gives each source run's position on the axis.
AXIS_ATTRS = {"D": "data_budget", "M": "n_params_non_embedding"}
MIN_AXIS_RUNS = 3


class AxisWarning(UserWarning):
    """An axis was assembled, but one of its rows needs a caveat (a source's final row with NaN losses)."""


def axis_run_name(axis: str) -> str:
    _check_axis(axis)
    return f"axis-{axis}"


def _check_axis(axis: str) -> None:
    if axis not in AXIS_ATTRS:
        raise InputError(f"axis must be one of {sorted(AXIS_ATTRS)} (T is a run's own checkpoints), got {axis!r}")


def axis_sources(store: TrajectoryStore, axis: str) -> list[str]:
    """The runs of ``store`` that make up axis ``axis`` when none are named.

    Runs tagged ``attrs["sweep"] == axis`` (as ``pipelines/scaling_sweep.py`` tags them) if there
    are any (tagged runs of several model configurations (D) or data budgets (M): two sweeps in
    one store, an error); otherwise the T runs that carry the axis attribute (``data_budget`` or
    ``n_params_non_embedding``) and share everything else that matters: for D the model
    configuration, for M the data budget. Ambiguity is an error that asks for explicit runs.
    """
    _check_axis(axis)
    attr = AXIS_ATTRS[axis]
    runs = []
    for n in store.runs:
        if n.startswith("axis-"):
            continue
        try:
            runs.append(store.run(n))
        except StoreError:  # an interrupted creation or a damaged run: not a candidate
            continue
    def shared(r: Run) -> str:
        return _held_fixed(r, axis)

    tagged: dict[str, list[str]] = {}
    for r in runs:
        if r.attrs.get("sweep") == axis:
            tagged.setdefault(shared(r), []).append(r.name)
    known = {k: v for k, v in tagged.items() if k != repr(None)}  # a run that does not say fits any
    if len(known) > 1:  # two sweeps in one store (another model, another budget): never merged into one axis
        what = "model configurations" if axis == "D" else "data budgets"
        raise InputError(f"runs tagged sweep={axis!r} have {len(known)} different {what}: {list(known.values())}; "
                         "name the runs of one axis")  # fmt: skip
    if tagged:
        return [r.name for r in runs if r.attrs.get("sweep") == axis]
    groups: dict[str, list[str]] = {}
    for r in runs:
        if r.axis != "T" or r.attrs.get(attr) is None or r.n_committed == 0:
            continue
        groups.setdefault(shared(r), []).append(r.name)
    # distinct axis values by what they say as text: an attribute that is a list or a dict (no
    # axis value; assemble_axis names the run) made a set of them fail with "unhashable type"
    usable = [g for g in groups.values() if len({_value_key(store.run(n).attrs[attr]) for n in g}) >= MIN_AXIS_RUNS]
    if len(usable) == 1:
        return usable[0]
    if not usable:
        found = sum(len(g) for g in groups.values())
        raise InputError(
            f"axis {axis} needs at least {MIN_AXIS_RUNS} runs with distinct {attr!r} "
            f"({'same model config' if axis == 'D' else 'same data budget'}); {store.url} has {found} "
            f"candidate run(s). Train more, or name the runs"
        )
    raise InputError(f"several groups of runs could form axis {axis}: {usable}; name the runs to use")


def _value_key(v) -> str:
    """An axis attribute as a hashable key: equal numbers (10 and 10.0) alike, anything else by its repr."""
    return repr(float(v)) if _positive(v) else repr(v)


def assemble_axis(
    store: TrajectoryStore | str,
    axis: str,
    *,
    runs: Sequence[str | Run] | None = None,
    name: str | None = None,
    overwrite: bool = False,
    repeats: str = "refuse",
) -> Run:
    """Write the final rows of ``runs`` as run ``name`` (default ``axis-<axis>``) of axis ``axis``.

    Parameters
    ----------
    store : the store to write into (a path or an open writable store).
    axis : {"D", "M"}
    runs : names of runs of this store, or :class:`Run` objects of any store recorded on the
        same probe; default :func:`axis_sources`. Each needs ``attrs[AXIS_ATTRS[axis]] > 0``.
    overwrite : replace an existing run ``name`` (and its fit).
    repeats : {"refuse", "mean"}
        What runs that share an axis value are: an error (default), or seeds of one point whose
        final rows are averaged token by token (NaN skipped) into one row.

    Rows are sorted by axis value; ``step`` is the row index, ``tokens_seen`` the source's last;
    the losses are stored in the widest of the sources' dtypes.
    Raises InputError for fewer than 3 distinct axis values, (by default) repeated ones, a run
    named twice, ``name`` naming one of the runs, or a final row that is not the run at its ``data_budget`` (where its tokens
    seen are known: :data:`BUDGET_TOLERANCE`); ProbeMismatchError when a source was recorded on
    another probe. Warns (:class:`AxisWarning`) where a source's final row has NaN losses.
    """
    st = as_store(store, mode="r+")
    _check_axis(axis)
    if repeats not in ("refuse", "mean"):
        raise InputError(f"repeats must be 'refuse' or 'mean', got {repeats!r}")
    attr = AXIS_ATTRS[axis]
    name = name or axis_run_name(axis)
    if isinstance(runs, (str, Run)):  # a name alone was read letter by letter ("no run 'd'")
        raise InputError(f"runs must be a list of run names or Run objects, got {runs if isinstance(runs, str) else runs.name!r} alone")
    sources = [st.run(r) if isinstance(r, str) else r for r in (axis_sources(st, axis) if runs is None else runs)]
    if any(not isinstance(r, Run) for r in sources):
        raise InputError("runs must be run names or Run objects")
    for r in sources:
        if r.axis != "T":  # an axis run's last row is its largest scale, not a training run's end
            raise InputError(f"run {r.name!r} is a {r.axis} axis run; the runs of axis {axis} are training (T) runs, "
                             f"each at its own {attr}")  # fmt: skip
        # overwrite=True deleted that source before its final row was read: the run was lost
        if r.name == name and _same_place(r.store.url, st.url):
            raise InputError(f"run {name!r} is one of the runs of axis {axis}; the axis run needs another name "
                             f"(default {axis_run_name(axis)!r})")  # fmt: skip
    if len(sources) < MIN_AXIS_RUNS:
        raise InputError(f"axis {axis} needs at least {MIN_AXIS_RUNS} runs, got {len(sources)}: {[r.name for r in sources]}")
    for i, r in enumerate(sources):  # one run twice would count twice in a mean of seeds, or be "two runs"
        if any(q.name == r.name and _same_place(q.store.url, r.store.url) for q in sources[:i]):
            raise InputError(f"run {r.name!r} of {r.store.url} is named twice among the runs of axis {axis}; name each run once")
    fp = st.probe.fingerprint
    values = []
    for r in sources:
        if r.store.probe.fingerprint != fp or r.n_tokens != st.probe.n_tokens:
            raise ProbeMismatchError(
                f"run {r.name!r} of {r.store.url} was recorded on probe {r.store.probe.fingerprint} "
                f"({r.n_tokens:,} tokens); axis {axis} of {st.url} uses probe {fp} ({st.probe.n_tokens:,} tokens)"
            )
        if r.n_committed == 0:
            raise StoreError(f"run {r.name!r} has no committed rows")
        v = r.attrs.get(attr)
        if not _positive(v):
            raise InputError(f"run {r.name!r} has no positive, finite {attr!r} attribute (found {shown(v)}); it cannot sit on axis {axis}")
        values.append(float(v))
        _check_final_row_at_budget(r)
    fixed = {_held_fixed(r, axis) for r in sources} - {repr(None)}
    if len(fixed) > 1:  # named runs of several models (D) or budgets (M): a second variable moves along the axis
        what = "model configurations" if axis == "D" else "data budgets"
        warnings.warn(f"the runs of axis {axis} have {len(fixed)} different {what}, so the axis varies that too: "
                      f"its derivative is not {attr}'s alone; name runs that share one", AxisWarning, stacklevel=2)  # fmt: skip
    distinct = sorted(set(values))
    if len(distinct) < len(values) and repeats == "refuse":
        dup = next(v for v in distinct if values.count(v) > 1)
        raise InputError(
            f"two runs share {attr} = {dup:g}; an axis needs distinct values, or seeds of one point averaged: "
            "repeats='mean' (`tokdyn reconstruct --axis ... --repeats mean`)"
        )
    if len(distinct) < MIN_AXIS_RUNS:
        raise InputError(f"axis {axis} needs at least {MIN_AXIS_RUNS} distinct {attr} values, got {len(distinct)}")
    tie = log_tie(distinct)  # the fit's own test: two values one log10 apart are one point to it
    if tie is not None:
        a, b = distinct[tie], distinct[tie + 1]
        names = lambda v: ", ".join(repr(r.name) for r, rv in zip(sources, values) if rv == v)  # noqa: E731
        raise InputError(f"runs {names(a)} ({attr} = {a!r}) and {names(b)} ({attr} = {b!r}) are too close to tell apart on "
                         f"a log scale, one point on a fit's log axis: both give log10 = {math.log10(a)!r} in float64, so "
                         f"no fit could use axis {axis} (tokdyn fit refuses it); name runs whose values differ, or leave one "
                         "of them out")  # fmt: skip
    if name in st.runs:
        if not overwrite:
            raise RunExistsError(f"run {name!r} already exists in {st.url}; pass overwrite=True to rebuild it "
                                 f"(`tokdyn reconstruct --axis {axis} --rebuild`)")  # fmt: skip
        _check_replaceable(st, name, axis)
        st.delete_run(name)
    # the widest of the sources' dtypes: the first one's (a float16 run first) rounded every
    # other source's losses to its precision without a word
    dtype = str(np.result_type(*[np.dtype(r.dtype) for r in sources]))
    out = st.create_run(
        name, axis=axis, capacity=len(distinct), dtype=dtype,
        attrs={"sources": [{"store": _absolute(r.store.url), "same_store": _same_place(r.store.url, st.url), "run": r.name,
                            attr: values[i], "n_committed": r.n_committed, "run_id": _run_id(r)} for i, r in enumerate(sources)],
               "axis_attr": attr, "named": runs is not None, "derived": "final committed row of each source run"
               + (", averaged over the runs that share an axis value" if len(distinct) < len(values) else "")},
    )  # fmt: skip
    try:  # a source that cannot be read (a damaged chunk, an interrupt) leaves no partial axis behind
        w = out.writer()
        for k, v in enumerate(distinct):
            group = [r for r, rv in zip(sources, values) if rv == v]
            rows = [r.losses(rows=slice(r.n_committed - 1, r.n_committed))[0] for r in group]
            nan = np.stack([np.isnan(row) for row in rows])  # [seeds, N]
            for j, r in enumerate(group):
                lost = int(np.count_nonzero(nan[j]))
                if lost:  # a diverged run, a lost chunk: said here, where a mean of seeds would hide it
                    # (only where another seed has the loss: "stand in" was said also where every seed missed it)
                    filled = int(np.count_nonzero(nan[j] & ~nan.all(axis=0)))
                    then = ("" if len(group) == 1 else "; the other seeds' losses stand in for all of them" if filled == lost
                            else f"; the other seeds' losses stand in for {filled:,} of them, the rest stay NaN (no seed "
                                 "has them)")  # fmt: skip
                    step = int(r.coord("step")[r.n_committed - 1])
                    warnings.warn(f"run {r.name!r}: {lost:,} of the {r.n_tokens:,} losses of its final row (step "
                                  f"{step:,}) are NaN{then}", AxisWarning, stacklevel=2)  # fmt: skip
            if len(rows) == 1:
                row = rows[0]
            else:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a token NaN in every seed stays NaN
                    row = np.nanmean(np.stack(rows).astype(np.float64), axis=0)
            seen = int(group[0].coord("tokens_seen")[group[0].n_committed - 1])
            w.append(row, step=k, axis_value=v, tokens_seen=seen if seen >= 0 else None, warn_nonfinite=False)
        w.release()
    except BaseException:
        try:
            st.delete_run(name)
        except Exception:  # noqa: BLE001 - the first error is the one to report; a partial run is caught on use
            pass
        raise
    return st.run(name)


def _check_replaceable(st: TrajectoryStore, name: str, axis: str) -> None:
    """``overwrite`` replaces only what an assembly made and can make again: an axis run of
    ``axis`` with its ``sources``. A training run or an imported axis under that name (neither
    can be rebuilt from the store) was deleted by ``--rebuild`` without a word."""
    try:
        old = st.run(name)
        assembled = isinstance(old.attrs.get("sources"), list)
        what = (None if old.axis == axis and assembled else
                f"a training run of axis {old.axis}" if old.axis == "T" else
                f"an axis {old.axis} run assembled from runs" if assembled else
                f"an axis {old.axis} run not assembled from runs (imported)")  # fmt: skip
    except StoreError:  # an interrupted assembly: nothing of use to keep
        return
    if what is not None:
        raise InputError(f"run {name!r} of {st.url} is {what}, which assembling axis {axis} would delete; give the axis "
                         f"run another name, or delete that run first ({command_line('tokdyn delete-run', 'STORE', ('--run', name))}, or "
                         f"tokdyn.open_store(STORE, mode='r+').delete_run({name!r}))")  # fmt: skip


# How far the tokens a source's final row has seen may lie from its data budget (rounding of
# a budget given in rounded tokens, a last partial batch); beyond it the row is not the run at its budget.
BUDGET_TOLERANCE = 0.02


def _final_tokens(r: Run) -> float | None:
    """Tokens seen at ``r``'s final committed row: its ``tokens_seen``, else its step times
    ``attrs["tokens_per_step"]``; None where neither is known."""
    last = r.n_committed - 1
    seen = int(r.coord("tokens_seen")[last])
    if seen >= 0:
        return float(seen)
    tps, step = r.attrs.get("tokens_per_step"), int(r.coord("step")[last])
    if _positive(tps) and step > 0:
        return float(step) * float(tps)
    return None


def _held_fixed(r: Run, axis: str) -> str:
    """What the runs of one axis must share, as a key: the model configuration along D, the
    data budget along M (``'None'`` where the run does not say). Equal values are one key: a
    budget of 1000000 and of 1e6, a configuration's keys in another order (their repr told them
    apart, and one sweep was refused as two)."""
    v = r.attrs.get("model_config") if axis == "D" else r.attrs.get("data_budget")
    return repr(None) if v is None else json.dumps(_canonical(v), sort_keys=True, default=repr)


def _canonical(v):
    """A JSON value with its numbers as floats (10 and 10.0 alike), recursively."""
    if isinstance(v, bool) or not isinstance(v, (int, float, dict, list, tuple)):
        return v
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # an int past 1e308 stays itself
            return v
    if isinstance(v, dict):
        return {str(k): _canonical(x) for k, x in v.items()}
    return [_canonical(x) for x in v]


def _check_final_row_at_budget(r: Run) -> None:
    """A source's final row must be the run at its ``data_budget`` (tokens) where both are known:
    a run stopped early or still being recorded sits on the axis at a budget it has not seen, and
    a budget in steps (or a row in steps) puts it decades away."""
    budget, seen = r.attrs.get("data_budget"), _final_tokens(r)
    if seen is None or not _positive(budget):
        return
    if abs(seen - float(budget)) > BUDGET_TOLERANCE * float(budget):
        step = int(r.coord("step")[r.n_committed - 1])
        raise InputError(
            f"run {r.name!r}: its final row (step {step:,}) has seen {seen:,.0f} tokens, its data_budget is {float(budget):,.0f} tokens: "
            "not the run at its budget (stopped early, still being recorded, or a budget in other units than tokens); "
            "finish it, correct data_budget, or leave it out"
        )


def _run_id(r: Run) -> str | None:
    """The id a run got when it was created (None for runs made before ids): a run deleted and
    recorded again under the same name has another."""
    integrity = r.attrs.get("integrity")
    rid = integrity.get("run_id") if isinstance(integrity, dict) else None
    return rid if isinstance(rid, str) else None


def axis_run_problem(run: Run, axis: str, runs: list[str] | None = None) -> str | None:
    """Why ``run``, found as the run of axis ``axis``, cannot be used as it is (None: it can).

    An assembled axis run (one with ``sources``) is redone when it holds fewer rows than its
    sources have axis values (an assembly that was killed), when ``runs`` names other sources,
    when a source has committed rows since (its final row is another one), was deleted and
    recorded again (another run id, however many rows), or has another axis value, or, for an
    axis assembled from the runs found (no ``runs``), when runs an assembly would take were added
    since (:func:`_added_sources`: a seed for ``repeats="mean"``, another budget). An imported axis
    (a losses.npz, no sources) is used as it is; ``runs`` does not apply to it (an error).
    """
    sources = run.attrs.get("sources")
    if run.axis != axis:
        raise InputError(f"run {run.name!r} holds axis {run.axis}, not {axis}; rename or delete it to use axis {axis}")
    if not isinstance(sources, list):
        if runs is not None:
            raise InputError(f"axis {axis} is run {run.name!r}, imported, not assembled from runs; "
                             f"--runs applies when assembling one (--rebuild)")  # fmt: skip
        return None
    names = [s.get("run") if isinstance(s, dict) else None for s in sources]
    values = {v for v in (s.get(AXIS_ATTRS[axis]) for s in sources if isinstance(s, dict)) if isinstance(v, (int, float))}
    if run.n_committed != len(values):
        return f"it holds {run.n_committed} of its {len(values)} points (an assembly that did not finish)"
    if runs is not None and sorted(runs) != sorted(n for n in names if n is not None):
        return f"it was assembled from {names}, not {list(runs)}"
    if runs is None and run.attrs.get("named") is False and (added := _added_sources(run, axis, names)):
        return f"runs {added} of the axis were added to the store since it was assembled"
    attr = AXIS_ATTRS[axis]
    for s, n in zip(sources, names):
        then = s.get("n_committed") if isinstance(s, dict) else None
        lacks = [key for key in ("n_committed", "run_id") if key not in s] if isinstance(s, dict) else []
        if lacks:
            # assembled before sources recorded their rows (tokdyn before 2026-12-04) or their ids
            # (before 2026-12-05): a source recorded further, or deleted and recorded again, went
            # unseen, and the old axis was used as current without a word
            if _legacy_source_now(run.store, s) is None:  # none to compare: the axis's own rows
                continue
            what = "row count" if "n_committed" in lacks else "id"
            return (f"it was assembled by an earlier tokdyn, which recorded no {what} of its source run {n!r}: "
                    "whether that run changed since cannot be told")  # fmt: skip
        src = _source_now(run.store, s) if then is not None else None
        if src is None:
            continue
        try:
            now, rid, value = src.n_committed, _run_id(src), src.attrs.get(attr)
        except (StoreError, OSError, ValueError):
            continue
        if now != then:
            return f"run {n!r} has {now} rows now, {then} when the axis was assembled"
        if s.get("run_id") is not None and rid != s["run_id"]:  # deleted and recorded again, as many rows
            return f"run {n!r} was recorded again since the axis was assembled (another run of that name now)"
        # as the axis holds them, floats: a data_budget of 2**53 + 1 (held as 2**53) read as changed
        # the moment it was assembled, and every later reconstruct assembled it again
        if _positive(s.get(attr)) and not (_positive(value) and float(value) == float(s[attr])):
            return f"run {n!r} has {attr} {shown(value)} now, {shown(s[attr])} when the axis was assembled"
    return None


def _added_sources(run: Run, axis: str, names: list) -> list[str]:
    """The runs :func:`axis_sources` finds now in ``run``'s store that axis run ``run`` (assembled
    from the runs found then) lacks and that an assembly would take: committed rows, the final
    one at its data budget (a run just created or still training is no point yet). A source gone
    since is not one: the axis run keeps its own copy of each source's final row."""
    try:
        now = axis_sources(run.store, axis)
    except InputError:  # the runs found now are ambiguous: an assembly would say so
        return []
    added = []
    for n in sorted(set(now) - set(names)):
        try:
            r = run.store.run(n)
            if r.n_committed == 0:
                continue
            _check_final_row_at_budget(r)
        except (InputError, StoreError, OSError, ValueError):
            continue
        added.append(n)
    return added


def _source_now(st: TrajectoryStore, source: dict) -> Run | None:
    """The run a ``sources`` entry of an axis run of ``st`` names, as it is now; None where it
    cannot be read (another store moved or gone, the run deleted: the axis run holds its own
    copy of the rows)."""
    name = source.get("run")
    if not isinstance(name, str):
        return None
    try:
        src = _source_store(st, source)
        return src.run(name) if src is not None and name in src.runs else None
    except (StoreError, InputError, OSError, ValueError):
        return None


def _legacy_source_now(st: TrajectoryStore, source: dict) -> Run | None:
    """The run a ``sources`` entry of an older axis (no row count, its store URL as typed then,
    relative to a folder no longer known) may name now: at its URL, else a run of that name in
    the axis's own store (where ``tokdyn reconstruct --axis`` took its runs from); None where
    neither is there (the axis run holds its own copy of the rows)."""
    src = _source_now(st, source)
    name = source.get("run")
    if src is None and isinstance(name, str):
        try:
            src = st.run(name) if name in st.runs else None
        except (StoreError, InputError, OSError, ValueError):
            src = None
    return src


def _source_store(st: TrajectoryStore, source: dict) -> TrajectoryStore | None:
    """The store a ``sources`` entry of an axis run of ``st`` names: ``st`` itself where the
    source was in the axis's own store (``same_store``, or its URL names ``st``), wherever the
    store is now and whichever folder it is read from; else the store at its URL (absolute
    since ``same_store`` was written: a relative one, of an older axis, was read against the
    folder of the moment, and found another store or none)."""
    url = source.get("store")
    if source.get("same_store") is True or (isinstance(url, str) and _same_place(url, st.url)):
        return st
    return as_store(url, mode="r") if isinstance(url, str) else None


def _absolute(url: str) -> str:
    """A store URL that means one place from any working folder (a local path made absolute)."""
    return url if "://" in url else os.path.abspath(url)


def _same_place(a: str, b: str) -> bool:
    """Whether two store URLs name one store: local paths compared resolved (a trailing slash,
    ``..`` or a relative spelling is the same folder), other URLs as written."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def find_axis_run(store: TrajectoryStore, axis: str) -> str | None:
    """The run of ``store`` that holds axis ``axis``: ``axis-<axis>`` if present, else the only
    run whose axis is ``axis`` (an imported losses.npz); None when there is none."""
    _check_axis(axis)
    if axis_run_name(axis) in store.runs:
        return axis_run_name(axis)
    found = [n for n in store.runs if _axis_of(store, n) == axis]
    if len(found) > 1:
        raise InputError(f"several runs of axis {axis} in {store.url}: {found}; pass --run NAME")
    return found[0] if found else None


def _axis_of(store: TrajectoryStore, name: str) -> str | None:
    try:
        return store.run(name).axis
    except StoreError:
        return None


EFFECTIVE_TIMES = ("tokens", "lr_area")


def effective_steps(axis_run: Run, t_run: Run, *, by: str = "tokens") -> np.ndarray:
    """[K] the step of T run ``t_run`` that each point of D axis run ``axis_run`` corresponds to.

    by : {"tokens", "lr_area"}
        ``"tokens"``: the point's ``data_budget`` divided by ``t_run``'s ``tokens_per_step``.
        ``"lr_area"``: the step at which ``t_run``'s area under the learning-rate curve
        (``attrs["lr_area"]``: ``{"step": [...], "area": [...]}`` at its recorded steps) equals the
        point's (``attrs["lr_area"]`` of its source run), linear between recorded steps (exact
        where the T run's learning rate is constant). Areas are in steps at the peak rate
        (Tissue et al. 2024). :func:`tokdyn.sweep.branched_decay_sweep` writes both.

    Steps are floats, in the order of ``axis_run``'s rows. A source without the attribute, or an
    area beyond the T run's last recorded one, is an InputError.
    """
    if by not in EFFECTIVE_TIMES:
        raise InputError(f"by must be one of {EFFECTIVE_TIMES}, got {by!r}")
    if axis_run.axis != "D" or t_run.axis != "T":
        raise InputError(f"need a D axis run and a T run, got {axis_run.name!r} (axis {axis_run.axis}) and {t_run.name!r} (axis {t_run.axis})")
    runs = source_runs(axis_run)
    if by == "tokens":
        tps = t_run.attrs.get("tokens_per_step")
        if not _positive(tps):
            raise InputError(f"T run {t_run.name!r} has no positive, finite 'tokens_per_step' attribute (found {shown(tps)})")
        return np.array([float(r.attrs["data_budget"]) / float(tps) for r in runs])
    steps, area = lr_area_table(t_run)
    missing = [f"{r.name} ({shown(r.attrs.get('lr_area'))})" for r in runs if not _positive(r.attrs.get("lr_area"))]
    if missing:
        raise InputError(f"source runs {missing} have no positive, finite 'lr_area' attribute")
    a = np.array([float(r.attrs["lr_area"]) for r in runs])
    if a.max() > area.max() or a.min() < area.min():
        raise InputError(f"areas {a.min():g}-{a.max():g} fall outside T run {t_run.name!r}'s {area.min():g}-{area.max():g}")
    return np.interp(a, area, steps)


def _positive(v) -> bool:
    """A number (not a bool) that is finite and > 0: an int past 1e308 is none (a float cannot
    hold it; ``math.isfinite`` raised OverflowError on it, an "internal error" of the CLI)."""
    return isinstance(v, (int, float)) and is_finite(v) and v > 0


def lr_area_table(t_run: Run) -> tuple[np.ndarray, np.ndarray]:
    """T run ``t_run``'s ``attrs["lr_area"]`` as ``(steps [P], areas [P])``, checked: finite, as
    many areas as steps, steps increasing, areas not decreasing, and no area above its step
    (areas are in steps at the peak rate: sum of lr / peak). A table the inverse reading would
    misread (reversed: every point at the first step; a NaN: every point NaN) is an InputError."""
    table = t_run.attrs.get("lr_area")
    if not isinstance(table, dict) or "step" not in table or "area" not in table:
        raise InputError(f"T run {t_run.name!r} has no 'lr_area' table ({{'step': [...], 'area': [...]}})")
    try:
        steps, area = np.asarray(table["step"], np.float64), np.asarray(table["area"], np.float64)
    except (TypeError, ValueError):
        raise InputError(f"T run {t_run.name!r}: its 'lr_area' table holds other things than numbers") from None
    where = f"T run {t_run.name!r}: its 'lr_area' table"
    if steps.ndim != 1 or steps.shape != area.shape or steps.size < 2:
        raise InputError(f"{where} needs as many areas as steps, at least 2; found {steps.size} steps and {area.size} areas")
    if not (np.all(np.isfinite(steps)) and np.all(np.isfinite(area))):
        raise InputError(f"{where} holds non-finite values")
    if np.any(np.diff(steps) <= 0) or np.any(np.diff(area) < 0) or area[0] < 0:
        raise InputError(f"{where} needs increasing steps and areas that never fall, from 0 on")
    over = np.flatnonzero(area > steps * (1 + 1e-9) + 1e-9)
    if over.size:
        i = int(over[0])
        raise InputError(f"{where} has area {area[i]:g} at step {steps[i]:g}: more than the step, so not in steps at the "
                         "peak rate (sum of lr / peak)")  # fmt: skip
    return steps, area


def check_same_probe(run: Run, other: Run) -> None:
    """Raise :class:`ProbeMismatchError` unless ``run`` and ``other`` were recorded on one probe
    (the same fingerprint: token ids, their order and the per-token arrays). Runs of one store
    always are; runs of two stores are compared token by token only when this holds."""
    a, b = run.store.probe, other.store.probe
    if run.store is other.store or (a.fingerprint == b.fingerprint and run.n_tokens == other.n_tokens):
        return
    raise ProbeMismatchError(
        f"run {other.name!r} of {other.store.url} was recorded on probe {b.fingerprint} ({other.n_tokens:,} tokens); "
        f"run {run.name!r} of {run.store.url} on probe {a.fingerprint} ({run.n_tokens:,} tokens): not one probe"
    )


def source_runs(axis_run: Run) -> list[Run]:
    """The source run of each row of an axis run made by :func:`assemble_axis` (the first one
    where seeds were averaged), in row order."""
    sources = axis_run.attrs.get("sources")
    if not sources:
        raise InputError(f"run {axis_run.name!r} lists no source runs; it was not assembled by assemble_axis")
    attr = AXIS_ATTRS.get(axis_run.axis)
    if attr is None:
        raise InputError(f"run {axis_run.name!r} is of axis {axis_run.axis}, not an assembled D or M axis")
    by_value: dict[float, Run] = {}
    for src in sources:
        if not isinstance(src, dict) or not _positive(src.get(attr)) or not isinstance(src.get("run"), str):
            raise InputError(f"run {axis_run.name!r}: a source entry lacks its run's name or a positive, finite {attr} ({shown(src)})")
        st = _source_store(axis_run.store, src)
        if st is None:
            raise InputError(f"run {axis_run.name!r}: a source entry names no store ({src!r})")
        by_value.setdefault(float(src[attr]), st.run(src["run"]))
    runs = [by_value.get(float(v)) for v in axis_run.axis_values[: axis_run.n_committed]]
    if any(r is None for r in runs):
        raise InputError(f"run {axis_run.name!r}: a row's {attr} matches none of its sources")
    return runs
