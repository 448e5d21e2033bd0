"""Cost of a progress bar on a 100,000-iteration loop inside a launched worker.

Side by side, in the same worker process (launched with ``debug_launcher`` on 1 process):
no bar, plain ``tqdm.tqdm`` (text to the worker's stderr pipe), and ``notebook_accel.tqdm``
(throttled messages to the parent, which draws the bar). Two loop bodies: a tiny torch op
(a realistic "fast step") and a bare Python addition (the worst case for any bar).

Run: ``python benchmarks/progress_overhead.py``
"""

from __future__ import annotations

import statistics
import time
from typing import Any

N = 100_000
REPEATS = 7


def measure(n: int, repeats: int) -> dict[str, dict[str, float]]:
    """In the worker: median seconds per (body, bar) over ``repeats`` runs."""
    import os

    import torch
    import tqdm as plain

    from notebook_accel.reporting import progress

    x = torch.zeros(16)

    def torch_step(i: int) -> None:
        x.add_(1.0)

    def python_step(i: int) -> None:
        pass

    # A plain tqdm in a worker writes its redraws to the relayed stderr pipe; a file write
    # costs the same, without flooding this benchmark's output with them.
    sink = open(os.devnull, "w")  # noqa: SIM115  (lives as long as the worker)
    bars: dict[str, Any] = {
        "no bar": lambda it: it,
        "tqdm.tqdm": lambda it: plain.tqdm(it, file=sink, mininterval=0.1),
        "notebook_accel.tqdm": lambda it: progress.tqdm(
            it, desc="notebook_accel.tqdm", leave=False
        ),
    }
    out: dict[str, dict[str, float]] = {}
    for body_name, body in (("tiny torch op", torch_step), ("bare Python", python_step)):
        times: dict[str, list[float]] = {name: [] for name in bars}
        for _ in range(repeats):
            for name, wrap in bars.items():  # interleaved, so drift hits all three alike
                start = time.perf_counter()
                for i in wrap(range(n)):
                    body(i)
                times[name].append(time.perf_counter() - start)
        out[body_name] = {name: statistics.median(t) for name, t in times.items()}
    return out


def parent_draw_cost(messages: int = 2000) -> tuple[float, float]:
    """Seconds per Progress message drawn by the parent's display: ours, and a plain tqdm
    update for the same bar (the peer: what drawing the bar costs anyway)."""
    import io

    import tqdm as plain

    from notebook_accel.launch.show.display import Display
    from notebook_accel.reporting.channel import Progress

    display = Display()
    display.stderr = io.StringIO()
    start = time.perf_counter()
    for i in range(messages):
        display.progress(0, Progress(bar=1, n=i, total=messages, desc="fast"))
    display.close()
    ours = (time.perf_counter() - start) / messages
    bar = plain.tqdm(total=messages, file=io.StringIO(), mininterval=0)
    start = time.perf_counter()
    for _ in range(messages):
        bar.update()
    bar.close()
    return ours, (time.perf_counter() - start) / messages


def main() -> None:
    from notebook_accel.launch import debug_launcher

    (figures,) = debug_launcher(measure, args=(N, REPEATS), num_processes=1)
    print(f"\n{N:,} iterations, median of {REPEATS}, in a launched worker (seconds):")
    print(
        f"{'loop body':<16}{'no bar':>10}{'tqdm.tqdm':>12}{'ours':>10}"
        f"{'tqdm vs none':>14}{'ours vs none':>14}"
    )
    for body, row in figures.items():
        base = row["no bar"]
        print(
            f"{body:<16}{base:>10.4f}{row['tqdm.tqdm']:>12.4f}"
            f"{row['notebook_accel.tqdm']:>10.4f}"
            f"{(row['tqdm.tqdm'] / base - 1) * 100:>13.1f}%"
            f"{(row['notebook_accel.tqdm'] / base - 1) * 100:>13.1f}%"
        )
    ours, tqdm_update = parent_draw_cost()
    print(
        f"\nparent: drawing one Progress message {ours * 1e6:.0f} us "
        f"(a plain tqdm redraw: {tqdm_update * 1e6:.0f} us); workers send ~10/s per bar"
    )


if __name__ == "__main__":
    main()
