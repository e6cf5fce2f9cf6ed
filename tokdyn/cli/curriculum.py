"""``tokdyn curriculum``: learnability model and training-data weights from a fitted pilot run."""

from __future__ import annotations

from ..curriculum.cli import add_cli_arguments, run_cli


def register(sub) -> None:
    p = sub.add_parser("curriculum", help="learnability model and training-data weights from a fitted pilot run")
    add_cli_arguments(p)
    p.set_defaults(func=run_cli)
