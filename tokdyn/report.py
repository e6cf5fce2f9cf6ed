"""One self-contained HTML report of a store: figures (matplotlib, embedded PNG) and tables.

:func:`write_report` analyses the store (:func:`tokdyn.analysis.analyze_store`) and writes one
file with: the reconstruction scores, example trajectories with their fits for each class, the
spectrum with its power law, measured versus rebuilt ``-dL/dx`` for every axis present, the
class shares of the loss drop, learning time against token frequency and position, spectra by
class, domain, frequency and position band, the cartography map, and each run's metadata.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from . import __version__
from .analysis import RunAnalysis, StoreAnalysis, analyze_store
from .errors import InputError, TokdynError
from .fit.models import two_sigmoid_curve
from .fit.options import CLASS_CODES, CLASS_NAMES
from .fit.sigmoid import sigmoid_curve
from .fit.job import fit_inputs
from .store import TrajectoryStore, as_store
from .tokenstats import RHO1_CLASSES

__all__ = ["write_report", "render_report", "check_writable"]

AXIS_LABEL = {"T": "training step", "D": "data budget (tokens)", "M": "non-embedding parameters"}
CLASS_COLORS = {
    "learned": "#1f77b4", "already_known": "#2ca02c", "not_yet_learned": "#7f7f7f", "forgotten": "#d62728",
    "multi_step": "#9467bd", "gradual": "#ff7f0e", "noisy": "#bcbd22", "unfit": "#17becf",
}  # fmt: skip


def check_writable(out: str | os.PathLike) -> Path:
    """Raise InputError unless a file can be written at ``out`` (checked before any work)."""
    p = Path(out)
    if p.is_dir():
        raise InputError(f"report path {p} is a folder; give a file name such as {p / 'report.html'}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write the report to {p}: folder {parent} does not exist")
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
) -> Path:
    """Analyse ``store`` (or use ``analysis``) and write the HTML report to ``out``; returns its path.

    ``extra``: a dict shown as a table at the top (the demo puts its stage timings there).
    """
    p = check_writable(out)
    st = as_store(store)
    an = analysis if analysis is not None else analyze_store(st, runs=runs)
    text = render_report(st, an, title=title, extra=extra)
    tmp = None
    try:
        # A new file of a random name beside the target, created exclusively (O_EXCL: never
        # through a link planted there), then renamed over it: never a half-written report.
        fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write the report to {p}: {exc.strerror or exc}") from None
    return p


# -- rendering -----------------------------------------------------------------------------


def render_report(st: TrajectoryStore, an: StoreAnalysis, *, title: str | None = None, extra: dict | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg", force=False)
    return _render(st, an, title=title, extra=extra)


def _literal(text) -> str:
    """A user's string (a domain or run name) as matplotlib should draw it: as it is, "$" not
    starting mathtext. (Mathtext stays on for tokdyn's own labels: log-axis ticks use it.)"""
    return str(text).replace("$", r"\$")


def _render(st: TrajectoryStore, an: StoreAnalysis, *, title: str | None, extra: dict | None) -> str:
    title = title or f"tokdyn report: {st.url}"
    parts = [f"<h1>{_e(title)}</h1>",
             f"<p class=meta>tokdyn {__version__}, {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}; probe "
             f"{_e(st.probe.fingerprint)}, {st.probe.n_tokens:,} tokens. Losses in nats; x = log10 of the axis value.</p>"]  # fmt: skip
    if extra:
        parts.append(_table(["", ""], [[k, _fmt(v)] for k, v in extra.items()], caption="This job"))
    parts.append(_scores_table(an))
    for a in an.runs:
        parts.append(f"<h2>Run {_e(a.run)} (axis {_e(a.axis)}: {_e(AXIS_LABEL.get(a.axis, a.axis))})</h2>")
        rec = a.reconstruction
        parts.append(_figure(_plot_reconstruction(a), f"Measured and rebuilt -dL/dlog10 a along {a.axis}: measured from the mean "
                              f"probe loss (local quadratic, smoothing {rec.smoothing:.3f} decades), the sum of fitted "
                              f"sigmoids, and the spectrum alone (bandwidth {rec.spectrum.bandwidth:.3f} decades)."))  # fmt: skip
        parts.append(_figure(_plot_spectrum(a), "Learning-time spectrum: loss-drop-weighted density of learning times "
                              "(histogram and kernel density), with its power-law fit inside the uncensored range (shaded "
                              "edges are censored) and the direct power-law fit to the mean loss."))  # fmt: skip
        parts.append(_figure(_plot_trajectories(st, a), "Example trajectories of each class with the model the fit chose (line)."))
        parts.append(_figure(_plot_classes(a), "Each class's share of the total loss drop, and of the tokens."))
        if a.by_group:
            parts.append(_figure(_plot_groups(a), "Spectra by class, domain, token frequency band and position band "
                                  "(each group's contribution to the spectrum: they add up to the whole)."))  # fmt: skip
            fig = _plot_time_vs_token(st, a)
            if fig is not None:
                parts.append(_figure(fig, "Learning time of each learned token against how often its "
                                  "token id occurs in the probe, and against its position (medians per bin in black)."))  # fmt: skip
        if a.stats is not None:
            parts.append(_figure(_plot_cartography(a), "Dataset cartography (confidence: mean gold probability over "
                                  "checkpoints; variability: its standard deviation), forgetting events, and Rho-1 classes "
                                  f"between rows {a.stats.early_row} and {a.stats.late_row} (threshold {a.stats.threshold:.2f} nats)."))  # fmt: skip
    parts.append(_metadata_tables(st, an))
    body = "\n".join(parts)
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}
h1{{font-size:1.5em}} h2{{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}}
table{{border-collapse:collapse;margin:1em 0;font-size:.9em}} td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}}
caption{{text-align:left;font-weight:600;padding:.3em 0}} figure{{margin:1.5em 0}} figcaption{{font-size:.9em;color:#444}}
img{{max-width:100%}} .meta{{color:#555;font-size:.9em}} pre{{margin:0;white-space:pre-wrap;font-size:.85em}}
</style></head><body>
{body}
</body></html>
"""


class _Html(str):
    """Markup made here, from escaped parts: a table cell of this type is not escaped again."""


def _e(s) -> str:
    return html.escape(str(s))


def _fmt(v) -> _Html:
    if isinstance(v, float):
        return _Html(f"{v:.4g}")
    if isinstance(v, (dict, list)):
        return _Html(f"<pre>{_e(json.dumps(v, indent=1, default=str))}</pre>")
    return _Html(_e(v))


def _cell(c) -> str:
    """Every table cell is escaped, unless it is markup made here (:class:`_Html`)."""
    return c if isinstance(c, _Html) else _e(c)


def _table(header, rows, caption: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f"<table>{cap}<tr>{head}</tr>{body}</table>"


def _figure(fig, caption: str) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f"<figure><img alt='{_e(caption)}' src='data:image/png;base64,{data}'><figcaption>{_e(caption)}</figcaption></figure>"


def _scores_table(an: StoreAnalysis) -> str:
    rows = []
    for a in an.runs:
        s = a.reconstruction.summary()
        sp, lp = s["spectrum_power_law"], s["loss_power_law"]
        rows.append([
            a.run, a.axis, f"{s['n_points']}", f"{s['n_tokens']:,}",
            f"{s['r2_events']:.3f}", f"{s['r2_spectrum']:.3f}", f"{s['rel_l2_events']:.3f}", f"{s['rel_l2_spectrum']:.3f}",
            f"{s['drop_share_events']:.1%}", f"{s['drop_share_well_fitted']:.1%}",
            _power_law_text(sp), _power_law_text(lp),
        ])  # fmt: skip
    header = ["run", "axis", "points", "tokens", "R² sigmoid sum", "R² spectrum", "rel. L2 sigmoids", "rel. L2 spectrum",
              "drop carried by events", "by well-fitted events", "spectrum exponent α [95%]", "loss exponent α [95%]"]  # fmt: skip
    note = f"<p class=meta>Not fitted (left out): {_e(', '.join(an.not_fitted))}</p>" if an.not_fitted else ""
    return _table(header, rows, caption="Reconstruction of -dL/dlog10 a") + note


def _axis_x(ax, axis: str) -> None:
    ax.set_xlabel(f"log10 {AXIS_LABEL.get(axis, axis)}")


def _plot_reconstruction(a: RunAnalysis):
    import matplotlib.pyplot as plt

    rec = a.reconstruction
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax0.plot(rec.x, rec.mean_loss, "o-", ms=3, color="k")
    _axis_x(ax0, a.axis)
    ax0.set_ylabel("mean probe loss (nats)")
    ax0.set_title("mean probe loss")
    ax1.plot(rec.x, rec.measured, "o", ms=4, color="k", label="measured")
    ax1.plot(rec.x, rec.from_events, "-", color="C0", label=f"sum of sigmoids (R² {rec.r2_events:.3f})")
    ax1.plot(rec.x, rec.from_spectrum, "--", color="C3", label=f"spectrum alone (R² {rec.r2_spectrum:.3f})")
    for k, (label, other) in enumerate(a.across.items()):  # e.g. D from the events of a T run, no fit on D
        ax1.plot(other.x, other.from_events, ":", color=f"C{k + 1}", label=f"{_literal(label)} (R² {other.r2_events:.3f})")
    ax1.axhline(0, color="#999", lw=0.5)
    _axis_x(ax1, a.axis)
    ax1.set_ylabel("-dL/dlog10 a (nats per decade)")
    ax1.set_title("loss derivative")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    return fig


POWER_LAW_R2 = 0.8  # a power-law fit below this R^2 (of log rho, or of L) is reported as "not a power law"


def _power_law_text(pl: dict | None) -> str:
    """A power law's exponent as a table cell: headlined only when the fit is good."""
    if not pl:
        return "n/a"
    if not pl["r2"] >= POWER_LAW_R2:
        return f"not a power law (fit R² {pl['r2']:.2f})"
    return f"{pl['alpha']:.2f} [{pl['alpha_ci95'][0]:.2f}, {pl['alpha_ci95'][1]:.2f}] (R² {pl['r2']:.2f})"


def _plot_spectrum(a: RunAnalysis):
    import matplotlib.pyplot as plt

    rec = a.reconstruction
    spec = rec.spectrum
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, log in zip(axes, (False, True)):
        widths = np.diff(spec.edges)
        ax.bar(spec.edges[:-1], spec.hist, width=widths, align="edge", color="#c6dbef", edgecolor="#6baed6", label="histogram")
        ax.plot(spec.x, spec.density, color="C0", label=f"kernel density (h = {spec.bandwidth:.3f})")
        lo, hi = spec.x_range
        ax.axvspan(spec.x[0], lo, color="#eee")
        ax.axvspan(hi, spec.x[-1], color="#eee")
        pl = rec.spectrum_power_law
        if pl is not None and not pl.r2 >= POWER_LAW_R2:
            ax.text(0.02, 0.95, f"not a power law (fit R² {pl.r2:.2f})", transform=ax.transAxes, ha="left", va="top", fontsize=8)
        elif pl is not None:
            xs = np.linspace(*pl.x_fit, 50)
            ax.plot(xs, 10 ** (pl.params["log10_amplitude"] - pl.alpha * xs), "k--", lw=1,
                    label=f"power law α = {pl.alpha:.2f} [{pl.alpha_lo:.2f}, {pl.alpha_hi:.2f}]")  # fmt: skip
        if log:
            ax.set_yscale("log")
            pos = spec.density[spec.density > 0]
            if pos.size:
                ax.set_ylim(max(pos.max() * 1e-3, pos.min()), pos.max() * 2)
        _axis_x(ax, a.axis)
        ax.set_ylabel("ρ (nats per decade per token)")
        ax.set_title("spectrum, " + ("log scale" if log else "linear scale"))
    lp = rec.loss_power_law
    if lp is not None:
        text = f"mean-loss power law: α = {lp.alpha:.2f} (R² {lp.r2:.3f})" if lp.r2 >= POWER_LAW_R2 else (
            f"mean loss: not a power law (fit R² {lp.r2:.2f})")  # fmt: skip
        axes[0].text(0.98, 0.95, text, transform=axes[0].transAxes, ha="right", va="top", fontsize=8)
    axes[1].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def _plot_trajectories(st: TrajectoryStore, a: RunAnalysis, per_class: int = 3):
    import matplotlib.pyplot as plt

    r = st.run(a.run)
    rows, x = fit_inputs(r)
    f = a.fit
    classes = [c for c in CLASS_NAMES.values() if (f["class_code"] == CLASS_CODES[c]).any()]
    rng = np.random.default_rng(0)
    picks = {}
    for c in classes:
        idx = np.flatnonzero(f["class_code"] == CLASS_CODES[c])
        picks[c] = np.sort(rng.choice(idx, min(per_class, idx.size), replace=False))
    tokens = np.unique(np.concatenate(list(picks.values())))
    Y = r.losses_at(rows, tokens).astype(np.float64)  # [K, picked]
    col = {t: j for j, t in enumerate(tokens)}
    ncol = 4
    nrow = -(-len(classes) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(11, 2.7 * nrow), squeeze=False, sharex=True)
    xf = np.linspace(x[0], x[-1], 200)
    for ax, c in zip(axes.flat, classes):
        for j, t in enumerate(picks[c]):
            color = f"C{j}"
            ax.plot(x, Y[:, col[t]], "o", ms=2.5, color=color, alpha=0.7)
            ax.plot(xf, _chosen_curve(f, t, xf), "-", color=color, lw=1.2)
        ax.set_title(f"{c} ({a.class_counts.get(c, 0):,})", fontsize=9, color=CLASS_COLORS.get(c, "k"))
        ax.set_ylabel("loss (nats)", fontsize=8)
    for ax in axes.flat[len(classes):]:
        ax.axis("off")
    for ax in axes[-1]:
        _axis_x(ax, a.axis)
    fig.tight_layout()
    return fig


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


def _plot_classes(a: RunAnalysis):
    import matplotlib.pyplot as plt

    names = [c for c in CLASS_NAMES.values() if a.class_counts.get(c, 0)]
    share = [a.class_loss_share.get(c, 0.0) * 100 for c in names]
    total = sum(a.class_counts.values())
    count = [a.class_counts.get(c, 0) / total * 100 for c in names]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.2))
    y = np.arange(len(names))
    ax.barh(y - 0.2, share, 0.4, color=[CLASS_COLORS[c] for c in names], label="share of the loss drop")
    ax.barh(y + 0.2, count, 0.4, color="#ccc", label="share of the tokens")
    for yi, v in zip(y, share):
        ax.text(v, yi - 0.2, f" {v:.1f}%", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.axvline(0, color="k", lw=0.5)
    ax.set_xlabel("% of the total (loss drop, or tokens)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def _plot_groups(a: RunAnalysis):
    import matplotlib.pyplot as plt

    keys = [k for k in ("class", "domain", "frequency", "position") if a.by_group.get(k)]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.0 * len(keys) + 1, 3.6), squeeze=False, sharey=True)
    for ax, k in zip(axes[0], keys):
        spectra = a.by_group[k]
        if k == "domain":  # the largest contributors only, for legibility
            spectra = dict(sorted(spectra.items(), key=lambda kv: -abs(kv[1].total_drop))[:6])
        for j, (label, sp) in enumerate(spectra.items()):
            color = CLASS_COLORS.get(label, f"C{j % 10}") if k == "class" else f"C{j % 10}"
            ax.plot(sp.x, sp.density, color=color, lw=1.2, label=_literal(label))
        ax.set_title(f"by {k}", fontsize=10)
        _axis_x(ax, a.axis)
        ax.legend(fontsize=6.5, loc="upper right")
    axes[0][0].set_ylabel("ρ (nats per decade per token)")
    fig.tight_layout()
    return fig


def _plot_time_vs_token(st: TrajectoryStore, a: RunAnalysis):
    import matplotlib.pyplot as plt

    ta = st.probe.token_arrays
    f = a.fit
    learned = np.isin(f["class_code"], [CLASS_CODES["learned"], CLASS_CODES["multi_step"]]) & np.isfinite(f["mu"])
    mu = np.where(f["class_code"] == CLASS_CODES["multi_step"], f["mu1"], f["mu"])
    panels = []  # what the probe can say about each token
    if "token_id" in ta:
        _, inverse, counts = np.unique(np.asarray(ta["token_id"]), return_inverse=True, return_counts=True)
        panels.append((np.log10(counts[inverse]), "log10 occurrences of the token id in the probe"))
    if "token_pos" in ta:
        panels.append((np.log2(np.maximum(np.asarray(ta["token_pos"]), 1)), "log2 position in the sequence"))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), sharey=True, squeeze=False)
    ax0 = axes[0, 0]
    for ax, (v, label) in zip(axes[0], panels):
        if learned.sum():
            ax.hexbin(v[learned], mu[learned], gridsize=40, cmap="Blues", mincnt=1, bins="log")
            edges = np.unique(np.quantile(v[learned], np.linspace(0, 1, 11)))
            if edges.size > 1:
                b = np.clip(np.searchsorted(edges, v[learned], side="right") - 1, 0, edges.size - 2)
                med = [np.median(mu[learned][b == i]) if (b == i).any() else np.nan for i in range(edges.size - 1)]
                ax.plot(0.5 * (edges[1:] + edges[:-1]), med, "ko-", ms=3)
        ax.set_xlabel(label)
    ax0.set_ylabel(f"learning time μ (log10 {AXIS_LABEL.get(a.axis, a.axis)})")
    ax0.set_title(f"{int(learned.sum()):,} learned / multi-step tokens (first event)", fontsize=9)
    fig.tight_layout()
    return fig


