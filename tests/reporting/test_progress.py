"""notebook_accel.tqdm: throttled reports from real workers, bars drawn by the parent."""

from __future__ import annotations

import io
from typing import Any

import tqdm.auto

from notebook_accel.config import LaunchConfig
from notebook_accel.launch import launch
from notebook_accel.launch.show.display import Display
from notebook_accel.reporting.channel import Progress
from notebook_accel.reporting.progress import channel, trange
from notebook_accel.reporting.progress import tqdm as bar


class Recorder(Display):
    """The launcher's display, keeping every Progress message it was given."""

    def __init__(self) -> None:
        super().__init__(output="all")
        self.stdout = self.stderr = io.StringIO()
        self.messages: list[tuple[int, Progress]] = []

    def progress(self, rank: int, message: Progress) -> None:
        self.messages.append((rank, message))
        super().progress(rank, message)


def run(function: Any, *args: Any, processes: int = 2) -> tuple[list[Any], Recorder]:
    display = Recorder()
    config = LaunchConfig(hardware="cpu", num_processes=processes)
    return launch(function, args, None, config, display=display), display


def test_outside_a_launch_it_is_tqdm_auto() -> None:
    assert channel() is None
    with bar(range(5), desc="local", file=io.StringIO()) as b:
        assert isinstance(b, tqdm.auto.tqdm)
        assert sum(b) == 10
    assert b.n == 5
    assert list(trange(3, disable=True)) == [0, 1, 2]


def _loop(seconds: float, all_ranks: bool) -> int:
    import time

    from notebook_accel.reporting import progress

    end = time.perf_counter() + seconds
    b = progress.tqdm(desc="work", unit="step", all_ranks=all_ranks, total=None)
    while time.perf_counter() < end:
        b.update()
        b.set_postfix(loss=0.5)
    b.close()
    for _ in progress.tqdm(range(1000), desc="short"):
        pass
    return int(b.n)


def test_rank_zero_bar_throttled_and_closed() -> None:
    (n0, _), display = run(_loop, 1.0, False)
    ranks = {rank for rank, _ in display.messages}
    assert ranks == {0}, "only rank 0 reports by default"
    work = [m for _, m in display.messages if m.desc == "work"]
    # At most one message per 0.1 s of the loop's own clock, plus the closing one: a bound a
    # slow machine cannot break (it sends fewer); how many arrive is not asserted.
    assert 1 <= len(work) <= 16, f"{len(work)} messages for a 1 s loop: throttled to ~10/s"
    assert len(work) < n0  # throttled: not one message per update
    assert work[-1].closed and work[-1].n == n0 and work[-1].unit == "step"
    assert dict(work[-1].options)["postfix"] == "loss=0.5"
    short = [m for _, m in display.messages if m.desc == "short"]
    assert short[-1].closed and short[-1].n == short[-1].total == 1000
    assert "work" in display.stderr.getvalue()  # the parent drew a text bar


def test_all_ranks_on_request() -> None:
    _, display = run(_loop, 0.3, True)
    assert {rank for rank, m in display.messages if m.desc == "work"} == {0, 1}
    assert "[rank 1] work" in display.stderr.getvalue()


def test_break_closes_the_bar() -> None:
    def partial() -> None:
        from notebook_accel.reporting import progress

        for i in progress.tqdm(range(100), desc="early"):
            if i == 41:
                break

    _, display = run(partial, processes=1)
    last = display.messages[-1][1]
    assert last.closed and last.n == 41 and last.total == 100


def test_parent_draws_only_main_when_asked() -> None:
    display = Display(output="all", bars="main")
    display.stderr = io.StringIO()
    for rank in (0, 1):
        display.progress(rank, Progress(bar=0, n=5, total=10, desc=f"r{rank}"))
        display.progress(rank, Progress(bar=0, n=10, total=10, desc=f"r{rank}", closed=True))
    text = display.stderr.getvalue()
    assert "r0" in text and "10/10" in text and "r1" not in text


def test_many_messages_draw_one_bar_that_ends_at_the_last_state() -> None:
    # What drawing costs is in benchmarks/progress_overhead.py; here, what is drawn.
    display = Display()
    display.stderr = io.StringIO()
    for i in range(2000):
        display.progress(0, Progress(bar=1, n=i, total=2000, desc="fast"))
    display.progress(0, Progress(bar=1, n=2000, total=2000, desc="fast", closed=True))
    display.close()
    text = display.stderr.getvalue()
    assert "2000/2000" in text and text.count("fast") >= 1 and not display._bars
