"""Property-based corruption of a small store: any one file of it (metadata JSON, loss and
coordinate chunks, commit records, probe arrays, fit results) truncated, garbled, deleted, or
swapped with another file of the same kind. Every command that reads the store then either gives
the answer it gave on the intact store or exits 1 with one line on stderr: never a traceback,
never a wrong answer with exit 0 (docs/reliability.md)."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import tokdyn
from tokdyn.cli import main

N, CONTEXT = 20, 10
STEPS = [1, 3, 10, 30, 100, 300, 1000]
FIT = ["--no-two-step", "--backend", "numpy", "--scheduler", "sync", "--no-progress"]


def small_store(path: Path) -> Path:
    """One T run of 7 rows x 20 tokens in two token chunks, fitted (two blocks)."""
    rng = np.random.default_rng(3)
    arrays = {"sample_id": np.arange(N, dtype=np.int32) // CONTEXT, "token_pos": (np.arange(N) % CONTEXT + 1).astype(np.int32)}
    st = tokdyn.open_store(path, tokdyn.ProbeSet(None, arrays), mode="w")
    x, mu = np.log10(STEPS), rng.uniform(0.3, 2.7, N)
    with st.create_run("r", capacity=len(STEPS), token_chunk=CONTEXT).writer() as w:
        for j, step in enumerate(STEPS):
            y = 1 + 2 / (1 + np.exp((x[j] - mu) / 0.15)) + rng.normal(0, 0.02, N)
            w.append(y, step=step, lr=1e-3 / (j + 1), tokens_seen=1000 * step)
    assert main(["fit", str(path), *FIT]) == 0
    return path


def run_command(argv: list[str]) -> tuple[int, str, list[str]]:
    """(exit code, stdout, stderr lines) of one command run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(argv)
    noise = [f"{w.category.__name__}: {w.message}" for w in caught]
    return code, out.getvalue(), [ln for ln in err.getvalue().splitlines() if ln.strip()] + noise


def answers(root: Path, tmp: Path, *, report: bool = False) -> dict[str, tuple]:
    """What each reading command says of the store at ``root``: (exit code, its answer, stderr)."""
    out = {}
    code, text, err = run_command(["info", str(root)])
    out["info"] = (code, [ln for ln in text.splitlines() if not ln.startswith(("store ", "schema "))], err)  # path, size
    npz = tmp / "out.npz"
    code, _, err = run_command(["export-npz", str(root), str(npz), "--run", "r"])
    out["export-npz"] = (code, dict(np.load(npz)) if code == 0 else None, err)
    code, text, err = run_command(["fit", str(root), *FIT])
    # the first line tells blocks done and seconds, and a block whose done flag was damaged is
    # fitted again and said ("fitted again: ..."); then the classes found
    lines = [ln for ln in text.splitlines() if not ln.startswith("  fitted again: ")]
    out["fit"] = (code, [re.sub(r"\d+ blocks? fitted.*", "", lines[0]), *lines[1:]] if code == 0 and lines else text, err)
    if report:
        code, _, err = run_command(["report", str(root), "--out", str(tmp / "report.html")])
        out["report"] = (code, None, err)
    return out


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f") for k in a)
    return a == b


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corrupt")
    root = small_store(tmp / "s.zarr")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    ref_dir = tmp / "ref"
    shutil.copytree(root, ref_dir / "s.zarr")
    ref = answers(ref_dir / "s.zarr", ref_dir, report=True)
    assert all(code == 0 and not err for code, _, err in ref.values()), ref
    return root, files, ref


def kind(name: str) -> str:
    """Files of one kind can be swapped: metadata with metadata, chunks of an array's kind with each other."""
    return "metadata" if name.endswith("zarr.json") else "chunk"


DAMAGE = hs.sampled_from(["truncate", "garble", "delete", "swap", "nest", "fifo"])
NESTED = b"[" * 100_000 + b"]" * 100_000  # valid JSON past the parser's recursion limit: it raised RecursionError


def damage(root: Path, files: list[str], data) -> str:
    """Apply one drawn damage to one drawn file of the store at ``root``; returns what was done."""
    name = data.draw(hs.sampled_from(files), label="file")
    path, how = root / name, data.draw(DAMAGE, label="damage")
    blob = path.read_bytes()
    if how == "truncate":
        cut = data.draw(hs.integers(0, max(0, len(blob) - 1)), label="keep bytes")
        path.write_bytes(blob[:cut])
        return f"{name}: truncated to {cut} of {len(blob)} bytes"
    if how == "garble":
        flips = data.draw(hs.lists(hs.tuples(hs.integers(0, len(blob) - 1), hs.integers(1, 255)), min_size=1, max_size=4), label="flips")
        garbled = bytearray(blob)
        for i, x in flips:
            garbled[i] ^= x
        path.write_bytes(bytes(garbled))
        return f"{name}: bytes {flips} garbled"
    if how == "fifo":  # a read would block forever: the store's reads take regular files only
        path.unlink()
        os.mkfifo(path)
        return f"{name}: replaced by a FIFO"
    if how == "nest":
        path.write_bytes(NESTED)
        return f"{name}: replaced by JSON nested 100,000 deep"
    if how == "delete":
        path.unlink()
        return f"{name}: deleted"
    others = [f for f in files if f != name and kind(f) == kind(name)]
    other = data.draw(hs.sampled_from(others), label="swap with")
    path.write_bytes((root / other).read_bytes())
    (root / other).write_bytes(blob)
    return f"{name}: swapped with {other}"


