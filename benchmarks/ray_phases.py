"""Where a cluster="ray" launch spends its time, phase by phase (driver and ranks).

Starts the same local 2-node cluster as ray_launch.py and launches the same all-reduce on 4
ranks a few times, back to back. Per launch it prints, in seconds after notebook_launcher was
called: for each rank, when its Ray worker process was born (/proc; before the call when Ray
reused it), when its task began, when the function began and when its process group was up;
the driver's steps (supervising the ranks, their end, the wait for the group's resources);
the CPU seconds each rank's process had used at those points, and the driver's and Ray
daemons' CPU.

    python benchmarks/ray_phases.py                         # this version of the backend
    python benchmarks/ray_phases.py driver_old driver
        # in turn with a copy of another version in notebook_accel/launch/cluster/ray/driver_old.py

What it showed (4 ranks, 2 nodes of 2 logical CPUs, 2 shared cores; a launch is CPU-bound):
per rank, booting a Ray worker costs ~1.7 CPU s (``import ray``; ~1.0 of it is jsonschema
importing rfc3987_syntax, which builds a lark grammar at import, in any environment with
Jupyter's jsonschema[format-nongpl]), importing torch ~1.3 CPU s, and Ray's own work after
an actor's first call ~0.25 CPU s; notebook_accel's modules ~0.05, the rendezvous, payload,
process group, function, result and teardown ~0.1 s of wall time together. Before
(a mailbox actor, placement group awaited first): a fifth worker process to boot per launch,
which on a node that starts 2 workers at a time made one rank's worker start seconds late
(every rank waits for the slowest), and ~0.7 s waiting for the group before asking for
actors. After: 4 processes, all asked for at once. Then (2026-12-01) the ranks became Ray
tasks: a launch after another runs in the same 4 worker processes, torch imported, and
the boot above is paid by the first launch only.
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import sys
import time
from typing import Any

RANKS = 4
LAUNCHES = 3

marks: list[tuple[str, float]] = []


def mark(name: str) -> None:
    marks.append((name, time.time()))


def _process_birth() -> float:
    """This process's start time (epoch seconds), from /proc."""
    with open("/proc/stat") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


STAMPS = "/tmp/ray_phases_stamps"


def _stamp(name: str) -> None:
    import os
    import time

    os.makedirs(STAMPS, exist_ok=True)
    with open(f"{STAMPS}/{os.getpid()}", "a") as f:
        f.write(f"{name} {time.time()} {time.process_time()}\n")


def _actor_marks() -> dict[str, float]:
    import os

    with open(f"{STAMPS}/{os.getpid()}") as f:
        return {k: float(v) for k, v, _ in (line.split() for line in f)}


def _actor_cpu() -> dict[str, float]:
    import os

    with open(f"{STAMPS}/{os.getpid()}") as f:
        return {k: float(c) for k, _, c in (line.split() for line in f)}


def _instrument_rank(ray_driver: Any) -> None:
    """Stamp when each rank's task begins (the worker process existed and imported Ray)."""
    base = ray_driver.rank_task

    def timed_rank(*args: Any) -> Any:
        _stamp("task>")
        yield from base(*args)

    ray_driver.rank_task = timed_rank  # pickled by value: the stamp travels, base by reference


def work() -> dict[str, float]:
    import time

    entered = time.time()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    joined = time.time()
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == float(RANKS)
    _stamp("fn")
    return {
        **{f"cpu@{k}": v for k, v in _actor_cpu().items()},
        **_actor_marks(),
        "born": _process_birth(),
        "fn start": entered,
        "pg init": joined,
        "all_reduce": time.time(),
    }


def _cpu_by_kind(session: str) -> dict[str, float]:
    """CPU seconds so far of this process and of the cluster's daemons (not its workers).

    The daemons name the cluster's session directory on their command lines, or are a
    raylet's agents. The workers' own CPU is in the rank rows: a killed worker's is gone.
    """
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[str, int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        procs[int(name)] = (command, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    raylets = {p for p, (c, *_) in procs.items() if session in c and "raylet/raylet" in c}
    kinds = {"driver": 0.0, "raylets": 0.0, "other ray daemons": 0.0}
    for pid, (command, parent, own) in procs.items():
        if pid == os.getpid():
            kinds["driver"] += own
        elif pid in raylets:
            kinds["raylets"] += own
        elif session in command or (parent in raylets and "Agent" in command):
            kinds["other ray daemons"] += own
    return kinds


def wrap(owner: Any, name: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        mark(f"{name} >")
        try:
            return original(*args, **kwargs)
        finally:
            mark(f"{name} <")

    setattr(owner, name, timed)


def _show(
    label: str, wall: float, cpu: dict[str, float], results: list[dict[str, float]], start: float
) -> None:
    print(f"\n{label}: {wall:.2f} s")
    print(
        "  CPU s until the next launch starts: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
    )
    for rank, result in enumerate(results):
        times = "  ".join(
            f"{k} {result[k] - start:5.2f}"
            for k in ("born", "task>", "fn start", "pg init", "all_reduce")
        )
        cpu_row = "  ".join(f"{k[4:]} {v:4.2f}" for k, v in result.items() if k.startswith("cpu@"))
        print(f"  rank {rank}: {times}   (CPU s at {cpu_row})")
    if marks:
        print("  driver: " + "  ".join(f"{name} {at - start:.2f}" for name, at in marks))


def main() -> None:
    """Launch ``LAUNCHES`` times with each backend version named on the command line, in turn."""
    from notebook_accel.launch.cluster.ray.local import local_cluster

    shutil.rmtree(STAMPS, ignore_errors=True)
    cluster = local_cluster(num_nodes=2, num_cpus=2)
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    session = os.path.basename(cluster.head_node.get_session_dir_path())
    from notebook_accel import notebook_launcher
    from notebook_accel.launch.cluster.ray import driver as ray_driver

    # Other versions of the driver, e.g. a copy of main's in launch/cluster/ray/<name>.py
    names = [a for a in sys.argv[1:] if not a.startswith("-")] or ["driver"]
    versions = {}
    for name in names:
        module = importlib.import_module(f"notebook_accel.launch.cluster.ray.{name}")
        for method in ("_supervise", "_end", "_until_returned"):
            wrap(module.RayBackend, method)
        _instrument_rank(module)
        versions[name] = module.RayBackend
    previous: tuple[Any, ...] | None = None
    try:
        for launch in range(LAUNCHES):
            for name, backend in versions.items():
                ray_driver.RayBackend = backend
                cpu = _cpu_by_kind(session)
                if previous is not None:
                    _show(*previous[:2], _cpu_delta(previous[2], cpu), *previous[3:])
                marks.clear()
                start = time.time()
                results = notebook_launcher(work, num_processes=RANKS, cluster="ray", output="none")
                previous = (f"{name}, launch {launch}", time.time() - start, cpu, results, start)
        time.sleep(3)
        assert previous is not None
        _show(*previous[:2], _cpu_delta(previous[2], _cpu_by_kind(session)), *previous[3:])
    finally:
        ray.shutdown()
        cluster.shutdown()


def _cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after)}


if __name__ == "__main__":
    main()
