"""Hunt 23, the items earlier hunts noticed and left alone, and what lies around them: padding
(tokens with no recorded loss) counted as class unfit by ``tokdyn fit``'s table, its JSON and
the report's example tokens; axis values one point on a fit's log axis, said at append (the row
kept) and refused by an axis run; a store replaced on a read-only file system named by a bare
``zarr.json``; ``tokdyn fit`` of a complete fit on a read-only store; counts given as floats
cut to ints by the Python API."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_hunt22_invariances import make_store, planted_all_classes
from tokdyn.cli import main
from tokdyn.fit import CLASS_CODES
from tokdyn.fit.models import scored_counts
from tokdyn.fit.options import CLASS_NAMES, STATUS_CODES, STATUS_NAMES

# -- padding is in no class: tokdyn fit's table, its JSON, the report --------------------------


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 60), n_pad=st.integers(0, 60))
def test_padding_changes_no_class_or_status_count(seed, n, n_pad):
    """Padding (no observed point: class unfit, status too_few_points) inserted anywhere among a
    fit's tokens changes no class's or status's count, only the count of tokens never scored;
    the counts and it add up to the tokens."""
    rng = np.random.default_rng(seed)
    code = rng.integers(0, len(CLASS_NAMES), n)
    status = rng.integers(0, len(STATUS_NAMES), n)
    n_points = rng.integers(1, 40, n)
    plain = scored_counts({"class_code": code, "status": status, "n_points": n_points})
    where = np.sort(rng.choice(n + n_pad, n_pad, replace=False))
    keep = np.ones(n + n_pad, bool)
    keep[where] = False
    pad = lambda a, v: np.insert(np.asarray(a), where - np.arange(n_pad), v)  # noqa: E731
    padded = {"class_code": pad(code, CLASS_CODES["unfit"]), "status": pad(status, STATUS_CODES["too_few_points"]),
              "n_points": pad(n_points, 0)}  # fmt: skip
    assert np.array_equal(padded["class_code"][keep], code)
    classes, statuses, unscored = scored_counts(padded)
    assert (classes, statuses, unscored) == (plain[0], plain[1], n_pad)
    assert sum(classes.values()) + unscored == sum(statuses.values()) + unscored == n + n_pad


@pytest.fixture(scope="module")
def padded_cli(tmp_path_factory):
    """``tokdyn fit`` (text and --json) of the same tokens without and with 30 padding tokens."""
    tmp = tmp_path_factory.mktemp("padcli")
    Y = planted_all_classes(seed=2, n_each=3)[:24]  # every class but unfit, no padding
    Yp = np.insert(Y, [0, 5, 5, 24] * 6 + [10] * 6, np.nan, axis=0)  # 30 padding tokens, spread
    out = {}
    for name, L in (("plain", Y), ("padded", Yp)):
        make_store(tmp / f"{name}.zarr", L)
        out[name] = tmp / f"{name}.zarr"
    return out


def _fit_cli(capsys, path, *extra):
    assert main(["fit", str(path), "--scheduler", "sync", "--no-progress", "--backend", "numpy", *extra]) == 0
    return capsys.readouterr().out


def test_fit_table_counts_padding_apart(padded_cli, capsys):
    """``tokdyn fit`` gave each class's "% of tokens" over every probe token, padding counted as
    unfit (a probe 30 of 54 padding read "unfit 30 tokens (55.6%)" and every class's share
    shrank), while the report's class figure counts the scored tokens. The table of a padded
    probe is now the table of the same tokens unpadded, the padding said on a line of its own;
    the JSON's class and status counts are those of the scored tokens, plus n_unscored."""
    plain = _fit_cli(capsys, padded_cli["plain"]).splitlines()
    padded = _fit_cli(capsys, padded_cli["padded"]).splitlines()
    assert padded[1:-1] == plain[1:]  # the first line gives the tokens and seconds
    assert padded[-1] == "  not in the classes above: 30 of the 54 probe tokens with no recorded loss (padding, never recorded, or NaN or inf at every point)"
    assert not any(re.match(r"\s+unfit\b", line) for line in padded)
    s0 = json.loads(_fit_cli(capsys, padded_cli["plain"], "--json"))
    s1 = json.loads(_fit_cli(capsys, padded_cli["padded"], "--json"))
    assert (s1["class_counts"], s1["status_counts"]) == (s0["class_counts"], s0["status_counts"])
    assert (s0["n_unscored"], s1["n_unscored"]) == (0, 30)
    assert sum(s1["class_counts"].values()) + s1["n_unscored"] == s1["n_tokens"] == 54


