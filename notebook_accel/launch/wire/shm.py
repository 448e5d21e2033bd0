"""The machine-local transport: large buffers in memfd segments, mapped copy-on-write.

    notebook (parent)                                  every worker
    -----------------                                  ------------
    SharedCache.ship(buffers)
      same storage and version counter, or the
      same bytes as a cached copy -> reuse it (no copy)
      else -> one new segment for the launch's new
              buffers, each written once (from
              64 MiB: in stripes, a thread each)
    MemfdShipment: segments (their stripes'  ----->    mmap MAP_PRIVATE (the stripes side by
      fds) + places + the launch's results             side): reads share the cached pages;
      segments                                         writes are the worker's own
                                                       (copy-on-write)
    unpack: mmap MAP_SHARED of the rank's  <-------    results: lock the segments, grow them,
      region, its stripes side by side;                write the buffers into the new region,
      freed (hole punched) when the                    a large one in stripes, a thread each:
      notebook drops the last view                     Result(data, (starts, part, length,
                                                       places))
    release: unpin; least recently used copies go until the cache fits its limit; the
      results segments close once nothing maps them

Stripes: a write into one memfd holds its file's lock, so two threads writing into one
segment take turns, and filling 1 GiB of fresh shared pages takes one thread 0.45 s here. A
region of 64 MiB or more (a launch's new copies, a rank's result) is cut into equal stripes,
one memfd each (one per copying thread, ``_stripes``), written side by side (0.25 s with two
threads); whoever reads it maps the stripes next to each other (mmap MAP_FIXED into a
reserved range, ``_join``) as one buffer. A launch ships that many results segments; a small
result, or one from a GPU (copied through a mapping), uses the first.

A session (session.py) ships its results segments once, when its workers start, and each
task's buffers without one (``results=False``); its workers may keep what they mapped in their
namespace, so those segments are never punched (``kept=True``): their memory goes with the
segment and the workers' last mapping.

memfd segments live in no file system (a 64 MB /dev/shm does not limit them) and end with
their last descriptor or mapping: a killed kernel takes its segments along, and its workers
(which hold the only other mappings) die with it through the lifeline (worker.py). The fds
reach the workers as multiprocessing passes fds: through the forkserver, spawn's inherited
fds, or (torch_xla's process pool) the resource sharer.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError, SharedMemoryError
from ...hardware import usable_cores
from ...memory_probe import available_memory, total_memory
from ...private import cpython
from .pickling import Outgoing, address
from .transport import Shipment, Transport

__all__ = [
    "CacheInfo",
    "SharedCache",
    "MemfdShipment",
    "clear_shared_cache",
    "set_shared_cache_limit",
    "shared_cache_info",
    "transport",
    "unmap_inherited",
]

DEFAULT_SHARE = 0.25  # of the machine's memory: the cache's default limit
MAX_SEGMENT_FDS = 64  # data segments' fds (stripes) one launch passes to each worker
_PAGE = mmap.PAGESIZE
_ALIGN = 64  # bytes: alignment of each buffer inside a rank's result region
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_CHUNK = 16 << 20  # bytes: the share of one thread when copying or comparing
_MAX_THREADS = 4
_STRIPE_FROM = 4 * _CHUNK  # bytes: a result at least this large is written in stripes
_MAP_FIXED = 0x10  # Linux's and the BSDs' value (Python's mmap module does not name it)

_libc = ctypes.CDLL(None, use_errno=True)


def _libc_function(name: str, argtypes: list[Any], restype: Any = ctypes.c_int) -> Any:
    """libc's ``name`` with its C signature, or None where this libc has none."""
    function = getattr(_libc, name, None)
    if function is not None:
        function.argtypes, function.restype = argtypes, restype
    return function


_memcmp = _libc_function("memcmp", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t])
_munmap = _libc_function("munmap", [ctypes.c_void_p, ctypes.c_size_t])
_mmap = _libc_function(
    "mmap",
    [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64],
    ctypes.c_void_p,
)
_fallocate = _libc_function(
    "fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
)


def _round(n: int, to: int = _PAGE) -> int:
    return (n + to - 1) // to * to


