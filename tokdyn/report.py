"""One self-contained HTML report of a store: figures (matplotlib, embedded PNG) and tables.

:func:`write_report` analyses the store (:func:`tokdyn.analysis.analyze_store`) and writes one
file: a table of contents; a summary (the job's table, the reconstruction scores of every run,
what the token classes mean); a section per analysed run (each axis present) with numbered
figures, each a function ``_fig_*(store, run_analysis) -> Figure`` listed in
:func:`_run_figures` (measured versus rebuilt ``-dL/dx``, the spectrum with its power law,
example trajectories of each class with their text in context, the class shares of the loss
drop, spectra by class, domain, frequency and position band, learning time against token
frequency and position, cartography, forgetting and Rho-1); and each run's metadata, folded.
Before the runs' figures, a token viewer (:func:`_viewer_section`) shows the probe's text
coloured by each token's fit on the first run, with its trajectory on hover and a search box:
its data is JSON in a ``<script>`` element (escaped by :func:`_script_json`), its code inline.
A new figure is one more function in that list: the page numbers it, lists it in the contents
and prints its title and caption.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import os
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from ._version import build
from ._files import check_output_path, write_atomically
from ._fonts import LABEL_CHARS, drawable, legend_labels, load_matplotlib, use_fallback_fonts
from ._text import page_label, visible
from .analysis import RunAnalysis, StoreAnalysis, analyze_store, group_codes, run_order
from .errors import InputError, StoreError, TokdynError
from .fit.models import FLAT_NATS, SHARE_MIN_NET, never_scored, scored_counts, two_sigmoid_curve, unfit_reasons
from .fit.options import CLASS_CODES, CLASS_NAMES
from .fit.sigmoid import sigmoid_curve
from .fit.job import fitted_inputs
from .spectrum import POWER_LAW_R2, fit_scored, group_labels
from .store import TrajectoryStore, as_store
from .tokenstats import RHO1_CLASSES, frequency_bands, id_counts, position_bands

__all__ = ["write_report", "render_report", "check_writable"]

AXIS_LABEL = {"T": "training step", "D": "data budget (tokens)", "M": "non-embedding parameters"}
CLASS_COLORS = {
    "learned": "#1f77b4", "already_known": "#2ca02c", "not_yet_learned": "#7f7f7f", "forgotten": "#d62728",
    "multi_step": "#9467bd", "gradual": "#ff7f0e", "noisy": "#bcbd22", "unfit": "#17becf",
}  # fmt: skip


def check_writable(out: str | os.PathLike) -> Path:
    """Raise InputError unless a file can be written at ``out`` (checked before any work)."""
    p = Path(out)
    if p.is_dir() and os.fspath(out) != "-":
        raise InputError(f"report path {p} is a folder; give a file name such as {p / 'report.html'}")
    # its folder exists (never created), no file stands in its way, it is no device, pipe or
    # socket (--out /dev/null: the report renamed over it replaced the machine's null device), not
    # "-" and not inside a zarr store (the path as given: Path("./-") is "-")
    check_output_path(out, what="report")
    parent = p.parent if str(p.parent) else Path(".")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InputError(f"cannot write the report to {p}: permission denied")
    return p


def write_report(
    store: TrajectoryStore | str,
    out: str | os.PathLike,
    *,
    analysis: StoreAnalysis | None = None,
    runs: list[str] | None = None,
    title: str | None = None,
    extra: dict | None = None,
    tokenizer=None,
) -> Path:
    """Analyse ``store`` (or use ``analysis``) and write the HTML report to ``out``; returns its path.

    ``runs``: the runs to show, in order (a run named twice is shown once).
    ``extra``: a dict shown as a table at the top (the demo puts its stage timings there).
    ``tokenizer``: the probe's tokenizer (anything with ``decode(ids)`` and ``spec()``), to show
    example tokens as text; without it only a byte-level probe is shown as text (the store keeps
    a tokenizer's description, not the tokenizer). InputError if it is not the probe's.
    """
    check_writable(out)
    st = as_store(store)
    _decoder(st.probe, tokenizer)  # a tokenizer that is not the probe's is refused before any work
    runs = None if runs is None else list(dict.fromkeys(runs))  # each run once, in the order given
    fits = _fit_ids(st)
    an = analysis if analysis is not None else analyze_store(st, runs=runs)
    text = render_report(st, an, title=title, extra=extra, tokenizer=tokenizer)
    # The figures read the fits more than once (the analysis, then each run's fitted rows): a
    # refit that finished meanwhile would be mixed into the page without a word.
    now = _fit_ids(st, [a.run for a in an.runs])
    changed = [name for name, fit_id in now.items() if fit_id != fits.get(name)]
    if changed:
        raise StoreError(f"the fit of run(s) {changed} changed while the report was made (a refit ran meanwhile), so its "
                         "figures would mix two fits; make the report again once the fit is done")  # fmt: skip
    # never a half-written report, never written through a link planted beside it
    return write_atomically(out, lambda fh: fh.write(text), what="report")


# -- the page: sections and numbered figures -------------------------------------------------


def render_report(
    st: TrajectoryStore, an: StoreAnalysis, *, title: str | None = None, extra: dict | None = None, tokenizer=None
) -> str:
    """The report's HTML (see :func:`write_report` for the arguments)."""
    matplotlib = load_matplotlib()
    matplotlib.use("Agg", force=False)
    # Tick labels say their values whole: no offset or factor written apart at an axis's end
    # ("1e-5" at the far right of bars ticked -1 to 6 read as a fall of 5 nats per token).
    with matplotlib.rc_context({"axes.formatter.useoffset": False, "axes.formatter.limits": (-9, 9)}):
        return _render(st, an, title=title, extra=extra, decode=_decoder(st.probe, tokenizer))


def _fit_ids(st: TrajectoryStore, names=None) -> dict[str, str | None]:
    """Each run's fit id (a new one for every fit started; None where there is none)."""
    out = {}
    for name in st.runs if names is None else names:
        try:
            out[name] = st.run(name).fit.meta.get("fit_id")
        except TokdynError:  # a run that cannot be opened has no fit to shift under the report
            out[name] = None
    return out


def _decoder(probe, tokenizer):
    """ids -> text for the probe's tokens, or None where they cannot be decoded here."""
    if tokenizer is not None:
        spec = json.dumps(tokenizer.spec(), sort_keys=True, default=str)
        if probe.tokenizer and spec != json.dumps(dict(probe.tokenizer), sort_keys=True, default=str):
            raise InputError(f"the tokenizer given ({spec}) is not the probe's ({json.dumps(dict(probe.tokenizer), default=str)}): "
                             "give the tokenizer the probe was made with, or leave it out (tokens are then shown as ids)")  # fmt: skip
        return lambda ids: tokenizer.decode([int(i) for i in ids])
    if probe.tokenizer.get("kind") == "byte":  # UTF-8 bytes as ids 0-255 (256: end of text)
        return lambda ids: bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")
    return None


def _legend_note(names) -> str:
    """A caption's sentence naming each legend entry that does not read as its name ("" where
    none): written with escapes, because no installed font draws some of its characters, or
    numbered, because another name would read the same (:func:`legend_labels`); in the page's
    text, which the browser draws, the name is as it is."""
    names = list(names)
    said = [f"{label} is {page_label(n)}" for n, label in zip(names, legend_labels(names, for_matplotlib=False))
            if label != page_label(n)]  # fmt: skip
    if not said:
        return ""
    return (" Legend entries that do not read as the whole name (cut, written with escapes where no font installed here "
            f"draws a character, or numbered where two would read the same): {'; '.join(said)}.")  # fmt: skip


@dataclass
class Figure:
    """One numbered figure: a matplotlib figure, a title saying what it shows, a caption saying
    how to read it, and optional markup after the image (made here from escaped parts)."""

    fig: object  # None: nothing to draw, the caption says why (a line, no numbered figure)
    title: str
    caption: str
    after: str = ""


class _Page:
    """The report's body as it is built: sections and figures numbered in order, and the table
    of contents that lists them."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.toc: list[tuple[str, str, list[tuple[str, str]]]] = []  # (id, title, [(id, title)])

    def section(self, title: str) -> None:
        sid = f"sec-{len(self.toc) + 1}"
        self.toc.append((sid, f"{len(self.toc) + 1}. {title}", []))
        self.parts.append(f"<h2 id={sid}>{_e(self.toc[-1][1])}</h2>")

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def figure(self, f: Figure | None) -> None:
        if f is None:
            return
        if f.fig is None:  # nothing to draw: said in a line, not drawn as empty axes, and not numbered
            self.parts.append(f"<p class=meta><b>{_e(f.title)}:</b> {_e(f.caption)}</p>")
            return
        n = sum(len(figs) for _, _, figs in self.toc) + 1
        fid = f"fig-{n}"
        self.toc[-1][2].append((fid, f"Figure {n}. {f.title}"))
        self.parts.append(
            f"<figure id={fid}><img alt='{_e(f'Figure {n}. {f.title}')}' src='data:image/png;base64,{_png(f.fig)}'>"
            f"<figcaption><b>Figure {n}. {_e(f.title)}.</b> {_e(f.caption)}</figcaption>{f.after}</figure>"
        )

    def toc_html(self) -> str:
        items = []
        for sid, title, figs in self.toc:
            sub = "".join(f"<li><a href='#{fid}'>{_e(t)}</a></li>" for fid, t in figs)
            items.append(f"<li><a href='#{sid}'>{_e(title)}</a>" + (f"<ul>{sub}</ul>" if sub else "") + "</li>")
        return f"<nav class=toc><h2>Contents</h2><ul>{''.join(items)}</ul></nav>"


# The figures of a run, in the order shown: each takes (store, run analysis) and returns a
# Figure, or None when the run has nothing to show for it.
def _run_figures(decode):
    return (_fig_reconstruction, _fig_spectrum, partial(_fig_trajectories, decode=decode), _fig_classes,
            _fig_groups, _fig_time_vs_token, _fig_cartography)  # fmt: skip


def _render(st: TrajectoryStore, an: StoreAnalysis, *, title: str | None, extra: dict | None, decode=None) -> str:
    title = title or f"tokdyn report: {st.url}"
    page = _Page()
    page.section("Summary")
    if extra:
        page.add(_table([], [[k, _fmt(v)] for k, v in extra.items()], caption="This job"))
    page.add("".join(_headline(a, st.run(a.run).fit.options()) for a in an.runs))
    page.add(_scores_table(an))
    page.add(_classes_help(st, an))
    if an.runs:
        a = an.runs[0]
        page.section(f"See the tokens: run {a.run}" + (f" (of {len(an.runs)} runs, the first)" if len(an.runs) > 1 else ""))
        page.add(_viewer_section(st, a, decode))
    for a in an.runs:
        page.section(f"Run {a.run} (axis {a.axis}: {AXIS_LABEL.get(a.axis, a.axis)})")
        for make in _run_figures(decode):
            page.figure(make(st, a))
    page.section("Run metadata")
    page.add(_metadata_tables(st, an))
    meta = (f"tokdyn {build()}, {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}; probe {_e(st.probe.fingerprint)}, "
            f"{st.probe.n_tokens:,} tokens. Losses are in nats (natural log); axes of steps, tokens or parameters "
            f"are on a log scale, and learning times are read off them.")  # fmt: skip
    body = "\n".join(page.parts)
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><meta name=viewport content="width=device-width, initial-scale=1"><title>{_e(title)}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}}
h1{{font-size:1.5em}} h2{{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}}
h1,h2,p,li,summary,caption,figcaption,th,.nm{{overflow-wrap:anywhere}} td{{overflow-wrap:break-word}}
table{{border-collapse:collapse;margin:1em 0;font-size:.9em;max-width:100%}} td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}}
td table{{margin:0;font-size:1em}} caption{{text-align:left;font-weight:600;padding:.3em 0}}
figure{{margin:2em 0}} figcaption{{font-size:.9em;color:#333;max-width:60em}} figure table{{font-size:.85em}}
img{{max-width:100%;height:auto}} .meta{{color:#555;font-size:.9em}} pre{{margin:0;white-space:pre-wrap;word-break:break-word;font-size:.85em}}
nav.toc{{background:#f7f7f7;border:1px solid #ddd;padding:.2em 1em .6em;font-size:.92em}} nav.toc h2{{margin-top:.5em;border:0}}
nav.toc ul{{margin:.2em 0;padding-left:1.3em}} details{{margin:1em 0}} summary{{cursor:pointer;font-weight:600}}
code.ctx{{white-space:pre-wrap;word-break:break-all;background:#f4f4f4;padding:0 .2em}} mark{{background:#ffe08a;font-weight:600}}
.swatch{{display:inline-block;width:1.6em;height:.35em;vertical-align:middle}} .wide{{overflow-x:auto}}
.tv-bar{{display:flex;flex-wrap:wrap;gap:.5em 1.5em;align-items:center;font-size:.9em}} .tv-bar input[type=search]{{width:14em}}
.tv-legend{{font-size:.85em;margin:.4em 0}} .tv-key{{margin-right:1em;white-space:nowrap}} .tv-sw{{display:inline-block;width:1em;height:1em;vertical-align:middle;margin-right:.3em;border:1px solid #ccc}}
.tv-grad{{display:block;max-width:24em;height:.8em;border:1px solid #ccc}} .tv-ticks{{display:flex;justify-content:space-between;max-width:24em}}
.tv-plot{{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.3em 0;z-index:1}} .tv-plot svg{{width:100%;max-width:640px;height:auto;display:block}}
.tv-text{{max-height:32em;overflow-y:auto;border:1px solid #ddd;padding:.4em;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em}}
.tv-seq{{white-space:pre-wrap;word-break:break-all;margin-bottom:.8em}} .tv-head{{display:block;color:#777;font-family:system-ui,sans-serif;font-size:.85em}}
.tv-tok{{cursor:pointer}} .tv-tok:hover,.tv-pin{{outline:2px solid #000}} .tv-hit{{box-shadow:inset 0 -3px 0 #ff7f0e;font-weight:700}}
</style></head><body>
<h1>{_e(title)}</h1>
<p class=meta>{meta}</p>
{page.toc_html()}
{body}
</body></html>
"""


class _Html(str):
    """Markup made here, from escaped parts: a table cell of this type is not escaped again."""


def _e(s) -> str:
    """Escaped text, every character that shows nothing made visible (:func:`tokdyn._text.visible`): the
    page's own text has none, and a user's name cannot reverse or hide the text around it."""
    return html.escape(visible(s))


def _score(v: float, digits: int = 3) -> str:
    """An R² or relative error: "n/a" where there is none (too few measured points; the note
    under the scores says why), never "nan"."""
    return f"{v:.{digits}f}" if np.isfinite(v) else "n/a"


def _fmt(v) -> _Html:
    """A value as a table cell: a dict as a table of its own, a list on one line."""
    if isinstance(v, float):
        return _Html(f"{v:.4g}")
    if isinstance(v, int) and not isinstance(v, bool):
        return _Html(f"{v:,}")
    if isinstance(v, dict):
        return _Html(_table([], [[k, _fmt(x)] for k, x in v.items()]))
    if isinstance(v, list):
        return _Html(f"<pre>{_e(json.dumps(v, default=str))}</pre>")
    return _Html(_e(v))


def _name_cell(name) -> _Html:
    """A user's name as a table cell that may break anywhere (a name of hundreds of characters
    without a space widened its column past the page)."""
    return _Html(f"<span class=nm>{_e(name)}</span>")


def _cell(c) -> str:
    """Every table cell is escaped, unless it is markup made here (:class:`_Html`)."""
    return c if isinstance(c, _Html) else _e(c)


def _table(header, rows, caption: str = "") -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f"<div class=wide><table>{cap}{head}{body}</table></div>"


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    use_fallback_fonts(fig)  # characters the default font lacks, from the installed fonts that have them
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# -- tables ----------------------------------------------------------------------------------

def _headline(a: RunAnalysis, options: dict | None = None) -> str:
    """One paragraph: how far the run's mean loss fell, over what range, who carried it, and
    why tokens were left unfit (``options``: the fit's stored options, for its thresholds)."""
    rec = a.reconstruction
    name = _axis_name(a.axis)
    ok = np.isfinite(rec.mean_loss)
    if not ok.any():
        return ""
    first, last = np.flatnonzero(ok)[[0, -1]]
    l0, l1 = float(rec.mean_loss[first]), float(rec.mean_loss[last])
    if a.class_drops.flat and abs(l1 - l0) < FLAT_MEAN_NATS:  # no class's fitted loss moved (FLAT_NATS): noise
        moved = f"stayed flat, from {l0:.2f} to {l1:.2f} nats (a change within noise),"
        carried = (f"No class's fitted loss changed by as much as {FLAT_NATS:g} nats per probe token, so the mean loss "
                   "neither fell nor rose, and shares of a loss drop would mean nothing")  # fmt: skip
    elif a.class_drops.flat:  # the measured mean moved, yet no fit carries it (noisy tokens fitted as constants)
        moved = f"{'fell' if l1 <= l0 else 'rose'} from {l0:.2f} to {l1:.2f} nats"
        carried = (f"Yet no class's fitted loss changed by as much as {FLAT_NATS:g} nats per probe token: the tokens' "
                   "fits do not carry this change, and shares of it would mean nothing")  # fmt: skip
    else:  # as many digits as show the change ("fell from 3.00 to 3.00" hid a fall of 0.004)
        digits = next((d for d in (2, 3, 4) if f"{l0:.{d}f}" != f"{l1:.{d}f}"), 2)
        moved = f"{'fell' if l1 <= l0 else 'rose'} from {l0:.{digits}f} to {l1:.{digits}f} nats"
        carried = a.class_drops.summary()  # shares, or nats where they would mean nothing
    n = rec.spectrum.n_tokens
    return (f"<p><b>Run {_e(a.run)}:</b> the mean loss of the {n:,} probe token{'s' * (n != 1)} {moved} "
            f"between {name} {_row_text(10.0 ** rec.x[first])} "
            f"and {_row_text(10.0 ** rec.x[last])}; " + (f"the fitted per-token events rebuild its rate of change with R² "
            f"{rec.r2_events:.3f}" if np.isfinite(rec.r2_events) else "too few points were measured to score how well the fitted "
            "per-token events rebuild its rate of change (the note under the scores says why)") + f". {_e(carried)}.{_multi_step_text(a)}{_unfit_text(a, options)}</p>")  # fmt: skip


def _multi_step_text(a: RunAnalysis) -> str:
    """`` multi_step is two drops for ... .`` (the class by its events' signs), or nothing."""
    note = a.class_drops.multi_step_note()
    return f" {_e(note)}." if note else ""


def _unfit_text(a: RunAnalysis, options: dict | None) -> str:
    """" Not fitted (class unfit): ..." where the fit left tokens unfit, naming each cause."""
    why = unfit_reasons(scored_counts(a.fit)[1], options)  # padding (no recorded loss) is no unfit token
    return f" Not fitted (class unfit): {_e('; '.join(why))}." if why else ""


def _class_drops(a: RunAnalysis) -> tuple[dict[str, float], bool]:
    """Each class's fitted loss drop in nats per probe token, and whether shares of the net drop
    mean something (:func:`tokdyn.fit.models.class_drops`, :data:`SHARE_MIN_NET`)."""
    return a.class_drops.nats, a.class_drops.meaningful


# (row label, what it means) of the reconstruction table, one row a score, one column a run.
SCORES = (
    ("points", "recorded steps (or budgets, or model sizes) fitted"),
    ("tokens", "probe tokens, each fitted on its own"),
    ("R² sigmoid sum", "how well the sum of every token's fitted event(s) rebuilds the measured -dL/dlog10 a (1 is perfect)"),
    ("R² spectrum", "the same for the learning-time spectrum alone (the events smoothed into a density)"),
    ("rel. L2 sigmoids", "relative L2 error of the sum of events (0 is perfect)"),
    ("rel. L2 spectrum", "relative L2 error of the spectrum"),
    ("drop carried by events", "share of the measured fall of the mean loss that the fitted events carry"),
    ("by well-fitted events", "the same, counting only events whose fit converged (with R² >= 0.5 for one sigmoid; two sigmoids whose second event is not identified count when the token's sigmoid is well fitted)"),
    ("loss exponent α [95%]", "mean loss L ~ a^(-α) fitted directly, if that is a power law (fit R² >= 0.8)"),
    ("spectrum exponent α [95%]", "ρ ~ 10^(-α x) inside the uncensored range, if that is a power law (fit R² >= 0.8)"),
)  # fmt: skip


def _scores_table(an: StoreAnalysis) -> str:
    cols = []
    for a in an.runs:
        s = a.reconstruction.summary()
        rose = a.reconstruction.mean_loss_rose
        cols.append([
            f"{s['n_points']}", f"{s['n_tokens']:,}", _score(s['r2_events']), _score(s['r2_spectrum']),
            _score(s['rel_l2_events']), _score(s['rel_l2_spectrum']), _share_text(s['drop_share_events'], rose),
            _share_text(s['drop_share_well_fitted'], rose), _power_law_text(s["loss_power_law"], a.reconstruction.loss_power_law_why),
            _power_law_text(s["spectrum_power_law"], a.reconstruction.spectrum_power_law_why),
        ])  # fmt: skip
    rows = [[label, *(c[i] for c in cols), help_] for i, (label, help_) in enumerate(SCORES)]
    header = ["", *(f"run {a.run} (axis {a.axis})" for a in an.runs), "what it measures"]
    note = "".join(_left_out_notes(a) for a in an.runs)
    note += f"<p class=meta>Not fitted (left out): {_e(', '.join(an.not_fitted))}</p>" if an.not_fitted else ""
    note += "".join(f"<p class=meta>Left out, {_e(n)}: {_e(why)}</p>" for n, why in an.failed.items())
    return _table(header, rows, caption="How well the per-token events rebuild the fall of the mean loss") + note


def _left_out_notes(a: RunAnalysis) -> str:
    """What run ``a``'s points and measured mean leave out, and why: the rows its fit left out
    (step 0, a fit window), and the rows and tokens the measured mean left out
    (:attr:`tokdyn.reconstruct.Reconstruction.notes`); one line each."""
    rec = a.reconstruction
    lines = [f"points fitted, {rec.rows_left_out}"] if rec.rows_left_out else []
    lines += [f"measured mean loss: {n}" for n in rec.notes]
    lines += [f"{label}, measured mean loss: {n}" for label, other in a.across.items() for n in other.notes]
    return "".join(f"<p class=meta>Run {_e(a.run)}: {_e(line)}</p>" for line in lines)


def _measured_tokens_text(rec, name: str, unscored: tuple[int, int] = (0, 0)) -> str:
    """Which tokens and points the measured mean loss is over, for a caption (``unscored``: the
    probe tokens in no mean, as (with no recorded loss, such as padding; set aside for their
    losses): counted, so that the tokens in the mean and those left out add up to the probe's)."""
    unmeasured = int(np.count_nonzero(~np.isfinite(rec.mean_loss)))
    none, aside = unscored
    parts = [f"{none:,} probe token{'s' * (none != 1)} with no recorded loss"] if none else []
    parts += [f"{aside:,} token{'s' * (aside != 1)} set aside for {'their' if aside != 1 else 'its'} losses (class unfit)"] if aside else []
    never = f"; {' and '.join(parts)} left out" if parts else ""
    if not (rec.n_tokens_left_out or unmeasured):
        scored = " with a recorded loss" if none and not aside else " the fit scored" if parts else ""
        return f"all {rec.spectrum.n_tokens:,} probe tokens{scored} at each recorded {name}{never}"
    left = [f"{rec.n_tokens_left_out:,} token{'s' * (rec.n_tokens_left_out != 1)} that miss a loss at some"] if rec.n_tokens_left_out else []
    left += [f"{unmeasured} {name}{'s' * (unmeasured != 1)} where most tokens have none, with no measured point"] if unmeasured else []
    return (f"the same {rec.spectrum.n_tokens:,} probe tokens at each measured {name} (left out: {' and '.join(left)}; "
            f"the lines under the table of scores say which{never})")


def _class_help(o: dict) -> dict[str, str]:
    """What each class means, with the thresholds of the fit's options ``o``."""
    d, known, r2 = o.get("delta_min", 0.5), o.get("known_loss", 1.0), o.get("r2_min", 0.5)
    return {
        "learned": f"the loss falls clearly, by {d:.1f} nats or more and by more than twice the scatter about the fit, in one step "
                   "(where the step is centred, inside the recorded range or not)",
        "multi_step": f"two fitted steps of {d:.1f} nats or more each, both centred inside the recorded range: two drops (learned "
                      "in two steps), or a drop and a rise (learned then forgotten, or the reverse; a spike at one point is also "
                      "one)",
        "gradual": "a straight fall along the log axis (of steps, budgets or sizes), without a step",
        "already_known": f"low ({known:.1f} nats or less) from the first recorded point",
        "not_yet_learned": f"above {known:.1f} nats and without a clear fall (less than {d:.1f} nats) up to the last recorded point",
        "forgotten": f"the loss rises by {d:.1f} nats or more",
        "noisy": f"the scatter hides any trend, or the fitted step explains less than {r2:.0%} of the variance",
        "unfit": f"not fitted: fewer than {o.get('min_points', 6)} observed points, or a loss no token loss takes "
                 f"(infinite, below 0, or above {o.get('max_loss', 1e4):g} nats) at one or more points",
    }  # fmt: skip


CLASS_THRESHOLDS = ("delta_min", "known_loss", "r2_min", "min_points", "max_loss")  # the options _class_help reads


def _classes_help(st: TrajectoryStore, an: StoreAnalysis) -> str:
    """What each class means, with the thresholds each run was fitted with: one table for runs
    that share them, one per set where runs were fitted with other options (a table of the first
    run's thresholds misread the classes of a run fitted with --delta-min 1)."""
    sets: dict[str, tuple[dict, list[str]]] = {}
    for a in an.runs:
        o = st.run(a.run).fit.options()
        key = json.dumps({k: o.get(k) for k in CLASS_THRESHOLDS}, sort_keys=True, default=str)
        sets.setdefault(key, (o, []))[1].append(a.run)
    tables = []
    for o, names in sets.values() or [({}, [])]:
        text = _class_help(o)
        rows = [[_Html(f"<span style='white-space:nowrap'><span style='color:{CLASS_COLORS[c]}'>■</span> {_e(c)}</span>"), text[c]] for c in CLASS_NAMES.values()]
        caption = "" if len(sets) < 2 else f"Run{'s' * (len(names) != 1)} {', '.join(names)} (fitted with these thresholds)"
        tables.append(_table(["class", "the token loss over the recorded points"], rows, caption=caption))
    differ = (" The runs were fitted with different thresholds, so one table is given for each set of runs fitted alike."
              if len(sets) > 1 else "")  # fmt: skip
    return (f"<details><summary>What the token classes mean</summary>{''.join(tables)}"
            "<p class=meta>Each token's loss curve is fitted by a constant, a line, a sigmoid and two sigmoids along "
            "the log axis (log10 of the step, data budget or model size); the simplest model that is not clearly beaten (by BIC) is kept, and the class says what that model "
            f"does between the first and the last recorded point.{differ}</p></details>")  # fmt: skip


AXIS_PLURAL = {"T": "steps", "D": "data budgets", "M": "model sizes"}


def _recorded_at(axis: str, info: dict) -> str:
    """Where a run's rows were recorded, from its ``info()``: a T run's steps, a D or M run's
    budgets or sizes (its steps are its row numbers: "steps 0..9" of an axis of model sizes
    1,000 to 1e6)."""
    steps = info["steps"]
    if not steps:
        return "none"
    if axis == "T":
        return f"steps {steps[0]:,}..{steps[-1]:,}"
    v = np.asarray(info["axis_values"], np.float64)
    if not v.size or not np.isfinite(v[[0, -1]]).all():
        return f"rows {steps[0]}..{steps[-1]}"
    return f"{AXIS_PLURAL.get(axis, axis)} {_row_text(float(v[0]))}..{_row_text(float(v[-1]))}"


def _metadata_tables(st: TrajectoryStore, an: StoreAnalysis) -> str:
    rows = []
    for name in sorted(st.runs, key=run_order):  # the order of the report's sections
        try:
            r = st.run(name)
            info = r.info()
        except TokdynError as exc:  # a damaged run is listed, not fatal to the report
            rows.append([_name_cell(name), "", "", "", "", f"cannot be read: {exc}"])
            continue
        attrs = {k: v for k, v in info["attrs"].items() if k not in ("schema_version", "tokdyn_version", "token_chunk", "codec")}
        rows.append([_name_cell(name), r.axis, f"{info['shape'][0]} x {info['shape'][1]:,}", _recorded_at(r.axis, info),
                     f"{info['nonfinite_losses']:,}", _fmt(attrs)])  # fmt: skip
    table = _table(["run", "axis", "rows x tokens", "recorded at", "NaN losses", "metadata"], rows)
    return f"<details><summary>Every run in the store, with its recorded metadata ({len(rows)} run{'s' * (len(rows) != 1)})</summary>{table}</details>"


# -- see the tokens: the probe's text coloured by each token's fit, with its trajectory -------

VIEW_TOKENS = 4096  # at most this many probe tokens in the viewer (whole sequences, first ones first)
CURVE_POINTS = 40  # the fitted curve is sent evaluated at this many x; the page draws no model itself


def _viewer_section(st: TrajectoryStore, a: RunAnalysis, decode) -> str:
    """The token viewer of run ``a``: markup, its data as JSON in a script element, and the script."""
    probe = st.probe
    if probe.tokens is None:
        return "<p class=meta>No text to show: this probe holds no tokens (an imported probe keeps losses only).</p>"
    data, shown, total, n_tokens = _viewer_data(st, a, decode)
    how = ("as text" if decode is not None else
           "as token ids (give the report the probe's tokenizer, <code>--tokenizer</code>, to see text)")  # fmt: skip
    intro = (f"<p>The probe's text, each token coloured by its fit on run {_e(a.run)}: by its learning time μ (the "
             f"middle of its fitted drop, for a multi-step token the first), by its class, or by its loss drop (the "
             f"fitted model's loss at the first recorded {_e(_axis_name(a.axis))} minus at the last). Hover over a token "
             f"to see its loss at each recorded {_e(_axis_name(a.axis))} (dots) and the fitted model (line, drawn "
             f"clipped at 0 nats) with its event time(s) (dashed); click to keep it. Shown: the first {shown:,} of "
             f"{total:,} sequences ({n_tokens:,} of {probe.n_tokens:,} probe tokens), {how}; losses rounded to 0.01 "
             f"nats. Text without colour is context the probe does not score (the first token of a sequence).</p>")  # fmt: skip
    return (f"{intro}<div class=tv id=tv>"
            "<div class=tv-bar><span class=tv-modes>colour by: <label><input type=radio name=tv-mode value=mu checked> "
            "learning time</label> <label><input type=radio name=tv-mode value=cls> class</label> <label><input "
            "type=radio name=tv-mode value=drop> loss drop</label></span> <span class=tv-find><input type=search "
            "id=tv-q placeholder='find in the text' aria-label='find in the text'> <button type=button id=tv-next>next</button> "
            "<span id=tv-count class=meta></span></span></div><div id=tv-legend class=tv-legend></div>"
            "<div class=tv-plot><div id=tv-info class=meta>Hover over a token, or click one, to see its loss trajectory.</div>"
            "<svg id=tv-svg viewBox='0 0 640 250' role=img aria-label='loss trajectory of the selected token'></svg></div>"
            "<div id=tv-text class=tv-text></div><noscript>The token viewer needs JavaScript.</noscript></div>"
            f"<script type=application/json id=tv-data>{_script_json(data)}</script><script>{_VIEWER_JS}</script>")


def _script_json(obj) -> str:
    """JSON that is safe inside a <script> element: no "</script>", "<!--" or "]]>" can form
    (every <, > and & is written as a \\u escape), and U+2028/2029 are escaped (a line break
    to older JavaScript parsers)."""
    s = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for ch in ("<", ">", "&", "\u2028", "\u2029"):
        s = s.replace(ch, f"\\u{ord(ch):04x}")
    return s


def _pieces(row, decode, window: int = 8) -> list[str]:
    """Each token of a sequence as the text it adds: what decoding it after the ``window`` tokens
    before it adds to decoding those alone, so that a character split over several tokens (UTF-8
    bytes) appears whole at its last token, and a tokenizer's spaces stay where they belong. Token
    ids where there is no decoder."""
    if decode is None:
        return [f"⟨{int(i)}⟩" for i in row]
    out = []
    for k in range(len(row)):
        start = max(0, k - window)
        before = decode(row[start:k]).rstrip("\ufffd") if k > start else ""
        upto = decode(row[start : k + 1])
        if k + 1 < len(row):
            upto = upto.rstrip("\ufffd")  # an incomplete character waits for its last byte
        # where the decoder rewrote the text before (it may), the token alone
        out.append(upto[len(before):] if upto.startswith(before) else decode(row[k : k + 1]))
    return out


def _viewer_text(piece: str) -> str:
    """A token's text as the viewer shows it: the probe's own text with what would disturb the
    page escaped (:func:`visible` with ``data``: a right-to-left override made a token "evil" read
    "live", and the line naming it under the pointer read backwards to its end), each line end
    written ↵ before the line break it makes (a token that was only a newline was an empty span
    no pointer could find), a tab kept as the text's own."""
    lines = re.split(r"\r\n|\r|\n", piece)
    return "↵\n".join("\t".join(visible(part, data=True) for part in line.split("\t")) for line in lines)


def _viewer_data(st: TrajectoryStore, a: RunAnalysis, decode):
    """The viewer's data: every scored token of the first sequences, up to VIEW_TOKENS tokens."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    probe, f = st.probe, a.fit
    ta = probe.token_arrays
    sid, pos = np.asarray(ta["sample_id"]), np.asarray(ta["token_pos"])
    total = int(probe.tokens.shape[0])
    per_seq = np.bincount(sid, minlength=total)
    shown = max(1, int(np.searchsorted(np.cumsum(per_seq), VIEW_TOKENS, side="right")))
    toks = np.flatnonzero(sid < shown)
    r = st.run(a.run)
    rows, x = fitted_inputs(r)
    Y = r.losses_at(rows, toks).astype(np.float64)  # [K, shown tokens]
    xf = np.linspace(x[0], x[-1], CURVE_POINTS)
    cc = f["class_code"]
    mu = _learning_time(f)
    timed = np.isin(cc, [CLASS_CODES["learned"], CLASS_CODES["multi_step"]]) & (mu >= f["x_first"]) & (mu <= f["x_last"])
    drop = f["drop"]
    dmax = float(np.nanquantile(np.abs(drop[np.isfinite(drop)]), 0.98)) if np.isfinite(drop).any() else 1.0
    codes = list(CLASS_NAMES)

    def cents(v) -> list:
        return [int(round(u * 100)) if np.isfinite(u) else None for u in v]

    def events(t) -> list:
        m = int(f["model"][t])
        ev = [f["mu"][t]] if m == 2 else [f["mu1"][t], f["mu2"][t]] if m == 3 else []
        return [round(float(e), 3) for e in ev if np.isfinite(e)]

    col = {int(t): j for j, t in enumerate(toks)}
    where = {(int(s), int(p)): int(t) for t, s, p in zip(toks, sid[toks], pos[toks])}
    seqs = []
    for s in range(shown):
        items = []
        for p, piece in enumerate(map(_viewer_text, _pieces(probe.tokens[s], decode))):
            t = where.get((s, p))
            if t is None:
                items.append([piece])
                continue
            d = float(drop[t])
            items.append([piece, codes.index(int(cc[t])) if int(cc[t]) in codes else -1,
                          round(float(mu[t]), 3) if timed[t] else None, round(d, 2) if np.isfinite(d) else None,
                          cents(Y[:, col[t]]), cents(_drawn_curve(f, t, xf)), events(t), _model_text(f, t, a.axis)])  # fmt: skip
        seqs.append(items)
    mu_range = [float(x[0]), float(x[-1])]
    data = {
        "x": [round(float(v), 4) for v in x], "a": [float(v) for v in r.axis_values[rows]], "xf": [round(float(v), 4) for v in xf], "axis": AXIS_LABEL.get(a.axis, a.axis),
        "classes": [[n, CLASS_COLORS[n]] for n in CLASS_NAMES.values()], "mu_range": mu_range, "drop_max": max(dmax, 1e-6),
        "viridis": [to_hex(c) for c in colormaps["viridis"](np.linspace(0, 1, 9))],
        "diverging": [to_hex(c) for c in colormaps["RdBu"](np.linspace(0, 1, 9))], "seqs": seqs,
    }  # fmt: skip
    return data, shown, total, int(toks.size)


_VIEWER_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("tv-data").textContent);
  var box = document.getElementById("tv-text"), svg = document.getElementById("tv-svg");
  var info = document.getElementById("tv-info"), legend = document.getElementById("tv-legend");
  var NS = "http://www.w3.org/2000/svg", spans = [], pinned = null, mode = "mu", hits = [], hit = -1;
  function value(v) {  // a step, budget or size as the report writes it: 1, 30, 1,000, 1.5e6, 3e5
    if (v >= 1e5) return v.toExponential(1).replace(".0e", "e").replace("e+", "e");
    if (v >= 1) return Math.round(Number(v.toPrecision(2))).toLocaleString("en");
    return v.toPrecision(2);
  }
  function ramp(stops, u) {
    u = Math.min(1, Math.max(0, u)) * (stops.length - 1);
    var i = Math.min(stops.length - 2, Math.floor(u)), w = u - i;
    var a = stops[i], b = stops[i + 1], out = "#";
    for (var k = 1; k < 7; k += 2) {
      var c = Math.round(parseInt(a.substr(k, 2), 16) * (1 - w) + parseInt(b.substr(k, 2), 16) * w);
      out += (c < 16 ? "0" : "") + c.toString(16);
    }
    return out;
  }
  function colour(tok) {
    if (mode === "cls") return tok[1] >= 0 ? D.classes[tok[1]][1] : "#ddd";
    if (mode === "mu") {
      if (tok[2] === null) return "#c8c8c8";
      return ramp(D.viridis, (tok[2] - D.mu_range[0]) / (D.mu_range[1] - D.mu_range[0]));
    }
    return tok[3] === null ? "#c8c8c8" : ramp(D.diverging, 0.5 + 0.5 * tok[3] / D.drop_max);
  }
  function gradient(stops, labels, note) {
    return "<span class=tv-grad style='background:linear-gradient(to right," + stops.join(",") + ")'></span>" +
      "<span class=tv-ticks>" + labels.map(function (s) { return "<span>" + s + "</span>"; }).join("") + "</span>" +
      "<span class=meta>" + note + "</span>";
  }
  function paint() {
    spans.forEach(function (s) {
      var c = colour(s.tok);
      s.el.style.background = c + "99";
    });
    if (mode === "cls") {
      legend.innerHTML = "";
      D.classes.forEach(function (c) {
        var item = document.createElement("span");
        item.className = "tv-key";
        var sw = document.createElement("span");
        sw.className = "tv-sw";
        sw.style.background = c[1] + "99";
        item.appendChild(sw);
        item.appendChild(document.createTextNode(c[0]));
        legend.appendChild(item);
      });
    } else if (mode === "mu") {
      var lo = D.mu_range[0], hi = D.mu_range[1];
      legend.innerHTML = gradient(D.viridis, [value(Math.pow(10, lo)), value(Math.pow(10, (lo + hi) / 2)), value(Math.pow(10, hi))],
        "learning time μ (" + D.axis + ", log scale). <span class=tv-sw style='background:#c8c8c899'></span> grey: no learning event " +
        "inside the recorded range (not learned, already known, gradual, forgotten, noisy, or an event censored)");
    } else {
      var m = D.drop_max.toFixed(1);
      legend.innerHTML = gradient(D.diverging, ["−" + m + " (rose)", "0", m + " nats (fell)"],
        "loss drop of the fitted model from the first to the last recorded point (blue: the loss fell; red: it rose)");
    }
  }
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function draw(s) {
    var tok = s.tok;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var W = 640, H = 250, L = 48, R = 26, T = 30, B = 38;  // R: half the widest tick ("10,000") fits
    var ys = tok[4].concat(tok[5]).filter(function (v) { return v !== null; }).map(function (v) { return v / 100; });
    var ymax = Math.max.apply(null, ys.concat([0.5])) * 1.08, x0 = D.x[0], x1 = D.x[D.x.length - 1];
    function px(x) { return L + (x - x0) / (x1 - x0 || 1) * (W - L - R); }
    function py(y) { return T + (1 - y / ymax) * (H - T - B); }
    var axes = el("g", {"font-size": 11, fill: "#333"}, svg);
    el("line", {x1: L, y1: py(0), x2: W - R, y2: py(0), stroke: "#888"}, axes);
    el("line", {x1: L, y1: T, x2: L, y2: py(0), stroke: "#888"}, axes);
    for (var k = Math.ceil(x0); k <= Math.floor(x1); k++) {
      el("line", {x1: px(k), y1: py(0), x2: px(k), y2: py(0) + 4, stroke: "#888"}, axes);
      el("text", {x: px(k), y: py(0) + 16, "text-anchor": "middle"}, axes).textContent = value(Math.pow(10, k));
    }
    el("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle"}, axes).textContent = D.axis + " (log scale)";
    var yt = ymax > 4 ? 2 : ymax > 2 ? 1 : 0.5;
    for (var v = 0; v <= ymax; v += yt) {
      el("text", {x: L - 6, y: py(v) + 4, "text-anchor": "end"}, axes).textContent = v.toFixed(yt < 1 ? 1 : 0);
    }
    el("text", {x: 12, y: (T + py(0)) / 2, "text-anchor": "middle", transform: "rotate(-90 12 " + (T + py(0)) / 2 + ")"}, axes).textContent = "loss (nats)";
    tok[6].forEach(function (m) {
      if (m < x0 || m > x1) return;
      el("line", {x1: px(m), y1: T, x2: px(m), y2: py(0), stroke: "#d62728", "stroke-dasharray": "4 3"}, svg);
      var late = px(m) > W - 90;  // a label that would run past the plot's right end is written to the line's left
      el("text", {x: px(m) + (late ? -4 : 4), y: T + 12, fill: "#d62728", "font-size": 11, "text-anchor": late ? "end" : "start"}, svg).textContent = "μ = " + value(Math.pow(10, m));
    });
    var pts = [];
    tok[5].forEach(function (v, i) { if (v !== null) pts.push(px(D.xf[i]).toFixed(1) + "," + py(v / 100).toFixed(1)); });
    el("polyline", {points: pts.join(" "), fill: "none", stroke: "#1f77b4", "stroke-width": 2, "class": "tv-curve"}, svg);
    tok[4].forEach(function (v, i) {
      if (v === null) return;
      var dot = el("circle", {cx: px(D.x[i]), cy: py(v / 100), r: 3, fill: "#222", "class": "tv-point"}, svg);
      el("title", {}, dot).textContent = D.axis + " " + D.a[i].toLocaleString("en") + ": " + (v / 100).toFixed(2) + " nats";
    });
    var key = el("g", {"font-size": 11, fill: "#333"}, svg);  // what the marks are, above the plot
    el("circle", {cx: L + 6, cy: 10, r: 3, fill: "#222"}, key);
    el("text", {x: L + 14, y: 14}, key).textContent = "recorded loss";
    el("line", {x1: L + 100, y1: 10, x2: L + 116, y2: 10, stroke: "#1f77b4", "stroke-width": 2}, key);
    el("text", {x: L + 120, y: 14}, key).textContent = "fitted model";
    if (tok[6].length) {
      el("line", {x1: L + 210, y1: 10, x2: L + 226, y2: 10, stroke: "#d62728", "stroke-dasharray": "4 3"}, key);
      el("text", {x: L + 230, y: 14}, key).textContent = "event time μ (middle of a fitted drop or rise)";
    }
    var cls = tok[1] >= 0 ? D.classes[tok[1]][0] : "?";
    info.textContent = "";
    var b = document.createElement("b");
    b.dir = "auto";  // isolated: a right-to-left token does not reorder the words after it
    b.textContent = JSON.stringify(tok[0]);
    info.appendChild(b);
    info.appendChild(document.createTextNode(" (sequence " + s.seq + ", position " + s.pos + "): " + cls + "; " + tok[7] +
      (pinned === s ? ". Kept: click it again (or press Escape) to let hovering change it." : ".")));
  }
  function unpin() {
    if (pinned) pinned.el.classList.remove("tv-pin");
    pinned = null;
  }
  function select(s, pin) {
    if (pin) {
      if (pinned) pinned.el.classList.remove("tv-pin");
      pinned = s;
      s.el.classList.add("tv-pin");
    }
    draw(s);
  }
  D.seqs.forEach(function (items, si) {
    var div = document.createElement("div");
    div.className = "tv-seq";
    var head = document.createElement("span");
    head.className = "tv-head";
    head.textContent = "sequence " + si;
    div.appendChild(head);
    items.forEach(function (tok, p) {
      var sp = document.createElement("span");
      sp.textContent = tok[0];
      if (tok.length > 1) {
        var s = {tok: tok, el: sp, seq: si, pos: p, start: 0};
        sp.className = "tv-tok";
        sp.addEventListener("mouseenter", function () { if (!pinned) draw(s); });
        sp.addEventListener("click", function () { if (pinned === s) unpin(); else select(s, true); });
        spans.push(s);
      }
      div.appendChild(sp);
    });
    box.appendChild(div);
  });
  // search: the joined text of each sequence, matches mapped back to the tokens they touch
  var bySeq = D.seqs.map(function (items) {
    var text = "", starts = [];
    items.forEach(function (tok) { starts.push(text.length); text += tok[0]; });
    return {text: text.toLowerCase(), starts: starts};
  });
  var spanAt = {};
  spans.forEach(function (s) { spanAt[s.seq + ":" + s.pos] = s; });
  var count = document.getElementById("tv-count"), q = document.getElementById("tv-q");
  function find() {
    box.querySelectorAll(".tv-hit").forEach(function (e) { e.classList.remove("tv-hit"); });
    hits = []; hit = -1;
    var needle = q.value.toLowerCase();
    if (!needle) { count.textContent = ""; return; }
    bySeq.forEach(function (sq, si) {
      for (var i = sq.text.indexOf(needle); i >= 0; i = sq.text.indexOf(needle, i + 1)) {
        var first = null;
        for (var p = 0; p < sq.starts.length; p++) {
          var a = sq.starts[p], b = p + 1 < sq.starts.length ? sq.starts[p + 1] : sq.text.length;
          if (b > i && a < i + needle.length) {
            var node = box.children[si].children[p + 1];
            node.classList.add("tv-hit");
            if (!first) first = spanAt[si + ":" + p] || {el: node};
          }
        }
        if (first) hits.push(first);
      }
    });
    count.textContent = hits.length + " match" + (hits.length === 1 ? "" : "es") + " in the sequences shown";
  }
  function next() {
    if (!hits.length) return;
    hit = (hit + 1) % hits.length;
    var h = hits[hit];
    h.el.scrollIntoView({block: "nearest"});
    if (h.tok) select(h, true);
    count.textContent = "match " + (hit + 1) + " of " + hits.length;
  }
  document.addEventListener("keydown", function (ev) { if (ev.key === "Escape") unpin(); });
  q.addEventListener("input", find);
  q.addEventListener("keydown", function (ev) { if (ev.key === "Enter") next(); });
  document.getElementById("tv-next").addEventListener("click", next);
  document.querySelectorAll("input[name=tv-mode]").forEach(function (r) {
    r.addEventListener("change", function () { mode = r.value; paint(); });
  });
  paint();
  // A self-check for tests, run only when the address ends in #selftest=TEXT: it searches TEXT,
  // selects the first match and writes what it found into the page.
  window.addEventListener("load", function () {
    var m = /^#selftest=(.*)$/.exec(location.hash);
    if (!m) return;
    q.value = decodeURIComponent(m[1]);
    find();
    next();
    var imgs = Array.prototype.slice.call(document.images);
    var root = document.documentElement, wide = [];
    document.querySelectorAll("body *").forEach(function (e) {
      var r = e.getBoundingClientRect();
      if (r.right > root.clientWidth + 1 && !e.closest(".wide")) wide.push(e.tagName + (e.id ? "#" + e.id : ""));
    });
    var out = document.createElement("pre");
    out.id = "selftest-result";
    out.textContent = JSON.stringify({
      tokens: spans.length, hits: hits.length, selected: pinned ? pinned.tok[0] : null,
      points: svg.querySelectorAll(".tv-point").length, curve: (svg.querySelector(".tv-curve") || {getAttribute: function () { return ""; }}).getAttribute("points").split(" ").length,
      text: box.textContent, images: imgs.length, decoded: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
      scroll_width: root.scrollWidth, client_width: root.clientWidth, overflowing: wide.slice(0, 10),
      svg_outside: Array.prototype.filter.call(svg.querySelectorAll("text"), function (t) {  // labels cut at the plot's edges
        var r = t.getBoundingClientRect(), p = svg.getBoundingClientRect();
        return r.left < p.left - 0.5 || r.right > p.right + 0.5 || r.top < p.top - 0.5 || r.bottom > p.bottom + 0.5;
      }).map(function (t) { return t.textContent; })
    });
    document.body.appendChild(out);
  });
})();
"""


# -- axes ------------------------------------------------------------------------------------


AXIS_NOUN = {"T": "training step", "D": "data budget", "M": "model size"}  # in sentences


def _axis_name(axis: str) -> str:
    return AXIS_NOUN.get(axis, axis)


def _log_ticks(axis_obj, lo: float, hi: float, width_in: float | None = None) -> None:
    """Ticks of a matplotlib x or y axis whose data are log10 values, labelled as the values;
    ``width_in``: the x axis's length in inches, so that no more labels than fit are written
    (a panel a quarter of the page wide over steps 1 to 1e6 printed "1001,00010,000")."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    span = max(hi - lo, 1e-9)
    # Within a short span, ticks at 1, 3 (1, 2, 5; 1 to 9; 1.0 to 9.5 by 0.5, by 0.2, by 0.1) times
    # a power of ten, two or more in view down to a span of 0.05 decades: the values the labels
    # name. (Ticks at half decades, 10^0.5 = 3.16, were labelled "3".)
    choices = ((1,), (1, 3), (1, 2, 5), tuple(range(1, 10)),
               *(tuple(m / 10 for m in range(10, 100, by)) for by in (5, 2, 1)))  # fmt: skip
    first = 0 if span >= 2 else 1 if span >= 1 else 2 if span >= 0.7 else 3 if span >= 0.3 else len(choices) - 1
    decades = range(int(np.floor(lo)) - 1, int(np.ceil(hi)) + 1)

    def shown(ms, step):
        return [10.0 ** (k + np.log10(m)) for k in decades for m in ms
                if k % step == 0 and lo - 1e-9 <= k + np.log10(m) <= hi + 1e-9]  # fmt: skip

    # finer where fewer than two would be in view (10^12..10^12.35 holds 1e12 alone of 1 to 9)
    first = next((i for i in range(first, len(choices)) if len(shown(choices[i], 1)) >= 2), first)
    mantissas, every = choices[first], 1
    if width_in is not None:  # coarser ticks, then every 2nd, 3rd... decade, until the labels fit
        def width(values):  # a 10-point digit is about 0.08 inch wide, plus room between labels
            return len(values) * (0.08 * max((len(_value_text(v)) for v in values), default=1) + 0.2)

        options = [(ms, 1) for ms in reversed(choices[: first + 1])] + [((1,), k) for k in range(2, 7)]
        options = options[:1] + [o for o in options[1:] if len(shown(*o)) >= 2]  # two labels in view, at least
        mantissas, every = next((o for o in options if width(shown(*o)) <= width_in), options[-1])
    major = [k + np.log10(m) for k in decades for m in mantissas]
    minor = [k + np.log10(m) for k in decades for m in range(2, 10) if m not in mantissas] if span >= 0.3 else []
    axis_obj.set_major_locator(FixedLocator(major))
    axis_obj.set_minor_locator(FixedLocator(minor))
    labelled = {round(k + np.log10(m), 9) for k in decades for m in mantissas if k % every == 0}
    if width_in is not None:  # no two labels closer than their widths: 9.9e5 beside 1e6 (0.004 decades apart)
        per_decade = width_in / span  # inches
        kept: list[float] = []
        for v in sorted(labelled, key=lambda v: (abs(v - round(v)) > 1e-9, v)):  # powers of ten first
            w = (0.08 * len(_value_text(10.0**v)) + 0.1) / per_decade  # half its own and half a neighbour's room, about
            if all(abs(v - u) >= w for u in kept):
                kept.append(v)
        labelled = set(kept)
    axis_obj.set_major_formatter(FuncFormatter(lambda v, _: _value_text(10.0**v) if round(v, 9) in labelled else ""))


def _row_text(v: float) -> str:
    """A recorded step, budget or size (a row's own axis value) in a sentence: whole numbers in
    full (step 12,345, not 12,000), others as :func:`_value_text`."""
    if np.isfinite(v) and v >= 1 and abs(v - round(v)) <= 1e-6 * v:
        return f"{int(round(v)):,}"
    return _value_text(v)


def _value_text(v: float) -> str:
    """A step, budget or size for a tick or a table, to two significant digits as the finest
    ticks are placed (1.0 to 9.9 times a power of ten): 1, 30, 1,000, 1.5e6, 3e6. (One digit past
    1e5 labelled the ticks of a run resumed at step 1e6 "1e6, 1e6, 1e6" and 1.5e6 "2e6".)"""
    if not np.isfinite(v):
        return f"{v:g}"
    if v >= 1e5:
        mantissa, exponent = f"{v:.1e}".split("e")
        return f"{float(mantissa):g}e{int(exponent)}"
    if v >= 1:
        r = float(f"{v:.2g}")
        return f"{r:,.0f}" if r.is_integer() else f"{r:g}"  # 1.5 (a tick of a short axis), not "2"
    return f"{v:.2g}"


def _axis_x(ax, axis: str, x: np.ndarray) -> None:
    ax.set_xlabel(f"{AXIS_LABEL.get(axis, axis)} (log scale)")
    width_in = ax.get_position().width * ax.figure.get_figwidth()  # before layout: about the panel's width
    _log_ticks(ax.xaxis, float(np.nanmin(x)), float(np.nanmax(x)), width_in=width_in)


def _legend_below(ax, *handles_labels, ncol: int = 1, **kw) -> None:
    ax.legend(*handles_labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, frameon=False, fontsize=8, **kw)


# -- figures ---------------------------------------------------------------------------------


# The curves rebuilt from another run's events: no blue or red (the axis's own two curves).
ACROSS_STYLES = (":", "-.", (0, (5, 2)), (0, (1, 1, 3, 1)))
ACROSS_COLORS = ("C4", "C5", "C8", "C9")


def _fig_reconstruction(st: TrajectoryStore, a: RunAnalysis) -> Figure:
    import matplotlib.pyplot as plt

    rec = a.reconstruction
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    ax0.plot(rec.x, rec.mean_loss, "o-", ms=3, color="k")
    _axis_x(ax0, a.axis, rec.x)
    ax0.set_ylabel("mean probe loss (nats)")
    ax0.set_title("mean probe loss")
    ax1.plot(rec.x, rec.measured, "o", ms=4, color="k", label="measured")
    ax1.plot(rec.x, rec.from_events, "-", color="C0", label=f"sum of fitted events (R² {_score(rec.r2_events)})")
    ax1.plot(rec.x, rec.from_spectrum, "--", color="C3", label=f"spectrum alone (R² {_score(rec.r2_spectrum)})")
    for k, ((label, other), shown) in enumerate(zip(a.across.items(), legend_labels(a.across))):  # e.g. D from the events of a T run, no fit on D
        ax1.plot(other.x, other.from_events, linestyle=ACROSS_STYLES[(k + k // len(ACROSS_STYLES)) % len(ACROSS_STYLES)],
                 color=ACROSS_COLORS[k % len(ACROSS_COLORS)], lw=1.2,
                 label=f"{shown} (R² {_score(other.r2_events)})")  # fmt: skip
    ax1.axhline(0, color="#999", lw=0.5)
    _axis_x(ax1, a.axis, rec.x)
    ax1.set_ylabel("-dL/dlog10 a (nats per decade)")
    ax1.set_title("how fast the mean loss falls")
    if a.across:  # long labels: one legend under both panels, so that it never squeezes them
        fig.legend(*ax1.get_legend_handles_labels(), loc="outside lower center", ncol=2, frameon=False, fontsize=8)
    else:
        _legend_below(ax1, ncol=3)
    name = _axis_name(a.axis)
    return Figure(fig, "The mean probe loss and how fast it falls, measured and rebuilt from the tokens",
                  f"Left: the loss averaged over {_measured_tokens_text(rec, name, _n_unscored(a))}. "
                  f"Right: how fast it falls, -dL/dlog10 a in nats per tenfold increase of the {name} (a is the {name}): "
                  f"black, measured from the mean loss (a local quadratic, smoothing {rec.smoothing:.3f} decades); blue, "
                  f"the sum of every token's fitted learning event(s); red dashed, rebuilt from the learning-time spectrum "
                  f"alone (figure below, bandwidth {rec.spectrum.bandwidth:.3f} decades)"
                  + ("; dotted, dash-dotted or dashed, rebuilt from the events of another run with no fit on this axis (each point placed "
                     "at its effective step on that run)" if a.across else "") + ". Where the lines follow the dots, "
                  "the per-token events account for how the mean loss falls; R² in the legend." + _legend_note(a.across))  # fmt: skip




def _share_text(v: float, rose: bool = False) -> str:
    """A share of the measured fall as a table cell ("n/a" where the mean loss did not clearly
    fall or rise, so no share is bounded: :class:`tokdyn.reconstruct.Reconstruction`); where the
    mean loss rose it is a share of that rise, and says so."""
    if not np.isfinite(v):
        return "n/a (the mean loss did not clearly fall or rise)"
    return f"{v:.1%} of its rise (the mean loss rose)" if rose else f"{v:.1%}"


def _power_law_text(pl: dict | None, why: str | None = None) -> str:
    """A power law's exponent as a table cell: headlined only when the fit is good; where there
    is none (``why``: the fit's refusal) or it has no interval, the reason, never "n/a" alone or
    "[nan, nan]" (docs/spectrum.md, "What is not printed")."""
    if not pl:
        return f"n/a: {why}" if why else "n/a"
    if not pl["r2"] >= POWER_LAW_R2:
        return f"not a power law (fit R² {pl['r2']:.2f})"
    lo, hi = pl["alpha_ci95"]
    return f"{pl['alpha']:.2f}{_interval_text(lo, hi, pl)} (R² {pl['r2']:.2f})"


def _interval_text(lo: float, hi: float, params: dict) -> str:
    """" [lo, hi] over N documents" (what the bootstrap resampled, where ``params`` - a power
    law's ``params`` or its summary dict - names it), or where the interval is not finite
    " (no 95 % interval: why)"."""
    if np.isfinite(lo) and np.isfinite(hi):
        units = f" over {params['n_units']:,} {params['resampled']}" if params.get("resampled") else ""
        return f" [{lo:.2f}, {hi:.2f}]{units}"
    why = params.get("alpha_ci95_why")
    return f" (no 95 % interval: {why})" if why else " (no 95 % interval)"


# A change of the measured mean loss (nats) below which a run none of whose classes moved is
# called flat; a larger one is said as it is, with the fits' silence about it.
FLAT_MEAN_NATS = 0.05


# Fewer tokens with a clear event than this (the spectrum split by group leaves such groups out)
# and the spectrum's bars and line are those few events' own sigmoid shapes, not a distribution.
FEW_EVENTS = 10
CLEAR_CLASSES = ("learned", "multi_step", "forgotten")  # the classes whose tokens have a clear fitted step


def _clear_event_times(a: RunAnalysis) -> tuple[int, np.ndarray]:
    """The tokens of a class with a clear step (:data:`CLEAR_CLASSES`), and their events' times
    μ (log10 axis; both of a multi-step token's), finite ones only."""
    f = a.fit
    code = np.asarray(f["class_code"])
    one = np.isin(code, [CLASS_CODES["learned"], CLASS_CODES["forgotten"]])
    two = code == CLASS_CODES["multi_step"]
    mu = np.concatenate([np.asarray(f["mu"])[one], np.asarray(f["mu1"])[two], np.asarray(f["mu2"])[two]])
    return int(one.sum() + two.sum()), np.sort(mu[np.isfinite(mu)])


def _few_events_text(a: RunAnalysis, n_clear: int, mu: np.ndarray) -> str:
    """A sentence for the spectrum's caption where its bars and line cannot be a distribution of
    learning times: no or fewer than :data:`FEW_EVENTS` tokens with a clear event, or all their
    events within one bandwidth of each other; empty otherwise."""
    spec, name = a.reconstruction.spectrum, _axis_name(a.axis)
    n = int(np.asarray(a.fit["class_code"]).size)
    what = f"class {', '.join(CLEAR_CLASSES[:-1])} or {CLEAR_CLASSES[-1]}"
    if n_clear == 0:
        return (f" No token of the {n:,} has a clear learning event ({what}): the bars and line are the small steps "
                "fitted to tokens whose loss did not clearly change, noise rather than a spectrum of learning times.")
    times = ", ".join(_row_text(10.0 ** v) for v in mu[:FEW_EVENTS])
    at = f"at {name}{'s' * (mu.size != 1)} {times}" if mu.size <= FEW_EVENTS else ""
    if n_clear < FEW_EVENTS:
        return (f" Only {n_clear} token{'s' * (n_clear != 1)} of the {n:,} {'has' if n_clear == 1 else 'have'} a clear "
                f"learning event ({what}{', ' + at if at else ''}; black ticks): the bars and line are the shape of "
                f"{'that event' if mu.size == 1 else 'those events'} (each drop spread over its fitted sigmoid's width "
                f"and the bandwidth){' and of the small steps fitted to the other tokens' * (n_clear < n)}, not a "
                "distribution of learning times.")  # fmt: skip
    if mu.size and mu[-1] - mu[0] < spec.bandwidth:
        return (f" All {mu.size:,} clear learning events ({what}) lie within one bandwidth ({spec.bandwidth:.3f} "
                f"decades) of each other, about {name} {_row_text(10.0 ** float(np.median(mu)))}: the width of the "
                "peak is the events' own width and the bandwidth, not a spread of learning times.")  # fmt: skip
    return ""


def _fig_spectrum(st: TrajectoryStore, a: RunAnalysis) -> Figure:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rec = a.reconstruction
    spec = rec.spectrum
    pl = rec.spectrum_power_law
    legend_params = {} if pl is None else dict(pl.params, alpha_ci95_why=None)  # the why is the table's: too long for a legend
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    widths = np.diff(spec.edges)
    lo, hi = spec.x_range
    # The spectrum lives on the recorded range only (rho is 0 outside it); the censored events sit
    # within a bandwidth of its ends, which the power law leaves out (docs/method.md): shaded so.
    # (The grey used to span from the range's ends to the grid's, the same points: nothing was
    # shaded, yet the legend named it.)
    edge = min(spec.bandwidth, 0.5 * (hi - lo))
    rose = (spec.density < 0).any() or (spec.hist < 0).any()
    n_clear, mu_all = _clear_event_times(a)
    mu_clear = mu_all[(mu_all >= lo) & (mu_all <= hi)]  # censored ones sit at an end, named in the caption
    # each bin holds the part of every event's fitted drop seen inside it (the event kernel): one
    # event fills several bins, so they are not a count of event times
    bars = "events' drop in each bin" if spec.kernel == "event" else "histogram of event times"
    for ax, log in zip(axes, (False, True)):
        ax.axvspan(lo, lo + edge, color="#e4e4e4", lw=0, label="one bandwidth from an end of the recorded range (censored events; no power law)")
        ax.axvspan(hi - edge, hi, color="#e4e4e4", lw=0)
        if not log:
            ax.bar(spec.edges[:-1], spec.hist, width=widths, align="edge", color="#c6dbef", edgecolor="#6baed6",
                   label=bars)  # fmt: skip
            ax.plot(spec.x, spec.density, color="C0", label=f"kernel density (bandwidth {spec.bandwidth:.3f} decades)")
            if rose:
                ax.axhline(0, color="#999", lw=0.5)
        else:  # log of a size: where rho < 0 (the loss rose) its size -rho, in red, rather than nothing
            up, down = np.where(spec.hist > 0, spec.hist, 0.0), np.where(spec.hist < 0, -spec.hist, 0.0)
            ax.bar(spec.edges[:-1], up, width=widths, align="edge", color="#c6dbef", edgecolor="#6baed6",
                   label=bars)  # fmt: skip
            ax.plot(spec.x, np.where(spec.density > 0, spec.density, np.nan), color="C0",
                    label=f"kernel density (bandwidth {spec.bandwidth:.3f} decades)")  # fmt: skip
            if rose:
                ax.bar(spec.edges[:-1], down, width=widths, align="edge", color="#fcd5d5", edgecolor="#e07b7b",
                       label="-ρ where ρ < 0: the loss rose (log panel)")  # fmt: skip
                ax.plot(spec.x, np.where(spec.density < 0, -spec.density, np.nan), "--", color="#d62728",
                        label="-ρ of the kernel density where ρ < 0")  # fmt: skip
        if 0 < n_clear < FEW_EVENTS:  # each clear event's time, where a few events' shapes fill the bars
            ax.plot(mu_clear, np.full_like(mu_clear, 0.04), "|", color="k", ms=14, mew=1.5, transform=ax.get_xaxis_transform(),
                    clip_on=False, label=f"time μ of each clear learning event ({mu_clear.size})")  # fmt: skip
        if pl is not None and pl.r2 >= POWER_LAW_R2:
            xs = np.linspace(*pl.x_fit, 50)
            ax.plot(xs, 10 ** (pl.params["log10_amplitude"] - pl.alpha * xs), "k--", lw=1,
                    label=f"power law α = {pl.alpha:.2f}{_interval_text(pl.alpha_lo, pl.alpha_hi, legend_params)}")  # fmt: skip
        if log:
            ax.set_yscale("log")
            size, dens = np.abs(spec.hist), np.abs(spec.density)
            top = max(dens.max(initial=0), size.max(initial=0))
            if top > 0:  # every nonzero bin stays in view; the density's far tails need not
                floor = [v[v > 0].min() for v in (size, dens[dens > top * 1e-3]) if (v > 0).any()]
                ax.set_ylim(min(floor) / 1.5, top * 1.5)
                if top * 1.5 / (min(floor) / 1.5) < 300:  # a few decades: plain 0.5, 1, 2, 5, not 5x10^-1
                    from matplotlib.ticker import FuncFormatter

                    plain = FuncFormatter(lambda v, _: f"{v:g}" if round(v / 10 ** np.floor(np.log10(v)), 6) in (1, 2, 5) else "")
                    ax.yaxis.set_major_formatter(plain)
                    ax.yaxis.set_minor_formatter(plain)
        _axis_x(ax, a.axis, spec.x)
        ax.set_ylabel("ρ (nats per decade per token)")
        ax.set_title("linear scale" if not log else "log scale")
    handles, labels = axes[1].get_legend_handles_labels()
    if pl is not None and not pl.r2 >= POWER_LAW_R2:
        handles.append(Line2D([], [], ls="none"))
        labels.append(f"spectrum: not a power law (fit R² {pl.r2:.2f}), no line drawn")
    fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False, fontsize=8)
    lp = rec.loss_power_law
    loss_text = "" if lp is None else (
        f" Fitted directly, the mean loss follows L ~ a^(-α) with α = {lp.alpha:.2f} (R² {lp.r2:.3f})." if lp.r2 >= POWER_LAW_R2
        else f" The mean loss itself is not a power law of the {_axis_name(a.axis)} (fit R² {lp.r2:.2f}).")  # fmt: skip
    hist_text = ("the part of every event's drop that its sigmoid puts in each bin (one event fills several bins)"
                 if spec.kernel == "event" else "histogram of the event times, each weighted by its drop")
    few = _few_events_text(a, n_clear, mu_all)
    negative = (" Where ρ < 0 (tokens whose loss rose, such as forgotten ones, outweigh those learned there) the "
                "log panel shows its size, -ρ, in red." if rose else "")  # fmt: skip
    return Figure(fig, "Learning-time spectrum: when the loss drop happens",
                  f"Every fitted learning event puts its loss drop at its learning time μ (the middle of its sigmoid); "
                  f"summed over events and divided by the number of tokens this gives ρ, in nats per decade per token, "
                  f"so its area is the loss drop per token that the events carry. Bars: {hist_text}; line: kernel density. "
                  f"Left linear, right log scale (every nonzero bin kept in view).{negative}{few} The spectrum covers the recorded "
                  f"range only; grey: one bandwidth from each of its ends, where the events whose time lies outside it "
                  f"(censored) are placed, so a power law is fitted only between. A straight dashed line on the log panel "
                  f"would mean ρ ~ 10^(-α x), a power law in the {_axis_name(a.axis)}.{loss_text}")  # fmt: skip


def _fig_trajectories(st: TrajectoryStore, a: RunAnalysis, per_class: int = 3, decode=None) -> Figure:
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    r = st.run(a.run)
    rows, x = fitted_inputs(r)
    f = a.fit
    # a token with no recorded loss (padding) is in no class: no panel draws it (one set aside for
    # its losses is unfit, and drawn)
    code = np.where(never_scored(f), -1, np.asarray(f["class_code"]))
    classes = [c for c in CLASS_NAMES.values() if (code == CLASS_CODES[c]).any()]
    rng = np.random.default_rng(0)
    picks = {}
    for c in classes:
        idx = np.flatnonzero(code == CLASS_CODES[c])
        picks[c] = np.sort(rng.choice(idx, min(per_class, idx.size), replace=False))
    tokens = np.unique(np.concatenate(list(picks.values())))
    Y = r.losses_at(rows, tokens).astype(np.float64)  # [K, picked]
    col = {t: j for j, t in enumerate(tokens)}
    ncol = 4
    nrow = -(-len(classes) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(11, 2.8 * nrow), squeeze=False, sharex=True, layout="constrained")
    xf = np.linspace(x[0], x[-1], 200)
    legend_rows = []
    for ax, c in zip(axes.flat, classes):
        ys = []
        for j, t in enumerate(picks[c]):
            color = f"C{j}"
            y = Y[:, col[t]]
            ax.plot(x, y, "o", ms=2.5, color=color, alpha=0.7)
            ax.plot(xf, _drawn_curve(f, t, xf), "-", color=color, lw=1.2)
            ys.append(y[np.isfinite(y)])
            legend_rows.append([c, _Html(f"<span class=swatch style='background:{to_hex(color)}'></span>"),
                                _token_in_context(st.probe, int(t), decode), _model_text(f, int(t), a.axis)])  # fmt: skip
        ys = np.concatenate(ys)
        if ys.size:
            pad = 0.08 * max(ys.max() - ys.min(), 0.5)
            ax.set_ylim(max(ys.min() - pad, -pad), ys.max() + pad)
        held = a.class_counts.get(c, 0)
        ax.set_title(f"{c} ({held:,} token{'s' * (held != 1)})", fontsize=9, color=CLASS_COLORS.get(c, "k"))
        ax.set_ylabel("loss (nats)", fontsize=8)
    for i, ax in enumerate(axes.flat):
        if i >= len(classes):
            ax.axis("off")
        elif i + ncol >= len(classes):  # the lowest panel of its column
            _axis_x(ax, a.axis, x)
            ax.xaxis.set_tick_params(labelbottom=True)
    after = _table(["class", "colour", "the token (highlighted) after the text before it", "fitted model"], legend_rows)
    return Figure(fig, f"Example tokens of each class: loss at each recorded {_axis_name(a.axis)} and the fitted model",
                  f"Each panel shows up to {per_class} tokens drawn at random from one class (how many tokens the class "
                  f"holds is in its title). Dots: the token's loss at each recorded {_axis_name(a.axis)}; line: the model "
                  f"the fit chose for it (a constant, a line, a sigmoid or two sigmoids in log {_axis_name(a.axis)}), "
                  f"drawn clipped at 0 nats (fitted levels are at least 0, but a line extended past the recorded range, or a "
                  f"store fitted by an older tokdyn, can go below zero). Colours are per panel: the table below gives each coloured token's text in context, "
                  f"and the model with its event time(s).{_scored_class_counts(a)[1]}", after)  # fmt: skip


CONTEXT_TOKENS = 24  # tokens of text shown before an example token


def _token_in_context(probe, t: int, decode) -> _Html:
    """A probe token as escaped markup: the text before it and the token, highlighted, where
    the probe's tokens can be decoded (``decode``: ids -> text); otherwise its id and place."""
    ta = probe.token_arrays
    s, p = int(ta["sample_id"][t]), int(ta["token_pos"][t])
    where = f"sequence {s}, position {p}"
    if probe.tokens is None or decode is None:
        tid = f"token id {int(ta['token_id'][t])}, " if "token_id" in ta else ""
        why = "an imported probe holds no tokens" if probe.tokens is None else "give the report the probe's tokenizer"
        return _Html(_e(f"{tid}{where} (no text: {why})"))
    row = probe.tokens[s]

    def shown(text: str) -> str:
        return text.replace("\r\n", "↵").replace("\n", "↵").replace("\r", "↵").replace("\t", "→")

    # Each token as the text it adds, as the token viewer shows it (:func:`_pieces`): a character
    # split over several tokens (UTF-8 bytes) whole at its last token, never "�" for a token
    # decoded alone; a few tokens before the context and after the token decode with it, so that
    # neither end cuts a character.
    start = max(0, p - CONTEXT_TOKENS)
    lead = max(0, start - 8)
    pieces = _pieces(row[lead : p + 5], decode)
    before = shown("".join(pieces[start - lead : p - lead]))
    token = shown(pieces[p - lead]).replace(" ", "␣")  # a space made visible
    if not token:
        later = next((c for c in pieces[p - lead + 1 :] if c), "")
        eot = probe.tokenizer.get("eot_id") if probe.tokenizer else None
        token = (f"⟨the first byte(s) of “{shown(later[0])}”⟩" if later and "\ufffd" in decode(row[p : p + 1])
                 else "⟨end of text⟩" if eot is not None and int(row[p]) == int(eot) else "⟨a token without text⟩")  # fmt: skip
    def text(t: str) -> str:  # the probe's own text: only what would disturb the page escaped
        return html.escape(visible(t, data=True))

    return _Html(f"<code class=ctx>…{text(before)}<mark>{text(token)}</mark></code> <span class=meta>({_e(where)})</span>")


def _model_text(f: dict, t: int, axis: str) -> str:
    """The model the fit chose for token t, with its event time(s) as axis values."""
    m = int(f["model"][t])

    def at(mu) -> str:
        lo, hi = f["x_first"][t], f["x_last"][t]
        side = " (before the first recorded)" if mu < lo else " (after the last recorded)" if mu > hi else ""
        return f"{_value_text(10.0 ** mu)}{side}"

    def change(d) -> str:
        return f"a drop of {d:.1f} nats" if d >= 0 else f"a rise of {-d:.1f} nats"

    if m == 3:
        return (f"two sigmoids: {change(f['delta1'][t])} at {_axis_name(axis)} {at(f['mu1'][t])}, then "
                f"{change(f['delta2'][t])} at {at(f['mu2'][t])}")  # fmt: skip
    if m == 2:
        return f"sigmoid: {change(f['delta'][t])} at {_axis_name(axis)} {at(f['mu'][t])}"
    if m == 1:
        slope = -f["line_slope"][t]
        return f"line: the loss {'falls' if slope >= 0 else 'rises'} {abs(slope):.2f} nats per tenfold {_axis_name(axis)}"
    if m == 0:
        return f"constant: {f['mean'][t]:.2f} nats"
    return "not fitted"


def _drawn_curve(f: dict, t: int, xf: np.ndarray) -> np.ndarray:
    """Token t's fitted curve as drawn: clipped at 0 nats. Fitted levels are bounded at 0, but a
    line extends below 0 past the range, as do the levels of a store fitted before the bound."""
    return np.maximum(_chosen_curve(f, t, xf), 0.0)


def _chosen_curve(f: dict, t: int, xf: np.ndarray) -> np.ndarray:
    m = int(f["model"][t])
    if m == 3:
        return two_sigmoid_curve(xf, f["linf2"][t], f["delta1"][t], f["mu1"][t], f["s1"][t], f["delta2"][t], f["mu2"][t], f["s2"][t])
    if m == 2:
        return sigmoid_curve(xf, f["l0"][t], f["linf"][t], f["mu"][t], f["s"][t])
    if m == 1:
        return f["line_intercept"][t] + f["line_slope"][t] * xf
    if m == 0:
        return np.full_like(xf, f["mean"][t])
    return np.full_like(xf, np.nan)


def _fig_classes(st: TrajectoryStore, a: RunAnalysis) -> Figure:
    drops, meaningful = _class_drops(a)
    return _fig_class_shares(a) if meaningful else _fig_class_changes(a, drops)


def _n_unscored(a: RunAnalysis) -> tuple[int, int]:
    """How many of run ``a``'s probe tokens are in no measured mean: (with no recorded loss,
    such as padding, :func:`~tokdyn.fit.models.never_scored`; set aside for their losses, which
    the fit scored as no point). One count said as 'no recorded loss' named the set-aside tokens,
    which had losses, so one report gave two counts of the tokens with none."""
    scored = fit_scored(a.fit)
    if scored is None:
        return 0, 0
    none = int(np.count_nonzero(never_scored(a.fit)))
    return none, int(np.count_nonzero(~scored)) - none


def _scored_class_counts(a: RunAnalysis) -> tuple[dict[str, int], str]:
    """Each class's count of the tokens with a recorded loss (:func:`tokdyn.fit.models.never_scored`),
    and a sentence for a caption on the tokens with none, or "". A token never scored (padding,
    a token never recorded) is in no class's share of the tokens, as it is in no drop per token:
    counted, as class unfit, it shrank every class's share, and a class then read as losing
    more loss per token than the average token."""
    never = never_scored(a.fit)
    if not never.any():
        return {c: n for c, n in a.class_counts.items() if n}, ""
    left = int(np.count_nonzero(never))
    return (scored_counts(a.fit)[0],
            f" Left out of the shares of the tokens: {left:,} probe token{'s' * (left != 1)} with no recorded loss "
            f"(of {never.size:,}).")  # fmt: skip


def _fig_class_changes(a: RunAnalysis, drops: dict[str, float]) -> Figure:
    """The classes' loss changes in nats per probe token, where shares of the net drop would mean
    nothing (the classes' falls and rises nearly cancel, or the loss rose)."""
    import matplotlib.pyplot as plt

    held, unscored = _scored_class_counts(a)
    names = [c for c in CLASS_NAMES.values() if held.get(c, 0)]
    total = sum(held.values())
    vals = [drops.get(c, 0.0) for c in names]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.6), layout="constrained")
    y = np.arange(len(names))
    ax.barh(y, vals, 0.6, color=[CLASS_COLORS[c] for c in names])
    for yi, v in zip(y, vals):
        ax.text(v, yi, f" {v:.3f} " if v >= 0 else f"{v:.3f} ", va="center", ha="left" if v >= 0 else "right", fontsize=8)
    ax.set_yticks(y, [f"{c} ({held.get(c, 0) / total:.0%} of tokens)" for c in names])
    ax.invert_yaxis()
    ax.axvline(0, color="k", lw=0.5)
    # at least the bars' precision: changes that all round to 0.000 look it (5e-5 nats filled the axis)
    span = max([FLAT_NATS, *(abs(v) for v in vals)])
    ax.set_xlim(min(0.0, *vals) - 0.25 * span, max(0.0, *vals) + 0.25 * span)  # room for the labels
    net, gross = sum(drops.values()), sum(abs(v) for v in drops.values())
    ax.set_xlabel("fall of the loss, nats per probe token (< 0: it rose)")
    # (falls and rises that all round to 0.000, the precision of the bars, are no rise: a run of
    # flat tokens read "the loss rose")
    why = (f"no class's fitted loss changed by as much as {FLAT_NATS:g} nats per probe token over the recorded range"
           if a.class_drops.flat else
           "the loss rose over the recorded range" if net < 0 else
           f"the net fall ({net:.3f} nats per token) is less than {SHARE_MIN_NET:.0%} of the classes' falls and rises "
           f"together ({gross:.3f}), so they nearly cancel")  # fmt: skip
    return Figure(fig, "How much each class's loss fell or rose",
                  f"For each class of tokens: how far its tokens' fitted loss fell between the first and the last recorded "
                  f"point, summed over the class and divided by the number of probe tokens with a recorded loss (nats per probe token; "
                  f"negative: it rose), so the bars add up to the fall of the mean loss ({net:+.3f} nats). Shares of the "
                  f"loss drop are not shown for this run: {why}, and a class's share of the net drop would read hundreds "
                  f"or thousands of percent. The share of the tokens each class holds is beside its name."
                  + unscored + _multi_step_text(a))  # fmt: skip


def _fig_class_shares(a: RunAnalysis) -> Figure:
    import matplotlib.pyplot as plt

    held, unscored = _scored_class_counts(a)
    names = [c for c in CLASS_NAMES.values() if held.get(c, 0)]
    share = [a.class_loss_share.get(c, 0.0) * 100 for c in names]
    total = sum(held.values())
    count = [held.get(c, 0) / total * 100 for c in names]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.6), layout="constrained")
    y = np.arange(len(names))
    ax.barh(y - 0.2, share, 0.4, color=[CLASS_COLORS[c] for c in names], label="share of the loss drop (class colour)")
    ax.barh(y + 0.2, count, 0.4, color="#ccc", label="share of the tokens (grey)")
    for yi, v in zip(y, share):
        ax.text(v, yi - 0.2, f" {v:.1f}% " if v >= 0 else f"{v:.1f}% ", va="center", ha="left" if v >= 0 else "right", fontsize=8)
    for yi, v in zip(y, count):
        ax.text(v, yi + 0.2, f" {v:.1f}%", va="center", fontsize=7, color="#666")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.axvline(0, color="k", lw=0.5)
    ax.set_xlim(min(0.0, np.nanmin([0.0, *share])) - 6, np.nanmax([1.0, *share, *count]) * 1.12)  # room for the labels
    ax.set_xlabel("% of the total")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False, fontsize=8)
    return Figure(fig, "Which classes carry the loss drop",
                  "For each class of tokens: its share of the total loss drop between the first and the last recorded "
                  "point (coloured bar; tokens whose loss rose, forgotten, count negatively, so the shares add up to "
                  "100%), and its share of the tokens (grey). A class whose coloured bar is longer than its grey one "
                  "lost more loss per token than the average token." + unscored + _multi_step_text(a))  # fmt: skip


