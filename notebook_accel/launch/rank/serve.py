"""A session's worker: set up once, then run one task after another in a kept namespace.

    parent (launch/local/session.py)                    worker (this module's main)
    --------------------------                    ---------------------------
    start: Payload(environ, results shipment) --> worker.start, as a rank of a launch; its
                                                  share of the CPU; seeded once
                                              <-- Result(None): ready
    a task: Payload on the commands pipe      --> load it (its buffers mapped copy-on-write),
      (function, args, kwargs; the task's         bind the function to the namespace, run it
       buffers through shared memory)             (SIGINT raises KeyboardInterrupt there only)
                                              <-- Progress, Metrics, Health, output lines
                                              <-- Result (large buffers into the results
                                                  segment of the start) or Failure, after the
                                                  task's logged rows and output are flushed
    SIGINT (stop, timeout, a peer's failure)  --> KeyboardInterrupt in the task's code
    None (close), or the pipe closed          --> leave the process group together, exit

One namespace per worker, kept for the worker's life: a ``%%distributed`` cell runs in it, and
a function from the notebook runs with it as its globals (``bind``): a name the workers have is
theirs; a name only the notebook had comes with the function (the latest task's, never
assigned into the namespace).
"""

from __future__ import annotations

import ast
import builtins
import functools
import linecache
import pickle
import signal
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ...launched import WorkerEnv
from ...reporting.channel import Failure, Result
from ..wire.payload import Payload
from ..wire.transport import Paired, Shipment
from .worker import (
    flush_all,
    leave,
    random_state,
    run_call,
    share_cpu_threads,
    start,
    wind_down,
)

__all__ = ["Cell", "Namespace", "bind", "main", "namespace", "probe", "pull_value", "push_values"]


class Namespace(dict[str, Any]):
    """A worker's globals: what its cells and tasks assigned, kept across tasks.

    A name it lacks is looked up in ``fallback`` (the names the latest task's function brought
    from the notebook) before the builtins, so a notebook function's helpers and settings still
    resolve; reading it never assigns it here.
    """

    def __init__(self) -> None:
        # "__main__": classes and functions defined in a cell travel back by value.
        super().__init__(__name__="__main__", __builtins__=builtins)
        self.fallback: dict[str, Any] = {}

    def __missing__(self, name: str) -> Any:
        return self.fallback[name]  # KeyError: Python goes on to the builtins


namespace = Namespace()


@dataclass(frozen=True)
class Cell:
    """A ``%%distributed`` cell's code; its last expression's value is shown as IPython does."""

    source: str
    filename: str

    def function(self, globals_: dict[str, Any]) -> Callable[[], None]:
        """The cell as a function whose frame runs in ``globals_`` (the traceback's first)."""
        tree = ast.parse(self.source, self.filename)
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body[-1]
            hook = ast.Attribute(
                value=ast.Call(ast.Name("__import__", ast.Load()), [ast.Constant("sys")], []),
                attr="displayhook",
                ctx=ast.Load(),
            )
            tree.body[-1] = ast.copy_location(ast.Expr(ast.Call(hook, [last.value], [])), last)
            ast.fix_missing_locations(tree)
        code = compile(tree, self.filename, "exec")
        # The worker's traceback shows the cell's lines.
        lines = self.source.splitlines(keepends=True)
        linecache.cache[self.filename] = (len(self.source), None, lines, self.filename)
        # Module code called as a function runs with its locals being its globals.
        return types.FunctionType(code, globals_, "<cell>")

    def __call__(self) -> None:
        self.function(namespace)()


def _by_value(function: types.FunctionType) -> bool:
    """Sent by cloudpickle with copies of its globals (defined in the notebook)."""
    module = sys.modules.get(function.__module__)
    return module is None or vars(module) is not function.__globals__