def check_one_damage(pristine, data, *, report: bool = False) -> None:
    root0, files, ref = pristine
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = tmp / "s.zarr"
        shutil.copytree(root0, root)
        what = damage(root, files, data)
        got = answers(root, tmp, report=report)
    for command, (code, answer, err) in got.items():
        where = f"{command} after {what}"
        if code == 0:
            assert not err, f"{where}: exit 0 with stderr {err}"
            if command != "report":
                assert same(answer, ref[command][1]), f"{where}: exit 0 with another answer: {answer!r}"
        else:
            assert code == 1, f"{where}: exit {code}"
            assert len(err) == 1 and err[0].startswith(f"tokdyn {command}: error: "), f"{where}: stderr {err}"


def test_metadata_nested_too_deeply_to_parse_is_one_line_at_every_node(pristine, tmp_path):
    """Every zarr.json of the store, in turn, replaced by JSON nested past Python's parser's
    recursion limit: zarr's parse raised RecursionError, which the CLI reported as an internal
    error (a bug), not as the damaged store it is."""
    root0, files, ref = pristine
    # The parse runs at Python's recursion limit: garbage that earlier tests left and the
    # collector finalizes there fails in its finalizer, and Python prints "Exception ignored in
    # sys.unraisablehook ... RecursionError" beside the command's line (CI, 1 run in 2 on this
    # test's order; not seen in a command's own fresh process). Collected first, and not collected
    # during the commands, so the lines checked are the commands' own.
    gc.collect()
    gc.disable()
    try:
        said = _nested_at_every_node(root0, files, ref, tmp_path)
    finally:
        gc.enable()
    assert said, "no command named the nesting"


def _nested_at_every_node(root0, files, ref, tmp_path) -> int:
    said = 0
    for name in [f for f in files if f.endswith("zarr.json")]:
        root = tmp_path / name.replace("/", "_")
        shutil.copytree(root0, root)
        (root / name).write_bytes(NESTED)
        out = tmp_path / (root.name + "_out")
        out.mkdir()
        for command, (code, answer, err) in answers(root, out).items():
            where = f"{command} with {name} nested too deeply"
            assert code in (0, 1), f"{where}: exit {code}"
            if code == 1:
                assert len(err) == 1 and "internal error" not in err[0] and err[0].startswith(f"tokdyn {command}: error: "), f"{where}: {err}"
                assert "recursion depth" not in err[0] and "RecursionError" not in err[0], f"{where}: Python's words, not the store's: {err}"
                said += "nested too deeply" in err[0]
            else:
                assert not err and (command == "fit" or same(answer, ref[command][1])), f"{where}: {answer!r} {err}"
    return said


def test_a_fifo_or_a_device_in_place_of_any_kind_of_file_is_one_line(pristine, tmp_path):
    """One file of each array and group of the store (its zarr.json, its first chunk) in turn
    replaced by a FIFO or by a link to /dev/zero: a read of either blocked forever or never
    ended (every command hung, or ran out of memory); now each command gives its answer (the
    file was not needed) or one line naming the file."""
    root0, files, ref = pristine
    firsts = {}
    for f in files:
        firsts.setdefault((str(Path(f).parent).split("/c/")[0], f.endswith("zarr.json")), f)
    named = 0
    for i, name in enumerate(sorted(firsts.values())):
        for kind in [("FIFO", "device")[i % 2]]:  # in turn: each kind meets metadata and chunks, in half the time
            root = tmp_path / f"{i}{kind}" / "s.zarr"
            shutil.copytree(root0, root)
            (root / name).unlink()
            os.mkfifo(root / name) if kind == "FIFO" else (root / name).symlink_to("/dev/zero")
            for command, (code, answer, err) in answers(root, root.parent).items():
                where = f"{command} with {name} a {kind}"
                if code == 0:
                    assert not err and (command == "fit" or same(answer, ref[command][1])), f"{where}: {answer!r} {err}"
                else:
                    assert code == 1 and len(err) == 1 and err[0].startswith(f"tokdyn {command}: error: "), f"{where}: {err}"
                    assert "internal error" not in err[0], f"{where}: {err}"
                    named += f"is a {kind}" in err[0]
    assert named  # said as what it is where the read meets it (a fit's check of its arrays says "damaged")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=hs.data())
def test_any_one_damaged_file_gives_the_right_answer_or_one_line(pristine, data):
    """300 examples in the default run, about 0.25 CPU-seconds each (three commands, a refit
    when the fit's metadata is hit); the slow variant below runs more, with the report."""
    check_one_damage(pristine, data)


@pytest.mark.slow  # ~10 min on 2 cores: 400 more examples, and the report
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=hs.data())
def test_any_one_damaged_file_heavier_with_the_report(pristine, data):
    check_one_damage(pristine, data, report=True)
