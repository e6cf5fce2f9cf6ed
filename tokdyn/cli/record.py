"""``tokdyn record-offline``: evaluate the probe on every checkpoint in a folder."""

from __future__ import annotations

from ..record.offline import add_cli_arguments, run_cli


def register(sub) -> None:
    p = sub.add_parser("record-offline", help="evaluate the probe on every checkpoint in a folder")
    add_cli_arguments(p)
    p.set_defaults(func=run_cli)
