"""A hang, side by side: what this project's notebook_launcher, HF accelerate's and
Lightning's ``ddp_notebook`` show when rank 0 calls ``all_reduce`` while rank 1 calls
``broadcast`` (2 CPU processes, gloo), with each launcher's defaults (no timeout).

Each launcher runs in its own fresh Python process, all three at once (the hung ranks wait
in gloo and use no CPU). Each rank prints ``ready`` just before its collective; everything
the launcher's process shows on stdout and stderr is kept until ``--seconds`` (default 60,
our default ``stall_time``) plus 5 s after the last rank's ``ready`` (the issue's limit for
the report to arrive), then the launcher's processes are killed. Printed: each launcher's
output after the hang began, and a row each: how many lines it showed about the hang,
whether they name each rank's collective and line, and when the first came.

    python benchmarks/stall_peers.py             # needs the `bench` extra (accelerate, lightning)
    python benchmarks/stall_peers.py --seconds 10 --stall-time 10   # a quick look

Measured on 2026-12-05, this 2-core machine (load about 1), accelerate 1.15.0 (with 1.16.0
its launcher's ranks printed nothing in this child process), Lightning 2.6.6:

                                    ours  accelerate   lightning
    lines about the hang              38           0           0
    names each rank and line         yes          no          no
    first line after              61.8 s           -           -
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

LAUNCHERS = ("ours", "accelerate", "lightning")

_CHILD = """
import os, socket, sys
which, stall_time = sys.argv[1], float(sys.argv[2])

def mismatched():
    import torch, torch.distributed as dist
    if not dist.is_initialized():  # Lightning has made the group already
        dist.init_process_group("gloo")
    tensor = torch.ones(4)
    print("ready", flush=True)
    if dist.get_rank() == 0:
        dist.all_reduce(tensor)  # line 12 of the -c script: rank 0's collective
    else:
        dist.broadcast(tensor, 0)  # line 14: rank 1's

def free_port():
    with socket.socket() as probe:  # accelerate's default port, 29500, may be taken
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

if which == "ours":
    from notebook_accel import notebook_launcher
    notebook_launcher(mismatched, num_processes=2, hardware="cpu", stall_time=stall_time)
elif which == "accelerate":
    from accelerate import notebook_launcher
    notebook_launcher(mismatched, num_processes=2, use_port=str(free_port()))
else:
    from lightning.fabric import Fabric
    os.environ["MASTER_PORT"] = str(free_port())
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_notebook")
    fabric.launch(lambda fabric: mismatched())
"""


class Watched:
    """One launcher's process: its output lines as they come, with when each came."""

    def __init__(self, which: str, stall_time: float) -> None:
        self.which = which
        self.lines: list[tuple[float, str]] = []
        self.ready: list[float] = []  # when each rank's "ready" came
        environ = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, which, str(stall_time)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environ,
            cwd=Path(__file__).parent,
            start_new_session=True,  # its forked ranks go with it at the end
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            now = time.monotonic()
            text = line.rstrip("\n")
            # Forked ranks share the launcher's stdout: their "ready"s may share a line.
            self.ready += [now] * len(re.findall(r"\bready\b", text))
            self.lines.append((now, text))

    def hang_began(self) -> float | None:
        """When the last rank printed ``ready`` (both wait in their collectives from then)."""
        return max(self.ready) if len(self.ready) >= 2 else None

    def stop(self) -> None:
        # The process's session: accelerate's and Lightning's forked ranks; ours end with
        # their lifelines when the launcher's process does.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        self.process.wait()


def _about_the_hang(watched: Watched, until: float) -> list[tuple[float, str]]:
    """The lines after both ranks were ready, before the launcher was stopped."""
    begun = watched.hang_began()
    return [(t, line) for t, line in watched.lines if begun is not None and begun < t <= until]


def _names_lines(lines: list[str]) -> bool:
    """Whether the lines name rank 0's all_reduce and rank 1's broadcast with their lines."""
    text = "\n".join(lines)
    return bool(
        re.search(r"rank 0 in all_reduce at .*line 12", text)
        and re.search(r"rank 1 in broadcast at .*line 14", text)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--stall-time", type=float, default=60.0, help="ours: stall_time")
    parser.add_argument("--launchers", nargs="+", default=list(LAUNCHERS), choices=LAUNCHERS)
    args = parser.parse_args()
    watched = {which: Watched(which, args.stall_time) for which in args.launchers}
    limit = time.monotonic() + 300  # a launcher whose ranks never start is given up
    while time.monotonic() < limit:
        begun = [w.hang_began() for w in watched.values()]
        if all(b is not None for b in begun):
            latest = max(b for b in begun if b is not None)
            if time.monotonic() >= latest + args.seconds + 5:
                break
        time.sleep(0.2)
    until = time.monotonic()
    for each in watched.values():
        each.stop()
    window = args.seconds + 5
    print(f"rank 0 all_reduce, rank 1 broadcast; what each launcher showed in the {window:g} s")
    print("after both ranks printed 'ready':\n")
    rows = []
    for which, each in watched.items():
        shown = _about_the_hang(each, until)
        begun = each.hang_began()
        print(f"=== {which} ({len(shown)} lines)")
        for _, line in shown:
            print(f"  {line}")
        first = f"{shown[0][0] - begun:.1f} s" if shown and begun is not None else "-"
        rows.append((which, len(shown), _names_lines([line for _, line in shown]), first))
    print()
    print(f"{'':28}" + "".join(f"{which:>12}" for which, *_ in rows))
    print(f"{'lines about the hang':28}" + "".join(f"{n:>12}" for _, n, _, _ in rows))
    print(
        f"{'names each rank and line':28}"
        + "".join(f"{'yes' if named else 'no':>12}" for _, _, named, _ in rows)
    )
    print(f"{'first line after':28}" + "".join(f"{first:>12}" for *_, first in rows))


if __name__ == "__main__":
    main()
