"""The seam between what travels (pickling.py) and how large buffers travel (a transport).

    parent (notebook)                                  every worker
    -----------------                                  ------------
    pickling.dumps(call) -> data + Outgoing buffers
    Transport.ship(buffers) -> Shipment  ---------->   inside the Payload
                                                       Shipment.views(): private views
                                                       loads(data, views) -> the call
                                                       ... run ...
                                                       pack(): dumps(value) and
                                                         Shipment.put(buffers) -> handle
    unpack(): Shipment.get(handle) -> views  <------   Result(data, handle)
    Shipment.release(): the launch is over

The machine-local transport is shm.py (memfd segments, a cache for the kernel's life).
Another transport, Ray's object store for instance, plugs in here: ``ship`` puts the buffers
in the store, the Shipment carries the object references, ``views`` gets them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ...reporting.channel import Result
from .pickling import Outgoing, dumps, loads

__all__ = ["Transport", "Shipment", "Paired", "pack", "unpack"]


class Shipment(ABC):
    """One launch's large buffers, and where its results' large buffers go.

    It is pickled into every worker (inside the Payload); ``views`` and ``put`` run there,
    ``get`` and ``release`` in the parent.
    """

    @abstractmethod
    def views(self) -> list[memoryview]:
        """Worker: the payload's buffers, in order; each call gets its own private copy."""

    @abstractmethod
    def put(self, buffers: list[Outgoing]) -> Any:
        """Worker: hand a result's buffers over; returns a small picklable handle."""

    @abstractmethod
    def get(self, handle: Any) -> list[memoryview]:
        """Parent: the buffers ``put`` handed over, as views the notebook then owns."""

    def release(self) -> None:  # noqa: B027 - a transport with nothing to release
        """Parent: the launch is over (however it ended); end what it alone used."""


class Paired(Shipment):
    """One call's buffers from ``inputs``, its results through ``results``.

    A session's workers get one results shipment when they start and keep it; each call then
    brings only its own buffers (local/session.py, rank/serve.py). Each side pairs the two
    itself: a Paired never travels.
    """

    def __init__(self, inputs: Shipment, results: Shipment) -> None:
        self.inputs = inputs
        self.results = results

    def views(self) -> list[memoryview]:
        return self.inputs.views()

    def put(self, buffers: list[Outgoing]) -> Any:
        return self.results.put(buffers)

    def get(self, handle: Any) -> list[memoryview]:
        return self.results.get(handle)

    def release(self) -> None:
        self.inputs.release()  # the results shipment lasts as long as the session


class Transport(ABC):
    """Places a payload's large buffers where the workers can map them."""

    @abstractmethod
    def ship(self, buffers: list[Outgoing]) -> Shipment:
        """Make ``buffers`` available to the workers of one launch."""


def pack(shipment: Shipment, value: Any) -> Result:
    """Worker: a return value as a Result; large buffers go through the shipment."""
    pickled = dumps(value, placement="same")
    handle = shipment.put(pickled.buffers) if pickled.buffers else None
    return Result(pickled.data, handle)


def unpack(shipment: Shipment, result: Result) -> Any:
    """Parent: the return value again, its large buffers mapped, not copied."""
    views = shipment.get(result.handle) if result.handle is not None else []
    return loads(result.value, views)
