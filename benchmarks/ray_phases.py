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
import os
import time
import types
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


def _cpu_by_kind() -> dict[str, float]:
    """CPU seconds so far of this process and every process below it, by kind.

    A process that ended counts in its parent's children's time once the parent reaped it:
    Ray's workers in their raylet's, shown as "workers ended".
    """
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            parents[int(name)] = int(fields[1])
            stats[int(name)] = [command, *fields]
    tree = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    kinds: dict[str, float] = {}
    for pid in tree:
        command, *fields = stats[pid]
        own = (int(fields[11]) + int(fields[12])) / tick
        ended = (int(fields[13]) + int(fields[14])) / tick
        if pid == os.getpid():
            kind = "driver (notebook)"
        elif "default_worker" in command:
            kind = "workers alive"
        elif "raylet" in command:
            kind = "raylets"
            kinds["workers ended"] = kinds.get("workers ended", 0.0) + ended
            ended = 0.0
        else:
            kind = "ray system (gcs, agents)"
        kinds[kind] = kinds.get(kind, 0.0) + own + ended
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


def main() -> None:
    from notebook_accel.launch.ray_local import local_cluster

    cluster = local_cluster(num_nodes=2, num_cpus=2)
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    from notebook_accel import notebook_launcher
    from notebook_accel.launch import ray_backend

    for name in (
        "plan",
        "prepare",
        "run",
        "close",
        *[n for n in vars(ray_backend.RayBackend) if n.startswith("_") and not n.startswith("__")],
    ):
        if isinstance(vars(ray_backend.RayBackend).get(name), types.FunctionType):
            wrap(ray_backend.RayBackend, name)
    _instrument_actor(ray_backend)
    try:
        for launch in range(LAUNCHES):
            marks.clear()
            before = _cpu_by_kind()
            start = time.time()
            results = notebook_launcher(work, num_processes=RANKS, cluster="ray", output="none")
            end = time.time()
            time.sleep(3)  # the killed actors' processes end and are reaped
            after = _cpu_by_kind()
            print(f"\nlaunch {launch}: {end - start:.2f} s")
            print(
                "  CPU s during the launch and 3 s after: "
                + ", ".join(f"{k} {after[k] - before.get(k, 0):.2f}" for k in sorted(after))
            )
            seen: dict[str, int] = {}
            for name, at in marks:
                if name.startswith("_relay") or name.startswith("_outcome"):
                    seen[name] = seen.get(name, 0) + 1
                    if seen[name] > 1:
                        continue
                print(f"  {at - start:7.2f}  driver {name}")
            for rank, result in enumerate(results):
                row = "  ".join(
                    f"{k} {v - (0 if k.startswith('cpu') else start):6.2f}"
                    for k, v in result.items()
                )
                print(f"  rank {rank}: {row}")
            print(
                f"  relay calls {seen.get('_relay >', 0)}, outcome calls {seen.get('_outcome >', 0)}"
            )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
