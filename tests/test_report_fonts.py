"""A user's strings in figures are drawn, never as matplotlib's empty boxes, and never alike.

DejaVu Sans (matplotlib's default) has no Chinese: two run or domain names in Chinese were two
rows of the same boxes in a legend. A character some installed font has is drawn from it; one
that no installed font has is written as an escape, as the page writes what shows nothing; a
name is cut between escapes, and one legend never shows two names the same.
"""

from __future__ import annotations

import io
import re
import warnings

import matplotlib
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

import tokdyn  # noqa: E402
from test_hostile import fitted_store  # noqa: E402
from tokdyn import _fonts  # noqa: E402
from tokdyn._fonts import figure_label, legend_labels, shown_label, use_fallback_fonts  # noqa: E402


def _missing_glyph_warnings(draw) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draw()
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


def _draw(fig) -> None:
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)


def _dejavu_sans() -> frozenset[int]:
    from matplotlib import font_manager

    return _fonts._charmap(font_manager.findfont("DejaVu Sans", fallback_to_default=False))


@pytest.fixture
def planted_fonts(monkeypatch):
    """The default font DejaVu Sans (whatever this machine's matplotlibrc says), and the
    installed fonts replaced by one, "Planted", that has 天 (U+5929) and nothing else."""
    monkeypatch.setattr(_fonts, "_default", _dejavu_sans)
    monkeypatch.setattr(_fonts, "_installed", lambda: (("Planted", frozenset({0x5929})),))


@pytest.fixture
def no_fonts(monkeypatch):
    """DejaVu Sans and no other installed font: every character it lacks is an escape."""
    monkeypatch.setattr(_fonts, "_default", _dejavu_sans)
    monkeypatch.setattr(_fonts, "_installed", lambda: ())


def test_characters_no_font_has_are_escapes_and_the_others_name_their_font(planted_fonts):
    assert _fonts.drawable("天地 run") == "天\\u5730 run"
    assert _fonts.fallback_families("天地 run") == ["Planted"]
    assert _fonts.drawable("plain μ α ü") == "plain μ α ü" and _fonts.fallback_families("plain μ α ü") == []
    assert _fonts.drawable("🙂") == "\\U0001f642"
    assert figure_label("地理") == "\\u5730\\u7406" and figure_label("cost $5 地") == "cost \\$5 \\u5730"


def test_a_long_name_is_cut_between_escapes(no_fonts):
    """Cut after escaping, the middle of an escape was left ("\\u…0\\u4e8c"); now whole escapes
    only, within the limit."""
    for name in ("数据集甲乙丙丁戊己庚辛壬癸", "ab" + "天" * 30 + "cd", "x" * 17 + "天" * 10, "天" * 7):
        label = shown_label(name)
        assert len(label) <= _fonts.LABEL_CHARS
        head, _, tail = label.partition("…")
        for part in (head, tail):  # a backslash only as the start of a whole escape
            assert not re.search(r"\\(?!u[0-9a-f]{4})", part), label
        if len(_fonts.drawable(name)) <= _fonts.LABEL_CHARS:
            assert label == _fonts.drawable(name)


def test_one_legend_never_shows_two_names_alike(no_fonts):
    """Two long names that differ in the middle, and a name beside the text of its escapes."""
    a, b = "数据集甲乙丙丁戊己庚辛壬癸", "数据集甲乙丁丁戊己庚辛壬癸"
    assert shown_label(a) == shown_label(b)  # cut alike: the reason for the numbers
    assert legend_labels([a, b, a]) == [f"{shown_label(a)} [1]", f"{shown_label(a)} [2]", f"{shown_label(a)} [1]"]
    assert legend_labels(["天文", "\\u5929\\u6587"]) == ["\\u5929\\u6587 [1]", "\\u5929\\u6587 [2]"]
    assert legend_labels(["plain", "其他"]) == ["plain", "\\u5176\\u4ed6"]
    # a number never reads as another entry: the name "\u5929\u6587 [1]" keeps its label
    assert legend_labels(["天文", "\\u5929\\u6587", "\\u5929\\u6587 [1]"]) == [
        "\\u5929\\u6587 [2]", "\\u5929\\u6587 [3]", "\\u5929\\u6587 [1]"]


@settings(max_examples=200, deadline=None)
@given(names=hs.lists(hs.text(hs.sampled_from("ab\\u$天文地🙂\u202e …x0[]1"), max_size=50), min_size=1, max_size=6))
def test_legend_labels_tell_different_names_apart(names):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fonts, "_default", _dejavu_sans)
        mp.setattr(_fonts, "_installed", lambda: ())
        labels = legend_labels(names)
    by_label = {}
    for n, label in zip(names, labels):
        by_label.setdefault(label, set()).add(n)
        assert len(label) <= _fonts.LABEL_CHARS + 2 * 6  # the cut, "$" escapes (one "\" each, at most ~1/2) aside
    assert all(len(ns) == 1 for ns in by_label.values()), by_label


