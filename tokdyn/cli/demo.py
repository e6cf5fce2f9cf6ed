"""``tokdyn demo``: the main job on the embedded default."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("demo", help="train the tiny GPT on the standard library with the recorder attached")
    p.add_argument("--out", default="tokdyn-demo", help="output folder (default: tokdyn-demo)")
    p.add_argument("--steps", type=int, default=800, help="training steps (default: 800)")
    p.add_argument("--points", type=int, default=40, help="log-spaced recording points (default: 40)")
    p.add_argument("--probe-sequences", type=int, default=128, help="probe sequences of 128 tokens (default: 128)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model, the data order and the probe draw (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo  # torch: loaded only by the commands that train

    run_demo(args.out, steps=args.steps, n_points=args.points, device=args.device, seed=args.seed,
             n_probe_sequences=args.probe_sequences, progress=not args.no_progress)  # fmt: skip
    return 0
