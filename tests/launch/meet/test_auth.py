"""auth.py and table.py: only a process that proves the key reaches the table; both ways.

The gate runs here; the outsiders are real processes (tests/launch/meet/outsider.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from notebook_accel.launch.meet import auth
from notebook_accel.launch.meet.table import StoreTimeout, Table, TableClient, serve

ROOT = Path(__file__).resolve().parents[3]
SECRET = b"the job's secret"


@pytest.fixture
def gate() -> Iterator[tuple[auth.Gate, Table]]:
    table = Table()
    opened = auth.Gate(
        "127.0.0.1",
        0,
        {auth.LAUNCHER: SECRET, auth.WORKER: b"the launch's worker key"},
        lambda channel, role: serve(channel, table, b"group/" if role == auth.LAUNCHER else b"w/"),
    )
    yield opened, table
    table.close()
    opened.close()


def _member(port: int, timeout: float = 5) -> TableClient:
    channel = auth.connect("127.0.0.1", port, auth.LAUNCHER, SECRET, 10, "master_addr")
    return TableClient.over(channel, timeout)


def test_outsiders_are_refused_and_named_then_a_member_gets_in(
    gate: tuple[auth.Gate, Table], tmp_path: Path
) -> None:
    opened, table = gate
    with socket.create_connection(("127.0.0.1", opened.port)):
        pass  # a port probe: closed before a byte, not worth naming
    marker = tmp_path / "code-ran"
    outsider = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.launch.meet.outsider",
            "127.0.0.1",
            str(opened.port),
            str(marker),
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    tries = json.loads(outsider.stdout.strip().splitlines()[-1])
    where = f"127.0.0.1:{opened.port}"
    assert tries["secret"] == f"refused: machine 0 at {where} refused this machine: wrong secret"
    assert tries["worker"].endswith("refused this machine: not a worker of this launch")
    assert tries["tcpstore"].startswith("refused"), tries
    refused = opened.refusals()  # the TCPStore client retries: one line, with its count
    assert sorted(why for _, why, _ in refused) == [
        "it does not speak notebook_accel's protocol",
        "not a worker of this launch",
        "wrong secret",
    ]
    assert {who for who, _, _ in refused} == {"127.0.0.1"}
    assert opened.refusals() == []  # each refusal is reported once
    assert not marker.exists()

    member = _member(opened.port)
    member.set("answer", b"42")
    assert member.get("answer") == b"42"
    assert member.add("count", 2) == 2 and member.add("count", 3) == 5
    assert member.check(["answer", "count"]) and not member.check(["nobody"])
    assert member.compare_set("answer", b"42", b"43") == b"43"
    assert member.compare_set("fresh", b"", b"new") == b"new"
    assert member.delete_key("fresh") and not member.delete_key("fresh")
    with pytest.raises(StoreTimeout):
        member.get("never", timeout=0.2)
    # Every key is the member's namespace's: nobody's bytes reached the table.
    assert table.do(b"n", []) == [b"2"]  # answer, count
    assert table.do(b"c", [b"group/answer"]) == [b"1"]
    member.close()


def test_a_wait_ends_when_another_member_sets_the_key(gate: tuple[auth.Gate, Table]) -> None:
    opened, _ = gate
    waiter, setter = _member(opened.port, timeout=60), _member(opened.port)
    done = threading.Event()

    def wait() -> None:
        waiter.wait(["ready"])
        done.set()

    thread = threading.Thread(target=wait)
    thread.start()
    assert not done.is_set()
    setter.set("ready", b"1")
    thread.join(timeout=60)
    assert done.is_set()
    waiter.close()
    setter.close()


def test_a_host_that_cannot_prove_the_key_is_not_trusted() -> None:
    # A program that took the port (or a spoofed address) sends a hello but cannot answer
    # the member's challenge: the member refuses to go on (and would send it nothing).
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def impostor() -> None:
        conn, _ = listener.accept()
        channel = auth.Channel(conn)
        channel.send(auth.HELLO + os.urandom(32))
        channel.recv()
        channel.send(b"ok" + os.urandom(32))
        conn.close()

    thread = threading.Thread(target=impostor)
    thread.start()
    with pytest.raises(auth.ProofError, match="did not prove the secret"):
        auth.connect("127.0.0.1", port, auth.LAUNCHER, SECRET, 10, "master_addr")
    thread.join(timeout=10)
    listener.close()


def test_closing_the_gate_ends_members_and_their_waits(gate: tuple[auth.Gate, Table]) -> None:
    opened, table = gate
    member = _member(opened.port, timeout=60)
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            member.wait(["never"])
        except (OSError, ConnectionError, RuntimeError) as exc:
            failed.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    table.close()
    opened.close()
    thread.join(timeout=30)
    assert failed and not thread.is_alive()
