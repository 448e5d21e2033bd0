"""Hardware detection without CUDA: a stand-in nvidia-smi on PATH plays the driver."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from notebook_accel import hardware
from notebook_accel.config import LaunchConfig


@pytest.fixture
def fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        "echo '0, GPU-aaa, NVIDIA H100 80GB HBM3, 9.0'\n"
        "echo '1, GPU-bbb, NVIDIA H100 80GB HBM3, 9.0'\n"
        "echo '2, GPU-ccc, NVIDIA H100 80GB HBM3, 9.0'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_cpu_only_machine_resolves_to_gloo() -> None:
    machine = hardware.detect()
    assert machine.cuda_count == 0 and machine.cpu_cores >= 1
    plan = hardware.resolve(LaunchConfig(), machine)
    assert (plan.hardware, plan.backend, plan.num_processes) == ("cpu", "gloo", 2)
    assert plan.describe() == "Launching 2 processes on CPU (gloo)"


def test_gpus_are_counted_through_nvidia_smi(
    fake_gpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = hardware.detect()
    assert machine.cuda_count == 3 and machine.cuda_bf16 is True
    plan = hardware.resolve(LaunchConfig(), machine)
    assert (plan.hardware, plan.backend, plan.num_processes) == ("cuda", "nccl", 3)
    assert plan.describe() == "Launching 3 processes on 3 CUDA GPUs (nccl)"
    assert [k.describe(machine) for k in hardware.kinds(machine)][0] == "CUDA, 3 × H100 80GB HBM3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-aaa")
    assert hardware.detect().cuda_count == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert hardware.detect().cuda_count == 0


def test_cuda_is_not_initialised_by_detection(fake_gpus: None) -> None:
    import torch

    hardware.detect()
    assert not torch.cuda.is_initialized()
