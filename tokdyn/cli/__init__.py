"""The ``tokdyn`` command line: parse, call one library function, print.

Each module of this package registers its commands (``register(subparsers)``) and holds only
argument parsing and printing; the work is done by the library. Every command exits 0 on
success, 2 on a usage error (argparse), and 1 on any other error with one line on stderr and no
traceback: :func:`main` is the one boundary where every exception becomes that line. An
exception tokdyn did not raise on purpose is reported as a bug, with the version; set
``TOKDYN_DEBUG=1`` to see its traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import warnings
from collections.abc import Sequence

from .. import _process
from .._text import one_line, visible
from .._version import build
from .._checks import numba_setting
from ..errors import TokdynError
from ._common import check_paths

__all__ = ["main", "build_parser"]


def _modules() -> tuple:
    """The commands' modules, in the order of `tokdyn --help`. Imported when the parser is built,
    not with this package: they import numba, which raised a traceback at its import for a
    setting it refuses (NUMBA_NUM_THREADS=0) before :func:`main` could say it in one line."""
    from . import analysis, curriculum, demo, fit, probe, record, store

    return (demo, probe, record, store, fit, analysis, curriculum)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a help or version text that cannot be written is an error, not
    dropped: argparse writes them ignoring OSError, so ``tokdyn --help > /dev/full`` printed
    nothing and exited 0. (Its subcommands' parsers are of this class too: add_subparsers
    makes them of the parent's.)"""

    def _print_message(self, message: str, file=None) -> None:
        if not message or file is None or file is sys.stderr:  # a usage error: where it cannot be said, nothing can
            super()._print_message(message, file)
        else:
            file.write(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tokdyn", description="Token-level training dynamics analyzer.")
    parser.add_argument("--version", action="version", version=f"tokdyn {build()}",
                        help="print tokdyn's version and the id of its code (what a dask cluster's workers compare), and exit")  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _modules():
        module.register(sub)
    _numbers_in_e_notation(parser)
    return parser


def _numbers_in_e_notation(parser: argparse.ArgumentParser) -> None:
    """Let every parser read ``-1e-3`` as a negative number, as Python 3.13's argparse does:
    3.11 and 3.12 took it for an option (``--lead -1e-3``: "expected one argument"). None of
    tokdyn's options is spelled ``-<digit>``, so a value there is never mistaken for one."""
    parser._negative_number_matcher = re.compile(r"^-\.?\d")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _numbers_in_e_notation(child)


def main(argv: Sequence[str] | None = None) -> int:
    refused = numba_setting(compiled=False)  # before the commands import numba, whose import fails or warns with a traceback
    if refused is not None:
        print(f"tokdyn: error: {refused}", file=sys.stderr)
        return 1
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, extra = parser.parse_known_args(argv)
    except OSError as exc:  # --help or --version could not be written (_Parser)
        return _unwritten(exc, "the version" if "--version" in argv else "the help")
    path = _command_path(parser, args)
    if extra:  # an option the command does not take: its own usage line, not the top level's
        _usage_parser(parser, path, argv, extra).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:  # bare `tokdyn`: what it can do
        try:
            parser.print_help()
        except OSError as exc:
            return _unwritten(exc, "the help")
        return 0
    closed = sys.stdout is None  # started with its stdout closed (`>&-`): Python drops every print
    if closed and (path in _ANSWER_ON_STDOUT or getattr(args, "json", False)):
        print(f"tokdyn {args.command}: error: standard output is closed, so what the command prints "
              "would be lost; send it to a file or to /dev/null", file=sys.stderr or sys.__stderr__)
        return 1
    if closed:  # its product is a store or a file: what it prints about it goes nowhere, as before
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - closed in the finally below
    restore = _printable_stdout()
    plain_stdout = sys.stdout
    sys.stdout = _GuardedStdout(plain_stdout)
    _process.QUIET_RESOURCE_TRACKER = True  # this process is the command: a killed worker's leak is no news
    try:
        with warnings.catch_warnings():
            _one_line_warnings(args.command)
            check_paths(_actions(parser, path), args)
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # a full disk behind a redirected stdout fails here, not at exit unseen
            return code
    except BrokenPipeError:  # `tokdyn spectrum ... | head`: the reader left; say nothing
        _quiet_stdout()
        return 141  # as a process killed by SIGPIPE
    except _StdoutFailed as failed:  # the work may be done: say which part failed, not "[Errno 28]" alone
        settle_io()
        sys.stdout = plain_stdout
        _quiet_stdout()
        print(f"tokdyn {args.command}: error: cannot write to standard output ({failed.exc.strerror or failed.exc}); "
              "what the command wrote to stores and files before that is kept", file=sys.stderr)  # fmt: skip
        return 1
    except KeyboardInterrupt as exc:
        settle_io()
        if isinstance(exc, _process.Terminated):  # a SIGTERM the command took as a Ctrl-C
            print(f"tokdyn {args.command}: terminated (SIGTERM)", file=sys.stderr)
            return 143
        print(f"tokdyn {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one boundary: every error is one line
        settle_io()
        if os.environ.get("TOKDYN_DEBUG", "0") not in ("", "0"):  # 0 is off, as for TOKDYN_FUSED
            raise
        print(f"tokdyn {args.command}: error: {error_line(exc)}", file=sys.stderr)
        return 1
    finally:
        if isinstance(sys.stdout, _GuardedStdout):
            sys.stdout = plain_stdout
        restore()
        if closed:
            sys.stdout.close()
            sys.stdout = None


# commands whose answer is what they print (without --json too): refused with a closed stdout
_ANSWER_ON_STDOUT = {("info",), ("spectrum",), ("reconstruct",), ("compare",), ("curriculum", "show")}


def _command_path(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """The (sub)command names ``args`` ran: ``("curriculum", "schedule")``; ``()`` for none."""
    path: list[str] = []
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if not name or name not in subs[0].choices:
            return tuple(path)
        path.append(name)
        parser = subs[0].choices[name]


def _actions(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[argparse.Action]:
    """The arguments of the (sub)command ``path`` names, and of the parsers above it."""
    actions = list(parser._actions)
    for name in path:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        actions += parser._actions
    return actions


def _usage_parser(parser: argparse.ArgumentParser, path: tuple[str, ...], argv: list[str], extra: list[str]):
    """The parser whose usage line goes with the unknown ``extra`` arguments: that of the
    deepest (sub)command named before the first of them (``tokdyn fit s --bogus``: fit's;
    ``tokdyn --bogus info s``: tokdyn's own)."""
    first = argv.index(extra[0]) if extra[0] in argv else len(argv)
    at = -1
    for name in path:
        try:
            at = argv.index(name, at + 1)
        except ValueError:
            break
        if at > first:
            break
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


# numpy's floating-point warnings (its messages; tokdyn's own RuntimeWarnings, such as non-finite
# losses stored as NaN, are shown)
_NUMPY_NOISE = (r"(All-NaN (slice|axis) encountered|Mean of empty slice|Degrees of freedom <= 0"
                r"|(invalid value|divide by zero|overflow|underflow) encountered)")


def _one_line_warnings(command: str) -> None:
    """Warnings as one line each, ``tokdyn CMD: warning: ...``, without the source line Python
    shows; numpy's floating-point RuntimeWarnings (an all-NaN slice, 0/0 in a degenerate row)
    are left out: the results say where values are missing, and the warning would only put
    lines of code before the command's own answer or error line."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, message=_NUMPY_NOISE)

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001
        print(f"tokdyn {command}: warning: {visible(one_line(message))}", file=sys.stderr)

    warnings.showwarning = show


def _printable_stdout():
    """Let stdout print any name as stderr does (``\\xfc`` for what its encoding lacks): with an
    ASCII or Latin-1 stdout (``PYTHONIOENCODING``, an old locale), a path, run or domain name
    outside it raised UnicodeEncodeError after the work was done, reported as a bug in tokdyn."""
    out = sys.stdout
    if getattr(out, "errors", None) != "strict" or not hasattr(out, "reconfigure"):
        return lambda: None
    try:
        out.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError, OSError):  # not a TextIOWrapper, or closed: leave it
        return lambda: None

    def restore() -> None:  # for a caller of main() in its own process (a test, a notebook)
        try:
            out.reconfigure(errors="strict")
        except (AttributeError, ValueError, OSError):
            pass

    return restore


class _StdoutFailed(Exception):
    """Standard output could not be written (not a broken pipe): ``exc`` the OSError."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(str(exc))
        self.exc = exc


class _GuardedStdout:
    """``sys.stdout`` for a command's run: an OSError writing it (a redirect to a full disk,
    ``> /dev/full``) is :class:`_StdoutFailed`, which :func:`main` says as that, not as the
    command's own failure ("error: [Errno 28] No space left on device" after an import that
    had been made). A broken pipe stays a BrokenPipeError (the reader left: exit 141)."""

    def __init__(self, out) -> None:
        self._out = out

    def write(self, text):
        try:
            return self._out.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutFailed(exc) from None

    def flush(self):
        try:
            return self._out.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutFailed(exc) from None

    def __getattr__(self, name):
        if name == "_out":  # an instance made without __init__ (a copy): no endless lookup of _out
            raise AttributeError(name)
        return getattr(self._out, name)


def _unwritten(exc: OSError, what: str) -> int:
    """The exit code, after one line on stderr, where ``what`` could not be written to stdout
    (141, quietly, where the reader of a pipe has left, as after a command's output)."""
    _quiet_stdout()  # Python's own flush at exit would fail (and print) again
    if isinstance(exc, BrokenPipeError):
        return 141
    print(f"tokdyn: error: cannot write {what} to standard output: {exc.strerror or exc}", file=sys.stderr)
    return 1


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null, so that Python's flush at exit does not
    raise (and print) again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (embedded, captured): nothing to quiet
        pass


def settle_io(timeout: float = 10.0) -> None:
    """Cancel, and wait for, the reads zarr still has in flight after an error: when one chunk
    of a read fails, its other chunks go on in zarr's event loop, and if the process exits under
    them, asyncio prints "Task was destroyed but it is pending!" (thousands of lines) after the
    error line."""
    import asyncio

    from zarr.core import sync as zarr_sync

    loop = zarr_sync.loop[0]
    if loop is None or loop.is_closed() or not loop.is_running():
        return

    async def settle() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run_coroutine_threadsafe(settle(), loop).result(timeout)
    except Exception:  # noqa: BLE001 - best effort, after the error that matters
        pass


def error_line(exc: BaseException) -> str:
    """One line for the user: tokdyn's own errors, disk and missing-package errors, and warnings
    the interpreter was told to raise, as they are worded; anything else as a bug report with
    the version."""
    if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and exc.filename:
        text = _unwritable(exc)
    elif isinstance(exc, OSError) and exc.errno in _IN_THE_WAY and exc.filename:
        # "[Errno 20] Not a directory: 'd/f/x.zarr'", Python's wording with its quotes, as the path and why
        text = f"{exc.strerror or os.strerror(exc.errno)}: {os.fspath(exc.filename)} ({_IN_THE_WAY[exc.errno]})"
    elif isinstance(exc, (TokdynError, OSError, ImportError)):
        text = str(exc)
    elif isinstance(exc, Warning):  # python -W error, PYTHONWARNINGS=error: a warning the user made an error, not a bug
        text = f"{exc} ({type(exc).__name__}, an error by python's -W or PYTHONWARNINGS)"
    elif isinstance(exc, MemoryError):
        text = "out of memory (an input larger than this machine can hold?)"
    else:
        text = (f"internal error in tokdyn {build()}: {type(exc).__name__}: {exc} "
                "(a bug: please report it with the command; TOKDYN_DEBUG=1 shows the traceback)")  # fmt: skip
    # a name from a file or a store can hold a right-to-left override, which turned the rest of
    # the terminal's line around: every character that shows nothing is written as an escape
    return visible(one_line(text)) or type(exc).__name__


# OSErrors of a path that is in the way, with what they mean for a command's input or output path
_IN_THE_WAY = {errno.ENOTDIR: "a part of the path is a file, where a folder is needed",
               errno.EEXIST: "something that is not a store or a folder is already at that path"}  # fmt: skip


def _unwritable(exc: OSError) -> str:
    """A read-only or forbidden path as the folder it is in where the file is one of tokdyn's
    temporary names (``.../commits/fit.3fa9.partial``, ``.../.report.html.x1y2.tmp``), which say nothing to a
    user: ``read-only file system: /data/s.zarr/runs/r/commits (...)``."""
    path = os.fspath(exc.filename)
    name = os.path.basename(path)
    temporary = name.endswith(".partial") or (name.startswith(".") and name.endswith(".tmp"))  # zarr's, and write_atomically's
    where = os.path.dirname(path) if temporary else path
    hint = {errno.EROFS: "the command writes there; work on a copy in a writable place",
            errno.EACCES: "this user may not use it"}.get(exc.errno, "the system refused it")  # fmt: skip
    return f"{(exc.strerror or 'cannot write').lower()}: {where} ({hint})"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
