"""The parent's side of ``Accelerator.log``: every row kept, a live chart, a text line.

    Metrics(rows) from rank 0 (a few a second, reporting/live.py)
      -> Board.add: rows kept as dicts ({"step": 3, "loss": 0.2, ...}); per-metric series
      -> at most every 0.5 s (longer if drawing is slow: <= ~20% of the time): the view redraws
           notebook: a matplotlib figure (Agg, no pyplot) as one PNG, updated in place
                     (an IPython display handle in a cell; an ``ipywidgets.Image`` in the panel)
           terminal: one compact line, at most every 2 s
      -> end of the launch: a last redraw; the rows become ``last_metrics()``

Why a PNG from matplotlib: an image output needs no front-end extension, so the chart shows
the same in JupyterLab, the classic notebook, VS Code, Colab and Voilà, and stays in the saved
notebook. The chart library draws the lines, axes, titles and legend (last and best values).
"""

from __future__ import annotations

import io
import json
import math
import time
from typing import Any, Protocol, TextIO

__all__ = ["Board", "ChartView", "CellChart", "TextLine", "Renderer", "last_metrics"]

_MAX_POINTS = 2000  # points drawn per line; a longer series is thinned for the drawing only
# A metric whose name holds one of these is better when higher (otherwise: lower is better).
_HIGHER_IS_BETTER = ("acc", "f1", "auc", "score", "precision", "recall", "reward", "bleu", "map")

_last: list[dict[str, float]] = []


def last_metrics() -> list[dict[str, float]]:
    """The rows ``Accelerator.log`` sent during the last launch, as plain dicts.

    One dict per ``log`` call on the main process: ``{"step": ..., "loss": ..., ...}``;
    ``pandas.DataFrame(last_metrics())`` takes them as they are.

    Example:
        >>> from notebook_accel import last_metrics
        >>> rows = last_metrics()  # after a launch whose function called accelerator.log
        >>> [row["loss"] for row in rows]  # doctest: +SKIP
        [0.91, 0.55, 0.31]
    """
    return [dict(row) for row in _last]


def higher_is_better(name: str) -> bool:
    """Whether the best value of metric ``name`` is its highest (accuracy) or lowest (loss)."""
    lowered = name.lower()
    return any(word in lowered for word in _HIGHER_IS_BETTER) and "loss" not in lowered


class Board:
    """Every row logged in one launch, and each metric's series for the chart."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.series: dict[str, tuple[list[float], list[float]]] = {}
        self.version = 0  # rows added so far: a view redraws only when it changed

    def add(self, rows: tuple[tuple[int, dict[str, float]], ...]) -> None:
        for step, values in rows:
            self.rows.append({"step": step, **values})
            for name, value in values.items():
                steps, points = self.series.setdefault(name, ([], []))
                steps.append(step)
                points.append(value)
        self.version += len(rows)

    def summary(self) -> dict[str, tuple[float, float]]:
        """Per metric: (last value, best value)."""
        out = {}
        for name, (_, points) in self.series.items():
            finite = [p for p in points if math.isfinite(p)] or points
            best = max(finite) if higher_is_better(name) else min(finite)
            out[name] = (points[-1], best)
        return out

    def line(self) -> str:
        """One compact line: the last step, and each metric's last and best value."""
        if not self.rows:
            return ""
        parts = [f"step {self.rows[-1]['step']:g}"]
        for name, (last, best) in self.summary().items():
            parts.append(f"{name} {last:.4g} (best {best:.4g})")
        return "[metrics] " + " | ".join(parts)