def test_reading_the_installed_fonts_logs_nothing(caplog):
    """Asking matplotlib for each family's font logged "findfont: Failed to find font weight
    normal for DejaVu Sans Condensed" (three lines on a user's terminal for one Chinese name)."""
    import logging

    _fonts._families.cache_clear()
    with caplog.at_level(logging.DEBUG - 1, logger="matplotlib"):
        assert _fonts.drawable("天") in ("天", "\\u5929")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


def test_every_character_an_installed_font_file_has_is_drawn_or_escaped():
    """Characters from every font file matplotlib lists (bold and italic faces included, whose
    family's regular face may lack them), drawn through the figure rule: no missing glyph. The
    first version took a bold face's characters for its family's, and drew those as boxes."""
    from matplotlib import font_manager, ft2font

    codes = set()
    for entry in font_manager.fontManager.ttflist:
        try:
            codes |= set(ft2font.FT2Font(entry.fname).get_charmap())
        except Exception:  # noqa: BLE001
            continue
    pick = sorted(c for c in codes if 0x80 < c < 0x110000 and chr(c).isprintable() and not chr(c).isspace()
                  and not 0xD800 <= c < 0xE000)  # fmt: skip
    sample = np.random.default_rng(0).choice(pick, size=min(600, len(pick)), replace=False)
    fig, ax = plt.subplots()
    for k in range(0, len(sample), 20):
        ax.text(0, k / len(sample), figure_label("".join(map(chr, sample[k : k + 20])), limit=10_000))
    use_fallback_fonts(fig)
    assert _missing_glyph_warnings(lambda: _draw(fig)) == []


def test_a_character_only_another_installed_font_has_is_drawn_from_it():
    """A character of matplotlib's own STIXGeneral that DejaVu Sans lacks: without the fallback
    the figure warns of a missing glyph (the positive control); with it, it does not, and the
    text names a family whose font has it."""
    from matplotlib import font_manager, ft2font

    def charmap(family):
        return set(ft2font.FT2Font(font_manager.findfont(family, fallback_to_default=False)).get_charmap())

    code = min(c for c in charmap("STIXGeneral") - charmap("DejaVu Sans") if c > 0x2000 and chr(c).isprintable())
    label = figure_label(f"run {chr(code)}")
    assert label == f"run {chr(code)}"  # kept: a font has it

    def figure():
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1], label=label)
        ax.legend()
        return fig

    assert _missing_glyph_warnings(lambda: _draw(figure())), "no positive control"
    fig = figure()
    use_fallback_fonts(fig)
    text = fig.axes[0].get_legend().get_texts()[0]
    assert _missing_glyph_warnings(lambda: _draw(fig)) == []
    assert code in charmap(text.get_fontfamily()[-1])


def test_the_default_font_is_the_one_matplotlib_draws_with_now():
    """The default font's characters follow rcParams (a cached first answer did not)."""
    before = _fonts._default()
    with matplotlib.rc_context({"font.family": "STIXGeneral"}):
        assert _fonts._default() != before
    assert _fonts._default() == before


def test_a_report_of_chinese_domain_names_draws_no_box(tmp_path):
    """The whole report, two domains named in Chinese: no figure draws a missing glyph, on a
    machine with a Chinese font or without one."""
    st = fitted_store(tmp_path / "s.zarr", domains=("天文", "地理"))
    assert _missing_glyph_warnings(lambda: tokdyn.write_report(st, tmp_path / "report.html")) == []


def test_the_caption_says_which_name_each_escaped_legend_entry_is(tmp_path, no_fonts):
    """With no font that has them, the legend writes the names as escapes and the figure's
    caption, which the browser draws, says whose they are."""
    st = fitted_store(tmp_path / "s.zarr", domains=("天文", "地理", "plain"))
    page = tokdyn.write_report(st, tmp_path / "report.html").read_text()
    assert "Legend entries that do not read as the whole name (cut, written with escapes where no font installed here draws a character" in page
    assert "\\u5929\\u6587 is 天文" in page and "\\u5730\\u7406 is 地理" in page and "is plain" not in page


def test_the_curriculum_a_b_figure_draws_domain_names_as_the_report_does(tmp_path, monkeypatch):
    """`plot_mixture` drew the domains' names raw: boxes for Chinese, a name starting with "_"
    left out of the legend, "$" read as mathtext."""
    from matplotlib.figure import Figure

    from tokdyn.curriculum.ab import plot_mixture

    drawn = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (drawn.append(self), real(self, *a, **k))[1])
    domains = ["天文", "_hidden", "cost $5"]
    res = {"eval_steps": [1, 2, 4], "runs": [{"arm": "base", "curve": [[3.0, 3.1], [2.5, 2.4], [2.0, 2.1]]}],
           "arm_info": {"mixture": {"weights": np.full((4, 3), 1 / 3).tolist(), "domains": domains}}}  # fmt: skip
    assert _missing_glyph_warnings(lambda: plot_mixture(res, tmp_path / "m.png")) == []
    labels = [t.get_text() for t in drawn[0].axes[1].get_legend().get_texts()]
    assert labels == legend_labels(domains) and labels[1] == "_hidden" and labels[2] == "cost \\$5"
