"""Defects of the probe and curriculum commands found by a hunt, each fixed as a class:

1. a file name with a line break (newline, carriage return, any character ``str.splitlines``
   splits at) made the held-out keys file (``tokdyn probe --held-out``) list other keys than
   the documents': a training run reading it would train on a probe document, silently. A key is
   now always one line (a control character of a name is written ``\\xNN``, as bytes that are not
   UTF-8 already were), the file is written by one function and read back by another;
2. ``--domain-field`` took a record's null, missing, numeric, list, object or empty domain as
   the domain ``"None"``, ``"default"``, ``"3"``...: now one line naming the line and the value;
3. ``tokdyn curriculum schedule --base 1 0`` said the domains "fall in proportion" when the
   real reason was the zero base weight (a domain of base weight 0 is never fed): the verdict
   now names it, and ``best`` is over the domains a schedule can feed;
4. every output's parent folder must exist (one line naming it, before any work; never
   created): ``curriculum build`` created it, ``curriculum schedule`` said so only after the
   work, ``probe --out`` created it;
5. the report's frequency band labels overlapped ("17-20", "20-22"): they come from
   ``tokdyn.tokenstats.frequency_bands``, which now rounds the edges to integers and labels
   each band by the counts it holds.
"""

from __future__ import annotations

import json
import re
import tempfile
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as hs

from reliability_fixtures import cli_error_line, run_cli
from tokdyn import tokenstats
from tokdyn._files import check_output_path, write_atomically
from tokdyn.corpus import (_name_text, held_out_text, jsonl_documents, read_held_out, split_documents,
                           text_documents)  # fmt: skip
from tokdyn.curriculum.mixture import DomainRates, MixtureConfig, MixtureSchedule, enrichment_verdict
from tokdyn.errors import InputError

# every character str.splitlines() splits at, and the other controls a Linux file name may hold
LINE_BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
CONTROLS = LINE_BREAKS + ["\t", "\x01", "\x1b", "\x7f", "\x9f"]


def _can_name(folder: Path, name: str) -> bool:
    try:
        (folder / name).write_text("x")
    except OSError:
        return False
    (folder / name).unlink()
    return True


# -- 1. keys one a line ------------------------------------------------------------------------


@pytest.mark.parametrize("ch", CONTROLS, ids=[f"U+{ord(c[0]):04X}" + ("+LF" if len(c) > 1 else "") for c in CONTROLS])
def test_a_key_made_from_a_file_name_is_always_one_line(ch):
    key = _name_text(f"a/one{ch}two.txt")
    assert key.splitlines() == [key] and "\n" not in key and "\r" not in key
    assert not any(unicodedata.category(c) == "Cc" for c in key)
    assert key != _name_text("a/one.txt") and key != _name_text("a/onetwo.txt")
    assert held_out_text([key]).splitlines() == [key]


def test_a_name_without_control_characters_keeps_its_key():
    for name in ("a/doc.txt", "code/x y.py", "é/ü.txt", "a/back\\slash.txt"):
        assert _name_text(name) == unicodedata.normalize("NFC", name)


# names a file system holds: no "/" or NUL; not hidden (a leading "." is skipped as .git is);
# no backslash, so that no name is the escape another name's control character is written as
# (such a pair is refused by the split, below)
_NAME = hs.text(hs.characters(codec="utf-8", exclude_characters="/\0\\"), min_size=1, max_size=16).filter(
    lambda s: not s.startswith("."))


