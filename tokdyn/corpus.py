"""Text sources: where documents come from before they are tokenized.

A :class:`Document` is the unit of the train/probe split: a whole file, a JSON line, or a
stretch of a pre-tokenized stream. Its ``key`` is stable across machines (a relative path, a
line number), so the split it drives is deterministic.

Sources:

- :func:`stdlib_documents`: the embedded default, the Python standard library's own ``.py``
  files (real text every Python install carries); domain = top-level module or package.
- :func:`stdlib_mixture_documents`: a mixture of real domains every Python install carries
  (``code``, ``prose``, ``decimal``, ``certs``, ``markup``); absent ones are left out.
- :func:`text_documents`: a text file or a folder of them; domain = first sub-folder.
- :func:`jsonl_documents`: JSON lines with a text field (and optionally a domain field).
- :func:`bin_documents`: a nanoGPT-style pre-tokenized ``.bin`` array (uint16 by default),
  cut into documents at an end-of-text id or into fixed-size pieces.
"""

from __future__ import annotations

import codecs
import errno
import fnmatch
import hashlib
import io
import json
import os
import re
import sysconfig
import threading
import unicodedata
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._files import check_regular, kind_of_mode, loads_json
from .errors import InputError
from .tokenizer import _LONE_SURROGATE

__all__ = [
    "Document",
    "stdlib_documents",
    "stdlib_mixture_documents",
    "MIXTURE_DOMAINS",
    "relabel_documents",
    "text_documents",
    "jsonl_documents",
    "bin_documents",
    "split_documents",
    "held_out_text",
    "read_held_out",
    "source_folders",
]

# Folders of the standard library left out of the default corpus: the test suite is a third of
# the library and mostly generated-looking fixtures; site-packages is not the standard library.
_STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})


@dataclass(frozen=True)
class Document:
    """One document: either ``text`` or pre-tokenized ``tokens`` (exactly one is set)."""

    key: str
    domain: str
    text: str | None = None
    tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        # names are stored as the probe's JSON and sorted beside each other: a number or None among
        # them was a TypeError from sorted() deep inside build_probe
        for name in ("key", "domain"):
            if not isinstance(getattr(self, name), str):
                raise InputError(f"document {self.key!r}: {name} must be a string, got {type(getattr(self, name)).__name__}")
        if (self.text is None) == (self.tokens is None):
            raise InputError(f"document {self.key!r}: give exactly one of text or tokens")
        if self.text is not None and not isinstance(self.text, str):
            raise InputError(f"document {self.key!r}: text must be a str, got {type(self.text).__name__} (decode bytes first)")


def stdlib_documents(root: str | os.PathLike | None = None, *, include_tests: bool = False) -> list[Document]:
    """The standard library's own ``.py`` files as documents, in a deterministic order.

    Parameters
    ----------
    root : path, optional
        The standard library folder; defaults to ``sysconfig.get_paths()["stdlib"]``.
    include_tests : bool
        Keep ``test``/``tests`` folders (left out by default).
    """
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise InputError(f"standard library folder not found: {base}")
    skip = _STDLIB_SKIP - ({"test", "tests"} if include_tests else set())
    docs = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base)
        if any(part in skip for part in rel.parts):
            continue
        text = _read_text(path)
        if not text:
            continue
        domain = rel.parts[0][:-3] if len(rel.parts) == 1 else rel.parts[0]
        docs.append(Document(key=_name_text(rel.as_posix()), domain=_name_text(domain), text=text))
    if not docs:
        raise InputError(f"no .py files found under {base}")
    return docs


# The mixture's domains, in order, and the files that make each (relative to the stdlib folder).
# Certificates live in test/certdata/ from 3.12 on (and in some 3.11 builds), in test/ before.
MIXTURE_DOMAINS = ("code", "prose", "decimal", "certs", "markup")
_MARKUP_SUFFIXES = (".xml", ".toml", ".json", ".html", ".txt", ".rst")


