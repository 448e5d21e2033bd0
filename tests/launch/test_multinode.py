"""Several machines: two launchers in two network namespaces form one group of 2 × 2 ranks."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

from .multinode import finish, two_machines

# Run on each "machine": the same cell, only node_rank differs.
NOTEBOOK_CELL = textwrap.dedent(
    """
    import json, sys
    from notebook_accel import notebook_launcher

    def train(steps):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + rank)  # different data on every rank
        for _ in range(steps):
            x = torch.randn(16, 3, generator=gen)
            loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
        print(f"rank {rank} of {world} done")
        return {"rank": rank, "world": world, "sum": total.item(),
                "weight": model.weight.detach().tolist()}

    node_rank, addr, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    results = notebook_launcher(
        train, args=(5,), num_processes=2, hardware="cpu", num_nodes=2, node_rank=node_rank,
        master_addr=addr, master_port=port, timeout=120,
    )
    print("RESULTS " + json.dumps(results))
    """
)


def _env(tmp_path: Path) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return dict(
        os.environ,
        NOTEBOOK_ACCEL_CONFIG_FILE=str(tmp_path / "config.json"),
        PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    )


def _results(text: str) -> list[dict[str, object]]:
    line = next(x for x in text.splitlines() if x.startswith("RESULTS "))
    return json.loads(line[len("RESULTS ") :])  # type: ignore[no-any-return]


def test_two_by_two_notebook_launch_forms_one_group(tmp_path: Path) -> None:
    cell = tmp_path / "cell.py"
    cell.write_text(NOTEBOOK_CELL)
    with two_machines() as (m0, m1):
        port = "29411"
        procs = [
            m.popen([sys.executable, str(cell), str(i), m0.address, port], _env(tmp_path))
            for i, m in enumerate((m0, m1))
        ]
        (code0, out0), (code1, out1) = finish(procs, timeout=150)
    assert code0 == 0 and code1 == 0, out0 + "\n----\n" + out1
    assert "Launching 2 processes on CPU (gloo) on each of 2 machines" in out0
    r0, r1 = _results(out0), _results(out1)
    assert [r["rank"] for r in r0 + r1] == [0, 1, 2, 3]
    assert {r["world"] for r in r0 + r1} == {4}
    assert {r["sum"] for r in r0 + r1} == {10.0}  # 1 + 2 + 3 + 4: all four ranks, one group
    # Averaged gradients keep the replicas identical although every rank saw other data.
    assert len({json.dumps(r["weight"]) for r in r0 + r1}) == 1
    assert "[rank 3] rank 3 of 4 done" in out1


TRAIN_SCRIPT = textwrap.dedent(
    """
    import os
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={total.item():g} "
          f"mp={os.environ['NOTEBOOK_ACCEL_MIXED_PRECISION']}", flush=True)
    dist.destroy_process_group()
    """
)


def test_command_line_on_two_machines_uses_torchrun_c10d(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    with two_machines() as (m0, m1):
        procs = [
            m.popen(
                [
                    sys.executable,
                    "-m",
                    "notebook_accel.faces.cli",
                    "launch",
                    "--num_machines",
                    "2",
                    "--machine_rank",
                    str(i),
                    "--num_processes",
                    "2",
                    "--main_process_ip",
                    m0.address,
                    "--main_process_port",
                    "29412",
                    "--mixed_precision",
                    "bf16",
                    "--rendezvous_timeout",
                    "60",
                    str(script),
                ],
                _env(tmp_path),
            )
            for i, m in enumerate((m0, m1))
        ]
        results = finish(procs, timeout=150)
    text = "\n----\n".join(out for _, out in results)
    assert [code for code, _ in results] == [0, 0], text
    for rank in range(4):
        assert f"rank={rank} world=4 sum=10 mp=bf16" in text


def test_unreachable_master_addr_is_an_error_within_the_timeout() -> None:
    import time

    import pytest

    from notebook_accel import notebook_launcher
    from notebook_accel.errors import LaunchError

    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"master_addr='192\.0\.2\.1'"):
        notebook_launcher(
            print,
            num_processes=1,
            hardware="cpu",
            num_nodes=2,
            node_rank=1,
            master_addr="192.0.2.1",  # TEST-NET-1: never routed
            master_port=29473,
            timeout=3,
        )
    assert time.monotonic() - start < 20
