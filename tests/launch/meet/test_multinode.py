"""Several machines: two launchers in two network namespaces form one group of 2 × 2 ranks.

Machine 0's launcher holds the table behind its gate on master_port; outsiders (real
processes on machine 1's network, tests/launch/meet/outsider.py) that try the way in while
machine 0 waits are refused and named, and the real machine 1 joins after them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from .multinode import Machine, finish, free_port, two_launchers, two_machines

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
    root = str(Path(__file__).resolve().parents[3])
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


def _launcher_ports(machine: Machine, pid: int) -> list[str]:
    """The addresses process ``pid`` listens on inside ``machine``'s namespace."""
    listing = subprocess.run(
        ["ip", "netns", "exec", machine.namespace, "ss", "-Hltnp"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(line.split()[3] for line in listing.splitlines() if f"pid={pid}," in line)


def _outsider(m0: Machine, m1: Machine, port: str, marker: Path, env: dict[str, str]) -> dict:
    """A process on machine 1's network without the secret tries machine 0's port."""
    outsider = m1.popen(
        [sys.executable, "-m", "tests.launch.meet.outsider", m0.address, port, str(marker)],
        dict(env, NOTEBOOK_ACCEL_SECRET="a guess"),
    )
    ((code, out),) = finish([outsider], timeout=120)
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


Start = Callable[[Machine, int, Machine], "subprocess.Popen[str]"]


def _with_an_outsider(tmp_path: Path, port: str, start: Start) -> tuple[str, str]:
    """Machine 0, then an outsider on machine 1's network, then the real machine 1; both
    machines' output. The outsider must be refused and named, its pickle never loaded."""
    marker = tmp_path / "code-ran"
    with two_machines() as (m0, m1):
        machine0 = start(m0, 0, m0)
        tries = _outsider(m0, m1, port, marker, _env(tmp_path))
        # While machine 0 waits for machine 1: its launcher listens on master_port alone, on
        # the address facing the other machine (no TCPStore, nothing on 127.0.0.1).
        assert _launcher_ports(m0, machine0.pid) == [f"{m0.address}:{port}"]
        machine1 = start(m1, 1, m0)
        (code0, out0), (code1, out1) = finish([machine0, machine1], timeout=150)
    assert (code0, code1) == (0, 0), out0 + "\n----\n" + out1
    assert all(outcome.startswith("refused") for outcome in tries.values()), tries
    assert f"refused a connection from {m1.address}: wrong secret" in out0
    assert f"refused a connection from {m1.address}: not a worker of this launch" in out0
    assert re.search(rf"refused .*from {re.escape(m1.address)}: it does not speak", out0)
    assert not marker.exists()  # the planted pickle was never unpickled
    return out0, out1


def test_an_outsider_is_refused_then_machine_1_joins(tmp_path: Path) -> None:
    cell = tmp_path / "cell.py"
    cell.write_text(NOTEBOOK_CELL)
    port = "29413"

    def start(machine: Machine, rank: int, m0: Machine) -> subprocess.Popen[str]:
        argv = [sys.executable, str(cell), str(rank), m0.address, port]
        return machine.popen(argv, _env(tmp_path))

    out0, out1 = _with_an_outsider(tmp_path, port, start)
    r0, r1 = _results(out0), _results(out1)
    assert [r["rank"] for r in r0 + r1] == [0, 1, 2, 3]
    assert {r["sum"] for r in r0 + r1} == {10.0}


TRAIN_SCRIPT = textwrap.dedent(
    """
    import os
    import torch, torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and os.environ["RANK"] == "2":
        raise RuntimeError("machine 1 fails its first attempt")
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={total.item():g} "
          f"mp={os.environ['NOTEBOOK_ACCEL_MIXED_PRECISION']} attempt={attempt}", flush=True)
    dist.destroy_process_group()
    """
)


def test_command_line_on_two_machines_goes_through_our_group(tmp_path: Path) -> None:
    # The CLI's several machines are the notebook's: the same gate, table and group restarts
    # (no torch.distributed.run, whose c10d rendezvous unpickles what is in its store).
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    port = "29412"

    def start(machine: Machine, rank: int, m0: Machine) -> subprocess.Popen[str]:
        argv = ["launch", "--num_machines", "2", "--machine_rank", str(rank)]
        argv += ["--num_processes", "2", "--main_process_ip", m0.address]
        argv += ["--main_process_port", port, "--mixed_precision", "bf16", "--max_restarts", "1"]
        argv += ["--rendezvous_timeout", "60", str(script)]
        command = [sys.executable, "-m", "notebook_accel.faces.cli", *argv]
        return machine.popen(command, _env(tmp_path))

    out0, out1 = _with_an_outsider(tmp_path, port, start)
    # Rank 2 (machine 1) failed its first attempt: machine 0 restarted too.
    assert "another machine restarts: machine 1: RuntimeError" in out0
    assert "restarting every process (restart 1 of 1)" in out0
    for rank in range(4):
        assert f"rank={rank} world=4 sum=10 mp=bf16 attempt=1" in out0 + out1


def _on_loopback(tmp_path: Path, source: str) -> tuple[str, Path]:
    """A free port on 127.0.0.1 for two launchers of this host, and their cell."""
    cell = tmp_path / "cell.py"
    cell.write_text(source)
    return free_port(), cell


_WRONG_SECRET_CELL = textwrap.dedent(
    """
    import sys
    from notebook_accel import notebook_launcher
    node, port = int(sys.argv[1]), int(sys.argv[2])
    notebook_launcher(print, num_processes=1, hardware="cpu", num_nodes=2, node_rank=node,
                      master_addr="127.0.0.1", master_port=port, timeout=60)
    """
)


def test_a_machine_with_another_secret_is_told_what_to_do(tmp_path: Path) -> None:
    port, cell = _on_loopback(tmp_path, _WRONG_SECRET_CELL)
    env = _env(tmp_path)
    machine0 = subprocess.Popen(
        [sys.executable, str(cell), "0", port], env=env, text=True, stdout=subprocess.PIPE
    )
    try:
        machine1 = subprocess.run(
            [sys.executable, str(cell), "1", port],
            env=dict(env, NOTEBOOK_ACCEL_SECRET="another machine's secret"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        machine0.kill()
        machine0.communicate()
    assert machine1.returncode != 0
    assert "refused this machine: wrong secret" in machine1.stderr
    assert "set NOTEBOOK_ACCEL_SECRET to the same value on each" in machine1.stderr


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


_SAVE_CELL = textwrap.dedent(
    """
    import os, sys
    from notebook_accel import notebook_launcher

    def save(folder):
        import torch
        from notebook_accel import Accelerator
        acc = Accelerator()
        model = torch.nn.Linear(2, 2)
        model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        acc.save_state(folder)  # ranks 1-3 wait for rank 0's "done" key in machine 0's table
        acc.wait_for_everyone()
        store = torch.distributed.distributed_c10d._get_default_store()
        store.set(f"mine/{acc.process_index}", "1")
        ops = store.num_keys() > 0 and store.delete_key(f"mine/{acc.process_index}")
        return sorted(os.listdir(folder)), ops

    node, port, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    print("RESULTS", notebook_launcher(
        save, args=(folder,), num_processes=2, hardware="cpu", num_nodes=2, node_rank=node,
        master_addr="127.0.0.1", master_port=port, timeout=90))
    """
)


def test_save_state_pairs_through_machine_0s_table(tmp_path: Path) -> None:
    port, cell = _on_loopback(tmp_path, _SAVE_CELL)
    folder = str(tmp_path / "ckpt")
    done = two_launchers(
        lambda node: [sys.executable, str(cell), str(node), port, folder],
        lambda node: _env(tmp_path),
        timeout=150,
    )
    assert [code for code, _ in done] == [0, 0], done
    files = ["model.safetensors", "notebook_accel.json", "optimizer.bin"]
    files += [f"random_states_{rank}.pkl" for rank in range(4)]
    for _, out in done:
        assert f"RESULTS {[(files, True), (files, True)]}" in out