def _plot_cartography(a: RunAnalysis):
    import matplotlib.pyplot as plt

    s = a.stats
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(12, 3.8), gridspec_kw={"width_ratios": [2, 1, 1]})
    n = s.confidence.size
    sel = np.random.default_rng(0).choice(n, min(n, 20000), replace=False)
    codes = a.fit["class_code"][sel]
    for code, name in CLASS_NAMES.items():
        m = codes == code
        if m.any():
            ax0.scatter(s.variability[sel][m], s.confidence[sel][m], s=2, alpha=0.4, color=CLASS_COLORS[name], label=name)
    ax0.set_xlabel("variability (std of gold probability)")
    ax0.set_ylabel("confidence (mean gold probability)")
    ax0.legend(fontsize=6.5, markerscale=4, loc="upper right")
    fe = s.forgetting_events
    ax1.hist(fe, bins=np.arange(fe.max() + 2) - 0.5, color="#d62728")
    ax1.set_yscale("log")
    ax1.set_xlabel("forgetting events per token")
    ax1.set_ylabel("tokens")
    shares = s.rho1_shares()
    ax2.bar(range(4), [shares[c] * 100 for c in RHO1_CLASSES], color=["#7f7f7f", "#1f77b4", "#d62728", "#2ca02c"])
    ax2.set_xticks(range(4), RHO1_CLASSES)
    ax2.set_ylabel("% of tokens")
    ax2.set_title("Rho-1 classes", fontsize=10)
    fig.tight_layout()
    return fig


def _metadata_tables(st: TrajectoryStore, an: StoreAnalysis) -> str:
    rows = []
    for name in st.runs:
        try:
            r = st.run(name)
            info = r.info()
        except TokdynError as exc:  # a damaged run is listed, not fatal to the report
            rows.append([name, "", "", "", "", f"cannot be read: {exc}"])
            continue
        attrs = {k: v for k, v in info["attrs"].items() if k not in ("schema_version", "tokdyn_version", "token_chunk", "codec")}
        steps = info["steps"]
        rows.append([name, r.axis, f"{info['shape'][0]} x {info['shape'][1]:,}",
                     f"{steps[0]}..{steps[-1]}" if steps else "none", f"{info['nonfinite_losses']:,}", _fmt(attrs)])  # fmt: skip
    return "<h2>Runs</h2>" + _table(["run", "axis", "rows x tokens", "steps", "NaN losses", "metadata"], rows)

