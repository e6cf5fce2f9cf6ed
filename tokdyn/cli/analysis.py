"""``tokdyn spectrum``, ``reconstruct`` and ``report``: what a fitted run's learning events rebuild."""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from .._text import labels, visible
from ..analysis import axis_run, run_spectrum
from ..errors import InputError
from ..reconstruct import reconstruct_run
from ..spectrum import BOOT_MIN_RESAMPLES, GROUP_MIN_EVENTS, MAX_BOOT, POWER_LAW_R2
from ..report import check_writable, write_report
from ._common import add_run_argument, add_store_argument, number, open_cli_run, print_json, shown, store_path


def register(sub) -> None:
    p = sub.add_parser("spectrum", help="learning-time spectrum of a fitted run, with its power law")
    add_store_argument(p)
    add_run_argument(p, what="a fitted run")
    p.add_argument("--by", choices=("class", "domain", "frequency", "position"), help="also the spectrum of each group of tokens")
    _analysis_options(p)
    p.set_defaults(func=_spectrum)

    p = sub.add_parser("reconstruct", help="measured vs rebuilt -dL/dlog a of a run (T) or of the D or M axis")
    add_store_argument(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--run", metavar="NAME", help="a fitted run of any axis (default: the store's only run)")
    which.add_argument("--axis", choices=("D", "M"), help="the store's D or M axis (assembled from its runs and fitted if needed)")
    p.add_argument("--runs", help="with --axis: comma-separated runs forming the axis (default: found from run metadata)")
    p.add_argument("--rebuild", action="store_true", help="with --axis: assemble and fit the axis again")
    p.add_argument("--repeats", choices=("refuse", "mean"), default="refuse",
                   help="with --axis: runs sharing an axis value (seeds) are an error (default) or averaged token by token")
    p.add_argument("--curves", action="store_true", help="with --json: include the curves and the spectrum")
    p.add_argument("--smoothing", type=number, metavar="DECADES",
                   help="width of the local quadratics that measure -dL/dlog10 a from the mean loss, decades (default: "
                        "1.5x the median spacing of the log axis, at least 1.25x its mean spacing)")
    _analysis_options(p)
    p.set_defaults(func=_reconstruct)

    p = sub.add_parser("report", help="one self-contained HTML report of a store's fitted runs")
    add_store_argument(p)
    p.add_argument("--out", default="report.html", help="output HTML file (default: report.html)")
    p.add_argument("--run", action="append", metavar="NAME", help="a run to include (repeatable; default: every fitted run)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="the probe's tokenizer (a tokenizer.json, or a local HF tokenizer folder holding one), so the "
                        "report shows token text; byte-level probes need none")  # fmt: skip
    p.set_defaults(func=_report)


def _analysis_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", default="two_step", choices=("two_step", "bic", "classified"),
                   help="which fitted sigmoids make the sum (default: two_step; see docs/method.md)")
    p.add_argument("--bandwidth", default="auto", type=_bandwidth,
                   help="spectrum bandwidth: auto (= events), events, widths, silverman, or decades (default: auto)")
    p.add_argument("--kernel", default="event", choices=("event", "delta"),
                   help="each event's shape in the spectrum: its own sigmoid's derivative (default), or a step at its "
                        "learning time (the delta approximation: learning times alone)")
    p.add_argument("--placement", default="mu", choices=("mu", "seen"),
                   help="with --kernel delta: where an event's seen drop sits, at its learning time (default) or the centre of its seen part")
    p.add_argument("--boot", type=int, default=200,
                   help=f"bootstrap resamples for the spectrum exponent's 95 %% interval, 0 to {MAX_BOOT:,} (default: 200; "
                        f"fewer than {BOOT_MIN_RESAMPLES} give no interval)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _check_boot(n: int) -> None:
    """--boot from 0 to MAX_BOOT, refused before any work: the library's refusal of another was
    caught as "no power law", and the spectrum's went missing without a word."""
    if not 0 <= n <= MAX_BOOT:
        raise InputError(f"--boot must be an int from 0 to {MAX_BOOT:,}, got {n}")


def _bandwidth(text: str) -> str | float:
    try:
        return float(text)
    except ValueError:
        return text  # a rule name; the library checks it


def _spectrum(args: argparse.Namespace) -> int:
    _check_boot(args.boot)
    run = open_cli_run(args.store, args.run)
    res = run_spectrum(run, which=args.events, bandwidth=args.bandwidth, n_boot=args.boot, placement=args.placement,
                       kernel=args.kernel, by=args.by)
    if args.json:
        print_json(res.to_dict())
        return 0
    rec, spec = res.reconstruction, res.reconstruction.spectrum
    print(f"run {run.name!r} (axis {rec.axis}): {spec.n_events:,} events of {spec.n_tokens:,} tokens ({args.events}), "
          f"drop seen {spec.total_drop:.3f} nats/token, bandwidth {_decades(spec.bandwidth)} decades")  # fmt: skip
    for line in _histogram_lines(spec):
        print(line)
    if res.by is not None:
        for line in _group_lines(res.by, res.groups, spec):
            print(line)
        if res.no_events:  # not even in the small groups' line
            k = len(res.no_events)
            print(f"  no events in {k:,} {res.by}{'s' * (k != 1)} (no fitted step in {'their' if k != 1 else 'its'} tokens' losses, "
                  f"or no loss at all): {', '.join(labels(res.no_events[:8]))}{', ...' if k > 8 else ''}")  # fmt: skip
    for what, pl in (("spectrum", rec.spectrum_power_law), ("loss", rec.loss_power_law)):
        if pl is None:
            print(f"power law of the {what:<8} none: {getattr(rec, f'{what}_power_law_why') or 'the fit was refused'}")
            continue
        verdict = "" if pl.r2 >= POWER_LAW_R2 else f"  (not a power law: R^2 below {POWER_LAW_R2:g})"
        if np.isfinite(pl.alpha_lo) and np.isfinite(pl.alpha_hi):
            units = f" over {pl.params['n_units']:,} {pl.params['resampled']}" if "resampled" in pl.params else ""
            ci = f" [{pl.alpha_lo:.3f}, {pl.alpha_hi:.3f}]{units}"
        else:
            ci = f" (no 95 % interval: {pl.params.get('alpha_ci95_why') or 'not finite'})"
        print(f"power law of the {pl.what:<8} alpha = {pl.alpha:.3f}{ci}  R^2 {pl.r2:.3f}{verdict}")
    return 0


def _group_lines(by: str, groups: dict, spec) -> list[str]:
    """The ``--by`` table, and a line for the events of the groups it leaves out (fewer than
    :data:`GROUP_MIN_EVENTS` each): they were left out without a word, and where every group was
    that small, ``--by`` printed nothing at all."""
    n_out = spec.n_events - sum(g.n_events for g in groups.values())
    drop_out = spec.total_drop - sum(g.total_drop for g in groups.values())
    if not groups:
        return [f"by {by}: no group has {GROUP_MIN_EVENTS} events or more, so none has a spectrum of its own "
                f"(all {spec.n_events:,} events are in smaller groups)"]  # fmt: skip
    out = [f"by {by}: drop seen (nats/token; < 0: the loss rose), x of the peak (largest |rho|), events"]
    # names as the other commands show them: a newline in a domain's name printed a row of its own
    shown = dict(zip(groups, labels(groups)))
    for label, g in sorted(groups.items(), key=lambda kv: -kv[1].total_drop):
        out.append(f"  {shown[label]:<28} {g.total_drop:8.3f}   x {_peak_x(g):6.2f}   {g.n_events:,}")
    if n_out > 0:
        out.append(f"  {'(groups of < ' + str(GROUP_MIN_EVENTS) + ' events)':<28} {drop_out:8.3f}   not shown   {n_out:,}")
    return out


def _decades(h: float) -> str:
    """A bandwidth as printed: 3 decimals, or 3 significant digits where it is huge (--bandwidth
    1e300 printed 300 digits)."""
    return f"{h:.3f}" if h < 1000 else f"{h:.3g}"


def _peak_x(spec) -> float:
    """Where a spectrum changes the loss fastest: the x of its largest |rho| (a group whose loss
    rose, such as forgotten tokens, has rho < 0 throughout, and its argmax was a point where rho
    is nearly 0, far from its rise)."""
    return float(spec.x[np.argmax(np.abs(spec.density))])


# The most histogram lines `tokdyn spectrum` prints: more bins are merged for printing (--json has every bin).
HIST_LINES = 40


def _histogram_lines(spec) -> list[str]:
    """The spectrum's histogram as at most :data:`HIST_LINES` lines: adjacent bins merged in
    equal groups where there are more (a bandwidth of 0.001 decades made 3,000 bins), each line
    the merged bins' drop per decade, with a line saying so."""
    edges, hist = np.asarray(spec.edges), np.asarray(spec.hist)
    n = hist.size
    group = -(-n // HIST_LINES)  # ceil
    out = []
    if group > 1:
        starts = np.arange(0, n, group)
        widths = np.diff(edges)
        hist = np.add.reduceat(hist * widths, starts) / np.add.reduceat(widths, starts)  # drop per decade of each group
        edges = np.append(edges[starts], edges[-1])
        out.append(f"  histogram of {n:,} bins of {float(np.diff(spec.edges).mean()):.3g} decades, shown {group} bins a line "
                   f"({hist.size} lines; every bin: --json)")  # fmt: skip
    peak = np.abs(hist).max() or 1.0  # the bars are the histogram's (a wide bandwidth flattens the density below it)
    for lo, hi, v in zip(edges[:-1], edges[1:], hist):
        # a bin where the loss rose (rho < 0: forgotten tokens) gets a bar of "-" as long as its |rho|,
        # not none: it read as a bin where nothing happened
        out.append(f"  x {lo:6.2f}..{hi:6.2f}  {v:8.3f} nats/decade  " + ("#" if v >= 0 else "-") * int(round(40 * abs(v) / peak)))
    if (hist < 0).any():
        out.append("  (bars of '#': the loss fell there; of '-': it rose, rho < 0)")
    return out


def _reconstruct(args: argparse.Namespace) -> int:
    _check_boot(args.boot)
    if args.smoothing is not None and not (math.isfinite(args.smoothing) and args.smoothing > 0):  # before any assembly or fit
        raise InputError(f"--smoothing must be a positive, finite number of decades, got {shown(args.smoothing)}")
    if args.curves and not args.json:  # the text has no curves: ignored, as --runs without --axis is not
        raise InputError("--curves adds the curves to the --json output: pass --json too")
    if args.axis:
        found = axis_run(store_path(args.store), args.axis, runs=_run_names(args.runs), rebuild=args.rebuild,
                         repeats=args.repeats)
        run = found.run
        if found.assembled:
            again = "" if found.why is None else f" again ({found.why})"
            print(f"assembled run {run.name!r}{again}: final rows of {[s['run'] for s in run.attrs['sources']]}", file=sys.stderr)
        if found.fitted:
            print(f"fitted run {run.name!r}", file=sys.stderr)
    else:
        given = [flag for flag, on in (("--runs", args.runs is not None), ("--rebuild", args.rebuild), ("--repeats", args.repeats != "refuse")) if on]
        if given:
            raise InputError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to an axis: pass --axis D or --axis M")
        run = open_cli_run(args.store, args.run)
    rec = reconstruct_run(run, which=args.events, bandwidth=args.bandwidth, n_boot=args.boot, placement=args.placement,
                          kernel=args.kernel, smoothing=args.smoothing)
    if args.json:
        print_json(rec.to_dict() if args.curves else rec.summary())
        return 0
    s = rec.summary()
    print(f"run {run.name!r} (axis {rec.axis}): {s['n_points']} points, {s['n_tokens']:,} tokens, {s['n_events']:,} events ({args.events})")
    if s.get("rows_left_out"):
        print(f"  {s['rows_left_out']}")
    print(f"  measured -dL/dlog10 a by local quadratics {s['smoothing']:.4g} decades wide"
          f"{'' if args.smoothing is not None else ' (the default; --smoothing sets it)'}")
    print(f"  R^2 of -dL/dlog10 a  sum of sigmoids {s['r2_events']:.3f}   spectrum alone {s['r2_spectrum']:.3f}")
    print(f"  relative L2 error    sum of sigmoids {s['rel_l2_events']:.3f}   spectrum alone {s['rel_l2_spectrum']:.3f}")
    if np.isfinite(s["drop_share_events"]):
        what = "loss rise (the mean loss rose)" if rec.mean_loss_rose else "loss drop"
        print(f"  {what} carried by events {s['drop_share_events']:.1%}, by well-fitted events {s['drop_share_well_fitted']:.1%}")
    else:
        print(f"  no shares of the loss drop: {_no_share_reason(rec)}")
    print("       x   measured   sigmoids   spectrum")
    for row in zip(rec.x, rec.measured, rec.from_events, rec.from_spectrum):
        print("  " + "  ".join(f"{v:8.3f}" for v in row))
    return 0


def _run_names(text: str | None) -> list[str] | None:
    """``--runs a,b,c`` as names, spaces around each dropped. An empty ``--runs ""`` used to mean
    "every run found from metadata" without a word, and ``a,,b`` or ``a, b`` asked for runs
    '' and ' b'."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not any(names):
        raise InputError("--runs names no run; give the runs of the axis, comma-separated (or leave --runs out to find them)")
    if not all(names):
        raise InputError(f"--runs {text!r} has an empty name between commas; give the runs of the axis, comma-separated")
    return names


def _no_share_reason(rec) -> str:
    """Why a reconstruction has no drop shares (:class:`tokdyn.reconstruct.Reconstruction`)."""
    m = rec.mean_loss[np.isfinite(rec.mean_loss)]
    net = float(m[0] - m[-1]) if m.size else float("nan")
    return (f"the mean loss did not clearly fall or rise (net fall {net:+.3f} nats over a range of "
            f"{float(m.max() - m.min()) if m.size else float('nan'):.3f}), so they would mean nothing")


def _report(args: argparse.Namespace) -> int:
    check_writable(args.out)  # before any work
    tokenizer = None
    if args.tokenizer:
        from ..store import open_store
        from ..tokenizer import HFTokenizer

        recorded = open_store(store_path(args.store), mode="r").probe.tokenizer
        eot = recorded.get("eot", "auto") if recorded.get("kind") == "hf" else "auto"  # the end-of-text the probe was made with
        given = HFTokenizer.from_file(args.tokenizer, eot=None).spec()
        if given["sha256"] != recorded.get("sha256"):  # another tokenizer: said as such, not as a missing end-of-text token
            theirs = (f"{recorded.get('kind')}, sha256 {str(recorded['sha256'])[:12]}" if recorded.get("sha256")
                      else "byte-level, which the report decodes itself: leave --tokenizer out" if recorded.get("kind") == "byte"
                      else "none: an imported probe without token ids, nothing to decode" if not recorded.get("kind")
                      else f"{recorded.get('kind')}, with no tokenizer file recorded")  # fmt: skip
            raise InputError(f"the tokenizer given ({args.tokenizer}, sha256 {given['sha256'][:12]}) is not the probe's ({theirs})")
        tokenizer = HFTokenizer.from_file(args.tokenizer, eot=eot)
    out = write_report(store_path(args.store), args.out, runs=args.run or None, tokenizer=tokenizer)
    print(visible(f"wrote {out}"))
    return 0
