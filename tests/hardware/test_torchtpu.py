"""TorchTPU (``torch-tpu``) without a TPU: its chips found, the plan, and ``"tpu"`` devices.

No TPU here, and installing torch-tpu would replace the torch pin: the chips are a stand-in
/sys and /dev tree, and ``torchtpu_standin/torch_tpu`` makes torch's registrations TorchTPU
makes (the ``"tpu"`` device, ``torch.tpu``, the ``"tpu_dist"`` backend) in a fresh process.
Untested without a TPU: tensors on ``"tpu"``, tpu_dist groups, memory figures (README).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from notebook_accel.config import LaunchConfig
from notebook_accel.errors import ConfigError
from notebook_accel.hardware import Machine, kinds, resolve, torchtpu

STANDIN = Path(__file__).resolve().parent / "torchtpu_standin"


def _pci(root: Path, vfio: Path, name: str, vendor: str, device: str, bound: bool) -> None:
    entry = root / name
    entry.mkdir(parents=True)
    (entry / "vendor").write_text(vendor + "\n")
    (entry / "device").write_text(device + "\n")
    group = root.parent / "iommu_groups" / name
    group.mkdir(parents=True)
    (entry / "iommu_group").symlink_to(group)
    if bound:
        (vfio / name).touch()


def test_chips_are_counted_as_torchtpu_counts_them(tmp_path: Path) -> None:
    pci, vfio = tmp_path / "devices", tmp_path / "vfio"
    vfio.mkdir()
    for i in range(4):  # v6e chips bound to VFIO
        _pci(pci, vfio, f"0000:00:0{i}.0", "0x1ae0", "0x006f", bound=True)
    _pci(pci, vfio, "0000:00:05.0", "0x1ae0", "0x006f", bound=False)  # not TorchTPU's
    _pci(pci, vfio, "0000:00:06.0", "0x1ae0", "0x0001", bound=True)  # Google, not a TPU
    _pci(pci, vfio, "0000:00:07.0", "0x10de", "0x006f", bound=True)  # another vendor
    assert torchtpu.chips(pci, vfio) == (4, "v6e")
    assert torchtpu.chips(tmp_path / "none", vfio) == (0, "")


def test_a_torchtpu_machine_plans_one_process_per_chip_with_its_launch_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = Machine(cpu_cores=8, torchtpu_chips=4, torchtpu_type="v6e")
    assert [k.name for k in kinds(machine)] == ["tpu", "cpu"]
    monkeypatch.delenv("TORCH_TPU_SLICEBUILDER_ADDRESSES", raising=False)
    plan = resolve(LaunchConfig(), machine)
    assert (plan.hardware, plan.backend, plan.device_type, plan.num_processes) == (
        "tpu",
        "tpu_dist",
        "tpu",
        1,
    )
    with pytest.raises(ConfigError, match="set_tpu_launch_env"):
        resolve(LaunchConfig(num_processes=4), machine)
    with pytest.raises(ConfigError, match="fp16"):
        resolve(LaunchConfig(mixed_precision="fp16"), machine)
    addresses = ",".join(f"localhost:{8070 + i}" for i in range(4))
    monkeypatch.setenv("TORCH_TPU_SLICEBUILDER_ADDRESSES", addresses)
    plan = resolve(LaunchConfig(hardware="tpu", mixed_precision="bf16"), machine)
    assert (plan.num_processes, plan.label) == (4, "TPU v6e (TorchTPU)")
    assert plan.describe() == "Launching 4 processes on TPU v6e (TorchTPU) (tpu_dist)"
    # torch_xla's TPU, where it is installed, comes first
    both = Machine(cpu_cores=8, tpu_cores=8, tpu_type="v5e", torchtpu_chips=4)
    assert resolve(LaunchConfig(), both).backend == "xla"


_PROBE = textwrap.dedent(
    """
    import json, torch_tpu  # the stand-in: torch's "tpu" device, as TorchTPU registers it
    import torch
    import accelerate.utils as theirs
    from notebook_accel import Accelerator, utils as ours
    from notebook_accel.errors import ConfigError
    from notebook_accel.training.process import ProcessState

    def answers(module):
        kind, api = module.get_torch_accelerator_backend()
        return [
            kind,
            api is torch.accelerator,
            module.normalize_device(0),
            module.normalize_device("cpu"),
            module.get_distributed_backend("cuda"),
        ]

    state = ProcessState.from_environment()
    acc = Accelerator(mixed_precision="bf16")
    try:
        Accelerator(mixed_precision="fp16")
        fp16 = "accepted"
    except ConfigError as error:
        fp16 = str(error).splitlines()[0]
    print(json.dumps({
        "theirs": answers(theirs),
        "ours": answers(ours),
        "backend": [theirs.get_distributed_backend("tpu"), ours.get_distributed_backend("tpu")],
        "state": [str(state.device), state.backend, state.distributed_type.value],
        "accelerator": [str(acc.device), acc.distributed_type.value, acc.mixed_precision,
                        acc.multi_device, acc.native_amp],
        "fp16": fp16,
    }))
    """
)


def test_tpu_devices_as_accelerate_116_names_them_on_a_stand_in() -> None:
    pytest.importorskip("accelerate")
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    environ["PYTHONPATH"] = os.pathsep.join([str(STANDIN), environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=environ, timeout=240
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["theirs"] == found["ours"] == ["tpu", True, "tpu:0", "cpu", "nccl"]
    # accelerate 1.16 has no backend for "tpu" (one TorchTPU process); ours is the one
    # TorchTPU registers, for a process per chip
    assert found["backend"] == [None, "tpu_dist"]
    assert found["state"] == ["tpu:1", "tpu_dist", "NO"]  # the chip TorchTPU gave it
    assert found["accelerator"] == ["tpu:1", "NO", "bf16", False, True]
    assert "fp16" in found["fp16"] and "TorchTPU" in found["fp16"]
