"""Measuring helpers shared by the benchmarks: a rank's peak memory, and rotated rounds.

Peak memory is the kernel's resident-set high-water mark: ``echo 5 > /proc/self/clear_refs``
resets it to the current RSS, and ``VmHWM`` in /proc/self/status reads it back, so tensors
(which tracemalloc cannot see) are counted.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

from notebook_accel import debug_launcher

Result = tuple[list[float], int]  # a rank's step times (s) and its peak above the base (KiB)


def status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Restart the peak-RSS mark from the current RSS; returns that RSS (KiB)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return status_kib("VmRSS")


def peak_since(base_kib: int) -> int:
    """The peak RSS reached since ``reset_peak()`` returned ``base_kib``, above it (KiB)."""
    return status_kib("VmHWM") - base_kib


def run_rounds(
    variants: Mapping[str, Callable[[dict[str, Any]], Result]],
    names: list[str],
    cfg: dict[str, Any],
    rounds: int,
    warmup: int,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Launch each variant on 2 processes per round, rotating the order so none is always first.

    Returns per-round medians of ms/step (the slower rank) and peak MiB (the larger rank).
    """
    step_ms: dict[str, list[float]] = {name: [] for name in names}
    peak_mib: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            ranks = debug_launcher(variants[name], args=(cfg,), num_processes=2, output="none")
            step_ms[name].append(max(statistics.median(t[warmup:]) for t, _ in ranks) * 1e3)
            peak_mib[name].append(max(kib for _, kib in ranks) / 1024)
    return step_ms, peak_mib
