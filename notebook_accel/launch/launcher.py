"""``notebook_launcher`` and ``debug_launcher``: run a cell's function on N processes.

notebook_launcher(fn, args, ...)
  -> LaunchConfig (defaults from the config file; validated: config.py's table)
  -> payload.build: cloudpickle by value, the culprit named if it does not pickle
  -> the backend (backend.py): this machine's workers (local/backend.py), its TPU cores
     (local/xla/backend.py), or a cluster's (cluster/backend.py: RayBackend)
  -> backend.plan(): "auto" -> TPU / CUDA / MPS / CPU, bounds and precision checked; the
     options against the job's size (plan.checked_size); the banner
  -> backend.prepare(): large buffers into shared memory once (or the cluster's store),
     where the ranks meet
  -> attempt after attempt (_attempts: restarts, the launch's timeout): backend.run()
  -> [result of rank 0, result of rank 1, ...]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .. import env, hardware
from ..config import DEFAULT, LaunchConfig, document, given
from ..errors import ConfigError, LaunchTimeoutError, UserFrames
from .backend import Backend
from .cluster.backend import for_cluster
from .local.backend import LocalBackend
from .local.forkserver import warm_up_early
from .plan import Watch, banner, checked_size, watch_for_stop
from .show.display import Display
from .wire.payload import build

__all__ = ["debug_launcher", "launch", "notebook_launcher", "warm_up_early"]

_STOPPED = "stopped from the launch panel"


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
        backend = _backend(config, machine, wait_for_machine_0)
        plan = backend.plan()
        checked_size(config, plan)
        display = display or Display(output=config.output)
        try:
            display.banner(banner(config, plan))
            try:  # what prepare took is released, however far it got
                backend.prepare(payload, buffers, display)
                # timeout= bounds the whole launch, restarts included (not each attempt).
                deadline = None if config.timeout is None else time.monotonic() + config.timeout
                watch = watch_for_stop(stop, _STOPPED)
                return _AllNone.of(_attempts(config, display, backend, deadline, watch))
            finally:
                backend.close(display)
        finally:
            display.close()


class _AllNone(list[Any]):
    """Every rank's value when each one is None, as a list that a cell shows as nothing (a
    function that returns nothing: accelerate's launcher returns None, its cell is empty)."""

    @classmethod
    def of(cls, values: list[Any]) -> list[Any]:
        return cls(values) if values and all(v is None for v in values) else values

    def _ipython_display_(self) -> None:
        """IPython shows nothing (``print`` still shows the list)."""


def _backend(
    config: LaunchConfig, machine: hardware.Machine | None, wait_for_machine_0: float | None
) -> Backend:
    """Where the launch's ranks run: a cluster (``config.cluster``), or this machine's TPU
    cores or worker processes, by the hardware its plan resolves to."""
    if config.cluster is not None:
        return for_cluster(config)
    plan = hardware.resolve(config, machine)
    if plan.backend == "xla":
        from .local.xla.backend import XlaBackend  # torch_xla's pool: only on TPU machines

        return XlaBackend(config, plan, wait_for_machine_0)
    return LocalBackend(config, plan, wait_for_machine_0)


def _attempts(
    config: LaunchConfig,
    display: Display,
    backend: Backend,
    deadline: float | None,
    watch: Watch,
) -> list[Any]:
    """Run attempt after attempt until one succeeds or the group gives up: the one restart
    loop of every launch, over every backend (several machines restart together: the
    backend's group, meet/group.py)."""
    group = backend.group
    number = 0
    while True:
        try:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise LaunchTimeoutError(config.timeout)  # type: ignore[arg-type]
            return backend.run(number, display, left, watch)
        except LaunchTimeoutError as exc:
            group.fail(exc)
            if exc.timeout == config.timeout:
                raise
            # The attempt had what was left of the launch's timeout; name the user's (and keep
            # the notes: where each rank was).
            named = LaunchTimeoutError(config.timeout)  # type: ignore[arg-type]
            for note in getattr(exc, "__notes__", ()):
                named.add_note(note)
            raise named from None
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
    stall_time: float | None = DEFAULT,
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
    rdzv_endpoint: str | None = None,
    rdzv_conf: dict[str, float] | None = None,
    rdzv_backend: str | None = None,
    rdzv_id: str | None = None,
    monitor_interval: float | None = None,
    log_line_prefix_template: str | None = None,
) -> list[Any]:
    """Run ``function(*args)`` on ``num_processes`` worker processes and return every result.

    The function may be defined in a notebook cell (it travels by value with cloudpickle).
    Each worker has the torch.distributed variables set (RANK, WORLD_SIZE, MASTER_ADDR, ...),
    so ``torch.distributed.init_process_group()`` or :class:`~notebook_accel.Accelerator`
    work inside it. Output appears in the cell line by line as ``[rank N] ...``.

    Args:
        function: the function to run in every worker.
        args: its positional arguments, as a tuple.
        kwargs: keyword arguments for ``function``.
        use_port: HF accelerate's name for ``master_port``.
        {options}

    Arguments left out take the config file's value (written by the panel's "Save as default"
    or ``notebook-accel config``): ``None`` for most, but ``stall_time=None`` turns its report
    off. The banner names each value that came from the file.

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
        options = given(locals())
        if use_port is not None and master_port is None:
            try:
                options["master_port"] = int(use_port)
            except ValueError:
                raise ConfigError("use_port", use_port, "a TCP port number") from None
        config = LaunchConfig.from_defaults(**options)
        return launch(
            function, args, kwargs, config, wait_for_machine_0=config.wait_for_machine_0()
        )


notebook_launcher.__doc__ = document(notebook_launcher.__doc__)


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
