"""Keep the launchers of several machines in step: one group, restarted as one.

Each machine runs the same ``notebook_launcher`` call (or ``notebook-accel launch``). Machine
0's launcher holds the launch's table (rendezvous.py: behind a gate on ``master_port`` that
lets in only machines proving the job's secret) for the launch's whole life, like torchrun's
agent; every other launcher joins it. Each attempt's workers meet in fresh keys of their own,
so a restart is a new rendezvous round.

    machine k launcher                     table on machine 0 (keys under group/notebook_accel/)
    ------------------                     ------------------------------------------------
    local attempt N failed, may restart -> set  restart/N        (every machine polls it)
    a peer set restart/N                <- check, stop local workers, start attempt N+1
    gave up (no restarts left, timeout,
      interrupted, error)               -> set  failed           (every machine stops)
    local attempt N succeeded           -> add  done/N; wait until every machine added, so
                                           machine 0 keeps the store up while others finish;
                                           the others add left/N before machine 0 closes it

On a single machine the group is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ...config import LaunchConfig
from ...errors import ConfigError, LaunchError
from .table import TableClient

__all__ = ["Group", "PeerRestart", "PeerFailed", "rendezvous_timeout", "joined"]

_KEY = "notebook_accel/"
_CHECK_EVERY = 0.5  # seconds between looks at the store while workers run
_LEAVE_WAIT = 10.0  # seconds machine 0 waits for the others to read "all done"
_DEFAULT_RENDEZVOUS = 300.0  # seconds a machine waits for machine 0's store


class PeerRestart(LaunchError):
    """Another machine's attempt failed: this machine restarts its workers too."""


class PeerFailed(LaunchError):
    """Another machine gave up: this machine stops too (never restarted)."""


def rendezvous_timeout(config: LaunchConfig) -> float:
    """Seconds to wait for machine 0: the launch's ``timeout`` when shorter than 300 s."""
    return min(_DEFAULT_RENDEZVOUS, config.timeout or _DEFAULT_RENDEZVOUS)


class Group:
    """This machine's view of the group of launchers, over the launch's table.

    Args:
        config: the launch's configuration (num_nodes, node_rank, max_restarts).
        store: the launchers' keys in machine 0's table (rendezvous.Meeting.group), or
            ``None`` on a single machine.

    Example:
        >>> group = Group(LaunchConfig(), None)  # one machine: every method is a no-op
        >>> group.restarting(0, RuntimeError("boom"))
        False
    """

    def __init__(self, config: LaunchConfig, store: TableClient | None) -> None:
        self.config = config
        self.store: Any = store  # None on a single machine
        self._settled = False  # this machine published done or failed

    # -- while an attempt runs --------------------------------------------------------------
    def watch(self, attempt: int) -> Callable[[], None] | None:
        """A check the engine calls while it waits; it raises when a peer restarts or fails."""
        if self.store is None:
            return None
        next_look = 0.0

        def check() -> None:
            nonlocal next_look
            now = time.monotonic()
            if now >= next_look:
                next_look = now + _CHECK_EVERY
                self._raise_if_peers_moved(attempt)

        return check

    def _raise_if_peers_moved(self, attempt: int) -> None:
        failed, restart = _KEY + "failed", f"{_KEY}restart/{attempt}"
        try:
            if self.store.check([failed]):
                raise PeerFailed(f"another machine gave up: {self._text(failed)}")
            if self.store.check([restart]):
                raise PeerRestart(f"another machine restarts: {self._text(restart)}")
        except LaunchError:
            raise
        except Exception as exc:  # the store's connection: machine 0's launcher is gone
            raise LaunchError(
                f"lost contact with machine 0 at {self.config.master_addr}:"
                f"{self.config.master_port} ({exc}); its launcher stopped or the network failed."
            ) from exc

    def _text(self, key: str) -> str:
        return bytes(self.store.get(key)).decode("utf-8", errors="replace")

    def _publish(self, key: str, exc: BaseException) -> None:
        if self.store is None:
            return
        text = f"machine {self.config.node_rank}: {type(exc).__name__}: {exc}".splitlines()[0]
        with suppress(Exception):  # best effort: the store may be gone already
            self.store.set(key, text[:500])

    # -- after an attempt -------------------------------------------------------------------
    def cause(self, attempt: int, exc: BaseException) -> BaseException:
        """The reason to report: a peer's restart, when it came first and broke ours.

        When machine 0 restarts, it closes the attempt's store, and this machine's workers
        often fail on that before the next look at the group store: the root cause is the
        peer's restart, not the lost connection.
        """
        key = f"{_KEY}restart/{attempt}"
        if self.store is None or isinstance(exc, LaunchError):
            return exc
        with suppress(Exception):
            if self.store.check([key]):  # not ours: we publish only after this
                return PeerRestart(f"another machine restarts: {self._text(key)}")
        return exc

    def restarting(self, attempt: int, exc: BaseException) -> bool:
        """Whether to start attempt ``attempt + 1`` after ``exc``; tells the other machines."""
        final = isinstance(exc, ConfigError | PeerFailed) or attempt >= self.config.max_restarts
        if final:
            self.fail(exc)
            return False
        self._publish(f"{_KEY}restart/{attempt}", exc)
        return True

    def fail(self, exc: BaseException) -> None:
        """Tell the other machines that this one gave up."""
        if not self._settled and not isinstance(exc, PeerFailed):
            self._publish(_KEY + "failed", exc)
        self._settled = True

    def done(self, attempt: int) -> None:
        """Wait until every machine's attempt ``attempt`` succeeded (an exit barrier)."""
        if self.store is None:
            return
        nodes = self.config.num_nodes
        try:
            self.store.add(f"{_KEY}done/{attempt}", 1)
        except Exception as exc:
            raise LaunchError(f"lost contact with machine 0 while finishing ({exc})") from exc
        while int(self.store.add(f"{_KEY}done/{attempt}", 0)) < nodes:
            self._raise_if_peers_moved(attempt)
            time.sleep(0.1)
        self._settled = True
        if self.config.node_rank != 0:
            with suppress(Exception):
                self.store.add(f"{_KEY}left/{attempt}", 1)
            return
        end = time.monotonic() + _LEAVE_WAIT
        while time.monotonic() < end:
            if int(self.store.add(f"{_KEY}left/{attempt}", 0)) >= nodes - 1:
                break
            time.sleep(0.05)


@contextmanager
def joined(config: LaunchConfig, store: TableClient | None) -> Iterator[Group]:
    """The group for one launch, over the launchers' keys (``None`` on a single machine).

    Leaving with an exception (KeyboardInterrupt included) tells the other machines to stop.
    """
    group = Group(config, store if config.num_nodes > 1 else None)
    try:
        yield group
    except BaseException as exc:
        group.fail(exc)
        raise
