"""Hostile input to the analysis commands (`curriculum`, `compare`, `report`): each test stands
for a class of input, and every refusal is one line and exit 1 (docs/reliability.md).

- an option's value is checked where it is parsed, before any work: every numeric option of the
  curriculum actions, `compare --tolerance`; a step count that would take days is refused;
- any file that is not a whole learnability table is one line saying so, and why;
- `compare` needs two runs of one axis, works on a probe without domain labels and on the
  folder `tokdyn demo` writes;
- `report` shows a run named twice once, and says when a folder of its path is a file.
"""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import tokdyn
from reliability_fixtures import cli_error_line, run_cli
from test_hostile import STEPS, fitted_store
from tokdyn.cli import main
from tokdyn.curriculum.learnability import LearnabilityOptions, LearnabilityTable
from tokdyn.curriculum.mixture import MAX_MIXTURE_STEPS, DomainRates, MixtureConfig, MixtureSchedule, _write_rows
from tokdyn.errors import InputError

N = 60


@pytest.fixture(scope="module")
def pilot(tmp_path_factory) -> str:
    """Fitted T runs ``r`` and ``r2`` (the same events, one row later) whose probe has
    two domains."""
    d = tmp_path_factory.mktemp("pilot")
    st = fitted_store(d / "s.zarr", domains=("code", "prose"))
    y = st.run("r").losses()
    with st.create_run("r2", capacity=len(STEPS)).writer() as w:  # row j of r one row later: every event later
        for j, step in enumerate(STEPS):
            w.append(y[max(j - 1, 0)], step=int(step))
    tokdyn.fit_run(st.run("r2"), progress=False)
    return str(d / "s.zarr")


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> str:
    """A store imported from losses.npz files (no domain labels): fitted T runs ``a`` and ``b``
    (``b`` learns later) and a fitted D run ``d``."""
    d = tmp_path_factory.mktemp("imported")
    rng = np.random.default_rng(0)
    x = np.log10(STEPS)
    for name, axis, shift, values in (("a", "T", 0.0, STEPS), ("b", "T", 0.3, STEPS), ("d", "D", 0.0, STEPS * 1e6)):
        mu, s, dl = rng.uniform(0.5, 2.5, N) + shift, rng.uniform(0.05, 0.2, N), rng.uniform(1, 3, N)
        y = 1 + dl[:, None] / (1 + np.exp((x[None, :] - mu[:, None]) / s[:, None])) + rng.normal(0, 0.05, (N, x.size))
        np.savez(d / f"{name}.npz", axis_values=np.asarray(values, np.float64), loss_matrix=y.clip(0.01).astype(np.float32),
                 axis_name=np.array(axis))  # fmt: skip
        assert main(["import-npz", str(d / f"{name}.npz"), str(d / "s.zarr")]) == 0
        tokdyn.fit_run(tokdyn.open_store(d / "s.zarr", mode="r+").run(name), progress=False)
    return str(d / "s.zarr")


def one_line(argv, capsys, *names) -> str:
    """Run ``argv``: exit 1 and one stderr line naming each of ``names``."""
    code, err = run_cli(argv, capsys)
    line = cli_error_line(err)
    assert code == 1, (code, err)
    assert "internal error" not in line, line
    for name in names:
        assert name in line, (name, line)
    return line


# -- 1 and 3: every numeric option of the curriculum actions, checked before any work ------------

BAD_OPTIONS = [
    ("build", "--seed", "-1"), ("build", "--order", "0"), ("build", "--order", "4"), ("build", "--min-count", "0"),
    ("build", "--prior", "nan"), ("build", "--prior", "-1"), ("build", "--prior", "inf"), ("build", "--holdout", "1"),
    ("build", "--holdout", "nan"), ("build", "--holdout", "-0.1"),
    ("schedule", "--steps", "10000000000"), ("schedule", "--steps", "0"), ("schedule", "--steps", "-5"),
    ("schedule", "--steps", str(MAX_MIXTURE_STEPS + 1)), ("schedule", "--floor", "1.5"), ("schedule", "--floor", "nan"),
    ("schedule", "--temperature", "0"), ("schedule", "--temperature", "inf"), ("schedule", "--width", "-1"),
    ("schedule", "--width", "nan"), ("schedule", "--lead", "inf"), ("schedule", "--lead", "nan"),
    ("schedule", "--time-scale", "0"), ("schedule", "--time-scale", "nan"),
]  # fmt: skip
OUT = {"build": "t.npz", "schedule": "m.json"}


