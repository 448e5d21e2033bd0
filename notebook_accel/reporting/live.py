"""Worker side of the live chart and of the panel's per-rank health.

    rank 0: Accelerator.log(values, step)
              -> Relay.add: count the call, remember it as the latest (the hot path)
                 one call in `every` is kept (every=1 up to ~1000 rows/s, then thinned)
                 every 0.25 s: Metrics(kept rows + the latest)  --> parent: chart, rows
    every rank: a daemon thread, every second:
                 Health(rss, gpu memory, steps)                    --> parent: panel rows
                 rows kept before a pause (no log call for an interval): Metrics
    the function returns or raises: stop() sends the rows still pending

A loop logging every iteration sends a few messages a second, not one per call, and its rows
are thinned evenly to about 1000 a second (a slower logger's rows all arrive); the last call
is always sent. Values are converted to floats when a batch is sent, so ``log`` itself only
counts. Outside a launch there is no relay and nothing is sent.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .scalars import scalar

if TYPE_CHECKING:
    from .channel import Sender

__all__ = ["Relay", "start", "stop", "relay", "count_steps"]

_INTERVAL = 0.25  # seconds between two Metrics messages: at most ~4 a second
_BUDGET = 256  # rows kept per interval (~1000 a second); a faster logger is thinned evenly
_HEALTH_INTERVAL = 1.0


class Relay:
    """Keeps ``Accelerator.log`` rows and sends them in batches a few times a second.

    Every row is kept while a loop logs fewer than about ``4 * _BUDGET`` rows a second; a
    faster loop keeps one call in ``every`` (a power of two that adapts), so the notebook's
    chart and rows stay light whatever the logging rate. The latest call is always sent.
    """

    # Slots: ``add`` runs on every ``log`` call, and slot attributes are the cheapest to touch.
    __slots__ = (
        "_sender",
        "_interval",
        "_rows",
        "_count",
        "_next",
        "_every",
        "_cap",
        "_step",
        "_values",
        "_sent_upto",
        "_sent_index",
        "_due",
        "_lock",
    )

    def __init__(self, sender: Sender, interval: float = _INTERVAL) -> None:
        self._sender = sender
        self._interval = interval
        # (call index, step, values) of the kept calls since the last send
        self._rows: list[tuple[int, int | None, dict[str, Any]]] = []
        self._count = 0  # log calls so far
        self._next = 1  # the call count at which the next row is kept
        self._every = 1
        self._cap = _BUDGET
        # the latest call, kept as two fields rather than a tuple built on every call
        self._step: int | None = None
        self._values: dict[str, Any] | None = None
        self._sent_upto = 0  # call count covered by the last send
        self._sent_index = -1  # the call index of the last row sent
        self._due = time.perf_counter() + interval
        # The health thread may send kept rows of a paused loop (send_paused): the list of
        # kept rows changes hands under this lock; the per-call fast path never takes it.
        self._lock = threading.Lock()

    def add(self, step: int | None, values: dict[str, Any]) -> None:
        """One ``log`` call: remembered as the latest; kept when it is its turn."""
        count = self._count + 1
        self._count = count
        self._step = step
        self._values = values
        if count >= self._next:
            self._keep(step, values)

    def _keep(self, step: int | None, values: dict[str, Any]) -> None:
        with self._lock:
            rows = self._rows
            rows.append((self._count - 1, step, dict(values)))  # a copy: dicts get reused
        self._next = self._count + self._every
        if len(rows) >= self._cap:  # logging faster than the budget: keep half as many
            self._every *= 2
            self._cap += _BUDGET // 2
        if time.perf_counter() >= self._due:
            self.flush()

    def flush(self) -> None:
        """Send the kept rows and the latest call now (if anything is new)."""
        with self._lock:  # rows leave in the order they were kept, whichever thread sends
            self._flush()

    def _flush(self) -> None:
        rows, self._rows = self._rows, []
        self._due = time.perf_counter() + self._interval
        calls = self._count - self._sent_upto
        if calls == 0:
            return
        latest = self._count - 1
        if self._values is not None and latest > self._sent_index:
            if not rows or rows[-1][0] != latest:
                rows.append((latest, self._step, dict(self._values)))
        # A slower logger gets every row again.
        if self._every > 1 and calls < self._every * _BUDGET // 4:
            self._every //= 2
        self._cap = _BUDGET
        self._sent_upto = self._count
        self._send(rows)

    def send_paused(self) -> None:
        """Send the kept rows if no call has sent them for an interval (the health thread).

        A loop that logs and then pauses (an evaluation, a wait for data) keeps its last rows
        until its next call; the chart would lag behind by them all that while.
        """
        with self._lock:
            if not self._rows or time.perf_counter() < self._due:
                return
            rows, self._rows = self._rows, []
            self._due = time.perf_counter() + self._interval
            self._send(rows)

    def _send(self, rows: list[tuple[int, int | None, dict[str, Any]]]) -> None:
        from .channel import Metrics

        if not rows:
            return
        self._sent_index = max(self._sent_index, rows[-1][0])
        plain: list[tuple[int, dict[str, float]]] = []
        for index, step, values in rows:
            numbers = {}
            for key, value in values.items():
                kind = type(value)
                number = float(value) if kind is float or kind is int else scalar(value)
                if number is not None:
                    numbers[str(key)] = number
            plain.append((index if step is None else int(step), numbers))
        self._sender.send(Metrics(tuple(plain)))


class _Health(threading.Thread):
    """Sends this rank's memory and step count every second until stopped."""

    def __init__(self, sender: Sender, relay: Relay | None = None) -> None:
        super().__init__(name="notebook-accel-health", daemon=True)
        self.sender = sender
        self.relay = relay
        self.stopped = threading.Event()
        self.steps: Callable[[], int] | None = None

    def run(self) -> None:
        from .channel import Health

        while True:
            try:
                steps = self.steps() if self.steps is not None else None
                self.sender.send(Health(rss=_rss(), gpu=_gpu_memory(), steps=steps))
                if self.relay is not None:
                    self.relay.send_paused()
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
        _health = _Health(sender, _relay)
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
