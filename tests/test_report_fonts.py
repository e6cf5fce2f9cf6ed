"""A user's strings in the report's figures are drawn, never as matplotlib's empty boxes.

DejaVu Sans (matplotlib's default) has no Chinese: two run or domain names in Chinese were two
rows of the same boxes in a legend. A character some installed font has is drawn from it; one
that no installed font has is written as an escape, as the page writes what shows nothing.
"""

from __future__ import annotations

import warnings

import matplotlib
import pytest

matplotlib.use("Agg")

import tokdyn  # noqa: E402
from test_hostile import fitted_store  # noqa: E402
from tokdyn import _fonts  # noqa: E402
from tokdyn.report import _literal, _png  # noqa: E402


def _charmap(family: str) -> set[int]:
    from matplotlib import font_manager, ft2font

    return set(ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)).get_charmap())


def _missing_glyph_warnings(draw) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draw()
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


@pytest.fixture
def planted_fonts(monkeypatch):
    """The installed fonts replaced by one, "Planted", that has 天 (U+5929) and nothing else."""
    monkeypatch.setattr(_fonts, "_installed", lambda: (("Planted", frozenset({0x5929})),))
    _fonts._family_for.cache_clear()
    yield
    _fonts._family_for.cache_clear()


def test_characters_no_font_has_are_escapes_and_the_others_name_their_font(planted_fonts):
    assert _fonts.drawable("天地 run") == "天\\u5730 run"
    assert _fonts.fallback_families("天地 run") == ["Planted"]
    assert _fonts.drawable("plain μ α ü") == "plain μ α ü" and _fonts.fallback_families("plain μ α ü") == []
    assert _fonts.drawable("🙂") == "\\U0001f642"
    # two names the default font cannot draw stay two names in a legend
    assert _literal("地理") != _literal("地質") and _literal("地理") == "\\u5730\\u7406"


def test_a_character_only_another_installed_font_has_is_drawn_from_it():
    """A character of matplotlib's own STIX fonts that DejaVu Sans lacks: without the fallback
    the figure warns of a missing glyph (the positive control), through the report it does not,
    and the legend's text names a font that has it."""
    import matplotlib.pyplot as plt

    _fonts._family_for.cache_clear()
    default = _charmap("DejaVu Sans")
    code = min(c for c in _charmap("STIXGeneral") - default if c > 0x2000 and chr(c).isprintable() and not chr(c).isspace())
    label = _literal(f"run {chr(code)}")
    assert label == f"run {chr(code)}"  # kept: a font has it

    def figure():
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1], label=label)
        ax.legend()
        return fig

    plain = figure()
    assert _missing_glyph_warnings(lambda: plain.savefig(__import__("io").BytesIO(), format="png")), "no positive control"
    plt.close(plain)
    fig = figure()
    text = fig.axes[0].get_legend().get_texts()[0]
    assert _missing_glyph_warnings(lambda: _png(fig)) == []
    family = text.get_fontfamily()[-1]
    assert code in _charmap(family)


def test_a_report_of_chinese_domain_names_draws_no_box(tmp_path):
    """The whole report, two domains named in Chinese: no figure draws a missing glyph, on a
    machine with a Chinese font or without one."""
    _fonts._family_for.cache_clear()
    st = fitted_store(tmp_path / "s.zarr", domains=("天文", "地理"))
    assert _missing_glyph_warnings(lambda: tokdyn.write_report(st, tmp_path / "report.html")) == []


def test_the_caption_says_which_name_each_escaped_legend_entry_is(tmp_path, monkeypatch):
    """With no font that has them (none installed here but the default), the legend writes the
    names as escapes and the figure's caption, which the browser draws, says whose they are."""
    monkeypatch.setattr(_fonts, "_installed", lambda: ())
    _fonts._family_for.cache_clear()
    try:
        st = fitted_store(tmp_path / "s.zarr", domains=("天文", "地理", "plain"))
        page = tokdyn.write_report(st, tmp_path / "report.html").read_text()
    finally:
        _fonts._family_for.cache_clear()
    assert "written as escapes in the legend: " in page
    assert "\\u5929\\u6587 is 天文" in page and "\\u5730\\u7406 is 地理" in page and "is plain" not in page
