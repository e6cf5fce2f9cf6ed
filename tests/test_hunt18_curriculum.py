"""Hunt 18 on the curriculum: a pilot's flat tokens carry no rates (two sigmoids fitted to noise
made a noisier domain look learnable), and the verdict tells a floor that leaves no room from
domains that fall in proportion."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tokdyn
from tokdyn.cli import main
from tokdyn.curriculum.mixture import load_mixture_schedule

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))  # x = 1 .. 5
BYTE = {"kind": "byte", "vocab_size": 257, "eot_id": 256}


def _pilot(path, mu_a, mu_b, *, noise=(0.05, 0.05), seed=0, domains=("a", "b")) -> str:
    """A fitted two-domain pilot; a token with mu NaN never learns (its loss stays at 2 nats plus
    noise); the others drop 3 nats at mu (width 0.1 decades). Each domain its own noise."""
    rng = np.random.default_rng(seed)
    mu = np.concatenate([mu_a, mu_b])
    n = mu.size
    dom = np.repeat([0, 1], [len(mu_a), len(mu_b)])
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(97, 123, size=(n, 2)), domain=dom, domains=domains, tokenizer=BYTE)
    sd = np.asarray(noise)[dom]
    st = tokdyn.open_store(str(path), probe, mode="w")
    with st.create_run("pilot", capacity=len(STEPS)).writer() as w:
        for step in STEPS:
            x = np.log10(step)
            learned = 1 + 3 / (1 + np.exp((x - np.nan_to_num(mu, nan=0.0)) / 0.1))
            row = np.where(np.isnan(mu), 2.0, learned) + sd * rng.standard_normal(n)
            w.append(row.astype(np.float32), step=int(step))
    tokdyn.fit_run(tokdyn.open_store(str(path), mode="r+").run("pilot"), progress=False)
    return str(path)


def _schedule(store, out, capsys, *extra):
    assert main(["curriculum", "schedule", store, "--run", "pilot", "--steps", "100000", "--out", str(out), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out), load_mixture_schedule(out)


@pytest.mark.parametrize("seed", [2, 3])
def test_a_pilot_in_which_nothing_was_learned_gets_no_schedule(tmp_path, capsys, seed):
    """Noise alone, 0.3 nats in one domain and 0.01 in the other: no token learns, and the
    schedule keeps the baseline mixture (it gave the noisy domain 0.8 of the weight and +49 %)."""
    nan = np.full(200, np.nan)
    store = _pilot(tmp_path / "flat.zarr", nan, nan, noise=(0.3, 0.01), seed=seed)
    got, sched = _schedule(store, tmp_path / "m.json", capsys)
    assert got["enrichment"]["schedule"] == pytest.approx(1.0, abs=1e-9)
    assert np.abs(sched.table_ - 0.5).max() < 1e-9
    assert "no drop in range to judge" in got["verdict"]


def test_domains_learned_alike_under_different_noise_get_equal_weights(tmp_path, capsys):
    """Half the tokens of each domain learn, at the same times; the other half stay flat, under
    noise of 0.3 nats in a and 0.01 in b. A positive control moves b's events a decade later."""
    mu = np.random.default_rng(0).uniform(2.0, 3.5, 150)
    half = np.concatenate([mu, np.full(150, np.nan)])
    store = _pilot(tmp_path / "same.zarr", half, half, noise=(0.3, 0.01))
    _, sched = _schedule(store, tmp_path / "m.json", capsys)
    assert np.abs(sched.table_ - 0.5).max() < 0.05, np.abs(sched.table_ - 0.5).max(axis=1)[[99, 999, 9999]]
    later = _pilot(tmp_path / "later.zarr", half, np.concatenate([mu + 1.0, np.full(150, np.nan)]), noise=(0.3, 0.01))
    _, sched = _schedule(later, tmp_path / "l.json", capsys)
    assert sched.weights(316)[0] > 0.65 and sched.weights(9999)[1] > 0.65


@pytest.mark.parametrize("floor", ["0.95", "1"])
def test_a_floor_that_leaves_no_room_is_not_called_domains_in_proportion(tmp_path, capsys, floor):
    rng = np.random.default_rng(5)
    store = _pilot(tmp_path / "p.zarr", rng.uniform(2.0, 3.0, 60), rng.uniform(3.0, 4.0, 60))
    got, _ = _schedule(store, tmp_path / "f.json", capsys, "--floor", floor)
    assert got["enrichment"]["unbounded"] > 1.05 and got["enrichment"]["best"] < 1.05
    assert "in proportion" not in got["verdict"] and "the floor keeps too much" in got["verdict"]
    got, _ = _schedule(store, tmp_path / "g.json", capsys)  # floor 0: the schedule helps
    assert "more learnable-now loss drop" in got["verdict"]


# -- what the commands print: names shown so that none forges a line or hides another ---------