def _fig_groups(st: TrajectoryStore, a: RunAnalysis) -> Figure | None:
    import matplotlib.pyplot as plt

    keys = [k for k in ("class", "domain", "frequency", "position") if a.by_group.get(k)]
    if not keys:
        return None
    # groups the probe has, none of them with enough events for a curve: said, not silently dropped
    absent = [k for k in ("class", "domain", "frequency", "position") if k in a.by_group and not a.by_group[k]]
    fig, axes = plt.subplots(1, len(keys), figsize=(2.9 * len(keys) + 1, 4.4), squeeze=False, sharey=True, layout="constrained")
    shown, legends = {}, []
    for ax, k in zip(axes[0], keys):
        spectra = a.by_group[k]
        if k == "domain":  # the largest contributors only, for legibility
            shown[k] = (min(6, len(spectra)), len(spectra))
            spectra = dict(sorted(spectra.items(), key=lambda kv: -abs(kv[1].total_drop))[:6])
        lines = []
        order = _group_order(st, k, a.fit)
        for label, sp in spectra.items():
            color, style = _group_style(k, label, order)
            lines += ax.plot(sp.x, sp.density, color=color, linestyle=style, lw=1.2)
        title = f"by {k}" if k not in shown else f"by domain ({shown[k][0]} of {shown[k][1]})"
        ax.set_title(title, fontsize=10)
        _axis_x(ax, a.axis, a.reconstruction.spectrum.x)
        ax.xaxis.label.set_fontsize(8)
        # Handles and labels given explicitly: a legend drops artists whose label starts with "_"
        # (a domain such as "__future__" was missing from it).
        legends += spectra
        labels = legend_labels(spectra)
        # two columns only of short names: two of 40 characters side by side are wider than the
        # panel, and the layout narrowed every panel to a seventh of the figure to make room
        _legend_below(ax, lines, labels, ncol=2 if len(spectra) > 4 and max(map(len, labels)) <= 16 else 1,
                      title={"frequency": "occurrences of the token id", "position": "position in the sequence"}.get(k))  # fmt: skip
    axes[0][0].set_ylabel("ρ (nats per decade per token)")
    dom = ""
    if "domain" in shown:
        n, total = shown["domain"]
        dom = (f" The domain panel shows the {n} of {total} domains with 10 events or more that carry the largest loss "
               f"drop." if n < total else " The domain panel shows every domain with 10 events or more.")  # fmt: skip
    dom += _groups_left_out_text(st, a)
    if any(len(drawable(visible(label))) > LABEL_CHARS for label in legends):
        dom += f" Names longer than {LABEL_CHARS} characters (an escape counts its characters) are cut in the middle (…) in the legends."
    nouns = {"class": "class", "domain": "domain", "frequency": "token frequency", "position": "position"}
    what = {"class": "their class", "domain": "their domain",
            "frequency": "how often their token id occurs in the probe (bands between quantiles of that count)",
            "position": "their position in the sequence"}  # fmt: skip
    missing = "".join(f" No {k} panel: no {k} group has 10 events or more." for k in absent)
    return Figure(fig, f"The spectrum split by {_listed([nouns[k] for k in keys])}",
                  f"Each panel splits the learning-time spectrum of the figure above by one property of the tokens: "
                  f"{_listed([what[k] for k in keys])}. Each curve is that group's contribution to ρ (same "
                  "bandwidth, same normalisation), so the curves of a panel add up to the whole spectrum, less groups "
                  f"with fewer than 10 events, which are left out.{dom}{missing} A peak that moves from band to band "
                  "means those tokens are learned at different times." + _legend_note(legends))  # fmt: skip


