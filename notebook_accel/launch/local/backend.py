"""This machine's backend: its workers (LocalBackend; its TPU cores: xla/backend.py's).

plan()     the plan (hardware.resolve, made by the launcher when it picked this backend);
           the job's secret read when several machines meet (a bad one: a ConfigError
           before any process)
prepare()  the forkserver warm (forkserver.warm_up), the large buffers into shared memory
           once (wire/shm.py), where the ranks meet (meet/rendezvous.py: a memfd
           FileStore; several machines: machine 0's table behind the gate) and the
           machines' group (meet/group.py), held until close()
run(n)     attempt n: the engine's workers meet in fresh keys of the store
           (place.attempt), run and are stopped whatever the ending (engine.py); the
           machines in step (the group's watch), refused connections into the banner; a
           stall reported, a timeout's or stop's error noted (where.py, show/stall.py)
close()    machine 0's last refusals said; everything prepare took, released
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from ... import hardware
from ...config import LaunchConfig
from ..meet.group import Group, joined, rendezvous_timeout
from ..meet.rendezvous import Meeting, meeting
from ..meet.secret import job_secret
from ..plan import Watch, layout_for, watching
from ..show.display import Display
from ..wire.payload import Payload
from ..wire.pickling import Outgoing
from ..wire.shm import shipped
from .engine import Engine
from .forkserver import warm_up
from .where import Processes, engine_ranks

__all__ = ["LocalBackend"]


class LocalBackend:
    """A launch's ranks as this machine's worker processes (with other machines' in step).

    Args:
        config: the launch's options.
        plan: what runs here (hardware.resolve).
        wait_for_machine_0: seconds the other machines wait for machine 0 (default:
            group.rendezvous_timeout).
    """

    name = "local"

    def __init__(
        self, config: LaunchConfig, plan: hardware.Plan, wait_for_machine_0: float | None = None
    ) -> None:
        self.config = config
        self._plan = plan
        self._waiting = wait_for_machine_0 or rendezvous_timeout(config)
        self._secret = b""
        self._held = contextlib.ExitStack()
        self._payload: Payload | None = None
        self._place: Meeting | None = None
        self.group = Group(config, None)

    def plan(self) -> hardware.Plan:
        if self.config.num_nodes > 1:
            self._secret = job_secret()  # a bad one: before any process
        return self._plan

    def prepare(self, payload: Payload, buffers: list[Outgoing], display: Display) -> None:
        self._warm_up()
        held = self._held
        shipment = held.enter_context(shipped(buffers))
        self._place = held.enter_context(meeting(self.config, self._waiting, self._secret))
        self.group = held.enter_context(joined(self.config, self._place.group))
        for note in self._place.notes:
            display.banner(note)
        self._payload = dataclasses.replace(payload, shipment=shipment)

    def _warm_up(self) -> None:
        warm_up(self.config.start_method)

    def run(self, attempt: int, display: Display, timeout: float | None, watch: Watch) -> list[Any]:
        watch = watching(watch, self.group.watch(attempt), self._refusals(display))
        return self._attempt(attempt, display, timeout, watch)

    def _attempt(
        self, attempt: int, display: Display, timeout: float | None, watch: Watch
    ) -> list[Any]:
        assert self._place is not None and self._payload is not None, "prepare() first"
        # Each attempt's workers meet in fresh keys (rendezvous.py).
        with self._place.attempt(attempt) as (port, store):
            layout = layout_for(self.config, self._plan, attempt, store)
            engine = Engine(layout, self._payload, display, port, self.config.start_method, watch)
            try:
                watch_stalls(display, engine, self.config, self._payload)
                result = engine.run(timeout)
            finally:
                display.watch_stalls(None, None)
            self.group.done(attempt)  # machine 0 keeps the table up until every machine is done
        return result

    def _refusals(self, display: Display) -> Watch:
        """Machine 0's refused connections since the last look, into the banner."""
        place = self._place
        if place is None or place.gate is None:
            return None

        def check() -> None:
            for line in place.refusals():
                display.banner(line)

        return check

    def close(self, display: Display) -> None:
        try:
            if self._place is not None:
                for line in self._place.refusals(final=True):
                    display.banner(line)
        finally:
            self._held.close()


def watch_stalls(display: Display, engine: Engine, config: LaunchConfig, payload: Payload) -> None:
    """[stall report] ``display`` looks for a stall of ``engine``'s ranks (config.stall_time),
    and a timeout's or the stop button's error notes where they were (stall_time None too:
    only the report by itself is off)."""
    stalls = display.watch_stalls(
        config.stall_time, Processes(engine_ranks(engine), payload.code_origins)
    )
    assert stalls is not None
    engine.before_stop = lambda exc: stalls.note(exc, engine.poll)
