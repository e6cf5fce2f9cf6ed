"""Hunt 24: the report at its edges, as a researcher reads it: a probe whose text holds
right-to-left overrides, control characters and line ends only (the token viewer), domains named
'' or ' ' (the legends), and the viewer's plot at the right end of its axis (in a browser)."""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import tokdyn
from tokdyn import report
from tokdyn._fonts import legend_labels, shown_label
from tokdyn._text import _BIDI
from tokdyn.analysis import analyze_store
from test_report_browser import CHROMIUM, fitted_store, self_check

HOSTILE_TOKENS = ["\u202eevil", "\u2067\u05e9\u05dc\u05d5\u05dd", "\x07", "\x00", "\n", "\r\n", "\t", "a\u2028b", "ok", " ", "\u05e9\u05dc\u05d5\u05dd"]


class Vocab:
    """Tokens that are whole strings: an override, an isolate, control characters, line ends."""

    vocab = HOSTILE_TOKENS

    def spec(self) -> dict:
        return {"kind": "hostile-words", "vocab_size": len(self.vocab)}

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tokens = (np.arange(4 * 23) % len(HOSTILE_TOKENS)).astype(np.int32).reshape(4, 23)
    st = fitted_store(tmp_path_factory.mktemp("h24") / "s.zarr", tokens, Vocab().spec())
    return st, analyze_store(st, n_boot=0)


def test_the_token_viewer_shows_overrides_and_control_characters_as_escapes(hostile):
    """A token "\\u202eevil" read "live" in the viewer, and the line naming it under the
    pointer read backwards to its end ('".ti egnahc gnirevoh tel ot ...'): the viewer showed the
    probe's text as it is, where the example tokens' table escapes what would disturb the page.
    A token that is only a line end was an empty span the pointer could not find."""
    st, an = hostile
    data, *_ = report._viewer_data(st, an.runs[0], report._decoder(st.probe, Vocab()))
    shown = {tok[0] for seq in data["seqs"] for tok in seq}
    want = {"\\u202eevil", "\\u2067\u05e9\u05dc\u05d5\u05dd", "\\x07", "\\x00", "↵\n", "\t", "a\\u2028b", "ok", " ", "\u05e9\u05dc\u05d5\u05dd"}
    assert shown == want  # "\r\n" is one line end too
    text = "".join(tok[0] for seq in data["seqs"] for tok in seq)
    assert not _BIDI & set(text) and all(unicodedata.category(c) not in ("Cc", "Zl") for c in text if c not in "\n\t")


@given(hst.text(max_size=12))
@settings(max_examples=200, deadline=None)
def test_a_viewer_token_never_holds_what_reorders_or_hides_text(piece):
    shown = report._viewer_text(piece)
    assert not _BIDI & set(shown)
    assert all(unicodedata.category(c) not in ("Cc", "Zl", "Zp", "Cs") for c in shown if c not in "\n\t")
    assert shown.count("\n") == len(re.findall(r"\r\n|\r|\n", piece))  # each line end is one line break, shown (↵) before it
    assert shown.count("↵") - piece.count("↵") == shown.count("\n")


@pytest.mark.parametrize("names", [["", "code"], ["code", "code "], [" ", "  ", "prose"], ["\t", "web"]])
def test_a_domain_name_that_shows_nothing_at_an_end_is_quoted_in_a_legend(names):
    """Domains named '' or ' ' were legend entries of no text (a curve nobody could name), and
    'code ' beside 'code' two entries that read the same."""
    labels = legend_labels(names, for_matplotlib=False)
    assert all(lab.strip() == lab and lab for lab in labels) and len(set(labels)) == len(names)
    for n, lab in zip(names, labels):
        if n.strip() != n or not n:
            assert lab == shown_label(repr(n))  # as the commands' lines name it (_text.labels)
    note = report._legend_note([*names, "x" * 60])  # a cut name: the caption names the entries
    assert not re.search(r" is (;|\.$|$)", note)  # never "'' is " and nothing after it


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_the_viewer_s_plot_draws_every_label_inside_it(tmp_path):
    """The last tick of the viewer's plot, "10,000" at its right edge, was cut to "10,00" (and a
    learning time near the end, "μ = 9,000", ran past it)."""
    tokens = (np.arange(4 * 23) % len(HOSTILE_TOKENS)).astype(np.int32).reshape(4, 23)
    st = fitted_store(tmp_path / "s.zarr", tokens, Vocab().spec())
    page = tokdyn.write_report(st, tmp_path / "report.html", tokenizer=Vocab())
    got, _ = self_check(page, "ok", tmp_path)
    assert got["points"] > 0 and got["svg_outside"] == [], got["svg_outside"]


