"""Durable sessions driven from this process: the name's rules, idle expiry, a worker's death
while nobody is attached, the supervisor killed, and outsiders refused.

(Two real kernels, one killed, are tests/launch/local/test_durable_kernel.py's.)
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from notebook_accel import ConfigError, Workers, sessions
from notebook_accel.launch.local.durable.journal import Dropped, Journal, frames
from tests.launch.stalls import mismatched

pytestmark = pytest.mark.slow

OUTSIDER = Path(__file__).with_name("durable_outsider.py")


def _supervisor(folder: Path, name: str) -> psutil.Process:
    status = json.loads((folder / name / "status.json").read_text())
    return psutil.Process(status["pid"])


class _Missing:
    """Unpickles as an import of a module the supervisor does not have."""

    def __reduce__(self) -> tuple[object, ...]:
        return (importlib.import_module, ("no_such_module_xyz",))


def _until(predicate: object, timeout: float = 60) -> None:
    """Wait for a state the supervisor writes (its status), not for a moment in time."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the state never came"
        time.sleep(0.05)


def test_a_name_is_needed_and_one_in_use_is_refused(durable_folder: Path) -> None:
    with pytest.raises(ConfigError, match="name"):
        Workers(2, hardware="cpu", durable=True)
    with pytest.raises(ConfigError, match="durable"):
        Workers(2, hardware="cpu", name="exp")
    with pytest.raises(ConfigError, match="idle_time"):
        Workers(2, hardware="cpu", durable=True, name="exp", idle_time=0)
    w = Workers(2, hardware="cpu", durable=True, name="exp")
    try:
        with pytest.raises(ConfigError, match="'exp' is running"):
            Workers(2, hardware="cpu", durable=True, name="exp")
        assert [(s.name, s.state, s.ranks) for s in sessions()] == [("exp", "open", 2)]
        with pytest.raises(ConfigError, match=r"\['exp'\]"):
            Workers.attach("other")
    finally:
        w.close()
    assert sessions() == [] and not (durable_folder / "exp").exists()


def test_an_idle_session_ends_by_itself_with_its_workers(durable_folder: Path) -> None:
    w = Workers(2, hardware="cpu", durable=True, name="idle", idle_time=1)
    supervisor = _supervisor(durable_folder, "idle")
    workers = [psutil.Process(pid) for pid in w.run(os.getpid)]
    assert all(supervisor.pid in [p.pid for p in worker.parents()] for worker in workers)
    gone, alive = psutil.wait_procs([supervisor, *workers], timeout=60)
    assert alive == []
    assert sessions() == [] and w.closed


