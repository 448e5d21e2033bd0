"""notebook_accel: multi-process PyTorch training from one notebook cell.

Importing the package has no side effects and does not import torch; the public names are
loaded on first use. The first use of ``notebook_launcher``, ``debug_launcher`` or
``Workers`` starts the launcher's forkserver in the background (it imports torch for the
workers while the notebook goes on); ``NOTEBOOK_ACCEL_NO_WARMUP=1`` turns that off.

Example:
    >>> from notebook_accel import notebook_launcher
    >>> notebook_launcher(lambda: "hi", num_processes=2)  # doctest: +SKIP
    Launching 2 processes on CPU (gloo)
    ['hi', 'hi']
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "notebook_launcher": "notebook_accel.launch",
    "debug_launcher": "notebook_accel.launch",
    "Workers": "notebook_accel.launch.local.session",
    "Job": "notebook_accel.launch.local.session",
    "sessions": "notebook_accel.launch.local.durable.place",
    "LaunchConfig": "notebook_accel.config",
    "Accelerator": "notebook_accel.training.accelerator",
    "DistributedType": "notebook_accel.training.process",
    "set_seed": "notebook_accel.seeding",
    "gather_object": "notebook_accel.training.collectives",
    "tqdm": "notebook_accel.reporting.progress",
    "trange": "notebook_accel.reporting.progress",
    "LaunchPanel": "notebook_accel.faces.panel",
    "last_metrics": "notebook_accel.launch.show.charts",
    "FsdpConfig": "notebook_accel.options.fsdp",
    "FullyShardedDataParallelPlugin": "notebook_accel.options.fsdp_plugin",
    "DeepSpeedPlugin": "notebook_accel.options.deepspeed",
    "ParallelismConfig": "notebook_accel.options.parallelism",
    "TorchDynamoPlugin": "notebook_accel.options.dynamo",
    "DynamoBackend": "notebook_accel.options.dynamo",
    "compile_regions": "notebook_accel.training.compile",
    "is_compiled_module": "notebook_accel.training.compile",
    "ProjectConfiguration": "notebook_accel.training.project",
    "PartialState": "notebook_accel.training.processes",
    "DistributedDataParallelKwargs": "notebook_accel.training.handlers",
    "DDPCommunicationHookType": "notebook_accel.training.handlers",
    "GradScalerKwargs": "notebook_accel.training.handlers",
    "InitProcessGroupKwargs": "notebook_accel.training.handlers",
    "KwargsHandler": "notebook_accel.training.handlers",
    "ProfileKwargs": "notebook_accel.training.profiling",
    "GeneralTracker": "notebook_accel.training.trackers",
    "find_executable_batch_size": "notebook_accel.training.memory",
    "release_memory": "notebook_accel.training.memory",
    "DataLoaderConfiguration": "notebook_accel.training.data.config",
    "skip_first_batches": "notebook_accel.training.data.loader",
    "AORecipeKwargs": "notebook_accel.training.precision.fp8",
    "AutocastKwargs": "notebook_accel.training.handlers",
    "synchronize_rng_states": "notebook_accel.training.data.rng",
    "is_rich_available": "notebook_accel.hardware.available",
    "NotebookAccelError": "notebook_accel.errors",
    "ConfigError": "notebook_accel.errors",
    "PayloadError": "notebook_accel.errors",
    "LaunchError": "notebook_accel.errors",
    "WorkerError": "notebook_accel.errors",
    "WorkerDiedError": "notebook_accel.errors",
    "LaunchTimeoutError": "notebook_accel.errors",
    "SessionClosedError": "notebook_accel.errors",
    "CheckpointError": "notebook_accel.errors",
    "SharedMemoryError": "notebook_accel.errors",
    "init_empty_weights": "notebook_accel.big_model.empty",
    "init_on_device": "notebook_accel.big_model.empty",
    "dispatch_model": "notebook_accel.big_model.dispatch",
    "cpu_offload": "notebook_accel.big_model.dispatch",
    "cpu_offload_with_hook": "notebook_accel.big_model.dispatch",
    "disk_offload": "notebook_accel.big_model.dispatch",
    "infer_auto_device_map": "notebook_accel.big_model.device_map",
    "load_checkpoint_in_model": "notebook_accel.big_model.loading",
    "load_checkpoint_and_dispatch": "notebook_accel.big_model.loading",
    "clear_shared_cache": "notebook_accel.launch.wire.shm",
    "set_shared_cache_limit": "notebook_accel.launch.wire.shm",
    "shared_cache_info": "notebook_accel.launch.wire.shm",
}

__all__ = sorted(_EXPORTS) + ["__version__", "load_ipython_extension"]

# Names whose first use starts the launcher's forkserver in the background, so that its
# import of torch overlaps the notebook's work (launch/local/forkserver.py, warm_up_early;
# NOTEBOOK_ACCEL_NO_WARMUP=1 turns it off).
_WARMS_UP = frozenset({"notebook_launcher", "debug_launcher", "Workers"})


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_accel``: the ``%%distributed`` cell magic (faces/magic.py).

    Imported only now, so that importing the package imports neither IPython nor torch.
    """
    importlib.import_module("notebook_accel.faces.magic").load_ipython_extension(ipython)


def _lazy_attribute(namespace: dict[str, Any], exports: Mapping[str, str], name: str) -> Any:
    """PEP 562's ``__getattr__`` for a module whose names load from their modules on first
    use (this package and its accelerate-named modules: ``utils``, ``state``, ...):
    ``exports`` maps each name to its module; the value is kept in ``namespace`` (the
    module's globals) from then on."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS and not name.startswith("__"):
        # accelerate's names not provided: a placeholder that says why (refusals.py)
        return importlib.import_module("notebook_accel.refusals").refused(globals(), name)
    value = _lazy_attribute(globals(), _EXPORTS, name)
    if name in _WARMS_UP:
        importlib.import_module("notebook_accel.launch").warm_up_early()
        importlib.import_module("notebook_accel.errors").show_notes_in_ipython()
    return value


def __dir__() -> list[str]:
    return __all__