def overlapping_tick_labels(fig) -> list[tuple[str, str]]:
    """Pairs of neighbouring tick labels of one axis of ``fig`` that overlap as drawn."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        for axis, lo in ((ax.xaxis, "x0"), (ax.yaxis, "y0")):
            boxes = sorted(((t.get_window_extent(renderer), t.get_text()) for t in axis.get_ticklabels()
                            if t.get_visible() and t.get_text()), key=lambda b: getattr(b[0], lo))  # fmt: skip
            for (a, ta), (b, tb) in zip(boxes, boxes[1:]):
                if a.overlaps(b):
                    out.append((ta, tb))
    return out


def test_no_figure_writes_tick_labels_over_each_other(tmp_path, monkeypatch):
    """A probe whose token ids each occur 61 to 89 times (a small vocabulary): the figure of
    learning time against frequency labelled every tick of its count axis, 61 to 89, into one
    unreadable run of digits ("61626364656667..."). Every figure's tick labels are checked."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 28, (40, 51)).astype(np.int32)
    st = fitted_store(tmp_path / "s.zarr", tokens, {"kind": "ids", "vocab_size": 28})
    seen = {}
    real = report._png

    def checked(fig):
        seen[len(seen)] = overlapping_tick_labels(fig)
        return real(fig)

    monkeypatch.setattr(report, "_png", checked)
    tokdyn.write_report(st, tmp_path / "report.html")
    assert len(seen) >= 6 and not {k: v for k, v in seen.items() if v}


def page_text(page: str) -> str:
    """The words of a report page: no script, no image data, no markup."""
    import html

    page = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page))).split())


@pytest.mark.parametrize("axis", ["D", "M"])
def test_a_store_of_an_axis_run_only_speaks_of_its_axis(tmp_path, axis):
    """A store holding only a D (or M) axis run: its metadata table said "steps 0..5" (the axis
    run's row numbers, not its budgets 100,000 to 1e7), and what the classes mean said "a straight
    fall in log steps" and "fitted ... in log steps" of a run that has none."""
    from tokdyn.axes import AXIS_ATTRS, assemble_axis

    from test_axes_report import BUDGETS, make_probe, planted_axis

    Y, values = planted_axis(), BUDGETS[:6] / (1 if axis == "D" else 100)
    st = tokdyn.open_store(tmp_path / "s.zarr", make_probe(), mode="w")
    for j, v in enumerate(values):
        with st.create_run(f"r{j}", capacity=2, attrs={AXIS_ATTRS[axis]: float(v)}).writer() as w:
            w.append(Y[:, j] + 1, step=0)
            w.append(Y[:, j], step=10)
    tokdyn.fit_run(assemble_axis(st, axis), progress=False)
    text = page_text(tokdyn.write_report(tokdyn.open_store(st.url), tmp_path / "r.html").read_text())
    assert "log steps" not in text and "steps 0..5" not in text and " 0..5 " not in text
    noun = {"D": "data budgets", "M": "model sizes"}[axis]
    first, last = report._row_text(values[0]), report._row_text(values[-1])
    assert f"axis-{axis} {axis} 6 x 1,500 {noun} {first}..{last}" in text
    assert "r0 T 2 x 1,500 steps 0..10" in text  # the sources, T runs, by their steps


def test_no_figure_of_a_flat_run_scales_its_axis_by_a_factor_apart(tmp_path, monkeypatch):
    """A run whose every token stayed flat: the figure of the classes' changes drew bars of
    5e-5 nats on an axis ticked -1 to 6 with "1e-5" apart at its far end, beside labels that read
    0.000: an axis read without that factor said the loss fell by 5 nats per token. No axis of
    any figure may carry a factor (or offset) apart from its tick labels."""
    probe = tokdyn.ProbeSet.from_tokens((np.arange(30 * 51) % 28).astype(np.int32).reshape(30, 51), tokenizer={"kind": "ids", "vocab_size": 28})
    rng = np.random.default_rng(0)
    rng.uniform(size=3 * probe.n_tokens)  # (the draws of a planted event, unused: these tokens stay flat)
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    steps = np.unique(np.geomspace(1, 1e4, 16).astype(int))
    Y = (1.0 + rng.normal(0, 0.03, (len(steps), probe.n_tokens))).clip(0.01)
    with st.create_run("flat", capacity=len(steps)).writer() as w:
        for k, step in enumerate(steps):
            w.append(Y[k], step=int(step))
    tokdyn.fit_run(st.run("flat"), options=tokdyn.FitOptions(two_step=False), progress=False)
    apart, real = [], report._png

    def checked(fig):
        fig.canvas.draw()
        apart.extend((ax.get_xlabel() or ax.get_title(), t) for ax in fig.axes
                     for t in (ax.xaxis.get_offset_text().get_text(), ax.yaxis.get_offset_text().get_text()) if t)  # fmt: skip
        return real(fig)

    monkeypatch.setattr(report, "_png", checked)
    page = tokdyn.write_report(st, tmp_path / "report.html").read_text()
    assert "How much each class" in page and apart == []


