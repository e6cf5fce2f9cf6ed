"""Which installed font draws a character, for a user's strings in the report's figures.

matplotlib draws a character its font lacks as an empty box (and warns "Glyph ... missing"):
two run names in Chinese, drawn with DejaVu Sans, were two rows of the same boxes in a legend.
:func:`drawable` keeps the characters some installed font has (the figure names that font as a
fallback: :func:`fallback_families`) and writes the others as escapes (``\\u5929``), as
:func:`tokdyn._text.visible` writes what shows nothing. Fonts are read only for a string with a
character the default font lacks, once each per process.
"""

from __future__ import annotations

import functools
import threading

__all__ = ["drawable", "fallback_families"]

_LOCK = threading.Lock()
# matplotlib's own "Last Resort" font has a glyph for every character: the box that names its
# Unicode block, which is what a missing glyph looks like, not the character
_NOT_A_FALLBACK = ("last resort",)


def _escape(ch: str) -> str:
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


@functools.lru_cache(maxsize=1)
def _default() -> frozenset[int]:
    """The characters of the font matplotlib finds for its default family."""
    from matplotlib import font_manager, ft2font, rcParams

    path = font_manager.findfont(font_manager.FontProperties(family=rcParams["font.family"]))
    return frozenset(ft2font.FT2Font(path).get_charmap())


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, frozenset[int]], ...]:
    """(family, characters) of every font matplotlib knows, but the default's and a last resort."""
    from matplotlib import font_manager, ft2font

    out = []
    for entry in font_manager.fontManager.ttflist:
        if entry.name.lower().startswith(_NOT_A_FALLBACK):
            continue
        try:
            out.append((entry.name, frozenset(ft2font.FT2Font(entry.fname).get_charmap())))
        except Exception:  # noqa: BLE001 - a font file matplotlib listed but cannot read: not a fallback
            continue
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _family_for(code: int) -> str | None:
    """The first installed font's family that has ``code``, or None."""
    with _LOCK:  # one scan of the fonts, whichever thread asks first
        fonts = _installed()
    return next((name for name, chars in fonts if code in chars), None)


def drawable(text: str) -> str:
    """``text`` with each character that no installed font draws written as an escape."""
    if text.isascii():
        return text
    default = _default()
    return "".join(ch if ord(ch) in default or ch.isspace() or _family_for(ord(ch)) is not None else _escape(ch)
                   for ch in text)  # fmt: skip


def fallback_families(text: str) -> list[str]:
    """The families, in order, that draw the characters of ``text`` the default font lacks."""
    if text.isascii():
        return []
    default = _default()
    out: list[str] = []
    for ch in text:
        if ord(ch) not in default and not ch.isspace():
            family = _family_for(ord(ch))
            if family is not None and family not in out:
                out.append(family)
    return out
