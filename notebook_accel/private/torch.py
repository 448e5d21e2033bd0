"""torch's private names: what the package uses that torch does not promise.

Each function imports torch only when called (the notebook's side stays torch-free) and says
which name it relies on. They hold for torch 2.6 to 2.13 (the versions CI runs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

__all__ = [
    "PYTREE_LOGGER",
    "children",
    "compiled_original",
    "default_store",
    "import_dynamo",
    "is_compiled",
    "nvml_device_count",
    "process_groups",
    "rendezvous_handlers",
    "replace_destroy_process_group",
    "sampler_num_samples",
    "scheduler_step_count",
    "set_children",
    "tensor_version",
    "untyped_storage",
    "world_group",
]

# The logger of torch.utils._pytree (its enum deprecation lines, filtered by quiet.py).
PYTREE_LOGGER = "torch.utils._pytree"


# -- torch.compile ----------------------------------------------------------------------------
def is_compiled(module: object) -> bool:
    """Whether ``module`` is ``torch.compile``'s wrapper of a module.

    Relies on ``torch._dynamo.eval_frame.OptimizedModule`` (the wrapper's class).
    """
    import torch

    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule)


def compiled_original(model: Any) -> Any:
    """The module a ``torch.compile`` wrapper wraps.

    Relies on ``OptimizedModule._orig_mod``.
    """
    return model._orig_mod


def import_dynamo() -> None:
    """Import ``torch._dynamo`` now (before DeepSpeed's zero.Init swaps ``Tensor.__new__``,
    whose signature dynamo checks when first imported)."""
    import torch._dynamo  # noqa: F401


# -- nn.Module, storages, data, schedules -----------------------------------------------------
def children(module: Any) -> MutableMapping[str, Any]:
    """A module's children by name, repeats and None entries included (``children()`` skips
    both).

    Relies on ``torch.nn.Module._modules``.
    """
    found: MutableMapping[str, Any] = module._modules
    return found


def set_children(module: Any, mapping: dict[str, Any]) -> None:
    """Replace a (copied) module's children at once.

    Relies on ``torch.nn.Module._modules`` being the dict ``__getattr__`` reads children from.
    """
    module._modules = mapping


def untyped_storage(typed: Any) -> Any:
    """A TypedStorage's untyped storage, without the deprecation warning ``untyped()`` gives.

    Relies on ``torch.storage.TypedStorage._untyped_storage``.
    """
    return typed._untyped_storage


def tensor_version(tensor: Any) -> int:
    """A tensor's version counter (bumped by every in-place change).

    Relies on ``torch.Tensor._version``.
    """
    return int(tensor._version)


def sampler_num_samples(sampler: Any) -> int | None:
    """A RandomSampler's ``num_samples`` as given (None: the dataset's length).

    Relies on ``torch.utils.data.RandomSampler._num_samples`` (its public ``num_samples``
    answers the length for None).
    """
    value: int | None = sampler._num_samples
    return value


def scheduler_step_count(scheduler: Any) -> int:
    """How many times an LR scheduler stepped.

    Relies on ``torch.optim.lr_scheduler.LRScheduler._step_count``.
    """
    return int(scheduler._step_count)


def nvml_device_count() -> int:
    """The CUDA devices NVML counts (CUDA_VISIBLE_DEVICES applied), without initialising
    CUDA; -1 when torch cannot tell (no CUDA build, or the function is gone).

    Relies on ``torch.cuda._device_count_nvml``.
    """
    import torch

    if not torch.version.cuda:
        return -1
    count = getattr(torch.cuda, "_device_count_nvml", None)
    return int(count()) if count is not None else -1


# -- torch.distributed ------------------------------------------------------------------------
def rendezvous_handlers() -> MutableMapping[str, Callable[..., Iterator[Any]]]:
    """The init_method schemes' handlers (``"env"``, ``"tcp"``, ``"file"``), to replace one:
    torch has ``register_rendezvous_handler`` to add a scheme, none to replace one.

    Relies on ``torch.distributed.rendezvous._rendezvous_handlers``.
    """
    import importlib

    # The module (torch.distributed.rendezvous is also the name of a function there).
    module = importlib.import_module("torch.distributed.rendezvous")
    found: MutableMapping[str, Callable[..., Iterator[Any]]] = module._rendezvous_handlers
    return found


def process_groups() -> dict[Any, tuple[str, Any]]:
    """Every live process group: its backend's name and the store it met in.

    Relies on ``torch.distributed.distributed_c10d._world.pg_map``.
    """
    from torch.distributed import distributed_c10d as c10d

    world = getattr(c10d, "_world", None)
    return dict(getattr(world, "pg_map", None) or {})


def world_group() -> Any:
    """The default group's handle as ``destroy_process_group`` compares it.

    Relies on ``torch.distributed.distributed_c10d.GroupMember.WORLD``.
    """
    from torch.distributed import distributed_c10d as c10d

    return c10d.GroupMember.WORLD


def replace_destroy_process_group(
    wrap: Callable[[Callable[..., None]], Callable[..., None]],
) -> None:
    """``destroy_process_group`` replaced by ``wrap(the original)``, where torch's own code
    calls it too.

    Relies on ``torch.distributed.distributed_c10d.destroy_process_group`` being the function
    torch.distributed re-exports (both names are replaced).
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    replacement = wrap(c10d.destroy_process_group)
    c10d.destroy_process_group = replacement
    dist.destroy_process_group = replacement


def default_store() -> Any:
    """The store the default process group met in.

    Relies on ``torch.distributed.distributed_c10d._get_default_store``.
    """
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()
