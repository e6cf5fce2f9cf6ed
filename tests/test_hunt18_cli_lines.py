"""Hunt 18: what the commands print about a user's paths and names shows every character, so a
folder named with a newline (Linux allows it) cannot print a line of its own, and a right-to-left
override cannot turn the line around."""

from __future__ import annotations

import pytest

from tokdyn.cli import main

WORDS = "alpha beta gamma delta epsilon zeta eta theta".split()


@pytest.fixture()
def hostile(tmp_path):
    folder = tmp_path / "nl\nFAKE: probe 000 \u202eevil"
    folder.mkdir()
    src = folder / "src"
    for i in range(30):
        d = src / ("a\nb" if i % 2 else "c")  # a domain whose name holds a newline
        d.mkdir(parents=True, exist_ok=True)
        (d / f"d{i}.txt").write_text(" ".join(WORDS[(i * 3 + j) % 8] for j in range(80)) + f" doc{i}")
    return folder


def _lines(capsys):
    out = capsys.readouterr().out
    assert "\u202e" not in out
    return out.splitlines()


def test_probe_and_info_print_no_line_of_a_name(hostile, capsys):
    store = hostile / "p.zarr"
    assert main(["probe", str(hostile / "src"), "--out", str(store), "--context", "8", "--sequences", "8", "--probe-fraction", "0.5",
                 "--held-out", str(hostile / "keys.txt")]) == 0  # fmt: skip
    lines = _lines(capsys)
    assert not any(line.startswith(("FAKE", "b,", "b ")) for line in lines), lines
    assert any("nl\\nFAKE" in line for line in lines) and any("a\\x0ab" in line for line in lines)
    assert main(["info", str(store)]) == 0
    lines = _lines(capsys)
    assert not any(line.startswith("FAKE") for line in lines), lines
