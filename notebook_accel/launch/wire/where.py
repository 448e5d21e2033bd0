"""Where a stuck launch's ranks are, and what that means, decided once for every backend.

    each backend gathers, per rank, a RankView:
      where   channel.Where: the rank's own answer (launch/rank/where.py), or the stacks
              faulthandler wrote from a signal handler (parse_faulthandler)
      state   running, returned, failed, died, ...; its CPU share, its child processes
              (a DataLoader's workers), py-spy's native frames where allowed
    report(views, origins, why) -> the text the cell shows (and a timeout's or stop's note):
      a one-line diagnosis where one can be made: ranks in different collectives, in the same
      one with different tensors, a rank that has not reached the collective the others wait
      in (busy or idle), a rank whose function returned, or that ended, while others wait;
      then each rank: its state and the stack of the thread running the user's function,
      from the user's function on (the launcher's frames hidden, as in a rank's traceback),
      a cell's frames named as IPython names them ("Cell In[4], line 7")

The rank's side (launch/rank/where.py) marks nothing: the user's function is what its
thread runs below the launcher's entry frame (``ENTRIES``), found by file and name, so the
same reading serves a rank's answer and a stack read from outside.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...reporting.channel import Frame, Stack, Where

__all__ = [
    "ENTRIES",
    "Child",
    "RankView",
    "Spot",
    "collective_of",
    "entry_index",
    "locate",
    "parse_faulthandler",
    "report",
]

# The launcher's frame that calls the user's function, in each kind of rank: every frame
# above it (and it) is the launcher's, hidden in the report.
ENTRIES = (
    ("notebook_accel/launch/rank/worker.py", "run_call"),
    ("notebook_accel/launch/local/xla/engine.py", "_entry"),
)
# Where a rank's function returned and the launcher leaves the process group with the others.
_CLOSING = ("notebook_accel/launch/rank/worker.py", "finish_distributed")
# A session's worker between tasks.
_IDLE = ("notebook_accel/launch/rank/serve.py", "main")
_LOADER = "torch/utils/data/dataloader.py"
_SCRIPT = "notebook_accel/launch/wire/script.py"  # a script run as the launch's function
_RUNPY = "<frozen runpy>"
_OURS = "/notebook_accel/"

# The collectives a rank's function can wait in: torch.distributed's, torch_xla's.
_COLLECTIVES = {
    "torch/distributed/distributed_c10d.py": frozenset(
        (
            "all_gather all_gather_coalesced all_gather_into_tensor all_gather_object "
            "all_reduce all_reduce_coalesced all_to_all all_to_all_single barrier "
            "batch_isend_irecv broadcast broadcast_object_list gather gather_object "
            "irecv isend monitored_barrier recv recv_object_list reduce reduce_scatter "
            "reduce_scatter_tensor scatter scatter_object_list send send_object_list"
        ).split()
    ),
    "torch_xla/core/xla_model.py": frozenset(
        "all_gather all_reduce all_to_all collective_permute mesh_reduce reduce_scatter "
        "rendezvous".split()
    ),
}
# A library's frame (not the user's own code): site-packages, the standard library, ours.
_LIBRARY = re.compile(
    r"[\\/](site|dist)-packages[\\/]|[\\/]lib[\\/]python\d+(\.\d+)?t?[\\/]|"
    r"[\\/]notebook_accel[\\/]|^<frozen "
)
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
_SHOWN_FRAMES = 30  # of a stack, the innermost ones shown
_LIBRARY_TAIL = 4  # library frames shown below the user's innermost one
_FORKED = ("multiprocessing/process.py", "_bootstrap")  # where a forked child's own run starts


def parse_faulthandler(text: str) -> tuple[Stack, ...]:
    """The threads of a ``faulthandler`` dump (most recent call first there), each stack
    outermost first as in a traceback."""
    threads: list[Stack] = []
    ident, name, frames = None, "", list[Frame]()
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head is not None:
            if ident is not None:
                threads.append(Stack(ident, name, tuple(reversed(frames))))
            ident, name, frames = int(head.group(2), 16), head.group(3) or "", []
            continue
        frame = _FRAME.match(line)
        if frame is not None and ident is not None:
            number = frame.group(2)
            frames.append((frame.group(1), int(number) if number.isdigit() else 0, frame.group(3)))
    if ident is not None:
        threads.append(Stack(ident, name, tuple(reversed(frames))))
    return tuple(threads)


def _is(frame: Frame, place: tuple[str, str]) -> bool:
    return frame[2] == place[1] and frame[0].replace("\\", "/").endswith(place[0])


def entry_index(stack: Stack) -> int | None:
    """The index of the launcher's entry frame in ``stack`` (the user's function is the next
    one), or None where this thread runs no user function."""
    for index in range(len(stack.frames) - 1, -1, -1):
        if any(_is(stack.frames[index], entry) for entry in ENTRIES):
            return index
    return None


def collective_of(frames: Sequence[Frame]) -> int | None:
    """The index of the outermost collective among ``frames`` (the one the user called:
    ``broadcast_object_list`` rather than the ``broadcast`` it calls), or None."""
    for index, (file, _, function) in enumerate(frames):
        path = file.replace("\\", "/")
        for suffix, names in _COLLECTIVES.items():
            if function in names and path.endswith(suffix):
                return index
    return None


def _is_library(file: str) -> bool:
    return file == "<string>" or bool(_LIBRARY.search(file))


@dataclass(frozen=True)
class Spot:
    """Where one thread of a rank's function is."""

    frames: tuple[Frame, ...]  # from the user's function on
    collective: str | None = None  # the collective it waits in
    line: Frame | None = None  # its innermost frame of the user's own code
    loader: bool = False  # inside a DataLoader's iteration (waiting for its workers?)
    loading: bool = False  # not in the function yet: the call unpickled (its imports)