@settings(max_examples=40, deadline=None)
@given(names=hs.sets(_NAME, min_size=1, max_size=6), extra=hs.sampled_from(["", "\n", "\r", "\r\n", "\u2028", "\x85"]))
def test_any_set_of_file_names_round_trips_through_the_held_out_file(names, extra):
    """Written by ``held_out_text``, read by ``read_held_out`` (and by ``str.splitlines``, as a
    training script may): the same keys, one per file, whatever the names hold."""
    names = {unicodedata.normalize("NFC", n + extra) for n in names}  # NFC-equal names are one key: refused by the split
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "src"
        (root / "d").mkdir(parents=True)
        made = 0
        for n in sorted(names):
            try:
                (root / "d" / n).write_text("some text")
                made += 1
            except OSError:  # a name this file system refuses (too long in bytes)
                continue
        if not made:
            return
        keys = [d.key for d in text_documents(root)]
        assert len(keys) == len(set(keys)) == made  # distinct names, distinct keys
        path = Path(tmp) / "held.txt"
        path.write_text(held_out_text(keys), encoding="utf-8", newline="")
        assert read_held_out(path) == keys
        assert path.read_text(encoding="utf-8").splitlines() == keys
        assert path.read_bytes().count(b"\n") == len(keys)


def test_the_held_out_file_of_tokdyn_probe_lists_exactly_the_probe_documents(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(24):
        (src / "a" / f"doc{i}.txt").write_text(f"plain document {i} " * 12)
    odd = [f"x{ch}y{i}.txt" for i, ch in enumerate(LINE_BREAKS)] + ["y0.txt", "x", "tab\there.txt"]
    odd = [n for n in odd if _can_name(src / "a", n)]
    if len(odd) < 6:
        pytest.skip("the file system refuses control characters in names")
    for n in odd:
        (src / "a" / n).write_text("text of a strangely named file " * 12)
    held = tmp_path / "held.txt"
    code, err = run_cli(["probe", str(src), "--out", str(tmp_path / "s.zarr"), "--context", "8", "--sequences", "2",
                         "--probe-fraction", "0.5", "--held-out", str(held)], capsys)  # fmt: skip
    assert code == 0, err
    _, probe_docs = split_documents(text_documents(src), probe_fraction=0.5)
    expected = sorted(d.key for d in probe_docs)
    assert any("\\x" in k or "\\u" in k for k in expected)  # the case under test: a strange name on the probe side
    assert sorted(read_held_out(held)) == expected
    assert sorted(held.read_text(encoding="utf-8").splitlines()) == expected


def test_an_old_held_out_file_and_a_windows_one_read_back(tmp_path):
    old = tmp_path / "old.txt"
    old.write_bytes(b"a/one.txt\nb/caf\\xe9.txt\nc/\xc3\xa9t\xc3\xa9.txt\n")  # as tokdyn wrote it before
    assert read_held_out(old) == ["a/one.txt", "b/caf\\xe9.txt", "c/été.txt"]
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"a/one.txt\r\nb/two.txt\r\n\r\n")
    assert read_held_out(crlf) == ["a/one.txt", "b/two.txt"]
    with pytest.raises(InputError, match="not found"):
        read_held_out(tmp_path / "missing.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8"):
        read_held_out(tmp_path / "bin.txt")


@pytest.mark.parametrize("key", ["a\nb", "a\rb", "a\u2028b", "", "a\x85b"])
def test_a_key_that_would_not_be_one_line_is_refused_not_written(key):
    with pytest.raises(InputError, match="one a line") as exc:
        held_out_text(["fine.txt", key])
    assert "\n" not in str(exc.value)


def test_two_names_that_give_one_key_are_refused_naming_it(tmp_path):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    if not _can_name(src, "x\ny.txt"):
        pytest.skip("the file system refuses a newline in a name")
    (src / "x\ny.txt").write_text("one")
    (src / "x\\x0ay.txt").write_text("two")  # the escape of the other, as a literal name
    with pytest.raises(InputError, match=r"'a/x\\\\x0ay.txt' is the key of two documents"):
        split_documents(text_documents(tmp_path / "src"), probe_fraction=0.5)


# -- 2. --domain-field values ------------------------------------------------------------------

