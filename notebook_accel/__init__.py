"""notebook_accel: multi-process PyTorch training from one notebook cell.

Importing the package has no side effects and does not import torch; the public names are
loaded on first use.

Example:
    >>> from notebook_accel import notebook_launcher
    >>> notebook_launcher(lambda: "hi", num_processes=2)  # doctest: +SKIP
    Launching 2 processes on CPU (gloo)
    ['hi', 'hi']
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "notebook_launcher": "notebook_accel.launch",
    "debug_launcher": "notebook_accel.launch",
    "LaunchConfig": "notebook_accel.config",
    "Accelerator": "notebook_accel.accelerator",
    "DistributedType": "notebook_accel.state",
    "set_seed": "notebook_accel.utils_seed",
    "gather_object": "notebook_accel.collectives",
    "tqdm": "notebook_accel.progress",
    "trange": "notebook_accel.progress",
    "LaunchPanel": "notebook_accel.widgets",
    "last_metrics": "notebook_accel.launch.charts",
    "FsdpConfig": "notebook_accel.fsdp_config",
    "DeepSpeedPlugin": "notebook_accel.deepspeed_plugin",
    "ParallelismConfig": "notebook_accel.parallelism_config",
    "ProjectConfiguration": "notebook_accel.project",
    "PartialState": "notebook_accel.processes",
    "DistributedDataParallelKwargs": "notebook_accel.handlers",
    "DDPCommunicationHookType": "notebook_accel.handlers",
    "GradScalerKwargs": "notebook_accel.handlers",
    "InitProcessGroupKwargs": "notebook_accel.handlers",
    "KwargsHandler": "notebook_accel.handlers",
    "find_executable_batch_size": "notebook_accel.memory",
    "release_memory": "notebook_accel.memory",
    "DataLoaderConfiguration": "notebook_accel.data_config",
    "skip_first_batches": "notebook_accel.data",
    "AORecipeKwargs": "notebook_accel.fp8",
    "NotebookAccelError": "notebook_accel.errors",
    "ConfigError": "notebook_accel.errors",
    "PayloadError": "notebook_accel.errors",
    "LaunchError": "notebook_accel.errors",
    "WorkerError": "notebook_accel.errors",
    "WorkerDiedError": "notebook_accel.errors",
    "LaunchTimeoutError": "notebook_accel.errors",
    "CheckpointError": "notebook_accel.errors",
    "SharedMemoryError": "notebook_accel.errors",
    "clear_shared_cache": "notebook_accel.launch.shm",
    "set_shared_cache_limit": "notebook_accel.launch.shm",
    "shared_cache_info": "notebook_accel.launch.shm",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'notebook_accel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
