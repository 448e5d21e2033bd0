"""max_restarts: a launch that fails on its first attempt and succeeds after one restart.

The launcher sets TORCHELASTIC_RESTART_COUNT per attempt (as torchrun does), which the
functions below read to fail only the first time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from notebook_accel import debug_launcher
from notebook_accel.errors import LaunchTimeoutError


def flaky(rank_to_fail: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and int(os.environ["RANK"]) == rank_to_fail:
        raise RuntimeError("lost the data loader (first attempt only)")
    dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    return {"attempt": attempt, "world": total.item()}


def test_one_restart_turns_a_failure_into_success(capsys: pytest.CaptureFixture[str]) -> None:
    results = debug_launcher(flaky, args=(1,), num_processes=2, max_restarts=1)
    assert results == [{"attempt": 1, "world": 2.0}] * 2
    out = capsys.readouterr().out
    assert "RuntimeError: lost the data loader (first attempt only)" in out
    assert "restarting every process (restart 1 of 1)" in out


def _fail_after_peer_joined() -> float:
    import torch
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and os.environ["RANK"] == "1":
        time.sleep(1.0)  # rank 0 has written its gloo address into the rendezvous store
        raise RuntimeError("fails after rank 0 joined")
    if os.environ["RANK"] == "0":
        time.sleep(0.5)  # rank 1 looks for rank 0's address first: it must not find an old one
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    return total.item()


def test_a_restart_meets_in_a_fresh_store() -> None:
    # In a store shared across attempts, attempt 1 would find rank 0's stale address.
    assert debug_launcher(_fail_after_peer_joined, num_processes=2, max_restarts=1) == [2.0] * 2


def test_without_restarts_the_first_failure_is_raised() -> None:
    with pytest.raises(RuntimeError, match="first attempt only"):
        debug_launcher(flaky, args=(0,), num_processes=2, max_restarts=0)


# Two launchers ("machines") on this host, meeting on loopback; the same cell on both.
CELL = textwrap.dedent(
    """
    import os, sys
    from notebook_accel import notebook_launcher

    def flaky(rank_to_fail):
        import torch, torch.distributed as dist
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        if attempt == 0 and int(os.environ["RANK"]) == rank_to_fail:
            raise RuntimeError("first attempt fails on rank %d" % rank_to_fail)
        dist.init_process_group("gloo")
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        return (attempt, total.item())

    node, port, fail, restarts = map(int, sys.argv[1:5])
    print("RESULTS", notebook_launcher(
        flaky, args=(fail,), num_processes=2, hardware="cpu", num_nodes=2, node_rank=node,
        master_addr="127.0.0.1", master_port=port, max_restarts=restarts, timeout=90))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_launchers(tmp_path: Path, fail: int, restarts: int) -> list[tuple[int, str]]:
    cell = tmp_path / "cell.py"
    cell.write_text(CELL)
    env = dict(os.environ, NOTEBOOK_ACCEL_CONFIG_FILE=str(tmp_path / "config.json"))
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(cell), str(node), port, str(fail), str(restarts)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for node in (0, 1)
    ]
    try:
        return [(p.wait(timeout=120), p.stdout.read()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_failure_on_machine_0_restarts_the_whole_group(tmp_path: Path) -> None:
    # Rank 1 (machine 0) fails before joining, so machine 1's ranks wait in the rendezvous
    # and only the group's restart key can tell machine 1 to start its next attempt.
    (code0, out0), (code1, out1) = _two_launchers(tmp_path, fail=1, restarts=1)
    assert (code0, code1) == (0, 0), out0 + "\n----\n" + out1
    assert "RESULTS [(1, 10.0), (1, 10.0)]" in out0
    assert "RESULTS [(1, 10.0), (1, 10.0)]" in out1
    assert "another machine restarts: machine 0: RuntimeError" in out1


def test_a_machine_that_gives_up_stops_the_others(tmp_path: Path) -> None:
    start = time.monotonic()
    (code0, out0), (code1, out1) = _two_launchers(tmp_path, fail=3, restarts=0)
    assert code1 != 0 and "first attempt fails on rank 3" in out1
    assert code0 != 0, out0
    assert "another machine gave up: machine 1: RuntimeError" in out0
    assert time.monotonic() - start < 60


def _fail_slowly(marks: str) -> None:
    Path(marks, f"{os.environ['TORCHELASTIC_RESTART_COUNT']}-{os.environ['RANK']}").touch()
    time.sleep(1.5)
    raise ValueError("fails on every attempt")


def test_timeout_bounds_the_whole_launch_restarts_included(tmp_path: Path) -> None:
    # Each attempt fits in the timeout; twenty of them do not.
    with pytest.raises(LaunchTimeoutError, match="timeout=4 s"):
        debug_launcher(
            _fail_slowly, args=(str(tmp_path),), num_processes=2, max_restarts=20, timeout=4
        )
    attempts = {name.split("-")[0] for name in os.listdir(tmp_path)}
    assert 1 <= len(attempts) < 21