def stdlib_mixture_documents(root: str | os.PathLike | None = None, *, domains: Sequence[str] = MIXTURE_DOMAINS,
                             max_code_documents: int | None = 400) -> list[Document]:  # fmt: skip
    """A mixture of real domains that every Python install carries, one label per document.

    - ``code``: the standard library's ``.py`` files (as :func:`stdlib_documents`, without
      ``pydoc_data``); at most ``max_code_documents`` of them, picked by a hash of the path so
      the choice is the same everywhere (None: all).
    - ``prose``: the English help topics of ``pydoc_data/topics.py``, one document per topic.
    - ``decimal``: the decimal arithmetic test vectors ``test/decimaltestdata/*.decTest``.
    - ``certs``: PEM certificates and keys under ``test/`` (base64 bodies: barely learnable).
    - ``markup``: XML, TOML, JSON, HTML, reStructuredText and plain-text files under ``test/``
      (e-mail messages, doctest files, parser fixtures), outside the folders above.

    Domains whose files are absent (Debian and some containers strip ``test/``) are left out;
    :class:`InputError` only when none is left.
    """
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise InputError(f"standard library folder not found: {base}")
    unknown = [d for d in domains if d not in MIXTURE_DOMAINS]
    if unknown:
        raise InputError(f"unknown mixture domains {unknown}; choose from {list(MIXTURE_DOMAINS)}")
    docs: list[Document] = []
    if "code" in domains:
        code = [d for d in stdlib_documents(base) if not d.key.startswith("pydoc_data/")]
        if max_code_documents is not None and len(code) > max_code_documents:
            code = sorted(code, key=lambda d: hashlib.sha256(d.key.encode()).digest())[:max_code_documents]
            code.sort(key=lambda d: d.key)
        docs += [Document(key="code/" + d.key, domain="code", text=d.text) for d in code]
    if "prose" in domains:
        docs += _pydoc_topics(base)
    test = base / "test"
    if "decimal" in domains:
        for f in sorted((test / "decimaltestdata").glob("*.decTest")):
            if text := _read_text(f):
                docs.append(Document(key="decimal/" + f.name, domain="decimal", text=text))
    if "certs" in domains and test.is_dir():
        for f in sorted(test.rglob("*.pem")):
            if text := _read_text(f):
                docs.append(Document(key="certs/" + f.relative_to(test).as_posix(), domain="certs", text=text))
    if "markup" in domains and test.is_dir():
        for f in sorted(test.rglob("*")):
            rel = f.relative_to(test)
            if f.suffix in _MARKUP_SUFFIXES and f.is_file() and rel.parts[0] not in ("decimaltestdata", "certdata"):
                if text := _read_text(f):
                    docs.append(Document(key="markup/" + rel.as_posix(), domain="markup", text=text))
    if not docs:
        raise InputError(f"none of the mixture domains {list(domains)} has files under {base}")
    return docs


def _pydoc_topics(base: Path) -> list[Document]:
    """The help topics of ``pydoc_data/topics.py`` (a dict literal), read without importing it."""
    import ast

    path = base / "pydoc_data" / "topics.py"
    if not path.is_file():
        return []
    try:
        tree = ast.parse(_read_text(path))
        topics = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign))
    except (SyntaxError, ValueError, StopIteration):
        return []
    return [Document(key=f"prose/{k}", domain="prose", text=v) for k, v in sorted(topics.items()) if isinstance(v, str) and v]


def relabel_documents(docs: Sequence[Document], mapping) -> list[Document]:
    """The same documents with the domain ``mapping`` gives them.

    ``mapping``: a dict from document key to domain (keys it lacks keep their domain), or a
    callable ``(document) -> domain``.
    """
    out = []
    for d in docs:
        new = mapping(d) if callable(mapping) else mapping.get(d.key, d.domain)
        if not isinstance(new, str) or not new:
            raise InputError(f"document {d.key!r}: the mapping gave domain {new!r}; expected a non-empty string")
        out.append(Document(key=d.key, domain=new, text=d.text, tokens=d.tokens))
    return out


