"""wire/where.py: faulthandler's text read back, and what the ranks' places mean together."""

from __future__ import annotations

import faulthandler
import threading
from pathlib import Path

from notebook_accel.launch.wire.where import (
    RankView,
    locate,
    parse_faulthandler,
    report,
)
from notebook_accel.reporting.channel import Stack, Where


def _waits_here(ready: threading.Event, done: threading.Event) -> None:
    ready.set()
    done.wait()  # <- waits


def test_a_real_faulthandler_dump_reads_back_as_stacks(tmp_path: Path) -> None:
    ready, done = threading.Event(), threading.Event()
    thread = threading.Thread(target=_waits_here, args=(ready, done))
    thread.start()
    ready.wait()
    dump = tmp_path / "dump.txt"
    try:
        with dump.open("w") as file:
            faulthandler.dump_traceback(file, all_threads=True)
    finally:
        done.set()
        thread.join()
    stacks = parse_faulthandler(dump.read_text())
    assert thread.ident in {s.thread for s in stacks}
    [mine] = [s for s in stacks if s.thread == thread.ident]
    # outermost first, as a traceback: threading's bootstrap ... our function ... Event.wait
    names = [frame[2] for frame in mine.frames]
    assert names.index("_waits_here") < names.index("wait"), names
    file, line, _ = next(f for f in mine.frames if f[2] == "_waits_here")
    assert file == __file__
    source = Path(__file__).read_text().splitlines()
    assert "<- waits" in source[line - 1]


ENTRY = ("/x/site-packages/notebook_accel/launch/rank/worker.py", 257, "run_call")
C10D = "/x/site-packages/torch/distributed/distributed_c10d.py"


def _rank(*frames: tuple[str, int, str], tensors: str = "") -> Where:
    """A rank's answer: its main thread in the launcher's entry, then ``frames``."""
    stack = Stack(1, "MainThread", (("<string>", 1, "<module>"), ENTRY, *frames))
    return Where((stack,), collectives=3, tensors=tensors)


def test_the_users_line_is_the_call_into_the_collective() -> None:
    where = _rank(
        ("/home/me/train.py", 7, "train"),
        ("/x/site-packages/torch/distributed/c10d_logger.py", 83, "wrapper"),
        (C10D, 3252, "all_reduce"),
    )
    [spot], outside = locate(where)
    assert outside == ""
    assert spot.collective == "all_reduce" and spot.line == ("/home/me/train.py", 7, "train")
    assert spot.frames[0][2] == "train"  # the launcher's frames are not the rank's


def test_the_diagnosis_of_two_ranks() -> None:
    waiting = _rank(("/home/me/train.py", 7, "train"), (C10D, 1, "all_reduce"), tensors="f[4]")
    other = _rank(("/home/me/train.py", 9, "train"), (C10D, 1, "broadcast"), tensors="f[4]")
    text = report([RankView(0, waiting), RankView(1, other)], (), "head")
    assert (
        "rank 0 in all_reduce at train.py, line 7; rank 1 in broadcast at line 9: the ranks "
        "wait in different collectives." in text
    ), text
    wider = _rank(("/home/me/train.py", 7, "train"), (C10D, 1, "all_reduce"), tensors="f[8]")
    text = report([RankView(0, waiting), RankView(1, wider)], (), "head")
    assert "the ranks wait in all_reduce with different tensors: rank 0 f[4], rank 1 f[8]." in text
    spinning = _rank(("/home/me/train.py", 12, "train"))
    text = report([RankView(0, waiting), RankView(1, spinning, cpu=99.0)], (), "head")
    assert (
        "rank 1 has not reached the collective rank 0 waits in (all_reduce at train.py, line "
        "7); it is at train.py, line 12 (busy: 99% CPU)." in text
    ), text
    text = report([RankView(0, waiting), RankView(1, state="died")], (), "head")
    assert "rank 1 died while rank 0 waits in all_reduce at train.py, line 7." in text, text
