"""Where a cluster="ray" launch spends its time, phase by phase (driver and actors).

Starts the same local 2-node cluster as ray_launch.py, launches the same all-reduce on 4 ranks
a few times, and prints a timeline per launch: the driver's steps (timed by wrapping the
backend's methods) and, for each rank, when its Ray worker process was born, when the actor
was built, when ``run`` started, when the function started and when the process group was up.
All times are seconds after notebook_launcher was called.

    python benchmarks/ray_phases.py
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


def _instrument_actor(ray_backend: Any) -> None:
    base = ray_backend._RankActor

    class Timed(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any) -> None:
            _stamp("init>")
            super().__init__(*args)
            _stamp("init<")

        def run(self, *args: Any) -> Any:
            _stamp("run>")
            return super().run(*args)

    ray_backend._RankActor = Timed


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
    """CPU seconds so far of this process and of the cluster's processes, by kind.

    The cluster's daemons name its session directory on their command lines; Ray's workers
    are the raylets' children (named ``ray::...``). A worker that ended counts in its
    raylet's children's time once reaped: "workers ended" (the agents are alive throughout).
    """
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[str, int, float, float]] = {}
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
        own = (int(fields[11]) + int(fields[12])) / tick
        ended = (int(fields[13]) + int(fields[14])) / tick
        procs[int(name)] = (command, int(fields[1]), own, ended)
    raylets = {p for p, (c, *_) in procs.items() if session in c and "raylet/raylet" in c}
    kinds: dict[str, float] = {}

    def add(kind: str, seconds: float) -> None:
        kinds[kind] = kinds.get(kind, 0.0) + seconds

    for pid, (command, parent, own, ended) in procs.items():
        if pid == os.getpid():
            add("driver", own)
        elif pid in raylets:
            add("raylets", own)
            add("workers ended", ended)
        elif parent in raylets and "Agent" not in command:
            add("workers alive", own)
        elif session in command or parent in raylets:
            add("ray daemons", own + ended)
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
            for k in ("born", "init>", "init<", "run>", "fn start", "pg init", "all_reduce")
        )
        cpu_row = "  ".join(f"{k[4:]} {v:4.2f}" for k, v in result.items() if k.startswith("cpu@"))
        print(f"  rank {rank}: {times}   (CPU s at {cpu_row})")
    if marks:
        print("  driver: " + "  ".join(f"{name} {at - start:.2f}" for name, at in marks))


def main() -> None:
    """Launch ``LAUNCHES`` times with each backend version named on the command line, in turn."""
    from notebook_accel.launch.ray_local import local_cluster

    shutil.rmtree(STAMPS, ignore_errors=True)
    cluster = local_cluster(num_nodes=2, num_cpus=2)
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    session = os.path.basename(cluster.head_node.get_session_dir_path())
    from notebook_accel import notebook_launcher
    from notebook_accel.launch import ray_backend

    # Other versions of the backend, e.g. a copy of main's: notebook_accel/launch/<name>.py
    names = [a for a in sys.argv[1:] if not a.startswith("-")] or ["ray_backend"]
    versions = {}
    for name in names:
        module = importlib.import_module(f"notebook_accel.launch.{name}")
        for method in ("_wait", "_supervise"):
            wrap(module.RayBackend, method)
        _instrument_actor(module)
        versions[name] = module.RayBackend
    previous: tuple[Any, ...] | None = None
    try:
        for launch in range(LAUNCHES):
            for name, backend in versions.items():
                ray_backend.RayBackend = backend
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
