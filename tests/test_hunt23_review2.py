"""Review of hunt 23: regressions found in the changes d164a32..9eeed40."""

import json

import numpy as np

from tokdyn.cli import main


def _one_window(path, n: int = 120) -> str:
    """A fitted run of a probe that is one window of ``n`` targets (no doc_id: its unit is the
    window), every token scored."""
    import tokdyn
    from test_curriculum_pilot_checks import BYTE, STEPS

    rng = np.random.default_rng(7)
    mu, noise = rng.uniform(2, 3.5, n), rng.standard_normal((len(STEPS), n))
    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(1).integers(97, 123, size=(1, n + 1)), tokenizer=BYTE)
    x = np.log10(STEPS)
    store = tokdyn.open_store(str(path), probe, mode="w")
    with store.create_run("r", capacity=len(STEPS)).writer() as w:
        for j, step in enumerate(STEPS):
            w.append((1 + 3 / (1 + np.exp((x[j] - mu) / 0.1)) + 0.05 * noise[j]).astype(np.float32), step=int(step))
    tokdyn.fit_run(tokdyn.open_store(str(path), mode="r+").run("r"), progress=False)
    return str(path)


def test_a_probe_of_one_window_still_has_no_spectrum_interval(tmp_path, capsys):
    """run_events took the curriculum's unit rule (units_by_group) for the whole probe to stop
    never-scored padding taking the interval away; with it came the rule's last step, a group in
    one window resampled by its tokens. A probe of one window (every token scored, no padding)
    had no interval ("from 1 window(s) ... needs at least 10"); it then printed one over its 120
    tokens as if independent, while a probe of 2 windows still got none. Before 9eeed40 (d164a32)
    this passed."""
    url = _one_window(tmp_path / "w.zarr")
    assert main(["spectrum", url, "--json"]) == 0
    line = json.loads(capsys.readouterr().out)["spectrum_power_law"]
    assert line["resampled"] == "windows" and line["n_units"] == 1
    assert line["alpha_ci95"] == [None, None] and "1 window" in line["alpha_ci95_why"]


def test_probe_lists_a_source_folder_once_for_its_output_checks(tmp_path, monkeypatch):
    """The output checks of `tokdyn probe` (--out, --held-out, --save-tokenizer, --tokenizer
    against the source) each walked the whole source tree (corpus.source_folders) since 9eeed40:
    four walks before the corpus is read (~1.5 s each on a tree of 50,000 files). One is enough."""
    import tokdyn.corpus
    from tokdyn.cli import main

    src = tmp_path / "src"
    for i in range(12):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"{i}.txt").write_text(f"document {i}: " + "some words of text here. " * 20)
    calls, walk = [], tokdyn.corpus.source_folders
    monkeypatch.setattr(tokdyn.corpus, "source_folders", lambda p: calls.append(p) or walk(p))
    assert main(["probe", str(src), "--out", str(tmp_path / "p.zarr"), "--held-out", str(tmp_path / "keys.txt"),
                 "--tokenizer", "bpe", "--save-tokenizer", str(tmp_path / "tok.json"),
                 "--sequences", "2", "--context", "8", "--probe-fraction", "0.5"]) == 0
    assert len(calls) == 1, calls


def test_a_file_system_without_inode_numbers_still_gives_every_folder(tmp_path, monkeypatch):
    """corpus._list_files (9eeed40) tells folders apart by (st_dev, st_ino) to enter each once;
    st_ino is 0 where a file system has no inode numbers (Python: "if non-zero, uniquely
    identifies the file"; some Windows and network file systems), and every folder after the
    first was then a 'link to a folder read already': skipped, its documents gone from the probe."""
    import os
    import warnings

    from tokdyn.corpus import text_documents

    for d in ("a", "b", "c/d"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "t.txt").write_text(f"the text of {d}. " * 20)
    real = os.stat

    def no_inode(path, *args, **kwargs):
        st = real(path, *args, **kwargs)
        return os.stat_result((st.st_mode, 0, *tuple(st)[2:]))

    monkeypatch.setattr(os, "stat", no_inode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keys = [d.key for d in text_documents(tmp_path)]
    assert keys == ["a/t.txt", "b/t.txt", "c/d/t.txt"]