def locate(where: Where) -> tuple[list[Spot], str]:
    """The spots of the threads running the user's function, and otherwise what the rank is
    doing: ``"returned"`` (its function returned: the launcher's closing barrier), ``"idle"``
    (a session's worker between tasks) or ``""``."""
    spots = []
    for stack in where.threads:
        index = entry_index(stack)
        if index is None:
            continue
        frames = stack.frames[index + 1 :]
        ours = 0  # the launcher's own frames first: the call is still being unpickled...
        while ours < len(frames) and _OURS in frames[ours][0].replace("\\", "/"):
            ours += 1
        script = any(f[0].replace("\\", "/").endswith(_SCRIPT) for f in frames[:ours])
        while script and ours < len(frames) and frames[ours][0] == _RUNPY:
            ours += 1  # ...unless they run a script (notebook-accel launch): runpy's, hidden
        frames = frames[ours:]
        found = collective_of(frames)
        # The user's line: the innermost of their own frames (above the collective: the
        # call that waits in it).
        own = [f for f in frames[:found] if not _is_library(f[0])]
        spots.append(
            Spot(
                frames,
                None if found is None else frames[found][2],
                own[-1] if own else (frames[0] if frames else None),
                any(f[0].replace("\\", "/").endswith(_LOADER) for f in frames),
                ours > 0 and not script,
            )
        )
    if spots:
        return spots, ""
    every = [frame for stack in where.threads for frame in stack.frames]
    if any(_is(frame, _CLOSING) for frame in every):
        return [], "returned"
    if any(_is(frame, _IDLE) for frame in every):
        return [], "idle"
    return [], ""


@dataclass(frozen=True)
class Child:
    """A process the rank started (a DataLoader's worker, say), as seen from outside."""

    pid: int
    state: str  # "sleeping", "running", ...
    cpu: float | None = None  # percent of one core
    where: Where | None = None


