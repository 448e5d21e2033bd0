"""One machine: the launch's rendezvous is private to the user and leaves nothing behind.

The workers meet in a FileStore on a memfd of the launcher (launch/meet/rendezvous.py): no port,
no file. Another user (uid 65534, through setpriv, where the tests run as root) cannot open it
to read or write a key, the launcher listens on no port, and a SIGKILLed Jupyter kernel takes
the store with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from notebook_accel import debug_launcher

ROOT = Path(__file__).resolve().parents[3]

# What another user tries: open the store (read, write), list the launcher's fds.
_OUTSIDER = textwrap.dedent(
    """
    import json, os, sys
    path, launcher = sys.argv[1], sys.argv[2]
    out = {"uid": os.getuid()}
    for what, flags in (("read", os.O_RDONLY), ("write", os.O_RDWR | os.O_APPEND)):
        try:
            fd = os.open(path, flags)
            if what == "write":
                os.write(fd, b"notebook_accel/save_state/0/ckpt/0/0 failed")
            os.close(fd)
            out[what] = "done"
        except OSError as exc:
            out[what] = type(exc).__name__
    try:
        os.listdir(f"/proc/{launcher}/fd")
        out["list"] = "done"
    except OSError as exc:
        out["list"] = type(exc).__name__
    print(json.dumps(out))
    """
)


def _with_an_outsider(launcher: int) -> dict[str, Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    store = dist.distributed_c10d._get_default_store()
    path = urlparse(os.environ["NOTEBOOK_ACCEL_STORE"]).path
    seen: dict[str, Any] = {}
    if dist.get_rank() == 0:
        store.set("members only", "yes")
        outsider = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
            + [sys.executable, "-c", _OUTSIDER, path, str(launcher)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        seen = json.loads(outsider.stdout.strip().splitlines()[-1])
        seen["store file"] = os.readlink(path)
        from tests.launch.helpers import listening_ports

        seen["launcher listens on"] = sorted(listening_ports(launcher))
    dist.barrier()  # the outsider is done: what it wrote, if anything, would be in the store
    seen["read back"] = store.get("members only").decode()
    seen["keys"] = store.num_keys()
    dist.barrier()
    if dist.get_rank() == 1:
        seen["deleted"] = store.delete_key("members only")
    return seen


def test_another_user_cannot_read_or_write_a_launchs_keys() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("another uid needs root and setpriv (util-linux) to switch to uid 65534")
    results = debug_launcher(_with_an_outsider, args=(os.getpid(),), num_processes=2)
    rank0 = results[0]
    assert rank0["uid"] == 65534
    assert (rank0["read"], rank0["write"], rank0["list"]) == ("PermissionError",) * 3
    assert rank0["store file"].startswith("/memfd:notebook-accel-store")  # in no folder
    assert rank0["launcher listens on"] == []  # no port of the launch to connect to
    assert [r["read back"] for r in results] == ["yes", "yes"]
    assert results[0]["keys"] == results[1]["keys"] > 0
    assert results[1]["deleted"] is True


_CELL = """
import os, time
from notebook_accel import notebook_launcher
def hold(ready):
    store = os.environ["NOTEBOOK_ACCEL_STORE"][len("file://"):]
    with open(os.path.join(ready, os.environ["RANK"]), "w") as out:
        out.write(f"{os.getpid()} {os.readlink(store)}")
    time.sleep(600)
notebook_launcher(hold, args=(READY,), num_processes=2, hardware="cpu")
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigkilled_kernel_leaves_no_file_of_the_launch(tmp_path: Path) -> None:
    from jupyter_client import KernelManager

    ready, scratch = tmp_path / "ready", tmp_path / "tmp"
    ready.mkdir()
    scratch.mkdir()
    kernel = KernelManager(kernel_name="python3")
    # The kernel's own temporary folder: whatever the launch wrote there would stay.
    kernel.start_kernel(cwd=str(ROOT), env=dict(os.environ, TMPDIR=str(scratch)))
    client = kernel.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        client.execute(_CELL.replace("READY", repr(str(ready))))
        deadline = time.monotonic() + 120  # only ends a failing test
        while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [(ready / rank).read_text().split(" ", 1) for rank in ("0", "1")]
        assert all(store.startswith("/memfd:notebook-accel-store") for _, store in workers)
        os.kill(kernel.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
        pids = [int(pid) for pid, _ in workers]
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids)
    finally:
        client.stop_channels()
        kernel.cleanup_resources()
    # multiprocessing's own folder for the forkserver's socket (pymp-*) is Python's, not the
    # launch's; nothing else may be there.
    left = [p.name for p in scratch.iterdir() if not p.name.startswith("pymp-")]
    assert left == []
