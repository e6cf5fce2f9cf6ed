"""``tokdyn info``, ``import-npz``, ``export-npz`` and ``delete-run``: what a store holds, the
losses.npz format, and removing a run."""

from __future__ import annotations

import argparse
import sys

from .._text import one_line, visible
from ..errors import InputError, StoreError
from ..interchange import export_npz, import_npz
from ..store import LOSS_DTYPES
from ._common import add_run_argument, add_store_argument, open_cli_run, open_cli_store, print_json, store_path


def register(sub) -> None:
    p = sub.add_parser("info", help="runs, shapes, steps, probe fingerprint and size of a store")
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
    if args.json:
        print_json(info)
        return 1 if damaged else 0
    p = info["probe"]
    size = info["size_bytes"]
    print(f"store      {visible(info['url'])}")
    print(f"schema     v{info['schema_version']}" + (f", {size / 1e6:.2f} MB on disk" if size is not None else ""))
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
    if damaged:
        print(f"tokdyn info: error: {len(damaged)} run(s) cannot be read: {', '.join(map(_shown, damaged))}", file=sys.stderr)
        return 1
    return 0


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
    try:
        run = st.run(args.run)
        held = f"{run.n_committed:,} rows x {run.n_tokens:,} tokens" + (", fitted" if run.fit.exists else "")
    except StoreError as exc:  # a damaged run: deleted all the same (what it is said first)
        held = f"damaged: {exc}"
    st.delete_run(args.run)
    print(f"deleted run {_shown(args.run)} from {visible(st.url)} ({visible(held)})")
    return 0