@dataclass(frozen=True)
class RankView:
    """What a backend knows of one rank when the report is made."""

    rank: int
    where: Where | None = None
    state: str = "running"  # running, finished, failed, died, not started
    pid: int | None = None
    cpu: float | None = None  # percent of one core over the last look
    process: str = ""  # the process's own state as the system says it ("sleeping", ...)
    children: tuple[Child, ...] = ()
    native: str = ""  # py-spy's dump of the thread, native frames included
    label: str = ""  # "rank 0" unless set (a TPU process holding several devices: "ranks 0-3")

    @property
    def name(self) -> str:
        return self.label or f"rank {self.rank}"


# -- naming the user's place ------------------------------------------------------------------
_SENT = "<dynamic-code>"  # cloudpickle's file name of code sent by value (the notebook's)


def _file(frame: Frame, origins: dict[str, str]) -> str:
    """The frame's file: a cell-defined function's cell file back (cloudpickle drops it)."""
    file, _, function = frame
    if file != _SENT:
        return file
    return origins.get(function, "<a notebook cell>")


def _cell(file: str) -> str | None:
    """IPython's name of a cell's file ("Cell In[4]"), where this process is its kernel."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    compiler = getattr(shell, "compile", None)
    name = getattr(compiler, "format_code_name", None)
    if not callable(name):
        return None
    try:
        found = name(file)
    except Exception:  # noqa: BLE001 - another IPython: the file's own name
        return None
    if isinstance(found, tuple) and len(found) == 2:
        return f"{found[0]} {found[1]}"
    return None


class _Names:
    """Places as the report writes them: a cell as IPython names it, else the file."""

    def __init__(self, origins: Iterable[tuple[str, str]]) -> None:
        self.origins = dict(origins)

    def file(self, frame: Frame) -> str:
        file = _file(frame, self.origins)
        return _cell(file) or file

    def at(self, frame: Frame, previous: str = "") -> str:
        """``Cell In[4], line 7`` (``line 7`` when ``previous`` named the same file)."""
        file = self.file(frame)
        shown = file if "/" not in file else file.rsplit("/", 1)[1]
        return f"line {frame[1]}" if file == previous else f"{shown}, line {frame[1]}"

    def lines(self, frames: Sequence[Frame]) -> list[str]:
        """A traceback's lines of ``frames`` (the innermost ``_SHOWN_FRAMES``; below the
        user's innermost frame, a few of the libraries' and where the last one is)."""
        out = []
        own = [i for i, frame in enumerate(frames) if not _is_library(frame[0])]
        hidden = len(frames) - (own[-1] + 1 + _LIBRARY_TAIL) if own else 0
        if hidden > 1:
            last = frames[-1]
            frames = frames[: len(frames) - hidden]
            tail = f"  ... {hidden} more frames in libraries, the innermost "
            tail += f"{last[0].rsplit('/', 1)[-1]}, line {last[1]}, in {last[2]}"
        else:
            tail = ""
        if len(frames) > _SHOWN_FRAMES:
            out.append(f"  ... {len(frames) - _SHOWN_FRAMES} outer frames")
            frames = frames[-_SHOWN_FRAMES:]
        for frame in frames:
            file = _file(frame, self.origins)
            out.append(f'  File "{_cell(file) or file}", line {frame[1]}, in {frame[2]}')
            source = linecache.getline(file, frame[1]).strip() if frame[1] else ""
            if source:
                out.append(f"    {source}")
        return out + ([tail] if tail else [])


# -- the diagnosis ----------------------------------------------------------------------------
def _cpu(view: RankView) -> str:
    if view.cpu is None:
        return ""
    if view.cpu >= 50:
        return f"busy: {view.cpu:.0f}% CPU"
    return f"{'idle: ' if view.cpu < 5 else ''}{view.cpu:.0f}% CPU"


def _main_spot(view: RankView) -> Spot | None:
    """The rank's spot that says most: one in a collective, else its first."""
    if view.where is None:
        return None
    spots, _ = locate(view.where)
    waiting = [s for s in spots if s.collective is not None]
    chosen = waiting or spots
    return chosen[0] if chosen else None


