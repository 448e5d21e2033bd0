"""Where this rank is, when the launcher asks: nothing runs until then.

    parent (launch/local/where.py)                 rank (armed by worker.start)
    ------------------------------                 ----------------------------
    tgkill(the responder thread, ANSWER) ----->    faulthandler's C handler writes the
                                                   thread's stack into the wake pipe: the
                                                   responder thread, blocked reading it,
                                                   wakes; with the GIL it makes a Where
                                                   (snapshot: each thread's frames, the
                                                   collective's tensors, the collectives
                                                   issued, the flight recorder's entries)
                                       <-----      Where on the message pipe
    no Where within a moment:
    tgkill(the responder thread, DUMP)   ----->    faulthandler writes every thread's stack
                                                   into a memfd: no GIL needed, so a thread
                                                   held inside C code still shows
    the memfd read through /proc/<pid>/fd (its name says which)

The two are never asked at once: faulthandler skips a dump that starts while another one of
the process runs.

Until asked, the rank pays nothing: two signal handlers, a thread blocked in ``read`` and
two file descriptors. The signals go to the responder thread (found by its name), so the
user's thread is not interrupted, and to processes that armed only (the responder's name
says so; an unhandled real-time signal would end a process).

A cluster's rank (cluster/ray/ranks.py) calls ``snapshot`` from its own loop instead.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import faulthandler
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType

from ...private import cpython as private_cpython
from ...private import torch as private_torch
from ...reporting.channel import Frame, Sender, Stack, Where
from ..wire.where import collective_of, entry_index

__all__ = [
    "ANSWER",
    "DUMP",
    "MEMFD",
    "RESPONDER",
    "arm",
    "cpu_share",
    "snapshot",
]

# Real-time signals nothing else in a rank uses (glibc keeps the first ones for itself, and
# Python's SIGRTMIN is after them).
DUMP = signal.SIGRTMIN + 6
ANSWER = signal.SIGRTMIN + 7
MEMFD = "notebook-accel-where"  # the name the memfd shows in /proc/<pid>/fd
RESPONDER = b"accel-where"  # the responder thread's name in /proc/<pid>/task/<tid>/comm
_SETTLE = 0.02  # seconds of silence that end faulthandler's writes into the wake pipe
_MAX_FRAMES = 200
_PR_SET_NAME = 15
# The names a collective's tensors have among its arguments (torch.distributed's).
_TENSOR_ARGUMENTS = (
    "tensor",
    "tensor_list",
    "input_tensor",
    "output_tensor",
    "input",
    "output",
    "input_tensor_list",
    "output_tensor_list",
    "object_list",
)

_armed = threading.Lock()
_state: dict[str, object] = {}


def arm(sender: Sender | None) -> None:
    """Have this process answer the launcher's questions (once per process; a TPU process's
    device threads each call it). ``sender``: where the answers go (None: none, the parent
    reads the memfd only)."""
    with _armed:
        if _state:
            return
        # An unhandled real-time signal ends a process: the parent asks only once the
        # responder thread (started last) shows by its name. (No signal.signal here: a TPU
        # process arms from a device thread; faulthandler's handlers go in from any thread.)
        memfd = os.memfd_create(MEMFD, os.MFD_CLOEXEC)
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC)
        # The handler runs in the responder thread, which cannot read while it writes: a
        # full pipe drops the rest (one thread's stack is enough to wake it).
        os.set_blocking(wake_w, False)
        faulthandler.register(DUMP, file=memfd, all_threads=True, chain=False)
        faulthandler.register(ANSWER, file=wake_w, all_threads=False, chain=False)
        _state.update(memfd=memfd, wake=(wake_r, wake_w))
        # A bare thread: threading's start() waits until the new thread runs.
        _thread.start_new_thread(_respond, (wake_r, sender))


def _name_this_thread() -> None:
    """The responder's name where the parent finds its thread id (Linux's prctl)."""
    with contextlib.suppress(OSError, AttributeError, ValueError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(RESPONDER), 0, 0, 0)


def _respond(wake: int, sender: Sender | None) -> None:
    """The responder thread: blocked in ``read`` (no GIL held) until asked."""
    _name_this_thread()
    while True:
        try:
            data = os.read(wake, 1 << 16)
        except OSError:
            return
        if not data:
            return
        _drain(wake)
        if sender is None:
            continue
        with contextlib.suppress(Exception):  # an answer is never worth the rank's life
            sender.send(snapshot())


def _drain(fd: int) -> None:
    """Read the rest of faulthandler's writes (they come in many small pieces)."""
    while select.select([fd], [], [], _SETTLE)[0]:
        if not os.read(fd, 1 << 16):
            return


