"""The exception hierarchy, and what the user's traceback shows of the launcher.

Every error the package raises about a launch, its options, its workers or a checkpoint
derives from NotebookAccelError (ConfigError for bad input, before any process starts). A
rank's own exception is re-raised in the notebook as its own type, the rank's traceback as
its cause (RemoteTraceback). Built-in exceptions are raised on purpose where a caller
expects Python's or torch's own: AttributeError (a module's lazy names, a wrapper's missing
attribute), TypeError and RuntimeError (an Accelerator method called as torch's would refuse
it, an unpicklable return value, find_executable_batch_size), ValueError and RuntimeError
between the package's own processes (a malformed message, a store's reply, torch's own
re-rendezvous refusal), ValueError (AcceleratorState() before any Accelerator, as
accelerate's), NameError (a name a session's workers lack), NotImplementedError
(LocalSGD under a sharding strategy), TimeoutError (Job.result, a key that never came).

``UserFrames`` is how an entry point (notebook_launcher, a session's run, ...) raises what it
means with the user's frames only; ``show_notes_in_ipython`` has an IPython that prints no
exception notes (7.34, Colab's) show them, so the launcher's notes ("raised on rank 1 of 2")
reach the cell there too.
"""

from __future__ import annotations

import signal
from types import TracebackType
from typing import Any, Literal

__all__ = [
    "NotebookAccelError",
    "ConfigError",
    "PayloadError",
    "LaunchError",
    "WorkerError",
    "WorkerDiedError",
    "LaunchTimeoutError",
    "SessionClosedError",
    "CheckpointError",
    "SharedMemoryError",
    "RemoteTraceback",
    "UserFrames",
    "meant",
    "user_text",
]

# What a death by signal usually means, for the message a user reads in the cell.
_SIGNAL_HINTS: dict[int, str] = {
    signal.SIGKILL: "often the out-of-memory killer; check memory use or lower the batch size",
    signal.SIGSEGV: "a segmentation fault in native code (a C/C++ extension, CUDA or a driver)",
    signal.SIGABRT: "an abort in native code, often a failed C++ assertion or a NCCL error",
    signal.SIGBUS: "a bus error, often /dev/shm too small for DataLoader workers in a container",
    signal.SIGTERM: "terminated from outside the launcher",
    signal.SIGFPE: "a floating-point exception in native code",
    signal.SIGILL: "an illegal instruction: a binary built for another CPU",
}


def _signal_name(number: int) -> str:
    """``SIGKILL`` for 9; real-time signals, which ``signal.Signals`` lacks, as ``SIGRTMIN+2``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
        if low is not None and high is not None and low <= number <= high:
            return f"SIGRTMIN+{number - low}"
        return f"signal {number}"


class NotebookAccelError(Exception):
    """Base class of every error raised by notebook_accel."""

    # The subclasses take their own arguments (a parameter, a rank, a path) and pass a
    # message up, so the default pickling, ``cls(*self.args)``, cannot rebuild them. A worker's
    # error crosses to the notebook pickled, and must arrive as its own type.
    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[NotebookAccelError], args: tuple[Any, ...], state: dict[str, Any]
) -> NotebookAccelError:
    """An unpickled notebook_accel error: the same type, message and attributes, no __init__."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigError(NotebookAccelError, ValueError):
    """A parameter has a value that is not accepted.

    Attributes:
        parameter: the name of the parameter, as the user wrote it.
        value: the value given.
        accepted: a human-readable description of what is accepted.
    """

    def __init__(self, parameter: str, value: object, accepted: str, hint: str = "") -> None:
        self.parameter = parameter
        self.value = value
        self.accepted = accepted
        message = f"{parameter}={value!r} is not accepted; expected {accepted}."
        if hint:
            message += f" {hint}"
        super().__init__(message)