def _groups_left_out_text(st: TrajectoryStore, a: RunAnalysis) -> str:
    """How many of each kind's groups with a scored token the group figure leaves out (fewer
    than 10 events), for its caption, or "": the groups drawn and left out add up to the groups
    the probe's scored tokens fall in (a domain panel with 3 of 8 domains left out read "shows
    every domain")."""
    nouns = {"class": ("class", "classes"), "domain": ("domain", "domains"),
             "frequency": ("frequency band", "frequency bands"), "position": ("position band", "position bands")}  # fmt: skip
    scored = fit_scored(a.fit)
    parts = []
    for kind, (codes, labels) in group_codes(st.probe, a.fit).items():
        if kind not in a.by_group:
            continue
        c = np.asarray(codes) if scored is None else np.asarray(codes)[scored]
        held = int(np.unique(c[np.isin(c, list(labels if isinstance(labels, dict) else range(len(labels))))]).size)
        left = held - len(a.by_group[kind])
        if left > 0:
            parts.append(f"{left:,} of the {held:,} {nouns[kind][held != 1]}")
    return f" Left out, with fewer than 10 events: {_listed(parts)}." if parts else ""


def _group_order(st: TrajectoryStore, kind: str, fit: dict) -> list[str]:
    """Every label of group ``kind`` the probe has, in the probe's order, named as
    :func:`tokdyn.spectrum.spectra_by` names them (:func:`tokdyn.spectrum.group_labels`);
    frequency bands of the tokens ``fit`` scored, as :func:`tokdyn.analysis.group_spectra` bands them."""
    probe, ta = st.probe, st.probe.token_arrays
    if kind == "domain":
        names = [str(d) for d in probe.domains]
    elif kind == "frequency" and "token_id" in ta:
        names = [str(b) for b in frequency_bands(np.asarray(ta["token_id"]), scored=fit_scored(fit))[1]]
    elif kind == "position" and "token_pos" in ta:
        names = [str(b) for b in position_bands(np.asarray(ta["token_pos"]), probe.context)[1]]
    else:
        return []
    return group_labels(names)


