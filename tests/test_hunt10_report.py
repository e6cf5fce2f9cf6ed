"""Defect hunt 10 on ``tokdyn report``: each test stands for a class of defect found by rendering
reports in a browser and looking at them.

- a report path that is a device, FIFO or socket is refused (``--out /dev/null`` replaced the
  device with a regular file);
- a character that shows nothing in a user's name (a right-to-left override, a zero-width
  space, a control character) is written visibly, so it can neither reverse the page's own text
  after the name nor make two names look alike;
- a name of hundreds of characters without a space wraps instead of widening the page;
- a run whose tokens' fitted losses did not change is not said to have risen, and a run with no
  timed learning event gets a line, not a figure of empty axes;
- a count of forgetting events has whole-number ticks;
- an example token that is part of a character (UTF-8 bytes) is shown as the viewer shows it,
  never as "�".
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import json

import numpy as np
import pytest

import tokdyn
from tokdyn.analysis import analyze_store
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.report import _fig_cartography, _token_in_context, _decoder, write_report

STEPS = np.unique(np.round(np.geomspace(1, 1000, 14)).astype(int))
BYTE = {"kind": "byte", "vocab_size": 257, "eot_id": 256}
RLO_NAME = "run\u202eRTL\u200bzw"  # reads "runwzLTR" where obeyed
LONG_NAME = "N" * 200  # a run name is a folder: at most 255 bytes
HOSTILE_DOMAIN = "dom\u202eain\u200b\x07<b>x</b>"
TEXT = "déjà vu, naïve café 🎉 日本語 def f(x): return x + 1\n"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _losses(n: int, kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.log10(STEPS)
    if kind == "flat":
        Y = np.full((n, x.size), 3.0)
    else:
        mu, d = rng.uniform(0.5, 2.5, n), rng.uniform(1, 3, n)
        Y = 1 + d[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / 0.15))
    noise = 0.002 if kind == "flat" else 0.05  # flat: every token a constant, no spike fitted on noise
    return (Y + rng.normal(0, noise, Y.shape)).clip(0.01).astype(np.float32)


def _store(path, runs: dict, *, sequences: int = 6, context: int = 40):
    """A byte-level probe of TEXT (multi-byte characters) in two domains, one of them a hostile
    name; ``runs`` is ``{name: "flat" | "learned"}``, each fitted."""
    raw = np.frombuffer((TEXT * 40).encode(), dtype=np.uint8)[: sequences * (context + 1)]
    tokens = raw.astype(np.int32).reshape(sequences, context + 1)
    probe = tokdyn.ProbeSet.from_tokens(tokens, domain=np.arange(sequences) % 2, domains=("code", HOSTILE_DOMAIN),
                                        tokenizer=BYTE)  # fmt: skip
    st = tokdyn.open_store(path, probe, mode="w")
    for name, kind in runs.items():
        Y = _losses(st.probe.n_tokens, kind)
        with st.create_run(name, capacity=len(STEPS)).writer() as w:
            for j, step in enumerate(STEPS):
                w.append(Y[:, j], step=int(step))
        tokdyn.fit_run(st.run(name), progress=False)
    return st


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hunt10")
    st = _store(tmp / "s.zarr", {"flat": "flat", RLO_NAME + LONG_NAME: "learned"})
    page = write_report(st, tmp / "report.html")
    return st, page, page.read_text(encoding="utf-8")


def _captions(page: str) -> dict:
    return {html.unescape(m.group(1)): html.unescape(m.group(2))
            for m in re.finditer(r"<figcaption><b>Figure \d+\. (.*?)\.</b> (.*?)</figcaption>", page, flags=re.S)}  # fmt: skip


# -- the output path ---------------------------------------------------------------------------


def test_a_report_path_that_is_a_pipe_is_refused_and_left_as_it_is(report, tmp_path, capsys):
    st, _, _ = report
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="it is a FIFO, not a regular file"):
        write_report(st, fifo)
    assert main(["report", str(st.url), "--out", str(fifo)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a regular file" in err[0]
    import stat

    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the pipe, not a file renamed over it


def test_no_result_file_is_renamed_over_a_pipe(report, tmp_path, capsys):
    """The class: every result file is written by write_atomically and its path checked by
    check_output_path, so export-npz, a schedule or a table to a pipe is refused as the report is."""
    import stat

    from tokdyn._files import check_output_path, write_atomically

    st, _, _ = report
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="it is a FIFO"):
        write_atomically(fifo, lambda fh: fh.write("x"))
    with pytest.raises(InputError, match="it is a FIFO"):
        check_output_path(fifo)
    with pytest.raises(InputError, match="it is a device"):
        check_output_path("/dev/null")
    assert main(["export-npz", str(st.url), str(fifo), "--run", "flat"]) == 1
    assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    link = tmp_path / "stdout"
    link.symlink_to(fifo)  # as /dev/stdout -> /proc/self/fd/1: the result replaced the link (found by the review)
    with pytest.raises(InputError, match="it is a link to a FIFO, not a regular file"):
        write_atomically(link, lambda fh: fh.write("x"))
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    plain = tmp_path / "plain.txt"
    plain.write_text("old")
    to_plain = tmp_path / "to_plain"
    to_plain.symlink_to(plain)  # a link to a file is replaced, not written through, as before
    write_atomically(to_plain, lambda fh: fh.write("x"))
    assert to_plain.read_text() == "x" and not to_plain.is_symlink() and plain.read_text() == "old"


# -- names ---------------------------------------------------------------------------------------


def test_invisible_characters_in_names_are_shown_not_obeyed(report):
    _, _, page = report
    # outside the token viewer's data (the probe's own text, shown as it is), no character that
    # shows nothing: an override in a run name reversed "(axis T: training step)" after it
    outside = re.sub(r"<script type=application/json id=tv-data>.*?</script>", "", page, flags=re.S)
    for ch in ("\u202e", "\u200b", "\x07"):
        assert ch not in outside
    assert "run\\u202eRTL\\u200bzw" in outside  # the name, every character of it visible


def test_invisible_characters_in_a_legend_are_shown(report):
    from tokdyn._fonts import figure_label as _literal

    assert _literal(HOSTILE_DOMAIN) == "dom\\u202eain\\u200b\\x07<b>x</b>"
    assert "\u202e" not in _literal("a\u202eb" + "c" * 100)


def test_a_long_name_wraps_in_the_page(report):
    _, _, page = report
    css = re.search(r"<style>(.*?)</style>", page, flags=re.S).group(1)
    # headings, paragraphs and table headers may break a word of hundreds of characters
    assert re.search(r"h1,h2,p,[^{]*th[^{]*\{overflow-wrap:anywhere\}", css), css
    assert f"<span class=nm>{html.escape('run')}" in page  # the metadata table's name cell may break too


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_a_long_name_does_not_widen_the_page_in_a_browser(report, tmp_path):
    _, page, _ = report
    url = page.resolve().as_uri() + "#selftest=caf"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=800,1000", "--virtual-time-budget=5000", "--dump-dom", url]  # fmt: skip
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=90).stdout
    m = re.search(r'<pre id="selftest-result">(.*?)</pre>', dom, flags=re.S)
    assert m, dom[-2000:]
    got = json.loads(html.unescape(m.group(1)))
    assert got["scroll_width"] <= got["client_width"] and not got["overflowing"], got
    assert got["decoded"] == got["images"]


# -- a run whose tokens did not change -----------------------------------------------------------


def test_a_run_whose_fitted_losses_did_not_change_is_not_said_to_have_risen(report):
    _, _, page = report
    caps = _captions(page)
    flat = caps["How much each class's loss fell or rose"]  # the flat run is the first: its figure comes first
    assert "the loss rose" not in flat and "no class's fitted loss changed" in flat


def test_a_run_without_timed_events_gets_a_line_not_empty_axes(report):
    _, _, page = report
    titles = re.findall(r"<figcaption><b>Figure \d+\. (.*?)\.</b>", page)
    # one figure of learning time against frequency and position (the learned run's), not two
    assert sum(t.startswith("When tokens are learned") for t in titles) == 1
    assert "No figure of when tokens are learned" in page


def test_forgetting_events_have_whole_number_ticks(report):
    import matplotlib.pyplot as plt

    st, _, _ = report
    a = analyze_store(st, runs=["flat"]).runs[0]
    fig = _fig_cartography(st, a).fig
    try:
        ticks = fig.axes[1].get_xticks()
        lo, hi = fig.axes[1].get_xlim()
        shown = [t for t in ticks if lo <= t <= hi]
        assert shown and all(float(t).is_integer() for t in shown), ticks
    finally:
        plt.close(fig)


# -- example tokens that are part of a character -------------------------------------------------


def test_an_example_token_inside_a_character_is_never_shown_as_a_replacement_mark(report):
    st, _, _ = report
    probe = st.probe
    decode = _decoder(probe, None)
    ta = probe.token_arrays
    starts_whole = [probe.tokens[s][0] < 0x80 or probe.tokens[s][0] >= 0xC0 for s in range(probe.tokens.shape[0])]
    for t in range(probe.n_tokens):
        cell = html.unescape(str(_token_in_context(probe, t, decode)))
        if starts_whole[int(ta["sample_id"][t])]:  # a sequence cut inside a character begins with one, honestly
            assert "\ufffd" not in cell, cell
    # "é" is two bytes: its first byte is a token that adds no character of its own
    s, p = next((s, p) for s in range(probe.tokens.shape[0]) for p in range(1, probe.tokens.shape[1])
                if probe.tokens[s][p] == 0xC3)  # fmt: skip
    t = int(np.flatnonzero((np.asarray(ta["sample_id"]) == s) & (np.asarray(ta["token_pos"]) == p))[0])
    assert "⟨the first byte(s) of “" in html.unescape(str(_token_in_context(probe, t, decode)))


def test_what_is_escaped_in_names_and_in_the_probe_text():
    # names: every character that shows nothing; the probe's own text: only what disturbs the
    # page (a Persian zero-width non-joiner, a soft hyphen, a left-to-right mark are its own; a
    # carriage return is a line end); a trailing joiner is no emoji's part (found by the review)
    from tokdyn._text import visible as _visible

    assert _visible("a\u200cb\u00adc") == "a\\u200cb\\xadc"
    assert _visible("a\u200cb\u00adc\u200e", data=True) == "a\u200cb\u00adc\u200e"
    assert _visible("x\u202ey", data=True) == _visible("x\u202ey") == "x\\u202ey"
    assert _visible("run\u00a9\u200d") == "run\u00a9\\u200d"
    assert _visible("\U0001f469\u200d\U0001f4bb") == "\U0001f469\u200d\U0001f4bb"
    flag = "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"
    assert _visible(flag) == flag


def test_class_changes_that_each_round_to_zero_are_flat():
    from tokdyn.fit.models import class_drops

    d = class_drops(np.array([0, 0, 1, 1]), np.array([0.0008, 0.0, -0.0009, 0.0]))  # +0.0004 and -0.00045 a token
    assert "rise" not in d.reason and d.reason.startswith("no class's fitted loss changed")