def _gone(view: RankView) -> str:
    """How a rank outside its function is, or "" while it runs it."""
    if view.state not in ("running", ""):
        return {
            "finished": "returned",
            "failed": "raised",
            "died": "died",
            "starting": "starting (it cannot say where it is yet)",
        }.get(view.state, view.state)
    if view.where is not None and not locate(view.where)[0]:
        return locate(view.where)[1]
    return ""


def _diagnosis(views: Sequence[RankView], names: _Names) -> str:
    """One line that says what the ranks' places mean together, or "" where nothing does."""
    spots = {v.rank: _main_spot(v) for v in views}
    waiting = {r: s for r, s in spots.items() if s is not None and s.collective is not None}
    if not waiting:
        return ""
    kinds = {s.collective for s in waiting.values()}
    if len(kinds) > 1:
        parts, previous = [], ""
        for rank, spot in waiting.items():
            assert spot.line is not None
            parts.append(f"rank {rank} in {spot.collective} at {names.at(spot.line, previous)}")
            previous = names.file(spot.line)
        return "; ".join(parts) + ": the ranks wait in different collectives."
    [kind] = kinds
    tensors = {r: v.where.tensors for v in views if (r := v.rank) in waiting and v.where}
    if len(set(tensors.values())) > 1 and all(tensors.values()):
        shown = ", ".join(f"rank {r} {t}" for r, t in tensors.items())
        return f"the ranks wait in {kind} with different tensors: {shown}."
    first = next(iter(waiting.values()))
    assert first.line is not None
    there = f"{kind} at {names.at(first.line)}"
    others = []
    for view in views:
        if view.rank in waiting:
            continue
        gone = _gone(view)
        found = spots[view.rank]
        if gone == "returned":
            others.append(
                f"{view.name}'s function returned (it waits in the launcher's closing barrier) "
                f"while {_who(waiting)} waits in {there}"
            )
        elif gone:
            others.append(f"{view.name} {gone} while {_who(waiting)} waits in {there}")
        elif found is not None and found.line is not None:
            busy = _cpu(view)
            doing = " (in a DataLoader's iteration)" if found.loader else ""
            others.append(
                f"{view.name} has not reached the collective {_who(waiting)} waits in ({there}); "
                f"it is at {names.at(found.line)}{doing}" + (f" ({busy})" if busy else "")
            )
        elif view.where is None:
            others.append(f"{view.name} did not say where it is while {_who(waiting)} waits")
    return "; ".join(others) + "." if others else ""


def _who(waiting: dict[int, Spot]) -> str:
    ranks = sorted(waiting)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


# -- each rank --------------------------------------------------------------------------------
def _head(view: RankView) -> str:
    """``rank 0 (pid 4242, sleeping, 0% CPU)``."""
    facts = [f"pid {view.pid}"] if view.pid is not None else []
    if view.process and view.process not in ("sleeping", "running"):
        facts.append(view.process)
    if _cpu(view):
        facts.append(_cpu(view).replace("busy: ", "").replace("idle: ", ""))
    return view.name + (f" ({', '.join(facts)})" if facts else "")


_OUTSIDE = {
    "returned idle": "its task returned; idle, waiting for the next task",
    "returned": "its function returned; it waits in the launcher's closing barrier",
    "idle": "idle, waiting for the next task",
}


def _summary(view: RankView, spot: Spot | None, names: _Names) -> str:
    head, gone = _head(view), _gone(view)
    if view.where is None:
        return f"{head}: {gone or 'did not answer'}"
    outside = f"{gone} {locate(view.where)[1]}".strip()
    if outside in _OUTSIDE or gone in _OUTSIDE:
        return f"{head}: {_OUTSIDE.get(outside) or _OUTSIDE[gone]}"
    if spot is None:
        return f"{head}: {gone or 'not in a function of the launch'}"
    return f"{head}: {_doing(spot, view.where, names)}"