def _group_style(kind: str, label: str, order: list[str]) -> tuple[str, object]:
    """A group's colour and line style, fixed by its place among all the probe's groups of that
    kind, so that one domain or band has one colour in every run's figure (colours by rank in
    each panel gave one domain a new colour in each run). Beyond 10 groups the 20 colours of
    tab20, beyond 20 a dashed or dotted line as well."""
    if kind == "class":
        return CLASS_COLORS.get(label, "k"), "-"
    i = order.index(label) if label in order else len(order)
    if len(order) <= 10:
        return f"C{i}", "-"
    import matplotlib

    j = i % 20  # tab20's dark shades first, then its light ones: neighbours in the probe's order differ in hue
    return matplotlib.colormaps["tab20"](2 * j % 20 + j // 10), ("-", "--", ":", "-.")[(i // 20) % 4]


def _listed(words: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _learning_time(f: dict) -> np.ndarray:
    """[N] each token's learning time, log10 axis units: ``mu``, and for a multi-step token its
    first drop (``delta > 0``; the two events are in time order, ``mu1 <= mu2``), NaN where
    neither event is a drop. (The first event read "learned" at the rise of a token that got
    worse, then better.)"""
    multi = f["class_code"] == CLASS_CODES["multi_step"]
    d1, d2 = np.asarray(f["delta1"]), np.asarray(f["delta2"])
    first_drop = np.where(d1 > 0, f["mu1"], np.where(d2 > 0, f["mu2"], np.nan))
    return np.where(multi, first_drop, f["mu"])


def _fig_time_vs_token(st: TrajectoryStore, a: RunAnalysis) -> Figure | None:
    import matplotlib.pyplot as plt

    if not a.by_group:
        return None
    ta = st.probe.token_arrays
    f = a.fit
    mu = _learning_time(f)
    # every learned or multi-step token is shown, censored or without a drop: the three counts
    # add up to the class counts (a multi-step token whose two events are both rises has no
    # learning time, and was in neither the figure nor its "left out")
    of_class = np.isin(f["class_code"], [CLASS_CODES["learned"], CLASS_CODES["multi_step"]])
    learned = of_class & np.isfinite(mu)
    inside = learned & (mu >= f["x_first"]) & (mu <= f["x_last"])
    no_drop = _no_drop_text(int((of_class & ~learned).sum()))
    panels = []  # what the probe can say about each token
    if "token_id" in ta:  # among the scored tokens: padding's pad id is no occurrence of a real token's id
        counts = id_counts(np.asarray(ta["token_id"]), fit_scored(f))
        panels.append((np.log10(np.maximum(counts, 1)), "occurrences of the token id in the probe (log scale)", True))
    if "token_pos" in ta:
        panels.append((np.log2(np.maximum(np.asarray(ta["token_pos"]), 1)), "position in the sequence (log scale)", False))
    if not panels:
        return None
    if not inside.any():  # empty axes with ticks 0 to 1 on "log scale" axes: nothing a reader can use
        return Figure(None, "No figure of when tokens are learned against how frequent they are and where they stand",
                      f"no token of this run is learned or multi-step with its (first) event inside the recorded range "
                      f"({int(learned.sum()):,} such token{'s' * (int(learned.sum()) != 1)} with an event outside it, censored"
                      f"{'; ' + no_drop if no_drop else ''})")  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels) + 0.8, 4.0), sharey=True, squeeze=False, layout="constrained")
    hb, medians = None, []
    for ax, (v, label, log10) in zip(axes[0], panels):
        if inside.any():
            hb = ax.hexbin(v[inside], mu[inside], gridsize=40, cmap="Blues", mincnt=1, bins="log")
            edges = np.unique(np.quantile(v[inside], np.linspace(0, 1, 11)))
            if edges.size > 1:
                b = np.clip(np.searchsorted(edges, v[inside], side="right") - 1, 0, edges.size - 2)
                med = [np.median(mu[inside][b == i]) if (b == i).any() else np.nan for i in range(edges.size - 1)]
                medians += ax.plot(0.5 * (edges[1:] + edges[:-1]), med, "o-", color="#d62728", ms=3)
            # as many labels as fit the panel (counts of 61 to 89 over a narrow span were labelled
            # at every tick, "61626364..."; learning times within a narrow span alike, on y)
            size = ax.get_position().size * fig.get_size_inches()
            if log10:
                _log_ticks(ax.xaxis, float(v[inside].min()), float(v[inside].max()), width_in=float(size[0]))
            else:
                ticks = np.arange(0, np.ceil(v[inside].max()) + 1)
                ax.set_xticks(ticks, [f"{2 ** int(k):,}" for k in ticks])
            _log_ticks(ax.yaxis, float(mu[inside].min()), float(mu[inside].max()), width_in=float(size[1]))
        ax.set_xlabel(label)
    axes[0, 0].set_ylabel(f"learning time μ ({AXIS_LABEL.get(a.axis, a.axis)}, log scale)")
    if hb is not None:
        fig.colorbar(hb, ax=axes[0].tolist(), label="tokens per hexagon (log scale)")
    if medians:
        fig.legend(medians[:1], ["median learning time per tenth of the tokens along x"], loc="outside upper center",
                   frameon=False, fontsize=8)  # fmt: skip
    left_out = int(learned.sum() - inside.sum())
    return Figure(fig, "When tokens are learned, against how frequent they are and where they stand",
                  f"Each of the {int(inside.sum()):,} learned or multi-step tokens (for multi-step tokens, the first drop) "
                  f"placed by its learning time μ (y) against, left, how often its token id occurs in the probe, and "
                  f"right, its position in its sequence. Colour: tokens per hexagon (colour bar, log scale). Red: the "
                  f"median learning time in each tenth of the tokens along x. A falling median means that tokens further "
                  f"right are learned earlier. Left out: {left_out:,} tokens whose event time lies outside the recorded "
                  f"range (censored){' and ' + no_drop if no_drop else ''}.")  # fmt: skip


