"""Hunt 25 on stores written by older tokdyn versions and read by this one. Each old layout is
built by writing its metadata the way the old code did (the commit copied is named in each test),
not by running old commits, so the tests run from any clone."""

from __future__ import annotations

import numpy as np

from tests.test_hunt18_axes import _append_row, _d_store, _set_attr
from tokdyn.analysis import axis_run
from tokdyn.axes import assemble_axis, axis_run_problem

BUDGETS = (1000, 2000, 4000, 8000, 16000, 32000)  # six points: a default fit of the axis

# -- an axis run assembled before its sources recorded their row counts ---------------------------


def _old_axis(st, axis="D"):
    """An axis run as tokdyn made it before 7302a8e (2026-12-04; e.g. 760b5f8, 89bde4d,
    8bcea4c): each ``sources`` entry is ``{"store": <the URL as typed>, "run", <axis attr>}``,
    without ``n_committed``, ``run_id`` or ``same_store``, and no ``named``."""
    run = assemble_axis(st, axis)
    attr = run.attrs["axis_attr"]
    old = [{"store": "d.zarr", "run": s["run"], attr: s[attr]} for s in run.attrs["sources"]]
    st = _set_attr(st, run.name, "sources", old)
    group = st.run(run.name)._group
    meta = {k: v for k, v in group.attrs["tokdyn_run"].items() if k != "named"}
    group.attrs["tokdyn_run"] = meta
    return st


def test_an_old_axis_whose_source_has_new_rows_is_not_used_as_current(tmp_path):
    """Its sources recorded no row counts, so no change of theirs was ever seen: a source
    recorded further (another final row) left the old axis in use without a word, its
    reconstruction that of the rows as they were."""
    st = _old_axis(_d_store(tmp_path / "d.zarr", budgets=BUDGETS))
    _append_row(st, "r5", 0.5, 3300)  # trained on: another final row, at its new budget
    st = _set_attr(st, "r5", "data_budget", 33000)
    why = axis_run_problem(st.run("axis-D"), "D")
    assert why is not None and "earlier tokdyn" in why
    got = axis_run(st, "D")
    assert got.assembled  # assembled again from the sources as they are now
    final = st.run("axis-D").losses()[-1]
    np.testing.assert_allclose(final, np.full(final.shape, 0.5))  # r5's new final row
    assert axis_run_problem(st.run("axis-D"), "D") is None  # and now told current


def test_an_axis_without_source_ids_whose_source_was_recorded_again_is_not_current(tmp_path):
    """An axis assembled 2026-12-04..05 (after 7302a8e, before 48da947) recorded each source's
    rows but not its run id: a source deleted and recorded again with as many rows (other
    losses) was taken as unchanged. An axis assembled now from runs without ids (made before
    them) records ``run_id: None`` and is current."""
    st = _d_store(tmp_path / "d.zarr", budgets=BUDGETS)
    run = assemble_axis(st, "D")
    assert axis_run_problem(st.run("axis-D"), "D") is None
    st = _set_attr(st, "axis-D", "sources", [{k: v for k, v in s.items() if k != "run_id"} for s in run.attrs["sources"]])
    rows = st.run("r2").n_committed
    st.delete_run("r2")
    with st.create_run("r2", capacity=3, attrs={"data_budget": 4000, "tokens_per_step": 10, "sweep": "D",
                                                "model_config": {"w": 1}}).writer() as w:  # fmt: skip
        for step in (200, 400)[:rows]:
            w.append(np.full(st.probe.n_tokens, 2.5, np.float32), step=step, tokens_seen=step * 10)
    why = axis_run_problem(st.run("axis-D"), "D")
    assert why is not None and "no id of its source run 'r" in why
    assert axis_run(st, "D").assembled
    np.testing.assert_allclose(st.run("axis-D").losses()[2], 2.5)  # r2's new final row, budget 4000 third
    assert axis_run_problem(st.run("axis-D"), "D") is None


def test_an_old_axis_whose_sources_are_gone_keeps_its_own_rows(tmp_path):
    """A source that cannot be read is not a change (as for an axis made now): the axis run
    holds its own copy of each source's final row."""
    st = _old_axis(_d_store(tmp_path / "d.zarr"))
    before = st.run("axis-D").losses()
    for name in ("r0", "r1", "r2", "r3", "r4"):
        st.delete_run(name)
    assert axis_run_problem(st.run("axis-D"), "D") is None
    np.testing.assert_array_equal(st.run("axis-D").losses(), before)
