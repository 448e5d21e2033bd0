"""get_logger (accelerate's ``accelerate.logging.get_logger``): one logger, many processes.

    logger.info(msg)                          rank 0 only           "[RANK 0] msg"
    logger.info(msg, main_process_only=False) every rank
    logger.info(msg, in_order=True)           every rank, rank 0 first, a barrier after each

Reached as ``notebook_accel.logging.get_logger`` (the ported import's path). The rank comes
from the job (a ``PartialState`` per call: the process group is joined or reused, nothing
global is kept), so the logger may be made at import time, before any Accelerator.

accelerate 1.16's verbosity functions (``get_verbosity``, ``set_verbosity``,
``set_verbosity_info``...) set the level of the library's own logger, as accelerate's set its
``"accelerate"`` logger's: here ``"notebook_accel"``, whose children inherit it; a logger given
a level of its own (``get_logger(name, log_level=...)``, ``ACCELERATE_LOG_LEVEL``), the root
logger and the user's loggers keep theirs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import MutableMapping
from typing import Any

from .. import env
from .processes import PartialState

__all__ = [
    "MultiProcessAdapter",
    "get_logger",
    "get_verbosity",
    "set_verbosity",
    "set_verbosity_debug",
    "set_verbosity_error",
    "set_verbosity_info",
    "set_verbosity_warning",
]

_LIBRARY = "notebook_accel"  # the library's logger: accelerate's is "accelerate"


def get_verbosity() -> int:
    """The effective level of the library's logger (``logging.WARNING``...).

    Example:
        >>> set_verbosity("error")
        >>> get_verbosity() == logging.ERROR
        True
    """
    return logging.getLogger(_LIBRARY).getEffectiveLevel()


def set_verbosity(verbosity: int | str) -> None:
    """Set the level of the library's logger: a ``logging`` level or its name, any case."""
    logging.getLogger(_LIBRARY).setLevel(
        verbosity.upper() if isinstance(verbosity, str) else verbosity
    )


def set_verbosity_debug() -> None:
    """The library logs ``DEBUG`` and above."""
    set_verbosity(logging.DEBUG)


def set_verbosity_info() -> None:
    """The library logs ``INFO`` and above."""
    set_verbosity(logging.INFO)


def set_verbosity_warning() -> None:
    """The library logs ``WARNING`` and above."""
    set_verbosity(logging.WARNING)


def set_verbosity_error() -> None:
    """The library logs ``ERROR`` and above."""
    set_verbosity(logging.ERROR)


class MultiProcessAdapter(logging.LoggerAdapter):
    """A ``LoggerAdapter`` whose calls take ``main_process_only=`` (default True) and
    ``in_order=`` (default False; when True, ``main_process_only`` is ignored and every rank
    logs in turn). Messages are prefixed ``[RANK i]``, as accelerate's are.

    Example:
        >>> logger = get_logger(__name__)
        >>> logger.info("every rank", main_process_only=False)  # doctest: +SKIP
    """

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        msg, kwargs = super().process(msg, kwargs)
        kwargs.setdefault("stacklevel", 2)  # the caller's line, not this adapter's
        return f"[RANK {PartialState().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log on the main process (``main_process_only=True``), every process, or each in
        turn (``in_order=True``)."""
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, options = self.process(msg, kwargs)
        state = PartialState()
        if in_order:
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    self.logger.log(level, msg, *args, **options)
                state.wait_for_everyone()
        elif not main_process_only or state.is_main_process:
            self.logger.log(level, msg, *args, **options)

    @functools.lru_cache(None)  # noqa: B019 - accelerate's: one warning per distinct call
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning()``, but the same arguments warn once only."""
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for ``name`` that logs on the main process unless told otherwise.

    Args:
        name: the logger's name, such as ``__name__``.
        log_level: e.g. ``"INFO"``, set on this logger and on the root logger; ``None``
            takes ``ACCELERATE_LOG_LEVEL`` from the environment, else leaves the levels.

    Example:
        >>> logger = get_logger(__name__, log_level="INFO")
        >>> logger.info("rank 0 says", main_process_only=True)  # doctest: +SKIP
    """
    if log_level is None:
        log_level = env.accelerate_log_level()
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
