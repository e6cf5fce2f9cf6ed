"""Defect hunt 11 on where results go and on what the report says of degenerate runs: each test
stands for a class of defect.

- ``--out -`` wrote a file named ``-`` (the report, and any result file): refused in one line;
  ``./-`` still names that file;
- an output inside a zarr hierarchy (``--out store.zarr/r.html``, a run's folder, a link to a
  store, any folder above the path that holds ``zarr.json``) was written among the store's own
  nodes: refused in one line naming the store;
- the spectrum of a run with one, or a few, tokens with a clear learning event drew a bell of
  bars labelled "histogram of event times", which reads as a distribution of many events; all
  events at one time read as a spread of times; no clear event at all read as a spectrum;
- a flat run whose measured mean loss moved by noise was said to have "risen"; a flat run
  whose fitted changes were all below FLAT_NATS showed "not_yet_learned 100%" of a loss drop.
"""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

import tokdyn
from tokdyn._files import check_output_path, write_atomically
from tokdyn.cli import main
from tokdyn.errors import InputError
from tokdyn.fit.models import FLAT_NATS

STEPS = np.unique(np.round(np.geomspace(1, 1000, 14)).astype(int))
X = np.log10(STEPS)
BYTE = {"kind": "byte", "vocab_size": 257, "eot_id": 256}
TEXT = "def f(x): return x + 1\nclass A: pass\n" * 20


def _store(path, losses: dict, *, sequences: int = 2, context: int = 20):
    """A byte-level probe of ``sequences * context`` scored tokens; ``losses`` is
    ``{run name: function(n_tokens) -> [n_tokens, len(STEPS)] losses}``, each run fitted."""
    raw = np.resize(np.frombuffer(TEXT.encode(), dtype=np.uint8), sequences * (context + 1))
    probe = tokdyn.ProbeSet.from_tokens(raw.astype(np.int32).reshape(sequences, context + 1), tokenizer=BYTE)
    st = tokdyn.open_store(path, probe, mode="w")
    for name, make in losses.items():
        Y = make(st.probe.n_tokens).astype(np.float32)
        with st.create_run(name, capacity=len(STEPS)).writer() as w:
            for j, step in enumerate(STEPS):
                w.append(Y[:, j], step=int(step))
        tokdyn.fit_run(st.run(name), progress=False)
    return st


def _planted(n: int, mu: np.ndarray, seed: int) -> np.ndarray:
    """Tokens 0..len(mu)-1 learned at log10 step ``mu`` (a 2 nats drop, width 0.15 decades); the
    rest constant at 3 nats; a little noise on all."""
    rng = np.random.default_rng(seed)
    Y = np.full((n, X.size), 3.0)
    k = len(mu)
    Y[:k] = 1 + 2.0 / (1 + np.exp((X[None] - np.asarray(mu)[:, None]) / 0.15))
    return (Y + rng.normal(0, 0.002, Y.shape)).clip(0.01)


def _flat(n: int) -> np.ndarray:
    """Every token constant at 3 nats with noise 0.05 whose mean, at the last step, lies 0.01 above
    the first (a noise the fit sees as no change at all)."""
    rng = np.random.default_rng(5)
    Y = 3.0 + rng.normal(0, 0.05, (n, X.size))
    Y[:, -1] += 0.01 - (Y[:, -1].mean() - Y[:, 0].mean())
    return Y


