"""What the curriculum does with its pilot and its output files, each against an independent answer:

- outputs (a mixture schedule, a learnability table) are written through a new temporary file
  created exclusively in the destination folder: a file or link planted at any name is never
  written through;
- a pilot whose axis is not training steps (D: tokens, M: parameters) is refused in one line,
  and a schedule whose steps meet none of the pilot's drops says there is nothing to judge
  (not that the domains fall in proportion);
- an event counts by the drop it makes inside the pilot's observed range: events fitted
  outside it, and pairs that cancel, carry no mass, so two domains of identical planted timing
  get equal weights, while a positive control of different timings gets different ones.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tokdyn
from reliability_fixtures import cli_error_line, run_cli
from tokdyn.cli import main
from tokdyn.curriculum import load_table, token_targets
from tokdyn.curriculum.learnability import seen_drops
from tokdyn.curriculum.mixture import (ContextSchedule, DomainRates, MixtureConfig, MixtureSchedule, enrichment_verdict,
                                       load_mixture_schedule, pilot_events)  # fmt: skip
from tokdyn.errors import InputError
from tokdyn.spectrum import Events

STEPS = np.unique(np.round(np.geomspace(10, 100_000, 30)).astype(np.int64))  # x = 1 .. 5
BYTE = {"kind": "byte", "vocab_size": 257, "eot_id": 256}


def planted_pilot(path, mu_a, mu_b, *, axis: str = "T", seed: int = 0, noise: float = 0.05, steps=STEPS,
                  run: str = "pilot") -> str:  # fmt: skip
    """A fitted two-domain pilot: windows of one target each, domain ``a``'s learned at
    ``mu_a`` (one per token, 3 nats, width 0.1 decades), domain ``b``'s at ``mu_b``."""
    rng = np.random.default_rng(seed)
    mu = np.concatenate([mu_a, mu_b])
    n = mu.size
    probe = tokdyn.ProbeSet.from_tokens(rng.integers(97, 123, size=(n, 2)), domain=np.repeat([0, 1], [len(mu_a), len(mu_b)]),
                                        domains=("a", "b"), tokenizer=BYTE)  # fmt: skip
    x = np.log10(steps)
    st = tokdyn.open_store(path, probe, mode="w")
    with st.create_run(run, axis=axis, capacity=len(steps)).writer() as w:
        for j, step in enumerate(steps):
            row = (1 + 3 / (1 + np.exp((x[j] - mu) / 0.1)) + noise * rng.standard_normal(n)).astype(np.float32)
            w.append(row, step=int(step) if axis == "T" else j, **({} if axis == "T" else {"axis_value": float(step)}))
    tokdyn.fit_run(tokdyn.open_store(path, mode="r+").run(run), progress=False)
    return str(path)


@pytest.fixture(scope="module")
def pilot(tmp_path_factory) -> str:
    rng = np.random.default_rng(5)
    return planted_pilot(tmp_path_factory.mktemp("pilot") / "p.zarr", rng.uniform(2.0, 3.0, 60), rng.uniform(3.0, 4.0, 60))


def schedule_argv(store: str, out, *extra: str) -> list[str]:
    return ["curriculum", "schedule", store, "--run", "pilot", "--steps", "1000", "--out", str(out), *extra]


# -- outputs: never through a planted name -------------------------------------------------


def _plant(folder, names) -> list:
    """A victim file and a link to it at each of ``names`` in ``folder``."""
    victim = folder / "victim.txt"
    victim.write_text("precious data\n")
    links = []
    for name in names:
        (folder / name).symlink_to(victim)
        links.append(folder / name)
    return links


