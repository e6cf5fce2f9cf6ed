"""``tokdyn curriculum`` (learnability tables and mixture schedules from a fitted pilot run) and
``tokdyn compare`` (the per-token learning-time shift between two runs).

::

    tokdyn curriculum build pilot.zarr --run pilot --out learnability.npz
    tokdyn curriculum show learnability.npz
    tokdyn curriculum schedule pilot.zarr --run pilot --steps 600 --out mixture.json
"""

from __future__ import annotations

import argparse
import math
import os

from .._checks import is_real
from .._files import check_output_path
from .._text import labels, visible
from ..errors import InputError
from ._common import Given, number, print_json, shown, store_path

__all__ = ["register", "add_cli_arguments", "run_cli"]


def register(sub) -> None:
    p = sub.add_parser("curriculum", help="learnability model and training-data weights from a fitted pilot run")
    add_cli_arguments(p)
    p.set_defaults(func=run_cli)
    p = sub.add_parser("compare", help="per-token learning-time shift between two fitted runs on one probe")
    add_compare_arguments(p)
    p.set_defaults(func=run_compare)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="curriculum_command", required=True, metavar="ACTION")
    p = sub.add_parser("build", help="learnability table (.npz) from a pilot run fitted with `tokdyn fit`")
    p.add_argument("store", help="store holding the pilot run (its probe drawn from the training pool)")
    p.add_argument("--run", required=True, help="the pilot run")
    p.add_argument("--out", required=True, help="output file (.npz)")
    p.add_argument("--order", type=int, default=3, help="longest key: the token and its order-1 preceding tokens (1-3, default 3)")
    p.add_argument("--min-count", type=int, default=5, help="keys of order >= 2 seen fewer times back off (default 5)")
    p.add_argument("--prior", type=number, default=5.0, help="shrinkage toward the shorter key, in pseudo-occurrences (default 5)")
    p.add_argument("--holdout", type=number, default=0.2, help="fraction of pilot sequences held out for the check (default 0.2; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="chooses the held-out sequences (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("schedule", help="domain-mixture schedule (.json) from a fitted pilot whose probe is labelled by domain; prints its enrichment")
    p.add_argument("store", help="store holding the pilot run (probe windows of the training pool, labelled by domain)")
    p.add_argument("--run", required=True, help="the pilot run")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps of the run the schedule is for (1 to 10,000,000)")
    p.add_argument("--out", required=True, help="output file (.json)")
    p.add_argument("--floor", type=number, default=0.3, help="share of each step's weight kept at the baseline mixture (default 0.3)")
    p.add_argument("--temperature", type=number, default=1.0, help="rates are raised to 1/T (default 1)")
    p.add_argument("--width", type=number, default=0.2, help="smoothing of each learning event, decades (default 0.2)")
    p.add_argument("--lead", type=number, default=0.0, help="decades to look ahead (default 0)")
    p.add_argument("--time-scale", type=number, default=1.0, help="pilot steps per training step (default 1)")
    p.add_argument("--base", type=number, nargs="+", help="baseline mixture, one weight per domain in the probe's order, rescaled to sum to 1 (default equal)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("show", help="what a learnability table holds and how well it predicted held-out pilot tokens")
    p.add_argument("table", help="a .npz written by `tokdyn curriculum build`")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _option_checks() -> dict:
    """What each numeric option of the curriculum actions must be: ``dest: (words, test)``."""
    from ..curriculum.learnability import MAX_ORDER
    from ..curriculum.mixture import MAX_MIXTURE_STEPS

    finite = math.isfinite
    return {
        "order": (f"an integer from 1 to {MAX_ORDER}", lambda v: 1 <= v <= MAX_ORDER),
        "min_count": ("an integer >= 1", lambda v: v >= 1),
        "seed": ("an integer >= 0", lambda v: v >= 0),
        "steps": (f"an integer from 1 to {MAX_MIXTURE_STEPS:,} (a schedule holds a row of weights per step)",
                  lambda v: 1 <= v <= MAX_MIXTURE_STEPS),
        "prior": ("a finite number >= 0", lambda v: finite(v) and v >= 0),
        "holdout": ("a fraction in [0, 1)", lambda v: 0 <= v < 1),
        "floor": ("a share in [0, 1]", lambda v: 0 <= v <= 1),
        "temperature": ("a finite number > 0", lambda v: finite(v) and v > 0),
        "width": ("a finite number of decades >= 0", lambda v: finite(v) and v >= 0),
        "lead": ("a finite number of decades", finite),
        "time_scale": ("a finite number > 0", lambda v: finite(v) and v > 0),
    }  # fmt: skip


def check_options(args: argparse.Namespace) -> None:
    """Refuse, before any work, a numeric option of a curriculum action outside its range: one
    :class:`InputError` naming the option and echoing the value given."""
    for dest, (words, ok) in _option_checks().items():
        v = getattr(args, dest, None)
        if v is not None and not ok(v):
            raise InputError(f"--{dest.replace('_', '-')} must be {words}, got {shown(v)}")
    base = getattr(args, "base", None)
    if base is not None and not (all(math.isfinite(w) and w >= 0 for w in base) and 0 < sum(base) < math.inf):
        raise InputError(f"--base must be finite weights >= 0 with a positive (finite) sum, got {' '.join(shown(w) for w in base)}")
    for dest, v in list(vars(args).items()):  # plain floats from here on (into configs, JSON and files)
        if isinstance(v, Given):
            setattr(args, dest, float(v))
    if base is not None:
        args.base_text = " ".join(shown(w) for w in base)
        args.base = [float(w) for w in base]


# what each writing action's --out must end with, and what it holds (for its messages)
OUTPUTS = {"build": (".npz", "learnability table"), "schedule": (".json", "mixture schedule")}


def run_cli(args: argparse.Namespace) -> int:
    from ..curriculum.learnability import LearnabilityOptions, build_table, load_table

    check_options(args)
    if args.curriculum_command in OUTPUTS:  # the output path, before any work (its folder is never created)
        suffix, what = OUTPUTS[args.curriculum_command]
        if os.path.splitext(str(args.out))[1] != suffix:  # as the writers check it: 'dir/.npz' has no suffix
            raise InputError(f"--out must name a {suffix} file, got {args.out}")
        check_output_path(args.out, what=what)
    if args.curriculum_command == "schedule":
        return _schedule(args)
    if args.curriculum_command == "build":
        opts = LearnabilityOptions(order=args.order, min_count=args.min_count, prior=args.prior,
                                   holdout=args.holdout, seed=args.seed)  # fmt: skip
        table = build_table(store_path(args.store), args.run, options=opts)
        path = table.save(args.out)
        _print(table, args.json, header=f"wrote {path}")
        return 0
    _print(load_table(args.table), args.json, header=f"learnability table {args.table}")
    return 0


def _print(table, as_json: bool, *, header: str) -> None:
    info = {"vocab_size": table.vocab_size, "order": table.order, "n_keys": table.n_keys, "mu_global": table.mu_global,
            "delta_global": table.delta_global, **table.meta}  # fmt: skip
    if as_json:
        print_json(info)
        return
    pilot = table.meta.get("pilot") if isinstance(table.meta.get("pilot"), dict) else {}
    # the header's path and the table's own metadata (the writer's JSON, a pilot store's name) are
    # shown with every character visible: a newline in a name printed a line of its own
    print(visible(header))
    print(f"  tokenizer   {visible(table.meta.get('tokenizer', {}))}")
    print(f"  pilot       run {visible(repr(pilot.get('run')))} of {visible(pilot.get('store'))}: {pilot.get('n_tokens')} tokens, "
          f"{pilot.get('n_events')} events, x {_num(pilot.get('x_first'), '.2f')}..{_num(pilot.get('x_last'), '.2f')}")  # fmt: skip
    print(f"  keys        {table.n_keys} (orders 1..{table.order}); global mu {table.mu_global:.3f}, delta {table.delta_global:.3f} nats")
    v = table.validation
    if not isinstance(v, dict):
        print("  held-out    no check (holdout 0)")
        return
    print(f"  held-out    {v.get('n_tokens')} tokens ({v.get('n_tokens_with_event')} with an event)")
    print(f"    mu        rank corr {_num(v.get('mu_spearman'))}, MAE {_num(v.get('mu_mae'))} decades "
          f"(global mean: {_num(v.get('mu_mae_global'))})")  # fmt: skip
    print(f"    delta     rank corr {_num(v.get('delta_spearman'))}, MAE {_num(v.get('delta_mae'))} nats "
          f"(global mean: {_num(v.get('delta_mae_global'))})")  # fmt: skip
    level = v.get("level_share") if isinstance(v.get("level_share"), dict) else {}
    shares = ", ".join(f"{'global' if k == '0' else 'order ' + str(k)} {_num(s, '.0%')}" for k, s in level.items())
    print(f"    answered  {shares or '?'}")


def _num(v, spec: str = ".3f") -> str:
    """``v`` formatted by ``spec``; ``?`` for a value that is not a number (a table's metadata is
    the writer's JSON)."""
    if not is_real(v):  # an int past 1e308 has no float format either
        return "?"
    return format(v, spec)


def _schedule(args: argparse.Namespace) -> int:
    import numpy as np

    from ..curriculum.mixture import DomainRates, MixtureConfig, MixtureSchedule, enrichment_verdict, pilot_events

    pe = pilot_events(store_path(args.store), args.run)
    if len(pe.domains) < 2:  # a probe naming two domains with tokens of one: from_events names the other
        raise InputError(f"the pilot's probe holds one domain ({pe.domains[0] if pe.domains else 'unlabelled'}); "
                         "a mixture schedule needs a probe of two or more labelled domains (tokdyn.curriculum.mixture_probe)")  # fmt: skip
    cfg = MixtureConfig(total_steps=args.steps, floor=args.floor, temperature=args.temperature, width=args.width,
                        lead=args.lead, time_scale=args.time_scale)  # fmt: skip
    rates = DomainRates.from_events(pe.events, pe.token_domain, pe.domains, width=args.width)
    base = None
    if args.base is not None:
        if len(args.base) != len(pe.domains):  # each weight was checked by check_options
            raise InputError(f"--base needs {len(pe.domains)} weights, one per domain {list(pe.domains)}, got "
                             f"{len(args.base)}: {args.base_text}")  # fmt: skip
        base = np.asarray(args.base, np.float64) / sum(args.base)
    sched = MixtureSchedule(rates, cfg, base=base)
    path = sched.save(args.out)
    e = sched.enrichment()
    if args.json:
        print_json({"out": path, "domains": list(sched.domains), "enrichment": {k: v for k, v in e.items() if k != "per_step"},
                    "verdict": enrichment_verdict(e)})  # fmt: skip
        return 0
    print(visible(f"wrote {path}"))
    print(f"  {visible(enrichment_verdict(e))}")
    if not e["baseline_rate"] > 0 and e["n_fed"] >= 2:
        print(f"  {_no_drop_detail(sched, pe.events.x_range)}")
    for s in sorted(s for s in {0, 9, args.steps // 10, args.steps // 3, args.steps - 1} if 0 <= s < args.steps):
        print(f"  step {s + 1:>6}: " + ", ".join(f"{d} {w:.2f}" for d, w in zip(labels(sched.domains), sched.weights(s))))
    return 0


def _no_drop_detail(sched, x_range) -> str:
    """Where the pilot's drops lie and where the schedule's steps do, when they do not meet."""
    r = sched.rates
    falling = r.x[(r.rates[:, sched.base > 0] > 0).any(axis=1)]  # of the domains the schedule feeds
    xs = sched.config.xs()
    seen = (f"the pilot's domains fall at x {_x(falling[0])}..{_x(falling[-1])}" if falling.size
            else f"the pilot saw no domain's loss fall (x {_x(x_range[0])}..{_x(x_range[1])})")  # fmt: skip
    return (f"{seen} (x = log10 pilot step); the schedule's steps 1..{sched.config.total_steps}, with --time-scale "
            f"{sched.config.time_scale:g} and --lead {sched.config.lead:g}, are x {_x(xs[0])}..{_x(xs[-1])}")


def _x(v: float) -> str:
    """An x (log10 step) for a message: 2 decimals, or 3 digits when huge (--lead 1e300)."""
    return f"{v:.2f}" if abs(v) < 1e6 else f"{v:.3g}"


# -- tokdyn compare ---------------------------------------------------------------------------


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", help="store holding both runs (one probe)")
    parser.add_argument("--run", action="append", required=True, metavar="NAME", help="give twice: --run A --run B (shift = B - A)")
    parser.add_argument("--tolerance", type=number, default=0.05, help="decades a token must move to count as earlier/later (default 0.05)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run_compare(args: argparse.Namespace) -> int:
    from ..compare import compare_runs

    if len(args.run) != 2:
        raise InputError(f"give exactly two runs (--run A --run B), got {len(args.run)}")
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise InputError(f"--tolerance must be a finite number of decades >= 0, got {shown(args.tolerance)}")
    res = compare_runs(store_path(args.store), args.run[0], args.run[1], tolerance=float(args.tolerance))
    if args.json:
        print_json(res)
        return 0
    print(f"learning-time shift of {res['run_b']!r} against {res['run_a']!r} (decades; < 0: learned earlier), "
          f"{res['overall']['n_tokens']} of {res['n_probe_tokens']} tokens with an event in both"
          f"{' seen whole over the range both observed' if res['censored']['n_tokens'] else ''}")  # fmt: skip
    n_a, n_b = (res["n_learned"][r] for r in (res["run_a"], res["run_b"]))
    print(f"  learned (a step in the loss, falling inside the range) in {res['run_a']!r}: {n_a}, in {res['run_b']!r}: "
          f"{n_b}; a token learned in one run only has no shift")  # fmt: skip
    ranges = res["x_ranges"]
    if len({tuple(v) for v in ranges.values()}) > 1:
        lo, hi = res["x_range"]
        print(f"  over the {res['axis']} range both runs observed, log10 {lo:.3g}..{hi:.3g} "
              f"({', '.join(f'{k!r} observed {v[0]:.3g}..{v[1]:.3g}' for k, v in ranges.items())})")  # fmt: skip
    cens = res["censored"]
    if cens["n_tokens"]:
        cut = cens["cut_in"]
        print(f"  censored (not in the shifts): {cens['n_tokens']} tokens learned in both, {cens['drop_share']:.1%} of the "
              f"drop in {res['run_a']!r}, whose drop that range cuts in one run, which saw it past the range's edge "
              f"(in {res['run_a']!r}: {cut[res['run_a']]}, in {res['run_b']!r}: {cut[res['run_b']]})")  # fmt: skip
    print(f"  {'group':<24} {'tokens':>7} {'median':>8} {'q25':>8} {'q75':>8} {'earlier':>8} {'drop moved earlier':>19} {'later':>7}")
    rows = [("all", res["overall"])] + [(f"class {k}", v) for k, v in res["by_class"].items()] + \
           [(f"domain {k}", v) for k, v in zip(labels(res["by_domain"]), res["by_domain"].values())]  # fmt: skip
    for name, s in rows:
        if s.get("n_tokens"):
            print(f"  {name:<24} {s['n_tokens']:>7} {s['median_shift']:>+8.3f} {s['q25']:>+8.3f} {s['q75']:>+8.3f} "
                  f"{s['share_earlier']:>8.1%} {s['drop_share_earlier']:>19.1%} {s['drop_share_later']:>7.1%}")  # fmt: skip
        elif name.startswith("domain "):  # a domain of the probe none of whose tokens is compared
            print(f"  {name:<24} {0:>7}   (no token of it learned in both runs and compared)")
    if not res["has_domains"]:
        print("  (no rows by domain: the probe does not label its tokens by domain)")
    return 0
