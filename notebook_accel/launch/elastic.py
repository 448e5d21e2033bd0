"""Several machines from the command line: torch's elastic launcher with c10d rendezvous.

notebook-accel launch --num_machines 2 --machine_rank R ... train.py
  -> machine R > 0: wait (up to the rendezvous timeout) for machine 0's port, so a wrong
     --main_process_ip is an error, not a hang
  -> python -m torch.distributed.run --rdzv_backend c10d --rdzv_endpoint IP:PORT
         --rdzv_conf is_host=<R == 0>,join_timeout=T,read_timeout=T --max_restarts M ...
     (machine 0 hosts the rendezvous store; torch's agent restarts the whole group)
  -> its exit code
"""

from __future__ import annotations

import subprocess
import sys

from .. import env
from ..config import LaunchConfig
from ..hardware import Plan
from . import network

__all__ = ["torchrun_command", "worker_variables", "run"]


def torchrun_command(
    config: LaunchConfig, plan: Plan, script: str, argv: list[str], rendezvous_timeout: float
) -> list[str]:
    """The ``torch.distributed.run`` command line for this machine.

    Example:
        >>> cfg = LaunchConfig(num_processes=2, num_nodes=2, master_addr="10.0.0.1",
        ...                    master_port=29400)
        >>> plan = Plan("cpu", 2, "gloo", "cpu", "CPU")
        >>> torchrun_command(cfg, plan, "/t.py", [], 60)[3:5]
        ['--nnodes=2', '--nproc_per_node=2']
    """
    timeout = max(1, int(rendezvous_timeout))
    is_host = 1 if config.node_rank == 0 else 0
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={config.num_nodes}",
        f"--nproc_per_node={plan.num_processes}",
        f"--node_rank={config.node_rank}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={config.master_addr}:{config.master_port}",
        # One id per job: the port is what every machine of the job shares.
        f"--rdzv_id=notebook-accel-{config.master_port}",
        # is_host: machine 0 hosts the store even when its address is not what its host name
        # resolves to (containers, network namespaces), instead of torch guessing.
        f"--rdzv_conf=is_host={is_host},join_timeout={timeout},read_timeout={timeout}",
        f"--max_restarts={config.max_restarts}",
        "--monitor_interval=0.5",
    ]
    local = network.local_address_towards(config.master_addr)
    if local:
        # The address the other machines reach this one at (the host name may resolve to
        # 127.0.1.1 or to another interface).
        command.append(f"--local_addr={local}")
    return [*command, script, *argv]


def worker_variables(config: LaunchConfig, plan: Plan) -> dict[str, str]:
    """The variables torchrun's workers need besides torchrun's own (RANK, WORLD_SIZE, ...)."""
    out = env.launch_variables(
        launched="1",
        device_type=plan.device_type,
        backend=plan.backend,
        **config.worker_options(),
    )
    if not env.get("GLOO_SOCKET_IFNAME"):
        name = network.interface_for(config.master_addr)
        if name:
            out["GLOO_SOCKET_IFNAME"] = name
    return out


def run(
    config: LaunchConfig, plan: Plan, script: str, argv: list[str], rendezvous_timeout: float
) -> int:
    """Run ``script`` on this machine's share of a several-machine job; its exit code.

    Raises:
        LaunchError: machine 0 did not answer within ``rendezvous_timeout`` seconds.

    Example:
        >>> run(cfg, plan, "/home/me/train.py", ["--epochs", "3"], 300)  # doctest: +SKIP
        0
    """
    if config.node_rank != 0:
        network.wait_reachable(
            config.master_addr,
            config.master_port or 0,
            rendezvous_timeout,
            option="--main_process_ip/--main_process_port",
        )
    command = torchrun_command(config, plan, script, argv, rendezvous_timeout)
    child = env.child_environ(worker_variables(config, plan))
    return subprocess.run(command, env=child, check=False).returncode