def _with_globals(function: types.FunctionType, globals_: dict[str, Any]) -> types.FunctionType:
    rebuilt = types.FunctionType(
        function.__code__,
        globals_,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    rebuilt.__kwdefaults__ = function.__kwdefaults__
    rebuilt.__qualname__ = function.__qualname__
    rebuilt.__module__ = function.__module__
    rebuilt.__doc__ = function.__doc__
    rebuilt.__dict__.update(function.__dict__)
    return rebuilt


def bind(function: Callable[..., Any]) -> Callable[..., Any]:
    """The task's function, running in this worker's namespace.

    A notebook function (and each notebook function among the globals it uses) gets the
    namespace as its globals; the rest of what it brought is the namespace's fallback. Functions
    of importable modules run as they are.
    """
    if isinstance(function, Cell):
        return function.function(namespace)
    if isinstance(function, functools.partial):
        return functools.partial(bind(function.func), *function.args, **function.keywords)
    if not isinstance(function, types.FunctionType) or not _by_value(function):
        return function
    captured = function.__globals__

    def rebound(value: Any) -> Any:
        if isinstance(value, types.FunctionType) and value.__globals__ is captured:
            return _with_globals(value, namespace)
        return value

    namespace.fallback = {name: rebound(value) for name, value in captured.items()}
    return _with_globals(function, namespace)


# -- the tasks the session sends besides the user's functions --------------------------------


def push_values(values: dict[str, Any]) -> None:
    """``Workers.push``: assign each name in the namespace."""
    namespace.update(values)


def pull_value(name: str) -> Any:
    """``Workers.pull``: the namespace's value of ``name``."""
    if name not in namespace:
        raise NameError(f"name {name!r} is not defined in the workers' namespace")
    return dict.__getitem__(namespace, name)


def probe(seconds: float) -> bool:
    """Whether the default process group still answers: an all-reduce done within ``seconds``.

    No group: nothing to check. A group whose ranks stopped at different collectives either
    never completes the probe or adds up to the wrong sum.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return True
    import torch

    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)], device=device)
    work = dist.all_reduce(value, async_op=True)
    end = time.monotonic() + seconds
    while not work.is_completed():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    work.wait()
    return bool(value.item() == world * (world + 1) / 2)


# -- the loop ----------------------------------------------------------------------------------

# True only while a task's code runs: a SIGINT that arrives later (the task had just ended)
# must not break the loop between two tasks, nor a message half sent.
_interruptible = [False]


def _on_interrupt(signum: int, frame: Any) -> None:
    if _interruptible[0]:
        raise KeyboardInterrupt


def _allow_interrupts() -> None:
    _interruptible[0] = True


def _attempt(payload: Payload, shipment: Shipment) -> Result | Failure:
    try:
        return run_call(payload, _allow_interrupts, bind, shipment)
    finally:
        _interruptible[0] = False


def _task(data: bytes, results: Shipment) -> Result | Failure:
    """One task from the parent's bytes: its Result or Failure, its output flushed first."""
    from ...reporting import live

    try:
        payload = pickle.loads(data)  # the parent's own pipe: nobody else can write to it
        assert payload.shipment is not None, "a task brings its inputs' shipment"
        outcome = _attempt(payload, Paired(payload.shipment, results))
    except BaseException as exc:  # an interrupt around the task's code, a lost fd
        outcome = Failure.from_exception(exc)
    relay = live.relay()
    if relay is not None:
        relay.flush()  # the rows the task logged reach the chart before its answer
    flush_all()
    return outcome


def _ready(worker: WorkerEnv, payload: Payload) -> Result | Failure:
    try:
        share_cpu_threads(worker, payload.environ)
        random_state()  # once: later tasks go on with the same random streams
    except BaseException as exc:
        return Failure.from_exception(exc)
    return Result(pickle.dumps(None))


def main(worker: WorkerEnv, payload: Payload, *pipes: Connection) -> None:
    """Serve one rank of a session. Called by ``multiprocessing`` in the child process.

    ``pipes``: the child ends worker.start takes, then the commands pipe.
    """
    *launch_pipes, commands = pipes
    sender = start(worker, payload, *launch_pipes)
    assert payload.shipment is not None, "the session's results shipment comes with the start"
    results = payload.shipment
    signal.signal(signal.SIGINT, _on_interrupt)
    outcome = _ready(worker, payload)
    sender.send(outcome)
    failed = isinstance(outcome, Failure)
    while not failed:
        try:
            data = commands.recv_bytes()
        except (EOFError, OSError):
            break  # the parent is gone (the lifeline ends this process too)
        if not data:
            break  # close()
        sender.send(_task(data, results))
    wind_down(failed)
    leave(launch_pipes[0], failed)
