"""The report in a browser (headless Chromium, skipped where it is not installed): the page
loads, every image decodes, nothing is wider than an 800 px window, and the token viewer
colours the text, finds a string and draws the trajectory of the token it selects. The page's
own self-check runs when its address ends in ``#selftest=TEXT`` and writes what it found into
the page, which ``--dump-dom`` prints."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

import tokdyn
from tokdyn.report import CURVE_POINTS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
STEPS = np.unique(np.round(np.geomspace(1, 1000, 14)).astype(int))
HOSTILE = "x = '</script><script>document.body.dataset.pwned=1</script>' + \"<img src=x onerror=alert(1)>\" <!-- \u2028é\n"


class Words:
    """A tokenizer whose tokens are whole strings, one of them a script: a probe's text as
    another tokenizer would decode it, with "</script>" inside a single token."""

    vocab = ["def", " token_loss", "(run):\n", "    return", " run.fit.read()", "  # each token's event\n",
             "</script><script>document.body.dataset.pwned=1</script>", "<!--", " \"quoted\" 'text'\u2028\n"]  # fmt: skip

    def spec(self) -> dict:
        return {"kind": "words", "vocab_size": len(self.vocab)}

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)


def byte_store(path, text: str, *, sequences: int = 8, context: int = 40):
    """A fitted store whose probe is ``text`` as UTF-8 bytes (repeated as needed)."""
    raw = np.frombuffer((text * (1 + sequences * (context + 1) // len(text.encode()))).encode(), dtype=np.uint8)
    tokens = raw[: sequences * (context + 1)].astype(np.int32).reshape(sequences, context + 1)
    return fitted_store(path, tokens, {"kind": "byte", "vocab_size": 257, "eot_id": 256})


def fitted_store(path, tokens: np.ndarray, tokenizer: dict):
    """A fitted store of the probe ``tokens`` [sequences, context + 1]: one planted event a token."""
    probe = tokdyn.ProbeSet.from_tokens(tokens, tokenizer=tokenizer)
    rng = np.random.default_rng(0)
    n, x = probe.n_tokens, np.log10(STEPS)
    mu, d = rng.uniform(0.5, 2.5, n), rng.uniform(1, 3, n)
    Y = 1 + d[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / 0.15)) + rng.normal(0, 0.05, (n, x.size))
    st = tokdyn.open_store(path, probe, mode="w")
    with st.create_run("r", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            w.append(Y[:, j].clip(0.01), step=int(step))
    tokdyn.fit_run(st.run("r"), progress=False)
    return st


def self_check(page, find: str, tmp_path) -> tuple[dict, str]:
    """Open ``page`` in an 800 px window with the self-check searching ``find``: its result and the DOM."""
    url = page.resolve().as_uri() + "#selftest=" + find
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=800,1000", "--virtual-time-budget=5000", "--dump-dom", url]  # fmt: skip
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    m = re.search(r'<pre id="selftest-result">(.*?)</pre>', dom, flags=re.S)
    assert m, dom[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")), dom


pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")


def test_the_report_loads_fits_800px_and_its_token_viewer_works(tmp_path):
    tokens = (np.arange(8 * 41) % len(Words.vocab)).astype(np.int32).reshape(8, 41)
    st = fitted_store(tmp_path / "s.zarr", tokens, Words().spec())
    page = tokdyn.write_report(st, tmp_path / "report.html", tokenizer=Words())
    got, dom = self_check(page, "token_loss", tmp_path)
    assert got["images"] >= 6 and got["decoded"] == got["images"]  # every figure decodes
    assert got["scroll_width"] <= got["client_width"] and not got["overflowing"], got  # nothing wider than the window
    assert got["tokens"] == st.probe.n_tokens  # every scored token of the (few) sequences is shown
    assert got["hits"] >= 1 and got["selected"] == " token_loss"  # the search found the string and selected its first token
    assert got["points"] == len(STEPS) and got["curve"] == CURVE_POINTS  # its losses and its fitted curve drawn
    assert "data-pwned" not in dom and got["text"].count("document.body.dataset.pwned") == 8 * 41 // len(Words.vocab)
