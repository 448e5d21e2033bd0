"""Accelerator.log reaches the notebook: every row kept, batched sends, the chart's data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from notebook_accel import last_metrics
from notebook_accel.config import LaunchConfig
from notebook_accel.launch import debug_launcher, launch
from notebook_accel.launch.show.charts import Board, Renderer, TextLine
from notebook_accel.launch.show.display import Display
from notebook_accel.reporting.channel import Health, Metrics


class Recording(Display):
    """The cell's display, counting what arrives (the test's window on the channel)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple[int, int]] = []  # (rank, rows)
        self.health_seen: list[tuple[int, Health]] = []

    def metrics(self, rank: int, message: Metrics) -> None:
        self.messages.append((rank, len(message.rows)))
        super().metrics(rank, message)

    def health(self, rank: int, message: Health) -> None:
        self.health_seen.append((rank, message))


def _launch(function: Any, *args: Any) -> tuple[list[Any], Recording]:
    display = Recording()
    config = LaunchConfig(num_processes=2, hardware="cpu")
    return launch(function, args, None, config, display=display), display


def log_a_few(n: int) -> int:
    from notebook_accel import Accelerator

    accelerator = Accelerator()
    for i in range(n):
        accelerator.log({"loss": 1.0 / (i + 1), "acc": i / n}, step=2 * i)
    accelerator.log({"note": "text is for trackers, not the chart", "lr": 0.5})  # no step
    accelerator.wait_for_everyone()  # a rank that left at once could break the other's gloo setup
    return accelerator.process_index


def test_the_chart_data_is_what_was_logged() -> None:
    results, display = _launch(log_a_few, 30)
    assert results == [0, 1]
    expected = [{"step": 2 * i, "loss": 1.0 / (i + 1), "acc": i / 30} for i in range(30)]
    expected.append({"step": 30, "lr": 0.5})  # no step: the count of log calls
    assert last_metrics() == expected
    assert {rank for rank, _ in display.messages} == {0}  # the main process only
    assert display.metric_rows == expected
    board = Board()
    board.add(
        tuple((row["step"], {k: v for k, v in row.items() if k != "step"}) for row in expected)
    )
    steps, losses = board.series["loss"]
    assert steps == [2 * i for i in range(30)] and losses == [1.0 / (i + 1) for i in range(30)]
    assert board.summary()["loss"] == (1 / 30, 1 / 30) and board.summary()["acc"] == (29 / 30,) * 2


def test_the_chart_renders_as_a_png() -> None:
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib (notebook_accel[charts])")
    board = Board()
    board.add(((0, {"loss": 1.0}), (1, {"loss": 0.5})))
    assert Renderer().png(board).startswith(b"\x89PNG")


def log_every_iteration(n: int) -> float:
    import time

    import torch

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    x = torch.zeros(4)
    started = time.perf_counter()
    for i in range(n):
        x.add_(1.0)
        accelerator.log({"loss": float(i)}, step=i)
    seconds = time.perf_counter() - started
    accelerator.wait_for_everyone()
    return seconds


def test_logging_every_iteration_does_not_flood_the_notebook() -> None:
    n = 200_000
    results, display = _launch(log_every_iteration, n)
    seconds = results[0]
    sends = len(display.messages)
    intervals = seconds / 0.25 + 2
    # A few sends a second (~4), plus the first and the last; never one per log call.
    assert sends <= intervals + 2, (sends, seconds)
    rows = last_metrics()
    assert sum(count for _, count in display.messages) == len(rows)
    # Thinned evenly to a few hundred rows per send; the last call always arrives.
    assert len(rows) <= 2 * 256 * intervals, (len(rows), seconds)
    assert rows[0] == {"step": 0, "loss": 0.0}
    assert rows[-1] == {"step": n - 1, "loss": float(n - 1)}
    steps = [row["step"] for row in rows]
    assert steps == sorted(set(steps))
    assert all(row["loss"] == row["step"] for row in rows)  # each row's own values


def log_slowly(n: int) -> None:
    import time

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    for i in range(n):
        accelerator.log({"loss": float(i)}, step=i)
        time.sleep(0.002)
    accelerator.wait_for_everyone()


def test_a_slow_logger_gets_every_row() -> None:
    _, display = _launch(log_slowly, 400)
    assert last_metrics() == [{"step": i, "loss": float(i)} for i in range(400)]
    assert 1 < len(display.messages) < 400


def sleep_then_log() -> None:
    import os
    import time

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    time.sleep(1.5)  # the health thread reports about once a second
    if os.environ["RANK"] == "0":
        accelerator.log({"loss": 1.0}, step=0)
    accelerator.wait_for_everyone()


def test_every_rank_reports_its_health() -> None:
    _, display = _launch(sleep_then_log)
    ranks = {rank for rank, _ in display.health_seen}
    assert ranks == {0, 1}
    latest = display.health_seen[-1][1]
    assert latest.rss > 10 * 2**20 and latest.gpu is None and latest.steps == 0


def test_a_terminal_gets_one_compact_line(capsys: pytest.CaptureFixture[str]) -> None:
    debug_launcher(log_a_few, args=(5,))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[metrics]")]
    assert lines, out
    assert (
        lines[-1]
        == "[metrics] step 5 | loss 0.2 (best 0.2) | acc 0.8 (best 0.8) | lr 0.5 (best 0.5)"
    )


def test_text_line_view_skips_repeats() -> None:
    import io

    stream = io.StringIO()
    view = TextLine(stream)
    board = Board()
    board.add(((1, {"loss": 0.5}),))
    view.draw(board, final=False)
    view.draw(board, final=True)
    assert stream.getvalue() == "[metrics] step 1 | loss 0.5 (best 0.5)\n"


def log_then_wait(gate: str) -> int:
    import os
    import time

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    if accelerator.is_main_process:
        for i in range(3):
            accelerator.log({"loss": 1.0 / (i + 1)}, step=i)
        # no more log calls until the notebook has seen all three rows (it writes the file)
        while not os.path.exists(gate):
            time.sleep(0.05)
    accelerator.wait_for_everyone()
    return accelerator.process_index


class Gate(Recording):
    """Opens the gate once the rows up to ``step`` have arrived."""

    def __init__(self, gate: Path, step: int) -> None:
        super().__init__()
        self.gate, self.step = gate, step

    def metrics(self, rank: int, message: Metrics) -> None:
        super().metrics(rank, message)
        if any(row["step"] == self.step for row in self.metric_rows):
            self.gate.write_text("")


def test_rows_logged_before_a_pause_reach_the_notebook_during_it(tmp_path: Path) -> None:
    # The loop logs 3 rows within one batch interval and stops logging: they must arrive
    # while it waits (sent by the health thread), not only at its next log call or its end.
    gate = tmp_path / "seen"
    display = Gate(gate, step=2)
    config = LaunchConfig(num_processes=2, hardware="cpu", timeout=120)
    assert launch(log_then_wait, (str(gate),), None, config, display=display) == [0, 1]
    assert gate.exists()
    assert [row["step"] for row in display.metric_rows] == [0, 1, 2]