def test_a_stopped_job_ends_and_the_session_stays_usable(
    durable_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = Workers(2, hardware="cpu", durable=True, name="stops")
    try:
        # a module this process put on its sys.path after the session opened
        (tmp_path / "durable_late_module.py").write_text("def seven():\n    return 7\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        import durable_late_module  # type: ignore[import-not-found]

        assert w.run(durable_late_module.seven) == [7, 7]

        def forever() -> None:
            while True:
                time.sleep(0.01)

        # what the supervisor cannot load is this call's error, and the session goes on
        with pytest.raises(ModuleNotFoundError, match="no_such_module") as caught:
            w.run(print, _Missing())
        assert "could not load the request" in str(caught.value.__notes__)
        job = w.submit(forever)
        assert "forever" in str(job.where())
        job.stop()
        with pytest.raises(KeyboardInterrupt):
            job.result()
        assert w.run(lambda: 2) == [2, 2] and [j.done() for j in w.jobs] == [True]
    finally:
        w.close()


def test_a_stalled_job_reports_by_itself_and_an_attach_shows_the_report_again(
    durable_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = Workers(2, hardware="cpu", durable=True, name="stalls", stall_time=3)
    try:
        job = w.submit(mismatched)
        shown: list[str] = []

        def said(text: str) -> bool:
            shown.append(capsys.readouterr().out)
            return text in "".join(shown)

        _until(lambda: said("no rank has made progress"))
        assert "the ranks wait in different collectives." in "".join(shown)
        # kept by the supervisor: another attach shows it again, with the job's lines
        shown.clear()
        Workers.attach("stalls")
        _until(lambda: said("the ranks wait in different collectives."))
        assert "no rank has made progress" in "".join(shown)
        job.stop()
    finally:
        w.close()


def test_a_death_while_detached_is_told_at_attach_and_workers_follow_the_supervisor(
    durable_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = Workers(2, hardware="cpu", durable=True, name="dies")
    try:
        _dies(durable_folder, w, capsys)
    finally:
        w.close()  # (when an assertion failed: nothing is left running)


def _dies(durable_folder: Path, w: Workers, capsys: pytest.CaptureFixture[str]) -> None:
    pids = w.run(os.getpid)
    os.kill(pids[1], signal.SIGKILL)
    _until(lambda: [s.state for s in sessions()] == ["closed"])
    again = Workers.attach("dies")
    assert again.closed
    said = capsys.readouterr().err
    assert "while no kernel was attached to 'dies': rank 1 was killed by SIGKILL" in said
    assert "rank 1" in sessions()[0].last_line
    again.restart()  # fresh workers, from the attaching kernel
    workers = [psutil.Process(pid) for pid in again.run(os.getpid)]
    assert not again.closed and sessions()[0].state == "open"
    # the supervisor killed: its workers follow it, as they follow a kernel
    supervisor = _supervisor(durable_folder, "dies")
    supervisor.kill()
    gone, alive = psutil.wait_procs([supervisor, *workers], timeout=30)
    assert alive == []
    assert sessions() == []  # the folder it left is removed


def _outsider(python: str, socket_path: Path, marker: Path, **user: int) -> dict[str, str]:
    """What tests/launch/local/durable_outsider.py got, run by ``python`` (as ``user``)."""
    done = subprocess.run(
        [python, str(OUTSIDER), str(socket_path), str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        **user,  # type: ignore[call-overload]
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.fixture
def mine(durable_folder: Path) -> Iterator[Workers]:
    """A durable session named "mine", closed after the test."""
    w = Workers(2, hardware="cpu", durable=True, name="mine")
    try:
        yield w
    finally:
        w.close()


@pytest.mark.skipif(os.getuid() != 0, reason="running a process as another user needs root")
def test_another_user_reaches_nothing_of_a_durable_session(
    durable_folder: Path, tmp_path: Path, mine: Workers
) -> None:
    marker = tmp_path / "code-ran"
    socket_path = durable_folder / "mine" / "socket"
    assert oct(socket_path.stat().st_mode & 0o777) == "0o600"
    assert oct(durable_folder.stat().st_mode & 0o777) == "0o700"
    tries = _outsider("/usr/bin/python3", socket_path, marker, user=65534, group=65534)
    assert tries == {"list": "refused: PermissionError", "connect": "refused: PermissionError"}
    assert not marker.exists()


def test_without_the_secret_nothing_is_served_nor_unpickled(
    durable_folder: Path, tmp_path: Path, mine: Workers
) -> None:
    marker = tmp_path / "code-ran"
    # a process that sends a pickle as its proof
    tries = _outsider(sys.executable, durable_folder / "mine" / "socket", marker)
    assert tries["connect"].startswith("refused: "), tries
    # notebook_accel's own attach with another secret
    code = "from notebook_accel import Workers; Workers.attach('mine')"
    guess = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, NOTEBOOK_ACCEL_SECRET="a guess"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "ProofError" in guess.stderr and "wrong secret" in guess.stderr, guess.stderr
    assert not marker.exists()
    assert mine.run(lambda: 1) == [1, 1]  # the session goes on


def _private(pid: int) -> int:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    fields = {k: int(v) << 10 for k, v in re.findall(r"^(\w+):\s+(\d+) kB", text, re.M)}
    return fields["Private_Clean"] + fields["Private_Dirty"]


def _held(folder: Path, name: str, made: bool) -> int:
    """The private memory of a durable session's processes (supervisor, its forkserver,
    workers) opened while this process held 256 MiB (``made``) that it frees afterwards."""
    import torch

    data = torch.ones(64, 1024, 1024) if made else None  # 256 MiB, every page written
    w = Workers(2, hardware="cpu", durable=True, name=name)
    try:
        assert w.run(lambda: 1) == [1, 1]
        del data
        gc.collect()
        supervisor = _supervisor(folder, name)
        return sum(_private(p.pid) for p in [supervisor, *supervisor.children(recursive=True)])
    finally:
        w.close()


def test_a_durable_session_holds_none_of_the_callers_memory(durable_folder: Path) -> None:
    # The supervisor is a fresh interpreter and its workers its forkserver's forks: what the
    # caller made and freed is in none of them (the memory issue's smaps_rollup reading).
    made, never = _held(durable_folder, "made", True), _held(durable_folder, "never", False)
    assert abs(made - never) < 32 << 20, (made >> 20, never >> 20)


def test_a_journal_keeps_its_latest_segments_and_says_what_it_dropped(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "0", segment=1000)
    for i in range(100):
        journal.append(("line", 0, "stdout", b"%03d" % i + b"x" * 40))
    data = journal.read()
    journal.close()
    events = frames(data)
    assert isinstance(events[0], Dropped) and events[0].segments >= 1
    kept = [int(event[3][:3]) for event in events[1:]]
    assert kept == list(range(kept[0], 100))  # the latest, in order, none missing
    assert 1000 < len(data) <= 2 * 1000 + 100  # more than one segment, at most two
