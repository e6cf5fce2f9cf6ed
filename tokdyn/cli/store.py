"""``tokdyn info``, ``import-npz``, ``export-npz`` and ``delete-run``: what a store holds, the
losses.npz format, and removing a run."""

from __future__ import annotations

import argparse
import os
import sys

from .._checks import is_finite, is_real
from .._files import check_output_path
from .._text import command_line, exact, one_line, option_word, visible
from ..errors import InputError, StoreError
from ..interchange import export_npz, import_npz
from ..store import LOSS_DTYPES
from ..fit import FitOptions
from ..fit.options import MIN_FIT_POINTS
from .fit import fit_flags, fit_run_call
from ._common import add_run_argument, add_store_argument, open_cli_run, open_cli_store, print_json, store_path


def register(sub) -> None:
    p = sub.add_parser("info", help="runs, shapes, steps, where each fit stands, probe fingerprint and size of a store")
    add_store_argument(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_info)

    p = sub.add_parser("import-npz", help="import a losses.npz (the paper's format) as a run")
    p.add_argument("input", help="losses.npz")
    p.add_argument("store", help="store (created if missing)")
    p.add_argument("--run", help="run name (default: the file's stem)")
    p.add_argument("--dtype", choices=LOSS_DTYPES, help="storage dtype (default: the file's)")
    p.set_defaults(func=_import_npz)

    p = sub.add_parser("export-npz", help="export a run as a losses.npz")
    add_store_argument(p)
    p.add_argument("output", help="OUT.npz")
    add_run_argument(p, what="the run to export")
    p.set_defaults(func=_export_npz)

    p = sub.add_parser("delete-run", help="remove a run (its losses, coordinates and fit) from a store, damaged or not")
    add_store_argument(p)
    add_run_argument(p, what="the run to delete (always named: never the store's only run by default)", required=True)
    p.set_defaults(func=_delete_run)


def _shown(name: str) -> str:
    """A run name as info prints it: as it is, or quoted with escapes where it holds what would
    split or fake a line (a newline in a name an older version accepted)."""
    return name if name.isprintable() else repr(name)


# What a D or M run's axis values are, as info names them.
AXIS_VALUES = {"D": "data budgets", "M": "model sizes"}


def _info(args: argparse.Namespace) -> int:
    """Exits 1 when a run cannot be read (it is listed with its error)."""
    info = open_cli_store(args.store).info()
    damaged = sorted(name for name, r in info["runs"].items() if "error" in r)
    unreadable = sorted(name for name, r in info["runs"].items() if "error" not in r and _fit_error(r["fit"]))
    if args.json:  # the same exit code as the lines: 1 where a run or its fit cannot be read
        print_json(info)
        return 1 if damaged or unreadable else 0
    p = info["probe"]
    size = info["size_bytes"]
    print(f"store      {visible(info['url'])}")
    print(f"schema     v{info['schema_version']}, " + (f"{size / 1e6:.2f} MB on disk" if size is not None else "size on disk unknown"))
    print(f"probe      {p['fingerprint']}  {p['n_tokens']:,} tokens" + (f" = {p['n_sequences']} x {p['context']}" if p["context"] else " (index-only)"))
    if not info["runs"]:
        print("runs       none")
    for name, r in info["runs"].items():
        if "error" in r:
            print(f"run {_shown(name):<12} ERROR: {visible(r['error'])}")
            continue
        steps, values = r["steps"], r["axis_values"]
        # a T run by its steps; a D or M run by its axis values (its steps are 0, 1, 2, ...)
        span = ("no rows" if not steps else f"steps {steps[0]:,}..{steps[-1]:,}" if r["axis"] == "T"
                else f"{AXIS_VALUES.get(r['axis'], 'axis values')} {values[0]:.4g}..{values[-1]:.4g}")  # fmt: skip
        extra = f", {r['nonfinite_losses']} non-finite losses (NaN)" if r["nonfinite_losses"] else ""
        params = _count(r["attrs"].get("n_params_non_embedding"))
        params = f", {params} non-emb params" if params else ""
        print(f"run {_shown(name):<12} axis {r['axis']}  {r['shape'][0]:,} x {r['shape'][1]:,} {r['dtype']}  {span}{params}{extra}")
        command = command_line("tokdyn fit", args.store, ("--run", name))
        fittable = sum(v > 0 for v in values)  # the rows a fit takes (step 0 has no place on a log axis)
        for line in _fit_lines(command, r["fit"], r["shape"][0], fittable, p["tokenizer"].get("vocab_size")):
            print(f"    {visible(line)}")
    if damaged or unreadable:
        what = [f"{len(damaged)} run(s) cannot be read: {', '.join(map(_shown, damaged))}"] if damaged else []
        what += [f"the fit of {len(unreadable)} run(s) cannot be read: {', '.join(map(_shown, unreadable))}"] if unreadable else []
        print(f"tokdyn info: error: {'; '.join(what)}", file=sys.stderr)
        return 1
    return 0


