"""Hunt 25: the training-time axis at its edges (step 0, resumed runs at 1e6, steps as tokens
seen, near 2**53 and beyond, narrow and wide spans), end to end."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs


# -- a figure's axis names the value at every tick, on any part of the axis ---------------------


def _tick_labels(lo: float, hi: float, width_in: float | None) -> list[tuple[float, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tokdyn.report import _log_ticks

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_xlim(lo, hi)
    _log_ticks(ax.xaxis, lo, hi, width_in=width_in)
    fig.canvas.draw()
    shown = [(t.get_loc(), t.label1.get_text()) for t in ax.xaxis.get_major_ticks()
             if lo - 1e-9 <= t.get_loc() <= hi + 1e-9 and t.label1.get_text()]  # fmt: skip
    plt.close(fig)
    return shown


@settings(max_examples=25, deadline=None)
@given(lo=hs.floats(-2.0, 18.0), span=hs.floats(0.05, 4.0), width_in=hs.sampled_from([None, 1.5, 3.0, 8.0]))
def test_every_tick_label_names_its_value_at_any_step_scale(lo, span, width_in):
    """A run resumed at step 1,000,000 and recorded to 1,300,000 (or tokens seen, 1e11..1e12)
    had its ticks at 1.0, 1.1, 1.2, 1.3e6 all labelled "1e6" (and 1.5e6 "2e6")."""
    for loc, text in _tick_labels(lo, lo + span, width_in):
        assert float(text.replace(",", "")) == pytest.approx(10.0**loc, rel=1e-9), (loc, text)


@pytest.mark.parametrize("lo, hi", [(6.0, 6.1), (6.0, 6.3), (12.0, 12.3), (12.0, 12.45), (np.log10(2e5), np.log10(3e5))])
@pytest.mark.parametrize("width_in", [None, 3.0])
def test_a_short_axis_at_any_scale_has_two_distinct_labels(lo, hi, width_in):
    """Steps 1e12 to 2.0e12 (0.3 decades of tokens seen) had one label, "1e12", in view."""
    texts = [text for _, text in _tick_labels(lo, hi, width_in)]
    assert len(texts) >= 2 and len(set(texts)) == len(texts), texts


def test_a_time_in_the_report_text_keeps_two_digits_past_1e5():
    from tokdyn.report import _value_text

    assert [_value_text(v) for v in (1e5, 1.1e5, 1.5e6, 2.3e12, 9.99e5)] == ["1e5", "1.1e5", "1.5e6", "2.3e12", "1e6"]
    assert [_value_text(v) for v in (1.0, 30.0, 1234.0, 99_000.0)] == ["1", "30", "1,200", "99,000"]
    assert [_value_text(v) for v in (float("inf"), 1e300)] == ["inf", "1e300"]  # as before (no mantissa to split)


# -- record-offline: a folder whose steps no fit can tell apart is refused before any work --------


@pytest.mark.parametrize("steps, said", [
    ([10, 2**53, 2**53 + 1], "9007199254740992 and 9007199254740993"),  # one float64: the order rule stopped it after a row
    ([10, 10**15, 10**15 + 1], "too close to tell apart on a log scale"),  # one log10: recorded, then no fit could use it
])  # fmt: skip
def test_record_offline_refuses_steps_the_axis_cannot_tell_apart_before_recording(tmp_path, capsys, steps, said):
    """Steps as tokens seen, near 2**53: the folder was evaluated up to the step that its float64
    axis value tied, and the command stopped there, its run holding the rows before; a log10 tie
    was recorded whole and then every fit refused the run. The folder is known in full first (as
    assemble_axis and import-npz know theirs): such steps are now refused before anything runs."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from offline_fixtures import make_model, make_probe, save_torch, write_spec
    from reliability_fixtures import cli_error_line, run_cli

    import tokdyn

    folder = tmp_path / "ck"
    folder.mkdir()
    write_spec(folder)
    for i, step in enumerate(steps):
        save_torch(make_model(i), folder / f"step_{step}.pt")
    store = tokdyn.open_store(tmp_path / "s.zarr", make_probe(), mode="w")
    code, err = run_cli(["record-offline", "--checkpoints", str(folder), "--out", str(store.url), "--run", "r",
                         "--no-progress", "--workers", "1"], capsys)  # fmt: skip
    assert code == 1 and said in cli_error_line(err), err
    assert "r" not in tokdyn.open_store(tmp_path / "s.zarr").runs  # nothing evaluated, no run made


# -- docs/fitting.md's quick start on a run that has no step 0 -------------------------------------


