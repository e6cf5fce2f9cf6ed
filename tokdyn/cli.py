"""The ``tokdyn`` command line: parse, call the library, print.

Every command exits 0 on success, 1 on an input or store error (one line on stderr, no
traceback) and 2 on a usage error (argparse).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

import numpy as np

from . import __version__
from .errors import TokdynError

__all__ = ["main", "build_parser"]


def _cmd_info(args: argparse.Namespace) -> int:
    from .store import open_store

    info = open_store(args.store, mode="r").info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    p = info["probe"]
    size = info["size_bytes"]
    print(f"store      {info['url']}")
    print(f"schema     v{info['schema_version']}" + (f", {size / 1e6:.2f} MB on disk" if size is not None else ""))
    print(f"probe      {p['fingerprint']}  {p['n_tokens']:,} tokens" + (f" = {p['n_sequences']} x {p['context']}" if p["context"] else " (index-only)"))
    if not info["runs"]:
        print("runs       none")
    for name, r in info["runs"].items():
        if "error" in r:
            print(f"run {name:<12} ERROR: {r['error']}")
            continue
        steps = r["steps"]
        span = f"steps {steps[0]}..{steps[-1]}" if steps else "no rows"
        extra = f", {r['nonfinite_losses']} non-finite losses (NaN)" if r["nonfinite_losses"] else ""
        params = r["attrs"].get("n_params_non_embedding")
        params = f", {params:,} non-emb params" if params else ""
        print(f"run {name:<12} axis {r['axis']}  {r['shape'][0]} x {r['shape'][1]:,} {r['dtype']}  {span}{params}{extra}")
    return 0


def _cmd_import_npz(args: argparse.Namespace) -> int:
    from .interchange import import_npz

    run = import_npz(args.input, args.store, run=args.run, dtype=args.dtype)
    print(f"imported {args.input} as run {run.name!r} (axis {run.axis}, {run.n_committed} x {run.n_tokens:,}) into {args.store}")
    return 0


def _cmd_export_npz(args: argparse.Namespace) -> int:
    from .interchange import export_npz

    out = export_npz(args.store, args.output, run=args.run)
    print(f"wrote {out}")
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    from .fit import FitOptions
    from .fit.job import fit_run

    options = FitOptions(two_step=not args.no_two_step, **({"vocab_size": args.vocab_size} if args.vocab_size else {}))
    res = fit_run(args.store, args.run, options=options, backend=args.backend, device=args.device, scheduler=args.scheduler,
                  workers=args.workers, batch_rows=args.batch_rows, refit=args.refit, progress=not args.no_progress)  # fmt: skip
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"fitted run {res['run']!r}: {res['n_tokens']:,} tokens on {res['n_points']} points, "
          f"{res['blocks_fitted']} blocks fitted, {res['blocks_resumed']} already done, "
          f"{res['seconds']:.1f} s ({res['backend']}, {res['scheduler']})")  # fmt: skip
    total = sum(res["class_counts"].values())
    for name, count in sorted(res["class_counts"].items(), key=lambda kv: -kv[1]):
        share = res["class_loss_share"].get(name, float("nan"))
        print(f"  {name:<16} {count:>9,} tokens ({count / total:6.1%})  {share:7.1%} of the loss drop")
    return 0


def _bandwidth(text: str) -> str | float:
    try:
        return float(text)
    except ValueError:
        return text  # a rule name; the library checks it


def _cmd_spectrum(args: argparse.Namespace) -> int:
    from .reconstruct import reconstruct_run

    rec = reconstruct_run(args.store, args.run, which=args.events, bandwidth=_bandwidth(args.bandwidth), n_boot=args.boot,
                          placement=args.placement)  # fmt: skip
    spec = rec.spectrum
    out = {"run": args.run, "axis": rec.axis, "bandwidth": spec.bandwidth, "n_events": spec.n_events,
           "n_tokens": spec.n_tokens, "total_drop": spec.total_drop, "x_range": list(spec.x_range),
           "spectrum_power_law": rec.spectrum_power_law.to_dict() if rec.spectrum_power_law else None,
           "loss_power_law": rec.loss_power_law.to_dict() if rec.loss_power_law else None}  # fmt: skip
    groups = {}
    if args.by:
        from .analysis import analyze_run

        by = analyze_run(args.store, args.run, which=args.events, bandwidth=spec.bandwidth, n_boot=0).by_group
        if args.by not in by:
            raise TokdynError(f"--by {args.by}: the probe has no {args.by} information (available: {', '.join(by)})")
        groups = by[args.by]
    if args.json:
        print(json.dumps({**out, "spectrum": spec.to_dict(), **({"by": args.by, "groups": {k: g.to_dict() for k, g in groups.items()}}
                                                                  if args.by else {})}, indent=2))  # fmt: skip
        return 0
    print(f"run {args.run!r} (axis {rec.axis}): {spec.n_events:,} events of {spec.n_tokens:,} tokens ({args.events}), "
          f"drop seen {spec.total_drop:.3f} nats/token, bandwidth {spec.bandwidth:.3f} decades")  # fmt: skip
    peak = np.abs(spec.density).max() or 1.0
    for lo, hi, v in zip(spec.edges[:-1], spec.edges[1:], spec.hist):
        print(f"  x {lo:6.2f}..{hi:6.2f}  {v:8.3f} nats/decade  " + "#" * int(round(40 * max(v, 0) / peak)))
    if groups:
        print(f"by {args.by}: drop seen (nats/token), learning time of the peak (x), events")
        for label, g in sorted(groups.items(), key=lambda kv: -kv[1].total_drop):
            print(f"  {label:<28} {g.total_drop:8.3f}   x {g.x[np.argmax(g.density)]:6.2f}   {g.n_events:,}")
    for pl in (rec.spectrum_power_law, rec.loss_power_law):
        if pl is not None:
            print(f"power law of the {pl.what:<8} alpha = {pl.alpha:.3f} [{pl.alpha_lo:.3f}, {pl.alpha_hi:.3f}]  R^2 {pl.r2:.3f}")
    return 0


def _cmd_reconstruct(args: argparse.Namespace) -> int:
    from .reconstruct import reconstruct_run

    run = args.run
    if args.axis:
        run = _axis_run(args)
    rec = reconstruct_run(args.store, run, which=args.events, bandwidth=_bandwidth(args.bandwidth), n_boot=args.boot,
                          placement=args.placement)  # fmt: skip
    if args.json:
        print(json.dumps(rec.to_dict() if args.curves else rec.summary(), indent=2))
        return 0
    s = rec.summary()
    print(f"run {run!r} (axis {rec.axis}): {s['n_points']} points, {s['n_tokens']:,} tokens, {s['n_events']:,} events ({args.events})")
    print(f"  R^2 of -dL/dlog10 a  sum of sigmoids {s['r2_events']:.3f}   spectrum alone {s['r2_spectrum']:.3f}")
    print(f"  relative L2 error    sum of sigmoids {s['rel_l2_events']:.3f}   spectrum alone {s['rel_l2_spectrum']:.3f}")
    print(f"  loss drop carried by events {s['drop_share_events']:.1%}, by well-fitted events {s['drop_share_well_fitted']:.1%}")
    print("       x   measured   sigmoids   spectrum")
    for row in zip(rec.x, rec.measured, rec.from_events, rec.from_spectrum):
        print("  " + "  ".join(f"{v:8.3f}" for v in row))
    return 0


def _axis_run(args: argparse.Namespace) -> str:
    """The run holding axis D or M: found, or assembled from the store's runs and fitted."""
    from .axes import assemble_axis, find_axis_run
    from .fit.job import fit_run
    from .store import open_store

    st = open_store(args.store, mode="r")
    name = None if args.rebuild else find_axis_run(st, args.axis)
    if name is None:
        st = open_store(args.store, mode="r+")
        runs = args.runs.split(",") if args.runs else None
        run = assemble_axis(st, args.axis, runs=runs, overwrite=args.rebuild)
        name = run.name
        print(f"assembled run {name!r}: final rows of {[s['run'] for s in run.attrs['sources']]}", file=sys.stderr)
    try:
        from .fit.job import read_fit

        read_fit(st, name, fields=("status",))
    except TokdynError:
        fit_run(args.store, name, progress=False, refit=True)
        print(f"fitted run {name!r}", file=sys.stderr)
    return name


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import check_writable, write_report

    check_writable(args.out)  # before any work
    out = write_report(args.store, args.out, runs=args.run or None)
    print(f"wrote {out}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.out, steps=args.steps, n_points=args.points, device=args.device, seed=args.seed,
             n_probe_sequences=args.probe_sequences, progress=not args.no_progress)  # fmt: skip
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokdyn", description="Token-level training dynamics analyzer.")
    parser.add_argument("--version", action="version", version=f"tokdyn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="train the tiny GPT on the standard library with the recorder attached")
    p.add_argument("--out", default="tokdyn-demo", help="output folder (default: tokdyn-demo)")
    p.add_argument("--steps", type=int, default=800, help="training steps (default: 800)")
    p.add_argument("--points", type=int, default=40, help="log-spaced recording points (default: 40)")
    p.add_argument("--probe-sequences", type=int, default=128, help="probe sequences of 128 tokens (default: 128)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("info", help="runs, shapes, steps, probe fingerprint and size of a store")
    p.add_argument("store")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("fit", help="fit a learning event to every token of a run (dask over token blocks)")
    p.add_argument("store")
    p.add_argument("--run", required=True)
    p.add_argument("--scheduler", help="threads (default), processes, sync, or tcp://HOST:PORT of a dask cluster")
    p.add_argument("--workers", type=int, help="local workers (default: one per core)")
    p.add_argument("--backend", default="auto", choices=("auto", "numba", "numpy", "torch"))
    p.add_argument("--device", help="torch device for --backend torch (e.g. cuda)")
    p.add_argument("--batch-rows", type=int, default=16384, help="tokens fitted at once inside a block")
    p.add_argument("--refit", action="store_true", help="discard a stored fit and fit again")
    p.add_argument("--no-two-step", action="store_true", help="skip the two-sigmoid fit (about 8x faster; no multi-step class)")
    p.add_argument("--vocab-size", type=int, help="vocabulary size for the age of acquisition (default: the probe's tokenizer)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_fit)

    def analysis_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--events", default="two_step", choices=("two_step", "bic", "classified"),
                       help="which fitted sigmoids make the sum (default: two_step; see docs/method.md)")
        p.add_argument("--bandwidth", default="auto",
                       help="spectrum bandwidth: auto (= events), events, widths, silverman, or decades (default: auto)")
        p.add_argument("--placement", default="mu", choices=("mu", "seen"),
                       help="where an event's seen drop sits in the spectrum: its learning time (default) or the centre of its seen part")
        p.add_argument("--boot", type=int, default=200, help="bootstrap resamples for the exponent's interval (default: 200)")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("spectrum", help="learning-time spectrum of a fitted run, with its power law")
    p.add_argument("store")
    p.add_argument("--run", required=True)
    p.add_argument("--by", choices=("class", "domain", "frequency", "position"), help="also the spectrum of each group of tokens")
    analysis_options(p)
    p.set_defaults(func=_cmd_spectrum)

    p = sub.add_parser("reconstruct", help="measured vs rebuilt -dL/dlog a of a run (T) or of the D or M axis")
    p.add_argument("store")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="a fitted run (any axis)")
    which.add_argument("--axis", choices=("D", "M"), help="the store's D or M axis (assembled from its runs and fitted if needed)")
    p.add_argument("--runs", help="with --axis: comma-separated runs forming the axis (default: found from run metadata)")
    p.add_argument("--rebuild", action="store_true", help="with --axis: assemble and fit the axis again")
    p.add_argument("--curves", action="store_true", help="with --json: include the curves and the spectrum")
    analysis_options(p)
    p.set_defaults(func=_cmd_reconstruct)

    p = sub.add_parser("report", help="one self-contained HTML report of a store's fitted runs")
    p.add_argument("store")
    p.add_argument("--out", default="report.html", help="output HTML file (default: report.html)")
    p.add_argument("--run", action="append", help="a run to include (repeatable; default: every fitted run)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("import-npz", help="import a losses.npz (the paper's format) as a run")
    p.add_argument("input", help="losses.npz")
    p.add_argument("store", help="store (created if missing)")
    p.add_argument("--run", help="run name (default: the file's stem)")
    p.add_argument("--dtype", choices=("float32", "float16", "float64"), help="storage dtype (default: the file's)")
    p.set_defaults(func=_cmd_import_npz)

    p = sub.add_parser("export-npz", help="export a run as a losses.npz")
    p.add_argument("store")
    p.add_argument("output", help="OUT.npz")
    p.add_argument("--run", required=True)
    p.set_defaults(func=_cmd_export_npz)

    # Commands whose arguments live with their stage: the module gives add_cli_arguments(parser)
    # and run_cli(args).
    for name, module, help_ in _STAGE_COMMANDS:
        p = sub.add_parser(name, help=help_)
        try:
            mod = importlib.import_module(module, __package__)
        except ImportError as exc:  # pragma: no cover - only when an optional dependency is missing
            p.set_defaults(func=lambda a, exc=exc: _missing(exc))
        else:
            mod.add_cli_arguments(p)
            p.set_defaults(func=mod.run_cli)
    return parser


_STAGE_COMMANDS = (
    ("record-offline", ".record.offline.cli", "evaluate the probe on every checkpoint in a folder"),
    ("curriculum", ".curriculum.cli", "learnability model and training-data weights from a fitted pilot run"),
)


def _missing(exc: ImportError) -> int:
    raise TokdynError(f"this command needs a package that is not installed: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (TokdynError, OSError, ImportError) as exc:  # input, store, disk and missing-package errors
        print(f"tokdyn {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tokdyn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
