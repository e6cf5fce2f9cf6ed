"""Classes of hostile input (docs/reliability.md): each test stands for a class, not one case.

- the CLI is one boundary: whatever a command raises becomes one line and exit 1;
- every user-controlled string reaches HTML escaped and matplotlib literally;
- the report is written through an exclusive temporary file that never follows a link;
- a second fit of a run is refused while the first runs, and a killed fit creation is redone;
- `tokdyn info` exits non-zero when a run is damaged;
- a moved, swapped or stale chunk (loss, coordinates, fit) is an error naming it;
- after an error the CLI exits with its one line and no asyncio noise.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import tokdyn
from reliability_fixtures import cli_error_line, put_lock, raw, live_foreign_owner
from tokdyn.cli import main
from tokdyn.errors import RunBusyError

N = 60
STEPS = np.unique(np.round(np.geomspace(1, 1000, 14)).astype(int))


def fitted_store(path, *, domains=("code",), attrs=None, fit=True):
    """A small store: one T run of planted events (a probe whose tokens fall in ``domains``), fitted."""
    rng = np.random.default_rng(0)
    x = np.log10(STEPS)
    mu, s, d = rng.uniform(0.5, 2.5, N), rng.uniform(0.05, 0.2, N), rng.uniform(1, 3, N)
    Y = 1 + d[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / s[:, None])) + rng.normal(0, 0.05, (N, x.size))
    arrays = {"sample_id": np.arange(N, dtype=np.int32) // 10, "token_pos": (np.arange(N) % 10 + 1).astype(np.int32),
              "domain": (np.arange(N) % len(domains)).astype(np.int32)}  # fmt: skip
    st = tokdyn.open_store(path, tokdyn.ProbeSet(None, arrays, domains=domains), mode="w")
    with st.create_run("r", capacity=len(STEPS), attrs=attrs or {}).writer() as w:
        for j, step in enumerate(STEPS):
            w.append(Y[:, j].clip(0.01), step=int(step))
    if fit:
        tokdyn.fit_run(st.run("r"), progress=False)
    return st


# -- one boundary ----------------------------------------------------------------------------

UNEXPECTED = [KeyError("tokdyn"), ZeroDivisionError("division by zero"), TypeError("unsupported operand"),
              ValueError("could not broadcast\ninput array"), RuntimeError("codec failed"), AssertionError(),
              json.JSONDecodeError("Expecting value", "", 0), MemoryError(), OverflowError("int too large"),
              RecursionError("maximum recursion depth exceeded")]  # fmt: skip


@pytest.mark.parametrize("exc", UNEXPECTED, ids=lambda e: type(e).__name__)
def test_any_exception_a_command_raises_is_one_line(exc, monkeypatch, capsys, tmp_path):
    import tokdyn.cli.store as cli_store

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(cli_store, "open_cli_store", boom)
    assert main(["info", str(tmp_path)]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert line.startswith("tokdyn info: error: ")
    if not isinstance(exc, MemoryError):
        assert "internal error in tokdyn" in line and type(exc).__name__ in line
    monkeypatch.setenv("TOKDYN_DEBUG", "1")  # the traceback, for a developer
    with pytest.raises(type(exc)):
        main(["info", str(tmp_path)])


def test_bare_tokdyn_lists_the_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(c in out for c in ("demo", "fit", "report", "record-offline", "curriculum"))


# -- strings that reach the report ----------------------------------------------------------

MARKUP = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "$\\frac{1}{0$", "a & b </td></table>", "$$", "\\$x$"]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=hs.sampled_from(MARKUP) | hs.text(hs.sampled_from("<>&$\\'\"/{}^_ab"), min_size=1, max_size=12))
def test_user_strings_reach_the_report_escaped_and_literal(text, tmp_path_factory):
    """Domain names and run attributes are the user's strings: the report shows them, escaped in
    HTML and literal in matplotlib (a "$" is not mathtext)."""
    import html

    d = tmp_path_factory.mktemp("h")
    # Between markers, so that a string such as "<" is not taken for the page's own markup.
    tagged = f"zq{text}qz"
    st = fitted_store(d / "s.zarr", domains=(tagged, "plain"), attrs={"model_config": {"name": tagged}, "note": tagged})
    out = tokdyn.write_report(st, d / "report.html")
    page = out.read_text()
    assert "<script" not in page.lower()
    assert html.escape(tagged) in page  # shown, escaped
    assert not any(c in text for c in "<&") or tagged not in page  # never raw


def test_a_damaged_axis_attribute_is_refused_when_read(tmp_path, capsys):
    st = fitted_store(tmp_path / "s.zarr", fit=False)
    meta = dict(raw(st, "runs/r").attrs["tokdyn_run"])
    raw(st, "runs/r").attrs["tokdyn_run"] = {**meta, "axis": "<b>T</b>"}
    with pytest.raises(tokdyn.StoreError, match="axis"):
        tokdyn.open_store(tmp_path / "s.zarr").run("r")
    assert main(["info", str(tmp_path / "s.zarr")]) == 1  # a damaged run is an error, not exit 0
    captured = capsys.readouterr()
    assert "ERROR" in captured.out and cli_error_line(captured.err).startswith("tokdyn info: error: 1 run(s) cannot be read")


# -- the report's temporary file --------------------------------------------------------------


def test_the_report_never_writes_through_a_planted_link(tmp_path):
    st = fitted_store(tmp_path / "s.zarr")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in ("report.html.tmp", ".report.html.tmp"):  # the names a predictable scheme would use
        (tmp_path / name).symlink_to(victim)
    out = tokdyn.write_report(st, tmp_path / "report.html")
    assert victim.read_text() == "keep me"
    assert out.read_text().startswith("<!doctype html>") and not out.is_symlink()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".report.html.") and not p.is_symlink()]
    assert leftovers == []


# -- two fits of one run ------------------------------------------------------------------------


def test_a_second_fit_is_refused_while_the_first_holds_the_run(tmp_path):
    st = fitted_store(tmp_path / "s.zarr", fit=False)
    put_lock(st, "runs/r/commits/fit.lock", live_foreign_owner())  # another live process is fitting
    with pytest.raises(RunBusyError, match="the fit of run 'r' is being written by process"):
        tokdyn.fit_run(st.run("r"), progress=False)
    assert not st.run("r").fit.exists  # nothing was deleted or created under the other fit


def test_a_killed_fit_creation_is_redone_without_refit(tmp_path):
    st = fitted_store(tmp_path / "s.zarr", fit=False)
    raw(st, "runs/r").create_group("fit")  # a creation killed before its metadata was written
    put_lock(st, "runs/r/commits/fit.lock", {**live_foreign_owner(), "pid": 2**22 + 12345})  # by a process now gone
    res = tokdyn.fit_run(st.run("r"), progress=False)
    assert res.blocks_fitted == res.blocks and st.run("r").fit.complete


# -- npz members are checked before they are inflated ---------------------------------------


def _npz_claiming(path, shape, *, dtype="<f4"):
    """An npz whose loss_matrix header claims ``shape`` but whose data is a few bytes."""
    import zipfile

    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    buf.write(bytes(64))
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("loss_matrix.npy", buf.getvalue())
        for name, arr in {"axis_values": np.array([1.0, 2.0]), "axis_name": np.array(["T"])}.items():
            b = io.BytesIO()
            np.save(b, arr)
            zf.writestr(f"{name}.npy", b.getvalue())


def test_an_npz_header_claiming_more_than_memory_is_refused_before_allocating(tmp_path, capsys):
    _npz_claiming(tmp_path / "huge.npz", (10**6, 10**6))
    assert main(["import-npz", str(tmp_path / "huge.npz"), str(tmp_path / "s.zarr")]) == 1
    assert "more than this machine's memory" in cli_error_line(capsys.readouterr().err)
    assert not (tmp_path / "s.zarr").exists()


def test_a_member_that_would_inflate_is_checked_from_its_header(tmp_path):
    """A small file whose per-token member inflates to 200 MB but has the wrong length is refused
    without inflating it."""
    import tracemalloc

    n, k = 10, 3
    np.savez_compressed(tmp_path / "bomb.npz", loss_matrix=np.ones((n, k), np.float32), axis_values=np.arange(1.0, k + 1),
                        axis_name=np.array(["T"]), sample_id=np.zeros(50_000_000, np.int32))  # fmt: skip
    assert (tmp_path / "bomb.npz").stat().st_size < 2_000_000
    tracemalloc.start()
    with pytest.raises(tokdyn.InputError, match="sample_id.*declares shape"):
        tokdyn.interchange.read_npz(tmp_path / "bomb.npz")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20_000_000, peak


# -- special files among checkpoints ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "link to a device", "fifo in an HF folder", "fifo manifest"])
def test_special_files_among_checkpoints_are_refused_not_read(kind, tmp_path, capsys):
    """A FIFO blocked record-offline forever; a link to /dev/zero read without end. Every such
    file is refused with one line before anything opens it (the test has a timeout)."""
    folder = tmp_path / "ckpts"
    folder.mkdir()
    if kind == "fifo":
        os.mkfifo(folder / "step_100.pt")
    elif kind == "link to a device":
        (folder / "step_100.safetensors").symlink_to("/dev/zero")
    elif kind == "fifo in an HF folder":
        (folder / "checkpoint-100").mkdir()
        (folder / "checkpoint-100" / "config.json").write_text("{}")
        os.mkfifo(folder / "checkpoint-100" / "model.safetensors")
    else:
        os.mkfifo(folder / "manifest.json")
    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 50, (4, 9)))
    tokdyn.open_store(tmp_path / "probe.zarr", probe, mode="w")
    code = main(["record-offline", "--checkpoints", str(folder), "--out", str(tmp_path / "o.zarr"), "--run", "r",
                 "--probe", str(tmp_path / "probe.zarr"), "--no-progress"])  # fmt: skip
    assert code == 1
    line = cli_error_line(capsys.readouterr().err)
    assert "not a regular file" in line, line
    assert not (tmp_path / "o.zarr").exists()


# -- integrity bound to position ---------------------------------------------------------------


def two_run_store(path, *, fit=True):
    """Two runs ``a`` and ``b`` of 3 token chunks (and 3 fit blocks) each, different values."""
    rng = np.random.default_rng(1)
    arrays = {"sample_id": np.arange(N, dtype=np.int32) // 10, "token_pos": (np.arange(N) % 10 + 1).astype(np.int32)}
    st = tokdyn.open_store(path, tokdyn.ProbeSet(None, arrays), mode="w")
    x = np.log10(STEPS)
    for name in ("a", "b"):
        mu = rng.uniform(0.5, 2.5, N)
        Y = 1 + 2 / (1 + np.exp((x[None, :] - mu[:, None]) / 0.1)) + rng.normal(0, 0.05, (N, x.size))
        with st.create_run(name, capacity=len(STEPS), token_chunk=20).writer() as w:
            for j, step in enumerate(STEPS):
                w.append(Y[:, j], step=int(step), axis_value=float(step) * (1 if name == "a" else 1.5), lr=1e-3 / (j + 1))
        if fit:
            tokdyn.fit_run(st.run(name), progress=False)
    return st


def _copy(root, src, dst):
    (root / dst).write_bytes((root / src).read_bytes())


def _swap(root, one, other):
    a, b = (root / one).read_bytes(), (root / other).read_bytes()
    (root / one).write_bytes(b)
    (root / other).write_bytes(a)


MOVES = {  # name: (what is done to the files, the command that reads them, the message)
    "loss chunk copied over another row": (lambda r: _copy(r, "runs/a/loss/c/3/1", "runs/a/loss/c/5/1"), "export", "row 5, token chunk 1"),
    "loss chunks swapped within a row": (lambda r: _swap(r, "runs/a/loss/c/4/0", "runs/a/loss/c/4/2"), "export", "row 4, token chunk 0"),
    "loss chunk from another run": (lambda r: _copy(r, "runs/b/loss/c/2/1", "runs/a/loss/c/2/1"), "export", "row 2, token chunk 1"),
    "coordinate chunk from another run": (lambda r: _copy(r, "runs/b/axis_value/c/0", "runs/a/axis_value/c/0"), "export", "row 0"),
    "commit record from another run": (lambda r: _copy(r, "runs/b/commits/w0/zarr.json", "runs/a/commits/w0/zarr.json"), "export", "run 'a'"),
    "fit chunk copied over another block": (lambda r: _copy(r, "runs/a/fit/mu/c/0", "runs/a/fit/mu/c/2"), "spectrum", "chunk 2 of fit/mu"),
    "fit chunks swapped between fields": (lambda r: _swap(r, "runs/a/fit/mu/c/1", "runs/a/fit/mu_se/c/1"), "spectrum", "chunk 1 of fit/mu"),
    "fit chunk from another run": (lambda r: _copy(r, "runs/b/fit/mu/c/1", "runs/a/fit/mu/c/1"), "spectrum", "chunk 1 of fit/mu"),
    "fit checksums moved with their block": (lambda r: (_copy(r, "runs/a/fit/mu/c/0", "runs/a/fit/mu/c/1"), _copy(r, "runs/a/fit/crc/c/0/0", "runs/a/fit/crc/c/1/0")),
                                             "spectrum", "chunk 1 of fit/"),
}  # fmt: skip


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    return two_run_store(tmp_path_factory.mktemp("moves") / "s.zarr").url


@pytest.mark.parametrize("move", list(MOVES))
def test_a_moved_or_swapped_chunk_is_an_error_naming_it(move, two_runs, tmp_path, capsys):
    """Each chunk's checksum is bound to its run, array and chunk coordinates (the codec's CRC
    covers only the bytes): a chunk copied or swapped within an array, between arrays or between
    runs, was an export with the wrong row's values and exit 0."""
    import shutil

    root = tmp_path / "s.zarr"
    shutil.copytree(two_runs, root)
    damage, command, where = MOVES[move]
    damage(root)
    if command == "export":
        argv = ["export-npz", str(root), str(tmp_path / "out.npz"), "--run", "a"]
    else:
        argv = ["spectrum", str(root), "--run", "a", "--json"]
    assert main(argv) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert where in line and ("moved" in line or "damaged" in line), line
    assert not (tmp_path / "out.npz").exists()


