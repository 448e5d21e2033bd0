"""A background job's display: its lines, bars and chart stay in the cell that submitted it.

    submit (in the submitting cell)            the job's thread, later (any cell running)
    -------------------------------            ------------------------------------------
    display(..., display_id=True) x 4  ---->   handle.update(...)   (update_display_data)
      lines: text, rank-prefixed                 every line, at most 5 updates a second
      bars:  tqdm's meters as text               each bar's latest state
      chart: the live chart's PNG                redrawn as in a launch (charts.Live)
      displays: what the ranks display           every rank's displays, updates and clears
                                                   (show/rich.py), rewritten whole, at most
                                                   5 times a second

A stream message sent while another cell runs would land in that cell (the kernel stamps it
with the running request), and one stamped with the submitting cell's request once that cell
has finished is dropped by JupyterLab and nbclient. An update of a display that the
submitting cell created is routed by its display id instead: JupyterLab and nbclient both
replace that output where it is, in the submitting cell, and the saved notebook keeps it.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

from ...reporting.channel import Progress
from . import charts, rich
from .display import Bar, Display, Sink, meter

__all__ = ["CellDisplay"]

_EVERY = 0.2  # seconds between two updates of the lines or the bars
_SHOWN_LINES = 500  # the cell shows the latest lines; Job.output has them all


def _handle(data: dict[str, Any]) -> _Handle:
    return _Handle(data)


class _Handle:
    """A display made in the submitting cell, updated from the job's thread.

    The kernel stamps an update with its display publisher's parent (the request it answers).
    ipykernel 6 and 7.1+ give a thread of ours the latest cell's: the update still replaces
    the output by its display id, in the submitting cell (JupyterLab, the classic page, and
    nbclient, which reads only the running cell's messages). ipykernel 7.0 keeps the parent
    per thread and gives ours none (the update raised LookupError): there the thread takes
    the latest cell's too, as recorded when each cell starts (IPython's pre_execute event).
    """

    def __init__(self, data: dict[str, Any]) -> None:
        from IPython.display import display

        _record_cells()
        self._handle = display(data, raw=True, display_id=True)
        self._parent = _parent(_publisher())

    def update(self, data: dict[str, Any], raw: bool = True) -> None:
        publisher = _publisher()
        if publisher is not None:
            if getattr(_bare, "value", None) is None:  # before this thread set one of its own
                _bare.value = not _parent(publisher)
            if _bare.value:
                publisher.set_parent(_latest.get("parent") or self._parent)  # this thread's
        self._handle.update(data, raw=raw)


_bare = threading.local()  # .value: the kernel gave this thread no parent (ipykernel 7.0)
_latest: dict[str, Any] = {}  # "parent": the request of the cell that started last


def _record_cells() -> None:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or _latest.get("shell") is shell:
        return
    _latest["shell"] = shell

    def started() -> None:
        parent = _parent(getattr(shell, "display_pub", None))
        if parent:
            _latest["parent"] = parent

    shell.events.register("pre_execute", started)
    started()


def _publisher() -> Any:
    from IPython import get_ipython

    return getattr(get_ipython(), "display_pub", None)


def _parent(publisher: Any) -> dict[str, Any] | None:
    try:
        return dict(publisher.parent_header)
    except (AttributeError, LookupError, TypeError):
        return None


class CellDisplay(Display):
    """The launcher's display, drawn through display handles made in the submitting cell.

    Create it in the submitting cell (the handles' outputs are placed there); feed it from any
    thread afterwards.

    Args:
        output: whose lines to show, as for a launch (``"all"``, ``"main"``, ``"none"``).
    """

    def __init__(self, output: str = "all") -> None:
        super().__init__(output=output)
        self.lines: list[str] = []
        self._meters: dict[tuple[int, int], str] = {}  # (rank, bar) -> its latest meter
        self._lock = threading.Lock()
        self._due: dict[str, float] = {"lines": 0.0, "bars": 0.0, "displays": 0.0}
        self._dirty = {"lines": False, "bars": False, "displays": False}
        self._lines_handle = _handle({"text/plain": ""})
        self._bars_handle = _handle({"text/plain": ""})
        self._chart_handle = _handle({"text/plain": ""})
        self._displays_handle = _handle({"text/plain": ""})  # made now: the cell ends soon
        self.stdout = self.stderr = Sink(self.add, self.refresh)  # type: ignore[assignment]

    # -- what the job said ----------------------------------------------------------------
    def add(self, text: str) -> None:
        with self._lock:
            self.lines.extend(text.splitlines())
            self._dirty["lines"] = True

    def banner(self, text: str) -> None:
        if self.output != "none":
            self.add(text)
            self.refresh(force=True)

    def open_bar(self, rank: int, prefix: str, message: Progress, options: dict[str, Any]) -> Bar:
        return _TextBar(self, (rank, message.bar), prefix)

    def set_bar(self, bar: tuple[int, int], meter: str) -> None:
        with self._lock:
            self._meters[bar] = meter
            self._dirty["bars"] = True
        self.refresh()

    def draw_displays(self, changed: list[tuple[rich.Slot, bool]]) -> None:
        """What the ranks display goes into the display made at submit (a finished cell takes
        updates of the displays it has, never new ones)."""
        if changed:
            with self._lock:
                self._dirty["displays"] = True
            self.refresh()

    def open_chart(self) -> charts.ChartView:
        if charts.charts_available():
            return _HandleChart(self._chart_handle)
        return charts.TextLine(self.stdout)

    # -- drawing ----------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Update the outputs that changed, at most every ``_EVERY`` s unless ``force``."""
        now = time.monotonic()
        handles = {
            "lines": self._lines_handle,
            "bars": self._bars_handle,
            "displays": self._displays_handle,
        }
        for what, handle in handles.items():
            with self._lock:
                if not self._dirty[what] or (now < self._due[what] and not force):
                    continue
                self._dirty[what] = False
                self._due[what] = now + _EVERY
                data = self._bundle(what)
            handle.update(data, raw=True)

    def _bundle(self, what: str) -> dict[str, Any]:
        if what == "lines":
            return {"text/plain": self._text()}
        if what == "bars":
            return {"text/plain": "\n".join(self._meters.values())}
        areas = self.areas
        return {"text/plain": ""} if areas is None else rich.merged(areas, self.output == "all")

    def _text(self) -> str:
        hidden = len(self.lines) - _SHOWN_LINES
        shown = self.lines[-_SHOWN_LINES:]
        if hidden > 0:
            shown = [f"({hidden} earlier lines: job.output has them all)", *shown]
        return "\n".join(shown)

    def tick(self) -> None:
        super().tick()  # rows the chart's interval held back
        self.refresh()

    def close(self) -> None:
        super().close()
        self.refresh(force=True)

    def finish(self, text: str) -> None:
        """The job's last line (how it ended), shown at once."""
        self.add(text)
        self.refresh(force=True)

    @property
    def output_text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)


class _TextBar:
    """A worker's bar as tqdm's text meter, one line of the bars' output."""

    def __init__(self, display: CellDisplay, key: tuple[int, int], prefix: str) -> None:
        self.display = display
        self.key = key
        self.prefix = prefix
        self.started = time.monotonic()

    def show(self, message: Progress, postfix: str) -> None:
        self.display.set_bar(self.key, meter(self.prefix, message, self.started, postfix, 100))

    def close(self) -> None:
        """The meter stays, showing the bar's last state."""


class _HandleChart:
    """The live chart as the image of a display handle made in the submitting cell.

    Drawing holds the kernel's GIL for tens of milliseconds (matplotlib): while a job runs in
    the background, the cells the user runs meanwhile share it, so the chart is redrawn half
    as often as a launch's (benchmarks/session_latency.py measures those cells).
    """

    interval = 1.0

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._renderer = charts.Renderer()

    def draw(self, board: charts.Board, final: bool) -> None:
        if board.series:
            png = base64.b64encode(self._renderer.png(board)).decode("ascii")
            self._handle.update({"image/png": png, "text/plain": board.line()}, raw=True)

    def move_down(self) -> bool:
        return False  # the chart has its own place, under the bars
