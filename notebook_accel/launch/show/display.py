"""The parent's side of the channel: rank-prefixed whole lines, progress bars, the banner,
what ranks display (show/rich.py).

Output arrives as raw bytes from each worker's stdout/stderr pipe. Bytes are buffered per
(rank, stream) and written out one whole line at a time, so ranks never interleave mid-line.
A carriage return (a text progress bar redrawing itself) keeps only the latest state of the
line. Lines go to the parent's ``sys.stdout``/``sys.stderr`` as they are when the launch
starts: in Jupyter that is the running cell, in a terminal the terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from ...reporting.channel import Displayed, Health, Metrics, Progress, Where
from . import charts, rich
from .stall import Ranks, StallWatch

__all__ = ["Display", "Bar", "Sink", "TqdmBar", "meter"]

_MAX_LINE = 1 << 16  # a line longer than this is written in pieces


class Display:
    """Writes what the workers say into the notebook cell (or terminal).

    Args:
        output: ``"all"`` ranks' lines, only the ``"main"`` (rank 0) process's, or ``"none"``.
        bars: which ranks' progress bars to draw: ``"all"`` that the workers send (rank 0's,
            and every rank's for ``tqdm(..., all_ranks=True)``), ``"main"`` (rank 0's only)
            or ``"none"``.
    """

    def __init__(self, output: str = "all", bars: str = "all") -> None:
        self.output = output
        self.bars_mode = bars
        self.stdout: TextIO = sys.stdout
        self.stderr: TextIO = sys.stderr
        self._pending: dict[tuple[int, str], bytes] = {}
        self._bars: dict[tuple[int, int], Bar] = {}
        self._labels: dict[int, tuple[str, bool]] = {}
        self._live: charts.Live | None = None
        self._areas: rich.Areas | None = None
        self._cell_outputs: rich.CellOutputs | None = None
        # The stall report (stall.py): told of every sign of progress, ticked while waiting.
        self.stalls: StallWatch | None = None
        self._steps: dict[int, int | None] = {}
        charts.start_launch()

    # -- lines ------------------------------------------------------------------------------
    def banner(self, text: str) -> None:
        if self.output == "none":  # "none" means nothing in the cell, the banner included
            return
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def name_source(self, source: int, label: str, includes_main: bool) -> None:
        """Name an output source that is not one rank, e.g. ``"ranks 0-1"``.

        One torch_xla process can hold several devices; what its C code writes cannot be told
        apart by device, so it is fed under ``source`` (not a rank number) with this label.
        """
        self._labels[source] = (label, includes_main)

    def _shows(self, rank: int) -> bool:
        if rank in self._labels:
            return self.output == "all" or (self.output == "main" and self._labels[rank][1])
        return self.output == "all" or (self.output == "main" and rank == 0)

    def _write(self, rank: int, stream: str, raw: bytes) -> None:
        if not self._shows(rank):
            return
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if "\r" in text:
            text = text.rsplit("\r", 1)[1]
        target = self.stdout if stream == "stdout" else self.stderr
        label = self._labels[rank][0] if rank in self._labels else f"rank {rank}"
        target.write(f"[{label}] {text}\n")

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        """Take bytes from a worker's stream; write out every completed line."""
        if self.stalls is not None:
            self.stalls.progress()  # output, shown or not, is progress
        key = (rank, stream)
        buffer = self._pending.get(key, b"") + data
        *lines, rest = buffer.split(b"\n")
        while len(rest) > _MAX_LINE:
            lines.append(rest[:_MAX_LINE])
            rest = rest[_MAX_LINE:]
        for line in lines:
            self._write(rank, stream, line)
        self._pending[key] = rest
        if lines:
            (self.stdout if stream == "stdout" else self.stderr).flush()

    def rank_state(self, rank: int, state: str) -> None:
        """A rank is "running", "finished", "failed" or "stopped"; the panel shows it live."""

    def end(self, rank: int, stream: str) -> None:
        """The stream closed: write what is left of its last line."""
        rest = self._pending.pop((rank, stream), b"")
        if rest:
            self._write(rank, stream, rest)
            (self.stdout if stream == "stdout" else self.stderr).flush()

    def report(self, rank: int, message: object) -> None:
        """What a rank reported besides its lines and its ending, shown where it belongs:
        every backend hands its ranks' messages here (the local engine, Ray's driver)."""
        stalls = self.stalls
        if isinstance(message, Progress):
            self.progress(rank, message)
        elif isinstance(message, Displayed):
            self.displayed(rank, message)
        elif isinstance(message, Metrics):
            self.metrics(rank, message)
        elif isinstance(message, Health):
            if stalls is not None and self._steps.setdefault(rank, message.steps) != message.steps:
                self._steps[rank] = message.steps
                stalls.progress()  # a step taken
            self.health(rank, message)
            return
        elif isinstance(message, Where):
            if stalls is not None:
                stalls.answer(rank, message)
            return
        if stalls is not None:
            stalls.progress()

    # -- the stall report (stall.py) ---------------------------------------------------------
    def watch_stalls(self, stall_time: float | None, ranks: Ranks | None) -> StallWatch | None:
        """Report a stall of ``stall_time`` s (None: none by itself; the watch still looks
        when asked) of the ranks ``ranks`` reach (None: no watch, e.g. after a launch)."""
        self.stalls = None if ranks is None else StallWatch(stall_time, ranks, self.stall_report)
        return self.stalls

    def stall_report(self, text: str) -> None:
        """Where every rank is: shown whatever ``output`` says (it is the launcher's own word
        on a launch that may never end, as an error is)."""
        self.stdout.write(text + "\n")
        self.stdout.flush()

    # -- progress bars ----------------------------------------------------------------------
    # Workers send Progress messages (throttled to ~10/s by reporting/progress.py); the bars
    # are drawn here, in the parent, where tqdm.auto can make them notebook widgets.
    def progress(self, rank: int, message: Progress) -> None:
        """Draw (create, advance, close) the bar a worker's ``Progress`` message describes."""
        options = dict(message.options)
        if self.bars_mode == "none" or (self.bars_mode == "main" and rank != 0):
            return
        key = (rank, message.bar)
        bar = self._bars.get(key)
        if bar is None:
            if message.closed and message.n == 0:
                return
            prefix = f"[rank {rank}] " if rank != 0 or options.get("all_ranks") else ""
            bar = self.open_bar(rank, prefix, message, options)
            self._bars[key] = bar
            if self._live is not None:
                self._live.below_new_bar()
        bar.show(message, options.get("postfix", ""))
        if message.closed:
            bar.close()
            del self._bars[key]

    def open_bar(self, rank: int, prefix: str, message: Progress, options: dict[str, Any]) -> Bar:
        """A new bar for one worker's bar; a panel overrides this to draw its own."""
        return TqdmBar(prefix, message, options, self.stderr)

    def close(self) -> None:
        """End of the launch: close every bar still open (a worker stopped mid-loop); a rank's
        clear_output(wait=True) with no display after it clears now."""
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()
        if self._live is not None:
            self._live.end()
        if self._areas is not None:
            self.draw_displays(self._areas.finish())

    # -- what ranks display (show/rich.py) ---------------------------------------------------
    def displayed(self, rank: int, message: Displayed) -> None:
        """A rank's display, update_display or clear_output (its own displays only)."""
        if not self._shows(rank):
            return
        if self._areas is None:
            self._areas = rich.Areas()
        self.draw_displays(self._areas.apply(rank, message))

    @property
    def areas(self) -> rich.Areas | None:
        """What each rank displays now (None before any display)."""
        return self._areas

    def draw_displays(self, changed: list[tuple[rich.Slot, bool]]) -> None:
        """Draw the slots that changed (each with whether it is new): in a notebook as the
        running cell's outputs, elsewhere the text of each display, as IPython prints it.

        A display that draws rank areas elsewhere (a background job, the panel) overrides it.
        """
        if charts.in_notebook():
            if self._cell_outputs is None:
                self._cell_outputs = rich.CellOutputs(marked=self.output == "all")
            for slot, new in changed:
                self._cell_outputs.draw(slot, new)
            return
        for slot, _ in changed:
            if slot.data is not None:
                for line in str(slot.data.get("text/plain", "")).splitlines():
                    self._write(slot.rank, "stdout", line.encode())
                self.stdout.flush()

    # -- live metrics and rank health (charts.py) --------------------------------------------
    def metrics(self, rank: int, message: Metrics) -> None:
        """Rows from ``Accelerator.log``: kept for ``last_metrics()``, drawn as the chart."""
        if self._live is None:
            self._live = charts.Live(self.open_chart())
        self._live.add(message.rows)

    @property
    def metric_rows(self) -> list[dict[str, float]]:
        """The rows logged so far in this launch."""
        return [] if self._live is None else self._live.board.rows

    def open_chart(self) -> charts.ChartView:
        """The chart's view: an image in a notebook cell, a text line in a terminal.

        A panel overrides this to draw into its own widget.
        """
        if charts.in_notebook() and charts.charts_available():
            return charts.CellChart()
        return charts.TextLine(self.stdout)

    def health(self, rank: int, message: Health) -> None:
        """A rank's memory and step count (about once a second); the panel shows them."""

    def tick(self) -> None:
        """Called by the engine while it waits: rows the chart's interval held back are drawn
        (the panel also flags ranks gone quiet); a stall is looked for."""
        if self._live is not None:
            self._live.catch_up()
        if self.stalls is not None:
            self.stalls.tick()