def test_long_domain_names_leave_the_group_panels_their_width(tmp_path):
    """Domains named like 'common-crawl-2024-snapshot-xxxx...-part-07': their legend in two
    columns was wider than its panel, and the layout narrowed all four panels of the figure of
    the spectrum split by group to 13 % of its width each (their curves a thumbnail)."""
    from tokdyn.analysis import analyze_store as analyze

    n, d = 3000, 30
    names = [f"common-crawl-2024-snapshot-{'x' * 40}-part-{i:02d}" for i in range(d)]
    tokens = np.random.default_rng(0).integers(0, 40, (n // 50, 51)).astype(np.int32)
    probe = tokdyn.ProbeSet.from_tokens(tokens, domain=np.arange(n // 50) % d, domains=names, tokenizer={"kind": "ids", "vocab_size": 40})
    rng = np.random.default_rng(1)
    steps = np.unique(np.geomspace(1, 1e4, 16).astype(int))
    x, mu = np.log10(steps), rng.uniform(0.5, 3.5, n)
    Y = 1 + rng.uniform(1, 3, n) / (1 + np.exp((x[:, None] - mu[None, :]) / 0.15)) + rng.normal(0, 0.03, (len(steps), n))
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    with st.create_run("r", capacity=len(steps)).writer() as w:
        for k, step in enumerate(steps):
            w.append(Y[k].clip(0.01), step=int(step))
    tokdyn.fit_run(st.run("r"), options=tokdyn.FitOptions(two_step=False), progress=False)
    fig = report._fig_groups(st, analyze(st, n_boot=0).runs[0]).fig
    fig.canvas.draw()
    widths = [ax.get_window_extent().width / (fig.get_figwidth() * fig.dpi) for ax in fig.axes]
    assert len(widths) == 4 and min(widths) >= 0.6 / len(widths), widths  # each panel at least 60 % of an equal share


def test_a_run_of_too_few_measured_points_never_reads_nan(tmp_path):
    """A run whose mean loss is measured at 4 points (its other rows hold a loss for under half
    the tokens) has no R²: the headline read "rebuild its rate of change with R² nan", the
    scores "nan" and the legend "(R² nan)". The page now says why there is none."""
    rng = np.random.default_rng(0)
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(0, 40, (30, 51)).astype(np.int32), tokenizer={"kind": "ids", "vocab_size": 40})
    n, steps = probe.n_tokens, np.unique(np.geomspace(1, 1e4, 16).astype(int))
    x, mu = np.log10(steps), rng.uniform(0.2, 1.0, probe.n_tokens)
    Y = 1 + rng.uniform(1, 3, n) / (1 + np.exp((x[:, None] - mu[None, :]) / 0.1)) + rng.normal(0, 0.03, (len(steps), n))
    Y[4:, 8:] = np.nan  # all but 8 tokens observed at the first 4 steps only (unfit)
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    with pytest.warns(RuntimeWarning), st.create_run("r", capacity=len(steps)).writer() as w:
        for k, step in enumerate(steps):
            w.append(Y[k].clip(0.01), step=int(step))
    tokdyn.fit_run(st.run("r"), options=tokdyn.FitOptions(two_step=False), progress=False)
    seen, real = [], report._png

    def legends(fig):
        seen.extend(t.get_text() for leg in fig.legends + [ax.get_legend() for ax in fig.axes] if leg for t in leg.get_texts())
        return real(fig)

    with pytest.MonkeyPatch.context() as mp, pytest.warns(Warning):
        mp.setattr(report, "_png", legends)
        text = page_text(tokdyn.write_report(st, tmp_path / "r.html").read_text())
    assert "R² n/a" in " ".join(seen) and not [t for t in seen if re.search(r"\bnan\b", t, flags=re.I)]
    assert not re.search(r"\bnan\b", text), re.findall(r".{60}\bnan\b.{20}", text)  # ("NaN losses" is a column)
    assert "too few points were measured to score" in text and "no R^2 or relative L2 error: 4 measured points" in text
