"""The code blocks of README.md and docs/*.md: the runnable ones are run, every Python one is
checked against the package.

The convention (docs/own-model.md, "Runnable code blocks"): a fenced block whose info string
is ``python run`` or ``bash run`` is run; ``slow`` added to it makes its section a slow test
(deselected by default); ``setup`` added makes it run first in every section of its page. The
runnable blocks of one ``## `` section run in order, each in its own process, in one fresh
folder (files carry over from block to block, Python variables do not), with ``tokdyn`` and
``python`` on the ``PATH`` meaning this checkout and this interpreter, and nothing downloaded.
Every ``python`` block, runnable or not, must parse, and every name it takes from tokdyn must exist.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("python", "bash")
FLAGS = {"run", "slow", "setup"}
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    section: str  # the ## heading above it ("" before the first)
    language: str
    flags: frozenset[str]
    code: str

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    """Every fenced code block of a Markdown page, with the ``## `` section it stands in."""
    blocks, section, lines = [], "", page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            if lines[i].startswith("## "):
                section = lines[i][3:].strip()
            i += 1
            continue
        fence, indent, words = m["fence"], len(m["indent"]), m["info"].split()
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and set(lines[j].strip()) == {fence[0]}):
            body.append(lines[j][indent:] if lines[j].startswith(" " * indent) else lines[j].lstrip())
            j += 1
        language = words[0] if words else ""
        blocks.append(Block(page, i + 1, section, language, frozenset(words[1:]), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in code_blocks(page)]
RUNNABLE = [b for b in ALL_BLOCKS if "run" in b.flags]


def _sections() -> list:
    """One test per (page, section) that holds runnable blocks of its own."""
    params = []
    for page in PAGES:
        mine = [b for b in RUNNABLE if b.page == page]
        setup = [b for b in mine if "setup" in b.flags]
        for section in dict.fromkeys(b.section for b in mine if "setup" not in b.flags):
            own = [b for b in mine if b.section == section and "setup" not in b.flags]
            marks = [pytest.mark.slow] if any("slow" in b.flags for b in own) else []
            params.append(pytest.param(setup + own, id=f"{page.stem}: {section or 'top'}", marks=marks))
    return params


def test_the_convention_is_kept():
    """A misspelt marker would silently turn a runnable block into an untested one."""
    assert any(b.page.name == "own-model.md" for b in RUNNABLE)
    for b in ALL_BLOCKS:
        unknown = b.flags - FLAGS
        assert not unknown or "run" not in b.flags, f"{b.where}: unknown marker(s) {sorted(unknown)} beside 'run'"
        if b.flags & FLAGS:
            assert "run" in b.flags, f"{b.where}: 'slow' or 'setup' without 'run' (a block runs only when marked run)"
            assert b.language in LANGUAGES, f"{b.where}: only {LANGUAGES} blocks run, not {b.language!r}"


def test_the_readme_demo_is_not_run_by_the_fast_suite():
    fast = [b for params in _sections() if not params.marks for b in params.values[0]]
    assert not any("tokdyn demo" in b.code for b in fast)


# -- every Python block: it parses, and what it takes from tokdyn exists ---------------------


def _tokdyn_names(tree: ast.AST) -> list[tuple[str, str]]:
    """``(module, attribute)`` pairs a block takes from tokdyn: ``from tokdyn.x import a`` and
    ``tokdyn.a.b`` after ``import tokdyn``; attribute ``""`` for a module imported whole."""
    names, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tokdyn" and not node.level:
            names += [(node.module, a.name) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "tokdyn":
                    names.append((a.name, ""))
                    aliases[a.asname or "tokdyn"] = a.name if a.asname else "tokdyn"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            names.append((aliases[node.value.id], node.attr))
    return names


def _module_names(module: str) -> set[str] | None:
    """The names a tokdyn module defines at its top level (and its submodules), read from its
    source without importing it (importing the adapters would load transformers and lightning);
    None when it is not a module of this checkout."""
    path = ROOT.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not source.is_file():
        return None
    names = {p.stem for p in path.glob("*.py")} | {p.name for p in path.iterdir() if (p / "__init__.py").is_file()} if path.is_dir() else set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):  # names loaded on first use are listed there
                try:
                    names |= set(ast.literal_eval(node.value))
                except ValueError:
                    pass
        elif isinstance(node, ast.Try):  # optional imports
            names |= {(a.asname or a.name).split(".")[0] for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    return names


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "python"], ids=lambda b: b.where)
def test_python_blocks_parse_and_name_what_exists(block):
    try:
        tree = ast.parse(block.code, filename=block.where)
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: the block does not parse: {exc}")
    for module, attr in _tokdyn_names(tree):
        if module == "tokdyn":  # its names load on first use: __all__ lists them
            import tokdyn

            # a submodule is an attribute after `import tokdyn` only where the package imports it
            # itself (tokdyn.axes.assemble_axis was an AttributeError): asked of a fresh interpreter,
            # since any import of tokdyn.x in this one sets tokdyn.x
            ok = not attr or attr in tokdyn.__all__ or attr in _fresh_tokdyn_names()
        else:
            names = _module_names(module)
            assert names is not None, f"{block.where}: no module {module}"
            ok = not attr or attr in names
        assert ok, f"{block.where}: {module} has no {attr!r}"


