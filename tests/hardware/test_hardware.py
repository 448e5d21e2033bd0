"""Hardware detection with stand-ins: a fake ``pynvml`` plays the NVIDIA driver, environment
variables and a stand-in ``torch_xla`` play a TPU VM. Nothing here depends on the host's own
hardware, so it passes on a GPU machine as on CI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from notebook_accel import hardware
from notebook_accel.config import LaunchConfig
from notebook_accel.errors import ConfigError
from notebook_accel.hardware import gpu as hardware_gpu
from notebook_accel.hardware import tpu as hardware_tpu

FAKE_NVML = Path(__file__).parent / "fake_nvml"
H100 = {"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0]}
THREE_H100 = [
    dict(H100, uuid="GPU-aaaa1111-0000"),
    dict(H100, uuid="GPU-bbbb2222-0000"),
    dict(H100, uuid="GPU-bbbb3333-0000"),
]
A100_MIG = {
    "name": "NVIDIA A100-SXM4-80GB",
    "uuid": "GPU-cccc4444-0000",
    "cc": [8, 0],
    "mig": [
        {"uuid": "MIG-1111aaaa", "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "gi": 1, "ci": 0},
        {"uuid": "MIG-2222bbbb", "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "gi": 2, "ci": 0},
    ],
}

Driver = Callable[..., hardware.Machine]


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Driver:
    """``driver(gpus, visible=None)`` -> what detect() finds on such a machine."""
    monkeypatch.syspath_prepend(str(FAKE_NVML))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def run(gpus: Any, visible: str | None = None) -> hardware.Machine:
        spec = gpus if isinstance(gpus, dict) else {"gpus": gpus}
        monkeypatch.setenv("FAKE_NVML", json.dumps(spec))
        if visible is not None:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        return hardware.detect()

    return run


def test_no_driver_means_no_gpu_and_two_cpu_processes(driver: Driver) -> None:
    machine = driver({"fail": "init"})
    assert machine.cuda_count == 0 and machine.cpu_cores >= 1
    assert machine.cuda_method == "none: NVML did not start (NVML Shared Library Not Found)"
    plan = hardware.resolve(LaunchConfig(), machine)
    assert (plan.hardware, plan.backend, plan.num_processes) == ("cpu", "gloo", 2)
    assert plan.describe() == "Launching 2 processes on CPU (gloo)"


def test_gpus_are_counted_through_nvml(driver: Driver) -> None:
    machine = driver(THREE_H100)
    assert machine.cuda_count == 3 and machine.cuda_bf16 is True
    assert machine.cuda_capability == (9, 0) and machine.cuda_fp8
    assert machine.cuda_method == "NVML through nvidia-ml-py, driver 550.54.15"
    plan = hardware.resolve(LaunchConfig(), machine)
    assert (plan.hardware, plan.backend, plan.num_processes) == ("cuda", "nccl", 3)
    assert plan.describe() == "Launching 3 processes on 3 CUDA GPUs (nccl)"
    kind = hardware.kinds(machine)[0]
    assert kind.describe(machine) == "CUDA, 3 × H100 80GB HBM3"
    assert kind.precisions(machine) == ("no", "fp16", "bf16", "fp8")


@pytest.mark.parametrize(
    ("visible", "uuids"),
    [
        ("2,0", ["GPU-bbbb3333-0000", "GPU-aaaa1111-0000"]),  # CUDA's order is the list's
        ("GPU-bbbb3333-0000", ["GPU-bbbb3333-0000"]),  # a whole UUID
        ("GPU-aaaa", ["GPU-aaaa1111-0000"]),  # a unique prefix
        ("GPU-bbbb,0", []),  # an ambiguous prefix is invalid: nothing after it either
        ("0,7,1", ["GPU-aaaa1111-0000"]),  # the first invalid entry ends the list
        ("0,-1,1", ["GPU-aaaa1111-0000"]),
        ("2,GPU-aaaa1111", ["GPU-bbbb3333-0000", "GPU-aaaa1111-0000"]),  # mixed forms
        ("1,1", []),  # a device named twice: CUDA sees none
        ("", []),
        (" 1 , 2 ", ["GPU-bbbb2222-0000", "GPU-bbbb3333-0000"]),
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(
    driver: Driver, visible: str, uuids: list[str]
) -> None:
    driver(THREE_H100)  # installs the stand-in
    gpus = [
        hardware_gpu.Gpu(i, str(g["uuid"]), str(g["name"]), (9, 0))
        for i, g in enumerate(THREE_H100)
    ]
    assert [d.uuid for d in hardware_gpu.visible(gpus, visible)] == uuids
    assert driver(THREE_H100, visible).cuda_count == len(uuids)


def test_mig_devices_are_what_cuda_sees_and_a_launch_is_one_process(driver: Driver) -> None:
    plain = dict(H100, uuid="GPU-dddd", mig=None)  # MIG-capable, MIG mode off
    machine = driver([A100_MIG, plain])
    assert machine.cuda_names == (
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        "NVIDIA H100 80GB HBM3",
    )
    assert machine.cuda_mig and machine.cuda_capability == (8, 0)
    plan = hardware.resolve(LaunchConfig(), machine)
    assert plan.describe() == "Launching 1 process on a CUDA MIG device (nccl)"
    with pytest.raises(ConfigError, match=r"num_processes=2 .* \[1, 1\]") as err:
        hardware.resolve(LaunchConfig(num_processes=2), machine)
    assert "CUDA MIG, 3 × GPUs (a process sees one MIG device)" in str(err.value)

    by_uuid = driver([A100_MIG, plain], "MIG-2222")
    assert by_uuid.cuda_count == 1 and by_uuid.cuda_mig
    old_form = driver([A100_MIG, plain], "MIG-GPU-cccc4444-0000/1/0")
    assert old_form.cuda_names == ("NVIDIA A100-SXM4-80GB MIG 3g.40gb",)
    whole_gpu = driver([A100_MIG, plain], "0")  # a GPU in MIG mode: its MIG devices
    assert whole_gpu.cuda_count == 2
    assert driver([A100_MIG, plain], "1").cuda_mig is False
    no_instances = dict(A100_MIG, mig=[])
    assert driver([no_instances]).cuda_count == 0


def test_older_or_unknown_gpus_get_only_the_precisions_they_have(driver: Driver) -> None:
    t4 = driver([{"name": "Tesla T4", "uuid": "GPU-t4", "cc": [7, 5]}])
    assert hardware.kinds(t4)[0].precisions(t4) == ("no", "fp16")
    with pytest.raises(ConfigError) as err:
        hardware.resolve(LaunchConfig(mixed_precision="fp8"), t4)
    assert "compute capability >= 8.9" in str(err.value) and "emulate=True" in str(err.value)

    a100 = driver([{"name": "NVIDIA A100", "uuid": "GPU-a100", "cc": [8, 0]}])
    assert hardware.kinds(a100)[0].precisions(a100) == ("no", "fp16", "bf16")

    unknown = driver([{"name": "NVIDIA Mystery", "uuid": "GPU-x"}])  # NVML has no capability
    assert unknown.cuda_capability is None and unknown.cuda_bf16 is None
    with pytest.raises(ConfigError, match="unknown: pip install 'notebook_accel\\[gpu\\]'"):
        hardware.resolve(LaunchConfig(mixed_precision="fp8"), unknown)


def test_without_the_binding_the_method_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    found = hardware_gpu.probe()
    if hardware_gpu._nvml_library():  # a machine with an NVIDIA driver: torch's NVML count
        assert found.method.startswith(("NVML through torch", "unknown:"))
    else:
        assert found == hardware_gpu.CudaFound((), found.method)
        assert "libnvidia-ml.so.1 not found" in found.method


def test_a_failing_binding_falls_back_to_torchs_count_and_says_so(
    driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver is there (its library loads) and torch's NVML count answers 2.
    monkeypatch.setattr(hardware_gpu, "_nvml_library", lambda: True)
    monkeypatch.setattr(hardware_gpu, "_count_from_torch", lambda: 2)
    machine = driver({"fail": "uuid", "gpus": THREE_H100[:2]})
    assert machine.cuda_names == ("CUDA GPU", "CUDA GPU") and machine.cuda_capability is None
    assert machine.cuda_method == (
        "nvidia-ml-py failed (Unknown Error), so NVML through torch "
        "(torch.cuda._device_count_nvml): names and compute capability unknown"
    )
    monkeypatch.setattr(hardware_gpu, "_count_from_torch", lambda: -1)
    assert driver({"fail": "uuid", "gpus": THREE_H100}).cuda_count == 0


def test_cuda_is_not_initialised_by_detection(driver: Driver) -> None:
    import torch

    driver(THREE_H100)
    assert not torch.cuda.is_initialized()


@pytest.mark.parametrize(
    ("accelerator_type", "devices", "slice_devices", "hosts"),
    [
        ("v2-8", 8, 8, 1),  # 8 TensorCores, one device each
        ("v3-8", 8, 8, 1),
        ("v3-32", 8, 32, 4),
        ("v4-8", 4, 4, 1),  # 8 TensorCores = 4 megacore chips
        ("v4-32", 4, 16, 4),
        ("v5p-8", 4, 4, 1),
        ("v5p-128", 4, 64, 16),
        ("v5litepod-1", 1, 1, 1),
        ("v5litepod-4", 4, 4, 1),
        ("v5litepod-8", 8, 8, 1),
        ("v5litepod-16", 4, 16, 4),  # multi-host v5e: 4 chips per host
        ("v5e-256", 4, 256, 64),
        ("v6e-8", 8, 8, 1),
        ("v6e-16", 4, 16, 4),
    ],
)
def test_tpu_devices_per_host_from_the_accelerator_type(
    accelerator_type: str, devices: int, slice_devices: int, hosts: int
) -> None:
    found = hardware_tpu.from_accelerator_type(accelerator_type)
    assert found is not None
    assert (found.devices, found.slice_devices, found.hosts) == (devices, slice_devices, hosts)


@pytest.mark.parametrize("accelerator_type", ["v7x-8", "tpu", "v4", "v4-1", ""])
def test_an_unknown_accelerator_type_is_not_guessed(accelerator_type: str) -> None:
    assert hardware_tpu.from_accelerator_type(accelerator_type) is None


def test_a_tpu_vm_is_detected_from_its_accelerator_type(
    driver: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "torch_xla").mkdir()
    (tmp_path / "torch_xla" / "__init__.py").write_text("")  # torch_xla, as find_spec sees it
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-16")
    machine = driver({"fail": "init"})
    assert (machine.tpu_cores, machine.tpu_type) == (4, "v4-16")
    assert "8 chips" not in machine.tpu_method and "4 on this host of 8" in machine.tpu_method
    plan = hardware.resolve(LaunchConfig(), machine)
    assert (plan.hardware, plan.num_processes, plan.backend) == ("tpu", 4, "xla")
    with pytest.raises(ConfigError, match=r"\[1, 4\]"):
        hardware.resolve(LaunchConfig(num_processes=8), machine)


def test_env_command_prints_what_was_found_and_how(tmp_path: Path) -> None:
    spec = {"driver": "560.35.03", "gpus": [A100_MIG, dict(H100, uuid="GPU-e")]}
    environ = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(FAKE_NVML),
        "FAKE_NVML": json.dumps(spec),
        "CUDA_VISIBLE_DEVICES": "MIG-1111,1",
        "NOTEBOOK_ACCEL_CONFIG_FILE": str(tmp_path / "config.json"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "notebook_accel.faces.cli", "env"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        "- CUDA GPUs: 1 × NVIDIA A100-SXM4-80GB MIG 3g.40gb, 1 × NVIDIA H100 80GB HBM3 "
        "(compute capability 8.0; precisions: fp16, bf16)"
    ) in lines
    assert (
        "    found by: NVML through nvidia-ml-py, driver 560.35.03; "
        "CUDA_VISIBLE_DEVICES='MIG-1111,1'"
    ) in lines
    assert any(line.startswith("    MIG: a CUDA process sees one MIG device") for line in lines)
