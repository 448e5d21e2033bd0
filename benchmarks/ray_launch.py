"""Launch latency on a Ray cluster: notebook_launcher(cluster="ray") vs Ray Train's TorchTrainer.

A local cluster of 2 nodes (2 logical CPUs each, every address 127.0.0.1) runs 4 ranks of the
same function, which joins the gloo process group, all-reduces one tensor and returns. Each
launcher runs it once (first launch) and then again (repeated launches; nothing is kept
reserved between them), in this one process, one after the other.

    python benchmarks/ray_launch.py        # needs `pip install -e '.[bench]'` (ray[train])

Where our launch's time goes (benchmarks/ray_phases.py prints it phase by phase): on this
2-core machine it is CPU-bound, ~3.2 CPU s per rank, nearly all in fresh Ray worker processes:
booting one (``import ray``) ~1.7 CPU s, of which ~1.0 is jsonschema importing rfc3987_syntax
(a lark grammar built at import; installed with Jupyter's jsonschema[format-nongpl]), torch's
import ~1.3, Ray's lazy serializers (pydantic, pyarrow) after the first call ~0.25; the
placement group, rendezvous, payload, process group, function, results and teardown together
~0.1 s. Dropping the mailbox actor (a fifth worker process; with Ray starting 2 workers at a
time per node, one rank's process started seconds late) and asking for the actors with the
placement group rather than after it is ready (~0.7 s) took the launch from 5 processes to 4.
TorchTrainer starts more processes (its controller and one worker per rank, which also import
torch) and waits on its own steps.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

RANKS = 4
REPEATS = 3


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
    from notebook_accel.launch.ray_local import local_cluster

    cluster = local_cluster(num_nodes=2, num_cpus=2)
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    rows: dict[str, tuple[float, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as storage:
            for name, launch in (
                ("notebook_accel (cluster='ray')", ours),
                ("Ray Train TorchTrainer.fit()", torch_trainer(storage)),
            ):
                first = timed(launch)
                rows[name] = (first, [timed(launch) for _ in range(REPEATS)])
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"\nLaunch latency, {RANKS} ranks on a local 2-node Ray cluster (seconds)")
    print(f"{'launcher':34} {'first':>8} {'repeated (median)':>18}")
    for name, (first, again) in rows.items():
        print(f"{name:34} {first:8.2f} {statistics.median(again):18.2f}")
    (ours_first, ours_again), (peer_first, peer_again) = rows.values()
    print(
        f"{'ours / TorchTrainer':34} {ours_first / peer_first:8.2f} "
        f"{statistics.median(ours_again) / statistics.median(peer_again):18.2f}"
    )


if __name__ == "__main__":
    main()
