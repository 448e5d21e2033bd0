"""NCCL through the launch's private rendezvous: one machine's FileStore on a memfd, and two
"machines" (two launchers on this host, one GPU each) meeting in machine 0's table through
the Python KeyStore, where NCCL's own threads call the store too."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from notebook_accel import notebook_launcher
from tests.launch.meet.multinode import free_port, two_launchers

ROOT = Path(__file__).resolve().parents[2]


def _store_and_sum() -> tuple[str, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    t = torch.ones(1, device=f"cuda:{os.environ['LOCAL_RANK']}")
    dist.all_reduce(t)
    dist.destroy_process_group()
    return os.environ["NOTEBOOK_ACCEL_STORE"].split("/")[0], t.item()


def test_nccl_meets_in_the_private_file_store(gpu_count: int) -> None:
    results = notebook_launcher(_store_and_sum, hardware="cuda", output="none")
    assert results == [("file:", float(gpu_count))] * gpu_count


_CELL = textwrap.dedent(
    """
    import os, sys
    from notebook_accel import notebook_launcher

    def train():
        import torch, torch.distributed as dist
        dist.init_process_group("nccl")
        t = torch.full((1,), float(dist.get_rank() + 1), device="cuda:0")
        dist.all_reduce(t)
        dist.barrier()
        dist.destroy_process_group()
        return os.environ["NOTEBOOK_ACCEL_STORE"].split(":")[0], t.item()

    node, port = int(sys.argv[1]), int(sys.argv[2])
    print("RESULTS", notebook_launcher(
        train, num_processes=1, hardware="cuda", num_nodes=2, node_rank=node,
        master_addr="127.0.0.1", master_port=port, timeout=180))
    """
)


def test_nccl_across_two_launchers_meets_in_machine_0s_table(two_gpus: int, tmp_path: Path) -> None:
    cell = tmp_path / "cell.py"
    cell.write_text(_CELL)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
    done = two_launchers(
        lambda node: [sys.executable, str(cell), str(node), port],
        lambda node: dict(env, CUDA_VISIBLE_DEVICES=str(node)),
        timeout=240,
    )
    assert [code for code, _ in done] == [0, 0], done
    for _, out in done:
        assert "RESULTS [('table', 3.0)]" in out
