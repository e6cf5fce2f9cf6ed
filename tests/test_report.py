"""The report's structure: contents, numbered and captioned figures, metadata collapsed, example
tokens shown as text in context, fitted curves never drawn below 0 nats."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

import tokdyn
from tokdyn.report import _drawn_curve, write_report

STEPS = np.unique(np.round(np.geomspace(1, 2000, 24)).astype(int))
TEXT = "def token_loss(run):\n    return run.fit.read()  # each token's event\n" * 40


@pytest.fixture(scope="module")
def store_and_page(tmp_path_factory):
    """The report of a small fitted store whose probe is byte-tokenized text: planted events."""
    d = tmp_path_factory.mktemp("report")
    ids = np.frombuffer(TEXT.encode(), dtype=np.uint8).astype(np.int32)
    S, C = 24, 40
    tokens = ids[: S * (C + 1)].reshape(S, C + 1)
    probe = tokdyn.ProbeSet.from_tokens(tokens, tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256},
                                        domain=np.arange(S) % 2, domains=("_private", "public"))
    n = probe.n_tokens
    rng = np.random.default_rng(0)
    x = np.log10(STEPS)
    mu, s, drop = rng.uniform(0.5, 2.8, n), rng.uniform(0.05, 0.3, n), rng.uniform(1, 4, n)
    Y = 1 + drop[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / s[:, None]))
    Y[: n // 10] = 5.0  # some tokens never learned
    Y += rng.normal(0, 0.1, Y.shape)
    st = tokdyn.open_store(d / "s.zarr", probe, mode="w")
    with st.create_run("r", capacity=len(STEPS), attrs={"note": "MARKER-ATTR"}).writer() as w:
        for j, step in enumerate(STEPS):
            w.append(Y[:, j].clip(0.01), step=int(step))
    tokdyn.fit_run(st.run("r"), progress=False)
    return st, write_report(st, d / "report.html", extra={"wall time (s)": {"fit": 1.0}}).read_text()


@pytest.fixture(scope="module")
def page(store_and_page):
    return store_and_page[1]


def test_contents_list_every_section_and_numbered_figure(page):
    nav = page[page.index("<nav") : page.index("</nav>")]
    figures = re.findall(r"<figure id=(fig-\d+)>", page)
    assert len(figures) >= 6
    assert figures == [f"fig-{i}" for i in range(1, len(figures) + 1)]  # numbered in order
    assert re.findall(r"href='#(fig-\d+)'", nav) == figures  # one contents entry per figure
    sections = re.findall(r"<h2 id=(sec-\d+)>", page)
    assert re.findall(r"href='#(sec-\d+)'", nav) == sections and len(sections) >= 3


def test_every_figure_has_a_numbered_title_and_a_caption(page):
    blocks = re.findall(r"<figure id=fig-(\d+)>(.*?)</figure>", page, flags=re.S)
    for n, block in blocks:
        cap = re.search(r"<figcaption><b>Figure (\d+)\. ([^<]+)</b>([^<]+)</figcaption>", block)
        assert cap and cap.group(1) == n, n
        assert len(cap.group(3).strip()) > 80, (n, cap.group(3))  # says how to read it
        assert "data:image/png;base64," in block


def test_run_metadata_is_collapsed(page):
    assert page.count("MARKER-ATTR") == 1
    details = re.findall(r"<details>.*?</details>", page, flags=re.S)
    assert any("MARKER-ATTR" in d for d in details)


def test_example_tokens_show_their_text_in_context(page):
    marks = re.findall(r"<code class=ctx>…([^<]*)<mark>([^<]+)</mark></code>", page)
    assert marks
    flat = TEXT.replace("\n", "↵")
    for before, token in marks:  # the text before the token, then the token, as in the probe
        assert html.unescape(before + token).replace("␣", " ") in flat * 2


def test_no_fitted_curve_is_drawn_below_zero():
    # a censored event whose level extrapolates to -38 nats, as fits made before levels were bounded did
    f = {"model": np.array([2]), "l0": np.array([5.2]), "linf": np.array([-38.4]), "mu": np.array([4.35]), "s": np.array([0.76])}
    xf = np.linspace(0.0, 2.9, 50)
    y = _drawn_curve(f, 0, xf)
    assert y.min() == 0.0 and y[0] == pytest.approx(5.2 - 43.6 / (1 + np.exp(4.35 / 0.76)), abs=1e-9)


def test_the_page_is_self_contained(page):
    assert not re.search(r"(src|href)=['\"]?(http|file|/)", page)
    scripts = re.findall(r"<script[^>]*>", page, flags=re.I)
    assert scripts and all("src" not in s.lower() for s in scripts)  # inline only: the token viewer
    assert "<link" not in page.lower() and "@import" not in page and "url(" not in page


def test_a_tokenizer_given_must_be_the_probes():
    from tokdyn.errors import InputError
    from tokdyn.report import _decoder
    from tokdyn.tokenizer import ByteTokenizer

    tokens = np.frombuffer(b"abcdefghij" * 4, dtype=np.uint8).astype(np.int32).reshape(4, 10)
    hf = tokdyn.ProbeSet.from_tokens(tokens, tokenizer={"kind": "hf", "vocab_size": 50_000, "sha256": "0" * 64})
    assert _decoder(hf, None) is None  # the store keeps a description, not the tokenizer
    with pytest.raises(InputError, match="not the probe's"):
        _decoder(hf, ByteTokenizer())
    byte = tokdyn.ProbeSet.from_tokens(tokens, tokenizer=ByteTokenizer().spec())
    assert _decoder(byte, ByteTokenizer())([104, 105]) == _decoder(byte, None)([104, 105]) == "hi"


def test_every_domain_is_in_its_legend(store_and_page):
    """A legend drops lines whose label starts with "_" unless given its labels: "_private" was lost."""
    from tokdyn.analysis import analyze_run
    from tokdyn.report import _fig_groups

    st, _ = store_and_page
    f = _fig_groups(st, analyze_run(st.run("r"), n_boot=0))
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in f.fig.axes if ax.get_legend()]
    assert ["_private", "public"] in [sorted(names) for names in legends]


def test_the_summary_headlines_each_run(page):
    line = re.search(r"<p><b>Run r:</b> ([^<]+)</p>", page).group(1)
    assert "fell from" in line and "training step 1 and 2,000" in line and "learned" in line


def test_report_command_shows_an_own_tokenizers_text(tmp_path, capsys):
    """`tokdyn report --tokenizer` decodes a BPE probe's tokens; another tokenizer is refused in one line."""
    pytest.importorskip("tokenizers")
    from tokdyn.cli import main
    from tokdyn.tokenizer import HFTokenizer

    tok = HFTokenizer.train([TEXT] * 4, vocab_size=320)
    tok.save(tmp_path / "tokenizer.json")
    ids = tok.encode(TEXT)
    S, C = 12, 20
    probe = tokdyn.ProbeSet.from_tokens(ids[: S * (C + 1)].reshape(S, C + 1), tokenizer=tok.spec())
    rng = np.random.default_rng(1)
    x = np.log10(STEPS)
    mu = rng.uniform(0.5, 2.8, probe.n_tokens)
    st = tokdyn.open_store(tmp_path / "s.zarr", probe, mode="w")
    with st.create_run("r", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            w.append(1 + 3 / (1 + np.exp((x[j] - mu) / 0.1)) + rng.normal(0, 0.05, mu.size), step=int(step))
    tokdyn.fit_run(st.run("r"), progress=False)
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "s.zarr"), "--out", str(out)]) == 0
    assert "token_loss" not in out.read_text()  # without the tokenizer: ids only
    assert main(["report", str(tmp_path / "s.zarr"), "--out", str(out), "--tokenizer", str(tmp_path / "tokenizer.json")]) == 0
    assert "token_loss" in html.unescape(re.sub(r"<[^>]+>", "", out.read_text()))
    HFTokenizer.train(["other text entirely, " * 50], vocab_size=300).save(tmp_path / "other.json")
    capsys.readouterr()
    assert main(["report", str(tmp_path / "s.zarr"), "--out", str(out), "--tokenizer", str(tmp_path / "other.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not the probe's" in err[0]
    # one without the probe's end-of-text token is also another tokenizer (it said "the tokenizer has no token ...")
    import tokenizers

    bare = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    bare.save(str(tmp_path / "bare.json"))
    assert main(["report", str(tmp_path / "s.zarr"), "--out", str(out), "--tokenizer", str(tmp_path / "bare.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not the probe's" in err[0], err


def test_the_viewer_shows_a_character_split_over_bytes_whole():
    from tokdyn.report import _decoder, _pieces

    probe = tokdyn.ProbeSet.from_tokens(np.zeros((1, 4), np.int32), tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256})
    row = np.frombuffer("aé€".encode(), dtype=np.uint8)
    assert _pieces(row, _decoder(probe, None)) == ["a", "", "é", "", "", "€"]
    assert _pieces(row[:2], None) == ["⟨97⟩", "⟨195⟩"]  # ids where nothing can decode them


def test_the_token_viewer_shows_the_probe_text_and_each_tokens_fit(store_and_page, monkeypatch):
    import json

    import tokdyn.report as report
    from tokdyn.analysis import analyze_run

    st, page = store_and_page
    assert "Shown: the first 24 of 24 sequences (960 of 960 probe tokens), as text" in page
    monkeypatch.setattr(report, "VIEW_TOKENS", 100)  # bounded: whole sequences, at most this many tokens
    a = analyze_run(st.run("r"), n_boot=0)
    data, shown, total, n = report._viewer_data(st, a, report._decoder(st.probe, None))
    assert (shown, total, n) == (2, 24, 80)
    assert "".join(tok[0] for tok in data["seqs"][0]) == TEXT[:41].replace("\n", "↵\n")  # the sequence's text, token by token (line ends shown)
    scored = [tok for seq in data["seqs"] for tok in seq if len(tok) > 1]
    assert len(scored) == 80 and all(len(tok[4]) == len(data["x"]) and len(tok[5]) == len(data["xf"]) for tok in scored)
    t = 5  # a token's recorded losses in centinats, and its fitted curve as the figures draw it
    Y = st.run("r").losses_at(np.arange(len(data["x"])), [t])[:, 0]
    assert scored[t][4] == [round(v * 100) for v in Y]
    assert scored[t][5] == [round(v * 100) for v in _drawn_curve(a.fit, t, np.array(data["xf"]))]
    assert json.loads(report._script_json(data)) == data


def test_the_viewers_tokens_join_to_the_decoded_text():
    """Each token's piece is what it adds to the text: joined, they are the sequence as decoded."""
    pytest.importorskip("tokenizers")
    from tokdyn.report import _pieces
    from tokdyn.tokenizer import HFTokenizer

    tok = HFTokenizer.train([TEXT, "naïve café — ünïcode\n" * 20], vocab_size=300)
    ids = tok.encode("def café(run):\n    return naïve  # ünïcode — " + TEXT[:200])
    pieces = _pieces(ids, lambda t: tok.decode([int(i) for i in t]))
    assert len(pieces) == len(ids) and "".join(pieces) == tok.decode(ids)


def test_a_refit_that_finishes_while_the_report_is_made_is_refused(store_and_page, tmp_path, monkeypatch):
    """The figures read each fit more than once (the analysis, then its fitted rows): a refit that
    finished in between was mixed into the page without a word. The page before is kept."""
    import tokdyn.report as report
    from tokdyn.errors import StoreError

    st, _ = store_and_page
    out = tmp_path / "r.html"
    out.write_text("the previous report")
    real = report.render_report

    def refit_first(st_, an, **kw):
        tokdyn.fit_run(st_.run("r"), refit=True, progress=False)
        return real(st_, an, **kw)

    monkeypatch.setattr(report, "render_report", refit_first)
    with pytest.raises(StoreError, match=r"the fit of run\(s\) \['r'\] changed while the report was made"):
        write_report(st, out)
    assert out.read_text() == "the previous report"
    monkeypatch.setattr(report, "render_report", real)
    assert "<html" in write_report(st, out).read_text()  # the fit, now settled, is reported


def test_a_tokenizer_for_a_probe_without_a_tokenizer_file_says_what_the_probe_has(tmp_path, capsys):
    """A byte-level probe's refusal read "(byte, sha256 None)"."""
    pytest.importorskip("tokenizers")
    from tokdyn.cli import main
    from tokdyn.tokenizer import HFTokenizer

    HFTokenizer.train(["some text, " * 50], vocab_size=300).save(tmp_path / "tok.json")
    byte = tokdyn.ProbeSet.from_tokens(np.zeros((2, 9), np.int32), tokenizer={"kind": "byte", "vocab_size": 257, "eot_id": 256})
    index_only = tokdyn.ProbeSet(None, {"sample_id": np.arange(4, dtype=np.int32), "token_pos": np.zeros(4, np.int32)})
    for name, probe, said in (("b", byte, "(byte-level, which the report decodes itself: leave --tokenizer out)"),
                              ("i", index_only, "(none: an imported probe without token ids, nothing to decode)")):  # fmt: skip
        tokdyn.open_store(tmp_path / f"{name}.zarr", probe, mode="w")
        capsys.readouterr()
        argv = ["report", str(tmp_path / f"{name}.zarr"), "--out", str(tmp_path / "r.html"), "--tokenizer", str(tmp_path / "tok.json")]
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not the probe's" in err[0] and err[0].endswith(said) and "None" not in err[0], err
    assert not (tmp_path / "r.html").exists()
