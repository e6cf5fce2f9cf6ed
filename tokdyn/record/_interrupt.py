"""Holding Ctrl-C back while rows already recorded are written.

A researcher who stops a run with Ctrl-C often presses it again when the last write seems slow.
Python raises ``KeyboardInterrupt`` wherever the main thread happens to be: inside a recorder's
``close()`` that waits for its writer thread, the rows of the last ``commit_every`` window were
dropped without a word. :func:`hold_interrupts` runs such a block with the first Ctrl-C deferred
(one line says what is being written and that another Ctrl-C abandons it) and re-raised when the
block is done; a further Ctrl-C raises at once, after one line saying which rows are lost.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator

__all__ = ["hold_interrupts"]

log = logging.getLogger("tokdyn.record")


@contextlib.contextmanager
def hold_interrupts(writing: Callable[[], str], lost: Callable[[], str]) -> Iterator[None]:
    """Run the block with Ctrl-C held back until it ends, then raise ``KeyboardInterrupt``.

    Parameters
    ----------
    writing : callable
        ``() -> str``: what the block is writing, logged (a warning) at the first Ctrl-C, e.g.
        "writing the 3 recorded rows of run 'r' not yet committed (steps 40..60)".
    lost : callable
        ``() -> str``: what a second Ctrl-C abandons, logged (an error) before it is raised.

    Only in the main thread (the only one Python raises ``KeyboardInterrupt`` in) and only while
    Python's own SIGINT handler is installed: a handler of the program's own, or SIG_IGN (which
    Lightning installs for its shutdown), is left alone.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    held: list[bool] = []

    def on_sigint(signum, frame) -> None:
        if held:  # asked twice: stop now, saying what is lost
            _say(log.error, lost)
            raise KeyboardInterrupt
        held.append(True)
        _say(log.warning, lambda: f"{writing()} before stopping; press Ctrl-C again to abandon them")

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt


def _say(emit: Callable[[str], None], message: Callable[[], str]) -> None:
    """Log ``message()`` from the signal handler; a failure to word or log it never stops the write."""
    try:
        emit("tokdyn: " + message())
    except Exception:  # noqa: BLE001 - a message is not worth a lost row
        pass
