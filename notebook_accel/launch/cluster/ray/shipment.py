"""A launch's large buffers in Ray's object store, at the transport seam (wire/transport.py).

the notebook (driver.py's prepare)          each rank
ray.put(as_array(buffer)) once each  --->   RayShipment.views(): private copies
its result buffers, inside the       <---   RayShipment.put(): bytes in the value the
  rank's last item (the notebook                task returns (owned by the notebook,
  owns them)                                    not by a worker a stop may kill)
"""

from __future__ import annotations

from typing import Any

from ...wire.pickling import Outgoing
from ...wire.transport import Shipment

__all__ = ["RayShipment", "as_array"]


def as_array(out: Outgoing) -> Any:
    """A buffer as a uint8 numpy array: Ray stores those without pickling them."""
    import numpy as np

    if out.view is not None:
        return np.frombuffer(out.view.cast("B"), dtype=np.uint8)
    host = bytearray(out.nbytes)  # device memory: copied to the host first
    out.copy_into(memoryview(host))
    return np.frombuffer(host, dtype=np.uint8)


class RayShipment(Shipment):
    """The payload's large buffers as objects in Ray's store (transport.py's seam).

    The notebook puts each buffer once; every node fetches it once, and each rank maps it
    from the store and takes a private copy (the store's are read-only; a rank writing into
    a captured tensor changes nobody else's). A rank's result buffers come back inside its
    return value, which Ray keeps in the store under the notebook's ownership: objects a rank
    put itself would die with its worker, which a stopped launch kills.
    """

    def __init__(self, refs: list[Any]) -> None:
        self.refs = refs

    def views(self) -> list[memoryview]:
        import ray

        return [memoryview(bytearray(array)) for array in ray.get(self.refs)]

    def put(self, buffers: list[Outgoing]) -> Any:
        return [bytes(as_array(out)) for out in buffers]

    def get(self, handle: Any) -> list[memoryview]:
        return [memoryview(bytearray(data)) for data in handle]

    def release(self) -> None:
        self.refs = []
