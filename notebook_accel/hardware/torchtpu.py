"""TorchTPU (the ``torch-tpu`` package): TPU chips as torch's own ``"tpu"`` device.

    chips()        the TPU chips this host exposes, counted as TorchTPU counts them: PCI
                   devices of Google's vendor id whose device id is a TPU's, each bound to
                   VFIO (read from /sys and /dev; no torch, no torch_tpu imported)
    launch_env()   whether the parent set TorchTPU's launch variables
                   (``torch.tpu.distributed.set_tpu_launch_env``), which every rank must share

Unlike torch_xla (``tpu.py``, ``local/xla/``), TorchTPU is eager: it renames torch's
PrivateUse1 device to ``"tpu"``, registers ``torch.tpu`` and the ``"tpu_dist"`` process-group
backend when torch loads it, and runs one process per chip (``torch.accelerator`` is its API).
A launch here is this machine's workers, as on CUDA, with ``tpu_dist`` groups. TorchTPU decides
the ranks' meeting addresses and topology in the parent, before any worker exists:
``set_tpu_launch_env(nproc_per_node=N)`` in the notebook sets them, and the workers inherit
them (the launch's environment snapshot). Without them a launch is one process (one chip), as
accelerate 1.16 runs TorchTPU.

Example:
    >>> chips(pci_root=Path("/nonexistent"))
    (0, '')
"""

from __future__ import annotations

from pathlib import Path

from .. import env

__all__ = ["TPU_DEVICE_IDS", "chips", "launch_env"]

_GOOGLE = "0x1ae0"  # Google's PCI vendor id
# TPU generations by PCI device id (torch_tpu's table, from the PCI ids Google publishes)
TPU_DEVICE_IDS = {
    "0x005e": "v4",
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "v7",
}


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def chips(
    pci_root: Path = Path("/sys/bus/pci/devices"), vfio_root: Path = Path("/dev/vfio")
) -> tuple[int, str]:
    """``(chips, generation)``: TPU chips bound to VFIO on this host, as TorchTPU counts them
    (``(0, "")`` without any)."""
    count, generation = 0, ""
    try:
        entries = sorted(pci_root.iterdir())
    except OSError:
        return 0, ""
    for device in entries:
        kind = TPU_DEVICE_IDS.get(_read(device / "device"))
        if _read(device / "vendor") != _GOOGLE or kind is None:
            continue
        try:
            group = (device / "iommu_group").readlink().name
        except OSError:
            continue
        if (vfio_root / group).exists():  # TorchTPU drives the chips it can open through VFIO
            count += 1
            generation = generation or kind
    return count, generation


def launch_env() -> bool:
    """Whether TorchTPU's launch variables are set in this process (the parent's
    ``set_tpu_launch_env``): the workers inherit them."""
    return env.torchtpu_slice_addresses() is not None