BAD_DOMAINS = {
    "null": ({"src": None}, "it is null"),
    "missing": ({}, "it has no such field"),
    "an integer": ({"src": 3}, "it is 3 (a number)"),
    "a float": ({"src": 2.5}, "it is 2.5 (a number)"),
    "a boolean": ({"src": True}, "it is true (a boolean)"),
    "a list": ({"src": ["a"]}, 'it is ["a"] (a list)'),
    "an object": ({"src": {"k": 1}}, 'it is {"k": 1} (an object)'),
    "an empty string": ({"src": ""}, 'it is "" (empty)'),
}


@pytest.mark.parametrize("what", list(BAD_DOMAINS))
def test_a_record_without_a_string_domain_is_one_line_naming_the_line_and_value(what, tmp_path, capsys):
    extra, found = BAD_DOMAINS[what]
    path = tmp_path / "d.jsonl"
    rows = [{"text": "first document", "src": "web"}, {"text": "second document", **extra}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError) as exc:
        jsonl_documents(path, domain_field="src")
    msg = str(exc.value)
    assert "d.jsonl:2:" in msg and "'src'" in msg and found in msg and "\n" not in msg, msg
    code, err = run_cli(["probe", str(path), "--out", str(tmp_path / "s.zarr"), "--domain-field", "src"], capsys)
    line = cli_error_line(err)
    assert code == 1 and "d.jsonl:2:" in line and found in line and "internal error" not in line, line
    assert not (tmp_path / "s.zarr").exists()


def test_a_long_domain_value_is_shown_cut(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "t", "src": list(range(100))}) + "\n")
    with pytest.raises(InputError, match=r"it is \[0, 1, 2, .*\.\.\. \(a list\)") as exc:
        jsonl_documents(path, domain_field="src")
    assert len(str(exc.value)) < 250


def test_string_domains_and_no_domain_field_are_as_before(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "one", "src": "web"}) + "\n" + json.dumps({"text": "two", "src": " "}) + "\n"
                    + json.dumps({"text": "three"}) + "\n")  # fmt: skip
    assert [d.domain for d in jsonl_documents(path)] == ["default"] * 3
    path.write_text(json.dumps({"text": "one", "src": "web"}) + "\n" + json.dumps({"text": "two", "src": "a\ud800"}) + "\n")
    assert [d.domain for d in jsonl_documents(path, domain_field="src")] == ["web", "a\ufffd"]


# -- 3. a zero base weight ---------------------------------------------------------------------


def _rates(names, columns):
    x = np.linspace(0.0, 3.0, 31)
    return DomainRates(tuple(names), x, np.stack([np.full_like(x, c) if np.isscalar(c) else c for c in columns], axis=1))


def test_a_zero_base_weight_is_the_reason_given_not_falling_in_proportion():
    rates = _rates("ab", [1.0, 3.0])  # b falls three times as fast: a schedule of equal base would help
    e = MixtureSchedule(rates, MixtureConfig(total_steps=100), base=[1.0, 0.0]).enrichment()
    v = enrichment_verdict(e)
    assert "'b' has base weight 0" in v and "never feeds it" in v and "no mixture to reshape" in v, v
    assert "in proportion" not in v and "+0.0%" not in v
    e = MixtureSchedule(rates, MixtureConfig(total_steps=100), base=[0.0, 1.0]).enrichment()
    v = enrichment_verdict(e)
    assert "'a' has base weight 0" in v and "in proportion" not in v and "best possible" not in v, v


def test_with_three_domains_the_verdict_names_the_unfed_one_and_judges_the_others():
    rates = _rates("abc", [2.0, 2.0, 9.0])  # a and b fall alike; c (base 0) fastest, but never fed
    sched = MixtureSchedule(rates, MixtureConfig(total_steps=100, floor=0.3), base=[0.5, 0.5, 0.0])
    e = sched.enrichment()
    assert e["zero_base"] == ["c"] and e["n_fed"] == 2
    assert e["best"] == pytest.approx(1.0) and e["unbounded"] == pytest.approx(1.0)  # c cannot be fed: not reachable
    assert np.all(sched.table_[:, 2] == 0)
    v = enrichment_verdict(e)
    assert v.startswith("domain 'c' has base weight 0") and "over the other domains: enrichment 1.000" in v, v
    assert "in proportion" in v  # a and b do fall in proportion
    # without a zero weight, nothing is said about it
    v = enrichment_verdict(MixtureSchedule(rates, MixtureConfig(total_steps=100)).enrichment())
    assert "base weight 0" not in v and "baseline mixture" in v


