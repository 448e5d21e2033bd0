"""TPU cores through torch_xla, with the same cloudpickle payload as the CPU/CUDA engine.

    parent (notebook), main thread              torch_xla's processes (spawned)
    ------------------------------              -------------------------------
    xla.run(layout, payload, display, timeout)
      Relay: a unix socket for output (output.py)
      thread: torch_xla's run_multiprocess   -> one process per chip (TPU), one thread
        (private/torch_xla.py; it blocks until   per device: _entry(payload, options, address)
        every process is done)                    output -> the relay (fd 1/2, per thread)
      main thread: relay.pump() ->                launch options -> NOTEBOOK_ACCEL_*
        display (rank-prefixed lines), and        rank/where.arm (a signal, a memfd)
        the deadline / Ctrl-C / a device's        unpickle the call (cell code by value;
        failure report: SIGKILL the processes       large buffers mapped, shm.py)
        that connected (a stall, a deadline,      channel.Result
        Ctrl-C: their stacks read first,          or channel.Failure, reported
        local/where.py)                           to the relay at once as well
      {ordinal: outcome}  -> first failure re-raised as the engine does (original type,
                             worker traceback as __cause__), else results in ordinal order

torch_xla sets up the TPU topology (TPU_VISIBLE_CHIPS, process bounds, ports) for each
process itself; repeating that here would break with each libtpu release, so this module
hands the processes to torch_xla and keeps only the payload, the output, the results and
the errors. The display is fed on the parent's main thread, where Jupyter routes output to
the running cell.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from .... import env, launched
from ....errors import LaunchError, LaunchTimeoutError
from ....launched import Launch
from ....private import torch_xla as private_torch_xla
from ....reporting.channel import Failure, Result
from ...plan import Layout
from ...rank.where import arm
from ...rank.worker import random_state
from ...show.display import Display
from ...show.stall import StallWatch
from ...wire.outcome import root_cause
from ...wire.payload import Payload, load
from ...wire.transport import pack, unpack
from ..where import Process, Processes
from .output import Relay, attach, report_failure

__all__ = ["run"]

Outcome = Result | Failure  # a device's (wire/outcome.py's, without deaths: see _stop)

_TICK = 0.25  # seconds between deadline checks when no output arrives
_DRAIN = 2.0  # seconds to relay the last lines after the processes ended
_STOP_GRACE = 30.0  # seconds to wait for processes still starting after a deadline


def _entry(payload: Payload, launch: Launch, variables: dict[str, str], address: str) -> Outcome:
    """One XLA device's share of the launch (runs in torch_xla's process or thread)."""
    detach = None
    try:
        # Per process, not per device: threads of one process share them (become_rank is
        # once per process for a launch).
        launched.become_rank(launch)
        arm(None)  # [stall report] the parent reads this process's stacks (a signal, a memfd)
        for name, value in variables.items():
            env.set_var(name, value)
        detach = attach(address)
        random_state()
        function, args, kwargs = load(payload)
        value = function(*args, **kwargs)
        assert payload.shipment is not None, "the launch ships every payload"
        return pack(payload.shipment, value)
    except BaseException as exc:  # the parent re-raises it as the engine does
        failure = Failure.from_exception(exc)
        with contextlib.suppress(Exception):
            report_failure(address, failure)  # the parent stops the other devices now
        return failure
    finally:
        if detach is not None:
            detach()  # this device's lines reach the parent before its result does


@contextmanager
def _device_limit(layout: Layout) -> Iterator[None]:
    """Use ``num_processes`` devices: torch_xla reads the count from these variables."""
    pjrt = env.pjrt_device() or "TPU"
    values: dict[str, str | None] = {"PJRT_DEVICE": pjrt}
    if pjrt == "CPU":
        values["CPU_NUM_DEVICES"] = str(layout.num_processes)
    elif not env.tpu_topology_given():
        values["TPU_NUM_DEVICES"] = str(layout.num_processes)
    with env.overridden(values):
        yield


def _outcomes(layout: Layout, payload: Payload, address: str) -> dict[int, Outcome]:
    # The launch (its options, whole) as the engine's workers get it, and its variables.
    variables = {**layout.launch.variables(), **dict(layout.extra_env)}
    try:
        return private_torch_xla.run_multiprocess(
            _entry, payload, layout.launch, variables, address
        )
    except RuntimeError as exc:
        if "already initialized" in str(exc):
            raise LaunchError(
                "the XLA device was used in this process before the launch; torch_xla "
                "cannot start TPU workers after that. Restart the kernel and launch "
                "before touching torch_xla in the notebook."
            ) from exc
        raise
    except Exception as exc:  # BrokenProcessPool: a process died without an answer
        raise LaunchError(f"a TPU worker process died: {type(exc).__name__}: {exc}") from exc


def _in_thread(layout: Layout, payload: Payload, address: str) -> Future[dict[int, Outcome]]:
    """Start torch_xla's launch in a thread; it blocks until every process has finished."""
    future: Future[dict[int, Outcome]] = Future()

    def target() -> None:
        try:
            future.set_result(_outcomes(layout, payload, address))
        except BaseException as exc:
            future.set_exception(exc)

    # A daemon: if torch_xla's pool never returns, the notebook's kernel can still exit.
    threading.Thread(target=target, name="notebook-accel-xla", daemon=True).start()
    return future


