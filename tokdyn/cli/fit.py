"""``tokdyn fit``: a learning event per token of a run (dask over token blocks, resumable)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import math

from .._checks import is_finite, is_int
from .._process import terminate_as_interrupt
from .._text import exact, one_line
from ..fit import FitOptions, fit_run
from ..fit.models import unfit_reasons
from ..errors import InputError, StoreError
from ..store.fit import fit_flags as store_fit_flags
from ._common import add_run_argument, add_store_argument, at_least, open_cli_run, print_json


def register(sub) -> None:
    p = sub.add_parser("fit", help="fit a learning event to every token of a run (dask over token blocks)")
    add_store_argument(p)
    add_run_argument(p, what="the run to fit")
    p.add_argument("--scheduler", help="threads (default), processes, sync, or tcp://HOST:PORT of a dask cluster")
    p.add_argument("--workers", type=int, help="local workers (default: one per core)")
    p.add_argument("--backend", default="auto", choices=("auto", "numba", "numpy", "torch"), help="the solver's backend (default: auto)")
    p.add_argument("--device", help="torch device for --backend torch (e.g. cuda)")
    p.add_argument("--batch-rows", type=int, default=16384, help="tokens fitted at once inside a block (default: 16384)")
    p.add_argument("--refit", action="store_true", help="fit again from scratch (a complete stored fit is kept, and read, until the new one is complete)")
    p.add_argument("--repair", action="store_true",
                   help="check every fitted block against its checksums (reads the whole fit) and fit the damaged ones again")
    p.add_argument("--no-two-step", action="store_true", help="skip the two-sigmoid fit (about 8x faster; no multi-step class)")
    p.add_argument("--min-points", type=int, metavar="N",
                   help="fewest observed points a token needs to be fitted (default 6, at least 5)")
    p.add_argument("--axis-min", type=float, metavar="VALUE",
                   help="fit only the rows at axis values >= VALUE (a step, tokens or parameters), e.g. the end of the warm-up")
    p.add_argument("--vocab-size", type=int, help="vocabulary size for the age of acquisition (default: the probe's tokenizer)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_fit)


def _fit(args: argparse.Namespace) -> int:
    if args.refit and args.repair:
        raise InputError("--refit fits every block again, --repair only the damaged ones: give one of them")
    options = _options(args)  # the options checked before the store is opened, each named as typed
    run = open_cli_run(args.store, args.run, mode="r+")
    try:
        with terminate_as_interrupt():  # a SIGTERM (preemption) lets go of the fit lock, as a Ctrl-C does
            res = fit_run(run, options=options, backend=args.backend, device=args.device, scheduler=args.scheduler,
                          workers=args.workers, batch_rows=args.batch_rows, refit=args.refit, repair=args.repair,
                          progress=not args.no_progress, axis_min=args.axis_min)  # fmt: skip
    except OSError as exc:  # a read-only store: its fit lock cannot be taken, even to find the fit done
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and exc.filename and not (args.refit or args.repair) \
                and _readable(run):  # fmt: skip
            from . import _unwritable

            raise StoreError(f"{_unwritable(exc)}; the fit of run {run.name!r} is complete already: `tokdyn info`, "
                             "`tokdyn report` and `tokdyn spectrum` read it without writing") from None  # fmt: skip
        raise
    if args.json:
        print_json(res.summary())
        return 0
    print(f"fitted run {res.run!r}: {res.n_tokens:,} token{'s' * (res.n_tokens != 1)} on {res.n_points} points"
          f"{'' if args.axis_min is None else f' (axis values >= {exact(args.axis_min)})'}, "
          f"{res.blocks_fitted} block{'s' * (res.blocks_fitted != 1)} fitted, {res.blocks_resumed} already done, "
          f"{res.seconds:.1f} s ({res.backend}, {res.scheduler})")  # fmt: skip
    if res.blocks_repaired:  # a resume that found blocks marked done but damaged
        k = len(res.blocks_repaired)
        print(f"  fitted again: {k} block{'s' * (k != 1)} marked done whose stored results were damaged "
              f"(block{'s' * (k != 1)} {', '.join(map(str, res.blocks_repaired[:8]))}{', ...' if k > 8 else ''})")
    if res.rows_left_out:  # which rows the point count leaves out, and why (step 0, --axis-min)
        print(f"  {res.rows_left_out}")
    for line in (res.missing_losses or "").splitlines():  # rows of a diverged run, tokens whose loss turned NaN
        print(f"  {line}")
    if res.n_rows_committed_since:  # a recorder appended while this ran: said now, not first by the next reader
        k = res.n_rows_committed_since
        print(f"  not covered: {k:,} row{'s' * (k != 1)} the run committed while this fit ran; the fit is already stale: "
              f"refit to include {'them' if k != 1 else 'it'} (--refit)")  # fmt: skip
    total = sum(res.class_counts.values())  # the scored tokens, as the report counts them (padding apart, below)
    drops = res.class_drops  # shares, or nats where they would mean nothing
    for name, count in sorted(res.class_counts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<16} {count:>9,} token{'s' * (int(count) != 1)} ({count / total:6.1%})  {drops.describe(name)}")
        kinds = drops.multi_step_kinds_text() if name == "multi_step" else ""  # two drops, or a drop and a rise
        if kinds:
            print(f"    {kinds}")
    if not drops.meaningful:
        print(f"  no shares of the loss drop: {drops.reason}, so they would mean nothing")
    for why in unfit_reasons(res.status_counts, options):  # what "unfit" stands for here
        print(f"  unfit: {why}")
    if res.n_unscored:  # padding: no loss at any fitted row, so in no class, no share and no mean above
        k = res.n_unscored
        # a loss recorded NaN or inf at every point is stored as padding is: the store cannot tell them apart
        print(f"  not in the classes above: {k:,} of the {res.n_tokens:,} probe tokens with no recorded loss "
              f"(padding, never recorded, or NaN or inf at every point){' in the fitted rows' if res.axis_min is not None else ''}")
    return 0


def _readable(run) -> bool:
    """Whether the readers read the fit of ``run`` as it is (complete, on the committed rows)."""
    try:
        return run.fit.complete and run.fit.refusal(run.fit.meta) is None
    except Exception:  # noqa: BLE001 - a record that cannot be read: no fit to point at
        return False


def _options(args: argparse.Namespace) -> FitOptions:
    """The fit's options from the command line; a value out of range is one line naming its
    option (``--min-points 3: ...``), not the library's parameter (``FitOptions.min_points``)."""
    for option, value in (("--workers", args.workers), ("--batch-rows", args.batch_rows)):
        at_least(option, value, 1)
        if value is not None and value >= 2**63:  # the library's limit, said in the option's name
            raise InputError(f"{option} must be an integer from 1 to {2**63 - 1}, got {value}")
    if args.axis_min is not None and not math.isfinite(args.axis_min):
        raise InputError(f"--axis-min must be a finite number (an axis value such as a step), got {args.axis_min}")
    given = {}
    for name, option in (("vocab_size", "--vocab-size"), ("min_points", "--min-points")):
        value = getattr(args, name)
        if value is None:
            continue
        try:
            FitOptions(**{name: value})
        except InputError as exc:
            why = str(exc).split(": ", 1)[-1].replace("None or ", "")  # "expected an int >= 5, got 3"
            raise InputError(f"{option} {value}: {why}") from None
        given[name] = value
    return FitOptions(two_step=not args.no_two_step, **given)


def fit_flags(options, vocab_size=None) -> tuple[str, dict, list]:
    """:func:`tokdyn.store.fit.fit_flags` against every option's default (FitOptions'): the flags
    that give a fit's options, those no flag sets, and those its record lacks."""
    return store_fit_flags(options, vocab_size, dataclasses.asdict(FitOptions()))


def fit_run_call(options, vocab_size=None, axis_min=None) -> str:
    """The Python call that resumes a fit made with ``options`` (its record's) and window
    ``axis_min``: ``fit_run(run, options=FitOptions(max_iter=50, two_step=False), axis_min=10)``,
    naming each option that is not its default (nor the probe's ``vocab_size``)."""
    plain = dataclasses.asdict(FitOptions())
    if is_int(vocab_size) and vocab_size > 0:
        plain["vocab_size"] = int(vocab_size)
    given = ", ".join(f"{k}={one_line(repr(v), 40)}" for k, v in sorted(options.items(), key=lambda kv: str(kv[0]))
                      if v != plain.get(k))  # fmt: skip
    window = f", axis_min={exact(axis_min)}" if is_finite(axis_min) else ""
    return f"fit_run(run{f', options=FitOptions({given})' if given else ''}{window})"

