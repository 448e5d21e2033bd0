"""tqdm's notebook bar, made to report instead of drawing ipywidgets (a rank's side).

Relies on ``tqdm.notebook.tqdm_notebook`` (tqdm 4.40 to 4.70) drawing through two methods:
``status_printer`` (a static method building the widgets; the bar keeps what it returns as
``container`` and reads ``container.children`` (label, bar, text) in ``display``, ``reset`` and
its ``colour`` property) and ``display(msg, pos, close, bar_style, check_delay)`` (each redraw;
``bar_style`` "success"/"danger" or ``close`` at its end). A class of another shape is left as
it is (``report_notebook_bars`` says False).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["report_notebook_bars"]


class _Inert:
    """Stands for the widgets: takes any attribute, has every public one, closes. (No private
    ones: IPython's display asks for a name no object has, to skip those that claim all.)"""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Inert()

    def __setattr__(self, name: str, value: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Container(_Inert):
    """What ``status_printer`` returns: three children, and nothing for IPython to display."""

    @property
    def children(self) -> tuple[_Inert, _Inert, _Inert]:
        return (_Inert(), _Inert(), _Inert())

    def _ipython_display_(self) -> None:
        pass


def report_notebook_bars(report: Callable[[Any, bool], None]) -> bool:
    """Make every ``tqdm.notebook`` bar of this process (its subclasses too, made before or
    after) call ``report(bar, closed)`` where it would redraw its widgets. Whether it did."""
    try:
        notebook = importlib.import_module("tqdm.notebook")
    except Exception:  # no IPython here, or a tqdm without it: nothing to report
        return False
    cls = getattr(notebook, "tqdm_notebook", None)
    if cls is None or not callable(getattr(cls, "display", None)):
        return False
    if not isinstance(cls.__dict__.get("status_printer"), staticmethod):
        return False

    def status_printer(*_: Any, **__: Any) -> _Container:
        return _Container()

    def display(
        self: Any,
        msg: str | None = None,
        pos: int | None = None,
        close: bool = False,
        bar_style: str | None = None,
        check_delay: bool = True,
    ) -> None:
        report(self, bool(close) or bar_style in ("success", "danger"))

    cls.status_printer = staticmethod(status_printer)
    cls.display = display
    return True