@functools.lru_cache(maxsize=1)
def _fresh_tokdyn_names() -> frozenset[str]:
    """The attributes of ``tokdyn`` right after ``import tokdyn`` in a new interpreter."""
    code = "import tokdyn; print(' '.join(vars(tokdyn)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    return frozenset(out.split())


# -- runnable blocks ---------------------------------------------------------------------------


def _doc_env(bin_dir: Path, hf_home: Path) -> dict:
    """``tokdyn`` and ``python`` on the PATH are this checkout and this interpreter; nothing is
    downloaded; one thread per process (the sections run side by side)."""
    for name, args in (("tokdyn", "-m tokdyn.cli"), ("python", "")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TOKDYN_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT), MPLBACKEND="Agg",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(hf_home), TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", PYTHONHASHSEED="0")  # fmt: skip
    return env


def run_section(blocks: list[Block], folder: Path, env: dict) -> str | None:
    """Run ``blocks`` in order in ``folder``/work; None when all succeed, else what failed."""
    work = folder / "work"
    work.mkdir()
    for k, b in enumerate(blocks):
        if b.language == "python":
            script = folder / f"block{k}.py"
            script.write_text(b.code)
            cmd = [sys.executable, str(script)]
        else:
            cmd = ["bash", "-euo", "pipefail", "-c", b.code]
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return f"{b.where} ({b.language}) ran past 600 s"
        if proc.returncode:
            return f"{b.where} ({b.language}) exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return None


def _key(blocks: list[Block]) -> tuple[str, ...]:
    return tuple(b.where for b in blocks)


@pytest.fixture(scope="module", autouse=True)
def section_runs(request, tmp_path_factory):
    """The selected sections, started together when the module's first test starts (each one
    is a chain of processes that mostly waits on imports; on 2 cores they overlap), one worker
    a core."""
    selected = [item.callspec.params["blocks"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_runnable_section" and hasattr(item, "callspec")]  # fmt: skip
    if not selected:
        yield {}
        return
    env = _doc_env(tmp_path_factory.mktemp("bin"), tmp_path_factory.mktemp("hf"))
    with ThreadPoolExecutor(max_workers=max(1, min(len(selected), os.cpu_count() or 1))) as pool:
        runs = {_key(b): pool.submit(run_section, b, tmp_path_factory.mktemp("doc"), env) for b in selected}
        yield runs
        for f in runs.values():
            f.cancel()


@pytest.mark.parametrize("blocks", _sections())
def test_runnable_section(blocks, section_runs):
    failure = section_runs[_key(blocks)].result()
    if failure:
        pytest.fail(failure, pytrace=False)


def test_the_runner_reads_markers_and_reports_the_failing_block(tmp_path):
    text = """intro

```python run setup
open("made", "w").write("x")
```

## One

~~~bash run
test -f made
~~~

1. a list item
   ```bash run
   echo indented; exit 3
   ```

```python
not run
```
"""
    fake = tmp_path / "page.md"
    fake.write_text(text)
    blocks = code_blocks(fake)
    assert [(b.section, b.language, sorted(b.flags)) for b in blocks] == [
        ("", "python", ["run", "setup"]), ("One", "bash", ["run"]), ("One", "bash", ["run"]), ("One", "python", [])]
    assert blocks[2].code == "echo indented; exit 3\n"
    runnable = [b for b in blocks if "run" in b.flags]
    env = _doc_env(tmp_path, tmp_path)
    (tmp_path / "a").mkdir()
    assert run_section(runnable[:2], tmp_path / "a", env) is None  # the set-up's file is there for the next block
    (tmp_path / "b").mkdir()
    failure = run_section(runnable, tmp_path / "b", env)
    assert failure.startswith(f"{blocks[2].where} (bash) exited 3") and "indented" in failure


# -- what docs/own-model.md says an error means ------------------------------------------------


def test_a_model_smaller_than_the_probes_vocabulary_is_a_named_error(tmp_path):
    """docs/own-model.md's error table: a probe token id past the model's embedding was a raw
    IndexError from inside torch."""
    import numpy as np

    import tokdyn
    from tokdyn.model import GPTConfig, TinyGPT

    probe = tokdyn.ProbeSet.from_tokens(np.random.default_rng(0).integers(0, 2000, (4, 17)), tokenizer={"kind": "hf", "vocab_size": 2000})
    model = TinyGPT(GPTConfig(vocab_size=257, context=16, n_layer=1, n_head=2, n_embd=16))
    with pytest.raises(tokdyn.InputError, match=r"cannot take the probe's tokens .*ids reach 1\d{3}") as info:
        with tokdyn.TokenLossRecorder(model, probe, tmp_path / "s.zarr", "small", schedule=[0]) as rec:
            rec.record(0)
    assert str(info.value).split(" (")[0] in (ROOT / "docs" / "own-model.md").read_text()
