"""Cost of ``Accelerator.log`` once per iteration, 2 processes, beside accelerate's and the floor.

In each worker of a 2-process CPU launch, for each of three tiny torch workloads, the same loop
runs without ``log`` and with ``accelerator.log({"loss": ..., "lr": ...}, step=i)`` on every
iteration (no tracker: the rows go to the live chart in the notebook, thinned and batched a
few times a second). Beside them:

- **floor**: the loop calling an empty Python method with the same arguments. Building the
  values dict and making one Python call is what any ``log`` costs before it does anything;
  on a 2.5 us op that alone is several percent, so no implementation can be within 3 % there.
- **accelerate log**: HF accelerate's ``Accelerator.log`` with no tracker (it does nothing,
  but through its main-process decorator), when accelerate is installed.

Workloads: ``x.add_(1.0)`` on 16 floats (the cheapest op torch has: its dispatcher alone),
a ``Linear(32, 32)`` forward on 8 rows, and a tiny training step (that forward, a backward and
an SGD step). The loops alternate ``REPEATS`` times so drift hits each alike; the fastest of
each is printed (as timeit does: slower runs measure the machine's other work), for rank 0,
the process that logs (``log`` is a no-op on the others, as in accelerate).

Quiet 2-core machine, 2026-11-30 (rank 0, fastest of 9, extra per iteration vs no log):

    workload (us per op)      floor (empty method)   notebook_accel log   accelerate log
    x.add_ 16 floats (2.55)   +7.6 %  +193 ns        +13.0 %  +331 ns     +111 %  +2829 ns
    Linear forward  (7.91)    +2.9 %  +225 ns         +6.0 %  +474 ns     +45 %   +3544 ns
    training step (173)       within noise            +0.5 %  +950 ns     +3.3 %  +5788 ns

The issue's target (<= 3 %) holds for the training step. On the bare ops no ``log`` can meet
it: building the values dict and one method call cost more than 3 % of a 2.5 us op. Ours adds
~140-250 ns to that floor: the main-process check, the call count, the latest values, and the
relay's batching (a few sends a second, each of at most ~256 thinned rows).

Run: ``python benchmarks/log_overhead.py``
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# iterations per loop: 100k as the issue asks; the training step is ~50x slower per
# iteration, so 10k of them already run 20x longer than the 100k adds
WORKLOADS = {"x.add_(1.0), 16 floats": 100_000, "Linear(32, 32) forward": 100_000}
STEP_WORKLOAD = "tiny training step"
STEP_ITERATIONS = 10_000
REPEATS = 9


def _workloads() -> dict[str, tuple[Callable[[], Any], int]]:
    import torch

    x = torch.zeros(16)
    layer = torch.nn.Linear(32, 32)
    rows = torch.randn(8, 32)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1e-3)

    def add() -> None:
        x.add_(1.0)

    def forward() -> None:
        layer(rows)

    def step() -> None:
        layer(rows).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    ops = [add, forward]
    out = {name: (op, n) for (name, n), op in zip(WORKLOADS.items(), ops, strict=True)}
    out[STEP_WORKLOAD] = (step, STEP_ITERATIONS)
    return out


class _Empty:
    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: Any = None) -> None:
        pass


def _bare(op: Callable[[], Any], n: int) -> Callable[[], None]:
    def loop() -> None:
        for _ in range(n):
            op()

    return loop


def _logged(logger: Any, op: Callable[[], Any], n: int) -> Callable[[], None]:
    def loop() -> None:
        for i in range(n):
            op()
            logger.log({"loss": 0.5, "lr": 1e-3}, step=i)

    return loop


def measure(repeats: int) -> dict[str, dict[str, float]]:
    """In a worker: median seconds of each loop, per workload."""
    import torch

    from notebook_accel import Accelerator

    torch.set_num_threads(1)
    loggers: dict[str, Any] = {
        "floor (empty method)": _Empty(),
        "notebook_accel log": Accelerator(),
    }
    try:
        import accelerate

        loggers["accelerate log"] = accelerate.Accelerator(cpu=True)
    except ImportError:
        pass

    results: dict[str, dict[str, float]] = {}
    for workload, (op, n) in _workloads().items():
        loops = {"no log": _bare(op, n)} | {
            name: _logged(lg, op, n) for name, lg in loggers.items()
        }
        times: dict[str, list[float]] = {name: [] for name in loops}
        for _ in range(repeats):
            for name, loop in loops.items():
                start = time.perf_counter()
                loop()
                times[name].append(time.perf_counter() - start)
        results[workload] = {name: min(t) for name, t in times.items()}
    return results


def main() -> None:
    from notebook_accel.launch import debug_launcher
    from notebook_accel.launch.show.charts import last_metrics

    ranks = debug_launcher(measure, args=(REPEATS,), num_processes=2)
    rows = len(last_metrics())
    iterations = WORKLOADS | {STEP_WORKLOAD: STEP_ITERATIONS}
    print(f"\nOne log per iteration, 2 processes, rank 0, fastest of {REPEATS}:")
    for workload, n in iterations.items():
        worst = ranks[0][workload]
        base = worst["no log"]
        print(f"{workload} ({n:,} iterations, {base / n * 1e6:.2f} us each without log)")
        for name, seconds in worst.items():
            extra = (seconds - base) / n * 1e9
            print(
                f"  {name:<22}{seconds:>9.4f} s  {(seconds / base - 1) * 100:+6.1f}%"
                f"  {extra:+6.0f} ns per iteration"
            )
    print(f"rows that reached the notebook from rank 0: {rows:,} (thinned to ~1000 a second)")


if __name__ == "__main__":
    main()