def text_documents(path: str | os.PathLike, *, pattern: str = "*", encoding: str = "utf-8") -> list[Document]:
    """Documents from a text file (one document) or a folder (one document per file).

    Files that are not valid text in ``encoding`` are decoded with replacement characters;
    empty files are skipped; a UTF-8 byte-order mark opening a file is not part of its text.
    A file with a NUL byte in its first 8 KiB is binary, not text
    (an image, an archive, a compiled file; a UTF-16 text needs ``encoding=``): named alone it
    is an :class:`InputError`, in a folder it is skipped with a warning naming it. In a folder,
    hidden entries (a name starting with ``.``: ``.git/``, ``.DS_Store``) are not documents.
    Domain: the first sub-folder under ``path``, or the file's stem for files directly in it.
    Keys (relative paths) are valid Unicode in NFC, and documents come in the order of their
    names in NFC, so the split and the probe are the same whichever way a file system spells a
    name; bytes of a name that are not UTF-8 are written as ``\\xNN``.
    """
    p = Path(path)
    check_binary = not codecs.lookup(encoding).name.startswith(("utf-16", "utf-32"))
    sniff_bom = codecs.lookup(encoding).name == "utf-8"
    if sniff_bom:
        encoding = "utf-8-sig"  # a byte-order mark (Windows Notepad writes one) is not text, as in a .jsonl
    if p.is_file():
        data = p.read_bytes()
        bom = _utf16_32_bom(data) if sniff_bom else None
        if bom is None and check_binary and b"\0" in data[:_BINARY_SNIFF]:
            raise InputError(f"{p} holds NUL bytes: it is binary, not text (a token file is read as one when named *.bin)")
        text, bad = _decode(data, bom or encoding)
        if bad:
            _warn_undecodable(p, [(p.name, bad)], bom or encoding)
        return [Document(key=_name_text(p.name), domain=_name_text(p.stem), text=text)]
    if not p.is_dir():  # a FIFO, a socket, a device: read as text it would hang or never end
        check_regular(p, "text source", "; give a file or a folder")
    docs, binary, undecodable, special, repeated, outside = [], [], [], {}, {}, []
    real_root = os.path.realpath(p)
    for f in _list_files(p, pattern, special, repeated):
        rel = f.relative_to(p)
        if any(part.startswith(".") for part in rel.parts):  # .git/, .DS_Store, editors' swap files
            continue
        if os.path.commonpath([real_root, os.path.realpath(f)]) != real_root:  # reached through a link out of the folder
            outside.append(rel)
        try:
            data = f.read_bytes()
        except PermissionError:
            raise InputError(f"{p}: cannot read {_name_text(rel.as_posix())} (permission denied); make it readable, "
                             "or move it out of the source folder") from None  # fmt: skip
        bom = _utf16_32_bom(data) if sniff_bom else None
        if bom is None and check_binary and b"\0" in data[:_BINARY_SNIFF]:
            binary.append(rel.as_posix())
            continue
        text, bad = _decode(data, bom or encoding)
        if bad:
            undecodable.append((rel.as_posix(), bad))
        if text:
            domain = rel.parts[0] if len(rel.parts) > 1 else f.stem
            docs.append(Document(key=_name_text(rel.as_posix()), domain=_name_text(domain), text=text))
    if binary:
        shown = ", ".join(_name_text(b) for b in binary[:5]) + (f" and {len(binary) - 5} more" if len(binary) > 5 else "")
        warnings.warn(f"{p}: skipped {len(binary)} binary file(s) (NUL bytes, not text): {shown}", stacklevel=2)
    if special:  # a document the user may think is there: said, as a binary file is
        shown = ", ".join(f"{_name_text(f.relative_to(p).as_posix())} ({kind})" for f, kind in sorted(special.items())[:5])
        more = f" and {len(special) - 5} more" if len(special) > 5 else ""
        what = "entry that is not a regular file" if len(special) == 1 else "entries that are not regular files"
        warnings.warn(f"{p}: skipped {len(special)} {what} (no text to read): {shown}{more}", stacklevel=2)
    if repeated:  # a link back up, or a second way to a folder: its files are documents once, under the first path
        shown = ", ".join(f"{_name_text(f.relative_to(p).as_posix())} (-> {_name_text(first) or 'the source folder'})"
                          for f, first in sorted(repeated.items())[:5]) + (f" and {len(repeated) - 5} more" if len(repeated) > 5 else "")
        warnings.warn(f"{p}: skipped {len(repeated)} link(s) to a folder read already (its files are documents once, "
                      f"under the path named): {shown}", stacklevel=2)  # fmt: skip
    if outside:  # an archive or a clone keeps links: one out of the corpus (notes -> ~/.ssh) is read, and named
        links = sorted({_link_out(p, real_root, rel) for rel in outside})
        shown = ", ".join(f"{_name_text(link)} (-> {_name_text(target)})" for link, target in links[:5])
        warnings.warn(f"{p}: read {len(outside)} document(s) through links that lead outside the folder: {shown}"
                      + (f" and {len(links) - 5} more" if len(links) > 5 else "")
                      + "; make sure they are meant to be in the corpus", stacklevel=2)  # fmt: skip
    if undecodable:
        _warn_undecodable(p, undecodable, encoding)
    folders = {d.domain for d in docs if "/" in d.key}
    merged = sorted((d.key, d.domain) for d in docs if "/" not in d.key and d.domain in folders)
    if merged:  # a.txt beside a/: documented as a domain of its own, it joined the folder's
        shown = ", ".join(f"{k} joins {dom}/" for k, dom in merged[:5]) + (f" and {len(merged) - 5} more" if len(merged) > 5 else "")
        warnings.warn(f"{p}: {len(merged)} file(s) directly in the folder share their domain (the file's stem) with a "
                      f"sub-folder: {shown}; move or rename them if they are another domain", stacklevel=2)  # fmt: skip
    if not docs:
        raise InputError(f"no non-empty text files matching {pattern!r} under {p}")
    return docs


