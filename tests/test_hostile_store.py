"""Hostile input on the store side (a QA pass found each class): a scheduler address that is no
scheduler, a store whose probe group is gone, domain indices outside the domain names, a fit
resumed over a deleted field, and the npz import's edges (byte order, huge steps, empty names)."""

from __future__ import annotations

import shutil
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import tokdyn
from reliability_fixtures import cli_error_line
from test_hostile import fitted_store
from tokdyn.cli import main
from tokdyn.errors import InputError

pytest.importorskip("distributed")


# -- a scheduler address that is no dask scheduler --------------------------------------------


def _server(banner: bytes | None) -> tuple[str, socket.socket]:
    """A TCP server that accepts one connection and then says ``banner`` (None: nothing) and
    holds the connection open."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()

    def serve():
        c, _ = s.accept()
        if banner:
            c.sendall(banner)
        time.sleep(30)
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"tcp://127.0.0.1:{s.getsockname()[1]}", s


@pytest.mark.parametrize("banner, says", [(None, "did not answer within"), (b"SSH-2.0-OpenSSH_9.6\r\n", "did not answer as a dask scheduler")],
                         ids=["silent", "another service"])  # fmt: skip
def test_a_scheduler_address_that_is_no_scheduler_is_one_line_in_bounded_time(banner, says, tmp_path, capsys, monkeypatch):
    import tokdyn.fit.job as job

    monkeypatch.setattr(job, "SCHEDULER_TIMEOUT", 2.0)
    path = str(tmp_path / "s.zarr")
    fitted_store(path, fit=False)
    address, sock = _server(banner)
    t0 = time.monotonic()
    assert main(["fit", path, "--scheduler", address, "--no-progress"]) == 1
    assert time.monotonic() - t0 < 30
    line = cli_error_line(capsys.readouterr().err)
    assert says in line and address in line and "out of memory" not in line
    sock.close()


def test_a_real_scheduler_passes_the_check():
    import distributed

    from tokdyn.fit.job import check_scheduler

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        check_scheduler(cluster.scheduler_address)


# -- a store whose probe group is gone ----------------------------------------------------------


@pytest.mark.parametrize("damage", ["probe/zarr.json", "probe"])
@pytest.mark.parametrize("argv", [["info"], ["export-npz", "{tmp}/x.npz"], ["fit", "--no-progress"], ["spectrum"], ["reconstruct"]],
                         ids=lambda a: a[0])  # fmt: skip
def test_every_command_on_a_store_without_its_probe_group_is_one_line(damage, argv, tmp_path, capsys):
    path = tmp_path / "s.zarr"
    fitted_store(str(path))
    target = path / damage
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    assert main([argv[0], str(path), *[a.format(tmp=tmp_path) for a in argv[1:]]]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert "probe group" in line and "internal error" not in line


# -- domain indices ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(n_names=hs.integers(1, 4), indices=hs.lists(hs.integers(-3, 6), min_size=1, max_size=12))
def test_domain_indices_must_name_a_domain(n_names, indices):
    arrays = {"sample_id": np.zeros(len(indices), np.int32), "token_pos": np.arange(1, len(indices) + 1, dtype=np.int32),
              "domain": np.asarray(indices, np.int32)}  # fmt: skip
    names = tuple(f"d{i}" for i in range(n_names))
    if all(0 <= i < n_names for i in indices):
        assert tokdyn.ProbeSet(None, arrays, domains=names).domains == names
    else:
        with pytest.raises(InputError, match="'domain' holds indices"):
            tokdyn.ProbeSet(None, arrays, domains=names)


def test_an_npz_whose_domain_indices_name_no_domain_is_refused(tmp_path, capsys):
    t = np.array([1.0, 10.0, 100.0])
    np.savez(tmp_path / "a.npz", axis_values=t, loss_matrix=np.ones((4, 3), np.float32), axis_name=np.array(["T"]),
             domain=np.array([0, 1, 5, 9]), probe_domains=np.array(["web", "code"]))  # fmt: skip
    assert main(["import-npz", str(tmp_path / "a.npz"), str(tmp_path / "s.zarr")]) == 1
    assert "'domain' holds indices 0..9" in cli_error_line(capsys.readouterr().err)
    assert not (tmp_path / "s.zarr").exists()


# -- a fit resumed over a deleted field --------------------------------------------------------


@pytest.mark.parametrize("field", ["mu", "class_code", "crc", "done"])
def test_a_resumed_fit_refuses_a_fit_with_a_field_deleted(field, tmp_path, capsys):
    path = tmp_path / "s.zarr"
    fitted_store(str(path))
    shutil.rmtree(path / "runs" / "r" / "fit" / field)
    assert main(["fit", str(path), "--no-progress"]) == 1
    line = cli_error_line(capsys.readouterr().err)
    assert f"fit/{field}" in line and "--refit" in line
    assert main(["fit", str(path), "--refit", "--no-progress"]) == 0
    assert np.isfinite(tokdyn.open_store(str(path)).run("r").fit.read(["mu"])["mu"]).any()


# -- the npz import's edges --------------------------------------------------------------------


def _npz(path, **over):
    t = np.array([1.0, 10.0, 100.0])
    arrays = dict(axis_values=t, loss_matrix=np.arange(12, dtype=np.float32).reshape(4, 3) / 4, axis_name=np.array(["T"]))
    np.savez(path, **{**arrays, **over})
    return path


def test_a_big_endian_loss_matrix_imports_as_its_native_dtype(tmp_path):
    native = _npz(tmp_path / "n.npz")
    big = _npz(tmp_path / "b.npz", loss_matrix=(np.arange(12, dtype=np.float32).reshape(4, 3) / 4).astype(">f4"))
    from tokdyn.interchange import import_npz

    a = import_npz(native, tmp_path / "a.zarr", run="r")
    b = import_npz(big, tmp_path / "b.zarr", run="r")
    assert b.losses().dtype == a.losses().dtype == np.float32
    np.testing.assert_array_equal(a.losses(), b.losses())


@pytest.mark.parametrize("argv, says", [
    (["import-npz", "{huge}", "{tmp}/h.zarr"], "below 2^63"),
    (["import-npz", "{ok}", "{tmp}/e.zarr", "--run="], "empty"),
    (["fit", "{tmp}/f.zarr", "--vocab-size", "0", "--no-progress"], "--vocab-size 0"),
], ids=["huge step", "empty run name", "vocab size 0"])  # fmt: skip
def test_import_and_fit_edges_are_one_line(argv, says, tmp_path, capsys):
    huge = _npz(tmp_path / "huge.npz", axis_values=np.array([1.0, 2.0, 1e30]))
    ok = _npz(tmp_path / "ok.npz")
    fitted_store(str(tmp_path / "f.zarr"), fit=False)
    assert main([a.format(tmp=tmp_path, huge=huge, ok=ok) for a in argv]) == 1
    err = capsys.readouterr().err
    assert says in cli_error_line(err) and "Warning" not in err
    assert not (tmp_path / "h.zarr").exists() and not (tmp_path / "e.zarr").exists()
