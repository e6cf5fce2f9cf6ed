"""Helpers of the reliability tests: the kill harness, a failing disk, file snapshots, an S3
endpoint on loopback, a line-per-error check of the CLI, and FIFOs that cannot hang a test."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from zarr.storage import LocalStore

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pipelines"))

import kill_harness  # noqa: E402  (pipelines/ is not a package)

__all__ = ["kill_harness", "FailingDisk", "snapshot", "run_cli", "cli_error_line", "s3_endpoint", "live_foreign_owner",
           "raw", "put_lock", "read_lock", "unblocking"]


class FailingDisk:
    """A local disk that fails on demand: once armed, every write to a key for which
    ``match(key)`` is true raises ``OSError(err)`` (ENOSPC: disk full; EACCES: permission
    denied), as the file system would. Writes go through zarr's LocalStore, below tokdyn."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, err: int = errno.ENOSPC, match: Callable[[str], bool] = lambda key: True):
        self.armed = False
        self.failures = 0
        original = LocalStore.set

        async def set(store, key, value):
            if self.armed and match(key):
                self.failures += 1
                raise OSError(err, os.strerror(err), str(store.root / key))
            return await original(store, key, value)

        monkeypatch.setattr(LocalStore, "set", set)


def snapshot(path: str | os.PathLike) -> dict[str, str]:
    """sha256 of every file under ``path`` (relative names): equal snapshots, nothing changed."""
    root = Path(path)
    if root.is_file():
        return {"": hashlib.sha256(root.read_bytes()).hexdigest()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """Run the CLI in this process; return (exit code, stderr). An exception escaping ``main``
    (a traceback for the user) fails the calling test."""
    from tokdyn.cli import main

    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


@contextlib.contextmanager
def s3_endpoint() -> Iterator[dict]:
    """A moto S3 server on loopback (a real HTTP endpoint), with a fresh bucket; yields the
    fsspec storage options and the bucket name. Skips when moto or s3fs is not installed."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing",
                   "client_kwargs": {"region_name": "us-east-1"}, "use_listings_cache": False}  # fmt: skip
        import boto3

        boto3.client("s3", endpoint_url=options["endpoint_url"], aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket="tokdyn-test")  # fmt: skip
        yield {"storage_options": options, "bucket": "tokdyn-test", "fs": s3fs.S3FileSystem(**options, skip_instance_cache=True)}
    finally:
        server.stop()


def live_foreign_owner() -> dict:
    """An owner record of a live process on this machine that is not this one (pid 1, or the
    parent), as another writer would leave in a lock."""
    from tokdyn.store.locks import _proc_stat

    pid = 1 if _proc_stat(1)[0] is not None else os.getppid()
    return {"host": socket.gethostname(), "pid": pid, "start": _proc_stat(pid)[1], "since": "earlier", "token": "other"}


def cli_error_line(err: str) -> str:
    """The one line a failing command prints; anything else (a traceback) fails."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]



def raw(store, path: str = ""):
    """The zarr group or array at ``path`` of a tokdyn store, opened past tokdyn: what crash and
    damage tests write into directly, as a dying process or a damaged disk would."""
    import zarr

    return zarr.open(store=store.url, path=path, mode="r+", storage_options=store.storage_options or None)


def put_lock(store, key: str, holder: dict | None, *, exclusive: bool = True) -> None:
    """Write (or with ``holder=None`` read back) a writer lock key of a store as another process would."""
    from zarr.storage import StorePath

    from tokdyn.store.locks import _write_json_key

    _write_json_key(StorePath(raw(store).store, key), holder, exclusive=exclusive)


def read_lock(store, key: str):
    from zarr.storage import StorePath

    from tokdyn.store.locks import _read_json_key

    return _read_json_key(StorePath(raw(store).store, key))


@contextlib.contextmanager
def unblocking(*fifos, after: float = 10.0):
    """After ``after`` seconds, keep opening ``fifos`` for writing (and closing them): a reader
    blocked opening one then reads an empty file, and the test ends instead of hanging. Yields
    the list of FIFOs it had to open so (none: nothing waited on them)."""
    stop, opened = threading.Event(), []

    def run():
        if stop.wait(after):
            return
        while not stop.is_set():
            for f in fifos:
                with contextlib.suppress(OSError):  # ENXIO: nobody is reading it
                    os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
                    opened.append(f)
            stop.wait(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield opened
    finally:
        stop.set()
        thread.join()
