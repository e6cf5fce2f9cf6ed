"""Reading what a checkpoint folder holds without trusting it: only regular files are opened
(a FIFO would block forever, a link to a device would read without end), and small metadata
files are read with a bound on their size."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..._files import check_regular, loads_json
from ...errors import InputError

__all__ = ["check_regular_tree", "read_json"]

MAX_JSON_BYTES = 16 << 20  # a manifest, config or model spec: far larger is not metadata


def check_regular_tree(folder: Path) -> None:
    """Every entry below ``folder`` is a regular file or a folder (links followed; link loops refused)."""
    seen = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        st = os.stat(dirpath)
        key = st.st_ino, st.st_dev
        if key in seen:
            raise InputError(f"{dirpath}: a link loop inside checkpoint folder {folder}")
        seen.add(key)
        for name in filenames:
            check_regular(Path(dirpath) / name, "checkpoint file", readable=False)  # transformers opens only some


def read_json(p: Path, what: str) -> Any:
    """The JSON document in file ``p`` (a regular file of at most 16 MiB)."""
    check_regular(p, what)
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_JSON_BYTES + 1)
            if len(data) > MAX_JSON_BYTES:
                size = os.fstat(fh.fileno()).st_size
                raise InputError(f"{what} {p} is {size / 2**20:.0f} MiB; a {what} is metadata, at most {MAX_JSON_BYTES >> 20} MiB")
        return loads_json(data)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {what} {p}: {exc}") from None