def test_report_example_tokens_draw_no_padding(padded_cli):
    """The report's example-tokens figure drew an unfit panel of padding tokens (no dot, no
    curve: never scored) titled "unfit (30 tokens)"; no panel draws padding now, and the caption
    counts the tokens left out. The summary's unfit sentence leaves padding out likewise."""
    import tokdyn
    from tokdyn.analysis import analyze_run
    from tokdyn.report import _fig_trajectories, _unfit_text

    store = tokdyn.open_store(str(padded_cli["padded"]))
    a = analyze_run(store.run("r"), n_boot=0, groups=False)
    fig = _fig_trajectories(store, a)
    titles = [ax.get_title() for ax in fig.fig.axes if ax.get_title()]
    assert titles and not any(t.startswith("unfit") for t in titles)
    assert sum(int(re.search(r"\(([\d,]+) tokens?\)", t).group(1)) for t in titles) == 24
    assert "30 probe tokens with no recorded loss (of 54)" in fig.caption
    assert a.class_counts.get("unfit", 0) == 0 and a.summary()["n_unscored"] == 30
    assert _unfit_text(a, None) == ""


# -- axis values one point on a log axis: said at append (the row kept), refused by an axis -----


def _probe(n=4):
    import tokdyn

    return tokdyn.ProbeSet(None, {"sample_id": np.zeros(n, np.int32), "token_pos": np.arange(1, n + 1, dtype=np.int32),
                                  "token_id": np.arange(n, dtype=np.int32)})  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(start=st.sampled_from([1.0, 7.0, 1e6, 1e13, 1e14, 1e15, 2.0**53, 1e17]),
       steps=st.lists(st.sampled_from([1.0, 2.0, 3.0, 64.0, 1e3, 1e6, "x2"]), min_size=1, max_size=6),
       batch=st.booleans())  # fmt: skip
def test_a_tied_axis_value_is_kept_and_said_where_the_fit_would_refuse(tmp_path_factory, start, steps, batch):
    """The writer took axis values a fit's log axis cannot tell apart (1e15 and 1e15 + 1: log10
    15.0 both) without a word; the run was recorded to its end and only tokdyn fit refused it.
    Every row is still committed (a recording loses no row, even under ``-W error``), and a
    warning names each row exactly where the fit refuses the axis."""
    import tokdyn
    from tokdyn.fit.sigmoid import log_axis
    from tokdyn.errors import InputError

    values = [start]
    for s in steps:
        v = values[-1] * 2 if s == "x2" else values[-1] + s
        if v > values[-1]:  # a step float64 cannot hold is no new value
            values.append(v)
    store = tokdyn.open_store(tmp_path_factory.mktemp("tie") / "s.zarr", _probe(), mode="w")
    w = store.create_run("r", capacity=len(values)).writer()
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        if batch:
            w.append_rows(np.ones((len(values), 4)), [{"step": i, "axis_value": v} for i, v in enumerate(values)])
        else:
            for i, v in enumerate(values):
                w.append(np.ones(4), step=i, axis_value=v)
    said = [str(m.message) for m in said if "log axis" in str(m.message)]
    run = store.run("r")
    assert run.n_committed == len(values) and list(run.axis_values[: len(values)]) == values
    tied = [i for i in range(1, len(values)) if np.log10(values[i]) == np.log10(values[i - 1])]
    if batch:  # one warning per append (a run of many tied rows printed every one): the first, and how many more
        assert [int(re.search(r"of step (\d+)", m).group(1)) for m in said] == tied[:1]
        assert all((f"and {len(tied) - 1} more row" in m) == (len(tied) > 1) for m in said)
    else:
        assert [int(re.search(r"of step (\d+)", m).group(1)) for m in said] == tied
    try:
        log_axis(np.asarray(values))
        refused = False
    except InputError:
        refused = True
    assert refused == bool(tied)


def test_a_tied_axis_value_under_warnings_as_errors_loses_no_row(tmp_path):
    import warnings

    import tokdyn

    store = tokdyn.open_store(tmp_path / "s.zarr", _probe(), mode="w")
    w = store.create_run("r", capacity=2).writer()
    w.append(np.ones(4), step=0, axis_value=1e15)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="the rows are kept"):
            w.append(np.full(4, 2.0), step=1, axis_value=1e15 + 1)
    run = store.run("r")
    assert run.n_committed == 2 and run.axis_values[1] == 1e15 + 1
    np.testing.assert_array_equal(run.losses()[1], 2.0)