def test_the_same_store_reads_back_equal_and_unmoved_chunks_pass(two_runs, tmp_path, capsys):
    st = tokdyn.open_store(two_runs, mode="r")
    a = st.run("a")
    assert a.losses().shape == (len(STEPS), N) and a.fit.read()["mu"].shape == (N,)
    np.testing.assert_array_equal(a.losses(tokens=slice(5, 47, 3)), a.losses()[:, 5:47:3])
    np.testing.assert_array_equal(a.losses_at([1, 4], [0, 21, 59]), a.losses()[np.ix_([1, 4], [0, 21, 59])])
    np.testing.assert_array_equal(a.to_dask(token_block=7).compute(), a.losses())
    np.testing.assert_array_equal(a.to_xarray()["lr"].values, a.coord("lr"))
    assert main(["export-npz", two_runs, str(tmp_path / "out.npz"), "--run", "a"]) == 0


def test_runs_and_fits_made_before_position_checksums_stay_readable(tmp_path):
    """A run without an integrity id (an earlier tokdyn) is read without the position check, and
    a resumed writer goes on without checksums; a fit without a fit id likewise."""
    st = two_run_store(tmp_path / "s.zarr")
    g = raw(st, "runs/a")
    meta = dict(g.attrs["tokdyn_run"])
    del meta["integrity"]
    g.attrs["tokdyn_run"] = meta
    for key in ("crc", "coord_crc"):
        del raw(st, "runs/a/commits/w0").attrs[key]
    fmeta = dict(raw(st, "runs/a/fit").attrs["tokdyn_fit"])
    del fmeta["fit_id"]
    raw(st, "runs/a/fit").attrs["tokdyn_fit"] = fmeta
    st = tokdyn.open_store(tmp_path / "s.zarr", mode="r+")
    run = st.run("a")
    assert run.losses().shape == (len(STEPS), N) and run.fit.read()["mu"].shape == (N,)
    with run.writer(resume=True) as w:
        w.append(np.ones(N), step=5000)
    assert st.run("a").n_committed == len(STEPS) + 1