def _small_fall(n: int) -> np.ndarray:
    """Every token falls by 0.3 nats at step 30: a true fall, not noise."""
    return 3.0 - 0.3 / (1 + np.exp(-(X[None] - 1.5) / 0.15)) + np.zeros((n, 1))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The store, and each run's headline and spectrum figure caption, made by the report's own
    functions on one analysis (a whole page of six runs takes most of a minute)."""
    import matplotlib.pyplot as plt

    from tokdyn.analysis import analyze_store
    from tokdyn.report import _fig_spectrum, _headline

    tmp = tmp_path_factory.mktemp("hunt11")
    runs = {"one": lambda n: _planted(n, [1.5], 0), "three": lambda n: _planted(n, [0.8, 1.5, 2.2], 1),
            "spread": lambda n: _planted(n, np.linspace(0.6, 2.4, 12), 2),
            "together": lambda n: _planted(n, np.full(12, 1.5), 3), "flat": _flat, "fall": _small_fall}  # fmt: skip
    st = _store(tmp / "s.zarr", runs)
    out = {}
    for a in analyze_store(st).runs:
        fig = _fig_spectrum(st, a)
        plt.close(fig.fig)
        out[a.run] = (html.unescape(re.sub(r"<[^>]+>", "", _headline(a))), fig.caption, a)
    return st, out


# -- "-" is no output ----------------------------------------------------------------------------


def test_dash_is_refused_as_every_result_file_and_store(report, tmp_path, monkeypatch, capsys):
    st, _ = report
    monkeypatch.chdir(tmp_path)
    for call in (lambda: write_atomically("-", lambda fh: fh.write("x")), lambda: check_output_path("-"),
                 lambda: check_output_path("-", what="store (--out)", folder_ok=True)):  # fmt: skip
        with pytest.raises(InputError, match="never to standard output"):
            call()
    assert main(["report", str(st.url), "--run", "one", "--out", "-"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "standard output" in err[0] and "name a file" in err[0]
    assert main(["curriculum", "schedule", str(st.url), "--run", "spread", "--steps", "100", "--out", "-"]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # no file named "-", nor anything else
    write_atomically("./-", lambda fh: fh.write("x"))  # a file of that name, asked for as one
    assert (tmp_path / "-").read_text() == "x"


# -- nothing written into a zarr hierarchy ------------------------------------------------------


def test_a_result_inside_a_store_is_refused_naming_the_store(report, tmp_path, capsys):
    st, _ = report
    root = st.url.rstrip("/")
    before = sorted(p.relative_to(root) for p in __import__("pathlib").Path(root).rglob("*"))
    link = tmp_path / "alias"
    link.symlink_to(root)
    inside = [f"{root}/r.html", f"{root}/runs/one/r.html", f"{root}/runs/../r.html", f"{link}/r.html",
              f"{root}/runs/no-such-folder/r.html"]  # fmt: skip
    for out in inside:
        assert main(["report", str(st.url), "--run", "one", "--out", out]) == 1, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "inside the zarr store" in err[0] and root.rsplit("/", 1)[-1] in err[0], err
    assert main(["export-npz", str(st.url), f"{root}/runs/x.npz", "--run", "one"]) == 1
    assert "inside the zarr store" in capsys.readouterr().err
    assert main(["curriculum", "schedule", str(st.url), "--run", "spread", "--steps", "100", "--out", f"{root}/m.json"]) == 1
    assert "inside the zarr store" in capsys.readouterr().err
    with pytest.raises(InputError, match="inside the zarr store"):  # a new store inside a store
        check_output_path(f"{root}/runs/new.zarr", what="store (--out)", folder_ok=True)
    assert sorted(p.relative_to(root) for p in __import__("pathlib").Path(root).rglob("*")) == before
    # the class: any folder holding zarr metadata, made here by zarr itself (an array, not a tokdyn store)
    import zarr

    zarr.create_array(str(tmp_path / "arr.zarr"), shape=(3,), dtype="f4")
    with pytest.raises(InputError, match="inside the zarr store"):
        write_atomically(tmp_path / "arr.zarr" / "r.json", lambda fh: fh.write("{}"))
    # beside a store, and a store itself (appended to), are no part of it
    check_output_path(f"{root}.html")
    check_output_path(root, what="store (--out)", folder_ok=True)


# -- the spectrum of a few events -----------------------------------------------------------------


def test_a_spectrum_of_few_events_says_so_and_when(report):
    _, runs = report
    one = runs["one"][1]
    assert "Only 1 token of the 40 has a clear learning event" in one
    step = float(re.search(r"at training step ([\d,.]+);", one).group(1).replace(",", ""))
    assert abs(np.log10(step) - 1.5) < 0.05  # the planted event's time, 10^1.5 = 32
    three = runs["three"][1]
    steps = [float(v.replace(",", "")) for v in re.search(r"at training steps ([\d,. ]+);", three).group(1).split(", ")]
    assert np.allclose(np.log10(steps), [0.8, 1.5, 2.2], atol=0.05)
    assert "not a distribution of learning times" in three
    assert "the part of every event's drop that its sigmoid puts in each bin" in one  # not "histogram of event times"
    together = runs["together"][1]
    assert "All 12 clear learning events" in together and "within one bandwidth" in together
    assert "not a spread of learning times" in together
    spread = runs["spread"][1]  # 12 events over two decades: a spectrum, said as one
    assert "Only" not in spread and "within one bandwidth" not in spread and "No token" not in spread
    assert "No token of the 40 has a clear learning event" in runs["flat"][1]


# -- a change within noise is flat --------------------------------------------------------------


def test_a_flat_run_is_flat_not_a_rise(report):
    from tokdyn.report import _fig_classes

    st, runs = report
    flat, _, a = runs["flat"]
    assert a.class_drops.flat and a.reconstruction.mean_loss_rose  # the premise: the measured mean rose by noise
    assert re.search(r"probe tokens stayed flat, from 3.00 to 3.01 nats \(a change within noise\)", flat), flat
    assert not re.search(r"\b(rose|fell) from", flat)
    assert f"changed by as much as {FLAT_NATS:g} nats" in flat and "neither fell nor rose" in flat
    assert "%" not in flat  # no share of a drop that is no drop ("not_yet_learned 100%")
    assert _fig_classes(st, a).title == "How much each class's loss fell or rose"
    fall = runs["fall"][0]
    assert "fell from 3.00 to 2.70" in fall and "stayed flat" not in fall, fall


def test_a_mean_that_moved_while_no_fit_did_is_said_as_it_is(report):
    """No class's fitted loss moved, yet the measured mean fell by 0.3 nats (noisy tokens fitted
    as constants): that is no "change within noise", and the headline says the fall and that the
    fits do not carry it."""
    from dataclasses import replace

    from tokdyn.report import FLAT_MEAN_NATS, _headline

    _, runs = report
    a = runs["flat"][2]
    ml = np.array(a.reconstruction.mean_loss, dtype=np.float64)
    ok = np.flatnonzero(np.isfinite(ml))
    ml[ok[-1]] = ml[ok[0]] - 0.3
    assert 0.3 > FLAT_MEAN_NATS and a.class_drops.flat
    text = _headline(replace(a, reconstruction=replace(a.reconstruction, mean_loss=ml)))
    assert re.search(r"probe tokens fell from 3\.0\d to 2\.7\d nats", text), text
    assert "stayed flat" not in text and "do not carry this change" in text and "%" not in text