def _list_files(root: Path, pattern: str, skipped: dict[Path, str] | None = None,
                repeated: dict[Path, str] | None = None, folders: list[Path] | None = None) -> list[Path]:
    """The regular files (symlinks to files too) that ``root.rglob(pattern)`` finds, sorted by
    their names in NFC (as their keys are), but
    for hidden entries (``.git/``: never entered, so a large or unreadable one costs nothing).
    As ``rglob``, ``**`` is any run of folders and a name segment (``*``, ``a``) goes through
    links; unlike it, ``**`` also enters a linked folder (``wiki -> /disk/wiki``: its files were
    left out without a word), after the real tree and each real folder once: a link to a folder
    read already (``..``, a loop; a folder of the source; a second link to one folder) is not
    entered, and is put in ``repeated`` with the path it repeats ("" for ``root``); the folders
    ``**`` enters go in ``folders``. A folder that cannot
    be listed is an :class:`InputError` (``rglob`` skips it without a word: its documents were
    silently left out). Entries the pattern names that are neither a regular file nor a folder
    (a FIFO, a socket, a device, a broken link or a link loop: none holds a document to read,
    and a FIFO would block the read forever) are put in ``skipped`` with what each is (once
    each, however many ways ``**`` reaches its folder)."""
    parts = Path(pattern).parts
    if not parts or Path(pattern).is_absolute():
        raise InputError(f"file pattern {pattern!r} must be relative to the folder and not empty (e.g. '*.txt')")
    found: set[Path] = set()
    entered: dict[tuple, Path] = {}  # (device, inode, segments) of each folder '**' entered -> its path
    links: list[tuple[Path, tuple[str, ...]]] = []  # linked folders '**' met: entered after the real tree

    def _unlistable(folder: Path, exc: OSError):
        rel = os.path.relpath(folder, root)
        raise InputError(f"{root}: cannot list the folder {_name_text(rel)} ({(exc.strerror or 'error').lower()}); "
                         "make it readable, or move it out of the source folder") from None  # fmt: skip

    def claim(folder: Path, segments: tuple[str, ...]) -> bool:
        """Whether '**' is to go into ``folder``: not if it was there already (a repeat, said)."""
        try:
            st = os.stat(folder)
        except OSError as exc:
            _unlistable(folder, exc)
        # st_ino 0: a file system without inode numbers (Python: "if non-zero, uniquely identifies
        # the file"); there every folder read as the first one: told apart by its real path instead
        ident = (st.st_dev, st.st_ino) if st.st_ino else os.path.realpath(folder)
        first = entered.setdefault((ident, segments), folder)
        if first is not folder and repeated is not None:
            repeated[folder] = "" if first == root else first.relative_to(root).as_posix()
        if first is folder and folders is not None:
            folders.append(folder)
        return first is folder

    def select(folder: Path, segments: tuple[str, ...]) -> None:
        head, rest = segments[0], segments[1:]
        try:
            with os.scandir(folder) as it:
                entries = [e for e in it if not e.name.startswith(".")]
        except OSError as exc:
            _unlistable(folder, exc)
        if head == "**":  # no folder, or one more (a real one) and still '**'
            if rest:
                select(folder, rest)
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    if claim(Path(e.path), segments):
                        select(Path(e.path), segments)
                elif e.is_symlink() and _entry_is(e, "dir"):
                    links.append((Path(e.path), segments))
            return
        for e in entries:
            if fnmatch.fnmatchcase(e.name, head):
                if not rest and _entry_is(e, "file"):
                    found.add(Path(e.path))
                elif not rest and skipped is not None and not _entry_is(e, "dir"):
                    skipped[Path(e.path)] = _not_a_document(Path(e.path))
                elif rest and _entry_is(e, "dir"):
                    select(Path(e.path), rest)

    claim(root, ("**", *parts))
    select(root, ("**", *parts))
    while links:  # in rounds: a round's links claim their folders (in name order) before any is walked
        pending, links[:] = sorted(links), []
        for link, segments in [(link, segments) for link, segments in pending if claim(link, segments)]:
            select(link, segments)
    # in the order of the names in NFC, as their keys are: a corpus whose names a file system spells
    # decomposed (macOS) comes in the same order, so the same seed draws the same probe windows
    return sorted(found, key=lambda f: ([unicodedata.normalize("NFC", part) for part in f.relative_to(root).parts], f))


def _link_out(root: Path, real_root: str, rel: Path) -> tuple[str, str]:
    """The first link on the way from ``root`` to ``rel`` that leads outside ``real_root``, and where."""
    for k in range(1, len(rel.parts) + 1):
        target = os.path.realpath(root.joinpath(*rel.parts[:k]))
        if os.path.commonpath([real_root, target]) != real_root:
            return Path(*rel.parts[:k]).as_posix(), target
    return rel.as_posix(), os.path.realpath(root / rel)


def source_folders(path: str | os.PathLike) -> list[Path]:
    """The folders :func:`text_documents` reads the files of, as real paths: the folder ``path``,
    its sub-folders and the linked folders it enters, but for hidden ones (a file written in one
    of these is a document the next time; in a hidden folder of them, never)."""
    folders: list[Path] = []
    _list_files(Path(path), "*", {}, {}, folders)
    return sorted({Path(os.path.realpath(f)) for f in folders})


def _not_a_document(p: Path) -> str:
    """What ``p``, neither a regular file nor a folder, is (links followed): "a FIFO", "a broken link", ..."""
    try:
        return kind_of_mode(os.stat(p).st_mode)
    except FileNotFoundError:
        return "a broken link"
    except OSError as exc:
        return "a link loop" if exc.errno == errno.ELOOP else f"unreadable ({(exc.strerror or 'error').lower()})"


