"""Launch latency: this project's notebook_launcher vs HF accelerate's, side by side.

Each launcher runs, in a fresh Python process (as a fresh notebook kernel that has already
run ``import torch``), a function that initialises the process group on 2 CPU processes,
all-reduces one tensor and returns. Measured: the first launch, then the median of 10 warm
launches in the same process.

    python benchmarks/launch_latency.py            # needs `pip install accelerate`
    python benchmarks/launch_latency.py --num-processes 16 --breakdown

``--breakdown`` (ours only) splits a launch with 16 processes into: when the last worker
entered the function, and how long the process group took after that (the rendezvous
proper), once with the launch's private store (a FileStore on a memfd of the notebook
process, launch/rendezvous.py) and once with rank 0 hosting a TCPStore (torch's plain env://
way): the comparison says whether our store costs anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARM = 10

_CHILD = """
import json, statistics, sys, time
import torch  # the notebook imported torch already
N = int(sys.argv[3])

def work():
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()

def timed(launch):
    start = time.perf_counter()
    launch()
    return time.perf_counter() - start

which = sys.argv[1]
if which == "ours":
    def launch():
        from notebook_accel import notebook_launcher
        assert notebook_launcher(work, num_processes=N, hardware="cpu", output="none") == [N] * N
else:
    def launch():
        from accelerate import notebook_launcher
        notebook_launcher(work, num_processes=N)  # returns None: nothing to check here
first = timed(launch)
warm = [timed(launch) for _ in range(int(sys.argv[2]))]
print(json.dumps({"first": first, "warm": warm}))
"""


_BREAKDOWN = """
import socket, statistics, sys, time
from notebook_accel import notebook_launcher

def work(t0, own_store, port):
    import os, time
    import torch, torch.distributed as dist
    entered = time.time()
    if own_store:  # rank 0 hosts the store, as a bare env:// launch does
        del os.environ["NOTEBOOK_ACCEL_STORE"]  # env:// falls back to torch's own handler
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    done = time.time()
    dist.destroy_process_group()
    return entered - t0, done - t0

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

n, reps = int(sys.argv[1]), int(sys.argv[2])
notebook_launcher(lambda: 1, num_processes=n, hardware="cpu", output="none")  # warm
for label, own in (("private FileStore", False), ("TCPStore in rank 0", True)):
    last, group = [], []
    for _ in range(reps):
        t0 = time.time()
        res = notebook_launcher(work, args=(t0, own, free_port()), num_processes=n,
                                hardware="cpu", output="none")
        last.append(max(r[0] for r in res))
        group.append(max(r[1] for r in res) - last[-1])
    last_ms, group_ms = statistics.median(last) * 1000, statistics.median(group) * 1000
    print(f"{label:24}{last_ms:14.0f}{group_ms:18.0f}")
"""


def breakdown(num_processes: int) -> None:
    print(f"{num_processes} CPU processes, median of {WARM} warm launches (ms):")
    print(f"{'':24}{'last worker in':>14}{'group ready after':>18}")
    subprocess.run(
        [sys.executable, "-c", _BREAKDOWN, str(num_processes), str(WARM)], cwd=ROOT, check=True
    )


def measure(which: str, num_processes: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, which, str(WARM), str(num_processes)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{which} failed:\n{done.stderr[-3000:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return {"first": data["first"], "warm": statistics.median(data["warm"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--breakdown", action="store_true")
    options = parser.parse_args()
    if options.breakdown:
        breakdown(options.num_processes)
        return
    ours = measure("ours", options.num_processes)
    try:
        theirs: dict[str, float] | None = measure("accelerate", options.num_processes)
    except (RuntimeError, ImportError) as exc:
        print(f"accelerate not measured: {exc}", file=sys.stderr)
        theirs = None
    print(
        f"launch latency, {options.num_processes} CPU processes, init_process_group + "
        f"all_reduce; median of {WARM}"
    )
    print(f"{'':24}{'notebook_accel':>16}{'accelerate':>14}{'ratio':>9}")
    for key, label in (("first", "first launch (s)"), ("warm", "warm launch (s)")):
        other = theirs[key] if theirs else float("nan")
        print(f"{label:24}{ours[key]:16.3f}{other:14.3f}{ours[key] / other:9.2f}")
    print("targets: warm <= 0.5 x accelerate's; first launch <= 1.5 s")


if __name__ == "__main__":
    main()
