"""``tokdyn record-offline``: evaluate the probe on every checkpoint in a folder."""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path
from typing import Any

from .._files import check_output_path, loads_json
from .._text import visible
from ..errors import InputError
from ..record.offline.discovery import MANIFEST, MODEL_DTYPE_NAMES
from ..store import AXES, LOSS_DTYPES

__all__ = ["register", "add_cli_arguments", "run_cli"]


def register(sub) -> None:
    p = sub.add_parser("record-offline", help="evaluate the probe on every checkpoint in a folder")
    add_cli_arguments(p)
    p.set_defaults(func=run_cli)


def add_cli_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``record-offline`` arguments to ``parser`` (a subcommand parser)."""
    parser.add_argument("--checkpoints", required=True, metavar="DIR", help=f"folder of checkpoints, or a {MANIFEST}")
    parser.add_argument("--out", required=True, metavar="STORE", help="store to write (created when --probe is given)")
    parser.add_argument("--run", required=True, metavar="NAME", help="run name")
    parser.add_argument("--probe", metavar="STORE", help="a tokdyn store whose probe to use (default: the --out store's own)")
    parser.add_argument(
        "--model", metavar="JSON",
        help='model spec for bare state dicts: a JSON file, or the JSON itself, {"type": "tinygpt", "config": {...}}',
    )  # fmt: skip
    parser.add_argument("--axis", choices=AXES, help="T (steps), or D/M for a sweep listed in a manifest (default: the resumed run's "
                                                   "axis, else the manifest's \"axis\", else T)")
    parser.add_argument("--workers", type=int, metavar="N", help="checkpoints evaluated at once (default: min(4, cores); 2 on a GPU)")
    parser.add_argument("--device", default="cpu", help="torch device for the probe forwards (default: cpu)")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="probe sequences per forward (default: 32)")
    parser.add_argument("--dtype", choices=LOSS_DTYPES, default="float32", help="storage dtype of the losses (default: float32)")
    parser.add_argument("--model-dtype", choices=MODEL_DTYPE_NAMES, default="float32", help="dtype the models run in (default: float32)")
    parser.add_argument("--resume", action="store_true", help="continue an existing run after its last committed step")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def run_cli(args: argparse.Namespace) -> int:
    """Run ``record-offline`` from parsed arguments; prints a summary, returns 0.

    Errors are raised as :class:`~tokdyn.errors.TokdynError` for the CLI to report.
    """
    from ..record.offline.models import build_model  # torch and the recorder: only for this command
    from ..record.offline.recording import record_offline
    from ..record.recorder import _NeedsForward

    if "://" not in args.out and not os.path.lexists(args.out):  # a new local store: its folder must exist, before any work
        check_output_path(args.out, what="store (--out)", folder_ok=True)
    factory = None
    if args.model:
        spec, where = model_spec_argument(args.model)
        build_model(spec, where=where)  # fail now on a bad spec, not in a worker
        factory = functools.partial(build_model, spec, where=where)
    try:
        summary = record_offline(
            args.checkpoints, args.out, args.run, probe=args.probe, model_factory=factory, device=args.device,
            batch_size=args.batch_size, workers=args.workers, dtype=args.dtype, model_dtype=args.model_dtype,
            resume=args.resume, progress=not args.no_progress, axis=args.axis,
        )  # fmt: skip
    except _NeedsForward as exc:  # its advice, forward=, is Python's
        raise InputError(
            f"{exc}. The command line takes no forward: record these checkpoints from Python, with "
            "tokdyn.record.record_offline(..., forward=...), or give --model a model whose output is logits [B, T, V]"
        ) from None
    steps = summary["recorded"]
    span = f"steps {steps[0]}..{steps[-1]}" if steps else "nothing new"
    lost = summary["out_of_order"]  # warned about; not committed ("4 already committed" counted them)
    done = len(summary["skipped"]) - len(lost)
    skipped = (f", {done} already committed" if done else "") + (
        f", {len(lost)} before the last committed step, not recorded (step{'s' * (len(lost) > 1)} "
        f"{', '.join(map(str, lost[:5]))}{', ...' * (len(lost) > 5)})" if lost else "")
    print(visible(
        f"recorded {len(steps)} checkpoint(s) ({span}{skipped}) into run {summary['run']!r} (axis {summary['axis']}, "
        f"{summary['rows']} rows) of {summary['store']} in {summary['seconds']:.1f} s"
    ))  # fmt: skip
    return 0  # identical weights at two steps: warned (one line each) while they were recorded


def model_spec_argument(value: str) -> tuple[Any, str]:
    """The model spec ``--model`` gives, and the name its errors start with: the JSON itself when
    the value starts with ``{``, else the JSON file it names."""
    from ..record.offline.files import read_json

    if value.lstrip().startswith("{"):
        try:
            return loads_json(value), "--model"
        except json.JSONDecodeError as exc:
            raise InputError(f"--model: not valid JSON ({exc}); give the spec inline, "
                             f'{{"type": "tinygpt", "config": {{...}}}}, or the path of a JSON file') from None
    return read_json(Path(value), "model spec"), value  # a regular file of bounded size: a FIFO would block
