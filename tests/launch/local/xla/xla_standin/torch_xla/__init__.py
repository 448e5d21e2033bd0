"""A stand-in for torch_xla's process pool, for testing the launcher's TPU supervision in CI.

torch_xla pins an older torch than CI's, so it cannot be installed there. This package has
only what notebook_accel calls, and does the real thing with processes and threads:
``_internal.pjrt.run_multiprocess`` starts real processes (a spawn ProcessPoolExecutor, as
torch_xla's does) with one thread per device, and ``core.xla_model``'s collectives exchange
tensors between the device threads of one process. Devices are CPU devices.

    PJRT_DEVICE=CPU, CPU_NUM_DEVICES=N     1 process, N device threads (the CPU runtime)
    PJRT_DEVICE=TPU, TPU_NUM_DEVICES=N     N processes, 1 device each (TPU v4 and later)
    ... and STANDIN_XLA_DEVICES_PER_PROCESS=K   N/K processes, K device threads each (v2/v3)

Only tests/launch/local/xla/test_xla_supervision.py puts this folder on sys.path.
"""

from __future__ import annotations

import torch

from . import runtime

__all__ = ["device", "sync", "runtime"]


def device() -> torch.device:
    """This device thread's device (a CPU device here)."""
    runtime._ordinal()  # only device threads have one
    return torch.device("cpu")


def sync() -> None:
    """torch_xla cuts its lazy graph here; eager CPU tensors have none."""