def test_domains_that_show_alike_are_told_apart(tmp_path, capsys):
    from tokdyn._text import labels, visible

    assert visible("a\n") == visible("a\\n")  # what made the two domains print the same
    assert labels(["a\n", "a\\n", "b"]) == ["'a\\n'", "'a\\\\n'", "b"]
    assert labels(["x", "caf\u00e9"]) == ["x", "caf\u00e9"]  # no clash: shown as before
    rng = np.random.default_rng(1)
    store = _pilot(tmp_path / "p.zarr", rng.uniform(2.0, 3.0, 40), rng.uniform(3.0, 4.0, 40), domains=("a\n", "a\\n"))
    assert main(["curriculum", "schedule", store, "--run", "pilot", "--steps", "1000", "--out", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    step = next(line for line in out.splitlines() if "step   1000" in line)
    assert "'a\\n' " in step and "'a\\\\n' " in step, step


def test_a_store_path_with_a_newline_prints_no_line_of_its_own(tmp_path, capsys):
    rng = np.random.default_rng(2)
    folder = tmp_path / "nl\nFAKE: held-out rank corr 0.999"
    folder.mkdir()
    store = _pilot(folder / "p.zarr", rng.uniform(2.0, 3.0, 40), rng.uniform(3.0, 4.0, 40))
    table = tmp_path / "t\u202eoxt.npz"
    assert main(["curriculum", "build", store, "--run", "pilot", "--out", str(table), "--holdout", "0"]) == 0
    assert main(["curriculum", "show", str(table)]) == 0
    out = capsys.readouterr().out
    assert not any(line.startswith("FAKE") for line in out.splitlines()), out
    assert "\u202e" not in out and "\\u202e" in out and "nl\\nFAKE" in out


def test_an_output_named_only_by_its_suffix_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import tokdyn.curriculum.learnability as lrn

    monkeypatch.setattr(lrn, "build_table", lambda *a, **k: pytest.fail("built before the --out check"))
    (tmp_path / "hid").mkdir()
    assert main(["curriculum", "build", str(tmp_path / "nostore.zarr"), "--run", "pilot", "--out", str(tmp_path / "hid" / ".npz")]) == 1
    assert "--out must name a .npz file" in capsys.readouterr().err


def test_a_negative_value_in_e_notation_is_read_as_a_number(tmp_path, capsys):
    rng = np.random.default_rng(3)
    store = _pilot(tmp_path / "p.zarr", rng.uniform(2.0, 3.0, 40), rng.uniform(3.0, 4.0, 40))
    assert main(["curriculum", "schedule", store, "--run", "pilot", "--steps", "100", "--out", str(tmp_path / "m.json"),
                 "--lead", "-1e-3", "--json"]) == 0, capsys.readouterr().err  # fmt: skip
    assert load_mixture_schedule(tmp_path / "m.json").config.lead == pytest.approx(-1e-3)


# -- the experiments' own outputs -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["link", "file", "folder"])
def test_a_pilot_store_path_that_is_no_store_is_refused_and_kept(tmp_path, kind):
    from tokdyn._files import remove_store_folder
    from tokdyn.errors import InputError

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("data")
    path = tmp_path / "pilot.zarr"
    if kind == "link":
        path.symlink_to(victim)
    elif kind == "file":
        path.write_text("not a store")
    else:
        path.mkdir()
        (path / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="is a (link|file|folder that holds no zarr store), not the pilot store an earlier run left"):
        remove_store_folder(path, what="pilot store")
    assert (victim / "precious.txt").read_text() == "data" and os.path.lexists(path)


def test_an_earlier_pilot_store_or_an_empty_folder_is_removed(tmp_path):
    from tokdyn._files import remove_store_folder

    rng = np.random.default_rng(4)
    store = _pilot(tmp_path / "pilot.zarr", rng.uniform(2.0, 3.0, 10), rng.uniform(3.0, 4.0, 10))
    remove_store_folder(store)
    (tmp_path / "empty.zarr").mkdir()
    remove_store_folder(tmp_path / "empty.zarr")
    remove_store_folder(tmp_path / "absent.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_removal_stopped_part_way_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """Deleted in place, a Ctrl-C part-way left a folder without its zarr.json that every rerun
    refused; moved aside first, the next run finds the whole store or none."""
    import shutil

    from tokdyn._files import remove_store_folder

    rng = np.random.default_rng(4)
    store = _pilot(tmp_path / "pilot.zarr", rng.uniform(2.0, 3.0, 10), rng.uniform(3.0, 4.0, 10))
    real = shutil.rmtree

    def interrupted(path, *a, **k):
        os.remove(os.path.join(path, "zarr.json"))  # the first entry gone, then the interrupt
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        remove_store_folder(store)
    monkeypatch.setattr(shutil, "rmtree", real)
    assert not os.path.lexists(store) and (tmp_path / ".pilot.zarr.removing").is_dir()
    _pilot(tmp_path / "pilot.zarr", rng.uniform(2.0, 3.0, 10), rng.uniform(3.0, 4.0, 10))  # the rerun's new store
    remove_store_folder(store)  # and the run after it: the half-deleted folder goes too
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_results_are_strict_json_and_a_reused_run_that_diverged_is_trained_again(tmp_path):
    from tokdyn.curriculum.ab import _finite, _write_results

    results = {"runs": [{"arm": "base", "seed": 0, "final": [2.0, float("nan")], "final_mixture": float("nan")},
                        {"arm": "base", "seed": 1, "final": [2.0, 2.1], "final_mixture": 2.05}],
               "sd": np.float64("nan")}  # fmt: skip
    _write_results(tmp_path / "results.json", results)

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    got = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    assert got["runs"][0]["final"] == [2.0, None] and got["sd"] is None
    assert [_finite(r) for r in got["runs"]] == [False, True]
    older = json.loads(json.dumps({"final": [2.0, float("nan")]}))  # a results.json written before: a bare NaN
    assert not _finite(older) and _finite({"final": [2.0, 2.1], "arm": "base"})
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary left


def test_progress_lines_show_every_character(capsys):
    from tokdyn._text import say

    say("wrote /tmp/nl\nFAKE: done \u202e/report.html")
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "\u202e" not in out and "nl\\nFAKE" in out
