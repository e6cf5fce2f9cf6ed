"""Who is writing: creation markers and writer locks.

A store or run under creation carries ``attrs[CREATING]`` (its creator) until its metadata is
complete; a writer holds a lock key (``commits/w<j>/writer.lock`` for a token range of a run,
``commits/fit.lock`` for a fit) while it writes. Both name the process (host, pid, start time), so
a later process can tell a crashed owner (take over) from a live one (refuse: two writers would
interleave rows).
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync as zarr_sync
from zarr.storage import StorePath

from .._files import loads_json
from ..errors import RunBusyError
from .schema import utc_now

__all__ = ["CREATING", "LOCK_NAME", "owner", "refuse_if_live", "KeyLock", "remove_stale_partials"]

CREATING = "tokdyn_creating"
LOCK_NAME = "writer.lock"


def owner() -> dict:
    """This process, as a creation marker or lock names it."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _proc_stat(pid)[1], "since": utc_now()}


def _proc_stat(pid: int) -> tuple[str | None, str | None]:
    """(state, start time) of process ``pid`` from /proc (Linux); (None, None) elsewhere or if gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            data = fh.read()
    except (OSError, ValueError, TypeError, OverflowError):
        return None, None
    fields = data[data.rindex(b")") + 2 :].split()  # after "pid (comm) "
    return fields[0].decode(), fields[19].decode()


def owner_state(who: Any) -> str:
    """``"self"`` (this process), ``"alive"``, ``"dead"`` or ``"unknown"`` (another machine)."""
    if not isinstance(who, Mapping) or not isinstance(who.get("pid"), int) or isinstance(who.get("pid"), bool):
        return "dead"  # unreadable: whoever wrote it did not finish writing it
    if who["pid"] <= 0:  # names no process: os.kill(0 or -1, 0) asks of a process group, or of every process, and finds one alive
        return "dead"
    if who.get("host") != socket.gethostname():
        return "unknown"
    pid = who["pid"]
    state, start = _proc_stat(pid)
    if pid == os.getpid() and start == who.get("start"):
        return "self"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        pass  # another user's process: alive
    except (OverflowError, ValueError):
        return "dead"
    if state == "Z" or (start is not None and who.get("start") is not None and start != who["start"]):
        return "dead"  # a zombie, or the pid was reused by another process
    return "alive"


def refuse_if_live(who: Any, what: str, *, if_gone: str = "delete it and try again") -> str:
    """Raise :class:`RunBusyError` when ``who`` may still be running; returns its state."""
    state = owner_state(who)
    if state in ("alive", "unknown"):
        where = f"process {who.get('pid')} on {who.get('host')} (since {who.get('since')})"
        hint = "wait for it to finish, or stop it" if state == "alive" else (
            f"this machine cannot tell whether it still runs; if it does not, {if_gone}")  # fmt: skip
        raise RunBusyError(f"{what} by {where}; a second writer is refused rather than interleaved: {hint}")
    return state


class KeyLock:
    """An exclusive lock held as one JSON key of a store (``set_if_not_exists``), naming its
    holder. ``what`` names the thing locked in messages; ``if_gone`` tells the user how to break
    a lock left on another machine."""

    def __init__(self, store, key: str, *, what: str, if_gone: str) -> None:
        self._path = StorePath(store, key)
        self.what = what
        self.if_gone = if_gone
        self.token: str | None = None

    def claim(self) -> str:
        """Create the lock exclusively, or take it over from a process that is gone (a crash) or
        from an earlier holder in this same process; refuse when another live process holds it.
        Returns what it found: ``"none"`` (no lock), ``"dead"`` (a crashed holder's) or ``"self"``."""
        me = {**owner(), "token": uuid.uuid4().hex}
        found = "none"
        for _ in range(3):
            _write_json_key(self._path, me, exclusive=True)
            holder = self.holder()
            if holder is not None and holder.get("token") == me["token"]:
                self.token = me["token"]
                return found
            if holder is not None:
                found = refuse_if_live(holder, f"{self.what} is being written", if_gone=self.if_gone)
                zarr_sync(self._path.delete())  # its holder crashed, or is an older holder of ours
        raise RunBusyError(f"{self.what}: another process keeps taking the writer lock")

    def holder(self) -> dict | None:
        """The lock's holder (None: no lock). A lock key that holds no JSON object (cut short,
        ``null``, a list, a number: damaged) is ``{}``, a holder that is gone, as one cut short
        by its writer's death is: before, ``null`` read as no lock that could never be taken
        ("another process keeps taking the writer lock") and a list as an internal error."""
        missing = object()
        found = _read_json_key(self._path, missing)
        if found is missing:
            return None
        return dict(found) if isinstance(found, Mapping) else {}

    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self.token is not None and (self.holder() or {}).get("token") == self.token

    def check(self) -> None:
        """Raise :class:`RunBusyError` unless this object still holds the lock."""
        holder = self.holder()
        if self.token is None or holder is None or holder.get("token") != self.token:
            who = ("nobody (it was released)" if holder is None else "nobody: the lock key is damaged" if not holder
                   else f"process {holder.get('pid')} on {holder.get('host')}")  # fmt: skip
            raise RunBusyError(
                f"this writer of {self.what} no longer holds its lock (held by {who}); "
                "it stops rather than interleave its writes with the other writer"
            )

    def release(self) -> None:
        """Give the lock back. Idempotent."""
        if self.token is None:
            return
        holder = self.holder()
        if holder is not None and holder.get("token") == self.token:
            zarr_sync(self._path.delete())
        self.token = None

    def delete(self) -> None:
        """Remove the lock whoever holds it (only for a holder known to be gone)."""
        zarr_sync(self._path.delete())


_PARTIAL = re.compile(r"^(?P<stem>.+)\.[0-9a-f]{32}\.partial$")  # zarr's local temporary file of a write


def remove_stale_partials(store, prefix: str, owned: Callable[[str], bool]) -> int:
    """Remove the temporary files (``<name>.<32 hex>.partial``) that zarr's local store leaves
    when a process is killed while writing a key under ``prefix``; returns how many.

    ``owned(stem)`` says which belong to the caller (``stem``: the key's path under ``prefix``
    without its extension, e.g. ``loss/c/3/0`` or ``commits/w0/zarr``). The caller must hold the
    lock of those keys, taken from nobody or from a process that is gone: then no live process
    can be writing them. Other stores write a key in one request and leave no such file."""
    root = getattr(store, "root", None)
    if root is None:
        return 0
    base, removed = Path(root) / prefix, 0
    for folder, _, files in os.walk(base):
        for name in files:
            m = _PARTIAL.match(name)
            if m is not None and owned((Path(folder) / m["stem"]).relative_to(base).as_posix()):
                try:
                    os.unlink(os.path.join(folder, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed


def _read_json_key(sp: StorePath, missing: Any = None) -> Any:
    """The JSON value of key ``sp``; ``missing`` when there is no such key."""
    buf = zarr_sync(sp.get(prototype=default_buffer_prototype()))
    if buf is None:
        return missing
    try:
        return loads_json(buf.to_bytes())
    except (ValueError, UnicodeDecodeError):
        return {}  # a lock cut short: its writer died while writing it


def _write_json_key(sp: StorePath, obj: Any, *, exclusive: bool) -> None:
    buf = default_buffer_prototype().buffer.from_bytes(json.dumps(obj).encode())
    zarr_sync(sp.set_if_not_exists(buf) if exclusive else sp.set(buf))
