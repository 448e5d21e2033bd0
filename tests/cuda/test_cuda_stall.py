"""The stall report on GPUs: a CUDA rank blocked in C code answers; with NCCL, the flight
recorder's last collectives join the report (two GPUs; not run yet, see README)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from notebook_accel import env
from notebook_accel.config import LaunchConfig
from notebook_accel.launch import launch
from tests.launch.stalls import Recorder, line_of, note_of

STALL = 3.0


def _blocked_on_a_gpu() -> None:
    import torch

    torch.ones(4, device="cuda").sum().item()  # a CUDA context, used
    print("ready", flush=True)
    read_end, _ = os.pipe()
    os.read(read_end, 1)  # <- nobody writes


def test_a_cuda_rank_blocked_in_c_code_says_its_line(gpu_count: int) -> None:
    display = Recorder()
    config = LaunchConfig(num_processes=1, hardware="cuda", stall_time=STALL)
    with pytest.raises(KeyboardInterrupt) as stopped:
        launch(_blocked_on_a_gpu, (), None, config, display=display, stop=display.stop)
    assert display.waited is not None and display.waited <= STALL + 5, display.waited
    [text] = display.reports
    line = line_of(_blocked_on_a_gpu, "<- nobody writes")
    assert "rank 0 (pid " in text and f"test_cuda_stall.py, line {line}" in text, text
    assert f"line {line}" in note_of(stopped.value)


def _nccl_mismatched() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    tensor = torch.ones(4, device="cuda")
    dist.all_reduce(tensor)  # one that completes: the recorder's entries start here
    torch.cuda.synchronize()
    print("ready", flush=True)
    if rank == 0:
        dist.all_reduce(tensor)
    else:
        dist.broadcast(tensor, 0)
    torch.cuda.synchronize()  # <- NCCL's kernels never end


def test_the_nccl_flight_recorder_joins_the_report(two_gpus: int) -> None:
    display = Recorder()
    config = LaunchConfig(num_processes=2, hardware="cuda", stall_time=STALL)
    recorder: dict[str, Any] = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}
    with env.overridden(recorder), pytest.raises(KeyboardInterrupt):
        launch(_nccl_mismatched, (), None, config, display=display, stop=display.stop)
    assert display.waited is not None and display.waited <= STALL + 5, display.waited
    [text] = display.reports
    line = line_of(_nccl_mismatched, "<- NCCL's kernels never end")
    assert text.count(f"test_cuda_stall.py, line {line}") >= 2, text
    assert "the flight recorder's last collectives: " in text, text
    assert "nccl:all_reduce" in text and "nccl:broadcast" in text, text
