"""accelerate's parameters and Accelerator attributes beside ours: provided, refused or a gap.

    callables()              accelerate's functions and classes that a shim provides (each
                             once, under its first path), with ours beside
    census(where, a, o)      one of them: the parameters ours provides, those it refuses by
                             name (refusals.PARAMETERS, each with its reason), the gaps, and
                             the positional parameters a call would bind to another name
    attribute_census()       the public attributes of accelerate's Accelerator (its class and
                             an instance made on CPU, in a fresh process) beside ours
                             (refusals.ATTRIBUTES), and each method's parameters

Needs accelerate installed (tests/test_surface.py, benchmarks/surface.py); importing this
module does not import it, nor torch. A parameter is a name a call may pass: ``self``,
``*args``, ``**kwargs`` and names with a leading underscore are not counted, and ours taking
``**kwargs`` does not count as taking a name.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import env, refusals
from .paths import SHIMS
from .refusals import Reason, Refused

__all__ = ["Census", "attribute_census", "callables", "census", "parameters"]

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass
class Census:
    """What ours does with the parameters (or attributes) of one of accelerate's objects.

    Attributes:
        where: accelerate's path (``"accelerate.utils.gather"``, ``"Accelerator.prepare"``).
        provided: the names ours takes, with accelerate's meaning.
        refused: the names ours takes and refuses when given a value, with the reason.
        gaps: the names ours does not take at all (a TypeError for a call that passes one).
        misbound: ``(position, accelerate's name, ours)`` where a positional call would bind
            an argument to another parameter than accelerate's.
    """

    where: str
    provided: list[str] = field(default_factory=list)
    refused: dict[str, Reason] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)
    misbound: list[tuple[int, str, str]] = field(default_factory=list)


def parameters(function: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """``(every named parameter, the positional ones in order)`` of ``function`` (a class:
    its constructor's; a dataclass's are its init fields)."""
    signature = inspect.signature(function)
    named, positional = [], []
    for p in signature.parameters.values():
        if p.kind in _VARIADIC or p.name in ("self", "cls") or p.name.startswith("_"):
            continue
        named.append(p.name)
        if p.kind in _POSITIONAL:
            positional.append(p.name)
    return named, positional


def census(where: str, theirs: Callable[..., Any], ours: Callable[..., Any], key: str) -> Census:
    """Compare the parameters of accelerate's ``theirs`` with ours; ``key`` names ours in
    ``refusals.PARAMETERS`` (its ``__qualname__``)."""
    found = Census(where)
    their_names, their_positions = parameters(theirs)
    our_names, our_positions = parameters(ours)
    refused = refusals.PARAMETERS.get(key, {})
    for name in their_names:
        if name in refused and name in our_names:
            found.refused[name] = refused[name].reason
        elif name in our_names:
            found.provided.append(name)
        else:
            found.gaps.append(name)
    for i, (a, o) in enumerate(zip(their_positions, our_positions, strict=False)):
        if a != o:
            found.misbound.append((i, a, o))
    return found


def _is_enum(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, enum.Enum)


def _readable(value: object) -> bool:
    try:
        inspect.signature(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def callables() -> dict[str, tuple[Any, Any]]:
    """accelerate's path -> (its function or class, ours), for every one a shim provides."""
    from .surface import accelerate_names

    seen: set[int] = set()
    out: dict[str, tuple[Any, Any]] = {}
    for theirs_module, ours_module in SHIMS.items():
        a = importlib.import_module(theirs_module)
        o = importlib.import_module(ours_module)
        for name in accelerate_names(theirs_module):
            theirs = getattr(a, name)
            if not callable(theirs) or _is_enum(theirs) or id(theirs) in seen:
                continue
            ours = getattr(o, name, None)
            refused = isinstance(ours, type) and issubclass(ours, Refused)
            if ours is None or refused or not (_readable(theirs) and _readable(ours)):
                continue
            seen.add(id(theirs))
            out[f"{theirs_module}.{name}"] = (theirs, ours)
    return out


def key_of(ours: Any) -> str:
    """The key of ``ours`` in ``refusals.PARAMETERS``: its ``__qualname__``."""
    return str(getattr(ours, "__qualname__", getattr(ours, "__name__", "")))


_LIST = (
    "import json, sys\n"
    "module = __import__(sys.argv[1], fromlist=['Accelerator'])\n"
    "accelerator = module.Accelerator(cpu=True)\n"
    "print(json.dumps(sorted(n for n in dir(accelerator) if not n.startswith('_'))))\n"
)


def instance_attributes(package: str) -> list[str]:
    """The public attributes of ``package``'s ``Accelerator(cpu=True)`` (its class's too),
    made in a fresh process so that accelerate's process-wide state stays out of this one."""
    ours = ("ACCELERATE_", "RANK")  # the caller's launch facts stay out of the fresh process
    environ = {k: v for k, v in env.snapshot().items() if not k.startswith(ours)}
    done = subprocess.run(
        [sys.executable, "-c", _LIST, package],
        capture_output=True,
        text=True,
        check=True,
        env={**environ, "CUDA_VISIBLE_DEVICES": "", "NOTEBOOK_ACCEL_NO_WARMUP": "1"},
    )
    names: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return names


def attribute_census() -> tuple[Census, list[Census]]:
    """accelerate's Accelerator attributes beside ours (``refused``: refusals.ATTRIBUTES),
    and the parameters of each of its methods that ours provides."""
    import accelerate

    import notebook_accel

    theirs, ours = accelerate.Accelerator, notebook_accel.Accelerator
    mine = set(instance_attributes("notebook_accel"))
    found = Census("accelerate.Accelerator (attributes)")
    methods = []
    for name in instance_attributes("accelerate"):
        if name in refusals.ATTRIBUTES:
            found.refused[name] = refusals.ATTRIBUTES[name]
            continue
        if name not in mine:
            found.gaps.append(name)
            continue
        found.provided.append(name)
        method = inspect.getattr_static(theirs, name, None)
        mine_static = inspect.getattr_static(ours, name, None)
        where = f"Accelerator.{name}"
        if isinstance(method, property) and callable(mine_static):
            methods.append(Census(where, gaps=["(a method here, a property in accelerate)"]))
        elif inspect.isfunction(method):
            ours_method = getattr(ours, name)
            if isinstance(mine_static, property) or not callable(ours_method):
                methods.append(Census(where, gaps=["(not a method here)"]))
            else:
                methods.append(census(where, method, ours_method, where))
    return found, methods
