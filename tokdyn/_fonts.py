"""A user's strings (run and domain names) as matplotlib figures draw them.

matplotlib draws a character its font lacks as an empty box (and warns "Glyph ... missing"):
two run names in Chinese, drawn with DejaVu Sans, were two rows of the same boxes in a legend.
:func:`drawable` keeps the characters some installed font has (the figure then names that font
as a fallback: :func:`use_fallback_fonts`) and writes the others as escapes (``\\u5929``), as
:func:`tokdyn._text.visible` writes what shows nothing. :func:`figure_label` is the one rule for
a name in a figure, and :func:`legend_labels` keeps different names apart in one legend. Fonts
are read only for a string with a character the default font lacks.

:func:`load_matplotlib` is how tokdyn first imports matplotlib (the report, the curriculum's
A/B figure): where matplotlib can write no settings folder (a read-only home), its own two log
lines, the second of 300 characters, are one warning.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
import warnings
from collections import Counter

from ._text import escape, visible

__all__ = ["load_matplotlib", "drawable", "fallback_families", "use_fallback_fonts", "shown_label", "figure_label", "legend_labels"]

LABEL_CHARS = 40  # a user's name in a figure is cut to this many characters

_LOCK = threading.Lock()
# Not fallbacks: matplotlib's "Last Resort" font has a glyph for every character, the box that
# names its Unicode block (what a missing glyph looks like); TeX's cm* fonts and STIX's size
# variants and non-Unicode glyphs are drawn at other sizes or for other characters than named.
_NOT_A_FALLBACK = re.compile(r"^(last resort|stixsize|stixnonunicode|cm[a-z]+\d+$)", re.IGNORECASE)
# one character as a figure shows it: an escape (visible's and drawable's), or one character
_UNIT = re.compile(r"\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|\\U[0-9a-f]{8}|\\[nrt]|.", re.DOTALL)


def load_matplotlib():
    """``matplotlib``, imported. Where it can write no settings folder (``~/.config/matplotlib``
    in a read-only home, an ``MPLCONFIGDIR`` that is not a writable folder), matplotlib makes a
    temporary one and logs two lines about it at its import ("mkdir -p failed ...", "Matplotlib
    created a temporary cache directory ... highly recommended ..."), printed before a command's
    own output; they are one warning instead, naming the folder."""
    if "matplotlib" in sys.modules:
        import matplotlib

        return matplotlib
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        about = record.getMessage()
        if about.startswith(("mkdir -p failed", "Matplotlib created a temporary")) or about.endswith("is not a writable directory"):
            held.append(record)
            return False
        return True

    log = logging.getLogger("matplotlib")
    log.addFilter(hold)
    try:
        import matplotlib
    finally:
        log.removeFilter(hold)
    if held:
        why = "; ".join(r.getMessage() for r in held if not r.getMessage().startswith("Matplotlib created")) or "no home folder"
        warnings.warn(f"matplotlib cannot write its settings folder ({why}) and uses a temporary one; "
                      "set MPLCONFIGDIR to a writable folder", RuntimeWarning, stacklevel=2)
    return matplotlib


@functools.lru_cache(maxsize=64)
def _charmap(path: str) -> frozenset[int]:
    from matplotlib import ft2font

    return frozenset(ft2font.FT2Font(path).get_charmap())


def _default() -> frozenset[int]:
    """The characters of the font matplotlib draws text with now (its rcParams, as they are)."""
    from matplotlib import font_manager, rcParams

    return _charmap(font_manager.findfont(font_manager.FontProperties(family=rcParams["font.family"])))


def _installed() -> tuple[tuple[str, frozenset[int]], ...]:
    """(family, characters) of each font family matplotlib knows now, as it resolves the family's
    name (its regular face: a character of the bold face alone is not drawn by the family)."""
    from matplotlib import font_manager

    manager = font_manager.fontManager
    return _families(id(manager), len(manager.ttflist))


@functools.lru_cache(maxsize=4)
def _families(manager: int, n_fonts: int) -> tuple[tuple[str, frozenset[int]], ...]:
    """:func:`_installed` for the font list of that identity and length (a font added later,
    ``fontManager.addfont``, is read on the next call). A family's regular face (normal style,
    weight and stretch) is the file matplotlib draws ordinary text of that family with; a family
    without one is no fallback (asking matplotlib for it logged "Failed to find font weight
    normal" on the user's terminal)."""
    from matplotlib import font_manager

    regular: dict[str, str] = {}
    for e in font_manager.fontManager.ttflist:
        weight = font_manager.weight_dict.get(e.weight, e.weight) if isinstance(e.weight, str) else e.weight
        if (e.style, e.variant, weight, e.stretch) == ("normal", "normal", 400, "normal") and not _NOT_A_FALLBACK.search(e.name):
            regular.setdefault(e.name, e.fname)
    out = []
    for name, path in regular.items():
        try:
            out.append((name, _charmap(path)))
        except Exception:  # noqa: BLE001 - a font matplotlib listed but cannot read: not a fallback
            continue
    return tuple(out)


def _family_for(code: int, default: frozenset[int]) -> str | None:
    """The first installed family other than the default's that has ``code``, or None."""
    with _LOCK:  # one scan of the fonts, whichever thread asks first
        fonts = _installed()
    return next((name for name, chars in fonts if code in chars and chars is not default), None)


def drawable(text: str) -> str:
    """``text`` with each character that no installed font draws written as an escape."""
    if text.isascii():
        return text
    default = _default()
    return "".join(ch if ord(ch) in default or ch.isspace() or _family_for(ord(ch), default) is not None else escape(ch)
                   for ch in text)  # fmt: skip


def fallback_families(text: str) -> list[str]:
    """The families, in order, that draw the characters of ``text`` the default font lacks."""
    if text.isascii():
        return []
    default = _default()
    out: list[str] = []
    for ch in text:
        if ord(ch) not in default and not ch.isspace():
            family = _family_for(ord(ch), default)
            if family is not None and family not in out:
                out.append(family)
    return out


def use_fallback_fonts(fig) -> None:
    """Before ``fig`` is drawn: each of its texts with characters the default font lacks names
    the installed families that have them after its own (matplotlib falls back glyph by glyph)."""
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        extra = fallback_families(t.get_text())
        if extra:
            t.set_fontfamily([*t.get_fontfamily(), *extra])


def shown_label(text, limit: int = LABEL_CHARS) -> str:
    """A user's string as a figure shows it: what shows nothing and what no font draws as escapes
    (:func:`visible`, :func:`drawable`), then cut in the middle to ``limit`` characters between
    escapes, never inside one (a legend of names hundreds of characters long squeezed its panels
    to nothing). A name that shows nothing at an end (``''``, ``' '``, ``'code '`` beside ``'code'``)
    is quoted as Python writes it, as the commands' lines name it (:func:`tokdyn._text.labels`):
    unquoted it was a legend entry of no text, or one that read as another."""
    text = str(text)
    text = drawable(visible(text if text and text == text.strip() else repr(text)))
    if len(text) <= limit:
        return text
    units = _UNIT.findall(text)
    keep = limit - 1
    head, tail, n = [], [], 0
    for u in units:  # the first two thirds of what fits, then the last third
        if n + len(u) > keep - keep // 3:
            break
        head.append(u)
        n += len(u)
    for u in reversed(units[len(head):]):
        if n + len(u) > keep:
            break
        tail.append(u)
        n += len(u)
    return "".join(head) + "…" + "".join(reversed(tail))


def figure_label(text, limit: int = LABEL_CHARS) -> str:
    """:func:`shown_label` as matplotlib should be given it: "$" does not start mathtext
    (mathtext stays on for tokdyn's own labels: log-axis ticks use it)."""
    return _no_mathtext(shown_label(text, limit))


def legend_labels(names, limit: int = LABEL_CHARS, *, for_matplotlib: bool = True) -> list[str]:
    """Each of ``names`` as a legend shows it (:func:`shown_label`), with a number added where
    different names would show the same (cut alike, or ``天文`` beside the text
    ``\\u5929\\u6587``), the first number no other entry reads as, so that one legend never has
    two entries that read the same; given to matplotlib (``for_matplotlib``) with "$" escaped,
    as :func:`figure_label` gives it."""
    names = [str(n) for n in names]
    shown = {n: shown_label(n, limit) for n in names}
    alike = Counter(shown.values())
    taken = {v for v in shown.values() if alike[v] == 1}  # kept as they are; a number never reads as one
    label: dict[str, str] = {}
    for n, v in shown.items():
        if alike[v] == 1:
            label[n] = v
            continue
        k = 1
        while f"{v} [{k}]" in taken:
            k += 1
        label[n] = f"{v} [{k}]"
        taken.add(label[n])
    out = [label[n] for n in names]
    return [_no_mathtext(v) for v in out] if for_matplotlib else out


def _no_mathtext(label: str) -> str:
    """``label`` with each "$" escaped, so that matplotlib draws it instead of starting mathtext."""
    return label.replace("$", r"\$")