# -- a quiet exit after an error ------------------------------------------------------------------


def test_the_cli_exits_quietly_after_a_damaged_chunk(tmp_path):
    """One damaged chunk among many read at once: zarr's other reads were still in flight when the
    process exited, and asyncio printed thousands of lines ("Task was destroyed but it is
    pending!") after the error line. stderr must be that one line, every time."""
    import subprocess
    import sys
    from pathlib import Path

    n = 2000
    arrays = {"sample_id": np.arange(n, dtype=np.int32) // 10, "token_pos": (np.arange(n) % 10 + 1).astype(np.int32)}
    st = tokdyn.open_store(tmp_path / "s.zarr", tokdyn.ProbeSet(None, arrays), mode="w")
    with st.create_run("r", capacity=8, token_chunk=10).writer() as w:  # 200 chunks a row
        for step in range(1, 9):
            w.append(np.random.default_rng(step).random(n), step=step)
    chunk = tmp_path / "s.zarr" / "runs" / "r" / "loss" / "c" / "3" / "7"
    chunk.write_bytes(chunk.read_bytes()[:5])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("TOKDYN_DEBUG", None)
    for _ in range(4):
        p = subprocess.run([sys.executable, "-m", "tokdyn.cli", "export-npz", str(tmp_path / "s.zarr"), str(tmp_path / "o.npz")],
                           capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert p.returncode == 1
        assert cli_error_line(p.stderr).startswith("tokdyn export-npz: error: run 'r'"), p.stderr[:2000]


def test_probe_text_reaches_the_token_viewer_inert(tmp_path):
    """The probe's own text is a user's string too: in the token viewer it is JSON inside a
    <script>, where "</script>", "<!--" and U+2028 must not end or change the script."""
    import re

    from test_report_browser import Words, fitted_store

    tokens = (np.arange(4 * 20) % len(Words.vocab)).astype(np.int32).reshape(4, 20)
    st = fitted_store(tmp_path / "s.zarr", tokens, Words().spec())
    page = tokdyn.write_report(st, tmp_path / "report.html", tokenizer=Words()).read_text()
    assert len(re.findall(r"<script\b", page, flags=re.I)) == 2  # the viewer's data and its code, no other
    data = re.search(r"<script type=application/json id=tv-data>(.*?)</script>", page, flags=re.S).group(1)
    assert not {"<", ">", "&", "\u2028", "\u2029"} & set(data)
    text = [tok[0] for seq in json.loads(data)["seqs"] for tok in seq]
    assert {tokdyn.report._viewer_text(v) for v in Words.vocab} <= set(text)  # every token's text, "</script><script>..." too, comes back whole
    rest = page.replace(data, "")
    assert "<script>document" not in rest and "<!--" not in rest  # elsewhere only escaped


@pytest.mark.parametrize("rows", [10**20, "3", 2.5, True, None])
def test_a_commit_record_s_damaged_row_count_is_one_line_quickly(rows, tmp_path, capsys):
    """A commit record counting 10**20 rows made `tokdyn info` build sets of every row number
    (22 GB, then the kernel's OOM kill); "3" and 2.5 were read as counts of 3 and 2."""
    st = two_run_store(tmp_path / "s.zarr")
    raw(st, "runs/a/commits/w0").attrs["rows"] = rows
    assert main(["export-npz", str(tmp_path / "s.zarr"), str(tmp_path / "out.npz"), "--run", "a"]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert "run 'a'" in line and "commit record" in line, line
    assert main(["info", str(tmp_path / "s.zarr")]) == 1
