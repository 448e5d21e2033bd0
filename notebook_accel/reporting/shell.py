"""A rank's IPython display machinery: what it displays travels to the cell that launched it.

    worker (rank r), a launch from a notebook            parent (the notebook's kernel)
    -----------------------------------------            ------------------------------
    install(): get_ipython() is this module's shell
    display(obj) / display(obj, display_id=...)
      -> the shell's DisplayFormatter: mimebundle
      -> RankPublisher.publish             Displayed(data, id)  --> launch/show/rich.py:
    handle.update(obj) / update_display   Displayed(update)     -->   display_data,
    clear_output(wait=...)                Displayed(clear)      -->   update_display_data,
    a %%distributed cell's last value     (sys.displayhook)           a rank's area cleared
    plt.show(); figures left at the end   (post_execute, matplotlib_inline's flush)
    tqdm.auto / tqdm.notebook bars        Progress (reporting/progress.py) --> notebook bars
    an ipywidget                          one line on the rank's stderr: refused

A forked worker has nothing of the kernel's shell (launch/local/forkserver.py clears it: its
display publisher writes to the kernel's sockets, which a fork must not use; the zygote first
prepares this module's shell from it, keeping its formatters), and a fresh interpreter never
had one. Libraries decide at import or at use whether they run in a notebook
from ``get_ipython()`` (tqdm.auto, transformers' Trainer, datasets, rich: the shell's class
name and its ``config`` holding ``IPKernelApp``), then call ``IPython.display``; with this shell
they take their notebook paths, and what they display reaches the cell as real display
messages, in order with the rank's lines (the message carries the output marks).

Installed by the worker's start when the launch comes from a Jupyter kernel (the payload says
so); elsewhere (a script) a rank's ``display`` prints its text as it always did.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import functools
import inspect
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import env

if TYPE_CHECKING:
    from .channel import Sender

__all__ = ["cell", "install", "prepare"]

_WIDGET = "application/vnd.jupyter.widget-view+json"
# Modules whose displays are a progress bar (transformers' Trainer table: NotebookProgressCallback
# draws on every rank, its text ProgressCallback on the main process only): shown from rank 0
# only, as a rank's tqdm bars are.
_PROGRESS_MODULES = ("transformers.utils.notebook",)
_REFUSED = (
    "[notebook_accel] an ipywidget ({name}) cannot be drawn from a rank: its state lives in "
    "this process, not in the notebook's kernel. display() HTML, images or plots instead "
    "(tqdm bars are drawn for you)."
)

_shell: Any = None  # this process's shell, once installed
# Where its displays go (install): the sender to the parent, the rank.
_target: dict[str, Any] = {}
# Made in a forked zygote before it cleared the kernel's shell (prepare()): a rank's shell,
# ready but not installed (~15 ms each worker would spend), reusing the kernel shell's display
# formatter (a notebook's registered formatters, matplotlib's figure formats) and config
# (InlineBackend's settings).
_prepared: dict[str, Any] = {}


def prepare() -> None:
    """In a fork of a kernel, before its shell is cleared: a rank's shell made from it, for
    every worker forked from here to install."""
    if "IPython" not in sys.modules:
        return
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        kernel_shell = InteractiveShell.instance()
        formatter = getattr(kernel_shell, "display_formatter", None)
        _prepared["shell"] = _shell_class()(kernel_shell.config, formatter)


def install(sender: Sender) -> None:
    """Make IPython's display machinery this rank's: displays go to the parent through
    ``sender``; library bars report as ours do (reporting/progress.py)."""
    global _shell
    if _shell is not None:
        return
    from . import progress

    _target.update(sender=sender, rank=env.read_distributed().rank)
    _shell = _shell_class().instance()  # the prepared one where there is one
    import IPython.display

    builtins.get_ipython = _shell.get_ipython  # type: ignore[attr-defined]
    builtins.display = IPython.display.display  # type: ignore[attr-defined]
    builtins.__IPYTHON__ = True  # type: ignore[attr-defined]
    sys.displayhook = _shell.show_value
    _inline_figures(_shell)
    progress.adopt_library_bars()


@contextlib.contextmanager
def cell() -> Iterator[None]:
    """Around a rank's function (a launch's, a session's task): IPython's pre_execute and
    post_execute events, as around a cell (matplotlib_inline shows the figures left open)."""
    shell = _shell
    if shell is None:
        yield
        return
    shell.events.trigger("pre_execute")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # a figure that fails to draw: not the rank's end
            shell.events.trigger("post_execute")


@functools.cache
def _shell_class() -> Any:
    """The shell's class: an InteractiveShell (IPython.display asks for one) built light,
    without the history, magics or prompts a kernel's has; its publisher sends to the parent.
    (Made once: a zygote's prepared shell and its workers' share it.)"""
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.events import EventManager, available_events
    from IPython.core.formatters import DisplayFormatter
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config, SingletonConfigurable

    class RankPublisher(DisplayPublisher):
        """IPython's display publisher whose messages go to the parent."""

        def publish(
            self,
            data: dict[str, Any],
            metadata: dict[str, Any] | None = None,
            source: Any = None,
            *,
            transient: dict[str, Any] | None = None,
            update: bool = False,
            **kwargs: Any,
        ) -> None:
            _publish(data, metadata, transient, update)

        def clear_output(self, wait: bool = False) -> None:
            from .channel import Displayed

            _target["sender"].send(Displayed(clear=True, wait=bool(wait)))

    # rich tells a notebook by this class name (rich.console._is_jupyter)
    class ZMQInteractiveShell(InteractiveShell):
        """A rank's shell: display, display handles, clear_output, formatters and events."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            ready = _prepared.get("shell")  # instance() takes the prepared one
            return ready if type(ready) is cls else super().__new__(cls, *args, **kwargs)

        def __init__(self, config: Any = None, formatter: Any = None) -> None:
            if getattr(self, "display_pub", None) is not None:
                return  # prepared
            if config is None:
                config = Config()
                # what tqdm, transformers and datasets read to tell a kernel from a terminal
                config.IPKernelApp = Config()
            SingletonConfigurable.__init__(self, config=config)
            self.events = EventManager(self, available_events)
            self.configurables: list[Any] = []
            self.user_ns: dict[str, Any] = {}
            self.kernel = None
            self.display_formatter = formatter or DisplayFormatter(parent=self)
            self.display_pub = RankPublisher(shell=self, parent=self)

        def get_ipython(self) -> Any:
            return self

        def show_value(self, value: Any) -> None:
            """sys.displayhook: a value with a rich form is displayed, else printed."""
            if value is None:
                return
            builtins._ = value  # type: ignore[attr-defined]
            formatter: Any = self.display_formatter
            data, metadata = formatter.format(value)
            if set(data) - {"text/plain"}:
                self.display_pub.publish(data, metadata)
            elif data:
                print(data["text/plain"])

    return ZMQInteractiveShell


def _publish(
    data: dict[str, Any],
    metadata: dict[str, Any] | None,
    transient: dict[str, Any] | None,
    update: bool,
) -> None:
    from .channel import Displayed

    if _WIDGET in data:
        _refuse(data)
        return
    if _target["rank"] != 0 and _from_progress_module():
        return
    display_id = (transient or {}).get("display_id")
    _target["sender"].send(
        Displayed(
            data=json.dumps(data, default=_plain),
            metadata=json.dumps(metadata or {}, default=_plain),
            display_id=None if display_id is None else str(display_id),
            update=bool(update),
        )
    )


_refused: set[str] = set()


def _refuse(data: dict[str, Any]) -> None:
    """One line per kind of widget, on the rank's stderr (the cell shows it as the rank's)."""
    name = str(data.get("text/plain", "widget")).split("(", 1)[0].strip() or "widget"
    if name not in _refused:
        _refused.add(name)
        print(_REFUSED.format(name=name), file=sys.stderr)


def _from_progress_module() -> bool:
    """Whether a library's progress machinery (``_PROGRESS_MODULES``) made this display."""
    frame = inspect.currentframe()
    for _ in range(40):  # the display call is a few frames up; a library's loop not far
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith(_PROGRESS_MODULES):
            return True
        frame = frame.f_back
    return False


def _plain(value: Any) -> Any:
    """JSON for what a formatter may return besides JSON's types: binary data base64-encoded
    (as a kernel sends an image), arrays as lists, the rest as text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    return str(value)


def _inline_figures(shell: Any) -> None:
    """matplotlib_inline as the kernel has it: figures left open are shown when the function
    ends (its flush on post_execute). Where the backend module was imported in the kernel
    (a fork), its import-time set-up ran for the kernel's shell, not this one."""
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    matplotlib = sys.modules.get("matplotlib")
    if inline is None or matplotlib is None:
        return  # imported later in the rank: its own set-up finds this shell
    with contextlib.suppress(Exception):
        backend = str(matplotlib.get_backend())
        if backend in ("inline", "module://matplotlib_inline.backend_inline"):
            shell.events.register("post_execute", inline.flush_figures)