@pytest.fixture(scope="module")
def pilot(tmp_path_factory) -> str:
    from test_curriculum_pilot_checks import planted_pilot

    rng = np.random.default_rng(5)
    return planted_pilot(tmp_path_factory.mktemp("pilot") / "p.zarr", rng.uniform(2.0, 3.0, 40), rng.uniform(3.0, 4.0, 40))


@pytest.mark.parametrize("base", [["1", "0"], ["0", "1"]])
def test_curriculum_schedule_with_a_zero_base_weight_says_so(base, pilot, tmp_path, capsys):
    from tokdyn.cli import main

    capsys.readouterr()
    argv = ["curriculum", "schedule", pilot, "--run", "pilot", "--steps", "1000", "--out", str(tmp_path / "m.json"), "--base", *base]
    assert main(argv) == 0
    out = capsys.readouterr().out
    zero = "ab"[base.index("0")]
    assert f"domain '{zero}' has base weight 0" in out and "in proportion" not in out and "+0.0%" not in out, out
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["enrichment"]["zero_base"] == [zero] and "base weight 0" in got["verdict"]


# -- 4. output folders -------------------------------------------------------------------------


def test_the_shared_check_names_the_missing_folder_or_the_file_in_the_way(tmp_path):
    with pytest.raises(InputError, match=r"cannot write the table to .*t.npz: folder .*nodir does not exist"):
        check_output_path(tmp_path / "nodir" / "t.npz", what="table")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="afile is a file, not a folder"):
        check_output_path(tmp_path / "afile" / "sub" / "t.npz", what="table")
    with pytest.raises(InputError, match="it is a folder"):
        check_output_path(tmp_path, what="table")
    assert check_output_path(tmp_path, what="store", folder_ok=True) == tmp_path
    with pytest.raises(InputError, match="afile: it is a file, not a folder"):
        check_output_path(tmp_path / "afile", what="store", folder_ok=True)
    assert check_output_path("t.npz", what="table") == Path("t.npz")  # the working folder
    with pytest.raises(InputError, match="folder .*nodir does not exist"):
        write_atomically(tmp_path / "nodir" / "f.txt", lambda fh: fh.write("x"), what="file")
    assert not (tmp_path / "nodir").exists()


def _writers(store: str, tmp_path: Path, texts: Path) -> dict:
    """Every command that writes a file or creates a store, with its output in a missing folder."""
    miss = tmp_path / "missing" / "deeper"
    return {
        "report": ["report", store, "--out", str(miss / "r.html")],
        "export-npz": ["export-npz", store, str(miss / "o.npz"), "--run", "pilot"],
        "curriculum build": ["curriculum", "build", store, "--run", "pilot", "--out", str(miss / "t.npz")],
        "curriculum schedule": ["curriculum", "schedule", store, "--run", "pilot", "--steps", "100", "--out", str(miss / "m.json")],
        "probe --out": ["probe", str(texts), "--out", str(miss / "s.zarr"), "--context", "4", "--sequences", "2"],
        "probe --held-out": ["probe", str(texts), "--out", str(tmp_path / "s.zarr"), "--context", "4", "--sequences", "2",
                             "--held-out", str(miss / "held.txt")],
        "record-offline --out": ["record-offline", "--checkpoints", str(texts), "--out", str(miss / "s.zarr"), "--run", "r",
                                 "--probe", store],
        "demo --out": ["demo", "--out", str(miss / "demo")],
    }  # fmt: skip


@pytest.mark.parametrize("command", ["report", "export-npz", "curriculum build", "curriculum schedule", "probe --out",
                                     "probe --held-out", "record-offline --out", "demo --out"])  # fmt: skip
