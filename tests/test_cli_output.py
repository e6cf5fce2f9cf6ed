"""The CLI's output classes: ``--json`` is strict JSON (no NaN or Infinity) on every command that
has it, a warning is one line, and a reader that leaves a pipe early gets no error line."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import tokdyn
from test_hostile import STEPS, fitted_store
from tokdyn.cli import main
from tokdyn._files import strict_json as _strict
from tokdyn.cli._common import print_json

ROOT = Path(__file__).resolve().parents[1]


def _strict_load(text: str):
    def no_constants(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


scalars = hs.one_of(hs.floats(allow_nan=True, allow_infinity=True), hs.integers(-10**6, 10**6),
                    hs.text(max_size=5), hs.none(), hs.booleans())  # fmt: skip
trees = hs.recursive(scalars, lambda kids: hs.one_of(hs.lists(kids, max_size=4),
                                                      hs.dictionaries(hs.text(max_size=4), kids, max_size=4)),
                     max_leaves=20)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(tree=trees)
def test_print_json_is_strict_json_with_non_finite_numbers_as_null(tree):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_json(tree)
    got = _strict_load(out.getvalue())

    def expect(v):
        if isinstance(v, dict):
            return {k: expect(x) for k, x in v.items()}
        if isinstance(v, list):
            return [expect(x) for x in v]
        return None if isinstance(v, float) and not math.isfinite(v) else v

    assert got == expect(tree)


def test_numpy_values_are_plain_json():
    got = _strict(dict(a=np.float32("nan"), b=np.arange(3), c=np.array([1.5, np.inf]), d=np.int64(7)))
    assert got == {"a": None, "b": [0, 1, 2], "c": [1.5, None], "d": 7}


def _nan_store(path):
    """A run whose every loss is NaN: fitted, it has no event, and its summaries are NaN."""
    probe = tokdyn.ProbeSet(None, {"sample_id": np.zeros(4, np.int32), "token_pos": np.arange(1, 5, dtype=np.int32)})
    st = tokdyn.open_store(path, probe, mode="w")
    with st.create_run("r", capacity=len(STEPS)).writer() as w:
        for step in STEPS:
            w.append(np.full(4, np.nan, np.float32), step=int(step), warn_nonfinite=False)
    return st


@pytest.mark.parametrize("argv", [["fit", "--refit", "--json", "--no-progress"], ["info", "--json"]])
def test_json_of_a_run_without_events_parses_strictly(argv, tmp_path, capsys):
    path = str(tmp_path / "s.zarr")
    _nan_store(path)
    main([argv[0], path, *argv[1:]])
    _strict_load(capsys.readouterr().out)


@pytest.mark.parametrize("argv", [["spectrum", "--boot", "5", "--json"], ["reconstruct", "--boot", "5", "--json"]])
def test_json_of_analyses_parses_strictly(argv, tmp_path, capsys):
    path = str(tmp_path / "s.zarr")
    fitted_store(path)
    assert main([argv[0], path, *argv[1:]]) == 0
    _strict_load(capsys.readouterr().out)


def test_a_warning_is_one_line_and_numeric_noise_is_left_out(tmp_path, capsys, monkeypatch):
    import tokdyn.cli.store as cli_store

    def noisy(args):
        np.nanmax(np.full(3, np.nan))  # numpy: "All-NaN slice encountered"
        np.log(np.zeros(1))  # numpy: "divide by zero encountered in log"
        warnings.warn("step 5: 3 non-finite\nlosses stored as NaN", RuntimeWarning)  # tokdyn's own, as the writer's
        warnings.warn("a checkpoint file is a duplicate")
        return 0

    monkeypatch.setattr(cli_store, "_info", noisy)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        assert main(["info", str(tmp_path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tokdyn info: warning: step 5: 3 non-finite losses stored as NaN",
                   "tokdyn info: warning: a checkpoint file is a duplicate"]
    assert warnings.showwarning is not None  # restored after the command


def test_a_reader_that_leaves_the_pipe_gets_no_error_line(tmp_path):
    path = str(tmp_path / "s.zarr")
    fitted_store(path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # `| head -1` as a pipe closed after the first line; the spectrum prints ~25 lines
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-m", "tokdyn", "spectrum", path], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)  # fmt: skip
        p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read().decode()
        rc = p.wait(timeout=120)
        assert "error" not in err and "Traceback" not in err, err
        assert rc in (0, 141)


def test_a_closed_stdout_is_one_error_line_before_any_work(tmp_path):
    # started with fd 1 closed (`tokdyn info s.zarr >&-`), Python sets sys.stdout to None and
    # drops every print: the command exited 0 having shown nothing
    path = str(tmp_path / "s.zarr")
    fitted_store(path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["info", path], ["spectrum", path, "--json"], ["fit", path, "--json"], ["curriculum", "show", path]):
        p = subprocess.run([sys.executable, "-m", "tokdyn", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=env, timeout=120, preexec_fn=lambda: os.close(1))  # fmt: skip
        err = p.stderr.decode().strip().splitlines()
        assert p.returncode == 1
        assert err == [f"tokdyn {args[0]}: error: standard output is closed, so what the command prints "
                       "would be lost; send it to a file or to /dev/null"]


def test_a_closed_stdout_does_not_stop_a_command_whose_product_is_a_file(tmp_path):
    # the check above first refused every command: `tokdyn export-npz s.zarr out.npz >&-` (its
    # product a file, its printed line a note) wrote nothing; found by the review
    path = str(tmp_path / "s.zarr")
    fitted_store(path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "out.npz"
    p = subprocess.run([sys.executable, "-m", "tokdyn", "export-npz", path, str(out)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, env=env, timeout=120, preexec_fn=lambda: os.close(1))  # fmt: skip
    assert p.returncode == 0, p.stderr.decode()
    assert p.stderr.decode().strip() == "" and out.stat().st_size > 0


def _commands(parser, prefix=()):
    """Every (sub)command path of the CLI and its parser."""
    subs = [a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, p in subs[0].choices.items():
        yield from _commands(p, (*prefix, name))


def test_an_unknown_option_shows_the_usage_of_the_command_given(capsys):
    # `tokdyn fit demo --bogus` printed `usage: tokdyn [-h] [--version] COMMAND ...`
    from tokdyn.cli import build_parser

    paths = [path for path, _ in _commands(build_parser())]
    assert ("fit",) in paths and ("curriculum", "schedule") in paths
    for path in paths:
        with pytest.raises(SystemExit) as ex:
            main([*path, "--no-such-option-xyz"])
        assert ex.value.code == 2
        err = capsys.readouterr().err
        name = " ".join(("tokdyn", *path))
        assert err.startswith(f"usage: {name} "), (path, err[:200])
        assert err.rstrip().splitlines()[-1].startswith(f"{name}: error: "), (path, err)
    # an unknown option before the command is tokdyn's own, or the action's parent's
    for argv, name in ((["--bogus", "info", "s"], "tokdyn"), (["curriculum", "--bogus", "show", "t"], "tokdyn curriculum")):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert err.startswith(f"usage: {name} ") and err.rstrip().endswith(f"{name}: error: unrecognized arguments: --bogus"), err


def test_a_read_only_or_forbidden_path_is_named_by_its_folder_not_a_temporary_name():
    # `tokdyn fit` on a read-only store said "[Errno 30] Read-only file system:
    # '.../commits/fit.<hex>.partial'" (noticed by the fit-job hunt)
    import errno

    from tokdyn.cli import error_line

    line = error_line(OSError(errno.EROFS, "Read-only file system", "/d/s.zarr/runs/r/commits/fit.3fa9.partial"))
    assert line == "read-only file system: /d/s.zarr/runs/r/commits (the command writes there; work on a copy in a writable place)"
    assert error_line(PermissionError(errno.EACCES, "Permission denied", "/d/out.html")).startswith("permission denied: /d/out.html (")
    assert error_line(OSError(errno.ENOSPC, "No space left on device")) == "[Errno 28] No space left on device"  # as worded