def _in_chunks(work: Callable[[int, int], int], nbytes: int) -> list[int]:
    """``work(offset, length)`` over 16 MiB chunks, on a few threads.

    Comparing is memory-bound; a few cores do it faster than one (ctypes releases the GIL).
    Not for writing into one memfd: its writers take turns (``_write_striped`` instead).
    """
    chunks = [(start, min(_CHUNK, nbytes - start)) for start in range(0, nbytes, _CHUNK)]
    threads = min(_MAX_THREADS, usable_cores(), len(chunks))
    if threads <= 1:
        return [work(start, length) for start, length in chunks]
    with ThreadPoolExecutor(threads, thread_name_prefix="notebook-accel-copy") as pool:
        return list(pool.map(lambda chunk: work(*chunk), chunks))


_PREFIX = "notebook-accel-"  # every segment's name starts with it (its maps line shows it)


def _stripes() -> int:
    """How many stripes a large region is cut into (and results segments a launch ships):
    one per thread that copies."""
    if not hasattr(os, "memfd_create") or _mmap is None or _munmap is None:
        return 1  # the unlinked-file fallback, or no libc mmap: one segment, Python's mmap
    return max(1, min(_MAX_THREADS, usable_cores()))


def _new_fd(kind: str) -> int:
    """An anonymous shared-memory file: memfd where the OS has it, else an unlinked file."""
    name = f"{_PREFIX}{os.getpid()}-{kind}"
    if hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            return os.memfd_create(name, os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix=name)
    os.unlink(path)
    return fd


def unmap_inherited() -> None:
    """In a fork of a process that maps segments (forkserver.py's zygote, a fork of the
    notebook made after launches): unmap them all here, so that the fork and its workers
    never hold a launch's memory (the cache's copies, results the notebook keeps) after the
    notebook lets it go. Nothing here uses them: the workers get their launch's segments
    anew. Found by name in ``/proc/self/maps``; unmapped with libc's munmap. The inherited
    cache (and its lock, which a thread may have held at the fork) is forgotten."""
    global _cache, _cache_lock
    _cache, _cache_lock = None, threading.Lock()
    if _munmap is None:
        return
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5]
        # "/memfd:notebook-accel-<pid>-<kind> (deleted)", or an unlinked file's path
        if path.startswith("/memfd:" + _PREFIX) or path.rpartition("/")[2].startswith(_PREFIX):
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            _munmap(start, end - start)


def _punch(fd: int, offset: int, length: int) -> None:
    """Give a region's memory back now (the segment keeps its size)."""
    if _fallocate is None or length <= 0:
        return  # the memory is freed when the whole segment ends
    _fallocate(fd, _PUNCH_HOLE, offset, length)


def _join(
    fds: list[int], starts: tuple[int, ...], part: int, length: int, private: bool = False
) -> tuple[memoryview, weakref.finalize[Any, Any]]:
    """Map ``part`` bytes of each segment from its start, one after the other, as one buffer
    of ``length`` bytes: an address range is reserved, then each stripe mapped into its place
    (shared, or copy-on-write with ``private``). The range is unmapped when the last view of
    the buffer goes, or when the returned finalizer is called."""
    total = part * len(starts)
    anonymous = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    base = _mmap(None, total, 0, anonymous, -1, 0)  # PROT_NONE: an address range only
    if base is None or base == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), "mmap: no address range for shared memory")
    fixed = (mmap.MAP_PRIVATE if private else mmap.MAP_SHARED) | _MAP_FIXED
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    try:
        for index, start in enumerate(starts):
            at = base + index * part
            if _mmap(at, part, prot, fixed, fds[index], start) != at:
                raise OSError(ctypes.get_errno(), "mmap: a stripe of shared memory")
        joined = (ctypes.c_char * length).from_address(base)  # writable, owns nothing
    except BaseException:
        _munmap(base, total)
        raise
    unmap = weakref.finalize(joined, _munmap, base, total)
    return memoryview(joined).cast("B"), unmap


