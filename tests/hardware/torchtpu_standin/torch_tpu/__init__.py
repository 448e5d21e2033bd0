"""A stand-in for TorchTPU (``torch-tpu``) where no TPU is: its registrations, no chip.

Importing it does what importing the real package does to torch, without a device behind it:
torch's PrivateUse1 device is renamed ``"tpu"``, ``torch.tpu`` is registered (two chips, this
process on chip 1, as TorchTPU assigns each process its chip) and ``"tpu_dist"`` is registered
as the process-group backend of ``"tpu"`` devices. Tensors cannot be made on it: what needs
one (moving a model, collectives, memory figures) is beyond a stand-in.
"""

import types

import torch
import torch.distributed as dist

CHIPS = 2
MINE = 1

torch.utils.rename_privateuse1_backend("tpu")
_module = types.ModuleType("torch.tpu")
_module.device_count = lambda: CHIPS
_module.is_available = lambda: True
_module.current_device = lambda: MINE
_module.manual_seed_all = lambda seed: None
torch._register_device_module("tpu", _module)


def _no_group(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the TorchTPU stand-in has no process group")


dist.Backend.register_backend("tpu_dist", _no_group, devices=["tpu"])
