"""What travels: cloudpickle by value, with large buffers taken out of band (protocol 5).

    dumps(obj)                                       loads(data, views)
    ----------                                       ------------------
    cloudpickle, protocol 5                          pickle.loads(data, buffers=views)
      numpy / pandas arrays -> PickleBuffer            numpy rebuilds over the view
      torch storages (CPU)  -> PickleBuffer            torch.frombuffer(view) -> storage
      torch storages (CUDA) -> placeholder + copier    ... then .to(this worker's GPU)
    buffer >= INLINE_LIMIT  -> Outgoing (out of band)
    smaller buffers         -> inside the pickle

Pickling decides *what* goes out of band and records what identifies each buffer (its
address, and for torch storages the tensor's version counter and the storage itself); the
transport (transport.py) decides *how* those buffers reach the other side. No large buffer is
copied here: an ``Outgoing`` is a view of the notebook's own memory.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import pickle
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from ...private import torch as private_torch

__all__ = ["INLINE_LIMIT", "Outgoing", "Pickled", "address", "dumps", "loads"]

INLINE_LIMIT = 1 << 20  # bytes; smaller buffers stay in the ordinary pickle


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (stable ABI), to read any buffer's address, read-only too."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def address(buffer: Any) -> int:
    """The address of a contiguous buffer's first byte (valid while ``buffer`` lives)."""
    view = _PyBuffer()
    _get_buffer(buffer, ctypes.byref(view), 0)  # PyBUF_SIMPLE: contiguous bytes
    try:
        return int(view.buf or 0)
    finally:
        _release_buffer(ctypes.byref(view))


@dataclass(eq=False)
class Outgoing:
    """One large buffer leaving this process, still in its owner's memory.

    Attributes:
        nbytes: its size.
        view: a byte view of host memory; ``None`` for device memory (then ``fill`` copies).
        key: what identifies it for the cache: ``("torch", device, pointer, nbytes)`` or
            ``("host", address, nbytes)``.
        version: a torch tensor's version counter when the buffer was reached (in-place
            writes through the tensor raise it); ``None``: compare the contents instead.
        owner: a weak reference to the torch storage: a cached copy is valid only while the
            very same storage lives (its address could be reused by another one).
        fill: copies device memory into a host destination view.
    """

    nbytes: int
    view: memoryview | None
    key: tuple[Any, ...]
    version: int | None = None
    owner: weakref.ref[Any] | None = None
    fill: Callable[[memoryview], None] | None = None
    keep: list[Any] = field(default_factory=list)  # what must live while the buffer travels

    def copy_into(self, destination: memoryview) -> None:
        """Write the bytes into ``destination`` (same size)."""
        if self.fill is not None:
            self.fill(destination)
        else:
            assert self.view is not None
            ctypes.memmove(address(destination), address(self.view), self.nbytes)


