"""``tokdyn curriculum``: build a learnability table from a fitted pilot run, or show one.

::

    tokdyn curriculum build pilot.zarr --run pilot --out learnability.npz
    tokdyn curriculum show learnability.npz
"""

from __future__ import annotations

import argparse
import json

from ..errors import InputError

__all__ = ["add_cli_arguments", "run_cli"]


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="curriculum_command", required=True, metavar="ACTION")
    p = sub.add_parser("build", help="learnability table (.npz) from a pilot run fitted with `tokdyn fit`")
    p.add_argument("store", help="store holding the pilot run (its probe drawn from the training pool)")
    p.add_argument("--run", required=True, help="the pilot run")
    p.add_argument("--out", required=True, help="output file (.npz)")
    p.add_argument("--order", type=int, default=3, help="longest key: the token and its order-1 preceding tokens (1-3, default 3)")
    p.add_argument("--min-count", type=int, default=5, help="keys of order >= 2 seen fewer times back off (default 5)")
    p.add_argument("--prior", type=float, default=5.0, help="shrinkage toward the shorter key, in pseudo-occurrences (default 5)")
    p.add_argument("--holdout", type=float, default=0.2, help="fraction of pilot sequences held out for the check (default 0.2; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="chooses the held-out sequences")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("show", help="what a learnability table holds and how well it predicted held-out pilot tokens")
    p.add_argument("table", help="a .npz written by `tokdyn curriculum build`")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run_cli(args: argparse.Namespace) -> int:
    from .learnability import LearnabilityOptions, build_table, load_table

    if args.curriculum_command == "build":
        if not str(args.out).endswith(".npz"):
            raise InputError(f"--out must name a .npz file, got {args.out}")
        opts = LearnabilityOptions(order=args.order, min_count=args.min_count, prior=args.prior,
                                   holdout=args.holdout, seed=args.seed)  # fmt: skip
        table = build_table(args.store, args.run, options=opts)
        path = table.save(args.out)
        _print(table, args.json, header=f"wrote {path}")
        return 0
    _print(load_table(args.table), args.json, header=f"learnability table {args.table}")
    return 0


def _print(table, as_json: bool, *, header: str) -> None:
    info = {"vocab_size": table.vocab_size, "order": table.order, "n_keys": table.n_keys, "mu_global": table.mu_global,
            "delta_global": table.delta_global, **table.meta}  # fmt: skip
    if as_json:
        print(json.dumps(info, indent=2))
        return
    pilot = table.meta.get("pilot", {})
    print(header)
    print(f"  tokenizer   {table.meta.get('tokenizer', {})}")
    print(f"  pilot       run {pilot.get('run')!r} of {pilot.get('store')}: {pilot.get('n_tokens')} tokens, "
          f"{pilot.get('n_events')} events, x {pilot.get('x_first', float('nan')):.2f}..{pilot.get('x_last', float('nan')):.2f}")  # fmt: skip
    print(f"  keys        {table.n_keys} (orders 1..{table.order}); global mu {table.mu_global:.3f}, delta {table.delta_global:.3f} nats")
    v = table.validation
    if v is None:
        print("  held-out    no check (holdout 0)")
        return
    print(f"  held-out    {v['n_tokens']} tokens ({v['n_tokens_with_event']} with an event)")
    print(f"    mu        rank corr {v['mu_spearman']:.3f}, MAE {v['mu_mae']:.3f} decades (global mean: {v['mu_mae_global']:.3f})")
    print(f"    delta     rank corr {v['delta_spearman']:.3f}, MAE {v['delta_mae']:.3f} nats (global mean: {v['delta_mae_global']:.3f})")
    shares = ", ".join(f"{'global' if k == '0' else 'order ' + k} {s:.0%}" for k, s in v["level_share"].items())
    print(f"    answered  {shares}")
