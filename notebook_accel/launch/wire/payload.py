"""The payload: the user's function and arguments, pickled by value with cloudpickle.

Functions, lambdas and closures defined in notebook cells live in ``__main__``; cloudpickle
sends their code by value, so workers never import the notebook. ``sys.path`` and the working
directory travel too, so functions imported from the user's own modules import in the worker.

Before anything starts, ``build`` pickles the payload in the parent; when that fails it looks
for the culprit (an argument, a captured variable, an attribute inside one) and names it.
Large buffers (tensors, arrays) are not copied into the pickle: ``build`` returns them apart
(pickling.py), and the launch ships them through shared memory once (transport.py, shm.py).
The pickle that checks the payload is the one that travels; the culprit search, which pickles
again, drops large buffers without copying them.
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError, PayloadError
from .pickling import Outgoing, dumps, loads
from .transport import Shipment

__all__ = ["Payload", "build", "code_origins", "in_a_kernel", "load", "annotate_traceback"]


def in_a_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython's shell with a kernel behind it)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return getattr(shell, "kernel", None) is not None


@dataclass(frozen=True)
class Payload:
    """What every worker unpickles: the call, and the parent's import context."""

    call: bytes  # cloudpickle of (function, args, kwargs), large buffers out of band
    sys_path: tuple[str, ...]
    cwd: str
    environ: dict[str, str]
    # (function name, file it was defined in): cloudpickle drops code file names, so the
    # parent puts them (and the notebook's source lines) back into worker tracebacks.
    code_origins: tuple[tuple[str, str], ...] = ()
    # Where the call's large buffers are, and where the results' go (set by the launch).
    shipment: Shipment | None = None
    # The parent is a Jupyter kernel: a rank's displays are drawn in its cell, so the rank
    # gets a display shell of ours (reporting/shell.py). Decided where the payload is made.
    displays: bool = field(default_factory=in_a_kernel)


def _describe(obj: object) -> str:
    kind = type(obj)
    return (
        f"a {kind.__module__}.{kind.__qualname__}"
        if kind.__module__ != "builtins"
        else (f"a {kind.__qualname__}")
    )


def _picklable(obj: object) -> bool:
    try:
        dumps(obj, discard=True)
    except Exception:
        return False
    return True


def _children(obj: object) -> Iterator[tuple[str, object]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r}]", value
    elif isinstance(obj, list | tuple | set | frozenset):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
    elif hasattr(obj, "__dict__") and not inspect.ismodule(obj) and not inspect.isclass(obj):
        for key, value in vars(obj).items():
            yield f".{key}", value


def _narrow(path: str, obj: object, depth: int = 4) -> tuple[str, object]:
    """Follow containers and attributes down to the innermost unpicklable object."""
    if depth == 0:
        return path, obj
    if inspect.isfunction(obj):
        for name, value in _captures(obj):
            if not _picklable(value):
                return _narrow(f"{name} (captured by {obj.__qualname__})", value, depth - 1)
        return path, obj
    for suffix, child in _children(obj):
        if not _picklable(child):
            return _narrow(path + suffix, child, depth - 1)
    return path, obj


def _captures(fn: Callable[..., Any]) -> Iterator[tuple[str, object]]:
    try:
        closure = inspect.getclosurevars(fn)
    except (TypeError, ValueError):
        return
    for name, value in closure.nonlocals.items():
        yield f"variable {name!r}", value
    for name, value in closure.globals.items():
        yield f"global {name!r}", value


def _culprit(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    for i, value in enumerate(args):
        if not _picklable(value):
            path, obj = _narrow(f"args[{i}]", value)
            return f"{path} ({_describe(obj)})"
    for key, value in kwargs.items():
        if not _picklable(value):
            path, obj = _narrow(f"kwargs[{key!r}]", value)
            return f"{path} ({_describe(obj)})"
    name = getattr(function, "__qualname__", repr(function))
    path, obj = _narrow(f"the function {name}", function)
    return f"{path} ({_describe(obj)})"


def code_origins(function: Callable[..., Any]) -> tuple[tuple[str, str], ...]:
    """Each code object's name -> its file, for ``function`` and the functions it reaches
    (a traceback's frames of code sent by value get them back: annotate_traceback)."""
    codes: list[types.CodeType] = []
    seen: set[int] = set()
    pending: list[Any] = [function]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if inspect.isfunction(item):
            codes.append(item.__code__)
            pending.extend(v for _, v in _captures(item) if inspect.isfunction(v))
        for const in item.__code__.co_consts if inspect.isfunction(item) else ():
            if isinstance(const, types.CodeType):
                codes.append(const)
    origins: dict[str, str] = {}
    while codes:
        code = codes.pop(0)
        origins.setdefault(code.co_name, code.co_filename)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return tuple(origins.items())


_DYNAMIC_FRAME = re.compile(r'^(\s*)File "<dynamic-code>", line (\d+), in (\S+)$')


def annotate_traceback(text: str, origins: tuple[tuple[str, str], ...]) -> str:
    """Give frames of cell-defined functions their file and source line back."""
    where = dict(origins)
    out: list[str] = []
    for line in text.splitlines():
        match = _DYNAMIC_FRAME.match(line)
        origin = where.get(match.group(3)) if match else None
        if match is None or origin is None:
            out.append(line)
            continue
        indent, number, name = match.groups()
        out.append(f'{indent}File "{origin}", line {number}, in {name}')
        source = linecache.getline(origin, int(number)).strip()
        if source:
            out.append(f"{indent}  {source}")
    return "\n".join(out) + "\n"


def build(
    function: Callable[..., Any], args: Any, kwargs: dict[str, Any] | None, environ: dict[str, str]
) -> tuple[Payload, list[Outgoing]]:
    """Check and pickle the call in the parent, before any process starts.

    Returns the payload (without a shipment yet) and the large buffers it refers to, still
    in the notebook's memory.
    """
    if not callable(function):
        raise ConfigError("function", function, "a callable (a function defined in a cell, say)")
    if not isinstance(args, tuple):
        hint = (
            "Wrap a single argument as args=(value,)."
            if not isinstance(args, list)
            else ("Pass a tuple: args=tuple(...).")
        )
        raise ConfigError("args", args, "a tuple of positional arguments", hint)
    kwargs = dict(kwargs or {})
    try:
        pickled = dumps((function, args, kwargs))
    except Exception as exc:
        culprit = _culprit(function, args, kwargs)
        raise PayloadError(
            f"cannot send the function to the workers: {culprit} cannot be pickled ({exc}). "
            "Create it inside the function instead of capturing it from the notebook.",
            culprit=culprit,
        ) from exc
    payload = Payload(
        call=pickled.data,
        sys_path=tuple(sys.path),
        cwd=os.getcwd(),
        environ=environ,
        code_origins=code_origins(function),
    )
    return payload, pickled.buffers


def load(payload: Payload) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """In the worker: restore the import context, then unpickle the call."""
    for entry in reversed(payload.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        os.chdir(payload.cwd)
    except OSError:
        pass  # the folder may not exist on another machine
    views = payload.shipment.views() if payload.shipment is not None else []
    function, args, kwargs = loads(payload.call, views)
    return function, args, kwargs
