"""Worker side of the live chart and of the panel's per-rank health.

    rank 0: Accelerator.log(values, step)
              -> Relay.add: append (step, values) to a list     (the hot path: no clock)
                 every `stride` calls: read the clock;
                 every 0.25 s: Metrics(rows since the last send)  --> parent: chart, rows
    every rank: a daemon thread, every second:
                 Health(rss, gpu memory, steps)                    --> parent: panel rows
    the function returns or raises: stop() sends the rows still pending

Every logged row reaches the parent (batched: a loop logging each iteration sends a few
messages per second, not one per call). Values are converted to floats when a batch is sent,
so ``log`` itself only appends. Outside a launch there is no relay and nothing is sent.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .tracking import scalar

if TYPE_CHECKING:
    from .launch.channel import Sender

__all__ = ["Relay", "start", "stop", "relay", "count_steps"]

_INTERVAL = 0.25  # seconds between two Metrics messages: at most ~4 a second
_CHECKS_PER_INTERVAL = 20  # clock reads aimed for per interval
_MAX_STRIDE = 1 << 14
_HEALTH_INTERVAL = 1.0


class Relay:
    """Batches ``Accelerator.log`` rows and sends them a few times a second."""

    def __init__(self, sender: Sender, interval: float = _INTERVAL) -> None:
        self._sender = sender
        self._interval = interval
        self._rows: list[tuple[int | None, dict[str, Any]]] = []
        self._logged = 0  # rows sent so far: the step of a row logged without one
        self._stride = 1
        self._check = 1
        self._last = time.perf_counter()
        self._due = self._last + interval

    def add(self, step: int | None, values: dict[str, Any]) -> None:
        """Keep one logged row (a copy: callers often reuse their dict)."""
        rows = self._rows
        rows.append((step, dict(values)))
        if len(rows) >= self._check:
            self._tick()

    def _tick(self) -> None:
        now = time.perf_counter()
        if now >= self._due:
            self.flush()
        # Aim for a few clock reads per interval, whatever the logging rate.
        gap = now - self._last
        target = self._interval / _CHECKS_PER_INTERVAL
        if gap < target / 2 and self._stride < _MAX_STRIDE:
            self._stride *= 2
        elif gap > target * 2 and self._stride > 1:
            self._stride //= 2
        self._last = now
        self._check = len(self._rows) + self._stride

    def flush(self) -> None:
        """Send the pending rows now (if any)."""
        from .launch.channel import Metrics

        rows, self._rows = self._rows, []
        self._due = time.perf_counter() + self._interval
        if not rows:
            return
        plain: list[tuple[int, dict[str, float]]] = []
        for i, (step, values) in enumerate(rows):
            numbers = {str(k): n for k, v in values.items() if (n := scalar(v)) is not None}
            plain.append((self._logged + i if step is None else int(step), numbers))
        self._logged += len(rows)
        self._check = self._stride
        self._sender.send(Metrics(tuple(plain)))


class _Health(threading.Thread):
    """Sends this rank's memory and step count every second until stopped."""

    def __init__(self, sender: Sender) -> None:
        super().__init__(name="notebook-accel-health", daemon=True)
        self.sender = sender
        self.stopped = threading.Event()
        self.steps: Callable[[], int] | None = None

    def run(self) -> None:
        from .launch.channel import Health

        while True:
            try:
                steps = self.steps() if self.steps is not None else None
                self.sender.send(Health(rss=_rss(), gpu=_gpu_memory(), steps=steps))
            except Exception:  # noqa: BLE001  (a vital sign is never worth a worker's life)
                pass
            if self.stopped.wait(_HEALTH_INTERVAL):
                return


def _rss() -> int:
    """Resident memory of this process in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _gpu_memory() -> int | None:
    """Bytes torch holds on this rank's GPU; None before CUDA is initialised (no GPU use)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_allocated())


_relay: Relay | None = None
_health: _Health | None = None


def start(sender: Sender, health: bool = True) -> None:
    """Called by the worker entry point: rows and health go to the parent from now on."""
    global _relay, _health
    _relay = Relay(sender)
    if health:
        _health = _Health(sender)
        _health.start()


def stop() -> None:
    """Send the last rows, stop the health thread (the worker is about to report its end)."""
    global _relay, _health
    relay_, _relay = _relay, None
    if relay_ is not None:
        relay_.flush()
    health, _health = _health, None
    if health is not None:
        health.stopped.set()
        health.join(timeout=2.0)


def relay() -> Relay | None:
    """This worker's relay, or ``None`` outside a launch."""
    return _relay


def count_steps(getter: Callable[[], int]) -> None:
    """Report ``getter()`` as this rank's step count (the Accelerator registers itself)."""
    if _health is not None:
        _health.steps = getter
