"""env.py: the only module that touches os.environ."""

from __future__ import annotations

import os

import pytest

from notebook_accel import env


def test_read_distributed_from_torchrun_and_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    single = env.read_distributed()
    assert (single.rank, single.world_size, single.local_rank) == (0, 1, 0)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    slurm = env.read_distributed()
    assert (slurm.rank, slurm.world_size, slurm.local_rank, slurm.local_world_size) == (3, 4, 1, 2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    torchrun = env.read_distributed()
    assert (torchrun.rank, torchrun.world_size) == (1, 2)


def test_overridden_restores_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NA_TEST_A", "old")
    monkeypatch.delenv("NA_TEST_B", raising=False)
    with env.overridden({"NA_TEST_A": "new", "NA_TEST_B": "set"}):
        assert os.environ["NA_TEST_A"] == "new" and os.environ["NA_TEST_B"] == "set"
    assert os.environ["NA_TEST_A"] == "old" and "NA_TEST_B" not in os.environ


def test_no_other_module_touches_os_environ() -> None:
    from pathlib import Path

    package = Path(env.__file__).parent
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "env.py" and "os.environ" in path.read_text()
    ]
    assert offenders == []


def test_slurm_compressed_task_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "9")
    monkeypatch.setenv("SLURM_PROCID", "8")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4(x2),1")
    monkeypatch.setenv("SLURM_NODEID", "2")
    assert env.read_distributed().local_world_size == 1
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert env.read_distributed().local_world_size == 4
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3(x3)")
    assert env.read_distributed().local_world_size == 3
    assert env.slurm_tasks_on_node("2") == 2


def test_loopback_interface_is_this_machine_s() -> None:
    import socket

    names = [name for _, name in socket.if_nameindex()]
    assert env.loopback_interface() in names
    assert env.loopback_interface(["lo0", "en0"]) == "lo0"  # macOS
    assert env.loopback_interface(["lo", "eth0"]) == "lo"  # Linux
    assert env.loopback_interface([], platform="darwin") == "lo0"