def _fit_error(fit: dict) -> bool:
    """Whether the fit or the refit of a run's :meth:`FitResults.summary` cannot be read."""
    return any(isinstance(fit.get(k), dict) and "error" in fit[k] for k in ("fit", "refit"))


def _fit_lines(command: str, fit: dict, committed: int, fittable: int, vocab_size=None) -> list[str]:
    """What info says of a run's fit (``run.fit.summary()``): the fit readers read, and a refit
    beside it; each with the command that goes on from where it stands (``committed``: the
    run's committed rows, ``fittable`` of them at a positive axis value; ``vocab_size``: the
    probe's tokenizer's, which a plain ``tokdyn fit`` takes)."""
    lock = fit["lock"]
    running = lock is not None and lock["state"] in ("alive", "unknown", "self")
    host = lock["host"] if running and isinstance(lock.get("host"), str) else "a host it did not name"
    by = (f"process {lock['pid']} on {host}" + (f", since {lock['since']}" if lock.get("since") else "")
          + (" (on another machine: it may have stopped)" if lock["state"] == "unknown" else "")) if running else ""  # fmt: skip
    current, refit = fit["fit"], fit["refit"]
    if current is None:
        return [f"fit   being started by {by}" if running else f"fit   none: {_unfitted(command, fittable)}"]
    lines = [f"fit   {_fit_state(current, command, committed, vocab_size, running, by)}"]
    if refit is not None:  # the lock's holder works on the fit while it is unfinished (a --repair), else on the refit
        repaired = "error" not in current and not current["complete"]
        lines.append(f"refit {_fit_state(refit, command, committed, vocab_size, running and not repaired, by, beside=True)}")
    return lines


def _unfitted(command: str, rows: int) -> str:
    """What fits a run that has no fit, with ``rows`` rows a fit takes: the command, or what the
    run lacks (a fit needs min_points observed points)."""
    least, default = MIN_FIT_POINTS, FitOptions().min_points
    if rows >= default:
        return f"`{command}` fits it"
    has = f"{rows} row{'s' * (rows != 1)} at a positive axis value (the rows a fit takes)"
    if rows >= least:
        return f"the run has {has}, fewer than a fit takes by default ({default}): `{command} --min-points {rows}` fits it"
    return f"the run has {has}; a fit needs {least} at least: record more"


