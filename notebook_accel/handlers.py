"""Keyword-argument handlers: small dataclasses that carry options for one component.

accelerate's pattern, kept by name: ``Accelerator(kwargs_handlers=[SomeKwargs(...)])``. Each
handler is a dataclass; :meth:`KwargsHandler.to_kwargs` returns only the fields the user set
(those that differ from the defaults), so the component's own defaults stay in force.

Example:
    >>> from notebook_accel import Accelerator
    >>> from notebook_accel.handlers import KwargsHandler
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = ["KwargsHandler", "collect"]

H = TypeVar("H", bound="KwargsHandler")


class KwargsHandler:
    """Base class of the handlers: a dataclass whose set fields become keyword arguments."""

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose values differ from the dataclass defaults."""
        default = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if getattr(self, f.name) != getattr(default, f.name)
        }


def collect(handlers: Iterable[Any] | None) -> dict[type, KwargsHandler]:
    """Validate ``kwargs_handlers`` and index them by class: at most one of each kind.

    Raises:
        ConfigError: an item that is not a handler, or two handlers of the same class.
    """
    found: dict[type, KwargsHandler] = {}
    for i, handler in enumerate(handlers or ()):
        if not isinstance(handler, KwargsHandler):
            raise ConfigError(
                f"kwargs_handlers[{i}]",
                type(handler).__name__,
                "an instance of a KwargsHandler class (e.g. DistributedDataParallelKwargs)",
            )
        if type(handler) in found:
            raise ConfigError(
                f"kwargs_handlers[{i}]",
                type(handler).__name__,
                f"at most one {type(handler).__name__} in the list",
            )
        found[type(handler)] = handler
    return found
