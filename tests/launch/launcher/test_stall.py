"""The stall report: real ranks in real hangs, each test waiting for the report itself.

Each function prints a line just before it hangs; the report must arrive within
stall_time + 5 s of that line. The launch is then stopped as the panel's Stop button does
(its error must carry the same report as a note).
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from typing import Any

import pytest

from notebook_accel.config import LaunchConfig
from notebook_accel.launch import launch
from tests.launch.helpers import worker_processes
from tests.launch.stalls import Recorder, line_of, mismatched, note_of, times_out_with_a_note

STALL = 3.0
THIS = "test_stall.py"
HANGS = "stalls.py"  # where mismatched() is


def _until_reported(
    function: Any, output: str = "all", **options: Any
) -> tuple[Recorder, BaseException]:
    """Launch ``function`` on 2 CPU ranks with stall_time=STALL until its report, then stop."""
    display = Recorder(output)
    config = LaunchConfig(
        num_processes=2, hardware="cpu", output=output, stall_time=STALL, **options
    )
    with pytest.raises(KeyboardInterrupt) as stopped:
        launch(function, (), None, config, display=display, stop=display.stop)
    assert len(display.reports) == 1, display.reports
    assert display.waited is not None and display.waited <= STALL + 5, display.waited
    assert worker_processes() == []
    return display, stopped.value


# -- the hangs ------------------------------------------------------------------------------
def test_ranks_in_different_collectives_are_named_with_their_lines() -> None:
    display, stopped = _until_reported(mismatched, output="main")
    zero, one = line_of(mismatched, "<- rank 0"), line_of(mismatched, "<- rank 1")
    text = display.reports[0]
    assert text.startswith("[notebook_accel] no rank has made progress for"), text
    assert "the launch goes on" in text and "stall_time=None turns it off" in text
    diagnosis = (
        f"rank 0 in all_reduce at {HANGS}, line {zero}; rank 1 in broadcast at line {one}: "
        "the ranks wait in different collectives."
    )
    assert diagnosis in text, text
    # output="main": the report still covers every rank; each rank's stack starts at the
    # user's function, the launcher's frames hidden.
    assert re.search(
        rf"rank 0 \(pid \d+.*\): waiting in all_reduce \(float32\[4\]\) at {HANGS}", text
    )
    assert re.search(
        rf"rank 1 \(pid \d+.*\): waiting in broadcast \(float32\[4\]\) at {HANGS}", text
    )
    assert text.count(", in mismatched") == 2 and "dist.all_reduce(tensor)" in text
    assert "notebook_accel/launch" not in text, text
    # The stop button's error carries the same report.
    note = note_of(stopped)
    assert note.startswith("[notebook_accel] stopped; where each rank was:"), note
    assert diagnosis in note


def busy_loop() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("ready", flush=True)
    if dist.get_rank() == 1:
        count = 0
        while True:  # <- spins
            count += 1
    dist.barrier()  # <- waits


def test_a_rank_looping_in_python_has_not_reached_the_barrier() -> None:
    display, _ = _until_reported(busy_loop)
    spins, waits = line_of(busy_loop, "<- spins"), line_of(busy_loop, "<- waits")
    text = display.reports[0]
    assert (
        f"rank 1 has not reached the collective rank 0 waits in (barrier at {THIS}, line "
        f"{waits}); it is at {THIS}, line {spins}"
    ) in text or (
        # the sampled line of a loop may be the one after its test
        f"it is at {THIS}, line {spins + 1}" in text
    ), text
    assert re.search(r"rank 1 \(pid \d+, \d+% CPU\): running its function", text), text


def blocked_in_read() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("ready", flush=True)
    if dist.get_rank() == 1:
        read_end, _ = os.pipe()
        os.read(read_end, 1)  # <- nobody writes
    dist.barrier()


def blocked_holding_the_interpreter() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("ready", flush=True)
    if dist.get_rank() == 1:
        read_end, _ = os.pipe()
        buffer = ctypes.create_string_buffer(1)
        ctypes.PyDLL(None).read(read_end, buffer, 1)  # <- holds the GIL
    dist.barrier()


@pytest.mark.parametrize(
    ("function", "marker"),
    [(blocked_in_read, "<- nobody writes"), (blocked_holding_the_interpreter, "<- holds the GIL")],
)
def test_a_rank_blocked_in_c_code_still_says_itsline_of(function: Any, marker: str) -> None:
    display, _ = _until_reported(function)
    text = display.reports[0]
    line = line_of(function, marker)
    assert "rank 1 has not reached the collective rank 0 waits in" in text, text
    assert f"it is at {THIS}, line {line}" in text, text
    held = function is blocked_holding_the_interpreter
    # A rank whose Python cannot answer (a thread holds the GIL in C) is read from its
    # signal handler (faulthandler), through the launcher's memfd, not its stderr.
    assert ("read from its signal handler" in text) is held, text


def returns_early() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("ready", flush=True)
    if dist.get_rank() == 0:
        dist.recv(torch.zeros(1), src=1)  # <- never sent
    return 1


def test_a_rank_that_returned_while_another_waits() -> None:
    display, _ = _until_reported(returns_early)
    line = line_of(returns_early, "<- never sent")
    text = display.reports[0]
    assert (
        "rank 1's function returned (it waits in the launcher's closing barrier) while "
        f"rank 0 waits in recv at {THIS}, line {line}."
    ) in text, text


class NeverReady:
    """A dataset whose items never come: its DataLoader's worker blocks reading a pipe."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        read_end, _ = os.pipe()
        os.read(read_end, 1)  # <- the worker waits
        return index