def _fit_state(g: dict, command: str, committed: int, vocab_size, running: bool, by: str, *, beside: bool = False) -> str:
    """One fit group's state (:func:`tokdyn.store.fit._state`) as info says it."""
    window = g.get("axis_min")
    window = f" {option_word('--axis-min', exact(window))}" if is_finite(window) else ""
    options = g.get("options")
    flags, python, missing = fit_flags(options, vocab_size)
    command += window + flags  # the fit's own window and options, as `tokdyn fit` takes them
    if "error" in g:  # with what mends it, where the error does not say it
        return f"ERROR: {g['error']}" + ("" if "`tokdyn fit" in g["error"] else f"; `{command} --refit` fits it again")
    blocks = f"{_number(g['blocks'])} block{'s' * (g['blocks'] != 1)}"
    done = f"{_number(g['blocks_done'])} of {blocks}"
    if not g["complete"]:
        if running:
            return f"being {'written' if beside else 'fitted'} by {by}: {done} done"
        # made on fewer rows than the run has now: a resume is refused (other rows), a refit covers them
        stale = g["n_committed"] != committed
        made = f", made on {_number(g['n_committed'])} of the run's {committed:,} committed rows" if stale else ""
        where = ", beside the fit above (which readers read until it is complete)" if beside else ""
        if not isinstance(options, dict):
            go = f"its record's options are damaged: `{command} --refit` starts it over"
        elif missing or g.get("fit_id") is None:  # the writer redoes such a fit whole (it cannot check its inputs)
            lacks = f" (its record has no {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})" if missing else ""
            go = f"made by an earlier tokdyn{lacks}: `{command}` fits it again whole"
        elif python:  # no command line gives its options
            call = fit_run_call(options, vocab_size, g.get("axis_min"))
            go = (f"made with options set in Python ({', '.join(python)}): {call}"
                  f"{' with refit=True fits every row' if stale else ' resumes it'}; `{command} --refit` starts it over")  # fmt: skip
        elif stale:
            go = f"`{command} --refit` starts it over on every row"
        else:
            go = f"`{command}` resumes it" + ("; --refit starts it over" if beside else "")
        return f"stopped at {done}{made}{where}: {go}"
    if beside:  # complete, and its swap was stopped before it began
        return "complete, not yet in the fit's place (its move was stopped): the next `tokdyn fit` of the run moves it there"
    how = ", ".join(filter(None, [f"{_number(g['rows'])} rows" + (f" (axis >= {exact(g['axis_min'])})" if window else ""),
                                  blocks,
                                  " on ".join(str(v) for v in (g["backend"], g["device"]) if v is not None),
                                  f"{g['seconds']:.1f} s" if is_real(g["seconds"]) else "",
                                  f"finished {g['finished']}" if isinstance(g["finished"], str) else ""]))  # fmt: skip
    if not g["current"]:
        python = (f", or {fit_run_call(options, vocab_size, g.get('axis_min'))} with refit=True, with the options set in "
                  f"Python ({', '.join(python)})" if python and isinstance(options, dict) else "")  # fmt: skip
        return f"complete but stale, made on {_number(g['n_committed'])} committed rows: `{command} --refit` fits the rows since{python} ({how})"
    return f"complete: {how}"


def _number(value) -> str:
    """A count from a fit's record (any JSON value where the record is damaged) for a line."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else one_line(value, 20)


def _count(value) -> str:
    """A parameter count from a run's attributes as info prints it: a whole number with thousands
    separators; any other value (attributes are whatever the recording code gave) as written,
    cut to 40 characters; "" for none."""
    if value is None or value == "" or value is False:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if value else ""
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}" if value else ""
    text = one_line(value)
    text = text if len(text) <= 40 else text[:39] + "…"
    return visible(text)


def _import_npz(args: argparse.Namespace) -> int:
    if args.store.lower().startswith("memory://"):  # the process's own memory: gone when the command exits
        raise InputError(f"{args.store} is a memory:// store, which lives only while this command runs: the imported run "
                         "would be lost when it exits; give a path or a lasting URL (s3://...)")  # fmt: skip
    store = store_path(args.store)  # a folder holding a store (the demo's) as every store command takes it
    local = os.path.expanduser(store)  # as the store's own path is read ('~/new.zarr' given quoted)
    if "://" not in store and not os.path.lexists(local):  # a new local store: its folder must exist, before any work
        check_output_path(local, what="store", folder_ok=True)
    run = import_npz(args.input, store, run=args.run, dtype=args.dtype)
    print(f"imported {_shown(args.input)} as run {run.name!r} (axis {run.axis}, {run.n_committed} x {run.n_tokens:,}) "
          f"into {_shown(store)}")  # fmt: skip
    return 0


def _export_npz(args: argparse.Namespace) -> int:
    out = export_npz(open_cli_run(args.store, args.run), args.output)
    print(f"wrote {_shown(str(out))}")
    return 0


def _delete_run(args: argparse.Namespace) -> int:
    st = open_cli_store(args.store, mode="r+")
    link = st.linked_run(args.run)
    try:
        run = st.run(args.run)
        held = f"{run.n_committed:,} rows x {run.n_tokens:,} tokens" + (", fitted" if run.fit.exists else "")
    except StoreError as exc:  # a damaged run: deleted all the same (what it is said first)
        held = f"damaged: {exc}" if link is None or os.path.exists(link) else f"a link to {link}, which is not there"
    if link is not None and os.path.exists(link):
        held += f"; a link to {link}, which is left as it is"
    st.delete_run(args.run)
    print(f"deleted run {_shown(args.run)} from {visible(st.url)} ({visible(held)})")
    return 0