def _spans(part: int, count: int, offset: int, nbytes: int) -> Iterator[tuple[int, ...]]:
    """Bytes ``offset`` to ``offset + nbytes`` of a region cut into ``count`` stripes of
    ``part`` bytes: (stripe, offset in the stripe, start, end in those bytes) for each stripe
    they reach."""
    end = offset + nbytes
    for index in range(count):
        low, high = max(offset, index * part), min(end, (index + 1) * part)
        if low < high:
            yield index, low - index * part, low - offset, high - offset


def _need(what: str, nbytes: int) -> None:
    available = available_memory()
    if nbytes > available:
        raise SharedMemoryError(what, nbytes, available)


def _write(fd: int, offset: int, out: Outgoing, what: str) -> None:
    """Copy one buffer into a segment at ``offset``.

    Host memory goes with pwrite: no page faults in a mapping, and running out of memory is
    an error (ENOSPC, ENOMEM), not a SIGBUS. GPU memory is copied into a mapping of the
    region, taken (fallocate) first for the same reason.
    """
    try:
        if out.view is not None:
            _pwrite(fd, out.view, offset)  # one writer: a memfd's writers take turns
            return
        start = offset - offset % _PAGE
        os.posix_fallocate(fd, offset, out.nbytes)
    except OSError as exc:
        raise SharedMemoryError(what, out.nbytes, available_memory()) from exc
    with mmap.mmap(fd, offset + out.nbytes - start, offset=start) as region:
        with memoryview(region) as view:
            out.copy_into(view[offset - start :])


def _pwrite(fd: int, view: memoryview, offset: int) -> int:
    done = 0
    while done < len(view):  # pwrite may write less than asked
        done += os.pwrite(fd, view[done : done + _CHUNK], offset + done)
    return done


def _write_striped(
    fds: list[int],
    starts: tuple[int, ...],
    part: int,
    offsets: list[int],
    buffers: list[Outgoing],
    what: str,
) -> None:
    """Write host buffers at their offsets in a region cut into stripes of ``part`` bytes,
    stripe ``i`` at ``starts[i]`` of segment ``i``: one thread per segment."""
    pieces: list[list[tuple[memoryview, int]]] = [[] for _ in starts]
    for offset, out in zip(offsets, buffers, strict=True):
        assert out.view is not None, "only host buffers are written in stripes"
        for index, at, low, high in _spans(part, len(starts), offset, out.nbytes):
            pieces[index].append((out.view[low:high], starts[index] + at))

    def stripe(index: int) -> None:
        for piece, at in pieces[index]:
            _pwrite(fds[index], piece, at)

    try:
        with ThreadPoolExecutor(len(starts), thread_name_prefix="notebook-accel-copy") as pool:
            list(pool.map(stripe, range(len(starts))))
    except OSError as exc:
        nbytes = sum(out.nbytes for out in buffers)
        raise SharedMemoryError(what, nbytes, available_memory()) from exc


# -- the notebook's side: cached copies ----------------------------------------------------