def _entry_is(entry: os.DirEntry, kind: str) -> bool:
    """``entry.is_file()`` or ``is_dir()``, False for a link that loops (ELOOP raised, as ``Path.is_file`` does not)."""
    try:
        return entry.is_file() if kind == "file" else entry.is_dir()
    except OSError:
        return False


_BINARY_SNIFF = 8192  # as git: a NUL byte in the first 8 KiB makes a file binary


def _utf16_32_bom(data: bytes) -> str | None:
    """The codec of a UTF-16 or UTF-32 text that opens with its byte-order mark (Windows tools
    save "Unicode" text so), when the whole file decodes in it; else None. Such a text is full
    of NUL bytes and was skipped as binary."""
    codec = _wide_bom(data)
    if codec is None:
        return None
    try:
        data.decode(codec)
    except UnicodeDecodeError:
        return None
    return codec


def _wide_bom(head: bytes) -> str | None:
    """The codec (``utf-16`` or ``utf-32``) whose byte-order mark opens ``head``, else None."""
    for bom, codec in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                       (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):  # fmt: skip
        if head.startswith(bom):
            return codec
    return None


def _decode(data: bytes, encoding: str) -> tuple[str, int]:
    """``data`` decoded as ``errors="replace"`` does (what is not valid in ``encoding`` becomes
    U+FFFD), and how many stretches of bytes were replaced (0: the text is exact)."""
    try:
        return data.decode(encoding), 0
    except UnicodeDecodeError:
        _COUNT.n = 0
        text = data.decode(encoding, errors="tokdyn-count-replace")
        return text, _COUNT.n


_COUNT = threading.local()


def _count_replace(exc: UnicodeDecodeError):
    _COUNT.n = getattr(_COUNT, "n", 0) + 1
    return codecs.replace_errors(exc)


codecs.register_error("tokdyn-count-replace", _count_replace)


def _warn_undecodable(where, files: list[tuple[str, int]], encoding: str, what: str = "document(s)") -> None:
    """A warning naming the files (or lines) whose bytes were not valid ``encoding``: their text
    holds U+FFFD where those bytes were (a Latin-1 or Windows-1252 file read as UTF-8)."""
    enc = "UTF-8" if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig") else encoding
    shown = ", ".join(f"{_name_text(f)} ({n} place{'s' if n > 1 else ''})" for f, n in files[:5])
    more = f" and {len(files) - 5} more" if len(files) > 5 else ""
    warnings.warn(f"{where}: {len(files)} {what} not valid {enc}, their undecodable bytes replaced by U+FFFD: "
                  f"{shown}{more} (a Latin-1 or Windows-1252 file? convert it to UTF-8, e.g. iconv -f latin1 -t utf-8)",
                  stacklevel=3)  # fmt: skip


def _name_text(name: str) -> str:
    """A file name as a document key or domain: valid Unicode (a name's bytes that are not UTF-8,
    which Python keeps as lone surrogates, become ``\\xNN``), on one line (a control character,
    which Linux allows in a name, is written ``\\xNN``, or ``\\uNNNN`` from U+0080 on, as are the
    line and paragraph separators: a newline or carriage return in a key would split it in two
    in a file of keys, one a line), in NFC (macOS writes names decomposed, Linux as they are
    given), so keys encode, print, hash and list one a line the same everywhere."""
    if _LONE_SURROGATE.search(name):
        name = os.fsencode(name).decode("utf-8", errors="backslashreplace")
    name = _LINE_BREAKING.sub(_escape_char, name)
    return unicodedata.normalize("NFC", name)


