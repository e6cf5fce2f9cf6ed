"""A user's strings (run, domain and store names, metadata values, the probe's own text) as
text that shows every character: one rule for the report's page and the commands' lines."""

from __future__ import annotations

import math
import numbers
import operator
import shlex
import unicodedata

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


# what reorders the text around it: bidirectional embeddings, overrides and isolates
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def one_line(value, limit: int | None = None) -> str:
    """``str(value)`` on one line: each run of whitespace (newlines, tabs) one space, the ends
    stripped, then cut to its first ``limit`` characters (all of it where None). What a message
    quotes of an error or a stored value."""
    return " ".join(str(value).split())[:limit]


def shown(value: object) -> str:
    """``repr(value)`` for an error message: short, and never failing (an int of more than
    4300 digits has no repr; any object's may raise)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        bits = operator.index(value).bit_length()
        if bits > 100:
            sign = "a negative" if value < 0 else "an"
            return f"{sign} int of about {int(bits * math.log10(2)) + 1} digits"
    try:
        text = one_line(repr(value))
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= 200 else text[:200] + "..."


def escape(ch: str) -> str:
    """One character as Python writes it in a string's escape: ``\\x07``, ``\\u202e``,
    ``\\U0001f642``."""
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def visible(text, *, data: bool = False) -> str:
    """A user's string (a run, domain or store name, a metadata value) with every character that
    shows nothing written as an escape, as ``tokdyn info`` writes it: control characters, and
    format characters such as a right-to-left override (which reversed the page's own text after
    the name), zero-width spaces and joiners (two names that looked the same), and line or
    paragraph separators. With ``data`` (the probe's own text, the example tokens) only what
    would disturb the page is escaped: control characters, the bidirectional overrides and
    isolates, line and paragraph separators; a soft hyphen, a zero-width non-joiner (Persian) or
    a left-to-right mark is the text's own."""
    text = str(text)
    if text.isprintable() and text.isascii():
        return text
    out = []
    for k, ch in enumerate(text):
        cat = unicodedata.category(ch)
        invisible = (cat in ("Cc", "Zl", "Zp", "Cs") or ch in _BIDI) if data else cat in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")
        if ch == "\u200d" and 0 < k < len(text) - 1 and unicodedata.category(text[k - 1]) in ("So", "Sk", "Mn") \
                and unicodedata.category(text[k + 1]) == "So":  # fmt: skip
            invisible = False  # a zero-width joiner between the parts of an emoji (👩\u200d💻) is part of it
        if 0xE0020 <= ord(ch) <= 0xE007F and k and (unicodedata.category(text[k - 1]) == "So" or 0xE0020 <= ord(text[k - 1]) <= 0xE007F):
            invisible = False  # the tag characters of a subdivision flag (🏴 + tags) are part of it
        if invisible:
            out.append(_NAMED.get(ch) or escape(ch))
        else:
            out.append(ch)
    return "".join(out)


def page_label(name) -> str:
    """A name as the page's text writes it: :func:`visible`, and quoted as Python writes it where
    it shows nothing at an end (``''``, ``' '``, ``'code '``), as :func:`labels` does (a caption
    saying which domain a legend entry is read "'' is " and nothing after it)."""
    name = str(name)
    return visible(name) if name and name == name.strip() else repr(name)


def labels(names) -> list[str]:
    """Each of ``names`` as :func:`visible` shows it, unless two different names would show the
    same (a domain ``"a\\n"`` holding a newline and one holding a backslash and ``n``): then
    those are shown as Python writes them (``repr``), quoted and with their backslashes doubled,
    so weights or rows printed beside them are told apart. So is a name that shows nothing at an
    end or holds a line's separator: empty, with whitespace at an end, or with a comma (domains
    ``''`` and ``' '`` printed as ``step 1:  0.50,   0.50``)."""
    names = [str(n) for n in names]
    shown = [visible(n) for n in names]
    clash = {v for v in shown if len({n for n, w in zip(names, shown) if w == v}) > 1}
    return [repr(n) if v in clash or not v or v != v.strip() or "," in v else v for n, v in zip(names, shown)]


def say(line: str) -> None:
    """Print a progress line whose paths and names are a user's: with every character visible (a
    newline in a folder's name printed a line of its own)."""
    print(visible(line))


def exact(value) -> str:
    """A number in the fewest digits that read back as it: ``10``, ``1234.5678``, ``1179648``
    (``:g`` gives 1234.57 and 1.17965e+06: a command that passes one on, such as ``--axis-min``,
    would pass another number)."""
    v = float(value)
    for digits in range(6, 17):
        text = f"{v:.{digits}g}"
        if float(text) == v:
            return text
    return f"{v:.17g}"


def command_line(command: str, store, *options) -> str:
    """A command as a shell line that gives each word back to it: ``command`` (``tokdyn fit``),
    then ``store`` as its positional word (:func:`positional`), then ``options``: a flag
    (``--refit``) as it is, a pair ``(option, value)`` as :func:`option_word` writes it. Each
    word is quoted where the shell would split or read it (:func:`shlex.quote`)."""
    words = [command, shlex.quote(positional(store))]
    words += [option_word(*o) if isinstance(o, tuple) else shlex.quote(str(o)) for o in options]
    return " ".join(words)


def option_word(option: str, value) -> str:
    """``--option VALUE``, quoted; ``--option=VALUE`` where the value begins with ``-``, which
    argparse would take for an option (``--run -lr3e-4`` is refused)."""
    value = str(value)
    return f"{option}={shlex.quote(value)}" if value.startswith("-") else f"{option} {shlex.quote(value)}"


def positional(path) -> str:
    """A path as a command's positional word: ``./-x.zarr`` for ``-x.zarr``, which argparse
    would take for an option; anything else as it is."""
    path = str(path)
    return f"./{path}" if path.startswith("-") else path