def _frames(frame: FrameType) -> tuple[Frame, ...]:
    summary = traceback.StackSummary.extract(
        traceback.walk_stack(frame), limit=_MAX_FRAMES, lookup_lines=False
    )
    return tuple((f.filename, f.lineno or 0, f.name) for f in reversed(summary))


def snapshot(busy: float | None = None) -> Where:
    """Where this process's threads are now (but the calling one), with what can be known
    besides: the tensors of the collective the rank's function waits in, the collectives
    issued so far, the flight recorder's last entries when it is on, the CPU time used.

    ``busy``: the CPU share the caller measured, if any (a cluster's rank).
    """
    frames = private_cpython.thread_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    stacks = []
    tensors = ""
    for ident, frame in frames.items():
        if ident == me:
            continue
        stack = Stack(ident, names.get(ident, ""), _frames(frame))
        stacks.append(stack)
        if not tensors and entry_index(stack) is not None:
            tensors = _tensors(stack, frame)
    return Where(
        threads=tuple(stacks),
        collectives=_quietly(private_torch.collectives_issued) if "torch" in sys.modules else None,
        tensors=tensors,
        recorder=_recorded() if "torch" in sys.modules else (),
        cpu=sum(os.times()[:2]),
        busy=busy,
    )


def _quietly(read: Callable[[], object]) -> int | None:
    try:
        value = read()
    except Exception:  # noqa: BLE001 - a look never breaks the rank
        return None
    return value if isinstance(value, int) else None


def _tensors(stack: Stack, innermost: FrameType) -> str:
    """The tensors of the collective ``stack``'s user function waits in: ``float32[4]``."""
    start = entry_index(stack)
    assert start is not None
    frames = stack.frames[start + 1 :]
    found = collective_of(frames)
    if found is None:
        return ""
    # Walk out from the innermost frame to the collective's own frame.
    frame: FrameType | None = innermost
    for _ in range(len(frames) - 1 - found):
        frame = frame.f_back if frame is not None else None
    if frame is None:
        return ""
    try:
        arguments = frame.f_locals
    except Exception:  # noqa: BLE001
        return ""
    for name in _TENSOR_ARGUMENTS:
        if name in arguments:
            shown = _shape(arguments[name])
            if shown:
                return shown
    return ""


def _shape(value: object) -> str:
    """``float32[4, 8]`` for a tensor, ``3 x float32[4]`` for a list of them."""
    if isinstance(value, list | tuple):
        if not value:
            return ""
        first = _shape(value[0])
        return f"{len(value)} x {first}" if first else f"{len(value)} objects"
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if dtype is None or shape is None:
        return ""
    kind = str(dtype).replace("torch.", "")
    return f"{kind}[{', '.join(str(int(n)) for n in shape)}]"


def _recorded() -> tuple[str, ...]:
    """The flight recorder's last collectives, one line each, when it is on."""
    lines = []
    for entry in private_torch.flight_recorder():
        sizes = entry.get("input_sizes") or []
        dtypes = entry.get("input_dtypes") or []
        tensors = ", ".join(
            f"{str(d).lower()}{list(s)}" for d, s in zip(dtypes, sizes, strict=False)
        )
        lines.append(
            f"{entry['profiling_name']} #{entry['collective_seq_id']} ({tensors}) {entry['state']}"
        )
    return tuple(lines)


def cpu_share(seconds: float = 0.25) -> float:
    """This process's CPU use over ``seconds`` from now, in percent of one core."""
    before, start = sum(os.times()[:2]), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (sum(os.times()[:2]) - before) / max(time.monotonic() - start, 1e-6)