class _Segment:
    """One launch's copies in the notebook, mapped shared: written and compared here. From
    64 MiB, in stripes of ``part`` bytes, one memfd each (written a thread each), mapped side
    by side here and in the workers."""

    def __init__(self, size: int) -> None:
        self.size = size
        count = _stripes() if size >= _STRIPE_FROM else 1
        self.part = _round(-(-size // count))
        self.fds: list[int] = []
        try:
            for _ in range(count):
                self.fds.append(_new_fd("data"))
                os.ftruncate(self.fds[-1], self.part)
            self._mapping: mmap.mmap | memoryview | None
            if count == 1:
                self._mapping = mmap.mmap(self.fds[0], size)
                self._unmap: Callable[[], Any] = self._mapping.close
            else:
                self._mapping, self._unmap = _join(self.fds, (0,) * count, self.part, size)
            self.address = address(self._mapping)
        except BaseException:
            for fd in self.fds:
                os.close(fd)
            raise
        self.entries = 0
        # A session's workers may keep what they mapped for as long as they live (a pushed
        # tensor): punching a hole would turn their unwritten pages into zeros. Such a
        # segment's memory goes when the segment and the last mapping of it are gone.
        self.punched = True

    def write(self, offset: int, out: Outgoing, what: str) -> None:
        if len(self.fds) == 1:
            _write(self.fds[0], offset, out, what)
        elif out.view is not None:
            _write_striped(self.fds, (0,) * len(self.fds), self.part, [offset], [out], what)
        else:  # GPU memory: into the mapping, each stripe's region taken first
            try:
                for index, at, low, high in _spans(self.part, len(self.fds), offset, out.nbytes):
                    os.posix_fallocate(self.fds[index], at, high - low)
            except OSError as exc:
                raise SharedMemoryError(what, out.nbytes, available_memory()) from exc
            region = (ctypes.c_char * out.nbytes).from_address(self.address + offset)
            out.copy_into(memoryview(region).cast("B"))  # the mapping outlives this view

    def punch(self, offset: int, nbytes: int) -> None:
        for index, at, low, high in _spans(self.part, len(self.fds), offset, nbytes):
            _punch(self.fds[index], at, high - low)

    def close(self) -> None:
        self._unmap()
        self._mapping = None
        for fd in self.fds:
            os.close(fd)


@dataclass(eq=False)
class _Entry:
    """A cached copy: a region of a segment, and what it is a copy of."""

    segment: _Segment
    offset: int
    nbytes: int
    key: tuple[Any, ...]
    version: int | None
    owner: weakref.ref[Any] | None
    pins: int = 0  # launches running with it
    cached: bool = True  # False once replaced or evicted: it ends when unpinned

    def address(self) -> int:
        return self.segment.address + self.offset

    def matches(self, out: Outgoing) -> bool:
        """Still a copy of ``out``? Torch: same storage, same version; else: same bytes."""
        if out.version is not None:
            return (
                self.version == out.version
                and self.owner is not None
                and out.owner is not None
                and self.owner() is out.owner()
                and self.owner() is not None
            )
        if out.view is None or self.nbytes != out.nbytes:
            return False
        mine, theirs = self.address(), address(out.view)
        differences = _in_chunks(lambda at, n: _memcmp(mine + at, theirs + at, n), out.nbytes)
        return not any(differences)

    def write(self, out: Outgoing, what: str) -> None:
        self.segment.write(self.offset, out, what)

    def dead(self) -> bool:
        """The storage it copies is gone: no launch can ask for it again."""
        return self.owner is not None and self.owner() is None


@dataclass(frozen=True)
class CacheInfo:
    """What the shared-memory cache holds, and what it has copied so far.

    Attributes:
        entries: cached copies.
        bytes: their size.
        segments: memfd segments holding them.
        limit: the most it keeps between launches (bytes).
        copied_bytes: bytes written into shared memory since the kernel started.
        reused_bytes: bytes a launch found already copied (and did not copy again).
    """

    entries: int
    bytes: int
    segments: int
    limit: int
    copied_bytes: int
    reused_bytes: int


class SharedCache(Transport):
    """Shared copies of captured buffers, kept for the kernel's life (LRU, bounded).

    Example:
        >>> cache = transport()
        >>> cache.info().limit == int(total_memory() * DEFAULT_SHARE)
        True
    """

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._lock = threading.RLock()
        self._limit: int | None = None
        self._copied = 0
        self._reused = 0

    # -- settings and figures -------------------------------------------------------------
    @property
    def limit(self) -> int:
        return self._limit if self._limit is not None else int(total_memory() * DEFAULT_SHARE)

    def set_limit(self, limit: int | float | None) -> None:
        accepted = "bytes (an int >= 0), a share of memory (a float in (0, 1]), or None"
        if limit is None:
            self._limit = None
        elif isinstance(limit, bool) or not isinstance(limit, int | float):
            raise ConfigError("limit", limit, accepted)
        elif isinstance(limit, float):
            if not 0.0 < limit <= 1.0:
                raise ConfigError("limit", limit, accepted)
            self._limit = int(total_memory() * limit)
        elif limit < 0:
            raise ConfigError("limit", limit, accepted)
        else:
            self._limit = limit
        with self._lock:
            self._trim(self.limit)

    def info(self) -> CacheInfo:
        with self._lock:
            entries = list(self._entries.values())
            return CacheInfo(
                entries=len(entries),
                bytes=sum(e.nbytes for e in entries),
                segments=len({id(e.segment) for e in entries}),
                limit=self.limit,
                copied_bytes=self._copied,
                reused_bytes=self._reused,
            )

    def clear(self) -> None:
        with self._lock:
            self._trim(0)

    # -- a launch -------------------------------------------------------------------------
    def ship(
        self, buffers: list[Outgoing], results: bool = True, kept: bool = False
    ) -> MemfdShipment:
        """Find or copy each buffer; the launch's copies stay pinned until ``release``.

        ``results=False``: no results segment (a session's workers put their results in the
        one they got when they started). ``kept=True``: the workers may keep views of the
        buffers after the launch, so their segments are never punched.
        """
        with self._lock:
            self._trim(self.limit, dead_only=True)
            found: dict[tuple[Any, ...], _Entry] = {}
            missing: dict[tuple[Any, ...], Outgoing] = {}
            for out in buffers:
                if out.key in found or out.key in missing:
                    continue  # views of one storage: one copy
                entry = self._entries.get(out.key)
                if entry is not None and entry.matches(out):
                    found[out.key] = entry
                else:
                    missing[out.key] = out
            self._few_segments(buffers, found, missing)
            for entry in found.values():
                entry.pins += 1
                self._entries.move_to_end(entry.key)
                self._reused += entry.nbytes
            try:
                found.update(self._copy(missing))
                place = _Results(_stripes()) if results else None
            except BaseException:
                self._unpin(list(found.values()))
                raise
        segments: list[_Segment] = []
        places = []
        for out in buffers:
            entry = found[out.key]
            if entry.segment not in segments:
                segments.append(entry.segment)
            places.append((segments.index(entry.segment), entry.offset, entry.nbytes))
            if kept:
                entry.segment.punched = False
        return MemfdShipment(
            [(list(s.fds), s.part, s.size) for s in segments],
            places,
            [] if place is None else list(place.fds),
            _Launch(self, list(found.values()), place),
        )

    def _few_segments(
        self,
        buffers: list[Outgoing],
        found: dict[tuple[Any, ...], _Entry],
        missing: dict[tuple[Any, ...], Outgoing],
    ) -> None:
        """Copy again what sits in too many old segments: each stripe is an fd per worker,
        and the launch's new segment needs room for its own (the smallest go first)."""
        by_segment: dict[int, list[_Entry]] = {}
        for entry in found.values():
            by_segment.setdefault(id(entry.segment), []).append(entry)
        fds = sum(len(entries[0].segment.fds) for entries in by_segment.values())
        outgoing = {out.key: out for out in buffers}
        ranked = sorted(by_segment.values(), key=lambda es: sum(e.nbytes for e in es))
        for entries in ranked:
            if fds + _stripes() <= MAX_SEGMENT_FDS:
                return
            fds -= len(entries[0].segment.fds)
            for entry in entries:
                del found[entry.key]
                missing[entry.key] = outgoing[entry.key]

    def _copy(self, missing: dict[tuple[Any, ...], Outgoing]) -> dict[tuple[Any, ...], _Entry]:
        if not missing:
            return {}
        for key in missing:  # stale copies of these buffers go first
            old = self._entries.get(key)
            if old is not None:
                self._evict(old)
        size = sum(_round(out.nbytes) for out in missing.values())
        what = "the data captured by the launched function"
        self._trim(max(self.limit - size, 0))
        if size > available_memory():
            self._trim(0)  # everything not in use, before giving up
        _need(what, size)
        segment = _Segment(size)
        entries: dict[tuple[Any, ...], _Entry] = {}
        offset = 0
        try:
            for key, out in missing.items():
                entry = _Entry(segment, offset, out.nbytes, key, out.version, out.owner, pins=1)
                entry.write(out, what)
                entries[key] = entry
                offset += _round(out.nbytes)
        except BaseException:
            segment.close()
            raise
        for key, entry in entries.items():
            self._entries[key] = entry
            segment.entries += 1
            self._copied += entry.nbytes
        return entries

    def _evict(self, entry: _Entry) -> None:
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        entry.cached = False
        if entry.pins == 0:
            self._free(entry)

    def _free(self, entry: _Entry) -> None:
        segment = entry.segment
        segment.entries -= 1
        if segment.entries == 0:
            segment.close()
        elif segment.punched:
            segment.punch(entry.offset, _round(entry.nbytes))

    def _trim(self, limit: int, dead_only: bool = False) -> None:
        """Evict unpinned copies, least recently used first, until ``limit`` bytes remain."""
        held = sum(e.nbytes for e in self._entries.values())
        for entry in list(self._entries.values()):
            if entry.pins:
                continue
            if entry.dead() or (not dead_only and held > limit):
                held -= entry.nbytes
                self._evict(entry)

    def _unpin(self, entries: list[_Entry]) -> None:
        for entry in entries:
            entry.pins -= 1
            if entry.pins == 0 and not entry.cached:
                self._free(entry)

    def release(self, entries: list[_Entry]) -> None:
        with self._lock:
            self._unpin(entries)
            self._trim(self.limit)


# -- results ---------------------------------------------------------------------------------


class _Results:
    """The notebook's end of a launch's results segments; they end when nothing maps them."""

    def __init__(self, stripes: int) -> None:
        self.fds: list[int] = []
        try:
            for _ in range(stripes):
                self.fds.append(_new_fd("results"))
        except BaseException:
            for fd in self.fds:
                os.close(fd)
            raise
        self._live = 0
        self._ended = False
        self._lock = threading.Lock()

    def map(self, starts: tuple[int, ...], part: int, length: int) -> memoryview:
        """A rank's region: ``part`` bytes from each start, one segment each, side by side."""
        if len(starts) == 1:
            view = memoryview(mmap.mmap(self.fds[0], length, offset=starts[0]))
        else:
            view, _ = _join(self.fds, starts, part, length)
        with self._lock:
            self._live += 1
        weakref.finalize(view.obj, self._unmapped, starts, part)
        return view

    def _unmapped(self, starts: tuple[int, ...], part: int) -> None:
        with self._lock:
            for fd, start in zip(self.fds, starts, strict=False):
                _punch(fd, start, part)
            self._live -= 1
            self._close_if_done()

    def end(self) -> None:
        with self._lock:
            self._ended = True
            self._close_if_done()

    def _close_if_done(self) -> None:
        if self._ended and self._live == 0 and self.fds:
            for fd in self.fds:
                os.close(fd)
            self.fds = []


_put_lock = threading.Lock()  # TPU: several devices' threads share one process
# A rank's region of results: where each stripe starts in its segment, the stripes' size,
# the region's length, and each buffer's (offset, size) in the region.
Handle = tuple[tuple[int, ...], int, int, tuple[tuple[int, int], ...]]


@dataclass
class _Launch:
    """What only the notebook holds of a shipment."""

    cache: SharedCache
    entries: list[_Entry]
    results: _Results | None
    released: bool = False


class MemfdShipment(Shipment):
    """Where one launch's buffers are: its segments (each its stripes' fds, the stripes' size,
    its size) and (segment, offset, size) per buffer."""

    def __init__(
        self,
        segments: list[tuple[list[int], int, int]],
        places: list[tuple[int, int, int]],
        results_fds: list[int],
        launch: _Launch | None = None,
    ) -> None:
        self._segments = segments
        self._places = places
        self._results_fds = results_fds
        self._launch = launch  # None in a worker

    def __reduce__(self) -> tuple[Any, ...]:
        segments = [
            (tuple(cpython.dup_fd(fd) for fd in fds), part, size)
            for fds, part, size in self._segments
        ]
        results = tuple(cpython.dup_fd(fd) for fd in self._results_fds)
        return (_arrive, (segments, self._places, results))

    @property
    def nbytes(self) -> int:
        return sum(n for _, _, n in self._places)

    def views(self) -> list[memoryview]:
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        maps = []
        for fds, part, size in self._segments:
            if len(fds) == 1:
                maps.append(memoryview(mmap.mmap(fds[0], size, mmap.MAP_PRIVATE, prot)))
            else:
                maps.append(_join(fds, (0,) * len(fds), part, size, private=True)[0])
        return [maps[s][o : o + n] for s, o, n in self._places]

    def put(self, buffers: list[Outgoing]) -> Handle:
        places = []
        length = 0
        for out in buffers:
            places.append((length, out.nbytes))
            length = _round(length + out.nbytes, _ALIGN)
        length = _round(length)
        what = "the value returned by this rank"
        _need(what, length)
        fds = self._results_fds
        assert fds, "a shipment without a results segment carries no results"
        host = all(out.view is not None for out in buffers)
        count = len(fds) if host and length >= _STRIPE_FROM else 1
        part = _round(-(-length // count))
        with _put_lock:  # processes exclude each other with the file lock, threads here
            os.lockf(fds[0], os.F_LOCK, 0)
            try:
                starts = tuple(_round(os.fstat(fd).st_size) for fd in fds[:count])
                for fd, start in zip(fds, starts, strict=False):
                    os.ftruncate(fd, start + part)
            finally:
                os.lockf(fds[0], os.F_ULOCK, 0)
        offsets = [offset for offset, _ in places]
        if count > 1:
            _write_striped(fds[:count], starts, part, offsets, buffers, what)
        else:
            for offset, out in zip(offsets, buffers, strict=True):
                _write(fds[0], starts[0] + offset, out, what)
        return starts, part, length, tuple(places)

    def get(self, handle: Handle) -> list[memoryview]:
        results = self._launch.results if self._launch is not None else None
        assert results is not None, "results are read in the notebook, from their segment"
        starts, part, length, places = handle
        view = results.map(starts, part, length)
        return [view[o : o + n] for o, n in places]

    def release(self) -> None:
        launch = self._launch
        if launch is None or launch.released:
            return
        launch.released = True
        launch.cache.release(launch.entries)
        if launch.results is not None:
            launch.results.end()


def _arrive(
    segments: list[tuple[tuple[Any, ...], int, int]],
    places: list[tuple[int, int, int]],
    results: tuple[Any, ...],
) -> MemfdShipment:
    """In a worker: the passed fds are this process's own now."""
    mine = [([fd.detach() for fd in fds], part, size) for fds, part, size in segments]
    return MemfdShipment(mine, places, [fd.detach() for fd in results])


# -- the public calls ------------------------------------------------------------------------

_cache: SharedCache | None = None
_cache_lock = threading.Lock()


def transport() -> SharedCache:
    """This kernel's shared-memory cache (created on first use)."""
    global _cache
    with _cache_lock:
        if _cache is None:
            _cache = SharedCache()
        return _cache


def clear_shared_cache() -> None:
    """Free every cached shared copy of captured data (a running launch keeps its own).

    The next launch copies what it captures again.

    Example:
        >>> from notebook_accel import clear_shared_cache
        >>> clear_shared_cache()
    """
    transport().clear()


def set_shared_cache_limit(limit: int | float | None) -> None:
    """Bound what the cache keeps between launches: bytes, or a share of memory.

    ``None`` restores the default, a quarter of the machine's memory (or of the container's
    limit). Least recently used copies go first; ``0`` keeps nothing between launches. A
    launch's own data is in shared memory while it runs, whatever the limit.

    Example:
        >>> from notebook_accel import set_shared_cache_limit
        >>> set_shared_cache_limit(8 << 30)  # 8 GiB
        >>> set_shared_cache_limit(0.5)  # half of the memory
    """
    transport().set_limit(limit)


def shared_cache_info() -> CacheInfo:
    """How much the cache holds, its limit, and the bytes copied and reused so far.

    Example:
        >>> from notebook_accel import shared_cache_info
        >>> shared_cache_info().copied_bytes  # doctest: +SKIP
        1073741824
    """
    return transport().info()


@contextlib.contextmanager
def shipped(buffers: list[Outgoing], via: Transport | None = None) -> Iterator[Shipment]:
    """Ship ``buffers`` for the length of a block (a launch), then release them."""
    shipment = (via or transport()).ship(buffers)
    try:
        yield shipment
    finally:
        shipment.release()
