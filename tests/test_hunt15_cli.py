"""Hunt 15, the command line's consistency across commands:

- an empty path (``--out ""``, an unset ``"$VAR"``) is one line naming its argument, on every
  command, before any work: the library read ``""`` as ``.`` ("output must end in .npz, got .",
  "npz file not found: .", "report path . is a folder"), record-offline spoke of a store for an
  empty --checkpoints, and ``report --tokenizer ""`` went on without a tokenizer, exit 0;
- a store path that is a file is "no tokdyn store at ..." on `tokdyn fit` too (which opens it for
  writing), as on every other command, not "[Errno 17] File exists: 'afile'";
- a path in the way of a folder (a file where a folder is needed) is said with the path and what
  it means, not as Python's "[Errno 20] Not a directory: '...'";
- every option with a default says it in its --help.
"""

from __future__ import annotations

import argparse
import errno
import re

import pytest

from reliability_fixtures import cli_error_line
from tokdyn.cli import build_parser, error_line, main


def _store(tmp_path):
    from test_hostile import fitted_store

    fitted_store(tmp_path / "s.zarr", fit=False)
    return str(tmp_path / "s.zarr")


EMPTY = [  # argv with "" for a path, and the argument the error line must name
    (["info", ""], "store"),
    (["export-npz", "{s}", ""], "output"),
    (["import-npz", "", "{t}/new.zarr"], "input"),
    (["import-npz", "{t}/x.npz", ""], "store"),
    (["report", "{s}", "--out", ""], "--out"),
    (["report", "{s}", "--out", "{t}/r.html", "--tokenizer", ""], "--tokenizer"),
    (["curriculum", "show", ""], "table"),
    (["curriculum", "build", "{s}", "--run", "r", "--out", ""], "--out"),
    (["record-offline", "--checkpoints", "", "--out", "{t}/new.zarr", "--run", "a"], "--checkpoints"),
    (["record-offline", "--checkpoints", "{t}", "--out", "", "--run", "a"], "--out"),
    (["fit", "", "--no-progress"], "store"),
]


@pytest.mark.parametrize("argv,name", EMPTY, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_an_empty_path_is_one_line_naming_its_argument(tmp_path, capsys, argv, name):
    s = _store(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [a.format(s=s, t=tmp_path) for a in argv]
    assert main(argv) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert line == f"tokdyn {argv[0]}: error: {name} is an empty path; give the name of a file, folder or store", line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written (no report.html, no store)


def test_fit_on_a_file_is_no_store_as_on_every_command(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("")
    lines = {}
    for cmd in (["fit", str(f), "--no-progress"], ["info", str(f)], ["spectrum", str(f)], ["export-npz", str(f), str(tmp_path / "o.npz")]):
        assert main(cmd) == 1
        lines[cmd[0]] = cli_error_line(capsys.readouterr().err).split(": error: ", 1)[1]
    assert set(lines.values()) == {f"no tokdyn store at {f} ({f} is a regular file, not a store's folder)"}, lines
    assert f.is_file() and f.read_text() == ""


@pytest.mark.parametrize("code", [errno.ENOTDIR, errno.EEXIST])
def test_a_path_in_the_way_is_said_without_pythons_errno(code):
    line = error_line(OSError(code, __import__("os").strerror(code), "d/f/x.zarr"))
    assert "[Errno" not in line and "'d/f/x.zarr'" not in line and "d/f/x.zarr (" in line, line


def test_import_into_a_path_under_a_file_names_the_path(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["export-npz", _store(tmp_path), str(tmp_path / "n.npz")]) == 0
    capsys.readouterr()
    assert main(["import-npz", str(tmp_path / "n.npz"), str(tmp_path / "f" / "s.zarr")]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert "[Errno" not in line and str(tmp_path / "f" / "s.zarr") in line, line


def _actions(parser, path=()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, path + (name,))
        else:
            yield path, a


def test_every_option_with_a_default_says_it_in_its_help():
    missing = [f"{' '.join(path)} {a.option_strings}" for path, a in _actions(build_parser())
               if a.default is not None and a.default is not False and a.default != argparse.SUPPRESS
               and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
               and "default" not in (a.help or "")]  # fmt: skip
    assert not missing, missing


def test_the_default_a_help_shows_is_the_real_one():
    for path, a in _actions(build_parser()):
        m = re.search(r"\(default:? ([-\w.]+)[;)]", a.help or "")
        if m and isinstance(a.default, (int, float, str)) and not isinstance(a.default, bool):
            shown = m.group(1)
            real = a.default if isinstance(a.default, str) else type(a.default)(shown)
            assert str(real) == str(a.default), (path, a.option_strings, shown, a.default)


@pytest.mark.parametrize("mode", ["r", "r+"])
def test_a_store_path_that_is_a_file_is_no_store_to_the_library_too(tmp_path, mode):
    """`open_store(afile, mode="r+")` raised "[Errno 17] File exists" (zarr making the store's
    folder); every caller, not only the command line, gets the store's own error."""
    import tokdyn
    from tokdyn.errors import NotAStoreError

    f = tmp_path / "afile"
    f.write_text("x")
    for path in (f, f / "below.zarr"):
        with pytest.raises(NotAStoreError, match="no tokdyn store at"):
            tokdyn.open_store(path, mode=mode)
