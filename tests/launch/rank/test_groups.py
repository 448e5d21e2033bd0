"""A worker's process groups: made again after destroy_process_group in one function, and
the destroyed ones kept until the worker's exit (a bounded number of them)."""

from __future__ import annotations

import socket
from pathlib import Path

from notebook_accel import debug_launcher
from tests.launch.helpers import socket_inodes


def _groups_one_after_another(count: int, gate: str | None = None) -> list[float]:
    """``count`` groups in turn, each summing its ranks' ``i + 1``. With ``gate`` (a folder),
    rank 0 marks each destroy there and the other ranks meet again only once it has: a store
    whose server rank 0 hosts goes with that destroy (torch's own race otherwise: the next
    init meets in the closing server, "Broken pipe")."""
    import os
    import time

    import torch
    import torch.distributed as dist

    sums = []
    for i in range(count):
        dist.init_process_group("gloo")
        value = torch.tensor([float(i + 1)])
        dist.all_reduce(value)
        sums.append(value.item())
        dist.destroy_process_group()
        assert not dist.is_initialized()
        if gate is not None:
            destroyed = Path(gate, str(i))
            if os.environ["RANK"] == "0":
                destroyed.touch()
            while not destroyed.exists():
                time.sleep(0.01)
    return sums


def test_a_group_made_again_after_destroy_meets_in_fresh_keys() -> None:
    # Before: "Read error ... Connection reset by peer" in the second group. torch names a
    # group made after a destroy as it named the last one, so it read that group's gloo
    # addresses from the launch's store.
    assert (
        debug_launcher(_groups_one_after_another, (3,), num_processes=3, output="none")
        == [[3.0, 6.0, 9.0]] * 3
    )


def _many_groups(count: int) -> list[int]:
    import torch.distributed as dist

    open_sockets = []
    for _ in range(count):
        dist.init_process_group("gloo")
        dist.barrier()
        dist.destroy_process_group()
        open_sockets.append(len(socket_inodes()))
    # The peer's exit would close its ends (and gloo ours) under a count not yet taken: stay
    # in one more group until every rank has counted.
    dist.init_process_group("gloo")
    dist.barrier()
    return open_sockets


def test_destroyed_groups_wait_for_the_exit_but_only_a_few() -> None:
    from notebook_accel.launch.rank.worker_store import _KEPT_GROUPS

    count = _KEPT_GROUPS + 6
    for sockets in debug_launcher(_many_groups, (count,), num_processes=2, output="none"):
        # The first groups stay open after their destroy (their sockets wait for the exit)...
        assert sockets[_KEPT_GROUPS - 1] > sockets[0]
        # ...then each new one ends the oldest: the count stops growing.
        assert len(set(sockets[_KEPT_GROUPS:])) == 1, sockets


def _torch_store_twice(port: int, gate: str) -> list[float]:
    import os

    # torch's own env:// (a TCPStore that rank 0 hosts at MASTER_PORT), twice on one port: a
    # group over a store that is not the launch's is torn down by its destroy, as in torch.
    del os.environ["NOTEBOOK_ACCEL_STORE"]
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    os.environ["MASTER_PORT"] = str(port)
    return _groups_one_after_another(2, gate)


def test_a_group_over_torchs_own_store_is_torn_down_by_its_destroy(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert (
        debug_launcher(_torch_store_twice, (port, str(tmp_path)), num_processes=2, output="none")
        == [[2.0, 4.0]] * 2
    )


def _two_trainings() -> list[float]:
    import torch

    from notebook_accel import Accelerator

    sums = []
    for i in range(2):  # e.g. two models trained in turn, each run ending as accelerate's do
        accelerator = Accelerator(cpu=True)
        sums.append(accelerator.reduce(torch.ones(1) * (i + 1), reduction="sum").item())
        accelerator.end_training()  # destroys the group this Accelerator made
    return sums


def test_a_second_accelerator_after_end_training_makes_a_working_group() -> None:
    assert debug_launcher(_two_trainings, num_processes=2, output="none") == [[2.0, 4.0]] * 2
