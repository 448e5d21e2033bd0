"""The notebook's own large buffers, left out of the zygote's fork.

    the caller, at a zygote's fork (forkserver._start_zygote)
    ---------------------------------------------------------
    own_buffers(): what only the notebook's namespace reaches (namespace.py: counted by
      references; what anything else refers to, and all it reaches, is kept); of that, the
      buffers of 1 MiB or more: CPU tensors' storages that no tensor not found uses, numpy
      arrays owning their data; their whole pages in private anonymous memory
    left_out(): MADV_DONTFORK on those pages, the fork, MADV_DOFORK           the zygote
                                                                             ----------
                                                          reserve(): the ranges PROT_NONE
                                                          (nothing mapped there later; a
                                                          touch is a SIGSEGV)

A zygote that kept the notebook's pages as they were at its fork would hold every buffer the
notebook frees later (4 GiB after ``del data``): a page stays in use while one process maps
it. Left out of the fork, they are never the zygote's nor its workers': a ``del`` in the
notebook gives the memory back at once, as with a fork launcher whose workers end, and the
fork copies no page tables for them (a kernel holding 8 GiB forks as fast as an empty one).

No worker reads them: a launch's function and what it captures travel by value (large
buffers through shared memory, wire/shm.py), and the notebook's namespace is no module a
worker imports. What a worker could reach by reference is kept: anything referred to from
outside the notebook's namespace (a module's global, ``from data import X``, a library's
registry, a frame, a weak reference from outside, torch's C++ side), with all it reaches,
and a storage that a tensor not found shares. Not seen: a function or class the notebook
defined and handed to a library (a hook, a registry entry) reads the notebook's globals when
a worker calls it there; a large buffer it reads by name is not in the worker (SIGSEGV,
WorkerDiedError). ``NOTEBOOK_ACCEL_FORK_NOTEBOOK_DATA=1`` forks everything, as before.

Not found, and so held by the zygote as before: other kinds of buffers (bytes, Arrow's),
gradients (torch keeps ``.grad`` in C++), what the walk did not read (namespace.py: a
container of more than 16384 items, beyond 50,000 objects or 0.1 s), small objects, the
interpreter's arenas.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import mmap
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ... import env
from ...private import torch as private_torch
from . import namespace

__all__ = ["Found", "found_in", "left_out", "own_buffers", "reserve"]

Buffers = list[tuple[int, int]]  # (address, bytes) each

MIN_BYTES = 1 << 20  # smaller buffers stay in the fork: their pages may hold other objects
_PAGE = mmap.PAGESIZE
_MADV_DONTFORK = 10
_MADV_DOFORK = 11
_PROT_NONE = 0
_MAP_NORESERVE = 0x4000
_MAP_FIXED_NOREPLACE = 0x100000

# Set in the caller while a zygote is forked: the ranges its fork leaves out (reserve).
_leaving: list[tuple[int, int]] = []


@dataclass
class Found:
    """What ``own_buffers`` found.

    Attributes:
        ranges: whole pages of the notebook's own buffers, merged, (start, end).
        owners: the tensors and arrays they belong to, kept alive by this object until the
            fork is made (a buffer freed and its range reused first would be left out).
        objects: objects looked at.
        complete: False where the budget ran out first.
    """

    ranges: list[tuple[int, int]] = field(default_factory=list)
    owners: list[Any] = field(default_factory=list)
    objects: int = 0
    complete: bool = True

    @property
    def nbytes(self) -> int:
        return sum(end - start for start, end in self.ranges)


# -- buffers --------------------------------------------------------------------------------


def _tensor_buffers(graph: namespace.Graph, kept: set[int]) -> tuple[Buffers, list[Any]]:
    """The storages of the CPU tensors found: made by torch's allocator (resizable: not
    numpy's, a file's or a blob's), each used by no tensor but those found and not kept."""
    torch = sys.modules.get("torch")
    if graph.tensor is None or torch is None:
        return [], []
    by_storage: dict[int, list[tuple[int, Any]]] = {}
    for key in graph.tensors:
        obj = graph.seen[key]
        with contextlib.suppress(Exception):
            if obj.device.type != "cpu" or obj.layout is not torch.strided:
                continue
            storage = obj.untyped_storage()
            if storage.nbytes() >= MIN_BYTES and storage.resizable():
                by_storage.setdefault(storage.data_ptr(), []).append((key, obj))
    buffers: list[tuple[int, int]] = []
    owners: list[Any] = []
    for pointer, tensors in by_storage.items():
        if any(key in kept for key, _ in tensors):
            continue
        storage = tensors[0][1].untyped_storage()
        users = private_torch.storage_use_count(storage)
        if users is None or users - 1 != len(tensors):  # - 1: ``storage`` here
            continue
        buffers.append((pointer, storage.nbytes()))
        owners.extend(obj for _, obj in tensors)
    return buffers, owners


