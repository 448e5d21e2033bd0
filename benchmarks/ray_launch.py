"""Launch latency on a Ray cluster: notebook_launcher(cluster="ray") vs Ray Train's TorchTrainer.

A local cluster of 2 nodes (2 logical CPUs each, every address 127.0.0.1) runs 4 ranks of the
same function, which joins the gloo process group, all-reduces one tensor and returns. Each
launcher runs it once (first launch), then again ``REPEATS`` times back to back, then
``REPEATS`` times after each of ``PAUSES`` seconds of idle (a user reading the output before
re-running the cell); nothing is kept reserved between launches. Everything runs in this one
process, one launcher after the other (``--only ours`` or ``--only trainer``: one of them).
It prints medians and, in brackets, the slowest repeat, and the load average around the run.

Why paused repeats: our ranks are Ray tasks, whose worker processes run the next launch's
ranks with torch imported. Idle, Ray ends a node's workers beyond its free CPUs after a
second, and the next launch's reservation takes those CPUs a moment before its ranks reach
the node; so between launches the workers wait busy in 0-CPU holds (parking.py). Both
launchers get the same pauses.

2026-12-04, 2-core machine shared with another engineer's runs (seconds; median of 5, max):
before parking (load 1.5 -> 0.9, 3.8 mid-run): ours 7.39 first, 0.21 (0.30) back to back,
0.25 (22.94) after 10 s, 0.18 (6.36) after 60 s: 2 of 10 paused repeats booted fresh
workers (the issue's 2026-12-03 figure: 3.23 s median of 3 after 10 s). After (load 2.4 ->
0.9): 11.60 first, 0.34 (0.40), 0.32 (0.34), 0.32 (0.32): no repeat booted a worker (4
holds throughout); back to back ~0.1 s slower than before (the holds asked for at each launch's end,
the next launch's wait for its group before cancelling them).
TorchTrainer (load 4.0 -> 5.2, up to 8): 28.58 first, 28.14 (28.95), 22.53 (24.67),
22.96 (29.56).

Quiet 2-core machine, 2026-12-01 (seconds, medians of 3), two runs: ours 5.13 / 4.77 first,
0.30 / 0.29 back to back, 0.22 / 0.22 after 10 s idle; TorchTrainer 32.69 / 27.56, 21.96 /
24.04, 22.95 / 22.82: ratios 0.16 / 0.17, 0.01, 0.01.

Before the ranks were tasks (one actor per rank; quiet, medians of 3): ours 5.62 first,
7.98 back to back, 7.54 after 10 s idle; TorchTrainer 29.29, 27.53, 24.19: ratios 0.19,
0.29, 0.31. Each repeated launch booted 4 fresh workers (~3.2 CPU s each on 2 cores).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

RANKS = 4
REPEATS = 5
PAUSES = (10.0, 60.0)  # seconds of idle before each paused repeat


def work() -> float:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():  # Ray Train has joined the group already; we have not
        dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def timed(launch: Callable[[], Any]) -> float:
    start = time.perf_counter()
    launch()
    return time.perf_counter() - start


def ours() -> None:
    from notebook_accel import notebook_launcher

    results = notebook_launcher(work, num_processes=RANKS, cluster="ray", output="none")
    assert results == [float(RANKS)] * RANKS, results


def torch_trainer(storage: str) -> Callable[[], None]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def launch() -> None:
        trainer = TorchTrainer(
            lambda: work(),
            scaling_config=ScalingConfig(num_workers=RANKS, use_gpu=False),
            run_config=RunConfig(storage_path=storage),
        )
        trainer.fit()

    return launch


def measure(launch: Callable[[], Any]) -> dict[str, list[float]]:
    """The launch's times: first, back to back, then after each pause (seconds)."""
    rows = {"first": [timed(launch)], "back to back": [timed(launch) for _ in range(REPEATS)]}
    for pause in PAUSES:
        paused = []
        for _ in range(REPEATS):
            time.sleep(pause)
            paused.append(timed(launch))
        rows[f"after {pause:g} s idle"] = paused
    return rows


def main() -> None:
    import argparse

    from notebook_accel.launch.cluster.ray.local import local_cluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--only", choices=("ours", "trainer"), help="time one launcher (default: both)"
    )
    only = parser.parse_args().only
    load = os.getloadavg()
    cluster = local_cluster(num_nodes=2, num_cpus=2)
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as storage:
            launchers = {
                "ours": ("notebook_accel (cluster='ray')", ours),
                "trainer": ("Ray Train TorchTrainer.fit()", torch_trainer(storage)),
            }
            for key, (name, launch) in launchers.items():
                if only in (None, key):
                    rows[name] = measure(launch)
    finally:
        ray.shutdown()
        cluster.shutdown()
    columns = list(next(iter(rows.values())))
    print(
        f"\nLaunch latency, {RANKS} ranks on a local 2-node Ray cluster (seconds; repeats: "
        f"median of {REPEATS}, max in brackets); load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in load)} before, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after"
    )
    print(f"{'launcher':34}" + "".join(f" {c:>18}" for c in columns))
    for name, times in rows.items():
        cells = [
            f"{statistics.median(t):.2f}" + (f" ({max(t):.2f})" if len(t) > 1 else "")
            for t in times.values()
        ]
        print(f"{name:34}" + "".join(f" {cell:>18}" for cell in cells))
    if len(rows) == 2:
        ours_row, peer_row = rows.values()
        ratios = "".join(
            f" {statistics.median(ours_row[c]) / statistics.median(peer_row[c]):18.2f}"
            for c in columns
        )
        print(f"{'ours / TorchTrainer (medians)':34}{ratios}")
    for name, times in rows.items():
        print(f"{name}: " + "; ".join(f"{c} {[round(x, 2) for x in t]}" for c, t in times.items()))


if __name__ == "__main__":
    main()
