"""Which options go together: every rule of combination, written once, with one message.

    the options among themselves   together()       LaunchConfig(...), Accelerator(...)
    the machines                   machines()       LaunchConfig(...)
    the job's size                 sized()          launch/plan.py (notebook_launcher,
                                                    Workers, the panel, the CLI), a cluster's
                                                    plan, Accelerator(...) once its job is
                                                    known
    a device's precisions          precision_on()   hardware.resolve, the Accelerator on TPU
                                   deepspeed_precision()   hardware.resolve, DeepSpeed's
                                                    strategy in the Accelerator
    a cluster's ranks              on_cluster()     the Ray backend's plan
    a session                      for_session()    Workers(...)
    packages an option needs       deepspeed_installed(), fp8_installed()

A face calls each option by its own name (``deepspeed`` for a launch, ``deepspeed_plugin`` for
an Accelerator): the ``Names`` it passes. Torch-free, so that a launch is checked in the
notebook before torch is imported there (the ground: every part may call it).

Example:
    >>> together(fsdp="full", deepspeed={"zero_stage": 2})
    Traceback (most recent call last):
    ...
    notebook_accel.errors.ConfigError: deepspeed={'zero_stage': 2} is not accepted; ...
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = [
    "ACCELERATOR",
    "LAUNCH",
    "Names",
    "deepspeed_installed",
    "deepspeed_precision",
    "for_session",
    "fp8_installed",
    "machines",
    "on_cluster",
    "precision_on",
    "shards",
    "sized",
    "together",
]


@dataclass(frozen=True)
class Names:
    """What a face calls each option in its messages."""

    fsdp: str = "fsdp"
    deepspeed: str = "deepspeed"
    mesh: str = "parallelism_config"


LAUNCH = Names()
ACCELERATOR = Names(deepspeed="deepspeed_plugin")


def shards(fsdp: object, deepspeed: object, mesh: Mapping[str, Any] | None) -> bool:
    """Whether the model is sharded: FSDP, DeepSpeed, or a mesh with tp or dp_shard > 1."""
    mesh = mesh or {}
    sharded_mesh = mesh.get("tp_size", 1) * mesh.get("dp_shard_size", 1) > 1
    return fsdp is not None or deepspeed is not None or sharded_mesh


def together(
    *,
    fsdp: object = None,
    deepspeed: object = None,
    mesh: Mapping[str, Any] | None = None,
    dynamo_backend: str = "no",
    names: Names = LAUNCH,
) -> None:
    """One way of sharding the model at most, and no torch.compile with one.

    ``fsdp``, ``deepspeed``: the option's value, or None when not asked for; ``mesh``: the
    ParallelismConfig's sizes; ``dynamo_backend``: the backend's lower-case name.
    """
    if deepspeed is not None and fsdp is not None:
        raise ConfigError(
            names.deepspeed,
            deepspeed,
            f"None when {names.fsdp} is set",
            "DeepSpeed's ZeRO and FSDP both shard the model; pick one.",
        )
    if mesh is not None and (fsdp is not None or deepspeed is not None):
        raise ConfigError(
            names.mesh,
            dict(mesh),
            f"None when {names.fsdp} or {names.deepspeed} is set",
            "The mesh's dp_shard_size already means FSDP; pick one way to say it.",
        )
    if dynamo_backend != "no" and shards(fsdp, deepspeed, mesh):
        raise ConfigError(
            "dynamo_backend",
            dynamo_backend,
            "'no' with FSDP, DeepSpeed or tensor parallelism (not built yet)",
            "Compile with DDP or in one process, or leave dynamo_backend unset.",
        )


def sized(
    processes: int,
    *,
    fsdp: str | None = None,
    mesh: Mapping[str, Any] | None = None,
    names: Names = LAUNCH,
) -> None:
    """The options against the job's number of processes (every machine's together).

    ``fsdp``: FSDP's sharding strategy, or None; ``mesh``: the ParallelismConfig's fields.
    """
    if fsdp is not None and processes < 2:
        raise ConfigError(
            names.fsdp,
            fsdp,
            f"FSDP in a job of at least 2 processes (this one has {processes})",
            "With one process there is nothing to shard: launch num_processes=2 or more, or "
            f"drop {names.fsdp}.",
        )
    if mesh is not None:
        from .parallelism import ParallelismConfig

        ParallelismConfig(**mesh).check(processes)


def machines(
    *,
    num_nodes: int,
    node_rank: int,
    master_port: int | None,
    cluster: str | None,
    resources_per_worker: object,
) -> None:
    """Where the ranks run: this machine, several machines meeting at machine 0, a cluster."""
    if node_rank >= num_nodes:
        raise ConfigError(
            "node_rank", node_rank, f"an int in [0, {num_nodes - 1}] (num_nodes={num_nodes})"
        )
    if num_nodes > 1 and master_port is None:
        raise ConfigError(
            "master_port",
            None,
            "a fixed TCP port when num_nodes > 1",
            "Every machine must know where to meet.",
        )
    if resources_per_worker is not None and cluster is None:
        raise ConfigError(
            "resources_per_worker",
            resources_per_worker,
            "None without a cluster",
            "Add cluster='ray'.",
        )
    if cluster is not None and num_nodes != 1:
        raise ConfigError(
            "num_nodes",
            num_nodes,
            "1 with a cluster",
            "On a cluster, num_processes counts every rank on every machine.",
        )


def on_cluster(
    processes: int,
    *,
    hardware: str,
    resources: Mapping[str, float],
    total: Mapping[str, float],
) -> None:
    """A cluster's ranks: the hardware each one's resources give, and room for all of them
    in what the cluster has (``total``)."""
    gpu = resources.get("GPU", 0) > 0
    if hardware not in ("auto", "cpu", "cuda") or (hardware == "cpu" and gpu):
        raise ConfigError(
            "hardware",
            hardware,
            "'auto', 'cpu' or 'cuda' on a Ray cluster ('cuda' when GPU is requested)",
        )
    for key, amount in resources.items():
        if amount and amount * processes > total.get(key, 0):
            fits = int(total.get(key, 0) // amount)
            raise ConfigError(
                "num_processes",
                processes,
                f"at most {fits} ranks of {dict(resources)} on this cluster "
                f"({total.get(key, 0):g} {key} in all)",
            )


def for_durable(*, durable: bool, name: str | None) -> None:
    """A durable session needs its name (what ``Workers.attach`` takes); a name is only for a
    durable session."""
    if durable and name is None:
        raise ConfigError(
            "name",
            name,
            "a name for the durable session, e.g. name='exp1'",
            "Workers.attach(name) takes the session back from a later kernel.",
        )
    if name is not None and not durable:
        raise ConfigError(
            "durable", durable, "True with name=", "Only a durable session has a name."
        )


def for_session(
    *,
    cluster: str | None = None,
    num_nodes: int | None = None,
    max_restarts: int | None = None,
    backend: str | None = None,
    hardware: str = "",
) -> None:
    """What a session (Workers) cannot do yet: a cluster, several machines, restarts, TPUs.

    The options are checked as given (before the plan); ``backend``/``hardware``: the plan's.
    """
    refused = {
        "cluster": (cluster, None, "None", "A session's workers run on this machine; "
                    "notebook_launcher(cluster=...) runs one launch on a cluster."),
        "num_nodes": (num_nodes, 1, "1", "A session runs on this machine; "
                      "notebook_launcher(num_nodes=...) runs one launch on several."),
        "max_restarts": (max_restarts, 0, "0", "After a failure, restart() starts fresh "
                         "workers."),
    }  # fmt: skip
    for name, (value, default, shown, hint) in refused.items():
        if value is not None and value != default:
            raise ConfigError(name, value, f"{shown} for a session (Workers)", hint)
    if backend == "xla":
        raise ConfigError(
            "hardware",
            hardware,
            "'cpu', 'cuda' or 'mps' for a session",
            "On TPUs, notebook_launcher runs each launch.",
        )


def precision_on(
    precision: str,
    accepted: Sequence[str],
    where: str,
    hint: str = "",
    capability_unknown: str = "",
) -> None:
    """``precision`` on a device that computes in ``accepted`` (``where``: the device, as the
    message names it); ``"no"`` always goes. ``capability_unknown``: why fp8's need for a
    compute capability >= 8.9 could not be checked."""
    if precision == "no" or precision in accepted:
        if precision == "fp8":
            fp8_installed()
        return
    if precision == "fp8":
        hint = (
            "fp8 needs a CUDA GPU with compute capability >= 8.9 (Ada, Hopper or newer)"
            + (f"; this GPU's is unknown: {capability_unknown}" if capability_unknown else "")
            + ". To try the fp8 path anywhere, call Accelerator(mixed_precision='fp8', "
            "kwargs_handlers=[AORecipeKwargs(config=Float8LinearConfig(emulate=True))]) "
            "inside the function instead."
        )
    raise ConfigError(
        "mixed_precision", precision, f"one of {', '.join(map(repr, accepted))} on {where}", hint
    )


def deepspeed_precision(precision: str, device_type: str) -> None:
    """The precisions DeepSpeed trains with on ``device_type``: its CPU accelerator refuses
    fp16 ("Type fp16 is not supported on your device")."""
    accepted = ("no", "bf16") if device_type == "cpu" else ("no", "fp16", "bf16")
    if precision not in accepted:
        raise ConfigError(
            "mixed_precision",
            precision,
            " or ".join(map(repr, accepted)) + f" with DeepSpeed on {device_type.upper()}",
            "DeepSpeed's CPU accelerator has no fp16; use bf16.",
        )


def deepspeed_installed(name: str = "deepspeed", value: object = "not installed") -> None:
    """DeepSpeed asked for (``name=value``, as the face calls it): its package is there."""
    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            name,
            value,
            "the deepspeed package installed",
            "pip install 'notebook-accel[deepspeed]' after torch, with --no-build-isolation "
            "(DeepSpeed builds against the installed torch).",
        )


def fp8_installed() -> None:
    """fp8 asked for: torchao is there."""
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(
            "mixed_precision",
            "fp8",
            "torchao installed for fp8",
            "pip install 'notebook_accel[fp8]'.",
        )