@pytest.mark.parametrize("first", [0, 1, 1_000_000])
def test_the_fitting_quick_start_keeps_every_positive_step(first):
    """The recipe was ``log_axis(steps[1:])`` and ``losses[:, 1:]``: on a run resumed at step
    1,000,000 (or starting at 1) it dropped the first real checkpoint without a word."""
    import re
    from pathlib import Path

    from tokdyn.fit.synthetic import plant_sigmoids

    text = (Path(__file__).parent.parent / "docs" / "fitting.md").read_text()
    block = re.search(r"## Quick start.*?```python\n(.*?)```", text, re.S).group(1)
    steps = np.unique(np.round(np.geomspace(max(first, 1), max(first, 1) * 1e3, 12)).astype(np.int64))
    steps = np.r_[0, steps] if first == 0 else steps
    positive = steps[steps > 0]
    p = plant_sigmoids(6, np.log10(positive.astype(float)), rng=np.random.default_rng(0), noise=0.02)
    losses = p.Y if first else np.c_[p.Y[:, :1], p.Y]
    env = {"steps": steps, "losses": losses}
    exec(block.split("fit.mu")[0].replace("vocab_size=50304", "vocab_size=64"), env)  # up to the fit
    assert np.array_equal(env["x"], np.log10(positive.astype(float)))
    assert env["fit"].mu.shape == (6,) and np.nanmax(np.abs(env["fit"].mu - p.truth["mu"])) < 0.2


# -- the online recorder: a step whose axis value ties the row before's -----------------------------


B = 2**53


def test_the_recorder_refuses_at_the_call_a_step_whose_axis_value_ties_and_keeps_the_rows_before(tmp_path):
    """record(2**53 + 1) after record(2**53) (steps as tokens seen) was taken at the call; its
    writer's thread then refused it (one float64 axis value) and stopped, and close() raised a
    WriterError saying "Rows up to step None are committed": steps 0 and 2**53, queued with it,
    were lost too. The call now refuses it as the writer would, and the rows before are kept."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from offline_fixtures import make_model, make_probe

    import tokdyn
    from tokdyn.errors import StepOrderError
    from tokdyn.record import TokenLossRecorder

    probe = make_probe()
    path = tmp_path / "s.zarr"
    tokdyn.open_store(path, probe, mode="w")
    with TokenLossRecorder(make_model(0), probe, path, "r", schedule=[0, B, B + 1024]) as rec:
        rec.record(0)
        rec.record(B)
        with pytest.raises(StepOrderError, match="9007199254740993"):
            rec.record(B + 1)
        rec.record(B + 1024)  # an axis value of its own, and a log10 of its own
    run = tokdyn.open_store(path).run("r")
    assert run.steps.tolist() == [0, B, B + 1024] and np.all(np.diff(run.axis_values) > 0)


@pytest.mark.parametrize("steps", [[0, 10, B, B + 1], [0, 10**15, 10**15 + 1]])
def test_a_schedule_whose_steps_one_axis_value_holds_is_refused(steps):
    """A recorder given such a schedule recorded until the second step, then stopped (float64
    tie) or made a run no fit takes (log10 tie); the schedule is known in full first."""
    from tokdyn.errors import InputError
    from tokdyn.schedule import explicit_schedule

    with pytest.raises(InputError, match="tell apart"):
        explicit_schedule(steps)
    assert explicit_schedule([0, 10, B, B + 1024]).tolist() == [0, 10, B, B + 1024]


@pytest.mark.parametrize("lo, hi", [(6.0, 6.1), (6.0, 6.3), (3.0, 3.2), (12.0, 12.3), (17.5, 18.6), (15.9, 16.0)])
@pytest.mark.parametrize("ncols", [1, 4])
def test_tick_labels_of_a_short_axis_at_any_scale_do_not_overlap(lo, hi, ncols):
    """Steps 1e6..1.26e6 in the report's panels: labels '1e6' written over each other (and, once
    they named their values, '9.9e5' in the axis margin over '1e6')."""
    import sys

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_hunt13_report_stores import _overlapping_labels

    from tokdyn import report

    fig, axes = plt.subplots(1, ncols, figsize=(2.9 * ncols + 1, 4.4), layout="constrained", squeeze=False)
    for ax in axes.flat:
        x = np.linspace(lo, hi, 50)
        ax.plot(x, x)
        report._axis_x(ax, "T", x)
    try:
        assert _overlapping_labels(axes.flat[0]) == []
    finally:
        plt.close(fig)


# -- record-offline --resume: a checkpoint appended later, before the last committed step -----------


def test_resume_summary_does_not_call_an_out_of_order_step_committed(tmp_path, capsys):
    """A folder recorded at steps 0, 10, 100, then given step_50.pt and step_200.pt: the warning
    said step 50 is not recorded, and the summary line then said "4 already committed" (3 were)."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from offline_fixtures import make_model, make_probe, save_torch, write_spec
    from reliability_fixtures import run_cli

    import tokdyn

    folder = tmp_path / "ck"
    folder.mkdir()
    write_spec(folder)
    for i, step in enumerate([0, 10, 100]):
        save_torch(make_model(i), folder / f"step_{step}.pt")
    store = str(tokdyn.open_store(tmp_path / "s.zarr", make_probe(), mode="w").url)
    argv = ["record-offline", "--checkpoints", str(folder), "--out", store, "--run", "r", "--no-progress", "--workers", "1"]
    assert run_cli(argv, capsys)[0] == 0
    for i, step in [(5, 50), (6, 200)]:
        save_torch(make_model(i), folder / f"step_{step}.pt")
    capsys.readouterr()
    from tokdyn.cli import main

    assert main(argv + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "3 already committed" in out and "1 before the last committed step, not recorded (step 50)" in out, out
    assert tokdyn.open_store(store).run("r").steps.tolist() == [0, 10, 100, 200]