class PayloadError(NotebookAccelError, TypeError):
    """The function or its arguments cannot be sent to the workers.

    Attributes:
        culprit: where the unpicklable object sits, e.g. ``"variable 'lock' captured by train"``.
    """

    def __init__(self, message: str, culprit: str = "") -> None:
        self.culprit = culprit
        super().__init__(message)


class LaunchError(NotebookAccelError, RuntimeError):
    """The launch itself failed (processes could not start or rendezvous)."""


class WorkerError(NotebookAccelError, RuntimeError):
    """A worker raised an exception that could not be sent back as itself.

    Attributes:
        rank: the global rank of the failing worker.
        type_name: the qualified name of the original exception type.
    """

    def __init__(self, message: str, rank: int, type_name: str = "") -> None:
        self.rank = rank
        self.type_name = type_name
        super().__init__(message)


class WorkerDiedError(NotebookAccelError, RuntimeError):
    """A worker ended without a Python exception (os._exit, a signal, a crash in C code).

    Attributes:
        rank: the global rank of the worker.
        exitcode: its exit code; negative for a signal, as in ``multiprocessing``.
        signal_name: the signal's name (``"SIGKILL"``) or ``None``.
    """

    def __init__(self, rank: int, exitcode: int) -> None:
        self.rank = rank
        self.exitcode = exitcode
        self.signal_name: str | None = None
        if exitcode < 0:
            self.signal_name = _signal_name(-exitcode)
            hint = _SIGNAL_HINTS.get(-exitcode, "a signal sent to the worker")
            message = f"rank {rank} was killed by {self.signal_name} ({hint})."
        else:
            message = (
                f"rank {rank} exited with code {exitcode} without raising a Python exception "
                "(os._exit(), sys.exit() from C code, or a crash that skipped Python)."
            )
        super().__init__(message)


class LaunchTimeoutError(NotebookAccelError, TimeoutError):
    """The launch (or a session's run) ran longer than its ``timeout``.

    A launch's workers were stopped; a session's were interrupted (the message says which).
    """

    def __init__(
        self, timeout: float, what: str = "the launch", ending: str = "every worker was stopped"
    ) -> None:
        self.timeout = timeout
        super().__init__(
            f"{what} ran longer than timeout={timeout:g} s and {ending}; "
            "raise timeout= (or pass timeout=None) if the job needs longer."
        )


