"""Launch latency on a Ray cluster: notebook_launcher(cluster="ray") vs Ray Train's TorchTrainer.

A local cluster of 2 nodes (2 logical CPUs each, every address 127.0.0.1) runs 4 ranks of the
same function, which joins the gloo process group, all-reduces one tensor and returns. Each
launcher runs it once (first launch), then again ``REPEATS`` times back to back, then
``REPEATS`` times more, each after ``PAUSE`` seconds of idle (a user reading the output before
re-running the cell); nothing is kept reserved between launches. Everything runs in this one
process, one launcher after the other.

Why both kinds of repeat: our ranks are Ray tasks, whose worker processes go back to Ray's
pool and run the next launch's ranks with torch imported. Back to back they are still
there; after a pause, Ray may end a node's idle workers that have waited over a second when
the next launch's reservation takes their CPUs before the rank's request reaches that node
(seen once in 3 paused repeats in a trial, never in 6 in another; those ranks then start
fresh). Both launchers get the same pauses.

Quiet 2-core machine, 2026-12-01 (seconds, medians of 3), two runs: ours 5.13 / 4.77 first,
0.30 / 0.29 back to back, 0.22 / 0.22 after 10 s idle; TorchTrainer 32.69 / 27.56, 21.96 /
24.04, 22.95 / 22.82: ratios 0.16 / 0.17, 0.01, 0.01.

Before the ranks were tasks (one actor per rank; quiet, medians of 3): ours 5.62 first,
7.98 back to back, 7.54 after 10 s idle; TorchTrainer 29.29, 27.53, 24.19: ratios 0.19,
0.29, 0.31. Each repeated launch booted 4 fresh workers (~3.2 CPU s each on 2 cores).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

RANKS = 4
REPEATS = 3
PAUSE = 10.0


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


def main() -> None:
    from notebook_accel.launch.cluster.ray.local import local_cluster

    cluster = local_cluster(num_nodes=2, num_cpus=2)
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    rows: dict[str, tuple[float, list[float], list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as storage:
            for name, launch in (
                ("notebook_accel (cluster='ray')", ours),
                ("Ray Train TorchTrainer.fit()", torch_trainer(storage)),
            ):
                first = timed(launch)
                again = [timed(launch) for _ in range(REPEATS)]
                paused = []
                for _ in range(REPEATS):
                    time.sleep(PAUSE)
                    paused.append(timed(launch))
                rows[name] = (first, again, paused)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"\nLaunch latency, {RANKS} ranks on a local 2-node Ray cluster (seconds, medians)")
    print(f"{'launcher':34} {'first':>8} {'back to back':>14} {f'after {PAUSE:g} s idle':>17}")
    for name, (first, again, paused) in rows.items():
        print(
            f"{name:34} {first:8.2f} {statistics.median(again):14.2f}"
            f" {statistics.median(paused):17.2f}"
        )
    ours_row, peer_row = rows.values()
    ratios = [ours_row[0] / peer_row[0]] + [
        statistics.median(o) / statistics.median(p)
        for o, p in zip(ours_row[1:], peer_row[1:], strict=True)
    ]
    print(f"{'ours / TorchTrainer':34} {ratios[0]:8.2f} {ratios[1]:14.2f} {ratios[2]:17.2f}")


if __name__ == "__main__":
    main()
