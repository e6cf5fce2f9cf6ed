"""``tokdyn curriculum``: learnability model and training-data weights from a fitted pilot run."""

from __future__ import annotations

from ..curriculum.cli import add_cli_arguments, add_compare_arguments, run_cli, run_compare


def register(sub) -> None:
    p = sub.add_parser("curriculum", help="learnability model and training-data weights from a fitted pilot run")
    add_cli_arguments(p)
    p.set_defaults(func=run_cli)
    p = sub.add_parser("compare", help="per-token learning-time shift between two fitted runs on one probe")
    add_compare_arguments(p)
    p.set_defaults(func=run_compare)
