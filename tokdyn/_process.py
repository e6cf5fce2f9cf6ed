"""Worker processes that do not outlive the process that started them, and that do not print
tracebacks when a Ctrl-C comes while they start."""

from __future__ import annotations

import contextlib
import multiprocessing.context as _mp
import multiprocessing.spawn as _spawn
import os
import signal
import sys
import threading
import time

__all__ = ["exit_with_parent", "PARENT_POLL_S", "spawn_context", "take_interrupts", "Terminated", "terminate_as_interrupt"]

# Seconds between a worker's looks at whether the process that started it is still there.
PARENT_POLL_S = 0.5


def exit_with_parent(parent: int) -> None:
    """Start a daemon thread that ends this (worker) process once process ``parent`` is gone.

    A pool's owner killed on its own (SIGTERM from a supervisor, SIGKILL from the OOM killer)
    cannot shut its pool down: its workers, a few hundred MB each, were left running for good.
    Call it in the pool's initializer with the owner's pid (``os.getpid()`` passed from the
    owner, not read in the worker, which may start after the owner died)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="tokdyn-parent-watch", daemon=True).start()


# A Ctrl-C in a terminal goes to every process of the foreground group: to a pool's workers as
# well as to its owner. A worker started by "spawn" first imports its owner's main module (the
# `tokdyn` script: a second or two of imports) and got the KeyboardInterrupt there, printing a
# traceback of those imports under the owner's one-line "interrupted". Its processes start with
# SIGINT blocked (a blocked signal stays blocked across fork and exec) until the worker's
# initializer calls take_interrupts().
_SIGMASK = hasattr(signal, "pthread_sigmask")


# A worker killed (the OOM killer, a kill) never unlinks the lock numcodecs makes as it is
# imported; the resource tracker, which shares the terminal, unlinks it at its own exit and says
# "UserWarning: resource_tracker: There appear to be 2 leaked semaphore objects ..." in two lines
# under the job's one-line error. Its warnings are its command line's -W options, taken from ours.
# The tracker serves the whole process, so it is quieted only where the process is tokdyn's own
# command (the CLI sets this): in a notebook it would hide the user's own leaks for good.
_TRACKER_QUIET = "ignore:resource_tracker:UserWarning"  # (a colon would end the -W message field)
QUIET_RESOURCE_TRACKER = False


def _start_resource_tracker() -> None:
    from multiprocessing import resource_tracker

    if not QUIET_RESOURCE_TRACKER:
        resource_tracker.ensure_running()
        return
    sys.warnoptions.append(_TRACKER_QUIET)  # for the tracker only (a no-op where it already runs)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(_TRACKER_QUIET)


# A process "spawn" starts first runs its parent's main module again (a script's top level, not
# under `if __name__ == "__main__":`), for the parent's own functions it may be handed. The
# fit's workers are handed tokdyn's functions only, and a training script that also fitted
# with worker processes was run again by each of them: its `open_store(..., mode="w")` deleted
# the store being fitted. Their processes start without it (the thread that starts one says
# so here; any other start, in this process or another thread, is left as multiprocessing
# makes it).
_WITHOUT_MAIN = threading.local()


def _preparation_data(name, *, _made=_spawn.get_preparation_data):
    data = _made(name)
    if getattr(_WITHOUT_MAIN, "on", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


class _SpawnProcess(_mp.SpawnProcess):
    def start(self) -> None:
        if not _SIGMASK:
            return super().start()
        # The resource tracker, started on the first spawn, unblocks SIGINT in the calling thread
        # once it runs (SIG_UNBLOCK, not a restore): started first, it cannot undo the block below.
        _start_resource_tracker()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # this thread only
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _SpawnContext(_mp.SpawnContext):
    Process = _SpawnProcess


class _SpawnWithoutMainProcess(_SpawnProcess):
    """A :class:`_SpawnProcess` that starts without the parent's main module (see _WITHOUT_MAIN)."""

    def start(self) -> None:
        if _spawn.get_preparation_data is not _preparation_data:  # once, where multiprocessing looks it up
            _spawn.get_preparation_data = _preparation_data
        _WITHOUT_MAIN.on = True
        try:
            super().start()
        finally:
            _WITHOUT_MAIN.on = False


class _SpawnWithoutMainContext(_mp.SpawnContext):
    Process = _SpawnWithoutMainProcess


def spawn_context(*, main: bool = True) -> _mp.SpawnContext:
    """The "spawn" multiprocessing context, whose processes start with SIGINT blocked: call
    :func:`take_interrupts` in the pool's initializer, once the worker is set up. ``main=False``:
    they start without running the parent's main module again (a pool handed tokdyn's own
    functions only), so a script's top level runs once whatever guards it."""
    if _SIGMASK:  # before the pool's queues, whose locks start the tracker as they are made
        _start_resource_tracker()
    return _SpawnContext() if main else _SpawnWithoutMainContext()


def take_interrupts() -> None:
    """In a worker of :func:`spawn_context`: drop a Ctrl-C that came while it started (its owner
    got it too and stops the pool), and take later ones again as KeyboardInterrupt. Call it in
    the worker's main thread."""
    if not _SIGMASK:
        return
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a pending SIGINT is discarded ...
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, handler)  # ... and the next one raises as before


class Terminated(KeyboardInterrupt):
    """A SIGTERM taken as a Ctrl-C (:func:`terminate_as_interrupt`): the work stops as it does for
    one, and the command says ``terminated`` (exit 143, as a process killed by SIGTERM)."""


@contextlib.contextmanager
def terminate_as_interrupt():
    """In the main thread: a SIGTERM (a batch system's preemption, ``kill``) raises
    :class:`Terminated` there, so the work stops as for a Ctrl-C: with the fit, its blocks in
    flight finish or are dropped and the fit lock is let go. By default SIGTERM ended the process
    at once, leaving its lock behind: another machine (a preempted job requeued on another
    node) cannot tell that its holder is dead and refused to resume. Elsewhere (another thread,
    SIGTERM ignored or handled by the embedding program) it does nothing."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):  # noqa: ARG001
        raise Terminated

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
