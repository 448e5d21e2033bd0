"""The notebook's own large buffers, left out of the zygote's fork.

    the caller, at a zygote's fork (forkserver._start_zygote)
    ---------------------------------------------------------
    own_buffers(): every object reached from the notebook's namespace (IPython's user_ns
      and Out, else __main__'s), never through modules or classes; each one's references
      counted against those found: one that anything else refers to, and all it reaches,
      may be reached by a worker and is kept
    the rest's large buffers (1 MiB or more): CPU tensors' storages that no tensor outside
      uses, numpy arrays owning their data; their whole pages in private anonymous memory
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
gradients (torch keeps ``.grad`` in C++), what is inside a container of more than 16384
items or beyond 50,000 objects (or 0.1 s) from the namespace, small objects, the
interpreter's arenas.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import gc
import itertools
import mmap
import operator
import sys
import time
import types
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ... import env
from ...private import torch as private_torch

__all__ = ["Found", "found_in", "left_out", "own_buffers", "reserve"]

MIN_BYTES = 1 << 20  # smaller buffers stay in the fork: their pages may hold other objects
# At most: objects looked at, references read (per object), seconds (the cell's end waits);
# beyond, what is unseen stays in the fork. A BERT-base with its optimizer: 5,000 objects.
_BUDGET = 50_000
_SCANS = 10
_SECONDS = 0.1
_WIDE = 1 << 14  # a container holding more is not read (its items count as held from outside)
_PAGE = mmap.PAGESIZE
_MADV_DONTFORK = 10
_MADV_DOFORK = 11
_PROT_NONE = 0
_MAP_NORESERVE = 0x4000
_MAP_FIXED_NOREPLACE = 0x100000

# Never walked into: they own no buffer of the notebook's, or they lead into libraries.
_ATOMS = frozenset(
    {str, bytes, int, float, complex, bool, type(None), type, types.ModuleType, types.CodeType}
    | {types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType}
    | {types.GetSetDescriptorType, types.MemberDescriptorType}
)
_CONTAINERS = (list, tuple, dict, set, frozenset)
_ATOM, _ARRAY, _TENSOR = "atom", "array", "tensor"

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


# -- the notebook's namespace ---------------------------------------------------------------


def _shell() -> Any:
    """IPython's running shell, if any (never imported here)."""
    if "IPython" not in sys.modules:
        return None
    with contextlib.suppress(Exception):
        from IPython.core.interactiveshell import InteractiveShell

        if InteractiveShell.initialized():
            return InteractiveShell.instance()
    return None


def _displayed(name: object) -> bool:
    """IPython's names for the values cells displayed: Out, _, __, ___, _<n>."""
    if not isinstance(name, str):
        return False
    return name in ("Out", "_oh", "_", "__", "___") or (name[:1] == "_" and name[1:].isdigit())


def _roots() -> tuple[list[dict[str, Any]], set[int]]:
    """The notebook's namespaces, and the ids of what is not the notebook's in them.

    In IPython: the user's namespace; and where IPython keeps the values cells displayed
    (Out, the hidden namespace's ``_`` entries, the display hook's, the last result's),
    as roots too, with everything else they hold skipped (the shell, In, exit, ...).
    Elsewhere: ``__main__``'s namespace.
    """
    shell = _shell()
    namespace = getattr(shell, "user_ns", None)
    if not isinstance(namespace, dict):
        namespace = getattr(sys.modules.get("__main__"), "__dict__", None)
        return ([namespace] if isinstance(namespace, dict) else []), set()
    roots: list[dict[str, Any]] = [namespace]
    skip = {id(shell)}
    holders = [
        (getattr(shell, "user_ns_hidden", None), _displayed),
        (namespace.get("Out"), lambda _: True),
        (getattr(getattr(shell, "displayhook", None), "__dict__", None), _displayed),
        (
            getattr(getattr(shell, "last_execution_result", None), "__dict__", None),
            lambda name: name == "result",
        ),
    ]
    for holder, kept in holders:
        if isinstance(holder, dict):
            roots.append(holder)
            skip.update(id(v) for k, v in holder.items() if not kept(k))
    # In, exit, get_ipython, ...: IPython's own entries in the user's namespace too.
    return roots, skip


