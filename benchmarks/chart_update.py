"""Cost of one live-chart update in the kernel: matplotlib (our choice) vs plotly FigureWidget.

The chart of ``Accelerator.log`` is redrawn at most twice a second. Per update, in the
notebook process, for 2 metrics of ``POINTS`` points each (the drawn series is thinned to at
most 2000 points):

- matplotlib: the whole figure drawn by Agg and encoded as PNG (``launch/show/charts.py``), which
  the cell shows as one image output, replaced in place (no front-end extension needed);
- plotly ``FigureWidget``: the traces' data replaced in a ``batch_update`` (the widget sends
  the new arrays to the browser, where plotly.js redraws; needs the widget's front end).

Printed: milliseconds of kernel time per update and the bytes sent to the front end. The
browser's share (decoding a PNG vs plotly.js re-rendering) is not measured here.

Run: ``python benchmarks/chart_update.py`` (plotly and anywidget: the ``bench`` extra)
"""

from __future__ import annotations

import json
import statistics
import time

REPEATS = 20


def _board(points: int):  # type: ignore[no-untyped-def]
    from notebook_accel.launch.show.charts import Board

    board = Board()
    board.add(tuple((i, {"loss": 1.0 / (i + 1), "acc": i / points}) for i in range(points)))
    return board


def matplotlib_update(points: int) -> tuple[float, int]:
    from notebook_accel.launch.show.charts import Renderer

    board = _board(points)
    renderer = Renderer()  # kept between updates, as the live chart keeps it
    renderer.png(board)  # imports, font cache and layout outside the timing
    times, size = [], 0
    for _ in range(REPEATS):
        start = time.perf_counter()
        png = renderer.png(board)
        times.append(time.perf_counter() - start)
        size = len(png)
    return statistics.median(times) * 1e3, size


def plotly_update(points: int) -> tuple[float, int]:
    import plotly.graph_objects as go

    board = _board(points)
    figure = go.FigureWidget()
    for name in board.series:
        figure.add_scatter(x=[], y=[], name=name, mode="lines")
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        with figure.batch_update():
            for trace, (steps, values) in zip(figure.data, board.series.values(), strict=True):
                trace.x = steps
                trace.y = values
        times.append(time.perf_counter() - start)
    payload = json.dumps([list(s) for pair in board.series.values() for s in pair])
    return statistics.median(times) * 1e3, len(payload)


def main() -> None:
    print(f"one chart update, 2 metrics, median of {REPEATS} (kernel side):")
    print(f"{'points':>8}{'matplotlib ms':>15}{'PNG bytes':>11}{'plotly ms':>11}{'data bytes':>12}")
    for points in (100, 1000, 2000):
        mpl_ms, png = matplotlib_update(points)
        try:
            plotly_ms, data = plotly_update(points)
            plotly = f"{plotly_ms:>11.1f}{data:>12,}"
        except ImportError:
            plotly = f"{'(not installed)':>23}"
        print(f"{points:>8}{mpl_ms:>15.1f}{png:>11,}{plotly}")


if __name__ == "__main__":
    main()