def _array_buffers(graph: namespace.Graph, kept: set[int]) -> tuple[Buffers, list[Any]]:
    """The numpy arrays found that own their data (a view's base is found through it)."""
    if graph.ndarray is None:
        return [], []
    buffers: list[tuple[int, int]] = []
    owners: list[Any] = []
    for key in graph.arrays - kept:
        obj = graph.seen[key]
        with contextlib.suppress(Exception):
            if obj.flags.owndata and obj.nbytes >= MIN_BYTES:
                buffers.append((obj.__array_interface__["data"][0], obj.nbytes))
                owners.append(obj)
    return buffers, owners


def _private_anonymous() -> list[tuple[int, int]]:
    """This process's private anonymous writable mappings (its heap and arenas included),
    in address order."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) > 5 else ""
        if not fields[1].startswith("rw") or fields[1][3:4] != "p":
            continue
        if path and path != "[heap]" and not path.startswith("[anon:"):
            continue
        start, end = (int(bound, 16) for bound in fields[0].split("-"))
        found.append((start, end))
    return found


def _pages(buffers: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The whole pages inside the buffers that lie in private anonymous memory, merged. A
    buffer's partial first and last pages stay: its allocator's header, a neighbour's bytes."""
    inner = []
    for pointer, nbytes in buffers:
        start = -(-pointer // _PAGE) * _PAGE
        end = (pointer + nbytes) // _PAGE * _PAGE
        if end > start:
            inner.append((start, end))
    if not inner:
        return []
    mappings = _private_anonymous()
    starts = [low for low, _ in mappings]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(inner):
        at = max(bisect.bisect_right(starts, start) - 1, 0)
        for low, high in mappings[at:]:
            if low >= end:
                break
            part = (max(start, low), min(end, high))
            if part[1] <= part[0]:
                continue
            if merged and part[0] <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(part[1], merged[-1][1]))
            else:
                merged.append(part)
    return merged


def own_buffers(budget: int = namespace.BUDGET) -> Found:
    """The notebook's own large buffers: the page ranges a zygote's fork may leave out.

    Example:
        >>> data = torch.zeros(1 << 20)  # doctest: +SKIP
        >>> own_buffers().nbytes  # doctest: +SKIP
        4190208
    """
    roots, skip = namespace.roots()
    return found_in(roots, skip, budget)


def found_in(roots: list[dict[str, Any]], skip: set[int], budget: int = namespace.BUDGET) -> Found:
    """``own_buffers`` of the namespaces ``roots`` (the ids in ``skip`` not walked)."""
    if not roots:
        return Found()
    graph = namespace.Graph(roots, skip, budget)
    kept = graph.kept()
    tensors, tensor_owners = _tensor_buffers(graph, kept)
    arrays, array_owners = _array_buffers(graph, kept)
    return Found(
        ranges=_pages(tensors + arrays),
        owners=tensor_owners + array_owners,
        objects=len(graph.seen),
        complete=graph.complete,
    )


# -- the fork -------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _madvise(start: int, length: int, advice: int) -> bool:
    madvise = getattr(_libc, "madvise", None)
    if madvise is None:
        return False
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return bool(madvise(start, length, advice) == 0)


@contextlib.contextmanager
def left_out() -> Iterator[Found]:
    """The notebook's own large buffers (``own_buffers``) left out of the forks made in this
    block (MADV_DONTFORK: a child has no mapping there); yields what was found, its ranges
    those left out. Where anything fails, the fork takes everything, as a fork does."""
    global _leaving
    try:
        found = Found() if env.fork_notebook_data() else own_buffers()
    except Exception:  # never in the way of the fork: it holds the buffers, as before
        found = Found(complete=False)
    found.ranges = [r for r in found.ranges if _madvise(r[0], r[1] - r[0], _MADV_DONTFORK)]
    _leaving = found.ranges
    try:
        yield found
    finally:
        _leaving = []
        for start, end in found.ranges:
            _madvise(start, end - start, _MADV_DOFORK)


def reserve() -> None:
    """In the zygote: the ranges its fork left out are mapped PROT_NONE (no memory), so that
    nothing comes to lie there and a touch of a left-out buffer is a SIGSEGV, never a read
    of something else."""
    mapper = getattr(_libc, "mmap", None)
    if mapper is None:
        return
    mapper.restype = ctypes.c_void_p
    mapper.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
    unmapper = getattr(_libc, "munmap", None)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED_NOREPLACE
    for start, end in _leaving:
        placed = mapper(start, end - start, _PROT_NONE, flags, -1, 0)
        if placed not in (start, None, ctypes.c_void_p(-1).value) and unmapper is not None:
            # A kernel before 4.17 takes the address as a hint only: not there, no use.
            unmapper.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            unmapper(placed, end - start)