def curriculum_argv(action: str, store: str, tmp_path, *extra: str) -> list[str]:
    argv = ["curriculum", action, store, "--run", "r", "--out", str(tmp_path / OUT[action])]
    return argv + (["--steps", "100"] if action == "schedule" and "--steps" not in " ".join(extra) else []) + list(extra)


@pytest.mark.parametrize("action,option,value", BAD_OPTIONS, ids=lambda v: str(v))
def test_a_numeric_option_out_of_range_is_one_line_before_any_work(action, option, value, tmp_path, capsys):
    """The store does not exist: the option is refused before it is opened (up front)."""
    line = one_line(curriculum_argv(action, str(tmp_path / "none.zarr"), tmp_path, f"{option}={value}"), capsys, option)
    assert line.endswith(f"got {value}")  # what the user typed, not a value computed from it
    assert not (tmp_path / OUT[action]).exists()


@pytest.mark.parametrize("base", [["inf", "1"], ["nan", "1"], ["-1", "2"], ["0", "0"], ["1e308", "1e308"]])
def test_base_weights_must_be_finite_and_sum_positive(base, tmp_path, capsys):
    line = one_line(curriculum_argv("schedule", str(tmp_path / "none.zarr"), tmp_path, "--base", *base), capsys, "--base")
    assert line.endswith("got " + " ".join(base))  # echoed as given (not "[nan, 0.0]")


def test_base_needs_one_weight_per_domain(pilot, tmp_path, capsys):
    one_line(curriculum_argv("schedule", pilot, tmp_path, "--base", "1", "2", "3"), capsys, "--base", "2 weights", "1 2 3")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=hs.sampled_from(["--floor", "--temperature", "--width", "--lead", "--time-scale"]),
       value=hs.floats(allow_nan=True, allow_infinity=True))  # fmt: skip
def test_a_float_option_is_refused_exactly_when_out_of_range(option, value, tmp_path, capsys):
    import math

    ok = {"--floor": 0 <= value <= 1, "--temperature": math.isfinite(value) and value > 0,
          "--width": math.isfinite(value) and value >= 0, "--lead": math.isfinite(value),
          "--time-scale": math.isfinite(value) and value > 0}[option]  # fmt: skip
    line = one_line(curriculum_argv("schedule", str(tmp_path / "none.zarr"), tmp_path, f"{option}={value!r}"), capsys)
    assert (option in line) != ok, line  # a value in range reaches the store (missing here)
    if ok:
        assert "no tokdyn store" in line


def test_the_step_bound_is_documented(capsys):
    with pytest.raises(SystemExit):
        main(["curriculum", "schedule", "-h"])
    assert f"1 to {MAX_MIXTURE_STEPS:,}" in " ".join(capsys.readouterr().out.split())


def test_library_refuses_the_same_values():
    for kw in ({"seed": -1}, {"seed": 1.5}, {"seed": True}):
        with pytest.raises(InputError, match="seed"):
            LearnabilityOptions(**kw)
    for steps in (0, MAX_MIXTURE_STEPS + 1, 10**10, True):
        with pytest.raises(InputError, match="total_steps"):
            MixtureConfig(total_steps=steps)
    from tokdyn.curriculum.coupled import CoupledSampler

    with pytest.raises(InputError, match="seed"):
        CoupledSampler(np.array([0.5, 0.5]), samples_per_step=2, total_steps=3, seed=-1)


# -- 1: the schedule's cost: whole arrays, its file streamed, its format unchanged ----------------


def _rates(rng, d: int) -> DomainRates:
    x = np.linspace(-0.5, 3.5, 241)
    return DomainRates([f"d{k}" for k in range(d)], x, rng.random((x.size, d)) * (rng.random(d) > 0.2))


