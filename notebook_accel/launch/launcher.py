"""``notebook_launcher`` and ``debug_launcher``: run a cell's function on N processes.

notebook_launcher(fn, args, ...)
  -> LaunchConfig (defaults from the config file; validated)
  -> hardware.resolve: "auto" -> TPU / CUDA / MPS / CPU, bounds and precision checked
  -> payload.build: cloudpickle by value, the culprit named if it does not pickle
  -> shm.shipped: large buffers into shared memory once (or found in the cache)
  -> rendezvous.py: where the ranks meet, private to the job: a memfd FileStore (one
     machine); machine 0's table behind a gate that proves the job's secret (several)
  -> attempt after attempt (_attempts: restarts, the launch's timeout), each one
     this machine's Engine(...).run()  or, on TPU, local/xla/engine.run(...)
     or, with cluster="ray", the cluster's backend (cluster/backend.py: RayBackend).run()
  -> [result of rank 0, result of rank 1, ...]
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import env, hardware
from ..config import LaunchConfig
from ..errors import ConfigError, LaunchTimeoutError, UserFrames
from .local.engine import Engine
from .local.forkserver import warm_up, warm_up_early
from .meet.group import Group, joined, rendezvous_timeout
from .meet.rendezvous import Meeting, meeting
from .meet.secret import job_secret
from .plan import Watch, banner, checked_size, layout_for, plan_for, watch_for_stop
from .show.display import Display
from .wire.payload import Payload, build
from .wire.pickling import Outgoing
from .wire.shm import shipped

__all__ = ["debug_launcher", "launch", "notebook_launcher", "warm_up_early"]

_STOPPED = "stopped from the launch panel"


Attempt = Callable[[int, float | None], list[Any]]  # (attempt number, seconds left) -> results


def _announcing(watch: Watch, place: Meeting, display: Display) -> Watch:
    """``watch``, and the connections machine 0 refused since the last look, in the banner."""
    if place.gate is None:
        return watch

    def check() -> None:
        for line in place.refusals():
            display.banner(line)
        if watch is not None:
            watch()

    return check


def launch(
    function: Callable[..., Any],
    args: Any,
    kwargs: dict[str, Any] | None,
    config: LaunchConfig,
    machine: hardware.Machine | None = None,
    *,
    display: Display | None = None,
    stop: threading.Event | None = None,
    wait_for_machine_0: float | None = None,
) -> list[Any]:
    """Validate everything, then run (and restart up to ``config.max_restarts`` times).

    ``display`` and ``stop`` are the launch panel's hooks (faces/panel.py): its own display, and
    an event that, once set, stops every worker as a KeyboardInterrupt does.
    ``wait_for_machine_0``: seconds the other machines wait for machine 0 (the command
    line's ``--rendezvous_timeout``; default group.rendezvous_timeout).
    """
    with UserFrames():  # a rank's error shows its traceback and the caller's, none of ours
        payload, buffers = build(function, args, kwargs, env.snapshot())
        if config.cluster is not None:  # a cluster's ranks run elsewhere (cluster/)
            return _AllNone.of(_on_a_cluster(config, payload, buffers, display, stop))
        return _AllNone.of(
            _on_this_machine(config, machine, payload, buffers, display, stop, wait_for_machine_0)
        )


class _AllNone(list[Any]):
    """Every rank's value when each one is None, as a list that a cell shows as nothing (a
    function that returns nothing: accelerate's launcher returns None, its cell is empty)."""

    @classmethod
    def of(cls, values: list[Any]) -> list[Any]:
        return cls(values) if values and all(v is None for v in values) else values

    def _ipython_display_(self) -> None:
        """IPython shows nothing (``print`` still shows the list)."""


def _on_a_cluster(
    config: LaunchConfig,
    payload: Payload,
    buffers: list[Outgoing],
    display: Display | None,
    stop: threading.Event | None,
) -> list[Any]:
    """The attempts on the backend ``config.cluster`` names (cluster/backend.py)."""
    from .cluster.backend import for_cluster

    display = display or Display(output=config.output)
    backend = for_cluster(config)
    plan = backend.plan()
    checked_size(config, plan)
    backend.prepare(payload, buffers)
    try:
        display.banner(banner(config, plan))
        # timeout= bounds the whole launch, restarts included (as on this machine).
        deadline = None if config.timeout is None else time.monotonic() + config.timeout
        watch = watch_for_stop(stop, _STOPPED)

        def attempt(number: int, left: float | None) -> list[Any]:
            return backend.run(number, display, left, watch)

        return _attempts(config, display, Group(config, None), deadline, attempt)
    finally:
        backend.close()
        display.close()


def _on_this_machine(
    config: LaunchConfig,
    machine: hardware.Machine | None,
    payload: Payload,
    buffers: list[Outgoing],
    display: Display | None,
    stop: threading.Event | None,
    wait_for_machine_0: float | None,
) -> list[Any]:
    """The attempts on this machine's workers (several machines: in step with the others)."""
    plan = plan_for(config, machine)
    secret = job_secret() if config.num_nodes > 1 else b""  # a bad one: before any process
    if plan.backend != "xla":
        warm_up(config.start_method)
    display = display or Display(output=config.output)
    display.banner(banner(config, plan))
    # timeout= bounds the whole launch, restarts included (not each attempt).
    deadline = None if config.timeout is None else time.monotonic() + config.timeout
    # Several machines keep one table for the whole launch (restarts move together, group.py).
    waiting = wait_for_machine_0 or rendezvous_timeout(config)
    try:
        with (
            shipped(buffers) as shipment,
            meeting(config, waiting, secret) as place,
            joined(config, place.group) as group,
        ):
            for note in place.notes:
                display.banner(note)
            payload = dataclasses.replace(payload, shipment=shipment)

            def attempt(number: int, left: float | None) -> list[Any]:
                watch = watch_for_stop(stop, _STOPPED, group.watch(number))
                watch = _announcing(watch, place, display)
                return _run_once(config, plan, payload, display, number, group, place, watch, left)

            try:
                return _attempts(config, display, group, deadline, attempt)
            finally:
                for line in place.refusals(final=True):
                    display.banner(line)
    finally:
        display.close()


def _run_once(
    config: LaunchConfig,
    plan: hardware.Plan,
    payload: Payload,
    display: Display,
    attempt: int,
    group: Group,
    place: Meeting,
    watch: Watch,
    timeout: float | None,
) -> list[Any]:
    if plan.backend == "xla":
        from .local.xla.engine import run as run_on_xla  # imports torch_xla: only on TPU machines

        return run_on_xla(layout_for(config, plan, attempt), payload, display, timeout, watch)
    # Each attempt's workers meet in fresh keys (rendezvous.py); torch_xla needs none.
    with place.attempt(attempt) as (port, store):
        layout = layout_for(config, plan, attempt, store)
        engine = Engine(layout, payload, display, port, config.start_method, watch)
        result = engine.run(timeout)
        group.done(attempt)  # machine 0 keeps the table up until every machine is done
    return result


def _attempts(
    config: LaunchConfig,
    display: Display,
    group: Group,
    deadline: float | None,
    attempt: Attempt,
) -> list[Any]:
    """Run attempt after attempt until one succeeds or the group gives up: the one restart
    loop of every launch, this machine's (alone or with others) and a cluster's."""
    number = 0
    while True:
        try:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise LaunchTimeoutError(config.timeout)  # type: ignore[arg-type]
            return attempt(number, left)
        except LaunchTimeoutError as exc:
            group.fail(exc)
            if exc.timeout == config.timeout:
                raise
            # The attempt had what was left of the launch's timeout; name the user's.
            raise LaunchTimeoutError(config.timeout) from None  # type: ignore[arg-type]
        except Exception as exc:  # not KeyboardInterrupt: the stop button is final
            reason = group.cause(number, exc)  # before we publish our own restart
            if not group.restarting(number, exc):
                raise
            number += 1
            display.banner(
                f"{type(reason).__name__}: {_first_line(reason)} -- restarting every "
                f"process (restart {number} of {config.max_restarts})"
            )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str | None = None,
    *,
    kwargs: dict[str, Any] | None = None,
    hardware: str | None = None,
    output: str | None = None,
    timeout: float | None = None,
    gradient_accumulation_steps: int | None = None,
    seed: int | bool | None = None,
    num_nodes: int | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_port: int | str | None = None,
    max_restarts: int | None = None,
    start_method: str | None = None,
    fsdp: Any = None,
    cluster: str | None = None,
    resources_per_worker: dict[str, float] | None = None,
    placement_strategy: str | None = None,
    deepspeed: Any = None,
    parallelism_config: Any = None,
    dynamo_backend: str | None = None,
) -> list[Any]:
    """Run ``function(*args)`` on ``num_processes`` worker processes and return every result.

    The function may be defined in a notebook cell (it travels by value with cloudpickle).
    Each worker has the torch.distributed variables set (RANK, WORLD_SIZE, MASTER_ADDR, ...),
    so ``torch.distributed.init_process_group()`` or :class:`~notebook_accel.Accelerator`
    work inside it. Output appears in the cell line by line as ``[rank N] ...``.

    Args:
        function: the function to run in every worker.
        args: its positional arguments, as a tuple.
        num_processes: how many workers on this machine; default: every GPU / TPU core,
            or 2 on CPU (from the config file when it says otherwise).
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"`` (GPUs with compute
            capability >= 8.9, through torchao), passed to the Accelerator.
        kwargs: keyword arguments for ``function``.
        hardware: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"tpu"`` or ``"mps"``.
        output: whose lines to show: ``"all"`` ranks, ``"main"`` (rank 0 only) or ``"none"``.
        timeout: seconds after which the launch is stopped with LaunchTimeoutError; the
            whole launch, restarts included (each restart gets what is left).
        gradient_accumulation_steps: default for ``Accelerator()`` in the workers.
        seed: seed python's ``random``, numpy and torch in every worker (and the default
            for ``Accelerator()`` there); ``False`` clears a seed saved in the config file.
        num_nodes, node_rank, master_addr, master_port: run the same cell on several
            machines; they meet at ``master_addr:master_port`` (machine 0), and each needs
            the job's secret (``NOTEBOOK_ACCEL_SECRET``, else the file
            ``~/.config/notebook_accel/secret``, made at first use: copy it to the others).
        use_port: HF accelerate's name for ``master_port``.
        max_restarts: restart every worker up to this many times after a failure.
        start_method: ``"auto"`` (forkserver, else spawn), ``"forkserver"`` or ``"spawn"``.
        fsdp: shard models with FSDP in ``Accelerator.prepare``: a strategy name
            (``"full"``, ``"grad_op"``, ``"no_shard"``, ``"hybrid"``), a dict of
            :class:`~notebook_accel.FsdpConfig` fields, or an FsdpConfig; ``False`` (or
            ``"no"``) clears an FSDP choice saved in the config file.
        cluster: run the ranks on a cluster instead of this machine: ``"ray"`` (the Ray
            cluster this process joined with ``ray.init``, else the one ``RAY_ADDRESS``
            names) or ``"ray://HOST:PORT"`` (Ray Client). ``num_processes`` then counts
            every rank on the cluster; each rank is a Ray task.
        resources_per_worker: on a cluster, what each rank reserves, e.g.
            ``{"CPU": 4, "GPU": 1}`` (default ``{"CPU": 1}``); a GPU makes it a CUDA launch.
        placement_strategy: on a cluster, ``"PACK"`` ranks on as few machines as possible
            (default) or ``"SPREAD"`` them across machines.
        deepspeed: train with DeepSpeed's ZeRO in ``Accelerator.prepare`` (the ``deepspeed``
            extra): ``True`` (ZeRO-2), a ZeRO stage 0-3, a ``DeepSpeedPlugin`` or a dict of
            its fields; not with ``fsdp``; ``False`` clears a saved choice.
        parallelism_config: the workers' mesh (``ParallelismConfig`` or a dict of its fields:
            ``dp_replicate_size``, ``dp_shard_size``, ``tp_size``...); its sizes must multiply
            to the job's processes (checked before any process starts).
        dynamo_backend: compile models in ``Accelerator.prepare`` with ``torch.compile`` on
            this backend (accelerate's names: ``"inductor"``, ``"aot_eager"``, ``"eager"``...;
            ``"no"``, the default, runs eager); the workers' ``Accelerator()`` default.

    Arguments left at ``None`` take the config file's value (written by the panel's "Save as
    default" or ``notebook-accel config``); the banner names each value that came from it.

    Returns:
        The list of every rank's return value on this machine, in rank order.

    Raises:
        ConfigError: a bad argument, before any process starts.
        PayloadError: the function or its arguments cannot be pickled (the culprit is named).
        WorkerDiedError: a worker ended without a Python exception (a signal, ``os._exit``).
        LaunchTimeoutError: the launch ran longer than ``timeout``.
        Exception: the first failing worker's own exception, with its traceback as the cause.

    Example:
        >>> def train(lr):
        ...     import torch.distributed as dist
        ...     dist.init_process_group("gloo")
        ...     return dist.get_rank() * lr
        >>> notebook_launcher(train, args=(0.5,), num_processes=2)  # doctest: +SKIP
        Launching 2 processes on CPU (gloo)
        [0.0, 0.5]
    """
    with UserFrames():
        if use_port is not None and master_port is None:
            try:
                master_port = int(use_port)
            except ValueError:
                raise ConfigError("use_port", use_port, "a TCP port number") from None
        config = LaunchConfig.from_defaults(
            num_processes=num_processes,
            mixed_precision=mixed_precision,
            hardware=hardware,
            output=output,
            timeout=timeout,
            gradient_accumulation_steps=gradient_accumulation_steps,
            seed=seed,
            num_nodes=num_nodes,
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=master_port,
            max_restarts=max_restarts,
            start_method=start_method,
            fsdp=fsdp,
            cluster=cluster,
            resources_per_worker=resources_per_worker,
            placement_strategy=placement_strategy,
            deepspeed=deepspeed,
            parallelism_config=parallelism_config,
            dynamo_backend=dynamo_backend,
        )
        return launch(function, args, kwargs, config)


def debug_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int = 2,
    *,
    kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> list[Any]:
    """``notebook_launcher`` on CPU processes only, ignoring the config file: for tests.

    Example:
        >>> debug_launcher(lambda: 1, num_processes=2)  # doctest: +SKIP
        [1, 1]
    """
    with UserFrames():
        config = LaunchConfig(num_processes=num_processes, hardware="cpu", **options)
        return launch(function, args, kwargs, config)
