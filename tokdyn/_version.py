"""tokdyn's version, and which code it is (a module of its own: the store and the fit record
them without importing the package)."""

from __future__ import annotations

import hashlib
from pathlib import Path

__version__ = "0.1.0"


def _module_files(root: Path) -> list[tuple[str, Path]]:
    """(path in the package, file) of each module Python could import from the package folder
    ``root``: ``.py`` files whose folders and name are identifiers, so what sits beside them
    unimported (a ``.ipynb_checkpoints`` folder, an editor's ``.#job.py`` lock) does not count."""
    out = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if all(p.isidentifier() for p in parts[:-1]) and parts[-1][:-3].isidentifier():
            out.append(("/".join(parts), path))
    return sorted(out)


def _code_id() -> str | None:
    """The first 12 hex digits of a SHA-256 over the package's modules (each one's path in the
    package, its length and its bytes, in path order; line ends read as ``\\n``; a module that
    cannot be read counts as such), or None where the package is not a folder of files that can
    be listed (imported from a zip)."""
    try:
        files = _module_files(Path(__file__).resolve().parent)
        digest = hashlib.sha256()
        for rel, path in files:
            try:
                data = path.read_bytes().replace(b"\r\n", b"\n")
            except OSError:  # Python could not import it either; two such installs agree
                data = b"\0unreadable"
            digest.update(rel.encode("utf-8", "surrogateescape") + f"\0{len(data)}\0".encode())
            digest.update(data)
    except OSError:
        return None
    return digest.hexdigest()[:12] if files else None


# Read when tokdyn is imported (about 15 ms), so that it names the code this process runs, not the
# files as they are when it is first asked (an edit or a `git pull` in between).
_CODE_ID = _code_id()


def code_id() -> str | None:
    """The id of the code this process imported: the version number changes at a release, this
    with any change to the package's modules, so two checkouts of one version that fit with
    other code tell themselves apart. None where it could not be read (a zip import)."""
    return _CODE_ID


def build() -> str:
    """The version with the code's id as its local label, ``0.1.0+1a2b3c4d5e6f``
    (``0.1.0+unknown`` where the code has none): what two processes compare before they share a
    fit, and what a fit records of the code that fitted its blocks. A tokdyn from before the id
    says its version alone, which is never a build."""
    return f"{__version__}+{code_id() or 'unknown'}"
