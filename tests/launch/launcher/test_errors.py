"""Failures: the worker's own exception in the parent, deaths by signal, hangs, timeouts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from notebook_accel import LaunchTimeoutError, WorkerDiedError, WorkerError, debug_launcher
from notebook_accel.errors import RemoteTraceback
from tests.launch.helpers import worker_processes


def _fail_on_rank_one() -> int:
    if os.environ["RANK"] == "1":
        print("about to fail")
        raise ValueError("bad learning rate 3.0")
    time.sleep(60)  # must be stopped at once, not waited for
    return 0


def test_worker_exception_is_reraised_as_its_type_with_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match="bad learning rate 3.0") as info:
        debug_launcher(_fail_on_rank_one, num_processes=2)
    assert time.monotonic() - start < 15
    exc = info.value
    assert getattr(exc, "rank", None) == 1
    assert any("rank 1 of 2" in note for note in exc.__notes__)
    cause = exc.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "Traceback from rank 1" in str(cause)
    assert "_fail_on_rank_one" in str(cause)  # the worker's frames, not the parent's
    assert 'raise ValueError("bad learning rate 3.0")' in str(cause)
    assert worker_processes() == []


SCRIPT = """\
from notebook_accel import notebook_launcher


def two_lines():
    return {}["missing"]


if __name__ == "__main__":
    notebook_launcher(two_lines, num_processes=2, hardware="cpu")
"""


def test_a_scripts_traceback_shows_the_worker_and_the_scripts_call_only(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 1
    frames = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("File")]
    # The worker's frame (in two_lines), then the script's own call: no frame of the launcher.
    assert frames == [
        f'File "{script}", line 5, in two_lines',
        f'File "{script}", line 9, in <module>',
    ], done.stderr
    assert done.stderr.rstrip().endswith("the worker's traceback is shown above."), done.stderr


class _Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()  # makes the exception unpicklable


def test_unpicklable_exception_becomes_worker_error() -> None:
    def fail() -> None:
        raise _Unpicklable("holds a lock")

    with pytest.raises(WorkerError, match="rank 0 raised .*_Unpicklable: holds a lock") as info:
        debug_launcher(fail, num_processes=1)
    assert info.value.rank == 0
    assert "holds a lock" in str(info.value.__cause__)


@pytest.mark.parametrize(
    ("how", "exitcode", "words"),
    [
        ("exit", 3, "exited with code 3 without raising a Python exception"),
        ("kill", -signal.SIGKILL, "SIGKILL (often the out-of-memory killer"),
        ("segv", -signal.SIGSEGV, "SIGSEGV (a segmentation fault"),
        # signal.Signals() has no member for real-time signals.
        ("realtime", -(signal.SIGRTMIN + 2), "killed by SIGRTMIN+2 (a signal sent to the worker"),
    ],
)
def test_death_without_exception_names_rank_and_cause(how: str, exitcode: int, words: str) -> None:
    def die() -> None:
        if os.environ["RANK"] != "1":
            time.sleep(60)
        if how == "exit":
            os._exit(3)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "realtime":
            os.kill(os.getpid(), signal.SIGRTMIN + 2)
            time.sleep(60)
        import ctypes

        ctypes.string_at(0)  # a real segfault in C

    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        debug_launcher(die, num_processes=2)
    assert time.monotonic() - start < 15
    assert info.value.rank == 1
    assert info.value.exitcode == exitcode
    assert words in str(info.value)
    assert worker_processes() == []


def _die_while_peer_waits_in_all_reduce() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        os._exit(1)
    dist.all_reduce(torch.ones(1))  # blocks: its peer is gone
    time.sleep(60)


def test_peer_death_does_not_hang_a_collective() -> None:
    start = time.monotonic()
    with pytest.raises((WorkerDiedError, RuntimeError)) as info:
        debug_launcher(_die_while_peer_waits_in_all_reduce, num_processes=2)
    assert time.monotonic() - start < 20
    # Rank 1 died first; whatever rank 0's gloo then said, the launcher names rank 1.
    assert isinstance(info.value, WorkerDiedError) and info.value.rank == 1
    assert worker_processes() == []


def test_timeout_stops_the_launch() -> None:
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError, match=r"timeout=1\.5 s") as info:
        debug_launcher(time.sleep, args=(60,), num_processes=2, timeout=1.5)
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - start < 8
    assert worker_processes() == []


def test_nonzero_sys_exit_is_a_failure() -> None:
    import sys

    with pytest.raises(SystemExit):
        debug_launcher(lambda: sys.exit(4), num_processes=1)


def test_children_of_a_worker_are_stopped_with_it() -> None:
    def spawn_child_then_fail() -> None:
        import subprocess

        subprocess.Popen(["sleep", "120"])
        if os.environ["RANK"] == "0":
            time.sleep(0.5)
            raise RuntimeError("boom")
        time.sleep(60)

    with pytest.raises(RuntimeError, match="boom"):
        debug_launcher(spawn_child_then_fail, num_processes=2)
    assert worker_processes() == []


def test_exception_class_defined_in_a_cell_is_caught_by_its_own_except() -> None:
    class TrainingDiverged(Exception):  # defined here: travels by value, both ways
        pass

    def fail() -> None:
        raise TrainingDiverged("loss is nan")

    with pytest.raises(TrainingDiverged, match="loss is nan"):
        debug_launcher(fail, num_processes=1)


def _fail_with_our_errors(which: str) -> None:
    from notebook_accel import Accelerator
    from notebook_accel.errors import CheckpointError

    if which == "config":
        Accelerator(mixed_precision="fp32")
    raise CheckpointError("/ckpt/step_3", "model.safetensors is missing")


def test_our_own_errors_arrive_as_their_type_with_their_attributes() -> None:
    # They take their own arguments (parameter, path...), which default pickling cannot rebuild.
    from notebook_accel.errors import CheckpointError, ConfigError

    with pytest.raises(ConfigError, match="mixed_precision='fp32'") as config:
        debug_launcher(_fail_with_our_errors, args=("config",), num_processes=1)
    assert config.value.parameter == "mixed_precision"
    assert getattr(config.value, "rank", None) == 0
    with pytest.raises(CheckpointError) as checkpoint:
        debug_launcher(_fail_with_our_errors, args=("checkpoint",), num_processes=1)
    assert checkpoint.value.path == "/ckpt/step_3"
    assert checkpoint.value.detail == "model.safetensors is missing"
