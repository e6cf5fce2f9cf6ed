"""Workers of tokdyn's process pools start deaf to Ctrl-C and take it once set up.

A Ctrl-C reaches every process of the terminal's foreground group. A `tokdyn fit --scheduler
processes` worker started by "spawn" spends its first second or two importing the `tokdyn`
script, and a Ctrl-C there printed that import's traceback under the job's own one line. Each
worker here sends itself SIGINT at the points that matter: while it starts (before the pool's
initializer), where nothing may happen, and after :func:`take_interrupts`, where a task is
interrupted as before.
"""

from __future__ import annotations

import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from tokdyn._process import spawn_context, take_interrupts

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")


def _start_with_a_ctrl_c() -> None:
    """The pool's initializer: a Ctrl-C while the worker is still starting, then set up."""
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    os.environ["TOKDYN_TEST_BLOCKED_AT_START"] = str(int(blocked))
    os.kill(os.getpid(), signal.SIGINT)  # pending while blocked (raised here if not)
    take_interrupts()


def _state() -> tuple[str, bool]:
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return os.environ["TOKDYN_TEST_BLOCKED_AT_START"], blocked


def _interrupted() -> str:
    try:
        os.kill(os.getpid(), signal.SIGINT)  # raised in this thread at its next bytecodes
        for _ in range(1000):
            pass
    except KeyboardInterrupt:
        return "KeyboardInterrupt"
    return "not interrupted"


def test_a_ctrl_c_while_a_worker_starts_is_dropped_and_later_ones_interrupt_it():
    with ProcessPoolExecutor(1, mp_context=spawn_context(), initializer=_start_with_a_ctrl_c) as pool:
        blocked_at_start, blocked_now = pool.submit(_state).result(timeout=120)
        assert blocked_at_start == "1"  # SIGINT was blocked until the initializer took it
        assert blocked_now is False
        assert pool.submit(_interrupted).result(timeout=60) == "KeyboardInterrupt"
        assert pool.submit(_state).result(timeout=60)[1] is False  # the worker lives on


def test_the_starting_thread_keeps_its_own_signal_mask():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with ProcessPoolExecutor(1, mp_context=spawn_context()) as pool:
        pool.submit(os.getpid).result(timeout=120)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


_BARE = """
import signal, sys
from tokdyn._process import spawn_context

def blocked(conn):
    conn.send(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))

if __name__ == "__main__":
    ctx = spawn_context()
    here, there = ctx.Pipe(False)  # no lock: nothing has started the resource tracker yet
    p = ctx.Process(target=blocked, args=(there,))
    p.start()
    print(here.recv())
    p.join()
"""


def test_a_bare_process_started_before_any_pool_starts_blocked(tmp_path):
    """The first spawn of a fresh process starts multiprocessing's resource tracker, which unblocked
    SIGINT in the starting thread before the worker was made."""
    import subprocess

    script = tmp_path / "bare.py"
    script.write_text(_BARE)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


def test_the_fit_jobs_workers_take_ctrl_c_once_set_up():
    from tokdyn.fit import job

    with job._process_pool(1) as pool:
        assert pool.submit(_state_after_setup).result(timeout=120) == (False, True)


def _state_after_setup() -> tuple[bool, bool]:
    return (signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []),
            signal.getsignal(signal.SIGINT) is signal.default_int_handler)
