"""A rank's printed lines and its bars reach the cell in the order the worker produced them.

What JupyterLab showed: in the quickstart all five ``[rank 0] epoch N: loss`` lines came after
all five epoch bars. Lines travel through the stdout pipe and bars through the message pipe;
a parent busy drawing read every queued bar first. Messages now carry the worker's output
marks, and the parent shows the lines written before a bar above it.
"""

from __future__ import annotations

import time
from typing import Any

from notebook_accel.config import LaunchConfig
from notebook_accel.launch import launch
from notebook_accel.launch.show.display import Bar, Display
from notebook_accel.reporting.channel import Metrics, Progress


class _NoBar:
    def show(self, message: Progress, postfix: str) -> None:
        pass

    def close(self) -> None:
        pass


class Sequence(Display):
    """Records bars opened, charts drawn and lines written; slow at first, like a busy cell."""

    def __init__(self) -> None:
        super().__init__(output="main")
        self.events: list[str] = []
        self._slow = True

    def open_bar(self, rank: int, prefix: str, message: Progress, options: dict[str, Any]) -> Bar:
        self.events.append(f"bar {message.desc}")
        if self._slow:  # the worker runs ahead while the parent draws its first bar
            self._slow = False
            time.sleep(1.0)
        return _NoBar()

    def metrics(self, rank: int, message: Metrics) -> None:
        self.events.append(f"chart {message.rows[-1][0]}")

    def _write(self, rank: int, stream: str, raw: bytes) -> None:
        if rank == 0:
            self.events.append(raw.decode())


def epochs() -> None:
    import sys

    from notebook_accel import Accelerator, tqdm

    accelerator = Accelerator()
    for epoch in range(5):
        for _ in tqdm(range(3), desc=f"epoch {epoch}"):
            pass
        print(f"epoch {epoch}: loss {1 / (epoch + 1):.2f}")
        print(f"epoch {epoch}: warning", file=sys.stderr)
        accelerator.log({"loss": 1 / (epoch + 1)}, step=epoch)
        accelerator._live and accelerator._live.flush()  # type: ignore[func-returns-value]
    accelerator.wait_for_everyone()


def test_lines_sit_under_the_bar_they_follow() -> None:
    display = Sequence()
    launch(epochs, (), None, LaunchConfig(num_processes=2, hardware="cpu"), display=display)
    expected = []
    for epoch in range(5):
        expected += [
            f"bar epoch {epoch}",
            f"epoch {epoch}: loss {1 / (epoch + 1):.2f}",
            f"epoch {epoch}: warning",
            f"chart {epoch}",
        ]
    assert display.events == expected