def _round_up(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is at least ``value``."""
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def _thinned(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    if len(xs) <= _MAX_POINTS:
        return xs, ys
    stride = math.ceil(len(xs) / _MAX_POINTS)
    return xs[::stride] + xs[-1:], ys[::stride] + ys[-1:]


class Renderer:
    """Draws a board as PNG: one small plot per metric, its line against the step.

    The figure is kept between draws (only the lines' data, the limits and the legends
    change), which makes a redraw several times cheaper than a new figure. Each plot's legend
    gives the last and the best value in its title.
    """

    def __init__(self, width: float = 9.0, dpi: int = 80) -> None:
        self.width = width
        self.dpi = dpi
        self._names: list[str] = []
        self._figure: Any = None
        self._plots: list[tuple[Any, Any]] = []  # (axes, line) per metric

    def _layout(self, names: list[str]) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        columns = max(1, min(3, len(names)))
        rows = max(1, math.ceil(len(names) / columns))
        figure = Figure(figsize=(self.width, 2.6 * rows), dpi=self.dpi)
        FigureCanvasAgg(figure)
        figure.subplots_adjust(
            left=0.06, right=0.98, bottom=0.17 / rows, top=1 - 0.1 / rows, wspace=0.22, hspace=0.5
        )
        self._plots = []
        for i in range(len(names)):
            axes = figure.add_subplot(rows, columns, i + 1)
            (line,) = axes.plot([], [])
            axes.set_xlabel("step", fontsize=8)
            axes.tick_params(labelsize=8)
            axes.grid(alpha=0.3)
            self._plots.append((axes, line))
        self._figure, self._names = figure, names

    def png(self, board: Board) -> bytes:
        """The chart of ``board`` now."""
        names = list(board.series)
        if names != self._names:
            self._layout(names)
        summary = board.summary()
        for name, (axes, line) in zip(names, self._plots, strict=True):
            line.set_data(*_thinned(*board.series[name]))
            last, best = summary[name]
            # In the title, not a legend: a legend would hide the line's end.
            axes.set_title(f"{name}   last {last:.4g}   best {best:.4g}", fontsize=9)
            axes.relim()
            axes.autoscale_view(scalex=False)
            steps = board.series[name][0]
            # The step axis ends at a round number: the line grows along it between two
            # rescales, instead of always spanning the whole plot.
            axes.set_xlim(min(steps[0], 0), _round_up(max(steps[-1], 1)))
        buffer = io.BytesIO()
        # What the image shows, readable without looking at it (the browser test reads it).
        about = {
            "rows": len(board.rows),
            "last_step": board.rows[-1]["step"] if board.rows else None,
        }
        self._figure.savefig(buffer, format="png", metadata={"Description": json.dumps(about)})
        return buffer.getvalue()


def charts_available() -> bool:
    """Whether matplotlib is installed (without it, the chart is the text line)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


class ChartView(Protocol):
    """Where the board is drawn; ``interval`` is the least time between two draws."""

    interval: float

    def draw(self, board: Board, final: bool) -> None: ...

    def move_down(self) -> bool:
        """A new bar appeared below the chart: start again under it; True if it moved."""
        ...


class CellChart:
    """The chart in a notebook cell: one image output, replaced in place on each draw."""

    interval = 0.5

    def __init__(self) -> None:
        self._handle: Any = None
        self._renderer = Renderer()

    def draw(self, board: Board, final: bool) -> None:
        from IPython.display import Image, display

        if not board.series:
            return
        image = Image(data=self._renderer.png(board), format="png")
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)

    def move_down(self) -> bool:
        """Empty the chart's output; the next draw shows it again, under the newest bar."""
        from IPython.display import HTML

        if self._handle is None:
            return False
        self._handle.update(HTML(""))
        self._handle = None
        return True


class TextLine:
    """In a terminal (the command line launcher, a script): one compact line per update."""

    interval = 2.0

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._said = ""

    def draw(self, board: Board, final: bool) -> None:
        line = board.line()
        if line and line != self._said:
            self._said = line
            self.stream.write(line + "\n")
            self.stream.flush()

    def move_down(self) -> bool:
        return False


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (so a cell can show images)."""
    import sys

    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class Live:
    """One launch's board and view: ``add`` on each Metrics message, ``end`` at the end."""

    def __init__(self, view: ChartView) -> None:
        self.board = Board()
        self.view = view
        self._drawn = 0
        self._next = 0.0

    def add(self, rows: tuple[tuple[int, dict[str, float]], ...]) -> None:
        global _last
        self.board.add(rows)
        _last = self.board.rows
        now = time.monotonic()
        if now >= self._next:
            self._draw(final=False)
            spent = time.monotonic() - now
            # A slow draw (a loaded machine, many plots) waits longer: drawing takes at most
            # about a fifth of the notebook process's time, whatever the machine.
            self._next = now + max(self.view.interval, 5 * spent)

    def catch_up(self) -> None:
        """Draw rows that came within the interval once it has passed (the engine's tick).

        A rank that logs and then pauses (an evaluation, a wait) sends nothing more for a
        while: without this the chart would show the rows from before the interval until the
        next message came.
        """
        if time.monotonic() >= self._next and self.board.version != self._drawn:
            self.add(())

    def _draw(self, final: bool) -> None:
        if self.board.version != self._drawn:
            self._drawn = self.board.version
            self.view.draw(self.board, final)

    def end(self) -> None:
        """The last rows are drawn, whatever the interval."""
        self._draw(final=True)

    def below_new_bar(self) -> None:
        """Keep the chart under the progress bars: redraw it below a bar just opened."""
        if self.view.move_down():
            self._drawn = -1
            self._draw(final=False)


def start_launch() -> None:
    """A new launch: ``last_metrics()`` is empty until its first rows arrive."""
    global _last
    _last = []