class Sink:
    """A text stream for a display that draws its lines elsewhere (a panel, a cell's handle).

    ``take`` gets the whole lines the display writes; ``flush`` is called after them.
    """

    def __init__(self, take: Callable[[str], None], flush: Callable[[], None]) -> None:
        self._take = take
        self.flush = flush

    def write(self, text: str) -> int:
        self._take(text)
        return len(text)


def meter(prefix: str, message: Progress, started: float, postfix: str, ncols: int = 0) -> str:
    """tqdm's text meter of a worker's bar (``started``: when the bar appeared, monotonic)."""
    from tqdm import tqdm

    return str(
        tqdm.format_meter(
            message.n,
            message.total,
            time.monotonic() - started,
            prefix=prefix + message.desc,
            unit=message.unit,
            postfix=postfix or None,
            ncols=ncols,
        )
    )


class Bar(Protocol):
    """What the display needs from a drawn bar."""

    def show(self, message: Progress, postfix: str) -> None: ...

    def close(self) -> None: ...


class TqdmBar:
    """A ``tqdm.auto`` bar in the parent: a notebook widget in Jupyter, text in a terminal."""

    _CONSTRUCTOR = ("leave", "unit_scale", "unit_divisor", "bar_format", "colour", "ascii")

    def __init__(
        self, prefix: str, message: Progress, options: dict[str, Any], file: TextIO
    ) -> None:
        from tqdm.auto import tqdm

        extra = {k: options[k] for k in self._CONSTRUCTOR if k in options}
        self.label = message.desc
        self._prefix = prefix
        self.bar = tqdm(
            total=message.total,
            desc=prefix + message.desc,
            unit=message.unit,
            file=file,
            dynamic_ncols=True,
            initial=message.n,
            **extra,
        )

    def show(self, message: Progress, postfix: str) -> None:
        bar = self.bar
        if message.total != bar.total:
            bar.total = message.total
        if message.desc != self.label:
            self.label = message.desc
            bar.set_description_str(self._prefix + message.desc, refresh=False)
        if postfix != (bar.postfix or ""):
            bar.set_postfix_str(postfix, refresh=False)
        if message.n < bar.n:
            bar.reset(total=message.total)  # the worker called reset()
        bar.update(message.n - bar.n)
        if message.closed:
            bar.refresh()

    def close(self) -> None:
        self.bar.close()
