"""The ``tokdyn`` command line: parse, call one library function, print.

Each module of this package registers its commands (``register(subparsers)``) and holds only
argument parsing and printing; the work is done by the library. Every command exits 0 on
success, 1 on an input or store error (one line on stderr, no traceback) and 2 on a usage error
(argparse).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import TokdynError
from . import analysis, curriculum, demo, fit, record, store

__all__ = ["main", "build_parser"]

_MODULES = (demo, store, fit, analysis, record, curriculum)  # the order of `tokdyn --help`


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokdyn", description="Token-level training dynamics analyzer.")
    parser.add_argument("--version", action="version", version=f"tokdyn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _MODULES:
        module.register(sub)
    return parser


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