def _no_drop_text(n: int) -> str:
    """The multi-step tokens with no learning time, for a caption's "left out", or nothing."""
    if not n:
        return ""
    return (f"{n:,} multi-step token{'s' * (n != 1)} whose two events are both rises (no drop, so no learning "
            f"time)")


def _fig_cartography(st: TrajectoryStore, a: RunAnalysis) -> Figure | None:
    import matplotlib.pyplot as plt

    s = a.stats
    if s is None:
        return None
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(12.5, 4.2), gridspec_kw={"width_ratios": [2.2, 1, 1]}, layout="constrained")
    scored = s.scored  # tokens with a loss at some step: padding has no confidence and no forgetting
    pool = np.flatnonzero(scored)
    n = pool.size
    if n == 0:
        return None
    sel = np.random.default_rng(0).choice(pool, min(n, 20000), replace=False)
    codes = a.fit["class_code"][sel]
    for code, name in CLASS_NAMES.items():
        m = codes == code
        if m.any():
            ax0.scatter(s.variability[sel][m], s.confidence[sel][m], s=2, alpha=0.4, color=CLASS_COLORS[name], label=name)
    ax0.set_xlabel("variability (std of gold probability)")
    ax0.set_ylabel("confidence (mean gold probability)")
    ax0.set_title("dataset cartography", fontsize=10)
    ax0.legend(fontsize=7, markerscale=4, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, title="class", title_fontsize=7)
    fe = s.forgetting_events[scored]
    ax1.hist(fe, bins=np.arange(fe.max() + 2) - 0.5, color="#d62728")
    from matplotlib.ticker import MaxNLocator

    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))  # a count: no ticks at -0.25 or 0.5 events
    ax1.set_xlim(-0.6, max(int(fe.max(initial=0)), 1) + 0.6)
    ax1.set_yscale("log")
    ax1.set_xlabel("forgetting events per token")
    ax1.set_ylabel("tokens (log scale)")
    ax1.set_title("forgetting events", fontsize=10)
    shares = s.rho1_shares()
    ax2.bar(range(4), [shares[c] * 100 for c in RHO1_CLASSES], color=["#7f7f7f", "#1f77b4", "#d62728", "#2ca02c"])
    ax2.set_xticks(range(4), RHO1_CLASSES)
    ax2.set_ylabel("% of tokens")
    ax2.set_title("Rho-1 classes", fontsize=10)
    steps = st.run(a.run).steps
    early, late = _row_text(float(steps[s.early_row])), _row_text(float(steps[s.late_row]))
    shown = f"{sel.size:,} tokens drawn at random of {n:,}" if sel.size < n else f"all {n:,} tokens"
    noun = _axis_name(a.axis)
    left_out = scored.size - n
    if left_out:
        shown += f"; {left_out:,} probe token{'s' * (left_out != 1)} with no recorded loss left out here and in the middle"
    # the Rho-1 shares are of the tokens with a loss at both rows: the scored tokens missing one
    # of them are left out of the bars, and said (they were left out without a word)
    classed = int(np.count_nonzero(s.rho1 >= 0))
    unclassed = n - classed
    rho1_of = f"{classed:,} token{'s' * (classed != 1)} with a loss at both"
    if unclassed:
        rho1_of += f"; {unclassed:,} with a recorded loss but none at one of them left out"
    return Figure(fig, "Per-token statistics from the literature: cartography, forgetting, Rho-1",
                  f"Left, dataset cartography ({shown}): each token's mean probability of the correct token over the "
                  f"recorded {noun}s (confidence) against its standard deviation (variability), coloured by class. Middle: "
                  f"how often each token went from learned (loss below {s.learned_loss:.2f} nats, probability above 1/2) "
                  f"at one recorded {noun} to not learned at the next. Right, Rho-1 classes: each token's loss at {noun} "
                  f"{early} (the recorded {noun} nearest the middle of the log axis) and at {noun} {late} (the last; {rho1_of}), each "
                  f"called high (H) or low (L) against {s.threshold:.2f} nats, the median of the losses at those two "
                  f"{noun}s of every token with a loss at both. Because that threshold is a median of both {noun}s pooled, H->H and L->L "
                  f"hold equally many tokens by construction (up to ties at the threshold); H->L are the tokens learned between "
                  f"the two {noun}s, L->H those that got worse.")  # fmt: skip
