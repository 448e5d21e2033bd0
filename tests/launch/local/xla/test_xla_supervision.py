"""The TPU path's supervision (launch/local/xla/engine.py), with a stand-in for torch_xla's
process pool.

torch_xla cannot be installed next to CI's torch, so ``xla_standin/`` (next to this file)
provides the few names notebook_accel calls: its ``run_multiprocess`` starts real processes
(spawned, as torch_xla's pool does) with a thread per device. Real processes, a fake library:
this checks our supervision, payload, output and errors, not torch_xla itself (test_xla.py
does, where torch_xla is installed).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from notebook_accel import env
from notebook_accel.config import LaunchConfig
from notebook_accel.hardware import Machine
from notebook_accel.launch import launch

STANDIN = str(Path(__file__).parent / "xla_standin")


def _tpu(cores: int) -> Machine:
    return Machine(cpu_cores=2, tpu_cores=cores, tpu_type="stand-in")


@pytest.fixture(autouse=True)
def _standin() -> Iterator[None]:
    """torch_xla is the stand-in for this module's tests only, here and in the workers."""
    assert "torch_xla" not in sys.modules, "a real torch_xla is loaded; these tests need none"
    sys.path.insert(0, STANDIN)
    try:
        with env.overridden({"PJRT_DEVICE": None, "STANDIN_XLA_DEVICES_PER_PROCESS": None}):
            yield
    finally:
        sys.path.remove(STANDIN)
        for name in [n for n in sys.modules if n == "torch_xla" or n.startswith("torch_xla.")]:
            del sys.modules[name]


def _fails_on_rank_one() -> None:
    import torch_xla.runtime as xr

    if xr.global_ordinal() == 1:
        raise KeyError("no such column on device 1")
    time.sleep(300)  # as a peer blocked in a collective that never returns


@pytest.mark.parametrize(
    ("variables", "layout"),
    [
        ({}, "one device per process (TPU v4)"),
        ({"PJRT_DEVICE": "CPU"}, "two device threads in one process (the CPU runtime)"),
    ],
)
def test_one_failing_device_stops_the_others(variables: dict[str, str], layout: str) -> None:
    config = LaunchConfig(hardware="tpu", num_processes=2, timeout=200)
    with env.overridden(variables), pytest.raises(KeyError, match="no such column") as info:
        launch(_fails_on_rank_one, (), None, config, machine=_tpu(2))
    assert "Traceback from rank 1" in str(info.value.__cause__), layout
    assert "raised on rank 1 of 2" in "".join(info.value.__notes__)


def test_results_come_back_in_ordinal_order_with_fresh_random_states() -> None:
    def draw() -> tuple[int, float]:
        import torch
        import torch_xla.runtime as xr

        return xr.global_ordinal(), torch.rand(1).item()

    config = LaunchConfig(hardware="tpu", num_processes=2)
    first = launch(draw, (), None, config, machine=_tpu(2))
    second = launch(draw, (), None, config, machine=_tpu(2))
    assert [ordinal for ordinal, _ in first] == [0, 1]
    assert len({value for _, value in first + second}) == 4


def _train_on_device_threads() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator

    acc = Accelerator()
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():  # the same initial weights on both devices (threads share the RNG)
        model.weight.fill_(0.1)
        model.bias.fill_(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.arange(16.0).view(8, 2), torch.ones(8, 1))
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=2, shuffle=True))
    seen = []
    for x, y in loader:
        seen.extend(x[:, 0].tolist())
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    acc.wait_for_everyone()
    everyone = acc.gather(torch.tensor(seen))
    return {
        "rank": acc.process_index,
        "world": acc.num_processes,
        "group": dist.is_initialized(),
        "wrapped": type(model).__name__,
        "seen": sorted(seen),
        "everyone": sorted(everyone.tolist()),
        "weight": model.weight.detach().flatten().tolist(),
    }


def test_accelerator_on_device_threads_without_a_process_group() -> None:
    # Several devices per process (TPU v2/v3, the CPU runtime): no torch.distributed group,
    # so no DDP; the loader, barrier, gather and gradient averaging use torch_xla's own
    # collectives between the threads.
    config = LaunchConfig(hardware="tpu", num_processes=2)
    with env.overridden({"PJRT_DEVICE": "CPU"}):
        results = launch(_train_on_device_threads, (), None, config, machine=_tpu(2))
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 and not r["group"] for r in results)
    assert all(r["wrapped"] == "Linear" for r in results)  # no DDP without a group
    assert not set(results[0]["seen"]) & set(results[1]["seen"])  # each its own shard
    assert results[0]["everyone"] == results[1]["everyone"] == [float(i) for i in range(0, 16, 2)]
    assert results[0]["weight"] == results[1]["weight"]  # gradients averaged: in step


def _one_device_waits() -> None:
    import os

    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    print("ready", flush=True)
    if xr.global_ordinal() == 0:
        xm.all_reduce(xm.REDUCE_SUM, torch.ones(2))  # <- device 0 waits
    else:
        read_end, _ = os.pipe()
        os.read(read_end, 1)  # <- device 1 reads


def test_a_stall_names_each_device_thread() -> None:
    # The CPU runtime: two device threads in one process, each one's stack in the report;
    # the process answers from its signal handler (no message pipe on this path).
    from tests.launch.stalls import Recorder, line_of, note_of

    display = Recorder()
    stop = display.stop
    config = LaunchConfig(hardware="tpu", num_processes=2, stall_time=3)
    with env.overridden({"PJRT_DEVICE": "CPU"}), pytest.raises(KeyboardInterrupt) as stopped:
        launch(_one_device_waits, (), None, config, machine=_tpu(2), display=display, stop=stop)
    assert display.waited is not None and display.waited <= 3 + 5, display.waited
    [text] = display.reports
    waits = line_of(_one_device_waits, "<- device 0 waits")
    reads = line_of(_one_device_waits, "<- device 1 reads")
    assert "ranks 0-1 (pid " in text, text
    assert "device thread 1 of 2: waiting in all_reduce" in text or (
        "device thread 2 of 2: waiting in all_reduce" in text
    ), text
    assert f'test_xla_supervision.py", line {waits}, in _one_device_waits' in text, text
    assert f'test_xla_supervision.py", line {reads}, in _one_device_waits' in text, text
    assert "notebook_accel/launch" not in text, text
    assert f"line {reads}" in note_of(stopped.value)
