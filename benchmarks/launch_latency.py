"""Launch latency: this project's notebook_launcher vs HF accelerate's, side by side.

Each launcher runs, in a fresh Python process (as a fresh notebook kernel that has already
run ``import torch``), a function that initialises the process group on 2 CPU processes,
all-reduces one tensor and returns. Measured: the first launch, then the median of 10 warm
launches in the same process.

    python benchmarks/launch_latency.py            # needs `pip install accelerate`
"""

from __future__ import annotations

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
        assert notebook_launcher(work, num_processes=2, hardware="cpu", output="none") == [2.0, 2.0]
else:
    def launch():
        from accelerate import notebook_launcher
        notebook_launcher(work, num_processes=2)  # returns None: nothing to check here
first = timed(launch)
warm = [timed(launch) for _ in range(int(sys.argv[2]))]
print(json.dumps({"first": first, "warm": warm}))
"""


def measure(which: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, which, str(WARM)],
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
    ours = measure("ours")
    try:
        theirs: dict[str, float] | None = measure("accelerate")
    except (RuntimeError, ImportError) as exc:
        print(f"accelerate not measured: {exc}", file=sys.stderr)
        theirs = None
    print(f"launch latency, 2 CPU processes, init_process_group + all_reduce; median of {WARM}")
    print(f"{'':24}{'notebook_accel':>16}{'accelerate':>14}{'ratio':>9}")
    for key, label in (("first", "first launch (s)"), ("warm", "warm launch (s)")):
        other = theirs[key] if theirs else float("nan")
        print(f"{label:24}{ours[key]:16.3f}{other:14.3f}{ours[key] / other:9.2f}")
    print("targets: warm <= 0.5 x accelerate's; first launch <= 1.5 s")


if __name__ == "__main__":
    main()
