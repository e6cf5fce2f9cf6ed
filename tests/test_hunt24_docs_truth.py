"""The docs as a researcher follows them (hunt 24): every option a page gives a command exists
on it, every option a command has is in the docs, what the README lists is there, and a
pipeline's command does what the page says with the options it is given."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import re
import sys
from pathlib import Path

import pytest

from pipeline_scripts import load
from tokdyn.cli import build_parser

# -- pipelines/curriculum_ab.py --v1 takes only the first design's options --------------------


def _options_and_values(help_text: str) -> dict[str, list[str]]:
    """Every ``--option`` of a usage text, with a value it accepts (its first choice, or ``1``;
    none for a flag)."""
    usage = help_text.split("\n\n")[0]
    found = {}
    for name, metavar in re.findall(r"\[(--[a-z0-9-]+)(?: ([^\]\s]+))?", usage):
        found[name] = [] if not metavar else [metavar.strip("{}").split(",")[0] if metavar.startswith("{") else "1"]
    return found


def _run_ab_main(monkeypatch, capsys, argv: list[str]):
    """``curriculum_ab.py ARGV`` in this process, with the two designs' runners replaced by
    ones that record their config: (exit code, config given to a runner or None, stdout, stderr)."""
    import tokdyn.curriculum.ab as ab
    import tokdyn.curriculum.experiment as experiment

    given = []

    def runner(out, cfg):
        given.append(cfg)
        raise SystemExit(99)

    monkeypatch.setattr(experiment, "run_ab", runner)
    monkeypatch.setattr(ab, "run_mixture_ab", runner)
    monkeypatch.setattr(sys, "argv", ["curriculum_ab.py", *argv])
    try:
        rc = load("curriculum_ab").main()
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, (given[0] if given else None), out, err


def test_an_option_the_first_design_does_not_take_is_refused_not_dropped(monkeypatch, capsys, tmp_path):
    """docs/curriculum.md runs ``curriculum_ab.py --v1 ... --steps 3000 --n-layer 6``: the first
    design took the options its config has and dropped every other one without a word, so
    ``--v1 --source my_texts/`` measured the standard library and ``--v1 --workers 8`` ran on
    the default 2 (the mixture design refuses ``--wide-width``, the first design's, in one line)."""
    from tokdyn.curriculum.experiment import ABConfig

    rc, _, usage, _ = _run_ab_main(monkeypatch, capsys, ["--help"])
    options = _options_and_values(usage)
    assert "--source" in options and "--workers" in options  # the help was read
    v1_fields = {f.name for f in dataclasses.fields(ABConfig)}
    foreign = [o for o in options if o[2:].replace("-", "_") not in v1_fields and o not in ("--out", "--quick", "--v1")]
    assert foreign
    for option in foreign:
        argv = ["--v1", "--out", str(tmp_path / "ab"), option, *options[option]]
        rc, cfg, _, err = _run_ab_main(monkeypatch, capsys, argv)
        assert cfg is None, f"{option} with --v1: the first design ran without it"
        assert rc == 1 and err.count("\n") == 1 and option in err and "--v1" in err, (option, rc, err)
    # the first design's own options reach its config
    rc, cfg, _, _ = _run_ab_main(monkeypatch, capsys, ["--v1", "--out", str(tmp_path / "ab"), "--width", "0.3"])
    assert rc == 99 and cfg.width == 0.3


# -- the command line as the pages give it ---------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in ("benchmarks.md", "reliability.md"))]
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_COMMAND = re.compile(r"\btokdyn\s+([a-z][a-z-]*)(?:\s+([a-z][a-z-]*))?")


def _commands() -> dict[str, argparse.ArgumentParser]:
    """``"fit"``, ``"curriculum schedule"``, ...: each command's parser."""
    found = {}

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found[" ".join((*path, name))] = sub
                    walk(sub, (*path, name))

    walk(build_parser(), ())
    return found


def options_given_to_commands(text: str, commands: dict) -> list[tuple[int, str, str]]:
    """``(line, command, option)`` for every ``--option`` written after ``tokdyn COMMAND`` on
    one line of ``text`` (a shell line continued by ``\\`` is one line), up to the next
    ``tokdyn`` or, inside an inline code span, the span's end."""
    given = []
    for number, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        for m in _COMMAND.finditer(line):
            if m[1] not in commands:
                continue  # prose: "tokdyn records ..."
            name, end = (f"{m[1]} {m[2]}", m.end(2)) if m[2] and f"{m[1]} {m[2]}" in commands else (m[1], m.end(1))
            rest = line[end:]
            rest = rest[: nxt.start()] if (nxt := re.search(r"\btokdyn\s", rest)) else rest
            if line[: m.start()].count("`") % 2:  # an inline span: it ends at its closing backtick
                rest = rest.split("`")[0]
            given += [(number, name, option) for option in _OPTION.findall(rest)]
    return given


def test_the_scan_finds_an_option_given_to_a_command_and_no_other():
    commands = _commands()
    text = ("Run `tokdyn fit s.zarr --run r --no-such` then `tokdyn curriculum schedule p --steps 5` and\n"
            "`--other` in prose; tokdyn records --nothing here\n"
            "```bash\ntokdyn spectrum s.zarr \\\n    --boot 5   # tokdyn report s --out r.html\n```\n")  # fmt: skip
    assert options_given_to_commands(text, commands) == [
        (1, "fit", "--run"), (1, "fit", "--no-such"), (1, "curriculum schedule", "--steps"),
        (4, "spectrum", "--boot"), (4, "report", "--out")]  # fmt: skip


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_every_option_a_page_gives_a_command_is_one_of_its_options(page):
    """What tests/test_docs.py does not run: the bash blocks not marked ``run`` and the commands
    in the prose. An option renamed or removed would stay in the guide that teaches it."""
    commands = _commands()
    wrong = [f"{page.name}:{n}: tokdyn {cmd} has no {opt}" for n, cmd, opt in options_given_to_commands(page.read_text(encoding="utf-8"), commands)
             if opt not in commands[cmd]._option_string_actions]  # fmt: skip
    assert not wrong, wrong


def test_every_option_of_every_command_is_in_the_guides():
    """`tokdyn demo --points` and `--probe-sequences`, and `tokdyn fit --vocab-size`, were in
    their command's --help and in no guide: a reader of the docs could not know them."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in GUIDES)
    named = set(_OPTION.findall(text))
    missing = [f"tokdyn {name} {option}" for name, parser in _commands().items()
               for option in parser._option_string_actions if option.startswith("--") and option != "--help" and option not in named]  # fmt: skip
    assert not missing, missing


def test_the_readme_layout_names_every_module_and_pipeline():
    """README.md's "Layout" lists the package's modules and the pipelines; it left out
    pipelines/spectrum_units.py (a measurement benchmarks.md quotes) and the helpers `_text`,
    `_fonts` and `_version`."""
    layout = (ROOT / "README.md").read_text(encoding="utf-8").split("## Layout")[1]
    named = set(re.findall(r"`([\w.]+?)/?`", layout))
    modules = {p.stem for p in (ROOT / "tokdyn").glob("*.py") if p.stem not in ("__init__", "__main__")}
    modules |= {p.parent.name for p in (ROOT / "tokdyn").glob("*/__init__.py")}
    pipelines = {p.name for p in (ROOT / "pipelines").glob("*.py")}
    assert not (modules | pipelines) - named, sorted((modules | pipelines) - named)


# -- tokdyn probe's source names ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["stdlib", "stdlib-mix"])
@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_path_named_like_the_embedded_corpus_is_said_not_read_silently(name, kind, tmp_path, monkeypatch):
    """``tokdyn probe stdlib`` (and ``prepare_corpus("stdlib-mix")``) read the embedded corpus
    even where ``./stdlib`` was the user's own folder of text, without a word: a probe of the
    Python standard library where the user meant theirs. It is warned about, naming the path to
    give; the path itself reads the user's documents."""
    import tokdyn.data as data

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(data, "stdlib_documents", lambda: ["embedded"])
    monkeypatch.setattr(data, "stdlib_mixture_documents", lambda: ["embedded"])
    if kind == "folder":
        (tmp_path / name / "a").mkdir(parents=True)
        (tmp_path / name / "a" / "doc.txt").write_text("my own text\n")
    else:
        (tmp_path / name).write_text("my own text\n")
    with pytest.warns(UserWarning, match=rf"the {kind} \./{name} .*is not read: give \./{name}"):
        assert data.load_documents(name) == ["embedded"]
    mine = data.load_documents(f"./{name}")
    assert [d.text for d in mine] == ["my own text\n"]


def test_the_embedded_corpus_without_a_path_of_its_name_is_read_quietly(tmp_path, monkeypatch):
    import warnings

    import tokdyn.data as data

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(data, "stdlib_documents", lambda: ["embedded"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert data.load_documents("stdlib") == ["embedded"]


def test_a_choice_the_help_calls_the_default_is_the_default():
    """`tokdyn record-offline --axis` said "T (steps, default)", but a manifest's "axis" (or the
    resumed run's) is the default: a D sweep listed in a manifest is recorded as D without it."""
    wrong = []
    for name, parser in _commands().items():
        for a in parser._actions:
            for choice in a.choices or ():
                if re.search(rf"(?<![\w-]){re.escape(str(choice))} \([^()]*\bdefault\)", a.help or "") and a.default != choice:
                    wrong.append(f"tokdyn {name} {a.option_strings}: the help calls {choice} the default, which is {a.default!r}")
    assert not wrong, wrong


# -- the Python calls the pages write inline -----------------------------------------------------


@functools.cache
def _signatures() -> dict[str, list[set[str] | None]]:
    """Every function, method and class of the package by name, read from its source (nothing
    imported): the keywords each takes, None where it takes any (``**kwargs``, or a class whose
    fields the source does not list)."""
    found: dict[str, list] = {}

    def params(f: ast.FunctionDef) -> set[str] | None:
        a = f.args
        return None if a.kwarg else {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}

    for path in (ROOT / "tokdyn").rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.setdefault(node.name, []).append(params(node))
            elif isinstance(node, ast.ClassDef):
                init, fields = None, set()
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.setdefault(item.name, []).append(params(item))
                        init = params(item) if item.name == "__init__" else init
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        fields.add(item.target.id)
                has_init = any(isinstance(i, ast.FunctionDef) and i.name == "__init__" for i in node.body)
                found.setdefault(node.name, []).append(init if has_init else (fields or None) if not node.bases else None)
    return found


def keywords_no_function_takes(text: str, signatures: dict) -> list[str]:
    """``name(kw=...)`` in the inline code spans of ``text`` where no tokdyn function, method or
    class of that name takes ``kw``."""
    wrong = []
    for span in re.findall(r"`([^`]+\([^`]*\))`", text.replace("\n", " ")):
        try:
            tree = ast.parse(span.strip(), mode="eval")
        except SyntaxError:
            continue  # prose in a span: "fit(X)" and the like
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = getattr(call.func, "attr", None) or getattr(call.func, "id", None)
            given = [k.arg for k in call.keywords if k.arg]
            if given and name in signatures and not any(s is None or set(given) <= s for s in signatures[name]):
                wrong.append(f"`{span}`: no {name}() of tokdyn takes {sorted(set(given) - set().union(*signatures[name]))}")
    return wrong


def test_the_keyword_scan_finds_a_keyword_no_function_takes():
    signatures = _signatures()
    assert keywords_no_function_takes("`fit_run(run, axis_min=10)` and `open_store(url, mode='r')`", signatures) == []
    assert keywords_no_function_takes("see `tokdyn.fit_run(run, axis_minimum=10)`", signatures) == [
        "`tokdyn.fit_run(run, axis_minimum=10)`: no fit_run() of tokdyn takes ['axis_minimum']"]


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_every_keyword_a_page_passes_inline_is_taken(page):
    """tests/test_docs.py checks the names a code block takes from tokdyn; the calls written
    inline in the prose (`fit_run(run, axis_min=VALUE)`) were checked by nobody."""
    wrong = keywords_no_function_takes(page.read_text(encoding="utf-8"), _signatures())
    assert not wrong, wrong


def test_every_exit_code_of_the_command_line_is_in_the_readme():
    """A script that runs tokdyn reads its exit code; README.md gave 1 (an error) and 2 (a usage
    error), but not 130 (Ctrl-C), 143 (SIGTERM) or 141 (the reader left the pipe), which
    docs/fitting.md named for `tokdyn fit` only."""
    tree = ast.parse((ROOT / "tokdyn" / "cli" / "__init__.py").read_text(encoding="utf-8"))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    codes = {n.value.value for n in ast.walk(main) if isinstance(n, ast.Return) and isinstance(n.value, ast.Constant)
             and isinstance(n.value.value, int)}  # fmt: skip
    codes.add(2)  # argparse's, for a usage error
    assert {0, 1, 130, 143} <= codes  # the scan reads main()
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    missing = sorted(c for c in codes if not re.search(rf"\bexits? {c}\b", readme))
    assert not missing, f"exit codes of tokdyn that README.md does not name: {missing}"


@pytest.mark.parametrize("value", ["0", ""])
def test_tokdyn_debug_set_to_0_or_empty_is_off(value, monkeypatch, capsys, tmp_path):
    """The README says `TOKDYN_DEBUG=1` shows a traceback; `TOKDYN_DEBUG=0` (a script switching it
    off) showed one too, where the command's one line was asked for (`TOKDYN_FUSED=0` turns its
    setting off: 0 is off for both)."""
    import tokdyn.cli.store as cli_store
    from tokdyn.cli import main

    def boom(*a, **k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli_store, "open_cli_store", boom)
    monkeypatch.setenv("TOKDYN_DEBUG", value)
    assert main(["info", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("tokdyn info: error: ")
