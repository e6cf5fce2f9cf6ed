"""Worker processes that do not outlive the process that started them."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["exit_with_parent", "PARENT_POLL_S"]

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