def _supervise(
    relay: Relay,
    future: Future[dict[int, Outcome]],
    timeout: float | None,
    watch: Callable[[], None] | None,
    stalls: StallWatch | None = None,
) -> dict[int, Outcome]:
    """Relay output until torch_xla returns; on the deadline or Ctrl-C, stop the processes
    (``stalls``: where each process's device threads were goes into the error's notes).

    ``watch`` is the engine's per-tick hook (the panel's Stop raises KeyboardInterrupt there).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not future.done():
            if relay.failures:
                # A device failed: its peers may be blocked in a collective that never
                # returns, so stop every process now, as the engine does.
                _stop(relay, future)
                return dict(relay.failures)
            if watch is not None:
                watch()
            if deadline is not None and time.monotonic() >= deadline:
                raise LaunchTimeoutError(timeout)  # type: ignore[arg-type]
            relay.display.tick()
            relay.pump(_TICK)
    except (KeyboardInterrupt, LaunchTimeoutError) as exc:
        if stalls is not None:
            stalls.note(exc, relay.pump)
        _stop(relay, future)
        raise
    relay.drain(_DRAIN)
    return future.result()


def _stop(relay: Relay, future: Future[dict[int, Outcome]]) -> None:
    """SIGKILL torch_xla's processes; a process still starting is killed when it connects.

    run_multiprocess keeps its pool to itself, so the processes are known by the pid each one
    sends with its output connection. Once one dies, the pool is broken and Python's executor
    terminates the rest itself; then run_multiprocess returns (with an error nobody reads).
    """
    end = time.monotonic() + _STOP_GRACE
    while not future.done() and time.monotonic() < end:
        relay.kill()
        relay.pump(0.1)
    relay.drain(0.5)


def _processes(relay: Relay, devices: int) -> Callable[[], list[Process]]:
    """[stall report] torch_xla's processes as they connected: each one's first rank and
    label (a process of several devices: every device thread shows in its stacks); while
    not every device has connected, a process still starting."""

    def processes() -> list[Process]:
        found = [
            Process(rank, pid, label=label, answers=False)
            for pid, (rank, label) in sorted(relay.processes.items(), key=lambda p: p[1])
        ]
        covered = sum(_devices(label) for _, label in relay.processes.values())
        if covered < devices:
            found.append(Process(devices - 1, None, state="starting"))
        return found

    return processes


def _devices(label: str) -> int:
    """How many devices a process's label covers ("ranks 0-3": 4; none: 1)."""
    if not label:
        return 1
    first, last = label.split()[-1].split("-")
    return int(last) - int(first) + 1


def run(
    layout: Layout,
    payload: Payload,
    display: Display,
    timeout: float | None,
    watch: Callable[[], None] | None = None,
) -> list[Any]:
    """Run the payload on every XLA device; results in ordinal order, errors as the engine's.

    Every device's output reaches ``display`` as ``[rank N] line`` (``[ranks 0-1]`` for what
    C code writes in a process that holds several devices). ``timeout`` stops the processes
    with SIGKILL and raises ``LaunchTimeoutError``.

    Example:
        >>> run(Layout(num_processes=8, launch=Launch(config, "xla", "xla")),
        ...     payload, Display(), None)  # doctest: +SKIP
        [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    """
    from ..forkserver import main_hidden

    # torch_xla's pool spawns its processes; hiding __main__ keeps a script launched without
    # an ``if __name__ == "__main__"`` guard from running again in each of them.
    with Relay(display) as relay, _device_limit(layout), main_hidden():
        processes = Processes(_processes(relay, layout.num_processes), payload.code_origins)
        stalls = display.watch_stalls(layout.launch.options.stall_time, processes)
        try:
            future = _in_thread(layout, payload, relay.address)
            outcomes = _supervise(relay, future, timeout, watch, stalls)
        finally:
            display.watch_stalls(None, None)
    problem = root_cause(outcomes, layout.world_size, payload)
    if problem is not None:
        raise problem
    assert payload.shipment is not None, "the launch ships every payload"
    return [unpack(payload.shipment, outcomes[o]) for o in sorted(outcomes)]  # type: ignore[arg-type]