def test_every_output_in_a_missing_folder_is_one_line_naming_it_and_nothing_is_created(command, pilot, tmp_path, capsys):
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(8):
        (texts / f"d{i}.txt").write_text(f"document {i} " * 20)
    code, err = run_cli(_writers(pilot, tmp_path, texts)[command], capsys)
    line = cli_error_line(err)
    assert code == 1 and "does not exist" in line and "missing" in line and "internal error" not in line, line
    assert not (tmp_path / "missing").exists() and not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("action", ["build", "schedule"])
def test_a_curriculum_output_folder_is_checked_before_the_pilot_is_read(action, tmp_path, capsys):
    """The store does not exist: the folder's error comes first, before any work."""
    out = tmp_path / "nowhere" / ("t.npz" if action == "build" else "m.json")
    argv = ["curriculum", action, str(tmp_path / "none.zarr"), "--run", "r", "--out", str(out)]
    code, err = run_cli(argv + (["--steps", "10"] if action == "schedule" else []), capsys)
    line = cli_error_line(err)
    assert code == 1 and f"folder {tmp_path / 'nowhere'} does not exist" in line, line


@pytest.mark.parametrize("runner", ["mixture", "token"])
def test_a_curriculum_experiment_creates_its_results_folder_but_not_the_one_above(runner, tmp_path):
    """Checked before the hours of work (the corpus is not even read)."""
    from tokdyn.curriculum.ab import run_mixture_ab
    from tokdyn.curriculum.experiment import run_ab

    run = run_mixture_ab if runner == "mixture" else run_ab
    with pytest.raises(InputError, match=r"results folder to .*: folder .*missing does not exist"):
        run(tmp_path / "missing" / "out")
    assert not (tmp_path / "missing").exists()


def test_a_learnability_table_is_not_saved_into_a_folder_it_would_create(pilot, tmp_path):
    from tokdyn.curriculum import build_table
    from tokdyn.curriculum.learnability import LearnabilityOptions

    table = build_table(pilot, "pilot", options=LearnabilityOptions(min_count=1, holdout=0))
    with pytest.raises(InputError, match="cannot write the learnability table to .*: folder .*new does not exist"):
        table.save(tmp_path / "new" / "t.npz")
    assert not (tmp_path / "new").exists()
    assert table.save(tmp_path / "t.npz").is_file()


# -- 5. frequency band labels ------------------------------------------------------------------


def _label_range(label: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(?:-(\d+))? occurrences?", label)
    assert m, label
    assert label.endswith("occurrence") == (label == "1 occurrence"), label  # never "1 occurrences"
    return int(m.group(1)), int(m.group(2) or m.group(1))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=hs.lists(hs.integers(1, 40) | hs.integers(1, 4), min_size=1, max_size=12), n_bands=hs.integers(1, 6))
@example(counts=[17, 18, 19, 20, 21, 22], n_bands=2)  # the hunt's "17-20", "20-22"
@example(counts=[1, 2], n_bands=6)  # quantile edges 1.33 and 1.67: a band that holds no integer count
def test_every_frequency_falls_in_exactly_one_band_label_and_its_own(counts, n_bands):
    """Token id ``i`` occurs ``counts[i]`` times: its band's label names that count, and no other
    label does; the labels partition the integers from the rarest count to the most frequent
    (so no label names an empty band)."""
    tid = np.repeat(np.arange(len(counts)), counts)
    band, labels = tokenstats.frequency_bands(tid, n_bands)
    ranges = [_label_range(lab) for lab in labels]
    freq = np.asarray(counts)[tid]
    for f, b in zip(freq.tolist(), band.tolist()):
        holding = [k for k, (lo, hi) in enumerate(ranges) if lo <= f <= hi]
        assert holding == [b], (f, b, labels)
    covered = sorted(v for lo, hi in ranges for v in range(lo, hi + 1))
    assert covered == list(range(min(counts), max(counts) + 1)), labels  # no gap, no overlap