def test_an_axis_of_tied_budgets_is_refused_before_any_run(tmp_path):
    """``assemble_axis`` (``tokdyn reconstruct --axis D``) made an axis run of data budgets 1e15
    and 1e15 + 1, which tokdyn fit then refused; it knows every value first, so it refuses as
    import-npz does, naming the runs, and writes nothing."""
    from test_axes_report import budget_store
    from tokdyn.axes import assemble_axis
    from tokdyn.errors import InputError

    st, _ = budget_store(tmp_path / "a.zarr", budgets=[1e5, 1e15, 1e15 + 1])
    with pytest.raises(InputError, match=r"runs 'd1' \(data_budget = 1000000000000000.0\) and 'd2' .* too close to tell apart"):
        assemble_axis(st, "D")
    assert "axis-D" not in st.runs


# -- a store replaced (mode="w") where a file cannot be deleted: said by its path ----------------


def test_replacing_a_store_that_cannot_be_deleted_names_the_file_by_its_path(tmp_path, monkeypatch):
    """``open_store(path, probe, mode="w")`` over a store on a read-only file system said
    ``[Errno 30] Read-only file system: 'zarr.json'`` (zarr's rmtree walks by folder handle and
    names the file alone), and ``tokdyn``'s line then named ``zarr.json``, no store. The error
    names the file by its path inside the store now, whichever file it is."""
    import errno
    import os
    import shutil

    import tokdyn

    store = tmp_path / "s.zarr"
    tokdyn.open_store(store, _probe(), mode="w")

    def refuse(name, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", name)

    monkeypatch.setattr(shutil.os, "unlink", refuse)
    with pytest.raises(OSError) as got:
        tokdyn.open_store(store, _probe(), mode="w")
    monkeypatch.undo()
    assert got.value.errno == errno.EROFS and os.path.isabs(got.value.filename), got.value
    assert os.path.commonpath([got.value.filename, store]) == str(store) and os.path.basename(got.value.filename) == "zarr.json"
    assert tokdyn.open_store(store).probe.n_tokens == 4  # nothing deleted


def test_replacing_a_store_on_a_read_only_mount_names_the_store(tmp_path):
    """The same on a real read-only bind mount (skipped where this process cannot mount)."""
    import subprocess
    import sys

    import tokdyn
    from test_hunt22_filesystem import ROOT, _read_only_runner

    store = tmp_path / "s.zarr"
    tokdyn.open_store(store, _probe(), mode="w")
    prefix = _read_only_runner(store)
    if prefix is None:
        pytest.skip("needs a read-only bind mount (root, with unshare and mount)")
    code = ("import tokdyn, sys\ntry:\n    tokdyn.open_store(sys.argv[1], tokdyn.open_store(sys.argv[1]).probe, mode='w')\n"
            "except OSError as e:\n    print(e.filename)\n")  # fmt: skip
    p = subprocess.run([*prefix, sys.executable, "-c", code, str(store)], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().startswith(str(store) + "/"), p.stdout


# -- a count given as a float is refused, never cut to an int -----------------------------------


def _windows(v):
    from tokdyn.data import WindowDataset

    return WindowDataset(np.arange(40), context=v)


def _mixture(v):
    from tokdyn.data import DomainCorpus, MixtureDataset
    from tokdyn.tokenizer import ByteTokenizer

    return MixtureDataset(DomainCorpus(("a",), (np.arange(40),), (np.arange(40),), ByteTokenizer(), {}), context=v)


def _val_windows(name):
    def call(v):
        from tokdyn.data import DomainCorpus
        from tokdyn.tokenizer import ByteTokenizer

        corpus = DomainCorpus(("a", "b"), (np.arange(40),) * 2, (np.arange(60),) * 2, ByteTokenizer(), {})
        return corpus.val_windows(**{"context": 4, "per_domain": 3, name: v})

    return call


def _create_run(name):
    def call(v, tmp_path):
        import tokdyn

        st = tokdyn.open_store(tmp_path / "s.zarr", _probe(8), mode="a")
        return st.create_run(f"r{len(st.runs)}", **{name: v})

    return call


def _corpus(v):
    from tokdyn.data import prepare_domains

    docs = [tokdyn_document(d, i) for d in "ab" for i in range(6)]
    return prepare_domains(docs, max_train_tokens=v, min_tokens=1)


def tokdyn_document(domain, i):
    from tokdyn.corpus import Document

    return Document(text=f"text {i} of domain {domain} " * 20, domain=domain, key=f"{domain}{i}")


COUNTS = {"WindowDataset context": _windows, "MixtureDataset context": _mixture,
          "val_windows context": _val_windows("context"), "val_windows per_domain": _val_windows("per_domain"),
          "create_run capacity": _create_run("capacity"), "create_run token_chunk": _create_run("token_chunk"),
          "prepare_domains max_train_tokens": _corpus}  # fmt: skip


@pytest.mark.parametrize("where", sorted(COUNTS))
@pytest.mark.parametrize("value", [2.5, np.float64(8.5), True, "8", 0])
def test_a_count_given_as_a_float_is_refused_not_cut(where, value, tmp_path):
    """``WindowDataset(stream, context=2.5)`` made windows of 2 tokens + 1 without a word (and
    ``MixtureDataset``, a run's ``capacity`` and ``token_chunk``, ``max_train_tokens``
    likewise cut a float by ``int()``; ``val_windows(context=2.5)`` was numpy's TypeError). Each
    is one InputError naming its parameter; the same value as an int (numpy's too) is taken, and
    as a whole float (8.0, taken before: the review of hunt 23 found the first check refused it)."""
    from tokdyn.errors import InputError

    call = COUNTS[where]
    run = (lambda v: call(v, tmp_path)) if where.startswith("create_run") else call
    name = where.split()[-1]
    shown = re.escape(repr(value.item() if isinstance(value, np.generic) else value))
    with pytest.raises(InputError, match=rf"^{name} must be (an integer >= 1|a positive multiple .*), got {shown}$"):
        run(value)
    for good in (8, np.int64(8), 8.0, np.float64(8.0)):
        run(good)


def test_a_recorder_batch_or_queue_size_given_as_a_float_is_refused(tiny_model, tmp_path):
    """The recorder's ``batch_size=2.5`` was evaluated in batches of 2, and record_offline's
    ``batch_size`` and ``workers`` cut likewise; each is refused by name, before any store."""
    from offline_fixtures import make_probe
    from tokdyn.errors import InputError
    from tokdyn.record import TokenLossRecorder, record_offline

    probe = make_probe()
    for kw in (dict(batch_size=2.5), dict(queue_size=4.5), dict(batch_size="8")):
        with pytest.raises(InputError, match=rf"^{next(iter(kw))} must be an integer >= 1"):
            TokenLossRecorder(tiny_model, probe, tmp_path / "s.zarr", "r", schedule=[0, 1], **kw)
    for kw in (dict(batch_size=2.5), dict(workers=1.5)):
        with pytest.raises(InputError, match=rf"^{next(iter(kw))} must be an integer >= 1"):
            record_offline(tmp_path / "none", tmp_path / "s.zarr", "r", probe=probe, **kw)
    assert not (tmp_path / "s.zarr").exists()


def test_fit_of_a_complete_fit_on_a_read_only_store_says_it_is_complete(padded_cli, tmp_path):
    """``tokdyn fit`` of a store on a read-only file system whose fit is complete said only
    "read-only file system ... work on a copy in a writable place": a researcher copied a store
    to learn its fit was done. The line now also says the fit is complete and which commands
    read it; a --refit, or a store with no fit, is said as before (skipped where this process
    cannot mount)."""
    import json as json_
    import shutil
    import subprocess
    import sys

    import tokdyn
    from test_hunt22_filesystem import _READ_ONLY, ROOT, _read_only_runner
    from tokdyn.fit.job import fit_run

    store, unfitted = tmp_path / "s.zarr", tmp_path / "u.zarr"
    make_store(unfitted, planted_all_classes(seed=3, n_each=2))  # never fitted
    shutil.copytree(padded_cli["padded"], store)  # fitted here, or already by the table's test
    if not tokdyn.open_store(store).run("r").fit.complete:
        fit_run(tokdyn.open_store(store, mode="r+").run("r"), progress=False, scheduler="sync", backend="numpy")
    prefix = _read_only_runner(tmp_path)
    if prefix is None:
        pytest.skip("needs a read-only bind mount (root, with unshare and mount)")
    base = ["--scheduler", "sync", "--no-progress", "--backend", "numpy"]
    argvs = [["fit", str(store), *base], ["fit", str(store), *base, "--refit"], ["fit", str(unfitted), *base]]
    p = subprocess.run([*prefix, sys.executable, "-c", _READ_ONLY, json_.dumps(argvs)], capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr
    (rc0, err0), (rc1, err1), (rc2, err2) = json_.loads(p.stdout.strip().splitlines()[-1])
    for rc, err in ((rc0, err0), (rc1, err1), (rc2, err2)):
        assert rc == 1 and err.count("\n") == 1 and err.startswith("tokdyn fit: error: read-only file system: "), err
    assert "the fit of run 'r' is complete already: `tokdyn info`" in err0
    assert "complete already" not in err1 and "complete already" not in err2


@pytest.mark.parametrize("batch", [-1, 0, 2.5, True])
def test_a_learnability_batch_that_is_no_count_is_refused(batch):
    """``LearnabilityTable.predict(windows, batch=-1)`` returned its arrays unfilled (np.empty:
    whatever memory held, as predicted mu and drops), and ``SampleSchedule(..., batch=-1)``
    binned no window and then said "no sample has a positive predicted loss drop"; 0 and 2.5
    were range()'s errors. Each is one InputError naming batch; batch=1 gives batch=8192's."""
    from test_curriculum import HAND, V, _table
    from tokdyn.curriculum import CurriculumConfig
    from tokdyn.curriculum.schedule import SampleSchedule
    from tokdyn.errors import InputError

    windows = np.random.default_rng(2).integers(0, 5, size=(40, 6))
    tab = _table(HAND, mu_global=1.0, delta_global=0.5)
    cfg = CurriculumConfig(total_steps=1000, width=0.4, floor=0.3)
    with pytest.raises(InputError, match=rf"^batch must be an integer >= 1, got {re.escape(repr(batch))}$"):
        tab.predict(windows, batch=batch)
    with pytest.raises(InputError, match=rf"^batch must be an integer >= 1, got {re.escape(repr(batch))}$"):
        SampleSchedule(tab, windows, cfg, tokenizer=V, bin_width=0.5, batch=batch)
    one, whole = tab.predict(windows, batch=1), tab.predict(windows)
    for k in ("mu", "delta", "level"):
        np.testing.assert_array_equal(one[k], whole[k])
    a, b = SampleSchedule(tab, windows, cfg, tokenizer=V, bin_width=0.5, batch=1), SampleSchedule(tab, windows, cfg, tokenizer=V, bin_width=0.5)
    np.testing.assert_array_equal(a.hist, b.hist)


@pytest.mark.parametrize("call", [
    lambda v: __import__("tokdyn.schedule").schedule.pythia_schedule(100, every=v),
    lambda v: __import__("tokdyn.schedule").schedule.geometric_schedule(100, v + 1),
    lambda v: __import__("tokdyn.probe").probe.build_probe([tokdyn_document("a", 0)], _byte(), context=v, n_sequences=2),
    lambda v: __import__("tokdyn.probe").probe.build_probe([tokdyn_document("a", 0)], _byte(), context=8, n_sequences=v),
], ids=["pythia every", "geometric n", "build_probe context", "build_probe n_sequences"])  # fmt: skip
def test_a_schedule_or_probe_count_given_as_a_float_is_refused(call):
    """``pythia_schedule(every=2.5)`` gave steps 2.5, 5.0, ... (cut to 2, 5 where stored);
    ``geometric_schedule(100, 10.5)`` and ``build_probe(context=8.5)`` or ``n_sequences=4.5``
    were numpy's and slicing's TypeErrors. Each is one InputError; the int is taken."""
    from tokdyn.errors import InputError

    with pytest.raises(InputError, match="an integer"):
        call(2.5)
    got = call(2)
    assert (got.n_tokens if hasattr(got, "n_tokens") else len(got)) >= 2


def _byte():
    from tokdyn.tokenizer import ByteTokenizer

    return ByteTokenizer()


def test_tokens_set_aside_for_their_losses_stay_unfit_beside_padding(tmp_path, capsys):
    """A token set aside for its losses (log-probabilities: below 0) has no counted point
    (``n_points`` 0), as padding has none: it is still an unfit token, said as such by
    ``tokdyn fit``, the report's summary and its class figure, while the padding is counted apart."""
    from tokdyn.analysis import analyze_run
    from tokdyn.report import _fig_trajectories, _scored_class_counts, _unfit_text

    Y = planted_all_classes(seed=4, n_each=3)  # 24 tokens of every class, 5 padding, 3 missing the last step
    Y[:3] = -Y[:3]  # log-probabilities
    store = make_store(tmp_path / "s.zarr", Y)
    out = _fit_cli(capsys, tmp_path / "s.zarr")
    assert re.search(r"\n  unfit\s+3 tokens \(", out) and "unfit: 3 tokens set aside whole" in out, out
    assert "not in the classes above: 5 of the 32 probe tokens with no recorded loss" in out
    a = analyze_run(store.run("r"), n_boot=0, groups=False)
    held, caption = _scored_class_counts(a)
    assert held["unfit"] == a.class_counts["unfit"] == 3 and "5 probe tokens with no recorded loss (of 32)" in caption
    assert "Not fitted (class unfit): 3 tokens set aside whole" in _unfit_text(a, None)
    assert any(ax.get_title() == "unfit (3 tokens)" for ax in _fig_trajectories(store, a).fig.axes)