# The characters a key written one a line must not hold: the C0 and C1 controls (newline,
# carriage return, and what str.splitlines() also splits at: \v \f \x1c-\x1e \x85), DEL, and
# the Unicode line and paragraph separators.
_LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape_char(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x80 else f"\\u{c:04x}"


def jsonl_documents(
    path: str | os.PathLike, *, text_field: str = "text", domain_field: str | None = None
) -> list[Document]:
    """Documents from a JSON-lines file, one per line with a string ``text_field``.

    With ``domain_field`` every record's domain is that field, which must be a non-empty string:
    a record where it is missing, null, a number, a list, an object or ``""`` is an
    :class:`InputError` naming the line and the value (it would otherwise be labelled ``"None"``
    or ``"3"`` and mixed into a domain of its own, silently). Without it every document's domain
    is ``"default"``.

    A record that gives ``text_field`` (or ``domain_field``) twice is an :class:`InputError`:
    ``json.loads`` keeps the last, other readers the first, so the text a training pipeline reads
    could be another than this one held out.

    As with text files, what is not valid text is replaced by U+FFFD: bytes that are not UTF-8,
    and lone surrogates written as JSON escapes (``"\\ud800"``, which no encoder can write). A file
    opening with a UTF-16 or UTF-32 byte-order mark (Windows PowerShell's ``Out-File``) is read
    in that encoding, as its UTF-8 twin would be.
    """
    p = check_regular(path, "JSON lines file")
    docs, undecodable, names = [], [], []

    def fields(pairs: list) -> dict:  # the field names of the object built last: the record's (it closes last)
        names[:] = [k for k, _ in pairs]
        return dict(pairs)

    with open(p, "rb") as fh:  # each line decoded on its own, to name the lines whose bytes were not UTF-8
        source, wide = fh, _wide_bom(fh.read(4))
        fh.seek(0)
        if wide:  # UTF-16 or -32 (PowerShell's Out-File): read as its UTF-8 twin would be
            text, bad = _decode(fh.read(), wide)
            if bad:
                _warn_undecodable(p, [(p.name, bad)], wide, "file(s)")
            source = io.BytesIO(text.encode("utf-8", "surrogatepass"))
        lines = (line for chunk in source for line in chunk.splitlines(keepends=True))  # at \n, \r\n and \r, as text mode
        for lineno, raw in enumerate(lines, 1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):  # a byte-order mark (Windows tools) is not JSON
                raw = raw[len(codecs.BOM_UTF8):]
            line, bad = _decode(raw, "utf-8")
            if bad:  # bytes of this line were not UTF-8 (U+FFFD now): said below
                undecodable.append((f"line {lineno}", bad))
            if not line.strip():
                continue
            try:
                rec = loads_json(line, object_pairs_hook=fields)
            except json.JSONDecodeError as exc:
                raise InputError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
            for name in (text_field, domain_field):  # json.loads keeps the last of the two; another reader, the first
                if isinstance(rec, dict) and name is not None and names.count(name) > 1:
                    raise InputError(f"{p}:{lineno}: the field {name!r} is given twice in one record; readers differ in "
                                     "which one they keep (a training pipeline's could keep the other): give it once")  # fmt: skip
            if not isinstance(rec, dict):
                raise InputError(f"{p}:{lineno}: expected an object with a string field {text_field!r}; "
                                 f"{_found(rec).replace('it is', 'the line is', 1)}")  # fmt: skip
            if not isinstance(rec.get(text_field), str):
                raise InputError(f"{p}:{lineno}: the text field {text_field!r} must be a string; "
                                 f"{_found(rec[text_field]) if text_field in rec else 'it has no such field'}")  # fmt: skip
            domain = _record_domain(rec, domain_field, f"{p}:{lineno}") if domain_field else "default"
            if rec[text_field]:
                docs.append(Document(key=f"{_name_text(p.name)}:{lineno}", domain=domain, text=_valid_text(rec[text_field])))
    if undecodable:
        _warn_undecodable(p, undecodable, "utf-8", "line(s)")
    if not docs:
        raise InputError(f"{p}: no documents with a non-empty {text_field!r} field")
    return docs


def _record_domain(rec: dict, field: str, where: str) -> str:
    """The domain of a JSON record: its ``field``, a non-empty string (else one line naming
    ``where`` and what is there instead)."""
    value = rec.get(field)
    if isinstance(value, str) and value:
        return _valid_text(value)
    found = _found(value) if field in rec else "it has no such field"
    raise InputError(f"{where}: the domain field {field!r} must be a non-empty string; {found} "
                     "(give every record a domain, or leave out the domain field)")


def _found(value) -> str:
    """``it is <value> (<kind>)`` for a message about a JSON value, the value cut to 40 characters."""
    shown = json.dumps(value, ensure_ascii=False)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"it is {shown}" + {str: " (empty)" if value == "" else " (a string)", type(None): "", list: " (a list)",
                               dict: " (an object)", bool: " (a boolean)"}.get(type(value), " (a number)")  # fmt: skip


def _valid_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, as undecodable bytes are (json.loads
    joins escaped pairs: any surrogate left is alone)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def bin_documents(
    path: str | os.PathLike,
    *,
    dtype: str = "uint16",
    eot_id: int | None = None,
    doc_tokens: int = 4096,
) -> list[Document]:
    """Documents from a nanoGPT-style flat token file (``np.memmap`` of ``dtype``).

    With ``eot_id`` the stream is cut at each end-of-text token (a document = the tokens between
    two of them; an id that never occurs is an :class:`InputError`); otherwise into consecutive pieces of ``doc_tokens`` tokens, so that the split
    by document still keeps probe text out of training. Each document's ``tokens`` is a read-only
    view of the mapped file (in ``dtype``), so nothing is read until it is used.

    A file that holds wider integers than ``dtype`` (uint32 or int32 ids read as uint16, the
    default; int64 ids, numpy's default integer, read as uint16 or uint32) is an
    :class:`InputError` saying so: read in halves, every id is two, one of them 0, and all are
    token ids a vocabulary has. Told by a sample of the file: the high parts of nearly every wide
    value are 0 (or below 4: ids below 2**18), where the low parts mostly are not.
    """
    p = check_regular(path, "token file")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InputError(f"token dtype must be an integer type, got {dtype!r}") from None
    if dt.kind not in "ui":
        raise InputError(f"token dtype must be an integer type, got {dtype!r}")
    if eot_id is not None:
        info = np.iinfo(dt)
        if isinstance(eot_id, bool) or not isinstance(eot_id, (int, np.integer)) or not info.min <= eot_id <= info.max:
            raise InputError(f"{p}: end-of-text id must be an integer a {dt} token can hold ({info.min}..{info.max}), got {eot_id!r}")
    size = p.stat().st_size
    if size == 0:  # before mapping it: numpy cannot map an empty file
        raise InputError(f"{p}: empty token file")
    if size % dt.itemsize:
        raise InputError(f"{p}: size {size} B is not a multiple of {dt} ({dt.itemsize} B)")
    arr = np.memmap(p, dtype=dt, mode="r")
    _check_not_wider(p, arr)
    if eot_id is not None:
        cuts = np.flatnonzero(arr == eot_id)
        if not cuts.size:  # one document, which no split can use: said here, with the id and the dtype
            raise InputError(f"{p}: end-of-text id {eot_id} does not occur in its {arr.size:,} {dt} tokens, so it cuts "
                             "nothing; give the id its documents end with (is the dtype right? --bin-dtype), or leave "
                             f"it out to cut the file in pieces of {doc_tokens:,} tokens")  # fmt: skip
        bounds = np.concatenate([[0], cuts + 1, [arr.size]])
    else:
        if doc_tokens < 2:
            raise InputError(f"doc_tokens must be >= 2, got {doc_tokens}")
        bounds = np.arange(0, arr.size + doc_tokens, doc_tokens).clip(max=arr.size)
    docs = []
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if b - a >= 2:
            # a view of the mapped file, not a copy: only the documents tokenized later (the probe
            # side, or a training stream) are read, so a token file larger than memory is cut as well
            docs.append(Document(key=f"{_name_text(p.name)}@{int(a)}", domain="default", tokens=arr[a:b]))
    return docs


def _check_not_wider(p: Path, arr: np.ndarray, *, stretches: int = 16, stretch_bytes: int = 8192, min_values: int = 256) -> None:
    """:class:`InputError` where the token file ``arr`` (a map of ``p``) looks like integers
    wider than its dtype: 4- or 8-byte little-endian ones, read in halves (or quarters), where
    each id is a low part (the id, below 65,536) and a high part (0).

    Told by a sample of at least ``min_values`` wide values (``stretches`` stretches of
    ``stretch_bytes`` spread over the file: a few pages of a file of any size), where the high
    parts differ from the low parts as no file of the dtype's own tokens has them differ: >= 99 %
    of the high parts are 0 while < 50 % of the low parts are, or (ids of a vocabulary of up to
    262,144, Llama 3's or Gemma's, whose high 16 bits are 0 to 3) >= 99 % of the high parts are
    below 4 while < 50 % of the low parts are. A file of the dtype's own tokens has the same ids
    at even and odd places: it passes whether it is mostly 0 (padding, an end-of-text id 0
    between short documents) or of a vocabulary of four ids (DNA's); it would take nearly every
    other token to be 0 (or 0 to 3) and the others not."""
    item = arr.dtype.itemsize
    raw = arr.view(np.uint8)
    usable = raw.size - raw.size % 8
    if usable // 4 < min_values:  # too few wide values to tell
        return
    if usable <= stretches * stretch_bytes:
        sample = np.asarray(raw[:usable])
    else:  # stretches starting at multiples of 8 bytes: a wide value's bytes stay together
        starts = np.linspace(0, usable - stretch_bytes, stretches).astype(np.int64) // 8 * 8
        sample = np.concatenate([raw[a : a + stretch_bytes] for a in starts])
    for width, names in ((8, "64-bit token ids (int64, numpy's default integer)"), (4, "32-bit token ids (uint32 or int32)")):
        if width <= item:
            continue
        wide = sample.view(f"<u{width}")
        high, low = wide >> np.uint64(8 * item), wide & np.uint64((1 << (8 * item)) - 1)
        if wide.size < min_values or not any(np.mean(high < k) >= 0.99 and np.mean(low < k) < 0.5 for k in (1, 4)):
            continue
        fix = ("give its dtype: --bin-dtype uint32 (dtype='uint32')" if width == 4 else
               "tokdyn reads token files of uint16, uint32 or int32: convert it (np.fromfile(path, np.int64)"
               ".astype(np.uint32).tofile(new)) and give --bin-dtype uint32 (dtype='uint32')")  # fmt: skip
        cut = "halves, every other value" if width // item == 2 else "quarters, 3 of every 4 values"
        raise InputError(f"{p}: read as {arr.dtype}, the file looks like {names} cut in {cut} the high part "
                         f"of an id (0); {fix}")  # fmt: skip


def split_documents(
    docs: Sequence[Document], *, probe_fraction: float = 0.05, salt: str = "tokdyn"
) -> tuple[list[Document], list[Document]]:
    """Deterministic split by document into (train, probe).

    A document goes to the probe side when a hash of ``salt`` and its key falls below
    ``probe_fraction``: the same key lands on the same side on every machine and for every
    corpus it appears in, so no probe document is ever trained on. (A copy of a probe document
    under another key, a file in two folders or a repeated JSON line, can land on the training
    side: :func:`tokdyn.data.prepare_probe` names them, ``ProbeSplit.train_copies``, for the
    training to leave out.)
    """
    if not 0.0 < probe_fraction < 1.0:
        raise InputError(f"probe_fraction must be in (0, 1), got {probe_fraction}")
    keys = [d.key for d in docs]
    if len(set(keys)) != len(keys):
        seen: set[str] = set()
        twice = next(k for k in keys if k in seen or seen.add(k))
        raise InputError(f"document keys must be unique to split deterministically; {twice!r} is the key of two documents")
    train, probe = [], []
    for d in docs:
        h = int.from_bytes(split_digest(salt, d.key)[:8], "big")
        (probe if h / 2**64 < probe_fraction else train).append(d)
    if len(docs) == 1:
        raise InputError(f"the source is one document ({docs[0].key!r}); the probe is cut from documents held out of "
                         "training, so it needs several: a folder of text files, or a .jsonl file of one document a line")  # fmt: skip
    if not train or not probe:
        side, fix = ("probe", "a larger probe fraction") if not probe else ("training", "a smaller probe fraction")
        raise InputError(f"split of {len(docs)} documents with probe_fraction={probe_fraction} left the {side} side "
                         f"empty; give {fix} or more documents")  # fmt: skip
    return train, probe


def held_out_text(keys: Iterable[str]) -> str:
    """The text of a held-out file (``tokdyn probe --held-out``): each key, then a newline.

    A key of tokdyn's sources is always one line (:func:`text_documents` writes a control
    character of a file name as ``\\xNN``); a key that would break a line (a newline, a carriage
    return, any character ``str.splitlines`` splits at) is an :class:`InputError`, never a file
    that lists other keys than the documents'. Read it back with :func:`read_held_out`.
    """
    out = []
    for k in keys:
        if not isinstance(k, str) or not k or _LINE_BREAKING.search(k):
            raise InputError(f"document key {k!r} cannot be written one a line (empty, or holding a line break or "
                             "control character); name documents as tokdyn's sources do (tokdyn.corpus.text_documents)")
        out.append(k + "\n")
    return "".join(out)


def read_held_out(path: str | os.PathLike) -> list[str]:
    """The keys of a held-out file written by ``tokdyn probe --held-out``, in order.

    One key a line, UTF-8; a line ends at ``\\n`` only (``\\r\\n`` too, as a Windows editor saves
    it); blank lines are skipped. A file written by an earlier tokdyn reads the same, except where
    a file name held a line break: its key was written across two lines then (``\\x0a`` in the
    key now, which moves that document's side of the split); make such a file again. Never train on a document whose key is listed: ``[d for d in docs if d.key not in held]``.
    """
    p = check_regular(path, "held-out file")  # a FIFO would block the read forever
    try:
        with open(p, encoding="utf-8", errors="strict", newline="") as fh:
            text = fh.read()
    except OSError as exc:
        raise InputError(f"cannot read held-out file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a held-out file of document keys (not UTF-8 at byte {exc.start})") from None
    keys = []
    for line in text.split("\n"):
        line = line[:-1] if line.endswith("\r") else line
        if line:
            keys.append(line)
    return keys


def split_digest(salt: str, key: str) -> bytes:
    """The sha256 a split orders a document by: of ``salt`` and its key in NFC (one spelling of a
    name, whatever the file system wrote), never failing on a key that is not valid Unicode."""
    return hashlib.sha256(unicodedata.normalize("NFC", f"{salt}\0{key}").encode("utf-8", "surrogatepass")).digest()


def _read_text(path: Path, encoding: str = "utf-8") -> str:
    return path.read_bytes().decode(encoding, errors="replace")


def iter_texts(docs: Iterable[Document]) -> Iterator[str]:
    """The text of each text document (for training a tokenizer)."""
    for d in docs:
        if d.text is not None:
            yield d.text


def source_kind(source: str) -> str | None:
    """``"jsonl"`` or ``"bin"`` for a file source of that kind, by its extension in any case
    (``DATA.JSONL`` was read as one text document of JSON lines), else None."""
    low = os.fspath(source).lower()
    return "jsonl" if low.endswith(".jsonl") else "bin" if low.endswith(".bin") else None