def stuck_loader() -> None:
    from torch.utils.data import DataLoader

    print("ready", flush=True)
    for _ in DataLoader(NeverReady(), num_workers=1):  # <- the rank waits
        pass


def test_a_stuck_dataloader_worker_is_shown_with_itsline_of() -> None:
    display, _ = _until_reported(stuck_loader)
    text = display.reports[0]
    rank_line = line_of(stuck_loader, "<- the rank waits")
    worker_line = line_of(NeverReady.__getitem__, "<- the worker waits")
    for rank in (0, 1):
        assert re.search(
            rf"rank {rank} waits for its DataLoader's workers: pid \d+ at {THIS}, line "
            rf"{worker_line}",
            text,
        ), text
        assert re.search(rf"rank {rank} \(pid .*at {THIS}, line {rank_line}", text), text


def test_a_timeout_carries_where_each_rank_was() -> None:
    times_out_with_a_note(LaunchConfig(num_processes=2, hardware="cpu", timeout=6, stall_time=None))


def quiet_collectives() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(1)
    print("ready", flush=True)
    for _ in range(150):  # nothing printed for ~3 s, but collectives complete
        dist.all_reduce(tensor)
        time.sleep(0.02)
    return 1


def test_a_quiet_loop_of_collectives_is_progress() -> None:
    display = Recorder()
    config = LaunchConfig(num_processes=2, hardware="cpu", stall_time=1)
    assert launch(quiet_collectives, (), None, config, display=display) == [1, 1]
    assert display.reports == []


def test_a_sessions_run_reports_and_its_stop_notes_where() -> None:
    from notebook_accel import Workers

    with Workers(num_processes=2, hardware="cpu", stall_time=STALL) as workers:
        display = Recorder()
        with pytest.raises(KeyboardInterrupt) as stopped:
            workers.call(busy_loop, display=display, stop=display.stop)
        assert display.waited is not None and display.waited <= STALL + 5, display.waited
        [text] = display.reports
        waits = line_of(busy_loop, "<- waits")
        diagnosis = (
            f"rank 1 has not reached the collective rank 0 waits in (barrier at {THIS}, "
            f"line {waits})"
        )
        assert diagnosis in text, text
        assert diagnosis in note_of(stopped.value)
    assert worker_processes() == []


def _py_spy_allowed() -> bool:
    """py-spy is installed (the pyspy extra) and may trace this user's processes."""
    import subprocess
    import sys

    from notebook_accel.launch.local import where

    program = where._py_spy()
    if program is None:
        return False
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        return bool(where._native(program, child.pid))
    finally:
        child.kill()
        child.wait()


def test_py_spy_adds_native_frames_where_it_may_trace() -> None:
    from notebook_accel.launch.local import where

    if not _py_spy_allowed():
        pytest.skip("py-spy is not installed, or has no ptrace rights here")
    program = where._py_spy()
    assert program is not None
    assert where._native(program, 2**22 + 1) == ""  # no such process: nothing, quietly
    display, stopped = _until_reported(mismatched)
    text = display.reports[0]
    # py-spy reads libtorch's symbols (0.4 s on an idle machine, 4 s on a loaded 2-core one:
    # a rank whose dump takes longer goes without, the report on time)
    slow = "native frames (py-spy):\n    (py-spy took longer than"
    if text.count(slow) < 2:
        # the thread running the function, by whatever name the fork gave it (a zygote
        # forked from the caller's "notebook-accel-zygote" thread keeps that name)
        assert re.search(
            r"native frames \(py-spy\):\n\s+Thread \d+ .*\n(\s+.*\n)*?\s+mismatched \(", text
        ), text
        assert "c10d::" in text, text  # gloo's wait
    assert "run_call" not in text, text  # the launcher's frames hidden
    assert "py-spy" not in note_of(stopped)  # the stop button's note stays quick
