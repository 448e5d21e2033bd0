"""What only the notebook's namespace reaches: the objects a worker cannot reach by reference.

    roots(): IPython's user namespace, where it keeps the values cells displayed (Out, the
      display hook's, the last result's), or __main__'s; IPython's own entries skipped
    Graph(roots): every object reached from them, a level at a time (gc.get_referents of a
      level in one call), never through modules or classes; numpy views' bases and torch
      views' bases (held in C++) as links too; each one's references counted as found
    Graph.kept(): the objects anything else refers to (more references than found, a weak
      reference from outside, a tensor that C++ holds beyond views found here), those never
      read, and everything they reach: what a worker might reach

Counting references finds what a worker could reach through a module, a library's registry,
a frame or torch's C++ side, without walking those: an object held only by what the walk
found has exactly as many references as the walk counted. The walk stops at 50,000 objects,
10 references read per object or 0.1 s, and does not read a container of more than 16384
items: what it did not read is kept.
"""

from __future__ import annotations

import gc
import itertools
import operator
import sys
import time
import types
import weakref
from collections import Counter
from contextlib import suppress
from typing import Any

from ...private import torch as private_torch

__all__ = ["ARRAY", "BUDGET", "TENSOR", "Graph", "roots"]

# At most: objects looked at, references read (per object), seconds (the cell's end waits);
# beyond, what is unseen is kept. A BERT-base with its optimizer: 5,000 objects.
BUDGET = 50_000
_SCANS = 10
_SECONDS = 0.1
_WIDE = 1 << 14  # a container holding more is not read (its items count as held from outside)

# Never walked into: they own no buffer of the notebook's, or they lead into libraries.
_ATOMS = frozenset(
    {str, bytes, int, float, complex, bool, type(None), type, types.ModuleType, types.CodeType}
    | {types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType}
    | {types.GetSetDescriptorType, types.MemberDescriptorType}
)
_CONTAINERS = (list, tuple, dict, set, frozenset)
_ATOM, ARRAY, TENSOR = "atom", "array", "tensor"


def _shell() -> Any:
    """IPython's running shell, if any (never imported here)."""
    if "IPython" not in sys.modules:
        return None
    with suppress(Exception):
        from IPython.core.interactiveshell import InteractiveShell

        if InteractiveShell.initialized():
            return InteractiveShell.instance()
    return None


def _displayed(name: object) -> bool:
    """IPython's names for the values cells displayed: Out, _, __, ___, _<n>."""
    if not isinstance(name, str):
        return False
    return name in ("Out", "_oh", "_", "__", "___") or (name[:1] == "_" and name[1:].isdigit())


def roots() -> tuple[list[dict[str, Any]], set[int]]:
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
    found: list[dict[str, Any]] = [namespace]
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
            found.append(holder)
            skip.update(id(v) for k, v in holder.items() if not kept(k))
    # In, exit, get_ipython, ...: IPython's own entries in the user's namespace too.
    return found, skip


def _type_of(module: str, name: str) -> type | None:
    """A class of a module this process imported (None where it did not: nothing of it here)."""
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) else None


class Graph:
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
        self._kinds: dict[type, Any] = {}  # a class -> _ATOM, ARRAY, TENSOR, its container
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
        special = {cls: kind for cls, kind in kinds.items() if kind is ARRAY or kind is TENSOR}
        for obj in level if special else ():
            kind = special.get(type(obj))
            if kind is not None:
                (self.arrays if kind is ARRAY else self.tensors).add(id(obj))
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
        """_ATOM (a class, a module: never walked), ARRAY, TENSOR, the built-in container
        ``cls`` is one of, or None."""
        if cls not in self._kinds:
            found: Any = None
            if issubclass(cls, (type, types.ModuleType)) or cls in _ATOMS:
                found = _ATOM
            elif self.ndarray is not None and issubclass(cls, self.ndarray):
                found = ARRAY
            elif self.tensor is not None and issubclass(cls, self.tensor):
                found = TENSOR
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
    return private_torch.view_base(tensor)