def test_the_schedule_is_never_written_through_a_planted_file_or_link(pilot, tmp_path, capsys):
    out = tmp_path / "sched.json"
    links = _plant(tmp_path, ["sched.json.tmp", ".sched.json.tmp"])  # the old fixed name, and a guess at a hidden one
    (tmp_path / "other.json.tmp").write_text("a plain file at a temporary-looking name\n")
    code, err = run_cli(schedule_argv(pilot, out), capsys)
    assert code == 0, err
    assert (tmp_path / "victim.txt").read_text() == "precious data\n"
    assert (tmp_path / "other.json.tmp").read_text() == "a plain file at a temporary-looking name\n"
    assert all(p.is_symlink() for p in links)  # left where they were, untouched
    assert not out.is_symlink() and load_mixture_schedule(out).weights(0).shape == (2,)
    umask = os.umask(0)
    os.umask(umask)
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~umask)  # as open() makes a file, not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["sched.json", "victim.txt", "other.json.tmp",
                                                                 "sched.json.tmp", ".sched.json.tmp"])  # fmt: skip


def test_a_link_at_the_output_itself_is_replaced_not_written_through(pilot, tmp_path, capsys):
    _plant(tmp_path, ["sched.json"])
    code, err = run_cli(schedule_argv(pilot, tmp_path / "sched.json"), capsys)
    assert code == 0, err
    assert (tmp_path / "victim.txt").read_text() == "precious data\n"
    assert not (tmp_path / "sched.json").is_symlink()