def _doing(spot: Spot, where: Where, names: _Names) -> str:
    """What a rank's function is doing, where."""
    what = f"waiting in {spot.collective}" if spot.collective else "running its function"
    if spot.loading:
        what = "loading its function (unpickling the call: its imports)"
    if spot.collective and where.tensors:
        what += f" ({where.tensors})"
    if spot.line is not None:
        what += f" at {names.at(spot.line)}"
    if spot.loader and not spot.collective:
        what += ", in a DataLoader's iteration"
    return what


def _rank_lines(view: RankView, names: _Names) -> list[str]:
    spot = _main_spot(view)
    lines = [_summary(view, spot, names)]
    where = view.where
    if where is not None and where.by == "signal":
        lines.append(
            "  (read from its signal handler: its Python did not answer, a thread holds the "
            "interpreter inside C code)"
        )
    spots = locate(where)[0] if where is not None else []
    if len(spots) > 1:  # a process of several devices: each device thread's function
        for index, each in enumerate(spots, 1):
            doing = f"waiting in {each.collective}" if each.collective else "running"
            lines.append(f"  device thread {index} of {len(spots)}: {doing}")
            lines += ["  " + line for line in names.lines(each.frames)]
    elif spot is not None:
        lines += names.lines(spot.frames)
    elif where is not None and _gone(view) not in ("returned", "idle"):
        for stack in where.threads[:1]:  # no function of the launch: the first thread
            lines += names.lines(stack.frames)
    if where is not None and where.recorder:
        lines.append("  the flight recorder's last collectives: " + "; ".join(where.recorder))
    for child in view.children:
        cpu = f", {child.cpu:.0f}% CPU" if child.cpu is not None else ""
        lines.append(f"  its child process {child.pid} ({child.state}{cpu})")
        for frames in _child_stacks(child)[:1]:
            lines += ["  " + line for line in names.lines(frames)]
    if view.native:
        lines.append("  native frames (py-spy):")
        lines += ["    " + line for line in view.native.rstrip().splitlines()]
    return lines


def _child_stacks(child: Child) -> list[tuple[Frame, ...]]:
    """A child's stacks, each from its own start on (a fork's frames before it are its
    parent's)."""
    stacks = []
    for stack in child.where.threads if child.where is not None else ():
        starts = [i for i, frame in enumerate(stack.frames) if _is(frame, _FORKED)]
        frames = stack.frames[starts[-1] + 1 :] if starts else stack.frames
        if frames:
            stacks.append(frames)
    return stacks


def _loader_line(views: Sequence[RankView], names: _Names) -> str:
    """Where no rank waits in a collective: the ranks that wait for their DataLoader's
    workers, and where those are."""
    parts = []
    for view in views:
        spot = _main_spot(view)
        if spot is None or not spot.loader or not view.children:
            continue
        workers = []
        for child in view.children:
            stacks = _child_stacks(child)
            own = [f for f in (stacks[0] if stacks else ()) if not _is_library(f[0])]
            at = f" at {names.at(own[-1])}" if own else ""
            workers.append(f"pid {child.pid}{at} ({child.state})")
        parts.append(f"{view.name} waits for its DataLoader's workers: {', '.join(workers)}")
    return "; ".join(parts) + "." if parts else ""


def report(views: Sequence[RankView], origins: Iterable[tuple[str, str]], head: str) -> str:
    """The report's text: ``head`` (what happened, what to do), the diagnosis, each rank.

    ``origins``: the payload's (function name, cell file) pairs (payload.code_origins).
    """
    names = _Names(origins)
    lines = [head]
    diagnosis = _diagnosis(views, names) or _loader_line(views, names)
    if diagnosis:
        lines.append(diagnosis)
    for view in sorted(views, key=lambda v: v.rank):
        lines += _rank_lines(view, names)
    return "\n".join(lines)
