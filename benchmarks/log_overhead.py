"""Cost of ``Accelerator.log`` once per iteration on a 100,000-iteration loop, 2 processes.

In each worker of a 2-process CPU launch: the same loop of a tiny torch op, without and with
``accelerator.log({"loss": ..., "step_value": ...}, step=i)`` on every iteration (no tracker:
the rows go to the live chart in the notebook, batched a few times a second). The two loops
alternate ``REPEATS`` times, so drift hits both alike; the median of each is printed for the
slower rank, with HF accelerate's ``log`` (no tracker: it does nothing) beside it when
installed.

Run: ``python benchmarks/log_overhead.py``
"""

from __future__ import annotations

import statistics
import time

N = 100_000
REPEATS = 7


def measure(n: int, repeats: int) -> dict[str, float]:
    """In a worker: median seconds of each loop."""
    import torch

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    x = torch.zeros(16)

    def bare() -> None:
        for _ in range(n):
            x.add_(1.0)

    def logged() -> None:
        for i in range(n):
            x.add_(1.0)
            accelerator.log({"loss": 0.5, "lr": 1e-3}, step=i)

    loops = {"no log": bare, "notebook_accel log": logged}
    try:
        import accelerate

        theirs = accelerate.Accelerator(cpu=True)

        def accelerate_logged() -> None:
            for i in range(n):
                x.add_(1.0)
                theirs.log({"loss": 0.5, "lr": 1e-3}, step=i)

        loops["accelerate log"] = accelerate_logged
    except ImportError:
        pass
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(repeats):
        for name, loop in loops.items():
            start = time.perf_counter()
            loop()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    from notebook_accel.launch import debug_launcher
    from notebook_accel.launch.charts import last_metrics

    ranks = debug_launcher(measure, args=(N, REPEATS), num_processes=2)
    rows = len(last_metrics())
    print(f"\n{N:,} iterations of x.add_(1.0), median of {REPEATS}, slower of 2 ranks (seconds):")
    names = list(ranks[0])
    worst = {name: max(r[name] for r in ranks) for name in names}
    base = worst["no log"]
    for name in names:
        extra = (worst[name] - base) / N * 1e9
        print(
            f"  {name:<22}{worst[name]:>9.4f}   {(worst[name] / base - 1) * 100:+6.1f}%"
            f"   {extra:+6.0f} ns per iteration"
        )
    print(f"rows that reached the notebook: {rows:,} (rank 0 logs {N * REPEATS:,} times")
    print("  in total; last_metrics() keeps the rows of the last launch)")


if __name__ == "__main__":
    main()
