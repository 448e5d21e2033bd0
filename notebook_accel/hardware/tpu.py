"""TPU devices on this host, from the accelerator type (``v4-8``, ``v5litepod-16``, ...).

A launch runs one process per XLA device *on this host*; the number in an accelerator type
counts the whole slice, and in TensorCores for some generations, in chips for others:

    generation      the N in "<gen>-N"   devices torch_xla shows     devices on one host
    v2, v3          TensorCores          one per TensorCore          8 (4 chips x 2 cores)
    v4, v5p         TensorCores          one per chip (megacore)     N/2 chips, at most 4
    v5e, v6e        chips                one per chip (1 core/chip)  N up to 8; 4 on slices
                    (v5litepod-N too)                                of 16 chips and more

Multi-host slices (``v4-32``, ``v5litepod-16``): the same cell runs on every host
(``num_nodes``), each with its own devices. For a generation the table does not know, the
device files (``/dev/accel*``, ``/dev/vfio/N``: one per chip) are counted, and the answer says
that this is what it rests on.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass

__all__ = ["TpuFound", "from_accelerator_type", "from_device_files"]


@dataclass(frozen=True)
class TpuFound:
    """Devices on this host, the slice's total, and how that was worked out."""

    devices: int
    slice_devices: int
    method: str

    @property
    def hosts(self) -> int:
        return max(1, self.slice_devices // self.devices) if self.devices else 0


# generation -> (what N counts, TensorCores per device, devices per host on multi-host slices,
#                largest single-host slice in devices)
_GENERATIONS: dict[str, tuple[str, int, int, int]] = {
    "v2": ("TensorCores", 1, 8, 8),
    "v3": ("TensorCores", 1, 8, 8),
    "v4": ("TensorCores", 2, 4, 4),
    "v5p": ("TensorCores", 2, 4, 4),
    "v5e": ("chips", 1, 4, 8),
    "v6e": ("chips", 1, 4, 8),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e"}


def from_accelerator_type(accelerator_type: str) -> TpuFound | None:
    """Devices per host for a known accelerator type; ``None`` for an unknown one.

    Example:
        >>> from_accelerator_type("v4-32").devices
        4
        >>> from_accelerator_type("v5litepod-8").devices
        8
    """
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator_type.strip().lower())
    if not match:
        return None
    generation = _ALIASES.get(match.group(1), match.group(1))
    if generation not in _GENERATIONS:
        return None
    counts, cores_per_device, per_host, single_host = _GENERATIONS[generation]
    total = int(match.group(2)) // cores_per_device
    if total < 1:
        return None
    devices = total if total <= single_host else per_host
    unit = "TensorCore" if cores_per_device == 1 and counts == "TensorCores" else "chip"
    return TpuFound(
        devices=devices,
        slice_devices=total,
        method=f"accelerator type {accelerator_type} ({generation}: N counts {counts}; one "
        f"device per {unit}; {devices} on this host of {total} in the slice)",
    )


def from_device_files() -> TpuFound | None:
    """Chips seen as device files, for a generation the table does not know."""
    for pattern in ("/dev/accel*", "/dev/vfio/[0-9]*"):
        chips = len(glob.glob(pattern))
        if chips:
            return TpuFound(
                devices=chips,
                slice_devices=chips,
                method=f"{chips} chips found as {pattern} (accelerator type unknown: one "
                "device per chip assumed; set num_processes if torch_xla shows more)",
            )
    return None