def test_the_table_is_never_written_through_its_old_predictable_name(pilot, tmp_path, capsys):
    """``LearnabilityTable.save`` wrote ``.NAME.tmp-PID.npz``: the PID of this very process."""
    _plant(tmp_path, [f".learn.npz.tmp-{os.getpid()}.npz", "learn.npz.tmp"])
    code, err = run_cli(["curriculum", "build", pilot, "--run", "pilot", "--out", str(tmp_path / "learn.npz"), "--min-count", "1"],
                        capsys)  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "victim.txt").read_text() == "precious data\n"
    assert load_table(tmp_path / "learn.npz").vocab_size == 257
    assert {p.name for p in tmp_path.iterdir()} == {"victim.txt", "learn.npz", f".learn.npz.tmp-{os.getpid()}.npz", "learn.npz.tmp"}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    import tokdyn.curriculum.mixture as mixture

    x = np.linspace(0, 3, 11)
    sched = MixtureSchedule(DomainRates(("a", "b"), x, np.tile([2.0, 1.0], (11, 1))), MixtureConfig(total_steps=20))
    out = tmp_path / "m.json"
    out.write_text("the previous schedule")

    def boom(fh, arr):
        fh.write("[half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mixture, "_write_rows", boom)
    with pytest.raises(InputError, match="cannot write the mixture schedule to .*m.json: No space left on device"):
        sched.save(out)
    assert out.read_text() == "the previous schedule" and [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_an_output_folder_that_does_not_exist_is_one_line(pilot, tmp_path, capsys):
    code, err = run_cli(schedule_argv(pilot, tmp_path / "nowhere" / "m.json"), capsys)
    line = cli_error_line(err)
    assert code == 1 and "cannot write the mixture schedule" in line and "nowhere" in line and "internal error" not in line


# -- the pilot's axis ------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["D", "M"])
def axis_pilot(request, tmp_path_factory) -> tuple[str, str]:
    """The same planted events as a T pilot 1.5 decades apart, recorded on axis D or M."""
    rng = np.random.default_rng(3)
    values = np.unique(np.round(np.geomspace(1e6, 1e9, 20)).astype(np.int64))
    path = tmp_path_factory.mktemp(f"axis{request.param}") / "p.zarr"
    return planted_pilot(path, rng.uniform(6.5, 7.0, 40), rng.uniform(8.0, 8.5, 40), axis=request.param, steps=values), request.param


def test_a_pilot_not_on_training_steps_is_refused_in_one_line(axis_pilot, tmp_path, capsys):
    store, axis = axis_pilot
    for argv in (schedule_argv(store, tmp_path / "m.json"),
                 ["curriculum", "build", store, "--run", "pilot", "--out", str(tmp_path / "t.npz")]):  # fmt: skip
        code, err = run_cli(argv, capsys)
        line = cli_error_line(err)
        assert code == 1 and f"lies on the {axis} axis" in line and "axis T" in line and "internal error" not in line, line
    assert not list(tmp_path.iterdir())  # nothing written
    with pytest.raises(InputError, match=f"on the {axis} axis"):
        pilot_events(store, "pilot")


def test_a_schedule_whose_steps_meet_no_drop_says_there_is_nothing_to_judge(pilot, tmp_path, capsys):
    """The pilot's drops lie at steps 100..10000 (x 2..4, observed from x 1); a schedule of 5
    steps (x 0..0.7) sees none of them."""
    argv = ["curriculum", "schedule", pilot, "--run", "pilot", "--steps", "5", "--out", str(tmp_path / "m.json")]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0 and "no drop in range to judge" in out and "in proportion" not in out, out
    assert "the schedule's steps 1..5" in out and "are x 0.00..0.70" in out
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["enrichment"]["baseline_rate"] == 0.0 and "no drop in range" in got["verdict"]
    # steps that do meet the drops: the verdict judges them
    assert main(schedule_argv(pilot, tmp_path / "m.json")) == 0
    assert "no drop in range" not in capsys.readouterr().out


def test_the_verdict_on_rates_that_never_fall_and_on_rates_in_proportion():
    x = np.linspace(0, 3, 11)
    none = MixtureSchedule(DomainRates(("a", "b"), x, np.zeros((11, 2))), MixtureConfig(total_steps=50)).enrichment()
    assert none["baseline_rate"] == 0.0 and "no drop in range to judge" in enrichment_verdict(none)
    same = MixtureSchedule(DomainRates(("a", "b"), x, np.ones((11, 2))), MixtureConfig(total_steps=50)).enrichment()
    assert same["baseline_rate"] == pytest.approx(1.0) and "in proportion" in enrichment_verdict(same)
    old = {k: v for k, v in same.items() if k != "baseline_rate"}  # a dict written before the field existed
    assert "in proportion" in enrichment_verdict(old)


# -- events count by the drop they make inside the observed range ----------------------------


def _paired_events(n: int = 200, seed: int = 0):
    """Domain a: one event a token (3 nats at mu ~ U(2, 3.5), width 0.1). Domain b: the same
    events, token for token, but drawn as a fit draws them on noise: a token carries besides
    its event an event of 20 nats at x -0.5 (outside the observed 1..5: never seen), another
    carries its event as a +30 / -27 pair at the same place, another a cancelling pair
    partly past the range's end."""
    rng = np.random.default_rng(seed)
    mu = rng.uniform(2.0, 3.5, n)
    tok_a, tok_b = np.arange(n), np.arange(n, 2 * n)
    token, mus, s, delta = [tok_a, tok_b], [mu, mu.copy()], [np.full(n, 0.1), np.full(n, 0.1)], [np.full(n, 3.0), np.full(n, 3.0)]
    k = n // 4
    token.append(tok_b[:k]); mus.append(np.full(k, -0.5)); s.append(np.full(k, 0.1)); delta.append(np.full(k, 20.0))  # noqa: E702
    pair = tok_b[k : 2 * k]  # their 3 nats as +30 then -27 at the same mu
    delta[1][k : 2 * k] = 30.0
    token.append(pair); mus.append(mu[k : 2 * k]); s.append(np.full(k, 0.1)); delta.append(np.full(k, -27.0))  # noqa: E702
    edge = tok_b[2 * k : 3 * k]  # +25 / -25 at 5.4 and 5.4: cancel exactly, both mostly past the end
    token += [edge, edge]; mus += [np.full(k, 5.4), np.full(k, 5.4)]; s += [np.full(k, 0.2)] * 2  # noqa: E702
    delta += [np.full(k, 25.0), np.full(k, -25.0)]
    ev = Events(np.concatenate(token), np.concatenate(mus), np.concatenate(s), np.concatenate(delta), n_tokens=2 * n,
                x_range=(1.0, 5.0))  # fmt: skip
    return ev, np.repeat([0, 1], n)


@pytest.mark.parametrize("significance", [0.0, 2.0])
def test_unseen_and_cancelling_events_carry_no_mass(significance):
    ev, dom = _paired_events()
    rates = DomainRates.from_events(ev, dom, ("a", "b"), width=0.2, significance=significance)
    a, b = rates.rates[:, 0], rates.rates[:, 1]
    assert a.max() > 1.0  # the events' fall: 3 nats over 1.5 decades
    np.testing.assert_allclose(b, a, atol=1e-4 * a.max())  # the unseen events' seen tails: 20 nats * 3e-7
    sched = MixtureSchedule(rates, MixtureConfig(total_steps=100_000))
    w = sched.table_[[0, 9, 31, 99, 315, 999, 3161, 9999, 31622, 99_999]]
    np.testing.assert_allclose(w, 0.5, atol=2e-3)
    # a positive control: b's events a decade later (the same noise) are told apart
    later = Events(ev.token, np.where(ev.token >= 200, ev.mu + 1.0, ev.mu), ev.s, ev.delta, n_tokens=ev.n_tokens, x_range=ev.x_range)
    sched = MixtureSchedule(DomainRates.from_events(later, dom, ("a", "b"), width=0.2, significance=significance),
                            MixtureConfig(total_steps=100_000))  # fmt: skip
    assert sched.weights(315)[0] > 0.65 and sched.weights(9999)[1] > 0.65  # x 2.5: a falls; x 4: b does


def test_two_domains_of_identical_planted_timing_get_equal_weights(tmp_path, capsys):
    """End to end, as a pilot is fitted: each token of b is learned exactly when its pair in a is
    (independent noise); a fit of that noise puts events outside the observed range and pairs
    that cancel, which must not tell the domains apart."""
    mu = np.random.default_rng(0).uniform(2.0, 3.5, 300)
    store = planted_pilot(tmp_path / "same.zarr", mu, mu, seed=0)
    assert main(["curriculum", "schedule", store, "--run", "pilot", "--steps", "100000", "--out", str(tmp_path / "m.json"), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    w = load_mixture_schedule(tmp_path / "m.json").table_
    assert np.abs(w - 0.5).max() < 0.02, np.abs(w - 0.5).max(axis=1)[[0, 9, 99, 999, 9999, 99_999]]
    assert "no mixture schedule can help" in verdict
    # positive control: b learned half a decade later is scheduled after a
    store = planted_pilot(tmp_path / "later.zarr", mu, mu + 0.5, seed=0)
    assert main(["curriculum", "schedule", store, "--run", "pilot", "--steps", "100000", "--out", str(tmp_path / "l.json"), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    w = load_mixture_schedule(tmp_path / "l.json")
    assert w.weights(99)[0] > 0.6 and w.weights(9999)[1] > 0.6 and "more learnable-now loss drop" in verdict


def test_noise_alone_does_not_set_the_weights():
    """Two domains of 100 tokens with the same events plus, per token, independent +-0.1 nat
    events of noise at the range's ends (what a fit leaves on flat noise): raw, the ratio of
    two near-zero rates swings the weights there; shrunk by their errors, it does not."""
    rng = np.random.default_rng(1)
    n = 100
    mu = np.tile(rng.uniform(2.0, 3.5, n), 2)
    noise_mu = np.concatenate([rng.uniform(1.0, 1.1, 2 * n), rng.uniform(4.8, 5.0, 2 * n)])
    noise_d = rng.choice([-0.1, 0.1], 4 * n)
    ev = Events(np.concatenate([np.arange(2 * n), np.tile(np.arange(2 * n), 2)]), np.concatenate([mu, noise_mu]),
                np.concatenate([np.full(2 * n, 0.1), np.full(4 * n, 0.02)]), np.concatenate([np.full(2 * n, 3.0), noise_d]),
                n_tokens=2 * n, x_range=(1.0, 5.0))  # fmt: skip
    dom = np.repeat([0, 1], n)
    cfg = MixtureConfig(total_steps=100_000)
    shrunk = MixtureSchedule(DomainRates.from_events(ev, dom, ("a", "b")), cfg).table_
    assert np.abs(shrunk - 0.5).max() < 0.01
    raw = MixtureSchedule(DomainRates.from_events(ev, dom, ("a", "b"), significance=0), cfg).table_
    assert np.abs(raw[-1] - 0.5).max() > 0.05  # what the shrinkage is for (a check of this test)
    np.testing.assert_allclose(raw[316:3162], shrunk[316:3162], atol=0.01)  # where the domains fall, the same


def test_the_context_switch_ignores_unseen_and_cancelling_events():
    rng = np.random.default_rng(2)
    n = 400
    pos = np.tile([1, 9], n // 2)  # positions 1 (short band) and 9 (the band beyond 8)
    mu = rng.uniform(2.0, 3.0, n)
    clean = Events(np.arange(n), mu, np.full(n, 0.1), np.full(n, 3.0), n_tokens=n, x_range=(1.0, 4.0))
    far = np.flatnonzero(pos == 9)[:20]  # 20 of the long band's tokens with an unseen 20-nat event and a cancelling pair
    dirty = Events(np.concatenate([np.arange(n), far, far, far]),
                   np.concatenate([mu, np.full(20, 0.33), np.full(20, 2.9), np.full(20, 2.9)]), np.full(n + 60, 0.1),
                   np.concatenate([np.full(n, 3.0), np.full(20, 20.0), np.full(20, 30.0), np.full(20, -30.0)]),
                   n_tokens=n, x_range=(1.0, 4.0))  # fmt: skip
    got = [ContextSchedule.from_events(e, pos, contexts=(8, 16), total_steps=10_000, start=0.25).switch_steps[0] for e in (clean, dirty)]
    band = np.sort(mu[pos == 9])
    expected = 10 ** band[int(0.25 * band.size)] - 1  # the quarter of the band's (equal) drops
    assert got[0] == got[1] and abs(np.log10(got[0] + 1) - np.log10(expected + 1)) < 0.02, (got, expected)


def test_learnability_targets_count_seen_drops_and_net_weights():
    """v1: a 20-nat event at x 0.33 of a pilot observed from 1 is not a drop the token made; a
    +31 / -28 pair is a net drop of 3, weighed as 3."""
    ev = {"token": np.array([0, 1, 1, 2]), "mu": np.array([0.33, 2.5, 2.52, 2.0]), "s": np.full(4, 0.1),
          "delta": np.array([20.0, 31.0, -28.0, 3.0])}  # fmt: skip
    seen = seen_drops(ev, 3, (1.0, 4.0))
    assert seen["delta"][0] < 0.03 and seen["delta"][3] == pytest.approx(3.0, abs=1e-3)  # 0.1 % of its 20 nats was seen
    t = token_targets(seen, 3)
    assert t["delta"][0] < 0.03 and t["delta"][1] == pytest.approx(3.0, abs=0.01)
    assert t["weight"][1] == pytest.approx(3.0, abs=0.01) and t["mu"][1] == pytest.approx(2.5)


def test_loss_curves_that_go_up_and_down_by_noise_do_not_fall():
    steps = np.unique(np.round(np.geomspace(1, 10_000, 41)))
    x = np.log10(steps)
    flat = 3.0 + 0.1 * (-1.0) ** np.arange(steps.size)  # up, down, up, ...: no fall
    falling = 3.0 - 0.5 * x
    r = DomainRates.from_curves(steps, np.stack([flat, falling], 1), ("flat", "falling"), width=0.2)
    inner = (r.x > 0.5) & (r.x < 3.5)  # away from the curve's ends
    assert r.rates[inner, 0].max() < 0.05 and r.rates[inner, 1].min() == pytest.approx(0.5, rel=0.05)