@dataclass
class Pickled:
    """A pickle and its out-of-band buffers, in the order ``loads`` wants them."""

    data: bytes
    buffers: list[Outgoing]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle that sends torch storages as raw bytes (out of band when large).

    Torch's own storage pickling goes through ``torch.save``, a copy per pickle; here a
    storage becomes a ``PickleBuffer`` over its memory instead, numpy's way. ``placement``
    says where CUDA storages land: ``"local"`` (the payload: each worker's own GPU) or
    ``"same"`` (results: the device index they had).
    """

    def __init__(self, file: io.BytesIO, placement: str, limit: int, discard: bool) -> None:
        super().__init__(file, protocol=5, buffer_callback=self._buffer)
        self.placement = placement
        self.limit = limit
        self.discard = discard  # the culprit search: buffers are dropped, never copied
        self.buffers: list[Outgoing] = []
        self._pending: dict[int, Outgoing] = {}  # id(PickleBuffer) -> what we know of it
        self._versions: dict[tuple[Any, ...], int | None] = {}  # None: torch has none
        self._keep: list[Any] = []
        self._torch: Any = sys.modules.get("torch")  # never imported here: only if the user did

    def reducer_override(self, obj: Any) -> Any:
        torch = self._torch
        if torch is not None:
            if isinstance(obj, torch.Tensor):
                self._note_version(obj)
            elif isinstance(obj, torch.storage.TypedStorage | torch.UntypedStorage):
                reduced = self._reduce_storage(obj)
                if reduced is not None:
                    return reduced
        return super().reducer_override(obj)

    def _note_version(self, tensor: Any) -> None:
        # The first tensor that reaches a storage gives its version counter: a Parameter is
        # reached before its ``.data`` (a fresh counter, always 0).
        try:
            storage = tensor.untyped_storage()
            key = _storage_key(storage)
        except (RuntimeError, NotImplementedError, TypeError):
            return  # sparse, nested, meta...: torch's own pickling handles those
        self._versions.setdefault(key, private_torch.tensor_version(tensor))

    def _reduce_storage(self, obj: Any) -> tuple[Any, ...] | None:
        torch = self._torch
        typed = isinstance(obj, torch.storage.TypedStorage)
        storage = private_torch.untyped_storage(obj) if typed else obj
        device = storage.device
        if device.type not in ("cpu", "cuda"):
            return None
        nbytes = storage.nbytes()
        key = _storage_key(storage)
        dtype = obj.dtype if typed else None
        where = None
        if device.type == "cuda":
            where = "cuda" if self.placement == "local" else str(device)
        if device.type == "cuda" and nbytes >= self.limit:
            # An untouched anonymous mapping of the right size, so no host memory: the
            # transport copies from the GPU (or finds the copy in its cache).
            holder = mmap.mmap(-1, nbytes)
            out = Outgoing(
                nbytes, None, key, self._versions.get(key), weakref.ref(storage), _gpu_fill(storage)
            )
        else:
            host = storage if device.type == "cpu" else storage.cpu()
            holder = _host_bytes(host)
            view = memoryview(holder).cast("B")
            out = Outgoing(nbytes, view, key, self._versions.get(key), weakref.ref(storage))
        out.keep.extend([storage, holder])
        buffer = pickle.PickleBuffer(holder)
        self._pending[id(buffer)] = out
        self._keep.append(buffer)
        return (_rebuild_storage, (buffer, dtype, where))

    def release(self) -> None:
        self._pending.clear()
        self._versions.clear()
        self._keep.clear()
        self.buffers = []

    def _buffer(self, buffer: pickle.PickleBuffer) -> bool:
        """Out of band (return False) for large buffers; small ones stay in the pickle."""
        out = self._pending.pop(id(buffer), None)
        if out is None:
            view = buffer.raw()
            if view.nbytes < self.limit:
                return True
            out = Outgoing(view.nbytes, view, ("host", address(view), view.nbytes))
            out.keep.append(buffer)
        elif out.nbytes < self.limit:
            return True
        if not self.discard:
            self.buffers.append(out)
        return False


def _storage_key(storage: Any) -> tuple[Any, ...]:
    return ("torch", str(storage.device), storage.data_ptr(), storage.nbytes())


def _host_bytes(storage: Any) -> Any:
    """The CPU storage's bytes as a writable buffer over its memory (no copy)."""
    nbytes = storage.nbytes()
    if nbytes == 0:
        return bytearray()
    return (ctypes.c_char * nbytes).from_address(storage.data_ptr())


def _gpu_fill(storage: Any) -> Callable[[memoryview], None]:
    def fill(destination: memoryview) -> None:
        import torch

        source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        torch.frombuffer(destination, dtype=torch.uint8).copy_(source)

    return fill


def _rebuild_storage(buffer: Any, dtype: Any, where: str | None) -> Any:
    """A storage over ``buffer`` (no copy), moved to ``where`` when it lived on a GPU."""
    import torch

    if len(memoryview(buffer)) == 0:
        storage = torch.UntypedStorage(0)
    else:
        storage = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
    if where is not None:
        storage = storage.to(device=_gpu(where))
    if dtype is None:
        return storage
    return torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)


def _gpu(where: str) -> Any:
    """``"cuda"``: this worker's own GPU (one per local rank); else the device named."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "a CUDA tensor captured in the notebook cannot be restored: this process sees no "
            "CUDA device. Launch with hardware='cuda', or move the tensor to the CPU first."
        )
    if where != "cuda":
        return torch.device(where)
    from ... import env

    local_rank = env.read_distributed().local_rank
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def dumps(
    obj: Any, placement: str = "local", limit: int = INLINE_LIMIT, discard: bool = False
) -> Pickled:
    """Pickle ``obj`` by value; buffers of ``limit`` bytes or more stay out of band.

    ``discard=True`` only checks that ``obj`` pickles: large buffers are neither kept nor
    copied (the pre-flight culprit search uses it).
    """
    file = io.BytesIO()
    pickler = _Pickler(file, placement, limit, discard)
    try:
        pickler.dump(obj)
        return Pickled(file.getvalue(), pickler.buffers)
    finally:
        # The pickler is in a cycle (its buffer callback is its own method): drop what it
        # holds now, so that what the notebook deletes is freed now, not at the next GC.
        pickler.clear_memo()
        pickler.release()


def loads(data: bytes, views: list[memoryview]) -> Any:
    """Unpickle, with ``views`` standing for the out-of-band buffers, in order."""
    return pickle.loads(data, buffers=views)