def _type_of(module: str, name: str) -> type | None:
    """A class of a module this process imported (None where it did not: nothing of it here)."""
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) else None


class _Graph:
    """The objects reached from the roots, a level at a time (gc.get_referents of a level in
    one call), and how many references each got from those read."""

    def __init__(self, roots: list[dict[str, Any]], skip: set[int], budget: int) -> None:
        self.roots = {id(root) for root in roots}
        self.seen: dict[int, Any] = {id(root): root for root in roots}
        self.read: set[int] = set()  # whose references were counted
        self.inside: Counter[int] = Counter()
        self.views: Counter[int] = Counter()  # a tensor -> its views found
        self.arrays: set[int] = set()  # the numpy arrays and torch tensors seen
        self.tensors: set[int] = set()
        self.complete = True
        self.scanned = 0  # references read
        self.ndarray = _type_of("numpy", "ndarray")
        self.tensor = _type_of("torch", "Tensor")
        self._kinds: dict[type, Any] = {}  # a class -> _ATOM, _ARRAY, _TENSOR, its container
        self._atoms: set[type] = set(_ATOMS)
        self._skip = skip | {id(getattr(m, "__dict__", None)) for m in list(sys.modules.values())}
        self._walk(list(roots), budget)

    def _walk(self, level: list[Any], budget: int) -> None:
        deadline = time.monotonic() + _SECONDS
        while level:
            room = budget - len(self.seen)
            if room < 0 or self.scanned > budget * _SCANS or time.monotonic() > deadline:
                self.complete = False
                return
            level = self._readable(level)
            self.read.update(map(id, level))
            counted, bases = self._links(level)
            ids = list(map(id, counted))
            self.inside.update(ids)
            self.views.update(map(id, bases))
            seen = self.seen
            fresh = {key: obj for key, obj in zip(ids, counted, strict=True) if key not in seen}
            fresh.update((id(base), base) for base in bases if id(base) not in seen)
            if len(fresh) > room:  # the rest is never read: it stays in the fork
                fresh = dict(itertools.islice(fresh.items(), room + 1))
            seen.update(fresh)
            level = list(fresh.values())

    def _readable(self, level: list[Any]) -> list[Any]:
        """``level`` but the containers too wide to read (what they hold counts as held from
        outside); the numpy arrays and torch tensors among it noted."""
        kinds = {cls: self._kind(cls) for cls in set(map(type, level))}
        special = {cls: kind for cls, kind in kinds.items() if kind is _ARRAY or kind is _TENSOR}
        for obj in level if special else ():
            kind = special.get(type(obj))
            if kind is not None:
                (self.arrays if kind is _ARRAY else self.tensors).add(id(obj))
        sized = {cls: kind for cls, kind in kinds.items() if kind in _CONTAINERS}
        if not sized:
            return level
        # The built-in container's size (C's): never a subclass's own __len__.
        return [o for o in level if type(o) not in sized or sized[type(o)].__len__(o) <= _WIDE]

    def _links(self, level: list[Any]) -> tuple[list[Any], list[Any]]:
        """What ``level`` refers to, but atoms and skipped ones: gc's view, with a numpy view's
        base (a reference numpy does not show gc); and apart, torch views' bases (held by
        C++, not by a reference)."""
        found = gc.get_referents(*level)
        self.scanned += len(found)
        bases = []
        for obj in level:
            if id(obj) in self.arrays and obj.base is not None:
                found.append(obj.base)
            elif id(obj) in self.tensors:
                base = _tensor_base(obj)
                if base is not None:
                    bases.append(base)
        atoms, skip = self._atoms, self._skip
        for cls in set(map(type, found)) - atoms:
            if self._kind(cls) is _ATOM:
                atoms.add(cls)
        return [obj for obj in found if type(obj) not in atoms and id(obj) not in skip], bases

    def _kind(self, cls: type) -> Any:
        """_ATOM (a class, a module: never walked), _ARRAY, _TENSOR, the built-in container
        ``cls`` is one of, or None."""
        if cls not in self._kinds:
            found: Any = None
            if issubclass(cls, (type, types.ModuleType)) or cls in _ATOMS:
                found = _ATOM
            elif self.ndarray is not None and issubclass(cls, self.ndarray):
                found = _ARRAY
            elif self.tensor is not None and issubclass(cls, self.tensor):
                found = _TENSOR
            else:
                found = next((c for c in _CONTAINERS if issubclass(cls, c)), None)
            self._kinds[cls] = found
        return self._kinds[cls]

    def kept(self) -> set[int]:
        """The ids of what a worker might reach: what anything outside refers to, or was not
        read, and all it reaches."""
        level = self._outside()
        kept = set(level) | (self.seen.keys() - self.read)
        while level:  # a level at a time, as they were read
            # Never read: what it refers to was never counted either.
            counted, bases = self._links([self.seen[key] for key in level if key in self.read])
            fresh = {id(kid) for kid in counted + bases} & self.seen.keys()
            level = list(fresh - kept)
            kept.update(level)
        return kept

    def _outside(self) -> list[int]:
        """Those referred to from outside: more references than found (gc's count, the
        interpreter's), a weak reference from outside, C++ holders of a tensor."""
        keys = list(self.seen)
        counts = map(sys.getrefcount, self.seen.values())
        extra = map(operator.sub, counts, map(self.inside.__getitem__, keys))
        weak = map(weakref.getweakrefcount, self.seen.values())
        flagged = [k for k, more, w in zip(keys, extra, weak, strict=True) if more > _OURS or w]
        outside = []
        for key in set(flagged) | self.tensors:
            more = _references(self.seen, key) - _ONE - self.inside[key]
            obj = self.seen[key]
            if key in self.tensors:
                more = self._tensor_extra(key, obj, more)
            if key in self.roots:
                continue
            if more > 0 or not self._weakly_inside(obj):
                outside.append(key)
        return outside

    def _tensor_extra(self, key: int, tensor: Any, extra: int) -> int:
        """A tensor that C++ also holds is held once more from Python (by its TensorImpl):
        explained where its only C++ holders are views found here."""
        users = private_torch.tensor_use_count(tensor)
        if users is None:
            return 1
        if users > 1:
            return max(extra - 1, 1 if users - 1 > self.views[key] else 0)
        return extra

    def _weakly_inside(self, obj: Any) -> bool:
        return all(id(ref) in self.seen for ref in weakref.getweakrefs(obj))


