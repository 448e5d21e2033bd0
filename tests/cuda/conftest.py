"""The GPU suite: every test under ``tests/cuda`` is marked ``cuda`` and skipped without a GPU.

Run it on a GPU machine with ``python -m pytest -m cuda`` (the whole suite takes a few minutes
on one GPU); ``benchmarks/run_gpu_checks.sh`` sets up a virtual environment and runs it with
the GPU benchmark. On CI (no GPU) the files are collected and every test is skipped at once:
whether a GPU is there is asked of NVML through ``torch.cuda.device_count()``, which neither
initialises CUDA nor starts anything.

Fixtures for the files here (``test_cuda_*.py``):
    gpu_count        the number of visible GPUs (at least 1 inside a test)
    two_gpus         skips with a reason where fewer than 2 GPUs are visible
    capability       compute capability (major, minor) of GPU 0, read through NVML
    gpu_processes    ``() -> set[int]``: PIDs that hold a CUDA context on any GPU (NVML)
    settled          ``(expected, timeout) -> set[int]``: waits until gpu_processes() is
                     ``expected`` (contexts go away a moment after their process)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def visible_gpus() -> int:
    """Visible CUDA devices, counted through NVML without initialising CUDA (0 on CI)."""
    try:
        import torch
    except ImportError:
        return 0
    if not torch.version.cuda:
        return 0
    return int(torch.cuda.device_count())


@pytest.hookimpl(tryfirst=True)  # before `-m cuda` selects: the marker must be there
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if not mine:
        return
    skip = None
    if visible_gpus() == 0:
        skip = pytest.mark.skip(
            reason="no CUDA GPU visible (run `pytest -m cuda` on a GPU machine)"
        )
    for item in mine:
        item.add_marker(pytest.mark.cuda)
        if skip is not None:
            item.add_marker(skip)


def _nvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


@pytest.fixture
def gpu_count() -> int:
    return visible_gpus()


@pytest.fixture
def two_gpus(gpu_count: int) -> int:
    if gpu_count < 2:
        pytest.skip(f"needs 2 GPUs, {gpu_count} visible: NCCL across GPUs cannot be shown on one")
    return gpu_count


@pytest.fixture
def capability() -> tuple[int, int]:
    nvml = _nvml()
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(0))
    return int(major), int(minor)


@pytest.fixture
def gpu_processes() -> Callable[[], set[int]]:
    """PIDs with a CUDA context on any GPU, as the driver sees them.

    In a container the driver may report host PIDs; compare sets taken the same way (a
    baseline before, the same set after) rather than looking for one's own PID.
    """
    nvml = _nvml()

    def pids() -> set[int]:
        found: set[int] = set()
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                found.update(p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            except nvml.NVMLError:
                pass  # not supported here (some sandboxes): seen as no process
        return found

    return pids


@pytest.fixture
def settled(gpu_processes: Callable[[], set[int]]) -> Callable[[set[int], float], set[int]]:
    def wait(expected: set[int], timeout: float = 15.0) -> set[int]:
        deadline = time.monotonic() + timeout
        now = gpu_processes()
        while now != expected and time.monotonic() < deadline:
            time.sleep(0.2)
            now = gpu_processes()
        return now

    return wait