@settings(max_examples=25, deadline=None)
@given(seed=hs.integers(0, 2**32 - 1), d=hs.integers(2, 5), steps=hs.integers(1, 400),
       floor=hs.floats(0, 1), temperature=hs.floats(0.2, 5), lead=hs.floats(-1, 1), time_scale=hs.floats(0.1, 10))  # fmt: skip
def test_the_whole_array_schedule_is_the_per_step_formula(seed, d, steps, floor, temperature, lead, time_scale):
    rng = np.random.default_rng(seed)
    rates = _rates(rng, d)
    base = rng.random(d) + 0.01
    cfg = MixtureConfig(total_steps=steps, floor=floor, temperature=temperature, lead=lead, time_scale=time_scale)
    sched = MixtureSchedule(rates, cfg, base=base / base.sum())
    for t in sorted({0, steps // 2, steps - 1}):  # the module docstring's formula, one step at a time
        r = np.array([np.interp(cfg.x(t), rates.x, rates.rates[:, k], left=0, right=0) for k in range(d)])
        q = sched.base * r ** (1 / temperature)
        q = q / q.sum() if q.sum() > 0 else sched.base
        np.testing.assert_allclose(sched.weights(t), floor * sched.base + (1 - floor) * q, rtol=1e-12, atol=1e-15)
    e = sched.enrichment()
    assert len(e["per_step"]) == steps and np.isfinite(e["schedule"])


def test_the_streamed_file_is_the_schedule_as_json(tmp_path, monkeypatch):
    import io

    import tokdyn.curriculum.mixture as mixture

    arr = np.random.default_rng(0).random((10, 3))
    fh = io.StringIO()
    _write_rows(fh, arr, block=3)  # blocks that do not divide the rows
    assert fh.getvalue() == json.dumps(arr.tolist())
    monkeypatch.setattr(mixture, "_write_rows", lambda fh, a: _write_rows(fh, a, block=7))
    for zero in (False, True):  # rates that fall, and rates that never do (enrichment 1)
        rates = _rates(np.random.default_rng(1), 3)
        rates.rates *= 0 if zero else 1
        sched = MixtureSchedule(rates, MixtureConfig(total_steps=50, temperature=0.7))
        text = open(sched.save(tmp_path / "m.json")).read()
        assert text == json.dumps(sched.to_dict())
        back = mixture.load_mixture_schedule(tmp_path / "m.json")
        np.testing.assert_array_equal(back.table_, sched.table_)
    assert not list(tmp_path.glob("*.tmp"))


# -- 2: any file that is not a whole learnability table ------------------------------------------

V = 11


@pytest.fixture(scope="module")
def table_file(tmp_path_factory):
    rng = np.random.default_rng(1)
    windows = rng.integers(0, V, size=(100, 9))
    n = 100 * 8
    targets = {"delta": rng.uniform(0, 2, n), "mu": rng.uniform(0, 2, n), "weight": np.ones(n)}
    tab = LearnabilityTable.fit(windows, targets, vocab_size=V, options=LearnabilityOptions(holdout=0.2),
                                meta={"tokenizer": {"kind": "byte", "vocab_size": V}})  # fmt: skip
    return tab.save(tmp_path_factory.mktemp("table") / "t.npz")


def _arrays(path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _meta(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)


def _bad_tables(good) -> dict:
    """name -> (what to write: bytes, or arrays for np.savez; words the error must hold)."""
    a = _arrays(good)
    meta = json.loads(bytes(a["meta"]).decode())
    html = b"<!doctype html><html><body>not found</body></html>"
    without = lambda key: {k: v for k, v in a.items() if k != key}  # noqa: E731
    return {
        "empty": (b"", "empty"),
        "html": (html, "not an .npz archive"),
        "npy": (b"\x93NUMPY\x01\x00" + b"\x00" * 40, ".npy"),
        "truncated": (good.read_bytes()[: len(good.read_bytes()) // 2], "damaged"),
        "zip-of-text": (None, "damaged"),
        "object-array": ({**a, "keys_1": np.array([{"x": 1}], dtype=object)}, "pickle"),
        "no-meta": (without("meta"), "no 'meta'"),
        "meta-list": ({**a, "meta": _meta([1, 2])}, "JSON list"),
        "meta-not-json": ({**a, "meta": np.frombuffer(b"\xff\xfe{", np.uint8)}, "not JSON"),
        "meta-floats": ({**a, "meta": np.arange(3.0)}, "not JSON"),
        "other-kind": ({**a, "meta": _meta({**meta, "kind": "other"})}, "kind"),
        "order-text": ({**a, "meta": _meta({**meta, "order": "3"})}, "'order'"),
        "order-huge": ({**a, "meta": _meta({**meta, "order": 10**9})}, "'order'"),
        "vocab-missing": ({**a, "meta": _meta({k: v for k, v in meta.items() if k != "vocab_size"})}, "'vocab_size'"),
        "vocab-zero": ({**a, "meta": _meta({**meta, "vocab_size": 0})}, "vocab_size"),
        "mu-text": ({**a, "meta": _meta({**meta, "mu_global": "x"})}, "'mu_global'"),
        "pilot-list": ({**a, "meta": _meta({**meta, "pilot": [1]})}, "metadata"),
        "array-missing": (without("mu_2"), "'mu_2'"),
        "array-2d": ({**a, "keys_1": a["keys_1"].reshape(1, -1)}, "'keys_1'"),
        "array-0d": ({**a, "count_1": np.array(3)}, "'count_1'"),
        "array-text": ({**a, "delta_1": np.array(["a"] * a["delta_1"].size)}, "'delta_1'"),
        "array-short": ({**a, "mu_1": a["mu_1"][:-1]}, "order 1"),
        "keys-unsorted": ({**a, "keys_1": a["keys_1"][::-1].copy()}, "sorted"),
        "mu-nan": ({**a, "mu_1": np.full_like(a["mu_1"], np.nan)}, "finite"),
    }


BAD_TABLES = ["empty", "html", "npy", "truncated", "zip-of-text", "object-array", "no-meta", "meta-list", "meta-not-json",
              "meta-floats", "other-kind", "order-text", "order-huge", "vocab-missing", "vocab-zero", "mu-text", "pilot-list",
              "array-missing", "array-2d", "array-0d", "array-text", "array-short", "keys-unsorted", "mu-nan"]  # fmt: skip


@pytest.mark.parametrize("case", BAD_TABLES)
def test_any_file_that_is_not_a_table_is_one_line(case, table_file, tmp_path, capsys):
    content, words = _bad_tables(table_file)[case]
    path = tmp_path / "bad.npz"
    if case == "zip-of-text":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("readme.txt", "hello")
        words = "no 'meta'"
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.savez(path, **content)
    line = one_line(["curriculum", "show", str(path)], capsys, str(path), words)
    assert "not a learnability table" in line, line


def test_the_good_table_shows(table_file, capsys):
    assert main(["curriculum", "show", str(table_file)]) == 0
    assert "held-out" in capsys.readouterr().out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=hs.data())
def test_a_damaged_table_is_one_line_or_shown(data, table_file, tmp_path, capsys):
    """Any byte changed, or the file cut anywhere: exit 0 (the damage missed what is read) or one
    line saying the file is not a table; never an internal error."""
    raw = bytearray(table_file.read_bytes())
    if data.draw(hs.booleans()):
        raw = raw[: data.draw(hs.integers(0, len(raw) - 1))]
    else:
        i = data.draw(hs.integers(0, len(raw) - 1))
        raw[i] = (raw[i] + data.draw(hs.integers(1, 255))) % 256
    path = tmp_path / "damaged.npz"
    path.write_bytes(bytes(raw))
    code, err = run_cli(["curriculum", "show", str(path)], capsys)
    if code != 0:
        line = cli_error_line(err)
        assert code == 1 and "internal error" not in line and str(path) in line, line


# -- 4-7: compare -----------------------------------------------------------------------------


def test_compare_without_domain_labels_compares_overall(imported, capsys):
    assert main(["compare", imported, "--run", "a", "--run", "b"]) == 0
    out = capsys.readouterr().out
    assert "  all " in out and "no rows by domain" in out and "domain " not in out.replace("by domain", "")
    assert main(["compare", imported, "--run", "a", "--run", "b", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["by_domain"] == {} and not res["has_domains"] and res["overall"]["n_tokens"] > 0
    assert res["overall"]["median_shift"] > 0  # b learns 0.3 decades later


def test_compare_with_domain_labels_has_domain_rows(pilot, capsys):
    assert main(["compare", pilot, "--run", "r", "--run", "r2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["has_domains"] and set(res["by_domain"]) == {"code", "prose"}


def test_compare_refuses_runs_of_different_axes(imported, capsys):
    one_line(["compare", imported, "--run", "a", "--run", "d"], capsys, "'a'", "'d'", "T axis", "D axis")
    one_line(["compare", imported, "--run", "d", "--run", "b"], capsys, "D axis", "T axis")


@pytest.mark.parametrize("tol", ["-1", "nan", "inf", "-inf", "-0.001"])
def test_compare_tolerance_must_be_finite_and_not_negative(tol, tmp_path, capsys):
    one_line(["compare", str(tmp_path / "none.zarr"), "--run", "a", "--run", "b", f"--tolerance={tol}"], capsys, "--tolerance",
             f"got {tol}")  # fmt: skip


@pytest.mark.parametrize("tol", [-1.0, float("nan"), float("inf"), "0.1", None, pytest.param(10**400, id="int-past-1e308"), True])
def test_compare_runs_refuses_the_same_tolerances(tol, imported):
    from tokdyn.compare import compare_runs

    with pytest.raises(InputError, match="tolerance"):
        compare_runs(imported, "a", "b", tolerance=tol)


def test_compare_accepts_the_folder_demo_writes(imported, tmp_path, capsys):
    import shutil

    shutil.copytree(imported, tmp_path / "demo" / "store.zarr")
    assert main(["compare", imported, "--run", "a", "--run", "b", "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert main(["compare", str(tmp_path / "demo"), "--run", "a", "--run", "b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == want


def test_curriculum_schedule_on_a_probe_without_domains_is_one_line(imported, tmp_path, capsys):
    one_line(["curriculum", "schedule", imported, "--run", "a", "--steps", "10", "--out", str(tmp_path / "m.json")], capsys,
             "one domain")  # fmt: skip


# -- 8: report --------------------------------------------------------------------------------


def test_report_shows_a_run_named_twice_once(pilot, tmp_path, capsys):
    assert main(["report", pilot, "--run", "r", "--run", "r", "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "of 2 runs" not in page and run_sections(page) == ["r"]
    again = tokdyn.report.write_report(pilot, tmp_path / "r2.html", runs=["r2", "r", "r2"]).read_text()
    assert run_sections(again) == ["r2", "r"]  # each once, in the order given


def run_sections(page: str) -> list[str]:
    import re

    return re.findall(r"<h2 id=sec-\d+>\d+\. Run (\S+) \(axis", page)


@pytest.mark.parametrize("out,words", [("afile/x.html", "afile is a file, not a folder"),
                                       ("afile/sub/x.html", "afile is a file, not a folder"),
                                       ("nodir/x.html", "folder nodir does not exist")])  # fmt: skip
def test_report_says_which_part_of_its_path_is_wrong(out, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file")
    one_line(["report", str(tmp_path / "none.zarr"), "--out", out], capsys, words)


@pytest.mark.parametrize("v", [10**400, True, "0.5", None, [1.0]])
def test_a_learnability_table_s_metadata_that_is_no_float_prints_as_a_question_mark(v):
    """The table's metadata is the writer's JSON, which a hand edit can fill with anything: an
    int past 1e308 has no float format (OverflowError before)."""
    from tokdyn.cli.curriculum import _num

    assert _num(v) == "?" and _num(0.5) == "0.500" and _num(2, ".0%") == "200%"