def _calibrate() -> int:
    # The references getrefcount sees from ``_outside``'s map over a dict's values (the
    # dict's, the argument's): measured, as interpreters count their own differently (3.14
    # borrows where it can).
    probe = {0: object()}
    return next(map(sys.getrefcount, probe.values()))


def _references(seen: dict[int, Any], key: int) -> int:
    obj = seen[key]
    return sys.getrefcount(obj)


_OURS = _calibrate()
_ONE = _references({0: object()}, 0)  # ``_references``'s own, measured the same way


def _tensor_base(tensor: Any) -> Any:
    try:
        return tensor._base
    except Exception:
        return None


# -- buffers --------------------------------------------------------------------------------


def _tensor_buffers(graph: _Graph, kept: set[int]) -> tuple[list[tuple[int, int]], list[Any]]:
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


def _array_buffers(graph: _Graph, kept: set[int]) -> tuple[list[tuple[int, int]], list[Any]]:
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


def own_buffers(budget: int = _BUDGET) -> Found:
    """The notebook's own large buffers: the page ranges a zygote's fork may leave out.

    Example:
        >>> data = torch.zeros(1 << 20)  # doctest: +SKIP
        >>> own_buffers().nbytes  # doctest: +SKIP
        4190208
    """
    roots, skip = _roots()
    return found_in(roots, skip, budget)


def found_in(roots: list[dict[str, Any]], skip: set[int], budget: int = _BUDGET) -> Found:
    """``own_buffers`` of the namespaces ``roots`` (the ids in ``skip`` not walked)."""
    if not roots:
        return Found()
    graph = _Graph(roots, skip, budget)
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
