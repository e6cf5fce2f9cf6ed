"""tokdyn's version, and which code it is (a module of its own: the store and the fit record
them without importing the package)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"


@functools.cache
def code_id() -> str | None:
    """The first 12 hex digits of a SHA-256 over the package's Python sources (each file's path
    in the package, its length and its bytes, in path order; line ends read as ``\\n``): the
    version number changes at a release, this with any change to the code, so two checkouts of
    one version that fit with other code tell themselves apart. None where the sources cannot
    be read as files (a package imported from a zip)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    try:
        files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.py"))
        for rel, path in files:
            data = path.read_bytes().replace(b"\r\n", b"\n")
            digest.update(f"{rel}\0{len(data)}\0".encode())
            digest.update(data)
    except OSError:
        return None
    return digest.hexdigest()[:12] if files else None


def build() -> str:
    """The version with the code's id as its local label, ``0.1.0+1a2b3c4d5e6f`` (the version
    alone where the code has none): what two processes compare before they share a fit."""
    code = code_id()
    return __version__ if code is None else f"{__version__}+{code}"