class SessionClosedError(LaunchError):
    """A session's workers are gone: closed, or torn down after a death or a stuck stop.

    Attributes:
        reason: why the session closed, as the user's call saw it.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"the session is closed ({reason}); its workers and their namespace are gone. "
            "w.restart() starts fresh workers (or create a new Workers)."
        )


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"


class SharedMemoryError(NotebookAccelError, MemoryError):
    """Not enough memory for the shared copy of large data sent to or from the workers.

    Attributes:
        what: what needed the memory (the captured data, a rank's return value).
        needed: bytes needed.
        available: bytes available when it was asked for.
    """

    def __init__(self, what: str, needed: int, available: int) -> None:
        self.what = what
        self.needed = needed
        self.available = available
        super().__init__(
            f"{what} needs {_gib(needed)} of shared memory, but only {_gib(available)} of "
            "memory is available. Free memory in the notebook (del what is no longer needed; "
            "notebook_accel.clear_shared_cache()), or load the data inside the function "
            "instead of capturing it."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # MemoryError's __new__ refuses to build a subclass outside __init__: rebuild by it.
        return (type(self), (self.what, self.needed, self.available), dict(self.__dict__))


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; set as ``__cause__`` of a re-raised error."""

    def __init__(self, traceback_text: str) -> None:
        self.traceback_text = traceback_text
        super().__init__(traceback_text)

    def __str__(self) -> str:
        return f'\n"""\n{self.traceback_text.rstrip()}\n"""'


class CheckpointError(NotebookAccelError, RuntimeError):
    """A checkpoint is missing, incomplete, or does not match what was prepared.

    Attributes:
        path: the file (or folder) at fault.
        detail: what is missing or what differs.
    """

    def __init__(self, path: object, detail: str) -> None:
        self.path = str(path)
        self.detail = detail
        super().__init__(f"checkpoint {self.path}: {detail}")


class NotProvidedError(NotebookAccelError, NotImplementedError):
    """An accelerate name that notebook_accel keeps importable but does not provide was used
    (refusals.py lists each with its reason).

    Attributes:
        name: where the user reached it, e.g. ``"notebook_accel.utils.MegatronLMPlugin"``.
        reason: why it is not provided.
        instead: what to use instead.
    """

    def __init__(self, name: str, reason: str, instead: str) -> None:
        self.name = name
        self.reason = reason
        self.instead = instead
        super().__init__(f"{name} is not provided by notebook_accel: {reason}. Use {instead}.")


def meant(exc: BaseException, kinds: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether the launcher raises ``exc`` on purpose: a rank's own exception (its traceback
    the cause), one of the package's errors, the stop button's KeyboardInterrupt, ``kinds``."""
    ours: tuple[type[BaseException], ...] = (NotebookAccelError, KeyboardInterrupt, *kinds)
    return isinstance(exc, ours) or isinstance(exc.__cause__, RemoteTraceback)


class UserFrames:
    """Around an entry point's body: what it means to raise leaves with the user's frames only.

    A ``meant`` exception loses the frames inside the block (the launcher's insides) and the
    entry's own: a notebook cell shows the rank's traceback, then the user's cell; a script's
    traceback ends at the user's call. Anything else (a bug of ours) keeps every frame.

    Why no frame at all rather than ``__tracebackhide__``: IPython (7.34 as on Colab, and 8,
    9) hides the frames that set it except the last one, the frame that raised, which would
    be ours. How: ``__exit__`` drops the traceback and lets the exception go on; the re-raise
    that ends a ``with`` statement adds no frame (CPython keeps the traceback on the
    exception), so the traceback starts again in the caller's frame.

    Example:
        >>> with UserFrames():  # doctest: +SKIP
        ...     return launch(function, args, kwargs, config)
    """

    def __init__(self, *kinds: type[BaseException]) -> None:
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if exc is not None and meant(exc, self.kinds):
            exc.__traceback__ = None
        return False


def user_text(exc: BaseException) -> str:
    """The traceback a user reads of ``exc`` where none is drawn for them (the launch panel):
    a meant error's lines alone (its notes too), else the whole traceback."""
    import traceback

    if meant(exc):
        return "".join(traceback.format_exception_only(exc))
    return "".join(traceback.format_exception(exc))


_PROBE = "notebook_accel: does this traceback show notes?"


def show_notes_in_ipython() -> None:
    """Have the running IPython show an exception's notes (PEP 678), where it does not.

    What an error means for the launch or the session is a note ("raised on rank 1 of 2",
    "the session is still usable"). IPython 8 and later print the notes under the exception;
    IPython 7.34 (Colab's) drops them. There, the shell's traceback formatter gets them
    appended, as later versions place them. Once per shell; nothing outside IPython.
    """
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    formatter = getattr(shell, "InteractiveTB", None)
    if formatter is None or getattr(formatter, "_notebook_accel_notes", False):
        return
    formatter._notebook_accel_notes = True
    probe = ValueError("probe")
    probe.add_note(_PROBE)
    try:
        shown = formatter.structured_traceback(ValueError, probe, None)
    except Exception:
        return
    if any(_PROBE in line for line in shown):
        return
    formatter.structured_traceback = _with_notes(formatter.structured_traceback)


def _with_notes(structured_traceback: Any) -> Any:
    def with_notes(etype: Any, evalue: Any, *args: Any, **kwargs: Any) -> list[str]:
        lines = list(structured_traceback(etype, evalue, *args, **kwargs))
        notes = getattr(evalue, "__notes__", None)
        if isinstance(notes, list):
            lines.extend(str(note) for note in notes)
        return lines

    return with_notes
